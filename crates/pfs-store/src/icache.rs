//! The Icache (PeakFS Fig. 8): a fixed number of cache blocks, each holding the K
//! inode slots of one metadata page, driven through the states
//! free -> reading -> ready -> dirty -> writing -> ready, with LRU eviction and a
//! dirty-ratio cap that starts write-back.
//!
//! Write-ahead rule: a dirty block is written back only once every WAL record that
//! changed it is durable (`dirty_lsn <= durable_lsn`), so a crash never leaves a
//! slot newer than the log.

use crate::device::{AlignedBuf, Device, IoKind, IoRequest, SECTOR_SIZE};
use crate::error::StoreError;
use crate::inode::INODE_SLOT_SIZE;
use crate::io::DevIo;
use pfs_core::hash::NumMap;

/// Inode slots per cache block (one 4 KiB metadata page).
pub const INODES_PER_BLOCK: u64 = (SECTOR_SIZE / INODE_SLOT_SIZE) as u64;

const NIL: u32 = u32::MAX;
/// Tag bit of the write of a block's copy (`write_copy`), beside its index.
const COPY_TAG: u64 = 1 << 32;
/// Tag bit of a page read started by `start_read`, beside the block's index.
const READ_TAG: u64 = 1 << 33;
/// Pages whose read failed, remembered until a blocking load reports it.
const READ_ERRORS_MAX: usize = 64;

/// The state of one cache block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Holds nothing.
    Free,
    /// Being filled from the device.
    Reading,
    /// Holds the page as on the device.
    Ready,
    /// Holds changes not yet written back.
    Dirty,
    /// Being written back.
    Writing,
}

#[derive(Debug)]
struct CacheBlock {
    state: BlockState,
    /// Metadata page cached here.
    page: u64,
    /// The page; `None` while the device holds it (reading or writing).
    data: Option<AlignedBuf>,
    /// Highest WAL sequence number that changed this block since it was clean.
    dirty_lsn: u64,
    /// Lowest such number: the block holds no change older than it that the
    /// device lacks (a checkpoint waits for blocks older than its snapshot).
    first_dirty_lsn: u64,
    /// A copy of this block as of that lsn is being written (`write_copy`):
    /// the block itself is not written back meanwhile, so the two writes of
    /// the page never race.
    copy_lsn: Option<u64>,
    /// The checkpoint under way needs this block as of its snapshot and no
    /// copy was taken yet: the first change after it takes one first
    /// (`freeze`).
    frozen: bool,
    prev: u32,
    next: u32,
}

/// What [`Icache::start_read`] did for a page that is not in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageRead {
    /// Its read started now.
    Started,
    /// It is being read or written back already, or no block is free until a
    /// write-back in flight lands: nothing started.
    InFlight,
    /// Nothing started: [`Icache::read_cap`] background reads are in flight.
    NoRoom,
    /// The caller must load the page itself, waiting: it is resident, its
    /// last read failed, or no block is free and none is being written.
    Load,
}

/// Hit, miss and write-back counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IcacheStats {
    /// Lookups served from memory.
    pub hits: u64,
    /// Lookups that read a page.
    pub misses: u64,
    /// Blocks written back.
    pub writebacks: u64,
    /// Ready blocks dropped to make room.
    pub evictions: u64,
    /// Pages of free slots made resident as zeros, without a read.
    pub blank_loads: u64,
    /// Pages read in the background (`start_read`), and those done.
    pub background_reads: u64,
    /// See `background_reads`.
    pub background_reads_done: u64,
    /// Background reads not started because [`Icache::read_cap`] of them
    /// were in flight (the request stops for one to finish instead).
    pub read_room_stops: u64,
    /// Write-backs that finished (written, or failed and the block dirty
    /// again).
    pub writebacks_done: u64,
}

/// What [`Icache::write_back_older`] still waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBack {
    /// Every block it was given reached the device.
    Done,
    /// Write-backs in flight.
    Writing,
    /// Blocks whose newest records are not durable yet: a commit first.
    NeedsCommit,
}

/// A fixed set of cache blocks over the metadata area of a zone.
#[derive(Debug)]
pub struct Icache {
    blocks: Vec<CacheBlock>,
    /// Metadata page -> block.
    index: NumMap<u64, u32>,
    free: Vec<u32>,
    /// Least recently used at `lru_head`, most recent at `lru_tail` (non-free blocks).
    lru_head: u32,
    lru_tail: u32,
    dirty_count: usize,
    writing_count: usize,
    dirty_max: usize,
    /// Device byte offset of metadata page 0.
    area_offset: u64,
    area_pages: u64,
    durable_lsn: u64,
    /// `durable_lsn` at the last write-back walk.
    last_write_back_lsn: u64,
    /// Pages whose read in the background failed: the next load of one reads
    /// it blocking, so the operation gets the error.
    read_errors: Vec<u64>,
    /// Copies of frozen blocks taken before their first change after the
    /// snapshot, waiting to be written (at most one per block).
    taken: Vec<(u32, AlignedBuf)>,
    frozen_count: usize,
    stats: IcacheStats,
}

