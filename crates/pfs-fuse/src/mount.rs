//! Mount options (`-o a,b=c`), mounting, and the session's life until unmount.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{Config, INodeNo, MountOption, Session, SessionACL, UringConfig};
use pfs_client::api::Invalidation;
use pfs_client::FileSystem;
use pfs_core::config::ConfigFile;
use pfs_core::ClientConfig;

use crate::adapter::{CacheTtl, PfsFuse};

/// Most FUSE threads a mount may ask for.
pub const THREADS_MAX: usize = 256;

/// FUSE threads without `threads=`: one per core, 2 to 64. Each thread sends
/// its request and waits for the reply itself, so this is also the number of
/// requests in flight; more than the applications keep busy only adds
/// wake-ups: the kernel hands each request to the thread that has waited
/// longest, so idle threads take turns and each wakes cold. On two cores, two
/// threads instead of four cut the CPU per md-easy create and remove by a
/// quarter to a third; one sequential reader of a large file, whose kernel
/// read-ahead keeps a request per thread in flight, read a third slower
/// (docs/benchmarks.md, nineteenth session). `threads=N` sets it.
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    cores.clamp(2, 64)
}

/// The kernel's read-ahead of a mount without `read_ahead_kb=`, in KiB.
/// FUSE mounts start at 128 KiB: every sequential reader of the mount then
/// asks for 128 KiB at a time, a round trip each. 4 MiB measured 1.4x on
/// io-hard's 47,008-byte reads, on pfs and on the in-memory file system alike
/// (docs/benchmarks.md); 1 MiB reads gain nothing (the kernel already asks for
/// a whole read at once). The kernel still starts small for a reader it does
/// not see going forward.
pub const READ_AHEAD_KB: u32 = 4096;

/// Largest `read_ahead_kb=`.
pub const READ_AHEAD_KB_MAX: u32 = 1 << 20;

/// Most io_uring threads per kernel queue (`uring_threads=`).
pub const URING_THREADS_MAX: usize = 64;

/// Where the kernel says whether FUSE over io_uring may be used.
pub const ENABLE_URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// `-o uring` without more: two threads per CPU queue, each pinned to its CPU
/// (as libfuse does; pinned measured 5-15% faster here, docs/benchmarks.md),
/// and [`default_bulk_threads`] for large reads.
pub fn uring_default() -> UringConfig {
    UringConfig { threads_per_queue: 2, depth: 1, pin: true, bulk_threads: default_bulk_threads() }
}

/// Bulk threads of `-o uring` without `uring_bulk=`: one per core, at most
/// [`URING_BULK_DEFAULT_MAX`]; none on one core, where they could only run
/// beside the reader they serve. Without them a streaming reader's 1 MiB
/// reads ran 0.63-0.69x /dev/fuse here; with them 0.90-0.96x
/// (docs/benchmarks.md, forty-second session).
pub fn default_bulk_threads() -> usize {
    match std::thread::available_parallelism().map_or(2, |n| n.get()) {
        1 => 0,
        n => n.min(URING_BULK_DEFAULT_MAX),
    }
}

/// Most bulk threads `-o uring` starts on its own (`uring_bulk=` may ask for
/// up to [`URING_THREADS_MAX`]).
pub const URING_BULK_DEFAULT_MAX: usize = 16;

/// Whether this kernel lets FUSE daemons use io_uring (`enable_uring` is `Y`).
pub fn uring_enabled() -> bool {
    std::fs::read_to_string(ENABLE_URING_PARAM).is_ok_and(|s| s.trim() == "Y")
}

