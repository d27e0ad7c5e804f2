//! Checkpoint encoding of the shard tables (layout in `docs/format.md`):
//! seven sections, each a `u64` count followed by its entries. A checkpoint
//! written before trims existed ends after the sixth; it loads with no trims.

use std::collections::BTreeMap;

use pfs_core::{BlockIndex, InodeId};

use super::Shard;
use crate::device::Device;
use crate::error::StoreError;
use crate::slots::SPLIT;
use crate::wal::record::{
    put_bytes8, put_run, put_u32, put_u64, take, take_bytes8, take_run, take_u32, take_u64, Extent,
};

/// Checkpoint bytes of one inode-table entry.
pub const INODE_BYTES: u64 = 16;
/// Checkpoint bytes of one block-map entry.
pub const BLOCK_BYTES: u64 = 32;
/// Checkpoint bytes of one extent entry.
pub const EXTENT_BYTES: u64 = 40;
/// Checkpoint bytes of one trim entry.
pub const TRIM_BYTES: u64 = 16;

/// Checkpoint bytes of one dentry.
pub fn dentry_bytes(name: &[u8]) -> u64 {
    8 + 1 + name.len() as u64 + 8
}

/// Checkpoint bytes of one cross-shard transaction record.
pub fn txn_bytes(data: &[u8]) -> u64 {
    8 + 4 + data.len() as u64
}

/// Checkpoint bytes of one extended attribute.
pub fn xattr_bytes(name: &[u8], value: &[u8]) -> u64 {
    8 + 1 + name.len() as u64 + 4 + value.len() as u64
}

/// Entries a checkpoint encodes in one slice, between requests.
pub const ENCODE_SLICE: usize = 4096;

/// A checkpoint's image of the tables, encoded a slice at a time while
/// operations go on (`checkpoint.rs`).
///
/// The image is *fuzzy*: an entry encoded after an operation changed it holds
/// the new value, one encoded before holds the old, and an entry made after
/// the snapshot may be in it or not. Recovery loads the image and replays the
/// log from the snapshot's first record, and every change is a put or a
/// delete of one key (`Change`), so a replayed change that the image already
/// holds sets the same value again: each key ends as its last logged change
/// left it, or as the snapshot had it when no change followed. The checkpoint
/// header names the image only once every record logged before the image was
/// complete is durable, so a change the image holds is never missing from
/// the log after a crash.
///
/// The hash tables (the inodes, the inodes with extended attributes, and
/// cART's table of directories) are 64 hash tables each (`slots.rs`); each
/// part's keys are listed when the walk reaches it, into vectors kept from
/// one checkpoint to the next, so the snapshot lists nothing. A listed key is
/// encoded with its value when its slice runs, or skipped if it is gone by
/// then; a key made after the snapshot is in the log. The ordered tables are
/// walked from the last key encoded, the dentries directory by directory from
/// the last name encoded.
pub(super) struct Encoder {
    out: Vec<u8>,
    section: u8,
    count_at: usize,
    count: u64,
    /// The checksum of the finished sections, and of the current section's
    /// entries up to `crc_at` (its count is patched in when it ends), so the
    /// image's checksum is computed a slice at a time too.
    crc: u32,
    entries_crc: u32,
    crc_at: usize,
    /// Section 0: the directories with names (cART's table of directories),
    /// and the last name encoded in the one the walk is at.
    parents: PartWalk,
    after_name: Option<Vec<u8>>,
    /// Section 1: the inodes (the inode table).
    inos: PartWalk,
    /// Sections 2, 3, 5 and 6: the last key encoded.
    after_key: Option<(u64, u64)>,
    /// Section 4: the inodes with extended attributes.
    xattr_inos: PartWalk,
}

/// The walk over the keys of a table split in [`SPLIT`] parts (`slots.rs`):
/// one part's keys are listed, as they are then, when the walk reaches it (a
/// 64th of them, so listing is a slice's work too). A key there since the
/// snapshot and unchanged is listed; one made or removed since is the log's.
#[derive(Debug)]
struct PartWalk {
    keys: Vec<InodeId>,
    at: usize,
    part: usize,
}

impl PartWalk {
    /// A walk from the first part, listing into `keys` (a vector kept from
    /// one checkpoint to the next).
    fn new(mut keys: Vec<InodeId>) -> PartWalk {
        keys.clear();
        PartWalk { keys, at: 0, part: 0 }
    }

