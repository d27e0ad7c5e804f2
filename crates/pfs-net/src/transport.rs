//! The verbs-shaped interface every backend implements.

use std::os::fd::RawFd;

use crate::rdma::ReplyImm;
use crate::NetError;

/// The caller's tag for a posted operation, returned in its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkId(pub u64);

/// A memory region registered on a queue pair; the peer names it in one-sided
/// operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

/// Bytes of a region: `len` bytes from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionRange {
    /// The region.
    pub region: RegionId,
    /// First byte.
    pub offset: u64,
    /// Byte count.
    pub len: u32,
}

/// Which backend carries a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// TCP sockets with epoll.
    Tcp,
    /// Shared-memory rings with eventfd wake-ups (same host).
    Shm,
    /// An RDMA reliable-connected queue pair (feature `rdma`).
    Rdma,
}

/// A finished operation, returned by [`QueuePair::poll_cq`].
#[derive(Debug)]
pub enum Completion {
    /// A posted send left this side; its buffer comes back for reuse.
    Send {
        /// The send's tag.
        wr: WorkId,
        /// The buffer posted.
        buf: Vec<u8>,
    },
    /// A message arrived in a posted receive buffer: one pfs-core frame whose
    /// header (magic, version, length) and checksum have been checked; the caller
    /// decodes the body with [`pfs_core::Frame::decode`].
    Recv {
        /// The frame bytes.
        buf: Vec<u8>,
    },
    /// A one-sided write was applied to the peer's region.
    Write {
        /// The write's tag.
        wr: WorkId,
    },
    /// A one-sided read landed in the local region.
    Read {
        /// The read's tag.
        wr: WorkId,
    },
    /// The peer's write with immediate ([`QueuePair::post_write_imm`]) landed in a
    /// local region; the immediate says what it was for.
    Imm {
        /// The immediate the peer sent.
        imm: ReplyImm,
    },
}

/// A post refused for back-pressure or because the connection is down; the buffer
/// is handed back so the caller keeps it.
#[derive(Debug)]
pub struct Rejected {
    /// The buffer that was not posted.
    pub buf: Vec<u8>,
    /// Why.
    pub error: NetError,
}

/// One connection, shaped like an RDMA reliable-connected queue pair. Nothing here
/// blocks: posts queue work, [`poll_cq`](Self::poll_cq) makes progress and reports
/// what finished, and an idle caller parks on [`wait_fd`](Self::wait_fd).
///
/// Messages and one-sided operations on one queue pair complete in the order they
/// were posted. A receive needs a posted buffer; without one the peer is held back
/// (back-pressure), never dropped.
pub trait QueuePair {
    /// Queues one encoded pfs-core frame (`Frame::encode` output) for sending.
    fn post_send(&mut self, wr: WorkId, frame: Vec<u8>) -> Result<(), Rejected>;

    /// Lends a buffer for one incoming frame (its capacity is reused; it grows only
    /// for a frame larger than any before).
    fn post_recv(&mut self, buf: Vec<u8>) -> Result<(), Rejected>;

    /// Registers a zeroed region of `len` bytes the peer may write and read.
    fn register_region(&mut self, len: usize) -> Result<RegionId, NetError>;

    /// The bytes of a local region.
    fn region(&self, id: RegionId) -> &[u8];

    /// The bytes of a local region, to change.
    fn region_mut(&mut self, id: RegionId) -> &mut [u8];

    /// Writes `local` bytes into the peer's region `remote` from `remote_offset`.
    fn post_write(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError>;

    /// Reads `local.len` bytes of the peer's region `remote` from `remote_offset`
    /// into `local`.
    fn post_read(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError>;

    /// [`post_write`](Self::post_write), and once the bytes are in the peer's region
    /// the peer's [`poll_cq`](Self::poll_cq) reports [`Completion::Imm`] with `imm`
    /// (RDMA WRITE_WITH_IMM). This side completes with `Completion::Write { wr }`.
    fn post_write_imm(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
        imm: ReplyImm,
    ) -> Result<(), NetError>;

    /// The length of the peer's region `id`, once the peer registered it and its
    /// announcement arrived (announcements travel in order with messages).
    fn peer_region_len(&self, id: RegionId) -> Option<u64>;

    /// Makes progress and appends finished operations to `out` (at most
    /// [`POLL_BATCH`](crate::POLL_BATCH) per call). An `Err` means the connection is
    /// down, with the reason; it stays down.
    fn poll_cq(&mut self, out: &mut Vec<Completion>) -> Result<usize, NetError>;

    /// Prepares to park on [`wait_fd`](Self::wait_fd); `false` if work is already
    /// waiting, so the caller must poll instead of parking.
    fn prepare_wait(&mut self) -> bool;

    /// A descriptor that becomes readable when this queue pair has work; pollable,
    /// so a worker can add it to its own epoll set.
    fn wait_fd(&self) -> RawFd;

    /// The peer's address, for messages.
    fn peer(&self) -> &str;

    /// The backend in use.
    fn backend(&self) -> Backend;
}
