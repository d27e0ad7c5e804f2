//! `MemDevice`: an in-memory [`Device`] for tests, with a crash model and fault injection.
//!
//! Requests run when they complete (on the next `poll`/`wait`), not when submitted, so a
//! caller that submits a `Sync` before its writes completed can lose them, as on a real
//! disk. With [`MemDevice::reorder`] a seeded generator picks which in-flight requests
//! complete on each call and in which order.
//!
//! **Durable and volatile bytes are kept apart.** A write changes the volatile image
//! (what reads see) and is logged as unsynced; a `Sync` copies every write applied so far
//! into the durable image. [`MemDevice::crash`] builds a new device from the durable image
//! plus, for every unsynced or in-flight write, an independent seeded keep/drop choice per
//! sector, so a write may vanish, land whole, or be torn at sector boundaries.
//! [`MemDevice::freeze_after_writes`] cuts the power inside a run: from the n-th next
//! write on, writes and syncs complete `Ok` but change nothing.
//!
//! **Faults**: [`Fault`] rules fail matching requests with `EIO`; a failed request changes
//! nothing and other requests are unaffected, except a failed `Sync`: as Linux does after
//! a writeback error, it forgets the writes it should have made durable. They stay
//! readable, a later `Sync` succeeds, and a crash loses them all the same.
//!
//! **Bad requests** (misaligned, empty, or past the end) complete with
//! [`DeviceError::BadRequest`] instead of panicking: a server should survive a bad
//! request, and the error names the offending offset and length.
//!
//! **Handles**: `MemDevice` is a cheap handle (`Clone`, [`MemDevice::handle`]) to shared
//! state, so a test can give one handle to a shard and keep another to inject faults,
//! cut the power and crash it while the shard owns the device. Only one handle should
//! submit and reap; the others are for control. The state sits behind an `Arc<Mutex>` so
//! a shard may run on another thread; tests are the only users, so the lock costs nothing
//! that matters.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{AlignedBuf, Device, DeviceError, IoCompletion, IoKind, IoRequest, SECTOR_SIZE};

/// A rule that fails matching requests with `EIO`.
///
/// A request matches when its kind equals `kind` (any kind if `None`) and its byte range
/// overlaps `range` (anywhere if `None`; a `Sync` has no range, so it only matches rules
/// without one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// Kind of request to fail; `None` for any.
    pub kind: Option<IoKind>,
    /// Byte range the request must overlap; `None` for anywhere.
    pub range: Option<Range<u64>>,
    /// How many more matching requests fail; `None` for every one from now on.
    pub count: Option<u64>,
}

impl Fault {
    /// Fails the next `count` requests of `kind`.
    pub fn next(kind: IoKind, count: u64) -> Fault {
        Fault { kind: Some(kind), range: None, count: Some(count) }
    }

    /// Fails every request (of `kind`, or any kind if `None`) overlapping `range`.
    pub fn always(kind: Option<IoKind>, range: Range<u64>) -> Fault {
        Fault { kind, range: Some(range), count: None }
    }

    /// The same rule, restricted to requests overlapping `range`.
    pub fn in_range(self, range: Range<u64>) -> Fault {
        Fault { range: Some(range), ..self }
    }

    fn matches(&self, kind: IoKind, offset: u64, len: u64) -> bool {
        if self.kind.is_some_and(|k| k != kind) {
            return false;
        }
        match &self.range {
            None => true,
            Some(r) => kind != IoKind::Sync && offset < r.end && r.start < offset + len,
        }
    }
}

/// In-memory device for tests; see the module docs. Clones share one device.
#[derive(Clone, Debug)]
pub struct MemDevice {
    state: Arc<Mutex<State>>,
}

/// A submitted request waiting for `poll`/`wait`.
#[derive(Debug)]
struct Pending {
    req: IoRequest,
    /// Submitted after the power cut: completes `Ok` but changes nothing.
    dead: bool,
}

