//! File locks at their files' homes (`Request::Lock`, pfs-server's
//! `locks.rs`), the renewal of the lease that keeps them, and their reclaim
//! from a server that restarted.
//!
//! A client's locks on a shard last the server's `lock_lease_ms` past its
//! last lock request or renewal; the notification thread renews every shard
//! where this client holds one each third of that. Every reply carries the
//! shard's lock epoch, new at each start of its server: when it changes, the
//! server lost the locks it kept, and the client takes its own there again
//! (`reclaim`), during the grace period the restarted server keeps for that
//! (one lease, in which it grants no other lock). So the client keeps a copy
//! of the locks it holds ([`LockTable`], at most [`CLIENT_LOCKS_MAX`]
//! ranges).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pfs_core::locks::LockTable;
use pfs_core::wire::{FileLock, LockKind, Reply, Request};
use pfs_core::{FsError, FsResult, InodeId, ServerId, WorkerId};

use super::placement::Placement;
use super::Cluster;
use crate::conn::Conn;

/// Ranges one client keeps a copy of, at most; a lock past it fails with
/// `ENOLCK` before it is asked for.
pub const CLIENT_LOCKS_MAX: usize = 1 << 16;

/// A shard where this client holds locks.
#[derive(Clone, Copy, Debug)]
struct Home {
    lease: Duration,
    renewed: Instant,
    /// The shard's lock epoch as last seen.
    epoch: u64,
    /// A reply showed a new epoch: the locks held there are to be taken again.
    reclaim: bool,
    /// The last renewal failed (logged once until one succeeds).
    failing: bool,
}

#[derive(Debug, Default)]
struct Held {
    homes: HashMap<(ServerId, WorkerId), Home>,
    /// The locks this client holds, by owner.
    table: LockTable<u64>,
}

/// The shards where this client holds locks (at most one entry per shard),
/// and a copy of those locks.
#[derive(Debug, Default)]
pub(crate) struct LockHomes {
    held: Mutex<Held>,
}

