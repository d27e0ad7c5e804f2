//! One shard (PStore): a single-threaded value that owns one zone of a device.
//!
//! - [`geometry`]: zone layout, superblock, checkpoint headers.
//! - [`tables`]: encoding of the in-memory tables into a checkpoint.
//! - [`meta`]: namespace operations (create, lookup, rename, readdir, xattrs, ...).
//! - [`acl`]: POSIX ACLs, kept in the mode bits where the mode expresses them.
//! - [`data`]: file data (block / file / io layouts), truncate.
//! - [`cache`]: the read cache of data pages, and read-ahead for sequential readers.
//! - [`commit`] and [`checkpoint`]: group commit and checkpoints, as steps the
//!   worker drives between requests.
//! - this file: state, format, open (recovery), the operation frame
//!   (`begin` / `log` / `finish`).
//!
//! Every operation validates and reads first, then applies its changes through
//! [`Shard::log`], which both changes memory and appends to the operation's WAL
//! record, so live operation and replay share one code path.

pub mod acl;
pub mod cache;
pub mod check;
mod checkpoint;
mod commit;
pub mod data;
pub mod dataio;
pub mod follow;
pub mod geometry;
pub mod meta;
mod tables;
mod trim;
pub mod txn;

use std::collections::{BTreeMap, HashMap, HashSet};

use pfs_core::{BlockIndex, FileAttr, FsError, FsResult, InodeId, ShardId, TimeNs};

use crate::bitmap::Bitmap;
use crate::cart::Cart;
use crate::device::{AlignedBuf, Device, IoKind, IoRequest};
use crate::error::StoreError;
use crate::icache::{Icache, IcacheStats, PageRead};
use crate::inode::{Inode, Run, INODE_SLOT_SIZE};
use crate::io::DevIo;
use crate::wal::record::Extent;
use crate::wal::{Change, Wal};

pub use geometry::{FormatOptions, Geometry, PAGE_SIZE};
pub use meta::{CreateArgs, DirEntry, RenameFlags, XattrFlags};

/// Largest WAL record an operation may produce (a 1 MiB write maps 16+ blocks;
/// xattr values are at most 64 KiB).
const MAX_RECORD_BYTES: u64 = 128 << 10;

/// Icache blocks one operation may touch (rename: two parents, source, target).
const OP_ICACHE_BLOCKS: usize = 8;

/// Pending log bytes past two groups that an operation which cannot stop (its
/// request changed something already, or it is not a request) may still
/// add before it waits for a commit: a request that stops for its commit does
/// so at two groups, before its first change, so the later operations of a
/// request that went on (a write that settles a truncation first, a rename's
/// steps) find room for two records of the largest size instead of waiting.
const UNSTOPPABLE_ROOM: usize = 2 * MAX_RECORD_BYTES as usize;

/// Run-time choices of an open shard.
#[derive(Clone, Debug)]
pub struct ShardOptions {
    /// Icache blocks (each holds 16 inodes).
    pub icache_blocks: usize,
    /// Dirty share of the Icache that starts write-back.
    pub dirty_ratio: f64,
    /// Bytes of WAL records that may wait for one commit.
    pub wal_group_bytes: usize,
    /// Data pages the read cache holds (0: none); see [`cache`].
    pub read_cache_pages: usize,
    /// Read-ahead of sequential readers, in multiples of their read (0: none).
    pub read_ahead_factor: u64,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            icache_blocks: 4096,
            dirty_ratio: 0.05,
            wal_group_bytes: 4 << 20,
            read_cache_pages: 4096,
            read_ahead_factor: cache::READ_AHEAD_FACTOR,
        }
    }
}

/// What an operation stopped at, to run again later (`Shard::set_defer_misses`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferredOn {
    /// An inode page whose read the request started: again once
    /// `Shard::icache_reads_done` moved.
    InodePage,
    /// An inode page already being read or written back, or whose read could
    /// not start (as many background reads as the Icache allows were in
    /// flight, `Icache::read_cap`; or no block is free until a write-back
    /// lands): again once `Shard::icache_reads_done` moved. The request lost
    /// nothing it had (a page it read is not evicted by such a stop), so the
    /// worker counts it as a fraction of a stop: run again at another
    /// page's read, a request whose own read is still in flight stops again.
    InodePageWait,
    /// Data pages being read or written: again once
    /// `Shard::data_requests_done` moved.
    Data,
    /// A group commit under way (two groups of records pending, an Icache
    /// short of clean blocks, inode numbers used up to their durable
    /// floor): again once `Shard::commits_done` moved.
    Commit,
    /// A full log, waiting for a checkpoint's snapshot to move it to the
    /// other half: again once the log moved (`Shard::background_progress`).
    LogRoom,
}

