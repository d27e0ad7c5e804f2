//! How long checkpoints stop a shard from serving: creates of empty files in
//! one directory on a shard over a real file (`UringDevice`, io_uring,
//! `O_DIRECT`) with a small log, so checkpoints come every few thousand
//! creates while the tables grow, the way a worker drives it (a group commit
//! started every `COMMIT_EVERY` creates and polled between them).
//!
//! Two modes in the same run, each on a fresh file:
//! - **waited**: each checkpoint is waited for by the operation that started
//!   it, as every checkpoint was before they ran beside the requests;
//! - **beside**: checkpoints run beside the creates; the snapshot (the log
//!   moved on, the inode table copied) and each slice of the tables' encoding
//!   stop them.
//!
//! Reported per mode: creates/s, the longest create, the 99.9th percentile,
//! the total time of creates over 1 ms, checkpoints taken, and the shard's own
//! figures (longest checkpoint, longest snapshot, longest slice of the
//! tables' encoding).
//!
//! `cargo bench --bench checkpoint`; `PFS_BENCH_FILES` sets the creates
//! (default 200000), `PFS_BENCH_WAL_MIB` the log (default 16 MiB: halves of
//! 8), `PFS_BENCH_DIRS` spreads the files over that many directories, made
//! before the timed creates (default 1). The device files go under
//! `target/bench-checkpoint` and are removed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pfs_core::{InodeId, ShardId};
use pfs_store::device::{UringDevice, UringOptions};
use pfs_store::{CreateArgs, FormatOptions, Shard, ShardOptions};

const COMMIT_EVERY: u64 = 256;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

struct Outcome {
    rate: f64,
    max: Duration,
    p999: Duration,
    over_1ms: Duration,
    checkpoints: u64,
    max_checkpoint_us: u64,
    max_snapshot_us: u64,
    max_encode_slice_us: u64,
    log_full_waits: u64,
}

/// What a worker does after the `i`-th create: a group commit every
/// `COMMIT_EVERY`, the commit and checkpoint polled; `waited` waits for a
/// checkpoint the create started.
fn after_create(s: &mut Shard<UringDevice>, i: u64, waited: bool) {
    if waited && s.checkpointing() {
        s.finish_checkpoint().unwrap();
    }
    if i % COMMIT_EVERY == 0 {
        s.start_commit().unwrap();
    }
    s.poll_commit();
    s.poll_checkpoint();
}

fn run(dir: &std::path::Path, files: u64, dirs: u64, wal_mib: u64, waited: bool) -> Outcome {
    let zone = 4u64 << 30;
    let path = dir.join(if waited { "waited.img" } else { "beside.img" });
    let _ = std::fs::remove_file(&path);
    let dev = UringDevice::open(
        &path,
        UringOptions {
            queue_depth: 64,
            registered_buffers: 4,
            registered_buffer_size: 1 << 20,
            spare_buffers: 16,
            size_bytes: Some(zone),
            preallocate: false,
            submit_below: pfs_store::device::SUBMIT_BELOW,
        },
    )
    .expect("device file");
    let mut fo = FormatOptions::new(ShardId(0), zone);
    fo.inode_slots = Some((files + dirs + 4096).next_power_of_two());
    fo.wal_bytes = Some(wal_mib << 20);
    let mut s = Shard::format(dev, &fo, ShardOptions::default()).expect("format");
    let top = s.create(InodeId::ROOT, b"mdtest", CreateArgs::dir(0o755)).unwrap().ino;
    let mut parents = vec![top];
    if dirs > 1 {
        parents.clear();
        for d in 0..dirs {
            let name = format!("dir.mdtest.{d}");
            parents.push(s.create(top, name.as_bytes(), CreateArgs::dir(0o755)).unwrap().ino);
            after_create(&mut s, d, waited);
        }
    }
    s.commit().unwrap();
    let base = s.stats().checkpoints;
    let mut lat = Vec::with_capacity(files as usize);
    let t = Instant::now();
    for i in 0..files {
        let name = format!("file.mdtest.0.{i}");
        let op = Instant::now();
        let parent = parents[(i % parents.len() as u64) as usize];
        s.create(parent, name.as_bytes(), CreateArgs::file(0o644)).unwrap();
        after_create(&mut s, i, waited);
        lat.push(op.elapsed());
    }
    s.commit().unwrap();
    let elapsed = t.elapsed();
    let st = s.stats();
    drop(s);
    let _ = std::fs::remove_file(&path);
    lat.sort_unstable();
    Outcome {
        rate: files as f64 / elapsed.as_secs_f64(),
        max: *lat.last().unwrap(),
        p999: lat[lat.len() * 999 / 1000],
        over_1ms: lat.iter().filter(|d| **d > Duration::from_millis(1)).sum(),
        checkpoints: st.checkpoints - base,
        max_checkpoint_us: st.max_checkpoint_us,
        max_snapshot_us: st.max_snapshot_us,
        max_encode_slice_us: st.max_encode_slice_us,
        log_full_waits: st.log_full_waits,
    }
}

fn main() {
    let files = env_u64("PFS_BENCH_FILES", 200_000);
    let wal_mib = env_u64("PFS_BENCH_WAL_MIB", 16);
    let dirs = env_u64("PFS_BENCH_DIRS", 1).max(1);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-checkpoint");
    std::fs::create_dir_all(&dir).unwrap();
    println!("{files} creates in {dirs} directories, one shard on a file, WAL {wal_mib} MiB");
    println!(
        "| checkpoints | creates/s | longest create | p99.9 | time in creates over 1 ms | \
         checkpoints | longest checkpoint | longest snapshot | longest encoding slice | \
         log-full waits |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for waited in [true, false] {
        let o = run(&dir, files, dirs, wal_mib, waited);
        println!(
            "| {} | {:.0} | {:.2} ms | {:.1} us | {:.1} ms | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
            if waited { "waited" } else { "beside" },
            o.rate,
            o.max.as_secs_f64() * 1e3,
            o.p999.as_secs_f64() * 1e6,
            o.over_1ms.as_secs_f64() * 1e3,
            o.checkpoints,
            o.max_checkpoint_us as f64 / 1e3,
            o.max_snapshot_us as f64 / 1e3,
            o.max_encode_slice_us as f64 / 1e3,
            o.log_full_waits
        );
        rows.push(o);
    }
    let (w, b) = (&rows[0], &rows[1]);
    println!(
        "beside / waited: creates/s {:.2}, longest create {:.2}, time in creates over 1 ms {:.2}",
        b.rate / w.rate,
        b.max.as_secs_f64() / w.max.as_secs_f64(),
        b.over_1ms.as_secs_f64() / w.over_1ms.as_secs_f64().max(1e-9)
    );
    let _ = std::fs::remove_dir(&dir);
}
