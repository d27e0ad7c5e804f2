//! pfs-server: the storage daemon (RingSched) and the cluster master.
//!
//! - [`cross`]: the coordinator of cross-shard renames (intent, dispatch,
//!   finish, recovery) and the connections to other servers.
//! - [`rmdir`]: rmdir of a `bigdir` directory, sealed on every shard first.
//! - `host`: what a worker lends the multi-shard state machines it drives
//!   (`cross`, `rmdir`), so they never see the worker.
//! - [`exec`]: one wire request run on a shard (the only request-to-shard mapping).
//! - [`fsck`]: the offline checker of stopped servers' shards (`pfs fsck`).
//! - [`worker`]: a worker thread: its shard, its connections, the SPSC rings to
//!   the other workers, group commit, adaptive polling.
//! - [`server`]: start-up (zones, format or recovery, registration), the acceptor
//!   and the heartbeat; [`ServerHandle`] stops it cleanly.
//! - [`master`]: the cluster view: registration, heartbeats, down detection.
//! - [`memcpy`]: the pool of threads that encode large read replies off the
//!   workers.
//! - [`signals`]: SIGTERM / SIGINT to a stop flag.
//! - [`tokens`]: dentry-cache read/write tokens with leases, and who to tell.

pub mod cleanstop;
pub mod cross;
pub mod exec;
pub mod follow;
pub mod fsck;
mod host;
pub mod locks;
pub mod master;
pub mod memcpy;
pub mod msg;
pub mod peers;
pub mod rmdir;
pub mod server;
pub mod signals;
pub mod spin;
mod stopped;
pub mod sweep;
pub mod tokens;
pub mod worker;

pub use master::{start_master, MasterHandle, MasterState};
pub use server::{mkfs, start, DeviceWaits, ServerHandle};
pub use worker::FailStop;

/// Why a server or master could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is wrong; the text names the field.
    #[error("configuration: {0}")]
    Config(String),
    /// The data file or device could not be opened, formatted or recovered.
    #[error("storage: {0}")]
    Storage(String),
    /// A socket could not be set up.
    #[error("network: {0}")]
    Net(String),
    /// The master refused or could not be reached.
    #[error("master: {0}")]
    Master(String),
    /// A worker failed.
    #[error("worker: {0}")]
    Worker(String),
    /// A shard stopped acknowledging or a worker panicked, so the whole server
    /// stopped (fail-stop); restart it and its shards recover from their logs.
    #[error("fail-stop: {0}")]
    FailStop(String),
}
