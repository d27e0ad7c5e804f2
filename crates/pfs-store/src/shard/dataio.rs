//! Asynchronous data I/O: writes and reads that do not hold up the worker, and
//! read-ahead that reads while the worker serves.
//!
//! **Writes.** A data write (`write_blocks`, `write_io`) fills its new run's pages in a
//! device buffer and *stages* them here instead of waiting for the device, so
//! its reply goes out at once. Staged runs are submitted as asynchronous writes
//! once [`BATCH_BYTES`] have gathered, and at every commit. Runs that lie next to
//! each other on the device (the pages of consecutive small files, the runs an
//! append leaves) go out as one write of up to `BATCH_BYTES`: a thousand 3901-byte
//! files cost a few device writes instead of a thousand.
//!
//! The contract is unchanged: a commit waits for every data request submitted
//! before it started before it syncs the data and writes the log, so whatever a
//! durable record maps is on the device. Before that, the written pages are read from memory: staged runs
//! from their buffers; a read that needs pages whose write is in flight waits for
//! the data writes first. Once written, the runs of partly filled blocks go to
//! the read cache, as they did when writes were synchronous.
//!
//! A data write that fails after its reply is an acknowledged write lost: the
//! shard fails (fail-stop), and recovery brings back the last commit.
//!
//! A staged write cannot meet a full disk: a data file that is sparse allocates
//! its blocks when pages are first handed out (`alloc_data_run`, 64 MiB at a
//! time, or just the run when the disk has less), so a full disk under it is
//! `ENOSPC` for the write that asked, as when writes were synchronous.
//!
//! A staged run that a later write replaced before the commit is written all
//! the same: a log cut by a crash inside its commit can end between the record
//! that mapped the run and the one that replaced it.
//!
//! **Reads.** A read whose pages are not all in memory submits the device
//! reads of the missing pieces and returns [`ReadStart::Pending`]; the worker
//! serves other requests and sends the reply when
//! [`Shard::take_finished_reads`] hands the bytes over. Such reads need no
//! ordering with writes: pages a mapped run holds are never rewritten in place,
//! and the pages a later write or truncate unmaps are freed only after a commit,
//! which first waits for every data request submitted before it, reads
//! included. At most `io_queue_depth` device requests are on the device, the
//! others wait in the shard's queue (`io.rs`); each pending read has one, so
//! they are bounded by the clients' requests.
//!
//! **Read-ahead.** Pages a sequential reader will want next are read
//! asynchronously ([`Shard::prefetch`]), in device reads of at most the
//! reader's transfer, and kept in their device buffers (`Ahead`), not copied
//! into the page cache; the read that triggered it is answered at once. A
//! read whose pieces a read-ahead holds copies them from its buffer; one whose
//! pieces are still being read ahead joins that device read (it becomes
//! pending, answered when the read-ahead finishes) instead of reading them
//! again or waiting. A piece that spans two read-ahead runs, or one in part,
//! is split at their edges first (`split_at_ahead`), and a window skips the
//! pages a read-ahead already holds. A buffer is dropped when reads took all
//! of its bytes (the readers have gone past it), when pages it holds are
//! written anew, or, oldest first, to make room: read-ahead buffers hold at most half the
//! read cache's size (`read_cache_mib`), in flight or not. A failed read-ahead
//! fails the reads that joined it (`EIO`, as their own device read would
//! have) and keeps nothing.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::data::Piece;
use super::{DeferredOn, Shard, PAGE_SIZE};
use crate::device::{AlignedBuf, Device, IoCompletion, IoKind, IoRequest};
use pfs_core::{FsError, FsResult};

/// Staged bytes that start a submission, and the longest write one submission
/// makes of neighbouring runs.
pub const BATCH_BYTES: usize = 1 << 20;

/// Bytes of data writes that may wait for room in a full device queue
/// (`DevIo::held_data_bytes`) before a data write that can still stop does:
/// the memory a slow device lets writes take beyond its queue, plus the one
/// write of a request that can no longer stop.
pub(super) const HELD_DATA_MAX: usize = 4 * BATCH_BYTES;

/// Data pages reserved on the device at a time (64 MiB).
const RESERVE_CHUNK_PAGES: u64 = (64 << 20) / PAGE_SIZE;

/// A run written by an operation, not yet submitted.
#[derive(Debug)]
struct Staged {
    pages: u64,
    buf: AlignedBuf,
    /// A partly filled block: worth the read cache once written.
    cache: bool,
}

/// What a device request in flight is for.
#[derive(Debug)]
enum Purpose {
    /// Neighbouring runs written (their partly filled blocks went to the read
    /// cache at submit).
    Write,
    /// Pages read ahead into the read cache.
    ReadAhead,
    /// Neighbouring pieces of pending read `id`.
    Read { id: u64, parts: Vec<Part> },
}

/// A piece of a read within one device read of neighbouring pages
/// ([`device_reads`]): its `pages` pages from data page `page` hold bytes
/// `skip..skip + n` (from the start of `page`) that go to `at` of the output;
/// `cache`: the pages are worth the read cache (a partly filled block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Part {
    pub page: u64,
    pub pages: u64,
    pub at: usize,
    pub skip: usize,
    pub n: usize,
    pub cache: bool,
}

impl Part {
    /// Copies this part out of `buf`, the device read that starts at data
    /// page `first`, into `out`; puts its pages in `cache` when worth it.
    pub(super) fn deliver(
        &self,
        first: u64,
        buf: &[u8],
        out: &mut [u8],
        cache: &mut super::cache::PageCache,
    ) {
        let from = ((self.page - first) * PAGE_SIZE) as usize;
        out[self.at..self.at + self.n].copy_from_slice(&buf[from + self.skip..][..self.n]);
        if self.cache {
            cache.put(self.page, &buf[from..from + (self.pages * PAGE_SIZE) as usize]);
        }
    }
}

