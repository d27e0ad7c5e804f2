//! Little-endian field reader and writer with bounds and limit checks.
//!
//! The reader never indexes past its slice and never allocates: byte strings come
//! back as sub-slices, and their length is checked against the field's limit and the
//! bytes left before a caller copies them.

use super::WireError;

/// Reads fields from an untrusted byte slice.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    /// Bytes not yet read.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        if n > self.buf.len() {
            return Err(WireError::Truncated { what, need: n, have: self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let bytes = self.take(what, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// A `u8`.
    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    /// A little-endian `u16`.
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    /// A little-endian `u32`.
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian `i32`.
    pub(crate) fn i32(&mut self, what: &'static str) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    /// A little-endian `u64`.
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A little-endian `i64`.
    pub(crate) fn i64(&mut self, what: &'static str) -> Result<i64, WireError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// A boolean byte, 0 or 1.
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, WireError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(WireError::BadValue { what, value: v.into() }),
        }
    }

    /// Bytes with a `u16` length prefix of at most `max`.
    pub(crate) fn bytes16(
        &mut self,
        what: &'static str,
        max: usize,
    ) -> Result<&'a [u8], WireError> {
        let len = self.u16(what)?;
        self.sized(what, len.into(), max)
    }

    /// Bytes with a `u32` length prefix of at most `max`.
    pub(crate) fn bytes32(
        &mut self,
        what: &'static str,
        max: usize,
    ) -> Result<&'a [u8], WireError> {
        let len = self.u32(what)?;
        self.sized(what, len.into(), max)
    }

    fn sized(&mut self, what: &'static str, len: u64, max: usize) -> Result<&'a [u8], WireError> {
        if len > max as u64 {
            return Err(WireError::TooLong { what, len, max: max as u64 });
        }
        self.take(what, len as usize)
    }

    /// A `u32` element count, checked so that `count` elements of at least
    /// `min_size_bytes` each fit in the bytes left; a `Vec` of that capacity is
    /// then bounded by the frame.
    pub(crate) fn count(
        &mut self,
        what: &'static str,
        min_size_bytes: usize,
    ) -> Result<usize, WireError> {
        assert!(min_size_bytes > 0, "an element takes at least one byte");
        let count = self.u32(what)?;
        let fit = self.remaining() / min_size_bytes;
        if count as u64 > fit as u64 {
            return Err(WireError::Truncated {
                what,
                need: (count as usize).saturating_mul(min_size_bytes),
                have: self.remaining(),
            });
        }
        Ok(count as usize)
    }

    /// Fails unless every byte was read.
    pub(crate) fn finish(self, what: &'static str) -> Result<(), WireError> {
        match self.buf.len() {
            0 => Ok(()),
            count => Err(WireError::TrailingBytes { what, count }),
        }
    }
}

/// Appends fields to a buffer.
#[derive(Debug)]
pub(crate) struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    /// A writer appending to `out`.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Writer<'a> {
        Writer { out }
    }

    /// Bytes in the buffer (including any before this writer started).
    pub(crate) fn len(&self) -> usize {
        self.out.len()
    }

    /// Raw bytes, no prefix.
    pub(crate) fn raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// A `u8`.
    pub(crate) fn u8(&mut self, v: u8) {
        self.out.push(v);
    }

    /// A little-endian `u16`.
    pub(crate) fn u16(&mut self, v: u16) {
        self.raw(&v.to_le_bytes());
    }

    /// A little-endian `u32`.
    pub(crate) fn u32(&mut self, v: u32) {
        self.raw(&v.to_le_bytes());
    }

    /// A little-endian `i32`.
    pub(crate) fn i32(&mut self, v: i32) {
        self.raw(&v.to_le_bytes());
    }

    /// A little-endian `u64`.
    pub(crate) fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }

    /// A little-endian `i64`.
    pub(crate) fn i64(&mut self, v: i64) {
        self.raw(&v.to_le_bytes());
    }

    /// A boolean byte.
    pub(crate) fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }

    /// Bytes with a `u16` length prefix, refused above `max` (the decoder's limit).
    pub(crate) fn bytes16(
        &mut self,
        what: &'static str,
        bytes: &[u8],
        max: usize,
    ) -> Result<(), WireError> {
        assert!(max <= u16::MAX as usize, "limit of {what} does not fit a u16 prefix");
        check_len(what, bytes.len(), max)?;
        self.u16(bytes.len() as u16);
        self.raw(bytes);
        Ok(())
    }

    /// Bytes with a `u32` length prefix, refused above `max` (the decoder's limit).
    pub(crate) fn bytes32(
        &mut self,
        what: &'static str,
        bytes: &[u8],
        max: usize,
    ) -> Result<(), WireError> {
        assert!(max <= u32::MAX as usize, "limit of {what} does not fit a u32 prefix");
        check_len(what, bytes.len(), max)?;
        self.u32(bytes.len() as u32);
        self.raw(bytes);
        Ok(())
    }

    /// A `u32` element count.
    pub(crate) fn count(&mut self, what: &'static str, count: usize) -> Result<(), WireError> {
        check_len(what, count, u32::MAX as usize)?;
        self.u32(count as u32);
        Ok(())
    }
}

/// Refuses a length above `max`.
pub(crate) fn check_len(what: &'static str, len: usize, max: usize) -> Result<(), WireError> {
    if len > max {
        return Err(WireError::TooLong { what, len: len as u64, max: max as u64 });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_refuses_short_and_over_limit_fields() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16("a").unwrap(), 0x0201);
        let err = r.u32("b").unwrap_err();
        assert_eq!(err.to_string(), "truncated b: need 4 bytes, have 1");

        let mut r = Reader::new(&[0xff, 0xff, 0, 0]);
        let err = r.bytes32("name", 255).unwrap_err();
        assert_eq!(err.to_string(), "name length 65535 is over the limit 255");

        let mut r = Reader::new(&[0xff, 0xff, 0xff, 0x7f, 0]);
        assert!(matches!(r.count("entries", 20), Err(WireError::Truncated { .. })));

        let mut r = Reader::new(&[2]);
        assert_eq!(r.bool("flag").unwrap_err().to_string(), "invalid flag: 0x2");
        assert_eq!(
            Reader::new(&[0, 0]).finish("payload").unwrap_err().to_string(),
            "2 trailing bytes after payload"
        );
    }

    #[test]
    fn writer_refuses_what_the_reader_would() {
        let mut out = Vec::new();
        let mut w = Writer::new(&mut out);
        assert!(w.bytes16("name", &[0; 256], 255).is_err());
        w.bytes16("name", b"abc", 255).unwrap();
        assert_eq!(out, [3, 0, b'a', b'b', b'c']);
    }
}
