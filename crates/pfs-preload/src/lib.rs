//! libpfs_preload: PeakFS's client library. Loaded with `LD_PRELOAD`, it makes
//! every path under `PFS_MOUNT` a pfs path that an unmodified program reaches
//! through the native client ([`pfs_client::Cluster`]), without the kernel;
//! every other path and descriptor goes to libc untouched. docs/preload.md is
//! the user's guide.
//!
//! - `client`: the configuration from the environment and the one client,
//!   connected at the first pfs call (and again in a child after `fork`).
//! - `paths`: which paths are pfs paths, normalized.
//! - `fds`: the file map (pfs descriptors are real `O_PATH` descriptors of
//!   `/dev/null`, so their numbers never collide with the kernel's).
//! - `ops`: the operations in Rust terms, returning an errno on failure.
//! - `locks`: `fcntl`, `flock` and `lockf` locks at the files' homes.
//! - `maps`: `mmap` of pfs files (private copies, written back at `msync`).
//! - `hooks`: the C symbols (`open`, `read`, `stat`, `opendir`, `fopen`, ...).
//! - `inherit`: the pfs working directory and descriptors a program hands to
//!   the one it `exec`s.
//! - `convert`, `real`: C conventions, and libc's own definitions.

// Unit tests build without the hooks (see Cargo.toml): what only they call is
// unused there.
#![cfg_attr(test, allow(dead_code))]

#[cfg(not(test))]
mod aio;
mod client;
mod convert;
mod fds;
#[cfg(not(test))]
mod hooks;
mod inherit;
mod limits;
mod locks;
mod maps;
mod ops;
mod paths;
mod real;
