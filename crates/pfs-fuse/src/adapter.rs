//! The `fuser` file system: each kernel request becomes one call on a
//! [`FileSystem`] (the cluster client, or [`MemFs`](crate::MemFs)).
//!
//! Every op checks its input first and replies early; errors map to errno in one
//! place ([`errno`]). The adapter keeps no inode table of its own: pfs inode
//! numbers are the FUSE node ids (the root is 1 in both), so `forget` has nothing
//! to drop. It does keep one bounded table: the open directory streams.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileHandle as KHandle, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use pfs_client::ahead::StatAhead;
use pfs_client::api::{DirListing, HIDDEN_PREFIX, READDIR_BATCH};
use pfs_client::FileSystem;
use pfs_core::wire::{RenameFlags, XattrSetMode};
use pfs_core::{
    FileAttr, FileHandle, FileType, FsError, InodeId, SetAttr, TimeNs, XATTR_ACL_ACCESS,
};

use crate::dirattrs::DirAttrs;
use crate::gate::{Gate, Pass};
use crate::locks::{kernel_lock, kernel_type, FileLocks, LockSeen};
use crate::names::Names;
use crate::newfiles::{NewFiles, CAPABILITY_XATTR};
use crate::pages::{fills_a_page, AtOpen, PageVersions, PAGE_VERSIONS_MAX};
use crate::small::{SmallFiles, Wanted};

/// The page size the kernel caches file data in (a larger one only makes an
/// open check the version more often).
const KERNEL_PAGE: u64 = 4096;

/// Largest write the kernel sends in one request.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Most directories open at once through one mount; past it `opendir` fails
/// with `ENFILE`.
pub const OPEN_DIRS_MAX: usize = 1 << 16;

/// Kernel cache lifetimes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CacheTtl {
    /// How long the kernel may keep a name -> inode entry.
    pub entry: Duration,
    /// How long the kernel may keep an inode's attributes.
    pub attr: Duration,
    /// How long the kernel may remember that a name does not exist (0: it asks
    /// again each time, as libfuse's default).
    pub negative: Duration,
}

impl CacheTtl {
    /// The one lifetime of replies that carry a name and attributes under a
    /// single one (`CREATE`, `READDIRPLUS` entries in fuser): the shorter, so
    /// neither is kept longer than asked.
    pub fn both(&self) -> Duration {
        self.entry.min(self.attr)
    }
}

impl Default for CacheTtl {
    fn default() -> Self {
        CacheTtl {
            entry: Duration::from_secs(1),
            attr: Duration::from_secs(1),
            negative: Duration::ZERO,
        }
    }
}

/// The attributes sent with a negative entry (node 0): the kernel reads none of
/// them.
fn negative_attr() -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: SystemTime::UNIX_EPOCH,
        mtime: SystemTime::UNIX_EPOCH,
        ctime: SystemTime::UNIX_EPOCH,
        crtime: SystemTime::UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The errno the kernel gets for `e`. A request that timed out is an I/O error to
/// the application (`EIO`), as for a disk that stopped answering.
pub fn errno(e: &FsError) -> Errno {
    match e {
        FsError::TimedOut => Errno::EIO,
        other => Errno::from_i32(other.errno()),
    }
}

fn time(ns: TimeNs) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_ns(t: SystemTime) -> TimeNs {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_nanos().min(i64::MAX as u128) as i64),
    }
}

fn time_or_now(t: TimeOrNow) -> TimeNs {
    match t {
        TimeOrNow::SpecificTime(t) => time_ns(t),
        TimeOrNow::Now => time_ns(SystemTime::now()),
    }
}

fn kind(k: FileType) -> fuser::FileType {
    match k {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::Socket => fuser::FileType::Socket,
    }
}

/// The kernel's view of `a`.
pub fn kernel_attr(a: &FileAttr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        // Tools size their buffers by st_blksize: one file block.
        blksize: pfs_client::cluster::BLOCK_SIZE_BYTES as u32,
        flags: 0,
    }
}

/// Where a directory stream is: a window of the listing, indexed from `base`.
///
/// Kernel offsets: 1 is ".", 2 is "..", and `3 + i` the listing's entry `i`; a
/// readdir at offset `k` continues with what follows cookie `k`. The window only
/// moves forward; a seek backwards restarts the listing from its first name.
#[derive(Debug, Default)]
struct DirStream {
    /// Listing index of `window[0]`.
    base: u64,
    /// Entries, each with when its batch was asked for and the mount's count of
    /// file changes then (its attributes are used only while both still hold).
    window: VecDeque<(DirListing, Instant, u64)>,
    /// Name to resume after when the window runs out.
    last: Option<Vec<u8>>,
    eof: bool,
}

impl DirStream {
    /// The entry at listing index `i`, fetching as needed (with the children's
    /// attributes when `plus`); `None` past the end. Its attributes are dropped
    /// once they are older than `fresh_for` or this mount changed a file since
    /// they were asked for (`changes` moved): a window lives as long as the
    /// directory stays open, and the kernel would take them as current.
    fn entry(
        &mut self,
        fs: &dyn FileSystem,
        dir: InodeId,
        i: u64,
        plus: bool,
        changes: &AtomicU64,
        fresh_for: Duration,
    ) -> Result<Option<DirListing>, FsError> {
        if i < self.base {
            *self = DirStream::default();
        }
        // Bounded: each round either drops an entry or fetches a batch, and the
        // listing is finite.
        loop {
            while self.base < i && !self.window.is_empty() {
                self.window.pop_front();
                self.base += 1;
            }
            if self.base == i {
                if let Some((e, at, seen)) = self.window.front() {
                    let mut e = e.clone();
                    if at.elapsed() >= fresh_for || changes.load(Ordering::Acquire) != *seen {
                        e.attr = None;
                    }
                    return Ok(Some(e));
                }
            }
            if self.eof {
                return Ok(None);
            }
            let (at, seen) = (Instant::now(), changes.load(Ordering::Acquire));
            let batch = if plus {
                fs.readdir_plus(dir, self.last.as_deref(), READDIR_BATCH)?
            } else {
                fs.readdir(dir, self.last.as_deref(), READDIR_BATCH)?
            };
            match batch.last() {
                None => self.eof = true,
                Some(last) => self.last = Some(last.name.clone()),
            }
            let kept = batch.into_iter().filter(|e| !is_hidden_name(&e.name));
            self.window.extend(kept.map(|e| (e, at, seen)));
        }
    }
}

