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

use crate::host::Host;
use crate::msg::{Waiter, CROSS_MAX};

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
struct RmdirOp {
    txn: u64,
    parent: InodeId,
    name: Vec<u8>,
    dir: InodeId,
    waiter: Option<Waiter>,
    shards: Vec<((ServerId, WorkerId), Seal)>,
    /// Decided; now every shard is told to forget its seal (`Sealed` = forgot),
    /// and the intent goes when all did.
    unsealing: bool,
    /// Decided, and the directory was removed: each shard is told so with its
    /// unseal, and refuses new names in it from then on (`Shard::gone_dir`).
    /// Not known after a crash (a recovered decided intent unseals only).
    removed: bool,
    /// The commit that makes the intent durable: no shard is asked before it
    /// finished (`Shard::commits_done`).
    durable_at: u64,
    /// Times in a row its step on this shard stopped (`Host::step`).
    stops: crate::host::StepStops,
}

impl RmdirOp {
    /// An op whose shards are not known yet ([`ask_all`](Self::ask_all)
    /// fills them in).
    fn unasked(txn: u64, parent: InodeId, name: Vec<u8>, dir: InodeId) -> RmdirOp {
        RmdirOp {
            txn,
            parent,
            name,
            dir,
            waiter: None,
            shards: Vec::new(),
            unsealing: false,
            removed: false,
            durable_at: 0,
            stops: Default::default(),
        }
    }

    /// Every shard of `servers` x `workers` to be asked from `now`.
    fn ask_all(&mut self, (servers, workers): (u32, u32), now: Instant) {
        self.shards = (0..servers)
            .flat_map(|s| (0..workers).map(move |w| (ServerId(s), WorkerId(w))))
            .map(|sw| (sw, Seal::Unsent(now)))
            .collect();
    }

