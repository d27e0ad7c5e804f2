//! `pfs fsck`: the offline checker of stopped servers' shards (the `pfs`
//! command reads its arguments and calls [`run`]).
//!
//! Each zone is opened as a server start would (its log replayed), then every
//! shard's census (`pfs_store::shard::check`) is checked against the others:
//!
//! - every name's inode exists (on the shard that allocated it), and its
//!   directory exists and is a directory;
//! - link counts match the names: a file's count is its names, a directory's
//!   is 2 + its subdirectories, and a directory has one name (the root none);
//! - no inode without a name (an orphan), no data of an inode that exists
//!   nowhere and is not being freed;
//! - every directory is reached from the root (a cycle of directory names
//!   is reported, with no repair);
//! - every name is on the shard its directory's layout places it on (one
//!   elsewhere is found by no lookup or listing; reported, with no repair,
//!   when the shards given are the whole cluster);
//! - no participant record of a cross-shard transaction whose coordinator
//!   forgot it (leaked), and what each shard finds alone (a name whose type
//!   differs from its inode's, attributes of a missing inode).
//!
//! Checks that need a shard not given (another server's device) are counted as
//! not verifiable. `--repair` removes dangling names, sets link counts, frees
//! orphans and their data, and forgets leaked records, each as a logged
//! operation; then it checks again.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;

use pfs_core::{DirLayout, FileType, InodeId, ServerConfig, ShardId};
use pfs_store::device::UringDevice;
use pfs_store::shard::check::{Census, CensusInode, CensusName};
use pfs_store::Shard;

/// Writes one line of the report (a failed write of the report is ignored).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

/// One repair, as a logged shard operation.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Repair {
    RemoveName { shard: ShardId, parent: InodeId, name: Vec<u8> },
    SetNlink { shard: ShardId, ino: InodeId, nlink: u32 },
    DropInode { shard: ShardId, ino: InodeId },
    FreeData { shard: ShardId, ino: InodeId },
    ForgetTxn { shard: ShardId, id: u64 },
}

/// A problem, and its repair when there is a safe one.
#[derive(Clone, Debug)]
struct Finding {
    what: String,
    repair: Option<Repair>,
}

/// What one pass found.
#[derive(Debug, Default)]
struct Report {
    findings: Vec<Finding>,
    notes: Vec<String>,
    unverified: u64,
    inodes: usize,
    names: usize,
}

/// The shard that holds inode `ino` (the one that allocated it; the root is on 0).
fn home(ino: InodeId) -> ShardId {
    ino.shard().unwrap_or(ShardId(0))
}

fn show(name: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(name))
}

/// Effects of follow-ups logged and not yet applied at their targets: the
/// servers apply them when they run, so the checks count them as done.
#[derive(Debug, Default)]
struct Pending {
    /// Links the home has yet to drop (their names are gone).
    drops: HashMap<InodeId, u32>,
    /// Links the home has yet to count (their names exist).
    adds: HashMap<InodeId, u32>,
    /// Subdirectory changes a directory's home has yet to count.
    subdirs: HashMap<InodeId, i64>,
    /// Files whose data elsewhere is yet to be freed.
    frees: BTreeSet<InodeId>,
    /// Participant records yet to be forgotten.
    forgets: BTreeSet<(ShardId, u64)>,
    /// How many.
    count: usize,
}

