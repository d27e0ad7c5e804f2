//! Statahead's table (`pfs_client::ahead`) on mdtest's stat and remove
//! pattern, in one process over the in-memory file system (`pfs_fuse::MemFs`):
//! a directory of N files `f0..f{N-1}` stat'ed in that order (its listing runs
//! `f0, f1, f10, f100...`), each lookup answered from the table or, missed,
//! looked up and followed by the batch it calls for; then every name forgotten
//! in the same order (mdtest's remove phase); and N creates' replies kept
//! (`remember`, mdtest's create phase). No server and no network: what
//! is timed is the table's own work (hashing, probes, allocation, the batches'
//! entries) and MemFs's listing of the batches.
//!
//! `cargo bench --bench statahead`; `PFS_BENCH_FILES` sets N (default 20,000,
//! one bench process's share in `pfs bench md-easy --files 20000`).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pfs_client::ahead::StatAhead;
use pfs_client::FileSystem;
use pfs_core::InodeId;
use pfs_fuse::MemFs;

fn files_n() -> u64 {
    std::env::var("PFS_BENCH_FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000)
}

/// A MemFs with directory `d` holding `f0..f{n-1}`, and the names.
fn setup(n: u64) -> (MemFs, InodeId, Vec<Vec<u8>>) {
    let fs = MemFs::new();
    let dir = fs.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).expect("mkdir").ino;
    let names: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i}").into_bytes()).collect();
    for name in &names {
        fs.create(dir, name, 0o644, 0, 0, libc::O_WRONLY as u32).expect("create");
    }
    (fs, dir, names)
}

/// The library's table (per inode), with a lifetime longer than any run.
fn table() -> StatAhead {
    StatAhead::new(Duration::from_secs(3600), true).per_inode()
}

/// Every name stat'ed once, as `lookup_for_stat` does; the lookups missed.
fn sweep(fs: &MemFs, dir: InodeId, names: &[Vec<u8>], s: &StatAhead) -> u64 {
    let mut missed = 0;
    for name in names {
        if s.get(dir.0, name, 0).is_none() {
            missed += 1;
            fs.lookup(dir, name).expect("listed");
            s.after_miss(fs, dir.0, Some(name), &|| 0);
        }
    }
    missed
}

fn bench(c: &mut Criterion) {
    let n = files_n();
    let (fs, dir, names) = setup(n);
    let s = table();
    let missed = sweep(&fs, dir, &names, &s);
    let (batches, kept, answered) = s.counts();
    println!(
        "statahead: {n} names, {missed} lookups missed, {batches} batches kept {kept} entries, {answered} answered"
    );
    assert!(missed < n / 10, "{missed} of {n} missed");

    let mut g = c.benchmark_group("statahead");
    g.throughput(Throughput::Elements(n));
    g.sample_size(20);
    g.bench_function("stat sweep", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let s = table();
                let t = Instant::now();
                sweep(&fs, dir, &names, &s);
                total += t.elapsed();
            }
            total
        })
    });
    // mdtest's create phase through libpfs_preload: each create's reply kept.
    let attrs: Vec<_> = names.iter().map(|n| fs.lookup(dir, n).expect("created")).collect();
    g.bench_function("remember creates", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let s = table();
                let t = Instant::now();
                for (name, a) in names.iter().zip(&attrs) {
                    s.remember(dir.0, name, *a, 0);
                }
                total += t.elapsed();
            }
            total
        })
    });
    g.bench_function("forget after a sweep", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let s = table();
                sweep(&fs, dir, &names, &s);
                let t = Instant::now();
                for name in &names {
                    s.forget_name(dir.0, name);
                }
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
