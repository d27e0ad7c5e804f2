//! Node storage: one chunked pool per node kind, indexed by `u32`, with free lists.
//!
//! Pools grow by fixed ~64 KiB chunks instead of doubling a `Vec`, so a large index
//! wastes at most one chunk per kind rather than up to half its memory, and nodes never
//! move once allocated.

use super::node::{Inner, Kind, Node16, Node256, Node64, NodeRef};

/// Bytes a pool chunk aims for.
const CHUNK_BYTES_TARGET: usize = 64 * 1024;

/// A pool of nodes of one kind.
#[derive(Debug)]
pub(crate) struct Pool<T: Copy> {
    chunks: Vec<Box<[T]>>,
    /// log2 of nodes per chunk.
    shift: u32,
    /// High-water mark: indexes below it were handed out at least once.
    used: u32,
    free: Vec<u32>,
    empty: T,
}

impl<T: Copy> Pool<T> {
    fn new(empty: T) -> Self {
        let per_chunk = (CHUNK_BYTES_TARGET / size_of::<T>()).max(1);
        let shift = usize::BITS - 1 - per_chunk.leading_zeros();
        Pool { chunks: Vec::new(), shift, used: 0, free: Vec::new(), empty }
    }

    fn alloc(&mut self) -> u32 {
        if let Some(idx) = self.free.pop() {
            *self.get_mut(idx) = self.empty;
            return idx;
        }
        let idx = self.used;
        assert!(idx < u32::MAX >> 1, "cART pool exhausted");
        if (idx >> self.shift) as usize == self.chunks.len() {
            self.chunks.push(vec![self.empty; 1 << self.shift].into_boxed_slice());
        }
        self.used += 1;
        *self.get_mut(idx) = self.empty;
        idx
    }

    fn release(&mut self, idx: u32) {
        assert!(idx < self.used);
        self.free.push(idx);
    }

    fn get(&self, idx: u32) -> &T {
        &self.chunks[(idx >> self.shift) as usize][(idx & ((1 << self.shift) - 1)) as usize]
    }

    fn get_mut(&mut self, idx: u32) -> &mut T {
        let mask = (1 << self.shift) - 1;
        &mut self.chunks[(idx >> self.shift) as usize][(idx & mask) as usize]
    }

    fn live(&self) -> usize {
        self.used as usize - self.free.len()
    }

    fn heap_bytes(&self) -> usize {
        self.chunks.len() * (size_of::<T>() << self.shift)
            + self.chunks.capacity() * size_of::<Box<[T]>>()
            + self.free.capacity() * size_of::<u32>()
    }
}

/// All nodes of a [`super::Cart`].
#[derive(Debug)]
pub(crate) struct Arena {
    n16: Pool<Node16>,
    n64: Pool<Node64>,
    n256: Pool<Node256>,
}

/// Runs `$body` with `$n` bound to the node `$r` points to, whatever its kind.
macro_rules! with_node {
    ($arena:expr, $r:expr, |$n:ident| $body:expr) => {
        match $r.kind {
            Kind::N16 => {
                let $n = $arena.n16.get($r.idx);
                $body
            }
            Kind::N64 => {
                let $n = $arena.n64.get($r.idx);
                $body
            }
            Kind::N256 => {
                let $n = $arena.n256.get($r.idx);
                $body
            }
        }
    };
}

/// Like `with_node!`, mutably.
macro_rules! with_node_mut {
    ($arena:expr, $r:expr, |$n:ident| $body:expr) => {
        match $r.kind {
            Kind::N16 => {
                let $n = $arena.n16.get_mut($r.idx);
                $body
            }
            Kind::N64 => {
                let $n = $arena.n64.get_mut($r.idx);
                $body
            }
            Kind::N256 => {
                let $n = $arena.n256.get_mut($r.idx);
                $body
            }
        }
    };
}

impl Arena {
    /// An empty arena; allocates nothing until the first node.
    pub fn new() -> Self {
        Arena {
            n16: Pool::new(Node16::EMPTY),
            n64: Pool::new(Node64::EMPTY),
            n256: Pool::new(Node256::EMPTY),
        }
    }

