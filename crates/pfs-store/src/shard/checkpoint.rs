//! Checkpoints taken beside the requests: the worker serves while the tables
//! go to the device, and stops only for the in-memory snapshot.
//!
//! The WAL area has two halves, one per generation's parity
//! ([`Geometry::wal_half`](super::Geometry::wal_half)); the checkpoint
//! regions alternate the same way. A checkpoint of generation `g + 1`:
//!
//! 1. **Snapshot**: once no commit is under way, after the last finished
//!    operation, lsn `X - 1`, the shard's log is replaced by an empty one of
//!    generation `g + 1` over the other half, starting at lsn `X`, and a
//!    commit of the old log's pending records starts (`Committing::retired`).
//!    The image of the tables starts ([`Encoder`]): the snapshot lists only
//!    the directories with names and the inodes with extended attributes.
//!    Operations go on and log to the new half.
//! 2. **Encode**: the tables are encoded [`ENCODE_SLICE`](super::tables::ENCODE_SLICE) entries at a time,
//!    one slice per poll, operations running between slices. The image is
//!    fuzzy (each entry as it was when its slice ran); replaying the new half
//!    from lsn `X` over it gives the tables exactly (see [`Encoder`]). Once it
//!    is complete, the checkpoint needs the commit that covers every record
//!    logged so far: the image may hold their changes.
//! 3. **Writes**: the tables go to the inactive region, at most
//!    [`TABLE_WRITES`] chunks in flight; the Icache blocks that held changes
//!    older than `X` are copied at the snapshot, and the copies written once
//!    the snapshot's commit finished (`Icache::write_copy`): a block that
//!    changes with every operation, such as the inode of the directory of a
//!    create storm, never has all its changes durable at once.
//! 4. **Sync**, once the snapshot's commit, the image's commit and every
//!    write above finished.
//! 5. **Header** of generation `g + 1` written, then **synced**: from then on
//!    recovery starts at the new tables and the new half.
//!
//! A crash before step 5 finished finds the old header: recovery replays the
//! old half and then the new half's records of generation `g + 1` that follow
//! it without a gap (`Shard::open`). Records of the new half are written only
//! after the snapshot's commit made the old half's durable, so the two halves
//! never leave a hole. A failed request fails the shard, as a failed commit
//! does.
//!
//! If the new half fills before the checkpoint finished, the operation that
//! needs room waits for it (`ShardStats::log_full_waits`): a checkpoint starts
//! when a quarter of the half is left (`start_free`), so only a checkpoint
//! slower than writing three quarters of a half makes anyone wait.

use std::time::Instant;

use super::tables::{self, Encoder};
use super::{geometry::CheckpointHeader, opts_group, sync_req, write_req, Shard};
use super::{MAX_RECORD_BYTES, PAGE_SIZE};
use crate::device::Device;
use crate::error::StoreError;
use crate::icache::WriteBack;
use crate::wal::Wal;
use pfs_core::{FsError, FsResult};

/// Table writes of 1 MiB a checkpoint keeps in flight.
const TABLE_WRITES: usize = 4;
/// Bytes of one table write.
const TABLE_CHUNK: usize = 1 << 20;
/// Table writes submitted per poll at most: each copies its megabyte into a
/// device buffer, and a device that finishes writes at once (a file in the
/// page cache) would otherwise have one poll copy the whole image.
const WRITES_PER_POLL: usize = 1;
/// Icache block copies and write-backs submitted per poll at most (one device
/// request each: a system call, in a virtual machine an exit to the host, so
/// 200 in one poll stopped the worker for 1-1.2 ms).
const COPIES_PER_POLL: usize = 32;

/// Bytes of a replaced image buffer given back per poll: unmapping 4 MiB of
/// touched pages takes about a third of a millisecond.
pub(super) const RELEASE_STEP: usize = 4 << 20;

