//! FUSE over io_uring (pfs fork; Linux 6.14+, `fuse` module parameter `enable_uring`).
//!
//! The kernel keeps one queue per possible CPU and hands a request to the queue of
//! the CPU its caller runs on. A daemon thread registers ring entries on a queue
//! (`FUSE_IO_URING_CMD_REGISTER`): each entry is a header buffer and a payload
//! buffer, and its command completes when the kernel has copied a request into them.
//! The thread answers by writing the reply into the same buffers and submitting
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which delivers the reply and waits for the
//! next request in one step: one system call per request, where /dev/fuse takes a
//! `read` and a `writev`, and no hand-off between threads.
//!
//! Requests reach the file system through the same dispatch as /dev/fuse: the
//! request is reassembled into the byte layout /dev/fuse delivers (`fuse_in_header`,
//! the operation's header, the payload) and its reply goes back through an
//! [`EntrySender`]. Forgets, interrupts and notifications still use /dev/fuse, so
//! the /dev/fuse threads keep running beside the rings.
//!
//! Layout (include/uapi/linux/fuse.h, `struct fuse_uring_req_header`): `in_out`
//! (128 bytes: `fuse_in_header` on the way in, `fuse_out_header` on the way out),
//! `op_in` (128 bytes: the operation's header), `ring_ent_in_out` (flags u64,
//! commit_id u64, payload_sz u32, padding u32, reserved u64). The SQE's 80-byte
//! command area holds `struct fuse_uring_cmd_req` (flags u64, commit_id u64, qid u16).
//!
//! Ownership of an entry's buffers: the kernel owns them from a REGISTER or COMMIT
//! submission until its completion; then the ring thread reads the request out of
//! them (into its own buffer) before dispatching, and from then on only the single
//! reply of that request writes them, after which the thread submits the commit.
//! The [`Done`] list's mutex orders the reply's writes before the submission.
//!
//! Bulk threads ([`UringConfig::bulk_threads`]) register no entries. A queue
//! thread whose entry brings a large read hands the entry over (its `handed`
//! list, under a mutex that orders the kernel's writes before the bulk thread's
//! reads); the bulk thread serves it and commits from its own ring, so the
//! kernel delivers that entry's next request there, and the bulk thread hands
//! anything but a large read back to the entry's home thread. The kernel takes a
//! COMMIT_AND_FETCH for any queue from any ring; an entry has one command in
//! flight at a time, so whichever ring submitted it is the only one that hears
//! of the entry next.

use std::cell::UnsafeCell;
use std::fmt;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::thread;
use std::thread::ThreadId;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::error;
use log::warn;
use parking_lot::Mutex;

use crate::Filesystem;
use crate::channel::Channel;
use crate::channel::ChannelSender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

const IN_HEADER_BYTES: usize = 40;
const OUT_HEADER_BYTES: usize = 16;
const OP_IN_OFFSET: usize = 128;
const OP_IN_BYTES: usize = 128;
const ENT_IN_OUT_OFFSET: usize = 256;
const COMMIT_ID_OFFSET: usize = ENT_IN_OUT_OFFSET + 8;
const PAYLOAD_SZ_OFFSET: usize = ENT_IN_OUT_OFFSET + 16;
/// `sizeof(struct fuse_uring_req_header)`.
const HEADER_BYTES: usize = 288;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// The SQE's `len` for REGISTER: the iovec count (header and payload).
const IOV_SEGS: u32 = 2;
/// Offset of `len` in `struct io_uring_sqe`.
const SQE_LEN_OFFSET: usize = 24;

/// `user_data` of the eventfd poll that wakes a ring thread.
const WAKE: u64 = u64::MAX;

/// How many threads serve the rings.
#[derive(Debug, Clone, Copy, Eq, PartialEq)]
pub struct UringConfig {
    /// Threads per queue; the kernel has one queue per possible CPU. Each thread
    /// owns one io_uring and serves its entries one after another, so this is how
    /// many requests from callers on one CPU can be in the file system at once.
    pub threads_per_queue: usize,
    /// Ring entries per thread (requests a thread holds; they are served in turn).
    pub depth: usize,
    /// Pin each queue's threads to that queue's CPU, as libfuse does.
    pub pin: bool,
    /// Threads, not pinned, that serve large reads (at least
    /// [`BULK_READ_MIN`] bytes) for every queue. The kernel hands a request to
    /// the queue of its caller's CPU, and a pinned thread of that queue would
    /// copy the reply into the entry and commit it (the kernel's copy into the
    /// page cache) on that CPU too: one streaming reader then shares one CPU
    /// with both copies. A bulk thread takes the entry over and commits it
    /// from its own ring, wherever the scheduler runs it. 0: none.
    pub bulk_threads: usize,
}

