//! What the tests of the `pfs` binary share: starting `pfs up` and looking at
//! the mount table.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

pub const PFS: &str = env!("CARGO_BIN_EXE_pfs");

/// Whether `dir` is a mount point now.
pub fn mounted(dir: &Path) -> bool {
    let want = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want))
}

/// Starts `pfs up` (2 workers, 2 GiB, master on a free port) and waits for its
/// "mounted" line; returns it and the master's address.
pub fn up(data: &Path, mnt: &Path) -> (Child, String) {
    up_with(data, mnt, &[])
}

/// [`up`] with more arguments (`-o allow_other`, `--size-gib 8`).
pub fn up_with(data: &Path, mnt: &Path, args: &[&str]) -> (Child, String) {
    let mut all = vec!["--workers", "2"];
    all.extend_from_slice(args);
    up_exactly(data, mnt, &all)
}

/// `pfs up` with only these arguments besides the data, the mount point, a free
/// master port and 2 GiB.
pub fn up_exactly(data: &Path, mnt: &Path, args: &[&str]) -> (Child, String) {
    let (child, master, _) = up_logged(data, mnt, args);
    (child, master)
}

/// [`up_exactly`], also keeping every line `pfs up` prints (the ones after the
/// "mounted" line arrive while it runs and as it stops).
pub fn up_logged(
    data: &Path,
    mnt: &Path,
    args: &[&str],
) -> (Child, String, Arc<Mutex<Vec<String>>>) {
    let mut child = Command::new(PFS)
        .args(["up", "--master-listen", "127.0.0.1:0", "--size-gib", "2"])
        .arg("--data")
        .arg(data)
        .arg("--mount")
        .arg(mnt)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut master = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        println!("{line}");
        if let Some(rest) = line.strip_prefix("pfs up: master on ") {
            master = Some(rest.split(',').next().unwrap().to_string());
        }
        let mounted = line.starts_with("pfs up: mounted on");
        log.lock().unwrap().push(line);
        if mounted {
            break;
        }
    }
    // Keep draining stdout so the process never blocks on a full pipe.
    let keep = log.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            println!("{l}");
            keep.lock().unwrap().push(l);
        }
    });
    assert!(mounted(mnt), "pfs up said mounted but {mnt:?} is not");
    (child, master.expect("pfs up printed its master"), log)
}
