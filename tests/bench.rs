//! `pfs bench` as a user runs it: the real binary, real worker processes, on a
//! local directory, on a real pfs FUSE mount and through the native client.
//! Rates are never asserted (the machine is shared); what is asserted is that
//! every phase ran the work it was given, verified it, and reported it.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use pfs::bench::report::RunReport;

mod common;

use common::{mounted, PFS};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pfs-bench-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn bench(args: &[&str]) -> Output {
    Command::new(PFS).arg("bench").args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `pfs bench`, expects success, returns stdout.
fn bench_ok(args: &[&str]) -> String {
    let out = bench(args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "pfs bench {args:?} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all phases verified"), "{stdout}");
    stdout
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every workload with small counts; the table names its phases, the run
/// directory is gone afterwards.
#[test]
fn every_workload_runs_verifies_and_cleans_up_on_a_directory() {
    let dir = scratch("all");
    let d = dir.to_str().unwrap();
    let cases: [(&str, &[&str], &[&str]); 6] = [
        ("md-easy", &["--files", "50"], &["create", "stat", "remove"]),
        ("md-hard", &["--files", "40"], &["create", "stat", "read", "remove"]),
        ("io-easy", &["--segments", "8", "--transfer", "65536"], &["write", "read"]),
        ("io-hard", &["--segments", "16"], &["write", "read"]),
        ("mdwb", &["--files", "40", "--window", "5"], &["precreate", "mixed", "cleanup"]),
        ("ckpt", &["--particles", "20000", "--transfer", "65536"], &["checkpoint", "restart"]),
    ];
    for (workload, opts, phases) in cases {
        let mut args = vec![workload, "--procs", "3"];
        args.extend_from_slice(opts);
        args.push(d);
        let table = bench_ok(&args);
        for phase in phases {
            assert!(
                table.lines().any(|l| l.split_whitespace().next() == Some(phase)),
                "{workload}: no {phase} row in\n{table}"
            );
        }
        assert_eq!(entries(&dir), Vec::<String>::new(), "{workload} left files behind");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--json` has every phase with the counts the options asked for, `--plot`
/// draws them, `--compare` adds an earlier run to the chart.
#[test]
fn json_and_plot_carry_every_phase_and_run() {
    let dir = scratch("json");
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    let (first, second, svg) = (dir.join("a.json"), dir.join("b.json"), dir.join("md.svg"));
    let t = target.to_str().unwrap();
    // The same md-hard run, named `label`, with `more` options.
    let md_hard = |label: &str, json: &Path, more: &[&str]| {
        let mut args = vec!["md-hard", "--procs", "2", "--files", "30", "--size", "1000"];
        args.extend(["--label", label, "--json", json.to_str().unwrap()]);
        args.extend_from_slice(more);
        args.push(t);
        bench_ok(&args);
    };
    md_hard("first run", &first, &[]);
    let a = RunReport::load(&first).unwrap();
    assert_eq!(a.label, "first run");
    assert_eq!(a.target_kind, "posix");
    assert_eq!(a.params.procs, 2);
    assert_eq!(a.params.files, Some(30));
    assert_eq!(a.params.size_bytes, Some(1000));
    let names: Vec<&str> = a.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["create", "stat", "read", "remove"]);
    for p in &a.phases {
        assert_eq!(p.items, 60, "phase {}: 2 procs x 30 files", p.name);
        assert_eq!(p.ranks.len(), 2);
        assert!(p.rate > 0.0 && p.seconds > 0.0, "{p:?}");
        assert!(!p.stonewalled);
    }
    let read = &a.phases[2];
    assert_eq!(read.bytes, 60 * 1000, "the read phase read every byte");

    md_hard(
        "second run",
        &second,
        &["--plot", svg.to_str().unwrap(), "--compare", first.to_str().unwrap()],
    );
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"), "not an SVG");
    for want in ["first run", "second run", "create", "stat", "read", "remove"] {
        assert!(chart.contains(want), "the chart lacks {want:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--time` ends the first phase at the deadline, not at the (huge) count, and
/// the later phases work on what it made.
#[test]
fn time_stonewalls_the_first_phase() {
    let dir = scratch("time");
    let target = dir.join("target");
    std::fs::create_dir(&target).unwrap();
    let json = dir.join("r.json");
    bench_ok(&[
        "md-easy",
        "--procs",
        "2",
        "--files",
        "10000000",
        "--time",
        "0.5",
        "--json",
        json.to_str().unwrap(),
        target.to_str().unwrap(),
    ]);
    let r = RunReport::load(&json).unwrap();
    let create = &r.phases[0];
    assert!(create.stonewalled, "{create:?}");
    assert!(create.items > 0 && create.items < 20_000_000, "{create:?}");
    assert!(create.seconds >= 0.5, "stopped before the stonewall: {create:?}");
    for later in &r.phases[1..] {
        assert!(!later.stonewalled);
        assert_eq!(later.items, create.items, "{} covers what create made", later.name);
    }
    assert_eq!(entries(&target), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad input: a message naming the problem, a failing exit, never a panic.
#[test]
fn bad_options_and_targets_are_refused_by_name() {
    let dir = scratch("bad");
    let d = dir.to_str().unwrap();
    let missing = dir.join("nowhere");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["md-easy", "--segments", "4", d], "--segments"),
        (vec!["io-easy", "--files", "4", d], "--files"),
        (vec!["md-hard", "--procs", "0", d], "--procs"),
        (vec!["io-hard", "--transfer", "0", d], "--transfer"),
        (vec!["md-easy", "--time=-1", d], "--time"),
        (vec!["md-easy", "--time=0", d], "--time"),
        (vec!["md-easy", "--files", "5", missing.to_str().unwrap()], "nowhere"),
        (vec!["md-easy", "--key", "/nonexistent/cluster.key", "pfs://127.0.0.1:1"], "key"),
        (vec!["md-easy", "pfs://"], "pfs://"),
    ];
    for (args, names) in cases {
        let out = bench(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "pfs bench {args:?} succeeded");
        assert!(err.contains(names), "pfs bench {args:?}: message does not name {names:?}: {err}");
        assert!(!err.contains("panicked"), "pfs bench {args:?} panicked: {err}");
    }
    assert_eq!(entries(&dir), Vec::<String>::new(), "a refused run left files");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A worker process driven by hand (the coordinator's protocol on its stdin):
/// data changed behind its back between the write and the read phase is
/// caught, and the message names the file and the offset.
#[test]
fn a_worker_reports_data_corrupted_between_phases() {
    let dir = scratch("corrupt");
    let run = "run";
    std::fs::create_dir(dir.join(run)).unwrap();
    let mut worker = Command::new(PFS)
        .args(["bench", "io-easy", "--procs", "1", "--segments", "4", "--transfer", "4096"])
        .arg(&dir)
        .env(pfs::bench::WORKER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = worker.stdin.take().unwrap();
    let mut from = BufReader::new(worker.stdout.take().unwrap());
    let mut say = |line: &str| writeln!(to, "{line}").unwrap();
    // Waits for a message other than a progress report.
    let mut hear = || loop {
        let mut line = String::new();
        assert!(from.read_line(&mut line).unwrap() > 0, "the worker closed its stdout");
        if !line.contains("Progress") {
            return line;
        }
    };
    say(&format!(r#"{{"Hello":{{"rank":0,"run":"{run}"}}}}"#));
    assert!(hear().contains("Ready"));
    say(r#"{"Prepare":{"phase":0,"counts":[4]}}"#);
    assert!(hear().contains("Prepared"));
    say(r#""Go""#);
    let done = hear();
    assert!(done.contains("Done") && done.contains(r#""bytes":16384"#), "{done}");

    let file = dir.join(run).join("file.0");
    let mut bytes = std::fs::read(&file).unwrap();
    assert_eq!(bytes.len(), 16384);
    bytes[9000] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    say(r#"{"Prepare":{"phase":1,"counts":[4]}}"#);
    assert!(hear().contains("Prepared"));
    say(r#""Go""#);
    let failed = hear();
    assert!(failed.contains("Failed"), "{failed}");
    assert!(failed.contains("verification failed") && failed.contains("file.0"), "{failed}");
    assert!(failed.contains("9000"), "the offset is named: {failed}");
    drop(to);
    let st = wait(&mut worker, Duration::from_secs(30));
    assert!(st.success(), "the worker exits once its stdin closes");
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("process {} did not exit in {limit:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A pfs cluster as `pfs up` starts it: real servers, a real FUSE mount.
struct Up {
    child: Child,
    master: String,
    key: PathBuf,
    mnt: PathBuf,
}

impl Up {
    fn start(base: &Path) -> Up {
        let (data, mnt) = (base.join("data"), base.join("mnt"));
        let (child, master) = common::up(&data, &mnt);
        Up { child, master, key: data.join("cluster.key"), mnt }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let st = wait(&mut self.child, Duration::from_secs(60));
        if !std::thread::panicking() {
            assert!(st.success(), "pfs up after Ctrl-C: {st}");
            assert!(!mounted(&self.mnt), "pfs up left its mount");
        }
    }
}

/// The same workloads on pfs itself: through the FUSE mount and through the
/// native client (pfs://), with the N-1 shared file written by two processes at
/// once (two handles on one inode: the case that once exhausted the client's
/// credits).
#[test]
fn workloads_run_on_a_pfs_mount_and_through_the_native_client() {
    let base = scratch("pfs");
    let up = Up::start(&base);
    let m = up.mnt.to_str().unwrap();
    let native = format!("pfs://{}", up.master);
    let key = up.key.to_str().unwrap();
    bench_ok(&["md-hard", "--files", "100", m]);
    bench_ok(&["io-hard", "--segments", "256", m]);
    bench_ok(&["mdwb", "--files", "50", m]);
    bench_ok(&["ckpt", "--particles", "30000", m]);
    bench_ok(&["md-easy", "--files", "100", "--key", key, &native]);
    bench_ok(&["md-hard", "--files", "100", "--key", key, &native]);
    bench_ok(&["io-easy", "--segments", "16", "--key", key, &native]);
    bench_ok(&["io-hard", "--segments", "256", "--key", key, &native]);
    // A sub-directory as the native target (made through the mount).
    std::fs::create_dir(up.mnt.join("sub")).unwrap();
    let json = base.join("native.json");
    bench_ok(&[
        "md-easy",
        "--files",
        "20",
        "--key",
        key,
        "--json",
        json.to_str().unwrap(),
        &format!("{native}/sub"),
    ]);
    assert_eq!(RunReport::load(&json).unwrap().target_kind, "native");
    // Nothing left over in the namespace but the sub-directory given.
    assert_eq!(entries(&up.mnt), vec!["sub".to_string()]);
    assert_eq!(entries(&up.mnt.join("sub")), Vec::<String>::new());
    drop(up);
    let _ = std::fs::remove_dir_all(&base);
}
