//! One-sided write and read, emulated with messages: a `Write` carries the bytes
//! and is applied into the peer's region by the peer's poll, which acknowledges it;
//! a `ReadReq` is answered with a `ReadResp`. A `WriteImm` is a `Write` whose
//! payload starts with a 4-byte immediate, reported to the peer's caller as
//! `Completion::Imm` once applied; a `Region` announces a region's length. Every
//! region name, range and token from the peer is checked; a bad one closes the
//! connection with the reason.

use super::{Qp, TxItem};
use crate::msg::{Kind, NetHeader};
use crate::rdma::ReplyImm;
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
            Kind::Write | Kind::WriteImm => {
                let (imm, start) = if h.kind == Kind::WriteImm {
                    if end - start < 4 {
                        return Err(bad(format!(
                            "write with immediate of {} payload bytes, at least 4",
                            end - start
                        )));
                    }
                    let bits = self.rx.bytes(start, start + 4).try_into().expect("4 bytes");
                    (Some(ReplyImm::from_bits(u32::from_le_bytes(bits))), start + 4)
                } else {
                    (None, start)
                };
                let (a, b) = self
                    .region_range(h.region, h.offset, (end - start) as u64)
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
                Ok(imm.map(|imm| Completion::Imm { imm }))
            }
            Kind::Region => {
                let p = self.rx.bytes(start, end);
                let len = match <[u8; 8]>::try_from(p) {
                    Ok(b) => u64::from_le_bytes(b),
                    Err(_) => {
                        return Err(bad(format!(
                            "region announcement with {} payload bytes, expected 8",
                            p.len()
                        )))
                    }
                };
                let have = self.peer_regions.len();
                match self.peer_regions.get_mut(h.region as usize) {
                    Some(slot @ None) => {
                        *slot = Some(len);
                        Ok(None)
                    }
                    Some(Some(_)) => Err(bad(format!("announced region {} twice", h.region))),
                    None => Err(bad(format!(
                        "announced region {}, past the {have} this side accepts",
                        h.region
                    ))),
                }
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

    /// A one-sided write, with an immediate for the peer when `imm` is given.
    pub(super) fn start_write_imm(
        &mut self,
        wr: WorkId,
        local: RegionRange,
        remote: RegionId,
        remote_offset: u64,
        imm: Option<ReplyImm>,
    ) -> Result<(), NetError> {
        self.check_post()?;
        self.check_local(local)?;
        let prefix = if imm.is_some() { 4 } else { 0 };
        let len = prefix + local.len as usize;
        if len > pfs_core::wire::MAX_FRAME_PAYLOAD {
            return Err(NetError::Invalid(format!(
                "one-sided write of {} bytes is over the {} bytes a tcp or shm message carries",
                local.len,
                pfs_core::wire::MAX_FRAME_PAYLOAD - prefix
            )));
        }
        let token = self.take_op(PendingOp::Write { wr })?;
        let h = NetHeader {
            kind: if imm.is_some() { Kind::WriteImm } else { Kind::Write },
            region: remote.0,
            len: len as u32,
            offset: remote_offset,
            token,
        };
        let mut buf = self.spare_bufs.pop().unwrap_or_default();
        buf.clear();
        let (a, b) = (local.offset as usize, local.offset as usize + local.len as usize);
        let bytes = &self.regions[local.region.0 as usize][a..b];
        match imm {
            Some(imm) => h.encode_parts(&[&imm.bits().to_le_bytes(), bytes], &mut buf),
            None => h.encode(bytes, &mut buf),
        }
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
