//! `pfs-server serve`: opens (or formats) one zone per worker on the data file,
//! registers with the master, and runs the workers, the acceptor and the
//! heartbeat until stopped.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pfs_core::wire::{Body, Frame, Reply, Request, Usage, View};
use pfs_core::{ClientId, RequestId, ServerConfig, ServerId, ShardId};
use pfs_net::rdma::RdmaConfig;
use pfs_net::{ClusterKey, Link, Listener, ListenerConfig, RpcClient, RpcOptions};
use pfs_store::device::{UringDevice, UringOptions};
use pfs_store::{FormatOptions, Shard, ShardOptions, Zone};

use crate::cleanstop;

use crate::memcpy::MemcpyPool;
use crate::msg::{Doorbell, LiveConns};
use crate::peers::{Peers, Wake, VIEW_QUEUE};
use crate::worker::{ring_mesh, FailStop, UsageCell, Worker, WorkerOptions};
use crate::ServerError;

/// Zones start at multiples of this, so `O_DIRECT` alignment always holds.
const ZONE_ALIGN_BYTES: u64 = 1 << 20;
/// How often a server reports to the master unless the master says otherwise
/// (its `heartbeat_interval_ms`, in the registration reply).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
/// How often a server beats while its view lacks a server the cluster
/// expects (it learns the others' addresses from the views).
const STARTUP_BEAT: Duration = Duration::from_millis(100);
/// Lease of a dentry-cache read token.
pub const TOKEN_LEASE_MS: u64 = 1000;
/// New connections waiting for their worker.
const NEW_CONN_QUEUE: usize = 64;

/// A running storage server.
#[derive(Debug)]
pub struct ServerHandle {
    id: ServerId,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    fail_stop: FailStop,
    bells: Arc<Vec<Doorbell>>,
    /// Each returns its zone's format id and final checkpoint generation.
    workers: Vec<JoinHandle<Result<(u64, u64), String>>>,
    /// Where a clean stop leaves its mark, and the boot id it keeps.
    clean_mark: Option<PathBuf>,
    boot: u64,
    /// The exclusive lock on the data file, held while the server runs.
    _lock: std::fs::File,
    helpers: Vec<JoinHandle<()>>,
    /// Stops once the workers (its only users) are gone.
    memcpy: Option<MemcpyPool>,
    /// What each worker publishes (`UsageCell`).
    usage: Vec<Arc<UsageCell>>,
}

/// The device waits of a server's workers while they served, readable after
/// the server stopped ([`ServerHandle::device_waits`]).
#[derive(Clone, Debug)]
pub struct DeviceWaits(Vec<Arc<UsageCell>>);

impl DeviceWaits {
    /// The sum over the workers that stopped so far.
    pub fn total(&self) -> u64 {
        self.0.iter().map(|u| u.device_waits.load(Ordering::Relaxed)).sum()
    }

    /// Device requests that found a worker's device queue full and waited
    /// in its shard's queue instead of the worker waiting, summed over the
    /// workers that stopped so far.
    pub fn held_back(&self) -> u64 {
        self.0.iter().map(|u| u.held_back.load(Ordering::Relaxed)).sum()
    }
}

