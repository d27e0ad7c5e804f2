//! Follow-ups: the second step of an operation that spans shards, sent by one
//! server to another (docs/cluster.md, "Follow-ups").
//!
//! An operation whose effects reach past its own shard (removing a name whose
//! inode lives elsewhere, freeing a file's data on other shards, a bigdir's link
//! count at its home) logs each remote effect as a follow-up in the same WAL
//! record as its own change. After that record is durable the worker sends the
//! follow-up to its target, which applies it exactly once (a watermark per
//! sending shard, in the same record as the effect) and answers after its
//! commit; then the sender forgets it. The same bytes are the payload of a
//! follow-up record in the sender's transaction table (`docs/format.md`).

use crate::{FileLayout, InodeId};

/// Most follow-ups one `FollowUps` request carries.
pub const MAX_FOLLOW_UPS: usize = 256;
/// Longest encoded follow-up.
pub const MAX_FOLLOW_BYTES: usize = 64;

/// One remote effect of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowOp {
    /// At the inode's home: drop one link of `ino`, whose name was removed on
    /// the sending shard; free it when it was the last.
    Drop {
        /// The inode.
        ino: InodeId,
    },
    /// At a shard holding data of `ino`, which was freed: free all of it.
    FreeData {
        /// The freed file.
        ino: InodeId,
        /// Its data layout.
        layout: FileLayout,
        /// Its size when freed (bounds the blocks to look at).
        old_size: u64,
    },
    /// At a shard holding data of `ino`, which was truncated: free its data at
    /// or past `size`.
    CutData {
        /// The file.
        ino: InodeId,
        /// Its data layout.
        layout: FileLayout,
        /// The new size.
        size: u64,
        /// The size before.
        old_size: u64,
    },
    /// At a directory's home: an entry of it changed on the sending shard (a
    /// bigdir); set its times and add `nlink_delta` subdirectories.
    AdjustDir {
        /// The directory.
        dir: InodeId,
        /// Subdirectories added or removed, -2..=2.
        nlink_delta: i32,
    },
    /// At the inode's home: a hard link of `ino` was named on the sending shard.
    AddLink {
        /// The inode.
        ino: InodeId,
    },
    /// At the participant of a cross-shard rename: the transaction is over,
    /// forget its answer record.
    Forget {
        /// The transaction.
        txn: u64,
    },
    /// At the inode's home: its (last) name moved to directory `parent` on the
    /// sending shard, so its parent pointer follows.
    Reparent {
        /// The inode.
        ino: InodeId,
        /// Its new directory.
        parent: InodeId,
    },
}

impl FollowOp {
    /// The encoded follow-up (at most [`MAX_FOLLOW_BYTES`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(32);
        match *self {
            FollowOp::Drop { ino } => {
                o.push(1);
                o.extend_from_slice(&ino.0.to_le_bytes());
            }
            FollowOp::FreeData { ino, layout, old_size } => {
                o.push(2);
                o.extend_from_slice(&ino.0.to_le_bytes());
                o.push(layout as u8);
                o.extend_from_slice(&old_size.to_le_bytes());
            }
            FollowOp::CutData { ino, layout, size, old_size } => {
                o.push(3);
                o.extend_from_slice(&ino.0.to_le_bytes());
                o.push(layout as u8);
                o.extend_from_slice(&size.to_le_bytes());
                o.extend_from_slice(&old_size.to_le_bytes());
            }
            FollowOp::AdjustDir { dir, nlink_delta } => {
                o.push(4);
                o.extend_from_slice(&dir.0.to_le_bytes());
                o.extend_from_slice(&nlink_delta.to_le_bytes());
            }
            FollowOp::AddLink { ino } => {
                o.push(5);
                o.extend_from_slice(&ino.0.to_le_bytes());
            }
            FollowOp::Forget { txn } => {
                o.push(6);
                o.extend_from_slice(&txn.to_le_bytes());
            }
            FollowOp::Reparent { ino, parent } => {
                o.push(7);
                o.extend_from_slice(&ino.0.to_le_bytes());
                o.extend_from_slice(&parent.0.to_le_bytes());
            }
        }
        o
    }

    /// Decodes [`to_bytes`](Self::to_bytes) output; `None` for anything else.
    pub fn from_bytes(b: &[u8]) -> Option<FollowOp> {
        Self::from_prefix(b).and_then(|(op, len)| (b.len() == len).then_some(op))
    }

    /// Decodes a follow-up at the start of `b`; returns it and its length
    /// (a sender's record keeps more after it: docs/format.md).
    pub fn from_prefix(b: &[u8]) -> Option<(FollowOp, usize)> {
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let layout_at = |o: usize| FileLayout::from_u8(*b.get(o)?);
        let (op, len) = match *b.first()? {
            1 => (FollowOp::Drop { ino: InodeId(u64_at(1)?) }, 9),
            2 => (
                FollowOp::FreeData {
                    ino: InodeId(u64_at(1)?),
                    layout: layout_at(9)?,
                    old_size: u64_at(10)?,
                },
                18,
            ),
            3 => (
                FollowOp::CutData {
                    ino: InodeId(u64_at(1)?),
                    layout: layout_at(9)?,
                    size: u64_at(10)?,
                    old_size: u64_at(18)?,
                },
                26,
            ),
            4 => {
                let delta = i32::from_le_bytes(b.get(9..13)?.try_into().ok()?);
                if !(-2..=2).contains(&delta) {
                    return None;
                }
                (FollowOp::AdjustDir { dir: InodeId(u64_at(1)?), nlink_delta: delta }, 13)
            }
            5 => (FollowOp::AddLink { ino: InodeId(u64_at(1)?) }, 9),
            6 => (FollowOp::Forget { txn: u64_at(1)? }, 9),
            7 => (FollowOp::Reparent { ino: InodeId(u64_at(1)?), parent: InodeId(u64_at(9)?) }, 17),
            _ => return None,
        };
        Some((op, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_follow_up_round_trips_and_garbage_is_refused() {
        let ino = InodeId(0x1234_5678_9abc);
        let all = [
            FollowOp::Drop { ino },
            FollowOp::FreeData { ino, layout: FileLayout::Io, old_size: 1 << 40 },
            FollowOp::CutData { ino, layout: FileLayout::Block, size: 7, old_size: 99 },
            FollowOp::AdjustDir { dir: ino, nlink_delta: -2 },
            FollowOp::AddLink { ino },
            FollowOp::Forget { txn: u64::MAX },
            FollowOp::Reparent { ino, parent: InodeId(1) },
        ];
        for op in all {
            let b = op.to_bytes();
            assert!(b.len() <= MAX_FOLLOW_BYTES);
            assert_eq!(FollowOp::from_bytes(&b), Some(op));
            assert_eq!(FollowOp::from_bytes(&b[..b.len() - 1]), None);
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(FollowOp::from_bytes(&longer), None);
        }
        let mut bad = FollowOp::AdjustDir { dir: ino, nlink_delta: 1 }.to_bytes();
        bad[9] = 9;
        assert_eq!(FollowOp::from_bytes(&bad), None, "a link count change of 9");
        assert_eq!(FollowOp::from_bytes(&[]), None);
        assert_eq!(FollowOp::from_bytes(&[7, 0]), None);
    }
}