/// The smallest `READ` a bulk thread serves (see [`UringConfig::bulk_threads`]).
pub(crate) const BULK_READ_MIN: u32 = 128 * 1024;
/// `FUSE_READ`'s opcode (include/uapi/linux/fuse.h).
const FUSE_READ: u32 = 15;
/// Offset of `fuse_read_in.size` in the entry's `op_in`.
const READ_SIZE_OFFSET: usize = OP_IN_OFFSET + 16;

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig {
            threads_per_queue: 2,
            depth: 1,
            pin: false,
            bulk_threads: 0,
        }
    }
}

/// Counters of the rings, shared with the session's owner.
#[derive(Debug, Default)]
pub struct UringStats {
    queues: AtomicU32,
    threads: AtomicU32,
    bulk_threads: AtomicU32,
    requests: AtomicU64,
    bulk_reads: AtomicU64,
    pub(crate) forgets: AtomicU64,
    pub(crate) forget_reads: AtomicU64,
    /// Until when the /dev/fuse threads rest after the last forget
    /// (`FORGET_PACE` in `session.rs`), shared so that two threads do not
    /// take turns at reading single forgets.
    pub(crate) rest_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl UringStats {
    /// Kernel queues served (one per possible CPU).
    pub fn queues(&self) -> u32 {
        self.queues.load(Ordering::Relaxed)
    }

    /// Threads serving them, one queue each ([`UringConfig::threads_per_queue`]).
    pub fn threads(&self) -> u32 {
        self.threads.load(Ordering::Relaxed)
    }

    /// Bulk threads ([`UringConfig::bulk_threads`]).
    pub fn bulk_threads(&self) -> u32 {
        self.bulk_threads.load(Ordering::Relaxed)
    }

    /// Of [`UringStats::requests`], the large reads bulk threads served.
    pub fn bulk_reads(&self) -> u64 {
        self.bulk_reads.load(Ordering::Relaxed)
    }

    /// Requests that came through the rings so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Inodes the kernel forgot meanwhile, through /dev/fuse (the rings do
    /// not carry forgets), and the reads of /dev/fuse that brought them:
    /// fewer reads than forgets is forgets batched (`FORGET_PACE` in
    /// `session.rs`).
    pub fn forgets(&self) -> (u64, u64) {
        (
            self.forgets.load(Ordering::Relaxed),
            self.forget_reads.load(Ordering::Relaxed),
        )
    }
}

/// The page the kernel reads and writes `struct fuse_uring_req_header` in.
#[repr(C, align(4096))]
struct HeaderPage([u8; 4096]);

/// One ring entry: a request's buffers while the kernel or the daemon holds it.
struct Entry {
    /// The entry's number in the session ([`Shared::entries`]); its commands'
    /// `user_data`, whichever ring carries them.
    index: u64,
    /// The kernel queue it is registered on.
    qid: u16,
    /// The ring thread that registered it ([`Shared::threads`]), which serves
    /// its requests unless a bulk thread takes one over.
    home: usize,
    header: UnsafeCell<HeaderPage>,
    payload: UnsafeCell<Box<[u8]>>,
    /// The iovecs REGISTER points at (header, payload).
    iov: UnsafeCell<[libc::iovec; 2]>,
    /// The command last submitted for it, resubmitted on EAGAIN/EINTR.
    last_cmd: AtomicU32,
}

// SAFETY: the buffers are reached through raw pointers only, under the ownership
// protocol in the module documentation: at any time exactly one of the kernel, the
// ring thread (reading a request out) or the request's one reply uses them.
unsafe impl Sync for Entry {}
unsafe impl Send for Entry {}

impl Entry {
    fn new(index: u64, qid: u16, home: usize, payload_bytes: usize) -> Arc<Entry> {
        let e = Arc::new(Entry {
            index,
            qid,
            home,
            header: UnsafeCell::new(HeaderPage([0; 4096])),
            payload: UnsafeCell::new(vec![0u8; payload_bytes].into_boxed_slice()),
            iov: UnsafeCell::new(
                [libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                }; 2],
            ),
            last_cmd: AtomicU32::new(CMD_REGISTER),
        });
        // SAFETY: nothing else holds the entry yet.
        unsafe {
            let payload = &mut *e.payload.get();
            *e.iov.get() = [
                libc::iovec {
                    iov_base: e.header.get().cast(),
                    iov_len: HEADER_BYTES,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: payload.len(),
                },
            ];
        }
        e
    }

