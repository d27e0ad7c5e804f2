//! The three node kinds of a cART tree (Node16, Node64, Node256) and the slot encoding.
//!
//! A *slot* is the `u64` a node keeps per child key byte. The top bit tells the two
//! kinds of slot apart (leaf compression): clear = the slot *is* the dentry value
//! (pfs values are inode numbers or inode offsets, always `< 2^63`); set = the slot
//! points to a child node (`kind << 32 | index` below the tag).
//!
//! Node16 and Node64 keep `N` sorted key bytes and `N` slots. The compressed prefix
//! lives at the *end* of the slot array viewed as `N * 8` bytes, end-aligned: the last
//! prefix byte is the last byte of the array. Children occupy slots `0..count`, so the
//! invariant is `count * 8 + prefix_len <= N * 8`. Because the prefix is end-aligned,
//! dropping its front (what a node split does to the old node) only lowers the length.
//! Node256 is indexed directly by the key byte, so it has no free tail; it keeps a
//! small end-aligned inline prefix instead.

/// Top bit of a slot: set for child pointers, clear for leaf values.
pub(crate) const CHILD_TAG: u64 = 1 << 63;
/// Largest value a leaf can hold (values must leave the tag bit clear).
pub const MAX_VALUE: u64 = CHILD_TAG - 1;
/// An unused slot in a Node256 (tag set, invalid kind).
pub(crate) const EMPTY_SLOT: u64 = u64::MAX;
/// Longest prefix one node stores (file names are at most 255 bytes).
pub(crate) const PREFIX_MAX: usize = 255;
/// Inline prefix bytes of a Node256.
pub(crate) const N256_PREFIX: usize = 24;

/// Which node size a [`NodeRef`] points to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    N16 = 0,
    N64 = 1,
    N256 = 2,
}

/// A node in the arena: its kind and its index in that kind's pool.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct NodeRef {
    pub kind: Kind,
    pub idx: u32,
}

impl NodeRef {
    /// The slot value that points to this node.
    pub fn encode(self) -> u64 {
        CHILD_TAG | ((self.kind as u64) << 32) | u64::from(self.idx)
    }
}

/// A decoded slot.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Slot {
    Leaf(u64),
    Node(NodeRef),
}

impl Slot {
    /// Decodes a non-empty slot.
    pub fn decode(raw: u64) -> Slot {
        assert!(raw != EMPTY_SLOT, "decoding an empty slot");
        if raw & CHILD_TAG == 0 {
            return Slot::Leaf(raw);
        }
        let kind = match (raw >> 32) & 0x7fff_ffff {
            0 => Kind::N16,
            1 => Kind::N64,
            2 => Kind::N256,
            k => panic!("corrupt cART slot kind {k}"),
        };
        Slot::Node(NodeRef { kind, idx: raw as u32 })
    }
}

/// Operations every node kind supports; the tree code is written against this.
pub(crate) trait Inner {
    /// Number of children.
    fn count(&self) -> usize;
    /// Length of the compressed prefix.
    fn plen(&self) -> usize;
    /// Longest prefix the node could hold if it had `count` children.
    fn room_for(&self, count: usize) -> usize;
    /// Byte `i` of the prefix.
    fn prefix_byte(&self, i: usize) -> u8;
    /// Replaces the prefix; it must fit the current room.
    fn write_prefix(&mut self, p: &[u8]);
    /// Drops the first `k` prefix bytes (just a length change: the prefix is end-aligned).
    fn drop_prefix_front(&mut self, k: usize);
    /// Slot for key byte `b`, if present.
    fn find(&self, b: u8) -> Option<u64>;
    /// Overwrites the slot of an existing key byte.
    fn set(&mut self, b: u8, slot: u64);
    /// Adds a new key byte; there must be capacity and room.
    fn add(&mut self, b: u8, slot: u64);
    /// Removes an existing key byte.
    fn remove(&mut self, b: u8);
    /// Cursor of the first key `>= b`.
    fn seek(&self, b: u8) -> usize;
    /// Entry at or after `cursor`, and the cursor after it.
    fn next(&self, cursor: usize) -> Option<(usize, u8, u64)>;

    /// Current room for the prefix.
    fn room(&self) -> usize {
        self.room_for(self.count())
    }
}

/// Node16 / Node64: `N` sorted keys, `N` slots, prefix in the free tail of the slots.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeN<const N: usize> {
    keys: [u8; N],
    vals: [u64; N],
    count: u8,
    plen: u8,
}

/// A node with up to 16 children, searched with SSE2.
pub(crate) type Node16 = NodeN<16>;
/// A node with up to 64 children, searched 16 keys at a time.
pub(crate) type Node64 = NodeN<64>;

impl<const N: usize> NodeN<N> {
    const CAP_BYTES: usize = N * 8;
    /// An empty node without prefix.
    pub const EMPTY: Self = NodeN { keys: [0; N], vals: [0; N], count: 0, plen: 0 };

    fn byte(&self, j: usize) -> u8 {
        (self.vals[j / 8] >> ((j % 8) * 8)) as u8
    }

    fn set_byte(&mut self, j: usize, b: u8) {
        let shift = (j % 8) * 8;
        let w = &mut self.vals[j / 8];
        *w = (*w & !(0xff << shift)) | (u64::from(b) << shift);
    }

    fn pos(&self, b: u8) -> Option<usize> {
        find_key(&self.keys, self.count as usize, b)
    }
}

impl<const N: usize> Inner for NodeN<N> {
    fn count(&self) -> usize {
        self.count as usize
    }

    fn plen(&self) -> usize {
        self.plen as usize
    }

    fn room_for(&self, count: usize) -> usize {
        assert!(count <= N);
        ((N - count) * 8).min(PREFIX_MAX)
    }

