//! The worker as the host of multi-shard steps ([`Host`]): cross-shard
//! renames, bigdir rmdirs, follow-ups and the sweep reach their shard, other
//! workers and other servers through it.

use std::time::Instant;

use pfs_core::wire::{Body, Frame, Reply, Request};
use pfs_core::{FsError, RequestId, ServerId, WorkerId};
use pfs_store::device::Device;
use pfs_store::Shard;

use crate::host::Host;
use crate::msg::{ConnRef, Task, Waiter};
use crate::peers::PeerError;

use super::Worker;

/// Messages to other shards (`peers.rs`): over the rings to a worker of this
/// server, over a connection to another.
impl<D: Device> Worker<D> {
    /// The server this worker belongs to.
    pub(super) fn own_server(&self) -> ServerId {
        ServerId(self.shard.id().0 / self.workers())
    }

    /// Sends `req` to `worker` of `server`: over the rings when it is another
    /// worker of this server, else over a connection ([`Peers::send`]); its reply comes with
    /// [`peer_poll`](Self::peer_poll).
    fn peer_send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError> {
        if server != self.own_server() || worker.0 == u32::from(self.id) {
            return self.peers.send(server, worker, req);
        }
        let (request_id, conn, buf) = self.peers.local_message(worker, req)?;
        self.push(worker.0 as u16, Task::Request { from: self.id, conn, buf });
        Ok(request_id)
    }

    /// The reply to `id`, sent with [`peer_send`](Self::peer_send) to
    /// `server`, if it came: `Ok(None)` while waiting.
    fn peer_poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String> {
        self.peers.reply(server, id)
    }
}

impl<D: Device> Host<D> for Worker<D> {
    fn worker_id(&self) -> u16 {
        self.id
    }

    fn now(&self) -> Instant {
        self.now
    }

    fn shard(&mut self) -> &mut Shard<D> {
        &mut self.shard
    }

    fn workers(&self) -> u32 {
        Worker::workers(self)
    }

    fn shape(&self) -> Option<(u32, u32)> {
        self.peers.shape()
    }

    fn send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError> {
        self.peer_send(server, worker, req)
    }

    fn poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String> {
        self.peer_poll(server, id)
    }

    fn forget_conn(&mut self, server: ServerId) {
        self.peers.forget_conn(server);
    }

    fn connected(&self, w: &Waiter) -> bool {
        self.is_connected(w)
    }

    fn answer(&mut self, w: Waiter, body: Body) {
        let frame = Frame { request_id: w.request_id, client: w.client, body };
        let buf = frame.to_bytes().expect("a reply to a multi-shard step always encodes");
        self.reply_after_commit(w.origin, w.conn, buf);
    }

    fn changed(&mut self) {
        self.mark_dirty();
    }

    fn send_reply(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        self.route_reply(origin, conn, buf);
    }
}
