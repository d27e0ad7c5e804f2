//! What a benchmark runs against, by path relative to the target's root: a
//! directory of any file system through `std::fs` ([`PosixTarget`]), or a pfs
//! cluster through the native client ([`NativeTarget`], no kernel involved).

use std::cell::RefCell;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use pfs_client::{Cluster, ClusterOptions, FileSystem};
use pfs_core::{FileHandle, FileType, FsError, InodeId};

/// Largest piece one native read or write carries (the wire's limit).
const NATIVE_IO_MAX_BYTES: usize = pfs_core::wire::MAX_IO_BYTES;
/// Path components a native path may have.
const NATIVE_DEPTH_MAX: usize = 64;

/// A failed operation on a target: which, on what, and why.
#[derive(Debug)]
pub struct TargetError {
    /// The operation (`create`, `read`, ...).
    pub op: &'static str,
    /// The path, relative to the target's root.
    pub path: String,
    /// The errno, when the failure has one.
    pub errno: Option<i32>,
    /// What went wrong.
    pub message: String,
}

impl TargetError {
    fn io(op: &'static str, path: &str, e: std::io::Error) -> TargetError {
        TargetError { op, path: path.into(), errno: e.raw_os_error(), message: e.to_string() }
    }

    fn fs(op: &'static str, path: &str, e: FsError) -> TargetError {
        TargetError { op, path: path.into(), errno: Some(e.errno()), message: e.to_string() }
    }

    /// Whether the path did not exist.
    pub fn is_not_found(&self) -> bool {
        self.errno == Some(libc::ENOENT)
    }
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path, self.message)
    }
}

/// What a stat returns that the benchmarks check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Size in bytes.
    pub size: u64,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Whether it is a regular file.
    pub is_file: bool,
}

/// The operations the workloads use, by path relative to the target's root
/// (`a/b/c`, no leading slash). One instance serves one process's thread.
pub trait Target {
    /// An open file.
    type File;
    /// Creates `path`, which must not exist, and opens it for writing.
    fn create(&self, path: &str) -> Result<Self::File, TargetError>;
    /// Opens an existing file for reading, or for writing if `write`.
    fn open(&self, path: &str, write: bool) -> Result<Self::File, TargetError>;
    /// Writes all of `data` at `offset`.
    fn write_at(&self, f: &mut Self::File, offset: u64, data: &[u8]) -> Result<(), TargetError>;
    /// Reads into `buf` from `offset` until it is full or the file ends; the
    /// bytes read.
    fn read_at(
        &self,
        f: &mut Self::File,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, TargetError>;
    /// Closes (data visible to other clients once this returns).
    fn close(&self, f: Self::File) -> Result<(), TargetError>;
    /// Attributes of `path`.
    fn stat(&self, path: &str) -> Result<Stat, TargetError>;
    /// Removes file `path`.
    fn unlink(&self, path: &str) -> Result<(), TargetError>;
    /// Creates directory `path`.
    fn mkdir(&self, path: &str) -> Result<(), TargetError>;
    /// Removes empty directory `path`.
    fn rmdir(&self, path: &str) -> Result<(), TargetError>;
    /// Names in directory `path` (without `.` and `..`), at most `max`.
    fn readdir(&self, path: &str, max: usize) -> Result<Vec<String>, TargetError>;
}

/// Where a benchmark runs, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetSpec {
    /// A directory.
    Posix(PathBuf),
    /// `pfs://HOST:PORT[/PATH]`: a cluster's master and a directory in it.
    Native {
        /// The master.
        master: SocketAddr,
        /// Directory inside the file system (`""` for the root).
        dir: String,
    },
}

impl TargetSpec {
    /// Parses a TARGET argument; the error says what is wrong with it.
    pub fn parse(s: &str) -> Result<TargetSpec, String> {
        let Some(rest) = s.strip_prefix("pfs://") else {
            let p = PathBuf::from(s);
            if p.to_str().is_none() {
                return Err(format!("target {s:?}: not UTF-8"));
            }
            return match std::fs::metadata(&p) {
                Ok(m) if m.is_dir() => Ok(TargetSpec::Posix(p)),
                Ok(_) => Err(format!("target {s}: not a directory")),
                Err(e) => Err(format!("target {s}: {e}")),
            };
        };
        let (addr, dir) = match rest.split_once('/') {
            Some((a, d)) => (a, d.trim_matches('/')),
            None => (rest, ""),
        };
        let master = addr
            .to_socket_addrs()
            .map_err(|e| format!("target {s}: master {addr:?}: {e}"))?
            .next()
            .ok_or_else(|| format!("target {s}: master {addr:?} resolves to no address"))?;
        Ok(TargetSpec::Native { master, dir: dir.to_string() })
    }

