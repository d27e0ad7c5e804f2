//! One-sided write and read, emulated with messages: a `Write` carries the bytes
//! and is applied into the peer's region by the peer's poll, which acknowledges it;
//! a `ReadReq` is answered with a `ReadResp`. Every region name, range and token
//! from the peer is checked; a bad one closes the connection with the reason.

use super::{Qp, TxItem};
use crate::msg::{Kind, NetHeader};
use crate::transport::{Completion, RegionId, RegionRange, WorkId};
use crate::NetError;

#[derive(Clone, Copy, Debug)]
pub(super) enum PendingOp {
    Write { wr: WorkId },
    Read { wr: WorkId, local: RegionRange },
}

impl Qp {
    /// Regions may be named by the peer; a bad name or range is the peer's error.
    pub(super) fn region_range(
        &self,
        region: u32,
        offset: u64,
        len: u64,
    ) -> Result<(usize, usize), String> {
        let r = self.regions.get(region as usize).ok_or_else(|| {
            format!("region {region} is not registered ({} regions)", self.regions.len())
        })?;
        match offset.checked_add(len) {
            Some(end) if end <= r.len() as u64 => Ok((offset as usize, end as usize)),
            _ => Err(format!(
                "{len} bytes at offset {offset} are outside region {region} of {} bytes",
                r.len()
            )),
        }
    }

    pub(super) fn take_op(&mut self, op: PendingOp) -> Result<u32, NetError> {
        let token = self.free_ops.pop().ok_or(NetError::Full {
            what: "one-sided operation table",
            depth: self.limits.op_depth,
        })?;
        assert!(self.ops[token as usize].is_none(), "free token {token} is in use");
        self.ops[token as usize] = Some(op);
        Ok(token)
    }

    pub(super) fn finish_op(&mut self, token: u32) -> Option<PendingOp> {
        let op = self.ops.get_mut(token as usize)?.take()?;
        self.free_ops.push(token);
        Some(op)
    }

    pub(super) fn on_net(
        &mut self,
        h: NetHeader,
        start: usize,
        end: usize,
    ) -> Result<Option<Completion>, NetError> {
        let peer = self.peer.clone();
        let bad = |r: String| NetError::protocol(&peer, r);
        match h.kind {
            Kind::Write => {
                let (a, b) = self
                    .region_range(h.region, h.offset, h.len.into())
                    .map_err(|r| bad(format!("one-sided write: {r}")))?;
                let (regions, rx) = (&mut self.regions, &self.rx);
                regions[h.region as usize][a..b].copy_from_slice(rx.bytes(start, end));
                let ack = NetHeader {
                    kind: Kind::WriteAck,
                    region: 0,
                    len: 0,
                    offset: 0,
                    token: h.token,
                };
                self.internal(ack, &[]);
                Ok(None)
            }
            Kind::ReadReq => {
                let p = self.rx.bytes(start, end);
                if p.len() != 4 {
                    return Err(bad(format!(
                        "read request with {} payload bytes, expected 4",
                        p.len()
                    )));
                }
                let len = u32::from_le_bytes(p.try_into().expect("4"));
                if len as usize > pfs_core::wire::MAX_FRAME_PAYLOAD {
                    return Err(bad(format!("read request of {len} bytes is over the limit")));
                }
                let (a, b) = self
                    .region_range(h.region, h.offset, len.into())
                    .map_err(|r| bad(format!("one-sided read: {r}")))?;
                let mut buf = self.spare_bufs.pop().unwrap_or_default();
                buf.clear();
                let resp =
                    NetHeader { kind: Kind::ReadResp, region: 0, len, offset: 0, token: h.token };
                resp.encode(&self.regions[h.region as usize][a..b], &mut buf);
                self.internal_sends += 1;
                self.tx.push_back(TxItem::Internal(buf));
                Ok(None)
            }
            Kind::WriteAck => match self.finish_op(h.token) {
                Some(PendingOp::Write { wr }) => Ok(Some(Completion::Write { wr })),
                other => Err(bad(format!("write ack for token {}, which is {other:?}", h.token))),
            },
            Kind::ReadResp => match self.finish_op(h.token) {
                Some(PendingOp::Read { wr, local }) if local.len == h.len => {
                    let (a, b) = self
                        .region_range(local.region.0, local.offset, local.len.into())
                        .expect("checked at post");
                    let (regions, rx) = (&mut self.regions, &self.rx);
                    regions[local.region.0 as usize][a..b].copy_from_slice(rx.bytes(start, end));
                    Ok(Some(Completion::Read { wr }))
                }
                other => Err(bad(format!(
                    "read response of {} bytes for token {}, which is {other:?}",
                    h.len, h.token
                ))),
            },
            Kind::Refuse => Err(NetError::Refused {
                peer: self.peer.clone(),
                reason: String::from_utf8_lossy(self.rx.bytes(start, end)).into_owned(),
            }),
            kind => Err(bad(format!("handshake message {kind:?} after the handshake"))),
        }
    }

    pub(super) fn check_local(&self, local: RegionRange) -> Result<(), NetError> {
        self.region_range(local.region.0, local.offset, local.len.into())
            .map(|_| ())
            .map_err(|r| NetError::Invalid(format!("local {r}")))
    }

    pub(super) fn start_write(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        self.check_post()?;
        self.check_local(local)?;
        let token = self.take_op(PendingOp::Write { wr })?;
        let h = NetHeader {
            kind: Kind::Write,
            region: remote.0,
            len: local.len,
            offset: remote_offset,
            token,
        };
        let mut buf = self.spare_bufs.pop().unwrap_or_default();
        buf.clear();
        let (a, b) = (local.offset as usize, local.offset as usize + local.len as usize);
        h.encode(&self.regions[local.region.0 as usize][a..b], &mut buf);
        self.internal_sends += 1;
        self.tx.push_back(TxItem::Internal(buf));
        if let Err(e) = self.flush() {
            self.fail(e);
        }
        Ok(())
    }

    pub(super) fn start_read(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
    ) -> Result<(), NetError> {
        self.check_post()?;
        self.check_local(local)?;
        let token = self.take_op(PendingOp::Read { wr, local })?;
        let h = NetHeader {
            kind: Kind::ReadReq,
            region: remote.0,
            len: 4,
            offset: remote_offset,
            token,
        };
        self.internal(h, &local.len.to_le_bytes());
        if let Err(e) = self.flush() {
            self.fail(e);
        }
        Ok(())
    }
}
