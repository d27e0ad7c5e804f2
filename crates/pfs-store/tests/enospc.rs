//! A data file on a disk that fills up: a real file system (a size-limited tmpfs
//! mounted for the test) under a real io_uring device.
//!
//! - `preallocate = true` refuses to start on a disk without room for the whole
//!   file, names the file and the cause, and leaves no allocation behind.
//! - A sparse file opens, and when the disk fills the shard's writes fail with
//!   ENOSPC (not EIO); everything written before still reads back, fsync and
//!   metadata still work (the zone's metadata and WAL were reserved at format),
//!   and all of it is there after a reopen.
//! - A disk without room even for the metadata and WAL refuses the format and
//!   says why.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use pfs_core::{FsError, InodeId, ShardId};
use pfs_store::device::{UringDevice, UringOptions};
use pfs_store::{CreateArgs, FormatOptions, Shard, ShardOptions};

const DISK_BYTES: u64 = 48 << 20;
const ZONE_BYTES: u64 = 256 << 20;
const CHUNK: usize = 1 << 20;

/// A tmpfs of `DISK_BYTES`, unmounted and removed on drop.
struct SmallDisk {
    dir: PathBuf,
}

impl SmallDisk {
    fn mount(name: &str) -> SmallDisk {
        let dir = std::env::temp_dir().join(format!("pfs-enospc-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_BYTES}"), "pfs-enospc"])
            .arg(&dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs on {dir:?} failed (the tests run as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn options(size_bytes: Option<u64>, preallocate: bool) -> UringOptions {
    UringOptions {
        queue_depth: 32,
        registered_buffers: 4,
        registered_buffer_size: 1 << 20,
        spare_buffers: 4,
        size_bytes,
        preallocate,
        submit_below: pfs_store::device::SUBMIT_BELOW,
    }
}

fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn chunk(i: usize) -> Vec<u8> {
    (0..CHUNK).map(|b| (b / 4096 + i * 7) as u8).collect()
}

#[test]
fn preallocation_larger_than_the_disk_is_refused_and_given_back() {
    let disk = SmallDisk::mount("prealloc");
    let path = disk.path("zone.img");
    let err = UringDevice::open(&path, options(Some(ZONE_BYTES), true)).unwrap_err().to_string();
    assert!(err.contains("zone.img"), "names the file: {err}");
    assert!(err.contains("No space left on device"), "names the cause: {err}");
    assert!(err.contains("preallocate = false"), "says what to do: {err}");
    assert!(allocated(&path) < 1 << 20, "a failed fallocate keeps {} bytes", allocated(&path));
}

#[test]
fn a_full_disk_under_a_sparse_zone_fails_writes_with_enospc_and_keeps_the_rest() {
    let disk = SmallDisk::mount("sparse");
    let path = disk.path("zone.img");
    let dev =
        UringDevice::open(&path, options(Some(ZONE_BYTES), false)).expect("a sparse file fits");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), ZONE_BYTES);
    let fo =
        FormatOptions { wal_bytes: Some(8 << 20), ..FormatOptions::new(ShardId(0), ZONE_BYTES) };
    let mut shard = Shard::format(dev, &fo, ShardOptions::default()).unwrap();
    let ino = shard.create(InodeId::ROOT, b"big", CreateArgs::file(0o644)).unwrap().ino;

    let mut written = 0;
    let err = loop {
        assert!(written < ZONE_BYTES as usize / CHUNK, "the 48 MiB disk never filled");
        match shard.write(ino, (written * CHUNK) as u64, &chunk(written)) {
            Ok(n) => assert_eq!(n, CHUNK),
            Err(e) => break e,
        }
        written += 1;
    };
    assert_eq!(err, FsError::NoSpace, "after {written} MiB");
    assert!(written >= 8, "only {written} MiB fit on a 48 MiB disk");
    let check = |shard: &mut Shard<UringDevice>, when: &str| {
        for i in 0..written {
            let got = shard.read(ino, (i * CHUNK) as u64, CHUNK).unwrap();
            assert!(got == chunk(i), "chunk {i} changed {when}");
        }
        // The failed write did not grow the file.
        assert_eq!(shard.getattr(ino).unwrap().size, (written * CHUNK) as u64, "{when}");
    };
    check(&mut shard, "after the disk filled");
    // Metadata and durability do not need data pages.
    shard.fsync(ino).expect("fsync on a full disk");
    let small = shard.create(InodeId::ROOT, b"small", CreateArgs::file(0o644)).unwrap().ino;
    shard.fsync(small).expect("fsync of a new file on a full disk");
    drop(shard);

    let dev = UringDevice::open(&path, options(None, false)).unwrap();
    let mut shard = Shard::open(dev, 0, ShardOptions::default()).expect("reopen on a full disk");
    check(&mut shard, "after a reopen");
    assert_eq!(shard.lookup(InodeId::ROOT, b"small").unwrap().ino, small);
}

#[test]
fn a_disk_without_room_for_the_metadata_refuses_the_format() {
    let disk = SmallDisk::mount("meta");
    let path = disk.path("zone.img");
    let zone = 1 << 30;
    let dev = UringDevice::open(&path, options(Some(zone), false)).expect("a sparse file fits");
    let err =
        match Shard::format(dev, &FormatOptions::new(ShardId(0), zone), ShardOptions::default()) {
            Ok(_) => panic!("60 MiB of checkpoints and WAL do not fit 48 MiB"),
            Err(e) => e.to_string(),
        };
    assert!(err.contains("cannot allocate the zone's metadata and WAL"), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
}
