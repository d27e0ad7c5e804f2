//! Requests that stopped before they changed anything, to run again once what
//! they wait for finished (`Shard::set_defer_misses`): an inode page read in
//! the background, data pages being read or written, or a commit they need
//! first. The worker keeps serving the others meanwhile (docs/cluster.md,
//! "Inode pages read in the background").
//!
//! Bounded: at most [`STOPPED_MAX`] wait; past that, and for a request that
//! spent its [`TRIES_MAX`] (four stops), the shard waits for the device instead. Later
//! requests of a connection with one waiting queue behind it, so one
//! connection's requests keep their order.

use pfs_store::DeferredOn;

use crate::msg::ConnRef;

/// Most requests waiting; past it, a request waits for the device blocking.
const STOPPED_MAX: usize = 4096;

/// What one stop weighs in a request's tries.
const TRY: u8 = 16;

/// Tries one request spends stopping: four stops; then it waits for the
/// device blocking (a page can be evicted again before its request runs). A
/// stop at [`DeferredOn::InodePageWait`] (its page is still being read, or
/// its read could not start yet) weighs a sixteenth of one
/// ([`stop_weight`]): it lost nothing, and it is run again at any page's
/// read, its own or not, so many such stops are no sign of eviction.
pub(crate) const TRIES_MAX: u8 = 4 * TRY;

/// What a stop at `on` adds to the request's tries.
pub(crate) fn stop_weight(on: DeferredOn) -> u8 {
    match on {
        DeferredOn::InodePageWait => 1,
        _ => TRY,
    }
}

/// Background requests finished so far: inode page reads, data requests,
/// commits, and the log's moves to a fresh half
/// (`Shard::background_progress`).
pub(crate) type Progress = (u64, u64, u64, u64);

/// A request waiting to run again.
#[derive(Debug)]
pub(crate) struct Waiting {
    pub(crate) origin: u16,
    pub(crate) conn: ConnRef,
    pub(crate) buf: Vec<u8>,
    /// Tries it spent stopping before ([`TRIES_MAX`]).
    pub(crate) tries: u8,
    /// What it waits for and the count of those finished when it stopped:
    /// it runs again once that count moved (for data pages in flight: once
    /// every data request in flight at the stop finished, so a stop counted
    /// against [`TRIES_MAX`] is one for a later write of those pages, not for
    /// another request's completion). `None`: it waits only for an earlier
    /// request of its connection.
    waits: Option<(DeferredOn, u64)>,
}

impl Waiting {
    /// Whether what it waits for moved by `now`.
    pub(crate) fn ready(&self, now: Progress) -> bool {
        match self.waits {
            None => true,
            Some((DeferredOn::InodePage | DeferredOn::InodePageWait, at)) => now.0 != at,
            Some((DeferredOn::Data, issued)) => now.1 >= issued,
            Some((DeferredOn::Commit, at)) => now.2 != at,
            Some((DeferredOn::LogRoom, at)) => now.3 != at,
        }
    }
}

/// The requests of a worker waiting to run again, in arrival order.
#[derive(Debug, Default)]
pub(crate) struct Stopped {
    waiting: Vec<Waiting>,
    /// The counts when they last ran.
    seen: Progress,
    /// Tries the request being run again spent stopping before
    /// ([`Stopped::take_tries`]).
    running_tries: u8,
}

impl Stopped {
    /// Whether none waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Whether a request that spent `tries` stopping may stop again (room,
    /// and tries left).
    pub(crate) fn may_stop(&self, tries: u8) -> bool {
        self.waiting.len() < STOPPED_MAX && tries < TRIES_MAX
    }

    /// Tries the request now running spent stopping (0 for a new one); the
    /// next request starts from 0.
    pub(crate) fn take_tries(&mut self) -> u8 {
        std::mem::take(&mut self.running_tries)
    }

    /// Tries the request now running spent stopping, kept for the rest of it.
    pub(crate) fn tries(&self) -> u8 {
        self.running_tries
    }