    fn header(&self) -> *mut u8 {
        self.header.get().cast()
    }

    fn payload(&self) -> (*mut u8, usize) {
        // SAFETY: the box itself is never replaced; only its bytes change.
        let p = unsafe { &mut *self.payload.get() };
        (p.as_mut_ptr(), p.len())
    }

    fn read_u64(&self, at: usize) -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: `at + 8 <= HEADER_BYTES`, inside the header page.
        unsafe { std::ptr::copy_nonoverlapping(self.header().add(at), b.as_mut_ptr(), 8) };
        u64::from_ne_bytes(b)
    }

    fn read_u32(&self, at: usize) -> u32 {
        let mut b = [0u8; 4];
        // SAFETY: as in `read_u64`.
        unsafe { std::ptr::copy_nonoverlapping(self.header().add(at), b.as_mut_ptr(), 4) };
        u32::from_ne_bytes(b)
    }

    /// Whether the request in the entry is a read a bulk thread serves.
    fn is_bulk_read(&self) -> bool {
        self.read_u32(4) == FUSE_READ && self.read_u32(READ_SIZE_OFFSET) >= BULK_READ_MIN
    }

    fn command(&self, fd: i32, cmd_op: u32) -> squeue::Entry128 {
        let qid = self.qid;
        let commit_id = if cmd_op == CMD_COMMIT_AND_FETCH {
            self.read_u64(COMMIT_ID_OFFSET)
        } else {
            0
        };
        // struct fuse_uring_cmd_req { u64 flags; u64 commit_id; u16 qid; u8 pad[6]; }
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
        let mut op = opcode::UringCmd80::new(types::Fd(fd), cmd_op).cmd(cmd);
        if cmd_op == CMD_REGISTER {
            op = op.addr(Some(self.iov.get() as u64));
        }
        let sqe = op.build().user_data(self.index);
        if cmd_op != CMD_REGISTER {
            return sqe;
        }
        // io-uring 0.7 has no setter for the SQE's `len`, which REGISTER needs (the
        // iovec count): set it in the raw 128-byte entry.
        // SAFETY: `Entry128` is `repr(C)`, 128 bytes of plain integers.
        let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        raw[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&IOV_SEGS.to_ne_bytes());
        // SAFETY: as above; every bit pattern of the integers is valid.
        unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
    }
}

/// A bare `fuse_out_header` answering request `unique` with EIO.
fn eio_reply(unique: u64) -> [u8; OUT_HEADER_BYTES] {
    let mut out = [0u8; OUT_HEADER_BYTES];
    out[0..4].copy_from_slice(&(OUT_HEADER_BYTES as u32).to_ne_bytes());
    out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
    out[8..16].copy_from_slice(&unique.to_ne_bytes());
    out
}

/// Entries answered and waiting for their commit, and the eventfd that wakes the
/// ring thread when the answer came from another thread.
struct Done {
    answered: Mutex<Vec<u64>>,
    /// Entries holding a request that another ring thread handed to this one
    /// to serve (a large read to a bulk thread, anything else back home).
    handed: Mutex<Vec<u64>>,
    wake: OwnedFd,
    owner: OnceLock<ThreadId>,
    stop: AtomicBool,
}

impl Done {
    fn push(&self, index: u64) {
        self.answered.lock().push(index);
        if self.owner.get() != Some(&thread::current().id()) {
            self.wake();
        }
    }

    fn hand(&self, index: u64) {
        self.handed.lock().push(index);
        self.wake();
    }

    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an eventfd we own.
        let _ = unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

/// Sends one request's reply into its ring entry.
#[derive(Clone)]
pub(crate) struct EntrySender {
    entry: Arc<Entry>,
    done: Arc<Done>,
    ch: ChannelSender,
}

impl fmt::Debug for EntrySender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntrySender")
            .field("entry", &self.entry.index)
            .finish()
    }
}

