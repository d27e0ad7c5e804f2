//! The inode: its fields and its fixed-size slot encoding in the metadata area.

use pfs_core::{DirLayout, FileAttr, FileLayout, FileType, InodeId, TimeNs};

use crate::error::StoreError;

/// Bytes per inode slot; a 4 KiB page holds 16.
pub const INODE_SLOT_SIZE: usize = 256;
/// Bytes of a slot that hold data (body and checksum); the rest is zero, so the
/// WAL logs only these.
pub const INODE_ENCODED_LEN: usize = 112;
const CRC_AT: usize = INODE_ENCODED_LEN - 4;

const SLOT_MAGIC: u16 = 0x4e49; // "IN"

/// A run of contiguous data pages holding one file block (or one I/O).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Run {
    /// First page, as an index into the zone's data area.
    pub page: u64,
    /// Pages in the run.
    pub pages: u32,
    /// Bytes of valid data from the start of the run; beyond it reads as zeros.
    pub valid: u32,
}

/// An inode as kept in the Icache and in its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    /// The inode number.
    pub ino: InodeId,
    /// The directory that holds its (last) name, for directory loop checks.
    pub parent: InodeId,
    /// File type.
    pub kind: FileType,
    /// Permission bits.
    pub perm: u16,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Link count.
    pub nlink: u32,
    /// Device number of device nodes.
    pub rdev: u32,
    /// Access time.
    pub atime_ns: TimeNs,
    /// Modification time.
    pub mtime_ns: TimeNs,
    /// Status change time.
    pub ctime_ns: TimeNs,
    /// Layout of children (directories).
    pub dir_layout: DirLayout,
    /// Layout of data (files), inherited by children of directories.
    pub file_layout: FileLayout,
    /// The first file block's pages, mapped in the inode (small files need no lookup).
    pub first_block: Option<Run>,
    /// Data pages allocated to this file on this shard.
    pub pages: u64,
    /// Bytes of the file other shards may hold data below (clients reserve it
    /// before they write there, `ReserveData`): what a truncate or the removal
    /// of the file must free elsewhere, even past the size a writer that died
    /// never published. Never lowered. 0 in slots written before it existed.
    pub data_end: u64,
}

impl Inode {
    /// The attributes a client sees.
    pub fn attr(&self, page_size: u64) -> FileAttr {
        FileAttr {
            ino: self.ino,
            kind: self.kind,
            perm: self.perm,
            uid: self.uid,
            gid: self.gid,
            size: self.size,
            blocks: self.pages * page_size / 512,
            nlink: self.nlink,
            rdev: self.rdev,
            atime_ns: self.atime_ns,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
        }
    }

    /// Encodes into a slot image (layout in `docs/format.md`).
    pub fn encode(&self, out: &mut [u8; INODE_SLOT_SIZE]) {
        out.fill(0);
        let run = self.first_block.unwrap_or_default();
        let mut w = Writer { buf: out, at: 0 };
        w.u16(SLOT_MAGIC);
        w.u8(self.kind as u8);
        w.u8(self.first_block.is_some() as u8);
        w.u8(self.dir_layout as u8);
        w.u8(self.file_layout as u8);
        w.u16(self.perm);
        w.u64(self.ino.0);
        w.u64(self.parent.0);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u64(self.size);
        w.u32(self.nlink);
        w.u32(self.rdev);
        w.u64(self.atime_ns as u64);
        w.u64(self.mtime_ns as u64);
        w.u64(self.ctime_ns as u64);
        w.u64(run.page);
        w.u32(run.pages);
        w.u32(run.valid);
        w.u64(self.pages);
        w.u64(self.data_end);
        assert!(w.at <= CRC_AT, "inode body of {} bytes overflows its slot layout", w.at);
        let crc = crc32c::crc32c(&out[..CRC_AT]);
        out[CRC_AT..INODE_ENCODED_LEN].copy_from_slice(&crc.to_le_bytes());
    }

