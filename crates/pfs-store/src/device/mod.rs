//! Block devices shaped as submit/complete, so io_uring fits without an adapter.
//!
//! A shard owns one `Device`. It submits [`IoRequest`]s that carry their own
//! [`AlignedBuf`], then collects [`IoCompletion`]s that hand the buffer back. A full
//! submission queue hands the request back too (back-pressure, never growth).
//!
//! - [`mem`]: `MemDevice`, in memory, with fault injection and a crash model.
//! - [`uring`]: `UringDevice`, io_uring with `O_DIRECT` on a file or block device.

mod buf;
pub mod mem;
pub mod uring;

pub use buf::{AlignedBuf, Region, HUGE_PAGE};
pub use mem::{Fault, MemDevice};
pub use uring::{UringDevice, UringOptions, SUBMIT_BELOW};

/// Every offset and length a device sees is a multiple of this.
pub const SECTOR_SIZE: usize = 4096;

/// An error of one device operation. It fails that operation only.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The device reported an I/O error (errno).
    #[error("device I/O error at offset {offset}: {}", std::io::Error::from_raw_os_error(*errno))]
    Io {
        /// Byte offset of the failed operation.
        offset: u64,
        /// The errno the device returned.
        errno: i32,
    },
    /// The device could not be opened or set up.
    #[error("cannot open device {path}: {reason}")]
    Open {
        /// The path given.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The request was outside the device or misaligned.
    #[error("bad request: {0}")]
    BadRequest(String),
}

/// What a request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// Fill `buf` from `offset`.
    Read,
    /// Write `buf` at `offset`.
    Write,
    /// Make every completed write durable (`offset` and `buf` unused).
    Sync,
}

/// One operation handed to a device.
#[derive(Debug)]
pub struct IoRequest {
    /// Chosen by the submitter, returned in the completion.
    pub tag: u64,
    /// What to do.
    pub kind: IoKind,
    /// Byte offset on the device, a multiple of [`SECTOR_SIZE`].
    pub offset: u64,
    /// The data (length a multiple of [`SECTOR_SIZE`]); empty for `Sync`.
    pub buf: AlignedBuf,
}

/// A finished operation, with its buffer handed back.
#[derive(Debug)]
pub struct IoCompletion {
    /// The submitter's tag.
    pub tag: u64,
    /// What was done.
    pub kind: IoKind,
    /// Byte offset of the request.
    pub offset: u64,
    /// The request's buffer (filled for a successful read).
    pub buf: AlignedBuf,
    /// Success, or the error of this operation only.
    pub result: Result<(), DeviceError>,
}

/// A block device shaped as submit/complete.
pub trait Device {
    /// Usable size in bytes (a multiple of [`SECTOR_SIZE`]).
    fn size_bytes(&self) -> u64;

    /// Most requests that can be in flight at once.
    fn queue_depth(&self) -> usize;

    /// Requests submitted and not yet completed.
    fn in_flight(&self) -> usize;

    /// Queues one request. A full queue hands the request back (back-pressure).
    fn submit(&mut self, req: IoRequest) -> Result<(), IoRequest>;

    /// Appends finished requests to `out` without blocking; returns how many.
    fn poll(&mut self, out: &mut Vec<IoCompletion>) -> usize;

    /// Blocks until at least `min` requests finished (or none are in flight);
    /// appends them to `out` and returns how many.
    fn wait(&mut self, out: &mut Vec<IoCompletion>, min: usize) -> usize;

    /// A descriptor that polls readable while finished requests wait to be
    /// collected, so an event loop can sleep in `epoll` with requests in
    /// flight; `None` when completions come only from `poll`/`wait` (an event
    /// loop must then not sleep while it waits for one).
    fn completion_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// A buffer of `len` bytes (rounded up to a sector) suited to this device,
    /// from its registered pool when it has one. Its contents are unspecified (a
    /// pooled buffer keeps bytes from earlier use): fill every byte you write.
    fn alloc_buf(&mut self, len: usize) -> AlignedBuf {
        AlignedBuf::zeroed(len)
    }

    /// Returns a buffer from `alloc_buf` so a pooled one can be reused.
    fn free_buf(&mut self, buf: AlignedBuf) {
        drop(buf);
    }

    /// Makes sure later writes to `offset..offset + len` cannot fail for lack of
    /// space: a sparse file allocates those blocks now. A shard reserves its
    /// metadata, checkpoints and WAL this way, so a full disk under a sparse file
    /// fails data writes only and fsync still works. Devices that are not sparse
    /// have nothing to do.
    fn reserve(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let _ = (offset, len);
        Ok(())
    }
}

/// Runs `reqs` to completion, blocking; completions are returned in `reqs` order
/// (their tags are overwritten). For start-up, recovery and tests; a worker's hot
/// path uses submit/poll. The device must have nothing else in flight, since tags of
/// other requests would be mistaken for ours.
pub fn run_all<D: Device + ?Sized>(dev: &mut D, reqs: Vec<IoRequest>) -> Vec<IoCompletion> {
    assert_eq!(dev.in_flight(), 0, "run_all needs a device with nothing in flight");
    run_batch(dev, reqs, |c| panic!("completion {} of a request run_all did not submit", c.tag))
}

/// Runs `reqs` to completion, blocking, and returns their completions in order.
/// Completions of other requests in flight (tags with bit 63 set) go to `foreign`;
/// batch requests are tagged with their index, below 2^63.
pub fn run_batch<D: Device + ?Sized>(
    dev: &mut D,
    reqs: Vec<IoRequest>,
    mut foreign: impl FnMut(IoCompletion),
) -> Vec<IoCompletion> {
    let total = reqs.len();
    let mut done: Vec<Option<IoCompletion>> = (0..total).map(|_| None).collect();
    let mut pending: std::collections::VecDeque<IoRequest> = reqs.into();
    for (i, req) in pending.iter_mut().enumerate() {
        req.tag = i as u64;
    }
    let mut out = Vec::new();
    let mut finished = 0;
    while finished < total {
        while let Some(req) = pending.pop_front() {
            if let Err(back) = dev.submit(req) {
                pending.push_front(back);
                break;
            }
        }
        assert!(dev.in_flight() > 0, "device refused a request with nothing in flight");
        out.clear();
        dev.wait(&mut out, 1);
        for c in out.drain(..) {
            if c.tag >= 1 << 63 {
                foreign(c);
                continue;
            }
            let i = c.tag as usize;
            assert!(done[i].is_none(), "completion for request {i} seen twice");
            done[i] = Some(c);
            finished += 1;
        }
    }
    done.into_iter().map(|c| c.expect("every request completes")).collect()
}
