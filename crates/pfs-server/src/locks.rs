//! File locks, kept by the worker that owns the file's inode: `fcntl(2)`
//! record locks and `flock(2)` locks that every node of the cluster sees.
//!
//! A lock belongs to an owner on a client: the kernel's lock owner (a
//! process's file table for record locks, the open file for `flock`), so
//! two processes of one node conflict as two nodes do. The rules are
//! POSIX's: a shared lock conflicts with another owner's exclusive lock on
//! an overlapping range, an exclusive lock with any; an owner's new lock
//! replaces what it held of the range (an upgrade or a downgrade, a split),
//! and its touching ranges of one kind merge. `flock` locks cover the whole
//! file and never meet record locks, as on Linux.
//!
//! Nothing here waits: a lock that conflicts is not taken, and the reply
//! names the conflict; a client whose program waits (`F_SETLKW`,
//! `LOCK_EX` without `LOCK_NB`) asks again.
//!
//! Locks live in memory. A client's locks on this worker last a lease
//! from its last lock request or renewal ([`crate::locks::Locks::renew`]):
//! a client that died, or cannot reach this server, loses them when the
//! lease runs out, so a dead node never blocks the others for longer. A
//! restart of the server drops every lock it kept (docs/posix.md).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pfs_core::wire::{FileLock, LockKind};
use pfs_core::{ClientId, FsError, FsResult, InodeId};

/// Locked ranges one worker keeps at most, over all files and clients; a
/// lock past it is refused with `ENOLCK`.
pub const LOCKS_MAX: usize = 1 << 16;

/// A lock as held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    client: ClientId,
    owner: u64,
    /// `Read` or `Write`, never `Unlock`.
    lock: FileLock,
}

impl Held {
    fn same_owner(&self, client: ClientId, owner: u64, flock: bool) -> bool {
        self.client == client && self.owner == owner && self.lock.flock == flock
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.lock.start <= end && start <= self.lock.end
    }
}

/// The locks of the files one worker owns.
#[derive(Debug)]
pub struct Locks {
    files: HashMap<InodeId, Vec<Held>>,
    /// Ranges held over all files.
    count: usize,
    /// End of the lease of each client that holds a lock here.
    leases: HashMap<ClientId, Instant>,
    /// Ranges each client holds.
    held_by: HashMap<ClientId, usize>,
    /// The earliest lease end in `leases` (a bound: expiry looks then).
    next_expiry: Option<Instant>,
    lease: Duration,
}

impl Locks {
    /// A table whose holders keep their locks `lease` past their last request.
    pub fn new(lease: Duration) -> Locks {
        Locks {
            files: HashMap::new(),
            count: 0,
            leases: HashMap::new(),
            held_by: HashMap::new(),
            next_expiry: None,
            lease,
        }
    }

    /// The lease, as the replies carry it.
    pub fn lease_ms(&self) -> u32 {
        self.lease.as_millis().min(u128::from(u32::MAX)) as u32
    }

    /// Ranges held now.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no lock is held.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Runs a lock request of `owner` on `client` for file `ino` at `now`:
    /// with `test`, returns the first lock of another owner that conflicts
    /// with `lock` (`None`: it could be taken); otherwise takes `lock` (or
    /// gives back the range, for `Unlock`) unless such a conflict exists,
    /// which is returned instead. A conflict held by another client has pid
    /// 0. `ENOLCK` past [`LOCKS_MAX`] ranges.
    pub fn request(
        &mut self,
        ino: InodeId,
        client: ClientId,
        owner: u64,
        lock: FileLock,
        test: bool,
        now: Instant,
    ) -> FsResult<Option<FileLock>> {
        if lock.start > lock.end {
            return Err(FsError::Invalid(format!(
                "lock range {}..={} ends before it starts",
                lock.start, lock.end
            )));
        }
        if test && lock.kind == LockKind::Unlock {
            return Err(FsError::Invalid("a lock test asks for a shared or exclusive lock".into()));
        }
        self.expire(now);
        let held = self.files.get(&ino).map(Vec::as_slice).unwrap_or(&[]);
        if lock.kind != LockKind::Unlock {
            let conflict = held.iter().find(|h| {
                !h.same_owner(client, owner, lock.flock)
                    && h.lock.flock == lock.flock
                    && h.overlaps(lock.start, lock.end)
                    && (h.lock.kind == LockKind::Write || lock.kind == LockKind::Write)
            });
            if let Some(h) = conflict {
                let pid = if h.client == client { h.lock.pid } else { 0 };
                return Ok(Some(FileLock { pid, ..h.lock }));
            }
            if test {
                return Ok(None);
            }
            // A new range may split one of the owner's in two.
            if self.count + 2 > LOCKS_MAX {
                log::warn!(
                    "file locks: {} ranges held on this worker, the most it keeps; \
                     refusing a lock on {ino} (ENOLCK)",
                    self.count
                );
                return Err(FsError::NoLocks);
            }
        }
        self.apply(ino, client, owner, lock);
        if self.leases.contains_key(&client) || lock.kind != LockKind::Unlock {
            self.renew(client, now);
        }
        Ok(None)
    }

