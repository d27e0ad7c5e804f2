//! A real cluster of processes on 127.0.0.x: a master and `pfs-server`
//! processes, plus client processes (the test binary run again in a child role).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pfs_client::{Cluster, ClusterOptions};
use pfs_net::ClusterKey;

const SERVER_BIN: &str = env!("CARGO_BIN_EXE_pfs-server");

/// The environment variable that tells the test binary which child role to run.
pub const CHILD_ROLE: &str = "PFS_CLUSTER_CHILD";

pub fn free_port(ip: &str) -> u16 {
    TcpListener::bind(format!("{ip}:0")).unwrap().local_addr().unwrap().port()
}

/// How a server's memory and device queue are sized.
#[derive(Clone, Copy, Debug)]
pub struct Sizing {
    pub wal_size_bytes: u64,
    pub icache_blocks: u32,
    pub io_queue_depth: u32,
    /// `None`: the server's default (from the machine's memory).
    pub read_cache_mib: Option<u64>,
}

impl Sizing {
    /// What the tests use unless they ask otherwise: an 8 MiB log, 4,096
    /// inodes in the Icache per worker.
    pub const DEFAULT: Sizing = Sizing {
        wal_size_bytes: 8 << 20,
        icache_blocks: 256,
        io_queue_depth: 256,
        read_cache_mib: None,
    };

    /// Everything at its smallest useful size: a 4 MiB log, 256 inodes in the
    /// Icache, an 8 MiB read cache, two requests on the device at once. Pages
    /// are evicted, written back and read again all the time.
    pub const SMALL: Sizing = Sizing {
        wal_size_bytes: 4 << 20,
        icache_blocks: 16,
        io_queue_depth: 2,
        read_cache_mib: Some(8),
    };
}

pub struct ClusterProcs {
    pub dir: PathBuf,
    pub master_addr: SocketAddr,
    pub master: Child,
    pub servers: Vec<Option<Child>>,
    pub count: u32,
}

impl ClusterProcs {
    /// A master and `servers` servers of `workers` workers each, server n on
    /// 127.0.0.(n+2).
    pub fn start(dir: &Path, servers: u32, workers: u32) -> ClusterProcs {
        ClusterProcs::start_sized(dir, servers, workers, |_| Sizing::DEFAULT)
    }

    /// As [`start`](Self::start), server n sized `sizing(n)`.
    pub fn start_sized(
        dir: &Path,
        servers: u32,
        workers: u32,
        sizing: impl Fn(u32) -> Sizing,
    ) -> ClusterProcs {
        let mut c = ClusterProcs::configure_sized(dir, servers, workers, sizing);
        for n in 0..servers {
            // One after the other, so server n gets id n.
            let before = c.serving_lines(n);
            let child = c.spawn_server(n, &[]);
            c.servers.push(Some(child));
            c.wait_registered(n + 1);
            // Registered is not formatted: a new server registers (for its
            // id) and then formats its zones. Tests that kill a server right
            // after its start mean to kill a running one.
            c.wait_serving(n, before);
        }
        c
    }

    /// The master running and the configs of `servers` servers written, none
    /// started (`servers` is empty).
    pub fn configure(dir: &Path, servers: u32, workers: u32) -> ClusterProcs {
        ClusterProcs::configure_sized(dir, servers, workers, |_| Sizing::DEFAULT)
    }

    /// As [`configure`](Self::configure), server n sized `sizing(n)`.
    pub fn configure_sized(
        dir: &Path,
        servers: u32,
        workers: u32,
        sizing: impl Fn(u32) -> Sizing,
    ) -> ClusterProcs {
        let key = dir.join("cluster.key");
        ClusterKey::generate(&key).unwrap();
        let master_addr: SocketAddr =
            format!("127.0.0.1:{}", free_port("127.0.0.1")).parse().unwrap();
        std::fs::write(
            dir.join("master.toml"),
            format!(
                "listen = \"{master_addr}\"\nkey_file = \"{}\"\nservers = {servers}\nstate_path = \"{}\"\n\
                 heartbeat_interval_ms = 200\ndown_after_ms = 1000\n",
                key.display(),
                dir.join("master.state").display()
            ),
        )
        .unwrap();
        let master = spawn(
            dir,
            "master",
            &["master", "--config", dir.join("master.toml").to_str().unwrap()],
            &[],
        );
        for n in 0..servers {
            let ip = format!("127.0.0.{}", n + 2);
            let z = sizing(n);
            let cfg = format!(
                "listen = \"{ip}:{}\"\ndata_path = \"{}\"\ndevice_size_bytes = {}\npreallocate = false\nworkers = {workers}\n\
                 key_file = \"{}\"\nmaster = \"{master_addr}\"\nwal_size_bytes = {}\nicache_blocks = {}\n\
                 io_queue_depth = {}\n{}idle_spin_us = 50\n",
                free_port(&ip),
                dir.join(format!("server-{n}.img")).display(),
                super::DEVICE_BYTES,
                key.display(),
                z.wal_size_bytes,
                z.icache_blocks,
                z.io_queue_depth,
                z.read_cache_mib.map_or(String::new(), |m| format!("read_cache_mib = {m}\n")),
            );
            std::fs::write(dir.join(format!("server-{n}.toml")), cfg).unwrap();
        }
        ClusterProcs {
            dir: dir.to_owned(),
            master_addr,
            master,
            servers: Vec::new(),
            count: servers,
        }
    }

    /// How many times server `n`'s log says it started serving.
    pub fn serving_lines(&self, n: u32) -> usize {
        let log = std::fs::read_to_string(self.dir.join(format!("server-{n}.log")));
        log.map_or(0, |l| l.matches(" serving on ").count())
    }

