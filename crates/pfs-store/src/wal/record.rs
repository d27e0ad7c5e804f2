//! The changes a WAL record carries. One record holds every change of one
//! operation, so an operation replays whole or not at all.

use pfs_core::{BlockIndex, InodeId};

use crate::error::StoreError;
use crate::inode::{Run, INODE_ENCODED_LEN, INODE_SLOT_SIZE};

/// A data extent of the `io` layout: `len` bytes of the file at the key offset,
/// stored from byte `skip` of `run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Bytes of file data.
    pub len: u32,
    /// Offset of the data inside the run (left trims move it).
    pub skip: u32,
    /// Pages holding the data.
    pub run: Run,
}

/// One change to a shard table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Insert or replace dentry `(parent, name) -> value`.
    DentryPut { parent: InodeId, name: Vec<u8>, value: u64 },
    /// Remove dentry `(parent, name)`.
    DentryDel { parent: InodeId, name: Vec<u8> },
    /// Write inode slot `slot` (the image names its ino).
    InodePut { slot: u64, image: Box<[u8; INODE_SLOT_SIZE]> },
    /// Free inode `ino` and its slot.
    InodeDel { ino: InodeId, slot: u64 },
    /// Map file block `(ino, block)` to `run`.
    BlockPut { ino: InodeId, block: BlockIndex, run: Run },
    /// Unmap file block `(ino, block)`.
    BlockDel { ino: InodeId, block: BlockIndex },
    /// Map the `io`-layout extent at `(ino, offset)`.
    ExtentPut { ino: InodeId, offset: u64, extent: Extent },
    /// Unmap the `io`-layout extent at `(ino, offset)`.
    ExtentDel { ino: InodeId, offset: u64 },
    /// Set extended attribute `name` of `ino`.
    XattrPut { ino: InodeId, name: Vec<u8>, value: Vec<u8> },
    /// Remove extended attribute `name` of `ino`.
    XattrDel { ino: InodeId, name: Vec<u8> },
    /// Record cross-shard transaction `id` with its state bytes.
    TxnPut { id: u64, data: Vec<u8> },
    /// Forget cross-shard transaction `id`.
    TxnDel { id: u64 },
    /// Data of `ino` at or past byte `from` is garbage, freed in bounded steps.
    TrimPut { ino: InodeId, from: u64 },
    /// The trim of `ino` is done.
    TrimDel { ino: InodeId },
}

