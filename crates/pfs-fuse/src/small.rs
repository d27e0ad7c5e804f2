//! Small files' bytes that came with their lookup, kept for the read that
//! follows it.
//!
//! Reading a small file through the mount is `LOOKUP`, `OPEN`, `READ`,
//! `RELEASE`; `OPEN` and a read-only `RELEASE` send nothing to the servers, so
//! it costs two requests. A lookup can carry the file's bytes when its server
//! holds them in memory and they fit a page (`FileSystem::lookup_data`), and the
//! `READ` then answers from them: one request per file (md-hard's read phase,
//! `tar` and `cp -r` of small files).
//!
//! The bytes are used only by the open that the lookup was part of: an
//! `OPEN` from the same process (thread) within [`OPEN_WITHIN`] of the lookup's
//! reply, with no change to any file's data through this mount since the
//! lookup was sent (a write, truncate or fallocate), arms them for that
//! handle's first read. An `open(2)` whose path walk made the lookup sees bytes
//! fetched after it began, so close-to-open holds as it does for a read sent to
//! the server: another client's close before this open is in them. Bytes a
//! `stat` brought are not used by a later open (beyond the window), which
//! reads from the server. Each is used once.
//!
//! Asking costs a copy of up to a page in the reply, worth it only when the
//! reads follow: a `stat` phase never reads. So the mount stops asking once
//! fewer than half of the last lookups' bytes were read (judged after
//! [`LEARN`] of them), then asks with one lookup in [`PROBE_EVERY`] only, and
//! asks with every lookup again as soon as such a probe's bytes are read.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::oldest::OldestFirst;

/// Files whose bytes are kept at once; the oldest go first.
pub const HELD_MAX: usize = 1024;
/// While lookups' bytes go unread: ask with one lookup in this many.
pub const PROBE_EVERY: u64 = 32;
/// Lookups that brought bytes before their use decides whether to go on asking.
pub const LEARN: u32 = 16;
/// The use counts are halved once this many lookups brought bytes: the
/// decision follows the last few hundred.
const WINDOW: u32 = 256;

/// The longest an `OPEN` may come after the lookup that brought a file's bytes
/// for them to serve its first read: an `open(2)` sends its `OPEN` right after
/// its path walk's `LOOKUP`.
pub const OPEN_WITHIN: Duration = Duration::from_millis(2);

/// Bytes kept for one file.
#[derive(Debug)]
struct Held {
    data: Vec<u8>,
    /// The process (thread) whose lookup brought them.
    pid: u32,
    /// When the lookup's reply arrived.
    arrived: Instant,
    /// This mount's data changes when it was sent.
    changes: u64,
}

#[derive(Debug)]
struct Inner {
    files: OldestFirst<Held>,
    /// Bytes armed for the first read of an open handle: `(bytes, changes)`.
    armed: HashMap<u64, (Vec<u8>, u64)>,
    /// Every lookup asks (else only the probes).
    asking: bool,
    /// Lookups since the mount started, for the probes.
    lookups: u64,
    /// Lookups that brought bytes since asking started, and reads those
    /// bytes answered (halved together every `WINDOW`).
    brought: u32,
    used: u32,
    /// Since the mount started: lookups that asked, that brought bytes,
    /// opens those bytes were armed for, and reads they answered.
    asked: u64,
    brought_all: u64,
    armed_all: u64,
    served: u64,
}

/// Small files' bytes from lookups, for their next read (module docs).
#[derive(Debug)]
pub struct SmallFiles {
    inner: Mutex<Inner>,
}

impl Default for SmallFiles {
    fn default() -> SmallFiles {
        let inner = Inner {
            files: OldestFirst::new(HELD_MAX),
            armed: HashMap::new(),
            asking: true,
            lookups: 0,
            brought: 0,
            used: 0,
            asked: 0,
            brought_all: 0,
            armed_all: 0,
            served: 0,
        };
        SmallFiles { inner: Mutex::new(inner) }
    }
}

/// What a lookup should do about the file's bytes ([`SmallFiles::wanted`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Ask the server for them with the lookup.
    pub ask: bool,
    /// Go to the server for them even when the mount could answer the lookup
    /// itself (statahead, [`pfs_client::ahead`]): a probe, or the bytes lookups
    /// brought lately were read. The read that follows is then answered
    /// without a request of its own.
    pub first: bool,
}

impl SmallFiles {
    /// What the lookup about to be answered should do about the file's bytes.
    pub fn wanted(&self) -> Wanted {
        let mut g = self.inner.lock().expect("small files lock");
        g.lookups += 1;
        let probe = g.lookups % PROBE_EVERY == 0;
        Wanted { ask: g.asking || probe, first: probe || (g.asking && g.used > 0) }
    }

    /// A lookup went to the server asking for the bytes.
    pub fn asked(&self) {
        self.inner.lock().expect("small files lock").asked += 1;
    }

    /// Keeps `data`, the bytes of file `ino` that a lookup by process `pid`
    /// brought (its reply arrived now), sent when this mount's data changes
    /// were `changes`.
    pub fn keep(&self, ino: u64, data: Vec<u8>, pid: u32, changes: u64) {
        let mut g = self.inner.lock().expect("small files lock");
        g.brought += 1;
        g.brought_all += 1;
        if g.asking && g.brought >= LEARN && g.used * 2 < g.brought {
            // Mostly unread: probe from now on.
            log::debug!("small files: {} of {} lookups' bytes read: probing", g.used, g.brought);
            g.asking = false;
            (g.brought, g.used) = (0, 0);
        }
        if g.brought >= WINDOW {
            g.brought /= 2;
            g.used /= 2;
        }
        log::trace!("small files: kept {ino} for {pid} (asking {})", g.asking);
        g.files.insert(ino, Held { data, pid, arrived: Instant::now(), changes });
    }

