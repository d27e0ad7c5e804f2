//! Unit tests of the shard API on `MemDevice`.

use pfs_core::wire::ALL_BLOCKS;
use pfs_core::{FileLayout, FileType, FsError, InodeId, SetAttr, ShardId};

use super::*;
use crate::device::MemDevice;

const ZONE: u64 = 64 << 20;
const ROOT: InodeId = InodeId::ROOT;

fn small_opts() -> ShardOptions {
    ShardOptions {
        icache_blocks: 16,
        dirty_ratio: 0.25,
        wal_group_bytes: 64 << 10,
        read_cache_pages: 64,
        read_ahead_factor: 10,
    }
}

fn fresh() -> (Shard<MemDevice>, MemDevice) {
    fresh_sized(ZONE)
}

fn fresh_sized(zone: u64) -> (Shard<MemDevice>, MemDevice) {
    let dev = MemDevice::new(zone, 64);
    let handle = dev.handle();
    let shard = Shard::format(dev, &FormatOptions::new(ShardId(0), zone), small_opts()).unwrap();
    (shard, handle)
}

fn reopen(mut shard: Shard<MemDevice>) -> Shard<MemDevice> {
    shard.commit().unwrap();
    Shard::open(shard.into_device(), 0, small_opts()).unwrap()
}

#[test]
fn create_lookup_getattr_unlink() {
    let (mut s, _) = fresh();
    let a = s.create(ROOT, b"a.txt", CreateArgs::file(0o644)).unwrap();
    assert_eq!(a.kind, FileType::Regular);
    assert_eq!(s.lookup(ROOT, b"a.txt").unwrap().ino, a.ino);
    assert_eq!(s.getattr(a.ino).unwrap().perm, 0o644);
    assert_eq!(s.create(ROOT, b"a.txt", CreateArgs::file(0o644)).unwrap_err(), FsError::Exists);
    s.unlink(ROOT, b"a.txt").unwrap();
    assert_eq!(s.lookup(ROOT, b"a.txt").unwrap_err(), FsError::NotFound);
    assert_eq!(s.getattr(a.ino).unwrap_err(), FsError::NotFound);
}

#[test]
fn posix_errors() {
    let (mut s, _) = fresh();
    let d = s.create(ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
    let f = s.create(d.ino, b"f", CreateArgs::file(0o600)).unwrap();
    assert_eq!(s.getattr(ROOT).unwrap().nlink, 3);
    assert_eq!(s.rmdir(ROOT, b"d").unwrap_err(), FsError::NotEmpty);
    assert_eq!(s.unlink(ROOT, b"d").unwrap_err(), FsError::IsDir);
    assert_eq!(s.rmdir(d.ino, b"f").unwrap_err(), FsError::NotDir);
    assert_eq!(s.create(f.ino, b"x", CreateArgs::file(0o600)).unwrap_err(), FsError::NotDir);
    assert_eq!(s.lookup(ROOT, &[b'n'; 256]).unwrap_err(), FsError::NameTooLong);
    assert!(matches!(s.create(ROOT, b"a/b", CreateArgs::file(0)), Err(FsError::Invalid(_))));
    assert!(matches!(
        s.rename(ROOT, b"d", d.ino, b"inside", RenameFlags::default()),
        Err(FsError::Invalid(_))
    ));
    assert_eq!(s.write(d.ino, 0, b"x").unwrap_err(), FsError::IsDir);
    s.unlink(d.ino, b"f").unwrap();
    s.rmdir(ROOT, b"d").unwrap();
    assert_eq!(s.getattr(ROOT).unwrap().nlink, 2);
}

#[test]
fn rename_rules_and_flags() {
    let (mut s, _) = fresh();
    let a = s.create(ROOT, b"a", CreateArgs::file(0o644)).unwrap();
    let b = s.create(ROOT, b"b", CreateArgs::file(0o644)).unwrap();
    let d = s.create(ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
    let noreplace = RenameFlags { noreplace: true, exchange: false };
    let exchange = RenameFlags { noreplace: false, exchange: true };
    assert_eq!(s.rename(ROOT, b"a", ROOT, b"b", noreplace).unwrap_err(), FsError::Exists);
    assert_eq!(
        s.rename(ROOT, b"a", ROOT, b"d", RenameFlags::default()).unwrap_err(),
        FsError::IsDir
    );
    assert_eq!(
        s.rename(ROOT, b"d", ROOT, b"a", RenameFlags::default()).unwrap_err(),
        FsError::NotDir
    );
    s.rename(ROOT, b"a", ROOT, b"b", exchange).unwrap();
    assert_eq!(s.lookup(ROOT, b"a").unwrap().ino, b.ino);
    assert_eq!(s.lookup(ROOT, b"b").unwrap().ino, a.ino);
    s.rename(ROOT, b"a", ROOT, b"b", RenameFlags::default()).unwrap();
    assert_eq!(s.lookup(ROOT, b"b").unwrap().ino, b.ino);
    assert_eq!(s.getattr(a.ino).unwrap_err(), FsError::NotFound, "replaced file is gone");
    s.rename(ROOT, b"b", d.ino, b"moved", RenameFlags::default()).unwrap();
    assert_eq!(s.lookup(d.ino, b"moved").unwrap().ino, b.ino);
    assert_eq!(s.rename(ROOT, b"zz", ROOT, b"y", exchange).unwrap_err(), FsError::NotFound);
}

#[test]
fn readdir_resumes_in_name_order() {
    let (mut s, _) = fresh();
    for i in 0..300 {
        s.create(ROOT, format!("f{i:04}").as_bytes(), CreateArgs::file(0o644)).unwrap();
    }
    let mut names = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = s.readdir(ROOT, after.as_deref(), 64).unwrap();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().name.clone());
        names.extend(page.into_iter().map(|e| e.name));
    }
    let want: Vec<Vec<u8>> = (0..300).map(|i| format!("f{i:04}").into_bytes()).collect();
    assert_eq!(names, want);
}

#[test]
fn data_block_layout_holes_overwrite_truncate() {
    let (mut s, _) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    let bs = s.geometry().block_size as u64;
    let pattern: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    s.write(f.ino, 10, &pattern).unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().size, 200_010);
    let back = s.read(f.ino, 0, 300_000).unwrap();
    assert_eq!(back.len(), 200_010);
    assert!(back[..10].iter().all(|&b| b == 0), "hole reads as zeros");
    assert_eq!(&back[10..], &pattern[..]);
    // Partial overwrite inside a block merges with the old data.
    s.write(f.ino, bs + 5, b"HELLO").unwrap();
    let back = s.read(f.ino, bs, 20).unwrap();
    assert_eq!(&back[5..10], b"HELLO");
    assert_eq!(back[0], pattern[(bs - 10) as usize]);
    // A far write leaves a hole of zeros.
    s.write(f.ino, 10 * bs, b"end").unwrap();
    assert!(s.read(f.ino, 5 * bs, 100).unwrap().iter().all(|&b| b == 0));
    let free_before = s.statfs().blocks_free;
    s.setattr(f.ino, SetAttr { size: Some(100), ..Default::default() }).unwrap();
    s.commit().unwrap();
    assert!(s.statfs().blocks_free > free_before, "truncate frees pages");
    // Extending again must show zeros, not the old bytes.
    s.setattr(f.ino, SetAttr { size: Some(5000), ..Default::default() }).unwrap();
    let back = s.read(f.ino, 0, 5000).unwrap();
    assert_eq!(&back[10..100], &pattern[..90]);
    assert!(back[100..].iter().all(|&b| b == 0), "bytes past a truncate read as zeros");
}

#[test]
fn data_io_layout_overlaps_and_trims() {
    let (mut s, _) = fresh();
    s.setxattr(ROOT, b"user.pfs.file_layout", b"io", XattrFlags::default()).unwrap();
    let f = s.create(ROOT, b"shared", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.layouts(f.ino).unwrap().1, FileLayout::Io);
    let chunk = 47008usize;
    for i in (0..8u64).rev() {
        s.write(f.ino, i * chunk as u64, &vec![i as u8 + 1; chunk]).unwrap();
    }
    let all = s.read(f.ino, 0, 8 * chunk).unwrap();
    for i in 0..8 {
        assert!(all[i * chunk..(i + 1) * chunk].iter().all(|&b| b == i as u8 + 1));
    }
    // An overlapping write in the middle of an extent splits it.
    s.write(f.ino, 100, b"zz").unwrap();
    let head = s.read(f.ino, 98, 6).unwrap();
    assert_eq!(head, vec![1, 1, b'z', b'z', 1, 1]);
    assert!(s.lookup(ROOT, b"shared").is_ok(), "before reopen");
    let mut s = reopen(s);
    assert!(s.lookup(ROOT, b"shared").is_ok(), "after reopen");
    let all2 = s.read(f.ino, 0, 8 * chunk).unwrap();
    assert_eq!(&all2[100..102], b"zz");
    assert_eq!(all2[chunk * 7], 8);
    s.unlink(ROOT, b"shared").unwrap();
    s.commit().unwrap();
    assert_eq!(s.statfs().blocks_free, s.statfs().blocks, "unlink frees every page of the file");
}

#[test]
fn symlink_and_xattrs() {
    let (mut s, _) = fresh();
    let l = s.symlink(ROOT, b"ln", b"/some/target", 0, 0).unwrap();
    assert_eq!(l.kind, FileType::Symlink);
    assert_eq!(s.readlink(l.ino).unwrap(), b"/some/target");
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    s.setxattr(f.ino, b"user.a", b"1", XattrFlags::default()).unwrap();
    assert_eq!(
        s.setxattr(f.ino, b"user.a", b"2", XattrFlags { create: true, replace: false })
            .unwrap_err(),
        FsError::Exists
    );
    assert_eq!(
        s.setxattr(f.ino, b"user.b", b"2", XattrFlags { create: false, replace: true })
            .unwrap_err(),
        FsError::NoAttr
    );
    assert_eq!(s.getxattr(f.ino, b"user.a").unwrap(), b"1");
    assert_eq!(s.listxattr(f.ino).unwrap(), vec![b"user.a".to_vec()]);
    s.removexattr(f.ino, b"user.a").unwrap();
    assert_eq!(s.getxattr(f.ino, b"user.a").unwrap_err(), FsError::NoAttr);
    assert_eq!(s.getxattr(ROOT, b"user.pfs.dir_layout").unwrap(), b"bigdir");
    assert!(matches!(
        s.setxattr(ROOT, b"user.pfs.dir_layout", b"huge", XattrFlags::default()),
        Err(FsError::Invalid(_))
    ));
}

#[test]
fn everything_survives_clean_reopen_and_wal_replay() {
    let (mut s, handle) = fresh();
    let d = s.create(ROOT, b"dir", CreateArgs::dir(0o755)).unwrap();
    let f = s.create(d.ino, b"file", CreateArgs::file(0o640)).unwrap();
    s.write(f.ino, 0, b"persistent bytes").unwrap();
    s.setxattr(f.ino, b"user.k", b"v", XattrFlags::default()).unwrap();
    let before = s.checkpoints();
    s.checkpoint().unwrap();
    // The operator sees it: counted, with its tables' size and its time.
    let st = s.stats();
    assert_eq!((s.checkpoints(), st.checkpoints), (before + 1, before + 1));
    assert!(st.last_checkpoint_bytes > 0, "{st:?}");
    assert!(st.last_checkpoint_us <= st.max_checkpoint_us, "{st:?}");
    assert!(st.last_snapshot_us <= st.max_snapshot_us, "{st:?}");
    // More work after the checkpoint: only in the WAL.
    let g = s.create(d.ino, b"later", CreateArgs::file(0o600)).unwrap();
    s.write(g.ino, 70_000, b"tail").unwrap();
    s.commit().unwrap();
    drop(s);
    // Crash: anything unsynced may be lost, but all above was committed.
    let mut s = Shard::open(handle.crash(7), 0, small_opts()).unwrap();
    assert!(s.stats().replayed > 0, "the records after the checkpoint were replayed");
    assert_eq!(s.lookup(d.ino, b"file").unwrap().ino, f.ino);
    assert_eq!(s.read(f.ino, 0, 100).unwrap(), b"persistent bytes");
    assert_eq!(s.getxattr(f.ino, b"user.k").unwrap(), b"v");
    assert_eq!(s.getattr(g.ino).unwrap().size, 70_004);
    assert_eq!(s.read(g.ino, 70_000, 10).unwrap(), b"tail");
    // New inode numbers never reuse old ones.
    let h = s.create(ROOT, b"new", CreateArgs::file(0o600)).unwrap();
    assert!(h.ino > g.ino);
}

#[test]
fn uncommitted_work_may_vanish_but_never_tears() {
    let (mut s, handle) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    s.write(f.ino, 0, &[1u8; 100_000]).unwrap();
    s.commit().unwrap();
    s.write(f.ino, 0, &[2u8; 100_000]).unwrap(); // not committed
    drop(s);
    for seed in 0..20 {
        let mut s = Shard::open(handle.crash(seed), 0, small_opts()).unwrap();
        let data = s.read(f.ino, 0, 100_000).unwrap();
        assert!(
            data.iter().all(|&b| b == 1) || data.iter().all(|&b| b == 2),
            "seed {seed}: torn write"
        );
    }
}

#[test]
fn a_data_write_that_fails_after_its_reply_fails_the_shard_at_the_commit() {
    use crate::device::{mem::Fault, IoKind};
    let (mut s, handle) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    s.write(f.ino, 0, b"good").unwrap();
    s.commit().unwrap();
    handle.inject(Fault::next(IoKind::Write, 1));
    // Staged: the write is answered before the device has it, and read back
    // from memory.
    s.write(f.ino, 0, &[9u8; 8192]).unwrap();
    assert_eq!(s.read(f.ino, 0, 4).unwrap(), [9u8; 4]);
    assert!(matches!(s.commit(), Err(FsError::Io(_))));
    assert!(s.failure().is_some_and(|w| w.contains("data write")), "{:?}", s.failure());
    assert!(matches!(s.write(f.ino, 0, b"x"), Err(FsError::Io(_))), "stops acknowledging");
    // The log never mapped the lost pages: recovery brings back the commit.
    let mut s = Shard::open(handle.crash(1), 0, small_opts()).unwrap();
    assert_eq!(s.read(f.ino, 0, 100).unwrap(), b"good");
}

#[test]
fn neighbouring_small_writes_reach_the_device_as_one_write() {
    let (mut s, handle) = fresh();
    s.commit().unwrap();
    let before = s.stats().data_writes;
    let mut files = Vec::new();
    for i in 0..40u8 {
        let f = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        s.write(f.ino, 0, &vec![i; 3901]).unwrap();
        files.push(f.ino);
    }
    assert_eq!(s.stats().data_writes, before, "nothing submitted before the commit");
    s.commit().unwrap();
    assert_eq!(s.stats().data_writes - before, 1, "40 one-page runs side by side: one write");
    let mut s = Shard::open(handle.crash(2), 0, small_opts()).unwrap();
    for (i, ino) in files.into_iter().enumerate() {
        assert_eq!(s.read(ino, 0, 5000).unwrap(), vec![i as u8; 3901], "file {i}");
    }
}

#[test]
fn a_read_of_pages_being_written_waits_for_their_write() {
    // The device completes requests in a seeded random order: a read that did
    // not wait could overtake the write of its pages.
    for seed in 0..8 {
        let (mut s, handle) = fresh();
        handle.reorder(Some(seed));
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        // More than a batch: submitted at once, and in flight until polled.
        let data: Vec<u8> = (0..(3 << 20) / 2).map(|i| (i % 251) as u8).collect();
        s.write(f.ino, 0, &data).unwrap();
        assert!(s.stats().data_writes > 0, "seed {seed}: a batch was submitted");
        assert!(s.read(f.ino, 0, data.len()).unwrap() == data, "seed {seed}: read back");
        // A partial write merges a block whose run may still be in flight.
        s.write(f.ino, 100, b"merged").unwrap();
        s.commit().unwrap();
        let got = s.read(f.ino, 0, 200).unwrap();
        assert_eq!(&got[100..106], b"merged", "seed {seed}");
        assert_eq!(&got[..100], &data[..100], "seed {seed}");
    }
}

