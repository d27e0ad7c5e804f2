//! Distribution strategies (layouts) of directories and files.

use serde::{Deserialize, Serialize};

/// How a directory's children are placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum DirLayout {
    /// Children live with the directory's inode (locality).
    Regular = 0,
    /// Children are hashed over all shards by `(parent, name)` (balance).
    #[default]
    BigDir = 1,
}

/// How a file's data is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum FileLayout {
    /// Blocks hashed by `(ino, block)`; the first block with the inode.
    #[default]
    Block = 0,
    /// The whole file on one shard (N-N streams).
    File = 1,
    /// Every write owns its pages: no read-modify-write (N-1 non-overlapping).
    Io = 2,
}

impl DirLayout {
    /// Decodes the on-disk / on-wire byte.
    pub fn from_u8(v: u8) -> Option<DirLayout> {
        match v {
            0 => Some(DirLayout::Regular),
            1 => Some(DirLayout::BigDir),
            _ => None,
        }
    }
}

impl FileLayout {
    /// Decodes the on-disk / on-wire byte.
    pub fn from_u8(v: u8) -> Option<FileLayout> {
        match v {
            0 => Some(FileLayout::Block),
            1 => Some(FileLayout::File),
            2 => Some(FileLayout::Io),
            _ => None,
        }
    }
}
