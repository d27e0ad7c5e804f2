//! `pfs bench`: the IO500-style workloads of the PeakFS evaluation (mdtest
//! easy/hard, IOR easy/hard, md-workbench, HACC-IO), run by N processes against
//! a directory or a pfs cluster through the native client.
//!
//! - [`target`]: the [`Target`](target::Target) trait (create, open, read, write,
//!   stat, unlink, mkdir, rmdir, readdir by path) over `std::fs` and over the
//!   native client.
//! - [`pattern`]: the deterministic content of every file, and its checker.
//! - [`particles`]: the HACC-IO checkpoint arrays, and their checker.
//! - [`workload`]: each workload's options, phases and files, and what the
//!   coordinator sets up, checks between phases and removes.
//! - [`phases`]: what a worker does in each phase, timed behind the barrier.
//! - [`proto`]: the messages between coordinator and workers, the shared clock.
//! - [`coord`]: the coordinator: starts the workers, drives the phases behind a
//!   barrier, stops stonewalled phases, shows progress.
//! - [`worker`]: a worker process (this binary run again with
//!   [`WORKER_ENV`] set).
//! - [`cpu`]: the CPU time of the workers and the file system's processes.
//! - [`report`]: results as a table and as JSON.
//! - [`plot`]: results as an SVG bar chart.

pub mod coord;
pub mod cpu;
pub mod particles;
pub mod pattern;
pub mod phases;
pub mod plot;
pub mod proto;
pub mod report;
pub mod target;
pub mod worker;
pub mod workload;

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use target::{Target, TargetError, TargetSpec};
pub use workload::Workload;

/// Set (to any value) in the environment of the worker processes the
/// coordinator starts: `pfs bench` then runs as a worker fed by its stdin.
pub const WORKER_ENV: &str = "PFS_BENCH_WORKER";

/// What `pfs bench --help` says after the options.
pub const HELP: &str = "\
Workloads (PeakFS section IV, GekkoFS section 4; rank r always stats, reads and
removes what rank (r+1)%N made, like mdtest -N 1 and IOR -C):
  md-easy   each process creates --files empty files in its own directory;
            phases: create, stat, remove.
  md-hard   all processes create --files files of --size bytes (3901) in one
            shared directory; phases: create (with the write), stat, read, remove.
  io-easy   N-N: one file per process, --segments transfers of --transfer bytes
            (256 KiB); phases: write, read.
  io-hard   N-1: one shared file, --segments transfers of --transfer bytes (47008)
            per process, interleaved and non-overlapping; phases: write, read.
  mdwb      md-workbench: each process precreates --window files of --size bytes,
            then, --files times, stats, reads, removes the oldest file of its
            neighbour's window and creates a new one (4 ops an iteration);
            phases: precreate, mixed, cleanup.
  ckpt      HACC-IO checkpoint/restart: each process writes --particles particles
            (9 arrays: xx yy zz vx vy vz phi as f32, pid as i64, mask as u16; 38
            bytes each) in --transfer pieces (1 MiB) to its own file, then reads
            its neighbour's back into arrays allocated (and touched) before
            the clock starts, as the checkpoint's arrays are generated before
            it; phases: checkpoint, restart.

Each phase starts behind a barrier of all processes; its rate is the total of
all processes over (latest finish - earliest start). --time SECS stonewalls the
first phase (create, write or mixed): it stops at SECS and later phases use the
counts each process reached; the count options then only cap it.

CPU per operation: each phase also reports the CPU time (user + system, all
threads) the workers and the --cpu-of processes spent during it, divided by its
operations. Unlike the rate it hardly drifts on a shared machine.

Every phase checks what it finds: file types and sizes, content (a pattern that
depends on the owner rank, the file and the offset), directory listings, and
empty directories after removal. Any difference stops the run with a non-zero
exit and a message naming the file, the offset and the bytes.

TARGET is a directory (any file system: a pfs mount, tmpfs, ...) or
pfs://HOST:PORT[/DIR], a pfs master reached through the native client with the
cluster key of --key. The run works in a new directory TARGET/pfs-bench.<workload>.<pid>
and removes it at the end (it is left in place for inspection after a failure).

Examples:
  pfs bench md-hard --procs 4 --files 5000 /mnt/pfs
  pfs bench io-easy --time 30 --json io-easy.json --plot io-easy.svg pfs://10.0.0.1:7000";

