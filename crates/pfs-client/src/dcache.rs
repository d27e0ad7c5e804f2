//! The client's dentry cache (PeakFS III-C2): only names whose child is a directory,
//! held under a read token of the parent with an expiry. Bounded: when full, the
//! oldest entry goes. A change to such a name takes the parent's write token, which
//! makes the server invalidate every holder ([`DentryCache::invalidate_dir`]).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

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

/// A bounded, expiring map `(parent, name) -> directory`.
#[derive(Debug)]
pub struct DentryCache {
    map: HashMap<(InodeId, Vec<u8>), Slot>,
    order: VecDeque<((InodeId, Vec<u8>), u64)>,
    capacity: usize,
    next_stamp: u64,
    hits: u64,
    misses: u64,
}

impl DentryCache {
    /// A cache of at most `capacity` names.
    pub fn new(capacity: usize) -> DentryCache {
        DentryCache {
            map: HashMap::with_capacity(capacity.min(1 << 16)),
            order: VecDeque::with_capacity(capacity.min(1 << 16)),
            capacity,
            next_stamp: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// The cached directory `name` in `parent`, if present and not expired at `now`.
    pub fn get(&mut self, parent: InodeId, name: &[u8], now: Instant) -> Option<CachedDir> {
        let key = (parent, name.to_vec());
        match self.map.get(&key) {
            Some(slot) if slot.expires > now => {
                self.hits += 1;
                Some(slot.dir)
            }
            Some(_) => {
                self.map.remove(&key);
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
        while self.map.len() >= self.capacity {
            let Some((old, stamp)) = self.order.pop_front() else { break };
            if self.map.get(&old).is_some_and(|s| s.stamp == stamp) {
                self.map.remove(&old);
            }
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let key = (parent, name.to_vec());
        self.order.push_back((key.clone(), stamp));
        self.map.insert(key, Slot { dir, expires, stamp });
        // Stale keys in `order` are bounded too: compact when they dominate.
        if self.order.len() > 2 * self.capacity.max(16) {
            let map = &self.map;
            self.order.retain(|(k, s)| map.get(k).is_some_and(|slot| slot.stamp == *s));
        }
    }

    /// Drops one name (its parent's write token was taken).
    pub fn invalidate(&mut self, parent: InodeId, name: &[u8]) {
        self.map.remove(&(parent, name.to_vec()));
    }

    /// Drops every name in `parent` (its read token was revoked or expired).
    pub fn invalidate_dir(&mut self, parent: InodeId) {
        self.map.retain(|(p, _), _| *p != parent);
    }

    /// Drops every name of directory `ino` (its attributes changed: the cached
    /// ones would be handed out stale). Scans the cache: for setattr, not lookups.
    pub fn invalidate_ino(&mut self, ino: InodeId) {
        self.map.retain(|_, s| s.dir.attr.ino != ino);
    }

    /// Drops every name in `parent` and returns them (to tell the kernel).
    pub fn take_dir(&mut self, parent: InodeId) -> Vec<Vec<u8>> {
        let names: Vec<Vec<u8>> =
            self.map.keys().filter(|(p, _)| *p == parent).map(|(_, n)| n.clone()).collect();
        for n in &names {
            self.map.remove(&(parent, n.clone()));
        }
        names
    }

    /// Entries cached now.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
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
}