/// The device reads of `pieces` (in file order), neighbours on the device as
/// one read of at most `max_pages` pages (a single piece may be longer):
/// `(first data page, pages, parts)`. A striped file's blocks on one shard
/// were written one after the other, so a read of 8 of its blocks is one
/// device read of 512 KiB instead of 8 of 64 KiB. `block`: the block size,
/// which says whether a run is partly filled (`Part::cache`).
pub(super) fn device_reads(
    pieces: &[Piece],
    block: u64,
    max_pages: u64,
) -> Vec<(u64, u64, Vec<Part>)> {
    let mut reads: Vec<(u64, u64, Vec<Part>)> = Vec::new();
    for &(run, first, pages, at, skip, n) in pieces {
        let page = run.page + first;
        let part = Part { page, pages, at, skip, n, cache: u64::from(run.valid) < block };
        match reads.last_mut() {
            Some((start, len, parts)) if *start + *len == page && *len + pages <= max_pages => {
                *len += pages;
                parts.push(part);
            }
            _ => reads.push((page, pages, vec![part])),
        }
    }
    reads
}

/// A run of pages read ahead: in flight (`buf` is `None`), or read.
#[derive(Debug)]
struct Ahead {
    pages: u64,
    /// Bytes of memory its buffer holds (the device may round a read up to
    /// a whole buffer of its own): what the read-ahead bound counts.
    held: u64,
    buf: Option<AlignedBuf>,
    /// Bytes reads took from it: once every byte was taken, the readers
    /// went past it and it is dropped. (Several readers of one file take
    /// its parts in any order; a run some bytes of which are never read
    /// waits to be the oldest.)
    taken: u64,
    /// Pieces of pending reads that joined it while in flight: `(read id, part)`.
    waiting: Vec<(u64, Part)>,
}

/// One device request in flight, under its number (its tag).
#[derive(Debug)]
struct InFlight {
    first: u64,
    pages: u64,
    purpose: Purpose,
}

/// A read waiting for its device reads.
#[derive(Debug)]
struct PendingRead {
    out: Vec<u8>,
    /// Device reads not finished yet.
    left: usize,
    error: Option<FsError>,
}

/// How a read started ([`Shard::read_start`]): answered from memory, or
/// waiting for the device (its id comes back from
/// [`Shard::take_finished_reads`]), or held whole by read-ahead buffers the
/// caller sends from (`ReadShape::gather`).
#[derive(Debug, PartialEq, Eq)]
pub enum ReadStart {
    /// The bytes.
    Done(Vec<u8>),
    /// Being read: the id of the read.
    Pending(u64),
    /// In read-ahead buffers, lent until [`Shard::gather_done`].
    Gather(Gathered),
}

/// Zeros that holes and padding of a [`Gathered`] read point at.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// A read that read-ahead runs already read hold whole (`ReadShape::gather`):
/// its bytes as slices of their buffers and of zeros, so the worker copies
/// them once, straight into the reply's ring, instead of into a reply buffer
/// first (and zeroing it before that). The buffers are lent: the shard sees
/// their runs as in flight (nothing drops or reuses them) until
/// [`Shard::gather_done`] takes them back, which the caller must call before
/// anything else runs on the shard.
#[derive(Debug)]
#[must_use = "the read-ahead buffers are lent until Shard::gather_done"]
pub struct Gathered {
    /// The lent buffers: `(first page of their run, buffer)`.
    bufs: Vec<(u64, AlignedBuf)>,
    /// Read-cache pages lent: `(page, bytes)`.
    pages: Vec<(u64, Box<[u8]>)>,
    /// The data in order.
    parts: Vec<GatherPart>,
    /// Bytes of data, holes and padding included.
    len: usize,
}

/// A stretch of a [`Gathered`] read.
#[derive(Clone, Copy, Debug)]
enum GatherPart {
    /// `part`'s bytes from lent buffer `buf`.
    Ahead { buf: usize, part: Part },
    /// `n` bytes from byte `from` of lent read-cache page `page`.
    Cached { page: usize, from: usize, n: usize },
    /// Zeros (a hole, or padding after the data).
    Zeros(usize),
}

impl Gathered {
    /// Bytes of data (holes and padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends the data, in order, as slices to `out`.
    pub fn slices<'a>(&'a self, out: &mut Vec<&'a [u8]>) {
        for p in &self.parts {
            match *p {
                GatherPart::Ahead { buf, part } => {
                    let (start, b) = &self.bufs[buf];
                    let from = ((part.page - start) * PAGE_SIZE) as usize + part.skip;
                    out.push(&b[from..from + part.n]);
                }
                GatherPart::Cached { page, from, n } => {
                    out.push(&self.pages[page].1[from..from + n])
                }
                GatherPart::Zeros(mut n) => {
                    while n > 0 {
                        let k = n.min(ZEROS.len());
                        out.push(&ZEROS[..k]);
                        n -= k;
                    }
                }
            }
        }
    }

    /// The data in one buffer (tests, and comparing reads).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut slices = Vec::new();
        self.slices(&mut slices);
        slices.concat()
    }
}

impl PartialEq for Gathered {
    fn eq(&self, other: &Gathered) -> bool {
        self.to_vec() == other.to_vec()
    }
}

impl Eq for Gathered {}

/// The output a read fills ([`Shard::read_start`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadShape {
    /// Bytes left before the data (zeros), for the caller's header: a reply
    /// frame built around the bytes needs no copy of them
    /// (`pfs_core::wire::READ_REPLY_PREFIX`).
    pub prefix: usize,
    /// Least number of data bytes: zeros follow a short read up to it.
    pub pad: usize,
    /// A read that must go to the device returns [`ReadStart::Pending`]
    /// instead of waiting.
    pub background: bool,
    /// A read that read-ahead runs already read hold whole returns
    /// [`ReadStart::Gather`] (its bytes stay in their buffers; `prefix` is
    /// not part of it).
    pub gather: bool,
}