    /// Waits until server `n`'s log says it started serving once more than
    /// `before` times.
    pub fn wait_serving(&self, n: u32, before: usize) {
        if std::env::var("PFS_TEST_LOG")
            .is_ok_and(|l| ["off", "error", "warn"].contains(&l.as_str()))
        {
            // The line is logged at info.
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.serving_lines(n) <= before {
            assert!(Instant::now() < deadline, "server {n} did not start serving within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts server `n` with extra environment variables (failpoints).
    pub fn spawn_server(&self, n: u32, env: &[(&str, &str)]) -> Child {
        let cfg = self.dir.join(format!("server-{n}.toml"));
        spawn(&self.dir, &format!("server-{n}"), &["serve", "--config", cfg.to_str().unwrap()], env)
    }

    /// Waits until `count` servers are registered and up.
    pub fn wait_registered(&self, count: u32) {
        let key = ClusterKey::load(&self.dir.join("cluster.key")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(v) =
                pfs_client::cluster::fetch_view(self.master_addr, &key, Duration::from_secs(2))
            {
                if v.servers.len() as u32 >= count && v.servers.iter().all(|s| s.up) {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "{count} servers did not register within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A client with a 3 s request timeout. A server that was just restarted
    /// may still be starting: connecting is retried for up to 30 s.
    pub fn client(&self) -> Cluster {
        self.client_with_timeout(Duration::from_secs(3))
    }

    /// A client whose requests time out after `timeout` (`TryAgain` answers
    /// are retried until then).
    pub fn client_with_timeout(&self, timeout: Duration) -> Cluster {
        let key = ClusterKey::load(&self.dir.join("cluster.key")).unwrap();
        let mut o = ClusterOptions::new(self.master_addr, key);
        o.connect_timeout = Duration::from_secs(20);
        o.request_timeout = timeout;
        connect_retrying(o)
    }

    pub fn kill_server(&mut self, n: usize) {
        let mut child = self.servers[n].take().unwrap();
        kill(&child);
        child.wait().unwrap();
    }

    pub fn stop(mut self) {
        for s in self.servers.iter_mut().flatten() {
            // SIGTERM: drain and checkpoint, exit 0.
            // SAFETY: plain syscall on our own child's pid.
            unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
        }
        for (n, s) in self.servers.iter_mut().enumerate() {
            if let Some(s) = s {
                let status =
                    wait_timeout(s, Duration::from_secs(20)).expect("server stops on SIGTERM");
                assert!(status.success(), "server {n} exited with {status} on SIGTERM");
            }
        }
        // SAFETY: as above.
        unsafe { libc::kill(self.master.id() as i32, libc::SIGTERM) };
        let status = wait_timeout(&mut self.master, Duration::from_secs(10)).expect("master stops");
        assert!(status.success(), "master exited with {status}");
    }
}

impl Drop for ClusterProcs {
    /// A test that fails leaves no server or master behind.
    fn drop(&mut self) {
        for c in self.servers.iter_mut().flatten().chain(std::iter::once(&mut self.master)) {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl ClusterProcs {
    /// Stops every server with SIGTERM (drain, checkpoint) and waits.
    pub fn stop_servers(&mut self) {
        for s in self.servers.iter().flatten() {
            // SAFETY: plain syscall on our own child's pid.
            unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
        }
        for (n, s) in self.servers.iter_mut().enumerate() {
            if let Some(mut child) = s.take() {
                let status =
                    wait_timeout(&mut child, Duration::from_secs(20)).expect("server stops");
                assert!(status.success(), "server {n} exited with {status} on SIGTERM");
            }
        }
    }

    /// The config of server `n`.
    pub fn server_config(&self, n: u32) -> pfs_core::ServerConfig {
        use pfs_core::config::ConfigFile;
        pfs_core::ServerConfig::load(&self.dir.join(format!("server-{n}.toml"))).unwrap()
    }
}

/// SIGKILL to `child`.
pub fn kill(child: &Child) {
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
}

/// Starts `pfs-server args` with its output in `dir/name.log` (appended).
pub fn spawn(dir: &Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{name}.log")))
        .unwrap();
    let mut cmd = Command::new(SERVER_BIN);
    // PFS_TEST_LOG=debug gives the servers' debug lines (what a failure did).
    let level = std::env::var("PFS_TEST_LOG").unwrap_or_else(|_| "info".into());
    cmd.args(args).env("RUST_LOG", level).stdout(log.try_clone().unwrap()).stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

/// Runs this binary again in role `role`; its stdout lines arrive on the channel.
pub fn spawn_child(c: &ClusterProcs, role: &str) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(CHILD_ROLE, role)
        .env("PFS_MASTER", c.master_addr.to_string())
        .env("PFS_KEY", c.dir.join("cluster.key"))
        .env("PFS_DIR", &c.dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The client of a child role (from the environment `spawn_child` set).
pub fn child_client() -> Cluster {
    let master: SocketAddr = std::env::var("PFS_MASTER").unwrap().parse().unwrap();
    let key = ClusterKey::load(Path::new(&std::env::var("PFS_KEY").unwrap())).unwrap();
    let mut o = ClusterOptions::new(master, key);
    o.connect_timeout = Duration::from_secs(20);
    o.request_timeout = Duration::from_secs(3);
    connect_retrying(o)
}

/// Connects, retrying for up to 30 s: a server just restarted may still be
/// starting while the master lists it as up.
fn connect_retrying(o: ClusterOptions) -> Cluster {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Cluster::connect(o.clone()) {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                eprintln!("client: {e}; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("no client within 30 s: {e}"),
        }
    }
}