impl EntrySender {
    /// The /dev/fuse channel of the session (for passthrough backing files).
    pub(crate) fn channel(&self) -> &ChannelSender {
        &self.ch
    }

    /// Writes the reply (`fuse_out_header` and the arguments, as /dev/fuse takes
    /// them) into the entry and hands the entry back to its ring thread to commit.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = data.iter().map(|s| s.len()).sum();
        let (payload, capacity) = self.entry.payload();
        let header = self.entry.header();
        let r = if total < OUT_HEADER_BYTES || total - OUT_HEADER_BYTES > capacity {
            error!("FUSE over io_uring: a reply of {total} bytes does not fit the entry");
            // Answer EIO rather than leave the caller waiting; the commit id is
            // the kernel's request id.
            let out = eio_reply(self.entry.read_u64(COMMIT_ID_OFFSET));
            // SAFETY: this request's single reply owns the entry's buffers.
            unsafe {
                std::ptr::copy_nonoverlapping(out.as_ptr(), header, OUT_HEADER_BYTES);
                std::ptr::write_bytes(header.add(PAYLOAD_SZ_OFFSET), 0, 4);
            }
            Err(io::Error::from_raw_os_error(libc::EINVAL))
        } else {
            let mut at = 0usize;
            for s in data {
                let mut src: &[u8] = s;
                while !src.is_empty() {
                    // SAFETY: this request's single reply owns the entry's buffers;
                    // `at` stays below 16 + capacity (checked above).
                    let n = unsafe {
                        if at < OUT_HEADER_BYTES {
                            let n = src.len().min(OUT_HEADER_BYTES - at);
                            std::ptr::copy_nonoverlapping(src.as_ptr(), header.add(at), n);
                            n
                        } else {
                            let n = src.len();
                            std::ptr::copy_nonoverlapping(
                                src.as_ptr(),
                                payload.add(at - OUT_HEADER_BYTES),
                                n,
                            );
                            n
                        }
                    };
                    at += n;
                    src = &src[n..];
                }
            }
            let payload_sz = (total - OUT_HEADER_BYTES) as u32;
            // SAFETY: as above, inside the header page.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    payload_sz.to_ne_bytes().as_ptr(),
                    header.add(PAYLOAD_SZ_OFFSET),
                    4,
                );
            }
            Ok(())
        };
        self.done.push(self.entry.index);
        r
    }
}

/// One thread's ring, set up before the INIT reply so that a failure can still
/// leave io_uring out of the negotiation.
pub(crate) struct RingThread {
    role: Role,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    /// The entries it registers.
    entries: Vec<Arc<Entry>>,
    shared: Arc<Shared>,
    done: Arc<Done>,
    pin: bool,
    max_payload: usize,
}

/// What a ring thread serves.
#[derive(Clone, Copy, Debug)]
enum Role {
    /// A queue's: it registers that queue's entries, and is pinned to the
    /// queue's CPU when asked.
    Queue(u16),
    /// Bulk thread `i` ([`Shared::bulk`]): registers no entries and serves
    /// large reads of every queue.
    Bulk(usize),
}

/// What every ring thread of a session can reach: all entries, and each
/// thread's lists.
struct Shared {
    entries: Vec<Arc<Entry>>,
    threads: Vec<Arc<Done>>,
    /// The bulk threads' places in `threads`.
    bulk: Vec<usize>,
    /// Bulk thread `i` (of `bulk`) keeps off the CPUs `c` with
    /// `c % classes == i % classes`, and serves the reads of callers on those
    /// CPUs: a reader's copies out of the page cache and the reply's copies
    /// into it run on different CPUs. 1 (no CPUs avoided) with one bulk
    /// thread or one CPU.
    classes: usize,
    next_bulk: AtomicUsize,
}

impl Shared {
    /// The entry a completion names, if it is one of ours.
    fn entry(&self, id: u64) -> Option<&Arc<Entry>> {
        self.entries.get(usize::try_from(id).ok()?)
    }
}

/// Every ring of the session.
pub(crate) struct Rings {
    pub(crate) threads: Vec<RingThread>,
    pub(crate) stats: Arc<UringStats>,
}

impl fmt::Debug for Rings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rings")
            .field("threads", &self.threads.len())
            .finish()
    }
}

