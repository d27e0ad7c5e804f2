//! The client's dentry cache (PeakFS III-C2): only names whose child is a directory,
//! held under a read token of the parent with an expiry. Bounded: when full, the
//! oldest entry goes. A change to such a name takes the parent's write token, which
//! makes the server invalidate every holder ([`DentryCache::invalidate_dir`]).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use pfs_core::hash::NumMap;
use pfs_core::{DirLayout, FileAttr, InodeId};

/// What the cache knows of a directory name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedDir {
    /// The directory's attributes when cached.
    pub attr: FileAttr,
    /// Its children's layout (needed to route names inside it).
    pub layout: DirLayout,
}

#[derive(Debug)]
struct Slot {
    dir: CachedDir,
    expires: Instant,
    /// Insertion number, to tell a live key in `order` from a stale one.
    stamp: u64,
}

/// A name in its parent directory.
type Key = (InodeId, Box<[u8]>);

/// A bounded, expiring map `(parent, name) -> directory`: a table of names
/// per parent, so a lookup hashes the borrowed name (no copy of it).
#[derive(Debug)]
pub struct DentryCache {
    map: NumMap<InodeId, HashMap<Box<[u8]>, Slot>>,
    /// Names held, all parents together.
    len: usize,
    /// Insertions in order, for evicting the oldest: `(key, stamp)`.
    order: VecDeque<(Key, u64)>,
    capacity: usize,
    next_stamp: u64,
    hits: u64,
    misses: u64,
}

