//! File locks through the mount, seen by every node: the kernel hands each
//! `fcntl(2)` record lock (`F_SETLK`, `F_SETLKW`, `F_GETLK`, the `F_OFD_*`
//! forms) and each `flock(2)` to the file system (`FUSE_POSIX_LOCKS`,
//! `FUSE_FLOCK_LOCKS`), and the mount takes them at the file's home
//! ([`FileSystem::lock`]; pfs-server's `locks.rs`).
//!
//! A lock that must wait (`F_SETLKW`, `flock` without `LOCK_NB`) waits on
//! this module's thread, not on a request thread: a mount has few of those,
//! and the holder's own unlock may need one. The thread asks again after
//! a pause that doubles from 1 ms to [`RETRY_MAX`], until the lock is
//! taken, the process is gone, or a signal interrupts it (`EINTR`, through
//! the kernel's `FUSE_INTERRUPT`). At most [`WAITS_MAX`] wait at once;
//! past it a waiting lock fails with `ENOLCK`.
//!
//! A lock is also where another node's writes become visible: before an
//! unlock the mount sends what the handle wrote (`flush`, as a close
//! does), and once a lock is taken it drops the kernel's cached pages and
//! attributes of the file before answering, so a process that locks a range
//! reads what the last holder wrote there before its unlock (NFS does the
//! same at lock and unlock). The drop runs on the lock thread: it waits
//! for reads of the file in flight, which the request threads serve.
//!
//! Locks go when their owner lets go of the file, as the kernel leaves it
//! to the file system: a process's record locks on a file at the `FLUSH`
//! of its close of any descriptor of it, and a `flock` or open file
//! description lock at the `RELEASE` of the open file it was taken
//! through. A descriptor open for reading only has no `FLUSH` (the mount
//! spares it, `FOPEN_NOFLUSH`), so record locks taken through one go at its
//! open file's release, right after the last close of it. The mount
//! remembers which owners took locks on which files (at most
//! [`HELD_MAX`] pairs, past it `ENOLCK`), so a close of a file without
//! locks costs no request.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use fuser::{Errno, ReplyEmpty};
use pfs_client::FileSystem;
use pfs_core::wire::{FileLock, LockKind, LOCK_END_MAX};
use pfs_core::{FsError, InodeId};

use crate::names::Names;

/// Locks waiting at most at once.
pub const WAITS_MAX: usize = 4096;
/// (file, owner, handle) triples remembered as holding locks, at most.
pub const HELD_MAX: usize = 1 << 16;
/// Longest pause between two tries of a waiting lock.
pub const RETRY_MAX: Duration = Duration::from_millis(20);
/// Interrupts of requests not (yet) waiting remembered, at most, and how long.
const EARLY_INTERRUPTS_MAX: usize = 256;
const EARLY_INTERRUPT_TTL: Duration = Duration::from_secs(1);

/// A lock waiting for a conflict to go, or (`granted`) taken and waiting
/// for the kernel's cached pages of its file to be dropped before it is
/// answered.
struct Wait {
    granted: bool,
    unique: u64,
    ino: u64,
    owner: u64,
    lock: FileLock,
    reply: ReplyEmpty,
    next_try: Instant,
    pause: Duration,
}

#[derive(Default)]
struct Waiting {
    waits: Vec<Wait>,
    /// Interrupts that came before their request waited here.
    early: VecDeque<(u64, Instant)>,
    stop: bool,
}

/// Who holds locks taken through this mount: (owner, flock, handle) per file.
#[derive(Default)]
struct Held {
    by_ino: HashMap<u64, Vec<(u64, bool, u64)>>,
    count: usize,
}

/// What the mount learnt of files before a lock and must not use after it.
#[allow(missing_debug_implementations)]
pub struct LockSeen {
    /// The session's notifier, once mounted: drops a locked file's pages and
    /// attributes in the kernel.
    pub notifier: Arc<OnceLock<fuser::Notifier>>,
    /// The names opens check: a lock ends their trust in earlier lookups.
    pub names: Arc<Names>,
    /// The mount's count of data changes: bumped, so small files' bytes a
    /// lookup brought before the lock do not answer a read after it.
    pub data_changes: Arc<std::sync::atomic::AtomicU64>,
}

