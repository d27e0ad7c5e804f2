//! Types shared by every pfs crate.
//!
//! - [`ids`]: newtype identifiers (`InodeId`, `ShardId`, ...).
//! - [`attr`]: `FileType`, `FileAttr`, `SetAttr`, `StatFs`.
//! - [`error`]: `FsError`, the one error a client sees, and its errno.
//! - [`layout`]: `DirLayout` and `FileLayout`.

pub mod attr;
pub mod error;
pub mod ids;
pub mod layout;

pub use attr::{FileAttr, FileType, SetAttr, StatFs, TimeNs, NAME_MAX};
pub use error::{FsError, FsResult};
pub use ids::{BlockIndex, ClientId, InodeId, ServerId, ShardId};
pub use layout::{DirLayout, FileLayout};
