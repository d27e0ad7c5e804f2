//! The deterministic content every phase writes and checks: a byte at offset `o`
//! of the file keyed `(rank, file)` is a pure function of the three, so a reader
//! in another process knows what it must find without being told.

use std::fmt;

/// The content of one file: whose it is and which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatternKey {
    /// The rank the content belongs to (the directory's or file's owner).
    pub rank: u32,
    /// The file's number within that rank's set (0 for a rank's only file).
    pub file: u64,
}

impl PatternKey {
    /// The key of `rank`'s file number `file`.
    pub fn new(rank: u32, file: u64) -> PatternKey {
        PatternKey { rank, file }
    }

    /// A 64-bit seed that differs for every (rank, file).
    fn seed(self) -> u64 {
        splitmix64(((self.rank as u64) << 44) ^ self.file ^ 0x7066_735f_6265_6e63)
    }
}

/// The first wrong byte of a checked range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Offset in the file.
    pub offset: u64,
    /// The byte the pattern has there.
    pub expected: u8,
    /// The byte found.
    pub found: u8,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "wrong content at offset {}: expected byte {:#04x}, found {:#04x}",
            self.offset, self.expected, self.found
        )
    }
}

/// SplitMix64's finaliser: a bijection that scatters nearby inputs.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The 8-byte word at word index `w` (offset `8 * w`): one multiply, so filling
/// and checking run near memory speed and do not distort the rates measured.
#[inline]
fn word(seed: u64, w: u64) -> [u8; 8] {
    ((w ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (seed >> 17)).to_le_bytes()
}

/// Fills `buf` with the content of `key` at file offset `offset`.
pub fn fill(buf: &mut [u8], key: PatternKey, offset: u64) {
    let seed = key.seed();
    let mut pos = 0usize;
    // A head up to the next word boundary.
    let head = ((8 - offset % 8) % 8) as usize;
    if head > 0 {
        let w = word(seed, offset / 8);
        let n = head.min(buf.len());
        let start = (offset % 8) as usize;
        buf[..n].copy_from_slice(&w[start..start + n]);
        pos = n;
    }
    let mut chunks = buf[pos..].chunks_exact_mut(8);
    let mut w_index = (offset + pos as u64) / 8;
    for c in &mut chunks {
        c.copy_from_slice(&word(seed, w_index));
        w_index += 1;
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let n = tail.len();
        tail.copy_from_slice(&word(seed, w_index)[..n]);
    }
}

/// Checks that `buf` holds the content of `key` at file offset `offset`; the
/// first wrong byte otherwise. Whole words are compared as integers (a slice
/// comparison per word is a `memcmp` call per 8 bytes: it made the checks of
/// `io-easy` reads cost more CPU than the reads, docs/benchmarks.md); the
/// ends, and a word that differs, byte by byte.
pub fn check(buf: &[u8], key: PatternKey, offset: u64) -> Result<(), Mismatch> {
    let seed = key.seed();
    let head = (((8 - offset % 8) % 8) as usize).min(buf.len());
    check_bytes(&buf[..head], seed, offset)?;
    let mut w_index = (offset + head as u64) / 8;
    // Eight words at a time, their differences or-ed together: no branch per
    // word, so the compiler interleaves the multiplies (a branch per word made
    // the check a tenth of the CPU of a native read, docs/benchmarks.md).
    let mut blocks = buf[head..].chunks_exact(64);
    for b in &mut blocks {
        let mut diff = 0u64;
        for (i, c) in b.chunks_exact(8).enumerate() {
            let found = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            diff |= found ^ u64::from_le_bytes(word(seed, w_index + i as u64));
        }
        if diff != 0 {
            return check_bytes(b, seed, w_index * 8);
        }
        w_index += 8;
    }
    let mut chunks = blocks.remainder().chunks_exact(8);
    for c in &mut chunks {
        let found = u64::from_le_bytes(c.try_into().expect("8 bytes"));
        if found != u64::from_le_bytes(word(seed, w_index)) {
            return check_bytes(c, seed, w_index * 8);
        }
        w_index += 1;
    }
    check_bytes(chunks.remainder(), seed, w_index * 8)
}

/// [`check`] byte by byte, for `buf` at file offset `offset`.
fn check_bytes(buf: &[u8], seed: u64, offset: u64) -> Result<(), Mismatch> {
    for (i, &found) in buf.iter().enumerate() {
        let abs = offset + i as u64;
        let expected = word(seed, abs / 8)[(abs % 8) as usize];
        if found != expected {
            return Err(Mismatch { offset: abs, expected, found });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_check_at_any_offset_and_length() {
        let key = PatternKey::new(3, 17);
        for offset in [0u64, 1, 7, 8, 9, 3901, 47008 * 3 + 5] {
            for len in [0usize, 1, 5, 8, 13, 3901, 4096] {
                let mut buf = vec![0u8; len];
                fill(&mut buf, key, offset);
                assert_eq!(check(&buf, key, offset), Ok(()), "offset {offset} len {len}");
            }
        }
    }

    #[test]
    fn pieces_agree_with_the_whole() {
        let key = PatternKey::new(1, 2);
        let mut whole = vec![0u8; 1000];
        fill(&mut whole, key, 0);
        let mut piece = vec![0u8; 333];
        fill(&mut piece, key, 101);
        assert_eq!(&whole[101..434], &piece[..]);
    }

    #[test]
    fn a_flipped_byte_is_found_where_it_is() {
        let key = PatternKey::new(0, 5);
        let mut buf = vec![0u8; 3901];
        fill(&mut buf, key, 100);
        buf[2000] ^= 0x40;
        let m = check(&buf, key, 100).unwrap_err();
        assert_eq!(m.offset, 2100);
        assert_eq!(m.found, m.expected ^ 0x40);
    }

    #[test]
    fn a_flip_anywhere_is_found_at_every_alignment() {
        let key = PatternKey::new(2, 9);
        for offset in [0u64, 3, 8, 13] {
            let mut buf = vec![0u8; 200];
            fill(&mut buf, key, offset);
            for i in 0..buf.len() {
                buf[i] ^= 1;
                let m = check(&buf, key, offset).unwrap_err();
                assert_eq!(m.offset, offset + i as u64, "offset {offset} byte {i}");
                assert_eq!(m.found, m.expected ^ 1);
                buf[i] ^= 1;
            }
        }
    }

    #[test]
    fn another_files_or_ranks_or_offsets_data_is_wrong() {
        let mut buf = vec![0u8; 64];
        fill(&mut buf, PatternKey::new(1, 0), 0);
        assert!(check(&buf, PatternKey::new(2, 0), 0).is_err(), "other rank");
        assert!(check(&buf, PatternKey::new(1, 1), 0).is_err(), "other file");
        assert!(check(&buf, PatternKey::new(1, 0), 64).is_err(), "other offset");
        assert!(check(&[0u8; 64], PatternKey::new(1, 0), 0).is_err(), "zeros");
    }
}
