//! Cross-shard transactions, the shard's part (docs/cluster.md).
//!
//! A shard keeps a small table `id -> bytes` of open transactions, logged and
//! checkpointed like every other table. The coordinator of a rename records its
//! intent there before anything else happens and removes it when done; the
//! participant records the answer it gave in the same WAL record as its change,
//! so a re-sent dispatch after a coordinator crash gets the same answer and is
//! applied at most once. The server encodes what the bytes mean; the shard only
//! keeps them.

use pfs_core::{FileType, FsError, FsResult, InodeId};

use super::meta::{check_name, decode_dentry, encode_dentry, DirEntry, Replaced};
use super::{tables, Shard};
use crate::device::Device;
use crate::wal::Change;

/// Most open transactions a shard keeps; more is back-pressure (`TryAgain`).
pub const TXN_TABLE_MAX: usize = 4096;
/// Largest state a transaction record holds.
pub const TXN_DATA_MAX: usize = 2048;
/// Participant records are kept under the transaction id with this bit set.
pub const PARTICIPANT_BIT: u64 = 1 << 63;
/// First byte of a participant record that seals a directory: creates in it wait.
pub const SEAL_TAG: u8 = 2;
/// How long a client's hold on a directory lasts at most (`hold_dir`).
pub const DIR_HOLD_NS: i64 = 5_000_000_000;
/// Directory holds one shard keeps at once; past it, `TryAgain`.
pub const DIR_HOLDS_MAX: usize = 4096;
/// Removed directories one shard remembers (`Shard::gone_dir`); past it the
/// oldest is forgotten.
pub const GONE_DIRS_MAX: usize = 65_536;

/// How long a shard remembers a directory's layout change (`relaid_dir`):
/// far longer than a client keeps a layout cached (1 s) or retries a request
/// (its request timeout, 30 s by default).
pub const RELAID_NS: i64 = 60_000_000_000;
/// Layout changes one shard remembers at once; past it the oldest is forgotten.
pub const RELAID_MAX: usize = 4096;

/// Directories whose layout changed lately, and where their names go now.
#[derive(Debug, Default)]
pub(super) struct Relaid {
    dirs: std::collections::HashMap<InodeId, Relayout>,
    order: std::collections::VecDeque<InodeId>,
}

/// A directory's new layout, in a cluster of this shape, until `end`.
#[derive(Clone, Copy, Debug)]
struct Relayout {
    layout: pfs_core::DirLayout,
    servers: u32,
    workers: u32,
    end: i64,
}

impl Relaid {
    fn insert(&mut self, dir: InodeId, r: Relayout) {
        if self.dirs.insert(dir, r).is_none() {
            self.order.push_back(dir);
        }
        while self.order.len() > RELAID_MAX {
            let old = self.order.pop_front().expect("over the bound");
            self.dirs.remove(&old);
        }
    }
}

/// Directories removed elsewhere, newest last, at most [`GONE_DIRS_MAX`].
#[derive(Debug, Default)]
pub(super) struct GoneDirs {
    order: std::collections::VecDeque<InodeId>,
    set: std::collections::HashSet<InodeId>,
}

impl GoneDirs {
    fn insert(&mut self, dir: InodeId) {
        if !self.set.insert(dir) {
            return;
        }
        self.order.push_back(dir);
        if self.order.len() > GONE_DIRS_MAX {
            let old = self.order.pop_front().expect("over the bound");
            self.set.remove(&old);
        }
    }
}
/// The whole of a participant record of a rename it abandoned (see
/// [`Shard::xrename_target`]): never applied, and a late dispatch is refused.
pub const ABANDONED: [u8; 1] = [0xab];

/// Whether participant record bytes say the rename was abandoned, not applied.
pub fn is_abandoned(data: &[u8]) -> bool {
    data == ABANDONED
}

/// The directory a transaction record seals, if it is a seal.
pub(super) fn sealed_dir(id: u64, data: &[u8]) -> Option<InodeId> {
    if id & PARTICIPANT_BIT == 0 || data.len() != 9 || data[0] != SEAL_TAG {
        return None;
    }
    Some(InodeId(u64::from_le_bytes(data[1..9].try_into().ok()?)))
}

/// The child and type of a dentry value from outside, if it is well formed.
pub fn checked_dentry(value: u64) -> Option<(InodeId, FileType)> {
    FileType::from_u8((value >> 56) as u8)?;
    Some(decode_dentry(value))
}

