//! Values that several messages carry, and their encodings.

use super::cursor::{Reader, Writer};
use super::{WireError, MAX_ERROR_MESSAGE_BYTES, MAX_NAME_BYTES};
use crate::{DirLayout, FileAttr, FileLayout, FileType, FsError, InodeId, SetAttr, StatFs};

/// A value with a fixed little-endian encoding.
pub(crate) trait Codec: Sized {
    /// Appends the encoding; fails only for a value over a protocol limit.
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError>;
    /// Reads one value from untrusted bytes.
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError>;
}

/// Largest permission value: the low 12 bits of `st_mode`.
const PERM_MAX: u16 = 0o7777;

/// The layouts of an inode: for a directory, how its children are placed and the
/// file layout new files inherit; for a file, its data layout (`dir` is `Regular`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InodeLayout {
    /// Placement of a directory's children.
    pub dir: DirLayout,
    /// Data layout of a file, or the default for new files in a directory.
    pub file: FileLayout,
    /// For a set-group-ID directory, its group: what its new entries take
    /// instead of their creator's (and a new subdirectory the bit too), as
    /// on any Linux file system. `None` otherwise.
    pub group: Option<u32>,
}

/// A name resolved to an inode: the reply of lookup, mkdir, mknod and symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The inode's attributes.
    pub attr: FileAttr,
    /// The inode's layouts, which the client needs to route requests under it.
    pub layout: InodeLayout,
}

/// One directory entry in a readdir reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name.
    pub name: Vec<u8>,
    /// Its inode.
    pub ino: InodeId,
    /// Its type.
    pub kind: FileType,
    /// Where the next readdir resumes after this entry.
    pub cookie: u64,
    /// Its attributes, when asked for (readdirplus) and held by the same shard.
    pub attr: Option<FileAttr>,
}

/// Flags of a rename, with the values of Linux `renameat2`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RenameFlags(u32);

impl RenameFlags {
    /// Fail with `Exists` if the target name exists.
    pub const NOREPLACE: RenameFlags = RenameFlags(1);
    /// Swap the two names atomically; both must exist.
    pub const EXCHANGE: RenameFlags = RenameFlags(2);
    /// Server to server only (`XRenameTarget`): a coordinator resuming a rename
    /// whose client was told `EIO` asks the participant to finish only what it
    /// already applied, and to abandon the rest (docs/cluster.md).
    pub const RESUME: RenameFlags = RenameFlags(1 << 31);
    const ALL: u32 = Self::NOREPLACE.0 | Self::EXCHANGE.0 | Self::RESUME.0;

    /// No flags: a plain rename that replaces the target.
    pub const fn empty() -> RenameFlags {
        RenameFlags(0)
    }

    /// The flags in `bits`, or `None` if a bit is not a rename flag.
    pub fn from_bits(bits: u32) -> Option<RenameFlags> {
        (bits & !Self::ALL == 0).then_some(RenameFlags(bits))
    }

    /// The raw bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: RenameFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for RenameFlags {
    type Output = RenameFlags;
    fn bitor(self, rhs: RenameFlags) -> RenameFlags {
        RenameFlags(self.0 | rhs.0)
    }
}

/// How setxattr treats an existing attribute (`XATTR_CREATE`, `XATTR_REPLACE`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum XattrSetMode {
    /// Create or replace.
    #[default]
    Any = 0,
    /// Fail with `Exists` if the attribute exists.
    Create = 1,
    /// Fail with `NoAttr` if it does not.
    Replace = 2,
}

/// A dentry-cache token on a directory: shared read or exclusive write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TokenMode {
    /// Shared: the holder may cache the directory's dentries.
    Read = 1,
    /// Exclusive: the holder may change them.
    Write = 2,
    /// The cluster's rename lock, taken on the root at its home: exclusive
    /// among clients, held while a client checks that a directory it moves
    /// to another parent does not go into its own subtree and moves it, so
    /// two such moves cannot each pass the check and make a cycle. A holder
    /// another client asks for it keeps it (the asker gets `TryAgain`).
    Rename = 3,
    /// A hold on a directory on the shard asked (any shard that may hold its
    /// entries): granted only while that shard has none of them
    /// (`NotEmpty`), and while held no new name goes into it there (creates
    /// and renames into it get `TryAgain`). A client takes it on every such
    /// shard before it renames over the directory, so the directory is
    /// empty when replaced; given back after, or run out after 5 s.
    Hold = 4,
    /// Given back (`TokenRelease`) instead of `Hold` once the rename replaced
    /// the directory, or sent after a bigdir's rmdir: the shard remembers the
    /// directory removed and refuses new names in it (`NotFound`). As an
    /// acquire it is refused (`EINVAL`).
    Gone = 5,
    /// Given back instead of `Hold` once the directory's layout changed to
    /// `regular`: the shard refuses, for a minute, new names in it that the
    /// new layout does not place there (`Misrouted`), which a client that
    /// cached the old layout may still send. As an acquire, `EINVAL`.
    RelaidRegular = 6,
    /// As `RelaidRegular`, for a change to `bigdir`.
    RelaidBigDir = 7,
}

