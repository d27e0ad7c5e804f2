//! `pfs`: the admin and all-in-one command.

use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use pfs_core::config::ConfigFile;
use pfs_core::ClientConfig;

/// pfs: a parallel file system for HPC clusters.
#[derive(Debug, Parser)]
#[command(name = "pfs", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a master and storage servers on local files and mount them with FUSE,
    /// all in this process; Ctrl-C (or SIGTERM) unmounts and stops cleanly. Run it
    /// again with the same --data to remount the same file system.
    Up {
        /// Where to mount (created if missing).
        #[arg(long)]
        mount: PathBuf,
        /// Data directory: key, master state and one device file per server.
        #[arg(long, default_value = "./pfs-data")]
        data: PathBuf,
        /// Storage servers to start.
        #[arg(long, default_value_t = 1)]
        servers: u32,
        /// Workers (shards) per server [default: what the data directory was made
        /// with; for a new one half the cores, 1 to 8: the FUSE threads and the
        /// applications share this host's cores]. Fixed on the first run.
        #[arg(long)]
        workers: Option<u32>,
        /// Longest adaptive spin of an idle worker before it sleeps, in
        /// microseconds (the server's `idle_spin_us`; the worker spins less, or
        /// not at all, while spinning does not pay; 0 never spins) [default: 100]
        #[arg(long, value_name = "US")]
        idle_spin_us: Option<u64>,
        /// Wake the worker for every request instead of letting the mount's
        /// threads run a parked worker's rounds themselves while requests of
        /// several threads interleave (the server's `inline_rounds`, on by
        /// default in pfs up: a request then costs no wake-up of the worker
        /// and none of the thread that waits; docs/cluster.md "Inline rounds")
        #[arg(long)]
        no_inline_rounds: bool,
        /// Size of each server's device file, in GiB (sparse: each shard's metadata
        /// and WAL are allocated at start, file data as it is written). Fixed on the
        /// first run.
        #[arg(long, default_value_t = 16)]
        size_gib: u64,
        /// Where the master listens (other clients mount with this address).
        #[arg(long, default_value = "127.0.0.1:7000")]
        master_listen: String,
        /// Mount options, as for pfs-fuse -o (comma-separated).
        #[arg(short = 'o', value_name = "OPTIONS")]
        options: Vec<String>,
    },
    /// Show or set the layouts of a directory or file on a pfs mount.
    Layout {
        #[command(subcommand)]
        action: LayoutAction,
    },
    /// Run an IO500-style workload (md-easy, md-hard, io-easy, io-hard, mdwb, ckpt)
    /// with N processes on a directory or a pfs cluster, verify it, report rates.
    #[command(after_long_help = pfs::bench::HELP)]
    Bench(pfs::bench::BenchArgs),
    /// Exercise files with seeded random operations (writes, reads, truncates,
    /// fsync, reopen, O_APPEND, mmap, fallocate, rename) checked against an
    /// in-memory model after each; prints the seed and the last operations and
    /// fails on the first mismatch.
    Fsx(pfs::fsx::FsxArgs),
    /// Check stopped servers' shards offline: every name reaches a live inode,
    /// link counts match names, no orphan inodes or data, no leaked transaction
    /// records. Each zone's log is replayed first, as a server start would.
    /// Exits 0 when clean, 1 with the list of problems; --repair fixes what is
    /// safe to fix, as logged operations.
    Fsck(pfs::fsck::FsckArgs),
    /// Format a storage server's device as a given server id before its first
    /// start (a server also formats an empty device by itself), or format every
    /// device of a pfs up data directory again. Refuses a device holding pfs
    /// zones unless --force (everything on it is lost).
    Mkfs(pfs::mkfs::MkfsArgs),
    /// Print the cluster's servers, their health and usage, as the master sees them.
    Status {
        /// Client config file (TOML) naming the master and the key file.
        #[arg(long, short)]
        config: Option<PathBuf>,
        /// The master, host:port (overrides the config).
        #[arg(long)]
        master: Option<String>,
        /// The cluster key file (overrides the config).
        #[arg(long)]
        key: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum LayoutAction {
    /// Print the effective metadata layout (directories) and data layout.
    Get {
        /// A path on a pfs mount.
        path: PathBuf,
    },
    /// Set the layouts new children of a directory get (or a file's data layout
    /// before it has data).
    Set {
        /// A path on a pfs mount.
        path: PathBuf,
        /// Metadata layout: `regular` (children stay with the directory) or
        /// `bigdir` (children hashed over every shard).
        #[arg(long)]
        dir: Option<String>,
        /// Data layout: `block` (blocks hashed over shards), `file` (whole file on
        /// one shard, for N-N) or `io` (each write owns its pages, for N-1).
        #[arg(long)]
        file: Option<String>,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pfs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: Command) -> Result<(), String> {
    match cmd {
        Command::Up {
            mount,
            data,
            servers,
            workers,
            idle_spin_us,
            no_inline_rounds,
            size_gib,
            master_listen,
            options,
        } => {
            if !(1..=1 << 20).contains(&size_gib) {
                return Err(format!("--size-gib {size_gib}: allowed 1 to 1048576"));
            }
            let opts = pfs::up::UpOptions {
                data,
                servers,
                workers,
                idle_spin_us,
                inline_rounds: !no_inline_rounds,
                size_bytes: size_gib << 30,
                master_listen,
            };
            pfs::up::run(&opts, &mount, &options)
        }
        Command::Layout { action: LayoutAction::Get { path } } => {
            print!("{}", pfs::layout::get(&path)?);
            Ok(())
        }
        Command::Layout { action: LayoutAction::Set { path, dir, file } } => {
            pfs::layout::set(&path, dir.as_deref(), file.as_deref())?;
            print!("{}", pfs::layout::get(&path)?);
            Ok(())
        }
        Command::Bench(args) => pfs::bench::run(&args),
        Command::Mkfs(args) => pfs::mkfs::run(&args),
        Command::Fsck(args) => match pfs::fsck::run(&args)? {
            true => Ok(()),
            false => Err("the file system has problems (listed above)".into()),
        },
        Command::Fsx(args) => pfs::fsx::run(&args),
        Command::Status { config, master, key } => {
            let mut cfg = match config {
                Some(path) => ClientConfig::load(&path).map_err(|e| e.to_string())?,
                None => ClientConfig::default(),
            };
            if let Some(m) = master {
                cfg.master = m;
            }
            if let Some(k) = key {
                cfg.key_file = k;
            }
            let addr = cfg
                .master
                .to_socket_addrs()
                .map_err(|e| format!("master {:?}: {e}", cfg.master))?
                .next()
                .ok_or_else(|| format!("master {:?} resolves to no address", cfg.master))?;
            let key = pfs_net::ClusterKey::load(&cfg.key_file).map_err(|e| e.to_string())?;
            let timeout = Duration::from_millis(cfg.connect_timeout_ms);
            let view =
                pfs_client::cluster::fetch_view(addr, &key, timeout).map_err(|e| e.to_string())?;
            print!("{}", pfs::status::status_table(&view));
            Ok(())
        }
    }
}
