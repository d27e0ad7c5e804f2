//! The file map: which descriptors are pfs files, and their open file
//! descriptions.
//!
//! A pfs descriptor is a real descriptor the kernel handed out (an `O_PATH`
//! open of `/dev/null`), so its number never collides with the kernel's; the
//! library keeps the file behind it here. `dup` gives another number for the
//! same [`OpenFile`] (shared offset and flags, as POSIX says). A call the
//! library does not intercept reaches the `O_PATH` descriptor and fails with
//! `EBADF` instead of touching another file.
//!
//! Whether a descriptor is a pfs one is a bit in a fixed bitmap, so the calls
//! every program makes on its own descriptors (`read`, `write`, `close`) cost
//! one atomic load before they go to libc.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use pfs_client::{DirListing, FileSystem};
use pfs_core::{FileAttr, FileHandle, FileType, InodeId};

use crate::client::{self, Errno, Res};
use crate::paths::AbsPath;

/// Descriptors at or above this are never pfs ones (opening one past it fails
/// with `EMFILE`).
pub const FD_MAX: usize = 1 << 16;

static BITS: [AtomicU64; FD_MAX / 64] = [const { AtomicU64::new(0) }; FD_MAX / 64];
/// Which pfs descriptors the kernel holds with `FD_CLOEXEC`: set when one is
/// made (open, `dup` and its kinds) and by `F_SETFD`, so a closed one can be
/// kept for the next open with the flag it has ([`crate::ops`], "kept
/// descriptor") without asking the kernel.
static CLOEXEC: [AtomicU64; FD_MAX / 64] = [const { AtomicU64::new(0) }; FD_MAX / 64];
static TABLE: Mutex<BTreeMap<i32, Arc<OpenFile>>> = Mutex::new(BTreeMap::new());

/// Open descriptions of regular files that may write.
static WRITERS: AtomicUsize = AtomicUsize::new(0);
/// Open descriptions of regular files (live, in the table or on their way in
/// or out of it).
static REGULARS: AtomicUsize = AtomicUsize::new(0);

/// Open descriptions of regular files that may write, in this process: while
/// there are any, `stat` does not use statahead (their writes may not be in the
/// server's attributes yet).
pub fn writers() -> usize {
    WRITERS.load(Ordering::Acquire)
}

/// A handle of the client that opened a file, and which client that was.
#[derive(Clone, Copy, Debug)]
pub struct Handle {
    /// [`client::generation`] at open.
    pub generation: u64,
    /// The client's handle.
    pub fh: FileHandle,
}

/// Where a directory listing through this description is (the entries handed
/// out so far are the description's offset, `.` and `..` included).
#[derive(Debug, Default)]
pub struct DirCursor {
    /// Entries fetched and not yet handed out.
    pub window: std::collections::VecDeque<DirListing>,
    /// Name the next fetch continues after.
    pub after: Option<Vec<u8>>,
    /// The listing ended.
    pub done: bool,
}

/// What an open file description changes as it is used.
#[derive(Debug, Default)]
pub struct FileState {
    /// The file offset.
    pub offset: u64,
    /// The client handle (regular files).
    pub handle: Option<Handle>,
    /// The listing position (directories).
    pub dir: DirCursor,
}

/// Where a read through a description found the end of its file.
#[derive(Clone, Copy, Debug)]
pub struct EofHint {
    /// The end.
    pub end: u64,
    /// The process's count of data changes when it was found.
    pub changes: u64,
    /// When.
    pub at: std::time::Instant,
}

/// A small file's bytes that came with the lookup of its open
/// ([`OpenFile::small`]).
#[derive(Debug)]
pub struct SmallBytes {
    /// The whole file, as its lookup found it.
    pub data: Vec<u8>,
    /// The process's count of data changes before the lookup was sent.
    pub changes: u64,
    /// When the lookup's reply came.
    pub at: std::time::Instant,
}

/// The attributes the lookup of an open found ([`OpenFile::looked`]).
#[derive(Clone, Copy, Debug)]
pub struct Looked {
    /// The attributes.
    pub attr: FileAttr,
    /// The process's count of data changes before the lookup was sent.
    pub changes: u64,
    /// And its count of name changes (an unlink or rename changes a file's
    /// links or times).
    pub names: u64,
    /// When the lookup's reply came.
    pub at: std::time::Instant,
}

