//! Sending follow-ups (docs/cluster.md, "Follow-ups"): the remote effects of
//! operations on this worker's shard, logged with them (`pfs_store::shard::follow`).
//!
//! Once a follow-up's record is durable it is sent to its target shard in a
//! `FollowUps` request, at most one request in flight per target and each
//! carrying the oldest follow-ups for it in id order. The target applies each at
//! most once and answers after its commit; then the record is deleted here. A
//! target that cannot be reached is asked again every 500 ms, for as long as it
//! takes (the records survive restarts on both sides).
//!
//! A reply to the request that logged a follow-up whose effect a client would
//! see at once (a directory's link count, a link's count, data past a cut) is
//! held until that follow-up is done; freeing a removed file's data is not
//! waited for.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use pfs_core::wire::{Body, FollowOp, Frame, FrameHeader, Reply, Request, MAX_FOLLOW_UPS};
use pfs_core::{FsError, RequestId, ServerId, ShardId, WorkerId};
use pfs_store::device::Device;
use pfs_store::shard::follow::{FollowTarget, FollowUp};

use crate::msg::ConnRef;
use crate::peers::{over_network, RETRY_AFTER};
use crate::worker::Worker;

/// Pause before asking a target again after a failure.
/// How long a held reply waits before the client is told the operation will
/// complete later.
const CLIENT_PATIENCE: Duration = Duration::from_secs(10);

/// A shard as the network names it.
type Shard2 = (ServerId, WorkerId);

/// One durable follow-up not yet done.
#[derive(Debug)]
struct Pending {
    up: FollowUp,
    /// Targets that have not answered yet; `None` until the cluster shape is
    /// known (the view arrives with the first heartbeat).
    left: Option<Vec<Shard2>>,
}

/// The request in flight to one target.
#[derive(Debug, Default)]
struct Stream {
    sent: Option<(RequestId, Vec<u64>)>,
    retry_at: Option<Instant>,
}

/// A reply held until follow-ups are done.
#[derive(Debug)]
struct Hold {
    ids: Vec<u64>,
    origin: u16,
    conn: ConnRef,
    buf: Vec<u8>,
    give_up: Instant,
}

/// A worker's follow-ups in flight.
#[derive(Debug, Default)]
pub struct Outbox {
    entries: BTreeMap<u64, Pending>,
    streams: HashMap<Shard2, Stream>,
    holds: Vec<Hold>,
}

impl Outbox {
    /// Whether a request to a peer waits for its answer.
    pub fn awaiting_peer(&self) -> bool {
        self.streams.values().any(|s| s.sent.as_ref().is_some_and(|(id, _)| over_network(*id)))
    }

    /// Whether anything is left to send or hold.
    pub fn is_idle(&self) -> bool {
        self.entries.is_empty() && self.holds.is_empty()
    }
}

/// Whether a client waits for `op` before its reply (see the module comment).
pub fn holds_reply(op: &FollowOp) -> bool {
    !matches!(op, FollowOp::FreeData { .. } | FollowOp::Forget { .. })
}

impl<D: Device> Worker<D> {
    /// Holds the reply `buf` until follow-ups `ids` are done.
    pub(crate) fn hold_reply(&mut self, ids: Vec<u64>, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        let give_up = self.now + CLIENT_PATIENCE;
        self.outbox.holds.push(Hold { ids, origin, conn, buf, give_up });
    }

    /// Whether a held reply waits for a follow-up not yet durable (so the
    /// round commits now instead of at the commit interval).
    pub(crate) fn holds_wait_for_commit(&self) -> bool {
        !self.outbox.holds.is_empty() && self.shard.has_pending_follow_ups()
    }

    fn shape_of(&self) -> Option<(u32, u32)> {
        self.peers.shape()
    }

    /// Takes new durable follow-ups, polls answers, sends what is due; returns
    /// the work done.
    pub(crate) fn poll_follow_ups(&mut self) -> usize {
        let mut work = 0;
        for up in self.shard.take_ready_follow_ups() {
            log::debug!(
                "worker {}: follow-up {:#x} {:?} to {:?}",
                self.id,
                up.id,
                up.op,
                up.target
            );
            self.outbox.entries.insert(up.id, Pending { up, left: None });
            work += 1;
        }
        if self.outbox.entries.is_empty() && self.outbox.holds.is_empty() {
            return work;
        }
        if let Some((servers, workers)) = self.shape_of() {
            let me = self.shard.id();
            let block = u64::from(self.shard.geometry().block_size);
            let mut empty = Vec::new();
            for (id, p) in self.outbox.entries.iter_mut().filter(|(_, p)| p.left.is_none()) {
                let targets = targets(&p.up, me, block, servers, workers);
                log::debug!("worker {}: follow-up {id:#x} goes to {targets:?}", self.id);
                if targets.is_empty() {
                    empty.push(*id);
                }
                p.left = Some(targets);
            }
            for id in empty {
                work += 1;
                self.follow_finished(id);
            }
        }
        work += self.poll_streams();
        work += self.send_streams();
        work += self.expire_holds();
        work
    }

