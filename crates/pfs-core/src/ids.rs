//! Newtype identifiers: never a bare `u64` that could be two things.

use std::fmt;

macro_rules! id_type {
    ($(#[$meta:meta])* $name:ident($inner:ty)) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
        #[derive(serde::Serialize, serde::Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl From<$inner> for $name {
            fn from(v: $inner) -> Self {
                Self(v)
            }
        }
    };
}

id_type!(
    /// An inode number, unique in the whole cluster (shard bits in the high part).
    InodeId(u64)
);
id_type!(
    /// A shard: one worker's zone on one server.
    ShardId(u32)
);
id_type!(
    /// A storage server in the cluster view.
    ServerId(u32)
);
id_type!(
    /// A client (mount or native-API process) as registered with the cluster.
    ClientId(u32)
);
id_type!(
    /// Index of a file block (file offset / block size).
    BlockIndex(u64)
);
id_type!(
    /// A worker thread (and its shard) within one server, `0..workers`.
    WorkerId(u32)
);
id_type!(
    /// An open file as the server knows it, returned by open and create.
    FileHandle(u64)
);
id_type!(
    /// Matches a reply to its request on one connection.
    RequestId(u64)
);

impl InodeId {
    /// The root directory of the namespace.
    pub const ROOT: InodeId = InodeId(1);

    /// Bits of an inode number that hold the per-shard sequence; the bits above
    /// hold the shard that allocated it, so inode numbers never collide.
    pub const SEQ_BITS: u32 = 40;

    /// Builds the inode number `seq` allocated by `shard`.
    pub fn compose(shard: ShardId, seq: u64) -> InodeId {
        assert!(
            seq < (1 << Self::SEQ_BITS),
            "inode sequence {seq} overflows {} bits",
            Self::SEQ_BITS
        );
        InodeId(((shard.0 as u64 + 1) << Self::SEQ_BITS) | seq)
    }

    /// The shard that allocated this inode, or `None` for the root.
    pub fn shard(self) -> Option<ShardId> {
        let hi = self.0 >> Self::SEQ_BITS;
        (hi != 0).then(|| ShardId((hi - 1) as u32))
    }

    /// The per-shard sequence part.
    pub fn seq(self) -> u64 {
        self.0 & ((1 << Self::SEQ_BITS) - 1)
    }
}

impl BlockIndex {
    /// The block that holds byte `offset` of a file with `block_size_bytes` blocks.
    pub fn of_offset(offset: u64, block_size_bytes: u64) -> BlockIndex {
        assert!(block_size_bytes > 0, "block size must be positive");
        BlockIndex(offset / block_size_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_round_trips() {
        let ino = InodeId::compose(ShardId(7), 12345);
        assert_eq!(ino.shard(), Some(ShardId(7)));
        assert_eq!(ino.seq(), 12345);
        assert_eq!(InodeId::ROOT.shard(), None);
        assert_ne!(InodeId::compose(ShardId(0), 1), InodeId::ROOT);
    }
}