/// Everything a mount is configured with.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// The client (master, key, timeouts, write pipeline, dentry cache).
    pub client: ClientConfig,
    /// Kernel entry and attribute cache lifetimes.
    pub ttl: CacheTtl,
    /// Threads reading requests from the kernel.
    pub threads: usize,
    /// Give each thread its own `/dev/fuse` descriptor (less contention).
    pub clone_fd: bool,
    /// The kernel's writeback cache (`-o writeback_cache`, docs/posix.md).
    pub writeback_cache: bool,
    /// Every directory read carries the children's attributes (`-o
    /// readdirplus=always`, the default), or only when the kernel guesses they
    /// will be used (`auto`).
    pub readdirplus_always: bool,
    /// An open keeps the kernel's cached pages of a file whose version shows no
    /// change since they were read or written but this mount's own (`-o
    /// page_cache=keep`, the default), or drops them at every open (`drop`).
    /// Off with the writeback cache.
    pub keep_pages: bool,
    /// A lookup may bring a small file's bytes for the read that follows it
    /// (`-o small_files=lookup`, the default; `read`: every read asks the
    /// server; [`crate::small`]). Off with the writeback cache.
    pub small_by_lookup: bool,
    /// Lookups that follow each other in a directory are answered from
    /// batches of its names' attributes (`-o statahead=on`, the default;
    /// `off`: each goes to the server; [`pfs_client::ahead`]).
    pub statahead: bool,
    /// FUSE over io_uring (`-o uring`, [`uring_default`]): threads per kernel
    /// queue (one queue per CPU) and whether they are pinned to it. Falls back to
    /// /dev/fuse when the kernel does not offer it.
    pub uring: Option<UringConfig>,
    /// The kernel's read-ahead for the mount, in KiB (`-o read_ahead_kb=N`,
    /// default [`READ_AHEAD_KB`]; 0 leaves the kernel's own). Set through the
    /// mount's `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, which needs root.
    pub read_ahead_kb: u32,
    /// Kernel mount flags and access options passed through.
    pub kernel: Vec<MountOption>,
    /// Who may use the mount besides its owner.
    pub acl: SessionACL,
    /// File the background daemon logs to (none: discarded).
    pub log: Option<PathBuf>,
    /// End the process (exit 0) as soon as the kernel reports the unmount, as the
    /// `pfs-fuse` binary does. Otherwise fuser umounts the mountpoint path once more
    /// on its way out, which unmounts a new mount made there in the meantime (a
    /// remount right after `umount`). Off for mounts inside a longer-lived process.
    pub exit_when_unmounted: bool,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            client: ClientConfig::default(),
            ttl: CacheTtl::default(),
            threads: default_threads(),
            clone_fd: true,
            writeback_cache: false,
            readdirplus_always: true,
            keep_pages: true,
            small_by_lookup: true,
            statahead: true,
            uring: None,
            read_ahead_kb: READ_AHEAD_KB,
            kernel: Vec::new(),
            acl: SessionACL::Owner,
            log: None,
            exit_when_unmounted: false,
        }
    }
}

/// The value of a two-way option `name`: `true` for `yes`, `false` for `no`,
/// and an error naming both for anything else.
fn one_of(name: &str, value: &str, yes: &str, no: &str) -> Result<bool, String> {
    match value {
        v if v == yes => Ok(true),
        v if v == no => Ok(false),
        v => Err(format!("mount option {name}={v:?}: expected {yes} or {no}")),
    }
}

/// Options `mount(8)` and fstab use that mean nothing to the file system itself.
const IGNORED: &[&str] =
    &["defaults", "auto", "noauto", "user", "nouser", "users", "_netdev", "nofail", "rw"];

fn seconds(name: &str, v: &str) -> Result<Duration, String> {
    let s: f64 =
        v.parse().map_err(|_| format!("mount option {name}={v:?}: expected seconds, like 1.5"))?;
    if !(0.0..=86_400.0).contains(&s) {
        return Err(format!("mount option {name}={v}: allowed 0 to 86400 seconds"));
    }
    Ok(Duration::from_secs_f64(s))
}

/// The value of numeric option `name`, within `range`; `what` says what a
/// number of it counts (`a number`, `a number of KiB`) in the error.
fn number(
    name: &str,
    v: &str,
    range: std::ops::RangeInclusive<u64>,
    what: &str,
) -> Result<u64, String> {
    let n: u64 = v.parse().map_err(|_| format!("mount option {name}={v:?}: expected {what}"))?;
    if !range.contains(&n) {
        let (lo, hi) = range.into_inner();
        return Err(format!("mount option {name}={n}: allowed {lo} to {hi}"));
    }
    Ok(n)
}

