//! Namespace operations of a shard: everything except file data.
//!
//! A dentry's value is the child's inode number with its file type in bits 56..63,
//! so lookup and readdir answer without touching the child's inode (which may live
//! on another shard).

use pfs_core::{
    DirLayout, FileAttr, FileLayout, FileType, FsError, FsResult, InodeId, SetAttr, StatFs,
    NAME_MAX,
};

use super::{acl, tables, Shard, PAGE_SIZE};
use crate::device::Device;
use crate::inode::Inode;
use crate::wal::Change;
pub use pfs_core::wire::Replaced;

const KIND_SHIFT: u32 = 56;
/// Extended attribute naming a directory's child layout.
pub const XATTR_DIR_LAYOUT: &[u8] = b"user.pfs.dir_layout";
/// Extended attribute naming a file's (or a directory's default) data layout.
pub const XATTR_FILE_LAYOUT: &[u8] = b"user.pfs.file_layout";
/// Largest extended attribute value.
pub const XATTR_VALUE_MAX: usize = 64 << 10;
/// Longest symbolic link target.
pub const SYMLINK_MAX: usize = 4095;
const _: () = assert!(SYMLINK_MAX as u64 <= super::geometry::PAGE_SIZE, "a target fits one page");

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The name.
    pub name: Vec<u8>,
    /// The child's inode number.
    pub ino: InodeId,
    /// The child's type.
    pub kind: FileType,
}

/// What a create-like operation needs.
#[derive(Clone, Copy, Debug)]
pub struct CreateArgs {
    /// File type of the new inode.
    pub kind: FileType,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number (device nodes).
    pub rdev: u32,
    /// Layouts for the new inode; `None` inherits the parent's when the parent
    /// lives on this shard (the client sends them when it does not).
    pub layout: Option<(DirLayout, FileLayout)>,
}

impl CreateArgs {
    /// A regular file owned by root.
    pub fn file(perm: u16) -> CreateArgs {
        CreateArgs { kind: FileType::Regular, perm, uid: 0, gid: 0, rdev: 0, layout: None }
    }

    /// A directory owned by root.
    pub fn dir(perm: u16) -> CreateArgs {
        CreateArgs { kind: FileType::Directory, perm, uid: 0, gid: 0, rdev: 0, layout: None }
    }
}

/// Most links a file may have (ext4's limit); one more is `EMLINK`.
pub const LINK_MAX: u32 = 65_000;

/// Hard links name files only (`EPERM` for a directory, as Linux), up to `LINK_MAX`.
fn check_linkable(inode: &Inode) -> FsResult<()> {
    if inode.kind == FileType::Directory {
        return Err(FsError::NotPermitted);
    }
    if inode.nlink >= LINK_MAX {
        return Err(FsError::TooManyLinks);
    }
    Ok(())
}

/// `rename` flags (Linux `RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with `Exists` if the target exists.
    pub noreplace: bool,
    /// Swap source and target, which must both exist.
    pub exchange: bool,
}

/// `setxattr` flags (`XATTR_CREATE`, `XATTR_REPLACE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XattrFlags {
    /// Fail with `Exists` if the attribute exists.
    pub create: bool,
    /// Fail with `NoAttr` if it does not.
    pub replace: bool,
}

/// A dentry's value: the child's inode number with its type in the top byte.
pub fn encode_dentry(ino: InodeId, kind: FileType) -> u64 {
    assert!(ino.0 >> KIND_SHIFT == 0, "inode number {ino} collides with the type bits");
    ino.0 | (kind as u64) << KIND_SHIFT
}

/// The child and type a dentry value names.
pub fn decode_dentry(value: u64) -> (InodeId, FileType) {
    let kind = FileType::from_u8((value >> KIND_SHIFT) as u8)
        .expect("dentry type bits were written by us");
    (InodeId(value & ((1 << KIND_SHIFT) - 1)), kind)
}

/// Checks a name component.
pub fn check_name(name: &[u8]) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&c| c == b'/' || c == 0)
    {
        return Err(FsError::Invalid(format!("bad file name {:?}", String::from_utf8_lossy(name))));
    }
    Ok(())
}

