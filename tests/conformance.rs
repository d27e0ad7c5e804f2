//! Conformance on a real `pfs up -o allow_other` mount: the `pfs fsx` exerciser
//! (first on the in-memory FUSE file system, which checks the model itself, then
//! on pfs with every data layout), and the pjdfstest POSIX suite against the list
//! of files known to fail (`tests/pjdfstest-known-failures.txt`).
//!
//! Then the same on a mount with the kernel's writeback cache (`-o
//! writeback_cache`): the exerciser with fewer seeds, and the pjdfstest
//! directories about data, sizes and times (the cache changes how writes,
//! truncates and mtime reach pfs; the full suite was run by hand, docs/posix.md).
//!
//! Then FUSE over io_uring (`-o uring`, with the `fuse` module's `enable_uring`
//! set for the case and restored after): the exerciser, pjdfstest directories,
//! large transfers and a large directory through the rings, counting the requests
//! they served; and the fallback to /dev/fuse when the kernel does not allow it.
//!
//! `PFS_FSX_SEED` (first seed; default from the clock, printed), `PFS_FSX_SEEDS`
//! (default 12) and `PFS_FSX_OPS` (default 5000) change the exerciser's run.
//! Cases run one after another (harness = false): two cores.

mod common;

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{mounted, up_logged, up_with, PFS};

fn main() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let base = std::env::temp_dir().join(format!("pfs-conformance-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let want = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if want("fsx_model_on_memfs") {
        timed("fsx_model_on_memfs", || fsx_model_on_memfs(&base));
    }
    let (data, mnt) = (base.join("data"), base.join("mnt"));
    let (child, _) = up_with(&data, &mnt, &["-o", "allow_other"]);
    let pfs = Up(Some(child), mnt.clone());
    if want("fsx_on_pfs") {
        timed("fsx_on_pfs", || fsx_on_pfs(&mnt));
    }
    if want("pjdfstest") {
        timed("pjdfstest", || pjdfstest(&base, &mnt, None));
    }
    drop(pfs);
    if want("writeback_cache") {
        let (data, mnt) = (base.join("data-wb"), base.join("mnt-wb"));
        // Without inline rounds too: every other case runs pfs up's default.
        let (child, _) =
            up_with(&data, &mnt, &["--no-inline-rounds", "-o", "allow_other,writeback_cache"]);
        let pfs = Up(Some(child), mnt.clone());
        timed("fsx_on_pfs_writeback_cache", || {
            let (first, _, ops) = seeds();
            println!("fsx with writeback_cache: seeds {first}..{}", first + 4);
            fsx_seeds(&mnt, first, 4, ops, |seed| ["block", "io", "file"][(seed % 3) as usize]);
        });
        timed("pjdfstest_writeback_cache", || pjdfstest(&base, &mnt, Some(WRITEBACK_DIRS)));
        drop(pfs);
    }
    if want("inline_rounds") {
        timed("inline_rounds", || inline_rounds(&base));
    }
    if want("uring") {
        timed("uring", || uring(&base));
        timed("uring_fallback_to_dev_fuse", || uring_fallback(&base));
    }
    if want("uring_forgets_batched") {
        timed("uring_forgets_batched", || uring_forgets_batched(&base));
    }
    let _ = std::fs::remove_dir_all(&base);
    println!("test result: ok");
}

fn timed(name: &str, case: impl FnOnce()) {
    let t = Instant::now();
    println!("test {name} ...");
    case();
    println!("test {name} ... ok ({:.1} s)", t.elapsed().as_secs_f64());
}

/// `pfs up`, interrupted (unmount and stop) on drop.
struct Up(Option<Child>, PathBuf);

impl Drop for Up {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else { return };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let end = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        if child.try_wait().unwrap().is_none() {
            let _ = child.kill();
            let _ = Command::new("umount").arg("-l").arg(&self.1).status();
        }
        let _ = child.wait();
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")),
        Err(_) => default,
    }
}