    /// Process `pid` opened `ino` as handle `fh`: the bytes its lookup just
    /// brought (within [`OPEN_WITHIN`]) serve the handle's first read. Bytes of
    /// `ino` kept otherwise are dropped.
    pub fn opened(&self, ino: u64, pid: u32, fh: u64) {
        let mut g = self.inner.lock().expect("small files lock");
        let Some(held) = g.files.remove(ino) else { return };
        log::trace!(
            "small files: open of {ino} by {pid}, bytes from {} {:?} ago",
            held.pid,
            held.arrived.elapsed()
        );
        if held.pid == pid && held.arrived.elapsed() < OPEN_WITHIN && g.armed.len() < HELD_MAX {
            g.armed.insert(fh, (held.data, held.changes));
            g.armed_all += 1;
        }
    }

    /// The bytes armed for handle `fh`, once, if this mount's data changes are
    /// still `changes`.
    pub fn take(&self, fh: u64, changes: u64) -> Option<Vec<u8>> {
        let mut g = self.inner.lock().expect("small files lock");
        let (data, armed_at) = g.armed.remove(&fh)?;
        if armed_at != changes {
            return None;
        }
        g.used += 1;
        g.served += 1;
        if !g.asking {
            // A probe's bytes were read: reads follow lookups again.
            g.asking = true;
            (g.brought, g.used) = (1, 1);
        }
        Some(data)
    }

    /// Reads answered from lookups' bytes since the mount started.
    pub fn served(&self) -> u64 {
        self.inner.lock().expect("small files lock").served
    }

    /// What happened since the mount started, for the log: lookups that
    /// asked, that brought bytes, opens they were armed for, reads answered.
    pub fn counts(&self) -> (u64, u64, u64, u64) {
        let g = self.inner.lock().expect("small files lock");
        (g.asked, g.brought_all, g.armed_all, g.served)
    }

    /// Handle `fh` closed: bytes armed for it that no read took go.
    pub fn released(&self, fh: u64) {
        self.inner.lock().expect("small files lock").armed.remove(&fh);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_serve_the_open_right_after_the_lookup_once() {
        let s = SmallFiles::default();
        s.keep(1, b"one".to_vec(), 10, 7);
        s.opened(1, 10, 100);
        assert_eq!(s.take(100, 7), Some(b"one".to_vec()));
        assert_eq!(s.take(100, 7), None, "used once");
        // Another process's open, or a handle never armed: nothing.
        s.keep(2, b"two".to_vec(), 10, 7);
        s.opened(2, 11, 101);
        assert_eq!(s.take(101, 7), None, "another process opened it");
        s.opened(2, 10, 102);
        assert_eq!(s.take(102, 7), None, "dropped at the first open");
        // A change to data through this mount since the lookup.
        s.keep(3, b"three".to_vec(), 10, 7);
        s.opened(3, 10, 103);
        assert_eq!(s.take(103, 8), None, "this mount changed data since");
        // A release before any read drops them.
        s.keep(4, b"four".to_vec(), 10, 7);
        s.opened(4, 10, 104);
        s.released(104);
        assert_eq!(s.take(104, 7), None);
    }

    #[test]
    fn a_later_open_reads_from_the_server() {
        let s = SmallFiles::default();
        s.keep(1, b"old".to_vec(), 10, 0);
        std::thread::sleep(OPEN_WITHIN * 2);
        s.opened(1, 10, 100);
        assert_eq!(s.take(100, 0), None, "a stat's lookup, an open later");
    }

    #[test]
    fn the_oldest_go_first_past_the_limit() {
        let s = SmallFiles::default();
        for ino in 0..HELD_MAX as u64 + 10 {
            s.keep(ino, vec![ino as u8], 1, 0);
        }
        assert!(s.inner.lock().unwrap().files.len() <= HELD_MAX);
        s.opened(0, 1, 500);
        assert_eq!(s.take(500, 0), None, "the oldest went");
        let last = HELD_MAX as u64 + 9;
        s.opened(last, 1, 501);
        assert_eq!(s.take(501, 0), Some(vec![last as u8]));
    }

    #[test]
    fn asking_stops_while_the_bytes_go_unread_and_comes_back_with_reads() {
        let s = SmallFiles::default();
        // A stat phase: lookups bring bytes nobody reads.
        let mut asked = 0;
        for ino in 0..1000 {
            let w = s.wanted();
            if w.ask {
                asked += 1;
                s.keep(ino, vec![1], 1, 0);
            }
            // Before the server: only probes, none of whose bytes is read.
            assert_eq!(w.first, ino % PROBE_EVERY == PROBE_EVERY - 1, "lookup {ino}");
        }
        assert!(asked <= u64::from(LEARN) + 1000 / PROBE_EVERY, "asked {asked} of 1000");
        // A read phase: every lookup's bytes are read; the probes bring it back.
        let (mut asked, mut first) = (0, 0);
        for ino in 1000..3000 {
            let w = s.wanted();
            if w.ask {
                asked += 1;
                first += u64::from(w.first);
                s.keep(ino, vec![1], 1, 0);
                s.opened(ino, 1, ino);
                assert!(s.take(ino, 0).is_some());
            }
        }
        assert!(asked > 2000 - PROBE_EVERY, "asked {asked} of 2000 once reads came back");
        assert_eq!(first, asked, "and before statahead, since their bytes are read");
    }
}
