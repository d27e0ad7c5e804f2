//! pfs-client: the native file API of pfs.
//!
//! - [`api`]: the [`FileSystem`] trait, every operation a POSIX client needs, by
//!   inode. `pfs-fuse` adapts any `FileSystem` to the kernel; tests and benchmarks
//!   call it directly.

pub mod api;

pub use api::{DirListing, FileSystem, Invalidation, Invalidator};