impl Icache {
    /// `block_count` blocks over `area_pages` metadata pages at byte `area_offset`;
    /// write-back starts when more than `dirty_ratio` of the blocks are dirty.
    pub fn new(block_count: usize, dirty_ratio: f64, area_offset: u64, area_pages: u64) -> Icache {
        assert!(block_count >= 2, "an Icache needs at least 2 blocks");
        assert!((0.0..=1.0).contains(&dirty_ratio), "dirty ratio {dirty_ratio} outside 0..=1");
        let blocks = (0..block_count)
            .map(|_| CacheBlock {
                state: BlockState::Free,
                page: 0,
                data: None,
                dirty_lsn: 0,
                first_dirty_lsn: 0,
                copy_lsn: None,
                frozen: false,
                prev: NIL,
                next: NIL,
            })
            .collect();
        Icache {
            blocks,
            index: NumMap::with_capacity_and_hasher(block_count, Default::default()),
            free: (0..block_count as u32).rev().collect(),
            lru_head: NIL,
            lru_tail: NIL,
            dirty_count: 0,
            writing_count: 0,
            dirty_max: ((block_count as f64 * dirty_ratio) as usize).max(1),
            area_offset,
            area_pages,
            durable_lsn: 0,
            last_write_back_lsn: 0,
            read_errors: Vec::new(),
            taken: Vec::new(),
            frozen_count: 0,
            stats: IcacheStats::default(),
        }
    }

