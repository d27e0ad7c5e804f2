//! The shard's read cache (DESIGN.md "Server read cache"): file data pages as
//! the device holds them, keyed by data page number, least recently used out.
//!
//! Coherent by construction: every data write of the shard writes whole pages
//! (`write_blocks`, `write_io`) and puts them here once the device took them, so
//! a cached page is always what the device holds. A freed page may stay cached
//! with its old bytes, but nothing reads a free page, and whoever allocates it
//! next writes it whole first. The cache is memory only: a restarted shard
//! starts empty.
//!
//! Sequential readers are detected per file (`Readers`): a read that starts
//! where the file's previous read ended, or a little past it, keeps the
//! factor times the stretch it stands for read ahead, in buffers of its own
//! (`dataio.rs`), so the next reads find their pages read or being read.
//!
//! What a write puts: the pages of a block left partly filled (the next append
//! merges them: copy-on-write reads them back); the others are only dropped, so
//! streaming writes pay no copy into the cache.

use std::collections::{BTreeMap, HashMap};

use pfs_core::hash::NumMap;
use pfs_core::InodeId;

use super::PAGE_SIZE;

/// How far a sequential read reads ahead, in multiples of its length, in the
/// tests and DESIGN.md; servers take `read_ahead_factor` from their config.
pub const READ_AHEAD_FACTOR: u64 = 10;

/// The longest forward gap after a file's last read that still continues it
/// (16 blocks: the other shards' blocks between two of this shard's).
const GAP_MAX: u64 = 16 * pfs_core::BLOCK_SIZE_BYTES;

/// Files whose last read end is remembered; past it the table starts over.
const READERS_MAX: usize = 4096;

