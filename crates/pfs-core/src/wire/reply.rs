//! Successful replies; a failed request gets an error frame instead.

use super::cluster::View;
use super::cursor::{check_len, Reader, Writer};
use super::types::{
    read_name, write_name, Codec, DirEntry, Entry, FileLock, InodeLayout, TokenGrant,
};
use super::{
    Opcode, WireError, MAX_FOLLOW_UPS, MAX_FRAME_PAYLOAD, MAX_IO_BYTES, MAX_LOOKUP_DATA_BYTES,
    MAX_SYMLINK_BYTES, MAX_XATTR_LIST_BYTES, MAX_XATTR_VALUE_BYTES,
};
use crate::{FileAttr, FileHandle, FileLayout, InodeId, ServerId, StatFs, TimeNs};

/// The reply to a request; each variant answers the request of the same name and
/// travels under its opcode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The name's inode.
    Lookup(Entry),
    /// The name's inode, and all of its data when the server had it in memory
    /// and it is at most [`MAX_LOOKUP_DATA_BYTES`] bytes.
    LookupData {
        /// The name's inode.
        entry: Entry,
        /// The file's bytes, as many as its size in `entry`.
        data: Option<Vec<u8>>,
    },
    /// The attributes.
    GetAttr(FileAttr),
    /// The attributes after the change.
    SetAttr(FileAttr),
    /// The new file, already open.
    Create {
        /// The new file.
        entry: Entry,
        /// Its handle.
        fh: FileHandle,
    },
    /// The new directory.
    Mkdir(Entry),
    /// The new node.
    Mknod(Entry),
    /// The new link.
    Symlink(Entry),
    /// The link's target.
    ReadLink(Vec<u8>),
    /// The name is gone.
    Unlink {
        /// The removed inode.
        ino: InodeId,
        /// Size of the removed file when it was a regular file freed by this
        /// unlink, else 0 (it has other names): its data on other shards (past
        /// the first block) is for the client to free.
        size: u64,
        /// Its data layout.
        layout: FileLayout,
        /// The inode lives on another shard (its home): the client frees it there
        /// with `DropInode`.
        remote: bool,
    },
    /// The directory is gone.
    Rmdir {
        /// The removed directory.
        ino: InodeId,
        /// Its inode lives on another shard, to be freed with `DropInode`.
        remote: bool,
    },
    /// The rename is done.
    Rename {
        /// The inode whose name the rename replaced, for the client to free.
        replaced: Option<Replaced>,
    },
    /// Entries after the request's cookie.
    ReadDir {
        /// The entries, in cookie order.
        entries: Vec<DirEntry>,
        /// No entries follow the last one.
        eof: bool,
    },
    /// The file is open.
    Open {
        /// Its handle.
        fh: FileHandle,
    },
    /// The handle is closed.
    Release,
    /// The bytes read; shorter than asked at end of file.
    Read(Vec<u8>),
    /// Bytes written at the file's home.
    Write {
        /// How many.
        written: u32,
        /// The inode's `ctime` before the write and after it: a client that
        /// cached pages of the file at `ctime_before` (its data version) still
        /// holds current ones at `ctime`, the write being its own.
        ctime_before: TimeNs,
        /// The inode's `ctime` after the write.
        ctime: TimeNs,
    },
    /// The data is durable.
    Fsync,
    /// Every change acknowledged before the request is durable.
    Durable,
    /// The shard's usage.
    StatFs(StatFs),
    /// The attribute's value.
    GetXattr(Vec<u8>),
    /// The attribute is set.
    SetXattr,
    /// The attribute names.
    ListXattr(Vec<Vec<u8>>),
    /// The attribute is gone.
    RemoveXattr,
    /// The inode's layouts.
    LayoutGet(InodeLayout),
    /// The layouts are changed.
    LayoutSet,
    /// The token granted.
    TokenAcquire(TokenGrant),
    /// The token is released.
    TokenRelease,
    /// The client dropped its cache.
    TokenInvalidate,
    /// Bytes written on the data shard.
    WriteData {
        /// How many.
        written: u32,
    },
    /// The bytes read from the data shard, as many as asked (holes are zeros).
    ReadData(Vec<u8>),
    /// The data past the size is freed.
    TruncateData,
    /// The attributes after the size grew (or the times moved).
    ExtendSize {
        /// The attributes now.
        attr: FileAttr,
        /// The inode's `ctime` before (see [`Reply::Write`]).
        ctime_before: TimeNs,
    },
    /// Where an `O_APPEND` write goes, and the attributes after the file grew.
    Append {
        /// The offset to write at: the size before.
        offset: u64,
        /// The attributes now.
        attr: FileAttr,
        /// The inode's `ctime` before (see [`Reply::Write`]).
        ctime_before: TimeNs,
    },
    /// A lock request's answer: the lock was taken (or given back), or
    /// `conflict` names a lock of another owner that keeps it from being
    /// taken (for a test: the first such, or `None`).
    Lock {
        /// The conflicting lock, if any (its `pid` 0 when another client holds it).
        conflict: Option<FileLock>,
        /// How long the client's locks on this shard last without a renewal, ms.
        lease_ms: u32,
        /// The shard's lock table's identity, new at each start of its
        /// server: a client that sees it change takes its locks again.
        epoch: u64,
    },
    /// The client's lease on this shard was extended.
    LockRenew {
        /// Locks (ranges) the client holds on this shard: fewer than it
        /// thinks means the server lost them (it restarted).
        held: u32,
        /// How long they last now, ms.
        lease_ms: u32,
        /// As [`Reply::Lock`]'s.
        epoch: u64,
    },
    /// The master accepted the server.
    Register {
        /// The server's id in the view.
        server: ServerId,
        /// The view's epoch after the registration.
        epoch: u64,
        /// How often the master wants usage reports.
        heartbeat_ms: u32,
    },
    /// The master noted the report.
    Heartbeat {
        /// The view's epoch.
        epoch: u64,
    },
    /// The cluster view.
    GetView(View),
    /// The cross-shard rename is done.
    RenameCross {
        /// The inode whose name the rename replaced, for the client to free.
        replaced: Option<Replaced>,
    },
    /// The participant applied; for an exchange, the target's old entry (0: none).
    XRenameTarget {
        /// The target's old dentry value, 0 when there was none to hand back.
        old: u64,
        /// The inode whose name it replaced (not for an exchange).
        replaced: Option<Replaced>,
    },
    /// The participant forgot the transaction.
    TxnForget,
    /// The directory is sealed on this shard.
    SealDir,
    /// One link is dropped. If it was the last, the inode is freed, and this is
    /// what its data was, for the client to free the rest.
    DropInode {
        /// Its size (0 unless a regular file that was freed).
        size: u64,
        /// Its data layout.
        layout: FileLayout,
    },
    /// The new name; nlink 0 when the inode lives on another shard (ask there).
    Link(Entry),
    /// The attributes after the link count grew.
    AddLink(FileAttr),
    /// The directory's count and times are updated.
    AdjustDir,
    /// The follow-ups of the request up to `through`, the watermark kept for
    /// the sending shard, are applied and durable; the sender sends those past
    /// it again (a target applies a batch up to the first whose inode page is
    /// not in memory).
    FollowUps {
        /// The highest follow-up id applied from that shard.
        through: u64,
        /// Those up to `through` this shard refused, for the sender to undo
        /// its side (an `AddLink` whose inode was removed first: the new
        /// name goes); at most `MAX_FOLLOW_UPS`.
        refused: Vec<u64>,
    },
    /// The file's reserved data end now (at least what was asked).
    ReserveData {
        /// The end.
        end: u64,
    },
    /// The directory holding the inode's (last) name.
    GetParent {
        /// That directory.
        parent: InodeId,
    },
}

