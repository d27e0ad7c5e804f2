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
}
