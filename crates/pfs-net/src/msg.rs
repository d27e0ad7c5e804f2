//! What travels on a link: pfs-core frames and transport messages, and the
//! receive buffer that cuts a byte stream into them.
//!
//! Both kinds start with a 32-byte header whose first four bytes say which it is
//! (`"PFSW"` for a pfs-core frame, `"PFSN"` for a transport message) and whose bytes
//! 28..32 hold the crc32c of bytes 0..28 and the payload. Layout: `docs/format.md`,
//! "Transport and handshake".

use pfs_core::wire::{
    frame_checksum, FrameHeader, FLAG_HEADER_SUM, HEADER_LEN, MAGIC, MAX_FRAME_PAYLOAD,
};

/// First four bytes of a transport message: `"PFSN"`.
pub const NET_MAGIC: u32 = u32::from_le_bytes(*b"PFSN");
/// Version of the transport messages and handshake.
pub const NET_VERSION: u16 = 1;
/// Bytes in a transport message header (the same as a frame header).
pub const MSG_HEADER_LEN: usize = HEADER_LEN;
/// Largest message on a link: a header and the largest frame payload.
pub const MAX_MSG_BYTES: usize = HEADER_LEN + MAX_FRAME_PAYLOAD;
/// Offset of the checksum in both headers.
pub(crate) const CHECKSUM_OFFSET: usize = 28;
/// Receive buffers start this large and grow up to [`MAX_MSG_BYTES`] when a larger
/// message arrives, so idle connections stay small.
const RX_INITIAL_BYTES: usize = 64 << 10;

/// The kind of a transport message (byte 6 of its header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client to server: a nonce and the features wanted.
    Hello = 1,
    /// Server to client: its nonce, its proof, its features.
    Challenge = 2,
    /// Client to server: the client's proof.
    Proof = 3,
    /// Server to client: the connection is accepted; credits and features.
    Accept = 4,
    /// Either way: the connection is refused; the payload says why.
    Refuse = 5,
    /// Client to server over the unix socket: attach the shared-memory rings.
    ShmAttach = 6,
    /// Either way after an Accept with RDMA: the sender's queue pair address and sizes.
    RdmaInfo = 7,
    /// Client to server: its RDMA queue pair is ready to receive.
    RdmaReady = 8,
    /// One-sided write: the payload goes into the peer's region.
    Write = 16,
    /// The write with this token was applied.
    WriteAck = 17,
    /// One-sided read: send back `u32` payload bytes of the region.
    ReadReq = 18,
    /// The bytes of the read with this token.
    ReadResp = 19,
    /// Over RDMA: the sender registered `region`; the payload says where and its key.
    RdmaRegion = 20,
    /// One-sided write with immediate: a 4-byte immediate, then the bytes for the
    /// peer's region; acknowledged by `WriteAck`.
    WriteImm = 21,
    /// Over tcp and shm: the sender registered `region`; the payload is its length
    /// (u64).
    Region = 22,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Challenge,
            3 => Kind::Proof,
            4 => Kind::Accept,
            5 => Kind::Refuse,
            6 => Kind::ShmAttach,
            7 => Kind::RdmaInfo,
            8 => Kind::RdmaReady,
            16 => Kind::Write,
            17 => Kind::WriteAck,
            18 => Kind::ReadReq,
            19 => Kind::ReadResp,
            20 => Kind::RdmaRegion,
            21 => Kind::WriteImm,
            22 => Kind::Region,
            _ => return None,
        })
    }
}

/// A checked transport message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetHeader {
    /// What the message is.
    pub kind: Kind,
    /// Region id (one-sided operations), else 0.
    pub region: u32,
    /// Payload bytes after the header.
    pub len: u32,
    /// Byte offset in the region (one-sided operations), else 0.
    pub offset: u64,
    /// The sender's tag, echoed in the answer (one-sided operations), else 0.
    pub token: u32,
}

