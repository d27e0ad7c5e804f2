//! File types and attributes as the client sees them.

use serde::{Deserialize, Serialize};

/// The kind of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u8)]
pub enum FileType {
    /// A regular file.
    Regular = 1,
    /// A directory.
    Directory = 2,
    /// A symbolic link; its target is stored as the file's data.
    Symlink = 3,
    /// A character device node.
    CharDevice = 4,
    /// A block device node.
    BlockDevice = 5,
    /// A named pipe.
    Fifo = 6,
    /// A unix-domain socket node.
    Socket = 7,
}

impl FileType {
    /// Decodes the on-disk / on-wire byte.
    pub fn from_u8(v: u8) -> Option<FileType> {
        Some(match v {
            1 => FileType::Regular,
            2 => FileType::Directory,
            3 => FileType::Symlink,
            4 => FileType::CharDevice,
            5 => FileType::BlockDevice,
            6 => FileType::Fifo,
            7 => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
        }
    }

    /// The type named by the `S_IFMT` bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::Regular,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }
}

/// A point in time, nanoseconds since the Unix epoch.
pub type TimeNs = i64;

/// Attributes of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttr {
    /// The inode number.
    pub ino: crate::InodeId,
    /// The file type.
    pub kind: FileType,
    /// Permission bits (the low 12 bits of `st_mode`).
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte sectors.
    pub blocks: u64,
    /// Link count (1 for files, 2 + subdirectories for directories).
    pub nlink: u32,
    /// Device number for device nodes.
    pub rdev: u32,
    /// Last access.
    pub atime_ns: TimeNs,
    /// Last data change.
    pub mtime_ns: TimeNs,
    /// Last status change.
    pub ctime_ns: TimeNs,
}

impl FileAttr {
    /// The full `st_mode` (type and permission bits).
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm as u32
    }
}

/// Which attributes a setattr changes; `None` leaves one alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u16>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend).
    pub size: Option<u64>,
    /// New access time.
    pub atime_ns: Option<TimeNs>,
    /// New modification time.
    pub mtime_ns: Option<TimeNs>,
}

/// File system usage, as `statfs` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    /// Size of a data page in bytes.
    pub block_size: u32,
    /// Total data pages.
    pub blocks: u64,
    /// Free data pages.
    pub blocks_free: u64,
    /// Total inode slots.
    pub files: u64,
    /// Free inode slots.
    pub files_free: u64,
    /// Longest name accepted.
    pub name_max: u32,
}

impl StatFs {
    /// Adds another shard's usage to this one.
    pub fn merge(&mut self, other: &StatFs) {
        self.block_size = self.block_size.max(other.block_size);
        self.blocks += other.blocks;
        self.blocks_free += other.blocks_free;
        self.files += other.files;
        self.files_free += other.files_free;
        self.name_max =
            if self.name_max == 0 { other.name_max } else { self.name_max.min(other.name_max) };
    }
}

/// Longest file name component, as in Linux.
pub const NAME_MAX: usize = 255;

/// A file's POSIX access ACL, as the kernel passes it; pfs keeps it in the
/// mode bits (pfs-store `shard/acl.rs`).
pub const XATTR_ACL_ACCESS: &[u8] = b"system.posix_acl_access";
/// A directory's POSIX default ACL (what new children inherit); refused.
pub const XATTR_ACL_DEFAULT: &[u8] = b"system.posix_acl_default";
