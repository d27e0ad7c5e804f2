//! Posting work: sends, one-sided operations and receive buffers.

use std::io;

use sideway::ibverbs::queue_pair::{
    PostSendGuard, QueuePair as _, SetScatterGatherEntry, WorkRequestFlags,
};

use super::{wr_id, Op, RdmaQp, Verb, TAG_OP, TAG_RECV};
use crate::rdma::device::chain;
use crate::transport::{RegionId, RegionRange};
use crate::NetError;

impl RdmaQp {
    fn post_io_error(&self, what: &str, e: &dyn std::error::Error) -> NetError {
        NetError::io("post to", &self.peer, io::Error::other(format!("{what}: {}", chain(e))))
    }

    /// Posts one signaled work request over `len` bytes at `laddr` (lkey `lkey`).
    pub(super) fn post_wr(
        &mut self,
        id: u64,
        verb: Verb,
        lkey: u32,
        laddr: u64,
        len: u32,
    ) -> Result<(), NetError> {
        let mut guard = self.qp.start_post_send();
        let wr = guard.construct_wr(id, WorkRequestFlags::Signaled);
        let local = match verb {
            Verb::Send => wr.setup_send(),
            Verb::Write { rkey, addr } => wr.setup_write(rkey, addr),
            Verb::WriteImm { rkey, addr, imm } => wr.setup_write_imm(rkey, addr, imm.to_wire()),
            Verb::Read { rkey, addr } => wr.setup_read(rkey, addr),
        };
        // SAFETY: `laddr..laddr + len` lies in memory registered under `lkey`, owned by
        // this queue pair and kept (its slot reserved) until the completion.
        unsafe { local.setup_sge(lkey, laddr, len) };
        guard.post().map_err(|e| self.post_io_error("work request", &e))
    }

    /// Re-posts the receive buffers whose contents were taken.
    pub(super) fn repost_recvs(&mut self) -> Result<(), NetError> {
        if self.repost.is_empty() {
            return Ok(());
        }
        let (lkey, msg) = (self.recv_mr.lkey(), self.msg_bytes);
        let mut guard = self.qp.start_post_recv();
        for &slot in &self.repost {
            let addr = self.recv_mem.addr(slot as usize * msg);
            let wr = guard.construct_wr(wr_id(TAG_RECV, slot));
            // SAFETY: the slot's bytes lie in `recv_mem`, registered under `lkey`, and
            // nothing reads them until its completion.
            unsafe { wr.setup_sge(lkey, addr, msg as u32) };
        }
        let posted = guard.post();
        posted.map_err(|e| self.post_io_error("receive buffers", &e))?;
        self.repost.clear();
        Ok(())
    }

    fn local_range(&self, local: RegionRange) -> Result<(u32, u64), NetError> {
        let mem = self.regions.get(local.region.0 as usize).ok_or_else(|| {
            NetError::Invalid(format!(
                "local region {} is not registered ({} regions)",
                local.region.0,
                self.regions.len()
            ))
        })?;
        match local.offset.checked_add(local.len.into()) {
            Some(end) if end <= mem.len() as u64 => Ok((
                self.region_mrs[local.region.0 as usize].lkey(),
                mem.addr(local.offset as usize),
            )),
            _ => Err(NetError::Invalid(format!(
                "local {} bytes at offset {} are outside region {} of {} bytes",
                local.len,
                local.offset,
                local.region.0,
                mem.len()
            ))),
        }
    }

    pub(super) fn start_one_sided(
        &mut self,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
        op: Op,
        verb: impl FnOnce(u32, u64) -> Verb,
    ) -> Result<(), NetError> {
        self.check_post()?;
        let (lkey, laddr) = self.local_range(local)?;
        let ad = self.remote.get(remote.0 as usize).copied().flatten().ok_or_else(|| {
            NetError::Invalid(format!("peer region {} has not been announced", remote.0))
        })?;
        match remote_offset.checked_add(local.len.into()) {
            Some(end) if end <= ad.len => {}
            _ => {
                return Err(NetError::Invalid(format!(
                    "{} bytes at offset {remote_offset} are outside peer region {} of {} bytes",
                    local.len, remote.0, ad.len
                )))
            }
        }
        let token = self.free_ops.pop().ok_or(NetError::Full {
            what: "one-sided operation table",
            depth: self.limits.op_depth,
        })?;
        assert!(self.ops[token as usize].is_none(), "free token {token} is in use");
        self.ops[token as usize] = Some(op);
        let v = verb(ad.rkey, ad.addr + remote_offset);
        if let Err(e) = self.post_wr(wr_id(TAG_OP, token), v, lkey, laddr, local.len) {
            self.ops[token as usize] = None;
            self.free_ops.push(token);
            return Err(self.fail(e));
        }
        Ok(())
    }
}
