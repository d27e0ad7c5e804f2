//! Sector-aligned, owned I/O buffers (what `O_DIRECT` and io_uring need).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use super::SECTOR_SIZE;

/// A zero-initialised buffer aligned to [`SECTOR_SIZE`], length a multiple of it.
///
/// The allocation (`capacity`) may be larger than the visible length, so a device can
/// hand out a slice of a large registered buffer for a small request (`set_len`).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated; `len <= cap`. Every allocated byte is initialised.
    cap: usize,
    /// Index in the owning device's registered-buffer table, if it came from one.
    fixed_index: Option<u16>,
}

// SAFETY: the buffer is uniquely owned heap memory, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to a whole sector (empty if 0).
    pub fn zeroed(len: usize) -> AlignedBuf {
        let len = len.div_ceil(SECTOR_SIZE) * SECTOR_SIZE;
        if len == 0 {
            return AlignedBuf { ptr: NonNull::dangling(), len: 0, cap: 0, fixed_index: None };
        }
        let layout = Layout::from_size_align(len, SECTOR_SIZE).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap: len, fixed_index: None }
    }

    /// A buffer holding `data`, zero-padded to a whole sector.
    pub fn from_slice(data: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(data.len());
        buf[..data.len()].copy_from_slice(data);
        buf
    }

    /// Length in bytes (a multiple of [`SECTOR_SIZE`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated (at least `len`).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Changes the visible length within the allocation. Bytes that become visible
    /// keep whatever they last held (zero if never written).
    pub fn set_len(&mut self, len: usize) {
        assert!(len <= self.cap, "set_len {len} beyond capacity {}", self.cap);
        assert!(len % SECTOR_SIZE == 0, "set_len {len} is not a multiple of {SECTOR_SIZE}");
        self.len = len;
    }

    /// True for the empty buffer used by `Sync` requests.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Registered-buffer index, for devices that pool registered memory.
    pub fn fixed_index(&self) -> Option<u16> {
        self.fixed_index
    }

    /// Marks this buffer as the device's registered buffer `index`.
    pub fn set_fixed_index(&mut self, index: Option<u16>) {
        self.fixed_index = index;
    }

    /// Raw pointer for the kernel.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap != 0 {
            let layout = Layout::from_size_align(self.cap, SECTOR_SIZE).expect("buffer layout");
            // SAFETY: allocated in `zeroed` with this exact layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialised bytes (dangling only when 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and we hold the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("cap", &self.cap)
            .field("fixed", &self.fixed_index)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_up_and_aligns() {
        let b = AlignedBuf::from_slice(b"hello");
        assert_eq!(b.len(), SECTOR_SIZE);
        assert_eq!(b.as_ptr() as usize % SECTOR_SIZE, 0);
        assert_eq!(&b[..5], b"hello");
        assert!(b[5..].iter().all(|&x| x == 0));
        assert!(AlignedBuf::zeroed(0).is_empty());
    }

    #[test]
    fn set_len_within_capacity() {
        let mut b = AlignedBuf::zeroed(3 * SECTOR_SIZE);
        b[SECTOR_SIZE] = 7;
        b.set_len(SECTOR_SIZE);
        assert_eq!(b.len(), SECTOR_SIZE);
        assert_eq!(b.capacity(), 3 * SECTOR_SIZE);
        b.set_len(2 * SECTOR_SIZE);
        assert_eq!(b[SECTOR_SIZE], 7);
    }

    #[test]
    #[should_panic(expected = "beyond capacity")]
    fn set_len_beyond_capacity_is_a_bug() {
        AlignedBuf::zeroed(SECTOR_SIZE).set_len(2 * SECTOR_SIZE);
    }
}
