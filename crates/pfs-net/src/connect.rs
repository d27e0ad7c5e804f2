//! Client-side connection set-up: RDMA when asked for and possible, shared memory
//! for a server on this host (a loopback address that offers it), TCP otherwise.
//! RDMA asked for and impossible (no device, a build without the `rdma` feature, a
//! server that does not offer it) falls back to tcp with a warning that says why.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::auth::{self, client_handshake, ClusterKey, OFFERS_SHM, WANT_SHM, WANT_SLOTS};
use crate::link::{Link, SlotRpc};
use crate::msg::{Kind, NetHeader, MSG_HEADER_LEN};
use crate::qp::{Pipe, Qp, QpLimits};
use crate::rdma::RdmaConfig;
use crate::shm::{send_with_fds, ShmPipe, DEFAULT_RING_BYTES};
use crate::NetError;

/// Which transport a client asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportKind {
    /// Shared memory when the server is on a loopback address and offers it, else TCP.
    #[default]
    Auto,
    /// TCP only.
    Tcp,
    /// Shared memory or an error.
    Shm,
    /// RDMA; falls back to TCP, with a warning, when there is no device or the build
    /// lacks the `rdma` feature.
    Rdma,
}

/// How [`connect`] sets up a connection.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The transport wanted.
    pub transport: TransportKind,
    /// Time for the TCP connect and for each handshake read.
    pub timeout: Duration,
    /// Sizes of the queue pair.
    pub limits: QpLimits,
    /// Bytes in each shared-memory ring.
    pub ring_bytes: u32,
    /// Device and buffer sizes for RDMA.
    pub rdma: RdmaConfig,
    /// Slot RPC ([`crate::link`]) over tcp and shm; RDMA links always use it (with
    /// [`RdmaConfig::slots`] slots).
    pub slot_rpc: Option<SlotRpc>,
    /// This side is a storage server ([`auth::PEER_IS_SERVER`]), not a client.
    pub as_server: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            transport: TransportKind::Auto,
            timeout: Duration::from_secs(5),
            limits: QpLimits::default(),
            ring_bytes: DEFAULT_RING_BYTES,
            rdma: RdmaConfig::default(),
            slot_rpc: None,
            as_server: false,
        }
    }
}

/// The Hello features every handshake of `opts` carries besides its own.
fn role_bits(opts: &ConnectOptions) -> u32 {
    if opts.as_server {
        auth::PEER_IS_SERVER
    } else {
        0
    }
}

/// Connects to `addr`, proves the cluster key, and returns the link.
pub fn connect(
    addr: SocketAddr,
    key: &ClusterKey,
    opts: &ConnectOptions,
) -> Result<Link, NetError> {
    let peer = addr.to_string();
    let mut transport = opts.transport;
    if transport == TransportKind::Rdma {
        match connect_rdma(addr, key, opts) {
            Ok(link) => return Ok(link),
            Err(NetError::Unavailable { reason, .. }) => {
                log::warn!("rdma requested for {peer}: {reason}; falling back to tcp")
            }
            Err(e) => return Err(e),
        }
        transport = TransportKind::Tcp;
    }
    let slots = opts.slot_rpc;
    let link = |qp: Qp, boot: u64| {
        let mut link = Link::client(qp, slots, opts.timeout)?;
        link.set_server_boot(boot);
        Ok(link)
    };
    let wants = if slots.is_some() { WANT_SLOTS } else { 0 };
    let local = addr.ip().is_loopback();
    if transport == TransportKind::Shm && !local {
        return Err(NetError::Unavailable {
            transport: "shm",
            reason: format!("{peer} is not a loopback address"),
        });
    }
    let want_shm =
        matches!(transport, TransportKind::Shm) || (transport == TransportKind::Auto && local);
    let (stream, info) = tcp_handshake(addr, key, opts, if want_shm { WANT_SHM } else { wants })?;
    if want_shm && info.features & OFFERS_SHM != 0 {
        // The server closes this probe connection; come back over shared memory.
        drop(stream);
        match connect_shm(addr, &info.shm_name, key, opts) {
            Ok((qp, boot)) => return link(qp, boot),
            Err(e) if transport == TransportKind::Auto => {
                log::warn!("shared memory to {peer} failed ({e}); using tcp");
                let (stream, info) = tcp_handshake(addr, key, opts, wants)?;
                let qp = Qp::new(peer, Pipe::Tcp(stream), opts.limits, info.credits, None)?;
                return link(qp, info.boot);
            }
            Err(e) => return Err(e),
        }
    }
    if transport == TransportKind::Shm {
        return Err(NetError::Unavailable {
            transport: "shm",
            reason: format!("{peer} does not offer shared memory"),
        });
    }
    link(Qp::new(peer, Pipe::Tcp(stream), opts.limits, info.credits, None)?, info.boot)
}

