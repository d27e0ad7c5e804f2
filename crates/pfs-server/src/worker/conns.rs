//! The worker's client and peer connections: taking new ones, polling them,
//! the first checks on a request frame (its sender, its worker), and sending
//! replies and unasked notifications on them.

use pfs_core::wire::{Body, Frame, FrameHeader, Request};
use pfs_core::{ClientId, FsError, RequestId};
use pfs_net::poller::READ;
use pfs_net::{link_sum, Completion, Link, QueuePair, WorkId};
use pfs_store::device::Device;

use crate::msg::{ConnRef, Task, Waiter};

use super::Worker;

pub(super) struct ConnState {
    pub(super) qp: Link,
    pub(super) gen: u32,
    /// The client id its requests carry, once seen.
    pub(super) client: Option<ClientId>,
    /// The peer proved the server role in its handshake.
    pub(super) peer_is_server: bool,
    /// Internal requests refused on this connection (logged once).
    pub(super) refused_internal: u64,
}

/// Requests only servers send each other (cross-shard transactions). A client
/// that sends one gets `EPERM` and the server logs it: a buggy or hostile
/// client could otherwise seal directories or apply half a rename.
pub(super) fn server_internal(opcode: u16) -> bool {
    use pfs_core::Opcode;
    [
        Opcode::XRenameTarget,
        Opcode::TxnForget,
        Opcode::SealDir,
        Opcode::FollowUps,
        Opcode::DropInode,
        Opcode::AddLink,
        Opcode::TruncateData,
    ]
    .iter()
    .any(|o| *o as u16 == opcode)
}

/// An error reply to the request whose header is `header`.
pub(super) fn error_reply(header: FrameHeader, error: FsError) -> Vec<u8> {
    // An unknown opcode never reaches here: the transport decoded the header and
    // `Frame::decode` refuses unknown opcodes before a request runs.
    let op =
        pfs_core::wire::Opcode::from_u16(header.opcode).unwrap_or(pfs_core::wire::Opcode::StatFs);
    let frame = Frame {
        request_id: RequestId(header.request_id.0),
        client: ClientId(header.client.0),
        body: Body::Error { op, error },
    };
    frame.to_bytes().expect("an error frame always encodes")
}

impl<D: Device> Worker<D> {
    pub(super) fn take_new_conns(&mut self) -> usize {
        let mut n = 0;
        while let Ok(mut qp) = self.new_conns.try_recv() {
            n += 1;
            for _ in 0..qp.credits() {
                if qp.post_recv(Vec::new()).is_err() {
                    break;
                }
            }
            let slot = match self.conns.iter().position(Option::is_none) {
                Some(s) => s,
                None if self.conns.len() < self.live.per_worker() => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
                None => {
                    // The listener admits no more than that many in all.
                    log::warn!(
                        "worker {}: refused {}: it already serves {} connections",
                        self.id,
                        qp.peer(),
                        self.conns.len()
                    );
                    continue;
                }
            };
            if let Err(e) = self.epoll.add(qp.wait_fd(), READ, slot as u64 + 1) {
                log::warn!("worker {}: cannot watch {}: {e}", self.id, qp.peer());
                continue;
            }
            if let Some(key) = self.inline_key {
                qp.set_inline_key(key);
            }
            log::info!("worker {}: serving {} over {:?}", self.id, qp.peer(), qp.backend());
            let gen = self.next_gen;
            self.next_gen = self.next_gen.wrapping_add(1).max(1);
            let peer_is_server = qp.peer_is_server();
            self.conns[slot] =
                Some(ConnState { qp, gen, client: None, peer_is_server, refused_internal: 0 });
            self.live.set(self.id, slot, gen);
        }
        n
    }

    pub(super) fn serve_conn(&mut self, slot: usize) -> usize {
        let Some(conn) = self.conns[slot].as_mut() else { return 0 };
        let mut done = std::mem::take(&mut self.completions);
        done.clear();
        let polled = conn.qp.poll_cq(&mut done);
        let me = ConnRef { slot: slot as u32, gen: conn.gen, sum: link_sum(conn.qp.backend()) };
        let mut work = 0;
        for c in done.drain(..) {
            work += 1;
            match c {
                Completion::Send { buf, .. } => {
                    if let Some(conn) = self.conns[slot].as_mut() {
                        let _ = conn.qp.post_recv(buf);
                    }
                }
                Completion::Recv { buf } => {
                    self.on_request(me, buf);
                }
                Completion::Write { .. } | Completion::Read { .. } | Completion::Imm { .. } => {}
            }
        }
        self.completions = done;
        if let Err(e) = polled {
            self.drop_conn(slot, &e.to_string());
        }
        work
    }

