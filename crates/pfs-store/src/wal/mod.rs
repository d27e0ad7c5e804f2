//! Write-ahead log: every change to a shard table is appended as part of one record
//! per operation (atomic), records are group-committed with one write and one sync,
//! and recovery replays them from the last checkpoint, cutting a torn tail.
//!
//! - [`record`]: the `Change` entries and their encoding.
//! - this file: the log area, append, commit, scan.
//!
//! Record framing (see `docs/format.md`): `len u32 | crc32c u32 | gen u64 | lsn u64 |
//! payload[len]`, crc over the zone's format id (the salt, not stored in the
//! record), len, gen, lsn and payload. `gen` is the checkpoint generation the log
//! belongs to, so records left from before the last truncation never replay; the
//! salt does the same for records left from before a reformat.

pub mod record;

pub use record::Change;

use crate::device::{AlignedBuf, Device, IoKind, IoRequest, SECTOR_SIZE};
use crate::error::StoreError;
use crate::io::DevIo;

/// Bytes of a record header.
pub const RECORD_HEADER: usize = 24;

/// The log of one zone.
#[derive(Debug)]
pub struct Wal {
    area_offset: u64,
    area_bytes: u64,
    gen: u64,
    next_lsn: u64,
    /// Byte position where the next record goes.
    tail: u64,
    /// Everything before this position is durable.
    durable_tail: u64,
    /// Bytes from `pending_start` (a sector boundary) up to `tail`.
    pending: Vec<u8>,
    pending_start: u64,
    /// Most bytes that may wait for a commit (bounded group).
    pending_max: usize,
    durable_lsn_value: u64,
    /// The zone's format id, salting every record's checksum.
    salt: u64,
}

/// A record's checksum: over the salt, the length, gen and lsn, and the payload.
fn record_crc(salt: u64, header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&salt.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &header[0..4]);
    let crc = crc32c::crc32c_append(crc, &header[8..24]);
    crc32c::crc32c_append(crc, payload)
}

/// What a scan of the log found.
#[derive(Debug)]
pub struct Scanned {
    /// Payloads of the valid records, in order, with their lsn.
    pub records: Vec<(u64, Vec<u8>)>,
    /// Where the valid log ends.
    pub tail: u64,
}

impl Wal {
    /// An empty log of generation `gen` over `area_bytes` at `area_offset`, its
    /// records salted with `salt`.
    pub fn new(
        area_offset: u64,
        area_bytes: u64,
        gen: u64,
        first_lsn: u64,
        pending_max: usize,
        salt: u64,
    ) -> Wal {
        assert!(area_bytes % SECTOR_SIZE as u64 == 0 && area_bytes > 0);
        Wal {
            area_offset,
            area_bytes,
            gen,
            next_lsn: first_lsn,
            tail: 0,
            durable_tail: 0,
            pending: Vec::with_capacity(pending_max + SECTOR_SIZE),
            pending_start: 0,
            pending_max,
            durable_lsn_value: first_lsn.saturating_sub(1),
            salt,
        }
    }

    /// Reads the whole area and returns the valid records of generation `gen`
    /// salted with `salt`, starting at `first_lsn`; stops at the first record
    /// that fails a check.
    pub fn scan<D: Device>(
        io: &mut DevIo<D>,
        area_offset: u64,
        area_bytes: u64,
        gen: u64,
        first_lsn: u64,
        salt: u64,
    ) -> Result<Scanned, StoreError> {
        let bytes = io.read_bytes(area_offset, area_bytes)?;
        let mut records = Vec::new();
        let mut pos = 0usize;
        let mut lsn = first_lsn;
        while let Some((payload, next)) = parse_record(&bytes, pos, gen, lsn, salt) {
            records.push((lsn, payload.to_vec()));
            pos = next;
            lsn += 1;
        }
        Ok(Scanned { records, tail: pos as u64 })
    }

