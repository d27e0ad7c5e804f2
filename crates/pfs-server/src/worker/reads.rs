//! Data reads: started on the shard, answered when their device reads finish,
//! sealed in place or by the memcpy pool, or sent from read-ahead buffers
//! straight into a shared-memory ring.

use pfs_core::wire::{Body, Frame, Opcode, Request, READ_REPLY_PREFIX};
use pfs_core::{ClientId, FsError, FsResult, RequestId};
use pfs_net::QueuePair;
use pfs_store::device::Device;
use pfs_store::shard::dataio::{Gathered, ReadShape, ReadStart};

use crate::memcpy::Job;
use crate::msg::ConnRef;

use super::Worker;

/// Where the reply of a read waiting for the device goes.
#[derive(Debug)]
pub(super) struct PendingRead {
    pub(super) origin: u16,
    pub(super) conn: ConnRef,
    pub(super) request_id: RequestId,
    pub(super) client: ClientId,
    /// `Read` or `ReadData`.
    pub(super) op: Opcode,
    /// The request's buffer, reused for an error reply.
    pub(super) buf: Vec<u8>,
}

impl<D: Device> Worker<D> {
    /// Starts `req` if it is a data read; gives any other request back. A
    /// read that must wait for the device is answered by
    /// [`send_finished_reads`](Self::send_finished_reads). The bytes land
    /// after room for the reply's header, so the reply is sealed around them
    /// (`read_reply`) instead of copied into a frame.
    pub(super) fn start_read(&mut self, req: Request) -> Result<FsResult<ReadStart>, Request> {
        let shape = ReadShape { prefix: READ_REPLY_PREFIX, pad: 0, background: true, gather: true };
        let started = match req {
            Request::Read { ino, fh: _, offset, size, blocks } => {
                self.shard.read_start(ino, offset, size as usize, blocks, shape)
            }
            Request::ReadData { ino, layout, offset, size, blocks } => {
                self.shard.read_data_start(ino, layout, offset, size as usize, blocks, shape)
            }
            other => return Err(other),
        };
        // As `execute` does: an operation cut halfway fails the shard.
        self.shard.end_request();
        Ok(started)
    }

    /// Whether the reply to a read of `len` bytes that came on this worker's
    /// connection `conn` (`origin`) may be sent from the read-ahead buffers
    /// straight into the connection's shared-memory ring
    /// ([`ReadStart::Gather`]): nothing is queued before it there and the
    /// ring has room for it.
    pub(super) fn can_gather(&self, origin: u16, conn: ConnRef, len: usize) -> bool {
        origin == self.id
            && self
                .conns
                .get(conn.slot as usize)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.gen == conn.gen && c.qp.gather_room() >= READ_REPLY_PREFIX + len)
    }

    /// A read that read-ahead buffers held whole, for a connection it cannot
    /// go to straight (another worker's, a full ring, a network link): its
    /// bytes copied once into a reply buffer, after room for the header. Not
    /// zeroed first, as a buffer the device fills must be.
    pub(super) fn gathered_reply(&mut self, g: Gathered) -> Vec<u8> {
        let mut out = Vec::with_capacity(READ_REPLY_PREFIX + g.len());
        out.resize(READ_REPLY_PREFIX, 0);
        let mut parts = Vec::with_capacity(8);
        g.slices(&mut parts);
        for part in parts {
            out.extend_from_slice(part);
        }
        self.shard.gather_done(g);
        out
    }

    /// Sends the reply to read `p` from the read-ahead buffers `g` lent,
    /// straight into its connection's ring (checked by
    /// [`can_gather`](Self::can_gather)), then gives the buffers back. The
    /// request's buffer goes back to the connection's receive queue, as a sent
    /// reply's does.
    pub(super) fn send_gathered(&mut self, p: PendingRead, g: Gathered) {
        let slot = p.conn.slot as usize;
        let header = Frame::read_reply_header(g.len(), p.request_id, p.client, p.op);
        let mut failed = None;
        match (header, self.conns.get_mut(slot).and_then(Option::as_mut)) {
            (Ok(header), Some(state)) if state.gen == p.conn.gen => {
                let mut parts = Vec::with_capacity(8);
                parts.push(&header[..]);
                g.slices(&mut parts);
                match state.qp.send_gathered(&parts) {
                    Ok(()) => {
                        let _ = state.qp.post_recv(p.buf);
                    }
                    Err(e) => failed = Some(format!("cannot send a reply: {e}")),
                }
            }
            // The connection closed meanwhile: nobody to answer.
            (Ok(_), _) => {}
            (Err(e), _) => {
                // Not reached: the shard bounds a read's length, and `p.op` is a read.
                let error = FsError::Io(format!("reply does not fit the protocol: {e}"));
                let (origin, conn) = (p.origin, p.conn);
                if let Some(reply) = self.read_reply(p, Err(error)) {
                    self.route_reply(origin, conn, reply);
                }
            }
        }
        self.shard.gather_done(g);
        if let Some(reason) = failed {
            self.drop_conn(slot, &reason);
        }
    }

    /// Answers the reads whose device reads finished; returns how many.
    pub(super) fn send_finished_reads(&mut self) -> usize {
        let finished = self.shard.take_finished_reads();
        let n = finished.len();
        for (id, result) in finished {
            let Some(p) = self.reads.remove(&id) else { continue };
            let (origin, conn) = (p.origin, p.conn);
            if let Some(buf) = self.read_reply(p, result) {
                self.route_reply(origin, conn, buf);
            }
        }
        n
    }

    /// The reply to read `p` whose output is `result`: on success, the bytes
    /// after `READ_REPLY_PREFIX` bytes of room, sealed into a frame in place
    /// by the memcpy pool when large (`None`: the pool sends it) or here; on
    /// failure, an error reply in the request's buffer.
    pub(super) fn read_reply(
        &mut self,
        p: PendingRead,
        result: FsResult<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        let result = result.and_then(|out| {
            let len = out.len() - READ_REPLY_PREFIX;
            if len > pfs_core::wire::MAX_IO_BYTES {
                return Err(FsError::Io(format!(
                    "reply does not fit the protocol: {len} bytes of read data"
                )));
            }
            Ok(out)
        });
        let mut out = match result {
            Ok(out) => out,
            Err(error) => {
                let reply = Frame {
                    request_id: p.request_id,
                    client: p.client,
                    body: Body::Error { op: p.op, error },
                };
                let mut buf = p.buf;
                buf.clear();
                reply.encode(&mut buf).expect("an error frame always encodes");
                return Some(buf);
            }
        };
        let (request_id, client, op) = (p.request_id, p.client, p.op);
        let sum = p.conn.sum;
        if let Some(port) = self.memcpy.as_mut() {
            if out.len() - READ_REPLY_PREFIX >= port.threshold_bytes {
                let (worker, origin, conn) = (self.id, p.origin, p.conn);
                let job = Job { worker, origin, conn, request_id, client, op, sum, buf: out };
                match port.offer(job) {
                    None => return None,
                    // The pool's queue is full: seal it here.
                    Some(job) => out = job.buf,
                }
            }
        }
        Frame::seal_read_reply(&mut out, request_id, client, op, sum).expect("size checked above");
        Some(out)
    }
}
