//! The frame: a fixed 32-byte header, then the payload of one message.

use super::cursor::{Reader, Writer};
use super::request::WriteRef;
use super::types::Codec;
use super::{Opcode, Reply, Request, WireError, HEADER_LEN, MAGIC, MAX_FRAME_PAYLOAD, VERSION};
use crate::{ClientId, FsError, RequestId};

/// Header flag: the frame answers a request (clear: it is a request).
pub const FLAG_REPLY: u16 = 1 << 0;
/// Header flag: the reply is an error; needs [`FLAG_REPLY`].
pub const FLAG_ERROR: u16 = 1 << 1;
/// Header flag: the checksum covers the header's first 28 bytes only, not
/// the payload. Set on frames sent through shared memory, whose bytes never
/// leave this host's memory ([`Sum::Header`]); a receiver refuses it on any
/// other link (docs/format.md).
pub const FLAG_HEADER_SUM: u16 = 1 << 2;

/// What a frame's checksum covers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sum {
    /// The header's first 28 bytes and the payload: every link.
    #[default]
    Full,
    /// The header's first 28 bytes ([`FLAG_HEADER_SUM`]): only through shared
    /// memory, where a payload is copied from memory to memory and the passes
    /// over it to sum and to check bought nothing (about a tenth of the CPU of
    /// a 1 MiB transfer).
    Header,
}

impl Sum {
    /// The header flag that says it.
    pub fn flag(self) -> u16 {
        match self {
            Sum::Full => 0,
            Sum::Header => FLAG_HEADER_SUM,
        }
    }
}

/// Offset of the checksum in the header; the checksum covers the bytes before it.
const CHECKSUM_OFFSET: usize = 28;
/// Bytes before the data of an encoded read reply: the frame header and the
/// data's `u32` length ([`Frame::seal_read_reply`]).
pub const READ_REPLY_PREFIX: usize = HEADER_LEN + 4;

/// A frame header whose magic, version, flags and length have been checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The opcode, not yet checked against the known ones.
    pub opcode: u16,
    /// [`FLAG_REPLY`] and [`FLAG_ERROR`].
    pub flags: u16,
    /// Requests: the worker on the receiving server that owns the shard the request
    /// is for (the client's routing result); replies: 0.
    pub worker: u16,
    /// The sending client (for replies, the client being answered).
    pub client: ClientId,
    /// The request this frame is or answers.
    pub request_id: RequestId,
    /// Payload bytes after the header, at most [`MAX_FRAME_PAYLOAD`].
    pub payload_len: u32,
    /// crc32c of the header's first 28 bytes and the payload.
    pub checksum: u32,
}

impl FrameHeader {
    /// Checks the first [`HEADER_LEN`] bytes of `bytes`, so a stream reader knows how
    /// many more bytes the frame needs before it reads them.
    pub fn decode(bytes: &[u8]) -> Result<FrameHeader, WireError> {
        let mut r = Reader::new(bytes);
        let magic = r.u32("frame header")?;
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic, expected: MAGIC });
        }
        let version = r.u16("frame header")?;
        if version != VERSION {
            return Err(WireError::Version { found: version, expected: VERSION });
        }
        let opcode = r.u16("frame header")?;
        let flags = r.u16("frame header")?;
        let kind = flags & (FLAG_REPLY | FLAG_ERROR);
        if flags & !(FLAG_REPLY | FLAG_ERROR | FLAG_HEADER_SUM) != 0 || kind == FLAG_ERROR {
            return Err(WireError::BadValue { what: "frame flags", value: flags.into() });
        }
        let worker = r.u16("frame header")?;
        let client = ClientId(r.u32("frame header")?);
        let request_id = RequestId(r.u64("frame header")?);
        let payload_len = r.u32("frame header")?;
        if payload_len as usize > MAX_FRAME_PAYLOAD {
            return Err(WireError::TooLong {
                what: "frame payload",
                len: payload_len.into(),
                max: MAX_FRAME_PAYLOAD as u64,
            });
        }
        let checksum = r.u32("frame header")?;
        Ok(FrameHeader { opcode, flags, worker, client, request_id, payload_len, checksum })
    }

    /// Header and payload bytes together.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.payload_len as usize
    }
}

