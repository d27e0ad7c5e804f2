//! `pfs up`: a master, N servers and a FUSE mount in one process.
//!
//! Everything lives under one data directory:
//!
//! | file | what |
//! |---|---|
//! | `cluster.key` | the cluster key (made on the first run, mode 0600) |
//! | `up.toml` | the shape the data was made with (servers, workers, size) |
//! | `master.state` | the master's view |
//! | `server-N.img` | server N's device file (sparse), one zone per worker |
//! | `server-N.img.clean-stop` | left by a clean stop, taken by the next start: server N keeps its boot id (docs/format.md) |
//!
//! Running it again with the same data directory remounts the same file system.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pfs_client::{Cluster, ClusterOptions, FileSystem};
use pfs_core::{MasterConfig, ServerConfig};
use pfs_server::{MasterHandle, ServerHandle};
use serde::{Deserialize, Serialize};

/// What `pfs up` starts.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Data directory.
    pub data: PathBuf,
    /// Storage servers.
    pub servers: u32,
    /// Workers (shards) per server; `None`: what the data directory was made
    /// with, or [`default_workers`] for a new one.
    pub workers: Option<u32>,
    /// The workers' longest adaptive spin; `None`: the server default.
    pub idle_spin_us: Option<u64>,
    /// Whether the mount's threads run a parked worker's rounds themselves
    /// (the server's `inline_rounds`; on unless `--no-inline-rounds`).
    pub inline_rounds: bool,
    /// Size of each server's device file.
    pub size_bytes: u64,
    /// Where the master listens, `host:port`.
    pub master_listen: String,
}

/// The shape recorded in `up.toml`: data made with one shape cannot be served
/// with another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Shape {
    servers: u32,
    workers: u32,
    size_bytes: u64,
}

/// Workers per server of a new `pfs up` data directory without `--workers`:
/// half the cores, at least 1 and at most 8. On one host the FUSE threads, the
/// client and the applications run on the same cores as the workers, and on 2
/// cores one worker serves metadata faster than two (docs/benchmarks.md).
pub fn default_workers() -> u32 {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 2).clamp(1, 8) as u32
}

/// A running master and its servers.
#[derive(Debug)]
pub struct LocalCluster {
    master: Option<MasterHandle>,
    servers: Vec<ServerHandle>,
    /// Workers per server.
    pub workers: u32,
    /// The cluster key file.
    pub key_file: PathBuf,
}

impl LocalCluster {
    /// The master's address.
    pub fn master_addr(&self) -> std::net::SocketAddr {
        self.master.as_ref().expect("master running").addr()
    }

    /// A native client of this cluster.
    pub fn client(&self) -> Result<Cluster, String> {
        let key = pfs_net::ClusterKey::load(&self.key_file).map_err(|e| e.to_string())?;
        Cluster::connect(ClusterOptions::new(self.master_addr(), key))
            .map_err(|e| format!("cannot connect to the local cluster: {e}"))
    }

    /// Fail-stop handles of the servers, in order.
    pub fn fail_stops(&self) -> Vec<pfs_server::FailStop> {
        self.servers.iter().map(|s| s.fail_stop()).collect()
    }

    /// Stops the servers (drain, checkpoint), then the master. Returns how
    /// often their workers waited for the device while they served
    /// (`ShardStats::device_waits`: 0 when nothing blocked a worker).
    pub fn stop(mut self) -> Result<u64, String> {
        let waits: Vec<pfs_server::DeviceWaits> =
            self.servers.iter().map(|s| s.device_waits()).collect();
        let mut first = Ok(());
        for s in self.servers.drain(..) {
            let id = s.id();
            if let Err(e) = s.stop() {
                log::error!("server {id}: {e}");
                first = first.and(Err(format!("server {id}: {e}")));
            }
        }
        if let Some(m) = self.master.take() {
            m.stop();
        }
        first.map(|()| waits.iter().map(|w| w.total()).sum())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for s in self.servers.drain(..) {
            let _ = s.stop();
        }
        if let Some(m) = self.master.take() {
            m.stop();
        }
    }
}