/// An open file description of a pfs file.
#[derive(Debug)]
pub struct OpenFile {
    /// The absolute path it was opened by (for `*at` calls, `fchdir`, messages).
    pub path: AbsPath,
    /// The inode.
    pub ino: InodeId,
    /// Its type.
    pub kind: FileType,
    /// `open(2)` flags; `F_SETFL` changes `O_APPEND` and `O_NONBLOCK`.
    pub flags: AtomicI32,
    /// Offset, handle and listing position.
    pub state: Mutex<FileState>,
    /// Unlinked while open here: its hidden name (parent, name) goes at the
    /// last close.
    pub hidden: Mutex<Option<(InodeId, Vec<u8>)>>,
    /// Closed explicitly (flush done, errors reported): the drop only releases.
    pub closed: AtomicBool,
    /// The end of the file a short read found.
    pub eof_hint: Mutex<Option<EofHint>>,
    /// The bytes of a small file opened for reading, from its lookup, for the
    /// description's first read (taken by it).
    pub small: Mutex<Option<SmallBytes>>,
    /// What the lookup of the open found, for `fstat`s soon after it.
    pub looked: Mutex<Option<Looked>>,
    /// A write or `fallocate` went through it: its last close publishes a
    /// change (a description that changed nothing leaves the attributes a
    /// create returned usable).
    pub wrote: AtomicBool,
    /// What `fcntl` sets on it and nothing here acts on.
    pub kept: Mutex<FcntlKept>,
}

/// `fcntl(2)`'s owner types (`struct f_owner_ex`), which the libc crate lacks.
pub const F_OWNER_TID: i32 = 0;
pub const F_OWNER_PID: i32 = 1;
pub const F_OWNER_PGRP: i32 = 2;

/// What `fcntl` keeps for a description that the library does not act on
/// (a regular file raises no `SIGIO`): its owner (`F_SETOWN`,
/// `F_SETOWN_EX`), signal (`F_SETSIG`) and write life hint
/// (`F_SET_RW_HINT`), given back as set.
#[derive(Debug, Clone, Copy, Default)]
pub struct FcntlKept {
    /// `F_OWNER_TID`, `F_OWNER_PID` or `F_OWNER_PGRP`, and the id.
    pub owner_type: i32,
    pub owner: i32,
    pub sig: i32,
    pub write_hint: u64,
}

impl OpenFile {
    /// A description for `ino` opened with `flags` (no handle yet).
    pub fn new(path: AbsPath, ino: InodeId, kind: FileType, flags: i32) -> OpenFile {
        let f = OpenFile {
            path,
            ino,
            kind,
            flags: AtomicI32::new(flags),
            state: Mutex::new(FileState::default()),
            hidden: Mutex::new(None),
            closed: AtomicBool::new(false),
            eof_hint: Mutex::new(None),
            small: Mutex::new(None),
            looked: Mutex::new(None),
            wrote: AtomicBool::new(false),
            kept: Mutex::new(FcntlKept { owner_type: F_OWNER_PID, ..FcntlKept::default() }),
        };
        if f.may_write() {
            WRITERS.fetch_add(1, Ordering::AcqRel);
        }
        if f.kind == FileType::Regular {
            REGULARS.fetch_add(1, Ordering::AcqRel);
        }
        f
    }

    /// A regular file opened for writing (the access mode never changes).
    fn may_write(&self) -> bool {
        self.kind == FileType::Regular && self.writable()
    }

    /// The flags now.
    pub fn flags(&self) -> i32 {
        self.flags.load(Ordering::Relaxed)
    }

    /// Whether reads are allowed (not `O_WRONLY`, not `O_PATH`).
    pub fn readable(&self) -> bool {
        let f = self.flags();
        f & libc::O_PATH == 0 && f & libc::O_ACCMODE != libc::O_WRONLY
    }

    /// Whether writes are allowed (`O_WRONLY` or `O_RDWR`, not `O_PATH`).
    pub fn writable(&self) -> bool {
        let f = self.flags();
        f & libc::O_PATH == 0 && f & libc::O_ACCMODE != libc::O_RDONLY
    }

    /// The state, locked.
    pub fn state(&self) -> MutexGuard<'_, FileState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client handle of this description in the current client, opening
    /// it again after a `fork` (the child's client is a new one).
    pub fn handle(&self, fs: &dyn FileSystem, generation: u64) -> Res<FileHandle> {
        let mut st = self.state();
        match st.handle {
            Some(h) if h.generation == generation => Ok(h.fh),
            _ => {
                let fh = fs.open(self.ino, self.flags() as u32).map_err(client::errno)?;
                st.handle = Some(Handle { generation, fh });
                Ok(fh)
            }
        }
    }
}

impl Drop for OpenFile {
    /// The last descriptor of this description is gone: release its handle and
    /// remove its hidden name.
    fn drop(&mut self) {
        if self.may_write() {
            WRITERS.fetch_sub(1, Ordering::AcqRel);
        }
        if self.kind == FileType::Regular {
            REGULARS.fetch_sub(1, Ordering::AcqRel);
        }
        let handle = self.state.get_mut().map(|s| s.handle).unwrap_or(None);
        let hidden = self.hidden.get_mut().map(|h| h.take()).unwrap_or(None);
        if handle.is_none() && hidden.is_none() {
            return;
        }
        client::with_busy(|| {
            let Some((fs, generation)) = client::connected() else { return };
            if let Some(h) = handle.filter(|h| h.generation == generation) {
                if !self.closed.load(Ordering::Relaxed) {
                    let _ = fs.flush(self.ino, h.fh);
                }
                let _ = fs.release(self.ino, h.fh);
            }
            if let Some((parent, name)) = hidden {
                let _ = fs.unlink(parent, &name);
            }
        });
    }
}

