//! The sweep of data whose file is gone (docs/cluster.md, "Follow-ups").
//!
//! A client writes a file's blocks on other shards after its create was
//! answered, not after it was durable. If the file's home crashes before its
//! commit, the create is lost but the data on other shards may be durable:
//! nothing will ever free it (inode numbers are never handed out again, so it
//! is never read either). Every few seconds a worker takes the next few inodes
//! that have data on its shard and live elsewhere, asks each one's home whether
//! it exists, and frees the data of those that do not.

use std::time::{Duration, Instant};

use pfs_core::wire::Request;
use pfs_core::{FsError, InodeId, RequestId, ServerId};
use pfs_store::device::Device;

use crate::host::Host;

/// Pause between two batches.
const EVERY: Duration = Duration::from_secs(2);
/// Inodes looked at per batch.
const BATCH: usize = 32;

/// A worker's sweep position and the questions in flight.
#[derive(Debug)]
pub struct Sweep {
    after: InodeId,
    next_at: Instant,
    asked: Vec<(InodeId, ServerId, RequestId)>,
    /// Inodes whose home said they do not exist, whose free stopped (an inode
    /// page being read, a commit first) and runs again in a later round; at
    /// most a batch.
    to_free: Vec<InodeId>,
    /// Times in a row that free stopped (`Host::step`).
    stops: crate::host::StepStops,
}

impl Sweep {
    /// A sweep that starts from the lowest inode number after the first pause.
    pub fn new(now: Instant) -> Sweep {
        Sweep {
            after: InodeId(0),
            next_at: now + EVERY,
            asked: Vec::new(),
            to_free: Vec::new(),
            stops: Default::default(),
        }
    }

    /// Whether a free stopped and runs again in a later round.
    pub fn has_stopped(&self) -> bool {
        !self.to_free.is_empty()
    }

    /// Whether an answer from a peer is awaited.
    pub fn awaiting_peer(&self) -> bool {
        self.asked.iter().any(|a| crate::peers::over_network(a.2))
    }
}

impl Sweep {
    /// Runs the sweep when due; returns the work done.
    pub(crate) fn poll<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        if !self.to_free.is_empty() {
            return self.free(h);
        }
        if self.asked.is_empty() {
            if h.now() < self.next_at {
                return 0;
            }
            return self.batch(h);
        }
        let mut work = 0;
        let mut i = 0;
        while i < self.asked.len() {
            let (ino, server, req) = self.asked[i];
            let answer = match h.poll(server, req) {
                Ok(None) => {
                    i += 1;
                    continue;
                }
                Ok(Some(a)) => Some(a),
                Err(_) => None,
            };
            self.asked.swap_remove(i);
            work += 1;
            if let Some(Err(FsError::NotFound)) = answer {
                self.to_free.push(ino);
            }
            // Anything else (it exists, or no answer): look again next time round.
        }
        if self.asked.is_empty() {
            self.next_at = h.now() + EVERY;
        }
        work + self.free(h)
    }

    /// Frees the data of the inodes found gone, up to the first free that
    /// stops; returns how many were freed.
    fn free<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let mut work = 0;
        while let Some(&ino) = self.to_free.last() {
            let Some(freed) = h.step(&mut self.stops, |s| s.free_foreign(ino)) else { break };
            self.to_free.pop();
            work += 1;
            match freed {
                Ok(()) => {
                    h.changed();
                    log::info!(
                        "worker {}: freed the data of inode {ino}, which its home does not \
                         have (a create lost in a crash)",
                        h.worker_id()
                    );
                }
                Err(e) => log::warn!("worker {}: freeing data of inode {ino}: {e}", h.worker_id()),
            }
        }
        work
    }

    fn batch<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let (found, last) = h.shard().foreign_data(self.after, BATCH);
        // From the start again once the end is reached.
        self.after = last.unwrap_or(InodeId(0));
        self.next_at = h.now() + EVERY;
        let workers = h.workers();
        let Some((servers, _)) = h.shape() else { return 0 };
        for ino in found {
            let (server, worker) = pfs_core::routing::home_of(ino, servers, workers);
            match h.send(server, worker, Request::GetAttr { ino }) {
                Ok(req) => self.asked.push((ino, server, req)),
                Err(_) => break, // That server is away: next time.
            }
        }
        usize::from(!self.asked.is_empty())
    }
}
