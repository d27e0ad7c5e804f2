//! Shared-memory pipe: two single-producer single-consumer byte rings in one memfd,
//! eventfd wake-ups, and a unix socket kept open to notice a peer that dies.
//!
//! The client makes the memfd and both eventfds and passes them to the server with
//! `SCM_RIGHTS`. Each ring carries the same byte stream a TCP socket would, so the
//! queue pair above does not know which one it drives. Layout: `docs/format.md`.
//!
//! Parking: a consumer about to sleep sets `consumer_parked` and re-checks the ring;
//! a producer that sees the flag after publishing clears it and rings the eventfd
//! (and the same for a producer waiting for room). Nobody calls into the kernel
//! while both sides are busy.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::poller::EventFd;

/// Bytes before the first ring: the control page.
pub const SHM_CONTROL_BYTES: usize = 4096;
/// Magic at [`SHM_MAGIC_OFFSET`]: `"PFSSHM01"`.
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"PFSSHM01");
/// Offset of the magic in the control page; the ring size (`u32`) follows it.
pub const SHM_MAGIC_OFFSET: usize = 1024;
/// Default bytes in each ring: a 1 MiB read's reply fits four times (docs/benchmarks.md,
/// "Shared-memory rings that hold a reply").
pub const DEFAULT_RING_BYTES: u32 = 4 << 20;
/// Offset of the inline key in the control page (`u64`, 0: none), written by a
/// server whose worker serves inline ([`crate::inline`]); the server's process
/// id (`u32`) follows it.
pub const SHM_INLINE_OFFSET: usize = SHM_MAGIC_OFFSET + 16;
/// Smallest ring.
pub const MIN_RING_BYTES: u32 = 4 << 10;
/// Largest ring.
pub const MAX_RING_BYTES: u32 = 64 << 20;
/// Control block of ring `i` (0: client to server, 1: server to client) is at
/// `i * RING_CONTROL_STRIDE`.
const RING_CONTROL_STRIDE: usize = 256;
// Offsets inside a ring's control block, each on its own cache line.
const TAIL: usize = 0;
const HEAD: usize = 64;
const CONSUMER_PARKED: usize = 128;
const PRODUCER_WAITING: usize = 132;
const PRODUCER_CLOSED: usize = 192;
/// Empty reads between two checks of the unix socket for a dead peer.
const ALIVE_CHECK_EVERY: u32 = 1024;
/// Parks between two such checks. A parked reader wakes at least every few
/// milliseconds (its wait slice), so a dead peer is still noticed within tens
/// of them; checking at every park cost a system call per request.
const ALIVE_CHECK_PARKS: u32 = 16;

/// Which end of the pipe this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Client,
    Server,
}

/// A mapping of the shared file.
#[derive(Debug)]
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from a successful mmap that nothing else unmaps.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// One ring seen from one side: its control block and data area.
#[derive(Debug, Clone, Copy)]
struct Ring {
    control: *mut u8,
    data: *mut u8,
    bytes: u64,
}

impl Ring {
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: the control block lies in the live mapping, 8-byte aligned.
        unsafe { &*(self.control.add(off) as *const AtomicU64) }
    }
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, 4-byte aligned.
        unsafe { &*(self.control.add(off) as *const AtomicU32) }
    }
    /// Bytes between head and tail, or `None` if the peer corrupted them.
    fn used(&self) -> Option<u64> {
        let used = self
            .u64_at(TAIL)
            .load(Ordering::Acquire)
            .wrapping_sub(self.u64_at(HEAD).load(Ordering::Acquire));
        (used <= self.bytes).then_some(used)
    }
}

/// One end of a shared-memory pipe.
#[derive(Debug)]
pub(crate) struct ShmPipe {
    _map: Mapping,
    tx: Ring,
    rx: Ring,
    /// Rung by the peer to wake this side.
    mine: EventFd,
    /// Rung by this side to wake the peer.
    theirs: EventFd,
    _sock_guard: crate::fdguard::FdGuard,
    sock: UnixStream,
    empty_reads: u32,
    /// Parks since the last check for a dead peer.
    parks: u32,
    peer_gone: bool,
}