    /// `posix` or `native`.
    pub fn kind(&self) -> &'static str {
        match self {
            TargetSpec::Posix(_) => "posix",
            TargetSpec::Native { .. } => "native",
        }
    }
}

/// A directory of any file system, through `std::fs`.
#[derive(Debug)]
pub struct PosixTarget {
    root_len: usize,
    /// `root/` followed by the path of the current call (no allocation per call).
    buf: RefCell<String>,
}

impl PosixTarget {
    /// A target rooted at directory `root`.
    pub fn new(root: &Path) -> Result<PosixTarget, String> {
        let mut s = root
            .to_str()
            .ok_or_else(|| format!("target {}: not UTF-8", root.display()))?
            .trim_end_matches('/')
            .to_string();
        s.push('/');
        Ok(PosixTarget { root_len: s.len(), buf: RefCell::new(s) })
    }

    fn with_path<R>(&self, rel: &str, f: impl FnOnce(&Path) -> R) -> R {
        let mut b = self.buf.borrow_mut();
        b.truncate(self.root_len);
        b.push_str(rel);
        f(Path::new(b.as_str()))
    }
}

/// An open file of a [`PosixTarget`].
#[derive(Debug)]
pub struct PosixFile {
    file: File,
    path: String,
}

impl Target for PosixTarget {
    type File = PosixFile;

    fn create(&self, path: &str) -> Result<PosixFile, TargetError> {
        let file = self.with_path(path, |p| {
            OpenOptions::new().write(true).create_new(true).mode(0o644).open(p)
        });
        let file = file.map_err(|e| TargetError::io("create", path, e))?;
        Ok(PosixFile { file, path: path.into() })
    }

    fn open(&self, path: &str, write: bool) -> Result<PosixFile, TargetError> {
        let file = self.with_path(path, |p| OpenOptions::new().read(!write).write(write).open(p));
        let file = file.map_err(|e| TargetError::io("open", path, e))?;
        Ok(PosixFile { file, path: path.into() })
    }

    fn write_at(&self, f: &mut PosixFile, offset: u64, data: &[u8]) -> Result<(), TargetError> {
        f.file.write_all_at(data, offset).map_err(|e| TargetError::io("write", &f.path, e))
    }

