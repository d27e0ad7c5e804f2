//! Connecting RDMA queue pairs over the authenticated TCP handshake.
//!
//! ```text
//! client                                   server (Listener)
//! Hello(WANT_RDMA) .. Proof      ───►      (the usual handshake)
//!                  ◄───  Accept(features has OFFERS_RDMA)
//! RdmaInfo(client)               ───►      makes its queue pair, INIT -> RTR -> RTS
//!                  ◄───  RdmaInfo(server, imm client id)   or Refuse(reason)
//! INIT -> RTR -> RTS
//! RdmaReady                      ───►      hands the queue pair out (as a Link)
//! ```
//!
//! The server hands its queue pair out only after RdmaReady, so nothing it sends
//! reaches a client queue pair that cannot receive yet. The TCP stream stays open
//! as the control stream: its end, or a Refuse on it, ends the connection.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use super::device::RdmaDevice;
use super::info::ConnInfo;
use super::verbs::RdmaQp;
use super::RdmaConfig;
use crate::auth::{self, ClusterKey, OFFERS_RDMA, WANT_RDMA, WANT_SLOTS};
use crate::connect::{tcp_handshake, with_timeout, ConnectOptions};
use crate::msg::Kind;
use crate::qp::{ConnGuard, QpLimits};
use crate::NetError;

/// Connects to `addr` over RDMA with the device `opts.rdma` names: proves the
/// cluster key over TCP, exchanges queue pair addresses, and returns the connected
/// queue pair. `Unavailable` when this host has no usable device or the server does
/// not offer RDMA ([`crate::connect`] falls back to tcp instead).
pub fn connect(
    addr: SocketAddr,
    key: &ClusterKey,
    opts: &ConnectOptions,
) -> Result<RdmaQp, NetError> {
    let device = RdmaDevice::open(&opts.rdma)?;
    connect_with(addr, key, opts, device)
}

/// [`connect`] on a device already opened (one per process is enough).
pub fn connect_with(
    addr: SocketAddr,
    key: &ClusterKey,
    opts: &ConnectOptions,
    device: Arc<RdmaDevice>,
) -> Result<RdmaQp, NetError> {
    connect_booted(addr, key, opts, device).map(|(qp, _)| qp)
}

/// [`connect_with`], and the boot id the server's Accept carried.
pub(crate) fn connect_booted(
    addr: SocketAddr,
    key: &ClusterKey,
    opts: &ConnectOptions,
    device: Arc<RdmaDevice>,
) -> Result<(RdmaQp, u64), NetError> {
    let peer = addr.to_string();
    let (mut stream, accept) = tcp_handshake(addr, key, opts, WANT_RDMA | WANT_SLOTS)?;
    if accept.features & OFFERS_RDMA == 0 {
        return Err(NetError::Unavailable {
            transport: "rdma",
            reason: format!("{peer} does not offer rdma"),
        });
    }
    let mut qp = RdmaQp::create(
        device,
        format!("{peer} (rdma)"),
        opts.limits,
        opts.rdma.msg_bytes,
        accept.credits,
    )?;
    let mine = qp.local_info(0).encode();
    stream
        .write_all(&auth::message(Kind::RdmaInfo, &mine))
        .map_err(|e| NetError::io("send rdma info to", &peer, e))?;
    let (kind, p) = auth::read_message(&mut stream, &peer).map_err(|e| with_timeout(e, opts))?;
    let theirs = match kind {
        Kind::RdmaInfo => ConnInfo::decode(&p).map_err(|r| NetError::protocol(&peer, r))?,
        Kind::Refuse => return Err(auth::refused(&peer, &p)),
        kind => return Err(NetError::protocol(&peer, format!("expected rdma info, got {kind:?}"))),
    };
    qp.connect_to(&theirs, theirs.imm_client)?;
    stream
        .write_all(&auth::message(Kind::RdmaReady, &[]))
        .map_err(|e| NetError::io("send rdma ready to", &peer, e))?;
    qp.attach_control(stream, None)?;
    log::info!("rdma connection to {peer}: client id {}", theirs.imm_client);
    Ok((qp, accept.boot))
}

