//! How long an idle worker spins before it parks (`poll_mode = "adaptive"`).
//!
//! Spinning pays when the next request comes within the spin: the worker answers
//! without a wake-up (an eventfd write by the client, a context switch here). It
//! costs a core's time when the request comes later, and on a converged node
//! (`pfs up`: FUSE threads and applications on the same cores) that time is
//! taken from the very threads that would send the next request. So the window
//! adapts to what the idle periods measure, with the rule of Linux's haltpoll
//! cpuidle governor: a park that a longer spin (up to the configured maximum)
//! would have avoided doubles the window; a park longer than the maximum halves
//! it, down to not spinning at all. `idle_spin_us = 0` never spins.
//!
//! How it spins depends on whether the core is contended. A worker that owns
//! its core spins on the CPU (`spin_loop`): it sees a request the moment it
//! lands. A worker that shares its core with threads that want to run (more
//! workers, FUSE threads and applications than cores) would keep them off it
//! until the scheduler preempts it, and the thread kept off is often the one
//! that would send the next request or answer this worker's forwarded one; so
//! it yields between polls instead, and a runnable thread runs at once. The
//! sign of contention costs nothing to read: two polls of the spin far apart
//! (over [`PREEMPTED`]) mean something else ran on this core in between. A
//! worker yields for [`CONTENDED_FOR`] after such a
//! gap, and spins on the CPU again once none was seen for that long.

use std::time::{Duration, Instant};

/// The first window after a useful park would have paid: below it, shrinking
/// goes to zero.
const GROW_START: Duration = Duration::from_micros(2);

/// A gap between two polls of a spin longer than this means the worker was
/// off its core (a poll of empty rings takes well under a microsecond; timer
/// interrupts a few).
pub const PREEMPTED: Duration = Duration::from_micros(20);

/// How long a worker yields between polls after it saw a gap.
pub const CONTENDED_FOR: Duration = Duration::from_millis(50);

/// The adaptive spin window of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spin {
    max: Duration,
    window: Duration,
    /// Until when the spin yields between polls.
    contended_until: Option<Instant>,
}

impl Spin {
    /// A window that adapts between zero and `max`; it starts at zero, so a
    /// worker spins only once it measured that spinning would have paid.
    pub fn new(max: Duration) -> Spin {
        Spin { max, window: Duration::ZERO, contended_until: None }
    }

    /// Whether the spin yields the core between polls (it was contended
    /// lately) rather than spinning on the CPU.
    pub fn yields(&self, now: Instant) -> bool {
        self.contended_until.is_some_and(|t| now < t)
    }

    /// A poll of the spin at `now` came `gap` after the one before it.
    pub fn polled(&mut self, now: Instant, gap: Duration) {
        if gap > PREEMPTED {
            self.contended_until = Some(now + CONTENDED_FOR);
        }
    }

    /// How long to spin in the current idle period before parking.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Work came `idle` after the worker became idle, and it had parked: had
    /// the spin lasted `idle`, the wake-up would have been saved.
    pub fn woke_after(&mut self, idle: Duration) {
        if idle <= self.max {
            self.window = (self.window * 2).max(GROW_START).min(self.max);
        } else {
            self.window /= 2;
            if self.window < GROW_START {
                self.window = Duration::ZERO;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn short_gaps_grow_the_window_up_to_the_maximum() {
        let mut s = Spin::new(100 * US);
        assert_eq!(s.window(), Duration::ZERO, "no spinning until measured");
        s.woke_after(30 * US);
        assert_eq!(s.window(), 2 * US);
        for _ in 0..10 {
            s.woke_after(30 * US);
        }
        assert_eq!(s.window(), 100 * US, "capped at the maximum");
    }

    #[test]
    fn long_gaps_shrink_it_to_nothing() {
        let mut s = Spin::new(100 * US);
        for _ in 0..10 {
            s.woke_after(10 * US);
        }
        s.woke_after(5 * 1000 * US);
        assert_eq!(s.window(), 50 * US);
        for _ in 0..6 {
            s.woke_after(5 * 1000 * US);
        }
        assert_eq!(s.window(), Duration::ZERO);
    }

    #[test]
    fn a_gap_between_polls_yields_for_a_while_then_spins_again() {
        let mut s = Spin::new(100 * US);
        let t0 = Instant::now();
        assert!(!s.yields(t0), "a worker owns its core until it sees otherwise");
        s.polled(t0, US);
        s.polled(t0, PREEMPTED);
        assert!(!s.yields(t0), "gaps up to PREEMPTED are interrupts, not contention");
        s.polled(t0, PREEMPTED + US);
        assert!(s.yields(t0));
        assert!(s.yields(t0 + CONTENDED_FOR - US));
        assert!(!s.yields(t0 + CONTENDED_FOR), "spins again after CONTENDED_FOR without a gap");
        let t1 = t0 + CONTENDED_FOR / 2;
        s.polled(t1, 5 * PREEMPTED);
        assert!(s.yields(t0 + CONTENDED_FOR), "a new gap starts the time again");
        assert!(!s.yields(t1 + CONTENDED_FOR));
    }

    #[test]
    fn a_zero_maximum_never_spins() {
        let mut s = Spin::new(Duration::ZERO);
        s.woke_after(Duration::ZERO);
        s.woke_after(US);
        assert_eq!(s.window(), Duration::ZERO);
    }
}
