//! Frames into the decoder: refused, or a frame that encodes and decodes back
//! to itself. Never a panic.
//!
//! Random bytes almost never carry a valid checksum and length, so the input is
//! an opcode (2 bytes), flags (2 bytes) and a payload, wrapped in a header that
//! passes those checks: the fuzzer then reaches every request and reply decoder.
//! The raw input is tried as a whole frame too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pfs_core::wire::{stamp, Frame, HEADER_LEN, MAGIC, VERSION};
use pfs_core::{ClientId, RequestId};

fn round_trip(bytes: &[u8]) {
    if let Ok(frame) = Frame::decode(bytes) {
        let again = frame.to_bytes().expect("a decoded frame encodes");
        assert_eq!(Frame::decode(&again).expect("and decodes again"), frame);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip(data);
    if data.len() < 4 {
        return;
    }
    let payload = &data[4..];
    let mut frame = vec![0u8; HEADER_LEN];
    frame[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    frame[4..6].copy_from_slice(&VERSION.to_le_bytes());
    frame[6..10].copy_from_slice(&data[..4]);
    frame[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(payload);
    stamp(&mut frame, ClientId(7), RequestId(9), 0);
    round_trip(&frame);
});
