//! POSIX asynchronous I/O (`aio_read`, `aio_write`, `aio_fsync`,
//! `lio_listio`, `aio_suspend`, `aio_cancel`) on pfs descriptors. glibc runs
//! such a request on a thread of its own that calls its internal `pread`, out
//! of reach of symbol interposition: on a pfs descriptor (the reserved
//! `O_PATH` one) every request failed with `EBADF`. ROMIO (MPI-IO's
//! `MPI_File_iwrite`/`iread` on a Unix file system) and HDF5's asynchronous
//! drivers issue them.
//!
//! A request on a pfs descriptor goes to the library's own queue (at most
//! [`QUEUE_MAX`] requests, then `EAGAIN`, as POSIX allows), which up to
//! [`WORKERS_MAX`] threads serve through the library's read, write and
//! `fsync`, as glibc's threads serve its own. Its result goes where glibc's
//! `aio_error` and `aio_return` read it (the `aiocb`'s error code and return
//! value), so those two stay glibc's; `aio_suspend` waits for the library's
//! requests here, and `aio_cancel` takes back those not started yet. The
//! completion is notified as the request asks (`SIGEV_SIGNAL` and
//! `SIGEV_THREAD_ID` with `SI_ASYNCIO`, `SIGEV_THREAD` on a new thread), after
//! the request's end, so a program that issues a request and then waits for
//! its signal (`pause`, a sleep) is woken as with glibc. `lio_listio` with
//! `LIO_WAIT` runs its pfs requests on the caller's thread; with `LIO_NOWAIT`
//! they are queued and the list's notification follows the last. Requests on
//! other descriptors are glibc's, untouched; a `lio_listio` that mixes both
//! hands glibc the others.

use std::collections::{BTreeMap, VecDeque};
use std::mem::{offset_of, size_of};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use libc::{c_int, c_void, size_t, ssize_t};

use crate::client::{busy, with_busy, Res};
use crate::real::real;
use crate::{fds, ops};

/// glibc's `struct aiocb` (and `aiocb64`, the same on 64-bit Linux), with the
/// private fields its `aio_error` and `aio_return` read.
#[repr(C)]
pub struct Aiocb {
    fildes: c_int,
    lio_opcode: c_int,
    reqprio: c_int,
    buf: *mut c_void,
    nbytes: size_t,
    sigevent: Sigevent,
    next_prio: *mut c_void,
    abs_prio: c_int,
    policy: c_int,
    error_code: c_int,
    return_value: ssize_t,
    offset: i64,
    reserved: [u8; 32],
}

/// `struct sigevent` with the union a `SIGEV_THREAD` request fills.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Sigevent {
    value: *mut c_void,
    signo: c_int,
    notify: c_int,
    un: SigevUnion,
}

#[repr(C)]
#[derive(Clone, Copy)]
union SigevUnion {
    tid: c_int,
    thread: SigevThread,
    pad: [c_int; 12],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct SigevThread {
    function: Option<unsafe extern "C" fn(*mut c_void)>,
    attribute: *mut c_void,
}

const _: () = assert!(size_of::<Aiocb>() == size_of::<libc::aiocb>());
const _: () = assert!(offset_of!(Aiocb, offset) == offset_of!(libc::aiocb, aio_offset));
const _: () = assert!(offset_of!(Aiocb, sigevent) == offset_of!(libc::aiocb, aio_sigevent));
const _: () = assert!(size_of::<Sigevent>() == size_of::<libc::sigevent>());

/// The `siginfo_t` a queued signal carries (`rt_sigqueueinfo(2)`).
#[repr(C)]
struct QueuedInfo {
    signo: c_int,
    errno: c_int,
    code: c_int,
    pad: c_int,
    pid: c_int,
    uid: libc::uid_t,
    value: *mut c_void,
    rest: [u8; 96],
}

const _: () = assert!(size_of::<QueuedInfo>() == size_of::<libc::siginfo_t>());

/// Largest request priority glibc accepts (`AIO_PRIO_DELTA_MAX`).
const PRIO_DELTA_MAX: c_int = 20;
/// Requests queued or running at most; past it a new one fails with `EAGAIN`.
pub const QUEUE_MAX: usize = 1024;
/// Threads that serve the queue at most.
pub const WORKERS_MAX: usize = 4;

/// What a request does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Read,
    Write,
    Sync { datasync: bool },
}

