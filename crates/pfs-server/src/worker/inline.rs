//! Rounds run by a client thread of the same process while the worker's own
//! thread sleeps (`pfs up`, [`pfs_net::inline`]): the lock around the worker,
//! and disarming and re-arming its connections around those rounds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use pfs_net::QueuePair;
use pfs_store::device::Device;

use super::{wall_clock_ns, Worker};

/// Rounds a client thread runs after its own request to leave the worker idle
/// (`Worker::rearm`); past them, the worker's thread is woken for the rest.
pub(super) const REARM_ROUNDS: usize = 4;

/// A worker behind the lock that lets a client thread of the same process run
/// its rounds while the worker's own thread sleeps ([`pfs_net::inline`]).
pub(super) struct Shared<D: Device> {
    pub(super) worker: Mutex<Worker<D>>,
    /// The worker's thread sleeps in its epoll set, without the lock.
    pub(super) idle: AtomicBool,
    /// The worker stopped serving: no one runs its rounds any more.
    pub(super) closed: AtomicBool,
    /// A round run by a client thread panicked: the worker stops without
    /// touching its shard again.
    pub(super) panicked: AtomicBool,
    /// Times client threads ran the worker's rounds.
    pub(super) runs: AtomicU64,
}

impl<D: Device> Shared<D> {
    pub(super) fn lock(&self) -> MutexGuard<'_, Worker<D>> {
        // Rounds run by client threads catch their panics (`run_parked`), so
        // the lock is poisoned only by a bug outside them; the worker's state
        // then is what it was, and its thread carries on or fail-stops.
        self.worker.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<D: Device + Send> pfs_net::inline::Inline for Shared<D> {
    fn run_parked(&self, f: &mut dyn FnMut(&mut dyn FnMut() -> usize)) -> bool {
        if !self.idle.load(Ordering::SeqCst) {
            return false;
        }
        let Ok(mut w) = self.worker.try_lock() else { return false };
        if !self.idle.load(Ordering::SeqCst) || self.closed.load(Ordering::SeqCst) {
            return false;
        }
        w.disarm();
        let dirty_before = w.dirty_since.is_some();
        let mut panicked = None;
        f(&mut || {
            if panicked.is_some() || w.shard.failure().is_some() {
                return 0;
            }
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.inline_round())) {
                Ok(n) => n,
                Err(payload) => {
                    panicked = Some(crate::server::panic_text(&payload));
                    0
                }
            }
        });
        self.runs.fetch_add(1, Ordering::Relaxed);
        pfs_net::inline::count_run();
        match panicked {
            Some(why) => {
                // The shard's memory may be anywhere: stop the whole server
                // without checkpointing it, as a panic on the worker's own
                // thread does (`Worker::run`).
                self.panicked.store(true, Ordering::SeqCst);
                w.fail_stop.trip(format!(
                    "worker {} panicked in a round run by a client thread: {why}",
                    w.id
                ));
                w.bells[w.id as usize].ring_always();
            }
            None => w.rearm(dirty_before),
        }
        true
    }
}

impl<D: Device> Worker<D> {
    /// One round run by a client thread while the worker's own thread sleeps
    /// (`Shared::run_parked`).
    pub(super) fn inline_round(&mut self) -> usize {
        self.now = Instant::now();
        self.shard.set_now(wall_clock_ns());
        self.round()
    }

    /// Before inline rounds: connections stop ringing the sleeping thread.
    pub(super) fn disarm(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            c.qp.cancel_wait();
        }
    }

    /// After inline rounds: arms every connection again and wakes the
    /// worker's thread if anything is left for it: requests or replies that
    /// came meanwhile, work in flight, or a first change since the last commit
    /// (its commit timer runs from the thread's next park). `dirty_before`:
    /// whether a change already waited for a commit when the rounds began.
    pub(super) fn rearm(&mut self, dirty_before: bool) {
        // What the last round left to collect (the sends of its replies give
        // their buffers back) would keep the connections from arming.
        for _ in 0..REARM_ROUNDS {
            if self.shard.failure().is_some() || self.inline_round() == 0 {
                break;
            }
        }
        let mut busy = false;
        for c in self.conns.iter_mut().flatten() {
            busy |= !c.qp.prepare_wait();
        }
        busy |= self.ring_in.iter().flatten().any(|r| !r.is_empty())
            || self.memcpy.as_ref().is_some_and(|m| m.in_flight > 0)
            || !self.backlog.is_empty()
            || !self.after_commit.is_empty()
            || self.awaits_device()
            || self.awaiting_peers()
            || !self.cross.is_empty()
            || !self.rmdirs.is_empty()
            || !self.outbox.is_idle()
            || self.shard.has_ready_follow_ups()
            || self.shard.has_trims()
            || self.shard.failure().is_some()
            || (!dirty_before && self.dirty_since.is_some());
        if busy {
            self.bells[self.id as usize].ring_always();
        }
    }
}
