//! Running a request on this worker's shard: the frame decoded (a write's
//! payload straight from it), the operation run or stopped for what it waits
//! for, and its reply encoded and held for its commit or follow-ups.

use std::sync::atomic::Ordering;

use pfs_core::wire::{Body, Frame, FrameHeader, LockKind, Opcode, Reply, Request, TokenMode};
use pfs_core::{ClientId, FsError, FsResult, InodeId, RequestId};
use pfs_store::device::Device;
use pfs_store::shard::dataio::ReadStart;

use crate::exec::{execute, execute_write, is_mutation, Durability};
use crate::msg::{patience, ConnRef, Waiter};
use crate::stopped::Progress;

use super::{error_reply, PendingRead, Worker};

impl<D: Device> Worker<D> {
    /// Runs a request frame that came on `origin`'s connection `conn` on this
    /// worker's shard; returns the reply frame, or `None` when the reply waits for
    /// the next commit.
    pub(super) fn process_for(
        &mut self,
        origin: u16,
        conn: ConnRef,
        buf: Vec<u8>,
    ) -> Option<Vec<u8>> {
        // Behind a request of the same connection that waits for an inode
        // page: runs after it, so one connection's requests keep their order.
        if self.stopped.holds(origin, conn) {
            self.stopped.queue_behind(origin, conn, buf);
            return None;
        }
        let header = FrameHeader::decode(&buf).expect("checked by the receiver");
        if header.flags & pfs_core::wire::FLAG_REPLY == 0
            && [Opcode::Write as u16, Opcode::WriteData as u16].contains(&header.opcode)
        {
            return self.process_write(origin, conn, buf);
        }
        // The transport checked the frame's checksum when it received it.
        let frame = match Frame::decode_received(&buf) {
            Ok(f) => f,
            Err(e) => {
                // The header passed its checks; a body that does not decode is the
                // client's bug. Answer with the reason rather than guess.
                let header = FrameHeader::decode(&buf).expect("checked by the receiver");
                return Some(error_reply(header, FsError::Invalid(format!("bad request: {e}"))));
            }
        };
        let Body::Request(req) = frame.body else {
            let header = FrameHeader::decode(&buf).expect("checked by the receiver");
            return Some(error_reply(header, FsError::Invalid("a reply sent as a request".into())));
        };
        let op = req.opcode();
        let served =
            self.serve_token(&req, frame.client).or_else(|| self.serve_lock(&req, frame.client));
        if let Some(reply) = served {
            let body = match reply {
                Ok(reply) => Body::Reply(reply),
                Err(error) => Body::Error { op, error },
            };
            let reply = Frame { request_id: frame.request_id, client: frame.client, body };
            return Some(Self::encode_reply(reply, buf));
        }
        if req == Request::Durable {
            let body = Body::Reply(Reply::Durable);
            let reply = Frame { request_id: frame.request_id, client: frame.client, body };
            return self.serve_durable(origin, conn, Self::encode_reply(reply, buf));
        }
        // A name that is the source of a cross-shard rename under way is
        // locked until the rename ends (`Renames::names_moving`).
        if !self.cross.is_empty() && self.cross.names_moving(&req) {
            let reply = Frame {
                request_id: frame.request_id,
                client: frame.client,
                body: Body::Error { op, error: FsError::TryAgain },
            };
            return Some(reply.to_bytes().expect("an error frame always encodes"));
        }
        // The rmdir of a directory whose name was moved here by a rename while
        // its inode (and so its entries) stayed home: only a seal transaction
        // can check its emptiness there, so it runs as one (as a bigdir's).
        let req = match req {
            Request::Rmdir { parent, name } if self.names_remote_dir(parent, &name) => {
                Request::RmdirBigDir { parent, name }
            }
            other => other,
        };
        let waiter = Waiter {
            origin,
            conn,
            request_id: frame.request_id,
            client: frame.client,
            give_up: patience(self.now),
        };
        let req = match self.start_transaction(waiter, req) {
            Ok(Ok(())) => return None,
            Ok(Err(error)) => {
                let reply = Frame {
                    request_id: frame.request_id,
                    client: frame.client,
                    body: Body::Error { op, error },
                };
                return Some(reply.to_bytes().expect("an error frame always encodes"));
            }
            Err(req) => req,
        };
        if pfs_core::failpoint::fire("worker.panic") {
            panic!("failpoint worker.panic, before {op:?}");
        }
        // A read that must go to the device is answered when it is done; one
        // whose inode page is not in memory, or whose pages are being written,
        // stops and runs again once they are (`Shard::set_defer_misses`).
        let tries = self.stopped.tries();
        self.shard.set_defer_misses(self.stopped.may_stop(tries));
        let before = self.shard.background_progress();
        let started = self.start_read(req);
        self.shard.set_defer_misses(false);
        let req = match started {
            Ok(started) => {
                self.stopped.take_tries();
                if let Some(on) = self.shard.take_deferred() {
                    let issued = self.shard.data_issued();
                    self.stopped.stopped(origin, conn, buf, tries, on, before, issued);
                    return None;
                }
                let p = PendingRead {
                    origin,
                    conn,
                    request_id: frame.request_id,
                    client: frame.client,
                    op,
                    buf,
                };
                let result = match started {
                    Ok(ReadStart::Done(data)) => Ok(data),
                    Ok(ReadStart::Pending(id)) => {
                        self.reads.insert(id, p);
                        return None;
                    }
                    Ok(ReadStart::Gather(g)) if self.can_gather(origin, conn, g.len()) => {
                        self.send_gathered(p, g);
                        return None;
                    }
                    Ok(ReadStart::Gather(g)) => Ok(self.gathered_reply(g)),
                    Err(e) => Err(e),
                };
                return self.read_reply(p, result);
            }
            Err(req) => req,
        };
        let mutates = is_mutation(&req);
        let mark = self.shard.txn_id_mark();
        // A request does not wait for an inode page being read: it stops
        // before it changed anything and runs again once the page is in
        // memory. Metadata requests only (a data request's pieces are read
        // in the background anyway), and those whose reads all come before
        // their changes.
        let deferrable = crate::exec::deferrable(&req);
        let tries = self.stopped.take_tries();
        self.shard.set_defer_misses(deferrable && self.stopped.may_stop(tries));
        let before = self.shard.background_progress();
        let (result, durability) = execute(&mut self.shard, req);
        self.shard.set_defer_misses(false);
        if let Some(on) = self.shard.take_deferred() {
            let issued = self.shard.data_issued();
            self.stopped.stopped(origin, conn, buf, tries, on, before, issued);
            return None;
        }
        let reply = (frame.request_id, frame.client, op, result);
        self.finish_request(origin, conn, mutates, mark, reply, durability, buf)
    }

