//! The C symbols the library defines in place of libc's. Each converts its
//! arguments, sends a pfs path or descriptor to [`crate::ops`], and everything
//! else to libc's own definition ([`real!`]) untouched. docs/preload.md lists
//! them.
//!
//! Variadic C functions (`open`, `openat`, `fcntl`, `ioctl`) are defined with
//! their optional argument as a plain one: on x86-64 and aarch64 Linux a
//! variadic integer or pointer argument travels in the same register as a
//! fixed one, and it is only read when the flags say it is there.

#![allow(clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use libc::{c_char, c_int, c_uint, c_ulong, c_void, mode_t, off_t, size_t, ssize_t, FILE};
use pfs_core::wire::{FileLock, LockKind, LOCK_END_MAX};
use pfs_core::{FileAttr, FileType, SetAttr};

use crate::client::{self, busy, with_busy, Errno, Res};
use crate::convert::{fopen_flags, major, minor};
use crate::ops::{self, Target};
use crate::real::real;
use crate::{aio, fds, limits, locks, maps};

// ---------------------------------------------------------------------------
// Helpers.

fn set_errno(e: Errno) {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn ret_unit(r: Res<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn ret_int(r: Res<i32>) -> c_int {
    r.unwrap_or_else(|e| {
        set_errno(e);
        -1
    })
}

fn ret_size(r: Res<usize>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Where path argument `path` (relative to `dirfd`) leads.
/// (The result may borrow the caller's `path`: it lives no longer than the call.)
unsafe fn target<'a>(dirfd: c_int, path: *const c_char) -> Target<'a> {
    if path.is_null() || busy() {
        return Target::Real;
    }
    // SAFETY: the caller passes a nul-terminated path.
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    ops::classify(dirfd, p)
}

/// Runs the libc call `$real` with `$p` bound to the path it should get, or
/// `$pfs` with `$abs` bound to the pfs path.
macro_rules! by_path {
    ($dirfd:expr, $path:expr, |$abs:ident| $pfs:expr, |$p:ident| $real:expr) => {
        // SAFETY: forwarded from the caller.
        match unsafe { target($dirfd, $path) } {
            Target::Pfs($abs) => with_busy(|| $pfs),
            Target::Real => {
                let $p = $path;
                $real
            }
            Target::Elsewhere(c) => {
                let $p = c.as_ptr();
                $real
            }
        }
    };
}

fn slice_mut<'a>(buf: *mut c_void, n: size_t) -> &'a mut [u8] {
    if n == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: the caller of the hooked function passes `n` writable bytes.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), n) }
}

fn slice<'a>(buf: *const c_void, n: size_t) -> &'a [u8] {
    if n == 0 || buf.is_null() {
        return &[];
    }
    // SAFETY: the caller of the hooked function passes `n` readable bytes.
    unsafe { std::slice::from_raw_parts(buf.cast(), n) }
}

fn dev() -> u64 {
    client::config().map_or(0, |c| c.dev)
}

const _: () = assert!(std::mem::size_of::<libc::stat>() == std::mem::size_of::<libc::stat64>());

unsafe fn fill_stat(a: &FileAttr, st: *mut libc::stat) {
    // SAFETY: all-zero is a valid `stat`.
    let mut s: libc::stat = unsafe { std::mem::zeroed() };
    s.st_dev = dev();
    s.st_ino = a.ino.0;
    s.st_mode = a.mode();
    s.st_nlink = a.nlink as _;
    s.st_uid = a.uid;
    s.st_gid = a.gid;
    s.st_rdev = a.rdev as u64;
    s.st_size = a.size as i64;
    s.st_blksize = pfs_core::BLOCK_SIZE_BYTES as _;
    s.st_blocks = a.blocks as i64;
    s.st_atime = a.atime_ns.div_euclid(1_000_000_000);
    s.st_atime_nsec = a.atime_ns.rem_euclid(1_000_000_000);
    s.st_mtime = a.mtime_ns.div_euclid(1_000_000_000);
    s.st_mtime_nsec = a.mtime_ns.rem_euclid(1_000_000_000);
    s.st_ctime = a.ctime_ns.div_euclid(1_000_000_000);
    s.st_ctime_nsec = a.ctime_ns.rem_euclid(1_000_000_000);
    // SAFETY: the caller passes a writable `struct stat`.
    unsafe { st.write(s) };
}

fn stat_into(r: Res<FileAttr>, st: *mut libc::stat) -> c_int {
    match r {
        Ok(a) if !st.is_null() => {
            // SAFETY: checked non-null; the caller's buffer.
            unsafe { fill_stat(&a, st) };
            0
        }
        Ok(_) => ret_unit(Err(libc::EFAULT)),
        Err(e) => ret_unit(Err(e)),
    }
}

fn statx_time(ns: i64) -> libc::statx_timestamp {
    // SAFETY: all-zero is a valid timestamp.
    let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    t.tv_sec = ns.div_euclid(1_000_000_000);
    t.tv_nsec = ns.rem_euclid(1_000_000_000) as u32;
    t
}

unsafe fn fill_statx(a: &FileAttr, out: *mut libc::statx) {
    // SAFETY: all-zero is a valid `statx`.
    let mut s: libc::statx = unsafe { std::mem::zeroed() };
    s.stx_mask = libc::STATX_BASIC_STATS;
    s.stx_blksize = pfs_core::BLOCK_SIZE_BYTES as u32;
    s.stx_nlink = a.nlink;
    s.stx_uid = a.uid;
    s.stx_gid = a.gid;
    s.stx_mode = a.mode() as u16;
    s.stx_ino = a.ino.0;
    s.stx_size = a.size;
    s.stx_blocks = a.blocks;
    s.stx_atime = statx_time(a.atime_ns);
    s.stx_mtime = statx_time(a.mtime_ns);
    s.stx_ctime = statx_time(a.ctime_ns);
    s.stx_rdev_major = major(a.rdev as u64);
    s.stx_rdev_minor = minor(a.rdev as u64);
    s.stx_dev_major = major(dev());
    s.stx_dev_minor = minor(dev());
    // SAFETY: the caller passes a writable `struct statx`.
    unsafe { out.write(s) };
}

// ---------------------------------------------------------------------------
// Start, fork and exit.

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

extern "C" fn init() {
    with_busy(ops::restore_handover);
    replace_inherited_std_streams();
    // SAFETY: registers three functions of this library.
    unsafe {
        libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child))
    };
}

extern "C" fn fini() {
    with_busy(ops::flush_all_at_exit);
}

thread_local! {
    static FORK_HELD: RefCell<Option<(client::ForkHold, fds::ForkHold)>> = const { RefCell::new(None) };
}

extern "C" fn before_fork() {
    aio::hold_for_fork();
    if client::config().is_none() {
        return;
    }
    let held = (client::hold_for_fork(), fds::hold_for_fork());
    FORK_HELD.with(|h| *h.borrow_mut() = Some(held));
}

extern "C" fn after_fork_parent() {
    FORK_HELD.with(|h| h.borrow_mut().take());
    aio::after_fork_parent();
}

extern "C" fn after_fork_child() {
    aio::after_fork_child();
    if let Some((c, t)) = FORK_HELD.with(|h| h.borrow_mut().take()) {
        drop(t);
        c.forget_in_child();
        locks::forget_in_child();
    }
}

// ---------------------------------------------------------------------------
// open and close.

unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    by_path!(dirfd, path, |abs| ret_int(ops::open(abs.into_owned(), flags, mode)), |p| {
        // The kernel gives the lowest free number: the kept one too.
        ops::give_back_kept();
        let f = real!(openat: fn(c_int, *const c_char, c_int, c_uint) -> c_int);
        // SAFETY: libc's openat with the caller's arguments.
        unsafe { f(dirfd, p, flags, mode) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(dirfd, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(dirfd, path, flags, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(dirfd, path, flags, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { open_at(libc::AT_FDCWD, path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { creat(path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if pfs_net::fdguard::is_guarded(fd) {
        // One of the library's own descriptors (a link to a server, its
        // template), closed by a program that closes every number it did not
        // open: it stays open, as if it never existed.
        return 0;
    }
    if !fds::is_pfs(fd) {
        if fd >= 0 && ops::give_back_kept_in(fd as c_uint, fd as c_uint) {
            // A pfs descriptor the program closed already, kept by the
            // library for its next open: the number goes back to the kernel
            // and the program's second close fails as it would have.
            set_errno(libc::EBADF);
            return -1;
        }
        // SAFETY: libc's close.
        return unsafe { real!(close: fn(c_int) -> c_int)(fd) };
    }
    ret_unit(with_busy(|| ops::close(fd)))
}

// ---------------------------------------------------------------------------
// Data.

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's read with the caller's arguments.
        return unsafe { real!(read: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, n) };
    }
    ret_size(with_busy(|| ops::read(fd, slice_mut(buf, n))))
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    _buflen: size_t,
) -> ssize_t {
    // SAFETY: forwarded (the fortify check is the caller's compiler's).
    unsafe { read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's write with the caller's arguments.
        return unsafe { real!(write: fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, n) };
    }
    ret_size(with_busy(|| ops::write(fd, slice(buf, n))))
}

fn pread_pfs(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    ret_size(with_busy(|| {
        if off < 0 {
            return Err(libc::EINVAL);
        }
        ops::read_at(&*ops::file(fd)?, off as u64, slice_mut(buf, n))
    }))
}

fn pwrite_pfs(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    ret_size(with_busy(|| {
        if off < 0 {
            return Err(libc::EINVAL);
        }
        ops::write_at(&*ops::file(fd)?, Some(off as u64), slice(buf, n)).map(|(n, _)| n)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(pread: fn(c_int, *mut c_void, size_t, off_t) -> ssize_t);
        // SAFETY: libc's pread with the caller's arguments.
        return unsafe { f(fd, buf, n, off) };
    }
    pread_pfs(fd, buf, n, off)
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(pread64: fn(c_int, *mut c_void, size_t, off_t) -> ssize_t);
        // SAFETY: libc's pread64 with the caller's arguments.
        return unsafe { f(fd, buf, n, off) };
    }
    pread_pfs(fd, buf, n, off)
}

#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off_t,
    _buflen: size_t,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { pread(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    off: off_t,
    _buflen: size_t,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { pread64(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(pwrite: fn(c_int, *const c_void, size_t, off_t) -> ssize_t);
        // SAFETY: libc's pwrite with the caller's arguments.
        return unsafe { f(fd, buf, n, off) };
    }
    pwrite_pfs(fd, buf, n, off)
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(pwrite64: fn(c_int, *const c_void, size_t, off_t) -> ssize_t);
        // SAFETY: libc's pwrite64 with the caller's arguments.
        return unsafe { f(fd, buf, n, off) };
    }
    pwrite_pfs(fd, buf, n, off)
}

fn iovecs<'a>(iov: *const libc::iovec, cnt: c_int) -> Res<&'a [libc::iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller passes `cnt` iovecs.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

/// Bytes one vectored call moves at most through its bounce buffer; more is a
/// short transfer, as `readv`/`writev` allow (the program calls again).
const VECTORED_MAX: usize = 16 << 20;

/// A vectored read into one buffer, then scattered: `read_into` fills the
/// buffer and says how much.
fn readv_with(
    iov: *const libc::iovec,
    cnt: c_int,
    read_into: impl FnOnce(&mut [u8]) -> Res<usize>,
) -> Res<usize> {
    let v = iovecs(iov, cnt)?;
    let total = v.iter().fold(0usize, |t, x| t.saturating_add(x.iov_len)).min(VECTORED_MAX);
    let mut buf = vec![0u8; total];
    let n = read_into(&mut buf)?;
    let mut at = 0;
    for x in v {
        if at >= n {
            break;
        }
        let k = x.iov_len.min(n - at);
        slice_mut(x.iov_base, k).copy_from_slice(&buf[at..at + k]);
        at += k;
    }
    Ok(n)
}

/// The bytes of a vectored write, in order (at most [`VECTORED_MAX`]).
fn gather(iov: *const libc::iovec, cnt: c_int) -> Res<Vec<u8>> {
    let v = iovecs(iov, cnt)?;
    let total = v.iter().fold(0usize, |t, x| t.saturating_add(x.iov_len)).min(VECTORED_MAX);
    let mut buf = Vec::with_capacity(total);
    for x in v {
        let take = x.iov_len.min(total - buf.len());
        buf.extend_from_slice(slice(x.iov_base, take));
        if buf.len() == total {
            break;
        }
    }
    Ok(buf)
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(readv: fn(c_int, *const libc::iovec, c_int) -> ssize_t);
        // SAFETY: libc's readv with the caller's arguments.
        return unsafe { f(fd, iov, cnt) };
    }
    ret_size(with_busy(|| readv_with(iov, cnt, |b| ops::read(fd, b))))
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(writev: fn(c_int, *const libc::iovec, c_int) -> ssize_t);
        // SAFETY: libc's writev with the caller's arguments.
        return unsafe { f(fd, iov, cnt) };
    }
    ret_size(with_busy(|| ops::write(fd, &gather(iov, cnt)?)))
}

fn preadv_pfs(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t {
    ret_size(with_busy(|| {
        if off < 0 {
            return Err(libc::EINVAL);
        }
        let f = ops::file(fd)?;
        readv_with(iov, cnt, |b| ops::read_at(&f, off as u64, b))
    }))
}

fn pwritev_pfs(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: off_t) -> ssize_t {
    ret_size(with_busy(|| {
        if off < 0 {
            return Err(libc::EINVAL);
        }
        let f = ops::file(fd)?;
        ops::write_at(&f, Some(off as u64), &gather(iov, cnt)?).map(|(n, _)| n)
    }))
}

macro_rules! positioned_vec {
    ($name:ident, $pfs:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const libc::iovec,
            cnt: c_int,
            off: off_t,
        ) -> ssize_t {
            if !fds::is_pfs(fd) {
                let f = real!($name: fn(c_int, *const libc::iovec, c_int, off_t) -> ssize_t);
                // SAFETY: libc's function with the caller's arguments.
                return unsafe { f(fd, iov, cnt, off) };
            }
            $pfs(fd, iov, cnt, off)
        }
    };
}

positioned_vec!(preadv, preadv_pfs);
positioned_vec!(preadv64, preadv_pfs);
positioned_vec!(pwritev, pwritev_pfs);
positioned_vec!(pwritev64, pwritev_pfs);

macro_rules! positioned_vec2 {
    ($name:ident, $pfs:ident, $plain:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fd: c_int,
            iov: *const libc::iovec,
            cnt: c_int,
            off: off_t,
            flags: c_int,
        ) -> ssize_t {
            if !fds::is_pfs(fd) {
                let f = real!($name: fn(c_int, *const libc::iovec, c_int, off_t, c_int) -> ssize_t);
                // SAFETY: libc's function with the caller's arguments.
                return unsafe { f(fd, iov, cnt, off, flags) };
            }
            if off == -1 {
                // SAFETY: forwarded.
                return unsafe { $plain(fd, iov, cnt) };
            }
            $pfs(fd, iov, cnt, off)
        }
    };
}

positioned_vec2!(preadv2, preadv_pfs, readv);
positioned_vec2!(pwritev2, pwritev_pfs, writev);
positioned_vec2!(preadv64v2, preadv_pfs, readv);
positioned_vec2!(pwritev64v2, pwritev_pfs, writev);

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off_t, whence: c_int) -> off_t {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's lseek with the caller's arguments.
        return unsafe { real!(lseek: fn(c_int, off_t, c_int) -> off_t)(fd, off, whence) };
    }
    match with_busy(|| ops::lseek(fd, off, whence)) {
        Ok(o) => o as off_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off_t, whence: c_int) -> off_t {
    // SAFETY: forwarded (the same call on 64-bit Linux).
    unsafe { lseek(fd, off, whence) }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fsync.
        return unsafe { real!(fsync: fn(c_int) -> c_int)(fd) };
    }
    ret_unit(with_busy(|| ops::fsync(fd, false)))
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fdatasync.
        return unsafe { real!(fdatasync: fn(c_int) -> c_int)(fd) };
    }
    ret_unit(with_busy(|| ops::fsync(fd, true)))
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's ftruncate.
        return unsafe { real!(ftruncate: fn(c_int, off_t) -> c_int)(fd, len) };
    }
    ret_unit(with_busy(|| ops::ftruncate(fd, len)))
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { ftruncate(fd, len) }
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    by_path!(libc::AT_FDCWD, path, |abs| ret_unit(ops::truncate(&abs, len)), |p| {
        // SAFETY: libc's truncate.
        unsafe { real!(truncate: fn(*const c_char, off_t) -> c_int)(p, len) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { truncate(path, len) }
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    if !fds::is_pfs(fd) {
        let f = real!(fallocate: fn(c_int, c_int, off_t, off_t) -> c_int);
        // SAFETY: libc's fallocate.
        return unsafe { f(fd, mode, off, len) };
    }
    ret_unit(with_busy(|| ops::fallocate(fd, mode, off, len)))
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { fallocate(fd, mode, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off_t, len: off_t) -> c_int {
    if !fds::is_pfs(fd) {
        let f = real!(posix_fallocate: fn(c_int, off_t, off_t) -> c_int);
        // SAFETY: libc's posix_fallocate.
        return unsafe { f(fd, off, len) };
    }
    // Returns the error number instead of setting errno.
    with_busy(|| ops::fallocate(fd, 0, off, len)).err().unwrap_or(0)
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off_t, len: off_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { posix_fallocate(fd, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, off: off_t, len: off_t, advice: c_int) -> c_int {
    if !fds::is_pfs(fd) {
        let f = real!(posix_fadvise: fn(c_int, off_t, off_t, c_int) -> c_int);
        // SAFETY: libc's posix_fadvise.
        return unsafe { f(fd, off, len, advice) };
    }
    // Advice only: the servers read ahead on their own.
    0
}

#[no_mangle]
pub unsafe extern "C" fn posix_fadvise64(
    fd: c_int,
    off: off_t,
    len: off_t,
    advice: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { posix_fadvise(fd, off, len, advice) }
}

#[no_mangle]
pub unsafe extern "C" fn readahead(fd: c_int, off: libc::off64_t, n: size_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(readahead: fn(c_int, libc::off64_t, size_t) -> ssize_t);
        // SAFETY: libc's readahead.
        return unsafe { f(fd, off, n) };
    }
    ret_size(with_busy(|| ops::readahead(fd).map(|()| 0)))
}

#[no_mangle]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    off: libc::off64_t,
    n: libc::off64_t,
    flags: c_uint,
) -> c_int {
    if !fds::is_pfs(fd) {
        let f = real!(sync_file_range: fn(c_int, libc::off64_t, libc::off64_t, c_uint) -> c_int);
        // SAFETY: libc's sync_file_range.
        return unsafe { f(fd, off, n, flags) };
    }
    ret_unit(with_busy(|| ops::sync_file_range(fd, off, n, flags)))
}

#[no_mangle]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's syncfs.
        return unsafe { real!(syncfs: fn(c_int) -> c_int)(fd) };
    }
    ret_unit(with_busy(ops::sync_all))
}

#[no_mangle]
pub unsafe extern "C" fn sync() {
    if !busy() {
        // `sync` reports nothing; a failing file's own `fsync` will.
        let _ = with_busy(ops::sync_all);
    }
    // SAFETY: libc's sync.
    unsafe { real!(sync: fn() -> ())() }
}

// The file size limit: read again after the program changes it.

#[no_mangle]
pub unsafe extern "C" fn setrlimit(resource: c_int, rlim: *const libc::rlimit) -> c_int {
    // SAFETY: libc's setrlimit with the caller's arguments.
    let r = unsafe { real!(setrlimit: fn(c_int, *const libc::rlimit) -> c_int)(resource, rlim) };
    if r == 0 && resource == libc::RLIMIT_FSIZE as c_int {
        limits::refresh();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit64(resource: c_int, rlim: *const libc::rlimit) -> c_int {
    // SAFETY: forwarded.
    unsafe { setrlimit(resource, rlim) }
}

#[no_mangle]
pub unsafe extern "C" fn prlimit(
    pid: libc::pid_t,
    resource: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    let f = real!(prlimit: fn(libc::pid_t, c_int, *const libc::rlimit, *mut libc::rlimit) -> c_int);
    // SAFETY: libc's prlimit with the caller's arguments.
    let r = unsafe { f(pid, resource, new, old) };
    if r == 0 && !new.is_null() && resource == libc::RLIMIT_FSIZE as c_int {
        limits::refresh();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn prlimit64(
    pid: libc::pid_t,
    resource: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { prlimit(pid, resource, new, old) }
}

/// Copies at most 1 MiB from `fd_in` to `fd_out` (either may be a pfs
/// descriptor), at the given offsets or each descriptor's own.
fn copy_range(
    fd_in: c_int,
    off_in: Option<u64>,
    fd_out: c_int,
    off_out: Option<u64>,
    len: usize,
) -> Res<usize> {
    let mut buf = vec![0u8; len.min(1 << 20)];
    let n = match (fds::get(fd_in), off_in) {
        (Some(f), Some(o)) => ops::read_at(&f, o, &mut buf)?,
        (Some(_), None) => ops::read(fd_in, &mut buf)?,
        (None, off) => {
            // SAFETY: libc's pread/read into a buffer of this length.
            let r = unsafe {
                match off {
                    Some(o) => pread(fd_in, buf.as_mut_ptr().cast(), buf.len(), o as off_t),
                    None => read(fd_in, buf.as_mut_ptr().cast(), buf.len()),
                }
            };
            if r < 0 {
                return Err(ops::last_errno());
            }
            r as usize
        }
    };
    let data = &buf[..n];
    let mut done = 0;
    while done < n {
        let w = match (fds::get(fd_out), off_out) {
            (Some(f), Some(o)) => ops::write_at(&f, Some(o + done as u64), &data[done..])?.0,
            (Some(_), None) => ops::write(fd_out, &data[done..])?,
            (None, off) => {
                let rest = &data[done..];
                // SAFETY: libc's pwrite/write of this buffer.
                let r = unsafe {
                    match off {
                        Some(o) => pwrite(
                            fd_out,
                            rest.as_ptr().cast(),
                            rest.len(),
                            (o + done as u64) as off_t,
                        ),
                        None => write(fd_out, rest.as_ptr().cast(), rest.len()),
                    }
                };
                if r < 0 {
                    return Err(ops::last_errno());
                }
                r as usize
            }
        };
        if w == 0 {
            break;
        }
        done += w;
    }
    Ok(done)
}

unsafe fn offset_arg(p: *mut i64) -> Res<Option<u64>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller passes a readable offset.
    let o = unsafe { *p };
    if o < 0 {
        return Err(libc::EINVAL);
    }
    Ok(Some(o as u64))
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut i64,
    fd_out: c_int,
    off_out: *mut i64,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    if !fds::is_pfs(fd_in) && !fds::is_pfs(fd_out) {
        let f =
            real!(copy_file_range: fn(c_int, *mut i64, c_int, *mut i64, size_t, c_uint) -> ssize_t);
        // SAFETY: libc's copy_file_range with the caller's arguments.
        return unsafe { f(fd_in, off_in, fd_out, off_out, len, flags) };
    }
    ret_size(with_busy(|| {
        if flags != 0 {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's offsets.
        let (oi, oo) = unsafe { (offset_arg(off_in)?, offset_arg(off_out)?) };
        let n = copy_range(fd_in, oi, fd_out, oo, len)?;
        // SAFETY: the caller's offsets, advanced by what was copied.
        unsafe {
            if let Some(o) = oi {
                *off_in = (o + n as u64) as i64;
            }
            if let Some(o) = oo {
                *off_out = (o + n as u64) as i64;
            }
        }
        Ok(n)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    if !fds::is_pfs(in_fd) && !fds::is_pfs(out_fd) {
        let f = real!(sendfile: fn(c_int, c_int, *mut off_t, size_t) -> ssize_t);
        // SAFETY: libc's sendfile with the caller's arguments.
        return unsafe { f(out_fd, in_fd, offset, count) };
    }
    ret_size(with_busy(|| {
        // SAFETY: the caller's offset.
        let oi = unsafe { offset_arg(offset)? };
        let n = copy_range(in_fd, oi, out_fd, None, count)?;
        if let Some(o) = oi {
            // SAFETY: the caller's offset, advanced by what was sent.
            unsafe { *offset = (o + n as u64) as off_t };
        }
        Ok(n)
    }))
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut off_t,
    count: size_t,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { sendfile(out_fd, in_fd, offset, count) }
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS != 0 || !fds::is_pfs(fd) {
        let f = real!(mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void);
        // SAFETY: libc's mmap with the caller's arguments.
        return unsafe { f(addr, len, prot, flags, fd, off) };
    }
    match with_busy(|| maps::map(fd, len, prot, flags, off)) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            libc::MAP_FAILED
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    if maps::any() && !busy() {
        if let Err(e) = with_busy(|| maps::sync(addr as usize, len, flags)) {
            return ret_unit(Err(e));
        }
    }
    // SAFETY: libc's msync with the caller's arguments.
    unsafe { real!(msync: fn(*mut c_void, size_t, c_int) -> c_int)(addr, len, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let written =
        if maps::any() && !busy() { with_busy(|| maps::unmap(addr as usize, len)) } else { Ok(()) };
    // SAFETY: libc's munmap with the caller's arguments.
    let r = unsafe { real!(munmap: fn(*mut c_void, size_t) -> c_int)(addr, len) };
    match written {
        Ok(()) => r,
        Err(e) => ret_unit(Err(e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

// ---------------------------------------------------------------------------
// Attributes.

unsafe fn fstatat_any(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's path, when not null.
    let empty = !path.is_null() && unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 && (fds::is_pfs(dirfd) || dirfd == libc::AT_FDCWD)
    {
        if fds::is_pfs(dirfd) {
            return stat_into(with_busy(|| ops::fstat(dirfd)), st);
        }
        if let Some(cwd) = ops::virtual_cwd() {
            return stat_into(with_busy(|| ops::stat(&cwd, true)), st);
        }
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    by_path!(dirfd, path, |abs| stat_into(ops::stat(&abs, follow), st), |p| {
        let f = real!(fstatat: fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int);
        // SAFETY: libc's fstatat with the caller's arguments.
        unsafe { f(dirfd, p, st, flags) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(libc::AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(libc::AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fstat.
        return unsafe { real!(fstat: fn(c_int, *mut libc::stat) -> c_int)(fd, st) };
    }
    stat_into(with_busy(|| ops::fstat(fd)), st)
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstat(fd, st) }
}

// The `__xstat` family: what programs built against glibc before 2.33 call.
#[no_mangle]
pub unsafe extern "C" fn __xstat(_ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { stat(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __xstat64(_ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { stat(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat(_ver: c_int, path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { lstat(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __lxstat64(
    _ver: c_int,
    path: *const c_char,
    st: *mut libc::stat,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { lstat(path, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat(_ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstat(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstat64(_ver: c_int, fd: c_int, st: *mut libc::stat) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstat(fd, st) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __fxstatat64(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { fstatat_any(dirfd, path, st, flags) }
}

fn statx_into(r: Res<FileAttr>, out: *mut libc::statx) -> c_int {
    match r {
        Ok(a) if !out.is_null() => {
            // SAFETY: checked non-null; the caller's buffer.
            unsafe { fill_statx(&a, out) };
            0
        }
        Ok(_) => ret_unit(Err(libc::EFAULT)),
        Err(e) => ret_unit(Err(e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    out: *mut libc::statx,
) -> c_int {
    // SAFETY: the caller's path, when not null.
    let empty = !path.is_null() && unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 && fds::is_pfs(dirfd) {
        return statx_into(with_busy(|| ops::fstat(dirfd)), out);
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    by_path!(dirfd, path, |abs| statx_into(ops::stat(&abs, follow), out), |p| {
        let f = real!(statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int);
        // SAFETY: libc's statx with the caller's arguments.
        unsafe { f(dirfd, p, flags, mask, out) }
    })
}

unsafe fn access_at(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    by_path!(dirfd, path, |abs| ret_unit(ops::access(&abs, mode, follow)), |p| {
        let f = real!(faccessat: fn(c_int, *const c_char, c_int, c_int) -> c_int);
        // SAFETY: libc's faccessat with the caller's arguments.
        unsafe { f(dirfd, p, mode, flags) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { access_at(libc::AT_FDCWD, path, mode, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { access_at(dirfd, path, mode, flags) }
}

unsafe fn setattr_at(
    dirfd: c_int,
    path: *const c_char,
    follow: bool,
    set: SetAttr,
    real_call: impl FnOnce(*const c_char) -> c_int,
) -> c_int {
    by_path!(dirfd, path, |abs| ret_unit(ops::setattr_path(&abs, follow, &set)), |p| real_call(p))
}

fn setattr_fd(fd: c_int, set: SetAttr) -> c_int {
    ret_unit(with_busy(|| ops::setattr_fd(fd, &set)))
}

fn perm_set(mode: mode_t) -> SetAttr {
    SetAttr { perm: Some((mode & 0o7777) as u16), ..SetAttr::default() }
}

fn owner_set(uid: libc::uid_t, gid: libc::gid_t) -> SetAttr {
    SetAttr {
        uid: (uid != u32::MAX).then_some(uid),
        gid: (gid != u32::MAX).then_some(gid),
        ..SetAttr::default()
    }
}

#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        setattr_at(libc::AT_FDCWD, path, true, perm_set(mode), |p| {
            real!(chmod: fn(*const c_char, mode_t) -> c_int)(p, mode)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: forwarded.
    unsafe {
        setattr_at(dirfd, path, follow, perm_set(mode), |p| {
            real!(fchmodat: fn(c_int, *const c_char, mode_t, c_int) -> c_int)(dirfd, p, mode, flags)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fchmod.
        return unsafe { real!(fchmod: fn(c_int, mode_t) -> c_int)(fd, mode) };
    }
    setattr_fd(fd, perm_set(mode))
}

#[no_mangle]
pub unsafe extern "C" fn chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        setattr_at(libc::AT_FDCWD, path, true, owner_set(uid, gid), |p| {
            real!(chown: fn(*const c_char, libc::uid_t, libc::gid_t) -> c_int)(p, uid, gid)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        setattr_at(libc::AT_FDCWD, path, false, owner_set(uid, gid), |p| {
            real!(lchown: fn(*const c_char, libc::uid_t, libc::gid_t) -> c_int)(p, uid, gid)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: *const c_char,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's path, when not null.
    let empty = !path.is_null() && unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 && fds::is_pfs(dirfd) {
        return setattr_fd(dirfd, owner_set(uid, gid));
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: forwarded.
    unsafe {
        setattr_at(dirfd, path, follow, owner_set(uid, gid), |p| {
            let f =
                real!(fchownat: fn(c_int, *const c_char, libc::uid_t, libc::gid_t, c_int) -> c_int);
            f(dirfd, p, uid, gid, flags)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fchown.
        return unsafe {
            real!(fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int)(fd, uid, gid)
        };
    }
    setattr_fd(fd, owner_set(uid, gid))
}

/// The times `utimensat` sets (`NULL`: both now).
unsafe fn times_set(times: *const libc::timespec) -> Res<SetAttr> {
    if times.is_null() {
        let now = ops::now_ns();
        return Ok(SetAttr { atime_ns: Some(now), mtime_ns: Some(now), ..SetAttr::default() });
    }
    // SAFETY: the caller passes two timespecs.
    let (a, m) = unsafe { (&*times, &*times.add(1)) };
    Ok(SetAttr { atime_ns: ops::time_of(a)?, mtime_ns: ops::time_of(m)?, ..SetAttr::default() })
}

#[no_mangle]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: *const c_char,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    let real_call = |p: *const c_char| {
        let f = real!(utimensat: fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int);
        // SAFETY: libc's utimensat with the caller's arguments.
        unsafe { f(dirfd, p, times, flags) }
    };
    if path.is_null() {
        if !fds::is_pfs(dirfd) {
            return real_call(path);
        }
        // SAFETY: the caller's times.
        return match unsafe { times_set(times) } {
            Ok(set) => setattr_fd(dirfd, set),
            Err(e) => ret_unit(Err(e)),
        };
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    // SAFETY: the caller's times.
    let set = unsafe { times_set(times) };
    by_path!(
        dirfd,
        path,
        |abs| ret_unit(set.and_then(|s| ops::setattr_path(&abs, follow, &s))),
        |p| real_call(p)
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    if !fds::is_pfs(fd) {
        let f = real!(futimens: fn(c_int, *const libc::timespec) -> c_int);
        // SAFETY: libc's futimens.
        return unsafe { f(fd, times) };
    }
    // SAFETY: the caller's times.
    match unsafe { times_set(times) } {
        Ok(set) => setattr_fd(fd, set),
        Err(e) => ret_unit(Err(e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: libc's umask.
    let old = unsafe { real!(umask: fn(mode_t) -> mode_t)(mask) };
    ops::set_umask(mask);
    old
}

// ---------------------------------------------------------------------------
// Credentials: the library keeps the effective ids new files get; any change
// makes it read them again (`ops::forget_ids`), whether or not it succeeded.

/// Defines a hook of the `set*id` function `$name`.
macro_rules! set_ids {
    ($name:ident($($arg:ident: $ty:ty),+)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),+) -> c_int {
            // SAFETY: libc's function of the same name and signature.
            let r = unsafe { real!($name: fn($($ty),+) -> c_int)($($arg),+) };
            ops::forget_ids();
            r
        }
    };
}

set_ids!(setuid(uid: libc::uid_t));
set_ids!(seteuid(euid: libc::uid_t));
set_ids!(setreuid(ruid: libc::uid_t, euid: libc::uid_t));
set_ids!(setresuid(ruid: libc::uid_t, euid: libc::uid_t, suid: libc::uid_t));
set_ids!(setgid(gid: libc::gid_t));
set_ids!(setegid(egid: libc::gid_t));
set_ids!(setregid(rgid: libc::gid_t, egid: libc::gid_t));
set_ids!(setresgid(rgid: libc::gid_t, egid: libc::gid_t, sgid: libc::gid_t));

// ---------------------------------------------------------------------------
// Names.

#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    by_path!(libc::AT_FDCWD, path, |abs| ret_unit(ops::mkdir(&abs, mode)), |p| {
        // SAFETY: libc's mkdir.
        unsafe { real!(mkdir: fn(*const c_char, mode_t) -> c_int)(p, mode) }
    })
}

unsafe fn mknod_at(dirfd: c_int, path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    by_path!(dirfd, path, |abs| ret_unit(ops::mknod(&abs, mode, dev)), |p| {
        let f = real!(mknodat: fn(c_int, *const c_char, mode_t, libc::dev_t) -> c_int);
        // SAFETY: libc's mknodat.
        unsafe { f(dirfd, p, mode, dev) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn mknod(path: *const c_char, mode: mode_t, dev: libc::dev_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { mknod_at(libc::AT_FDCWD, path, mode, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn mknodat(
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: libc::dev_t,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { mknod_at(dirfd, path, mode, dev) }
}

/// glibc before 2.33 (programs built against it call these).
#[no_mangle]
pub unsafe extern "C" fn __xmknod(
    _ver: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    // SAFETY: forwarded (the caller passes the device number by pointer).
    unsafe { __xmknodat(_ver, libc::AT_FDCWD, path, mode, dev) }
}

#[no_mangle]
pub unsafe extern "C" fn __xmknodat(
    _ver: c_int,
    dirfd: c_int,
    path: *const c_char,
    mode: mode_t,
    dev: *const libc::dev_t,
) -> c_int {
    if dev.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: forwarded; `dev` points to a device number.
    unsafe { mknod_at(dirfd, path, mode, *dev) }
}

/// glibc's `mkfifo` makes its node inside libc, out of reach of `mknodat`'s
/// interposition.
#[no_mangle]
pub unsafe extern "C" fn mkfifo(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { mknod_at(libc::AT_FDCWD, path, libc::S_IFIFO | (mode & 0o7777), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkfifoat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: forwarded.
    unsafe { mknod_at(dirfd, path, libc::S_IFIFO | (mode & 0o7777), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    by_path!(dirfd, path, |abs| ret_unit(ops::mkdir(&abs, mode)), |p| {
        // SAFETY: libc's mkdirat.
        unsafe { real!(mkdirat: fn(c_int, *const c_char, mode_t) -> c_int)(dirfd, p, mode) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    by_path!(libc::AT_FDCWD, path, |abs| ret_unit(ops::rmdir(&abs)), |p| {
        // SAFETY: libc's rmdir.
        unsafe { real!(rmdir: fn(*const c_char) -> c_int)(p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    by_path!(libc::AT_FDCWD, path, |abs| ret_unit(ops::unlink(&abs)), |p| {
        // SAFETY: libc's unlink.
        unsafe { real!(unlink: fn(*const c_char) -> c_int)(p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    by_path!(
        dirfd,
        path,
        |abs| ret_unit(if flags & libc::AT_REMOVEDIR != 0 {
            ops::rmdir(&abs)
        } else {
            ops::unlink(&abs)
        }),
        |p| {
            // SAFETY: libc's unlinkat.
            unsafe { real!(unlinkat: fn(c_int, *const c_char, c_int) -> c_int)(dirfd, p, flags) }
        }
    )
}

/// A call on two paths: both pfs (`pfs`), neither (`real`, with the paths
/// libc should get), or one of each (`EXDEV`, as between two file systems).
unsafe fn two_paths(
    d1: c_int,
    p1: *const c_char,
    d2: c_int,
    p2: *const c_char,
    pfs: impl FnOnce(&[u8], &[u8]) -> Res<()>,
    real_call: impl FnOnce(*const c_char, *const c_char) -> c_int,
) -> c_int {
    // SAFETY: the caller's paths.
    let (a, b) = unsafe { (target(d1, p1), target(d2, p2)) };
    let libc_path = |t: &Target, orig: *const c_char| match t {
        Target::Elsewhere(c) => Some(c.as_ptr()),
        Target::Real => Some(orig),
        Target::Pfs(_) => None,
    };
    match (&a, &b) {
        (Target::Pfs(x), Target::Pfs(y)) => ret_unit(with_busy(|| pfs(x, y))),
        (Target::Pfs(_), _) | (_, Target::Pfs(_)) => ret_unit(Err(libc::EXDEV)),
        _ => real_call(libc_path(&a, p1).unwrap_or(p1), libc_path(&b, p2).unwrap_or(p2)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rename(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { renameat2(libc::AT_FDCWD, from, libc::AT_FDCWD, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { renameat2(d1, from, d2, to, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
    flags: c_uint,
) -> c_int {
    // SAFETY: the caller's paths.
    unsafe {
        two_paths(
            d1,
            from,
            d2,
            to,
            |a, b| ops::rename(a, b, flags),
            |x, y| {
                if flags == 0 {
                    real!(renameat: fn(c_int, *const c_char, c_int, *const c_char) -> c_int)(
                        d1, x, d2, y,
                    )
                } else {
                    let f = real!(renameat2: fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int);
                    f(d1, x, d2, y, flags)
                }
            },
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn link(from: *const c_char, to: *const c_char) -> c_int {
    // SAFETY: the caller's paths.
    unsafe {
        two_paths(
            libc::AT_FDCWD,
            from,
            libc::AT_FDCWD,
            to,
            |a, b| ops::link(a, b, false),
            |x, y| real!(link: fn(*const c_char, *const c_char) -> c_int)(x, y),
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn linkat(
    d1: c_int,
    from: *const c_char,
    d2: c_int,
    to: *const c_char,
    flags: c_int,
) -> c_int {
    let follow = flags & libc::AT_SYMLINK_FOLLOW != 0;
    // SAFETY: the caller's paths.
    unsafe {
        two_paths(
            d1,
            from,
            d2,
            to,
            |a, b| ops::link(a, b, follow),
            |x, y| {
                let f =
                    real!(linkat: fn(c_int, *const c_char, c_int, *const c_char, c_int) -> c_int);
                f(d1, x, d2, y, flags)
            },
        )
    }
}

unsafe fn symlink_at(target_path: *const c_char, dirfd: c_int, path: *const c_char) -> c_int {
    if target_path.is_null() {
        return ret_unit(Err(libc::EFAULT));
    }
    // SAFETY: the caller's nul-terminated target.
    let t = unsafe { CStr::from_ptr(target_path) }.to_bytes();
    by_path!(dirfd, path, |abs| ret_unit(ops::symlink(t, &abs)), |p| {
        let f = real!(symlinkat: fn(*const c_char, c_int, *const c_char) -> c_int);
        // SAFETY: libc's symlinkat.
        unsafe { f(target_path, dirfd, p) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn symlink(target_path: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: forwarded.
    unsafe { symlink_at(target_path, libc::AT_FDCWD, path) }
}

#[no_mangle]
pub unsafe extern "C" fn symlinkat(
    target_path: *const c_char,
    dirfd: c_int,
    path: *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { symlink_at(target_path, dirfd, path) }
}

unsafe fn readlink_at(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    by_path!(
        dirfd,
        path,
        |abs| ret_size(ops::readlink(&abs).map(|t| {
            let n = t.len().min(size);
            slice_mut(buf.cast(), n).copy_from_slice(&t[..n]);
            n
        })),
        |p| {
            let f = real!(readlinkat: fn(c_int, *const c_char, *mut c_char, size_t) -> ssize_t);
            // SAFETY: libc's readlinkat.
            unsafe { f(dirfd, p, buf, size) }
        }
    )
}

#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, size: size_t) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { readlink_at(libc::AT_FDCWD, path, buf, size) }
}

#[no_mangle]
pub unsafe extern "C" fn __readlink_chk(
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
    _buflen: size_t,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { readlink_at(libc::AT_FDCWD, path, buf, size) }
}

#[no_mangle]
pub unsafe extern "C" fn readlinkat(
    dirfd: c_int,
    path: *const c_char,
    buf: *mut c_char,
    size: size_t,
) -> ssize_t {
    // SAFETY: forwarded.
    unsafe { readlink_at(dirfd, path, buf, size) }
}

// ---------------------------------------------------------------------------
// Descriptors.

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    ops::give_back_kept();
    // SAFETY: libc's dup.
    let newfd = unsafe { real!(dup: fn(c_int) -> c_int)(fd) };
    if newfd < 0 || !fds::is_pfs(fd) {
        return newfd;
    }
    ret_int(with_busy(|| ops::duplicated(fd, newfd, false)))
}

unsafe fn dup_onto(
    oldfd: c_int,
    newfd: c_int,
    cloexec: bool,
    real_call: impl FnOnce() -> c_int,
) -> c_int {
    if oldfd != newfd && pfs_net::fdguard::is_guarded(newfd) {
        if ops::template() == Some(newfd) {
            // The program wants this number: the library's template moves.
            ops::template_taken(newfd);
        } else {
            // A link of the library lives at that number and cannot move.
            set_errno(libc::EBUSY);
            return -1;
        }
    }
    if oldfd != newfd {
        // The program's own number now, replaced by the kernel.
        ops::drop_kept(newfd);
    }
    let old_pfs = fds::is_pfs(oldfd);
    let new_pfs = fds::is_pfs(newfd);
    if old_pfs && oldfd != newfd {
        flush_std_stream(newfd);
    }
    let r = real_call();
    if r < 0 || oldfd == newfd || (!old_pfs && !new_pfs) {
        return r;
    }
    with_busy(|| {
        if old_pfs {
            let r = ret_int(ops::duplicated(oldfd, newfd, cloexec));
            if r >= 0 {
                replace_std_stream(newfd);
            }
            r
        } else {
            ops::replaced(newfd);
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    // SAFETY: libc's dup2 with the caller's arguments.
    unsafe {
        dup_onto(oldfd, newfd, false, || real!(dup2: fn(c_int, c_int) -> c_int)(oldfd, newfd))
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    // SAFETY: libc's dup3 with the caller's arguments.
    unsafe {
        dup_onto(oldfd, newfd, flags & libc::O_CLOEXEC != 0, || {
            real!(dup3: fn(c_int, c_int, c_int) -> c_int)(oldfd, newfd, flags)
        })
    }
}

/// What `F_GETFL` reports: the access mode and the file status flags.
const GETFL_MASK: c_int = libc::O_ACCMODE
    | libc::O_APPEND
    | libc::O_ASYNC
    | libc::O_DIRECT
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_NOATIME
    | libc::O_NONBLOCK
    | libc::O_PATH;

/// The kernel's `O_LARGEFILE`, which it sets on every file of a 64-bit process
/// and `F_GETFL` shows (glibc's constant is 0 there).
#[cfg(target_arch = "aarch64")]
const KERNEL_O_LARGEFILE: c_int = 0o400000;
#[cfg(not(target_arch = "aarch64"))]
const KERNEL_O_LARGEFILE: c_int = 0o100000;

/// Status flags `F_SETFL` may change (Linux's list).
const SETFL_MASK: c_int =
    libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME | libc::O_ASYNC;

unsafe fn fcntl_any(fd: c_int, cmd: c_int, arg: c_ulong, name: &'static str) -> c_int {
    let real_call = || {
        let f = if name == "fcntl64" {
            real!(fcntl64: fn(c_int, c_int, c_ulong) -> c_int)
        } else {
            real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int)
        };
        // SAFETY: libc's fcntl with the caller's arguments.
        unsafe { f(fd, cmd, arg) }
    };
    if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        // The kernel gives the lowest free number from `arg` up.
        ops::give_back_kept();
    }
    if !fds::is_pfs(fd) {
        return real_call();
    }
    match cmd {
        // The kernel keeps the descriptor flags of the reserved descriptor.
        libc::F_GETFD => real_call(),
        libc::F_SETFD => {
            let r = real_call();
            if r == 0 {
                fds::set_cloexec(fd, arg as c_int & libc::FD_CLOEXEC != 0);
            }
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let newfd = real_call();
            if newfd < 0 {
                return newfd;
            }
            let cloexec = cmd == libc::F_DUPFD_CLOEXEC;
            ret_int(with_busy(|| ops::duplicated(fd, newfd, cloexec)))
        }
        libc::F_GETFL => match fds::get(fd) {
            // The access mode and status flags, as the kernel reports them.
            Some(f) => f.flags() & GETFL_MASK | KERNEL_O_LARGEFILE,
            None => ret_int(Err(libc::EBADF)),
        },
        libc::F_SETFL => match fds::get(fd) {
            Some(f) => {
                let keep = f.flags() & !SETFL_MASK;
                f.flags.store(keep | (arg as c_int & SETFL_MASK), Ordering::Relaxed);
                0
            }
            None => ret_int(Err(libc::EBADF)),
        },
        // Record locks, at the file's home (`locks.rs`).
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW => {
            let l = arg as *mut libc::flock;
            if l.is_null() {
                return ret_int(Err(libc::EFAULT));
            }
            // SAFETY: the caller passes a `struct flock` for these commands.
            ret_int(with_busy(|| record_lock(fd, cmd, unsafe { &mut *l })))
        }
        _ => ret_int(with_busy(|| fcntl_other(fd, cmd, arg))),
    }
}

/// `fcntl(2)` commands the libc crate does not name (Linux's numbers).
const F_SETSIG: c_int = 10;
const F_GETSIG: c_int = 11;
const F_SETOWN_EX: c_int = 15;
const F_GETOWN_EX: c_int = 16;
const F_DUPFD_QUERY: c_int = 1027;
const F_GET_RW_HINT: c_int = 1035;
const F_SET_RW_HINT: c_int = 1036;
/// The largest write life hint (`RWH_WRITE_LIFE_EXTREME`).
const RWH_WRITE_LIFE_MAX: u64 = 5;

/// The other `fcntl` commands on pfs descriptor `fd`, as the kernel answers
/// them for a file of the mount: the `SIGIO` owner and signal and the write
/// life hint are kept and given back (nothing here raises `SIGIO`); no lease
/// is granted (`EAGAIN`: another node may have the file open, and no lease
/// could be broken for it); no directory notifications (`EINVAL`); pipe sizes
/// and seals are not a file's (`EBADF`, `EINVAL`).
fn fcntl_other(fd: c_int, cmd: c_int, arg: c_ulong) -> Res<c_int> {
    let f = ops::file(fd)?;
    let kept = || f.kept.lock().unwrap_or_else(|p| p.into_inner());
    // A process (or, negative, a process group) that exists.
    let exists = |id: c_int| {
        // SAFETY: signal 0 only checks that the target exists.
        id == 0 || unsafe { libc::kill(id, 0) } == 0 || ops::last_errno() == libc::EPERM
    };
    match cmd {
        libc::F_GETOWN => {
            let k = kept();
            Ok(if k.owner_type == fds::F_OWNER_PGRP { -k.owner } else { k.owner })
        }
        libc::F_SETOWN => {
            let who = arg as c_int;
            if who == c_int::MIN {
                return Err(libc::EINVAL);
            }
            if !exists(who) {
                return Err(libc::ESRCH);
            }
            let mut k = kept();
            (k.owner_type, k.owner) =
                if who < 0 { (fds::F_OWNER_PGRP, -who) } else { (fds::F_OWNER_PID, who) };
            Ok(0)
        }
        F_GETOWN_EX | F_SETOWN_EX => {
            let p = arg as *mut libc::c_int;
            if p.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: the caller passes a `struct f_owner_ex` (two ints).
            let ex = unsafe { std::slice::from_raw_parts_mut(p, 2) };
            let mut k = kept();
            if cmd == F_GETOWN_EX {
                ex.copy_from_slice(&[k.owner_type, k.owner]);
                return Ok(0);
            }
            let (kind, who) = (ex[0], ex[1]);
            if !matches!(kind, fds::F_OWNER_TID | fds::F_OWNER_PID | fds::F_OWNER_PGRP) {
                return Err(libc::EINVAL);
            }
            let target = if kind == fds::F_OWNER_PGRP { who.checked_neg() } else { Some(who) };
            if !target.is_some_and(exists) {
                return Err(libc::ESRCH);
            }
            (k.owner_type, k.owner) = (kind, who);
            Ok(0)
        }
        F_GETSIG => Ok(kept().sig),
        F_SETSIG => {
            let sig = arg as c_int;
            // Linux's `valid_signal`: up to `_NSIG` (64).
            if !(0..=64).contains(&sig) {
                return Err(libc::EINVAL);
            }
            kept().sig = sig;
            Ok(0)
        }
        libc::F_GETLEASE => Ok(libc::F_UNLCK),
        libc::F_SETLEASE => match arg as c_int {
            libc::F_UNLCK if f.kind == FileType::Regular => Ok(0),
            libc::F_RDLCK | libc::F_WRLCK if f.kind == FileType::Regular => Err(libc::EAGAIN),
            _ => Err(libc::EINVAL),
        },
        libc::F_NOTIFY if f.kind == FileType::Directory => Err(libc::EINVAL),
        libc::F_NOTIFY => Err(libc::ENOTDIR),
        libc::F_GETPIPE_SZ | libc::F_SETPIPE_SZ => Err(libc::EBADF),
        F_GET_RW_HINT | F_SET_RW_HINT => {
            let p = arg as *mut u64;
            if p.is_null() {
                return Err(libc::EFAULT);
            }
            if cmd == F_GET_RW_HINT {
                // SAFETY: the caller passes a `u64` for these commands.
                unsafe { p.write_unaligned(kept().write_hint) };
                return Ok(0);
            }
            // SAFETY: as above.
            let hint = unsafe { p.read_unaligned() };
            if hint > RWH_WRITE_LIFE_MAX {
                return Err(libc::EINVAL);
            }
            kept().write_hint = hint;
            Ok(0)
        }
        // Whether descriptor `arg` is the same open file description.
        F_DUPFD_QUERY => match fds::get(arg as c_int) {
            Some(g) => Ok(c_int::from(std::sync::Arc::ptr_eq(&f, &g))),
            None if kernel_open(arg as c_int) => Ok(0),
            None => Err(libc::EBADF),
        },
        _ => Err(libc::EINVAL),
    }
}

/// Whether `fd` is a descriptor the kernel has open.
fn kernel_open(fd: c_int) -> bool {
    let fcntl = real!(fcntl: fn(c_int, c_int, c_ulong) -> c_int);
    // SAFETY: asks for a descriptor's flags; no memory is passed.
    let flags = unsafe { fcntl(fd, libc::F_GETFD, 0) };
    flags >= 0
}

/// A record lock command on pfs descriptor `fd` (`fcntl(2)`'s rules).
fn record_lock(fd: c_int, cmd: c_int, l: &mut libc::flock) -> Res<c_int> {
    let f = ops::file(fd)?;
    let ofd = matches!(cmd, libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW);
    if ofd && l.l_pid != 0 {
        return Err(libc::EINVAL);
    }
    let kind = match c_int::from(l.l_type) {
        libc::F_RDLCK => LockKind::Read,
        libc::F_WRLCK => LockKind::Write,
        libc::F_UNLCK => LockKind::Unlock,
        _ => return Err(libc::EINVAL),
    };
    let getlk = matches!(cmd, libc::F_GETLK | libc::F_OFD_GETLK);
    if !getlk
        && (kind == LockKind::Read && !f.readable() || kind == LockKind::Write && !f.writable())
    {
        return Err(libc::EBADF);
    }
    let base = match c_int::from(l.l_whence) {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => f.state().offset,
        libc::SEEK_END => ops::fstat(fd)?.size,
        _ => return Err(libc::EINVAL),
    };
    let (start, end) = locks::range(base, l.l_start, l.l_len)?;
    let pid = std::process::id();
    let lock = FileLock { kind, flock: false, start, end, pid };
    let owner = if ofd { locks::description_owner(&f) } else { locks::process_owner() };
    let mode = match cmd {
        libc::F_GETLK | libc::F_OFD_GETLK if kind == LockKind::Unlock => return Err(libc::EINVAL),
        libc::F_GETLK | libc::F_OFD_GETLK => locks::Mode::Test,
        libc::F_SETLKW | libc::F_OFD_SETLKW => locks::Mode::Wait,
        _ => locks::Mode::Try,
    };
    match locks::lock(&f, owner, lock, mode)? {
        Some(c) => {
            l.l_type = match c.kind {
                LockKind::Read => libc::F_RDLCK,
                _ => libc::F_WRLCK,
            } as i16;
            l.l_whence = libc::SEEK_SET as i16;
            l.l_start = c.start as i64;
            l.l_len = if c.end == LOCK_END_MAX { 0 } else { (c.end - c.start + 1) as i64 };
            // Linux reports -1 for an open file description's lock; a
            // process on another node is none of this one's (0).
            l.l_pid = if ofd { -1 } else { c.pid as i32 };
        }
        None if getlk => l.l_type = libc::F_UNLCK as i16,
        None => {}
    }
    Ok(0)
}

/// `flock(2)` on pfs descriptor `fd`.
fn flock_pfs(fd: c_int, op: c_int) -> Res<c_int> {
    let f = ops::file(fd)?;
    let kind = match op & !libc::LOCK_NB {
        libc::LOCK_SH => LockKind::Read,
        libc::LOCK_EX => LockKind::Write,
        libc::LOCK_UN => LockKind::Unlock,
        _ => return Err(libc::EINVAL),
    };
    let pid = std::process::id();
    let lock = FileLock { kind, flock: true, start: 0, end: LOCK_END_MAX, pid };
    let mode = if op & libc::LOCK_NB != 0 { locks::Mode::Try } else { locks::Mode::Wait };
    locks::lock(&f, locks::description_owner(&f), lock, mode).map(|_| 0)
}

#[no_mangle]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's flock with the caller's arguments.
        return unsafe { real!(flock: fn(c_int, c_int) -> c_int)(fd, op) };
    }
    ret_int(with_busy(|| flock_pfs(fd, op)))
}

/// `lockf(3)` on pfs descriptor `fd`: glibc's calls its own `fcntl`, which
/// this library does not see, so it is answered here (the same record
/// locks, from the file offset for `len` bytes).
fn lockf_pfs(fd: c_int, cmd: c_int, len: i64) -> Res<c_int> {
    let f = ops::file(fd)?;
    let (start, end) = locks::range(f.state().offset, 0, len)?;
    let pid = std::process::id();
    let at = |kind| FileLock { kind, flock: false, start, end, pid };
    let owner = locks::process_owner();
    match cmd {
        libc::F_TEST => match locks::lock(&f, owner, at(LockKind::Write), locks::Mode::Test)? {
            // A lock of another process: `EACCES`, as glibc's.
            Some(_) => Err(libc::EACCES),
            None => Ok(0),
        },
        _ if !f.writable() => Err(libc::EBADF),
        libc::F_LOCK => locks::lock(&f, owner, at(LockKind::Write), locks::Mode::Wait).map(|_| 0),
        libc::F_TLOCK => locks::lock(&f, owner, at(LockKind::Write), locks::Mode::Try).map(|_| 0),
        libc::F_ULOCK => locks::lock(&f, owner, at(LockKind::Unlock), locks::Mode::Try).map(|_| 0),
        _ => Err(libc::EINVAL),
    }
}

#[no_mangle]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: libc::off_t) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's lockf with the caller's arguments.
        return unsafe { real!(lockf: fn(c_int, c_int, libc::off_t) -> c_int)(fd, cmd, len) };
    }
    ret_int(with_busy(|| lockf_pfs(fd, cmd, len)))
}

#[no_mangle]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: libc::off64_t) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's lockf64 with the caller's arguments.
        return unsafe { real!(lockf64: fn(c_int, c_int, libc::off64_t) -> c_int)(fd, cmd, len) };
    }
    ret_int(with_busy(|| lockf_pfs(fd, cmd, len)))
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded.
    unsafe { fcntl_any(fd, cmd, arg, "fcntl") }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: forwarded.
    unsafe { fcntl_any(fd, cmd, arg, "fcntl64") }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: *mut c_void) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's ioctl with the caller's arguments.
        return unsafe { real!(ioctl: fn(c_int, c_ulong, *mut c_void) -> c_int)(fd, request, arg) };
    }
    // No ioctl applies to a pfs file (not a terminal, no reflink).
    ret_int(Err(libc::ENOTTY))
}

// ---------------------------------------------------------------------------
// File systems.

unsafe fn fill_statfs(s: &pfs_core::StatFs, out: *mut libc::statfs) {
    // SAFETY: all-zero is a valid `statfs`.
    let mut f: libc::statfs = unsafe { std::mem::zeroed() };
    // What the mount reports: FUSE_SUPER_MAGIC.
    f.f_type = 0x6573_5546;
    f.f_bsize = s.block_size as _;
    f.f_frsize = s.block_size as _;
    f.f_blocks = s.blocks;
    f.f_bfree = s.blocks_free;
    f.f_bavail = s.blocks_free;
    f.f_files = s.files;
    f.f_ffree = s.files_free;
    f.f_namelen = s.name_max as _;
    // SAFETY: the caller's buffer.
    unsafe { out.write(f) };
}

unsafe fn fill_statvfs(s: &pfs_core::StatFs, out: *mut libc::statvfs) {
    // SAFETY: all-zero is a valid `statvfs`.
    let mut f: libc::statvfs = unsafe { std::mem::zeroed() };
    f.f_bsize = s.block_size as _;
    f.f_frsize = s.block_size as _;
    f.f_blocks = s.blocks;
    f.f_bfree = s.blocks_free;
    f.f_bavail = s.blocks_free;
    f.f_files = s.files;
    f.f_ffree = s.files_free;
    f.f_favail = s.files_free;
    f.f_namemax = s.name_max as _;
    // SAFETY: the caller's buffer.
    unsafe { out.write(f) };
}

fn statfs_into<T>(
    exists: Res<()>,
    out: *mut T,
    fill: unsafe fn(&pfs_core::StatFs, *mut T),
) -> c_int {
    if out.is_null() {
        return ret_unit(Err(libc::EFAULT));
    }
    ret_unit(exists.and_then(|()| ops::statfs()).map(|s| {
        // SAFETY: checked non-null; the caller's buffer.
        unsafe { fill(&s, out) }
    }))
}

macro_rules! statfs_hooks {
    ($path_fn:ident, $fd_fn:ident, $ty:ty, $fill:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $path_fn(path: *const c_char, out: *mut $ty) -> c_int {
            by_path!(
                libc::AT_FDCWD,
                path,
                |abs| statfs_into(ops::access(&abs, libc::F_OK, true), out, $fill),
                |p| {
                    // SAFETY: libc's function with the caller's arguments.
                    unsafe { real!($path_fn: fn(*const c_char, *mut $ty) -> c_int)(p, out) }
                }
            )
        }

        #[no_mangle]
        pub unsafe extern "C" fn $fd_fn(fd: c_int, out: *mut $ty) -> c_int {
            if !fds::is_pfs(fd) {
                // SAFETY: libc's function with the caller's arguments.
                return unsafe { real!($fd_fn: fn(c_int, *mut $ty) -> c_int)(fd, out) };
            }
            with_busy(|| statfs_into(Ok(()), out, $fill))
        }
    };
}

statfs_hooks!(statfs, fstatfs, libc::statfs, fill_statfs);
statfs_hooks!(statfs64, fstatfs64, libc::statfs, fill_statfs);
statfs_hooks!(statvfs, fstatvfs, libc::statvfs, fill_statvfs);
statfs_hooks!(statvfs64, fstatvfs64, libc::statvfs, fill_statvfs);

// ---------------------------------------------------------------------------
// The working directory.

#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let real_chdir = |p: *const c_char| {
        // SAFETY: libc's chdir.
        let r = unsafe { real!(chdir: fn(*const c_char) -> c_int)(p) };
        if r == 0 && !busy() {
            with_busy(ops::left_pfs);
        }
        r
    };
    by_path!(libc::AT_FDCWD, path, |abs| ret_unit(ops::chdir(&abs)), |p| real_chdir(p))
}

#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fchdir.
        let r = unsafe { real!(fchdir: fn(c_int) -> c_int)(fd) };
        if r == 0 && !busy() {
            with_busy(ops::left_pfs);
        }
        return r;
    }
    ret_unit(with_busy(|| ops::fchdir(fd)))
}

/// Copies `s` as a C string into `buf` of `size` bytes, or into fresh
/// `malloc`ed memory when `buf` is null (glibc's extension).
fn c_string_out(s: &[u8], buf: *mut c_char, size: size_t) -> *mut c_char {
    let need = s.len() + 1;
    let out = if buf.is_null() {
        // SAFETY: a fresh allocation the caller frees.
        let p = unsafe { libc::malloc(need.max(size)) }.cast::<c_char>();
        if p.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        p
    } else {
        if size < need {
            set_errno(libc::ERANGE);
            return std::ptr::null_mut();
        }
        buf
    };
    let dst = slice_mut(out.cast(), need);
    dst[..s.len()].copy_from_slice(s);
    dst[s.len()] = 0;
    out
}

#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    let cwd = if busy() { None } else { ops::virtual_cwd() };
    match cwd {
        Some(c) => c_string_out(&c, buf, if buf.is_null() { 0 } else { size }),
        // SAFETY: libc's getcwd with the caller's arguments.
        None => unsafe { real!(getcwd: fn(*mut c_char, size_t) -> *mut c_char)(buf, size) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn __getcwd_chk(
    buf: *mut c_char,
    size: size_t,
    _buflen: size_t,
) -> *mut c_char {
    // SAFETY: forwarded.
    unsafe { getcwd(buf, size) }
}

#[no_mangle]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    // SAFETY: forwarded (a fresh allocation).
    unsafe { getcwd(std::ptr::null_mut(), 0) }
}

#[no_mangle]
pub unsafe extern "C" fn realpath(path: *const c_char, resolved: *mut c_char) -> *mut c_char {
    // SAFETY: the caller's path.
    match unsafe { target(libc::AT_FDCWD, path) } {
        Target::Pfs(abs) => match with_busy(|| ops::realpath(&abs)) {
            Ok(p) => c_string_out(
                &p,
                resolved,
                if resolved.is_null() { 0 } else { libc::PATH_MAX as usize },
            ),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        },
        t => {
            let p = match &t {
                Target::Elsewhere(c) => c.as_ptr(),
                _ => path,
            };
            // SAFETY: libc's realpath.
            unsafe { real!(realpath: fn(*const c_char, *mut c_char) -> *mut c_char)(p, resolved) }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn __realpath_chk(
    path: *const c_char,
    resolved: *mut c_char,
    _len: size_t,
) -> *mut c_char {
    // SAFETY: forwarded.
    unsafe { realpath(path, resolved) }
}

#[no_mangle]
pub unsafe extern "C" fn canonicalize_file_name(path: *const c_char) -> *mut c_char {
    // SAFETY: forwarded.
    unsafe { realpath(path, std::ptr::null_mut()) }
}

// ---------------------------------------------------------------------------
// Directory streams.

/// A `DIR` of a pfs directory: the descriptor and the entry `readdir` returns.
struct PfsDir {
    fd: c_int,
    entry: libc::dirent64,
}

static DIRS: Mutex<BTreeMap<usize, ()>> = Mutex::new(BTreeMap::new());
static DIR_COUNT: AtomicUsize = AtomicUsize::new(0);

/// `d` as a pfs stream, if it is one.
fn pfs_dir(d: *mut libc::DIR) -> Option<*mut PfsDir> {
    if DIR_COUNT.load(Ordering::Acquire) == 0 || d.is_null() {
        return None;
    }
    let dirs = DIRS.lock().unwrap_or_else(|p| p.into_inner());
    dirs.contains_key(&(d as usize)).then_some(d.cast())
}

fn new_dir(fd: c_int) -> *mut libc::DIR {
    // SAFETY: all-zero is a valid dirent64.
    let entry = unsafe { std::mem::zeroed() };
    let p = Box::into_raw(Box::new(PfsDir { fd, entry }));
    DIRS.lock().unwrap_or_else(|e| e.into_inner()).insert(p as usize, ());
    DIR_COUNT.fetch_add(1, Ordering::AcqRel);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut libc::DIR {
    // SAFETY: the caller's path.
    match unsafe { target(libc::AT_FDCWD, path) } {
        Target::Pfs(abs) => match with_busy(|| ops::opendir(abs.into_owned())) {
            Ok(fd) => new_dir(fd),
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        },
        // SAFETY: libc's opendir.
        t => open_real(t, path, |p| unsafe {
            real!(opendir: fn(*const c_char) -> *mut libc::DIR)(p)
        }),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    let Some(f) = fds::get(fd) else {
        // SAFETY: libc's fdopendir.
        return unsafe { real!(fdopendir: fn(c_int) -> *mut libc::DIR)(fd) };
    };
    if f.kind != pfs_core::FileType::Directory {
        set_errno(libc::ENOTDIR);
        return std::ptr::null_mut();
    }
    new_dir(fd)
}

unsafe fn readdir_pfs(d: *mut PfsDir) -> *mut libc::dirent64 {
    // SAFETY: `d` is a live stream of this library.
    let dir = unsafe { &mut *d };
    // The end of a listing leaves errno as it was (callers clear it to tell
    // the end from an error); the client's own calls may have changed it.
    // SAFETY: the calling thread's errno slot.
    let errno_before = unsafe { *libc::__errno_location() };
    let r = with_busy(|| ops::file(dir.fd).and_then(|f| ops::next_entry(&f)));
    match r {
        Ok(Some(ops::Entry { ino, kind, name, next: off })) => {
            let e = &mut dir.entry;
            let n = name.len().min(e.d_name.len() - 1);
            e.d_ino = ino;
            e.d_off = off as i64;
            e.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
            e.d_type = ops::dtype(kind);
            for (i, b) in name[..n].iter().enumerate() {
                e.d_name[i] = *b as c_char;
            }
            e.d_name[n] = 0;
            e
        }
        Ok(None) => {
            set_errno(errno_before);
            std::ptr::null_mut()
        }
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn readdir64(d: *mut libc::DIR) -> *mut libc::dirent64 {
    match pfs_dir(d) {
        // SAFETY: one of this library's streams.
        Some(p) => unsafe { readdir_pfs(p) },
        // SAFETY: libc's readdir64.
        None => unsafe { real!(readdir64: fn(*mut libc::DIR) -> *mut libc::dirent64)(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn readdir(d: *mut libc::DIR) -> *mut libc::dirent {
    const _: () =
        assert!(std::mem::size_of::<libc::dirent>() == std::mem::size_of::<libc::dirent64>());
    match pfs_dir(d) {
        // SAFETY: one of this library's streams; dirent and dirent64 are one
        // layout on 64-bit Linux.
        Some(p) => unsafe { readdir_pfs(p) }.cast(),
        // SAFETY: libc's readdir.
        None => unsafe { real!(readdir: fn(*mut libc::DIR) -> *mut libc::dirent)(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut libc::DIR) -> c_int {
    let Some(p) = pfs_dir(d) else {
        // SAFETY: libc's closedir.
        return unsafe { real!(closedir: fn(*mut libc::DIR) -> c_int)(d) };
    };
    DIRS.lock().unwrap_or_else(|e| e.into_inner()).remove(&(p as usize));
    DIR_COUNT.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: made by `new_dir` and now out of the registry.
    let dir = unsafe { Box::from_raw(p) };
    ret_unit(with_busy(|| ops::close(dir.fd)))
}

#[no_mangle]
pub unsafe extern "C" fn dirfd(d: *mut libc::DIR) -> c_int {
    match pfs_dir(d) {
        // SAFETY: one of this library's streams.
        Some(p) => unsafe { (*p).fd },
        // SAFETY: libc's dirfd.
        None => unsafe { real!(dirfd: fn(*mut libc::DIR) -> c_int)(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut libc::DIR) {
    match pfs_dir(d) {
        Some(p) => {
            // SAFETY: one of this library's streams.
            let fd = unsafe { (*p).fd };
            let _ = with_busy(|| ops::lseek(fd, 0, libc::SEEK_SET));
        }
        // SAFETY: libc's rewinddir.
        None => unsafe { real!(rewinddir: fn(*mut libc::DIR) -> ())(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut libc::DIR) -> libc::c_long {
    match pfs_dir(d) {
        Some(p) => {
            // SAFETY: one of this library's streams.
            let fd = unsafe { (*p).fd };
            match fds::get(fd) {
                Some(f) => f.state().offset as libc::c_long,
                None => {
                    set_errno(libc::EBADF);
                    -1
                }
            }
        }
        // SAFETY: libc's telldir.
        None => unsafe { real!(telldir: fn(*mut libc::DIR) -> libc::c_long)(d) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut libc::DIR, pos: libc::c_long) {
    match pfs_dir(d) {
        Some(p) => {
            // SAFETY: one of this library's streams.
            let fd = unsafe { (*p).fd };
            with_busy(|| {
                let Some(f) = fds::get(fd) else { return };
                if ops::lseek(fd, 0, libc::SEEK_SET).is_err() {
                    return;
                }
                // Bounded by the listing: next_entry returns None at its end.
                while (f.state().offset as libc::c_long) < pos {
                    if !matches!(ops::next_entry(&f), Ok(Some(_))) {
                        break;
                    }
                }
            });
        }
        // SAFETY: libc's seekdir.
        None => unsafe { real!(seekdir: fn(*mut libc::DIR, libc::c_long) -> ())(d, pos) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's getdents64 with the caller's arguments.
        return unsafe {
            real!(getdents64: fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, count)
        };
    }
    ret_size(with_busy(|| ops::getdents64(fd, slice_mut(buf, count))))
}

// ---------------------------------------------------------------------------
// stdio: a pfs FILE is a `fopencookie` stream over a pfs descriptor.

type CookieRead = unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t;
type CookieWrite = unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t;
type CookieSeek = unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int;
type CookieClose = unsafe extern "C" fn(*mut c_void) -> c_int;

#[repr(C)]
struct CookieIo {
    read: Option<CookieRead>,
    write: Option<CookieWrite>,
    seek: Option<CookieSeek>,
    close: Option<CookieClose>,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
}

// A stream's cookie is its descriptor number; its functions go through this
// library's own `read`/`write`/`lseek`/`close`, so a stream stays right when
// its descriptor stops being a pfs one (a replaced `stdout` after `dup2`).

unsafe extern "C" fn cookie_read(c: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio passes `n` writable bytes.
    unsafe { read(c as usize as c_int, buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(c: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio passes `n` readable bytes.
    let r = unsafe { write(c as usize as c_int, buf.cast(), n) };
    // A failed write is 0 bytes written: stdio then sets the error flag.
    r.max(0)
}

unsafe extern "C" fn cookie_seek(c: *mut c_void, pos: *mut i64, whence: c_int) -> c_int {
    // SAFETY: stdio passes a readable and writable position.
    let o = unsafe { lseek(c as usize as c_int, *pos, whence) };
    if o < 0 {
        return -1;
    }
    // SAFETY: as above.
    unsafe { *pos = o };
    0
}

unsafe extern "C" fn cookie_close(c: *mut c_void) -> c_int {
    // SAFETY: the stream's own descriptor.
    unsafe { close(c as usize as c_int) }
}

extern "C" {
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

static STD_SWAPPED: [std::sync::atomic::AtomicBool; 3] =
    [const { std::sync::atomic::AtomicBool::new(false) }; 3];

/// libc's own `stdin`/`stdout`/`stderr` write and read their descriptor inside
/// libc, out of this library's reach. When descriptor 0, 1 or 2 becomes a pfs
/// one, the standard stream is replaced (once) by one over this library's
/// calls, which serves whatever the descriptor is from then on.
fn replace_std_stream(fd: c_int) {
    let Some(slot) = usize::try_from(fd).ok().filter(|&i| i < 3) else { return };
    if STD_SWAPPED[slot].swap(true, Ordering::AcqRel) {
        return;
    }
    let mode = if fd == 0 { c"r" } else { c"w" };
    let f = stream(fd, mode.as_ptr());
    if f.is_null() {
        return;
    }
    // SAFETY: libc's standard stream variables, assigned as C programs may;
    // stderr stays unbuffered.
    unsafe {
        match fd {
            0 => stdin = f,
            1 => stdout = f,
            _ => {
                libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0);
                stderr = f;
            }
        }
    }
}

/// Before descriptor 0, 1 or 2 changes: what libc's own stream buffered goes
/// where the descriptor points now.
fn flush_std_stream(fd: c_int) {
    let Some(slot) = usize::try_from(fd).ok().filter(|&i| i < 3) else { return };
    if slot == 0 || STD_SWAPPED[slot].load(Ordering::Acquire) {
        return;
    }
    // SAFETY: libc's standard stream.
    unsafe { libc::fflush(if slot == 1 { stdout } else { stderr }) };
}

/// At start: standard descriptors handed over as pfs ones get streams.
fn replace_inherited_std_streams() {
    for fd in 0..3 {
        if fds::is_pfs(fd) {
            replace_std_stream(fd);
        }
    }
}

static FILES: Mutex<BTreeMap<usize, c_int>> = Mutex::new(BTreeMap::new());
static FILE_COUNT: AtomicUsize = AtomicUsize::new(0);

/// A stdio stream over descriptor `fd`; on failure `fd` is closed unless it is
/// a standard one.
fn stream(fd: c_int, mode: *const c_char) -> *mut FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: glibc's fopencookie; the cookie is the descriptor number.
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode, io) };
    if f.is_null() {
        let e = ops::last_errno();
        if fd > 2 {
            let _ = with_busy(|| ops::close(fd));
        }
        set_errno(e);
        return f;
    }
    FILES.lock().unwrap_or_else(|e| e.into_inner()).insert(f as usize, fd);
    FILE_COUNT.fetch_add(1, Ordering::AcqRel);
    f
}

/// libc's opening call for a path outside pfs (`t` is not `Target::Pfs`): the
/// caller's path, or the absolute one a pfs working directory makes of it.
/// The kernel gives the lowest free number, so a kept one goes back first.
fn open_real<T>(t: Target, path: *const c_char, real_call: impl FnOnce(*const c_char) -> T) -> T {
    ops::give_back_kept();
    match &t {
        Target::Elsewhere(c) => real_call(c.as_ptr()),
        _ => real_call(path),
    }
}

unsafe fn fopen_any(
    path: *const c_char,
    mode: *const c_char,
    real_call: impl FnOnce(*const c_char) -> *mut FILE,
) -> *mut FILE {
    // SAFETY: the caller's path.
    match unsafe { target(libc::AT_FDCWD, path) } {
        Target::Pfs(abs) => {
            // SAFETY: the caller's nul-terminated mode.
            let m = if mode.is_null() {
                None
            } else {
                Some(unsafe { CStr::from_ptr(mode) }.to_bytes())
            };
            let Some(flags) = m.and_then(fopen_flags) else {
                set_errno(libc::EINVAL);
                return std::ptr::null_mut();
            };
            match with_busy(|| ops::open(abs.into_owned(), flags, 0o666)) {
                Ok(fd) => stream(fd, mode),
                Err(e) => {
                    set_errno(e);
                    std::ptr::null_mut()
                }
            }
        }
        t => open_real(t, path, real_call),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's arguments; libc's fopen otherwise.
    unsafe {
        fopen_any(path, mode, |p| {
            real!(fopen: fn(*const c_char, *const c_char) -> *mut FILE)(p, mode)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    // SAFETY: the caller's arguments; libc's fopen64 otherwise.
    unsafe {
        fopen_any(path, mode, |p| {
            real!(fopen64: fn(*const c_char, *const c_char) -> *mut FILE)(p, mode)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fdopen.
        return unsafe { real!(fdopen: fn(c_int, *const c_char) -> *mut FILE)(fd, mode) };
    }
    stream(fd, mode)
}

/// The pfs descriptor behind stream `f`, if it is one.
fn pfs_stream(f: *mut FILE) -> Option<c_int> {
    if FILE_COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    FILES.lock().unwrap_or_else(|e| e.into_inner()).get(&(f as usize)).copied()
}

#[no_mangle]
pub unsafe extern "C" fn fileno(f: *mut FILE) -> c_int {
    match pfs_stream(f) {
        Some(fd) => fd,
        // SAFETY: libc's fileno.
        None => unsafe { real!(fileno: fn(*mut FILE) -> c_int)(f) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fileno_unlocked(f: *mut FILE) -> c_int {
    match pfs_stream(f) {
        Some(fd) => fd,
        // SAFETY: libc's fileno_unlocked.
        None => unsafe { real!(fileno_unlocked: fn(*mut FILE) -> c_int)(f) },
    }
}

#[no_mangle]
pub unsafe extern "C" fn fclose(f: *mut FILE) -> c_int {
    if pfs_stream(f).is_some() {
        FILES.lock().unwrap_or_else(|e| e.into_inner()).remove(&(f as usize));
        FILE_COUNT.fetch_sub(1, Ordering::AcqRel);
    }
    // SAFETY: libc's fclose (a pfs stream's close function closes its descriptor).
    unsafe { real!(fclose: fn(*mut FILE) -> c_int)(f) }
}

/// `freopen` onto a pfs path. A standard stream becomes the file through its
/// descriptor (`dup2` onto 0, 1 or 2, which also gives it a stream of this
/// library's); another stream is closed and a new one returned, which callers
/// that keep using the old pointer do not see (docs/preload.md).
unsafe fn freopen_pfs(abs: Vec<u8>, mode: *const c_char, old: *mut FILE) -> Res<*mut FILE> {
    // SAFETY: the caller's nul-terminated mode.
    let m = if mode.is_null() { None } else { Some(unsafe { CStr::from_ptr(mode) }.to_bytes()) };
    let flags = m.and_then(fopen_flags).ok_or(libc::EINVAL)?;
    // SAFETY: libc's standard stream variables, read.
    let std = unsafe { [stdin, stdout, stderr] }.iter().position(|&s| s == old);
    if let Some(n) = std {
        // SAFETY: the caller's stream.
        unsafe { libc::fflush(old) };
        let fd = with_busy(|| ops::open(abs, flags & !libc::O_CLOEXEC, 0o666))?;
        // SAFETY: this library's dup2 and close on descriptors it owns.
        let r = unsafe { dup2(fd, n as c_int) };
        // SAFETY: as above.
        unsafe { close(fd) };
        if r < 0 {
            return Err(ops::last_errno());
        }
        // SAFETY: the standard stream variables, read after dup2 replaced one.
        return Ok(unsafe { [stdin, stdout, stderr] }[n]);
    }
    let fd = with_busy(|| ops::open(abs, flags, 0o666))?;
    if !old.is_null() {
        // SAFETY: the caller gives its stream up, as freopen closes it.
        unsafe { fclose(old) };
    }
    let f = stream(fd, mode);
    if f.is_null() {
        return Err(ops::last_errno());
    }
    Ok(f)
}

unsafe fn freopen_any(
    path: *const c_char,
    mode: *const c_char,
    old: *mut FILE,
    real_call: impl FnOnce(*const c_char) -> *mut FILE,
) -> *mut FILE {
    // SAFETY: the caller's path.
    match unsafe { target(libc::AT_FDCWD, path) } {
        // SAFETY: forwarded.
        Target::Pfs(abs) => match unsafe { freopen_pfs(abs.into_owned(), mode, old) } {
            Ok(f) => f,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        },
        t => open_real(t, path, real_call),
    }
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    old: *mut FILE,
) -> *mut FILE {
    let f = real!(freopen: fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE);
    // SAFETY: the caller's arguments; libc's freopen otherwise.
    unsafe { freopen_any(path, mode, old, |p| f(p, mode, old)) }
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    old: *mut FILE,
) -> *mut FILE {
    let f = real!(freopen64: fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE);
    // SAFETY: the caller's arguments; libc's freopen64 otherwise.
    unsafe { freopen_any(path, mode, old, |p| f(p, mode, old)) }
}

// ---------------------------------------------------------------------------
// Extended attributes.

/// Copies `v` out as the xattr calls do: `size` 0 asks for the length, a
/// smaller buffer is `ERANGE`.
fn xattr_out(r: Res<Vec<u8>>, buf: *mut c_void, size: size_t) -> ssize_t {
    ret_size(r.and_then(|v| {
        if size == 0 {
            return Ok(v.len());
        }
        if size < v.len() {
            return Err(libc::ERANGE);
        }
        slice_mut(buf, v.len()).copy_from_slice(&v);
        Ok(v.len())
    }))
}

unsafe fn c_bytes<'a>(p: *const c_char) -> Res<&'a [u8]> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller's nul-terminated string.
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

macro_rules! xattr_hooks {
    ($get:ident, $list:ident, $set:ident, $remove:ident, follow: $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $get(
            path: *const c_char,
            name: *const c_char,
            value: *mut c_void,
            size: size_t,
        ) -> ssize_t {
            by_path!(
                libc::AT_FDCWD,
                path,
                // SAFETY: the caller's name.
                |abs| xattr_out(unsafe { c_bytes(name) }.and_then(|n| ops::getxattr(ops::Named::Path(&abs, $follow), n)), value, size),
                |p| {
                    let f = real!($get: fn(*const c_char, *const c_char, *mut c_void, size_t) -> ssize_t);
                    // SAFETY: libc's function with the caller's arguments.
                    unsafe { f(p, name, value, size) }
                }
            )
        }

        #[no_mangle]
        pub unsafe extern "C" fn $list(path: *const c_char, list: *mut c_char, size: size_t) -> ssize_t {
            by_path!(
                libc::AT_FDCWD,
                path,
                |abs| xattr_out(ops::listxattr(ops::Named::Path(&abs, $follow)), list.cast(), size),
                |p| {
                    let f = real!($list: fn(*const c_char, *mut c_char, size_t) -> ssize_t);
                    // SAFETY: libc's function with the caller's arguments.
                    unsafe { f(p, list, size) }
                }
            )
        }

        #[no_mangle]
        pub unsafe extern "C" fn $set(
            path: *const c_char,
            name: *const c_char,
            value: *const c_void,
            size: size_t,
            flags: c_int,
        ) -> c_int {
            by_path!(
                libc::AT_FDCWD,
                path,
                // SAFETY: the caller's name.
                |abs| ret_unit(unsafe { c_bytes(name) }.and_then(|n| ops::setxattr(ops::Named::Path(&abs, $follow), n, slice(value, size), flags))),
                |p| {
                    let f = real!($set: fn(*const c_char, *const c_char, *const c_void, size_t, c_int) -> c_int);
                    // SAFETY: libc's function with the caller's arguments.
                    unsafe { f(p, name, value, size, flags) }
                }
            )
        }

        #[no_mangle]
        pub unsafe extern "C" fn $remove(path: *const c_char, name: *const c_char) -> c_int {
            by_path!(
                libc::AT_FDCWD,
                path,
                // SAFETY: the caller's name.
                |abs| ret_unit(unsafe { c_bytes(name) }.and_then(|n| ops::removexattr(ops::Named::Path(&abs, $follow), n))),
                |p| {
                    let f = real!($remove: fn(*const c_char, *const c_char) -> c_int);
                    // SAFETY: libc's function with the caller's arguments.
                    unsafe { f(p, name) }
                }
            )
        }
    };
}

xattr_hooks!(getxattr, listxattr, setxattr, removexattr, follow: true);
xattr_hooks!(lgetxattr, llistxattr, lsetxattr, lremovexattr, follow: false);

#[no_mangle]
pub unsafe extern "C" fn fgetxattr(
    fd: c_int,
    name: *const c_char,
    value: *mut c_void,
    size: size_t,
) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(fgetxattr: fn(c_int, *const c_char, *mut c_void, size_t) -> ssize_t);
        // SAFETY: libc's fgetxattr with the caller's arguments.
        return unsafe { f(fd, name, value, size) };
    }
    // SAFETY: the caller's name.
    let r =
        with_busy(|| unsafe { c_bytes(name) }.and_then(|n| ops::getxattr(ops::Named::Fd(fd), n)));
    xattr_out(r, value, size)
}

#[no_mangle]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, size: size_t) -> ssize_t {
    if !fds::is_pfs(fd) {
        let f = real!(flistxattr: fn(c_int, *mut c_char, size_t) -> ssize_t);
        // SAFETY: libc's flistxattr with the caller's arguments.
        return unsafe { f(fd, list, size) };
    }
    xattr_out(with_busy(|| ops::listxattr(ops::Named::Fd(fd))), list.cast(), size)
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    value: *const c_void,
    size: size_t,
    flags: c_int,
) -> c_int {
    if !fds::is_pfs(fd) {
        let f = real!(fsetxattr: fn(c_int, *const c_char, *const c_void, size_t, c_int) -> c_int);
        // SAFETY: libc's fsetxattr with the caller's arguments.
        return unsafe { f(fd, name, value, size, flags) };
    }
    // SAFETY: the caller's name.
    ret_unit(with_busy(|| {
        unsafe { c_bytes(name) }
            .and_then(|n| ops::setxattr(ops::Named::Fd(fd), n, slice(value, size), flags))
    }))
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's fremovexattr.
        return unsafe { real!(fremovexattr: fn(c_int, *const c_char) -> c_int)(fd, name) };
    }
    // SAFETY: the caller's name.
    ret_unit(with_busy(|| {
        unsafe { c_bytes(name) }.and_then(|n| ops::removexattr(ops::Named::Fd(fd), n))
    }))
}

// ---------------------------------------------------------------------------
// exec: the new program gets the pfs working directory and descriptors.

extern "C" {
    static environ: *const *const c_char;
}

/// `envp` without old hand-over entries, with this process's, as a
/// null-terminated array (the strings live in `keep`).
unsafe fn exec_env(
    envp: *const *const c_char,
    keep: &mut Vec<std::ffi::CString>,
) -> Vec<*const c_char> {
    *keep = with_busy(ops::exec_handover);
    let mut out: Vec<*const c_char> = Vec::new();
    let mut p = envp;
    // SAFETY: `envp` is a null-terminated array of C strings (or null).
    unsafe {
        while !p.is_null() && !(*p).is_null() {
            let e = CStr::from_ptr(*p).to_bytes();
            if !e.starts_with(b"PFS_PRELOAD_CWD=") && !e.starts_with(b"PFS_PRELOAD_FDS=") {
                out.push(*p);
            }
            p = p.add(1);
        }
    }
    out.extend(keep.iter().map(|c| c.as_ptr()));
    out.push(std::ptr::null());
    out
}

/// Runs `call` with `envp` plus this process's hand-over entries.
unsafe fn with_handover(
    envp: *const *const c_char,
    call: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    // The new program gets no descriptor the library kept for itself.
    ops::give_back_kept();
    let mut keep = Vec::new();
    // SAFETY: the caller's environment.
    let env = unsafe { exec_env(envp, &mut keep) };
    call(env.as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real!(execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's execve with the caller's arguments and the new environment.
    unsafe { with_handover(envp, |env| f(path, argv, env)) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded with the process's environment.
    unsafe { execve(path, argv, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real!(execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's execvpe with the caller's arguments and the new environment.
    unsafe { with_handover(envp, |env| f(file, argv, env)) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded with the process's environment.
    unsafe { execvpe(file, argv, environ) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = real!(fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: libc's fexecve with the caller's arguments and the new environment.
    unsafe { with_handover(envp, |env| f(fd, argv, env)) }
}

/// `vfork` is `fork` here: a `vfork` child shares this library's memory with
/// its parent, so its `open`/`dup2`/`close` before `exec` would change the
/// parent's file map. POSIX allows `vfork` to be `fork`.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: libc's fork.
    unsafe { real!(fork: fn() -> libc::pid_t)() }
}

/// Forgets the pfs descriptors in `first..=last` that the kernel is about to
/// close (a later descriptor with one of those numbers is a kernel file).
fn forget_range(first: c_uint, last: c_uint) {
    let last = last.min(fds::FD_MAX as c_uint - 1);
    if first > last {
        return;
    }
    for (fd, _) in fds::entries() {
        if (first..=last).contains(&(fd as c_uint)) {
            with_busy(|| ops::replaced(fd));
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let f = real!(close_range: fn(c_uint, c_uint, c_int) -> c_int);
    if first > last {
        // SAFETY: libc's close_range says what is wrong (EINVAL).
        return unsafe { f(first, last, flags) };
    }
    // A kept descriptor in the range goes back to the kernel first (the
    // range may only be marked close-on-exec, which would leave it open).
    ops::give_back_kept_in(first, last);
    // Around the library's own descriptors (they stay open, as `close`
    // leaves them): the stretches between them, each closed by libc.
    let mut r = 0;
    let mut from = u64::from(first);
    for g in pfs_net::fdguard::guarded_in(first, last) {
        let g = g as u64;
        if g > from && r == 0 {
            // SAFETY: libc's close_range on part of the caller's range.
            r = unsafe { f(from as c_uint, (g - 1) as c_uint, flags) };
        }
        from = g + 1;
    }
    if from <= u64::from(last) && r == 0 {
        // SAFETY: libc's close_range on the rest of the caller's range.
        r = unsafe { f(from as c_uint, last, flags) };
    }
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        forget_range(first, last);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // A kept descriptor in the range goes back to the kernel first.
    ops::give_back_kept_in(lowfd.max(0) as c_uint, c_uint::MAX);
    if !pfs_net::fdguard::guarded_in(lowfd.max(0) as c_uint, c_uint::MAX).is_empty() {
        // Around the library's own descriptors, as `close_range` does.
        // SAFETY: closes descriptors of this process by number.
        unsafe { close_range(lowfd.max(0) as c_uint, c_uint::MAX, 0) };
        return;
    }
    // SAFETY: libc's closefrom.
    unsafe { real!(closefrom: fn(c_int) -> ())(lowfd) };
    forget_range(lowfd.max(0) as c_uint, c_uint::MAX);
}

/// `posix_spawn` and `posix_spawnp` get the hand-over environment too: the pfs
/// working directory, and the pfs descriptors the child inherits at the same
/// numbers (one a file action moves elsewhere is not handed over).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let f = real!(posix_spawn: fn(
        *mut libc::pid_t,
        *const c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *mut c_char,
        *const *mut c_char
    ) -> c_int);
    // SAFETY: libc's posix_spawn with the caller's arguments and the new environment.
    unsafe { with_handover(envp.cast(), |env| f(pid, path, actions, attr, argv, env.cast())) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let f = real!(posix_spawnp: fn(
        *mut libc::pid_t,
        *const c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *mut c_char,
        *const *mut c_char
    ) -> c_int);
    // SAFETY: libc's posix_spawnp with the caller's arguments and the new environment.
    unsafe { with_handover(envp.cast(), |env| f(pid, file, actions, attr, argv, env.cast())) }
}

// ---------------------------------------------------------------------------
// Temporary names: glibc's mkstemp family opens the file inside libc.

/// A source of the random letters of temporary names (xorshift, seeded from the
/// clock, the process id and a counter).
fn random_letters(out: &mut [u8]) {
    use std::sync::atomic::AtomicU64;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const LETTERS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut x = t.as_nanos() as u64
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    for b in out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = LETTERS[(x % LETTERS.len() as u64) as usize];
    }
}

/// Attempts at a fresh temporary name before `EEXIST` (glibc tries 62^3).
const TEMP_ATTEMPTS: usize = 1000;

/// The six `X`s of `template` (before `suffix` bytes), or `EINVAL`.
unsafe fn temp_letters<'a>(template: *mut c_char, suffix: c_int) -> Res<&'a mut [u8]> {
    if template.is_null() || suffix < 0 {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's nul-terminated, writable template.
    let len = unsafe { CStr::from_ptr(template) }.to_bytes().len();
    let suffix = suffix as usize;
    if len < 6 + suffix {
        return Err(libc::EINVAL);
    }
    // SAFETY: as above; the six bytes before the suffix lie inside it.
    let t =
        unsafe { std::slice::from_raw_parts_mut(template.cast::<u8>().add(len - 6 - suffix), 6) };
    if t != b"XXXXXX" {
        return Err(libc::EINVAL);
    }
    Ok(t)
}

/// `mkostemps` on a pfs template: a new file, opened `O_RDWR` with `flags`.
unsafe fn mkostemps_pfs(template: *mut c_char, suffix: c_int, flags: c_int) -> Res<c_int> {
    // SAFETY: forwarded.
    let letters = unsafe { temp_letters(template, suffix)? };
    for _ in 0..TEMP_ATTEMPTS {
        random_letters(letters);
        // SAFETY: the template, now a name.
        let Target::Pfs(abs) = (unsafe { target(libc::AT_FDCWD, template) }) else {
            return Err(libc::EINVAL);
        };
        let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | (flags & !libc::O_ACCMODE);
        match with_busy(|| ops::open(abs.into_owned(), flags, 0o600)) {
            Err(libc::EEXIST) => continue,
            r => return r,
        }
    }
    letters.copy_from_slice(b"XXXXXX");
    Err(libc::EEXIST)
}

macro_rules! mkstemp_hooks {
    ($($name:ident($($arg:ident: $ty:ty),*) => ($suffix:expr, $flags:expr);)*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(template: *mut c_char $(, $arg: $ty)*) -> c_int {
            // SAFETY: the caller's template.
            if !matches!(unsafe { target(libc::AT_FDCWD, template) }, Target::Pfs(_)) {
                let f = real!($name: fn(*mut c_char $(, $ty)*) -> c_int);
                // SAFETY: libc's function with the caller's arguments.
                return unsafe { f(template $(, $arg)*) };
            }
            // SAFETY: the caller's template.
            ret_int(unsafe { mkostemps_pfs(template, $suffix, $flags) })
        }
    )*};
}

mkstemp_hooks! {
    mkstemp() => (0, 0);
    mkstemp64() => (0, 0);
    mkstemps(suffix: c_int) => (suffix, 0);
    mkstemps64(suffix: c_int) => (suffix, 0);
    mkostemp(flags: c_int) => (0, flags);
    mkostemp64(flags: c_int) => (0, flags);
    mkostemps(suffix: c_int, flags: c_int) => (suffix, flags);
    mkostemps64(suffix: c_int, flags: c_int) => (suffix, flags);
}

#[no_mangle]
pub unsafe extern "C" fn mkdtemp(template: *mut c_char) -> *mut c_char {
    // SAFETY: the caller's template.
    if !matches!(unsafe { target(libc::AT_FDCWD, template) }, Target::Pfs(_)) {
        // SAFETY: libc's mkdtemp.
        return unsafe { real!(mkdtemp: fn(*mut c_char) -> *mut c_char)(template) };
    }
    let made = || -> Res<()> {
        // SAFETY: the caller's template.
        let letters = unsafe { temp_letters(template, 0)? };
        for _ in 0..TEMP_ATTEMPTS {
            random_letters(letters);
            // SAFETY: the template, now a name.
            let Target::Pfs(abs) = (unsafe { target(libc::AT_FDCWD, template) }) else {
                return Err(libc::EINVAL);
            };
            match with_busy(|| ops::mkdir(&abs, 0o700)) {
                Err(libc::EEXIST) => continue,
                r => return r,
            }
        }
        letters.copy_from_slice(b"XXXXXX");
        Err(libc::EEXIST)
    };
    match made() {
        Ok(()) => template,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

// ---------------------------------------------------------------------------
// The older time-setting calls.

/// Times from a `struct timeval[2]` (null: both now).
unsafe fn timeval_set(tv: *const libc::timeval) -> Res<SetAttr> {
    if tv.is_null() {
        // SAFETY: null is "now" for times_set too.
        return unsafe { times_set(std::ptr::null()) };
    }
    // SAFETY: the caller passes two timevals.
    let (a, m) = unsafe { (&*tv, &*tv.add(1)) };
    let ns = |t: &libc::timeval| -> Res<i64> {
        if !(0..1_000_000).contains(&t.tv_usec) {
            return Err(libc::EINVAL);
        }
        Ok(t.tv_sec * 1_000_000_000 + t.tv_usec * 1_000)
    };
    Ok(SetAttr { atime_ns: Some(ns(a)?), mtime_ns: Some(ns(m)?), ..SetAttr::default() })
}

#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: the caller's times.
    let set = unsafe { timeval_set(tv) };
    by_path!(
        libc::AT_FDCWD,
        path,
        |abs| ret_unit(set.and_then(|s| ops::setattr_path(&abs, true, &s))),
        |p| {
            // SAFETY: libc's utimes.
            unsafe { real!(utimes: fn(*const c_char, *const libc::timeval) -> c_int)(p, tv) }
        }
    )
}

#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, tv: *const libc::timeval) -> c_int {
    // SAFETY: the caller's times.
    let set = unsafe { timeval_set(tv) };
    by_path!(
        libc::AT_FDCWD,
        path,
        |abs| ret_unit(set.and_then(|s| ops::setattr_path(&abs, false, &s))),
        |p| {
            // SAFETY: libc's lutimes.
            unsafe { real!(lutimes: fn(*const c_char, *const libc::timeval) -> c_int)(p, tv) }
        }
    )
}

#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    if !fds::is_pfs(fd) {
        // SAFETY: libc's futimes.
        return unsafe { real!(futimes: fn(c_int, *const libc::timeval) -> c_int)(fd, tv) };
    }
    // SAFETY: the caller's times.
    match unsafe { timeval_set(tv) } {
        Ok(set) => setattr_fd(fd, set),
        Err(e) => ret_unit(Err(e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    let set = if times.is_null() {
        // SAFETY: null is "now".
        unsafe { times_set(std::ptr::null()) }
    } else {
        // SAFETY: the caller's utimbuf.
        let t = unsafe { &*times };
        Ok(SetAttr {
            atime_ns: Some(t.actime * 1_000_000_000),
            mtime_ns: Some(t.modtime * 1_000_000_000),
            ..SetAttr::default()
        })
    };
    by_path!(
        libc::AT_FDCWD,
        path,
        |abs| ret_unit(set.and_then(|s| ops::setattr_path(&abs, true, &s))),
        |p| {
            // SAFETY: libc's utime.
            unsafe { real!(utime: fn(*const c_char, *const libc::utimbuf) -> c_int)(p, times) }
        }
    )
}

// ---------------------------------------------------------------------------
// scandir: glibc opens and reads the directory inside itself.

type ScanFilter = Option<unsafe extern "C" fn(*const libc::dirent64) -> c_int>;
type ScanCompare =
    Option<unsafe extern "C" fn(*mut *const libc::dirent64, *mut *const libc::dirent64) -> c_int>;

/// `scandir` of pfs directory `abs`: every entry `filter` keeps, copied into
/// `malloc`ed memory the caller frees, sorted with `compare`.
unsafe fn scandir_pfs(
    abs: Vec<u8>,
    list: *mut *mut *mut libc::dirent64,
    filter: ScanFilter,
    compare: ScanCompare,
) -> Res<c_int> {
    if list.is_null() {
        return Err(libc::EFAULT);
    }
    let fd = with_busy(|| ops::opendir(abs))?;
    let d = new_dir(fd);
    let mut kept: Vec<*mut libc::dirent64> = Vec::new();
    let mut failed = None;
    loop {
        // SAFETY: a stream made above; each entry is copied before the next read.
        let e = unsafe { readdir64(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: the caller's filter on a live entry.
        if filter.is_some_and(|f| unsafe { f(e) } == 0) {
            continue;
        }
        let size = std::mem::size_of::<libc::dirent64>();
        // SAFETY: a fresh allocation of one entry, filled from the live one.
        let copy = unsafe { libc::malloc(size) }.cast::<libc::dirent64>();
        if copy.is_null() {
            failed = Some(libc::ENOMEM);
            break;
        }
        // SAFETY: both point at whole entries.
        unsafe { std::ptr::copy_nonoverlapping(e, copy, 1) };
        kept.push(copy);
    }
    // SAFETY: the stream made above.
    unsafe { closedir(d) };
    // SAFETY: an array the caller frees with free(3).
    let array =
        unsafe { libc::malloc(kept.len().max(1) * std::mem::size_of::<*mut libc::dirent64>()) }
            .cast::<*mut libc::dirent64>();
    if failed.is_some() || array.is_null() {
        for p in kept {
            // SAFETY: allocated above.
            unsafe { libc::free(p.cast()) };
        }
        if !array.is_null() {
            // SAFETY: allocated above.
            unsafe { libc::free(array.cast()) };
        }
        return Err(failed.unwrap_or(libc::ENOMEM));
    }
    // SAFETY: `array` holds `kept.len()` pointers.
    unsafe { std::ptr::copy_nonoverlapping(kept.as_ptr(), array, kept.len()) };
    if let Some(cmp) = compare {
        // SAFETY: the caller's comparison, called as qsort does, on the array.
        let entries = unsafe { std::slice::from_raw_parts_mut(array, kept.len()) };
        entries.sort_by(|a, b| {
            let (mut x, mut y) = (a.cast_const(), b.cast_const());
            // SAFETY: as above.
            unsafe { cmp(&mut x, &mut y) }.cmp(&0)
        });
    }
    // SAFETY: the caller's out pointer.
    unsafe { *list = array };
    Ok(kept.len() as c_int)
}

macro_rules! scandir_hooks {
    ($($name:ident),*) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            path: *const c_char,
            list: *mut *mut *mut libc::dirent64,
            filter: ScanFilter,
            compare: ScanCompare,
        ) -> c_int {
            // SAFETY: the caller's path.
            match unsafe { target(libc::AT_FDCWD, path) } {
                // SAFETY: the caller's arguments.
                Target::Pfs(abs) => ret_int(unsafe { scandir_pfs(abs.into_owned(), list, filter, compare) }),
                t => {
                    let p = match &t {
                        Target::Elsewhere(c) => c.as_ptr(),
                        _ => path,
                    };
                    let f = real!($name: fn(*const c_char, *mut *mut *mut libc::dirent64, ScanFilter, ScanCompare) -> c_int);
                    // SAFETY: libc's function with the caller's arguments.
                    unsafe { f(p, list, filter, compare) }
                }
            }
        }
    )*};
}

scandir_hooks!(scandir, scandir64);

// ---------------------------------------------------------------------------
// system: glibc spawns its shell inside itself.

/// `system(3)` when this process has pfs state to hand over (a pfs working
/// directory, inherited pfs descriptors): the shell is spawned through
/// `posix_spawn` with the hand-over environment, with `system`'s signal rules
/// (SIGINT and SIGQUIT ignored and SIGCHLD blocked while it waits; the child
/// gets their defaults and the caller's mask). Otherwise libc's own.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    let real_system = || {
        ops::give_back_kept();
        // SAFETY: libc's system.
        unsafe { real!(system: fn(*const c_char) -> c_int)(command) }
    };
    if command.is_null() || busy() || client::config().is_none() {
        return real_system();
    }
    let pfs_state = ops::virtual_cwd().is_some() || !fds::entries().is_empty();
    if !pfs_state {
        return real_system();
    }
    // SAFETY: plain signal and spawn calls on local, initialised structures;
    // the argument strings live until the spawn returns.
    unsafe {
        let mut ign: libc::sigaction = std::mem::zeroed();
        ign.sa_sigaction = libc::SIG_IGN;
        let (mut old_int, mut old_quit): (libc::sigaction, libc::sigaction) = std::mem::zeroed();
        libc::sigaction(libc::SIGINT, &ign, &mut old_int);
        libc::sigaction(libc::SIGQUIT, &ign, &mut old_quit);
        let (mut block, mut old_mask): (libc::sigset_t, libc::sigset_t) = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGCHLD);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old_mask);

        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        libc::posix_spawnattr_init(&mut attr);
        let mut defaults: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut defaults);
        libc::sigaddset(&mut defaults, libc::SIGINT);
        libc::sigaddset(&mut defaults, libc::SIGQUIT);
        libc::posix_spawnattr_setsigdefault(&mut attr, &defaults);
        libc::posix_spawnattr_setsigmask(&mut attr, &old_mask);
        libc::posix_spawnattr_setflags(
            &mut attr,
            (libc::POSIX_SPAWN_SETSIGDEF | libc::POSIX_SPAWN_SETSIGMASK) as libc::c_short,
        );
        let argv = [c"sh".as_ptr(), c"-c".as_ptr(), command, std::ptr::null()];
        let mut pid: libc::pid_t = 0;
        let spawned = posix_spawn(
            &mut pid,
            c"/bin/sh".as_ptr(),
            std::ptr::null(),
            &attr,
            argv.as_ptr().cast(),
            environ.cast(),
        );
        libc::posix_spawnattr_destroy(&mut attr);
        let status = if spawned != 0 {
            // What system returns when no shell could run.
            127 << 8
        } else {
            let mut st = 0;
            loop {
                if libc::waitpid(pid, &mut st, 0) >= 0 {
                    break st;
                }
                if ops::last_errno() != libc::EINTR {
                    break -1;
                }
            }
        };
        libc::sigaction(libc::SIGINT, &old_int, std::ptr::null_mut());
        libc::sigaction(libc::SIGQUIT, &old_quit, std::ptr::null_mut());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old_mask, std::ptr::null_mut());
        status
    }
}
