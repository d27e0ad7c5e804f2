//! [`RpcClient`]: requests over one queue pair, matched to replies by request id.
//!
//! Bounded: at most `credits` requests in flight (the smaller of the client's and
//! the server's), each in a fixed slot; the request id is `(sequence << 16) | slot`,
//! so a reply finds its slot without a search and a late reply to a reused slot is
//! recognised and dropped. A request past its deadline fails with `TimedOut`. When
//! the connection drops, waiting requests fail with `Disconnected` (they are not
//! resent: a write may or may not have happened) and the client reconnects on a
//! later send, with exponential back-off.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pfs_core::wire::{FrameHeader, Sum, WireError, WriteRef, FLAG_REPLY};
use pfs_core::{ClientId, Frame, RequestId};

use crate::auth::ClusterKey;
use crate::connect::{connect, ConnectOptions};
use crate::link::Link;
use crate::poller::wait_readable;
use crate::transport::{Completion, QueuePair, WorkId};
use crate::NetError;

/// Bits of a request id that name its slot.
const SLOT_BITS: u32 = 16;
/// Most credits a client can use.
pub const MAX_CREDITS: u32 = 1 << SLOT_BITS;

/// How an [`RpcClient`] behaves.
#[derive(Clone, Debug)]
pub struct RpcOptions {
    /// Connection set-up.
    pub connect: ConnectOptions,
    /// Most requests in flight (the server may grant fewer).
    pub credits: u32,
    /// Deadline of a request sent with [`RpcClient::send`].
    pub timeout: Duration,
    /// First wait before reconnecting after a failed attempt.
    pub backoff_min: Duration,
    /// Longest wait between reconnection attempts.
    pub backoff_max: Duration,
    /// Unsolicited frames from the server (token invalidations) held until taken.
    pub notify_depth: usize,
    /// This client's id, written into every request header.
    pub client: ClientId,
}

impl Default for RpcOptions {
    fn default() -> Self {
        RpcOptions {
            connect: ConnectOptions::default(),
            credits: 128,
            timeout: Duration::from_secs(30),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(2),
            notify_depth: 16,
            client: ClientId(0),
        }
    }
}

#[derive(Debug)]
enum SlotState {
    Free,
    Waiting {
        deadline: Instant,
    },
    /// The reply, and the boot id of the server link it came on.
    Ready(Vec<u8>, u64),
    Failed(String),
}

#[derive(Debug)]
struct Slot {
    id: u64,
    state: SlotState,
}

/// A client connection that sends request frames and polls for their replies.
#[derive(Debug)]
pub struct RpcClient {
    addr: SocketAddr,
    peer: String,
    key: ClusterKey,
    opts: RpcOptions,
    qp: Option<Link>,
    credits: usize,
    in_flight: usize,
    slots: Vec<Slot>,
    free: Vec<u32>,
    seq: u64,
    bufs: Vec<Vec<u8>>,
    completions: Vec<Completion>,
    notifications: VecDeque<Vec<u8>>,
    backoff: Duration,
    next_attempt: Instant,
    last_error: String,
}

impl RpcClient {
    /// Connects to `addr`; fails if the first connection fails.
    pub fn connect(
        addr: SocketAddr,
        key: ClusterKey,
        opts: RpcOptions,
    ) -> Result<RpcClient, NetError> {
        let mut c = RpcClient::connect_later(addr, key, opts);
        c.reconnect()?;
        Ok(c)
    }

    /// A client of `addr` that connects at its first send: a server that is
    /// down now (a client started while one of many servers restarts) is
    /// reached once it is back, with the usual back-off.
    pub fn connect_later(addr: SocketAddr, key: ClusterKey, opts: RpcOptions) -> RpcClient {
        assert!(opts.credits > 0 && opts.credits <= MAX_CREDITS, "credits in 1..={MAX_CREDITS}");
        let slots = opts.credits as usize;
        RpcClient {
            addr,
            peer: addr.to_string(),
            key,
            qp: None,
            credits: slots,
            in_flight: 0,
            slots: (0..slots).map(|_| Slot { id: 0, state: SlotState::Free }).collect(),
            free: (0..slots as u32).rev().collect(),
            seq: 1,
            bufs: Vec::with_capacity(slots + opts.notify_depth),
            completions: Vec::with_capacity(crate::POLL_BATCH),
            notifications: VecDeque::with_capacity(opts.notify_depth),
            backoff: opts.backoff_min,
            next_attempt: Instant::now(),
            last_error: String::new(),
            opts,
        }
    }