/// The FUSE side of a mount.
pub struct PfsFuse {
    fs: Arc<dyn FileSystem>,
    ttl: CacheTtl,
    dirs: Mutex<HashMap<u64, Arc<Mutex<DirStream>>>>,
    next_dir: AtomicU64,
    open: Mutex<OpenFiles>,
    /// Opens pass together, and so do unlinks while nothing is open; an
    /// operation that may remove an open file passes alone, so no open slips
    /// between its check and its change ([`Gate`]).
    gate: Gate,
    /// Changes to files' data or attributes made through this mount (writes,
    /// setattr, fallocate, links, closes): listing attributes asked for before
    /// the last one are not used.
    file_changes: AtomicU64,
    exit_when_unmounted: bool,
    writeback_cache: bool,
    /// Ask for `readdirplus` on every directory read, not the kernel's guess.
    readdirplus_always: bool,
    /// The io_uring counters, once the session has them (logged at unmount).
    pub(crate) uring_stats: Arc<OnceLock<Arc<fuser::UringStats>>>,
    /// The session's notifier, once mounted: tells the kernel of attributes
    /// a request changed that its reply does not carry.
    pub(crate) notifier: Arc<OnceLock<fuser::Notifier>>,
    /// Directory attributes for the kernel's permission checks (see
    /// [`DirAttrs`]); shared with the invalidation callback.
    pub(crate) dir_attrs: Arc<DirAttrs>,
    /// Directories' attributes fetched by the batch for the lookups that
    /// follow ([`StatAhead`]); shared with the invalidation callback.
    pub(crate) ahead: Arc<StatAhead>,
    /// Which files' kernel pages are current, by version ([`PageVersions`]);
    /// shared with the client's version observer.
    pages: Arc<PageVersions>,
    /// Let an open keep the kernel's pages when their version is current
    /// (`-o page_cache=keep`, the default; off with the writeback cache).
    keep_pages: bool,
    /// Small files' bytes that came with their lookup ([`crate::small`]), and
    /// whether lookups ask for them (`-o small_files=lookup`).
    small: SmallFiles,
    small_by_lookup: bool,
    /// Changes to files' data made through this mount (writes, truncates,
    /// fallocate): bytes a lookup brought before the last one are not used.
    data_changes: Arc<AtomicU64>,
    /// Files this mount just created, whose capability check before a write
    /// needs no request ([`crate::newfiles`]).
    new_files: NewFiles,
    /// Handles opened with `O_APPEND` (without the writeback cache): the
    /// kernel sends their writes uncached (`FOPEN_DIRECT_IO`) at the end it
    /// knows, and each is written at the end the file's home knows
    /// ([`FileSystem::append`]), so appends of several nodes never land on
    /// each other. Bounded by the handles open.
    appending: Mutex<HashSet<u64>>,
    /// The name the kernel last learnt of each file under, checked at open
    /// ([`Names`]).
    names: Arc<Names>,
    /// File locks taken at the files' homes, and the locks that wait
    /// ([`FileLocks`]), when the file system keeps them for every client.
    locks: FileLocks,
}

/// Files this mount has open, so an unlinked but open file keeps its data.
///
/// POSIX lets a process read and write a file after its last name is gone; the
/// file system frees it at the last close. The adapter renames such a file to a
/// hidden name (`.pfs-hidden-<ino>`, as libfuse does with `.fuse_hidden`) and
/// unlinks that at the last release. It only knows this mount's opens: a file
/// another client holds open is freed at unlink.
///
/// A file replaced by a rename is hidden too, and removed only once the kernel
/// also forgets its inode (`forget`): a process whose path walk reached the old
/// inode just before the rename still opens it (the old file, as POSIX allows),
/// where a removed inode would fail that open.
#[derive(Debug, Default)]
struct OpenFiles {
    /// Open handles per inode.
    count: HashMap<u64, u32>,
    /// Inodes without a visible name that this mount keeps alive.
    hidden: HashMap<u64, Hidden>,
}

/// An inode kept under a hidden name.
#[derive(Clone, Debug)]
struct Hidden {
    parent: InodeId,
    name: Vec<u8>,
    /// The kernel may still reach it (replaced by a rename, not yet forgotten).
    kernel_holds: bool,
}

impl std::fmt::Debug for PfsFuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PfsFuse").field("ttl", &self.ttl).finish_non_exhaustive()
    }
}

impl PfsFuse {
    /// A FUSE file system over `fs`.
    pub fn new(fs: Arc<dyn FileSystem>, ttl: CacheTtl) -> PfsFuse {
        let pages = Arc::new(PageVersions::new(PAGE_VERSIONS_MAX));
        let observed = Arc::clone(&pages);
        fs.set_version_observer(Box::new(move |ino, change| observed.changed(ino.0, change)));
        let notifier = Arc::new(OnceLock::new());
        let names = Arc::new(Names::default());
        let data_changes = Arc::new(AtomicU64::new(0));
        let seen = LockSeen {
            notifier: Arc::clone(&notifier),
            names: Arc::clone(&names),
            data_changes: Arc::clone(&data_changes),
        };
        PfsFuse {
            locks: FileLocks::new(Arc::clone(&fs), seen),
            fs,
            ttl,
            dirs: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
            open: Mutex::new(OpenFiles::default()),
            gate: Gate::default(),
            file_changes: AtomicU64::new(0),
            exit_when_unmounted: false,
            writeback_cache: false,
            readdirplus_always: true,
            uring_stats: Arc::new(OnceLock::new()),
            notifier,
            dir_attrs: Arc::new(DirAttrs::new(ttl.attr)),
            ahead: Arc::new(StatAhead::new(ttl.attr.min(ttl.entry), true)),
            pages,
            keep_pages: true,
            small: SmallFiles::default(),
            small_by_lookup: true,
            data_changes,
            new_files: NewFiles::default(),
            appending: Mutex::new(HashSet::new()),
            names,
        }
    }

    /// Whether a lookup may bring a small file's bytes for its next read
    /// (`true`, the default; [`crate::small`]).
    pub fn small_by_lookup(mut self, yes: bool) -> PfsFuse {
        self.small_by_lookup = yes;
        self
    }

    /// Whether lookups that follow each other in a directory are answered
    /// from batches of its attributes (`true`, the default; [`pfs_client::ahead`]).
    pub fn statahead(mut self, yes: bool) -> PfsFuse {
        self.ahead = Arc::new(StatAhead::new(self.ttl.attr.min(self.ttl.entry), yes));
        self
    }