    /// Blocks, each caching one metadata page.
    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }

    /// Counters.
    pub fn stats(&self) -> IcacheStats {
        self.stats
    }

    /// Blocks currently dirty.
    pub fn dirty_count(&self) -> usize {
        self.dirty_count
    }

    /// Blocks that are neither dirty nor being written (free or ready).
    pub fn clean_blocks(&self) -> usize {
        self.blocks.len() - self.dirty_count - self.writing_count
    }

    /// The state of the block caching metadata `page`, or `None` if not cached.
    pub fn page_state(&self, page: u64) -> Option<BlockState> {
        self.index.get(&page).map(|&b| self.blocks[b as usize].state)
    }

    /// Records that every WAL record up to `lsn` is durable.
    pub fn set_durable_lsn(&mut self, lsn: u64) {
        assert!(
            lsn >= self.durable_lsn,
            "durable lsn went back from {} to {lsn}",
            self.durable_lsn
        );
        self.durable_lsn = lsn;
    }

    /// The slot image of inode slot `slot`.
    pub fn read_slot<D: Device>(
        &mut self,
        io: &mut DevIo<D>,
        slot: u64,
    ) -> Result<[u8; INODE_SLOT_SIZE], StoreError> {
        let b = self.load(io, slot / INODES_PER_BLOCK)?;
        let at = (slot % INODES_PER_BLOCK) as usize * INODE_SLOT_SIZE;
        let data = self.blocks[b as usize].data.as_ref().expect("loaded block has data");
        Ok(data[at..at + INODE_SLOT_SIZE].try_into().expect("slot size"))
    }

    /// The bytes of slot `slot` when its page is in memory and free to read
    /// (not being read or written back), marked most recently used: a hit
    /// without a copy of the slot; `None` otherwise ([`read_slot`](Self::read_slot)
    /// loads it).
    pub fn resident_slot(&mut self, slot: u64) -> Option<&[u8]> {
        let b = *self.index.get(&(slot / INODES_PER_BLOCK))?;
        if matches!(self.blocks[b as usize].state, BlockState::Writing | BlockState::Reading) {
            return None;
        }
        self.stats.hits += 1;
        self.touch(b);
        let at = (slot % INODES_PER_BLOCK) as usize * INODE_SLOT_SIZE;
        let data = self.blocks[b as usize].data.as_ref().expect("a ready block has data");
        Some(&data[at..at + INODE_SLOT_SIZE])
    }

    /// Marks the page of slot `slot`, if resident, most recently used: a
    /// caller about to read other pages keeps the ones it needs from being
    /// evicted for them.
    pub fn touch_slot(&mut self, slot: u64) {
        if let Some(&b) = self.index.get(&(slot / INODES_PER_BLOCK)) {
            if self.blocks[b as usize].state != BlockState::Reading {
                self.touch(b);
            }
        }
    }

    /// Whether the page of slot `slot` is in memory and free to use: not
    /// being read, and not being written back (the device holds its buffer
    /// then, and a load of it waits for the write to land, as
    /// [`resident_slot`](Self::resident_slot) says).
    pub fn resident(&self, slot: u64) -> bool {
        self.index.get(&(slot / INODES_PER_BLOCK)).is_some_and(|&b| {
            !matches!(self.blocks[b as usize].state, BlockState::Reading | BlockState::Writing)
        })
    }

    /// Starts the write-back of the page of `slot`, dirty and durable (tests).
    #[cfg(test)]
    pub(crate) fn start_write_back_of<D: Device>(&mut self, io: &mut DevIo<D>, slot: u64) {
        let b = self.index[&(slot / INODES_PER_BLOCK)];
        assert!(self.writable(b), "the page of slot {slot} is not dirty and durable");
        self.start_write(io, b);
    }

    /// Background reads in flight at most: a quarter of the blocks. Pages
    /// read for requests that stopped are evicted by later reads before
    /// those requests run again when more are read at once than the Icache
    /// keeps (a small Icache under many such requests: each then stopped
    /// four times and read its page waiting).
    pub fn read_cap(&self) -> u64 {
        (self.blocks.len() as u64 / 4).max(1)
    }

    /// Starts reading the page of slot `slot` in the background, unless it is
    /// resident, already being read, or its last such read failed
    /// ([`PageRead`]). The caller tries again once a background read or
    /// write-back finished (`background_reads_done`, `writebacks_done`),
    /// unless it must load the page itself (blocking): the read failed
    /// before (then the load reports the error), or no block is free and
    /// none is being written.
    pub fn start_read<D: Device>(&mut self, io: &mut DevIo<D>, slot: u64) -> PageRead {
        let page = slot / INODES_PER_BLOCK;
        assert!(page < self.area_pages, "metadata page {page} outside {}", self.area_pages);
        if let Some(&b) = self.index.get(&page) {
            return match self.blocks[b as usize].state {
                BlockState::Reading | BlockState::Writing => PageRead::InFlight,
                _ => PageRead::Load,
            };
        }
        if let Some(i) = self.read_errors.iter().position(|&p| p == page) {
            self.read_errors.swap_remove(i);
            return PageRead::Load;
        }
        let st = &self.stats;
        if st.background_reads - st.background_reads_done >= self.read_cap() {
            self.stats.read_room_stops += 1;
            return PageRead::NoRoom;
        }
        let Some(b) = self.free_block_now() else {
            return if self.writing_count > 0 { PageRead::InFlight } else { PageRead::Load };
        };
        let req = self.read_request(b, page);
        self.index.insert(page, b);
        io.submit_async(req, u64::from(b) | READ_TAG);
        self.stats.background_reads += 1;
        PageRead::Started
    }

    /// Collects finished background reads and write-backs without waiting.
    pub fn poll<D: Device>(&mut self, io: &mut DevIo<D>) -> Result<(), StoreError> {
        self.reap(io, io_take_async)
    }

    /// Puts free block `b` in the reading state for metadata `page`; returns
    /// the read into its buffer.
    fn read_request(&mut self, b: u32, page: u64) -> IoRequest {
        let block = &mut self.blocks[b as usize];
        block.state = BlockState::Reading;
        block.page = page;
        block.dirty_lsn = 0;
        let buf = block.data.take().unwrap_or_else(|| AlignedBuf::zeroed(SECTOR_SIZE));
        IoRequest {
            tag: 0,
            kind: IoKind::Read,
            offset: self.area_offset + page * SECTOR_SIZE as u64,
            buf,
        }
    }

    /// A free block without waiting: a free one, or the least recently used
    /// ready block evicted.
    fn free_block_now(&mut self) -> Option<u32> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        let mut b = self.lru_head;
        while b != NIL && self.blocks[b as usize].state != BlockState::Ready {
            b = self.blocks[b as usize].next;
        }
        if b == NIL {
            return None;
        }
        self.stats.evictions += 1;
        self.release(b);
        self.free.pop()
    }

    /// Whether [`load_blank`](Self::load_blank) of `slot` would wait for the
    /// device: its page is being read or written back, or it is not in
    /// memory and no block is free or ready to evict until a write-back in
    /// flight lands. (With none in flight it must write one back and wait:
    /// that is not a wait a caller can stop for.)
    pub fn blank_busy(&self, slot: u64) -> bool {
        match self.index.get(&(slot / INODES_PER_BLOCK)) {
            Some(&b) => {
                matches!(self.blocks[b as usize].state, BlockState::Reading | BlockState::Writing)
            }
            None => self.free.is_empty() && self.writing_count > 0 && !self.has_ready_block(),
        }
    }

    /// Whether some block is ready to be evicted without a write.
    fn has_ready_block(&self) -> bool {
        let mut b = self.lru_head;
        while b != NIL {
            if self.blocks[b as usize].state == BlockState::Ready {
                return true;
            }
            b = self.blocks[b as usize].next;
        }
        false
    }

    /// Makes the page of slot `slot` resident without reading it when it is
    /// not: the caller knows every other slot of the page is free, so what
    /// the device holds there does not matter, and the block starts as zeros
    /// (a free slot's image). A fresh page of inodes costs no device read.
    pub fn load_blank(&mut self, io: &mut DevIo<impl Device>, slot: u64) -> Result<(), StoreError> {
        let page = slot / INODES_PER_BLOCK;
        if self.index.contains_key(&page) {
            return self.load(io, page).map(|_| ());
        }
        let b = self.take_block(io)?;
        let block = &mut self.blocks[b as usize];
        let mut buf = block.data.take().unwrap_or_else(|| AlignedBuf::zeroed(SECTOR_SIZE));
        buf.fill(0);
        block.data = Some(buf);
        block.state = BlockState::Ready;
        block.page = page;
        block.dirty_lsn = 0;
        self.index.insert(page, b);
        self.push_lru(b);
        self.stats.blank_loads += 1;
        Ok(())
    }

    /// Replaces slot `slot` with `image`, changed by WAL record `lsn`.
    pub fn write_slot<D: Device>(
        &mut self,
        io: &mut DevIo<D>,
        slot: u64,
        image: &[u8; INODE_SLOT_SIZE],
        lsn: u64,
    ) -> Result<(), StoreError> {
        let b = self.load(io, slot / INODES_PER_BLOCK)?;
        let block = &mut self.blocks[b as usize];
        if block.frozen {
            // The checkpoint's copy, as of its snapshot, before this change.
            block.frozen = false;
            self.frozen_count -= 1;
            let data = block.data.as_ref().expect("a frozen block is dirty");
            self.taken.push((b, AlignedBuf::from_slice(data)));
        }
        let block = &mut self.blocks[b as usize];
        let at = (slot % INODES_PER_BLOCK) as usize * INODE_SLOT_SIZE;
        block.data.as_mut().expect("loaded block has data")[at..at + INODE_SLOT_SIZE]
            .copy_from_slice(image);
        block.dirty_lsn = block.dirty_lsn.max(lsn);
        if block.state == BlockState::Ready {
            block.state = BlockState::Dirty;
            block.first_dirty_lsn = lsn;
            self.dirty_count += 1;
        }
        assert_eq!(block.state, BlockState::Dirty);
        Ok(())
    }

    /// Starts write-back of least recently used dirty blocks while over the dirty
    /// cap, and collects finished write-backs. Never blocks on the device.
    pub fn write_back_over_cap<D: Device>(&mut self, io: &mut DevIo<D>) -> Result<(), StoreError> {
        self.reap(io, io_take_async)?;
        if self.dirty_count <= self.dirty_max || self.durable_lsn == self.last_write_back_lsn {
            return Ok(()); // Nothing new became eligible since the last walk.
        }
        self.last_write_back_lsn = self.durable_lsn;
        let mut b = self.lru_head;
        while self.dirty_count > self.dirty_max && b != NIL {
            let next = self.blocks[b as usize].next;
            if self.writable(b) {
                self.start_write(io, b);
            }
            b = next;
        }
        Ok(())
    }

    /// Writes back every dirty block and waits (checkpoint). All its records must
    /// be durable first.
    pub fn flush_all<D: Device>(&mut self, io: &mut DevIo<D>) -> Result<(), StoreError> {
        self.reap(io, io_wait_async)?;
        for b in 0..self.blocks.len() as u32 {
            if self.blocks[b as usize].state == BlockState::Dirty {
                assert!(
                    self.blocks[b as usize].dirty_lsn <= self.durable_lsn,
                    "flush of a block whose WAL records are not durable"
                );
                self.start_write(io, b);
            }
        }
        self.reap(io, io_wait_async)
    }

    /// The blocks holding changes the device lacks (dirty or being written):
    /// what a checkpoint taken now must see written ([`write_back_older`]).
    ///
    /// [`write_back_older`]: Self::write_back_older
    pub fn unwritten_blocks(&self) -> Vec<u32> {
        (0..self.blocks.len() as u32)
            .filter(|&b| {
                matches!(self.blocks[b as usize].state, BlockState::Dirty | BlockState::Writing)
            })
            .collect()
    }

    /// Moves the write-back of `blocks` (from [`unwritten_blocks`]) along
    /// without waiting: collects finished write-backs, forgets the blocks whose
    /// changes older than `lsn` reached the device, and starts the write of
    /// those whose records are durable, at most `starts` of them, counted down (each
    /// submission is a system call, and in a virtual machine an exit to the
    /// host: 10-25 µs). Returns what is left to wait for.
    ///
    /// [`unwritten_blocks`]: Self::unwritten_blocks
    pub fn write_back_older<D: Device>(
        &mut self,
        io: &mut DevIo<D>,
        blocks: &mut Vec<u32>,
        lsn: u64,
        starts: &mut usize,
    ) -> Result<WriteBack, StoreError> {
        self.reap(io, io_take_async)?;
        blocks.retain(|&b| {
            let block = &self.blocks[b as usize];
            matches!(block.state, BlockState::Dirty | BlockState::Writing)
                && block.first_dirty_lsn < lsn
        });
        let mut needs_commit = false;
        for &b in blocks.iter() {
            let block = &self.blocks[b as usize];
            if block.state != BlockState::Dirty || block.copy_lsn.is_some() {
                continue;
            }
            if block.dirty_lsn > self.durable_lsn {
                needs_commit = true;
            } else if *starts > 0 {
                *starts -= 1;
                self.start_write(io, b);
            }
        }
        Ok(if blocks.is_empty() {
            WriteBack::Done
        } else if needs_commit {
            WriteBack::NeedsCommit
        } else {
            WriteBack::Writing
        })
    }

    /// Marks the dirty blocks among `blocks` as a checkpoint's snapshot needs
    /// them, copy-on-write: the first change to one after this takes a copy
    /// of it first, and [`take_copies`](Self::take_copies) copies the others
    /// when the checkpoint writes them. Nothing is copied now (copying every
    /// dirty block at the snapshot stopped the worker 1-1.6 ms at a million
    /// files).
    pub fn freeze(&mut self, blocks: &[u32]) {
        self.thaw();
        for &b in blocks {
            let block = &mut self.blocks[b as usize];
            if block.state == BlockState::Dirty {
                block.frozen = true;
                self.frozen_count += 1;
            }
        }
    }

    /// Drops what [`freeze`](Self::freeze) marked and the copies not written
    /// (the checkpoint ended).
    pub fn thaw(&mut self) {
        if self.frozen_count > 0 {
            for block in &mut self.blocks {
                block.frozen = false;
            }
            self.frozen_count = 0;
        }
        self.taken.clear();
    }

    /// Whether copies of frozen blocks are left to write.
    pub fn copies_left(&self) -> bool {
        self.frozen_count > 0 || !self.taken.is_empty()
    }

    /// Up to `max` copies of frozen blocks as of the snapshot, to write with
    /// [`write_copy`](Self::write_copy) once the records up to it are
    /// durable: those taken before a change first, then copies of blocks
    /// among `blocks` not changed since (their content is the snapshot's).
    pub fn take_copies(&mut self, blocks: &[u32], max: usize) -> Vec<(u32, AlignedBuf)> {
        let n = self.taken.len().min(max);
        let mut out: Vec<(u32, AlignedBuf)> = self.taken.drain(..n).collect();
        for &b in blocks {
            if out.len() == max || self.frozen_count == 0 {
                break;
            }
            let block = &mut self.blocks[b as usize];
            if block.frozen {
                block.frozen = false;
                self.frozen_count -= 1;
                let data = block.data.as_ref().expect("a frozen block is dirty");
                out.push((b, AlignedBuf::from_slice(data)));
            }
        }
        out
    }

    /// Writes `copy` of block `b`, taken when every change up to `lsn` was in
    /// it (and no later one), if the block still lacks those changes on the
    /// device: it is dirty with a change at or below `lsn`, not being written,
    /// and every record up to `lsn` is durable. Then the block is not written
    /// back until the copy landed, and after that it counts as holding on the
    /// device every change up to `lsn`. Returns whether it was submitted.
    pub fn write_copy<D: Device>(
        &mut self,
        io: &mut DevIo<D>,
        b: u32,
        copy: AlignedBuf,
        lsn: u64,
    ) -> bool {
        let block = &mut self.blocks[b as usize];
        if block.state != BlockState::Dirty
            || block.first_dirty_lsn > lsn
            || block.copy_lsn.is_some()
            || lsn > self.durable_lsn
        {
            return false;
        }
        block.copy_lsn = Some(lsn);
        let req = IoRequest {
            tag: 0,
            kind: IoKind::Write,
            offset: self.area_offset + block.page * SECTOR_SIZE as u64,
            buf: copy,
        };
        io.submit_async(req, u64::from(b) | COPY_TAG);
        self.stats.writebacks += 1;
        true
    }

    /// Whether block `b` may be written back now: dirty, every record that
    /// changed it durable, and no copy of it being written.
    fn writable(&self, b: u32) -> bool {
        let block = &self.blocks[b as usize];
        block.state == BlockState::Dirty
            && block.dirty_lsn <= self.durable_lsn
            && block.copy_lsn.is_none()
    }

    /// Makes metadata `page` resident and most recently used; returns its block.
    fn load<D: Device>(&mut self, io: &mut DevIo<D>, page: u64) -> Result<u32, StoreError> {
        assert!(page < self.area_pages, "metadata page {page} outside {}", self.area_pages);
        if let Some(&b) = self.index.get(&page) {
            if matches!(self.blocks[b as usize].state, BlockState::Writing | BlockState::Reading) {
                // The device holds the buffer: wait for the write-back or the
                // background read to land (a failed read frees the block).
                self.reap(io, io_wait_async)?;
            }
            if let Some(&b) = self.index.get(&page) {
                self.stats.hits += 1;
                self.touch(b);
                return Ok(b);
            }
        }
        self.stats.misses += 1;
        let b = self.take_block(io)?;
        let req = self.read_request(b, page);
        let done = io.run(vec![req]).pop().expect("one completion");
        let block = &mut self.blocks[b as usize];
        block.data = Some(done.buf);
        if let Err(e) = done.result {
            block.state = BlockState::Free;
            self.free.push(b);
            return Err(e.into());
        }
        block.state = BlockState::Ready;
        self.index.insert(page, b);
        self.push_lru(b);
        Ok(b)
    }

    /// A free block, evicting the least recently used ready block if needed.
    fn take_block<D: Device>(&mut self, io: &mut DevIo<D>) -> Result<u32, StoreError> {
        for _attempt in 0..self.blocks.len() + 2 {
            if let Some(b) = self.free.pop() {
                return Ok(b);
            }
            let mut b = self.lru_head;
            while b != NIL && self.blocks[b as usize].state != BlockState::Ready {
                b = self.blocks[b as usize].next;
            }
            if b != NIL {
                self.stats.evictions += 1;
                self.release(b);
                continue;
            }
            // Every block is dirty or writing: write back the oldest durable dirty
            // one before reuse, and wait for it.
            let mut d = self.lru_head;
            while d != NIL && !self.writable(d) {
                d = self.blocks[d as usize].next;
            }
            if d != NIL {
                self.start_write(io, d);
            }
            assert!(
                d != NIL
                    || self.blocks.iter().any(|x| {
                        matches!(x.state, BlockState::Writing | BlockState::Reading)
                            || x.copy_lsn.is_some()
                    }),
                "Icache full of dirty blocks whose WAL records are not durable: commit first"
            );
            self.reap(io, io_wait_async)?;
        }
        unreachable!("Icache eviction made no progress")
    }

    fn start_write<D: Device>(&mut self, io: &mut DevIo<D>, b: u32) {
        let block = &mut self.blocks[b as usize];
        assert_eq!(block.state, BlockState::Dirty);
        assert!(block.copy_lsn.is_none(), "a block written while a copy of it is");
        if block.frozen {
            // Its whole content goes to the device: the snapshot's changes
            // with it, no copy needed.
            block.frozen = false;
            self.frozen_count -= 1;
        }
        block.state = BlockState::Writing;
        self.dirty_count -= 1;
        self.writing_count += 1;
        let buf = block.data.take().expect("dirty block has data");
        let req = IoRequest {
            tag: 0,
            kind: IoKind::Write,
            offset: self.area_offset + block.page * SECTOR_SIZE as u64,
            buf,
        };
        io.submit_async(req, b as u64);
        self.stats.writebacks += 1;
    }

    /// Applies finished write-backs collected by `collect`.
    fn reap<D: Device>(
        &mut self,
        io: &mut DevIo<D>,
        collect: fn(&mut DevIo<D>) -> Vec<crate::device::IoCompletion>,
    ) -> Result<(), StoreError> {
        let mut first_err = None;
        for c in collect(io) {
            let b = c.tag as u32;
            let block = &mut self.blocks[b as usize];
            if c.tag & READ_TAG != 0 {
                assert_eq!(block.state, BlockState::Reading, "read completion for another state");
                block.data = Some(c.buf);
                self.stats.background_reads_done += 1;
                match c.result {
                    Ok(()) => {
                        block.state = BlockState::Ready;
                        self.push_lru(b);
                    }
                    Err(_) => {
                        // The next load of the page reads it blocking and
                        // gives the error to its operation.
                        block.state = BlockState::Free;
                        let page = block.page;
                        self.index.remove(&page);
                        self.free.push(b);
                        if self.read_errors.len() < READ_ERRORS_MAX {
                            self.read_errors.push(page);
                        }
                    }
                }
                continue;
            }
            if c.tag & COPY_TAG != 0 {
                let lsn = block.copy_lsn.take().expect("a copy in flight");
                match c.result {
                    // The device has every change up to `lsn`: the block's
                    // later ones are what it still lacks.
                    Ok(()) => block.first_dirty_lsn = block.first_dirty_lsn.max(lsn + 1),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
                continue;
            }
            assert_eq!(block.state, BlockState::Writing, "write-back completion for idle block");
            block.data = Some(c.buf);
            self.writing_count -= 1;
            self.stats.writebacks_done += 1;
            match c.result {
                Ok(()) => block.state = BlockState::Ready,
                Err(e) => {
                    // Keep the changes: the block stays dirty and is retried later;
                    // the WAL still holds every change.
                    block.state = BlockState::Dirty;
                    self.dirty_count += 1;
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    fn release(&mut self, b: u32) {
        self.unlink_lru(b);
        let block = &mut self.blocks[b as usize];
        if block.state == BlockState::Dirty {
            self.dirty_count -= 1;
        }
        if block.frozen {
            block.frozen = false;
            self.frozen_count -= 1;
        }
        block.state = BlockState::Free;
        self.index.remove(&block.page);
        self.free.push(b);
    }

    fn touch(&mut self, b: u32) {
        self.unlink_lru(b);
        self.push_lru(b);
    }

    fn push_lru(&mut self, b: u32) {
        self.blocks[b as usize].prev = self.lru_tail;
        self.blocks[b as usize].next = NIL;
        if self.lru_tail != NIL {
            self.blocks[self.lru_tail as usize].next = b;
        } else {
            self.lru_head = b;
        }
        self.lru_tail = b;
    }

    fn unlink_lru(&mut self, b: u32) {
        let (prev, next) = (self.blocks[b as usize].prev, self.blocks[b as usize].next);
        if prev != NIL {
            self.blocks[prev as usize].next = next;
        } else if self.lru_head == b {
            self.lru_head = next;
        }
        if next != NIL {
            self.blocks[next as usize].prev = prev;
        } else if self.lru_tail == b {
            self.lru_tail = prev;
        }
        self.blocks[b as usize].prev = NIL;
        self.blocks[b as usize].next = NIL;
    }
}

fn io_take_async<D: Device>(io: &mut DevIo<D>) -> Vec<crate::device::IoCompletion> {
    io.take_async()
}

fn io_wait_async<D: Device>(io: &mut DevIo<D>) -> Vec<crate::device::IoCompletion> {
    io.wait_async_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    const PAGES: u64 = 64;

    fn setup(blocks: usize, ratio: f64) -> (Icache, DevIo<MemDevice>, MemDevice) {
        let dev = MemDevice::new(PAGES * SECTOR_SIZE as u64, 16);
        let handle = dev.handle();
        (Icache::new(blocks, ratio, 0, PAGES), DevIo::new(dev), handle)
    }

    fn image(byte: u8) -> [u8; INODE_SLOT_SIZE] {
        [byte; INODE_SLOT_SIZE]
    }

    #[test]
    fn free_reading_ready_dirty_writing_ready() {
        let (mut c, mut io, dev) = setup(4, 0.25);
        assert_eq!(c.page_state(0), None, "free: not cached");
        c.read_slot(&mut io, 3).unwrap();
        assert_eq!(c.page_state(0), Some(BlockState::Ready), "reading -> ready after the read");
        assert_eq!(c.stats().misses, 1);
        c.read_slot(&mut io, 5).unwrap();
        assert_eq!(c.stats().hits, 1, "same page: a hit");
        c.write_slot(&mut io, 3, &image(7), 1).unwrap();
        assert_eq!(c.page_state(0), Some(BlockState::Dirty));
        // Over the cap (1 of 4 blocks allowed) but not durable yet: stays dirty.
        c.write_slot(&mut io, INODES_PER_BLOCK, &image(8), 2).unwrap();
        c.write_back_over_cap(&mut io).unwrap();
        assert_eq!(c.page_state(0), Some(BlockState::Dirty), "WAL not durable: no write-back");
        c.set_durable_lsn(2);
        c.write_back_over_cap(&mut io).unwrap();
        assert_eq!(
            c.page_state(0),
            Some(BlockState::Writing),
            "oldest dirty block goes to writing"
        );
        assert_eq!(c.page_state(1), Some(BlockState::Dirty), "one dirty block is within the cap");
        assert_eq!(c.dirty_count(), 1);
        // Touching a writing block waits for the write to land: back to ready.
        assert_eq!(c.read_slot(&mut io, 3).unwrap(), image(7));
        assert_eq!(c.page_state(0), Some(BlockState::Ready));
        assert_eq!(&dev.peek(3 * INODE_SLOT_SIZE as u64, INODE_SLOT_SIZE)[..], &image(7)[..]);
    }

    /// A page whose write-back is in flight, and a page for which no block is
    /// free until a write-back lands, are not read waiting: `start_read`
    /// answers `true` (try again once `writebacks_done` moved) and starts
    /// nothing; after the write-back, the read starts.
    #[test]
    fn start_read_waits_for_a_write_back_in_flight_instead_of_reading() {
        let (mut c, mut io, dev) = setup(2, 0.5);
        c.write_slot(&mut io, 0, &image(1), 1).unwrap();
        c.write_slot(&mut io, INODES_PER_BLOCK, &image(2), 2).unwrap();
        c.set_durable_lsn(2);
        let misses = c.stats().misses;
        dev.hold(Some(0..SECTOR_SIZE as u64));
        c.write_back_over_cap(&mut io).unwrap();
        assert_eq!(c.page_state(0), Some(BlockState::Writing));
        assert_eq!(c.page_state(1), Some(BlockState::Dirty));
        let later = 2 * INODES_PER_BLOCK;
        assert_eq!(c.start_read(&mut io, 3), PageRead::InFlight, "its own write-back in flight");
        assert_eq!(
            c.start_read(&mut io, later),
            PageRead::InFlight,
            "no block free until the write-back lands"
        );
        assert_eq!(c.stats().background_reads, 0, "nothing read");
        assert_eq!(c.stats().writebacks_done, 0);
        dev.hold(None);
        c.poll(&mut io).unwrap();
        assert_eq!(c.stats().writebacks_done, 1);
        assert_eq!(c.page_state(0), Some(BlockState::Ready));
        assert_eq!(c.start_read(&mut io, later), PageRead::Started);
        assert_eq!(c.stats().background_reads, 1, "the read started in the freed block");
        assert_eq!(c.stats().misses, misses, "no page read waiting");
    }

    #[test]
    fn eviction_under_pressure_is_lru() {
        let (mut c, mut io, _) = setup(3, 0.5);
        for page in 0..3 {
            c.read_slot(&mut io, page * INODES_PER_BLOCK).unwrap();
        }
        c.read_slot(&mut io, 0).unwrap(); // page 0 becomes most recent
        c.read_slot(&mut io, 3 * INODES_PER_BLOCK).unwrap();
        assert_eq!(c.page_state(1), None, "least recently used page evicted");
        assert_eq!(c.page_state(0), Some(BlockState::Ready));
        assert_eq!(c.stats().evictions, 1);
    }

    #[test]
    fn dirty_block_is_written_back_before_reuse() {
        let (mut c, mut io, dev) = setup(2, 1.0);
        c.write_slot(&mut io, 0, &image(1), 1).unwrap();
        c.write_slot(&mut io, INODES_PER_BLOCK, &image(2), 2).unwrap();
        c.set_durable_lsn(2);
        assert_eq!(c.stats().writebacks, 0);
        // Both blocks dirty, none ready: loading a third page must write one back.
        c.read_slot(&mut io, 2 * INODES_PER_BLOCK).unwrap();
        assert_eq!(c.stats().writebacks, 1);
        assert_eq!(
            &dev.peek(0, INODE_SLOT_SIZE)[..],
            &image(1)[..],
            "the evicted dirty block reached the device"
        );
        // Its contents come back from the device after eviction.
        assert_eq!(c.read_slot(&mut io, 0).unwrap(), image(1));
    }

    #[test]
    fn failed_write_back_keeps_the_block_dirty() {
        use crate::device::{Fault, IoKind};
        let (mut c, mut io, dev) = setup(4, 0.25);
        c.write_slot(&mut io, 0, &image(1), 1).unwrap();
        c.write_slot(&mut io, INODES_PER_BLOCK, &image(2), 1).unwrap();
        c.set_durable_lsn(1);
        dev.inject(Fault::next(IoKind::Write, 1));
        c.write_back_over_cap(&mut io).unwrap();
        assert!(c.flush_all(&mut io).is_err(), "the injected error is reported");
        assert_eq!(c.page_state(0), Some(BlockState::Dirty), "changes kept for a retry");
        c.flush_all(&mut io).unwrap();
        assert_eq!(c.dirty_count(), 0);
        assert_eq!(&dev.peek(0, INODE_SLOT_SIZE)[..], &image(1)[..]);
    }

    /// A checkpoint's snapshot freezes the dirty blocks instead of copying
    /// them: the first change to one takes its copy first (once), the others
    /// are copied when the checkpoint writes them, and a block written back
    /// whole needs no copy.
    #[test]
    fn a_frozen_block_is_copied_before_its_first_change_and_only_once() {
        let (mut c, mut io, _dev) = setup(4, 1.0);
        c.write_slot(&mut io, 0, &image(1), 1).unwrap();
        c.write_slot(&mut io, INODES_PER_BLOCK, &image(2), 2).unwrap();
        let blocks = c.unwritten_blocks();
        assert_eq!(blocks.len(), 2);
        c.freeze(&blocks);
        assert!(c.copies_left());
        c.write_slot(&mut io, 0, &image(3), 3).unwrap();
        c.write_slot(&mut io, 1, &image(4), 4).unwrap();
        assert_eq!(c.taken.len(), 1, "one copy, at the first change");
        let copies = c.take_copies(&blocks, 8);
        assert!(!c.copies_left());
        assert_eq!(copies.len(), 2);
        let slot = |buf: &AlignedBuf, i: usize| {
            buf[i * INODE_SLOT_SIZE..(i + 1) * INODE_SLOT_SIZE].to_vec()
        };
        let of_page =
            |p: u64| &copies.iter().find(|(b, _)| c.blocks[*b as usize].page == p).unwrap().1;
        assert_eq!(slot(of_page(0), 0), image(1).to_vec(), "page 0 as of the snapshot");
        assert_eq!(slot(of_page(0), 1), vec![0u8; INODE_SLOT_SIZE], "without the later change");
        assert_eq!(slot(of_page(1), 0), image(2).to_vec(), "page 1, unchanged since, copied now");
        // Frozen again, then written back whole: no copy left to write.
        c.freeze(&blocks);
        assert!(c.copies_left());
        c.set_durable_lsn(4);
        c.flush_all(&mut io).unwrap();
        assert!(!c.copies_left(), "the write-backs carried the snapshot's changes");
        assert!(c.take_copies(&blocks, 8).is_empty());
        c.thaw();
        assert!(!c.copies_left());
    }
}