/// Starts (or restarts on existing data) a master and `servers` servers.
pub fn start(opts: &UpOptions) -> Result<LocalCluster, String> {
    if !(1..=64).contains(&opts.servers) {
        return Err(format!("--servers {}: allowed 1 to 64", opts.servers));
    }
    if let Some(w) = opts.workers.filter(|w| !(1..=256).contains(w)) {
        return Err(format!("--workers {w}: allowed 1 to 256"));
    }
    let data = &opts.data;
    std::fs::create_dir_all(data).map_err(|e| format!("data directory {}: {e}", data.display()))?;
    let shape = check_shape(data, opts)?;

    let key_file = data.join("cluster.key");
    if !key_file.exists() {
        pfs_net::ClusterKey::generate(&key_file).map_err(|e| e.to_string())?;
    }
    let mcfg = MasterConfig {
        listen: opts.master_listen.clone(),
        key_file: key_file.clone(),
        servers: shape.servers,
        state_path: data.join("master.state"),
        ..MasterConfig::default()
    };
    let master = pfs_server::start_master(&mcfg).map_err(|e| format!("master: {e}"))?;
    let mut cluster = LocalCluster {
        master: Some(master),
        servers: Vec::new(),
        workers: shape.workers,
        key_file,
    };
    for i in 0..shape.servers {
        let mut scfg = server_config(data, &shape, i, &cluster.key_file, &cluster.master_addr());
        scfg.idle_spin_us = opts.idle_spin_us.unwrap_or(scfg.idle_spin_us);
        scfg.inline_rounds = opts.inline_rounds;
        // The mount notes each request's thread: rounds run in line only
        // while several threads' requests interleave.
        pfs_net::inline::only_when_interleaved(true);
        if scfg.idle_spin_us > 1_000_000 {
            return Err(format!("--idle-spin-us {}: allowed 0 to 1000000", scfg.idle_spin_us));
        }
        let s = pfs_server::start(&scfg, Duration::from_secs(30))
            .map_err(|e| format!("server {i} ({}): {e}", scfg.data_path.display()))?;
        cluster.servers.push(s);
    }
    Ok(cluster)
}

/// The config of server `i` of a `pfs up` data directory.
fn server_config(
    data: &Path,
    shape: &Shape,
    i: u32,
    key_file: &Path,
    master: &std::net::SocketAddr,
) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".into(),
        data_path: data.join(format!("server-{i}.img")),
        device_size_bytes: shape.size_bytes,
        // Sparse, as the help promises: a trial cluster takes only what is written.
        preallocate: false,
        workers: shape.workers,
        key_file: key_file.to_owned(),
        master: master.to_string(),
        // Clients and servers share this host's cores: a pool thread's
        // hand-offs cost more than the checksum it takes off a worker
        // (docs/benchmarks.md, "The memcpy pool on shared cores").
        memcpy_threads: 0,
        ..ServerConfig::default()
    }
}

/// The server configs of an existing `pfs up` data directory (for `pfs fsck`).
pub fn server_configs(data: &Path) -> Result<Vec<ServerConfig>, String> {
    let path = data.join("up.toml");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!("{}: {e} (is {} a pfs up data directory?)", path.display(), data.display())
    })?;
    let shape: Shape = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    // Not contacted by fsck; the config only needs a valid address.
    let master: std::net::SocketAddr = "127.0.0.1:1".parse().expect("an address");
    let key = data.join("cluster.key");
    Ok((0..shape.servers).map(|i| server_config(data, &shape, i, &key, &master)).collect())
}

