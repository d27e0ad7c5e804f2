//! `pfs-server master`: keeps the cluster view. Servers register at start (and get
//! a stable id, kept in `state_path` across master restarts) and report their
//! usage every second; clients fetch the view. A server silent for
//! `down_after_ms` is shown down.
//!
//! The state file is text, one line per server: `id addr workers`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pfs_core::wire::{Body, Frame, Reply, Request, ServerInfo, Usage, View};
use pfs_core::{FsError, MasterConfig, ServerId};
use pfs_net::{ClusterKey, FrameServer, Listener, ListenerConfig};

use crate::server::resolve;
use crate::ServerError;

#[derive(Clone, Debug)]
struct Member {
    addr: String,
    workers: u32,
    last_report: Option<Instant>,
    up: bool,
    usage: Usage,
}

/// The master's state: one slot per expected server.
#[derive(Debug)]
pub struct MasterState {
    slots: Vec<Option<Member>>,
    epoch: u64,
    down_after: Duration,
    heartbeat_ms: u32,
    state_path: PathBuf,
}

impl MasterState {
    /// Loads the saved view from `state_path` (none yet: empty).
    pub fn load(cfg: &MasterConfig) -> Result<MasterState, ServerError> {
        let mut slots: Vec<Option<Member>> = vec![None; cfg.servers as usize];
        match std::fs::read_to_string(&cfg.state_path) {
            Ok(text) => {
                for (n, line) in text.lines().enumerate() {
                    let bad = |why: &str| {
                        ServerError::Config(format!(
                            "{} line {}: {why}: {line:?}",
                            cfg.state_path.display(),
                            n + 1
                        ))
                    };
                    let f: Vec<&str> = line.split_whitespace().collect();
                    if f.is_empty() {
                        continue;
                    }
                    let [id, addr, workers] = f[..] else {
                        return Err(bad("expected `id addr workers`"));
                    };
                    let id: usize = id.parse().map_err(|_| bad("bad server id"))?;
                    let workers: u32 = workers.parse().map_err(|_| bad("bad worker count"))?;
                    if id >= slots.len() {
                        return Err(bad(&format!(
                            "server {id} is outside servers = {} of the config (servers cannot be removed)",
                            cfg.servers
                        )));
                    }
                    slots[id] = Some(Member {
                        addr: addr.to_owned(),
                        workers,
                        last_report: None,
                        up: false,
                        usage: Usage::default(),
                    });
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ServerError::Config(format!(
                    "cannot read {}: {e}",
                    cfg.state_path.display()
                )))
            }
        }
        Ok(MasterState {
            slots,
            epoch: 1,
            down_after: Duration::from_millis(cfg.down_after_ms),
            heartbeat_ms: cfg.heartbeat_interval_ms as u32,
            state_path: cfg.state_path.clone(),
        })
    }

    fn save(&self) -> Result<(), FsError> {
        let mut text = String::new();
        for (id, m) in self.slots.iter().enumerate() {
            if let Some(m) = m {
                text.push_str(&format!("{id} {} {}\n", m.addr, m.workers));
            }
        }
        write_atomically(&self.state_path, text.as_bytes()).map_err(|e| {
            FsError::Io(format!("cannot save the view to {}: {e}", self.state_path.display()))
        })
    }

    /// Answers one request.
    pub fn handle(&mut self, req: Request, now: Instant) -> Result<Reply, FsError> {
        self.mark_down(now);
        match req {
            Request::Register { server, addr, workers, usage } => {
                self.register(server, addr, workers, usage, now)
            }
            Request::Heartbeat { server, usage } => {
                let Some(Some(m)) = self.slots.get_mut(server.0 as usize) else {
                    return Err(FsError::NotFound);
                };
                m.last_report = Some(now);
                m.usage = usage;
                if !m.up {
                    m.up = true;
                    self.epoch += 1;
                    log::info!("server {server} ({}) is up", m.addr);
                }
                Ok(Reply::Heartbeat { epoch: self.epoch })
            }
            Request::GetView => Ok(Reply::GetView(self.view(now))),
            other => Err(FsError::Invalid(format!(
                "{:?} sent to the master: file requests go to storage servers",
                other.opcode()
            ))),
        }
    }