// SAFETY: the raw pointers point into a mapping this value owns; the rings are
// single-producer single-consumer and each side's role is fixed.
unsafe impl Send for ShmPipe {}

/// Ring size check shared by both sides.
pub(crate) fn check_ring_bytes(ring_bytes: u32) -> Result<(), String> {
    if !ring_bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes) {
        return Err(format!(
            "shm ring of {ring_bytes} bytes, expected a power of two in \
             {MIN_RING_BYTES}..={MAX_RING_BYTES}"
        ));
    }
    Ok(())
}

fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
    // SAFETY: maps `len` bytes of a file we hold; checked for failure below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Mapping { ptr: ptr.cast(), len })
}

impl ShmPipe {
    /// The client's end: a new memfd and eventfds, and the fds to send to the server
    /// (memfd, client eventfd, server eventfd).
    pub(crate) fn create(sock: UnixStream, ring_bytes: u32) -> io::Result<(ShmPipe, [OwnedFd; 3])> {
        check_ring_bytes(ring_bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let len = SHM_CONTROL_BYTES + 2 * ring_bytes as usize;
        // SAFETY: plain syscall with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"pfs-net-shm".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizes the file we own.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let m = map(&memfd, len)?;
        // SAFETY: the magic and size lie inside the fresh (zeroed) mapping.
        unsafe {
            (m.ptr.add(SHM_MAGIC_OFFSET) as *mut u64).write(SHM_MAGIC);
            (m.ptr.add(SHM_MAGIC_OFFSET + 8) as *mut u32).write(ring_bytes);
        }
        let (client_efd, server_efd) = (EventFd::new()?, EventFd::new()?);
        let fds = [memfd, client_efd.owned().try_clone()?, server_efd.owned().try_clone()?];
        let pipe = ShmPipe::new(m, ring_bytes, Side::Client, client_efd, server_efd, sock)?;
        Ok((pipe, fds))
    }

    /// The server's end, from the fds the client sent; refuses a file whose size or
    /// header does not match `ring_bytes`.
    pub(crate) fn attach(
        sock: UnixStream,
        ring_bytes: u32,
        fds: [OwnedFd; 3],
    ) -> Result<ShmPipe, String> {
        check_ring_bytes(ring_bytes)?;
        let [memfd, client_efd, server_efd] = fds;
        let len = SHM_CONTROL_BYTES + 2 * ring_bytes as usize;
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out-pointer.
        if unsafe { libc::fstat(memfd.as_raw_fd(), &mut st) } < 0 {
            return Err(format!("shm file: fstat: {}", io::Error::last_os_error()));
        }
        if st.st_size as u64 != len as u64 {
            return Err(format!("shm file is {} bytes, expected {len}", st.st_size));
        }
        let m = map(&memfd, len).map_err(|e| format!("shm file: mmap: {e}"))?;
        // SAFETY: inside the mapping.
        let (magic, rb) = unsafe {
            (
                (m.ptr.add(SHM_MAGIC_OFFSET) as *const u64).read_volatile(),
                (m.ptr.add(SHM_MAGIC_OFFSET + 8) as *const u32).read_volatile(),
            )
        };
        if magic != SHM_MAGIC || rb != ring_bytes {
            return Err(format!("shm file header: magic 0x{magic:016x}, ring bytes {rb}"));
        }
        for fd in [&client_efd, &server_efd] {
            check_eventfd(fd)?;
        }
        let (mine, theirs) = (EventFd::from_owned(server_efd), EventFd::from_owned(client_efd));
        ShmPipe::new(m, ring_bytes, Side::Server, mine, theirs, sock).map_err(|e| e.to_string())
    }

    fn new(
        m: Mapping,
        ring_bytes: u32,
        side: Side,
        mine: EventFd,
        theirs: EventFd,
        sock: UnixStream,
    ) -> io::Result<ShmPipe> {
        // The socket is only peeked with MSG_DONTWAIT, so its blocking mode is left alone.
        let ring = |i: usize| Ring {
            // SAFETY: both offsets lie inside the mapping of `len` bytes.
            control: unsafe { m.ptr.add(i * RING_CONTROL_STRIDE) },
            data: unsafe { m.ptr.add(SHM_CONTROL_BYTES + i * ring_bytes as usize) },
            bytes: ring_bytes.into(),
        };
        let (tx, rx) = match side {
            Side::Client => (ring(0), ring(1)),
            Side::Server => (ring(1), ring(0)),
        };
        Ok(ShmPipe {
            _map: m,
            tx,
            rx,
            mine,
            theirs,
            _sock_guard: crate::fdguard::FdGuard::new(sock.as_raw_fd()),
            sock,
            empty_reads: 0,
            parks: 0,
            peer_gone: false,
        })
    }

    /// Descriptors to watch for readiness: this side's eventfd and the socket.
    pub(crate) fn fds(&self) -> [RawFd; 2] {
        [self.mine.raw(), self.sock.as_raw_fd()]
    }

    /// Copies as much of `bufs` as fits into the tx ring; 0 when full (the peer will
    /// wake this side when it makes room).
    pub(crate) fn write(&mut self, bufs: &[&[u8]]) -> io::Result<usize> {
        let mut written = 0;
        for attempt in 0..2 {
            let used = self.tx.used().ok_or_else(corrupt)?;
            let mut free = self.tx.bytes - used;
            if free == 0 {
                if attempt == 0 {
                    self.tx.u32_at(PRODUCER_WAITING).store(1, Ordering::SeqCst);
                    fence(Ordering::SeqCst);
                    continue;
                }
                break;
            }
            let mut tail = self.tx.u64_at(TAIL).load(Ordering::Relaxed);
            let mut skip = written;
            for b in bufs {
                if skip >= b.len() {
                    skip -= b.len();
                    continue;
                }
                let src = &b[skip..];
                skip = 0;
                let n = (src.len() as u64).min(free) as usize;
                copy_in(&self.tx, tail, &src[..n]);
                tail += n as u64;
                free -= n as u64;
                written += n;
                if free == 0 {
                    break;
                }
            }
            self.tx.u64_at(TAIL).store(tail, Ordering::Release);
            break;
        }
        if written > 0 {
            fence(Ordering::SeqCst);
            if self.tx.u32_at(CONSUMER_PARKED).swap(0, Ordering::SeqCst) != 0 {
                self.theirs.notify();
            }
        }
        Ok(written)
    }

    /// Copies waiting bytes into `dst`: `Ok(0)` at end of stream (the peer closed or
    /// died), `WouldBlock` when empty.
    pub(crate) fn read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let (ptr, max) = (dst.as_mut_ptr(), dst.len());
        // SAFETY: `take` writes at most `max` bytes at `ptr`, inside `dst`.
        self.take(max, |ring, head, n| unsafe { copy_out_raw(ring, head, ptr, n) })
    }