/// The kernel's queue count: `num_possible_cpus()`.
fn possible_cpus() -> usize {
    let parsed = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| {
                    r.rsplit('-')
                        .next()
                        .and_then(|n| n.trim().parse::<usize>().ok())
                })
                .max()
                .map(|m| m + 1)
        });
    // SAFETY: sysconf has no memory effects.
    parsed.unwrap_or_else(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
}

impl Rings {
    /// Sets up `threads_per_queue` rings for every queue, each with `depth` entries
    /// whose payload holds `max_payload` bytes (the kernel's largest request).
    pub(crate) fn prepare(cfg: UringConfig, max_payload: usize) -> io::Result<Rings> {
        if cfg.threads_per_queue == 0 || cfg.depth == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "io_uring needs at least one thread per queue and one entry per thread",
            ));
        }
        let queues = possible_cpus();
        let qmax = u16::MAX as usize;
        if queues > qmax {
            return Err(io::Error::other(format!(
                "{queues} CPUs is more queues than FUSE allows"
            )));
        }
        let homes = queues * cfg.threads_per_queue;
        let total = homes * cfg.depth;
        let mut entries = Vec::with_capacity(total);
        let mut dones = Vec::with_capacity(homes + cfg.bulk_threads);
        let mut rings = Vec::with_capacity(homes + cfg.bulk_threads);
        for me in 0..homes + cfg.bulk_threads {
            // A home thread holds its own entries; a bulk thread may hold any.
            let (role, held) = if me < homes {
                (Role::Queue((me / cfg.threads_per_queue) as u16), cfg.depth)
            } else {
                (Role::Bulk(me - homes), total)
            };
            let slots = (held + 1) as u32;
            // Plain flags, as libfuse: SINGLE_ISSUER + DEFER_TASKRUN and
            // COOP_TASKRUN measured no better here (docs/benchmarks.md).
            let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
                .setup_cqsize(slots * 2)
                .build(slots)?;
            // SAFETY: eventfd returns a new descriptor or -1.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh descriptor we own.
            let wake = unsafe { OwnedFd::from_raw_fd(fd) };
            let mut own = Vec::new();
            if let Role::Queue(q) = role {
                for _ in 0..cfg.depth {
                    let e = Entry::new(entries.len() as u64, q, me, max_payload);
                    entries.push(e.clone());
                    own.push(e);
                }
            }
            dones.push(Arc::new(Done {
                answered: Mutex::new(Vec::with_capacity(held)),
                handed: Mutex::new(Vec::with_capacity(held)),
                wake,
                owner: OnceLock::new(),
                stop: AtomicBool::new(false),
            }));
            rings.push((role, ring, own));
        }
        let shared = Arc::new(Shared {
            entries,
            threads: dones.clone(),
            bulk: (homes..homes + cfg.bulk_threads).collect(),
            classes: if cfg.bulk_threads >= 2 && queues >= 2 {
                2
            } else {
                1
            },
            next_bulk: AtomicUsize::new(0),
        });
        let threads = rings
            .into_iter()
            .zip(dones)
            .map(|((role, ring, entries), done)| RingThread {
                role,
                ring,
                entries,
                shared: shared.clone(),
                done,
                pin: cfg.pin,
                max_payload,
            })
            .collect::<Vec<_>>();
        let stats = Arc::new(UringStats::default());
        stats.queues.store(queues as u32, Ordering::Relaxed);
        stats.threads.store(homes as u32, Ordering::Relaxed);
        stats
            .bulk_threads
            .store(cfg.bulk_threads as u32, Ordering::Relaxed);
        Ok(Rings { threads, stats })
    }
}

/// Stops ring threads: set by the session when /dev/fuse has gone.
#[derive(Clone)]
pub(crate) struct Stopper(Vec<Arc<Done>>);

impl Stopper {
    pub(crate) fn of(threads: &[RingThread]) -> Stopper {
        Stopper(threads.iter().map(|t| t.done.clone()).collect())
    }

    pub(crate) fn stop(&self) {
        for d in &self.0 {
            d.stop.store(true, Ordering::Release);
            d.wake();
        }
    }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity
    // only touch it and the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            warn!(
                "FUSE over io_uring: pinning to CPU {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

impl RingThread {
    /// A thread's name: `fuser-ring-<n>` for a queue's, `fuser-bulk-<n>` for a
    /// bulk thread.
    pub(crate) fn name(&self, n: usize) -> String {
        match self.role {
            Role::Queue(_) => format!("fuser-ring-{n}"),
            Role::Bulk(_) => format!("fuser-bulk-{n}"),
        }
    }

