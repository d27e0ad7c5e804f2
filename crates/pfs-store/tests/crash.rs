//! Crash tests on `MemDevice`: random operation sequences, a power cut at a random
//! write, a crash that drops or tears every unsynced write, then recovery. The
//! recovered shard must equal the model after some prefix of the operations that
//! starts no earlier than the last acknowledged commit: durable work is never
//! lost and no operation is ever half-applied.
//!
//! `PFS_CRASH_SEEDS=N` sets the number of seeds (default 4000);
//! `PFS_CRASH_SEED=S` replays one seed.

use std::collections::BTreeMap;

use pfs_core::{FileType, FsError, InodeId, SetAttr, ShardId};
use pfs_store::device::MemDevice;
use pfs_store::{CreateArgs, FormatOptions, RenameFlags, Shard, ShardOptions, XattrFlags};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ZONE: u64 = 3 << 20;
const ROOT: InodeId = InodeId::ROOT;

#[derive(Clone, Debug, PartialEq)]
struct Node {
    ino: InodeId,
    kind: FileType,
    data: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// (parent, name) -> node.
type Model = BTreeMap<(InodeId, Vec<u8>), Node>;

fn opts() -> ShardOptions {
    ShardOptions {
        icache_blocks: 8,
        dirty_ratio: 0.25,
        wal_group_bytes: 64 << 10,
        read_cache_pages: 64,
        read_ahead_factor: 10,
    }
}

fn format_options() -> FormatOptions {
    let mut fo = FormatOptions::new(ShardId(1), ZONE);
    fo.inode_slots = Some(512);
    fo.wal_bytes = Some(512 << 10);
    fo.block_size = 16 << 10;
    fo
}

fn dirs(model: &Model) -> Vec<InodeId> {
    let mut d = vec![ROOT];
    d.extend(model.values().filter(|n| n.kind == FileType::Directory).map(|n| n.ino));
    d
}

fn pick<'a, T>(rng: &mut StdRng, v: &'a [T]) -> Option<&'a T> {
    (!v.is_empty()).then(|| &v[rng.gen_range(0..v.len())])
}

/// Runs one random operation on both the shard and the model. The model changes
/// only if the shard reports success.
fn step(rng: &mut StdRng, shard: &mut Shard<MemDevice>, model: &mut Model) -> Result<(), FsError> {
    let files: Vec<(InodeId, Vec<u8>)> =
        model.iter().filter(|(_, n)| n.kind == FileType::Regular).map(|(k, _)| k.clone()).collect();
    let name = format!("n{}", rng.gen_range(0..40)).into_bytes();
    let parent = *pick(rng, &dirs(model)).expect("root");
    match rng.gen_range(0..100) {
        0..=24 => {
            let a = shard.create(parent, &name, CreateArgs::file(0o644))?;
            let node =
                Node { ino: a.ino, kind: FileType::Regular, data: vec![], xattrs: BTreeMap::new() };
            model.insert((parent, name), node);
        }
        25..=31 => {
            let a = shard.create(parent, &name, CreateArgs::dir(0o755))?;
            let node = Node {
                ino: a.ino,
                kind: FileType::Directory,
                data: vec![],
                xattrs: BTreeMap::new(),
            };
            model.insert((parent, name), node);
        }
        32..=61 => {
            let Some(key) = pick(rng, &files).cloned() else { return Ok(()) };
            let node = model.get_mut(&key).expect("file");
            let offset =
                if rng.gen_bool(0.5) { node.data.len() as u64 } else { rng.gen_range(0..60_000) };
            let len = rng.gen_range(1..40_000usize);
            let byte = rng.gen::<u8>();
            let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
            shard.write(node.ino, offset, &data)?;
            let end = offset as usize + len;
            if node.data.len() < end {
                node.data.resize(end, 0);
            }
            node.data[offset as usize..end].copy_from_slice(&data);
        }
        62..=67 => {
            let Some(key) = pick(rng, &files).cloned() else { return Ok(()) };
            let node = model.get_mut(&key).expect("file");
            let size = rng.gen_range(0..50_000u64);
            shard.setattr(node.ino, SetAttr { size: Some(size), ..Default::default() })?;
            node.data.resize(size as usize, 0);
        }
        68..=77 => {
            let Some(key) = pick(rng, &files).cloned() else { return Ok(()) };
            shard.unlink(key.0, &key.1)?;
            model.remove(&key);
        }
        78..=81 => {
            let empty: Vec<(InodeId, Vec<u8>)> = model
                .iter()
                .filter(|(_, n)| {
                    n.kind == FileType::Directory && !model.keys().any(|(p, _)| *p == n.ino)
                })
                .map(|(k, _)| k.clone())
                .collect();
            let Some(key) = pick(rng, &empty).cloned() else { return Ok(()) };
            shard.rmdir(key.0, &key.1)?;
            model.remove(&key);
        }
        82..=89 => {
            let Some(key) = pick(rng, &files).cloned() else { return Ok(()) };
            let dst = (parent, name);
            if model.get(&dst).is_some_and(|n| n.kind == FileType::Directory) {
                return Ok(());
            }
            shard.rename(key.0, &key.1, dst.0, &dst.1, RenameFlags::default())?;
            let node = model.remove(&key).expect("source");
            model.insert(dst, node);
        }
        90..=94 => {
            let Some(key) = pick(rng, &files).cloned() else { return Ok(()) };
            let node = model.get_mut(&key).expect("file");
            let (k, v) = (
                format!("user.k{}", rng.gen_range(0..3)).into_bytes(),
                vec![rng.gen(); rng.gen_range(0..300)],
            );
            shard.setxattr(node.ino, &k, &v, XattrFlags::default())?;
            node.xattrs.insert(k, v);
        }
        _ => {
            let Some(key) = pick(rng, &files).cloned() else { return Ok(()) };
            let node = model.get(&key).expect("file");
            let got = shard.read(node.ino, 0, node.data.len() + 10)?;
            assert_eq!(got, node.data, "read back differs before any crash");
        }
    }
    Ok(())
}

