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

use std::time::Duration;

/// The first window after a useful park would have paid: below it, shrinking
/// goes to zero.
const GROW_START: Duration = Duration::from_micros(2);

/// The adaptive spin window of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spin {
    max: Duration,
    window: Duration,
}

impl Spin {
    /// A window that adapts between zero and `max`; it starts at zero, so a
    /// worker spins only once it measured that spinning would have paid.
    pub fn new(max: Duration) -> Spin {
        Spin { max, window: Duration::ZERO }
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
    fn a_zero_maximum_never_spins() {
        let mut s = Spin::new(Duration::ZERO);
        s.woke_after(Duration::ZERO);
        s.woke_after(US);
        assert_eq!(s.window(), Duration::ZERO);
    }
}
