//! Rounds of a parked worker run by the client thread that waits for it.
//!
//! On a converged node (`pfs up`: server and mount in one process, on the same
//! cores) a request over shared memory costs two wake-ups: the worker's, parked
//! in its epoll wait, and then the client thread's, parked for the reply. Each
//! is a context switch and, in a virtual machine, an interprocessor interrupt.
//! A worker that serves inline registers itself here; the server writes the key
//! it got into the control page of each shared-memory connection it serves
//! (with the process id, so only a client in the same process uses it). A client
//! about to send on such a connection asks [`Inline::run_parked`]: if the worker
//! is parked and nobody else holds it, the client thread takes the worker's
//! lock, sends without ringing, runs the worker's rounds itself until its reply
//! is there (or nothing moves), and hands the worker back armed, waking it only
//! when work is left. Otherwise it sends and waits as usual.
//!
//! The registry holds weak references: a stopped worker's entry upgrades to
//! nothing. Its size is bounded by the workers alive in the process (entries of
//! stopped workers are reused).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A worker whose rounds another thread of its process may run while it is parked.
pub trait Inline: Send + Sync {
    /// When the worker is parked and free: takes it, stops its connections from
    /// ringing it, calls `f` with a function that runs one round of the worker on
    /// this thread (returning the work it did), then arms the worker again and
    /// wakes it if work is left. Returns `false` without calling `f` otherwise.
    fn run_parked(&self, f: &mut dyn FnMut(&mut dyn FnMut() -> usize)) -> bool;
}

type Slot = Option<Weak<dyn Inline>>;

static SLOTS: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

fn slots() -> std::sync::MutexGuard<'static, Vec<Slot>> {
    SLOTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `worker`; the key (never 0) goes into its connections' control pages.
pub fn register(worker: &Arc<dyn Inline>) -> u64 {
    let mut s = slots();
    let weak = Some(Arc::downgrade(worker));
    let free = s.iter().position(|e| e.as_ref().is_none_or(|w| w.strong_count() == 0));
    let i = match free {
        Some(i) => {
            s[i] = weak;
            i
        }
        None => {
            s.push(weak);
            s.len() - 1
        }
    };
    i as u64 + 1
}

/// Removes the worker registered under `key`.
pub fn unregister(key: u64) {
    let mut s = slots();
    if let Some(e) = key.checked_sub(1).and_then(|i| s.get_mut(i as usize)) {
        *e = None;
    }
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// Counts one [`Inline::run_parked`] that ran its function (for [`runs`]).
pub fn count_run() {
    RUNS.fetch_add(1, Ordering::Relaxed);
}

/// How many times client threads of this process ran a worker's rounds.
pub fn runs() -> u64 {
    RUNS.load(Ordering::Relaxed)
}

/// The worker registered under `key`, if it is still alive.
pub fn find(key: u64) -> Option<Arc<dyn Inline>> {
    let s = slots();
    s.get(key.checked_sub(1)? as usize)?.as_ref()?.upgrade()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);

    impl Inline for Counter {
        fn run_parked(&self, f: &mut dyn FnMut(&mut dyn FnMut() -> usize)) -> bool {
            f(&mut || self.0.fetch_add(1, Ordering::SeqCst) + 1);
            true
        }
    }

    #[test]
    fn keys_find_live_workers_only_and_are_reused() {
        let a: Arc<dyn Inline> = Arc::new(Counter(AtomicUsize::new(0)));
        let ka = register(&a);
        assert_ne!(ka, 0);
        let found = find(ka).expect("registered");
        let mut rounds = 0;
        assert!(found.run_parked(&mut |round| rounds = round() + round()));
        assert_eq!(rounds, 3, "each call of the round function ran the worker once");
        drop(found);
        unregister(ka);
        assert!(find(ka).is_none(), "unregistered");
        assert!(find(0).is_none() && find(u64::MAX).is_none(), "unknown keys");
        let b: Arc<dyn Inline> = Arc::new(Counter(AtomicUsize::new(0)));
        let kb = register(&b);
        drop(b);
        assert!(find(kb).is_none(), "a dropped worker is not found");
    }
}
