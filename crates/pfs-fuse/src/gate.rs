//! The gate between opens and removals on one mount.
//!
//! An unlink must not remove a file's last name while the same mount opens it:
//! the unlink checks "nothing open here" (or hides an open file instead), and no
//! open may slip between that check and the removal. Opens run alongside each
//! other, and so do unlinks while nothing is open (the common case: `rm -r`,
//! mdtest's remove phase); only an operation that may have to keep an open file
//! alive (a rename over a name, an unlink or rmdir when files are open, the
//! removal of a hidden name) runs alone.
//!
//! Callers pass in arrival order, in batches of one kind: a caller enters when
//! what holds the gate is of its kind (and not `Alone`) and every caller that
//! arrived before it and still waits is of its kind too. So no kind starves the
//! other, and the head of the queue always enters once the holders leave. The
//! queue holds at most one entry per thread serving requests.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

/// What a caller does while it holds the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// An open or create: alongside other opens.
    Open,
    /// An unlink while nothing is open here: alongside other such unlinks.
    Remove,
    /// Anything that may keep an open file alive: alone.
    Alone,
}

impl Pass {
    fn shares_with(self, other: Pass) -> bool {
        self == other && self != Pass::Alone
    }
}

#[derive(Debug, Default)]
struct State {
    /// The kind holding the gate, and how many hold it.
    held: Option<(Pass, usize)>,
    /// Callers waiting, by ticket, in arrival order.
    queue: VecDeque<(u64, Pass)>,
    next_ticket: u64,
}

/// The gate (see the module documentation).
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

/// A pass through the gate; leaving drops it.
#[derive(Debug)]
pub struct Held<'a> {
    gate: &'a Gate,
}

impl Gate {
    /// Waits until a caller of kind `pass` may enter, and enters.
    pub fn enter(&self, pass: Pass) -> Held<'_> {
        let mut s = self.state.lock().expect("gate lock");
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.queue.push_back((ticket, pass));
        loop {
            let holders_allow = match s.held {
                None => true,
                Some((kind, _)) => kind.shares_with(pass),
            };
            let queue_allows = s
                .queue
                .iter()
                .take_while(|(t, _)| *t != ticket)
                .all(|(_, kind)| kind.shares_with(pass));
            if holders_allow && queue_allows {
                break;
            }
            s = self.changed.wait(s).expect("gate lock");
        }
        let at = s.queue.iter().position(|(t, _)| *t == ticket).expect("queued above");
        s.queue.remove(at);
        let holders = s.held.map_or(0, |(_, n)| n);
        s.held = Some((pass, holders + 1));
        // The next in the queue may be of this kind too. Waiters are queued
        // while they wait: with none, no wake-up (a system call each).
        let waiting = !s.queue.is_empty();
        drop(s);
        if waiting {
            self.changed.notify_all();
        }
        Held { gate: self }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut s = self.gate.state.lock().expect("gate lock");
        s.held = match s.held {
            Some((kind, n)) if n > 1 => Some((kind, n - 1)),
            _ => None,
        };
        let waiting = !s.queue.is_empty();
        drop(s);
        if waiting {
            self.gate.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn one_kind_shares_and_alone_is_alone() {
        let g = Gate::default();
        let a = g.enter(Pass::Remove);
        let b = g.enter(Pass::Remove);
        drop((a, b));
        let c = g.enter(Pass::Open);
        let d = g.enter(Pass::Open);
        drop((c, d));
        let _e = g.enter(Pass::Alone);
        assert_eq!(g.state.lock().unwrap().held, Some((Pass::Alone, 1)));
    }

    /// Threads of all kinds hammer one gate: the kinds never overlap, and
    /// everyone gets through (no deadlock, no starvation within the test).
    #[test]
    fn kinds_never_overlap_and_everyone_passes() {
        let g = Arc::new(Gate::default());
        // Holders now, per kind: Open, Remove, Alone.
        let inside: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
        let passed = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..9)
            .map(|i| {
                let (g, inside, passed) = (g.clone(), inside.clone(), passed.clone());
                std::thread::spawn(move || {
                    let (pass, k) = [(Pass::Open, 0), (Pass::Remove, 1), (Pass::Alone, 2)][i % 3];
                    for _ in 0..200 {
                        let _held = g.enter(pass);
                        let now = inside[k].fetch_add(1, Ordering::SeqCst) + 1;
                        for (j, n) in inside.iter().enumerate() {
                            if j != k {
                                assert_eq!(n.load(Ordering::SeqCst), 0, "{pass:?} beside kind {j}");
                            }
                        }
                        if pass == Pass::Alone {
                            assert_eq!(now, 1, "two alone at once");
                        }
                        std::thread::sleep(Duration::from_micros(20));
                        inside[k].fetch_sub(1, Ordering::SeqCst);
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(passed.load(Ordering::SeqCst), 9 * 200);
        let s = g.state.lock().unwrap();
        assert!(s.held.is_none() && s.queue.is_empty());
    }

    /// A waiting caller of another kind stops newcomers of the holding kind
    /// from entering ahead of it.
    #[test]
    fn a_waiting_kind_is_not_overtaken() {
        let g = Arc::new(Gate::default());
        let first = g.enter(Pass::Open);
        let g2 = g.clone();
        let remover = std::thread::spawn(move || drop(g2.enter(Pass::Remove)));
        while g.state.lock().unwrap().queue.is_empty() {
            std::thread::yield_now();
        }
        let g3 = g.clone();
        let late_open = std::thread::spawn(move || drop(g3.enter(Pass::Open)));
        while g.state.lock().unwrap().queue.len() < 2 {
            std::thread::yield_now();
        }
        // The late open waits behind the remover even though an open holds.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(g.state.lock().unwrap().held, Some((Pass::Open, 1)));
        drop(first);
        remover.join().unwrap();
        late_open.join().unwrap();
    }
}