#[derive(Debug)]
struct State {
    size_bytes: u64,
    queue_depth: usize,
    /// What reads see.
    volatile: Vec<u8>,
    /// What survives a crash for sure.
    durable: Vec<u8>,
    /// Writes applied to `volatile` since the last sync, oldest first: (offset, bytes).
    unsynced: Vec<(u64, Vec<u8>)>,
    pending: VecDeque<Pending>,
    faults: Vec<Fault>,
    writes_submitted: u64,
    /// Writes with a submission number at or past this are after the power cut.
    cut_at_write: Option<u64>,
    reorder: Option<Rng>,
    /// Requests touching these bytes stay in flight (`hold`).
    held: Option<Range<u64>>,
    /// Buffers are lent in whole multiples of this many bytes (`round_bufs`).
    buf_round: usize,
}

impl MemDevice {
    /// A zeroed device of `size_bytes` (a multiple of [`SECTOR_SIZE`]) that accepts at
    /// most `queue_depth` requests in flight.
    pub fn new(size_bytes: u64, queue_depth: usize) -> MemDevice {
        MemDevice::from_image(
            vec![0; usize::try_from(size_bytes).expect("size fits memory")],
            queue_depth,
        )
    }

    fn from_image(image: Vec<u8>, queue_depth: usize) -> MemDevice {
        let size_bytes = image.len() as u64;
        assert!(size_bytes % SECTOR_SIZE as u64 == 0, "size {size_bytes} not sector-aligned");
        assert!(queue_depth > 0, "queue depth must be positive");
        let state = State {
            size_bytes,
            queue_depth,
            durable: image.clone(),
            volatile: image,
            unsynced: Vec::new(),
            pending: VecDeque::with_capacity(queue_depth),
            faults: Vec::new(),
            writes_submitted: 0,
            cut_at_write: None,
            reorder: None,
            held: None,
            buf_round: 0,
        };
        MemDevice { state: Arc::new(Mutex::new(state)) }
    }

    /// Another handle to the same device (same as `clone`).
    pub fn handle(&self) -> MemDevice {
        self.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// With `Some(seed)`, each `poll`/`wait` completes a seeded random subset of the
    /// in-flight requests in a seeded random order; with `None`, all in submission order.
    pub fn reorder(&self, seed: Option<u64>) {
        self.lock().reorder = seed.map(Rng::new);
    }

    /// With `Some(range)`, requests that touch those bytes stay in flight:
    /// `poll` leaves them, and `wait` for one of them panics (the test would
    /// hang). `None` lets them finish.
    pub fn hold(&self, range: Option<Range<u64>>) {
        self.lock().held = range;
    }

    /// With `to > 0`, buffers are lent in whole multiples of `to` bytes, the
    /// length asked for set inside them (as `UringDevice` lends a buffer of 1
    /// MiB for a read of over 256 KiB, so it can keep it); 0 lends exactly
    /// what is asked for.
    pub fn round_bufs(&self, to: usize) {
        self.lock().buf_round = to;
    }

    /// Adds a fault rule; rules are checked in the order added, and the first match
    /// with failures left fails the request.
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Simulates a power cut inside a run: the next `n` writes still apply, later
    /// writes and syncs complete `Ok` but change nothing. A following [`crash`]
    /// therefore sees only what happened before the cut.
    ///
    /// [`crash`]: MemDevice::crash
    pub fn freeze_after_writes(&self, n: u64) {
        let mut st = self.lock();
        st.cut_at_write = Some(st.writes_submitted + n);
    }

    /// True once the power cut set by `freeze_after_writes` has happened.
    pub fn is_frozen(&self) -> bool {
        let st = self.lock();
        st.cut_at_write.is_some_and(|cut| st.writes_submitted >= cut)
    }

    /// Write requests submitted so far (a test picks a cut point below this).
    pub fn writes_submitted(&self) -> u64 {
        self.lock().writes_submitted
    }

    /// The byte ranges of the reads in flight, oldest first (to `hold` one).
    pub fn reads_in_flight(&self) -> Vec<Range<u64>> {
        let st = self.lock();
        st.pending
            .iter()
            .filter(|p| p.req.kind == IoKind::Read)
            .map(|p| p.req.offset..p.req.offset + p.req.buf.len() as u64)
            .collect()
    }

    /// Writes applied since the last sync.
    pub fn unsynced_writes(&self) -> usize {
        self.lock().unsynced.len()
    }

    /// The bytes reads would see now (`len` bytes at `offset`).
    pub fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        let st = self.lock();
        let start = usize::try_from(offset).expect("offset fits memory");
        st.volatile[start..start + len].to_vec()
    }