    fn prefix_byte(&self, i: usize) -> u8 {
        assert!(i < self.plen());
        self.byte(Self::CAP_BYTES - self.plen() + i)
    }

    fn write_prefix(&mut self, p: &[u8]) {
        assert!(p.len() <= self.room(), "prefix of {} bytes does not fit", p.len());
        let start = Self::CAP_BYTES - p.len();
        for (i, &b) in p.iter().enumerate() {
            self.set_byte(start + i, b);
        }
        self.plen = p.len() as u8;
    }

    fn drop_prefix_front(&mut self, k: usize) {
        assert!(k <= self.plen());
        self.plen -= k as u8;
    }

    fn find(&self, b: u8) -> Option<u64> {
        self.pos(b).map(|p| self.vals[p])
    }

    fn set(&mut self, b: u8, slot: u64) {
        let p = self.pos(b).expect("set on a missing key");
        self.vals[p] = slot;
    }

    fn add(&mut self, b: u8, slot: u64) {
        let count = self.count();
        assert!(count < N, "add to a full node");
        assert!((count + 1) * 8 + self.plen() <= Self::CAP_BYTES, "add would overwrite the prefix");
        let p = self.seek(b);
        assert!(p == count || self.keys[p] != b, "add of an existing key");
        self.keys.copy_within(p..count, p + 1);
        self.vals.copy_within(p..count, p + 1);
        self.keys[p] = b;
        self.vals[p] = slot;
        self.count += 1;
    }

    fn remove(&mut self, b: u8) {
        let p = self.pos(b).expect("remove of a missing key");
        let count = self.count();
        self.keys.copy_within(p + 1..count, p);
        self.vals.copy_within(p + 1..count, p);
        self.count -= 1;
    }

    fn seek(&self, b: u8) -> usize {
        self.keys[..self.count()].partition_point(|&k| k < b)
    }

    fn next(&self, cursor: usize) -> Option<(usize, u8, u64)> {
        (cursor < self.count()).then(|| (cursor + 1, self.keys[cursor], self.vals[cursor]))
    }
}

/// Position of `b` among the first `count` keys, 16 keys per SSE2 compare.
#[cfg(target_arch = "x86_64")]
fn find_key<const N: usize>(keys: &[u8; N], count: usize, b: u8) -> Option<usize> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    const { assert!(N % 16 == 0) };
    assert!(count <= N);
    let mut base = 0;
    while base < count {
        // SAFETY: SSE2 is part of the x86_64 baseline. `base < count <= N` and `N` is a
        // multiple of 16, so the unaligned 16-byte load stays inside `keys`.
        let hits = unsafe {
            let v = _mm_loadu_si128(keys.as_ptr().add(base).cast::<__m128i>());
            _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b as i8))) as u32
        };
        let valid = count - base;
        let hits = if valid < 16 { hits & ((1u32 << valid) - 1) } else { hits };
        if hits != 0 {
            return Some(base + hits.trailing_zeros() as usize);
        }
        base += 16;
    }
    None
}

/// Position of `b` among the first `count` keys (portable fallback).
#[cfg(not(target_arch = "x86_64"))]
fn find_key<const N: usize>(keys: &[u8; N], count: usize, b: u8) -> Option<usize> {
    keys[..count].iter().position(|&k| k == b)
}

/// Node256: slots indexed directly by key byte, `EMPTY_SLOT` where absent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node256 {
    vals: [u64; 256],
    prefix: [u8; N256_PREFIX],
    count: u16,
    plen: u8,
}

impl Node256 {
    /// An empty node without prefix.
    pub const EMPTY: Self =
        Node256 { vals: [EMPTY_SLOT; 256], prefix: [0; N256_PREFIX], count: 0, plen: 0 };
}

impl Inner for Node256 {
    fn count(&self) -> usize {
        self.count as usize
    }

    fn plen(&self) -> usize {
        self.plen as usize
    }

    fn room_for(&self, _count: usize) -> usize {
        N256_PREFIX
    }

    fn prefix_byte(&self, i: usize) -> u8 {
        assert!(i < self.plen());
        self.prefix[N256_PREFIX - self.plen() + i]
    }

    fn write_prefix(&mut self, p: &[u8]) {
        assert!(p.len() <= N256_PREFIX, "prefix of {} bytes does not fit", p.len());
        self.prefix[N256_PREFIX - p.len()..].copy_from_slice(p);
        self.plen = p.len() as u8;
    }

    fn drop_prefix_front(&mut self, k: usize) {
        assert!(k <= self.plen());
        self.plen -= k as u8;
    }

    fn find(&self, b: u8) -> Option<u64> {
        let v = self.vals[b as usize];
        (v != EMPTY_SLOT).then_some(v)
    }

    fn set(&mut self, b: u8, slot: u64) {
        assert!(self.vals[b as usize] != EMPTY_SLOT && slot != EMPTY_SLOT);
        self.vals[b as usize] = slot;
    }

    fn add(&mut self, b: u8, slot: u64) {
        assert!(self.vals[b as usize] == EMPTY_SLOT && slot != EMPTY_SLOT);
        self.vals[b as usize] = slot;
        self.count += 1;
    }

    fn remove(&mut self, b: u8) {
        assert!(self.vals[b as usize] != EMPTY_SLOT);
        self.vals[b as usize] = EMPTY_SLOT;
        self.count -= 1;
    }

    fn seek(&self, b: u8) -> usize {
        b as usize
    }

    fn next(&self, cursor: usize) -> Option<(usize, u8, u64)> {
        let rest = self.vals.get(cursor..)?;
        let off = rest.iter().position(|&v| v != EMPTY_SLOT)?;
        let key = cursor + off;
        Some((key + 1, key as u8, self.vals[key]))
    }
}
