//! `pfs up` as a user runs it: a real process with a real FUSE mount; Ctrl-C
//! (SIGINT) unmounts and stops; running it again remounts the same data.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod common;

use common::{mounted, up, PFS};

fn interrupt(mut child: Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            assert_eq!(st.code(), Some(0), "pfs up exit status after Ctrl-C");
            return;
        }
        assert!(Instant::now() < end, "pfs up did not stop after SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn up_mounts_stops_on_ctrl_c_and_remounts_the_same_data() {
    let base = std::env::temp_dir().join(format!("pfs-up-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (data, mnt): (PathBuf, PathBuf) = (base.join("data"), base.join("mnt"));

    let (child, master) = up(&data, &mnt);
    std::fs::create_dir(mnt.join("dir")).unwrap();
    std::fs::write(mnt.join("dir/file"), b"kept across restarts").unwrap();
    // pfs status against the embedded master.
    let out = Command::new(PFS)
        .args(["status", "--master", &master, "--key"])
        .arg(data.join("cluster.key"))
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pfs status: {}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("up"), "{table}");
    // pfs layout through the mount.
    let out = Command::new(PFS)
        .args(["layout", "set"])
        .arg(mnt.join("dir"))
        .args(["--file", "io"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(PFS).args(["layout", "get"]).arg(mnt.join("dir")).output().unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("dir_layout  bigdir") && shown.contains("file_layout io"), "{shown}");
    let out = Command::new(PFS)
        .args(["layout", "set"])
        .arg(mnt.join("dir"))
        .args(["--dir", "huge"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected one of regular, bigdir"));
    interrupt(child);
    assert!(!mounted(&mnt), "Ctrl-C left the mount behind");

    // A different shape on the same data is refused with the reason.
    let out = Command::new(PFS)
        .args(["up", "--master-listen", "127.0.0.1:0", "--workers", "1", "--data"])
        .arg(&data)
        .arg("--mount")
        .arg(&mnt)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(msg.contains("--servers 1 --workers 2"), "{msg}");
    assert!(!mounted(&mnt));

    // Without --workers, pfs up serves the data with the shape it was made with;
    // a client config file (`-o config=`) tunes the client and keeps pfs up's
    // own master and key.
    let cfg = base.join("client.toml");
    std::fs::write(&cfg, "reply_spin_us = 0\ndentry_ttl_ms = 500\n").unwrap();
    let opt = format!("config={}", cfg.display());
    let (child, _) = common::up_exactly(&data, &mnt, &["-o", &opt]);
    assert_eq!(std::fs::read(mnt.join("dir/file")).unwrap(), b"kept across restarts");
    interrupt(child);
    assert!(!mounted(&mnt));
    let _ = std::fs::remove_dir_all(&base);
}

/// A worker that panics (a failpoint here) fail-stops its server, and `pfs up`
/// with it: it unmounts, says why on stderr and exits non-zero; run again, it
/// recovers the shards from their logs and serves what was synced.
#[test]
fn a_fail_stopping_server_takes_pfs_up_down_with_the_reason() {
    use std::io::{BufRead, BufReader, Read, Write};
    let base = std::env::temp_dir().join(format!("pfs-up-failstop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (data, mnt): (PathBuf, PathBuf) = (base.join("data"), base.join("mnt"));
    let mut child = Command::new(PFS)
        .args(["up", "--master-listen", "127.0.0.1:0", "--workers", "2", "--size-gib", "2"])
        .arg("--data")
        .arg(&data)
        .arg("--mount")
        .arg(&mnt)
        .env("PFS_FAILPOINTS", "worker.panic=400")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        if line.unwrap().starts_with("pfs up: mounted on") {
            break;
        }
    }
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    let mut synced = 0;
    for i in 0..10_000 {
        let r = (|| -> std::io::Result<()> {
            let mut f = std::fs::File::create(mnt.join(format!("f{i}")))?;
            f.write_all(format!("file {i}").as_bytes())?;
            f.sync_all()
        })();
        if r.is_err() {
            break;
        }
        synced = i + 1;
    }
    let end = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "pfs up did not stop after its server fail-stopped");
        std::thread::sleep(Duration::from_millis(100));
    };
    let errors = errors.join().unwrap();
    assert!(!status.success(), "pfs up exited {status} after a fail-stop");
    assert!(errors.contains("failpoint worker.panic"), "the reason is not on stderr: {errors}");
    assert!(!mounted(&mnt), "pfs up left {mnt:?} mounted");
    assert!(synced > 0, "nothing was written before the panic");
    // Run again: recovery, and every synced file is there.
    let (child, _) = up(&data, &mnt);
    for i in 0..synced {
        let got = std::fs::read(mnt.join(format!("f{i}"))).unwrap();
        assert_eq!(got, format!("file {i}").as_bytes(), "f{i} after the recovery");
    }
    interrupt(child);
    let _ = std::fs::remove_dir_all(&base);
}
