//! `UringDevice`: io_uring with `O_DIRECT` on a regular file or a block device.
//!
//! - **Buffers**: a pool of registered buffers is set up at open; [`Device::alloc_buf`]
//!   lends one when the length fits and one is free (marked with its fixed index), and
//!   requests on pooled buffers use `ReadFixed`/`WriteFixed`. Other buffers work too,
//!   with plain `Read`/`Write`. [`Device::free_buf`] returns a pooled buffer.
//! - **Ownership**: while a request is in flight its buffer lives in a slot of a slab
//!   indexed by the SQE's `user_data`, so the kernel never sees freed memory; dropping
//!   the device waits for every in-flight request first.
//! - **Submission**: `submit` only fills an SQE; `poll` and `wait` hand all new SQEs to
//!   the kernel in one `io_uring_enter`, so a burst of submits costs one syscall.
//! - **Short transfers** are retried for the remainder; a transfer that makes no
//!   progress fails with `EIO`. A negative result fails that request only, as
//!   [`DeviceError::Io`]. Bad requests (empty, misaligned, past the end) complete with
//!   [`DeviceError::BadRequest`] without reaching the kernel.
//! - **Sync** is `fdatasync` (`Fsync` with `DATASYNC`). Like the kernel's, it covers
//!   writes that completed before it was submitted, not writes still in flight.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use io_uring::{opcode, squeue, types, IoUring};

use super::{
    AlignedBuf, Device, DeviceError, IoCompletion, IoKind, IoRequest, Region, HUGE_PAGE,
    SECTOR_SIZE,
};

/// Most requests in flight we accept (the kernel allows more; a shard needs far fewer).
const QUEUE_DEPTH_MAX: usize = 4096;
/// The default `UringOptions::submit_below`.
pub const SUBMIT_BELOW: usize = 8;
/// The kernel's limits on registered buffers: count and size of one.
const REGISTERED_BUFFERS_MAX: usize = 16384;
const REGISTERED_BUFFER_SIZE_MAX: usize = 1 << 30;

/// `_IOR(0x12, 114, u64)`: size of a block device in bytes (not in the `libc` crate).
#[cfg(any(
    target_arch = "x86_64",
    target_arch = "x86",
    target_arch = "aarch64",
    target_arch = "arm",
    target_arch = "riscv64",
    target_arch = "s390x",
    target_arch = "loongarch64"
))]
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
#[cfg(any(
    target_arch = "powerpc64",
    target_arch = "powerpc",
    target_arch = "mips",
    target_arch = "mips64",
    target_arch = "sparc64"
))]
const BLKGETSIZE64: libc::c_ulong = 0x4008_1272;

/// How to open a [`UringDevice`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// Most requests in flight (1..=4096).
    pub queue_depth: usize,
    /// How many buffers to register with the kernel (0 for none).
    pub registered_buffers: usize,
    /// Size of each registered buffer in bytes, a multiple of [`SECTOR_SIZE`].
    pub registered_buffer_size: usize,
    /// Plain buffers of the registered size kept for reuse once returned
    /// (`free_buf`) while the registered ones are all lent: a large buffer
    /// allocated afresh is zeroed and faulted in page by page, and unmapped
    /// when freed. At most this many are kept.
    pub spare_buffers: usize,
    /// For a regular file: create it if missing and extend it to this size, which is
    /// then the device size. For a block device: use only the first this many bytes.
    /// `None` uses the whole existing file or device.
    pub size_bytes: Option<u64>,
    /// When a regular file is created or grown to `size_bytes`: allocate the blocks
    /// now (`fallocate`), so a full disk shows up at open; `false` extends the file
    /// sparsely and a full disk shows up as failed writes.
    pub preallocate: bool,
    /// While fewer requests than this are with the kernel, a request is
    /// handed to it as it is submitted (one `io_uring_enter` each); past
    /// that, requests wait and go together at the next `poll` or `wait`.
    /// Batching alone let a virtio disk's queue drain before it was refilled
    /// (4 KiB random reads at depth 32: 0.81x fio, 1.0x with 8;
    /// docs/benchmarks.md). 0 always batches.
    pub submit_below: usize,
}

impl Default for UringOptions {
    fn default() -> UringOptions {
        UringOptions {
            queue_depth: 64,
            registered_buffers: 64,
            registered_buffer_size: 128 * 1024,
            spare_buffers: 16,
            size_bytes: None,
            preallocate: true,
            submit_below: SUBMIT_BELOW,
        }
    }
}

/// A request the device owns until it completes.
#[derive(Debug)]
struct Op {
    tag: u64,
    kind: IoKind,
    offset: u64,
    buf: AlignedBuf,
    /// Registered-buffer index when `buf` is one of ours.
    fixed: Option<u16>,
    /// Bytes transferred so far (short transfers are continued from here).
    done_bytes: usize,
    /// Set for a request rejected at submit; it completes on the next reap.
    rejected: Option<DeviceError>,
}

/// io_uring device over a file or block device opened with `O_DIRECT`; see the module docs.
pub struct UringDevice {
    ring: IoUring,
    file: File,
    path: PathBuf,
    size_bytes: u64,
    queue_depth: usize,
    /// In-flight requests, indexed by SQE `user_data`.
    slots: Vec<Option<Op>>,
    free_slots: Vec<u32>,
    in_flight: usize,
    /// Slots of rejected requests, completed on the next reap.
    rejected_slots: Vec<u32>,
    /// SQEs filled and not yet handed to the kernel.
    unsubmitted: usize,
    /// `UringOptions::submit_below`.
    submit_below: usize,
    /// Registered buffers not lent out, by index (`None` while lent).
    pool: Vec<Option<AlignedBuf>>,
    /// Base address of each registered buffer, to recognise our own.
    pool_addrs: Vec<usize>,
    pool_free: Vec<u16>,
    registered_buffer_size: usize,
    /// Plain buffers of `registered_buffer_size` bytes to lend again, at most
    /// `spares_max`.
    spares: Vec<AlignedBuf>,
    spares_max: usize,
    /// The memory of the registered buffers (huge pages where the kernel had them).
    region: Option<std::sync::Arc<Region>>,
    /// Scratch for reaped CQEs (`user_data`, `result`), sized at open.
    cqes: Vec<(u64, i32)>,
}