/// Counters an operator or a benchmark reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Icache counters.
    pub icache: IcacheStats,
    /// Commits that wrote the WAL.
    pub commits: u64,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// The last checkpoint: bytes of tables it wrote, and how long it took
    /// from start to durable header (microseconds), serving meanwhile.
    pub last_checkpoint_bytes: u64,
    /// See `last_checkpoint_bytes`.
    pub last_checkpoint_us: u64,
    /// The longest checkpoint since the shard opened, in microseconds.
    pub max_checkpoint_us: u64,
    /// The last checkpoint's snapshot (the log moved on, the inode table
    /// copied), during which the shard served nothing, and the longest one,
    /// in microseconds.
    pub last_snapshot_us: u64,
    /// See `last_snapshot_us`.
    pub max_snapshot_us: u64,
    /// The longest slice of a checkpoint's image encoded between requests
    /// (`ENCODE_SLICE` entries), in microseconds.
    pub max_encode_slice_us: u64,
    /// Images encoded again whole because changes during the walk grew them
    /// past the checkpoint region.
    pub image_reencodes: u64,
    /// Checkpoints whose image was encoded while operations changed the
    /// tables (a fuzzy image, exact once the log is replayed over it), and
    /// the generation of the last one.
    pub fuzzy_checkpoints: u64,
    /// See `fuzzy_checkpoints`.
    pub last_fuzzy_gen: u64,
    /// Operations that found the log full and waited for a checkpoint.
    pub log_full_waits: u64,
    /// Operations that waited for a commit: the pending records reached two
    /// groups, the Icache was short of clean blocks (`begin`), or a create
    /// used inode numbers up to their durable floor.
    pub forced_commits: u64,
    /// Times the shard waited for the device (`DevIo::waits`): blocking
    /// reads and writes, commits waited for, waits for requests in flight;
    /// since it opened, recovery included, an idle worker's wait not.
    pub device_waits: u64,
    /// Requests that stopped for such a commit instead, to run again once it
    /// finished (`Shard::set_defer_misses`).
    pub commits_deferred: u64,
    /// Requests that found the log full and stopped for the checkpoint that
    /// makes room instead of waiting for it, to run again once it did.
    pub log_room_deferred: u64,
    /// WAL records replayed at open.
    pub replayed: u64,
    /// The generation of the checkpoint the shard opened from (0 for a
    /// shard formatted by this process).
    pub opened_gen: u64,
    /// Data reads served from the read cache, and those that went to the device
    /// (one per piece of a read: a block, or an extent).
    pub read_cache_hits: u64,
    /// See `read_cache_hits`.
    pub read_cache_misses: u64,
    /// Device writes of file data submitted; neighbouring runs share one
    /// (`dataio.rs`).
    pub data_writes: u64,
    /// Device reads submitted ahead of a sequential reader.
    pub read_aheads: u64,
    /// Pieces of reads copied from a read-ahead's buffer, and those that
    /// joined a read-ahead still in flight.
    pub ahead_hits: u64,
    /// See `ahead_hits`.
    pub ahead_joins: u64,
    /// Reads that read-ahead buffers held whole (`ReadShape::gather`): sent
    /// from them straight into a shared-memory ring, or copied once into a
    /// reply buffer that was not cleared first.
    pub reads_gathered: u64,
    /// Device reads of reads answered when they finish (`Shard::read_start`).
    pub reads_in_background: u64,
    /// Partial writes that stopped before their merge, to run again once the
    /// old bytes were in memory instead of reading them blocking
    /// (`Shard::set_defer_misses`).
    pub merges_deferred: u64,
    /// Data reads that stopped at pages whose write was in flight, to run
    /// again once it finished instead of waiting for it.
    pub reads_deferred: u64,
    /// Asynchronous device requests that found the device queue full and
    /// waited in the shard's own queue for room (`DevIo::held_back`), where
    /// the worker waited for the device before.
    pub held_back: u64,
    /// Data writes that stopped while the data writes so held were over
    /// their bound (4 MiB, `HELD_DATA_MAX` in `shard/dataio.rs`), to run
    /// again once the data requests in flight finished.
    pub writes_deferred: u64,
}

/// One shard over its zone of device `D`.
#[derive(Debug)]
pub struct Shard<D: Device> {
    io: DevIo<D>,
    geo: Geometry,
    opts: ShardOptions,
    dentries: Cart,
    inode_slots: crate::slots::InodeTable,
    slot_bitmap: Bitmap,
    icache: Icache,
    page_bitmap: Bitmap,
    /// Ordered, so a file's blocks past a cut are found without scanning its size.
    blocks: BTreeMap<(InodeId, BlockIndex), Run>,
    extents: BTreeMap<(InodeId, u64), Extent>,
    /// Extents referring to each io-layout run (by first page): split extents
    /// share a run, which is freed when the last goes. Derived from `extents`.
    run_refs: HashMap<u64, u32>,
    /// Data being freed in bounded steps: file -> first garbage byte (`trim`).
    trims: BTreeMap<InodeId, u64>,
    xattrs: crate::slots::SplitMap<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// Open cross-shard transactions (intents and participant records).
    txns: BTreeMap<u64, Vec<u8>>,
    /// Directories sealed by an rmdir in progress (from `txns`): dir -> seal count.
    sealed: HashMap<InodeId, u32>,
    /// Directories held by clients about to rename over them (`hold_dir`, in
    /// memory only): dir -> (holder, end of the hold on `clock_ns`).
    holds: HashMap<InodeId, Vec<(u64, TimeNs)>>,
    /// Directories removed elsewhere that this shard may hold names of (a
    /// bigdir's), remembered so new names in them are refused (`gone_dir`).
    gone: txn::GoneDirs,
    /// Directories whose layout changed lately (`relaid_dir`).
    relaid: txn::Relaid,
    /// Next transaction sequence number, and the logged floor it must stay
    /// under (`follow.rs`).
    txn_next: u64,
    txn_floor: u64,
    /// No inode number at or above it was handed out (logged, `follow.rs`).
    ino_floor: u64,
    /// The next floor, logged, and the commit that makes it durable.
    ino_floor_next: Option<(u64, u64)>,
    /// Icache misses read in the background (`set_defer_misses`), and what
    /// the last operation stopped at, if it did.
    defer_misses: bool,
    deferred: Option<DeferredOn>,
    /// Follow-ups logged since the last commit, and those durable and not yet
    /// taken by the worker.
    follow_pending: Vec<follow::FollowUp>,
    follow_ready: Vec<follow::FollowUp>,
    wal: Wal,
    next_ino_seq: u64,
    /// Bytes the tables take in a checkpoint; bounded by the checkpoint region.
    table_bytes: u64,
    /// Pages freed since the last commit: reusable only once the change is durable.
    pending_free: Vec<Run>,
    /// Data pages written since the last sync.
    data_unsynced: bool,
    /// Changes of the operation in progress, and their encoding (its WAL record).
    op_changes: usize,
    record: Vec<u8>,
    /// Set when memory and log may disagree (a device error inside an apply).
    failed: Option<String>,
    /// The wall clock as the worker last set it.
    clock_ns: TimeNs,
    /// The time of the operation in progress: the clock, but always past the
    /// previous operation's, so no two changes on this shard share a time and
    /// an inode's `ctime` is a version (the FUSE mount keeps pages by it).
    op_ns: TimeNs,
    stats: ShardStats,
    /// Data pages as the device holds them, and where sequential readers are.
    read_cache: cache::PageCache,
    readers: cache::Readers,
    /// Data runs written and not yet on the device.
    writes: dataio::DataIo,
    /// The group commit under way, and how many started and finished (`commit.rs`).
    committing: Option<commit::Committing>,
    /// The checkpoint under way (`checkpoint.rs`).
    ckpt: Option<checkpoint::Checkpointing>,
    /// Entries a checkpoint encodes per poll, and the largest image it may
    /// write (the checkpoint region).
    ckpt_slice: usize,
    ckpt_image_limit: u64,
    /// The key lists of the last checkpoint's image, reused by the next.
    ckpt_keys: tables::KeyLists,
    /// An image buffer a larger one replaced, given back a piece per poll.
    ckpt_retired: Vec<u8>,
    /// Times a checkpoint's snapshot moved the log to a fresh half.
    log_moves: u64,
    commits_started: u64,
    commits_done: u64,
}

