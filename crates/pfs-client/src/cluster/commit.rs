//! Making acknowledged changes durable (docs/reliability.md): which inodes a
//! change leaves unsynced on which shard, and the commits `fsync` and
//! `fsyncdir` ask for, compared by boot id so a server that restarted in
//! between is reported, never taken for durable.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pfs_core::wire::{Reply, Request};
use pfs_core::{FileHandle, FsError, FsResult, InodeId, ServerId, WorkerId};

use super::{Cluster, UNSYNCED_INODES_MAX};
use crate::conn::Conn;
use crate::unsynced::{Mark, Taken, Unsynced};

/// The inodes a change acknowledged with `reply` leaves not yet durable on the
/// shard that made it: the directories whose entries it changed, the inodes it
/// changed, and a new entry's inode (so `fsync` of a new file covers its name,
/// as ext4's does).
pub(crate) fn dirtied(req: &Request, reply: &Reply) -> Dirtied {
    let mut out = Dirtied::default();
    let changed = match *req {
        Request::Link { ino, .. }
        | Request::SetAttr { ino, .. }
        | Request::Write { ino, .. }
        | Request::WriteData { ino, .. }
        | Request::TruncateData { ino, .. }
        | Request::ExtendSize { ino, .. }
        | Request::Append { ino, .. }
        | Request::SetXattr { ino, .. }
        | Request::RemoveXattr { ino, .. }
        | Request::LayoutSet { ino, .. }
        | Request::AddLink { ino }
        | Request::DropInode { ino } => Some(ino),
        Request::AdjustDir { dir, .. } => Some(dir),
        _ => None,
    };
    for ino in std::iter::once(changed).chain(req.name_dirs()).flatten() {
        out.push(ino);
    }
    match reply {
        Reply::Create { entry, .. }
        | Reply::Mkdir(entry)
        | Reply::Mknod(entry)
        | Reply::Symlink(entry) => out.push(entry.attr.ino),
        _ => {}
    }
    out
}

/// What [`dirtied`] returns: at most three inodes (a rename's two
/// directories, a create's directory and new inode), kept in place (this
/// runs for every change a client makes).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Dirtied {
    inos: [InodeId; 3],
    len: usize,
}

impl Dirtied {
    fn push(&mut self, ino: InodeId) {
        self.inos[self.len] = ino;
        self.len += 1;
    }

    pub(crate) fn as_slice(&self) -> &[InodeId] {
        &self.inos[..self.len]
    }
}

/// Longest a background `Durable` request is waited for: a shard answers it
/// at its next commit (milliseconds); a server that does not answer sooner is
/// asked again at the next sweep, and a dropped client waits no longer.
const DURABLE_WAIT_MAX: Duration = Duration::from_secs(2);

