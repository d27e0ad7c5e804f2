//! What `pfs fsck` reads of one shard, and the repairs it may make.
//!
//! [`Shard::census`] lists everything the shard holds (inodes, names, which
//! inodes own data here, pending trims, transaction records) and the problems
//! one shard can see alone. The checks that need every shard (a name's inode on
//! another shard, link counts, orphans) are in the `pfs` binary (`src/fsck.rs`).
//! Each repair is an ordinary logged operation: one WAL record, durable at the
//! next commit.

use std::collections::{BTreeMap, BTreeSet};

use pfs_core::{FileLayout, FileType, FsError, FsResult, InodeId, ShardId};

use super::data::MAX_FILE_SIZE;
use super::meta::decode_dentry;
use super::{Change, Shard};
use crate::device::Device;

/// One inode as fsck sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CensusInode {
    /// The inode number.
    pub ino: InodeId,
    /// Its type.
    pub kind: FileType,
    /// Its link count.
    pub nlink: u32,
    /// The directory that holds its (last) name.
    pub parent: InodeId,
    /// Its metadata layout (where a directory's names live).
    pub dir_layout: pfs_core::DirLayout,
}

/// One name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CensusName {
    /// The directory.
    pub parent: InodeId,
    /// The name.
    pub name: Vec<u8>,
    /// The inode it names.
    pub ino: InodeId,
    /// The type the name records.
    pub kind: FileType,
}

/// Everything fsck needs of one shard.
#[derive(Clone, Debug, Default)]
pub struct Census {
    /// The shard.
    pub shard: ShardId,
    /// Its inodes.
    pub inodes: Vec<CensusInode>,
    /// Its names.
    pub names: Vec<CensusName>,
    /// Inodes with data pages here (blocks or extents), with their page count.
    pub data: BTreeMap<InodeId, u64>,
    /// Inodes whose data is being freed here (a trim is pending).
    pub trims: BTreeSet<InodeId>,
    /// Transaction records: id and bytes.
    pub txns: Vec<(u64, Vec<u8>)>,
    /// Problems this shard shows alone.
    pub problems: Vec<String>,
}

impl<D: Device> Shard<D> {
    /// Lists what this shard holds (see the module docs).
    pub fn census(&mut self) -> FsResult<Census> {
        let mut c = Census { shard: self.id(), ..Census::default() };
        let mut inos: Vec<InodeId> = self.inode_slots.keys().copied().collect();
        inos.sort();
        for ino in inos {
            let inode = self.inode(ino)?;
            c.inodes.push(CensusInode {
                ino,
                kind: inode.kind,
                nlink: inode.nlink,
                parent: inode.parent,
                dir_layout: inode.dir_layout,
            });
            if let Some(run) = inode.first_block {
                *c.data.entry(ino).or_default() += u64::from(run.pages);
            }
        }
        let mut parents: Vec<InodeId> = self.dentries.parents().collect();
        parents.sort();
        for parent in parents {
            self.dentries.for_each_from(parent, None, |name, value| {
                let (ino, kind) = decode_dentry(value);
                c.names.push(CensusName { parent, name: name.to_vec(), ino, kind });
                true
            });
        }
        for ((ino, _), run) in &self.blocks {
            *c.data.entry(*ino).or_default() += u64::from(run.pages);
        }
        for ((ino, _), e) in &self.extents {
            *c.data.entry(*ino).or_default() += u64::from(e.run.pages);
        }
        c.trims = self.trims.keys().copied().collect();
        c.txns = self.txns();
        for n in &c.names {
            if let Some(i) = c.inodes.iter().find(|i| i.ino == n.ino) {
                if i.kind != n.kind {
                    c.problems.push(format!(
                        "name {:?} in {} says {:?}, its inode {} is a {:?}",
                        String::from_utf8_lossy(&n.name),
                        n.parent,
                        n.kind,
                        n.ino,
                        i.kind
                    ));
                }
            }
        }
        for ino in self.xattrs.keys() {
            if !self.inode_slots.contains_key(ino) {
                c.problems.push(format!("extended attributes of inode {ino}, which is not here"));
            }
        }
        Ok(c)
    }

    /// Repair: removes the name `name` in `parent`, and nothing else.
    pub fn repair_remove_name(&mut self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        if self.dentries.get(parent, name).is_none() {
            return Err(FsError::NotFound);
        }
        self.begin()?;
        self.log(Change::DentryDel { parent, name: name.to_vec() })?;
        self.finish()
    }

    /// Repair: sets the link count of local inode `ino`.
    pub fn repair_set_nlink(&mut self, ino: InodeId, nlink: u32) -> FsResult<()> {
        let mut inode = self.inode(ino)?;
        self.begin()?;
        inode.nlink = nlink;
        self.put_inode(&inode)?;
        self.finish()
    }

    /// Repair: frees local inode `ino` that no name reaches, with its data here.
    pub fn repair_drop_inode(&mut self, ino: InodeId) -> FsResult<()> {
        let inode = self.inode(ino)?;
        self.settle(ino)?;
        self.begin()?;
        self.drop_inode(&inode)?;
        self.finish()
    }

    /// Repair: frees the data held here of inode `ino`, which lives nowhere.
    pub fn repair_free_data(&mut self, ino: InodeId) -> FsResult<()> {
        for layout in [FileLayout::Block, FileLayout::Io] {
            self.truncate_data(ino, layout, 0, MAX_FILE_SIZE)?;
        }
        Ok(())
    }
}