impl std::fmt::Debug for UringDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDevice")
            .field("path", &self.path)
            .field("size_bytes", &self.size_bytes)
            .field("queue_depth", &self.queue_depth)
            .field("in_flight", &self.in_flight)
            .field("pooled_buffers_free", &self.pool_free.len())
            .finish_non_exhaustive()
    }
}

fn open_error(path: &Path, reason: impl Into<String>) -> DeviceError {
    DeviceError::Open { path: path.display().to_string(), reason: reason.into() }
}

/// The message for an `EINVAL` that means "no `O_DIRECT` here".
fn no_direct_io(path: &Path, during: &str) -> DeviceError {
    open_error(
        path,
        format!(
            "file system does not support O_DIRECT ({during} failed with EINVAL); \
             put the data on a disk-backed file system"
        ),
    )
}

impl UringDevice {
    /// Opens `path` with `O_DIRECT` and sets up the ring and registered buffers.
    pub fn open(path: impl AsRef<Path>, opts: UringOptions) -> Result<UringDevice, DeviceError> {
        let path = path.as_ref();
        check_options(path, &opts)?;
        let (file, size_bytes) = open_file(path, opts.size_bytes, opts.preallocate)?;
        probe_direct_io(path, &file, size_bytes)?;

        let entries = u32::try_from(opts.queue_depth).expect("checked queue depth");
        // Cooperative task running: completions are posted when we next enter the
        // kernel instead of by interrupting the thread; the SQ "taskrun" flag tells
        // `poll` when to enter. Not SINGLE_ISSUER/DEFER_TASKRUN: a device may be opened
        // on one thread and driven by another. Kernels before 5.19 lack the flags.
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)
            .or_else(|_| IoUring::new(entries))
            .map_err(|e| {
                open_error(
                    path,
                    format!(
                        "io_uring setup with {entries} entries failed: {e} (is io_uring disabled? \
                     see /proc/sys/kernel/io_uring_disabled)"
                    ),
                )
            })?;

        let mut pool = Vec::with_capacity(opts.registered_buffers);
        let mut pool_addrs = Vec::with_capacity(opts.registered_buffers);
        let mut iovecs = Vec::with_capacity(opts.registered_buffers);
        // The pool in one region of huge pages where the kernel has them: each
        // buffer physically contiguous, so a 1 MiB transfer is one request.
        let size = opts.registered_buffer_size.div_ceil(SECTOR_SIZE) * SECTOR_SIZE;
        let region = if opts.registered_buffers > 0 && size > 0 {
            Region::huge(opts.registered_buffers * size)
        } else {
            None
        };
        for i in 0..opts.registered_buffers {
            let mut buf = match &region {
                Some(r) => AlignedBuf::in_region(r, i * size, size),
                None => AlignedBuf::zeroed(size),
            };
            buf.set_fixed_index(Some(u16::try_from(i).expect("checked buffer count")));
            let base = buf.as_mut_ptr();
            iovecs.push(libc::iovec { iov_base: base.cast(), iov_len: buf.capacity() });
            pool_addrs.push(base as usize);
            pool.push(Some(buf));
        }
        if !iovecs.is_empty() {
            // SAFETY: each iovec is a live allocation owned by `pool`; pooled buffers are
            // only freed after the ring is gone or after they left the pool, and we only
            // issue fixed operations on a buffer we recognise as lent out (see `submit`).
            unsafe { ring.submitter().register_buffers(&iovecs) }.map_err(|e| {
                open_error(
                    path,
                    format!(
                        "registering {} buffers of {} bytes failed: {e}; raise the locked-memory \
                         limit (ulimit -l) or register fewer or smaller buffers",
                        opts.registered_buffers, opts.registered_buffer_size
                    ),
                )
            })?;
        }