/// The background check of this client's unsynced marks (`unsynced.rs`):
/// every `period`, the marks at least one period old are copied
/// ([`Unsynced::sweep`]), each of their shards is asked `Durable`, and the
/// marks confirmed from the boot that acknowledged them go
/// ([`Unsynced::confirm`]). Runs until `stop`; it sleeps parked between
/// sweeps, so whoever sets `stop` unparks it.
pub(crate) fn durable_sweeps(
    conns: &[Conn],
    unsynced: &Mutex<Unsynced>,
    stop: &AtomicBool,
    period: Duration,
    timeout: Duration,
) {
    let mut next = Instant::now() + period;
    loop {
        // Parked, not polling: an idle client wakes once a sweep.
        let now = Instant::now();
        if now < next {
            std::thread::park_timeout(next - now);
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        if Instant::now() < next {
            continue; // Woken early, not stopped: sleep on.
        }
        next = Instant::now() + period;
        let swept = unsynced.lock().expect("unsynced lock").sweep();
        if swept.is_empty() {
            continue;
        }
        let shards: BTreeSet<(u32, u32)> =
            swept.iter().map(|(_, m)| (m.server, m.worker)).collect();
        let wait = timeout.min(DURABLE_WAIT_MAX);
        let mut sent = Vec::with_capacity(shards.len());
        for (s, w) in shards {
            let Some(conn) = conns.get(s as usize) else { continue };
            match conn.send(Request::Durable, w as u16, wait) {
                Ok(x) => sent.push(((s, w), conn, x)),
                Err(e) => log::debug!("durability check of server {s} worker {w}: {e}"),
            }
        }
        let mut boots = HashMap::new();
        for ((s, w), conn, x) in sent {
            match conn.wait_boot(x) {
                Ok((Reply::Durable, boot)) => {
                    boots.insert((s, w), boot);
                }
                Ok((other, _)) => {
                    log::warn!("durability check of server {s} worker {w}: answered {other:?}")
                }
                Err(e) => log::debug!("durability check of server {s} worker {w}: {e}"),
            }
        }
        unsynced.lock().expect("unsynced lock").confirm(&swept, &boots);
    }
}

/// The commit request (`Fsync` of the root stands for "commit this shard").
fn commit_request() -> Request {
    Request::Fsync { ino: InodeId::ROOT, fh: FileHandle(0), datasync: false }
}

impl Cluster {
    /// Notes changes to `inos` acknowledged by a shard with boot id `boot`.
    pub(crate) fn note_unsynced<'a>(
        &self,
        inos: impl IntoIterator<Item = &'a InodeId>,
        server: u32,
        worker: u32,
        boot: u64,
    ) {
        let mut table = self.unsynced.lock().expect("unsynced lock");
        for &ino in inos {
            if table.note(ino, server, worker, boot) {
                continue;
            }
            // Full: commit everything this client changed, then note.
            let all = table.take_all();
            drop(table);
            if let Err(e) = self.commit_marks(all, &[], true) {
                log::warn!("committing {UNSYNCED_INODES_MAX} files' changes: {e}");
            }
            table = self.unsynced.lock().expect("unsynced lock");
            table.note(ino, server, worker, boot);
        }
    }

    /// Asks each shard of `taken` (and of `also`) to commit, in parallel. Marks
    /// whose shard answered from the boot that acknowledged them are done; one
    /// that answered from a later boot (the server restarted), or a mark already
    /// `lost`, makes its inode lost. Marks whose commit could not be asked for go
    /// back to the table. Returns the lost inodes for the caller to report, or
    /// the first error; with `keep_lost`, or on an error, lost marks go back to
    /// the table too (marked lost), so whoever syncs that inode next is told.
    pub(crate) fn commit_marks(
        &self,
        taken: Taken,
        also: &[(ServerId, WorkerId)],
        keep_lost: bool,
    ) -> FsResult<BTreeSet<InodeId>> {
        let mut shards: BTreeSet<(u32, u32)> =
            taken.iter().map(|(_, m)| (m.server, m.worker)).collect();
        shards.extend(also.iter().map(|(s, w)| (s.0, w.0)));
        let mut sent = Vec::with_capacity(shards.len());
        let mut first_error = None;
        for &(s, w) in &shards {
            match self.send_to(ServerId(s), WorkerId(w), commit_request()) {
                Ok(x) => sent.push(((s, w), Some(x))),
                Err(e) => {
                    first_error.get_or_insert(e);
                    sent.push(((s, w), None));
                }
            }
        }
        let mut boots = HashMap::new();
        for ((s, w), x) in sent {
            let Some((conn, x)) = x else { continue };
            // A commit changes nothing by itself, so unlike other requests it is
            // sent again once when its connection had dropped (a restarted
            // server): the answer then tells which boot holds the changes.
            let result = match self.conns[conn].wait_boot(x) {
                Err(FsError::Io(_)) => self
                    .send_to(ServerId(s), WorkerId(w), commit_request())
                    .and_then(|(conn, x)| self.conns[conn].wait_boot(x)),
                other => other,
            };
            match result {
                Ok((_, boot)) => {
                    boots.insert((s, w), boot);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut lost = Vec::new();
        let mut back = Vec::new();
        for (ino, m) in taken {
            match boots.get(&(m.server, m.worker)) {
                Some(&boot) if !m.lost && boot == m.boot => {}
                Some(_) => lost.push((ino, Mark { lost: true, ..m })),
                None => back.push((ino, m)),
            }
        }
        // Lost changes are reported to whoever syncs that inode, never dropped.
        let report = !keep_lost && first_error.is_none();
        let lost_inodes: BTreeSet<InodeId> = lost.iter().map(|(ino, _)| *ino).collect();
        if !report {
            back.extend(lost);
        }
        if !back.is_empty() {
            self.unsynced.lock().expect("unsynced lock").restore(back);
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(if report { lost_inodes } else { BTreeSet::new() })
    }

    /// Makes every acknowledged change of this client to `inos` durable, and
    /// commits the shards `also` (other clients' changes there included).
    /// `EIO` when a server restarted after acknowledging some of them.
    pub(crate) fn sync_inodes(
        &self,
        inos: &[InodeId],
        also: &[(ServerId, WorkerId)],
    ) -> FsResult<()> {
        let taken = self.unsynced.lock().expect("unsynced lock").take(inos);
        let lost = self.commit_marks(taken, also, false)?;
        match lost.first() {
            None => Ok(()),
            Some(ino) => Err(FsError::Io(format!(
                "a server restarted after it acknowledged changes to inode {ino} that were not \
                 yet durable: they may be lost"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::{Entry, InodeLayout, RenameFlags};
    use pfs_core::{FileAttr, FileType};

    fn attr(ino: u64) -> FileAttr {
        crate::cluster::test_attr(ino, FileType::Regular)
    }

    #[test]
    fn a_create_dirties_its_parent_and_the_new_inode() {
        let req = Request::Create {
            parent: InodeId(2),
            name: b"f".to_vec(),
            perm: 0o644,
            uid: 0,
            gid: 0,
            flags: 0,
            layout: pfs_core::FileLayout::Block,
        };
        let entry = Entry { attr: attr(9), layout: InodeLayout::default() };
        let reply = Reply::Create { entry, fh: FileHandle(0) };
        assert_eq!(dirtied(&req, &reply).as_slice(), [InodeId(2), InodeId(9)]);
    }

    #[test]
    fn renames_dirty_both_parents_and_reads_nothing() {
        let req = Request::Rename {
            parent: InodeId(2),
            name: b"a".to_vec(),
            new_parent: InodeId(3),
            new_name: b"b".to_vec(),
            flags: RenameFlags::empty(),
        };
        let reply = Reply::Rename { replaced: None };
        assert_eq!(dirtied(&req, &reply).as_slice(), [InodeId(2), InodeId(3)]);
        let read = Request::GetAttr { ino: InodeId(4) };
        assert!(dirtied(&read, &Reply::GetAttr(attr(4))).as_slice().is_empty());
        let write = Request::Write { ino: InodeId(5), fh: FileHandle(1), offset: 0, data: vec![1] };
        assert_eq!(
            dirtied(&write, &Reply::Write { written: 1, ctime_before: 1, ctime: 2 }).as_slice(),
            [InodeId(5)]
        );
    }
}
