//! Test helpers: a cluster directory with a key, configs for a master and servers.

#![allow(dead_code)]

pub mod procs;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pfs_client::{Cluster, ClusterOptions};
use pfs_core::config::PollMode;
use pfs_core::{MasterConfig, ServerConfig};
use pfs_net::ClusterKey;

/// Bytes of each server's data file in tests: two zones of 80 MiB.
pub const DEVICE_BYTES: u64 = 160 << 20;

/// A fresh directory for one test, on a disk-backed file system (O_DIRECT).
/// Removed when dropped, unless the test is failing (then kept to look at).
pub fn test_dir(name: &str) -> TestDir {
    let base = std::env::var_os("PFS_TEST_DEV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let dir = base.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TestDir(dir)
}

/// What [`test_dir`] returns: the directory, removed on drop after a pass
/// (each server data file is 160 MiB: kept, they filled the disk run by run).
#[derive(Debug)]
pub struct TestDir(PathBuf);

impl std::ops::Deref for TestDir {
    type Target = PathBuf;
    fn deref(&self) -> &PathBuf {
        &self.0
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept the failed test's directory {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Writes a cluster key into `dir`.
pub fn key(dir: &Path) -> (PathBuf, ClusterKey) {
    let path = dir.join("cluster.key");
    let key = ClusterKey::generate(&path).unwrap();
    (path, key)
}

/// A master config for `servers` servers on an ephemeral port of 127.0.0.1.
pub fn master_config(dir: &Path, key_file: &Path, servers: u32) -> MasterConfig {
    MasterConfig {
        listen: "127.0.0.1:0".into(),
        key_file: key_file.to_owned(),
        servers,
        state_path: dir.join("master.state"),
        heartbeat_interval_ms: 200,
        down_after_ms: 1000,
    }
}

/// A server config: `workers` workers, data in `dir/server-<n>.img`, listening on
/// 127.0.0.<n+1> (port 0 unless `port` is given). Server 0 lets client threads of
/// this process run its workers' rounds (`inline_rounds`, as `pfs up` does) and
/// the others do not, so every test with two servers goes both ways.
pub fn server_config(
    dir: &Path,
    key_file: &Path,
    master: SocketAddr,
    n: u32,
    workers: u32,
    port: u16,
) -> ServerConfig {
    ServerConfig {
        listen: format!("127.0.0.{}:{port}", n + 1),
        data_path: dir.join(format!("server-{n}.img")),
        device_size_bytes: DEVICE_BYTES,
        workers,
        poll_mode: PollMode::Adaptive,
        idle_spin_us: 50,
        inline_rounds: n == 0,
        memcpy_threads: 0,
        key_file: key_file.to_owned(),
        master: master.to_string(),
        wal_size_bytes: 8 << 20,
        icache_blocks: Some(256),
        ..ServerConfig::default()
    }
}

/// A native client of the cluster whose master is `master`.
pub fn client(master: SocketAddr, key: &ClusterKey) -> Cluster {
    let mut o = ClusterOptions::new(master, key.clone());
    o.connect_timeout = Duration::from_secs(10);
    o.request_timeout = Duration::from_secs(10);
    Cluster::connect(o).unwrap()
}

/// The bytes of test file `i`: size and pattern derived from `i`.
pub fn content(i: u64) -> Vec<u8> {
    let len = (i * 7919 % 300_000) as usize;
    (0..len).map(|j| (i as usize * 31 + j * 7 + j / 4096) as u8).collect()
}

/// A master and `servers` servers of `workers` workers each, in this process.
pub struct Local {
    pub master: pfs_server::MasterHandle,
    pub servers: Vec<pfs_server::ServerHandle>,
    pub key: ClusterKey,
}

impl Local {
    /// Starts them on data files under `dir`.
    pub fn start(dir: &Path, servers: u32, workers: u32) -> Local {
        let (key_file, key) = key(dir);
        let master = pfs_server::start_master(&master_config(dir, &key_file, servers)).unwrap();
        let servers = (0..servers)
            .map(|n| {
                let cfg = server_config(dir, &key_file, master.addr(), n, workers, 0);
                pfs_server::start(&cfg, Duration::from_secs(10)).unwrap()
            })
            .collect();
        Local { master, servers, key }
    }

    /// A native client of this cluster.
    pub fn client(&self) -> Cluster {
        client(self.master.addr(), &self.key)
    }

    /// Stops the servers cleanly, then the master.
    pub fn stop(self) {
        for s in self.servers {
            s.stop().unwrap();
        }
        self.master.stop();
    }
}

/// The whole content of file `ino`.
pub fn read_all(
    fs: &dyn pfs_client::FileSystem,
    ino: pfs_core::InodeId,
) -> Result<Vec<u8>, pfs_core::FsError> {
    let fh = fs.open(ino, 0)?;
    let mut out = Vec::new();
    loop {
        let chunk = fs.read(ino, fh, out.len() as u64, 1 << 20)?;
        if chunk.is_empty() {
            break;
        }
        out.extend_from_slice(&chunk);
    }
    fs.release(ino, fh)?;
    Ok(out)
}
