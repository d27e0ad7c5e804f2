//! File locks at their files' homes (`Request::Lock`, pfs-server's
//! `locks.rs`), and the renewal of the lease that keeps them: a client's
//! locks on a shard last the server's `lock_lease_ms` past its last lock
//! request or renewal, and the notification thread renews every shard
//! where this client holds one each third of that.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pfs_core::wire::{FileLock, LockKind, Reply, Request};
use pfs_core::{FsResult, InodeId, ServerId, WorkerId};

use super::Cluster;
use crate::conn::Conn;

/// A shard where this client holds locks.
#[derive(Clone, Copy, Debug)]
struct Home {
    lease: Duration,
    renewed: Instant,
    /// The last renewal failed (logged once until one succeeds).
    failing: bool,
}

/// The shards where this client holds locks (at most one entry per shard).
#[derive(Debug, Default)]
pub(crate) struct LockHomes {
    homes: Mutex<HashMap<(ServerId, WorkerId), Home>>,
}

impl LockHomes {
    /// A lock request to `home` was answered at `asked` with this lease:
    /// the client may hold locks there now.
    fn took(&self, home: (ServerId, WorkerId), lease_ms: u32, asked: Instant) {
        let lease = Duration::from_millis(u64::from(lease_ms));
        let h = Home { lease, renewed: asked, failing: false };
        self.homes.lock().expect("lock homes lock").insert(home, h);
    }

    /// Whether this client may hold locks anywhere.
    pub(crate) fn any(&self) -> bool {
        !self.homes.lock().expect("lock homes lock").is_empty()
    }

    /// Renews the lease on each shard whose renewal is due at `now` (a
    /// third of the lease after the last); a shard that says this client
    /// holds nothing there is forgotten. Called by the notification thread.
    pub(crate) fn renew_due(&self, conns: &[Conn], now: Instant, timeout: Duration) {
        let due: Vec<((ServerId, WorkerId), Home)> = {
            let homes = self.homes.lock().expect("lock homes lock");
            homes
                .iter()
                .filter(|(_, h)| now >= h.renewed + h.lease / 3)
                .map(|(&k, &h)| (k, h))
                .collect()
        };
        for ((server, worker), home) in due {
            // Never longer than a sixth of the lease: a server down must not
            // hold the other renewals (and the invalidations) back.
            let wait = timeout.min(home.lease / 6);
            let asked = Instant::now();
            let r = conns[server.0 as usize].call(Request::LockRenew, worker.0 as u16, wait);
            let mut homes = self.homes.lock().expect("lock homes lock");
            match r {
                Ok(Reply::LockRenew { held: 0, .. }) => {
                    homes.remove(&(server, worker));
                }
                Ok(Reply::LockRenew { lease_ms, .. }) => {
                    if home.failing {
                        log::info!("file locks on server {server} worker {worker} renewed again");
                    }
                    let lease = Duration::from_millis(u64::from(lease_ms));
                    homes.insert((server, worker), Home { lease, renewed: asked, failing: false });
                }
                other => {
                    if !home.failing {
                        log::warn!(
                            "cannot renew this client's file locks on server {server} worker \
                             {worker} ({other:?}): the server releases them {:?} after the \
                             last renewal unless one gets through",
                            home.lease
                        );
                    }
                    if let Some(h) = homes.get_mut(&(server, worker)) {
                        h.failing = true;
                    }
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
        let (server, worker) = self.placement.home(ino);
        let asked = Instant::now();
        let req = Request::Lock { ino, owner, lock, test };
        let (conflict, lease_ms) = expect_reply!(
            self.call_to(server, worker, req)?,
            Reply::Lock { conflict, lease_ms } => (conflict, lease_ms)
        )?;
        if !test && conflict.is_none() && lock.kind != LockKind::Unlock {
            self.locks.took((server, worker), lease_ms, asked);
        }
        Ok(conflict)
    }
}