/// A checkpoint under way.
#[derive(Debug)]
pub(super) struct Checkpointing {
    step: Step,
    started: Instant,
    /// Set at the snapshot: the header to write (its tables' length and
    /// checksum once encoded), the image being encoded, then the encoded
    /// tables and how many bytes of them were submitted, the number of the
    /// commit that makes the snapshot durable, and the Icache blocks it must
    /// see written.
    header: Option<CheckpointHeader>,
    encoder: Option<Encoder>,
    tables: Vec<u8>,
    submitted: usize,
    commit: u64,
    /// The commit that makes durable every record logged before the image
    /// was complete (set when it is).
    image_commit: u64,
    /// The Icache blocks unwritten at the snapshot; the dirty ones are frozen
    /// (`Icache::freeze`) and copies of them as of the snapshot are written
    /// once its commit finished: a block that changes with every operation
    /// (a directory's inode in a create storm) never waits for a moment its
    /// newest change is durable.
    blocks: Vec<u32>,
    /// Failpoint `checkpoint.hold_ms`: the header is not written before this.
    hold_until: Option<Instant>,
}

/// What a checkpoint waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The commit under way, before the snapshot.
    Snapshot,
    /// The image of the tables, a slice per poll.
    Encode,
    /// Table writes, write-backs and the snapshot's commit.
    Writes,
    /// The sync of all of them.
    Sync,
    /// Failpoint `checkpoint.hold_ms`: the time before the header write.
    Hold,
    /// The header write.
    Header,
    /// Its sync.
    HeaderSync,
}

impl<D: Device> Shard<D> {
    /// Takes a checkpoint and waits for it (open, format, a clean stop):
    /// finishes the one under way, then checkpoints everything finished so far.
    pub fn checkpoint(&mut self) -> Result<(), StoreError> {
        let corrupt = |e: FsError| StoreError::Corruption(e.to_string());
        self.check_failed().map_err(corrupt)?;
        self.wait_checkpoint().map_err(corrupt)?;
        self.start_checkpoint();
        self.wait_checkpoint().map_err(corrupt)
    }

    /// Starts a checkpoint beside the requests, unless one is under way; the
    /// worker moves it along with [`poll_checkpoint`](Self::poll_checkpoint).
    pub fn start_checkpoint(&mut self) {
        if self.ckpt.is_some() || self.failed.is_some() {
            return;
        }
        let hold = pfs_core::failpoint::setting("checkpoint.hold_ms")
            .map(|ms| Instant::now() + std::time::Duration::from_millis(ms));
        self.ckpt = Some(Checkpointing {
            step: Step::Snapshot,
            started: Instant::now(),
            header: None,
            encoder: None,
            tables: Vec::new(),
            submitted: 0,
            commit: 0,
            image_commit: 0,
            blocks: Vec::new(),
            hold_until: hold,
        });
        self.step_checkpoint(false);
    }

    /// Waits for the checkpoint under way, if any (what every operation did
    /// before checkpoints ran beside the requests; `benches/checkpoint.rs`
    /// compares the two).
    pub fn finish_checkpoint(&mut self) -> FsResult<()> {
        self.wait_checkpoint()
    }

    /// Whether a checkpoint is under way.
    pub fn checkpointing(&self) -> bool {
        self.ckpt.is_some()
    }

    /// Whether the checkpoint under way is encoding its image.
    pub fn checkpoint_encoding(&self) -> bool {
        self.ckpt.as_ref().is_some_and(|c| c.step == Step::Encode)
    }

    /// Whether the checkpoint under way has work for the CPU that no device
    /// completion announces, done a bounded piece per
    /// [`poll_checkpoint`](Self::poll_checkpoint): its image to encode,
    /// table writes to submit with room in flight, or Icache copies to
    /// submit. A worker must not sleep on it.
    pub fn checkpoint_wants_cpu(&self) -> bool {
        self.ckpt.as_ref().is_some_and(|c| {
            c.step == Step::Encode
                || (c.step == Step::Writes
                    && ((c.submitted < c.tables.len() && self.io.ckpt_in_flight() < TABLE_WRITES)
                        || (self.commits_done >= c.commit && self.icache.copies_left())))
        })
    }

