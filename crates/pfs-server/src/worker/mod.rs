//! One RingSched worker: a pinned thread that owns one shard and some client
//! connections, and exchanges requests with the other workers through SPSC rings.
//!
//! A request arrives on the connection of its communicating worker (the one that
//! accepted the client). The frame header names the processing worker (the
//! client's routing result); if that is this worker the request runs here at
//! once, otherwise the raw frame travels through the ring to its owner, which runs
//! it to completion on its shard, encodes the reply into the same buffer and sends
//! it back through the ring the other way. The buffer thus returns to the thread
//! that allocated it.
//!
//! Replies to `fsync` and `close` wait for the shard's next commit, which is taken
//! once per loop round for all of them (group commit); other changes are committed
//! at least every `commit_interval`.
//!
//! The loop is [`Worker::serve`] (rounds, an adaptive spin, a park) and one
//! round is [`Worker::round`], both here; each part it calls lives in one file:
//! `conns.rs` (connections and the first checks on a request), `requests.rs`
//! (running a request on the shard), `reads.rs` (data reads and their replies),
//! `rings.rs` (requests and replies between workers), `commit.rs` (group
//! commit and held replies), `park.rs` (sleeping when idle), `inline.rs`
//! (rounds run by client threads of the same process) and `host.rs` (the
//! worker as the host of multi-shard steps).

mod commit;
mod conns;
mod host;
mod inline;
mod park;
mod reads;
mod requests;
mod rings;

pub use rings::ring_mesh;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pfs_core::config::PollMode;
use pfs_core::ClientId;
use pfs_net::poller::READ;
use pfs_net::{Completion, Epoll, Link};
use pfs_store::device::Device;
use pfs_store::Shard;

use crate::cross::Renames;
use crate::host::Host;
use crate::locks::Locks;
use crate::memcpy::MemcpyPort;
use crate::msg::{ConnRef, Doorbell, LiveConns, Task};
use crate::peers::Peers;
use crate::rmdir::Rmdirs;
use crate::stopped::Stopped;
use crate::tokens::Tokens;

use conns::{error_reply, ConnState};
use inline::Shared;
use reads::PendingRead;

/// Usage a worker publishes for the heartbeat (bytes and inode slots).
#[derive(Debug, Default)]
pub struct UsageCell {
    /// Data bytes of the zone.
    pub total_bytes: AtomicU64,
    /// Data bytes in use.
    pub used_bytes: AtomicU64,
    /// Inode slots.
    pub inodes_total: AtomicU64,
    /// Inode slots in use.
    pub inodes_used: AtomicU64,
    /// Times the worker waited for the device while it served
    /// (`ShardStats::device_waits` from its start to its stop), set at the
    /// stop.
    pub device_waits: AtomicU64,
    /// Device requests that found the device queue full and waited for room
    /// in the shard's queue instead (`ShardStats::held_back`), set at the stop.
    pub held_back: AtomicU64,
    /// The most tasks the backlog of full rings held at once (live).
    pub backlog_high: AtomicU64,
    /// Rounds in which the worker took no new requests from its connections
    /// because the backlog was at its bound (live).
    pub backlog_pauses: AtomicU64,
    /// File lock ranges the worker keeps (live): a clean stop with none
    /// needs no grace period at the next start.
    pub locks_held: AtomicU64,
}

/// How a worker behaves.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Spin forever, or park after an adaptive spin of at most `idle_spin`
    /// (`crate::spin`).
    pub poll_mode: PollMode,
    /// Longest time an idle worker spins before it parks (adaptive: it spins
    /// less, or not at all, while spinning does not pay).
    pub idle_spin: Duration,
    /// Longest time a change waits for its commit when nobody asks.
    pub commit_interval: Duration,
    /// Lease of a dentry-cache token.
    pub token_lease: Duration,
    /// How long a client's file locks last without a renewal (`crate::locks`).
    pub lock_lease: Duration,
    /// The server restarted on zones that held files: its lock tables keep
    /// a grace period for clients' reclaims (`Locks::after_restart`).
    pub restarted: bool,
    /// Whether client threads of this process may run the worker's rounds
    /// while it is parked ([`pfs_net::inline`]; `pfs up`).
    pub inline_rounds: bool,
}

