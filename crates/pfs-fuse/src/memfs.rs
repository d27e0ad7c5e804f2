//! `MemFs`: an in-memory [`FileSystem`], the FUSE ceiling.
//!
//! Mounted through the same adapter and `fuser` version as pfs, it measures what
//! the kernel round trip alone costs (`pfs-fuse --memory`), so a benchmark can
//! report pfs as a ratio of it. One lock, no network, no persistence. An inode
//! goes away at unlink even if a file handle is still open (a baseline needs no
//! more).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use pfs_client::api::{DirListing, Invalidator};
use pfs_client::FileSystem;
use pfs_core::wire::{RenameFlags, XattrSetMode};
use pfs_core::{FileAttr, FileHandle, FileType, FsError, FsResult, InodeId, SetAttr, StatFs};

/// Bytes of file data a `MemFs` holds at most; past it writes fail with `ENOSPC`.
pub const MEMFS_BYTES_MAX: u64 = 8 << 30;
/// Inodes a `MemFs` holds at most.
pub const MEMFS_INODES_MAX: u64 = 16 << 20;
const NAME_MAX: usize = 255;

#[derive(Debug)]
struct Node {
    attr: FileAttr,
    data: Vec<u8>,
    children: BTreeMap<Vec<u8>, InodeId>,
    target: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Debug)]
struct Inner {
    nodes: HashMap<InodeId, Node>,
    next_ino: u64,
    bytes: u64,
}

/// An in-memory file system.
#[derive(Debug)]
pub struct MemFs {
    inner: Mutex<Inner>,
    next_fh: AtomicU64,
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

fn new_attr(ino: InodeId, kind: FileType, perm: u16, uid: u32, gid: u32) -> FileAttr {
    let t = now_ns();
    FileAttr {
        ino,
        kind,
        perm,
        uid,
        gid,
        size: 0,
        blocks: 0,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        rdev: 0,
        atime_ns: t,
        mtime_ns: t,
        ctime_ns: t,
    }
}

fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name.contains(&b'/') || name == b"." || name == b".." {
        return Err(FsError::Invalid("bad file name".into()));
    }
    Ok(())
}

impl Default for MemFs {
    fn default() -> Self {
        MemFs::new()
    }
}

impl MemFs {
    /// An empty file system: a root directory, mode 0755, owned by root.
    pub fn new() -> MemFs {
        let mut nodes = HashMap::new();
        let root = new_attr(InodeId::ROOT, FileType::Directory, 0o755, 0, 0);
        nodes.insert(
            InodeId::ROOT,
            Node {
                attr: root,
                data: Vec::new(),
                children: BTreeMap::new(),
                target: Vec::new(),
                xattrs: BTreeMap::new(),
            },
        );
        MemFs {
            inner: Mutex::new(Inner { nodes, next_ino: 2, bytes: 0 }),
            next_fh: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("memfs lock")
    }
}

impl Inner {
    fn node(&self, ino: InodeId) -> FsResult<&Node> {
        self.nodes.get(&ino).ok_or(FsError::NotFound)
    }

    fn node_mut(&mut self, ino: InodeId) -> FsResult<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(FsError::NotFound)
    }

    fn dir(&self, ino: InodeId) -> FsResult<&Node> {
        let n = self.node(ino)?;
        if n.attr.kind != FileType::Directory {
            return Err(FsError::NotDir);
        }
        Ok(n)
    }

    fn add(
        &mut self,
        parent: InodeId,
        name: &[u8],
        attr: impl FnOnce(InodeId) -> FileAttr,
        target: &[u8],
    ) -> FsResult<FileAttr> {
        check_name(name)?;
        if self.dir(parent)?.children.contains_key(name) {
            return Err(FsError::Exists);
        }
        if self.nodes.len() as u64 >= MEMFS_INODES_MAX {
            return Err(FsError::NoSpace);
        }
        let ino = InodeId(self.next_ino);
        self.next_ino += 1;
        let mut a = attr(ino);
        if a.kind == FileType::Symlink {
            a.size = target.len() as u64;
        }
        let node = Node {
            attr: a,
            data: Vec::new(),
            children: BTreeMap::new(),
            target: target.to_vec(),
            xattrs: BTreeMap::new(),
        };
        self.nodes.insert(ino, node);
        let p = self.node_mut(parent)?;
        p.children.insert(name.to_vec(), ino);
        p.attr.mtime_ns = a.ctime_ns;
        p.attr.ctime_ns = a.ctime_ns;
        if a.kind == FileType::Directory {
            p.attr.nlink += 1;
        }
        Ok(a)
    }