    /// Whether a request to a peer shard is in flight.
    fn awaiting_peer(&self) -> bool {
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

/// The bigdir rmdirs a worker coordinates, each a state machine its worker
/// advances once per round ([`Rmdirs::poll`]).
#[derive(Debug, Default)]
pub(crate) struct Rmdirs {
    ops: Vec<RmdirOp>,
}

impl Rmdirs {
    /// Whether none is under way.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Whether one waits for its intent to be durable, `done` commits having
    /// finished.
    pub(crate) fn wait_for_commit(&self, done: u64) -> bool {
        self.ops.iter().any(|r| r.durable_at > done)
    }

    /// Whether a step of one stopped and runs again in a later round.
    pub(crate) fn has_stopped(&self) -> bool {
        self.ops.iter().any(|op| op.stops.any())
    }

    /// Whether one waits for a reply from another server.
    pub(crate) fn awaiting_peer(&self) -> bool {
        self.ops.iter().any(RmdirOp::awaiting_peer)
    }

    /// Step 1 for a client's `RmdirBigDir`; the reply comes later.
    pub(crate) fn start<D: Device>(
        &mut self,
        h: &mut impl Host<D>,
        waiter: Waiter,
        parent: InodeId,
        name: Vec<u8>,
    ) -> Result<(), FsError> {
        if self.ops.len() >= CROSS_MAX {
            return Err(FsError::TryAgain);
        }
        h.shard().check_name_placed(parent, &name)?;
        let entry = h.shard().lookup(parent, &name)?;
        if entry.kind != FileType::Directory {
            return Err(FsError::NotDir);
        }
        let Some(shape) = h.shape() else { return Err(FsError::TryAgain) };
        let shard = h.shard();
        let txn = shard.new_txn_id()?;
        shard.txn_record(txn, &encode(parent, &name, entry.ino))?;
        // Durable before any shard seals: asked once the commit finished.
        let durable_at = shard.next_commit();
        // A failure fails the shard, which stops the server.
        let _ = shard.start_commit();
        h.changed();
        let mut op = RmdirOp::unasked(txn, parent, name, entry.ino);
        op.ask_all(shape, h.now());
        op.waiter = Some(waiter);
        op.durable_at = durable_at;
        self.ops.push(op);
        Ok(())
    }

    /// An rmdir intent left by a crash, record `data` of transaction `txn`:
    /// run it again.
    pub(crate) fn recover(&mut self, worker: u16, txn: u64, data: &[u8]) {
        let Some((parent, name, dir)) = decode(data) else {
            log::error!("worker {worker}: rmdir intent {txn:#x} does not decode; left as is");
            return;
        };
        // The view arrives with the first heartbeat; until then the shape is
        // unknown, so the op starts with no shards and is filled in when polled.
        let decided = data.first() == Some(&RMDIR_DECIDED);
        log::info!(
            "worker {worker}: resuming rmdir {txn:#x} left by a crash{}",
            if decided { " (decided: unsealing)" } else { "" }
        );
        let mut op = RmdirOp::unasked(txn, parent, name, dir);
        op.unsealing = decided;
        self.ops.push(op);
    }

    /// Advances every rmdir in progress; returns the work done.
    pub(crate) fn poll<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let id = h.worker_id();
        let mut work = 0;
        let mut keep = Vec::with_capacity(self.ops.len());
        for mut op in self.ops.drain(..) {
            if h.shard().commits_done() < op.durable_at {
                keep.push(op);
                continue;
            }
            if op.shards.is_empty() {
                match h.shape() {
                    Some(shape) => op.ask_all(shape, h.now()),
                    None => {
                        keep.push(op);
                        continue;
                    }
                }
            }
            work += Self::advance_seals(h, &mut op);
            let answered =
                op.shards.iter().all(|(_, s)| matches!(s, Seal::Sealed | Seal::Refused(_)));
            if answered && op.unsealing {
                let txn = op.txn;
                match h.step(&mut op.stops, |s| s.txn_forget(txn)) {
                    // Stopped (a commit or room in the log first): again later.
                    None => keep.push(op),
                    Some(forgot) => {
                        work += 1;
                        if let Err(e) = forgot {
                            log::error!("worker {id}: cannot drop rmdir intent {txn:#x}: {e}");
                        }
                        h.changed();
                    }
                }
            } else if answered {
                if Self::decide(h, &mut op) {
                    work += 1;
                }
                keep.push(op);
            } else {
                if let Some(w) = op.waiter.take_if(|w| h.now() >= w.give_up) {
                    let error = FsError::Io(
                        "rmdir waits for a server that does not answer; it completes when it does"
                            .into(),
                    );
                    h.answer(w, Body::Error { op: Opcode::RmdirBigDir, error });
                }
                keep.push(op);
            }
        }
        self.ops = keep;
        work
    }

    fn advance_seals<D: Device>(h: &mut impl Host<D>, op: &mut RmdirOp) -> usize {
        let id = h.worker_id();
        let me = h.shard().id().0;
        let workers = h.workers();
        let now = h.now();
        let mut work = 0;
        let (txn, dir, unsealing, removed) = (op.txn, op.dir, op.unsealing, op.removed);
        for ((server, worker), seal) in op.shards.iter_mut() {
            let g = pfs_core::routing::shard_of(*server, *worker, workers).0;
            match seal.clone() {
                Seal::Unsent(at) if now >= at => {
                    if g == me {
                        let local = h.step(&mut op.stops, |s| match unsealing {
                            true => s.forget_seal(txn, removed),
                            false => s.seal_dir(txn, dir),
                        });
                        // Stopped (a commit or room in the log first): again
                        // next round.
                        let Some(local) = local else { continue };
                        work += 1;
                        *seal = match local {
                            Ok(()) => Seal::Sealed,
                            Err(e) if unsealing || matches!(e, FsError::Io(_)) => {
                                Seal::Unsent(now + RETRY_AFTER)
                            }
                            Err(e) => Seal::Refused(e),
                        };
                        h.changed();
                        continue;
                    }
                    work += 1;
                    let req = match unsealing {
                        true => Request::TxnForget { txn, dir_removed: removed },
                        false => Request::SealDir { txn, dir },
                    };
                    *seal = match h.send(*server, *worker, req) {
                        Ok(sent) => Seal::Sent(sent),
                        Err(e) => {
                            if e.is_failure() {
                                log::warn!(
                                    "worker {id}: rmdir {txn:#x}: cannot reach server {server}: {e}"
                                );
                            }
                            Seal::Unsent(e.retry_at(now))
                        }
                    };
                }
                Seal::Sent(sent) => {
                    match h.poll(*server, sent) {
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
                                "worker {id}: rmdir {txn:#x}: server {server} answered {e}; \
                                 asking again"
                            );
                            *seal = Seal::Unsent(now + RETRY_AFTER);
                        }
                        Ok(Some(Err(e))) => {
                            work += 1;
                            *seal = Seal::Refused(e);
                        }
                        Err(e) => {
                            log::warn!(
                                "worker {id}: rmdir {txn:#x}: server {server} failed: {e}; \
                                 asking again"
                            );
                            h.forget_conn(*server);
                            *seal = Seal::Unsent(now + RETRY_AFTER);
                        }
                    }
                }
                _ => {}
            }
        }
        work
    }

    /// Every shard answered: remove the directory if all sealed, answer the
    /// client, and start unsealing. False when the removal stopped (an inode
    /// page being read, a commit first): it is decided in a later round.
    fn decide<D: Device>(h: &mut impl Host<D>, op: &mut RmdirOp) -> bool {
        let id = h.worker_id();
        let refusal = op.shards.iter().find_map(|(_, s)| match s {
            Seal::Refused(e) => Some(e.clone()),
            _ => None,
        });
        let body = match refusal {
            Some(error) => Body::Error { op: Opcode::RmdirBigDir, error },
            None => {
                let remote = !h.shard().has_inode(op.dir);
                // The name must still be the directory that was sealed: one made
                // again under the same name (after a crash, before recovery ran)
                // is not the one this transaction checked.
                let (parent, name, dir) = (op.parent, &op.name, op.dir);
                let removed = h.step(&mut op.stops, |shard| {
                    match shard.lookup(parent, name).map(|e| e.ino == dir) {
                        Ok(true) => shard.rmdir(parent, name),
                        Ok(false) => Err(FsError::NotFound),
                        Err(e) => Err(e),
                    }
                });
                let Some(removed) = removed else { return false };
                op.removed = removed.is_ok();
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
        if let Err(e) = h.shard().txn_record(op.txn, &decided) {
            log::error!("worker {id}: rmdir {:#x}: cannot log the decision: {e}", op.txn);
        }
        h.changed();
        if let Some(w) = op.waiter.take() {
            h.answer(w, body);
        }
        // A shard that refused holds no seal: forgetting there is a no-op.
        op.unsealing = true;
        let now = h.now();
        for (_, s) in op.shards.iter_mut() {
            *s = Seal::Unsent(now);
        }
        true
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