/// Starts `pfs fsx` in `dir` (2 processes, reads and writes up to 2 MiB).
fn start_fsx(dir: &Path, seed: u64, ops: u64, layout: &str) -> Child {
    Command::new(PFS)
        .arg("fsx")
        .arg(dir)
        .args(["--seed", &seed.to_string(), "--ops", &ops.to_string(), "--procs", "2"])
        .args(["--max-len", &(2u64 << 20).to_string(), "--max-size", &(8u64 << 20).to_string()])
        .args(["--layout", layout])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a `pfs fsx` run; panics with its output on a mismatch.
fn finish_fsx(child: Child, seed: u64, layout: &str) {
    let out = child.wait_with_output().unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pfs fsx seed {seed} layout {layout} failed:\n{text}");
    assert!(text.contains("all match"), "{text}");
    print!("{text}");
}

/// Runs seeds `first..first + n`, `at_once` at a time (the runs wait on the
/// mount far more than they compute), with the layout `layout(seed)`.
fn fsx_seeds(dir: &Path, first: u64, n: u64, ops: u64, layout: impl Fn(u64) -> &'static str) {
    let at_once = 4;
    let mut seed = first;
    while seed < first + n {
        let batch: Vec<(u64, Child)> = (seed..(seed + at_once).min(first + n))
            .map(|s| (s, start_fsx(dir, s, ops, layout(s))))
            .collect();
        seed += batch.len() as u64;
        for (s, child) in batch {
            finish_fsx(child, s, layout(s));
        }
    }
}

fn seeds() -> (u64, u64, u64) {
    let first = env_u64("PFS_FSX_SEED", {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
        t.as_secs() % 1_000_000
    });
    (first, env_u64("PFS_FSX_SEEDS", 12), env_u64("PFS_FSX_OPS", 5000))
}

/// The exerciser on the in-memory FUSE file system: a mismatch here is a bug of
/// the model (or of FUSE), not of pfs.
fn fsx_model_on_memfs(base: &Path) {
    let mnt = base.join("memfs");
    std::fs::create_dir_all(&mnt).unwrap();
    let pfs_fuse = Path::new(PFS).with_file_name("pfs-fuse");
    let mut child = Command::new(&pfs_fuse)
        .arg("memory")
        .arg(&mnt)
        .args(["-o", "key=/nonexistent", "-f"])
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", pfs_fuse.display()));
    let end = Instant::now() + Duration::from_secs(30);
    while !mounted(&mnt) {
        assert!(Instant::now() < end, "the memory file system never mounted");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two short seeds: the in-memory file system is a plain Vec per file, slow at
    // the sizes pfs is exercised with.
    let (first, _, _) = seeds();
    println!("fsx on memfs: seeds {first}..{}", first + 2);
    fsx_seeds(&mnt, first, 2, 1500, |_| "none");
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    let _ = child.wait();
}

/// The exerciser on pfs: each seed with one of the three data layouts.
fn fsx_on_pfs(mnt: &Path) {
    let (first, n, ops) = seeds();
    println!("fsx on pfs: seeds {first}..{} x {ops} operations x 2 processes", first + n);
    fsx_seeds(mnt, first, n, ops, |seed| ["block", "io", "file"][(seed % 3) as usize]);
}

/// The pjdfstest directories run again with the writeback cache.
const WRITEBACK_DIRS: &[&str] =
    &["open", "truncate", "ftruncate", "utimensat", "chmod", "unlink", "rename", "link"];

/// The pjdfstest directories run through FUSE over io_uring.
const URING_DIRS: &[&str] = &["open", "mkdir", "unlink", "link", "truncate"];

/// Sets the `fuse` module's `enable_uring` for a case and restores it after.
struct EnableUring(String);

impl EnableUring {
    fn set(on: bool) -> EnableUring {
        let param = pfs_fuse::mount::ENABLE_URING_PARAM;
        let old = std::fs::read_to_string(param).unwrap_or_else(|e| {
            panic!("{param}: {e}: this kernel has no FUSE over io_uring (Linux 6.14+)")
        });
        std::fs::write(param, if on { "Y" } else { "N" }).unwrap();
        EnableUring(old.trim().to_string())
    }
}

impl Drop for EnableUring {
    fn drop(&mut self) {
        let _ = std::fs::write(pfs_fuse::mount::ENABLE_URING_PARAM, &self.0);
    }
}

/// What `pfs up` printed about io_uring: the mount line's transport and, at
/// the end, the requests the rings served (and the large reads among them
/// that bulk threads served) and the forgets /dev/fuse took (and in how many
/// reads).
fn uring_report(log: &[String]) -> (String, Option<(u64, u64, u64, u64)>) {
    let mounted = log.iter().find(|l| l.starts_with("pfs up: mounted on")).cloned();
    let served = log.iter().find_map(|l| {
        let rest = l.strip_prefix("pfs up: FUSE over io_uring served ")?;
        let n: Vec<u64> = rest
            .split(' ')
            .filter_map(|w| w.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
            .collect();
        (n.len() == 4).then(|| (n[0], n[1], n[2], n[3]))
    });
    (mounted.expect("pfs up printed its mount line"), served)
}

/// Through the rings: fsx, pjdfstest directories, transfers of every size up to
/// the largest request, and a directory larger than one readdir reply.
fn uring(base: &Path) {
    let _param = EnableUring::set(true);
    let (data, mnt) = (base.join("data-uring"), base.join("mnt-uring"));
    let (child, _, log) = up_logged(&data, &mnt, &["--workers", "2", "-o", "allow_other,uring"]);
    let pfs = Up(Some(child), mnt.clone());
    let (line, _) = uring_report(&log.lock().unwrap());
    assert!(line.contains("over io_uring ("), "the mount did not take io_uring: {line}");

    let (first, _, ops) = seeds();
    println!("fsx over io_uring: seeds {first}..{}", first + 2);
    fsx_seeds(&mnt, first, 2, ops, |seed| ["block", "io"][(seed % 2) as usize]);

    // Writes and reads of 1 byte to 4 MiB (the kernel splits at 1 MiB, the
    // largest entry payload), compared byte for byte.
    let mut data = vec![0u8; 4 << 20];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i * 131 % 251) as u8;
    }
    for len in [1usize, 4095, 4096, 65_537, 1 << 20, (1 << 20) + 1, 4 << 20] {
        let f = mnt.join(format!("transfer-{len}"));
        std::fs::write(&f, &data[..len]).unwrap();
        // The write left its pages in the kernel's cache: drop them, so the
        // read below reaches the file system (a large one through a bulk
        // thread).
        let file = std::fs::File::open(&f).unwrap();
        // SAFETY: advice on a descriptor we hold open; no memory is touched.
        let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0, "posix_fadvise of {}", f.display());
        drop(file);
        assert!(
            std::fs::read(&f).unwrap() == data[..len],
            "a {len}-byte transfer came back different"
        );
    }
    let dir = mnt.join("many");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..3000 {
        std::fs::write(dir.join(format!("entry-with-a-longish-name-{i:05}")), b"x").unwrap();
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 3000);
    pjdfstest(base, &mnt, Some(URING_DIRS));
    drop(pfs);
    let (_, served) = uring_report(&log.lock().unwrap());
    let (served, bulk, ..) = served.expect("pfs up reported what io_uring served");
    println!("io_uring served {served} requests, {bulk} large reads by bulk threads");
    // Each of the 3000 creates alone is a lookup, a create and a release.
    assert!(served > 9000, "io_uring served only {served} requests");
    // The 1 and 4 MiB files read back uncached, in reads of 128 KiB and more.
    assert!(bulk >= 2, "bulk threads served only {bulk} large reads");
}

