//! The workloads: their options, their phases, the names of their files, and
//! what the coordinator sets up, checks between phases and removes at the end.
//! What a worker does in a phase is in [`super::phases`].

use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::particles;
use super::target::Target;
use super::{BenchArgs, BenchError, Params, PROCS_MAX};

/// An IO500-style workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// mdtest easy: empty files, a directory per process.
    MdEasy,
    /// mdtest hard: 3901-byte files in one shared directory.
    MdHard,
    /// IOR easy: N-N, a file per process, 256 KiB transfers.
    IoEasy,
    /// IOR hard: N-1, one shared file, 47008-byte interleaved transfers.
    IoHard,
    /// md-workbench: a rolling window of small files, mixed operations.
    Mdwb,
    /// HACC-IO: checkpoint particle arrays, restart from another process's.
    Ckpt,
}

/// What a phase's rate is reported in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Metric {
    /// Operations per second.
    #[serde(rename = "ops/s")]
    OpsPerSec,
    /// MiB per second.
    #[serde(rename = "MiB/s")]
    MibPerSec,
}

impl Metric {
    /// The unit as printed.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::OpsPerSec => "ops/s",
            Metric::MibPerSec => "MiB/s",
        }
    }
}

/// One phase of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseDef {
    /// Its name in tables and charts.
    pub name: &'static str,
    /// Whether `--time` stonewalls it.
    pub stonewall: bool,
    /// Whether it only looks (stat, read): it changes no name, size or byte,
    /// so the coordinator's check of an earlier phase can wait until after it
    /// (see [`check_after`]).
    pub looks_only: bool,
}

const fn ph(name: &'static str, stonewall: bool) -> PhaseDef {
    PhaseDef { name, stonewall, looks_only: false }
}

/// A phase that only looks.
const fn look(name: &'static str) -> PhaseDef {
    PhaseDef { name, stonewall: false, looks_only: true }
}

const MD_EASY: [PhaseDef; 3] = [ph("create", true), look("stat"), ph("remove", false)];
const MD_HARD: [PhaseDef; 4] =
    [ph("create", true), look("stat"), look("read"), ph("remove", false)];
const IO: [PhaseDef; 2] = [ph("write", true), look("read")];
const MDWB: [PhaseDef; 3] = [ph("precreate", false), ph("mixed", true), ph("cleanup", false)];
const CKPT: [PhaseDef; 2] = [ph("checkpoint", false), look("restart")];

/// Defaults and limits.
const FILES_DEFAULT: u64 = 1000;
const FILES_TIMED_CAP: u64 = 1_000_000;
const FILES_MAX: u64 = 10_000_000;
const SIZE_DEFAULT_BYTES: u64 = 3901;
const SIZE_MAX_BYTES: u64 = 16 << 20;
const TRANSFER_MAX_BYTES: u64 = 64 << 20;
const SEGMENTS_TIMED_CAP: u64 = 65_536;
const SEGMENTS_MAX: u64 = 1 << 24;
const BYTES_PER_PROC_MAX: u64 = 1 << 40;
const PARTICLES_DEFAULT: u64 = 1 << 20;
const PARTICLES_MAX: u64 = 1 << 23;
const WINDOW_DEFAULT: u64 = 20;
const WINDOW_MAX: u64 = 100_000;
const TIME_MAX_S: f64 = 86_400.0;
/// Most names a directory check lists.
const LIST_MAX: usize = 20_000_000;