impl DentryCache {
    /// A cache of at most `capacity` names.
    pub fn new(capacity: usize) -> DentryCache {
        DentryCache {
            map: NumMap::default(),
            len: 0,
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity,
            next_stamp: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The slot of `name` in `parent`, if held.
    fn slot(&self, parent: InodeId, name: &[u8]) -> Option<&Slot> {
        self.map.get(&parent)?.get(name)
    }

    /// Removes `name` in `parent`; whether it was held.
    fn remove(&mut self, parent: InodeId, name: &[u8]) -> bool {
        let Some(names) = self.map.get_mut(&parent) else { return false };
        let removed = names.remove(name).is_some();
        if names.is_empty() {
            self.map.remove(&parent);
        }
        self.len -= usize::from(removed);
        removed
    }

    /// The cached directory `name` in `parent`, if present and not expired at `now`.
    pub fn get(&mut self, parent: InodeId, name: &[u8], now: Instant) -> Option<CachedDir> {
        match self.slot(parent, name).map(|s| (s.dir, s.expires > now)) {
            Some((dir, true)) => {
                self.hits += 1;
                Some(dir)
            }
            Some((_, false)) => {
                self.remove(parent, name);
                self.misses += 1;
                None
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Caches directory `name` in `parent` until `expires` (the read token's expiry).
    pub fn insert(&mut self, parent: InodeId, name: &[u8], dir: CachedDir, expires: Instant) {
        if self.capacity == 0 {
            return;
        }
        while self.len >= self.capacity {
            let Some(((p, n), stamp)) = self.order.pop_front() else { break };
            if self.slot(p, &n).is_some_and(|s| s.stamp == stamp) {
                self.remove(p, &n);
            }
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let key: Box<[u8]> = name.into();
        self.order.push_back(((parent, key.clone()), stamp));
        let replaced =
            self.map.entry(parent).or_default().insert(key, Slot { dir, expires, stamp });
        self.len += usize::from(replaced.is_none());
        // Stale keys in `order` are bounded too: compact when they dominate.
        if self.order.len() > 2 * self.capacity.max(16) {
            let map = &self.map;
            self.order.retain(|((p, n), s)| {
                map.get(p).and_then(|names| names.get(n)).is_some_and(|slot| slot.stamp == *s)
            });
        }
    }

    /// Drops one name (its parent's write token was taken).
    pub fn invalidate(&mut self, parent: InodeId, name: &[u8]) {
        self.remove(parent, name);
    }

    /// Drops every name in `parent` (its read token was revoked or expired).
    pub fn invalidate_dir(&mut self, parent: InodeId) {
        if let Some(names) = self.map.remove(&parent) {
            self.len -= names.len();
        }
    }

    /// Drops every name of directory `ino` (its attributes changed: the cached
    /// ones would be handed out stale). Scans the cache: for setattr, not lookups.
    pub fn invalidate_ino(&mut self, ino: InodeId) {
        let mut dropped = 0;
        self.map.retain(|_, names| {
            let before = names.len();
            names.retain(|_, s| s.dir.attr.ino != ino);
            dropped += before - names.len();
            !names.is_empty()
        });
        self.len -= dropped;
    }

    /// Drops every name in `parent` and returns them (to tell the kernel).
    pub fn take_dir(&mut self, parent: InodeId) -> Vec<Vec<u8>> {
        let Some(names) = self.map.remove(&parent) else { return Vec::new() };
        self.len -= names.len();
        names.into_keys().map(Vec::from).collect()
    }

    /// Entries cached now.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// (hits, misses) so far.
    pub fn counters(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::FileType;
    use std::time::Duration;

    fn dir(ino: u64) -> CachedDir {
        let attr = FileAttr {
            ino: InodeId(ino),
            kind: FileType::Directory,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            nlink: 2,
            rdev: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
        };
        CachedDir { attr, layout: DirLayout::BigDir }
    }

    #[test]
    fn entries_expire() {
        let mut c = DentryCache::new(10);
        let now = Instant::now();
        c.insert(InodeId(1), b"a", dir(5), now + Duration::from_secs(1));
        assert_eq!(c.get(InodeId(1), b"a", now).unwrap().attr.ino, InodeId(5));
        assert_eq!(c.get(InodeId(1), b"a", now + Duration::from_secs(2)), None);
        assert_eq!(c.counters(), (1, 1));
    }

    #[test]
    fn bounded_oldest_goes_first() {
        let mut c = DentryCache::new(3);
        let later = Instant::now() + Duration::from_secs(60);
        for i in 0..5u64 {
            c.insert(InodeId(1), format!("d{i}").as_bytes(), dir(10 + i), later);
            assert!(c.len() <= 3);
        }
        let now = Instant::now();
        assert_eq!(c.get(InodeId(1), b"d0", now), None);
        assert_eq!(c.get(InodeId(1), b"d1", now), None);
        assert!(c.get(InodeId(1), b"d4", now).is_some());
        // Re-inserting keys many times never grows the bookkeeping without bound.
        for _ in 0..1000 {
            c.insert(InodeId(1), b"d4", dir(14), later);
        }
        assert!(c.order.len() <= 32, "order queue stays bounded: {}", c.order.len());
    }

    #[test]
    fn invalidation_by_inode() {
        let mut c = DentryCache::new(8);
        let until = Instant::now() + Duration::from_secs(60);
        c.insert(InodeId(1), b"a", dir(10), until);
        c.insert(InodeId(2), b"b", dir(11), until);
        c.invalidate_ino(InodeId(10));
        assert!(c.get(InodeId(1), b"a", Instant::now()).is_none());
        assert!(c.get(InodeId(2), b"b", Instant::now()).is_some());
    }

    #[test]
    fn invalidation_by_name_and_by_directory() {
        let mut c = DentryCache::new(10);
        let later = Instant::now() + Duration::from_secs(60);
        c.insert(InodeId(1), b"a", dir(5), later);
        c.insert(InodeId(1), b"b", dir(6), later);
        c.insert(InodeId(2), b"a", dir(7), later);
        c.invalidate(InodeId(1), b"a");
        let now = Instant::now();
        assert_eq!(c.get(InodeId(1), b"a", now), None);
        assert!(c.get(InodeId(1), b"b", now).is_some());
        c.invalidate_dir(InodeId(1));
        assert_eq!(c.get(InodeId(1), b"b", now), None);
        assert!(c.get(InodeId(2), b"a", now).is_some());
    }

    #[test]
    fn the_count_follows_inserts_replacements_and_every_removal() {
        let mut c = DentryCache::new(100);
        let later = Instant::now() + Duration::from_secs(60);
        let now = Instant::now();
        for p in 1..=3u64 {
            for n in 0..4u64 {
                c.insert(InodeId(p), format!("n{n}").as_bytes(), dir(100 + p * 10 + n), later);
            }
        }
        assert_eq!(c.len(), 12);
        c.insert(InodeId(1), b"n0", dir(7), later);
        assert_eq!(c.len(), 12, "a replacement is not a new name");
        assert_eq!(c.get(InodeId(1), b"n0", now).unwrap().attr.ino, InodeId(7));
        c.invalidate(InodeId(1), b"n1");
        c.invalidate(InodeId(1), b"missing");
        assert_eq!(c.len(), 11);
        let mut taken = c.take_dir(InodeId(2));
        taken.sort();
        assert_eq!(taken, vec![b"n0".to_vec(), b"n1".to_vec(), b"n2".to_vec(), b"n3".to_vec()]);
        assert_eq!(c.len(), 7);
        c.invalidate_ino(InodeId(132));
        assert_eq!(c.len(), 6);
        c.invalidate_dir(InodeId(1));
        assert_eq!(c.len(), 3);
        c.insert(InodeId(9), b"short", dir(9), now);
        assert_eq!(c.get(InodeId(9), b"short", now + Duration::from_millis(1)), None, "expired");
        assert_eq!(c.len(), 3, "an expired name found is dropped");
        assert!(c.get(InodeId(3), b"n3", now).is_some());
        assert!(!c.is_empty());
    }
}