impl MountConfig {
    /// Applies `-o` option lists (comma-separated), after loading `config=FILE` if
    /// one names it; options override the file. An unknown option is an error
    /// that names it.
    pub fn apply_options(&mut self, lists: &[String]) -> Result<(), String> {
        let opts: Vec<&str> = lists
            .iter()
            .flat_map(|l| l.split(','))
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .collect();
        for o in &opts {
            if let Some(path) = o.strip_prefix("config=") {
                self.client = ClientConfig::load(Path::new(path)).map_err(|e| e.to_string())?;
            }
        }
        for o in opts {
            let (name, value) = match o.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (o, None),
            };
            let need =
                || value.ok_or_else(|| format!("mount option {name} needs a value: {name}=..."));
            match name {
                "config" => {}
                "key" => self.client.key_file = need()?.into(),
                "master" => self.client.master = need()?.into(),
                "strict" => self.client.strict = true,
                "timeout" => {
                    self.client.request_timeout_ms =
                        seconds(name, need()?)?.as_millis().max(1) as u64
                }
                "entry_timeout" => self.ttl.entry = seconds(name, need()?)?,
                "negative_timeout" => self.ttl.negative = seconds(name, need()?)?,
                "attr_timeout" => self.ttl.attr = seconds(name, need()?)?,
                "dentry_timeout" => {
                    self.client.dentry_ttl_ms = seconds(name, need()?)?.as_millis() as u64
                }
                "threads" => {
                    let n = number(name, need()?, 1..=THREADS_MAX as u64, "a number")?;
                    self.threads = n as usize;
                }
                "read_ahead_kb" => {
                    let max = u64::from(READ_AHEAD_KB_MAX);
                    self.read_ahead_kb = number(name, need()?, 0..=max, "a number of KiB")? as u32;
                }
                "writeback_cache" => self.writeback_cache = true,
                "nowriteback_cache" => self.writeback_cache = false,
                "readdirplus" => self.readdirplus_always = one_of(name, need()?, "always", "auto")?,
                "page_cache" => self.keep_pages = one_of(name, need()?, "keep", "drop")?,
                "small_files" => self.small_by_lookup = one_of(name, need()?, "lookup", "read")?,
                "statahead" => self.statahead = one_of(name, need()?, "on", "off")?,
                "uring" => {
                    self.uring.get_or_insert_with(uring_default);
                }
                "nouring" => self.uring = None,
                "uring_threads" => {
                    let n = number(name, need()?, 1..=URING_THREADS_MAX as u64, "a number")?;
                    self.uring.get_or_insert_with(uring_default).threads_per_queue = n as usize;
                }
                "uring_bulk" => {
                    let n = number(name, need()?, 0..=URING_THREADS_MAX as u64, "a number")?;
                    self.uring.get_or_insert_with(uring_default).bulk_threads = n as usize;
                }
                "uring_pin" => self.uring.get_or_insert_with(uring_default).pin = true,
                "uring_nopin" => self.uring.get_or_insert_with(uring_default).pin = false,
                "clone_fd" => self.clone_fd = true,
                "noclone_fd" => self.clone_fd = false,
                "log" => self.log = Some(need()?.into()),
                "allow_other" => self.acl = SessionACL::All,
                "allow_root" => self.acl = SessionACL::RootAndOwner,
                "fsname" => self.kernel.push(MountOption::FSName(need()?.into())),
                "subtype" => self.kernel.push(MountOption::Subtype(need()?.into())),
                "ro" => self.kernel.push(MountOption::RO),
                "dev" => self.kernel.push(MountOption::Dev),
                "nodev" => self.kernel.push(MountOption::NoDev),
                "suid" => self.kernel.push(MountOption::Suid),
                "nosuid" => self.kernel.push(MountOption::NoSuid),
                "exec" => self.kernel.push(MountOption::Exec),
                "noexec" => self.kernel.push(MountOption::NoExec),
                "atime" => self.kernel.push(MountOption::Atime),
                "noatime" => self.kernel.push(MountOption::NoAtime),
                "sync" => self.kernel.push(MountOption::Sync),
                "async" => self.kernel.push(MountOption::Async),
                "dirsync" => self.kernel.push(MountOption::DirSync),
                // The kernel always checks permission bits on pfs mounts.
                "default_permissions" => {}
                n if IGNORED.contains(&n) || n.starts_with("x-") || n.starts_with("comment=") => {}
                _ => {
                    return Err(format!(
                        "unknown mount option {o:?} (see pfs-fuse --help for the options pfs knows)"
                    ))
                }
            }
        }
        Ok(())
    }

    fn fuser_config(&self) -> Config {
        let mut c = Config::default();
        c.mount_options = self.kernel.clone();
        if !c.mount_options.iter().any(|o| matches!(o, MountOption::FSName(_))) {
            // The mount source as given, so `mount -a` recognises the mount.
            c.mount_options.push(MountOption::FSName(self.client.master.clone()));
        }
        c.mount_options.push(MountOption::DefaultPermissions);
        c.acl = self.acl;
        c.n_threads = Some(self.threads);
        c.clone_fd = self.clone_fd;
        c.uring = self.uring;
        c
    }
}

