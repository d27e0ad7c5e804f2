//! Runs one request on the shard that owns it: the only place wire requests turn
//! into shard calls. Pure and single-threaded, so it is tested without a network.

use pfs_core::wire::{
    DirEntry, Entry, InodeLayout, Reply, Request, WriteRef, WriteTarget, XattrSetMode,
    MAX_IO_BYTES, MAX_LOOKUP_DATA_BYTES,
};
use pfs_core::{DirLayout, FileHandle, FileType, FsError, FsResult, InodeId, SetAttr};
use pfs_store::device::Device;
use pfs_store::shard::meta::{
    dir_layout_name, file_layout_name, XATTR_DIR_LAYOUT, XATTR_FILE_LAYOUT,
};
use pfs_store::{CreateArgs, RenameFlags, Shard, XattrFlags};

/// The file capability a write removes.
const CAPABILITY_XATTR: &[u8] = b"security.capability";
/// Bytes one readdir entry takes in a reply besides its name (with attributes).
const DIRENT_OVERHEAD_BYTES: usize = 2 + 8 + 1 + 8 + 1 + 96;
pub use pfs_core::wire::READDIR_MAX_ENTRIES;

/// What a request did, as far as the worker cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// The reply may go out now.
    Now,
    /// The reply may go out only after the shard committed (fsync, close).
    AfterCommit,
}

/// Whether a request changes the shard (so the worker schedules a commit).
pub fn is_mutation(req: &Request) -> bool {
    req.is_mutation()
}

fn getattr<D: Device>(shard: &mut Shard<D>, ino: InodeId) -> FsResult<pfs_core::FileAttr> {
    let attr = shard.getattr(ino)?;
    Ok(attr)
}

/// The entry (attributes and layouts) of an inode this shard holds.
fn entry<D: Device>(shard: &mut Shard<D>, ino: InodeId) -> FsResult<Entry> {
    let attr = getattr(shard, ino)?;
    Ok(Entry { attr, layout: layout_of(shard, &attr)? })
}

/// The layouts of an inode this shard holds, whose attributes are `attr`.
fn layout_of<D: Device>(shard: &mut Shard<D>, attr: &pfs_core::FileAttr) -> FsResult<InodeLayout> {
    let (dir, file) = shard.layouts(attr.ino)?;
    // A set-group-ID directory gives its group to what is made in it.
    let sgid = attr.kind == FileType::Directory && attr.perm & 0o2000 != 0;
    Ok(InodeLayout { dir, file, group: sgid.then_some(attr.gid) })
}

/// The entry of a name whose inode lives on another shard: only the number and
/// type are known here, and nlink 0 says so.
fn remote_entry(ino: InodeId, kind: FileType) -> Entry {
    let attr = pfs_core::FileAttr {
        ino,
        kind,
        perm: 0,
        uid: 0,
        gid: 0,
        size: 0,
        blocks: 0,
        nlink: 0,
        rdev: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
    };
    Entry { attr, layout: InodeLayout::default() }
}

/// Whether a request may stop before it changed anything when an inode page
/// it needs is not in memory, and run again once it is: metadata requests
/// whose reads all come before their changes (a data request's pieces are
/// read in the background anyway).
pub(crate) fn deferrable(req: &Request) -> bool {
    matches!(
        req,
        Request::Lookup { .. }
            | Request::LookupData { .. }
            | Request::GetAttr { .. }
            | Request::Open { .. }
            | Request::GetXattr { .. }
            | Request::ListXattr { .. }
            | Request::ReadLink { .. }
            | Request::LayoutGet { .. }
            | Request::GetParent { .. }
            | Request::SetAttr { .. }
            | Request::Create { .. }
            | Request::Mkdir { .. }
            | Request::Mknod { .. }
            | Request::Symlink { .. }
            | Request::Unlink { .. }
            | Request::Rmdir { .. }
            | Request::Rename { .. }
            | Request::SetXattr { .. }
            | Request::RemoveXattr { .. }
            | Request::ReadDir { .. }
            | Request::XRenameTarget { .. }
            | Request::TxnForget { .. }
            | Request::SealDir { .. }
            | Request::DropInode { .. }
            | Request::FollowUps { .. }
            | Request::AdjustDir { .. }
            | Request::AddLink { .. }
            | Request::Link { .. }
            | Request::ReserveData { .. }
            | Request::ExtendSize { .. }
            | Request::Append { .. }
            | Request::LayoutSet { .. }
    )
}

/// Runs `req` on `shard`; the error becomes an error reply.
pub fn execute<D: Device>(shard: &mut Shard<D>, req: Request) -> (FsResult<Reply>, Durability) {
    let durability = match req {
        // The participant of a cross-shard rename must not answer before its side
        // is durable: the coordinator removes the source name on that answer.
        // Nor an unseal: the coordinator drops its rmdir intent once every shard
        // answered, and a seal whose removal a crash lost would stay for good.
        Request::Fsync { .. }
        | Request::Release { .. }
        | Request::XRenameTarget { .. }
        | Request::SealDir { .. }
        | Request::TxnForget { .. }
        // A reservation must outlive a crash of the home: the client writes on
        // other shards past it as soon as it is answered.
        | Request::ReserveData { .. }
        | Request::FollowUps { .. } => Durability::AfterCommit,
        _ => Durability::Now,
    };
    if log::log_enabled!(log::Level::Trace) {
        trace_request(&req);
    }
    let dirs = req.name_dirs();
    let result = match run(shard, req) {
        // Not the name missing: the directory itself, removed (perhaps made
        // again under the same name) after the caller looked it up.
        Err(FsError::NotFound) if dirs.into_iter().flatten().any(|d| shard.dir_gone(d)) => {
            Err(FsError::Stale)
        }
        r => r,
    };
    // An operation cut halfway by a device error fails the shard (the worker
    // then stops the server) rather than leave memory ahead of the log.
    shard.end_request();
    (result, durability)
}

