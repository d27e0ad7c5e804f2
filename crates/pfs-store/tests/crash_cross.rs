//! Power loss in the middle of a cross-shard rename, on `MemDevice`.
//!
//! Two shards, each on its own device: the coordinator holds the source name,
//! the participant the target name (sometimes an existing file, replaced). The
//! protocol of `docs/cluster.md` ("Rename across shards") runs step by step,
//! each step followed by its commit, in the order the worker keeps: intent and
//! commit; the participant's side and commit; the coordinator's end and commit;
//! only then the participant's forget and commit. The power fails on both
//! devices after a random number of steps (and, for each device, at a random
//! write within the next step), every unsynced write is dropped or torn per
//! sector, both shards recover, and the coordinator's recovery runs what is left
//! of the protocol. Then exactly one name reaches the file (the source if the
//! intent was not durable, else the target), the replaced file is gone exactly
//! when the rename happened, and no transaction record is left on either side:
//! the participant's forget is a follow-up, durable with the coordinator's end
//! and delivered again after the restart.
//!
//! `PFS_CRASH_SEEDS=N` sets the number of seeds (default 2000);
//! `PFS_CRASH_SEED=S` replays one.

use pfs_core::{FsError, InodeId, ShardId};
use pfs_store::device::MemDevice;
use pfs_store::shard::meta::encode_dentry;
use pfs_store::shard::txn::PARTICIPANT_BIT;
use pfs_store::{CreateArgs, FormatOptions, Shard, ShardOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ZONE: u64 = 8 << 20;
const ROOT: InodeId = InodeId::ROOT;
const TXN: u64 = 7;

fn opts() -> ShardOptions {
    ShardOptions {
        icache_blocks: 32,
        dirty_ratio: 0.25,
        wal_group_bytes: 64 << 10,
        read_cache_pages: 64,
        read_ahead_factor: 10,
    }
}

fn format(shard: u32) -> (MemDevice, Shard<MemDevice>) {
    let dev = MemDevice::new(ZONE, 64);
    let mut f = FormatOptions::new(ShardId(shard), ZONE);
    f.create_root = shard == 0;
    f.inode_slots = Some(256);
    f.wal_bytes = Some(1 << 20);
    let s = Shard::format(dev.handle(), &f, opts()).unwrap();
    (dev, s)
}

/// Runs the protocol steps `from..` on `a` (coordinator) and `b` (participant);
/// `Err` is a power cut inside a step.
fn steps(
    a: &mut Shard<MemDevice>,
    b: &mut Shard<MemDevice>,
    db: &MemDevice,
    value: u64,
    from: usize,
    to: usize,
) -> Result<(), FsError> {
    for step in from..to {
        match step {
            0 => {
                a.xrename_begin(TXN, ROOT, b"src", b"intent")?;
                a.commit()?;
            }
            1 => {
                b.xrename_target(TXN, ROOT, b"dst", value, false, false, false)?;
                b.commit()?;
            }
            2 => {
                a.xrename_finish(TXN, ROOT, b"src", value, ROOT, None, ShardId(1))?;
                a.commit()?;
            }
            _ => deliver(a, b, db)?,
        }
    }
    Ok(())
}

/// The outbox: sends the coordinator's durable follow-ups (the forget) to the
/// participant, which applies them and commits; then the coordinator deletes them.
/// A participant whose device lost power answers nothing.
fn deliver(
    a: &mut Shard<MemDevice>,
    b: &mut Shard<MemDevice>,
    db: &MemDevice,
) -> Result<(), FsError> {
    let ups = a.take_ready_follow_ups();
    let ops: Vec<_> = ups.iter().map(|u| (u.id, u.op)).collect();
    b.apply_follow_ups(ShardId(0), &ops)?;
    b.commit()?;
    if db.is_frozen() {
        return Err(FsError::Io("the participant lost power before it answered".into()));
    }
    for u in ups {
        a.follow_done(u.id)?;
    }
    a.commit()
}

fn run_seed(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let (da, mut a) = format(0);
    let (db, mut b) = format(1);
    let file = a.create(ROOT, b"src", CreateArgs::file(0o644)).unwrap();
    a.write(file.ino, 0, b"moved").unwrap();
    let victim =
        rng.gen_bool(0.5).then(|| b.create(ROOT, b"dst", CreateArgs::file(0o644)).unwrap().ino);
    a.commit().unwrap();
    b.commit().unwrap();
    let value = encode_dentry(file.ino, file.kind);
    // Whole steps before the cut, then a cut at a random write of each device.
    let whole = rng.gen_range(0..=4);
    let _ = steps(&mut a, &mut b, &db, value, 0, whole);
    da.freeze_after_writes(rng.gen_range(0..4));
    db.freeze_after_writes(rng.gen_range(0..4));
    // A machine whose power is gone does nothing more, and each step waits for
    // the one before (a message): the protocol stops at the first dead side.
    for step in whole..4 {
        if da.is_frozen() || db.is_frozen() {
            break;
        }
        let _ = steps(&mut a, &mut b, &db, value, step, step + 1);
    }
    drop((a, b));
    let mut a = Shard::open(da.crash(rng.gen()), 0, opts())
        .unwrap_or_else(|e| panic!("seed {seed}: coordinator recovery: {e}"));
    let db = db.crash(rng.gen());
    let mut b = Shard::open(db.handle(), 0, opts())
        .unwrap_or_else(|e| panic!("seed {seed}: participant recovery: {e}"));
    // The coordinator's recovery (`Worker::recover_intents`, `Renames::recover`): an intent reruns from step 2.
    let intent = a.txn(TXN).is_some();
    if intent {
        // Resumed: the participant finishes what it applied, abandons the rest.
        match b.xrename_target(TXN, ROOT, b"dst", value, false, false, true) {
            Ok(_) => {
                b.commit().unwrap();
                steps(&mut a, &mut b, &db, value, 2, 4)
                    .unwrap_or_else(|e| panic!("seed {seed}: rerun: {e}"));
            }
            Err(FsError::Invalid(_)) => {
                b.commit().unwrap();
                a.xrename_abandon(TXN, ShardId(1)).unwrap();
                a.commit().unwrap();
                deliver(&mut a, &mut b, &db).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            }
            Err(e) => panic!("seed {seed}: resume: {e}"),
        }
    } else {
        // Follow-ups left durable by the cut are sent again at the next start.
        deliver(&mut a, &mut b, &db).unwrap_or_else(|e| panic!("seed {seed}: follow-ups: {e}"));
    }
    assert!(a.follow_ups().is_empty(), "seed {seed}: a follow-up outlived its delivery");
    let src = a.lookup(ROOT, b"src").ok().map(|e| e.ino);
    let dst = b.lookup(ROOT, b"dst").ok().map(|e| e.ino);
    let renamed = dst == Some(file.ino);
    assert!(
        (src == Some(file.ino)) != renamed,
        "seed {seed}: after {whole} steps the file is named by src {src:?} and dst {dst:?}"
    );
    if renamed {
        if let Some(v) = victim {
            assert!(!b.has_inode(v), "seed {seed}: the replaced file outlived the rename");
        }
    } else {
        assert_eq!(dst, victim, "seed {seed}: the target changed without the rename");
    }
    assert_eq!(a.read(file.ino, 0, 5).unwrap(), b"moved", "seed {seed}");
    assert!(a.txn(TXN).is_none(), "seed {seed}: the intent outlived its recovery");
    // The forget is a follow-up logged with the coordinator's end: once that is
    // durable the participant's record goes, whatever crashes in between.
    assert!(
        b.txn(TXN | PARTICIPANT_BIT).is_none(),
        "seed {seed}: a participant record leaked (after {whole} steps, intent {intent}, renamed {renamed})"
    );
}

#[test]
fn a_cross_shard_rename_is_whole_after_any_power_loss() {
    if let Ok(s) = std::env::var("PFS_CRASH_SEED") {
        run_seed(s.parse().expect("PFS_CRASH_SEED is a number"));
        return;
    }
    let seeds: u64 =
        std::env::var("PFS_CRASH_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let base: u64 = rand::thread_rng().gen();
    println!("cross-shard crash: {seeds} seeds from {base} (PFS_CRASH_SEED=S replays one)");
    for i in 0..seeds {
        let seed = base.wrapping_add(i);
        if let Err(p) = std::panic::catch_unwind(|| run_seed(seed)) {
            eprintln!("failing seed: PFS_CRASH_SEED={seed}");
            std::panic::resume_unwind(p);
        }
    }
}
