//! Requests, client to server (and `TokenInvalidate`, server to client).

use super::cluster::{read_addr, write_addr, Usage};
use super::cursor::{Reader, Writer};
use super::follow::{FollowOp, MAX_FOLLOW_BYTES, MAX_FOLLOW_UPS};
use super::types::{
    read_kind, read_name, read_perm, write_name, write_perm, Codec, FileLock, InodeLayout,
    RenameFlags, TokenMode, XattrSetMode,
};
use super::{Opcode, WireError, MAX_IO_BYTES, MAX_SYMLINK_BYTES, MAX_XATTR_VALUE_BYTES};
use crate::{
    DirLayout, FileHandle, FileLayout, FileType, InodeId, ServerId, SetAttr, ShardId, WorkerId,
};

/// The server id a `Register` of a new server carries.
const NO_SERVER: u32 = u32::MAX;

fn read_file_layout(r: &mut Reader<'_>) -> Result<FileLayout, WireError> {
    let v = r.u8("file layout")?;
    FileLayout::from_u8(v).ok_or(WireError::BadValue { what: "file layout", value: v.into() })
}

/// A `Write` or `WriteData` request whose data stays in the frame it came in
/// ([`Frame::decode_write`](super::Frame::decode_write)): the server writes it
/// to the device buffer from there, without a copy into a request of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteRef<'a> {
    /// The file.
    pub ino: InodeId,
    /// Which of the two requests, and what it carries besides.
    pub target: WriteTarget,
    /// Byte offset in the file.
    pub offset: u64,
    /// The bytes.
    pub data: &'a [u8],
}

/// What a [`WriteRef`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteTarget {
    /// `Write`, at the file's home, through this handle.
    Home(FileHandle),
    /// `WriteData`, on another shard, of a file with this data layout.
    Elsewhere(FileLayout),
}

impl<'a> WriteRef<'a> {
    /// Decodes the body of a `Write` or `WriteData` (`op`) as [`Request`]'s
    /// decoding does, borrowing the data; `None` for any other opcode.
    pub(crate) fn get(op: Opcode, r: &mut Reader<'a>) -> Option<Result<WriteRef<'a>, WireError>> {
        let get = |r: &mut Reader<'a>| {
            let ino = InodeId(r.u64("ino")?);
            let target = match op {
                Opcode::Write => WriteTarget::Home(FileHandle(r.u64("file handle")?)),
                _ => WriteTarget::Elsewhere(read_file_layout(r)?),
            };
            let offset = r.u64("write offset")?;
            let data = r.bytes32("write data", MAX_IO_BYTES)?;
            Ok(WriteRef { ino, target, offset, data })
        };
        matches!(op, Opcode::Write | Opcode::WriteData).then(|| get(r))
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        match self.target {
            WriteTarget::Home(_) => Opcode::Write,
            WriteTarget::Elsewhere(_) => Opcode::WriteData,
        }
    }

    /// Writes the body, as [`Request`]'s encoding does.
    pub(crate) fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u64(self.ino.0);
        match self.target {
            WriteTarget::Home(fh) => w.u64(fh.0),
            WriteTarget::Elsewhere(layout) => w.u8(layout as u8),
        }
        w.u64(self.offset);
        w.bytes32("write data", self.data, MAX_IO_BYTES)
    }

    /// The owned request.
    pub fn to_request(&self) -> Request {
        let (ino, offset, data) = (self.ino, self.offset, self.data.to_vec());
        match self.target {
            WriteTarget::Home(fh) => Request::Write { ino, fh, offset, data },
            WriteTarget::Elsewhere(layout) => Request::WriteData { ino, layout, offset, data },
        }
    }
}