    /// The key the walk is at; the next parts' keys are listed by `list` as
    /// needed. `None` once every part is walked.
    fn peek(&mut self, mut list: impl FnMut(usize, &mut Vec<InodeId>)) -> Option<InodeId> {
        while self.at == self.keys.len() {
            if self.part == SPLIT {
                return None;
            }
            self.keys.clear();
            list(self.part, &mut self.keys);
            self.part += 1;
            self.at = 0;
        }
        Some(self.keys[self.at])
    }

    /// On to the next key.
    fn advance(&mut self) {
        self.at += 1;
    }
}

/// The vectors an [`Encoder`] lists the hash tables' keys into, and the
/// buffer of the last image once it was written, kept by the shard between
/// checkpoints: each is as large as the tables, and freeing one at once
/// (unmapping tens of megabytes: 4-6 ms at a million files) would stop the
/// worker for as long. An image that outgrew the buffer gets a new one half
/// as large again, and the old one is given back a few megabytes per poll
/// (`Shard::release_image`).
#[derive(Debug, Default)]
pub(super) struct KeyLists {
    parents: Vec<InodeId>,
    inos: Vec<InodeId>,
    xattr_inos: Vec<InodeId>,
    pub(super) image: Vec<u8>,
}

/// Sections of the image, in order.
const SECTIONS: u8 = 7;

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("bytes", &self.out.len())
            .field("section", &self.section)
            .finish_non_exhaustive()
    }
}

/// Bytes to reserve for an image of `s`'s tables: a quarter more than they
/// hold now, for entries made ahead of the walk while others are removed
/// behind it. Growing a large image later copies it all, a stop of about a
/// millisecond a megabyte.
pub(super) fn image_room<D: Device>(s: &Shard<D>) -> usize {
    (s.table_bytes + s.table_bytes / 4 + (64 << 10)).min(s.ckpt_image_limit) as usize
}

impl Encoder {
    /// Starts the image of `s`'s tables as they are now, listing keys into
    /// the vectors `lists` holds (given back by [`finish`](Self::finish)).
    pub(super) fn new<D: Device>(s: &Shard<D>, lists: KeyLists) -> Encoder {
        let room = image_room(s);
        let KeyLists { parents, inos, xattr_inos, image: mut out } = lists;
        out.clear();
        out.reserve(room);
        put_u64(&mut out, 0);
        Encoder {
            out,
            section: 0,
            count_at: 0,
            count: 0,
            crc: 0,
            entries_crc: 0,
            crc_at: 8,
            parents: PartWalk::new(parents),
            after_name: None,
            inos: PartWalk::new(inos),
            after_key: None,
            xattr_inos: PartWalk::new(xattr_inos),
        }
    }

    /// Bytes encoded so far.
    pub(super) fn len(&self) -> usize {
        self.out.len()
    }

    /// The crc32c of the image, once [`done`](Self::done).
    pub(super) fn crc(&self) -> u32 {
        self.crc
    }

    /// Whether every section is encoded.
    pub(super) fn done(&self) -> bool {
        self.section == SECTIONS
    }

    /// The image (complete once [`done`](Self::done)), and the key lists
    /// for the next.
    pub(super) fn finish(self) -> (Vec<u8>, KeyLists) {
        let lists = KeyLists {
            parents: self.parents.keys,
            inos: self.inos.keys,
            xattr_inos: self.xattr_inos.keys,
            image: Vec::new(),
        };
        (self.out, lists)
    }

