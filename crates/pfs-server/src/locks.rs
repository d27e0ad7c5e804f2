//! File locks, kept by the worker that owns the file's inode: `fcntl(2)`
//! record locks and `flock(2)` locks that every node of the cluster sees.
//!
//! A lock belongs to an owner on a client: the kernel's lock owner (a
//! process's file table for record locks, the open file for `flock`), so
//! two processes of one node conflict as two nodes do. The rules are
//! POSIX's, kept by [`pfs_core::locks::LockTable`] (which each client also
//! keeps a copy of its own locks in).
//!
//! Nothing here waits: a lock that conflicts is not taken, and the reply
//! names the conflict; a client whose program waits (`F_SETLKW`,
//! `LOCK_EX` without `LOCK_NB`) asks again.
//!
//! Locks live in memory. A client's locks on this worker last a lease
//! from its last lock request or renewal ([`crate::locks::Locks::renew`]):
//! a client that died, or cannot reach this server, loses them when the
//! lease runs out, so a dead node never blocks the others for longer. A
//! restart of the server loses the table: clients see the new epoch and
//! take their locks again, in a grace period of one lease in which no
//! other lock is granted ([`Locks::after_restart`], docs/posix.md).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pfs_core::locks::LockTable;
use pfs_core::wire::{FileLock, LockKind};
use pfs_core::{ClientId, FsError, FsResult, InodeId};

/// Locked ranges one worker keeps at most, over all files and clients; a
/// lock past it is refused with `ENOLCK`.
pub const LOCKS_MAX: usize = 1 << 16;

/// The locks of the files one worker owns.
#[derive(Debug)]
pub struct Locks {
    table: LockTable<(ClientId, u64)>,
    /// End of the lease of each client that holds a lock here.
    leases: HashMap<ClientId, Instant>,
    /// Ranges each client holds.
    held_by: HashMap<ClientId, usize>,
    /// The earliest lease end in `leases` (a bound: expiry looks then).
    next_expiry: Option<Instant>,
    lease: Duration,
    /// This table's identity, new at every start of the server: a client
    /// that sees it change knows its locks here were lost, and takes them
    /// again (`reclaim`).
    epoch: u64,
    /// After a restart, until this: only locks clients held before it are
    /// taken (reclaims); every other lock is answered with a conflict.
    grace_until: Option<Instant>,
}

impl Locks {
    /// A table whose holders keep their locks `lease` past their last
    /// request, of identity `epoch`.
    pub fn new(lease: Duration, epoch: u64) -> Locks {
        Locks {
            table: LockTable::default(),
            leases: HashMap::new(),
            held_by: HashMap::new(),
            next_expiry: None,
            lease,
            epoch,
            grace_until: None,
        }
    }

    /// A table for a server that restarted at `now` (its zones held files
    /// before): clients may hold locks its previous run granted, so for one
    /// lease (every live client renews within a third of it, sees the new
    /// epoch and takes its locks again) no other lock is granted, as NFS and
    /// Lustre servers keep a grace period for reclaims after a restart.
    pub fn after_restart(lease: Duration, epoch: u64, now: Instant) -> Locks {
        Locks { grace_until: Some(now + lease), ..Locks::new(lease, epoch) }
    }

    /// The lease, as the replies carry it.
    pub fn lease_ms(&self) -> u32 {
        self.lease.as_millis().min(u128::from(u32::MAX)) as u32
    }

