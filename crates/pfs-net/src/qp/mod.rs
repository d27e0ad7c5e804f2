//! [`Qp`]: the queue pair of the tcp and shm backends (one-sided operations in
//! `onesided`).
//!
//! Both carry one byte stream of messages (`msg`); only the pipe under it differs.
//! One-sided writes and reads are emulated: a `Write` message carries the bytes and
//! is applied into the peer's region by the peer's `poll_cq`, which acknowledges it;
//! a `ReadReq` is answered with a `ReadResp`. All queues are sized by [`QpLimits`].

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pfs_core::wire::{FrameHeader, HEADER_LEN};

use crate::msg::{
    check_frame_sum, Incoming, Kind, NetHeader, RxBuf, MAX_MSG_BYTES, MSG_HEADER_LEN,
};
use crate::poller::{Epoll, READ, WRITE};
use crate::rdma::ReplyImm;
use crate::shm::ShmPipe;
use crate::transport::{Backend, Completion, QueuePair, RegionId, RegionRange, Rejected, WorkId};
use crate::NetError;

mod onesided;
use onesided::PendingOp;

/// Most completions one [`QueuePair::poll_cq`] call returns.
pub const POLL_BATCH: usize = 64;
/// Most slices gathered into one write.
const GATHER_MAX: usize = 16;
/// Most pipe reads in one poll.
const READS_PER_POLL: usize = 4;
/// Frames at least this long are read from a shm ring straight into a posted
/// receive buffer (`receive_direct`), not through the receive buffer first.
const DIRECT_MIN_BYTES: usize = 64 << 10;

/// Sizes of a queue pair's queues and tables, fixed when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpLimits {
    /// Sends posted whose completions have not been polled.
    pub send_depth: usize,
    /// Receive buffers posted.
    pub recv_depth: usize,
    /// One-sided operations in flight, each way.
    pub op_depth: usize,
    /// Regions registered.
    pub max_regions: usize,
    /// Bytes in one region.
    pub max_region_bytes: usize,
}

impl Default for QpLimits {
    fn default() -> Self {
        QpLimits {
            send_depth: 256,
            recv_depth: 256,
            op_depth: 64,
            max_regions: 64,
            max_region_bytes: 1 << 30,
        }
    }
}

/// The byte pipe under a queue pair.
#[derive(Debug)]
pub(crate) enum Pipe {
    /// A non-blocking TCP socket.
    Tcp(TcpStream),
    /// Shared-memory rings.
    Shm(ShmPipe),
}

/// Counts a live connection for the listener's limit while it exists.
#[derive(Debug)]
pub(crate) struct ConnGuard(pub(crate) Arc<AtomicUsize>);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug)]
enum TxItem {
    App { wr: WorkId, buf: Vec<u8> },
    Internal(Vec<u8>),
}

impl TxItem {
    fn bytes(&self) -> &[u8] {
        match self {
            TxItem::App { buf, .. } | TxItem::Internal(buf) => buf,
        }
    }
}

/// A connected queue pair over TCP or shared memory.
#[derive(Debug)]
pub struct Qp {
    peer: String,
    /// Guards a TCP pipe's socket (`fdguard`); before `pipe`, so it drops first.
    _tcp_guard: Option<crate::fdguard::FdGuard>,
    pipe: Pipe,
    epoll: Epoll,
    interest: u32,
    limits: QpLimits,
    rx: RxBuf,
    recv_posted: VecDeque<Vec<u8>>,
    /// A large frame being read straight into a posted receive buffer (sized
    /// to the frame), and how many of its bytes arrived.
    direct: Option<(Vec<u8>, usize)>,
    tx: VecDeque<TxItem>,
    tx_written: usize,
    app_sends: usize,
    internal_sends: usize,
    spare_bufs: Vec<Vec<u8>>,
    regions: Vec<Vec<u8>>,
    /// Lengths of the peer's regions, as announced (at most `max_regions`).
    peer_regions: Vec<Option<u64>>,
    ops: Vec<Option<PendingOp>>,
    free_ops: Vec<u32>,
    done: VecDeque<Completion>,
    dead: Option<String>,
    credits: u32,
    _guard: Option<ConnGuard>,
}

