//! What the client caches and the tokens it caches under (docs/cluster.md,
//! "Dentry cache and tokens"): layouts of inodes, names of directories under a
//! read token on their parent, and the thread that applies the invalidations
//! servers send when another client takes a write token.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_core::hash::NumMap;
use pfs_core::wire::{InodeLayout, Reply, Request, TokenMode};
use pfs_core::{DirLayout, FsResult, InodeId, ServerId, WorkerId};

use super::placement::Placement;
use super::Cluster;
use crate::api::{Invalidation, Invalidator};
use crate::conn::Conn;
use crate::dcache::DentryCache;

/// Most layouts remembered; past it the table is cleared and refilled on demand.
const LAYOUT_CACHE_MAX: usize = 1 << 16;
/// How long a cached layout is used: after another client changes a
/// directory's layout (allowed while it is empty), this client routes names
/// in it by the old one for at most this long. (It kept them until the cache
/// filled up, and a name it then created on a shard the new layout does not
/// look at could not be found by anyone.)
pub(crate) const LAYOUT_TTL: Duration = Duration::from_secs(1);
/// Most read tokens remembered; past it the expired ones are dropped.
const READ_TOKENS_MAX: usize = 1 << 16;
/// How often the client looks for invalidations servers sent while it holds
/// no read token (none can come then but those of leases it let run out).
const NOTIFY_POLL: Duration = Duration::from_millis(50);
/// How often it looks while it holds read tokens: a writer waits for this
/// client's acknowledgment before it changes a name (`tokens.rs`), so this
/// bounds how long a rename or rmdir waits for each client caching names in
/// its directory.
const NOTIFY_POLL_HOLDING: Duration = Duration::from_millis(2);
/// Acknowledgments of revoked tokens waiting to be sent, at most; past it the
/// writer waits out its bound (`ACK_WAIT_MAX` in pfs-server's `tokens.rs`).
const ACKS_MAX: usize = 4096;
/// Most files remembered as just found by a lookup (an open takes each; one
/// looked up and never opened stays until the table is cleared when full).
const LOOKED_UP_MAX: usize = 4096;

/// What the notification thread shares with the client: the dentry cache, the
/// read tokens it lives under, and the kernel's invalidation callback.
pub(crate) struct Caches {
    pub dcache: Mutex<DentryCache>,
    /// Read tokens held: directory -> lease expiry.
    read_tokens: Mutex<NumMap<InodeId, Instant>>,
    /// For each server (by index) where this client took read tokens, the
    /// latest expiry among them: the connections to poll often.
    tokens_until: Mutex<std::collections::BTreeMap<usize, Instant>>,
    invalidator: Mutex<Option<Invalidator>>,
    /// Layouts of inodes, each with the end of its use (`LAYOUT_TTL`).
    layouts: Mutex<NumMap<InodeId, (InodeLayout, Instant)>>,
    /// Files a lookup found at their home, with when, until an open takes
    /// them ([`Caches::take_lookup_within`]); cleared when full.
    looked_up: Mutex<NumMap<InodeId, Instant>>,
    /// Revocations applied so far, of any directory.
    revocations: AtomicU64,
    /// Held while invalidations are taken off the connections and applied, so
    /// one who checks `revocations` under it sees all or none of a batch.
    applying: Mutex<()>,
    /// Test seam: runs after each lookup reply, before its name may be cached.
    lookup_hook: Mutex<Option<LookupHook>>,
    /// Directories whose revoked read token is to be given back once their
    /// names are dropped here and in the kernel (the writer waits for it),
    /// with the names to tell the kernel first.
    acks: Mutex<Vec<(InodeId, Vec<Vec<u8>>)>>,
}

/// What [`Cluster::set_lookup_hook`] installs.
pub type LookupHook = Box<dyn Fn(InodeId, &[u8]) + Send + Sync>;

impl Caches {
    /// Empty caches holding at most `dentries` directory names.
    pub fn new(dentries: usize) -> Caches {
        Caches {
            dcache: Mutex::new(DentryCache::new(dentries)),
            read_tokens: Mutex::new(NumMap::default()),
            tokens_until: Mutex::new(std::collections::BTreeMap::new()),
            invalidator: Mutex::new(None),
            layouts: Mutex::new(NumMap::default()),
            looked_up: Mutex::new(NumMap::default()),
            revocations: AtomicU64::new(0),
            applying: Mutex::new(()),
            lookup_hook: Mutex::new(None),
            acks: Mutex::new(Vec::new()),
        }
    }