/// Why `shard` differs from `model`, or `None` if it matches.
fn diff(shard: &mut Shard<MemDevice>, model: &Model) -> Option<String> {
    for dir in dirs(model) {
        let mut listed = Vec::new();
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = shard.readdir(dir, after.as_deref(), 17).ok()?;
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            listed.extend(page.into_iter().map(|e| (e.name, e.ino)));
        }
        let want: Vec<(Vec<u8>, InodeId)> = model
            .iter()
            .filter(|((p, _), _)| *p == dir)
            .map(|((_, n), node)| (n.clone(), node.ino))
            .collect();
        if listed != want {
            return Some(format!("dir {dir}: listed {listed:?}, model {want:?}"));
        }
    }
    for ((_, name), node) in model {
        let attr = match shard.getattr(node.ino) {
            Ok(a) => a,
            Err(e) => return Some(format!("{}: getattr {e}", String::from_utf8_lossy(name))),
        };
        if attr.kind != node.kind {
            return Some(format!("{}: kind {:?}", String::from_utf8_lossy(name), attr.kind));
        }
        if node.kind == FileType::Regular {
            let data = shard.read(node.ino, 0, node.data.len() + 10).ok()?;
            if attr.size != node.data.len() as u64 || data != node.data {
                return Some(format!(
                    "{}: size {} vs {}, data differs",
                    String::from_utf8_lossy(name),
                    attr.size,
                    node.data.len()
                ));
            }
            for (k, v) in &node.xattrs {
                if shard.getxattr(node.ino, k).ok().as_ref() != Some(v) {
                    return Some(format!("{}: xattr differs", String::from_utf8_lossy(name)));
                }
            }
        }
    }
    if shard.inode_count() != model.len() + 1 {
        return Some(format!(
            "{} inodes on the shard, model has {}",
            shard.inode_count(),
            model.len() + 1
        ));
    }
    None
}

/// What one seed exercised.
struct Outcome {
    /// How many operations after the last commit the recovered state kept.
    kept_after_commit: usize,
    /// Operations after the last commit at crash time.
    uncommitted: usize,
    /// WAL records replayed at recovery.
    replayed: u64,
    /// Whether a checkpoint was under way beside the operations at the crash.
    checkpointing: bool,
    /// Whether recovery opened from a checkpoint whose image was encoded
    /// while operations changed the tables.
    from_fuzzy: bool,
    /// Whether device requests met a full queue and waited in the shard's.
    held: bool,
}