impl NetHeader {
    /// Appends this header and `payload`, with the checksum, to `out`.
    pub fn encode(&self, payload: &[u8], out: &mut Vec<u8>) {
        self.encode_parts(&[payload], out);
    }

    /// [`encode`](Self::encode) with the payload in pieces, laid end to end.
    pub fn encode_parts(&self, parts: &[&[u8]], out: &mut Vec<u8>) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert_eq!(self.len as usize, len, "header length matches payload");
        assert!(len <= MAX_FRAME_PAYLOAD, "transport message over the limit");
        let start = out.len();
        out.extend_from_slice(&NET_MAGIC.to_le_bytes());
        out.extend_from_slice(&NET_VERSION.to_le_bytes());
        out.push(self.kind as u8);
        out.push(0);
        out.extend_from_slice(&self.region.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.token.to_le_bytes());
        let crc =
            parts.iter().fold(crc32c::crc32c(&out[start..start + CHECKSUM_OFFSET]), |c, p| {
                crc32c::crc32c_append(c, p)
            });
        out.extend_from_slice(&crc.to_le_bytes());
        out.reserve(len);
        for p in parts {
            out.extend_from_slice(p);
        }
    }

    /// Checks the first [`MSG_HEADER_LEN`] bytes of a transport message.
    pub fn decode(h: &[u8]) -> Result<NetHeader, String> {
        assert!(h.len() >= MSG_HEADER_LEN, "caller passes a whole header");
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let magic = u32_at(0);
        if magic != NET_MAGIC {
            return Err(format!("bad magic 0x{magic:08x}, expected 0x{NET_MAGIC:08x}"));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != NET_VERSION {
            return Err(format!("transport version {version}, expected {NET_VERSION}"));
        }
        let kind = Kind::from_u8(h[6]).ok_or_else(|| format!("unknown message kind {}", h[6]))?;
        if h[7] != 0 {
            return Err(format!("reserved header byte is {}, expected 0", h[7]));
        }
        let len = u32_at(12);
        if len as usize > MAX_FRAME_PAYLOAD {
            return Err(format!(
                "message payload length {len} is over the limit {MAX_FRAME_PAYLOAD}"
            ));
        }
        let offset = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
        Ok(NetHeader { kind, region: u32_at(8), len, offset, token: u32_at(24) })
    }
}

/// The checksum of both header kinds: crc32c of header bytes 0..28, then the payload.
/// For frames this is the same sum pfs-core writes.
pub fn checksum(head: &[u8], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(head), payload)
}

/// Checks the checksum of a received transport message (header and payload).
fn check_sum(msg: &[u8]) -> Result<(), String> {
    match_sum(msg, "message", checksum(&msg[..CHECKSUM_OFFSET], &msg[HEADER_LEN..]))
}

/// Checks the checksum of a received frame: over its header and payload, or,
/// when its flags say so and `header_sums` allows it (a shared-memory link),
/// over its header only.
pub(crate) fn check_frame_sum(frame: &[u8], header_sums: bool) -> Result<(), String> {
    let flags = u16::from_le_bytes([frame[8], frame[9]]);
    if flags & FLAG_HEADER_SUM != 0 && !header_sums {
        return Err("a frame whose checksum covers only its header (shared memory only) \
                    arrived over another link"
            .into());
    }
    match_sum(frame, "frame", frame_checksum(frame))
}

/// Whether the checksum stored in `msg`'s header is `computed`.
fn match_sum(msg: &[u8], what: &str, computed: u32) -> Result<(), String> {
    let stored = u32::from_le_bytes(msg[CHECKSUM_OFFSET..HEADER_LEN].try_into().expect("4"));
    if stored != computed {
        return Err(format!(
            "checksum mismatch: header says 0x{stored:08x}, {what} of {} bytes hashes to \
             0x{computed:08x}",
            msg.len()
        ));
    }
    Ok(())
}

/// What a whole message received as one unit (an RDMA receive) turned out to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datagram {
    /// A pfs-core frame whose header, length and checksum are good.
    Frame,
    /// A transport message; its payload follows the header.
    Net(NetHeader),
}