/// A live mount: the kernel session, not yet serving.
#[derive(Debug)]
pub struct Mount {
    session: Session<PfsFuse>,
    mountpoint: PathBuf,
    threads: usize,
}

/// Mounts `fs` on `mountpoint`. When this returns the kernel has finished its
/// handshake: the mount is visible. Kernel notifications for other clients'
/// changes are wired to `fs`'s invalidator.
pub fn mount(
    fs: Arc<dyn FileSystem>,
    mountpoint: &Path,
    cfg: &MountConfig,
) -> Result<Mount, String> {
    let meta = std::fs::metadata(mountpoint)
        .map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    if !meta.is_dir() {
        return Err(format!("mount point {} is not a directory", mountpoint.display()));
    }
    let adapter = PfsFuse::new(fs.clone(), cfg.ttl)
        .exit_when_unmounted(cfg.exit_when_unmounted)
        .writeback_cache(cfg.writeback_cache)
        .readdirplus_always(cfg.readdirplus_always)
        .keep_pages(cfg.keep_pages && !cfg.writeback_cache)
        .small_by_lookup(cfg.small_by_lookup && !cfg.writeback_cache)
        .statahead(cfg.statahead);
    let uring_stats = adapter.uring_stats.clone();
    let dir_attrs = adapter.dir_attrs.clone();
    let ahead = adapter.ahead.clone();
    let adapter_notifier = adapter.notifier.clone();
    let session = Session::new(adapter, mountpoint, &cfg.fuser_config())
        .map_err(|e| format!("cannot mount on {}: {e}", mountpoint.display()))?;
    match (cfg.uring, session.uring_stats()) {
        (_, Some(stats)) => {
            log::info!(
                "FUSE over io_uring: {} queues, {} threads",
                stats.queues(),
                stats.threads()
            );
            let _ = uring_stats.set(stats);
        }
        (Some(_), None) => log::warn!(
            "FUSE over io_uring asked for but not in use ({ENABLE_URING_PARAM} is {}): \
             requests go through /dev/fuse",
            if uring_enabled() { "Y, so see the log above" } else { "not Y" }
        ),
        (None, None) => {}
    }
    if cfg.read_ahead_kb > 0 {
        match set_read_ahead(mountpoint, cfg.read_ahead_kb) {
            Ok(path) => log::info!("read-ahead {} KiB ({})", cfg.read_ahead_kb, path.display()),
            Err(e) => log::warn!(
                "cannot set the mount's read-ahead to {} KiB: {e}; the kernel's stays \
                 (sequential reads ask for less at a time)",
                cfg.read_ahead_kb
            ),
        }
    }
    let notifier = session.notifier();
    let _ = adapter_notifier.set(notifier.clone());
    fs.set_invalidator(Box::new(move |inv| {
        // ENOENT means the kernel holds nothing to drop: fine.
        let r = match inv {
            Invalidation::Entry { parent, name } => {
                dir_attrs.forget(parent.0);
                ahead.forget_name(parent.0, &name);
                notifier.inval_entry(INodeNo(parent.0), OsStr::from_bytes(&name))
            }
            Invalidation::Inode { ino } => {
                dir_attrs.forget(ino.0);
                ahead.forget_dir(ino.0);
                notifier.inval_inode(INodeNo(ino.0), 0, 0)
            }
        };
        if let Err(e) = r {
            log::debug!("kernel invalidation: {e}");
        }
    }));
    Ok(Mount { session, mountpoint: mountpoint.to_path_buf(), threads: cfg.threads })
}

impl Mount {
    /// The io_uring counters, when requests come over FUSE-over-io_uring queues
    /// (`-o uring` and a kernel that offers them); they count on after `run`.
    pub fn uring_stats(&self) -> Option<Arc<fuser::UringStats>> {
        self.session.uring_stats()
    }

    /// How kernel requests reach the file system, for the operator:
    /// `io_uring (2 queues x 2 threads, 2 bulk threads)` or `/dev/fuse (4 threads)`.
    pub fn transport(&self) -> String {
        match self.uring_stats() {
            Some(u) => format!(
                "io_uring ({} queues x {} threads, {} bulk threads)",
                u.queues(),
                u.threads() / u.queues().max(1),
                u.bulk_threads()
            ),
            None => format!("/dev/fuse ({} threads)", self.threads),
        }
    }