    /// Bulk thread `i` leaves the CPUs of its class (see [`Shared::classes`]).
    fn avoid_class(i: usize, k: usize) {
        if k < 2 {
            return;
        }
        // SAFETY: the set is a plain bitmap that sched_getaffinity fills and
        // sched_setaffinity reads; both touch only the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return;
            }
            let mut left = 0;
            for c in 0..libc::CPU_SETSIZE as usize {
                if libc::CPU_ISSET(c, &set) {
                    if c % k == i % k {
                        libc::CPU_CLR(c, &mut set);
                    } else {
                        left += 1;
                    }
                }
            }
            // Allowed nowhere else (a process confined to one class): stay.
            if left > 0 && libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
                warn!(
                    "FUSE over io_uring: moving a bulk thread off CPUs: {}",
                    io::Error::last_os_error()
                );
            }
        }
    }

    /// Registers the entries and serves requests until the connection goes away.
    pub(crate) fn serve<FS: Filesystem>(
        mut self,
        se: SessionEventLoop<FS>,
        stats: Arc<UringStats>,
    ) -> io::Result<()> {
        let _ = self.done.owner.set(thread::current().id());
        match self.role {
            Role::Queue(qid) if self.pin => pin_to(qid as usize),
            Role::Queue(_) => {}
            Role::Bulk(i) => Self::avoid_class(i, self.shared.classes),
        }
        let fd = se.ch.as_fd_raw();
        for e in self.entries.clone() {
            self.push(e.command(fd, CMD_REGISTER))?;
        }
        let mut wake_buf = 0u64;
        self.arm_wake()?;
        // The request as /dev/fuse would deliver it, 8-byte aligned for the parser.
        // A bulk thread serves reads only, which carry no payload.
        let payload = match self.role {
            Role::Queue(_) => self.max_payload,
            Role::Bulk(_) => 0,
        };
        let words = (IN_HEADER_BYTES + OP_IN_BYTES + payload).div_ceil(8);
        let mut request = vec![0u64; words];
        let mut completed: Vec<(u64, i32)> = Vec::with_capacity(self.entries.len() + 1);
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            completed.clear();
            completed.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(id, res) in &completed {
                if id == WAKE {
                    if self.done.stop.load(Ordering::Acquire) {
                        return Ok(());
                    }
                    // SAFETY: reads 8 bytes into a live u64 from our eventfd.
                    let _ = unsafe {
                        libc::read(self.done.wake.as_raw_fd(), (&raw mut wake_buf).cast(), 8)
                    };
                    self.arm_wake()?;
                    continue;
                }
                let Some(e) = self.shared.entry(id).cloned() else {
                    error!("FUSE over io_uring: completion for unknown entry {id}");
                    continue;
                };
                match res {
                    0 => {
                        if let Some(to) = self.hand_to(&e) {
                            // Served by another thread, which commits it from its ring.
                            self.shared.threads[to].hand(e.index);
                            continue;
                        }
                        self.serve_one(&e, &se, bytes_of(&mut request), &stats);
                    }
                    r if r == -libc::EAGAIN || r == -libc::EINTR => {
                        // REGISTER before the INIT reply took effect, or interrupted.
                        thread::sleep(std::time::Duration::from_millis(1));
                        let cmd = e.last_cmd.load(Ordering::Relaxed);
                        self.push(e.command(fd, cmd))?;
                    }
                    r if r == -libc::ENOTCONN || r == -libc::ECONNABORTED || r == -libc::ENODEV => {
                        // Unmounted or aborted: the connection is gone.
                        return Ok(());
                    }
                    r => {
                        let err = io::Error::from_raw_os_error(-r);
                        error!("FUSE over io_uring: queue {} entry {id}: {err}", e.qid);
                        return Err(err);
                    }
                }
            }
            // Requests other threads handed over: served here, not handed on, so
            // an entry never travels more than once per request.
            let handed = std::mem::take(&mut *self.done.handed.lock());
            for id in handed {
                if let Some(e) = self.shared.entry(id).cloned() {
                    self.serve_one(&e, &se, bytes_of(&mut request), &stats);
                }
            }
            let answered = std::mem::take(&mut *self.done.answered.lock());
            for id in answered {
                let Some(e) = self.shared.entry(id).cloned() else {
                    continue;
                };
                e.last_cmd.store(CMD_COMMIT_AND_FETCH, Ordering::Relaxed);
                self.push(e.command(fd, CMD_COMMIT_AND_FETCH))?;
            }
        }
    }

    /// Which thread serves the request that just arrived in `e`, if not this
    /// one: large reads go to a bulk thread, and a bulk thread sends anything
    /// else back to the entry's home.
    fn hand_to(&self, e: &Entry) -> Option<usize> {
        let bulk = &self.shared.bulk;
        match (self.role, e.is_bulk_read()) {
            (Role::Queue(_), true) if !bulk.is_empty() => {
                // A bulk thread of the class that keeps off the caller's CPU.
                let k = self.shared.classes;
                let class = e.qid as usize % k;
                let in_class = (bulk.len() - class).div_ceil(k);
                let n = self.shared.next_bulk.fetch_add(1, Ordering::Relaxed);
                Some(bulk[class + (n % in_class) * k])
            }
            (Role::Bulk(_), false) => Some(e.home),
            _ => None,
        }
    }

    /// Runs the request in `e` here, counted.
    fn serve_one<FS: Filesystem>(
        &self,
        e: &Arc<Entry>,
        se: &SessionEventLoop<FS>,
        buf: &mut [u8],
        stats: &UringStats,
    ) {
        if let Role::Bulk(_) = self.role {
            stats.bulk_reads.fetch_add(1, Ordering::Relaxed);
        }
        self.dispatch(e, se, buf);
        stats.requests.fetch_add(1, Ordering::Relaxed);
    }

    fn push(&mut self, sqe: squeue::Entry128) -> io::Result<()> {
        // SAFETY: every buffer an SQE names lives in an `Entry` this thread holds an
        // `Arc` of until the ring is dropped, or in `self.done`.
        unsafe { self.ring.submission().push(&sqe) }.map_err(|_| {
            // Cannot happen: at most one command per entry plus the wake poll are
            // queued, and the ring has that many slots.
            io::Error::other("FUSE over io_uring: submission queue full")
        })
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let poll = opcode::PollAdd::new(types::Fd(self.done.wake.as_raw_fd()), libc::POLLIN as _)
            .build()
            .user_data(WAKE);
        self.push(poll.into())
    }

    /// Copies the request out of the entry and runs it; its reply lands in the
    /// entry through an [`EntrySender`].
    fn dispatch<FS: Filesystem>(&self, e: &Arc<Entry>, se: &SessionEventLoop<FS>, buf: &mut [u8]) {
        let header = e.header();
        let len = e.read_u32(0) as usize;
        let payload_sz = e.read_u32(PAYLOAD_SZ_OFFSET) as usize;
        let (payload, capacity) = e.payload();
        let sender = EntrySender {
            entry: e.clone(),
            done: self.done.clone(),
            ch: se.ch.sender(),
        };
        let op_len = len.checked_sub(IN_HEADER_BYTES + payload_sz);
        let fits = |&n: &usize| n <= OP_IN_BYTES && payload_sz <= capacity && len <= buf.len();
        let Some(op_len) = op_len.filter(fits) else {
            error!(
                "FUSE over io_uring: request of {len} bytes with a {payload_sz}-byte payload \
                 does not fit an entry"
            );
            let _ = sender.send(&[IoSlice::new(&eio_reply(e.read_u64(8)))]);
            return;
        };
        // SAFETY: the kernel has completed the command, so the ring thread owns the
        // buffers until the reply; the copies stay inside both (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(header, buf.as_mut_ptr(), IN_HEADER_BYTES);
            std::ptr::copy_nonoverlapping(
                header.add(OP_IN_OFFSET),
                buf.as_mut_ptr().add(IN_HEADER_BYTES),
                op_len,
            );
            std::ptr::copy_nonoverlapping(
                payload,
                buf.as_mut_ptr().add(IN_HEADER_BYTES + op_len),
                payload_sz,
            );
        }
        match RequestWithSender::new_uring(se.ch.sender(), sender.clone(), &buf[..len]) {
            Some(req) => req.dispatch(se),
            None => {
                let _ = sender.send(&[IoSlice::new(&eio_reply(e.read_u64(8)))]);
            }
        }
    }
}

fn bytes_of(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 has no invalid bit patterns and u8 has alignment 1; the length
    // covers exactly the same memory.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

impl Channel {
    pub(crate) fn as_fd_raw(&self) -> i32 {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}