impl ServerHandle {
    /// The server's id in the cluster view.
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A flag that stops the server when set (for signal handlers).
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Why the server fail-stopped (a shard that stopped acknowledging, a worker
    /// panic), once it did; it is then stopping by itself, and `join`/`stop`
    /// return [`ServerError::FailStop`].
    pub fn failure(&self) -> Option<String> {
        self.fail_stop.reason()
    }

    /// A handle on the fail-stop state, for a supervisor thread to watch.
    pub fn fail_stop(&self) -> FailStop {
        self.fail_stop.clone()
    }

    /// How often its workers waited for the device while they served, in
    /// all (`ShardStats::device_waits`); counted when each stops, so read it
    /// through a clone taken before [`stop`](Self::stop).
    pub fn device_waits(&self) -> DeviceWaits {
        DeviceWaits(self.usage.clone())
    }

    /// The backlog of full rings between its workers: the most tasks one
    /// worker's held at once, and the rounds in which workers took no new
    /// requests because theirs was at its bound (`worker::BACKLOG_RINGS`).
    pub fn backlog(&self) -> (u64, u64) {
        let high = self.usage.iter().map(|u| u.backlog_high.load(Ordering::Relaxed)).max();
        let pauses = self.usage.iter().map(|u| u.backlog_pauses.load(Ordering::Relaxed)).sum();
        (high.unwrap_or(0), pauses)
    }

    /// Stops accepting, drains, commits and checkpoints every shard, and waits.
    pub fn stop(self) -> Result<(), ServerError> {
        self.stop.store(true, Ordering::Release);
        self.join()
    }

    /// Waits until the server stops (its stop flag was set).
    pub fn join(self) -> Result<(), ServerError> {
        let mut first_error = None;
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(50));
        }
        for b in self.bells.iter() {
            b.ring_always();
        }
        for h in self.helpers {
            let _ = h.join();
        }
        let mut zones = Vec::with_capacity(self.workers.len());
        for h in self.workers {
            match h.join() {
                Ok(Ok(state)) => zones.push(state),
                Ok(Err(e)) => {
                    log::error!("{e}");
                    first_error.get_or_insert(ServerError::Worker(e));
                }
                Err(_) => {
                    first_error.get_or_insert(ServerError::Worker("a worker panicked".into()));
                }
            }
        }
        if let Some(pool) = self.memcpy {
            pool.join();
        }
        if let Some(why) = self.fail_stop.reason() {
            return Err(ServerError::FailStop(why));
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        // Every worker drained, committed and checkpointed: everything this
        // boot acknowledged is durable, so the next start may keep its id.
        if let Some(path) = &self.clean_mark {
            let locks = self.usage.iter().map(|u| u.locks_held.load(Ordering::Relaxed)).sum();
            let mark = cleanstop::Mark { boot: self.boot, zones, locks_held: Some(locks) };
            match cleanstop::put(path, &mark) {
                Ok(()) => log::info!("stopped cleanly: boot id kept in {}", path.display()),
                Err(e) => log::warn!(
                    "cannot write {}: {e}; the next start gets a new boot id",
                    path.display()
                ),
            }
        }
        Ok(())
    }
}

