//! `pfs-fuse MASTER MOUNTPOINT [-o options]`: mounts a pfs cluster.
//!
//! Like other FUSE mount helpers it returns once the mount is live and keeps
//! serving in the background (`-f` keeps it in the foreground); `umount` or
//! SIGTERM ends it.

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;

use clap::Parser;
use pfs_client::{Cluster, ClusterOptions, FileSystem};
use pfs_fuse::{MemFs, MountConfig};

const READY_FD_ENV: &str = "PFS_FUSE_READY_FD";
/// The descriptor the daemon reports readiness on.
const READY_FD: i32 = 3;

/// Mount a pfs cluster with FUSE.
///
/// Works as a mount helper: `mount -t fuse.pfs-fuse 127.0.0.1:7000 /mnt/pfs -o
/// key=/etc/pfs/cluster.key` and the fstab line `127.0.0.1:7000 /mnt/pfs
/// fuse.pfs-fuse key=/etc/pfs/cluster.key,_netdev 0 0` run it.
///
/// Options (-o, comma-separated): config=FILE (client TOML; other options
/// override it), key=FILE (cluster key, default /etc/pfs/cluster.key),
/// timeout=SECS (a request to a server that does not answer fails with EIO
/// after this long; default 30), strict (every write waits for the server),
/// entry_timeout=SECS and attr_timeout=SECS (kernel cache lifetimes, default 1),
/// negative_timeout=SECS (how long the kernel remembers that a name does not
/// exist; default 0, ask again each time),
/// dentry_timeout=SECS (client directory cache), threads=N (FUSE threads,
/// default one per core, 2 to 64), noclone_fd, writeback_cache (the kernel
/// gathers writes in its page cache and sends them at writeback, fsync or
/// close; see docs/posix.md), readdirplus=always|auto (every directory read
/// carries the children's attributes, the default, or only when the kernel
/// guesses they will be used), page_cache=keep|drop (an open keeps the kernel's
/// cached pages of a file no other client changed since, the default, or drops
/// them every time; see docs/posix.md), small_files=lookup|read (a lookup brings
/// a small file's bytes for the read that follows it, the default, or every
/// read asks the server), statahead=on|off (lookups that follow each other in a
/// directory are answered from batches of its attributes, the default; off for
/// `memory`), read_ahead_kb=N (the kernel's read-ahead
/// for the mount, default 4096; needs root, 0 keeps the kernel's 128), uring (FUSE
/// over io_uring: Linux 6.14+, after
/// `echo Y > /sys/module/fuse/parameters/enable_uring`; otherwise /dev/fuse with
/// a warning), uring_threads=N (threads per CPU queue, default 2, 1 to 64),
/// uring_nopin (do not pin them to their CPU), uring_bulk=N (threads that serve
/// reads of 128 KiB and more off the reader's CPU, default one per core up to
/// 16, 0 to 64), log=FILE (where the daemon logs,
/// in the foreground too),
/// allow_other, allow_root, fsname=NAME, and the usual ro, nodev, nosuid,
/// noexec, noatime, sync, dirsync. mount(8) options such as _netdev, nofail,
/// defaults, auto are accepted and ignored.
#[derive(Debug, Parser)]
#[command(name = "pfs-fuse", version, verbatim_doc_comment)]
struct Cli {
    /// The master, HOST:PORT; `memory` mounts an empty in-memory file system (the
    /// FUSE baseline for benchmarks) instead of a cluster.
    master: String,
    /// Where to mount (an existing directory).
    mountpoint: PathBuf,
    /// Mount options, comma-separated (may be repeated).
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground (log to stderr) instead of returning once mounted.
    #[arg(short = 'f', long)]
    foreground: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut cfg = MountConfig::default();
    if let Err(e) = cfg.apply_options(&cli.options) {
        return fail(&e);
    }
    // The mount source names the master, whatever a config= file says (and is
    // the file system's name in /proc/mounts).
    cfg.client.master = cli.master.clone();
    cfg.exit_when_unmounted = true;
    if !cli.foreground {
        return daemonize(&cfg);
    }
    let mut ready = std::env::var(READY_FD_ENV).ok().map(|_| {
        // SAFETY: the parent passed this descriptor open, and nothing else owns it.
        unsafe { std::fs::File::from_raw_fd(READY_FD) }
    });
    init_log(&cfg, ready.is_some());
    match serve(&cli, &cfg, &mut ready) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The waiting parent prints it: the daemon's stderr goes nowhere.
            if let Some(mut r) = ready {
                let _ = writeln!(r, "{e}");
            }
            fail(&e)
        }
    }
}

