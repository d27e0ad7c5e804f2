//! The name under which the kernel last learnt of each file, so an `OPEN` of
//! a name the kernel still holds can check that the name still leads to that
//! file.
//!
//! The kernel keeps a name for `entry_timeout` and sends `OPEN` with the
//! inode only. Another node may have replaced the file meanwhile (written a
//! new one and renamed it over, or removed it and made it again): the old
//! inode is gone, or lives on a little under a hidden name while the
//! replacing node's kernel still reaches it. An open that trusted the kernel
//! read the old file or failed its reads with `ESTALE`. So an open looks the
//! name up again, and answers `ESTALE` when it leads elsewhere: the kernel
//! then walks the path again and opens the file there now (NFS checks the
//! same at open, close-to-open). The one open that follows the server's
//! answer to the kernel's `LOOKUP` of that name at once (both halves of one
//! `open(2)`) trusts it instead: nothing more is sent. A lock taken through
//! the mount ends that trust for every lookup answered before it: a lock is
//! where processes of several nodes meet, and one that locks and then opens
//! a file another node just removed (SQLite's journal) must not open the
//! old one.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use pfs_core::hash::NumMap;

/// Most files whose name is remembered; past it the table is cleared (an
/// open of a file it forgot checks only that the inode still exists).
pub const NAMES_MAX: usize = 65_536;

/// How long after the server's answer to a lookup the open that follows it
/// trusts it.
pub const OPEN_TRUSTS_LOOKUP: Duration = Duration::from_millis(20);

/// A file's name as the kernel learnt it.
#[derive(Debug)]
struct Named {
    parent: u64,
    name: Box<[u8]>,
    /// When the server answered a lookup of it, until an open takes it.
    looked_up: Option<Instant>,
}

/// The table (module docs).
#[derive(Debug, Default)]
pub struct Names {
    map: Mutex<NumMap<u64, Named>>,
    /// Lookups answered before this are not trusted (the last lock taken).
    trust_after: Mutex<Option<Instant>>,
}

impl Names {
    /// The kernel learnt of file `ino` as `name` in `parent`: from the
    /// server's answer to its lookup just now (`looked_up`), or from a
    /// listing, a batch or a create.
    pub fn found(&self, ino: u64, parent: u64, name: &[u8], looked_up: bool) {
        let mut m = self.map.lock().expect("names lock");
        if m.len() >= NAMES_MAX && !m.contains_key(&ino) {
            m.clear();
        }
        let looked_up = looked_up.then(Instant::now);
        m.insert(ino, Named { parent, name: name.into(), looked_up });
    }

    /// At an open of `ino`: the name to check, or `None` when the open may
    /// trust the kernel (the server's lookup just now; taken by this open) or
    /// the table does not know the file.
    pub fn to_check(&self, ino: u64) -> Option<(u64, Vec<u8>)> {
        let after = *self.trust_after.lock().expect("names trust lock");
        let mut m = self.map.lock().expect("names lock");
        let n = m.get_mut(&ino)?;
        let trusted = n.looked_up.take().is_some_and(|at| {
            at.elapsed() < OPEN_TRUSTS_LOOKUP && after.is_none_or(|after| at > after)
        });
        if trusted {
            return None;
        }
        Some((n.parent, n.name.to_vec()))
    }

    /// A lock was just taken through the mount: opens check every name
    /// looked up before now.
    pub fn lock_taken(&self) {
        *self.trust_after.lock().expect("names trust lock") = Some(Instant::now());
    }

    /// Files remembered.
    pub fn len(&self) -> usize {
        self.map.lock().expect("names lock").len()
    }

    /// Whether no file is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_open_trusts_the_lookup_just_before_it() {
        let n = Names::default();
        n.found(5, 1, b"cfg", true);
        assert_eq!(n.to_check(5), None, "the open right after the lookup");
        assert_eq!(n.to_check(5), Some((1, b"cfg".to_vec())), "a second open checks");
        n.found(6, 1, b"old", true);
        std::thread::sleep(OPEN_TRUSTS_LOOKUP + Duration::from_millis(5));
        assert_eq!(n.to_check(6), Some((1, b"old".to_vec())), "too long after");
        n.found(9, 1, b"journal", true);
        n.lock_taken();
        assert_eq!(n.to_check(9), Some((1, b"journal".to_vec())), "looked up before a lock");
        n.found(9, 1, b"journal", true);
        assert_eq!(n.to_check(9), None, "looked up after it");
        n.found(7, 2, b"listed", false);
        assert_eq!(n.to_check(7), Some((2, b"listed".to_vec())), "learnt from a listing");
        assert_eq!(n.to_check(8), None, "unknown");
    }

    #[test]
    fn the_table_is_bounded() {
        let n = Names::default();
        for i in 0..NAMES_MAX as u64 + 100 {
            n.found(i, 1, b"f", false);
        }
        assert!(n.len() <= NAMES_MAX);
        assert!(!n.is_empty());
    }
}