/// The inode whose name a rename replaced: like an unlink's reply, what the
/// client must free elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replaced {
    /// The inode.
    pub ino: InodeId,
    /// Size of a regular file the rename freed (its data on other shards is for
    /// the client to free), 0 when it lives on or is not a file.
    pub size: u64,
    /// Its data layout.
    pub layout: FileLayout,
    /// The inode lives on another shard: the client drops one link there
    /// (`DropInode`).
    pub remote: bool,
}

fn put_replaced(w: &mut Writer<'_>, replaced: &Option<Replaced>) {
    match replaced {
        None => w.bool(false),
        Some(x) => {
            w.bool(true);
            w.u64(x.ino.0);
            w.u64(x.size);
            w.u8(x.layout as u8);
            w.bool(x.remote);
        }
    }
}

fn get_replaced(r: &mut Reader<'_>) -> Result<Option<Replaced>, WireError> {
    if !r.bool("replaced flag")? {
        return Ok(None);
    }
    Ok(Some(Replaced {
        ino: InodeId(r.u64("replaced inode")?),
        size: r.u64("replaced size")?,
        layout: read_file_layout(r)?,
        remote: r.bool("replaced inode remote")?,
    }))
}

fn read_file_layout(r: &mut Reader<'_>) -> Result<FileLayout, WireError> {
    let v = r.u8("file layout")?;
    FileLayout::from_u8(v).ok_or(WireError::BadValue { what: "file layout", value: v.into() })
}