    /// Whether a request of `conn` on `origin` waits: a later one of the same
    /// connection queues behind it ([`queue_behind`](Self::queue_behind)).
    pub(crate) fn holds(&self, origin: u16, conn: ConnRef) -> bool {
        !self.waiting.is_empty()
            && self.waiting.iter().any(|d| (d.origin, d.conn) == (origin, conn))
    }

    /// Queues a request behind the waiting one of its connection.
    pub(crate) fn queue_behind(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        let tries = self.take_tries();
        self.waiting.push(Waiting { origin, conn, buf, tries, waits: None });
    }

    /// A request that stopped at what `on` says, having spent `tries` before,
    /// having started when the counts were `before`: the read, write or
    /// commit it waits for finishes after that, so the count moves past it.
    /// Data requests are numbered: `issued` is the next number at the stop
    /// (`Shard::data_issued`), and the one it waits for is below it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn stopped(
        &mut self,
        origin: u16,
        conn: ConnRef,
        buf: Vec<u8>,
        tries: u8,
        on: DeferredOn,
        before: Progress,
        issued: u64,
    ) {
        let at = match on {
            DeferredOn::InodePage | DeferredOn::InodePageWait => before.0,
            DeferredOn::Data => issued,
            DeferredOn::Commit => before.2,
            DeferredOn::LogRoom => before.3,
        };
        let tries = tries.saturating_add(stop_weight(on));
        self.waiting.push(Waiting { origin, conn, buf, tries, waits: Some((on, at)) });
    }

    /// Whether anything moved since they last ran, the counts being `now`.
    pub(crate) fn moved(&self, now: Progress) -> bool {
        !self.waiting.is_empty() && now != self.seen
    }

    /// When something moved: every waiting request, in arrival order, to run
    /// again those [`ready`](Waiting::ready) and put the others back
    /// ([`put_back`](Self::put_back)).
    pub(crate) fn take_all(&mut self, now: Progress) -> Option<Vec<Waiting>> {
        if now == self.seen {
            return None;
        }
        self.seen = now;
        Some(std::mem::take(&mut self.waiting))
    }

    /// A request taken with [`take_all`](Self::take_all) that still waits.
    pub(crate) fn put_back(&mut self, w: Waiting) {
        self.waiting.push(w);
    }

    /// Before a request taken with [`take_all`](Self::take_all) runs again:
    /// the times it stopped.
    pub(crate) fn running(&mut self, w: &Waiting) {
        self.running_tries = w.tries;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::Sum;

    fn conn(slot: u32) -> ConnRef {
        ConnRef { slot, gen: 1, sum: Sum::Full }
    }

    /// Each request runs again when its own count moved, later requests of
    /// its connection queue behind it, and the bounds hold.
    #[test]
    fn stopped_requests_wait_for_their_own_count_in_order() {
        let mut s = Stopped::default();
        assert!(s.may_stop(0));
        assert!(!s.may_stop(TRIES_MAX), "a request stops at most TRIES_MAX times");
        s.stopped(0, conn(1), b"page".to_vec(), 0, DeferredOn::InodePage, (5, 7, 9, 1), 7);
        s.stopped(0, conn(2), b"commit".to_vec(), 2 * TRY, DeferredOn::Commit, (5, 7, 9, 1), 7);
        assert!(s.holds(0, conn(1)) && !s.holds(1, conn(1)) && !s.holds(0, conn(3)));
        s.queue_behind(0, conn(1), b"behind".to_vec());
        assert!(s.moved((5, 8, 9, 1)));
        // Data requests finished: nobody here waits for them.
        let taken = s.take_all((5, 8, 9, 1)).expect("something moved");
        let ready: Vec<bool> = taken.iter().map(|w| w.ready((5, 8, 9, 1))).collect();
        assert_eq!(ready, [false, false, true], "only the one queued behind its connection");
        for w in taken {
            s.put_back(w);
        }
        assert!(!s.moved((5, 8, 9, 1)));
        assert!(s.take_all((5, 8, 9, 1)).is_none(), "nothing moved since");
        // A commit finished: the second runs again, with its tries.
        let taken = s.take_all((5, 8, 10, 1)).expect("moved");
        let w = taken.into_iter().find(|w| w.ready((5, 8, 10, 1)) && w.buf == b"commit").unwrap();
        s.running(&w);
        assert_eq!(s.tries(), 2 * TRY + TRY, "stopped twice before, and once more");
        assert_eq!(s.take_tries(), 3 * TRY);
        assert_eq!(s.take_tries(), 0, "the next request starts from 0");
        // A request waiting for room in the log runs again once it moved.
        s.stopped(0, conn(4), b"room".to_vec(), 0, DeferredOn::LogRoom, (5, 8, 10, 1), 8);
        let taken = s.take_all((5, 9, 11, 1)).expect("moved");
        let room = taken.iter().find(|w| w.buf == b"room").unwrap();
        assert!(!room.ready((5, 9, 11, 1)), "reads and commits are not room in the log");
        assert!(room.ready((5, 9, 11, 2)));
        // A request at data pages in flight runs again once every data
        // request in flight at its stop (numbered below 12) finished, not
        // when another one did.
        s.stopped(0, conn(5), b"data".to_vec(), TRY, DeferredOn::Data, (5, 9, 11, 2), 12);
        let taken = s.take_all((5, 10, 11, 2)).expect("moved");
        let data = taken.iter().find(|w| w.buf == b"data").unwrap();
        assert!(!data.ready((5, 10, 11, 2)), "requests 10 and 11 are still in flight");
        assert!(!data.ready((5, 11, 11, 2)), "request 11 is still in flight");
        assert!(data.ready((5, 12, 11, 2)));
        assert!(data.ready((5, 15, 11, 2)));
    }

    /// A stop at a page still being read, or whose read could not start,
    /// weighs a sixteenth of a stop: a request among many such keeps its
    /// four real stops.
    #[test]
    fn a_stop_at_a_page_in_flight_weighs_a_sixteenth() {
        let mut s = Stopped::default();
        let mut tries = 0;
        for i in 0..TRIES_MAX - 1 {
            assert!(s.may_stop(tries), "stop {i}");
            s.stopped(
                0,
                conn(1),
                Vec::new(),
                tries,
                DeferredOn::InodePageWait,
                (i as u64, 0, 0, 0),
                0,
            );
            let w = s.take_all((i as u64 + 1, 0, 0, 0)).unwrap().pop().unwrap();
            assert!(w.ready((i as u64 + 1, 0, 0, 0)), "a page read finished: run again");
            s.running(&w);
            tries = s.take_tries();
        }
        assert_eq!(tries, TRIES_MAX - 1);
        assert!(s.may_stop(tries), "63 stops at pages in flight are not four stops");
        s.stopped(0, conn(1), Vec::new(), tries, DeferredOn::InodePageWait, (0, 0, 0, 0), 0);
        let w = s.take_all((1, 0, 0, 0)).unwrap().pop().unwrap();
        s.running(&w);
        let tries = s.take_tries();
        assert!(!s.may_stop(tries), "but 64 are");
        let mut tries = 0;
        for _ in 0..4 {
            assert!(s.may_stop(tries));
            tries += stop_weight(DeferredOn::InodePage);
        }
        assert!(!s.may_stop(tries), "four stops at a page");
    }

    #[test]
    fn at_most_stopped_max_wait() {
        let mut s = Stopped::default();
        for i in 0..STOPPED_MAX {
            assert!(s.may_stop(0), "room for {i}");
            s.stopped(0, conn(i as u32), Vec::new(), 0, DeferredOn::Data, (0, 0, 0, 0), 1);
        }
        assert!(!s.may_stop(0));
    }
}