impl<D: Device> Shard<D> {
    /// The open transaction records, in id order.
    pub fn txns(&self) -> Vec<(u64, Vec<u8>)> {
        self.txns.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    /// The state bytes of transaction record `id`.
    pub fn txn(&self, id: u64) -> Option<&[u8]> {
        self.txns.get(&id).map(Vec::as_slice)
    }

    fn txn_room(&self, data: &[u8]) -> FsResult<()> {
        if data.len() > TXN_DATA_MAX {
            return Err(FsError::Invalid(format!("transaction state of {} bytes", data.len())));
        }
        if self.txns.len() >= TXN_TABLE_MAX {
            return Err(FsError::TryAgain);
        }
        self.reserve_table_bytes(tables::txn_bytes(data))
    }

    /// Records `data` under coordinator transaction `id` (an intent, or its
    /// new state), alone.
    pub fn txn_record(&mut self, id: u64, data: &[u8]) -> FsResult<()> {
        assert!(id & PARTICIPANT_BIT == 0, "coordinator ids have the top bit clear");
        match self.txns.get(&id) {
            Some(old) => {
                let grow = tables::txn_bytes(data).saturating_sub(tables::txn_bytes(old));
                self.reserve_table_bytes(grow)?;
            }
            None => self.txn_room(data)?,
        }
        self.begin()?;
        self.log(Change::TxnPut { id, data: data.to_vec() })?;
        self.finish()
    }

    /// Participant of an rmdir: seals `dir` for transaction `id` if it has no
    /// entry here, so creates in it get `TryAgain` until the transaction ends.
    /// Sealing again under the same id is a no-op.
    pub fn seal_dir(&mut self, id: u64, dir: InodeId) -> FsResult<()> {
        let key = id | PARTICIPANT_BIT;
        if self.txns.contains_key(&key) {
            return Ok(());
        }
        if self.dentries.child_count(dir) > 0 {
            return Err(FsError::NotEmpty);
        }
        let mut data = vec![SEAL_TAG];
        data.extend_from_slice(&dir.0.to_le_bytes());
        self.txn_room(&data)?;
        self.begin()?;
        self.log(Change::TxnPut { id: key, data })?;
        self.finish()
    }

    /// Participant of an rmdir: forgets its seal for transaction `id` (see
    /// [`seal_dir`](Self::seal_dir)); `dir_removed`: the rmdir removed the
    /// directory, which this shard then remembers gone
    /// ([`gone_dir`](Self::gone_dir)).
    pub fn forget_seal(&mut self, id: u64, dir_removed: bool) -> FsResult<()> {
        let key = id | PARTICIPANT_BIT;
        let sealed = self.txns.get(&key).and_then(|d| match d.as_slice() {
            [SEAL_TAG, dir @ ..] => dir.try_into().ok().map(|b| InodeId(u64::from_le_bytes(b))),
            _ => None,
        });
        self.txn_forget(key)?;
        if let Some(dir) = sealed.filter(|_| dir_removed) {
            self.gone_dir(dir);
        }
        Ok(())
    }

    /// Whether creates in `dir` must wait (an rmdir of it is deciding, or a
    /// client holds it to rename over it).
    pub fn is_sealed(&self, dir: InodeId) -> bool {
        self.sealed.contains_key(&dir)
            || self.holds.get(&dir).is_some_and(|h| h.iter().any(|&(_, end)| end > self.clock_ns))
    }

    /// Holds `dir` for `holder` (a client about to rename over it): granted
    /// only while this shard has none of its entries (`NotEmpty` otherwise),
    /// and until [`release_dir`](Self::release_dir) or for
    /// [`DIR_HOLD_NS`] at most, no new name goes into it here (creates,
    /// links and renames into it get `TryAgain`, as under an rmdir's seal).
    /// So a client that holds a directory on every shard of its entries
    /// knows it empty until its rename replaced it. Held again by the same
    /// holder, the hold starts anew. In memory only: a restart drops it.
    pub fn hold_dir(&mut self, dir: InodeId, holder: u64) -> FsResult<()> {
        let now = self.clock_ns;
        self.holds.retain(|_, h| {
            h.retain(|&(_, end)| end > now);
            !h.is_empty()
        });
        if self.dentries.child_count(dir) > 0 {
            return Err(FsError::NotEmpty);
        }
        let end = now.saturating_add(DIR_HOLD_NS);
        let held: usize = self.holds.values().map(Vec::len).sum();
        let h = self.holds.entry(dir).or_default();
        match h.iter_mut().find(|(who, _)| *who == holder) {
            Some(mine) => mine.1 = end,
            None if held >= DIR_HOLDS_MAX => {
                if h.is_empty() {
                    self.holds.remove(&dir);
                }
                return Err(FsError::TryAgain);
            }
            None => h.push((holder, end)),
        }
        Ok(())
    }

    /// Remembers that directory `dir` was removed (a bigdir whose rmdir
    /// finished, or which a rename replaced): a new name in it here gets
    /// `NotFound`, as at its home, instead of landing in a directory no path
    /// reaches (a create through a handle taken before the removal). In
    /// memory only, and the newest [`GONE_DIRS_MAX`] only: inode numbers are
    /// never reused, so a remembered one is never wrong.
    pub fn gone_dir(&mut self, dir: InodeId) {
        self.gone.insert(dir);
    }

    /// Whether this shard knows directory `dir` was removed: it allocated
    /// `dir` and no longer has it (inode numbers are never reused), or it
    /// remembers the removal (`gone_dir`). A request that names a name in
    /// such a directory comes from a caller whose name for it is stale.
    pub fn dir_gone(&self, dir: InodeId) -> bool {
        self.gone.set.contains(&dir) || (self.is_home_of(dir) && !self.has_inode(dir))
    }

    /// Remembers that directory `dir`'s layout changed to `layout` (in a
    /// cluster of `servers` x `workers`), for [`RELAID_NS`]: a client that
    /// cached the old layout routes a new name by it for up to a second, and
    /// such a name landing here, where the new layout does not look for it,
    /// would be lost to lookups and listings. It is refused instead
    /// (`Misrouted`: the client fetches the layout again and routes anew).
    /// Told by the client that changed the layout, as it releases its hold
    /// on the directory here. In memory only, the newest [`RELAID_MAX`].
    pub fn relaid_dir(
        &mut self,
        dir: InodeId,
        layout: pfs_core::DirLayout,
        servers: u32,
        workers: u32,
    ) {
        let now = self.clock_ns;
        let end = now.saturating_add(RELAID_NS);
        self.relaid.dirs.retain(|_, r| r.end > now);
        let dirs = &self.relaid.dirs;
        self.relaid.order.retain(|d| dirs.contains_key(d));
        self.relaid.insert(dir, Relayout { layout, servers, workers, end });
    }

    /// Whether a new name may go into `dir` here: `NotFound` for a directory
    /// known removed (`gone_dir`), `TryAgain` while it is sealed or held,
    /// `Misrouted` when the directory's layout changed lately and `name`
    /// belongs to another shard under the new one (`relaid_dir`).
    pub(super) fn check_new_name_in(&self, dir: InodeId, name: &[u8]) -> FsResult<()> {
        if self.gone.set.contains(&dir) {
            return Err(FsError::NotFound);
        }
        if self.is_sealed(dir) {
            return Err(FsError::TryAgain);
        }
        self.check_name_placed(dir, name)
    }

    /// `Misrouted` when a listing of directory `dir` by `layout` would miss
    /// names: at the directory's home, when `layout` is not the directory's
    /// (durable, so no window), elsewhere when its layout changed lately to
    /// another (`relaid_dir`). A client that cached the old layout lists
    /// again by the new one.
    pub fn check_listing(&mut self, dir: InodeId, layout: pfs_core::DirLayout) -> FsResult<()> {
        if self.has_inode(dir) {
            return match self.layouts(dir) {
                Ok((now, _)) if now != layout => Err(FsError::Misrouted),
                // Removed: the listing answers as it always did.
                Ok(_) | Err(FsError::NotFound) => Ok(()),
                Err(e) => Err(e),
            };
        }
        match self.relaid(dir) {
            Some(r) if r.layout != layout => Err(FsError::Misrouted),
            _ => Ok(()),
        }
    }

    /// The layout `dir` changed to lately, while this shard remembers it
    /// (`relaid_dir`).
    pub(super) fn relaid_layout(&self, dir: InodeId) -> Option<pfs_core::DirLayout> {
        self.relaid(dir).map(|r| r.layout)
    }

    /// `dir`'s layout change this shard still remembers (`relaid_dir`).
    fn relaid(&self, dir: InodeId) -> Option<&Relayout> {
        if self.relaid.dirs.is_empty() {
            return None;
        }
        self.relaid.dirs.get(&dir).filter(|r| r.end > self.clock_ns)
    }

    /// `Misrouted` when directory `dir`'s layout changed lately and its new
    /// layout places `name` on another shard (`relaid_dir`): a client that
    /// cached the old layout looks for it here (a lookup, unlink, rmdir or
    /// the source of a rename), and is told to route again instead of
    /// hearing `NotFound` for a name that exists.
    pub fn check_name_placed(&self, dir: InodeId, name: &[u8]) -> FsResult<()> {
        let Some(r) = self.relaid(dir) else { return Ok(()) };
        if name.len() <= pfs_core::NAME_MAX && r.servers > 0 && r.workers > 0 {
            let shard = pfs_core::routing::dentry_shard(dir, r.layout, name, r.servers, r.workers);
            if shard != self.id() {
                return Err(FsError::Misrouted);
            }
        }
        Ok(())
    }

    /// Ends `holder`'s hold on `dir` (`hold_dir`), if it has one.
    pub fn release_dir(&mut self, dir: InodeId, holder: u64) {
        if let Some(h) = self.holds.get_mut(&dir) {
            h.retain(|(who, _)| *who != holder);
            if h.is_empty() {
                self.holds.remove(&dir);
            }
        }
    }

    /// Coordinator, after the participant refused (or abandoned) rename `id`:
    /// drops the intent, with the follow-up that tells `participant` to forget
    /// whatever record it keeps of it, in one record.
    pub fn xrename_abandon(&mut self, id: u64, participant: pfs_core::ShardId) -> FsResult<()> {
        if !self.txns.contains_key(&id) {
            return Ok(());
        }
        self.follow_room(1)?;
        self.begin()?;
        self.log(Change::TxnDel { id })?;
        let forget = pfs_core::wire::FollowOp::Forget { txn: id };
        self.follow(super::follow::FollowTarget::Shard(participant), forget)?;
        self.finish()
    }

    /// Removes transaction record `id` (done, aborted, or forgotten).
    pub fn txn_forget(&mut self, id: u64) -> FsResult<()> {
        if !self.txns.contains_key(&id) {
            return Ok(());
        }
        self.begin()?;
        self.log(Change::TxnDel { id })?;
        self.finish()
    }

    /// Drops one link of inode `ino`, whose name was removed on another shard,
    /// and frees it when that was the last; returns the size and data layout of
    /// a freed regular file (size 0 when it lives on) so the caller frees data
    /// held elsewhere.
    pub fn drop_orphan(&mut self, ino: InodeId) -> FsResult<(u64, pfs_core::FileLayout)> {
        let mut inode = self.inode(ino)?;
        if inode.kind == FileType::Directory && self.dentries.child_count(ino) > 0 {
            return Err(FsError::NotEmpty);
        }
        if inode.kind != FileType::Directory && inode.nlink > 1 {
            self.begin()?;
            inode.nlink -= 1;
            inode.ctime_ns = self.now();
            self.put_inode(&inode)?;
            self.finish()?;
            return Ok((0, inode.file_layout));
        }
        let size = if inode.kind == FileType::Regular { inode.size } else { 0 };
        self.begin()?;
        self.drop_inode(&inode)?;
        self.finish()?;
        Ok((size, inode.file_layout))
    }

    /// Coordinator, step 1 of a rename whose target name lives on another shard:
    /// checks the source and records the intent `intent` under `id`. Returns the
    /// source entry. The caller commits before it dispatches.
    pub fn xrename_begin(
        &mut self,
        id: u64,
        src_parent: InodeId,
        src_name: &[u8],
        intent: &[u8],
    ) -> FsResult<DirEntry> {
        assert!(id & PARTICIPANT_BIT == 0, "coordinator ids have the top bit clear");
        let src = self.lookup(src_parent, src_name)?;
        self.txn_room(intent)?;
        self.begin()?;
        self.log(Change::TxnPut { id, data: intent.to_vec() })?;
        self.finish()?;
        Ok(src)
    }

    /// Coordinator, last step: the target side applied. Removes the source name
    /// (or, for an exchange, points it at the target's old entry `replacement`) and
    /// the intent, in one record with the follow-up that tells `participant` to
    /// forget its answer. Idempotent: a finished intent is not redone.
    #[allow(clippy::too_many_arguments)]
    pub fn xrename_finish(
        &mut self,
        id: u64,
        src_parent: InodeId,
        src_name: &[u8],
        src_value: u64,
        new_parent: InodeId,
        replacement: Option<u64>,
        participant: pfs_core::ShardId,
    ) -> FsResult<()> {
        if !self.txns.contains_key(&id) {
            return Ok(());
        }
        let mut inos = vec![src_parent, decode_dentry(src_value).0];
        inos.extend(replacement.map(|v| decode_dentry(v).0));
        self.warm_inodes(&inos)?;
        self.follow_room(4)?;
        self.begin()?;
        let now = self.now();
        // Another operation may have changed the source name meanwhile only if it
        // raced the rename; then the newer entry wins and only the intent goes.
        if self.dentries.get(src_parent, src_name) == Some(src_value) {
            match replacement {
                Some(value) => {
                    self.log(Change::DentryPut {
                        parent: src_parent,
                        name: src_name.to_vec(),
                        value,
                    })?;
                    self.reparent(decode_dentry(value).0, src_parent, now)?;
                }
                None => {
                    self.log(Change::DentryDel { parent: src_parent, name: src_name.to_vec() })?
                }
            }
            let (ino, kind) = decode_dentry(src_value);
            self.reparent(ino, new_parent, now)?;
            // Subdirectories: the moved one left; an exchanged one came back.
            let is_dir = |k: FileType| i64::from(k == FileType::Directory);
            let back = replacement.map_or(0, |v| is_dir(decode_dentry(v).1));
            self.adjust_dir(src_parent, back - is_dir(kind), now)?;
        }
        self.log(Change::TxnDel { id })?;
        // The participant forgets its answer record once this is durable.
        let forget = pfs_core::wire::FollowOp::Forget { txn: id };
        self.follow(super::follow::FollowTarget::Shard(participant), forget)?;
        self.finish()
    }

    /// Participant: puts `value` (the moved entry) at `parent/name` for
    /// transaction `id`, replacing what is there under the POSIX rules (or, when
    /// `exchange`, swapping). Returns the target's old entry for an exchange, and
    /// the inode whose name it replaced otherwise (for the client to free).
    /// The answer is recorded with the change, so calling again with the same id
    /// returns it without applying twice. With `resume` (a coordinator that
    /// resumes a rename its client was told failed) nothing new is applied: a
    /// rename not applied yet is abandoned, recorded so that a late dispatch is
    /// refused too, and refused.
    #[allow(clippy::too_many_arguments)]
    pub fn xrename_target(
        &mut self,
        id: u64,
        parent: InodeId,
        name: &[u8],
        value: u64,
        noreplace: bool,
        exchange: bool,
        resume: bool,
    ) -> FsResult<(Option<u64>, Option<Replaced>)> {
        let key = id | PARTICIPANT_BIT;
        let abandoned = || FsError::Invalid(format!("rename {id:#x} was abandoned"));
        if let Some(done) = self.txns.get(&key) {
            if is_abandoned(done) {
                return Err(abandoned());
            }
            return Ok(decode_answer(done));
        }
        if resume {
            self.txn_room(&ABANDONED)?;
            self.begin()?;
            self.log(Change::TxnPut { id: key, data: ABANDONED.to_vec() })?;
            self.finish()?;
            return Err(abandoned());
        }
        check_name(name)?;
        self.check_new_name_in(parent, name)?;
        let (moved, moved_kind) = checked_dentry(value)
            .ok_or_else(|| FsError::Invalid(format!("dentry value {value:#x}")))?;
        if noreplace && exchange {
            return Err(FsError::Invalid("RENAME_NOREPLACE and RENAME_EXCHANGE together".into()));
        }
        let old = match self.lookup(parent, name) {
            Ok(d) => Some(d),
            Err(FsError::NotFound) => None,
            Err(e) => return Err(e),
        };
        if moved_kind == FileType::Directory && self.is_ancestor(moved, parent)? {
            return Err(FsError::Invalid("cannot move a directory into itself".into()));
        }
        match &old {
            Some(d) if d.ino == moved => {}
            Some(_) if noreplace => return Err(FsError::Exists),
            Some(d) if !exchange => {
                match (moved_kind == FileType::Directory, d.kind == FileType::Directory) {
                    (true, false) => return Err(FsError::NotDir),
                    (false, true) => return Err(FsError::IsDir),
                    (true, true) if self.dentries.child_count(d.ino) > 0 => {
                        return Err(FsError::NotEmpty)
                    }
                    _ => {}
                }
            }
            Some(_) => {}
            None if exchange => return Err(FsError::NotFound),
            None => {}
        }
        let answer =
            if exchange { old.as_ref().map(|d| encode_dentry(d.ino, d.kind)) } else { None };
        // The record's size does not depend on what it holds.
        self.txn_room(&encode_answer(answer, None))?;
        self.reserve_table_bytes(tables::dentry_bytes(name))?;
        let mut inos = vec![parent, moved];
        inos.extend(old.as_ref().map(|d| d.ino));
        self.warm_inodes(&inos)?;
        self.follow_room(4)?;
        self.begin()?;
        let now = self.now();
        let mut replaced = None;
        if let Some(d) = &old {
            if !exchange && d.ino != moved {
                replaced = Some(self.remove_entry(parent, d)?);
            }
        }
        let record = encode_answer(answer, replaced);
        self.log(Change::DentryPut { parent, name: name.to_vec(), value })?;
        self.reparent(moved, parent, now)?;
        // Subdirectories: the moved one arrived; a replaced one left (in
        // remove_entry above), an exchanged one goes to the source side.
        let is_dir = |k: FileType| i64::from(k == FileType::Directory);
        let swapped = if exchange { old.as_ref().map_or(0, |d| is_dir(d.kind)) } else { 0 };
        self.adjust_dir(parent, is_dir(moved_kind) - swapped, now)?;
        self.log(Change::TxnPut { id: key, data: record })?;
        self.finish()?;
        Ok((answer, replaced))
    }
}

/// A participant's answer record: the exchanged entry (0: none), then the
/// replaced inode (`docs/format.md`, "Cross-shard transaction records").
fn encode_answer(answer: Option<u64>, replaced: Option<Replaced>) -> Vec<u8> {
    let mut out = answer.unwrap_or(0).to_le_bytes().to_vec();
    let r = replaced.unwrap_or(Replaced {
        ino: InodeId(0),
        size: 0,
        layout: pfs_core::FileLayout::default(),
        remote: false,
    });
    out.extend_from_slice(&r.ino.0.to_le_bytes());
    out.extend_from_slice(&r.size.to_le_bytes());
    out.push(r.layout as u8);
    out.push(u8::from(r.remote));
    out
}

/// Reads an answer record; one of 8 bytes (written before replaced inodes were
/// recorded) has none.
fn decode_answer(data: &[u8]) -> (Option<u64>, Option<Replaced>) {
    let u64_at =
        |o: usize| data.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8")));
    let answer = u64_at(0).filter(|&v| v != 0);
    let replaced = match (u64_at(8), u64_at(16), data.get(24), data.get(25)) {
        (Some(ino), Some(size), Some(&layout), Some(&remote)) if ino != 0 => Some(Replaced {
            ino: InodeId(ino),
            size,
            layout: pfs_core::FileLayout::from_u8(layout).unwrap_or_default(),
            remote: remote != 0,
        }),
        _ => None,
    };
    (answer, replaced)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;
    use crate::{CreateArgs, FormatOptions, ShardOptions};
    use pfs_core::ShardId;

    fn victim_layout() -> pfs_core::FileLayout {
        CreateArgs::file(0o644).layout.map(|l| l.1).unwrap_or_default()
    }

    #[test]
    fn answer_records_of_both_formats_decode() {
        let r =
            Replaced { ino: InodeId(9), size: 5, layout: pfs_core::FileLayout::Io, remote: true };
        assert_eq!(decode_answer(&encode_answer(Some(4), Some(r))), (Some(4), Some(r)));
        assert_eq!(decode_answer(&encode_answer(None, None)), (None, None));
        // Written before replaced inodes were recorded: 8 bytes.
        assert_eq!(decode_answer(&7u64.to_le_bytes()), (Some(7), None));
    }

    fn shard(id: u32) -> (MemDevice, Shard<MemDevice>) {
        let dev = MemDevice::new(64 << 20, 64);
        let mut f = FormatOptions::new(ShardId(id), 64 << 20);
        f.create_root = id == 0;
        let s = Shard::format(dev.handle(), &f, ShardOptions::default()).unwrap();
        (dev, s)
    }

    #[test]
    fn a_rename_across_two_shards_applies_once_and_survives_recovery() {
        let (_da, mut a) = shard(0);
        let (db, mut b) = shard(1);
        let file = a.create(InodeId::ROOT, b"src", CreateArgs::file(0o644)).unwrap();
        let victim = b.create(InodeId::ROOT, b"dst", CreateArgs::file(0o644)).unwrap();
        let src = a.xrename_begin(5, InodeId::ROOT, b"src", b"intent").unwrap();
        assert_eq!(a.txn(5), Some(&b"intent"[..]));
        let value = encode_dentry(src.ino, src.kind);
        // The victim is gone with its inode, which was here: nothing remote to
        // drop, and it had no data. A re-sent dispatch changes nothing and
        // answers the same.
        let freed = Replaced { ino: victim.ino, size: 0, layout: victim_layout(), remote: false };
        let answer = (None, Some(freed));
        assert_eq!(
            b.xrename_target(5, InodeId::ROOT, b"dst", value, false, false, false).unwrap(),
            answer
        );
        assert!(!b.has_inode(victim.ino));
        assert_eq!(
            b.xrename_target(5, InodeId::ROOT, b"dst", value, false, false, false).unwrap(),
            answer
        );
        assert_eq!(b.lookup(InodeId::ROOT, b"dst").unwrap().ino, file.ino);
        b.commit().unwrap();
        a.xrename_finish(5, InodeId::ROOT, b"src", value, InodeId::ROOT, None, ShardId(1)).unwrap();
        assert_eq!(a.lookup(InodeId::ROOT, b"src").unwrap_err(), FsError::NotFound);
        assert_eq!(a.txn(5), None);
        // The participant's record survives a crash until the coordinator's forget.
        let b2 = Shard::open(db.crash(1), 0, ShardOptions::default()).unwrap();
        assert!(b2.txn(5 | PARTICIPANT_BIT).is_some());
        let mut b2 = b2;
        b2.txn_forget(5 | PARTICIPANT_BIT).unwrap();
        assert!(b2.txn(5 | PARTICIPANT_BIT).is_none());
    }

    #[test]
    fn a_refusing_target_leaves_both_sides_unchanged() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        a.create(InodeId::ROOT, b"src", CreateArgs::file(0o644)).unwrap();
        b.create(InodeId::ROOT, b"dst", CreateArgs::dir(0o755)).unwrap();
        let src = a.xrename_begin(9, InodeId::ROOT, b"src", b"i").unwrap();
        let value = encode_dentry(src.ino, src.kind);
        assert_eq!(
            b.xrename_target(9, InodeId::ROOT, b"dst", value, false, false, false),
            Err(FsError::IsDir)
        );
        assert_eq!(
            b.xrename_target(9, InodeId::ROOT, b"dst", value, true, false, false),
            Err(FsError::Exists)
        );
        assert_eq!(
            b.xrename_target(9, InodeId::ROOT, b"new", value, false, true, false),
            Err(FsError::NotFound)
        );
        assert!(b.txn(9 | PARTICIPANT_BIT).is_none());
        a.txn_forget(9).unwrap();
        assert_eq!(a.lookup(InodeId::ROOT, b"src").unwrap().ino, src.ino);
        assert_eq!(checked_dentry(0xff << 56), None);
    }

