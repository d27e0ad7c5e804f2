//! Native client create / stat / remove of empty files against one server (2
//! workers, a device file under `target/bench-native`), with 1 and 2 client
//! processes, over tcp and shm; and, in the same run, the shard's in-process rate
//! for the same operations: on `MemDevice` without commits (the index and Icache
//! alone: the ratio to it is the cost of network, scheduling and group commit), and
//! on a `UringDevice` file committing after every operation (for scale: the server
//! answers metadata changes before their group commit, at most 50 ms later).
//!
//! `cargo bench --bench native`; `PFS_BENCH_FILES` sets files per client process
//! (default 5000). Client processes are this binary run again with
//! `PFS_NATIVE_CLIENT` set; each works in its own directory and prints its phase
//! times; a phase's rate is all files over the slowest process's time.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use pfs_client::{Cluster, ClusterOptions, FileSystem};
use pfs_core::{InodeId, MasterConfig, ServerConfig, ShardId};
use pfs_store::device::{MemDevice, UringDevice, UringOptions};
use pfs_store::{CreateArgs, FormatOptions, Shard, ShardOptions};

fn files() -> u64 {
    std::env::var("PFS_BENCH_FILES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000)
}

fn work_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-native")
}

/// Runs in a client process: `rank,master,keyfile,transport,run`.
fn client(spec: &str) {
    let f: Vec<&str> = spec.split(',').collect();
    let (rank, master, key, transport, run) = (f[0], f[1], f[2], f[3], f[4]);
    let key = pfs_net::ClusterKey::load(std::path::Path::new(key)).unwrap();
    let mut o = ClusterOptions::new(master.parse().unwrap(), key);
    o.transport = match transport {
        "tcp" => pfs_net::TransportKind::Tcp,
        _ => pfs_net::TransportKind::Shm,
    };
    let c = Cluster::connect(o).unwrap();
    let dir = c.mkdir(InodeId::ROOT, format!("client-{run}-{rank}").as_bytes(), 0o755, 0, 0);
    let dir = dir.unwrap().ino;
    let names: Vec<Vec<u8>> =
        (0..files()).map(|i| format!("file.mdtest.{rank}.{i}").into_bytes()).collect();
    let t = Instant::now();
    for n in &names {
        let (a, fh) = c.create(dir, n, 0o644, 0, 0, libc::O_CREAT as u32).unwrap();
        c.release(a.ino, fh).unwrap();
    }
    let create = t.elapsed();
    let t = Instant::now();
    for n in &names {
        std::hint::black_box(c.lookup(dir, n).unwrap());
    }
    let stat = t.elapsed();
    let t = Instant::now();
    for n in &names {
        c.unlink(dir, n).unwrap();
    }
    let remove = t.elapsed();
    println!("{} {} {}", create.as_secs_f64(), stat.as_secs_f64(), remove.as_secs_f64());
}

/// Rates (create, stat, remove) of `procs` client processes.
fn run_clients(procs: usize, master: &str, key: &str, transport: &str) -> [f64; 3] {
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..procs)
        .map(|r| {
            Command::new(&exe)
                .env(
                    "PFS_NATIVE_CLIENT",
                    format!("{r},{master},{key},{transport},{transport}{procs}"),
                )
                .env("PFS_BENCH_FILES", files().to_string())
                .output_spawn()
        })
        .collect();
    let mut worst = [0f64; 3];
    for ch in children {
        let out = ch.wait_with_output().unwrap();
        assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
        let line = String::from_utf8_lossy(&out.stdout);
        let t: Vec<f64> =
            line.lines().last().unwrap().split_whitespace().map(|x| x.parse().unwrap()).collect();
        for i in 0..3 {
            worst[i] = worst[i].max(t[i]);
        }
    }
    let total = (files() * procs as u64) as f64;
    [total / worst[0], total / worst[1], total / worst[2]]
}

trait SpawnPiped {
    fn output_spawn(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    fn output_spawn(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// The shard in this process: create, lookup, unlink of `n` files.
fn in_process<D: pfs_store::device::Device>(mut s: Shard<D>, commit_each: bool) -> [f64; 3] {
    let n = files();
    let names: Vec<Vec<u8>> = (0..n).map(|i| format!("file.mdtest.0.{i}").into_bytes()).collect();
    let mut rates = [0f64; 3];
    let t = Instant::now();
    for name in &names {
        s.create(InodeId::ROOT, name, CreateArgs::file(0o644)).unwrap();
        if commit_each {
            s.commit().unwrap();
        }
    }
    rates[0] = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for name in &names {
        let e = s.lookup(InodeId::ROOT, name).unwrap();
        std::hint::black_box(s.getattr(e.ino).unwrap());
    }
    rates[1] = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for name in &names {
        s.unlink(InodeId::ROOT, name).unwrap();
        if commit_each {
            s.commit().unwrap();
        }
    }
    rates[2] = n as f64 / t.elapsed().as_secs_f64();
    rates
}

fn main() {
    if let Ok(spec) = std::env::var("PFS_NATIVE_CLIENT") {
        return client(&spec);
    }
    // `cargo bench` passes `--bench`; nothing else to parse.
    let dir = work_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let zone = 512u64 << 20;
    let fo = FormatOptions::new(ShardId(0), zone);
    let uring = UringDevice::open(
        dir.join("shard.img"),
        UringOptions {
            queue_depth: 64,
            registered_buffers: 4,
            registered_buffer_size: 1 << 20,
            spare_buffers: 16,
            size_bytes: Some(zone),
            preallocate: true,
            submit_below: pfs_store::device::SUBMIT_BELOW,
        },
    )
    .unwrap();
    let durable = in_process(Shard::format(uring, &fo, ShardOptions::default()).unwrap(), true);
    let memory = in_process(
        Shard::format(MemDevice::new(zone, 256), &fo, ShardOptions::default()).unwrap(),
        false,
    );

    let key = dir.join("cluster.key");
    pfs_net::ClusterKey::generate(&key).unwrap();
    let master = pfs_server::start_master(&MasterConfig {
        listen: "127.0.0.1:0".into(),
        key_file: key.clone(),
        servers: 1,
        state_path: dir.join("master.state"),
        ..MasterConfig::default()
    })
    .unwrap();
    let server = pfs_server::start(
        &ServerConfig {
            listen: "127.0.0.1:0".into(),
            data_path: dir.join("server.img"),
            device_size_bytes: 2 << 30,
            workers: 2,
            wal_size_bytes: 64 << 20,
            key_file: key.clone(),
            master: master.addr().to_string(),
            ..ServerConfig::default()
        },
        Duration::from_secs(20),
    )
    .unwrap();
    let (m, k) = (master.addr().to_string(), key.to_str().unwrap().to_string());

    println!("native client vs in-process shard, {} files per client process", files());
    println!("| config | create/s | stat/s | remove/s |");
    println!("|---|---|---|---|");
    let row = |name: &str, r: [f64; 3]| {
        println!("| {name} | {:.0} | {:.0} | {:.0} |", r[0], r[1], r[2]);
    };
    row("in-process shard, UringDevice, commit per op", durable);
    row("in-process shard, MemDevice, no commit", memory);
    for transport in ["tcp", "shm"] {
        for procs in [1, 2] {
            let r = run_clients(procs, &m, &k, transport);
            row(&format!("native client, {transport}, {procs} proc"), r);
            println!(
                "|   ratio to the in-process shard (MemDevice) | {:.3} | {:.3} | {:.3} |",
                r[0] / memory[0],
                r[1] / memory[1],
                r[2] / memory[2]
            );
        }
    }
    server.stop().unwrap();
    master.stop();
}
