//! File data on a shard.
//!
//! `block` and `file` layouts: file block `b` maps to a run of pages, in the inode
//! for block 0, in the block table otherwise. A write never overwrites pages a
//! durable map points to: it writes a new run (merging the old block when the
//! write covers it only partly) and frees the old run once the change is durable,
//! so a crash leaves every block either old or new, never torn.
//!
//! `io` layout: every write gets its own run and an extent keyed by file offset;
//! nothing is read back and merged. Overlapped parts of older extents are trimmed.

use pfs_core::wire::{read_segments, ALL_BLOCKS};
use pfs_core::{BlockIndex, FileLayout, FileType, FsError, FsResult, InodeId, TimeNs};

use super::dataio::{device_reads, ReadShape, ReadStart, BATCH_BYTES};
use super::{DeferredOn, Shard, PAGE_SIZE};
use crate::device::{Device, IoKind, IoRequest};
use crate::inode::{Inode, Run};
use crate::wal::record::Extent;
use crate::wal::Change;

/// Largest file size a shard accepts (256 TiB): past it, writes and truncates
/// fail with `EFBIG`.
pub const MAX_FILE_SIZE: u64 = pfs_core::MAX_FILE_SIZE;
/// Largest single write or read.
pub const MAX_IO_BYTES: usize = 16 << 20;

/// The least a device read of read-ahead reads when the pages lie together
/// (the reader's transfer when larger): a registered device buffer's size.
/// 256 KiB pieces ran io-easy reads 6-8% slower (docs/benchmarks.md,
/// twenty-sixth session).
const AHEAD_READ_MIN: u64 = 1 << 20;

/// Part of a read on one run: `(run, first page in run, pages, where in the
/// output, skip bytes in the first page, bytes)`.
pub(super) type Piece = (Run, u64, u64, usize, usize, usize);

impl<D: Device> Shard<D> {
    /// Writes `data` at `offset` of file `ino`; returns the bytes written. The data
    /// is durable after the next `commit` (fsync / close).
    pub fn write(&mut self, ino: InodeId, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.write_timed(ino, offset, data).map(|_| data.len())
    }

    /// [`Shard::write`], returning the inode's `ctime` before and after it: the
    /// version change a client follows to keep its cached pages
    /// (docs/posix.md, "Kernel page cache").
    pub fn write_timed(
        &mut self,
        ino: InodeId,
        offset: u64,
        data: &[u8],
    ) -> FsResult<(TimeNs, TimeNs)> {
        let inode = self.inode(ino)?;
        match inode.kind {
            FileType::Regular => {}
            FileType::Directory => return Err(FsError::IsDir),
            _ => return Err(FsError::Invalid(format!("write to a {:?}", inode.kind))),
        }
        self.data_write_room()?;
        self.settle(ino)?;
        if inode.file_layout == FileLayout::Io {
            self.pretrim(ino, offset, data.len() as u64)?;
        }
        // Reloaded: settling and pre-trimming may have changed its page count.
        let mut inode = self.inode(ino)?;
        let before = inode.ctime_ns;
        self.begin()?;
        self.write_in_op(&mut inode, offset, data)?;
        self.finish()?;
        Ok((before, inode.ctime_ns))
    }

    /// Writes `data` at `offset` of file `ino` whose inode lives on another shard
    /// (a block-layout block `b > 0`, an io-layout block). Size and times are the
    /// inode owner's business; this shard keeps the data only.
    pub fn write_data(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        offset: u64,
        data: &[u8],
    ) -> FsResult<usize> {
        if self.has_inode(ino) {
            return self.write(ino, offset, data);
        }
        self.data_write_room()?;
        self.settle(ino)?;
        if layout == FileLayout::Io {
            self.pretrim(ino, offset, data.len() as u64)?;
        }
        self.begin()?;
        let mut inode = Self::homed_elsewhere(ino, layout, u64::MAX);
        let result = if layout == FileLayout::Io {
            self.write_io(&mut inode, offset, data)
        } else {
            self.write_blocks(&mut inode, offset, data)
        };
        result?;
        self.finish()?;
        Ok(data.len())
    }