impl Workload {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::MdEasy => "md-easy",
            Workload::MdHard => "md-hard",
            Workload::IoEasy => "io-easy",
            Workload::IoHard => "io-hard",
            Workload::Mdwb => "mdwb",
            Workload::Ckpt => "ckpt",
        }
    }

    /// Its phases, in order.
    pub fn phases(self) -> &'static [PhaseDef] {
        match self {
            Workload::MdEasy => &MD_EASY,
            Workload::MdHard => &MD_HARD,
            Workload::IoEasy | Workload::IoHard => &IO,
            Workload::Mdwb => &MDWB,
            Workload::Ckpt => &CKPT,
        }
    }

    /// What its rates are reported in.
    pub fn metric(self) -> Metric {
        match self {
            Workload::MdEasy | Workload::MdHard | Workload::Mdwb => Metric::OpsPerSec,
            Workload::IoEasy | Workload::IoHard | Workload::Ckpt => Metric::MibPerSec,
        }
    }

    /// The configured count of the stonewalled phase (per rank), or 0.
    pub fn count(self, p: &Params) -> u64 {
        match self {
            Workload::MdEasy | Workload::MdHard | Workload::Mdwb => p.files.expect("files"),
            Workload::IoEasy | Workload::IoHard => p.segments.expect("segments"),
            Workload::Ckpt => 0,
        }
    }

    /// Iterations rank `rank` runs in phase `phase`, given the per-rank counts of
    /// the stonewalled phase.
    pub fn items(self, phase: usize, rank: u32, p: &Params, counts: &[u64]) -> u64 {
        assert!(phase < self.phases().len(), "phase {phase} of {}", self.name());
        assert_eq!(counts.len(), p.procs as usize, "a count per rank");
        let peer = counts[peer(rank, p.procs) as usize];
        let own = counts[rank as usize];
        match (self, phase) {
            (Workload::MdEasy | Workload::MdHard | Workload::IoEasy | Workload::IoHard, 0) => own,
            (Workload::MdEasy | Workload::MdHard | Workload::IoEasy | Workload::IoHard, _) => peer,
            (Workload::Mdwb, 1) => own,
            (Workload::Mdwb, _) => p.window.expect("window"),
            (Workload::Ckpt, _) => ckpt_transfers(p),
        }
    }
}

/// The rank whose work `rank` checks and removes.
pub fn peer(rank: u32, procs: u32) -> u32 {
    (rank + 1) % procs
}

/// Writes (or reads) of one checkpoint: every array cut in transfers.
pub fn ckpt_transfers(p: &Params) -> u64 {
    let n = p.particles.expect("particles");
    let t = p.transfer_bytes.expect("transfer");
    (0..particles::ARRAYS.len())
        .map(|a| particles::array_range(a, n))
        .map(|r| (r.end - r.start).div_ceil(t))
        .sum()
}

fn check_range(name: &str, v: u64, min: u64, max: u64) -> Result<u64, String> {
    if (min..=max).contains(&v) {
        Ok(v)
    } else {
        Err(format!("--{name} {v}: allowed {min} to {max}"))
    }
}

/// The options of `args` resolved for its workload (see [`Params::from_args`]).
pub fn resolve(args: &BenchArgs) -> Result<Params, String> {
    let w = args.workload;
    check_range("procs", args.procs as u64, 1, PROCS_MAX as u64)?;
    if let Some(t) = args.time {
        if !(0.1..=TIME_MAX_S).contains(&t) {
            return Err(format!("--time {t}: allowed 0.1 to {TIME_MAX_S} seconds"));
        }
        if w == Workload::Ckpt {
            return Err("--time: ckpt has no stonewalled phase; size it with --particles".into());
        }
    }
    let timed = args.time.is_some();
    let uses = |opt: &str| -> bool {
        matches!(
            (w, opt),
            (Workload::MdEasy, "files")
                | (Workload::MdHard, "files" | "size")
                | (Workload::IoEasy | Workload::IoHard, "transfer" | "segments")
                | (Workload::Mdwb, "files" | "size" | "window")
                | (Workload::Ckpt, "particles" | "transfer")
        )
    };
    let given = [
        ("files", args.files),
        ("size", args.size),
        ("transfer", args.transfer),
        ("segments", args.segments),
        ("particles", args.particles),
        ("window", args.window),
    ];
    for (opt, v) in given {
        if v.is_some() && !uses(opt) {
            return Err(format!("--{opt} does not apply to {}", w.name()));
        }
    }
    let mut p = Params {
        procs: args.procs,
        files: None,
        size_bytes: None,
        transfer_bytes: None,
        segments: None,
        particles: None,
        window: None,
        time_s: args.time,
    };
    if uses("files") {
        let d = if timed { FILES_TIMED_CAP } else { FILES_DEFAULT };
        p.files = Some(check_range("files", args.files.unwrap_or(d), 1, FILES_MAX)?);
    }
    if uses("size") {
        let v = args.size.unwrap_or(SIZE_DEFAULT_BYTES);
        // md-hard's files are read back whole, so they may be empty only in md-easy.
        p.size_bytes = Some(check_range("size", v, 1, SIZE_MAX_BYTES)?);
    }
    if uses("transfer") {
        let d = match w {
            Workload::IoEasy => 256 << 10,
            Workload::IoHard => 47008,
            _ => 1 << 20,
        };
        p.transfer_bytes =
            Some(check_range("transfer", args.transfer.unwrap_or(d), 1, TRANSFER_MAX_BYTES)?);
    }
    if uses("segments") {
        let d = match (timed, w) {
            (true, _) => SEGMENTS_TIMED_CAP,
            (false, Workload::IoEasy) => 128,
            (false, _) => 512,
        };
        let s = check_range("segments", args.segments.unwrap_or(d), 1, SEGMENTS_MAX)?;
        let per_proc = s * p.transfer_bytes.expect("transfer resolved first");
        if per_proc > BYTES_PER_PROC_MAX {
            return Err(format!(
                "--segments {s} x --transfer {}: {per_proc} bytes per process, at most {}",
                p.transfer_bytes.expect("transfer"),
                BYTES_PER_PROC_MAX
            ));
        }
        p.segments = Some(s);
    }
    if uses("particles") {
        let v = args.particles.unwrap_or(PARTICLES_DEFAULT);
        p.particles = Some(check_range("particles", v, 1, PARTICLES_MAX)?);
    }
    if uses("window") {
        p.window =
            Some(check_range("window", args.window.unwrap_or(WINDOW_DEFAULT), 1, WINDOW_MAX)?);
    }
    Ok(p)
}