    /// Entries a checkpoint encodes per poll (4,096 unless set;
    /// at least 1). Smaller slices stop the requests for less time each, in
    /// more polls; tests set a few entries so that operations run inside the
    /// image's walk.
    pub fn set_checkpoint_slice(&mut self, entries: usize) {
        self.ckpt_slice = entries.max(1);
    }

    /// Whether a checkpoint waits for its snapshot, which the next commit to
    /// start takes (`start_commit`).
    pub(super) fn wants_snapshot(&self) -> bool {
        self.ckpt.as_ref().is_some_and(|c| c.step == Step::Snapshot)
    }

    /// Free log bytes under which a checkpoint starts.
    pub(super) fn checkpoint_start_free(&self) -> u64 {
        let half = self.geo.wal_half(0).1;
        MAX_RECORD_BYTES + (half - MAX_RECORD_BYTES) / 4
    }

    /// Moves the checkpoint under way as far as finished requests allow,
    /// without waiting, and encodes one slice of its image if it is at that
    /// step. A failed request fails the shard.
    pub fn poll_checkpoint(&mut self) {
        self.release_image();
        if self.ckpt.is_none() && self.wal.free_bytes() < self.checkpoint_start_free() {
            // The log is short and no operation started a checkpoint (those
            // that need room stopped for it): the next one starts here.
            self.start_checkpoint();
        }
        self.step_checkpoint(true);
    }

    /// Gives back up to [`RELEASE_STEP`] bytes of an image buffer a larger
    /// one replaced (shrinking a buffer unmaps its tail, or splits its heap
    /// chunk, without copying).
    fn release_image(&mut self) {
        let cap = self.ckpt_retired.capacity();
        if cap > RELEASE_STEP {
            // It holds the last image's bytes: below them it cannot shrink.
            self.ckpt_retired.clear();
            self.ckpt_retired.shrink_to(cap - RELEASE_STEP);
        } else if cap > 0 {
            self.ckpt_retired = Vec::new();
        }
    }

    /// [`poll_checkpoint`](Self::poll_checkpoint) without encoding (what an
    /// operation does as it begins): the worker encodes a slice per round,
    /// not one per operation.
    pub(super) fn step_checkpoint(&mut self, encode: bool) {
        while let Some(c) = &self.ckpt {
            if self.failed.is_some() {
                self.ckpt = None;
                self.icache.thaw();
                return;
            }
            let step = c.step;
            let moved = match step {
                Step::Snapshot => {
                    if self.committing.is_some() {
                        self.poll_commit();
                    }
                    if self.committing.is_some() {
                        return;
                    }
                    self.snapshot();
                    true
                }
                Step::Encode if !encode => return,
                Step::Encode => self.encode_slice(),
                Step::Writes => self.poll_writes(),
                Step::Hold => self.write_header(),
                Step::Sync | Step::Header | Step::HeaderSync => self.poll_step(step),
            };
            if !moved {
                return;
            }
        }
    }

