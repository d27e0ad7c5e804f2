//! [`DmaBuf`]: zeroed, page-aligned memory that a memory registration maps.
//!
//! It never moves or grows, so a registration made over it stays valid for its
//! life; the owner keeps the registration dropped first (field order).

use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::fmt;
use std::ptr::NonNull;

const PAGE_BYTES: usize = 4096;

/// Memory the NIC reads and writes.
pub(crate) struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer is plain owned memory; `&`/`&mut` access follows Rust's rules on
// the CPU side, and the NIC only touches ranges the protocol hands it (see `verbs`).
unsafe impl Send for DmaBuf {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for DmaBuf {}

impl fmt::Debug for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DmaBuf({} bytes at {:p})", self.len, self.ptr)
    }
}

impl DmaBuf {
    /// `len` zero bytes (at least one page-aligned byte is allocated).
    pub(crate) fn new(len: usize) -> DmaBuf {
        let layout = Layout::from_size_align(len.max(1), PAGE_BYTES).expect("size fits a layout");
        // SAFETY: the layout's size is not zero.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout));
        DmaBuf { ptr, len, layout }
    }

    /// Usable bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated (what a registration covers; never 0).
    pub(crate) fn alloc_len(&self) -> usize {
        self.layout.size()
    }

    /// Address of byte `offset`, for a work request.
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        assert!(offset <= self.len);
        self.ptr.as_ptr() as u64 + offset as u64
    }

    /// Bytes `a..b`.
    pub(crate) fn slice(&self, a: usize, b: usize) -> &[u8] {
        assert!(a <= b && b <= self.len, "{a}..{b} outside {} bytes", self.len);
        // SAFETY: in bounds of the live allocation, checked above.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(a), b - a) }
    }

    /// Bytes `a..b`, to change.
    pub(crate) fn slice_mut(&mut self, a: usize, b: usize) -> &mut [u8] {
        assert!(a <= b && b <= self.len, "{a}..{b} outside {} bytes", self.len);
        // SAFETY: in bounds, checked above; `&mut self` makes the CPU access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(a), b - a) }
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_bounded() {
        let mut b = DmaBuf::new(10_000);
        assert_eq!(b.addr(0) % PAGE_BYTES as u64, 0);
        assert!(b.slice(0, 10_000).iter().all(|&x| x == 0));
        b.slice_mut(9_998, 10_000).copy_from_slice(&[7, 8]);
        assert_eq!(b.slice(9_997, 10_000), &[0, 7, 8]);
        assert_eq!(b.addr(10), b.addr(0) + 10);
        let empty = DmaBuf::new(0);
        assert_eq!((empty.len(), empty.alloc_len()), (0, 1));
        assert!(std::panic::catch_unwind(|| DmaBuf::new(4).slice(2, 5).len()).is_err());
    }
}