fn pending_follow_ups(censuses: &[Census]) -> Pending {
    use pfs_core::wire::FollowOp;
    use pfs_store::shard::follow::{decode_follow, mark_key, FollowTarget};
    let mut p = Pending::default();
    let mark = |target: ShardId, from: ShardId| -> Option<u64> {
        let c = censuses.iter().find(|c| c.shard == target)?;
        let key = mark_key(from);
        Some(
            c.txns
                .iter()
                .find(|(id, _)| *id == key)
                .and_then(|(_, d)| d.get(..8)?.try_into().ok())
                .map_or(0, u64::from_le_bytes),
        )
    };
    for c in censuses {
        for (id, data) in &c.txns {
            let Some(up) = decode_follow(*id, data) else { continue };
            if let FollowTarget::Shard(t) = up.target {
                // Applied already (the sender had not deleted it yet), or its
                // target is not here to tell.
                if mark(t, c.shard).is_none_or(|m| up.id <= m) {
                    continue;
                }
                match up.op {
                    FollowOp::Drop { ino } => *p.drops.entry(ino).or_default() += 1,
                    FollowOp::AddLink { ino } => *p.adds.entry(ino).or_default() += 1,
                    FollowOp::AdjustDir { dir, nlink_delta } => {
                        *p.subdirs.entry(dir).or_default() += i64::from(nlink_delta)
                    }
                    FollowOp::Forget { txn } => {
                        p.forgets.insert((t, txn | (1 << 63)));
                    }
                    FollowOp::FreeData { .. }
                    | FollowOp::CutData { .. }
                    | FollowOp::Reparent { .. } => {}
                }
            } else if let FollowOp::FreeData { ino, .. } = up.op {
                p.frees.insert(ino);
            }
            p.count += 1;
        }
    }
    p
}

/// Source names of cross-shard renames whose target side is applied and whose
/// coordinator has not removed the source yet (it does at its next start):
/// (shard, directory, name, inode).
fn renamed_away(censuses: &[Census]) -> BTreeSet<(ShardId, InodeId, Vec<u8>, InodeId)> {
    let participant_has = |id: u64| {
        censuses.iter().any(|c| {
            c.txns
                .iter()
                .any(|(i, d)| *i == id | (1 << 63) && !pfs_store::shard::txn::is_abandoned(d))
        })
    };
    let mut out = BTreeSet::new();
    for c in censuses {
        for (id, data) in &c.txns {
            let Some(i) = crate::cross::Intent::decode(data) else { continue };
            if id & (1 << 63) == 0 && participant_has(*id) {
                let (ino, _) = pfs_store::shard::meta::decode_dentry(i.value);
                out.insert((c.shard, i.src_parent, i.src_name, ino));
            }
        }
    }
    out
}

/// Checks the censuses of the shards given (see the module docs).
/// The shard a name of `parent` (whose layout is `layout`) lives on in a
/// cluster of `servers` x `workers`: where lookups and listings look for it.
fn name_shard(parent: InodeId, layout: DirLayout, name: &[u8], shape: (u32, u32)) -> ShardId {
    pfs_core::routing::dentry_shard(parent, layout, name, shape.0, shape.1)
}

