//! rmdir of a `bigdir` directory: its entries may be on every shard, so the
//! emptiness check and the removal are one transaction, coordinated by the shard
//! holding the removed name (docs/cluster.md).
//!
//! 1. Record the intent `(parent, name, dir)` and commit it.
//! 2. Collect: ask every shard to seal `dir` (`SealDir`). A shard with an entry of
//!    `dir` says `NotEmpty`; one without records the seal (committed before it
//!    answers), after which creates and renames into `dir` there get `TryAgain`.
//! 3. All sealed: remove the name and the directory here; else leave it. Either
//!    way the intent is marked decided (`RMDIR_DECIDED`), and the client is
//!    answered once that is durable.
//! 4. Unseal every shard (`TxnForget`) and drop the intent.
//!
//! After a crash an undecided intent is found again and the steps rerun: seals
//! are idempotent per transaction, and a name already removed counts as done.
//! A decided one only unseals, so a refusal the client was told is never undone.

use std::time::Instant;

use pfs_core::wire::{Body, Reply, Request};
use pfs_core::{FileType, FsError, InodeId, Opcode, RequestId, ServerId, WorkerId};
use pfs_store::device::Device;
use pfs_store::shard::txn::PARTICIPANT_BIT;

use crate::msg::{Waiter, CROSS_MAX};
use crate::worker::Worker;

/// First byte of an rmdir intent record.
pub const RMDIR_INTENT: u8 = 2;
/// First byte of an rmdir intent that was decided (removed or refused): only
/// the unsealing is left.
pub const RMDIR_DECIDED: u8 = 4;
/// Pause before asking a shard that could not be reached again.
use crate::peers::RETRY_AFTER;

/// The state of one shard's seal.
#[derive(Debug, Clone, PartialEq)]
enum Seal {
    /// Not asked yet (or to be asked again at the instant).
    Unsent(Instant),
    /// Asked; the request id.
    Sent(RequestId),
    /// Sealed.
    Sealed,
    /// Refused with this error.
    Refused(FsError),
}

/// One rmdir in progress.
#[derive(Debug)]
pub struct RmdirOp {
    txn: u64,
    parent: InodeId,
    name: Vec<u8>,
    dir: InodeId,
    waiter: Option<Waiter>,
    shards: Vec<((ServerId, WorkerId), Seal)>,
    /// Decided; now every shard is told to forget its seal (`Sealed` = forgot),
    /// and the intent goes when all did.
    unsealing: bool,
    /// The commit that makes the intent durable: no shard is asked before it
    /// finished (`Shard::commits_done`).
    pub(crate) durable_at: u64,
}

impl RmdirOp {
    /// Whether a request to a peer shard is in flight.
    pub(crate) fn awaiting_peer(&self) -> bool {
        self.shards
            .iter()
            .any(|(_, s)| matches!(s, Seal::Sent(id) if crate::peers::over_network(*id)))
    }
}

fn encode(parent: InodeId, name: &[u8], dir: InodeId) -> Vec<u8> {
    encode_as(RMDIR_INTENT, parent, name, dir)
}

fn encode_as(tag: u8, parent: InodeId, name: &[u8], dir: InodeId) -> Vec<u8> {
    let mut o = vec![tag];
    o.extend_from_slice(&parent.0.to_le_bytes());
    o.push(name.len() as u8);
    o.extend_from_slice(name);
    o.extend_from_slice(&dir.0.to_le_bytes());
    o
}

fn decode(b: &[u8]) -> Option<(InodeId, Vec<u8>, InodeId)> {
    if !matches!(b.first(), Some(&(RMDIR_INTENT | RMDIR_DECIDED))) || b.len() < 18 {
        return None;
    }
    let parent = InodeId(u64::from_le_bytes(b[1..9].try_into().ok()?));
    let n = b[9] as usize;
    let name = b.get(10..10 + n)?.to_vec();
    let rest = b.get(10 + n..)?;
    (rest.len() == 8)
        .then(|| (parent, name, InodeId(u64::from_le_bytes(rest.try_into().expect("8")))))
}

impl<D: Device> Worker<D> {
    /// Step 1 for a client's `RmdirBigDir`; the reply comes later.
    pub(crate) fn start_rmdir(
        &mut self,
        waiter: Waiter,
        parent: InodeId,
        name: Vec<u8>,
    ) -> Result<(), FsError> {
        if self.rmdirs.len() >= CROSS_MAX {
            return Err(FsError::TryAgain);
        }
        let entry = self.shard.lookup(parent, &name)?;
        if entry.kind != FileType::Directory {
            return Err(FsError::NotDir);
        }
        let Some((servers, workers)) = self.peers.shape() else { return Err(FsError::TryAgain) };
        let txn = self.new_txn()?;
        self.shard.txn_record(txn, &encode(parent, &name, entry.ino))?;
        // Durable before any shard seals: asked once the commit finished.
        let durable_at = self.shard.next_commit();
        self.mark_dirty();
        // A failure fails the shard, which stops the server.
        let _ = self.shard.start_commit();
        let mut op = self.rmdir_op(txn, parent, name, entry.ino, servers, workers);
        op.waiter = Some(waiter);
        op.durable_at = durable_at;
        self.rmdirs.push(op);
        Ok(())
    }

