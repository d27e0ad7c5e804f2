//! The file operations on pfs paths and descriptors, in Rust terms: each takes
//! absolute pfs paths or open descriptions and returns a value or an errno. The
//! hooks (`hooks.rs`) only convert arguments and set `errno`.
//!
//! Paths are resolved component by component from the root with the client's
//! `lookup` (directories come from its dentry cache), following symbolic links
//! inside pfs (at most [`SYMLINKS_MAX`]). `..` is resolved lexically before that,
//! as a shell does.

use std::borrow::Cow;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pfs_client::ahead::StatAhead;
use pfs_client::api::HIDDEN_PREFIX;
use pfs_client::{Cluster, FileSystem};
use pfs_core::wire::RenameFlags;
use pfs_core::{
    FileAttr, FileHandle, FileType, FsError, FsResult, InodeId, SetAttr, StatFs, TimeNs,
};

use crate::client::{self, errno, Errno, Res};
use crate::fds::{self, EofHint, OpenFile};
use crate::paths::{self, normalize, wants_dir, AbsPath};
use crate::real::real;
use crate::{convert, limits};

/// Symbolic links one path resolution follows before `ELOOP` (Linux's 40).
pub const SYMLINKS_MAX: usize = 40;
/// Longest name (Linux's `NAME_MAX`).
const NAME_MAX: usize = 255;
/// Largest piece one read or write request carries.
const IO_MAX: usize = pfs_core::wire::MAX_IO_BYTES;

/// The connected client and the generation its handles belong to.
pub struct Fs {
    fs: &'static Cluster,
    generation: u64,
}

impl Fs {
    /// The client, connecting if needed.
    pub fn get() -> Res<Fs> {
        let (fs, generation) = client::cluster()?;
        Ok(Fs { fs, generation })
    }

    fn handle(&self, f: &OpenFile) -> Res<FileHandle> {
        f.handle(self.fs, self.generation)
    }
}

/// Where a path argument leads.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    /// A pfs path (absolute, normalized; the argument itself when it was
    /// already, as most programs pass them: no copy).
    Pfs(Cow<'a, [u8]>),
    /// Not pfs: libc gets the call as it was.
    Real,
    /// Not pfs, but relative to a pfs directory: libc gets this absolute path.
    Elsewhere(CString),
}

/// The working directory as the library sees it.
#[derive(Debug)]
struct Cwd {
    /// Read from the kernel once.
    known: bool,
    /// The directory (empty when the kernel's could not be read).
    path: AbsPath,
    /// Whether it is a pfs directory (set by `chdir` into one, or the
    /// process's own at start if under the mount).
    pfs: bool,
}

static CWD: Mutex<Cwd> = Mutex::new(Cwd { known: false, path: Vec::new(), pfs: false });
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

/// The kernel's working directory now (empty if it cannot be read).
fn kernel_cwd() -> AbsPath {
    client::with_busy(std::env::current_dir)
        .map(|d| normalize(b"/", std::os::unix::ffi::OsStrExt::as_bytes(d.as_os_str())))
        .unwrap_or_default()
}

fn cwd_state() -> std::sync::MutexGuard<'static, Cwd> {
    let mut cwd = CWD.lock().unwrap_or_else(|p| p.into_inner());
    if !cwd.known {
        cwd.known = true;
        cwd.path = kernel_cwd();
        cwd.pfs = client::config().is_some_and(|c| c.mount.inside(&cwd.path).is_some());
    }
    cwd
}

/// The working directory when it is a pfs directory.
pub fn virtual_cwd() -> Option<AbsPath> {
    let cwd = cwd_state();
    cwd.pfs.then(|| cwd.path.clone())
}

fn set_virtual_cwd(to: AbsPath) {
    let mut cwd = cwd_state();
    cwd.path = to;
    cwd.pfs = true;
}

/// Classifies path argument `path` of a call relative to `dirfd` (`AT_FDCWD`
/// or a descriptor). A pfs path keeps a trailing `/` (it must name a
/// directory: see [`wants_dir`]).
pub fn classify(dirfd: i32, path: &[u8]) -> Target<'_> {
    match classify_normalized(dirfd, path) {
        Target::Pfs(mut abs) if wants_dir(path) && !abs.ends_with(b"/") => {
            abs.to_mut().push(b'/');
            Target::Pfs(abs)
        }
        t => t,
    }
}

fn classify_normalized(dirfd: i32, path: &[u8]) -> Target<'_> {
    let Some(cfg) = client::config() else { return Target::Real };
    if path.is_empty() {
        return Target::Real;
    }
    if path[0] == b'/' {
        return match paths::classify_absolute(&cfg.mount, path) {
            paths::Absolute::Outside => Target::Real,
            paths::Absolute::Inside(abs) => Target::Pfs(abs),
            paths::Absolute::Left(abs) => CString::new(abs).map_or(Target::Real, Target::Elsewhere),
        };
    }
    let base = if dirfd == libc::AT_FDCWD {
        // Relative to a directory outside the mount, a path can still enter it
        // (`mkdir -p` walks down with chdir and relative names).
        let cwd = cwd_state();
        if cwd.path.is_empty() {
            return Target::Real;
        }
        if !cwd.pfs {
            let abs = normalize(&cwd.path, path);
            return match cfg.mount.inside(&abs) {
                Some(_) => Target::Pfs(Cow::Owned(abs)),
                None => Target::Real,
            };
        }
        cwd.path.clone()
    } else {
        match fds::get(dirfd) {
            Some(f) => f.path.clone(),
            None => return Target::Real,
        }
    };
    let abs = normalize(&base, path);
    match cfg.mount.inside(&abs) {
        Some(_) => Target::Pfs(Cow::Owned(abs)),
        None => CString::new(abs).map_or(Target::Real, Target::Elsewhere),
    }
}

/// A resolved path: its parent directory, last name and what is there.
#[derive(Debug)]
pub struct Found {
    /// The directory holding the last name (the root for the mount point).
    pub parent: InodeId,
    /// The last name (empty for the mount point).
    pub name: Name,
    /// The path after the symbolic links followed; `None`: the path walked,
    /// as given ([`Found::into_path`]).
    path: Option<AbsPath>,
    /// What the name is, `None` when it does not exist.
    pub attr: Option<FileAttr>,
    /// A small regular file's bytes, from a [`Last::Read`] lookup whose
    /// server held them in memory.
    pub data: Option<Vec<u8>>,
}

impl Found {
    /// The path after the symbolic links followed, of a walk of `abs`.
    pub fn into_path(self, mut abs: AbsPath) -> AbsPath {
        self.path.unwrap_or_else(|| {
            abs.truncate(without_trailing_slash(&abs).len());
            abs
        })
    }
}

/// A name of at most [`NAME_MAX`] bytes, kept in place: a path walk returns
/// its last name without allocating (a remove through the library made five
/// allocations for its path).
#[derive(Clone, Copy)]
pub struct Name {
    len: u8,
    bytes: [u8; NAME_MAX],
}

impl Name {
    fn new(name: &[u8]) -> Name {
        let mut n = Name { len: name.len() as u8, bytes: [0; NAME_MAX] };
        n.bytes[..name.len()].copy_from_slice(name);
        n
    }
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self))
    }
}

fn without_trailing_slash(abs: &[u8]) -> &[u8] {
    match abs {
        [rest @ .., b'/'] if !rest.is_empty() => rest,
        _ => abs,
    }
}

fn mount_rel(abs: &[u8]) -> Res<&[u8]> {
    let cfg = client::config().ok_or(libc::EIO)?;
    // A symbolic link whose target leaves the mount: not followed.
    cfg.mount.inside(abs).ok_or(libc::ENOENT)
}

/// Resolves `abs`, following symbolic links on the way and, if `follow`, in
/// the last component.
pub fn resolve(fs: &Fs, abs: &[u8], follow: bool) -> Res<Found> {
    walk(fs, abs, follow, Last::Lookup)
}

/// Resolves the directory `abs`'s last name is in (links followed), without
/// looking the last name up.
pub fn resolve_parent(fs: &Fs, abs: &[u8]) -> Res<Found> {
    walk(fs, abs, false, Last::Skip)
}

/// What a path walk does with the last name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    /// Leaves it (the parent is wanted).
    Skip,
    /// Looks it up at the server.
    Lookup,
    /// Looks it up for a `stat`: statahead may answer ([`lookup_for_stat`]).
    Stat,
    /// Looks it up for an open for reading: a small file's bytes come along
    /// ([`FileSystem::lookup_data`]) for the first read ([`read_with`]).
    Read,
}

/// Statahead's lifetime: the mount's default attribute lifetime, so a `stat`
/// here is at most as old as one through the mount.
const STATAHEAD_TTL: Duration = Duration::from_secs(1);

/// The process's statahead table ([`pfs_client::ahead`]); `PFS_STATAHEAD=off`
/// turns it off.
fn statahead() -> &'static StatAhead {
    static AHEAD: OnceLock<StatAhead> = OnceLock::new();
    AHEAD.get_or_init(|| {
        let on = std::env::var_os("PFS_STATAHEAD").is_none_or(|v| v != "off");
        StatAhead::new(STATAHEAD_TTL, on).per_inode()
    })
}

