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

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_core::routing::home_of;
use pfs_core::wire::{InodeLayout, RenameFlags, Reply, Request, TokenMode, View, XattrSetMode};
use pfs_core::{
    ClientId, DirLayout, FileAttr, FileHandle, FileLayout, FileType, FsError, FsResult, InodeId,
    Route, RouteKey, ServerId, SetAttr, StatFs, WorkerId,
};
use pfs_net::ClusterKey;

use crate::api::{DirListing, FileSystem, Invalidation, Invalidator};
use crate::conn::{rpc_options, Conn, Sent};
use crate::dcache::{CachedDir, DentryCache};
use crate::unsynced::{Mark, Taken, Unsynced};

/// File block size of every shard (`FormatOptions::block_size`).
pub const BLOCK_SIZE_BYTES: u64 = 64 << 10;
/// Most layouts remembered; past it the table is cleared and refilled on demand.
const LAYOUT_CACHE_MAX: usize = 1 << 16;
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

#[derive(Debug)]
struct Pending {
    server: usize,
    worker: u32,
    sent: Sent,
}

#[derive(Debug)]
struct OpenState {
    pending: VecDeque<Pending>,
    first_error: Option<FsError>,
    /// End of the furthest write that went to a data-only shard.
    extend_to: u64,
    /// The size last learned from the home (for clamping reads of other shards).
    size: Option<u64>,
    /// The data end the home has reserved for other shards (`ReserveData`):
    /// writes there below it need not ask again.
    reserved: u64,
}

#[derive(Debug)]
struct OpenFile {
    ino: InodeId,
    layout: FileLayout,
    state: Mutex<OpenState>,
}

/// A client of one pfs cluster.
pub struct Cluster {
    opts: ClusterOptions,
    client: ClientId,
    view: View,
    servers: u32,
    workers: u32,
    conns: Arc<Vec<Conn>>,
    layouts: Mutex<HashMap<InodeId, InodeLayout>>,
    files: Mutex<HashMap<u64, Arc<OpenFile>>>,
    next_fh: AtomicU64,
    caches: Arc<Caches>,
    /// Acknowledged changes no commit covered yet, for fsync and fsyncdir.
    unsynced: Mutex<Unsynced>,
    stop: Arc<AtomicBool>,
    notifier: Option<std::thread::JoinHandle<()>>,
}

/// What the notification thread shares with the client: the dentry cache, the
/// read tokens it lives under, and the kernel's invalidation callback.
struct Caches {
    dcache: Mutex<DentryCache>,
    /// Read tokens held: directory -> lease expiry.
    read_tokens: Mutex<HashMap<InodeId, Instant>>,
    invalidator: Mutex<Option<Invalidator>>,
}

impl Caches {
    /// A server revoked the read token on `dir`: drop what it covered.
    fn revoke(&self, dir: InodeId) {
        self.read_tokens.lock().expect("token lock").remove(&dir);
        let names = self.dcache.lock().expect("dcache lock").take_dir(dir);
        if let Some(inv) = self.invalidator.lock().expect("invalidator lock").as_ref() {
            for name in names {
                inv(Invalidation::Entry { parent: dir, name });
            }
            inv(Invalidation::Inode { ino: dir });
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.notifier.take() {
            let _ = t.join();
        }
    }
}

/// How often the client looks for invalidations servers sent.
const NOTIFY_POLL: Duration = Duration::from_millis(50);

fn notification_loop(conns: Arc<Vec<Conn>>, caches: Arc<Caches>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        for c in conns.iter() {
            for dir in c.take_invalidations() {
                caches.revoke(dir);
            }
        }
        std::thread::sleep(NOTIFY_POLL);
    }
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("client", &self.client)
            .field("servers", &self.servers)
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

/// A held write token, given back when dropped.
struct WriteToken<'a> {
    client: &'a Cluster,
    dir: Option<InodeId>,
}

impl Drop for WriteToken<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.dir {
            // Dropping this own client's cached names of `dir` too: they may
            // have just changed.
            self.client.caches.dcache.lock().expect("dcache lock").invalidate_dir(dir);
            let release = Request::TokenRelease { dir, mode: TokenMode::Write };
            if let Err(e) = self.client.call_home(dir, release) {
                log::debug!("write token on {dir} not released ({e}); it expires by itself");
            }
        }
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

/// The inodes a change acknowledged with `reply` leaves not yet durable on the
/// shard that made it: the directories whose entries it changed, the inodes it
/// changed, and a new entry's inode (so `fsync` of a new file covers its name,
/// as ext4's does).
fn dirtied(req: &Request, reply: &Reply) -> Vec<InodeId> {
    let mut out = match req {
        Request::Create { parent, .. }
        | Request::Mkdir { parent, .. }
        | Request::Mknod { parent, .. }
        | Request::Symlink { parent, .. }
        | Request::Unlink { parent, .. }
        | Request::Rmdir { parent, .. }
        | Request::RmdirBigDir { parent, .. } => vec![*parent],
        Request::Rename { parent, new_parent, .. }
        | Request::RenameCross { parent, new_parent, .. } => vec![*parent, *new_parent],
        Request::Link { ino, new_parent, .. } => vec![*ino, *new_parent],
        Request::SetAttr { ino, .. }
        | Request::Write { ino, .. }
        | Request::WriteData { ino, .. }
        | Request::TruncateData { ino, .. }
        | Request::ExtendSize { ino, .. }
        | Request::SetXattr { ino, .. }
        | Request::RemoveXattr { ino, .. }
        | Request::LayoutSet { ino, .. }
        | Request::AddLink { ino }
        | Request::DropInode { ino } => vec![*ino],
        Request::AdjustDir { dir, .. } => vec![*dir],
        _ => Vec::new(),
    };
    match reply {
        Reply::Create { entry, .. }
        | Reply::Mkdir(entry)
        | Reply::Mknod(entry)
        | Reply::Symlink(entry) => out.push(entry.attr.ino),
        _ => {}
    }
    out
}