/// A queued request: its block (an address: the program keeps it alive until
/// the end, as POSIX asks), what it does, and the list it belongs to.
struct Job {
    cb: usize,
    fd: c_int,
    op: Op,
    list: Option<Arc<List>>,
}

/// A `LIO_NOWAIT` list: the requests still to end, and what to notify then.
struct List {
    left: AtomicUsize,
    sig: Option<Sigevent>,
}

// SAFETY: a `Sigevent` holds the program's notification value and function,
// which POSIX lets any thread use.
unsafe impl Send for List {}
// SAFETY: as above; it is only read.
unsafe impl Sync for List {}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Job>,
    /// Every request queued or running: its block's address and descriptor.
    open: BTreeMap<usize, c_int>,
    workers: usize,
    idle: usize,
}

static QUEUE: Mutex<Queue> =
    Mutex::new(Queue { pending: VecDeque::new(), open: BTreeMap::new(), workers: 0, idle: 0 });
/// Signalled when a request is queued.
static WORK: Condvar = Condvar::new();
/// Signalled when a request ends.
static DONE: Condvar = Condvar::new();

fn queue_lock() -> MutexGuard<'static, Queue> {
    QUEUE.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The queue's lock, held by the thread that forks across `fork`.
    static FORK_HELD: std::cell::RefCell<Option<MutexGuard<'static, Queue>>> =
        const { std::cell::RefCell::new(None) };
}

/// Before `fork`: no thread is changing the queue.
pub fn hold_for_fork() {
    let g = queue_lock();
    FORK_HELD.with(|h| *h.borrow_mut() = Some(g));
}

/// After `fork`, in the parent.
pub fn after_fork_parent() {
    FORK_HELD.with(|h| h.borrow_mut().take());
}

/// After `fork`, in the child: the parent's threads and requests are not the
/// child's (as with glibc's, a request under way at the fork stays in
/// progress in the child's copy of its block).
pub fn after_fork_child() {
    if let Some(mut q) = FORK_HELD.with(|h| h.borrow_mut().take()) {
        *q = Queue::default();
    }
}

/// The request's error code, which other threads read while it runs.
fn error_code(cb: *const Aiocb) -> &'static AtomicI32 {
    // SAFETY: an `int` of the program's request block, alive until the
    // request ended and was looked at; aligned as a field of the block.
    unsafe { AtomicI32::from_ptr(std::ptr::addr_of!((*cb).error_code).cast_mut()) }
}

/// Runs `op` of `cb` (a pfs descriptor's) and records its result in `cb`:
/// the return value first, then the error code (what `aio_error` reads).
fn run(cb: *mut Aiocb, op: Op) {
    // SAFETY: the program's request block, alive until the request ends.
    let (fd, buf, nbytes, offset) =
        unsafe { ((*cb).fildes, (*cb).buf, (*cb).nbytes, (*cb).offset) };
    let r: Res<usize> = with_busy(|| match op {
        Op::Sync { datasync } => ops::fsync(fd, datasync).map(|()| 0),
        _ if offset < 0 => Err(libc::EINVAL),
        Op::Read => ops::read_at(&*ops::file(fd)?, offset as u64, slice_mut(buf, nbytes)),
        Op::Write => {
            // SAFETY: the request names `nbytes` readable bytes at `buf`.
            let data = unsafe { slice(buf, nbytes) };
            ops::write_at(&*ops::file(fd)?, Some(offset as u64), data).map(|(n, _)| n)
        }
    });
    let (e, n) = match r {
        Ok(n) => (0, n as ssize_t),
        Err(e) => (e, -1),
    };
    // SAFETY: as above.
    unsafe { std::ptr::addr_of_mut!((*cb).return_value).write_volatile(n) };
    error_code(cb).store(e, Ordering::Release);
}