    /// Reads `len` bytes at `offset` of a file whose inode lives elsewhere; holes
    /// read as zeros, and the caller clamps to the file size it knows.
    pub fn read_data(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        offset: u64,
        len: usize,
    ) -> FsResult<Vec<u8>> {
        self.read_data_blocks(ino, layout, offset, len, ALL_BLOCKS)
    }

    /// [`read_data`](Self::read_data) of the blocks of the range that `blocks`
    /// picks, one after the other (`pfs_core::wire::read_segments`).
    pub fn read_data_blocks(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        offset: u64,
        len: usize,
        blocks: u32,
    ) -> FsResult<Vec<u8>> {
        done(self.read_data_start(ino, layout, offset, len, blocks, ReadShape::default()))
    }

    /// [`read_data`](Self::read_data) of the blocks of the range that `blocks`
    /// picks (`pfs_core::wire::read_segments`: their bytes, one after the
    /// other) into an output of `shape` (its `pad` is at least their length),
    /// answered later when the device must be read and `shape.background`
    /// ([`ReadStart::Pending`]; dataio.rs).
    pub fn read_data_start(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        offset: u64,
        len: usize,
        blocks: u32,
        shape: ReadShape,
    ) -> FsResult<ReadStart> {
        // Exactly the picked bytes, even from the home (no short read there).
        let segments = read_segments(offset, len as u64, blocks);
        let picked = segments.iter().map(|s| s.1 as usize).sum::<usize>();
        let shape = ReadShape { pad: shape.pad.max(picked), ..shape };
        if self.has_inode(ino) {
            return self.read_start(ino, offset, len, blocks, shape);
        }
        let end = offset.checked_add(len as u64).ok_or(FsError::FileTooLarge)?;
        self.settle(ino)?;
        let inode = Self::homed_elsewhere(ino, layout, end);
        let data = self.read_inode(&inode, &segments, shape)?;
        // The file's size is known at its home only: read ahead as far as the
        // window may reach; holes past the end cost no device read.
        let ahead = end.saturating_add(self.ahead_cap());
        self.read_ahead(&Self::homed_elsewhere(ino, layout, ahead), offset, len, picked);
        Ok(data)
    }

    /// After a read of `len` bytes at `offset` (`picked` of them on this
    /// shard, the size of its device reads): when it continues the file's last
    /// read, keeps `read_ahead_factor` times the stretch it stands for read
    /// ahead of it (up to the end of `inode`, at most a quarter of the read
    /// cache's size; [`Readers::ahead`](super::cache::Readers::ahead)), read
    /// in the background ([`prefetch`](Self::prefetch)).
    fn read_ahead(&mut self, inode: &Inode, offset: u64, len: usize, picked: usize) {
        let factor = self.opts.read_ahead_factor;
        // Half the room, so a window fits beside what is left of the last.
        let most = self.ahead_cap() / 2;
        let Some((from, to)) = self.readers.ahead(inode.ino, offset, len as u64, factor, most)
        else {
            return;
        };
        let to = to.min(inode.size).min(from.saturating_add(MAX_IO_BYTES as u64));
        if from < to {
            // In device reads of what this read took here (at least AHEAD_READ_MIN),
            // so the next read waits for one of them only.
            let max_pages = (picked as u64).max(AHEAD_READ_MIN).div_ceil(PAGE_SIZE);
            let pieces = self.data_pieces(inode, from, (to - from) as usize);
            for (page, pages, _) in device_reads(&pieces, u64::from(self.geo.block_size), max_pages)
            {
                self.prefetch(page, pages);
            }
        }
    }

    /// Frees the data at or past `size` of a file whose inode lives elsewhere (its
    /// truncate or unlink); `old_size` is the size before, which bounds the blocks
    /// to look at.
    pub fn truncate_data(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        size: u64,
        old_size: u64,
    ) -> FsResult<()> {
        if self.has_inode(ino) {
            return Err(FsError::Invalid(format!("inode {ino} lives here: use setattr")));
        }
        self.settle(ino)?;
        self.begin()?;
        self.free_elsewhere(ino, layout, size, old_size)?;
        self.finish()
    }