/// Cached data pages, least recently used evicted past `cap`.
#[derive(Debug)]
pub struct PageCache {
    cap: usize,
    /// Page number -> (use stamp, bytes); page numbers are the shard's own,
    /// hashed without SipHash (`pfs_core::hash`: a third of a cache hit's
    /// time went to hashing them, docs/benchmarks.md).
    pages: NumMap<u64, (u64, Box<[u8]>)>,
    /// Use stamp -> page, oldest first.
    lru: BTreeMap<u64, u64>,
    next_stamp: u64,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl PageCache {
    /// A cache of at most `cap` pages (0: caches nothing).
    pub fn new(cap: usize) -> PageCache {
        PageCache {
            cap,
            pages: NumMap::default(),
            lru: BTreeMap::new(),
            next_stamp: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// Pages held now.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Whether it holds no page.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Copies `out.len()` bytes starting `skip` bytes into page `first` if every
    /// page they span is cached; `false` (and nothing copied) otherwise.
    pub fn read(&mut self, first: u64, skip: usize, out: &mut [u8]) -> bool {
        let pages = (skip + out.len()).div_ceil(PAGE_SIZE as usize) as u64;
        if self.cap == 0 || !(first..first + pages).all(|p| self.pages.contains_key(&p)) {
            self.misses += 1;
            return false;
        }
        self.hits += 1;
        let mut at = 0usize;
        for p in first..first + pages {
            let from = if p == first { skip } else { 0 };
            let n = (PAGE_SIZE as usize - from).min(out.len() - at);
            // One lookup copies and touches it.
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            let (old, bytes) = self.pages.get_mut(&p).expect("checked above");
            out[at..at + n].copy_from_slice(&bytes[from..from + n]);
            self.lru.remove(old);
            *old = stamp;
            self.lru.insert(stamp, p);
            at += n;
        }
        true
    }

    /// Whether all `n` pages from `first` are cached (not counted as a hit or
    /// a miss).
    pub fn holds(&self, first: u64, n: u64) -> bool {
        self.cap > 0 && (first..first + n).all(|p| self.pages.contains_key(&p))
    }

    /// Takes page `page` out to be read in place ([`give_back`](Self::give_back)
    /// puts it back), if held.
    pub fn lend(&mut self, page: u64) -> Option<Box<[u8]>> {
        let (stamp, bytes) = self.pages.remove(&page)?;
        self.lru.remove(&stamp);
        Some(bytes)
    }

    /// Puts back a page [`lend`](Self::lend) took, as just used; a page
    /// cached again meanwhile keeps its newer bytes.
    pub fn give_back(&mut self, page: u64, bytes: Box<[u8]>) {
        if self.pages.contains_key(&page) {
            return;
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.pages.insert(page, (stamp, bytes));
        self.lru.insert(stamp, page);
    }

    /// Remembers whole pages starting at page `first` (`data` holds a multiple
    /// of the page size), as the device now holds them.
    pub fn put(&mut self, first: u64, data: &[u8]) {
        if self.cap == 0 {
            return;
        }
        for (i, chunk) in data.chunks_exact(PAGE_SIZE as usize).enumerate() {
            let page = first + i as u64;
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            match self.pages.get_mut(&page) {
                Some((old, bytes)) => {
                    bytes.copy_from_slice(chunk);
                    self.lru.remove(old);
                    *old = stamp;
                }
                None => {
                    // Full: the least recently used page's buffer takes the new one.
                    let buf = match self.pages.len() >= self.cap {
                        true => self.evict_oldest(),
                        false => None,
                    };
                    let buf = match buf {
                        Some(mut b) => {
                            b.copy_from_slice(chunk);
                            b
                        }
                        None => chunk.into(),
                    };
                    self.pages.insert(page, (stamp, buf));
                }
            }
            self.lru.insert(stamp, page);
        }
    }

    fn evict_oldest(&mut self) -> Option<Box<[u8]>> {
        let (_, page) = self.lru.pop_first()?;
        self.pages.remove(&page).map(|(_, b)| b)
    }

    /// Drops whatever is cached of the `n` pages from `first` (the device is
    /// about to hold something else there that is not worth caching).
    pub fn forget(&mut self, first: u64, n: u64) {
        if self.pages.is_empty() {
            return;
        }
        for page in first..first + n {
            if let Some((stamp, _)) = self.pages.remove(&page) {
                self.lru.remove(&stamp);
            }
        }
    }
}

/// Where each file's last read ended and how far it was read ahead, to tell
/// sequential readers and read ahead of them in windows.
#[derive(Debug, Default)]
pub struct Readers {
    next: HashMap<InodeId, (u64, u64)>,
}

impl Readers {
    /// Notes a read of `len` bytes of `ino` at `offset`. When it continues the
    /// last one (starting at its end or up to `GAP_MAX` past it) and less than
    /// half a window (`factor` times the stretch from the last end to this
    /// one's, at most `most` bytes) is read ahead of it, returns the range to
    /// read ahead now: from where the last window ended to a full window past
    /// this read.
    pub fn ahead(
        &mut self,
        ino: InodeId,
        offset: u64,
        len: u64,
        factor: u64,
        most: u64,
    ) -> Option<(u64, u64)> {
        if factor == 0 {
            return None;
        }
        if self.next.len() >= READERS_MAX && !self.next.contains_key(&ino) {
            self.next.clear();
        }
        let end = offset.saturating_add(len);
        let (next, ahead_end) = self.next.get(&ino).copied().unwrap_or((u64::MAX, 0));
        // A read that starts where the last ended, or a little past it: a
        // striped file reaches each shard with the other shards' blocks left
        // out, one request per run of its own blocks. Such a read stands for
        // the stretch of file from the last end to its own.
        let sequential =
            offset > 0 && len > 0 && offset >= next && offset - next <= GAP_MAX.max(len);
        // A read a little before the last end: another reader of the same
        // file (IOR's interleaved transfers reach the shard out of order), or
        // one that went back a little. It neither moves the window nor starts
        // over, so the reader ahead keeps its read-ahead.
        if offset < next && next - offset <= GAP_MAX.max(len) && next <= ahead_end {
            return None;
        }
        let step = if sequential { end - next } else { len };
        let window = step.saturating_mul(factor).min(most);
        let plan = if !sequential || end.saturating_add(window / 2) <= ahead_end {
            None
        } else {
            Some((end.max(ahead_end), end.saturating_add(window)))
        };
        let ahead_end = match plan {
            Some((_, to)) => to,
            None if sequential => ahead_end,
            None => 0,
        };
        self.next.insert(ino, (end, ahead_end));
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(v: u8) -> Vec<u8> {
        vec![v; PAGE_SIZE as usize]
    }

    #[test]
    fn reads_need_every_page_and_see_the_latest_put() {
        let mut c = PageCache::new(8);
        let mut out = [0u8; 10];
        assert!(!c.read(5, 0, &mut out));
        c.put(5, &[page(1), page(2)].concat());
        // Spanning both pages: the last 4 bytes of page 5, 6 of page 6.
        assert!(c.read(5, PAGE_SIZE as usize - 4, &mut out));
        assert_eq!(out, [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]);
        assert!(!c.read(6, 0, &mut vec![0u8; PAGE_SIZE as usize + 1]), "page 7 is missing");
        c.put(6, &page(3));
        assert!(c.read(6, 0, &mut out));
        assert_eq!(out, [3; 10]);
        assert_eq!((c.hits, c.misses), (2, 2));
    }

    #[test]
    fn holds_at_most_its_cap_and_drops_the_least_recently_used() {
        let mut c = PageCache::new(3);
        for p in 0..3 {
            c.put(p, &page(p as u8));
        }
        let mut out = [0u8; 1];
        assert!(c.read(0, 0, &mut out), "page 0 used: 1 is now the oldest");
        c.put(10, &page(10));
        assert_eq!(c.len(), 3);
        assert!(!c.read(1, 0, &mut out));
        assert!(c.read(0, 0, &mut out) && c.read(2, 0, &mut out) && c.read(10, 0, &mut out));
        c.put(20, &[page(1), page(2), page(3), page(4)].concat());
        assert_eq!(c.len(), 3, "a put larger than the cap keeps only its last pages");
        assert!(c.read(21, 0, &mut out) && c.read(23, 0, &mut out));
        c.forget(20, 10);
        assert!(c.is_empty() && !c.read(23, 0, &mut out), "forgotten");
        assert!(PageCache::new(0).is_empty());
        let mut off = PageCache::new(0);
        off.put(1, &page(1));
        assert!(off.is_empty() && !off.read(1, 0, &mut out));
    }

    #[test]
    fn sequential_readers_read_ahead_in_windows() {
        let mut r = Readers::default();
        let ino = InodeId(7);
        assert_eq!(
            r.ahead(ino, 0, 10, READ_AHEAD_FACTOR, u64::MAX),
            None,
            "a first read is not sequential yet"
        );
        assert_eq!(r.ahead(ino, 10, 10, READ_AHEAD_FACTOR, u64::MAX), Some((20, 120)));
        // Within the window, until less than half of it is left.
        for off in (20..70).step_by(10) {
            assert_eq!(r.ahead(ino, off, 10, READ_AHEAD_FACTOR, u64::MAX), None, "at {off}");
        }
        assert_eq!(r.ahead(ino, 70, 10, READ_AHEAD_FACTOR, u64::MAX), Some((120, 180)));
        // A read a little behind (another reader of the file, out of order)
        // keeps the window: the reader ahead goes on without a new plan.
        assert_eq!(r.ahead(ino, 50, 10, READ_AHEAD_FACTOR, u64::MAX), None, "behind");
        for off in (80..130).step_by(10) {
            assert_eq!(r.ahead(ino, off, 10, READ_AHEAD_FACTOR, u64::MAX), None, "kept, at {off}");
        }
        assert_eq!(r.ahead(ino, 130, 10, READ_AHEAD_FACTOR, u64::MAX), Some((180, 240)));
        let back = 140 + GAP_MAX + 1;
        let at = back + 2 * GAP_MAX;
        assert_eq!(r.ahead(ino, at, 10, READ_AHEAD_FACTOR, u64::MAX), None, "a jump");
        assert_eq!(
            r.ahead(ino, at + 10, 10, READ_AHEAD_FACTOR, u64::MAX),
            Some((at + 20, at + 120))
        );
        assert_eq!(
            r.ahead(ino, at - back, 10, READ_AHEAD_FACTOR, u64::MAX),
            None,
            "a long jump back starts over"
        );
        let s = at - back;
        assert_eq!(r.ahead(ino, s + 10, 10, READ_AHEAD_FACTOR, u64::MAX), Some((s + 20, s + 120)));
        let far = s + 20 + GAP_MAX + 1;
        assert_eq!(r.ahead(ino, far, 10, READ_AHEAD_FACTOR, u64::MAX), None, "a long gap: a jump");
        assert_eq!(
            r.ahead(ino, far + 10, 10, READ_AHEAD_FACTOR, u64::MAX),
            Some((far + 20, far + 120)),
            "continuing again"
        );
        // A striped file's reads on one shard: every other block. Each read
        // stands for the stretch since the last end, and the window is that
        // many times larger; `most` caps it.
        let b = pfs_core::BLOCK_SIZE_BYTES;
        let f = InodeId(8);
        assert_eq!(r.ahead(f, 0, b, READ_AHEAD_FACTOR, u64::MAX), None);
        assert_eq!(r.ahead(f, 2 * b, b, READ_AHEAD_FACTOR, u64::MAX), Some((3 * b, 23 * b)));
        assert_eq!(r.ahead(f, 4 * b, b, READ_AHEAD_FACTOR, u64::MAX), None, "inside the window");
        assert_eq!(r.ahead(f, 20 * b, b, READ_AHEAD_FACTOR, 8 * b), Some((23 * b, 29 * b)));
        for i in 0..READERS_MAX as u64 {
            r.ahead(InodeId(1000 + i), 0, 1, READ_AHEAD_FACTOR, u64::MAX);
        }
        assert!(r.next.len() <= READERS_MAX, "bounded");
        assert_eq!(Readers::default().ahead(ino, 0, 10, 0, u64::MAX), None, "factor 0: off");
    }
}
