//! What the parts of a server hand each other: the names of connections,
//! the messages between workers, a worker's doorbell, and who waits for an
//! operation that spans shards. It imports nothing else of the server, so
//! the worker, the memcpy pool and the cross-shard operations depend on it
//! rather than on each other.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use pfs_core::wire::Sum;
use pfs_core::{ClientId, RequestId};
use pfs_net::EventFd;

/// Most cross-shard operations of one kind (renames, rmdirs) one worker
/// coordinates at once; more is `TryAgain`.
pub const CROSS_MAX: usize = 256;
/// How long a client waits for a cross-shard operation before it gets an
/// error (the operation then still completes in the background).
const CLIENT_PATIENCE: Duration = Duration::from_secs(10);

/// When a client waiting for a cross-shard operation from `now` is told to
/// stop waiting.
pub fn patience(now: Instant) -> Instant {
    now + CLIENT_PATIENCE
}

/// A connection of this worker, as named in ring messages: its slot and the
/// generation of the slot, so a reply for a connection that closed meanwhile is
/// recognised and dropped, and what a read reply's checksum on it covers
/// (`pfs_net::link_sum` of its link: the header only through shared memory),
/// so the worker that runs a forwarded read seals its reply as the link
/// needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnRef {
    pub(crate) slot: u32,
    pub(crate) gen: u32,
    pub(crate) sum: Sum,
}

/// What travels between workers.
#[derive(Debug)]
pub enum Task {
    /// A request frame for the receiving worker's shard, from worker `from`'s
    /// connection `conn`.
    Request {
        /// The communicating worker.
        from: u16,
        /// Its connection.
        conn: ConnRef,
        /// The request frame (header checked).
        buf: Vec<u8>,
    },
    /// The encoded reply to a request this worker forwarded.
    Reply {
        /// The connection to answer on.
        conn: ConnRef,
        /// The reply frame.
        buf: Vec<u8>,
    },
}

/// What other threads see of a worker: its wake-up eventfd and whether it sleeps.
#[derive(Debug)]
pub struct Doorbell {
    pub(crate) wake: EventFd,
    pub(crate) parked: AtomicBool,
}

impl Doorbell {
    /// A doorbell for a new worker.
    pub fn new() -> std::io::Result<Doorbell> {
        Ok(Doorbell { wake: EventFd::new()?, parked: AtomicBool::new(false) })
    }

    /// Wakes the worker if it sleeps (after the caller made work visible to it).
    pub fn ring(&self) {
        if self.parked.load(Ordering::SeqCst) {
            self.wake.notify();
        }
    }

    /// Wakes the worker whether or not it sleeps.
    pub fn ring_always(&self) {
        self.wake.notify();
    }
}

/// Who waits for the outcome of an operation that spans shards (a client's
/// cross-shard rename or bigdir rmdir).
#[derive(Debug)]
pub struct Waiter {
    /// The communicating worker.
    pub origin: u16,
    /// Its connection.
    pub conn: ConnRef,
    /// The client's request id.
    pub request_id: RequestId,
    /// The client.
    pub client: ClientId,
    /// When the client stops being told to wait.
    pub give_up: Instant,
}
