//! Any bytes as a follow-up (on the wire and in a transaction record): refused,
//! or exactly the bytes it encodes to.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pfs_core::wire::FollowOp;

fuzz_target!(|data: &[u8]| {
    if let Some(op) = FollowOp::from_bytes(data) {
        assert_eq!(op.to_bytes(), data);
    }
});