fn slice_mut<'a>(buf: *mut c_void, n: size_t) -> &'a mut [u8] {
    if n == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: the request names `n` writable bytes at `buf`.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), n) }
}

unsafe fn slice<'a>(buf: *const c_void, n: size_t) -> &'a [u8] {
    if n == 0 || buf.is_null() {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(buf.cast(), n) }
}

/// Tells the program a request (or a list) completed, as `ev` asks.
fn notify(ev: &Sigevent) {
    match ev.notify {
        libc::SIGEV_SIGNAL => queue_signal(0, ev.signo, ev.value),
        libc::SIGEV_THREAD_ID => {
            // SAFETY: `SIGEV_THREAD_ID` fills the thread id of the union.
            queue_signal(unsafe { ev.un.tid }, ev.signo, ev.value)
        }
        libc::SIGEV_THREAD => {
            // SAFETY: `SIGEV_THREAD` fills the function of the union.
            let Some(f) = (unsafe { ev.un.thread.function }) else { return };
            let value = ev.value as usize;
            // SAFETY: calls the program's notification function with its value,
            // as glibc does on a thread of its own.
            let spawned =
                std::thread::Builder::new().spawn(move || unsafe { f(value as *mut c_void) });
            if let Err(e) = spawned {
                eprintln!("libpfs_preload: no thread for an asynchronous I/O notification: {e}");
            }
        }
        _ => {}
    }
}

/// Queues signal `signo` with `value` to this process (`tid` 0) or one of its
/// threads, as glibc's `__aio_sigqueue` does.
fn queue_signal(tid: c_int, signo: c_int, value: *mut c_void) {
    if signo <= 0 {
        return;
    }
    // SAFETY: plain system calls with a filled `siginfo_t`.
    unsafe {
        let pid = libc::getpid();
        let info = QueuedInfo {
            signo,
            errno: 0,
            code: libc::SI_ASYNCIO,
            pad: 0,
            pid,
            uid: libc::getuid(),
            value,
            rest: [0; 96],
        };
        let info: *const QueuedInfo = &info;
        if tid == 0 {
            libc::syscall(libc::SYS_rt_sigqueueinfo, pid, signo, info);
        } else {
            libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, signo, info);
        }
    }
}

/// The end of `job`: its own notification, its list's if it was the last,
/// and any `aio_suspend` woken.
fn finish(job: Job) {
    // SAFETY: the program's request block, alive until the request ends.
    let ev = unsafe { (*(job.cb as *const Aiocb)).sigevent };
    {
        let mut q = queue_lock();
        q.open.remove(&job.cb);
        DONE.notify_all();
    }
    notify(&ev);
    list_member_ended(job.list.as_deref());
}

/// A request of `list` (if any) ended: the last one notifies the list.
fn list_member_ended(list: Option<&List>) {
    if let Some(list) = list {
        if list.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            if let Some(sig) = &list.sig {
                notify(sig);
            }
        }
    }
}

/// A thread serving the queue.
fn serve() {
    loop {
        let job = {
            let mut q = queue_lock();
            loop {
                if let Some(job) = q.pending.pop_front() {
                    break job;
                }
                q.idle += 1;
                q = WORK.wait(q).unwrap_or_else(|p| p.into_inner());
                q.idle -= 1;
            }
        };
        run(job.cb as *mut Aiocb, job.op);
        finish(job);
    }
}

