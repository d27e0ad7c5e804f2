//! The process's file size limit (`RLIMIT_FSIZE`, `ulimit -f`), which the
//! kernel enforces on every write, truncate and `fallocate` of a file, the
//! mount's too: a write that starts at or past it fails with `EFBIG` and
//! `SIGXFSZ`, one that crosses it is cut short there, and a truncate or
//! `fallocate` that would grow a file past it fails the same way. The limit
//! is read once and again after each `setrlimit`/`prlimit` of it through the
//! library (a `prlimit` from another process is not seen).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::client::{raise_when_done, Res};

/// Not read yet. (A limit this large is no limit: 16 EiB.)
const UNKNOWN: u64 = u64::MAX - 1;

static LIMIT: AtomicU64 = AtomicU64::new(UNKNOWN);

/// The limit in bytes (`u64::MAX`: none).
fn limit() -> u64 {
    match LIMIT.load(Ordering::Relaxed) {
        UNKNOWN => refresh(),
        l => l,
    }
}

/// Reads the limit again (after the program changed it).
pub fn refresh() -> u64 {
    let mut r = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: fills `r`.
    let l = if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut r) } == 0 {
        r.rlim_cur
    } else {
        libc::RLIM_INFINITY
    };
    let l = if l == libc::RLIM_INFINITY { u64::MAX } else { l.min(UNKNOWN - 1) };
    LIMIT.store(l, Ordering::Relaxed);
    l
}

/// Whether a limit is set: only then does an append or a truncate need the
/// file's size.
pub fn limited() -> bool {
    limit() != u64::MAX
}

/// Past the limit: `SIGXFSZ` for the calling thread, `EFBIG` for the call.
fn exceeded() -> libc::c_int {
    raise_when_done(libc::SIGXFSZ);
    libc::EFBIG
}

/// How many of `len` bytes a write at `pos` may write under `limit` (the
/// kernel's `generic_write_check_limits`); `None` when it starts at or past it.
fn write_len_under(limit: u64, pos: u64, len: usize) -> Option<usize> {
    if len == 0 || limit == u64::MAX {
        return Some(len);
    }
    if pos >= limit {
        return None;
    }
    Some(len.min(usize::try_from(limit - pos).unwrap_or(usize::MAX)))
}

/// How many of `len` bytes a write at `pos` may write; past the limit,
/// `EFBIG` (and `SIGXFSZ`).
pub fn write_len(pos: u64, len: usize) -> Res<usize> {
    write_len_under(limit(), pos, len).ok_or_else(exceeded)
}

/// A truncate or `fallocate` that makes a file of `size` bytes `new` bytes
/// long: past the limit while growing, `EFBIG` (and `SIGXFSZ`); `size` is
/// asked for only then.
pub fn grow(new: u64, size: impl FnOnce() -> Res<u64>) -> Res<()> {
    if new <= limit() || size()? >= new {
        return Ok(());
    }
    Err(exceeded())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_stop_at_the_limit_as_the_kernels_do() {
        // Unlimited, and empty writes anywhere.
        assert_eq!(write_len_under(u64::MAX, u64::MAX - 10, 4096), Some(4096));
        assert_eq!(write_len_under(100, 500, 0), Some(0));
        // Below, across and at the limit.
        assert_eq!(write_len_under(100_000, 0, 4096), Some(4096));
        assert_eq!(write_len_under(100_000, 99_998, 4), Some(2));
        assert_eq!(write_len_under(100_000, 100_000, 4), None);
        assert_eq!(write_len_under(0, 0, 1), None);
    }
}
