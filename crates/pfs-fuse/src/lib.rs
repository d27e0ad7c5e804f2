//! pfs-fuse: the FUSE mount client.
//!
//! - [`adapter`]: [`PfsFuse`], the `fuser` file system that turns kernel requests
//!   into [`pfs_client::FileSystem`] calls, with cache TTLs and invalidation.
//! - [`dirattrs`]: directory attributes kept for the kernel's permission checks.
//! - [`gate`]: opens and removals kept apart, each running alongside its own kind.
//! - [`locks`]: `fcntl` and `flock` locks every node sees, and the locks that wait.
//! - [`memfs`]: [`MemFs`], an in-memory file system behind the same adapter: the
//!   FUSE ceiling benchmarks compare pfs against.
//! - [`mount`](mod@mount): `-o` options, mounting, serving until unmount, signals.
//! - [`pages`]: whether an open keeps the kernel's cached pages of a file (its
//!   version, the inode's ctime, unchanged but by this mount).
//!
//! The `pfs-fuse` binary (`src/main.rs`) is the mount helper:
//! `mount -t fuse.pfs-fuse HOST:PORT /mnt/pfs -o key=...`.

pub mod adapter;
pub mod dirattrs;
pub mod gate;
pub mod locks;
pub mod memfs;
pub mod mount;
pub mod names;
pub mod newfiles;
pub mod oldest;
pub mod pages;
pub mod small;

pub use adapter::{CacheTtl, PfsFuse};
pub use memfs::MemFs;
pub use mount::{mount, Mount, MountConfig, READ_AHEAD_KB};