    fn rmdir_op(
        &self,
        txn: u64,
        parent: InodeId,
        name: Vec<u8>,
        dir: InodeId,
        servers: u32,
        workers: u32,
    ) -> RmdirOp {
        let shards = (0..servers)
            .flat_map(|s| (0..workers).map(move |w| (ServerId(s), WorkerId(w))))
            .map(|sw| (sw, Seal::Unsent(self.now)))
            .collect();
        RmdirOp { txn, parent, name, dir, waiter: None, shards, unsealing: false, durable_at: 0 }
    }

    /// An rmdir intent left by a crash: run it again.
    pub(crate) fn recover_rmdir(&mut self, txn: u64, data: &[u8]) {
        let Some((parent, name, dir)) = decode(data) else {
            log::error!("worker {}: rmdir intent {txn:#x} does not decode; left as is", self.id);
            return;
        };
        // The view arrives with the first heartbeat; until then the shape is
        // unknown, so the op starts with no shards and is filled in when polled.
        let decided = data.first() == Some(&RMDIR_DECIDED);
        log::info!(
            "worker {}: resuming rmdir {txn:#x} left by a crash{}",
            self.id,
            if decided { " (decided: unsealing)" } else { "" }
        );
        self.rmdirs.push(RmdirOp {
            txn,
            parent,
            name,
            dir,
            waiter: None,
            shards: Vec::new(),
            unsealing: decided,
            durable_at: 0,
        });
    }

    /// Advances every rmdir in progress; returns the work done.
    pub(crate) fn poll_rmdirs(&mut self) -> usize {
        let mut work = 0;
        let mut ops = std::mem::take(&mut self.rmdirs);
        let mut keep = Vec::with_capacity(ops.len());
        for mut op in ops.drain(..) {
            if self.shard.commits_done() < op.durable_at {
                keep.push(op);
                continue;
            }
            if op.shards.is_empty() {
                match self.peers.shape() {
                    Some((s, w)) => {
                        let fresh = self.rmdir_op(op.txn, op.parent, op.name.clone(), op.dir, s, w);
                        op.shards = fresh.shards;
                    }
                    None => {
                        keep.push(op);
                        continue;
                    }
                }
            }
            work += self.advance_seals(&mut op);
            let answered =
                op.shards.iter().all(|(_, s)| matches!(s, Seal::Sealed | Seal::Refused(_)));
            if answered && op.unsealing {
                work += 1;
                if let Err(e) = self.shard.txn_forget(op.txn) {
                    log::error!("worker {}: cannot drop rmdir intent {:#x}: {e}", self.id, op.txn);
                }
                self.mark_dirty();
            } else if answered {
                work += 1;
                self.decide_rmdir(&mut op);
                keep.push(op);
            } else {
                if let Some(w) = op.waiter.take_if(|w| self.now >= w.give_up) {
                    let error = FsError::Io(
                        "rmdir waits for a server that does not answer; it completes when it does"
                            .into(),
                    );
                    self.answer(w, Body::Error { op: Opcode::RmdirBigDir, error });
                }
                keep.push(op);
            }
        }
        keep.append(&mut self.rmdirs);
        self.rmdirs = keep;
        work
    }