#[test]
fn full_zone_is_enospc_not_panic() {
    let dev = MemDevice::new(8 << 20, 64);
    let mut fo = FormatOptions::new(ShardId(0), 8 << 20);
    fo.inode_slots = Some(64);
    fo.wal_bytes = Some(1 << 20);
    let mut s = Shard::format(dev, &fo, small_opts()).unwrap();
    let mut created = 0;
    let err = loop {
        match s.create(ROOT, format!("f{created}").as_bytes(), CreateArgs::file(0o644)) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(err, FsError::NoSpace);
    assert_eq!(created, 63, "64 slots minus the root");
    let f = s.lookup(ROOT, b"f0").unwrap().ino;
    let big = vec![7u8; 1 << 20];
    let mut off = 0;
    let err = loop {
        match s.write(f, off, &big) {
            Ok(_) => off += big.len() as u64,
            Err(e) => break e,
        }
    };
    assert_eq!(err, FsError::NoSpace);
    assert!(off > 0);
}

#[test]
fn icache_counts_hits_and_writes_back() {
    let (mut s, _) = fresh();
    for i in 0..2000 {
        s.create(ROOT, format!("n{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        if i % 100 == 0 {
            s.commit().unwrap();
        }
    }
    s.commit().unwrap();
    let st = s.stats().icache;
    assert!(st.hits > st.misses, "{st:?}");
    assert!(st.writebacks > 0, "dirty cap forced write-back: {st:?}");
    assert!(st.evictions > 0, "2000 inodes over 16 blocks of 16 evict: {st:?}");
}

#[test]
fn metadata_read_error_fails_only_that_lookup() {
    use crate::device::{Fault, IoKind};
    let (mut s, handle) = fresh();
    let mut inos = Vec::new();
    for i in 0..1500 {
        inos.push(s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap().ino);
    }
    s.checkpoint().unwrap();
    // Slot 101 is on page 6, evicted long ago (32 blocks hold 512 inodes; page 0
    // holds the root, touched by every create).
    let g = *s.geometry();
    let meta = g.offset(g.meta_page)..g.offset(g.meta_page + g.meta_pages);
    handle.inject(Fault::always(Some(IoKind::Read), meta));
    assert!(matches!(s.getattr(inos[100]), Err(FsError::Io(_))));
    assert_eq!(s.getattr(inos[1499]).unwrap().ino, inos[1499], "cached inodes still answer");
    handle.clear_faults();
    assert_eq!(s.getattr(inos[100]).unwrap().ino, inos[100], "the shard recovered from the error");
    s.create(ROOT, b"after", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
}

#[test]
fn data_of_a_file_homed_on_another_shard() {
    let (mut s, _) = fresh();
    let ino = InodeId::compose(ShardId(9), 42); // not on this shard
    let bs = s.geometry().block_size as u64;
    s.write_data(ino, FileLayout::Block, 0, b"block zero").unwrap();
    s.write_data(ino, FileLayout::Block, 3 * bs + 10, b"block three").unwrap();
    assert_eq!(s.read_data(ino, FileLayout::Block, 0, 10).unwrap(), b"block zero");
    let hole = s.read_data(ino, FileLayout::Block, bs, 100).unwrap();
    assert_eq!(hole, vec![0u8; 100], "a hole reads as zeros");
    assert_eq!(&s.read_data(ino, FileLayout::Block, 3 * bs + 10, 11).unwrap(), b"block three");
    s.write_data(ino, FileLayout::Io, 5 * bs, &[7u8; 5000]).unwrap();
    assert_eq!(s.read_data(ino, FileLayout::Io, 5 * bs, 5000).unwrap(), vec![7u8; 5000]);
    s.commit().unwrap();
    let used = s.statfs().blocks - s.statfs().blocks_free;
    assert!(used > 0);
    s.truncate_data(ino, FileLayout::Block, 0, 4 * bs).unwrap();
    s.truncate_data(ino, FileLayout::Io, 0, 6 * bs).unwrap();
    s.commit().unwrap();
    assert_eq!(s.statfs().blocks_free, s.statfs().blocks, "every page freed");
    assert_eq!(s.read_data(ino, FileLayout::Block, 0, 10).unwrap(), vec![0u8; 10]);
    let local = s.create(ROOT, b"here", CreateArgs::file(0o644)).unwrap();
    assert!(matches!(
        s.truncate_data(local.ino, FileLayout::Block, 0, 0),
        Err(FsError::Invalid(_))
    ));
}

/// Blocks (or extents) enough that logging all their removals in one record
/// would overflow the record limit (17 bytes each; 128 KiB).
const MANY: u64 = 10_000;
/// A zone with room for two files of `MANY` pages.
const BIG_ZONE: u64 = 192 << 20;

/// A file of `MANY` blocks holding one byte each (few pages, many map entries).
fn many_block_file(s: &mut Shard<MemDevice>, name: &[u8], layout: FileLayout) -> InodeId {
    let args = CreateArgs { layout: Some((Default::default(), layout)), ..CreateArgs::file(0o644) };
    let f = s.create(ROOT, name, args).unwrap();
    let bs = s.geometry().block_size as u64;
    for b in 0..MANY {
        s.write(f.ino, b * bs, &[7]).unwrap();
    }
    s.commit().unwrap();
    f.ino
}

fn run_trims(s: &mut Shard<MemDevice>) -> usize {
    let mut steps = 0;
    while s.has_trims() {
        assert!(s.trim_step().unwrap() > 0, "a trim step makes progress");
        steps += 1;
        assert!(steps <= MANY as usize, "trims do not end");
    }
    steps
}

#[test]
fn removing_a_file_of_many_blocks_frees_them_in_bounded_records() {
    for layout in [FileLayout::Block, FileLayout::Io] {
        let (mut s, _) = fresh_sized(BIG_ZONE);
        let free_before = s.statfs().blocks_free;
        let ino = many_block_file(&mut s, b"big", layout);
        s.setxattr(ino, b"user.k", b"v", XattrFlags::default()).unwrap();
        assert!(s.statfs().blocks_free < free_before);
        // Before the trim table this logged every block in one record and panicked.
        s.unlink(ROOT, b"big").unwrap();
        assert_eq!(s.getattr(ino).unwrap_err(), FsError::NotFound);
        assert!(s.has_trims(), "{layout:?}: the rest is left to a trim");
        let steps = run_trims(&mut s);
        assert!(steps >= 1, "{layout:?}");
        s.commit().unwrap();
        assert_eq!(s.statfs().blocks_free, free_before, "{layout:?}: every page back");
        let s = reopen(s);
        assert_eq!(s.statfs().blocks_free, free_before, "{layout:?}: after reopen");
        assert!(!s.has_trims());
    }
}

#[test]
fn a_trim_cut_by_a_crash_resumes_at_open() {
    for seed in 0..4u64 {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let free_before = s.statfs().blocks_free;
        let bs = s.geometry().block_size as u64;
        let layout = if seed % 2 == 0 { FileLayout::Block } else { FileLayout::Io };
        let keep = many_block_file(&mut s, b"keep", layout);
        let keep_used = free_before - s.statfs().blocks_free;
        many_block_file(&mut s, b"big", layout);
        s.unlink(ROOT, b"big").unwrap();
        s.commit().unwrap();
        drop(s);
        let mut s = Shard::open(handle.crash(seed), 0, small_opts()).unwrap();
        assert!(s.has_trims(), "seed {seed}: the trim is in the log");
        run_trims(&mut s);
        s.commit().unwrap();
        assert_eq!(s.statfs().blocks_free, free_before - keep_used, "seed {seed}");
        assert_eq!(s.read(keep, (MANY - 1) * bs, 1).unwrap(), [7], "seed {seed}");
        let s = reopen(s);
        assert_eq!(s.statfs().blocks_free, free_before - keep_used, "seed {seed}");
    }
}

#[test]
fn truncate_down_then_up_never_shows_old_data() {
    for layout in [FileLayout::Block, FileLayout::Io] {
        let (mut s, _) = fresh_sized(BIG_ZONE);
        let free_before = s.statfs().blocks_free;
        let bs = s.geometry().block_size as u64;
        let ino = many_block_file(&mut s, b"f", layout);
        let size = |size| SetAttr { size: Some(size), ..SetAttr::default() };
        s.setattr(ino, size(10)).unwrap();
        assert!(s.has_trims(), "{layout:?}");
        // Growing the file again must not bring back the freed bytes.
        s.setattr(ino, size(MANY * bs)).unwrap();
        assert!(!s.has_trims(), "{layout:?}: the trim ran before the file grew");
        assert_eq!(s.read(ino, (MANY - 1) * bs, 1).unwrap(), [0], "{layout:?}");
        assert_eq!(s.read(ino, 0, 2).unwrap(), [7, 0], "{layout:?}");
        s.write(ino, 3 * bs, b"new").unwrap();
        assert_eq!(s.read(ino, 3 * bs - 1, 5).unwrap(), [0, b'n', b'e', b'w', 0]);
        s.unlink(ROOT, b"f").unwrap();
        run_trims(&mut s);
        s.commit().unwrap();
        assert_eq!(s.statfs().blocks_free, free_before, "{layout:?}");
    }
}

#[test]
fn huge_sizes_cost_nothing_and_past_the_limit_is_efbig() {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    let size = |size| SetAttr { size: Some(size), ..SetAttr::default() };
    assert_eq!(s.setattr(f.ino, size(data::MAX_FILE_SIZE + 1)).unwrap_err(), FsError::FileTooLarge);
    assert_eq!(s.setattr(f.ino, size(999_999_999_999_999)).unwrap_err(), FsError::FileTooLarge);
    assert_eq!(s.write(f.ino, data::MAX_FILE_SIZE, b"x").unwrap_err(), FsError::FileTooLarge);
    // A file of the largest size with one byte at each end: every loop is
    // bounded by the two blocks, not the 2^32 the size spans.
    s.write(f.ino, 0, b"a").unwrap();
    s.write(f.ino, data::MAX_FILE_SIZE - 1, b"z").unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().size, data::MAX_FILE_SIZE);
    s.setattr(f.ino, size(1)).unwrap();
    s.setattr(f.ino, size(data::MAX_FILE_SIZE)).unwrap();
    assert_eq!(s.read(f.ino, data::MAX_FILE_SIZE - 1, 1).unwrap(), [0]);
    s.unlink(ROOT, b"f").unwrap();
    let elsewhere = InodeId::compose(ShardId(9), 1);
    s.write_data(elsewhere, FileLayout::Block, data::MAX_FILE_SIZE - 1, b"z").unwrap();
    s.truncate_data(elsewhere, FileLayout::Block, 0, data::MAX_FILE_SIZE).unwrap();
    s.commit().unwrap();
    assert_eq!(s.statfs().blocks_free, s.statfs().blocks);
}

#[test]
fn hard_links_count_names_and_free_at_the_last() {
    let (mut s, handle) = fresh();
    let free_before = s.statfs().blocks_free;
    let d = s.create(ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    s.write(f.ino, 0, &[5u8; 100_000]).unwrap();
    assert_eq!(s.link(f.ino, d.ino, b"g").unwrap().nlink, 2);
    assert_eq!(s.link(f.ino, ROOT, b"f").unwrap_err(), FsError::Exists);
    assert_eq!(s.link(d.ino, ROOT, b"d2").unwrap_err(), FsError::NotPermitted);
    // A name on this shard for an inode elsewhere, counted there (add_link).
    let far = InodeId::compose(ShardId(9), 7);
    s.link_name(far, FileType::Regular, ROOT, b"far").unwrap();
    assert_eq!(s.lookup(ROOT, b"far").unwrap().ino, far);
    assert_eq!(s.add_link(f.ino).unwrap().nlink, 3);
    assert_eq!(s.drop_orphan(f.ino).unwrap().0, 0, "one of three links dropped: lives on");
    let s2 = reopen(s);
    let mut s = s2;
    assert_eq!(s.getattr(f.ino).unwrap().nlink, 2, "link counts survive a reopen");
    s.unlink(ROOT, b"f").unwrap();
    assert_eq!(s.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(s.read(f.ino, 0, 3).unwrap(), [5, 5, 5]);
    s.unlink(d.ino, b"g").unwrap();
    assert_eq!(s.getattr(f.ino).unwrap_err(), FsError::NotFound);
    s.unlink(ROOT, b"far").unwrap();
    s.commit().unwrap();
    drop(s);
    let s = Shard::open(handle.crash(3), 0, small_opts()).unwrap();
    assert_eq!(s.statfs().blocks_free, free_before, "the last unlink freed the data");
}

#[test]
fn an_io_write_over_many_extents_keeps_its_record_bounded() {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let free_before = s.statfs().blocks_free;
    let args = CreateArgs {
        layout: Some((Default::default(), FileLayout::Io)),
        ..CreateArgs::file(0o644)
    };
    let f = s.create(ROOT, b"f", args).unwrap();
    // 10,000 one-byte extents: removing them in the write's own record would
    // take 170 KB, over the 128 KiB limit (the shard panicked).
    for i in 0..MANY {
        s.write(f.ino, i * 2, &[1]).unwrap();
    }
    s.write(f.ino, 0, &vec![9u8; (2 * MANY) as usize]).unwrap();
    assert_eq!(s.read(f.ino, 0, (2 * MANY) as usize).unwrap(), vec![9u8; (2 * MANY) as usize]);
    s.unlink(ROOT, b"f").unwrap();
    run_trims(&mut s);
    s.commit().unwrap();
    let s = reopen(s);
    assert_eq!(s.statfs().blocks_free, free_before);
}

#[test]
fn failed_sync_fails_the_shard_until_it_is_recovered() {
    use crate::device::{Fault, IoKind};
    let (mut s, handle) = fresh();
    let f = s.create(ROOT, b"kept", CreateArgs::file(0o644)).unwrap();
    s.write(f.ino, 0, b"durable").unwrap();
    s.commit().unwrap();
    s.write(f.ino, 0, b"DROPPED").unwrap();
    s.create(ROOT, b"dropped", CreateArgs::file(0o644)).unwrap();
    handle.inject(Fault::next(IoKind::Sync, 1));
    assert!(matches!(s.commit(), Err(FsError::Io(_))));
    let why = s.failure().expect("a failed sync fails the shard").to_owned();
    assert!(why.contains("commit failed"), "{why}");
    // The device would sync now, but the failed sync forgot writes: a commit that
    // succeeded now would acknowledge what is lost. The shard refuses instead.
    assert!(matches!(s.commit(), Err(FsError::Io(_))));
    assert!(matches!(s.create(ROOT, b"later", CreateArgs::file(0o644)), Err(FsError::Io(_))));
    assert!(s.checkpoint().is_err());
    // Recovery from the log: the state of the last good commit.
    let mut s = Shard::open(handle.crash(7), 0, small_opts()).unwrap();
    assert!(s.failure().is_none());
    assert_eq!(s.read(f.ino, 0, 7).unwrap(), b"durable");
    assert_eq!(s.lookup(ROOT, b"dropped").unwrap_err(), FsError::NotFound);
    s.create(ROOT, b"later", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
}

#[test]
fn symlink_on_a_full_zone_leaves_no_trace() {
    let dev = MemDevice::new(8 << 20, 64);
    let mut fo = FormatOptions::new(ShardId(0), 8 << 20);
    fo.wal_bytes = Some(1 << 20);
    let mut s = Shard::format(dev, &fo, small_opts()).unwrap();
    let f = s.create(ROOT, b"filler", CreateArgs::file(0o644)).unwrap();
    let big = vec![7u8; 1 << 20];
    let mut off = 0;
    while s.write(f.ino, off, &big).is_ok() {
        off += big.len() as u64;
    }
    // Fill the last pages one file of one page at a time.
    for i in 0.. {
        let p = s.create(ROOT, format!("p{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        if s.write(p.ino, 0, &[1u8; 4096]).is_err() {
            break;
        }
    }
    assert_eq!(s.symlink(ROOT, b"ln", b"/target", 0, 0).unwrap_err(), FsError::NoSpace);
    assert_eq!(s.lookup(ROOT, b"ln").unwrap_err(), FsError::NotFound);
    // The next operation starts cleanly (this was an assertion failure).
    s.create(ROOT, b"after", CreateArgs::file(0o644)).unwrap();
    assert!(s.failure().is_none());
    let mut s = reopen(s);
    assert_eq!(s.lookup(ROOT, b"ln").unwrap_err(), FsError::NotFound);
    s.lookup(ROOT, b"after").unwrap();
}

#[test]
fn a_symlink_whose_target_write_fails_is_not_there_after_recovery() {
    use crate::device::{Fault, IoKind};
    let (mut s, handle) = fresh();
    s.create(ROOT, b"first", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
    // The target's data write fails after the symlink was answered.
    handle.inject(Fault::next(IoKind::Write, 1));
    s.symlink(ROOT, b"ln", b"/t", 0, 0).unwrap();
    let ln = s.lookup(ROOT, b"ln").unwrap().ino;
    assert_eq!(s.readlink(ln).unwrap(), b"/t");
    assert!(matches!(s.commit(), Err(FsError::Io(_))));
    assert!(matches!(s.create(ROOT, b"x", CreateArgs::file(0o644)), Err(FsError::Io(_))));
    let mut s = Shard::open(handle.crash(3), 0, small_opts()).unwrap();
    assert_eq!(s.lookup(ROOT, b"ln").unwrap_err(), FsError::NotFound);
    s.symlink(ROOT, b"ln", b"/t", 0, 0).unwrap();
}

#[test]
fn create_into_a_removed_directory_of_this_shard_is_enoent() {
    let (mut s, _) = fresh();
    let d = s.create(ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
    s.rmdir(ROOT, b"d").unwrap();
    // A stale handle of the removed directory: its inode was this shard's, so it
    // is gone, not on another shard. Nothing is created.
    for r in [
        s.create(d.ino, b"x", CreateArgs::file(0o644)).map(drop),
        s.create(d.ino, b"sub", CreateArgs::dir(0o755)).map(drop),
        s.symlink(d.ino, b"l", b"/t", 0, 0).map(drop),
    ] {
        assert_eq!(r.unwrap_err(), FsError::NotFound);
    }
    assert!(s.readdir(d.ino, None, 10).unwrap().is_empty());
    // A directory of another shard (a bigdir's name here) still takes names.
    let elsewhere = InodeId::compose(ShardId(5), 3);
    s.create(elsewhere, b"x", CreateArgs::file(0o644)).unwrap();
}

/// Power lost at every write of a checkpoint (its tables, its header, torn or
/// not): the shard opens, from the older checkpoint and its log when the new
/// header did not make it, and everything committed before is there.
#[test]
fn a_checkpoint_cut_at_any_write_loses_nothing_committed() {
    for cut in 0..12 {
        for seed in 0..4 {
            let (mut s, handle) = fresh();
            let mut files = Vec::new();
            for i in 0..30 {
                let f =
                    s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
                s.write(f.ino, 0, format!("data {i}").as_bytes()).unwrap();
                files.push(f.ino);
            }
            s.checkpoint().unwrap();
            s.unlink(ROOT, b"f0").unwrap();
            s.create(ROOT, b"late", CreateArgs::file(0o644)).unwrap();
            s.commit().unwrap();
            handle.freeze_after_writes(cut);
            let _ = s.checkpoint();
            drop(s);
            let mut s = Shard::open(handle.crash(seed), 0, small_opts())
                .unwrap_or_else(|e| panic!("cut at write {cut}, seed {seed}: {e}"));
            assert_eq!(s.lookup(ROOT, b"f0").unwrap_err(), FsError::NotFound, "cut {cut}");
            s.lookup(ROOT, b"late").unwrap_or_else(|e| panic!("cut {cut}, seed {seed}: {e}"));
            for (i, ino) in files.iter().enumerate().skip(1) {
                assert_eq!(s.read(*ino, 0, 64).unwrap(), format!("data {i}").as_bytes());
            }
        }
    }
}

/// Random writes, truncates and reads of files of both layouts, checked against a
/// model, with a read cache of 8 pages (most reads miss, evictions all the time)
/// and of 64: the cache never shows anything but what was written last.
#[test]
fn reads_always_show_the_last_write() {
    use rand::{Rng, SeedableRng};
    let seed: u64 =
        std::env::var("PFS_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
                as u64
        });
    println!("seed {seed} (PFS_SEED={seed} replays it)");
    for cache_pages in [8usize, 64] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ cache_pages as u64);
        let dev = MemDevice::new(BIG_ZONE, 64);
        // Completions in a random order: reads may race the data writes.
        dev.handle().reorder(Some(seed));
        let opts = ShardOptions { read_cache_pages: cache_pages, ..small_opts() };
        let mut s =
            Shard::format(dev, &FormatOptions::new(ShardId(0), BIG_ZONE), opts.clone()).unwrap();
        let mut files = Vec::new();
        for (i, layout) in [FileLayout::Block, FileLayout::Io].into_iter().enumerate() {
            let args = CreateArgs {
                layout: Some((pfs_core::DirLayout::default(), layout)),
                ..CreateArgs::file(0o644)
            };
            let f = s.create(ROOT, format!("f{i}").as_bytes(), args).unwrap();
            files.push((f.ino, Vec::<u8>::new()));
        }
        for step in 0..600 {
            let (ino, model) = &mut files[rng.gen_range(0..2)];
            let ctx = format!("seed {seed}, cache {cache_pages}, step {step}");
            match rng.gen_range(0..10) {
                0..=4 => {
                    let off = rng.gen_range(0..300_000u64);
                    let len = rng.gen_range(1..70_000usize);
                    let fill: u8 = rng.gen();
                    let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                    s.write(*ino, off, &data).unwrap();
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                5 => {
                    let size = rng.gen_range(0..300_000u64);
                    s.setattr(*ino, SetAttr { size: Some(size), ..SetAttr::default() }).unwrap();
                    model.resize(size as usize, 0);
                    run_trims(&mut s);
                }
                _ => {
                    let off = rng.gen_range(0..model.len().max(1) as u64);
                    let len = rng.gen_range(1..200_000usize);
                    let got = s.read(*ino, off, len).unwrap();
                    let from = (off as usize).min(model.len());
                    let to = (off as usize + len).min(model.len());
                    assert!(got == model[from..to], "{ctx}: read {len} at {off} differs");
                }
            }
            // Commit often: freed pages become reusable, and a reused page must
            // not show what the cache kept of its last life.
            if step % 3 == 2 {
                s.commit().unwrap();
            }
        }
        for (ino, model) in &files {
            assert!(s.read(*ino, 0, model.len()).unwrap() == *model, "seed {seed}: whole file");
        }
        let st = s.stats();
        assert!(st.read_cache_hits > 0 && st.read_cache_misses > 0, "{st:?}");
    }
}

#[test]
fn sequential_reads_read_ahead_into_the_cache() {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let f = s.create(ROOT, b"seq", CreateArgs::file(0o644)).unwrap();
    let data: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 253) as u8).collect();
    s.write(f.ino, 0, &data).unwrap();
    // A reopened shard starts with an empty cache.
    let mut s = reopen(s);
    let piece = 16 << 10;
    let misses = |s: &Shard<MemDevice>| s.stats().read_cache_misses;
    assert_eq!(s.read(f.ino, 0, piece).unwrap(), data[..piece]);
    assert_eq!(s.read(f.ino, piece as u64, piece).unwrap(), data[piece..2 * piece]);
    // The second read continued the first: READ_AHEAD_FACTOR pieces were read
    // ahead, and every half window more, so 40 more sequential reads find
    // their pages read ahead (or wait for the read-ahead in flight).
    let before = misses(&s);
    for i in 2..42 {
        let at = i * piece;
        assert_eq!(s.read(f.ino, at as u64, piece).unwrap(), data[at..at + piece]);
    }
    let sequential = misses(&s) - before;
    assert_eq!(sequential, 0, "40 sequential reads all hit what was read ahead: {:?}", s.stats());
    assert!(s.stats().read_aheads > 0, "read ahead in the background");
    // A reader that jumps around reads no more than it asks for.
    let mut s = reopen(s);
    let before = misses(&s);
    for i in (0..40).rev() {
        let at = i * 2 * piece;
        assert_eq!(s.read(f.ino, at as u64, piece).unwrap(), data[at..at + piece]);
    }
    assert_eq!(misses(&s) - before, 40, "each backward read misses");
}

/// Runs a commit that the device answers a little at a time (`reorder`), with
/// operations between its steps: `a` before it, `b0`, `b1`, ... while it runs.
/// Returns the shard, the device and how many `b` files were made.
fn commit_with_operations_under_way(seed: u64) -> (Shard<MemDevice>, MemDevice, usize) {
    let (mut s, handle) = fresh();
    let a = s.create(ROOT, b"a", CreateArgs::file(0o644)).unwrap();
    s.write(a.ino, 0, b"before the commit").unwrap();
    handle.reorder(Some(seed));
    let first = s.next_commit();
    assert_eq!(s.commits_done(), first - 1);
    s.start_commit().unwrap();
    let mut made = 0;
    while s.committing() {
        let name = format!("b{made}");
        let b = s.create(ROOT, name.as_bytes(), CreateArgs::file(0o644)).unwrap();
        s.write(b.ino, 0, name.as_bytes()).unwrap();
        assert_eq!(s.next_commit(), first + 1, "operations under way wait for the next commit");
        made += 1;
        s.poll_commit();
    }
    assert!(s.failure().is_none());
    assert_eq!(s.commits_done(), first);
    (s, handle, made)
}

#[test]
fn a_commit_under_way_covers_what_came_before_it_and_nothing_after() {
    let mut overlapped = 0;
    for seed in 0..40u64 {
        let (s, handle, made) = commit_with_operations_under_way(seed);
        overlapped += usize::from(made > 0);
        drop(s);
        let mut s = Shard::open(handle.crash(seed), 0, small_opts()).unwrap();
        let a = s.lookup(ROOT, b"a").unwrap_or_else(|e| panic!("seed {seed}: a lost: {e}"));
        assert_eq!(s.read(a.ino, 0, 64).unwrap(), b"before the commit", "seed {seed}");
        for i in 0..made {
            // Their records were appended after the commit's cut: never written.
            let name = format!("b{i}");
            assert_eq!(
                s.lookup(ROOT, name.as_bytes()).unwrap_err(),
                FsError::NotFound,
                "seed {seed}: {name}, made while the commit ran, was in it"
            );
        }
    }
    assert!(overlapped >= 10, "only {overlapped} of 40 commits ran beside an operation");
}

#[test]
fn a_waited_commit_finishes_the_one_under_way_and_covers_the_rest() {
    for seed in 0..20u64 {
        let (mut s, handle, made) = commit_with_operations_under_way(seed);
        let done = s.commits_done();
        let c = s.create(ROOT, b"c", CreateArgs::file(0o644)).unwrap();
        s.write(c.ino, 0, b"after").unwrap();
        s.start_commit().unwrap();
        s.commit().unwrap();
        assert!(!s.committing());
        assert_eq!(s.commits_done(), done + 2, "seed {seed}: the one started and the waited one");
        drop(s);
        let mut s = Shard::open(handle.crash(seed), 0, small_opts()).unwrap();
        for i in 0..made {
            let b = s.lookup(ROOT, format!("b{i}").as_bytes()).unwrap();
            assert_eq!(s.read(b.ino, 0, 64).unwrap(), format!("b{i}").as_bytes());
        }
        let c = s.lookup(ROOT, b"c").unwrap();
        assert_eq!(s.read(c.ino, 0, 64).unwrap(), b"after", "seed {seed}");
    }
}

#[test]
fn a_failed_step_of_a_commit_under_way_fails_the_shard() {
    use crate::device::{Fault, IoKind};
    // (step, with file data to sync first)
    for (step, data) in [("data sync", true), ("log write", false), ("log sync", false)] {
        let (mut s, handle) = fresh();
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        if data {
            s.write(f.ino, 0, b"data").unwrap();
        }
        let wal = s.geo.offset(s.geo.wal_page);
        let fault = match step {
            "log write" => {
                Fault::always(Some(IoKind::Write), wal..wal + s.geo.wal_pages * PAGE_SIZE)
            }
            _ => Fault::next(IoKind::Sync, 1),
        };
        handle.inject(fault);
        handle.reorder(Some(3));
        let done = s.commits_done();
        let _ = s.start_commit();
        while s.committing() {
            s.poll_commit();
        }
        let why = s.failure().unwrap_or_else(|| panic!("{step}: the shard did not fail"));
        assert!(why.contains("commit failed"), "{step}: {why}");
        assert_eq!(s.commits_done(), done, "{step}: a failed commit never counts");
        assert!(s.start_commit().is_err(), "{step}");
    }
}

/// A read-ahead still in flight when a truncate frees its pages must not put
/// the old bytes in the read cache after those pages went to another file:
/// the commit that frees them waits for it (every data request submitted
/// before the commit started, reads included).
#[test]
fn a_read_ahead_in_flight_never_caches_pages_freed_and_reused_meanwhile() {
    // Without the wait, seed 12 read 128 KiB of a's bytes back from b.
    for seed in 0..40 {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let a = s.create(ROOT, b"a", CreateArgs::file(0o644)).unwrap();
        s.write(a.ino, 0, &vec![0xAA; 1 << 20]).unwrap();
        let mut s = reopen(s);
        handle.reorder(Some(seed));
        let piece = 64 << 10;
        // Two sequential reads start a read-ahead past them.
        s.read(a.ino, 0, piece).unwrap();
        s.read(a.ino, piece as u64, piece).unwrap();
        s.setattr(a.ino, SetAttr { size: Some(0), ..SetAttr::default() }).unwrap();
        s.commit().unwrap();
        // Whole blocks on the freed pages (not worth the cache when written).
        let b = s.create(ROOT, b"b", CreateArgs::file(0o644)).unwrap();
        let new = vec![0xBB; 1 << 20];
        s.write(b.ino, 0, &new).unwrap();
        s.commit().unwrap();
        handle.reorder(None);
        let got = s.read(b.ino, 0, 1 << 20).unwrap();
        let stale = got.iter().filter(|&&x| x != 0xBB).count();
        assert_eq!(stale, 0, "seed {seed}: {stale} bytes of b read back as a's old bytes");
    }
}

/// A read whose pages are on the device only is answered when its device
/// reads finish, while other operations run; a device error fails that read
/// and nothing else.
#[test]
fn reads_of_the_device_finish_in_the_background() {
    use super::dataio::{ReadShape, ReadStart};
    use crate::device::{mem::Fault, IoKind};
    let bg = |pad| ReadShape { prefix: 0, pad, background: true, gather: false };
    for seed in 0..8 {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let old: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        s.write(f.ino, 0, &old).unwrap();
        // Reopened: nothing in memory, every piece goes to the device.
        let mut s = reopen(s);
        handle.reorder(Some(seed));
        let Ok(ReadStart::Pending(id)) = s.read_start(f.ino, 1000, 150_000, ALL_BLOCKS, bg(0))
        else {
            panic!("seed {seed}: a read of the device waits for it");
        };
        assert!(s.reads_under_way());
        // A write that lands meanwhile replaces the blocks, and a commit runs;
        // the read sees the file as it was when it started, whole.
        s.write(f.ino, 0, &[7u8; 100_000]).unwrap();
        s.commit().unwrap();
        let mut got = s.take_finished_reads();
        for _ in 0..1000 {
            if !got.is_empty() {
                break;
            }
            s.poll_data_writes();
            got.extend(s.take_finished_reads());
        }
        assert_eq!(got.len(), 1, "seed {seed}: the read finished");
        assert_eq!(got[0].0, id);
        assert!(got[0].1.as_ref().unwrap() == &old[1000..151_000], "seed {seed}: bytes");
        assert!(!s.reads_under_way());
        // Memory (a staged write) answers at once; a read past the end pads.
        s.write(f.ino, 0, &[9u8; 10]).unwrap();
        assert_eq!(
            s.read_start(f.ino, 0, 10, ALL_BLOCKS, bg(0)),
            Ok(ReadStart::Done(vec![9u8; 10]))
        );
        assert_eq!(
            s.read_start(f.ino, 1 << 30, 10, ALL_BLOCKS, bg(16)),
            Ok(ReadStart::Done(vec![0; 16]))
        );
        // A device error reaches that read only; the shard goes on.
        let mut s = reopen(s);
        handle.reorder(None);
        s.getattr(f.ino).unwrap();
        handle.inject(Fault::next(IoKind::Read, 1));
        let Ok(ReadStart::Pending(id)) = s.read_start(f.ino, 150_000, 10, ALL_BLOCKS, bg(0)) else {
            panic!("seed {seed}: pending");
        };
        s.poll_data_writes();
        let done = s.take_finished_reads();
        assert!(matches!(&done[..], [(i, Err(FsError::Io(_)))] if *i == id), "{done:?}");
        assert!(s.failure().is_none());
        assert_eq!(s.read(f.ino, 150_000, 10).unwrap(), &old[150_000..150_010]);
    }
}

/// A read's output leaves the asked room before the bytes, from memory and
/// from the device alike, and pads after them.
#[test]
fn a_read_leaves_room_before_its_bytes() {
    use super::dataio::{ReadShape, ReadStart};
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    let data: Vec<u8> = (0..150_000u32).map(|i| (i % 239) as u8 + 1).collect();
    s.write(f.ino, 0, &data).unwrap();
    let shape = ReadShape { prefix: 36, pad: 100_000, background: true, gather: false };
    let want = |from: usize, to: usize, pad: usize| {
        let mut w = vec![0u8; 36];
        w.extend_from_slice(&data[from..to]);
        w.resize(36 + pad.max(to - from), 0);
        w
    };
    // Staged: from memory.
    assert_eq!(
        s.read_start(f.ino, 100, 1000, ALL_BLOCKS, shape),
        Ok(ReadStart::Done(want(100, 1100, 100_000)))
    );
    // From the device, short at the end of the file, padded.
    let mut s = reopen(s);
    let Ok(ReadStart::Pending(id)) = s.read_start(f.ino, 70_000, 90_000, ALL_BLOCKS, shape) else {
        panic!("a read of the device waits for it");
    };
    let mut got = Vec::new();
    while got.is_empty() {
        s.poll_data_writes();
        got = s.take_finished_reads();
    }
    assert_eq!(got[0].0, id);
    assert!(got[0].1.as_ref().unwrap() == &want(70_000, 150_000, 100_000));
    // Past the end: the room and the padding.
    assert_eq!(
        s.read_start(f.ino, 1 << 20, 10, ALL_BLOCKS, shape),
        Ok(ReadStart::Done(vec![0; 100_036]))
    );
}

/// A read of some of its range's blocks (`blocks`, as a client asks each
/// shard of a striped file for its own) returns those blocks' bytes one after
/// the other, short at the end of the file at the home, from memory and from
/// the device, in the background and not, for every layout.
#[test]
fn a_read_of_picked_blocks_returns_them_one_after_the_other() {
    use super::dataio::{ReadShape, ReadStart};
    use pfs_core::wire::read_segments;
    const B: u64 = pfs_core::BLOCK_SIZE_BYTES;
    let seed = 0x5eed_0001u64;
    println!("seed {seed}");
    let (mut s, _) = fresh_sized(BIG_ZONE);
    assert_eq!(s.geometry().block_size as u64, B, "routing and storage blocks agree");
    let size = 5 * B + 1234;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8 ^ 0x5a).collect();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    s.write(f.ino, 0, &data).unwrap();
    let foreign = InodeId::compose(ShardId(9), 42);
    for layout in [FileLayout::Block, FileLayout::Io] {
        for b in 0..6u64 {
            let end = ((b + 1) * B).min(size);
            s.write_data(foreign, layout, b * B, &data[(b * B) as usize..end as usize]).unwrap();
        }
    }
    // A `ReadData` that reaches the home answers exactly its bytes, not short.
    let tail = s.read_data_blocks(f.ino, FileLayout::Block, size - 10, 100, ALL_BLOCKS).unwrap();
    assert_eq!(tail.len(), 100);
    assert!(tail[..10] == data[(size - 10) as usize..] && tail[10..] == [0; 90]);
    let want = |offset: u64, len: u64, blocks: u32, clamp: u64| {
        let mut w = Vec::new();
        let len = len.min(clamp.saturating_sub(offset));
        for (o, n) in read_segments(offset, len, blocks) {
            w.extend_from_slice(&data[o as usize..(o + n) as usize]);
        }
        w
    };
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        state >> 16
    };
    for round in 0..2 {
        if round == 1 {
            s = reopen(s); // everything from the device now
        }
        for _ in 0..60 {
            let offset = next() % (size + B);
            let len = 1 + next() % (3 * B);
            let blocks = next() as u32;
            let background = next() % 2 == 0;
            let gather = background && next() % 2 == 0;
            let shape = ReadShape { prefix: 7, pad: 0, background, gather };
            let ctx = format!("seed {seed} round {round} at {offset} +{len} blocks {blocks:#x}");
            let finish = |started: ReadStart, s: &mut Shard<MemDevice>| match started {
                ReadStart::Done(out) => out,
                ReadStart::Gather(g) => {
                    let mut out = vec![0; 7];
                    out.extend(g.to_vec());
                    s.gather_done(g);
                    out
                }
                ReadStart::Pending(id) => loop {
                    s.poll_data_writes();
                    if let Some((i, r)) = s.take_finished_reads().pop() {
                        assert_eq!(i, id);
                        break r.unwrap();
                    }
                },
            };
            let home = s.read_start(f.ino, offset, len as usize, blocks, shape).unwrap();
            let home = finish(home, &mut s);
            assert!(
                home[..7] == [0; 7] && home[7..] == want(offset, len, blocks, size),
                "home {ctx}"
            );
            for layout in [FileLayout::Block, FileLayout::Io] {
                let got = s.read_data_start(foreign, layout, offset, len as usize, blocks, shape);
                let got = finish(got.unwrap(), &mut s);
                // Elsewhere, the size is not known: past the data reads zeros.
                let mut w = want(offset, len, blocks, size);
                let picked: u64 = read_segments(offset, len, blocks).iter().map(|s| s.1).sum();
                w.resize(picked as usize, 0);
                assert!(got[7..] == w[..], "{layout:?} elsewhere {ctx}");
            }
        }
    }
}

/// Starts background reads `(offset, len)` of `ino` one after the other,
/// collecting what the device finished after each as a worker's round does,
/// then waits for the rest: each read's offset and result.
fn read_in_background(
    s: &mut Shard<MemDevice>,
    ino: InodeId,
    reads: impl Iterator<Item = (usize, usize)>,
) -> Vec<(usize, FsResult<Vec<u8>>)> {
    read_in_background_checked(s, ino, reads, |_, _| {})
}

/// [`read_in_background`], calling `check(shard, offset)` after each read
/// started.
fn read_in_background_checked(
    s: &mut Shard<MemDevice>,
    ino: InodeId,
    reads: impl Iterator<Item = (usize, usize)>,
    mut check: impl FnMut(&Shard<MemDevice>, usize),
) -> Vec<(usize, FsResult<Vec<u8>>)> {
    use super::dataio::{ReadShape, ReadStart};
    let mut want = HashMap::new();
    let mut got = Vec::new();
    for (i, (at, len)) in reads.enumerate() {
        // Every other read sent from the read-ahead buffers, as the worker
        // sends those it can.
        let bg = ReadShape { prefix: 0, pad: 0, background: true, gather: i % 2 == 1 };
        match s.read_start(ino, at as u64, len, ALL_BLOCKS, bg).unwrap() {
            ReadStart::Done(bytes) => got.push((at, Ok(bytes))),
            ReadStart::Gather(g) => {
                got.push((at, Ok(g.to_vec())));
                s.gather_done(g);
            }
            ReadStart::Pending(id) => {
                want.insert(id, at);
            }
        }
        check(s, at);
        s.poll_data_writes();
        got.extend(s.take_finished_reads().into_iter().map(|(id, r)| (want[&id], r)));
    }
    for _ in 0..10_000 {
        if !s.reads_under_way() {
            break;
        }
        s.poll_data_writes();
        got.extend(s.take_finished_reads().into_iter().map(|(id, r)| (want[&id], r)));
    }
    got
}

/// Read-ahead is bounded by the memory its buffers take, not by the bytes
/// it reads into them: a device that lends whole 1 MiB buffers for runs of
/// 320 KiB (as `UringDevice` lends them past 256 KiB) holds at most half the
/// read cache in read-ahead buffers. Counted by bytes read, the runs held
/// three times their bound, and on the real device each new one mapped and
/// zeroed a fresh buffer (docs/benchmarks.md, twenty-ninth session).
#[test]
fn read_ahead_counts_the_memory_of_its_buffers() {
    let (mut s, handle) = fresh_sized(BIG_ZONE);
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i % 247) as u8).collect();
    s.write(f.ino, 0, &data).unwrap();
    s.commit().unwrap();
    // 1024 pages: read-ahead may hold 2 MiB.
    let opts = ShardOptions { read_cache_pages: 1024, ..small_opts() };
    let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
    let buf = 1usize << 20;
    handle.round_bufs(buf);
    let cap = s.ahead_cap();
    // Reads of 32 KiB, 4 KiB apart: every run keeps bytes no read takes, so
    // runs stay held until the bound drops them (as two readers of a shared
    // file leave a run's edge pages to each other).
    let piece = 32 << 10;
    let reads = (0..data.len() - piece).step_by(piece + 4096).map(|at| (at, piece));
    let mut most = 0;
    let got = read_in_background_checked(&mut s, f.ino, reads.clone(), |s, at| {
        most = most.max(s.ahead_runs());
        assert!(
            (s.ahead_runs() * buf) as u64 <= cap,
            "at {at}: {} read-ahead runs in buffers of {buf} bytes, bound {cap}",
            s.ahead_runs()
        );
    });
    assert_eq!(got.len(), reads.count(), "every read answered");
    for (at, r) in got {
        assert!(r.unwrap() == data[at..at + piece], "bytes at {at}");
    }
    let st = s.stats();
    assert!(most >= 1 && st.ahead_hits + st.ahead_joins > 100, "read ahead all along: {st:?}");
}