fn fail(msg: &str) -> ExitCode {
    log::error!("{msg}");
    eprintln!("pfs-fuse: {msg}");
    ExitCode::FAILURE
}

fn init_log(cfg: &MountConfig, daemon: bool) {
    let mut b = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    // `log=FILE` logs there, in the foreground too; without it a daemon logs
    // nothing and the foreground logs to stderr.
    match cfg.log.as_ref().map(|p| std::fs::OpenOptions::new().create(true).append(true).open(p)) {
        Some(Ok(f)) => {
            b.target(env_logger::Target::Pipe(Box::new(f)));
        }
        Some(Err(e)) => eprintln!("pfs-fuse: log file: {e}"),
        None if daemon => {
            b.filter_level(log::LevelFilter::Off);
        }
        None => {}
    }
    b.init();
}

fn serve(cli: &Cli, cfg: &MountConfig, ready: &mut Option<std::fs::File>) -> Result<(), String> {
    let fs: Arc<dyn FileSystem> = if cli.master == "memory" {
        Arc::new(MemFs::new())
    } else {
        let opts = ClusterOptions::from_config(&cfg.client)?;
        let cluster = Cluster::connect(opts)
            .map_err(|e| format!("cannot connect to the cluster at {}: {e}", cfg.client.master))?;
        Arc::new(cluster)
    };
    let stop = pfs_fuse::mount::signals::install();
    // The in-memory file system answers lookups in memory: statahead would
    // only add to its cost.
    let cfg = &MountConfig { statahead: cfg.statahead && cli.master != "memory", ..cfg.clone() };
    let mount = pfs_fuse::mount(fs, &cli.mountpoint, cfg)?;
    log::info!("mounted {} on {}", cli.master, cli.mountpoint.display());
    if let Some(mut r) = ready.take() {
        let _ = r.write_all(b"ok\n");
    }
    mount.run(stop)?;
    log::info!("unmounted {}", cli.mountpoint.display());
    Ok(())
}

/// Runs this program again in the foreground, in its own session, and returns
/// once it reports the mount live (exit 0) or fails (its message, exit 1).
fn daemonize(cfg: &MountConfig) -> ExitCode {
    let mut fds = [0i32; 2];
    // SAFETY: a two-element array for pipe2.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return fail(&format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (r, w) = (fds[0], fds[1]);
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail(&format!("cannot find my own binary: {e}")),
    };
    let stderr = match &cfg.log {
        Some(p) => match std::fs::OpenOptions::new().create(true).append(true).open(p) {
            Ok(f) => Stdio::from(f),
            Err(e) => return fail(&format!("log file {}: {e}", p.display())),
        },
        None => Stdio::null(),
    };
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("-f")
        .env(READY_FD_ENV, READY_FD.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(w, READY_FD) < 0 || libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    // SAFETY: `w` is ours; the child has its own copy now.
    unsafe { libc::close(w) };
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail(&format!("cannot start the mount daemon: {e}")),
    };
    // SAFETY: `r` is ours and open.
    let mut rd = unsafe { std::fs::File::from_raw_fd(r) };
    let mut msg = String::new();
    let _ = rd.read_to_string(&mut msg);
    if msg == "ok\n" {
        return ExitCode::SUCCESS;
    }
    let status = child.wait();
    if msg.trim().is_empty() {
        return fail(&format!("the mount daemon exited before mounting ({status:?})"));
    }
    // The daemon already logged it; say it where the user is looking.
    eprintln!("pfs-fuse: {}", msg.trim_end());
    ExitCode::FAILURE
}
