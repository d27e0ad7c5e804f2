//! Types shared by every pfs crate.
//!
//! - [`ids`]: newtype identifiers (`InodeId`, `ShardId`, `WorkerId`, ...).
//! - [`attr`]: `FileType`, `FileAttr`, `SetAttr`, `StatFs`.
//! - [`error`]: `FsError`, the one error a client sees, and its errno.
//! - [`failpoint`]: named failures a test sets off in a real process.
//! - [`layout`]: `DirLayout` and `FileLayout`.
//! - [`locks`]: a table of file locks under POSIX's rules.
//! - [`routing`]: the characteristic value `Lambda` of a request and its `Route`.
//! - [`wire`]: frames, requests and replies, and their byte encoding.
//! - [`config`]: server, master and client configuration (TOML), with validation.

pub mod attr;
pub mod config;
pub mod error;
pub mod failpoint;
pub mod hash;
pub mod ids;
pub mod layout;
pub mod locks;
pub mod routing;
pub mod wire;

pub use attr::{
    FileAttr, FileType, SetAttr, StatFs, TimeNs, NAME_MAX, XATTR_ACL_ACCESS, XATTR_ACL_DEFAULT,
};
pub use config::{
    ClientConfig, ConfigError, ConfigFile, MasterConfig, PfsConfig, ServerConfig, Transport,
};
pub use error::{FsError, FsResult};
pub use ids::{BlockIndex, ClientId, FileHandle, InodeId, RequestId, ServerId, ShardId, WorkerId};
pub use layout::{DirLayout, FileLayout};
pub use routing::{Lambda, Route, RouteKey};
pub use wire::{Body, Frame, Opcode, Reply, Request, WireError};

/// File block size of every shard (docs/format.md): clients cut data at these
/// boundaries and place each block by it, shards map it as one run of pages.
/// Both sides must agree; shards are formatted with it.
pub const BLOCK_SIZE_BYTES: u64 = 64 << 10;

/// Largest file size (256 TiB): past it, writes and truncates fail with `EFBIG`.
pub const MAX_FILE_SIZE: u64 = 1 << 48;
