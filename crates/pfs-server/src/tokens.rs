//! Dentry-cache tokens (PeakFS III-C2), kept by the worker that owns a
//! directory's inode. A client caches the names of subdirectories of `dir` only
//! while it holds a read token on `dir`, a lease that expires by itself; a client
//! about to change such a name takes the write token, and every other holder is
//! told to drop its cache (`TokenInvalidate`, sent unasked on its connection).
//! The write token is granted only once each of them acknowledged (gave its
//! read token back, after dropping its names and telling its kernel) or its
//! lease ran out: until then the writer is answered `TryAgain` and asks
//! again, as Lustre's lock callbacks make a writer wait. So no other client
//! still holds the old name when the change is made: a node told of a
//! rename only after it (the invalidation was on its way) reached the
//! renamed directory under the old name.
//!
//! Tokens live in memory only: after a restart no one holds one, and every
//! client's leases run out within `lease`.
//!
//! The worker that owns the root also keeps the cluster's rename lock
//! (`TokenMode::Rename`): one client at a time moves a directory to another
//! parent, so the check that it does not go into its own subtree and the
//! move are one step among such moves (Linux's `s_vfs_rename_mutex`, Lustre's
//! rename lock). It is a lease of [`RENAME_LOCK_LEASE`], so a client that
//! died holding it stops no one for longer.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use pfs_core::wire::{TokenGrant, TokenMode};
use pfs_core::{ClientId, FsError, FsResult, InodeId};

/// Directories with tokens one worker tracks; past it, reads get no lease.
pub const TOKEN_DIRS_MAX: usize = 1 << 16;
/// Read holders per directory; past it, reads get no lease.
pub const TOKEN_READERS_MAX: usize = 1024;
/// How long a write waits at most for a revoked reader's acknowledgment
/// (its lease ends sooner, or it answers within its notification poll, 2
/// ms). A reader can be kept from answering by the write it is itself
/// waiting for: its notification thread tells its kernel to drop the names,
/// and the kernel waits for the directory's lock, which that reader's own
/// rename in the same directory holds while it waits for its write token.
/// Two nodes renaming in one directory both cached names of would stop each
/// other for a whole lease (1 s) without this bound.
pub const ACK_WAIT_MAX: Duration = Duration::from_millis(100);
/// How long the rename lock is held at most: longer than any client's
/// check and move take (a move that waits for a down server gives up at
/// the client's request timeout, 10 s by default).
pub const RENAME_LOCK_LEASE: Duration = Duration::from_secs(15);

#[derive(Debug, Default)]
struct DirTokens {
    readers: Vec<(ClientId, Instant)>,
    /// Readers told to drop their names that have not given their token
    /// back yet, with the end of their lease: a write waits for them.
    revoked: Vec<(ClientId, Instant)>,
    writer: Option<(ClientId, Instant)>,
}

/// The tokens of the directories one worker owns.
#[derive(Debug)]
pub struct Tokens {
    dirs: HashMap<InodeId, DirTokens>,
    lease: Duration,
    /// The rename lock's holder and the end of its lease.
    rename_lock: Option<(ClientId, Instant)>,
    /// No write token before this: read tokens a previous run of this server
    /// granted may still be held ([`Tokens::after_start`]).
    grace_until: Option<Instant>,
}

impl Tokens {
    /// A table granting leases of `lease`.
    pub fn new(lease: Duration) -> Tokens {
        Tokens { dirs: HashMap::new(), lease, rename_lock: None, grace_until: None }
    }

    /// A table for a server that started at `now`: clients may still hold read
    /// tokens its previous run granted (it restarted less than a lease ago)
    /// and that this table never saw, so no write token is granted (the
    /// writer is answered `TryAgain`) until every such lease has run out, as
    /// NFS and Lustre servers hold conflicting locks back for a grace period
    /// after a restart.
    pub fn after_start(lease: Duration, now: Instant) -> Tokens {
        Tokens { grace_until: Some(now + lease), ..Tokens::new(lease) }
    }

