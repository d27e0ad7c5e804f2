//! A fixed-size bitmap allocator: single slots (inodes) and contiguous runs (pages).

/// A bitmap of `len` bits, set = allocated. Sized once; never grows.
#[derive(Clone, Debug)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
    used: u64,
    /// Where the next search starts: the lowest bit freed since, or past the last
    /// allocation, so allocation neither rescans a full prefix nor skips holes.
    cursor: u64,
}

impl Bitmap {
    /// A bitmap of `len` free bits.
    pub fn new(len: u64) -> Bitmap {
        Bitmap { words: vec![0; len.div_ceil(64) as usize], len, used: 0, cursor: 0 }
    }

    /// Number of bits.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True if the bitmap has no bits at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bits set.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bits clear.
    pub fn free(&self) -> u64 {
        self.len - self.used
    }

    /// Whether bit `i` is set.
    pub fn get(&self, i: u64) -> bool {
        assert!(i < self.len, "bit {i} out of range {}", self.len);
        self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Sets bits `start..start + count`, which must all be clear.
    pub fn set_run(&mut self, start: u64, count: u64) {
        assert!(start + count <= self.len, "run {start}+{count} out of range {}", self.len);
        for i in start..start + count {
            let (w, b) = ((i / 64) as usize, i % 64);
            assert!(self.words[w] & (1 << b) == 0, "bit {i} already set");
            self.words[w] |= 1 << b;
        }
        self.used += count;
    }

    /// Clears bits `start..start + count`, which must all be set.
    pub fn clear_run(&mut self, start: u64, count: u64) {
        assert!(start + count <= self.len, "run {start}+{count} out of range {}", self.len);
        for i in start..start + count {
            let (w, b) = ((i / 64) as usize, i % 64);
            assert!(self.words[w] & (1 << b) != 0, "bit {i} already clear");
            self.words[w] &= !(1 << b);
        }
        self.used -= count;
        // Reuse holes before fresh space: keeps a zone compact.
        self.cursor = self.cursor.min(start);
    }

    /// Allocates one bit; `None` when full.
    pub fn alloc(&mut self) -> Option<u64> {
        self.alloc_run(1)
    }

    /// Allocates `count` contiguous bits (first fit from the cursor, wrapping once);
    /// `None` when no free run is long enough.
    pub fn alloc_run(&mut self, count: u64) -> Option<u64> {
        assert!(count > 0, "empty run");
        if count > self.free() {
            return None;
        }
        let start = self
            .find_run(self.cursor, self.len, count)
            .or_else(|| self.find_run(0, (self.cursor + count - 1).min(self.len), count))?;
        self.set_run(start, count);
        self.cursor = if start + count >= self.len { 0 } else { start + count };
        Some(start)
    }

    /// First run of `count` clear bits starting in `from..to`.
    fn find_run(&self, from: u64, to: u64, count: u64) -> Option<u64> {
        let mut i = from;
        let mut run_start = from;
        let mut run_len = 0;
        while i < self.len && (run_len > 0 || i < to) {
            let (w, b) = ((i / 64) as usize, i % 64);
            let word = self.words[w];
            if b == 0 && word == u64::MAX {
                run_len = 0;
                i += 64;
                run_start = i;
                continue;
            }
            if b == 0 && word == 0 && run_len + 64 < count {
                run_len += 64;
                i += 64;
                continue;
            }
            if word & (1 << b) == 0 {
                if run_len == 0 {
                    run_start = i;
                }
                run_len += 1;
                if run_len == count {
                    return Some(run_start);
                }
            } else {
                run_len = 0;
            }
            i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn runs_are_contiguous_and_exclusive() {
        let mut b = Bitmap::new(200);
        let a = b.alloc_run(70).unwrap();
        let c = b.alloc_run(70).unwrap();
        assert!(a + 70 <= c || c + 70 <= a);
        assert_eq!(b.used(), 140);
        assert_eq!(b.alloc_run(61), None, "only 60 bits left");
        b.clear_run(a, 70);
        assert_eq!(b.alloc_run(65), Some(a), "freed run reused after wrap");
    }

    #[test]
    fn full_bitmap_says_none() {
        let mut b = Bitmap::new(3);
        assert!(b.alloc().is_some() && b.alloc().is_some() && b.alloc().is_some());
        assert_eq!(b.alloc(), None);
        assert_eq!(b.free(), 0);
    }

    proptest! {
        #[test]
        fn matches_a_set_model(ops in proptest::collection::vec((any::<bool>(), 1u64..20), 1..200)) {
            let mut b = Bitmap::new(300);
            let mut model: BTreeSet<u64> = BTreeSet::new();
            let mut runs: Vec<(u64, u64)> = Vec::new();
            for (alloc, n) in ops {
                if alloc || runs.is_empty() {
                    match b.alloc_run(n) {
                        Some(s) => {
                            for i in s..s + n { prop_assert!(model.insert(i), "bit {} double-allocated", i); }
                            runs.push((s, n));
                        }
                        None => {
                            // No run of n free bits may exist in the model.
                            let free: Vec<u64> = (0..300).filter(|i| !model.contains(i)).collect();
                            let longest = free.windows(1).fold((0u64, 0u64, None::<u64>), |(best, cur, prev), w| {
                                let cur = if prev == Some(w[0].wrapping_sub(1)) { cur + 1 } else { 1 };
                                (best.max(cur), cur, Some(w[0]))
                            }).0;
                            prop_assert!(longest < n, "a run of {} was free but alloc_run({}) failed", longest, n);
                        }
                    }
                } else {
                    let (s, n) = runs.swap_remove(n as usize % runs.len());
                    b.clear_run(s, n);
                    for i in s..s + n { model.remove(&i); }
                }
                prop_assert_eq!(b.used(), model.len() as u64);
            }
        }
    }
}