/// Bytes an xattr name takes in a Linux `listxattr` buffer: the name and a NUL.
fn listed_len(name: &[u8]) -> usize {
    name.len() + 1
}

impl Reply {
    /// The opcode this reply travels under.
    pub fn opcode(&self) -> Opcode {
        match self {
            Reply::Lookup(_) => Opcode::Lookup,
            Reply::LookupData { .. } => Opcode::LookupData,
            Reply::GetAttr(_) => Opcode::GetAttr,
            Reply::SetAttr(_) => Opcode::SetAttr,
            Reply::Create { .. } => Opcode::Create,
            Reply::Mkdir(_) => Opcode::Mkdir,
            Reply::Mknod(_) => Opcode::Mknod,
            Reply::Symlink(_) => Opcode::Symlink,
            Reply::ReadLink(_) => Opcode::ReadLink,
            Reply::Unlink { .. } => Opcode::Unlink,
            Reply::Rmdir { .. } => Opcode::Rmdir,
            Reply::Rename { .. } => Opcode::Rename,
            Reply::ReadDir { .. } => Opcode::ReadDir,
            Reply::Open { .. } => Opcode::Open,
            Reply::Release => Opcode::Release,
            Reply::Read(_) => Opcode::Read,
            Reply::Write { .. } => Opcode::Write,
            Reply::Fsync => Opcode::Fsync,
            Reply::StatFs(_) => Opcode::StatFs,
            Reply::GetXattr(_) => Opcode::GetXattr,
            Reply::SetXattr => Opcode::SetXattr,
            Reply::ListXattr(_) => Opcode::ListXattr,
            Reply::RemoveXattr => Opcode::RemoveXattr,
            Reply::LayoutGet(_) => Opcode::LayoutGet,
            Reply::LayoutSet => Opcode::LayoutSet,
            Reply::TokenAcquire(_) => Opcode::TokenAcquire,
            Reply::TokenRelease => Opcode::TokenRelease,
            Reply::TokenInvalidate => Opcode::TokenInvalidate,
            Reply::WriteData { .. } => Opcode::WriteData,
            Reply::ReadData(_) => Opcode::ReadData,
            Reply::TruncateData => Opcode::TruncateData,
            Reply::ExtendSize { .. } => Opcode::ExtendSize,
            Reply::Append { .. } => Opcode::Append,
            Reply::Lock { .. } => Opcode::Lock,
            Reply::LockRenew { .. } => Opcode::LockRenew,
            Reply::Register { .. } => Opcode::Register,
            Reply::Heartbeat { .. } => Opcode::Heartbeat,
            Reply::GetView(_) => Opcode::GetView,
            Reply::RenameCross { .. } => Opcode::RenameCross,
            Reply::XRenameTarget { .. } => Opcode::XRenameTarget,
            Reply::TxnForget => Opcode::TxnForget,
            Reply::Durable => Opcode::Durable,
            Reply::DropInode { .. } => Opcode::DropInode,
            Reply::Link(_) => Opcode::Link,
            Reply::AddLink(_) => Opcode::AddLink,
            Reply::AdjustDir => Opcode::AdjustDir,
            Reply::FollowUps { .. } => Opcode::FollowUps,
            Reply::ReserveData { .. } => Opcode::ReserveData,
            Reply::GetParent { .. } => Opcode::GetParent,
            Reply::SealDir => Opcode::SealDir,
        }
    }