    /// Grants `mode` on `dir` to `client` at `now`. For a write token, returns
    /// the other clients whose read tokens it revokes (to be sent an
    /// invalidation), and `TryAgain` instead of the grant while a reader it
    /// revoked (now or at an earlier try) has not given its token back and
    /// its lease has not run out; meanwhile no one else gets a read lease.
    pub fn acquire(
        &mut self,
        dir: InodeId,
        client: ClientId,
        mode: TokenMode,
        now: Instant,
    ) -> (FsResult<TokenGrant>, Vec<ClientId>) {
        let no_lease = Ok(TokenGrant { mode, lease_ms: 0 });
        // Taken with `acquire_rename` and the shard's `hold_dir`, never
        // cached under.
        if matches!(
            mode,
            TokenMode::Rename
                | TokenMode::Hold
                | TokenMode::Gone
                | TokenMode::RelaidRegular
                | TokenMode::RelaidBigDir
        ) {
            return (no_lease, Vec::new());
        }
        if !self.dirs.contains_key(&dir) && self.dirs.len() >= TOKEN_DIRS_MAX {
            self.expire(now);
            if self.dirs.len() >= TOKEN_DIRS_MAX {
                return (no_lease, Vec::new());
            }
        }
        let lease_ms = self.lease.as_millis() as u32;
        let t = self.dirs.entry(dir).or_default();
        t.expire(now);
        match mode {
            TokenMode::Read => {
                if t.writer.is_some_and(|(w, _)| w != client) {
                    // A change is under way: do not cache.
                    return (no_lease, Vec::new());
                }
                let full = t.readers.len() >= TOKEN_READERS_MAX;
                match t.readers.iter_mut().find(|(c, _)| *c == client) {
                    Some(r) => r.1 = now + self.lease,
                    None if full => return (no_lease, Vec::new()),
                    None => t.readers.push((client, now + self.lease)),
                }
                (Ok(TokenGrant { mode, lease_ms }), Vec::new())
            }
            TokenMode::Write => {
                let mut told = Vec::new();
                for (c, exp) in t.readers.drain(..) {
                    if c != client {
                        told.push(c);
                        t.revoked.retain(|(r, _)| *r != c);
                        if t.revoked.len() < TOKEN_READERS_MAX {
                            t.revoked.push((c, exp.min(now + ACK_WAIT_MAX)));
                        }
                    }
                }
                t.writer = Some((client, now + self.lease));
                let grace = self.grace_until.is_some_and(|g| now < g);
                if grace || t.revoked.iter().any(|(c, _)| *c != client) {
                    return (Err(FsError::TryAgain), told);
                }
                (Ok(TokenGrant { mode, lease_ms }), told)
            }
            TokenMode::Rename
            | TokenMode::Hold
            | TokenMode::Gone
            | TokenMode::RelaidRegular
            | TokenMode::RelaidBigDir => (no_lease, Vec::new()),
        }
    }

    /// Grants the rename lock to `client` at `now`, or `TryAgain` while
    /// another client holds it (its lease not run out). Taken again by its
    /// holder, the lease starts anew.
    pub fn acquire_rename(&mut self, client: ClientId, now: Instant) -> FsResult<TokenGrant> {
        if self.rename_lock.is_some_and(|(holder, end)| holder != client && end > now) {
            return Err(FsError::TryAgain);
        }
        self.rename_lock = Some((client, now + RENAME_LOCK_LEASE));
        let lease_ms = RENAME_LOCK_LEASE.as_millis() as u32;
        Ok(TokenGrant { mode: TokenMode::Rename, lease_ms })
    }