        let queue_depth = opts.queue_depth;
        Ok(UringDevice {
            ring,
            file,
            path: path.to_path_buf(),
            size_bytes,
            queue_depth,
            slots: (0..queue_depth).map(|_| None).collect(),
            free_slots: (0..queue_depth as u32).rev().collect(),
            in_flight: 0,
            rejected_slots: Vec::with_capacity(queue_depth),
            unsubmitted: 0,
            submit_below: opts.submit_below,
            pool_free: (0..opts.registered_buffers as u16).rev().collect(),
            pool,
            pool_addrs,
            registered_buffer_size: opts.registered_buffer_size,
            spares: Vec::with_capacity(opts.spare_buffers),
            spares_max: opts.spare_buffers,
            region,
            cqes: Vec::with_capacity(2 * queue_depth),
        })
    }

    /// The path the device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes of the registered buffers, and how many of them the kernel backs
    /// with huge pages (`None` when it does not say), for the start's log.
    pub fn registered_memory(&self) -> (usize, Option<usize>) {
        match &self.region {
            Some(r) => (r.len(), r.huge_bytes()),
            None => (self.pool.len() * self.registered_buffer_size, Some(0)),
        }
    }

    /// Registered buffers currently free in the pool.
    pub fn pooled_buffers_free(&self) -> usize {
        self.pool_free.len()
    }

    /// Plain buffers kept for reuse ([`UringOptions::spare_buffers`]).
    pub fn spare_buffers_kept(&self) -> usize {
        self.spares.len()
    }

    /// The registered-buffer index of `buf` if it is one of our pooled buffers, lent out.
    fn pooled_index(&self, buf: &AlignedBuf) -> Option<u16> {
        let i = buf.fixed_index()?;
        let lent = self.pool.get(usize::from(i)).is_some_and(|slot| slot.is_none());
        let ours = self.pool_addrs.get(usize::from(i)) == Some(&(buf.as_ptr() as usize))
            && buf.capacity() == self.registered_buffer_size;
        (lent && ours).then_some(i)
    }

    fn check(&self, kind: IoKind, offset: u64, len: usize) -> Result<(), DeviceError> {
        if kind == IoKind::Sync {
            return Ok(());
        }
        let bad = |what: &str| {
            Err(DeviceError::BadRequest(format!(
                "{kind:?} of {len} bytes at offset {offset} on {}: {what} (device size {})",
                self.path.display(),
                self.size_bytes
            )))
        };
        if len == 0 {
            return bad("empty buffer");
        }
        if offset % SECTOR_SIZE as u64 != 0 || len % SECTOR_SIZE != 0 {
            return bad("not aligned to the sector size");
        }
        if u32::try_from(len).is_err() {
            return bad("longer than 4 GiB");
        }
        if offset.checked_add(len as u64).is_none_or(|end| end > self.size_bytes) {
            return bad("past the end of the device");
        }
        Ok(())
    }

    /// Fills an SQE for (the rest of) the request in `slot`.
    fn push_sqe(&mut self, slot: u32) {
        let fd = types::Fd(self.file.as_raw_fd());
        let op = self.slots[slot as usize].as_mut().expect("slot in use");
        let done = op.done_bytes;
        assert!(done < op.buf.len() || op.kind == IoKind::Sync);
        let len = (op.buf.len() - done) as u32;
        let offset = op.offset + done as u64;
        // SAFETY (pointer arithmetic): `done < len`, so the pointer stays in the buffer.
        let ptr = unsafe { op.buf.as_mut_ptr().add(done) };
        let entry = match (op.kind, op.fixed) {
            (IoKind::Read, Some(i)) => {
                opcode::ReadFixed::new(fd, ptr, len, i).offset(offset).build()
            }
            (IoKind::Read, None) => opcode::Read::new(fd, ptr, len).offset(offset).build(),
            (IoKind::Write, Some(i)) => {
                opcode::WriteFixed::new(fd, ptr, len, i).offset(offset).build()
            }
            (IoKind::Write, None) => opcode::Write::new(fd, ptr, len).offset(offset).build(),
            (IoKind::Sync, _) => opcode::Fsync::new(fd).flags(types::FsyncFlags::DATASYNC).build(),
        };
        self.push_entry(entry.user_data(u64::from(slot)));
    }

    fn push_entry(&mut self, entry: squeue::Entry) {
        // The ring has at least `queue_depth` SQEs and at most `queue_depth` requests are
        // in flight, so the queue has room unless the kernel left some unconsumed.
        for _ in 0..2 {
            // SAFETY: the entry's buffer lives in `self.slots` until its CQE is reaped.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                self.unsubmitted += 1;
                // The device's queue runs low: this request goes to the kernel
                // now, not with the round's others (`submit_below`).
                if self.in_flight - self.unsubmitted < self.submit_below {
                    self.enter(0);
                }
                return;
            }
            self.enter(0);
        }
        panic!("io_uring submission queue stays full with {} in flight", self.in_flight);
    }

    /// Hands filled SQEs to the kernel and waits for `want` CQEs. Transient failures
    /// (interrupted, out of kernel resources) return 0 and are retried by the caller's
    /// loop; anything else means our use of the ring is wrong.
    fn enter(&mut self, want: usize) -> usize {
        match self.ring.submit_and_wait(want) {
            Ok(n) => {
                self.unsubmitted = self.ring.submission().len();
                n
            }
            Err(e) if is_transient(&e) => 0,
            Err(e) => panic!("io_uring_enter on {} failed: {e}", self.path.display()),
        }
    }

    /// Moves finished requests to `out`; continues short transfers. Returns how many.
    fn reap(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let mut finished = 0;
        while let Some(slot) = self.rejected_slots.pop() {
            let op = self.slots[slot as usize].take().expect("rejected slot in use");
            let result = Err(op.rejected.clone().expect("rejected op has an error"));
            self.finish(slot, op, result, out);
            finished += 1;
        }
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.clear();
        cqes.extend(self.ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        for &(user_data, res) in &cqes {
            finished += usize::from(self.complete_one(user_data, res, out));
        }
        self.cqes = cqes;
        finished
    }

    /// Handles one CQE; true if its request finished.
    fn complete_one(&mut self, user_data: u64, res: i32, out: &mut Vec<IoCompletion>) -> bool {
        let slot = u32::try_from(user_data).expect("user_data is a slot index");
        let op = self.slots[slot as usize].as_mut().expect("CQE for a slot in use");
        let result = if res < 0 {
            Err(DeviceError::Io { offset: op.offset + op.done_bytes as u64, errno: -res })
        } else if op.kind == IoKind::Sync {
            Ok(())
        } else if res == 0 {
            // No progress (past the end of a file that shrank?): retrying would spin.
            Err(DeviceError::Io { offset: op.offset + op.done_bytes as u64, errno: libc::EIO })
        } else {
            op.done_bytes += res as usize;
            assert!(op.done_bytes <= op.buf.len(), "kernel transferred more than asked");
            if op.done_bytes < op.buf.len() {
                self.push_sqe(slot);
                return false;
            }
            Ok(())
        };
        let op = self.slots[slot as usize].take().expect("slot in use");
        self.finish(slot, op, result, out);
        true
    }

    fn finish(
        &mut self,
        slot: u32,
        op: Op,
        result: Result<(), DeviceError>,
        out: &mut Vec<IoCompletion>,
    ) {
        self.free_slots.push(slot);
        self.in_flight -= 1;
        let Op { tag, kind, offset, buf, .. } = op;
        out.push(IoCompletion { tag, kind, offset, buf, result });
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ENOMEM))
}

