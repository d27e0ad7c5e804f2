//! `pfs up` as a user runs it: a real process with a real FUSE mount; Ctrl-C
//! (SIGINT) unmounts and stops; running it again remounts the same data.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PFS: &str = env!("CARGO_BIN_EXE_pfs");

fn mounted(dir: &Path) -> bool {
    let want = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want))
}

/// Starts `pfs up` and waits for its "mounted" line; returns it and the master.
fn up(data: &Path, mnt: &Path) -> (Child, String) {
    let mut child = Command::new(PFS)
        .args(["up", "--master-listen", "127.0.0.1:0", "--workers", "2", "--size-gib", "2"])
        .arg("--data")
        .arg(data)
        .arg("--mount")
        .arg(mnt)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut master = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        println!("{line}");
        if let Some(rest) = line.strip_prefix("pfs up: master on ") {
            master = Some(rest.split(',').next().unwrap().to_string());
        }
        if line.starts_with("pfs up: mounted on") {
            break;
        }
    }
    // Keep draining stdout so the process never blocks on a full pipe.
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            println!("{l}")
        }
    });
    assert!(mounted(mnt), "pfs up said mounted but {mnt:?} is not");
    (child, master.expect("pfs up printed its master"))
}

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