    /// The bytes that would survive any crash (`len` bytes at `offset`).
    pub fn peek_durable(&self, offset: u64, len: usize) -> Vec<u8> {
        let st = self.lock();
        let start = usize::try_from(offset).expect("offset fits memory");
        st.durable[start..start + len].to_vec()
    }

    /// A new device holding what a power failure now would leave: the durable image,
    /// then each unsynced or in-flight write (oldest first, excluding writes after a
    /// power cut) with each of its sectors kept or dropped by a generator seeded with
    /// `seed`. Same size and queue depth; no faults, no cut, no reordering.
    pub fn crash(&self, seed: u64) -> MemDevice {
        let st = self.lock();
        let mut rng = Rng::new(seed);
        let mut image = st.durable.clone();
        let in_flight = st.pending.iter().filter(|p| {
            p.req.kind == IoKind::Write
                && !p.dead
                && st.check(IoKind::Write, p.req.offset, p.req.buf.len()).is_ok()
        });
        let writes = st
            .unsynced
            .iter()
            .map(|(offset, data)| (*offset, &data[..]))
            .chain(in_flight.map(|p| (p.req.offset, &p.req.buf[..])));
        for (offset, data) in writes {
            for (i, sector) in data.chunks(SECTOR_SIZE).enumerate() {
                if rng.next() & 1 == 1 {
                    let at = offset as usize + i * SECTOR_SIZE;
                    image[at..at + sector.len()].copy_from_slice(sector);
                }
            }
        }
        MemDevice::from_image(image, st.queue_depth)
    }
}

impl State {
    /// Rejects requests that are misaligned, empty, or past the end.
    fn check(&self, kind: IoKind, offset: u64, len: usize) -> Result<(), DeviceError> {
        if kind == IoKind::Sync {
            return Ok(());
        }
        let bad = |what: &str| {
            Err(DeviceError::BadRequest(format!(
                "{kind:?} of {len} bytes at offset {offset}: {what} (device size {})",
                self.size_bytes
            )))
        };
        if len == 0 {
            return bad("empty buffer");
        }
        if offset % SECTOR_SIZE as u64 != 0 || len % SECTOR_SIZE != 0 {
            return bad("not aligned to the sector size");
        }
        if offset.checked_add(len as u64).is_none_or(|end| end > self.size_bytes) {
            return bad("past the end of the device");
        }
        Ok(())
    }

    /// Consumes one failure of the first matching fault rule, if any.
    fn take_fault(&mut self, kind: IoKind, offset: u64, len: usize) -> Result<(), DeviceError> {
        let hit = self
            .faults
            .iter()
            .position(|f| f.count != Some(0) && f.matches(kind, offset, len as u64));
        let Some(i) = hit else { return Ok(()) };
        if let Some(count) = &mut self.faults[i].count {
            *count -= 1;
            if *count == 0 {
                self.faults.remove(i);
            }
        }
        Err(DeviceError::Io { offset, errno: libc::EIO })
    }

    fn execute(&mut self, pending: Pending) -> IoCompletion {
        let Pending { req: IoRequest { tag, kind, offset, mut buf }, dead } = pending;
        let result = self
            .check(kind, offset, buf.len())
            .and_then(|()| self.take_fault(kind, offset, buf.len()));
        if kind == IoKind::Sync && result.is_err() && !dead {
            self.unsynced.clear();
        }
        if result.is_ok() && !(dead && kind != IoKind::Read) {
            let (start, len) = (offset as usize, buf.len());
            match kind {
                IoKind::Read => buf.copy_from_slice(&self.volatile[start..start + len]),
                IoKind::Write => {
                    self.volatile[start..start + buf.len()].copy_from_slice(&buf);
                    self.unsynced.push((offset, buf.to_vec()));
                }
                IoKind::Sync => {
                    for (offset, data) in self.unsynced.drain(..) {
                        let at = offset as usize;
                        self.durable[at..at + data.len()].copy_from_slice(&data);
                    }
                }
            }
        }
        IoCompletion { tag, kind, offset, buf, result }
    }