/// Runs a write whose data stays in its frame (`Frame::decode_write`), as
/// [`execute`] runs `Write` and `WriteData`; its reply may go out now.
pub fn execute_write<D: Device>(shard: &mut Shard<D>, w: &WriteRef<'_>) -> FsResult<Reply> {
    if log::log_enabled!(log::Level::Trace) {
        trace_write(w.opcode(), w.ino, w.offset, w.data);
    }
    let result = write(shard, w.ino, w.target, w.offset, w.data);
    shard.end_request();
    result
}

/// `Write` at the file's home or `WriteData` elsewhere.
fn write<D: Device>(
    shard: &mut Shard<D>,
    ino: InodeId,
    target: WriteTarget,
    offset: u64,
    data: &[u8],
) -> FsResult<Reply> {
    Ok(match target {
        WriteTarget::Home(_) => {
            let (ctime_before, ctime) = shard.write_timed(ino, offset, data)?;
            Reply::Write { written: data.len() as u32, ctime_before, ctime }
        }
        WriteTarget::Elsewhere(layout) => {
            let written = shard.write_data(ino, layout, offset, data)?;
            Reply::WriteData { written: written as u32 }
        }
    })
}

/// The trace line of a write: which file, where, how much, its first bytes.
fn trace_write(op: pfs_core::wire::Opcode, ino: InodeId, offset: u64, data: &[u8]) {
    let t = std::thread::current();
    log::trace!(
        "{} {op:?} ino {ino} at {offset:#x} +{:#x} first {:?}",
        t.name().unwrap_or("?"),
        data.len(),
        &data[..data.len().min(4)]
    );
}

/// One line per data request at trace level: which file, where, how much.
fn trace_request(req: &Request) {
    let t = std::thread::current();
    let w = t.name().unwrap_or("?");
    match req {
        Request::Write { ino, offset, data, .. } | Request::WriteData { ino, offset, data, .. } => {
            trace_write(req.opcode(), *ino, *offset, data)
        }
        Request::Read { ino, offset, size, .. } | Request::ReadData { ino, offset, size, .. } => {
            log::trace!("{w} {:?} ino {ino} at {offset:#x} +{size:#x}", req.opcode())
        }
        Request::SetAttr { ino, set } => log::trace!("{w} SetAttr ino {ino} size {:?}", set.size),
        Request::ExtendSize { ino, size } => log::trace!("{w} ExtendSize ino {ino} to {size:#x}"),
        Request::Append { ino, len, .. } => log::trace!("{w} Append ino {ino} of {len:#x}"),
        Request::FollowUps { from, ops } => log::trace!("{w} FollowUps from {from}: {ops:?}"),
        _ => {}
    }
}

