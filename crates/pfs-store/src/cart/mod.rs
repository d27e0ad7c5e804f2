//! cART: the compact dentry index of PeakFS (§III-C2), `(parent ino, name) -> u64`.
//!
//! A hash table maps each directory's inode to the root of its own adaptive radix tree
//! keyed by the file name bytes. The trees use:
//! - three node sizes, Node16 / Node64 / Node256, whose key arrays are as large as the
//!   node (Node16 searched with one SSE2 compare), growing 16 -> 64 -> 256 on insert and
//!   shrinking back on remove ([`node`]);
//! - prefix compression, with the prefix stored end-aligned in the free tail of the slot
//!   array (node consolidation: a split only shortens the old node's prefix length);
//!   prefixes too long for that room are chained through single-child Node16s ([`tree`]);
//! - leaf compression: values live in the parent's slot array, told apart from child
//!   pointers by the top bit, so values must be below 2^63 ([`MAX_VALUE`]);
//! - merging on remove: emptied nodes are freed and single-child nodes fold back into
//!   their child's prefix.
//!
//! Nodes live in chunked pools indexed by `u32` with free lists ([`arena`]); there is
//! no `unsafe` except the SSE2 intrinsics.

mod arena;
mod iter;
mod node;
mod tree;

#[cfg(test)]
mod tests;

pub use node::MAX_VALUE;

use pfs_core::InodeId;

use crate::slots::SplitMap;
use arena::Arena;
use node::{NodeRef, Slot};

/// Longest file name, in bytes.
pub const NAME_LEN_MAX: usize = 255;

/// The dentry index of one shard: for each directory, its entries by name.
pub struct Cart {
    /// Each directory's tree, split by the directory's inode number
    /// (`slots.rs`): a growth moves a 64th of the directories.
    roots: SplitMap<Root>,
    arena: Arena,
    entry_count: usize,
}

/// One directory's tree and its entry count (kept so `child_count` is O(1)).
#[derive(Clone, Copy, Debug)]
struct Root {
    node: NodeRef,
    entry_count: u32,
}

impl Cart {
    /// An empty index (its table of directories: 64 empty parts).
    pub fn new() -> Cart {
        Cart { roots: SplitMap::default(), arena: Arena::new(), entry_count: 0 }
    }

    /// Sets `parent/name` to `value` (`value <= MAX_VALUE`); returns the old value.
    pub fn insert(&mut self, parent: InodeId, name: &[u8], value: u64) -> Option<u64> {
        check_name(name);
        assert!(value <= MAX_VALUE, "cART value {value:#x} uses the reserved top bit");
        let Some(root) = self.roots.get_mut(&parent) else {
            let top = self.arena.new_path(name, value);
            let Slot::Node(node) = Slot::decode(top) else { unreachable!("names are non-empty") };
            self.roots.insert(parent, Root { node, entry_count: 1 });
            self.entry_count += 1;
            return None;
        };
        let mut old = None;
        let top = self.arena.insert_at(root.node, name, value, &mut old);
        let Slot::Node(node) = Slot::decode(top) else { unreachable!("a root is a node") };
        root.node = node;
        if old.is_none() {
            root.entry_count += 1;
            self.entry_count += 1;
        }
        old
    }

    /// Value of `parent/name`.
    pub fn get(&self, parent: InodeId, name: &[u8]) -> Option<u64> {
        check_name(name);
        let root = self.roots.get(&parent)?;
        self.arena.lookup(root.node, name)
    }

    /// Removes `parent/name`; returns its value.
    pub fn remove(&mut self, parent: InodeId, name: &[u8]) -> Option<u64> {
        check_name(name);
        let root = self.roots.get_mut(&parent)?;
        let (old, top) = self.arena.remove_at(root.node, name, true)?;
        self.entry_count -= 1;
        match top {
            None => {
                assert!(root.entry_count == 1);
                self.roots.remove(&parent);
            }
            Some(top) => {
                let Slot::Node(node) = Slot::decode(top) else { unreachable!("a root is a node") };
                root.node = node;
                root.entry_count -= 1;
            }
        }
        Some(old)
    }

    /// Number of entries in directory `parent`, in O(1).
    pub fn child_count(&self, parent: InodeId) -> usize {
        self.roots.get(&parent).map_or(0, |r| r.entry_count as usize)
    }

    /// Visits entries of `parent` with name > `after` (all if None) in ascending byte order until `f` returns false.
    pub fn for_each_from(
        &self,
        parent: InodeId,
        after: Option<&[u8]>,
        mut f: impl FnMut(&[u8], u64) -> bool,
    ) {
        let Some(root) = self.roots.get(&parent) else { return };
        let after = after.map(|a| &a[..a.len().min(NAME_LEN_MAX)]);
        let mut buf = [0u8; 256];
        self.arena.visit(root.node, &mut buf, 0, after, &mut f);
    }

    /// Total number of entries.
    pub fn len(&self) -> usize {
        self.entry_count
    }

    /// True if there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entry_count == 0
    }

    /// Directories that have entries, in no particular order.
    pub fn parents(&self) -> impl Iterator<Item = InodeId> + '_ {
        self.roots.keys().copied()
    }

    /// The directories with entries of part `part` of the table (below
    /// `slots::SPLIT`), in no particular order: a checkpoint lists one part
    /// per slice.
    pub fn part_parents(&self, part: usize) -> impl Iterator<Item = InodeId> + '_ {
        self.roots.part_keys(part)
    }

    /// Bytes allocated by the index (node pools, free lists, root table).
    pub fn heap_bytes(&self) -> usize {
        self.roots.heap_bytes() + self.arena.heap_bytes()
    }

    /// Live nodes per kind (Node16, Node64, Node256), for tests and statistics.
    pub fn node_counts(&self) -> [usize; 3] {
        self.arena.live()
    }
}

impl Default for Cart {
    fn default() -> Self {
        Cart::new()
    }
}

impl std::fmt::Debug for Cart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cart")
            .field("len", &self.entry_count)
            .field("directories", &self.roots.len())
            .field("nodes", &self.arena.live())
            .field("heap_bytes", &self.heap_bytes())
            .finish()
    }
}

/// Names come from the metadata layer, which validated them; a bad one here is a bug.
fn check_name(name: &[u8]) {
    assert!(
        !name.is_empty() && name.len() <= NAME_LEN_MAX,
        "file name of {} bytes (must be 1..={NAME_LEN_MAX})",
        name.len()
    );
    assert!(!name.contains(&0), "file name contains NUL");
}