    /// Appends the payload (no header).
    pub(crate) fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        match self {
            Reply::Lookup(e)
            | Reply::Mkdir(e)
            | Reply::Mknod(e)
            | Reply::Symlink(e)
            | Reply::Link(e) => e.put(w),
            Reply::LookupData { entry, data } => {
                entry.put(w)?;
                w.bool(data.is_some());
                match data {
                    Some(d) => w.bytes32("lookup data", d, MAX_LOOKUP_DATA_BYTES),
                    None => Ok(()),
                }
            }
            Reply::GetAttr(a) | Reply::SetAttr(a) | Reply::AddLink(a) => a.put(w),
            Reply::ExtendSize { attr, ctime_before } => {
                attr.put(w)?;
                w.i64(*ctime_before);
                Ok(())
            }
            Reply::Append { offset, attr, ctime_before } => {
                w.u64(*offset);
                attr.put(w)?;
                w.i64(*ctime_before);
                Ok(())
            }
            Reply::Lock { conflict, lease_ms, epoch } => {
                match conflict {
                    None => w.u8(0),
                    Some(c) => {
                        w.u8(1);
                        c.put(w)?;
                    }
                }
                w.u32(*lease_ms);
                w.u64(*epoch);
                Ok(())
            }
            Reply::LockRenew { held, lease_ms, epoch } => {
                w.u32(*held);
                w.u32(*lease_ms);
                w.u64(*epoch);
                Ok(())
            }
            Reply::Create { entry, fh } => {
                entry.put(w)?;
                w.u64(fh.0);
                Ok(())
            }
            Reply::ReadLink(target) => w.bytes16("symlink target", target, MAX_SYMLINK_BYTES),
            Reply::Unlink { ino, size, layout, remote } => {
                w.u64(ino.0);
                w.u64(*size);
                w.u8(*layout as u8);
                w.bool(*remote);
                Ok(())
            }
            Reply::Rmdir { ino, remote } => {
                w.u64(ino.0);
                w.bool(*remote);
                Ok(())
            }
            Reply::DropInode { size, layout } => {
                w.u64(*size);
                w.u8(*layout as u8);
                Ok(())
            }
            Reply::Rename { replaced } | Reply::RenameCross { replaced } => {
                put_replaced(w, replaced);
                Ok(())
            }
            Reply::FollowUps { through, refused } => {
                check_len("refused follow-ups", refused.len(), MAX_FOLLOW_UPS)?;
                w.u64(*through);
                w.u16(refused.len() as u16);
                for id in refused {
                    w.u64(*id);
                }
                Ok(())
            }
            Reply::ReserveData { end } => {
                w.u64(*end);
                Ok(())
            }
            Reply::GetParent { parent } => {
                w.u64(parent.0);
                Ok(())
            }
            Reply::Release
            | Reply::Fsync
            | Reply::SetXattr
            | Reply::RemoveXattr
            | Reply::LayoutSet
            | Reply::TokenRelease
            | Reply::TokenInvalidate
            | Reply::TruncateData
            | Reply::SealDir
            | Reply::AdjustDir
            | Reply::TxnForget
            | Reply::Durable => Ok(()),
            Reply::ReadDir { entries, eof } => {
                w.count("readdir entries", entries.len())?;
                let start = w.len();
                for entry in entries {
                    entry.put(w)?;
                    // Refuse early rather than build a frame the peer must reject.
                    check_len("readdir reply", w.len() - start, MAX_FRAME_PAYLOAD)?;
                }
                w.bool(*eof);
                Ok(())
            }
            Reply::Open { fh } => {
                w.u64(fh.0);
                Ok(())
            }
            Reply::Read(data) | Reply::ReadData(data) => w.bytes32("read data", data, MAX_IO_BYTES),
            Reply::Write { written, ctime_before, ctime } => {
                w.u32(*written);
                w.i64(*ctime_before);
                w.i64(*ctime);
                Ok(())
            }
            Reply::WriteData { written } => {
                w.u32(*written);
                Ok(())
            }
            Reply::StatFs(s) => s.put(w),
            Reply::GetXattr(value) => w.bytes32("xattr value", value, MAX_XATTR_VALUE_BYTES),
            Reply::ListXattr(names) => {
                let listed: usize = names.iter().map(|n| listed_len(n)).sum();
                check_len("xattr list", listed, MAX_XATTR_LIST_BYTES)?;
                w.count("xattr names", names.len())?;
                for name in names {
                    write_name(w, "xattr name", name)?;
                }
                Ok(())
            }
            Reply::LayoutGet(layout) => layout.put(w),
            Reply::TokenAcquire(grant) => grant.put(w),
            Reply::Register { server, epoch, heartbeat_ms } => {
                w.u32(server.0);
                w.u64(*epoch);
                w.u32(*heartbeat_ms);
                Ok(())
            }
            Reply::Heartbeat { epoch } => {
                w.u64(*epoch);
                Ok(())
            }
            Reply::GetView(view) => view.put(w),
            Reply::XRenameTarget { old, replaced } => {
                w.u64(*old);
                put_replaced(w, replaced);
                Ok(())
            }
        }
    }

    /// Reads the payload of a reply with opcode `op`; the caller checks that every
    /// byte was used.
    pub(crate) fn get(op: Opcode, r: &mut Reader<'_>) -> Result<Reply, WireError> {
        Ok(match op {
            Opcode::Lookup => Reply::Lookup(Entry::get(r)?),
            Opcode::LookupData => {
                let entry = Entry::get(r)?;
                let data = match r.bool("lookup data present")? {
                    true => Some(r.bytes32("lookup data", MAX_LOOKUP_DATA_BYTES)?.to_vec()),
                    false => None,
                };
                Reply::LookupData { entry, data }
            }
            Opcode::Mkdir => Reply::Mkdir(Entry::get(r)?),
            Opcode::Mknod => Reply::Mknod(Entry::get(r)?),
            Opcode::Symlink => Reply::Symlink(Entry::get(r)?),
            Opcode::GetAttr => Reply::GetAttr(FileAttr::get(r)?),
            Opcode::SetAttr => Reply::SetAttr(FileAttr::get(r)?),
            Opcode::Create => {
                Reply::Create { entry: Entry::get(r)?, fh: FileHandle(r.u64("file handle")?) }
            }
            Opcode::ReadLink => {
                Reply::ReadLink(r.bytes16("symlink target", MAX_SYMLINK_BYTES)?.to_vec())
            }
            Opcode::Unlink => Reply::Unlink {
                ino: InodeId(r.u64("unlinked inode")?),
                size: r.u64("unlinked size")?,
                layout: read_file_layout(r)?,
                remote: r.bool("unlinked inode remote")?,
            },
            Opcode::Rmdir => Reply::Rmdir {
                ino: InodeId(r.u64("removed directory")?),
                remote: r.bool("removed directory remote")?,
            },
            Opcode::DropInode => {
                Reply::DropInode { size: r.u64("dropped size")?, layout: read_file_layout(r)? }
            }
            Opcode::Rename => Reply::Rename { replaced: get_replaced(r)? },
            Opcode::Release => Reply::Release,
            Opcode::Fsync => Reply::Fsync,
            Opcode::SetXattr => Reply::SetXattr,
            Opcode::RemoveXattr => Reply::RemoveXattr,
            Opcode::LayoutSet => Reply::LayoutSet,
            Opcode::TokenRelease => Reply::TokenRelease,
            Opcode::TokenInvalidate => Reply::TokenInvalidate,
            Opcode::ReadDir => {
                let count = r.count("readdir entries", DirEntry::MIN_WIRE_BYTES)?;
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    entries.push(DirEntry::get(r)?);
                }
                Reply::ReadDir { entries, eof: r.bool("readdir eof")? }
            }
            Opcode::Open => Reply::Open { fh: FileHandle(r.u64("file handle")?) },
            Opcode::Read => Reply::Read(r.bytes32("read data", MAX_IO_BYTES)?.to_vec()),
            Opcode::Write => Reply::Write {
                written: r.u32("bytes written")?,
                ctime_before: r.i64("ctime before")?,
                ctime: r.i64("ctime after")?,
            },
            Opcode::StatFs => Reply::StatFs(StatFs::get(r)?),
            Opcode::GetXattr => {
                Reply::GetXattr(r.bytes32("xattr value", MAX_XATTR_VALUE_BYTES)?.to_vec())
            }
            Opcode::ListXattr => {
                // An empty name still takes its 2-byte length prefix.
                let count = r.count("xattr names", 2)?;
                let mut names = Vec::with_capacity(count);
                let mut listed = 0usize;
                for _ in 0..count {
                    let name = read_name(r, "xattr name")?;
                    listed += listed_len(&name);
                    check_len("xattr list", listed, MAX_XATTR_LIST_BYTES)?;
                    names.push(name);
                }
                Reply::ListXattr(names)
            }
            Opcode::LayoutGet => Reply::LayoutGet(InodeLayout::get(r)?),
            Opcode::TokenAcquire => Reply::TokenAcquire(TokenGrant::get(r)?),
            Opcode::WriteData => Reply::WriteData { written: r.u32("bytes written")? },
            Opcode::ReadData => Reply::ReadData(r.bytes32("read data", MAX_IO_BYTES)?.to_vec()),
            Opcode::TruncateData => Reply::TruncateData,
            Opcode::Append => Reply::Append {
                offset: r.u64("append offset")?,
                attr: FileAttr::get(r)?,
                ctime_before: r.i64("ctime before")?,
            },
            Opcode::Lock => Reply::Lock {
                conflict: match r.u8("lock conflict")? {
                    0 => None,
                    1 => Some(FileLock::get(r)?),
                    v => {
                        return Err(WireError::BadValue { what: "lock conflict", value: v.into() })
                    }
                },
                lease_ms: r.u32("lock lease")?,
                epoch: r.u64("lock epoch")?,
            },
            Opcode::LockRenew => Reply::LockRenew {
                held: r.u32("locks held")?,
                lease_ms: r.u32("lock lease")?,
                epoch: r.u64("lock epoch")?,
            },
            Opcode::ExtendSize => {
                Reply::ExtendSize { attr: FileAttr::get(r)?, ctime_before: r.i64("ctime before")? }
            }
            Opcode::Link => Reply::Link(Entry::get(r)?),
            Opcode::AddLink => Reply::AddLink(FileAttr::get(r)?),
            Opcode::AdjustDir => Reply::AdjustDir,
            Opcode::Register => Reply::Register {
                server: ServerId(r.u32("server id")?),
                epoch: r.u64("epoch")?,
                heartbeat_ms: r.u32("heartbeat interval")?,
            },
            Opcode::Heartbeat => Reply::Heartbeat { epoch: r.u64("epoch")? },
            Opcode::GetView => Reply::GetView(View::get(r)?),
            Opcode::RenameCross => Reply::RenameCross { replaced: get_replaced(r)? },
            Opcode::XRenameTarget => {
                Reply::XRenameTarget { old: r.u64("old dentry value")?, replaced: get_replaced(r)? }
            }
            Opcode::TxnForget => Reply::TxnForget,
            Opcode::Durable => Reply::Durable,
            Opcode::SealDir => Reply::SealDir,
            Opcode::FollowUps => {
                let through = r.u64("follow-up watermark")?;
                let n = usize::from(r.u16("refused follow-up count")?);
                check_len("refused follow-ups", n, MAX_FOLLOW_UPS)?;
                let mut refused = Vec::with_capacity(n);
                for _ in 0..n {
                    refused.push(r.u64("refused follow-up id")?);
                }
                Reply::FollowUps { through, refused }
            }
            Opcode::ReserveData => Reply::ReserveData { end: r.u64("data end")? },
            Opcode::GetParent => Reply::GetParent { parent: InodeId(r.u64("parent")?) },
            // An rmdir of a bigdir is answered with an `Rmdir` reply.
            Opcode::RmdirBigDir => {
                return Err(WireError::BadValue {
                    what: "reply opcode (RmdirBigDir is answered as Rmdir)",
                    value: Opcode::RmdirBigDir as u64,
                })
            }
        })
    }
}