/// What a frame carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A request.
    Request(Request),
    /// A successful reply.
    Reply(Reply),
    /// A failed request: its opcode and the error.
    Error {
        /// The opcode of the request that failed.
        op: Opcode,
        /// Why it failed.
        error: FsError,
    },
}

/// One message with its addressing: the unit a transport sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The request this frame is or answers.
    pub request_id: RequestId,
    /// The client that sent the request.
    pub client: ClientId,
    /// The message.
    pub body: Body,
}

impl Frame {
    /// The opcode in this frame's header.
    pub fn opcode(&self) -> Opcode {
        match &self.body {
            Body::Request(req) => req.opcode(),
            Body::Reply(reply) => reply.opcode(),
            Body::Error { op, .. } => *op,
        }
    }

    fn flags(&self) -> u16 {
        match self.body {
            Body::Request(_) => 0,
            Body::Reply(_) => FLAG_REPLY,
            Body::Error { .. } => FLAG_REPLY | FLAG_ERROR,
        }
    }

    /// Appends the encoded frame to `out`. On `Err` (a value over a protocol limit)
    /// `out` is left as it was.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        self.encode_as(out, self.client, self.request_id, 0)
    }

    /// [`encode`](Self::encode) with this addressing instead of the frame's own
    /// (as [`stamp`] would write it afterwards, but with one checksum pass).
    pub fn encode_as(
        &self,
        out: &mut Vec<u8>,
        client: ClientId,
        request_id: RequestId,
        worker: u16,
    ) -> Result<(), WireError> {
        self.encode_summed(out, client, request_id, worker, Sum::Full)
    }

    /// [`encode_as`](Self::encode_as) with a checksum that covers what `sum`
    /// says.
    pub fn encode_summed(
        &self,
        out: &mut Vec<u8>,
        client: ClientId,
        request_id: RequestId,
        worker: u16,
        sum: Sum,
    ) -> Result<(), WireError> {
        let flags = self.flags() | sum.flag();
        let head = Head { op: self.opcode(), flags, worker, client, request_id };
        encode_with(out, head, |w| match &self.body {
            Body::Request(req) => req.put(w),
            Body::Reply(reply) => reply.put(w),
            Body::Error { error, .. } => error.put(w),
        })
    }

    /// Seals a read reply laid out in place: `buf` holds
    /// [`READ_REPLY_PREFIX`] bytes (their values do not matter), then the
    /// data. Writes the header and the data's length into the prefix and the
    /// checksum (covering what `sum` says), giving exactly the bytes
    /// [`encode_summed`](Self::encode_summed) gives for `Reply::Read(data)`
    /// (or `Reply::ReadData`, by `op`), without copying the data. `Err` (and
    /// `buf` untouched) when the data is over `MAX_IO_BYTES` or `op` is neither.
    pub fn seal_read_reply(
        buf: &mut [u8],
        request_id: RequestId,
        client: ClientId,
        op: Opcode,
        sum: Sum,
    ) -> Result<(), WireError> {
        assert!(buf.len() >= READ_REPLY_PREFIX, "a read reply has room for its header");
        let data_len = buf.len() - READ_REPLY_PREFIX;
        Frame::read_reply_prefix(buf, data_len, request_id, client, op, sum)?;
        let crc = frame_checksum(buf);
        buf[CHECKSUM_OFFSET..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// The first `READ_REPLY_PREFIX` bytes of a read reply whose `data_len`
    /// bytes of data are sent from elsewhere after them (in pieces, straight
    /// from the server's buffers), its checksum over the header only
    /// ([`Sum::Header`]: only links through shared memory carry such frames).
    /// The frame is the same as [`seal_read_reply`](Self::seal_read_reply)
    /// makes with `Sum::Header` around the same data.
    pub fn read_reply_header(
        data_len: usize,
        request_id: RequestId,
        client: ClientId,
        op: Opcode,
    ) -> Result<[u8; READ_REPLY_PREFIX], WireError> {
        let mut buf = [0u8; READ_REPLY_PREFIX];
        Frame::read_reply_prefix(&mut buf, data_len, request_id, client, op, Sum::Header)?;
        let crc = crc32c::crc32c(&buf[..CHECKSUM_OFFSET]);
        buf[CHECKSUM_OFFSET..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(buf)
    }

    /// Writes a read reply's header but its checksum, and the data's length,
    /// into the first `READ_REPLY_PREFIX` bytes of `buf`.
    fn read_reply_prefix(
        buf: &mut [u8],
        data_len: usize,
        request_id: RequestId,
        client: ClientId,
        op: Opcode,
        sum: Sum,
    ) -> Result<(), WireError> {
        if !matches!(op, Opcode::Read | Opcode::ReadData) {
            return Err(WireError::BadValue { what: "read reply opcode", value: op as u64 });
        }
        super::cursor::check_len("read data", data_len, super::MAX_IO_BYTES)?;
        let payload_len = READ_REPLY_PREFIX - HEADER_LEN + data_len;
        buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        buf[4..6].copy_from_slice(&VERSION.to_le_bytes());
        buf[6..8].copy_from_slice(&(op as u16).to_le_bytes());
        buf[8..10].copy_from_slice(&(FLAG_REPLY | sum.flag()).to_le_bytes());
        buf[10..12].copy_from_slice(&0u16.to_le_bytes());
        buf[12..16].copy_from_slice(&client.0.to_le_bytes());
        buf[16..24].copy_from_slice(&request_id.0.to_le_bytes());
        buf[24..28].copy_from_slice(&(payload_len as u32).to_le_bytes());
        buf[HEADER_LEN..READ_REPLY_PREFIX].copy_from_slice(&(data_len as u32).to_le_bytes());
        Ok(())
    }

    /// The encoded frame in a new buffer.
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        self.encode(&mut out)?;
        Ok(out)
    }

    /// Decodes exactly one frame from untrusted bytes. Never panics; allocates at
    /// most the payload's size, itself at most [`MAX_FRAME_PAYLOAD`].
    pub fn decode(bytes: &[u8]) -> Result<Frame, WireError> {
        Frame::decode_with(bytes, true)
    }

    /// [`decode`](Self::decode) of a frame whose checksum the transport already
    /// checked when it received it (pfs-net checks every frame before it hands
    /// it over): every other check is made, the second pass over the payload
    /// is not.
    pub fn decode_received(bytes: &[u8]) -> Result<Frame, WireError> {
        Frame::decode_with(bytes, false)
    }

    /// Decodes a received `Write` or `WriteData` request frame (its checksum
    /// checked by the transport, as for [`decode_received`](Self::decode_received))
    /// without copying its data: `None` for any other frame. Every other check
    /// of [`decode`](Self::decode) is made.
    #[allow(clippy::type_complexity)]
    pub fn decode_write(
        bytes: &[u8],
    ) -> Option<Result<(RequestId, ClientId, WriteRef<'_>), WireError>> {
        let (header, payload) = match whole(bytes) {
            Ok(hp) => hp,
            Err(e) => return Some(Err(e)),
        };
        if header.flags & FLAG_REPLY != 0 {
            return None;
        }
        let op = Opcode::from_u16(header.opcode)?;
        let mut r = Reader::new(payload);
        let w = match WriteRef::get(op, &mut r)? {
            Ok(w) => w,
            Err(e) => return Some(Err(e)),
        };
        Some(r.finish("payload").map(|()| (header.request_id, header.client, w)))
    }

    fn decode_with(bytes: &[u8], verify: bool) -> Result<Frame, WireError> {
        let (header, payload) = whole(bytes)?;
        if verify {
            let computed = frame_checksum(bytes);
            if computed != header.checksum {
                return Err(WireError::Checksum { stored: header.checksum, computed });
            }
        }
        let op = Opcode::from_u16(header.opcode).ok_or(WireError::UnknownOpcode(header.opcode))?;
        let mut r = Reader::new(payload);
        let body = if header.flags & FLAG_ERROR != 0 {
            Body::Error { op, error: FsError::get(&mut r)? }
        } else if header.flags & FLAG_REPLY != 0 {
            Body::Reply(Reply::get(op, &mut r)?)
        } else {
            Body::Request(Request::get(op, &mut r)?)
        };
        r.finish("payload")?;
        Ok(Frame { request_id: header.request_id, client: header.client, body })
    }
}

/// The header and payload of exactly one frame: its header checks out and
/// `bytes` is as long as the header says.
fn whole(bytes: &[u8]) -> Result<(FrameHeader, &[u8]), WireError> {
    let header = FrameHeader::decode(bytes)?;
    let need = header.frame_len();
    if bytes.len() < need {
        return Err(WireError::Truncated { what: "frame", need, have: bytes.len() });
    }
    if bytes.len() > need {
        return Err(WireError::TrailingBytes { what: "frame", count: bytes.len() - need });
    }
    Ok((header, &bytes[HEADER_LEN..]))
}

/// The header fields of a frame being encoded.
struct Head {
    op: Opcode,
    flags: u16,
    worker: u16,
    client: ClientId,
    request_id: RequestId,
}

/// Appends a frame with header `head` and the payload `put` writes, with its
/// length and checksum; on `Err`, `out` is left as it was.
fn encode_with(
    out: &mut Vec<u8>,
    head: Head,
    put: impl FnOnce(&mut Writer<'_>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    let start = out.len();
    let result = (|| {
        let mut w = Writer::new(out);
        w.u32(MAGIC);
        w.u16(VERSION);
        w.u16(head.op as u16);
        w.u16(head.flags);
        w.u16(head.worker);
        w.u32(head.client.0);
        w.u64(head.request_id.0);
        w.u32(0); // payload length, patched below
        w.u32(0); // checksum, patched below
        put(&mut w)?;
        let payload_len = out.len() - start - HEADER_LEN;
        super::cursor::check_len("frame payload", payload_len, MAX_FRAME_PAYLOAD)?;
        let frame = &mut out[start..];
        frame[24..28].copy_from_slice(&(payload_len as u32).to_le_bytes());
        let crc = frame_checksum(frame);
        frame[CHECKSUM_OFFSET..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    })();
    if result.is_err() {
        out.truncate(start);
    }
    result
}

impl WriteRef<'_> {
    /// Appends this write as a request frame of `client`, numbered
    /// `request_id`, for processing worker `worker`: the bytes
    /// [`Frame::encode_as`] gives for the owned request, copying the data
    /// once, from where it is.
    pub fn encode_as(
        &self,
        out: &mut Vec<u8>,
        client: ClientId,
        request_id: RequestId,
        worker: u16,
    ) -> Result<(), WireError> {
        self.encode_summed(out, client, request_id, worker, Sum::Full)
    }

    /// [`encode_as`](Self::encode_as) with a checksum that covers what `sum`
    /// says.
    pub fn encode_summed(
        &self,
        out: &mut Vec<u8>,
        client: ClientId,
        request_id: RequestId,
        worker: u16,
        sum: Sum,
    ) -> Result<(), WireError> {
        let head = Head { op: self.opcode(), flags: sum.flag(), worker, client, request_id };
        encode_with(out, head, |w| self.put(w))
    }
}

/// Writes the addressing of an encoded request (client, request id, target worker)
/// into its header and re-seals the checksum, so a frame is encoded once and
/// addressed by whoever sends it.
pub fn stamp(frame: &mut [u8], client: ClientId, request_id: RequestId, worker: u16) {
    assert!(frame.len() >= HEADER_LEN, "stamp needs a whole header");
    frame[10..12].copy_from_slice(&worker.to_le_bytes());
    frame[12..16].copy_from_slice(&client.0.to_le_bytes());
    frame[16..24].copy_from_slice(&request_id.0.to_le_bytes());
    let crc = frame_checksum(frame);
    frame[CHECKSUM_OFFSET..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
}

/// The checksum of an encoded frame (a whole header, then the payload): crc32c
/// of the header before the checksum, then the payload, unless the header's
/// flags say [`FLAG_HEADER_SUM`]: then of the header alone.
pub fn frame_checksum(frame: &[u8]) -> u32 {
    assert!(frame.len() >= HEADER_LEN, "a frame has a whole header");
    let head = crc32c::crc32c(&frame[..CHECKSUM_OFFSET]);
    let flags = u16::from_le_bytes([frame[8], frame[9]]);
    if flags & FLAG_HEADER_SUM != 0 {
        head
    } else {
        crc32c::crc32c_append(head, &frame[HEADER_LEN..])
    }
}
