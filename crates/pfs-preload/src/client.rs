//! The library's configuration (read once, from the environment) and its one
//! [`Cluster`] client, connected at the first pfs call and again, lazily, in a
//! child after `fork`.

use std::cell::Cell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use libc::c_int;
use pfs_client::{Cluster, ClusterOptions};
use pfs_core::{ClientConfig, ConfigFile, FsError};

use crate::paths::{lossy, Mount};

/// An errno value.
pub type Errno = i32;
/// What the library's operations return: a value or the errno of the failure.
pub type Res<T> = Result<T, Errno>;

/// After a failed connect, calls fail at once for this long before the next try.
const RECONNECT_AFTER: Duration = Duration::from_secs(5);
/// `st_dev` of pfs files when `PFS_MOUNT` is not also a directory here.
const DEV_DEFAULT: u64 = 0x7066_7300;

/// What the environment configured.
#[derive(Debug)]
pub struct Config {
    /// `PFS_MOUNT`.
    pub mount: Mount,
    /// How to connect, or why the environment does not say.
    pub opts: Result<ClusterOptions, String>,
    /// `st_dev` of every pfs file: the mount point's when it is a directory
    /// here (a FUSE mount of the same cluster), so both agree.
    pub dev: u64,
}

static CONFIG: OnceLock<Option<Config>> = OnceLock::new();

/// The configuration; `None` when `PFS_MOUNT` is not set or not usable (then
/// the library passes every call to libc).
pub fn config() -> Option<&'static Config> {
    CONFIG.get_or_init(|| with_busy(load)).as_ref()
}

fn load() -> Option<Config> {
    let dir = std::env::var_os("PFS_MOUNT")?;
    let mount = match Mount::new(dir.as_bytes()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("libpfs_preload: {e}; pfs paths are off");
            return None;
        }
    };
    let dev = std::fs::metadata(OsStr::from_bytes(mount.prefix()))
        .map(|m| m.dev())
        .unwrap_or(DEV_DEFAULT);
    Some(Config { mount, opts: options(), dev })
}

/// Client options: `PFS_CONFIG`'s `[client]`-style file if set, else the
/// defaults; then `PFS_MASTER` and `PFS_KEY` override the master and key file.
fn options() -> Result<ClusterOptions, String> {
    let mut cfg = match std::env::var_os("PFS_CONFIG") {
        Some(p) => ClientConfig::load(&PathBuf::from(p)).map_err(|e| e.to_string())?,
        None => ClientConfig::default(),
    };
    if let Some(m) = std::env::var_os("PFS_MASTER") {
        cfg.master = m.to_string_lossy().into_owned();
    }
    if let Some(k) = std::env::var_os("PFS_KEY") {
        cfg.key_file = PathBuf::from(k);
    }
    cfg.validate().map_err(|e| e.to_string())?;
    ClusterOptions::from_config(&cfg)
}

/// The client and what a failed connect left.
struct Slot {
    cluster: Option<Arc<Cluster>>,
    failed_at: Option<Instant>,
}

static SLOT: Mutex<Slot> = Mutex::new(Slot { cluster: None, failed_at: None });
/// Bumped in a child after `fork`: handles opened before belong to the
/// parent's client and are opened again through the child's.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static WARNED: AtomicBool = AtomicBool::new(false);

/// The generation of the client handles are valid in.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// The client [`SLOT`] holds, for calls that need no lock: set when it
/// connects, cleared in a child after `fork`. The client it points to is
/// never dropped (a process keeps its client until it exits; a child after
/// `fork` forgets its parent's without dropping it), so the pointer stays valid.
static CURRENT: AtomicPtr<Cluster> = AtomicPtr::new(std::ptr::null_mut());