    /// Answers a dentry-token request (`TokenAcquire`, `TokenRelease`) from
    /// the worker's token table; `None` for any other request. An acquire
    /// revokes the tokens that conflict with it (`TokenInvalidate`). The
    /// rename lock is asked of the root's home, on the root (`TryAgain`
    /// while another client holds it).
    fn serve_token(&mut self, req: &Request, client: ClientId) -> Option<FsResult<Reply>> {
        match *req {
            Request::TokenAcquire { dir, mode: TokenMode::Rename }
            | Request::TokenRelease { dir, mode: TokenMode::Rename }
                if dir != InodeId::ROOT || !self.shard.has_inode(InodeId::ROOT) =>
            {
                Some(Err(FsError::Invalid(
                    "the rename lock is taken on the root, at its home".into(),
                )))
            }
            Request::TokenAcquire { mode: TokenMode::Rename, .. } => {
                Some(self.tokens.acquire_rename(client, self.now).map(Reply::TokenAcquire))
            }
            // A directory's names on this shard, held by a client about to
            // rename over it (`Shard::hold_dir`).
            Request::TokenAcquire { dir, mode: TokenMode::Hold } => {
                let lease_ms = (pfs_store::shard::txn::DIR_HOLD_NS / 1_000_000) as u32;
                let grant = pfs_core::wire::TokenGrant { mode: TokenMode::Hold, lease_ms };
                Some(
                    self.shard
                        .hold_dir(dir, u64::from(client.0))
                        .map(|()| Reply::TokenAcquire(grant)),
                )
            }
            Request::TokenRelease { dir, mode: TokenMode::Hold } => {
                self.shard.release_dir(dir, u64::from(client.0));
                Some(Ok(Reply::TokenRelease))
            }
            // The directory was removed (the holder's rename replaced it, or
            // a bigdir's rmdir finished): no new name in it here.
            Request::TokenRelease { dir, mode: TokenMode::Gone } => {
                self.shard.release_dir(dir, u64::from(client.0));
                self.shard.gone_dir(dir);
                Some(Ok(Reply::TokenRelease))
            }
            Request::TokenAcquire { mode: TokenMode::Gone, .. } => Some(Err(FsError::Invalid(
                "a removed directory is told by a release, not acquired".into(),
            ))),
            // The directory's layout changed (the holder set it): names the
            // new layout does not place here are refused for a while
            // (`Shard::relaid_dir`).
            Request::TokenRelease { dir, mode } if mode.relaid_layout().is_some() => {
                self.shard.release_dir(dir, u64::from(client.0));
                let layout = mode.relaid_layout().expect("matched above");
                match self.peers.shape() {
                    Some((servers, workers)) => {
                        self.shard.relaid_dir(dir, layout, servers, workers);
                        Some(Ok(Reply::TokenRelease))
                    }
                    // Cannot happen: the client reached this shard through a
                    // complete view. Refused, so the client does not count on it.
                    None => Some(Err(FsError::TryAgain)),
                }
            }
            Request::TokenAcquire { mode, .. } if mode.relaid_layout().is_some() => Some(Err(
                FsError::Invalid("a layout change is told by a release, not acquired".into()),
            )),
            Request::TokenAcquire { dir, mode } => {
                let (grant, revoked) = self.tokens.acquire(dir, client, mode, self.now);
                for holder in revoked {
                    self.notify(holder, Request::TokenInvalidate { dir });
                }
                Some(grant.map(Reply::TokenAcquire))
            }
            Request::TokenRelease { dir, mode } => {
                self.tokens.release(dir, client, mode);
                Some(Ok(Reply::TokenRelease))
            }
            _ => None,
        }
    }