    fn poll_streams(&mut self) -> usize {
        let mut work = 0;
        let busy: Vec<(Shard2, RequestId)> = self
            .outbox
            .streams
            .iter()
            .filter_map(|(t, s)| s.sent.as_ref().map(|(id, _)| (*t, *id)))
            .collect();
        for (target, req) in busy {
            let outcome = match self.peer_poll(target.0, req) {
                Ok(None) => continue,
                Ok(Some(Ok(Reply::FollowUps { .. }))) => Ok(()),
                Ok(Some(Ok(other))) => Err(format!("answered {:?}", other.opcode())),
                Ok(Some(Err(e))) => Err(e.to_string()),
                Err(e) => {
                    self.peers.forget_conn(target.0);
                    Err(e)
                }
            };
            work += 1;
            let stream = self.outbox.streams.get_mut(&target).expect("polled above");
            let (_, ids) = stream.sent.take().expect("in flight");
            match outcome {
                Ok(()) => {
                    for id in ids {
                        let Some(p) = self.outbox.entries.get_mut(&id) else { continue };
                        if let Some(left) = p.left.as_mut() {
                            left.retain(|t| *t != target);
                            if left.is_empty() {
                                self.follow_finished(id);
                            }
                        }
                    }
                }
                Err(e) => {
                    log::warn!(
                        "worker {}: follow-ups to server {} worker {}: {e}; sending again",
                        self.id,
                        target.0,
                        target.1
                    );
                    stream.retry_at = Some(self.now + RETRY_AFTER);
                }
            }
        }
        work
    }

    fn send_streams(&mut self) -> usize {
        // The oldest follow-ups of each target with nothing in flight.
        let mut batches: BTreeMap<Shard2, Vec<(u64, FollowOp)>> = BTreeMap::new();
        for (id, p) in &self.outbox.entries {
            let Some(left) = &p.left else { continue };
            for t in left {
                let s = self.outbox.streams.get(t);
                if s.is_some_and(|s| s.sent.is_some() || s.retry_at.is_some_and(|r| r > self.now)) {
                    continue;
                }
                let b = batches.entry(*t).or_default();
                if b.len() < MAX_FOLLOW_UPS {
                    b.push((*id, p.up.op));
                }
            }
        }
        let mut work = 0;
        let from = self.shard.id();
        for (target, ops) in batches {
            let ids: Vec<u64> = ops.iter().map(|(id, _)| *id).collect();
            let stream = self.outbox.streams.entry(target).or_default();
            stream.retry_at = None;
            match self.peer_send(target.0, target.1, Request::FollowUps { from, ops }) {
                Ok(req) => {
                    work += 1;
                    self.outbox.streams.get_mut(&target).expect("made above").sent =
                        Some((req, ids));
                }
                Err(e) => {
                    if e.is_failure() {
                        log::warn!(
                            "worker {}: cannot reach server {} for follow-ups: {e}",
                            self.id,
                            target.0
                        );
                    }
                    self.outbox.streams.get_mut(&target).expect("made above").retry_at =
                        Some(e.retry_at(self.now));
                }
            }
        }
        work
    }

    /// Every target answered follow-up `id`: its record goes, and replies
    /// waiting only for it are sent.
    fn follow_finished(&mut self, id: u64) {
        self.outbox.entries.remove(&id);
        if let Err(e) = self.shard.follow_done(id) {
            log::error!("worker {}: cannot delete follow-up {id:#x}: {e}", self.id);
        }
        self.mark_dirty();
        let mut i = 0;
        while i < self.outbox.holds.len() {
            let h = &mut self.outbox.holds[i];
            h.ids.retain(|x| *x != id);
            if h.ids.is_empty() {
                let h = self.outbox.holds.swap_remove(i);
                self.route_reply(h.origin, h.conn, h.buf);
            } else {
                i += 1;
            }
        }
    }

    /// Held replies whose follow-ups take too long: the client is told the
    /// operation will complete (it is durable here; the follow-up is re-sent).
    fn expire_holds(&mut self) -> usize {
        let mut work = 0;
        let mut i = 0;
        while i < self.outbox.holds.len() {
            if self.now < self.outbox.holds[i].give_up {
                i += 1;
                continue;
            }
            let h = self.outbox.holds.swap_remove(i);
            work += 1;
            let Ok(header) = FrameHeader::decode(&h.buf) else { continue };
            let op = pfs_core::wire::Opcode::from_u16(header.opcode)
                .unwrap_or(pfs_core::wire::Opcode::StatFs);
            let error = FsError::Io(
                "the operation is done here and waits for another server; \
                 it completes when that server answers"
                    .into(),
            );
            let frame = Frame {
                request_id: RequestId(header.request_id.0),
                client: pfs_core::ClientId(header.client.0),
                body: Body::Error { op, error },
            };
            let buf = frame.to_bytes().expect("an error frame always encodes");
            self.route_reply(h.origin, h.conn, buf);
        }
        work
    }
}

/// The shards a follow-up goes to (never this one).
fn targets(up: &FollowUp, me: ShardId, block: u64, servers: u32, workers: u32) -> Vec<Shard2> {
    let of = |g: ShardId| (ServerId(g.0 / workers), WorkerId(g.0 % workers));
    let mine = of(me);
    match up.target {
        FollowTarget::Shard(g) if g.0 < servers * workers && of(g) != mine => vec![of(g)],
        FollowTarget::Shard(_) => Vec::new(),
        FollowTarget::DataShards => {
            let (ino, layout, size, old_size) = match up.op {
                FollowOp::FreeData { ino, layout, old_size } => (ino, layout, 0, old_size),
                FollowOp::CutData { ino, layout, size, old_size } => (ino, layout, size, old_size),
                _ => return Vec::new(),
            };
            pfs_core::routing::data_shards(ino, layout, size, old_size, block, servers, workers)
                .into_iter()
                .filter(|t| *t != mine)
                .collect()
        }
    }
}
