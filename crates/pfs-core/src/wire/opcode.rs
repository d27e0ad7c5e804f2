//! Operation codes: one per request kind; its reply carries the same code.

/// The operation a frame carries. Numbers are protocol: never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum Opcode {
    /// Resolve a name in a directory.
    Lookup = 1,
    /// Read an inode's attributes.
    GetAttr = 2,
    /// Change an inode's attributes (chmod, chown, truncate, utimes).
    SetAttr = 3,
    /// Create and open a regular file.
    Create = 4,
    /// Create a directory.
    Mkdir = 5,
    /// Create a device node, fifo or socket.
    Mknod = 6,
    /// Create a symbolic link.
    Symlink = 7,
    /// Read a symbolic link's target.
    ReadLink = 8,
    /// Remove a non-directory name.
    Unlink = 9,
    /// Remove an empty directory.
    Rmdir = 10,
    /// Rename or exchange names.
    Rename = 11,
    /// List a directory after a name.
    ReadDir = 12,
    /// Open a file.
    Open = 13,
    /// Close an open file.
    Release = 14,
    /// Read file data.
    Read = 15,
    /// Write file data.
    Write = 16,
    /// Make a file's data durable.
    Fsync = 17,
    /// File system usage.
    StatFs = 18,
    /// Read an extended attribute.
    GetXattr = 19,
    /// Set an extended attribute.
    SetXattr = 20,
    /// List extended attribute names.
    ListXattr = 21,
    /// Remove an extended attribute.
    RemoveXattr = 22,
    /// Read an inode's layouts.
    LayoutGet = 23,
    /// Change an inode's layouts.
    LayoutSet = 24,
    /// Acquire a dentry-cache token on a directory.
    TokenAcquire = 25,
    /// Give a token back.
    TokenRelease = 26,
    /// Server to client: drop cached dentries of a directory and its token.
    TokenInvalidate = 27,
    /// Write data of a file whose inode lives on another shard.
    WriteData = 28,
    /// Read data of a file whose inode lives on another shard.
    ReadData = 29,
    /// Free data past a size on a shard that is not the inode's home.
    TruncateData = 30,
    /// Grow a file's size to at least a value (after writes to other shards).
    ExtendSize = 31,
    /// Server to master: register at start.
    Register = 32,
    /// Server to master: periodic usage report.
    Heartbeat = 33,
    /// Client to master: fetch the cluster view.
    GetView = 34,
    /// Rename whose target name lives on another shard (sent to the source's).
    RenameCross = 35,
    /// Coordinator to participant: put the moved entry at the target name.
    XRenameTarget = 36,
    /// Coordinator to participant: the transaction is done, forget it.
    TxnForget = 37,
    /// Free an inode whose name was removed on another shard.
    DropInode = 38,
    /// Remove an empty `bigdir` directory, its emptiness checked on every shard.
    RmdirBigDir = 39,
    /// Coordinator to participant: seal a directory for an rmdir if empty here.
    SealDir = 40,
    /// Add a name for an existing inode (a hard link), at the new name's shard.
    Link = 41,
    /// Grow an inode's link count at its home, for a new name on another shard.
    AddLink = 42,
    /// Update a directory's link count and times at its home after a change of
    /// its entries on another shard (a bigdir).
    AdjustDir = 43,
    /// Server to server: follow-ups of operations on the sending shard.
    FollowUps = 44,
    /// Reserve data of a file on other shards before writing there.
    ReserveData = 45,
    /// The directory holding an inode's (last) name.
    GetParent = 46,
    /// `Lookup`, and a small file's data when the server holds it in memory.
    LookupData = 47,
    /// Answer once every change the shard acknowledged before is durable,
    /// without hurrying its commit.
    Durable = 48,
    /// Grow a file by a length for an `O_APPEND` write, answering where the
    /// write goes (the size before).
    Append = 49,
    /// Take, test or give back a file lock at the file's home.
    Lock = 50,
    /// Extend the lease of every file lock the client holds on a shard.
    LockRenew = 51,
}

impl Opcode {
    /// Every opcode, in number order.
    pub const ALL: [Opcode; 51] = [
        Opcode::Lookup,
        Opcode::GetAttr,
        Opcode::SetAttr,
        Opcode::Create,
        Opcode::Mkdir,
        Opcode::Mknod,
        Opcode::Symlink,
        Opcode::ReadLink,
        Opcode::Unlink,
        Opcode::Rmdir,
        Opcode::Rename,
        Opcode::ReadDir,
        Opcode::Open,
        Opcode::Release,
        Opcode::Read,
        Opcode::Write,
        Opcode::Fsync,
        Opcode::StatFs,
        Opcode::GetXattr,
        Opcode::SetXattr,
        Opcode::ListXattr,
        Opcode::RemoveXattr,
        Opcode::LayoutGet,
        Opcode::LayoutSet,
        Opcode::TokenAcquire,
        Opcode::TokenRelease,
        Opcode::TokenInvalidate,
        Opcode::WriteData,
        Opcode::ReadData,
        Opcode::TruncateData,
        Opcode::ExtendSize,
        Opcode::Register,
        Opcode::Heartbeat,
        Opcode::GetView,
        Opcode::RenameCross,
        Opcode::XRenameTarget,
        Opcode::TxnForget,
        Opcode::DropInode,
        Opcode::RmdirBigDir,
        Opcode::SealDir,
        Opcode::Link,
        Opcode::AddLink,
        Opcode::AdjustDir,
        Opcode::FollowUps,
        Opcode::ReserveData,
        Opcode::GetParent,
        Opcode::LookupData,
        Opcode::Durable,
        Opcode::Append,
        Opcode::Lock,
        Opcode::LockRenew,
    ];

    /// The opcode numbered `v`, if any.
    pub fn from_u16(v: u16) -> Option<Opcode> {
        // Numbers are dense from 1, so the table index is the number minus one.
        let op = *Self::ALL.get(usize::from(v).checked_sub(1)?)?;
        assert_eq!(op as u16, v, "opcode table out of order");
        Some(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_dense_and_stable() {
        for (i, op) in Opcode::ALL.iter().enumerate() {
            assert_eq!(*op as u16, i as u16 + 1);
            assert_eq!(Opcode::from_u16(*op as u16), Some(*op));
        }
        assert_eq!(Opcode::from_u16(0), None);
        assert_eq!(Opcode::from_u16(52), None);
        assert_eq!(Opcode::Write as u16, 16);
    }
}
