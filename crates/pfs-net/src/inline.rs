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
//! stopped workers are reused). A process with no worker registered (every
//! client but `pfs up`'s own mount) never looks further ([`wanted`] is false):
//! no lock, no system call per request. A child of `fork` has none.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

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
/// Workers registered now (in this process: a forked child has none).
static REGISTERED: AtomicUsize = AtomicUsize::new(0);
/// This process's id once asked for (0: not yet, or a child since forked).
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn forked_child() {
    // The child has none of the parent's worker threads.
    REGISTERED.store(0, Ordering::SeqCst);
    PID.store(0, Ordering::SeqCst);
}

/// This process's id, without a system call after the first time.
pub fn this_process() -> u32 {
    let pid = PID.load(Ordering::Relaxed);
    if pid != 0 {
        return pid;
    }
    static AT_FORK: std::sync::Once = std::sync::Once::new();
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to atomics.
        unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
    });
    let pid = std::process::id();
    PID.store(pid, Ordering::Relaxed);
    pid
}

fn slots() -> std::sync::MutexGuard<'static, Vec<Slot>> {
    SLOTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers `worker`; the key (never 0) goes into its connections' control pages.
pub fn register(worker: &Arc<dyn Inline>) -> u64 {
    this_process();
    let mut s = slots();
    REGISTERED.fetch_add(1, Ordering::SeqCst);
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
        if e.take().is_some() {
            let _ =
                REGISTERED.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
    }
}

static RUNS: AtomicU64 = AtomicU64::new(0);

/// Whether client threads run rounds only while callers interleave
/// ([`only_when_interleaved`]).
static INTERLEAVED_ONLY: AtomicBool = AtomicBool::new(false);
/// The last caller noted, and when (ns since [`start`]) a caller other than
/// the one before it was last noted.
static LAST_CALLER: AtomicU32 = AtomicU32::new(0);
static LAST_SWITCH_NS: AtomicU64 = AtomicU64::new(0);
/// How long after two callers interleaved they still count as interleaving.
pub const INTERLEAVED_FOR: Duration = Duration::from_millis(2);

fn since_start_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Makes client threads run a parked worker's rounds only while requests of
/// two or more callers (application threads, [`note_caller`]) interleave, and
/// workers skip their idle spin meanwhile, so that the rounds find them parked.
/// A single stream of requests (`tar`, `rm -r`) then wakes the worker as
/// before, whose spin keeps that stream's hand-offs on one CPU
/// (docs/benchmarks.md, "Inline rounds"). Off: whenever the worker is parked.
pub fn only_when_interleaved(yes: bool) {
    INTERLEAVED_ONLY.store(yes, Ordering::Relaxed);
}

/// Notes that application thread `caller` made a request (the FUSE request's
/// thread id; 0, a request of the kernel's own, is not counted).
pub fn note_caller(caller: u32) {
    if caller == 0 {
        return;
    }
    let before = LAST_CALLER.swap(caller, Ordering::Relaxed);
    if before != caller && before != 0 {
        LAST_SWITCH_NS.store(since_start_ns().max(1), Ordering::Relaxed);
    }
}

/// Whether requests of two callers interleaved within [`INTERLEAVED_FOR`].
fn interleaved() -> bool {
    let at = LAST_SWITCH_NS.load(Ordering::Relaxed);
    at != 0 && since_start_ns().saturating_sub(at) < INTERLEAVED_FOR.as_nanos() as u64
}

/// Whether a client thread should try to run a parked worker's rounds now.
pub fn wanted() -> bool {
    REGISTERED.load(Ordering::Relaxed) > 0
        && (!INTERLEAVED_ONLY.load(Ordering::Relaxed) || interleaved())
}

/// Whether an idle worker that serves inline should park at once instead of
/// spinning: callers interleave, and their threads run its rounds.
pub fn skip_spin() -> bool {
    INTERLEAVED_ONLY.load(Ordering::Relaxed) && interleaved()
}

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
    fn only_interleaving_callers_want_rounds_when_asked_to() {
        let w: Arc<dyn Inline> = Arc::new(Counter(AtomicUsize::new(0)));
        let key = register(&w);
        only_when_interleaved(true);
        note_caller(7);
        note_caller(7);
        note_caller(0);
        assert!(!wanted() && !skip_spin(), "one caller alone, and the kernel's 0, do not count");
        note_caller(8);
        assert!(wanted() && skip_spin(), "two callers interleaved just now");
        std::thread::sleep(INTERLEAVED_FOR + Duration::from_millis(1));
        note_caller(8);
        assert!(!wanted() && !skip_spin(), "no interleaving for longer than the window");
        only_when_interleaved(false);
        assert!(wanted() && !skip_spin(), "without the policy a parked worker is always run");
        unregister(key);
    }

    #[test]
    fn a_process_without_workers_never_wants_rounds() {
        // (Run in a child: other tests here register workers meanwhile.)
        this_process();
        // SAFETY: the child only calls async-signal-safe code and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // The parent's registrations do not reach the child.
            let ok = !wanted() && this_process() == std::process::id();
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
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
