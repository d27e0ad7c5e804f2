//! What a worker lends the multi-shard state machines it drives: cross-shard
//! renames ([`crate::cross`]), bigdir rmdirs ([`crate::rmdir`]), follow-ups
//! ([`crate::follow`]) and the sweep of orphaned data ([`crate::sweep`]).
//!
//! Each machine keeps its own state and takes a [`Host`] for every step: the
//! worker's shard, its clock, its way to other shards (over the worker rings
//! inside this server, over a connection to another), and its way back to a
//! waiting client. So the machines never see the worker, and the worker
//! (`worker.rs`) is the only file that knows them all: nothing imports it back.

use std::time::Instant;

use pfs_core::wire::{Body, Reply, Request};
use pfs_core::{FsError, RequestId, ServerId, WorkerId};
use pfs_store::device::Device;
use pfs_store::Shard;

use crate::msg::{ConnRef, Waiter};
use crate::peers::PeerError;

/// The worker as a multi-shard step sees it.
pub(crate) trait Host<D: Device> {
    /// The worker's number in its server (for log lines).
    fn worker_id(&self) -> u16;
    /// The time of the worker's round.
    fn now(&self) -> Instant;
    /// The worker's shard.
    fn shard(&mut self) -> &mut Shard<D>;
    /// Workers per server.
    fn workers(&self) -> u32;
    /// Servers and workers per server of the cluster, once the view came.
    fn shape(&self) -> Option<(u32, u32)>;
    /// Sends `req` to `worker` of `server`; its reply is asked for with
    /// [`poll`](Self::poll).
    fn send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError>;
    /// The reply to `id`, sent to `server`, if it came (`Ok(None)`: not yet;
    /// `Err`: the connection failed, ask again).
    fn poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String>;
    /// Drops the connection to `server` (it failed); the next send makes one.
    fn forget_conn(&mut self, server: ServerId);
    /// Whether the client behind `w` is still connected where it asked.
    fn connected(&self, w: &Waiter) -> bool;
    /// Answers the client behind `w` once what the shard logged so far is
    /// committed: a refusal told before its record is durable could be undone
    /// by recovery.
    fn answer(&mut self, w: Waiter, body: Body);
    /// The shard changed: the commit timer runs.
    fn changed(&mut self);
    /// Sends reply frame `buf` to connection `conn` of worker `origin` (a
    /// reply held until a step finished).
    fn send_reply(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>);
}