fn run_seed(seed: u64) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    // One seed in three on a queue of two requests: commits, checkpoints and
    // write-backs then wait in the shard's queue for room.
    let depth = if seed % 3 == 0 { 2 } else { 32 };
    let dev = MemDevice::new(ZONE, depth);
    let handle = dev.handle();
    if seed % 2 == 1 {
        // Complete requests out of order, as a real queue may.
        handle.reorder(Some(seed));
    }
    let mut shard = Shard::format(dev, &format_options(), opts()).expect("format");
    // A few entries per slice: operations run inside a checkpoint's image.
    shard.set_checkpoint_slice((seed % 7 + 1) as usize);
    let mut model = Model::new();
    // States since the last acknowledged commit; recovery must land on one of them.
    let mut candidates = vec![model.clone()];
    let ops = rng.gen_range(5..120);
    let cut_after = handle.writes_submitted() + rng.gen_range(0..400);
    handle.freeze_after_writes(cut_after - handle.writes_submitted());
    for _ in 0..ops {
        let r = rng.gen_range(0..100);
        if r < 4 {
            // A checkpoint beside the operations: no acknowledgement; it moves
            // on as operations start and as polled.
            shard.start_checkpoint();
            continue;
        }
        if r < 8 {
            shard.poll_checkpoint();
            continue;
        }
        if r < 20 {
            let res =
                if r < 10 { shard.checkpoint().map_err(FsError::from) } else { shard.commit() };
            if handle.is_frozen() {
                break; // The acknowledgement never left the machine.
            }
            res.unwrap_or_else(|e| panic!("seed {seed}: commit failed: {e}"));
            candidates = vec![model.clone()];
            continue;
        }
        match step(&mut rng, &mut shard, &mut model) {
            Ok(()) => {}
            Err(
                FsError::NotFound
                | FsError::Exists
                | FsError::IsDir
                | FsError::NotDir
                | FsError::NotEmpty
                | FsError::NoSpace,
            ) => {}
            Err(e) => panic!("seed {seed}: unexpected error {e}"),
        }
        candidates.push(model.clone());
        if handle.is_frozen() {
            break;
        }
    }
    let checkpointing = shard.checkpointing();
    let fuzzy_gen = shard.stats().last_fuzzy_gen;
    let held = shard.stats().held_back > 0;
    drop(shard);
    let crashed = handle.crash(seed ^ 0x5eed);
    let mut shard = match Shard::open(crashed, 0, opts()) {
        Ok(s) => s,
        Err(e) => panic!("seed {seed}: recovery failed: {e}"),
    };
    let mut reasons = Vec::new();
    for (i, c) in candidates.iter().enumerate().rev() {
        match diff(&mut shard, c) {
            None => {
                return Outcome {
                    kept_after_commit: i,
                    uncommitted: candidates.len() - 1,
                    replayed: shard.stats().replayed,
                    checkpointing,
                    from_fuzzy: fuzzy_gen > 0 && shard.stats().opened_gen == fuzzy_gen,
                    held,
                }
            }
            Some(why) => reasons.push(why),
        }
    }
    panic!(
        "seed {seed}: recovered state matches none of {} candidate states; newest: {}; oldest (last commit): {}",
        candidates.len(),
        reasons.first().unwrap(),
        reasons.last().unwrap()
    );
}

#[test]
fn random_crashes_never_lose_durable_work() {
    if let Ok(seed) = std::env::var("PFS_CRASH_SEED") {
        run_seed(seed.parse().expect("PFS_CRASH_SEED is a number"));
        return;
    }
    let seeds: u64 =
        std::env::var("PFS_CRASH_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4000);
    let (mut lost_some, mut kept_some, mut replayed, mut mid_checkpoint) = (0, 0, 0, 0);
    let (mut from_fuzzy, mut held) = (0, 0);
    for seed in 0..seeds {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(o) => {
                lost_some += (o.kept_after_commit < o.uncommitted) as u64;
                kept_some += (o.kept_after_commit > 0) as u64;
                replayed += (o.replayed > 0) as u64;
                mid_checkpoint += o.checkpointing as u64;
                from_fuzzy += o.from_fuzzy as u64;
                held += o.held as u64;
            }
            Err(_) => {
                panic!("crash test failed for seed {seed}; replay with PFS_CRASH_SEED={seed}")
            }
        }
    }
    eprintln!(
        "{seeds} seeds: {lost_some} lost uncommitted work, {kept_some} kept some, {replayed} \
         replayed the WAL, {mid_checkpoint} crashed during a checkpoint taken beside the operations, \
         {from_fuzzy} recovered from a checkpoint encoded while operations ran, {held} held \
         requests behind a full device queue"
    );
    // The test must exercise every outcome, or it proves nothing.
    if seeds >= 100 {
        assert!(lost_some > seeds / 20, "too few crashes lost uncommitted work: {lost_some}");
        assert!(kept_some > 0, "no crash kept uncommitted work that had reached the log");
        assert!(replayed > seeds / 10, "too few recoveries replayed the WAL: {replayed}");
        assert!(
            mid_checkpoint > seeds / 40,
            "too few crashes during a checkpoint beside the operations: {mid_checkpoint}"
        );
        assert!(
            from_fuzzy > seeds / 100,
            "too few recoveries from a checkpoint encoded while operations ran: {from_fuzzy}"
        );
        assert!(held > seeds / 20, "too few runs met a full device queue: {held}");
    }
}
