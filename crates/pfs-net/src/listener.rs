//! [`Listener`]: accepts connections without blocking, runs their handshakes, and
//! hands out authenticated [`Link`]s; refuses past its connection limit. With
//! `ListenerConfig::rdma` (feature `rdma` and a device) it also sets up RDMA queue
//! pairs for clients that ask.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::auth::{
    self, AcceptInfo, ClusterKey, ServerHandshake, ServerStep, MAX_HANDSHAKE_PAYLOAD, OFFERS_RDMA,
    OFFERS_SHM,
};
use crate::link::Link;
use crate::msg::{checksum, Kind, NetHeader, MSG_HEADER_LEN};
use crate::poller::{Epoll, READ};
use crate::qp::{ConnGuard, Pipe, Qp, QpLimits};
use crate::rdma::{Offer, RdmaConfig};
#[cfg(feature = "rdma")]
use crate::rdma::{ServerSetup, SetupStep};
use crate::shm::{recv_with_fds, ShmPipe};
use crate::NetError;

const TOKEN_TCP: u64 = 0;
const TOKEN_UNIX: u64 = 1;
const TOKEN_FIRST_PENDING: u64 = 2;
/// Connections taken from the kernel per accept call and listener.
const ACCEPTS_PER_CALL: usize = 64;
/// Bytes a handshake can buffer: one message of the largest handshake payload.
const HANDSHAKE_BUF_BYTES: usize = MSG_HEADER_LEN + MAX_HANDSHAKE_PAYLOAD as usize;

/// How a [`Listener`] is set up.
#[derive(Clone, Debug)]
pub struct ListenerConfig {
    /// TCP address to listen on (port 0 picks one).
    pub addr: SocketAddr,
    /// The cluster key every peer must prove.
    pub key: ClusterKey,
    /// Connections (live and in handshake) beyond which new ones are refused.
    pub max_connections: usize,
    /// Requests a client may have in flight (`connection_queue_depth`).
    pub credits: u32,
    /// Offer shared memory to clients on this host.
    pub shm: bool,
    /// Time a peer has to finish the handshake.
    pub handshake_timeout: Duration,
    /// Sizes of each accepted queue pair.
    pub limits: QpLimits,
    /// Offer RDMA queue pairs on this device; without the `rdma` feature or a usable
    /// device a warning says why and nothing is offered.
    pub rdma: Option<RdmaConfig>,
    /// The boot id every Accept carries (random per `new`; a server sets its own).
    pub boot: u64,
}

/// A random non-zero boot id.
pub fn new_boot_id() -> u64 {
    let mut b = [0u8; 8];
    loop {
        if crate::poller::random_bytes(&mut b).is_err() {
            // No randomness: the clock still differs between two starts.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            b = (t ^ u64::from(std::process::id()) << 32).to_le_bytes();
        }
        let id = u64::from_le_bytes(b);
        if id != 0 {
            return id;
        }
    }
}

impl ListenerConfig {
    /// Defaults: 1024 connections, 128 credits, shm offered, 5 s handshake.
    pub fn new(addr: SocketAddr, key: ClusterKey) -> ListenerConfig {
        ListenerConfig {
            boot: new_boot_id(),
            addr,
            key,
            max_connections: 1024,
            credits: 128,
            shm: true,
            handshake_timeout: Duration::from_secs(5),
            limits: QpLimits::default(),
            rdma: None,
        }
    }
}