    fn register(
        &mut self,
        server: Option<ServerId>,
        addr: String,
        workers: u32,
        usage: Usage,
        now: Instant,
    ) -> Result<Reply, FsError> {
        if workers == 0 || addr.is_empty() {
            return Err(FsError::Invalid(format!(
                "registration with {workers} workers at {addr:?}"
            )));
        }
        if let Some(first) = self.slots.iter().flatten().next() {
            if first.workers != workers {
                return Err(FsError::Invalid(format!(
                    "this server runs {workers} workers, the cluster's servers run {}: every server \
                     must run the same number",
                    first.workers
                )));
            }
        }
        let id = match server {
            Some(id) => {
                if id.0 as usize >= self.slots.len() {
                    return Err(FsError::Invalid(format!(
                        "server {id} is not in this cluster of {} servers",
                        self.slots.len()
                    )));
                }
                id.0 as usize
            }
            None => {
                if let Some(i) =
                    self.slots.iter().position(|m| m.as_ref().is_some_and(|m| m.addr == addr))
                {
                    return Err(FsError::Invalid(format!(
                        "{addr} is already server {i}, with data; a new (empty) server cannot take its place"
                    )));
                }
                self.slots.iter().position(Option::is_none).ok_or_else(|| {
                    FsError::Invalid(format!(
                        "the cluster is full: the master expects {} servers and all registered \
                         (raise `servers` in the master config for a new cluster)",
                        self.slots.len()
                    ))
                })?
            }
        };
        let changed =
            self.slots[id].as_ref().is_none_or(|m| m.addr != addr || m.workers != workers);
        self.slots[id] =
            Some(Member { addr: addr.clone(), workers, last_report: Some(now), up: true, usage });
        self.epoch += 1;
        if changed {
            self.save()?;
        }
        log::info!(
            "server {id} registered at {addr} with {workers} workers (epoch {})",
            self.epoch
        );
        Ok(Reply::Register {
            server: ServerId(id as u32),
            epoch: self.epoch,
            heartbeat_ms: self.heartbeat_ms,
        })
    }

    fn mark_down(&mut self, now: Instant) {
        for (id, m) in self.slots.iter_mut().enumerate() {
            let Some(m) = m else { continue };
            let silent = m.last_report.is_none_or(|t| now.duration_since(t) > self.down_after);
            if m.up && silent {
                m.up = false;
                self.epoch += 1;
                log::warn!("server {id} ({}) stopped reporting: marked down", m.addr);
            }
        }
    }

    /// The current view.
    pub fn view(&self, now: Instant) -> View {
        let servers = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(id, m)| {
                let m = m.as_ref()?;
                Some(ServerInfo {
                    id: ServerId(id as u32),
                    addr: m.addr.clone(),
                    workers: m.workers,
                    up: m.up,
                    last_report_ms: m
                        .last_report
                        .map_or(u64::MAX, |t| now.duration_since(t).as_millis() as u64),
                    usage: m.usage,
                })
            })
            .collect();
        View { epoch: self.epoch, servers_expected: self.slots.len() as u32, servers }
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A running master.
#[derive(Debug)]
pub struct MasterHandle {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl MasterHandle {
    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// A flag that stops the master when set.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Stops it and waits.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }

    /// Waits until it stops.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Starts the master on its own thread.
pub fn start_master(cfg: &MasterConfig) -> Result<MasterHandle, ServerError> {
    use pfs_core::config::ConfigFile;
    cfg.validate().map_err(|e| ServerError::Config(e.to_string()))?;
    let key = ClusterKey::load(&cfg.key_file).map_err(|e| ServerError::Config(e.to_string()))?;
    let mut state = MasterState::load(cfg)?;
    let listen = resolve("listen", &cfg.listen)?;
    let mut lcfg = ListenerConfig::new(listen, key);
    lcfg.credits = 16;
    let listener = Listener::bind(lcfg).map_err(|e| ServerError::Net(e.to_string()))?;
    let addr = listener.local_addr();
    let mut server = FrameServer::new(listener).map_err(|e| ServerError::Net(e.to_string()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("pfs-master".into())
        .spawn(move || {
            server.run_until(&flag, |frame| {
                let Body::Request(req) = frame.body else { return None };
                let op = req.opcode();
                let body = match state.handle(req, Instant::now()) {
                    Ok(reply) => Body::Reply(reply),
                    Err(error) => Body::Error { op, error },
                };
                Some(Frame { request_id: frame.request_id, client: frame.client, body })
            });
        })
        .map_err(|e| ServerError::Worker(format!("cannot start the master thread: {e}")))?;
    log::info!("master serving on {addr} for {} servers", cfg.servers);
    Ok(MasterHandle { addr, stop, thread })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path, servers: u32) -> MasterConfig {
        MasterConfig { servers, state_path: dir.join("master.state"), ..MasterConfig::default() }
    }

    fn reg(
        s: &mut MasterState,
        server: Option<u32>,
        addr: &str,
        now: Instant,
    ) -> Result<Reply, FsError> {
        let req = Request::Register {
            server: server.map(ServerId),
            addr: addr.into(),
            workers: 2,
            usage: Usage::default(),
        };
        s.handle(req, now)
    }

    #[test]
    fn ids_are_stable_across_restarts_and_the_cluster_has_a_size() {
        let dir = std::env::temp_dir().join(format!("pfs-master-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let now = Instant::now();
        let mut s = MasterState::load(&cfg(&dir, 2)).unwrap();
        assert!(matches!(
            reg(&mut s, None, "10.0.0.1:7070", now),
            Ok(Reply::Register { server: ServerId(0), .. })
        ));
        assert!(!s.view(now).is_complete());
        assert!(matches!(
            reg(&mut s, None, "10.0.0.2:7070", now),
            Ok(Reply::Register { server: ServerId(1), .. })
        ));
        assert!(s.view(now).is_complete());
        let full = reg(&mut s, None, "10.0.0.3:7070", now).unwrap_err();
        assert!(full.to_string().contains("cluster is full"), "{full}");
        let dup = reg(&mut s, None, "10.0.0.1:7070", now).unwrap_err();
        assert!(dup.to_string().contains("already server 0"), "{dup}");

        // A restarted master knows both servers; they rejoin under their ids.
        let mut s = MasterState::load(&cfg(&dir, 2)).unwrap();
        let v = s.view(now);
        assert_eq!(v.servers.len(), 2);
        assert_eq!(v.servers[1].addr, "10.0.0.2:7070");
        assert!(matches!(
            reg(&mut s, Some(1), "10.0.0.2:7070", now),
            Ok(Reply::Register { server: ServerId(1), .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_silent_server_is_marked_down_and_comes_back_with_a_heartbeat() {
        let dir = std::env::temp_dir().join(format!("pfs-master-down-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = cfg(&dir, 1);
        c.down_after_ms = 2000;
        let mut s = MasterState::load(&c).unwrap();
        let t0 = Instant::now();
        reg(&mut s, None, "127.0.0.1:1", t0).unwrap();
        let Reply::GetView(v) = s.handle(Request::GetView, t0 + Duration::from_secs(1)).unwrap()
        else {
            panic!()
        };
        assert!(v.servers[0].up);
        let later = t0 + Duration::from_secs(3);
        let Reply::GetView(v) = s.handle(Request::GetView, later).unwrap() else { panic!() };
        assert!(!v.servers[0].up);
        let epoch = v.epoch;
        let beat = Request::Heartbeat {
            server: ServerId(0),
            usage: Usage { used_bytes: 5, ..Usage::default() },
        };
        s.handle(beat, later).unwrap();
        let Reply::GetView(v) = s.handle(Request::GetView, later).unwrap() else { panic!() };
        assert!(v.servers[0].up && v.epoch > epoch && v.servers[0].usage.used_bytes == 5);
        let unknown = Request::Heartbeat { server: ServerId(9), usage: Usage::default() };
        assert_eq!(s.handle(unknown, later), Err(FsError::NotFound));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
