//! A real crash: a child process runs a workload on `UringDevice` over a file and is
//! killed with SIGKILL at a random moment, three times over the same file. After
//! each kill the shard is reopened here and every file the child reported durable
//! must be intact.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pfs_core::InodeId;
use pfs_store::device::{UringDevice, UringOptions};
use pfs_store::{Shard, ShardOptions};
use rand::{Rng, SeedableRng};

const SIZE: u64 = 256 << 20;

fn content(i: u64) -> Vec<u8> {
    let len = (i * 7919 % 150_000 + 1) as usize;
    (0..len).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

/// Runs the child until it reported `kill_after` durable files or the deadline,
/// SIGKILLs it, and returns the highest durable index it printed.
fn run_and_kill(
    file: &str,
    format: bool,
    start: u64,
    kill_after: u64,
    delay: Duration,
) -> Option<u64> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pfs-shard-torture"));
    cmd.args([
        "--file",
        file,
        "--size",
        &SIZE.to_string(),
        "--start",
        &start.to_string(),
        "--count",
        "100000",
    ]);
    if format {
        cmd.arg("--format");
    }
    let mut child =
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn torture child");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let n: u64 =
                line.strip_prefix("durable ").and_then(|n| n.parse().ok()).expect("durable line");
            if tx.send(n).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = None;
    let mut seen = 0;
    while seen < kill_after && Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(n) => {
                last = Some(n);
                seen += 1;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("torture child exited early: {status}");
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Land the kill somewhere inside the next file's create, writes or fsync.
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL the child"); // std's kill is SIGKILL on Unix
    child.wait().expect("reap child");
    // Lines the child printed before it died are durable too.
    reader.join().expect("reader thread");
    while let Ok(n) = rx.try_recv() {
        last = Some(n);
    }
    last
}

#[test]
fn sigkill_mid_workload_loses_nothing_durable() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sigkill");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("zone.img");
    let _ = std::fs::remove_file(&file);
    let file_str = file.to_str().unwrap().to_string();
    let mut rng = rand::rngs::StdRng::seed_from_u64(std::process::id() as u64);
    let mut durable_up_to: Option<u64> = None;
    let mut next = 0;
    for round in 0..3 {
        let kill_after = rng.gen_range(5..60);
        let delay = Duration::from_micros(rng.gen_range(0..5_000));
        let last = run_and_kill(&file_str, round == 0, next, kill_after, delay);
        if let Some(l) = last {
            durable_up_to = Some(l);
            next = l + 1;
        }
        let last_durable = durable_up_to.expect("the child reported at least one durable file");
        eprintln!("round {round}: killed after {kill_after} files; files 0..={last_durable} must be intact");
        let dev = UringDevice::open(
            &file,
            UringOptions {
                queue_depth: 32,
                registered_buffers: 0,
                registered_buffer_size: 0,
                spare_buffers: 0,
                size_bytes: None,
                preallocate: false,
                submit_below: pfs_store::device::SUBMIT_BELOW,
            },
        )
        .expect("open zone file");
        let mut shard = Shard::open(dev, 0, ShardOptions::default())
            .unwrap_or_else(|e| panic!("round {round}: recovery failed: {e}"));
        for i in 0..=last_durable {
            let entry = shard
                .lookup(InodeId::ROOT, format!("f{i}").as_bytes())
                .unwrap_or_else(|e| panic!("round {round}: durable file f{i} lost: {e}"));
            let want = content(i);
            let got = shard.read(entry.ino, 0, want.len() + 1).unwrap();
            assert!(got == want, "round {round}: durable file f{i} has wrong contents");
        }
        // A file past the last durable one may or may not exist; the next round
        // continues after it (its name may already be taken, so skip ahead).
        while shard.lookup(InodeId::ROOT, format!("f{next}").as_bytes()).is_ok() {
            next += 1;
        }
        shard.checkpoint().unwrap();
        drop(shard);
    }
    let _ = std::fs::remove_file(&file);
}