    /// This table's identity ([`Locks::new`]).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Ranges held now.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no lock is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    fn in_grace(&mut self, now: Instant) -> bool {
        match self.grace_until {
            Some(end) if now < end => true,
            Some(_) => {
                self.grace_until = None;
                log::info!("file locks: the grace period after the restart ended");
                false
            }
            None => false,
        }
    }

    /// Runs a lock request of `owner` on `client` for file `ino` at `now`:
    /// with `test`, returns the first lock of another owner that conflicts
    /// with `lock` (`None`: it could be taken); otherwise takes `lock` (or
    /// gives back the range, for `Unlock`) unless such a conflict exists,
    /// which is returned instead. A conflict held by another client has pid
    /// 0. A `reclaim` takes again a lock the client held before the server
    /// restarted; in the grace period after a restart only those are taken,
    /// and every other lock or test is answered with a conflict (the range
    /// asked, pid 0). `ENOLCK` past [`LOCKS_MAX`] ranges.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        &mut self,
        ino: InodeId,
        client: ClientId,
        owner: u64,
        lock: FileLock,
        test: bool,
        reclaim: bool,
        now: Instant,
    ) -> FsResult<Option<FileLock>> {
        if lock.start > lock.end {
            return Err(FsError::Invalid(format!(
                "lock range {}..={} ends before it starts",
                lock.start, lock.end
            )));
        }
        if test && (lock.kind == LockKind::Unlock || reclaim) {
            return Err(FsError::Invalid(
                "a lock test asks for a shared or exclusive lock, and reclaims nothing".into(),
            ));
        }
        self.expire(now);
        if lock.kind != LockKind::Unlock && !reclaim && self.in_grace(now) {
            // A lock of the previous run may not have been taken again yet.
            let kind = LockKind::Write;
            return Ok(Some(FileLock { kind, pid: 0, ..lock }));
        }
        if lock.kind != LockKind::Unlock {
            if let Some(((c, _), h)) = self.table.conflict(ino, (client, owner), &lock) {
                let pid = if c == client { h.pid } else { 0 };
                return Ok(Some(FileLock { pid, ..h }));
            }
            if test {
                return Ok(None);
            }
            // A new range may split one of the owner's in two.
            if self.table.len() + 2 > LOCKS_MAX {
                log::warn!(
                    "file locks: {} ranges held on this worker, the most it keeps; \
                     refusing a lock on {ino} (ENOLCK)",
                    self.table.len()
                );
                return Err(FsError::NoLocks);
            }
        }
        let (before, after) = self.table.apply(ino, (client, owner), lock);
        if before != after {
            let n = self.held_by.entry(client).or_default();
            *n = *n + after - before;
            if *n == 0 {
                self.held_by.remove(&client);
            }
        }
        if self.leases.contains_key(&client) || lock.kind != LockKind::Unlock {
            self.renew(client, now);
        }
        Ok(None)
    }

    /// Extends `client`'s lease from `now`; returns the ranges it holds here.
    pub fn renew(&mut self, client: ClientId, now: Instant) -> u32 {
        self.expire(now);
        let held = self.held_by.get(&client).copied().unwrap_or(0);
        if held == 0 {
            self.leases.remove(&client);
        } else {
            let end = now + self.lease;
            self.leases.insert(client, end);
            self.next_expiry = Some(self.next_expiry.map_or(end, |e| e.min(end)));
        }
        held as u32
    }

    /// Drops the locks of every client whose lease ended by `now`.
    pub fn expire(&mut self, now: Instant) {
        if self.next_expiry.is_none_or(|e| now < e) {
            return;
        }
        let gone: Vec<ClientId> =
            self.leases.iter().filter(|(_, &end)| end <= now).map(|(&c, _)| c).collect();
        for c in &gone {
            self.leases.remove(c);
            self.held_by.remove(c);
        }
        self.next_expiry = self.leases.values().min().copied();
        if gone.is_empty() {
            return;
        }
        let dropped = self.table.drop_owners(|(c, _)| gone.contains(c));
        log::warn!(
            "file locks: the lease of client(s) {gone:?} ran out (no renewal for {:?}): \
             their {dropped} locked range(s) are released",
            self.lease
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ClientId = ClientId(1);
    const B: ClientId = ClientId(2);
    const F: InodeId = InodeId(77);

    fn lk(kind: LockKind, start: u64, end: u64) -> FileLock {
        FileLock { kind, flock: false, start, end, pid: 42 }
    }

    fn take(l: &mut Locks, c: ClientId, owner: u64, lock: FileLock) -> Option<FileLock> {
        l.request(F, c, owner, lock, false, false, Instant::now()).unwrap()
    }

    #[test]
    fn shared_locks_share_and_exclusive_ones_conflict_across_clients_and_owners() {
        let mut l = Locks::new(Duration::from_secs(30), 1);
        assert_eq!(take(&mut l, A, 1, lk(LockKind::Read, 0, 99)), None);
        assert_eq!(take(&mut l, B, 1, lk(LockKind::Read, 50, 149)), None, "shared");
        let c = take(&mut l, B, 1, lk(LockKind::Write, 0, 9)).expect("A's read lock");
        assert_eq!((c.kind, c.start, c.end, c.pid), (LockKind::Read, 0, 99, 0), "another client");
        // Another owner of the same client conflicts too, and is named by pid.
        let c = take(&mut l, A, 2, lk(LockKind::Write, 140, 140)).expect("B's read lock");
        assert_eq!((c.start, c.pid), (50, 0));
        let c = take(&mut l, A, 2, lk(LockKind::Write, 10, 10)).expect("A owner 1's read lock");
        assert_eq!(c.pid, 42, "a process of the asker's own client");
        assert_eq!(take(&mut l, A, 2, lk(LockKind::Write, 150, 200)), None);
        let t = l.request(F, B, 1, lk(LockKind::Write, 300, 400), true, false, Instant::now());
        assert_eq!(t.unwrap(), None, "a test takes nothing");
        assert_eq!(l.len(), 3);
        // Unlocking everything of one owner leaves the others'.
        take(&mut l, A, 1, lk(LockKind::Unlock, 0, pfs_core::wire::LOCK_END_MAX));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn in_the_grace_after_a_restart_only_reclaims_are_taken() {
        let lease = Duration::from_secs(30);
        let t0 = Instant::now();
        let mut l = Locks::after_restart(lease, 9, t0);
        assert_eq!(l.epoch(), 9);
        // A's lock of before the restart, taken again; B's new lock and
        // test are answered with a conflict meanwhile, a release is not.
        let r = l.request(F, A, 1, lk(LockKind::Write, 0, 9), false, true, t0).unwrap();
        assert_eq!(r, None, "a reclaim");
        let c = l.request(F, B, 1, lk(LockKind::Read, 100, 109), false, false, t0).unwrap();
        assert_eq!(c.map(|c| (c.start, c.end, c.pid)), Some((100, 109, 0)), "not yet");
        let c = l.request(F, B, 1, lk(LockKind::Read, 100, 109), true, false, t0).unwrap();
        assert!(c.is_some(), "a test neither");
        let r = l.request(F, B, 1, lk(LockKind::Unlock, 0, 9), false, false, t0).unwrap();
        assert_eq!(r, None);
        // After the grace (one lease): as ever, and A's reclaimed lock,
        // renewed meanwhile, holds.
        assert_eq!(l.renew(A, t0 + lease / 2), 1);
        let later = t0 + lease;
        let c = l.request(F, B, 1, lk(LockKind::Write, 5, 5), false, false, later).unwrap();
        assert_eq!(c.map(|c| (c.start, c.end)), Some((0, 9)), "A's reclaimed lock");
        let r = l.request(F, B, 1, lk(LockKind::Write, 100, 109), false, false, later).unwrap();
        assert_eq!(r, None);
        // A fresh server has no grace.
        let mut f = Locks::new(lease, 10);
        assert_eq!(f.request(F, B, 1, lk(LockKind::Write, 0, 0), false, false, t0).unwrap(), None);
    }

    #[test]
    fn flock_locks_never_meet_record_locks() {
        let mut l = Locks::new(Duration::from_secs(30), 1);
        let whole = |kind| FileLock { flock: true, ..lk(kind, 0, pfs_core::wire::LOCK_END_MAX) };
        assert_eq!(take(&mut l, A, 7, whole(LockKind::Write)), None);
        assert_eq!(take(&mut l, B, 1, lk(LockKind::Write, 0, 10)), None, "a record lock");
        assert!(take(&mut l, B, 8, whole(LockKind::Read)).is_some(), "another flock");
        // The flock holder converts its own lock.
        assert_eq!(take(&mut l, A, 7, whole(LockKind::Read)), None);
        assert_eq!(take(&mut l, B, 8, whole(LockKind::Read)), None, "both shared");
    }

    #[test]
    fn a_client_that_stops_renewing_loses_its_locks_at_the_end_of_its_lease() {
        let lease = Duration::from_secs(30);
        let mut l = Locks::new(lease, 1);
        let t0 = Instant::now();
        l.request(F, A, 1, lk(LockKind::Write, 0, 9), false, false, t0).unwrap();
        l.request(F, B, 1, lk(LockKind::Write, 10, 19), false, false, t0).unwrap();
        // B renews, A does not.
        assert_eq!(l.renew(B, t0 + lease / 2), 1);
        let later = t0 + lease + Duration::from_millis(1);
        let c = l.request(F, B, 1, lk(LockKind::Write, 0, 9), false, false, later).unwrap();
        assert_eq!(c, None, "A's lock went with its lease");
        assert_eq!(l.renew(A, later), 0, "a renewal after the lease ran out holds nothing");
        let c = l.request(F, A, 1, lk(LockKind::Write, 0, 0), false, false, later).unwrap();
        assert!(c.is_some(), "B holds it now");
    }

    #[test]
    fn bounded_by_the_table_not_by_what_clients_ask() {
        let mut l = Locks::new(Duration::from_secs(30), 1);
        // A range on each of many files (one file's ranges are searched
        // whole at each request, so the test spreads them).
        let mut refused = None;
        for i in 0..(LOCKS_MAX as u64 + 10) {
            let lock = lk(LockKind::Write, 0, 0);
            match l.request(InodeId(i + 1), A, 1, lock, false, false, Instant::now()) {
                Ok(None) => {}
                other => {
                    refused = Some((i, other));
                    break;
                }
            }
        }
        let (i, r) = refused.expect("refused before the bound was passed");
        assert_eq!(r, Err(FsError::NoLocks));
        assert!(i as usize >= LOCKS_MAX - 2 && l.len() <= LOCKS_MAX, "{i} {}", l.len());
        // A release is never refused, and frees room.
        let all = lk(LockKind::Unlock, 0, pfs_core::wire::LOCK_END_MAX);
        assert_eq!(l.request(InodeId(1), A, 1, all, false, false, Instant::now()), Ok(None));
        assert_eq!(l.len(), i as usize - 1);
        let bad = lk(LockKind::Write, 5, 4);
        assert!(matches!(
            l.request(F, A, 1, bad, false, false, Instant::now()),
            Err(FsError::Invalid(_))
        ));
    }
}