fn run<D: Device>(shard: &mut Shard<D>, req: Request) -> FsResult<Reply> {
    Ok(match req {
        Request::Lookup { parent, name } => {
            shard.check_name_placed(parent, &name)?;
            let found = shard.lookup(parent, &name)?;
            if !shard.has_inode(found.ino) {
                // Moved here by a cross-shard rename: the inode stays at its home.
                // nlink 0 tells the client to ask there (docs/format.md).
                return Ok(Reply::Lookup(remote_entry(found.ino, found.kind)));
            }
            Reply::Lookup(entry(shard, found.ino)?)
        }
        Request::LookupData { parent, name } => {
            shard.check_name_placed(parent, &name)?;
            let found = shard.lookup(parent, &name)?;
            if !shard.has_inode(found.ino) {
                return Ok(Reply::LookupData {
                    entry: remote_entry(found.ino, found.kind),
                    data: None,
                });
            }
            let entry = entry(shard, found.ino)?;
            let data = shard.small_data_in_memory(found.ino, MAX_LOOKUP_DATA_BYTES);
            Reply::LookupData { entry, data }
        }
        Request::GetAttr { ino } => Reply::GetAttr(getattr(shard, ino)?),
        Request::SetAttr { ino, set } => {
            let attr = shard.setattr(ino, set)?;
            Reply::SetAttr(attr)
        }
        Request::Create { parent, name, perm, uid, gid, flags: _, layout } => {
            let args = CreateArgs {
                kind: FileType::Regular,
                perm,
                uid,
                gid,
                rdev: 0,
                layout: Some((DirLayout::default(), layout)),
            };
            let attr = shard.create(parent, &name, args)?;
            Reply::Create { entry: entry(shard, attr.ino)?, fh: FileHandle(0) }
        }
        Request::Mkdir { parent, name, perm, uid, gid, layout } => {
            let args = CreateArgs {
                kind: FileType::Directory,
                perm,
                uid,
                gid,
                rdev: 0,
                layout: Some((layout.dir, layout.file)),
            };
            let attr = shard.create(parent, &name, args)?;
            Reply::Mkdir(entry(shard, attr.ino)?)
        }
        Request::Mknod { parent, name, kind, perm, uid, gid, rdev } => {
            if matches!(kind, FileType::Directory | FileType::Symlink) {
                return Err(FsError::Invalid(format!("mknod of a {kind:?}: use mkdir or symlink")));
            }
            let args = CreateArgs { kind, perm, uid, gid, rdev, layout: None };
            let attr = shard.create(parent, &name, args)?;
            Reply::Mknod(entry(shard, attr.ino)?)
        }
        Request::Symlink { parent, name, target, uid, gid } => {
            let attr = shard.symlink(parent, &name, &target, uid, gid)?;
            Reply::Symlink(entry(shard, attr.ino)?)
        }
        Request::ReadLink { ino } => Reply::ReadLink(shard.readlink(ino)?),
        Request::Unlink { parent, name } => {
            shard.check_name_placed(parent, &name)?;
            let found = shard.lookup(parent, &name)?;
            // The pages of both inodes read together (`Shard::warm_inodes`).
            shard.warm_inodes(&[found.ino, parent])?;
            let remote = !shard.has_inode(found.ino);
            let (mut size, layout) = match shard.getattr(found.ino) {
                Ok(a) if a.kind == FileType::Regular => (a.size, shard.layouts(found.ino)?.1),
                _ => (0, pfs_core::FileLayout::default()),
            };
            shard.unlink(parent, &name)?;
            if shard.has_inode(found.ino) {
                // Other names keep the file: its data elsewhere stays.
                size = 0;
            }
            Reply::Unlink { ino: found.ino, size, layout, remote }
        }
        Request::Rmdir { parent, name } => {
            shard.check_name_placed(parent, &name)?;
            let found = shard.lookup(parent, &name)?;
            shard.warm_inodes(&[found.ino, parent])?;
            let remote = !shard.has_inode(found.ino);
            shard.rmdir(parent, &name)?;
            Reply::Rmdir { ino: found.ino, remote }
        }
        Request::Rename { parent, name, new_parent, new_name, flags } => {
            let flags = RenameFlags {
                noreplace: flags.contains(pfs_core::wire::RenameFlags::NOREPLACE),
                exchange: flags.contains(pfs_core::wire::RenameFlags::EXCHANGE),
            };
            let replaced = shard.rename(parent, &name, new_parent, &new_name, flags)?;
            Reply::Rename { replaced }
        }
        Request::ReadDir { ino, after, max_entries, max_bytes, plus, layout } => {
            shard.check_listing(ino, layout)?;
            readdir(shard, ino, &after, max_entries, max_bytes, plus)?
        }
        Request::Open { ino, flags: _ } => {
            shard.getattr(ino)?;
            Reply::Open { fh: FileHandle(0) }
        }
        // Durable at the worker's next group commit, which the reply waits for
        // (`Durability::AfterCommit`): closes and fsyncs from many clients share
        // one device flush instead of one each.
        Request::Release { .. } => Reply::Release,
        Request::Read { ino, fh: _, offset, size, blocks } => {
            Reply::Read(shard.read_blocks(ino, offset, size as usize, blocks)?)
        }
        Request::Write { ino, fh, offset, data } => {
            write(shard, ino, WriteTarget::Home(fh), offset, &data)?
        }
        Request::Fsync { .. } => Reply::Fsync,
        Request::StatFs => Reply::StatFs(shard.statfs()),
        Request::GetXattr { ino, name } => Reply::GetXattr(shard.getxattr(ino, &name)?),
        Request::SetXattr { ino, name, value, mode } => {
            let flags = XattrFlags {
                create: mode == XattrSetMode::Create,
                replace: mode == XattrSetMode::Replace,
            };
            shard.setxattr(ino, &name, &value, flags)?;
            Reply::SetXattr
        }
        Request::ListXattr { ino } => Reply::ListXattr(shard.listxattr(ino)?),
        Request::RemoveXattr { ino, name } => {
            shard.removexattr(ino, &name)?;
            Reply::RemoveXattr
        }
        Request::LayoutGet { ino } => {
            let attr = getattr(shard, ino)?;
            Reply::LayoutGet(layout_of(shard, &attr)?)
        }
        Request::LayoutSet { ino, layout } => {
            let any = XattrFlags::default();
            if shard.getattr(ino)?.kind == FileType::Directory {
                shard.setxattr(
                    ino,
                    XATTR_DIR_LAYOUT,
                    dir_layout_name(layout.dir).as_bytes(),
                    any,
                )?;
            }
            let file = file_layout_name(layout.file).as_bytes();
            shard.setxattr(ino, XATTR_FILE_LAYOUT, file, any)?;
            Reply::LayoutSet
        }
        Request::TokenAcquire { .. }
        | Request::TokenRelease { .. }
        | Request::TokenInvalidate { .. } => {
            return Err(FsError::NotSupported("dentry tokens are not served yet".into()))
        }
        // The worker's lock table answers these (`crate::locks`).
        Request::Lock { .. } | Request::LockRenew => {
            return Err(FsError::NotSupported("file locks are kept by the worker".into()))
        }
        Request::WriteData { ino, layout, offset, data } => {
            write(shard, ino, WriteTarget::Elsewhere(layout), offset, &data)?
        }
        Request::ReadData { ino, layout, offset, size, blocks } => {
            Reply::ReadData(shard.read_data_blocks(ino, layout, offset, size as usize, blocks)?)
        }
        Request::TruncateData { ino, layout, size, old_size } => {
            shard.truncate_data(ino, layout, size, old_size)?;
            Reply::TruncateData
        }
        Request::ExtendSize { ino, size } => {
            let attr = shard.getattr(ino)?;
            if attr.kind != FileType::Regular {
                return Err(FsError::Invalid(format!("extend the size of a {:?}", attr.kind)));
            }
            let ctime_before = attr.ctime_ns;
            let attr = if attr.size >= size {
                // Written inside the size on other shards: only the times change.
                shard.touch_data(ino)?
            } else {
                shard.setattr(ino, SetAttr { size: Some(size), ..SetAttr::default() })?
            };
            Reply::ExtendSize { attr, ctime_before }
        }
        Request::Append { ino, len, kill_suidgid } => {
            // One request on the home's worker: no other change of the size
            // comes between the read and the growth, so two appends never
            // get the same offset.
            let attr = shard.getattr(ino)?;
            if attr.kind != FileType::Regular {
                return Err(FsError::Invalid(format!("append to a {:?}", attr.kind)));
            }
            if len > MAX_IO_BYTES as u64 {
                return Err(FsError::Invalid(format!("append of {len} bytes: at most 1 MiB")));
            }
            let offset = attr.size;
            let end = offset + len;
            if end > pfs_core::MAX_FILE_SIZE {
                return Err(FsError::FileTooLarge);
            }
            let ctime_before = attr.ctime_ns;
            // What the kernel's `file_remove_privs` does before a cached
            // write; an append through the mount is uncached, so it is done
            // here, before the bytes go anywhere.
            if shard.getxattr(ino, CAPABILITY_XATTR).is_ok() {
                shard.removexattr(ino, CAPABILITY_XATTR)?;
            }
            let kill = if attr.perm & 0o010 != 0 { 0o6000 } else { 0o4000 };
            if kill_suidgid && attr.perm & kill != 0 {
                let perm = Some(attr.perm & !kill);
                shard.setattr(ino, SetAttr { perm, ..SetAttr::default() })?;
            }
            let attr = shard.setattr(ino, SetAttr { size: Some(end), ..SetAttr::default() })?;
            Reply::Append { offset, attr, ctime_before }
        }
        Request::XRenameTarget { txn, parent, name, value, flags } => {
            let noreplace = flags.contains(pfs_core::wire::RenameFlags::NOREPLACE);
            let exchange = flags.contains(pfs_core::wire::RenameFlags::EXCHANGE);
            let resume = flags.contains(pfs_core::wire::RenameFlags::RESUME);
            let answer =
                shard.xrename_target(txn, parent, &name, value, noreplace, exchange, resume);
            log::debug!("rename {txn:#x}: target side answers {answer:?}");
            let (old, replaced) = answer?;
            Reply::XRenameTarget { old: old.unwrap_or(0), replaced }
        }
        Request::TxnForget { txn, dir_removed } => {
            shard.forget_seal(txn, dir_removed)?;
            Reply::TxnForget
        }
        Request::SealDir { txn, dir } => {
            shard.seal_dir(txn, dir)?;
            Reply::SealDir
        }
        Request::RmdirBigDir { .. } => {
            return Err(FsError::Invalid("a bigdir rmdir reached the executor".into()))
        }
        // The worker answers it (`Worker::serve_durable`).
        Request::Durable => Reply::Durable,
        Request::DropInode { ino } => {
            let (size, layout) = shard.drop_orphan(ino)?;
            Reply::DropInode { size, layout }
        }
        Request::Link { ino, kind, new_parent, new_name } => {
            if shard.has_inode(ino) {
                shard.link(ino, new_parent, &new_name)?;
                Reply::Link(entry(shard, ino)?)
            } else {
                shard.link_name(ino, kind, new_parent, &new_name)?;
                Reply::Link(remote_entry(ino, kind))
            }
        }
        Request::AddLink { ino } => Reply::AddLink(shard.add_link(ino)?),
        Request::AdjustDir { dir, nlink_delta } => {
            shard.touch_dir(dir, i64::from(nlink_delta))?;
            Reply::AdjustDir
        }
        Request::RenameCross { .. } => {
            return Err(FsError::Invalid("a cross-shard rename reached the executor".into()))
        }
        Request::GetParent { ino } => Reply::GetParent { parent: shard.parent_of(ino)? },
        Request::ReserveData { ino, end } => {
            Reply::ReserveData { end: shard.reserve_data(ino, end)? }
        }
        Request::FollowUps { from, ops } => {
            log::debug!("follow-ups from shard {from}: {ops:?}");
            let applied = shard.apply_follow_ups(from, &ops)?;
            for note in applied.notes {
                log::warn!("{note}");
            }
            Reply::FollowUps { through: applied.through, refused: applied.refused }
        }
        Request::Register { .. } | Request::Heartbeat { .. } | Request::GetView => {
            return Err(FsError::Invalid(
                "a master request reached a storage server: point it at the master".into(),
            ))
        }
    })
}

