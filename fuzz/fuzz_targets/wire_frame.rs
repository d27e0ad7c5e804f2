//! Any bytes into the frame decoder: refused, or a frame that encodes and
//! decodes back to itself. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pfs_core::wire::Frame;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = Frame::decode(data) {
        let again = frame.to_bytes().expect("a decoded frame encodes");
        assert_eq!(Frame::decode(&again).expect("and decodes again"), frame);
    }
});