/// A sequential reader in the background (as the worker reads) is served by
/// read-ahead: its reads copy from the read-ahead buffers or join a
/// read-ahead still in flight, never reading a page twice or waiting inline,
/// and each gets the right bytes whatever order the device answers in.
#[test]
fn background_readers_join_the_read_ahead_in_flight() {
    // 1024 pages: read-ahead has room for the whole file; 64: it is full of
    // read-aheads in flight at times, and a read goes to the device itself.
    for (seed, cache_pages) in (0..16).flat_map(|seed| [(seed, 1024), (seed, 64)]) {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        s.write(f.ino, 0, &data).unwrap();
        s.commit().unwrap();
        let opts = ShardOptions { read_cache_pages: cache_pages, ..small_opts() };
        let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
        handle.reorder(Some(seed));
        let piece = 16 << 10;
        let reads = (0..data.len() / piece).map(|i| (i * piece, piece));
        let got = read_in_background(&mut s, f.ino, reads);
        assert_eq!(got.len(), data.len() / piece, "seed {seed}: every read answered");
        for (at, r) in got {
            assert!(r.unwrap() == data[at..at + piece], "seed {seed}: bytes at {at}");
        }
        let st = s.stats();
        if cache_pages == 1024 {
            // The first two reads go to the device; the second starts read-ahead.
            assert!(st.reads_in_background <= 2, "seed {seed}: {st:?}");
            assert_eq!(st.ahead_hits + st.ahead_joins, 62, "seed {seed}: {st:?}");
        }
        assert!(st.ahead_hits + st.ahead_joins > 0, "seed {seed}, {cache_pages}: {st:?}");
    }
}