/// `shape`: servers x workers of the cluster, when every shard is given (a
/// name's place is checked only then).
fn analyse(censuses: &[Census], shape: Option<(u32, u32)>) -> Report {
    let mut r = Report::default();
    let pending = pending_follow_ups(censuses);
    if pending.count > 0 {
        r.notes.push(format!(
            "{} follow-ups of finished operations not yet applied where they go (the servers \
             send them when they run); counted as done",
            pending.count
        ));
    }
    let present: BTreeSet<ShardId> = censuses.iter().map(|c| c.shard).collect();
    let all_present = present.iter().enumerate().all(|(i, s)| s.0 as usize == i);
    let mut inodes: HashMap<InodeId, (ShardId, &CensusInode)> = HashMap::new();
    let mut names_of: HashMap<InodeId, Vec<(ShardId, &CensusName)>> = HashMap::new();
    let mut subdirs: HashMap<InodeId, u32> = HashMap::new();
    let leaving = renamed_away(censuses);
    for c in censuses {
        for i in &c.inodes {
            inodes.insert(i.ino, (c.shard, i));
        }
        for n in &c.names {
            if leaving.contains(&(c.shard, n.parent, n.name.clone(), n.ino)) {
                continue; // A rename the server finishes when it starts removes it.
            }
            names_of.entry(n.ino).or_default().push((c.shard, n));
            if n.kind == FileType::Directory {
                *subdirs.entry(n.parent).or_default() += 1;
            }
        }
        r.inodes += c.inodes.len();
        r.names += c.names.len();
        for p in &c.problems {
            r.findings.push(Finding { what: format!("shard {}: {p}", c.shard), repair: None });
        }
    }
    // Names where their directory's layout does not place them; reported
    // only when no reference leads out of the shards given (then they are
    // the whole cluster, and `shape` is its shape).
    let mut misplaced = Vec::new();
    for c in censuses {
        for n in &c.names {
            if leaving.contains(&(c.shard, n.parent, n.name.clone(), n.ino)) {
                // Its inode may be gone already: the rename happened, and the
                // file was then removed through its new name.
                continue;
            }
            let remove =
                Repair::RemoveName { shard: c.shard, parent: n.parent, name: n.name.clone() };
            if present.contains(&home(n.ino)) {
                if !inodes.contains_key(&n.ino) {
                    r.findings.push(Finding {
                        what: format!(
                            "shard {}: name {} in directory {} names inode {}, which does not exist",
                            c.shard,
                            show(&n.name),
                            n.parent,
                            n.ino
                        ),
                        repair: Some(remove.clone()),
                    });
                    continue;
                }
            } else {
                r.unverified += 1;
            }
            if present.contains(&home(n.parent)) {
                match inodes.get(&n.parent) {
                    None => r.findings.push(Finding {
                        what: format!(
                            "shard {}: name {} is in directory {}, which does not exist",
                            c.shard,
                            show(&n.name),
                            n.parent
                        ),
                        repair: Some(remove),
                    }),
                    Some((_, p))
                        if p.kind == FileType::Directory
                            && n.name.len() <= pfs_core::NAME_MAX
                            && shape.is_some_and(|shape| {
                                all_present
                                    && name_shard(n.parent, p.dir_layout, &n.name, shape) != c.shard
                            }) =>
                    {
                        let shape = shape.expect("checked above");
                        misplaced.push(Finding {
                            what: format!(
                                "shard {}: name {} in directory {} lies where its layout ({}) \
                                 does not look for it (shard {}): lookups and listings miss it",
                                c.shard,
                                show(&n.name),
                                n.parent,
                                pfs_store::shard::meta::dir_layout_name(p.dir_layout),
                                name_shard(n.parent, p.dir_layout, &n.name, shape)
                            ),
                            repair: None,
                        })
                    }
                    Some((_, p)) if p.kind != FileType::Directory => r.findings.push(Finding {
                        what: format!(
                            "shard {}: name {} is in inode {}, a {:?}",
                            c.shard,
                            show(&n.name),
                            n.parent,
                            p.kind
                        ),
                        repair: Some(remove),
                    }),
                    Some(_) => {}
                }
            }
        }
    }
    if r.unverified == 0 {
        r.findings.extend(misplaced);
    }
    if all_present {
        let mut sorted: Vec<_> = inodes.values().collect();
        sorted.sort_by_key(|(_, i)| i.ino);
        for (shard, i) in sorted {
            let names = names_of.get(&i.ino).map_or(0, Vec::len) as u32;
            let shard = *shard;
            let drops = pending.drops.get(&i.ino).copied().unwrap_or(0);
            let adds = pending.adds.get(&i.ino).copied().unwrap_or(0);
            if names == 0 && drops > 0 {
                continue; // Its last name went; its home frees it.
            }
            if i.ino == InodeId::ROOT {
                if names > 0 {
                    r.findings.push(Finding {
                        what: format!("the root has {names} names"),
                        repair: None,
                    });
                }
            } else if names == 0 {
                r.findings.push(Finding {
                    what: format!(
                        "shard {shard}: inode {} (a {:?}, link count {}) has no name: an orphan",
                        i.ino, i.kind, i.nlink
                    ),
                    repair: Some(Repair::DropInode { shard, ino: i.ino }),
                });
                continue;
            }
            let want = if i.kind == FileType::Directory {
                if i.ino != InodeId::ROOT && names != 1 {
                    r.findings.push(Finding {
                        what: format!("shard {shard}: directory {} has {names} names", i.ino),
                        repair: None,
                    });
                }
                let coming = pending.subdirs.get(&i.ino).copied().unwrap_or(0);
                (2 + i64::from(subdirs.get(&i.ino).copied().unwrap_or(0)) - coming)
                    .clamp(0, i64::from(u32::MAX)) as u32
            } else {
                (names + drops).saturating_sub(adds)
            };
            if i.nlink != want {
                r.findings.push(Finding {
                    what: format!(
                        "shard {shard}: inode {} (a {:?}) has link count {}, its names say {want}",
                        i.ino, i.kind, i.nlink
                    ),
                    repair: Some(Repair::SetNlink { shard, ino: i.ino, nlink: want }),
                });
            }
        }
        cycles(&inodes, &names_of, &mut r);
    } else {
        r.notes.push(
            "not every shard was given: link counts, orphans and cycles were not checked"
                .to_owned(),
        );
    }
    for c in censuses {
        for (&ino, &pages) in &c.data {
            if present.contains(&home(ino))
                && !inodes.contains_key(&ino)
                && !c.trims.contains(&ino)
                && !pending.frees.contains(&ino)
                && !pending.drops.contains_key(&ino)
            {
                r.findings.push(Finding {
                    what: format!(
                        "shard {}: {pages} data pages of inode {ino}, which does not exist",
                        c.shard
                    ),
                    repair: Some(Repair::FreeData { shard: c.shard, ino }),
                });
            }
        }
        if !c.trims.is_empty() {
            r.notes.push(format!(
                "shard {}: {} files' data still being freed (finishes when the server runs)",
                c.shard,
                c.trims.len()
            ));
        }
        for (id, data) in &c.txns {
            const PARTICIPANT: u64 = 1 << 63;
            let coordinator = ShardId(((id & !PARTICIPANT) >> 48) as u32);
            if pfs_store::shard::follow::is_mark(*id)
                || pfs_store::shard::follow::decode_follow(*id, data).is_some()
                || pending.forgets.contains(&(c.shard, *id))
            {
                // Bookkeeping, a follow-up (counted above), or forgotten soon.
            } else if id & PARTICIPANT == 0 {
                r.notes.push(format!(
                    "shard {}: cross-shard operation {id:#x} unfinished (the server completes it \
                     when it starts)",
                    c.shard
                ));
            } else if !present.contains(&coordinator) {
                r.unverified += 1;
            } else {
                let intent = id & !PARTICIPANT;
                let known = censuses
                    .iter()
                    .filter(|x| x.shard == coordinator)
                    .any(|x| x.txns.iter().any(|(i, _)| *i == intent));
                if !known {
                    r.findings.push(Finding {
                        what: format!(
                            "shard {}: participant record {id:#x} of a transaction its \
                             coordinator (shard {coordinator}) no longer has",
                            c.shard
                        ),
                        repair: Some(Repair::ForgetTxn { shard: c.shard, id: *id }),
                    });
                }
            }
        }
    }
    r
}