/// The connected client (connecting now if needed) and its generation.
pub fn cluster() -> Res<(&'static Cluster, u64)> {
    let current = CURRENT.load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: set from an `Arc` that `SLOT` keeps and nothing drops
        // (`CURRENT`'s docs).
        return Ok((unsafe { &*current }, generation()));
    }
    let cfg = config().ok_or(libc::EIO)?;
    let mut slot = SLOT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = &slot.cluster {
        // SAFETY: as above: `SLOT`'s client lives as long as the process.
        return Ok((unsafe { &*Arc::as_ptr(c) }, generation()));
    }
    if slot.failed_at.is_some_and(|t| t.elapsed() < RECONNECT_AFTER) {
        return Err(libc::EIO);
    }
    let connected = match &cfg.opts {
        Ok(o) => Cluster::connect(o.clone()).map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    match connected {
        Ok(c) => {
            let c = Arc::new(c);
            let ptr = Arc::as_ptr(&c);
            slot.cluster = Some(c);
            slot.failed_at = None;
            CURRENT.store(ptr.cast_mut(), Ordering::Release);
            // SAFETY: `SLOT` now keeps it for the life of the process.
            Ok((unsafe { &*ptr }, generation()))
        }
        Err(e) => {
            if !WARNED.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "libpfs_preload: cannot reach the pfs cluster for {}: {e}; calls under it fail with EIO",
                    lossy(cfg.mount.prefix())
                );
            }
            slot.failed_at = Some(Instant::now());
            Err(libc::EIO)
        }
    }
}

/// The client if one is connected, without connecting.
pub fn connected() -> Option<(&'static Cluster, u64)> {
    let current = CURRENT.load(Ordering::Acquire);
    // SAFETY: `CURRENT`'s client is never dropped (its docs).
    (!current.is_null()).then(|| (unsafe { &*current }, generation()))
}

/// Holds the client's lock across `fork` (see [`crate::fork`]).
pub struct ForkHold(MutexGuard<'static, Slot>);

impl std::fmt::Debug for ForkHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ForkHold")
    }
}

/// Before `fork`: no other thread may be connecting.
pub fn hold_for_fork() -> ForkHold {
    ForkHold(SLOT.lock().unwrap_or_else(|p| p.into_inner()))
}

impl ForkHold {
    /// In the child: the parent's client is left alone (its threads did not
    /// come along, and its connections are the parent's); the next pfs call
    /// connects anew.
    pub fn forget_in_child(mut self) {
        CURRENT.store(std::ptr::null_mut(), Ordering::Release);
        if let Some(c) = self.0.cluster.take() {
            std::mem::forget(c);
        }
        self.0.failed_at = None;
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The errno an application sees for `e`, the mount's (`pfs-fuse`): a timed
/// out request is `EIO`.
pub fn errno(e: FsError) -> Errno {
    match e {
        FsError::TimedOut => libc::EIO,
        other => other.errno(),
    }
}

thread_local! {
    /// Set while this thread runs library code: calls it makes into libc (the
    /// key file, shared memory, sockets) go straight through.
    static BUSY: Cell<bool> = const { Cell::new(false) };
    /// A signal this thread is owed once it leaves the library
    /// ([`raise_when_done`]); 0: none.
    static OWED: Cell<c_int> = const { Cell::new(0) };
}

/// Sends signal `sig` to this thread as the kernel would at the end of the
/// call (`SIGXFSZ` for a write past the file size limit): once the outermost
/// [`with_busy`] returns, so that a handler's own pfs calls are the library's.
pub fn raise_when_done(sig: c_int) {
    if busy() {
        OWED.with(|o| o.set(sig));
    } else {
        // SAFETY: raises a signal in the calling thread.
        unsafe { libc::raise(sig) };
    }
}

/// Whether this thread is inside the library already.
pub fn busy() -> bool {
    BUSY.with(|b| b.get())
}

/// Runs `f` with this thread marked busy.
pub fn with_busy<T>(f: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            BUSY.with(|b| b.set(self.0));
            if !self.0 {
                let sig = OWED.with(|o| o.replace(0));
                if sig != 0 {
                    // SAFETY: raises a signal in the calling thread.
                    unsafe { libc::raise(sig) };
                }
            }
        }
    }
    let _reset = Reset(BUSY.with(|b| b.replace(true)));
    f()
}
