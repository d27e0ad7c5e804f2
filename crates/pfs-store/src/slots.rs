//! Tables keyed by inode number, split into [`SPLIT`] hash tables by the
//! number's low bits: the inode table of a shard (inode number -> inode
//! slot), its extended attributes, and cART's table of directories
//! (`cart/mod.rs`).
//!
//! A hash table grows by rehashing every entry at once when it is 7/8 full:
//! one table of a million inodes stopped the create that grew it for 26 ms
//! (`cargo bench --bench checkpoint` with a million files, docs/benchmarks.md
//! twenty-seventh session), and a shard of ten million would stop for ten
//! times that. Split, each growth moves a 64th of the entries, and the parts
//! grow at different creates. Inode numbers of a shard are handed out in
//! sequence, so the low bits spread them evenly over the parts.

use std::ops::Index;

use pfs_core::hash::NumMap;
use pfs_core::InodeId;

/// Parts of a table.
pub const SPLIT: usize = 64;

/// Inode number -> value, in [`SPLIT`] parts.
#[derive(Clone, Debug)]
pub struct SplitMap<V> {
    parts: Vec<NumMap<InodeId, V>>,
    len: usize,
}

/// Inode number -> slot.
pub type InodeTable = SplitMap<u64>;

impl<V> Default for SplitMap<V> {
    fn default() -> Self {
        SplitMap { parts: (0..SPLIT).map(|_| NumMap::default()).collect(), len: 0 }
    }
}

impl<V> SplitMap<V> {
    fn part(ino: &InodeId) -> usize {
        (ino.0 as usize) & (SPLIT - 1)
    }

    /// The value of `ino`.
    pub fn get(&self, ino: &InodeId) -> Option<&V> {
        self.parts[Self::part(ino)].get(ino)
    }

    /// The value of `ino`, to change.
    pub fn get_mut(&mut self, ino: &InodeId) -> Option<&mut V> {
        self.parts[Self::part(ino)].get_mut(ino)
    }

    /// Whether `ino` is here.
    pub fn contains_key(&self, ino: &InodeId) -> bool {
        self.parts[Self::part(ino)].contains_key(ino)
    }

    /// Sets the value of `ino`; returns the old one.
    pub fn insert(&mut self, ino: InodeId, value: V) -> Option<V> {
        let old = self.parts[Self::part(&ino)].insert(ino, value);
        self.len += usize::from(old.is_none());
        old
    }

    /// The value of `ino`, made with `V::default()` if it has none.
    pub fn get_or_default(&mut self, ino: InodeId) -> &mut V
    where
        V: Default,
    {
        let part = &mut self.parts[(ino.0 as usize) & (SPLIT - 1)];
        if !part.contains_key(&ino) {
            self.len += 1;
        }
        part.entry(ino).or_default()
    }

    /// Removes `ino`; returns its value.
    pub fn remove(&mut self, ino: &InodeId) -> Option<V> {
        let old = self.parts[Self::part(ino)].remove(ino);
        self.len -= usize::from(old.is_some());
        old
    }

    /// Entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every inode and its value, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&InodeId, &V)> {
        self.parts.iter().flat_map(|p| p.iter())
    }

    /// Every inode, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &InodeId> {
        self.parts.iter().flat_map(|p| p.keys())
    }

    /// The inodes of part `part` (below [`SPLIT`]), in no particular order:
    /// a checkpoint lists one part per slice.
    pub fn part_keys(&self, part: usize) -> impl Iterator<Item = InodeId> + '_ {
        self.parts[part].keys().copied()
    }

    /// Bytes of the parts' tables (hashbrown: a slot and a control byte per
    /// bucket, and a group of control bytes).
    pub fn heap_bytes(&self) -> usize {
        self.parts
            .iter()
            .filter(|p| p.capacity() > 0)
            .map(|p| {
                let buckets = (p.capacity() * 8 / 7).next_power_of_two();
                buckets * (size_of::<(InodeId, V)>() + 1) + 16
            })
            .sum()
    }

    /// Entries the parts have room for without growing, per part.
    #[cfg(test)]
    fn capacities(&self) -> Vec<usize> {
        self.parts.iter().map(|p| p.capacity()).collect()
    }
}

impl<V> Index<&InodeId> for SplitMap<V> {
    type Output = V;

    fn index(&self, ino: &InodeId) -> &V {
        self.get(ino).expect("an inode of the table")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::ShardId;
    use std::collections::HashMap;

    /// The table answers as one map would, and an insert never grows more
    /// than one part: a growth rehashes a 64th of the inodes at most.
    #[test]
    fn answers_as_one_map_and_grows_a_part_at_a_time() {
        let mut t = InodeTable::default();
        let mut model = HashMap::new();
        let ino = |n: u64| InodeId::compose(ShardId(3), n);
        for n in 1..50_000u64 {
            let before = t.capacities();
            assert_eq!(t.insert(ino(n), n * 7), model.insert(ino(n), n * 7));
            let grew = before.iter().zip(t.capacities()).filter(|(a, b)| **a != *b).count();
            assert!(grew <= 1, "insert {n} grew {grew} parts");
            if n % 3 == 0 {
                assert_eq!(t.remove(&ino(n / 3)), model.remove(&ino(n / 3)));
            }
        }
        assert_eq!(t.len(), model.len());
        for n in 0..50_001u64 {
            assert_eq!(t.get(&ino(n)), model.get(&ino(n)), "{n}");
            assert_eq!(t.contains_key(&ino(n)), model.contains_key(&ino(n)));
        }
        let mut listed: Vec<(InodeId, u64)> = t.iter().map(|(i, s)| (*i, *s)).collect();
        listed.sort();
        let mut expected: Vec<(InodeId, u64)> = model.into_iter().collect();
        expected.sort();
        assert_eq!(listed, expected);
        assert_eq!(t.keys().count(), t.len());
        // `get_or_default` counts what it makes, and only that.
        let len = t.len();
        *t.get_or_default(ino(60_000)) += 5;
        *t.get_or_default(ino(60_000)) += 5;
        assert_eq!((t.len(), t.get(&ino(60_000))), (len + 1, Some(&10)));
        let listed: usize = (0..SPLIT).map(|p| t.part_keys(p).count()).sum();
        assert_eq!(listed, t.len(), "the parts list every key once");
        // The parts share the inodes evenly.
        let sizes: Vec<usize> = t.parts.iter().map(|p| p.len()).collect();
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(max - min <= max / 10, "{sizes:?}");
    }
}
