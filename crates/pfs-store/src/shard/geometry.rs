//! Where everything lives in a zone, and the two fixed headers that say so:
//! the superblock (page 0) and the checkpoint headers (pages 1 and 2).
//! Byte layouts are in `docs/format.md`.

use pfs_core::ShardId;

use crate::device::SECTOR_SIZE;
use crate::error::StoreError;
use crate::icache::INODES_PER_BLOCK;

/// Bytes per page of every area.
pub const PAGE_SIZE: u64 = SECTOR_SIZE as u64;
/// Format version written in the superblock and checkpoint headers. Version 4
/// splits the WAL area in two halves, one per checkpoint generation's parity
/// ([`Geometry::wal_half`]).
pub const FORMAT_VERSION: u32 = 4;
const SUPER_MAGIC: &[u8; 8] = b"PFSZONE\0";
const CKPT_MAGIC: &[u8; 8] = b"PFSCKPT\0";
const INTENT_MAGIC: &[u8; 8] = b"PFSFMTIN";

/// The page a server writes over zone 0's superblock before it formats its
/// zones (docs/format.md, "Format intent"): which shard zone 0 is being
/// formatted for. Zone 0's format replaces it with the superblock last, so
/// a start that finds it knows a format was cut short, and for which server.
pub fn encode_format_intent(shard: ShardId) -> Vec<u8> {
    let mut b = Vec::with_capacity(20);
    b.extend_from_slice(INTENT_MAGIC);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&shard.0.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The shard of a format intent page, `None` when `b` is not one (checksum
/// included).
pub fn decode_format_intent(b: &[u8]) -> Option<ShardId> {
    if b.len() < 20 || &b[..8] != INTENT_MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(b[16..20].try_into().expect("4"));
    if crc32c::crc32c(&b[..16]) != crc {
        return None;
    }
    Some(ShardId(u32::from_le_bytes(b[12..16].try_into().expect("4"))))
}

/// Choices made when a zone is formatted.
#[derive(Clone, Debug)]
pub struct FormatOptions {
    /// The shard this zone belongs to.
    pub shard: ShardId,
    /// Byte offset of the zone on the device.
    pub zone_offset: u64,
    /// Bytes of the zone.
    pub zone_bytes: u64,
    /// File block size (a multiple of the page size).
    pub block_size: u32,
    /// Inode slots; default: one per 16 KiB of zone, at least 1024.
    pub inode_slots: Option<u64>,
    /// WAL bytes; default: 1/16 of the zone, between 1 MiB and 256 MiB.
    pub wal_bytes: Option<u64>,
    /// Whether this zone holds the root directory.
    pub create_root: bool,
    /// The format id salting every checksum of the zone's log and checkpoint
    /// headers; random when `None` (the usual case: tests fix it).
    pub format_id: Option<u64>,
}

/// A random non-zero 64-bit number from the kernel (the clock and pid if the
/// kernel has none to give).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most `b.len()` bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let mut x = u64::from_le_bytes(b);
    if n != 8 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        x = t ^ (u64::from(std::process::id()) << 32);
    }
    x.max(1)
}

impl FormatOptions {
    /// Defaults for a zone of `zone_bytes` at offset 0.
    pub fn new(shard: ShardId, zone_bytes: u64) -> FormatOptions {
        FormatOptions {
            shard,
            zone_offset: 0,
            zone_bytes,
            block_size: pfs_core::BLOCK_SIZE_BYTES as u32,
            inode_slots: None,
            wal_bytes: None,
            create_root: true,
            format_id: None,
        }
    }
}

/// The zone geometry, in pages relative to the zone start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Owning shard.
    pub shard: ShardId,
    /// Byte offset of the zone on the device.
    pub zone_offset: u64,
    /// Bytes of the zone.
    pub zone_bytes: u64,
    /// File block size in bytes.
    pub block_size: u32,
    /// Inode slots in the metadata area.
    pub inode_slots: u64,
    /// First metadata page.
    pub meta_page: u64,
    /// Metadata pages.
    pub meta_pages: u64,
    /// First page of each checkpoint region.
    pub ckpt_page: [u64; 2],
    /// Pages per checkpoint region.
    pub ckpt_pages: u64,
    /// First WAL page.
    pub wal_page: u64,
    /// WAL pages.
    pub wal_pages: u64,
    /// First data page.
    pub data_page: u64,
    /// Data pages.
    pub data_pages: u64,
    /// Random id of this format, salting the checksums of the WAL records and
    /// checkpoint headers: after a reformat nothing of the old format passes.
    pub format_id: u64,
}

