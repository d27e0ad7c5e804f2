//! cART against other dentry indexes on the PeakFS key workload: names with a
//! 12-byte fixed prefix and two growing serial numbers separated by dots
//! (`file.mdtest.<a>.<b>`), keyed by (parent inode, name).
//!
//! Workloads: all keys in one directory (`onedir`), and spread over 1000
//! directories (`dirs1000`). Indexes: `Cart`, `HashMap<(u64, String), u64>`,
//! `BTreeMap<(u64, String), u64>`, and the published ART crate `art-tree`
//! (`Art<ByteString, u64>`, keys built as parent ++ name).
//!
//! `cargo bench --bench cart`; `PFS_BENCH_KEYS` sets the key count (default
//! 1,000,000; the figure is 5,000,000). Before timing, the bench prints
//! bytes per key of each index, counted by a global allocator that tracks live
//! heap bytes; `PFS_BENCH_MEMORY_ONLY=1` prints only those.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use art_tree::{Art, ByteString, KeyBuilder};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pfs_core::InodeId;
use pfs_store::cart::Cart;

/// Counts live heap bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only adds counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

fn keys_n() -> usize {
    std::env::var("PFS_BENCH_KEYS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

/// (parent, name) pairs `file.mdtest.<a>.<b>`. One directory: `a` a rank-like
/// serial (a new one every 100,000 files) and `b` the file serial. Over `dirs`
/// directories, as mdtest with a directory per task: directory `d` holds
/// `file.mdtest.<d>.<j>` for its own growing `j`. `PFS_BENCH_ROUND_ROBIN=1`
/// instead deals consecutive serials to directories in turn (every name in a
/// directory then ends in the same digits: the cART's worst case).
fn workload(n: usize, dirs: u64) -> Vec<(u64, String)> {
    let round_robin = std::env::var_os("PFS_BENCH_ROUND_ROBIN").is_some();
    let per_dir = (n as u64).div_ceil(dirs);
    (0..n as u64)
        .map(|i| {
            if dirs == 1 {
                (2, format!("file.mdtest.{}.{}", i / 100_000, i))
            } else if round_robin {
                (2 + i % dirs, format!("file.mdtest.{}.{}", i / 100_000, i))
            } else {
                let d = i / per_dir;
                (2 + d, format!("file.mdtest.{d}.{}", i % per_dir))
            }
        })
        .collect()
}

fn art_key(parent: u64, name: &str) -> ByteString {
    KeyBuilder::new().append(parent).append(ByteString::new(name.as_bytes())).build()
}

/// The operations every index is timed on.
trait Index {
    fn new() -> Self;
    fn put(&mut self, parent: u64, name: &str, v: u64);
    fn get(&self, key: &(u64, String)) -> Option<u64>;
    fn del(&mut self, key: &(u64, String)) -> Option<u64>;
}

impl Index for Cart {
    fn new() -> Self {
        Cart::new()
    }
    fn put(&mut self, parent: u64, name: &str, v: u64) {
        self.insert(InodeId(parent), name.as_bytes(), v);
    }
    fn get(&self, key: &(u64, String)) -> Option<u64> {
        Cart::get(self, InodeId(key.0), key.1.as_bytes())
    }
    fn del(&mut self, key: &(u64, String)) -> Option<u64> {
        self.remove(InodeId(key.0), key.1.as_bytes())
    }
}

impl Index for HashMap<(u64, String), u64> {
    fn new() -> Self {
        HashMap::new()
    }
    fn put(&mut self, parent: u64, name: &str, v: u64) {
        self.insert((parent, name.to_owned()), v);
    }
    fn get(&self, key: &(u64, String)) -> Option<u64> {
        HashMap::get(self, key).copied()
    }
    fn del(&mut self, key: &(u64, String)) -> Option<u64> {
        self.remove(key)
    }
}

impl Index for BTreeMap<(u64, String), u64> {
    fn new() -> Self {
        BTreeMap::new()
    }
    fn put(&mut self, parent: u64, name: &str, v: u64) {
        self.insert((parent, name.to_owned()), v);
    }
    fn get(&self, key: &(u64, String)) -> Option<u64> {
        BTreeMap::get(self, key).copied()
    }
    fn del(&mut self, key: &(u64, String)) -> Option<u64> {
        self.remove(key)
    }
}

impl Index for Art<ByteString, u64> {
    fn new() -> Self {
        Art::new()
    }
    fn put(&mut self, parent: u64, name: &str, v: u64) {
        self.upsert(art_key(parent, name), v);
    }
    // The crate takes keys as its own byte strings: each call builds one.
    fn get(&self, key: &(u64, String)) -> Option<u64> {
        Art::get(self, &art_key(key.0, &key.1)).copied()
    }
    fn del(&mut self, key: &(u64, String)) -> Option<u64> {
        self.remove(&art_key(key.0, &key.1))
    }
}

fn build<I: Index>(keys: &[(u64, String)]) -> I {
    let mut idx = I::new();
    for (i, (p, n)) in keys.iter().enumerate() {
        idx.put(*p, n, i as u64);
    }
    idx
}

/// Live heap bytes per key of a built index (the keys' own Vec not counted).
fn bytes_per_key<I: Index>(keys: &[(u64, String)]) -> f64 {
    let before = live();
    let idx: I = build(keys);
    let after = live();
    // Check it really holds them, so the measure is of a working index.
    for (i, k) in keys.iter().enumerate().step_by(997) {
        assert_eq!(idx.get(k), Some(i as u64));
    }
    drop(idx);
    (after - before) as f64 / keys.len() as f64
}

fn bench_index<I: Index>(c: &mut Criterion, group: &str, name: &str, keys: &[(u64, String)]) {
    let mut g = c.benchmark_group(format!("cart/{group}"));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function(format!("{name}/put"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let idx: I = build(keys);
                total += t.elapsed();
                drop(idx);
            }
            total
        })
    });
    let idx: I = build(keys);
    g.bench_function(format!("{name}/get"), |b| {
        b.iter(|| {
            for k in keys {
                std::hint::black_box(idx.get(k));
            }
        })
    });
    drop(idx);
    g.bench_function(format!("{name}/delete"), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut idx: I = build(keys);
                let t = Instant::now();
                for k in keys {
                    std::hint::black_box(idx.del(k));
                }
                total += t.elapsed();
            }
            total
        })
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    let n = keys_n();
    for (group, dirs) in [("onedir", 1u64), ("dirs1000", 1000)] {
        let keys = workload(n, dirs);
        let hm = bytes_per_key::<HashMap<(u64, String), u64>>(&keys);
        println!("bytes/key {group} n={n}:");
        for (name, b) in [
            ("cart", bytes_per_key::<Cart>(&keys)),
            ("hashmap", hm),
            ("btreemap", bytes_per_key::<BTreeMap<(u64, String), u64>>(&keys)),
            ("art-tree", bytes_per_key::<Art<ByteString, u64>>(&keys)),
        ] {
            println!("  {name:9} {b:7.1} bytes/key ({:.2} of HashMap)", b / hm);
        }
        if std::env::var_os("PFS_BENCH_MEMORY_ONLY").is_some() {
            continue;
        }
        bench_index::<Cart>(c, group, "cart", &keys);
        bench_index::<HashMap<(u64, String), u64>>(c, group, "hashmap", &keys);
        bench_index::<BTreeMap<(u64, String), u64>>(c, group, "btreemap", &keys);
        bench_index::<Art<ByteString, u64>>(c, group, "art-tree", &keys);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
