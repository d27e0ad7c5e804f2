//! The native file API: every operation a POSIX client needs, by inode.
//!
//! Semantics are those of the Linux VFS calls of the same names, with the errors
//! of [`FsError`]. Consistency is commit consistency: data written through one
//! client is visible to others after its `flush` (close) or `fsync`.

use pfs_core::wire::{FileLock, RenameFlags, XattrSetMode};
use pfs_core::{
    FileAttr, FileHandle, FileType, FsError, FsResult, InodeId, SetAttr, StatFs, TimeNs,
};

/// Entries a client asks one shard for in one readdir request.
pub const READDIR_BATCH: usize = 1024;

/// Names the mount and libpfs_preload give a file unlinked while still open
/// (`.pfs-hidden-<ino>`) until its last close; never listed to users.
pub const HIDDEN_PREFIX: &[u8] = b".pfs-hidden-";

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirListing {
    /// The name.
    pub name: Vec<u8>,
    /// The child's inode.
    pub ino: InodeId,
    /// The child's type.
    pub kind: FileType,
    /// The child's attributes, from a listing asked for with them
    /// ([`FileSystem::readdir_plus`]) when the server had them at hand (its inode
    /// lives with the name); `None` otherwise.
    pub attr: Option<FileAttr>,
}

/// Something another client changed that a kernel cache must drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// The dentry `name` in `parent` changed or went away.
    Entry {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// The attributes or data of `ino` changed.
    Inode {
        /// The inode.
        ino: InodeId,
    },
}

/// Called by a client when a cache entry held by the kernel must be dropped.
pub type Invalidator = Box<dyn Fn(Invalidation) + Send + Sync>;

/// Told of each change a client made to a file's data at the file's home, as
/// the inode's `ctime` before and after it (a data version: a server gives every
/// change its own time), or `None` for a change whose outcome is unknown (a
/// write that failed after it was acknowledged). A cache of the file's pages
/// that was current at the first version is current at the second, the change
/// being this client's.
pub type VersionObserver = Box<dyn Fn(InodeId, Option<(TimeNs, TimeNs)>) + Send + Sync>;