/// Over io_uring, /dev/fuse carries the forgets: 3000 files removed in a row
/// reach it batched (its threads rest after a forget), not one wake-up each.
fn uring_forgets_batched(base: &Path) {
    let _param = EnableUring::set(true);
    let (data, mnt) = (base.join("data-uring-forgets"), base.join("mnt-uring-forgets"));
    let (child, _, log) = up_logged(&data, &mnt, &["-o", "uring"]);
    let pfs = Up(Some(child), mnt.clone());
    let (line, _) = uring_report(&log.lock().unwrap());
    assert!(line.contains("over io_uring ("), "the mount did not take io_uring: {line}");
    let dir = mnt.join("gone");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..3000 {
        std::fs::write(dir.join(format!("f{i}")), b"x").unwrap();
    }
    let at = std::time::Instant::now();
    std::fs::remove_dir_all(&dir).unwrap();
    let ms = at.elapsed().as_millis() as u64;
    drop(pfs);
    let (_, served) = uring_report(&log.lock().unwrap());
    let (_, _, forgets, reads) = served.expect("pfs up reported what io_uring served");
    println!("/dev/fuse took {forgets} forgets in {reads} reads; the removes took {ms} ms");
    assert!(forgets >= 3000, "only {forgets} forgets after 3000 removes");
    // The /dev/fuse threads (two) rest 1 ms after a forget, together: about
    // one read a millisecond (measured 1.1-1.2), at most two, however fast
    // the removes come; without the rest every forget is a read. The two
    // differ only if the removes ran faster than two a millisecond (this VM:
    // 5-8 a millisecond).
    let most = 2 * ms + 100;
    assert!(
        most < forgets,
        "the removes took {ms} ms: too slow to tell batched forgets from single ones"
    );
    assert!(reads <= most, "{forgets} forgets in {reads} reads over {ms} ms: not batched");
}