impl<D: Device> Shard<D> {
    pub(super) fn create_root(&mut self) -> FsResult<()> {
        self.begin()?;
        let now = self.now();
        let slot = self.slot_bitmap.alloc().ok_or(FsError::NoSpace)?;
        let root = Inode {
            ino: InodeId::ROOT,
            parent: InodeId::ROOT,
            kind: FileType::Directory,
            perm: 0o755,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 2,
            rdev: 0,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            dir_layout: DirLayout::default(),
            file_layout: FileLayout::default(),
            first_block: None,
            pages: 0,
            data_end: 0,
        };
        let mut image = Box::new([0u8; crate::inode::INODE_SLOT_SIZE]);
        root.encode(&mut image);
        self.log(Change::InodePut { slot, image })?;
        self.finish()
    }

    /// Looks up `name` in `parent`.
    pub fn lookup(&mut self, parent: InodeId, name: &[u8]) -> FsResult<DirEntry> {
        check_name(name)?;
        let value = self.dentries.get(parent, name).ok_or(FsError::NotFound)?;
        let (ino, kind) = decode_dentry(value);
        Ok(DirEntry { name: name.to_vec(), ino, kind })
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&mut self, ino: InodeId) -> FsResult<FileAttr> {
        Ok(self.inode(ino)?.attr(PAGE_SIZE))
    }

    /// The layouts of inode `ino`.
    pub fn layouts(&mut self, ino: InodeId) -> FsResult<(DirLayout, FileLayout)> {
        let inode = self.inode(ino)?;
        Ok((inode.dir_layout, inode.file_layout))
    }

    /// Creates an inode of any type named `name` in `parent` (mknod, create, mkdir).
    /// When the parent inode lives here it must be a directory, and it inherits
    /// its layouts to the child.
    pub fn create(&mut self, parent: InodeId, name: &[u8], args: CreateArgs) -> FsResult<FileAttr> {
        check_name(name)?;
        if args.kind == FileType::Symlink {
            return Err(FsError::Invalid("create a symlink with symlink()".into()));
        }
        let attr = self.create_inner(parent, name, args)?;
        self.finish()?;
        Ok(attr)
    }

    /// Creates a symbolic link `name` in `parent` pointing to `target`.
    pub fn symlink(
        &mut self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        check_name(name)?;
        if target.is_empty() || target.len() > SYMLINK_MAX {
            return Err(FsError::Invalid(format!(
                "symlink target of {} bytes: allowed 1..={SYMLINK_MAX}",
                target.len()
            )));
        }
        // The target takes one page (`SYMLINK_MAX` < a page). Check for it before
        // anything is logged: a symlink is created whole or not at all. (A device
        // error on the target's write fails the shard instead: `end_request`.)
        if self.page_bitmap.free() == 0 {
            return Err(FsError::NoSpace);
        }
        let args =
            CreateArgs { kind: FileType::Symlink, perm: 0o777, uid, gid, rdev: 0, layout: None };
        let attr = self.create_inner(parent, name, args)?;
        let mut inode = self.inode(attr.ino)?;
        self.write_in_op(&mut inode, 0, target)?;
        self.finish()?;
        self.getattr(attr.ino)
    }

