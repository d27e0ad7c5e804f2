//! The scheduling choices of the RingSched server, in isolation (PeakFS III-B,
//! Fig. 20):
//!
//! - `sched`: shared-nothing (each thread owns a partition of a hash table; a
//!   request for another thread's key goes through an SPSC `rtrb` ring to the
//!   owner, which runs it to completion and answers through the reverse ring, as
//!   the server's workers do) against shared-everything (every thread works on
//!   one `Mutex<HashMap>`), put / get / delete, at 1 and 2 threads;
//! - `exchange`: task exchange between 2 workers through W x W SPSC rings against
//!   one bounded MPSC queue (crossbeam) per worker.
//!
//! `cargo bench --bench runtime`; `PFS_BENCH_OPS` sets operations per thread
//! (default 1,000,000).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn ops() -> u64 {
    std::env::var("PFS_BENCH_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Put,
    Get,
    Delete,
}

/// Keys of thread `t`: a fixed pseudo-random sequence (splitmix64), the same for
/// both designs.
fn key(t: usize, i: u64) -> u64 {
    let mut z = (t as u64) << 40 ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn apply(m: &mut HashMap<u64, u64>, op: Op, k: u64) -> u64 {
    match op {
        Op::Put => m.insert(k, k).unwrap_or(0),
        Op::Get => m.get(&k).copied().unwrap_or(0),
        Op::Delete => m.remove(&k).unwrap_or(0),
    }
}

/// Shared-everything: `threads` threads run `n` ops each of every phase on one
/// locked table; returns the time of phase `timed`.
fn shared(threads: usize, n: u64, timed: Op) -> Duration {
    let map = Arc::new(Mutex::new(HashMap::<u64, u64>::new()));
    let barrier = Arc::new(Barrier::new(threads));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (map, barrier) = (map.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut took = Duration::ZERO;
                for phase in [Op::Put, Op::Get, Op::Delete] {
                    barrier.wait();
                    let start = Instant::now();
                    let mut sum = 0u64;
                    for i in 0..n {
                        sum = sum.wrapping_add(apply(&mut map.lock().unwrap(), phase, key(t, i)));
                    }
                    std::hint::black_box(sum);
                    barrier.wait();
                    if phase == timed {
                        took = start.elapsed();
                    }
                }
                took
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
}

/// A request through a ring: op, key, and the requester's slot.
#[derive(Clone, Copy)]
enum Msg {
    Req(Op, u64),
    Reply(u64),
}

/// Requests one thread keeps in flight to the others (bounded, as credits).
const WINDOW: usize = 64;

/// Shared-nothing RingSched: thread `t` owns keys with `k % threads == t`.
fn shared_nothing(threads: usize, n: u64, timed: Op) -> Duration {
    let depth = 1024;
    // rings[from][to]: requests from -> to; replies go on rings[to][from].
    let mut prods: Vec<Vec<Option<rtrb::Producer<Msg>>>> =
        (0..threads).map(|_| (0..threads).map(|_| None).collect()).collect();
    let mut cons: Vec<Vec<Option<rtrb::Consumer<Msg>>>> =
        (0..threads).map(|_| (0..threads).map(|_| None).collect()).collect();
    for from in 0..threads {
        for to in 0..threads {
            if from != to {
                let (p, c) = rtrb::RingBuffer::new(depth);
                prods[from][to] = Some(p);
                cons[to][from] = Some(c);
            }
        }
    }
    let barrier = Arc::new(Barrier::new(threads));
    let finished: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let hs: Vec<_> = prods
        .into_iter()
        .zip(cons)
        .enumerate()
        .map(|(t, (mut out, mut inn))| {
            let (barrier, finished) = (barrier.clone(), finished.clone());
            std::thread::spawn(move || {
                let mut mine = HashMap::<u64, u64>::new();
                let mut took = Duration::ZERO;
                for (p, phase) in [Op::Put, Op::Get, Op::Delete].into_iter().enumerate() {
                    barrier.wait();
                    let start = Instant::now();
                    let (mut i, mut in_flight, mut sum) = (0u64, 0usize, 0u64);
                    let mut idle_rounds = 0u32;
                    // Run our ops (and serve the others' requests) until all of
                    // ours are answered.
                    while i < n || in_flight > 0 {
                        if i < n && in_flight < WINDOW {
                            let k = key(t, i);
                            let owner = (k % threads as u64) as usize;
                            if owner == t {
                                sum = sum.wrapping_add(apply(&mut mine, phase, k));
                                i += 1;
                            } else if out[owner].as_mut().unwrap().push(Msg::Req(phase, k)).is_ok()
                            {
                                in_flight += 1;
                                i += 1;
                            }
                        }
                        idle_rounds += 1;
                        for from in 0..threads {
                            let Some(c) = inn[from].as_mut() else { continue };
                            while let Ok(m) = c.pop() {
                                idle_rounds = 0;
                                match m {
                                    Msg::Req(op, k) => {
                                        let r = apply(&mut mine, op, k);
                                        // A full reply ring: serve our own input
                                        // first would deadlock; spin until room.
                                        let p = out[from].as_mut().unwrap();
                                        while p.push(Msg::Reply(r)).is_err() {
                                            std::hint::spin_loop();
                                        }
                                    }
                                    Msg::Reply(r) => {
                                        sum = sum.wrapping_add(r);
                                        in_flight -= 1;
                                    }
                                }
                            }
                        }
                        if idle_rounds > 1000 {
                            std::thread::yield_now();
                            idle_rounds = 0;
                        }
                    }
                    std::hint::black_box(sum);
                    let done = start.elapsed();
                    // Others may still send requests: serve until all finished.
                    drain_until(&barrier, &finished[p], threads, &mut inn, &mut out, &mut mine);
                    if phase == timed {
                        took = done;
                    }
                }
                took
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).max().unwrap()
}

/// Serves requests until every thread finished its own ops of the phase
/// (`finished` counts them), then meets the others at the barrier.
fn drain_until(
    barrier: &Barrier,
    finished: &AtomicUsize,
    threads: usize,
    inn: &mut [Option<rtrb::Consumer<Msg>>],
    out: &mut [Option<rtrb::Producer<Msg>>],
    mine: &mut HashMap<u64, u64>,
) {
    finished.fetch_add(1, Ordering::AcqRel);
    while finished.load(Ordering::Acquire) < threads {
        for from in 0..inn.len() {
            let Some(c) = inn[from].as_mut() else { continue };
            while let Ok(m) = c.pop() {
                if let Msg::Req(op, k) = m {
                    let r = apply(mine, op, k);
                    let p = out[from].as_mut().unwrap();
                    while p.push(Msg::Reply(r)).is_err() {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        std::hint::spin_loop();
    }
    barrier.wait();
}

fn bench_sched(c: &mut Criterion) {
    let n = ops();
    let mut g = c.benchmark_group("runtime/sched");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(n * threads as u64));
        for op in [Op::Put, Op::Get, Op::Delete] {
            let name = format!("{op:?}").to_lowercase();
            g.bench_function(format!("shared_nothing/{threads}t/{name}"), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| shared_nothing(threads, n, op)).sum())
            });
            g.bench_function(format!("shared_everything/{threads}t/{name}"), |b| {
                b.iter_custom(|iters| (0..iters).map(|_| shared(threads, n, op)).sum())
            });
        }
    }
    g.finish();
}

/// Two workers each send `n` tasks to the other and take the other's `n`.
fn exchange_spsc(n: u64) -> Duration {
    let (mut p01, mut c01) = rtrb::RingBuffer::<u64>::new(1024);
    let (mut p10, mut c10) = rtrb::RingBuffer::<u64>::new(1024);
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let h = std::thread::spawn(move || {
        b2.wait();
        let (mut sent, mut got, mut sum) = (0u64, 0u64, 0u64);
        while sent < n || got < n {
            if sent < n && p10.push(sent).is_ok() {
                sent += 1;
            }
            while let Ok(v) = c01.pop() {
                sum = sum.wrapping_add(v);
                got += 1;
            }
        }
        sum
    });
    barrier.wait();
    let t = Instant::now();
    let (mut sent, mut got, mut sum) = (0u64, 0u64, 0u64);
    while sent < n || got < n {
        if sent < n && p01.push(sent).is_ok() {
            sent += 1;
        }
        while let Ok(v) = c10.pop() {
            sum = sum.wrapping_add(v);
            got += 1;
        }
    }
    std::hint::black_box(h.join().unwrap().wrapping_add(sum));
    t.elapsed()
}

fn exchange_mpsc(n: u64) -> Duration {
    let (tx0, rx0) = crossbeam_channel::bounded::<u64>(1024);
    let (tx1, rx1) = crossbeam_channel::bounded::<u64>(1024);
    let barrier = Arc::new(Barrier::new(2));
    let b2 = barrier.clone();
    let h = std::thread::spawn(move || {
        b2.wait();
        let (mut sent, mut got, mut sum) = (0u64, 0u64, 0u64);
        while sent < n || got < n {
            if sent < n && tx0.try_send(sent).is_ok() {
                sent += 1;
            }
            while let Ok(v) = rx1.try_recv() {
                sum = sum.wrapping_add(v);
                got += 1;
            }
        }
        sum
    });
    barrier.wait();
    let t = Instant::now();
    let (mut sent, mut got, mut sum) = (0u64, 0u64, 0u64);
    while sent < n || got < n {
        if sent < n && tx1.try_send(sent).is_ok() {
            sent += 1;
        }
        while let Ok(v) = rx0.try_recv() {
            sum = sum.wrapping_add(v);
            got += 1;
        }
    }
    std::hint::black_box(h.join().unwrap().wrapping_add(sum));
    t.elapsed()
}

fn bench_exchange(c: &mut Criterion) {
    let n = ops();
    let mut g = c.benchmark_group("runtime/exchange");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(2 * n));
    g.bench_function("spsc_rings", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| exchange_spsc(n)).sum())
    });
    g.bench_function("mpsc_queue", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| exchange_mpsc(n)).sum())
    });
    g.finish();
}

criterion_group!(benches, bench_sched, bench_exchange);
criterion_main!(benches);