    /// Answers a file lock request (`Lock`, `LockRenew`) from the worker's
    /// lock table ([`crate::locks`]); `None` for any other request. A lock
    /// on a file this shard does not hold is refused (`NotFound`), a
    /// release never.
    fn serve_lock(&mut self, req: &Request, client: ClientId) -> Option<FsResult<Reply>> {
        let (lease_ms, epoch) = (self.locks.lease_ms(), self.locks.epoch());
        match *req {
            Request::Lock { ino, owner, lock, test, reclaim } => {
                if lock.kind != LockKind::Unlock && !self.shard.has_inode(ino) {
                    return Some(Err(FsError::NotFound));
                }
                let r = self.locks.request(ino, client, owner, lock, test, reclaim, self.now);
                self.usage.locks_held.store(self.locks.len() as u64, Ordering::Relaxed);
                Some(r.map(|conflict| Reply::Lock { conflict, lease_ms, epoch }))
            }
            Request::LockRenew => {
                let held = self.locks.renew(client, self.now);
                self.usage.locks_held.store(self.locks.len() as u64, Ordering::Relaxed);
                Some(Ok(Reply::LockRenew { held, lease_ms, epoch }))
            }
            _ => None,
        }
    }

    /// Starts a multi-shard transaction this worker coordinates: a bigdir
    /// rmdir (`rmdir.rs`) or a cross-shard rename (`cross.rs`), answered
    /// through `waiter` when it ends (`Ok(Ok(()))`) or refused at once
    /// (`Ok(Err(_))`). Any other request is given back.
    fn start_transaction(
        &mut self,
        waiter: Waiter,
        req: Request,
    ) -> Result<Result<(), FsError>, Request> {
        match req {
            Request::RmdirBigDir { parent, name } => {
                let mut rmdirs = std::mem::take(&mut self.rmdirs);
                let started = rmdirs.start(self, waiter, parent, name);
                self.rmdirs = rmdirs;
                Ok(started)
            }
            Request::RenameCross {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                target_server,
                target_worker,
            } => {
                let target = (target_server, target_worker);
                let mut cross = std::mem::take(&mut self.cross);
                let started =
                    cross.start(self, waiter, parent, name, new_parent, new_name, flags, target);
                self.cross = cross;
                Ok(started)
            }
            other => Err(other),
        }
    }

