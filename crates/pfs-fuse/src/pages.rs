//! Whether the kernel may keep a file's cached pages at open (`FOPEN_KEEP_CACHE`).
//!
//! Without the flag the kernel drops an inode's pages at every open, so a file
//! another client changed and closed is read fresh (close-to-open). That also
//! drops pages nobody changed: a file written and then read back through the
//! mount, or read twice, goes to the servers each time.
//!
//! A file's version is its inode's `ctime`: its home gives every change its own
//! time (`Shard::begin`), and every change to the data reaches the home by
//! close at the latest (a write there, or the size published by `ExtendSize`).
//! For each inode the table keeps the version the kernel's pages are known to
//! be current at (`known`), as NFS does with its weak cache consistency:
//!
//! - An open that drops the pages records the newest version this mount saw
//!   before it (`seen`, from any attribute reply): every page read after the drop
//!   is at least that new.
//! - This mount's own changes move `known` along when the server says the change
//!   started from it (`ctime` before and after, in the `Write` and `ExtendSize`
//!   replies): the pages hold the change already (the kernel wrote them before
//!   sending it). Any other start, or a change whose outcome is unknown (a
//!   failed write), makes it unknown.
//! - An open of an inode the kernel may hold pages of asks its home for the
//!   version (one `GetAttr`); equal to `known`, nothing changed since that this
//!   mount does not hold, and the pages are kept.
//!
//! Bounded: at most [`PAGE_VERSIONS_MAX`] inodes; one dropped from the table is
//! opened as before (pages dropped). An inode the kernel forgets leaves it.

use std::collections::HashMap;
use std::sync::Mutex;

use pfs_core::TimeNs;

/// Most inodes whose page versions the table follows.
pub const PAGE_VERSIONS_MAX: usize = 65_536;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Entry {
    /// The newest version this mount saw in an attribute reply.
    seen: Option<TimeNs>,
    /// The version the kernel's pages are current at; `None`: unknown.
    known: Option<TimeNs>,
    /// The kernel may hold pages of the inode: something was read, or a whole
    /// page written, since the last open that dropped them.
    pages: bool,
}

/// What an open does with the kernel's pages of one inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtOpen {
    /// Drop them (no `FOPEN_KEEP_CACHE`), without asking the home.
    Drop,
    /// Ask the home for the version, then [`PageVersions::opened`].
    Check,
}

/// The page versions of the inodes this mount has cached pages of.
#[derive(Debug)]
pub struct PageVersions {
    map: Mutex<HashMap<u64, Entry>>,
    capacity: usize,
}

impl PageVersions {
    /// A table of at most `capacity` inodes.
    pub fn new(capacity: usize) -> PageVersions {
        PageVersions { map: Mutex::new(HashMap::new()), capacity }
    }

    fn with<R>(&self, ino: u64, f: impl FnOnce(&mut Entry) -> R) -> R {
        let mut map = self.map.lock().expect("page versions lock");
        if !map.contains_key(&ino) && map.len() >= self.capacity {
            // Forgetting an inode is always safe: its next open drops its pages.
            if let Some(&old) = map.keys().next() {
                map.remove(&old);
            }
        }
        f(map.entry(ino).or_default())
    }

    /// An attribute reply showed `ino` at version `ctime`.
    pub fn saw(&self, ino: u64, ctime: TimeNs) {
        if self.capacity > 0 {
            self.with(ino, |e| e.seen = Some(ctime));
        }
    }

    /// This mount changed `ino` at its home from version `before` to `after`,
    /// or (`None`) made a change whose outcome it does not know.
    pub fn changed(&self, ino: u64, change: Option<(TimeNs, TimeNs)>) {
        let mut map = self.map.lock().expect("page versions lock");
        if let Some(e) = map.get_mut(&ino) {
            e.known = match (e.known, change) {
                (Some(k), Some((before, after))) if k == before => Some(after),
                _ => None,
            };
        }
    }

    /// The kernel may now hold pages of `ino` (a read through the page cache,
    /// or a write that covered a whole page).
    pub fn filled(&self, ino: u64) {
        if self.capacity > 0 {
            self.with(ino, |e| e.pages = true);
        }
    }

    /// Whether an open of `ino` may keep pages: only if the kernel may hold
    /// some and their version is known.
    pub fn at_open(&self, ino: u64) -> AtOpen {
        let map = self.map.lock().expect("page versions lock");
        match map.get(&ino) {
            Some(e) if e.pages && e.known.is_some() => AtOpen::Check,
            _ => AtOpen::Drop,
        }
    }

