//! [`RdmaQp`]: the [`QueuePair`] over a verbs reliable-connected queue pair.
//!
//! Frames go by SEND into the peer's posted receive buffers; one-sided writes and
//! reads are RDMA WRITE and READ straight between registered regions; a reply can
//! be written with WRITE_WITH_IMM, whose immediate ([`ReplyImm`]) tells the
//! receiver which client and request slot the bytes answer. A region is announced
//! to the peer with an in-band `RdmaRegion` SEND (address, length, rkey), so it
//! reaches the peer before any later message that names it (RC keeps order).
//!
//! Everything is sized at creation from [`QpLimits`] and the message size: send
//! slots (`send_depth`), receive buffers (`recv_depth`), the one-sided table
//! (`op_depth`) and the regions (`max_regions`, each announced once from its own
//! slot). The send queue holds `send_depth + op_depth + max_regions` work requests,
//! so a post never finds it full; the completion queue holds that plus
//! `recv_depth`, so it never overflows.
//!
//! The NIC writes into regions and receive buffers while Rust code may hold
//! references to other parts of them; that is sound as long as the peer writes only
//! where the protocol tells it to and the owner reads a range only after the
//! completion that says it was written.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use pfs_core::wire::FrameHeader;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{
    CompletionChannel, ExtendedCompletionQueue, GenericCompletionQueue, WorkCompletionStatus,
};
use sideway::ibverbs::device_context::Mtu;
use sideway::ibverbs::memory_region::MemoryRegion;
use sideway::ibverbs::queue_pair::{
    ExtendedQueuePair, QueuePair as _, QueuePairAttribute, QueuePairState, SendOperationFlags,
};
use sideway::ibverbs::AccessFlags;

mod completions;
mod work;

use super::device::{chain, RdmaDevice};
use super::dma::DmaBuf;
use super::imm::ReplyImm;
use super::info::{ConnInfo, RegionAd, MAX_ANNOUNCED, MIN_MSG_BYTES, REGION_AD_BYTES};
use crate::msg::{Kind, NetHeader, MAX_MSG_BYTES, MSG_HEADER_LEN};
use crate::poller::{random_bytes, Epoll, READ};
use crate::qp::{ConnGuard, QpLimits, POLL_BATCH};
use crate::transport::{Backend, Completion, QueuePair, RegionId, RegionRange, Rejected, WorkId};
use crate::NetError;

/// Bytes of one region-announcement slot in send memory (header and payload fit).
const AD_SLOT_BYTES: usize = 64;
const _: () = assert!(MSG_HEADER_LEN + REGION_AD_BYTES <= AD_SLOT_BYTES);
const _: () = assert!(AD_SLOT_BYTES <= MIN_MSG_BYTES as usize);

/// Work request ids: a tag in the high half, a slot index in the low half.
const TAG_SEND: u64 = 1;
const TAG_OP: u64 = 2;
const TAG_AD: u64 = 3;
const TAG_RECV: u64 = 4;

fn wr_id(tag: u64, index: u32) -> u64 {
    (tag << 32) | u64::from(index)
}

/// RC retransmission: timeout 4.096 us * 2^14 (about 67 ms), 7 retries; an
/// unready receiver (no posted buffer) is retried without limit (7 means infinite),
/// which is the back-pressure the trait promises.
const ACK_TIMEOUT: u8 = 14;
const RETRY_COUNT: u8 = 7;
const RNR_RETRY_INFINITE: u8 = 7;
/// Wait before an RNR retry: code 12 is 0.64 ms.
const MIN_RNR_TIMER: u8 = 12;
/// Routers a RoCE v2 packet may cross.
const HOP_LIMIT: u8 = 64;
/// Completion-channel events consumed per `prepare_wait`.
const EVENTS_PER_WAIT: u32 = 64;

/// A one-sided operation in flight.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write(WorkId),
    Read(WorkId),
}

/// What a work request does.
#[derive(Clone, Copy, Debug)]
enum Verb {
    Send,
    Write { rkey: u32, addr: u64 },
    WriteImm { rkey: u32, addr: u64, imm: ReplyImm },
    Read { rkey: u32, addr: u64 },
}