/// What a zone holds ([`Shard::probe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zone {
    /// Never formatted: its superblock page is all zeros.
    Empty,
    /// A format intent ([`Shard::mark_formatting`]): a format of the device
    /// for this zone-0 shard began and did not finish.
    Cut(ShardId),
    /// Formatted for this shard.
    Formatted(ShardId),
}

/// Reserves everything of the zone but its data pages (superblock, metadata,
/// checkpoints, WAL), so only data writes can meet a full disk.
fn reserve<D: Device>(io: &mut DevIo<D>, geo: &Geometry) -> Result<(), StoreError> {
    let (offset, bytes) = (geo.zone_offset, geo.data_page * PAGE_SIZE);
    io.device_mut().reserve(offset, bytes).map_err(|error| StoreError::Reserve {
        bytes,
        offset,
        error,
    })
}

impl<D: Device> Shard<D> {
    /// Formats a zone on `dev` (mkfs) and opens it. The superblock page is
    /// written last, once the zone's first checkpoint is on the device: what
    /// was there before (nothing, or a format intent, [`Shard::mark_formatting`])
    /// stays until then, so a format cut short never leaves a zone that reads
    /// as formatted and cannot be opened.
    pub fn format(
        dev: D,
        fopts: &FormatOptions,
        opts: ShardOptions,
    ) -> Result<Shard<D>, StoreError> {
        let geo = Geometry::compute(fopts)?;
        if geo.zone_offset + geo.zone_bytes > dev.size_bytes() {
            return Err(StoreError::Geometry(format!(
                "zone {}..{} does not fit the device of {} bytes",
                geo.zone_offset,
                geo.zone_offset + geo.zone_bytes,
                dev.size_bytes()
            )));
        }
        let mut io = DevIo::new(dev);
        reserve(&mut io, &geo)?;
        // Zero the headers and the metadata area (slots must read as empty), and the
        // start of each half of the WAL.
        // The superblock page is written last.
        let mut reqs = vec![write_req(geo.offset(1), &[0u8; 64])];
        reqs.push(write_req(geo.offset(2), &[0u8; 64]));
        let zero_chunk_pages = 256u64;
        let half = geo.wal_pages / 2;
        for (first, count) in
            [(geo.meta_page, geo.meta_pages), (geo.wal_page, 1), (geo.wal_page + half, 1)]
        {
            let mut p = first;
            while p < first + count {
                let n = zero_chunk_pages.min(first + count - p);
                reqs.push(IoRequest {
                    tag: 0,
                    kind: IoKind::Write,
                    offset: geo.offset(p),
                    buf: AlignedBuf::zeroed((n * PAGE_SIZE) as usize),
                });
                p += n;
            }
        }
        for c in io.run(reqs) {
            c.result?;
        }
        let superblock = geo.encode_superblock();
        let mut shard = Shard::empty(io, geo, opts, 0, 1, 1);
        if fopts.create_root {
            shard.create_root()?;
        }
        // Written and synced: the header, then the superblock, each behind a sync.
        shard.checkpoint()?;
        if let Some(ms) = pfs_core::failpoint::setting("format.hold_ms") {
            if fopts.zone_offset == 0 {
                eprintln!("failpoint format.hold_ms: zone 0's superblock waits {ms} ms");
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
        let offset = shard.geo.offset(0);
        for reqs in [vec![write_req(offset, &superblock)], vec![sync_req()]] {
            for c in shard.io.run(reqs) {
                c.result?;
            }
        }
        Ok(shard)
    }

    /// Reads the superblock of the zone at `zone_offset` and returns its device
    /// with what the zone holds. A damaged superblock is an error.
    pub fn probe(dev: D, zone_offset: u64) -> Result<(D, Zone), StoreError> {
        let mut io = DevIo::new(dev);
        let sb = read_pages(&mut io, zone_offset, 1)?;
        let dev = io.into_device();
        if sb.iter().all(|&b| b == 0) {
            return Ok((dev, Zone::Empty));
        }
        if let Some(shard) = geometry::decode_format_intent(&sb) {
            return Ok((dev, Zone::Cut(shard)));
        }
        let geo = Geometry::decode_superblock(&sb)?;
        Ok((dev, Zone::Formatted(geo.shard)))
    }

    /// Writes a format intent for `shard` over the superblock page at
    /// `zone_offset` (zone 0) and syncs it: until zone 0's format writes its
    /// superblock there, [`probe`](Self::probe) reads the device as a format
    /// cut short, for that shard.
    pub fn mark_formatting(dev: D, zone_offset: u64, shard: ShardId) -> Result<D, StoreError> {
        let mut io = DevIo::new(dev);
        let intent = geometry::encode_format_intent(shard);
        for reqs in [vec![write_req(zone_offset, &intent)], vec![sync_req()]] {
            for c in io.run(reqs) {
                c.result?;
            }
        }
        Ok(io.into_device())
    }

    /// Opens a formatted zone at byte `zone_offset`: loads the newest valid
    /// checkpoint, replays the WAL after it, and checkpoints.
    pub fn open(dev: D, zone_offset: u64, opts: ShardOptions) -> Result<Shard<D>, StoreError> {
        let mut io = DevIo::new(dev);
        let sb = read_pages(&mut io, zone_offset, 3)?;
        let geo = Geometry::decode_superblock(&sb[..PAGE_SIZE as usize])?;
        if geo.zone_offset != zone_offset {
            return Err(StoreError::Corruption(format!(
                "superblock says the zone starts at {}, opened at {zone_offset}",
                geo.zone_offset
            )));
        }
        // A zone formatted before reservations existed gets them now.
        reserve(&mut io, &geo)?;
        let headers = [1usize, 2].map(|p| {
            geometry::CheckpointHeader::decode(
                &sb[p * PAGE_SIZE as usize..(p + 1) * PAGE_SIZE as usize],
                geo.format_id,
            )
        });
        let header = headers
            .iter()
            .flatten()
            .max_by_key(|h| h.gen)
            .copied()
            .ok_or_else(|| StoreError::Corruption("no valid checkpoint header".into()))?;
        if header.tables_len > geo.ckpt_pages * PAGE_SIZE || header.region > 1 {
            return Err(StoreError::Corruption(format!(
                "checkpoint header out of bounds: {header:?}"
            )));
        }
        let pages = header.tables_len.div_ceil(PAGE_SIZE);
        let raw = read_pages(&mut io, geo.offset(geo.ckpt_page[header.region as usize]), pages)?;
        let tables = &raw[..header.tables_len as usize];
        if crc32c::crc32c(tables) != header.tables_crc {
            return Err(StoreError::Corruption(format!(
                "checkpoint {} tables checksum mismatch",
                header.gen
            )));
        }
        let mut shard =
            Shard::empty(io, geo, opts, header.gen, header.first_lsn, header.next_ino_seq);
        shard.stats.opened_gen = header.gen;
        shard.load_tables(tables)?;
        // The generation's half, then the next generation's records that
        // follow it in the other half: a checkpoint that was under way logged
        // there after its snapshot (`checkpoint.rs`).
        let mut records = Vec::new();
        let mut next_lsn = header.first_lsn;
        for gen in [header.gen, header.gen + 1] {
            let (offset, bytes) = geo.wal_half(gen);
            let scanned = Wal::scan(&mut shard.io, offset, bytes, gen, next_lsn, geo.format_id)?;
            next_lsn += scanned.records.len() as u64;
            records.extend(scanned.records);
        }
        // Replayed records are durable: their Icache blocks may be written back.
        let last_lsn = next_lsn;
        shard.icache.set_durable_lsn(last_lsn);
        for (lsn, payload) in &records {
            for change in Change::decode_all(payload)? {
                shard.apply(&change, *lsn)?;
            }
            shard.stats.replayed += 1;
        }
        // The checkpoint below is of the next generation whatever the log
        // held: its tables must not overwrite the region the header names.
        let (offset, bytes) = geo.wal_half(header.gen);
        shard.wal =
            Wal::new(offset, bytes, header.gen, last_lsn, opts_group(&shard.opts), geo.format_id);
        shard.rebuild_bitmaps()?;
        shard.resume_txn_ids();
        // Every follow-up in the log is durable: the worker sends them again.
        shard.follow_ready = shard.follow_ups();
        // A fresh generation: records beyond the cut can never be mistaken for new ones.
        shard.checkpoint()?;
        Ok(shard)
    }

    fn empty(
        io: DevIo<D>,
        geo: Geometry,
        opts: ShardOptions,
        gen: u64,
        first_lsn: u64,
        next_ino_seq: u64,
    ) -> Shard<D> {
        let icache_blocks = opts.icache_blocks.max(4 * OP_ICACHE_BLOCKS);
        let (wal_offset, wal_bytes) = geo.wal_half(gen);
        Shard {
            icache: Icache::new(
                icache_blocks,
                opts.dirty_ratio,
                geo.offset(geo.meta_page),
                geo.meta_pages,
            ),
            wal: Wal::new(wal_offset, wal_bytes, gen, first_lsn, opts_group(&opts), geo.format_id),
            io,
            dentries: Cart::new(),
            inode_slots: crate::slots::InodeTable::default(),
            slot_bitmap: Bitmap::new(geo.inode_slots),
            page_bitmap: Bitmap::new(geo.data_pages),
            blocks: BTreeMap::new(),
            extents: BTreeMap::new(),
            run_refs: HashMap::new(),
            trims: BTreeMap::new(),
            xattrs: crate::slots::SplitMap::default(),
            txns: BTreeMap::new(),
            sealed: HashMap::new(),
            holds: HashMap::new(),
            gone: txn::GoneDirs::default(),
            relaid: txn::Relaid::default(),
            txn_next: 1,
            txn_floor: 0,
            ino_floor: 0,
            ino_floor_next: None,
            defer_misses: false,
            deferred: None,
            follow_pending: Vec::new(),
            follow_ready: Vec::new(),
            next_ino_seq,
            table_bytes: 0,
            pending_free: Vec::new(),
            data_unsynced: false,
            op_changes: 0,
            record: Vec::with_capacity(MAX_RECORD_BYTES as usize),
            failed: None,
            clock_ns: wall_clock_ns(),
            op_ns: 0,
            stats: ShardStats::default(),
            read_cache: cache::PageCache::new(opts.read_cache_pages),
            writes: dataio::DataIo::default(),
            readers: cache::Readers::default(),
            committing: None,
            ckpt: None,
            ckpt_slice: tables::ENCODE_SLICE,
            ckpt_keys: tables::KeyLists::default(),
            ckpt_retired: Vec::new(),
            log_moves: 0,
            ckpt_image_limit: geo.ckpt_pages * PAGE_SIZE,
            commits_started: 0,
            commits_done: 0,
            geo,
            opts,
        }
    }

    /// The zone geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The shard id.
    pub fn id(&self) -> ShardId {
        self.geo.shard
    }

    /// Counters.
    pub fn stats(&self) -> ShardStats {
        ShardStats {
            icache: self.icache.stats(),
            read_cache_hits: self.read_cache.hits,
            read_cache_misses: self.read_cache.misses,
            device_waits: self.io.waits(),
            held_back: self.io.held_back(),
            ..self.stats
        }
    }

    /// Checkpoints taken since the shard opened (`ShardStats::checkpoints`,
    /// without building the whole record).
    pub fn checkpoints(&self) -> u64 {
        self.stats.checkpoints
    }

    /// Sets the clock used for timestamps (the worker sets it once per tick).
    pub fn set_now(&mut self, now_ns: TimeNs) {
        self.clock_ns = now_ns;
    }

    /// The zone's format id and the generation of its newest checkpoint:
    /// after a checkpoint with nothing logged since, a later
    /// [`Shard::open`] that finds this generation and replays no record
    /// holds exactly this shard (`ShardStats::{opened_gen, replayed}`).
    pub fn checkpoint_state(&self) -> (u64, u64) {
        (self.geo.format_id, self.wal.gen())
    }

    /// Whether `ino` lives on this shard.
    pub fn has_inode(&self, ino: InodeId) -> bool {
        self.inode_slots.contains_key(&ino)
    }

    /// Number of inodes on this shard.
    pub fn inode_count(&self) -> usize {
        self.inode_slots.len()
    }

    /// Gives the device back (after a clean `checkpoint`, or to simulate a crash).
    pub fn into_device(self) -> D {
        self.io.into_device()
    }

    // ---- the operation frame ----

    /// Starts a mutating operation: room in the WAL and the checkpoint for its
    /// record, and a bounded commit group.
    fn begin(&mut self) -> FsResult<()> {
        self.end_request();
        self.check_failed()?;
        self.op_ns = self.clock_ns.max(self.op_ns.saturating_add(1));
        if self.wal.free_bytes() < self.checkpoint_start_free() {
            self.start_checkpoint();
        }
        // The worker encodes a checkpoint's image a slice per round; an
        // operation encodes one too once half the room left at the
        // checkpoint's start is used, so a shard
        // driven by operations alone still finishes its checkpoints.
        let short = MAX_RECORD_BYTES + (self.checkpoint_start_free() - MAX_RECORD_BYTES) / 2;
        self.step_checkpoint(self.wal.free_bytes() < short);
        if self.wal.free_bytes() < MAX_RECORD_BYTES {
            self.make_log_room()?;
        } else if self.wal.group_overfull_past(self.unstoppable_room())
            || self.icache.clean_blocks() < OP_ICACHE_BLOCKS
        {
            // Dirty blocks can be written back (and so evicted) only once their
            // records are durable: a commit before the Icache runs out of
            // clean ones, or when the pending records reach two groups.
            self.commit_first()?;
        } else if self.wal.group_full() || self.icache.clean_blocks() < 2 * OP_ICACHE_BLOCKS {
            // Half way there: a commit starts beside the operations, so they
            // rarely get to wait for one.
            self.start_commit()?;
        }
        Ok(())
    }

    /// Whether [`begin`](Self::begin) may wait now, for an operation that
    /// cannot stop: for room in the log, or for a commit (the pending records
    /// at two groups, the Icache short of clean blocks). A request that
    /// applies several operations checks it before each after the first.
    pub(super) fn begin_may_wait(&self) -> bool {
        self.wal.free_bytes() < MAX_RECORD_BYTES
            || self.wal.group_overfull()
            || self.icache.clean_blocks() < OP_ICACHE_BLOCKS
    }

    /// How far past two groups the pending records may grow before this
    /// operation waits for a commit: not at all for a request that can still
    /// stop (it changed nothing yet), [`UNSTOPPABLE_ROOM`] for others.
    fn unstoppable_room(&self) -> usize {
        if self.defer_misses && self.op_changes == 0 {
            0
        } else {
            UNSTOPPABLE_ROOM
        }
    }

    /// Makes what was logged so far durable before the operation goes on.
    /// A request that changed nothing yet (`set_defer_misses`) does not wait:
    /// the commit starts (or goes on) beside the requests, and the request
    /// stops to run again once it finished ([`DeferredOn::Commit`]). Others
    /// wait for it (`ShardStats::forced_commits`).
    pub(super) fn commit_first(&mut self) -> FsResult<()> {
        if self.defer_misses && self.op_changes == 0 {
            self.start_commit()?;
            // A commit with nothing to write finished at once; one held back
            // by a checkpoint about to start is waited for below.
            if self.committing.is_some() {
                self.stats.commits_deferred += 1;
                self.deferred = Some(DeferredOn::Commit);
                return Err(FsError::TryAgain);
            }
        }
        self.stats.forced_commits += 1;
        self.commit()
    }

    /// Applies one change and adds it to the operation's record.
    fn log(&mut self, change: Change) -> FsResult<()> {
        // Once a request changed something it cannot run again from the
        // start: its later reads wait for the device (`set_defer_misses`).
        self.defer_misses = false;
        debug_assert!(
            self.deferred.is_none(),
            "a request changed the shard after it stopped at an inode page being read"
        );
        // Never run again a request that changed something.
        self.deferred = None;
        let lsn = self.wal.next_lsn();
        if let Err(e) = self.apply(&change, lsn) {
            let msg = format!("device error while applying a change, shard must be reopened: {e}");
            self.fail(msg.clone());
            return Err(FsError::Io(msg));
        }
        change.encode(&mut self.record);
        self.op_changes += 1;
        Ok(())
    }

    /// Ends a mutating operation: appends its one WAL record.
    fn finish(&mut self) -> FsResult<()> {
        if self.op_changes == 0 {
            return Ok(());
        }
        assert!(
            self.record.len() as u64 <= MAX_RECORD_BYTES,
            "record of {} bytes",
            self.record.len()
        );
        self.wal.append(&self.record);
        self.record.clear();
        self.op_changes = 0;
        Ok(())
    }

    /// Ends whatever operation a request left open. One that failed after it
    /// applied part of its changes leaves memory ahead of the log; rather than
    /// log half an operation, the shard fails: it stops acknowledging, and
    /// recovery from the log brings back the state before that operation. Called
    /// after every request (`exec`), and by `begin`.
    pub fn end_request(&mut self) {
        if self.op_changes > 0 {
            self.fail(format!(
                "an operation failed after {} of its changes were applied; \
                 the shard must be recovered from its log",
                self.op_changes
            ));
            self.record.clear();
            self.op_changes = 0;
        }
    }

    /// Why the shard stopped acknowledging, if it did: the server must stop
    /// (fail-stop) and recover it from the log.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    fn fail(&mut self, why: String) {
        if self.failed.is_none() {
            self.failed = Some(format!("shard {}: {why}", self.id()));
        }
    }

    fn check_failed(&self) -> FsResult<()> {
        match &self.failed {
            Some(m) => Err(FsError::Io(m.clone())),
            None => Ok(()),
        }
    }

    /// Checks that the tables can grow by `bytes` and still fit a checkpoint.
    fn reserve_table_bytes(&self, bytes: u64) -> FsResult<()> {
        if self.table_bytes + bytes > self.geo.ckpt_pages * PAGE_SIZE - 4096 {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    // ---- applying changes (live and replay) ----

    fn apply(&mut self, change: &Change, lsn: u64) -> Result<(), StoreError> {
        match change {
            Change::DentryPut { parent, name, value } => {
                if self.dentries.insert(*parent, name, *value).is_none() {
                    self.table_bytes += tables::dentry_bytes(name);
                }
            }
            Change::DentryDel { parent, name } => {
                if self.dentries.remove(*parent, name).is_some() {
                    self.table_bytes -= tables::dentry_bytes(name);
                }
            }
            Change::InodePut { slot, image } => {
                let ino = Inode::peek_ino(image)?;
                if *slot >= self.geo.inode_slots {
                    return Err(StoreError::Corruption(format!("inode slot {slot} out of range")));
                }
                if self.inode_slots.insert(ino, *slot).is_none() {
                    self.table_bytes += tables::INODE_BYTES;
                }
                self.next_ino_seq = self.next_ino_seq.max(ino.seq() + 1);
                self.icache.write_slot(&mut self.io, *slot, image, lsn)?;
            }
            Change::InodeDel { ino, slot } => {
                if self.inode_slots.remove(ino).is_some() {
                    self.table_bytes -= tables::INODE_BYTES;
                }
                self.icache.write_slot(&mut self.io, *slot, &[0u8; INODE_SLOT_SIZE], lsn)?;
            }
            Change::BlockPut { ino, block, run } => {
                if self.blocks.insert((*ino, *block), *run).is_none() {
                    self.table_bytes += tables::BLOCK_BYTES;
                }
            }
            Change::BlockDel { ino, block } => {
                if self.blocks.remove(&(*ino, *block)).is_some() {
                    self.table_bytes -= tables::BLOCK_BYTES;
                }
            }
            Change::ExtentPut { ino, offset, extent } => {
                match self.extents.insert((*ino, *offset), *extent) {
                    Some(old) => self.unref_run(old.run.page),
                    None => self.table_bytes += tables::EXTENT_BYTES,
                }
                *self.run_refs.entry(extent.run.page).or_default() += 1;
            }
            Change::ExtentDel { ino, offset } => {
                if let Some(old) = self.extents.remove(&(*ino, *offset)) {
                    self.table_bytes -= tables::EXTENT_BYTES;
                    self.unref_run(old.run.page);
                }
            }
            Change::TrimPut { ino, from } => {
                if self.trims.insert(*ino, *from).is_none() {
                    self.table_bytes += tables::TRIM_BYTES;
                }
            }
            Change::TrimDel { ino } => {
                if self.trims.remove(ino).is_some() {
                    self.table_bytes -= tables::TRIM_BYTES;
                }
            }
            Change::XattrPut { ino, name, value } => {
                let map = self.xattrs.get_or_default(*ino);
                if let Some(old) = map.insert(name.clone(), value.clone()) {
                    self.table_bytes -= tables::xattr_bytes(name, &old);
                }
                self.table_bytes += tables::xattr_bytes(name, value);
            }
            Change::TxnPut { id, data } => {
                if let Some(old) = self.txns.insert(*id, data.clone()) {
                    self.table_bytes -= tables::txn_bytes(&old);
                    self.unseal(*id, &old);
                }
                self.table_bytes += tables::txn_bytes(data);
                if let Some(dir) = txn::sealed_dir(*id, data) {
                    *self.sealed.entry(dir).or_default() += 1;
                }
            }
            Change::TxnDel { id } => {
                if let Some(old) = self.txns.remove(id) {
                    self.table_bytes -= tables::txn_bytes(&old);
                    self.unseal(*id, &old);
                }
            }
            Change::XattrDel { ino, name } => {
                if let Some(map) = self.xattrs.get_mut(ino) {
                    if let Some(old) = map.remove(name) {
                        self.table_bytes -= tables::xattr_bytes(name, &old);
                    }
                    if map.is_empty() {
                        self.xattrs.remove(ino);
                    }
                }
            }
        }
        Ok(())
    }

    fn unref_run(&mut self, page: u64) {
        let n = self.run_refs.get_mut(&page).expect("extent run without a reference count");
        *n -= 1;
        if *n == 0 {
            self.run_refs.remove(&page);
        }
    }

    fn unseal(&mut self, id: u64, data: &[u8]) {
        if let Some(dir) = txn::sealed_dir(id, data) {
            if let Some(n) = self.sealed.get_mut(&dir) {
                *n -= 1;
                if *n == 0 {
                    self.sealed.remove(&dir);
                }
            }
        }
    }

    /// Rebuilds both allocation bitmaps from the tables (after recovery).
    fn rebuild_bitmaps(&mut self) -> Result<(), StoreError> {
        self.slot_bitmap = Bitmap::new(self.geo.inode_slots);
        self.page_bitmap = Bitmap::new(self.geo.data_pages);
        let slots: Vec<(InodeId, u64)> = self.inode_slots.iter().map(|(i, s)| (*i, *s)).collect();
        let mut runs: Vec<Run> = self.blocks.values().copied().collect();
        let mut seen = HashSet::new();
        for e in self.extents.values() {
            if seen.insert(e.run.page) {
                runs.push(e.run);
            }
        }
        for (ino, slot) in slots {
            if slot >= self.geo.inode_slots || self.slot_bitmap.get(slot) {
                return Err(StoreError::Corruption(format!(
                    "inode {ino}: slot {slot} invalid or shared"
                )));
            }
            self.slot_bitmap.set_run(slot, 1);
            let inode = self.load_inode_at(slot, ino)?;
            runs.extend(inode.first_block);
        }
        for run in runs {
            let end = run.page + run.pages as u64;
            if end > self.geo.data_pages || (run.page..end).any(|p| self.page_bitmap.get(p)) {
                return Err(StoreError::Corruption(format!("data run {run:?} invalid or shared")));
            }
            self.page_bitmap.set_run(run.page, run.pages as u64);
        }
        Ok(())
    }

    // ---- inodes ----

    fn load_inode_at(&mut self, slot: u64, ino: InodeId) -> Result<Inode, StoreError> {
        let found = match self.icache.resident_slot(slot) {
            Some(image) => Inode::decode(image)?,
            None => {
                if self.defer_misses && self.op_changes == 0 {
                    // Not in memory: read it in the background and have the
                    // request run again once it is (`set_defer_misses`).
                    if let Some(on) = self.page_read_stop(slot) {
                        self.deferred = Some(on);
                        return Err(StoreError::Fs(FsError::TryAgain));
                    }
                }
                Inode::decode(&self.icache.read_slot(&mut self.io, slot)?)?
            }
        };
        match found {
            Some(inode) if inode.ino == ino => Ok(inode),
            other => Err(StoreError::Corruption(format!(
                "slot {slot} should hold inode {ino}, holds {:?}",
                other.map(|i| i.ino)
            ))),
        }
    }

    /// The inode `ino`, or `NotFound` if it does not live here.
    pub(crate) fn inode(&mut self, ino: InodeId) -> FsResult<Inode> {
        let slot = *self.inode_slots.get(&ino).ok_or(FsError::NotFound)?;
        Ok(self.load_inode_at(slot, ino)?)
    }

    /// Logs a new image of an existing inode.
    fn put_inode(&mut self, inode: &Inode) -> FsResult<()> {
        let slot = *self.inode_slots.get(&inode.ino).expect("put_inode of an unknown inode");
        let mut image = Box::new([0u8; INODE_SLOT_SIZE]);
        inode.encode(&mut image);
        self.log(Change::InodePut { slot, image })
    }

    /// Allocates a slot and an inode number, and logs the new inode.
    fn new_inode(&mut self, mut inode: Inode) -> FsResult<Inode> {
        self.reserve_table_bytes(tables::INODE_BYTES)?;
        let slot = self.slot_bitmap.alloc().ok_or(FsError::NoSpace)?;
        // Read first: a device error here fails only this operation. A page
        // whose other slots are all free is not read at all.
        let first = slot - slot % crate::icache::INODES_PER_BLOCK;
        let page_free = (first..first + crate::icache::INODES_PER_BLOCK)
            .filter(|&s| s != slot && s < self.geo.inode_slots)
            .all(|s| !self.slot_bitmap.get(s));
        let stop = match self.defer_misses && self.op_changes == 0 {
            // A fresh page is not read, but it may be being written back or
            // read, or take a block only once a write-back lands.
            true if page_free => self.icache.blank_busy(slot).then_some(DeferredOn::InodePageWait),
            true => self.page_read_stop(slot),
            false => None,
        };
        if let Some(on) = stop {
            // Its page is not in memory (and holds other inodes), or cannot
            // be made so without waiting: read it in the background and have
            // the request run again once it is (`set_defer_misses`), the
            // slot given back meanwhile (the next allocation takes it again).
            self.slot_bitmap.clear_run(slot, 1);
            self.deferred = Some(on);
            return Err(FsError::TryAgain);
        }
        let loaded = if page_free {
            self.icache.load_blank(&mut self.io, slot)
        } else {
            self.icache.read_slot(&mut self.io, slot).map(|_| ())
        };
        if let Err(e) = loaded {
            self.slot_bitmap.clear_run(slot, 1);
            return Err(e.into());
        }
        inode.ino = InodeId::compose(self.geo.shard, self.next_ino_seq);
        let mut image = Box::new([0u8; INODE_SLOT_SIZE]);
        inode.encode(&mut image);
        self.log(Change::InodePut { slot, image })?;
        Ok(inode)
    }

    /// Logs the removal of inode `ino` and frees its slot, data and xattrs.
    /// Data and xattrs that do not fit this operation's record are left to a trim.
    pub(super) fn drop_inode(&mut self, inode: &Inode) -> FsResult<()> {
        self.free_data_from(&mut inode.clone(), 0, true)?;
        let slot = *self.inode_slots.get(&inode.ino).expect("drop of an unknown inode");
        self.log(Change::InodeDel { ino: inode.ino, slot })?;
        self.slot_bitmap.clear_run(slot, 1);
        Ok(())
    }

    /// While set, an operation that needs an inode whose metadata page is not
    /// in memory starts reading it in the background and fails with
    /// `TryAgain` instead of waiting for the device, and
    /// [`take_deferred`](Self::take_deferred) says so: the worker
    /// runs the request again once [`icache_reads_done`](Self::icache_reads_done)
    /// moved. A partial block write whose old bytes memory does not hold
    /// does the same with them (a read into the read-ahead runs, or the
    /// write of them in flight), and runs again once
    /// [`data_requests_done`](Self::data_requests_done) moved. Only until the request first changes something: the first
    /// logged change turns it off, so a request is never run again after it
    /// changed the shard (a create whose reply then reads attributes).
    pub fn set_defer_misses(&mut self, on: bool) {
        self.defer_misses = on;
    }

    /// The attributes of the first of `inos`, in order, `None` for one that
    /// lives on another shard: a `ReadDir` with attributes.
    ///
    /// Without misses deferred, of all of them. With misses deferred
    /// (`set_defer_misses`) it never waits for the device: when the first
    /// inode of this shard is not in memory, the pages of the first ones are
    /// read together in the background (at most 64, and a quarter of the
    /// Icache, so they are still there when the request runs again) and the
    /// request stops as a miss does (`TryAgain`); otherwise it answers up to
    /// the first inode not in memory, and starts reading the pages of the
    /// next ones for the call that lists on from there. Only when no read can
    /// start (no clean Icache block) is the first page read waiting, and the
    /// answer is that one inode's.
    pub fn attrs_of(&mut self, inos: &[InodeId]) -> FsResult<Vec<Option<FileAttr>>> {
        let slots: Vec<Option<u64>> =
            inos.iter().map(|ino| self.inode_slots.get(ino).copied()).collect();
        let mut answer = slots.len();
        if self.defer_misses && self.op_changes == 0 {
            let cold = slots.iter().position(|s| s.is_some_and(|s| !self.icache.resident(s)));
            match cold {
                None => {}
                Some(0) => {
                    let later = slots.iter().flatten().copied().collect();
                    let max = self.listing_prefetch_max();
                    if let Some(on) = self.start_page_reads(later, max) {
                        self.deferred = Some(on);
                        return Err(FsError::TryAgain);
                    }
                    answer = 1;
                }
                Some(cold) => answer = cold,
            }
        }
        let mut attrs = Vec::with_capacity(answer);
        for (slot, &ino) in slots.iter().zip(inos).take(answer) {
            attrs.push(match *slot {
                Some(slot) => Some(self.load_inode_at(slot, ino)?.attr(PAGE_SIZE)),
                None => None,
            });
        }
        if answer < slots.len() {
            let later = slots[answer..].iter().flatten().copied().collect();
            let max = self.listing_prefetch_max();
            self.start_page_reads(later, max);
        }
        Ok(attrs)
    }

    /// Inode pages a listing reads ahead at once: at most 64, and a quarter
    /// of the Icache, so the pages read for a request that stopped are still
    /// in memory when it runs again.
    fn listing_prefetch_max(&self) -> usize {
        (self.icache.capacity() / 4).clamp(1, 64)
    }

    /// With misses deferred (`set_defer_misses`) and nothing changed yet,
    /// starts reading the pages of those of `inos` that live here and are not
    /// in memory, and stops the operation (`TryAgain`, `DeferredOn::InodePage`)
    /// when any is being read: an operation calls it with the inodes it will
    /// change, before its first change, so none of them misses afterwards
    /// (where a miss can no longer stop and waits for the device).
    pub fn warm_inodes(&mut self, inos: &[InodeId]) -> FsResult<()> {
        if !self.defer_misses || self.op_changes != 0 {
            return Ok(());
        }
        let slots: Vec<u64> =
            inos.iter().filter_map(|ino| self.inode_slots.get(ino).copied()).collect();
        if slots.iter().all(|&s| self.icache.resident(s)) {
            // Most recently used: a new inode's page taken later in the
            // operation evicts another.
            for &slot in &slots {
                self.icache.touch_slot(slot);
            }
            return Ok(());
        }
        self.prefetch_slots(slots)
    }

    /// Starts the background read of the page of `slot`, not in memory:
    /// what the request stops at, or `None` if it must load it waiting
    /// (`Icache::start_read`).
    fn page_read_stop(&mut self, slot: u64) -> Option<DeferredOn> {
        match self.icache.start_read(&mut self.io, slot) {
            PageRead::Started => Some(DeferredOn::InodePage),
            PageRead::InFlight | PageRead::NoRoom => Some(DeferredOn::InodePageWait),
            PageRead::Load => None,
        }
    }

    /// Starts background reads of the pages of `slots` not in memory (at
    /// most 64 pages), and stops the request as a miss does when any of them
    /// is being read, or could not start for the reads in flight
    /// ([`warm_inodes`](Self::warm_inodes)).
    fn prefetch_slots(&mut self, slots: Vec<u64>) -> FsResult<()> {
        if let Some(on) = self.start_page_reads(slots, 64) {
            self.deferred = Some(on);
            return Err(FsError::TryAgain);
        }
        Ok(())
    }

    /// Starts background reads of the pages of `slots` not in memory, in
    /// order, at most `max` pages; returns what the request stops at: it
    /// started reading some (`InodePage`), or they are being read already or
    /// could not start for the reads in flight (`InodePageWait`). One that
    /// cannot start otherwise (its last read failed, no clean block and none
    /// being written) is loaded waiting when its turn comes.
    fn start_page_reads(&mut self, slots: Vec<u64>, max: usize) -> Option<DeferredOn> {
        // The resident ones first, so reading the others does not evict them.
        for &slot in &slots {
            self.icache.touch_slot(slot);
        }
        let mut pages: Vec<u64> = Vec::new();
        let (mut started, mut waits) = (false, false);
        for slot in slots {
            let page = slot / crate::icache::INODES_PER_BLOCK;
            if self.icache.resident(slot) || pages.contains(&page) {
                continue;
            }
            if pages.len() == max {
                break;
            }
            match self.icache.start_read(&mut self.io, slot) {
                PageRead::Started => {
                    started = true;
                    pages.push(page);
                }
                PageRead::InFlight => {
                    waits = true;
                    pages.push(page);
                }
                PageRead::NoRoom => {
                    waits = true;
                    break;
                }
                PageRead::Load => {}
            }
        }
        match (started, waits) {
            (true, _) => Some(DeferredOn::InodePage),
            (false, true) => Some(DeferredOn::InodePageWait),
            (false, false) => None,
        }
    }

    /// Whether the last operation stopped at an inode page or data pages
    /// being read or written (`set_defer_misses`); clears it.
    pub fn take_deferred_miss(&mut self) -> bool {
        self.take_deferred().is_some()
    }

    /// What the last operation stopped at, if it did (`set_defer_misses`);
    /// clears it.
    pub fn take_deferred(&mut self) -> Option<DeferredOn> {
        self.deferred.take()
    }

    /// Collects finished background reads of inode pages and write-backs;
    /// returns how many of both finished so far, in all: a request stopped
    /// at an inode page (`DeferredOn::InodePage`) waits for a read, or for a
    /// write-back of the page or of a block it can then take. A failed
    /// write-back fails the shard, as after a commit.
    pub fn icache_reads_done(&mut self) -> u64 {
        if let Err(e) = self.icache.poll(&mut self.io) {
            self.fail(format!("writing back inodes: {e}"));
        }
        let st = self.icache.stats();
        st.background_reads_done + st.writebacks_done
    }

    /// The counts of background requests finished so far, as last collected
    /// (no polling): inode page reads ([`icache_reads_done`](Self::icache_reads_done)),
    /// the data requests all finished below a number
    /// ([`data_settled`](Self::data_settled)), commits and the log's moves. A
    /// request that stops (`set_defer_misses`) runs again once the count it
    /// waits for moved past what it was before the request ran (for data:
    /// once it reached [`data_issued`](Self::data_issued) at the stop).
    pub fn background_progress(&self) -> (u64, u64, u64, u64) {
        let st = self.icache.stats();
        let icache = st.background_reads_done + st.writebacks_done;
        (icache, self.data_settled(), self.commits_done, self.log_moves)
    }

    /// Times a checkpoint's snapshot moved the log to a fresh half: room for
    /// a request stopped at a full log ([`DeferredOn::LogRoom`]).
    pub fn log_moves(&self) -> u64 {
        self.log_moves
    }

    /// Whether inode pages are being read in the background.
    pub fn icache_reading(&self) -> bool {
        let st = self.icache.stats();
        st.background_reads_done < st.background_reads
    }

    /// The time of the operation in progress (set by [`Shard::begin`]).
    fn now(&self) -> TimeNs {
        self.op_ns
    }
}

fn opts_group(opts: &ShardOptions) -> usize {
    opts.wal_group_bytes.clamp(64 << 10, 64 << 20)
}

fn write_req(offset: u64, data: &[u8]) -> IoRequest {
    IoRequest { tag: 0, kind: IoKind::Write, offset, buf: AlignedBuf::from_slice(data) }
}

fn sync_req() -> IoRequest {
    IoRequest { tag: 0, kind: IoKind::Sync, offset: 0, buf: AlignedBuf::zeroed(0) }
}

fn read_pages<D: Device>(
    io: &mut DevIo<D>,
    offset: u64,
    pages: u64,
) -> Result<Vec<u8>, StoreError> {
    Ok(io.read_bytes(offset, pages * PAGE_SIZE)?)
}

fn wall_clock_ns() -> TimeNs {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as TimeNs)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