impl Change {
    /// Appends the encoding (tag byte, then fields little-endian).
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Change::DentryPut { parent, name, value } => {
                out.push(1);
                put_u64(out, parent.0);
                put_bytes8(out, name);
                put_u64(out, *value);
            }
            Change::DentryDel { parent, name } => {
                out.push(2);
                put_u64(out, parent.0);
                put_bytes8(out, name);
            }
            Change::InodePut { slot, image } => {
                out.push(3);
                put_u64(out, *slot);
                // The rest of a slot is zero by construction (Inode::encode).
                out.extend_from_slice(&image[..INODE_ENCODED_LEN]);
            }
            Change::InodeDel { ino, slot } => {
                out.push(4);
                put_u64(out, ino.0);
                put_u64(out, *slot);
            }
            Change::BlockPut { ino, block, run } => {
                out.push(5);
                put_u64(out, ino.0);
                put_u64(out, block.0);
                put_run(out, run);
            }
            Change::BlockDel { ino, block } => {
                out.push(6);
                put_u64(out, ino.0);
                put_u64(out, block.0);
            }
            Change::ExtentPut { ino, offset, extent } => {
                out.push(7);
                put_u64(out, ino.0);
                put_u64(out, *offset);
                put_u32(out, extent.len);
                put_u32(out, extent.skip);
                put_run(out, &extent.run);
            }
            Change::ExtentDel { ino, offset } => {
                out.push(8);
                put_u64(out, ino.0);
                put_u64(out, *offset);
            }
            Change::XattrPut { ino, name, value } => {
                out.push(9);
                put_u64(out, ino.0);
                put_bytes8(out, name);
                put_u32(out, value.len() as u32);
                out.extend_from_slice(value);
            }
            Change::XattrDel { ino, name } => {
                out.push(10);
                put_u64(out, ino.0);
                put_bytes8(out, name);
            }
            Change::TxnPut { id, data } => {
                out.push(11);
                put_u64(out, *id);
                put_u32(out, data.len() as u32);
                out.extend_from_slice(data);
            }
            Change::TxnDel { id } => {
                out.push(12);
                put_u64(out, *id);
            }
            Change::TrimPut { ino, from } => {
                out.push(13);
                put_u64(out, ino.0);
                put_u64(out, *from);
            }
            Change::TrimDel { ino } => {
                out.push(14);
                put_u64(out, ino.0);
            }
        }
    }

    /// Decodes every change of a record payload.
    pub fn decode_all(mut buf: &[u8]) -> Result<Vec<Change>, StoreError> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            out.push(Change::decode(&mut buf)?);
        }
        Ok(out)
    }

    fn decode(buf: &mut &[u8]) -> Result<Change, StoreError> {
        let tag = take_u8(buf)?;
        Ok(match tag {
            1 => Change::DentryPut {
                parent: InodeId(take_u64(buf)?),
                name: take_bytes8(buf)?,
                value: take_u64(buf)?,
            },
            2 => Change::DentryDel { parent: InodeId(take_u64(buf)?), name: take_bytes8(buf)? },
            3 => {
                let slot = take_u64(buf)?;
                let mut image = Box::new([0u8; INODE_SLOT_SIZE]);
                image[..INODE_ENCODED_LEN].copy_from_slice(take(buf, INODE_ENCODED_LEN)?);
                Change::InodePut { slot, image }
            }
            4 => Change::InodeDel { ino: InodeId(take_u64(buf)?), slot: take_u64(buf)? },
            5 => Change::BlockPut {
                ino: InodeId(take_u64(buf)?),
                block: BlockIndex(take_u64(buf)?),
                run: take_run(buf)?,
            },
            6 => {
                Change::BlockDel { ino: InodeId(take_u64(buf)?), block: BlockIndex(take_u64(buf)?) }
            }
            7 => Change::ExtentPut {
                ino: InodeId(take_u64(buf)?),
                offset: take_u64(buf)?,
                extent: Extent { len: take_u32(buf)?, skip: take_u32(buf)?, run: take_run(buf)? },
            },
            8 => Change::ExtentDel { ino: InodeId(take_u64(buf)?), offset: take_u64(buf)? },
            9 => {
                let ino = InodeId(take_u64(buf)?);
                let name = take_bytes8(buf)?;
                let len = take_u32(buf)? as usize;
                Change::XattrPut { ino, name, value: take(buf, len)?.to_vec() }
            }
            10 => Change::XattrDel { ino: InodeId(take_u64(buf)?), name: take_bytes8(buf)? },
            11 => {
                let id = take_u64(buf)?;
                let len = take_u32(buf)? as usize;
                Change::TxnPut { id, data: take(buf, len)?.to_vec() }
            }
            12 => Change::TxnDel { id: take_u64(buf)? },
            13 => Change::TrimPut { ino: InodeId(take_u64(buf)?), from: take_u64(buf)? },
            14 => Change::TrimDel { ino: InodeId(take_u64(buf)?) },
            t => return Err(StoreError::Corruption(format!("unknown WAL change tag {t}"))),
        })
    }
}

/// Little-endian helpers shared with the checkpoint encoder.
pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_bytes8(out: &mut Vec<u8>, v: &[u8]) {
    assert!(v.len() <= u8::MAX as usize, "name of {} bytes", v.len());
    out.push(v.len() as u8);
    out.extend_from_slice(v);
}

pub(crate) fn put_run(out: &mut Vec<u8>, run: &Run) {
    put_u64(out, run.page);
    put_u32(out, run.pages);
    put_u32(out, run.valid);
}