impl TokenMode {
    /// The release that tells a shard a directory's layout changed to `layout`.
    pub fn relaid(layout: crate::DirLayout) -> TokenMode {
        match layout {
            crate::DirLayout::Regular => TokenMode::RelaidRegular,
            crate::DirLayout::BigDir => TokenMode::RelaidBigDir,
        }
    }

    /// The new layout a `Relaid*` release tells of.
    pub fn relaid_layout(self) -> Option<crate::DirLayout> {
        match self {
            TokenMode::RelaidRegular => Some(crate::DirLayout::Regular),
            TokenMode::RelaidBigDir => Some(crate::DirLayout::BigDir),
            _ => None,
        }
    }
}

/// What a file lock request does: take a shared or an exclusive lock, or
/// give back what the owner holds of a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LockKind {
    /// Shared (`F_RDLCK`, `LOCK_SH`): conflicts with another owner's `Write`.
    Read = 1,
    /// Exclusive (`F_WRLCK`, `LOCK_EX`): conflicts with another owner's lock.
    Write = 2,
    /// Release (`F_UNLCK`, `LOCK_UN`).
    Unlock = 3,
}

/// Last byte of a lock that runs to the end of the file, however long it
/// grows: Linux's `OFFSET_MAX`, what the kernel sends for `l_len = 0`.
pub const LOCK_END_MAX: u64 = i64::MAX as u64;

/// A file lock, as asked for or as held (docs/posix.md, "locks").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileLock {
    /// Shared, exclusive, or a release.
    pub kind: LockKind,
    /// A `flock(2)` lock (the whole file; its owner is the open file) rather
    /// than a `fcntl(2)` record lock: the two kinds never conflict, as on Linux.
    pub flock: bool,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive, at most [`LOCK_END_MAX`].
    pub end: u64,
    /// The asking process's id on its client; a conflict held by another
    /// client is reported with 0 (its process is not one of the asker's).
    pub pid: u32,
}

impl FileLock {
    /// A release of everything an owner holds of one kind (record locks, or
    /// with `flock` its `flock`): what a close gives back.
    pub fn released_all(flock: bool) -> FileLock {
        FileLock { kind: LockKind::Unlock, flock, start: 0, end: LOCK_END_MAX, pid: 0 }
    }
}

impl Codec for LockKind {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(*self as u8);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        match r.u8("lock kind")? {
            1 => Ok(LockKind::Read),
            2 => Ok(LockKind::Write),
            3 => Ok(LockKind::Unlock),
            v => Err(WireError::BadValue { what: "lock kind", value: v.into() }),
        }
    }
}

impl Codec for FileLock {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.kind.put(w)?;
        w.u8(u8::from(self.flock));
        w.u64(self.start);
        w.u64(self.end);
        w.u32(self.pid);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let kind = LockKind::get(r)?;
        let flock = match r.u8("lock flags")? {
            0 => false,
            1 => true,
            v => return Err(WireError::BadValue { what: "lock flags", value: v.into() }),
        };
        let (start, end) = (r.u64("lock start")?, r.u64("lock end")?);
        if start > end || end > LOCK_END_MAX {
            return Err(WireError::BadValue { what: "lock range end", value: end });
        }
        Ok(FileLock { kind, flock, start, end, pid: r.u32("lock pid")? })
    }
}

/// A granted token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenGrant {
    /// The mode granted.
    pub mode: TokenMode,
    /// How long the token is valid from the reply, in milliseconds.
    pub lease_ms: u32,
}

impl Codec for InodeId {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u64(self.0);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(InodeId(r.u64("inode")?))
    }
}

/// Decodes a permission field, refusing bits outside `0o7777`.
pub(crate) fn read_perm(r: &mut Reader<'_>) -> Result<u16, WireError> {
    let perm = r.u16("perm")?;
    check_perm(perm)?;
    Ok(perm)
}

fn check_perm(perm: u16) -> Result<(), WireError> {
    if perm > PERM_MAX {
        return Err(WireError::BadValue { what: "perm", value: perm.into() });
    }
    Ok(())
}

