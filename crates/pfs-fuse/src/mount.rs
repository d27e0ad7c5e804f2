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

/// FUSE threads without `threads=`: two per core, 4 to 64. Each thread sends
/// its request and waits for the reply itself, so this is also the number of
/// requests in flight; more than the applications keep busy only adds
/// wake-ups (docs/benchmarks.md).
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores * 2).clamp(4, 64)
}

/// Most io_uring threads per kernel queue (`uring_threads=`).
pub const URING_THREADS_MAX: usize = 64;

/// Where the kernel says whether FUSE over io_uring may be used.
pub const ENABLE_URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// `-o uring` without more: two threads per CPU queue, each pinned to its CPU
/// (as libfuse does; pinned measured 5-15% faster here, docs/benchmarks.md).
pub fn uring_default() -> UringConfig {
    UringConfig { threads_per_queue: 2, depth: 1, pin: true }
}

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
    /// FUSE over io_uring (`-o uring`, [`uring_default`]): threads per kernel
    /// queue (one queue per CPU) and whether they are pinned to it. Falls back to
    /// /dev/fuse when the kernel does not offer it.
    pub uring: Option<UringConfig>,
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
            uring: None,
            kernel: Vec::new(),
            acl: SessionACL::Owner,
            log: None,
            exit_when_unmounted: false,
        }
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
                    let v = need()?;
                    let n: usize = v
                        .parse()
                        .map_err(|_| format!("mount option threads={v:?}: expected a number"))?;
                    if !(1..=THREADS_MAX).contains(&n) {
                        return Err(format!(
                            "mount option threads={n}: allowed 1 to {THREADS_MAX}"
                        ));
                    }
                    self.threads = n;
                }
                "writeback_cache" => self.writeback_cache = true,
                "nowriteback_cache" => self.writeback_cache = false,
                "readdirplus" => {
                    self.readdirplus_always = match need()? {
                        "always" => true,
                        "auto" => false,
                        v => {
                            return Err(format!(
                                "mount option readdirplus={v:?}: expected always or auto"
                            ))
                        }
                    }
                }
                "page_cache" => {
                    self.keep_pages = match need()? {
                        "keep" => true,
                        "drop" => false,
                        v => {
                            return Err(format!(
                                "mount option page_cache={v:?}: expected keep or drop"
                            ))
                        }
                    }
                }
                "uring" => {
                    self.uring.get_or_insert_with(uring_default);
                }
                "nouring" => self.uring = None,
                "uring_threads" => {
                    let v = need()?;
                    let n: usize = v.parse().map_err(|_| {
                        format!("mount option uring_threads={v:?}: expected a number")
                    })?;
                    if !(1..=URING_THREADS_MAX).contains(&n) {
                        return Err(format!(
                            "mount option uring_threads={n}: allowed 1 to {URING_THREADS_MAX}"
                        ));
                    }
                    self.uring.get_or_insert_with(uring_default).threads_per_queue = n;
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
        .keep_pages(cfg.keep_pages && !cfg.writeback_cache);
    let uring_stats = adapter.uring_stats.clone();
    let dir_attrs = adapter.dir_attrs.clone();
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
    let notifier = session.notifier();
    fs.set_invalidator(Box::new(move |inv| {
        // ENOENT means the kernel holds nothing to drop: fine.
        let r = match inv {
            Invalidation::Entry { parent, name } => {
                dir_attrs.forget(parent.0);
                notifier.inval_entry(INodeNo(parent.0), OsStr::from_bytes(&name))
            }
            Invalidation::Inode { ino } => {
                dir_attrs.forget(ino.0);
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
    /// `io_uring (2 queues x 2 threads)` or `/dev/fuse (4 threads)`.
    pub fn transport(&self) -> String {
        match self.uring_stats() {
            Some(u) => format!(
                "io_uring ({} queues x {} threads)",
                u.queues(),
                u.threads() / u.queues().max(1)
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
        assert!(MountConfig::default().keep_pages);
        assert!(!with("page_cache=drop").unwrap().keep_pages);
        assert!(with("page_cache=drop,page_cache=keep").unwrap().keep_pages);
        for bad in ["page_cache=always", "page_cache"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("page_cache"), "{bad}: {e}");
        }
    }

    #[test]
    fn bad_uring_threads_are_refused_by_name() {
        for bad in ["uring_threads=0", "uring_threads=65", "uring_threads=many", "uring_threads"] {
            let e = with(bad).unwrap_err();
            assert!(e.contains("uring_threads"), "{bad}: {e}");
        }
    }
}