    /// A `Write` or `WriteData` frame: the data is written to the device
    /// buffer straight from the frame (`Frame::decode_write`), and the reply
    /// reuses the frame's buffer.
    pub(super) fn process_write(
        &mut self,
        origin: u16,
        conn: ConnRef,
        buf: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let mark = self.shard.txn_id_mark();
        // As a metadata request: a write whose inode page, or the old bytes of
        // the block it merges into, are not in memory stops before it changed
        // anything and runs again once they are.
        let tries = self.stopped.take_tries();
        let (request_id, client, op, result) = match Frame::decode_write(&buf) {
            Some(Ok((request_id, client, w))) => {
                if pfs_core::failpoint::fire("worker.panic") {
                    panic!("failpoint worker.panic, before {:?}", w.opcode());
                }
                self.shard.set_defer_misses(self.stopped.may_stop(tries));
                let before = self.shard.background_progress();
                let result = execute_write(&mut self.shard, &w);
                self.shard.set_defer_misses(false);
                if let Some(on) = self.shard.take_deferred() {
                    let issued = self.shard.data_issued();
                    self.stopped.stopped(origin, conn, buf, tries, on, before, issued);
                    return None;
                }
                (request_id, client, w.opcode(), result)
            }
            Some(Err(e)) => {
                let header = FrameHeader::decode(&buf).expect("checked by the receiver");
                return Some(error_reply(header, FsError::Invalid(format!("bad request: {e}"))));
            }
            None => unreachable!("the caller sends write frames only"),
        };
        let reply = (request_id, client, op, result);
        self.finish_request(origin, conn, true, mark, reply, Durability::Now, buf)
    }

    /// After a request ran: schedules the commit of a change, encodes the
    /// reply into `buf`, and holds it for the follow-ups it waits for or for
    /// the commit (`None`), or returns it to send now.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn finish_request(
        &mut self,
        origin: u16,
        conn: ConnRef,
        mutates: bool,
        mark: u64,
        (request_id, client, op, result): (RequestId, ClientId, Opcode, FsResult<Reply>),
        durability: Durability,
        buf: Vec<u8>,
    ) -> Option<Vec<u8>> {
        // Follow-ups whose effect the client sees at once hold its reply.
        let held: Vec<u64> = self
            .shard
            .follow_ups_since(mark)
            .filter(|u| crate::follow::holds_reply(&u.op))
            .map(|u| u.id)
            .collect();
        if mutates && result.is_ok() && self.dirty_since.is_none() {
            self.dirty_since = Some(self.now);
        }
        let body = match result {
            Ok(reply) => Body::Reply(reply),
            Err(error) => Body::Error { op, error },
        };
        let reply = Frame { request_id, client, body };
        let buf = Self::encode_reply(reply, buf);
        if !held.is_empty() {
            self.outbox.hold_reply(self.now, held, origin, conn, buf);
            return None;
        }
        if durability == Durability::AfterCommit {
            self.reply_after_commit(origin, conn, buf);
            return None;
        }
        Some(buf)
    }

    /// The background requests finished so far.
    pub(super) fn progress(&mut self) -> Progress {
        let reads = self.shard.icache_reads_done();
        self.shard.data_requests_done();
        (reads, self.shard.data_settled(), self.shard.commits_done(), self.shard.log_moves())
    }

    /// Runs again the requests that stopped, once what each waits for moved
    /// (in arrival order: one that still waits keeps the later ones of its
    /// connection behind it); returns how many ran.
    pub(super) fn run_stopped(&mut self) -> usize {
        let now = self.progress();
        let Some(waiting) = self.stopped.take_all(now) else { return 0 };
        let mut ran = 0;
        for w in waiting {
            if !w.ready(now) {
                self.stopped.put_back(w);
                continue;
            }
            ran += 1;
            self.stopped.running(&w);
            let reply = self.process_for(w.origin, w.conn, w.buf);
            self.stopped.take_tries();
            if let Some(reply) = reply {
                self.route_reply(w.origin, w.conn, reply);
            }
        }
        ran
    }

    /// Encodes `reply` into `buf` (reused). A reply too large for the
    /// protocol becomes an error reply.
    pub(super) fn encode_reply(reply: Frame, mut buf: Vec<u8>) -> Vec<u8> {
        let (request_id, client, op) = (reply.request_id, reply.client, reply.opcode());
        buf.clear();
        if let Err(e) = reply.encode(&mut buf) {
            let error = FsError::Io(format!("reply does not fit the protocol: {e}"));
            let fallback = Frame { request_id, client, body: Body::Error { op, error } };
            buf.clear();
            fallback.encode(&mut buf).expect("an error frame always encodes");
        }
        buf
    }

    /// Whether `parent/name` is a directory whose inode lives on another shard.
    pub(super) fn names_remote_dir(&mut self, parent: pfs_core::InodeId, name: &[u8]) -> bool {
        match self.shard.lookup(parent, name) {
            Ok(e) => e.kind == pfs_core::FileType::Directory && !self.shard.has_inode(e.ino),
            Err(_) => false,
        }
    }
}
