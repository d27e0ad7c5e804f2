//! pfs-store: one storage shard (PStore of PeakFS), single-threaded, generic over a
//! [`device::Device`], without locks.
//!
//! - [`device`]: the submit/complete device trait, `MemDevice` (tests, crash
//!   model, fault injection) and `UringDevice` (io_uring, `O_DIRECT`).
//! - [`bitmap`]: fixed-size bitmap allocator for inode slots and page runs.
//! - [`inode`]: the inode and its 256-byte slot encoding.
//! - [`icache`]: the Icache state machine over the metadata area.
//! - [`wal`]: write-ahead log records, group commit, scan.
//! - [`shard`]: the shard API the server calls: format, open (recovery),
//!   namespace and data operations, commit, checkpoint.
//! - [`io`]: the shard's routing of device completions.
//! - [`slots`]: the inode table (inode number -> slot), split so it grows in
//!   small steps.

pub mod bitmap;
pub mod device;
pub mod error;
pub mod icache;
pub mod inode;
pub mod io;
pub mod shard;
pub mod slots;
pub mod wal;

pub use error::StoreError;
pub use shard::{
    CreateArgs, DeferredOn, DirEntry, FormatOptions, RenameFlags, Shard, ShardOptions, XattrFlags,
    Zone,
};
pub mod cart;