    /// Encodes about `budget` more entries of `s`'s tables as they are now;
    /// returns whether the image is complete.
    pub(super) fn step<D: Device>(&mut self, s: &Shard<D>, budget: usize) -> bool {
        let mut left = budget;
        while self.section < SECTIONS && left > 0 {
            let finished = match self.section {
                0 => self.dentries(s, &mut left),
                1 => self.inodes(s, &mut left),
                2 => self.ordered(&s.blocks, &mut left, |out, (i, b), run| {
                    put_u64(out, i.0);
                    put_u64(out, b.0);
                    put_run(out, run);
                }),
                3 => self.ordered(&s.extents, &mut left, |out, (i, o), e| {
                    put_u64(out, i.0);
                    put_u64(out, *o);
                    put_u32(out, e.len);
                    put_u32(out, e.skip);
                    put_run(out, &e.run);
                }),
                4 => self.xattrs(s, &mut left),
                5 => self.ordered(&s.txns, &mut left, |out, id, data| {
                    put_u64(out, *id);
                    put_u32(out, data.len() as u32);
                    out.extend_from_slice(data);
                }),
                _ => self.ordered(&s.trims, &mut left, |out, i, from| {
                    put_u64(out, i.0);
                    put_u64(out, *from);
                }),
            };
            if finished {
                let count = self.count.to_le_bytes();
                self.out[self.count_at..self.count_at + 8].copy_from_slice(&count);
                self.checksum_entries();
                let entries = self.out.len() - self.count_at - 8;
                let section =
                    crc32c::crc32c_combine(crc32c::crc32c(&count), self.entries_crc, entries);
                self.crc = if self.section == 0 {
                    section
                } else {
                    crc32c::crc32c_combine(self.crc, section, entries + 8)
                };
                self.section += 1;
                self.after_key = None;
                if self.section < SECTIONS {
                    self.count_at = self.out.len();
                    self.count = 0;
                    put_u64(&mut self.out, 0);
                    self.crc_at = self.out.len();
                    self.entries_crc = 0;
                }
            }
        }
        self.checksum_entries();
        self.done()
    }

    /// Adds the entries encoded since the last call to the current
    /// section's checksum.
    fn checksum_entries(&mut self) {
        if self.section < SECTIONS {
            self.entries_crc = crc32c::crc32c_append(self.entries_crc, &self.out[self.crc_at..]);
            self.crc_at = self.out.len();
        }
    }

    fn dentries<D: Device>(&mut self, s: &Shard<D>, left: &mut usize) -> bool {
        loop {
            let Some(parent) = self.parents.peek(|p, out| out.extend(s.dentries.part_parents(p)))
            else {
                return true;
            };
            if *left == 0 {
                return false;
            }
            let (out, count) = (&mut self.out, &mut self.count);
            let mut stopped_at = None;
            s.dentries.for_each_from(parent, self.after_name.as_deref(), |name, value| {
                put_u64(out, parent.0);
                put_bytes8(out, name);
                put_u64(out, value);
                *count += 1;
                *left -= 1;
                if *left == 0 {
                    stopped_at = Some(name.to_vec());
                    return false;
                }
                true
            });
            match stopped_at {
                Some(name) => self.after_name = Some(name),
                None => {
                    self.parents.advance();
                    self.after_name = None;
                }
            }
        }
    }

    fn inodes<D: Device>(&mut self, s: &Shard<D>, left: &mut usize) -> bool {
        loop {
            let Some(ino) = self.inos.peek(|p, out| out.extend(s.inode_slots.part_keys(p))) else {
                return true;
            };
            if *left == 0 {
                return false;
            }
            self.inos.advance();
            if let Some(slot) = s.inode_slots.get(&ino) {
                put_u64(&mut self.out, ino.0);
                put_u64(&mut self.out, *slot);
                self.count += 1;
            }
            *left -= 1;
        }
    }

    fn xattrs<D: Device>(&mut self, s: &Shard<D>, left: &mut usize) -> bool {
        loop {
            let Some(ino) = self.xattr_inos.peek(|p, out| out.extend(s.xattrs.part_keys(p))) else {
                return true;
            };
            if *left == 0 {
                return false;
            }
            self.xattr_inos.advance();
            for (name, value) in s.xattrs.get(&ino).into_iter().flatten() {
                put_u64(&mut self.out, ino.0);
                put_bytes8(&mut self.out, name);
                put_u32(&mut self.out, value.len() as u32);
                self.out.extend_from_slice(value);
                self.count += 1;
                *left = left.saturating_sub(1);
            }
        }
    }

    /// Walks an ordered table from the key after the last one encoded.
    /// `Cursor` turns a key into the two numbers kept between slices and back.
    fn ordered<K: Cursor, V>(
        &mut self,
        table: &BTreeMap<K, V>,
        left: &mut usize,
        mut put: impl FnMut(&mut Vec<u8>, &K, &V),
    ) -> bool {
        use std::ops::Bound::{Excluded, Unbounded};
        let from = self.after_key.map_or(Unbounded, |k| Excluded(K::from_pair(k)));
        for (k, v) in table.range((from, Unbounded)) {
            if *left == 0 {
                return false;
            }
            put(&mut self.out, k, v);
            self.after_key = Some(k.pair());
            self.count += 1;
            *left -= 1;
        }
        true
    }
}