fn unexpected(reply: Reply) -> FsError {
    FsError::Io(format!("unexpected reply {:?}", reply.opcode()))
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
        let workers = view.servers[0].workers;
        let client = client_id();
        let mut conns = Vec::with_capacity(view.servers.len());
        for s in &view.servers {
            let addr: SocketAddr = s.addr.parse().map_err(|_| {
                FsError::Io(format!("server {} has address {:?}, not ip:port", s.id, s.addr))
            })?;
            let mut ro = rpc_options(client, opts.connect_timeout, opts.request_timeout);
            ro.connect.transport = opts.transport;
            ro.connect.rdma = opts.rdma.clone();
            ro.connect.slot_rpc = opts.slot_rpc;
            let conn = Conn::connect(addr, opts.key.clone(), ro).map_err(|e| {
                FsError::Io(format!("cannot connect to server {} at {addr}: {e}", s.id))
            })?;
            conns.push(conn);
        }
        let conns = Arc::new(conns);
        let caches = Arc::new(Caches {
            dcache: Mutex::new(DentryCache::new(opts.dentry_cache_entries)),
            read_tokens: Mutex::new(HashMap::new()),
            invalidator: Mutex::new(None),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let notifier = {
            let (conns, caches, stop) = (conns.clone(), caches.clone(), stop.clone());
            std::thread::Builder::new()
                .name("pfs-notify".into())
                .spawn(move || notification_loop(conns, caches, stop))
                .map_err(|e| FsError::Io(format!("cannot start the notification thread: {e}")))?
        };
        let c = Cluster {
            servers: view.servers.len() as u32,
            workers,
            client,
            view,
            conns,
            layouts: Mutex::new(HashMap::new()),
            files: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            caches,
            unsynced: Mutex::new(Unsynced::new(UNSYNCED_INODES_MAX)),
            stop,
            notifier: Some(notifier),
            opts,
        };
        c.layout_of(InodeId::ROOT)?;
        Ok(c)
    }

    /// Each server connection as it is now, in view order (`None`: reconnecting).
    pub fn links(&self) -> Vec<Option<crate::conn::LinkInfo>> {
        self.conns.iter().map(|c| c.link_info()).collect()
    }

    /// Dentry cache (hits, misses) so far.
    pub fn dentry_cache_stats(&self) -> (u64, u64) {
        self.caches.dcache.lock().expect("dcache lock").counters()
    }

    /// The view this client routes by.
    pub fn view(&self) -> &View {
        &self.view
    }

    fn route(&self, key: RouteKey<'_>) -> Route {
        Route::new(key.lambda(self.servers, self.workers), self.client, self.servers, self.workers)
    }

    fn send_to(&self, server: ServerId, worker: WorkerId, req: Request) -> FsResult<(usize, Sent)> {
        let s = server.0 as usize;
        let sent = self.conns[s].send(req, worker.0 as u16, self.opts.request_timeout)?;
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
        let deadline = Instant::now() + self.opts.request_timeout;
        let mut pause = Duration::from_micros(100);
        let mutation = req.is_mutation();
        loop {
            let (s, sent) = self.send_to(server, worker, req.clone())?;
            match self.conns[s].wait_boot(sent) {
                Err(FsError::TryAgain) if Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Ok((reply, boot)) => {
                    if mutation {
                        let mut inos = dirtied(&req, &reply);
                        inos.extend_from_slice(also);
                        self.note_unsynced(&inos, server.0, worker.0, boot);
                    }
                    return Ok(reply);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Notes changes to `inos` acknowledged by a shard with boot id `boot`.
    fn note_unsynced(&self, inos: &[InodeId], server: u32, worker: u32, boot: u64) {
        for &ino in inos {
            if self.unsynced.lock().expect("unsynced lock").note(ino, server, worker, boot) {
                continue;
            }
            // Full: commit everything this client changed, then note.
            let all = self.unsynced.lock().expect("unsynced lock").take_all();
            if let Err(e) = self.commit_marks(all, &[], true) {
                log::warn!("committing {UNSYNCED_INODES_MAX} files' changes: {e}");
            }
            self.unsynced.lock().expect("unsynced lock").note(ino, server, worker, boot);
        }
    }

    /// Asks each shard of `taken` (and of `also`) to commit, in parallel. Marks
    /// whose shard answered from the boot that acknowledged them are done; one
    /// that answered from a later boot (the server restarted), or a mark already
    /// `lost`, makes its inode lost. Marks whose commit could not be asked for go
    /// back to the table. Returns the lost inodes for the caller to report, or
    /// the first error; with `keep_lost`, or on an error, lost marks go back to
    /// the table too (marked lost), so whoever syncs that inode next is told.
    fn commit_marks(
        &self,
        taken: Taken,
        also: &[(ServerId, WorkerId)],
        keep_lost: bool,
    ) -> FsResult<BTreeSet<InodeId>> {
        let mut shards: BTreeSet<(u32, u32)> =
            taken.iter().map(|(_, m)| (m.server, m.worker)).collect();
        shards.extend(also.iter().map(|(s, w)| (s.0, w.0)));
        let mut sent = Vec::with_capacity(shards.len());
        let mut first_error = None;
        for &(s, w) in &shards {
            let req = Request::Fsync { ino: InodeId::ROOT, fh: FileHandle(0), datasync: false };
            match self.send_to(ServerId(s), WorkerId(w), req) {
                Ok(x) => sent.push(((s, w), Some(x))),
                Err(e) => {
                    first_error.get_or_insert(e);
                    sent.push(((s, w), None));
                }
            }
        }
        let mut boots = HashMap::new();
        for ((s, w), x) in sent {
            let Some((conn, x)) = x else { continue };
            // A commit changes nothing by itself, so unlike other requests it is
            // sent again once when its connection had dropped (a restarted
            // server): the answer then tells which boot holds the changes.
            let result = match self.conns[conn].wait_boot(x) {
                Err(FsError::Io(_)) => {
                    let req =
                        Request::Fsync { ino: InodeId::ROOT, fh: FileHandle(0), datasync: false };
                    self.send_to(ServerId(s), WorkerId(w), req)
                        .and_then(|(conn, x)| self.conns[conn].wait_boot(x))
                }
                other => other,
            };
            match result {
                Ok((_, boot)) => {
                    boots.insert((s, w), boot);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let mut lost = Vec::new();
        let mut back = Vec::new();
        for (ino, m) in taken {
            match boots.get(&(m.server, m.worker)) {
                Some(&boot) if !m.lost && boot == m.boot => {}
                Some(_) => lost.push((ino, Mark { lost: true, ..m })),
                None => back.push((ino, m)),
            }
        }
        // Lost changes are reported to whoever syncs that inode, never dropped.
        let report = !keep_lost && first_error.is_none();
        let lost_inodes: BTreeSet<InodeId> = lost.iter().map(|(ino, _)| *ino).collect();
        if !report {
            back.extend(lost);
        }
        if !back.is_empty() {
            self.unsynced.lock().expect("unsynced lock").restore(back);
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(if report { lost_inodes } else { BTreeSet::new() })
    }

    /// Makes every acknowledged change of this client to `inos` durable, and
    /// commits the shards `also` (other clients' changes there included).
    /// `EIO` when a server restarted after acknowledging some of them.
    fn sync_inodes(&self, inos: &[InodeId], also: &[(ServerId, WorkerId)]) -> FsResult<()> {
        let taken = self.unsynced.lock().expect("unsynced lock").take(inos);
        let lost = self.commit_marks(taken, also, false)?;
        match lost.first() {
            None => Ok(()),
            Some(ino) => Err(FsError::Io(format!(
                "a server restarted after it acknowledged changes to inode {ino} that were not \
                 yet durable: they may be lost"
            ))),
        }
    }

    fn call(&self, key: RouteKey<'_>, req: Request) -> FsResult<Reply> {
        let r = self.route(key);
        self.call_to(r.server, r.proc_worker, req)
    }

    fn call_home(&self, ino: InodeId, req: Request) -> FsResult<Reply> {
        self.call(RouteKey::Inode(ino), req)
    }

    fn remember(&self, ino: InodeId, layout: InodeLayout) {
        let mut m = self.layouts.lock().expect("layout cache lock");
        if m.len() >= LAYOUT_CACHE_MAX {
            m.clear();
        }
        m.insert(ino, layout);
    }

    /// The layouts of `ino`, from the cache or its home.
    fn layout_of(&self, ino: InodeId) -> FsResult<InodeLayout> {
        if let Some(l) = self.layouts.lock().expect("layout cache lock").get(&ino) {
            return Ok(*l);
        }
        match self.call_home(ino, Request::LayoutGet { ino })? {
            Reply::LayoutGet(l) => {
                self.remember(ino, l);
                Ok(l)
            }
            other => Err(unexpected(other)),
        }
    }

    fn dentry_key<'a>(&self, parent: InodeId, name: &'a [u8]) -> FsResult<RouteKey<'a>> {
        if name.len() > pfs_core::NAME_MAX {
            return Err(FsError::NameTooLong);
        }
        let layout = self.layout_of(parent)?.dir;
        Ok(RouteKey::Dentry { parent, layout, name })
    }

    fn entry_attr(&self, reply: Reply) -> FsResult<FileAttr> {
        match reply {
            // nlink 0: the name moved here by a rename, the inode is at its home.
            Reply::Lookup(e) if e.attr.nlink == 0 => {
                let ino = e.attr.ino;
                let attr = self.getattr(ino)?;
                self.layouts.lock().expect("layout cache lock").remove(&ino);
                self.layout_of(ino)?;
                Ok(attr)
            }
            Reply::Lookup(e) | Reply::Mkdir(e) | Reply::Mknod(e) | Reply::Symlink(e) => {
                self.remember(e.attr.ino, e.layout);
                Ok(e.attr)
            }
            other => Err(unexpected(other)),
        }
    }

    /// Holds (or takes) a read token on `dir`; its expiry, or `None` when the server
    /// grants no lease (someone is changing names in `dir`).
    fn read_token(&self, dir: InodeId) -> FsResult<Option<Instant>> {
        let now = Instant::now();
        if let Some(&exp) = self.caches.read_tokens.lock().expect("token lock").get(&dir) {
            if exp > now {
                return Ok(Some(exp));
            }
        }
        match self.call_home(dir, Request::TokenAcquire { dir, mode: TokenMode::Read })? {
            Reply::TokenAcquire(g) if g.lease_ms > 0 => {
                // Count the lease from before the request: never longer than granted.
                let exp = now + Duration::from_millis(u64::from(g.lease_ms));
                let mut t = self.caches.read_tokens.lock().expect("token lock");
                if t.len() >= LAYOUT_CACHE_MAX {
                    t.retain(|_, e| *e > now);
                }
                t.insert(dir, exp);
                Ok(Some(exp))
            }
            Reply::TokenAcquire(_) => Ok(None),
            other => Err(unexpected(other)),
        }
    }

    /// Takes the write token on `dir`, which makes the server tell every other
    /// client to drop the names of `dir` it caches; released when dropped.
    fn write_token(&self, dir: InodeId) -> FsResult<WriteToken<'_>> {
        if self.opts.dentry_ttl.is_zero() {
            return Ok(WriteToken { client: self, dir: None });
        }
        self.caches.dcache.lock().expect("dcache lock").invalidate_dir(dir);
        match self.call_home(dir, Request::TokenAcquire { dir, mode: TokenMode::Write })? {
            Reply::TokenAcquire(_) => Ok(WriteToken { client: self, dir: Some(dir) }),
            other => Err(unexpected(other)),
        }
    }

    /// Updates the times of `dir` at its home after one of its entries changed
    /// on the shard `at`, when that is not the home (a bigdir name away from
    /// the directory's inode), so a `stat` right after sees them. A change of
    /// its link count travels from that shard as a follow-up, durable with the
    /// change (docs/cluster.md). A failure here (the directory removed
    /// meanwhile, a lost server) leaves its times stale: logged, not returned.
    fn touch_parent(&self, dir: InodeId, at: &Route) {
        if self.is_home(dir, at) {
            return;
        }
        match self.call_home(dir, Request::AdjustDir { dir, nlink_delta: 0 }) {
            Ok(Reply::AdjustDir) | Err(FsError::NotFound) => {}
            Ok(other) => log::warn!("updating directory {dir}: {}", unexpected(other)),
            Err(e) => log::warn!("updating directory {dir} after a change elsewhere: {e}"),
        }
    }

    /// The (server, worker) of every shard, in shard order.
    fn all_shards(&self) -> impl Iterator<Item = (ServerId, WorkerId)> + '_ {
        (0..self.servers)
            .flat_map(move |s| (0..self.workers).map(move |w| (ServerId(s), WorkerId(w))))
    }

    fn open_file(&self, fh: FileHandle) -> FsResult<Arc<OpenFile>> {
        self.files
            .lock()
            .expect("open files lock")
            .get(&fh.0)
            .cloned()
            .ok_or_else(|| FsError::Invalid(format!("file handle {} is not open", fh.0)))
    }

    fn new_handle(
        &self,
        ino: InodeId,
        layout: FileLayout,
        size: Option<u64>,
    ) -> FsResult<FileHandle> {
        let mut files = self.files.lock().expect("open files lock");
        if files.len() >= OPEN_FILES_MAX {
            return Err(FsError::TryAgain);
        }
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let state = OpenState {
            pending: VecDeque::new(),
            first_error: None,
            extend_to: 0,
            size,
            reserved: 0,
        };
        files.insert(fh, Arc::new(OpenFile { ino, layout, state: Mutex::new(state) }));
        Ok(FileHandle(fh))
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

    /// Has the home of `ino` reserve data past `end` for other shards before
    /// a write there, so the file's removal or truncate frees it even if this
    /// client dies before it publishes the size. Asks for up to twice `end`
    /// (at most 64 MiB more), so a growing file asks once per doubling.
    fn reserve_data(&self, ino: InodeId, end: u64) -> FsResult<u64> {
        let ask = end.saturating_mul(2).min(end.saturating_add(64 << 20)).max(end);
        let ask = ask.min(pfs_core::MAX_FILE_SIZE).max(end);
        match self.call_home(ino, Request::ReserveData { ino, end: ask })? {
            Reply::ReserveData { end: got } => Ok(got),
            other => Err(unexpected(other)),
        }
    }

    /// Whether `route` is the home shard of `ino`.
    fn is_home(&self, ino: InodeId, route: &Route) -> bool {
        let (s, w) = home_of(ino, self.servers, self.workers);
        route.server == s && route.proc_worker == w
    }

    /// Splits `offset..offset+len` of a file into runs that one shard holds:
    /// `(route, offset, len)`, consecutive blocks on one shard merged.
    fn pieces(
        &self,
        ino: InodeId,
        layout: FileLayout,
        offset: u64,
        len: u64,
    ) -> Vec<(Route, u64, u64)> {
        let mut out: Vec<(Route, u64, u64)> = Vec::new();
        let end = offset + len;
        let mut at = offset;
        while at < end {
            let block_end = (at / BLOCK_SIZE_BYTES + 1) * BLOCK_SIZE_BYTES;
            let n = block_end.min(end) - at;
            let route = self.route(RouteKey::data_at(ino, layout, at, BLOCK_SIZE_BYTES));
            match out.last_mut() {
                // `io` keeps one request per block: each write owns its block's extent.
                Some((r, o, l)) if *r == route && *o + *l == at && layout != FileLayout::Io => {
                    *l += n
                }
                _ => out.push((route, at, n)),
            }
            at += n;
        }
        out
    }

    /// Completes the oldest pending write of `state` (a write to `ino`).
    fn complete_one(&self, ino: InodeId, state: &mut OpenState) {
        if let Some(p) = state.pending.pop_front() {
            let result = self.conns[p.server].wait_boot(p.sent);
            self.conns[p.server].release_pipelined();
            match result {
                Ok((_, boot)) => self.note_unsynced(&[ino], p.server as u32, p.worker, boot),
                Err(e) => {
                    state.first_error.get_or_insert(e);
                }
            }
        }
    }

    /// Takes room for one pipelined write to server `s`. While the connection's
    /// pipeline is full, reaps this file's oldest write, or else the writes of
    /// other open files whose owners are not running (the kernel parks a writer
    /// while another writes the same inode): their replies hold credits that
    /// nobody else would give back.
    fn reserve_pipelined(&self, s: usize, file: &Arc<OpenFile>, st: &mut OpenState) {
        let conn = &self.conns[s];
        let limit = conn.pipeline_limit();
        let mut pause = Duration::from_micros(50);
        while !conn.reserve_pipelined(limit) {
            if !st.pending.is_empty() {
                self.complete_one(file.ino, st);
                continue;
            }
            let others: Vec<Arc<OpenFile>> = self
                .files
                .lock()
                .expect("open files lock")
                .values()
                .filter(|f| !Arc::ptr_eq(f, file))
                .cloned()
                .collect();
            let mut reaped = false;
            for other in others {
                // A file whose lock is taken has a running owner, who reaps.
                if let Ok(mut theirs) = other.state.try_lock() {
                    while theirs.pending.iter().any(|p| p.server == s) {
                        self.complete_one(other.ino, &mut theirs);
                        reaped = true;
                    }
                }
                if reaped {
                    break;
                }
            }
            if !reaped {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        }
    }

    /// Waits for every write of `file`, grows its size at home if needed, and
    /// returns (and clears) the first error.
    fn drain(&self, file: &OpenFile) -> FsResult<()> {
        let mut st = file.state.lock().expect("open file lock");
        while !st.pending.is_empty() {
            self.complete_one(file.ino, &mut st);
        }
        if let Some(e) = st.first_error.take() {
            return Err(e);
        }
        if st.extend_to > 0 {
            let size = st.extend_to;
            match self.call_home(file.ino, Request::ExtendSize { ino: file.ino, size })? {
                Reply::ExtendSize(a) => st.size = Some(a.size),
                other => return Err(unexpected(other)),
            }
            st.extend_to = 0;
        }
        Ok(())
    }

    /// Open handles of `ino` in this client.
    fn open_files_of(&self, ino: InodeId) -> Vec<Arc<OpenFile>> {
        let files = self.files.lock().expect("open files lock");
        files.values().filter(|f| f.ino == ino).cloned().collect()
    }

    /// Makes this client's writes to `ino`, through any of its handles, count in
    /// the size at home: waits for them and sends `ExtendSize`, so a process
    /// always sees its own writes in `stat`. Write errors stay with their handle
    /// for its next write, flush or close. Returns whether `ino` is open here.
    fn publish_writes(&self, ino: InodeId) -> FsResult<bool> {
        let files = self.open_files_of(ino);
        for file in &files {
            let mut st = file.state.lock().expect("open file lock");
            while !st.pending.is_empty() {
                self.complete_one(ino, &mut st);
            }
            if st.extend_to > 0 && st.first_error.is_none() {
                let size = st.extend_to;
                match self.call_home(ino, Request::ExtendSize { ino, size })? {
                    Reply::ExtendSize(a) => st.size = Some(a.size),
                    other => return Err(unexpected(other)),
                }
                st.extend_to = 0;
            }
        }
        Ok(!files.is_empty())
    }

    /// The current size of `ino` at its home.
    fn size_at_home(&self, ino: InodeId) -> FsResult<u64> {
        match self.call_home(ino, Request::GetAttr { ino })? {
            Reply::GetAttr(a) => Ok(a.size),
            other => Err(unexpected(other)),
        }
    }
}

impl FileSystem for Cluster {
    fn lookup(&self, parent: InodeId, name: &[u8]) -> FsResult<FileAttr> {
        let caching = !self.opts.dentry_ttl.is_zero();
        if caching {
            let hit =
                self.caches.dcache.lock().expect("dcache lock").get(parent, name, Instant::now());
            if let Some(d) = hit {
                return Ok(d.attr);
            }
        }
        let key = self.dentry_key(parent, name)?;
        let reply = self.call(key, Request::Lookup { parent, name: name.to_vec() })?;
        let mut attr = self.entry_attr(reply)?;
        if attr.kind == FileType::Regular && self.publish_writes(attr.ino)? {
            attr = self.getattr(attr.ino)?;
        }
        if caching && attr.kind == FileType::Directory {
            // Only names of directories are cached, and only under a read token.
            if let Some(expires) = self.read_token(parent)? {
                let layout = self.layout_of(attr.ino)?.dir;
                let until = expires.min(Instant::now() + self.opts.dentry_ttl);
                self.caches.dcache.lock().expect("dcache lock").insert(
                    parent,
                    name,
                    CachedDir { attr, layout },
                    until,
                );
            }
        }
        Ok(attr)
    }

    fn getattr(&self, ino: InodeId) -> FsResult<FileAttr> {
        self.publish_writes(ino)?;
        match self.call_home(ino, Request::GetAttr { ino })? {
            Reply::GetAttr(a) => Ok(a),
            other => Err(unexpected(other)),
        }
    }

    fn setattr(&self, ino: InodeId, set: &SetAttr) -> FsResult<FileAttr> {
        if set.size.is_some() {
            // Writes still in flight land before the cut, not after it.
            self.publish_writes(ino)?;
        }
        let attr = match self.call_home(ino, Request::SetAttr { ino, set: *set })? {
            Reply::SetAttr(a) => a,
            other => return Err(unexpected(other)),
        };
        if attr.kind == FileType::Directory {
            // A cached lookup of this directory would hand the old mode back.
            self.caches.dcache.lock().expect("dcache lock").invalidate_ino(ino);
        }
        // Data past a cut on other shards is freed by the home (a follow-up)
        // before it answers.
        if set.size.is_some() {
            // Sizes the handles learned before are wrong now (reads clamp to them).
            for file in self.open_files_of(ino) {
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
        let key = self.dentry_key(parent, name)?;
        let at = self.route(key);
        let layout = self.layout_of(parent)?.file;
        let req = Request::Create { parent, name: name.to_vec(), perm, uid, gid, flags, layout };
        match self.call_to(at.server, at.proc_worker, req)? {
            Reply::Create { entry, .. } => {
                self.touch_parent(parent, &at);
                self.remember(entry.attr.ino, entry.layout);
                let fh = self.new_handle(entry.attr.ino, entry.layout.file, Some(0))?;
                Ok((entry.attr, fh))
            }
            other => Err(unexpected(other)),
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
        let key = self.dentry_key(parent, name)?;
        let at = self.route(key);
        let req = Request::Mknod { parent, name: name.to_vec(), kind, perm, uid, gid, rdev };
        let reply = self.call_to(at.server, at.proc_worker, req)?;
        self.touch_parent(parent, &at);
        self.entry_attr(reply)
    }

    fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        let key = self.dentry_key(parent, name)?;
        let at = self.route(key);
        let layout = self.layout_of(parent)?;
        let req = Request::Mkdir { parent, name: name.to_vec(), perm, uid, gid, layout };
        let reply = self.call_to(at.server, at.proc_worker, req)?;
        self.touch_parent(parent, &at);
        self.entry_attr(reply)
    }

    fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<FileAttr> {
        let key = self.dentry_key(parent, name)?;
        let at = self.route(key);
        let req =
            Request::Symlink { parent, name: name.to_vec(), target: target.to_vec(), uid, gid };
        let reply = self.call_to(at.server, at.proc_worker, req)?;
        self.touch_parent(parent, &at);
        self.entry_attr(reply)
    }

    fn link(&self, ino: InodeId, new_parent: InodeId, new_name: &[u8]) -> FsResult<FileAttr> {
        let kind = self.getattr(ino)?.kind;
        if kind == FileType::Directory {
            return Err(FsError::NotPermitted);
        }
        let to = self.route(self.dentry_key(new_parent, new_name)?);
        let req = Request::Link { ino, kind, new_parent, new_name: new_name.to_vec() };
        // The new name's shard counts the link in the same operation when the
        // inode lives there, and otherwise by a follow-up to its home that it
        // waits for before answering.
        match self.call_to(to.server, to.proc_worker, req)? {
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
        match self.call_home(ino, Request::ReadLink { ino })? {
            Reply::ReadLink(t) => Ok(t),
            other => Err(unexpected(other)),
        }
    }

    fn unlink(&self, parent: InodeId, name: &[u8]) -> FsResult<()> {
        let key = self.dentry_key(parent, name)?;
        let route = self.route(key);
        // The name's shard frees what lives elsewhere (the inode at its home
        // when the name was moved, data on other shards) by follow-ups.
        match self.call_to(
            route.server,
            route.proc_worker,
            Request::Unlink { parent, name: name.to_vec() },
        )? {
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
        let key = self.dentry_key(parent, name)?;
        let at = self.route(key);
        // A bigdir's entries may be on any shard: its rmdir is a transaction that
        // checks them all (a regular one's are with its inode, on the name's shard).
        let req = match layout {
            DirLayout::BigDir => Request::RmdirBigDir { parent, name: name.to_vec() },
            DirLayout::Regular => Request::Rmdir { parent, name: name.to_vec() },
        };
        match self.call_to(at.server, at.proc_worker, req)? {
            Reply::Rmdir { .. } => {}
            other => return Err(unexpected(other)),
        }
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
        let from = self.route(self.dentry_key(parent, name)?);
        let to = self.route(self.dentry_key(new_parent, new_name)?);
        // Either name may be a directory others cache: take both write tokens.
        let _tokens = (self.write_token(parent)?, self.write_token(new_parent)?);
        let source = self.lookup(parent, name)?;
        let target = self.lookup(new_parent, new_name);
        let exchange = flags.contains(RenameFlags::EXCHANGE);
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
        // sees its own slice of a bigdir, so the client checks every shard here.
        let _target_token = if exchange {
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
                    let token = self.write_token(t.ino)?;
                    if !self.readdir(t.ino, None, 1)?.is_empty() {
                        return Err(FsError::NotEmpty);
                    }
                    Some(token)
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
        match self.call_noting(from.server, from.proc_worker, req, &[source.ino])? {
            Reply::Rename { .. } | Reply::RenameCross { .. } => {}
            other => return Err(unexpected(other)),
        }
        self.touch_parent(parent, &from);
        if new_parent != parent {
            self.touch_parent(new_parent, &to);
        }
        Ok(())
    }

    fn readdir(&self, dir: InodeId, after: Option<&[u8]>, max: usize) -> FsResult<Vec<DirListing>> {
        let layout = self.layout_of(dir)?.dir;
        let shards: Vec<(ServerId, WorkerId)> = match layout {
            DirLayout::Regular => {
                let (s, w) = home_of(dir, self.servers, self.workers);
                vec![(s, w)]
            }
            DirLayout::BigDir => self.all_shards().collect(),
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
            let want = (max - out.len()).min(crate::api::READDIR_BATCH);
            let req = Request::ReadDir {
                ino: dir,
                after: std::mem::take(&mut resume),
                max_entries: want as u32,
                max_bytes: 1 << 20,
                plus: false,
            };
            match self.call_to(s, w, req)? {
                Reply::ReadDir { entries, eof } => {
                    let last = entries.last().map(|e| e.name.clone());
                    out.extend(entries.into_iter().map(|e| DirListing {
                        name: e.name,
                        ino: e.ino,
                        kind: e.kind,
                    }));
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

    fn open(&self, ino: InodeId, flags: u32) -> FsResult<FileHandle> {
        match self.call_home(ino, Request::Open { ino, flags })? {
            Reply::Open { .. } => {}
            other => return Err(unexpected(other)),
        }
        let layout = self.layout_of(ino)?.file;
        self.new_handle(ino, layout, None)
    }

    fn read(&self, ino: InodeId, fh: FileHandle, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        if size as usize > pfs_core::wire::MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("read of {size} bytes: at most 1 MiB")));
        }
        let file = self.open_file(fh)?;
        let layout = file.layout;
        let pieces = self.pieces(ino, layout, offset, u64::from(size));
        let all_home = pieces.iter().all(|(r, _, _)| self.is_home(ino, r));
        if all_home && pieces.len() == 1 {
            let (r, o, n) = pieces[0];
            return match self.call_to(
                r.server,
                r.proc_worker,
                Request::Read { ino, fh, offset: o, size: n as u32 },
            )? {
                Reply::Read(d) => Ok(d),
                other => Err(unexpected(other)),
            };
        }
        // Data on other shards reads as zeros past the end: clamp to the size.
        let file_size = {
            let st = file.state.lock().expect("open file lock");
            match st.size {
                Some(s) if s >= offset + u64::from(size) => s,
                _ => {
                    // Other handles of this client may hold writes the home does
                    // not count yet: publish them first (without this lock).
                    drop(st);
                    self.publish_writes(ino)?;
                    let s = self.size_at_home(ino)?;
                    file.state.lock().expect("open file lock").size = Some(s);
                    s
                }
            }
        };
        if offset >= file_size {
            return Ok(Vec::new());
        }
        let len = (u64::from(size)).min(file_size - offset);
        let mut sent = Vec::new();
        for (r, o, n) in self.pieces(ino, layout, offset, len) {
            let req = if self.is_home(ino, &r) {
                Request::Read { ino, fh, offset: o, size: n as u32 }
            } else {
                Request::ReadData { ino, layout, offset: o, size: n as u32 }
            };
            sent.push((o, n, self.send_to(r.server, r.proc_worker, req)?));
        }
        let mut out = vec![0u8; len as usize];
        for (o, n, (s, x)) in sent {
            let data = match self.conns[s].wait(x)? {
                Reply::Read(d) | Reply::ReadData(d) => d,
                other => return Err(unexpected(other)),
            };
            let at = (o - offset) as usize;
            let n = (n as usize).min(data.len());
            out[at..at + n].copy_from_slice(&data[..n]);
        }
        Ok(out)
    }

    fn write(&self, ino: InodeId, fh: FileHandle, offset: u64, data: &[u8]) -> FsResult<u32> {
        if data.len() > pfs_core::wire::MAX_IO_BYTES {
            return Err(FsError::Invalid(format!("write of {} bytes: at most 1 MiB", data.len())));
        }
        let file = self.open_file(fh)?;
        let layout = file.layout;
        let mut st = file.state.lock().expect("open file lock");
        if let Some(e) = st.first_error.take() {
            return Err(e);
        }
        for (r, o, n) in self.pieces(ino, layout, offset, data.len() as u64) {
            let bytes = data[(o - offset) as usize..(o - offset + n) as usize].to_vec();
            let home = self.is_home(ino, &r);
            let req = if home {
                Request::Write { ino, fh, offset: o, data: bytes }
            } else {
                if o + n > st.reserved {
                    st.reserved = self.reserve_data(ino, o + n)?;
                }
                st.extend_to = st.extend_to.max(o + n);
                Request::WriteData { ino, layout, offset: o, data: bytes }
            };
            while st.pending.len() >= self.opts.max_unfinished_writes.max(1) {
                self.complete_one(ino, &mut st);
            }
            self.reserve_pipelined(r.server.0 as usize, &file, &mut st);
            let (s, sent) = match self.send_to(r.server, r.proc_worker, req) {
                Ok(x) => x,
                Err(e) => {
                    self.conns[r.server.0 as usize].release_pipelined();
                    return Err(e);
                }
            };
            st.pending.push_back(Pending { server: s, worker: r.proc_worker.0, sent });
            if self.opts.strict {
                self.complete_one(ino, &mut st);
            }
        }
        if let Some(size) = st.size.as_mut() {
            *size = (*size).max(offset + data.len() as u64);
        }
        if let Some(e) = st.first_error.take() {
            return Err(e);
        }
        Ok(data.len() as u32)
    }

    fn flush(&self, _ino: InodeId, fh: FileHandle) -> FsResult<()> {
        let file = self.open_file(fh)?;
        self.drain(&file)
    }

    fn fsync(&self, ino: InodeId, fh: FileHandle, _datasync: bool) -> FsResult<()> {
        // Every write of this client to the file, through any handle, counts.
        self.publish_writes(ino)?;
        let file = self.open_file(fh)?;
        self.drain(&file)?;
        self.sync_inodes(&[file.ino], &[])
    }

    fn fsyncdir(&self, dir: InodeId, _fh: FileHandle, _datasync: bool) -> FsResult<()> {
        // The directory's entries: this client's changes wherever they are, and
        // every shard that holds entries of it, for other clients' changes
        // acknowledged before this call (a bigdir's are on every shard).
        let also: Vec<(ServerId, WorkerId)> = match self.layout_of(dir)?.dir {
            DirLayout::BigDir => self.all_shards().collect(),
            DirLayout::Regular => vec![home_of(dir, self.servers, self.workers)],
        };
        self.sync_inodes(&[dir], &also)
    }

    fn release(&self, _ino: InodeId, fh: FileHandle) -> FsResult<()> {
        let file = self.files.lock().expect("open files lock").remove(&fh.0);
        let Some(file) = file else {
            return Err(FsError::Invalid(format!("file handle {} is not open", fh.0)));
        };
        // Close is not fsync (docs/reliability.md): it makes the writes and the
        // size visible to every client; they stay noted as unsynced, so a later
        // fsync of the file (through any handle) still commits them.
        self.drain(&file)
    }

    fn statfs(&self) -> FsResult<StatFs> {
        let mut sent = Vec::new();
        for (s, w) in self.all_shards() {
            sent.push(self.send_to(s, w, Request::StatFs)?);
        }
        let mut total: Option<StatFs> = None;
        for (s, x) in sent {
            match self.conns[s].wait(x)? {
                Reply::StatFs(st) => match total.as_mut() {
                    Some(t) => t.merge(&st),
                    None => total = Some(st),
                },
                other => return Err(unexpected(other)),
            }
        }
        total.ok_or_else(|| FsError::Io("the cluster has no shards".into()))
    }

    fn getxattr(&self, ino: InodeId, name: &[u8]) -> FsResult<Vec<u8>> {
        match self.call_home(ino, Request::GetXattr { ino, name: name.to_vec() })? {
            Reply::GetXattr(v) => Ok(v),
            other => Err(unexpected(other)),
        }
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
        // directory is empty (checked under its write token).
        let _token = if name == b"user.pfs.dir_layout" {
            let token = self.write_token(ino)?;
            let same = self.getxattr(ino, name).is_ok_and(|v| v == value);
            if !same && !self.readdir(ino, None, 1)?.is_empty() {
                return Err(FsError::NotEmpty);
            }
            Some(token)
        } else {
            None
        };
        let req = Request::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), mode };
        match self.call_home(ino, req)? {
            Reply::SetXattr => {
                if name.starts_with(b"user.pfs.") {
                    self.layouts.lock().expect("layout cache lock").remove(&ino);
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    fn listxattr(&self, ino: InodeId) -> FsResult<Vec<Vec<u8>>> {
        match self.call_home(ino, Request::ListXattr { ino })? {
            Reply::ListXattr(v) => Ok(v),
            other => Err(unexpected(other)),
        }
    }

    fn removexattr(&self, ino: InodeId, name: &[u8]) -> FsResult<()> {
        match self.call_home(ino, Request::RemoveXattr { ino, name: name.to_vec() })? {
            Reply::RemoveXattr => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn fallocate(
        &self,
        ino: InodeId,
        _fh: FileHandle,
        offset: u64,
        len: u64,
        keep_size: bool,
    ) -> FsResult<()> {
        if keep_size {
            return Ok(());
        }
        let size = offset.checked_add(len).ok_or(FsError::FileTooLarge)?;
        match self.call_home(ino, Request::ExtendSize { ino, size })? {
            Reply::ExtendSize(_) => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn set_invalidator(&self, invalidator: Invalidator) {
        *self.caches.invalidator.lock().expect("invalidator lock") = Some(invalidator);
    }
}