    fn read_at(
        &self,
        f: &mut PosixFile,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, TargetError> {
        let mut done = 0;
        while done < buf.len() {
            match f.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TargetError::io("read", &f.path, e)),
            }
        }
        Ok(done)
    }

    fn close(&self, f: PosixFile) -> Result<(), TargetError> {
        // Dropping a File ignores close(2)'s error; a network or FUSE file
        // system reports failed write-back there, so ask for it explicitly.
        use std::os::fd::IntoRawFd;
        let fd = f.file.into_raw_fd();
        // SAFETY: `fd` was just taken out of its File, so nothing else closes it.
        let rc = unsafe { libc::close(fd) };
        if rc != 0 {
            return Err(TargetError::io("close", &f.path, std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn stat(&self, path: &str) -> Result<Stat, TargetError> {
        let m = self.with_path(path, |p| std::fs::symlink_metadata(p));
        let m = m.map_err(|e| TargetError::io("stat", path, e))?;
        Ok(Stat { size: m.len(), is_dir: m.is_dir(), is_file: m.is_file() })
    }

    fn unlink(&self, path: &str) -> Result<(), TargetError> {
        self.with_path(path, |p| std::fs::remove_file(p))
            .map_err(|e| TargetError::io("unlink", path, e))
    }

    fn mkdir(&self, path: &str) -> Result<(), TargetError> {
        self.with_path(path, |p| std::fs::create_dir(p))
            .map_err(|e| TargetError::io("mkdir", path, e))
    }

    fn rmdir(&self, path: &str) -> Result<(), TargetError> {
        self.with_path(path, |p| std::fs::remove_dir(p))
            .map_err(|e| TargetError::io("rmdir", path, e))
    }

    fn readdir(&self, path: &str, max: usize) -> Result<Vec<String>, TargetError> {
        let it = self.with_path(path, |p| std::fs::read_dir(p));
        let it = it.map_err(|e| TargetError::io("readdir", path, e))?;
        let mut names = Vec::new();
        for e in it {
            let e = e.map_err(|e| TargetError::io("readdir", path, e))?;
            names.push(e.file_name().to_string_lossy().into_owned());
            if names.len() >= max {
                break;
            }
        }
        Ok(names)
    }
}

/// A pfs cluster through the native client: each path is resolved component
/// by component with `lookup` (directory names come from the client's dentry
/// cache, as the kernel's would serve them through a mount).
pub struct NativeTarget {
    fs: Cluster,
    base: InodeId,
    uid: u32,
    gid: u32,
}

impl fmt::Debug for NativeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NativeTarget").field("base", &self.base).finish_non_exhaustive()
    }
}

/// An open file of a [`NativeTarget`].
#[derive(Debug)]
pub struct NativeFile {
    ino: InodeId,
    fh: FileHandle,
    path: String,
}

impl NativeTarget {
    /// Connects to `master` with the key in `key_file`; `dir` (relative to the
    /// file system's root, may be empty) must be a directory.
    pub fn connect(master: SocketAddr, key_file: &Path, dir: &str) -> Result<NativeTarget, String> {
        let key = pfs_net::ClusterKey::load(key_file)
            .map_err(|e| format!("key file {}: {e}", key_file.display()))?;
        let fs = Cluster::connect(ClusterOptions::new(master, key))
            .map_err(|e| format!("cannot connect to pfs://{master}: {e}"))?;
        // SAFETY: geteuid and getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let mut t = NativeTarget { fs, base: InodeId::ROOT, uid, gid };
        if !dir.is_empty() {
            let (parent, name) = t.parent_of(dir).map_err(|e| e.to_string())?;
            let attr = t.fs.lookup(parent, name.as_bytes()).map_err(|e| format!("{dir}: {e}"))?;
            if attr.kind != FileType::Directory {
                return Err(format!("pfs://{master}/{dir}: not a directory"));
            }
            t.base = attr.ino;
        }
        Ok(t)
    }

    /// The directory holding `path` and the last component.
    fn parent_of<'p>(&self, path: &'p str) -> Result<(InodeId, &'p str), TargetError> {
        let mut dir = self.base;
        let mut parts = path.split('/').filter(|c| !c.is_empty());
        let mut last = parts.next().ok_or_else(|| TargetError {
            op: "resolve",
            path: path.into(),
            errno: Some(libc::EINVAL),
            message: "empty path".into(),
        })?;
        for (depth, next) in parts.enumerate() {
            if depth >= NATIVE_DEPTH_MAX {
                return Err(TargetError {
                    op: "resolve",
                    path: path.into(),
                    errno: Some(libc::ENAMETOOLONG),
                    message: format!("more than {NATIVE_DEPTH_MAX} components"),
                });
            }
            let attr = self
                .fs
                .lookup(dir, last.as_bytes())
                .map_err(|e| TargetError::fs("lookup", path, e))?;
            if attr.kind != FileType::Directory {
                return Err(TargetError::fs("lookup", path, FsError::NotDir));
            }
            dir = attr.ino;
            last = next;
        }
        Ok((dir, last))
    }
}

impl Target for NativeTarget {
    type File = NativeFile;

    fn create(&self, path: &str) -> Result<NativeFile, TargetError> {
        let (parent, name) = self.parent_of(path)?;
        let flags = (libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL) as u32;
        let (attr, fh) = self
            .fs
            .create(parent, name.as_bytes(), 0o644, self.uid, self.gid, flags)
            .map_err(|e| TargetError::fs("create", path, e))?;
        Ok(NativeFile { ino: attr.ino, fh, path: path.into() })
    }

    fn open(&self, path: &str, write: bool) -> Result<NativeFile, TargetError> {
        let (parent, name) = self.parent_of(path)?;
        let attr = self
            .fs
            .lookup(parent, name.as_bytes())
            .map_err(|e| TargetError::fs("open", path, e))?;
        let flags = if write { libc::O_WRONLY } else { libc::O_RDONLY } as u32;
        let fh = self.fs.open(attr.ino, flags).map_err(|e| TargetError::fs("open", path, e))?;
        Ok(NativeFile { ino: attr.ino, fh, path: path.into() })
    }