    pub(super) fn drop_conn(&mut self, slot: usize, reason: &str) {
        if let Some(conn) = self.conns[slot].take() {
            let _ = self.epoll.delete(conn.qp.wait_fd());
            self.live.set(self.id, slot, 0);
            if let Some(client) = conn.client {
                let sum = link_sum(conn.qp.backend());
                let me = ConnRef { slot: slot as u32, gen: conn.gen, sum };
                if self.clients.get(&client) == Some(&me) {
                    self.clients.remove(&client);
                }
            }
            log::info!("worker {}: connection from {} ended: {reason}", self.id, conn.qp.peer());
        }
    }

    /// A request frame arrived on one of this worker's connections.
    pub(super) fn on_request(&mut self, conn: ConnRef, buf: Vec<u8>) {
        let header = match FrameHeader::decode(&buf) {
            Ok(h) => h,
            Err(e) => return self.close(conn, &format!("bad request header: {e}")),
        };
        if header.client.0 != 0 {
            if let Some(state) = self.conns[conn.slot as usize].as_mut() {
                if state.client.is_none() {
                    state.client = Some(header.client);
                    self.clients.insert(header.client, conn);
                }
            }
        }
        if server_internal(header.opcode) {
            if let Some(state) = self.conns[conn.slot as usize].as_mut() {
                if !state.peer_is_server {
                    state.refused_internal += 1;
                    if state.refused_internal == 1 {
                        log::warn!(
                            "worker {}: refused server-internal request (opcode {}) from client {} \
                             at {}: only servers send it (later ones are refused silently)",
                            self.id,
                            header.opcode,
                            header.client,
                            state.qp.peer()
                        );
                    }
                    let reply = error_reply(header, FsError::NotPermitted);
                    return self.send_reply(conn, reply);
                }
            }
        }
        let workers = self.ring_out.len();
        let target = header.worker as usize;
        if target >= workers {
            let error = FsError::Invalid(format!(
                "request for worker {target}, but this server runs {workers} workers: \
                 the client's cluster view is stale"
            ));
            let reply = error_reply(header, error);
            return self.send_reply(conn, reply);
        }
        if target == self.id as usize {
            if let Some(reply) = self.process_for(self.id, conn, buf) {
                self.send_reply(conn, reply);
            }
            return;
        }
        let task = Task::Request { from: self.id, conn, buf };
        self.push(target as u16, task);
    }

    /// Whether the connection `waiter` came on is still open. A caller
    /// without a client id has no connection to lose: it counts as connected.
    pub(super) fn is_connected(&self, waiter: &Waiter) -> bool {
        waiter.client.0 == 0 || self.live.is_live(waiter.origin, waiter.conn)
    }

    /// Sends `req` unasked to `client` on its connection, wherever it is
    /// served: on this worker's, or through every other worker (the one that
    /// serves it sends it; a client connected nowhere here lets its lease run
    /// out by itself).
    pub(super) fn notify(&mut self, client: ClientId, req: Request) {
        let frame = Frame { request_id: RequestId(0), client, body: Body::Request(req) };
        let buf = frame.to_bytes().expect("a notification always encodes");
        if let Some(&conn) = self.clients.get(&client) {
            return self.send_reply(conn, buf);
        }
        for w in 0..self.ring_out.len() as u16 {
            if w != self.id {
                self.push(w, Task::Notify { client, buf: buf.clone() });
            }
        }
    }

    /// A notification another worker could not deliver itself.
    pub(super) fn deliver_notify(&mut self, client: ClientId, buf: Vec<u8>) {
        if let Some(&conn) = self.clients.get(&client) {
            self.send_reply(conn, buf);
        }
    }

    pub(super) fn send_reply(&mut self, conn: ConnRef, buf: Vec<u8>) {
        if conn.slot == crate::peers::LOCAL_SLOT {
            // The reply to this worker's own message to another worker.
            return self.peers.deliver_local(conn.gen, buf);
        }
        let Some(state) = self.conns.get_mut(conn.slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if state.gen != conn.gen {
            return; // The connection closed and its slot was reused.
        }
        if let Err(r) = state.qp.post_send(WorkId(0), buf) {
            let reason = format!("cannot send a reply: {}", r.error);
            self.drop_conn(conn.slot as usize, &reason);
        }
    }

    pub(super) fn close(&mut self, conn: ConnRef, reason: &str) {
        if let Some(state) = self.conns.get_mut(conn.slot as usize).and_then(Option::as_mut) {
            if state.gen == conn.gen {
                state.qp.close(reason);
                log::warn!("worker {}: closing {}: {reason}", self.id, state.qp.peer());
            }
        }
    }
}
