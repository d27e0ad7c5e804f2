//! Checkpoint encoding of the shard tables (layout in `docs/format.md`):
//! seven sections, each a `u64` count followed by its entries. A checkpoint
//! written before trims existed ends after the sixth; it loads with no trims.

use pfs_core::{BlockIndex, InodeId};

use super::Shard;
use crate::device::Device;
use crate::error::StoreError;
use crate::wal::record::{
    put_bytes8, put_run, put_u32, put_u64, take, take_bytes8, take_run, take_u32, take_u64, Extent,
};

/// Checkpoint bytes of one inode-table entry.
pub const INODE_BYTES: u64 = 16;
/// Checkpoint bytes of one block-map entry.
pub const BLOCK_BYTES: u64 = 32;
/// Checkpoint bytes of one extent entry.
pub const EXTENT_BYTES: u64 = 40;
/// Checkpoint bytes of one trim entry.
pub const TRIM_BYTES: u64 = 16;

/// Checkpoint bytes of one dentry.
pub fn dentry_bytes(name: &[u8]) -> u64 {
    8 + 1 + name.len() as u64 + 8
}

/// Checkpoint bytes of one cross-shard transaction record.
pub fn txn_bytes(data: &[u8]) -> u64 {
    8 + 4 + data.len() as u64
}

/// Checkpoint bytes of one extended attribute.
pub fn xattr_bytes(name: &[u8], value: &[u8]) -> u64 {
    8 + 1 + name.len() as u64 + 4 + value.len() as u64
}

impl<D: Device> Shard<D> {
    pub(super) fn encode_tables(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.table_bytes as usize + 64);
        // Dentries, directory by directory in name order.
        let mut count_at = out.len();
        put_u64(&mut out, 0);
        let mut n = 0u64;
        let mut parents: Vec<InodeId> = self.dentries.parents().collect();
        parents.sort();
        for parent in parents {
            self.dentries.for_each_from(parent, None, |name, value| {
                put_u64(&mut out, parent.0);
                put_bytes8(&mut out, name);
                put_u64(&mut out, value);
                n += 1;
                true
            });
        }
        out[count_at..count_at + 8].copy_from_slice(&n.to_le_bytes());

        put_u64(&mut out, self.inode_slots.len() as u64);
        for (ino, slot) in &self.inode_slots {
            put_u64(&mut out, ino.0);
            put_u64(&mut out, *slot);
        }
        put_u64(&mut out, self.blocks.len() as u64);
        for ((ino, block), run) in &self.blocks {
            put_u64(&mut out, ino.0);
            put_u64(&mut out, block.0);
            put_run(&mut out, run);
        }
        put_u64(&mut out, self.extents.len() as u64);
        for ((ino, offset), e) in &self.extents {
            put_u64(&mut out, ino.0);
            put_u64(&mut out, *offset);
            put_u32(&mut out, e.len);
            put_u32(&mut out, e.skip);
            put_run(&mut out, &e.run);
        }
        count_at = out.len();
        put_u64(&mut out, 0);
        let mut n = 0u64;
        for (ino, map) in &self.xattrs {
            for (name, value) in map {
                put_u64(&mut out, ino.0);
                put_bytes8(&mut out, name);
                put_u32(&mut out, value.len() as u32);
                out.extend_from_slice(value);
                n += 1;
            }
        }
        out[count_at..count_at + 8].copy_from_slice(&n.to_le_bytes());
        put_u64(&mut out, self.txns.len() as u64);
        for (id, data) in &self.txns {
            put_u64(&mut out, *id);
            put_u32(&mut out, data.len() as u32);
            out.extend_from_slice(data);
        }
        put_u64(&mut out, self.trims.len() as u64);
        for (ino, from) in &self.trims {
            put_u64(&mut out, ino.0);
            put_u64(&mut out, *from);
        }
        out
    }

    pub(super) fn load_tables(&mut self, mut buf: &[u8]) -> Result<(), StoreError> {
        let b = &mut buf;
        // Every count is bounded by the bytes left, so a corrupt count cannot
        // make us loop or allocate without end.
        let count = |b: &mut &[u8], min_entry: usize| -> Result<u64, StoreError> {
            let n = take_u64(b)?;
            if n > (b.len() / min_entry) as u64 {
                return Err(StoreError::Corruption(format!(
                    "checkpoint count {n} exceeds the bytes left"
                )));
            }
            Ok(n)
        };
        for _ in 0..count(b, 17)? {
            let parent = InodeId(take_u64(b)?);
            let name = take_bytes8(b)?;
            let value = take_u64(b)?;
            self.table_bytes += dentry_bytes(&name);
            self.dentries.insert(parent, &name, value);
        }
        for _ in 0..count(b, 16)? {
            let ino = InodeId(take_u64(b)?);
            let slot = take_u64(b)?;
            self.table_bytes += INODE_BYTES;
            self.inode_slots.insert(ino, slot);
        }
        for _ in 0..count(b, 32)? {
            let ino = InodeId(take_u64(b)?);
            let block = BlockIndex(take_u64(b)?);
            let run = take_run(b)?;
            self.table_bytes += BLOCK_BYTES;
            self.blocks.insert((ino, block), run);
        }
        for _ in 0..count(b, 40)? {
            let ino = InodeId(take_u64(b)?);
            let offset = take_u64(b)?;
            let extent = Extent { len: take_u32(b)?, skip: take_u32(b)?, run: take_run(b)? };
            self.table_bytes += EXTENT_BYTES;
            self.extents.insert((ino, offset), extent);
            *self.run_refs.entry(extent.run.page).or_default() += 1;
        }
        for _ in 0..count(b, 13)? {
            let ino = InodeId(take_u64(b)?);
            let name = take_bytes8(b)?;
            let len = take_u32(b)? as usize;
            let value = take(b, len)?.to_vec();
            self.table_bytes += xattr_bytes(&name, &value);
            self.xattrs.entry(ino).or_default().insert(name, value);
        }
        for _ in 0..count(b, 12)? {
            let id = take_u64(b)?;
            let len = take_u32(b)? as usize;
            let data = take(b, len)?.to_vec();
            self.table_bytes += txn_bytes(&data);
            if let Some(dir) = super::txn::sealed_dir(id, &data) {
                *self.sealed.entry(dir).or_default() += 1;
            }
            self.txns.insert(id, data);
        }
        if !b.is_empty() {
            for _ in 0..count(b, 16)? {
                let ino = InodeId(take_u64(b)?);
                let from = take_u64(b)?;
                self.table_bytes += TRIM_BYTES;
                self.trims.insert(ino, from);
            }
        }
        if !b.is_empty() {
            return Err(StoreError::Corruption(format!(
                "{} trailing bytes after checkpoint tables",
                b.len()
            )));
        }
        Ok(())
    }
}
