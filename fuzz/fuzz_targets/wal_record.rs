//! Any bytes as a WAL record payload: refused, or changes that encode back to
//! the same changes. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pfs_store::wal::Change;

fuzz_target!(|data: &[u8]| {
    if let Ok(changes) = Change::decode_all(data) {
        let mut again = Vec::new();
        for c in &changes {
            c.encode(&mut again);
        }
        assert_eq!(Change::decode_all(&again).expect("decodes again"), changes);
    }
});