/// Why the server fail-stopped, set by the first worker that had to: its shard
/// stopped acknowledging (a failed sync, an operation cut by a device error) or
/// the worker panicked. The whole server stops, without checkpointing that
/// shard, and exits non-zero so systemd restarts it and recovery runs.
#[derive(Clone, Debug, Default)]
pub struct FailStop {
    why: Arc<std::sync::Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
}

impl FailStop {
    /// A fail-stop that sets `stop`.
    pub fn new(stop: Arc<AtomicBool>) -> FailStop {
        FailStop { why: Arc::default(), stop }
    }

    /// Records `why` (the first reason wins), logs it and stops the server.
    pub fn trip(&self, why: String) {
        let mut slot = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            log::error!(
                "fail-stop: {why}; the server stops without checkpointing that shard, \
                 and recovery from its log runs at the next start"
            );
            *slot = Some(why);
        }
        self.stop.store(true, Ordering::Release);
    }

    /// The reason, once tripped.
    pub fn reason(&self) -> Option<String> {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// One worker; [`run`](Worker::run) is its thread's body.
pub struct Worker<D: Device> {
    pub(crate) id: u16,
    pub(crate) shard: Shard<D>,
    opts: WorkerOptions,
    conns: Vec<Option<ConnState>>,
    next_gen: u32,
    new_conns: Receiver<Link>,
    ring_out: Vec<Option<rtrb::Producer<Task>>>,
    ring_in: Vec<Option<rtrb::Consumer<Task>>>,
    /// Tasks a full ring refused, in order ([`BACKLOG_RINGS`]).
    backlog: VecDeque<(u16, Task)>,
    /// Past this many, no new requests are taken from the connections.
    backlog_max: usize,
    backlog_high: usize,
    bells: Arc<Vec<Doorbell>>,
    usage: Arc<UsageCell>,
    stop: Arc<AtomicBool>,
    epoll: Epoll,
    completions: Vec<Completion>,
    /// Replies held until their commit (`Shard::next_commit` when they were
    /// made) finished: (commit, origin worker, connection, frame).
    after_commit: Vec<commit::HeldReply>,
    /// Replies to `Durable` requests, each held until commit number `.0`
    /// finished, which they do not hurry (`serve_durable`).
    after_natural_commit: Vec<commit::HeldReply>,
    /// Checkpoints of the shard, and waits for a full log, already logged
    /// (`log_checkpoint`).
    checkpoints_seen: u64,
    log_full_waits_seen: u64,
    /// Trim steps that stopped in a row, and what they wait for
    /// (`Host::step`).
    trim_stops: crate::host::StepStops,
    /// Whether the last round saw a checkpoint under way (its start is logged).
    checkpoint_seen_running: bool,
    /// The shard's device waits and forced commits when the worker began to
    /// serve (after recovery): the log tells at the stop how many were the
    /// requests' (`ShardStats::device_waits`).
    waits_before_serving: (u64, u64),
    /// Reads waiting for the device, by the shard's read id; at most as many
    /// as the device queue holds (each has a device read in flight).
    reads: HashMap<u64, PendingRead>,
    /// Requests that stopped before they changed anything, to run again once
    /// what they wait for finished (`stopped.rs`).
    stopped: Stopped,
    dirty_since: Option<Instant>,
    now: Instant,
    /// Cross-shard renames this worker coordinates.
    cross: Renames,
    /// `bigdir` rmdirs this worker coordinates.
    rmdirs: Rmdirs,
    peers: Peers,
    /// This worker's end of the memcpy pool (none: copies stay on the worker).
    memcpy: Option<MemcpyPort>,
    /// Follow-ups logged on this shard, on their way to their targets.
    outbox: crate::follow::Outbox,
    /// The sweep of data whose file is gone.
    sweep: crate::sweep::Sweep,
    tokens: Tokens,
    /// File locks of the files this worker owns.
    locks: Locks,
    /// The connection of each client this worker serves, for messages the
    /// server sends unasked (token invalidations): at most one entry per
    /// connection in `conns`.
    clients: HashMap<ClientId, ConnRef>,
    /// Which connection every worker's slots hold (this worker writes its own).
    live: Arc<LiveConns>,
    fail_stop: FailStop,
    /// The key client threads of this process find this worker under, when it
    /// serves inline (`WorkerOptions::inline_rounds`).
    inline_key: Option<u64>,
}

impl<D: Device> std::fmt::Debug for Worker<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish_non_exhaustive()
    }
}

