//! Shard operations in memory (Icache hits): create, stat (lookup + getattr) and
//! unlink of empty files in one directory, on one core, over `MemDevice`; and
//! `readdir_plus`, a statahead's listing of that directory by 512 names with
//! their attributes as the worker answers it (`exec::execute`, the reply
//! encoded) and the client reads it (the frame decoded).
//!
//! `cargo bench --bench shard`. `PFS_BENCH_FILES` sets files per run (default 200000).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pfs_core::wire::{Body, Frame, Reply, Request};
use pfs_core::{ClientId, InodeId, RequestId, ShardId};
use pfs_store::device::MemDevice;
use pfs_store::{CreateArgs, FormatOptions, Shard, ShardOptions};

fn files() -> u64 {
    std::env::var("PFS_BENCH_FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(200_000)
}

fn names(n: u64) -> Vec<Vec<u8>> {
    // mdtest-style names: a fixed prefix and a growing serial number.
    (0..n).map(|i| format!("file.mdtest.0.{i}").into_bytes()).collect()
}

/// A shard in steady state: its memory device was written over once (a cold
/// `MemDevice` would charge first-touch page faults to the operations).
fn shard(n: u64) -> Shard<MemDevice> {
    let zone = n * 2048 + (128 << 20);
    let mut fo = FormatOptions::new(ShardId(0), zone);
    fo.inode_slots = Some(n + 1024);
    let opts =
        ShardOptions { icache_blocks: (n as usize / 16 + 64).max(1024), ..Default::default() };
    let mut s = Shard::format(MemDevice::new(zone, 256), &fo, opts).expect("format");
    let names = names(n);
    for name in &names {
        s.create(InodeId::ROOT, name, CreateArgs::file(0o644)).expect("warm-up create");
    }
    for name in &names {
        s.unlink(InodeId::ROOT, name).expect("warm-up unlink");
    }
    s.checkpoint().expect("checkpoint");
    s
}

fn bench(c: &mut Criterion) {
    let n = files();
    let names = names(n);
    let mut g = c.benchmark_group("shard");
    g.sample_size(10).measurement_time(Duration::from_secs(10)).throughput(Throughput::Elements(n));
    g.bench_function("create", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut s = shard(n);
                let t = Instant::now();
                for name in &names {
                    s.create(InodeId::ROOT, name, CreateArgs::file(0o644)).expect("create");
                }
                total += t.elapsed();
            }
            total
        })
    });
    let mut s = shard(n);
    for name in &names {
        s.create(InodeId::ROOT, name, CreateArgs::file(0o644)).expect("create");
    }
    s.commit().expect("commit");
    g.bench_function("stat", |b| {
        b.iter(|| {
            for name in &names {
                let e = s.lookup(InodeId::ROOT, name).expect("lookup");
                std::hint::black_box(s.getattr(e.ino).expect("getattr"));
            }
        })
    });
    g.bench_function("readdir_plus", |b| {
        let mut buf = Vec::with_capacity(1 << 20);
        b.iter(|| {
            let mut after = Vec::new();
            let mut listed = 0u64;
            loop {
                let req = Request::ReadDir {
                    ino: InodeId::ROOT,
                    after: std::mem::take(&mut after),
                    max_entries: 512,
                    max_bytes: 1 << 20,
                    plus: true,
                    layout: pfs_core::DirLayout::BigDir,
                };
                let reply = pfs_server::exec::execute(&mut s, req).0.expect("readdir");
                let frame = Frame {
                    request_id: RequestId(1),
                    client: ClientId(1),
                    body: Body::Reply(reply),
                };
                buf.clear();
                frame.encode(&mut buf).expect("encode");
                let Body::Reply(Reply::ReadDir { entries, eof }) =
                    Frame::decode(&buf).expect("decode").body
                else {
                    panic!("not a listing");
                };
                listed += entries.len() as u64;
                if eof {
                    break;
                }
                after = entries.last().expect("a full batch").name.clone();
            }
            assert_eq!(listed, n, "the whole directory listed");
        })
    });
    g.bench_function("unlink", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut s = shard(n);
                for name in &names {
                    s.create(InodeId::ROOT, name, CreateArgs::file(0o644)).expect("create");
                }
                let t = Instant::now();
                for name in &names {
                    s.unlink(InodeId::ROOT, name).expect("unlink");
                }
                total += t.elapsed();
            }
            total
        })
    });
    // Baseline in the same run: a bare HashMap doing the same inserts, lookups and
    // removes of name -> 112-byte inode, with no log, no cache, no durability.
    type Baseline = std::collections::HashMap<(u64, Vec<u8>), [u8; 112]>;
    g.bench_function("baseline_hashmap_insert", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut m = Baseline::with_capacity(n as usize);
                let t = Instant::now();
                for (i, name) in names.iter().enumerate() {
                    m.insert((1, name.clone()), [i as u8; 112]);
                }
                total += t.elapsed();
                std::hint::black_box(&m);
            }
            total
        })
    });
    let mut m = Baseline::with_capacity(n as usize);
    for (i, name) in names.iter().enumerate() {
        m.insert((1, name.clone()), [i as u8; 112]);
    }
    g.bench_function("baseline_hashmap_get", |b| {
        b.iter(|| {
            for name in &names {
                std::hint::black_box(m.get(&(1, name.clone())));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