/// Reads `up.toml`, or writes it on the first run; a different shape on an
/// existing data directory is an error that says which.
fn check_shape(data: &Path, opts: &UpOptions) -> Result<Shape, String> {
    let path = data.join("up.toml");
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let have: Shape =
                toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let workers = opts.workers.unwrap_or(have.workers);
            if (have.servers, have.workers) != (opts.servers, workers) {
                return Err(format!(
                    "{} holds a file system made with --servers {} --workers {}; run with those, \
                     or give a new --data directory",
                    data.display(),
                    have.servers,
                    have.workers
                ));
            }
            Ok(have)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let want = Shape {
                servers: opts.servers,
                workers: opts.workers.unwrap_or_else(default_workers),
                size_bytes: opts.size_bytes,
            };
            let text = toml::to_string(&want).expect("shape serializes");
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(want)
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// `pfs up`: start, mount, serve until a stop signal or `umount`, then stop.
pub fn run(opts: &UpOptions, mountpoint: &Path, mount_options: &[String]) -> Result<(), String> {
    std::fs::create_dir_all(mountpoint)
        .map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    let stop = pfs_fuse::mount::signals::install();
    let cluster = start(opts)?;
    let master = cluster.master_addr();
    let mut cfg = pfs_fuse::MountConfig::default();
    cfg.apply_options(mount_options)?;
    // The local cluster's own master and key, unless an option names others
    // (a `config=` file's would point at another cluster, or at none).
    let named =
        |k: &str| mount_options.iter().flat_map(|l| l.split(',')).any(|o| o.trim().starts_with(k));
    if !named("master=") {
        cfg.client.master = master.to_string();
    }
    if !named("key=") {
        cfg.client.key_file = cluster.key_file.clone();
    }
    let client = Cluster::connect(ClusterOptions::from_config(&cfg.client)?)
        .map_err(|e| format!("cannot connect to the local cluster: {e}"))?;
    let fs: Arc<dyn FileSystem> = Arc::new(client);
    let mount = pfs_fuse::mount(fs, mountpoint, &cfg)?;
    println!(
        "pfs up: master on {master}, {} server(s) x {} worker(s), data in {}",
        opts.servers,
        cluster.workers,
        opts.data.display()
    );
    println!("pfs up: cluster key {}", cluster.key_file.display());
    println!(
        "pfs up: mounted on {} over {} (Ctrl-C unmounts and stops)",
        mountpoint.display(),
        mount.transport()
    );
    let uring = mount.uring_stats();
    // A server that fail-stops (a failed sync, a panicked worker) takes the
    // mount down with it: pfs up exits non-zero with the reason, and the next
    // run recovers the shards from their logs.
    let watcher = {
        let (stop, fail_stops) = (stop.clone(), cluster.fail_stops());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                for (i, f) in fail_stops.iter().enumerate() {
                    if let Some(why) = f.reason() {
                        eprintln!("pfs up: server {i} stopped ({why}); unmounting");
                        stop.store(true, std::sync::atomic::Ordering::Release);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let served = mount.run(stop.clone());
    stop.store(true, std::sync::atomic::Ordering::Release);
    let _ = watcher.join();
    println!("pfs up: unmounted {}, stopping the servers", mountpoint.display());
    if let Some(u) = uring {
        let (forgets, reads) = u.forgets();
        println!(
            "pfs up: FUSE over io_uring served {} requests ({} large reads by bulk \
             threads); /dev/fuse took {forgets} forgets in {reads} reads",
            u.requests(),
            u.bulk_reads()
        );
    }
    if opts.inline_rounds {
        println!(
            "pfs up: the mount's threads ran the workers' rounds {} times",
            pfs_net::inline::runs()
        );
    }
    let stopped = cluster.stop();
    served?;
    let waits = stopped?;
    // Issue 15's "a worker never waits", as an operator sees it: a worker
    // waiting for the device serves nobody meanwhile.
    println!("pfs up: the workers waited for the device {waits} times while serving");
    println!("pfs up: stopped cleanly");
    Ok(())
}