/// Looks `name` up in `dir` for a `stat` (and `lstat`, `statx`, `fstatat`):
/// from a batch of the directory's attributes when statahead holds it, as
/// the mount answers its kernel's lookups, or from the batch that starts at
/// the name when statahead has been answering the directory
/// ([`StatAhead::fetch_at`]); otherwise at the server, after which a batch
/// is fetched if the directory's misses call for one. Not while
/// this process has a file open for writing (its size may count writes the
/// server does not have yet). Opens, unlinks and the rest always ask the
/// server.
fn lookup_for_stat(fs: &Fs, dir: InodeId, name: &[u8]) -> Result<FileAttr, FsError> {
    let ahead = statahead();
    let quiet = fds::writers() == 0;
    let changes = CHANGES.load(Ordering::Acquire);
    if quiet {
        if let Some((a, _)) = ahead.get(dir.0, name, changes) {
            return Ok(a);
        }
        // A directory whose lookups statahead answers: the batch that starts
        // at this name answers it, with no lookup of its own (where listings
        // follow name order: not a bigdir over several shards).
        let now = || CHANGES.load(Ordering::Acquire);
        if fs.fs.lists_in_name_order(dir) {
            if let Some((a, _)) = ahead.fetch_at(fs.fs, dir.0, name, &now) {
                return Ok(a);
            }
        }
    }
    let a = fs.fs.lookup(dir, name)?;
    if quiet {
        ahead.after_miss(fs.fs, dir.0, Some(name), &|| CHANGES.load(Ordering::Acquire));
    }
    Ok(a)
}

/// `name` in `dir` changed here (created, removed, renamed): statahead drops it.
fn name_changed(dir: InodeId, name: &[u8]) {
    NAMES.fetch_add(1, Ordering::AcqRel);
    statahead().forget_name(dir.0, name);
}

fn walk(fs: &Fs, abs: &[u8], follow: bool, look: Last) -> Res<Found> {
    again_if_stale(|| walk_once(fs, abs, follow, look))
}

/// Runs path operation `op` once more if it met a directory removed since
/// this process learnt its name (`ESTALE`: another client removed it, and
/// perhaps made another of the same name). The client dropped every cached
/// name leading to it, so the second walk asks the servers, as the kernel
/// walks a path again with `LOOKUP_REVAL` (docs/posix.md).
fn again_if_stale<T>(mut op: impl FnMut() -> Res<T>) -> Res<T> {
    match op() {
        Err(libc::ESTALE) => op(),
        r => r,
    }
}

fn walk_once(fs: &Fs, abs: &[u8], follow: bool, look: Last) -> Res<Found> {
    let mut links = 0;
    // The path as given is walked without a copy; one a symbolic link on the
    // way leads to is the walk's own.
    let mut next = match walk_pass(fs, without_trailing_slash(abs), follow, look, &mut links)? {
        Pass::Found(found) => return Ok(found),
        Pass::Restart(next) => next,
    };
    loop {
        next = match walk_pass(fs, &next, follow, look, &mut links)? {
            Pass::Found(mut found) => {
                found.path = Some(next);
                return Ok(found);
            }
            Pass::Restart(after) => after,
        };
    }
}

/// One pass of a path walk: where it ends, or the path a symbolic link on the
/// way leads to. (Returned once per pass: boxing the large variant would be
/// the allocation the name kept in place saves.)
#[allow(clippy::large_enum_variant)]
enum Pass {
    Found(Found),
    Restart(AbsPath),
}

/// Walks `path` (absolute, normalized, no trailing slash) from the root;
/// `links` counts the symbolic links followed so far.
fn walk_pass(fs: &Fs, path: &[u8], follow: bool, look: Last, links: &mut usize) -> Res<Pass> {
    let cfg = client::config().ok_or(libc::EIO)?;
    let rel = mount_rel(path)?;
    let found = |parent, name: &[u8], attr| {
        Pass::Found(Found { parent, name: Name::new(name), path: None, attr, data: None })
    };
    let n = paths::components(rel).count();
    if n == 0 {
        let attr = if look == Last::Skip {
            None
        } else {
            Some(fs.fs.getattr(InodeId::ROOT).map_err(errno)?)
        };
        return Ok(found(InodeId::ROOT, b"", attr));
    }
    // The directories on the way that the dentry cache holds, at once.
    let (mut dir, cached) = fs.fs.cached_dirs(InodeId::ROOT, paths::components(rel).take(n - 1));
    for (i, c) in paths::components(rel).enumerate().skip(cached) {
        if c.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        let last = i + 1 == n;
        if last && look == Last::Skip {
            return Ok(found(dir, c, None));
        }
        let mut data = None;
        let looked = match look {
            Last::Stat if last => lookup_for_stat(fs, dir, c),
            Last::Read if last => fs.fs.lookup_data(dir, c).map(|(a, d)| {
                data = d;
                a
            }),
            _ => fs.fs.lookup(dir, c),
        };
        let attr = match looked {
            Ok(a) => a,
            Err(FsError::NotFound) if last => return Ok(found(dir, c, None)),
            Err(e) => return Err(errno(e)),
        };
        if attr.kind == FileType::Symlink && (!last || follow) {
            *links += 1;
            if *links > SYMLINKS_MAX {
                return Err(libc::ELOOP);
            }
            let target = fs.fs.readlink(attr.ino).map_err(errno)?;
            // `c` lies in `rel`: what comes before it and after it.
            let at = c.as_ptr() as usize - rel.as_ptr() as usize;
            let here = cfg.mount.join(&rel[..at]);
            let mut next = normalize(&here, &target);
            let rest = &rel[at + c.len()..];
            let rest = &rest[rest.iter().take_while(|&&b| b == b'/').count()..];
            if !rest.is_empty() {
                next = normalize(&next, rest);
            }
            return Ok(Pass::Restart(next));
        }
        if last {
            let mut f = found(dir, c, Some(attr));
            if let Pass::Found(f) = &mut f {
                f.data = data;
            }
            return Ok(f);
        }
        if attr.kind != FileType::Directory {
            return Err(libc::ENOTDIR);
        }
        dir = attr.ino;
    }
    unreachable!("a path with components returns from the loop");
}

/// The effective user and group ids, read once and again after the program
/// changes them (the `set*id` hooks call [`forget_ids`]): `geteuid` and
/// `getegid` are system calls, and a create asked both each time. `u32::MAX`
/// (`(uid_t)-1`, never an id): not read yet.
static EUID: AtomicU32 = AtomicU32::new(u32::MAX);
static EGID: AtomicU32 = AtomicU32::new(u32::MAX);

fn cached_id(cell: &AtomicU32, read: fn() -> u32) -> u32 {
    let id = cell.load(Ordering::Relaxed);
    if id != u32::MAX {
        return id;
    }
    let id = read();
    cell.store(id, Ordering::Relaxed);
    id
}

fn euid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    cached_id(&EUID, || unsafe { libc::geteuid() })
}

fn egid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    cached_id(&EGID, || unsafe { libc::getegid() })
}

/// The program called a `set*id` function: the effective ids are read again
/// when next needed. (A change made with a raw system call is not seen.)
pub fn forget_ids() {
    EUID.store(u32::MAX, Ordering::Relaxed);
    EGID.store(u32::MAX, Ordering::Relaxed);
}

/// The process's umask, read once from /proc and followed through `umask`.
pub fn umask() -> u32 {
    let m = UMASK.load(Ordering::Relaxed);
    if m != u32::MAX {
        return m;
    }
    let read = client::with_busy(|| std::fs::read_to_string("/proc/self/status")).ok();
    let m = read
        .as_deref()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Umask:")))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022);
    UMASK.store(m, Ordering::Relaxed);
    m
}

/// Records a new umask (the hook of `umask` calls this).
pub fn set_umask(m: u32) {
    UMASK.store(m & 0o777, Ordering::Relaxed);
}

fn in_group(gid: u32) -> bool {
    if gid == egid() {
        return true;
    }
    let mut groups = [0 as libc::gid_t; 256];
    // SAFETY: the buffer holds `groups.len()` entries.
    let n = unsafe { libc::getgroups(groups.len() as i32, groups.as_mut_ptr()) };
    n > 0 && groups[..n as usize].contains(&gid)
}

/// Whether the caller may access `a` for `mask` (`R_OK | W_OK | X_OK`), by its
/// permission bits, as the kernel checks them on the mount
/// (`default_permissions`).
pub fn permitted(a: &FileAttr, mask: i32) -> bool {
    let mask = (mask & 7) as u16;
    if euid() == 0 {
        // Root reads and writes anything, and executes what anyone may.
        return mask & 1 == 0 || a.kind == FileType::Directory || a.perm & 0o111 != 0;
    }
    let bits = if a.uid == euid() {
        (a.perm >> 6) & 7
    } else if in_group(a.gid) {
        (a.perm >> 3) & 7
    } else {
        a.perm & 7
    };
    bits & mask == mask
}

fn access_mask(flags: i32) -> i32 {
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => libc::R_OK,
        libc::O_WRONLY => libc::W_OK,
        _ => libc::R_OK | libc::W_OK,
    }
}

