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
//!
//! A target refuses one kind: a hard link's `AddLink` whose file was removed
//! before the link was counted. The name the link made here goes again
//! (`Shard::undo_link`, with the record) and the held reply becomes `ENOENT`,
//! as if the link had come after the removal.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use pfs_core::wire::{Body, FollowOp, Frame, FrameHeader, Reply, Request, MAX_FOLLOW_UPS};
use pfs_core::{FsError, RequestId, ServerId, ShardId, WorkerId};
use pfs_store::device::Device;
use pfs_store::shard::follow::{FollowTarget, FollowUp};
use pfs_store::Shard;

use crate::host::Host;
use crate::msg::ConnRef;
use crate::peers::{over_network, RETRY_AFTER};

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
    /// A follow-up of it was refused: the client is told `ENOENT`.
    refused: bool,
}

/// A worker's follow-ups in flight.
#[derive(Debug, Default)]
pub struct Outbox {
    entries: BTreeMap<u64, Pending>,
    streams: HashMap<Shard2, Stream>,
    holds: Vec<Hold>,
    /// Follow-ups every target answered whose records are still to be
    /// deleted: the delete stopped (a commit or room in the log first) and
    /// runs again in a later round. At most one per finished entry.
    finished: Vec<u64>,
    /// Times in a row that delete stopped (`Host::step`).
    stops: crate::host::StepStops,
    /// Hard links their inode's home refused, whose names are still to go
    /// (`Shard::undo_link`; the step stopped, or runs in this round).
    refused: Vec<u64>,
    /// Times in a row that undo stopped.
    undo_stops: crate::host::StepStops,
}

impl Outbox {
    /// Whether a request to a peer waits for its answer.
    pub fn awaiting_peer(&self) -> bool {
        self.streams.values().any(|s| s.sent.as_ref().is_some_and(|(id, _)| over_network(*id)))
    }

    /// Whether anything is left to send or hold.
    pub fn is_idle(&self) -> bool {
        self.entries.is_empty()
            && self.holds.is_empty()
            && self.finished.is_empty()
            && self.refused.is_empty()
    }

    /// Whether a record's delete or a refused link's undo stopped and runs
    /// again in a later round.
    pub(crate) fn has_stopped(&self) -> bool {
        !self.finished.is_empty() || !self.refused.is_empty()
    }
}

/// Whether a client waits for `op` before its reply (see the module comment).
pub fn holds_reply(op: &FollowOp) -> bool {
    !matches!(op, FollowOp::FreeData { .. } | FollowOp::Forget { .. })
}

impl Outbox {
    /// Holds the reply `buf` until follow-ups `ids` are done, from `now`.
    pub(crate) fn hold_reply(
        &mut self,
        now: Instant,
        ids: Vec<u64>,
        origin: u16,
        conn: ConnRef,
        buf: Vec<u8>,
    ) {
        let give_up = now + CLIENT_PATIENCE;
        self.holds.push(Hold { ids, origin, conn, buf, give_up, refused: false });
    }

    /// Whether a held reply waits for a follow-up not yet durable on `shard`
    /// (so the round commits now instead of at the commit interval).
    pub(crate) fn holds_wait_for_commit<D: Device>(&self, shard: &Shard<D>) -> bool {
        !self.holds.is_empty() && shard.has_pending_follow_ups()
    }