    /// Tells the kernel (the invalidation callback) the names of each
    /// directory whose token was revoked, then returns those directories:
    /// their tokens are to be given back. Run by the notification thread
    /// only: a request thread that told the kernel could wait for ever (the
    /// kernel drops a name under its directory's lock, which a `LOOKUP` in
    /// that directory, served by that very thread, holds).
    fn tell_kernel(&self) -> Vec<InodeId> {
        let revoked = std::mem::take(&mut *self.acks.lock().expect("acks lock"));
        let inv = self.invalidator.lock().expect("invalidator lock");
        revoked
            .into_iter()
            .map(|(dir, names)| {
                if let Some(inv) = inv.as_ref() {
                    for name in names {
                        inv(Invalidation::Entry { parent: dir, name });
                    }
                    inv(Invalidation::Inode { ino: dir });
                }
                dir
            })
            .collect()
    }

    /// The servers (by index) where this client holds a read token at `now`:
    /// invalidations may come from them, and a writer there waits for them.
    fn holding_at(&self, now: Instant) -> Vec<usize> {
        let mut until = self.tokens_until.lock().expect("token lock");
        until.retain(|_, e| *e > now);
        until.keys().copied().collect()
    }

    /// Revocations applied so far (a mark for [`Cluster::unrevoked_since`]).
    pub fn revocations(&self) -> u64 {
        self.revocations.load(Ordering::Acquire)
    }

    /// Takes the invalidations that arrived on `conns` and applies them;
    /// returns the revocations applied so far, counted with them.
    pub fn apply_invalidations(&self, conns: &[Conn]) -> u64 {
        self.apply_invalidations_from(conns, 0..conns.len())
    }

    /// [`apply_invalidations`](Self::apply_invalidations) of the connections
    /// to servers `servers` (indexes into `conns`) only.
    fn apply_invalidations_from(
        &self,
        conns: &[Conn],
        servers: impl IntoIterator<Item = usize>,
    ) -> u64 {
        let _applying = self.applying.lock().expect("invalidation lock");
        for s in servers {
            for dir in conns[s].take_invalidations() {
                self.revoke(dir);
            }
        }
        self.revocations()
    }

    /// Where invalidations go (the kernel, for a FUSE mount).
    pub fn set_invalidator(&self, invalidator: Invalidator) {
        *self.invalidator.lock().expect("invalidator lock") = Some(invalidator);
    }

    /// A server revoked the read token on `dir`: drop what it covered here;
    /// the notification thread tells the kernel and gives the token back
    /// ([`Caches::tell_kernel`]).
    pub fn revoke(&self, dir: InodeId) {
        self.revocations.fetch_add(1, Ordering::AcqRel);
        self.read_tokens.lock().expect("token lock").remove(&dir);
        let mut names = self.dcache.lock().expect("dcache lock").take_dir(dir);
        let mut acks = self.acks.lock().expect("acks lock");
        if let Some((_, told)) = acks.iter_mut().find(|(d, _)| *d == dir) {
            told.append(&mut names);
        } else if acks.len() < ACKS_MAX {
            acks.push((dir, names));
        }
        // Past the bound the writer waits out its limit, and the kernel's
        // names run out by themselves.
    }

    /// The read token on `dir`, if held and not expired at `now`.
    pub fn read_token(&self, dir: InodeId, now: Instant) -> Option<Instant> {
        self.read_tokens.lock().expect("token lock").get(&dir).copied().filter(|&e| e > now)
    }

    /// Remembers a read token on `dir`, granted by server `server` (its
    /// index), until `expires`.
    pub fn hold_read_token(&self, dir: InodeId, server: usize, expires: Instant, now: Instant) {
        let mut t = self.read_tokens.lock().expect("token lock");
        if t.len() >= READ_TOKENS_MAX {
            t.retain(|_, e| *e > now);
        }
        t.insert(dir, expires);
        let mut until = self.tokens_until.lock().expect("token lock");
        let e = until.entry(server).or_insert(expires);
        *e = (*e).max(expires);
    }

    /// The cached layouts of `ino`.
    pub fn layout(&self, ino: InodeId) -> Option<InodeLayout> {
        self.layout_at(ino, Instant::now())
    }

    /// [`layout`](Self::layout) at `now`: `None` once its use ran out.
    fn layout_at(&self, ino: InodeId, now: Instant) -> Option<InodeLayout> {
        let m = self.layouts.lock().expect("layout cache lock");
        m.get(&ino).filter(|(_, until)| now < *until).map(|(l, _)| *l)
    }

    /// Notes that a lookup just found file `ino` at its home.
    pub fn found_by_lookup(&self, ino: InodeId) {
        let mut m = self.looked_up.lock().expect("lookup table lock");
        if m.len() >= LOOKED_UP_MAX {
            m.clear();
        }
        m.insert(ino, Instant::now());
    }