impl Qp {
    /// Looks whether a shared-memory peer died (its socket closed), so the
    /// next poll reports the link closed instead of waiting for a request
    /// sent into it to time out. A TCP link learns it from its reads.
    pub(crate) fn check_peer(&mut self) {
        if let Pipe::Shm(p) = &mut self.pipe {
            p.check_alive();
        }
    }

    /// Over shared memory: the peer stops ringing for bytes it sends until the
    /// next `prepare_wait` ([`crate::inline`]).
    pub(crate) fn cancel_wait(&mut self) {
        if let Pipe::Shm(p) = &mut self.pipe {
            p.cancel_wait();
        }
    }

    /// Over shared memory, on the server: the inline key for a client in this process.
    pub(crate) fn set_inline_key(&self, key: u64) {
        if let Pipe::Shm(p) = &self.pipe {
            p.set_inline_key(key);
        }
    }

    /// Over shared memory, on the client: the key of the worker it may run inline.
    pub(crate) fn inline_key(&self) -> Option<u64> {
        match &self.pipe {
            Pipe::Shm(p) => p.inline_key(),
            Pipe::Tcp(_) => None,
        }
    }

    /// A queue pair over an established, authenticated pipe.
    pub(crate) fn new(
        peer: String,
        pipe: Pipe,
        limits: QpLimits,
        credits: u32,
        guard: Option<ConnGuard>,
    ) -> Result<Qp, NetError> {
        assert!(limits.send_depth > 0 && limits.recv_depth > 0 && limits.op_depth > 0);
        let epoll = Epoll::new().map_err(|e| NetError::io("create epoll for", &peer, e))?;
        let interest = READ;
        let watch = match &pipe {
            Pipe::Tcp(s) => {
                s.set_nonblocking(true).map_err(|e| NetError::io("configure", &peer, e))?;
                s.set_nodelay(true).map_err(|e| NetError::io("configure", &peer, e))?;
                epoll.add(s.as_raw_fd(), interest, 0)
            }
            Pipe::Shm(p) => p.fds().iter().try_for_each(|&fd| epoll.add(fd, READ, 0)),
        };
        watch.map_err(|e| NetError::io("watch", &peer, e))?;
        let mut rx = RxBuf::new(MAX_MSG_BYTES);
        if matches!(pipe, Pipe::Shm(_)) {
            rx.allow_header_sums();
        }
        let _tcp_guard = match &pipe {
            Pipe::Tcp(s) => Some(crate::fdguard::FdGuard::new(s.as_raw_fd())),
            Pipe::Shm(_) => None,
        };
        Ok(Qp {
            rx,
            recv_posted: VecDeque::with_capacity(limits.recv_depth),
            direct: None,
            tx: VecDeque::with_capacity(limits.send_depth + limits.op_depth * 2),
            tx_written: 0,
            app_sends: 0,
            internal_sends: 0,
            spare_bufs: Vec::with_capacity(limits.op_depth),
            regions: Vec::new(),
            peer_regions: vec![None; limits.max_regions],
            ops: vec![None; limits.op_depth],
            free_ops: (0..limits.op_depth as u32).rev().collect(),
            done: VecDeque::with_capacity(limits.send_depth + limits.op_depth),
            dead: None,
            peer,
            _tcp_guard,
            pipe,
            epoll,
            interest,
            limits,
            credits,
            _guard: guard,
        })
    }

    /// Requests the server lets this client have in flight (from its Accept);
    /// on the server side, the credits it granted.
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// The limits this queue pair was made with.
    pub fn limits(&self) -> QpLimits {
        self.limits
    }

    /// Whether the connection is still up.
    pub fn is_up(&self) -> bool {
        self.dead.is_none()
    }