    /// Replaces what `owner` holds of `lock`'s range with `lock` (nothing,
    /// for `Unlock`), merging its touching ranges of one kind.
    fn apply(&mut self, ino: InodeId, client: ClientId, owner: u64, lock: FileLock) {
        let held = self.files.remove(&ino).unwrap_or_default();
        let before = held.len();
        let mut kept = Vec::with_capacity(held.len() + 2);
        let mut mine = Vec::new();
        let mut mine_before = 0;
        for h in held {
            if !h.same_owner(client, owner, lock.flock) {
                kept.push(h);
                continue;
            }
            mine_before += 1;
            if !h.overlaps(lock.start, lock.end) {
                mine.push(h);
                continue;
            }
            // The parts of the old range outside the new one stay.
            if h.lock.start < lock.start {
                mine.push(Held { lock: FileLock { end: lock.start - 1, ..h.lock }, ..h });
            }
            if h.lock.end > lock.end {
                mine.push(Held { lock: FileLock { start: lock.end + 1, ..h.lock }, ..h });
            }
        }
        if lock.kind != LockKind::Unlock {
            mine.push(Held { client, owner, lock });
        }
        mine.sort_by_key(|h| (h.lock.kind as u8, h.lock.start));
        let mut merged: Vec<Held> = Vec::with_capacity(mine.len());
        for h in mine {
            match merged.last_mut() {
                Some(m)
                    if m.lock.kind == h.lock.kind
                        && m.lock.end.saturating_add(1) >= h.lock.start =>
                {
                    m.lock.end = m.lock.end.max(h.lock.end);
                    m.lock.pid = lock.pid;
                }
                _ => merged.push(h),
            }
        }
        let mine_after = merged.len();
        kept.extend(merged);
        self.count = self.count + kept.len() - before;
        if !kept.is_empty() {
            self.files.insert(ino, kept);
        }
        if mine_after != mine_before {
            let n = self.held_by.entry(client).or_default();
            *n = *n + mine_after - mine_before;
            if *n == 0 {
                self.held_by.remove(&client);
            }
        }
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
        let mut dropped = 0;
        self.files.retain(|_, held| {
            let before = held.len();
            held.retain(|h| !gone.contains(&h.client));
            dropped += before - held.len();
            !held.is_empty()
        });
        self.count -= dropped;
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
        l.request(F, c, owner, lock, false, Instant::now()).unwrap()
    }

    fn ranges(l: &Locks) -> Vec<(u64, LockKind, u64, u64)> {
        let mut v: Vec<_> =
            l.files[&F].iter().map(|h| (h.owner, h.lock.kind, h.lock.start, h.lock.end)).collect();
        v.sort_by_key(|r| (r.0, r.2));
        v
    }