    fn advance_seals(&mut self, op: &mut RmdirOp) -> usize {
        let me = self.shard.id().0;
        let mut work = 0;
        let (txn, dir, unsealing) = (op.txn, op.dir, op.unsealing);
        for ((server, worker), seal) in op.shards.iter_mut() {
            let g = self.shard_of(*server, *worker);
            match seal.clone() {
                Seal::Unsent(at) if self.now >= at => {
                    work += 1;
                    if g == me {
                        let local = match unsealing {
                            true => self.shard.txn_forget(txn | PARTICIPANT_BIT),
                            false => self.shard.seal_dir(txn, dir),
                        };
                        *seal = match local {
                            Ok(()) => Seal::Sealed,
                            Err(e) if unsealing || matches!(e, FsError::Io(_)) => {
                                Seal::Unsent(self.now + RETRY_AFTER)
                            }
                            Err(e) => Seal::Refused(e),
                        };
                        self.mark_dirty();
                        continue;
                    }
                    let req = match unsealing {
                        true => Request::TxnForget { txn },
                        false => Request::SealDir { txn, dir },
                    };
                    *seal = match self.peer_send(*server, *worker, req) {
                        Ok(id) => Seal::Sent(id),
                        Err(e) => {
                            if e.is_failure() {
                                log::warn!(
                                    "worker {}: rmdir {txn:#x}: cannot reach server {server}: {e}",
                                    self.id
                                );
                            }
                            Seal::Unsent(e.retry_at(self.now))
                        }
                    };
                }
                Seal::Sent(id) => {
                    match self.peer_poll(*server, id) {
                        Ok(None) => {}
                        Ok(Some(Ok(Reply::SealDir | Reply::TxnForget))) => {
                            work += 1;
                            *seal = Seal::Sealed;
                        }
                        Ok(Some(Ok(other))) => {
                            *seal = Seal::Refused(FsError::Io(format!(
                                "seal answered {:?}",
                                other.opcode()
                            )))
                        }
                        // An unseal must land (the intent goes only when every
                        // shard forgot), and an I/O error or timeout says
                        // nothing of whether a seal is durable: ask again.
                        Ok(Some(Err(e)))
                            if unsealing || matches!(e, FsError::Io(_) | FsError::TimedOut) =>
                        {
                            log::warn!(
                                "worker {}: rmdir {txn:#x}: server {server} answered {e}; \
                                 asking again",
                                self.id
                            );
                            *seal = Seal::Unsent(self.now + RETRY_AFTER);
                        }
                        Ok(Some(Err(e))) => {
                            work += 1;
                            *seal = Seal::Refused(e);
                        }
                        Err(e) => {
                            log::warn!("worker {}: rmdir {txn:#x}: server {server} failed: {e}; asking again", self.id);
                            self.peers.forget_conn(*server);
                            *seal = Seal::Unsent(self.now + RETRY_AFTER);
                        }
                    }
                }
                _ => {}
            }
        }
        work
    }

    fn shard_of(&self, server: ServerId, worker: WorkerId) -> u32 {
        pfs_core::routing::shard_of(server, worker, self.workers()).0
    }

    /// Every shard answered: remove the directory if all sealed, answer the
    /// client, and start unsealing.
    fn decide_rmdir(&mut self, op: &mut RmdirOp) {
        let refusal = op.shards.iter().find_map(|(_, s)| match s {
            Seal::Refused(e) => Some(e.clone()),
            _ => None,
        });
        let body = match refusal {
            Some(error) => Body::Error { op: Opcode::RmdirBigDir, error },
            None => {
                let remote = !self.shard.has_inode(op.dir);
                // The name must still be the directory that was sealed: one made
                // again under the same name (after a crash, before recovery ran)
                // is not the one this transaction checked.
                let same = self.shard.lookup(op.parent, &op.name).map(|e| e.ino == op.dir);
                let removed = match same {
                    Ok(true) => self.shard.rmdir(op.parent, &op.name),
                    Ok(false) => Err(FsError::NotFound),
                    Err(e) => Err(e),
                };
                match removed {
                    Ok(()) => Body::Reply(Reply::Rmdir { ino: op.dir, remote }),
                    // Removed before a crash: the recovered intent only unseals.
                    Err(FsError::NotFound) if op.waiter.is_none() => {
                        Body::Reply(Reply::Rmdir { ino: op.dir, remote })
                    }
                    Err(error) => Body::Error { op: Opcode::RmdirBigDir, error },
                }
            }
        };
        // The decision is logged before the client hears it (the answer waits
        // for the commit): a recovery must not redo an rmdir it was told failed.
        let decided = encode_as(RMDIR_DECIDED, op.parent, &op.name, op.dir);
        if let Err(e) = self.shard.txn_record(op.txn, &decided) {
            log::error!("worker {}: rmdir {:#x}: cannot log the decision: {e}", self.id, op.txn);
        }
        self.mark_dirty();
        if let Some(w) = op.waiter.take() {
            self.answer(w, body);
        }
        // A shard that refused holds no seal: forgetting there is a no-op.
        op.unsealing = true;
        for (_, s) in op.shards.iter_mut() {
            *s = Seal::Unsent(self.now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_intent_round_trips_and_refuses_garbage() {
        let b = encode(InodeId(7), b"name", InodeId(99));
        assert_eq!(decode(&b), Some((InodeId(7), b"name".to_vec(), InodeId(99))));
        let d = encode_as(RMDIR_DECIDED, InodeId(7), b"name", InodeId(99));
        assert_eq!(decode(&d), Some((InodeId(7), b"name".to_vec(), InodeId(99))));
        assert_eq!(decode(&b[..b.len() - 1]), None);
        assert_eq!(decode(&[1, 2, 3]), None);
    }
}