    /// The address this client connects to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Points this client at `addr` from now on (the server came back at
    /// another address): a link to the old one is dropped, failing the
    /// requests that wait on it as a lost connection does, and the next send
    /// connects at once.
    pub fn retarget(&mut self, addr: SocketAddr) {
        if addr == self.addr {
            return;
        }
        log::info!("{} moved to {addr}: connecting there from now on", self.peer);
        if self.qp.is_some() {
            let peer = self.peer.clone();
            self.lost(NetError::Down { peer, reason: format!("the server moved to {addr}") });
        }
        self.addr = addr;
        self.peer = addr.to_string();
        self.backoff = self.opts.backoff_min;
        self.next_attempt = Instant::now();
    }

    /// Notices a link whose server died while nothing was asked of it (the
    /// waiting requests fail, the next send connects again): called now and
    /// then on an idle connection, so the first request after a server's
    /// restart is not sent into the dead link and lost.
    pub fn check_peer(&mut self) {
        if let Some(qp) = self.qp.as_mut() {
            qp.check_peer();
            self.progress();
        }
    }

    /// The queue pair, while connected.
    pub fn qp(&self) -> Option<&Link> {
        self.qp.as_ref()
    }

    /// The boot id of the server process the current link reaches (`None` while
    /// disconnected); it changes when the server restarts.
    pub fn server_boot(&self) -> Option<u64> {
        self.qp.as_ref().map(Link::server_boot)
    }

    /// Requests that may be in flight at once.
    pub fn credits(&self) -> usize {
        self.credits
    }

