//! Lookup, insert and remove in one directory's tree.
//!
//! Key semantics: a name is its bytes followed by an implicit 0 terminator (names never
//! contain NUL). A leaf in the slot of key byte `b != 0` of node `n` stands for the name
//! `path(n) + b` (the terminator after `b` is implicit: leaf compression without a
//! terminator node); a leaf under key byte 0 stands for `path(n)`. The explicit 0 key is
//! only needed when one name is a proper prefix of another (`"a.1"` and `"a.10"`).
//! A key byte 0 always holds a leaf.
//!
//! Long prefixes: a node's prefix is limited by the free tail of its slot array. When a
//! prefix does not fit (a new node, a node gaining a child, a Node64 shrinking to a
//! Node16), its *front* moves into a chain of new single-child Node16s (up to 120 prefix
//! bytes each) above the node; the node keeps the end-aligned tail, so it only changes
//! its prefix length.

use super::arena::Arena;
use super::node::{Kind, NodeRef, Slot};

/// A Node256 shrinks to a Node64 at this many children.
const N256_SHRINK_AT: usize = 40;
/// A Node64 shrinks to a Node16 at this many children.
const N64_SHRINK_AT: usize = 12;

/// Scratch buffer for one prefix or name (names are at most 255 bytes).
type KeyBuf = [u8; 256];

impl Arena {
    /// Value of `key` in the tree rooted at `root`.
    pub fn lookup(&self, root: NodeRef, key: &[u8]) -> Option<u64> {
        let mut r = root;
        let mut key = key;
        loop {
            let plen = self.plen(r);
            if key.len() < plen || self.common_prefix(r, key) != plen {
                return None;
            }
            let rest = &key[plen..];
            let b = rest.first().copied().unwrap_or(0);
            match Slot::decode(self.find(r, b)?) {
                Slot::Leaf(v) => return (rest.len() <= 1).then_some(v),
                Slot::Node(child) => {
                    assert!(b != 0, "key byte 0 must hold a leaf");
                    r = child;
                    key = &rest[1..];
                }
            }
        }
    }

    /// A new subtree holding exactly `key -> leaf` below a parent key byte
    /// (`key` empty: the leaf itself).
    pub fn new_path(&mut self, key: &[u8], leaf: u64) -> u64 {
        self.wrap(key, leaf)
    }

    /// Puts `bytes` in front of the subtree `child`: a Node16 with key `bytes[last]`
    /// and prefix `bytes[..last]`, chained further if the prefix does not fit.
    fn wrap(&mut self, bytes: &[u8], child: u64) -> u64 {
        let Some((&last, front)) = bytes.split_last() else { return child };
        let n = self.alloc(Kind::N16);
        self.add(n, last, child);
        self.set_prefix_fit(n, front)
    }

    /// Gives `r` the prefix `bytes`, keeping the tail that fits and chaining the front.
    /// Returns the slot of the topmost node.
    fn set_prefix_fit(&mut self, r: NodeRef, bytes: &[u8]) -> u64 {
        let room = self.room_for(r, self.count(r));
        if bytes.len() <= room {
            self.write_prefix(r, bytes);
            return r.encode();
        }
        let cut = bytes.len() - room;
        self.write_prefix(r, &bytes[cut..]);
        self.wrap(&bytes[..cut], r.encode())
    }

    /// Shortens the prefix of `r` to its last `keep` bytes, moving the front into a chain.
    fn trim_prefix(&mut self, r: NodeRef, keep: usize) -> u64 {
        let mut buf: KeyBuf = [0; 256];
        let plen = self.copy_prefix(r, &mut buf);
        if plen <= keep {
            return r.encode();
        }
        let cut = plen - keep;
        self.drop_prefix_front(r, cut);
        self.wrap(&buf[..cut], r.encode())
    }

