//! pfs-client: the native file API of pfs.
//!
//! - [`api`]: the [`FileSystem`] trait, every operation a POSIX client needs, by
//!   inode. `pfs-fuse` adapts any `FileSystem` to the kernel; tests and benchmarks
//!   call it directly.
//! - [`pipeline`]: the write window of an open file (bounded unfinished writes).
//! - [`dcache`]: the bounded, expiring cache of directory dentries.
//! - [`cluster`]: [`Cluster`], the client of a running cluster: view, routing,
//!   data split by block, pipelined writes.
//! - [`conn`]: one shared connection to one server.
//! - [`unsynced`]: the changes this client had acknowledged and not yet committed,
//!   for `fsync` and `fsyncdir`.

pub mod api;
pub mod cluster;
pub mod conn;
pub mod dcache;
pub mod pipeline;
pub mod unsynced;

pub use api::{DirListing, FileSystem, Invalidation, Invalidator};
pub use cluster::{Cluster, ClusterOptions};