/// A sequential reader whose reads may be sent from the read-ahead buffers
/// (`ReadShape::gather`, as the worker asks over shared memory) gets them so
/// once read-ahead runs ahead of it, with the right bytes (holes and the
/// padding past the end as zeros), and every buffer it was lent comes back:
/// once the file was read through, no read-ahead run is left.
#[test]
fn reads_gathered_from_the_read_ahead_lend_and_return_its_buffers() {
    use super::dataio::{ReadShape, ReadStart};
    for seed in 0..8 {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let mut data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8 + 1).collect();
        // A hole of two blocks in the middle.
        data[384 << 10..512 << 10].fill(0);
        s.write(f.ino, 0, &data[..384 << 10]).unwrap();
        s.write(f.ino, 512 << 10, &data[512 << 10..]).unwrap();
        s.commit().unwrap();
        let opts = ShardOptions { read_cache_pages: 4096, ..small_opts() };
        let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
        handle.reorder(Some(seed));
        let piece = 48 << 10;
        let pad = piece + 100;
        let mut pending = HashMap::new();
        let mut gathered = 0;
        for at in (0..data.len()).step_by(piece) {
            let len = piece.min(data.len() - at);
            let shape = ReadShape { prefix: 5, pad, background: true, gather: true };
            let mut want = vec![0u8; 5 + pad];
            want[5..5 + len].copy_from_slice(&data[at..at + len]);
            match s.read_data_start(f.ino, FileLayout::Block, at as u64, piece, ALL_BLOCKS, shape) {
                Ok(ReadStart::Gather(g)) => {
                    gathered += 1;
                    assert_eq!(g.len(), pad, "seed {seed} at {at}");
                    assert!(g.to_vec() == want[5..], "seed {seed}: gathered bytes at {at}");
                    s.gather_done(g);
                }
                Ok(ReadStart::Done(out)) => assert!(out == want, "seed {seed}: bytes at {at}"),
                Ok(ReadStart::Pending(id)) => {
                    pending.insert(id, (at, want));
                }
                Err(e) => panic!("seed {seed}: read at {at}: {e}"),
            }
            s.poll_data_writes();
            for (id, r) in s.take_finished_reads() {
                let (at, want) = pending.remove(&id).expect("a read asked for");
                assert!(r.unwrap() == want, "seed {seed}: bytes at {at}");
            }
        }
        for _ in 0..10_000 {
            if pending.is_empty() && !s.reads_under_way() && s.ahead_bytes() == 0 {
                break;
            }
            s.poll_data_writes();
            for (id, r) in s.take_finished_reads() {
                let (at, want) = pending.remove(&id).expect("a read asked for");
                assert!(r.unwrap() == want, "seed {seed}: bytes at {at}");
            }
        }
        assert!(pending.is_empty(), "seed {seed}: reads never answered");
        let st = s.stats();
        assert!(gathered >= 10, "seed {seed}: {gathered} gathered, {st:?}");
        assert_eq!(st.reads_gathered, gathered, "seed {seed}");
        assert_eq!(s.ahead_bytes(), 0, "seed {seed}: read-ahead runs left after the file was read");
    }
}

/// A read whose pages the read cache holds (a block a write left partly
/// filled) is gathered from the cache's pages, lent and given back, with the
/// right bytes; a page staged or being written is not gathered.
#[test]
fn reads_gathered_from_the_read_cache_lend_and_return_its_pages() {
    use super::dataio::{ReadShape, ReadStart};
    let (mut s, _handle) = fresh_sized(BIG_ZONE);
    let opts = ShardOptions { read_cache_pages: 4096, ..small_opts() };
    s.commit().unwrap();
    let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
    // 40,000 bytes: the block is left partly filled, so its pages are cached
    // once its write reached the device.
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 251) as u8 + 1).collect();
    s.write(f.ino, 0, &data).unwrap();
    s.commit().unwrap();
    for _ in 0..10_000 {
        if !s.reads_under_way() && !s.data_busy() {
            break;
        }
        s.poll_data_writes();
    }
    let cached = s.read_cache.len();
    assert!(cached >= 9, "{cached} pages cached after the write");
    let mut gathered = 0;
    for (at, len) in [(0usize, 40_000usize), (1000, 9000), (4095, 2), (39_000, 5000)] {
        let shape = ReadShape { prefix: 7, pad: 0, background: true, gather: true };
        let end = (at + len).min(data.len());
        match s.read_start(f.ino, at as u64, len, ALL_BLOCKS, shape) {
            Ok(ReadStart::Gather(g)) => {
                gathered += 1;
                assert!(g.to_vec() == data[at..end], "gathered bytes at {at}+{len}");
                assert!(s.read_cache.len() < cached, "its pages are lent meanwhile");
                s.gather_done(g);
                assert_eq!(s.read_cache.len(), cached, "and given back");
            }
            other => panic!("read at {at}+{len} not gathered: {other:?}"),
        }
    }
    assert_eq!(s.stats().reads_gathered, gathered);
    // The same pages while a write of them is staged: copied, not gathered.
    s.write(f.ino, 0, b"new").unwrap();
    let shape = ReadShape { prefix: 0, pad: 0, background: true, gather: true };
    match s.read_start(f.ino, 0, 8, ALL_BLOCKS, shape) {
        Ok(ReadStart::Gather(g)) => panic!("gathered over a staged write: {:?}", g.to_vec()),
        Ok(ReadStart::Done(out)) => assert_eq!(&out[..8], b"new\x04\x05\x06\x07\x08"),
        Ok(ReadStart::Pending(_)) => {}
        Err(e) => panic!("read after the write: {e}"),
    }
}

/// Read-ahead never reads pages still staged: a window over several staged
/// runs (a file just written, its runs neighbours on the device) read the
/// device's old bytes, and later reads took them from the read-ahead.
#[test]
fn read_ahead_never_reads_pages_still_staged() {
    use super::dataio::{ReadShape, ReadStart};
    for (background, gather) in [(false, false), (true, false), (true, true)] {
        let (mut s, _) = fresh_sized(BIG_ZONE);
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let data: Vec<u8> = (0..(512u32 << 10)).map(|i| (i % 249) as u8 + 1).collect();
        for (i, chunk) in data.chunks(64 << 10).enumerate() {
            s.write(f.ino, (i << 16) as u64, chunk).unwrap();
        }
        let piece = 16 << 10;
        let shape = ReadShape { prefix: 0, pad: 0, background, gather };
        for i in 0..data.len() / piece {
            let at = i * piece;
            let got = match s.read_start(f.ino, at as u64, piece, ALL_BLOCKS, shape).unwrap() {
                ReadStart::Done(bytes) => bytes,
                ReadStart::Gather(g) => {
                    let bytes = g.to_vec();
                    s.gather_done(g);
                    bytes
                }
                ReadStart::Pending(id) => {
                    let mut done = None;
                    for _ in 0..10_000 {
                        s.poll_data_writes();
                        done = s.take_finished_reads().into_iter().find(|r| r.0 == id);
                        if done.is_some() {
                            break;
                        }
                    }
                    done.expect("the read finished").1.unwrap()
                }
            };
            assert!(got == data[at..at + piece], "background {background}: bytes at {at}");
        }
    }
}

/// A read that must wait for a data write in flight (its block was just
/// rewritten) while other pieces of it are being read ahead: the wait finishes
/// those read-aheads too, and the read copies from them instead of joining a
/// read-ahead that already finished (which left it unanswered: a client's
/// request timed out after 30 s).
#[test]
fn a_read_that_waits_for_a_write_copies_the_read_ahead_it_finished() {
    use super::dataio::{ReadShape, ReadStart};
    let bg = ReadShape { prefix: 0, pad: 0, background: true, gather: false };
    for seed in 0..16 {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let mut data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        s.write(f.ino, 0, &data).unwrap();
        s.commit().unwrap();
        let opts = ShardOptions { read_cache_pages: 1024, ..small_opts() };
        let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
        handle.reorder(Some(seed));
        let mut pending = HashMap::new();
        let piece = 16 << 10;
        // Two sequential reads: the second starts read-ahead past 32 KiB.
        for at in [0, piece] {
            if let ReadStart::Pending(id) =
                s.read_start(f.ino, at as u64, piece, ALL_BLOCKS, bg).unwrap()
            {
                pending.insert(id, (at, piece));
            }
        }
        // Block 1 rewritten whole, its write submitted by a commit.
        data[64 << 10..128 << 10].fill(0xEE);
        s.write(f.ino, 64 << 10, &data[64 << 10..128 << 10]).unwrap();
        s.start_commit().unwrap();
        let (at, len) = (2 * piece, 200 << 10);
        match s.read_start(f.ino, at as u64, len, ALL_BLOCKS, bg).unwrap() {
            ReadStart::Done(bytes) => assert!(bytes == data[at..at + len], "seed {seed}"),
            ReadStart::Pending(id) => {
                pending.insert(id, (at, len));
            }
            ReadStart::Gather(_) => unreachable!("not asked for"),
        }
        for _ in 0..10_000 {
            if pending.is_empty() && !s.committing() {
                break;
            }
            s.poll_data_writes();
            if s.committing() {
                s.poll_commit();
            }
            for (id, r) in s.take_finished_reads() {
                let (at, len) = pending.remove(&id).expect("a read asked for");
                assert!(r.unwrap() == data[at..at + len], "seed {seed}: bytes at {at}");
            }
        }
        assert!(pending.is_empty(), "seed {seed}: reads never answered: {pending:?}");
    }
}

/// Two readers of one file take IOR-hard transfers (47,008 bytes: not
/// page-aligned) in turn, and reach the shard out of order. Every read after
/// the first few finds its pages read ahead. Before, a read-ahead run was
/// dropped once one read reached its last page (the next transfer starts in
/// that page, and the other reader may not have read the run's start yet), a
/// window that shared an edge page with the last was not read ahead at all,
/// and a read that spanned two runs went to the device: a quarter of
/// io-hard's reads waited for the device.
#[test]
fn interleaved_unaligned_readers_find_their_pages_read_ahead() {
    let transfer = 47_008;
    let segments = 64;
    for seed in 0..8 {
        let (mut s, handle) = fresh_sized(BIG_ZONE);
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap();
        let data: Vec<u8> = (0..segments * transfer).map(|i| (i % 251) as u8).collect();
        for (i, chunk) in data.chunks(64 << 10).enumerate() {
            s.write(f.ino, (i << 16) as u64, chunk).unwrap();
        }
        s.commit().unwrap();
        let opts = ShardOptions { read_cache_pages: 1024, ..small_opts() };
        let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
        handle.reorder(Some(seed));
        // Segment 2k+1 before 2k: the second reader ahead of the first.
        let reads = (0..segments).map(|i| ((i ^ 1) * transfer, transfer));
        let got = read_in_background(&mut s, f.ino, reads);
        assert_eq!(got.len(), segments, "seed {seed}: every read answered");
        for (at, r) in got {
            assert!(r.unwrap() == data[at..at + transfer], "seed {seed}: bytes at {at}");
        }
        // Segments 1, 0, 3 and 2 go to the device: 3 starts read-ahead past
        // its end, and 2 lies before it.
        let st = s.stats();
        assert!(st.reads_in_background <= 4, "seed {seed}: {st:?}");
    }
}