    /// At the home of regular file `ino`: other shards may get its data below
    /// `end` (a client is about to write there). Returns the reserved end,
    /// which never shrinks, so a truncate or removal frees that much elsewhere.
    pub fn reserve_data(&mut self, ino: InodeId, end: u64) -> FsResult<u64> {
        let mut inode = self.inode(ino)?;
        if inode.kind != FileType::Regular {
            return Err(FsError::Invalid(format!("reserve data of a {:?}", inode.kind)));
        }
        if end > MAX_FILE_SIZE {
            return Err(FsError::FileTooLarge);
        }
        if end > inode.data_end {
            self.begin()?;
            inode.data_end = end;
            self.put_inode(&inode)?;
            self.finish()?;
        }
        Ok(inode.data_end)
    }

    /// A stand-in inode for data whose inode lives on another shard.
    pub(super) fn homed_elsewhere(ino: InodeId, file_layout: FileLayout, size: u64) -> Inode {
        Inode {
            ino,
            parent: InodeId(0),
            kind: FileType::Regular,
            perm: 0,
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            rdev: 0,
            atime_ns: 0,
            mtime_ns: 0,
            ctime_ns: 0,
            dir_layout: pfs_core::DirLayout::default(),
            file_layout,
            first_block: None,
            // Never stored: only keeps the page accounting of real inodes strict.
            pages: u64::MAX / 2,
            data_end: size,
        }
    }

    /// Makes file `ino` durable (commits the shard's pending group).
    pub fn fsync(&mut self, ino: InodeId) -> FsResult<()> {
        self.inode(ino)?;
        self.commit()
    }

    /// Reads up to `len` bytes at `offset` of file `ino` (short at end of file).
    pub fn read(&mut self, ino: InodeId, offset: u64, len: usize) -> FsResult<Vec<u8>> {
        self.read_blocks(ino, offset, len, ALL_BLOCKS)
    }

    /// [`read`](Self::read) of the blocks of the range that `blocks` picks,
    /// one after the other (`pfs_core::wire::read_segments`), short at the end
    /// of the file.
    pub fn read_blocks(
        &mut self,
        ino: InodeId,
        offset: u64,
        len: usize,
        blocks: u32,
    ) -> FsResult<Vec<u8>> {
        done(self.read_start(ino, offset, len, blocks, ReadShape::default()))
    }