/// The data runs of a shard between their operation and the device, and the
/// reads under way.
#[derive(Debug, Default)]
pub struct DataIo {
    /// First page -> staged run.
    staged: BTreeMap<u64, Staged>,
    staged_bytes: usize,
    /// Number (the device tag) -> request in flight. Numbers follow
    /// submission order: a commit waits for those below where it started.
    in_flight: BTreeMap<u64, InFlight>,
    /// First page -> pages of the writes and read-aheads in flight, which a
    /// read of those pages waits for. They never overlap one another: pages
    /// are written once per allocation, and a read-ahead skips busy pages.
    busy: BTreeMap<u64, u64>,
    /// The number the next request in flight gets.
    next_seq: u64,
    /// Reads waiting for their device reads, by id, and those finished.
    reads: HashMap<u64, PendingRead>,
    finished: Vec<(u64, FsResult<Vec<u8>>)>,
    next_read: u64,
    /// Chunks of `RESERVE_CHUNK_PAGES` data pages reserved on the device, one
    /// bit each.
    reserved: Vec<u64>,
    /// Runs read ahead, by first page; they never overlap one another.
    ahead: BTreeMap<u64, Ahead>,
    /// Bytes of all of them, in flight or read.
    ahead_bytes: u64,
    /// Their first pages, oldest first (may name runs dropped since).
    ahead_order: VecDeque<u64>,
    /// Data requests (writes, reads, read-aheads) finished so far, in all.
    pub(super) done: u64,
}

impl DataIo {
    /// Copies `out.len()` bytes starting `skip` bytes into page `first` from a
    /// staged run holding all of them; `false` if none does.
    fn read(&self, first: u64, skip: usize, out: &mut [u8]) -> bool {
        let Some((&start, run)) = self.staged.range(..=first).next_back() else {
            return false;
        };
        let at = (first - start) as usize * PAGE_SIZE as usize + skip;
        if at + out.len() > (run.pages * PAGE_SIZE) as usize {
            return false;
        }
        out.copy_from_slice(&run.buf[at..at + out.len()]);
        true
    }

    /// Whether a staged run holds any of the `pages` pages from `first`: the
    /// device does not hold them yet.
    fn staged_overlaps(&self, first: u64, pages: u64) -> bool {
        self.staged.range(..first + pages).next_back().is_some_and(|(&s, r)| s + r.pages > first)
    }

    /// Notes a request about to be submitted; returns its number, the tag to
    /// submit it with.
    fn start(&mut self, first: u64, pages: u64, purpose: Purpose) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if !matches!(purpose, Purpose::Read { .. }) {
            self.busy.insert(first, pages);
        }
        self.in_flight.insert(seq, InFlight { first, pages, purpose });
        seq
    }

    /// The first page of the read-ahead run that holds all `pages` pages
    /// from `page`, if one does.
    fn ahead_at(&self, page: u64, pages: u64) -> Option<u64> {
        let (&first, a) = self.ahead.range(..=page).next_back()?;
        (page + pages <= first + a.pages).then_some(first)
    }

    /// Whether a read-ahead run (in flight or read) holds any of the `pages`
    /// pages from `first`.
    fn ahead_overlaps(&self, first: u64, pages: u64) -> bool {
        self.ahead.range(..first + pages).next_back().is_some_and(|(&s, a)| s + a.pages > first)
    }

    /// The read-ahead runs that hold any of the `pages` pages from `first`:
    /// `(first page, pages)`, in order.
    fn ahead_runs(&self, first: u64, pages: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let from = self.ahead.range(..=first).next_back().map_or(first, |(&s, _)| s);
        self.ahead
            .range(from..first + pages)
            .map(|(&s, a)| (s, a.pages))
            .filter(move |&(s, n)| s + n > first)
    }

    /// The stretches of the `pages` pages from `first` that no read-ahead run
    /// holds, in order.
    fn ahead_gaps(&self, first: u64, pages: u64) -> Vec<(u64, u64)> {
        let end = first + pages;
        let mut gaps = Vec::new();
        let mut at = first;
        for (s, n) in self.ahead_runs(first, pages) {
            if s > at {
                gaps.push((at, s - at));
            }
            at = at.max(s + n);
        }
        if at < end {
            gaps.push((at, end - at));
        }
        gaps
    }

    /// One more piece of pending read `id` arrived (or failed): a read whose
    /// pieces all did is finished.
    fn piece_done(&mut self, id: u64) {
        let r = self.reads.get_mut(&id).expect("a pending read");
        r.left -= 1;
        if r.left == 0 {
            let r = self.reads.remove(&id).expect("seen above");
            self.finished.push((id, r.error.map_or(Ok(r.out), Err)));
        }
    }

    /// Whether a write or read-ahead in flight covers any of the `pages`
    /// pages from `first`.
    fn busy_overlaps(&self, first: u64, pages: u64) -> bool {
        self.busy.range(..first + pages).next_back().is_some_and(|(&start, &n)| start + n > first)
    }

    /// Takes the staged runs, grouped into writes of neighbouring runs of at
    /// most `BATCH_BYTES` (a single run may be longer).
    fn take_groups(&mut self) -> Vec<Vec<(u64, Staged)>> {
        let mut groups: Vec<Vec<(u64, Staged)>> = Vec::new();
        let mut end = u64::MAX;
        let mut bytes = 0;
        for (page, run) in std::mem::take(&mut self.staged) {
            let len = (run.pages * PAGE_SIZE) as usize;
            match groups.last_mut() {
                Some(g) if page == end && bytes + len <= BATCH_BYTES => {
                    bytes += len;
                    g.push((page, run));
                }
                _ => {
                    bytes = len;
                    groups.push(vec![(page, run)]);
                }
            }
            end = page + groups.last().expect("pushed").last().expect("pushed").1.pages;
        }
        self.staged_bytes = 0;
        groups
    }
}

impl<D: Device> Shard<D> {
    /// Allocates a run of `pages` data pages whose blocks the device has
    /// reserved: `ENOSPC` when either is full.
    pub(super) fn alloc_data_run(&mut self, pages: u64) -> FsResult<u64> {
        let page = self.page_bitmap.alloc_run(pages).ok_or(FsError::NoSpace)?;
        if let Err(e) = self.reserve_data_pages(page, pages) {
            self.page_bitmap.clear_run(page, pages);
            return Err(e);
        }
        Ok(page)
    }