/// The fields of a work completion this queue pair uses, copied out of the poller.
#[derive(Clone, Copy, Debug)]
struct Wc {
    wr_id: u64,
    status: u32,
    opcode: u32,
    byte_len: u32,
    imm: u32,
}

/// A connected RDMA queue pair. Made by [`connect`](super::connect) on the client and
/// by the [`Listener`](crate::Listener) on the server; both wrap it in a [`Link`](crate::Link).
pub struct RdmaQp {
    // Dropped in this order: the queue pair, then the registrations, then the memory
    // they map, then the completion queue and its channel.
    qp: ExtendedQueuePair,
    send_mr: Arc<MemoryRegion>,
    recv_mr: Arc<MemoryRegion>,
    region_mrs: Vec<Arc<MemoryRegion>>,
    send_mem: DmaBuf,
    recv_mem: DmaBuf,
    regions: Vec<DmaBuf>,
    cq: Arc<ExtendedCompletionQueue>,
    channel: Arc<CompletionChannel>,
    device: Arc<RdmaDevice>,
    epoll: Epoll,
    control: Option<TcpStream>,
    peer: String,
    limits: QpLimits,
    msg_bytes: usize,
    /// Largest frame `post_send` takes: the smaller of both sides' buffers.
    max_send_bytes: usize,
    peer_max_regions: usize,
    psn: u32,
    imm_client: u16,
    credits: u32,
    connected: bool,
    sends: Vec<Option<(WorkId, Vec<u8>)>>,
    free_sends: Vec<u32>,
    ops: Vec<Option<Op>>,
    free_ops: Vec<u32>,
    ads_in_flight: usize,
    remote: Vec<Option<RegionAd>>,
    app_recv: VecDeque<Vec<u8>>,
    /// Frames received, waiting for a posted buffer: (receive slot, bytes).
    held: VecDeque<(u32, u32)>,
    repost: Vec<u32>,
    done: VecDeque<Completion>,
    scratch: Vec<Completion>,
    wcs: Vec<Wc>,
    dead: Option<String>,
    _guard: Option<ConnGuard>,
}

impl fmt::Debug for RdmaQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaQp")
            .field("peer", &self.peer)
            .field("device", &self.device)
            .field("qp_num", &self.qp.qp_number())
            .field("limits", &self.limits)
            .field("msg_bytes", &self.msg_bytes)
            .field("dead", &self.dead)
            .finish_non_exhaustive()
    }
}

/// Registers the whole of `mem` with the device's protection domain.
///
/// # Safety
/// `mem` must stay allocated until the returned registration is dropped.
unsafe fn register(
    device: &RdmaDevice,
    mem: &DmaBuf,
    access: AccessFlags,
) -> Result<Arc<MemoryRegion>, impl std::error::Error> {
    // SAFETY: the caller keeps `mem` alive for the registration's lifetime.
    unsafe { device.pd.reg_mr(mem.addr(0) as usize, mem.alloc_len(), access) }
}

fn unavailable(peer: &str, what: &str, e: &dyn std::error::Error) -> NetError {
    NetError::Unavailable { transport: "rdma", reason: format!("{what} for {peer}: {}", chain(e)) }
}

fn status_name(status: u32) -> String {
    // sideway's conversion panics on a value it does not know; these it knows.
    if status <= WorkCompletionStatus::TagMatchingRendezvousIncomplete as u32 {
        format!("{:?}", WorkCompletionStatus::from(status))
    } else {
        format!("status {status}")
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
    )
}