/// `pfs bench` options.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// The workload.
    #[arg(value_enum)]
    pub workload: Workload,
    /// A directory, or pfs://HOST:PORT[/DIR] for the native client.
    pub target: String,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    pub procs: u32,
    /// Files per process (md-easy 1000, md-hard 1000); iterations per process
    /// (mdwb 1000).
    #[arg(long)]
    pub files: Option<u64>,
    /// Bytes per file (md-hard 3901, mdwb 3901).
    #[arg(long)]
    pub size: Option<u64>,
    /// Bytes per read or write (io-easy 262144, io-hard 47008, ckpt 1048576).
    #[arg(long)]
    pub transfer: Option<u64>,
    /// Transfers per process (io-easy 128, io-hard 512).
    #[arg(long)]
    pub segments: Option<u64>,
    /// Particles per process (ckpt 1048576).
    #[arg(long)]
    pub particles: Option<u64>,
    /// Files each process keeps alive (mdwb 20).
    #[arg(long)]
    pub window: Option<u64>,
    /// Stonewall: run the first phase for SECS seconds instead of a fixed count.
    #[arg(long, value_name = "SECS")]
    pub time: Option<f64>,
    /// Cluster key file, for a pfs:// target.
    #[arg(long, default_value = "/etc/pfs/cluster.key")]
    pub key: PathBuf,
    /// Write every figure (per phase and per process) to FILE as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw the phases' rates as an SVG bar chart.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Name of this run in the chart and the JSON (default: the target).
    #[arg(long)]
    pub label: Option<String>,
    /// Draw the runs of earlier --json files (same workload) next to this one in
    /// the --plot chart; repeat for several.
    #[arg(long, value_name = "FILE.json")]
    pub compare: Vec<PathBuf>,
    /// Count this process's CPU time (all its threads) in each phase's CPU per
    /// operation, besides the workers' own: the file system's server or FUSE
    /// daemon on this host. Repeat for several.
    #[arg(long, value_name = "PID")]
    pub cpu_of: Vec<u32>,
}

/// The sizes and counts of a run, after defaults; `None` where the workload
/// does not use it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Worker processes.
    pub procs: u32,
    /// Files (md-easy, md-hard) or iterations (mdwb) per process: the count, or
    /// the cap under `--time`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub files: Option<u64>,
    /// Bytes per file.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub size_bytes: Option<u64>,
    /// Bytes per transfer.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub transfer_bytes: Option<u64>,
    /// Transfers per process: the count, or the cap under `--time`.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub segments: Option<u64>,
    /// Particles per process.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub particles: Option<u64>,
    /// Files alive per process.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub window: Option<u64>,
    /// Stonewall time of the first phase.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub time_s: Option<f64>,
}

/// What went wrong in a run.
#[derive(Debug)]
pub enum BenchError {
    /// A file system operation failed.
    Target(TargetError),
    /// The file system returned something other than what was written.
    Verify {
        /// The path (relative to the target).
        path: String,
        /// What differs.
        what: String,
    },
    /// Options, target, or the worker processes.
    Setup(String),
}

impl BenchError {
    /// A verification failure on `path`.
    pub fn verify(path: &str, what: impl Into<String>) -> BenchError {
        BenchError::Verify { path: path.into(), what: what.into() }
    }
}

impl fmt::Display for BenchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BenchError::Target(e) => write!(f, "{e}"),
            BenchError::Verify { path, what } => write!(f, "verification failed: {path}: {what}"),
            BenchError::Setup(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for BenchError {}

impl From<TargetError> for BenchError {
    fn from(e: TargetError) -> BenchError {
        BenchError::Target(e)
    }
}

/// Most worker processes.
pub const PROCS_MAX: u32 = 256;

impl Params {
    /// Resolves `args` for its workload: defaults for what is not given, an
    /// error for an option the workload does not use or a value out of range.
    pub fn from_args(args: &BenchArgs) -> Result<Params, String> {
        workload::resolve(args)
    }
}

/// `pfs bench`: the coordinator, or a worker when [`WORKER_ENV`] is set.
pub fn run(args: &BenchArgs) -> Result<(), String> {
    if std::env::var_os(WORKER_ENV).is_some() {
        return worker::main(args);
    }
    coord::main(args)
}
