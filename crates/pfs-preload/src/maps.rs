//! `mmap` of pfs files: the mapping is private memory filled with a copy of the
//! file. A shared writable mapping also keeps a second copy (the shadow): at
//! `msync` and `munmap` the pages that differ from it are written to the file,
//! so what the program stored through the map reaches the file then, and
//! nothing it did not store is written back. Changes other clients make after
//! the `mmap` are not seen through it (docs/preload.md).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::client::Res;
use crate::fds::OpenFile;
use crate::ops;
use crate::real::real;

/// Shared writable mappings of pfs files one process keeps at once.
pub const MAPS_MAX: usize = 4096;
/// Write-back granularity.
const PAGE: usize = 4096;

struct Mapping {
    addr: usize,
    len: usize,
    file: Arc<OpenFile>,
    offset: u64,
    /// The contents as of the last write-back.
    shadow: Vec<u8>,
}

static MAPS: Mutex<Vec<Mapping>> = Mutex::new(Vec::new());
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Maps `len` bytes of the pfs file behind `fd` from `offset`.
pub fn map(fd: i32, len: usize, prot: i32, flags: i32, offset: i64) -> Res<*mut libc::c_void> {
    let f = ops::file(fd)?;
    let shared_write = flags & libc::MAP_SHARED != 0 && prot & libc::PROT_WRITE != 0;
    if offset < 0 || len == 0 || offset as usize % PAGE != 0 {
        return Err(libc::EINVAL);
    }
    if !f.readable() || (shared_write && !f.writable()) {
        return Err(libc::EACCES);
    }
    if shared_write && COUNT.load(Ordering::Relaxed) >= MAPS_MAX {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            eprintln!("libpfs_preload: {MAPS_MAX} shared writable maps of pfs files are open: more fail with ENOMEM");
        }
        return Err(libc::ENOMEM);
    }
    let mmap = real!(mmap: fn(*mut libc::c_void, usize, i32, i32, i32, i64) -> *mut libc::c_void);
    // SAFETY: an anonymous private mapping the kernel places.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(ops::last_errno());
    }
    // SAFETY: `p` maps `len` writable bytes.
    let mem = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) };
    let filled = ops::read_at(&f, offset as u64, mem).and_then(|_| {
        // SAFETY: the protection of the mapping made above.
        if unsafe { libc::mprotect(p, len, prot) } != 0 {
            return Err(ops::last_errno());
        }
        Ok(())
    });
    if let Err(e) = filled {
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, len) };
        return Err(e);
    }
    if shared_write {
        let m =
            Mapping { addr: p as usize, len, file: f, offset: offset as u64, shadow: mem.to_vec() };
        MAPS.lock().unwrap_or_else(|e| e.into_inner()).push(m);
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
    Ok(p)
}

/// Whether any shared writable map of a pfs file exists (the `msync` and
/// `munmap` hooks look no further when not).
pub fn any() -> bool {
    COUNT.load(Ordering::Relaxed) > 0
}

/// Writes the pages of `m` inside `start..end` (addresses) that changed since
/// the last write-back; stores past the file's end stay in memory, as the
/// kernel leaves them.
fn write_back(m: &mut Mapping, start: usize, end: usize) -> Res<()> {
    let lo = start.max(m.addr) - m.addr;
    let hi = end.min(m.addr + m.len) - m.addr;
    if lo >= hi {
        return Ok(());
    }
    // SAFETY: the mapping is live (it is in the registry) and `len` long; the
    // program may store into it meanwhile, which is its own race.
    let mem = unsafe { std::slice::from_raw_parts(m.addr as *const u8, m.len) };
    let size = ops::file_size(&m.file)?;
    let in_file = size.saturating_sub(m.offset).min(m.len as u64) as usize;
    let mut page = lo / PAGE * PAGE;
    while page < hi.min(in_file) {
        let run_start = page;
        while page < hi.min(in_file)
            && mem[page..(page + PAGE).min(m.len)] != m.shadow[page..(page + PAGE).min(m.len)]
        {
            page += PAGE;
        }
        if page > run_start {
            let run_end = page.min(in_file);
            ops::write_at(&m.file, Some(m.offset + run_start as u64), &mem[run_start..run_end])?;
            m.shadow[run_start..run_end].copy_from_slice(&mem[run_start..run_end]);
        } else {
            page += PAGE;
        }
    }
    Ok(())
}

/// `msync`: writes back what changed in `addr..addr + len`; with `MS_SYNC`
/// waits until it is written.
///
/// A range that wraps past the end of the address space touches no map (the
/// kernel's own call then fails: `ENOMEM` for `msync`, `EINVAL` for `munmap`;
/// stress-ng's msync stressor passes one).
pub fn sync(addr: usize, len: usize, flags: i32) -> Res<()> {
    let Some(end) = addr.checked_add(len) else { return Ok(()) };
    let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    for m in maps.iter_mut().filter(|m| m.addr < end && addr < m.addr + m.len) {
        write_back(m, addr, end)?;
        if flags & libc::MS_SYNC != 0 {
            ops::flush_file(&m.file)?;
        }
    }
    Ok(())
}

/// `munmap`: writes back what changed in every shared writable map the range
/// touches and forgets those maps (a partly unmapped one is written back
/// whole: what stays mapped of it is private memory from then on).
pub fn unmap(addr: usize, len: usize) -> Res<()> {
    let Some(until) = addr.checked_add(len) else { return Ok(()) };
    let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    let mut r = Ok(());
    let mut i = 0;
    while i < maps.len() {
        let m = &mut maps[i];
        if m.addr < until && addr < m.addr + m.len {
            let (start, end) = (m.addr, m.addr + m.len);
            r = r.and(write_back(m, start, end));
            maps.swap_remove(i);
            COUNT.fetch_sub(1, Ordering::Relaxed);
        } else {
            i += 1;
        }
    }
    r
}