/// Directories the root does not reach through directory names, though each
/// has its one name: cycles (two clients that each moved a directory under
/// the other at once, before the rename lock, docs/cluster.md) and what hangs
/// below them. One finding per cycle, naming its directories and how many
/// more hang below; no repair (where to put them back is the operator's
/// call).
fn cycles(
    inodes: &HashMap<InodeId, (ShardId, &CensusInode)>,
    names_of: &HashMap<InodeId, Vec<(ShardId, &CensusName)>>,
    r: &mut Report,
) {
    let mut below: HashMap<InodeId, Vec<InodeId>> = HashMap::new();
    let mut parent_of: HashMap<InodeId, InodeId> = HashMap::new();
    for (ino, names) in names_of {
        for (_, n) in names.iter().filter(|(_, n)| n.kind == FileType::Directory) {
            below.entry(n.parent).or_default().push(*ino);
            parent_of.insert(*ino, n.parent);
        }
    }
    let mut reached = BTreeSet::from([InodeId::ROOT]);
    let mut todo = vec![InodeId::ROOT];
    while let Some(d) = todo.pop() {
        for &c in below.get(&d).into_iter().flatten() {
            if reached.insert(c) {
                todo.push(c);
            }
        }
    }
    let mut cut: Vec<InodeId> = inodes
        .values()
        .filter(|(_, i)| i.kind == FileType::Directory && !reached.contains(&i.ino))
        .map(|(_, i)| i.ino)
        .filter(|ino| parent_of.contains_key(ino))
        .collect();
    cut.sort();
    let mut in_cycle = 0;
    // Every directory is walked once: a walk stops at one an earlier walk saw.
    let mut walked = BTreeSet::new();
    for &start in &cut {
        // Up the names from `start`: every step is a directory the root does
        // not reach, so the walk ends in a cycle, at a directory walked
        // before, or at a missing one (reported above).
        let mut path: Vec<InodeId> = Vec::new();
        let mut on_path: HashMap<InodeId, usize> = HashMap::new();
        let mut at = start;
        while walked.insert(at) {
            on_path.insert(at, path.len());
            path.push(at);
            let Some(&up) = parent_of.get(&at) else { break };
            if let Some(&k) = on_path.get(&up) {
                let list: Vec<String> = path[k..].iter().map(|d| d.to_string()).collect();
                in_cycle += list.len();
                r.findings.push(Finding {
                    what: format!(
                        "directories {} are in a cycle of names the root does not reach \
                         (no safe repair: where they belong is the operator's call)",
                        list.join(" -> ")
                    ),
                    repair: None,
                });
                break;
            }
            at = up;
        }
    }
    let hanging = cut.len() - in_cycle;
    if hanging > 0 {
        r.notes.push(format!("directories below such cycles: {hanging}"));
    }
}