/// Checks a message that arrived whole: a known magic, a good header, a length that
/// is exactly the bytes received, and the checksum (over the header only for a
/// frame that says so, when `header_sums`: it came through shared memory).
pub fn check_datagram(msg: &[u8], header_sums: bool) -> Result<Datagram, String> {
    if msg.len() < MSG_HEADER_LEN {
        return Err(format!("message of {} bytes is shorter than a header", msg.len()));
    }
    let magic = u32::from_le_bytes(msg[..4].try_into().expect("4 bytes"));
    let (total, kind) = if magic == MAGIC {
        let h = FrameHeader::decode(msg).map_err(|e| format!("frame header: {e}"))?;
        (h.frame_len(), Datagram::Frame)
    } else if magic == NET_MAGIC {
        let h = NetHeader::decode(msg)?;
        (MSG_HEADER_LEN + h.len as usize, Datagram::Net(h))
    } else {
        return Err(format!(
            "bad magic 0x{magic:08x}: neither a frame (0x{MAGIC:08x}) nor a transport \
             message (0x{NET_MAGIC:08x})"
        ));
    };
    if total != msg.len() {
        return Err(format!("header says {total} bytes, {} arrived", msg.len()));
    }
    match kind {
        Datagram::Frame => check_frame_sum(msg, header_sums)?,
        Datagram::Net(_) => check_sum(msg)?,
    }
    Ok(kind)
}

/// One complete message found in the receive buffer, as a range of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A pfs-core frame, header included: `start..end` of the buffer.
    Frame {
        /// First byte.
        start: usize,
        /// One past the last byte.
        end: usize,
    },
    /// A transport message; its payload is `start..end` of the buffer.
    Net {
        /// The header.
        header: NetHeader,
        /// First payload byte.
        start: usize,
        /// One past the last payload byte.
        end: usize,
    },
}

/// Cuts a byte stream into messages; bounded by [`MAX_MSG_BYTES`].
#[derive(Debug)]
pub struct RxBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes the message at `start` needs, once its header has been checked.
    need: usize,
    max_bytes: usize,
    /// Frames summed over their header only are accepted (a shared-memory link).
    header_sums: bool,
}

impl RxBuf {
    /// An empty buffer that accepts messages of at most `max_bytes`.
    pub fn new(max_bytes: usize) -> RxBuf {
        assert!((MSG_HEADER_LEN..=MAX_MSG_BYTES).contains(&max_bytes));
        RxBuf {
            buf: vec![0; RX_INITIAL_BYTES.min(max_bytes)],
            start: 0,
            end: 0,
            need: 0,
            max_bytes,
            header_sums: false,
        }
    }

    /// Accepts frames whose checksum covers their header only
    /// ([`FLAG_HEADER_SUM`]): for a shared-memory link, whose bytes never leave
    /// this host's memory. Any other link refuses them.
    pub fn allow_header_sums(&mut self) {
        self.header_sums = true;
    }

    /// The largest message it accepts.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Bytes received but not yet returned as messages.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Whether the next buffered message (if its first bytes are here) is a pfs-core
    /// frame rather than a transport message.
    pub fn front_is_frame(&self) -> bool {
        self.end - self.start >= 4 && self.buf[self.start..self.start + 4] == MAGIC.to_le_bytes()
    }

