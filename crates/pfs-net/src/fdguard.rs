//! The descriptors pfs-net keeps open for its links (sockets, eventfds, epoll
//! instances), so that a library loaded into someone else's program
//! (libpfs_preload) can keep that program from closing them or putting
//! another file at their number: a program that closes every descriptor it
//! did not open, as daemons do, would otherwise cut the library's links, and
//! a later file of the program could take a number the library still writes
//! to.
//!
//! A fixed bitmap of descriptor numbers below [`GUARDED_MAX`], lock-free: a
//! descriptor is guarded from when its owner opened it until just before the
//! owner closes it ([`FdGuard`], declared before the descriptor it guards so
//! it drops first). Numbers at or past the limit are not guarded.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

/// Descriptor numbers below this are guarded; past it, not.
pub const GUARDED_MAX: usize = 1 << 16;

static BITS: [AtomicU64; GUARDED_MAX / 64] = [const { AtomicU64::new(0) }; GUARDED_MAX / 64];

fn slot(fd: RawFd) -> Option<(usize, u64)> {
    let fd = usize::try_from(fd).ok().filter(|&fd| fd < GUARDED_MAX)?;
    Some((fd / 64, 1 << (fd % 64)))
}

/// Marks `fd` as one of pfs-net's own.
pub fn guard(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        BITS[w].fetch_or(bit, Ordering::AcqRel);
    }
}

/// Unmarks `fd` (its owner is about to close it).
pub fn unguard(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        BITS[w].fetch_and(!bit, Ordering::AcqRel);
    }
}

/// Whether `fd` is one of pfs-net's own, open.
pub fn is_guarded(fd: RawFd) -> bool {
    slot(fd).is_some_and(|(w, bit)| BITS[w].load(Ordering::Acquire) & bit != 0)
}

/// The guarded descriptors in `first..=last`, in order.
pub fn guarded_in(first: u32, last: u32) -> Vec<RawFd> {
    let last = (last as usize).min(GUARDED_MAX - 1);
    let mut out = Vec::new();
    let mut fd = first as usize;
    while fd <= last {
        let word = BITS[fd / 64].load(Ordering::Acquire) >> (fd % 64);
        if word == 0 {
            fd = (fd / 64 + 1) * 64;
            continue;
        }
        let at = fd + word.trailing_zeros() as usize;
        if at <= last {
            out.push(at as RawFd);
        }
        fd = at + 1;
    }
    out
}

/// Guards a descriptor while it lives: declare it before the field that owns
/// the descriptor, so it is unguarded just before the descriptor closes.
#[derive(Debug)]
pub struct FdGuard(RawFd);

impl FdGuard {
    /// Guards `fd`.
    pub fn new(fd: RawFd) -> FdGuard {
        guard(fd);
        FdGuard(fd)
    }
}

impl Drop for FdGuard {
    fn drop(&mut self) {
        unguard(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_are_set_found_in_ranges_and_dropped() {
        // Numbers no real descriptor of this test process has.
        let (a, b, c) = (60_001, 60_064, 60_200);
        let ga = FdGuard::new(a);
        let gb = FdGuard::new(b);
        guard(c);
        assert!(is_guarded(a) && is_guarded(b) && is_guarded(c));
        assert!(!is_guarded(60_002) && !is_guarded(-1) && !is_guarded(GUARDED_MAX as RawFd));
        assert_eq!(guarded_in(60_000, 60_300), [a, b, c]);
        assert_eq!(guarded_in(60_002, 60_199), [b]);
        assert_eq!(guarded_in(60_065, u32::MAX), [c]);
        drop(gb);
        unguard(c);
        assert_eq!(guarded_in(60_000, 60_300), [a]);
        drop(ga);
        assert!(guarded_in(60_000, 60_300).is_empty());
        guard(GUARDED_MAX as RawFd);
        assert!(!is_guarded(GUARDED_MAX as RawFd), "past the limit: not guarded");
    }
}
