//! A cluster in the test process and FUSE mounts as child processes of the real
//! `pfs-fuse` binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pfs_core::{MasterConfig, ServerConfig};
use pfs_server::{MasterHandle, ServerHandle};

pub const PFS_FUSE: &str = env!("CARGO_BIN_EXE_pfs-fuse");

/// A fresh directory under /tmp, removed on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("pfs-e2e-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Master and servers of one cluster, in this process.
pub struct TestCluster {
    pub dir: Scratch,
    pub key: PathBuf,
    master: Option<MasterHandle>,
    servers: Vec<Option<ServerHandle>>,
    cfgs: Vec<ServerConfig>,
}

impl TestCluster {
    pub fn start(name: &str, servers: u32, workers: u32) -> TestCluster {
        let dir = Scratch::new(name);
        let key = dir.path("cluster.key");
        pfs_net::ClusterKey::generate(&key).unwrap();
        let mcfg = MasterConfig {
            listen: "127.0.0.1:0".into(),
            key_file: key.clone(),
            servers,
            state_path: dir.path("master.state"),
            heartbeat_interval_ms: 200,
            down_after_ms: 2_000,
        };
        let master = pfs_server::start_master(&mcfg).unwrap();
        let mut c =
            TestCluster { dir, key, master: Some(master), servers: Vec::new(), cfgs: Vec::new() };
        for i in 0..servers {
            let cfg = ServerConfig {
                listen: "127.0.0.1:0".into(),
                data_path: c.dir.path(&format!("server-{i}.img")),
                device_size_bytes: 4 << 30,
                // Sparse: CI disks are small, and the tests write far less than 4 GiB.
                preallocate: false,
                workers,
                wal_size_bytes: 64 << 20,
                // A dead mount's file locks go within seconds.
                lock_lease_ms: 2_000,
                key_file: c.key.clone(),
                master: c.master_addr(),
                ..ServerConfig::default()
            };
            let s = pfs_server::start(&cfg, Duration::from_secs(20)).unwrap();
            // A restart comes back on the same port, as a deployed server does.
            let cfg = ServerConfig { listen: s.addr().to_string(), ..cfg };
            c.servers.push(Some(s));
            c.cfgs.push(cfg);
        }
        c
    }

    pub fn master_addr(&self) -> String {
        self.master.as_ref().unwrap().addr().to_string()
    }

    /// Stops server `i` cleanly (drain, checkpoint).
    pub fn stop_server(&mut self, i: usize) {
        self.servers[i].take().expect("server running").stop().unwrap();
    }

    /// Starts server `i` again on its data (a new port: it re-registers).
    pub fn start_server(&mut self, i: usize) {
        assert!(self.servers[i].is_none());
        self.servers[i] = Some(pfs_server::start(&self.cfgs[i], Duration::from_secs(20)).unwrap());
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for s in self.servers.iter_mut() {
            if let Some(s) = s.take() {
                let _ = s.stop();
            }
        }
        if let Some(m) = self.master.take() {
            m.stop();
        }
    }
}

/// Whether `dir` is a mount point of a FUSE file system right now.
pub fn is_fuse_mount(dir: &Path) -> bool {
    let want = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts").unwrap().lines().any(|l| {
        let mut f = l.split(' ');
        let (_src, mp, ty) = (f.next(), f.next(), f.next());
        mp == Some(want) && ty.is_some_and(|t| t.starts_with("fuse"))
    })
}

/// Waits up to `limit` for `cond`.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// A `pfs-fuse -f` process serving one mount point.
pub struct Mounted {
    pub dir: PathBuf,
    pub child: Option<Child>,
}

impl Mounted {
    /// Mounts `master` on `dir` (created) with `-o key=...,<opts>`.
    pub fn new(master: &str, key: &Path, dir: &Path, opts: &str) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        let mut o = format!("key={}", key.display());
        if !opts.is_empty() {
            o = format!("{o},{opts}");
        }
        let child = Command::new(PFS_FUSE)
            .arg(master)
            .arg(dir)
            .args(["-o", &o, "-f"])
            .stdin(Stdio::null())
            // The adapter's counters at unmount, which some cases check.
            .env("RUST_LOG", "warn,pfs_fuse::adapter=info")
            .spawn()
            .unwrap();
        let m = Mounted { dir: dir.to_path_buf(), child: Some(child) };
        assert!(wait_for(Duration::from_secs(30), || is_fuse_mount(dir)), "{dir:?} never mounted");
        m
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// `umount`, then waits for the daemon to exit; returns its exit status code.
    pub fn unmount(mut self) -> Option<i32> {
        let st = Command::new("umount").arg(&self.dir).status().unwrap();
        assert!(st.success(), "umount {:?} failed", self.dir);
        let mut child = self.child.take().unwrap();
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st.code();
            }
            assert!(Instant::now() < end, "pfs-fuse did not exit after umount");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if is_fuse_mount(&self.dir) {
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
            if !wait_for(Duration::from_secs(10), || c.try_wait().ok().flatten().is_some()) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Runs `cmd` in `dir` through `sh -c`, asserting success; returns stdout.
pub fn sh(dir: &Path, cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).current_dir(dir).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` in {dir:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The errno of a failed call.
pub fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().expect("an OS error")
}