fn check_options(path: &Path, opts: &UringOptions) -> Result<(), DeviceError> {
    if !(1..=QUEUE_DEPTH_MAX).contains(&opts.queue_depth) {
        return Err(open_error(
            path,
            format!("queue_depth {} is not in 1..={QUEUE_DEPTH_MAX}", opts.queue_depth),
        ));
    }
    if opts.registered_buffers > REGISTERED_BUFFERS_MAX {
        return Err(open_error(
            path,
            format!(
                "registered_buffers {} is more than {REGISTERED_BUFFERS_MAX}",
                opts.registered_buffers
            ),
        ));
    }
    let size = opts.registered_buffer_size;
    if opts.registered_buffers > 0
        && (size == 0 || size % SECTOR_SIZE != 0 || size > REGISTERED_BUFFER_SIZE_MAX)
    {
        return Err(open_error(
            path,
            format!(
                "registered_buffer_size {size} must be a positive multiple of {SECTOR_SIZE} \
                 up to {REGISTERED_BUFFER_SIZE_MAX}"
            ),
        ));
    }
    if let Some(size) = opts.size_bytes {
        if size == 0 || size % SECTOR_SIZE as u64 != 0 {
            return Err(open_error(
                path,
                format!("size_bytes {size} must be a positive multiple of {SECTOR_SIZE}"),
            ));
        }
    }
    Ok(())
}

/// Opens the file or block device and works out the device size.
fn open_file(
    path: &Path,
    size_bytes: Option<u64>,
    preallocate: bool,
) -> Result<(File, u64), DeviceError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(size_bytes.is_some())
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => no_direct_io(path, "open"),
            _ => open_error(path, e.to_string()),
        })?;
    let meta = file.metadata().map_err(|e| open_error(path, format!("fstat failed: {e}")))?;
    let ft = meta.file_type();
    let size = if ft.is_block_device() {
        let mut dev_bytes: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut dev_bytes) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(open_error(path, format!("BLKGETSIZE64 failed: {e}")));
        }
        match size_bytes {
            Some(want) if want > dev_bytes => {
                return Err(open_error(
                    path,
                    format!(
                        "size_bytes {want} is larger than the block device ({dev_bytes} bytes)"
                    ),
                ))
            }
            Some(want) => want,
            None => dev_bytes / SECTOR_SIZE as u64 * SECTOR_SIZE as u64,
        }
    } else if ft.is_file() {
        match size_bytes {
            Some(want) => {
                if meta.len() < want {
                    let grown =
                        if preallocate { allocate(&file, want) } else { file.set_len(want) };
                    if let Err(e) = grown {
                        // Give back what a partial fallocate took.
                        let _ = file.set_len(meta.len());
                        let hint = match (preallocate, e.raw_os_error()) {
                            (true, Some(libc::ENOSPC)) => {
                                " (preallocate = false makes a sparse file that fills as written)"
                            }
                            _ => "",
                        };
                        return Err(open_error(
                            path,
                            format!("extending the file to {want} bytes failed: {e}{hint}"),
                        ));
                    }
                }
                want
            }
            None => meta.len() / SECTOR_SIZE as u64 * SECTOR_SIZE as u64,
        }
    } else {
        return Err(open_error(path, "not a regular file or block device"));
    };
    if size == 0 {
        return Err(open_error(
            path,
            "device is empty; give size_bytes to create or extend the file",
        ));
    }
    Ok((file, size))
}

/// Allocates the file up to `size` so a full disk shows up now, not as a failed write;
/// falls back to a sparse extension where `fallocate` is unsupported.
fn allocate(file: &File, size: u64) -> io::Result<()> {
    match allocate_range(file, 0, size) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => file.set_len(size),
        other => other,
    }
}

/// `fallocate` of `offset..offset + len` (extending the file when it ends before).
fn allocate_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let off =
        |v: u64| libc::off_t::try_from(v).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG));
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, off(offset)?, off(len)?) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads the first sector with `O_DIRECT`, so a file system that accepts the flag at
/// open but refuses direct I/O fails here with a clear message, not on the first read.
fn probe_direct_io(path: &Path, file: &File, size_bytes: u64) -> Result<(), DeviceError> {
    assert!(size_bytes >= SECTOR_SIZE as u64);
    let mut buf = AlignedBuf::zeroed(SECTOR_SIZE);
    // SAFETY: `buf` is valid for SECTOR_SIZE bytes.
    let rc = unsafe { libc::pread(file.as_raw_fd(), buf.as_mut_ptr().cast(), SECTOR_SIZE, 0) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EINVAL) => no_direct_io(path, "a direct read"),
            _ => open_error(path, format!("reading the first sector failed: {e}")),
        });
    }
    Ok(())
}

