//! Follow-ups, the shard's part (docs/cluster.md, "Follow-ups").
//!
//! An operation whose effect reaches another shard logs that effect as a
//! follow-up record in its own WAL record: `id -> [FOLLOW_TAG, target, op]` in
//! the transaction table, under a coordinator id of this shard. Once the record
//! is durable ([`take_ready_follow_ups`](Shard::take_ready_follow_ups)) the
//! worker sends it; the target applies it with
//! [`apply_follow_ups`](Shard::apply_follow_ups), which keeps per sending shard
//! the highest id applied (a watermark record, in the same WAL record as the
//! effect), so a follow-up sent again after any crash is applied once. When the
//! target has answered, the sender deletes the record.
//!
//! Transaction ids must never repeat, or a target would take a new follow-up for
//! an old one: the shard hands them out from a counter whose floor it logs in
//! chunks (`FLOOR_KEY`), so a restart continues above every id ever used.

use pfs_core::wire::FollowOp;
use pfs_core::{FileLayout, FileType, FsError, FsResult, InodeId, ShardId};

use super::txn::PARTICIPANT_BIT;
use super::{tables, Shard};
use crate::device::Device;
use crate::inode::Inode;
use crate::wal::Change;

/// First byte of a follow-up record.
pub const FOLLOW_TAG: u8 = 3;
/// With [`PARTICIPANT_BIT`]: bookkeeping records (watermarks, the id floor),
/// never transactions.
pub const MARK_BIT: u64 = 1 << 62;
/// The record holding the id floor: no id at or above it was handed out.
pub const FLOOR_KEY: u64 = PARTICIPANT_BIT | MARK_BIT | (1 << 61);
/// Ids reserved per floor record.
const ID_CHUNK: u64 = 4096;
/// The record holding the inode number floor: no inode number at or above it
/// was handed out (`ensure_ino_floor`).
pub const INO_FLOOR_KEY: u64 = PARTICIPANT_BIT | MARK_BIT | (1 << 60);
/// Inode numbers reserved per inode floor record (one commit each).
const INO_CHUNK: u64 = 1 << 16;
/// Target of a follow-up that goes to every shard holding the file's data.
const DATA_SHARDS: u32 = u32::MAX;

/// Where a follow-up goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FollowTarget {
    /// One shard.
    Shard(ShardId),
    /// Every shard but the inode's home that may hold data of the file (the
    /// worker works them out from the layout and sizes).
    DataShards,
}

/// What a target made of a batch of follow-ups
/// ([`apply_follow_ups`](Shard::apply_follow_ups)).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The watermark: every follow-up of the batch up to it is done.
    pub through: u64,
    /// Those up to `through` refused (hard links whose file was removed
    /// first): the sender undoes its side.
    pub refused: Vec<u64>,
    /// A note for each that found nothing to do or was refused, for the log.
    pub notes: Vec<String>,
}

/// A follow-up record: logged, to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowUp {
    /// Its transaction id (this shard's).
    pub id: u64,
    /// Where it goes.
    pub target: FollowTarget,
    /// What it does there.
    pub op: FollowOp,
}

/// The watermark record of sending shard `from`.
pub fn mark_key(from: ShardId) -> u64 {
    PARTICIPANT_BIT | MARK_BIT | u64::from(from.0)
}

/// Whether transaction record `id` is bookkeeping (a watermark or the floor).
pub fn is_mark(id: u64) -> bool {
    id & (PARTICIPANT_BIT | MARK_BIT) == PARTICIPANT_BIT | MARK_BIT
}

/// The follow-up a transaction record holds, if it is one.
pub fn decode_follow(id: u64, data: &[u8]) -> Option<FollowUp> {
    if id & PARTICIPANT_BIT != 0 || data.first() != Some(&FOLLOW_TAG) {
        return None;
    }
    let t = u32::from_le_bytes(data.get(1..5)?.try_into().ok()?);
    let target =
        if t == DATA_SHARDS { FollowTarget::DataShards } else { FollowTarget::Shard(ShardId(t)) };
    let (op, len) = FollowOp::from_prefix(data.get(5..)?)?;
    // Only a hard link's record keeps more: the name it made.
    let rest = data.len() - 5 - len;
    match op {
        FollowOp::AddLink { .. } if rest == 0 || rest > 8 => {}
        _ if rest == 0 => {}
        _ => return None,
    }
    Some(FollowUp { id, target, op })
}

/// The name an `AddLink` record keeps after its follow-up (its directory and
/// the name itself), for taking it away if the home refuses the link
/// (`Shard::undo_link`). `None` for a record written without it (before
/// 2026-11-28) or any other record.
pub fn decode_link_name(data: &[u8]) -> Option<(InodeId, &[u8])> {
    let (op, len) = FollowOp::from_prefix(data.get(5..)?)?;
    if !matches!(op, FollowOp::AddLink { .. }) {
        return None;
    }
    let rest = data.get(5 + len..)?;
    let parent = InodeId(u64::from_le_bytes(rest.get(..8)?.try_into().ok()?));
    let name = rest.get(8..).filter(|n| !n.is_empty())?;
    Some((parent, name))
}

/// A follow-up record's bytes (see [`decode_follow`]).
pub fn encode_follow(target: FollowTarget, op: &FollowOp) -> Vec<u8> {
    let mut o = vec![FOLLOW_TAG];
    let t = match target {
        FollowTarget::Shard(s) => s.0,
        FollowTarget::DataShards => DATA_SHARDS,
    };
    o.extend_from_slice(&t.to_le_bytes());
    o.extend_from_slice(&op.to_bytes());
    o
}

/// Whether a regular file of `layout` and `size` may have data past `cut` on
/// shards other than its home (block 0 of a `block` file and all of a `file`
/// file are at the home), with blocks of `block_size` bytes.
pub fn has_remote_data(layout: FileLayout, cut: u64, size: u64, block_size: u64) -> bool {
    match layout {
        FileLayout::File => false,
        FileLayout::Block => size > cut.max(block_size),
        FileLayout::Io => size > cut,
    }
}