    /// Appends waiting bytes to `dst` until it holds `len` bytes at most, into
    /// its spare capacity (no zeroing first: a large frame is copied once);
    /// `Ok(0)` at end of stream or when `dst` already holds `len`, `WouldBlock`
    /// when empty.
    pub(crate) fn read_append(&mut self, dst: &mut Vec<u8>, len: usize) -> io::Result<usize> {
        let have = dst.len();
        let max = len.saturating_sub(have);
        if max == 0 {
            return Ok(0);
        }
        dst.reserve(max);
        let ptr = dst.spare_capacity_mut().as_mut_ptr().cast::<u8>();
        // SAFETY: `take` writes at most `max` bytes at `ptr`, inside the spare
        // capacity reserved above.
        let n = self.take(max, |ring, head, n| unsafe { copy_out_raw(ring, head, ptr, n) })?;
        // SAFETY: the first `n` bytes of the spare capacity were just written.
        unsafe { dst.set_len(have + n) };
        Ok(n)
    }

    /// Takes up to `max` waiting bytes, handing `copy` the ring, the position
    /// of the first and their count.
    fn take(&mut self, max: usize, copy: impl FnOnce(&Ring, u64, usize)) -> io::Result<usize> {
        let used = self.rx.used().ok_or_else(corrupt)?;
        if used == 0 {
            if self.rx.u32_at(PRODUCER_CLOSED).load(Ordering::Acquire) != 0 || self.peer_gone {
                return Ok(0);
            }
            self.empty_reads += 1;
            if self.empty_reads >= ALIVE_CHECK_EVERY {
                self.empty_reads = 0;
                self.check_alive();
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = used.min(max as u64) as usize;
        let head = self.rx.u64_at(HEAD).load(Ordering::Relaxed);
        copy(&self.rx, head, n);
        self.rx.u64_at(HEAD).store(head + n as u64, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.rx.u32_at(PRODUCER_WAITING).swap(0, Ordering::SeqCst) != 0 {
            self.theirs.notify();
        }
        Ok(n)
    }

    /// Copies the first `dst.len()` bytes waiting in the ring into `dst` without
    /// taking them; `false` (and `dst` unchanged) if fewer are waiting.
    pub(crate) fn peek(&self, dst: &mut [u8]) -> io::Result<bool> {
        let used = self.rx.used().ok_or_else(corrupt)?;
        if used < dst.len() as u64 {
            return Ok(false);
        }
        let head = self.rx.u64_at(HEAD).load(Ordering::Relaxed);
        copy_out(&self.rx, head, dst);
        Ok(true)
    }

    /// Bytes the tx ring has room for now (the peer only frees more).
    pub(crate) fn tx_free(&self) -> usize {
        self.tx.used().map_or(0, |used| (self.tx.bytes - used) as usize)
    }

    /// Whether the tx ring has room for at least one byte.
    pub(crate) fn tx_room(&self) -> bool {
        self.tx.used().is_some_and(|used| used < self.tx.bytes)
    }

    /// Arms the wake-up; `false` if bytes are already waiting (or the peer is gone).
    pub(crate) fn prepare_wait(&mut self) -> bool {
        // Drain first so the eventfd is readable only for wake-ups after this point.
        self.mine.drain();
        self.rx.u32_at(CONSUMER_PARKED).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.parks += 1;
        if self.parks >= ALIVE_CHECK_PARKS {
            self.parks = 0;
            self.check_alive();
        }
        !(self.peer_gone || self.rx.used() != Some(0))
    }

    /// Stops the peer from ringing this side for bytes it sends (the caller
    /// polls instead), until the next [`prepare_wait`](Self::prepare_wait).
    pub(crate) fn cancel_wait(&mut self) {
        self.rx.u32_at(CONSUMER_PARKED).store(0, Ordering::SeqCst);
    }

    fn inline_cells(&self) -> (&AtomicU64, &AtomicU32) {
        // SAFETY: both lie in the control page of the live mapping, aligned.
        unsafe {
            let base = self._map.ptr.add(SHM_INLINE_OFFSET);
            (&*(base as *const AtomicU64), &*(base.add(8) as *const AtomicU32))
        }
    }

    /// On the server: tells a client in this process which worker it may run
    /// inline ([`crate::inline`]).
    pub(crate) fn set_inline_key(&self, key: u64) {
        let (k, pid) = self.inline_cells();
        pid.store(crate::inline::this_process(), Ordering::Relaxed);
        k.store(key, Ordering::Release);
    }

    /// On the client: the inline key the server wrote, if it runs in this process.
    pub(crate) fn inline_key(&self) -> Option<u64> {
        let (k, pid) = self.inline_cells();
        let key = k.load(Ordering::Acquire);
        (key != 0 && pid.load(Ordering::Relaxed) == crate::inline::this_process()).then_some(key)
    }

    /// Notices a dead peer: its end of the unix socket closed (a read then
    /// finds the end of the stream). Also done every `ALIVE_CHECK_EVERY`
    /// empty reads.
    pub(crate) fn check_alive(&mut self) {
        let mut b = 0u8;
        // SAFETY: peeks one byte into a live buffer without blocking.
        let n = unsafe {
            libc::recv(
                self.sock.as_raw_fd(),
                (&mut b as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            self.peer_gone = true;
        }
    }
}

impl Drop for ShmPipe {
    fn drop(&mut self) {
        self.tx.u32_at(PRODUCER_CLOSED).store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        self.theirs.notify();
    }
}

fn corrupt() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "shm ring corrupt: head and tail are more than a ring apart",
    )
}

fn copy_in(r: &Ring, pos: u64, src: &[u8]) {
    let at = (pos % r.bytes) as usize;
    let first = src.len().min(r.bytes as usize - at);
    // SAFETY: both pieces lie inside the ring's data area; only the producer writes
    // the free part of the ring.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), r.data.add(at), first);
        std::ptr::copy_nonoverlapping(src.as_ptr().add(first), r.data, src.len() - first);
    }
}

fn copy_out(r: &Ring, pos: u64, dst: &mut [u8]) {
    // SAFETY: `dst` holds `dst.len()` writable bytes.
    unsafe { copy_out_raw(r, pos, dst.as_mut_ptr(), dst.len()) }
}

/// Copies `len` bytes from ring position `pos` to `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes, not overlapping the ring, and
/// the `len` bytes at `pos` published by the producer.
unsafe fn copy_out_raw(r: &Ring, pos: u64, dst: *mut u8, len: usize) {
    let at = (pos % r.bytes) as usize;
    let first = len.min(r.bytes as usize - at);
    // SAFETY: both pieces lie inside the ring's data area and were published by the
    // producer (the Acquire load of the tail in `used`); the caller vouches for `dst`.
    unsafe {
        std::ptr::copy_nonoverlapping(r.data.add(at), dst, first);
        std::ptr::copy_nonoverlapping(r.data, dst.add(first), len - first);
    }
}

/// Refuses a descriptor that is not an eventfd (a hostile client could pass a pipe
/// or a file whose writes would block or hit the disk).
fn check_eventfd(fd: &OwnedFd) -> Result<(), String> {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| format!("shm eventfd: {e}"))?;
    if link.to_string_lossy() != "anon_inode:[eventfd]" {
        return Err(format!("shm wake-up fd is {}, not an eventfd", link.display()));
    }
    // SAFETY: sets O_NONBLOCK on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    Ok(())
}

/// Sends `bytes` and three descriptors in one message.
pub(crate) fn send_with_fds(sock: &UnixStream, bytes: &[u8], fds: &[OwnedFd; 3]) -> io::Result<()> {
    let raw: [RawFd; 3] = [fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()];
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
    // SAFETY: msghdr points at live locals; CMSG macros stay inside `cbuf` (64 bytes,
    // more than CMSG_SPACE of three fds).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of_val(&raw) as u32) as usize;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(&raw) as u32) as usize;
        std::ptr::copy_nonoverlapping(raw.as_ptr(), libc::CMSG_DATA(c) as *mut RawFd, 3);
        let n = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != bytes.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short sendmsg"));
        }
    }
    Ok(())
}

/// Receives bytes without blocking, keeping descriptors that come with them
/// (at most 3 are kept; more close at once).
pub(crate) fn recv_with_fds(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr points at live locals; the kernel fills at most `cbuf`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n =
            libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let count =
                    ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    // Owning every received fd closes the extras when dropped.
                    let fd = OwnedFd::from_raw_fd(data.add(i).read_unaligned());
                    if fds.len() < 3 {
                        fds.push(fd);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok(n as usize)
    }
}
