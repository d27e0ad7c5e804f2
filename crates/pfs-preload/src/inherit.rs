//! What a program hands to the program it `exec`s: its pfs working directory
//! and its pfs descriptors that stay open across `exec` (no `FD_CLOEXEC`), so
//! `cd /pfs/dir && cmd > out` in a shell works as on a kernel file system. Both
//! travel in environment variables the library adds to the new program's
//! environment and reads (and removes) when it starts:
//!
//! - `PFS_PRELOAD_CWD=KERNEL:PFS`: the kernel's working directory at the
//!   `exec` and the pfs one, in hex; taken only if the kernel's is still the
//!   same (a program in between may have moved).
//! - `PFS_PRELOAD_FDS=FD,INO,TYPE,FLAGS,OFFSET,PATH;...`: numbers in decimal,
//!   the path in hex; each descriptor is taken only if it is still an `O_PATH`
//!   descriptor of `/dev/null`, as the library reserves them.
//!
//! Offsets are copied, not shared, from then on (docs/preload.md).

/// The variable with the working directory.
pub const CWD_VAR: &str = "PFS_PRELOAD_CWD";
/// The variable with the descriptors.
pub const FDS_VAR: &str = "PFS_PRELOAD_FDS";
/// Descriptors one `exec` hands on at most.
pub const FDS_MAX: usize = 1024;

/// One descriptor handed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passed {
    /// The descriptor number.
    pub fd: i32,
    /// The inode.
    pub ino: u64,
    /// The file type byte (`pfs_core::FileType as u8`).
    pub kind: u8,
    /// The `open(2)` status flags.
    pub flags: i32,
    /// The offset at the `exec`.
    pub offset: u64,
    /// The absolute path it was opened by.
    pub path: Vec<u8>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// `PFS_PRELOAD_CWD`'s value.
pub fn encode_cwd(kernel: &[u8], pfs: &[u8]) -> String {
    format!("{}:{}", hex(kernel), hex(pfs))
}

/// The (kernel, pfs) directories of a `PFS_PRELOAD_CWD` value.
pub fn decode_cwd(v: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let (k, p) = v.split_once(':')?;
    Some((unhex(k)?, unhex(p)?))
}

/// `PFS_PRELOAD_FDS`'s value.
pub fn encode_fds(fds: &[Passed]) -> String {
    let parts: Vec<String> = fds
        .iter()
        .map(|p| format!("{},{},{},{},{},{}", p.fd, p.ino, p.kind, p.flags, p.offset, hex(&p.path)))
        .collect();
    parts.join(";")
}

/// The descriptors of a `PFS_PRELOAD_FDS` value (malformed entries are
/// skipped; at most [`FDS_MAX`]).
pub fn decode_fds(v: &str) -> Vec<Passed> {
    let one = |e: &str| -> Option<Passed> {
        let mut f = e.split(',');
        let p = Passed {
            fd: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            kind: f.next()?.parse().ok()?,
            flags: f.next()?.parse().ok()?,
            offset: f.next()?.parse().ok()?,
            path: unhex(f.next()?)?,
        };
        f.next().is_none().then_some(p)
    };
    v.split(';').filter_map(one).take(FDS_MAX).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_and_directories_survive_the_round_trip() {
        let fds = vec![
            Passed {
                fd: 1,
                ino: 77,
                kind: 1,
                flags: 0o1101,
                offset: 4096,
                path: b"/pfs/out;,:x".to_vec(),
            },
            Passed { fd: 9, ino: 1 << 41, kind: 2, flags: 0, offset: 0, path: b"/pfs".to_vec() },
        ];
        assert_eq!(decode_fds(&encode_fds(&fds)), fds);
        assert_eq!(
            decode_cwd(&encode_cwd(b"/home/u", b"/pfs/a b")),
            Some((b"/home/u".to_vec(), b"/pfs/a b".to_vec()))
        );
    }

    #[test]
    fn malformed_values_are_skipped() {
        assert_eq!(decode_fds(""), vec![]);
        assert_eq!(decode_fds("1,2,3"), vec![]);
        assert_eq!(
            decode_fds("x,1,1,0,0,2f;1,2,1,0,0,2f70"),
            vec![Passed { fd: 1, ino: 2, kind: 1, flags: 0, offset: 0, path: b"/p".to_vec() }]
        );
        assert_eq!(decode_fds("1,2,1,0,0,2f,extra"), vec![]);
        assert_eq!(decode_cwd("2f"), None);
        assert_eq!(decode_cwd("2f:zz"), None);
        let many = vec!["3,1,1,0,0,2f"; FDS_MAX + 5].join(";");
        assert_eq!(decode_fds(&many).len(), FDS_MAX);
    }
}
