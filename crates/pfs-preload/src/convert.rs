//! Conversions between C conventions and the library's: pure, unit tested.

use libc::c_int;

/// `open(2)` flags of a `fopen` mode (`r`, `w+`, `ax`, `re`, ...).
pub fn fopen_flags(mode: &[u8]) -> Option<c_int> {
    let mut flags = match mode.first()? {
        b'r' => libc::O_RDONLY,
        b'w' => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        b'a' => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for &c in &mode[1..] {
        match c {
            b'+' => flags = (flags & !libc::O_ACCMODE) | libc::O_RDWR,
            b'x' => flags |= libc::O_EXCL,
            b'e' => flags |= libc::O_CLOEXEC,
            b',' => break,
            _ => {}
        }
    }
    Some(flags)
}

/// The major number of device `dev` (glibc's `gnu_dev_major`).
pub fn major(dev: u64) -> u32 {
    (((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff)) as u32
}

/// The minor number of device `dev` (glibc's `gnu_dev_minor`).
pub fn minor(dev: u64) -> u32 {
    ((dev & 0xff) | ((dev >> 12) & !0xff)) as u32
}

/// Device `dev` (glibc's `dev_t`) as the kernel stores it in an inode
/// (`new_encode_dev`: what a `MKNOD` through the mount carries); `None` for
/// a number the kernel refuses (`EINVAL`: a major past 12 bits, a minor past 20).
pub fn encode_dev(dev: u64) -> Option<u32> {
    let (major, minor) = (major(dev), minor(dev));
    if major >= 1 << 12 || minor >= 1 << 20 {
        return None;
    }
    Some((minor & 0xff) | (major << 8) | ((minor & !0xff) << 12))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fopen_modes_become_open_flags() {
        assert_eq!(fopen_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"rb+"), Some(libc::O_RDWR));
        assert_eq!(fopen_flags(b"w"), Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(fopen_flags(b"a+"), Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND));
        assert_eq!(
            fopen_flags(b"wxe"),
            Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_EXCL | libc::O_CLOEXEC)
        );
        assert_eq!(fopen_flags(b"r,ccs=UTF-8"), Some(libc::O_RDONLY));
        assert_eq!(fopen_flags(b"q"), None);
        assert_eq!(fopen_flags(b""), None);
    }

    #[test]
    fn device_numbers_split_as_glibc_does() {
        // makedev(8, 1) and makedev(0x1234, 0x56789).
        assert_eq!((major(0x801), minor(0x801)), (8, 1));
        let dev = (0x1234u64 & 0xfff) << 8
            | (0x1234u64 & !0xfff) << 32
            | (0x56789 & 0xff)
            | (0x56789u64 & !0xff) << 12;
        assert_eq!((major(dev), minor(dev)), (0x1234, 0x56789));
    }

    #[test]
    fn device_numbers_encode_as_the_kernel_stores_them() {
        // makedev(1, 3) (/dev/null), makedev(8, 0x123), and the largest.
        assert_eq!(encode_dev(0x103), Some(0x103));
        let dev = (8u64 << 8) | 0x23 | (0x100 << 12);
        assert_eq!(encode_dev(dev), Some(0x823 | (1 << 20)));
        let (big_major, big_minor) = ((0xfffu64 << 8), (0xff | (0xfff00u64 << 12)));
        assert_eq!(encode_dev(big_major | big_minor), Some(0xffff_ffff));
        // A major of 4096 or a minor of 1 << 20 does not fit.
        assert_eq!(encode_dev(0x1000u64 << 32), None);
        assert_eq!(encode_dev(0x100000u64 << 12), None);
        // What the encoding gives back splits into the same numbers.
        assert_eq!(
            (major(u64::from(0x823u32 | (1 << 20))), minor(u64::from(0x823u32 | (1 << 20)))),
            (8, 0x123)
        );
    }
}