    /// Serves kernel requests until the file system is unmounted (`umount`, or
    /// `stop` becoming true, which unmounts it).
    pub fn run(mut self, stop: Arc<AtomicBool>) -> Result<(), String> {
        let mut unmounter = self.session.unmount_callable();
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (done, mountpoint) = (done.clone(), self.mountpoint.clone());
            std::thread::Builder::new()
                .name("pfs-unmount".into())
                .spawn(move || {
                    while !done.load(Ordering::Acquire) {
                        if stop.load(Ordering::Acquire) {
                            log::info!("unmounting {}", mountpoint.display());
                            if let Err(e) = unmounter.unmount() {
                                // Busy (open files, a shell inside): detach now, the
                                // kernel finishes when the last user leaves.
                                log::warn!(
                                    "umount {}: {e}; detaching lazily",
                                    mountpoint.display()
                                );
                                lazy_unmount(&mountpoint);
                            }
                            return;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
                .map_err(|e| format!("cannot start the unmount thread: {e}"))?
        };
        let r = self.session.run();
        done.store(true, Ordering::Release);
        let _ = watcher.join();
        r.map_err(|e| format!("FUSE session on {}: {e}", self.mountpoint.display()))
    }
}

/// Sets the kernel's read-ahead of the FUSE mount on `mountpoint` to `kib`
/// KiB: writes `/sys/class/bdi/MAJOR:MINOR/read_ahead_kb`, the device number
/// taken from `/proc/self/mountinfo` (a `stat` of the mount point would ask
/// the file system, which does not serve yet). Returns the file written.
pub fn set_read_ahead(mountpoint: &Path, kib: u32) -> Result<PathBuf, String> {
    let path = std::fs::canonicalize(mountpoint)
        .map_err(|e| format!("mount point {}: {e}", mountpoint.display()))?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let dev = fuse_mount_device(&info, path.as_os_str().as_bytes())
        .ok_or_else(|| format!("no FUSE mount on {} in /proc/self/mountinfo", path.display()))?;
    let file = PathBuf::from(format!("/sys/class/bdi/{dev}/read_ahead_kb"));
    std::fs::write(&file, format!("{kib}\n")).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(file)
}

/// The device number (`MAJOR:MINOR`) of the last FUSE mount on `path` in a
/// `/proc/self/mountinfo` text (mounts stack: the last one is on top).
fn fuse_mount_device(mountinfo: &str, path: &[u8]) -> Option<String> {
    mountinfo.lines().rev().find_map(|line| {
        // ID PARENT MAJOR:MINOR ROOT MOUNTPOINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER
        let mut f = line.split(' ');
        let dev = f.nth(2)?;
        let point = unescape_mountinfo(f.nth(1)?);
        let (_, after) = line.split_once(" - ")?;
        let fstype = after.split(' ').next()?;
        let fuse = fstype == "fuse" || fstype.starts_with("fuse.");
        (fuse && point == path).then(|| dev.to_string())
    })
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| d.iter().try_fold(0u8, |v, c| v.checked_mul(8)?.checked_add(c - b'0')));
        match (b[i], octal) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// `umount -l`: detaches the mount even if it is busy.
pub fn lazy_unmount(mountpoint: &Path) {
    let Ok(c) = std::ffi::CString::new(mountpoint.as_os_str().as_bytes()) else { return };
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        log::warn!("umount -l {}: {}", mountpoint.display(), std::io::Error::last_os_error());
    }
}

/// SIGTERM, SIGINT and SIGHUP set one flag; the mount watches it.
pub mod signals {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::sync::OnceLock;

    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

    extern "C" fn on_signal(_: libc::c_int) {
        // Only an atomic store: async-signal-safe.
        if let Some(f) = FLAG.get() {
            f.store(true, Ordering::SeqCst);
        }
    }

    /// Installs the handlers and returns the flag they set.
    pub fn install() -> Arc<AtomicBool> {
        let flag = FLAG.get_or_init(|| Arc::new(AtomicBool::new(false))).clone();
        let handler: extern "C" fn(libc::c_int) = on_signal;
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            // SAFETY: the handler only does an atomic load and store; sigaction gets
            // a zeroed, then filled, struct.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as usize;
                libc::sigemptyset(&mut sa.sa_mask);
                sa.sa_flags = libc::SA_RESTART;
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
        flag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(opts: &str) -> Result<MountConfig, String> {
        let mut c = MountConfig::default();
        c.apply_options(&[opts.to_string()]).map(|()| c)
    }

    #[test]
    fn uring_is_opt_in_and_its_options_imply_it() {
        assert_eq!(with("allow_other").unwrap().uring, None);
        assert_eq!(with("uring").unwrap().uring, Some(uring_default()));
        assert!(uring_default().pin);
        let c = with("uring_threads=3,uring_nopin").unwrap().uring.unwrap();
        assert_eq!((c.threads_per_queue, c.pin, c.depth), (3, false, 1));
        assert_eq!(c.bulk_threads, default_bulk_threads());
        assert_eq!(with("uring_bulk=0").unwrap().uring.unwrap().bulk_threads, 0);
        assert_eq!(with("uring_bulk=5").unwrap().uring.unwrap().bulk_threads, 5);
        for bad in ["uring_bulk=65", "uring_bulk=many", "uring_bulk"] {
            assert!(with(bad).is_err(), "{bad} was accepted");
        }
        assert_eq!(with("uring,nouring").unwrap().uring, None);
        assert_eq!(with("uring").unwrap().fuser_config().uring, Some(uring_default()));
    }

    #[test]
    fn readdirplus_is_always_unless_asked_for_auto() {
        assert!(MountConfig::default().readdirplus_always);
        assert!(!with("readdirplus=auto").unwrap().readdirplus_always);
        assert!(with("readdirplus=auto,readdirplus=always").unwrap().readdirplus_always);
        for bad in ["readdirplus=sometimes", "readdirplus"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("readdirplus"), "{bad}: {e}");
        }
    }

    #[test]
    fn pages_are_kept_unless_asked_to_drop() {
        assert!(MountConfig::default().statahead);
        assert!(!with("statahead=off").unwrap().statahead);
        assert!(with("statahead=off,statahead=on").unwrap().statahead);
        for bad in ["statahead=yes", "statahead"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("statahead"), "{bad}: {e}");
        }
        assert!(MountConfig::default().small_by_lookup);
        assert!(!with("small_files=read").unwrap().small_by_lookup);
        let e = with("small_files=never").unwrap_err();
        assert!(e.contains("small_files"), "{e}");
        assert!(MountConfig::default().keep_pages);
        assert!(!with("page_cache=drop").unwrap().keep_pages);
        assert!(with("page_cache=drop,page_cache=keep").unwrap().keep_pages);
        for bad in ["page_cache=always", "page_cache"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("page_cache"), "{bad}: {e}");
        }
    }