fn u64_of(data: &[u8]) -> u64 {
    data.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

impl<D: Device> Shard<D> {
    /// After recovery: continue ids above the logged floor and every id in the
    /// table. The next id logs a new floor.
    pub(super) fn resume_txn_ids(&mut self) {
        let own = u64::from(self.id().0);
        let mut next = 1;
        for (id, data) in &self.txns {
            if *id == INO_FLOOR_KEY {
                self.ino_floor = self.ino_floor.max(u64_of(data));
            } else if *id == FLOOR_KEY {
                next = next.max(u64_of(data));
            } else if id & PARTICIPANT_BIT == 0 && id >> 48 == own {
                next = next.max((id & ((1 << 48) - 1)) + 1);
            }
        }
        self.txn_next = next;
        self.txn_floor = next;
        // Numbers a lost create handed out before the crash are not reused.
        self.next_ino_seq = self.next_ino_seq.max(self.ino_floor);
    }

    /// Inode numbers are never handed out twice, even when a crash loses the
    /// create that used one: its client may have written the file's data on
    /// other shards, and a new file of that number would find it there. So no
    /// number at or past the durable floor goes out. Half a chunk before the
    /// floor, the next one, 65 536 further, is logged, and the group commit
    /// makes it durable long before it is needed; only when numbers run out
    /// before that (the first create after an open) does the create wait for
    /// a commit.
    pub(super) fn ensure_ino_floor(&mut self) -> FsResult<()> {
        if let Some((floor, commit)) = self.ino_floor_next {
            if self.commits_done >= commit {
                self.ino_floor = floor;
                self.ino_floor_next = None;
            }
        }
        // Logging the floor turns deferral off for the rest of the request.
        let could_defer = self.defer_misses && self.op_changes == 0;
        if self.ino_floor_next.is_none() && self.next_ino_seq + INO_CHUNK / 2 >= self.ino_floor {
            let floor = self.next_ino_seq.max(self.ino_floor) + INO_CHUNK;
            if !self.txns.contains_key(&INO_FLOOR_KEY) {
                self.reserve_table_bytes(tables::txn_bytes(&[0; 8]))?;
            }
            self.begin()?;
            self.log(Change::TxnPut { id: INO_FLOOR_KEY, data: floor.to_le_bytes().to_vec() })?;
            self.finish()?;
            self.ino_floor_next = Some((floor, self.next_commit()));
        }
        if self.next_ino_seq >= self.ino_floor {
            // The floor record is an operation of its own, finished: the
            // create has changed nothing yet and may stop for its commit.
            self.defer_misses = could_defer;
            self.commit_first()?;
            let (floor, _) = self.ino_floor_next.take().expect("a floor logged above");
            self.ino_floor = floor;
        }
        Ok(())
    }

    /// Of the next `max` inodes after `after` with data here, those that live
    /// on another shard, and the last one looked at (`None`: no more), for the
    /// sweep of data whose file is gone.
    pub fn foreign_data(&self, after: InodeId, max: usize) -> (Vec<InodeId>, Option<InodeId>) {
        let start = InodeId(after.0.saturating_add(1));
        // Each map is ordered by inode: the first `max` distinct of each cover
        // the first `max` of both.
        let distinct = |inos: &mut dyn Iterator<Item = InodeId>| {
            let mut v: Vec<InodeId> = Vec::new();
            for ino in inos {
                if v.last() != Some(&ino) {
                    if v.len() == max {
                        break;
                    }
                    v.push(ino);
                }
            }
            v
        };
        let mut out = distinct(
            &mut self.blocks.range((start, pfs_core::BlockIndex(0))..).map(|((i, _), _)| *i),
        );
        out.extend(distinct(&mut self.extents.range((start, 0)..).map(|((i, _), _)| *i)));
        out.sort();
        out.dedup();
        out.truncate(max);
        let last = out.last().copied();
        out.retain(|i| !self.is_home_of(*i));
        (out, last)
    }

    /// Frees all data here of `ino`, which lives on another shard and does
    /// not exist there (its home said so): data of a file whose create a crash
    /// lost, or that nothing else freed.
    pub fn free_foreign(&mut self, ino: InodeId) -> FsResult<()> {
        if self.is_home_of(ino) {
            return Err(FsError::Invalid(format!("inode {ino} was allocated here")));
        }
        self.settle(ino)?;
        self.begin()?;
        let max = super::data::MAX_FILE_SIZE;
        let mut inode: Inode = Self::homed_elsewhere(ino, FileLayout::Io, max);
        self.free_data_from(&mut inode, 0, true)?;
        self.finish()
    }

    /// A new transaction id for a record logged outside an operation (an intent).
    pub fn new_txn_id(&mut self) -> FsResult<u64> {
        if self.txn_next + 1 >= self.txn_floor {
            self.begin()?;
            let id = self.txn_id_in_op()?;
            self.finish()?;
            return Ok(id);
        }
        self.txn_next += 1;
        Ok(self.compose_txn(self.txn_next - 1))
    }

    fn compose_txn(&self, seq: u64) -> u64 {
        (u64::from(self.id().0) << 48) | (seq & ((1 << 48) - 1))
    }

    /// A new transaction id inside an operation; logs a higher floor when the
    /// reserved chunk is used up.
    fn txn_id_in_op(&mut self) -> FsResult<u64> {
        let seq = self.txn_next;
        self.txn_next += 1;
        if self.txn_next >= self.txn_floor {
            let floor = self.txn_next + ID_CHUNK;
            self.log(Change::TxnPut { id: FLOOR_KEY, data: floor.to_le_bytes().to_vec() })?;
        }
        Ok(self.compose_txn(seq))
    }

    /// Checks, before an operation begins, that it can log up to `n` follow-ups
    /// (and a floor record): a full table is `TryAgain`, never a half operation.
    pub(super) fn follow_room(&self, n: usize) -> FsResult<()> {
        if self.txns.len() + n + 1 > super::txn::TXN_TABLE_MAX {
            return Err(FsError::TryAgain);
        }
        let one = tables::txn_bytes(&[0; 5 + pfs_core::wire::follow::MAX_FOLLOW_BYTES]);
        self.reserve_table_bytes(one * (n as u64 + 1))
    }

    /// Logs follow-up `op` for `target` in the operation in progress.
    pub(super) fn follow(&mut self, target: FollowTarget, op: FollowOp) -> FsResult<()> {
        let id = self.txn_id_in_op()?;
        self.log(Change::TxnPut { id, data: encode_follow(target, &op) })?;
        self.follow_pending.push(FollowUp { id, target, op });
        Ok(())
    }

    /// Logs the follow-up that counts a hard link of `ino`, named `name` in
    /// `parent` on this shard, at the inode's home. The record keeps the name
    /// after the follow-up: if the home refuses the link (the file's last
    /// name was removed before the link was counted), the name goes again
    /// ([`undo_link`](Self::undo_link)) instead of naming a removed file.
    pub(super) fn follow_link(
        &mut self,
        ino: InodeId,
        parent: InodeId,
        name: &[u8],
    ) -> FsResult<()> {
        let target = FollowTarget::Shard(ino.shard().unwrap_or(ShardId(0)));
        let op = FollowOp::AddLink { ino };
        let id = self.txn_id_in_op()?;
        let mut data = encode_follow(target, &op);
        data.extend_from_slice(&parent.0.to_le_bytes());
        data.extend_from_slice(name);
        self.log(Change::TxnPut { id, data })?;
        self.follow_pending.push(FollowUp { id, target, op });
        Ok(())
    }

    /// Sender: the inode's home refused hard link follow-up `id` (the file
    /// was removed before the link was counted). The name the link made goes,
    /// if it still names that inode here, and the record with it, in one
    /// operation; the directory's times change as for an unlink. Returns
    /// whether a name went (`false` also for a record already gone).
    pub fn undo_link(&mut self, id: u64) -> FsResult<bool> {
        let Some(data) = self.txns.get(&id) else { return Ok(false) };
        let Some(FollowUp { op: FollowOp::AddLink { ino }, .. }) = decode_follow(id, data) else {
            return Err(FsError::Invalid(format!("record {id:#x} is not a hard link's")));
        };
        let named = decode_link_name(data).map(|(parent, name)| (parent, name.to_vec()));
        let entry = match &named {
            Some((parent, name)) => match self.lookup(*parent, name) {
                Ok(e) if e.ino == ino => Some((*parent, e)),
                Ok(_) | Err(FsError::NotFound) => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let parent_here = entry.as_ref().is_some_and(|(p, _)| self.has_inode(*p));
        if let Some((parent, _)) = entry.as_ref().filter(|_| parent_here) {
            self.warm_inodes(&[*parent])?;
        }
        self.begin()?;
        if let Some((parent, e)) = &entry {
            self.log(Change::DentryDel { parent: *parent, name: e.name.clone() })?;
            if parent_here {
                let mut p = self.inode(*parent)?;
                let now = self.now();
                p.mtime_ns = now;
                p.ctime_ns = now;
                self.put_inode(&p)?;
            }
        }
        self.log(Change::TxnDel { id })?;
        self.finish()?;
        Ok(entry.is_some())
    }

    /// Logs the follow-up that drops a link of `ino` at its home.
    pub(super) fn follow_drop(&mut self, ino: InodeId) -> FsResult<()> {
        let home = ino.shard().unwrap_or(ShardId(0));
        self.follow(FollowTarget::Shard(home), FollowOp::Drop { ino })
    }

    /// Logs the follow-up that frees the data elsewhere of a file freed here.
    pub(super) fn follow_free(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        size: u64,
    ) -> FsResult<()> {
        if !has_remote_data(layout, 0, size, u64::from(self.geo.block_size)) {
            return Ok(());
        }
        self.follow(FollowTarget::DataShards, FollowOp::FreeData { ino, layout, old_size: size })
    }

    /// Logs the follow-up that adjusts directory `dir`, which lives elsewhere.
    pub(super) fn follow_adjust(&mut self, dir: InodeId, nlink_delta: i64) -> FsResult<()> {
        if nlink_delta == 0 || self.is_home_of(dir) {
            return Ok(());
        }
        let home = dir.shard().unwrap_or(ShardId(0));
        let nlink_delta = nlink_delta.clamp(-2, 2) as i32;
        self.follow(FollowTarget::Shard(home), FollowOp::AdjustDir { dir, nlink_delta })
    }

    /// Follow-ups whose records are durable, to be sent; each is handed out
    /// once (after a restart, every one in the table is).
    pub fn take_ready_follow_ups(&mut self) -> Vec<FollowUp> {
        std::mem::take(&mut self.follow_ready)
    }

    /// Whether durable follow-ups wait to be taken.
    pub fn has_ready_follow_ups(&self) -> bool {
        !self.follow_ready.is_empty()
    }

    /// Whether follow-ups wait for a commit before they can be sent.
    pub fn has_pending_follow_ups(&self) -> bool {
        !self.follow_pending.is_empty()
    }

    /// The lowest id the next follow-up can get: those logged from now on (by
    /// the request about to run) have ids at or above it.
    pub fn txn_id_mark(&self) -> u64 {
        self.compose_txn(self.txn_next)
    }

    /// Follow-ups logged with ids at or above `mark` and not yet taken.
    pub fn follow_ups_since(&self, mark: u64) -> impl Iterator<Item = &FollowUp> {
        let committing = self.committing.iter().flat_map(|c| &c.follow);
        self.follow_pending
            .iter()
            .chain(committing)
            .chain(&self.follow_ready)
            .filter(move |u| u.id >= mark)
    }

    /// Every follow-up record in the table, in id order.
    pub fn follow_ups(&self) -> Vec<FollowUp> {
        self.txns.iter().filter_map(|(id, d)| decode_follow(*id, d)).collect()
    }

    /// The highest follow-up id applied from shard `from`.
    pub fn follow_mark(&self, from: ShardId) -> u64 {
        self.txns.get(&mark_key(from)).map_or(0, |d| u64_of(d))
    }

    /// The sender's part after the target answered: the record goes.
    pub fn follow_done(&mut self, id: u64) -> FsResult<()> {
        self.txn_forget(id)
    }

    /// Target: applies `ops` (id order) from shard `from`, each at most once and
    /// each in one WAL record with the watermark. Returns the watermark and a
    /// note for each follow-up that found nothing to do (already gone), for the
    /// log. A transient failure (a full table, a device error) stops there: the
    /// sender sends the rest again.
    ///
    /// With misses deferred (`set_defer_misses`), none waits for an inode
    /// page: when the first new one's page is not in memory, the pages of all
    /// of them start being read (`warm_inodes`) and the request stops before
    /// it changed anything; otherwise they apply up to the first whose page
    /// is not in memory, the later ones' pages start being read, and the
    /// watermark returned tells the sender which to send again. (Each stop
    /// of a batch of 256 over more pages than the Icache reads at once read
    /// some of them; after four, it read the rest waiting.)
    ///
    /// A hard link whose inode is gone (`AddLink`; its file's last name was
    /// removed before the link was counted) is refused: the sender takes the
    /// new name away again. So is one sent again after it was applied or
    /// refused (the first answer was lost) when its inode is gone by now:
    /// then the name was removed already, or never counted.
    pub fn apply_follow_ups(
        &mut self,
        from: ShardId,
        ops: &[(u64, FollowOp)],
    ) -> FsResult<Applied> {
        if let Some(&(id, _)) =
            ops.iter().find(|&&(id, _)| id & PARTICIPANT_BIT != 0 || id >> 48 != u64::from(from.0))
        {
            return Err(FsError::Invalid(format!(
                "follow-up id {id:#x} is not one of shard {from}"
            )));
        }
        let key = mark_key(from);
        let mut mark = self.follow_mark(from);
        let mut refused = Vec::new();
        let gone_link = |s: &Self, op: &FollowOp| match op {
            FollowOp::AddLink { ino } => !s.has_inode(*ino),
            _ => false,
        };
        let new = ops.iter().position(|&(id, _)| id > mark).unwrap_or(ops.len());
        refused.extend(ops[..new].iter().filter(|(_, op)| gone_link(self, op)).map(|(id, _)| *id));
        let ops = &ops[new..];
        // Set now: the first change clears `defer_misses`.
        let may_stop = self.defer_misses && self.op_changes == 0;
        let cold = match may_stop {
            true => ops.iter().position(|(_, op)| {
                changed_inode(op)
                    .and_then(|ino| self.inode_slots.get(&ino))
                    .is_some_and(|&slot| !self.icache.resident(slot))
            }),
            false => None,
        };
        let inos = |ops: &[(u64, FollowOp)]| -> Vec<InodeId> {
            ops.iter().filter_map(|(_, op)| changed_inode(op)).collect()
        };
        let ops = match cold {
            // The inodes they change, their pages read before the first change
            // (the request stops until they are in memory), so none is missed
            // afterwards, where a miss waits.
            Some(0) => {
                self.warm_inodes(&inos(ops))?;
                ops
            }
            Some(cold) => {
                let later = inos(&ops[cold..]);
                let slots = later.iter().filter_map(|i| self.inode_slots.get(i).copied());
                self.start_page_reads(slots.collect(), 64);
                &ops[..cold]
            }
            None => ops,
        };
        let mut notes = Vec::new();
        let mut applied = 0;
        for &(id, op) in ops {
            // Out of order: applied already.
            if id <= mark {
                if gone_link(self, &op) {
                    refused.push(id);
                }
                continue;
            }
            // Past the first, one that would wait (for its page, evicted or
            // being written back since, or for a commit or room in the log)
            // is left for the sender to send again, where it can stop.
            if may_stop && applied > 0 {
                let slot = changed_inode(&op).and_then(|ino| self.inode_slots.get(&ino).copied());
                if let Some(slot) = slot.filter(|&s| !self.icache.resident(s)) {
                    self.start_page_reads(vec![slot], 1);
                    break;
                }
                if self.begin_may_wait() {
                    break;
                }
            }
            if !self.txns.contains_key(&key) {
                if self.txns.len() >= super::txn::TXN_TABLE_MAX {
                    return Err(FsError::TryAgain);
                }
                self.reserve_table_bytes(tables::txn_bytes(&[0; 8]))?;
            }
            if let FollowOp::FreeData { ino, .. } | FollowOp::CutData { ino, .. } = op {
                if !self.has_inode(ino) {
                    self.settle(ino)?;
                }
            }
            self.begin()?;
            match self.follow_effect(op) {
                Ok(()) => {}
                Err(e) if self.op_changes > 0 => return Err(e),
                Err(e @ (FsError::Io(_) | FsError::TryAgain | FsError::NoSpace)) => return Err(e),
                Err(FsError::NotFound) if matches!(op, FollowOp::AddLink { .. }) => {
                    notes.push(format!(
                        "hard link follow-up {id:#x} from shard {from} ({op:?}): the file was \
                         removed before the link was counted; refused, the new name goes"
                    ));
                    refused.push(id);
                }
                Err(e) => notes.push(format!(
                    "follow-up {id:#x} from shard {from} ({op:?}): {e}; nothing to do"
                )),
            }
            self.log(Change::TxnPut { id: key, data: id.to_le_bytes().to_vec() })?;
            self.finish()?;
            mark = id;
            applied += 1;
        }
        Ok(Applied { through: mark, refused, notes })
    }

    /// The effect of one follow-up, inside an operation.
    fn follow_effect(&mut self, op: FollowOp) -> FsResult<()> {
        let now = self.now();
        match op {
            FollowOp::Drop { ino } => {
                let mut inode = self.inode(ino)?;
                if inode.kind == FileType::Directory && self.dentries.child_count(ino) > 0 {
                    return Err(FsError::NotEmpty);
                }
                if inode.kind != FileType::Directory && inode.nlink > 1 {
                    inode.nlink -= 1;
                    inode.ctime_ns = now;
                    return self.put_inode(&inode);
                }
                self.drop_inode(&inode)?;
                if inode.kind == FileType::Regular {
                    let end = inode.size.max(inode.data_end);
                    self.follow_free(ino, inode.file_layout, end)?;
                }
                Ok(())
            }
            FollowOp::FreeData { ino, layout, old_size } => {
                self.free_elsewhere(ino, layout, 0, old_size)
            }
            FollowOp::CutData { ino, layout, size, old_size } => {
                self.free_elsewhere(ino, layout, size, old_size)
            }
            FollowOp::AdjustDir { dir, nlink_delta } => match self.inode(dir) {
                Ok(d) if d.kind == FileType::Directory => {
                    self.adjust_dir(dir, nlink_delta.into(), now)
                }
                Ok(_) => Err(FsError::NotDir),
                Err(e) => Err(e),
            },
            FollowOp::AddLink { ino } => {
                let mut inode = self.inode(ino)?;
                // Unlinked, kept only while open: removed for a new name.
                if inode.nlink == 0 {
                    return Err(FsError::NotFound);
                }
                inode.nlink += 1;
                inode.ctime_ns = now;
                self.put_inode(&inode)
            }
            FollowOp::Forget { txn } => {
                if self.txns.contains_key(&(txn | PARTICIPANT_BIT)) {
                    self.log(Change::TxnDel { id: txn | PARTICIPANT_BIT })?;
                }
                Ok(())
            }
            FollowOp::Reparent { ino, parent } => {
                let mut inode = self.inode(ino)?;
                inode.parent = parent;
                inode.ctime_ns = now;
                self.put_inode(&inode)
            }
        }
    }

    /// Frees data at or past `size` of `ino`, whose inode lives elsewhere, in
    /// the operation in progress.
    pub(super) fn free_elsewhere(
        &mut self,
        ino: InodeId,
        layout: FileLayout,
        size: u64,
        old_size: u64,
    ) -> FsResult<()> {
        if self.has_inode(ino) {
            return Err(FsError::Invalid(format!("inode {ino} lives here")));
        }
        if old_size > super::data::MAX_FILE_SIZE {
            return Err(FsError::FileTooLarge);
        }
        let mut inode: Inode = Self::homed_elsewhere(ino, layout, old_size);
        self.free_data_from(&mut inode, size, false)
    }
}

/// The inode of this shard a follow-up changes, if it changes one.
fn changed_inode(op: &FollowOp) -> Option<InodeId> {
    match *op {
        FollowOp::Drop { ino } | FollowOp::AddLink { ino } | FollowOp::Reparent { ino, .. } => {
            Some(ino)
        }
        FollowOp::AdjustDir { dir, .. } => Some(dir),
        FollowOp::FreeData { .. } | FollowOp::CutData { .. } | FollowOp::Forget { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use crate::{CreateArgs, FormatOptions, ShardOptions};
    use pfs_core::SetAttr;

    fn shard(id: u32) -> (MemDevice, Shard<MemDevice>) {
        let dev = MemDevice::new(64 << 20, 64);
        let mut f = FormatOptions::new(ShardId(id), 64 << 20);
        f.create_root = id == 0;
        let s = Shard::format(dev.handle(), &f, ShardOptions::default()).unwrap();
        (dev, s)
    }

    /// What the worker's outbox does: sends the ready follow-ups of `a` to `b`.
    fn deliver(a: &mut Shard<MemDevice>, b: &mut Shard<MemDevice>) -> Vec<FollowUp> {
        a.commit().unwrap();
        let ups = a.take_ready_follow_ups();
        let ops: Vec<_> = ups.iter().map(|u| (u.id, u.op)).collect();
        b.apply_follow_ups(a.id(), &ops).unwrap();
        b.commit().unwrap();
        for u in &ups {
            a.follow_done(u.id).unwrap();
        }
        ups
    }

    #[test]
    fn a_link_and_its_removal_on_another_shard_count_once_each_even_when_sent_twice() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let f = b.create(InodeId::ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        // A name on `a` for an inode at `b`: `b` counts it by a follow-up.
        a.link_name(f.ino, FileType::Regular, InodeId::ROOT, b"link").unwrap();
        assert!(a.take_ready_follow_ups().is_empty(), "not before the commit");
        let sent = deliver(&mut a, &mut b);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].op, FollowOp::AddLink { ino: f.ino });
        assert_eq!(sent[0].target, FollowTarget::Shard(ShardId(1)));
        assert_eq!(b.getattr(f.ino).unwrap().nlink, 2);
        // Sent again (the answer was lost): applied once, and not refused.
        let ops: Vec<_> = sent.iter().map(|u| (u.id, u.op)).collect();
        let again = b.apply_follow_ups(ShardId(0), &ops).unwrap();
        assert_eq!((again.through, again.refused), (sent[0].id, vec![]));
        assert_eq!(b.getattr(f.ino).unwrap().nlink, 2);
        assert!(a.follow_ups().is_empty(), "done follow-ups are deleted");
        // Removing that name drops the link at the home; the last one frees it.
        a.unlink(InodeId::ROOT, b"link").unwrap();
        deliver(&mut a, &mut b);
        assert_eq!(b.getattr(f.ino).unwrap().nlink, 1);
        b.unlink(InodeId::ROOT, b"f").unwrap();
        assert!(!b.has_inode(f.ino));
        // Ids from another shard, or a link to an inode this shard allocated and
        // no longer has, are refused.
        let bad = [(1, FollowOp::Drop { ino: f.ino })];
        assert!(matches!(b.apply_follow_ups(ShardId(2), &bad), Err(FsError::Invalid(_))));
        assert_eq!(
            b.link_name(f.ino, FileType::Regular, InodeId::ROOT, b"again"),
            Err(FsError::NotFound)
        );
    }

    /// A hard link named on one shard while the file's last name was removed
    /// at its home, before the link was counted there: the home refuses the
    /// count (the inode is gone), again when it is sent twice, and the
    /// sender takes the name away with the record, durably. Before, the
    /// name was left naming a removed file.
    #[test]
    fn a_link_whose_file_was_removed_first_is_refused_and_its_name_goes() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let f = b.create(InodeId::ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let d = a.create(InodeId::ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
        a.link_name(f.ino, FileType::Regular, d.ino, b"link").unwrap();
        assert_eq!(a.lookup(d.ino, b"link").unwrap().ino, f.ino);
        b.unlink(InodeId::ROOT, b"f").unwrap();
        a.commit().unwrap();
        let ups = a.take_ready_follow_ups();
        assert_eq!(ups.len(), 1);
        let ops: Vec<_> = ups.iter().map(|u| (u.id, u.op)).collect();
        let applied = b.apply_follow_ups(a.id(), &ops).unwrap();
        assert_eq!((applied.through, applied.refused), (ups[0].id, vec![ups[0].id]));
        assert_eq!(applied.notes.len(), 1, "the refusal is logged");
        // Sent again (the answer was lost): refused again, not taken as done.
        let again = b.apply_follow_ups(a.id(), &ops).unwrap();
        assert_eq!((again.through, again.refused), (ups[0].id, vec![ups[0].id]));
        assert!(a.undo_link(ups[0].id).unwrap(), "the name was there");
        assert_eq!(a.lookup(d.ino, b"link"), Err(FsError::NotFound));
        assert!(a.follow_ups().is_empty(), "the record went with the name");
        // Run twice (a lost stop): nothing left to do.
        assert!(!a.undo_link(ups[0].id).unwrap());
        // Durable: a restart finds neither the name nor a follow-up to send.
        a.commit().unwrap();
        let mut a = Shard::open(a.into_device(), 0, ShardOptions::default()).unwrap();
        assert_eq!(a.lookup(d.ino, b"link"), Err(FsError::NotFound));
        assert!(a.take_ready_follow_ups().is_empty());
        assert!(a.readdir(d.ino, None, 16).unwrap().is_empty());
    }

    /// The record of a hard link's follow-up keeps its name after the
    /// follow-up's bytes; other records keep nothing more, and a record
    /// with a few bytes more than its follow-up is refused.
    #[test]
    fn a_link_record_keeps_its_name_and_others_nothing() {
        let ino = InodeId(0x0001_0000_0000_0007);
        let target = FollowTarget::Shard(ShardId(1));
        let mut data = encode_follow(target, &FollowOp::AddLink { ino });
        assert_eq!(decode_link_name(&data), None, "a record from before names nothing");
        data.extend_from_slice(&9u64.to_le_bytes());
        data.extend_from_slice(b"name");
        assert_eq!(decode_follow(5, &data).map(|u| u.op), Some(FollowOp::AddLink { ino }));
        assert_eq!(decode_link_name(&data), Some((InodeId(9), &b"name"[..])));
        let mut drop = encode_follow(target, &FollowOp::Drop { ino });
        assert!(decode_follow(5, &drop).is_some());
        drop.extend_from_slice(&9u64.to_le_bytes());
        drop.extend_from_slice(b"name");
        assert_eq!(decode_follow(5, &drop), None, "only a link keeps a name");
        assert_eq!(decode_link_name(&drop), None);
        let short = &data[..data.len() - 6];
        assert_eq!(decode_follow(5, short), None, "a cut parent");
    }

    /// A shard with a 32-block Icache and `n` files in its root, reopened
    /// and checkpointed (every inode page written back, none in memory), its
    /// device's handle, and the files.
    fn reopened_with_files(n: usize) -> (Shard<MemDevice>, MemDevice, Vec<InodeId>) {
        let opts = || ShardOptions { icache_blocks: 32, ..ShardOptions::default() };
        let dev = MemDevice::new(64 << 20, 64);
        let handle = dev.handle();
        let f = FormatOptions::new(ShardId(0), 64 << 20);
        let mut b = Shard::format(dev, &f, opts()).unwrap();
        let files: Vec<InodeId> = (0..n)
            .map(|i| {
                let name = format!("f{i}");
                b.create(InodeId::ROOT, name.as_bytes(), CreateArgs::file(0o644)).unwrap().ino
            })
            .collect();
        b.commit().unwrap();
        let mut b = Shard::open(b.into_device(), 0, opts()).unwrap();
        b.checkpoint().unwrap();
        (b, handle, files)
    }

    /// A batch of follow-ups over more cold pages than the Icache reads at
    /// once applies up to the first whose page is not in memory, and the
    /// watermark tells the sender to send the rest again: each request
    /// stops at most once, and none waits for the device. (A request that
    /// read all the pages before its first change stopped once per few
    /// pages read, and the worker runs a request at most four times
    /// stopped: the rest were read waiting.)
    #[test]
    fn follow_ups_over_many_cold_pages_apply_a_part_at_a_time_without_waiting() {
        let (mut b, _, files) = reopened_with_files(1000);
        for &ino in &files[500..] {
            b.getattr(ino).unwrap();
        }
        // One cold inode on each of 20 pages: more than the 8 reads (a
        // quarter of the Icache) that run at once.
        let mut pages = Vec::new();
        let mut cold = Vec::new();
        for &ino in &files {
            let slot = b.inode_slots[&ino];
            let page = slot / crate::icache::INODES_PER_BLOCK;
            if !b.icache.resident(slot) && !pages.contains(&page) && cold.len() < 20 {
                pages.push(page);
                cold.push(ino);
            }
        }
        assert_eq!(cold.len(), 20, "20 cold pages");
        let from = ShardId(2);
        let mut ops: Vec<(u64, FollowOp)> = cold
            .iter()
            .enumerate()
            .map(|(k, &ino)| ((2u64 << 48) | (k as u64 + 1), FollowOp::AddLink { ino }))
            .collect();
        let waits = b.stats().device_waits;
        let (mut requests, mut stops_in_a_row) = (0, 0);
        while !ops.is_empty() {
            b.set_defer_misses(true);
            let r = b.apply_follow_ups(from, &ops);
            b.set_defer_misses(false);
            match r {
                Err(FsError::TryAgain) => {
                    assert!(b.take_deferred().is_some());
                    stops_in_a_row += 1;
                    assert!(
                        stops_in_a_row < 2,
                        "a request of {} follow-ups stopped twice",
                        ops.len()
                    );
                    while b.icache_reading() {
                        b.icache_reads_done();
                    }
                }
                Ok(Applied { through, .. }) => {
                    // What the sender does with the answer.
                    requests += 1;
                    stops_in_a_row = 0;
                    assert!(through >= ops[0].0, "no progress");
                    ops.retain(|&(id, _)| id > through);
                }
                Err(e) => panic!("{e}"),
            }
        }
        println!("20 follow-ups over 20 cold pages applied in {requests} requests");
        assert!(requests > 1, "the batch applied at once: the pages fit the reads");
        assert_eq!(b.stats().device_waits, waits, "the follow-ups waited for the device");
        for ino in cold {
            assert_eq!(b.getattr(ino).unwrap().nlink, 2, "{ino}: applied once");
        }
    }

    /// A batch whose follow-ups dirty more Icache blocks than stay clean
    /// stops applying when the next one would have to wait for a commit
    /// (the first change ended the request's right to stop, so `begin` would
    /// commit waiting), and the sender sends the rest again, where a request
    /// can stop for the commit instead.
    #[test]
    fn follow_ups_stop_applying_before_a_commit_they_would_wait_for() {
        let (mut b, handle, files) = reopened_with_files(16 * 30);
        // One inode of each of 28 pages, all in memory and clean.
        let one_per_page: Vec<InodeId> =
            files.iter().copied().step_by(16).skip(1).take(28).collect();
        for &ino in &one_per_page {
            b.getattr(ino).unwrap();
        }
        for ino in &one_per_page {
            assert!(b.icache.resident(b.inode_slots[ino]));
        }
        let from = ShardId(2);
        let mut ops: Vec<(u64, FollowOp)> = one_per_page
            .iter()
            .enumerate()
            .map(|(k, &ino)| ((2u64 << 48) | (k as u64 + 1), FollowOp::AddLink { ino }))
            .collect();
        let forced = b.stats().forced_commits;
        let mut requests = 0;
        while !ops.is_empty() {
            // Every commit stays in flight until the batch stopped (a wait
            // for one panics): the blocks its follow-ups dirty stay dirty.
            handle.hold(Some(0..u64::MAX));
            b.set_defer_misses(true);
            let r = b.apply_follow_ups(from, &ops);
            b.set_defer_misses(false);
            handle.hold(None);
            assert_eq!(b.stats().forced_commits, forced, "a follow-up waited for a commit");
            match r {
                Err(FsError::TryAgain) => {
                    assert_eq!(b.take_deferred(), Some(crate::shard::DeferredOn::Commit));
                    b.commit().unwrap();
                }
                Ok(Applied { through, .. }) => {
                    requests += 1;
                    assert!(through >= ops[0].0, "no progress");
                    ops.retain(|&(id, _)| id > through);
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(requests > 1, "the batch applied at once: the Icache kept enough clean blocks");
        for ino in one_per_page {
            assert_eq!(b.getattr(ino).unwrap().nlink, 2, "{ino}: applied once");
        }
    }

    /// Follow-ups for inodes whose pages are not in memory do not wait for
    /// the device: with misses deferred the request reads the pages in the
    /// background and stops before it changed anything, and applies them
    /// from memory when run again.
    #[test]
    fn follow_ups_for_cold_inodes_stop_instead_of_waiting() {
        // The later inodes read: the pages of the first ones leave the Icache.
        let (mut b, _, files) = reopened_with_files(1000);
        for &ino in &files[500..] {
            b.getattr(ino).unwrap();
        }
        // Two cold inodes on different pages: the second is changed after
        // the first, where a miss could no longer stop.
        let page = |b: &Shard<MemDevice>, ino: &InodeId| {
            b.inode_slots[ino] / crate::icache::INODES_PER_BLOCK
        };
        let cold: Vec<InodeId> =
            files.iter().copied().filter(|ino| !b.icache.resident(b.inode_slots[ino])).collect();
        let (one, two) = (cold[0], *cold.last().unwrap());
        assert_ne!(page(&b, &one), page(&b, &two), "1,000 inodes in 32 Icache blocks");
        let from = ShardId(2);
        let ops = [
            ((2u64 << 48) | 1, FollowOp::AddLink { ino: one }),
            ((2u64 << 48) | 2, FollowOp::AddLink { ino: two }),
        ];
        let waits = b.stats().device_waits;
        let mut stops = 0;
        loop {
            b.set_defer_misses(true);
            let r = b.apply_follow_ups(from, &ops);
            b.set_defer_misses(false);
            match r {
                Err(FsError::TryAgain) => {
                    assert_eq!(b.take_deferred(), Some(crate::shard::DeferredOn::InodePage));
                    assert_eq!(b.follow_mark(from), 0, "nothing applied before the stop");
                    stops += 1;
                    assert!(stops < 4, "stops once");
                    while b.icache_reading() {
                        b.icache_reads_done();
                    }
                }
                Ok(Applied { through, .. }) => {
                    assert_eq!(through, ops[1].0);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(stops, 1);
        assert_eq!(b.stats().device_waits, waits, "the follow-ups waited for the device");
        assert_eq!(b.getattr(one).unwrap().nlink, 2);
        assert_eq!(b.getattr(two).unwrap().nlink, 2);
    }

    #[test]
    fn follow_ups_survive_a_crash_and_ids_never_repeat() {
        let (da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let f = b.create(InodeId::ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        a.link_name(f.ino, FileType::Regular, InodeId::ROOT, b"l").unwrap();
        a.commit().unwrap();
        let first = a.take_ready_follow_ups();
        let mut used: Vec<u64> = first.iter().map(|u| u.id).collect();
        for _ in 0..(ID_CHUNK + 10) {
            used.push(a.new_txn_id().unwrap());
        }
        a.commit().unwrap();
        let top = *used.iter().max().unwrap();
        // Power loss: the follow-up is handed out again, and new ids go higher.
        let mut a = Shard::open(da.crash(3), 0, ShardOptions::default()).unwrap();
        assert_eq!(a.take_ready_follow_ups(), first);
        assert!(a.new_txn_id().unwrap() > top);
        let ops: Vec<_> = first.iter().map(|u| (u.id, u.op)).collect();
        b.apply_follow_ups(ShardId(0), &ops).unwrap();
        b.apply_follow_ups(ShardId(0), &ops).unwrap();
        assert_eq!(b.getattr(f.ino).unwrap().nlink, 2);
    }

    #[test]
    fn inode_numbers_a_crash_lost_are_not_handed_out_again() {
        let (dev, mut a) = shard(0);
        a.create(InodeId::ROOT, b"durable", CreateArgs::file(0o644)).unwrap();
        a.commit().unwrap();
        // Created and answered, never committed: lost in the crash.
        let lost = a.create(InodeId::ROOT, b"lost", CreateArgs::file(0o644)).unwrap();
        let mut a = Shard::open(dev.crash(5), 0, ShardOptions::default()).unwrap();
        assert_eq!(a.lookup(InodeId::ROOT, b"lost"), Err(FsError::NotFound));
        let next = a.create(InodeId::ROOT, b"next", CreateArgs::file(0o644)).unwrap();
        assert!(next.ino.seq() > lost.ino.seq(), "{} reused {}", next.ino, lost.ino);
    }

    #[test]
    fn a_removal_frees_the_reserved_data_elsewhere_past_the_size() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let f = a.create(InodeId::ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        // A writer reserved 1 MiB, wrote a block on `b`, and died before it
        // published the size: the home still says 0 bytes.
        assert_eq!(a.reserve_data(f.ino, 1 << 20).unwrap(), 1 << 20);
        assert_eq!(a.reserve_data(f.ino, 10).unwrap(), 1 << 20, "never lowered");
        b.write_data(f.ino, FileLayout::Block, 65536, &[1; 4096]).unwrap();
        assert_eq!(a.getattr(f.ino).unwrap().size, 0);
        a.unlink(InodeId::ROOT, b"f").unwrap();
        let sent = deliver(&mut a, &mut b);
        assert_eq!(
            sent.iter().map(|u| u.op).collect::<Vec<_>>(),
            [FollowOp::FreeData { ino: f.ino, layout: FileLayout::Block, old_size: 1 << 20 }]
        );
        let (foreign, _) = b.foreign_data(InodeId(0), 10);
        assert!(foreign.is_empty(), "left on the data shard: {foreign:?}");
    }

    #[test]
    fn growing_the_size_keeps_unpublished_data_past_it_elsewhere() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let args = CreateArgs {
            layout: Some((pfs_core::DirLayout::Regular, FileLayout::Io)),
            ..CreateArgs::file(0o644)
        };
        let f = a.create(InodeId::ROOT, b"f", args).unwrap();
        // Two writers: one wrote at 1 MiB on `b` and has not published its
        // size; the other publishes a smaller end.
        assert_eq!(a.reserve_data(f.ino, 2 << 20).unwrap(), 2 << 20);
        b.write_data(f.ino, FileLayout::Io, 1 << 20, &[7; 4096]).unwrap();
        let grow = SetAttr { size: Some(300_000), ..SetAttr::default() };
        a.setattr(f.ino, grow).unwrap();
        assert!(deliver(&mut a, &mut b).is_empty(), "growing the size cut data elsewhere");
        assert_eq!(b.read_data(f.ino, FileLayout::Io, 1 << 20, 4096).unwrap(), [7; 4096]);
        // A cut below the size frees it, reserved part included.
        let cut = SetAttr { size: Some(1000), ..SetAttr::default() };
        a.setattr(f.ino, cut).unwrap();
        assert_eq!(deliver(&mut a, &mut b).len(), 1);
        assert_eq!(b.read_data(f.ino, FileLayout::Io, 1 << 20, 4096).unwrap(), [0; 4096]);
    }

    #[test]
    fn the_sweep_lists_and_frees_only_data_of_other_shards_inodes() {
        let (_db, mut b) = shard(1);
        let mine = b.create(InodeId::ROOT, b"m", CreateArgs::file(0o644)).unwrap();
        b.write(mine.ino, 0, &[3; 200_000]).unwrap();
        let gone = InodeId::compose(ShardId(0), 77);
        b.write_data(gone, FileLayout::Io, 0, &[4; 5000]).unwrap();
        let (found, last) = b.foreign_data(InodeId(0), 10);
        assert_eq!(found, [gone]);
        assert!(last.is_some());
        assert!(b.free_foreign(mine.ino).is_err(), "an inode of this shard is not foreign");
        b.free_foreign(gone).unwrap();
        assert!(b.foreign_data(InodeId(0), 10).0.is_empty());
        assert_eq!(b.read(mine.ino, 0, 10).unwrap(), [3; 10]);
    }
}