impl Device for UringDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn reserve(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let regular = self.file.metadata().map(|m| m.is_file()).unwrap_or(false);
        if !regular || len == 0 {
            return Ok(());
        }
        match allocate_range(&self.file, offset, len) {
            Ok(()) => Ok(()),
            // Nothing to reserve with: writes find out, as without this call.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(()),
            Err(e) => Err(DeviceError::Io { offset, errno: e.raw_os_error().unwrap_or(libc::EIO) }),
        }
    }

    fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        // A ring's descriptor polls readable while its completion queue holds
        // entries (with this ring's cooperative task running too: checked on
        // this kernel, and by `a_sleeping_poller_wakes_for_a_completion`).
        Some(std::os::fd::AsRawFd::as_raw_fd(&self.ring))
    }

    fn submit(&mut self, req: IoRequest) -> Result<(), IoRequest> {
        if self.in_flight == self.queue_depth {
            return Err(req);
        }
        let slot = self.free_slots.pop().expect("a free slot when below queue depth");
        let rejected = self.check(req.kind, req.offset, req.buf.len()).err();
        let fixed = match req.kind {
            IoKind::Sync => None,
            _ => self.pooled_index(&req.buf),
        };
        let IoRequest { tag, kind, offset, buf } = req;
        let reject = rejected.is_some();
        self.slots[slot as usize] =
            Some(Op { tag, kind, offset, buf, fixed, done_bytes: 0, rejected });
        self.in_flight += 1;
        if reject {
            self.rejected_slots.push(slot);
        } else {
            self.push_sqe(slot);
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        if self.unsubmitted > 0 || self.ring.submission().taskrun() {
            self.enter(0);
        }
        self.reap(out)
    }

    fn wait(&mut self, out: &mut Vec<IoCompletion>, min: usize) -> usize {
        let min = min.min(self.in_flight);
        let mut finished = self.poll(out);
        while finished < min {
            // Every request still in flight is with the kernel, so `want` CQEs will come.
            self.enter(min - finished);
            finished += self.reap(out);
        }
        finished
    }

    fn alloc_buf(&mut self, len: usize) -> AlignedBuf {
        let len = len.div_ceil(SECTOR_SIZE) * SECTOR_SIZE;
        let size = self.registered_buffer_size;
        if len > 0 && len <= size {
            if let Some(i) = self.pool_free.pop() {
                let mut buf = self.pool[usize::from(i)].take().expect("free pooled buffer");
                buf.set_len(len);
                return buf;
            }
            if let Some(mut buf) = self.spares.pop() {
                buf.set_len(len);
                return buf;
            }
            if len > size / 4 && self.spares_max > 0 {
                // Of the registered size, so it can be kept when it comes back;
                // in huge pages as the registered ones, a huge page's worth at
                // a time (the others wait in the spares).
                let per_page = (HUGE_PAGE / size).max(1);
                if let Some(region) = Region::huge(per_page * size) {
                    for i in 1..per_page.min(self.spares_max - self.spares.len() + 1) {
                        self.spares.push(AlignedBuf::in_region(&region, i * size, size));
                    }
                    let mut buf = AlignedBuf::in_region(&region, 0, size);
                    buf.set_len(len);
                    return buf;
                }
                let mut buf = AlignedBuf::zeroed(size);
                buf.set_len(len);
                return buf;
            }
        }
        AlignedBuf::zeroed(len)
    }

    fn free_buf(&mut self, mut buf: AlignedBuf) {
        if let Some(i) = self.pooled_index(&buf) {
            buf.set_len(buf.capacity());
            self.pool[usize::from(i)] = Some(buf);
            self.pool_free.push(i);
        } else if buf.capacity() == self.registered_buffer_size
            && buf.fixed_index().is_none()
            && self.spares.len() < self.spares_max
        {
            buf.set_len(buf.capacity());
            self.spares.push(buf);
        }
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        // The kernel may still write into in-flight buffers: wait for all of them.
        let mut out = Vec::with_capacity(self.in_flight);
        while self.in_flight > 0 {
            if self.rejected_slots.is_empty() {
                if let Err(e) = self.ring.submit_and_wait(1) {
                    if !is_transient(&e) {
                        // We cannot tell when the kernel is done: leak rather than free.
                        for op in self.slots.iter_mut().filter_map(Option::take) {
                            std::mem::forget(op.buf);
                        }
                        return;
                    }
                }
                self.unsubmitted = self.ring.submission().len();
            }
            self.reap(&mut out);
            out.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::run_all;

    const S: u64 = SECTOR_SIZE as u64;

    /// A disk-backed directory for test files: `$PFS_TEST_DEV_DIR`, else `target/test-dev`
    /// of the workspace (`/tmp` may be tmpfs, where old kernels refuse `O_DIRECT`).
    fn test_path(name: &str) -> PathBuf {
        let dir = std::env::var_os("PFS_TEST_DEV_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-dev"));
        std::fs::create_dir_all(&dir).expect("create test dir");
        let path = dir.join(format!("{name}-{}.img", std::process::id()));
        let _ = std::fs::remove_file(&path);
        path
    }

    fn open(path: &Path, size: u64, queue_depth: usize, pooled: usize) -> UringDevice {
        let opts = UringOptions {
            queue_depth,
            registered_buffers: pooled,
            registered_buffer_size: 64 * 1024,
            spare_buffers: 4,
            size_bytes: Some(size),
            preallocate: true,
            submit_below: SUBMIT_BELOW,
        };
        UringDevice::open(path, opts)
            .unwrap_or_else(|e| panic!("{e} (set PFS_TEST_DEV_DIR to a disk-backed directory)"))
    }

    fn req(kind: IoKind, offset: u64, buf: AlignedBuf) -> IoRequest {
        IoRequest { tag: 0, kind, offset, buf }
    }

    fn fill(buf: &mut AlignedBuf, seed: u8) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = seed.wrapping_add((i / 512) as u8);
        }
    }

    /// Whether descriptor `fd` polls readable within `timeout_ms`.
    fn readable(fd: std::os::fd::RawFd, timeout_ms: i32) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut p, 1, timeout_ms) == 1 }
    }

    fn expect_ok(done: &[IoCompletion]) {
        for c in done {
            assert_eq!(c.result, Ok(()), "{:?} at {}", c.kind, c.offset);
        }
    }

    #[test]
    fn a_sleeping_poller_wakes_for_a_completion() {
        let path = test_path("completion-fd");
        let mut dev = open(&path, 1 << 20, 8, 2);
        let fd = dev.completion_fd().expect("a ring has a descriptor");
        let readable = |timeout_ms| readable(fd, timeout_ms);
        assert!(!readable(0), "nothing finished yet");
        for round in 0..4u8 {
            let mut buf = dev.alloc_buf(64 * 1024);
            fill(&mut buf, round);
            dev.submit(req(IoKind::Write, 0, buf)).unwrap();
            dev.submit(req(IoKind::Sync, 0, AlignedBuf::zeroed(0))).unwrap();
            let mut out = Vec::new();
            dev.poll(&mut out); // hands both to the kernel
            while out.len() < 2 {
                // Sleeps in the kernel until a completion, never on a timer.
                assert!(readable(10_000), "round {round}: no wake-up for a completion");
                dev.poll(&mut out);
            }
            expect_ok(&out);
            assert!(!readable(0), "round {round}: collected, so not readable");
            for c in out {
                dev.free_buf(c.buf);
            }
        }
        std::fs::remove_file(&path).unwrap();
    }

    /// `submit_below`: while fewer requests than it are with the kernel, a
    /// request goes to it as it is submitted (its completion wakes a sleeper
    /// without a `poll`); past it, and always with 0, it waits for the next
    /// `poll` or `wait`.
    #[test]
    fn requests_go_to_the_kernel_at_once_while_few_are_there() {
        let path = test_path("submit-below");
        let mut dev = open(&path, 1 << 20, 8, 4);
        let fd = dev.completion_fd().expect("a ring has a descriptor");
        let readable = |timeout_ms| readable(fd, timeout_ms);
        let collect = |dev: &mut UringDevice, n: usize| {
            let mut out = Vec::new();
            dev.wait(&mut out, n);
            expect_ok(&out);
            for c in out {
                dev.free_buf(c.buf);
            }
        };
        // Below the bound: with the kernel at once.
        dev.submit_below = 2;
        let buf = dev.alloc_buf(4096);
        dev.submit(req(IoKind::Read, 0, buf)).unwrap();
        assert_eq!(dev.unsubmitted, 0);
        assert!(readable(10_000), "the read went to the kernel and finished");
        collect(&mut dev, 1);
        // Two with the kernel (finished or not, until collected): the third waits.
        for i in 0..3 {
            let buf = dev.alloc_buf(4096);
            dev.submit(req(IoKind::Read, i * 4096, buf)).unwrap();
        }
        assert_eq!(dev.unsubmitted, 1, "the third waits for the round");
        collect(&mut dev, 3);
        // 0: every request waits for the next poll or wait.
        dev.submit_below = 0;
        let buf = dev.alloc_buf(4096);
        dev.submit(req(IoKind::Read, 0, buf)).unwrap();
        assert_eq!(dev.unsubmitted, 1);
        assert!(!readable(200), "not handed to the kernel yet");
        collect(&mut dev, 1);
        assert_eq!(dev.in_flight(), 0);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn round_trip_with_pooled_and_plain_buffers() {
        let path = test_path("round-trip");
        let mut dev = open(&path, 1 << 20, 8, 2);
        assert_eq!(dev.size_bytes(), 1 << 20);
        let mut pooled = dev.alloc_buf(8192);
        assert!(pooled.fixed_index().is_some());
        assert_eq!(pooled.len(), 8192);
        fill(&mut pooled, 1);
        let mut big = dev.alloc_buf(128 * 1024);
        assert_eq!(big.fixed_index(), None, "larger than a pooled buffer");
        fill(&mut big, 2);
        let mut plain = AlignedBuf::zeroed(4096);
        fill(&mut plain, 3);
        let expect: Vec<Vec<u8>> = vec![pooled.to_vec(), big.to_vec(), plain.to_vec()];
        let writes = vec![
            req(IoKind::Write, 0, pooled),
            req(IoKind::Write, 64 * 1024, big),
            req(IoKind::Write, 512 * 1024, plain),
        ];
        let done = run_all(&mut dev, writes);
        expect_ok(&done);
        for c in done {
            dev.free_buf(c.buf);
        }
        assert_eq!(dev.pooled_buffers_free(), 2);

        // Read back each region into the other kind of buffer.
        let reads = vec![
            req(IoKind::Read, 0, AlignedBuf::zeroed(8192)),
            req(IoKind::Read, 64 * 1024, AlignedBuf::zeroed(128 * 1024)),
            req(IoKind::Read, 512 * 1024, dev.alloc_buf(4096)),
        ];
        assert!(reads[2].buf.fixed_index().is_some());
        let done = run_all(&mut dev, reads);
        expect_ok(&done);
        for (c, want) in done.iter().zip(&expect) {
            assert!(c.buf[..] == want[..], "data at {} differs", c.offset);
        }
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn pool_runs_out_then_refills() {
        let path = test_path("pool");
        let mut dev = open(&path, 1 << 20, 4, 2);
        let a = dev.alloc_buf(4096);
        let b = dev.alloc_buf(64 * 1024);
        let c = dev.alloc_buf(4096);
        assert!(a.fixed_index().is_some() && b.fixed_index().is_some());
        assert_eq!(c.fixed_index(), None, "pool exhausted");
        assert_eq!(dev.pooled_buffers_free(), 0);
        dev.free_buf(c);
        dev.free_buf(a);
        assert_eq!(dev.pooled_buffers_free(), 1);
        let d = dev.alloc_buf(12 * 1024);
        assert!(d.fixed_index().is_some());
        assert_eq!(d.len(), 12 * 1024);
        // A forged index is not taken for a pooled buffer.
        let mut forged = AlignedBuf::zeroed(4096);
        forged.set_fixed_index(b.fixed_index());
        let done = run_all(&mut dev, vec![req(IoKind::Write, 0, forged)]);
        expect_ok(&done);
        dev.free_buf(done.into_iter().next().unwrap().buf);
        assert_eq!(dev.pooled_buffers_free(), 0, "forged buffer not pooled");
        dev.free_buf(b);
        dev.free_buf(d);
        assert_eq!(dev.pooled_buffers_free(), 2);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    /// The registered buffers lie one after the other in one region (huge
    /// pages where the kernel has them), and a read into one returns the
    /// device's bytes.
    #[test]
    fn registered_buffers_share_one_region() {
        const SIZE: usize = 64 * 1024;
        let path = test_path("region");
        let mut dev = open(&path, 8 << 20, 8, 4);
        let (bytes, huge) = dev.registered_memory();
        assert!(bytes >= 4 * SIZE, "{bytes} bytes registered");
        assert!(huge.is_some(), "the region's huge pages are not reported");
        let bufs: Vec<AlignedBuf> = (0..4).map(|_| dev.alloc_buf(SIZE)).collect();
        assert!(bufs.iter().all(|b| b.fixed_index().is_some()));
        let mut addrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        addrs.sort_unstable();
        assert!(addrs.windows(2).all(|w| w[1] - w[0] == SIZE), "{addrs:x?}");
        let mut data = AlignedBuf::zeroed(SIZE);
        data.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        let want = data.to_vec();
        expect_ok(&run_all(&mut dev, vec![req(IoKind::Write, 1 << 20, data)]));
        let mut bufs = bufs.into_iter();
        let read = req(IoKind::Read, 1 << 20, bufs.next().unwrap());
        let done = run_all(&mut dev, vec![read]);
        expect_ok(&done);
        assert_eq!(&done[0].buf[..], &want[..]);
        for b in bufs.chain(done.into_iter().map(|c| c.buf)) {
            dev.free_buf(b);
        }
        assert_eq!(dev.pooled_buffers_free(), 4);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    /// With the registered buffers all lent, large buffers come back as
    /// spares and are lent again (no fresh allocation), at most
    /// `spare_buffers` of them; what is read into a spare is the device's.
    #[test]
    fn large_buffers_past_the_pool_are_kept_and_lent_again() {
        let path = test_path("spares");
        let mut dev = open(&path, 1 << 20, 8, 1);
        let held = dev.alloc_buf(4096);
        assert!(held.fixed_index().is_some());
        let bufs: Vec<AlignedBuf> = (0..5).map(|_| dev.alloc_buf(40 * 1024)).collect();
        assert!(bufs.iter().all(|b| b.fixed_index().is_none() && b.capacity() == 64 * 1024));
        let addrs: Vec<usize> = bufs.iter().map(|b| b.as_ptr() as usize).collect();
        for b in bufs {
            dev.free_buf(b);
        }
        // Four kept (`spare_buffers`), the fifth dropped; the four lent again.
        // (Spares come a huge page's worth at a time: the first of the five
        // brought the other four.)
        assert_eq!(dev.spare_buffers_kept(), 4);
        let again: Vec<AlignedBuf> = (0..4).map(|_| dev.alloc_buf(64 * 1024)).collect();
        assert_eq!(dev.spare_buffers_kept(), 0);
        assert!(again.iter().all(|b| addrs[..4].contains(&(b.as_ptr() as usize))));
        // A small one is not taken from the spares, nor kept.
        let small = dev.alloc_buf(4096);
        assert_eq!(small.capacity(), 4096);
        // Data through a reused buffer is the device's.
        let mut w = AlignedBuf::zeroed(64 * 1024);
        fill(&mut w, 9);
        let want = w.to_vec();
        expect_ok(&run_all(&mut dev, vec![req(IoKind::Write, 128 * 1024, w)]));
        let mut it = again.into_iter();
        let r = it.next().unwrap();
        let done = run_all(&mut dev, vec![req(IoKind::Read, 128 * 1024, r)]);
        expect_ok(&done);
        assert!(done[0].buf[..] == want[..]);
        for b in it.chain(done.into_iter().map(|c| c.buf)).chain([small, held]) {
            dev.free_buf(b);
        }
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn many_in_flight_with_back_pressure() {
        let path = test_path("many");
        let depth = 32;
        let mut dev = open(&path, 4 << 20, depth, 16);
        for tag in 0..depth as u64 {
            let mut buf = dev.alloc_buf(4096);
            fill(&mut buf, tag as u8);
            dev.submit(IoRequest { tag, kind: IoKind::Write, offset: tag * 2 * S, buf }).unwrap();
        }
        assert_eq!(dev.in_flight(), depth);
        let back = dev
            .submit(req(IoKind::Write, 0, AlignedBuf::zeroed(4096)))
            .expect_err("queue full hands the request back");
        assert_eq!(back.buf.len(), 4096);
        let mut out = Vec::new();
        let mut rounds = 0;
        while dev.in_flight() > 0 {
            dev.wait(&mut out, 1);
            rounds += 1;
            assert!(rounds <= depth);
        }
        assert_eq!(out.len(), depth);
        let mut tags: Vec<u64> = out.iter().map(|c| c.tag).collect();
        tags.sort_unstable();
        assert_eq!(tags, (0..depth as u64).collect::<Vec<_>>());
        expect_ok(&out);
        for c in out.drain(..) {
            dev.free_buf(c.buf);
        }
        assert_eq!(dev.pooled_buffers_free(), 16);

        let reads: Vec<IoRequest> =
            (0..depth as u64).map(|i| req(IoKind::Read, i * 2 * S, dev.alloc_buf(4096))).collect();
        let done = run_all(&mut dev, reads);
        expect_ok(&done);
        for (i, c) in done.iter().enumerate() {
            let mut want = AlignedBuf::zeroed(4096);
            fill(&mut want, i as u8);
            assert!(c.buf[..] == want[..], "sector {i}");
        }
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn sync_then_reopen_sees_the_data() {
        let path = test_path("reopen");
        let mut dev = open(&path, 256 * 1024, 4, 0);
        let mut buf = AlignedBuf::zeroed(3 * SECTOR_SIZE);
        fill(&mut buf, 9);
        let want = buf.to_vec();
        let done = run_all(
            &mut dev,
            vec![req(IoKind::Write, 5 * S, buf), req(IoKind::Sync, 0, AlignedBuf::zeroed(0))],
        );
        expect_ok(&done);
        drop(dev);

        let opts = UringOptions { size_bytes: None, ..UringOptions::default() };
        let mut dev = UringDevice::open(&path, opts).unwrap();
        assert_eq!(dev.size_bytes(), 256 * 1024, "size taken from the file");
        let done =
            run_all(&mut dev, vec![req(IoKind::Read, 5 * S, AlignedBuf::zeroed(want.len()))]);
        expect_ok(&done);
        assert!(done[0].buf[..] == want[..]);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn drop_waits_for_in_flight_writes() {
        let path = test_path("drop");
        let mut dev = open(&path, 1 << 20, 16, 8);
        for i in 0..16u64 {
            let mut buf = dev.alloc_buf(64 * 1024);
            fill(&mut buf, i as u8);
            dev.submit(IoRequest { tag: i, kind: IoKind::Write, offset: i * 64 * 1024, buf })
                .unwrap();
        }
        drop(dev);
        let data = std::fs::read(&path).unwrap();
        for i in 0..16 {
            assert_eq!(data[i * 64 * 1024], i as u8, "write {i} finished before drop returned");
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn bad_requests_fail_alone() {
        let path = test_path("bad");
        let mut dev = open(&path, 64 * 1024, 4, 0);
        let done = run_all(
            &mut dev,
            vec![
                req(IoKind::Write, 100, AlignedBuf::zeroed(4096)),
                req(IoKind::Read, 60 * 1024, AlignedBuf::zeroed(8192)),
                req(IoKind::Read, 0, AlignedBuf::zeroed(0)),
                req(IoKind::Read, 0, AlignedBuf::zeroed(4096)),
            ],
        );
        for c in &done[..3] {
            assert!(
                matches!(&c.result, Err(DeviceError::BadRequest(m)) if m.contains("bad-")),
                "{c:?}"
            );
        }
        assert_eq!(done[3].result, Ok(()));
        assert_eq!(dev.in_flight(), 0);
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn short_read_past_a_shrunk_file_is_an_error() {
        let path = test_path("short");
        let mut dev = open(&path, 64 * 1024, 4, 0);
        // Someone truncates the file under us: a read across the end comes back short,
        // the retry makes no progress, and the request fails instead of returning zeros.
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096).unwrap();
        let done = run_all(
            &mut dev,
            vec![
                req(IoKind::Read, 0, AlignedBuf::zeroed(8192)),
                req(IoKind::Read, 0, AlignedBuf::zeroed(4096)),
            ],
        );
        assert_eq!(done[0].result, Err(DeviceError::Io { offset: 4096, errno: libc::EIO }));
        assert_eq!(done[1].result, Ok(()), "other requests unaffected");
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn open_errors_name_the_path_and_the_cause() {
        let missing = test_path("missing-dir").join("nope.img");
        let opts = UringOptions { size_bytes: None, ..UringOptions::default() };
        let err = UringDevice::open(&missing, opts.clone()).unwrap_err().to_string();
        assert!(err.contains("nope.img") && err.contains("No such file"), "{err}");

        let dir = test_path("a-dir");
        std::fs::create_dir_all(&dir).unwrap();
        let err = UringDevice::open(&dir, opts.clone()).unwrap_err().to_string();
        assert!(err.contains("a-dir"), "{err}");
        std::fs::remove_dir(&dir).unwrap();

        let empty = test_path("empty");
        std::fs::write(&empty, b"").unwrap();
        let err = UringDevice::open(&empty, opts.clone()).unwrap_err().to_string();
        assert!(err.contains("empty") && err.contains("size_bytes"), "{err}");
        std::fs::remove_file(&empty).unwrap();

        let bad = UringOptions { queue_depth: 0, ..opts.clone() };
        let err = UringDevice::open(&empty, bad).unwrap_err().to_string();
        assert!(err.contains("queue_depth"), "{err}");
        let bad = UringOptions { registered_buffer_size: 1000, ..opts };
        let err = UringDevice::open(&empty, bad).unwrap_err().to_string();
        assert!(err.contains("registered_buffer_size"), "{err}");

        let msg = no_direct_io(Path::new("/mnt/x.img"), "open").to_string();
        assert!(msg.contains("/mnt/x.img") && msg.contains("does not support O_DIRECT"), "{msg}");
    }

    #[test]
    fn tmpfs_works_or_fails_clearly() {
        // Linux >= 6.6 supports O_DIRECT on tmpfs; older kernels refuse it.
        let dir = Path::new("/dev/shm");
        if !dir.is_dir() {
            return;
        }
        let path = dir.join(format!("pfs-uring-test-{}.img", std::process::id()));
        let opts = UringOptions { size_bytes: Some(64 * 1024), ..UringOptions::default() };
        match UringDevice::open(&path, opts) {
            Ok(mut dev) => {
                let done = run_all(&mut dev, vec![req(IoKind::Read, 0, AlignedBuf::zeroed(4096))]);
                expect_ok(&done);
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("O_DIRECT") && msg.contains("pfs-uring-test"), "{msg}");
            }
        }
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn preallocate_allocates_and_sparse_does_not() {
        use std::os::unix::fs::MetadataExt;
        const SIZE: u64 = 8 << 20;
        let allocated = |path: &Path| std::fs::metadata(path).unwrap().blocks() * 512;
        let full = test_path("prealloc");
        let dev = open(&full, SIZE, 4, 0);
        assert_eq!(dev.size_bytes(), SIZE);
        assert!(allocated(&full) >= SIZE, "fallocate left {} bytes", allocated(&full));
        drop(dev);

        let sparse = test_path("sparse");
        let opts =
            UringOptions { size_bytes: Some(SIZE), preallocate: false, ..UringOptions::default() };
        let mut dev = UringDevice::open(&sparse, opts).unwrap();
        assert_eq!(dev.size_bytes(), SIZE);
        assert_eq!(std::fs::metadata(&sparse).unwrap().len(), SIZE);
        assert!(allocated(&sparse) < SIZE / 4, "sparse file holds {} bytes", allocated(&sparse));
        // Writing anywhere allocates only what was written, and reads back.
        let mut buf = AlignedBuf::zeroed(4096);
        fill(&mut buf, 7);
        let want = buf.to_vec();
        expect_ok(&run_all(&mut dev, vec![req(IoKind::Write, SIZE - 4096, buf)]));
        let done =
            run_all(&mut dev, vec![req(IoKind::Read, SIZE - 4096, AlignedBuf::zeroed(4096))]);
        expect_ok(&done);
        assert_eq!(done[0].buf.to_vec(), want);
        assert!(allocated(&sparse) < SIZE / 4);
        drop(dev);
        let _ = std::fs::remove_file(&full);
        let _ = std::fs::remove_file(&sparse);
    }
}
