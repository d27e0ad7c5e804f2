//! [`Cluster`]: the native client of a pfs cluster. It fetches the view from the
//! master, holds one connection per server, computes the characteristic value of
//! every request (docs/cluster.md) and sends it to the worker that owns it.
//!
//! Data: a read or write is cut at file-block boundaries; the pieces a shard
//! holds go in one request each, to the inode's home (`Read`/`Write`) or to a
//! data-only shard (`ReadData`/`WriteData`). Writes are pipelined: a write
//! returns once sent, at most `max_unfinished_writes` per open file are in
//! flight, and `flush`, `fsync` and `release` wait for all of them, then grow the
//! file's size at its home if data went elsewhere (commit consistency: what a
//! close returned from is visible to every client; only `fsync` commits).

/// `Ok($out)` when `$reply` matches `$pat`, else the error a reply of the wrong
/// kind is.
macro_rules! expect_reply {
    ($reply:expr, $pat:pat => $out:expr) => {
        match $reply {
            $pat => Ok($out),
            other => Err($crate::cluster::unexpected(other)),
        }
    };
}

mod caches;
mod commit;
mod data;
mod files;
mod locks;
pub mod placement;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_core::wire::{RenameFlags, Reply, Request, TokenMode, View, WriteRef, XattrSetMode};
use pfs_core::{
    ClientId, DirLayout, FileAttr, FileHandle, FileType, FsError, FsResult, InodeId, Route,
    RouteKey, ServerId, SetAttr, StatFs, WorkerId,
};
use pfs_net::ClusterKey;

use crate::addrs::ServerAddrs;
use crate::api::{DirListing, FileSystem, Invalidator, VersionObserver};
use crate::conn::{rpc_options, Conn, Sent};
use crate::dcache::CachedDir;
use crate::unsynced::Unsynced;
pub use caches::LookupHook;
use caches::{notification_loop, Caches};
use files::OpenFiles;
use locks::LockHomes;
use placement::Placement;

/// Longest pause between tries of a request answered `TryAgain`.
const TRY_AGAIN_MAX: Duration = Duration::from_millis(50);
/// How long a write token is asked for again every 250 µs at most, while the
/// clients it revoked acknowledge (their poll is 2 ms).
const WRITE_TOKEN_OFTEN: Duration = Duration::from_millis(10);

/// File block size of every shard (the format's, `pfs_core::BLOCK_SIZE_BYTES`).
pub const BLOCK_SIZE_BYTES: u64 = pfs_core::BLOCK_SIZE_BYTES;
/// Most files one client keeps open.
pub const OPEN_FILES_MAX: usize = 1 << 16;
/// Most inodes with changes not yet committed that one client tracks; past it,
/// the client commits everything it changed before it goes on.
pub const UNSYNCED_INODES_MAX: usize = 1 << 16;

/// How a [`Cluster`] client connects and behaves.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// The master.
    pub master: SocketAddr,
    /// The cluster key.
    pub key: ClusterKey,
    /// Time to connect, and to wait for a complete view.
    pub connect_timeout: Duration,
    /// Time a request may take before it fails (then with `EIO`).
    pub request_timeout: Duration,
    /// Writes in flight per open file.
    pub max_unfinished_writes: usize,
    /// Every write waits for its reply.
    pub strict: bool,
    /// How long a cached directory name stays valid (0: no dentry cache).
    pub dentry_ttl: Duration,
    /// Most directory names cached.
    pub dentry_cache_entries: usize,
    /// Transport to the servers: `Auto` takes shared memory for a server on this
    /// host, TCP otherwise.
    pub transport: pfs_net::TransportKind,
    /// RDMA device and sizes (`transport` Rdma).
    pub rdma: pfs_net::rdma::RdmaConfig,
    /// Slot RPC over tcp and shm (RDMA links always use it, with `rdma.slots`).
    pub slot_rpc: Option<pfs_net::SlotRpc>,
    /// How long a caller polls for its reply before it parks.
    pub reply_spin: Duration,
    /// Bytes in each ring of a shared-memory connection (a power of two).
    pub shm_ring_bytes: u32,
    /// How often a background thread checks that this client's acknowledged
    /// changes older than that are durable, so a server restart makes
    /// `fsync` report `EIO` only for recent ones (docs/reliability.md); zero:
    /// never (every change since a file's last `fsync` is reported).
    pub durable_sweep: Duration,
}

impl ClusterOptions {
    /// Defaults for `master` and `key`.
    pub fn new(master: SocketAddr, key: ClusterKey) -> ClusterOptions {
        ClusterOptions {
            master,
            key,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            max_unfinished_writes: 64,
            strict: false,
            dentry_ttl: Duration::from_secs(1),
            dentry_cache_entries: 65_536,
            transport: pfs_net::TransportKind::Auto,
            rdma: pfs_net::rdma::RdmaConfig::default(),
            slot_rpc: None,
            reply_spin: Duration::from_micros(50),
            shm_ring_bytes: pfs_net::shm::DEFAULT_RING_BYTES,
            durable_sweep: Duration::from_secs(1),
        }
    }

    /// Options from a client config file: resolves the master and loads the key
    /// file, with a message that names what failed.
    pub fn from_config(cfg: &pfs_core::ClientConfig) -> Result<ClusterOptions, String> {
        use std::net::ToSocketAddrs;
        let master = cfg
            .master
            .to_socket_addrs()
            .map_err(|e| format!("master {:?}: {e}", cfg.master))?
            .next()
            .ok_or_else(|| format!("master {:?} resolves to no address", cfg.master))?;
        let key = ClusterKey::load(&cfg.key_file).map_err(|e| e.to_string())?;
        let mut o = ClusterOptions::new(master, key);
        o.connect_timeout = Duration::from_millis(cfg.connect_timeout_ms);
        o.request_timeout = Duration::from_millis(cfg.request_timeout_ms);
        o.max_unfinished_writes = cfg.max_unfinished_writes as usize;
        o.strict = cfg.strict;
        o.dentry_ttl = Duration::from_millis(cfg.dentry_ttl_ms);
        o.reply_spin = Duration::from_micros(u64::from(cfg.reply_spin_us));
        o.shm_ring_bytes = cfg.shm_ring_kib.saturating_mul(1024);
        o.dentry_cache_entries = cfg.dentry_cache_entries as usize;
        o.transport = match cfg.transport {
            pfs_core::Transport::Auto => pfs_net::TransportKind::Auto,
            pfs_core::Transport::Tcp => pfs_net::TransportKind::Tcp,
            pfs_core::Transport::Shm => pfs_net::TransportKind::Shm,
            pfs_core::Transport::Rdma => pfs_net::TransportKind::Rdma,
        };
        o.rdma = pfs_net::rdma::RdmaConfig {
            device: (!cfg.rdma_device.is_empty()).then(|| cfg.rdma_device.clone()),
            port: cfg.rdma_port,
            gid_index: cfg.rdma_gid_index,
            slots: cfg.rpc_slots,
            ..Default::default()
        };
        o.slot_rpc = cfg
            .slot_rpc
            .then(|| pfs_net::SlotRpc { slots: cfg.rpc_slots, ..pfs_net::SlotRpc::default() });
        Ok(o)
    }
}