    #[test]
    fn read_ahead_defaults_to_4_mib_and_refuses_bad_values_by_name() {
        assert_eq!(MountConfig::default().read_ahead_kb, READ_AHEAD_KB);
        assert_eq!(with("read_ahead_kb=0").unwrap().read_ahead_kb, 0);
        assert_eq!(with("read_ahead_kb=1024").unwrap().read_ahead_kb, 1024);
        for bad in
            ["read_ahead_kb=-1", "read_ahead_kb=4M", "read_ahead_kb=1048577", "read_ahead_kb"]
        {
            let e = with(bad).unwrap_err();
            assert!(e.contains("read_ahead_kb"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_device_of_the_top_fuse_mount_on_a_path_is_found_in_mountinfo() {
        let info = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:39 / /mnt/a\\040b rw,nosuid - fuse 127.0.0.1:7000 rw,user_id=0
41 22 0:40 / /mnt/pfs rw - fuse.pfs-fuse 127.0.0.1:7000 rw
42 41 0:41 / /mnt/pfs rw - fuse.pfs-fuse memory rw
43 22 0:42 / /mnt/tmp rw - tmpfs tmpfs rw
";
        assert_eq!(fuse_mount_device(info, b"/mnt/a b").as_deref(), Some("0:39"));
        assert_eq!(fuse_mount_device(info, b"/mnt/pfs").as_deref(), Some("0:41"), "the top one");
        assert_eq!(fuse_mount_device(info, b"/mnt/tmp"), None, "not FUSE");
        assert_eq!(fuse_mount_device(info, b"/"), None);
        assert_eq!(fuse_mount_device(info, b"/mnt"), None);
        assert_eq!(unescape_mountinfo("a\\011b\\134c\\9x\\777"), b"a\tb\\c\\9x\\777");
    }

    #[test]
    fn bad_uring_threads_are_refused_by_name() {
        for bad in ["uring_threads=0", "uring_threads=65", "uring_threads=many", "uring_threads"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("uring_threads"), "{bad}: {e}");
        }
    }
}