    /// Whether `p` is held in flight (`MemDevice::hold`).
    fn is_held(&self, p: &Pending) -> bool {
        let end = p.req.offset + p.req.buf.len() as u64;
        p.req.kind != IoKind::Sync
            && self.held.as_ref().is_some_and(|h| p.req.offset < h.end && h.start < end)
    }

    /// Requests that may complete now (not held).
    fn ready(&self) -> usize {
        self.pending.iter().filter(|p| !self.is_held(p)).count()
    }

    /// Completes `n` pending requests that are not held into `out`.
    fn complete(&mut self, n: usize, out: &mut Vec<IoCompletion>) -> usize {
        assert!(n <= self.ready());
        for _ in 0..n {
            let ready: Vec<usize> =
                (0..self.pending.len()).filter(|&i| !self.is_held(&self.pending[i])).collect();
            let i = match &mut self.reorder {
                Some(rng) => ready[rng.below(ready.len())],
                None => ready[0],
            };
            let pending = self.pending.remove(i).expect("index within pending");
            let done = self.execute(pending);
            out.push(done);
        }
        n
    }
}

impl Device for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.lock().size_bytes
    }

    fn queue_depth(&self) -> usize {
        self.lock().queue_depth
    }

    fn in_flight(&self) -> usize {
        self.lock().pending.len()
    }

    fn submit(&mut self, req: IoRequest) -> Result<(), IoRequest> {
        let mut st = self.lock();
        if st.pending.len() == st.queue_depth {
            return Err(req);
        }
        let cut = st.cut_at_write;
        let dead = match req.kind {
            IoKind::Write => {
                let seq = st.writes_submitted;
                st.writes_submitted += 1;
                cut.is_some_and(|cut| seq >= cut)
            }
            IoKind::Sync => cut.is_some_and(|cut| st.writes_submitted >= cut),
            IoKind::Read => false,
        };
        st.pending.push_back(Pending { req, dead });
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize {
        let mut st = self.lock();
        let len = st.ready();
        let n = match &mut st.reorder {
            Some(rng) => rng.below(len + 1),
            None => len,
        };
        st.complete(n, out)
    }

    fn wait(&mut self, out: &mut Vec<IoCompletion>, min: usize) -> usize {
        let mut st = self.lock();
        let len = st.ready();
        assert!(
            min <= len || st.pending.len() == len,
            "waiting for a request held in flight (MemDevice::hold): the test would hang"
        );
        let min = min.min(len);
        let n = match &mut st.reorder {
            Some(rng) => min + rng.below(len - min + 1),
            None => len,
        };
        st.complete(n, out)
    }

    /// Buffers arrive full of a marker byte, not zeros: a pooled buffer of a
    /// real device holds whatever its last use left, and code that counts on
    /// zeros must fail here too.
    fn alloc_buf(&mut self, len: usize) -> AlignedBuf {
        let round = self.lock().buf_round;
        let mut buf = match round {
            0 => AlignedBuf::zeroed(len),
            r => {
                let mut b = AlignedBuf::zeroed(len.div_ceil(r).max(1) * r);
                b.set_len(len.div_ceil(SECTOR_SIZE) * SECTOR_SIZE);
                b
            }
        };
        buf[..].fill(STALE_BYTE);
        buf
    }
}

/// What a fresh [`MemDevice`] buffer holds.
const STALE_BYTE: u8 = 0xA5;