/// A checkpoint taken beside the operations: with its header write held in
/// flight, creates, writes, an unlink and commits go on, logging to the other
/// half of the log, and nobody waits for it. A crash then recovers every
/// committed operation whether the header reached the device (tables of the
/// snapshot, then the new half) or not (the old tables, the old half, then
/// the new half); released, the checkpoint finishes.
#[test]
fn operations_go_on_while_a_checkpoint_is_under_way() {
    let header_pages = PAGE_SIZE..3 * PAGE_SIZE;
    let (mut new_header, mut old_header) = (0, 0);
    for seed in 0..12u64 {
        let (mut s, handle) = fresh();
        let mut files = Vec::new();
        let add = |s: &mut Shard<MemDevice>, files: &mut Vec<InodeId>, i: usize| {
            let f = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
            s.write(f.ino, 0, format!("data {i}").as_bytes()).unwrap();
            files.push(f.ino);
        };
        for i in 0..20 {
            add(&mut s, &mut files, i);
        }
        let gen = s.wal.gen();
        handle.hold(Some(header_pages.clone()));
        s.start_checkpoint();
        for _ in 0..8 {
            s.poll_checkpoint();
        }
        assert!(s.checkpointing(), "seed {seed}: its header is held");
        assert_eq!(s.wal.gen(), gen + 1, "seed {seed}: the snapshot moved the log on");
        let before = s.stats();
        for i in 20..40 {
            add(&mut s, &mut files, i);
        }
        s.unlink(ROOT, b"f0").unwrap();
        s.rename(ROOT, b"f1", ROOT, b"g1", RenameFlags::default()).unwrap();
        s.commit().unwrap();
        let after = s.stats();
        assert!(s.checkpointing(), "seed {seed}: still under way");
        assert_eq!(after.checkpoints, before.checkpoints);
        assert_eq!(after.log_full_waits, 0, "seed {seed}: nobody waited for it");
        drop(s);
        let crashed = handle.crash(seed);
        let region_page = 1 + (gen + 1) % 2;
        let image = crashed.peek(region_page * PAGE_SIZE, PAGE_SIZE as usize);
        let format_id =
            Geometry::decode_superblock(&crashed.peek(0, PAGE_SIZE as usize)).unwrap().format_id;
        match geometry::CheckpointHeader::decode(&image, format_id) {
            Some(h) if h.gen == gen + 1 => new_header += 1,
            _ => old_header += 1,
        }
        let mut s = Shard::open(crashed, 0, small_opts())
            .unwrap_or_else(|e| panic!("seed {seed}: recovery: {e}"));
        assert_eq!(s.lookup(ROOT, b"f0").unwrap_err(), FsError::NotFound, "seed {seed}");
        assert_eq!(s.lookup(ROOT, b"f1").unwrap_err(), FsError::NotFound, "seed {seed}");
        for (i, ino) in files.iter().enumerate().skip(1) {
            let name = if i == 1 { "g1".to_string() } else { format!("f{i}") };
            let found = s.lookup(ROOT, name.as_bytes());
            assert_eq!(found.map(|a| a.ino), Ok(*ino), "seed {seed}: {name}");
            assert_eq!(s.read(*ino, 0, 64).unwrap(), format!("data {i}").as_bytes(), "{name}");
        }
        // Released, it finishes, and what it wrote opens.
        let done = s.stats().checkpoints;
        s.start_checkpoint();
        s.create(ROOT, b"last", CreateArgs::file(0o644)).unwrap();
        while s.checkpointing() {
            s.poll_checkpoint();
            if s.checkpointing() && !s.checkpoint_encoding() {
                let waited = s.io.wait_any() || s.io.has_finished();
                assert!(waited, "seed {seed}: a checkpoint with nothing in flight");
            }
        }
        assert_eq!(s.stats().checkpoints, done + 1);
        let mut s = reopen(s);
        s.lookup(ROOT, b"last").unwrap();
        s.lookup(ROOT, b"g1").unwrap();
    }
    // Both recoveries ran.
    assert!(new_header > 0 && old_header > 0, "new {new_header}, old {old_header}");
}

/// A shard whose log is 512 KiB, halves of 256: checkpoints come quickly.
fn small_log_shard() -> Shard<MemDevice> {
    let mut fo = FormatOptions::new(ShardId(0), ZONE);
    fo.wal_bytes = Some(512 << 10);
    Shard::format(MemDevice::new(ZONE, 64), &fo, small_opts()).unwrap()
}

/// The log fills while a checkpoint is held: the operation that needs room
/// waits for it (counted), and nothing is lost.
#[test]
fn a_full_log_waits_for_the_checkpoint_under_way() {
    let mut s = small_log_shard();
    let mut made = 0u32;
    // Long names: each record is large, so the half fills quickly. Every
    // 97th file stays; the others are removed again, so the tables stay small.
    let name = |i: u32| format!("{i:0>200}");
    let churn = |s: &mut Shard<MemDevice>, made: &mut u32| {
        let n = name(*made);
        s.create(ROOT, n.as_bytes(), CreateArgs::file(0o644)).unwrap();
        if *made % 97 != 0 {
            s.unlink(ROOT, n.as_bytes()).unwrap();
        }
        *made += 1;
    };
    // Checkpoints start as a half fills and finish before the other does.
    let base = s.stats().checkpoints;
    for _ in 0..5_000 {
        churn(&mut s, &mut made);
    }
    assert!(s.stats().checkpoints >= base + 3, "{:?}", s.stats());
    assert_eq!(s.stats().log_full_waits, 0, "the checkpoints kept up");
    // Held, the checkpoint lets the log fill up to the largest record.
    let handle = s.io.device().handle();
    handle.hold(Some(PAGE_SIZE..3 * PAGE_SIZE));
    while !s.checkpointing() {
        churn(&mut s, &mut made);
    }
    while s.wal.free_bytes() >= MAX_RECORD_BYTES {
        s.create(ROOT, name(made).as_bytes(), CreateArgs::file(0o644)).unwrap();
        made += 1;
    }
    assert!(s.checkpointing(), "{:?}", s.stats());
    // The next operation waits for it, then a snapshot moves the log on.
    handle.hold(None);
    let n = name(made);
    s.create(ROOT, n.as_bytes(), CreateArgs::file(0o644)).unwrap();
    made += 1;
    assert_eq!(s.stats().log_full_waits, 1, "{:?}", s.stats());
    assert!(s.wal.free_bytes() >= MAX_RECORD_BYTES);
    let mut s = reopen(s);
    for i in (0..made).step_by(97) {
        s.lookup(ROOT, name(i).as_bytes()).unwrap();
    }
    s.lookup(ROOT, n.as_bytes()).unwrap();
}