#[derive(Debug)]
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn raw(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
    fn write_small(&mut self, bytes: &[u8]) -> io::Result<()> {
        // A fresh socket's send buffer holds a handshake message whole; a short write
        // means a peer that does not read, and it is dropped.
        let n = match self {
            Stream::Tcp(s) => s.write(bytes)?,
            Stream::Unix(s) => s.write(bytes)?,
        };
        if n != bytes.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short handshake write"));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Pending {
    stream: Stream,
    peer: String,
    hs: ServerHandshake,
    buf: Vec<u8>,
    have: usize,
    deadline: Instant,
    awaiting_attach: bool,
    wants_slots: bool,
    fds: Vec<OwnedFd>,
    #[cfg(feature = "rdma")]
    rdma: Option<ServerSetup>,
}

/// What became of a pending connection after it made progress.
enum Outcome {
    Waiting,
    Done(Option<Box<Link>>),
}

/// Accepts TCP (and same-host shared-memory) connections without blocking.
#[derive(Debug)]
pub struct Listener {
    cfg: ListenerConfig,
    tcp: TcpListener,
    unix: Option<UnixListener>,
    local: SocketAddr,
    accept_info: AcceptInfo,
    epoll: Epoll,
    events: Vec<libc::epoll_event>,
    pending: Vec<Option<Pending>>,
    pending_count: usize,
    live: Arc<AtomicUsize>,
    rdma: Offer,
}

impl Listener {
    /// Binds the TCP socket (and the shared-memory socket when offered).
    pub fn bind(cfg: ListenerConfig) -> Result<Listener, NetError> {
        assert!(cfg.max_connections > 0 && cfg.credits > 0);
        let at = cfg.addr.to_string();
        let tcp = TcpListener::bind(cfg.addr).map_err(|e| NetError::io("listen on", &at, e))?;
        tcp.set_nonblocking(true).map_err(|e| NetError::io("configure", &at, e))?;
        let local = tcp.local_addr().map_err(|e| NetError::io("query", &at, e))?;
        let epoll = Epoll::new().map_err(|e| NetError::io("create epoll for", &at, e))?;
        epoll.add(tcp.as_raw_fd(), READ, TOKEN_TCP).map_err(|e| NetError::io("watch", &at, e))?;
        let mut accept_info = AcceptInfo {
            credits: cfg.credits,
            features: 0,
            boot: cfg.boot,
            shm_name: String::new(),
        };
        let unix = if cfg.shm {
            let name = shm_socket_name(local);
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| NetError::io("name shm socket", &name, e))?;
            let u =
                UnixListener::bind_addr(&addr).map_err(|e| NetError::io("listen on", &name, e))?;
            u.set_nonblocking(true).map_err(|e| NetError::io("configure", &name, e))?;
            epoll
                .add(u.as_raw_fd(), READ, TOKEN_UNIX)
                .map_err(|e| NetError::io("watch", &name, e))?;
            accept_info.features |= OFFERS_SHM;
            accept_info.shm_name = name;
            Some(u)
        } else {
            None
        };
        let rdma = Offer::new(cfg.rdma.as_ref(), &format!("listener on {local}"));
        if rdma.offered() {
            accept_info.features |= OFFERS_RDMA;
        }
        let slots = cfg.max_connections;
        Ok(Listener {
            tcp,
            unix,
            local,
            accept_info,
            epoll,
            events: Vec::with_capacity(64),
            pending: (0..slots).map(|_| None).collect(),
            pending_count: 0,
            live: Arc::new(AtomicUsize::new(0)),
            rdma,
            cfg,
        })
    }

    /// Sets the boot id the Accepts of connections accepted from now on carry
    /// (a server that kept its id across a clean stop sets it before it
    /// accepts anyone).
    pub fn set_boot(&mut self, boot: u64) {
        self.accept_info.boot = boot;
        self.cfg.boot = boot;
    }

    /// The boot id the Accepts carry.
    pub fn boot(&self) -> u64 {
        self.accept_info.boot
    }

    /// The bound TCP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Whether clients that ask get RDMA queue pairs.
    pub fn offers_rdma(&self) -> bool {
        self.rdma.offered()
    }

    /// Queue pairs made and not yet dropped.
    pub fn live_connections(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Readable when a connection or handshake needs attention; park on it.
    pub fn wait_fd(&self) -> RawFd {
        self.epoll.raw()
    }

    /// Takes new connections and advances handshakes without blocking; appends the
    /// authenticated links (tcp, shm or RDMA) to `out` and returns how many. A peer that fails its
    /// handshake is refused with a logged reason and does not disturb the others.
    pub fn accept(&mut self, out: &mut Vec<Link>) -> Result<usize, NetError> {
        let before = out.len();
        let mut events = std::mem::take(&mut self.events);
        let result = self.epoll.ready(&mut events);
        for ev in &events {
            match ev.u64 {
                TOKEN_TCP => self.accept_tcp(),
                TOKEN_UNIX => self.accept_unix(),
                t => self.drive((t - TOKEN_FIRST_PENDING) as usize, out),
            }
        }
        self.events = events;
        result.map_err(|e| NetError::io("wait on", self.local.to_string(), e))?;
        if self.pending_count > 0 {
            self.expire();
        }
        Ok(out.len() - before)
    }

    fn at_limit(&self) -> bool {
        self.live.load(Ordering::Acquire) + self.pending_count >= self.cfg.max_connections
    }

    fn accept_tcp(&mut self) {
        for _ in 0..ACCEPTS_PER_CALL {
            match self.tcp.accept() {
                Ok((s, addr)) => self.admit(Stream::Tcp(s), addr.to_string()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    // Out of descriptors and the like: the listener itself is fine.
                    log::warn!("accept on {}: {e}", self.local);
                    return;
                }
            }
        }
    }

    fn accept_unix(&mut self) {
        for _ in 0..ACCEPTS_PER_CALL {
            let Some(u) = &self.unix else { return };
            match u.accept() {
                Ok((s, _)) => {
                    let peer = format!(
                        "shm peer pid {}",
                        peer_pid(&s).map_or("?".into(), |p| p.to_string())
                    );
                    self.admit(Stream::Unix(s), peer);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("accept on {}: {e}", self.accept_info.shm_name);
                    return;
                }
            }
        }
    }

    fn admit(&mut self, mut stream: Stream, peer: String) {
        let nb = match &stream {
            Stream::Tcp(s) => s.set_nonblocking(true).and_then(|_| s.set_nodelay(true)),
            Stream::Unix(s) => s.set_nonblocking(true),
        };
        if let Err(e) = nb {
            log::warn!("dropping connection from {peer}: {e}");
            return;
        }
        if self.at_limit() {
            let reason = format!(
                "server {} is at its limit of {} connections",
                self.local, self.cfg.max_connections
            );
            log::warn!("refusing connection from {peer}: {reason}");
            let _ = stream.write_small(&auth::refusal(&reason));
            return;
        }
        let slot =
            self.pending.iter().position(Option::is_none).expect("below the limit a slot is free");
        if let Err(e) = self.epoll.add(stream.raw(), READ, TOKEN_FIRST_PENDING + slot as u64) {
            log::warn!("dropping connection from {peer}: cannot watch it: {e}");
            return;
        }
        self.pending[slot] = Some(Pending {
            stream,
            peer,
            hs: ServerHandshake::new(),
            buf: vec![0; HANDSHAKE_BUF_BYTES],
            have: 0,
            deadline: Instant::now() + self.cfg.handshake_timeout,
            awaiting_attach: false,
            wants_slots: false,
            fds: Vec::new(),
            #[cfg(feature = "rdma")]
            rdma: None,
        });
        self.pending_count += 1;
    }

    fn remove(&mut self, slot: usize) -> Pending {
        let p = self.pending[slot].take().expect("slot is pending");
        self.pending_count -= 1;
        let _ = self.epoll.delete(p.stream.raw());
        p
    }

    fn expire(&mut self) {
        let now = Instant::now();
        for slot in 0..self.pending.len() {
            if self.pending[slot].as_ref().is_some_and(|p| p.deadline <= now) {
                let mut p = self.remove(slot);
                let e = NetError::HandshakeTimeout {
                    peer: p.peer.clone(),
                    timeout_ms: self.cfg.handshake_timeout.as_millis() as u64,
                };
                let reason = format!(
                    "{e}; cluster key mismatch: peer {} did not prove the cluster key",
                    p.peer
                );
                log::warn!("refusing connection from {}: {reason}", p.peer);
                let _ = p.stream.write_small(&auth::refusal(&reason));
            }
        }
    }

    fn drive(&mut self, slot: usize, out: &mut Vec<Link>) {
        let Some(p) = self.pending[slot].as_mut() else { return };
        let r = step(p, &self.cfg, &self.accept_info, &self.live, &mut self.rdma);
        match r {
            Ok(Outcome::Waiting) => {}
            Ok(Outcome::Done(qp)) => {
                let p = self.remove(slot);
                if let Some(qp) = qp {
                    out.push(*qp);
                } else {
                    log::debug!("{} took the shm socket name; probe connection closed", p.peer);
                }
            }
            Err(reason) => {
                let mut p = self.remove(slot);
                if let Some(reason) = reason {
                    log::warn!("refusing connection from {}: {reason}", p.peer);
                    let _ = p.stream.write_small(&auth::refusal(&reason));
                    drain(&mut p.stream);
                }
            }
        }
    }
}

/// Reads what the peer already sent (bounded), so closing sends FIN, not RST, and
/// the peer can read the refusal.
fn drain(s: &mut Stream) {
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        let r = match s {
            Stream::Tcp(t) => {
                let _ = t.shutdown(std::net::Shutdown::Write);
                t.read(&mut sink)
            }
            Stream::Unix(u) => u.read(&mut sink),
        };
        if !matches!(r, Ok(n) if n > 0) {
            return;
        }
    }
}