    /// Continues a scanned log: appends go after `tail`, the partial sector before it
    /// is kept so rewriting it preserves the records it holds.
    pub fn resume(&mut self, tail: u64, next_lsn: u64, partial: &[u8]) {
        assert_eq!(partial.len() as u64, tail % SECTOR_SIZE as u64);
        self.tail = tail;
        self.durable_tail = tail;
        self.next_lsn = next_lsn;
        self.durable_lsn_value = next_lsn.saturating_sub(1);
        self.pending_start = tail - tail % SECTOR_SIZE as u64;
        self.pending.clear();
        self.pending.extend_from_slice(partial);
    }

    /// The sequence number the next record will get.
    pub fn next_lsn(&self) -> u64 {
        self.next_lsn
    }

    /// The highest durable sequence number (0 if none).
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn_value
    }

    /// Bytes left in the area.
    pub fn free_bytes(&self) -> u64 {
        self.area_bytes - self.tail
    }

    /// True if records wait for a commit.
    pub fn has_pending(&self) -> bool {
        self.tail > self.durable_tail
    }

    /// Bytes of records (and the partial sector before them) not yet durable.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }

    /// True if the pending group reached its bound: a commit should start.
    pub fn group_full(&self) -> bool {
        self.pending.len() >= self.pending_max
    }

    /// True if the pending records reached twice the bound (a group, and the
    /// one a commit under way is writing): the next operation waits for a
    /// commit, so pending records stay within two groups.
    pub fn group_overfull(&self) -> bool {
        self.group_overfull_past(0)
    }

    /// True if the pending records reached twice the bound and `extra` bytes
    /// more (the room an operation that cannot stop may still take).
    pub fn group_overfull_past(&self, extra: usize) -> bool {
        self.pending.len() >= 2 * self.pending_max + extra
    }

    /// The generation of this log.
    pub fn gen(&self) -> u64 {
        self.gen
    }

    /// Appends one record; returns its lsn. The caller checked `free_bytes`.
    pub fn append(&mut self, payload: &[u8]) -> u64 {
        let total = RECORD_HEADER + payload.len();
        assert!(total as u64 <= self.free_bytes(), "WAL overflow: caller must checkpoint first");
        let lsn = self.next_lsn;
        let mut header = [0u8; RECORD_HEADER];
        header[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[8..16].copy_from_slice(&self.gen.to_le_bytes());
        header[16..24].copy_from_slice(&lsn.to_le_bytes());
        let crc = record_crc(self.salt, &header, payload);
        header[4..8].copy_from_slice(&crc.to_le_bytes());
        self.pending.extend_from_slice(&header);
        self.pending.extend_from_slice(payload);
        self.tail += total as u64;
        self.next_lsn += 1;
        lsn
    }

    /// Writes the pending records (one write) and syncs. Returns the durable lsn.
    pub fn commit<D: Device>(&mut self, io: &mut DevIo<D>) -> Result<u64, StoreError> {
        let Some(end) = self.pending_end() else {
            return Ok(self.durable_lsn_value);
        };
        io.run(vec![self.commit_write(end)]).pop().expect("one completion").result?;
        let sync = IoRequest { tag: 0, kind: IoKind::Sync, offset: 0, buf: AlignedBuf::zeroed(0) };
        io.run(vec![sync]).pop().expect("one completion").result?;
        Ok(self.committed(end))
    }

    /// Where the log ends after the records pending now, which a commit
    /// starting now makes durable; `None` if nothing is pending.
    pub fn pending_end(&self) -> Option<CommitEnd> {
        self.has_pending().then(|| CommitEnd { tail: self.tail, lsn: self.next_lsn - 1 })
    }

    /// The write of the pending records up to `end` (from
    /// [`pending_end`](Self::pending_end)); [`committed`](Self::committed) once
    /// it and a sync after it finished. Records appended after `end` are not
    /// in it: they wait for the next commit, which starts after this one
    /// finished (it rewrites the partial last sector).
    pub fn commit_write(&self, end: CommitEnd) -> IoRequest {
        let buf = AlignedBuf::from_slice(&self.pending[..(end.tail - self.pending_start) as usize]);
        IoRequest {
            tag: 0,
            kind: IoKind::Write,
            offset: self.area_offset + self.pending_start,
            buf,
        }
    }

    /// Notes that the write from [`commit_write`](Self::commit_write) and a sync
    /// after it finished: the log is durable up to `end`. Returns its last lsn.
    pub fn committed(&mut self, end: CommitEnd) -> u64 {
        assert!(end.tail >= self.durable_tail && end.tail <= self.tail, "commits run in order");
        self.durable_tail = end.tail;
        self.durable_lsn_value = end.lsn;
        // Keep only the partial last sector: it is rewritten by the next commit.
        let keep_from = end.tail - end.tail % SECTOR_SIZE as u64;
        self.pending.drain(..(keep_from - self.pending_start) as usize);
        self.pending_start = keep_from;
        end.lsn
    }
}