impl Geometry {
    /// Lays out a zone.
    pub fn compute(opts: &FormatOptions) -> Result<Geometry, StoreError> {
        let bad = |m: String| Err(StoreError::Geometry(m));
        if opts.zone_offset % PAGE_SIZE != 0 || opts.zone_bytes % PAGE_SIZE != 0 {
            return bad(format!(
                "zone offset {} and size {} must be multiples of {PAGE_SIZE}",
                opts.zone_offset, opts.zone_bytes
            ));
        }
        if opts.block_size == 0
            || opts.block_size as u64 % PAGE_SIZE != 0
            || opts.block_size > 16 << 20
        {
            return bad(format!(
                "block_size = {} is out of range: a multiple of {PAGE_SIZE} up to 16 MiB",
                opts.block_size
            ));
        }
        if opts.shard.0 >= 1 << 15 {
            return bad(format!("shard id {} is out of range: allowed 0..32768", opts.shard.0));
        }
        let pages = opts.zone_bytes / PAGE_SIZE;
        let slots = opts.inode_slots.unwrap_or((opts.zone_bytes / (16 << 10)).max(1024));
        let slots = slots.div_ceil(INODES_PER_BLOCK) * INODES_PER_BLOCK;
        let meta_pages = slots / INODES_PER_BLOCK;
        let wal_bytes = opts.wal_bytes.unwrap_or((opts.zone_bytes / 16).clamp(1 << 20, 256 << 20));
        let wal_pages = wal_bytes.div_ceil(PAGE_SIZE);
        // Each half must hold the largest record twice over.
        if wal_pages < 128 {
            return bad(format!("wal_bytes = {wal_bytes} is out of range: at least 512 KiB"));
        }
        // A checkpoint holds every table; budget per inode slot and per data page.
        let ckpt_bytes = slots * 320 + pages * 32 + (64 << 10);
        let ckpt_pages = ckpt_bytes.div_ceil(PAGE_SIZE);
        let meta_page = 3;
        let ckpt_page = [meta_page + meta_pages, meta_page + meta_pages + ckpt_pages];
        let wal_page = ckpt_page[1] + ckpt_pages;
        let data_page = wal_page + wal_pages;
        if data_page + 16 > pages {
            return bad(format!(
                "zone of {} bytes is too small: metadata, checkpoints and WAL need {} bytes",
                opts.zone_bytes,
                (data_page + 16) * PAGE_SIZE
            ));
        }
        Ok(Geometry {
            shard: opts.shard,
            zone_offset: opts.zone_offset,
            zone_bytes: opts.zone_bytes,
            block_size: opts.block_size,
            inode_slots: slots,
            meta_page,
            meta_pages,
            ckpt_page,
            ckpt_pages,
            wal_page,
            wal_pages,
            data_page,
            data_pages: pages - data_page,
            format_id: opts.format_id.unwrap_or_else(random_u64),
        })
    }

    /// Device byte offset of zone page `page`.
    pub fn offset(&self, page: u64) -> u64 {
        self.zone_offset + page * PAGE_SIZE
    }

    /// The half of the WAL area that checkpoint generation `gen` logs to: its
    /// device byte offset and length. Generations alternate, so a checkpoint
    /// taken while serving logs the operations after its snapshot to the other
    /// half, and the records its predecessor needs stay intact until its
    /// header is durable.
    pub fn wal_half(&self, gen: u64) -> (u64, u64) {
        let half = self.wal_pages / 2;
        (self.offset(self.wal_page + (gen % 2) * half), half * PAGE_SIZE)
    }

    /// Device byte offset of data page `page` (index into the data area).
    pub fn data_offset(&self, page: u64) -> u64 {
        assert!(page < self.data_pages, "data page {page} outside {}", self.data_pages);
        self.offset(self.data_page + page)
    }

    /// The superblock image.
    pub fn encode_superblock(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PAGE_SIZE as usize);
        b.extend_from_slice(SUPER_MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.shard.0.to_le_bytes());
        for v in [self.zone_offset, self.zone_bytes] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        for v in [
            self.inode_slots,
            self.meta_page,
            self.meta_pages,
            self.ckpt_page[0],
            self.ckpt_page[1],
            self.ckpt_pages,
            self.wal_page,
            self.wal_pages,
            self.data_page,
            self.data_pages,
            self.format_id,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a superblock image, checking magic, version and checksum.
    pub fn decode_superblock(b: &[u8]) -> Result<Geometry, StoreError> {
        const LEN: usize = 8 + 4 + 4 + 16 + 8 + 88;
        let corrupt = |m: &str| Err(StoreError::Corruption(format!("superblock: {m}")));
        if &b[..8] != SUPER_MAGIC {
            return corrupt("bad magic (not a pfs zone, or not formatted)");
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return corrupt(&format!(
                "format version {version}, and this pfs reads version {FORMAT_VERSION}: the zone \
                 was formatted by another pfs release (copy its files out with that release, or \
                 reformat: pfs mkfs)"
            ));
        }
        if crc32c::crc32c(&b[..LEN]) != u32_at(LEN) {
            return corrupt("checksum mismatch");
        }
        if u32_at(32) as u64 != PAGE_SIZE {
            return corrupt(&format!("page size {}, expected {PAGE_SIZE}", u32_at(32)));
        }
        let g = Geometry {
            shard: ShardId(u32_at(12)),
            zone_offset: u64_at(16),
            zone_bytes: u64_at(24),
            block_size: u32_at(36),
            inode_slots: u64_at(40),
            meta_page: u64_at(48),
            meta_pages: u64_at(56),
            ckpt_page: [u64_at(64), u64_at(72)],
            ckpt_pages: u64_at(80),
            wal_page: u64_at(88),
            wal_pages: u64_at(96),
            data_page: u64_at(104),
            data_pages: u64_at(112),
            format_id: u64_at(120),
        };
        if g.data_page + g.data_pages != g.zone_bytes / PAGE_SIZE {
            return corrupt("areas do not add up to the zone size");
        }
        Ok(g)
    }
}

/// A checkpoint header: which region holds the tables of generation `gen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckpointHeader {
    /// Checkpoint generation; the WAL after it carries the same number.
    pub gen: u64,
    /// Region (0 or 1) holding the tables.
    pub region: u32,
    /// Bytes of the encoded tables.
    pub tables_len: u64,
    /// crc32c of the encoded tables.
    pub tables_crc: u32,
    /// Next inode sequence number to hand out.
    pub next_ino_seq: u64,
    /// Sequence number of the first WAL record after this checkpoint.
    pub first_lsn: u64,
}