/// Advances one handshake. `Err(Some(reason))`: refuse; `Err(None)`: the peer left.
fn step(
    p: &mut Pending,
    cfg: &ListenerConfig,
    info: &AcceptInfo,
    live: &Arc<AtomicUsize>,
    offer: &mut Offer,
) -> Result<Outcome, Option<String>> {
    let n = match &mut p.stream {
        Stream::Tcp(s) => s.read(&mut p.buf[p.have..]),
        Stream::Unix(s) => recv_with_fds(s, &mut p.buf[p.have..], &mut p.fds),
    };
    match n {
        Ok(0) => {
            log::info!("{} closed the connection during the handshake", p.peer);
            return Err(None);
        }
        Ok(n) => p.have += n,
        Err(e)
            if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted =>
        {
            return Ok(Outcome::Waiting)
        }
        Err(e) => {
            log::info!("{} failed during the handshake: {e}", p.peer);
            return Err(None);
        }
    }
    loop {
        if p.have < MSG_HEADER_LEN {
            return Ok(Outcome::Waiting);
        }
        let head = &p.buf[..MSG_HEADER_LEN];
        let msg = if head[..4] == pfs_core::wire::MAGIC.to_le_bytes() {
            None
        } else {
            let h = NetHeader::decode(head)
                .map_err(|r| Some(format!("peer {} broke the handshake: {r}", p.peer)))?;
            if h.len > MAX_HANDSHAKE_PAYLOAD {
                return Err(Some(format!("peer {} sent a handshake message of {} bytes, over the limit {MAX_HANDSHAKE_PAYLOAD}", p.peer, h.len)));
            }
            let total = MSG_HEADER_LEN + h.len as usize;
            if p.have < total {
                return Ok(Outcome::Waiting);
            }
            let stored = u32::from_le_bytes(p.buf[28..32].try_into().expect("4"));
            if checksum(&p.buf[..28], &p.buf[MSG_HEADER_LEN..total]) != stored {
                return Err(Some(format!(
                    "peer {} broke the handshake: checksum mismatch",
                    p.peer
                )));
            }
            Some((h.kind, total))
        };
        if p.awaiting_attach {
            return attach(p, msg, cfg, live)
                .map(|qp| Outcome::Done(Some(Box::new(server_link(qp, p)))))
                .map_err(Some);
        }
        #[cfg(feature = "rdma")]
        if let Some(setup) = p.rdma.take() {
            let Stream::Tcp(control) = &p.stream else { unreachable!("rdma is set up over tcp") };
            let guard = || {
                live.fetch_add(1, Ordering::AcqRel);
                ConnGuard(live.clone())
            };
            let payload = msg.map(|(k, total)| (k, &p.buf[MSG_HEADER_LEN..total]));
            let next = setup
                .on_message(offer, &p.peer, payload, cfg.limits, cfg.credits, control, guard)
                .map_err(Some)?;
            let consumed = msg.map_or(p.have, |(_, total)| total);
            p.buf.copy_within(consumed..p.have, 0);
            p.have -= consumed;
            match next {
                SetupStep::Reply(state, bytes) => {
                    p.stream
                        .write_small(&bytes)
                        .map_err(|e| Some(format!("handshake write: {e}")))?;
                    p.rdma = Some(state);
                    continue;
                }
                SetupStep::Done(qp) if p.have == 0 => {
                    return Ok(Outcome::Done(Some(Box::new(server_link(*qp, p)))))
                }
                SetupStep::Done(_) => {
                    return Err(Some(format!(
                        "peer {} sent {} bytes after rdma ready",
                        p.peer, p.have
                    )))
                }
            }
        }
        let step = p.hs.on_message(
            &cfg.key,
            &p.peer,
            msg.map(|(k, total)| (k, &p.buf[MSG_HEADER_LEN..total])),
            info,
        );
        let consumed = msg.map_or(p.have, |(_, total)| total);
        p.buf.copy_within(consumed..p.have, 0);
        p.have -= consumed;
        match step {
            ServerStep::Reply(bytes) => {
                p.stream.write_small(&bytes).map_err(|e| Some(format!("handshake write: {e}")))?;
            }
            ServerStep::Refuse(reason) => return Err(Some(reason)),
            ServerStep::Accepted { reply, wants_shm, wants_rdma, wants_slots } => {
                p.wants_slots = wants_slots;
                p.stream.write_small(&reply).map_err(|e| Some(format!("handshake write: {e}")))?;
                if p.have != 0 {
                    return Err(Some(format!(
                        "peer {} sent {} bytes before the accept",
                        p.peer, p.have
                    )));
                }
                match &p.stream {
                    Stream::Unix(_) => p.awaiting_attach = true,
                    Stream::Tcp(_) if wants_shm && info.features & OFFERS_SHM != 0 => {
                        return Ok(Outcome::Done(None));
                    }
                    Stream::Tcp(_) if wants_rdma && offer.offered() => {
                        // The client sends its RdmaInfo next.
                        #[cfg(feature = "rdma")]
                        {
                            p.rdma = Some(ServerSetup::AwaitInfo);
                        }
                    }
                    Stream::Tcp(s) => {
                        let s = s.try_clone().map_err(|e| Some(format!("clone socket: {e}")))?;
                        let qp = make_qp(p.peer.clone(), Pipe::Tcp(s), cfg, live).map_err(Some)?;
                        return Ok(Outcome::Done(Some(Box::new(server_link(qp, p)))));
                    }
                }
            }
        }
    }
}