    /// A new empty node of `kind`.
    pub fn alloc(&mut self, kind: Kind) -> NodeRef {
        let idx = match kind {
            Kind::N16 => self.n16.alloc(),
            Kind::N64 => self.n64.alloc(),
            Kind::N256 => self.n256.alloc(),
        };
        NodeRef { kind, idx }
    }

    /// Returns a node to its free list.
    pub fn free(&mut self, r: NodeRef) {
        match r.kind {
            Kind::N16 => self.n16.release(r.idx),
            Kind::N64 => self.n64.release(r.idx),
            Kind::N256 => self.n256.release(r.idx),
        }
    }

    /// Live nodes per kind (Node16, Node64, Node256).
    pub fn live(&self) -> [usize; 3] {
        [self.n16.live(), self.n64.live(), self.n256.live()]
    }

    /// Bytes allocated for nodes and free lists.
    pub fn heap_bytes(&self) -> usize {
        self.n16.heap_bytes() + self.n64.heap_bytes() + self.n256.heap_bytes()
    }

    /// Read access to a node through the [`Inner`] interface.
    pub fn node(&self, r: NodeRef) -> &dyn Inner {
        with_node!(self, r, |n| n as &dyn Inner)
    }

    /// Number of children of `r`.
    pub fn count(&self, r: NodeRef) -> usize {
        with_node!(self, r, |n| n.count())
    }

    /// Prefix length of `r`.
    pub fn plen(&self, r: NodeRef) -> usize {
        with_node!(self, r, |n| n.plen())
    }

    /// Copies the prefix of `r` into `out`; returns its length.
    pub fn copy_prefix(&self, r: NodeRef, out: &mut [u8]) -> usize {
        with_node!(self, r, |n| {
            let len = n.plen();
            for (i, o) in out[..len].iter_mut().enumerate() {
                *o = n.prefix_byte(i);
            }
            len
        })
    }

    /// Number of leading bytes of `key` that match the prefix of `r`.
    pub fn common_prefix(&self, r: NodeRef, key: &[u8]) -> usize {
        with_node!(self, r, |n| {
            let len = n.plen().min(key.len());
            (0..len).position(|i| n.prefix_byte(i) != key[i]).unwrap_or(len)
        })
    }

    /// Longest prefix `r` could hold with `count` children.
    pub fn room_for(&self, r: NodeRef, count: usize) -> usize {
        with_node!(self, r, |n| n.room_for(count))
    }

    /// Slot of key byte `b` in `r`.
    pub fn find(&self, r: NodeRef, b: u8) -> Option<u64> {
        with_node!(self, r, |n| n.find(b))
    }

    /// Replaces the prefix of `r`.
    pub fn write_prefix(&mut self, r: NodeRef, p: &[u8]) {
        with_node_mut!(self, r, |n| n.write_prefix(p))
    }

    /// Drops the first `k` prefix bytes of `r`.
    pub fn drop_prefix_front(&mut self, r: NodeRef, k: usize) {
        with_node_mut!(self, r, |n| n.drop_prefix_front(k))
    }

    /// Overwrites the slot of existing key byte `b`.
    pub fn set(&mut self, r: NodeRef, b: u8, slot: u64) {
        with_node_mut!(self, r, |n| n.set(b, slot))
    }

    /// Adds key byte `b`; `r` must have capacity and prefix room.
    pub fn add(&mut self, r: NodeRef, b: u8, slot: u64) {
        with_node_mut!(self, r, |n| n.add(b, slot))
    }

    /// Removes key byte `b`.
    pub fn remove(&mut self, r: NodeRef, b: u8) {
        with_node_mut!(self, r, |n| n.remove(b))
    }

    /// Moves the children of `r` into a new node of `kind` (without prefix: the caller
    /// copies it first), frees `r`, and returns the new node.
    pub fn convert(&mut self, r: NodeRef, kind: Kind) -> NodeRef {
        let new = self.alloc(kind);
        let mut cursor = 0;
        while let Some((next, b, slot)) = self.node(r).next(cursor) {
            self.add(new, b, slot);
            cursor = next;
        }
        self.free(r);
        new
    }
}