    /// Inserts `key -> value` below `r`; returns the slot that now stands for `r`.
    pub fn insert_at(&mut self, r: NodeRef, key: &[u8], value: u64, old: &mut Option<u64>) -> u64 {
        let plen = self.plen(r);
        let m = self.common_prefix(r, key);
        if m < plen {
            return self.split(r, m, key, value);
        }
        let rest = &key[plen..];
        let b = rest.first().copied().unwrap_or(0);
        let Some(slot) = self.find(r, b) else {
            let child = if rest.is_empty() { value } else { self.new_path(&rest[1..], value) };
            return self.add_child(r, b, child);
        };
        match Slot::decode(slot) {
            Slot::Leaf(v) if rest.len() <= 1 => {
                self.set(r, b, value);
                *old = Some(v);
            }
            Slot::Leaf(v) => {
                // The leaf is `path + b`; the new name continues after `b`.
                let c = self.alloc(Kind::N16);
                self.add(c, 0, v);
                let tail = self.new_path(&rest[2..], value);
                self.add(c, rest[1], tail);
                self.set(r, b, c.encode());
            }
            Slot::Node(child) => {
                assert!(b != 0, "key byte 0 must hold a leaf");
                let new = self.insert_at(child, &rest[1..], value, old);
                if new != slot {
                    self.set(r, b, new);
                    // A child that grew may now have room for this chain node's prefix.
                    if let Some(folded) = self.fold_single_child(r) {
                        return folded;
                    }
                }
            }
        }
        r.encode()
    }

    /// The prefix of `r` and `key` differ at byte `m`: a new Node16 takes the common
    /// part and `r` keeps the part after the differing byte (a length change only).
    fn split(&mut self, r: NodeRef, m: usize, key: &[u8], value: u64) -> u64 {
        let mut buf: KeyBuf = [0; 256];
        let plen = self.copy_prefix(r, &mut buf);
        assert!(m < plen);
        self.drop_prefix_front(r, m + 1);
        let below = self.collapse_lone_terminator(r);
        let p = self.alloc(Kind::N16);
        self.add(p, buf[m], below);
        if m == key.len() {
            self.add(p, 0, value);
        } else {
            assert!(key[m] != buf[m]);
            let child = self.new_path(&key[m + 1..], value);
            self.add(p, key[m], child);
        }
        self.set_prefix_fit(p, &buf[..m])
    }

    /// Path compression: a node with one child node folds into that child (its
    /// prefix, key byte and the child's prefix become the child's prefix) when the
    /// child has room. Returns the child's slot if it folded.
    fn fold_single_child(&mut self, r: NodeRef) -> Option<u64> {
        if self.count(r) != 1 {
            return None;
        }
        let (_, b, slot) = self.node(r).next(0).expect("one child");
        let Slot::Node(child) = Slot::decode(slot) else { return None };
        let total = self.plen(r) + 1 + self.plen(child);
        if total > self.room_for(child, self.count(child)) {
            return None;
        }
        let mut buf: KeyBuf = [0; 256];
        let n = self.copy_prefix(r, &mut buf);
        buf[n] = b;
        self.copy_prefix(child, &mut buf[n + 1..]);
        self.write_prefix(child, &buf[..total]);
        self.free(r);
        Some(child.encode())
    }

    /// A non-root node left with no prefix and only a terminator leaf stands for
    /// nothing but that leaf: free it and return the leaf for the parent's slot.
    fn collapse_lone_terminator(&mut self, r: NodeRef) -> u64 {
        if self.count(r) == 1 && self.plen(r) == 0 {
            let (_, b, slot) = self.node(r).next(0).expect("one child");
            if let (0, Slot::Leaf(v)) = (b, Slot::decode(slot)) {
                self.free(r);
                return v;
            }
        }
        r.encode()
    }

    /// Adds key byte `b` to `r`, growing it or moving its prefix front out when there is
    /// no space. Returns the slot that now stands for `r`.
    fn add_child(&mut self, r: NodeRef, b: u8, child: u64) -> u64 {
        let count = self.count(r);
        let full = match r.kind {
            Kind::N16 => count == 16,
            Kind::N64 => count == 64,
            Kind::N256 => false,
        };
        if full {
            let kind = if r.kind == Kind::N16 { Kind::N64 } else { Kind::N256 };
            // A full Node16/Node64 has no room left for a prefix.
            assert!(self.plen(r) == 0);
            let new = self.convert(r, kind);
            self.add(new, b, child);
            return new.encode();
        }
        let top = self.trim_prefix(r, self.room_for(r, count + 1));
        self.add(r, b, child);
        top
    }