    /// Reserves the chunks that `pages` pages from `first` touch; a chunk the
    /// disk has no room for reserves just this run's part of it.
    fn reserve_data_pages(&mut self, first: u64, pages: u64) -> FsResult<()> {
        let total = self.geo.data_pages;
        for chunk in first / RESERVE_CHUNK_PAGES..=(first + pages - 1) / RESERVE_CHUNK_PAGES {
            let (word, bit) = ((chunk / 64) as usize, chunk % 64);
            if self.writes.reserved.get(word).is_some_and(|w| w & (1 << bit) != 0) {
                continue;
            }
            let start = chunk * RESERVE_CHUNK_PAGES;
            let end = (start + RESERVE_CHUNK_PAGES).min(total);
            if self.reserve_pages(start, end).is_ok() {
                if self.writes.reserved.len() <= word {
                    self.writes.reserved.resize(word + 1, 0);
                }
                self.writes.reserved[word] |= 1 << bit;
            } else {
                self.reserve_pages(first.max(start), (first + pages).min(end))?;
            }
        }
        Ok(())
    }

    fn reserve_pages(&mut self, from: u64, to: u64) -> FsResult<()> {
        let offset = self.geo.data_offset(from);
        Ok(self.io.device_mut().reserve(offset, (to - from) * PAGE_SIZE)?)
    }

    /// Stages the new run at page `first` whose pages `buf` holds; a partly
    /// filled block goes to the read cache once written (`cache`).
    pub(super) fn stage_data(&mut self, first: u64, buf: AlignedBuf, cache: bool) {
        let pages = buf.len() as u64 / PAGE_SIZE;
        // The cache and read-ahead may hold what a freed run left on these pages.
        self.read_cache.forget(first, pages);
        self.ahead_forget(first, pages);
        self.writes.staged_bytes += buf.len();
        self.writes.staged.insert(first, Staged { pages, buf, cache });
        self.data_unsynced = true;
        if self.writes.staged_bytes >= BATCH_BYTES {
            self.submit_staged();
        }
    }

