//! Files this mount just created, or found without a file capability lately,
//! for the kernel's file-capability check.
//!
//! Before the first write to a file (and at every write until it learned the
//! file has no file capability), the kernel asks for the file's
//! `security.capability` extended attribute (`GETXATTR`), so that a write by an
//! unprivileged process drops it. For a file just created that is one more
//! request to the server per file written (`tar xf`, md-hard's create phase:
//! create, check, write, close).
//!
//! A successful `CREATE` always made a new inode (the server refuses a name
//! that exists), and a new inode has no extended attributes. So the check of a
//! file this mount created is answered here (`ENODATA`) while the file is new:
//! within the attribute lifetime of its creation, and only until this mount
//! sets or removes any extended attribute of it. Another client that sets a
//! file capability on it within that time (it would have to find the new name
//! and hold `CAP_SETFCAP` within a second of the create) is not seen by this
//! check, as the kernel's cached attributes of the file would not show it
//! either; after it, the check asks the server again.
//!
//! The kernel asks again before every write, not only the first (FUSE does not
//! let it remember the answer): a 1 MiB sequential writer sent a `GETXATTR` to
//! the server beside each `WRITE`, inside the inode lock that other writers of
//! the file wait on. So an answer of "none" from the server is kept too, for the
//! same lifetime: the next checks of that file within it are answered here, as
//! the kernel's cached attributes of the file would be.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::oldest::OldestFirst;

/// Files remembered at once; the oldest go first.
pub const NEW_FILES_MAX: usize = 4096;

/// The extended attribute the kernel checks before a write.
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

#[derive(Debug)]
struct Inner {
    /// When each was created or last found without a capability, and the
    /// directory it was created in.
    created: OldestFirst<(Instant, Option<u64>)>,
    /// Checks answered here since the mount started.
    answered: u64,
}

/// Files this mount created lately (module docs).
#[derive(Debug)]
pub struct NewFiles {
    inner: Mutex<Inner>,
}

impl Default for NewFiles {
    fn default() -> NewFiles {
        let inner = Inner { created: OldestFirst::new(NEW_FILES_MAX), answered: 0 };
        NewFiles { inner: Mutex::new(inner) }
    }
}

impl NewFiles {
    /// This mount created `ino` (a new inode) in directory `parent` just now.
    pub fn created(&self, ino: u64, parent: u64) {
        self.inner
            .lock()
            .expect("new files lock")
            .created
            .insert(ino, (Instant::now(), Some(parent)));
    }

    /// The server just answered that `ino` has no file capability: checks
    /// within the lifetime from now are answered here.
    pub fn lacking(&self, ino: u64) {
        let mut g = self.inner.lock().expect("new files lock");
        let parent = g.created.get(ino).and_then(|&(_, p)| p);
        g.created.insert(ino, (Instant::now(), parent));
    }

    /// The directory this mount created `ino` in, if it is among the files
    /// remembered (a hint: a rename since is not seen).
    pub fn parent(&self, ino: u64) -> Option<u64> {
        self.inner.lock().expect("new files lock").created.get(ino).and_then(|&(_, p)| p)
    }

    /// This mount changes `ino`'s extended attributes: it is not known to
    /// have none any more.
    pub fn xattrs_changed(&self, ino: u64) {
        self.inner.lock().expect("new files lock").created.remove(ino);
    }

    /// Whether `ino` is known to have no extended attribute `name`: a
    /// capability check of a file this mount created, or the server found
    /// without one, less than `lifetime` ago.
    pub fn lacks(&self, ino: u64, name: &[u8], lifetime: Duration) -> bool {
        if name != CAPABILITY_XATTR {
            return false;
        }
        let mut g = self.inner.lock().expect("new files lock");
        let new = g.created.get(ino).is_some_and(|(t, _)| t.elapsed() < lifetime);
        g.answered += u64::from(new);
        new
    }

    /// Capability checks answered here since the mount started.
    pub fn answered(&self) -> u64 {
        self.inner.lock().expect("new files lock").answered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIFE: Duration = Duration::from_secs(1);

    #[test]
    fn only_the_capability_of_a_file_just_created_and_unchanged() {
        let n = NewFiles::default();
        n.created(5, 1);
        assert_eq!((n.parent(5), n.parent(6)), (Some(1), None));
        assert!(n.lacks(5, CAPABILITY_XATTR, LIFE));
        assert!(!n.lacks(5, b"user.x", LIFE), "other names go to the server");
        assert!(!n.lacks(6, CAPABILITY_XATTR, LIFE), "not created here");
        assert!(!n.lacks(5, CAPABILITY_XATTR, Duration::ZERO), "past the lifetime");
        n.xattrs_changed(5);
        assert!(!n.lacks(5, CAPABILITY_XATTR, LIFE), "its xattrs changed here");
        assert_eq!(n.answered(), 1);
        // The server's answer of none is kept the same way.
        n.lacking(7);
        assert!(n.lacks(7, CAPABILITY_XATTR, LIFE) && n.parent(7).is_none());
        assert!(!n.lacks(7, CAPABILITY_XATTR, Duration::ZERO), "past the lifetime");
        n.xattrs_changed(7);
        assert!(!n.lacks(7, CAPABILITY_XATTR, LIFE));
    }

    #[test]
    fn the_oldest_go_first_past_the_limit() {
        let n = NewFiles::default();
        for ino in 0..NEW_FILES_MAX as u64 + 5 {
            n.created(ino, 1);
        }
        assert!(!n.lacks(4, CAPABILITY_XATTR, LIFE));
        assert!(n.lacks(5, CAPABILITY_XATTR, LIFE));
        assert!(n.inner.lock().unwrap().created.len() <= NEW_FILES_MAX);
    }
}