    /// Notes a change to a file's data through this mount (before and after
    /// it: bytes a lookup brought while it ran are not used either).
    fn data_changed(&self) {
        self.data_changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Resolves `name` in `parent` for process `pid`; with `ask`, keeps the
    /// file's bytes for the open that may follow when the lookup brought them.
    fn lookup_keeping(
        &self,
        parent: InodeId,
        name: &[u8],
        pid: u32,
        ask: bool,
    ) -> Result<FileAttr, FsError> {
        if !ask {
            return self.fs.lookup(parent, name);
        }
        self.small.asked();
        let changes = self.data_changes.load(Ordering::Acquire);
        let (attr, data) = self.fs.lookup_data(parent, name)?;
        if let Some(data) = data {
            self.small.keep(attr.ino.0, data, pid, changes);
        }
        Ok(attr)
    }

    /// Whether an open keeps the kernel's cached pages of a file that did not
    /// change since they were read or written (`true`, the default), or drops
    /// them at every open. The writeback cache turns it off.
    pub fn keep_pages(mut self, yes: bool) -> PfsFuse {
        self.keep_pages = yes;
        self
    }

    /// Every directory read with the children's attributes (`true`, the
    /// default: one request for a batch of names instead of a `LOOKUP` for each
    /// that is then used, as `rm -r`, `ls -l`, `find`, `du` and `tar` do), or only
    /// when the kernel guesses they will be used (`FUSE_READDIRPLUS_AUTO`: a
    /// plain listing of a large directory whose inodes are not cached costs
    /// less).
    pub fn readdirplus_always(mut self, yes: bool) -> PfsFuse {
        self.readdirplus_always = yes;
        self
    }

    /// Asks the kernel for its writeback cache: writes gather in the page cache
    /// and reach the file system as whole pages at writeback, `fsync` or close
    /// (which flushes them first), instead of one request per `write(2)`.
    pub fn writeback_cache(mut self, yes: bool) -> PfsFuse {
        self.writeback_cache = yes;
        self
    }

    /// Ends the process (exit 0) once the kernel reports the file system unmounted
    /// ([`MountConfig::exit_when_unmounted`](crate::MountConfig)).
    pub fn exit_when_unmounted(mut self, yes: bool) -> PfsFuse {
        self.exit_when_unmounted = yes;
        self
    }

    /// The errno for `e` from a call that names inode `ino`, not a path: an
    /// inode that is gone is `ESTALE`, so the kernel looks the path up again
    /// (`LOOKUP_REVAL`). This keeps a rename over a file atomic to readers: a
    /// name the kernel still maps to the replaced inode is looked up anew and
    /// finds the new file, never `ENOENT`. Statahead's entry for the inode
    /// goes first, so that lookup reaches the server: a batch fetched before
    /// another client replaced the name answered it with the gone inode again,
    /// and the kernel gave up with `ESTALE` (`readlink` of a symbolic link
    /// made anew by another client, found by stress-ng's symlink stressor).
    fn stale(&self, ino: u64, e: &FsError) -> Errno {
        match e {
            FsError::NotFound => {
                self.ahead.forget_ino(ino);
                Errno::ESTALE
            }
            other => errno(other),
        }
    }

    /// A file in `dir` (named `name`, for a lookup) was found by a request to
    /// the server; fetches the directory's next statahead batch if one is due
    /// ([`StatAhead`]). Called after the reply: the process goes on while this
    /// thread fetches.
    fn statahead_missed(&self, dir: u64, name: Option<&[u8]>) {
        let changes = || self.file_changes.load(Ordering::Acquire);
        self.ahead.after_miss(&*self.fs, dir, name, &changes);
    }

    /// Answers a lookup that went to the server.
    fn lookup_reply(&self, reply: ReplyEntry, r: Result<FileAttr, FsError>) {
        match r {
            // Node 0 with a lifetime: the kernel keeps a negative entry.
            Err(FsError::NotFound) if !self.ttl.negative.is_zero() => reply.entry_with_ttls(
                &Duration::ZERO,
                &self.ttl.negative,
                &negative_attr(),
                Generation(0),
            ),
            r => self.entry(reply, r),
        }
    }

    fn entry(&self, reply: ReplyEntry, r: Result<FileAttr, FsError>) {
        if let Ok(a) = &r {
            self.dir_attrs.put(a);
            self.saw(a);
        }
        match r {
            Ok(a) => reply.entry_with_ttls(
                &self.ttl.attr,
                &self.ttl.entry,
                &kernel_attr(&self.visible(a)),
                Generation(0),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// After a change to `name` in `parent`: the directory's kept attributes
    /// follow it (`links`: a subdirectory made or removed); a failed change may
    /// have done part of it, so they are dropped. The name's statahead entry goes.
    fn dir_changed<T>(&self, parent: INodeNo, name: &[u8], r: &Result<T, FsError>, links: i32) {
        self.ahead.forget_name(parent.0, name);
        match r {
            Ok(_) => self.dir_attrs.changed(parent.0, links),
            Err(_) => self.dir_attrs.forget(parent.0),
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Notes a regular file's version from an attribute reply.
    fn saw(&self, a: &FileAttr) {
        if a.kind == FileType::Regular {
            self.pages.saw(a.ino.0, a.ctime_ns);
        }
    }

    /// Whether the kernel keeps its pages of `ino` at this open: asks the home
    /// for the version when they may be current ([`PageVersions`]).
    fn keep_at_open(&self, ino: u64) -> bool {
        if !self.keep_pages {
            return false;
        }
        let current = match self.pages.at_open(ino) {
            AtOpen::Drop => None,
            AtOpen::Check => self.fs.getattr(InodeId(ino)).ok().map(|a| a.ctime_ns),
        };
        self.pages.opened(ino, current)
    }

    /// Notes a change to a file's data or attributes through this mount (after
    /// it, successful or not): listings asked for before it lose their attributes.
    fn file_changed(&self) {
        self.file_changes.fetch_add(1, Ordering::AcqRel);
    }

    /// Notes a handle just opened with `flags`: one opened with `O_APPEND`
    /// (without the writeback cache) appends at the home's end, and its pages
    /// must not be cached where the kernel thinks its writes went
    /// (`FOPEN_DIRECT_IO`, returned for the open's reply).
    fn opened_for_appends(&self, fh: u64, flags: i32) -> FopenFlags {
        if flags & libc::O_APPEND == 0 || self.writeback_cache {
            return FopenFlags::empty();
        }
        self.appending.lock().expect("appending lock").insert(fh);
        FopenFlags::FOPEN_DIRECT_IO
    }

    /// The kernel learns of `a` as `name` in `parent` (`looked_up`: the
    /// server's answer to its lookup, just now).
    fn named(&self, a: &FileAttr, parent: u64, name: &[u8], looked_up: bool) {
        if a.kind == FileType::Regular {
            self.names.found(a.ino.0, parent, name, looked_up);
        }
    }

    /// Before an open of `ino`: `ESTALE` when the name the kernel reached it
    /// by leads elsewhere now (another node replaced or removed the file),
    /// so the kernel walks the path again ([`Names`]). A file this mount
    /// keeps under a hidden name (removed or replaced here while open) is
    /// alive whatever its name. (Not one it merely has open: its release
    /// comes after `close(2)` returned, so a reopen by name could still find
    /// it counted and skip the check.) The
    /// lookup asks for a small file's bytes as the kernel's lookups do
    /// ([`crate::small`]): the read that follows this open (process `pid`'s)
    /// takes them, so the check costs no request more than the read did.
    fn name_leads_here(&self, ino: u64, pid: u32) -> Result<(), Errno> {
        let Some((parent, name)) = self.names.to_check(ino) else {
            log::trace!("open of {ino}: trusts the lookup just before it");
            return Ok(());
        };
        if self.open.lock().expect("open files lock").hidden.contains_key(&ino) {
            return Ok(());
        }
        let ask = self.small_by_lookup && self.small.wanted().ask;
        match self.lookup_keeping(InodeId(parent), &name, pid, ask) {
            Ok(a) if a.ino.0 == ino => {
                log::trace!(
                    "open of {ino}: its name {:?} leads here",
                    name.escape_ascii().to_string()
                );
                Ok(())
            }
            Ok(_) | Err(FsError::NotFound) => {
                log::debug!(
                    "open of {ino}: its name {:?} leads elsewhere now",
                    name.escape_ascii().to_string()
                );
                // The kernel walks the path again, with a lookup that must
                // reach the server: not the statahead entry that may have
                // answered the last one.
                self.ahead.forget_name(parent, &name);
                Err(Errno::ESTALE)
            }
            Err(e) => Err(errno(&e)),
        }
    }

    /// A request changed `ino`'s mode without a reply that carries it (an
    /// access ACL, an append that cleared set-ID bits): the kernel's
    /// permission checks would use the old mode for `attr_timeout`, so it is
    /// told now, and the kept directory attributes go.
    fn mode_changed(&self, ino: INodeNo) {
        self.dir_attrs.forget(ino.0);
        if let Some(n) = self.notifier.get() {
            // Attributes only (a negative offset): no page is dropped, no
            // page lock taken, so a request thread may send it.
            if let Err(e) = n.inval_inode(ino, -1, 0) {
                log::debug!("kernel invalidation of {}'s attributes: {e}", ino.0);
            }
        }
    }

    /// Whether this mount has `ino` open.
    fn is_open(&self, ino: u64) -> bool {
        self.open.lock().expect("open files lock").count.contains_key(&ino)
    }

    fn opened(&self, ino: INodeNo) {
        *self.open.lock().expect("open files lock").count.entry(ino.0).or_insert(0) += 1;
    }

    /// Drops one open of `ino`; at the last, removes its hidden name if it has one.
    fn closed(&self, ino: INodeNo) {
        let maybe_last = {
            let mut o = self.open.lock().expect("open files lock");
            let is_hidden = o.hidden.contains_key(&ino.0);
            match o.count.get_mut(&ino.0) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) if is_hidden => true,
                Some(_) => {
                    o.count.remove(&ino.0);
                    false
                }
                None => false,
            }
        };
        if maybe_last {
            self.remove_hidden(ino.0, |o| match o.count.get_mut(&ino.0) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    o.count.remove(&ino.0);
                }
            });
        }
    }

    /// Applies `change` to the table, then removes `ino`'s hidden name if nothing
    /// keeps it any more (no open handle, the kernel forgot it). Holds the gate,
    /// so no open slips in between the check and the unlink.
    fn remove_hidden(&self, ino: u64, change: impl FnOnce(&mut OpenFiles)) {
        let _gate = self.gate.enter(Pass::Alone);
        let gone = {
            let mut o = self.open.lock().expect("open files lock");
            change(&mut o);
            let kept =
                o.count.contains_key(&ino) || o.hidden.get(&ino).is_some_and(|h| h.kernel_holds);
            if kept {
                None
            } else {
                o.hidden.remove(&ino)
            }
        };
        if let Some(h) = gone {
            if let Err(e) = self.fs.unlink(h.parent, &h.name) {
                log::warn!("removing {}: {e}", String::from_utf8_lossy(&h.name));
            }
        }
    }

    /// Unlink, keeping an open file's data until its last close.
    fn unlink_or_hide(&self, parent: InodeId, name: &[u8]) -> Result<(), FsError> {
        {
            // Nothing open on this mount (and the gate keeps opens out): no
            // file to keep, and no lookup to pay for; other such unlinks go on.
            let _gate = self.gate.enter(Pass::Remove);
            if self.open.lock().expect("open files lock").count.is_empty() {
                return self.fs.unlink(parent, name);
            }
        }
        let _gate = self.gate.enter(Pass::Alone);
        let attr = self.fs.lookup(parent, name)?;
        let mut o = self.open.lock().expect("open files lock");
        // Only the last name of an open file is kept (hidden); other names are
        // just removed, and one already hidden keeps the file alive.
        if attr.kind == FileType::Directory
            || !o.count.contains_key(&attr.ino.0)
            || attr.nlink > 1
            || o.hidden.contains_key(&attr.ino.0)
        {
            drop(o);
            return self.fs.unlink(parent, name);
        }
        let hidden = hidden_name(attr.ino);
        self.fs.rename(parent, name, parent, &hidden, RenameFlags::empty())?;
        o.hidden.insert(attr.ino.0, Hidden { parent, name: hidden, kernel_holds: false });
        Ok(())
    }

    /// Rename. One that replaces a file keeps that file alive while this mount
    /// has it open or the kernel may still reach it, and the target name must
    /// never be missing: exchange the two names atomically, then hide the old
    /// file under a hidden name (see [`OpenFiles`]).
    fn rename_keeping_replaced(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<(), FsError> {
        if flags != RenameFlags::empty() {
            return self.fs.rename(parent, name, new_parent, new_name, flags);
        }
        let _gate = self.gate.enter(Pass::Alone);
        let target = match self.fs.lookup(new_parent, new_name) {
            // A file with other names lives on through them.
            Ok(t) if t.kind != FileType::Directory && t.nlink <= 1 => t,
            _ => return self.fs.rename(parent, name, new_parent, new_name, flags),
        };
        let source = self.fs.lookup(parent, name)?;
        let held = self.open.lock().expect("open files lock").hidden.contains_key(&target.ino.0);
        if source.ino == target.ino || source.kind == FileType::Directory || held {
            // Same file (POSIX: do nothing), or a directory onto a file (an error).
            return self.fs.rename(parent, name, new_parent, new_name, flags);
        }
        self.fs.rename(parent, name, new_parent, new_name, RenameFlags::EXCHANGE)?;
        let hidden = hidden_name(target.ino);
        self.fs.rename(parent, name, parent, &hidden, RenameFlags::empty())?;
        let h = Hidden { parent, name: hidden, kernel_holds: true };
        self.open.lock().expect("open files lock").hidden.insert(target.ino.0, h);
        Ok(())
    }

    /// `a` as this mount's processes must see it: a file unlinked while open
    /// has no names left, so `st_nlink` is 0.
    fn visible(&self, mut a: FileAttr) -> FileAttr {
        if a.kind == FileType::Regular
            && self.open.lock().expect("open files lock").hidden.contains_key(&a.ino.0)
        {
            a.nlink = 0;
        }
        a
    }

    /// Rmdir; a directory whose only entries are files this mount hides (unlinked
    /// while open) is empty to its users: those move to the root first.
    fn rmdir_unhiding(&self, parent: InodeId, name: &[u8]) -> Result<(), FsError> {
        // The gate waits out a last close that is removing a hidden name in this
        // directory right now (the kernel sends that release after close(2) has
        // returned, so it can arrive with or after this rmdir): its entry has left
        // the table, its name not yet the directory.
        let _gate = self.gate.enter(Pass::Alone);
        match self.fs.rmdir(parent, name) {
            Err(FsError::NotEmpty) => {}
            other => return other,
        }
        let dir = self.fs.lookup(parent, name)?.ino;
        let mut o = self.open.lock().expect("open files lock");
        let inside: Vec<u64> =
            o.hidden.iter().filter(|(_, h)| h.parent == dir).map(|(&ino, _)| ino).collect();
        if inside.is_empty() {
            return Err(FsError::NotEmpty);
        }
        for ino in inside {
            let h = o.hidden.get_mut(&ino).expect("listed above");
            self.fs.rename(dir, &h.name, InodeId::ROOT, &h.name, RenameFlags::empty())?;
            h.parent = InodeId::ROOT;
        }
        drop(o);
        self.fs.rmdir(parent, name)
    }

    fn dir(&self, fh: KHandle) -> Option<Arc<Mutex<DirStream>>> {
        self.dirs.lock().expect("dirs lock").get(&fh.0).cloned()
    }

    fn dir_entry(
        &self,
        dir: InodeId,
        fh: KHandle,
        i: u64,
        plus: bool,
    ) -> Result<Option<DirListing>, FsError> {
        let stream =
            self.dir(fh).ok_or_else(|| FsError::Invalid("not an open directory".into()))?;
        let mut stream = stream.lock().expect("dir stream lock");
        stream.entry(&*self.fs, dir, i, plus, &self.file_changes, self.ttl.attr)
    }
}

/// Whether `name` is such a hidden name: listings leave them out.
fn is_hidden_name(name: &[u8]) -> bool {
    name.starts_with(HIDDEN_PREFIX)
}

/// The hidden name of `ino` while it is unlinked but open.
fn hidden_name(ino: InodeId) -> Vec<u8> {
    let mut name = HIDDEN_PREFIX.to_vec();
    name.extend_from_slice(ino.0.to_string().as_bytes());
    name
}

/// `name` as bytes, or `EINVAL` for an empty one.
fn name_of(name: &OsStr) -> Result<&[u8], Errno> {
    let b = name.as_bytes();
    if b.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(b)
}

fn rename_flags(flags: fuser::RenameFlags) -> Result<RenameFlags, Errno> {
    RenameFlags::from_bits(flags.bits()).ok_or(Errno::EINVAL)
}

impl fuser::Filesystem for PfsFuse {
    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        // Its pages went with it.
        self.pages.forget(ino.0);
        // (Its name stays: a FORGET gives back some of the kernel's lookups,
        // not always all of them. The kernel answers a LOOKUP that revalidated
        // a name and found another inode with one for it, and still holds the
        // inode the name's next lookup gives it. An entry of an inode the
        // kernel really dropped costs room until the table is cleared.)
        // The kernel sends this when it drops the inode: a file replaced by a
        // rename waited for it.
        let held = self.open.lock().expect("open files lock").hidden.contains_key(&ino.0);
        if held {
            self.remove_hidden(ino.0, |o| {
                if let Some(h) = o.hidden.get_mut(&ino.0) {
                    h.kernel_holds = false;
                }
            });
        }
    }

    fn destroy(&mut self) {
        self.locks.stop();
        // Unmounted: nothing can reach the hidden files any more.
        let hidden: Vec<Hidden> =
            self.open.lock().expect("open files lock").hidden.drain().map(|(_, h)| h).collect();
        for h in hidden {
            if let Err(e) = self.fs.unlink(h.parent, &h.name) {
                log::warn!("removing {} at unmount: {e}", String::from_utf8_lossy(&h.name));
            }
        }
        if let Some(u) = self.uring_stats.get() {
            let (forgets, reads) = u.forgets();
            log::info!(
                "FUSE over io_uring served {} requests ({} large reads by bulk threads); \
                 /dev/fuse took {forgets} forgets in {reads} reads",
                u.requests(),
                u.bulk_reads()
            );
        }
        log::info!(
            "{} capability checks of files answered without a request (created here, or \
             found without a capability less than the attribute lifetime ago)",
            self.new_files.answered()
        );
        let (fetches, kept, answered) = self.ahead.counts();
        log::info!(
            "{answered} lookups answered by statahead ({fetches} batches fetched, {kept} \
             entries kept)"
        );
        let (asked, brought, armed, served) = self.small.counts();
        log::info!(
            "{served} small files' first reads answered from their lookup ({asked} lookups \
             asked for the bytes, {brought} brought them, {armed} opens followed in time)"
        );
        if self.exit_when_unmounted {
            // Returning would let fuser umount the mountpoint path once more, and
            // that unmounts whatever was mounted there since `umount` returned.
            log::info!("unmounted; exiting");
            log::logger().flush();
            std::process::exit(0);
        }
    }

    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_WRITE_BYTES) {
            log::warn!("kernel allows writes of at most {max} bytes");
            let _ = config.set_max_write(max);
        }
        let _ = config.set_max_readahead(MAX_WRITE_BYTES);
        let _ = config.set_max_background(64);
        // Each is optional: an older kernel without one still mounts.
        for cap in [InitFlags::FUSE_PARALLEL_DIROPS, InitFlags::FUSE_DO_READDIRPLUS] {
            if config.add_capabilities(cap).is_err() {
                log::info!("kernel lacks {cap:?}");
            }
        }
        if !self.readdirplus_always
            && config.add_capabilities(InitFlags::FUSE_READDIRPLUS_AUTO).is_err()
        {
            log::info!("kernel lacks FUSE_READDIRPLUS_AUTO: every directory read is plus");
        }
        // Locks every node sees, when the file system keeps them (MemFs
        // leaves them to the kernel, as before).
        if self.fs.keeps_locks() {
            for cap in [InitFlags::FUSE_POSIX_LOCKS, InitFlags::FUSE_FLOCK_LOCKS] {
                if config.add_capabilities(cap).is_err() {
                    log::warn!("kernel lacks {cap:?}: those locks stay on this node");
                }
            }
        }
        if self.writeback_cache && config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE).is_err()
        {
            log::warn!("the kernel has no writeback cache for FUSE: writes go through");
        }
        Ok(())
    }

    fn before_request(&self, req: &Request) {
        // Inline rounds run while several threads' requests interleave
        // (`pfs_net::inline::only_when_interleaved`, set by `pfs up`).
        pfs_net::inline::note_caller(req.pid());
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let wanted = if self.small_by_lookup { self.small.wanted() } else { Wanted::default() };
        // Statahead, unless the server's reply would carry bytes that the read
        // after it takes (a read phase of small files: one request either way,
        // and this one saves the batches).
        let changes = self.file_changes.load(Ordering::Acquire);
        let ahead = if wanted.first { None } else { self.ahead.get(parent.0, name, changes) };
        if let Some((a, left)) = ahead {
            // Not a file this mount has open: its size may count writes the
            // server does not have yet.
            if !self.is_open(a.ino.0) {
                self.saw(&a);
                self.named(&a, parent.0, name, false);
                let a = kernel_attr(&self.visible(a));
                return reply.entry_with_ttls(&left, &left, &a, Generation(0));
            }
        }
        let r = self.lookup_keeping(InodeId(parent.0), name, req.pid(), wanted.ask);
        if let Ok(a) = &r {
            log::trace!(
                "lookup {:?} in {} from the server: {}",
                name.escape_ascii().to_string(),
                parent.0,
                a.ino
            );
            self.named(a, parent.0, name, true);
        }
        let found = r.is_ok();
        self.lookup_reply(reply, r);
        // A lookup sent for a small file's bytes is not one statahead missed.
        if found && !wanted.first {
            self.statahead_missed(parent.0, Some(name));
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<KHandle>, reply: ReplyAttr) {
        if let Some((a, left)) = self.dir_attrs.get(ino.0) {
            return reply.attr(&left, &kernel_attr(&a));
        }
        // A file whose name the kernel holds but whose attributes ran out (or
        // a write of this mount dropped them): statahead may have them.
        let changes = self.file_changes.load(Ordering::Acquire);
        let listed_in = match self.ahead.get_ino(ino.0, changes) {
            Ok((a, left)) if !self.is_open(ino.0) => {
                self.saw(&a);
                return reply.attr(&left, &kernel_attr(&self.visible(a)));
            }
            Ok(_) => None,
            Err(dir) => dir,
        };
        match self.fs.getattr(InodeId(ino.0)) {
            Ok(a) => {
                self.dir_attrs.put(&a);
                self.saw(&a);
                reply.attr(&self.ttl.attr, &kernel_attr(&self.visible(a)));
                // The file's directory, when known: a batch listed it (and
                // ran out), or this mount created it.
                if a.kind == FileType::Regular {
                    if let Some(parent) = listed_in.or_else(|| self.new_files.parent(ino.0)) {
                        self.statahead_missed(parent, None);
                    }
                }
            }
            Err(e) => reply.error(self.stale(ino.0, &e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<KHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        log::trace!("setattr ino {} size {size:?} fh {:?}", ino.0, _fh.map(|f| f.0));
        let set = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime_ns: atime.map(time_or_now),
            mtime_ns: mtime.map(time_or_now),
        };
        self.dir_attrs.forget(ino.0);
        self.data_changed();
        let r = self.fs.setattr(InodeId(ino.0), &set);
        self.data_changed();
        self.file_changed();
        match r {
            Ok(a) => {
                self.dir_attrs.put(&a);
                self.saw(&a);
                reply.attr(&self.ttl.attr, &kernel_attr(&self.visible(a)))
            }
            Err(e) => reply.error(self.stale(ino.0, &e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(InodeId(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(self.stale(ino.0, &e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        // The kernel already applied the umask to `mode`.
        let Some(k) = FileType::from_mode(mode) else { return reply.error(Errno::EINVAL) };
        if k == FileType::Directory || k == FileType::Symlink {
            return reply.error(Errno::EINVAL);
        }
        let perm = (mode & 0o7777) as u16;
        let r = self.fs.mknod(InodeId(parent.0), name, k, perm, req.uid(), req.gid(), rdev);
        self.dir_changed(parent, name, &r, 0);
        self.entry(reply, r);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let perm = (mode & 0o7777) as u16;
        let r = self.fs.mkdir(InodeId(parent.0), name, perm, req.uid(), req.gid());
        self.dir_changed(parent, name, &r, 1);
        self.entry(reply, r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let r = self.unlink_or_hide(InodeId(parent.0), name);
        self.dir_changed(parent, name, &r, 0);
        Self::empty(reply, r);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let r = self.rmdir_unhiding(InodeId(parent.0), name);
        self.dir_changed(parent, name, &r, -1);
        Self::empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = match name_of(link_name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let target = target.as_os_str().as_bytes();
        let r = self.fs.symlink(InodeId(parent.0), name, target, req.uid(), req.gid());
        self.dir_changed(parent, name, &r, 0);
        self.entry(reply, r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let (name, newname) = match (name_of(name), name_of(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return reply.error(e),
        };
        // RENAME_WHITEOUT (overlayfs) is not supported: EINVAL, as rename(2) says.
        let flags = match rename_flags(flags) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        let r = self.rename_keeping_replaced(
            InodeId(parent.0),
            name,
            InodeId(newparent.0),
            newname,
            flags,
        );
        self.ahead.forget_name(parent.0, name);
        self.ahead.forget_name(newparent.0, newname);
        // Link counts move when a directory moves: fetch both anew.
        self.dir_attrs.forget(parent.0);
        self.dir_attrs.forget(newparent.0);
        Self::empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let name = match name_of(newname) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let r = self.fs.link(InodeId(ino.0), InodeId(newparent.0), name);
        if let Ok(a) = &r {
            self.named(a, newparent.0, name, false);
        }
        self.file_changed();
        self.dir_changed(newparent, name, &r, 0);
        self.entry(reply, r);
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _gate = self.gate.enter(Pass::Open);
        if let Err(e) = self.name_leads_here(ino.0, req.pid()) {
            return reply.error(e);
        }
        match self.fs.open(InodeId(ino.0), flags.0 as u32) {
            // Without FOPEN_KEEP_CACHE the kernel drops cached pages at open, so
            // a file another client closed is read fresh (close-to-open); with
            // it only when the home says nothing changed since they were read.
            Ok(fh) => {
                let keep = self.keep_at_open(ino.0);
                log::trace!("open ino {} fh {} keep_cache {keep}", ino.0, fh.0);
                if self.small_by_lookup {
                    self.small.opened(ino.0, req.pid(), fh.0);
                }
                self.opened(ino);
                let mut open_flags =
                    if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
                if flags.0 & libc::O_ACCMODE == libc::O_RDONLY {
                    // Nothing to wait for or publish at its close: no FLUSH.
                    open_flags |= FopenFlags::FOPEN_NOFLUSH;
                }
                open_flags |= self.opened_for_appends(fh.0, flags.0);
                reply.opened(KHandle(fh.0), open_flags)
            }
            Err(e) => reply.error(self.stale(ino.0, &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let changes = self.data_changes.load(Ordering::Acquire);
        if let Some(data) = self.small.take(fh.0, changes) {
            // The bytes its lookup brought: no request to the server.
            let from = (offset as usize).min(data.len());
            let to = from.saturating_add(size as usize).min(data.len());
            log::trace!("read ino {} fh {} at {offset:#x} from its lookup", ino.0, fh.0);
            self.pages.filled(ino.0);
            return reply.data(&data[from..to]);
        }
        // The reply goes to the kernel straight from the buffer the server's
        // reply arrived in.
        let mut reply = Some(reply);
        let mut answer = |d: &[u8]| {
            log::trace!("read ino {} fh {} at {offset:#x} +{size:#x}: {:#x}", ino.0, fh.0, d.len());
            self.pages.filled(ino.0);
            if let Some(r) = reply.take() {
                r.data(d);
            }
        };
        let result = self.fs.read_with(InodeId(ino.0), FileHandle(fh.0), offset, size, &mut answer);
        if let (Err(e), Some(r)) = (result, reply.take()) {
            // A file removed (by another node) after its open: `ESTALE`, as
            // NFS gives it.
            r.error(self.stale(ino.0, &e));
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        log::trace!(
            "write ino {} fh {} at {offset:#x} +{:#x} first {:?}",
            ino.0,
            fh.0,
            data.len(),
            &data[..data.len().min(4)]
        );
        if fills_a_page(offset, data.len() as u64, KERNEL_PAGE) {
            // Before the write is sent: its reply may move the version first.
            self.pages.filled(ino.0);
        }
        self.data_changed();
        let append = flags.0 & libc::O_APPEND != 0
            && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE)
            && self.appending.lock().expect("appending lock").contains(&fh.0);
        let r = if append {
            // Where the home's end is, not the kernel's: the kernel's size
            // misses other nodes' appends for up to `attr_timeout`.
            let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
            let r = self.fs.append(InodeId(ino.0), FileHandle(fh.0), data, kill);
            if kill {
                self.mode_changed(ino);
            }
            if let Ok((at, _)) = r {
                log::trace!("append ino {} fh {} landed at {at:#x}", ino.0, fh.0);
            }
            r.map(|(_, n)| n)
        } else {
            self.fs.write(InodeId(ino.0), FileHandle(fh.0), offset, data)
        };
        self.data_changed();
        self.file_changed();
        match r {
            Ok(n) => reply.written(n),
            // The file was removed (by another node) after its open.
            Err(e) => reply.error(self.stale(ino.0, &e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        log::trace!("flush ino {} fh {}", ino.0, fh.0);
        let r = self.fs.flush(InodeId(ino.0), FileHandle(fh.0));
        // A close: the closing process's record locks on the file go, after
        // its writes reached the servers (the next holder reads them).
        self.locks.flushed(ino.0, lock_owner.0);
        Self::empty(reply, r);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        log::trace!("release ino {} fh {}", ino.0, fh.0);
        self.small.released(fh.0);
        if flags.0 & libc::O_APPEND != 0 {
            self.appending.lock().expect("appending lock").remove(&fh.0);
        }
        let r = self.fs.release(InodeId(ino.0), FileHandle(fh.0));
        // Its locks go once what it wrote is out (`release` sends it).
        self.locks.released(ino.0, fh.0);
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            // Published now: a size the listing's attributes may not have.
            // (A handle open for reading wrote nothing; while a handle that
            // wrote is open, its file is looked up, not taken from a listing.)
            self.file_changed();
        }
        self.closed(ino);
        Self::empty(reply, r);
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, fh: KHandle, datasync: bool, reply: ReplyEmpty) {
        Self::empty(reply, self.fs.fsync(InodeId(ino.0), FileHandle(fh.0), datasync));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.getattr(InodeId(ino.0)) {
            Ok(a) if a.kind != FileType::Directory => return reply.error(Errno::ENOTDIR),
            Ok(_) => {}
            Err(e) => return reply.error(errno(&e)),
        }
        let mut dirs = self.dirs.lock().expect("dirs lock");
        if dirs.len() >= OPEN_DIRS_MAX {
            log::warn!("{OPEN_DIRS_MAX} directories open: opendir refused with ENFILE");
            return reply.error(Errno::ENFILE);
        }
        let fh = self.next_dir.fetch_add(1, Ordering::Relaxed);
        dirs.insert(fh, Arc::new(Mutex::new(DirStream::default())));
        reply.opened(KHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let dir = InodeId(ino.0);
        let mut k = offset;
        // Bounded by the reply buffer: `add` says when it is full.
        loop {
            let (eino, kind, name): (u64, fuser::FileType, Vec<u8>) = match k {
                0 => (ino.0, fuser::FileType::Directory, b".".to_vec()),
                1 => (ino.0, fuser::FileType::Directory, b"..".to_vec()),
                _ => match self.dir_entry(dir, fh, k - 2, false) {
                    Ok(Some(e)) => (e.ino.0, self::kind(e.kind), e.name),
                    Ok(None) => break,
                    Err(e) => return reply.error(errno(&e)),
                },
            };
            if reply.add(INodeNo(eino), k + 1, kind, OsStr::from_bytes(&name)) {
                break;
            }
            k += 1;
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let dir = InodeId(ino.0);
        let mut k = offset;
        loop {
            let (name, attr) = match k {
                0 | 1 => {
                    // "." and "..": the kernel takes no reference on these.
                    let a = match self.fs.getattr(dir) {
                        Ok(a) => a,
                        Err(e) => return reply.error(errno(&e)),
                    };
                    (if k == 0 { b".".to_vec() } else { b"..".to_vec() }, a)
                }
                _ => match self.dir_entry(dir, fh, k - 2, true) {
                    // The listing's attributes, unless this mount has the file
                    // open: a lookup counts its own writes in the size.
                    Ok(Some(DirListing { name, attr: Some(a), .. })) if !self.is_open(a.ino.0) => {
                        self.saw(&a);
                        (name, self.visible(a))
                    }
                    Ok(Some(e)) => match self.fs.lookup(dir, &e.name) {
                        Ok(a) => {
                            self.saw(&a);
                            (e.name, a)
                        }
                        // Removed since the listing was read: skip it.
                        Err(FsError::NotFound) => {
                            k += 1;
                            continue;
                        }
                        Err(e) => return reply.error(errno(&e)),
                    },
                    Ok(None) => break,
                    Err(e) => return reply.error(errno(&e)),
                },
            };
            if k >= 2 {
                self.named(&attr, dir.0, &name, false);
            }
            let full = reply.add(
                INodeNo(attr.ino.0),
                k + 1,
                OsStr::from_bytes(&name),
                &self.ttl.both(),
                &kernel_attr(&attr),
                Generation(0),
            );
            if full {
                break;
            }
            k += 1;
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: KHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().expect("dirs lock").remove(&fh.0);
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: KHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // No ioctls: programs probe with them (Python's isatty sends TCGETS on
        // every open file), so answer as a regular file on ext4 does, quietly.
        reply.error(Errno::ENOTTY);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(reply, self.fs.fsyncdir(InodeId(ino.0), FileHandle(fh.0), datasync));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_free,
                s.files,
                s.files_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        if position != 0 {
            return reply.error(Errno::EINVAL);
        }
        let mode = match flags {
            0 => XattrSetMode::Any,
            libc::XATTR_CREATE => XattrSetMode::Create,
            libc::XATTR_REPLACE => XattrSetMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.new_files.xattrs_changed(ino.0);
        let r = self.fs.setxattr(InodeId(ino.0), name, value, mode);
        // The inode's ctime moved.
        self.file_changed();
        if r.is_ok() && name == XATTR_ACL_ACCESS {
            // The ACL set the mode (pfs-store `shard/acl.rs`). The kernel
            // marks only the ctime stale after a set it passed through.
            self.mode_changed(ino);
        }
        Self::empty(reply, r);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        if self.new_files.lacks(ino.0, name, self.ttl.attr) {
            // The kernel's capability check before a write to a file this
            // mount just created: a new inode has no extended attributes.
            return reply.error(Errno::ENODATA);
        }
        match self.fs.getxattr(InodeId(ino.0), name) {
            Ok(v) => xattr_reply(reply, &v, size),
            Err(e) => {
                let e = errno(&e);
                if e == Errno::ENODATA && name == CAPABILITY_XATTR {
                    // The kernel asks again before each write: keep the answer.
                    self.new_files.lacking(ino.0);
                }
                reply.error(e)
            }
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.listxattr(InodeId(ino.0)) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                xattr_reply(reply, &list, size);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.new_files.xattrs_changed(ino.0);
        let r = self.fs.removexattr(InodeId(ino.0), name);
        self.file_changed();
        Self::empty(reply, r);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Permission bits are checked by the kernel (`default_permissions`); this
        // only answers whether the inode exists.
        Self::empty(reply, self.fs.getattr(InodeId(ino.0)).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = match name_of(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let perm = (mode & 0o7777) as u16;
        let _gate = self.gate.enter(Pass::Open);
        let r = self.fs.create(InodeId(parent.0), name, perm, req.uid(), req.gid(), flags as u32);
        self.ahead.forget_name(parent.0, name);
        match r {
            Ok((a, fh)) => {
                log::trace!("create {} ino {} fh {}", String::from_utf8_lossy(name), a.ino, fh.0);
                self.dir_attrs.changed(parent.0, 0);
                self.new_files.created(a.ino.0, parent.0);
                self.named(&a, parent.0, name, false);
                self.opened(INodeNo(a.ino.0));
                // A new file (or one the kernel drops the pages of: no
                // FOPEN_KEEP_CACHE): pages written from here on are at least
                // as new as the create.
                self.saw(&a);
                self.pages.opened(a.ino.0, None);
                reply.created(
                    &self.ttl.both(),
                    &kernel_attr(&a),
                    Generation(0),
                    KHandle(fh.0),
                    self.opened_for_appends(fh.0, flags),
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getlk(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: KHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let lock = match kernel_lock(typ, start, end, pid, false) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        match self.locks.test(ino.0, lock_owner.0, lock) {
            Ok(Some(c)) => reply.locked(c.start, c.end, kernel_type(c.kind), c.pid),
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(e),
        }
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: KHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let lock = match kernel_lock(typ, start, end, pid, flock) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        log::trace!(
            "setlk ino {} owner {:#x} {:?} {start}..={end} pid {pid} sleep {sleep} flock {flock}",
            ino.0,
            lock_owner.0,
            lock.kind
        );
        if lock.kind != pfs_core::wire::LockKind::Unlock {
            // Lookups after the lock go to the servers, not to a statahead
            // batch fetched before it (SQLite looks for its journal).
            self.ahead.forget_all();
        }
        self.locks.set(req.unique().0, ino.0, fh.0, lock_owner.0, lock, sleep, reply);
    }

    fn interrupt(&self, _req: &Request, unique: u64) {
        self.locks.interrupt(unique);
    }

    /// `SEEK_DATA`/`SEEK_HOLE`: not the file system's. `ENOSYS` makes the
    /// kernel answer them itself from the size it knows, once and for all
    /// (every byte is data, the only hole is past the end, as libpfs_preload
    /// answers); fuser's default said the same with a warning in the log.
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: KHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// `copy_file_range`: `ENOSYS` makes the kernel copy through reads and
    /// writes of its own (a splice), once and for all; fuser's default said
    /// the same with a warning in the log.
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: KHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: KHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: KHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let keep_size = match mode {
            0 => false,
            libc::FALLOC_FL_KEEP_SIZE => true,
            // Punching holes, zeroing and collapsing ranges are not supported.
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        self.data_changed();
        let r = self.fs.fallocate(InodeId(ino.0), FileHandle(fh.0), offset, length, keep_size);
        self.data_changed();
        self.file_changed();
        Self::empty(reply, r);
    }
}

fn xattr_reply(reply: ReplyXattr, value: &[u8], size: u32) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if value.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}
