//! [`Link`]: one connection whatever carries it (a tcp or shm [`Qp`], or an RDMA
//! queue pair), and the slot RPC that runs over it when asked for.
//!
//! Slot RPC is the self-identified RPC of Octopus+ (section 3.3.1) in the form
//! PeakFS uses for reads (section III-D): each side registers an *inbox* of `slots`
//! slots of [`SLOT_BYTES`] (its first region, announced to the peer) and an
//! *outbox* of the same size to stage from. Request slot `s` is the low 16 bits of
//! the request id, which the client keeps below its credits.
//!
//! - A reply is written one-sided (RDMA WRITE_WITH_IMM) straight into slot `s` of
//!   the client's inbox; the immediate carries (client id, `s`), so the client
//!   finds the request without a search and no receive buffer is consumed.
//! - A request goes by SEND when it fits the peer's message buffers
//!   ([`SlotRpc::inline_bytes`]), and one-sided into slot `s` of the server's inbox
//!   otherwise (a large write over RDMA).
//! - Notifications (frames that answer no request) always go by SEND.
//!
//! Slot `s` is reused only after the reply to its last request arrived, and that
//! reply proves the request was taken out of the inbox, so a slot is never
//! overwritten while it is read. A frame found in a slot is checked like any
//! received frame (header, length, checksum) and must be a reply (on the client) or
//! a request (on the server) for that same slot; anything else closes the link
//! with the reason.
//!
//! The client asks for slot RPC in its Hello (`WANT_SLOTS`); the server sizes its
//! inbox like the client's once the client's announcement arrives, and the client
//! waits for the server's announcement before it sends anything. RDMA links always
//! use slot RPC (their message buffers are small); tcp and shm links may, which is
//! how the protocol is tested on machines without an RDMA NIC. Layout:
//! `docs/format.md`, "Slot RPC".

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use pfs_core::wire::{FrameHeader, FLAG_REPLY, HEADER_LEN};

use crate::msg::{check_datagram, Datagram, MAX_MSG_BYTES};
use crate::poller::wait_readable;
use crate::qp::{Qp, QpLimits, POLL_BATCH};
#[cfg(feature = "rdma")]
use crate::rdma::RdmaQp;
use crate::rdma::ReplyImm;
use crate::transport::{Backend, Completion, QueuePair, RegionId, RegionRange, Rejected, WorkId};
use crate::NetError;

/// Bytes of one slot: the largest frame, rounded up to 4 KiB.
pub const SLOT_BYTES: usize = MAX_MSG_BYTES.div_ceil(4096) * 4096;
/// A side's inbox is its first region.
const INBOX: RegionId = RegionId(0);
/// Work ids of the link's own one-sided writes (callers' ids stay below).
const LINK_WR: u64 = 1 << 63;
/// Bits of a request id that name its slot (as in the RPC client).
const SLOT_MASK: u64 = 0xffff;

/// How a client asks for slot RPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRpc {
    /// Slots in each inbox; the link uses the smallest of this, the server's
    /// credits and half the queue pair's one-sided table, and so limits the
    /// requests in flight. Each side pins `2 * slots * SLOT_BYTES` bytes.
    pub slots: u32,
    /// Requests up to this many bytes go by SEND, larger ones one-sided.
    pub inline_bytes: usize,
}

impl Default for SlotRpc {
    fn default() -> Self {
        SlotRpc {
            slots: crate::rdma::DEFAULT_SLOTS,
            inline_bytes: crate::rdma::DEFAULT_MSG_BYTES as usize,
        }
    }
}

/// The queue pair under a link. The common tcp and shm case stays inline; only
/// the RDMA one is boxed.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Inner {
    /// tcp or shm.
    Qp(Qp),
    /// RDMA.
    #[cfg(feature = "rdma")]
    Rdma(Box<RdmaQp>),
}

/// Runs `$e` with `$q` bound to the queue pair, whatever its kind.
macro_rules! on_inner {
    ($inner:expr, $q:ident => $e:expr) => {
        match $inner {
            Inner::Qp($q) => $e,
            #[cfg(feature = "rdma")]
            Inner::Rdma($q) => $e,
        }
    };
}