pub(crate) fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8], StoreError> {
    if buf.len() < n {
        return Err(StoreError::Corruption(format!(
            "record truncated: need {n} bytes, have {}",
            buf.len()
        )));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

pub(crate) fn take_u8(buf: &mut &[u8]) -> Result<u8, StoreError> {
    Ok(take(buf, 1)?[0])
}

pub(crate) fn take_u32(buf: &mut &[u8]) -> Result<u32, StoreError> {
    Ok(u32::from_le_bytes(take(buf, 4)?.try_into().expect("4 bytes")))
}

pub(crate) fn take_u64(buf: &mut &[u8]) -> Result<u64, StoreError> {
    Ok(u64::from_le_bytes(take(buf, 8)?.try_into().expect("8 bytes")))
}

pub(crate) fn take_bytes8(buf: &mut &[u8]) -> Result<Vec<u8>, StoreError> {
    let n = take_u8(buf)? as usize;
    Ok(take(buf, n)?.to_vec())
}

pub(crate) fn take_run(buf: &mut &[u8]) -> Result<Run, StoreError> {
    Ok(Run { page: take_u64(buf)?, pages: take_u32(buf)?, valid: take_u32(buf)? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot_image() -> [u8; INODE_SLOT_SIZE] {
        let mut img = [0u8; INODE_SLOT_SIZE];
        img[..INODE_ENCODED_LEN].fill(7);
        img
    }

    fn sample_changes() -> Vec<Change> {
        let run = Run { page: 3, pages: 2, valid: 5000 };
        vec![
            Change::DentryPut { parent: InodeId(1), name: b"a.txt".to_vec(), value: 9 },
            Change::DentryDel { parent: InodeId(1), name: vec![b'x'; 255] },
            Change::InodePut { slot: 4, image: Box::new(slot_image()) },
            Change::InodeDel { ino: InodeId(9), slot: 4 },
            Change::BlockPut { ino: InodeId(9), block: BlockIndex(3), run },
            Change::BlockDel { ino: InodeId(9), block: BlockIndex(3) },
            Change::ExtentPut {
                ino: InodeId(9),
                offset: 47008,
                extent: Extent { len: 47008, skip: 0, run },
            },
            Change::ExtentDel { ino: InodeId(9), offset: 47008 },
            Change::XattrPut { ino: InodeId(9), name: b"user.k".to_vec(), value: vec![1, 2, 3] },
            Change::XattrDel { ino: InodeId(9), name: b"user.k".to_vec() },
            Change::TxnPut { id: 77, data: vec![4; 40] },
            Change::TxnDel { id: 77 },
            Change::TrimPut { ino: InodeId(9), from: 65536 },
            Change::TrimDel { ino: InodeId(9) },
        ]
    }

    #[test]
    fn every_change_round_trips() {
        let changes = sample_changes();
        let mut buf = Vec::new();
        for c in &changes {
            c.encode(&mut buf);
        }
        assert_eq!(Change::decode_all(&buf).unwrap(), changes);
        assert!(Change::decode_all(&buf[..buf.len() - 1]).is_err());
        assert!(Change::decode_all(&[99]).is_err());
    }

    /// The WAL record reader faces a million mutated records: each decodes to
    /// changes that encode to themselves, or is refused; none panics. (A record
    /// reaches the reader only after its checksum passed, so this is about
    /// records written by a buggy or older shard, not torn ones.)
    #[test]
    fn a_million_mutated_records_decode_or_are_refused() {
        let seed: u64 = std::env::var("PFS_FUZZ_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64 | 1);
        let iters: usize = std::env::var("PFS_FUZZ_RECORDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        println!("fuzz: {iters} mutated WAL records, seed {seed} (PFS_FUZZ_SEED={seed} replays)");
        let changes = sample_changes();
        let mut x = seed;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut decoded, mut refused) = (0u64, 0u64);
        for i in 0..iters {
            let mut buf = Vec::new();
            for _ in 0..1 + next() % 4 {
                changes[(next() % changes.len() as u64) as usize].encode(&mut buf);
            }
            for _ in 0..1 + next() % 4 {
                let at = (next() % buf.len() as u64) as usize;
                match next() % 4 {
                    0 => buf[at] ^= 1 << (next() % 8),
                    1 => buf[at] = next() as u8,
                    2 => buf.truncate(at.max(1)),
                    _ => buf.insert(at, next() as u8),
                }
            }
            match Change::decode_all(&buf) {
                Ok(got) => {
                    let mut again = Vec::new();
                    for c in &got {
                        c.encode(&mut again);
                    }
                    assert_eq!(Change::decode_all(&again).unwrap(), got, "seed {seed}, case {i}");
                    decoded += 1;
                }
                Err(e) => {
                    assert!(!e.to_string().is_empty());
                    refused += 1;
                }
            }
        }
        println!("fuzz: {decoded} decoded, {refused} refused, no panic");
        assert!(decoded > 0 && refused > 0);
    }
}