/// Resolves `host:port` to one socket address.
pub fn resolve(what: &str, addr: &str) -> Result<SocketAddr, ServerError> {
    addr.to_socket_addrs()
        .map_err(|e| ServerError::Config(format!("{what} = {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| ServerError::Config(format!("{what} = {addr:?} resolves to no address")))
}

fn uring_options(cfg: &ServerConfig, size_bytes: u64) -> UringOptions {
    UringOptions {
        queue_depth: cfg.io_queue_depth as usize,
        registered_buffers: 16,
        registered_buffer_size: 1 << 20,
        // Read-ahead keeps its device buffers and staged writes theirs: past
        // the 16 registered, 32 more of 1 MiB are kept for reuse.
        spare_buffers: 32,
        size_bytes: Some(size_bytes),
        preallocate: cfg.preallocate,
        submit_below: cfg.io_submit_below as usize,
    }
}

/// The size of the data file or device: the configured size, else the existing
/// file's.
fn device_size(cfg: &ServerConfig) -> Result<u64, ServerError> {
    if cfg.device_size_bytes != 0 {
        return Ok(cfg.device_size_bytes);
    }
    match std::fs::metadata(&cfg.data_path) {
        Ok(m) if m.is_file() && m.len() > 0 => Ok(m.len()),
        Ok(_) => {
            // A block device: its size comes from the device itself.
            let dev = UringDevice::open(
                &cfg.data_path,
                UringOptions { size_bytes: None, ..uring_options(cfg, 0) },
            )
            .map_err(|e| ServerError::Storage(e.to_string()))?;
            Ok(pfs_store::device::Device::size_bytes(&dev))
        }
        Err(_) => Err(ServerError::Config(format!(
            "data_path {} does not exist: set device_size_bytes to create a file of that size",
            cfg.data_path.display()
        ))),
    }
}

/// Registers with the master and returns the id it gives; retries until `deadline`.
fn register(
    master: SocketAddr,
    key: &ClusterKey,
    known: Option<ServerId>,
    advertise: &str,
    workers: u32,
    deadline: Instant,
) -> Result<(ServerId, Duration), ServerError> {
    let req = Request::Register {
        server: known,
        addr: advertise.to_owned(),
        workers,
        usage: Usage::default(),
    };
    let frame = Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(req) };
    let mut last = String::new();
    while Instant::now() < deadline {
        let opts = RpcOptions { credits: 4, ..RpcOptions::default() };
        match RpcClient::connect(master, key.clone(), opts) {
            Ok(mut rpc) => match rpc.call(&frame, Duration::from_secs(5)) {
                Ok(Frame {
                    body: Body::Reply(Reply::Register { server, epoch, heartbeat_ms }),
                    ..
                }) => {
                    log::info!(
                        "registered with master {master} as server {server} (view epoch {epoch}, \
                             reporting every {heartbeat_ms} ms)"
                    );
                    let every = match heartbeat_ms {
                        0 => HEARTBEAT_INTERVAL,
                        ms => Duration::from_millis(u64::from(ms)),
                    };
                    return Ok((server, every));
                }
                Ok(Frame { body: Body::Error { error, .. }, .. }) => {
                    return Err(ServerError::Master(format!(
                        "master {master} refused to register this server: {error}"
                    )));
                }
                Ok(other) => last = format!("unexpected reply {:?}", other.opcode()),
                Err(e) => last = e.to_string(),
            },
            Err(e @ pfs_net::NetError::KeyMismatch { .. })
            | Err(e @ pfs_net::NetError::Refused { .. }) => {
                return Err(ServerError::Master(e.to_string()));
            }
            Err(e) => last = e.to_string(),
        }
        log::warn!("cannot register with master {master} yet: {last}");
        std::thread::sleep(Duration::from_millis(500));
    }
    Err(ServerError::Master(format!("cannot reach master {master}: {last}")))
}

/// The zones of a server's data file or device, probed.
struct Zones {
    devices: Vec<UringDevice>,
    /// The server id the zones belong to; `None`: none is formatted yet.
    known: Option<ServerId>,
    /// Every zone is formatted (`false` with `known`: a format was cut short).
    complete: bool,
    zone_bytes: u64,
}

/// Takes an exclusive lock on the data file or device for the life of the
/// returned file, so two servers (or a server and `pfs fsck`) never open it at
/// once.
fn lock_data(cfg: &ServerConfig) -> Result<std::fs::File, ServerError> {
    use std::os::fd::AsRawFd;
    let path = &cfg.data_path;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        // Not there yet: the server creates it at the configured size.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if cfg.device_size_bytes == 0 {
                return Err(ServerError::Config(format!(
                    "data_path {} does not exist: set device_size_bytes to create a file of that size",
                    path.display()
                )));
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    ServerError::Storage(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
                ServerError::Storage(format!("cannot create {}: {e}", path.display()))
            })?
        }
        Err(e) => return Err(ServerError::Storage(format!("cannot open {}: {e}", path.display()))),
    };
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(ServerError::Storage(format!(
            "{} is in use by another process (a running server, or pfs fsck): {}",
            path.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(file)
}

/// The shard options a server config asks for.
fn shard_options(cfg: &ServerConfig) -> ShardOptions {
    let memory = memory_bytes();
    ShardOptions {
        icache_blocks: cfg.icache_block_count(memory) as usize,
        dirty_ratio: cfg.dirty_ratio,
        read_cache_pages: (cfg.read_cache_bytes(memory) / pfs_store::shard::geometry::PAGE_SIZE)
            as usize,
        read_ahead_factor: cfg.read_ahead_factor,
        ..ShardOptions::default()
    }
}

/// The machine's memory (`MemTotal`), or 4 GiB when /proc/meminfo says nothing.
fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(4 << 30, |kib| kib * 1024)
}

/// The size of each worker's zone, checked.
fn zone_size(cfg: &ServerConfig) -> Result<(u64, u64), ServerError> {
    let workers = cfg.workers as usize;
    let size = device_size(cfg)?;
    let zone_bytes = size / workers as u64 / ZONE_ALIGN_BYTES * ZONE_ALIGN_BYTES;
    if zone_bytes < 64 << 20 {
        return Err(ServerError::Config(format!(
            "{} bytes of {} give {workers} workers zones of {zone_bytes} bytes: each needs at least 64 MiB",
            size,
            cfg.data_path.display()
        )));
    }
    Ok((size, zone_bytes))
}

/// One device per worker, without looking at what the zones hold.
fn open_devices(cfg: &ServerConfig) -> Result<(Vec<UringDevice>, u64), ServerError> {
    let (size, zone_bytes) = zone_size(cfg)?;
    let devices = (0..cfg.workers)
        .map(|_| {
            UringDevice::open(&cfg.data_path, uring_options(cfg, size))
                .map_err(|e| ServerError::Storage(e.to_string()))
        })
        .collect::<Result<_, _>>()?;
    Ok((devices, zone_bytes))
}

/// Opens one device per worker and reads every zone's superblock: all
/// formatted (a restart) or none (a new server).
fn probe_zones(cfg: &ServerConfig) -> Result<Zones, ServerError> {
    let workers = cfg.workers as usize;
    let (size, zone_bytes) = zone_size(cfg)?;
    let mut devices = Vec::with_capacity(workers);
    let mut found = Vec::with_capacity(workers);
    for w in 0..workers {
        let dev = UringDevice::open(&cfg.data_path, uring_options(cfg, size))
            .map_err(|e| ServerError::Storage(e.to_string()))?;
        let (dev, shard) = Shard::probe(dev, w as u64 * zone_bytes).map_err(|e| {
            ServerError::Storage(format!("zone {w} of {}: {e}", cfg.data_path.display()))
        })?;
        devices.push(dev);
        found.push(shard);
    }
    let formatted = |z: &Zone| matches!(z, Zone::Formatted(_));
    let (known, complete) = match found[0] {
        Zone::Formatted(g0) if found.iter().all(formatted) => {
            for (w, z) in found.iter().enumerate() {
                let Zone::Formatted(s) = *z else { unreachable!("all formatted") };
                if s.0 != g0.0 + w as u32 || g0.0 % workers as u32 != 0 {
                    return Err(ServerError::Storage(format!(
                        "zone {w} of {} belongs to shard {s}: it was formatted for another worker count \
                         (this config has workers = {workers})",
                        cfg.data_path.display()
                    )));
                }
            }
            (Some(ServerId(g0.0 / workers as u32)), true)
        }
        Zone::Empty if found.iter().all(|z| *z == Zone::Empty) => (None, false),
        // A format (a first start's or `pfs mkfs`'s) was cut short: nothing was
        // served from these zones, and zone 0 says for which server.
        Zone::Cut(g0) if g0.0 % workers as u32 == 0 => {
            log::warn!(
                "{}: a format as server {} was cut short (zone 0 holds its intent, not its \
                 superblock): formatting again",
                cfg.data_path.display(),
                g0.0 / workers as u32
            );
            (Some(ServerId(g0.0 / workers as u32)), false)
        }
        _ => {
            return Err(ServerError::Storage(format!(
                "{} has some zones formatted and others not: was workers changed? zones: {found:?}",
                cfg.data_path.display()
            )))
        }
    };
    Ok(Zones { devices, known, complete, zone_bytes })
}

/// Opens every shard of a stopped server for `pfs fsck`: locks the data file,
/// recovers each zone from its log (as a start would), and returns them with
/// the lock, which must be held while they are used.
pub fn open_for_check(
    cfg: &ServerConfig,
) -> Result<(Vec<Shard<UringDevice>>, std::fs::File), ServerError> {
    use pfs_core::config::ConfigFile;
    cfg.validate().map_err(|e| ServerError::Config(e.to_string()))?;
    if !cfg.data_path.exists() {
        return Err(ServerError::Storage(format!("{} does not exist", cfg.data_path.display())));
    }
    let lock = lock_data(cfg)?;
    let Zones { devices, complete, zone_bytes, .. } = probe_zones(cfg)?;
    if !complete {
        return Err(ServerError::Storage(format!(
            "{} is not formatted (pfs mkfs formats it, as does the server's first start)",
            cfg.data_path.display()
        )));
    }
    let sopts = shard_options(cfg);
    let mut shards = Vec::with_capacity(devices.len());
    for (w, dev) in devices.into_iter().enumerate() {
        let shard = Shard::open(dev, w as u64 * zone_bytes, sopts.clone()).map_err(|e| {
            ServerError::Storage(format!("zone {w} of {}: {e}", cfg.data_path.display()))
        })?;
        shards.push(shard);
    }
    Ok((shards, lock))
}

/// Formats zone `w` of server `id` (shard `id * workers + w`; shard 0 holds the
/// root directory) with a fresh format id.
fn format_zone(
    cfg: &ServerConfig,
    dev: UringDevice,
    id: ServerId,
    w: usize,
    zone_bytes: u64,
    sopts: &ShardOptions,
) -> Result<Shard<UringDevice>, ServerError> {
    let offset = w as u64 * zone_bytes;
    let g = ShardId(id.0 * cfg.workers + w as u32);
    let mut f = FormatOptions::new(g, zone_bytes);
    f.zone_offset = offset;
    f.create_root = g.0 == 0;
    f.wal_bytes = Some(cfg.wal_size_bytes.min(zone_bytes / 8));
    log::info!("formatting zone {w} ({zone_bytes} bytes at {offset}) as shard {g}");
    Shard::format(dev, &f, sopts.clone())
        .map_err(|e| ServerError::Storage(format!("zone {w} of {}: {e}", cfg.data_path.display())))
}

/// `pfs mkfs`: formats every zone of the server `cfg` describes as server
/// `id`, so it registers as that server at its first start. A device that
/// holds pfs zones already is refused unless `force`; then everything on it is
/// lost. Returns the shards formatted.
pub fn mkfs(cfg: &ServerConfig, id: ServerId, force: bool) -> Result<Vec<ShardId>, ServerError> {
    use pfs_core::config::ConfigFile;
    cfg.validate().map_err(|e| ServerError::Config(e.to_string()))?;
    let _lock = lock_data(cfg)?;
    let (devices, zone_bytes) = match probe_zones(cfg) {
        Ok(Zones { known: Some(k), complete: true, .. }) if !force => {
            return Err(ServerError::Storage(format!(
                "{} holds the zones of server {k}: formatting loses every file on it; \
                 add --force to format anyway",
                cfg.data_path.display()
            )))
        }
        Ok(Zones { devices, zone_bytes, .. }) => (devices, zone_bytes),
        // Zones pfs cannot read (another format version, damage): with --force
        // they are formatted like any other.
        Err(ServerError::Storage(why)) if force => {
            log::warn!("formatting over what cannot be read: {why}");
            open_devices(cfg)?
        }
        Err(ServerError::Storage(why)) => {
            return Err(ServerError::Storage(format!(
                "{why}; add --force to format it anyway (everything on it is lost)"
            )))
        }
        Err(e) => return Err(e),
    };
    let sopts = shard_options(cfg);
    let shards = format_zones(cfg, devices, id, zone_bytes, &sopts)?;
    Ok(shards.iter().map(Shard::id).collect())
}

/// Formats every zone as server `id`'s: first a format intent over zone 0's
/// superblock, then zone 0 last (its superblock, written last, replaces the
/// intent), so a format cut short is known as one at the next start
/// ([`probe_zones`]). The shards in zone order.
fn format_zones(
    cfg: &ServerConfig,
    devices: Vec<UringDevice>,
    id: ServerId,
    zone_bytes: u64,
    sopts: &ShardOptions,
) -> Result<Vec<Shard<UringDevice>>, ServerError> {
    let mut devices: Vec<Option<UringDevice>> = devices.into_iter().map(Some).collect();
    if let Some(dev) = devices[0].take() {
        let g0 = ShardId(id.0 * cfg.workers);
        let dev = Shard::mark_formatting(dev, 0, g0).map_err(|e| {
            ServerError::Storage(format!("zone 0 of {}: {e}", cfg.data_path.display()))
        })?;
        devices[0] = Some(dev);
    }
    let mut shards: Vec<Option<Shard<UringDevice>>> = devices.iter().map(|_| None).collect();
    for w in (1..devices.len()).chain(0..1) {
        let dev = devices[w].take().expect("each zone once");
        shards[w] = Some(format_zone(cfg, dev, id, w, zone_bytes, sopts)?);
    }
    Ok(shards.into_iter().map(|s| s.expect("every zone formatted")).collect())
}

/// Starts a server as configured; `register_timeout` bounds the wait for the master.
pub fn start(cfg: &ServerConfig, register_timeout: Duration) -> Result<ServerHandle, ServerError> {
    use pfs_core::config::ConfigFile;
    cfg.validate().map_err(|e| ServerError::Config(e.to_string()))?;
    let key = ClusterKey::load(&cfg.key_file).map_err(|e| ServerError::Config(e.to_string()))?;
    let workers = cfg.workers as usize;
    let lock = lock_data(cfg)?;
    let Zones { devices, known, complete, zone_bytes } = probe_zones(cfg)?;
    if let Some(dev) = devices.first() {
        let (bytes, huge) = dev.registered_memory();
        let huge = huge.map_or("unknown".into(), |h| format!("{} MiB", h >> 20));
        log::info!(
            "each worker registers {} MiB of device buffers ({huge} of them in huge pages)",
            bytes >> 20
        );
    }

    let listen = resolve("listen", &cfg.listen)?;
    let mut lcfg = ListenerConfig::new(listen, key.clone());
    lcfg.credits = cfg.connection_queue_depth;
    lcfg.rdma = cfg.rdma.then(|| RdmaConfig {
        device: (!cfg.rdma_device.is_empty()).then(|| cfg.rdma_device.clone()),
        port: cfg.rdma_port,
        gid_index: cfg.rdma_gid_index,
        ..RdmaConfig::default()
    });
    // Taken (removed) before anyone connects: a crash from here on must not
    // find it at the next start.
    let clean_mark = cleanstop::mark_path(&cfg.data_path);
    let kept = clean_mark.as_deref().and_then(cleanstop::take);
    let max_connections = lcfg.max_connections;
    let mut listener = Listener::bind(lcfg).map_err(|e| ServerError::Net(e.to_string()))?;
    let addr = listener.local_addr();
    let advertise = if !cfg.advertise.is_empty() {
        cfg.advertise.clone()
    } else if addr.ip().is_unspecified() {
        return Err(ServerError::Config(format!(
            "listen = {:?} is not an address clients can reach: set advertise = \"host:port\"",
            cfg.listen
        )));
    } else {
        addr.to_string()
    };
    let master = resolve("master", &cfg.master)?;
    let (id, heartbeat) =
        register(master, &key, known, &advertise, cfg.workers, Instant::now() + register_timeout)?;
    if known.is_some_and(|k| k != id) {
        return Err(ServerError::Master(format!(
            "master gave id {id}, but the zones belong to server {}",
            known.unwrap()
        )));
    }

    let sopts = shard_options(cfg);
    let shards = if complete {
        let mut shards = Vec::with_capacity(workers);
        for (w, dev) in devices.into_iter().enumerate() {
            let shard = Shard::open(dev, w as u64 * zone_bytes, sopts.clone()).map_err(|e| {
                ServerError::Storage(format!("zone {w} of {}: {e}", cfg.data_path.display()))
            })?;
            log::info!(
                "worker {w}: recovered shard {} ({} WAL records replayed)",
                shard.id(),
                shard.stats().replayed
            );
            shards.push(shard);
        }
        shards
    } else {
        format_zones(cfg, devices, id, zone_bytes, &sopts)?
    };
    if let Some(mark) = &kept {
        let opened: Vec<(u64, u64, u64)> = shards
            .iter()
            .map(|s| (s.checkpoint_state().0, s.stats().opened_gen, s.stats().replayed))
            .collect();
        if mark.matches(&opened) {
            listener.set_boot(mark.boot);
            log::info!(
                "the last stop was clean: boot id {:016x} kept (clients' acknowledged changes \
                 are durable)",
                mark.boot
            );
        } else {
            log::warn!(
                "a clean-stop mark was left, but the zones changed since (opened {opened:?}, \
                 marked {:?}): a new boot id",
                mark.zones
            );
        }
    }
    let boot = listener.boot();
    // A clean stop that kept no file lock lost none: no grace period for
    // reclaims at this start.
    let no_locks_kept = kept.as_ref().is_some_and(|m| {
        let opened: Vec<(u64, u64, u64)> = shards
            .iter()
            .map(|s| (s.checkpoint_state().0, s.stats().opened_gen, s.stats().replayed))
            .collect();
        m.matches(&opened) && m.locks_held == Some(0)
    });
    if complete && !no_locks_kept {
        log::info!(
            "file locks: for {} ms only the locks clients held before this start are taken \
             again (they had some, or the last stop was not clean)",
            cfg.lock_lease_ms
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let fail_stop = FailStop::new(stop.clone());
    let bells: Vec<Doorbell> = (0..workers)
        .map(|_| Doorbell::new())
        .collect::<Result<_, _>>()
        .map_err(|e| ServerError::Net(e.to_string()))?;
    let bells = Arc::new(bells);
    let (mut outs, mut ins) = ring_mesh(workers, cfg.ring_depth as usize);
    let usage: Vec<Arc<UsageCell>> = (0..workers).map(|_| Arc::new(UsageCell::default())).collect();
    let wopts = WorkerOptions {
        poll_mode: cfg.poll_mode,
        idle_spin: Duration::from_micros(cfg.idle_spin_us),
        commit_interval: Duration::from_millis(50),
        token_lease: Duration::from_millis(TOKEN_LEASE_MS),
        lock_lease: Duration::from_millis(cfg.lock_lease_ms),
        restarted: complete && !no_locks_kept,
        inline_rounds: cfg.inline_rounds,
    };
    let (memcpy, mut ports) = if cfg.memcpy_threads > 0 {
        let (pool, ports) = MemcpyPool::start(
            cfg.memcpy_threads as usize,
            cfg.memcpy_queue_depth as usize,
            cfg.memcpy_threshold_bytes as usize,
            bells.clone(),
        )
        .map_err(|e| ServerError::Worker(format!("cannot start the memcpy pool: {e}")))?;
        (Some(pool), ports.into_iter().map(Some).collect::<Vec<_>>())
    } else {
        (None, (0..workers).map(|_| None).collect())
    };
    let live = Arc::new(LiveConns::new(workers, max_connections));
    let mut feeds = Vec::with_capacity(workers);
    let mut senders = Vec::with_capacity(workers);
    let mut handles = Vec::with_capacity(workers);
    for (w, shard) in shards.into_iter().enumerate().rev() {
        let (tx, rx) = sync_channel::<Link>(NEW_CONN_QUEUE);
        senders.push(tx);
        let (feed, views) = sync_channel::<View>(VIEW_QUEUE);
        feeds.push(feed);
        let worker = Worker::new(
            w as u16,
            shard,
            wopts.clone(),
            rx,
            outs.pop().expect("one per worker"),
            ins.pop().expect("one per worker"),
            bells.clone(),
            usage[w].clone(),
            stop.clone(),
            Peers::new(key.clone(), views, Some(wake_worker(&bells, w))),
            live.clone(),
            ports.pop().expect("one per worker"),
            fail_stop.clone(),
        )
        .map_err(|e| ServerError::Net(e.to_string()))?;
        let fail_stop = fail_stop.clone();
        let h = std::thread::Builder::new()
            .name(format!("pfs-worker-{w}"))
            .spawn(move || {
                pin_to_core(w);
                // A panic is a bug: the shard's memory may be anywhere. Stop the
                // whole server rather than serve with a dead shard.
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run())) {
                    Ok(r) => r.map(|shard| shard.checkpoint_state()),
                    Err(payload) => {
                        let why = format!("worker {w} panicked: {}", panic_text(&payload));
                        fail_stop.trip(why.clone());
                        Err(why)
                    }
                }
            })
            .map_err(|e| ServerError::Worker(format!("cannot start worker {w}: {e}")))?;
        handles.push(h);
    }
    senders.reverse();
    handles.reverse();
    feeds.reverse();

    let acceptor = {
        let stop = stop.clone();
        let bells = bells.clone();
        std::thread::Builder::new()
            .name("pfs-acceptor".into())
            .spawn(move || accept_loop(listener, senders, bells, stop))
            .map_err(|e| ServerError::Worker(format!("cannot start the acceptor: {e}")))?
    };
    let usage_cells = usage.clone();
    let heartbeat = {
        let stop = stop.clone();
        let advertise = advertise.clone();
        let workers = cfg.workers;
        let views = ViewFeeds { feeds, bells: bells.clone() };
        std::thread::Builder::new()
            .name("pfs-heartbeat".into())
            .spawn(move || {
                heartbeat_loop(master, key, id, advertise, workers, usage, views, stop, heartbeat)
            })
            .map_err(|e| ServerError::Worker(format!("cannot start the heartbeat: {e}")))?
    };
    log::info!("server {id} serving on {addr} (advertised as {advertise}) with {workers} workers");
    let memory = memory_bytes();
    let icache_blocks = u64::from(cfg.icache_block_count(memory));
    log::info!(
        "each worker caches up to {} inodes ({} MiB of Icache) and {} MiB of file data",
        icache_blocks * pfs_store::icache::INODES_PER_BLOCK,
        (icache_blocks * pfs_store::shard::geometry::PAGE_SIZE) >> 20,
        cfg.read_cache_bytes(memory) >> 20
    );
    Ok(ServerHandle {
        id,
        addr,
        stop,
        fail_stop,
        _lock: lock,
        bells,
        workers: handles,
        helpers: vec![acceptor, heartbeat],
        memcpy,
        clean_mark,
        boot,
        usage: usage_cells,
    })
}

/// The message a panic carried.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Hands accepted connections to workers in turn (link-reduced: each connection
/// is served by exactly one worker, whatever shard its requests are for).
fn accept_loop(
    mut listener: Listener,
    senders: Vec<SyncSender<Link>>,
    bells: Arc<Vec<Doorbell>>,
    stop: Arc<AtomicBool>,
) {
    let mut next = 0usize;
    let mut accepted = Vec::new();
    while !stop.load(Ordering::Acquire) {
        if let Err(e) = listener.accept(&mut accepted) {
            log::warn!("{e}");
        }
        for qp in accepted.drain(..) {
            let w = next % senders.len();
            next += 1;
            // A full queue blocks the acceptor: back-pressure on new connections.
            if senders[w].send(qp).is_err() {
                return;
            }
            bells[w].ring_always();
        }
        let _ = pfs_net::wait_readable(listener.wait_fd(), Some(Duration::from_millis(100)));
    }
}

/// Where the heartbeat sends each new cluster view: one queue per worker
/// (workers read it to reach other servers; no lock between them).
struct ViewFeeds {
    feeds: Vec<SyncSender<View>>,
    bells: Arc<Vec<Doorbell>>,
}

impl ViewFeeds {
    /// Sends `v` to every worker and wakes it; false when a worker's queue
    /// was full (it has not taken the views before: send again later).
    fn send(&self, v: &View) -> bool {
        let mut all = true;
        for (w, feed) in self.feeds.iter().enumerate() {
            all &= feed.try_send(v.clone()).is_ok();
            self.bells[w].ring_always();
        }
        all
    }
}

#[allow(clippy::too_many_arguments)]
fn heartbeat_loop(
    master: SocketAddr,
    key: ClusterKey,
    id: ServerId,
    advertise: String,
    workers: u32,
    usage: Vec<Arc<UsageCell>>,
    views: ViewFeeds,
    stop: Arc<AtomicBool>,
    every: Duration,
) {
    let mut rpc: Option<RpcClient> = None;
    let mut view_epoch = 0u64;
    // Until the view holds every expected server, beat fast: a worker asked
    // to reach a server it does not know yet waits for the next view.
    let mut complete = false;
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            // Short enough that a stop is seen promptly, long enough to cost nothing.
            std::thread::sleep((next - now).min(Duration::from_millis(100)));
            continue;
        }
        next = now + if complete { every } else { every.min(STARTUP_BEAT) };
        let mut total = Usage::default();
        for u in &usage {
            total.total_bytes += u.total_bytes.load(Ordering::Relaxed);
            total.used_bytes += u.used_bytes.load(Ordering::Relaxed);
            total.inodes_total += u.inodes_total.load(Ordering::Relaxed);
            total.inodes_used += u.inodes_used.load(Ordering::Relaxed);
        }
        if rpc.is_none() {
            let opts = RpcOptions { credits: 2, ..RpcOptions::default() };
            match RpcClient::connect(master, key.clone(), opts) {
                Ok(r) => rpc = Some(r),
                Err(e) => {
                    log::warn!("heartbeat: cannot reach master {master}: {e}");
                    continue;
                }
            }
        }
        let rpc_ref = rpc.as_mut().expect("connected above");
        let beat = Request::Heartbeat { server: id, usage: total };
        let frame =
            Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(beat) };
        match rpc_ref.call(&frame, Duration::from_secs(2)) {
            Ok(Frame { body: Body::Reply(Reply::Heartbeat { epoch }), .. }) => {
                if epoch != view_epoch {
                    let get = Frame {
                        request_id: RequestId(0),
                        client: ClientId(0),
                        body: Body::Request(Request::GetView),
                    };
                    if let Ok(Frame { body: Body::Reply(Reply::GetView(v)), .. }) =
                        rpc_ref.call(&get, Duration::from_secs(2))
                    {
                        // A worker that did not take the last views yet
                        // gets this one at the next beat.
                        if views.send(&v) {
                            view_epoch = v.epoch;
                            complete = v.is_complete();
                        }
                    }
                }
            }
            Ok(Frame { body: Body::Error { error, .. }, .. }) => {
                // A master that lost its state: register again under our id.
                log::warn!("heartbeat refused by master {master}: {error}; registering again");
                let req = Request::Register {
                    server: Some(id),
                    addr: advertise.clone(),
                    workers,
                    usage: total,
                };
                let frame = Frame {
                    request_id: RequestId(0),
                    client: ClientId(0),
                    body: Body::Request(req),
                };
                if let Err(e) = rpc_ref.call(&frame, Duration::from_secs(2)) {
                    log::warn!("re-register with master {master} failed: {e}");
                }
            }
            Ok(_) => log::warn!("heartbeat: unexpected reply from master {master}"),
            Err(e) => {
                log::warn!("heartbeat to master {master} failed: {e}");
                rpc = None;
            }
        }
    }
}