impl Inner {
    fn credits(&self) -> u32 {
        on_inner!(self, q => q.credits())
    }
    fn limits(&self) -> QpLimits {
        on_inner!(self, q => q.limits())
    }
    fn imm_client(&self) -> u16 {
        match self {
            Inner::Qp(_) => 0,
            #[cfg(feature = "rdma")]
            Inner::Rdma(q) => q.imm_client(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Client,
    Server,
}

#[derive(Debug)]
struct Slots {
    inbox: RegionId,
    outbox: RegionId,
    count: u32,
    /// The peer's inbox is announced: frames may go one-sided.
    peer_ready: bool,
    inline_bytes: usize,
}

/// A connection: a queue pair of any backend, with slot RPC when both sides asked.
#[derive(Debug)]
pub struct Link {
    inner: Inner,
    role: Role,
    /// The client asked for slot RPC (server side: set up once its inbox is known).
    wants_slots: bool,
    slots: Option<Slots>,
    /// Send completions of frames that went one-sided (their bytes are staged).
    done: VecDeque<Completion>,
    /// Buffers for frames taken out of the inbox, at most one per slot.
    spare: Vec<Vec<u8>>,
    scratch: Vec<Completion>,
    /// Frames written one-sided into the peer's inbox, and taken out of ours.
    one_sided: (u64, u64),
    /// Server side: the peer proved the server role ([`crate::auth::PEER_IS_SERVER`]).
    peer_is_server: bool,
    /// Client side: the boot id the server's Accept carried.
    server_boot: u64,
}

impl From<Qp> for Inner {
    fn from(q: Qp) -> Inner {
        Inner::Qp(q)
    }
}

#[cfg(feature = "rdma")]
impl From<RdmaQp> for Inner {
    fn from(q: RdmaQp) -> Inner {
        Inner::Rdma(Box::new(q))
    }
}

fn slot_of(request_id: u64) -> u32 {
    (request_id & SLOT_MASK) as u32
}

impl Link {
    /// Looks whether the peer died, for a link that may sit idle (a client's
    /// connection to a server it has not asked anything for a while): the
    /// next poll then reports the link closed.
    pub fn check_peer(&mut self) {
        match &mut self.inner {
            Inner::Qp(q) => q.check_peer(),
            #[cfg(feature = "rdma")]
            Inner::Rdma(_) => {}
        }
    }

    fn new(inner: Inner, role: Role, wants_slots: bool) -> Link {
        Link {
            inner,
            role,
            wants_slots,
            slots: None,
            done: VecDeque::new(),
            spare: Vec::new(),
            scratch: Vec::with_capacity(POLL_BATCH),
            one_sided: (0, 0),
            peer_is_server: false,
            server_boot: 0,
        }
    }

    /// Server side: whether the peer proved it is a server (a peer in a
    /// cross-shard transaction) rather than a client.
    pub fn peer_is_server(&self) -> bool {
        self.peer_is_server
    }

    pub(crate) fn set_peer_is_server(&mut self, yes: bool) {
        self.peer_is_server = yes;
    }

    /// Client side: the boot id of the server process this link reaches; it
    /// changes when the server restarts.
    pub fn server_boot(&self) -> u64 {
        self.server_boot
    }

    pub(crate) fn set_server_boot(&mut self, boot: u64) {
        self.server_boot = boot;
    }

    /// The server's side of an accepted connection; `wants_slots` from the Hello.
    pub(crate) fn server(inner: impl Into<Inner>, wants_slots: bool) -> Link {
        Link::new(inner.into(), Role::Server, wants_slots)
    }

    /// The client's side: with `slots`, registers the inbox and outbox and waits
    /// (up to `timeout`) for the server's.
    pub(crate) fn client(
        inner: impl Into<Inner>,
        slots: Option<SlotRpc>,
        timeout: Duration,
    ) -> Result<Link, NetError> {
        let mut link = Link::new(inner.into(), Role::Client, slots.is_some());
        let Some(cfg) = slots else { return Ok(link) };
        let count = cfg
            .slots
            .min(link.inner.credits())
            .min((link.inner.limits().op_depth / 2) as u32)
            .max(1);
        link.set_up_slots(count, cfg.inline_bytes)?;
        let deadline = Instant::now() + timeout;
        loop {
            let mut found = std::mem::take(&mut link.scratch);
            let r = link.poll_cq(&mut found);
            link.done.extend(found.drain(..));
            link.scratch = found;
            r?;
            if link.slots.as_ref().is_some_and(|s| s.peer_ready) {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(NetError::Unavailable {
                    transport: "slot rpc",
                    reason: format!(
                        "{} did not announce its inbox within {} ms",
                        link.peer(),
                        timeout.as_millis()
                    ),
                });
            }
            if link.inner_prepare_wait() {
                let _ = wait_readable(link.wait_fd(), Some(deadline - now));
            }
        }
        Ok(link)
    }

    fn set_up_slots(&mut self, count: u32, inline_bytes: usize) -> Result<(), NetError> {
        let bytes = count as usize * SLOT_BYTES;
        let inbox = on_inner!(&mut self.inner, q => q.register_region(bytes))?;
        if inbox != INBOX {
            return Err(NetError::Invalid(format!(
                "slot rpc needs the inbox to be the first region, it is region {}",
                inbox.0
            )));
        }
        let outbox = on_inner!(&mut self.inner, q => q.register_region(bytes))?;
        self.slots = Some(Slots {
            inbox,
            outbox,
            count,
            peer_ready: self.role == Role::Server,
            inline_bytes,
        });
        log::debug!("slot rpc with {}: {count} slots of {SLOT_BYTES} bytes", self.peer());
        Ok(())
    }

    /// Requests the client may have in flight: the server's credits, and on a
    /// client with slot RPC at most its slots.
    pub fn credits(&self) -> u32 {
        match (&self.slots, self.role) {
            (Some(s), Role::Client) => self.inner.credits().min(s.count),
            _ => self.inner.credits(),
        }
    }

    /// Slots in use, once slot RPC is set up on both sides.
    pub fn slots(&self) -> Option<u32> {
        self.slots.as_ref().filter(|s| s.peer_ready).map(|s| s.count)
    }

    /// Frames this side wrote one-sided into the peer's inbox, and frames it took
    /// out of its own: how much of the traffic slot RPC carried.
    pub fn one_sided_frames(&self) -> (u64, u64) {
        self.one_sided
    }

    /// Bytes a frame sent by [`send_gathered`](Self::send_gathered) may have
    /// now: [`Qp::gather_room`] of a plain queue pair; 0 with slot RPC or over
    /// RDMA.
    pub fn gather_room(&self) -> usize {
        match (&self.inner, &self.slots) {
            (Inner::Qp(q), None) => q.gather_room(),
            _ => 0,
        }
    }

    /// Sends one encoded frame given in pieces, the header first, copied
    /// straight into the shared-memory ring ([`Qp::send_gathered`]); it must fit
    /// [`gather_room`](Self::gather_room).
    pub fn send_gathered(&mut self, parts: &[&[u8]]) -> Result<(), NetError> {
        match (&mut self.inner, &self.slots) {
            (Inner::Qp(q), None) => q.send_gathered(parts),
            _ => Err(NetError::Invalid("send_gathered needs a plain queue pair".into())),
        }
    }

    /// Stops a shared-memory peer from ringing this side for what it sends,
    /// until the next `prepare_wait`: the caller polls the link itself
    /// meanwhile ([`crate::inline`]). Other links: nothing to do.
    pub fn cancel_wait(&mut self) {
        match &mut self.inner {
            Inner::Qp(q) => q.cancel_wait(),
            #[cfg(feature = "rdma")]
            Inner::Rdma(_) => {}
        }
    }

    /// On a server's shared-memory link: lets a client in this process run
    /// the serving worker's rounds, registered under `key` ([`crate::inline`]).
    pub fn set_inline_key(&self, key: u64) {
        match &self.inner {
            Inner::Qp(q) => q.set_inline_key(key),
            #[cfg(feature = "rdma")]
            Inner::Rdma(_) => {}
        }
    }

    /// On a client's link: the key of the worker serving it inline, when the
    /// server runs in this process and offered one.
    pub fn inline_key(&self) -> Option<u64> {
        match &self.inner {
            Inner::Qp(q) => q.inline_key(),
            #[cfg(feature = "rdma")]
            Inner::Rdma(_) => None,
        }
    }

    /// Whether the connection is still up.
    pub fn is_up(&self) -> bool {
        on_inner!(&self.inner, q => q.is_up())
    }

    /// Closes the connection because of what the caller found wrong; logs `reason`.
    pub fn close(&mut self, reason: &str) {
        on_inner!(&mut self.inner, q => q.close(reason))
    }

    /// The limits of the queue pair.
    pub fn limits(&self) -> QpLimits {
        self.inner.limits()
    }

    fn fail(&mut self, reason: String) -> NetError {
        let e = NetError::protocol(self.peer(), reason);
        self.close(&e.to_string());
        e
    }

    fn inner_prepare_wait(&mut self) -> bool {
        on_inner!(&mut self.inner, q => q.prepare_wait())
    }

    /// On the server: the client's inbox was announced and ours is not made yet.
    fn setup_due(&self) -> bool {
        self.role == Role::Server
            && self.wants_slots
            && self.slots.is_none()
            && on_inner!(&self.inner, q => q.peer_region_len(INBOX)).is_some()
    }

    /// Sets up or completes slot RPC once the peer's inbox is announced.
    fn check_peer_inbox(&mut self) -> Result<(), NetError> {
        if self.setup_due() {
            let len = on_inner!(&self.inner, q => q.peer_region_len(INBOX)).expect("due");
            let count = len / SLOT_BYTES as u64;
            let most = u64::from(self.inner.credits()).min(self.inner.limits().op_depth as u64 / 2);
            if len % SLOT_BYTES as u64 != 0 || count == 0 || count > most {
                return Err(self.fail(format!(
                    "slot inbox of {len} bytes, expected 1..={most} slots of {SLOT_BYTES} bytes"
                )));
            }
            self.set_up_slots(count as u32, 0)?;
        }
        if self.role == Role::Client {
            if let Some(s) = self.slots.as_ref().filter(|s| !s.peer_ready) {
                let want = u64::from(s.count) * SLOT_BYTES as u64;
                match on_inner!(&self.inner, q => q.peer_region_len(INBOX)) {
                    None => {}
                    Some(len) if len == want => {
                        self.slots.as_mut().expect("set").peer_ready = true;
                    }
                    Some(len) => {
                        return Err(self
                            .fail(format!("slot inbox of {len} bytes, this client's is {want}")))
                    }
                }
            }
        }
        Ok(())
    }

    /// Stages `frame` in its outbox slot and writes it into the peer's inbox.
    fn send_one_sided(&mut self, wr: WorkId, frame: Vec<u8>, slot: u32) -> Result<(), Rejected> {
        let s = self.slots.as_ref().expect("checked by the caller");
        let (outbox, count) = (s.outbox, s.count);
        let reject = |buf, error| Err(Rejected { buf, error });
        if slot >= count {
            let e = NetError::Invalid(format!(
                "frame for slot {slot}, past the {count} slots of this link"
            ));
            return reject(frame, e);
        }
        if frame.len() > SLOT_BYTES {
            let e = NetError::Invalid(format!(
                "frame of {} bytes is over the slot size {SLOT_BYTES}",
                frame.len()
            ));
            return reject(frame, e);
        }
        let imm = match ReplyImm::new(u32::from(self.inner.imm_client()), slot) {
            Ok(imm) => imm,
            Err(e) => return reject(frame, e),
        };
        let off = slot as usize * SLOT_BYTES;
        on_inner!(&mut self.inner, q => q.region_mut(outbox)[off..off + frame.len()]
            .copy_from_slice(&frame));
        let local = RegionRange { region: outbox, offset: off as u64, len: frame.len() as u32 };
        let wid = WorkId(LINK_WR | u64::from(slot));
        match on_inner!(&mut self.inner, q => q.post_write_imm(wid, local, INBOX, off as u64, imm))
        {
            Ok(()) => {
                self.one_sided.0 += 1;
                self.done.push_back(Completion::Send { wr, buf: frame });
                Ok(())
            }
            Err(e) => reject(frame, e),
        }
    }

    /// The frame a write with immediate put in our inbox, checked and copied out.
    fn take_from_inbox(&mut self, imm: ReplyImm) -> Result<Completion, NetError> {
        let Some(s) = self.slots.as_ref() else {
            return Err(self.fail(format!(
                "write with immediate (slot {}) on a link without slot rpc",
                imm.slot()
            )));
        };
        let (inbox, count, slot) = (s.inbox, s.count, imm.slot());
        if imm.client() != u32::from(self.inner.imm_client()) || slot >= count {
            return Err(self.fail(format!(
                "immediate names client {} slot {}; this link is client {} with {count} slots",
                imm.client(),
                slot,
                self.inner.imm_client()
            )));
        }
        let off = slot as usize * SLOT_BYTES;
        // Through shared memory a frame may be summed over its header only.
        let shm = self.backend() == Backend::Shm;
        let checked = {
            let region = on_inner!(&self.inner, q => q.region(inbox));
            let head = &region[off..off + HEADER_LEN];
            FrameHeader::decode(head).map_err(|e| e.to_string()).and_then(|h| {
                let len = h.frame_len();
                if len > SLOT_BYTES {
                    return Err(format!("frame of {len} bytes is over the slot size"));
                }
                match check_datagram(&region[off..off + len], shm) {
                    Ok(Datagram::Frame) => Ok((h, len)),
                    Ok(Datagram::Net(_)) => unreachable!("the magic said frame"),
                    Err(r) => Err(r),
                }
            })
        };
        let (h, len) = checked.map_err(|r| self.fail(format!("inbox slot {slot}: {r}")))?;
        let is_reply = h.flags & FLAG_REPLY != 0;
        if is_reply != (self.role == Role::Client) || slot_of(h.request_id.0) != slot {
            return Err(self.fail(format!(
                "inbox slot {slot} holds {} {} (slot {})",
                if is_reply { "a reply to" } else { "request" },
                h.request_id.0,
                slot_of(h.request_id.0)
            )));
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        on_inner!(&self.inner, q => buf.extend_from_slice(&q.region(inbox)[off..off + len]));
        self.one_sided.1 += 1;
        Ok(Completion::Recv { buf })
    }
}

impl QueuePair for Link {
    fn post_send(&mut self, wr: WorkId, frame: Vec<u8>) -> Result<(), Rejected> {
        if let Some(s) = self.slots.as_ref().filter(|s| s.peer_ready) {
            if let Ok(h) = FrameHeader::decode(&frame) {
                let reply = h.flags & FLAG_REPLY != 0;
                let one_sided = match self.role {
                    Role::Server => reply,
                    Role::Client => !reply && frame.len() > s.inline_bytes,
                };
                if one_sided {
                    return self.send_one_sided(wr, frame, slot_of(h.request_id.0));
                }
            }
        }
        on_inner!(&mut self.inner, q => q.post_send(wr, frame))
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<(), Rejected> {
        match on_inner!(&mut self.inner, q => q.post_recv(buf)) {
            Err(r) if matches!(r.error, NetError::Full { .. }) => match &self.slots {
                Some(s) if self.spare.len() < s.count as usize => {
                    self.spare.push(r.buf);
                    Ok(())
                }
                _ => Err(r),
            },
            other => other,
        }
    }

    fn register_region(&mut self, len: usize) -> Result<RegionId, NetError> {
        on_inner!(&mut self.inner, q => q.register_region(len))
    }

    fn region(&self, id: RegionId) -> &[u8] {
        on_inner!(&self.inner, q => q.region(id))
    }

    fn region_mut(&mut self, id: RegionId) -> &mut [u8] {
        on_inner!(&mut self.inner, q => q.region_mut(id))
    }

    fn post_write(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        on_inner!(&mut self.inner, q => q.post_write(wr, local, remote, remote_offset))
    }

    fn post_read(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        on_inner!(&mut self.inner, q => q.post_read(wr, local, remote, remote_offset))
    }

    fn post_write_imm(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
        imm: ReplyImm,
    ) -> Result<(), NetError> {
        on_inner!(&mut self.inner, q => q.post_write_imm(wr, local, remote, remote_offset, imm))
    }

    fn peer_region_len(&self, id: RegionId) -> Option<u64> {
        on_inner!(&self.inner, q => q.peer_region_len(id))
    }

    fn poll_cq(&mut self, out: &mut Vec<Completion>) -> Result<usize, NetError> {
        let mut n = 0;
        while n < POLL_BATCH {
            let Some(c) = self.done.pop_front() else { break };
            out.push(c);
            n += 1;
        }
        if n == POLL_BATCH {
            return Ok(n);
        }
        let mut got = std::mem::take(&mut self.scratch);
        let r = on_inner!(&mut self.inner, q => q.poll_cq(&mut got));
        let mut result = Ok(());
        for c in got.drain(..) {
            match c {
                Completion::Write { wr } if wr.0 & LINK_WR != 0 => {}
                Completion::Imm { imm } if result.is_ok() => match self.take_from_inbox(imm) {
                    Ok(c) => {
                        out.push(c);
                        n += 1;
                    }
                    Err(e) => result = Err(e),
                },
                Completion::Imm { .. } => {}
                c => {
                    out.push(c);
                    n += 1;
                }
            }
        }
        self.scratch = got;
        r?;
        result?;
        self.check_peer_inbox()?;
        Ok(n)
    }

    fn prepare_wait(&mut self) -> bool {
        if !self.done.is_empty() || self.setup_due() {
            return false;
        }
        // The inner queue pair may take in an announcement while it arms.
        self.inner_prepare_wait() && !self.setup_due()
    }

    fn wait_fd(&self) -> RawFd {
        on_inner!(&self.inner, q => q.wait_fd())
    }

    fn peer(&self) -> &str {
        on_inner!(&self.inner, q => q.peer())
    }

    fn backend(&self) -> Backend {
        on_inner!(&self.inner, q => q.backend())
    }
}