/// The pjdfstest directories run again on a fresh `pfs up`.
const INLINE_DIRS: &[&str] = &["open", "mkdir", "unlink", "rename", "link", "truncate"];

/// `pfs up` as it is by default, whose mount's threads run the parked workers'
/// rounds while requests of several threads interleave: the exerciser with 2
/// processes on the three layouts (they interleave, so the rounds run there),
/// pjdfstest directories, and the mount's threads did run rounds (it says how
/// often when it stops).
fn inline_rounds(base: &Path) {
    let (data, mnt) = (base.join("data-inline"), base.join("mnt-inline"));
    let (child, _, log) = up_logged(&data, &mnt, &["--workers", "2", "-o", "allow_other"]);
    let pfs = Up(Some(child), mnt.clone());
    let (first, _, ops) = seeds();
    println!("fsx with inline rounds: seeds {first}..{}", first + 3);
    fsx_seeds(&mnt, first, 3, ops, |seed| ["block", "io", "file"][(seed % 3) as usize]);
    pjdfstest(base, &mnt, Some(INLINE_DIRS));
    drop(pfs);
    let lines = log.lock().unwrap();
    let runs = reported(&lines, "pfs up: the mount's threads ran the workers' rounds ")
        .expect("pfs up reported how often the mount's threads ran rounds");
    println!("the mount's threads ran the workers' rounds {runs} times");
    assert!(runs > 100, "the mount's threads ran rounds only {runs} times");
    // How often a worker blocked on the device meanwhile (docs/cluster.md
    // "Known gaps": 0 in the last traced runs, not guaranteed).
    let waits = reported(&lines, "pfs up: the workers waited for the device ")
        .expect("pfs up reported how often its workers waited for the device");
    println!("the workers waited for the device {waits} times while serving");
}

/// The number that follows `prefix` on a line `pfs up` printed.
fn reported(lines: &[String], prefix: &str) -> Option<u64> {
    lines.iter().find_map(|l| l.strip_prefix(prefix)?.split(' ').next()?.parse().ok())
}

/// `-o uring` on a kernel that does not allow it: a warning, and /dev/fuse.
fn uring_fallback(base: &Path) {
    let _param = EnableUring::set(false);
    let (data, mnt) = (base.join("data-uring-off"), base.join("mnt-uring-off"));
    let (child, _, log) = up_logged(&data, &mnt, &["--workers", "2", "-o", "uring"]);
    let pfs = Up(Some(child), mnt.clone());
    let (line, _) = uring_report(&log.lock().unwrap());
    assert!(line.contains("over /dev/fuse ("), "expected the /dev/fuse fallback: {line}");
    std::fs::write(mnt.join("f"), b"through /dev/fuse").unwrap();
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"through /dev/fuse");
    drop(pfs);
    let (_, served) = uring_report(&log.lock().unwrap());
    assert_eq!(served, None, "no ring served this mount");
}

