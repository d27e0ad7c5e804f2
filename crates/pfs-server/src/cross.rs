//! The coordinator of cross-shard renames (docs/cluster.md, "Cross-shard
//! operations"), run by the worker that owns the source name.
//!
//! 1. Record the intent in the shard's transaction table and commit it.
//! 2. Send `XRenameTarget` to the shard of the target name; it checks, applies and
//!    commits its side in one WAL record tagged with the transaction id (so a
//!    re-sent request is answered from that record, never applied twice).
//! 3. On its success, remove the source name and the intent in one record and
//!    answer the client; on its refusal, drop the intent and answer the refusal.
//! 4. Tell the participant to forget the transaction (a follow-up logged with
//!    step 3).
//!
//! After a crash the worker finds the intents left in its table and runs them
//! from step 2 again, so a rename is applied on both shards or on neither. Such
//! a rename, and one whose client stopped waiting, is only *resumed*: the
//! participant finishes it if it had applied its side and abandons it
//! otherwise, so it never lands after later changes of the target name.

use std::time::Instant;

use pfs_core::wire::{Body, RenameFlags, Reply, Request};
use pfs_core::{FsError, InodeId, RequestId, ServerId, WorkerId};
use pfs_store::device::Device;
use pfs_store::shard::meta::encode_dentry;

use crate::host::Host;
use crate::msg::{Waiter, CROSS_MAX};
use crate::peers::RETRY_AFTER;

/// The intent as recorded: everything needed to finish after a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    /// Source directory and name (on this shard).
    pub src_parent: InodeId,
    /// Source name.
    pub src_name: Vec<u8>,
    /// The moved entry's dentry value.
    pub value: u64,
    /// Target directory and name (on the participant).
    pub new_parent: InodeId,
    /// Target name.
    pub new_name: Vec<u8>,
    /// Rename flags.
    pub flags: RenameFlags,
    /// The participant shard.
    pub target: (ServerId, WorkerId),
}

impl Intent {
    /// Encodes the intent (layout in docs/format.md, "Transaction records").
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(64 + self.src_name.len() + self.new_name.len());
        o.push(1); // kind: rename
        o.extend_from_slice(&self.src_parent.0.to_le_bytes());
        o.push(self.src_name.len() as u8);
        o.extend_from_slice(&self.src_name);
        o.extend_from_slice(&self.value.to_le_bytes());
        o.extend_from_slice(&self.new_parent.0.to_le_bytes());
        o.push(self.new_name.len() as u8);
        o.extend_from_slice(&self.new_name);
        o.extend_from_slice(&self.flags.bits().to_le_bytes());
        o.extend_from_slice(&self.target.0 .0.to_le_bytes());
        o.extend_from_slice(&self.target.1 .0.to_le_bytes());
        o
    }

    /// Decodes an intent written by [`encode`](Self::encode).
    pub fn decode(mut b: &[u8]) -> Option<Intent> {
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
            let (h, t) = (b.get(..n)?, b.get(n..)?);
            *b = t;
            Some(h)
        }
        let u64_ = |b: &mut &[u8]| Some(u64::from_le_bytes(take(b, 8)?.try_into().ok()?));
        let u32_ = |b: &mut &[u8]| Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?));
        if take(&mut b, 1)? != [1] {
            return None;
        }
        let src_parent = InodeId(u64_(&mut b)?);
        let n = take(&mut b, 1)?[0] as usize;
        let src_name = take(&mut b, n)?.to_vec();
        let value = u64_(&mut b)?;
        let new_parent = InodeId(u64_(&mut b)?);
        let n = take(&mut b, 1)?[0] as usize;
        let new_name = take(&mut b, n)?.to_vec();
        let flags = RenameFlags::from_bits(u32_(&mut b)?)?;
        let target = (ServerId(u32_(&mut b)?), WorkerId(u32_(&mut b)?));
        b.is_empty().then_some(Intent {
            src_parent,
            src_name,
            value,
            new_parent,
            new_name,
            flags,
            target,
        })
    }
}