/// Most tries of an operation that makes a new name, each routed by the
/// directory's layout fetched anew after a shard answered `Misrouted`
/// (`Cluster::rerouting`).
const REROUTES: usize = 4;

/// Directory touches a client keeps out unanswered (`touch_parent`); past it,
/// the next one waits for the oldest.
const TOUCHES_MAX: usize = 64;

/// A touch of a directory's times at its home, sent and not yet answered.
#[derive(Clone, Copy, Debug)]
struct Touch {
    server: usize,
    worker: WorkerId,
    sent: crate::conn::Sent,
    dir: InodeId,
}

/// A client of one pfs cluster.
pub struct Cluster {
    opts: ClusterOptions,
    client: ClientId,
    /// The servers' addresses, followed when one moves.
    addrs: Arc<ServerAddrs>,
    placement: Placement,
    conns: Arc<Vec<Conn>>,
    /// Requests sent to each shard (`server * workers + worker`).
    sent: Box<[AtomicU64]>,
    /// Touches of directories' times sent and not yet answered.
    touches: Mutex<VecDeque<Touch>>,
    files: OpenFiles,
    caches: Arc<Caches>,
    /// Shards where this client holds file locks, renewed by the notification thread.
    locks: Arc<LockHomes>,
    /// Acknowledged changes no commit covered yet, for fsync and fsyncdir.
    unsynced: Arc<Mutex<Unsynced>>,
    /// Told of this client's data changes at homes (`set_version_observer`).
    versions: std::sync::OnceLock<VersionObserver>,
    stop: Arc<AtomicBool>,
    notifier: Option<std::thread::JoinHandle<()>>,
    /// The background check of old acknowledged changes (`durable_sweep`).
    sweeper: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.notifier.take() {
            let _ = t.join();
        }
        if let Some(t) = self.sweeper.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("client", &self.client)
            .field("servers", &self.placement.servers())
            .field("workers", &self.placement.workers())
            .finish_non_exhaustive()
    }
}

/// Fetches the view from the master once.
pub fn fetch_view(master: SocketAddr, key: &ClusterKey, timeout: Duration) -> FsResult<View> {
    let conn = Conn::connect(master, key.clone(), rpc_options(ClientId(0), timeout, timeout))
        .map_err(|e| FsError::Io(format!("cannot reach the master at {master}: {e}")))?;
    match conn.call(Request::GetView, 0, timeout)? {
        Reply::GetView(v) => Ok(v),
        other => Err(FsError::Io(format!("master {master} answered {:?}", other.opcode()))),
    }
}

/// Attributes for unit tests: inode `ino` of kind `kind`, the rest zero.
#[cfg(test)]
pub(crate) fn test_attr(ino: u64, kind: FileType) -> FileAttr {
    FileAttr {
        ino: InodeId(ino),
        size: 0,
        blocks: 0,
        atime_ns: 0,
        mtime_ns: 0,
        ctime_ns: 0,
        kind,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
    }
}

/// The error for a reply of the wrong kind (a bug of the peer, or of this client).
fn unexpected(reply: Reply) -> FsError {
    FsError::Io(format!("unexpected reply {:?}", reply.opcode()))
}

/// `pause` moved by a random amount within a half of it either way: two
/// clients refused (`TryAgain`) by each other's operation at the same moment
/// (two renames each onto the other's source name) do not retry in step for
/// ever.
fn jittered(pause: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // Each RandomState is keyed anew (std's per-thread keys move on).
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = pause.as_nanos() as u64;
    h.write_u64(nanos);
    Duration::from_nanos(nanos / 2 + h.finish() % (nanos + 1))
}

/// A random, non-zero client id (0 means "no client": it would get no token
/// invalidations). Random rather than derived from pid and time so two clients
/// started together on different hosts do not collide.
fn client_id() -> ClientId {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's randomness once per process, and the
    // extra counter separates clients made in one process.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
        h.write_u32(std::process::id());
        let id = h.finish() as u32;
        if id != 0 {
            return ClientId(id);
        }
    }
}

