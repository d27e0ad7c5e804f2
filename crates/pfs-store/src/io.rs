//! The shard's one path to its device: blocking batches for the operation at hand,
//! plus four kinds of asynchronous requests whose completions are collected later:
//! Icache write-backs, data writes and reads (`shard/dataio.rs`), the steps of
//! a group commit (`shard/commit.rs`), and the writes and syncs of a checkpoint
//! (`shard/checkpoint.rs`).
//!
//! **A full device queue never blocks a submission.** An asynchronous request
//! that finds `queue_depth` requests on the device waits in `held`, in order,
//! and goes to the device as completions make room (every collection of
//! completions moves what fits). It counts as in flight for its kind all the
//! same, so whoever waits for a kind's requests waits for it too. What bounds
//! `held` is what bounds each kind: one commit step, a checkpoint's few table
//! writes, one write-back per Icache block, reads per client request, and data
//! writes, whose producers stop while [`DevIo::held_data_bytes`] is over their
//! bound (`shard/dataio.rs`). Before, such a submission waited for the device,
//! and no counter saw it.

use std::collections::VecDeque;

use crate::device::{run_batch, Device, DeviceError, IoCompletion, IoKind, IoRequest};

/// Tags with this bit set belong to asynchronous requests.
const ASYNC_TAG: u64 = 1 << 63;
/// Asynchronous tags with this bit set as well are data writes.
const DATA_TAG: u64 = 1 << 62;
/// Asynchronous tags with this bit set as well are a group commit's steps.
const COMMIT_TAG: u64 = 1 << 61;
/// Asynchronous tags with this bit set as well are a checkpoint's requests.
const CKPT_TAG: u64 = 1 << 60;
/// The bits above a caller's tag.
const KIND_BITS: u64 = ASYNC_TAG | DATA_TAG | COMMIT_TAG | CKPT_TAG;

/// Completions and the count in flight of one kind of asynchronous request.
#[derive(Debug, Default)]
struct AsyncKind {
    done: Vec<IoCompletion>,
    in_flight: usize,
}

/// The asynchronous requests in flight, by kind.
#[derive(Debug, Default)]
struct Kinds {
    /// Icache write-backs.
    meta: AsyncKind,
    /// Data writes and read-ahead.
    data: AsyncKind,
    /// The step of a group commit under way (at most one).
    commit: AsyncKind,
    /// The writes and syncs of a checkpoint under way.
    ckpt: AsyncKind,
}

/// The device plus completion routing.
#[derive(Debug)]
pub struct DevIo<D> {
    dev: D,
    kinds: Kinds,
    /// Failpoint `commit.hold_ms`: how late a commit step's completion is
    /// handed out, and when the one in flight may be.
    commit_hold: Option<std::time::Duration>,
    commit_ready_at: Option<std::time::Instant>,
    /// Failpoint `read.hold_ms`: how late a finished data read is handed
    /// out, and the reads finished and held until then.
    read_hold: Option<std::time::Duration>,
    held_reads: Vec<(std::time::Instant, IoCompletion)>,
    /// Times a caller waited for the device (`waits`).
    waits: u64,
    /// Asynchronous requests submitted while the device queue was full, in
    /// submission order, tagged as they go to the device.
    held: VecDeque<IoRequest>,
    /// Bytes of the data writes among `held` (`held_data_bytes`).
    held_data_bytes: usize,
    /// Requests ever held (`held_back`).
    held_total: u64,
}

