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
pub use frame::{stamp, Body, Frame, FrameHeader, FLAG_ERROR, FLAG_REPLY, READ_REPLY_PREFIX};
pub use opcode::Opcode;
pub use reply::{Replaced, Reply};
pub use request::{Request, WriteRef, WriteTarget};
pub use types::{DirEntry, Entry, InodeLayout, RenameFlags, TokenGrant, TokenMode, XattrSetMode};

/// First four bytes of every frame: `"PFSW"`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"PFSW");
/// The protocol version this build speaks; a frame of another version is refused.
pub const VERSION: u16 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 32;
/// Largest read or write payload: 1 MiB, FUSE's `max_write`.
pub const MAX_IO_BYTES: usize = 1 << 20;
/// Largest frame payload: the largest I/O plus room for its fields.
pub const MAX_FRAME_PAYLOAD: usize = MAX_IO_BYTES + 4096;
/// Longest name (file or xattr), as `NAME_MAX`.
pub const MAX_NAME_BYTES: usize = crate::NAME_MAX;
/// Longest symbolic-link target: `PATH_MAX` less the NUL.
pub const MAX_SYMLINK_BYTES: usize = 4095;
/// Largest extended attribute value, as Linux `XATTR_SIZE_MAX`.
pub const MAX_XATTR_VALUE_BYTES: usize = 64 << 10;
/// Largest xattr name list, counted as Linux does (each name and a NUL).
pub const MAX_XATTR_LIST_BYTES: usize = 64 << 10;
/// Longest error detail text; longer text is cut when encoded.
pub const MAX_ERROR_MESSAGE_BYTES: usize = 1024;