fn bit(fd: i32) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < FD_MAX)?;
    Some((&BITS[i / 64], 1u64 << (i % 64)))
}

/// Notes whether pfs descriptor `fd` has `FD_CLOEXEC` in the kernel.
pub fn set_cloexec(fd: i32, on: bool) {
    if let Some(i) = usize::try_from(fd).ok().filter(|&i| i < FD_MAX) {
        let (w, b) = (&CLOEXEC[i / 64], 1u64 << (i % 64));
        if on {
            w.fetch_or(b, Ordering::Relaxed);
        } else {
            w.fetch_and(!b, Ordering::Relaxed);
        }
    }
}

/// Whether pfs descriptor `fd` has `FD_CLOEXEC` ([`set_cloexec`]).
pub fn cloexec(fd: i32) -> bool {
    usize::try_from(fd)
        .ok()
        .filter(|&i| i < FD_MAX)
        .is_some_and(|i| CLOEXEC[i / 64].load(Ordering::Relaxed) & (1u64 << (i % 64)) != 0)
}

/// Whether `fd` is a pfs descriptor.
#[inline]
pub fn is_pfs(fd: i32) -> bool {
    bit(fd).is_some_and(|(w, b)| w.load(Ordering::Acquire) & b != 0)
}

fn table() -> MutexGuard<'static, BTreeMap<i32, Arc<OpenFile>>> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The description behind pfs descriptor `fd`.
pub fn get(fd: i32) -> Option<Arc<OpenFile>> {
    if !is_pfs(fd) {
        return None;
    }
    table().get(&fd).cloned()
}

/// Makes `fd` (a descriptor just reserved) a pfs descriptor for `file`;
/// returns the description it replaced, which the caller drops outside any
/// lock.
pub fn insert(fd: i32, file: Arc<OpenFile>) -> Res<Option<Arc<OpenFile>>> {
    let (w, b) = bit(fd).ok_or(libc::EMFILE as Errno)?;
    let old = table().insert(fd, file);
    w.fetch_or(b, Ordering::Release);
    Ok(old)
}

/// Forgets pfs descriptor `fd`; returns its description.
pub fn remove(fd: i32) -> Option<Arc<OpenFile>> {
    let (w, b) = bit(fd)?;
    let mut t = table();
    w.fetch_and(!b, Ordering::Release);
    t.remove(&fd)
}

/// Every pfs descriptor and its description.
pub fn entries() -> Vec<(i32, Arc<OpenFile>)> {
    table().iter().map(|(&fd, f)| (fd, f.clone())).collect()
}

/// Whether a regular file is open (an unlink then looks the name up, to keep
/// an open file under a hidden name): a counter, not a walk of the table, so
/// an unlink costs the same with thousands of files open as with none.
pub fn any_regular() -> bool {
    REGULARS.load(Ordering::Acquire) > 0
}

/// Every open description (for the flush at exit and for unlink).
pub fn all() -> Vec<Arc<OpenFile>> {
    table().values().cloned().collect()
}

/// Holds the file map's lock across `fork`.
#[derive(Debug)]
pub struct ForkHold(#[allow(dead_code)] MutexGuard<'static, BTreeMap<i32, Arc<OpenFile>>>);

/// Before `fork`: no other thread is changing the map.
pub fn hold_for_fork() -> ForkHold {
    ForkHold(table())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_enter_and_leave_the_map() {
        let f = Arc::new(OpenFile::new(b"/pfs/a".to_vec(), InodeId(7), FileType::Regular, 0));
        assert!(!is_pfs(100));
        assert!(insert(100, f.clone()).unwrap().is_none());
        assert!(insert(101, f.clone()).unwrap().is_none());
        assert!(is_pfs(100) && is_pfs(101) && !is_pfs(102) && !is_pfs(36));
        assert_eq!(get(101).unwrap().ino, InodeId(7));
        assert!(remove(100).is_some());
        assert!(!is_pfs(100) && is_pfs(101));
        assert!(remove(100).is_none());
        assert!(remove(101).is_some());
        assert_eq!(insert(FD_MAX as i32, f.clone()).unwrap_err(), libc::EMFILE);
        assert_eq!(insert(-1, f).unwrap_err(), libc::EMFILE);
        assert!(!is_pfs(-1) && !is_pfs(FD_MAX as i32));
    }

    #[test]
    fn access_modes_decide_reads_and_writes() {
        let of = |flags| OpenFile::new(Vec::new(), InodeId(2), FileType::Regular, flags);
        assert!(of(libc::O_RDONLY).readable() && !of(libc::O_RDONLY).writable());
        assert!(!of(libc::O_WRONLY).readable() && of(libc::O_WRONLY).writable());
        assert!(of(libc::O_RDWR).readable() && of(libc::O_RDWR).writable());
        assert!(!of(libc::O_PATH).readable() && !of(libc::O_PATH).writable());
    }
}