    /// [`read`](Self::read) of the blocks of the range that `blocks` picks
    /// (`pfs_core::wire::read_segments`; short at the end of the file: the
    /// bytes of the picked blocks below it, one after the other) into an
    /// output of `shape` (room before the bytes, zeros after them up to a
    /// length), answered later when the device must be read and
    /// `shape.background` ([`ReadStart::Pending`]; dataio.rs).
    pub fn read_start(
        &mut self,
        ino: InodeId,
        offset: u64,
        len: usize,
        blocks: u32,
        shape: ReadShape,
    ) -> FsResult<ReadStart> {
        if len > MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("read of {len} bytes: at most {MAX_IO_BYTES}")));
        }
        let inode = self.inode(ino)?;
        if inode.kind == FileType::Directory {
            return Err(FsError::IsDir);
        }
        if offset >= inode.size {
            return Ok(ReadStart::Done(vec![0; shape.prefix + shape.pad]));
        }
        let len = len.min((inode.size - offset) as usize);
        self.settle(ino)?;
        let segments = read_segments(offset, len as u64, blocks);
        let data = self.read_inode(&inode, &segments, shape)?;
        self.read_ahead(&inode, offset, len, segments.iter().map(|s| s.1 as usize).sum());
        Ok(data)
    }

    /// All the data of regular file `ino` when it has at most `max` bytes and
    /// memory holds every byte of it (a staged run, the read cache, a
    /// read-ahead run): for a lookup that carries a small file's data. Its
    /// first block lives with the inode, so a file of up to a block is all
    /// here. No device read and no wait: `None` for an empty or larger file,
    /// another kind, an `io`-layout file (its extents may lie elsewhere), a
    /// truncate still freeing its data, or a piece that is only on the device
    /// or being written.
    pub fn small_data_in_memory(&mut self, ino: InodeId, max: usize) -> Option<Vec<u8>> {
        let inode = self.inode(ino).ok()?;
        let small =
            inode.size > 0 && inode.size <= (max as u64).min(u64::from(self.geo.block_size));
        if inode.kind != FileType::Regular
            || !small
            || inode.file_layout == FileLayout::Io
            || self.trims.contains_key(&ino)
        {
            return None;
        }
        let len = inode.size as usize;
        let pieces = self.data_pieces(&inode, 0, len);
        let pages: Vec<(u64, u64)> =
            pieces.iter().map(|&(run, first, pages, ..)| (run.page + first, pages)).collect();
        if self.data_pages_busy(&pages) {
            return None;
        }
        // Holes (and bytes past what a block holds) read as zeros.
        let mut out = vec![0u8; len];
        for (run, first, _, at, skip, n) in pieces {
            if !self.read_data_memory(run.page + first, skip, &mut out[at..at + n]) {
                return None;
            }
        }
        Some(out)
    }

    /// Reads the byte ranges `segments` (`(offset, len)`) of `inode`'s data on
    /// this shard (holes are zeros), one after the other, into an output of
    /// `shape`: `shape.prefix` bytes before them, and zeros after them up to
    /// `shape.pad` bytes. Pieces in memory are copied at
    /// once; the others are read from the device, in the background when
    /// `shape.background` ([`ReadStart::Pending`]). What is read from the device
    /// goes to the read cache when it is a partly filled block (small files,
    /// the tail a writer appends to). Whole blocks read once are not worth the
    /// copy: caching them made streaming reads 0.8x (docs/benchmarks.md);
    /// read-ahead caches them (`prefetch`).
    fn read_inode(
        &mut self,
        inode: &Inode,
        segments: &[(u64, u64)],
        shape: ReadShape,
    ) -> FsResult<ReadStart> {
        let len = segments.iter().map(|s| s.1).sum::<u64>() as usize;
        if len > MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("read of {len} bytes: at most {MAX_IO_BYTES}")));
        }
        let mut pieces = Vec::new();
        let mut at = shape.prefix;
        for &(offset, n) in segments {
            self.data_pieces_into(inode, offset, n as usize, at, &mut pieces);
            at += n as usize;
        }
        self.split_at_ahead(&mut pieces);
        if shape.gather {
            if let Some(g) = self.gather_ahead(&pieces, shape.prefix, len.max(shape.pad)) {
                return Ok(ReadStart::Gather(g));
            }
        }
        let mut out = vec![0u8; shape.prefix + len.max(shape.pad)];
        // Pieces read ahead are copied from there, or wait for their read-ahead;
        // pieces in memory (written and not yet on the device, or in the read
        // cache) are copied from it; the rest are read from the device. The
        // wait for writes in flight comes first: it may finish a read-ahead,
        // which a piece must then copy from, not join.
        if self.data_busy() {
            let settle: Vec<(u64, u64)> = pieces
                .iter()
                .map(|&(run, first, pages, ..)| (run.page + first, pages))
                .filter(|&(page, pages)| !(shape.background && self.ahead_in_flight(page, pages)))
                .collect();
            if self.defer_misses && self.op_changes == 0 && self.data_pages_busy(&settle) {
                // Their write is in flight: run again once it finished
                // (`set_defer_misses`), instead of waiting for it.
                self.stats.reads_deferred += 1;
                self.deferred = Some(DeferredOn::Data);
                return Err(FsError::TryAgain);
            }
            self.settle_data_pages(settle)?;
        }
        let joined = self.take_ahead(&mut pieces, &mut out, shape.background);
        pieces.retain(|&(run, first, _, at, skip, n)| {
            !self.read_data_memory(run.page + first, skip, &mut out[at..at + n])
        });
        if pieces.is_empty() && joined.is_empty() {
            return Ok(ReadStart::Done(out));
        }
        if shape.background {
            return Ok(ReadStart::Pending(self.read_in_background(out, &pieces, joined)));
        }
        let reads = device_reads(&pieces, u64::from(self.geo.block_size), u64::MAX);
        let reqs = reads
            .iter()
            .map(|&(page, pages, _)| IoRequest {
                tag: 0,
                kind: IoKind::Read,
                offset: self.geo.data_offset(page),
                buf: self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize),
            })
            .collect();
        let mut err = None;
        for (c, (page, _, parts)) in self.io.run(reqs).into_iter().zip(&reads) {
            match c.result {
                Ok(()) => {
                    for part in parts {
                        part.deliver(*page, &c.buf, &mut out, &mut self.read_cache);
                    }
                }
                Err(e) => err = Some(e),
            }
            self.io.device_mut().free_buf(c.buf);
        }
        match err {
            Some(e) => Err(e.into()),
            None => Ok(ReadStart::Done(out)),
        }
    }

    /// Where the `len` bytes at `offset` of `inode` lie on this shard: `(run,
    /// first page in run, pages, where in the output, skip bytes in the first
    /// page, bytes)`; holes have none.
    pub(super) fn data_pieces(&self, inode: &Inode, offset: u64, len: usize) -> Vec<Piece> {
        let mut pieces = Vec::new();
        self.data_pieces_into(inode, offset, len, 0, &mut pieces);
        pieces
    }

    /// [`data_pieces`](Self::data_pieces) appended to `pieces`, their place in
    /// the output `out_at` bytes further on.
    fn data_pieces_into(
        &self,
        inode: &Inode,
        offset: u64,
        len: usize,
        out_at: usize,
        pieces: &mut Vec<Piece>,
    ) {
        let end = offset + len as u64;
        if inode.file_layout == FileLayout::Io {
            let before = self
                .extents
                .range(..(inode.ino, offset))
                .next_back()
                .filter(|((i, _), _)| *i == inode.ino);
            let inside = self.extents.range((inode.ino, offset)..(inode.ino, end));
            for (&(_, ext_off), e) in before.into_iter().chain(inside) {
                let ext_end = ext_off + e.len as u64;
                let (from, to) = (offset.max(ext_off), end.min(ext_end));
                if from >= to {
                    continue;
                }
                let in_run = e.skip as u64 + (from - ext_off);
                let first = in_run / PAGE_SIZE;
                let pages = (in_run + (to - from)).div_ceil(PAGE_SIZE) - first;
                let at = out_at + (from - offset) as usize;
                let skip = (in_run % PAGE_SIZE) as usize;
                pieces.push((e.run, first, pages, at, skip, (to - from) as usize));
            }
            return;
        }
        let bs = self.geo.block_size as u64;
        for b in offset / bs..end.div_ceil(bs) {
            let Some(run) = self.block_run(inode, BlockIndex(b)) else { continue };
            let block_start = b * bs;
            let from = offset.max(block_start) - block_start;
            let to = (end.min(block_start + bs) - block_start).min(run.valid as u64);
            if from >= to {
                continue;
            }
            let first = from / PAGE_SIZE;
            let pages = to.div_ceil(PAGE_SIZE) - first;
            let at = out_at + (block_start + from - offset) as usize;
            pieces.push((run, first, pages, at, (from % PAGE_SIZE) as usize, (to - from) as usize));
        }
    }

    /// Block 0 of a file lives in its inode when the inode is on this shard, in
    /// the block table otherwise (a block-layout file homed elsewhere).
    fn block_in_inode(&self, inode: &Inode, b: BlockIndex) -> bool {
        b.0 == 0 && self.inode_slots.contains_key(&inode.ino)
    }

    pub(super) fn block_run(&self, inode: &Inode, b: BlockIndex) -> Option<Run> {
        if self.block_in_inode(inode, b) {
            inode.first_block
        } else {
            self.blocks.get(&(inode.ino, b)).copied()
        }
    }

    /// The write itself, inside an operation; updates and logs `inode`.
    pub(super) fn write_in_op(
        &mut self,
        inode: &mut Inode,
        offset: u64,
        data: &[u8],
    ) -> FsResult<()> {
        if data.len() > MAX_IO_BYTES {
            return Err(FsError::Invalid(format!(
                "write of {} bytes: at most {MAX_IO_BYTES}",
                data.len()
            )));
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(FsError::FileTooLarge)?;
        if data.is_empty() {
            return Ok(());
        }
        self.data_write_room()?;
        if inode.file_layout == FileLayout::Io {
            self.write_io(inode, offset, data)?;
        } else {
            self.write_blocks(inode, offset, data)?;
        }
        inode.size = inode.size.max(end);
        inode.mtime_ns = self.now();
        inode.ctime_ns = inode.mtime_ns;
        self.put_inode(inode)
    }

    fn write_blocks(&mut self, inode: &mut Inode, offset: u64, data: &[u8]) -> FsResult<()> {
        let bs = self.geo.block_size as u64;
        let end = offset + data.len() as u64;
        // Read the old blocks a partial write must merge.
        let mut plans: Vec<(BlockIndex, Option<Run>, u64, u64, u32)> = Vec::new();
        let mut merge_reads = Vec::new();
        let mut old_data: Vec<Option<crate::device::AlignedBuf>> = Vec::new();
        for b in offset / bs..end.div_ceil(bs) {
            let block = BlockIndex(b);
            let old = self.block_run(inode, block);
            let start = b * bs;
            let (from, to) = (offset.max(start) - start, end.min(start + bs) - start);
            let old_valid = old.map_or(0, |r| r.valid as u64);
            // Bytes past the end of file read as zeros even if a run still holds them.
            let old_valid = old_valid.min(inode.size.saturating_sub(start));
            let new_valid = old_valid.max(to) as u32;
            let mut from_cache = None;
            if let Some(run) = old.filter(|_| old_valid > 0 && (from > 0 || to < old_valid)) {
                let pages = old_valid.div_ceil(PAGE_SIZE);
                if self.defer_misses && self.op_changes == 0 && self.merge_waits(run.page, pages) {
                    // Nothing changed yet: stop, and run again once the old
                    // bytes are in memory (`set_defer_misses`).
                    let bufs = old_data.into_iter().flatten();
                    for buf in
                        bufs.chain(merge_reads.into_iter().map(|(_, r): (usize, IoRequest)| r.buf))
                    {
                        self.io.device_mut().free_buf(buf);
                    }
                    self.stats.merges_deferred += 1;
                    self.deferred = Some(DeferredOn::Data);
                    return Err(FsError::TryAgain);
                }
                let mut buf = self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize);
                // Memory first: a partly filled block still being written is
                // in the read cache already; otherwise wait for the device.
                let in_memory = self.read_data_memory(run.page, 0, &mut buf) || {
                    self.settle_data_pages([(run.page, pages)])?;
                    self.read_data_memory(run.page, 0, &mut buf)
                };
                if in_memory {
                    from_cache = Some(buf);
                } else {
                    merge_reads.push((
                        plans.len(),
                        IoRequest {
                            tag: 0,
                            kind: IoKind::Read,
                            offset: self.geo.data_offset(run.page),
                            buf,
                        },
                    ));
                }
            }
            plans.push((block, old, from, to, new_valid));
            old_data.push(from_cache);
        }
        // Not cached: the old run is replaced by this write and freed.
        let (idx, reqs): (Vec<usize>, Vec<IoRequest>) = merge_reads.into_iter().unzip();
        for (i, c) in idx.into_iter().zip(self.io.run(reqs)) {
            c.result?;
            old_data[i] = Some(c.buf);
        }
        // Allocate the new runs.
        let mut new_runs: Vec<Run> = Vec::with_capacity(plans.len());
        for &(.., new_valid) in &plans {
            let pages = (new_valid as u64).div_ceil(PAGE_SIZE);
            match self.alloc_data_run(pages) {
                Ok(page) => new_runs.push(Run { page, pages: pages as u32, valid: new_valid }),
                Err(e) => {
                    for r in &new_runs {
                        self.page_bitmap.clear_run(r.page, r.pages as u64);
                    }
                    for buf in old_data.into_iter().flatten() {
                        self.io.device_mut().free_buf(buf);
                    }
                    return Err(e);
                }
            }
        }
        // Fill them. Whole blocks whose runs lie next to each other on the
        // device share one buffer (up to a batch): their bytes are copied
        // once, and go out as one device write with no merge at submit. A
        // block this write did not cover whole is what the next write of the
        // rest reads back (an append, or another writer of the same block:
        // IOR-hard's interleaved segments often fill a block's end before its
        // start), so it is staged alone, to be cached once written.
        let whole = |k: usize| plans[k].2 == 0 && plans[k].3 == bs;
        let mut i = 0;
        while i < plans.len() {
            let mut j = i + 1;
            let mut pages = new_runs[i].pages as u64;
            while whole(i)
                && j < plans.len()
                && whole(j)
                && new_runs[j].page == new_runs[j - 1].page + new_runs[j - 1].pages as u64
                && (pages + new_runs[j].pages as u64) * PAGE_SIZE <= BATCH_BYTES as u64
            {
                pages += new_runs[j].pages as u64;
                j += 1;
            }
            let mut buf = self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize);
            let mut at = 0;
            for k in i..j {
                let (block, old, from, to, new_valid) = plans[k];
                let len = (new_runs[k].pages as u64 * PAGE_SIZE) as usize;
                let part = &mut buf[at..at + len];
                at += len;
                // The old bytes kept, then the new ones; only what neither
                // covers is zeroed (the buffer holds whatever its last use left).
                let keep = match &old_data[k] {
                    Some(bytes) => {
                        let keep = (old.expect("merge has an old run").valid as u64)
                            .min(inode.size.saturating_sub(block.0 * bs))
                            .min(new_valid as u64) as usize;
                        part[..keep].copy_from_slice(&bytes[..keep]);
                        keep
                    }
                    None => 0,
                };
                let (from, to) = (from as usize, to as usize);
                if keep < from {
                    part[keep..from].fill(0);
                }
                let src = block.0 as usize * bs as usize + from - offset as usize;
                part[from..to].copy_from_slice(&data[src..src + (to - from)]);
                let end = keep.max(to);
                part[end..].fill(0);
            }
            self.stage_data(new_runs[i].page, buf, !whole(i));
            i = j;
        }
        for buf in old_data.into_iter().flatten() {
            self.io.device_mut().free_buf(buf);
        }
        // Map the new runs; the old ones are freed once this is durable.
        for (&(block, old, ..), run) in plans.iter().zip(new_runs) {
            if let Some(old) = old {
                self.pending_free.push(old);
                inode.pages -= old.pages as u64;
            }
            inode.pages += run.pages as u64;
            if self.block_in_inode(inode, block) {
                inode.first_block = Some(run);
            } else {
                self.log(Change::BlockPut { ino: inode.ino, block, run })?;
            }
        }
        Ok(())
    }

    fn write_io(&mut self, inode: &mut Inode, offset: u64, data: &[u8]) -> FsResult<()> {
        let pages = (data.len() as u64).div_ceil(PAGE_SIZE);
        self.reserve_table_bytes(super::tables::EXTENT_BYTES * 2)?;
        let page = self.alloc_data_run(pages)?;
        let run = Run { page, pages: pages as u32, valid: data.len() as u32 };
        let mut buf = self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize);
        buf[..data.len()].copy_from_slice(data);
        buf[data.len()..].fill(0);
        // Streaming (io layout) writes are not worth the read cache.
        self.stage_data(page, buf, false);
        self.trim_extents(inode, offset, offset + data.len() as u64)?;
        let extent = Extent { len: data.len() as u32, skip: 0, run };
        inode.pages += pages;
        self.log(Change::ExtentPut { ino: inode.ino, offset, extent })
    }

    /// Removes the bytes `from..to` from the extents of `inode`.
    fn trim_extents(&mut self, inode: &mut Inode, from: u64, to: u64) -> FsResult<()> {
        let ino = inode.ino;
        let before = self.extents.range(..(ino, from)).next_back().filter(|((i, _), _)| *i == ino);
        let overlapping: Vec<(u64, Extent)> = before
            .into_iter()
            .chain(self.extents.range((ino, from)..(ino, to)))
            .map(|(&(_, off), e)| (off, *e))
            .filter(|(off, e)| off + e.len as u64 > from)
            .collect();
        for (off, e) in overlapping {
            let end = off + e.len as u64;
            self.log(Change::ExtentDel { ino, offset: off })?;
            if off < from {
                let left = Extent { len: (from - off) as u32, ..e };
                self.log(Change::ExtentPut { ino, offset: off, extent: left })?;
            }
            if end > to {
                let right =
                    Extent { len: (end - to) as u32, skip: e.skip + (to - off) as u32, run: e.run };
                self.log(Change::ExtentPut { ino, offset: to, extent: right })?;
            }
            self.release_extent_run(inode, e.run);
        }
        Ok(())
    }

    /// Frees an extent's run once no extent of the file refers to it.
    fn release_extent_run(&mut self, inode: &mut Inode, run: Run) {
        if !self.run_refs.contains_key(&run.page) {
            self.pending_free.push(run);
            inode.pages -= run.pages as u64;
        }
    }

    /// Truncates or extends `inode` to `size` inside an operation (caller logs it).
    pub(super) fn truncate_in_op(&mut self, inode: &mut Inode, size: u64) -> FsResult<()> {
        if size > MAX_FILE_SIZE {
            return Err(FsError::FileTooLarge);
        }
        if size < inode.size {
            self.free_data_from(inode, size, false)?;
        }
        inode.size = size;
        Ok(())
    }

    /// Unmaps everything at or past byte `size` (the inode is updated in memory;
    /// the caller logs it, or drops the inode when `gone`, which frees its xattrs
    /// too). What does not fit this record's free budget is left to a trim.
    pub(super) fn free_data_from(
        &mut self,
        inode: &mut Inode,
        size: u64,
        gone: bool,
    ) -> FsResult<()> {
        let ino = inode.ino;
        if inode.file_layout == FileLayout::Io {
            // Cut the extent that straddles `size`; its run stays referenced.
            let straddling = self
                .extents
                .range(..(ino, size))
                .next_back()
                .filter(|(&(i, off), e)| i == ino && off + e.len as u64 > size)
                .map(|(&(_, off), &e)| (off, e));
            if let Some((off, e)) = straddling {
                self.log(Change::ExtentDel { ino, offset: off })?;
                let left = Extent { len: (size - off) as u32, ..e };
                self.log(Change::ExtentPut { ino, offset: off, extent: left })?;
            }
        } else {
            let bs = self.geo.block_size as u64;
            // Keep a partial last block but cut its valid bytes.
            if size % bs != 0 {
                let b = BlockIndex(size / bs);
                if let Some(mut run) = self.block_run(inode, b) {
                    run.valid = run.valid.min((size % bs) as u32);
                    if self.block_in_inode(inode, b) {
                        inode.first_block = Some(run);
                    } else {
                        self.log(Change::BlockPut { ino, block: b, run })?;
                    }
                }
            }
            if size == 0 && self.block_in_inode(inode, BlockIndex(0)) {
                if let Some(run) = inode.first_block.take() {
                    self.pending_free.push(run);
                    inode.pages -= run.pages as u64;
                }
            }
        }
        let mut pages = 0;
        let done = self.free_past(ino, size, gone, &mut pages)?;
        inode.pages -= pages.min(inode.pages);
        if !done {
            let from = self.trims.get(&ino).map_or(size, |&f| f.min(size));
            self.log(Change::TrimPut { ino, from })?;
        }
        Ok(())
    }
}

/// The bytes of a read started without `background`, which never waits.
fn done(start: FsResult<ReadStart>) -> FsResult<Vec<u8>> {
    match start? {
        ReadStart::Done(data) => Ok(data),
        ReadStart::Pending(id) => unreachable!("read {id} pending without background"),
        ReadStart::Gather(_) => unreachable!("a read gathered without ReadShape::gather"),
    }
}
