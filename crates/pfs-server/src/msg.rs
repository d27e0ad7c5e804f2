//! What the parts of a server hand each other: the names of connections,
//! the messages between workers, a worker's doorbell, and who waits for an
//! operation that spans shards. It imports nothing else of the server, so
//! the worker, the memcpy pool and the cross-shard operations depend on it
//! rather than on each other.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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
    /// A frame the server sends `client` unasked (a token invalidation), for
    /// whichever worker serves a connection of it; the others drop it.
    Notify {
        /// The client.
        client: ClientId,
        /// The request frame.
        buf: Vec<u8>,
    },
}

/// Which connection each worker's slots hold, published by the worker that
/// owns them and read by any (is the client a multi-shard step answers still
/// connected?): the slot's generation, 0 when empty. No lock: each slot has
/// one writer.
#[derive(Debug)]
pub struct LiveConns {
    gens: Box<[AtomicU32]>,
    per_worker: usize,
}

impl LiveConns {
    /// Room for `per_worker` connections in each of `workers` workers.
    pub fn new(workers: usize, per_worker: usize) -> LiveConns {
        let gens = (0..workers * per_worker).map(|_| AtomicU32::new(0)).collect();
        LiveConns { gens, per_worker }
    }

    /// Connections one worker may hold.
    pub fn per_worker(&self) -> usize {
        self.per_worker
    }

    /// Worker `worker`'s slot `slot` now holds the connection of generation
    /// `gen` (0: none).
    pub fn set(&self, worker: u16, slot: usize, gen: u32) {
        assert!(slot < self.per_worker, "connection slot {slot} beyond the table");
        self.gens[worker as usize * self.per_worker + slot].store(gen, Ordering::Release);
    }

    /// Whether `conn` of worker `worker` is still open.
    pub fn is_live(&self, worker: u16, conn: ConnRef) -> bool {
        let slot = conn.slot as usize;
        slot < self.per_worker
            && self.gens.get(worker as usize * self.per_worker + slot).is_some_and(|g| {
                let gen = g.load(Ordering::Acquire);
                gen != 0 && gen == conn.gen
            })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn conn(slot: u32, gen: u32) -> ConnRef {
        ConnRef { slot, gen, sum: Sum::Full }
    }

    /// A connection is live from its worker's `set` until the slot is
    /// emptied or reused, only in its own worker's table, and a slot beyond
    /// the table (a worker's own messages, `LOCAL_SLOT`) is no connection.
    #[test]
    fn a_connection_is_live_while_its_slot_holds_its_generation() {
        let live = LiveConns::new(2, 4);
        assert!(!live.is_live(0, conn(1, 7)), "an empty slot holds nothing");
        live.set(0, 1, 7);
        assert!(live.is_live(0, conn(1, 7)));
        assert!(!live.is_live(1, conn(1, 7)), "the other worker's slot 1 is empty");
        assert!(!live.is_live(0, conn(1, 6)), "an older connection of the slot");
        live.set(0, 1, 8);
        assert!(!live.is_live(0, conn(1, 7)), "the slot now holds another connection");
        live.set(0, 1, 0);
        assert!(!live.is_live(0, conn(1, 8)), "closed");
        live.set(1, 3, 9);
        assert!(live.is_live(1, conn(3, 9)));
        assert!(!live.is_live(1, conn(4, 9)), "beyond the table");
        assert!(!live.is_live(1, conn(u32::MAX, 9)), "beyond the table");
        assert!(!live.is_live(2, conn(0, 9)), "no such worker");
    }
}
