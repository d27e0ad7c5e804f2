//! Thin, safe wrappers over epoll and eventfd (level-triggered), and a parking wait.
//!
//! Level-triggered epoll keeps bounded loops correct: a loop that stops before it
//! has drained a socket is woken again by the next wait.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::fdguard::FdGuard;

/// Readable (or a peer hang-up).
pub const READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
/// Writable.
pub const WRITE: u32 = libc::EPOLLOUT as u32;

/// One epoll instance; its fd is itself pollable, so instances nest.
#[derive(Debug)]
pub struct Epoll {
    _guard: FdGuard,
    fd: OwnedFd,
}

impl Epoll {
    /// A new epoll instance.
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        Ok(Epoll { _guard: FdGuard::new(fd), fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` lives across the call; epoll copies it.
        let rc = unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for `events`, reported with `token`.
    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Changes the events watched on `fd`.
    pub fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    /// Stops watching `fd`.
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Ready tokens, without blocking, into `out` (cleared first, at most its capacity).
    pub fn ready(&self, out: &mut Vec<libc::epoll_event>) -> io::Result<()> {
        out.clear();
        let cap = out.capacity().min(i32::MAX as usize);
        assert!(cap > 0, "event buffer needs capacity");
        // SAFETY: the kernel writes at most `cap` events into spare capacity.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), out.as_mut_ptr(), cap as i32, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted { Ok(()) } else { Err(e) };
        }
        // SAFETY: the kernel initialised the first `n` events.
        unsafe { out.set_len(n as usize) };
        Ok(())
    }

    /// The pollable fd.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An eventfd: a counter one side bumps to wake the other.
#[derive(Debug)]
pub struct EventFd {
    _guard: FdGuard,
    fd: OwnedFd,
}

impl EventFd {
    /// A new non-blocking eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptor.
        Ok(EventFd { _guard: FdGuard::new(fd), fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Wraps a received eventfd descriptor.
    pub(crate) fn from_owned(fd: OwnedFd) -> EventFd {
        EventFd { _guard: FdGuard::new(fd.as_raw_fd()), fd }
    }

    /// Wakes whoever waits on it.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN) is still a
        // pending wake-up, so the result does not matter.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears pending wake-ups without blocking.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64; EAGAIN means nothing pending.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The descriptor.
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The descriptor, to send to the peer.
    pub(crate) fn owned(&self) -> &OwnedFd {
        &self.fd
    }
}

/// Blocks until `fd` is readable or `timeout` passes; `true` if it became readable.
///
/// This is the parking call of an idle worker or a blocking `call`: give it a
/// [`wait_fd`](crate::QueuePair::wait_fd) after [`prepare_wait`](crate::QueuePair::prepare_wait).
pub fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = match timeout {
        None => -1,
        // Round up so a short timeout does not become a busy poll.
        Some(t) => t.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32,
    };
    // SAFETY: one live pollfd.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(n > 0)
}

/// Fills `buf` with random bytes from the kernel.
pub(crate) fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes into the unfilled tail of `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
            continue;
        }
        done += n as usize;
    }
    Ok(())
}