/// What a listener offers RDMA with.
#[derive(Debug, Default)]
pub(crate) struct Offer {
    device: Option<Arc<RdmaDevice>>,
    msg_bytes: u32,
    next_imm_client: u16,
}

impl Offer {
    /// Opens the device `cfg` names; without one, logs why and offers nothing.
    pub(crate) fn new(cfg: Option<&RdmaConfig>, at: &str) -> Offer {
        let Some(cfg) = cfg else { return Offer::default() };
        match RdmaDevice::open(cfg) {
            Ok(device) => {
                Offer { device: Some(device), msg_bytes: cfg.msg_bytes, next_imm_client: 0 }
            }
            Err(e) => {
                log::warn!("{at} does not offer rdma: {e}");
                Offer::default()
            }
        }
    }

    /// Whether clients may ask for RDMA.
    pub(crate) fn offered(&self) -> bool {
        self.device.is_some()
    }
}

/// The listener's side of one RDMA set-up, after the Accept.
#[derive(Debug)]
pub(crate) enum ServerSetup {
    /// Waiting for the client's RdmaInfo.
    AwaitInfo,
    /// Connected; waiting for RdmaReady before handing the queue pair out.
    AwaitReady(Box<RdmaQp>),
}

/// What the listener does next.
#[derive(Debug)]
pub(crate) enum SetupStep {
    /// Send the bytes, keep waiting in this state.
    Reply(ServerSetup, Vec<u8>),
    /// Hand this queue pair out (the control stream is attached).
    Done(Box<RdmaQp>),
}

impl ServerSetup {
    /// Handles one message from the client; `Err` is the reason to refuse.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_message(
        self,
        offer: &mut Offer,
        peer: &str,
        msg: Option<(Kind, &[u8])>,
        limits: QpLimits,
        credits: u32,
        control: &TcpStream,
        guard: impl FnOnce() -> ConnGuard,
    ) -> Result<SetupStep, String> {
        match (self, msg) {
            (ServerSetup::AwaitInfo, Some((Kind::RdmaInfo, p))) => {
                let theirs = ConnInfo::decode(p).map_err(|r| format!("peer {peer}: {r}"))?;
                let device = offer.device.clone().expect("rdma is only set up when offered");
                let mut qp = RdmaQp::create(
                    device,
                    format!("{peer} (rdma)"),
                    limits,
                    offer.msg_bytes,
                    credits,
                )
                .map_err(|e| e.to_string())?;
                let id = offer.next_imm_client;
                // Ids only check that a reply is meant for this queue pair, which the
                // RC connection already ensures; reuse after wrapping is harmless.
                offer.next_imm_client = id.wrapping_add(1);
                qp.connect_to(&theirs, id).map_err(|e| e.to_string())?;
                let reply = auth::message(Kind::RdmaInfo, &qp.local_info(id).encode());
                Ok(SetupStep::Reply(ServerSetup::AwaitReady(Box::new(qp)), reply))
            }
            (ServerSetup::AwaitReady(mut qp), Some((Kind::RdmaReady, []))) => {
                let s = control.try_clone().map_err(|e| format!("clone socket: {e}"))?;
                qp.attach_control(s, Some(guard())).map_err(|e| e.to_string())?;
                log::info!("accepted rdma connection from {peer}: client id {}", qp.imm_client());
                Ok(SetupStep::Done(qp))
            }
            (state, msg) => Err(format!(
                "peer {peer} sent {} during the rdma set-up, expected {}",
                msg.map_or("a frame".to_owned(), |(k, p)| format!("{k:?} of {} bytes", p.len())),
                match state {
                    ServerSetup::AwaitInfo => "its rdma info",
                    ServerSetup::AwaitReady(_) => "rdma ready",
                }
            )),
        }
    }
}