impl LockHomes {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().expect("lock homes lock")
    }

    /// A reply from `home` at `asked` with this lease and epoch; `done`, a
    /// lock taken or given back.
    fn answered(
        &self,
        home: (ServerId, WorkerId),
        lease_ms: u32,
        epoch: u64,
        asked: Instant,
        done: Option<(InodeId, u64, FileLock)>,
    ) {
        let lease = Duration::from_millis(u64::from(lease_ms));
        let mut h = self.held();
        if let Some((ino, owner, lock)) = done {
            h.table.apply(ino, owner, lock);
        }
        match h.homes.get_mut(&home) {
            // The server restarted since: what this client held there is
            // taken again at the next renewal.
            Some(known) if known.epoch != epoch => known.reclaim = true,
            Some(_) => {}
            None if done.is_some_and(|(_, _, l)| l.kind != LockKind::Unlock) => {
                let fresh = Home { lease, renewed: asked, epoch, reclaim: false, failing: false };
                h.homes.insert(home, fresh);
            }
            None => {}
        }
    }

    /// Whether this client may hold locks anywhere.
    pub(crate) fn any(&self) -> bool {
        !self.held().homes.is_empty()
    }

    /// Renews the lease on each shard whose renewal is due at `now` (a
    /// third of the lease after the last), and takes this client's locks
    /// again on a shard whose epoch changed (its server restarted); a shard
    /// where this client holds nothing is forgotten. Called by the
    /// notification thread.
    pub(crate) fn renew_due(
        &self,
        conns: &[Conn],
        placement: &Placement,
        now: Instant,
        timeout: Duration,
    ) {
        let due: Vec<((ServerId, WorkerId), Home)> = self
            .held()
            .homes
            .iter()
            .filter(|(_, h)| h.reclaim || now >= h.renewed + h.lease / 3)
            .map(|(&k, &h)| (k, h))
            .collect();
        for ((server, worker), home) in due {
            // Never longer than a sixth of the lease: a server down must not
            // hold the other renewals (and the invalidations) back.
            let wait = timeout.min(home.lease / 6);
            let conn = &conns[server.0 as usize];
            let asked = Instant::now();
            let r = conn.call(Request::LockRenew, worker.0 as u16, wait);
            let (held, lease_ms, epoch) = match r {
                Ok(Reply::LockRenew { held, lease_ms, epoch }) => (held, lease_ms, epoch),
                other => {
                    if !home.failing {
                        log::warn!(
                            "cannot renew this client's file locks on server {server} worker \
                             {worker} ({other:?}): the server releases them {:?} after the \
                             last renewal unless one gets through",
                            home.lease
                        );
                    }
                    if let Some(h) = self.held().homes.get_mut(&(server, worker)) {
                        h.failing = true;
                    }
                    continue;
                }
            };
            if home.failing {
                log::info!("file locks on server {server} worker {worker} renewed again");
            }
            let lease = Duration::from_millis(u64::from(lease_ms));
            let ours: Vec<(InodeId, u64, FileLock)> = self
                .held()
                .table
                .iter()
                .filter(|(ino, _, _)| placement.home(*ino) == (server, worker))
                .collect();
            if epoch != home.epoch || home.reclaim {
                self.reclaim(conn, (server, worker), &ours, wait);
            } else if home.failing && (held as usize) < ours.len() {
                // The same server, but this client could not renew for
                // longer than the lease: it dropped them (and others may
                // have taken them since). The programs are not told.
                log::error!(
                    "this client's file locks on server {server} worker {worker} lapsed while \
                     it could not reach the server ({held} of {} ranges left)",
                    ours.len()
                );
            }
            let mut h = self.held();
            if ours.is_empty() {
                h.homes.remove(&(server, worker));
            } else {
                let renewed = Home { lease, renewed: asked, epoch, reclaim: false, failing: false };
                h.homes.insert((server, worker), renewed);
            }
        }
    }

    /// Takes `ours`, the locks this client held on `home`, again from its
    /// restarted server; one another client took meanwhile (the grace
    /// period ended first) is lost, and logged.
    fn reclaim(
        &self,
        conn: &Conn,
        home: (ServerId, WorkerId),
        ours: &[(InodeId, u64, FileLock)],
        wait: Duration,
    ) {
        if !ours.is_empty() {
            log::warn!(
                "server {} worker {} restarted and lost its file locks: taking this client's {} \
                 locked range(s) there again",
                home.0,
                home.1,
                ours.len()
            );
        }
        for &(ino, owner, lock) in ours {
            let req = Request::Lock { ino, owner, lock, test: false, reclaim: true };
            match conn.call(req, home.1 .0 as u16, wait) {
                Ok(Reply::Lock { conflict: None, .. }) => {}
                other => {
                    log::error!(
                        "the lock of owner {owner:#x} on {ino} ({:?} {}..={}) was lost when its \
                         server restarted: {other:?}",
                        lock.kind,
                        lock.start,
                        lock.end
                    );
                    let gone = FileLock { kind: LockKind::Unlock, ..lock };
                    self.held().table.apply(ino, owner, gone);
                }
            }
        }
    }
}

impl Cluster {
    /// Takes, gives back, or (`test`) looks for a conflict with `lock` of
    /// `owner` on `ino`, at the file's home; see [`crate::FileSystem::lock`].
    pub(crate) fn lock_at_home(
        &self,
        ino: InodeId,
        owner: u64,
        lock: FileLock,
        test: bool,
    ) -> FsResult<Option<FileLock>> {
        if !test
            && lock.kind != LockKind::Unlock
            && self.locks.held().table.len() + 2 > CLIENT_LOCKS_MAX
        {
            log::warn!("file locks: this client holds {CLIENT_LOCKS_MAX} ranges; ENOLCK");
            return Err(FsError::NoLocks);
        }
        let home = self.placement.home(ino);
        let asked = Instant::now();
        let req = Request::Lock { ino, owner, lock, test, reclaim: false };
        let (conflict, lease_ms, epoch) = expect_reply!(
            self.call_to(home.0, home.1, req)?,
            Reply::Lock { conflict, lease_ms, epoch } => (conflict, lease_ms, epoch)
        )?;
        let done = (!test && conflict.is_none()).then_some((ino, owner, lock));
        self.locks.answered(home, lease_ms, epoch, asked, done);
        Ok(conflict)
    }
}