    /// Starts the image of the tables, moves the log to the other half and
    /// commits the old one's records.
    fn snapshot(&mut self) {
        let at = Instant::now();
        let mut lists = std::mem::take(&mut self.ckpt_keys);
        let room = tables::image_room(self);
        if lists.image.capacity() < room {
            // Growing the old buffer would copy it whole: a new one, untouched
            // (its pages are faulted in slice by slice), and the old one given
            // back a piece per poll.
            self.ckpt_retired =
                std::mem::replace(&mut lists.image, Vec::with_capacity(room + room / 2));
        }
        let encoder = Encoder::new(self, lists);
        let gen = self.wal.gen() + 1;
        let header = CheckpointHeader {
            gen,
            region: (gen % 2) as u32,
            tables_len: 0,
            tables_crc: 0,
            next_ino_seq: self.next_ino_seq,
            first_lsn: self.wal.next_lsn(),
        };
        let (offset, bytes) = self.geo.wal_half(gen);
        let group = opts_group(&self.opts);
        let fresh = Wal::new(offset, bytes, gen, header.first_lsn, group, self.geo.format_id);
        let retired = std::mem::replace(&mut self.wal, fresh);
        self.log_moves += 1;
        let blocks = self.icache.unwritten_blocks();
        self.icache.freeze(&blocks);
        // A failure is the shard's: `poll_checkpoint` drops the checkpoint.
        let _ = self.start_commit_of(Some(retired));
        let us = at.elapsed().as_micros() as u64;
        self.stats.last_snapshot_us = us;
        self.stats.max_snapshot_us = self.stats.max_snapshot_us.max(us);
        let commit = self.commits_started;
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        c.step = Step::Encode;
        c.header = Some(header);
        c.encoder = Some(encoder);
        c.commit = commit;
        c.blocks = blocks;
    }

    /// Encodes one slice of the image; once it is complete, fills in the
    /// header and moves to the writes. Returns whether the step changed.
    fn encode_slice(&mut self) -> bool {
        let at = Instant::now();
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        let mut e = c.encoder.take().expect("an image being encoded");
        e.step(self, self.ckpt_slice);
        if e.len() as u64 > self.ckpt_image_limit {
            // Entries removed after their slice and others made ahead of the
            // walk grew the image past its region: encode the tables as they
            // are now, whole, which `table_bytes` keeps within it.
            self.stats.image_reencodes += 1;
            let (image, mut lists) = e.finish();
            lists.image = image;
            e = Encoder::new(self, lists);
            e.step(self, usize::MAX);
        }
        let us = at.elapsed().as_micros() as u64;
        self.stats.max_encode_slice_us = self.stats.max_encode_slice_us.max(us);
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        if !e.done() {
            c.encoder = Some(e);
            return false;
        }
        let crc = e.crc();
        let (tables, lists) = e.finish();
        self.ckpt_keys = lists;
        debug_assert_eq!(crc, crc32c::crc32c(&tables), "the image's checksum, slice by slice");
        assert!(
            tables.len() as u64 <= self.geo.ckpt_pages * PAGE_SIZE,
            "tables of {} bytes overflow the checkpoint region: table_bytes accounting is wrong",
            tables.len()
        );
        let header = c.header.as_mut().expect("snapshot taken");
        header.tables_len = tables.len() as u64;
        header.tables_crc = crc;
        // The image may hold the changes of every record logged since the
        // snapshot: the header waits for the commit that covers them.
        c.image_commit = if self.wal.next_lsn() == header.first_lsn {
            c.commit
        } else {
            self.commits_started + 1
        };
        self.stats.last_checkpoint_bytes = tables.len() as u64;
        c.tables = tables;
        c.step = Step::Writes;
        true
    }

    /// The table writes and write-backs: submits what fits, collects what
    /// finished, and submits the sync once all of them and the snapshot's
    /// commit are done. Returns whether the step changed. Passes again while
    /// a pass left finished requests behind (submitting polls the device), so
    /// a worker never sleeps on completions already collected.
    fn poll_writes(&mut self) -> bool {
        let mut budget = WRITES_PER_POLL;
        let mut starts = COPIES_PER_POLL;
        for _ in 0..TABLE_WRITES + 4 {
            if self.poll_writes_once(&mut budget, &mut starts) {
                return true;
            }
            if !self.io.has_finished() {
                break;
            }
        }
        false
    }