    /// Submits every staged run, neighbours as one write.
    fn submit_staged(&mut self) {
        for group in self.writes.take_groups() {
            let first = group[0].0;
            let runs: Vec<(u64, u64, bool)> =
                group.iter().map(|(p, s)| (*p, s.pages, s.cache)).collect();
            let pages: u64 = runs.iter().map(|r| r.1).sum();
            let buf = if group.len() == 1 {
                group.into_iter().next().expect("one run").1.buf
            } else {
                let mut buf = self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize);
                let mut at = 0;
                for (_, s) in group {
                    buf[at..at + s.buf.len()].copy_from_slice(&s.buf);
                    at += s.buf.len();
                    self.io.device_mut().free_buf(s.buf);
                }
                buf
            };
            // A partly filled block is what the next append (or a writer of
            // its other part) reads back: cached now, so a merge need not
            // wait for this write to reach the device.
            let mut at = 0;
            for &(page, pages, cache) in &runs {
                let len = (pages * PAGE_SIZE) as usize;
                if cache {
                    self.read_cache.put(page, &buf[at..at + len]);
                }
                at += len;
            }
            let offset = self.geo.data_offset(first);
            let req = IoRequest { tag: 0, kind: IoKind::Write, offset, buf };
            let tag = self.writes.start(first, pages, Purpose::Write);
            self.stats.data_writes += 1;
            self.io.submit_data(req, tag);
        }
    }

    /// Collects finished data requests without waiting; returns how many. The
    /// worker calls it every round, then sends what
    /// [`take_finished_reads`](Self::take_finished_reads) hands over.
    pub fn poll_data_writes(&mut self) -> usize {
        if self.writes.in_flight.is_empty() {
            return 0;
        }
        let done = self.io.take_data();
        let n = done.len();
        for c in done {
            self.finish_data_write(c);
        }
        n
    }

    /// Submits what is staged; returns the number the next request will get:
    /// every data request submitted so far is numbered below it.
    pub(super) fn submit_data_writes(&mut self) -> u64 {
        self.submit_staged();
        self.writes.next_seq
    }

    /// Every data request numbered below it finished (as last collected, no
    /// polling): the number of the oldest in flight, or the next number when
    /// none is. It only grows. A request stopped at data pages in flight
    /// ([`DeferredOn::Data`](crate::DeferredOn)) runs again once it reached
    /// [`data_issued`](Self::data_issued) as it was at the stop: every request
    /// in flight then, the one it waits for among them, finished.
    pub fn data_settled(&self) -> u64 {
        self.writes.in_flight.keys().next().copied().unwrap_or(self.writes.next_seq)
    }

    /// The number the next data request gets: every one submitted so far is
    /// numbered below it.
    pub fn data_issued(&self) -> u64 {
        self.writes.next_seq
    }

    /// Whether a data request numbered below `seq` is still in flight (after
    /// collecting the finished ones). Reads count too: a commit frees the
    /// pages its operations unmapped only once no read of them is in flight,
    /// so a read never lands in the cache after its pages went to another file.
    pub(super) fn data_requests_before(&mut self, seq: u64) -> bool {
        self.poll_data_writes();
        self.writes.in_flight.range(..seq).next().is_some()
    }

    /// Waits for every data request in flight.
    fn wait_in_flight(&mut self) -> FsResult<()> {
        for c in self.io.wait_data_all() {
            self.finish_data_write(c);
        }
        self.check_failed()
    }

    fn finish_data_write(&mut self, c: IoCompletion) {
        let w = self.writes.in_flight.remove(&c.tag).expect("completion of a data request");
        self.writes.done += 1;
        if !matches!(w.purpose, Purpose::Read { .. }) {
            self.writes.busy.remove(&w.first);
        }
        if matches!(w.purpose, Purpose::ReadAhead) {
            return self.ahead_done(w.first, c.buf, c.result.map_err(FsError::from));
        }
        match (w.purpose, c.result) {
            (Purpose::Write, Ok(())) => {}
            (Purpose::Write, Err(e)) => self.fail(format!(
                "a data write of {} pages at page {} failed after its operation was \
                 acknowledged: {e}",
                w.pages, w.first
            )),
            (Purpose::ReadAhead, _) => unreachable!("handled above"),
            (Purpose::Read { id, parts }, result) => {
                let r = self.writes.reads.get_mut(&id).expect("a piece of a pending read");
                match result {
                    Ok(()) => {
                        for part in &parts {
                            part.deliver(w.first, &c.buf, &mut r.out, &mut self.read_cache);
                        }
                    }
                    // That read fails; the shard goes on (nothing changed).
                    Err(e) => {
                        r.error.get_or_insert(e.into());
                    }
                }
                self.writes.piece_done(id);
            }
        }
        self.io.device_mut().free_buf(c.buf);
    }

    /// A read-ahead of the run at `first` finished: hands its pieces to the
    /// reads that joined it, and keeps the buffer for the next ones.
    fn ahead_done(&mut self, first: u64, buf: AlignedBuf, result: FsResult<()>) {
        let a = self.writes.ahead.get_mut(&first).expect("a read-ahead in flight is kept");
        let waiting = std::mem::take(&mut a.waiting);
        a.taken += waiting.iter().map(|(_, part)| part.n as u64).sum::<u64>();
        let past = a.taken >= a.pages * PAGE_SIZE;
        for (id, part) in waiting {
            let r = self.writes.reads.get_mut(&id).expect("a read that joined a read-ahead");
            match &result {
                Ok(()) => part.deliver(first, &buf, &mut r.out, &mut self.read_cache),
                Err(e) => {
                    r.error.get_or_insert(e.clone());
                }
            }
            self.writes.piece_done(id);
        }
        match result {
            Ok(()) if !past => {
                self.writes.ahead.get_mut(&first).expect("seen above").buf = Some(buf);
            }
            // Read past, or failed: nothing to keep.
            _ => {
                self.ahead_drop(first);
                self.io.device_mut().free_buf(buf);
            }
        }
    }

    /// Drops read-ahead run `start` and gives its buffer back (one in flight
    /// has none yet).
    fn ahead_drop(&mut self, start: u64) {
        let a = self.writes.ahead.remove(&start).expect("a read-ahead run");
        self.writes.ahead_bytes -= a.held;
        if let Some(buf) = a.buf {
            self.io.device_mut().free_buf(buf);
        }
    }

    /// Drops the read-ahead runs that hold any of the `pages` pages from
    /// `first` (they are about to hold something else). None of them is in
    /// flight: pages are freed for reuse only by a commit, which first waits
    /// for every data request submitted before it.
    fn ahead_forget(&mut self, first: u64, pages: u64) {
        while self.writes.ahead_overlaps(first, pages) {
            let (&start, a) =
                self.writes.ahead.range(..first + pages).next_back().expect("overlaps");
            debug_assert!(a.buf.is_some(), "pages read ahead were reused while in flight");
            self.ahead_drop(start);
        }
    }

    /// The most bytes read-ahead holds at once: half the read cache's size.
    pub(super) fn ahead_cap(&self) -> u64 {
        self.opts.read_cache_pages as u64 * PAGE_SIZE / 2
    }

    /// The staged runs, as (first page, pages), in page order (tests).
    #[cfg(test)]
    pub(super) fn staged_runs(&self) -> Vec<(u64, u64)> {
        self.writes.staged.iter().map(|(&p, s)| (p, s.pages)).collect()
    }

    /// Bytes of read-ahead runs held, in flight or read (tests).
    #[cfg(test)]
    pub(super) fn ahead_bytes(&self) -> u64 {
        self.writes.ahead_bytes
    }

    /// Read-ahead runs held, in flight or read (tests).
    #[cfg(test)]
    pub(super) fn ahead_runs(&self) -> usize {
        self.writes.ahead.len()
    }

    /// Makes room for `bytes` more of read-ahead, dropping the oldest runs
    /// already read; `false` if the runs in flight leave no room.
    fn ahead_room(&mut self, bytes: u64) -> bool {
        let cap = self.ahead_cap();
        let mut tries = self.writes.ahead_order.len();
        while self.writes.ahead_bytes + bytes > cap && tries > 0 {
            tries -= 1;
            let Some(first) = self.writes.ahead_order.pop_front() else { break };
            match self.writes.ahead.get(&first) {
                None => {}
                Some(a) if a.buf.is_none() => self.writes.ahead_order.push_back(first),
                Some(_) => self.ahead_drop(first),
            }
        }
        if self.writes.ahead_order.len() > 2 * self.writes.ahead.len() + 64 {
            let ahead = &self.writes.ahead;
            self.writes.ahead_order.retain(|f| ahead.contains_key(f));
        }
        self.writes.ahead_bytes + bytes <= cap
    }

    /// Whether a data write or read-ahead is in flight (a read may have to
    /// settle its pages first: [`settle_data_pages`](Self::settle_data_pages)).
    pub(super) fn data_busy(&self) -> bool {
        !self.writes.busy.is_empty()
    }

    /// Whether a read-ahead still in flight holds all `pages` pages from `page`.
    pub(super) fn ahead_in_flight(&self, page: u64, pages: u64) -> bool {
        self.writes.ahead_at(page, pages).is_some_and(|s| self.writes.ahead[&s].buf.is_none())
    }

    /// Splits each piece of `pieces` at the edges of the read-ahead runs that
    /// hold some of its pages, so that every piece is held by one run whole
    /// or by none. Read-ahead windows end at byte offsets, not at a reader's
    /// pieces: a read often starts in one window's run and ends in the
    /// next's, and unsplit it went to the device for pages memory held.
    pub(super) fn split_at_ahead(&self, pieces: &mut Vec<Piece>) {
        let straddles = |&(run, first, pages, ..): &Piece| {
            let page = run.page + first;
            self.writes.ahead_overlaps(page, pages) && self.writes.ahead_at(page, pages).is_none()
        };
        if self.writes.ahead.is_empty() || !pieces.iter().any(straddles) {
            return;
        }
        let mut split = Vec::with_capacity(pieces.len() + 4);
        for &piece in pieces.iter() {
            let (run, first, pages, ..) = piece;
            let page = run.page + first;
            let mut cuts: Vec<u64> = self
                .writes
                .ahead_runs(page, pages)
                .flat_map(|(s, n)| [s, s + n])
                .filter(|&c| c > page && c < page + pages)
                .collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut rest = piece;
            for cut in cuts {
                let (run, first, pages, at, skip, n) = rest;
                // Pages before the cut: the bytes up to its first byte.
                let head = cut - (run.page + first);
                let bytes = (head * PAGE_SIZE) as usize - skip;
                split.push((run, first, head, at, skip, bytes));
                rest = (run, first + head, pages - head, at + bytes, 0, n - bytes);
            }
            split.push(rest);
        }
        *pieces = split;
    }

    /// Takes the pieces of `pieces` that read-ahead runs hold: those already
    /// read are copied into `out` now; with `join`, those in flight are
    /// returned to wait for (`(run's first page, part)`). The rest stay.
    pub(super) fn take_ahead(
        &mut self,
        pieces: &mut Vec<Piece>,
        out: &mut [u8],
        join: bool,
    ) -> Vec<(u64, Part)> {
        let mut joined = Vec::new();
        if self.writes.ahead.is_empty() {
            return joined;
        }
        let block = u64::from(self.geo.block_size);
        pieces.retain(|&(run, first, pages, at, skip, n)| {
            let page = run.page + first;
            let Some(start) = self.writes.ahead_at(page, pages) else { return true };
            let part = Part { page, pages, at, skip, n, cache: u64::from(run.valid) < block };
            let a = self.writes.ahead.get_mut(&start).expect("found");
            let Some(buf) = &a.buf else {
                if join {
                    self.stats.ahead_joins += 1;
                    joined.push((start, part));
                }
                return !join;
            };
            self.stats.ahead_hits += 1;
            part.deliver(start, buf, out, &mut self.read_cache);
            a.taken += n as u64;
            // The readers went past it (not when one read its last page: a
            // read that ends inside a page leaves that page to the next, and
            // another reader of the file may still want its first pages).
            if a.taken >= a.pages * PAGE_SIZE {
                self.ahead_drop(start);
            }
            false
        });
        joined
    }

    /// With every piece of `pieces` (split at the read-ahead runs' edges) in
    /// a read-ahead run already read or in the read cache, and none of their
    /// pages staged or being written: the read as slices of those runs'
    /// buffers and those cached pages, which it lends ([`Gathered`]).
    /// `prefix`: where the pieces' output positions start; `len`: the data's
    /// length (zeros past the last piece). `None` (and nothing changed)
    /// otherwise.
    pub(super) fn gather_ahead(
        &mut self,
        pieces: &[Piece],
        prefix: usize,
        len: usize,
    ) -> Option<Gathered> {
        if self.writes.ahead.is_empty() && self.read_cache.is_empty() {
            return None;
        }
        let block = u64::from(self.geo.block_size);
        let mut parts = Vec::with_capacity(pieces.len() + 2);
        let mut starts: Vec<u64> = Vec::new();
        // Read-cache pages to lend, each once, and their parts.
        let mut cached: Vec<u64> = Vec::new();
        let mut at = prefix;
        for &(run, first, pages, piece_at, skip, n) in pieces {
            let page = run.page + first;
            let Some(start) = self.writes.ahead_at(page, pages) else {
                // Not read ahead: from the read cache, as `read_data_memory`
                // would copy it (staged pages come first there).
                if piece_at < at
                    || !self.read_cache.holds(page, pages)
                    || self.writes.staged_overlaps(page, pages)
                    || self.writes.busy_overlaps(page, pages)
                {
                    return None;
                }
                if piece_at > at {
                    parts.push(GatherPart::Zeros(piece_at - at));
                }
                let (mut from, mut left) = (skip, n);
                for p in page..page + pages {
                    if left == 0 {
                        break;
                    }
                    let k = (PAGE_SIZE as usize - from).min(left);
                    let i = match cached.iter().position(|&c| c == p) {
                        Some(i) => i,
                        None => {
                            cached.push(p);
                            cached.len() - 1
                        }
                    };
                    parts.push(GatherPart::Cached { page: i, from, n: k });
                    (from, left) = (0, left - k);
                }
                at = piece_at + n;
                continue;
            };
            if self.writes.ahead[&start].buf.is_none()
                || piece_at < at
                || self.writes.busy_overlaps(page, pages)
            {
                return None;
            }
            if piece_at > at {
                parts.push(GatherPart::Zeros(piece_at - at));
            }
            let buf = match starts.iter().position(|&s| s == start) {
                Some(i) => i,
                None => {
                    starts.push(start);
                    starts.len() - 1
                }
            };
            let part =
                Part { page, pages, at: piece_at, skip, n, cache: u64::from(run.valid) < block };
            parts.push(GatherPart::Ahead { buf, part });
            at = piece_at + n;
        }
        if prefix + len < at {
            return None;
        }
        if prefix + len > at {
            parts.push(GatherPart::Zeros(prefix + len - at));
        }
        let bufs = starts
            .into_iter()
            .map(|start| {
                let a = self.writes.ahead.get_mut(&start).expect("found above");
                (start, a.buf.take().expect("read, checked above"))
            })
            .collect();
        let pages = cached
            .into_iter()
            .map(|p| (p, self.read_cache.lend(p).expect("held, checked above")))
            .collect();
        Some(Gathered { bufs, pages, parts, len })
    }

    /// Takes back the buffers `g` lent: counts what it took from each run
    /// (a run read past is dropped, as a copy from it does), and puts the
    /// pages of partly filled blocks in the read cache.
    pub fn gather_done(&mut self, g: Gathered) {
        self.stats.reads_gathered += 1;
        if !g.pages.is_empty() {
            self.read_cache.hits += 1;
        }
        for (page, bytes) in g.pages {
            self.read_cache.give_back(page, bytes);
        }
        let mut taken = vec![0u64; g.bufs.len()];
        for p in &g.parts {
            if let GatherPart::Ahead { buf, part } = *p {
                self.stats.ahead_hits += 1;
                taken[buf] += part.n as u64;
                if part.cache {
                    let (start, b) = &g.bufs[buf];
                    let from = ((part.page - start) * PAGE_SIZE) as usize;
                    self.read_cache
                        .put(part.page, &b[from..from + (part.pages * PAGE_SIZE) as usize]);
                }
            }
        }
        for ((start, buf), took) in g.bufs.into_iter().zip(taken) {
            let Some(a) = self.writes.ahead.get_mut(&start) else {
                self.io.device_mut().free_buf(buf);
                continue;
            };
            a.buf = Some(buf);
            a.taken += took;
            if a.taken >= a.pages * PAGE_SIZE {
                self.ahead_drop(start);
            }
        }
    }

    /// Reads that were pending and finished since the last call: their ids
    /// and bytes, or the device's error.
    pub fn take_finished_reads(&mut self) -> Vec<(u64, FsResult<Vec<u8>>)> {
        std::mem::take(&mut self.writes.finished)
    }

    /// Whether a read finished and was not taken yet.
    pub fn has_finished_reads(&self) -> bool {
        !self.writes.finished.is_empty()
    }

    /// Whether a read is waiting for the device, or finished and not taken.
    pub fn reads_under_way(&self) -> bool {
        !self.writes.reads.is_empty() || !self.writes.finished.is_empty()
    }

    /// Submits the device reads of `pieces` (the parts of a read that memory
    /// does not hold, neighbours together: [`device_reads`]) into `out`;
    /// returns the id of the pending read. Its
    /// pages stay mapped while it is in flight: the commit that frees them
    /// waits for it (`data_requests_before`), and a write never rewrites
    /// mapped pages in place.
    /// `joined`: pieces it waits for from read-aheads in flight
    /// ([`take_ahead`](Self::take_ahead)).
    pub(super) fn read_in_background(
        &mut self,
        out: Vec<u8>,
        pieces: &[Piece],
        joined: Vec<(u64, Part)>,
    ) -> u64 {
        let id = self.writes.next_read;
        self.writes.next_read += 1;
        let reads = device_reads(pieces, u64::from(self.geo.block_size), u64::MAX);
        let left = reads.len() + joined.len();
        self.writes.reads.insert(id, PendingRead { out, left, error: None });
        for (start, part) in joined {
            let a = self.writes.ahead.get_mut(&start).expect("in flight");
            // Nothing may finish it between `take_ahead` and here: a waiter on a
            // finished read-ahead would never be answered.
            assert!(a.buf.is_none(), "a read joined a read-ahead that had finished");
            a.waiting.push((id, part));
        }
        for (page, pages, parts) in reads {
            let tag = self.writes.start(page, pages, Purpose::Read { id, parts });
            let buf = self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize);
            let offset = self.geo.data_offset(page);
            self.stats.reads_in_background += 1;
            self.io.submit_data(IoRequest { tag: 0, kind: IoKind::Read, offset, buf }, tag);
        }
        id
    }

    /// Copies `out.len()` bytes starting `skip` bytes into data page `first`
    /// from memory: a staged run, or the read cache. `false` if neither holds
    /// them all.
    pub(super) fn read_data_memory(&mut self, first: u64, skip: usize, out: &mut [u8]) -> bool {
        let pages = (skip + out.len()).div_ceil(PAGE_SIZE as usize) as u64;
        if let Some(start) = self.writes.ahead_at(first, pages) {
            if let Some(buf) = &self.writes.ahead[&start].buf {
                let from = ((first - start) * PAGE_SIZE) as usize + skip;
                out.copy_from_slice(&buf[from..from + out.len()]);
                return true;
            }
        }
        self.writes.read(first, skip, out)
            || self.read_cache.read(first, skip, out)
            || self.gather_data_memory(first, skip, out)
    }

    /// [`read_data_memory`](Self::read_data_memory) of bytes no one place
    /// holds whole: page by page, each from the read-ahead run, staged run or
    /// read cache that holds it (in that order, as for the whole). A write
    /// merging a block that two read-ahead windows share found its old bytes
    /// in memory this way rather than reading them blocking.
    fn gather_data_memory(&mut self, first: u64, skip: usize, out: &mut [u8]) -> bool {
        let page_size = PAGE_SIZE as usize;
        let (len, mut done) = (out.len(), 0);
        while done < len {
            let at = skip + done;
            let page = first + (at / page_size) as u64;
            let in_page = at % page_size;
            let part = &mut out[done..(done + page_size - in_page).min(len)];
            let ahead = self.writes.ahead_at(page, 1).and_then(|s| {
                let buf = self.writes.ahead[&s].buf.as_ref()?;
                Some((buf, ((page - s) * PAGE_SIZE) as usize + in_page))
            });
            let found = match ahead {
                Some((buf, from)) => {
                    part.copy_from_slice(&buf[from..from + part.len()]);
                    true
                }
                // A page the cache does not hold is not counted as a miss
                // again (the whole already was).
                None => {
                    self.writes.read(page, in_page, part)
                        || (self.read_cache.holds(page, 1)
                            && self.read_cache.read(page, in_page, part))
                }
            };
            if !found {
                return false;
            }
            done += part.len();
        }
        true
    }

    /// Reads `pages` data pages from `first` into the read cache in the
    /// background, those that no read-ahead holds yet, unless memory holds
    /// them or a request for some of them is in flight. Bounded by the device
    /// queue: a full queue skips it.
    pub(super) fn prefetch(&mut self, first: u64, pages: u64) {
        // Windows planned at byte offsets share their edge pages: the pages
        // the last window read are left out, not the whole device read.
        for (first, pages) in self.writes.ahead_gaps(first, pages) {
            self.prefetch_pages(first, pages);
        }
    }

    /// [`prefetch`](Self::prefetch) of pages no read-ahead holds.
    fn prefetch_pages(&mut self, first: u64, pages: u64) {
        if self.io.device().in_flight() < self.io.device().queue_depth() {
            self.read_ahead_pages(first, pages);
        }
    }

    /// Starts the read of pages no read-ahead holds into a read-ahead run,
    /// full device queue or not (it waits for room in the shard's queue
    /// then): a partial write's merge needs them.
    fn read_ahead_pages(&mut self, first: u64, pages: u64) {
        // Not a page that is staged (the device holds its old bytes) or being
        // written: a read-ahead spans several runs, some may be.
        if self.writes.staged_overlaps(first, pages)
            || self.read_cache.holds(first, pages)
            || self.writes.busy_overlaps(first, pages)
            || !self.ahead_room(pages * PAGE_SIZE)
        {
            return;
        }
        debug_assert!(
            !self.writes.ahead_overlaps(first, pages),
            "a read-ahead of {pages} pages at {first} would overlap another"
        );
        // Counted as the memory its buffer takes, not the bytes it reads: a
        // run of 300 KiB in a buffer of 1 MiB counted as 300 KiB let
        // read-ahead hold three times its bound (and map new buffers for it
        // all along a read of a shared file, zeroing them: a third of the
        // workers' time, docs/benchmarks.md).
        let buf = self.io.device_mut().alloc_buf((pages * PAGE_SIZE) as usize);
        let held = buf.capacity() as u64;
        if held > pages * PAGE_SIZE && !self.ahead_room(held) {
            self.io.device_mut().free_buf(buf);
            return;
        }
        let offset = self.geo.data_offset(first);
        let req = IoRequest { tag: 0, kind: IoKind::Read, offset, buf };
        let tag = self.writes.start(first, pages, Purpose::ReadAhead);
        self.writes
            .ahead
            .insert(first, Ahead { pages, held, buf: None, taken: 0, waiting: Vec::new() });
        self.writes.ahead_bytes += held;
        self.writes.ahead_order.push_back(first);
        self.stats.read_aheads += 1;
        self.io.submit_data(req, tag);
    }

    /// Whether a write (or read-ahead) in flight holds any of the page runs
    /// `pieces` (`(first page, pages)`).
    pub(super) fn data_pages_busy(&self, pieces: &[(u64, u64)]) -> bool {
        pieces.iter().any(|&(first, pages)| self.writes.busy_overlaps(first, pages))
    }

    /// Data requests finished so far, in all (after collecting the finished
    /// ones): a write that stopped at its merge
    /// ([`merge_waits`](Self::merge_waits)) runs again once this moved.
    pub fn data_requests_done(&mut self) -> u64 {
        self.poll_data_writes();
        self.writes.done
    }

    /// With misses deferred (`set_defer_misses`): whether a partial write's
    /// merge of the old run's `pages` pages from `first` must wait instead of
    /// reading them blocking. It waits while a write or read-ahead of them is
    /// in flight (its completion leaves them in memory), or when memory does
    /// not hold them and a read of them into the read-ahead runs started (a
    /// full device queue holds it until there is room). Read-ahead runs that
    /// hold some of them have the rest read beside them. When no such read
    /// could start because read-ahead runs in flight hold the read-ahead
    /// budget, it waits for the data requests in flight (once they finished
    /// the runs are read and make room). `false`: memory holds them (maybe
    /// in pieces), or no background read could start and no data request is
    /// in flight (a budget smaller than one block): the merge reads them now.
    pub(super) fn merge_waits(&mut self, first: u64, pages: u64) -> bool {
        let in_memory = self.writes.staged_overlaps(first, pages)
            || self.read_cache.holds(first, pages)
            || self
                .writes
                .ahead_at(first, pages)
                .is_some_and(|s| self.writes.ahead[&s].buf.is_some());
        // A block being written is in the read cache when it was partly
        // filled (cached at submit): no need to wait for the device then.
        if !in_memory && self.writes.busy_overlaps(first, pages) {
            return true;
        }
        if in_memory {
            return false;
        }
        // Read-ahead runs never overlap: when some hold part of these pages
        // (none in flight: checked above), no run of all of them can start.
        // Read the pages they leave out; with none left out, memory holds
        // them all (`gather_data_memory`).
        let data_in_flight = |s: &Self| s.data_settled() < s.data_issued();
        if self.writes.ahead_overlaps(first, pages) {
            for (first, pages) in self.writes.ahead_gaps(first, pages) {
                self.read_ahead_pages(first, pages);
            }
            return self.writes.busy_overlaps(first, pages) || data_in_flight(self);
        }
        self.read_ahead_pages(first, pages);
        self.ahead_in_flight(first, pages) || data_in_flight(self)
    }

    /// With misses deferred (`set_defer_misses`), before a data write changes
    /// anything: stops it ([`DeferredOn::Data`](crate::DeferredOn)) while
    /// the data writes waiting for room in a full device queue are over
    /// [`HELD_DATA_MAX`], to run again once the data requests in flight
    /// finished. So a device slower than its writers holds their replies
    /// back instead of letting held writes grow, and the worker serves the
    /// others meanwhile.
    pub(super) fn data_write_room(&mut self) -> FsResult<()> {
        if self.defer_misses
            && self.op_changes == 0
            && self.io.held_data_bytes() >= HELD_DATA_MAX
            && self.data_settled() < self.data_issued()
        {
            self.stats.writes_deferred += 1;
            self.deferred = Some(DeferredOn::Data);
            return Err(FsError::TryAgain);
        }
        Ok(())
    }

    /// Before reading `pieces` from the device or from memory: waits for the
    /// data requests if one is still writing (or reading ahead) some of their
    /// pages. After it, those pages are on the device, and in the read cache if
    /// worth it.
    pub(super) fn settle_data_pages(
        &mut self,
        pieces: impl IntoIterator<Item = (u64, u64)>,
    ) -> FsResult<()> {
        if self.writes.busy.is_empty() {
            return Ok(());
        }
        if pieces.into_iter().any(|(first, pages)| self.writes.busy_overlaps(first, pages)) {
            self.wait_in_flight()?;
        }
        Ok(())
    }
}