    /// Closes the connection because of what the caller found wrong with the peer's
    /// data (a frame body that does not decode, for example); logs `reason`.
    pub fn close(&mut self, reason: &str) {
        if self.dead.is_none() {
            log::warn!("closing connection to {}: {reason}", self.peer);
            self.dead = Some(reason.to_owned());
            if let Pipe::Tcp(s) = &self.pipe {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    fn down(&self) -> Option<NetError> {
        self.dead.as_ref().map(|r| NetError::Down { peer: self.peer.clone(), reason: r.clone() })
    }

    fn fail(&mut self, e: NetError) -> NetError {
        match &e {
            NetError::Closed { .. } => log::info!("{e}"),
            _ => log::warn!("closing connection to {}: {e}", self.peer),
        }
        self.dead = Some(e.to_string());
        if let Pipe::Tcp(s) = &self.pipe {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        e
    }

    fn internal(&mut self, h: NetHeader, payload: &[u8]) {
        let mut buf = self.spare_bufs.pop().unwrap_or_default();
        buf.clear();
        h.encode(payload, &mut buf);
        self.internal_sends += 1;
        self.tx.push_back(TxItem::Internal(buf));
    }

    /// The peer holds us back until we post receives or drain our answers to it.
    fn rx_blocked(&self) -> bool {
        (self.rx.front_is_frame() && self.recv_posted.is_empty())
            || self.internal_sends >= self.limits.op_depth
    }

    fn write_pipe(&mut self) -> io::Result<usize> {
        let mut slices = [IoSlice::new(&[]); GATHER_MAX];
        let mut count = 0;
        for (i, item) in self.tx.iter().take(GATHER_MAX).enumerate() {
            let b = item.bytes();
            slices[i] = IoSlice::new(if i == 0 { &b[self.tx_written..] } else { b });
            count += 1;
        }
        match &mut self.pipe {
            Pipe::Tcp(s) => match s.write_vectored(&slices[..count]) {
                Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                other => other,
            },
            Pipe::Shm(p) => {
                let mut plain: [&[u8]; GATHER_MAX] = [&[]; GATHER_MAX];
                for (d, s) in plain.iter_mut().zip(&slices[..count]) {
                    *d = s;
                }
                match p.write(&plain[..count])? {
                    0 => Err(io::ErrorKind::WouldBlock.into()),
                    n => Ok(n),
                }
            }
        }
    }

    /// Writes queued messages until the pipe is full or the queue is empty.
    fn flush(&mut self) -> Result<(), NetError> {
        for _ in 0..self.tx.len() {
            if self.tx.is_empty() {
                break;
            }
            let mut n = match self.write_pipe() {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_disconnect(&e) => {
                    return Err(NetError::Closed { peer: self.peer.clone() })
                }
                Err(e) => return Err(NetError::io("write to", &self.peer, e)),
            };
            while n > 0 {
                let front_left =
                    self.tx.front().expect("wrote bytes of a queued item").bytes().len()
                        - self.tx_written;
                if n < front_left {
                    self.tx_written += n;
                    break;
                }
                n -= front_left;
                self.tx_written = 0;
                match self.tx.pop_front().expect("front exists") {
                    TxItem::App { wr, buf } => {
                        // The slot frees when the completion is polled, as in verbs.
                        self.done.push_back(Completion::Send { wr, buf });
                    }
                    TxItem::Internal(buf) => {
                        self.internal_sends -= 1;
                        if self.spare_bufs.len() < self.limits.op_depth
                            && buf.capacity() <= 64 << 10
                        {
                            self.spare_bufs.push(buf);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Tells epoll what this queue pair waits for (tcp); a syscall only on change.
    fn update_interest(&mut self) -> Result<(), NetError> {
        let Pipe::Tcp(s) = &self.pipe else { return Ok(()) };
        let want =
            if self.rx_blocked() { 0 } else { READ } | if self.tx.is_empty() { 0 } else { WRITE };
        if want != self.interest {
            self.epoll
                .modify(s.as_raw_fd(), want, 0)
                .map_err(|e| NetError::io("watch", &self.peer, e))?;
            self.interest = want;
        }
        Ok(())
    }

    /// Handles the buffered messages, up to `room` completions.
    fn parse(&mut self, out: &mut Vec<Completion>, room: usize) -> Result<usize, NetError> {
        let mut n = 0;
        while n < room && !self.rx_blocked() {
            let msg = self.rx.next_message().map_err(|r| NetError::protocol(&self.peer, r))?;
            match msg {
                None => break,
                Some(Incoming::Frame { start, end }) => {
                    let mut buf =
                        self.recv_posted.pop_front().expect("not blocked: a receive is posted");
                    buf.clear();
                    buf.extend_from_slice(self.rx.bytes(start, end));
                    out.push(Completion::Recv { buf });
                    n += 1;
                }
                Some(Incoming::Net { header, start, end }) => {
                    if let Some(c) = self.on_net(header, start, end)? {
                        out.push(c);
                        n += 1;
                    }
                }
            }
        }
        Ok(n)
    }

    /// Reads a large frame from a shm ring straight into a posted receive
    /// buffer, saving the copy through the receive buffer. It starts when the
    /// receive buffer is empty and the ring begins with the header of a frame
    /// of at least `DIRECT_MIN_BYTES`, and goes on over later polls until the
    /// whole frame arrived; then its checksum is checked, as `next_message`
    /// checks every other frame. TCP reads go through the receive buffer.
    fn receive_direct(&mut self) -> Result<Direct, NetError> {
        if self.direct.is_none() {
            let Pipe::Shm(p) = &self.pipe else { return Ok(Direct::No) };
            if self.rx.buffered() != 0 || self.recv_posted.is_empty() {
                return Ok(Direct::No);
            }
            let mut head = [0u8; HEADER_LEN];
            if !p.peek(&mut head).map_err(|e| self.read_error(e))? {
                return Ok(Direct::No);
            }
            // A header that does not check out is reported by the usual path.
            let Ok(h) = FrameHeader::decode(&head) else { return Ok(Direct::No) };
            let total = h.frame_len();
            if total < DIRECT_MIN_BYTES || total > self.rx.max_bytes() {
                return Ok(Direct::No);
            }
            // The buffer posted last: the one given back last, most likely
            // large already (a large reply's, reposted once read), so a steady
            // stream of large frames reuses a few buffers instead of growing
            // every posted one (fresh pages, faulted in and cleared by the
            // kernel: a tenth of a read's CPU at 1 MiB before).
            let mut buf = self.recv_posted.pop_back().expect("checked above");
            // Filled from the ring into its spare capacity: never zeroed first.
            buf.clear();
            self.direct = Some((buf, total));
        }
        let Pipe::Shm(p) = &mut self.pipe else { unreachable!("started on a shm pipe") };
        let (buf, total) = self.direct.as_mut().expect("started above");
        while buf.len() < *total {
            match p.read_append(buf, *total) {
                Ok(0) => {
                    let msg = format!(
                        "truncated message: the connection ended {} bytes into a \
                         frame of {total}",
                        buf.len()
                    );
                    return Err(NetError::protocol(&self.peer, msg));
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Direct::Waiting),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.read_error(e)),
            }
        }
        let (buf, _) = self.direct.take().expect("started above");
        // A shm pipe: frames summed over their header only are fine here.
        check_frame_sum(&buf, true).map_err(|msg| NetError::protocol(&self.peer, msg))?;
        Ok(Direct::Done(buf))
    }

    /// The error a failed pipe read means.
    fn read_error(&self, e: io::Error) -> NetError {
        if is_disconnect(&e) {
            NetError::Closed { peer: self.peer.clone() }
        } else if e.kind() == io::ErrorKind::InvalidData {
            NetError::protocol(&self.peer, e.to_string())
        } else {
            NetError::io("read from", &self.peer, e)
        }
    }

    fn read_pipe(&mut self) -> io::Result<usize> {
        let spare = self.rx.spare();
        if spare.is_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        match &mut self.pipe {
            Pipe::Tcp(s) => s.read(spare),
            Pipe::Shm(p) => p.read(spare),
        }
    }

    fn progress(&mut self, out: &mut Vec<Completion>) -> Result<usize, NetError> {
        self.flush()?;
        let mut n = 0;
        for _ in 0..READS_PER_POLL {
            n += self.parse(out, POLL_BATCH - n)?;
            if n >= POLL_BATCH || self.rx_blocked() {
                break;
            }
            match self.receive_direct()? {
                Direct::Done(buf) => {
                    out.push(Completion::Recv { buf });
                    n += 1;
                    continue;
                }
                // The rest of a large frame has not arrived yet.
                Direct::Waiting => break,
                Direct::No => {}
            }
            match self.read_pipe() {
                Ok(0) if self.rx.buffered() > 0 => {
                    return Err(NetError::protocol(
                        &self.peer,
                        format!(
                            "truncated message: the connection ended {} bytes into it",
                            self.rx.buffered()
                        ),
                    ))
                }
                Ok(0) => return Err(NetError::Closed { peer: self.peer.clone() }),
                Ok(k) => self.rx.filled(k),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_disconnect(&e) => {
                    return Err(NetError::Closed { peer: self.peer.clone() })
                }
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    return Err(NetError::protocol(&self.peer, e.to_string()))
                }
                Err(e) => return Err(NetError::io("read from", &self.peer, e)),
            }
        }
        n += self.parse(out, POLL_BATCH - n)?;
        self.flush()?;
        while n < POLL_BATCH {
            let Some(c) = self.done.pop_front() else { break };
            if matches!(c, Completion::Send { .. }) {
                self.app_sends -= 1;
            }
            out.push(c);
            n += 1;
        }
        self.update_interest()?;
        Ok(n)
    }

    /// Bytes a frame sent by [`send_gathered`](Self::send_gathered) may
    /// have: the room of the shared-memory ring when nothing waits in the send
    /// queue before it; 0 over TCP, with sends queued, or once down.
    pub fn gather_room(&self) -> usize {
        if self.down().is_some() || !self.tx.is_empty() {
            return 0;
        }
        match &self.pipe {
            Pipe::Shm(p) => p.tx_free(),
            Pipe::Tcp(_) => 0,
        }
    }

    /// Sends one encoded frame given in pieces (`parts`, the header first),
    /// copying them straight into the shared-memory ring: a read's bytes go
    /// from the server's buffers to the ring without a reply buffer between.
    /// The frame must fit [`gather_room`](Self::gather_room); nothing
    /// completes for it (no buffer was lent).
    pub fn send_gathered(&mut self, parts: &[&[u8]]) -> Result<(), NetError> {
        self.check_post()?;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let head = parts.first().copied().unwrap_or_default();
        let valid = head.len() >= MSG_HEADER_LEN
            && FrameHeader::decode(head).is_ok_and(|h| h.frame_len() == len);
        if !valid {
            return Err(NetError::Invalid(format!(
                "send_gathered of {len} bytes in {} parts that are not one encoded frame",
                parts.len()
            )));
        }
        let room = self.gather_room();
        if len > room {
            return Err(NetError::Invalid(format!(
                "send_gathered of a {len}-byte frame with room for {room}"
            )));
        }
        let Pipe::Shm(p) = &mut self.pipe else { unreachable!("room only through shared memory") };
        match p.write(parts) {
            Ok(n) if n == len => Ok(()),
            Ok(n) => {
                let e = NetError::io(
                    "write to",
                    &self.peer,
                    io::Error::other(format!("ring took {n} of {len} bytes it had room for")),
                );
                Err(self.fail(e))
            }
            Err(e) => {
                let e = NetError::io("write to", &self.peer, e);
                Err(self.fail(e))
            }
        }
    }

    fn check_post(&self) -> Result<(), NetError> {
        match self.down() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// What [`Qp::receive_direct`] did.
enum Direct {
    /// A whole large frame, checked.
    Done(Vec<u8>),
    /// Part of a large frame is in; the rest comes in a later poll.
    Waiting,
    /// Nothing to read that way: read through the receive buffer.
    No,
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::WriteZero
            | io::ErrorKind::UnexpectedEof
    )
}

impl QueuePair for Qp {
    fn post_send(&mut self, wr: WorkId, frame: Vec<u8>) -> Result<(), Rejected> {
        if let Err(error) = self.check_post() {
            return Err(Rejected { buf: frame, error });
        }
        if self.app_sends >= self.limits.send_depth {
            let error = NetError::Full { what: "send queue", depth: self.limits.send_depth };
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
        let was_empty = self.tx.is_empty();
        self.app_sends += 1;
        self.tx.push_back(TxItem::App { wr, buf: frame });
        if was_empty {
            // Send at once: most sends go out without waiting for the next poll.
            if let Err(e) = self.flush() {
                self.fail(e);
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, buf: Vec<u8>) -> Result<(), Rejected> {
        if self.recv_posted.len() >= self.limits.recv_depth {
            let error = NetError::Full { what: "receive queue", depth: self.limits.recv_depth };
            return Err(Rejected { buf, error });
        }
        self.recv_posted.push_back(buf);
        Ok(())
    }

    fn register_region(&mut self, len: usize) -> Result<RegionId, NetError> {
        if self.regions.len() >= self.limits.max_regions {
            return Err(NetError::Full { what: "region table", depth: self.limits.max_regions });
        }
        if len > self.limits.max_region_bytes {
            return Err(NetError::Invalid(format!(
                "region of {len} bytes is over the limit {}",
                self.limits.max_region_bytes
            )));
        }
        self.check_post()?;
        self.regions.push(vec![0; len]);
        let id = self.regions.len() as u32 - 1;
        // Announced in order with everything sent after it, as over RDMA.
        let ad = NetHeader { kind: Kind::Region, region: id, len: 8, offset: 0, token: 0 };
        self.internal(ad, &(len as u64).to_le_bytes());
        if let Err(e) = self.flush() {
            return Err(self.fail(e));
        }
        Ok(RegionId(id))
    }

    fn region(&self, id: RegionId) -> &[u8] {
        &self.regions[id.0 as usize]
    }

    fn region_mut(&mut self, id: RegionId) -> &mut [u8] {
        &mut self.regions[id.0 as usize]
    }

    fn post_write(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        self.start_write_imm(wr, local, remote, remote_offset, None)
    }

    fn post_read(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        self.start_read(wr, local, remote, remote_offset)
    }

    fn post_write_imm(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
        imm: ReplyImm,
    ) -> Result<(), NetError> {
        self.start_write_imm(wr, local, remote, remote_offset, Some(imm))
    }

    fn peer_region_len(&self, id: RegionId) -> Option<u64> {
        self.peer_regions.get(id.0 as usize).copied().flatten()
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
        if self.rx.buffered() >= MSG_HEADER_LEN && !self.rx_blocked() {
            return false;
        }
        if self.update_interest().is_err() {
            return false;
        }
        match &mut self.pipe {
            Pipe::Tcp(_) => true,
            // Arming drains the wake-up, and with it the peer's word that it
            // made room in a full tx ring: bytes still to send into a ring
            // that has room now mean work, not a wait.
            Pipe::Shm(p) => p.prepare_wait() && (self.tx.is_empty() || !p.tx_room()),
        }
    }

    fn wait_fd(&self) -> RawFd {
        self.epoll.raw()
    }

    fn peer(&self) -> &str {
        &self.peer
    }

    fn backend(&self) -> Backend {
        match self.pipe {
            Pipe::Tcp(_) => Backend::Tcp,
            Pipe::Shm(_) => Backend::Shm,
        }
    }
}
