//! pfs root package: the `pfs` command (admin and all-in-one CLI), integration
//! tests in `tests/` and the criterion benchmarks in `benches/`. The file system
//! itself lives in `crates/`.
//!
//! - [`status`]: the cluster view as the table `pfs status` prints.
//! - [`up`]: `pfs up`, a master, servers and a FUSE mount in one process.
//! - [`layout`]: `pfs layout get|set`, layouts through extended attributes.
//! - [`bench`]: `pfs bench`, the IO500-style workloads (mdtest, IOR, md-workbench,
//!   HACC-IO) by N processes on a directory or through the native client.
//! - [`fsx`]: `pfs fsx`, the model-checking file exerciser.
//! - [`fsck`]: `pfs fsck`, the offline checker of servers' shards.
//! - [`mkfs`]: `pfs mkfs`, formatting a server's device ahead of its first start.

pub mod bench;
pub mod fsck;
pub mod fsx;
pub mod layout;
pub mod mkfs;
pub mod status;
pub mod up;
