//! Sector-aligned, owned I/O buffers (what `O_DIRECT` and io_uring need).

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use super::SECTOR_SIZE;

/// The huge page size the kernel's transparent huge pages use on x86-64 and
/// arm64 (4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// Memory several buffers share: one anonymous mapping, aligned to
/// [`HUGE_PAGE`] and advised for transparent huge pages, so that each buffer
/// in it is physically contiguous where the kernel found huge pages. A 1 MiB
/// read into 256 scattered 4 KiB pages reached this VM's disk (254 segments
/// at most per request) as two requests; `fio --direct=1 --bs=1M` read 2.5x
/// faster from huge-page buffers than from its own (docs/cluster.md).
pub struct Region {
    base: NonNull<u8>,
    map_len: usize,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory, owned by the region and handed out as disjoint buffers.
unsafe impl Send for Region {}
// SAFETY: the region itself is never read or written through `&Region`.
unsafe impl Sync for Region {}

impl Region {
    /// `len` bytes (rounded up to a huge page) of zeroed memory, faulted in
    /// now; `None` if the mapping fails. Whether the kernel backs it with huge
    /// pages ([`Region::huge_bytes`]) depends on its settings and on free
    /// contiguous memory: without them it is ordinary memory.
    pub fn huge(len: usize) -> Option<Arc<Region>> {
        let len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        if len == 0 {
            return None;
        }
        let map_len = len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let aligned = (base as usize).div_ceil(HUGE_PAGE) * HUGE_PAGE;
        let ptr = aligned as *mut u8;
        // SAFETY: `ptr..ptr + len` lies inside the mapping; advice only.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) };
        // Fault every page in now (one fault per huge page where it got
        // them), not in the first device requests.
        for at in (0..len).step_by(4096) {
            // SAFETY: inside the mapping, which is writable.
            unsafe { ptr.add(at).write_volatile(0) };
        }
        Some(Arc::new(Region {
            base: NonNull::new(base.cast()).expect("mmap returned non-null"),
            map_len,
            ptr: NonNull::new(ptr).expect("aligned non-null"),
            len,
        }))
    }

    /// Bytes of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region has at least one huge page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// How much of this region the kernel backs with huge pages now
    /// (`AnonHugePages` of its mapping in `/proc/self/smaps`), if it says.
    pub fn huge_bytes(&self) -> Option<usize> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let start = self.base.as_ptr() as usize;
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a <= start && start < b;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    return kb
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<usize>()
                        .ok()
                        .map(|k| k * 1024);
                }
            }
        }
        None
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `huge`; no buffer outlives the region
        // (each holds an `Arc` of it).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region").field("len", &self.len).finish()
    }
}

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
    /// The region the bytes lie in, when they are a slice of one (not freed
    /// with the buffer).
    region: Option<Arc<Region>>,
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
            return AlignedBuf {
                ptr: NonNull::dangling(),
                len: 0,
                cap: 0,
                fixed_index: None,
                region: None,
            };
        }
        let layout = Layout::from_size_align(len, SECTOR_SIZE).expect("buffer layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, cap: len, fixed_index: None, region: None }
    }

    /// The `len` bytes of `region` at `offset` as a buffer (both multiples of
    /// [`SECTOR_SIZE`]). The caller hands each range out once.
    pub fn in_region(region: &Arc<Region>, offset: usize, len: usize) -> AlignedBuf {
        assert!(offset % SECTOR_SIZE == 0 && len % SECTOR_SIZE == 0 && len > 0);
        assert!(offset + len <= region.len, "{offset}+{len} beyond the region");
        // SAFETY: inside the region, checked above.
        let ptr = unsafe { NonNull::new_unchecked(region.ptr.as_ptr().add(offset)) };
        AlignedBuf { ptr, len, cap: len, fixed_index: None, region: Some(region.clone()) }
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
        if self.cap != 0 && self.region.is_none() {
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

    /// Buffers cut from one region are disjoint, zeroed, aligned to the
    /// huge page at the region's start, and keep the region alive after
    /// their maker let it go.
    #[test]
    fn buffers_of_a_region_are_disjoint_and_outlive_its_other_owners() {
        let region = Region::huge(3 << 20).expect("an anonymous mapping");
        assert_eq!(region.len(), 4 << 20, "rounded up to whole huge pages");
        let mut a = AlignedBuf::in_region(&region, 0, 1 << 20);
        let mut b = AlignedBuf::in_region(&region, 1 << 20, 1 << 20);
        assert_eq!(a.as_mut_ptr() as usize % HUGE_PAGE, 0);
        assert!(a.iter().chain(b.iter()).all(|&x| x == 0));
        a.fill(1);
        b.fill(2);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        assert!(region.huge_bytes().is_some(), "the mapping is in /proc/self/smaps");
        drop(region);
        drop(a);
        assert!(b.iter().all(|&x| x == 2), "b still holds the region");
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