    fn poll_writes_once(&mut self, budget: &mut usize, starts: &mut usize) -> bool {
        self.poll_data_writes();
        if self.committing.is_some() {
            self.poll_commit();
        }
        let image_commit = self.ckpt.as_ref().expect("a checkpoint under way").image_commit;
        if self.commits_done < image_commit && self.committing.is_none() {
            // The image holds changes whose records are not durable yet.
            let _ = self.start_commit();
        }
        loop {
            if !self.take_table_writes() {
                return true;
            }
            let c = self.ckpt.as_mut().expect("a checkpoint under way");
            if self.io.ckpt_in_flight() >= TABLE_WRITES
                || c.submitted == c.tables.len()
                || *budget == 0
            {
                break;
            }
            let region = c.header.expect("snapshot taken").region as usize;
            let base = self.geo.offset(self.geo.ckpt_page[region]);
            while self.io.ckpt_in_flight() < TABLE_WRITES
                && c.submitted < c.tables.len()
                && *budget > 0
            {
                *budget -= 1;
                let end = (c.submitted + TABLE_CHUNK).min(c.tables.len());
                let req = write_req(base + c.submitted as u64, &c.tables[c.submitted..end]);
                c.submitted = end;
                self.io.submit_ckpt(req, 0);
            }
        }
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        let (lsn, commit) = (c.header.expect("snapshot taken").first_lsn, c.commit);
        if self.commits_done >= commit && self.icache.copies_left() {
            // Everything the copies hold is durable now.
            let now = self.icache.take_copies(&c.blocks, *starts);
            *starts -= now.len();
            for (b, copy) in now {
                self.icache.write_copy(&mut self.io, b, copy, lsn - 1);
            }
        }
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        let mut blocks = std::mem::take(&mut c.blocks);
        let written = self.icache.write_back_older(&mut self.io, &mut blocks, lsn, starts);
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        c.blocks = blocks;
        let written = match written {
            Ok(w) => w,
            Err(e) => {
                self.fail_checkpoint(format!("writing back inodes: {e}"));
                return true;
            }
        };
        // Writes that finished meanwhile (the write-backs polled the device).
        if !self.take_table_writes() {
            return true;
        }
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        let tables_done = c.submitted == c.tables.len() && self.io.ckpt_in_flight() == 0;
        let image_commit = c.image_commit;
        if written == WriteBack::NeedsCommit && self.committing.is_none() {
            // Blocks changed again since the snapshot: their records first.
            let _ = self.start_commit();
        }
        if !tables_done || written != WriteBack::Done || self.commits_done < image_commit {
            return false;
        }
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        c.step = Step::Sync;
        // Kept for the next image (`KeyLists`).
        self.ckpt_keys.image = std::mem::take(&mut c.tables);
        self.io.submit_ckpt(sync_req(), 0);
        true
    }

    /// Collects finished table writes; `false` if one failed (then the shard
    /// failed).
    fn take_table_writes(&mut self) -> bool {
        for done in self.io.take_ckpt() {
            if let Err(e) = done.result {
                self.fail_checkpoint(format!("writing its tables: {e}"));
                return false;
            }
        }
        true
    }

    /// A single request's step: when it finished, submits the next one or
    /// finishes the checkpoint. Returns whether the step changed.
    fn poll_step(&mut self, step: Step) -> bool {
        let Some(done) = self.io.take_ckpt().pop() else { return false };
        if let Err(e) = done.result {
            self.fail_checkpoint(format!("{step:?}: {e}"));
            return true;
        }
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        match step {
            Step::Sync => {
                c.step = Step::Hold;
            }
            Step::Header => {
                c.step = Step::HeaderSync;
                self.io.submit_ckpt(sync_req(), 0);
            }
            _ => {
                let c = self.ckpt.take().expect("a checkpoint under way");
                self.icache.thaw();
                let us = c.started.elapsed().as_micros() as u64;
                self.stats.last_checkpoint_us = us;
                self.stats.max_checkpoint_us = self.stats.max_checkpoint_us.max(us);
                self.stats.checkpoints += 1;
                if c.image_commit > c.commit {
                    self.stats.fuzzy_checkpoints += 1;
                    self.stats.last_fuzzy_gen = c.header.expect("snapshot taken").gen;
                }
            }
        }
        true
    }

