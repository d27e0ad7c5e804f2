//! Completions: the completion queue and its channel, what each work completion
//! means, received frames and region announcements, the control stream.

use std::io::{self, Read};
use std::ptr::null_mut;

use rdma_mummy_sys::{ibv_ack_cq_events, ibv_cq, ibv_get_cq_event, ibv_req_notify_cq};
use sideway::ibverbs::completion::{
    CompletionQueue, PollCompletionQueueError, WorkCompletionOperationType, WorkCompletionStatus,
};

use super::{is_disconnect, status_name, Op, RdmaQp, Wc, TAG_AD, TAG_OP, TAG_RECV, TAG_SEND};
use crate::msg::{check_datagram, Datagram, Kind, NetHeader, MSG_HEADER_LEN};
use crate::qp::POLL_BATCH;
use crate::rdma::device::chain;
use crate::rdma::imm::ReplyImm;
use crate::rdma::info::RegionAd;
use crate::transport::Completion;
use crate::NetError;

impl RdmaQp {
    /// Asks for a completion-channel event on the next completion.
    pub(super) fn arm(&mut self) -> Result<(), NetError> {
        // SAFETY: the completion queue lives as long as `self`.
        let rc = unsafe { ibv_req_notify_cq(self.cq.cq().as_ptr(), 0) };
        if rc != 0 {
            return Err(NetError::io(
                "arm the completion queue of",
                &self.peer,
                io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    /// Takes and acknowledges pending completion-channel events (at most `limit`).
    pub(super) fn ack_events(&mut self, limit: u32) {
        // SAFETY: the channel is non-blocking and lives as long as `self`; the out
        // pointers are valid locals.
        let channel = unsafe { self.channel.comp_channel() }.as_ptr();
        let mut count = 0;
        while count < limit {
            let mut cq: *mut ibv_cq = null_mut();
            let mut context = null_mut();
            // SAFETY: see above.
            if unsafe { ibv_get_cq_event(channel, &mut cq, &mut context) } != 0 {
                break;
            }
            count += 1;
        }
        if count > 0 {
            // SAFETY: every event counted came from this queue pair's only CQ.
            unsafe { ibv_ack_cq_events(self.cq.cq().as_ptr(), count) };
        }
    }

    /// Copies up to `max` work completions out of the completion queue.
    fn poll_hw(&mut self, max: usize) -> Result<usize, NetError> {
        self.wcs.clear();
        if max == 0 {
            return Ok(0);
        }
        match self.cq.start_poll() {
            Ok(mut poller) => {
                while self.wcs.len() < max {
                    let Some(wc) = poller.next() else { break };
                    self.wcs.push(Wc {
                        wr_id: wc.wr_id(),
                        status: wc.status(),
                        opcode: wc.opcode(),
                        byte_len: wc.byte_len(),
                        imm: wc.imm_data(),
                    });
                }
            }
            Err(PollCompletionQueueError::CompletionQueueEmpty) => {}
            Err(e) => {
                return Err(NetError::io(
                    "poll the completion queue of",
                    &self.peer,
                    io::Error::other(chain(&e)),
                ))
            }
        }
        Ok(self.wcs.len())
    }

    fn on_wc(&mut self, wc: Wc, out: &mut Vec<Completion>) -> Result<usize, NetError> {
        let (tag, index) = (wc.wr_id >> 32, wc.wr_id as u32);
        if wc.status != WorkCompletionStatus::Success as u32 {
            let what = match tag {
                TAG_SEND => "a send",
                TAG_OP => "a one-sided operation",
                TAG_AD => "a region announcement",
                _ => "a receive",
            };
            return Err(NetError::Down {
                peer: self.peer.clone(),
                reason: format!("{what} failed: {}", status_name(wc.status)),
            });
        }
        match tag {
            TAG_SEND => {
                let (wr, buf) = self.sends[index as usize].take().expect("a posted send");
                self.free_sends.push(index);
                out.push(Completion::Send { wr, buf });
                Ok(1)
            }
            TAG_OP => {
                let op = self.ops[index as usize].take().expect("a posted one-sided operation");
                self.free_ops.push(index);
                out.push(match op {
                    Op::Write(wr) => Completion::Write { wr },
                    Op::Read(wr) => Completion::Read { wr },
                });
                Ok(1)
            }
            TAG_AD => {
                self.ads_in_flight -= 1;
                Ok(0)
            }
            TAG_RECV => self.on_recv(index, wc, out),
            _ => panic!("work request id 0x{:x} was not made here", wc.wr_id),
        }
    }

    /// A receive completed: a frame (held for a posted buffer), a region
    /// announcement, or a write with immediate (reported at once: its bytes are in a
    /// region, the receive buffer is free again). Returns the completions added.
    fn on_recv(&mut self, slot: u32, wc: Wc, out: &mut Vec<Completion>) -> Result<usize, NetError> {
        if wc.opcode == WorkCompletionOperationType::ReceiveWithImmediate as u32 {
            let imm = ReplyImm::from_wire(wc.imm);
            if imm.client() != u32::from(self.imm_client) {
                return Err(NetError::protocol(
                    &self.peer,
                    format!(
                        "reply immediate names client {} (slot {}), this connection is client {}",
                        imm.client(),
                        imm.slot(),
                        self.imm_client
                    ),
                ));
            }
            self.repost.push(slot);
            out.push(Completion::Imm { imm });
            return Ok(1);
        }
        if wc.opcode != WorkCompletionOperationType::Receive as u32 {
            let r = format!("receive completion with opcode {}", wc.opcode);
            return Err(NetError::protocol(&self.peer, r));
        }
        let len = wc.byte_len as usize;
        assert!(len <= self.msg_bytes, "the NIC fails a message longer than the buffer");
        let start = slot as usize * self.msg_bytes;
        let msg = self.recv_mem.slice(start, start + len);
        // RDMA carries frames summed over header and payload only.
        let parsed = match check_datagram(msg, false) {
            Ok(Datagram::Frame) => None,
            Ok(Datagram::Net(h)) if h.kind == Kind::RdmaRegion => {
                Some(RegionAd::decode(&msg[MSG_HEADER_LEN..]).map(|ad| (h.region, ad)))
            }
            Ok(Datagram::Net(h)) => Some(Err(format!("transport message {:?} over rdma", h.kind))),
            Err(r) => Some(Err(r)),
        };
        match parsed {
            None => self.held.push_back((slot, len as u32)),
            Some(Ok((region, ad))) => {
                self.learn_region(region, ad)?;
                self.repost.push(slot);
            }
            Some(Err(r)) => return Err(NetError::protocol(&self.peer, r)),
        }
        Ok(0)
    }

    fn learn_region(&mut self, region: u32, ad: RegionAd) -> Result<(), NetError> {
        let have = self.remote.len();
        match self.remote.get_mut(region as usize) {
            None => Err(NetError::protocol(
                &self.peer,
                format!("announced region {region}, past the {have} this side accepts"),
            )),
            Some(Some(_)) => {
                Err(NetError::protocol(&self.peer, format!("announced region {region} twice")))
            }
            Some(slot) => {
                *slot = Some(ad);
                Ok(())
            }
        }
    }

    /// Hands held frames to posted receive buffers, up to `room`.
    fn deliver(&mut self, out: &mut Vec<Completion>, room: usize) -> usize {
        let mut n = 0;
        while n < room && !self.held.is_empty() && !self.app_recv.is_empty() {
            let (slot, len) = self.held.pop_front().expect("not empty");
            let mut buf = self.app_recv.pop_front().expect("not empty");
            let start = slot as usize * self.msg_bytes;
            buf.clear();
            buf.extend_from_slice(self.recv_mem.slice(start, start + len as usize));
            out.push(Completion::Recv { buf });
            self.repost.push(slot);
            n += 1;
        }
        n
    }

    /// The peer's end of the control stream: silent is good; closed or a refusal
    /// ends the connection.
    fn check_control(&mut self) -> Result<(), NetError> {
        let Some(s) = &mut self.control else { return Ok(()) };
        let mut buf = [0u8; MSG_HEADER_LEN + crate::auth::MAX_REASON_BYTES];
        match s.read(&mut buf) {
            Ok(0) => Err(NetError::Closed { peer: self.peer.clone() }),
            Ok(n) => match NetHeader::decode(&buf[..n.max(MSG_HEADER_LEN)]) {
                Ok(h) if n >= MSG_HEADER_LEN && h.kind == Kind::Refuse => {
                    let reason = String::from_utf8_lossy(&buf[MSG_HEADER_LEN..n]).into_owned();
                    Err(NetError::Refused { peer: self.peer.clone(), reason })
                }
                _ => Err(NetError::protocol(
                    &self.peer,
                    format!("{n} bytes on the rdma control stream"),
                )),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) if is_disconnect(&e) => Err(NetError::Closed { peer: self.peer.clone() }),
            Err(e) => Err(NetError::io("read from", &self.peer, e)),
        }
    }

    pub(super) fn progress(&mut self, out: &mut Vec<Completion>) -> Result<usize, NetError> {
        let mut n = 0;
        while n < POLL_BATCH {
            let Some(c) = self.done.pop_front() else { break };
            out.push(c);
            n += 1;
        }
        let got = self.poll_hw(POLL_BATCH - n)?;
        for i in 0..got {
            let wc = self.wcs[i];
            n += self.on_wc(wc, out)?;
        }
        n += self.deliver(out, POLL_BATCH - n);
        self.repost_recvs()?;
        debug_assert!(self.held.len() <= self.limits.recv_depth);
        if got == 0 && n == 0 {
            // Idle: worth a syscall to notice a peer that went away.
            self.check_control()?;
        }
        Ok(n)
    }
}