/// The descriptor every reserved one is duplicated from: an `O_PATH`
/// descriptor of `/dev/null` the library keeps (close-on-exec), or -1 before
/// the first pfs open. Opening `/dev/null` for every pfs open walked its path
/// in the kernel: 11% of md-hard's read phase through the library
/// (docs/benchmarks.md). It is guarded (`pfs_net::fdguard`) as the library's
/// link descriptors are: the program's `close` of it leaves it open; a `dup2`
/// onto its number makes the library open another.
static TEMPLATE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The template descriptor, if the library has one.
pub fn template() -> Option<i32> {
    let t = TEMPLATE.load(std::sync::atomic::Ordering::Acquire);
    (t >= 0).then_some(t)
}

/// The program is about to make descriptor `fd` something else (`dup2`
/// onto it): if it is the template, the library stops using it and opens
/// another at its next pfs open.
pub fn template_taken(fd: i32) {
    let taken = TEMPLATE.compare_exchange(
        fd,
        -1,
        std::sync::atomic::Ordering::AcqRel,
        std::sync::atomic::Ordering::Acquire,
    );
    if taken.is_ok() {
        pfs_net::fdguard::unguard(fd);
    }
}

/// The reserved descriptor of the last pfs descriptor closed, kept for the
/// next pfs open instead of closed: `fd | cloexec << 32`, or -1. An open and
/// close loop (mdtest's create phase, `tar` writing files) then costs no
/// descriptor system call per file, where reserving and closing cost
/// `fcntl(F_DUPFD)` and `close` (0.45-0.5 µs together here). Only numbers
/// above 2 are kept (a program that closes its standard input and opens a
/// file wants that number back), and the number goes back to the kernel
/// before any intercepted call that takes the lowest free one (a non-pfs
/// open, `fopen`, `opendir`, `dup`, `fcntl(F_DUPFD)`) and before an exec or
/// spawn; a program's own `close`, `close_range` or `dup2` of that number
/// takes it from the library first ([`drop_kept`]). Calls the library does not
/// intercept (`socket`, `pipe`) may get the next number up while one is kept
/// (docs/preload.md).
static KEPT: AtomicI64 = AtomicI64::new(-1);
/// Opens that reused the kept descriptor (`PFS_PRELOAD_STATS`).
static KEPT_REUSED: AtomicU64 = AtomicU64::new(0);

/// Keeps closed pfs descriptor `fd` for the next open ([`KEPT`]), or closes it.
fn keep_or_close(fd: i32) {
    if fd > 2 {
        let v = i64::from(fd) | i64::from(fds::cloexec(fd)) << 32;
        if KEPT.compare_exchange(-1, v, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return;
        }
    }
    real_close(fd);
}

/// The kept descriptor ([`KEPT`]) with `FD_CLOEXEC` as `cloexec` says, if one is.
fn take_kept(cloexec: bool) -> Option<i32> {
    if KEPT.load(Ordering::Relaxed) < 0 {
        return None;
    }
    let v = KEPT.swap(-1, Ordering::AcqRel);
    if v < 0 {
        return None;
    }
    let fd = v as i32;
    if (v >> 32 != 0) != cloexec {
        let fcntl = real!(fcntl: fn(i32, i32, libc::c_ulong) -> i32);
        let flag = if cloexec { libc::FD_CLOEXEC } else { 0 };
        // SAFETY: sets the descriptor flags of a descriptor this library reserved.
        if unsafe { fcntl(fd, libc::F_SETFD, flag as libc::c_ulong) } < 0 {
            // Closed behind the library's back (a raw system call): not ours.
            return None;
        }
    }
    KEPT_REUSED.fetch_add(1, Ordering::Relaxed);
    Some(fd)
}

/// Gives the kept descriptor ([`KEPT`]), if any, back to the kernel: before a
/// call that takes the lowest free number, or an exec.
pub fn give_back_kept() {
    if KEPT.load(Ordering::Relaxed) < 0 {
        return;
    }
    let v = KEPT.swap(-1, Ordering::AcqRel);
    if v >= 0 {
        real_close(v as i32);
    }
}

/// The kept descriptor, if it is in `first..=last`, stops being the library's:
/// the program closes those numbers or puts its own there (`close`,
/// `close_range`, `dup2`). Whether it was.
fn take_kept_in(first: u32, last: u32) -> Option<i32> {
    let v = KEPT.load(Ordering::Acquire);
    let hit = v >= 0
        && (first..=last).contains(&(v as u32))
        && KEPT.compare_exchange(v, -1, Ordering::AcqRel, Ordering::Acquire).is_ok();
    hit.then_some(v as i32)
}

/// [`give_back_kept`] if the kept descriptor is in `first..=last` (the program
/// closes those numbers); whether it was.
pub fn give_back_kept_in(first: u32, last: u32) -> bool {
    take_kept_in(first, last).map(real_close).is_some()
}

/// The program puts its own descriptor at number `fd` (`dup2`), which the
/// kernel frees first: if the library kept it, it no longer does.
pub fn drop_kept(fd: i32) {
    if let Ok(n) = u32::try_from(fd) {
        take_kept_in(n, n);
    }
}

/// First reads answered from the bytes their open's lookup brought.
static SMALL_READS: AtomicU64 = AtomicU64::new(0);

/// Opens that reused a kept descriptor instead of reserving one.
pub fn kept_reused() -> u64 {
    KEPT_REUSED.load(Ordering::Relaxed)
}

/// Reserves a real descriptor for a pfs file: a duplicate of the template,
/// an `O_PATH` descriptor of `/dev/null`, so the number is the kernel's and
/// an uncaught call on it fails with `EBADF` (or the kept one, [`KEPT`]).
fn reserve(cloexec: bool) -> Res<i32> {
    if let Some(fd) = take_kept(cloexec) {
        return Ok(fd);
    }
    let fcntl = real!(fcntl: fn(i32, i32, libc::c_ulong) -> i32);
    let cmd = if cloexec { libc::F_DUPFD_CLOEXEC } else { libc::F_DUPFD };
    for _ in 0..2 {
        let t = match template() {
            Some(t) => t,
            None => open_template()?,
        };
        // SAFETY: duplicates a descriptor; no memory is passed.
        let fd = unsafe { fcntl(t, cmd, 0) };
        if fd >= 0 {
            return Ok(fd);
        }
        let e = last_errno();
        if e != libc::EBADF {
            return Err(e);
        }
        // Closed behind the library's back (a raw system call): open another.
        template_taken(t);
    }
    Err(libc::EBADF)
}

