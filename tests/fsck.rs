//! `pfs fsck` on a real `pfs up` data directory: refused while the file system
//! runs, clean after a clean stop, and after damage made on purpose (an orphan
//! inode, a wrong link count, a name in a directory that does not exist, a
//! leaked transaction record) it lists each problem, exits 1, repairs them with
//! `--repair`, and is clean again; the files left are intact. `pfs mkfs` then
//! refuses to format the devices without `--force`, and with it leaves an empty,
//! clean file system.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{up, PFS};

fn fsck(data: &Path, repair: bool) -> (Output, String) {
    let mut cmd = Command::new(PFS);
    cmd.args(["fsck", "--data"]).arg(data);
    if repair {
        cmd.arg("--repair");
    }
    let out = cmd.output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    (out, text)
}

/// A running `pfs up`, killed and unmounted if the test fails first.
struct Up {
    child: Option<Child>,
    mnt: PathBuf,
}

impl Up {
    fn start(data: &Path, mnt: &Path) -> Up {
        Up { child: Some(up(data, mnt).0), mnt: mnt.to_owned() }
    }

    fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let end = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < end, "pfs up did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// Damages the stopped file system's shards on purpose.
fn damage(data: &Path) {
    let mut shards = Vec::new();
    let mut locks = Vec::new();
    for cfg in pfs::up::server_configs(data).unwrap() {
        let (s, lock) = pfs_server::server::open_for_check(&cfg).unwrap();
        shards.extend(s);
        locks.push(lock);
    }
    let mut done = (false, false, false);
    for s in &mut shards {
        let census = s.census().unwrap();
        for n in &census.names {
            let here = census.inodes.iter().any(|i| i.ino == n.ino);
            // An orphan: the only name of `orphan` goes, its inode stays.
            if n.name == b"orphan" && !done.0 {
                s.repair_remove_name(n.parent, &n.name).unwrap();
                done.0 = true;
            }
            // A wrong link count on a file whose inode is on this shard.
            if n.name == b"counted" && here && !done.1 {
                s.repair_set_nlink(n.ino, 5).unwrap();
                done.1 = true;
            }
        }
        if s.id().0 == 0 && !done.2 {
            // A participant record (a seal) whose coordinator (shard 0) has no
            // intent: what a lost `TxnForget` leaves.
            s.seal_dir(77, pfs_core::InodeId(12_345)).unwrap();
            done.2 = true;
        }
        s.checkpoint().unwrap();
    }
    assert!(done.0 && done.1 && done.2, "the damage was made: {done:?}");
}

#[test]
fn fsck_is_clean_after_a_clean_stop_and_repairs_what_is_damaged() {
    let base = std::env::temp_dir().join(format!("pfs-fsck-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (data, mnt): (PathBuf, PathBuf) = (base.join("data"), base.join("mnt"));

    let fs = Up::start(&data, &mnt);
    std::fs::create_dir_all(mnt.join("d/e")).unwrap();
    for i in 0..40 {
        std::fs::write(mnt.join(format!("d/f{i}")), vec![i as u8; i * 3000]).unwrap();
    }
    std::fs::write(mnt.join("orphan"), b"x").unwrap();
    std::fs::write(mnt.join("counted"), b"y").unwrap();
    std::fs::hard_link(mnt.join("d/f1"), mnt.join("d/e/link")).unwrap();
    // While the file system runs, fsck refuses to touch it.
    let (out, text) = fsck(&data, false);
    assert!(!out.status.success() && text.contains("in use"), "{text}");
    fs.stop();

    let (out, text) = fsck(&data, false);
    assert!(out.status.success() && text.contains("pfs fsck: clean"), "{text}");

    damage(&data);
    let (out, text) = fsck(&data, false);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for want in ["has no name: an orphan", "link count 5", "participant record", "--repair"] {
        assert!(text.contains(want), "fsck output lacks {want:?}:\n{text}");
    }
    let (out, text) = fsck(&data, true);
    assert!(out.status.success() && text.contains("clean now"), "{text}");
    let (out, text) = fsck(&data, false);
    assert!(out.status.success() && text.contains("pfs fsck: clean"), "{text}");

    // The rest is intact.
    let fs = Up::start(&data, &mnt);
    for i in 0..40 {
        assert_eq!(std::fs::read(mnt.join(format!("d/f{i}"))).unwrap(), vec![i as u8; i * 3000]);
    }
    assert!(!mnt.join("orphan").exists());
    assert_eq!(std::fs::read(mnt.join("counted")).unwrap(), b"y");
    assert_eq!(std::fs::read(mnt.join("d/e/link")).unwrap(), vec![1u8; 3000]);
    fs.stop();

    // pfs mkfs refuses formatted devices unless --force, then leaves an empty,
    // clean file system that pfs up mounts.
    let mkfs = |force: bool| {
        let mut cmd = Command::new(PFS);
        cmd.args(["mkfs", "--data"]).arg(&data);
        if force {
            cmd.arg("--force");
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = mkfs(false);
    assert!(!ok && text.contains("--force") && text.contains("holds the zones"), "{text}");
    let (ok, text) = mkfs(true);
    assert!(ok && text.contains("formatted") && text.contains("as server 0"), "{text}");
    let (out, text) = fsck(&data, false);
    assert!(out.status.success() && text.contains("1 inodes, 0 names"), "{text}");
    let fs = Up::start(&data, &mnt);
    assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 0, "a new file system is empty");
    std::fs::write(mnt.join("new"), b"z").unwrap();
    fs.stop();

    // A zone of another format version: refused by name everywhere, and only
    // `pfs mkfs --force` formats over it.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut img =
            std::fs::OpenOptions::new().write(true).open(data.join("server-0.img")).unwrap();
        img.seek(SeekFrom::Start(8)).unwrap();
        img.write_all(&2u32.to_le_bytes()).unwrap();
    }
    let (out, text) = fsck(&data, false);
    assert!(!out.status.success() && text.contains("format version 2"), "{text}");
    let (ok, text) = mkfs(false);
    assert!(!ok && text.contains("format version 2") && text.contains("--force"), "{text}");
    let (ok, text) = mkfs(true);
    assert!(ok && text.contains("formatted"), "{text}");
    let (out, text) = fsck(&data, false);
    assert!(out.status.success() && text.contains("pfs fsck: clean"), "{text}");
    let _ = std::fs::remove_dir_all(&base);
}
