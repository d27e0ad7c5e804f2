//! Why a frame could not be encoded or decoded.

/// A frame that breaks the protocol; the text says what was wrong and where.
///
/// Every variant is bad input from a peer (or a caller passing an over-long value to
/// an encoder), never a bug: the connection that sent it is closed with this reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame does not start with [`MAGIC`](super::MAGIC).
    #[error("bad magic 0x{found:08x}, expected 0x{expected:08x}")]
    BadMagic {
        /// The first four bytes, little-endian.
        found: u32,
        /// The magic of this protocol.
        expected: u32,
    },
    /// The peer speaks another protocol version.
    #[error("protocol version {found}, expected {expected}")]
    Version {
        /// The version in the frame.
        found: u16,
        /// The version this build speaks.
        expected: u16,
    },
    /// The crc32c over header and payload does not match the one in the header.
    #[error("checksum mismatch: header says 0x{stored:08x}, frame hashes to 0x{computed:08x}")]
    Checksum {
        /// The checksum in the header.
        stored: u32,
        /// The checksum of the bytes received.
        computed: u32,
    },
    /// Fewer bytes than a field or the frame needs.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        /// The field or part being read.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// A length (or count) field above its limit.
    #[error("{what} length {len} is over the limit {max}")]
    TooLong {
        /// The field whose length is too large.
        what: &'static str,
        /// The length found.
        len: u64,
        /// The largest length allowed.
        max: u64,
    },
    /// An opcode this version does not know.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// A field holds a value outside its domain (an enum byte, flag bits, ...).
    #[error("invalid {what}: {value:#x}")]
    BadValue {
        /// The field.
        what: &'static str,
        /// The value found.
        value: u64,
    },
    /// Bytes left over after a complete frame or payload.
    #[error("{count} trailing bytes after {what}")]
    TrailingBytes {
        /// What was complete.
        what: &'static str,
        /// How many bytes followed it.
        count: usize,
    },
}