impl RdmaQp {
    /// A queue pair in the INIT state with every receive buffer posted; it must be
    /// connected with [`connect_to`](Self::connect_to) before use.
    pub(crate) fn create(
        device: Arc<RdmaDevice>,
        peer: String,
        limits: QpLimits,
        msg_bytes: u32,
        credits: u32,
    ) -> Result<RdmaQp, NetError> {
        assert!(limits.send_depth > 0 && limits.recv_depth > 0 && limits.op_depth > 0);
        if !(MIN_MSG_BYTES..=MAX_MSG_BYTES as u32).contains(&msg_bytes) {
            return Err(NetError::Invalid(format!(
                "rdma message buffers of {msg_bytes} bytes, expected {MIN_MSG_BYTES}..={MAX_MSG_BYTES}"
            )));
        }
        let announced = MAX_ANNOUNCED as usize;
        if limits.recv_depth > announced || limits.max_regions > announced {
            return Err(NetError::Invalid(format!(
                "rdma queue pairs take at most {announced} receive buffers and regions"
            )));
        }
        let send_wrs = limits.send_depth + limits.op_depth + limits.max_regions;
        let recv_wrs = limits.recv_depth;
        let max_wr = device.max_qp_wr as usize;
        if send_wrs > max_wr || recv_wrs > max_wr {
            return Err(NetError::Unavailable {
                transport: "rdma",
                reason: format!(
                    "{send_wrs} send and {recv_wrs} receive work requests per queue pair are over \
                     the limit {max_wr} of RDMA device {}",
                    device.name
                ),
            });
        }
        let msg = msg_bytes as usize;
        let channel = device
            .context
            .create_comp_channel()
            .map_err(|e| unavailable(&peer, "create a completion channel", &e))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| NetError::io("configure the completion channel for", &peer, e))?;
        let cq = device
            .context
            .create_cq_builder()
            .setup_cqe((send_wrs + recv_wrs) as u32)
            .setup_comp_channel(&channel, 0)
            .build_ex()
            .map_err(|e| unavailable(&peer, "create a completion queue", &e))?;
        let qp = device
            .pd
            .create_qp_builder()
            .setup_send_cq(GenericCompletionQueue::from(Arc::clone(&cq)))
            .setup_recv_cq(GenericCompletionQueue::from(Arc::clone(&cq)))
            .setup_max_send_wr(send_wrs as u32)
            .setup_max_recv_wr(recv_wrs as u32)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_send_ops_flags(
                SendOperationFlags::Send
                    | SendOperationFlags::Write
                    | SendOperationFlags::WriteWithImmediate
                    | SendOperationFlags::Read,
            )
            .build_ex()
            .map_err(|e| unavailable(&peer, "create a queue pair", &e))?;
        let send_mem = DmaBuf::new(limits.send_depth * msg + limits.max_regions * AD_SLOT_BYTES);
        let recv_mem = DmaBuf::new(limits.recv_depth * msg);
        // SAFETY: both buffers live in the RdmaQp, which drops the registrations first.
        let send_mr = unsafe { register(&device, &send_mem, AccessFlags::LocalWrite) }
            .map_err(|e| unavailable(&peer, "register send buffers", &e))?;
        // SAFETY: as above.
        let recv_mr = unsafe { register(&device, &recv_mem, AccessFlags::LocalWrite) }
            .map_err(|e| unavailable(&peer, "register receive buffers", &e))?;
        let epoll = Epoll::new().map_err(|e| NetError::io("create epoll for", &peer, e))?;
        epoll
            .add(channel.as_raw_fd(), READ, 0)
            .map_err(|e| NetError::io("watch the completion channel for", &peer, e))?;
        let mut psn = [0u8; 4];
        random_bytes(&mut psn).map_err(|e| NetError::io("get randomness for", &peer, e))?;
        let mut me = RdmaQp {
            qp,
            send_mr,
            recv_mr,
            region_mrs: Vec::with_capacity(limits.max_regions),
            send_mem,
            recv_mem,
            regions: Vec::with_capacity(limits.max_regions),
            cq,
            channel,
            device,
            epoll,
            control: None,
            peer,
            limits,
            msg_bytes: msg,
            max_send_bytes: 0,
            peer_max_regions: 0,
            psn: u32::from_le_bytes(psn) & 0x00ff_ffff,
            imm_client: 0,
            credits,
            connected: false,
            sends: vec![None; limits.send_depth],
            free_sends: (0..limits.send_depth as u32).rev().collect(),
            ops: vec![None; limits.op_depth],
            free_ops: (0..limits.op_depth as u32).rev().collect(),
            ads_in_flight: 0,
            remote: vec![None; limits.max_regions],
            app_recv: VecDeque::with_capacity(limits.recv_depth),
            held: VecDeque::with_capacity(limits.recv_depth),
            repost: (0..limits.recv_depth as u32).collect(),
            done: VecDeque::with_capacity(POLL_BATCH),
            scratch: Vec::with_capacity(POLL_BATCH),
            wcs: Vec::with_capacity(POLL_BATCH),
            dead: None,
            _guard: None,
        };
        let mut attr = QueuePairAttribute::new();
        attr.setup_state(QueuePairState::Init)
            .setup_pkey_index(0)
            .setup_port(me.device.port)
            .setup_access_flags(
                AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead,
            );
        me.qp
            .modify(&attr)
            .map_err(|e| unavailable(&me.peer, "move the queue pair to INIT", &e))?;
        me.repost_recvs()?;
        me.arm()?;
        Ok(me)
    }

    /// What this side tells the peer; `imm_client` is the server's choice (0 from
    /// the client).
    pub(crate) fn local_info(&self, imm_client: u16) -> ConnInfo {
        ConnInfo {
            qp_num: self.qp.qp_number(),
            psn: self.psn,
            lid: self.device.lid,
            mtu: self.device.mtu,
            rd_atomic: self.device.max_rd_atomic,
            gid: self.device.gid,
            recv_depth: self.limits.recv_depth as u32,
            msg_bytes: self.msg_bytes as u32,
            max_regions: self.limits.max_regions as u32,
            imm_client,
        }
    }

    /// Connects to the peer's queue pair (INIT -> RTR -> RTS); reply immediates on
    /// this connection carry `imm_client`.
    pub(crate) fn connect_to(
        &mut self,
        theirs: &ConnInfo,
        imm_client: u16,
    ) -> Result<(), NetError> {
        assert!(!self.connected);
        let mtu = Mtu::from(u32::from(self.device.mtu.min(theirs.mtu)));
        let mut ah = AddressHandleAttribute::new();
        ah.setup_dest_lid(theirs.lid).setup_port(self.device.port).setup_service_level(0);
        if theirs.gid != [0; 16] {
            ah.setup_grh_dest_gid(&Gid { raw: theirs.gid })
                .setup_grh_src_gid_index(self.device.gid_index)
                .setup_grh_hop_limit(HOP_LIMIT);
        }
        let mut rtr = QueuePairAttribute::new();
        rtr.setup_state(QueuePairState::ReadyToReceive)
            .setup_path_mtu(mtu)
            .setup_dest_qp_num(theirs.qp_num)
            .setup_rq_psn(theirs.psn)
            .setup_max_dest_read_atomic(self.device.max_rd_atomic)
            .setup_min_rnr_timer(MIN_RNR_TIMER)
            .setup_address_vector(&ah);
        self.qp
            .modify(&rtr)
            .map_err(|e| unavailable(&self.peer, "move the queue pair to RTR", &e))?;
        let mut rts = QueuePairAttribute::new();
        rts.setup_state(QueuePairState::ReadyToSend)
            .setup_sq_psn(self.psn)
            .setup_timeout(ACK_TIMEOUT)
            .setup_retry_cnt(RETRY_COUNT)
            .setup_rnr_retry(RNR_RETRY_INFINITE)
            .setup_max_read_atomic(self.device.max_init_rd_atomic.min(theirs.rd_atomic));
        self.qp
            .modify(&rts)
            .map_err(|e| unavailable(&self.peer, "move the queue pair to RTS", &e))?;
        self.max_send_bytes = self.msg_bytes.min(theirs.msg_bytes as usize);
        self.peer_max_regions = theirs.max_regions as usize;
        self.imm_client = imm_client;
        self.connected = true;
        Ok(())
    }

    /// Keeps the handshake's TCP stream: the peer closing it, or a refusal on it,
    /// ends the connection; it counts toward the listener's limit through `guard`.
    pub(crate) fn attach_control(
        &mut self,
        stream: TcpStream,
        guard: Option<ConnGuard>,
    ) -> Result<(), NetError> {
        stream.set_nonblocking(true).map_err(|e| NetError::io("configure", &self.peer, e))?;
        self.epoll
            .add(stream.as_raw_fd(), READ, 1)
            .map_err(|e| NetError::io("watch", &self.peer, e))?;
        self.control = Some(stream);
        self._guard = guard;
        Ok(())
    }

    /// Requests the server lets this client have in flight (from its Accept); on the
    /// server side, the credits it granted.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Largest frame a SEND carries on this connection: the smaller of both sides'
    /// message buffers.
    pub fn max_send_bytes(&self) -> usize {
        self.max_send_bytes
    }

    /// The limits this queue pair was made with.
    pub fn limits(&self) -> QpLimits {
        self.limits
    }

    /// The client id that reply immediates on this connection carry.
    pub fn imm_client(&self) -> u16 {
        self.imm_client
    }

    /// Whether the connection is still up.
    pub fn is_up(&self) -> bool {
        self.dead.is_none()
    }

    /// Closes the connection because of what the caller found wrong; logs `reason`
    /// and tells the peer on the control stream.
    pub fn close(&mut self, reason: &str) {
        if self.dead.is_none() {
            log::warn!("closing rdma connection to {}: {reason}", self.peer);
            self.shut(reason.to_owned(), true);
        }
    }

    fn down(&self) -> Option<NetError> {
        self.dead.as_ref().map(|r| NetError::Down { peer: self.peer.clone(), reason: r.clone() })
    }

    fn check_post(&self) -> Result<(), NetError> {
        assert!(self.connected, "an RdmaQp is handed out connected");
        self.down().map_or(Ok(()), Err)
    }

    fn fail(&mut self, e: NetError) -> NetError {
        let from_peer = matches!(e, NetError::Closed { .. } | NetError::Refused { .. });
        if matches!(e, NetError::Closed { .. }) {
            log::info!("{e}");
        } else {
            log::warn!("closing rdma connection to {}: {e}", self.peer);
        }
        self.shut(e.to_string(), !from_peer);
        e
    }

    /// Marks the connection down; tells the peer why on the control stream.
    fn shut(&mut self, reason: String, tell_peer: bool) {
        if let Some(s) = &mut self.control {
            if tell_peer {
                let _ = s.write(&crate::auth::refusal(&reason));
            }
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.dead = Some(reason);
    }
}