    /// Whether a lookup found `ino` at its home less than `within` ago and
    /// no open took that since: the first open after a lookup takes it.
    pub fn take_lookup_within(&self, ino: InodeId, within: Duration) -> bool {
        let found = self.looked_up.lock().expect("lookup table lock").remove(&ino);
        found.is_some_and(|at| at.elapsed() < within)
    }

    /// Caches the layouts of `ino`, for [`LAYOUT_TTL`].
    pub fn remember_layout(&self, ino: InodeId, layout: InodeLayout) {
        self.remember_layout_at(ino, layout, Instant::now())
    }

    fn remember_layout_at(&self, ino: InodeId, layout: InodeLayout, now: Instant) {
        let mut m = self.layouts.lock().expect("layout cache lock");
        if m.len() >= LAYOUT_CACHE_MAX {
            m.clear();
        }
        m.insert(ino, (layout, now + LAYOUT_TTL));
    }

    /// Drops the cached layouts of `ino` (they changed, or the name moved).
    pub fn forget_layout(&self, ino: InodeId) {
        self.layouts.lock().expect("layout cache lock").remove(&ino);
    }

    /// Forgets directory `ino`, which a server said was removed: the names
    /// that lead to it, the names in it and its layout.
    pub fn forget_removed_dir(&self, ino: InodeId) {
        let mut dcache = self.dcache.lock().expect("dcache lock");
        dcache.invalidate_ino(ino);
        dcache.invalidate_dir(ino);
        drop(dcache);
        self.forget_layout(ino);
    }
}

/// The notification thread: applies the servers' invalidations until `stop`,
/// and gives each revoked token back to the directory's home (`placement`)
/// once its names are dropped, within `timeout`: the writer that revoked it
/// waits for that.
pub(crate) fn notification_loop(
    conns: Arc<Vec<Conn>>,
    caches: Arc<Caches>,
    locks: &super::locks::LockHomes,
    stop: Arc<AtomicBool>,
    placement: Placement,
    timeout: Duration,
) {
    let mut full_at = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        let holding = caches.holding_at(now);
        // Every connection now and then; in between, those of the servers
        // where this client holds read tokens, where a writer waits for it.
        let full = now >= full_at;
        if full {
            full_at = now + NOTIFY_POLL;
            let _ = caches.apply_invalidations(&conns);
        } else {
            let _ = caches.apply_invalidations_from(&conns, holding.iter().copied());
        }
        for dir in caches.tell_kernel() {
            let (server, worker) = placement.home(dir);
            let release = Request::TokenRelease { dir, mode: TokenMode::Read };
            if let Err(e) = conns[server.0 as usize].call(release, worker.0 as u16, timeout) {
                log::debug!("revoked token on {dir} not given back ({e}); its lease runs out");
            }
        }
        if locks.any() {
            locks.renew_due(&conns, &placement, now, timeout);
        }
        if full {
            // A server that died is noticed here, within a poll, rather than
            // by the first request sent into its dead link after it came back
            // (a change there would fail with EIO, its fate unknown).
            for c in conns.iter() {
                c.check_peer();
            }
        }
        let next = if holding.is_empty() { full_at } else { now + NOTIFY_POLL_HOLDING };
        std::thread::sleep(next.min(full_at).saturating_duration_since(Instant::now()));
    }
}

/// A held write token, given back when dropped.
pub(crate) struct WriteToken<'a> {
    client: &'a Cluster,
    dir: Option<InodeId>,
}

impl Drop for WriteToken<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.dir {
            // Dropping this own client's cached names of `dir` too: they may
            // have just changed.
            self.client.caches.dcache.lock().expect("dcache lock").invalidate_dir(dir);
            let release = Request::TokenRelease { dir, mode: TokenMode::Write };
            if let Err(e) = self.client.call_home(dir, release) {
                log::debug!("write token on {dir} not released ({e}); it expires by itself");
            }
        }
    }
}

/// The cluster's rename lock (`TokenMode::Rename`), given back when dropped.
pub(crate) struct RenameLock<'a> {
    client: &'a Cluster,
}

impl Drop for RenameLock<'_> {
    fn drop(&mut self) {
        let release = Request::TokenRelease { dir: InodeId::ROOT, mode: TokenMode::Rename };
        if let Err(e) = self.client.call_home(InodeId::ROOT, release) {
            log::warn!("the rename lock was not given back ({e}); its lease runs out by itself");
        }
    }
}