    /// The target of symbolic link `ino`.
    pub fn readlink(&mut self, ino: InodeId) -> FsResult<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.kind != FileType::Symlink {
            return Err(FsError::Invalid(format!("inode {ino} is not a symbolic link")));
        }
        // With misses deferred, the target is not read waiting: when memory
        // does not hold its bytes, their pages start being read ahead and
        // the request stops until they are in (`set_defer_misses`).
        if self.defer_misses && self.op_changes == 0 {
            let pieces = self.data_pieces(&inode, 0, inode.size as usize);
            let mut stop = false;
            for (run, first, pages, ..) in pieces {
                stop |= self.merge_waits(run.page + first, pages);
            }
            if stop {
                self.stats.reads_deferred += 1;
                self.deferred = Some(super::DeferredOn::Data);
                return Err(FsError::TryAgain);
            }
        }
        self.read(ino, 0, inode.size as usize)
    }

    fn create_inner(
        &mut self,
        parent: InodeId,
        name: &[u8],
        args: CreateArgs,
    ) -> FsResult<FileAttr> {
        // An rmdir of `parent` deciding, or a rename over it: wait for the
        // outcome (`NotFound` once it is known removed).
        self.check_new_name_in(parent, name)?;
        self.follow_room(1)?;
        self.ensure_ino_floor()?;
        self.begin()?;
        if self.dentries.get(parent, name).is_some() {
            return Err(FsError::Exists);
        }
        self.reserve_table_bytes(tables::dentry_bytes(name) + tables::INODE_BYTES)?;
        let now = self.now();
        let parent_inode = self.new_entry_parent(parent)?;
        let (mut dir_layout, file_layout) =
            args.layout.or(parent_inode.map(|p| (p.dir_layout, p.file_layout))).unwrap_or_default();
        if args.kind == FileType::Directory {
            // A client that cached the parent's layout from before its change
            // sends the old one; this shard knows better for a minute.
            dir_layout = self.relaid_layout(parent).unwrap_or(dir_layout);
        }
        let child = Inode {
            ino: InodeId(0),
            parent,
            kind: args.kind,
            perm: args.perm & 0o7777,
            uid: args.uid,
            gid: args.gid,
            size: 0,
            nlink: if args.kind == FileType::Directory { 2 } else { 1 },
            rdev: args.rdev,
            atime_ns: now,
            mtime_ns: now,
            ctime_ns: now,
            dir_layout,
            file_layout,
            first_block: None,
            pages: 0,
            data_end: 0,
        };
        let child = self.new_inode(child)?;
        self.log(Change::DentryPut {
            parent,
            name: name.to_vec(),
            value: encode_dentry(child.ino, args.kind),
        })?;
        if let Some(mut p) = parent_inode {
            p.mtime_ns = now;
            p.ctime_ns = now;
            if args.kind == FileType::Directory {
                p.nlink += 1;
            }
            self.put_inode(&p)?;
        } else if args.kind == FileType::Directory {
            // A bigdir name away from the directory's home: its count follows.
            self.follow_adjust(parent, 1)?;
        }
        Ok(child.attr(PAGE_SIZE))
    }

    /// Removes the non-directory `name` from `parent`.
    pub fn unlink(&mut self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        let entry = self.lookup(parent, name)?;
        if entry.kind == FileType::Directory {
            return Err(FsError::IsDir);
        }
        // Both pages read at once when neither is in memory: one stop, not
        // two (and with a small Icache, not one evicted while the other is read).
        self.warm_inodes(&[entry.ino, parent])?;
        self.follow_room(2)?;
        self.begin()?;
        self.remove_entry(parent, &entry)?;
        self.finish()
    }

    /// Adds name `name` in `parent` for the non-directory `ino`, which lives here
    /// (a hard link): the dentry and the grown link count are one record.
    pub fn link(&mut self, ino: InodeId, parent: InodeId, name: &[u8]) -> FsResult<FileAttr> {
        check_name(name)?;
        let inode = self.inode(ino)?;
        check_linkable(&inode)?;
        self.put_link(parent, name, ino, inode.kind, Some(inode))?;
        self.getattr(ino)
    }

    /// Adds name `name` in `parent` for `ino`, whose inode lives on another
    /// shard; that shard counts the link by a follow-up.
    pub fn link_name(
        &mut self,
        ino: InodeId,
        kind: FileType,
        parent: InodeId,
        name: &[u8],
    ) -> FsResult<()> {
        check_name(name)?;
        if kind == FileType::Directory {
            return Err(FsError::NotPermitted);
        }
        if self.is_home_of(ino) {
            // Allocated here and not here: removed.
            return Err(FsError::NotFound);
        }
        self.put_link(parent, name, ino, kind, None)
    }

    /// Grows the link count of `ino` (at its home) for a name on another shard.
    pub fn add_link(&mut self, ino: InodeId) -> FsResult<FileAttr> {
        let mut inode = self.inode(ino)?;
        check_linkable(&inode)?;
        self.begin()?;
        inode.nlink += 1;
        inode.ctime_ns = self.now();
        self.put_inode(&inode)?;
        self.finish()?;
        Ok(inode.attr(PAGE_SIZE))
    }

    /// The inode of `parent` for a new entry in it: `None` when it lives on
    /// another shard (a bigdir name), `NotDir` or `NotFound` (removed) otherwise.
    fn new_entry_parent(&mut self, parent: InodeId) -> FsResult<Option<Inode>> {
        match self.inode(parent) {
            Ok(p) if p.kind != FileType::Directory => Err(FsError::NotDir),
            Ok(p) if p.nlink == 0 => Err(FsError::NotFound),
            Ok(p) => Ok(Some(p)),
            // This shard allocated `parent` (inodes never move or get reused):
            // missing here means removed, not elsewhere.
            Err(FsError::NotFound) if self.is_home_of(parent) => Err(FsError::NotFound),
            Err(FsError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether `ino` was allocated by this shard (the root: by shard 0), so it
    /// lives here if it lives at all.
    pub(super) fn is_home_of(&self, ino: InodeId) -> bool {
        ino.shard().unwrap_or(pfs_core::ShardId(0)) == self.id()
    }

    fn put_link(
        &mut self,
        parent: InodeId,
        name: &[u8],
        ino: InodeId,
        kind: FileType,
        inode: Option<Inode>,
    ) -> FsResult<()> {
        self.check_new_name_in(parent, name)?;
        if self.dentries.get(parent, name).is_some() {
            return Err(FsError::Exists);
        }
        let parent_inode = self.new_entry_parent(parent)?;
        self.reserve_table_bytes(tables::dentry_bytes(name))?;
        self.follow_room(1)?;
        // A link's record keeps its name too (`follow_link`).
        self.reserve_table_bytes(tables::txn_bytes(name) + 8)?;
        self.begin()?;
        let now = self.now();
        self.log(Change::DentryPut {
            parent,
            name: name.to_vec(),
            value: encode_dentry(ino, kind),
        })?;
        match inode {
            Some(mut i) => {
                i.nlink += 1;
                i.ctime_ns = now;
                self.put_inode(&i)?;
            }
            // The inode lives elsewhere: its home counts the link (follow-up).
            None => self.follow_link(ino, parent, name)?,
        }
        if let Some(mut p) = parent_inode {
            p.mtime_ns = now;
            p.ctime_ns = now;
            self.put_inode(&p)?;
        }
        self.finish()
    }

    /// Removes the empty directory `name` from `parent`.
    pub fn rmdir(&mut self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        let entry = self.lookup(parent, name)?;
        if entry.kind != FileType::Directory {
            return Err(FsError::NotDir);
        }
        self.warm_inodes(&[entry.ino, parent])?;
        if self.dentries.child_count(entry.ino) > 0 {
            return Err(FsError::NotEmpty);
        }
        self.follow_room(2)?;
        self.begin()?;
        self.remove_entry(parent, &entry)?;
        self.finish()
    }

    /// Logs the removal of `entry` from `parent`, dropping its inode when local
    /// (one link of it, when it has more). Returns what the caller's client must
    /// free elsewhere: the inode at its home when it is not here (`remote`), or
    /// the data on other shards of a regular file freed here (`size`).
    pub(super) fn remove_entry(&mut self, parent: InodeId, entry: &DirEntry) -> FsResult<Replaced> {
        let now = self.now();
        let child = match self.inode(entry.ino) {
            Ok(c) => Some(c),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let parent_inode = match self.inode(parent) {
            Ok(p) => Some(p),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        self.log(Change::DentryDel { parent, name: entry.name.clone() })?;
        let mut removed =
            Replaced { ino: entry.ino, size: 0, layout: FileLayout::default(), remote: true };
        match child {
            Some(mut c) => {
                removed.remote = false;
                removed.layout = c.file_layout;
                if c.kind == FileType::Directory || c.nlink <= 1 {
                    if c.kind == FileType::Regular {
                        removed.size = c.size;
                        // Its data on other shards goes too (follow-up).
                        self.follow_free(c.ino, c.file_layout, c.size.max(c.data_end))?;
                    }
                    self.drop_inode(&c)?;
                } else {
                    c.nlink -= 1;
                    c.ctime_ns = now;
                    self.put_inode(&c)?;
                }
            }
            // Moved here by a rename, or a hard link: the home drops the link.
            None if !self.is_home_of(entry.ino) => self.follow_drop(entry.ino)?,
            None => {}
        }
        match parent_inode {
            Some(mut p) => {
                p.mtime_ns = now;
                p.ctime_ns = now;
                if entry.kind == FileType::Directory {
                    p.nlink -= 1;
                }
                self.put_inode(&p)?;
            }
            None if entry.kind == FileType::Directory => self.follow_adjust(parent, -1)?,
            None => {}
        }
        Ok(removed)
    }

    /// Renames within this shard, with POSIX replace rules and Linux flags.
    /// Returns the inode whose name it replaced, for the client to free what of
    /// it lives elsewhere (as after an unlink).
    pub fn rename(
        &mut self,
        src_parent: InodeId,
        src_name: &[u8],
        dst_parent: InodeId,
        dst_name: &[u8],
        flags: RenameFlags,
    ) -> FsResult<Option<Replaced>> {
        check_name(dst_name)?;
        if flags.noreplace && flags.exchange {
            return Err(FsError::Invalid("RENAME_NOREPLACE and RENAME_EXCHANGE together".into()));
        }
        self.check_name_placed(src_parent, src_name)?;
        let src = self.lookup(src_parent, src_name)?;
        self.check_new_name_in(dst_parent, dst_name)?;
        let dst = match self.lookup(dst_parent, dst_name) {
            Ok(d) => Some(d),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        if src.kind == FileType::Directory && self.is_ancestor(src.ino, dst_parent)? {
            return Err(FsError::Invalid("cannot move a directory into itself".into()));
        }
        if let Some(d) = &dst {
            if d.ino == src.ino {
                return Ok(None); // Same inode: POSIX says do nothing.
            }
            if flags.noreplace {
                return Err(FsError::Exists);
            }
            if flags.exchange {
                if d.kind == FileType::Directory && self.is_ancestor(d.ino, src_parent)? {
                    return Err(FsError::Invalid("cannot move a directory into itself".into()));
                }
            } else {
                match (src.kind == FileType::Directory, d.kind == FileType::Directory) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if self.dentries.child_count(d.ino) > 0 => {
                        return Err(FsError::NotEmpty)
                    }
                    _ => {}
                }
            }
        } else if flags.exchange {
            return Err(FsError::NotFound);
        }
        self.reserve_table_bytes(tables::dentry_bytes(dst_name))?;
        let mut inos = vec![src_parent, dst_parent, src.ino];
        inos.extend(dst.as_ref().map(|d| d.ino));
        self.warm_inodes(&inos)?;
        self.follow_room(6)?;
        self.begin()?;
        let now = self.now();
        let src_value = encode_dentry(src.ino, src.kind);
        let mut replaced = None;
        match (&dst, flags.exchange) {
            (Some(d), true) => {
                self.log(Change::DentryPut {
                    parent: src_parent,
                    name: src_name.to_vec(),
                    value: encode_dentry(d.ino, d.kind),
                })?;
                self.log(Change::DentryPut {
                    parent: dst_parent,
                    name: dst_name.to_vec(),
                    value: src_value,
                })?;
                self.reparent(d.ino, src_parent, now)?;
                self.reparent(src.ino, dst_parent, now)?;
                if src_parent != dst_parent && src.kind != d.kind {
                    let (to_dst, to_src) =
                        if src.kind == FileType::Directory { (1, -1) } else { (-1, 1) };
                    self.adjust_dir(dst_parent, to_dst, now)?;
                    self.adjust_dir(src_parent, to_src, now)?;
                } else {
                    self.adjust_dir(dst_parent, 0, now)?;
                    self.adjust_dir(src_parent, 0, now)?;
                }
            }
            _ => {
                if let Some(d) = &dst {
                    // The replaced entry goes away like an unlink or rmdir.
                    replaced = Some(self.remove_entry(dst_parent, d)?);
                }
                self.log(Change::DentryDel { parent: src_parent, name: src_name.to_vec() })?;
                self.log(Change::DentryPut {
                    parent: dst_parent,
                    name: dst_name.to_vec(),
                    value: src_value,
                })?;
                self.reparent(src.ino, dst_parent, now)?;
                let dirs = (src.kind == FileType::Directory) as i64;
                if src_parent != dst_parent {
                    self.adjust_dir(src_parent, -dirs, now)?;
                    self.adjust_dir(dst_parent, dirs, now)?;
                } else {
                    self.adjust_dir(src_parent, 0, now)?;
                }
            }
        }
        self.finish()?;
        Ok(replaced)
    }

    /// Whether `dir` is `ino` or one of its ancestors (as far as this shard knows).
    pub(super) fn is_ancestor(&mut self, dir: InodeId, mut ino: InodeId) -> FsResult<bool> {
        for _depth in 0..4096 {
            if ino == dir {
                return Ok(true);
            }
            if ino == InodeId::ROOT {
                return Ok(false);
            }
            match self.inode(ino) {
                Ok(i) => ino = i.parent,
                Err(FsError::NotFound) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Err(FsError::Io("directory tree deeper than 4096 levels".into()))
    }

    pub(super) fn reparent(&mut self, ino: InodeId, parent: InodeId, now: i64) -> FsResult<()> {
        match self.inode(ino) {
            Ok(mut i) => {
                i.parent = parent;
                i.ctime_ns = now;
                self.put_inode(&i)
            }
            // Its home is another shard: the pointer follows there (the walk
            // that refuses a directory moved into its own subtree reads it).
            Err(FsError::NotFound) if !self.is_home_of(ino) => {
                let home = ino.shard().unwrap_or(pfs_core::ShardId(0));
                let op = pfs_core::wire::FollowOp::Reparent { ino, parent };
                self.follow(super::follow::FollowTarget::Shard(home), op)
            }
            Err(FsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The directory holding the (last) name of `ino`, which lives here.
    pub fn parent_of(&mut self, ino: InodeId) -> FsResult<InodeId> {
        Ok(self.inode(ino)?.parent)
    }

    /// At a directory's home: an entry of it changed on another shard (a
    /// bigdir); sets its times and adds `nlink_delta` subdirectories. A
    /// directory gone meanwhile is not an error.
    pub fn touch_dir(&mut self, dir: InodeId, nlink_delta: i64) -> FsResult<()> {
        match self.inode(dir) {
            Ok(d) if d.kind == FileType::Directory => {}
            Ok(_) => return Err(FsError::NotDir),
            Err(FsError::NotFound) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.begin()?;
        let now = self.now();
        self.adjust_dir(dir, nlink_delta, now)?;
        self.finish()
    }

    pub(super) fn adjust_dir(&mut self, dir: InodeId, nlink_delta: i64, now: i64) -> FsResult<()> {
        match self.inode(dir) {
            Ok(mut d) => {
                // Never below 2 ("." and its name), whatever a client sends.
                d.nlink = (d.nlink as i64 + nlink_delta).clamp(2, u32::MAX as i64) as u32;
                d.mtime_ns = now;
                d.ctime_ns = now;
                self.put_inode(&d)
            }
            // Its home is another shard (a bigdir): the count follows there.
            Err(FsError::NotFound) => self.follow_adjust(dir, nlink_delta),
            Err(e) => Err(e),
        }
    }

    /// Up to `max` entries of `dir` after the name `after` (all if `None`), in
    /// name order; pass the last name back to continue.
    pub fn readdir(
        &mut self,
        dir: InodeId,
        after: Option<&[u8]>,
        max: usize,
    ) -> FsResult<Vec<DirEntry>> {
        match self.inode(dir) {
            Ok(inode) if inode.kind != FileType::Directory => return Err(FsError::NotDir),
            // Its page is being read (`set_defer_misses`): run again then.
            Err(FsError::TryAgain) if self.deferred.is_some() => return Err(FsError::TryAgain),
            _ => {}
        }
        let mut out = Vec::with_capacity(max.min(1024));
        self.dentries.for_each_from(dir, after, |name, value| {
            let (ino, kind) = decode_dentry(value);
            out.push(DirEntry { name: name.to_vec(), ino, kind });
            out.len() < max
        });
        Ok(out)
    }

    /// Entries in `dir` on this shard.
    pub fn child_count(&self, dir: InodeId) -> usize {
        self.dentries.child_count(dir)
    }

    /// Marks regular file `ino`'s data changed: `mtime` and `ctime` to now. For
    /// writes that went to other shards, whose times are the home's business.
    pub fn touch_data(&mut self, ino: InodeId) -> FsResult<FileAttr> {
        let mut inode = self.inode(ino)?;
        if inode.kind != FileType::Regular {
            return Err(FsError::Invalid(format!("touch the data of a {:?}", inode.kind)));
        }
        self.begin()?;
        let now = self.now();
        inode.mtime_ns = now;
        inode.ctime_ns = now;
        self.put_inode(&inode)?;
        self.finish()?;
        Ok(inode.attr(PAGE_SIZE))
    }

    /// Changes attributes; a size change truncates or extends.
    pub fn setattr(&mut self, ino: InodeId, set: SetAttr) -> FsResult<FileAttr> {
        let mut inode = self.inode(ino)?;
        if set.size.is_some() && inode.kind != FileType::Regular {
            return Err(if inode.kind == FileType::Directory {
                FsError::IsDir
            } else {
                FsError::Invalid("truncate of a special file".into())
            });
        }
        if set.size.is_some() {
            self.settle(ino)?;
            self.follow_room(1)?;
        }
        self.begin()?;
        let now = self.now();
        if let Some(size) = set.size {
            let bs = u64::from(self.geo.block_size);
            // Past the size too: a writer that died before it published its
            // size may have left data up to what it reserved.
            let old_size = inode.size.max(inode.data_end);
            // Only a cut frees: growing the size (a truncate up, or a writer
            // publishing its size) must keep what other writers put past the
            // new size and have not published yet.
            let cut = size < inode.size;
            if cut && super::follow::has_remote_data(inode.file_layout, size, old_size, bs) {
                // Data past the cut on other shards goes before the reply
                // (the worker holds it until that follow-up is done).
                let op = pfs_core::wire::FollowOp::CutData {
                    ino,
                    layout: inode.file_layout,
                    size,
                    old_size,
                };
                self.follow(super::follow::FollowTarget::DataShards, op)?;
            }
            self.truncate_in_op(&mut inode, size)?;
            inode.mtime_ns = now;
        }
        if let Some(perm) = set.perm {
            inode.perm = perm & 0o7777;
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        if let Some(t) = set.atime_ns {
            inode.atime_ns = t;
        }
        if let Some(t) = set.mtime_ns {
            inode.mtime_ns = t;
        }
        inode.ctime_ns = now;
        self.put_inode(&inode)?;
        self.finish()?;
        Ok(inode.attr(PAGE_SIZE))
    }

    /// Usage of this shard.
    pub fn statfs(&self) -> StatFs {
        StatFs {
            block_size: PAGE_SIZE as u32,
            blocks: self.geo.data_pages,
            blocks_free: self.page_bitmap.free(),
            files: self.geo.inode_slots,
            files_free: self.slot_bitmap.free(),
            name_max: NAME_MAX as u32,
        }
    }

    /// Value of extended attribute `name` (layouts included).
    pub fn getxattr(&mut self, ino: InodeId, name: &[u8]) -> FsResult<Vec<u8>> {
        let inode = self.inode(ino)?;
        if name == XATTR_DIR_LAYOUT {
            if inode.kind != FileType::Directory {
                return Err(FsError::NoAttr);
            }
            return Ok(dir_layout_name(inode.dir_layout).as_bytes().to_vec());
        }
        if name == XATTR_FILE_LAYOUT {
            return Ok(file_layout_name(inode.file_layout).as_bytes().to_vec());
        }
        if acl::is_acl(name) {
            // None is kept (an ACL the mode expresses is the mode); one kept
            // by a version before 2026-11-28 was never in force.
            return Err(FsError::NoAttr);
        }
        self.xattrs.get(&ino).and_then(|m| m.get(name)).cloned().ok_or(FsError::NoAttr)
    }

    /// Sets extended attribute `name`. The layout attributes change the inode.
    pub fn setxattr(
        &mut self,
        ino: InodeId,
        name: &[u8],
        value: &[u8],
        flags: XattrFlags,
    ) -> FsResult<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(FsError::Range);
        }
        if value.len() > XATTR_VALUE_MAX {
            return Err(FsError::Range);
        }
        let mut inode = self.inode(ino)?;
        if name == XATTR_DIR_LAYOUT || name == XATTR_FILE_LAYOUT {
            let text = std::str::from_utf8(value).unwrap_or("").trim();
            if name == XATTR_DIR_LAYOUT {
                if inode.kind != FileType::Directory {
                    return Err(FsError::Invalid(
                        "user.pfs.dir_layout applies to directories only".into(),
                    ));
                }
                inode.dir_layout = parse_dir_layout(text)?;
            } else {
                if inode.kind == FileType::Regular
                    && inode.size > 0
                    && parse_file_layout(text)? != inode.file_layout
                {
                    return Err(FsError::Invalid(
                        "the data layout of a non-empty file cannot change".into(),
                    ));
                }
                inode.file_layout = parse_file_layout(text)?;
            }
            self.begin()?;
            inode.ctime_ns = self.now();
            self.put_inode(&inode)?;
            return self.finish();
        }
        if name == acl::XATTR_ACL_DEFAULT {
            return Err(acl::default_refused());
        }
        let exists = self.xattrs.get(&ino).is_some_and(|m| m.contains_key(name));
        if name == acl::XATTR_ACL_ACCESS {
            // The mode is the ACL (`acl.rs`); the set is a chmod of the
            // permission bits, as ext4 makes it.
            let perm = acl::access_perm(value)?;
            self.begin()?;
            if exists {
                self.log(Change::XattrDel { ino, name: name.to_vec() })?;
            }
            inode.perm = (inode.perm & !0o777) | perm;
            inode.ctime_ns = self.now();
            self.put_inode(&inode)?;
            return self.finish();
        }
        if flags.create && exists {
            return Err(FsError::Exists);
        }
        if flags.replace && !exists {
            return Err(FsError::NoAttr);
        }
        self.reserve_table_bytes(tables::xattr_bytes(name, value))?;
        self.begin()?;
        self.log(Change::XattrPut { ino, name: name.to_vec(), value: value.to_vec() })?;
        inode.ctime_ns = self.now();
        self.put_inode(&inode)?;
        self.finish()
    }

    /// Names of the extended attributes of `ino`.
    pub fn listxattr(&mut self, ino: InodeId) -> FsResult<Vec<Vec<u8>>> {
        self.inode(ino)?;
        let Some(m) = self.xattrs.get(&ino) else { return Ok(Vec::new()) };
        Ok(m.keys().filter(|n| !acl::is_acl(n)).cloned().collect())
    }

    /// Removes extended attribute `name`.
    pub fn removexattr(&mut self, ino: InodeId, name: &[u8]) -> FsResult<()> {
        let mut inode = self.inode(ino)?;
        if !self.xattrs.get(&ino).is_some_and(|m| m.contains_key(name)) {
            return Err(FsError::NoAttr);
        }
        self.begin()?;
        self.log(Change::XattrDel { ino, name: name.to_vec() })?;
        inode.ctime_ns = self.now();
        self.put_inode(&inode)?;
        self.finish()
    }
}

/// The `user.pfs.dir_layout` spelling of a layout.
pub fn dir_layout_name(l: DirLayout) -> &'static str {
    match l {
        DirLayout::Regular => "regular",
        DirLayout::BigDir => "bigdir",
    }
}

/// The `user.pfs.file_layout` spelling of a layout.
pub fn file_layout_name(l: FileLayout) -> &'static str {
    match l {
        FileLayout::Block => "block",
        FileLayout::File => "file",
        FileLayout::Io => "io",
    }
}

fn parse_dir_layout(s: &str) -> FsResult<DirLayout> {
    match s {
        "regular" => Ok(DirLayout::Regular),
        "bigdir" => Ok(DirLayout::BigDir),
        _ => Err(FsError::Invalid(format!("directory layout {s:?}: expected regular or bigdir"))),
    }
}

fn parse_file_layout(s: &str) -> FsResult<FileLayout> {
    match s {
        "block" => Ok(FileLayout::Block),
        "file" => Ok(FileLayout::File),
        "io" => Ok(FileLayout::Io),
        _ => Err(FsError::Invalid(format!("file layout {s:?}: expected block, file or io"))),
    }
}