/// A page of inode slots whose slots are all free is made resident as zeros,
/// not read: 64 creates on a fresh shard read no metadata page, and every
/// inode reads back after a reopen (and after a crash of the uncommitted
/// tail); a page with a slot in use is still read.
#[test]
fn fresh_pages_of_inodes_are_not_read() {
    let (mut s, handle) = fresh();
    let before = s.stats().icache;
    let mut files = Vec::new();
    for i in 0..64 {
        let a = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        files.push(a.ino);
    }
    let after = s.stats().icache;
    assert!(after.blank_loads >= before.blank_loads + 3, "{before:?} -> {after:?}");
    assert_eq!(after.misses, before.misses, "a metadata page was read: {after:?}");
    s.unlink(ROOT, b"f3").unwrap();
    s.commit().unwrap();
    let again = s.create(ROOT, b"again", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
    drop(s);
    let mut s = Shard::open(handle.crash(3), 0, small_opts()).unwrap();
    for (i, ino) in files.iter().enumerate().filter(|(i, _)| *i != 3) {
        assert_eq!(s.lookup(ROOT, format!("f{i}").as_bytes()).unwrap().ino, *ino);
        assert_eq!(s.getattr(*ino).unwrap().ino, *ino);
    }
    assert_eq!(s.getattr(again.ino).unwrap().ino, again.ino);
    // Slots in use beside it: the page is not taken as blank.
    s.unlink(ROOT, b"f7").unwrap();
    let blank = s.stats().icache.blank_loads;
    let reused = s.create(ROOT, b"reused", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.stats().icache.blank_loads, blank, "a page with slots in use");
    let mut s = reopen(s);
    assert_eq!(s.getattr(reused.ino).unwrap().ino, reused.ino);
    assert_eq!(s.getattr(files[8]).unwrap().ino, files[8]);
}

/// With misses deferred (`set_defer_misses`, as the worker sets it for
/// requests that change nothing), a getattr of an inode whose page is not in
/// memory starts reading it and fails with `TryAgain` at once; while that read
/// is held in flight, a create and a getattr of a resident inode go on, and
/// asking again starts no second read; once it finished, the getattr succeeds.
/// A background read that fails is not retried in the background: the next
/// load reads the page itself.
#[test]
fn inode_pages_are_read_in_the_background_when_asked() {
    use crate::device::{mem::Fault, IoKind};
    let (mut s, handle) = fresh();
    let mut files = Vec::new();
    // 40 pages of inodes, more than the 32 Icache blocks.
    for i in 0..640 {
        files
            .push(s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap().ino);
    }
    let mut s = reopen(s);
    let cold: Vec<InodeId> =
        files.iter().copied().filter(|ino| !s.icache.resident(s.inode_slots[ino])).collect();
    assert!(cold.len() >= 32, "{} cold inodes", cold.len());
    let (ino, other) = (cold[0], cold[cold.len() - 1]);
    let page = s.inode_slots[&ino] / crate::icache::INODES_PER_BLOCK;
    let at = s.geo.offset(s.geo.meta_page + page);
    handle.hold(Some(at..at + PAGE_SIZE));
    let reads = s.icache.stats().background_reads;
    s.set_defer_misses(true);
    assert_eq!(s.getattr(ino), Err(FsError::TryAgain));
    assert!(s.take_deferred_miss());
    assert!(s.icache_reading());
    // Meanwhile: a create and a resident inode (the create not asked to
    // stop: its new slot's page may be cold too, and is then read).
    s.set_defer_misses(false);
    let beside = s.create(ROOT, b"beside", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.getattr(beside.ino).unwrap().ino, beside.ino);
    assert!(!s.take_deferred_miss());
    // A new request (the create's change turned deferring off for its own).
    s.set_defer_misses(true);
    assert_eq!(s.getattr(ino), Err(FsError::TryAgain));
    assert!(s.take_deferred_miss());
    assert_eq!(s.icache.stats().background_reads, reads + 1, "one read per page");
    handle.hold(None);
    let done = s.icache.stats().background_reads_done;
    for _ in 0..100 {
        if s.icache_reads_done() > done {
            break;
        }
    }
    assert!(!s.icache_reading());
    assert_eq!(s.getattr(ino).unwrap().ino, ino);
    assert!(!s.take_deferred_miss());
    // A failed background read: the next load reads the page itself.
    s.set_defer_misses(true);
    handle.inject(Fault::next(IoKind::Read, 1));
    assert_eq!(s.getattr(other), Err(FsError::TryAgain));
    assert!(s.take_deferred_miss());
    while s.icache_reading() {
        s.icache_reads_done();
    }
    let reads = s.icache.stats().background_reads;
    assert_eq!(s.getattr(other).unwrap().ino, other);
    assert!(!s.take_deferred_miss());
    assert_eq!(s.icache.stats().background_reads, reads, "read blocking, not again");
    s.set_defer_misses(false);
}

/// Lets the data requests `handle` holds in flight finish, and waits until
/// the shard counted one finished (`what` says which, when none does).
fn release_data_requests(s: &mut Shard<MemDevice>, handle: &MemDevice, what: &str) {
    let done = s.data_requests_done();
    handle.hold(None);
    for _ in 0..100 {
        if s.data_requests_done() > done {
            return;
        }
    }
    panic!("{what}: no data request finished");
}

/// Two writers filling one block out of order, as IOR-hard's interleaved
/// segments do: its end first (after which its valid length is the whole
/// block), then its start. The block's first write went to the read cache when
/// it was submitted, so the second merges from memory while that write is
/// still in flight, held there: no stop, no wait for the device, and the block
/// holds both halves. Before, the whole-length block was not cached and every
/// such merge waited for a device read.
#[test]
fn a_block_filled_end_first_merges_from_memory_while_its_write_is_in_flight() {
    let (mut s, handle) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    let half = s.geo.block_size as u64 / 2;
    let end: Vec<u8> = (0..half).map(|i| (i * 3 + 1) as u8).collect();
    let start: Vec<u8> = (0..half).map(|i| (i * 5 + 2) as u8).collect();
    s.write(f, half, &end).unwrap();
    s.submit_data_writes();
    let inode = s.inode(f).unwrap();
    let run = s.block_run(&inode, BlockIndex(0)).expect("block 0 written");
    assert_eq!(run.valid as u64, 2 * half, "valid to the block's end");
    let at = s.geo.data_offset(run.page);
    handle.hold(Some(at..at + run.pages as u64 * PAGE_SIZE));
    let (hits, aheads) = (s.stats().read_cache_hits, s.stats().read_aheads);
    s.set_defer_misses(true);
    s.write(f, 0, &start).unwrap();
    assert_eq!(s.take_deferred(), None);
    s.set_defer_misses(false);
    assert_eq!(s.stats().merges_deferred, 0);
    assert_eq!(s.stats().read_aheads, aheads, "no device read of the old bytes");
    assert!(s.stats().read_cache_hits > hits, "merged from the read cache");
    release_data_requests(&mut s, &handle, "the first write finished");
    let back = s.read(f, 0, 2 * half as usize).unwrap();
    assert!(back[..half as usize] == start[..] && back[half as usize..] == end[..]);
    let mut s = reopen(s);
    let back = s.read(f, 0, 2 * half as usize).unwrap();
    assert!(back[..half as usize] == start[..] && back[half as usize..] == end[..], "reopened");
}

/// Data requests are numbered, and `data_settled` is the number below which
/// all finished: it stays at the oldest in flight while a later one finishes,
/// and reaches `data_issued` once none is in flight. A request stopped at data
/// pages in flight runs again when it reached the `data_issued` of its stop,
/// not at each other completion (which used up its four stops while its own
/// pages were still being written, then made it wait for the device).
#[test]
fn data_settled_stays_at_the_oldest_request_in_flight() {
    let (mut s, handle) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    let g = s.create(ROOT, b"g", CreateArgs::file(0o644)).unwrap().ino;
    s.submit_data_writes();
    assert_eq!(s.data_settled(), s.data_issued(), "nothing in flight");
    let done = s.data_requests_done();
    s.write(f, 0, &[1u8; 4096]).unwrap();
    let inode = s.inode(f).unwrap();
    let run = s.block_run(&inode, BlockIndex(0)).expect("block 0 written");
    let at = s.geo.data_offset(run.page);
    handle.hold(Some(at..at + run.pages as u64 * PAGE_SIZE));
    let first = s.data_issued();
    s.submit_data_writes();
    s.write(g, 0, &[2u8; 4096]).unwrap();
    s.submit_data_writes();
    let issued = s.data_issued();
    assert_eq!(issued, first + 2, "one request each");
    for _ in 0..100 {
        if s.data_requests_done() > done {
            break;
        }
    }
    assert_eq!(s.data_requests_done(), done + 1, "g's write finished");
    assert_eq!(s.data_settled(), first, "f's write, older, is still in flight");
    assert_eq!(s.background_progress().1, first);
    release_data_requests(&mut s, &handle, "f's write finished");
    assert_eq!(s.data_settled(), issued);
    assert_eq!(s.data_settled(), s.data_issued());
}

/// A partial write into a block whose old bytes two read-ahead windows hold
/// between them (each a part, both read: a reader's windows end at byte
/// offsets, not at blocks) merges them from memory. With a gap between the
/// windows it stops once while the gap is read beside them; without one it
/// does not stop. Either way the shard never waits for the device. Before,
/// such a merge read the whole block blocking: 16 waits of the 18 in one
/// conformance run of `pfs fsx`.
/// Collects data requests until none is in flight (a memory device finishes
/// them when polled); `what` names the case in the panic.
fn settle_data(s: &mut Shard<MemDevice>, what: &str) {
    for _ in 0..100 {
        s.data_requests_done();
        if !s.data_busy() {
            return;
        }
    }
    panic!("{what}: the data requests never finished");
}

#[test]
fn a_partial_write_merges_old_bytes_that_two_read_ahead_windows_hold() {
    for gap in [0u64, 4] {
        let (mut s, _handle) = fresh();
        let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
        let bs = s.geo.block_size as usize;
        let old: Vec<u8> = (0..bs).map(|i| (i * 7 + 3) as u8).collect();
        s.write(f, 0, &old).unwrap();
        let mut s = reopen(s);
        s.create(ROOT, b"before", CreateArgs::file(0o644)).unwrap();
        let inode = s.inode(f).unwrap();
        let run = s.block_run(&inode, BlockIndex(0)).expect("block 0 written");
        let pages = run.pages as u64;
        let left = (pages - gap) / 2;
        s.prefetch(run.page, left);
        s.prefetch(run.page + left + gap, pages - left - gap);
        let settle = |s: &mut Shard<MemDevice>| settle_data(s, &format!("gap {gap}"));
        settle(&mut s);
        let waits = s.stats().device_waits;
        s.set_defer_misses(true);
        let wrote = s.write(f, 100, b"new bytes");
        if gap == 0 {
            assert_eq!(wrote, Ok(9), "no gap: merged at once");
        } else {
            assert_eq!(wrote, Err(FsError::TryAgain), "gap {gap}: stops while it is read");
            assert_eq!(s.take_deferred(), Some(DeferredOn::Data));
            settle(&mut s);
            s.set_defer_misses(true);
            assert_eq!(s.write(f, 100, b"new bytes"), Ok(9), "gap {gap}: run again");
        }
        assert_eq!(s.take_deferred(), None);
        s.set_defer_misses(false);
        assert_eq!(s.stats().device_waits, waits, "gap {gap}: waited for the device");
        let mut want = old.clone();
        want[100..109].copy_from_slice(b"new bytes");
        assert!(s.read(f, 0, bs).unwrap() == want, "gap {gap}: the merged block");
        let mut s = reopen(s);
        assert!(s.read(f, 0, bs).unwrap() == want, "gap {gap}: reopened");
    }
}

/// A partial block write whose old bytes memory does not hold, met while
/// the device queue is full of data writes, starts the read of them all the
/// same (it waits in the shard's queue for room) and stops, instead of
/// reading the block blocking behind the queue; run again once the requests
/// finished, it merges from memory, never waiting for the device.
#[test]
fn a_partial_write_behind_a_full_queue_reads_its_old_bytes_behind_it_instead_of_waiting() {
    let depth = 4;
    let dev = MemDevice::new(ZONE, depth);
    let mut s = Shard::format(dev, &FormatOptions::new(ShardId(0), ZONE), small_opts()).unwrap();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    let others: Vec<_> = (0..depth)
        .map(|i| s.create(ROOT, format!("g{i}").as_bytes(), CreateArgs::file(0o644)).unwrap().ino)
        .collect();
    let old: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    s.write(f, 0, &old).unwrap();
    let mut s = reopen(s);
    // The first create after an open commits the inode number floor, and a
    // commit waits for the data requests before it: taken now.
    s.create(ROOT, b"before", CreateArgs::file(0o644)).unwrap();
    let settle = |s: &mut Shard<MemDevice>| settle_data(s, "the merge");
    // Each write submitted alone: one request each, the queue full.
    for (i, &g) in others.iter().enumerate() {
        s.write(g, 0, &[i as u8; 4096]).unwrap();
        s.submit_data_writes();
    }
    assert_eq!(s.io.device().in_flight(), depth, "the queue is full of data writes");
    let (waits, held) = (s.stats().device_waits, s.stats().held_back);
    let mut stops = 0;
    let wrote = loop {
        s.set_defer_misses(true);
        let wrote = s.write(f, 100, b"new bytes");
        if wrote != Err(FsError::TryAgain) {
            break wrote;
        }
        assert_eq!(s.take_deferred(), Some(DeferredOn::Data));
        stops += 1;
        assert!(stops <= 2, "stopped {stops} times");
        assert_eq!(s.io.held(), 1, "the read of the old bytes waits for room");
        settle(&mut s);
    };
    s.set_defer_misses(false);
    assert_eq!(wrote, Ok(9));
    assert_eq!(stops, 1, "while its old bytes were read behind the full queue");
    assert_eq!(s.stats().held_back, held + 1);
    assert_eq!(s.stats().device_waits, waits, "waited for the device");
    let mut want = old.clone();
    want[100..109].copy_from_slice(b"new bytes");
    assert!(s.read(f, 0, 3000).unwrap() == want, "the merged block");
    for (i, &g) in others.iter().enumerate() {
        assert!(s.read(g, 0, 4096).unwrap() == vec![i as u8; 4096], "file g{i}");
    }
    let mut s = reopen(s);
    assert!(s.read(f, 0, 3000).unwrap() == want, "reopened");
}

/// Data writes that find the device queue full wait in the shard's queue
/// instead of the worker waiting for the device; once `HELD_DATA_MAX` of
/// them wait, a write that can still stop does, and runs again once the data
/// requests in flight finished. Nothing written is lost or reordered.
#[test]
fn data_writes_behind_a_full_device_queue_stop_instead_of_waiting() {
    use super::dataio::{BATCH_BYTES, HELD_DATA_MAX};
    let dev = MemDevice::new(ZONE, 2);
    let mut s = Shard::format(dev, &FormatOptions::new(ShardId(0), ZONE), small_opts()).unwrap();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    s.commit().unwrap();
    let chunk = BATCH_BYTES;
    let fill = |at: u64| vec![(at / chunk as u64) as u8 + 1; chunk];
    let (waits, held) = (s.stats().device_waits, s.stats().held_back);
    let mut written = 0u64;
    loop {
        s.set_defer_misses(true);
        let wrote = s.write(f, written, &fill(written));
        s.set_defer_misses(false);
        match wrote {
            Ok(n) => {
                assert_eq!(n, chunk);
                written += chunk as u64;
            }
            Err(FsError::TryAgain) => break,
            Err(e) => panic!("write at {written}: {e:?}"),
        }
        assert!(written <= 16 << 20, "no write stopped: held writes grew past their bound");
    }
    assert_eq!(s.take_deferred(), Some(DeferredOn::Data));
    assert_eq!(s.stats().writes_deferred, 1);
    assert_eq!(s.stats().device_waits, waits, "a write waited for the device");
    let bytes = s.io.held_data_bytes();
    assert!((HELD_DATA_MAX..HELD_DATA_MAX + chunk).contains(&bytes), "{bytes} bytes held");
    assert!(s.stats().held_back > held);
    settle_data(&mut s, "the held writes");
    assert_eq!(s.io.held(), 0);
    // Run again once they finished, it goes through.
    s.set_defer_misses(true);
    assert_eq!(s.write(f, written, &fill(written)), Ok(chunk));
    s.set_defer_misses(false);
    written += chunk as u64;
    let check = |s: &mut Shard<MemDevice>, what: &str| {
        for at in (0..written).step_by(chunk) {
            assert!(s.read(f, at, chunk).unwrap() == fill(at), "{what}: the MiB at {at}");
        }
    };
    check(&mut s, "read back");
    let mut s = reopen(s);
    check(&mut s, "reopened");
}

/// A partial block write whose old bytes memory does not hold stops before
/// it changed anything, reads them into the read-ahead runs in the
/// background (once, however often it is asked again meanwhile), and merges
/// them from memory when run again after the read finished: with their
/// page held in flight again, a blocking read of it would panic.
#[test]
fn a_partial_write_reads_its_old_bytes_in_the_background_when_asked() {
    let (mut s, handle) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    let first: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    s.write(f, 0, &first).unwrap();
    let mut s = reopen(s);
    // The first create after an open commits the inode number floor, and a
    // commit waits for the data requests before it: taken now.
    s.create(ROOT, b"before", CreateArgs::file(0o644)).unwrap();
    let inode = s.inode(f).unwrap();
    let run = s.block_run(&inode, BlockIndex(0)).expect("block 0 written");
    let at = s.geo.data_offset(run.page);
    handle.hold(Some(at..at + PAGE_SIZE));
    let aheads = s.stats().read_aheads;
    s.set_defer_misses(true);
    assert_eq!(s.write(f, 3000, b"appended"), Err(FsError::TryAgain));
    assert_eq!(s.take_deferred(), Some(DeferredOn::Data));
    assert_eq!(s.stats().merges_deferred, 1);
    assert_eq!(s.stats().read_aheads, aheads + 1, "the old bytes are being read");
    // Meanwhile: other operations, and the write asked again waits again.
    s.create(ROOT, b"beside", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.lookup(ROOT, b"before").unwrap().kind, FileType::Regular);
    s.set_defer_misses(true);
    assert_eq!(s.write(f, 3000, b"appended"), Err(FsError::TryAgain));
    assert_eq!(s.take_deferred(), Some(DeferredOn::Data));
    assert_eq!(s.stats().read_aheads, aheads + 1, "one read of the old bytes");
    s.set_defer_misses(false);
    assert_eq!(s.getattr(f).unwrap().size, 3000, "a stopped write changed nothing");
    release_data_requests(&mut s, &handle, "the read of the old bytes finished");
    handle.hold(Some(at..at + PAGE_SIZE));
    s.set_defer_misses(true);
    assert_eq!(s.write(f, 3000, b"appended"), Ok(8));
    assert_eq!(s.take_deferred(), None);
    s.set_defer_misses(false);
    handle.hold(None);
    let mut want = first.clone();
    want.extend_from_slice(b"appended");
    assert_eq!(s.read(f, 0, 8192).unwrap(), want);
    let mut s = reopen(s);
    assert_eq!(s.read(f, 0, 8192).unwrap(), want, "after a restart");
}

/// A listing's attributes: `None` for an inode of another shard. Without
/// misses deferred, all of them. With misses deferred the listing never waits
/// for the device: a call whose first inode is cold stops while the pages of
/// the first ones are read (a quarter of the Icache), and one that meets a
/// cold inode after warm ones answers up to it and starts reading the next
/// pages; listed on from where each answer ended, as the client does, every
/// attribute comes back, though the pages of the 1,600 inodes are more than
/// the Icache's 32 blocks (the least it has).
#[test]
fn attributes_of_a_listing_never_wait_for_the_device() {
    let (mut s, _handle) = fresh();
    let mut asked = Vec::new();
    for i in 0..1600 {
        let ino = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap().ino;
        s.write(ino, 0, &vec![1u8; i % 7]).unwrap();
        asked.push(ino);
    }
    let elsewhere = InodeId::compose(ShardId(3), 5);
    asked.insert(100, elsewhere);
    let check = |attrs: &[Option<FileAttr>], from: usize| {
        for (k, a) in attrs.iter().enumerate() {
            let (i, ino) = (from + k, asked[from + k]);
            match a {
                None => assert_eq!(ino, elsewhere, "entry {i}"),
                Some(a) => {
                    let n = if i < 100 { i } else { i - 1 };
                    assert_eq!((a.ino, a.size), (ino, (n % 7) as u64), "entry {i}");
                }
            }
        }
    };
    let mut s = reopen(s);
    let mut cold: Vec<u64> = asked[..]
        .iter()
        .filter_map(|ino| s.inode_slots.get(ino).copied())
        .filter(|&slot| !s.icache.resident(slot))
        .map(|slot| slot / crate::icache::INODES_PER_BLOCK)
        .collect();
    cold.dedup();
    assert!(cold.len() > 32, "more cold pages ({}) than Icache blocks", cold.len());
    let waits = s.stats().device_waits;
    let reads = s.stats().icache.background_reads;
    let (mut from, mut stops, mut answers) = (0, 0, 0);
    while from < asked.len() {
        s.set_defer_misses(true);
        let r = s.attrs_of(&asked[from..]);
        s.set_defer_misses(false);
        match r {
            Err(FsError::TryAgain) => {
                let on = s.take_deferred();
                assert!(
                    matches!(on, Some(DeferredOn::InodePage | DeferredOn::InodePageWait)),
                    "{on:?}"
                );
                stops += 1;
                assert!(stops <= 400, "stops once per batch of pages at most");
                while s.icache_reading() {
                    s.icache_reads_done();
                }
            }
            Ok(attrs) => {
                assert!(!attrs.is_empty(), "an answer lists something");
                check(&attrs, from);
                from += attrs.len();
                answers += 1;
            }
            Err(e) => panic!("listing from {from}: {e}"),
        }
    }
    assert_eq!(s.stats().device_waits, waits, "the listing waited for the device");
    assert!(stops >= 1 && answers >= 2, "{stops} stops, {answers} answers");
    let read = s.stats().icache.background_reads - reads;
    assert!(read >= cold.len() as u64, "{read} pages read in the background, {} cold", cold.len());
    // Without deferring (a request that changed something), all at once.
    let attrs = s.attrs_of(&asked).unwrap();
    assert_eq!(attrs.len(), asked.len());
    check(&attrs, 0);
}

/// A data read does not wait either: of a cold inode it stops at the inode's
/// page, and of pages whose write is in flight it stops until the write
/// finished, then reads them from memory (the write left the partly filled
/// block in the read cache).
#[test]
fn a_read_stops_at_a_cold_inode_and_at_pages_being_written_when_asked() {
    let (mut s, handle) = fresh();
    // 40 pages of inodes, more than the 32 Icache blocks: after a restart
    // some are not in memory.
    let mut files = Vec::new();
    for i in 0..640 {
        let ino = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap().ino;
        s.write(ino, 0, b"first bytes").unwrap();
        files.push(ino);
    }
    let mut s = reopen(s);
    let f = *files.iter().find(|ino| !s.icache.resident(s.inode_slots[ino])).expect("a cold inode");
    use super::dataio::{ReadShape, ReadStart};
    let shape = ReadShape { prefix: 0, pad: 0, background: true, gather: false };
    s.set_defer_misses(true);
    assert_eq!(s.read_start(f, 0, 100, ALL_BLOCKS, shape), Err(FsError::TryAgain));
    assert_eq!(s.take_deferred(), Some(DeferredOn::InodePage));
    s.set_defer_misses(false);
    assert_eq!(s.getattr(f).unwrap().size, 11);
    // A new block written and in flight, held there.
    let data = vec![7u8; 5000];
    s.write(f, 0, &data).unwrap();
    s.submit_data_writes();
    let inode = s.inode(f).unwrap();
    let run = s.block_run(&inode, BlockIndex(0)).expect("block 0 written");
    let at = s.geo.data_offset(run.page);
    handle.hold(Some(at..at + 2 * PAGE_SIZE));
    s.set_defer_misses(true);
    assert_eq!(s.read_start(f, 0, 5000, ALL_BLOCKS, shape), Err(FsError::TryAgain));
    assert_eq!(s.take_deferred(), Some(DeferredOn::Data));
    assert_eq!(s.stats().reads_deferred, 1);
    release_data_requests(&mut s, &handle, "the write finished");
    assert_eq!(s.read_start(f, 0, 5000, ALL_BLOCKS, shape), Ok(ReadStart::Done(data)));
    assert_eq!(s.take_deferred(), None);
    s.set_defer_misses(false);
}

/// Changes wait for inode pages the same way, as long as nothing was changed
/// yet: an unlink of a cold inode stops with nothing logged and the name still
/// there, and succeeds once the page was read; once a request changed
/// something (a create), its later reads wait for the device instead.
#[test]
fn a_change_stops_at_a_cold_inode_only_before_it_changed_anything() {
    let (mut s, _) = fresh();
    let mut files = Vec::new();
    for i in 0..640 {
        files
            .push(s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap().ino);
    }
    let mut s = reopen(s);
    let cold: Vec<usize> =
        (0..files.len()).filter(|&i| !s.icache.resident(s.inode_slots[&files[i]])).collect();
    assert!(cold.len() >= 32, "{} cold inodes", cold.len());
    let (i, j) = (cold[0], cold[cold.len() - 1]);
    let lsn = s.wal.next_lsn();
    s.set_defer_misses(true);
    let name = format!("f{i}");
    assert_eq!(s.unlink(ROOT, name.as_bytes()), Err(FsError::TryAgain));
    assert!(s.take_deferred_miss());
    assert_eq!(s.wal.next_lsn(), lsn, "nothing logged");
    assert_eq!(s.lookup(ROOT, name.as_bytes()).unwrap().ino, files[i]);
    while s.icache_reading() {
        s.icache_reads_done();
    }
    s.set_defer_misses(true);
    s.unlink(ROOT, name.as_bytes()).unwrap();
    assert!(!s.take_deferred_miss());
    assert_eq!(s.lookup(ROOT, name.as_bytes()).unwrap_err(), FsError::NotFound);
    // A create, then a read of a cold inode in the same request: waits.
    s.set_defer_misses(true);
    s.create(ROOT, b"made", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.getattr(files[j]).unwrap().ino, files[j]);
    assert!(!s.take_deferred_miss());
    s.set_defer_misses(false);
}

/// A create whose new inode's slot lies on a page that holds other inodes
/// and is not in memory (a hole a removed file left, after a restart) does
/// not read that page blocking when asked not to: it stops with its slot given
/// back and nothing logged, and runs again once the page is in.
#[test]
fn a_create_into_a_cold_page_stops_instead_of_reading_it() {
    let (mut s, _) = fresh();
    for i in 0..640 {
        s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
    }
    // A hole far from the root's page, then a restart with nothing to replay:
    // the hole's page is not in memory.
    let gone = s.lookup(ROOT, b"f300").unwrap().ino;
    let hole = s.inode_slots[&gone];
    s.unlink(ROOT, b"f300").unwrap();
    s.commit().unwrap();
    s.checkpoint().unwrap();
    let mut s = reopen(s);
    // Other pages read since push the hole's out of the Icache.
    for i in (0..640).step_by(16).filter(|i| i / 16 != 300 / 16) {
        let ino = s.lookup(ROOT, format!("f{i}").as_bytes()).unwrap().ino;
        s.getattr(ino).unwrap();
    }
    assert!(!s.icache.resident(hole), "the hole's page is not in memory");
    let misses = s.stats().icache.misses;
    let lsn = s.wal.next_lsn();
    let free = s.slot_bitmap.free();
    let mut stops = 0;
    let made = loop {
        s.set_defer_misses(true);
        let r = s.create(ROOT, b"new", CreateArgs::file(0o644));
        s.set_defer_misses(false);
        if s.take_deferred().is_none() {
            break r.unwrap();
        }
        assert_eq!(r, Err(FsError::TryAgain));
        stops += 1;
        assert!(stops <= 2, "stopped {stops} times");
        assert_eq!(s.slot_bitmap.free(), free, "the slot was given back");
        assert!(s.wal.next_lsn() <= lsn + 1, "at most the inode number floor was logged");
        assert_eq!(s.lookup(ROOT, b"new"), Err(FsError::NotFound));
        while s.icache_reading() {
            s.icache_reads_done();
        }
    };
    assert!(stops >= 1, "the hole's page was cold: the create stopped for it");
    assert_eq!(s.stats().icache.misses, misses, "no page read blocking");
    assert_eq!(s.lookup(ROOT, b"new").unwrap().ino, made.ino);
    assert_eq!(s.inode_slots[&made.ino], hole, "it took the hole's slot");
    let mut s = reopen(s);
    assert_eq!(s.lookup(ROOT, b"new").unwrap().ino, made.ino);
    assert_eq!(s.lookup(ROOT, b"f301").unwrap().kind, FileType::Regular);
}

/// A full commit group starts a commit beside the operations instead of
/// waiting for one: with the log's writes held in flight, creates go on past
/// the group's bound (a blocking commit would wait for the held write), the
/// commit stays under way, and once released everything is durable.
#[test]
fn a_full_group_starts_a_commit_without_waiting() {
    let (mut s, handle) = fresh();
    // The first create makes the inode number floor durable, waiting.
    s.create(ROOT, b"first", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
    let forced = s.stats().forced_commits;
    let (offset, bytes) = s.geo.wal_half(s.wal.gen());
    handle.hold(Some(offset..offset + bytes));
    let name = |i: u32| format!("{i:0>200}");
    let mut made = 0;
    // Past one group (64 KiB here), not two.
    while s.wal.pending_bytes() < 96 << 10 {
        s.create(ROOT, name(made).as_bytes(), CreateArgs::file(0o644)).unwrap();
        made += 1;
        assert!(made < 10_000);
    }
    assert!(s.committing(), "a commit started when the group filled");
    assert_eq!(s.stats().forced_commits, forced, "nobody waited for it");
    handle.hold(None);
    let mut s = reopen(s);
    for i in 0..made {
        s.lookup(ROOT, name(i).as_bytes()).unwrap();
    }
}

/// A write's whole blocks whose runs lie together are staged in one buffer
/// (copied once, one device write), and a block it covers in part is staged
/// alone; every byte reads back, staged and after a restart.
#[test]
fn whole_blocks_of_a_write_share_one_staged_buffer() {
    let (mut s, _) = fresh();
    let bs = s.geo.block_size as usize;
    let block_pages = (bs as u64).div_ceil(PAGE_SIZE);
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    s.commit().unwrap();
    assert!(s.staged_runs().is_empty());
    // Eight whole blocks.
    let data: Vec<u8> = (0..8 * bs).map(|i| (i % 251) as u8).collect();
    s.write(f, 0, &data).unwrap();
    let runs = s.staged_runs();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].1, 8 * block_pages);
    assert_eq!(s.read(f, 0, data.len()).unwrap(), data);
    let writes = s.stats().data_writes;
    s.commit().unwrap();
    assert_eq!(s.stats().data_writes, writes + 1, "one device write");
    // A part of block 8, blocks 9 and 10 whole, a part of block 11.
    let at = 8 * bs + 1000;
    let more: Vec<u8> = (0..3 * bs).map(|i| (i % 241) as u8 + 1).collect();
    s.write(f, at as u64, &more).unwrap();
    let runs = s.staged_runs();
    let sizes: Vec<u64> = runs.iter().map(|r| r.1).collect();
    assert_eq!(sizes.len(), 3, "{runs:?}");
    assert_eq!(sizes[1], 2 * block_pages, "the two whole blocks together: {runs:?}");
    let mut all = data.clone();
    all.resize(at, 0);
    all.extend_from_slice(&more);
    assert_eq!(s.read(f, 0, all.len()).unwrap(), all);
    let mut s = reopen(s);
    assert_eq!(s.read(f, 0, all.len() + 10).unwrap(), all);
}