/// Where the log ends after a commit's records.
#[derive(Clone, Copy, Debug)]
pub struct CommitEnd {
    tail: u64,
    lsn: u64,
}

/// The payload of the record at `pos` if it is valid and of `gen`/`lsn`, and the
/// position after it.
fn parse_record(bytes: &[u8], pos: usize, gen: u64, lsn: u64, salt: u64) -> Option<(&[u8], usize)> {
    let header = bytes.get(pos..pos + RECORD_HEADER)?;
    let len = u32::from_le_bytes(header[0..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().ok()?);
    let rec_gen = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let rec_lsn = u64::from_le_bytes(header[16..24].try_into().ok()?);
    if rec_gen != gen || rec_lsn != lsn {
        return None;
    }
    let payload = bytes.get(pos + RECORD_HEADER..(pos + RECORD_HEADER).checked_add(len)?)?;
    (record_crc(salt, header, payload) == crc).then_some((payload, pos + RECORD_HEADER + len))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::MemDevice;

    const AREA: u64 = 64 * SECTOR_SIZE as u64;
    const SALT: u64 = 0x5a17;

    fn scan(io: &mut DevIo<MemDevice>, gen: u64) -> Scanned {
        Wal::scan(io, 0, AREA, gen, 1, SALT).unwrap()
    }

    #[test]
    fn group_commit_then_scan_returns_every_record() {
        let mut io = DevIo::new(MemDevice::new(AREA, 8));
        let mut wal = Wal::new(0, AREA, 3, 1, 1 << 20, SALT);
        for i in 0..100u32 {
            wal.append(&i.to_le_bytes().repeat(i as usize % 50 + 1));
        }
        assert_eq!(wal.commit(&mut io).unwrap(), 100);
        let s = scan(&mut io, 3);
        assert_eq!(s.records.len(), 100);
        assert_eq!(s.records[7].1, 7u32.to_le_bytes().repeat(8));
        assert!(scan(&mut io, 4).records.is_empty(), "another generation's records never replay");
        let other = Wal::scan(&mut io, 0, AREA, 3, 1, SALT + 1).unwrap();
        assert!(other.records.is_empty(), "another format's records never replay");
    }

    #[test]
    fn a_reformatted_log_never_continues_into_the_old_one() {
        // Records of 1 KiB, four per sector. The old format wrote eight; the new
        // one (same generation and lsns, as after a reformat) writes four, ending
        // on a sector boundary, so the old fifth record sits where the new log
        // goes on. Only the salt tells them apart.
        let mut io = DevIo::new(MemDevice::new(AREA, 8));
        let payload = [3u8; SECTOR_SIZE / 4 - RECORD_HEADER];
        let mut old = Wal::new(0, AREA, 1, 1, 1 << 20, SALT);
        for _ in 0..8 {
            old.append(&payload);
        }
        old.commit(&mut io).unwrap();
        let mut new = Wal::new(0, AREA, 1, 1, 1 << 20, SALT + 1);
        for _ in 0..4 {
            new.append(&payload);
        }
        new.commit(&mut io).unwrap();
        let s = Wal::scan(&mut io, 0, AREA, 1, 1, SALT + 1).unwrap();
        assert_eq!(s.records.len(), 4, "records of the old format replayed");
        assert_eq!(s.tail, SECTOR_SIZE as u64);
    }

    #[test]
    fn the_length_is_covered_by_the_checksum() {
        let mut io = DevIo::new(MemDevice::new(AREA, 8));
        let mut wal = Wal::new(0, AREA, 1, 1, 1 << 20, SALT);
        wal.append(&[7u8; 100]);
        wal.commit(&mut io).unwrap();
        let mut bytes = io.device().peek(0, SECTOR_SIZE);
        // A shorter length over the same bytes: gen, lsn and a prefix of the
        // payload still match, and only the length's coverage catches it.
        bytes[0..4].copy_from_slice(&50u32.to_le_bytes());
        let req = IoRequest {
            tag: 0,
            kind: IoKind::Write,
            offset: 0,
            buf: AlignedBuf::from_slice(&bytes),
        };
        io.run(vec![req]).pop().unwrap().result.unwrap();
        assert!(scan(&mut io, 1).records.is_empty());
    }

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let dev = MemDevice::new(AREA, 8);
        let handle = dev.handle();
        let mut io = DevIo::new(dev);
        let mut wal = Wal::new(0, AREA, 1, 1, 1 << 20, SALT);
        wal.append(b"first");
        wal.commit(&mut io).unwrap();
        let durable_tail = wal.tail;
        wal.append(&[9u8; 10_000]);
        wal.commit(&mut io).unwrap();
        // Corrupt one byte of the second record's payload: scan stops after the first.
        let mut io2 = DevIo::new(handle.crash(0));
        let mut bytes = io2.device().peek(0, SECTOR_SIZE * 4);
        bytes[durable_tail as usize + RECORD_HEADER + 5000] ^= 0xff;
        let req = IoRequest {
            tag: 0,
            kind: IoKind::Write,
            offset: 0,
            buf: AlignedBuf::from_slice(&bytes),
        };
        io2.run(vec![req]).pop().unwrap().result.unwrap();
        let s = Wal::scan(&mut io2, 0, AREA, 1, 1, SALT).unwrap();
        assert_eq!(s.records, vec![(1, b"first".to_vec())]);
        assert_eq!(s.tail, durable_tail);
        // Resume after the cut: the next record replaces the torn one.
        let mut wal = Wal::new(0, AREA, 1, 1, 1 << 20, SALT);
        let partial =
            bytes[(s.tail - s.tail % SECTOR_SIZE as u64) as usize..s.tail as usize].to_vec();
        wal.resume(s.tail, 2, &partial);
        wal.append(b"second");
        wal.commit(&mut io2).unwrap();
        let s = Wal::scan(&mut io2, 0, AREA, 1, 1, SALT).unwrap();
        assert_eq!(s.records, vec![(1, b"first".to_vec()), (2, b"second".to_vec())]);
    }

    #[test]
    fn unsynced_group_may_vanish_whole_but_never_half() {
        let dev = MemDevice::new(AREA, 8);
        let handle = dev.handle();
        let mut io = DevIo::new(dev);
        let mut wal = Wal::new(0, AREA, 1, 1, 1 << 20, SALT);
        wal.append(b"durable");
        wal.commit(&mut io).unwrap();
        handle.freeze_after_writes(1); // the group's write lands, its sync does not
        for _ in 0..20 {
            wal.append(&[5u8; 3000]);
        }
        wal.commit(&mut io).unwrap();
        for seed in 0..30 {
            let mut io = DevIo::new(handle.crash(seed));
            let s = Wal::scan(&mut io, 0, AREA, 1, 1, SALT).unwrap();
            assert_eq!(s.records[0].1, b"durable");
            assert!(
                s.records[1..].iter().all(|(_, p)| p == &[5u8; 3000]),
                "seed {seed}: a torn record replayed"
            );
        }
    }
}