    /// Gives a token back.
    pub fn release(&mut self, dir: InodeId, client: ClientId, mode: TokenMode) {
        if mode == TokenMode::Rename {
            if self.rename_lock.is_some_and(|(holder, _)| holder == client) {
                self.rename_lock = None;
            }
            return;
        }
        let Some(t) = self.dirs.get_mut(&dir) else { return };
        match mode {
            // Given back by a reader told to drop its names: its
            // acknowledgment.
            TokenMode::Read => {
                t.readers.retain(|(c, _)| *c != client);
                t.revoked.retain(|(c, _)| *c != client);
            }
            TokenMode::Write => {
                if t.writer.is_some_and(|(w, _)| w == client) {
                    t.writer = None;
                }
            }
            TokenMode::Rename
            | TokenMode::Hold
            | TokenMode::Gone
            | TokenMode::RelaidRegular
            | TokenMode::RelaidBigDir => {}
        }
        if t.is_empty() {
            self.dirs.remove(&dir);
        }
    }

    /// Drops every expired token.
    pub fn expire(&mut self, now: Instant) {
        self.dirs.retain(|_, t| {
            t.expire(now);
            !t.is_empty()
        });
    }
}

impl DirTokens {
    fn expire(&mut self, now: Instant) {
        self.readers.retain(|(_, exp)| *exp > now);
        self.revoked.retain(|(_, exp)| *exp > now);
        if self.writer.is_some_and(|(_, exp)| exp <= now) {
            self.writer = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.readers.is_empty() && self.revoked.is_empty() && self.writer.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: InodeId = InodeId(77);

    #[test]
    fn a_write_token_revokes_the_other_readers_and_blocks_new_leases() {
        let mut t = Tokens::new(Duration::from_secs(1));
        let now = Instant::now();
        let (a, b, c) = (ClientId(1), ClientId(2), ClientId(3));
        assert_eq!(lease(&mut t, a, TokenMode::Read, now), 1000);
        assert_eq!(lease(&mut t, b, TokenMode::Read, now), 1000);
        // b is told, and a waits for b's acknowledgment.
        let (grant, revoked) = t.acquire(D, a, TokenMode::Write, now);
        assert_eq!((grant, revoked), (Err(FsError::TryAgain), vec![b]));
        // Meanwhile c gets no lease; asked again, b is not told twice.
        assert_eq!(lease(&mut t, c, TokenMode::Read, now), 0);
        assert_eq!(t.acquire(D, a, TokenMode::Write, now), (Err(FsError::TryAgain), vec![]));
        t.release(D, b, TokenMode::Read);
        let (grant, revoked) = t.acquire(D, a, TokenMode::Write, now);
        assert_eq!((grant.unwrap().mode, revoked), (TokenMode::Write, vec![]));
        // While a changes names, c gets no lease; a itself may read.
        assert_eq!(lease(&mut t, c, TokenMode::Read, now), 0);
        assert_eq!(lease(&mut t, a, TokenMode::Read, now), 1000);
        t.release(D, a, TokenMode::Write);
        assert_eq!(lease(&mut t, c, TokenMode::Read, now), 1000);
    }

    /// After a restart, clients may hold read leases the previous run
    /// granted: no write token until a lease has passed since the start.
    #[test]
    fn a_started_server_grants_no_write_token_for_a_lease() {
        let start = Instant::now();
        let mut t = Tokens::after_start(Duration::from_secs(1), start);
        let (a, b) = (ClientId(1), ClientId(2));
        let granted = start + Duration::from_millis(500);
        assert_eq!(lease(&mut t, b, TokenMode::Read, granted), 1000);
        // b, which this run granted, is told at once, and acknowledges; the
        // write still waits out the grace.
        let soon = start + Duration::from_millis(600);
        assert_eq!(t.acquire(D, a, TokenMode::Write, soon), (Err(FsError::TryAgain), vec![b]));
        t.release(D, b, TokenMode::Read);
        let almost = start + Duration::from_millis(999);
        assert_eq!(t.acquire(D, a, TokenMode::Write, almost), (Err(FsError::TryAgain), vec![]));
        let after = start + Duration::from_millis(1000);
        assert!(t.acquire(D, a, TokenMode::Write, after).0.is_ok());
    }

    fn lease(t: &mut Tokens, client: ClientId, mode: TokenMode, now: Instant) -> u32 {
        t.acquire(D, client, mode, now).0.unwrap().lease_ms
    }

    /// A reader that never acknowledges (its client died, or its kernel waits
    /// for a lock) holds a write back only until its lease runs out or for
    /// `ACK_WAIT_MAX`, whichever is first.
    #[test]
    fn a_silent_reader_holds_a_write_back_a_bounded_time() {
        let mut t = Tokens::new(Duration::from_secs(1));
        let now = Instant::now();
        let (a, b, c) = (ClientId(1), ClientId(2), ClientId(3));
        assert_eq!(lease(&mut t, b, TokenMode::Read, now), 1000);
        let half = now + Duration::from_millis(500);
        assert_eq!(t.acquire(D, a, TokenMode::Write, half), (Err(FsError::TryAgain), vec![b]));
        // Up to ACK_WAIT_MAX, not to the end of b's lease.
        let waited = half + ACK_WAIT_MAX;
        let just_before = waited - Duration::from_millis(1);
        assert_eq!(t.acquire(D, a, TokenMode::Write, just_before).0, Err(FsError::TryAgain));
        assert!(t.acquire(D, a, TokenMode::Write, waited).0.is_ok());
        t.release(D, a, TokenMode::Write);
        // A lease that ends sooner ends the wait sooner.
        let later = now + Duration::from_secs(2);
        assert_eq!(lease(&mut t, c, TokenMode::Read, later), 1000);
        let near_end = later + Duration::from_millis(950);
        assert_eq!(t.acquire(D, a, TokenMode::Write, near_end).0, Err(FsError::TryAgain));
        let end = later + Duration::from_secs(1);
        assert!(t.acquire(D, a, TokenMode::Write, end).0.is_ok());
        t.release(D, a, TokenMode::Write);
        t.expire(end);
        assert!(t.dirs.is_empty());
    }

    /// The rename lock is one client's at a time; its holder gives it back,
    /// or its lease runs out; another's release does nothing.
    #[test]
    fn the_rename_lock_is_one_clients_until_released_or_run_out() {
        let mut t = Tokens::new(Duration::from_secs(1));
        let now = Instant::now();
        let (a, b) = (ClientId(1), ClientId(2));
        assert_eq!(t.acquire_rename(a, now).unwrap().mode, TokenMode::Rename);
        assert_eq!(t.acquire_rename(b, now), Err(FsError::TryAgain));
        t.release(InodeId::ROOT, b, TokenMode::Rename);
        assert_eq!(t.acquire_rename(b, now), Err(FsError::TryAgain), "not b's to give back");
        assert!(t.acquire_rename(a, now).is_ok(), "its holder takes it again");
        t.release(InodeId::ROOT, a, TokenMode::Rename);
        assert!(t.acquire_rename(b, now).is_ok());
        let later = now + RENAME_LOCK_LEASE;
        assert_eq!(t.acquire_rename(a, later - Duration::from_millis(1)), Err(FsError::TryAgain));
        assert!(t.acquire_rename(a, later).is_ok(), "b's lease ran out");
        // Asked as a dentry token, it grants nothing.
        assert_eq!(t.acquire(InodeId::ROOT, b, TokenMode::Rename, later).0.unwrap().lease_ms, 0);
    }

    #[test]
    fn leases_expire_and_expired_readers_are_not_told() {
        let mut t = Tokens::new(Duration::from_millis(100));
        let now = Instant::now();
        assert_eq!(lease(&mut t, ClientId(1), TokenMode::Read, now), 100);
        let later = now + Duration::from_millis(200);
        let (_, revoked) = t.acquire(D, ClientId(2), TokenMode::Write, later);
        assert!(revoked.is_empty());
        t.expire(later + Duration::from_secs(1));
        assert!(t.dirs.is_empty());
    }

    #[test]
    fn the_table_is_bounded() {
        let mut t = Tokens::new(Duration::from_secs(60));
        let now = Instant::now();
        for i in 0..TOKEN_READERS_MAX as u32 {
            assert_eq!(lease(&mut t, ClientId(i), TokenMode::Read, now), 60_000);
        }
        assert_eq!(lease(&mut t, ClientId(u32::MAX), TokenMode::Read, now), 0);
    }
}