/// Runs the commit under way with the log's writes (`log_writes`, held in
/// flight by the test) let through, then holds them again.
fn finish_held_commit(
    s: &mut Shard<MemDevice>,
    handle: &MemDevice,
    log_writes: &std::ops::Range<u64>,
) {
    let done = s.commits_done();
    handle.hold(None);
    while s.commits_done() == done {
        s.poll_device();
        s.poll_commit();
    }
    handle.hold(Some(log_writes.clone()));
}

/// A request that needs a commit first and changed nothing yet
/// (`set_defer_misses`) does not wait for it: the first create of a shard
/// (inode numbers up to their durable floor) and a create that finds two
/// groups of records pending stop with the commit under way (the log's
/// writes held in flight: a blocking commit would panic in `MemDevice`), and
/// run again once it finished.
#[test]
fn a_request_stops_for_the_commit_it_needs_instead_of_waiting() {
    let (mut s, handle) = fresh();
    let (offset, bytes) = s.geo.wal_half(s.wal.gen());
    let log_writes = offset..offset + bytes;
    let finish_commit = |s: &mut Shard<MemDevice>| finish_held_commit(s, &handle, &log_writes);
    handle.hold(Some(log_writes.clone()));
    // The first create: no inode number is durable yet.
    s.set_defer_misses(true);
    assert_eq!(s.create(ROOT, b"first", CreateArgs::file(0o644)), Err(FsError::TryAgain));
    assert_eq!(s.take_deferred(), Some(DeferredOn::Commit));
    assert!(s.committing());
    assert_eq!(s.lookup(ROOT, b"first"), Err(FsError::NotFound), "the create changed nothing");
    finish_commit(&mut s);
    s.set_defer_misses(true);
    s.create(ROOT, b"first", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.take_deferred(), None);
    // Creates until the pending records reach two groups (64 KiB each here):
    // the group commit that starts at one stays in flight.
    let name = |i: u32| format!("{i:0>200}");
    let mut made = 0;
    let stopped = loop {
        s.set_defer_misses(true);
        let lsn = s.wal.next_lsn();
        match s.create(ROOT, name(made).as_bytes(), CreateArgs::file(0o644)) {
            Ok(_) => made += 1,
            Err(e) => {
                assert_eq!(e, FsError::TryAgain);
                assert_eq!(s.wal.next_lsn(), lsn, "nothing logged");
                break made;
            }
        }
        assert_eq!(s.take_deferred(), None);
        assert!(made < 10_000, "two groups never filled");
    };
    assert_eq!(s.take_deferred(), Some(DeferredOn::Commit));
    assert!(s.committing());
    assert_eq!(s.lookup(ROOT, name(stopped).as_bytes()), Err(FsError::NotFound));
    // Runs again after each commit until the group has room.
    let mut runs = 0;
    loop {
        finish_commit(&mut s);
        s.set_defer_misses(true);
        let result = s.create(ROOT, name(stopped).as_bytes(), CreateArgs::file(0o644));
        runs += 1;
        match s.take_deferred() {
            None => {
                result.unwrap();
                break;
            }
            Some(on) => assert_eq!((on, result), (DeferredOn::Commit, Err(FsError::TryAgain))),
        }
        assert!(runs < 4, "still stopped after {runs} commits");
    }
    s.set_defer_misses(false);
    let st = s.stats();
    assert_eq!(st.forced_commits, 0, "nobody waited for a commit");
    assert!(st.commits_deferred >= 2, "{st:?}");
    handle.hold(None);
    let mut s = reopen(s);
    s.lookup(ROOT, b"first").unwrap();
    for i in 0..=stopped {
        s.lookup(ROOT, name(i).as_bytes()).unwrap();
    }
}

/// A request of two operations (two creates here, as a write that settles a
/// truncation first, or a rename's steps) that meets two groups of pending
/// records stops at its first one, before it changed anything; once it went
/// on, its second finds room past the two groups instead of waiting for the
/// commit (the log's writes are held in flight: a blocking commit would panic
/// in `MemDevice`). Before, the second waited whenever the first filled the
/// second group.
#[test]
fn a_request_that_went_on_finds_room_for_its_next_operation() {
    let (mut s, handle) = fresh();
    s.create(ROOT, b"first", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
    // An Icache with room for every inode here: the log alone asks for commits.
    let opts = ShardOptions { icache_blocks: 4096, ..small_opts() };
    let mut s = Shard::open(s.into_device(), 0, opts).unwrap();
    s.create(ROOT, b"second", CreateArgs::file(0o644)).unwrap();
    s.commit().unwrap();
    let (offset, bytes) = s.geo.wal_half(s.wal.gen());
    let log_writes = offset..offset + bytes;
    handle.hold(Some(log_writes.clone()));
    // The first create after the open waited for its inode number floor.
    let forced = s.stats().forced_commits;
    let name = |i: u32| format!("{i:0>200}");
    let mut made = 0;
    let mut stops = 0;
    while stops < 3 {
        s.set_defer_misses(true);
        let lsn = s.wal.next_lsn();
        match s.create(ROOT, name(made).as_bytes(), CreateArgs::file(0o644)) {
            Ok(_) => made += 1,
            Err(e) => {
                assert_eq!(e, FsError::TryAgain);
                assert_eq!(s.take_deferred(), Some(DeferredOn::Commit));
                assert_eq!(s.wal.next_lsn(), lsn, "stopped before its first change");
                finish_held_commit(&mut s, &handle, &log_writes);
                stops += 1;
                continue;
            }
        }
        // The request's second operation, after a change.
        s.create(ROOT, name(made).as_bytes(), CreateArgs::file(0o644)).unwrap();
        made += 1;
        assert_eq!(s.take_deferred(), None);
        assert!(made < 20_000, "two groups never filled");
    }
    s.set_defer_misses(false);
    assert_eq!(s.stats().forced_commits, forced, "nobody waited for a commit");
    handle.hold(None);
    let mut s = reopen(s);
    for i in 0..made {
        s.lookup(ROOT, name(i).as_bytes()).unwrap();
    }
}

/// A small file's data for a lookup comes from memory only: staged or in the
/// read cache it is there (holes as zeros), only on the device it is not (no
/// read is made), and a file larger than asked, an empty one or a directory
/// has none.
#[test]
fn a_small_files_data_comes_from_memory_only() {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let f = s.create(ROOT, b"small", CreateArgs::file(0o644)).unwrap();
    let data: Vec<u8> = (0..3901u32).map(|i| (i % 251) as u8 + 1).collect();
    s.write(f.ino, 0, &data).unwrap();
    assert_eq!(s.small_data_in_memory(f.ino, 4096), Some(data.clone()), "staged");
    assert_eq!(s.small_data_in_memory(f.ino, 3900), None, "larger than asked");
    let holey = s.create(ROOT, b"holey", CreateArgs::file(0o644)).unwrap();
    s.write(holey.ino, 1000, b"tail").unwrap();
    let mut want = vec![0u8; 1004];
    want[1000..].copy_from_slice(b"tail");
    assert_eq!(s.small_data_in_memory(holey.ino, 4096), Some(want), "a hole reads as zeros");
    let empty = s.create(ROOT, b"empty", CreateArgs::file(0o644)).unwrap();
    assert_eq!(s.small_data_in_memory(empty.ino, 4096), None, "empty");
    let dir = s.create(ROOT, b"d", CreateArgs::dir(0o755)).unwrap();
    assert_eq!(s.small_data_in_memory(dir.ino, 4096), None, "a directory");
    s.commit().unwrap();
    let mut s = reopen(s);
    assert_eq!(s.small_data_in_memory(f.ino, 4096), None, "only on the device");
    assert_eq!(s.small_data_in_memory(f.ino, 4096), None, "and not read into memory by asking");
    assert_eq!(s.read(f.ino, 0, 4096).unwrap(), data);
    assert_eq!(s.small_data_in_memory(f.ino, 4096), Some(data), "in the read cache once read");
}

/// A format cut by a power failure at any of its writes leaves a zone that
/// reads as the cut format its intent names, or (cut after the superblock
/// was written and synced) as formatted and opens: never a superblock over a
/// zone that cannot be opened. Each cut point's crash keeps a random half
/// of the unsynced sectors (seed = the cut point).
#[test]
fn a_format_cut_at_any_write_reads_as_cut_or_opens() {
    const SMALL: u64 = 16 << 20;
    let full = {
        let dev = MemDevice::new(SMALL, 64);
        let handle = dev.handle();
        let dev = Shard::mark_formatting(dev, 0, ShardId(2)).unwrap();
        Shard::format(dev, &FormatOptions::new(ShardId(2), SMALL), small_opts()).unwrap();
        handle.writes_submitted()
    };
    let (mut cut_seen, mut formatted_seen) = (0, 0);
    for cut in 1..=full + 1 {
        let dev = MemDevice::new(SMALL, 64);
        let handle = dev.handle();
        let (dev, z) = Shard::probe(dev, 0).unwrap();
        assert_eq!(z, Zone::Empty);
        let dev = Shard::mark_formatting(dev, 0, ShardId(2)).unwrap();
        handle.freeze_after_writes(cut.saturating_sub(1));
        let _ = Shard::format(dev, &FormatOptions::new(ShardId(2), SMALL), small_opts());
        let after = handle.crash(cut);
        match Shard::probe(after, 0).unwrap() {
            (_, Zone::Cut(s)) => {
                assert_eq!(s, ShardId(2));
                cut_seen += 1;
            }
            (dev, Zone::Formatted(s)) => {
                assert_eq!(s, ShardId(2));
                let mut shard = Shard::open(dev, 0, small_opts())
                    .unwrap_or_else(|e| panic!("cut at write {cut}: formatted but {e}"));
                assert_eq!(shard.getattr(ROOT).unwrap().kind, FileType::Directory);
                formatted_seen += 1;
            }
            (_, Zone::Empty) => panic!("cut at write {cut}: the intent is gone"),
        }
    }
    assert!(cut_seen > 0 && formatted_seen > 0, "{cut_seen} cut, {formatted_seen} formatted");
}

/// Every table of the shard in a canonical order, with each inode's
/// attributes and each regular file's bytes: what a recovery must restore.
fn shard_dump(s: &mut Shard<MemDevice>) -> Vec<String> {
    let mut out = Vec::new();
    let mut parents: Vec<InodeId> = s.dentries.parents().collect();
    parents.sort();
    for parent in parents {
        s.dentries.for_each_from(parent, None, |name, value| {
            out.push(format!("dentry {parent} {} {value:#x}", String::from_utf8_lossy(name)));
            true
        });
    }
    let mut inos: Vec<(InodeId, u64)> = s.inode_slots.iter().map(|(i, s)| (*i, *s)).collect();
    inos.sort();
    for (ino, slot) in &inos {
        let a = s.getattr(*ino).unwrap();
        out.push(format!("inode {ino} slot {slot} {:?} size {} nlink {}", a.kind, a.size, a.nlink));
        if a.kind == FileType::Regular {
            let data = s.read(*ino, 0, a.size as usize + 1).unwrap();
            out.push(format!("data {ino} {:x}", crc32c::crc32c(&data)));
        }
    }
    out.extend(s.blocks.iter().map(|(k, r)| format!("block {k:?} {r:?}")));
    out.extend(s.extents.iter().map(|(k, e)| format!("extent {k:?} {e:?}")));
    let mut xattrs: Vec<String> = s
        .xattrs
        .iter()
        .flat_map(|(i, m)| m.iter().map(move |(n, v)| format!("xattr {i} {n:?} {v:?}")))
        .collect();
    xattrs.sort();
    out.extend(xattrs);
    out.extend(s.txns.iter().map(|(id, d)| format!("txn {id:#x} {d:?}")));
    out.extend(s.trims.iter().map(|(i, f)| format!("trim {i} {f}")));
    out
}

/// A checkpoint's image is encoded a few entries per poll while creates,
/// writes, unlinks, renames, truncates and extended attributes change the
/// tables between the slices, ahead of the walk and behind it. Then the
/// checkpoint finishes and power is lost with nothing else done: the shard
/// opens from the new checkpoint (its image fuzzy, the new half of the log
/// replayed over it) with exactly the tables, attributes and bytes it had.
#[test]
fn a_checkpoint_image_encoded_between_operations_recovers_exactly() {
    use rand::{Rng, SeedableRng};
    for seed in 0..8u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let (mut s, handle) = fresh();
        let d = s.create(ROOT, b"d", CreateArgs::dir(0o755)).unwrap().ino;
        let mut live: Vec<(InodeId, Vec<u8>)> = Vec::new();
        let mut made = 0u32;
        let mut create = |s: &mut Shard<MemDevice>, live: &mut Vec<(InodeId, Vec<u8>)>, r: u8| {
            // Names spread over the whole order: some sort before the walk, some after.
            let name = format!("{}{made:04}", (b'a' + r % 26) as char).into_bytes();
            made += 1;
            let parent = if made % 3 == 0 { d } else { ROOT };
            let f = s.create(parent, &name, CreateArgs::file(0o644)).unwrap();
            s.write(f.ino, 0, &name.repeat(1 + usize::from(r) * 37)).unwrap();
            live.push((parent, name));
        };
        for _ in 0..150 {
            create(&mut s, &mut live, rng.gen());
        }
        let (ino0, _) = s.lookup(ROOT, &live[0].1).map(|a| (a.ino, ())).unwrap();
        s.setxattr(ino0, b"user.k", b"v", XattrFlags::default()).unwrap();
        s.commit().unwrap();
        s.set_checkpoint_slice(5);
        let gen = s.wal.gen();
        s.start_checkpoint();
        assert!(s.checkpoint_encoding(), "seed {seed}: the image is encoded in slices");
        let mut ops = 0;
        while s.checkpoint_encoding() {
            let k = rng.gen_range(0..live.len());
            let (parent, name) = live[k].clone();
            let ino = s.lookup(parent, &name).unwrap().ino;
            match rng.gen_range(0..7) {
                0 | 1 => create(&mut s, &mut live, rng.gen()),
                2 => {
                    s.unlink(parent, &name).unwrap();
                    live.swap_remove(k);
                }
                3 => {
                    let new = format!("{}r{ops}", (b'a' + rng.gen_range(0..26u8)) as char);
                    s.rename(parent, &name, d, new.as_bytes(), RenameFlags::default()).unwrap();
                    live[k] = (d, new.into_bytes());
                }
                4 => {
                    let at = rng.gen_range(0..200_000u64);
                    s.write(ino, at, &vec![ops as u8; rng.gen_range(1..70_000)]).unwrap();
                }
                5 => {
                    let size = rng.gen_range(0..100_000u64);
                    s.setattr(ino, SetAttr { size: Some(size), ..SetAttr::default() }).unwrap();
                }
                _ => {
                    let value = format!("v{ops}");
                    s.setxattr(ino, b"user.x", value.as_bytes(), XattrFlags::default()).unwrap();
                }
            }
            ops += 1;
            s.poll_checkpoint();
        }
        assert!(ops > 30, "seed {seed}: {ops} operations ran inside the walk");
        let expected = shard_dump(&mut s);
        s.finish_checkpoint().unwrap();
        assert_eq!(s.stats().image_reencodes, 0, "seed {seed}");
        drop(s);
        let mut s = Shard::open(handle.crash(seed), 0, small_opts())
            .unwrap_or_else(|e| panic!("seed {seed}: recovery: {e}"));
        assert_eq!(s.stats().opened_gen, gen + 1, "seed {seed}: opened from the new checkpoint");
        let got = shard_dump(&mut s);
        assert_eq!(got, expected, "seed {seed}: recovered tables differ");
        assert!(s.census().unwrap().problems.is_empty(), "seed {seed}");
    }
}

