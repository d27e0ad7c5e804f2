//! A table of file locks and POSIX's rules for them, kept by the server that
//! owns the files (pfs-server's `locks.rs`, keyed by client and owner) and by
//! each client for the locks it holds (so it can take them again from a
//! server that restarted: pfs-client's `cluster/locks.rs`, keyed by owner).
//!
//! A shared lock conflicts with another owner's exclusive lock on an
//! overlapping range, an exclusive lock with any; an owner's new lock
//! replaces what it held of the range (an upgrade or a downgrade, a split),
//! and its touching ranges of one kind merge. `flock` locks (the whole file)
//! never meet record locks, as on Linux. docs/posix.md "locks".

use std::collections::HashMap;

use crate::wire::{FileLock, LockKind};
use crate::InodeId;

/// Locks of files, by owner `K`.
#[derive(Debug)]
pub struct LockTable<K> {
    files: HashMap<InodeId, Vec<(K, FileLock)>>,
    /// Ranges held over all files.
    count: usize,
}

impl<K> Default for LockTable<K> {
    fn default() -> Self {
        LockTable { files: HashMap::new(), count: 0 }
    }
}

fn overlaps(l: &FileLock, start: u64, end: u64) -> bool {
    l.start <= end && start <= l.end
}

impl<K: Copy + Eq> LockTable<K> {
    /// Ranges held.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether no lock is held.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The first lock of another owner than `key` on `ino` that keeps
    /// `lock` (shared or exclusive) from being taken.
    pub fn conflict(&self, ino: InodeId, key: K, lock: &FileLock) -> Option<(K, FileLock)> {
        self.files.get(&ino)?.iter().copied().find(|(k, h)| {
            h.flock == lock.flock
                && *k != key
                && overlaps(h, lock.start, lock.end)
                && (h.kind == LockKind::Write || lock.kind == LockKind::Write)
        })
    }

    /// Replaces what `key` holds of `lock`'s range (of `lock`'s kind, record
    /// or `flock`) with `lock`, or with nothing for `Unlock`, merging the
    /// owner's touching ranges of one kind. Returns the owner's ranges on the
    /// file before and after.
    pub fn apply(&mut self, ino: InodeId, key: K, lock: FileLock) -> (usize, usize) {
        let held = self.files.remove(&ino).unwrap_or_default();
        let before = held.len();
        let mut kept = Vec::with_capacity(held.len() + 2);
        let mut mine = Vec::new();
        let mut mine_before = 0;
        for (k, h) in held {
            if k != key || h.flock != lock.flock {
                kept.push((k, h));
                continue;
            }
            mine_before += 1;
            if !overlaps(&h, lock.start, lock.end) {
                mine.push(h);
                continue;
            }
            // The parts of the old range outside the new one stay.
            if h.start < lock.start {
                mine.push(FileLock { end: lock.start - 1, ..h });
            }
            if h.end > lock.end {
                mine.push(FileLock { start: lock.end + 1, ..h });
            }
        }
        if lock.kind != LockKind::Unlock {
            mine.push(lock);
        }
        mine.sort_by_key(|h| (h.kind as u8, h.start));
        let mut merged: Vec<FileLock> = Vec::with_capacity(mine.len());
        for h in mine {
            match merged.last_mut() {
                Some(m) if m.kind == h.kind && m.end.saturating_add(1) >= h.start => {
                    m.end = m.end.max(h.end);
                    m.pid = lock.pid;
                }
                _ => merged.push(h),
            }
        }
        let mine_after = merged.len();
        kept.extend(merged.into_iter().map(|h| (key, h)));
        self.count = self.count + kept.len() - before;
        if !kept.is_empty() {
            self.files.insert(ino, kept);
        }
        (mine_before, mine_after)
    }

    /// Drops every lock whose owner `gone` picks; returns how many.
    pub fn drop_owners(&mut self, gone: impl Fn(&K) -> bool) -> usize {
        let mut dropped = 0;
        self.files.retain(|_, held| {
            let before = held.len();
            held.retain(|(k, _)| !gone(k));
            dropped += before - held.len();
            !held.is_empty()
        });
        self.count -= dropped;
        dropped
    }

    /// Every lock held: file, owner, lock.
    pub fn iter(&self) -> impl Iterator<Item = (InodeId, K, FileLock)> + '_ {
        self.files.iter().flat_map(|(&ino, v)| v.iter().map(move |&(k, l)| (ino, k, l)))
    }

    /// The locks held on `ino`: owner, lock.
    pub fn of(&self, ino: InodeId) -> &[(K, FileLock)] {
        self.files.get(&ino).map(Vec::as_slice).unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::LOCK_END_MAX;

    const F: InodeId = InodeId(77);

    fn lk(kind: LockKind, start: u64, end: u64) -> FileLock {
        FileLock { kind, flock: false, start, end, pid: 42 }
    }

    fn ranges(t: &LockTable<u32>) -> Vec<(u32, LockKind, u64, u64)> {
        let mut v: Vec<_> = t.of(F).iter().map(|&(k, l)| (k, l.kind, l.start, l.end)).collect();
        v.sort_by_key(|r| (r.0, r.2));
        v
    }

    #[test]
    fn an_owners_new_lock_replaces_splits_and_merges_its_own() {
        let mut t = LockTable::default();
        t.apply(F, 1, lk(LockKind::Write, 0, 99));
        // A downgrade in the middle splits the range in three.
        assert_eq!(t.apply(F, 1, lk(LockKind::Read, 40, 59)), (1, 3));
        assert_eq!(
            ranges(&t),
            [
                (1, LockKind::Write, 0, 39),
                (1, LockKind::Read, 40, 59),
                (1, LockKind::Write, 60, 99)
            ]
        );
        t.apply(F, 1, lk(LockKind::Unlock, 0, 49));
        assert_eq!(ranges(&t), [(1, LockKind::Read, 50, 59), (1, LockKind::Write, 60, 99)]);
        t.apply(F, 1, lk(LockKind::Write, 50, 59));
        assert_eq!(ranges(&t), [(1, LockKind::Write, 50, 99)]);
        assert!(t.conflict(F, 2, &lk(LockKind::Read, 99, 200)).is_some());
        assert!(t.conflict(F, 1, &lk(LockKind::Write, 0, 200)).is_none(), "its own");
        t.apply(F, 2, lk(LockKind::Write, 0, 49));
        t.apply(F, 1, lk(LockKind::Unlock, 0, LOCK_END_MAX));
        assert_eq!(ranges(&t), [(2, LockKind::Write, 0, 49)]);
        assert_eq!(t.iter().count(), 1);
        assert_eq!(t.drop_owners(|&k| k == 2), 1);
        assert!(t.is_empty() && t.files.is_empty());
    }

    #[test]
    fn shared_locks_share_and_flock_never_meets_record_locks() {
        let mut t = LockTable::default();
        t.apply(F, 1, lk(LockKind::Read, 0, 99));
        assert!(t.conflict(F, 2, &lk(LockKind::Read, 50, 60)).is_none());
        assert_eq!(t.conflict(F, 2, &lk(LockKind::Write, 99, 99)).map(|c| c.0), Some(1));
        let whole = FileLock { flock: true, ..lk(LockKind::Write, 0, LOCK_END_MAX) };
        assert!(t.conflict(F, 2, &whole).is_none(), "a flock beside a record lock");
        t.apply(F, 2, whole);
        assert!(t.conflict(F, 3, &FileLock { kind: LockKind::Read, ..whole }).is_some());
    }
}