/// Queues the requests `jobs` (all or none: `EAGAIN` past [`QUEUE_MAX`]),
/// each marked in progress.
fn enqueue(jobs: Vec<Job>) -> Res<()> {
    let mut q = queue_lock();
    if q.open.len() + jobs.len() > QUEUE_MAX {
        return Err(libc::EAGAIN);
    }
    for job in jobs {
        // SAFETY: the program's request block.
        unsafe { std::ptr::addr_of_mut!((*(job.cb as *mut Aiocb)).return_value).write_volatile(0) };
        error_code(job.cb as *const Aiocb).store(libc::EINPROGRESS, Ordering::Release);
        q.open.insert(job.cb, job.fd);
        q.pending.push_back(job);
    }
    // A thread for each queued request no idle one will take, up to the bound
    // (a new thread takes its first request once it gets the lock).
    let wanted = q.pending.len().saturating_sub(q.idle);
    for _ in 0..wanted {
        if q.workers >= WORKERS_MAX {
            break;
        }
        if std::thread::Builder::new().name("pfs-aio".into()).spawn(serve).is_err() {
            break;
        }
        q.workers += 1;
    }
    if q.workers == 0 {
        // No thread could be started: the requests cannot run.
        let jobs: Vec<Job> = q.pending.drain(..).collect();
        for job in &jobs {
            q.open.remove(&job.cb);
        }
        return Err(libc::EAGAIN);
    }
    WORK.notify_all();
    Ok(())
}

fn fail(e: c_int) -> c_int {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = e };
    -1
}

/// Whether request `cb` is for a pfs descriptor (and the library is not
/// inside a call of its own).
fn pfs(cb: *const Aiocb) -> bool {
    // SAFETY: read of the caller's request block.
    !cb.is_null() && !busy() && fds::is_pfs(unsafe { (*cb).fildes })
}

/// One request on a pfs descriptor: checked as glibc checks it, and queued.
fn submit(cb: *mut Aiocb, op: Op) -> c_int {
    // SAFETY: the caller passes a request block it owns until completion.
    let (fd, prio) = unsafe { ((*cb).fildes, (*cb).reqprio) };
    if !(0..=PRIO_DELTA_MAX).contains(&prio) {
        return fail(libc::EINVAL);
    }
    match enqueue(vec![Job { cb: cb as usize, fd, op, list: None }]) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

macro_rules! one {
    ($name:ident, $op:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(cb: *mut Aiocb) -> c_int {
            if !pfs(cb) {
                // SAFETY: glibc's own with the caller's request.
                return unsafe { real!($name: fn(*mut Aiocb) -> c_int)(cb) };
            }
            submit(cb, $op)
        }
    };
}

one!(aio_read, Op::Read);
one!(aio_read64, Op::Read);
one!(aio_write, Op::Write);
one!(aio_write64, Op::Write);

macro_rules! sync {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(op: c_int, cb: *mut Aiocb) -> c_int {
            if !pfs(cb) {
                // SAFETY: glibc's own with the caller's arguments.
                return unsafe { real!($name: fn(c_int, *mut Aiocb) -> c_int)(op, cb) };
            }
            match op {
                libc::O_SYNC => submit(cb, Op::Sync { datasync: false }),
                libc::O_DSYNC => submit(cb, Op::Sync { datasync: true }),
                _ => fail(libc::EINVAL),
            }
        }
    };
}

sync!(aio_fsync);
sync!(aio_fsync64);

