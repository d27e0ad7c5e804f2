//! A table of at most a fixed number of entries by inode number, the oldest
//! dropped first: the mount's short-lived memories of files
//! ([`crate::small`], [`crate::newfiles`]).

use std::collections::{HashMap, VecDeque};

/// Entries by inode number, at most `max`; inserting past it drops the
/// oldest inserted.
#[derive(Debug)]
pub struct OldestFirst<V> {
    map: HashMap<u64, V>,
    /// Inode numbers, oldest first (may name entries removed since).
    order: VecDeque<u64>,
    max: usize,
}

impl<V> OldestFirst<V> {
    /// An empty table of at most `max` entries.
    pub fn new(max: usize) -> OldestFirst<V> {
        OldestFirst { map: HashMap::new(), order: VecDeque::new(), max }
    }

    /// Puts `v` under `ino` (replacing what was there, which keeps its age),
    /// then drops the oldest entries past the limit.
    pub fn insert(&mut self, ino: u64, v: V) {
        if self.map.insert(ino, v).is_none() {
            self.order.push_back(ino);
        }
        while self.map.len() > self.max {
            let Some(old) = self.order.pop_front() else { break };
            self.map.remove(&old);
        }
        // Removed entries leave their numbers behind: sweep them out before
        // the queue grows past twice the table.
        if self.order.len() > 2 * self.max {
            let map = &self.map;
            self.order.retain(|i| map.contains_key(i));
        }
    }

    /// The entry under `ino`.
    pub fn get(&self, ino: u64) -> Option<&V> {
        self.map.get(&ino)
    }

    /// Takes the entry under `ino` out.
    pub fn remove(&mut self, ino: u64) -> Option<V> {
        self.map.remove(&ino)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_the_queue_stays_bounded() {
        let mut t = OldestFirst::new(3);
        for ino in 0..5 {
            t.insert(ino, ino * 10);
        }
        assert_eq!((t.get(0), t.get(1), t.get(2), t.get(4)), (None, None, Some(&20), Some(&40)));
        t.insert(2, 21);
        assert_eq!(t.get(2), Some(&21), "replaced");
        t.insert(5, 50);
        assert_eq!(t.get(2), None, "a replaced entry kept its age");
        for ino in 100..1000 {
            t.insert(ino, 0);
            t.remove(ino);
        }
        assert!(t.is_empty() || t.len() <= 3);
        assert!(t.order.len() <= 2 * 3 + 1, "queue of {}", t.order.len());
    }
}