    /// The inode number of a slot image written by [`Inode::encode`], without a
    /// full decode (WAL records carry their own checksum).
    pub fn peek_ino(buf: &[u8; INODE_SLOT_SIZE]) -> Result<InodeId, StoreError> {
        if u16::from_le_bytes([buf[0], buf[1]]) != SLOT_MAGIC {
            return Err(StoreError::Corruption("inode image without slot magic".into()));
        }
        Ok(InodeId(u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"))))
    }

    /// Decodes a slot image; `Ok(None)` for an all-zero (never written) slot.
    pub fn decode(buf: &[u8]) -> Result<Option<Inode>, StoreError> {
        assert_eq!(buf.len(), INODE_SLOT_SIZE);
        if buf.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let mut r = Reader { buf, at: 0 };
        let magic = r.u16();
        if magic != SLOT_MAGIC {
            return Err(StoreError::Corruption(format!("inode slot magic {magic:#x}")));
        }
        let kind_byte = r.u8();
        let has_first = r.u8() != 0;
        let dir_layout = r.u8();
        let file_layout = r.u8();
        let perm = r.u16();
        let ino = InodeId(r.u64());
        let parent = InodeId(r.u64());
        let uid = r.u32();
        let gid = r.u32();
        let size = r.u64();
        let nlink = r.u32();
        let rdev = r.u32();
        let atime_ns = r.u64() as i64;
        let mtime_ns = r.u64() as i64;
        let ctime_ns = r.u64() as i64;
        let run = Run { page: r.u64(), pages: r.u32(), valid: r.u32() };
        let pages = r.u64();
        let data_end = r.u64();
        let crc = u32::from_le_bytes(buf[CRC_AT..INODE_ENCODED_LEN].try_into().expect("4 bytes"));
        if crc32c::crc32c(&buf[..CRC_AT]) != crc || buf[INODE_ENCODED_LEN..].iter().any(|&b| b != 0)
        {
            return Err(StoreError::Corruption(format!("inode {ino}: slot checksum mismatch")));
        }
        let bad = |what: &str| StoreError::Corruption(format!("inode {ino}: bad {what}"));
        Ok(Some(Inode {
            ino,
            parent,
            kind: FileType::from_u8(kind_byte).ok_or_else(|| bad("file type"))?,
            perm,
            uid,
            gid,
            size,
            nlink,
            rdev,
            atime_ns,
            mtime_ns,
            ctime_ns,
            dir_layout: DirLayout::from_u8(dir_layout).ok_or_else(|| bad("dir layout"))?,
            file_layout: FileLayout::from_u8(file_layout).ok_or_else(|| bad("file layout"))?,
            first_block: has_first.then_some(run),
            pages,
            data_end,
        }))
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let v = self.buf[self.at..self.at + N].try_into().expect("fixed slot field");
        self.at += N;
        v
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Inode {
        Inode {
            ino: InodeId(77),
            parent: InodeId::ROOT,
            kind: FileType::Regular,
            perm: 0o644,
            uid: 1000,
            gid: 100,
            size: 3901,
            nlink: 1,
            rdev: 0,
            atime_ns: -5,
            mtime_ns: 1_700_000_000_000_000_000,
            ctime_ns: 42,
            dir_layout: DirLayout::BigDir,
            file_layout: FileLayout::Io,
            first_block: Some(Run { page: 9, pages: 1, valid: 3901 }),
            pages: 1,
            data_end: 1 << 30,
        }
    }

    #[test]
    fn slot_round_trips() {
        let mut buf = [0u8; INODE_SLOT_SIZE];
        sample().encode(&mut buf);
        assert_eq!(Inode::decode(&buf).unwrap(), Some(sample()));
        assert_eq!(Inode::decode(&[0u8; INODE_SLOT_SIZE]).unwrap(), None);
    }

    #[test]
    fn a_flipped_bit_is_corruption() {
        let mut buf = [0u8; INODE_SLOT_SIZE];
        sample().encode(&mut buf);
        buf[30] ^= 1;
        assert!(matches!(Inode::decode(&buf), Err(StoreError::Corruption(_))));
    }
}
