//! pfs-client: the native file API of pfs.
//!
//! - [`api`]: the [`FileSystem`] trait, every operation a POSIX client needs, by
//!   inode. `pfs-fuse` adapts any `FileSystem` to the kernel; tests and benchmarks
//!   call it directly.
//! - [`dcache`]: the bounded, expiring cache of directory dentries.
//! - [`cluster`]: [`Cluster`], the client of a running cluster. Its parts:
//!   `placement` (where each request goes, a range cut into per-shard pieces),
//!   `files` (open handles and their write windows), `caches` (layouts,
//!   directory names under tokens, invalidations), `data` (reads, pipelined
//!   writes, what close and fsync wait for), `commit` (unsynced changes and the
//!   commits fsync asks for), and the metadata operations in `cluster` itself.
//! - [`conn`]: one shared connection to one server.
//! - [`addrs`]: where each server listens, asked of the master again when one
//!   cannot be reached.
//! - [`unsynced`]: the changes this client had acknowledged and not yet committed,
//!   for `fsync` and `fsyncdir`.

pub mod addrs;
pub mod ahead;
pub mod api;
pub mod cluster;
pub mod conn;
pub mod dcache;
pub mod unsynced;

pub use api::{DirListing, FileSystem, Invalidation, Invalidator, VersionObserver};
pub use cluster::{Cluster, ClusterOptions, LookupHook};