    /// Takes new durable follow-ups, polls answers, sends what is due; returns
    /// the work done.
    pub(crate) fn poll<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let mut work = 0;
        for up in h.shard().take_ready_follow_ups() {
            log::debug!(
                "worker {}: follow-up {:#x} {:?} to {:?}",
                h.worker_id(),
                up.id,
                up.op,
                up.target
            );
            self.entries.insert(up.id, Pending { up, left: None });
            work += 1;
        }
        work += self.delete_finished(h);
        work += self.undo_refused(h);
        if self.entries.is_empty() && self.holds.is_empty() {
            return work;
        }
        if let Some((servers, workers)) = h.shape() {
            let me = h.shard().id();
            let block = u64::from(h.shard().geometry().block_size);
            let mut empty = Vec::new();
            for (id, p) in self.entries.iter_mut().filter(|(_, p)| p.left.is_none()) {
                let targets = targets(&p.up, me, block, servers, workers);
                log::debug!("worker {}: follow-up {id:#x} goes to {targets:?}", h.worker_id());
                if targets.is_empty() {
                    empty.push(*id);
                }
                p.left = Some(targets);
            }
            for id in empty {
                work += 1;
                self.follow_finished(h, id);
            }
        }
        work += self.poll_streams(h);
        work += self.send_streams(h);
        work += self.expire_holds(h);
        work
    }

    fn poll_streams<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let mut work = 0;
        let busy: Vec<(Shard2, RequestId)> = self
            .streams
            .iter()
            .filter_map(|(t, s)| s.sent.as_ref().map(|(id, _)| (*t, *id)))
            .collect();
        for (target, req) in busy {
            let outcome = match h.poll(target.0, req) {
                Ok(None) => continue,
                Ok(Some(Ok(Reply::FollowUps { through, refused }))) => Ok((through, refused)),
                Ok(Some(Ok(other))) => Err(format!("answered {:?}", other.opcode())),
                Ok(Some(Err(e))) => Err(e.to_string()),
                Err(e) => {
                    h.forget_conn(target.0);
                    Err(e)
                }
            };
            work += 1;
            let stream = self.streams.get_mut(&target).expect("polled above");
            let (_, ids) = stream.sent.take().expect("in flight");
            match outcome {
                // Those past `through` are sent again (the target applied
                // those whose inodes were in memory, `apply_follow_ups`).
                Ok((through, refused)) => {
                    for id in ids.into_iter().filter(|&id| id <= through) {
                        let Some(p) = self.entries.get_mut(&id) else { continue };
                        if refused.contains(&id) && matches!(p.up.op, FollowOp::AddLink { .. }) {
                            self.refuse(h, id);
                            continue;
                        }
                        if let Some(left) = p.left.as_mut() {
                            left.retain(|t| *t != target);
                            if left.is_empty() {
                                self.follow_finished(h, id);
                            }
                        }
                    }
                }
                Err(e) => {
                    log::warn!(
                        "worker {}: follow-ups to server {} worker {}: {e}; sending again",
                        h.worker_id(),
                        target.0,
                        target.1
                    );
                    stream.retry_at = Some(h.now() + RETRY_AFTER);
                }
            }
        }
        work
    }

    fn send_streams<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        // The oldest follow-ups of each target with nothing in flight.
        let mut batches: BTreeMap<Shard2, Vec<(u64, FollowOp)>> = BTreeMap::new();
        for (id, p) in &self.entries {
            let Some(left) = &p.left else { continue };
            for t in left {
                let s = self.streams.get(t);
                if s.is_some_and(|s| s.sent.is_some() || s.retry_at.is_some_and(|r| r > h.now())) {
                    continue;
                }
                let b = batches.entry(*t).or_default();
                if b.len() < MAX_FOLLOW_UPS {
                    b.push((*id, p.up.op));
                }
            }
        }
        let mut work = 0;
        let from = h.shard().id();
        for (target, ops) in batches {
            let ids: Vec<u64> = ops.iter().map(|(id, _)| *id).collect();
            let stream = self.streams.entry(target).or_default();
            stream.retry_at = None;
            match h.send(target.0, target.1, Request::FollowUps { from, ops }) {
                Ok(req) => {
                    work += 1;
                    self.streams.get_mut(&target).expect("made above").sent = Some((req, ids));
                }
                Err(e) => {
                    if e.is_failure() {
                        log::warn!(
                            "worker {}: cannot reach server {} for follow-ups: {e}",
                            h.worker_id(),
                            target.0
                        );
                    }
                    self.streams.get_mut(&target).expect("made above").retry_at =
                        Some(e.retry_at(h.now()));
                }
            }
        }
        work
    }

    /// Deletes the records of finished follow-ups, up to the first delete
    /// that stops; returns how many went.
    fn delete_finished<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let mut work = 0;
        while let Some(&id) = self.finished.last() {
            match h.step(&mut self.stops, |s| s.follow_done(id)) {
                None => break,
                Some(done) => {
                    if let Err(e) = done {
                        log::error!(
                            "worker {}: cannot delete follow-up {id:#x}: {e}",
                            h.worker_id()
                        );
                    }
                    self.finished.pop();
                    h.changed();
                    work += 1;
                }
            }
        }
        work
    }

    /// Every target answered follow-up `id`: its record goes (now, or in a
    /// later round when the delete stops), and replies waiting only for it
    /// are sent.
    fn follow_finished<D: Device>(&mut self, h: &mut impl Host<D>, id: u64) {
        self.entries.remove(&id);
        self.finished.push(id);
        self.delete_finished(h);
        self.release_holds(h, id, false);
    }

    /// The home refused hard link follow-up `id`: its name goes (now, or in
    /// a later round when the step stops), then the held reply says `ENOENT`.
    fn refuse<D: Device>(&mut self, h: &mut impl Host<D>, id: u64) {
        self.entries.remove(&id);
        self.refused.push(id);
        self.undo_refused(h);
    }

    /// Takes away the names of refused links, up to the first undo that
    /// stops; returns how many went.
    fn undo_refused<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let mut work = 0;
        while let Some(&id) = self.refused.last() {
            let Some(done) = h.step(&mut self.undo_stops, |s| s.undo_link(id)) else { break };
            match done {
                Ok(named) => log::warn!(
                    "worker {}: hard link {id:#x} refused by its file's home (the file was \
                     removed first); {}",
                    h.worker_id(),
                    if named { "its name was removed" } else { "its name was gone already" }
                ),
                // The record stays: the follow-up is sent again after a restart.
                Err(e) => log::error!(
                    "worker {}: cannot remove the name of refused hard link {id:#x}: {e}",
                    h.worker_id()
                ),
            }
            self.refused.pop();
            h.changed();
            work += 1;
            self.release_holds(h, id, true);
        }
        work
    }

    /// Sends the held replies that waited only for follow-up `id`; `refused`:
    /// it was refused, and they become `ENOENT`.
    fn release_holds<D: Device>(&mut self, h: &mut impl Host<D>, id: u64, refused: bool) {
        let mut i = 0;
        while i < self.holds.len() {
            let hold = &mut self.holds[i];
            let before = hold.ids.len();
            hold.ids.retain(|x| *x != id);
            hold.refused |= refused && hold.ids.len() < before;
            if !hold.ids.is_empty() {
                i += 1;
                continue;
            }
            let hold = self.holds.swap_remove(i);
            let buf = match hold.refused {
                true => match error_reply(&hold.buf, FsError::NotFound) {
                    Some(buf) => buf,
                    None => continue,
                },
                false => hold.buf,
            };
            h.send_reply(hold.origin, hold.conn, buf);
        }
    }

    /// Held replies whose follow-ups take too long: the client is told the
    /// operation will complete (it is durable here; the follow-up is re-sent).
    fn expire_holds<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let mut work = 0;
        let mut i = 0;
        while i < self.holds.len() {
            if h.now() < self.holds[i].give_up {
                i += 1;
                continue;
            }
            let hold = self.holds.swap_remove(i);
            work += 1;
            let error = FsError::Io(
                "the operation is done here and waits for another server; \
                 it completes when that server answers"
                    .into(),
            );
            let Some(buf) = error_reply(&hold.buf, error) else { continue };
            h.send_reply(hold.origin, hold.conn, buf);
        }
        work
    }
}