/// pjdfstest, built (once) in a temporary directory from `third_party/pjdfstest`:
/// every test file, or those of `dirs`.
fn pjdfstest(base: &Path, mnt: &Path, dirs: Option<&[&str]>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("third_party/pjdfstest");
    let build = base.join("pjdfstest");
    let sh = |dir: &Path, cmd: &str| {
        let out = Command::new("sh").arg("-c").arg(cmd).current_dir(dir).output().unwrap();
        assert!(
            out.status.success(),
            "`{cmd}` failed (needs autoconf automake gcc make):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    if !build.join("pjdfstest").exists() {
        sh(base, &format!("cp -r {} {}", src.display(), build.display()));
        sh(&build, "autoreconf -ifs && ./configure && make pjdfstest");
    }
    let run = mnt.join("pjd");
    std::fs::create_dir(&run).unwrap();
    let tests = build.join("tests");
    let targets: Vec<PathBuf> = match dirs {
        None => vec![tests.clone()],
        Some(d) => d.iter().map(|d| tests.join(d)).collect(),
    };
    // `prove` exits non-zero when a file fails; the list below decides. Four
    // files at once: the suite mostly sleeps (a second before each time check)
    // and waits on starting processes; every file works in names of its own.
    let out = Command::new("timeout")
        .arg("1500")
        .args(["prove", "-r", "-j4"])
        .args(&targets)
        .current_dir(&run)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_ne!(out.status.code(), Some(124), "pjdfstest hung (killed after 25 min):\n{report}");
    if dirs.is_none() {
        assert!(report.contains("Files=238"), "pjdfstest did not run every file:\n{report}");
    } else {
        assert!(report.contains("Files="), "pjdfstest did not run:\n{report}");
    }
    let failed = failed_files(&report, &build.join("tests"));
    let known = known_failures();
    let mut unexpected = Vec::new();
    for (file, n) in &failed {
        if !known.contains_key(file) {
            unexpected.push(format!("{file} ({n} subtests)"));
        }
    }
    let fixed: Vec<&String> = known
        .iter()
        .filter(|(f, flaky)| !**flaky && !failed.contains_key(*f))
        .filter(|(f, _)| dirs.is_none_or(|d| d.iter().any(|d| f.starts_with(&format!("{d}/")))))
        .map(|(f, _)| f)
        .collect();
    println!("pjdfstest: {} files fail: {:?}", failed.len(), failed.keys());
    assert!(unexpected.is_empty(), "pjdfstest files that newly fail: {unexpected:?}\n{report}");
    assert!(
        fixed.is_empty(),
        "pjdfstest files listed as failing now pass: remove them from \
         tests/pjdfstest-known-failures.txt and docs/posix.md: {fixed:?}"
    );
}

/// `prove`'s summary: failing file (relative to `tests`) -> failed subtests.
fn failed_files(report: &str, tests: &Path) -> BTreeMap<String, u64> {
    let prefix = format!("{}/", tests.display());
    let mut out = BTreeMap::new();
    for line in report.lines() {
        let Some(rest) = line.strip_prefix(&prefix) else { continue };
        let Some((file, summary)) = rest.split_once(char::is_whitespace) else { continue };
        if let Some(n) = summary.split("Failed: ").nth(1) {
            let n = n.trim_end_matches(')').trim().parse().unwrap_or(0);
            out.insert(file.to_string(), n);
        } else if summary.contains("Wstat") {
            // Died or planned more tests than it ran.
            out.insert(file.to_string(), 0);
        }
    }
    out
}

/// The known-failures list: file -> whether it is only sometimes failing.
fn known_failures() -> BTreeMap<String, bool> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pjdfstest-known-failures.txt");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (flaky, rest) = match line.strip_prefix('?') {
            Some(r) => (true, r.trim_start()),
            None => (false, line),
        };
        let file = rest.split_whitespace().next().unwrap();
        out.insert(file.to_string(), flaky);
    }
    out
}