/// Entries removed behind the walk while longer ones are made ahead of it
/// grow the image past its region: it is encoded again whole, and the
/// checkpoint still recovers exactly.
#[test]
fn an_image_grown_past_its_region_is_encoded_again_whole() {
    let (mut s, handle) = fresh();
    for i in 0..100 {
        s.create(ROOT, format!("a{i:03}").as_bytes(), CreateArgs::file(0o644)).unwrap();
    }
    s.commit().unwrap();
    s.set_checkpoint_slice(4);
    // Room for the tables as they are and a few entries more.
    s.ckpt_image_limit = s.table_bytes + 7 * 8 + 600;
    s.start_checkpoint();
    let mut i = 0;
    while s.checkpoint_encoding() {
        s.unlink(ROOT, format!("a{i:03}").as_bytes()).unwrap();
        s.create(ROOT, format!("z{i:0>200}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        s.poll_checkpoint();
        i += 1;
    }
    assert_eq!(s.stats().image_reencodes, 1, "{:?}", s.stats());
    let expected = shard_dump(&mut s);
    s.finish_checkpoint().unwrap();
    drop(s);
    let mut s = Shard::open(handle.crash(3), 0, small_opts()).unwrap();
    assert_eq!(shard_dump(&mut s), expected);
}

/// A request that finds the log full while the checkpoint that makes room is
/// held does not wait for it when it may stop: it stops with nothing changed,
/// the worker's polls alone finish that checkpoint and start the next, whose
/// snapshot moves the log, and the request then runs without waiting.
#[test]
fn a_request_stops_for_room_in_a_full_log_instead_of_waiting() {
    let mut s = small_log_shard();
    let handle = s.io.device().handle();
    handle.hold(Some(PAGE_SIZE..3 * PAGE_SIZE));
    let name = |i: u32| format!("{i:0>200}");
    let mut made = 0u32;
    while !s.checkpointing() || s.wal.free_bytes() >= MAX_RECORD_BYTES {
        s.create(ROOT, name(made).as_bytes(), CreateArgs::file(0o644)).unwrap();
        made += 1;
    }
    let (waits, moves) = (s.stats().log_full_waits, s.log_moves());
    s.set_defer_misses(true);
    let r = s.create(ROOT, b"late", CreateArgs::file(0o644));
    s.set_defer_misses(false);
    assert_eq!(r.unwrap_err(), FsError::TryAgain);
    assert_eq!(s.take_deferred(), Some(DeferredOn::LogRoom));
    assert_eq!(s.stats().log_full_waits, waits, "nobody waited");
    assert_eq!(s.stats().log_room_deferred, 1);
    assert_eq!(s.lookup(ROOT, b"late").unwrap_err(), FsError::NotFound, "nothing changed");
    handle.hold(None);
    for _ in 0..10_000 {
        if s.log_moves() != moves {
            break;
        }
        s.poll_checkpoint();
        if s.checkpointing() && !s.checkpoint_wants_cpu() {
            s.io.wait_any();
        }
    }
    assert!(s.log_moves() > moves, "polls alone made room: {:?}", s.stats());
    s.set_defer_misses(true);
    s.create(ROOT, b"late", CreateArgs::file(0o644)).unwrap();
    s.set_defer_misses(false);
    assert_eq!(s.stats().log_full_waits, waits, "nobody waited");
    let mut s = reopen(s);
    s.lookup(ROOT, b"late").unwrap();
    for i in 0..made {
        s.lookup(ROOT, name(i).as_bytes()).unwrap();
    }
}

/// A trim step whose file's inode page is not in memory stops as a request
/// does when asked (the worker asks), with nothing changed, and runs once the
/// page was read in the background.
#[test]
fn a_trim_step_stops_at_a_cold_inode_page_when_asked() {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let ino = many_block_file(&mut s, b"f", FileLayout::Block);
    s.setattr(ino, SetAttr { size: Some(10), ..SetAttr::default() }).unwrap();
    assert!(s.has_trims());
    let mut s = cold_reopened(s);
    assert!(!s.icache.resident(s.inode_slots[&ino]), "the file's inode page is cold");
    let free = s.statfs().blocks_free;
    let done = s.icache_reads_done();
    s.set_defer_misses(true);
    let stepped = s.trim_step();
    s.set_defer_misses(false);
    assert_eq!(stepped.unwrap_err(), FsError::TryAgain);
    assert_eq!(s.take_deferred(), Some(DeferredOn::InodePage));
    assert!(s.has_trims() && s.statfs().blocks_free == free, "nothing changed");
    while s.icache_reads_done() == done {
        assert!(s.io.wait_any(), "the page read is in flight");
    }
    s.set_defer_misses(true);
    assert!(s.trim_step().unwrap() > 0, "the page in memory, the step runs");
    s.set_defer_misses(false);
    run_trims(&mut s);
    assert_eq!(s.getattr(ino).unwrap().size, 10);
}

/// `s` reopened after 640 more inodes (40 pages, more than the Icache's 16
/// blocks), the last 600 read after the reopen: the pages of the inodes made
/// before are out of memory.
fn cold_reopened(mut s: Shard<MemDevice>) -> Shard<MemDevice> {
    let mut others = Vec::new();
    for i in 0..640 {
        others.push(s.create(ROOT, format!("o{i}").as_bytes(), CreateArgs::file(0o644)).unwrap());
    }
    let mut s = reopen(s);
    for o in &others[40..] {
        s.getattr(o.ino).unwrap();
    }
    s
}

/// A shard whose `names` (files in the root) were made first, their inode
/// pages out of memory (`cold_reopened`).
fn shard_with_cold(names: &[&[u8]]) -> (Shard<MemDevice>, Vec<FileAttr>) {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    let made: Vec<FileAttr> =
        names.iter().map(|n| s.create(ROOT, n, CreateArgs::file(0o644)).unwrap()).collect();
    let s = cold_reopened(s);
    for d in &made {
        assert!(!s.icache.resident(s.inode_slots[&d.ino]), "{:?}'s inode page is cold", d.ino);
    }
    (s, made)
}

/// Waits for the background inode page reads under way.
fn wait_page_reads(s: &mut Shard<MemDevice>, done: u64) {
    while s.icache_reads_done() == done {
        assert!(s.io.wait_any(), "the page read is in flight");
    }
}

#[test]
fn a_rename_stops_at_a_cold_inode_page_before_it_changes_anything() {
    // A new name: nothing is read before the first change but the moved
    // inode, which the rename changes after it.
    let (mut s, made) = shard_with_cold(&[b"f"]);
    let f = made[0].ino;
    let done = s.icache_reads_done();
    let pending = s.wal.pending_bytes();
    s.set_defer_misses(true);
    let renamed = s.rename(ROOT, b"f", ROOT, b"h", RenameFlags::default());
    s.set_defer_misses(false);
    assert_eq!(renamed.unwrap_err(), FsError::TryAgain);
    assert_eq!(s.take_deferred(), Some(DeferredOn::InodePage));
    assert_eq!(s.wal.pending_bytes(), pending, "nothing logged");
    assert_eq!(s.lookup(ROOT, b"f").unwrap().ino, f);
    assert_eq!(s.lookup(ROOT, b"h").unwrap_err(), FsError::NotFound);
    wait_page_reads(&mut s, done);
    s.set_defer_misses(true);
    let replaced = s.rename(ROOT, b"f", ROOT, b"h", RenameFlags::default()).unwrap();
    s.set_defer_misses(false);
    assert!(replaced.is_none(), "the page in memory, it runs");
    assert_eq!(s.lookup(ROOT, b"h").unwrap().ino, f);
    assert_eq!(s.lookup(ROOT, b"f").unwrap_err(), FsError::NotFound);
}

/// A page being written back is not in memory for an operation about to
/// change it: the device holds its buffer, and using it waits for the write
/// to land. A rename whose inodes' page is being written back stops before
/// its first change (it waited for the write-back after it, in the SIGKILL
/// soak with a 16-block Icache) and runs once the write-back finished.
#[test]
fn a_rename_stops_at_a_page_being_written_back_before_it_changes_anything() {
    let (mut s, _) = fresh();
    let f = s.create(ROOT, b"f", CreateArgs::file(0o644)).unwrap().ino;
    s.commit().unwrap();
    let slot = s.inode_slots[&f];
    s.icache.start_write_back_of(&mut s.io, slot);
    assert!(!s.icache.resident(slot), "a page being written back is not free to use");
    let (waits, pending) = (s.stats().device_waits, s.wal.pending_bytes());
    let written = s.icache.stats().writebacks_done;
    s.set_defer_misses(true);
    let renamed = s.rename(ROOT, b"f", ROOT, b"h", RenameFlags::default());
    s.set_defer_misses(false);
    assert_eq!(s.stats().device_waits, waits, "the rename waited for the write-back");
    assert_eq!(renamed.unwrap_err(), FsError::TryAgain);
    assert_eq!(s.take_deferred(), Some(DeferredOn::InodePageWait));
    assert_eq!(s.wal.pending_bytes(), pending, "nothing logged");
    s.icache_reads_done();
    assert_eq!(s.icache.stats().writebacks_done, written + 1, "the write-back finished");
    assert!(s.icache.resident(slot));
    s.set_defer_misses(true);
    s.rename(ROOT, b"f", ROOT, b"h", RenameFlags::default()).unwrap();
    s.set_defer_misses(false);
    assert_eq!(s.stats().device_waits, waits, "the rename waited for the device");
    assert_eq!(s.lookup(ROOT, b"h").unwrap().ino, f);
    assert_eq!(s.getattr(f).unwrap().kind, FileType::Regular);
}

/// A create whose new inode takes a page of free slots does not read it,
/// but when that page is being written back (its last inode removed) it
/// stops instead of waiting for the write to land, and runs once it did.
#[test]
fn a_create_stops_at_a_fresh_page_being_written_back() {
    let (mut s, _) = fresh();
    // Files until one is the first of its page, then that one removed: a
    // page of free slots, dirty.
    let mut i = 0;
    let slot = loop {
        let f = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        i += 1;
        let slot = s.inode_slots[&f.ino];
        if slot % crate::icache::INODES_PER_BLOCK == 0 {
            s.unlink(ROOT, format!("f{}", i - 1).as_bytes()).unwrap();
            break slot;
        }
    };
    s.commit().unwrap();
    s.icache.start_write_back_of(&mut s.io, slot);
    let (waits, pending) = (s.stats().device_waits, s.wal.pending_bytes());
    let written = s.icache.stats().writebacks_done;
    s.set_defer_misses(true);
    let made = s.create(ROOT, b"g", CreateArgs::file(0o644));
    s.set_defer_misses(false);
    assert_eq!(s.stats().device_waits, waits, "the create waited for the write-back");
    assert_eq!(made.unwrap_err(), FsError::TryAgain);
    assert_eq!(s.take_deferred(), Some(DeferredOn::InodePageWait));
    assert_eq!(s.wal.pending_bytes(), pending, "nothing logged");
    s.icache_reads_done();
    assert_eq!(s.icache.stats().writebacks_done, written + 1, "the write-back finished");
    s.set_defer_misses(true);
    let g = s.create(ROOT, b"g", CreateArgs::file(0o644)).unwrap();
    s.set_defer_misses(false);
    assert_eq!(s.stats().device_waits, waits, "the create waited for the device");
    assert_eq!(s.inode_slots[&g.ino], slot, "the slot given back was taken again");
    assert_eq!(s.lookup(ROOT, b"g").unwrap().ino, g.ino);
}

/// A `readlink` whose target's bytes are on the device only (after a
/// restart) does not read them waiting: it starts reading them ahead and
/// stops, and once they are in memory it answers from there. It read them
/// waiting before: 27 waits of a `pfs fsx` and `tar xf` run through a mount
/// of a server with a 16-block Icache.
#[test]
fn a_readlink_of_a_target_on_the_device_stops_instead_of_waiting() {
    let (mut s, _) = fresh();
    let target = b"../../lib/some/where/else";
    let l = s.symlink(ROOT, b"ln", target, 0, 0).unwrap().ino;
    let mut s = reopen(s);
    let mut stops = Vec::new();
    let got = loop {
        let waits = s.stats().device_waits;
        s.set_defer_misses(true);
        let r = s.readlink(l);
        s.set_defer_misses(false);
        assert_eq!(s.stats().device_waits, waits, "the readlink waited for the device");
        match r {
            Ok(got) => break got,
            Err(FsError::TryAgain) => {
                stops.push(s.take_deferred().expect("a stop says what it waits for"));
                assert!(stops.len() <= 2, "stopped {stops:?}");
                let done = s.icache_reads_done();
                wait_page_reads_or_data(&mut s, done);
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(got, target);
    assert!(stops.contains(&DeferredOn::Data), "the target was in memory: {stops:?}");
}

/// Waits until an inode page read or a data request in flight finished.
fn wait_page_reads_or_data(s: &mut Shard<MemDevice>, done: u64) {
    if s.icache_reading() {
        wait_page_reads(s, done);
    }
    settle_data(s, "the target's read");
}

#[test]
fn a_cross_rename_finish_stops_at_a_cold_inode_page_before_it_changes_anything() {
    let (mut s, made) = shard_with_cold(&[b"f"]);
    let f = made[0].ino;
    let value = meta::encode_dentry(f, FileType::Regular);
    // The target directory lives on another shard.
    let elsewhere = InodeId::compose(ShardId(1), 9);
    s.xrename_begin(7, ROOT, b"f", b"intent").unwrap();
    s.commit().unwrap();
    let done = s.icache_reads_done();
    let pending = s.wal.pending_bytes();
    s.set_defer_misses(true);
    let finished = s.xrename_finish(7, ROOT, b"f", value, elsewhere, None, ShardId(1));
    s.set_defer_misses(false);
    assert_eq!(finished.unwrap_err(), FsError::TryAgain);
    assert_eq!(s.take_deferred(), Some(DeferredOn::InodePage));
    assert_eq!(s.wal.pending_bytes(), pending, "nothing logged");
    assert_eq!(s.lookup(ROOT, b"f").unwrap().ino, f, "the source name stays");
    wait_page_reads(&mut s, done);
    s.set_defer_misses(true);
    s.xrename_finish(7, ROOT, b"f", value, elsewhere, None, ShardId(1)).unwrap();
    s.set_defer_misses(false);
    assert_eq!(s.lookup(ROOT, b"f").unwrap_err(), FsError::NotFound);
    assert_eq!(s.parent_of(f).unwrap(), elsewhere);
}

/// A checkpoint's image buffer is kept for the next image (freeing tens of
/// megabytes at once stops the worker); one that outgrew it gets a larger
/// buffer and the old one is given back a `RELEASE_STEP` per poll.
#[test]
fn the_image_buffer_is_reused_and_a_replaced_one_given_back_in_steps() {
    let (mut s, _) = fresh_sized(BIG_ZONE);
    for i in 0..200 {
        s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
    }
    s.checkpoint().unwrap();
    let kept = s.ckpt_keys.image.as_ptr();
    assert!(s.ckpt_keys.image.capacity() > 0, "the written image's buffer is kept");
    s.checkpoint().unwrap();
    assert_eq!(s.ckpt_keys.image.as_ptr(), kept, "the next image is encoded into it");
    assert_eq!(s.ckpt_retired.capacity(), 0, "nothing replaced");
    // Tables past the buffer's room: a new buffer, the old one retired.
    for i in 0..5_000 {
        s.create(
            ROOT,
            format!("long-name-to-grow-the-tables-{i}").as_bytes(),
            CreateArgs::file(0o644),
        )
        .unwrap();
    }
    let small = s.ckpt_keys.image.capacity();
    s.set_checkpoint_slice(1);
    s.start_checkpoint();
    if s.wants_snapshot() {
        s.step_checkpoint(false);
    }
    assert!(!s.wants_snapshot());
    assert!(s.ckpt_keys.image.capacity() == 0, "the buffer moved into the encoder");
    assert_eq!(s.ckpt_retired.capacity(), small, "the old buffer retired, not freed");
    // A large retired buffer goes a step per poll.
    s.ckpt_retired = vec![7u8; 3 * checkpoint::RELEASE_STEP + 100];
    let mut caps = vec![s.ckpt_retired.capacity()];
    while s.ckpt_retired.capacity() > 0 {
        s.poll_checkpoint();
        caps.push(s.ckpt_retired.capacity());
        assert!(caps.len() < 10, "{caps:?}");
    }
    let step = checkpoint::RELEASE_STEP;
    assert!(caps.windows(2).all(|w| w[0] - w[1] <= step), "{caps:?}");
    assert_eq!(caps.len(), 5, "{caps:?}");
    s.finish_checkpoint().unwrap();
}

/// Requests for more cold inode pages than a quarter of the Icache start
/// that many background reads and stop; the others stop without starting
/// one (`DeferredOn::InodePageWait`), so the pages read are not evicted by more
/// reads before their requests run again. Run again as the worker does (in
/// order, after reads finished), every request is answered and no page is
/// read waiting.
#[test]
fn background_page_reads_are_bounded_by_a_quarter_of_the_icache() {
    let (mut s, handle) = fresh();
    let per_page = crate::icache::INODES_PER_BLOCK as usize;
    let mut inos = Vec::new();
    for i in 0..96 * per_page {
        let a = s.create(ROOT, format!("f{i}").as_bytes(), CreateArgs::file(0o644)).unwrap();
        inos.push(a.ino);
    }
    s.commit().unwrap();
    s.checkpoint().unwrap();
    let mut s = Shard::open(handle.crash(3), 0, small_opts()).unwrap();
    let cap = s.icache.read_cap() as usize;
    assert_eq!(cap, s.icache.capacity() / 4);
    // One inode of each page: three times what the Icache holds.
    let n = 96;
    assert_eq!(s.icache.capacity(), 32);
    let mut waiting: Vec<InodeId> = (0..n).map(|p| inos[p * per_page + 1]).collect();
    // A page a request stopped at is evicted before it runs again only by
    // reads started meanwhile; pages none of these requests needs stay out
    // of the way, as a worker's other requests would.
    let (misses, reads) = (s.stats().icache.misses, s.stats().icache.background_reads);
    let mut stops: Vec<DeferredOn> = Vec::new();
    let mut cold = std::collections::HashSet::new();
    let mut rounds = 0;
    while !waiting.is_empty() {
        rounds += 1;
        assert!(rounds <= 40, "{} requests still waiting", waiting.len());
        let mut still = Vec::new();
        for ino in waiting {
            s.set_defer_misses(true);
            let got = s.getattr(ino);
            s.set_defer_misses(false);
            match got {
                Ok(attr) => assert_eq!(attr.ino, ino),
                Err(FsError::TryAgain) => {
                    stops.push(s.take_deferred().expect("a stop says why"));
                    cold.insert(ino);
                    still.push(ino);
                }
                Err(e) => panic!("{ino}: {e:?}"),
            }
            let st = s.stats().icache;
            assert!(st.background_reads - st.background_reads_done <= cap as u64);
        }
        waiting = still;
        if rounds == 1 {
            let first: Vec<DeferredOn> = stops.clone();
            assert!(first[..cap].iter().all(|&on| on == DeferredOn::InodePage), "{first:?}");
            assert!(first[cap..].iter().all(|&on| on == DeferredOn::InodePageWait), "{first:?}");
        }
        while s.icache_reading() {
            s.icache_reads_done();
        }
    }
    let st = s.stats().icache;
    assert_eq!(st.misses, misses, "a page was read waiting");
    assert!(cold.len() > s.icache.capacity(), "{} cold pages", cold.len());
    let read = st.background_reads - reads;
    assert_eq!(read, cold.len() as u64, "each page read once, none evicted before its request ran");
    assert!(st.read_room_stops >= 2 * cap as u64, "{st:?}");
}