/// The reply frame that answers the request of reply frame `buf` with `error`
/// instead (`None`: `buf` has no frame header, which cannot happen).
fn error_reply(buf: &[u8], error: FsError) -> Option<Vec<u8>> {
    let header = FrameHeader::decode(buf).ok()?;
    let op =
        pfs_core::wire::Opcode::from_u16(header.opcode).unwrap_or(pfs_core::wire::Opcode::StatFs);
    let frame = Frame {
        request_id: RequestId(header.request_id.0),
        client: pfs_core::ClientId(header.client.0),
        body: Body::Error { op, error },
    };
    Some(frame.to_bytes().expect("an error frame always encodes"))
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

#[cfg(test)]
mod tests {
    use pfs_core::wire::Opcode;
    use pfs_core::{ClientId, FileType, InodeId};
    use pfs_store::device::MemDevice;
    use pfs_store::shard::{CreateArgs, FormatOptions, ShardOptions};

    use super::*;
    use crate::msg::Waiter;
    use crate::peers::PeerError;

    /// The sending worker's view: its own shard `a` (server 0), and shard
    /// `b` (server 1) standing in for the other server, which answers a
    /// `FollowUps` request as the executor does.
    struct TwoShards {
        a: Shard<MemDevice>,
        b: Shard<MemDevice>,
        now: Instant,
        answers: Vec<(RequestId, Reply)>,
        replies: Vec<Vec<u8>>,
    }

    impl Host<MemDevice> for TwoShards {
        fn worker_id(&self) -> u16 {
            0
        }
        fn now(&self) -> Instant {
            self.now
        }
        fn shard(&mut self) -> &mut Shard<MemDevice> {
            &mut self.a
        }
        fn workers(&self) -> u32 {
            1
        }
        fn shape(&self) -> Option<(u32, u32)> {
            Some((2, 1))
        }
        fn send(
            &mut self,
            to: ServerId,
            _: WorkerId,
            req: Request,
        ) -> Result<RequestId, PeerError> {
            assert_eq!(to, ServerId(1));
            let Request::FollowUps { from, ops } = req else { panic!("sent {req:?}") };
            let applied = self.b.apply_follow_ups(from, &ops).expect("applied");
            self.b.commit().unwrap();
            let id = RequestId(self.answers.len() as u64 + 1);
            let reply = Reply::FollowUps { through: applied.through, refused: applied.refused };
            self.answers.push((id, reply));
            Ok(id)
        }
        fn poll(
            &mut self,
            _: ServerId,
            id: RequestId,
        ) -> Result<Option<Result<Reply, FsError>>, String> {
            let at = self.answers.iter().position(|(i, _)| *i == id).expect("sent");
            Ok(Some(Ok(self.answers.remove(at).1)))
        }
        fn forget_conn(&mut self, _: ServerId) {
            unreachable!("the connection never fails here")
        }
        fn connected(&self, _: &Waiter) -> bool {
            unreachable!("follow-ups answer no waiter")
        }
        fn answer(&mut self, _: Waiter, _: Body) {
            unreachable!("follow-ups answer no waiter")
        }
        fn changed(&mut self) {}
        fn send_reply(&mut self, _: u16, _: ConnRef, buf: Vec<u8>) {
            self.replies.push(buf);
        }
    }

    fn shard(id: u32) -> Shard<MemDevice> {
        let mut f = FormatOptions::new(ShardId(id), 64 << 20);
        f.create_root = id == 0;
        Shard::format(MemDevice::new(64 << 20, 64), &f, ShardOptions::default()).unwrap()
    }

    /// Links `f` (at `b`) as `d/name` on `a` the way the worker does: the
    /// reply held until the link's follow-up is done. `remove_first`: the
    /// file's last name goes at its home before the follow-up arrives.
    /// Returns what the client is told and the outbox afterwards.
    fn link_racing(remove_first: bool) -> (Frame, TwoShards, InodeId) {
        let mut h = TwoShards {
            a: shard(0),
            b: shard(1),
            now: Instant::now(),
            answers: Vec::new(),
            replies: Vec::new(),
        };
        let f = h.b.create(InodeId::ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let d = h.a.create(InodeId::ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
        let mark = h.a.txn_id_mark();
        h.a.link_name(f.ino, FileType::Regular, d.ino, b"link").unwrap();
        let held: Vec<u64> = h.a.follow_ups_since(mark).map(|u| u.id).collect();
        assert_eq!(held.len(), 1);
        let entry =
            pfs_core::wire::Entry { attr: h.b.getattr(f.ino).unwrap(), layout: Default::default() };
        let reply = Frame {
            request_id: RequestId(7),
            client: ClientId(3),
            body: Body::Reply(Reply::Link(entry)),
        };
        let conn = ConnRef { slot: 0, gen: 0, sum: pfs_core::wire::Sum::Full };
        let mut outbox = Outbox::default();
        outbox.hold_reply(h.now, held, 0, conn, reply.to_bytes().unwrap());
        if remove_first {
            h.b.unlink(InodeId::ROOT, b"f").unwrap();
        }
        h.a.commit().unwrap();
        for _ in 0..4 {
            outbox.poll(&mut h);
        }
        assert!(outbox.is_idle(), "{outbox:?}");
        assert_eq!(h.replies.len(), 1, "the held reply went out once");
        let told = Frame::decode(&h.replies[0]).unwrap();
        assert_eq!((told.request_id, told.client), (RequestId(7), ClientId(3)));
        assert!(h.a.follow_ups().is_empty(), "no record left");
        (told, h, d.ino)
    }

    /// A hard link whose file's last name was removed at its home before the
    /// link was counted there: the home refuses it, the name goes, and the
    /// client is told `ENOENT` (before, it was told the link was made and
    /// the name was left naming a removed file).
    #[test]
    fn a_link_refused_by_its_home_takes_its_name_away_and_answers_enoent() {
        let (told, mut h, d) = link_racing(true);
        assert_eq!(told.body, Body::Error { op: Opcode::Link, error: FsError::NotFound });
        assert_eq!(h.a.lookup(d, b"link"), Err(FsError::NotFound));
    }

    /// The same link with the file still there: counted, and answered as made.
    #[test]
    fn a_link_counted_by_its_home_is_answered_as_made() {
        let (told, mut h, d) = link_racing(false);
        assert!(matches!(told.body, Body::Reply(Reply::Link(_))), "{told:?}");
        let ino = h.a.lookup(d, b"link").unwrap().ino;
        assert_eq!(h.b.getattr(ino).unwrap().nlink, 2);
    }
}
