//! The functions the library stands in for, as libc defines them: found once
//! with `dlsym(RTLD_NEXT, ...)` and called for every path and descriptor that is
//! not a pfs one.

/// Looks up libc's `$name` once (a missing symbol ends the process with a
/// message: the library was built for a libc that has it) and evaluates to it
/// as an `unsafe extern "C" fn($args) -> $ret`.
macro_rules! real {
    ($name:ident: fn($($arg:ty),*) -> $ret:ty) => {{
        static ADDR: ::std::sync::atomic::AtomicUsize = ::std::sync::atomic::AtomicUsize::new(0);
        let mut a = ADDR.load(::std::sync::atomic::Ordering::Relaxed);
        if a == 0 {
            a = $crate::real::lookup(concat!(stringify!($name), "\0"));
            ADDR.store(a, ::std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: `a` is libc's definition of `$name`, whose C signature the
        // caller spells out. (The block may sit inside the caller's own.)
        #[allow(unused_unsafe)]
        let f = unsafe { ::std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(a) };
        f
    }};
}
pub(crate) use real;

/// The address of the next definition of `name` (nul-terminated) after this
/// library's.
pub fn lookup(name: &'static str) -> usize {
    // SAFETY: `name` is nul-terminated; dlsym only reads it.
    let a = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    if a == 0 {
        let msg = format!(
            "libpfs_preload: libc has no {}: this library does not fit this libc\n",
            name.trim_end_matches('\0')
        );
        // SAFETY: writes a buffer of its own length to stderr, then ends the
        // process: there is no libc function to call instead.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::abort();
        }
    }
    a
}