/// Sets `buf` to a path (one buffer reused for every operation).
pub fn set_path(buf: &mut String, args: std::fmt::Arguments<'_>) {
    buf.clear();
    buf.write_fmt(args).expect("writing to a String");
}

/// Rank `r`'s directory (md-easy, mdwb).
pub fn rank_dir(run: &str, r: u32) -> String {
    format!("{run}/d{r}")
}

/// md-hard's shared directory.
pub fn shared_dir(run: &str) -> String {
    format!("{run}/shared")
}

/// io-easy's file of rank `r`.
pub fn io_easy_file(run: &str, r: u32) -> String {
    format!("{run}/file.{r}")
}

/// io-hard's shared file.
pub fn io_hard_file(run: &str) -> String {
    format!("{run}/shared.dat")
}

/// ckpt's checkpoint of rank `r`.
pub fn ckpt_file(run: &str, r: u32) -> String {
    format!("{run}/ckpt.{r}")
}

/// Offset of rank `r`'s segment `s` in io-hard's shared file.
pub fn io_hard_offset(s: u64, r: u32, procs: u32, transfer: u64) -> u64 {
    (s * procs as u64 + r as u64) * transfer
}

/// Size io-hard's shared file must have once rank r wrote `counts[r]` segments.
pub fn io_hard_size(counts: &[u64], transfer: u64) -> u64 {
    let procs = counts.len() as u32;
    (0..procs)
        .filter(|&r| counts[r as usize] > 0)
        .map(|r| io_hard_offset(counts[r as usize] - 1, r, procs, transfer) + transfer)
        .max()
        .unwrap_or(0)
}

/// Creates the run directory and what the workers expect to find in it.
pub fn setup<T: Target>(w: Workload, t: &T, run: &str, p: &Params) -> Result<(), BenchError> {
    t.mkdir(run)?;
    match w {
        Workload::MdEasy | Workload::Mdwb => {
            for r in 0..p.procs {
                t.mkdir(&rank_dir(run, r))?;
            }
        }
        Workload::MdHard => t.mkdir(&shared_dir(run))?,
        Workload::IoHard => {
            let f = t.create(&io_hard_file(run))?;
            t.close(f)?;
        }
        Workload::IoEasy | Workload::Ckpt => {}
    }
    Ok(())
}

/// Checks that directory `dir` holds exactly `want` entries.
pub fn expect_entries<T: Target>(t: &T, dir: &str, want: u64) -> Result<(), BenchError> {
    let names = t.readdir(dir, LIST_MAX)?;
    if names.len() as u64 != want {
        let sample: Vec<&String> = names.iter().take(5).collect();
        let what = if want == 0 {
            format!(
                "directory not empty after remove: {} entries left, e.g. {sample:?}",
                names.len()
            )
        } else {
            format!("directory lists {} entries, expected {want} (e.g. {sample:?})", names.len())
        };
        return Err(BenchError::verify(dir, what));
    }
    Ok(())
}