impl QueuePair for RdmaQp {
    fn post_send(&mut self, wr: WorkId, frame: Vec<u8>) -> Result<(), Rejected> {
        if let Err(error) = self.check_post() {
            return Err(Rejected { buf: frame, error });
        }
        let valid = frame.len() >= MSG_HEADER_LEN
            && FrameHeader::decode(&frame).is_ok_and(|h| h.frame_len() == frame.len());
        if !valid {
            let error = NetError::Invalid(format!(
                "post_send of {} bytes that are not one encoded frame",
                frame.len()
            ));
            return Err(Rejected { buf: frame, error });
        }
        if frame.len() > self.max_send_bytes {
            let error = NetError::Invalid(format!(
                "frame of {} bytes is over the rdma message size {} of this connection; \
                 send bulk data with a one-sided write",
                frame.len(),
                self.max_send_bytes
            ));
            return Err(Rejected { buf: frame, error });
        }
        let Some(slot) = self.free_sends.pop() else {
            let error = NetError::Full { what: "send queue", depth: self.limits.send_depth };
            return Err(Rejected { buf: frame, error });
        };
        let start = slot as usize * self.msg_bytes;
        self.send_mem.slice_mut(start, start + frame.len()).copy_from_slice(&frame);
        let (lkey, addr) = (self.send_mr.lkey(), self.send_mem.addr(start));
        match self.post_wr(wr_id(TAG_SEND, slot), Verb::Send, lkey, addr, frame.len() as u32) {
            Ok(()) => {
                self.sends[slot as usize] = Some((wr, frame));
                Ok(())
            }
            Err(e) => {
                self.free_sends.push(slot);
                let error = self.fail(e);
                Err(Rejected { buf: frame, error })
            }
        }
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<(), Rejected> {
        if self.app_recv.len() >= self.limits.recv_depth {
            let error = NetError::Full { what: "receive queue", depth: self.limits.recv_depth };
            return Err(Rejected { buf, error });
        }
        self.app_recv.push_back(buf);
        Ok(())
    }

    fn register_region(&mut self, len: usize) -> Result<RegionId, NetError> {
        self.check_post()?;
        let id = self.regions.len();
        if id >= self.limits.max_regions {
            return Err(NetError::Full { what: "region table", depth: self.limits.max_regions });
        }
        if id >= self.peer_max_regions {
            return Err(NetError::Full {
                what: "peer's region table",
                depth: self.peer_max_regions,
            });
        }
        if len > self.limits.max_region_bytes {
            return Err(NetError::Invalid(format!(
                "region of {len} bytes is over the limit {}",
                self.limits.max_region_bytes
            )));
        }
        let mem = DmaBuf::new(len);
        let access = AccessFlags::LocalWrite | AccessFlags::RemoteWrite | AccessFlags::RemoteRead;
        // SAFETY: `mem` is kept in `self.regions`, dropped after its registration.
        let mr = unsafe { register(&self.device, &mem, access) }
            .map_err(|e| unavailable(&self.peer, "register a region", &e))?;
        let ad = RegionAd { addr: mem.addr(0), len: len as u64, rkey: mr.rkey() };
        let header = NetHeader {
            kind: Kind::RdmaRegion,
            region: id as u32,
            len: REGION_AD_BYTES as u32,
            offset: 0,
            token: 0,
        };
        let mut msg = Vec::with_capacity(AD_SLOT_BYTES);
        header.encode(&ad.encode(), &mut msg);
        let start = self.limits.send_depth * self.msg_bytes + id * AD_SLOT_BYTES;
        self.send_mem.slice_mut(start, start + msg.len()).copy_from_slice(&msg);
        let (lkey, addr) = (self.send_mr.lkey(), self.send_mem.addr(start));
        self.regions.push(mem);
        self.region_mrs.push(mr);
        if let Err(e) =
            self.post_wr(wr_id(TAG_AD, id as u32), Verb::Send, lkey, addr, msg.len() as u32)
        {
            return Err(self.fail(e));
        }
        self.ads_in_flight += 1;
        Ok(RegionId(id as u32))
    }

    fn region(&self, id: RegionId) -> &[u8] {
        let r = &self.regions[id.0 as usize];
        r.slice(0, r.len())
    }

    fn region_mut(&mut self, id: RegionId) -> &mut [u8] {
        let r = &mut self.regions[id.0 as usize];
        let len = r.len();
        r.slice_mut(0, len)
    }

    fn post_write(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        self.start_one_sided(local, remote, remote_offset, Op::Write(wr), |rkey, addr| {
            Verb::Write { rkey, addr }
        })
    }

    fn post_read(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        self.start_one_sided(local, remote, remote_offset, Op::Read(wr), |rkey, addr| Verb::Read {
            rkey,
            addr,
        })
    }

    fn post_write_imm(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
        imm: ReplyImm,
    ) -> Result<(), NetError> {
        self.start_one_sided(local, remote, remote_offset, Op::Write(wr), |rkey, addr| {
            Verb::WriteImm { rkey, addr, imm }
        })
    }

    fn peer_region_len(&self, id: RegionId) -> Option<u64> {
        self.remote.get(id.0 as usize).copied().flatten().map(|ad| ad.len)
    }

    fn poll_cq(&mut self, out: &mut Vec<Completion>) -> Result<usize, NetError> {
        if let Some(e) = self.down() {
            return Err(e);
        }
        self.progress(out).map_err(|e| self.fail(e))
    }

    fn prepare_wait(&mut self) -> bool {
        if self.dead.is_some() || !self.done.is_empty() {
            return false;
        }
        if !self.held.is_empty() && !self.app_recv.is_empty() {
            return false;
        }
        self.ack_events(EVENTS_PER_WAIT);
        if let Err(e) = self.arm() {
            self.fail(e);
            return false;
        }
        // Completions that came before arming raise no event: look once more.
        let mut found = std::mem::take(&mut self.scratch);
        let r = self.progress(&mut found);
        let nothing = found.is_empty();
        self.done.extend(found.drain(..));
        self.scratch = found;
        match r {
            Err(e) => {
                self.fail(e);
                false
            }
            Ok(_) => nothing,
        }
    }

    fn wait_fd(&self) -> RawFd {
        self.epoll.raw()
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn backend(&self) -> Backend {
        Backend::Rdma
    }
}

impl Drop for RdmaQp {
    fn drop(&mut self) {
        // ibv_destroy_cq waits until every event it raised is acknowledged.
        self.ack_events(u32::MAX);
    }
}