/// A key of an ordered table as the pair of numbers an [`Encoder`] keeps.
trait Cursor: Ord + Sized {
    fn pair(&self) -> (u64, u64);
    fn from_pair(p: (u64, u64)) -> Self;
}

impl Cursor for (InodeId, BlockIndex) {
    fn pair(&self) -> (u64, u64) {
        (self.0 .0, self.1 .0)
    }
    fn from_pair(p: (u64, u64)) -> Self {
        (InodeId(p.0), BlockIndex(p.1))
    }
}

impl Cursor for (InodeId, u64) {
    fn pair(&self) -> (u64, u64) {
        (self.0 .0, self.1)
    }
    fn from_pair(p: (u64, u64)) -> Self {
        (InodeId(p.0), p.1)
    }
}

impl Cursor for u64 {
    fn pair(&self) -> (u64, u64) {
        (*self, 0)
    }
    fn from_pair(p: (u64, u64)) -> Self {
        p.0
    }
}

impl Cursor for InodeId {
    fn pair(&self) -> (u64, u64) {
        (self.0, 0)
    }
    fn from_pair(p: (u64, u64)) -> Self {
        InodeId(p.0)
    }
}

impl<D: Device> Shard<D> {
    pub(super) fn load_tables(&mut self, mut buf: &[u8]) -> Result<(), StoreError> {
        let b = &mut buf;
        // Every count is bounded by the bytes left, so a corrupt count cannot
        // make us loop or allocate without end.
        let count = |b: &mut &[u8], min_entry: usize| -> Result<u64, StoreError> {
            let n = take_u64(b)?;
            if n > (b.len() / min_entry) as u64 {
                return Err(StoreError::Corruption(format!(
                    "checkpoint count {n} exceeds the bytes left"
                )));
            }
            Ok(n)
        };
        for _ in 0..count(b, 17)? {
            let parent = InodeId(take_u64(b)?);
            let name = take_bytes8(b)?;
            let value = take_u64(b)?;
            self.table_bytes += dentry_bytes(&name);
            self.dentries.insert(parent, &name, value);
        }
        for _ in 0..count(b, 16)? {
            let ino = InodeId(take_u64(b)?);
            let slot = take_u64(b)?;
            self.table_bytes += INODE_BYTES;
            self.inode_slots.insert(ino, slot);
        }
        for _ in 0..count(b, 32)? {
            let ino = InodeId(take_u64(b)?);
            let block = BlockIndex(take_u64(b)?);
            let run = take_run(b)?;
            self.table_bytes += BLOCK_BYTES;
            self.blocks.insert((ino, block), run);
        }
        for _ in 0..count(b, 40)? {
            let ino = InodeId(take_u64(b)?);
            let offset = take_u64(b)?;
            let extent = Extent { len: take_u32(b)?, skip: take_u32(b)?, run: take_run(b)? };
            self.table_bytes += EXTENT_BYTES;
            self.extents.insert((ino, offset), extent);
            *self.run_refs.entry(extent.run.page).or_default() += 1;
        }
        for _ in 0..count(b, 13)? {
            let ino = InodeId(take_u64(b)?);
            let name = take_bytes8(b)?;
            let len = take_u32(b)? as usize;
            let value = take(b, len)?.to_vec();
            self.table_bytes += xattr_bytes(&name, &value);
            self.xattrs.get_or_default(ino).insert(name, value);
        }
        for _ in 0..count(b, 12)? {
            let id = take_u64(b)?;
            let len = take_u32(b)? as usize;
            let data = take(b, len)?.to_vec();
            self.table_bytes += txn_bytes(&data);
            if let Some(dir) = super::txn::sealed_dir(id, &data) {
                *self.sealed.entry(dir).or_default() += 1;
            }
            self.txns.insert(id, data);
        }
        if !b.is_empty() {
            for _ in 0..count(b, 16)? {
                let ino = InodeId(take_u64(b)?);
                let from = take_u64(b)?;
                self.table_bytes += TRIM_BYTES;
                self.trims.insert(ino, from);
            }
        }
        if !b.is_empty() {
            return Err(StoreError::Corruption(format!(
                "{} trailing bytes after checkpoint tables",
                b.len()
            )));
        }
        Ok(())
    }
}