/// Opens the template (another thread may have opened one first: then that
/// one is used and this one closed).
fn open_template() -> Res<i32> {
    let open = real!(open: fn(*const libc::c_char, i32, libc::c_uint) -> i32);
    // SAFETY: a nul-terminated path.
    let fd = unsafe { open(c"/dev/null".as_ptr(), libc::O_PATH | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return Err(last_errno());
    }
    match TEMPLATE.compare_exchange(
        -1,
        fd,
        std::sync::atomic::Ordering::AcqRel,
        std::sync::atomic::Ordering::Acquire,
    ) {
        Ok(_) => {
            pfs_net::fdguard::guard(fd);
            Ok(fd)
        }
        Err(other) => {
            real_close(fd);
            Ok(other)
        }
    }
}

fn real_close(fd: i32) {
    let close = real!(close: fn(i32) -> i32);
    // SAFETY: `fd` is a descriptor this library reserved.
    unsafe { close(fd) };
}

/// The errno libc left.
pub fn last_errno() -> Errno {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// Gives `file` a descriptor; the description is dropped on failure.
fn install(file: OpenFile, cloexec: bool) -> Res<i32> {
    let fd = reserve(cloexec)?;
    fds::set_cloexec(fd, cloexec);
    match fds::insert(fd, Arc::new(file)) {
        Ok(old) => {
            drop(old);
            Ok(fd)
        }
        Err(e) => {
            real_close(fd);
            Err(e)
        }
    }
}

/// `open(2)` of pfs path `abs`.
pub fn open(abs: AbsPath, flags: i32, mode: u32) -> Res<i32> {
    if flags & libc::O_TMPFILE == libc::O_TMPFILE {
        return Err(libc::EOPNOTSUPP);
    }
    let fs = Fs::get()?;
    let cloexec = flags & libc::O_CLOEXEC != 0;
    let keep = flags & !(libc::O_CLOEXEC | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
    if flags & libc::O_CREAT != 0 {
        if wants_dir(&abs) {
            return Err(libc::EISDIR);
        }
        let perm = new_perm(mode);
        let create = || {
            let p = resolve_parent(&fs, &abs)?;
            if p.name.is_empty() {
                return Err(if flags & libc::O_EXCL != 0 { libc::EEXIST } else { libc::EISDIR });
            }
            match fs.fs.create(p.parent, &p.name, perm, euid(), egid(), flags as u32) {
                Err(FsError::Stale) => Err(libc::ESTALE),
                created => Ok((p, created)),
            }
        };
        let (p, created) = again_if_stale(create)?;
        match created {
            Ok((attr, fh)) => {
                // A `stat` of it before it changes is answered from these, as
                // the kernel answers one from a CREATE reply's.
                let changes = CHANGES.load(Ordering::Acquire);
                statahead().created(p.parent.0, &p.name, attr, changes);
                let file = OpenFile::new(p.into_path(abs), attr.ino, attr.kind, keep);
                file.state().handle = Some(fds::Handle { generation: fs.generation, fh });
                return install(file, cloexec);
            }
            Err(FsError::Exists) if flags & libc::O_EXCL == 0 => name_changed(p.parent, &p.name),
            Err(e) => {
                name_changed(p.parent, &p.name);
                return Err(errno(e));
            }
        }
    }
    let follow = flags & libc::O_NOFOLLOW == 0 || flags & libc::O_PATH != 0;
    // An open for reading only asks for a small file's bytes with its lookup:
    // its first read then needs no request of its own.
    let reads_only = flags & libc::O_ACCMODE == libc::O_RDONLY
        && flags & (libc::O_CREAT | libc::O_TRUNC | libc::O_PATH | libc::O_DIRECTORY) == 0;
    let (changes, names) = (CHANGES.load(Ordering::Acquire), NAMES.load(Ordering::Acquire));
    let mut found = walk(&fs, &abs, follow, if reads_only { Last::Read } else { Last::Lookup })?;
    let data = found.data.take();
    let attr = found.attr.ok_or(libc::ENOENT)?;
    if flags & libc::O_PATH == 0 {
        match attr.kind {
            FileType::Symlink => return Err(libc::ELOOP),
            FileType::Directory if flags & libc::O_ACCMODE != libc::O_RDONLY => {
                return Err(libc::EISDIR)
            }
            FileType::Directory if flags & libc::O_CREAT != 0 => return Err(libc::EISDIR),
            FileType::Regular | FileType::Directory => {}
            _ => return Err(libc::ENXIO),
        }
        if !permitted(&attr, access_mask(flags)) {
            return Err(libc::EACCES);
        }
    }
    if attr.kind != FileType::Directory && (flags & libc::O_DIRECTORY != 0 || wants_dir(&abs)) {
        return Err(libc::ENOTDIR);
    }
    let file = OpenFile::new(found.into_path(abs), attr.ino, attr.kind, keep);
    if attr.kind == FileType::Regular && flags & libc::O_PATH == 0 {
        if flags & libc::O_TRUNC != 0 && file.writable() {
            set_size(&fs, attr.ino, 0)?;
        }
        fs.handle(&file)?;
        let at = Instant::now();
        *file.looked.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(fds::Looked { attr, changes, names, at });
        if let Some(data) = data {
            let small = fds::SmallBytes { data, changes, at };
            *file.small.lock().unwrap_or_else(|p| p.into_inner()) = Some(small);
        }
    }
    install(file, cloexec)
}

/// The description behind pfs descriptor `fd`.
pub fn file(fd: i32) -> Res<Arc<OpenFile>> {
    fds::get(fd).ok_or(libc::EBADF)
}

/// `close(2)`: the descriptor goes; the last one of a description waits for its
/// writes and returns the first error they had.
pub fn close(fd: i32) -> Res<()> {
    let file = fds::remove(fd).ok_or(libc::EBADF)?;
    keep_or_close(fd);
    finish(file)
}

/// Drops one reference to a description; the last one flushes its writes.
fn finish(file: Arc<OpenFile>) -> Res<()> {
    // A close of any descriptor of a file gives back the process's record
    // locks on it (POSIX), the last of a description its own.
    crate::locks::release(file.ino, crate::locks::process_owner(), false);
    if Arc::strong_count(&file) > 1 {
        return Ok(());
    }
    let owner = crate::locks::description_owner(&file);
    crate::locks::release(file.ino, owner, false);
    crate::locks::release(file.ino, owner, true);
    let handle = file.state().handle;
    let mut r = Ok(());
    if let Some(h) = handle {
        if let Some((fs, generation)) = client::connected() {
            if h.generation == generation {
                r = fs.flush(file.ino, h.fh).map_err(errno);
            }
        }
        if file.wrote.load(Ordering::Acquire) {
            // Its writes are published now: attributes fetched before (a
            // batch another thread asked for meanwhile) are not used. A
            // description that wrote nothing changed nothing: the entry a
            // create kept stays, as the kernel keeps a CREATE reply's.
            changed(file.ino);
        }
    }
    file.closed.store(true, Ordering::Relaxed);
    drop(file);
    r
}

/// `dup`-like: `newfd` (from the kernel, with `FD_CLOEXEC` as `cloexec`
/// says) is now another descriptor of `fd`'s description.
pub fn duplicated(fd: i32, newfd: i32, cloexec: bool) -> Res<i32> {
    let f = file(fd)?;
    fds::set_cloexec(newfd, cloexec);
    match fds::insert(newfd, f) {
        Ok(old) => {
            if let Some(old) = old {
                let _ = finish(old);
            }
            Ok(newfd)
        }
        Err(e) => {
            real_close(newfd);
            Err(e)
        }
    }
}

/// A real descriptor (from `dup2` over it) replaced pfs descriptor `fd`.
pub fn replaced(fd: i32) {
    if let Some(old) = fds::remove(fd) {
        let _ = finish(old);
    }
}

/// Reads up to `buf.len()` bytes at `offset` (short at the end of the file).
pub fn read_at(f: &OpenFile, offset: u64, buf: &mut [u8]) -> Res<usize> {
    let (fs, fh) = io_handle(f, f.readable())?;
    read_with(&fs, f, fh, offset, buf)
}

/// The client and handle for a read (`readable`) or write (`writable`).
fn io_handle(f: &OpenFile, allowed: bool) -> Res<(Fs, FileHandle)> {
    if f.kind == FileType::Directory {
        return Err(libc::EISDIR);
    }
    if !allowed {
        return Err(libc::EBADF);
    }
    let fs = Fs::get()?;
    let fh = fs.handle(f)?;
    Ok((fs, fh))
}

/// How long a read that ended short lets later reads at or past that end
/// return 0 without asking a server: the mount's attribute lifetime, within
/// which its kernel answers them from its cached size.
const EOF_HINT_TTL: Duration = Duration::from_secs(1);

/// Changes to files' data, sizes or attributes this process made (any file):
/// an end-of-file hint, or a statahead entry, learned before one of them is not
/// used.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// Names this process created, removed or renamed (any directory): the
/// attributes an open's lookup found are not used for an `fstat` after one.
static NAMES: AtomicU64 = AtomicU64::new(0);

/// File `ino` changed here: counted, and its statahead entry goes (the table
/// is per inode: other files' entries stay usable).
fn changed(ino: InodeId) {
    CHANGES.fetch_add(1, Ordering::AcqRel);
    statahead().forget_ino(ino.0);
}

/// The file capability a write removes.
const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// Before a description's first write to a file it did not create: what the
/// kernel's `file_remove_privs` takes from a file before a write, its file
/// capability (`security.capability`) always, and for a writer without
/// `CAP_FSETID` the set-user-ID bit and the set-group-ID bit of a
/// group-executable file. A file this process created has neither, and
/// nothing is asked (nor for a description inherited across `exec`, whose
/// open this process did not see). An append (`append`) leaves both to the
/// file's home, which takes them in the same step; returns whether the
/// set-ID bits must go. Checked at the first write only, where the kernel
/// checks every write: a set-ID bit set while the file is open for writing
/// here stays.
fn remove_privs(fs: &Fs, f: &OpenFile, append: bool) -> Res<bool> {
    let Some(looked) = *f.looked.lock().unwrap_or_else(|p| p.into_inner()) else {
        return Ok(false);
    };
    if !append {
        match fs.fs.getxattr(f.ino, CAPABILITY_XATTR) {
            Ok(_) => match fs.fs.removexattr(f.ino, CAPABILITY_XATTR) {
                Ok(()) | Err(FsError::NoAttr) => {}
                Err(e) => return Err(errno(e)),
            },
            Err(FsError::NoAttr) => {}
            Err(e) => return Err(errno(e)),
        }
    }
    let kill = |perm: u16| if perm & 0o010 != 0 { 0o6000 } else { 0o4000 };
    if looked.attr.perm & kill(looked.attr.perm) == 0 || has_fsetid() {
        return Ok(false);
    }
    if append {
        return Ok(true);
    }
    // The mode now (the open's may be old), less the bits.
    let perm = fs.fs.getattr(f.ino).map_err(errno)?.perm;
    if perm & kill(perm) != 0 {
        let set = SetAttr { perm: Some(perm & !kill(perm)), ..SetAttr::default() };
        fs.fs.setattr(f.ino, &set).map_err(errno)?;
    }
    Ok(false)
}

/// Whether this process may keep set-ID bits through a write (`CAP_FSETID`
/// in its effective set, as root has).
fn has_fsetid() -> bool {
    const CAP_FSETID: u32 = 4;
    has_capability(CAP_FSETID)
}

/// Whether capability number `cap` is in this process's effective set.
fn has_capability(cap: u32) -> bool {
    let status = client::with_busy(|| std::fs::read_to_string("/proc/self/status"));
    let eff = status.ok().and_then(|s| {
        let line = s.lines().find(|l| l.starts_with("CapEff:"))?;
        u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
    });
    eff.is_some_and(|caps| caps & (1 << cap) != 0)
}

/// A lock was just taken: what this process learnt before it of files other
/// nodes may have changed (end-of-file hints, small files' bytes, an open's
/// attributes, statahead entries) is not used after it, as the mount drops
/// the kernel's pages at a lock (docs/posix.md "locks").
pub fn lock_taken() {
    CHANGES.fetch_add(1, Ordering::AcqRel);
    NAMES.fetch_add(1, Ordering::AcqRel);
    statahead().forget_all();
}

/// Before an unlock through `f`: what was written through it reaches the
/// servers, so the next holder on another node reads it.
pub fn flush_before_unlock(f: &OpenFile) -> Res<()> {
    let Some(h) = f.state().handle else { return Ok(()) };
    let Some((fs, generation)) = client::connected() else { return Ok(()) };
    if h.generation != generation {
        return Ok(());
    }
    fs.flush(f.ino, h.fh).map_err(errno)
}

fn read_with(fs: &Fs, f: &OpenFile, fh: FileHandle, offset: u64, buf: &mut [u8]) -> Res<usize> {
    if buf.is_empty() {
        return Ok(0);
    }
    let changes = CHANGES.load(Ordering::Acquire);
    if let Some(h) = *f.eof_hint.lock().unwrap_or_else(|p| p.into_inner()) {
        if h.changes == changes && offset >= h.end && h.at.elapsed() < EOF_HINT_TTL {
            return Ok(0);
        }
    }
    // The first read of a small file opened for reading: from the bytes its
    // lookup brought, unless this process changed a file since or they are
    // older than a cached size would be.
    let small = f.small.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(s) = small.filter(|s| s.changes == changes && s.at.elapsed() < EOF_HINT_TTL) {
        let start = offset.min(s.data.len() as u64) as usize;
        let n = (s.data.len() - start).min(buf.len());
        buf[..n].copy_from_slice(&s.data[start..start + n]);
        if start + n == s.data.len() {
            // The end of the file as the lookup found it: the read after
            // (`cat`, `read_to_end`) needs no request either.
            let hint = EofHint { end: s.data.len() as u64, changes, at: s.at };
            *f.eof_hint.lock().unwrap_or_else(|p| p.into_inner()) = Some(hint);
        }
        SMALL_READS.fetch_add(1, Ordering::Relaxed);
        return Ok(n);
    }
    let mut done = 0;
    while done < buf.len() {
        let want = (buf.len() - done).min(IO_MAX);
        // Copied from the replies' buffers into the program's.
        let n = match fs.fs.read_into(f.ino, fh, offset + done as u64, &mut buf[done..done + want])
        {
            Ok(n) => n,
            Err(_) if done > 0 => break,
            Err(e) => return Err(errno(e)),
        };
        done += n;
        if n < want {
            // The end of the file, as of now: a reader that checks for it with
            // one more read (`cat`, `read_to_end`) gets it without a request.
            let hint = EofHint { end: offset + done as u64, changes, at: Instant::now() };
            *f.eof_hint.lock().unwrap_or_else(|p| p.into_inner()) = Some(hint);
            break;
        }
    }
    Ok(done)
}

static EXITING: AtomicBool = AtomicBool::new(false);

/// Writes `data` at `offset` (at the end of the file for `O_APPEND`); returns
/// the bytes written and the offset after them.
pub fn write_at(f: &OpenFile, offset: Option<u64>, data: &[u8]) -> Res<(usize, u64)> {
    let (fs, fh) = io_handle(f, f.writable())?;
    write_with(&fs, f, fh, offset, data)
}

fn write_with(
    fs: &Fs,
    f: &OpenFile,
    fh: FileHandle,
    offset: Option<u64>,
    data: &[u8],
) -> Res<(usize, u64)> {
    // An `O_APPEND` write (a `pwrite` too, as Linux does it) goes where the
    // file's home says its end is, decided there in one step: other
    // processes' and nodes' appends never land on it.
    let append = f.flags() & libc::O_APPEND != 0;
    let mut at = match offset {
        Some(o) if !append => o,
        _ => 0,
    };
    // The file size limit, checked where the write starts (for an append
    // under a limit, the end the file has now).
    let data = if !append {
        &data[..limits::write_len(at, data.len())?]
    } else if limits::limited() {
        let size = fs.fs.getattr(f.ino).map_err(errno)?.size;
        &data[..limits::write_len(size, data.len())?]
    } else {
        data
    };
    let first = !f.wrote.swap(true, Ordering::AcqRel);
    changed(f.ino);
    let kill_suidgid = if first { remove_privs(fs, f, append)? } else { false };
    let mut done = 0;
    while done < data.len() {
        let end = (done + IO_MAX).min(data.len());
        let wrote = if append {
            fs.fs.append(f.ino, fh, &data[done..end], kill_suidgid).map(|(o, n)| {
                at = o;
                n
            })
        } else {
            fs.fs.write(f.ino, fh, at, &data[done..end])
        };
        match wrote {
            Ok(0) => break,
            Ok(n) => {
                done += n as usize;
                at += n as u64;
            }
            Err(_) if done > 0 => break,
            Err(e) => return Err(errno(e)),
        }
    }
    if EXITING.load(Ordering::Relaxed) || f.flags() & (libc::O_SYNC | libc::O_DSYNC) != 0 {
        // After the exit flush nothing waits for this write any more; an
        // O_SYNC file's writes are durable when they return.
        if f.flags() & (libc::O_SYNC | libc::O_DSYNC) != 0 {
            fs.fs.fsync(f.ino, fh, f.flags() & libc::O_SYNC == 0).map_err(errno)?;
        } else {
            fs.fs.flush(f.ino, fh).map_err(errno)?;
        }
    }
    Ok((done, at))
}

/// `read(2)` at the description's offset.
pub fn read(fd: i32, buf: &mut [u8]) -> Res<usize> {
    let f = file(fd)?;
    // The handle first: it takes the state lock too.
    let (fs, fh) = io_handle(&f, f.readable())?;
    let mut st = f.state();
    let n = read_with(&fs, &f, fh, st.offset, buf)?;
    st.offset += n as u64;
    Ok(n)
}

/// `write(2)` at the description's offset.
pub fn write(fd: i32, data: &[u8]) -> Res<usize> {
    let f = file(fd)?;
    let (fs, fh) = io_handle(&f, f.writable())?;
    let mut st = f.state();
    let (n, end) = write_with(&fs, &f, fh, Some(st.offset), data)?;
    st.offset = end;
    Ok(n)
}

/// `lseek(2)`.
pub fn lseek(fd: i32, offset: i64, whence: i32) -> Res<u64> {
    let f = file(fd)?;
    let size = || -> Res<i64> {
        let fs = Fs::get()?;
        Ok(fs.fs.getattr(f.ino).map_err(errno)?.size as i64)
    };
    let cur = f.state().offset as i64;
    let to = match whence {
        libc::SEEK_SET => offset,
        libc::SEEK_CUR => cur.checked_add(offset).ok_or(libc::EOVERFLOW)?,
        libc::SEEK_END => size()?.checked_add(offset).ok_or(libc::EOVERFLOW)?,
        // Every byte is data: the only hole is the one past the end.
        libc::SEEK_DATA => {
            if offset < 0 || offset >= size()? {
                return Err(libc::ENXIO);
            }
            offset
        }
        libc::SEEK_HOLE => {
            let s = size()?;
            if offset < 0 || offset > s {
                return Err(libc::ENXIO);
            }
            s
        }
        _ => return Err(libc::EINVAL),
    };
    if to < 0 {
        return Err(libc::EINVAL);
    }
    let mut st = f.state();
    if f.kind == FileType::Directory {
        if to != 0 {
            return Err(libc::EINVAL);
        }
        st.dir = fds::DirCursor::default();
    }
    st.offset = to as u64;
    Ok(to as u64)
}

/// Attributes as the mount shows them (an open file unlinked here has no
/// links).
fn visible(f: Option<&OpenFile>, mut a: FileAttr) -> FileAttr {
    if f.is_some_and(|f| f.hidden.lock().map(|h| h.is_some()).unwrap_or(false)) {
        a.nlink = 0;
    }
    a
}

/// `fstat(2)`: soon after the open, and with no change through this process
/// since, from what the open's lookup found (as the mount's kernel answers
/// from the attributes it caches for their lifetime: Python's `open` and
/// `read()` ask twice); otherwise from the file's home.
pub fn fstat(fd: i32) -> Res<FileAttr> {
    let f = file(fd)?;
    let looked = *f.looked.lock().unwrap_or_else(|p| p.into_inner());
    let (changes, names) = (CHANGES.load(Ordering::Acquire), NAMES.load(Ordering::Acquire));
    let fresh = |l: &fds::Looked| l.at.elapsed() < EOF_HINT_TTL;
    if let Some(l) = looked.filter(|l| l.changes == changes && l.names == names && fresh(l)) {
        return Ok(visible(Some(&f), l.attr));
    }
    let fs = Fs::get()?;
    let a = fs.fs.getattr(f.ino).map_err(errno)?;
    Ok(visible(Some(&f), a))
}

/// `stat(2)` (`follow`) or `lstat(2)`.
pub fn stat(abs: &[u8], follow: bool) -> Res<FileAttr> {
    let fs = Fs::get()?;
    let found = walk(&fs, abs, follow, Last::Stat)?;
    let a = found.attr.ok_or(libc::ENOENT)?;
    if wants_dir(abs) && a.kind != FileType::Directory {
        return Err(libc::ENOTDIR);
    }
    Ok(a)
}

/// `fsync(2)` / `fdatasync(2)`.
pub fn fsync(fd: i32, datasync: bool) -> Res<()> {
    let f = file(fd)?;
    let fs = Fs::get()?;
    if f.kind == FileType::Directory {
        return fs.fs.fsyncdir(f.ino, FileHandle(0), datasync).map_err(errno);
    }
    let fh = fs.handle(&f)?;
    fs.fs.fsync(f.ino, fh, datasync).map_err(errno)
}

/// `sync_file_range(2)`: with `SYNC_FILE_RANGE_WRITE` or `..._WAIT_AFTER`,
/// the description's writes reach the servers (a flush, as at close; not a
/// device sync, which the kernel's call does not promise either).
pub fn sync_file_range(fd: i32, offset: i64, n: i64, flags: u32) -> Res<()> {
    let valid = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    if flags & !valid != 0 || offset < 0 || n < 0 || offset.checked_add(n).is_none() {
        return Err(libc::EINVAL);
    }
    let f = file(fd)?;
    match f.kind {
        FileType::Regular => {}
        FileType::Directory | FileType::Symlink => return Ok(()),
        _ => return Err(libc::ESPIPE),
    }
    let wanted = libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    if flags & wanted == 0 || !f.wrote.load(Ordering::Acquire) {
        return Ok(());
    }
    let fs = Fs::get()?;
    let fh = fs.handle(&f)?;
    fs.fs.flush(f.ino, fh).map_err(errno)
}

/// `syncfs(2)` of a pfs descriptor, and `sync(2)`: every file this process
/// wrote through a descriptor still open is made durable (`fsync`), as the
/// kernel writes back its dirty pages; the first error is returned.
pub fn sync_all() -> Res<()> {
    let Some((fs, generation)) = client::connected() else { return Ok(()) };
    let mut first = Ok(());
    for f in fds::all() {
        if f.kind != FileType::Regular || !f.wrote.load(Ordering::Acquire) {
            continue;
        }
        let Some(h) = f.state().handle.filter(|h| h.generation == generation) else { continue };
        if let Err(e) = fs.fsync(f.ino, h.fh, false) {
            first = first.and(Err(errno(e)));
        }
    }
    first
}

/// `readahead(2)` of a pfs descriptor: advice only (the servers read ahead
/// on their own), with the kernel's errors.
pub fn readahead(fd: i32) -> Res<()> {
    let f = file(fd)?;
    if !f.readable() {
        return Err(libc::EBADF);
    }
    if f.kind != FileType::Regular {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn set_size(fs: &Fs, ino: InodeId, size: i64) -> Res<()> {
    if size < 0 {
        return Err(libc::EINVAL);
    }
    limits::grow(size as u64, || Ok(fs.fs.getattr(ino).map_err(errno)?.size))?;
    changed(ino);
    let set = SetAttr { size: Some(size as u64), ..SetAttr::default() };
    let r = fs.fs.setattr(ino, &set);
    // Again once done: a batch fetched while it ran is not used.
    changed(ino);
    r.map(|_| ()).map_err(errno)
}

/// `ftruncate(2)`.
pub fn ftruncate(fd: i32, size: i64) -> Res<()> {
    let f = file(fd)?;
    if f.kind != FileType::Regular || !f.writable() {
        return Err(libc::EINVAL);
    }
    set_size(&Fs::get()?, f.ino, size)
}

/// `truncate(2)`.
pub fn truncate(abs: &[u8], size: i64) -> Res<()> {
    let fs = Fs::get()?;
    let a = resolve(&fs, abs, true)?.attr.ok_or(libc::ENOENT)?;
    match a.kind {
        FileType::Directory => return Err(libc::EISDIR),
        FileType::Regular => {}
        _ => return Err(libc::EINVAL),
    }
    if !permitted(&a, libc::W_OK) {
        return Err(libc::EACCES);
    }
    set_size(&fs, a.ino, size)
}

/// `fallocate(2)` with mode 0 or `FALLOC_FL_KEEP_SIZE`.
pub fn fallocate(fd: i32, mode: i32, offset: i64, len: i64) -> Res<()> {
    let f = file(fd)?;
    if offset < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if !f.writable() {
        return Err(libc::EBADF);
    }
    let fs = Fs::get()?;
    let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
    let end = (offset as u64).checked_add(len as u64).filter(|&e| e <= i64::MAX as u64);
    let end = end.ok_or(libc::EFBIG)?;
    if !keep {
        limits::grow(end, || Ok(fs.fs.getattr(f.ino).map_err(errno)?.size))?;
    }
    let fh = fs.handle(&f)?;
    f.wrote.store(true, Ordering::Release);
    changed(f.ino);
    fs.fs.fallocate(f.ino, fh, offset as u64, len as u64, keep).map_err(errno)
}

/// Makes the new name `abs` with `make(fs, parent, name)` (`mkdir`,
/// `symlink`, `mknod`): a path with no last name (`/`) exists already
/// (`EEXIST`); the name counts as changed whether or not it was made.
fn make_name(abs: &[u8], make: impl Fn(&Fs, InodeId, &[u8]) -> FsResult<()>) -> Res<()> {
    let fs = Fs::get()?;
    again_if_stale(|| {
        let p = resolve_parent(&fs, abs)?;
        if p.name.is_empty() {
            return Err(libc::EEXIST);
        }
        let r = make(&fs, p.parent, &p.name);
        name_changed(p.parent, &p.name);
        r.map_err(errno)
    })
}

/// The permission bits of a new file made with `mode`, under the umask.
fn new_perm(mode: u32) -> u16 {
    (mode & 0o7777 & !umask()) as u16
}

/// `mkdir(2)`.
pub fn mkdir(abs: &[u8], mode: u32) -> Res<()> {
    make_name(abs, |fs, parent, name| {
        fs.fs.mkdir(parent, name, new_perm(mode), euid(), egid()).map(|_| ())
    })
}

/// `rmdir(2)`.
pub fn rmdir(abs: &[u8]) -> Res<()> {
    let fs = Fs::get()?;
    again_if_stale(|| {
        let p = resolve_parent(&fs, abs)?;
        match &p.name[..] {
            b"" => Err(libc::EBUSY),
            _ if abs.ends_with(b"/.") => Err(libc::EINVAL),
            name => {
                let r = fs.fs.rmdir(p.parent, name);
                name_changed(p.parent, name);
                r.map_err(errno)
            }
        }
    })
}

/// `unlink(2)`. A regular file open here keeps its data until its last close,
/// under a hidden name in the same directory (as the mount does).
pub fn unlink(abs: &[u8]) -> Res<()> {
    if wants_dir(abs) {
        return Err(libc::ENOTDIR);
    }
    let fs = Fs::get()?;
    again_if_stale(|| {
        let p = resolve_parent(&fs, abs)?;
        if p.name.is_empty() {
            return Err(libc::EISDIR);
        }
        let r = unlink_or_hide(&fs, &p);
        name_changed(p.parent, &p.name);
        r
    })
}

/// Unlinks `p`; a regular file open here is renamed to its hidden name instead.
fn unlink_or_hide(fs: &Fs, p: &Found) -> Res<()> {
    if !fds::any_regular() {
        return fs.fs.unlink(p.parent, &p.name).map_err(errno);
    }
    let open = fds::all();
    let a = fs.fs.lookup(p.parent, &p.name).map_err(errno)?;
    let holder = open.iter().find(|f| f.ino == a.ino);
    match holder {
        Some(f) if a.kind == FileType::Regular && a.nlink <= 1 => {
            let mut hidden = f.hidden.lock().unwrap_or_else(|e| e.into_inner());
            if hidden.is_some() {
                return fs.fs.unlink(p.parent, &p.name).map_err(errno);
            }
            let mut name = HIDDEN_PREFIX.to_vec();
            name.extend_from_slice(a.ino.0.to_string().as_bytes());
            fs.fs
                .rename(p.parent, &p.name, p.parent, &name, RenameFlags::empty())
                .map_err(errno)?;
            *hidden = Some((p.parent, name));
            Ok(())
        }
        _ => fs.fs.unlink(p.parent, &p.name).map_err(errno),
    }
}

/// Whether a listing shows `name` (hidden names of open unlinked files not).
pub fn listed(name: &[u8]) -> bool {
    !name.starts_with(HIDDEN_PREFIX)
}

/// `renameat2(2)` between two pfs paths.
pub fn rename(from: &[u8], to: &[u8], flags: u32) -> Res<()> {
    let allowed = RenameFlags::NOREPLACE.bits() | RenameFlags::EXCHANGE.bits();
    if flags & !allowed != 0 {
        return Err(libc::EINVAL);
    }
    let flags = RenameFlags::from_bits(flags).ok_or(libc::EINVAL)?;
    let fs = Fs::get()?;
    again_if_stale(|| {
        let a = resolve_parent(&fs, from)?;
        let b = resolve_parent(&fs, to)?;
        if a.name.is_empty() || b.name.is_empty() {
            return Err(libc::EBUSY);
        }
        let r = fs.fs.rename(a.parent, &a.name, b.parent, &b.name, flags);
        name_changed(a.parent, &a.name);
        name_changed(b.parent, &b.name);
        r.map_err(errno)
    })
}

/// `link(2)`.
pub fn link(from: &[u8], to: &[u8], follow: bool) -> Res<()> {
    let fs = Fs::get()?;
    again_if_stale(|| {
        let a = resolve(&fs, from, follow)?.attr.ok_or(libc::ENOENT)?;
        if a.kind == FileType::Directory {
            return Err(libc::EPERM);
        }
        let b = resolve_parent(&fs, to)?;
        if b.name.is_empty() {
            return Err(libc::EEXIST);
        }
        let r = fs.fs.link(a.ino, b.parent, &b.name);
        // The file's link count moved (its other names' attributes).
        changed(a.ino);
        name_changed(b.parent, &b.name);
        r.map(|_| ()).map_err(errno)
    })
}

/// `symlink(2)`: `abs` becomes a link to `target`.
pub fn symlink(target: &[u8], abs: &[u8]) -> Res<()> {
    if target.is_empty() {
        return Err(libc::ENOENT);
    }
    make_name(abs, |fs, parent, name| {
        fs.fs.symlink(parent, name, target, euid(), egid()).map(|_| ())
    })
}

/// `mknod(2)`: a regular file (not opened), a device node, a FIFO or a
/// socket, with the kernel's checks: a directory is `EPERM`, another type
/// `EINVAL`, a device node needs `CAP_MKNOD`.
pub fn mknod(abs: &[u8], mode: u32, dev: u64) -> Res<()> {
    const CAP_MKNOD: u32 = 27;
    let kind = match mode & libc::S_IFMT {
        0 => FileType::Regular,
        libc::S_IFDIR => return Err(libc::EPERM),
        t => FileType::from_mode(t).filter(|k| *k != FileType::Symlink).ok_or(libc::EINVAL)?,
    };
    let device = matches!(kind, FileType::CharDevice | FileType::BlockDevice);
    if device && !has_capability(CAP_MKNOD) {
        return Err(libc::EPERM);
    }
    let rdev = if device { convert::encode_dev(dev).ok_or(libc::EINVAL)? } else { 0 };
    make_name(abs, |fs, parent, name| {
        fs.fs.mknod(parent, name, kind, new_perm(mode), euid(), egid(), rdev).map(|_| ())
    })
}

/// `readlink(2)`: the target.
pub fn readlink(abs: &[u8]) -> Res<Vec<u8>> {
    let fs = Fs::get()?;
    let a = resolve(&fs, abs, false)?.attr.ok_or(libc::ENOENT)?;
    if a.kind != FileType::Symlink {
        return Err(libc::EINVAL);
    }
    fs.fs.readlink(a.ino).map_err(errno)
}

/// `access(2)` (`mode` of `F_OK`, `R_OK`, `W_OK`, `X_OK`).
pub fn access(abs: &[u8], mode: i32, follow: bool) -> Res<()> {
    let fs = Fs::get()?;
    let a = resolve(&fs, abs, follow)?.attr.ok_or(libc::ENOENT)?;
    if mode == libc::F_OK || permitted(&a, mode) {
        Ok(())
    } else {
        Err(libc::EACCES)
    }
}

/// What a setattr-like call changes, checked against the caller: only the
/// owner (or root) changes modes and times, only root changes owners.
fn setattr_checked(fs: &Fs, a: &FileAttr, set: &SetAttr) -> Res<()> {
    let me = euid();
    if me != 0 {
        let owner_only = set.perm.is_some() || set.atime_ns.is_some() || set.mtime_ns.is_some();
        if owner_only && a.uid != me {
            return Err(libc::EPERM);
        }
        if set.uid.is_some_and(|u| u != a.uid) || set.gid.is_some_and(|g| !in_group(g)) {
            return Err(libc::EPERM);
        }
    }
    let r = fs.fs.setattr(a.ino, set);
    changed(a.ino);
    r.map(|_| ()).map_err(errno)
}

/// `chmod`/`chown`/`utimensat` by path.
pub fn setattr_path(abs: &[u8], follow: bool, set: &SetAttr) -> Res<()> {
    let fs = Fs::get()?;
    let a = resolve(&fs, abs, follow)?.attr.ok_or(libc::ENOENT)?;
    setattr_checked(&fs, &a, set)
}

/// `fchmod`/`fchown`/`futimens`.
pub fn setattr_fd(fd: i32, set: &SetAttr) -> Res<()> {
    let f = file(fd)?;
    let fs = Fs::get()?;
    let a = fs.fs.getattr(f.ino).map_err(errno)?;
    setattr_checked(&fs, &a, set)
}

/// The time `ts` names for `utimensat` (`None`: `UTIME_OMIT`).
pub fn time_of(ts: &libc::timespec) -> Res<Option<TimeNs>> {
    match ts.tv_nsec {
        libc::UTIME_OMIT => Ok(None),
        libc::UTIME_NOW => Ok(Some(now_ns())),
        n if !(0..1_000_000_000).contains(&n) => Err(libc::EINVAL),
        n => Ok(Some(ts.tv_sec * 1_000_000_000 + n)),
    }
}

/// Now, in nanoseconds since the epoch.
pub fn now_ns() -> TimeNs {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_nanos() as TimeNs
}

/// `statfs(2)` of the cluster.
pub fn statfs() -> Res<StatFs> {
    Fs::get()?.fs.statfs().map_err(errno)
}

/// `chdir(2)` into pfs directory `abs`.
pub fn chdir(abs: &[u8]) -> Res<()> {
    let fs = Fs::get()?;
    let found = resolve(&fs, abs, true)?;
    let a = found.attr.ok_or(libc::ENOENT)?;
    if a.kind != FileType::Directory {
        return Err(libc::ENOTDIR);
    }
    if !permitted(&a, libc::X_OK) {
        return Err(libc::EACCES);
    }
    set_virtual_cwd(found.into_path(abs.to_vec()));
    Ok(())
}

/// `fchdir(2)` to pfs descriptor `fd`.
pub fn fchdir(fd: i32) -> Res<()> {
    let f = file(fd)?;
    if f.kind != FileType::Directory {
        return Err(libc::ENOTDIR);
    }
    set_virtual_cwd(f.path.clone());
    Ok(())
}

/// The kernel's working directory changed (`chdir` or `fchdir` outside the
/// mount succeeded).
pub fn left_pfs() {
    if client::config().is_none() {
        return;
    }
    let mut cwd = cwd_state();
    cwd.path = kernel_cwd();
    cwd.pfs = false;
}

/// `realpath(3)`: the path with every link followed; it must exist.
pub fn realpath(abs: &[u8]) -> Res<AbsPath> {
    let fs = Fs::get()?;
    let found = resolve(&fs, abs, true)?;
    found.attr.ok_or(libc::ENOENT)?;
    Ok(found.into_path(abs.to_vec()))
}

/// One entry of a directory listing.
#[derive(Debug)]
pub struct Entry {
    /// The inode number.
    pub ino: u64,
    /// The type.
    pub kind: FileType,
    /// The name.
    pub name: Vec<u8>,
    /// The position after it (`d_off`).
    pub next: u64,
}

/// The next entry of a directory listing through `f`.
pub fn next_entry(f: &OpenFile) -> Res<Option<Entry>> {
    if f.kind != FileType::Directory {
        return Err(libc::ENOTDIR);
    }
    let mut st = f.state();
    let pos = st.offset;
    let entry = match pos {
        0 => Some((f.ino.0, FileType::Directory, b".".to_vec())),
        1 => Some((f.ino.0, FileType::Directory, b"..".to_vec())),
        _ => loop {
            if let Some(e) = st.dir.window.pop_front() {
                if listed(&e.name) {
                    break Some((e.ino.0, e.kind, e.name));
                }
                continue;
            }
            if st.dir.done {
                break None;
            }
            let fs = Fs::get()?;
            let after = st.dir.after.take();
            let batch = fs
                .fs
                .readdir(f.ino, after.as_deref(), pfs_client::api::READDIR_BATCH)
                .map_err(errno)?;
            match batch.last() {
                Some(last) => st.dir.after = Some(last.name.clone()),
                None => st.dir.done = true,
            }
            st.dir.window.extend(batch);
        },
    };
    Ok(entry.map(|(ino, kind, name)| {
        st.offset = pos + 1;
        Entry { ino, kind, name, next: pos + 1 }
    }))
}

/// Puts back the entry [`next_entry`] returned last (it did not fit).
pub fn unread_entry(f: &OpenFile, e: Entry) {
    let mut st = f.state();
    st.offset -= 1;
    if st.offset >= 2 {
        st.dir.window.push_front(pfs_client::DirListing {
            name: e.name,
            ino: InodeId(e.ino),
            kind: e.kind,
            attr: None,
        });
    }
}

/// `d_type` of a file type.
pub fn dtype(k: FileType) -> u8 {
    match k {
        FileType::Regular => libc::DT_REG,
        FileType::Directory => libc::DT_DIR,
        FileType::Symlink => libc::DT_LNK,
        FileType::CharDevice => libc::DT_CHR,
        FileType::BlockDevice => libc::DT_BLK,
        FileType::Fifo => libc::DT_FIFO,
        FileType::Socket => libc::DT_SOCK,
    }
}

/// `getdents64(2)`: packs `struct linux_dirent64` records into `buf`.
pub fn getdents64(fd: i32, buf: &mut [u8]) -> Res<usize> {
    let f = file(fd)?;
    let mut used = 0;
    while let Some(e) = next_entry(&f)? {
        let (ino, kind, off) = (e.ino, e.kind, e.next);
        let reclen = (19 + e.name.len() + 1).next_multiple_of(8);
        if used + reclen > buf.len() {
            unread_entry(&f, e);
            if used == 0 {
                return Err(libc::EINVAL);
            }
            break;
        }
        let r = &mut buf[used..used + reclen];
        r.fill(0);
        r[0..8].copy_from_slice(&ino.to_ne_bytes());
        r[8..16].copy_from_slice(&(off as i64).to_ne_bytes());
        r[16..18].copy_from_slice(&(reclen as u16).to_ne_bytes());
        r[18] = dtype(kind);
        r[19..19 + e.name.len()].copy_from_slice(&e.name);
        used += reclen;
    }
    Ok(used)
}

/// Opens pfs directory `abs` for a directory stream.
pub fn opendir(abs: AbsPath) -> Res<i32> {
    open(abs, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0)
}

/// At exit: every open pfs file's writes are waited for, and writes after this
/// (stdio's buffers, flushed after the library's destructor) each wait for
/// themselves.
pub fn flush_all_at_exit() {
    EXITING.store(true, Ordering::Relaxed);
    crate::locks::release_all_at_exit();
    let Some((fs, generation)) = client::connected() else { return };
    if std::env::var_os("PFS_PRELOAD_STATS").is_some() {
        let sent: u64 = fs.requests_sent().iter().sum();
        let (hits, misses) = fs.dentry_cache_stats();
        let (fetches, kept, answered) = statahead().counts();
        eprintln!(
            "libpfs_preload: process {}: {sent} requests to the servers, dentry cache {hits} hits {misses} misses, statahead {answered} answered ({fetches} batches, {kept} entries kept), {} closed descriptors reused, {} small files read with their lookup",
            std::process::id(),
            kept_reused(),
            SMALL_READS.load(Ordering::Relaxed)
        );
    }
    for f in fds::all() {
        let h = f.state().handle;
        if let Some(h) = h.filter(|h| h.generation == generation) {
            let _ = fs.flush(f.ino, h.fh);
        }
    }
}

/// What an xattr call names: a path (links followed or not) or a descriptor.
#[derive(Debug)]
pub enum Named<'a> {
    /// A pfs path.
    Path(&'a [u8], bool),
    /// A pfs descriptor.
    Fd(i32),
}

fn ino_of(fs: &Fs, what: Named<'_>) -> Res<InodeId> {
    match what {
        Named::Path(abs, follow) => Ok(resolve(fs, abs, follow)?.attr.ok_or(libc::ENOENT)?.ino),
        Named::Fd(fd) => Ok(file(fd)?.ino),
    }
}

/// `getxattr(2)`: the value.
pub fn getxattr(what: Named<'_>, name: &[u8]) -> Res<Vec<u8>> {
    let fs = Fs::get()?;
    let ino = ino_of(&fs, what)?;
    fs.fs.getxattr(ino, name).map_err(errno)
}

/// `listxattr(2)`: the names, each followed by a nul.
pub fn listxattr(what: Named<'_>) -> Res<Vec<u8>> {
    let fs = Fs::get()?;
    let ino = ino_of(&fs, what)?;
    let mut out = Vec::new();
    for n in fs.fs.listxattr(ino).map_err(errno)? {
        out.extend_from_slice(&n);
        out.push(0);
    }
    Ok(out)
}

/// `setxattr(2)` with `XATTR_CREATE` / `XATTR_REPLACE` flags.
pub fn setxattr(what: Named<'_>, name: &[u8], value: &[u8], flags: i32) -> Res<()> {
    use pfs_core::wire::XattrSetMode;
    let mode = match flags {
        0 => XattrSetMode::Any,
        libc::XATTR_CREATE => XattrSetMode::Create,
        libc::XATTR_REPLACE => XattrSetMode::Replace,
        _ => return Err(libc::EINVAL),
    };
    let fs = Fs::get()?;
    let ino = ino_of(&fs, what)?;
    let r = fs.fs.setxattr(ino, name, value, mode);
    // The inode's ctime moved.
    changed(ino);
    r.map_err(errno)
}

/// `removexattr(2)`.
pub fn removexattr(what: Named<'_>, name: &[u8]) -> Res<()> {
    let fs = Fs::get()?;
    let ino = ino_of(&fs, what)?;
    let r = fs.fs.removexattr(ino, name);
    changed(ino);
    r.map_err(errno)
}

/// The size of `f`'s file now (this client's writes included).
pub fn file_size(f: &OpenFile) -> Res<u64> {
    Ok(Fs::get()?.fs.getattr(f.ino).map_err(errno)?.size)
}

/// Waits for every write through `f`'s handle (as close does, without closing).
pub fn flush_file(f: &OpenFile) -> Res<()> {
    let fs = Fs::get()?;
    let fh = fs.handle(f)?;
    fs.fs.flush(f.ino, fh).map_err(errno)
}

/// The environment entries that hand this process's pfs state to a program it
/// `exec`s (see [`crate::inherit`]), after waiting for every pfs write (the
/// process image and its client are about to go).
pub fn exec_handover() -> Vec<CString> {
    use crate::inherit::{encode_cwd, encode_fds, Passed, CWD_VAR, FDS_MAX, FDS_VAR};
    if client::config().is_none() {
        return Vec::new();
    }
    if let Some((fs, generation)) = client::connected() {
        for f in fds::all() {
            let h = f.state().handle;
            if let Some(h) = h.filter(|h| h.generation == generation) {
                let _ = fs.flush(f.ino, h.fh);
            }
        }
    }
    let mut out = Vec::new();
    let pfs_cwd = virtual_cwd();
    if let Some(p) = pfs_cwd {
        let v = format!("{CWD_VAR}={}", encode_cwd(&kernel_cwd(), &p));
        out.extend(CString::new(v));
    }
    let getfd = real!(fcntl: fn(i32, i32, libc::c_ulong) -> i32);
    let mut passed = Vec::new();
    for (fd, f) in fds::entries() {
        // SAFETY: reads the descriptor flags of a reserved descriptor.
        let fdflags = unsafe { getfd(fd, libc::F_GETFD, 0) };
        if fdflags < 0 || fdflags & libc::FD_CLOEXEC != 0 || passed.len() == FDS_MAX {
            continue;
        }
        let offset = f.state().offset;
        passed.push(Passed {
            fd,
            ino: f.ino.0,
            kind: f.kind as u8,
            flags: f.flags(),
            offset,
            path: f.path.clone(),
        });
    }
    if !passed.is_empty() {
        out.extend(CString::new(format!("{FDS_VAR}={}", encode_fds(&passed))));
    }
    out
}

/// At start: takes over what the program that `exec`ed this one handed on
/// (and removes it from the environment).
pub fn restore_handover() {
    use crate::inherit::{decode_cwd, decode_fds, CWD_VAR, FDS_VAR};
    let cwd = std::env::var(CWD_VAR).ok();
    let passed = std::env::var(FDS_VAR).ok();
    if cwd.is_none() && passed.is_none() {
        return;
    }
    // SAFETY: at library start, before the program's own threads exist.
    unsafe {
        libc::unsetenv(c"PFS_PRELOAD_CWD".as_ptr());
        libc::unsetenv(c"PFS_PRELOAD_FDS".as_ptr());
    }
    let Some(cfg) = client::config() else { return };
    if let Some((kernel, pfs)) = cwd.as_deref().and_then(decode_cwd) {
        if cfg.mount.inside(&pfs).is_some() && kernel_cwd() == kernel {
            let mut c = CWD.lock().unwrap_or_else(|p| p.into_inner());
            *c = Cwd { known: true, path: pfs, pfs: true };
        }
    }
    let getfl = real!(fcntl: fn(i32, i32, libc::c_ulong) -> i32);
    let fstat = real!(fstat: fn(i32, *mut libc::stat) -> i32);
    for p in passed.as_deref().map(decode_fds).unwrap_or_default() {
        let Some(kind) = FileType::from_u8(p.kind) else { continue };
        // SAFETY: plain queries of a descriptor number.
        let reserved = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            getfl(p.fd, libc::F_GETFL, 0) & libc::O_PATH != 0
                && fstat(p.fd, &mut st) == 0
                && st.st_mode & libc::S_IFMT == libc::S_IFCHR
                && st.st_rdev == libc::makedev(1, 3)
        };
        if !reserved || cfg.mount.inside(&p.path).is_none() {
            continue;
        }
        let file = OpenFile::new(p.path, InodeId(p.ino), kind, p.flags);
        file.state().offset = p.offset;
        let _ = fds::insert(p.fd, Arc::new(file));
    }
}