    fn write_at(&self, f: &mut NativeFile, offset: u64, data: &[u8]) -> Result<(), TargetError> {
        let mut done = 0;
        while done < data.len() {
            let end = (done + NATIVE_IO_MAX_BYTES).min(data.len());
            let n = self
                .fs
                .write(f.ino, f.fh, offset + done as u64, &data[done..end])
                .map_err(|e| TargetError::fs("write", &f.path, e))?;
            if n == 0 {
                return Err(TargetError::fs("write", &f.path, FsError::Io("wrote 0 bytes".into())));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn read_at(
        &self,
        f: &mut NativeFile,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, TargetError> {
        let mut done = 0;
        while done < buf.len() {
            let want = (buf.len() - done).min(NATIVE_IO_MAX_BYTES);
            // Copied from the replies' buffers into the caller's, as a
            // program's read(2) through libpfs_preload is.
            let got = self
                .fs
                .read_into(f.ino, f.fh, offset + done as u64, &mut buf[done..done + want])
                .map_err(|e| TargetError::fs("read", &f.path, e))?;
            done += got;
            if got < want {
                break;
            }
        }
        Ok(done)
    }

    fn close(&self, f: NativeFile) -> Result<(), TargetError> {
        let flushed = self.fs.flush(f.ino, f.fh);
        let released = self.fs.release(f.ino, f.fh);
        flushed.and(released).map_err(|e| TargetError::fs("close", &f.path, e))
    }

    fn stat(&self, path: &str) -> Result<Stat, TargetError> {
        let (parent, name) = self.parent_of(path)?;
        let a = self
            .fs
            .lookup(parent, name.as_bytes())
            .map_err(|e| TargetError::fs("stat", path, e))?;
        Ok(Stat {
            size: a.size,
            is_dir: a.kind == FileType::Directory,
            is_file: a.kind == FileType::Regular,
        })
    }

    fn unlink(&self, path: &str) -> Result<(), TargetError> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.unlink(parent, name.as_bytes()).map_err(|e| TargetError::fs("unlink", path, e))
    }

    fn mkdir(&self, path: &str) -> Result<(), TargetError> {
        let (parent, name) = self.parent_of(path)?;
        self.fs
            .mkdir(parent, name.as_bytes(), 0o755, self.uid, self.gid)
            .map(|_| ())
            .map_err(|e| TargetError::fs("mkdir", path, e))
    }

    fn rmdir(&self, path: &str) -> Result<(), TargetError> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.rmdir(parent, name.as_bytes()).map_err(|e| TargetError::fs("rmdir", path, e))
    }

    fn readdir(&self, path: &str, max: usize) -> Result<Vec<String>, TargetError> {
        let dir = if path.is_empty() {
            self.base
        } else {
            let (parent, name) = self.parent_of(path)?;
            let a = self
                .fs
                .lookup(parent, name.as_bytes())
                .map_err(|e| TargetError::fs("readdir", path, e))?;
            a.ino
        };
        let mut names: Vec<String> = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let batch = self
                .fs
                .readdir(dir, after.as_deref(), pfs_client::api::READDIR_BATCH)
                .map_err(|e| TargetError::fs("readdir", path, e))?;
            let Some(last) = batch.last() else { break };
            after = Some(last.name.clone());
            for e in batch {
                if e.name != b"." && e.name != b".." {
                    names.push(String::from_utf8_lossy(&e.name).into_owned());
                }
            }
            if names.len() >= max {
                names.truncate(max);
                break;
            }
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_specs_parse() {
        let dir = std::env::temp_dir();
        assert_eq!(TargetSpec::parse(dir.to_str().unwrap()), Ok(TargetSpec::Posix(dir.clone())));
        assert_eq!(
            TargetSpec::parse("pfs://127.0.0.1:7000/a/b/"),
            Ok(TargetSpec::Native { master: "127.0.0.1:7000".parse().unwrap(), dir: "a/b".into() })
        );
        assert_eq!(
            TargetSpec::parse("pfs://127.0.0.1:7000"),
            Ok(TargetSpec::Native {
                master: "127.0.0.1:7000".parse().unwrap(),
                dir: String::new()
            })
        );
        assert!(TargetSpec::parse("pfs://nohost").unwrap_err().contains("nohost"));
        assert!(TargetSpec::parse("/no/such/dir/anywhere").unwrap_err().contains("/no/such"));
    }
}
