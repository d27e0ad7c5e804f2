//! File locks of pfs files, taken at the file's home as the mount takes
//! them (`FileSystem::lock`), so a process through the library and one
//! through a FUSE mount on another node see each other's: `fcntl` record
//! locks (`F_SETLK`, `F_SETLKW`, `F_GETLK` and the `F_OFD_*` forms),
//! `flock(2)` and `lockf(3)`.
//!
//! Owners, as Linux has them: a process's record locks belong to the
//! process (its id), open file description locks and `flock` locks to the
//! description. A process's record locks on a file go at its close of any
//! descriptor of it, a description's at its last close, everything at exit
//! (`ops::flush_all_at_exit`). A waiting lock asks again after a pause that
//! doubles from 1 ms to 20 ms; a signal ends the wait with `EINTR`.
//!
//! As through the mount, a lock orders data: an unlock first sends what the
//! description wrote, and after a lock is taken nothing the process learnt
//! of files before it is used (`ops::lock_taken`).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use pfs_client::FileSystem;
use pfs_core::wire::{FileLock, LockKind, LOCK_END_MAX};
use pfs_core::InodeId;

use crate::client::{self, errno, Res};
use crate::fds::OpenFile;

/// (file, owner, flock) triples remembered as holding locks, at most; past
/// it a lock fails with `ENOLCK`.
const HELD_MAX: usize = 1 << 16;
/// Longest pause between two tries of a waiting lock.
const RETRY_MAX: Duration = Duration::from_millis(20);

/// (file, owner, whether its locks are `flock`s) that may hold locks.
type Held = HashSet<(InodeId, u64, bool)>;

/// This process's [`Held`], made at its first lock.
static HELD: Mutex<Option<Held>> = Mutex::new(None);

/// What to do with a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Take it, or fail with `EAGAIN` (`EWOULDBLOCK`).
    Try,
    /// Take it, waiting for a conflict to go.
    Wait,
    /// Only look for a conflict.
    Test,
}

/// The owner of the record locks of this process.
pub fn process_owner() -> u64 {
    u64::from(std::process::id())
}

/// The owner of a description's `flock` and open file description locks:
/// never a process id (those are below 2^22).
pub fn description_owner(f: &OpenFile) -> u64 {
    (f as *const OpenFile as u64) | 1 << 63
}

/// The lock range of `l_start`/`l_len` from `base` (`l_whence`'s point):
/// first and last byte, as `fcntl(2)` defines them (a negative length
/// reaches back; 0 runs to the end of any file).
pub fn range(base: u64, start: i64, len: i64) -> Res<(u64, u64)> {
    let first = (base as i64).checked_add(start).ok_or(libc::EOVERFLOW)?;
    let (first, last) = match len {
        0 => (first, LOCK_END_MAX as i64),
        l if l > 0 => (first, first.checked_add(l - 1).ok_or(libc::EOVERFLOW)?),
        l => (first.checked_add(l).ok_or(libc::EOVERFLOW)?, first - 1),
    };
    if first < 0 || last < first {
        return Err(libc::EINVAL);
    }
    Ok((first as u64, last as u64))
}

/// Takes, waits for, gives back or tests `lock` of `owner` on `f`: for a
/// test, the conflicting lock (or `None`).
pub fn lock(f: &OpenFile, owner: u64, lock: FileLock, mode: Mode) -> Res<Option<FileLock>> {
    let (fs, _) = client::cluster()?;
    if mode == Mode::Test {
        return fs.lock(f.ino, owner, lock, true).map_err(errno);
    }
    if lock.kind == LockKind::Unlock {
        crate::ops::flush_before_unlock(f)?;
    } else {
        note_held(f.ino, owner, lock.flock)?;
    }
    let mut pause = Duration::from_millis(1);
    loop {
        match fs.lock(f.ino, owner, lock, false).map_err(errno)? {
            None if lock.kind == LockKind::Unlock => return Ok(None),
            None => {
                crate::ops::lock_taken();
                return Ok(None);
            }
            Some(_) if mode == Mode::Try => return Err(libc::EAGAIN),
            Some(_) => {}
        }
        let ts = libc::timespec { tv_sec: 0, tv_nsec: pause.as_nanos() as libc::c_long };
        // SAFETY: nanosleep with a valid request and no remainder asked.
        if unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) } != 0 {
            // A signal's handler ran: the wait ends, as the kernel's does.
            return Err(libc::EINTR);
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}

fn note_held(ino: InodeId, owner: u64, flock: bool) -> Res<()> {
    let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
    let held = held.get_or_insert_with(HashSet::new);
    if held.len() >= HELD_MAX && !held.contains(&(ino, owner, flock)) {
        return Err(libc::ENOLCK);
    }
    held.insert((ino, owner, flock));
    Ok(())
}

/// Gives back every lock `owner` holds of its kind on `ino`, if it may hold
/// one (a close of a file without locks asks nothing).
pub fn release(ino: InodeId, owner: u64, flock: bool) {
    let had = HELD
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .is_some_and(|h| h.remove(&(ino, owner, flock)));
    if had {
        give_back(ino, owner, flock);
    }
}

fn give_back(ino: InodeId, owner: u64, flock: bool) {
    let Some((fs, _)) = client::connected() else { return };
    let all = FileLock::released_all(flock);
    // A release that fails (the server unreachable) is left to the lease:
    // the server drops the locks once this client stops renewing them.
    let _ = fs.lock(ino, owner, all, false);
}

/// At exit: every lock this process may hold goes (its lease would keep
/// them for up to the server's `lock_lease_ms` otherwise).
pub fn release_all_at_exit() {
    let held = HELD.lock().unwrap_or_else(|p| p.into_inner()).take();
    for (ino, owner, flock) in held.into_iter().flatten() {
        give_back(ino, owner, flock);
    }
}

/// In a child after `fork`: it holds none of its parent's record locks
/// (POSIX), and the shared descriptions' locks stay the parent's.
pub fn forget_in_child() {
    HELD.lock().unwrap_or_else(|p| p.into_inner()).take();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_as_fcntl_defines_them() {
        assert_eq!(range(0, 10, 5), Ok((10, 14)));
        assert_eq!(range(100, -10, 5), Ok((90, 94)), "from the offset, back");
        assert_eq!(range(0, 7, 0), Ok((7, LOCK_END_MAX)), "to the end of any file");
        assert_eq!(range(50, 0, -10), Ok((40, 49)), "a negative length reaches back");
        assert_eq!(range(0, -1, 1), Err(libc::EINVAL), "before the file's start");
        assert_eq!(range(0, 5, -10), Err(libc::EINVAL));
        assert_eq!(range(0, i64::MAX, 2), Err(libc::EOVERFLOW));
        assert!(process_owner() < 1 << 32);
    }
}