    /// Room to read into, after making some if the buffer is full; never empty unless
    /// a whole message is waiting to be taken.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let want = self.need.max(MSG_HEADER_LEN);
        if self.end == self.buf.len() || self.start + want > self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if want > self.buf.len() {
            // A larger message than seen before: grow once, up to the checked limit.
            assert!(want <= self.max_bytes, "need was checked against the limit");
            self.buf.resize(want.next_power_of_two().min(self.max_bytes), 0);
        }
        &mut self.buf[self.end..]
    }

    /// Records `n` bytes read into [`spare`](Self::spare).
    pub fn filled(&mut self, n: usize) {
        assert!(self.end + n <= self.buf.len());
        self.end += n;
    }

    /// The next complete message, `None` if more bytes are needed, or why the bytes
    /// break the protocol (the connection must then be closed).
    pub fn next_message(&mut self) -> Result<Option<Incoming>, String> {
        let have = self.end - self.start;
        if have < MSG_HEADER_LEN {
            return Ok(None);
        }
        let s = self.start;
        let head = &self.buf[s..s + MSG_HEADER_LEN];
        let magic = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let (total, net) = if magic == MAGIC {
            let h = FrameHeader::decode(head).map_err(|e| format!("frame header: {e}"))?;
            (h.frame_len(), None)
        } else if magic == NET_MAGIC {
            let h = NetHeader::decode(head)?;
            (MSG_HEADER_LEN + h.len as usize, Some(h))
        } else {
            return Err(format!(
                "bad magic 0x{magic:08x}: neither a frame (0x{MAGIC:08x}) nor a transport \
                 message (0x{NET_MAGIC:08x})"
            ));
        };
        if total > self.max_bytes {
            return Err(format!("message of {total} bytes is over the limit {}", self.max_bytes));
        }
        if have < total {
            self.need = total;
            return Ok(None);
        }
        self.need = 0;
        let msg = &self.buf[s..s + total];
        match net {
            None => check_frame_sum(msg, self.header_sums)?,
            Some(_) => check_sum(msg)?,
        }
        self.start += total;
        Ok(Some(match net {
            None => Incoming::Frame { start: s, end: s + total },
            Some(header) => Incoming::Net { header, start: s + HEADER_LEN, end: s + total },
        }))
    }

    /// Bytes of a message returned by [`next_message`](Self::next_message), valid until the next fill.
    pub fn bytes(&self, start: usize, end: usize) -> &[u8] {
        &self.buf[start..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::Sum;

    #[test]
    fn cuts_a_stream_in_any_split() {
        let mut stream = Vec::new();
        let h = NetHeader { kind: Kind::Write, region: 3, len: 5, offset: 9, token: 7 };
        h.encode(b"hello", &mut stream);
        let frame = pfs_core::Frame {
            request_id: pfs_core::RequestId(4),
            client: pfs_core::ClientId(1),
            body: pfs_core::Body::Request(pfs_core::Request::StatFs),
        };
        frame.encode(&mut stream).unwrap();
        for chunk in 1..stream.len() {
            let mut rx = RxBuf::new(MAX_MSG_BYTES);
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                let spare = rx.spare();
                spare[..piece.len()].copy_from_slice(piece);
                rx.filled(piece.len());
                while let Some(m) = rx.next_message().unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(got.len(), 2, "chunk {chunk}");
            assert!(matches!(got[0], Incoming::Net { header, .. } if header == h));
            assert!(matches!(got[1], Incoming::Frame { start, end } if end - start == 32));
        }
    }

    #[test]
    fn refuses_bad_magic_checksum_and_length() {
        let mut rx = RxBuf::new(MAX_MSG_BYTES);
        rx.spare()[..32].copy_from_slice(&[0xab; 32]);
        rx.filled(32);
        assert!(rx.next_message().unwrap_err().starts_with("bad magic 0xabababab"));

        let mut msg = Vec::new();
        NetHeader { kind: Kind::Refuse, region: 0, len: 2, offset: 0, token: 0 }
            .encode(b"no", &mut msg);
        msg[33] ^= 1;
        let mut rx = RxBuf::new(MAX_MSG_BYTES);
        rx.spare()[..msg.len()].copy_from_slice(&msg);
        rx.filled(msg.len());
        assert!(rx.next_message().unwrap_err().starts_with("checksum mismatch"));

        msg[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut rx = RxBuf::new(MAX_MSG_BYTES);
        rx.spare()[..msg.len()].copy_from_slice(&msg);
        rx.filled(msg.len());
        assert!(rx.next_message().unwrap_err().contains("over the limit"));
    }

    #[test]
    fn whole_messages_are_checked_exactly() {
        let mut net = Vec::new();
        let h = NetHeader { kind: Kind::RdmaRegion, region: 3, len: 4, offset: 0, token: 0 };
        h.encode(b"abcd", &mut net);
        assert_eq!(check_datagram(&net, false), Ok(Datagram::Net(h)));
        let mut frame = Vec::new();
        pfs_core::Frame {
            request_id: pfs_core::RequestId(4),
            client: pfs_core::ClientId(1),
            body: pfs_core::Body::Request(pfs_core::Request::StatFs),
        }
        .encode(&mut frame)
        .unwrap();
        assert_eq!(check_datagram(&frame, false), Ok(Datagram::Frame));

        assert!(check_datagram(&frame[..31], false).unwrap_err().contains("shorter than a header"));
        let mut long = net.clone();
        long.push(0);
        assert!(check_datagram(&long, false)
            .unwrap_err()
            .contains("header says 36 bytes, 37 arrived"));
        let mut bad = net.clone();
        bad[35] ^= 0x40;
        assert!(check_datagram(&bad, false).unwrap_err().starts_with("checksum mismatch"));
        assert!(check_datagram(&[0xab; 40], false).unwrap_err().starts_with("bad magic"));
    }

    /// A frame summed over its header only (`FLAG_HEADER_SUM`) is taken only
    /// where the link allows it (shared memory), and its header is still
    /// checked there; a frame summed in full is taken everywhere.
    #[test]
    fn header_sums_are_taken_only_from_shared_memory() {
        let frame = pfs_core::Frame {
            request_id: pfs_core::RequestId(4),
            client: pfs_core::ClientId(1),
            body: pfs_core::Body::Reply(pfs_core::Reply::Read(vec![9; 70_000])),
        };
        let encode = |sum| {
            let mut b = Vec::new();
            frame.encode_summed(&mut b, frame.client, frame.request_id, 0, sum).unwrap();
            b
        };
        let (full, head) = (encode(Sum::Full), encode(Sum::Header));
        let receive = |msg: &[u8], allow: bool| {
            let mut rx = RxBuf::new(MAX_MSG_BYTES);
            if allow {
                rx.allow_header_sums();
            }
            let mut at = 0;
            while at < msg.len() {
                let spare = rx.spare();
                let n = spare.len().min(msg.len() - at);
                spare[..n].copy_from_slice(&msg[at..at + n]);
                rx.filled(n);
                at += n;
                if let Some(m) = rx.next_message()? {
                    assert!(matches!(m, Incoming::Frame { .. }));
                }
            }
            Ok::<(), String>(())
        };
        for allow in [false, true] {
            receive(&full, allow).unwrap();
            assert_eq!(check_datagram(&full, allow), Ok(Datagram::Frame));
        }
        receive(&head, true).unwrap();
        assert_eq!(check_datagram(&head, true), Ok(Datagram::Frame));
        let refused = receive(&head, false).unwrap_err();
        assert!(refused.contains("only its header"), "{refused}");
        assert!(check_datagram(&head, false).unwrap_err().contains("only its header"));
        let mut bad = head.clone();
        bad[17] ^= 1;
        assert!(receive(&bad, true).unwrap_err().starts_with("checksum mismatch"));
        // The full sum still covers the payload.
        let mut bad = full;
        *bad.last_mut().unwrap() ^= 1;
        assert!(receive(&bad, true).unwrap_err().starts_with("checksum mismatch"));
    }

    proptest::proptest! {
        #[test]
        fn whole_message_check_never_panics(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
            net in proptest::prelude::any::<bool>(),
        ) {
            let mut m = bytes;
            if m.len() >= 4 {
                // Half the cases get a valid magic, so the header checks run too.
                let magic = if net { NET_MAGIC } else { MAGIC };
                m[..4].copy_from_slice(&magic.to_le_bytes());
            }
            let _ = check_datagram(&m, false);
        }
    }
}