/// Every file operation, by inode. Implementations are shared by many threads.
pub trait FileSystem: Send + Sync + 'static {
    /// Resolves `name` in directory `parent`.
    fn lookup(&self, parent: InodeId, name: &[u8]) -> FsResult<FileAttr>;
    /// [`lookup`](Self::lookup), and the found file's bytes when it is a
    /// regular file of at most `MAX_LOOKUP_DATA_BYTES` (one page) that its
    /// server holds in memory: a small file read right after its lookup needs
    /// no second request. `None` when not (and always from a file system that
    /// cannot tell cheaply).
    fn lookup_data(&self, parent: InodeId, name: &[u8]) -> FsResult<(FileAttr, Option<Vec<u8>>)> {
        Ok((self.lookup(parent, name)?, None))
    }
    /// Attributes of `ino`.
    fn getattr(&self, ino: InodeId) -> FsResult<FileAttr>;
    /// Changes the attributes that are `Some` (a size truncates or extends).
    fn setattr(&self, ino: InodeId, set: &SetAttr) -> FsResult<FileAttr>;
    /// Creates and opens regular file `name` in `parent`.
    fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
        flags: u32,
    ) -> FsResult<(FileAttr, FileHandle)>;
    /// Creates a node of any non-directory, non-symlink type.
    #[allow(clippy::too_many_arguments)]
    fn mknod(
        &self,
        parent: InodeId,
        name: &[u8],
        kind: FileType,
        perm: u16,
        uid: u32,
        gid: u32,
        rdev: u32,
    ) -> FsResult<FileAttr>;
    /// Creates directory `name` in `parent`.
    fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr>;
    /// Creates symbolic link `name` in `parent` pointing at `target`.
    fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr>;
    /// The target of symbolic link `ino`.
    fn readlink(&self, ino: InodeId) -> FsResult<Vec<u8>>;
    /// Adds name `new_name` in `new_parent` for the non-directory `ino` (a hard
    /// link); returns its attributes with the grown link count. A file system
    /// without hard links answers `EPERM`, as link(2) documents.
    fn link(&self, ino: InodeId, new_parent: InodeId, new_name: &[u8]) -> FsResult<FileAttr> {
        let _ = (ino, new_parent, new_name);
        Err(FsError::NotPermitted)
    }
    /// Removes non-directory `name` from `parent`.
    fn unlink(&self, parent: InodeId, name: &[u8]) -> FsResult<()>;
    /// Removes empty directory `name` from `parent`.
    fn rmdir(&self, parent: InodeId, name: &[u8]) -> FsResult<()>;
    /// Renames, with `RENAME_NOREPLACE` / `RENAME_EXCHANGE` flags.
    fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()>;
    /// Up to `max` entries of `dir` after name `after` (from the start if `None`),
    /// in a stable order; an empty result means the end.
    fn readdir(&self, dir: InodeId, after: Option<&[u8]>, max: usize) -> FsResult<Vec<DirListing>>;
    /// [`readdir`](Self::readdir) with each child's attributes where the server
    /// has them at hand, in the same request. The attributes are the server's: a
    /// caller that has written to one of the files through this client looks it
    /// up instead (a lookup counts this client's writes in the size).
    fn readdir_plus(
        &self,
        dir: InodeId,
        after: Option<&[u8]>,
        max: usize,
    ) -> FsResult<Vec<DirListing>> {
        self.readdir(dir, after, max)
    }
    /// Opens `ino` with `open(2)` flags.
    fn open(&self, ino: InodeId, flags: u32) -> FsResult<FileHandle>;
    /// Reads up to `size` bytes at `offset` (short at end of file).
    fn read(&self, ino: InodeId, fh: FileHandle, offset: u64, size: u32) -> FsResult<Vec<u8>>;
    /// [`read`](Self::read), handing the bytes to `f` where they are (a
    /// reply's buffer) instead of in a new vector, which saves a copy of each
    /// byte; `f` is called once, unless the read fails.
    fn read_with(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        size: u32,
        f: &mut dyn FnMut(&[u8]),
    ) -> FsResult<()> {
        f(&self.read(ino, fh, offset, size)?);
        Ok(())
    }
    /// Reads up to `buf.len()` bytes (at most 1 MiB) at `offset` into `buf`;
    /// returns how many (short at end of file). Each byte is copied once,
    /// from the reply's buffer into `buf`, whichever shards hold it.
    fn read_into(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<usize> {
        let mut n = 0;
        self.read_with(ino, fh, offset, buf.len() as u32, &mut |d| {
            n = d.len().min(buf.len());
            buf[..n].copy_from_slice(&d[..n]);
        })?;
        Ok(n)
    }
    /// Writes `data` at `offset`; may return before the data is durable.
    fn write(&self, ino: InodeId, fh: FileHandle, offset: u64, data: &[u8]) -> FsResult<u32>;
    /// Writes `data` at the end of the file, as an `O_APPEND` write: where the
    /// end is and the file's growth past it are decided in one step where the
    /// size lives, so appends of several clients (other nodes) never land on
    /// each other. A file capability is removed first, and with
    /// `kill_suidgid` the set-user-ID and set-group-ID bits as a write by an
    /// unprivileged writer clears them. Returns the offset written at and the
    /// bytes written.
    fn append(
        &self,
        ino: InodeId,
        fh: FileHandle,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<(u64, u32)>;
    /// Waits until every write through `fh` finished (called on each close).
    fn flush(&self, ino: InodeId, fh: FileHandle) -> FsResult<()>;
    /// Makes `ino`'s data (and metadata unless `datasync`) durable: every write
    /// this client made to it through any handle, its size, and the name it was
    /// created or renamed to. `EIO` when a server restarted after it had
    /// acknowledged some of that and before it was durable.
    fn fsync(&self, ino: InodeId, fh: FileHandle, datasync: bool) -> FsResult<()>;
    /// Makes every change to directory `dir`'s entries acknowledged so far
    /// durable (creates, unlinks, renames into and out of it), wherever its
    /// entries live.
    fn fsyncdir(&self, dir: InodeId, fh: FileHandle, datasync: bool) -> FsResult<()>;
    /// Closes `fh` (after the last close of a file descriptor).
    fn release(&self, ino: InodeId, fh: FileHandle) -> FsResult<()>;
    /// Usage of the whole file system.
    fn statfs(&self) -> FsResult<StatFs>;
    /// Value of extended attribute `name`.
    fn getxattr(&self, ino: InodeId, name: &[u8]) -> FsResult<Vec<u8>>;
    /// Sets extended attribute `name`.
    fn setxattr(&self, ino: InodeId, name: &[u8], value: &[u8], mode: XattrSetMode)
        -> FsResult<()>;
    /// Names of the extended attributes of `ino`.
    fn listxattr(&self, ino: InodeId) -> FsResult<Vec<Vec<u8>>>;
    /// Removes extended attribute `name`.
    fn removexattr(&self, ino: InodeId, name: &[u8]) -> FsResult<()>;
    /// Allocates (extends the size of) `offset..offset + len` unless `keep_size`.
    fn fallocate(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> FsResult<()>;
    /// Whether this file system keeps file locks for every client (a mount
    /// then hands `fcntl` and `flock` locks to [`lock`](Self::lock));
    /// `false` leaves them to each node's kernel.
    fn keeps_locks(&self) -> bool {
        false
    }
    /// Takes `lock` for `owner` on `ino` (gives back what `owner` holds of
    /// its range, for `LockKind::Unlock`), or with `test` only looks: returns
    /// `None` when done (or, for a test, when it could be taken), or the
    /// lock of another owner that conflicts with it. Never waits for a
    /// conflict to go. `owner` is the kernel's lock owner: locks of one
    /// owner never conflict with each other, those of two owners on one
    /// client do. `NoLocks` (`ENOLCK`) when the file's home keeps no more.
    fn lock(
        &self,
        ino: InodeId,
        owner: u64,
        lock: FileLock,
        test: bool,
    ) -> FsResult<Option<FileLock>> {
        let _ = (ino, owner, lock, test);
        Err(FsError::NoLocks)
    }
    /// Registers the callback that drops kernel caches when another client
    /// changes something this one may have cached.
    fn set_invalidator(&self, invalidator: Invalidator);
    /// Registers the callback told of this client's own data changes at each
    /// file's home ([`VersionObserver`]): its writes there and the sizes it
    /// publishes. Without one, nothing is told.
    fn set_version_observer(&self, observer: VersionObserver) {
        let _ = observer;
    }
}