    #[test]
    fn shared_locks_share_and_exclusive_ones_conflict_across_clients_and_owners() {
        let mut l = Locks::new(Duration::from_secs(30));
        assert_eq!(take(&mut l, A, 1, lk(LockKind::Read, 0, 99)), None);
        assert_eq!(take(&mut l, B, 1, lk(LockKind::Read, 50, 149)), None, "shared");
        let c = take(&mut l, B, 1, lk(LockKind::Write, 0, 9)).expect("A's read lock");
        assert_eq!((c.kind, c.start, c.end, c.pid), (LockKind::Read, 0, 99, 0), "another client");
        // Another owner of the same client conflicts too, and is named by pid.
        let c = take(&mut l, A, 2, lk(LockKind::Write, 140, 140)).expect("B's read lock");
        assert_eq!((c.start, c.pid), (50, 0));
        let c = take(&mut l, A, 2, lk(LockKind::Write, 10, 10)).expect("A owner 1's read lock");
        assert_eq!(c.pid, 42, "a process of the asker's own client");
        // Past the others' ranges it is free.
        assert_eq!(take(&mut l, A, 2, lk(LockKind::Write, 150, 200)), None);
        // A test takes nothing.
        let t = l.request(F, B, 1, lk(LockKind::Write, 300, 400), true, Instant::now()).unwrap();
        assert_eq!(t, None);
        assert_eq!(l.len(), 3);
    }

    #[test]
    fn an_owners_new_lock_replaces_splits_and_merges_its_own() {
        let mut l = Locks::new(Duration::from_secs(30));
        take(&mut l, A, 1, lk(LockKind::Write, 0, 99));
        // A downgrade in the middle splits the range in three.
        take(&mut l, A, 1, lk(LockKind::Read, 40, 59));
        assert_eq!(
            ranges(&l),
            [
                (1, LockKind::Write, 0, 39),
                (1, LockKind::Read, 40, 59),
                (1, LockKind::Write, 60, 99)
            ]
        );
        // An unlock of part of it, then a lock that touches merges.
        take(&mut l, A, 1, lk(LockKind::Unlock, 0, 49));
        assert_eq!(ranges(&l), [(1, LockKind::Read, 50, 59), (1, LockKind::Write, 60, 99)]);
        take(&mut l, A, 1, lk(LockKind::Write, 50, 59));
        assert_eq!(ranges(&l), [(1, LockKind::Write, 50, 99)]);
        // Another client may now take what was given back.
        assert_eq!(take(&mut l, B, 1, lk(LockKind::Write, 0, 49)), None);
        // Unlocking everything of one owner leaves the other's.
        take(&mut l, A, 1, lk(LockKind::Unlock, 0, pfs_core::wire::LOCK_END_MAX));
        assert_eq!(ranges(&l), [(1, LockKind::Write, 0, 49)]);
        assert_eq!(l.len(), 1);
        take(&mut l, B, 1, lk(LockKind::Unlock, 0, 49));
        assert!(l.is_empty() && l.files.is_empty());
    }

    #[test]
    fn flock_locks_never_meet_record_locks() {
        let mut l = Locks::new(Duration::from_secs(30));
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
        let mut l = Locks::new(lease);
        let t0 = Instant::now();
        l.request(F, A, 1, lk(LockKind::Write, 0, 9), false, t0).unwrap();
        l.request(F, B, 1, lk(LockKind::Write, 10, 19), false, t0).unwrap();
        // B renews, A does not.
        assert_eq!(l.renew(B, t0 + lease / 2), 1);
        let later = t0 + lease + Duration::from_millis(1);
        let c = l.request(F, B, 1, lk(LockKind::Write, 0, 9), false, later).unwrap();
        assert_eq!(c, None, "A's lock went with its lease");
        assert_eq!(l.renew(A, later), 0, "a renewal after the lease ran out holds nothing");
        let c = l.request(F, A, 1, lk(LockKind::Write, 0, 0), false, later).unwrap();
        assert!(c.is_some(), "B holds it now");
    }

    #[test]
    fn bounded_by_the_table_not_by_what_clients_ask() {
        let mut l = Locks::new(Duration::from_secs(30));
        // A range on each of many files (one file's ranges are searched
        // whole at each request, so the test spreads them).
        let mut refused = None;
        for i in 0..(LOCKS_MAX as u64 + 10) {
            let lock = lk(LockKind::Write, 0, 0);
            match l.request(InodeId(i + 1), A, 1, lock, false, Instant::now()) {
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
        assert_eq!(l.request(InodeId(1), A, 1, all, false, Instant::now()), Ok(None));
        assert_eq!(l.len(), i as usize - 1);
        let bad = lk(LockKind::Write, 5, 4);
        assert!(matches!(l.request(F, A, 1, bad, false, Instant::now()), Err(FsError::Invalid(_))));
    }
}