impl CheckpointHeader {
    /// The header image; its checksum is salted with the zone's `format_id`.
    pub fn encode(&self, format_id: u64) -> Vec<u8> {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(CKPT_MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&self.region.to_le_bytes());
        b.extend_from_slice(&self.gen.to_le_bytes());
        b.extend_from_slice(&self.tables_len.to_le_bytes());
        b.extend_from_slice(&self.tables_crc.to_le_bytes());
        b.extend_from_slice(&self.next_ino_seq.to_le_bytes());
        b.extend_from_slice(&self.first_lsn.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&format_id.to_le_bytes()), &b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a header image; `None` if it is not a valid header of the format
    /// `format_id` (never written, torn, or left from an earlier format).
    pub fn decode(b: &[u8], format_id: u64) -> Option<CheckpointHeader> {
        const LEN: usize = 8 + 4 + 4 + 8 + 8 + 4 + 8 + 8;
        if &b[..8] != CKPT_MAGIC {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let crc = crc32c::crc32c_append(crc32c::crc32c(&format_id.to_le_bytes()), &b[..LEN]);
        if u32_at(8) != FORMAT_VERSION || crc != u32_at(LEN) {
            return None;
        }
        Some(CheckpointHeader {
            region: u32_at(12),
            gen: u64_at(16),
            tables_len: u64_at(24),
            tables_crc: u32_at(32),
            next_ino_seq: u64_at(36),
            first_lsn: u64_at(44),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_areas_fit() {
        let g = Geometry::compute(&FormatOptions::new(ShardId(3), 64 << 20)).unwrap();
        assert!(g.data_pages > 0);
        assert_eq!(g.data_page + g.data_pages, (64 << 20) / PAGE_SIZE);
        let mut img = g.encode_superblock();
        img.resize(PAGE_SIZE as usize, 0);
        assert_eq!(Geometry::decode_superblock(&img).unwrap(), g);
        img[40] ^= 1;
        assert!(Geometry::decode_superblock(&img).is_err());
    }

    #[test]
    fn generations_alternate_between_the_halves_of_the_log() {
        let g = Geometry::compute(&FormatOptions::new(ShardId(3), 64 << 20)).unwrap();
        let (even, bytes) = g.wal_half(4);
        let (odd, odd_bytes) = g.wal_half(7);
        assert_eq!((bytes, odd_bytes), (g.wal_pages / 2 * PAGE_SIZE, bytes));
        assert_eq!(even, g.offset(g.wal_page));
        assert_eq!(odd, even + bytes);
        assert!(odd + bytes <= g.offset(g.data_page));
        let mut small = FormatOptions::new(ShardId(0), 64 << 20);
        small.wal_bytes = Some(256 << 10);
        let err = Geometry::compute(&small).unwrap_err();
        assert!(err.to_string().contains("wal_bytes"), "{err}");
    }

    #[test]
    fn too_small_zone_names_the_problem() {
        let err = Geometry::compute(&FormatOptions::new(ShardId(0), 1 << 20)).unwrap_err();
        assert!(err.to_string().contains("too small"), "{err}");
    }

    #[test]
    fn checkpoint_header_round_trips() {
        let h = CheckpointHeader {
            gen: 5,
            region: 1,
            tables_len: 99,
            tables_crc: 7,
            next_ino_seq: 12,
            first_lsn: 3,
        };
        let mut img = h.encode(0xabc);
        img.resize(PAGE_SIZE as usize, 0);
        assert_eq!(CheckpointHeader::decode(&img, 0xabc), Some(h));
        assert_eq!(CheckpointHeader::decode(&img, 0xabd), None, "another format's header");
        img[20] ^= 1;
        assert_eq!(CheckpointHeader::decode(&img, 0xabc), None);
    }
}