/// Holds on a directory on the shards of its entries (`TokenMode::Hold`),
/// given back when dropped.
pub(crate) struct DirHold<'a> {
    client: &'a Cluster,
    dir: InodeId,
    shards: Vec<(ServerId, WorkerId)>,
    /// How each shard is released: `Hold`, `Gone` once a rename replaced the
    /// directory, `Relaid*` once its layout changed (each shard is told so).
    pub(crate) release: TokenMode,
}

impl Drop for DirHold<'_> {
    fn drop(&mut self) {
        let mode = self.release;
        for &(s, w) in &self.shards {
            let release = Request::TokenRelease { dir: self.dir, mode };
            if let Err(e) = self.client.call_to(s, w, release) {
                log::debug!("hold on {} not given back ({e}); it runs out by itself", self.dir);
            }
        }
    }
}

impl Cluster {
    /// Holds directory `dir` on every shard that may have its entries: each
    /// grants it only while it has none (`NotEmpty` otherwise), and lets no
    /// new name into `dir` until the hold is dropped. Before a rename over
    /// `dir`, so it is empty when replaced (a listing could not keep a create
    /// on another shard from landing between the check and the rename).
    pub(crate) fn hold_dir(&self, dir: InodeId) -> FsResult<DirHold<'_>> {
        let shards: Vec<(ServerId, WorkerId)> = match self.layout_of(dir)?.dir {
            DirLayout::Regular => vec![self.placement.home(dir)],
            DirLayout::BigDir => self.placement.all_shards().collect(),
        };
        self.hold_dir_on(dir, shards)
    }

    /// [`hold_dir`](Self::hold_dir) on each of `shards`.
    pub(crate) fn hold_dir_on(
        &self,
        dir: InodeId,
        shards: Vec<(ServerId, WorkerId)>,
    ) -> FsResult<DirHold<'_>> {
        let mut hold = DirHold {
            client: self,
            dir,
            shards: Vec::with_capacity(shards.len()),
            release: TokenMode::Hold,
        };
        for (s, w) in shards {
            let req = Request::TokenAcquire { dir, mode: TokenMode::Hold };
            expect_reply!(self.call_to(s, w, req)?, Reply::TokenAcquire(_) => ())?;
            hold.shards.push((s, w));
        }
        Ok(hold)
    }

    /// Takes the cluster's rename lock at the root's home, waiting (with
    /// back-off, within the request timeout) while another client holds it.
    pub(crate) fn rename_lock(&self) -> FsResult<RenameLock<'_>> {
        let req = Request::TokenAcquire { dir: InodeId::ROOT, mode: TokenMode::Rename };
        expect_reply!(self.call_home(InodeId::ROOT, req)?, Reply::TokenAcquire(_) => ())?;
        Ok(RenameLock { client: self })
    }

    /// The layouts of `ino`, from the cache or its home.
    pub(crate) fn layout_of(&self, ino: InodeId) -> FsResult<InodeLayout> {
        if let Some(l) = self.caches.layout(ino) {
            return Ok(l);
        }
        let l = expect_reply!(self.call_home(ino, Request::LayoutGet { ino })?, Reply::LayoutGet(l) => l)?;
        self.caches.remember_layout(ino, l);
        Ok(l)
    }

    /// Holds (or takes) a read token on `dir`; its expiry, or `None` when the
    /// server grants no lease (someone is changing names in `dir`).
    pub(crate) fn read_token(&self, dir: InodeId) -> FsResult<Option<Instant>> {
        let now = Instant::now();
        if let Some(exp) = self.caches.read_token(dir, now) {
            return Ok(Some(exp));
        }
        let req = Request::TokenAcquire { dir, mode: TokenMode::Read };
        let grant = expect_reply!(self.call_home(dir, req)?, Reply::TokenAcquire(g) => g)?;
        if grant.lease_ms == 0 {
            return Ok(None);
        }
        // Count the lease from before the request: never longer than granted.
        let exp = now + Duration::from_millis(u64::from(grant.lease_ms));
        let server = self.placement.home(dir).0 .0 as usize;
        self.caches.hold_read_token(dir, server, exp, now);
        Ok(Some(exp))
    }

    /// Whether no read token was revoked since `mark` (from
    /// [`Caches::revocations`]), counting every invalidation that arrived on a
    /// connection before the replies already taken from it: a server sends a
    /// revocation before it lets the change happen, so a reply that saw the
    /// change comes after it on the connection.
    pub(crate) fn unrevoked_since(&self, mark: u64) -> bool {
        self.caches.apply_invalidations(&self.conns) == mark
    }

    /// Runs `hook` after each lookup reply, before the name it found may be
    /// cached: a test seam, to make another client's change fall exactly there.
    pub fn set_lookup_hook(&self, hook: LookupHook) {
        *self.caches.lookup_hook.lock().expect("lookup hook lock") = Some(hook);
    }

    /// Runs the lookup hook, if one is set.
    pub(crate) fn after_lookup(&self, parent: InodeId, name: &[u8]) {
        if let Some(hook) = self.caches.lookup_hook.lock().expect("lookup hook lock").as_ref() {
            hook(parent, name);
        }
    }

    /// Takes the write token on `dir`, which makes the server tell every other
    /// client to drop the names of `dir` it caches; released when dropped.
    pub(crate) fn write_token(&self, dir: InodeId) -> FsResult<WriteToken<'_>> {
        if self.opts.dentry_ttl.is_zero() {
            return Ok(WriteToken { client: self, dir: None });
        }
        self.caches.dcache.lock().expect("dcache lock").invalidate_dir(dir);
        let req = Request::TokenAcquire { dir, mode: TokenMode::Write };
        expect_reply!(self.call_home(dir, req)?, Reply::TokenAcquire(_) => ())?;
        Ok(WriteToken { client: self, dir: Some(dir) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dcache::CachedDir;
    use pfs_core::{DirLayout, FileAttr, FileType};

    fn dir_attr(ino: u64) -> FileAttr {
        crate::cluster::test_attr(ino, FileType::Directory)
    }

    #[test]
    fn a_revoked_token_drops_its_names_and_tells_the_kernel() {
        let c = Caches::new(16);
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let d = InodeId(7);
        c.hold_read_token(d, 0, later, now);
        let cached = CachedDir { attr: dir_attr(8), layout: DirLayout::Regular };
        c.dcache.lock().unwrap().insert(d, b"sub", cached, later);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        c.set_invalidator(Box::new(move |i| s.lock().unwrap().push(format!("{i:?}"))));
        assert_eq!(c.read_token(d, now), Some(later));
        assert_eq!(c.read_token(d, later), None, "expired at its expiry");
        c.revoke(d);
        assert_eq!(c.read_token(d, now), None);
        assert!(c.dcache.lock().unwrap().get(d, b"sub", now).is_none());
        // The kernel hears of it from the notification thread, not from the
        // thread that applied the revocation; then the token is given back.
        assert!(seen.lock().unwrap().is_empty());
        assert_eq!(c.tell_kernel(), vec![d]);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[0].contains("Entry") && seen[1].contains("Inode"), "{seen:?}");
        assert!(c.tell_kernel().is_empty(), "told once");
    }

    #[test]
    fn the_layout_cache_is_bounded() {
        let c = Caches::new(0);
        let l = InodeLayout::default();
        for i in 0..LAYOUT_CACHE_MAX as u64 + 10 {
            c.remember_layout(InodeId(i), l);
        }
        assert!(c.layouts.lock().unwrap().len() <= LAYOUT_CACHE_MAX);
        assert_eq!(c.layout(InodeId(LAYOUT_CACHE_MAX as u64 + 9)), Some(l));
        c.forget_layout(InodeId(LAYOUT_CACHE_MAX as u64 + 9));
        assert_eq!(c.layout(InodeId(LAYOUT_CACHE_MAX as u64 + 9)), None);
    }

    /// A cached layout is used for `LAYOUT_TTL`, then asked for again.
    #[test]
    fn a_cached_layout_runs_out() {
        let c = Caches::new(0);
        let now = Instant::now();
        let l = InodeLayout { dir: DirLayout::Regular, ..InodeLayout::default() };
        c.remember_layout_at(InodeId(5), l, now);
        assert_eq!(c.layout_at(InodeId(5), now + LAYOUT_TTL / 2), Some(l));
        assert_eq!(c.layout_at(InodeId(5), now + LAYOUT_TTL), None);
    }

    /// A lookup is trusted by the one open after it, within the time given.
    #[test]
    fn a_lookup_is_trusted_by_one_open() {
        let c = Caches::new(0);
        c.found_by_lookup(InodeId(5));
        assert!(c.take_lookup_within(InodeId(5), Duration::from_secs(60)));
        assert!(!c.take_lookup_within(InodeId(5), Duration::from_secs(60)), "taken");
        c.found_by_lookup(InodeId(6));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!c.take_lookup_within(InodeId(6), Duration::from_millis(1)), "too old");
        assert!(!c.take_lookup_within(InodeId(7), Duration::from_secs(60)), "never looked up");
        for i in 0..LOOKED_UP_MAX as u64 + 10 {
            c.found_by_lookup(InodeId(100 + i));
        }
        assert!(c.looked_up.lock().unwrap().len() <= LOOKED_UP_MAX);
    }
}