impl<D: Device> DevIo<D> {
    /// Wraps a device.
    pub fn new(dev: D) -> DevIo<D> {
        let commit_hold =
            pfs_core::failpoint::setting("commit.hold_ms").map(std::time::Duration::from_millis);
        let read_hold =
            pfs_core::failpoint::setting("read.hold_ms").map(std::time::Duration::from_millis);
        DevIo {
            dev,
            kinds: Kinds::default(),
            commit_hold,
            commit_ready_at: None,
            read_hold,
            held_reads: Vec::new(),
            waits: 0,
            held: VecDeque::new(),
            held_data_bytes: 0,
            held_total: 0,
        }
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// The device, mutably (buffer allocation).
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Times a caller waited for the device to finish requests: each
    /// [`run`](Self::run), each wait for one request or for all of a kind.
    /// The wait of an idle worker ([`wait_one_idle`](Self::wait_one_idle)) is
    /// not counted: it serves nobody meanwhile anyway.
    pub fn waits(&self) -> u64 {
        self.waits
    }

    /// Asynchronous requests that found the device queue full and waited
    /// for room in the shard's own queue instead of the caller waiting, in
    /// all (`ShardStats::held_back`).
    pub fn held_back(&self) -> u64 {
        self.held_total
    }

    /// Bytes of data writes waiting for room in the device queue: a data
    /// write that can still stop does while they are over its bound.
    pub fn held_data_bytes(&self) -> usize {
        self.held_data_bytes
    }

    /// Requests waiting for room in the device queue.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Gives the device back.
    pub fn into_device(mut self) -> D {
        self.wait_async_all();
        self.wait_data_all();
        self.wait_all(|k| &mut k.commit);
        self.wait_all(|k| &mut k.ckpt);
        self.dev
    }

    /// Runs `reqs` to completion; returns their completions in order. Asynchronous
    /// completions that arrive meanwhile are kept for `take_async`.
    ///
    /// Failpoints `device.read`, `device.write` and `device.sync`
    /// (`pfs_core::failpoint`) fail a request of that kind with `EIO`, as a
    /// failing device would, without submitting it.
    pub fn run(&mut self, reqs: Vec<IoRequest>) -> Vec<IoCompletion> {
        let mut injected: Vec<Option<IoCompletion>> = Vec::new();
        let mut submit = Vec::with_capacity(reqs.len());
        for req in reqs {
            match failpoint(req) {
                Ok(req) => {
                    injected.push(None);
                    submit.push(req);
                }
                Err(failed) => injected.push(Some(failed)),
            }
        }
        if !submit.is_empty() {
            self.waits += 1;
        }
        let kinds = &mut self.kinds;
        let done = run_batch(&mut self.dev, submit, |c| kinds.route(c));
        // Completions of asynchronous requests made room meanwhile.
        self.refill();
        if injected.iter().all(Option::is_none) {
            return done;
        }
        let mut done = done.into_iter();
        injected
            .into_iter()
            .map(|c| c.unwrap_or_else(|| done.next().expect("one completion per request")))
            .collect()
    }

    /// Reads `len` bytes (a multiple of the sector size) at byte `offset`, in
    /// chunks of at most 1 MiB.
    pub fn read_bytes(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, DeviceError> {
        const CHUNK: u64 = 1 << 20;
        let mut out = Vec::with_capacity(len as usize);
        let mut at = 0;
        while at < len {
            let n = CHUNK.min(len - at);
            let buf = self.dev.alloc_buf(n as usize);
            let req = IoRequest { tag: 0, kind: IoKind::Read, offset: offset + at, buf };
            let c = self.run(vec![req]).pop().expect("one completion");
            c.result?;
            out.extend_from_slice(&c.buf[..n as usize]);
            self.dev.free_buf(c.buf);
            at += n;
        }
        Ok(out)
    }

    /// Submits an asynchronous Icache write-back tagged `tag` (< 2^60); held
    /// until there is room if the queue is full.
    pub fn submit_async(&mut self, mut req: IoRequest, tag: u64) {
        assert!(tag & KIND_BITS == 0, "async tag {tag} too large");
        req.tag = tag | ASYNC_TAG;
        self.submit_or_hold(req);
        self.kinds.meta.in_flight += 1;
    }

    /// Submits an asynchronous data write or read tagged `tag` (< 2^60); held
    /// until there is room if the queue is full. Failpoints `device.write` and `device.read` fail it as
    /// [`run`](Self::run) would.
    pub fn submit_data(&mut self, mut req: IoRequest, tag: u64) {
        assert!(tag & KIND_BITS == 0, "data tag {tag} too large");
        req.tag = tag;
        match failpoint(req) {
            Ok(mut req) => {
                req.tag = tag | ASYNC_TAG | DATA_TAG;
                self.submit_or_hold(req);
                self.kinds.data.in_flight += 1;
            }
            Err(failed) => self.kinds.data.done.push(failed),
        }
    }

    /// Submits one step of a group commit (a write or a sync) and hands it to
    /// the kernel at once; [`take_commit`](Self::take_commit) collects it. At
    /// most one is in flight. Failpoints as in [`run`](Self::run).
    pub fn submit_commit(&mut self, req: IoRequest) {
        assert_eq!(self.kinds.commit.in_flight, 0, "one commit step at a time");
        assert!(self.kinds.commit.done.is_empty(), "the last commit step was not collected");
        self.commit_ready_at = self.commit_hold.map(|hold| std::time::Instant::now() + hold);
        match failpoint(req) {
            Ok(mut req) => {
                req.tag = ASYNC_TAG | COMMIT_TAG;
                self.submit_or_hold(req);
                self.kinds.commit.in_flight += 1;
                self.poll();
            }
            Err(failed) => self.kinds.commit.done.push(failed),
        }
    }

    /// Submits a checkpoint's write or sync tagged `tag` (< 2^60) and hands it
    /// to the kernel at once; [`take_ckpt`](Self::take_ckpt) collects it.
    /// Failpoints as in [`run`](Self::run).
    pub fn submit_ckpt(&mut self, mut req: IoRequest, tag: u64) {
        assert!(tag & KIND_BITS == 0, "checkpoint tag {tag} too large");
        req.tag = tag;
        match failpoint(req) {
            Ok(mut req) => {
                req.tag = tag | ASYNC_TAG | CKPT_TAG;
                self.submit_or_hold(req);
                self.kinds.ckpt.in_flight += 1;
                self.poll();
            }
            Err(failed) => self.kinds.ckpt.done.push(failed),
        }
    }

    /// The checkpoint's finished requests so far, without waiting.
    pub fn take_ckpt(&mut self) -> Vec<IoCompletion> {
        self.poll();
        std::mem::take(&mut self.kinds.ckpt.done)
    }

    /// Whether finished asynchronous requests of any kind wait to be taken
    /// (a poll filed them).
    pub fn has_finished(&self) -> bool {
        let k = &self.kinds;
        [&k.meta, &k.data, &k.commit, &k.ckpt].iter().any(|k| !k.done.is_empty())
    }

    /// The checkpoint's requests in flight (submitted and not yet taken).
    pub fn ckpt_in_flight(&self) -> usize {
        self.kinds.ckpt.in_flight + self.kinds.ckpt.done.len()
    }

    /// The commit step's completion once it finished, without waiting.
    pub fn take_commit(&mut self) -> Option<IoCompletion> {
        if self.kinds.commit.done.is_empty() {
            self.poll();
        }
        if self.commit_ready_at.is_some_and(|at| std::time::Instant::now() < at) {
            return None;
        }
        self.kinds.commit.done.pop()
    }

    /// Waits until at least one asynchronous request of any kind finished, or
    /// a held commit step may be handed out; its completion is filed under its
    /// kind. `false` when there was nothing to wait for.
    pub fn wait_any(&mut self) -> bool {
        if let Some(at) = self.commit_ready_at.filter(|_| !self.kinds.commit.done.is_empty()) {
            self.waits += 1;
            std::thread::sleep(at.saturating_duration_since(std::time::Instant::now()));
            self.commit_ready_at = None;
            return true;
        }
        self.wait_one()
    }

    /// Waits for one request in flight to finish and files it under its kind;
    /// `false` if none is in flight.
    pub fn wait_one(&mut self) -> bool {
        self.refill();
        if self.dev.in_flight() == 0 {
            return false;
        }
        self.waits += 1;
        self.wait_one_idle()
    }

    /// [`wait_one`](Self::wait_one) for a worker with nothing else to do: not
    /// counted in [`waits`](Self::waits).
    pub fn wait_one_idle(&mut self) -> bool {
        self.refill();
        if self.dev.in_flight() == 0 {
            return false;
        }
        let mut out = Vec::new();
        self.dev.wait(&mut out, 1);
        self.absorb(&mut out);
        self.refill();
        true
    }

    /// Collects finished requests into their kinds without waiting, so the
    /// device's completion descriptor (`Device::completion_fd`) reads empty.
    /// Held requests moved to the device go to the kernel on the next
    /// device poll, which may collect more completions: bounded by `held`.
    pub fn poll(&mut self) {
        let mut out = Vec::new();
        loop {
            self.dev.poll(&mut out);
            self.absorb(&mut out);
            if !self.refill() {
                break;
            }
        }
    }

    /// Submits `req`, or holds it behind the others when the device queue is
    /// full (or requests are held already: they keep their order).
    fn submit_or_hold(&mut self, req: IoRequest) {
        let req = if self.held.is_empty() {
            match self.dev.submit(req) {
                Ok(()) => return,
                Err(back) => back,
            }
        } else {
            req
        };
        if is_data_write(&req) {
            self.held_data_bytes += req.buf.len();
        }
        self.held_total += 1;
        self.held.push_back(req);
    }

    /// Moves held requests to the device while it has room; whether any moved.
    fn refill(&mut self) -> bool {
        let mut moved = false;
        while let Some(req) = self.held.pop_front() {
            let bytes = if is_data_write(&req) { req.buf.len() } else { 0 };
            match self.dev.submit(req) {
                Ok(()) => {
                    self.held_data_bytes -= bytes;
                    moved = true;
                }
                Err(back) => {
                    self.held.push_front(back);
                    break;
                }
            }
        }
        moved
    }

    /// Asynchronous Icache completions so far (tags without the async bit),
    /// non-blocking; submits what was queued.
    pub fn take_async(&mut self) -> Vec<IoCompletion> {
        self.poll();
        std::mem::take(&mut self.kinds.meta.done)
    }

    /// Waits for every asynchronous Icache request; returns their completions.
    pub fn wait_async_all(&mut self) -> Vec<IoCompletion> {
        self.wait_all(|k| &mut k.meta)
    }

    /// Finished data writes so far (their tags), non-blocking; submits what
    /// was queued.
    pub fn take_data(&mut self) -> Vec<IoCompletion> {
        self.poll();
        let done = std::mem::take(&mut self.kinds.data.done);
        self.hold_reads(done, false)
    }

    /// Waits for every data request; returns their completions.
    pub fn wait_data_all(&mut self) -> Vec<IoCompletion> {
        let done = self.wait_all(|k| &mut k.data);
        self.hold_reads(done, true)
    }

    /// Failpoint `read.hold_ms`: holds the finished reads among `done` that
    /// long, and hands out those held long enough (`wait`: all of them, after
    /// sleeping as long as needed). Without the failpoint, `done` as is.
    fn hold_reads(&mut self, done: Vec<IoCompletion>, wait: bool) -> Vec<IoCompletion> {
        let Some(hold) = self.read_hold else { return done };
        let now = std::time::Instant::now();
        let (reads, mut out): (Vec<_>, Vec<_>) =
            done.into_iter().partition(|c| c.kind == IoKind::Read);
        self.held_reads.extend(reads.into_iter().map(|c| (now + hold, c)));
        if wait {
            if let Some(last) = self.held_reads.iter().map(|h| h.0).max() {
                std::thread::sleep(last.saturating_duration_since(now));
            }
        }
        let now = std::time::Instant::now();
        let (ready, held) =
            std::mem::take(&mut self.held_reads).into_iter().partition::<Vec<_>, _>(|h| h.0 <= now);
        self.held_reads = held;
        out.extend(ready.into_iter().map(|h| h.1));
        out
    }

    /// Waits until nothing of the kind `kind` picks is in flight; returns its
    /// completions.
    fn wait_all(&mut self, kind: fn(&mut Kinds) -> &mut AsyncKind) -> Vec<IoCompletion> {
        let mut out = Vec::new();
        if kind(&mut self.kinds).in_flight > 0 {
            self.waits += 1;
        }
        while kind(&mut self.kinds).in_flight > 0 {
            self.refill();
            self.dev.wait(&mut out, 1);
            self.absorb(&mut out);
        }
        std::mem::take(&mut kind(&mut self.kinds).done)
    }

    fn absorb(&mut self, out: &mut Vec<IoCompletion>) {
        for c in out.drain(..) {
            assert!(c.tag & ASYNC_TAG != 0, "synchronous completion {} outside run()", c.tag);
            self.kinds.route(c);
        }
    }
}

/// Whether `req` (tagged for the device) is a data write: what
/// [`DevIo::held_data_bytes`] counts.
fn is_data_write(req: &IoRequest) -> bool {
    req.kind == IoKind::Write && req.tag & DATA_TAG != 0
}

impl Kinds {
    /// Files an asynchronous completion under its kind, its tag as submitted.
    fn route(&mut self, mut c: IoCompletion) {
        let kind = if c.tag & DATA_TAG != 0 {
            &mut self.data
        } else if c.tag & COMMIT_TAG != 0 {
            &mut self.commit
        } else if c.tag & CKPT_TAG != 0 {
            &mut self.ckpt
        } else {
            &mut self.meta
        };
        c.tag &= !KIND_BITS;
        kind.in_flight -= 1;
        kind.done.push(c);
    }
}

/// `req`, or its failed completion when the failpoint of its kind fires
/// (`device.read`, `device.write`, `device.sync`): `EIO`, as a failing device
/// would give, without submitting it.
fn failpoint(req: IoRequest) -> Result<IoRequest, IoCompletion> {
    let point = match req.kind {
        IoKind::Read => "device.read",
        IoKind::Write => "device.write",
        IoKind::Sync => "device.sync",
    };
    if !pfs_core::failpoint::fire(point) {
        return Ok(req);
    }
    let result = Err(DeviceError::Io { offset: req.offset, errno: libc::EIO });
    let IoRequest { tag, kind, offset, buf } = req;
    Err(IoCompletion { tag, kind, offset, buf, result })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{AlignedBuf, MemDevice};

    fn write(offset: u64, byte: u8) -> IoRequest {
        let buf = AlignedBuf::from_slice(&[byte; 4096]);
        IoRequest { tag: 0, kind: IoKind::Write, offset, buf }
    }

    /// Requests that find the device queue full wait in the shard's queue, in
    /// order, without the caller waiting; collecting completions moves them
    /// to the device, and waiting for a kind waits for its held ones too.
    #[test]
    fn a_full_queue_holds_requests_instead_of_waiting() {
        let dev = MemDevice::new(1 << 20, 2);
        let mut io = DevIo::new(dev);
        for i in 0..5u64 {
            io.submit_data(write(i * 4096, i as u8 + 1), i);
        }
        io.submit_async(write(5 * 4096, 9), 7);
        assert_eq!(io.waits(), 0, "a submission waited for the device");
        assert_eq!((io.device().in_flight(), io.held()), (2, 4));
        assert_eq!(io.held_data_bytes(), 3 * 4096, "the Icache write is not data");
        assert_eq!(io.held_back(), 4);
        let mut tags: Vec<u64> = io.take_data().iter().map(|c| c.tag).collect();
        assert_eq!(io.held(), 0, "one collection moves what fits, then collects it");
        assert_eq!(io.held_data_bytes(), 0);
        tags.sort_unstable();
        assert_eq!(tags, [0, 1, 2, 3, 4]);
        assert_eq!(io.take_async().iter().map(|c| c.tag).collect::<Vec<_>>(), [7]);
        // A wait for a kind waits for its held requests too.
        io.submit_data(write(0, 11), 0);
        io.submit_data(write(4096, 12), 1);
        io.submit_data(write(8192, 13), 2);
        assert_eq!(io.held(), 1);
        let done = io.wait_data_all();
        assert_eq!(done.len(), 3, "the held write was waited for too");
        assert_eq!(io.waits(), 1);
        let mut back = io.read_bytes(0, 3 * 4096).unwrap();
        back.dedup();
        assert_eq!(back, [11, 12, 13], "each write landed, in place");
    }
}