fn apply(shard: &mut Shard<UringDevice>, repair: &Repair) -> Result<(), String> {
    let r = match repair {
        Repair::RemoveName { parent, name, .. } => shard.repair_remove_name(*parent, name),
        Repair::SetNlink { ino, nlink, .. } => shard.repair_set_nlink(*ino, *nlink),
        Repair::DropInode { ino, .. } => shard.repair_drop_inode(*ino),
        Repair::FreeData { ino, .. } => shard.repair_free_data(*ino),
        Repair::ForgetTxn { id, .. } => shard.txn_forget(*id),
    };
    r.map_err(|e| format!("repair {repair:?}: {e}"))
}

fn repair_shard(r: &Repair) -> ShardId {
    match r {
        Repair::RemoveName { shard, .. }
        | Repair::SetNlink { shard, .. }
        | Repair::DropInode { shard, .. }
        | Repair::FreeData { shard, .. }
        | Repair::ForgetTxn { shard, .. } => *shard,
    }
}

/// Checks (and with `repair`, repairs) the shards of the stopped servers
/// `configs`, writing the report to `out`; `Ok(true)` when the file system is
/// clean (after the repairs).
pub fn run(configs: &[ServerConfig], repair: bool, out: &mut dyn Write) -> Result<bool, String> {
    let mut shards: Vec<Shard<UringDevice>> = Vec::new();
    let mut locks = Vec::new();
    for cfg in configs {
        let (s, lock) = crate::server::open_for_check(cfg)
            .map_err(|e| format!("{}: {e}", cfg.data_path.display()))?;
        shards.extend(s);
        locks.push(lock);
    }
    shards.sort_by_key(|s| s.id());
    // Every server runs the same number of workers (the master refuses
    // others); with every server's config given, this is the cluster's shape.
    let workers = configs.first().map_or(1, |c| c.workers.max(1));
    let shape = (!configs.is_empty()).then_some((configs.len() as u32, workers));
    say!(out, "pfs fsck: {} shards of {} server(s), logs replayed", shards.len(), configs.len());
    let mut repaired = 0usize;
    // A repair can uncover more (a name removed leaves its inode an orphan),
    // so repair and check again, a bounded number of times.
    for pass in 0..4 {
        let censuses: Vec<Census> = shards
            .iter_mut()
            .map(|s| s.census().map_err(|e| format!("shard {}: {e}", s.id())))
            .collect::<Result<_, _>>()?;
        let report = analyse(&censuses, shape);
        if pass == 0 {
            say!(out, "pfs fsck: {} inodes, {} names", report.inodes, report.names);
            for n in &report.notes {
                say!(out, "note: {n}");
            }
            if report.unverified > 0 {
                say!(
                    out,
                    "note: {} references lead to shards not given here and were not checked",
                    report.unverified
                );
            }
        }
        if report.findings.is_empty() {
            if repaired > 0 {
                say!(out, "pfs fsck: {repaired} repairs made; clean now");
            } else {
                say!(out, "pfs fsck: clean");
            }
            return Ok(true);
        }
        for f in &report.findings {
            let fix = if f.repair.is_some() { "" } else { " (no safe repair)" };
            say!(out, "problem: {}{fix}", f.what);
        }
        if !repair {
            say!(
                out,
                "pfs fsck: {} problems; `pfs fsck --repair` repairs {} of them",
                report.findings.len(),
                report.findings.iter().filter(|f| f.repair.is_some()).count()
            );
            return Ok(false);
        }
        let repairs: Vec<&Repair> =
            report.findings.iter().filter_map(|f| f.repair.as_ref()).collect();
        if repairs.is_empty() {
            break;
        }
        let index: BTreeMap<ShardId, usize> =
            shards.iter().enumerate().map(|(i, s)| (s.id(), i)).collect();
        for rep in repairs {
            let i = index[&repair_shard(rep)];
            apply(&mut shards[i], rep)?;
            repaired += 1;
        }
        for s in &mut shards {
            s.checkpoint().map_err(|e| format!("shard {}: {e}", s.id()))?;
        }
    }
    say!(out, "pfs fsck: problems remain that have no safe repair");
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ino(shard: u32, seq: u64) -> InodeId {
        InodeId::compose(ShardId(shard), seq)
    }

    fn inode(ino: InodeId, kind: FileType, nlink: u32) -> CensusInode {
        CensusInode { ino, kind, nlink, parent: InodeId::ROOT, dir_layout: DirLayout::BigDir }
    }

    fn name(parent: InodeId, n: &str, ino: InodeId, kind: FileType) -> CensusName {
        CensusName { parent, name: n.as_bytes().to_vec(), ino, kind }
    }

    /// A name on a shard where its directory's layout does not place it
    /// (lookups and listings would never find it) is reported, without a
    /// repair; names where the layout puts them are not.
    #[test]
    fn a_name_where_its_directory_layout_does_not_look_is_found() {
        use FileType::{Directory as D, Regular as F};
        let shape = (1, 2);
        let (big, reg) = (ino(0, 2), ino(0, 3));
        let mut reg_inode = inode(reg, D, 2);
        reg_inode.dir_layout = DirLayout::Regular;
        let on = |parent, layout, n: &str| name_shard(parent, layout, n.as_bytes(), shape).0;
        let names: Vec<String> = (0..32).map(|k| format!("n{k}")).collect();
        let right = names.iter().find(|n| on(big, DirLayout::BigDir, n) == 1).unwrap();
        // Belongs on shard 1 too, and will be put on shard 0.
        let wrong = names.iter().filter(|n| on(big, DirLayout::BigDir, n) == 1).nth(1).unwrap();
        let root_names: Vec<_> =
            ["big", "reg"].iter().map(|n| (on(InodeId::ROOT, DirLayout::BigDir, n), *n)).collect();
        let (f1, f2, f3) = (ino(1, 2), ino(1, 3), ino(0, 4));
        let mut s0 = Census {
            shard: ShardId(0),
            inodes: vec![inode(InodeId::ROOT, D, 4), inode(big, D, 2), reg_inode, inode(f3, F, 1)],
            // A regular directory's names live at its home, shard 0.
            names: vec![name(reg, "kept", f3, F)],
            ..Census::default()
        };
        let mut s1 = Census {
            shard: ShardId(1),
            inodes: vec![inode(f1, F, 1), inode(f2, F, 1)],
            names: vec![name(big, right, f1, F), name(reg, "stranded", f2, F)],
            ..Census::default()
        };
        for (shard, n) in root_names {
            let dir = if n == "big" { big } else { reg };
            let s = if shard == 0 { &mut s0 } else { &mut s1 };
            s.names.push(name(InodeId::ROOT, n, dir, D));
        }
        let r = analyse(&[s0.clone(), s1.clone()], Some(shape));
        let found: Vec<&str> = r.findings.iter().map(|f| f.what.as_str()).collect();
        assert_eq!(found.len(), 1, "{found:#?}");
        assert!(found[0].contains("\"stranded\"") && found[0].contains("(regular)"), "{found:?}");
        assert!(r.findings[0].repair.is_none());
        // A bigdir name on the wrong shard, too; and nothing without the shape.
        let f4 = ino(0, 5);
        s0.inodes.push(inode(f4, F, 1));
        s0.names.push(name(big, wrong, f4, F));
        let r = analyse(&[s0.clone(), s1.clone()], Some(shape));
        assert_eq!(r.findings.len(), 2, "{:#?}", r.findings);
        assert!(analyse(&[s0, s1], None).findings.is_empty());
    }

    #[test]
    fn each_kind_of_problem_is_found_with_its_repair() {
        use FileType::{Directory as D, Regular as F};
        let (dir, file, lost, ghost, freeing) =
            (ino(0, 2), ino(0, 3), ino(1, 2), ino(1, 9), ino(1, 8));
        let gone_dir = ino(1, 7);
        let s0 = Census {
            shard: ShardId(0),
            inodes: vec![inode(InodeId::ROOT, D, 3), inode(dir, D, 2), inode(file, F, 2)],
            names: vec![name(InodeId::ROOT, "d", dir, D), name(dir, "f", file, F)],
            txns: vec![((1 << 63) | 5, vec![])],
            ..Census::default()
        };
        let s1 = Census {
            shard: ShardId(1),
            inodes: vec![inode(lost, F, 1)],
            names: vec![name(gone_dir, "x", file, F), name(dir, "y", ghost, F)],
            data: [(ghost, 4), (freeing, 2)].into(),
            trims: [freeing].into(),
            ..Census::default()
        };
        let r = analyse(&[s0, s1], None);
        let repairs: Vec<Repair> = r.findings.iter().filter_map(|f| f.repair.clone()).collect();
        let want = [
            Repair::RemoveName { shard: ShardId(1), parent: gone_dir, name: b"x".to_vec() },
            Repair::RemoveName { shard: ShardId(1), parent: dir, name: b"y".to_vec() },
            Repair::SetNlink { shard: ShardId(0), ino: InodeId::ROOT, nlink: 3 },
            Repair::DropInode { shard: ShardId(1), ino: lost },
            Repair::FreeData { shard: ShardId(1), ino: ghost },
            Repair::ForgetTxn { shard: ShardId(0), id: (1 << 63) | 5 },
        ];
        // The root has one subdirectory: 2 + 1 = 3 is right, so no SetNlink for it.
        for w in &want[..2] {
            assert!(repairs.contains(w), "{w:?} missing from {repairs:?}");
        }
        assert!(!repairs.contains(&want[2]), "the root's count is right");
        for w in &want[3..] {
            assert!(repairs.contains(w), "{w:?} missing from {repairs:?}");
        }
        // `file` has two names ("f", and "x" in the missing directory) and count 2.
        assert!(!repairs.iter().any(|r| matches!(r, Repair::SetNlink { ino, .. } if *ino == file)));
        assert!(!repairs
            .iter()
            .any(|r| matches!(r, Repair::FreeData { ino, .. } if *ino == freeing)));
        assert_eq!(repairs.len(), 5, "{repairs:?}");
    }

    /// Two directories each named in the other hang in a cycle the root does
    /// not reach, with a third below them: one finding for the cycle, none
    /// for the directory below it or for those the root reaches.
    #[test]
    fn a_cycle_of_directories_the_root_does_not_reach_is_found() {
        use FileType::Directory as D;
        let (top, a, b, under) = (ino(0, 2), ino(0, 3), ino(1, 2), ino(1, 3));
        let s0 = Census {
            shard: ShardId(0),
            inodes: vec![inode(InodeId::ROOT, D, 3), inode(top, D, 2), inode(a, D, 4)],
            names: vec![name(InodeId::ROOT, "top", top, D), name(b, "a", a, D)],
            ..Census::default()
        };
        let s1 = Census {
            shard: ShardId(1),
            inodes: vec![inode(b, D, 3), inode(under, D, 2)],
            names: vec![name(a, "b", b, D), name(a, "under", under, D)],
            ..Census::default()
        };
        let r = analyse(&[s0, s1], None);
        let found: Vec<&str> = r.findings.iter().map(|f| f.what.as_str()).collect();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("cycle"), "{found:?}");
        assert!(found[0].contains(&a.to_string()) && found[0].contains(&b.to_string()));
        assert!(r.findings[0].repair.is_none());
        assert!(r.notes.iter().any(|n| n == "directories below such cycles: 1"), "{:?}", r.notes);
    }

    /// The source name of a rename whose target side is applied goes when the
    /// coordinator starts; the file may have been removed meanwhile through
    /// its new name. Neither is a problem. Once the participant's answer is
    /// gone (or it abandoned the rename), the name must name a live inode.
    #[test]
    fn the_source_of_a_rename_applied_elsewhere_may_name_a_removed_inode() {
        use FileType::{Directory as D, Regular as F};
        let (dir, gone) = (ino(0, 2), ino(0, 3));
        let intent = crate::cross::Intent {
            src_parent: dir,
            src_name: b"f.tmp".to_vec(),
            value: pfs_store::shard::meta::encode_dentry(gone, F),
            new_parent: dir,
            new_name: b"f".to_vec(),
            flags: pfs_core::wire::RenameFlags::empty(),
            target: (pfs_core::ServerId(0), pfs_core::WorkerId(1)),
        };
        let census = |answer: Option<Vec<u8>>| {
            let s0 = Census {
                shard: ShardId(0),
                inodes: vec![inode(InodeId::ROOT, D, 3), inode(dir, D, 2)],
                names: vec![name(InodeId::ROOT, "d", dir, D), name(dir, "f.tmp", gone, F)],
                txns: vec![(7, intent.encode())],
                ..Census::default()
            };
            let s1 = Census {
                shard: ShardId(1),
                txns: answer.map_or(vec![], |a| vec![((1 << 63) | 7, a)]),
                ..Census::default()
            };
            analyse(&[s0, s1], None)
        };
        let r = census(Some(vec![0; 26]));
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        for answer in [None, Some(pfs_store::shard::txn::ABANDONED.to_vec())] {
            let r = census(answer);
            assert!(
                r.findings.iter().any(|f| f.what.contains("which does not exist")),
                "{:?}",
                r.findings
            );
        }
    }

    #[test]
    fn shards_not_given_are_not_checked_but_counted() {
        let s1 = Census {
            shard: ShardId(1),
            names: vec![name(ino(0, 2), "a", ino(0, 3), FileType::Regular)],
            ..Census::default()
        };
        let r = analyse(&[s1], None);
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert_eq!(r.unverified, 1);
        assert!(r.notes.iter().any(|n| n.contains("not every shard")));
    }

    #[test]
    fn follow_ups_in_flight_count_as_done_until_their_target_has_applied_them() {
        use pfs_core::wire::FollowOp;
        use pfs_store::shard::follow::{encode_follow, mark_key, FollowTarget};
        use FileType::{Directory as D, Regular as F};
        let (orphan, linked) = (ino(0, 2), ino(0, 3));
        let to0 = |op| encode_follow(FollowTarget::Shard(ShardId(0)), &op);
        let census = |mark: u64| {
            let s0 = Census {
                shard: ShardId(0),
                inodes: vec![inode(InodeId::ROOT, D, 2), inode(orphan, F, 1), inode(linked, F, 1)],
                names: vec![name(InodeId::ROOT, "a", linked, F)],
                txns: vec![(mark_key(ShardId(1)), mark.to_le_bytes().to_vec())],
                ..Census::default()
            };
            let s1 = Census {
                shard: ShardId(1),
                // `orphan`'s last name went here, `linked` got a second name here.
                names: vec![name(InodeId::ROOT, "b", linked, F)],
                txns: vec![
                    ((1 << 48) | 5, to0(FollowOp::Drop { ino: orphan })),
                    ((1 << 48) | 6, to0(FollowOp::AddLink { ino: linked })),
                ],
                ..Census::default()
            };
            analyse(&[s0, s1], None)
        };
        let r = census(0);
        assert!(r.findings.is_empty(), "{:?}", r.findings);
        assert!(r.notes.iter().any(|n| n.contains("2 follow-ups")), "{:?}", r.notes);
        // Once the target's watermark says they were applied, their effects must show.
        let r = census((1 << 48) | 6);
        let repairs: Vec<Repair> = r.findings.iter().filter_map(|f| f.repair.clone()).collect();
        assert!(repairs.contains(&Repair::DropInode { shard: ShardId(0), ino: orphan }));
        assert!(repairs.contains(&Repair::SetNlink { shard: ShardId(0), ino: linked, nlink: 2 }));
    }
}