/// Encodes a permission field, refusing bits outside `0o7777`.
pub(crate) fn write_perm(w: &mut Writer<'_>, perm: u16) -> Result<(), WireError> {
    check_perm(perm)?;
    w.u16(perm);
    Ok(())
}

/// Decodes a file type byte.
pub(crate) fn read_kind(r: &mut Reader<'_>) -> Result<FileType, WireError> {
    let v = r.u8("file type")?;
    FileType::from_u8(v).ok_or(WireError::BadValue { what: "file type", value: v.into() })
}

/// Decodes a name of at most [`MAX_NAME_BYTES`] into an owned vector.
pub(crate) fn read_name(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u8>, WireError> {
    Ok(r.bytes16(what, MAX_NAME_BYTES)?.to_vec())
}

/// Encodes a name of at most [`MAX_NAME_BYTES`].
pub(crate) fn write_name(
    w: &mut Writer<'_>,
    what: &'static str,
    name: &[u8],
) -> Result<(), WireError> {
    w.bytes16(what, name, MAX_NAME_BYTES)
}

impl Codec for FileAttr {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u64(self.ino.0);
        w.u8(self.kind as u8);
        write_perm(w, self.perm)?;
        w.u32(self.uid);
        w.u32(self.gid);
        w.u64(self.size);
        w.u64(self.blocks);
        w.u32(self.nlink);
        w.u32(self.rdev);
        w.i64(self.atime_ns);
        w.i64(self.mtime_ns);
        w.i64(self.ctime_ns);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(FileAttr {
            ino: InodeId(r.u64("attr.ino")?),
            kind: read_kind(r)?,
            perm: read_perm(r)?,
            uid: r.u32("attr.uid")?,
            gid: r.u32("attr.gid")?,
            size: r.u64("attr.size")?,
            blocks: r.u64("attr.blocks")?,
            nlink: r.u32("attr.nlink")?,
            rdev: r.u32("attr.rdev")?,
            atime_ns: r.i64("attr.atime")?,
            mtime_ns: r.i64("attr.mtime")?,
            ctime_ns: r.i64("attr.ctime")?,
        })
    }
}

/// Bits of the setattr presence mask, in field order.
mod set_bits {
    pub const PERM: u8 = 1 << 0;
    pub const UID: u8 = 1 << 1;
    pub const GID: u8 = 1 << 2;
    pub const SIZE: u8 = 1 << 3;
    pub const ATIME: u8 = 1 << 4;
    pub const MTIME: u8 = 1 << 5;
    pub const ALL: u8 = (1 << 6) - 1;
}

impl Codec for SetAttr {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        use set_bits::*;
        let mut mask = 0;
        let present = [
            (self.perm.is_some(), PERM),
            (self.uid.is_some(), UID),
            (self.gid.is_some(), GID),
            (self.size.is_some(), SIZE),
            (self.atime_ns.is_some(), ATIME),
            (self.mtime_ns.is_some(), MTIME),
        ];
        for (is_set, bit) in present {
            if is_set {
                mask |= bit;
            }
        }
        w.u8(mask);
        if let Some(perm) = self.perm {
            write_perm(w, perm)?;
        }
        if let Some(uid) = self.uid {
            w.u32(uid);
        }
        if let Some(gid) = self.gid {
            w.u32(gid);
        }
        if let Some(size) = self.size {
            w.u64(size);
        }
        if let Some(atime) = self.atime_ns {
            w.i64(atime);
        }
        if let Some(mtime) = self.mtime_ns {
            w.i64(mtime);
        }
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        use set_bits::*;
        let mask = r.u8("setattr mask")?;
        if mask & !ALL != 0 {
            return Err(WireError::BadValue { what: "setattr mask", value: mask.into() });
        }
        let has = |bit: u8| mask & bit != 0;
        Ok(SetAttr {
            perm: if has(PERM) { Some(read_perm(r)?) } else { None },
            uid: if has(UID) { Some(r.u32("setattr.uid")?) } else { None },
            gid: if has(GID) { Some(r.u32("setattr.gid")?) } else { None },
            size: if has(SIZE) { Some(r.u64("setattr.size")?) } else { None },
            atime_ns: if has(ATIME) { Some(r.i64("setattr.atime")?) } else { None },
            mtime_ns: if has(MTIME) { Some(r.i64("setattr.mtime")?) } else { None },
        })
    }
}