/// One rename in progress.
#[derive(Debug)]
struct CrossOp {
    txn: u64,
    intent: Intent,
    waiter: Option<Waiter>,
    /// The participant request in flight, or when to send it again.
    sent: Option<RequestId>,
    retry_at: Instant,
    /// The commit that makes the intent durable: nothing is sent before it
    /// finished (`Shard::commits_done`).
    durable_at: u64,
    /// Nobody waits for the outcome any more (the client was told `EIO`, or
    /// the coordinator restarted): the participant finishes only what it
    /// already applied and abandons the rest, so a rename never lands after
    /// later changes of its target name (`RenameFlags::RESUME`).
    resume: bool,
    /// The participant's answer, kept while the last step that applies it
    /// here stopped (an inode page being read, a commit it needs first): it
    /// runs again in a later round.
    answered: Option<Result<Reply, FsError>>,
    /// Times in a row that step stopped (`Host::step`).
    stops: crate::host::StepStops,
}

/// The cross-shard renames a worker coordinates, each a state machine its
/// worker advances once per round ([`Renames::poll`]).
#[derive(Debug, Default)]
pub(crate) struct Renames {
    ops: Vec<CrossOp>,
}

impl Renames {
    /// Whether none is under way.
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Step 1 for a client's `RenameCross`; the reply comes later.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start<D: Device>(
        &mut self,
        h: &mut impl Host<D>,
        waiter: Waiter,
        src_parent: InodeId,
        src_name: Vec<u8>,
        new_parent: InodeId,
        new_name: Vec<u8>,
        flags: RenameFlags,
        target: (ServerId, WorkerId),
    ) -> Result<(), FsError> {
        if self.ops.len() >= CROSS_MAX {
            return Err(FsError::TryAgain);
        }
        if self.is_moving(src_parent, &src_name) {
            return Err(FsError::TryAgain);
        }
        if flags.contains(RenameFlags::RESUME) {
            return Err(FsError::Invalid("RESUME is not a client's rename flag".into()));
        }
        if new_name.is_empty() || new_name.len() > pfs_core::NAME_MAX {
            return Err(if new_name.is_empty() {
                FsError::Invalid("empty name".into())
            } else {
                FsError::NameTooLong
            });
        }
        let shard = h.shard();
        shard.check_name_placed(src_parent, &src_name)?;
        let src = shard.lookup(src_parent, &src_name)?;
        let intent = Intent {
            src_parent,
            src_name,
            value: encode_dentry(src.ino, src.kind),
            new_parent,
            new_name,
            flags,
            target,
        };
        // A new transaction id: this shard in the top bits, then a counter
        // whose floor the shard logs, so ids never repeat across restarts.
        let txn = shard.new_txn_id()?;
        shard.xrename_begin(txn, intent.src_parent, &intent.src_name, &intent.encode())?;
        // The intent must be durable before the participant changes anything:
        // the op is sent once the commit that covers it finished, and the
        // worker serves meanwhile.
        let durable_at = shard.next_commit();
        // A failure fails the shard, which stops the server.
        let _ = shard.start_commit();
        h.changed();
        self.ops.push(CrossOp {
            txn,
            intent,
            waiter: Some(waiter),
            sent: None,
            retry_at: h.now(),
            durable_at,
            resume: false,
            answered: None,
            stops: Default::default(),
        });
        Ok(())
    }

    /// An intent a previous run left (after a crash), record `data` of
    /// transaction `txn`: resumed.
    pub(crate) fn recover(&mut self, worker: u16, now: Instant, txn: u64, data: &[u8]) {
        match Intent::decode(data) {
            Some(intent) => {
                log::info!("worker {worker}: resuming cross-shard rename {txn:#x} left by a crash");
                self.ops.push(CrossOp {
                    txn,
                    intent,
                    waiter: None,
                    sent: None,
                    retry_at: now,
                    durable_at: 0,
                    resume: true,
                    answered: None,
                    stops: Default::default(),
                });
            }
            None => log::error!(
                "worker {worker}: transaction {txn:#x} holds an undecodable intent; left as is"
            ),
        }
    }

    fn dispatch<D: Device>(h: &mut impl Host<D>, op: &mut CrossOp) {
        let id = h.worker_id();
        if op.waiter.as_ref().is_some_and(|w| !h.connected(w)) {
            // The client is gone (killed, most likely): nobody learns the
            // outcome, so the rename must not land after what runs from now
            // on. Only what the participant already applied is finished.
            log::info!("worker {id}: rename {:#x}: its client left; resuming it only", op.txn);
            op.waiter = None;
            op.resume = true;
        }
        let i = &op.intent;
        log::debug!("worker {id}: rename {:#x}: asking {:?}", op.txn, i.target);
        let flags = if op.resume { i.flags | RenameFlags::RESUME } else { i.flags };
        let req = Request::XRenameTarget {
            txn: op.txn,
            parent: i.new_parent,
            name: i.new_name.clone(),
            value: i.value,
            flags,
        };
        match h.send(i.target.0, i.target.1, req) {
            Ok(sent) => op.sent = Some(sent),
            Err(e) => {
                if e.is_failure() {
                    log::warn!(
                        "worker {id}: rename {:#x}: cannot reach server {}: {e}",
                        op.txn,
                        i.target.0
                    );
                }
                op.sent = None;
                op.retry_at = e.retry_at(h.now());
            }
        }
    }

    /// Advances every rename in progress; returns the work done.
    pub(crate) fn poll<D: Device>(&mut self, h: &mut impl Host<D>) -> usize {
        let id = h.worker_id();
        let mut work = 0;
        let mut i = 0;
        while i < self.ops.len() {
            let mut op = self.ops.swap_remove(i);
            let now = h.now();
            let durable = h.shard().commits_done() >= op.durable_at;
            let outcome = match op.sent {
                // Its last step stopped: again.
                _ if op.answered.is_some() => op.answered.take(),
                None if now >= op.retry_at && durable => {
                    Self::dispatch(h, &mut op);
                    None
                }
                None => None,
                Some(sent) => match h.poll(op.intent.target.0, sent) {
                    Ok(None) => None,
                    // An I/O error (the participant's commit failed, it is
                    // stopping) says nothing of whether its side is durable:
                    // not a refusal. Ask again; a recovered participant answers
                    // from its record, or checks and applies anew.
                    Ok(Some(Err(e @ (FsError::Io(_) | FsError::TimedOut)))) => {
                        log::warn!(
                            "worker {id}: rename {:#x}: participant answered {e}; asking again",
                            op.txn
                        );
                        op.sent = None;
                        op.retry_at = now + RETRY_AFTER;
                        None
                    }
                    Ok(Some(result)) => Some(result),
                    Err(e) => {
                        log::warn!(
                            "worker {id}: rename {:#x}: participant failed: {e}; retrying",
                            op.txn
                        );
                        h.forget_conn(op.intent.target.0);
                        op.sent = None;
                        op.retry_at = now + RETRY_AFTER;
                        None
                    }
                },
            };
            let stopped = match outcome {
                Some(result) => Self::finish(h, op, result),
                None => Some(op),
            };
            match stopped {
                None => work += 1,
                Some(op) if op.answered.is_some() => {
                    self.ops.push(op);
                    let last = self.ops.len() - 1;
                    self.ops.swap(i, last);
                    i += 1;
                }
                Some(mut op) => {
                    if let Some(w) = op.waiter.take_if(|w| now >= w.give_up) {
                        op.resume = true;
                        let e = FsError::Io(format!(
                            "rename waits for server {}; it completes if that server applied \
                             it, and is abandoned otherwise",
                            op.intent.target.0
                        ));
                        h.answer(w, Body::Error { op: pfs_core::Opcode::RenameCross, error: e });
                    }
                    self.ops.push(op);
                    let last = self.ops.len() - 1;
                    self.ops.swap(i, last);
                    i += 1;
                }
            }
        }
        work
    }

    /// Applies the participant's answer here and answers the client; the
    /// op back when that step stopped (`answered` holds the answer again).
    fn finish<D: Device>(
        h: &mut impl Host<D>,
        mut op: CrossOp,
        result: Result<Reply, FsError>,
    ) -> Option<CrossOp> {
        let id = h.worker_id();
        log::debug!("worker {id}: rename {:#x}: participant answered {result:?}", op.txn);
        let participant =
            pfs_core::routing::shard_of(op.intent.target.0, op.intent.target.1, h.workers());
        let txn = op.txn;
        let stepped = match &result {
            // The participant forgets its record by a follow-up logged with
            // this step: only once it is durable (a participant that forgot
            // first could be asked again by a recovery rerunning the intent,
            // and would apply the rename a second time; the SIGKILL soak
            // found that).
            Ok(Reply::XRenameTarget { old, .. }) => {
                let replacement = (*old != 0).then_some(*old);
                let i = &op.intent;
                h.step(&mut op.stops, |s| {
                    s.xrename_finish(
                        txn,
                        i.src_parent,
                        &i.src_name,
                        i.value,
                        i.new_parent,
                        replacement,
                        participant,
                    )
                })
            }
            Ok(_) => Some(Ok(())),
            // The participant changed nothing: drop the intent, and have it
            // forget the record it keeps of an abandoned one.
            Err(_) => h.step(&mut op.stops, |s| s.xrename_abandon(txn, participant)),
        };
        let Some(stepped) = stepped else {
            op.answered = Some(result);
            return Some(op);
        };
        let body = match (result, stepped) {
            (Ok(Reply::XRenameTarget { replaced, .. }), Ok(())) => {
                h.changed();
                Body::Reply(Reply::RenameCross { replaced })
            }
            (Ok(Reply::XRenameTarget { .. }), Err(error)) => {
                // The intent stays: the next start finishes it.
                log::error!("worker {id}: rename {txn:#x}: cannot remove the source name: {error}");
                Body::Error { op: pfs_core::Opcode::RenameCross, error }
            }
            (Ok(other), _) => {
                log::error!(
                    "worker {id}: rename {txn:#x}: participant answered {:?}",
                    other.opcode()
                );
                Body::Error {
                    op: pfs_core::Opcode::RenameCross,
                    error: FsError::Io(format!("participant answered {:?}", other.opcode())),
                }
            }
            (Err(refusal), dropped) => {
                if let Err(e) = dropped {
                    log::error!("worker {id}: cannot drop intent {txn:#x}: {e}");
                }
                h.changed();
                Body::Error { op: pfs_core::Opcode::RenameCross, error: refusal }
            }
        };
        if let Some(w) = op.waiter.take() {
            h.answer(w, body);
        }
        None
    }

    /// Whether a rename's last step stopped and runs again in a later round.
    pub(crate) fn has_stopped(&self) -> bool {
        self.ops.iter().any(|op| op.answered.is_some())
    }

    /// Whether `parent/name` is the source of a cross-shard rename under way
    /// here. Until it ends, the name is locked: an unlink or rename of it could
    /// free or move the inode the new name is about to point to, or a late
    /// recovered rename could land over later changes (the SIGKILL soak found a
    /// name left pointing to a freed inode that way).
    pub(crate) fn is_moving(&self, parent: InodeId, name: &[u8]) -> bool {
        self.ops.iter().any(|op| op.intent.src_parent == parent && op.intent.src_name == name)
    }

    /// Whether `req` names a locked source name (see [`is_moving`](Self::is_moving));
    /// it is answered `TryAgain`, which clients retry.
    ///
    /// - Changes of the name: an unlink, rmdir or rename of it, and a rename
    ///   onto it from another shard (`XRenameTarget`), could free or move the
    ///   inode the target name already points to (the SIGKILL soak found names
    ///   left pointing to freed inodes).
    /// - Lookups: once the participant applied its side the rename has
    ///   happened, so the source name must not be found any more. Until the
    ///   coordinator knows, a lookup waits: otherwise a client could find the
    ///   name, write through it, and see the name vanish when a rename resumed
    ///   after a crash ends (the soak found that too).
    pub(crate) fn names_moving(&self, req: &Request) -> bool {
        match req {
            Request::Lookup { parent, name }
            | Request::LookupData { parent, name }
            | Request::Unlink { parent, name }
            | Request::Rmdir { parent, name }
            | Request::RmdirBigDir { parent, name }
            | Request::XRenameTarget { parent, name, .. } => self.is_moving(*parent, name),
            Request::Rename { parent, name, new_parent, new_name, .. }
            | Request::RenameCross { parent, name, new_parent, new_name, .. } => {
                self.is_moving(*parent, name) || self.is_moving(*new_parent, new_name)
            }
            _ => false,
        }
    }

    /// Whether one waits for its intent to be durable, `done` commits having
    /// finished.
    pub(crate) fn wait_for_commit(&self, done: u64) -> bool {
        self.ops.iter().any(|c| c.durable_at > done)
    }

    /// Whether one waits for a reply from another server.
    pub(crate) fn awaiting_peer(&self) -> bool {
        self.ops.iter().any(|c| c.sent.is_some_and(crate::peers::over_network))
    }
}