    /// An open of `ino` is answered; `current` is the home's version if it
    /// was asked ([`AtOpen::Check`]). Returns whether the kernel keeps the
    /// pages. When it does not, it drops them, and the pages read after are at
    /// least as new as the newest version seen before.
    pub fn opened(&self, ino: u64, current: Option<TimeNs>) -> bool {
        if self.capacity == 0 {
            return false;
        }
        self.with(ino, |e| {
            if let Some(v) = current {
                if e.pages && e.known == Some(v) {
                    return true;
                }
                e.seen = Some(v);
            }
            e.known = e.seen;
            e.pages = false;
            false
        })
    }

    /// The kernel forgot `ino`: its pages are gone.
    pub fn forget(&self, ino: u64) {
        self.map.lock().expect("page versions lock").remove(&ino);
    }

    /// Inodes followed now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().expect("page versions lock").len()
    }
}

/// Whether a write of `len` bytes at `offset` fills at least one whole page of
/// `page` bytes (the kernel marks only such pages up to date on a write).
pub fn fills_a_page(offset: u64, len: u64, page: u64) -> bool {
    let first = offset.div_ceil(page).checked_mul(page);
    first.and_then(|f| f.checked_add(page)).is_some_and(|end| end <= offset.saturating_add(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table whose inode 1 was opened at version 10 and then read.
    fn read_at_10() -> PageVersions {
        let t = PageVersions::new(16);
        t.saw(1, 10);
        open(&t, 1, 10);
        t.filled(1);
        t
    }

    /// Opens the way the adapter does; returns whether pages are kept.
    fn open(t: &PageVersions, ino: u64, home: TimeNs) -> bool {
        match t.at_open(ino) {
            AtOpen::Drop => t.opened(ino, None),
            AtOpen::Check => t.opened(ino, Some(home)),
        }
    }

    #[test]
    fn own_writes_keep_pages_and_others_changes_drop_them() {
        let t = PageVersions::new(16);
        t.saw(1, 10); // created at 10
        assert!(!open(&t, 1, 10), "nothing cached yet");
        t.changed(1, Some((10, 11)));
        t.filled(1);
        t.changed(1, Some((11, 12)));
        assert!(open(&t, 1, 12), "only this mount's writes since");
        // Another client's change: the home is past what the pages hold.
        assert!(!open(&t, 1, 13));
        t.filled(1);
        assert!(open(&t, 1, 13), "read again after the drop: current at 13");
    }

    #[test]
    fn a_change_that_did_not_start_from_the_known_version_makes_it_unknown() {
        let t = read_at_10();
        t.changed(1, Some((15, 16))); // someone changed it to 15 in between
        assert_eq!(t.at_open(1), AtOpen::Drop);
        t.changed(1, Some((16, 17)));
        assert_eq!(t.at_open(1), AtOpen::Drop, "unknown stays unknown until a drop");
        assert!(!open(&t, 1, 17));
    }

    #[test]
    fn a_failed_write_makes_it_unknown() {
        let t = read_at_10();
        t.changed(1, None);
        assert!(!open(&t, 1, 10), "the page may hold bytes the server refused");
    }

    #[test]
    fn pages_read_after_a_drop_are_as_new_as_what_was_seen_before_it() {
        let t = PageVersions::new(16);
        t.saw(1, 10);
        open(&t, 1, 10);
        t.saw(1, 20); // a stat after another client's change
        t.filled(1); // pages read: they may be at 10 or 20
                     // At the next open the home says 20: was seen only after the pages
                     // were dropped, so it is not taken as theirs.
        assert!(!open(&t, 1, 20));
        t.filled(1);
        assert!(open(&t, 1, 20));
    }

    #[test]
    fn without_pages_an_open_asks_nothing_and_forget_or_a_full_table_forgets() {
        let t = PageVersions::new(2);
        t.saw(1, 10);
        assert_eq!(t.at_open(1), AtOpen::Drop, "no pages: nothing to keep");
        open(&t, 1, 10);
        t.filled(1);
        assert_eq!(t.at_open(1), AtOpen::Check);
        t.forget(1);
        assert_eq!(t.at_open(1), AtOpen::Drop);
        for ino in 1..10 {
            t.saw(ino, 1);
        }
        assert_eq!(t.len(), 2, "bounded");
        let off = PageVersions::new(0);
        off.saw(1, 1);
        off.filled(1);
        assert!(!off.opened(1, Some(1)));
        assert_eq!(off.len(), 0);
    }

    #[test]
    fn whole_pages() {
        assert!(fills_a_page(0, 4096, 4096));
        assert!(!fills_a_page(0, 4095, 4096));
        assert!(!fills_a_page(1, 4096, 4096));
        assert!(fills_a_page(1, 8191, 4096));
        assert!(fills_a_page(4096, 1 << 20, 4096));
        assert!(!fills_a_page(u64::MAX - 10, 10, 4096));
    }
}
