//! Attributes of directories, kept for the kernel's attribute lifetime.
//!
//! With `default_permissions` the kernel checks search permission on every
//! directory of a path, from the attributes it caches. A create, unlink, mkdir
//! or rmdir in a directory makes the kernel drop that directory's attributes
//! (its times and link count changed), so the next path walk through it asks
//! for them again: every create or unlink in one directory cost a `GETATTR`
//! request to the directory's home shard besides its own.
//!
//! [`DirAttrs`] answers those `GETATTR`s from the attributes the mount last got
//! for the directory, with this mount's own changes applied (times set to now, the
//! link count moved by its mkdirs and rmdirs), for what is left of the attribute
//! lifetime they were fetched with; the kernel caches them for no longer than
//! that. So a directory's attributes are never older than the kernel's own cache
//! would have kept them, and this mount sees its own changes in them. Another
//! client's change to a directory reaches this cache as it reaches the kernel's:
//! through the invalidation its dentry token brings ([`DirAttrs::forget`]), or at
//! the end of the lifetime.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pfs_core::{FileAttr, FileType, TimeNs};

/// Directories whose attributes one mount keeps at most.
pub const DIR_ATTRS_MAX: usize = 16_384;

/// Directory attributes and when they were fetched.
#[derive(Debug)]
pub struct DirAttrs {
    ttl: Duration,
    map: Mutex<HashMap<u64, (FileAttr, Instant)>>,
}

fn now_ns() -> TimeNs {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_nanos() as TimeNs
}

impl DirAttrs {
    /// A cache whose entries live `ttl` (the mount's attribute lifetime; zero
    /// keeps nothing).
    pub fn new(ttl: Duration) -> DirAttrs {
        DirAttrs { ttl, map: Mutex::new(HashMap::new()) }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (FileAttr, Instant)>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The attributes of directory `ino` and how much longer they may be used.
    pub fn get(&self, ino: u64) -> Option<(FileAttr, Duration)> {
        let mut map = self.map();
        let (a, at) = *map.get(&ino)?;
        match self.ttl.checked_sub(at.elapsed()) {
            Some(left) if !left.is_zero() => Some((a, left)),
            _ => {
                map.remove(&ino);
                None
            }
        }
    }

    /// Keeps `a` if it is a directory's, fetched just now.
    pub fn put(&self, a: &FileAttr) {
        if a.kind != FileType::Directory || self.ttl.is_zero() {
            return;
        }
        let mut map = self.map();
        if map.len() >= DIR_ATTRS_MAX && !map.contains_key(&a.ino.0) {
            let ttl = self.ttl;
            map.retain(|_, (_, at)| at.elapsed() < ttl);
            if map.len() >= DIR_ATTRS_MAX {
                map.clear();
            }
        }
        map.insert(a.ino.0, (*a, Instant::now()));
    }

    /// This mount changed directory `ino`'s entries: its times are now, and its
    /// link count moves by `links` (a subdirectory made or removed).
    pub fn changed(&self, ino: u64, links: i32) {
        if let Some((a, _)) = self.map().get_mut(&ino) {
            let now = now_ns().max(a.mtime_ns);
            a.mtime_ns = now;
            a.ctime_ns = now.max(a.ctime_ns);
            a.nlink = a.nlink.saturating_add_signed(links).max(2);
        }
    }

    /// Drops what is kept for `ino` (another client changed it, or this mount
    /// made a change it cannot apply here).
    pub fn forget(&self, ino: u64) {
        self.map().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::InodeId;

    fn dir(ino: u64) -> FileAttr {
        FileAttr {
            ino: InodeId(ino),
            kind: FileType::Directory,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            nlink: 3,
            rdev: 0,
            atime_ns: 1,
            mtime_ns: 1,
            ctime_ns: 1,
        }
    }

    #[test]
    fn directories_are_kept_for_what_is_left_of_their_lifetime() {
        let c = DirAttrs::new(Duration::from_millis(200));
        c.put(&dir(5));
        let mut file = dir(6);
        file.kind = FileType::Regular;
        c.put(&file);
        let (a, left) = c.get(5).unwrap();
        assert_eq!(a.ino, InodeId(5));
        assert!(left <= Duration::from_millis(200) && !left.is_zero());
        assert!(c.get(6).is_none(), "files are not kept");
        std::thread::sleep(Duration::from_millis(250));
        assert!(c.get(5).is_none(), "expired");
        let off = DirAttrs::new(Duration::ZERO);
        off.put(&dir(5));
        assert!(off.get(5).is_none(), "a zero lifetime keeps nothing");
    }

    #[test]
    fn own_changes_move_times_and_links_and_invalidations_drop() {
        let c = DirAttrs::new(Duration::from_secs(5));
        c.put(&dir(5));
        c.changed(5, 1);
        let (a, _) = c.get(5).unwrap();
        assert_eq!(a.nlink, 4);
        assert!(a.mtime_ns > 1 && a.ctime_ns == a.mtime_ns);
        c.changed(5, -1);
        c.changed(5, -1);
        c.changed(5, -1);
        assert_eq!(c.get(5).unwrap().0.nlink, 2, "never below a directory's two");
        c.changed(9, 1);
        assert!(c.get(9).is_none(), "a change to a directory not kept adds nothing");
        c.forget(5);
        assert!(c.get(5).is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = DirAttrs::new(Duration::from_secs(5));
        for i in 0..(DIR_ATTRS_MAX as u64 + 10) {
            c.put(&dir(i));
        }
        assert!(c.map().len() <= DIR_ATTRS_MAX);
        assert!(c.get(DIR_ATTRS_MAX as u64 + 9).is_some(), "the newest is kept");
    }
}