/// `lio_listio`: the pfs requests of `list` run here (`LIO_WAIT`) or are
/// queued (`LIO_NOWAIT`); the others go to glibc's (with the pfs ones taken
/// out).
unsafe fn listio(
    mode: c_int,
    list: *const *mut Aiocb,
    nent: c_int,
    sig: *mut Sigevent,
    real_call: impl FnOnce(*const *mut Aiocb, *mut Sigevent) -> c_int,
) -> c_int {
    if mode != libc::LIO_WAIT && mode != libc::LIO_NOWAIT {
        return fail(libc::EINVAL);
    }
    if list.is_null() || nent <= 0 || busy() {
        return real_call(list, sig);
    }
    // SAFETY: the caller passes `nent` request pointers (some null).
    let entries = unsafe { std::slice::from_raw_parts(list, nent as usize) };
    if !entries.iter().any(|&cb| pfs(cb)) {
        return real_call(list, sig);
    }
    let mut ours = Vec::new();
    let mut failed = false;
    let mut others: Vec<*mut Aiocb> = Vec::with_capacity(entries.len());
    for &cb in entries {
        if !pfs(cb) {
            others.push(cb);
            continue;
        }
        others.push(std::ptr::null_mut());
        // SAFETY: a request block of the caller's list.
        let (fd, opcode, prio) = unsafe { ((*cb).fildes, (*cb).lio_opcode, (*cb).reqprio) };
        let op = match opcode {
            libc::LIO_READ => Op::Read,
            libc::LIO_WRITE => Op::Write,
            _ => continue,
        };
        if !(0..=PRIO_DELTA_MAX).contains(&prio) {
            // SAFETY: as above.
            unsafe { (*cb).return_value = -1 };
            error_code(cb).store(libc::EINVAL, Ordering::Release);
            failed = true;
            continue;
        }
        ours.push(Job { cb: cb as usize, fd, op, list: None });
    }
    let rest = others.iter().any(|cb| !cb.is_null());
    // With glibc's part, the list's notification is glibc's (after which
    // ours must have ended: they run here first); without, ours.
    let notify_ours = !rest && mode == libc::LIO_NOWAIT && !sig.is_null();
    if mode == libc::LIO_NOWAIT && !rest {
        // SAFETY: the caller's notification request, copied.
        let sig = notify_ours.then(|| unsafe { *sig });
        let group = Arc::new(List { left: AtomicUsize::new(ours.len()), sig });
        if ours.is_empty() {
            if let Some(sig) = &group.sig {
                notify(sig);
            }
            return 0;
        }
        let jobs = ours.into_iter().map(|j| Job { list: Some(group.clone()), ..j }).collect();
        return match enqueue(jobs) {
            Ok(()) => 0,
            Err(e) => fail(e),
        };
    }
    for job in ours {
        run(job.cb as *mut Aiocb, job.op);
        failed |= error_code(job.cb as *const Aiocb).load(Ordering::Acquire) != 0;
        // SAFETY: the program's request block.
        notify(unsafe { &(*(job.cb as *const Aiocb)).sigevent });
    }
    if rest {
        let r = real_call(others.as_ptr(), sig);
        if r != 0 {
            return r;
        }
    }
    if mode == libc::LIO_WAIT && failed {
        return fail(libc::EIO);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn lio_listio(
    mode: c_int,
    list: *const *mut Aiocb,
    nent: c_int,
    sig: *mut Sigevent,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        listio(mode, list, nent, sig, |l, s| {
            let f = real!(lio_listio: fn(c_int, *const *mut Aiocb, c_int, *mut Sigevent) -> c_int);
            f(mode, l, nent, s)
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn lio_listio64(
    mode: c_int,
    list: *const *mut Aiocb,
    nent: c_int,
    sig: *mut Sigevent,
) -> c_int {
    // SAFETY: forwarded.
    unsafe {
        listio(mode, list, nent, sig, |l, s| {
            let f =
                real!(lio_listio64: fn(c_int, *const *mut Aiocb, c_int, *mut Sigevent) -> c_int);
            f(mode, l, nent, s)
        })
    }
}

/// `aio_suspend`: while any listed request of the library's is still under
/// way and none listed has ended, waits here (glibc's would return at once:
/// it does not know them); otherwise glibc's. Waits in steps of 1 ms when
/// glibc's requests are listed too, to see theirs end.
unsafe fn suspend(
    list: *const *const Aiocb,
    nent: c_int,
    timeout: *const libc::timespec,
    real_call: impl FnOnce() -> c_int,
) -> c_int {
    if list.is_null() || nent <= 0 || busy() {
        return real_call();
    }
    // SAFETY: the caller passes `nent` request pointers (some null).
    let entries = unsafe { std::slice::from_raw_parts(list, nent as usize) };
    let deadline = (!timeout.is_null()).then(|| {
        // SAFETY: the caller's relative timeout.
        let t = unsafe { *timeout };
        let d = Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32);
        Instant::now() + d
    });
    let mut q = queue_lock();
    if !entries.iter().any(|&cb| !cb.is_null() && q.open.contains_key(&(cb as usize))) {
        drop(q);
        return real_call();
    }
    loop {
        let ended = entries.iter().any(|&cb| {
            !cb.is_null() && error_code(cb).load(Ordering::Acquire) != libc::EINPROGRESS
        });
        if ended {
            return 0;
        }
        let mixed = entries.iter().any(|&cb| !cb.is_null() && !q.open.contains_key(&(cb as usize)));
        let mut step = if mixed { Duration::from_millis(1) } else { Duration::from_secs(3600) };
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return fail(libc::EAGAIN);
            }
            step = step.min(left);
        }
        q = DONE.wait_timeout(q, step).unwrap_or_else(|p| p.into_inner()).0;
    }
}

macro_rules! suspend {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            list: *const *const Aiocb,
            nent: c_int,
            timeout: *const libc::timespec,
        ) -> c_int {
            // SAFETY: forwarded.
            unsafe {
                suspend(list, nent, timeout, || {
                    let f = real!($name: fn(*const *const Aiocb, c_int, *const libc::timespec) -> c_int);
                    f(list, nent, timeout)
                })
            }
        }
    };
}