/// Checks that `path` is a regular file of `size` bytes.
pub fn expect_file<T: Target>(t: &T, path: &str, size: u64) -> Result<(), BenchError> {
    let st = t.stat(path)?;
    if !st.is_file {
        return Err(BenchError::verify(path, "not a regular file"));
    }
    if st.size != size {
        return Err(BenchError::verify(path, format!("size {}, expected {size}", st.size)));
    }
    Ok(())
}

/// The coordinator's check after phase `phase`: listings and sizes as the
/// per-rank `counts` say they must be.
///
/// The coordinator runs it right before the next phase that changes
/// something, or at the end, never right before a phase that only looks
/// ([`checks_due_before`]): its listings and stats would fill the kernel's
/// name and attribute caches of a mount (a `readdirplus` answers every
/// name's attributes), and the timed stats and reads after it would measure
/// those caches instead of the file system (mdtest runs its stat phase
/// after nothing but a barrier).
pub fn check_after<T: Target>(
    w: Workload,
    phase: usize,
    t: &T,
    run: &str,
    p: &Params,
    counts: &[u64],
) -> Result<(), BenchError> {
    let name = w.phases()[phase].name;
    match (w, name) {
        (Workload::MdEasy, "create") => {
            for r in 0..p.procs {
                expect_entries(t, &rank_dir(run, r), counts[r as usize])?;
            }
        }
        (Workload::MdEasy, "remove") => {
            for r in 0..p.procs {
                expect_entries(t, &rank_dir(run, r), 0)?;
            }
        }
        (Workload::MdHard, "create") => {
            expect_entries(t, &shared_dir(run), counts.iter().sum())?;
        }
        (Workload::MdHard, "remove") => expect_entries(t, &shared_dir(run), 0)?,
        (Workload::IoEasy, "write") => {
            let tr = p.transfer_bytes.expect("transfer");
            for r in 0..p.procs {
                expect_file(t, &io_easy_file(run, r), counts[r as usize] * tr)?;
            }
        }
        (Workload::IoHard, "write") => {
            let size = io_hard_size(counts, p.transfer_bytes.expect("transfer"));
            expect_file(t, &io_hard_file(run), size)?;
        }
        (Workload::Mdwb, "precreate" | "mixed") => {
            for r in 0..p.procs {
                expect_entries(t, &rank_dir(run, r), p.window.expect("window"))?;
            }
        }
        (Workload::Mdwb, "cleanup") => {
            for r in 0..p.procs {
                expect_entries(t, &rank_dir(run, r), 0)?;
            }
        }
        (Workload::Ckpt, "checkpoint") => {
            let size = particles::file_bytes(p.particles.expect("particles"));
            for r in 0..p.procs {
                expect_file(t, &ckpt_file(run, r), size)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The phases whose [`check_after`] runs before phase `next` of workload `w`
/// (`next` = the number of phases: at the end): every phase from the last
/// one before `next` that changed something, if `next` changes something or
/// is the end; none before a phase that only looks.
pub fn checks_due_before(w: Workload, next: usize) -> std::ops::Range<usize> {
    let phases = w.phases();
    if next < phases.len() && phases[next].looks_only {
        return next..next;
    }
    // Walk back over the phases that only looked; their checks and the one
    // of the phase that changed something before them are due now.
    let mut first = next;
    while first > 0 {
        first -= 1;
        if !phases[first].looks_only {
            break;
        }
    }
    first..next
}

/// Removes what the phases left and the run directory, then checks it is gone.
pub fn cleanup<T: Target>(w: Workload, t: &T, run: &str, p: &Params) -> Result<(), BenchError> {
    match w {
        Workload::MdEasy | Workload::Mdwb => {
            for r in 0..p.procs {
                t.rmdir(&rank_dir(run, r))?;
            }
        }
        Workload::MdHard => t.rmdir(&shared_dir(run))?,
        Workload::IoEasy => {
            for r in 0..p.procs {
                t.unlink(&io_easy_file(run, r))?;
            }
        }
        Workload::IoHard => t.unlink(&io_hard_file(run))?,
        Workload::Ckpt => {
            for r in 0..p.procs {
                t.unlink(&ckpt_file(run, r))?;
            }
        }
    }
    expect_entries(t, run, 0)?;
    t.rmdir(run)?;
    match t.stat(run) {
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
        Ok(_) => Err(BenchError::verify(run, "still there after rmdir")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn args(line: &str) -> BenchArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(line.split_whitespace())).unwrap().args
    }

    #[test]
    fn checks_wait_until_after_the_phases_that_only_look() {
        let due = |w: Workload| -> Vec<Vec<&str>> {
            (0..=w.phases().len())
                .map(|n| checks_due_before(w, n).map(|i| w.phases()[i].name).collect())
                .collect()
        };
        // Before each phase, and at the end.
        assert_eq!(due(Workload::MdEasy), [vec![], vec![], vec!["create", "stat"], vec!["remove"]]);
        assert_eq!(
            due(Workload::MdHard),
            [vec![], vec![], vec![], vec!["create", "stat", "read"], vec!["remove"]]
        );
        assert_eq!(due(Workload::IoEasy), [vec![], vec![], vec!["write", "read"]]);
        assert_eq!(due(Workload::Ckpt), [vec![], vec![], vec!["checkpoint", "restart"]]);
        assert_eq!(
            due(Workload::Mdwb),
            [vec![], vec!["precreate"], vec!["mixed"], vec!["cleanup"]]
        );
        // Every check runs exactly once.
        for w in [Workload::MdEasy, Workload::MdHard, Workload::IoEasy, Workload::IoHard] {
            let all: Vec<usize> =
                (0..=w.phases().len()).flat_map(|n| checks_due_before(w, n)).collect();
            assert_eq!(all, (0..w.phases().len()).collect::<Vec<_>>(), "{w:?}");
        }
    }

    #[test]
    fn defaults_per_workload() {
        let p = resolve(&args("md-hard /tmp")).unwrap();
        assert_eq!((p.files, p.size_bytes, p.segments), (Some(1000), Some(3901), None));
        let p = resolve(&args("io-hard /tmp")).unwrap();
        assert_eq!((p.transfer_bytes, p.segments), (Some(47008), Some(512)));
        let p = resolve(&args("io-easy --time 5 /tmp")).unwrap();
        assert_eq!((p.transfer_bytes, p.segments), (Some(262144), Some(SEGMENTS_TIMED_CAP)));
        let p = resolve(&args("ckpt /tmp")).unwrap();
        assert_eq!((p.particles, p.transfer_bytes), (Some(1 << 20), Some(1 << 20)));
    }

    #[test]
    fn wrong_options_are_refused_with_their_name() {
        let e = resolve(&args("md-easy --segments 3 /tmp")).unwrap_err();
        assert!(e.contains("--segments does not apply to md-easy"), "{e}");
        let e = resolve(&args("ckpt --time 3 /tmp")).unwrap_err();
        assert!(e.contains("ckpt"), "{e}");
        let e = resolve(&args("md-hard --procs 0 /tmp")).unwrap_err();
        assert!(e.contains("--procs 0"), "{e}");
        let e = resolve(&args("io-easy --transfer 0 /tmp")).unwrap_err();
        assert!(e.contains("--transfer 0"), "{e}");
    }

    #[test]
    fn io_hard_segments_interleave_without_overlap() {
        let (procs, t) = (3u32, 10u64);
        let mut seen = std::collections::BTreeSet::new();
        for r in 0..procs {
            for s in 0..4 {
                assert!(seen.insert(io_hard_offset(s, r, procs, t)));
            }
        }
        let offs: Vec<u64> = seen.into_iter().collect();
        assert!(offs.windows(2).all(|w| w[1] - w[0] == t), "contiguous, one transfer apart");
        assert_eq!(io_hard_size(&[4, 4, 4], t), 120);
        assert_eq!(io_hard_size(&[4, 2, 0], t), 100, "rank 0's 4th segment ends last");
        assert_eq!(io_hard_size(&[0, 0, 0], t), 0);
    }

    #[test]
    fn later_phases_take_the_peers_count() {
        let p = resolve(&args("md-hard --procs 3 /tmp")).unwrap();
        let counts = [10, 20, 30];
        assert_eq!(Workload::MdHard.items(0, 0, &p, &counts), 10);
        assert_eq!(Workload::MdHard.items(1, 0, &p, &counts), 20);
        assert_eq!(Workload::MdHard.items(3, 2, &p, &counts), 10);
        let p = resolve(&args("mdwb --procs 3 --window 7 /tmp")).unwrap();
        assert_eq!(Workload::Mdwb.items(0, 1, &p, &counts), 7);
        assert_eq!(Workload::Mdwb.items(1, 1, &p, &counts), 20);
        assert_eq!(Workload::Mdwb.items(2, 1, &p, &counts), 7);
    }
}
