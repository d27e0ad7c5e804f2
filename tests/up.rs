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

    let (child, _) = up(&data, &mnt);
    assert_eq!(std::fs::read(mnt.join("dir/file")).unwrap(), b"kept across restarts");
    interrupt(child);
    assert!(!mounted(&mnt));
    let _ = std::fs::remove_dir_all(&base);
}