suspend!(aio_suspend);
suspend!(aio_suspend64);

/// `aio_cancel` of a pfs descriptor's requests (`cb`, or all of `fd`'s):
/// those still queued end with `ECANCELED` (notified), those running are
/// `AIO_NOTCANCELED`.
fn cancel(fd: c_int, cb: *mut Aiocb) -> c_int {
    // SAFETY: read of the caller's request block.
    if !cb.is_null() && unsafe { (*cb).fildes } != fd {
        return fail(libc::EINVAL);
    }
    let mut q = queue_lock();
    let wanted = |job: &Job| job.fd == fd && (cb.is_null() || job.cb == cb as usize);
    let mut taken = Vec::new();
    let mut kept = VecDeque::new();
    for job in q.pending.drain(..) {
        if wanted(&job) {
            taken.push(job);
        } else {
            kept.push_back(job);
        }
    }
    q.pending = kept;
    for job in &taken {
        q.open.remove(&job.cb);
    }
    let running = q.open.iter().any(|(&c, &f)| f == fd && (cb.is_null() || c == cb as usize));
    DONE.notify_all();
    drop(q);
    let canceled = !taken.is_empty();
    for job in taken {
        let c = job.cb as *mut Aiocb;
        // SAFETY: the program's request block.
        unsafe { std::ptr::addr_of_mut!((*c).return_value).write_volatile(-1) };
        error_code(c).store(libc::ECANCELED, Ordering::Release);
        // SAFETY: as above.
        notify(unsafe { &(*c).sigevent });
        list_member_ended(job.list.as_deref());
    }
    if running {
        libc::AIO_NOTCANCELED
    } else if canceled {
        libc::AIO_CANCELED
    } else {
        libc::AIO_ALLDONE
    }
}

macro_rules! cancel {
    ($name:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, cb: *mut Aiocb) -> c_int {
            if busy() || !fds::is_pfs(fd) {
                // SAFETY: glibc's own with the caller's arguments.
                return unsafe { real!($name: fn(c_int, *mut Aiocb) -> c_int)(fd, cb) };
            }
            cancel(fd, cb)
        }
    };
}

cancel!(aio_cancel);
cancel!(aio_cancel64);