/// Token of the worker's own eventfd in its epoll set; connections use slot + 1.
const TOKEN_BELL: u64 = 0;
/// Token of the device's completion descriptor (`Device::completion_fd`).
const TOKEN_DEVICE: u64 = u64::MAX;

/// A worker's backlog of tasks that full rings refused holds up to this many
/// rings' worth (of the deepest ring out) before it takes no new requests
/// from its connections (`round`). What it still adds while paused are the
/// replies to requests its peers forwarded (at most what their clients have
/// in flight: connections times receive buffers) and token notices, while
/// the peers, which serve their rings every round, take it down.
pub const BACKLOG_RINGS: usize = 4;

/// The backlog's bound for rings out of these depths ([`BACKLOG_RINGS`]); a
/// worker without peers has no backlog.
fn backlog_bound(depths: &[usize]) -> usize {
    BACKLOG_RINGS * depths.iter().copied().max().unwrap_or(0).max(1)
}

impl<D: Device> Worker<D> {
    /// A worker over `shard` with its ring ends; call [`run`](Self::run) on its thread.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u16,
        shard: Shard<D>,
        opts: WorkerOptions,
        new_conns: Receiver<Link>,
        ring_out: Vec<Option<rtrb::Producer<Task>>>,
        ring_in: Vec<Option<rtrb::Consumer<Task>>>,
        bells: Arc<Vec<Doorbell>>,
        usage: Arc<UsageCell>,
        stop: Arc<AtomicBool>,
        peers: Peers,
        live: Arc<LiveConns>,
        memcpy: Option<MemcpyPort>,
        fail_stop: FailStop,
    ) -> std::io::Result<Worker<D>> {
        let epoll = Epoll::new()?;
        epoll.add(bells[id as usize].wake.raw(), READ, TOKEN_BELL)?;
        if let Some(fd) = shard.completion_fd() {
            // A commit step that finishes wakes a parked worker.
            epoll.add(fd, READ, TOKEN_DEVICE)?;
        }
        let checkpoints_seen = shard.checkpoints();
        let ring_out_depths: Vec<usize> =
            ring_out.iter().flatten().map(|p| p.buffer().capacity()).collect();
        let mut w = Worker {
            id,
            shard,
            opts: opts.clone(),
            conns: Vec::new(),
            next_gen: 1,
            new_conns,
            ring_out,
            ring_in,
            backlog: VecDeque::new(),
            backlog_max: backlog_bound(&ring_out_depths),
            backlog_high: 0,
            bells,
            usage,
            stop,
            epoll,
            completions: Vec::with_capacity(pfs_net::POLL_BATCH),
            after_commit: Vec::new(),
            after_natural_commit: Vec::new(),
            checkpoints_seen,
            log_full_waits_seen: 0,
            trim_stops: Default::default(),
            checkpoint_seen_running: false,
            waits_before_serving: (0, 0),
            reads: HashMap::new(),
            stopped: Stopped::default(),
            dirty_since: None,
            now: Instant::now(),
            cross: Renames::default(),
            rmdirs: Rmdirs::default(),
            peers,
            memcpy,
            outbox: crate::follow::Outbox::default(),
            sweep: crate::sweep::Sweep::new(Instant::now()),
            tokens: Tokens::after_start(opts.token_lease, Instant::now()),
            locks: {
                // New at each start, distinct per worker.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                let epoch = nanos ^ (u64::from(id) << 56) ^ u64::from(std::process::id());
                if opts.restarted {
                    Locks::after_restart(opts.lock_lease, epoch, Instant::now())
                } else {
                    Locks::new(opts.lock_lease, epoch)
                }
            },
            clients: HashMap::new(),
            live,
            fail_stop,
            inline_key: None,
        };
        w.publish_usage();
        w.recover_intents();
        let st = w.shard.stats();
        w.waits_before_serving = (st.device_waits, st.forced_commits);
        Ok(w)
    }

    /// Picks up the intents a previous run left in the shard's transaction
    /// table (after a crash): cross-shard renames and bigdir rmdirs resume.
    fn recover_intents(&mut self) {
        for (txn, data) in self.shard.txns() {
            if txn & pfs_store::shard::txn::PARTICIPANT_BIT != 0 {
                continue;
            }
            if pfs_store::shard::follow::decode_follow(txn, &data).is_some() {
                continue; // Sent by the outbox (follow.rs).
            }
            if matches!(
                data.first(),
                Some(&(crate::rmdir::RMDIR_INTENT | crate::rmdir::RMDIR_DECIDED))
            ) {
                self.rmdirs.recover(self.id, txn, &data);
            } else {
                self.cross.recover(self.id, self.now, txn, &data);
            }
        }
    }

    /// Serves until the stop flag is set, then commits and checkpoints the shard.
    pub fn run(self) -> Result<Shard<D>, String>
    where
        D: Send + 'static,
    {
        let inline = self.opts.inline_rounds;
        let shared = Arc::new(Shared {
            worker: Mutex::new(self),
            idle: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            runs: AtomicU64::new(0),
        });
        let key = inline.then(|| {
            let as_inline: Arc<dyn pfs_net::inline::Inline> = shared.clone();
            pfs_net::inline::register(&as_inline)
        });
        let mut w = shared.lock();
        w.inline_key = key;
        w = Self::serve(&shared, w);
        shared.closed.store(true, Ordering::SeqCst);
        if let Some(k) = key {
            pfs_net::inline::unregister(k);
        }
        let result = if shared.panicked.load(Ordering::SeqCst) {
            Err(w.fail_stop.reason().unwrap_or_else(|| "a round panicked".into()))
        } else {
            let runs = shared.runs.load(Ordering::Relaxed);
            if runs > 0 {
                log::info!(
                    "worker {}: client threads of this process ran its rounds {runs} times",
                    w.id
                );
            }
            w.finish()
        };
        drop(w);
        // A client thread may still hold the worker for the one attempt it
        // began before `closed` was set; it lets go at once.
        let mut shared = shared;
        let shared = loop {
            match Arc::try_unwrap(shared) {
                Ok(s) => break s,
                Err(s) => {
                    shared = s;
                    std::thread::yield_now();
                }
            }
        };
        let worker = shared.worker.into_inner().unwrap_or_else(|p| p.into_inner());
        result.map(|()| worker.shard)
    }

    /// The loop: rounds while there is work, an adaptive spin, then a park
    /// that lets go of the worker's lock while it sleeps in the epoll set (a
    /// client thread of this process may run rounds meanwhile, `Shared`).
    fn serve<'a>(
        shared: &'a Shared<D>,
        mut w: MutexGuard<'a, Worker<D>>,
    ) -> MutexGuard<'a, Worker<D>> {
        // The idle period under way: when it began, and whether the worker
        // parked in it (then it parks again at once after a wake-up that
        // brought no work, instead of spinning again).
        let mut idle_from: Option<Instant> = None;
        let mut parked = false;
        let mut spin = crate::spin::Spin::new(w.opts.idle_spin);
        // When the spin last polled (its gaps tell whether the core is shared).
        let mut last_poll: Option<Instant> = None;
        while !w.stop.load(Ordering::Acquire) {
            w.now = Instant::now();
            w.shard.set_now(wall_clock_ns());
            let work = w.round();
            if let Some(why) = w.shard.failure() {
                w.fail_stop.trip(format!("worker {}: {why}", w.id));
                break;
            }
            if w.shard.checkpoints() != w.checkpoints_seen {
                w.log_checkpoint();
            }
            if w.shard.checkpointing() != w.checkpoint_seen_running {
                w.checkpoint_seen_running = w.shard.checkpointing();
                if w.checkpoint_seen_running {
                    log::info!(
                        "worker {}: checkpoint started beside the requests (a quarter of the \
                         log's half is left)",
                        w.id
                    );
                }
            }
            if work > 0 {
                if let Some(since) = idle_from.take().filter(|_| parked) {
                    spin.woke_after(w.now.duration_since(since));
                }
                parked = false;
                last_poll = None;
                continue;
            }
            if w.opts.poll_mode == PollMode::Busy {
                std::hint::spin_loop();
                continue;
            }
            let since = *idle_from.get_or_insert(w.now);
            // Replies from peer servers arrive on connections the epoll set does
            // not watch: while a transaction waits for one, stay awake (yielding
            // the core) instead of parking up to PARK_MAX per step.
            if w.awaiting_peers() {
                std::thread::yield_now();
                continue;
            }
            // With only a commit step or reads to wait for, wait on the device
            // at once (`park`): spinning would only poll for the same completion.
            // While client threads run the rounds (inline rounds, callers
            // interleaving), spinning would only keep them from finding it parked.
            let spins = !(w.opts.inline_rounds && pfs_net::inline::skip_spin());
            if spins && !parked && w.now.duration_since(since) < spin.window() && !w.awaits_device()
            {
                if let Some(last) = last_poll.replace(w.now) {
                    spin.polled(w.now, w.now.duration_since(last));
                }
                if spin.yields(w.now) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            last_poll = None;
            if let Some(timeout) = w.park_begin() {
                let fd = w.epoll.raw();
                shared.idle.store(true, Ordering::SeqCst);
                drop(w);
                let _ = pfs_net::wait_readable(fd, Some(timeout));
                w = shared.lock();
                shared.idle.store(false, Ordering::SeqCst);
                if shared.panicked.load(Ordering::SeqCst) {
                    break;
                }
            }
            w.park_end();
            parked = true;
        }
        w
    }

    /// After the loop: answers what already arrived, makes everything
    /// durable and checkpoints the shard (or reports why it cannot).
    fn finish(&mut self) -> Result<(), String> {
        if let Some(why) = self.shard.failure() {
            // Nothing more is acknowledged: held replies fail, and the shard is
            // left as the log has it for recovery.
            let why = format!("worker {}: {why}", self.id);
            self.fail_stop.trip(why.clone());
            self.commit_and_release();
            return Err(why);
        }
        let st = self.shard.stats();
        let waits = st.device_waits - self.waits_before_serving.0;
        self.usage.device_waits.store(waits, Ordering::Relaxed);
        self.usage.held_back.store(st.held_back, Ordering::Relaxed);
        log::info!(
            "worker {}: while serving, waited for the device {waits} times ({} of them forced \
             commits); {} device requests waited for room in a full device queue and {} data \
             writes stopped for them; {} stops for room to read an inode page; the backlog of \
             full rings peaked at {} tasks (bound {}), new requests paused for it in {} rounds",
            self.id,
            st.forced_commits - self.waits_before_serving.1,
            st.held_back,
            st.writes_deferred,
            st.icache.read_room_stops,
            self.backlog_high,
            self.backlog_max,
            self.usage.backlog_pauses.load(Ordering::Relaxed)
        );
        // Drain: answer what already arrived (and what the memcpy pool still
        // copies), then make everything durable.
        let drain_end = Instant::now() + Duration::from_secs(2);
        for _ in 0..1000 {
            let copying = self.memcpy.as_ref().is_some_and(|m| m.in_flight > 0);
            let busy = copying || !self.reads.is_empty() || !self.stopped.is_empty();
            if self.round() == 0 && (!busy || Instant::now() > drain_end) {
                break;
            }
        }
        self.commit_and_release();
        // The commit waited for every device read: answer them.
        self.send_finished_reads();
        if let Some(why) = self.shard.failure() {
            let why = format!("worker {}: {why}", self.id);
            self.fail_stop.trip(why.clone());
            return Err(why);
        }
        self.shard.checkpoint().map_err(|e| format!("worker {}: checkpoint: {e}", self.id))?;
        log::info!("worker {}: checkpointed, stopping; {:?}", self.id, self.shard.stats());
        Ok(())
    }

    /// One pass over new connections, connections, rings and the commit; returns
    /// the work done.
    fn round(&mut self) -> usize {
        self.peers.take_view();
        let mut work = self.take_new_conns();
        if self.backlog.len() < self.backlog_max {
            for slot in 0..self.conns.len() {
                work += self.serve_conn(slot);
            }
        } else {
            // Back-pressure: the peers take the backlog first (rings are
            // served below either way, so they drain it), and the clients
            // wait meanwhile with their requests unread.
            self.usage.backlog_pauses.fetch_add(1, Ordering::Relaxed);
        }
        work += self.serve_rings();
        if self.memcpy.as_ref().is_some_and(|m| m.in_flight > 0) {
            work += self.take_copied();
        }
        if !self.cross.is_empty() {
            let mut cross = std::mem::take(&mut self.cross);
            work += cross.poll(self);
            self.cross = cross;
        }
        if !self.rmdirs.is_empty() {
            let mut rmdirs = std::mem::take(&mut self.rmdirs);
            work += rmdirs.poll(self);
            self.rmdirs = rmdirs;
        }
        if !self.outbox.is_idle() || self.shard.has_ready_follow_ups() {
            let mut outbox = std::mem::take(&mut self.outbox);
            work += outbox.poll(self);
            self.outbox = outbox;
        }
        let mut sweep = std::mem::replace(&mut self.sweep, crate::sweep::Sweep::new(self.now));
        work += sweep.poll(self);
        self.sweep = sweep;
        work += self.flush_backlog();
        // Finished data writes give back their buffers (a failed one fails
        // the shard, seen below); finished reads are answered.
        self.shard.poll_data_writes();
        if !self.reads.is_empty() {
            work += self.send_finished_reads();
        }
        if !self.stopped.is_empty() {
            work += self.run_stopped();
        }
        if work == 0 && self.shard.has_trims() {
            // Free a removed or truncated file's data one bounded record at a
            // time, only when no request waits. A step that needs an inode
            // page read, a commit or room in the log first stops, as requests
            // do, and runs again once one of the shard's background requests
            // finished; after four stops in a row it waits instead
            // (`Host::step`, as the multi-shard machines' steps).
            let mut stops = std::mem::take(&mut self.trim_stops);
            match self.step(&mut stops, |s| s.trim_step()) {
                Some(Ok(n)) => work += n,
                Some(Err(e)) => log::error!("worker {}: freeing file data: {e}", self.id),
                None => {}
            }
            self.trim_stops = stops;
            self.mark_dirty();
        }
        // Cross-shard steps and trims run shard operations outside `exec`.
        self.shard.end_request();
        work + self.drive_commit()
    }

    /// Workers per server: this server's, which every server shares (the
    /// cluster refuses a server whose count differs), known before the view.
    fn workers(&self) -> u32 {
        self.ring_out.len() as u32
    }

    /// Tells the operator about a checkpoint taken while serving (the log
    /// was filling): how long it took beside the requests, and how long the
    /// snapshot stopped them; warns when operations waited for a full log.
    fn log_checkpoint(&mut self) {
        self.checkpoints_seen = self.shard.checkpoints();
        let st = self.shard.stats();
        log::info!(
            "worker {}: checkpointed beside the requests: {:.1} MiB of tables in {} ms; \
             the snapshot stopped serving for {} us (longest so far {} us), each slice of \
             the tables' encoding for at most {} us",
            self.id,
            st.last_checkpoint_bytes as f64 / (1 << 20) as f64,
            st.last_checkpoint_us / 1000,
            st.last_snapshot_us,
            st.max_snapshot_us,
            st.max_encode_slice_us
        );
        if st.log_full_waits != self.log_full_waits_seen {
            self.log_full_waits_seen = st.log_full_waits;
            log::warn!(
                "worker {}: the log filled before a checkpoint finished, and operations \
                 waited for it ({} times so far); a larger wal_size gives checkpoints more time",
                self.id,
                st.log_full_waits
            );
        }
    }

    fn publish_usage(&self) {
        let s = self.shard.statfs();
        let page = u64::from(s.block_size);
        self.usage.total_bytes.store(s.blocks * page, Ordering::Relaxed);
        self.usage.used_bytes.store((s.blocks - s.blocks_free) * page, Ordering::Relaxed);
        self.usage.inodes_total.store(s.files, Ordering::Relaxed);
        self.usage.inodes_used.store(s.files - s.files_free, Ordering::Relaxed);
    }
}

fn wall_clock_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