/// An RDMA link with slot RPC; `Unavailable` (with the reason) when this host or
/// build cannot, or the server does not offer it.
#[cfg(feature = "rdma")]
fn connect_rdma(
    addr: SocketAddr,
    key: &ClusterKey,
    opts: &ConnectOptions,
) -> Result<Link, NetError> {
    let device = crate::rdma::RdmaDevice::open(&opts.rdma)?;
    let (qp, boot) = crate::rdma::connect_booted(addr, key, opts, device)?;
    let slots = SlotRpc { slots: opts.rdma.slots, inline_bytes: qp.max_send_bytes() };
    let mut link = Link::client(qp, Some(slots), opts.timeout)?;
    link.set_server_boot(boot);
    Ok(link)
}

#[cfg(not(feature = "rdma"))]
fn connect_rdma(_: SocketAddr, _: &ClusterKey, _: &ConnectOptions) -> Result<Link, NetError> {
    Err(NetError::Unavailable {
        transport: "rdma",
        reason: crate::rdma::device_count().expect_err("no rdma in this build"),
    })
}

pub(crate) fn tcp_handshake(
    addr: SocketAddr,
    key: &ClusterKey,
    opts: &ConnectOptions,
    features: u32,
) -> Result<(TcpStream, auth::AcceptInfo), NetError> {
    let peer = addr.to_string();
    let mut s = TcpStream::connect_timeout(&addr, opts.timeout)
        .map_err(|e| NetError::io("connect to", &peer, e))?;
    s.set_read_timeout(Some(opts.timeout)).map_err(|e| NetError::io("configure", &peer, e))?;
    s.set_write_timeout(Some(opts.timeout)).map_err(|e| NetError::io("configure", &peer, e))?;
    s.set_nodelay(true).map_err(|e| NetError::io("configure", &peer, e))?;
    let info = client_handshake(&mut s, key, &peer, features | role_bits(opts))
        .map_err(|e| with_timeout(e, opts))?;
    Ok((s, info))
}

pub(crate) fn with_timeout(e: NetError, opts: &ConnectOptions) -> NetError {
    match e {
        NetError::HandshakeTimeout { peer, .. } => {
            NetError::HandshakeTimeout { peer, timeout_ms: opts.timeout.as_millis() as u64 }
        }
        e => e,
    }
}

fn connect_shm(
    addr: SocketAddr,
    name: &str,
    key: &ClusterKey,
    opts: &ConnectOptions,
) -> Result<(Qp, u64), NetError> {
    let peer = format!("{addr} (shm)");
    let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| NetError::io("name shm socket", &peer, e))?;
    let mut s = UnixStream::connect_addr(&sa).map_err(|e| NetError::io("connect to", &peer, e))?;
    s.set_read_timeout(Some(opts.timeout)).map_err(|e| NetError::io("configure", &peer, e))?;
    s.set_write_timeout(Some(opts.timeout)).map_err(|e| NetError::io("configure", &peer, e))?;
    let wants = if opts.slot_rpc.is_some() { WANT_SLOTS } else { 0 } | role_bits(opts);
    let info = client_handshake(&mut s, key, &peer, wants).map_err(|e| with_timeout(e, opts))?;
    let pipe_sock = s.try_clone().map_err(|e| NetError::io("clone socket to", &peer, e))?;
    let (pipe, fds) = ShmPipe::create(pipe_sock, opts.ring_bytes)
        .map_err(|e| NetError::io("create shm for", &peer, e))?;
    let attach = auth::message(Kind::ShmAttach, &opts.ring_bytes.to_le_bytes());
    send_with_fds(&s, &attach, &fds).map_err(|e| NetError::io("send shm fds to", &peer, e))?;
    drop(fds);
    let mut head = [0u8; MSG_HEADER_LEN];
    s.read_exact(&mut head).map_err(|e| NetError::io("read shm attach answer from", &peer, e))?;
    let h = NetHeader::decode(&head).map_err(|r| NetError::protocol(&peer, r))?;
    match h.kind {
        Kind::Accept if h.len == 0 => {
            Ok((Qp::new(peer, Pipe::Shm(pipe), opts.limits, info.credits, None)?, info.boot))
        }
        Kind::Refuse if h.len <= auth::MAX_HANDSHAKE_PAYLOAD => {
            let mut reason = vec![0u8; h.len as usize];
            let _ = s.read_exact(&mut reason);
            Err(NetError::Refused { peer, reason: String::from_utf8_lossy(&reason).into_owned() })
        }
        kind => Err(NetError::protocol(peer, format!("expected the shm accept, got {kind:?}"))),
    }
}