    /// Removes `key` below `r`. Returns the old value and the slot that now stands for
    /// `r` (`None`: `r` became empty and was freed).
    pub fn remove_at(
        &mut self,
        r: NodeRef,
        key: &[u8],
        is_root: bool,
    ) -> Option<(u64, Option<u64>)> {
        let plen = self.plen(r);
        if key.len() < plen || self.common_prefix(r, key) != plen {
            return None;
        }
        let rest = &key[plen..];
        let b = rest.first().copied().unwrap_or(0);
        let slot = self.find(r, b)?;
        match Slot::decode(slot) {
            Slot::Leaf(v) if rest.len() <= 1 => {
                self.remove(r, b);
                Some((v, self.after_remove(r, is_root)))
            }
            Slot::Leaf(_) => None,
            Slot::Node(child) => {
                assert!(b != 0, "key byte 0 must hold a leaf");
                let (v, new) = self.remove_at(child, &rest[1..], false)?;
                match new {
                    None => {
                        self.remove(r, b);
                        Some((v, self.after_remove(r, is_root)))
                    }
                    Some(s) => {
                        if s != slot {
                            self.set(r, b, s);
                        }
                        Some((v, Some(r.encode())))
                    }
                }
            }
        }
    }

    /// Restores compactness after a child of `r` went away: frees an empty node, merges
    /// a single child node into its parent's place (path compression), turns a lone
    /// terminator leaf back into a leaf slot, and shrinks 256 -> 64 -> 16.
    fn after_remove(&mut self, r: NodeRef, is_root: bool) -> Option<u64> {
        let count = self.count(r);
        if count == 0 {
            self.free(r);
            return None;
        }
        if count == 1 {
            if let Some(folded) = self.fold_single_child(r) {
                return Some(folded);
            }
            let (_, b, slot) = self.node(r).next(0).expect("one child");
            if let Slot::Leaf(v) = Slot::decode(slot) {
                if b == 0 && self.plen(r) == 0 && !is_root {
                    self.free(r);
                    return Some(v);
                }
            }
        }
        let target = match r.kind {
            Kind::N256 if count <= N256_SHRINK_AT => Kind::N64,
            Kind::N64 if count <= N64_SHRINK_AT => Kind::N16,
            _ => return Some(r.encode()),
        };
        let mut buf: KeyBuf = [0; 256];
        let plen = self.copy_prefix(r, &mut buf);
        let new = self.convert(r, target);
        Some(self.set_prefix_fit(new, &buf[..plen]))
    }

    /// Checks the structural invariants of the tree at `r`; returns its entry count.
    #[cfg(test)]
    pub fn check(&self, r: NodeRef, is_root: bool) -> usize {
        let n = self.node(r);
        let count = n.count();
        assert!(count > 0, "empty node left in the tree");
        assert!(n.plen() <= n.room(), "prefix overlaps children");
        if !is_root && count == 1 {
            let (_, b, slot) = n.next(0).expect("one child");
            if let Slot::Leaf(_) = Slot::decode(slot) {
                assert!(b != 0 || n.plen() > 0, "lone terminator leaf not collapsed");
            }
        }
        match r.kind {
            Kind::N64 => assert!(count > N64_SHRINK_AT, "Node64 not shrunk"),
            Kind::N256 => assert!(count > N256_SHRINK_AT, "Node256 not shrunk"),
            Kind::N16 => {}
        }
        let mut total = 0;
        let mut cursor = 0;
        let mut last = None;
        while let Some((next, b, slot)) = n.next(cursor) {
            assert!(last < Some(b), "keys not ascending");
            last = Some(b);
            total += match Slot::decode(slot) {
                Slot::Leaf(_) => 1,
                Slot::Node(c) => {
                    assert!(b != 0, "key byte 0 must hold a leaf");
                    self.check(c, false)
                }
            };
            cursor = next;
        }
        total
    }
}