    /// Requests sent and not yet answered, failed or timed out.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn reconnect(&mut self) -> Result<(), NetError> {
        let now = Instant::now();
        if now < self.next_attempt {
            return Err(NetError::Disconnected {
                peer: self.peer.clone(),
                retry_in_ms: (self.next_attempt - now).as_millis() as u64,
                reason: self.last_error.clone(),
            });
        }
        match connect(self.addr, &self.key, &self.opts.connect) {
            Ok(mut qp) => {
                let recvs = (qp.credits() as usize).min(self.slots.len()) + self.opts.notify_depth;
                for _ in 0..recvs {
                    let buf = self.bufs.pop().unwrap_or_default();
                    if let Err(r) = qp.post_recv(buf) {
                        self.bufs.push(r.buf);
                        break;
                    }
                }
                self.credits = (qp.credits() as usize).min(self.slots.len());
                log::info!(
                    "connected to {} over {:?} with {} credits",
                    self.peer,
                    qp.backend(),
                    self.credits
                );
                self.qp = Some(qp);
                self.backoff = self.opts.backoff_min;
                Ok(())
            }
            Err(e) => {
                self.last_error = e.to_string();
                self.next_attempt = now + self.backoff;
                log::warn!(
                    "connect to {} failed (next attempt in {:?}): {e}",
                    self.peer,
                    self.backoff
                );
                self.backoff = (self.backoff * 2).min(self.opts.backoff_max);
                Err(e)
            }
        }
    }

    /// Sends `frame` as a request with a fresh id and the default timeout.
    pub fn send(&mut self, frame: &Frame) -> Result<RequestId, NetError> {
        self.send_by(frame, Instant::now() + self.opts.timeout)
    }

    /// Sends `frame` as a request that times out at `deadline`. Fails with `NoCredit`
    /// when every credit is in use (poll replies first) and `Disconnected` while the
    /// client waits to reconnect.
    pub fn send_by(&mut self, frame: &Frame, deadline: Instant) -> Result<RequestId, NetError> {
        self.send_to(frame, 0, deadline)
    }

    /// Sends `frame` as a request for processing worker `worker` of the server
    /// (the routing result, written into the header), timing out at `deadline`.
    pub fn send_to(
        &mut self,
        frame: &Frame,
        worker: u16,
        deadline: Instant,
    ) -> Result<RequestId, NetError> {
        self.send_with(deadline, |out, client, id, sum| {
            frame.encode_summed(out, client, id, worker, sum)
        })
    }

    /// [`send_to`](Self::send_to) of a write whose data the caller holds:
    /// the data is copied once, into the frame.
    pub fn send_write(
        &mut self,
        write: &WriteRef<'_>,
        worker: u16,
        deadline: Instant,
    ) -> Result<RequestId, NetError> {
        self.send_with(deadline, |out, client, id, sum| {
            write.encode_summed(out, client, id, worker, sum)
        })
    }

    /// Sends the request frame `encode` appends (addressed to this client and
    /// the request id it is given, its checksum covering what the link needs:
    /// through shared memory the header only, `docs/format.md`).
    fn send_with(
        &mut self,
        deadline: Instant,
        encode: impl FnOnce(&mut Vec<u8>, ClientId, RequestId, Sum) -> Result<(), WireError>,
    ) -> Result<RequestId, NetError> {
        if self.qp.is_none() {
            self.reconnect().map_err(|e| match e {
                e @ NetError::Disconnected { .. } => e,
                e => NetError::Disconnected {
                    peer: self.peer.clone(),
                    retry_in_ms: self
                        .next_attempt
                        .saturating_duration_since(Instant::now())
                        .as_millis() as u64,
                    reason: e.to_string(),
                },
            })?;
        }
        if self.in_flight >= self.credits {
            return Err(NetError::NoCredit { peer: self.peer.clone(), in_flight: self.in_flight });
        }
        let slot = self.free.pop().expect("a credit left means a free slot");
        let id = (self.seq << SLOT_BITS) | u64::from(slot);
        self.seq += 1;
        let mut buf = self.bufs.pop().unwrap_or_default();
        buf.clear();
        let sum = link_sum(self.qp.as_ref().expect("connected above").backend());
        if let Err(source) = encode(&mut buf, self.opts.client, RequestId(id), sum) {
            self.free.push(slot);
            self.bufs.push(buf);
            return Err(NetError::Wire { peer: self.peer.clone(), source });
        }
        let qp = self.qp.as_mut().expect("connected above");
        if let Err(r) = qp.post_send(WorkId(id), buf) {
            self.free.push(slot);
            self.bufs.push(r.buf);
            return Err(r.error);
        }
        self.slots[slot as usize] = Slot { id, state: SlotState::Waiting { deadline } };
        self.in_flight += 1;
        Ok(RequestId(id))
    }

    /// Makes progress without blocking; returns the reply to `id` once it is here.
    pub fn poll(&mut self, id: RequestId) -> Result<Option<Frame>, NetError> {
        Ok(self.poll_boot(id)?.map(|(f, _)| f))
    }

    /// [`poll`](Self::poll), and the boot id of the server process that sent the
    /// reply (from the handshake of the link it came on).
    pub fn poll_boot(&mut self, id: RequestId) -> Result<Option<(Frame, u64)>, NetError> {
        let Some((buf, boot)) = self.poll_raw(id)? else { return Ok(None) };
        // The transport checked the frame's checksum when it received it.
        let decoded = Frame::decode_received(&buf);
        self.recycle(buf);
        match decoded {
            Ok(frame) => Ok(Some((frame, boot))),
            Err(source) => Err(self.bad_frame(source)),
        }
    }

    /// Closes the connection over a reply frame that does not decode; the error.
    pub fn bad_frame(&mut self, source: WireError) -> NetError {
        let e = NetError::Wire { peer: self.peer.clone(), source };
        if let Some(qp) = self.qp.as_mut() {
            qp.close(&e.to_string());
        }
        e
    }

    /// [`poll_boot`](Self::poll_boot) without decoding: the reply frame's bytes
    /// as received (header, length and checksum checked by the transport) and
    /// the boot id. Hand the buffer back with [`give_back`](Self::give_back)
    /// once read, so the connection posts it for the next receive.
    pub fn poll_raw(&mut self, id: RequestId) -> Result<Option<(Vec<u8>, u64)>, NetError> {
        self.progress();
        let slot = (id.0 & ((1 << SLOT_BITS) - 1)) as usize;
        let s = match self.slots.get_mut(slot) {
            Some(s) if s.id == id.0 && !matches!(s.state, SlotState::Free) => s,
            _ => return Err(NetError::UnknownRequest(id.0)),
        };
        let result = match &s.state {
            SlotState::Waiting { deadline } if Instant::now() < *deadline => return Ok(None),
            SlotState::Waiting { .. } => Err(NetError::TimedOut {
                request_id: id.0,
                peer: self.peer.clone(),
                timeout_ms: self.opts.timeout.as_millis() as u64,
            }),
            SlotState::Failed(reason) => Err(NetError::Disconnected {
                peer: self.peer.clone(),
                retry_in_ms: self.next_attempt.saturating_duration_since(Instant::now()).as_millis()
                    as u64,
                reason: reason.clone(),
            }),
            SlotState::Ready(..) => Ok(()),
            SlotState::Free => unreachable!("checked above"),
        };
        let state = std::mem::replace(&mut s.state, SlotState::Free);
        self.free.push(slot as u32);
        self.in_flight -= 1;
        result?;
        let SlotState::Ready(buf, boot) = state else { unreachable!("ready") };
        Ok(Some((buf, boot)))
    }

    /// Gives back a buffer [`poll_raw`](Self::poll_raw) handed out.
    pub fn give_back(&mut self, buf: Vec<u8>) {
        self.recycle(buf);
    }

    /// Sends `frame` and waits (parking, not spinning) for its reply, reconnecting
    /// within `timeout` if needed.
    pub fn call(&mut self, frame: &Frame, timeout: Duration) -> Result<Frame, NetError> {
        self.call_to(frame, 0, timeout)
    }

    /// [`call`](Self::call) for processing worker `worker` of the server.
    pub fn call_to(
        &mut self,
        frame: &Frame,
        worker: u16,
        timeout: Duration,
    ) -> Result<Frame, NetError> {
        let deadline = Instant::now() + timeout;
        let id = loop {
            match self.send_to(frame, worker, deadline) {
                Ok(id) => break id,
                Err(NetError::Disconnected { .. } | NetError::NoCredit { .. })
                    if Instant::now() < deadline =>
                {
                    self.wait_until(deadline)
                }
                Err(e) => return Err(e),
            }
        };
        loop {
            match self.poll(id) {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => self.wait_until(deadline),
                Err(NetError::TimedOut { request_id, peer, .. }) => {
                    return Err(NetError::TimedOut {
                        request_id,
                        peer,
                        timeout_ms: timeout.as_millis() as u64,
                    })
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// An unsolicited frame from the server (a token invalidation), if one came.
    pub fn next_notification(&mut self) -> Option<Result<Frame, NetError>> {
        self.progress();
        let buf = self.notifications.pop_front()?;
        let r = Frame::decode(&buf)
            .map_err(|source| NetError::Wire { peer: self.peer.clone(), source });
        self.recycle(buf);
        Some(r)
    }

    /// Arms the connection's wake-up for a caller that parks on the returned
    /// descriptor itself (after releasing whatever lock guards this client):
    /// `None` when something already arrived (poll again) or there is no
    /// connection.
    pub fn arm_wait(&mut self) -> Option<std::os::fd::RawFd> {
        let qp = self.qp.as_mut()?;
        qp.prepare_wait().then(|| qp.wait_fd())
    }

    /// Parks until the connection has work, the deadline, or the next reconnect.
    fn wait_until(&mut self, deadline: Instant) {
        let now = Instant::now();
        let mut until = deadline;
        match self.qp.as_mut() {
            Some(qp) => {
                if !qp.prepare_wait() {
                    return;
                }
                let fd = qp.wait_fd();
                let _ = wait_readable(fd, Some(until.saturating_duration_since(now)));
            }
            None => {
                until = until.min(self.next_attempt);
                std::thread::sleep(until.saturating_duration_since(now));
            }
        }
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        match self.qp.as_mut() {
            Some(qp) if qp.is_up() => {
                if let Err(r) = qp.post_recv(buf) {
                    self.bufs.push(r.buf);
                }
            }
            _ => self.bufs.push(buf),
        }
    }

    /// Polls the queue pair and files what finished.
    fn progress(&mut self) {
        let Some(qp) = self.qp.as_mut() else { return };
        let mut done = std::mem::take(&mut self.completions);
        let result = qp.poll_cq(&mut done);
        for c in done.drain(..) {
            match c {
                Completion::Send { buf, .. } => self.bufs.push(buf),
                Completion::Recv { buf } => self.file_reply(buf),
                Completion::Write { .. } | Completion::Read { .. } | Completion::Imm { .. } => {}
            }
        }
        self.completions = done;
        if let Err(e) = result {
            self.lost(e);
        }
    }

    fn file_reply(&mut self, buf: Vec<u8>) {
        let h = FrameHeader::decode(&buf).expect("the transport checked the header");
        if h.flags & FLAG_REPLY == 0 {
            self.notifications.push_back(buf);
            return;
        }
        let slot = (h.request_id.0 & ((1 << SLOT_BITS) - 1)) as usize;
        let boot = self.server_boot().unwrap_or(0);
        match self.slots.get_mut(slot) {
            Some(s) if s.id == h.request_id.0 && matches!(s.state, SlotState::Waiting { .. }) => {
                s.state = SlotState::Ready(buf, boot);
            }
            _ => {
                log::debug!(
                    "dropping reply to request {} from {}: no longer awaited",
                    h.request_id.0,
                    self.peer
                );
                self.recycle(buf);
            }
        }
    }

    fn lost(&mut self, e: NetError) {
        let reason = e.to_string();
        log::warn!("lost connection to {}: {reason}", self.peer);
        for s in &mut self.slots {
            if matches!(s.state, SlotState::Waiting { .. }) {
                s.state = SlotState::Failed(reason.clone());
            }
        }
        self.qp = None;
        self.last_error = reason;
        self.next_attempt = Instant::now();
    }
}

/// What the checksum of a frame sent over a link of `backend` covers: the
/// header only through shared memory (the bytes never leave this host's
/// memory), header and payload over a network.
pub fn link_sum(backend: crate::Backend) -> Sum {
    match backend {
        crate::Backend::Shm => Sum::Header,
        crate::Backend::Tcp | crate::Backend::Rdma => Sum::Full,
    }
}