/// splitmix64: small, seedable, good enough to pick sectors and orders.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform-ish in `0..n`; `n` must be positive.
    fn below(&mut self, n: usize) -> usize {
        assert!(n > 0);
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{run_all, AlignedBuf};

    const S: u64 = SECTOR_SIZE as u64;

    fn write(offset: u64, data: &[u8]) -> IoRequest {
        IoRequest { tag: 0, kind: IoKind::Write, offset, buf: AlignedBuf::from_slice(data) }
    }

    fn read(offset: u64, len: usize) -> IoRequest {
        IoRequest { tag: 0, kind: IoKind::Read, offset, buf: AlignedBuf::zeroed(len) }
    }

    fn sync() -> IoRequest {
        IoRequest { tag: 0, kind: IoKind::Sync, offset: 0, buf: AlignedBuf::zeroed(0) }
    }

    /// `n` sectors, sector i filled with byte `fill + i`.
    fn pattern(fill: u8, n: usize) -> Vec<u8> {
        (0..n).flat_map(|i| vec![fill.wrapping_add(i as u8); SECTOR_SIZE]).collect()
    }

    fn run_ok(dev: &mut MemDevice, reqs: Vec<IoRequest>) -> Vec<IoCompletion> {
        let done = run_all(dev, reqs);
        for c in &done {
            assert_eq!(c.result, Ok(()), "{:?} at {}", c.kind, c.offset);
        }
        done
    }

    #[test]
    fn read_after_write_and_completion_on_poll() {
        let mut dev = MemDevice::new(16 * S, 4);
        assert_eq!(dev.size_bytes(), 16 * S);
        dev.submit(write(3 * S, &pattern(7, 2))).unwrap();
        assert_eq!(dev.in_flight(), 1);
        // Not applied until it completes.
        assert_eq!(dev.peek(3 * S, 4), vec![0; 4]);
        let mut out = Vec::new();
        assert_eq!(dev.poll(&mut out), 1);
        assert_eq!(dev.in_flight(), 0);
        assert_eq!(out[0].result, Ok(()));
        let done = run_ok(&mut dev, vec![read(2 * S, 4 * SECTOR_SIZE)]);
        let got = &done[0].buf;
        assert!(got[..SECTOR_SIZE].iter().all(|&b| b == 0));
        assert_eq!(&got[SECTOR_SIZE..3 * SECTOR_SIZE], &pattern(7, 2)[..]);
        assert!(got[3 * SECTOR_SIZE..].iter().all(|&b| b == 0));
        assert_eq!(dev.poll(&mut out), 0, "nothing in flight");
        assert_eq!(dev.wait(&mut out, 1), 0, "wait with nothing in flight returns");
    }

    #[test]
    fn synced_writes_survive_and_unsynced_are_dropped_applied_or_torn() {
        let mut dev = MemDevice::new(16 * S, 4);
        run_ok(&mut dev, vec![write(0, &pattern(1, 2))]);
        run_ok(&mut dev, vec![sync()]);
        assert_eq!(dev.unsynced_writes(), 0);
        run_ok(&mut dev, vec![write(4 * S, &pattern(50, 4))]);
        assert_eq!(dev.unsynced_writes(), 1);
        assert_eq!(dev.peek_durable(4 * S, SECTOR_SIZE), vec![0; SECTOR_SIZE]);
        let (mut dropped, mut applied, mut torn) = (0, 0, 0);
        for seed in 0..64 {
            let crashed = dev.crash(seed);
            assert_eq!(crashed.peek(0, 2 * SECTOR_SIZE), pattern(1, 2), "seed {seed}");
            let mut kept = 0;
            for i in 0..4u64 {
                let sector = crashed.peek((4 + i) * S, SECTOR_SIZE);
                if sector == vec![50 + i as u8; SECTOR_SIZE] {
                    kept += 1;
                } else {
                    assert_eq!(sector, vec![0; SECTOR_SIZE], "seed {seed} sector {i}");
                }
            }
            match kept {
                0 => dropped += 1,
                4 => applied += 1,
                _ => torn += 1,
            }
            // Same seed, same outcome.
            assert_eq!(
                dev.crash(seed).peek(0, 16 * SECTOR_SIZE),
                crashed.peek(0, 16 * SECTOR_SIZE)
            );
        }
        assert!(dropped > 0 && applied > 0 && torn > 0, "{dropped} {applied} {torn}");
    }

    #[test]
    fn crashed_device_is_durable_and_usable() {
        let mut dev = MemDevice::new(8 * S, 2);
        run_ok(&mut dev, vec![write(S, &pattern(9, 1)), sync()]);
        let mut after = dev.crash(1);
        assert_eq!(after.unsynced_writes(), 0);
        assert_eq!(after.peek_durable(S, SECTOR_SIZE), pattern(9, 1));
        // Crashing the crashed device again loses nothing.
        assert_eq!(after.crash(2).peek(0, 8 * SECTOR_SIZE), after.peek(0, 8 * SECTOR_SIZE));
        run_ok(&mut after, vec![write(2 * S, &pattern(3, 1))]);
        assert_eq!(after.peek(2 * S, SECTOR_SIZE), pattern(3, 1));
        assert_eq!(dev.peek(2 * S, SECTOR_SIZE), vec![0; SECTOR_SIZE], "devices are separate");
    }

    #[test]
    fn crash_may_keep_in_flight_writes() {
        let mut dev = MemDevice::new(8 * S, 2);
        dev.submit(write(0, &pattern(5, 1))).unwrap();
        let kept = (0..32).filter(|&seed| dev.crash(seed).peek(0, 1)[0] == 5).count();
        assert!(kept > 0 && kept < 32, "kept {kept} of 32");
        let mut out = Vec::new();
        dev.wait(&mut out, 1);
    }

    #[test]
    fn freeze_cuts_power_after_n_writes() {
        let mut dev = MemDevice::new(8 * S, 4);
        let handle = dev.handle();
        run_ok(&mut dev, vec![write(0, &pattern(1, 1)), sync()]);
        assert_eq!(handle.writes_submitted(), 1);
        handle.freeze_after_writes(1);
        assert!(!handle.is_frozen());
        // B lands (unsynced); C and the sync come after the cut: Ok, but no effect.
        run_ok(&mut dev, vec![write(S, &pattern(2, 1)), write(2 * S, &pattern(3, 1)), sync()]);
        assert!(handle.is_frozen());
        assert_eq!(handle.writes_submitted(), 3);
        assert_eq!(dev.peek(2 * S, SECTOR_SIZE), vec![0; SECTOR_SIZE]);
        let mut b_kept = 0;
        for seed in 0..32 {
            let crashed = handle.crash(seed);
            assert_eq!(crashed.peek(0, SECTOR_SIZE), pattern(1, 1));
            assert_eq!(crashed.peek(2 * S, SECTOR_SIZE), vec![0; SECTOR_SIZE]);
            b_kept += usize::from(crashed.peek(S, 1)[0] == 2);
        }
        assert!(b_kept > 0 && b_kept < 32, "unsynced B before the cut is a coin flip");
    }

    #[test]
    fn fault_fails_only_the_targeted_request() {
        let mut dev = MemDevice::new(8 * S, 4);
        dev.handle().inject(Fault::next(IoKind::Write, 1).in_range(2 * S..3 * S));
        let done = run_all(
            &mut dev,
            vec![write(0, &pattern(1, 1)), write(2 * S, &pattern(2, 1)), read(2 * S, SECTOR_SIZE)],
        );
        assert_eq!(done[0].result, Ok(()));
        assert_eq!(done[1].result, Err(DeviceError::Io { offset: 2 * S, errno: libc::EIO }));
        assert_eq!(done[2].result, Ok(()), "reads are not targeted");
        assert_eq!(
            dev.peek(2 * S, SECTOR_SIZE),
            vec![0; SECTOR_SIZE],
            "failed write changed nothing"
        );
        assert_eq!(dev.unsynced_writes(), 1);
        // The rule is used up.
        run_ok(&mut dev, vec![write(2 * S, &pattern(2, 1))]);
        assert_eq!(dev.peek(2 * S, SECTOR_SIZE), pattern(2, 1));
    }

    #[test]
    fn permanent_fault_on_a_range() {
        let mut dev = MemDevice::new(8 * S, 4);
        dev.inject(Fault::always(None, 4 * S..5 * S));
        for _ in 0..3 {
            let done = run_all(
                &mut dev,
                vec![
                    read(3 * S, 2 * SECTOR_SIZE),
                    write(4 * S, &pattern(1, 1)),
                    write(0, &[1]),
                    sync(),
                ],
            );
            assert!(
                matches!(done[0].result, Err(DeviceError::Io { offset, errno }) if offset == 3 * S && errno == libc::EIO)
            );
            assert!(done[1].result.is_err());
            assert_eq!(done[2].result, Ok(()));
            assert_eq!(done[3].result, Ok(()), "a sync has no range");
        }
        dev.clear_faults();
        run_ok(&mut dev, vec![read(3 * S, 2 * SECTOR_SIZE)]);
    }

    #[test]
    fn failed_sync_forgets_the_writes_it_should_have_made_durable() {
        let mut dev = MemDevice::new(8 * S, 4);
        dev.inject(Fault::next(IoKind::Sync, 1));
        run_ok(&mut dev, vec![write(0, &pattern(1, 1))]);
        let done = run_all(&mut dev, vec![sync()]);
        assert!(done[0].result.is_err());
        assert_eq!(dev.peek_durable(0, 1), vec![0]);
        // As on Linux after a writeback error: the retry succeeds, the data is
        // still readable, and it is not durable.
        run_ok(&mut dev, vec![sync()]);
        assert_eq!(dev.peek(0, 1), vec![1]);
        assert_eq!(dev.peek_durable(0, 1), vec![0]);
        assert_eq!(dev.crash(1).peek(0, 1), vec![0]);
    }

    #[test]
    fn full_queue_hands_the_request_back() {
        let mut dev = MemDevice::new(8 * S, 2);
        dev.submit(write(0, &[1])).unwrap();
        dev.submit(write(S, &[2])).unwrap();
        let mut back = write(2 * S, &[3]);
        back.tag = 42;
        let back = dev.submit(back).unwrap_err();
        assert_eq!((back.tag, back.offset, back.buf[0]), (42, 2 * S, 3));
        assert_eq!(dev.in_flight(), 2);
        let mut out = Vec::new();
        assert_eq!(dev.wait(&mut out, 1), 2);
        dev.submit(back).unwrap();
    }

    #[test]
    fn bad_requests_complete_with_an_error() {
        let mut dev = MemDevice::new(8 * S, 4);
        let done = run_all(
            &mut dev,
            vec![write(100, &[1]), write(8 * S, &[1]), read(7 * S, 2 * SECTOR_SIZE), read(0, 0)],
        );
        for c in &done {
            assert!(
                matches!(&c.result, Err(DeviceError::BadRequest(m)) if m.contains("offset")),
                "{c:?}"
            );
        }
        assert_eq!(dev.unsynced_writes(), 0);
    }

    #[test]
    fn reordering_is_seeded_and_run_all_keeps_request_order() {
        let orders: Vec<Vec<u64>> = (0..2)
            .map(|_| {
                let mut dev = MemDevice::new(64 * S, 16);
                dev.reorder(Some(7));
                for tag in 0..16 {
                    dev.submit(IoRequest { tag, ..write(tag * S, &[tag as u8]) }).unwrap();
                }
                let mut out = Vec::new();
                while dev.in_flight() > 0 {
                    dev.wait(&mut out, 1);
                }
                out.iter().map(|c| c.tag).collect()
            })
            .collect();
        assert_eq!(orders[0], orders[1], "same seed, same order");
        assert_ne!(orders[0], (0..16).collect::<Vec<_>>(), "seed 7 reorders");

        let mut dev = MemDevice::new(64 * S, 4);
        dev.reorder(Some(3));
        let done = run_all(&mut dev, (0..20).map(|i| read(i * S, SECTOR_SIZE)).collect());
        assert!(done.iter().enumerate().all(|(i, c)| c.offset == i as u64 * S));
    }

    #[test]
    fn sync_submitted_with_unfinished_writes_may_miss_them() {
        // A sync only covers writes that completed before it ran.
        let missed = (0..32)
            .filter(|&seed| {
                let mut dev = MemDevice::new(8 * S, 4);
                dev.reorder(Some(seed));
                run_ok(&mut dev, vec![write(0, &[1]), sync()]);
                dev.peek_durable(0, 1) == vec![0]
            })
            .count();
        assert!(missed > 0 && missed < 32, "missed {missed}");
    }

    #[test]
    fn handle_controls_a_device_owned_elsewhere() {
        struct Owner<D: Device> {
            dev: D,
        }
        let dev = MemDevice::new(8 * S, 4);
        let handle = dev.handle();
        let mut owner = Owner { dev };
        run_ok(&mut owner.dev, vec![write(0, &[4]), sync(), write(S, &[5])]);
        handle.freeze_after_writes(0);
        run_ok(&mut owner.dev, vec![write(2 * S, &[6])]);
        let after = handle.crash(0);
        assert_eq!(after.peek(0, 1), vec![4]);
        assert_eq!(after.peek(2 * S, 1), vec![0]);
        drop(owner);
        assert_eq!(handle.writes_submitted(), 3);
    }
}