impl Cluster {
    /// Connects: fetches the view (waiting up to `connect_timeout` until every
    /// expected server registered) and connects to every server.
    pub fn connect(opts: ClusterOptions) -> FsResult<Cluster> {
        let deadline = Instant::now() + opts.connect_timeout;
        let view = loop {
            let v = fetch_view(opts.master, &opts.key, opts.connect_timeout)?;
            if v.is_complete() {
                break v;
            }
            if Instant::now() >= deadline {
                return Err(FsError::Io(format!(
                    "the cluster is not complete: {} of {} servers registered with the master at {}",
                    v.servers.len(),
                    v.servers_expected,
                    opts.master
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let client = client_id();
        let placement = Placement::new(view.servers.len() as u32, view.servers[0].workers, client);
        let addrs = Arc::new(ServerAddrs::new(opts.master, opts.key.clone(), view.clone()));
        let root_home = placement.home(InodeId::ROOT).0 .0 as usize;
        let mut conns = Vec::with_capacity(view.servers.len());
        for (i, s) in view.servers.iter().enumerate() {
            let addr: SocketAddr = s.addr.parse().map_err(|_| {
                FsError::Io(format!("server {} has address {:?}, not ip:port", s.id, s.addr))
            })?;
            let mut ro = rpc_options(client, opts.connect_timeout, opts.request_timeout);
            ro.connect.transport = opts.transport;
            ro.connect.rdma = opts.rdma.clone();
            ro.connect.slot_rpc = opts.slot_rpc;
            ro.connect.ring_bytes = opts.shm_ring_bytes;
            let conn = match pfs_net::RpcClient::connect(addr, opts.key.clone(), ro.clone()) {
                Ok(rpc) => Conn::from(rpc),
                // A server that is down now (restarting, or moving to another
                // address) is reached once it is back: its requests wait for
                // it within their timeout, as after a restart, and fail with
                // EIO past it. The rest of the namespace is usable meanwhile.
                // The root's home must answer now: without it nothing is
                // reachable, and the caller (a mount) should hear so at once.
                Err(e) if e.is_unreachable() && i != root_home => {
                    log::warn!(
                        "server {} at {addr} cannot be reached now ({e}): its requests will \
                         connect when it is back",
                        s.id
                    );
                    Conn::connect_later(addr, opts.key.clone(), ro)
                }
                Err(e) => {
                    return Err(FsError::Io(format!(
                        "cannot connect to server {} at {addr}: {e}",
                        s.id
                    )))
                }
            };
            conns.push(conn.follow(i, addrs.clone()).reply_spin(opts.reply_spin));
        }
        let conns = Arc::new(conns);
        let caches = Arc::new(Caches::new(opts.dentry_cache_entries));
        let locks = Arc::new(LockHomes::default());
        let stop = Arc::new(AtomicBool::new(false));
        let notifier = {
            let (conns, caches, stop) = (conns.clone(), caches.clone(), stop.clone());
            let locks = locks.clone();
            let timeout = opts.request_timeout;
            std::thread::Builder::new()
                .name("pfs-notify".into())
                .spawn(move || notification_loop(conns, caches, &locks, stop, placement, timeout))
                .map_err(|e| FsError::Io(format!("cannot start the notification thread: {e}")))?
        };
        let unsynced = Arc::new(Mutex::new(Unsynced::new(UNSYNCED_INODES_MAX)));
        let sweeper = match opts.durable_sweep.is_zero() {
            true => None,
            false => {
                let (conns, unsynced, stop) = (conns.clone(), unsynced.clone(), stop.clone());
                let (period, timeout) = (opts.durable_sweep, opts.request_timeout);
                let t = std::thread::Builder::new()
                    .name("pfs-durable".into())
                    .spawn(move || {
                        commit::durable_sweeps(&conns, &unsynced, &stop, period, timeout)
                    })
                    .map_err(|e| FsError::Io(format!("cannot start the durability thread: {e}")))?;
                Some(t)
            }
        };
        let shards = placement.servers() as usize * placement.workers() as usize;
        let c = Cluster {
            client,
            addrs,
            placement,
            conns,
            sent: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            touches: Mutex::new(VecDeque::new()),
            files: OpenFiles::new(OPEN_FILES_MAX),
            caches,
            locks,
            unsynced,
            versions: std::sync::OnceLock::new(),
            stop,
            notifier: Some(notifier),
            sweeper,
            opts,
        };
        c.layout_of(InodeId::ROOT)?;
        Ok(c)
    }

    /// Each server connection as it is now, in view order (`None`: reconnecting).
    pub fn links(&self) -> Vec<Option<crate::conn::LinkInfo>> {
        self.conns.iter().map(|c| c.link_info()).collect()
    }

    /// Requests this client sent to each shard so far, indexed `server *
    /// workers + worker`: how many round trips an operation costs, and where.
    pub fn requests_sent(&self) -> Vec<u64> {
        self.sent.iter().map(|n| n.load(Ordering::Relaxed)).collect()
    }

    /// Requests answered by rounds of a parked worker that this client's own
    /// threads ran (a server in this process with `inline_rounds`,
    /// [`pfs_net::inline`]), over all connections.
    pub fn inline_answers(&self) -> u64 {
        self.conns.iter().map(|c| c.inline_answers()).sum()
    }

    /// How far `names` lead from directory `parent` through this client's
    /// dentry cache alone: the last directory reached and how many names led
    /// there (`(parent, 0)` when the first is not cached). Each step is what
    /// a [`FileSystem::lookup`] would answer from the cache without a
    /// request; all are read under one lock and one clock reading
    /// (libpfs_preload's path walk).
    pub fn cached_dirs<'a>(
        &self,
        mut parent: InodeId,
        names: impl IntoIterator<Item = &'a [u8]>,
    ) -> (InodeId, usize) {
        let mut names = names.into_iter().peekable();
        if self.opts.dentry_ttl.is_zero() || names.peek().is_none() {
            return (parent, 0);
        }
        let now = Instant::now();
        let mut dcache = self.caches.dcache.lock().expect("dcache lock");
        let mut held = 0;
        for name in names {
            let Some(d) = dcache.get(parent, name, now) else { break };
            parent = d.attr.ino;
            held += 1;
        }
        (parent, held)
    }

    /// Whether a listing of `dir` after any name goes on in name order from
    /// there, as far as this client knows `dir`'s layout without asking: a
    /// regular directory (one shard), or a bigdir of a cluster of one shard.
    /// A bigdir over several shards lists them one after the other, and a
    /// resume name picks the shard it hashes to.
    pub fn lists_in_name_order(&self, dir: InodeId) -> bool {
        self.caches.layout(dir).is_some_and(|l| {
            l.dir == DirLayout::Regular
                || self.placement.servers() as u64 * self.placement.workers() as u64 == 1
        })
    }

    /// Dentry cache (hits, misses) so far.
    pub fn dentry_cache_stats(&self) -> (u64, u64) {
        self.caches.dcache.lock().expect("dcache lock").counters()
    }

    /// The view this client routes by, as last fetched from the master
    /// (the servers' addresses follow it, [`crate::addrs`]).
    pub fn view(&self) -> View {
        self.addrs.view()
    }

    fn route(&self, key: RouteKey<'_>) -> Route {
        self.placement.route(key)
    }

    fn send_to(&self, server: ServerId, worker: WorkerId, req: Request) -> FsResult<(usize, Sent)> {
        let s = server.0 as usize;
        let sent = self.conns[s].send(req, worker.0 as u16, self.opts.request_timeout)?;
        self.count_sent(server, worker);
        Ok((s, sent))
    }

    /// Counts a request sent to a shard ([`requests_sent`](Self::requests_sent)).
    pub(crate) fn count_sent(&self, server: ServerId, worker: WorkerId) {
        let shard = server.0 as usize * self.placement.workers() as usize + worker.0 as usize;
        self.sent[shard].fetch_add(1, Ordering::Relaxed);
    }

    /// [`send_to`](Self::send_to) of a write of the caller's bytes, copied
    /// once, into the frame.
    fn send_write_to(
        &self,
        server: ServerId,
        worker: WorkerId,
        write: &WriteRef<'_>,
    ) -> FsResult<(usize, Sent)> {
        let s = server.0 as usize;
        let sent = self.conns[s].send_write(write, worker.0 as u16, self.opts.request_timeout)?;
        let shard = s * self.placement.workers() as usize + worker.0 as usize;
        self.sent[shard].fetch_add(1, Ordering::Relaxed);
        Ok((s, sent))
    }

    /// Sends `req` to a shard and waits; `TryAgain` (a full table, an rmdir
    /// deciding on the directory) is retried with back-off within the timeout.
    /// A change it acknowledged is noted as not yet durable (`unsynced`).
    fn call_to(&self, server: ServerId, worker: WorkerId, req: Request) -> FsResult<Reply> {
        self.call_noting(server, worker, req, &[])
    }

    /// [`call_to`](Self::call_to) that also notes a change to `also` (an inode
    /// the request does not name, such as the file a rename moves).
    fn call_noting(
        &self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
        also: &[InodeId],
    ) -> FsResult<Reply> {
        let start = Instant::now();
        let deadline = start + self.opts.request_timeout;
        let mut pause = Duration::from_micros(100);
        // A write token waits for other clients' acknowledgments, which come
        // within their notification poll (2 ms): asked again often rather
        // than late for a while (doubling pauses made a rename 3 ms instead
        // of 1-2), then less often (a restarted server's grace, a client
        // that died: up to a lease).
        let write_token = matches!(req, Request::TokenAcquire { mode: TokenMode::Write, .. });
        let mutation = req.is_mutation();
        let mut resent = false;
        loop {
            let s = server.0 as usize;
            let waited =
                self.conns[s].exchange(req.clone(), worker.0 as u16, self.opts.request_timeout)?;
            self.count_sent(server, worker);
            let answer = match waited {
                crate::conn::Waited::Answer(a) => a,
                // A read changes nothing: after a dropped connection (a
                // restarted server) it goes once more, on the new connection,
                // instead of failing the first call after a restart with EIO.
                crate::conn::Waited::Dropped(_) if !mutation && !resent => {
                    resent = true;
                    continue;
                }
                crate::conn::Waited::Dropped(e) => Err(e),
            };
            match answer {
                Err(FsError::TryAgain) if Instant::now() + pause < deadline => {
                    std::thread::sleep(jittered(pause));
                    let often = write_token && start.elapsed() < WRITE_TOKEN_OFTEN;
                    let most = if often { Duration::from_micros(250) } else { TRY_AGAIN_MAX };
                    pause = (pause * 2).min(most);
                }
                Ok((reply, boot)) => {
                    if mutation {
                        let inos = commit::dirtied(&req, &reply);
                        self.note_unsynced(
                            inos.as_slice().iter().chain(also),
                            server.0,
                            worker.0,
                            boot,
                        );
                    }
                    return Ok(reply);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn call(&self, key: RouteKey<'_>, req: Request) -> FsResult<Reply> {
        let r = self.route(key);
        self.call_to(r.server, r.proc_worker, req)
    }

    fn call_home(&self, ino: InodeId, req: Request) -> FsResult<Reply> {
        self.call(RouteKey::Inode(ino), req)
    }

    fn dentry_key<'a>(&self, parent: InodeId, name: &'a [u8]) -> FsResult<RouteKey<'a>> {
        if name.len() > pfs_core::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let layout = self.parent_layout(parent)?.dir;
        Ok(RouteKey::Dentry { parent, layout, name })
    }

    /// The layouts of directory `parent`, to look up, make or remove a name
    /// in it: `Stale` when its home no longer has it (inode numbers are never
    /// reused: it was removed since the caller learnt its name).
    fn parent_layout(&self, parent: InodeId) -> FsResult<pfs_core::wire::InodeLayout> {
        match self.layout_of(parent) {
            Err(FsError::NotFound) => Err(FsError::Stale),
            r => r,
        }
    }

    fn entry_attr(&self, reply: Reply) -> FsResult<FileAttr> {
        match reply {
            // nlink 0: the name moved here by a rename, the inode is at its home.
            Reply::Lookup(e) if e.attr.nlink == 0 => {
                let ino = e.attr.ino;
                let attr = self.getattr(ino)?;
                self.caches.forget_layout(ino);
                self.layout_of(ino)?;
                Ok(attr)
            }
            Reply::Lookup(e) | Reply::Mkdir(e) | Reply::Mknod(e) | Reply::Symlink(e) => {
                self.caches.remember_layout(e.attr.ino, e.layout);
                if e.attr.kind == FileType::Regular {
                    self.caches.found_by_lookup(e.attr.ino);
                }
                Ok(e.attr)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Makes the new entry `name` in `parent` with the request `req` makes
    /// for each try (mknod, mkdir, symlink) on the name's shard; its attributes.
    fn add_entry(
        &self,
        parent: InodeId,
        name: &[u8],
        req: impl Fn() -> FsResult<Request>,
    ) -> FsResult<FileAttr> {
        self.rerouting(&[parent], || {
            let at = self.route(self.dentry_key(parent, name)?);
            let reply = self.call_to(at.server, at.proc_worker, req()?)?;
            self.touch_parent(parent, &at);
            self.entry_attr(reply)
        })
    }

    /// Runs `op`, which routes new names in `dirs` by their layouts as this
    /// client cached them, again with the layouts fetched anew while a shard
    /// answers `Misrouted`: the layout of one of them changed since
    /// (`setxattr` of `user.pfs.dir_layout`, docs/cluster.md). `TryAgain`
    /// after [`REROUTES`] tries.
    ///
    /// A shard that answers `Stale` knows one of `dirs` was removed since this
    /// client learnt its name: every cached name leading to it goes, so the
    /// caller's next walk (the kernel's, on `ESTALE`) asks the servers.
    fn rerouting<T>(&self, dirs: &[InodeId], mut op: impl FnMut() -> FsResult<T>) -> FsResult<T> {
        for _ in 0..REROUTES {
            match op() {
                Err(FsError::Misrouted) => {
                    for &d in dirs {
                        self.caches.forget_layout(d);
                    }
                }
                Err(FsError::Stale) => {
                    for &d in dirs {
                        self.caches.forget_removed_dir(d);
                    }
                    return Err(FsError::Stale);
                }
                r => return r,
            }
        }
        Err(FsError::TryAgain)
    }

    /// One try of [`FileSystem::rename`], routed by the layouts as cached.
    fn rename_once(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        let from = self.route(self.dentry_key(parent, name)?);
        let to = self.route(self.dentry_key(new_parent, new_name)?);
        let exchange = flags.contains(RenameFlags::EXCHANGE);
        // A directory moved to another parent must not go into its own
        // subtree. The check walks the parents up, and two clients that each
        // moved a directory under the other could both pass it: such moves
        // take the cluster's rename lock, then look the names up again and
        // check under it (only they do: every other rename goes on).
        let mut lock = None;
        let (_tokens, source, target) = loop {
            // Either name may be a directory others cache: take both write tokens.
            let tokens = (self.write_token(parent)?, self.write_token(new_parent)?);
            let source = self.lookup(parent, name)?;
            let target = self.lookup(new_parent, new_name);
            let is_dir = |a: &FileAttr| a.kind == FileType::Directory;
            let moves_dir = parent != new_parent
                && (is_dir(&source) || exchange && target.as_ref().is_ok_and(is_dir));
            if !moves_dir || lock.is_some() {
                break (tokens, source, target);
            }
            drop(tokens);
            lock = Some(self.rename_lock()?);
        };
        if parent != new_parent {
            if source.kind == FileType::Directory {
                self.refuse_own_subtree(source.ino, new_parent)?;
            }
            match &target {
                Ok(t) if exchange && t.kind == FileType::Directory => {
                    self.refuse_own_subtree(t.ino, parent)?
                }
                _ => {}
            }
        }
        // A directory replaced by a rename must be empty. The target's shard only
        // sees its own slice of a bigdir, so the client holds it on every shard
        // of its entries first: each refuses if it has one, and takes no new
        // one until the hold is dropped, after the rename.
        let mut target_hold = if exchange {
            None
        } else {
            if let Ok(t) = &target {
                // Two names of one file (hard links): POSIX says do nothing. The
                // shards would not see it when the names live on different ones.
                if source.ino == t.ino {
                    return if flags.contains(RenameFlags::NOREPLACE) {
                        Err(FsError::Exists)
                    } else {
                        Ok(())
                    };
                }
            }
            match &target {
                Ok(t) if t.kind == FileType::Directory => {
                    Some((self.write_token(t.ino)?, self.hold_dir(t.ino)?))
                }
                _ => None,
            }
        };
        let (name, new_name) = (name.to_vec(), new_name.to_vec());
        let req = if (from.server, from.proc_worker) == (to.server, to.proc_worker) {
            Request::Rename { parent, name, new_parent, new_name, flags }
        } else {
            // The source's shard coordinates an atomic two-shard rename.
            Request::RenameCross {
                parent,
                name,
                new_parent,
                new_name,
                flags,
                target_server: to.server,
                target_worker: to.proc_worker,
            }
        };
        // The moved file's fsync covers its new name too (as for a new file).
        // A replaced file is freed by the shards as after an unlink, and the
        // parents' link counts follow (follow-ups, docs/cluster.md).
        expect_reply!(self.call_noting(from.server, from.proc_worker, req, &[source.ino])?, Reply::Rename { .. } | Reply::RenameCross { .. } => ())?;
        // The replaced directory is gone: its shards are told as they let it go.
        if let Some((_, hold)) = target_hold.as_mut() {
            hold.release = TokenMode::Gone;
        }
        self.touch_parent(parent, &from);
        if new_parent != parent {
            self.touch_parent(new_parent, &to);
        }
        Ok(())
    }

    /// Updates the times of `dir` at its home after one of its entries changed
    /// on the shard `at`, when that is not the home (a bigdir name away from
    /// the directory's inode), so a `stat` right after sees them. A change of
    /// its link count travels from that shard as a follow-up, durable with the
    /// change (docs/cluster.md). A failure here (the directory removed
    /// meanwhile, a lost server) leaves its times stale: logged, not returned.
    fn touch_parent(&self, dir: InodeId, at: &Route) {
        if self.placement.is_home(dir, at) {
            return;
        }
        // Sent without waiting: a later request of this client to the home
        // travels the same connection to the same worker, after it, so a
        // `stat` right after sees the times; `fsyncdir` reaps it first.
        let (server, worker) = self.placement.home(dir);
        let mut touches = self.touches.lock().expect("touches lock");
        match self.send_to(server, worker, Request::AdjustDir { dir, nlink_delta: 0 }) {
            Ok((s, sent)) => touches.push_back(Touch { server: s, worker, sent, dir }),
            Err(e) => log::warn!("updating directory {dir} after a change elsewhere: {e}"),
        }
        self.reap_touches(&mut touches, false);
    }

    /// Takes the answers of directory touches that came (all of them, waiting,
    /// with `all`, or while more than `TOUCHES_MAX` are out), noting each as
    /// an unsynced change of its directory.
    fn reap_touches(&self, touches: &mut VecDeque<Touch>, all: bool) {
        while let Some(t) = touches.front().copied() {
            let conn = &self.conns[t.server];
            let answer = if all || touches.len() > TOUCHES_MAX {
                Some(conn.wait_answer(t.sent))
            } else {
                conn.try_answer(t.sent)
            };
            let Some(answer) = answer else { break };
            touches.pop_front();
            let dir = t.dir;
            let result = match answer {
                crate::conn::Waited::Answer(a) => a,
                crate::conn::Waited::Dropped(e) => Err(e),
            };
            match result {
                Ok((Reply::AdjustDir, boot)) => {
                    self.note_unsynced(&[dir], t.server as u32, t.worker.0, boot)
                }
                Ok((other, _)) => log::warn!("updating directory {dir}: {}", unexpected(other)),
                Err(FsError::NotFound) => {}
                // An rmdir of the directory is deciding: ask again, waiting.
                Err(FsError::TryAgain) => {
                    if let Err(e) = self.call_home(dir, Request::AdjustDir { dir, nlink_delta: 0 })
                    {
                        log::warn!("updating directory {dir} after a change elsewhere: {e}");
                    }
                }
                Err(e) => log::warn!("updating directory {dir} after a change elsewhere: {e}"),
            }
        }
    }

    /// Waits for every directory touch still out (before an `fsyncdir`).
    fn flush_touches(&self) {
        let mut touches = self.touches.lock().expect("touches lock");
        self.reap_touches(&mut touches, true);
    }

    /// Up to `max` entries of `dir` after `after`, with the children's
    /// attributes when `plus` (from the shards that hold them).
    fn list(
        &self,
        dir: InodeId,
        after: Option<&[u8]>,
        max: usize,
        plus: bool,
    ) -> FsResult<Vec<DirListing>> {
        // A shard where the cached layout would miss names (it changed since)
        // answers `Misrouted`: list again by the layout fetched anew.
        self.rerouting(&[dir], || self.list_by_cached_layout(dir, after, max, plus))
    }

    /// One try of [`list`](Self::list), by the layout as cached.
    fn list_by_cached_layout(
        &self,
        dir: InodeId,
        after: Option<&[u8]>,
        max: usize,
        plus: bool,
    ) -> FsResult<Vec<DirListing>> {
        let layout = self.layout_of(dir)?.dir;
        let shards: Vec<(ServerId, WorkerId)> = match layout {
            DirLayout::Regular => {
                vec![self.placement.home(dir)]
            }
            DirLayout::BigDir => self.placement.all_shards().collect(),
        };
        // Resume on the shard that holds `after` (a name's shard follows from the
        // name), then go on in shard order.
        let (mut i, mut resume) = match after {
            None => (0, Vec::new()),
            Some(name) => {
                let r = self.route(RouteKey::Dentry { parent: dir, layout, name });
                let i = shards.iter().position(|&s| s == (r.server, r.proc_worker)).unwrap_or(0);
                (i, name.to_vec())
            }
        };
        let mut out = Vec::new();
        let max = max.max(1);
        while i < shards.len() && out.len() < max {
            let (s, w) = shards[i];
            let want = (max - out.len()).min(pfs_core::wire::READDIR_MAX_ENTRIES);
            let req = Request::ReadDir {
                ino: dir,
                after: std::mem::take(&mut resume),
                max_entries: want as u32,
                max_bytes: 1 << 20,
                plus,
                layout,
            };
            match self.call_to(s, w, req)? {
                Reply::ReadDir { entries, eof } => {
                    let last = entries.last().map(|e| e.name.clone());
                    let listed = entries.into_iter().map(|e| DirListing {
                        name: e.name,
                        ino: e.ino,
                        kind: e.kind,
                        attr: e.attr,
                    });
                    if out.is_empty() {
                        out = listed.collect();
                    } else {
                        out.extend(listed);
                    }
                    match (eof, last) {
                        (false, Some(name)) => resume = name,
                        _ => i += 1,
                    }
                }
                other => return Err(unexpected(other)),
            }
        }
        Ok(out)
    }

    /// Caches directory `attr`, found as `name` in `parent`, under a read token
    /// on `parent` (only names of directories are cached). A reply counts only
    /// if the token covered its lookup from before it was sent and no token was
    /// revoked since `mark`: a lookup answered before the token was taken may
    /// predate a whole write-token cycle of another client, which never told
    /// this one (it held nothing then). Such a name is looked up once more,
    /// under the token.
    fn cache_dir_name(
        &self,
        parent: InodeId,
        name: &[u8],
        mut attr: FileAttr,
        covered: bool,
        mut mark: u64,
    ) -> FsResult<()> {
        if !covered {
            // Marked before the token is taken: a revocation of the new token
            // that arrives before the second lookup is sent is counted too.
            mark = self.caches.revocations();
        }
        let Some(expires) = self.read_token(parent)? else { return Ok(()) };
        if !covered {
            let key = self.dentry_key(parent, name)?;
            attr = match self.call(key, Request::Lookup { parent, name: name.to_vec() }) {
                Ok(reply) => match self.entry_attr(reply) {
                    Ok(a) if a.kind == FileType::Directory => a,
                    // Changed since the first answer: nothing to cache.
                    _ => return Ok(()),
                },
                Err(_) => return Ok(()),
            };
        }
        if !self.unrevoked_since(mark) {
            return Ok(());
        }
        let layout = self.layout_of(attr.ino)?.dir;
        let until = expires.min(Instant::now() + self.opts.dentry_ttl);
        self.caches.dcache.lock().expect("dcache lock").insert(
            parent,
            name,
            CachedDir { attr, layout },
            until,
        );
        Ok(())
    }

    /// Refuses (`EINVAL`) to move directory `dir` under `under` when `under` is
    /// `dir` or inside it: that would make a cycle the tree cannot reach. The
    /// shards see only their own part of the path, so the client walks the
    /// parents of `under` up to the root, as Linux's VFS does for local file
    /// systems (a concurrent rename of an ancestor can still slip past).
    fn refuse_own_subtree(&self, dir: InodeId, under: InodeId) -> FsResult<()> {
        let mut p = under;
        // Deeper than any path a kernel resolves: stop looking.
        for _ in 0..4096 {
            if p == dir {
                return Err(FsError::Invalid("cannot move a directory into itself".into()));
            }
            if p == InodeId::ROOT {
                return Ok(());
            }
            p = match self.call_home(p, Request::GetParent { ino: p }) {
                Ok(Reply::GetParent { parent }) => parent,
                Ok(other) => return Err(unexpected(other)),
                // Removed meanwhile: nothing above it to move into.
                Err(FsError::NotFound) => return Ok(()),
                Err(e) => return Err(e),
            };
        }
        Ok(())
    }
}

impl Cluster {
    /// [`FileSystem::lookup`], and with `with_data` the found file's bytes
    /// when its shard holds all of them in memory and they are few
    /// (`LookupData`); never when this client had writes of it to publish
    /// (the server's copy may predate them).
    fn lookup_with(
        &self,
        parent: InodeId,
        name: &[u8],
        with_data: bool,
    ) -> FsResult<(FileAttr, Option<Vec<u8>>)> {
        let caching = !self.opts.dentry_ttl.is_zero();
        if caching {
            let hit =
                self.caches.dcache.lock().expect("dcache lock").get(parent, name, Instant::now());
            if let Some(d) = hit {
                return Ok((d.attr, None));
            }
        }
        // Whether a read token covered the lookup from before it was sent (the
        // mark first: a revocation between the two is counted).
        let mark = self.caches.revocations();
        let covered = caching && self.caches.read_token(parent, Instant::now()).is_some();
        let (reply, data) = self.rerouting(&[parent], || {
            let key = self.dentry_key(parent, name)?;
            let name = name.to_vec();
            Ok(if with_data {
                match self.call(key, Request::LookupData { parent, name })? {
                    Reply::LookupData { entry, data } => (Reply::Lookup(entry), data),
                    other => return Err(unexpected(other)),
                }
            } else {
                (self.call(key, Request::Lookup { parent, name })?, None)
            })
        })?;
        let mut attr = self.entry_attr(reply)?;
        let mut data =
            data.filter(|d| attr.kind == FileType::Regular && d.len() as u64 == attr.size);
        if attr.kind == FileType::Regular && self.publish_writes(attr.ino)? {
            attr = self.getattr(attr.ino)?;
            data = None;
        }
        if caching && attr.kind == FileType::Directory {
            self.after_lookup(parent, name);
            self.cache_dir_name(parent, name, attr, covered, mark)?;
        }
        Ok((attr, data))
    }
}

/// A read-only open right after the lookup that found its file at the home
/// (the kernel's `LOOKUP` then `OPEN` of one `open(2)`) sends nothing more:
/// the file existed this long ago. Any other open asks the home again (a
/// second open of a name the kernel still holds, perhaps of a file another
/// node replaced since).
const OPEN_TRUSTS_LOOKUP: Duration = Duration::from_millis(20);

impl FileSystem for Cluster {
    fn lookup(&self, parent: InodeId, name: &[u8]) -> FsResult<FileAttr> {
        Ok(self.lookup_with(parent, name, false)?.0)
    }

    fn lookup_data(&self, parent: InodeId, name: &[u8]) -> FsResult<(FileAttr, Option<Vec<u8>>)> {
        self.lookup_with(parent, name, true)
    }

    fn getattr(&self, ino: InodeId) -> FsResult<FileAttr> {
        self.publish_writes(ino)?;
        expect_reply!(self.call_home(ino, Request::GetAttr { ino })?, Reply::GetAttr(a) => a)
    }

    fn setattr(&self, ino: InodeId, set: &SetAttr) -> FsResult<FileAttr> {
        // Writes still in flight land before a cut, not after it; and the
        // reply's size (which the kernel takes) counts this client's writes.
        self.publish_writes(ino)?;
        let attr = expect_reply!(self.call_home(ino, Request::SetAttr { ino, set: *set })?, Reply::SetAttr(a) => a)?;
        if attr.kind == FileType::Directory {
            // A cached lookup of this directory would hand the old mode back,
            // and its cached layouts the old set-group-ID group.
            self.caches.dcache.lock().expect("dcache lock").invalidate_ino(ino);
            self.caches.forget_layout(ino);
        }
        // Data past a cut on other shards is freed by the home (a follow-up)
        // before it answers.
        if set.size.is_some() {
            // Sizes the handles learned before are wrong now (reads clamp to them).
            for file in self.files.of_ino(ino) {
                file.state.lock().expect("open file lock").size = None;
            }
        }
        Ok(attr)
    }

    fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
        flags: u32,
    ) -> FsResult<(FileAttr, FileHandle)> {
        let reply = self.rerouting(&[parent], || {
            let key = self.dentry_key(parent, name)?;
            let at = self.route(key);
            let parent_layout = self.parent_layout(parent)?;
            let layout = parent_layout.file;
            let gid = parent_layout.group.unwrap_or(gid);
            let req =
                Request::Create { parent, name: name.to_vec(), perm, uid, gid, flags, layout };
            Ok((at, self.call_to(at.server, at.proc_worker, req)?))
        })?;
        match reply {
            (at, Reply::Create { entry, .. }) => {
                self.touch_parent(parent, &at);
                self.caches.remember_layout(entry.attr.ino, entry.layout);
                let fh = self.files.open(entry.attr.ino, entry.layout.file, Some(0))?;
                Ok((entry.attr, fh))
            }
            (_, other) => Err(unexpected(other)),
        }
    }

    fn mknod(
        &self,
        parent: InodeId,
        name: &[u8],
        kind: FileType,
        perm: u16,
        uid: u32,
        gid: u32,
        rdev: u32,
    ) -> FsResult<FileAttr> {
        self.add_entry(parent, name, || {
            let gid = self.parent_layout(parent)?.group.unwrap_or(gid);
            Ok(Request::Mknod { parent, name: name.to_vec(), kind, perm, uid, gid, rdev })
        })
    }

    fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        // The layout is fetched anew for each try: a directory made with the
        // parent's old layout after a change would keep it.
        self.add_entry(parent, name, || {
            let layout = self.parent_layout(parent)?;
            // A set-group-ID parent: its group, and the bit, as Linux gives them.
            let (gid, perm) = match layout.group {
                Some(group) => (group, perm | 0o2000),
                None => (gid, perm),
            };
            Ok(Request::Mkdir { parent, name: name.to_vec(), perm, uid, gid, layout })
        })
    }

    fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        self.add_entry(parent, name, || {
            let gid = self.parent_layout(parent)?.group.unwrap_or(gid);
            let target = target.to_vec();
            Ok(Request::Symlink { parent, name: name.to_vec(), target, uid, gid })
        })
    }

    fn link(&self, ino: InodeId, new_parent: InodeId, new_name: &[u8]) -> FsResult<FileAttr> {
        let kind = self.getattr(ino)?.kind;
        if kind == FileType::Directory {
            return Err(FsError::NotPermitted);
        }
        let req = Request::Link { ino, kind, new_parent, new_name: new_name.to_vec() };
        // The new name's shard counts the link in the same operation when the
        // inode lives there, and otherwise by a follow-up to its home that it
        // waits for before answering: `NotFound` when the home refused it (the
        // file was removed first) and the new name went again.
        let (to, reply) = self.rerouting(&[new_parent], || {
            let to = self.route(self.dentry_key(new_parent, new_name)?);
            Ok((to, self.call_to(to.server, to.proc_worker, req.clone())?))
        })?;
        match reply {
            Reply::Link(e) => {
                self.touch_parent(new_parent, &to);
                if e.attr.nlink == 0 {
                    // Counted at the home: ask there.
                    return self.getattr(ino);
                }
                Ok(e.attr)
            }
            other => Err(unexpected(other)),
        }
    }

    fn readlink(&self, ino: InodeId) -> FsResult<Vec<u8>> {
        expect_reply!(self.call_home(ino, Request::ReadLink { ino })?, Reply::ReadLink(t) => t)
    }

    fn unlink(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        // The name's shard frees what lives elsewhere (the inode at its home
        // when the name was moved, data on other shards) by follow-ups.
        let (route, reply) = self.rerouting(&[parent], || {
            let route = self.route(self.dentry_key(parent, name)?);
            let req = Request::Unlink { parent, name: name.to_vec() };
            Ok((route, self.call_to(route.server, route.proc_worker, req)?))
        })?;
        match reply {
            Reply::Unlink { .. } => {
                self.touch_parent(parent, &route);
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    fn rmdir(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        let child = self.lookup(parent, name)?;
        if child.kind != FileType::Directory {
            return Err(FsError::NotDir);
        }
        let layout = self.layout_of(child.ino)?.dir;
        let _token = self.write_token(parent)?;
        // A bigdir's entries may be on any shard: its rmdir is a transaction that
        // checks them all (a regular one's are with its inode, on the name's shard).
        let req = match layout {
            DirLayout::BigDir => Request::RmdirBigDir { parent, name: name.to_vec() },
            DirLayout::Regular => Request::Rmdir { parent, name: name.to_vec() },
        };
        let (at, reply) = self.rerouting(&[parent], || {
            let at = self.route(self.dentry_key(parent, name)?);
            Ok((at, self.call_to(at.server, at.proc_worker, req.clone())?))
        })?;
        expect_reply!(reply, Reply::Rmdir { .. } => ())?;
        self.touch_parent(parent, &at);
        Ok(())
    }

    fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        self.rerouting(&[parent, new_parent], || {
            self.rename_once(parent, name, new_parent, new_name, flags)
        })
    }

    fn readdir(&self, dir: InodeId, after: Option<&[u8]>, max: usize) -> FsResult<Vec<DirListing>> {
        self.list(dir, after, max, false)
    }

    fn readdir_plus(
        &self,
        dir: InodeId,
        after: Option<&[u8]>,
        max: usize,
    ) -> FsResult<Vec<DirListing>> {
        self.list(dir, after, max, true)
    }

    /// Opens without a round trip when the file's layout is known (the lookup
    /// or create that found the inode left it here): the server's `Open` only
    /// checks that the inode exists, which the lookup just did. A file another
    /// client removed in between then opens, and its reads and `fstat` fail with
    /// `NotFound` (`ESTALE` through the mount) instead of the open
    /// (docs/posix.md). Otherwise one `LayoutGet` both checks and learns it.
    fn open(&self, ino: InodeId, flags: u32) -> FsResult<FileHandle> {
        let flags = flags as i32;
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        let trusted = self.caches.take_lookup_within(ino, OPEN_TRUSTS_LOOKUP);
        if writes || !trusted {
            // The open asks the home (for the layout): a file another node
            // removed or renamed over since this client looked it up fails
            // the open with `NotFound` (`ESTALE` through the mount: the kernel
            // walks the path again and opens the file that is there now, or
            // an `O_CREAT` open makes it anew) instead of its reads or writes.
            self.caches.forget_layout(ino);
        }
        let layout = self.layout_of(ino)?.file;
        self.files.open(ino, layout, None)
    }

    fn read(&self, ino: InodeId, fh: FileHandle, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        self.read_range(ino, fh, offset, size)
    }

    fn read_with(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        size: u32,
        f: &mut dyn FnMut(&[u8]),
    ) -> FsResult<()> {
        self.read_range_with(ino, fh, offset, size, f)
    }

    fn read_into(
        &self,
        ino: InodeId,
        fh: FileHandle,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<usize> {
        self.read_range_into(ino, fh, offset, buf)
    }

    fn write(&self, ino: InodeId, fh: FileHandle, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write_range(ino, fh, offset, data)
    }

    fn keeps_locks(&self) -> bool {
        true
    }

    fn lock(
        &self,
        ino: InodeId,
        owner: u64,
        lock: pfs_core::wire::FileLock,
        test: bool,
    ) -> FsResult<Option<pfs_core::wire::FileLock>> {
        self.lock_at_home(ino, owner, lock, test)
    }

    fn append(
        &self,
        ino: InodeId,
        fh: FileHandle,
        data: &[u8],
        kill_suidgid: bool,
    ) -> FsResult<(u64, u32)> {
        self.append_range(ino, fh, data, kill_suidgid)
    }

    fn flush(&self, _ino: InodeId, fh: FileHandle) -> FsResult<()> {
        self.flush_handle(fh)
    }

    fn fsync(&self, ino: InodeId, fh: FileHandle, _datasync: bool) -> FsResult<()> {
        self.fsync_handle(ino, fh)
    }

    fn fsyncdir(&self, dir: InodeId, _fh: FileHandle, _datasync: bool) -> FsResult<()> {
        self.flush_touches();
        // The directory's entries: this client's changes wherever they are, and
        // every shard that holds entries of it, for other clients' changes
        // acknowledged before this call (a bigdir's are on every shard).
        let also: Vec<(ServerId, WorkerId)> = match self.layout_of(dir)?.dir {
            DirLayout::BigDir => self.placement.all_shards().collect(),
            DirLayout::Regular => vec![self.placement.home(dir)],
        };
        self.sync_inodes(&[dir], &also)
    }

    fn release(&self, _ino: InodeId, fh: FileHandle) -> FsResult<()> {
        self.release_handle(fh)
    }

    /// The sum over the servers that can be reached: one that is down (its
    /// connection cannot be made) is left out at once rather than waited for
    /// up to the request timeout, and named in the log. `EIO` when none
    /// answers.
    fn statfs(&self) -> FsResult<StatFs> {
        let mut sent = Vec::new();
        let mut down: Vec<(ServerId, FsError)> = Vec::new();
        for (s, w) in self.placement.all_shards() {
            if down.iter().any(|(d, _)| *d == s) {
                continue;
            }
            let timeout = self.opts.request_timeout;
            match self.conns[s.0 as usize].send_if_reachable(Request::StatFs, w.0 as u16, timeout) {
                Ok(x) => {
                    self.count_sent(s, w);
                    sent.push((s, x));
                }
                Err(e) => down.push((s, e)),
            }
        }
        let mut total: Option<StatFs> = None;
        for (s, x) in sent {
            match self.conns[s.0 as usize].wait(x) {
                Ok(Reply::StatFs(st)) => match total.as_mut() {
                    Some(t) => t.merge(&st),
                    None => total = Some(st),
                },
                Ok(other) => return Err(unexpected(other)),
                // Went down since: left out as well.
                Err(e @ FsError::Io(_)) if !down.iter().any(|(d, _)| *d == s) => down.push((s, e)),
                Err(FsError::Io(_)) => {}
                Err(e) => return Err(e),
            }
        }
        for (s, e) in &down {
            log::warn!("statfs: server {} left out of the totals: {e}", s.0);
        }
        match (total, down.into_iter().next()) {
            (Some(t), _) => Ok(t),
            (None, Some((_, e))) => Err(e),
            (None, None) => Err(FsError::Io("the cluster has no shards".into())),
        }
    }

    fn getxattr(&self, ino: InodeId, name: &[u8]) -> FsResult<Vec<u8>> {
        expect_reply!(self.call_home(ino, Request::GetXattr { ino, name: name.to_vec() })?, Reply::GetXattr(v) => v)
    }

    fn setxattr(
        &self,
        ino: InodeId,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
    ) -> FsResult<()> {
        // A directory's children are placed by its metadata layout: changing it
        // with children present would strand them, so it changes only while the
        // directory is empty. The client holds the directory on every shard
        // first (each refuses if it has one of its names, and takes no new
        // one while held), and releases each hold telling the new layout:
        // the shard then refuses, for a minute, new names the new layout
        // does not place there, which a client that cached the old layout
        // (for up to a second) may still send (`Misrouted`; it routes again).
        let mut held = None;
        let _token = if name == b"user.pfs.dir_layout" {
            let token = self.write_token(ino)?;
            let same = self.getxattr(ino, name).is_ok_and(|v| v == value);
            if !same {
                let new = std::str::from_utf8(value).ok().and_then(|v| match v {
                    "regular" => Some(DirLayout::Regular),
                    "bigdir" => Some(DirLayout::BigDir),
                    _ => None,
                });
                // A bad value: the home refuses it with the reason.
                if let Some(new) = new {
                    held =
                        Some((self.hold_dir_on(ino, self.placement.all_shards().collect())?, new));
                }
            }
            Some(token)
        } else {
            None
        };
        let req = Request::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), mode };
        match self.call_home(ino, req)? {
            Reply::SetXattr => {
                if name.starts_with(b"user.pfs.") {
                    self.caches.forget_layout(ino);
                }
                if name == pfs_core::XATTR_ACL_ACCESS {
                    // It set the mode: a cached lookup of this directory
                    // would hand the old one back.
                    self.caches.dcache.lock().expect("dcache lock").invalidate_ino(ino);
                }
                if let Some((hold, new)) = held.as_mut() {
                    hold.release = TokenMode::relaid(*new);
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    fn listxattr(&self, ino: InodeId) -> FsResult<Vec<Vec<u8>>> {
        expect_reply!(self.call_home(ino, Request::ListXattr { ino })?, Reply::ListXattr(v) => v)
    }

    fn removexattr(&self, ino: InodeId, name: &[u8]) -> FsResult<()> {
        expect_reply!(self.call_home(ino, Request::RemoveXattr { ino, name: name.to_vec() })?, Reply::RemoveXattr => ())
    }

    fn fallocate(
        &self,
        ino: InodeId,
        _fh: FileHandle,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> FsResult<()> {
        self.fallocate_range(ino, offset, len, keep_size)
    }

    fn set_invalidator(&self, invalidator: Invalidator) {
        self.caches.set_invalidator(invalidator);
    }

    fn set_version_observer(&self, observer: VersionObserver) {
        if self.versions.set(observer).is_err() {
            log::warn!("a second version observer was ignored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retry's pause moves within a half of itself either way, and not in
    /// step from one call to the next.
    #[test]
    fn retry_pauses_are_jittered_around_the_back_off() {
        let pause = Duration::from_millis(8);
        let pauses: Vec<Duration> = (0..64).map(|_| jittered(pause)).collect();
        assert!(pauses.iter().all(|p| *p >= pause / 2 && *p <= pause * 3 / 2), "{pauses:?}");
        let distinct: std::collections::BTreeSet<Duration> = pauses.iter().copied().collect();
        assert!(distinct.len() > 32, "{} distinct pauses of 64", distinct.len());
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }
}