/// The server's side of an accepted link, with the role its peer proved.
fn server_link(qp: impl Into<crate::link::Inner>, p: &Pending) -> Link {
    let mut link = Link::server(qp, p.wants_slots);
    link.set_peer_is_server(p.hs.peer_is_server());
    link
}

fn make_qp(
    peer: String,
    pipe: Pipe,
    cfg: &ListenerConfig,
    live: &Arc<AtomicUsize>,
) -> Result<Qp, String> {
    live.fetch_add(1, Ordering::AcqRel);
    let guard = ConnGuard(live.clone());
    let qp = Qp::new(peer.clone(), pipe, cfg.limits, cfg.credits, Some(guard))
        .map_err(|e| e.to_string())?;
    log::info!("accepted {:?} connection from {peer}", crate::QueuePair::backend(&qp));
    Ok(qp)
}

/// Maps the client's shared memory from the fds that came with its ShmAttach.
fn attach(
    p: &mut Pending,
    msg: Option<(Kind, usize)>,
    cfg: &ListenerConfig,
    live: &Arc<AtomicUsize>,
) -> Result<Qp, String> {
    let payload = match msg {
        Some((Kind::ShmAttach, total)) if total == MSG_HEADER_LEN + 4 => {
            &p.buf[MSG_HEADER_LEN..total]
        }
        _ => return Err(format!("peer {} sent something other than a shm attach", p.peer)),
    };
    let ring_bytes = u32::from_le_bytes(payload.try_into().expect("4"));
    let fds: [OwnedFd; 3] = std::mem::take(&mut p.fds).try_into().map_err(|v: Vec<OwnedFd>| {
        format!("shm attach came with {} descriptors, expected 3", v.len())
    })?;
    let Stream::Unix(s) = &p.stream else { unreachable!("attach only on the unix socket") };
    let s = s.try_clone().map_err(|e| format!("clone socket: {e}"))?;
    let pipe = ShmPipe::attach(s, ring_bytes, fds).map_err(|r| format!("peer {}: {r}", p.peer))?;
    p.stream
        .write_small(&auth::message(Kind::Accept, &[]))
        .map_err(|e| format!("handshake write: {e}"))?;
    make_qp(p.peer.clone(), Pipe::Shm(pipe), cfg, live)
}

/// A name unique to this listener in the abstract unix socket namespace.
fn shm_socket_name(local: SocketAddr) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("pfs-net.{}.{}.{n}", std::process::id(), local.port())
}

fn peer_pid(s: &UnixStream) -> Option<i32> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred.pid)
}