/// Pins the calling thread to core `n` modulo the cores it may use.
fn pin_to_core(n: usize) {
    // SAFETY: cpu_set_t is plain data; sched_{get,set}affinity only read/write it.
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0 {
            return;
        }
        let cores: Vec<usize> =
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &allowed)).collect();
        if cores.is_empty() {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cores[n % cores.len()], &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            log::warn!("cannot pin worker {n}: {}", std::io::Error::last_os_error());
        }
    }
}

/// Rings worker `w` (a connect to a peer it asked for finished).
fn wake_worker(bells: &Arc<Vec<Doorbell>>, w: usize) -> Wake {
    let bells = bells.clone();
    Arc::new(move || bells[w].ring_always())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(epoch: u64) -> View {
        View { epoch, servers_expected: 1, servers: Vec::new() }
    }

    /// The heartbeat hands each new view to every worker without a lock; a
    /// worker whose queue is full makes it report false, so the heartbeat
    /// keeps its old epoch and sends the view again at the next beat.
    #[test]
    fn a_view_reaches_every_worker_or_is_sent_again() {
        let bells: Arc<Vec<Doorbell>> =
            Arc::new((0..2).map(|_| Doorbell::new().unwrap()).collect());
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..2).map(|_| sync_channel(VIEW_QUEUE)).unzip();
        let feeds = ViewFeeds { feeds: txs, bells };
        assert!(feeds.send(&view(1)));
        assert!(feeds.send(&view(2)));
        assert!(!feeds.send(&view(3)), "two views wait in each queue: the third does not fit");
        let taken: Vec<u64> = rxs[0].try_iter().map(|v| v.epoch).collect();
        assert_eq!(taken, vec![1, 2]);
        assert!(!feeds.send(&view(3)), "worker 1 took nothing yet");
        let _ = rxs[1].try_iter().count();
        assert!(feeds.send(&view(3)));
        assert_eq!(rxs[0].try_iter().map(|v| v.epoch).last(), Some(3));
        assert_eq!(rxs[1].try_iter().map(|v| v.epoch).last(), Some(3));
    }
}