fn readdir<D: Device>(
    shard: &mut Shard<D>,
    dir: InodeId,
    after: &[u8],
    max_entries: u32,
    max_bytes: u32,
    plus: bool,
) -> FsResult<Reply> {
    let max = (max_entries as usize).clamp(1, READDIR_MAX_ENTRIES);
    let budget = (max_bytes as usize).min(pfs_core::wire::MAX_IO_BYTES);
    let after = (!after.is_empty()).then_some(after);
    let mut found = shard.readdir(dir, after, max)?;
    // The attributes of the entries whose inodes live here (their pages read
    // together in the background when the worker allows it: then this
    // request runs again). A listing that meets an inode whose page is not
    // in memory ends before it (`Shard::attrs_of`); the client lists on from
    // the last name.
    let mut full = found.len() == max;
    let mut attrs = if plus {
        let inos: Vec<InodeId> = found.iter().map(|e| e.ino).collect();
        let attrs = shard.attrs_of(&inos)?;
        if attrs.len() < found.len() {
            found.truncate(attrs.len());
            full = true;
        }
        attrs.into_iter()
    } else {
        Vec::new().into_iter()
    };
    let mut entries = Vec::with_capacity(found.len());
    let mut used = 0usize;
    for (i, e) in found.into_iter().enumerate() {
        used += e.name.len() + DIRENT_OVERHEAD_BYTES;
        if used > budget && !entries.is_empty() {
            return Ok(Reply::ReadDir { entries, eof: false });
        }
        let attr = attrs.next().flatten();
        entries.push(DirEntry {
            name: e.name,
            ino: e.ino,
            kind: e.kind,
            cookie: i as u64 + 1,
            attr,
        });
    }
    Ok(Reply::ReadDir { entries, eof: !full })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::{RenameFlags as WireRenameFlags, ALL_BLOCKS};
    use pfs_core::{FileLayout, ShardId};
    use pfs_store::device::MemDevice;
    use pfs_store::{FormatOptions, ShardOptions};

    fn shard() -> Shard<MemDevice> {
        let dev = MemDevice::new(64 << 20, 64);
        Shard::format(dev, &FormatOptions::new(ShardId(0), 64 << 20), ShardOptions::default())
            .unwrap()
    }

    fn ok(shard: &mut Shard<MemDevice>, req: Request) -> Reply {
        execute(shard, req).0.unwrap()
    }

    /// `req` run as the worker runs it, with misses deferred: its result and
    /// what it stopped at.
    fn run_deferred(
        s: &mut Shard<MemDevice>,
        req: &Request,
    ) -> (FsResult<Reply>, Option<pfs_store::DeferredOn>) {
        s.set_defer_misses(true);
        let result = execute(s, req.clone()).0;
        s.set_defer_misses(false);
        (result, s.take_deferred())
    }

    /// Waits for the inode pages being read in the background.
    fn finish_page_reads(s: &mut Shard<MemDevice>) {
        while s.icache_reading() {
            s.icache_reads_done();
        }
    }

    fn create(shard: &mut Shard<MemDevice>, name: &str) -> InodeId {
        let req = Request::Create {
            parent: InodeId::ROOT,
            name: name.into(),
            perm: 0o640,
            uid: 7,
            gid: 8,
            flags: 0,
            layout: FileLayout::Io,
        };
        match ok(shard, req) {
            Reply::Create { entry, .. } => {
                assert_eq!((entry.attr.perm, entry.attr.uid, entry.attr.gid), (0o640, 7, 8));
                assert_eq!(entry.layout.file, FileLayout::Io);
                entry.attr.ino
            }
            other => panic!("create answered {other:?}"),
        }
    }

    #[test]
    fn create_write_read_and_list() {
        let mut s = shard();
        let ino = create(&mut s, "a");
        create(&mut s, "b");
        let w = Request::Write { ino, fh: FileHandle(0), offset: 3, data: b"xyz".to_vec() };
        let Reply::Write { written: 3, ctime_before, ctime } = ok(&mut s, w.clone()) else {
            panic!()
        };
        // Each change moves the ctime, even within one clock tick: a version.
        assert!(ctime > ctime_before, "{ctime} after {ctime_before}");
        let Reply::Write { ctime_before: again, ctime: later, .. } = ok(&mut s, w) else {
            panic!()
        };
        assert_eq!(again, ctime, "the second write starts where the first ended");
        assert!(later > ctime);
        let r = Request::Read { ino, fh: FileHandle(0), offset: 0, size: 100, blocks: ALL_BLOCKS };
        assert_eq!(ok(&mut s, r), Reply::Read(b"\0\0\0xyz".to_vec()));
        let list = |after: &[u8]| Request::ReadDir {
            ino: InodeId::ROOT,
            after: after.to_vec(),
            max_entries: 1,
            max_bytes: 1 << 20,
            plus: true,
            layout: pfs_core::DirLayout::BigDir,
        };
        let Reply::ReadDir { entries, eof } = ok(&mut s, list(b"")) else { panic!() };
        assert_eq!((entries.len(), eof, entries[0].name.as_slice()), (1, false, &b"a"[..]));
        assert_eq!(entries[0].attr.unwrap().size, 6);
        let Reply::ReadDir { entries, .. } = ok(&mut s, list(b"a")) else { panic!() };
        assert_eq!(entries[0].name, b"b");
        let Reply::ReadDir { entries, eof } = ok(&mut s, list(b"b")) else { panic!() };
        assert!(entries.is_empty() && eof);
    }

    /// A write run from its frame (`execute_write`) does what the decoded
    /// request does through `execute`, and fails the same way.
    #[test]
    fn a_write_from_its_frame_is_the_decoded_write() {
        use pfs_core::wire::{Body, Frame};
        use pfs_core::{ClientId, RequestId};
        let mut s = shard();
        let ino = create(&mut s, "f");
        let from_frame = |s: &mut Shard<MemDevice>, req: Request| {
            let frame =
                Frame { request_id: RequestId(1), client: ClientId(1), body: Body::Request(req) };
            let bytes = frame.to_bytes().unwrap();
            let (_, _, w) = Frame::decode_write(&bytes).unwrap().unwrap();
            execute_write(s, &w)
        };
        let w = Request::Write { ino, fh: FileHandle(0), offset: 2, data: b"abc".to_vec() };
        let Ok(Reply::Write { written: 3, .. }) = from_frame(&mut s, w) else { panic!() };
        let w =
            Request::WriteData { ino, layout: FileLayout::Block, offset: 7, data: b"d".to_vec() };
        assert_eq!(from_frame(&mut s, w), Ok(Reply::WriteData { written: 1 }));
        let r = Request::Read { ino, fh: FileHandle(0), offset: 0, size: 100, blocks: ALL_BLOCKS };
        assert_eq!(ok(&mut s, r), Reply::Read(b"\0\0abc\0\0d".to_vec()));
        let gone = Request::Write {
            ino: InodeId(ino.0 + 1000),
            fh: FileHandle(0),
            offset: 0,
            data: vec![1],
        };
        assert_eq!(from_frame(&mut s, gone.clone()), execute(&mut s, gone).0);
    }

    #[test]
    fn errors_carry_the_errno_a_caller_expects() {
        let mut s = shard();
        create(&mut s, "a");
        let again = Request::Create {
            parent: InodeId::ROOT,
            name: b"a".to_vec(),
            perm: 0o644,
            uid: 0,
            gid: 0,
            flags: 0,
            layout: FileLayout::Block,
        };
        assert_eq!(execute(&mut s, again).0, Err(FsError::Exists));
        let missing = Request::Lookup { parent: InodeId::ROOT, name: b"zz".to_vec() };
        assert_eq!(execute(&mut s, missing).0, Err(FsError::NotFound));
        let noreplace = Request::Rename {
            parent: InodeId::ROOT,
            name: b"a".to_vec(),
            new_parent: InodeId::ROOT,
            new_name: b"a2".to_vec(),
            flags: WireRenameFlags::NOREPLACE,
        };
        assert_eq!(ok(&mut s, noreplace), Reply::Rename { replaced: None });
        let master = execute(&mut s, Request::GetView).0.unwrap_err();
        assert!(master.to_string().contains("master"), "{master}");
        let (_, d) = execute(
            &mut s,
            Request::Fsync { ino: InodeId::ROOT, fh: FileHandle(0), datasync: false },
        );
        assert_eq!(d, Durability::AfterCommit);
    }

    #[test]
    fn a_set_group_id_directory_says_its_group_in_its_layouts() {
        let mut s = shard();
        let mkdir = Request::Mkdir {
            parent: InodeId::ROOT,
            name: b"project".to_vec(),
            perm: 0o775,
            uid: 7,
            gid: 8,
            layout: InodeLayout::default(),
        };
        let Reply::Mkdir(e) = ok(&mut s, mkdir) else { panic!() };
        assert_eq!(e.layout.group, None, "no set-group-ID bit");
        let set = SetAttr { perm: Some(0o2775), gid: Some(40), ..SetAttr::default() };
        ok(&mut s, Request::SetAttr { ino: e.attr.ino, set });
        let Reply::LayoutGet(l) = ok(&mut s, Request::LayoutGet { ino: e.attr.ino }) else {
            panic!()
        };
        assert_eq!(l.group, Some(40));
        let lookup = Request::Lookup { parent: InodeId::ROOT, name: b"project".to_vec() };
        let Reply::Lookup(e) = ok(&mut s, lookup) else { panic!() };
        assert_eq!(e.layout.group, Some(40), "a lookup's entry says it too");
        // A file's set-group-ID bit means something else.
        let f = create(&mut s, "tool");
        let set = SetAttr { perm: Some(0o2755), ..SetAttr::default() };
        ok(&mut s, Request::SetAttr { ino: f, set });
        let Reply::LayoutGet(l) = ok(&mut s, Request::LayoutGet { ino: f }) else { panic!() };
        assert_eq!(l.group, None);
    }

    #[test]
    fn appends_take_successive_ends() {
        let mut s = shard();
        let ino = create(&mut s, "log");
        let append = |len| Request::Append { ino, len, kill_suidgid: false };
        let mut expect = 0;
        for len in [10, 70_000, 1, MAX_IO_BYTES as u64] {
            let Reply::Append { offset, attr, ctime_before } = ok(&mut s, append(len)) else {
                panic!()
            };
            assert_eq!(offset, expect, "the size before");
            expect += len;
            assert_eq!(attr.size, expect, "the file grew by the write's length");
            assert!(attr.ctime_ns > ctime_before);
        }
        // Bounded by one write, not by what a client asks; only files.
        let err = execute(&mut s, append(MAX_IO_BYTES as u64 + 1)).0.unwrap_err();
        assert!(matches!(err, FsError::Invalid(_)), "{err:?}");
        let root = Request::Append { ino: InodeId::ROOT, len: 1, kill_suidgid: false };
        let err = execute(&mut s, root).0.unwrap_err();
        assert!(matches!(err, FsError::Invalid(_)), "{err:?}");
        ok(
            &mut s,
            Request::SetAttr {
                ino,
                set: SetAttr { size: Some(pfs_core::MAX_FILE_SIZE - 5), ..SetAttr::default() },
            },
        );
        assert_eq!(execute(&mut s, append(6)).0.unwrap_err(), FsError::FileTooLarge);
        assert_eq!(s.getattr(ino).unwrap().size, pfs_core::MAX_FILE_SIZE - 5, "unchanged");
        // What a write takes from the file: its capability always, set-ID
        // bits when the writer may not keep them.
        let f = create(&mut s, "privileged");
        let cap = || XattrSetMode::Any;
        for (kill, perm, after) in
            [(false, 0o6755, 0o6755), (true, 0o6755, 0o0755), (true, 0o6745, 0o2745)]
        {
            let set = SetAttr { perm: Some(perm), ..SetAttr::default() };
            ok(&mut s, Request::SetAttr { ino: f, set });
            let name = CAPABILITY_XATTR.to_vec();
            ok(&mut s, Request::SetXattr { ino: f, name, value: vec![1; 20], mode: cap() });
            ok(&mut s, Request::Append { ino: f, len: 1, kill_suidgid: kill });
            assert_eq!(s.getattr(f).unwrap().perm, after, "kill {kill}, {perm:o}");
            assert_eq!(s.getxattr(f, CAPABILITY_XATTR).unwrap_err(), FsError::NoAttr);
        }
    }

    #[test]
    fn extend_size_never_shrinks_and_data_ops_serve_foreign_inodes() {
        let mut s = shard();
        let ino = create(&mut s, "f");
        let grow = |size| Request::ExtendSize { ino, size };
        let Reply::ExtendSize { attr: a, ctime_before } = ok(&mut s, grow(100_000)) else {
            panic!()
        };
        assert_eq!(a.size, 100_000);
        assert!(a.ctime_ns > ctime_before);
        let Reply::ExtendSize { attr: b, ctime_before } = ok(&mut s, grow(10)) else { panic!() };
        assert_eq!(b.size, 100_000);
        assert_eq!(ctime_before, a.ctime_ns);
        assert!(b.ctime_ns > a.ctime_ns, "published inside the size: still a new version");
        // An inode homed on another shard: only its data lives here.
        let foreign = InodeId::compose(ShardId(5), 9);
        let w = Request::WriteData {
            ino: foreign,
            layout: FileLayout::Block,
            offset: 65536 + 10,
            data: vec![7; 100],
        };
        assert_eq!(ok(&mut s, w), Reply::WriteData { written: 100 });
        let read = |offset, size, blocks| Request::ReadData {
            ino: foreign,
            layout: FileLayout::Block,
            offset,
            size,
            blocks,
        };
        let Reply::ReadData(bytes) = ok(&mut s, read(65536, 120, ALL_BLOCKS)) else { panic!() };
        assert_eq!(&bytes[..10], &[0; 10]);
        assert_eq!(&bytes[10..110], &[7; 100][..]);
        assert_eq!(bytes.len(), 120);
        // Only the second block of a range over two: its 120 bytes.
        let Reply::ReadData(bytes) = ok(&mut s, read(65000, 656, 0b10)) else { panic!() };
        assert_eq!(bytes.len(), 120);
        assert_eq!(&bytes[10..110], &[7; 100][..]);
    }

    /// The requests the worker lets stop at a cold inode page (`deferrable`)
    /// besides the lookups and creates tested elsewhere: each, run with misses
    /// deferred on a shard whose pages are not in memory, stops with nothing
    /// changed and without a blocking read, and runs again once the page is
    /// in memory. Before, these six read their page waiting.
    #[test]
    fn link_count_size_and_layout_requests_stop_at_a_cold_inode_page() {
        let opts = ShardOptions { icache_blocks: 16, ..ShardOptions::default() };
        let dev = MemDevice::new(64 << 20, 64);
        let handle = dev.handle();
        let mut s =
            Shard::format(dev, &FormatOptions::new(ShardId(0), 64 << 20), opts.clone()).unwrap();
        let dir = match ok(
            &mut s,
            Request::Mkdir {
                parent: InodeId::ROOT,
                name: b"d".to_vec(),
                perm: 0o755,
                uid: 0,
                gid: 0,
                layout: Default::default(),
            },
        ) {
            Reply::Mkdir(e) => e.attr.ino,
            other => panic!("{other:?}"),
        };
        let f = create(&mut s, "f");
        // Enough inodes after them that their pages are not kept at open.
        for i in 0..2000 {
            create(&mut s, &format!("g{i:04}"));
        }
        s.commit().unwrap();
        s.checkpoint().unwrap();
        drop(s);
        let layout = InodeLayout { file: FileLayout::Block, ..InodeLayout::default() };
        let link = b"l".to_vec();
        // Each request, and what it did once run (not twice: the stopped
        // run changed nothing).
        type Check = fn(&mut Shard<MemDevice>, InodeId, InodeId) -> bool;
        let requests: [(Request, Check); 6] = [
            (Request::AdjustDir { dir, nlink_delta: 1 }, |s, d, _| {
                s.getattr(d).unwrap().nlink == 3
            }),
            (Request::AddLink { ino: f }, |s, _, f| s.getattr(f).unwrap().nlink == 2),
            (
                Request::Link { ino: f, kind: FileType::Regular, new_parent: dir, new_name: link },
                |s, d, f| s.getattr(f).unwrap().nlink == 2 && s.lookup(d, b"l").is_ok(),
            ),
            (Request::ReserveData { ino: f, end: 1 << 20 }, |_, _, _| true),
            (Request::ExtendSize { ino: f, size: 4096 }, |s, _, f| {
                s.getattr(f).unwrap().size == 4096
            }),
            (Request::LayoutSet { ino: f, layout }, |s, _, f| {
                s.layouts(f).unwrap().1 == FileLayout::Block
            }),
        ];
        for (req, check) in requests {
            assert!(deferrable(&req), "{req:?} is not let stop");
            let mut s = Shard::open(handle.crash(1), 0, opts.clone()).unwrap();
            let misses = s.stats().icache.misses;
            let (result, stop) = run_deferred(&mut s, &req);
            assert_eq!(result, Err(FsError::TryAgain), "{req:?}");
            assert_eq!(stop, Some(pfs_store::DeferredOn::InodePage), "{req:?}");
            finish_page_reads(&mut s);
            let (result, stop) = run_deferred(&mut s, &req);
            assert!(result.is_ok(), "{req:?} run again: {result:?}");
            assert_eq!(stop, None, "{req:?}");
            assert_eq!(s.stats().icache.misses, misses, "{req:?} read a page waiting");
            assert!(check(&mut s, dir, f), "{req:?}: not done exactly once");
        }
    }

    /// An `Unlink` and an `Rmdir` whose name's inode and directory are on two
    /// pages, neither in memory: one stop that reads both, not two.
    #[test]
    fn unlink_and_rmdir_read_both_their_pages_at_one_stop() {
        let opts = ShardOptions { icache_blocks: 16, ..ShardOptions::default() };
        let dev = MemDevice::new(64 << 20, 64);
        let handle = dev.handle();
        let mut s =
            Shard::format(dev, &FormatOptions::new(ShardId(0), 64 << 20), opts.clone()).unwrap();
        let mkdir = |s: &mut Shard<MemDevice>, parent: InodeId, name: &str| {
            let req = Request::Mkdir {
                parent,
                name: name.into(),
                perm: 0o755,
                uid: 0,
                gid: 0,
                layout: Default::default(),
            };
            match ok(s, req) {
                Reply::Mkdir(e) => e.attr.ino,
                other => panic!("{other:?}"),
            }
        };
        let d = mkdir(&mut s, InodeId::ROOT, "d");
        // Two pages' worth of inodes between the directory and its entries.
        for i in 0..40 {
            create(&mut s, &format!("a{i:02}"));
        }
        let file = Request::Create {
            parent: d,
            name: b"x".to_vec(),
            perm: 0o644,
            uid: 0,
            gid: 0,
            flags: 0,
            layout: FileLayout::Block,
        };
        ok(&mut s, file);
        mkdir(&mut s, d, "e");
        for i in 0..2000 {
            create(&mut s, &format!("g{i:04}"));
        }
        s.commit().unwrap();
        s.checkpoint().unwrap();
        drop(s);
        let unlink = Request::Unlink { parent: d, name: b"x".to_vec() };
        let rmdir = Request::Rmdir { parent: d, name: b"e".to_vec() };
        for req in [unlink, rmdir] {
            let mut s = Shard::open(handle.crash(1), 0, opts.clone()).unwrap();
            let st = s.stats().icache;
            let (result, stop) = run_deferred(&mut s, &req);
            assert_eq!(result, Err(FsError::TryAgain), "{req:?}");
            assert_eq!(stop, Some(pfs_store::DeferredOn::InodePage));
            assert_eq!(s.stats().icache.background_reads - st.background_reads, 2, "{req:?}");
            finish_page_reads(&mut s);
            let (result, stop) = run_deferred(&mut s, &req);
            assert!(result.is_ok(), "{req:?} run again: {result:?}");
            assert_eq!(stop, None, "{req:?} stopped a second time");
            assert_eq!(s.stats().icache.misses, st.misses, "{req:?} read a page waiting");
        }
    }

    /// `ReadDir`s with attributes over inodes whose pages are not in memory,
    /// with misses deferred (as the worker runs them), listed on from the
    /// last name of each answer as the client does: a call that meets a cold
    /// page first starts the reads of the next pages together (a quarter of
    /// the Icache) and stops; one that meets it after warm entries answers up
    /// to it. No page is read waiting, and every attribute is right.
    #[test]
    fn a_readdir_reads_its_entries_pages_together() {
        let opts = ShardOptions { icache_blocks: 32, ..ShardOptions::default() };
        let dev = MemDevice::new(64 << 20, 64);
        let handle = dev.handle();
        let mut s =
            Shard::format(dev, &FormatOptions::new(ShardId(0), 64 << 20), opts.clone()).unwrap();
        for i in 0..2000 {
            create(&mut s, &format!("f{i:04}"));
        }
        s.commit().unwrap();
        s.checkpoint().unwrap();
        drop(s);
        let mut s = Shard::open(handle.crash(1), 0, opts).unwrap();
        let list = |after: Vec<u8>| Request::ReadDir {
            ino: InodeId::ROOT,
            after,
            max_entries: 400,
            max_bytes: 1 << 20,
            plus: true,
            layout: pfs_core::DirLayout::BigDir,
        };
        let reads = s.stats().icache.background_reads;
        let misses = s.stats().icache.misses;
        let (mut entries, mut stops, mut answers) = (Vec::new(), 0, 0);
        while entries.len() < 400 {
            let after = entries.last().map(|e: &DirEntry| e.name.clone()).unwrap_or_default();
            s.set_defer_misses(true);
            let result = execute(&mut s, list(after)).0;
            if !s.take_deferred_miss() {
                let Reply::ReadDir { entries: got, eof } = result.unwrap() else { panic!() };
                assert!(!got.is_empty() && !eof, "an answer lists some and not the end");
                entries.extend(got);
                answers += 1;
                continue;
            }
            assert_eq!(result, Err(FsError::TryAgain));
            stops += 1;
            // 25 pages of entries, 8 read per stop, and the directory's own.
            assert!(stops <= 5, "stopped {stops} times");
            while s.icache_reading() {
                s.icache_reads_done();
            }
        }
        s.set_defer_misses(false);
        assert_eq!(s.stats().icache.misses, misses, "no page read waiting");
        let started = s.stats().icache.background_reads - reads;
        // Open leaves at most 32 of the 125 pages resident, some of these 25.
        assert!(started >= 8, "{started} pages read in {stops} stops, {answers} answers");
        entries.truncate(400);
        let names: Vec<Vec<u8>> = (0..400).map(|i| format!("f{i:04}").into_bytes()).collect();
        assert!(entries.iter().map(|e| &e.name).eq(names.iter()), "each name once, in order");
        assert!(entries.iter().all(|e| e.attr.is_some_and(|a| a.perm == 0o640 && a.uid == 7)));
    }
}