/// A request; each variant is one [`Opcode`].
///
/// Names are raw bytes (POSIX names need not be UTF-8) of at most `NAME_MAX`; whether
/// a name is acceptable (no `/`, not empty) is for the server to judge, not the wire.
/// Owner ids on creating requests are the caller's: permission checks are the
/// kernel's (`default_permissions`), so no other request carries credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Answer once every change this shard acknowledged before the request
    /// is durable, at the shard's own commit pace (it does not hurry the
    /// commit, as `Fsync` does); the reply's boot id tells whether the
    /// server restarted since those changes. A client's background check
    /// that old changes are durable (docs/reliability.md).
    Durable,
    /// Resolve `name` in `parent`.
    Lookup {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// [`Lookup`](Self::Lookup), and the data of the file found when it is a
    /// regular file of at most [`MAX_LOOKUP_DATA_BYTES`](super::MAX_LOOKUP_DATA_BYTES)
    /// bytes whose data the server holds in memory (no device read).
    LookupData {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// Read attributes.
    GetAttr {
        /// The inode.
        ino: InodeId,
    },
    /// Change the attributes that are `Some` in `set`.
    SetAttr {
        /// The inode.
        ino: InodeId,
        /// The changes.
        set: SetAttr,
    },
    /// Create a regular file `name` in `parent` and open it.
    Create {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// Permission bits, umask applied.
        perm: u16,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// `open(2)` flags.
        flags: u32,
        /// The new file's data layout (the client knows the parent's default).
        layout: FileLayout,
    },
    /// Create directory `name` in `parent`.
    Mkdir {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// Permission bits, umask applied.
        perm: u16,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// The new directory's layouts.
        layout: InodeLayout,
    },
    /// Create a device node, fifo, socket (or empty regular file) `name` in `parent`.
    Mknod {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// The node's type.
        kind: FileType,
        /// Permission bits, umask applied.
        perm: u16,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// Device number, for device nodes.
        rdev: u32,
    },
    /// Create symbolic link `name` in `parent` pointing at `target`.
    Symlink {
        /// The directory.
        parent: InodeId,
        /// The new name.
        name: Vec<u8>,
        /// The link's target, at most [`MAX_SYMLINK_BYTES`].
        target: Vec<u8>,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// Read a symbolic link's target.
    ReadLink {
        /// The link.
        ino: InodeId,
    },
    /// Remove the non-directory `name` from `parent`.
    Unlink {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// Remove the empty directory `name` from `parent`.
    Rmdir {
        /// The directory.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// Move `parent/name` to `new_parent/new_name`.
    Rename {
        /// The source directory.
        parent: InodeId,
        /// The source name.
        name: Vec<u8>,
        /// The target directory.
        new_parent: InodeId,
        /// The target name.
        new_name: Vec<u8>,
        /// `NOREPLACE`, `EXCHANGE`, or neither.
        flags: RenameFlags,
    },
    /// List directory `ino` (the entries one shard holds) in name order after `after`.
    ReadDir {
        /// The directory.
        ino: InodeId,
        /// Where to resume: the last name already seen (empty: from the start).
        after: Vec<u8>,
        /// Most entries to return.
        max_entries: u32,
        /// Most reply payload bytes to use; the server caps it at the frame limit.
        max_bytes: u32,
        /// Also return attributes (readdirplus).
        plus: bool,
        /// The directory's layout as the client lists it: a shard where that
        /// layout would miss names answers `Misrouted` (the layout changed).
        layout: DirLayout,
    },
    /// Open a file.
    Open {
        /// The file.
        ino: InodeId,
        /// `open(2)` flags.
        flags: u32,
    },
    /// Close an open file.
    Release {
        /// The file.
        ino: InodeId,
        /// The handle from open or create.
        fh: FileHandle,
        /// The flags it was opened with.
        flags: u32,
    },
    /// Read up to `size` bytes at `offset` (short at the end of the file), or
    /// only the blocks of that range that `blocks` picks ([`read_segments`]).
    Read {
        /// The file.
        ino: InodeId,
        /// The handle.
        fh: FileHandle,
        /// Byte offset.
        offset: u64,
        /// Bytes wanted, at most [`MAX_IO_BYTES`].
        size: u32,
        /// Bit `i`: the `i`-th file block the range touches is read
        /// ([`ALL_BLOCKS`]: the whole range).
        blocks: u32,
    },
    /// Write `data` at `offset`.
    Write {
        /// The file.
        ino: InodeId,
        /// The handle.
        fh: FileHandle,
        /// Byte offset.
        offset: u64,
        /// The bytes, at most [`MAX_IO_BYTES`].
        data: Vec<u8>,
    },
    /// Make the file's data (and, unless `datasync`, its attributes) durable.
    Fsync {
        /// The file.
        ino: InodeId,
        /// The handle.
        fh: FileHandle,
        /// `fdatasync` rather than `fsync`.
        datasync: bool,
    },
    /// Usage of the shard that receives it.
    StatFs,
    /// Read extended attribute `name`.
    GetXattr {
        /// The inode.
        ino: InodeId,
        /// The attribute name.
        name: Vec<u8>,
    },
    /// Set extended attribute `name` to `value`.
    SetXattr {
        /// The inode.
        ino: InodeId,
        /// The attribute name.
        name: Vec<u8>,
        /// The value, at most [`MAX_XATTR_VALUE_BYTES`].
        value: Vec<u8>,
        /// Create-only, replace-only, or either.
        mode: XattrSetMode,
    },
    /// List extended attribute names.
    ListXattr {
        /// The inode.
        ino: InodeId,
    },
    /// Remove extended attribute `name`.
    RemoveXattr {
        /// The inode.
        ino: InodeId,
        /// The attribute name.
        name: Vec<u8>,
    },
    /// Read the layouts of an inode.
    LayoutGet {
        /// The inode.
        ino: InodeId,
    },
    /// Change the layouts of an inode (new children inherit a directory's).
    LayoutSet {
        /// The inode.
        ino: InodeId,
        /// The new layouts.
        layout: InodeLayout,
    },
    /// Acquire a token on directory `dir`.
    TokenAcquire {
        /// The directory.
        dir: InodeId,
        /// Shared or exclusive.
        mode: TokenMode,
    },
    /// Give back a token on `dir`.
    TokenRelease {
        /// The directory.
        dir: InodeId,
        /// The mode held.
        mode: TokenMode,
    },
    /// Server to client: drop the dentries cached under `dir` and the read token.
    TokenInvalidate {
        /// The directory.
        dir: InodeId,
    },
    /// Write `data` at `offset` of file `ino` on a shard that holds some of its
    /// data but not its inode (a `block` block past the first, an `io` block).
    WriteData {
        /// The file.
        ino: InodeId,
        /// The file's data layout.
        layout: FileLayout,
        /// Byte offset in the file.
        offset: u64,
        /// The bytes, at most [`MAX_IO_BYTES`], within one file block.
        data: Vec<u8>,
    },
    /// Read `size` bytes at `offset` of file `ino` from a data-only shard; holes
    /// read as zeros and the client clamps to the file size.
    ReadData {
        /// The file.
        ino: InodeId,
        /// The file's data layout.
        layout: FileLayout,
        /// Byte offset in the file.
        offset: u64,
        /// Bytes wanted, at most [`MAX_IO_BYTES`].
        size: u32,
        /// Which of the range's blocks are read, as in `Read`.
        blocks: u32,
    },
    /// Free the data at or past `size` that a data-only shard holds for `ino`.
    TruncateData {
        /// The file.
        ino: InodeId,
        /// The file's data layout.
        layout: FileLayout,
        /// The new size.
        size: u64,
        /// The size before (bounds the blocks to look at).
        old_size: u64,
    },
    /// Grow file `ino` to at least `size` bytes (never shrinks) and set its mtime:
    /// sent to the inode's home after writes that went to other shards.
    ExtendSize {
        /// The file.
        ino: InodeId,
        /// The size the file must at least have.
        size: u64,
    },
    /// Grow file `ino` by `len` bytes at its home, for an `O_APPEND` write
    /// of that many: the reply says where the write goes (the size before),
    /// so appends of several clients never overlap. The client then writes
    /// there as any write.
    Append {
        /// The file.
        ino: InodeId,
        /// The write's length (at most `MAX_IO_BYTES`).
        len: u64,
        /// Clear the set-user-ID bit, and the set-group-ID bit of a
        /// group-executable file: the writer may not keep them (the kernel's
        /// `FUSE_WRITE_KILL_SUIDGID`). A file capability goes either way.
        kill_suidgid: bool,
    },
    /// Take, give back, or (`test`) look for a conflict with, a lock on file
    /// `ino`, at the file's home. Never waits: a lock that conflicts is not
    /// taken, and the reply names the conflict (the client retries a
    /// blocking `F_SETLKW`). Every lock request renews the client's lease
    /// on that shard ([`Request::LockRenew`]).
    Lock {
        /// The file.
        ino: InodeId,
        /// Who holds it on its client: the kernel's lock owner (a process's
        /// file table for `fcntl` locks, the open file for `flock`).
        owner: u64,
        /// What and where.
        lock: FileLock,
        /// Only say whether `lock` could be taken (`F_GETLK`).
        test: bool,
        /// Take again a lock the client held before the server restarted
        /// (it saw a new epoch): granted in the grace period after a
        /// restart, when other locks wait.
        reclaim: bool,
    },
    /// Extend the lease of every lock the client holds on this shard; a
    /// client that stops renewing (it died, or lost its network) loses them
    /// when the lease runs out.
    LockRenew,
    /// Server to master, at start: join the cluster (or rejoin as `server`).
    Register {
        /// The id this server had (read from its zones), or `None` for a new one.
        server: Option<ServerId>,
        /// Where clients reach it, `host:port`.
        addr: String,
        /// Its worker count.
        workers: u32,
        /// Its usage now.
        usage: Usage,
    },
    /// Server to master: still alive, with its usage.
    Heartbeat {
        /// The reporting server.
        server: ServerId,
        /// Its usage now.
        usage: Usage,
    },
    /// Client to master: the cluster view.
    GetView,
    /// A rename whose target name is held by another shard, sent to the shard of
    /// the source name, which coordinates it (docs/cluster.md).
    RenameCross {
        /// The source directory.
        parent: InodeId,
        /// The source name.
        name: Vec<u8>,
        /// The target directory.
        new_parent: InodeId,
        /// The target name.
        new_name: Vec<u8>,
        /// `NOREPLACE`, `EXCHANGE`, or neither.
        flags: RenameFlags,
        /// The server holding the target name.
        target_server: ServerId,
        /// Its worker holding the target name.
        target_worker: WorkerId,
    },
    /// Coordinator to participant: put dentry value `value` at `parent/name` for
    /// transaction `txn` (applied at most once per `txn`).
    XRenameTarget {
        /// The transaction.
        txn: u64,
        /// The target directory.
        parent: InodeId,
        /// The target name.
        name: Vec<u8>,
        /// The moved entry: its inode with its type in the top byte.
        value: u64,
        /// `NOREPLACE`, `EXCHANGE`, or neither.
        flags: RenameFlags,
    },
    /// Coordinator to participant: transaction `txn` is done.
    TxnForget {
        /// The transaction.
        txn: u64,
        /// The directory a seal of it names was removed: the participant
        /// remembers it gone and refuses new names in it (`ENOENT`).
        dir_removed: bool,
    },
    /// Drop one link of inode `ino` (at its home) after its name, held by another
    /// shard, was removed (`Unlink`/`Rmdir` replies say so with `remote`); the
    /// inode is freed when no link is left.
    DropInode {
        /// The inode.
        ino: InodeId,
    },
    /// Remove the empty `bigdir` directory `name` from `parent`, sent to the shard
    /// of the name, which checks emptiness on every shard atomically.
    RmdirBigDir {
        /// The directory holding the name.
        parent: InodeId,
        /// The name.
        name: Vec<u8>,
    },
    /// Coordinator to participant: seal `dir` for transaction `txn` if this shard
    /// holds none of its entries (creates in it then wait), else `NotEmpty`.
    SealDir {
        /// The transaction.
        txn: u64,
        /// The directory.
        dir: InodeId,
    },
    /// Add name `new_name` in `new_parent` for the existing non-directory `ino`
    /// (a hard link); sent to the shard of the new name. If `ino` lives there its
    /// link count grows in the same operation; otherwise the client grew it at
    /// the home first (`AddLink`).
    Link {
        /// The inode the name will point at.
        ino: InodeId,
        /// Its type (kept in the dentry).
        kind: FileType,
        /// The directory of the new name.
        new_parent: InodeId,
        /// The new name.
        new_name: Vec<u8>,
    },
    /// Grow the link count of `ino` at its home for a name on another shard.
    AddLink {
        /// The inode.
        ino: InodeId,
    },
    /// At `dir`'s home: an entry of `dir` was added or removed on another shard;
    /// set its mtime and ctime, and add `nlink_delta` (subdirectories) to its
    /// link count.
    AdjustDir {
        /// The directory.
        dir: InodeId,
        /// Subdirectories added (positive) or removed (negative), -2..=2.
        nlink_delta: i32,
    },
    /// Server to server: apply follow-ups `ops` (id, operation) of shard `from`,
    /// each at most once: ids at or below the watermark this shard keeps for
    /// `from` were applied before (docs/cluster.md, "Follow-ups").
    FollowUps {
        /// The sending shard.
        from: ShardId,
        /// The follow-ups in id order, at most `MAX_FOLLOW_UPS`.
        ops: Vec<(u64, FollowOp)>,
    },
    /// At a file's home, before a write of data below `end` to another shard:
    /// that shard may hold data of it, so a truncate or removal frees there.
    ReserveData {
        /// The file.
        ino: InodeId,
        /// The end of the data about to be written elsewhere.
        end: u64,
    },
    /// At an inode's home: the directory holding its (last) name (the root's
    /// is the root).
    GetParent {
        /// The inode.
        ino: InodeId,
    },
}

impl Request {
    /// The directories in which the request looks up, makes or removes a
    /// name: the directories whose entries a change of it touches, and where
    /// a `NotFound` may mean that the directory itself is gone.
    pub fn name_dirs(&self) -> [Option<InodeId>; 2] {
        match *self {
            Request::Lookup { parent, .. }
            | Request::LookupData { parent, .. }
            | Request::Create { parent, .. }
            | Request::Mkdir { parent, .. }
            | Request::Mknod { parent, .. }
            | Request::Symlink { parent, .. }
            | Request::Unlink { parent, .. }
            | Request::Rmdir { parent, .. }
            | Request::RmdirBigDir { parent, .. }
            | Request::XRenameTarget { parent, .. } => [Some(parent), None],
            Request::Link { new_parent, .. } => [Some(new_parent), None],
            Request::Rename { parent, new_parent, .. }
            | Request::RenameCross { parent, new_parent, .. } => [Some(parent), Some(new_parent)],
            _ => [None, None],
        }
    }

    /// Whether the request may change a shard (the server then schedules a
    /// commit, and the client counts it as not yet durable until one).
    pub fn is_mutation(&self) -> bool {
        !matches!(
            self,
            Request::Lookup { .. }
                | Request::LookupData { .. }
                | Request::GetAttr { .. }
                | Request::ReadLink { .. }
                | Request::ReadDir { .. }
                | Request::Open { .. }
                | Request::Read { .. }
                | Request::ReadData { .. }
                | Request::StatFs
                | Request::Durable
                | Request::GetXattr { .. }
                | Request::ListXattr { .. }
                | Request::LayoutGet { .. }
                | Request::GetParent { .. }
                | Request::Lock { .. }
                | Request::LockRenew
        )
    }

    /// This request's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Lookup { .. } => Opcode::Lookup,
            Request::LookupData { .. } => Opcode::LookupData,
            Request::GetAttr { .. } => Opcode::GetAttr,
            Request::SetAttr { .. } => Opcode::SetAttr,
            Request::Create { .. } => Opcode::Create,
            Request::Mkdir { .. } => Opcode::Mkdir,
            Request::Mknod { .. } => Opcode::Mknod,
            Request::Symlink { .. } => Opcode::Symlink,
            Request::ReadLink { .. } => Opcode::ReadLink,
            Request::Unlink { .. } => Opcode::Unlink,
            Request::Rmdir { .. } => Opcode::Rmdir,
            Request::Rename { .. } => Opcode::Rename,
            Request::ReadDir { .. } => Opcode::ReadDir,
            Request::Open { .. } => Opcode::Open,
            Request::Release { .. } => Opcode::Release,
            Request::Read { .. } => Opcode::Read,
            Request::Write { .. } => Opcode::Write,
            Request::Fsync { .. } => Opcode::Fsync,
            Request::StatFs => Opcode::StatFs,
            Request::Durable => Opcode::Durable,
            Request::GetXattr { .. } => Opcode::GetXattr,
            Request::SetXattr { .. } => Opcode::SetXattr,
            Request::ListXattr { .. } => Opcode::ListXattr,
            Request::RemoveXattr { .. } => Opcode::RemoveXattr,
            Request::LayoutGet { .. } => Opcode::LayoutGet,
            Request::LayoutSet { .. } => Opcode::LayoutSet,
            Request::TokenAcquire { .. } => Opcode::TokenAcquire,
            Request::TokenRelease { .. } => Opcode::TokenRelease,
            Request::TokenInvalidate { .. } => Opcode::TokenInvalidate,
            Request::WriteData { .. } => Opcode::WriteData,
            Request::ReadData { .. } => Opcode::ReadData,
            Request::TruncateData { .. } => Opcode::TruncateData,
            Request::ExtendSize { .. } => Opcode::ExtendSize,
            Request::Append { .. } => Opcode::Append,
            Request::Lock { .. } => Opcode::Lock,
            Request::LockRenew => Opcode::LockRenew,
            Request::Register { .. } => Opcode::Register,
            Request::Heartbeat { .. } => Opcode::Heartbeat,
            Request::GetView => Opcode::GetView,
            Request::RenameCross { .. } => Opcode::RenameCross,
            Request::XRenameTarget { .. } => Opcode::XRenameTarget,
            Request::TxnForget { .. } => Opcode::TxnForget,
            Request::DropInode { .. } => Opcode::DropInode,
            Request::RmdirBigDir { .. } => Opcode::RmdirBigDir,
            Request::SealDir { .. } => Opcode::SealDir,
            Request::Link { .. } => Opcode::Link,
            Request::AddLink { .. } => Opcode::AddLink,
            Request::AdjustDir { .. } => Opcode::AdjustDir,
            Request::FollowUps { .. } => Opcode::FollowUps,
            Request::ReserveData { .. } => Opcode::ReserveData,
            Request::GetParent { .. } => Opcode::GetParent,
        }
    }

    /// Appends the payload (no header).
    pub(crate) fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        match self {
            Request::Lookup { parent, name }
            | Request::LookupData { parent, name }
            | Request::Unlink { parent, name }
            | Request::Rmdir { parent, name }
            | Request::RmdirBigDir { parent, name } => {
                w.u64(parent.0);
                write_name(w, "name", name)
            }
            Request::GetAttr { ino }
            | Request::ReadLink { ino }
            | Request::ListXattr { ino }
            | Request::LayoutGet { ino }
            | Request::DropInode { ino }
            | Request::GetParent { ino }
            | Request::AddLink { ino }
            | Request::TokenInvalidate { dir: ino } => {
                w.u64(ino.0);
                Ok(())
            }
            Request::SetAttr { ino, set } => {
                w.u64(ino.0);
                set.put(w)
            }
            Request::Create { parent, name, perm, uid, gid, flags, layout } => {
                w.u64(parent.0);
                write_name(w, "name", name)?;
                write_perm(w, *perm)?;
                w.u32(*uid);
                w.u32(*gid);
                w.u32(*flags);
                w.u8(*layout as u8);
                Ok(())
            }
            Request::Mkdir { parent, name, perm, uid, gid, layout } => {
                w.u64(parent.0);
                write_name(w, "name", name)?;
                write_perm(w, *perm)?;
                w.u32(*uid);
                w.u32(*gid);
                layout.put(w)
            }
            Request::Mknod { parent, name, kind, perm, uid, gid, rdev } => {
                w.u64(parent.0);
                write_name(w, "name", name)?;
                w.u8(*kind as u8);
                write_perm(w, *perm)?;
                w.u32(*uid);
                w.u32(*gid);
                w.u32(*rdev);
                Ok(())
            }
            Request::AdjustDir { dir, nlink_delta } => {
                w.u64(dir.0);
                w.u32(*nlink_delta as u32);
                Ok(())
            }
            Request::Link { ino, kind, new_parent, new_name } => {
                w.u64(ino.0);
                w.u8(*kind as u8);
                w.u64(new_parent.0);
                write_name(w, "new name", new_name)
            }
            Request::Symlink { parent, name, target, uid, gid } => {
                w.u64(parent.0);
                write_name(w, "name", name)?;
                w.bytes16("symlink target", target, MAX_SYMLINK_BYTES)?;
                w.u32(*uid);
                w.u32(*gid);
                Ok(())
            }
            Request::Rename { parent, name, new_parent, new_name, flags } => {
                w.u64(parent.0);
                write_name(w, "name", name)?;
                w.u64(new_parent.0);
                write_name(w, "new name", new_name)?;
                flags.put(w)
            }
            Request::ReadDir { ino, after, max_entries, max_bytes, plus, layout } => {
                w.u64(ino.0);
                write_name(w, "readdir resume name", after)?;
                w.u32(*max_entries);
                w.u32(*max_bytes);
                w.bool(*plus);
                w.u8(*layout as u8);
                Ok(())
            }
            Request::Open { ino, flags } => {
                w.u64(ino.0);
                w.u32(*flags);
                Ok(())
            }
            Request::Release { ino, fh, flags } => {
                w.u64(ino.0);
                w.u64(fh.0);
                w.u32(*flags);
                Ok(())
            }
            Request::Read { ino, fh, offset, size, blocks } => {
                super::cursor::check_len("read size", *size as usize, MAX_IO_BYTES)?;
                w.u64(ino.0);
                w.u64(fh.0);
                w.u64(*offset);
                w.u32(*size);
                w.u32(*blocks);
                Ok(())
            }
            Request::Write { ino, fh, offset, data } => {
                w.u64(ino.0);
                w.u64(fh.0);
                w.u64(*offset);
                w.bytes32("write data", data, MAX_IO_BYTES)
            }
            Request::Fsync { ino, fh, datasync } => {
                w.u64(ino.0);
                w.u64(fh.0);
                w.bool(*datasync);
                Ok(())
            }
            Request::StatFs | Request::Durable | Request::LockRenew => Ok(()),
            Request::GetXattr { ino, name } | Request::RemoveXattr { ino, name } => {
                w.u64(ino.0);
                write_name(w, "xattr name", name)
            }
            Request::SetXattr { ino, name, value, mode } => {
                w.u64(ino.0);
                write_name(w, "xattr name", name)?;
                w.bytes32("xattr value", value, MAX_XATTR_VALUE_BYTES)?;
                mode.put(w)
            }
            Request::LayoutSet { ino, layout } => {
                w.u64(ino.0);
                layout.put(w)
            }
            Request::TokenAcquire { dir, mode } | Request::TokenRelease { dir, mode } => {
                w.u64(dir.0);
                mode.put(w)
            }
            Request::WriteData { ino, layout, offset, data } => {
                w.u64(ino.0);
                w.u8(*layout as u8);
                w.u64(*offset);
                w.bytes32("write data", data, MAX_IO_BYTES)
            }
            Request::ReadData { ino, layout, offset, size, blocks } => {
                super::cursor::check_len("read size", *size as usize, MAX_IO_BYTES)?;
                w.u64(ino.0);
                w.u8(*layout as u8);
                w.u64(*offset);
                w.u32(*size);
                w.u32(*blocks);
                Ok(())
            }
            Request::TruncateData { ino, layout, size, old_size } => {
                w.u64(ino.0);
                w.u8(*layout as u8);
                w.u64(*size);
                w.u64(*old_size);
                Ok(())
            }
            Request::ExtendSize { ino, size } => {
                w.u64(ino.0);
                w.u64(*size);
                Ok(())
            }
            Request::Append { ino, len, kill_suidgid } => {
                w.u64(ino.0);
                w.u64(*len);
                w.u8(u8::from(*kill_suidgid));
                Ok(())
            }
            Request::Lock { ino, owner, lock, test, reclaim } => {
                w.u64(ino.0);
                w.u64(*owner);
                lock.put(w)?;
                w.u8(u8::from(*test) | u8::from(*reclaim) << 1);
                Ok(())
            }
            Request::Register { server, addr, workers, usage } => {
                w.u32(server.map_or(NO_SERVER, |s| s.0));
                write_addr(w, addr)?;
                w.u32(*workers);
                usage.put(w)
            }
            Request::Heartbeat { server, usage } => {
                w.u32(server.0);
                usage.put(w)
            }
            Request::GetView => Ok(()),
            Request::RenameCross {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                target_server,
                target_worker,
            } => {
                w.u64(parent.0);
                write_name(w, "name", name)?;
                w.u64(new_parent.0);
                write_name(w, "new name", new_name)?;
                flags.put(w)?;
                w.u32(target_server.0);
                w.u32(target_worker.0);
                Ok(())
            }
            Request::XRenameTarget { txn, parent, name, value, flags } => {
                w.u64(*txn);
                w.u64(parent.0);
                write_name(w, "name", name)?;
                w.u64(*value);
                flags.put(w)
            }
            Request::TxnForget { txn, dir_removed } => {
                w.u64(*txn);
                w.bool(*dir_removed);
                Ok(())
            }
            Request::ReserveData { ino, end } => {
                w.u64(ino.0);
                w.u64(*end);
                Ok(())
            }
            Request::FollowUps { from, ops } => {
                if ops.len() > MAX_FOLLOW_UPS {
                    return Err(WireError::TooLong {
                        what: "follow-ups",
                        len: ops.len() as u64,
                        max: MAX_FOLLOW_UPS as u64,
                    });
                }
                w.u32(from.0);
                w.u16(ops.len() as u16);
                for (id, op) in ops {
                    w.u64(*id);
                    w.bytes16("follow-up", &op.to_bytes(), MAX_FOLLOW_BYTES)?;
                }
                Ok(())
            }
            Request::SealDir { txn, dir } => {
                w.u64(*txn);
                w.u64(dir.0);
                Ok(())
            }
        }
    }

    /// Reads the payload of a request with opcode `op`; the caller checks that every
    /// byte was used.
    pub(crate) fn get(op: Opcode, r: &mut Reader<'_>) -> Result<Request, WireError> {
        let ino = |r: &mut Reader<'_>| -> Result<InodeId, WireError> { Ok(InodeId(r.u64("ino")?)) };
        let fh = |r: &mut Reader<'_>| -> Result<FileHandle, WireError> {
            Ok(FileHandle(r.u64("file handle")?))
        };
        Ok(match op {
            Opcode::Lookup => Request::Lookup { parent: ino(r)?, name: read_name(r, "name")? },
            Opcode::LookupData => {
                Request::LookupData { parent: ino(r)?, name: read_name(r, "name")? }
            }
            Opcode::Unlink => Request::Unlink { parent: ino(r)?, name: read_name(r, "name")? },
            Opcode::Rmdir => Request::Rmdir { parent: ino(r)?, name: read_name(r, "name")? },
            Opcode::GetAttr => Request::GetAttr { ino: ino(r)? },
            Opcode::ReadLink => Request::ReadLink { ino: ino(r)? },
            Opcode::ListXattr => Request::ListXattr { ino: ino(r)? },
            Opcode::LayoutGet => Request::LayoutGet { ino: ino(r)? },
            Opcode::TokenInvalidate => Request::TokenInvalidate { dir: ino(r)? },
            Opcode::SetAttr => Request::SetAttr { ino: ino(r)?, set: SetAttr::get(r)? },
            Opcode::Create => Request::Create {
                parent: ino(r)?,
                name: read_name(r, "name")?,
                perm: read_perm(r)?,
                uid: r.u32("uid")?,
                gid: r.u32("gid")?,
                flags: r.u32("open flags")?,
                layout: read_file_layout(r)?,
            },
            Opcode::Mkdir => Request::Mkdir {
                parent: ino(r)?,
                name: read_name(r, "name")?,
                perm: read_perm(r)?,
                uid: r.u32("uid")?,
                gid: r.u32("gid")?,
                layout: InodeLayout::get(r)?,
            },
            Opcode::Mknod => Request::Mknod {
                parent: ino(r)?,
                name: read_name(r, "name")?,
                kind: read_kind(r)?,
                perm: read_perm(r)?,
                uid: r.u32("uid")?,
                gid: r.u32("gid")?,
                rdev: r.u32("rdev")?,
            },
            Opcode::Symlink => Request::Symlink {
                parent: ino(r)?,
                name: read_name(r, "name")?,
                target: r.bytes16("symlink target", MAX_SYMLINK_BYTES)?.to_vec(),
                uid: r.u32("uid")?,
                gid: r.u32("gid")?,
            },
            Opcode::Rename => Request::Rename {
                parent: ino(r)?,
                name: read_name(r, "name")?,
                new_parent: ino(r)?,
                new_name: read_name(r, "new name")?,
                flags: RenameFlags::get(r)?,
            },
            Opcode::ReadDir => Request::ReadDir {
                ino: ino(r)?,
                after: read_name(r, "readdir resume name")?,
                max_entries: r.u32("readdir max entries")?,
                max_bytes: r.u32("readdir max bytes")?,
                plus: r.bool("readdir plus")?,
                layout: {
                    let v = r.u8("readdir dir layout")?;
                    DirLayout::from_u8(v)
                        .ok_or(WireError::BadValue { what: "dir layout", value: v.into() })?
                },
            },
            Opcode::Open => Request::Open { ino: ino(r)?, flags: r.u32("open flags")? },
            Opcode::Release => {
                Request::Release { ino: ino(r)?, fh: fh(r)?, flags: r.u32("open flags")? }
            }
            Opcode::Read => {
                let (ino, fh, offset) = (ino(r)?, fh(r)?, r.u64("read offset")?);
                let size = r.u32("read size")?;
                super::cursor::check_len("read size", size as usize, MAX_IO_BYTES)?;
                Request::Read { ino, fh, offset, size, blocks: r.u32("read blocks")? }
            }
            Opcode::Write => Request::Write {
                ino: ino(r)?,
                fh: fh(r)?,
                offset: r.u64("write offset")?,
                data: r.bytes32("write data", MAX_IO_BYTES)?.to_vec(),
            },
            Opcode::Fsync => {
                Request::Fsync { ino: ino(r)?, fh: fh(r)?, datasync: r.bool("fsync datasync")? }
            }
            Opcode::StatFs => Request::StatFs,
            Opcode::Durable => Request::Durable,
            Opcode::GetXattr => {
                Request::GetXattr { ino: ino(r)?, name: read_name(r, "xattr name")? }
            }
            Opcode::RemoveXattr => {
                Request::RemoveXattr { ino: ino(r)?, name: read_name(r, "xattr name")? }
            }
            Opcode::SetXattr => Request::SetXattr {
                ino: ino(r)?,
                name: read_name(r, "xattr name")?,
                value: r.bytes32("xattr value", MAX_XATTR_VALUE_BYTES)?.to_vec(),
                mode: XattrSetMode::get(r)?,
            },
            Opcode::LayoutSet => Request::LayoutSet { ino: ino(r)?, layout: InodeLayout::get(r)? },
            Opcode::TokenAcquire => {
                Request::TokenAcquire { dir: ino(r)?, mode: TokenMode::get(r)? }
            }
            Opcode::TokenRelease => {
                Request::TokenRelease { dir: ino(r)?, mode: TokenMode::get(r)? }
            }
            Opcode::WriteData => Request::WriteData {
                ino: ino(r)?,
                layout: read_file_layout(r)?,
                offset: r.u64("write offset")?,
                data: r.bytes32("write data", MAX_IO_BYTES)?.to_vec(),
            },
            Opcode::ReadData => {
                let (ino, layout, offset) = (ino(r)?, read_file_layout(r)?, r.u64("read offset")?);
                let size = r.u32("read size")?;
                super::cursor::check_len("read size", size as usize, MAX_IO_BYTES)?;
                Request::ReadData { ino, layout, offset, size, blocks: r.u32("read blocks")? }
            }
            Opcode::TruncateData => Request::TruncateData {
                ino: ino(r)?,
                layout: read_file_layout(r)?,
                size: r.u64("truncate size")?,
                old_size: r.u64("truncate old size")?,
            },
            Opcode::ExtendSize => Request::ExtendSize { ino: ino(r)?, size: r.u64("size")? },
            Opcode::Append => Request::Append {
                ino: ino(r)?,
                len: r.u64("append length")?,
                kill_suidgid: r.u8("append flags")? & 1 != 0,
            },
            Opcode::Lock => {
                let (ino, owner, lock) = (ino(r)?, r.u64("lock owner")?, FileLock::get(r)?);
                let flags = r.u8("lock flags")?;
                if flags & !3 != 0 {
                    return Err(WireError::BadValue { what: "lock flags", value: flags.into() });
                }
                Request::Lock { ino, owner, lock, test: flags & 1 != 0, reclaim: flags & 2 != 0 }
            }
            Opcode::LockRenew => Request::LockRenew,
            Opcode::Register => Request::Register {
                server: match r.u32("server id")? {
                    NO_SERVER => None,
                    id => Some(ServerId(id)),
                },
                addr: read_addr(r)?,
                workers: r.u32("server workers")?,
                usage: Usage::get(r)?,
            },
            Opcode::Heartbeat => {
                Request::Heartbeat { server: ServerId(r.u32("server id")?), usage: Usage::get(r)? }
            }
            Opcode::GetView => Request::GetView,
            Opcode::RenameCross => Request::RenameCross {
                parent: ino(r)?,
                name: read_name(r, "name")?,
                new_parent: ino(r)?,
                new_name: read_name(r, "new name")?,
                flags: RenameFlags::get(r)?,
                target_server: ServerId(r.u32("target server")?),
                target_worker: WorkerId(r.u32("target worker")?),
            },
            Opcode::XRenameTarget => Request::XRenameTarget {
                txn: r.u64("transaction id")?,
                parent: ino(r)?,
                name: read_name(r, "name")?,
                value: r.u64("dentry value")?,
                flags: RenameFlags::get(r)?,
            },
            Opcode::TxnForget => Request::TxnForget {
                txn: r.u64("transaction id")?,
                dir_removed: r.bool("directory removed")?,
            },
            Opcode::DropInode => Request::DropInode { ino: ino(r)? },
            Opcode::RmdirBigDir => {
                Request::RmdirBigDir { parent: ino(r)?, name: read_name(r, "name")? }
            }
            Opcode::SealDir => Request::SealDir { txn: r.u64("transaction id")?, dir: ino(r)? },
            Opcode::Link => Request::Link {
                ino: ino(r)?,
                kind: read_kind(r)?,
                new_parent: ino(r)?,
                new_name: read_name(r, "new name")?,
            },
            Opcode::AddLink => Request::AddLink { ino: ino(r)? },
            Opcode::AdjustDir => {
                let dir = ino(r)?;
                let nlink_delta = r.u32("link count change")? as i32;
                if !(-2..=2).contains(&nlink_delta) {
                    return Err(WireError::BadValue {
                        what: "link count change",
                        value: u64::from(nlink_delta as u32),
                    });
                }
                Request::AdjustDir { dir, nlink_delta }
            }
            Opcode::ReserveData => Request::ReserveData { ino: ino(r)?, end: r.u64("data end")? },
            Opcode::GetParent => Request::GetParent { ino: ino(r)? },
            Opcode::FollowUps => {
                let from = ShardId(r.u32("sending shard")?);
                let n = usize::from(r.u16("follow-up count")?);
                super::cursor::check_len("follow-ups", n, MAX_FOLLOW_UPS)?;
                let mut ops = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = r.u64("follow-up id")?;
                    let bytes = r.bytes16("follow-up", MAX_FOLLOW_BYTES)?;
                    let op = FollowOp::from_bytes(bytes).ok_or(WireError::BadValue {
                        what: "follow-up",
                        value: u64::from(bytes.first().copied().unwrap_or(0)),
                    })?;
                    ops.push((id, op));
                }
                Request::FollowUps { from, ops }
            }
        })
    }
}