struct Shared {
    fs: Arc<dyn FileSystem>,
    seen: LockSeen,
    waiting: Mutex<Waiting>,
    wake: Condvar,
    held: Mutex<Held>,
}

/// The mount's file locks.
pub struct FileLocks {
    shared: Arc<Shared>,
    /// The waiting thread, once started (`None`: it could not be).
    waiter: OnceLock<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for FileLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLocks").finish_non_exhaustive()
    }
}

/// The lock a kernel request describes, or `EINVAL`.
pub fn kernel_lock(
    typ: i32,
    start: u64,
    end: u64,
    pid: u32,
    flock: bool,
) -> Result<FileLock, Errno> {
    let kind = match typ {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return Err(Errno::EINVAL),
    };
    if start > end || end > LOCK_END_MAX {
        return Err(Errno::EINVAL);
    }
    Ok(FileLock { kind, flock, start, end, pid })
}

/// The kernel's lock type for `kind`.
pub fn kernel_type(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

/// Whether process `pid` still runs (not gone, not a zombie: its files are
/// closed once it is one).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// The errno of a lock request that failed: a file another client removed
/// (its inode gone at its home) is `ESTALE`, as its reads and writes are.
fn errno(e: &FsError) -> Errno {
    match e {
        FsError::NotFound => Errno::ESTALE,
        other => Errno::from_i32(other.errno()),
    }
}

impl FileLocks {
    /// Locks over `fs`; what a lock taken makes stale is in `seen`. The
    /// waiting thread starts with the first lock taken.
    pub fn new(fs: Arc<dyn FileSystem>, seen: LockSeen) -> FileLocks {
        let shared = Arc::new(Shared {
            fs,
            seen,
            waiting: Mutex::default(),
            wake: Condvar::new(),
            held: Mutex::default(),
        });
        FileLocks { shared, waiter: OnceLock::new() }
    }

    /// `F_GETLK`: the lock of another owner that conflicts with `lock`, or
    /// `None`.
    pub fn test(&self, ino: u64, owner: u64, lock: FileLock) -> Result<Option<FileLock>, Errno> {
        if lock.kind == LockKind::Unlock {
            return Err(Errno::EINVAL);
        }
        self.shared.fs.lock(InodeId(ino), owner, lock, true).map_err(|e| errno(&e))
    }

    /// `F_SETLK`, `F_SETLKW`, `flock`: takes or gives back `lock`; a
    /// conflict fails with `EAGAIN`, or with `sleep` waits on the waiting
    /// thread, which answers `reply` (request `unique`).
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &self,
        unique: u64,
        ino: u64,
        fh: u64,
        owner: u64,
        lock: FileLock,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        if lock.kind != LockKind::Unlock && !self.shared.note_held(ino, owner, lock.flock, fh) {
            log::warn!("file locks: {HELD_MAX} owners hold locks through this mount; ENOLCK");
            return reply.error(Errno::ENOLCK);
        }
        if lock.kind == LockKind::Unlock {
            // What was written through this handle reaches the servers before
            // the range is given back, so the next holder reads it (NFS
            // writes back before an unlock too).
            if let Err(e) = self.shared.fs.flush(InodeId(ino), pfs_core::FileHandle(fh)) {
                log::debug!("writes of {ino} before its unlock: {e}");
            }
        }
        match self.shared.fs.lock(InodeId(ino), owner, lock, false) {
            Ok(None) if lock.kind == LockKind::Unlock => reply.ok(),
            // Answered once the kernel's pages of the file are dropped, off
            // this request thread (dropping a page waits for a read of it
            // in flight, which a request thread must be free to serve).
            Ok(None) => self.wait(Wait {
                granted: true,
                unique,
                ino,
                owner,
                lock,
                reply,
                next_try: Instant::now(),
                pause: Duration::ZERO,
            }),
            Ok(Some(_)) if !sleep => reply.error(Errno::EAGAIN),
            Ok(Some(c)) => {
                log::debug!(
                    "lock of {ino} {}..={} by pid {} waits for {:?} {}..={}",
                    lock.start,
                    lock.end,
                    lock.pid,
                    c.kind,
                    c.start,
                    c.end
                );
                let pause = Duration::from_millis(1);
                let w = Wait {
                    granted: false,
                    unique,
                    ino,
                    owner,
                    lock,
                    reply,
                    next_try: Instant::now() + pause,
                    pause,
                };
                self.wait(w);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn wait(&self, w: Wait) {
        let mut waiting = self.shared.waiting.lock().expect("lock waits lock");
        let now = Instant::now();
        waiting.early.retain(|&(_, at)| now.duration_since(at) < EARLY_INTERRUPT_TTL);
        // (A lock already taken is answered as taken: its holder must know.)
        if let Some(i) = waiting.early.iter().position(|&(u, _)| u == w.unique && !w.granted) {
            waiting.early.remove(i);
            drop(waiting);
            return w.reply.error(Errno::EINTR);
        }
        if waiting.waits.len() >= WAITS_MAX && !w.granted {
            drop(waiting);
            log::warn!("file locks: {WAITS_MAX} locks wait already; ENOLCK");
            return w.reply.error(Errno::ENOLCK);
        }
        waiting.waits.push(w);
        drop(waiting);
        self.shared.wake.notify_one();
        let started = self.waiter.get_or_init(|| {
            let shared = Arc::clone(&self.shared);
            let spawned = std::thread::Builder::new()
                .name("pfs-locks".into())
                .spawn(move || shared.wait_loop());
            spawned.map_err(|e| log::error!("cannot start the lock waiting thread: {e}")).ok()
        });
        if started.is_none() {
            // No thread to wait on: what waits is answered here, a lock
            // taken as taken, one that must wait with ENOLCK.
            let waits =
                std::mem::take(&mut self.shared.waiting.lock().expect("lock waits lock").waits);
            for w in waits {
                if w.granted {
                    self.shared.drop_pages(w.ino);
                    w.reply.ok();
                } else {
                    w.reply.error(Errno::ENOLCK);
                }
            }
        }
    }

    /// The kernel interrupts request `unique` (its process got a signal): a
    /// lock it waits for stops waiting, with `EINTR`.
    pub fn interrupt(&self, unique: u64) {
        let mut waiting = self.shared.waiting.lock().expect("lock waits lock");
        if let Some(i) = waiting.waits.iter().position(|w| w.unique == unique && !w.granted) {
            let w = waiting.waits.swap_remove(i);
            drop(waiting);
            log::debug!("lock of {} by pid {} interrupted", w.ino, w.lock.pid);
            return w.reply.error(Errno::EINTR);
        }
        // Perhaps before its request got here (the kernel sends interrupts
        // first), or after it was answered (then forgotten in a second).
        if waiting.early.len() >= EARLY_INTERRUPTS_MAX {
            waiting.early.pop_front();
        }
        waiting.early.push_back((unique, Instant::now()));
    }

    /// A close of a descriptor of `ino` by `owner` (`FLUSH`): its record
    /// locks on the file go.
    pub fn flushed(&self, ino: u64, owner: u64) {
        let had = {
            let mut held = self.shared.held.lock().expect("held locks lock");
            held.take(ino, |&(o, flock, _)| o == owner && !flock)
        };
        if !had.is_empty() {
            self.shared.unlock_all(ino, owner, false);
        }
    }

    /// The last close of open file `fh` of `ino` (`RELEASE`): the locks
    /// taken through it go (`flock` and open file description locks, and
    /// record locks of descriptors open for reading, which have no `FLUSH`).
    pub fn released(&self, ino: u64, fh: u64) {
        let mut had = {
            let mut held = self.shared.held.lock().expect("held locks lock");
            held.take(ino, |&(_, _, h)| h == fh)
        };
        had.sort_unstable();
        had.dedup_by_key(|&mut (o, flock, _)| (o, flock));
        for (owner, flock, _) in had {
            self.shared.unlock_all(ino, owner, flock);
        }
    }

    /// Stops the waiting thread; locks still waiting fail with `EINTR`.
    pub fn stop(&self) {
        let waits = {
            let mut waiting = self.shared.waiting.lock().expect("lock waits lock");
            waiting.stop = true;
            std::mem::take(&mut waiting.waits)
        };
        self.shared.wake.notify_all();
        for w in waits {
            w.reply.error(Errno::EINTR);
        }
    }
}

impl Held {
    /// Removes and returns `ino`'s entries that `which` picks.
    fn take(
        &mut self,
        ino: u64,
        which: impl Fn(&(u64, bool, u64)) -> bool,
    ) -> Vec<(u64, bool, u64)> {
        let Some(v) = self.by_ino.get_mut(&ino) else {
            return Vec::new();
        };
        let (taken, kept): (Vec<_>, Vec<_>) = v.drain(..).partition(|e| which(e));
        self.count -= taken.len();
        if kept.is_empty() {
            self.by_ino.remove(&ino);
        } else {
            *v = kept;
        }
        taken
    }
}

impl Shared {
    /// Remembers that `owner` may hold locks on `ino` taken through `fh`;
    /// `false` when the table is full.
    fn note_held(&self, ino: u64, owner: u64, flock: bool, fh: u64) -> bool {
        let mut held = self.held.lock().expect("held locks lock");
        let e = (owner, flock, fh);
        if held.by_ino.get(&ino).is_some_and(|v| v.contains(&e)) {
            return true;
        }
        if held.count >= HELD_MAX {
            return false;
        }
        held.count += 1;
        held.by_ino.entry(ino).or_default().push(e);
        true
    }

    fn unlock_all(&self, ino: u64, owner: u64, flock: bool) {
        let all = FileLock::released_all(flock);
        if let Err(e) = self.fs.lock(InodeId(ino), owner, all, false) {
            log::warn!(
                "releasing the locks of owner {owner:#x} on {ino}: {e}; the server releases \
                 them when this client's lease runs out"
            );
        }
    }

    /// The waiting thread: tries each waiting lock when its pause is over.
    fn wait_loop(&self) {
        let mut waiting = self.waiting.lock().expect("lock waits lock");
        loop {
            if waiting.stop {
                return;
            }
            let now = Instant::now();
            let Some(i) =
                waiting.waits.iter().enumerate().min_by_key(|(_, w)| w.next_try).map(|(i, _)| i)
            else {
                waiting = self.wake.wait(waiting).expect("lock waits lock");
                continue;
            };
            let at = waiting.waits[i].next_try;
            if at > now {
                waiting = self.wake.wait_timeout(waiting, at - now).expect("lock waits lock").0;
                continue;
            }
            let w = waiting.waits.swap_remove(i);
            drop(waiting);
            let again = self.try_once(w);
            waiting = self.waiting.lock().expect("lock waits lock");
            if let Some(mut w) = again {
                // Interrupted while it was being tried (not in the list then).
                if let Some(k) = waiting.early.iter().position(|&(u, _)| u == w.unique) {
                    waiting.early.remove(k);
                    w.reply.error(Errno::EINTR);
                    continue;
                }
                w.pause = (w.pause * 2).min(RETRY_MAX);
                w.next_try = Instant::now() + w.pause;
                waiting.waits.push(w);
            }
        }
    }

    /// Drops the kernel's cached pages and attributes of `ino`: a lock
    /// just taken may guard bytes another node wrote and gave back since
    /// they were read here (NFS drops them at a lock too). Opens from now
    /// on check the names looked up before ([`Names::lock_taken`]), and a
    /// small file's bytes its open's lookup brought answer no read.
    fn drop_pages(&self, ino: u64) {
        self.seen.names.lock_taken();
        self.seen.data_changes.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if let Some(n) = self.seen.notifier.get() {
            if let Err(e) = n.inval_inode(fuser::INodeNo(ino), 0, 0) {
                log::debug!("kernel invalidation of {ino} at its lock: {e}");
            }
        }
    }

    /// Tries a waiting lock once: `Some` when it must wait on.
    fn try_once(&self, w: Wait) -> Option<Wait> {
        if w.granted {
            self.drop_pages(w.ino);
            w.reply.ok();
            return None;
        }
        if !alive(w.lock.pid) {
            log::debug!("lock of {} by pid {}: the process is gone", w.ino, w.lock.pid);
            w.reply.error(Errno::EINTR);
            return None;
        }
        match self.fs.lock(InodeId(w.ino), w.owner, w.lock, false) {
            Ok(None) => {
                // A process killed while it waited closed its files before
                // this grant (their FLUSH found nothing to release).
                if !alive(w.lock.pid) {
                    self.unlock_all(w.ino, w.owner, w.lock.flock);
                }
                log::debug!("lock of {} by pid {} taken after a wait", w.ino, w.lock.pid);
                self.drop_pages(w.ino);
                w.reply.ok();
                None
            }
            Ok(Some(_)) => Some(w),
            Err(e) => {
                w.reply.error(errno(&e));
                None
            }
        }
    }
}