    #[test]
    fn a_sealed_directory_refuses_creates_until_the_seal_is_forgotten_even_after_a_crash() {
        let (dev, mut s) = shard(0);
        let d = s.create(InodeId::ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
        let full = s.create(InodeId::ROOT, b"full", CreateArgs::dir(0o755)).unwrap();
        s.create(full.ino, b"x", CreateArgs::file(0o644)).unwrap();
        assert_eq!(s.seal_dir(4, full.ino), Err(FsError::NotEmpty));
        s.seal_dir(4, d.ino).unwrap();
        s.seal_dir(4, d.ino).unwrap();
        assert_eq!(s.create(d.ino, b"y", CreateArgs::file(0o644)).unwrap_err(), FsError::TryAgain);
        s.commit().unwrap();
        let mut s = Shard::open(dev.crash(2), 0, ShardOptions::default()).unwrap();
        assert!(s.is_sealed(d.ino));
        assert_eq!(s.create(d.ino, b"y", CreateArgs::file(0o644)).unwrap_err(), FsError::TryAgain);
        s.forget_seal(4, false).unwrap();
        assert!(!s.is_sealed(d.ino));
        s.create(d.ino, b"y", CreateArgs::file(0o644)).unwrap();
        // Sealed for an rmdir that removed it (elsewhere): gone here after.
        let e = s.create(InodeId::ROOT, b"e", CreateArgs::dir(0o755)).unwrap();
        s.seal_dir(5, e.ino).unwrap();
        s.forget_seal(5, true).unwrap();
        assert_eq!(s.create(e.ino, b"y", CreateArgs::file(0o644)).unwrap_err(), FsError::NotFound);
    }

    /// A client's hold on a directory: granted only while the shard has none
    /// of its entries; while held, creates, links and renames into it wait;
    /// it ends at its holder's release (another's does nothing) or when it
    /// runs out, and a second holder keeps it held.
    #[test]
    fn a_held_directory_takes_no_new_name_until_released_or_run_out() {
        let (_dev, mut s) = shard(0);
        let d = s.create(InodeId::ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
        let full = s.create(InodeId::ROOT, b"full", CreateArgs::dir(0o755)).unwrap();
        let f = s.create(full.ino, b"x", CreateArgs::file(0o644)).unwrap();
        s.set_now(1_000);
        assert_eq!(s.hold_dir(full.ino, 7), Err(FsError::NotEmpty));
        s.hold_dir(d.ino, 7).unwrap();
        let file = CreateArgs::file(0o644);
        assert_eq!(s.create(d.ino, b"y", file).unwrap_err(), FsError::TryAgain);
        assert_eq!(s.link(f.ino, d.ino, b"l").unwrap_err(), FsError::TryAgain);
        let flags = crate::RenameFlags::default();
        assert_eq!(s.rename(full.ino, b"x", d.ino, b"x", flags).unwrap_err(), FsError::TryAgain);
        s.release_dir(d.ino, 8);
        assert!(s.is_sealed(d.ino), "not the holder's release");
        s.hold_dir(d.ino, 8).unwrap();
        s.release_dir(d.ino, 7);
        assert!(s.is_sealed(d.ino), "the second holder still holds it");
        s.release_dir(d.ino, 8);
        assert!(!s.is_sealed(d.ino));
        s.hold_dir(d.ino, 7).unwrap();
        s.set_now(1_000 + DIR_HOLD_NS);
        assert!(!s.is_sealed(d.ino), "run out");
        s.create(d.ino, b"y", file).unwrap();
        assert_eq!(s.hold_dir(d.ino, 7), Err(FsError::NotEmpty));
        // Known removed (a rename replaced it elsewhere): no new name here.
        s.gone_dir(d.ino);
        assert_eq!(s.create(d.ino, b"z", file).unwrap_err(), FsError::NotFound);
        assert_eq!(s.link(f.ino, d.ino, b"l").unwrap_err(), FsError::NotFound);
        assert_eq!(s.rename(full.ino, b"x", d.ino, b"x", flags).unwrap_err(), FsError::NotFound);
        assert!(s.lookup(d.ino, b"y").is_ok(), "its names stay, to be removed");
    }

    /// A directory whose layout changed lately refuses new names its new
    /// layout places on another shard (`Misrouted`), takes those it places
    /// here, and forgets the change after `RELAID_NS`.
    #[test]
    fn a_relaid_directory_refuses_names_its_new_layout_places_elsewhere() {
        use pfs_core::{DirLayout, Route, RouteKey};
        // Shards 0 and 1 of one server with two workers.
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let d = a.create(InodeId::ROOT, b"d", CreateArgs::dir(0o755)).unwrap().ino;
        let other = a.create(InodeId::ROOT, b"other", CreateArgs::dir(0o755)).unwrap().ino;
        let f = b.create(InodeId::ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let file = CreateArgs::file(0o644);
        let flags = crate::RenameFlags::default();
        a.set_now(1_000);
        b.set_now(1_000);
        // Regular: every name at the directory's home, shard 0.
        b.relaid_dir(d, DirLayout::Regular, 1, 2);
        assert_eq!(b.create(d, b"x", file).unwrap_err(), FsError::Misrouted);
        assert_eq!(b.link(f.ino, d, b"l").unwrap_err(), FsError::Misrouted);
        assert_eq!(b.rename(InodeId::ROOT, b"f", d, b"f", flags).unwrap_err(), FsError::Misrouted);
        // A name looked for here by the old layout: told to route again, not
        // `NotFound` (lookups, unlinks and rmdirs ask before they look).
        assert_eq!(b.check_name_placed(d, b"x"), Err(FsError::Misrouted));
        assert_eq!(b.rename(d, b"x", InodeId::ROOT, b"y", flags).unwrap_err(), FsError::Misrouted);
        b.create(other, b"x", file).unwrap();
        a.relaid_dir(d, DirLayout::Regular, 1, 2);
        a.create(d, b"x", file).unwrap();
        // Bigdir: each name on the shard its hash picks.
        let e = a.create(InodeId::ROOT, b"e", CreateArgs::dir(0o755)).unwrap().ino;
        a.relaid_dir(e, DirLayout::BigDir, 1, 2);
        let on = |name: &[u8]| {
            let key = RouteKey::Dentry { parent: e, layout: DirLayout::BigDir, name };
            Route::new(key.lambda(1, 2), pfs_core::ClientId(0), 1, 2).proc_worker.0
        };
        let names: Vec<Vec<u8>> = (0..32).map(|k| format!("n{k}").into_bytes()).collect();
        let here = names.iter().find(|n| on(n) == 0).expect("a name of shard 0");
        let away = names.iter().find(|n| on(n) == 1).expect("a name of shard 1");
        a.create(e, here, file).unwrap();
        assert_eq!(a.create(e, away, file).unwrap_err(), FsError::Misrouted);
        // Forgotten after a minute: the clients' cached layouts ran out long before.
        a.set_now(1_000 + RELAID_NS);
        a.create(e, away, file).unwrap();
    }

    #[test]
    fn a_resumed_rename_finishes_only_what_the_participant_applied() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let x = a.create(InodeId::ROOT, b"x", CreateArgs::file(0o644)).unwrap();
        let value = encode_dentry(x.ino, x.kind);
        // Not applied yet: abandoned, and a late dispatch is refused as well.
        let resumed = b.xrename_target(4, InodeId::ROOT, b"t", value, false, false, true);
        assert!(matches!(resumed, Err(FsError::Invalid(_))), "{resumed:?}");
        assert!(is_abandoned(b.txn(4 | PARTICIPANT_BIT).unwrap()));
        let late = b.xrename_target(4, InodeId::ROOT, b"t", value, false, false, false);
        assert!(matches!(late, Err(FsError::Invalid(_))), "{late:?}");
        assert_eq!(b.lookup(InodeId::ROOT, b"t").unwrap_err(), FsError::NotFound);
        // Applied before: resuming answers from the record.
        b.xrename_target(6, InodeId::ROOT, b"u", value, false, false, false).unwrap();
        b.xrename_target(6, InodeId::ROOT, b"u", value, false, false, true).unwrap();
        assert_eq!(b.lookup(InodeId::ROOT, b"u").unwrap().ino, x.ino);
        // The coordinator drops an abandoned intent with a forget for the record.
        a.txn_record(4, b"intent").unwrap();
        a.xrename_abandon(4, ShardId(1)).unwrap();
        assert!(a.txn(4).is_none());
        a.commit().unwrap();
        let ups = a.take_ready_follow_ups();
        assert_eq!(ups.len(), 1);
        b.apply_follow_ups(ShardId(0), &[(ups[0].id, ups[0].op)]).unwrap();
        assert!(b.txn(4 | PARTICIPANT_BIT).is_none());
    }

    #[test]
    fn an_exchange_swaps_the_two_entries() {
        let (_da, mut a) = shard(0);
        let (_db, mut b) = shard(1);
        let x = a.create(InodeId::ROOT, b"x", CreateArgs::file(0o644)).unwrap();
        let y = b.create(InodeId::ROOT, b"y", CreateArgs::dir(0o755)).unwrap();
        let src = a.xrename_begin(3, InodeId::ROOT, b"x", b"i").unwrap();
        let value = encode_dentry(src.ino, src.kind);
        let (old, freed) =
            b.xrename_target(3, InodeId::ROOT, b"y", value, false, true, false).unwrap();
        assert_eq!(old, Some(encode_dentry(y.ino, FileType::Directory)));
        assert_eq!(freed, None, "an exchange replaces nothing");
        a.xrename_finish(3, InodeId::ROOT, b"x", value, InodeId::ROOT, old, ShardId(1)).unwrap();
        assert_eq!(a.lookup(InodeId::ROOT, b"x").unwrap().ino, y.ino);
        assert_eq!(b.lookup(InodeId::ROOT, b"y").unwrap().ino, x.ino);
    }
}