    fn drop_node(&mut self, ino: InodeId) {
        if let Some(n) = self.nodes.remove(&ino) {
            self.bytes -= n.data.len() as u64;
        }
    }

    fn resize(&mut self, ino: InodeId, size: u64) -> FsResult<()> {
        let old = self.node(ino)?.data.len() as u64;
        if size > old && self.bytes + (size - old) > MEMFS_BYTES_MAX {
            return Err(FsError::NoSpace);
        }
        let n = self.node_mut(ino)?;
        n.data.resize(size as usize, 0);
        n.attr.size = size;
        n.attr.blocks = size.div_ceil(512);
        self.bytes = self.bytes + size - old;
        Ok(())
    }

    /// Removes `name` from `parent` after `check` accepted the child.
    fn remove(
        &mut self,
        parent: InodeId,
        name: &[u8],
        check: impl FnOnce(&Node) -> FsResult<()>,
    ) -> FsResult<()> {
        let ino = *self.dir(parent)?.children.get(name).ok_or(FsError::NotFound)?;
        let child = self.node(ino)?;
        check(child)?;
        let is_dir = child.attr.kind == FileType::Directory;
        let p = self.node_mut(parent)?;
        p.children.remove(name);
        let t = now_ns();
        p.attr.mtime_ns = t;
        p.attr.ctime_ns = t;
        if is_dir {
            p.attr.nlink -= 1;
        }
        self.drop_node(ino);
        Ok(())
    }

    fn is_ancestor(&self, a: InodeId, mut d: InodeId) -> bool {
        // Walk up through the parent links the tree has: a linear search per step,
        // fine for a baseline.
        for _ in 0..4096 {
            if d == a {
                return true;
            }
            let parent = self
                .nodes
                .iter()
                .find(|(_, n)| n.children.values().any(|&c| c == d))
                .map(|(&p, _)| p);
            match parent {
                Some(p) => d = p,
                None => return false,
            }
        }
        false
    }
}

/// A write at `offset` under the file system's lock.
fn write_locked(g: &mut Inner, ino: InodeId, offset: u64, data: &[u8]) -> FsResult<u32> {
    let end = offset.checked_add(data.len() as u64).ok_or(FsError::FileTooLarge)?;
    if end > g.node(ino)?.data.len() as u64 {
        g.resize(ino, end)?;
    }
    let n = g.node_mut(ino)?;
    n.data[offset as usize..end as usize].copy_from_slice(data);
    let t = now_ns();
    n.attr.mtime_ns = t;
    n.attr.ctime_ns = t;
    Ok(data.len() as u32)
}

impl FileSystem for MemFs {
    fn lookup(&self, parent: InodeId, name: &[u8]) -> FsResult<FileAttr> {
        if name.len() > NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let g = self.lock();
        let ino = *g.dir(parent)?.children.get(name).ok_or(FsError::NotFound)?;
        Ok(g.node(ino)?.attr)
    }

    fn getattr(&self, ino: InodeId) -> FsResult<FileAttr> {
        Ok(self.lock().node(ino)?.attr)
    }

    fn setattr(&self, ino: InodeId, set: &SetAttr) -> FsResult<FileAttr> {
        let mut g = self.lock();
        if let Some(size) = set.size {
            if g.node(ino)?.attr.kind == FileType::Directory {
                return Err(FsError::IsDir);
            }
            g.resize(ino, size)?;
        }
        let n = g.node_mut(ino)?;
        let t = now_ns();
        if let Some(p) = set.perm {
            n.attr.perm = p;
        }
        if let Some(u) = set.uid {
            n.attr.uid = u;
        }
        if let Some(gid) = set.gid {
            n.attr.gid = gid;
        }
        if let Some(a) = set.atime_ns {
            n.attr.atime_ns = a;
        }
        if let Some(m) = set.mtime_ns {
            n.attr.mtime_ns = m;
        } else if set.size.is_some() {
            n.attr.mtime_ns = t;
        }
        n.attr.ctime_ns = t;
        Ok(n.attr)
    }

    fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
        flags: u32,
    ) -> FsResult<(FileAttr, FileHandle)> {
        let mut g = self.lock();
        let existing = g.dir(parent)?.children.get(name).copied();
        let attr = match existing {
            Some(_) if flags & libc::O_EXCL as u32 != 0 => return Err(FsError::Exists),
            Some(ino) => g.node(ino)?.attr,
            None => g.add(parent, name, |i| new_attr(i, FileType::Regular, perm, uid, gid), b"")?,
        };
        Ok((attr, FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))))
    }

    fn mknod(
        &self,
        parent: InodeId,
        name: &[u8],
        kind: FileType,
        perm: u16,
        uid: u32,
        gid: u32,
        rdev: u32,
    ) -> FsResult<FileAttr> {
        if matches!(kind, FileType::Directory | FileType::Symlink) {
            return Err(FsError::Invalid("mknod of a directory or symlink".into()));
        }
        let attr = move |i| FileAttr { rdev, ..new_attr(i, kind, perm, uid, gid) };
        self.lock().add(parent, name, attr, b"")
    }

    fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        self.lock().add(parent, name, |i| new_attr(i, FileType::Directory, perm, uid, gid), b"")
    }

    fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        if target.is_empty() || target.len() > 4095 {
            return Err(FsError::Invalid("symlink target length".into()));
        }
        self.lock().add(parent, name, |i| new_attr(i, FileType::Symlink, 0o777, uid, gid), target)
    }

    fn readlink(&self, ino: InodeId) -> FsResult<Vec<u8>> {
        let g = self.lock();
        let n = g.node(ino)?;
        if n.attr.kind != FileType::Symlink {
            return Err(FsError::Invalid("not a symlink".into()));
        }
        Ok(n.target.clone())
    }

    fn unlink(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        self.lock().remove(parent, name, |c| {
            if c.attr.kind == FileType::Directory {
                return Err(FsError::IsDir);
            }
            Ok(())
        })
    }

    fn rmdir(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        self.lock().remove(parent, name, |c| {
            if c.attr.kind != FileType::Directory {
                return Err(FsError::NotDir);
            }
            if !c.children.is_empty() {
                return Err(FsError::NotEmpty);
            }
            Ok(())
        })
    }

    fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        check_name(new_name)?;
        let mut g = self.lock();
        let src = *g.dir(parent)?.children.get(name).ok_or(FsError::NotFound)?;
        let dst = g.dir(new_parent)?.children.get(new_name).copied();
        let src_dir = g.node(src)?.attr.kind == FileType::Directory;
        if src_dir && g.is_ancestor(src, new_parent) {
            return Err(FsError::Invalid("a directory cannot move into itself".into()));
        }
        if flags.contains(RenameFlags::EXCHANGE) {
            let dst = dst.ok_or(FsError::NotFound)?;
            g.node_mut(parent)?.children.insert(name.to_vec(), dst);
            g.node_mut(new_parent)?.children.insert(new_name.to_vec(), src);
            return Ok(());
        }
        if let Some(d) = dst {
            if d == src {
                return Ok(());
            }
            if flags.contains(RenameFlags::NOREPLACE) {
                return Err(FsError::Exists);
            }
            let dn = g.node(d)?;
            match (src_dir, dn.attr.kind == FileType::Directory) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) if !dn.children.is_empty() => return Err(FsError::NotEmpty),
                _ => {}
            }
            g.remove(new_parent, new_name, |_| Ok(()))?;
        }
        g.node_mut(parent)?.children.remove(name);
        g.node_mut(new_parent)?.children.insert(new_name.to_vec(), src);
        if src_dir && parent != new_parent {
            g.node_mut(parent)?.attr.nlink -= 1;
            g.node_mut(new_parent)?.attr.nlink += 1;
        }
        let t = now_ns();
        for p in [parent, new_parent] {
            let n = g.node_mut(p)?;
            n.attr.mtime_ns = t;
            n.attr.ctime_ns = t;
        }
        g.node_mut(src)?.attr.ctime_ns = t;
        Ok(())
    }

    fn readdir(&self, dir: InodeId, after: Option<&[u8]>, max: usize) -> FsResult<Vec<DirListing>> {
        use std::ops::Bound;
        let g = self.lock();
        let d = g.dir(dir)?;
        let start = match after {
            Some(a) => Bound::Excluded(a.to_vec()),
            None => Bound::Unbounded,
        };
        let mut out = Vec::new();
        for (name, &ino) in d.children.range((start, Bound::Unbounded)).take(max) {
            let attr = g.node(ino)?.attr;
            out.push(DirListing { name: name.clone(), ino, kind: attr.kind, attr: Some(attr) });
        }
        Ok(out)
    }

    fn open(&self, ino: InodeId, flags: u32) -> FsResult<FileHandle> {
        let mut g = self.lock();
        let kind = g.node(ino)?.attr.kind;
        let acc = flags & libc::O_ACCMODE as u32;
        if kind == FileType::Directory && acc != libc::O_RDONLY as u32 {
            return Err(FsError::IsDir);
        }
        if flags & libc::O_TRUNC as u32 != 0 && acc != libc::O_RDONLY as u32 {
            g.resize(ino, 0)?;
        }
        Ok(FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed)))
    }

    fn read(&self, ino: InodeId, _fh: FileHandle, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let g = self.lock();
        let n = g.node(ino)?;
        if n.attr.kind == FileType::Directory {
            return Err(FsError::IsDir);
        }
        let len = n.data.len() as u64;
        let start = offset.min(len) as usize;
        let end = (offset.saturating_add(size as u64)).min(len) as usize;
        Ok(n.data[start..end].to_vec())
    }

    fn write(&self, ino: InodeId, _fh: FileHandle, offset: u64, data: &[u8]) -> FsResult<u32> {
        write_locked(&mut self.lock(), ino, offset, data)
    }

    fn append(
        &self,
        ino: InodeId,
        _fh: FileHandle,
        data: &[u8],
        _kill_suidgid: bool,
    ) -> FsResult<(u64, u32)> {
        let mut g = self.lock();
        let offset = g.node(ino)?.data.len() as u64;
        Ok((offset, write_locked(&mut g, ino, offset, data)?))
    }

    fn flush(&self, _ino: InodeId, _fh: FileHandle) -> FsResult<()> {
        Ok(())
    }

    fn fsync(&self, ino: InodeId, _fh: FileHandle, _datasync: bool) -> FsResult<()> {
        self.lock().node(ino).map(|_| ())
    }

    fn fsyncdir(&self, dir: InodeId, _fh: FileHandle, _datasync: bool) -> FsResult<()> {
        self.lock().node(dir).map(|_| ())
    }

    fn release(&self, _ino: InodeId, _fh: FileHandle) -> FsResult<()> {
        Ok(())
    }

    fn statfs(&self) -> FsResult<StatFs> {
        let g = self.lock();
        let block = 4096u64;
        Ok(StatFs {
            block_size: block as u32,
            blocks: MEMFS_BYTES_MAX / block,
            blocks_free: (MEMFS_BYTES_MAX - g.bytes) / block,
            files: MEMFS_INODES_MAX,
            files_free: MEMFS_INODES_MAX - g.nodes.len() as u64,
            name_max: NAME_MAX as u32,
        })
    }

    fn getxattr(&self, ino: InodeId, name: &[u8]) -> FsResult<Vec<u8>> {
        self.lock().node(ino)?.xattrs.get(name).cloned().ok_or(FsError::NoAttr)
    }

    fn setxattr(
        &self,
        ino: InodeId,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
    ) -> FsResult<()> {
        let mut g = self.lock();
        let n = g.node_mut(ino)?;
        let exists = n.xattrs.contains_key(name);
        match mode {
            XattrSetMode::Create if exists => return Err(FsError::Exists),
            XattrSetMode::Replace if !exists => return Err(FsError::NoAttr),
            _ => {}
        }
        n.xattrs.insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    fn listxattr(&self, ino: InodeId) -> FsResult<Vec<Vec<u8>>> {
        Ok(self.lock().node(ino)?.xattrs.keys().cloned().collect())
    }

    fn removexattr(&self, ino: InodeId, name: &[u8]) -> FsResult<()> {
        self.lock().node_mut(ino)?.xattrs.remove(name).map(|_| ()).ok_or(FsError::NoAttr)
    }

    fn fallocate(
        &self,
        ino: InodeId,
        _fh: FileHandle,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> FsResult<()> {
        let mut g = self.lock();
        let end = offset.checked_add(len).ok_or(FsError::FileTooLarge)?;
        if !keep_size && end > g.node(ino)?.data.len() as u64 {
            g.resize(ino, end)?;
        }
        Ok(())
    }

    fn set_invalidator(&self, _invalidator: Invalidator) {}
}
