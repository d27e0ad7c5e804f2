//! Freeing a file's data in bounded steps (the trim table).
//!
//! Truncating or removing a file frees every block and extent past the cut. A
//! 1 TiB file holds millions of them, so one WAL record cannot log them all and
//! one request cannot wait for them. As ext4's orphan list does, an operation
//! frees what fits in [`FREE_BUDGET_BYTES`] of its record and, when more is left,
//! logs a trim entry `ino -> from` in the same record: "everything of `ino` at or
//! past byte `from` on this shard is garbage". [`Shard::trim_step`] then frees the
//! rest one bounded record at a time (the worker calls it between requests), and
//! the record that frees the last of it deletes the entry. Trim entries are in the
//! checkpoint and the WAL, so recovery resumes where the log stopped.
//!
//! Garbage is never seen: every operation that reads or maps data of `ino` first
//! runs its trim to the end ([`Shard::settle`]); that costs time proportional to
//! what is allocated, never to the file size. Inode numbers are never reused, so a
//! removed file's trim runs in the background only, and its extended attributes
//! (left when there were too many for the removing record) go with it.

use pfs_core::{BlockIndex, FsResult, InodeId};

use super::Shard;
use crate::device::Device;
use crate::wal::Change;

/// Bytes of free changes (`BlockDel`, `ExtentDel`, `XattrDel`) one record may hold;
/// leaves room under the record limit for the operation's other changes.
pub const FREE_BUDGET_BYTES: usize = 48 << 10;

/// Older extents an `io` write may remove in its own record (17 bytes each in
/// the WAL); more are removed first by [`Shard::pretrim`].
pub const PRETRIM_EXTENTS: usize = 2048;

impl<D: Device> Shard<D> {
    /// Whether data is waiting to be freed in the background.
    pub fn has_trims(&self) -> bool {
        !self.trims.is_empty()
    }

    /// Files whose data is still being freed.
    pub fn trims_pending(&self) -> usize {
        self.trims.len()
    }

    /// Frees the next bounded piece of the oldest trim, as one operation; returns
    /// the changes it logged (0 when nothing was waiting).
    pub fn trim_step(&mut self) -> FsResult<usize> {
        let Some((&ino, _)) = self.trims.iter().next() else { return Ok(0) };
        self.trim_step_of(ino)
    }

    /// Runs the trim of `ino`, if any, to its end: called before any operation
    /// that reads or maps data of `ino`, so garbage is never seen or kept.
    pub(super) fn settle(&mut self, ino: InodeId) -> FsResult<()> {
        // Each step frees at least one entry or deletes the trim, so this ends
        // after at most (entries of `ino`) / (entries per step) + 1 steps.
        while self.trims.contains_key(&ino) {
            self.trim_step_of(ino)?;
        }
        Ok(())
    }

    fn trim_step_of(&mut self, ino: InodeId) -> FsResult<usize> {
        let from = *self.trims.get(&ino).expect("trim of a listed inode");
        self.begin()?;
        let mut home = match self.inode(ino) {
            Ok(inode) => Some(inode),
            Err(pfs_core::FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        let mut pages = 0u64;
        let done = self.free_past(ino, from, home.is_none(), &mut pages)?;
        if let Some(inode) = home.as_mut().filter(|_| pages > 0) {
            inode.pages -= pages;
            self.put_inode(inode)?;
        }
        if done {
            self.log(Change::TrimDel { ino })?;
        }
        let n = self.op_changes;
        self.finish()?;
        Ok(n)
    }

    /// Before an `io`-layout write of `len` bytes at `offset`: while more older
    /// extents lie wholly inside the range than one record may remove
    /// ([`PRETRIM_EXTENTS`]), removes them in records of their own, so the
    /// write's record stays bounded (a file of millions of 1-byte extents
    /// overwritten by one 1 MiB write). A crash between those records and the
    /// write leaves zeros where the unacknowledged write was going.
    pub(super) fn pretrim(&mut self, ino: InodeId, offset: u64, len: u64) -> FsResult<()> {
        let end = offset.saturating_add(len);
        // Each round removes PRETRIM_EXTENTS extents, so this ends.
        loop {
            let covered: Vec<(u64, crate::wal::record::Extent)> = self
                .extents
                .range((ino, offset)..(ino, end))
                .filter(|(&(_, off), e)| off + u64::from(e.len) <= end)
                .take(PRETRIM_EXTENTS + 1)
                .map(|(&(_, off), &e)| (off, e))
                .collect();
            if covered.len() <= PRETRIM_EXTENTS {
                return Ok(());
            }
            self.begin()?;
            let mut pages = 0u64;
            for &(off, e) in &covered[..PRETRIM_EXTENTS] {
                self.log(Change::ExtentDel { ino, offset: off })?;
                if !self.run_refs.contains_key(&e.run.page) {
                    self.pending_free.push(e.run);
                    pages += u64::from(e.run.pages);
                }
            }
            if let Ok(mut inode) = self.inode(ino) {
                inode.pages -= pages.min(inode.pages);
                self.put_inode(&inode)?;
            }
            self.finish()?;
        }
    }

    /// Inside an operation: unmaps whole blocks and extents of `ino` at or past
    /// byte `from` (and its xattrs when `gone`), while the record's free budget
    /// lasts. Adds the freed pages to `pages`; returns whether nothing is left.
    /// Block 0 of a file homed here lives in its inode: the caller handles it.
    pub(super) fn free_past(
        &mut self,
        ino: InodeId,
        from: u64,
        gone: bool,
        pages: &mut u64,
    ) -> FsResult<bool> {
        let bs = self.geo.block_size as u64;
        let first = BlockIndex(from.div_ceil(bs));
        loop {
            if self.record.len() >= FREE_BUDGET_BYTES {
                return Ok(false);
            }
            let next_block = self
                .blocks
                .range((ino, first)..=(ino, BlockIndex(u64::MAX)))
                .next()
                .map(|(&(_, b), &run)| (b, run));
            if let Some((block, run)) = next_block {
                self.pending_free.push(run);
                *pages += run.pages as u64;
                self.log(Change::BlockDel { ino, block })?;
                continue;
            }
            let next_extent = self
                .extents
                .range((ino, from)..=(ino, u64::MAX))
                .next()
                .map(|(&(_, off), &e)| (off, e));
            if let Some((offset, e)) = next_extent {
                self.log(Change::ExtentDel { ino, offset })?;
                if !self.run_refs.contains_key(&e.run.page) {
                    self.pending_free.push(e.run);
                    *pages += e.run.pages as u64;
                }
                continue;
            }
            if gone {
                let name = self.xattrs.get(&ino).and_then(|m| m.keys().next().cloned());
                if let Some(name) = name {
                    self.log(Change::XattrDel { ino, name })?;
                    continue;
                }
            }
            return Ok(true);
        }
    }
}
