//! pfs-client: the native file API of pfs.
//!
//! - [`api`]: the [`FileSystem`] trait, every operation a POSIX client needs, by
//!   inode. `pfs-fuse` adapts any `FileSystem` to the kernel; tests and benchmarks
//!   call it directly.
//! - [`pipeline`]: the write window of an open file (bounded unfinished writes).
//! - [`dcache`]: the bounded, expiring cache of directory dentries.

pub mod api;
pub mod dcache;
pub mod pipeline;

pub use api::{DirListing, FileSystem, Invalidation, Invalidator};