    /// Writes the header, once failpoint `checkpoint.hold_ms` lets it.
    fn write_header(&mut self) -> bool {
        let c = self.ckpt.as_mut().expect("a checkpoint under way");
        if c.hold_until.is_some_and(|until| Instant::now() < until) {
            return false;
        }
        let header = c.header.expect("snapshot taken");
        c.step = Step::Header;
        let page = self.geo.offset(1 + u64::from(header.region));
        self.io.submit_ckpt(write_req(page, &header.encode(self.geo.format_id)), 0);
        true
    }

    /// How long the checkpoint under way holds its header back (failpoint
    /// `checkpoint.hold_ms`), if it does now.
    fn held_for(&self) -> Option<std::time::Duration> {
        let c = self.ckpt.as_ref()?;
        let until = c.hold_until.filter(|_| c.step == Step::Hold)?;
        Some(until.saturating_duration_since(Instant::now()))
    }

    fn fail_checkpoint(&mut self, why: String) {
        self.ckpt = None;
        self.icache.thaw();
        self.fail(format!("checkpoint failed, the shard must be recovered from its log: {why}"));
    }

    /// Waits for the checkpoint under way, if any; fails if it failed.
    pub(super) fn wait_checkpoint(&mut self) -> FsResult<()> {
        loop {
            self.poll_checkpoint();
            if self.ckpt.is_none() {
                return self.check_failed();
            }
            if self.checkpoint_wants_cpu() {
                continue;
            }
            if let Some(held) = self.held_for() {
                std::thread::sleep(held);
                continue;
            }
            if !self.io.wait_any() && !self.io.has_finished() {
                // Every step waits for a request it or its commit submitted.
                let c = self.ckpt.take().expect("a checkpoint under way");
                self.fail(format!(
                    "a checkpoint waited for a request not in flight (step {:?}, {} blocks \
                     to write back, commit {} of {} done)",
                    c.step,
                    c.blocks.len(),
                    self.commits_done,
                    c.commit
                ));
                return self.check_failed();
            }
            // What the steps wait for: data requests before the snapshot's
            // commit, and its steps.
            self.poll_data_writes();
            self.poll_commit();
        }
    }

    /// Makes room in a full log for the operation about to start: takes the
    /// snapshot of a checkpoint (moving to the other half), after the one
    /// under way if it already took its own. A request that changed nothing
    /// yet (`set_defer_misses`) does not wait: the checkpoint goes on beside
    /// the requests (the worker polls it, and starts the next one while the
    /// log is short) and the request stops to run again once the log moved
    /// ([`DeferredOn::LogRoom`](super::DeferredOn::LogRoom)). Others wait.
    pub(super) fn make_log_room(&mut self) -> FsResult<()> {
        if self.defer_misses && self.op_changes == 0 {
            self.start_checkpoint();
            if self.wal.free_bytes() >= MAX_RECORD_BYTES {
                return Ok(()); // Its snapshot was taken at once.
            }
            self.stats.log_room_deferred += 1;
            self.deferred = Some(super::DeferredOn::LogRoom);
            return Err(FsError::TryAgain);
        }
        self.stats.log_full_waits += 1;
        for _ in 0..4 {
            if self.wal.free_bytes() >= MAX_RECORD_BYTES {
                return Ok(());
            }
            if self.wants_snapshot() {
                self.wait_commit()?;
                self.poll_checkpoint();
            } else if self.ckpt.is_some() {
                self.wait_checkpoint()?;
            } else {
                self.start_checkpoint();
            }
            self.check_failed()?;
        }
        Err(FsError::Io("the log stayed full after a checkpoint".into()))
    }
}
