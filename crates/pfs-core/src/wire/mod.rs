//! The wire protocol: frames, requests and replies, encoded by hand, little-endian.
//!
//! - [`frame`]: the 32-byte header (magic, version, opcode, flags, ids, length,
//!   crc32c) and [`Frame`] encode/decode.
//! - [`opcode`]: one [`Opcode`] per operation.
//! - [`request`] / [`reply`]: the payload of every message.
//! - [`types`]: values several messages share (entries, layouts, tokens).
//! - [`cluster`]: values of the master messages (usage, server info, the view).
//! - `cursor`: the bounds-checked reader and the writer under all of them.
//!
//! Decoding takes untrusted bytes: it never panics, checks every length against its
//! limit and the bytes left before copying, and so never allocates more than the
//! frame's payload. The byte layout is written down in `docs/format.md`.

pub mod cluster;
mod cursor;
mod error;
pub mod follow;
pub mod frame;
pub mod opcode;
pub mod reply;
pub mod request;
pub mod types;

#[cfg(test)]
mod tests;

pub use cluster::{ServerInfo, Usage, View};
pub use error::WireError;
pub use follow::{FollowOp, MAX_FOLLOW_UPS};
pub use frame::{
    frame_checksum, stamp, Body, Frame, FrameHeader, Sum, FLAG_ERROR, FLAG_HEADER_SUM, FLAG_REPLY,
    READ_REPLY_PREFIX,
};
pub use opcode::Opcode;
pub use reply::{Replaced, Reply};
pub use request::{Request, WriteRef, WriteTarget};
pub use types::{
    DirEntry, Entry, FileLock, InodeLayout, LockKind, RenameFlags, TokenGrant, TokenMode,
    XattrSetMode, LOCK_END_MAX,
};

/// First four bytes of every frame: `"PFSW"`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"PFSW");
/// The protocol version this build speaks; a frame of another version is refused.
pub const VERSION: u16 = 9;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 32;
/// Largest read or write payload: 1 MiB, FUSE's `max_write`.
pub const MAX_IO_BYTES: usize = 1 << 20;
/// Largest frame payload: the largest I/O plus room for its fields.
pub const MAX_FRAME_PAYLOAD: usize = MAX_IO_BYTES + 4096;
/// Most entries one `ReadDir` reply lists, whatever the request asks (fewer
/// when their names fill [`MAX_IO_BYTES`]).
pub const READDIR_MAX_ENTRIES: usize = 4096;
/// Longest name (file or xattr), as `NAME_MAX`.
pub const MAX_NAME_BYTES: usize = crate::NAME_MAX;
/// Longest symbolic-link target: `PATH_MAX` less the NUL.
pub const MAX_SYMLINK_BYTES: usize = 4095;
/// Largest extended attribute value, as Linux `XATTR_SIZE_MAX`.
pub const MAX_XATTR_VALUE_BYTES: usize = 64 << 10;
/// Largest xattr name list, counted as Linux does (each name and a NUL).
pub const MAX_XATTR_LIST_BYTES: usize = 64 << 10;
/// Most data a `LookupData` reply carries: one page, what a small file's
/// first read through the mount asks for.
pub const MAX_LOOKUP_DATA_BYTES: usize = 4096;
/// Longest error detail text; longer text is cut when encoded.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;

/// `blocks` of a `Read` or `ReadData` that reads its whole range.
pub const ALL_BLOCKS: u32 = u32::MAX;

/// The byte ranges `(offset, len)` of `offset..offset + size` that `blocks`
/// picks, in file order, neighbours merged: bit `i` is the `i`-th file block
/// ([`BLOCK_SIZE_BYTES`](crate::BLOCK_SIZE_BYTES)) the range touches. A read of
/// at most [`MAX_IO_BYTES`] touches at most 17 blocks; bits past the range's
/// last block pick nothing, and blocks past the 32nd are never picked (but
/// with [`ALL_BLOCKS`], which picks the whole range).
pub fn read_segments(offset: u64, size: u64, blocks: u32) -> Vec<(u64, u64)> {
    let end = offset.saturating_add(size);
    if blocks == ALL_BLOCKS || size == 0 {
        return if size == 0 { Vec::new() } else { vec![(offset, end - offset)] };
    }
    let bs = crate::BLOCK_SIZE_BYTES;
    let first = offset / bs;
    let mut out: Vec<(u64, u64)> = Vec::new();
    for i in 0..32u64 {
        let start = (first + i).saturating_mul(bs).max(offset);
        if start >= end {
            break;
        }
        if blocks & (1 << i) == 0 {
            continue;
        }
        let stop = (first + i + 1).saturating_mul(bs).min(end);
        match out.last_mut() {
            Some((o, n)) if *o + *n == start => *n += stop - start,
            _ => out.push((start, stop - start)),
        }
    }
    out
}

/// The bit in a read's `blocks` of the block that holds byte `at`, for a read
/// starting at `offset` (`at` at most 31 blocks further on).
pub fn read_block_bit(offset: u64, at: u64) -> u32 {
    let bs = crate::BLOCK_SIZE_BYTES;
    let i = at / bs - offset / bs;
    debug_assert!(i < 32, "byte {at} is block {i} of a read at {offset}");
    1 << i.min(31)
}