impl Codec for StatFs {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u32(self.block_size);
        w.u64(self.blocks);
        w.u64(self.blocks_free);
        w.u64(self.files);
        w.u64(self.files_free);
        w.u32(self.name_max);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(StatFs {
            block_size: r.u32("statfs.block_size")?,
            blocks: r.u64("statfs.blocks")?,
            blocks_free: r.u64("statfs.blocks_free")?,
            files: r.u64("statfs.files")?,
            files_free: r.u64("statfs.files_free")?,
            name_max: r.u32("statfs.name_max")?,
        })
    }
}

impl Codec for InodeLayout {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(self.dir as u8);
        w.u8(self.file as u8);
        w.bool(self.group.is_some());
        w.u32(self.group.unwrap_or(0));
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let dir = r.u8("dir layout")?;
        let dir = DirLayout::from_u8(dir)
            .ok_or(WireError::BadValue { what: "dir layout", value: dir.into() })?;
        let file = r.u8("file layout")?;
        let file = FileLayout::from_u8(file)
            .ok_or(WireError::BadValue { what: "file layout", value: file.into() })?;
        let inherits = r.bool("inherited group")?;
        let gid = r.u32("inherited group")?;
        Ok(InodeLayout { dir, file, group: inherits.then_some(gid) })
    }
}

impl Codec for Entry {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.attr.put(w)?;
        self.layout.put(w)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(Entry { attr: FileAttr::get(r)?, layout: InodeLayout::get(r)? })
    }
}

impl DirEntry {
    /// Smallest encoding: empty name, no attributes.
    pub(crate) const MIN_WIRE_BYTES: usize = 2 + 8 + 1 + 8 + 1;
}

impl Codec for DirEntry {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        write_name(w, "dir entry name", &self.name)?;
        w.u64(self.ino.0);
        w.u8(self.kind as u8);
        w.u64(self.cookie);
        w.bool(self.attr.is_some());
        match &self.attr {
            Some(attr) => attr.put(w),
            None => Ok(()),
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let name = read_name(r, "dir entry name")?;
        let ino = InodeId(r.u64("dir entry ino")?);
        let kind = read_kind(r)?;
        let cookie = r.u64("dir entry cookie")?;
        let attr = if r.bool("dir entry has attr")? { Some(FileAttr::get(r)?) } else { None };
        Ok(DirEntry { name, ino, kind, cookie, attr })
    }
}

impl Codec for RenameFlags {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u32(self.0);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let bits = r.u32("rename flags")?;
        RenameFlags::from_bits(bits)
            .ok_or(WireError::BadValue { what: "rename flags", value: bits.into() })
    }
}

impl Codec for XattrSetMode {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(*self as u8);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        match r.u8("setxattr mode")? {
            0 => Ok(XattrSetMode::Any),
            1 => Ok(XattrSetMode::Create),
            2 => Ok(XattrSetMode::Replace),
            v => Err(WireError::BadValue { what: "setxattr mode", value: v.into() }),
        }
    }
}

impl Codec for TokenMode {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u8(*self as u8);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        match r.u8("token mode")? {
            1 => Ok(TokenMode::Read),
            2 => Ok(TokenMode::Write),
            3 => Ok(TokenMode::Rename),
            4 => Ok(TokenMode::Hold),
            5 => Ok(TokenMode::Gone),
            6 => Ok(TokenMode::RelaidRegular),
            7 => Ok(TokenMode::RelaidBigDir),
            v => Err(WireError::BadValue { what: "token mode", value: v.into() }),
        }
    }
}

impl Codec for TokenGrant {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        self.mode.put(w)?;
        w.u32(self.lease_ms);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(TokenGrant { mode: TokenMode::get(r)?, lease_ms: r.u32("token lease")? })
    }
}

/// An error reply: the errno, then the detail text of the variants that have one.
impl Codec for FsError {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.i32(self.errno());
        // A long detail is cut (at a character boundary) rather than lose the reply.
        let detail = self.detail();
        let mut end = detail.len().min(MAX_ERROR_MESSAGE_BYTES);
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        w.bytes16("error message", &detail.as_bytes()[..end], MAX_ERROR_MESSAGE_BYTES)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let errno = r.i32("errno")?;
        let detail = r.bytes16("error message", MAX_ERROR_MESSAGE_BYTES)?;
        // A peer's text is shown to users, never parsed: replace bad UTF-8, don't
        // fail. Replacements are longer than the bytes they replace, so cut as the
        // encoder does: what decodes then encodes back to the same bytes.
        let text = String::from_utf8_lossy(detail);
        let mut end = text.len().min(MAX_ERROR_MESSAGE_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        Ok(FsError::from_errno(errno, &text[..end]))
    }
}
