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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pfs_core::config::PollMode;
use pfs_core::wire::{Body, Frame, FrameHeader, Opcode, Reply, Request, READ_REPLY_PREFIX};
use pfs_core::{ClientId, FsError, FsResult, RequestId, ServerId, WorkerId};
use pfs_net::poller::READ;
use pfs_net::{link_sum, Completion, Epoll, Link, QueuePair, WorkId};
use pfs_store::device::Device;
use pfs_store::shard::dataio::{Gathered, ReadShape, ReadStart};
use pfs_store::Shard;

use crate::cross::Renames;
use crate::exec::{execute, execute_write, is_mutation, Durability};
use crate::host::Host;
use crate::memcpy::{Job, MemcpyPort};
use crate::msg::{patience, ConnRef, Doorbell, Task, Waiter};
use crate::peers::{PeerError, Peers};
use crate::rmdir::Rmdirs;
use crate::stopped::{Progress, Stopped};
use crate::tokens::Tokens;

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
    /// Whether client threads of this process may run the worker's rounds
    /// while it is parked ([`pfs_net::inline`]; `pfs up`).
    pub inline_rounds: bool,
}

/// Which worker and connection serve each client, for messages the server sends
/// unasked (token invalidations). Written once per connection, read rarely.
pub type ClientRegistry =
    Arc<std::sync::Mutex<std::collections::HashMap<ClientId, (u16, ConnRef)>>>;

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

struct ConnState {
    qp: Link,
    gen: u32,
    /// The client id its requests carry, once seen.
    client: Option<ClientId>,
    /// The peer proved the server role in its handshake.
    peer_is_server: bool,
    /// Internal requests refused on this connection (logged once).
    refused_internal: u64,
}

/// Requests only servers send each other (cross-shard transactions). A client
/// that sends one gets `EPERM` and the server logs it: a buggy or hostile
/// client could otherwise seal directories or apply half a rename.
fn server_internal(opcode: u16) -> bool {
    use pfs_core::Opcode;
    [
        Opcode::XRenameTarget,
        Opcode::TxnForget,
        Opcode::SealDir,
        Opcode::FollowUps,
        Opcode::DropInode,
        Opcode::AddLink,
        Opcode::TruncateData,
    ]
    .iter()
    .any(|o| *o as u16 == opcode)
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
    backlog: VecDeque<(u16, Task)>,
    bells: Arc<Vec<Doorbell>>,
    usage: Arc<UsageCell>,
    stop: Arc<AtomicBool>,
    epoll: Epoll,
    completions: Vec<Completion>,
    /// Replies held until their commit (`Shard::next_commit` when they were
    /// made) finished: (commit, origin worker, connection, frame).
    after_commit: Vec<(u64, u16, ConnRef, Vec<u8>)>,
    /// Checkpoints of the shard, and waits for a full log, already logged
    /// (`log_checkpoint`).
    checkpoints_seen: u64,
    log_full_waits_seen: u64,
    /// Trim steps that stopped in a row (`TRIM_STOPS_MAX`).
    trim_stops: u8,
    /// Whether the last round saw a checkpoint under way (its start is logged).
    checkpoint_seen_running: bool,
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
    clients: ClientRegistry,
    fail_stop: FailStop,
    /// The key client threads of this process find this worker under, when it
    /// serves inline (`WorkerOptions::inline_rounds`).
    inline_key: Option<u64>,
}

/// A worker behind the lock that lets a client thread of the same process run
/// its rounds while the worker's own thread sleeps ([`pfs_net::inline`]).
struct Shared<D: Device> {
    worker: Mutex<Worker<D>>,
    /// The worker's thread sleeps in its epoll set, without the lock.
    idle: AtomicBool,
    /// The worker stopped serving: no one runs its rounds any more.
    closed: AtomicBool,
    /// A round run by a client thread panicked: the worker stops without
    /// touching its shard again.
    panicked: AtomicBool,
    /// Times client threads ran the worker's rounds.
    runs: AtomicU64,
}

impl<D: Device> Shared<D> {
    fn lock(&self) -> MutexGuard<'_, Worker<D>> {
        // Rounds run by client threads catch their panics (`run_parked`), so
        // the lock is poisoned only by a bug outside them; the worker's state
        // then is what it was, and its thread carries on or fail-stops.
        self.worker.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<D: Device + Send> pfs_net::inline::Inline for Shared<D> {
    fn run_parked(&self, f: &mut dyn FnMut(&mut dyn FnMut() -> usize)) -> bool {
        if !self.idle.load(Ordering::SeqCst) {
            return false;
        }
        let Ok(mut w) = self.worker.try_lock() else { return false };
        if !self.idle.load(Ordering::SeqCst) || self.closed.load(Ordering::SeqCst) {
            return false;
        }
        w.disarm();
        let dirty_before = w.dirty_since.is_some();
        let mut panicked = None;
        f(&mut || {
            if panicked.is_some() || w.shard.failure().is_some() {
                return 0;
            }
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.inline_round())) {
                Ok(n) => n,
                Err(payload) => {
                    panicked = Some(crate::server::panic_text(&payload));
                    0
                }
            }
        });
        self.runs.fetch_add(1, Ordering::Relaxed);
        pfs_net::inline::count_run();
        match panicked {
            Some(why) => {
                // The shard's memory may be anywhere: stop the whole server
                // without checkpointing it, as a panic on the worker's own
                // thread does (`Worker::run`).
                self.panicked.store(true, Ordering::SeqCst);
                w.fail_stop.trip(format!(
                    "worker {} panicked in a round run by a client thread: {why}",
                    w.id
                ));
                w.bells[w.id as usize].ring_always();
            }
            None => w.rearm(dirty_before),
        }
        true
    }
}

/// Where the reply of a read waiting for the device goes.
#[derive(Debug)]
struct PendingRead {
    origin: u16,
    conn: ConnRef,
    request_id: RequestId,
    client: ClientId,
    /// `Read` or `ReadData`.
    op: Opcode,
    /// The request's buffer, reused for an error reply.
    buf: Vec<u8>,
}

impl<D: Device> std::fmt::Debug for Worker<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("id", &self.id).finish_non_exhaustive()
    }
}

/// Every ring of a `workers`-worker server: `out[i][j]` carries tasks from `i` to
/// `j`, `inp[j][i]` is its other end; no ring from a worker to itself.
#[allow(clippy::type_complexity)]
pub fn ring_mesh(
    workers: usize,
    depth: usize,
) -> (Vec<Vec<Option<rtrb::Producer<Task>>>>, Vec<Vec<Option<rtrb::Consumer<Task>>>>) {
    let mut out: Vec<Vec<Option<rtrb::Producer<Task>>>> =
        (0..workers).map(|_| (0..workers).map(|_| None).collect()).collect();
    let mut inp: Vec<Vec<Option<rtrb::Consumer<Task>>>> =
        (0..workers).map(|_| (0..workers).map(|_| None).collect()).collect();
    for i in 0..workers {
        for j in 0..workers {
            if i != j {
                let (p, c) = rtrb::RingBuffer::new(depth);
                out[i][j] = Some(p);
                inp[j][i] = Some(c);
            }
        }
    }
    (out, inp)
}

/// Token of the worker's own eventfd in its epoll set; connections use slot + 1.
const TOKEN_BELL: u64 = 0;
/// Token of the device's completion descriptor (`Device::completion_fd`).
const TOKEN_DEVICE: u64 = u64::MAX;
/// Rounds a client thread runs after its own request to leave the worker idle
/// (`Worker::rearm`); past them, the worker's thread is woken for the rest.
const REARM_ROUNDS: usize = 4;

/// Longest park, so the stop flag and the commit timer are seen.
const PARK_MAX: Duration = Duration::from_millis(100);
/// Trim steps that may stop in a row (for an inode page, a commit, room in the
/// log) before one waits: an evicted page cannot hold a trim back for ever.
const TRIM_STOPS_MAX: u8 = 4;

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
        clients: ClientRegistry,
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
            bells,
            usage,
            stop,
            epoll,
            completions: Vec::with_capacity(pfs_net::POLL_BATCH),
            after_commit: Vec::new(),
            checkpoints_seen,
            log_full_waits_seen: 0,
            trim_stops: 0,
            checkpoint_seen_running: false,
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
            tokens: Tokens::new(opts.token_lease),
            clients,
            fail_stop,
            inline_key: None,
        };
        w.publish_usage();
        w.recover_intents();
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

    /// One round run by a client thread while the worker's own thread sleeps
    /// (`Shared::run_parked`).
    fn inline_round(&mut self) -> usize {
        self.now = Instant::now();
        self.shard.set_now(wall_clock_ns());
        self.round()
    }

    /// Before inline rounds: connections stop ringing the sleeping thread.
    fn disarm(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            c.qp.cancel_wait();
        }
    }

    /// After inline rounds: arms every connection again and wakes the
    /// worker's thread if anything is left for it: requests or replies that
    /// came meanwhile, work in flight, or a first change since the last commit
    /// (its commit timer runs from the thread's next park). `dirty_before`:
    /// whether a change already waited for a commit when the rounds began.
    fn rearm(&mut self, dirty_before: bool) {
        // What the last round left to collect (the sends of its replies give
        // their buffers back) would keep the connections from arming.
        for _ in 0..REARM_ROUNDS {
            if self.shard.failure().is_some() || self.inline_round() == 0 {
                break;
            }
        }
        let mut busy = false;
        for c in self.conns.iter_mut().flatten() {
            busy |= !c.qp.prepare_wait();
        }
        busy |= self.ring_in.iter().flatten().any(|r| !r.is_empty())
            || self.memcpy.as_ref().is_some_and(|m| m.in_flight > 0)
            || !self.backlog.is_empty()
            || !self.after_commit.is_empty()
            || self.awaits_device()
            || self.awaiting_peers()
            || !self.cross.is_empty()
            || !self.rmdirs.is_empty()
            || !self.outbox.is_idle()
            || self.shard.has_ready_follow_ups()
            || self.shard.has_trims()
            || self.shard.failure().is_some()
            || (!dirty_before && self.dirty_since.is_some());
        if busy {
            self.bells[self.id as usize].ring_always();
        }
    }

    /// One pass over new connections, connections, rings and the commit; returns
    /// the work done.
    fn round(&mut self) -> usize {
        let mut work = self.take_new_conns();
        for slot in 0..self.conns.len() {
            work += self.serve_conn(slot);
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
            // do, and runs again in a later round; after TRIM_STOPS_MAX stops
            // in a row it waits instead.
            self.shard.set_defer_misses(self.trim_stops < TRIM_STOPS_MAX);
            let stepped = self.shard.trim_step();
            self.shard.set_defer_misses(false);
            match stepped {
                Ok(n) => {
                    work += n;
                    self.trim_stops = 0;
                }
                Err(FsError::TryAgain) if self.shard.take_deferred().is_some() => {
                    self.trim_stops += 1;
                }
                Err(e) => log::error!("worker {}: freeing file data: {e}", self.id),
            }
            self.mark_dirty();
        }
        // Cross-shard steps and trims run shard operations outside `exec`.
        self.shard.end_request();
        work + self.drive_commit()
    }

    /// Moves the group commit along beside the requests: answers what a
    /// finished commit covered, and starts the next one when replies wait for
    /// it or the oldest change is `commit_interval` old. Returns the work done.
    fn drive_commit(&mut self) -> usize {
        let mut work = 0;
        // Also starts the checkpoint a short log needs when the requests that
        // found it full stopped for it instead of starting it.
        self.shard.poll_checkpoint();
        if self.shard.committing() {
            self.shard.poll_commit();
            if self.shard.committing() {
                return 0;
            }
            self.publish_usage();
            work += 1;
        }
        work += self.release_committed();
        let due = !self.after_commit.is_empty()
            || self.outbox.holds_wait_for_commit(&self.shard)
            || self.intents_wait_for_commit()
            || self
                .dirty_since
                .is_some_and(|t| self.now.duration_since(t) >= self.opts.commit_interval);
        if due && self.shard.failure().is_none() {
            self.dirty_since = None;
            // A failure is seen by the caller (`Shard::failure`).
            let _ = self.shard.start_commit();
            work += 1;
            if !self.shard.committing() {
                // Nothing to write: finished at once.
                work += self.release_committed();
            }
        }
        work
    }

    /// Whether a cross-shard rename or bigdir rmdir waits for its intent to
    /// be durable before it asks another shard.
    fn intents_wait_for_commit(&self) -> bool {
        let done = self.shard.commits_done();
        self.cross.wait_for_commit(done) || self.rmdirs.wait_for_commit(done)
    }

    /// Sends the held replies whose commit finished.
    fn release_committed(&mut self) -> usize {
        let done = self.shard.commits_done();
        // Every round asks: most find nothing ready, and need not rebuild the list.
        if !self.after_commit.iter().any(|h| h.0 <= done) {
            return 0;
        }
        let (ready, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.after_commit).into_iter().partition(|h| h.0 <= done);
        self.after_commit = waiting;
        let n = ready.len();
        for (_, origin, conn, buf) in ready {
            self.route_reply(origin, conn, buf);
        }
        n
    }

    /// Holds `buf` until the commit that covers what happened so far finished.
    fn reply_after_commit(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        self.after_commit.push((self.shard.next_commit(), origin, conn, buf));
    }

    fn take_new_conns(&mut self) -> usize {
        let mut n = 0;
        while let Ok(mut qp) = self.new_conns.try_recv() {
            n += 1;
            for _ in 0..qp.credits() {
                if qp.post_recv(Vec::new()).is_err() {
                    break;
                }
            }
            let slot = match self.conns.iter().position(Option::is_none) {
                Some(s) => s,
                None => {
                    self.conns.push(None);
                    self.conns.len() - 1
                }
            };
            if let Err(e) = self.epoll.add(qp.wait_fd(), READ, slot as u64 + 1) {
                log::warn!("worker {}: cannot watch {}: {e}", self.id, qp.peer());
                continue;
            }
            if let Some(key) = self.inline_key {
                qp.set_inline_key(key);
            }
            log::info!("worker {}: serving {} over {:?}", self.id, qp.peer(), qp.backend());
            let gen = self.next_gen;
            self.next_gen = self.next_gen.wrapping_add(1).max(1);
            let peer_is_server = qp.peer_is_server();
            self.conns[slot] =
                Some(ConnState { qp, gen, client: None, peer_is_server, refused_internal: 0 });
        }
        n
    }

    fn serve_conn(&mut self, slot: usize) -> usize {
        let Some(conn) = self.conns[slot].as_mut() else { return 0 };
        let mut done = std::mem::take(&mut self.completions);
        done.clear();
        let polled = conn.qp.poll_cq(&mut done);
        let me = ConnRef { slot: slot as u32, gen: conn.gen, sum: link_sum(conn.qp.backend()) };
        let mut work = 0;
        for c in done.drain(..) {
            work += 1;
            match c {
                Completion::Send { buf, .. } => {
                    if let Some(conn) = self.conns[slot].as_mut() {
                        let _ = conn.qp.post_recv(buf);
                    }
                }
                Completion::Recv { buf } => {
                    self.on_request(me, buf);
                }
                Completion::Write { .. } | Completion::Read { .. } | Completion::Imm { .. } => {}
            }
        }
        self.completions = done;
        if let Err(e) = polled {
            self.drop_conn(slot, &e.to_string());
        }
        work
    }

    fn drop_conn(&mut self, slot: usize, reason: &str) {
        if let Some(conn) = self.conns[slot].take() {
            let _ = self.epoll.delete(conn.qp.wait_fd());
            if let Some(client) = conn.client {
                let mut reg = self.clients.lock().expect("client registry lock");
                let sum = link_sum(conn.qp.backend());
                let me = ConnRef { slot: slot as u32, gen: conn.gen, sum };
                if reg.get(&client) == Some(&(self.id, me)) {
                    reg.remove(&client);
                }
            }
            log::info!("worker {}: connection from {} ended: {reason}", self.id, conn.qp.peer());
        }
    }

    /// A request frame arrived on one of this worker's connections.
    fn on_request(&mut self, conn: ConnRef, buf: Vec<u8>) {
        let header = match FrameHeader::decode(&buf) {
            Ok(h) => h,
            Err(e) => return self.close(conn, &format!("bad request header: {e}")),
        };
        if header.client.0 != 0 {
            if let Some(state) = self.conns[conn.slot as usize].as_mut() {
                if state.client.is_none() {
                    state.client = Some(header.client);
                    let mut reg = self.clients.lock().expect("client registry lock");
                    reg.insert(header.client, (self.id, conn));
                }
            }
        }
        if server_internal(header.opcode) {
            if let Some(state) = self.conns[conn.slot as usize].as_mut() {
                if !state.peer_is_server {
                    state.refused_internal += 1;
                    if state.refused_internal == 1 {
                        log::warn!(
                            "worker {}: refused server-internal request (opcode {}) from client {} \
                             at {}: only servers send it (later ones are refused silently)",
                            self.id,
                            header.opcode,
                            header.client,
                            state.qp.peer()
                        );
                    }
                    let reply = error_reply(header, FsError::NotPermitted);
                    return self.send_reply(conn, reply);
                }
            }
        }
        let workers = self.ring_out.len();
        let target = header.worker as usize;
        if target >= workers {
            let error = FsError::Invalid(format!(
                "request for worker {target}, but this server runs {workers} workers: \
                 the client's cluster view is stale"
            ));
            let reply = error_reply(header, error);
            return self.send_reply(conn, reply);
        }
        if target == self.id as usize {
            if let Some(reply) = self.process_for(self.id, conn, buf) {
                self.send_reply(conn, reply);
            }
            return;
        }
        let task = Task::Request { from: self.id, conn, buf };
        self.push(target as u16, task);
    }

    /// Runs a request frame that came on `origin`'s connection `conn` on this
    /// worker's shard; returns the reply frame, or `None` when the reply waits for
    /// the next commit.
    fn process_for(&mut self, origin: u16, conn: ConnRef, mut buf: Vec<u8>) -> Option<Vec<u8>> {
        // Behind a request of the same connection that waits for an inode
        // page: runs after it, so one connection's requests keep their order.
        if self.stopped.holds(origin, conn) {
            self.stopped.queue_behind(origin, conn, buf);
            return None;
        }
        let header = FrameHeader::decode(&buf).expect("checked by the receiver");
        if header.flags & pfs_core::wire::FLAG_REPLY == 0
            && [Opcode::Write as u16, Opcode::WriteData as u16].contains(&header.opcode)
        {
            return self.process_write(origin, conn, buf);
        }
        // The transport checked the frame's checksum when it received it.
        let frame = match Frame::decode_received(&buf) {
            Ok(f) => f,
            Err(e) => {
                // The header passed its checks; a body that does not decode is the
                // client's bug. Answer with the reason rather than guess.
                let header = FrameHeader::decode(&buf).expect("checked by the receiver");
                return Some(error_reply(header, FsError::Invalid(format!("bad request: {e}"))));
            }
        };
        let Body::Request(req) = frame.body else {
            let header = FrameHeader::decode(&buf).expect("checked by the receiver");
            return Some(error_reply(header, FsError::Invalid("a reply sent as a request".into())));
        };
        let op = req.opcode();
        if let Request::TokenAcquire { dir, mode } = req {
            let (grant, revoked) = self.tokens.acquire(dir, frame.client, mode, self.now);
            for holder in revoked {
                self.notify(holder, Request::TokenInvalidate { dir });
            }
            let reply = Frame {
                request_id: frame.request_id,
                client: frame.client,
                body: Body::Reply(Reply::TokenAcquire(grant)),
            };
            buf.clear();
            reply.encode(&mut buf).expect("a token reply always encodes");
            return Some(buf);
        }
        if let Request::TokenRelease { dir, mode } = req {
            self.tokens.release(dir, frame.client, mode);
            let reply = Frame {
                request_id: frame.request_id,
                client: frame.client,
                body: Body::Reply(Reply::TokenRelease),
            };
            buf.clear();
            reply.encode(&mut buf).expect("a token reply always encodes");
            return Some(buf);
        }
        // A name that is the source of a cross-shard rename under way is
        // locked until the rename ends (`Renames::names_moving`).
        if !self.cross.is_empty() && self.cross.names_moving(&req) {
            let reply = Frame {
                request_id: frame.request_id,
                client: frame.client,
                body: Body::Error { op, error: FsError::TryAgain },
            };
            return Some(reply.to_bytes().expect("an error frame always encodes"));
        }
        // The rmdir of a directory whose name was moved here by a rename while
        // its inode (and so its entries) stayed home: only a seal transaction
        // can check its emptiness there, so it runs as one (as a bigdir's).
        let req = match req {
            Request::Rmdir { parent, name } if self.names_remote_dir(parent, &name) => {
                Request::RmdirBigDir { parent, name }
            }
            other => other,
        };
        if let Request::RmdirBigDir { parent, name } = req {
            let waiter = Waiter {
                origin,
                conn,
                request_id: frame.request_id,
                client: frame.client,
                give_up: patience(self.now),
            };
            let mut rmdirs = std::mem::take(&mut self.rmdirs);
            let started = rmdirs.start(self, waiter, parent, name);
            self.rmdirs = rmdirs;
            return match started {
                Ok(()) => None,
                Err(error) => {
                    let reply = Frame {
                        request_id: frame.request_id,
                        client: frame.client,
                        body: Body::Error { op, error },
                    };
                    Some(reply.to_bytes().expect("an error frame always encodes"))
                }
            };
        }
        if let Request::RenameCross {
            parent,
            name,
            new_parent,
            new_name,
            flags,
            target_server,
            target_worker,
        } = req
        {
            let waiter = Waiter {
                origin,
                conn,
                request_id: frame.request_id,
                client: frame.client,
                give_up: patience(self.now),
            };
            let target = (target_server, target_worker);
            let mut cross = std::mem::take(&mut self.cross);
            let started =
                cross.start(self, waiter, parent, name, new_parent, new_name, flags, target);
            self.cross = cross;
            return match started {
                Ok(()) => None,
                Err(error) => {
                    let reply = Frame {
                        request_id: frame.request_id,
                        client: frame.client,
                        body: Body::Error { op, error },
                    };
                    Some(reply.to_bytes().expect("an error frame always encodes"))
                }
            };
        }
        if pfs_core::failpoint::fire("worker.panic") {
            panic!("failpoint worker.panic, before {op:?}");
        }
        // A read that must go to the device is answered when it is done; one
        // whose inode page is not in memory, or whose pages are being written,
        // stops and runs again once they are (`Shard::set_defer_misses`).
        let tries = self.stopped.tries();
        self.shard.set_defer_misses(self.stopped.may_stop(tries));
        let before = self.shard.background_progress();
        let started = self.start_read(req);
        self.shard.set_defer_misses(false);
        let req = match started {
            Ok(started) => {
                self.stopped.take_tries();
                if let Some(on) = self.shard.take_deferred() {
                    self.stopped.stopped(origin, conn, buf, tries, on, before);
                    return None;
                }
                let p = PendingRead {
                    origin,
                    conn,
                    request_id: frame.request_id,
                    client: frame.client,
                    op,
                    buf,
                };
                let result = match started {
                    Ok(ReadStart::Done(data)) => Ok(data),
                    Ok(ReadStart::Pending(id)) => {
                        self.reads.insert(id, p);
                        return None;
                    }
                    Ok(ReadStart::Gather(g)) if self.can_gather(origin, conn, g.len()) => {
                        self.send_gathered(p, g);
                        return None;
                    }
                    Ok(ReadStart::Gather(g)) => Ok(self.gathered_reply(g)),
                    Err(e) => Err(e),
                };
                return self.read_reply(p, result);
            }
            Err(req) => req,
        };
        let mutates = is_mutation(&req);
        let mark = self.shard.txn_id_mark();
        // A request does not wait for an inode page being read: it stops
        // before it changed anything and runs again once the page is in
        // memory. Metadata requests only (a data request's pieces are read
        // in the background anyway), and those whose reads all come before
        // their changes.
        let deferrable = matches!(
            req,
            Request::Lookup { .. }
                | Request::LookupData { .. }
                | Request::GetAttr { .. }
                | Request::Open { .. }
                | Request::GetXattr { .. }
                | Request::ListXattr { .. }
                | Request::ReadLink { .. }
                | Request::LayoutGet { .. }
                | Request::GetParent { .. }
                | Request::SetAttr { .. }
                | Request::Create { .. }
                | Request::Mkdir { .. }
                | Request::Mknod { .. }
                | Request::Symlink { .. }
                | Request::Unlink { .. }
                | Request::Rmdir { .. }
                | Request::Rename { .. }
                | Request::SetXattr { .. }
                | Request::RemoveXattr { .. }
                | Request::ReadDir { .. }
                | Request::XRenameTarget { .. }
                | Request::TxnForget { .. }
                | Request::SealDir { .. }
                | Request::DropInode { .. }
        );
        let tries = self.stopped.take_tries();
        self.shard.set_defer_misses(deferrable && self.stopped.may_stop(tries));
        let before = self.shard.background_progress();
        let (result, durability) = execute(&mut self.shard, req);
        self.shard.set_defer_misses(false);
        if let Some(on) = self.shard.take_deferred() {
            self.stopped.stopped(origin, conn, buf, tries, on, before);
            return None;
        }
        let reply = (frame.request_id, frame.client, op, result);
        self.finish_request(origin, conn, mutates, mark, reply, durability, buf)
    }

    /// A `Write` or `WriteData` frame: the data is written to the device
    /// buffer straight from the frame (`Frame::decode_write`), and the reply
    /// reuses the frame's buffer.
    fn process_write(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) -> Option<Vec<u8>> {
        let mark = self.shard.txn_id_mark();
        // As a metadata request: a write whose inode page, or the old bytes of
        // the block it merges into, are not in memory stops before it changed
        // anything and runs again once they are.
        let tries = self.stopped.take_tries();
        let (request_id, client, op, result) = match Frame::decode_write(&buf) {
            Some(Ok((request_id, client, w))) => {
                if pfs_core::failpoint::fire("worker.panic") {
                    panic!("failpoint worker.panic, before {:?}", w.opcode());
                }
                self.shard.set_defer_misses(self.stopped.may_stop(tries));
                let before = self.shard.background_progress();
                let result = execute_write(&mut self.shard, &w);
                self.shard.set_defer_misses(false);
                if let Some(on) = self.shard.take_deferred() {
                    self.stopped.stopped(origin, conn, buf, tries, on, before);
                    return None;
                }
                (request_id, client, w.opcode(), result)
            }
            Some(Err(e)) => {
                let header = FrameHeader::decode(&buf).expect("checked by the receiver");
                return Some(error_reply(header, FsError::Invalid(format!("bad request: {e}"))));
            }
            None => unreachable!("the caller sends write frames only"),
        };
        let reply = (request_id, client, op, result);
        self.finish_request(origin, conn, true, mark, reply, Durability::Now, buf)
    }

    /// After a request ran: schedules the commit of a change, encodes the
    /// reply into `buf`, and holds it for the follow-ups it waits for or for
    /// the commit (`None`), or returns it to send now.
    #[allow(clippy::too_many_arguments)]
    fn finish_request(
        &mut self,
        origin: u16,
        conn: ConnRef,
        mutates: bool,
        mark: u64,
        (request_id, client, op, result): (RequestId, ClientId, Opcode, FsResult<Reply>),
        durability: Durability,
        buf: Vec<u8>,
    ) -> Option<Vec<u8>> {
        // Follow-ups whose effect the client sees at once hold its reply.
        let held: Vec<u64> = self
            .shard
            .follow_ups_since(mark)
            .filter(|u| crate::follow::holds_reply(&u.op))
            .map(|u| u.id)
            .collect();
        if mutates && result.is_ok() && self.dirty_since.is_none() {
            self.dirty_since = Some(self.now);
        }
        let body = match result {
            Ok(reply) => Body::Reply(reply),
            Err(error) => Body::Error { op, error },
        };
        let reply = Frame { request_id, client, body };
        let buf = Self::encode_reply(reply, buf);
        if !held.is_empty() {
            self.outbox.hold_reply(self.now, held, origin, conn, buf);
            return None;
        }
        if durability == Durability::AfterCommit {
            self.reply_after_commit(origin, conn, buf);
            return None;
        }
        Some(buf)
    }

    /// Starts `req` if it is a data read; gives any other request back. A
    /// read that must wait for the device is answered by
    /// [`send_finished_reads`](Self::send_finished_reads). The bytes land
    /// after room for the reply's header, so the reply is sealed around them
    /// (`read_reply`) instead of copied into a frame.
    fn start_read(&mut self, req: Request) -> Result<FsResult<ReadStart>, Request> {
        let shape = ReadShape { prefix: READ_REPLY_PREFIX, pad: 0, background: true, gather: true };
        let started = match req {
            Request::Read { ino, fh: _, offset, size, blocks } => {
                self.shard.read_start(ino, offset, size as usize, blocks, shape)
            }
            Request::ReadData { ino, layout, offset, size, blocks } => {
                self.shard.read_data_start(ino, layout, offset, size as usize, blocks, shape)
            }
            other => return Err(other),
        };
        // As `execute` does: an operation cut halfway fails the shard.
        self.shard.end_request();
        Ok(started)
    }

    /// Whether the reply to a read of `len` bytes that came on this worker's
    /// connection `conn` (`origin`) may be sent from the read-ahead buffers
    /// straight into the connection's shared-memory ring
    /// ([`ReadStart::Gather`]): nothing is queued before it there and the
    /// ring has room for it.
    fn can_gather(&self, origin: u16, conn: ConnRef, len: usize) -> bool {
        origin == self.id
            && self
                .conns
                .get(conn.slot as usize)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.gen == conn.gen && c.qp.gather_room() >= READ_REPLY_PREFIX + len)
    }

    /// A read that read-ahead buffers held whole, for a connection it cannot
    /// go to straight (another worker's, a full ring, a network link): its
    /// bytes copied once into a reply buffer, after room for the header. Not
    /// zeroed first, as a buffer the device fills must be.
    fn gathered_reply(&mut self, g: Gathered) -> Vec<u8> {
        let mut out = Vec::with_capacity(READ_REPLY_PREFIX + g.len());
        out.resize(READ_REPLY_PREFIX, 0);
        let mut parts = Vec::with_capacity(8);
        g.slices(&mut parts);
        for part in parts {
            out.extend_from_slice(part);
        }
        self.shard.gather_done(g);
        out
    }

    /// Sends the reply to read `p` from the read-ahead buffers `g` lent,
    /// straight into its connection's ring (checked by
    /// [`can_gather`](Self::can_gather)), then gives the buffers back. The
    /// request's buffer goes back to the connection's receive queue, as a sent
    /// reply's does.
    fn send_gathered(&mut self, p: PendingRead, g: Gathered) {
        let slot = p.conn.slot as usize;
        let header = Frame::read_reply_header(g.len(), p.request_id, p.client, p.op);
        let mut failed = None;
        match (header, self.conns.get_mut(slot).and_then(Option::as_mut)) {
            (Ok(header), Some(state)) if state.gen == p.conn.gen => {
                let mut parts = Vec::with_capacity(8);
                parts.push(&header[..]);
                g.slices(&mut parts);
                match state.qp.send_gathered(&parts) {
                    Ok(()) => {
                        let _ = state.qp.post_recv(p.buf);
                    }
                    Err(e) => failed = Some(format!("cannot send a reply: {e}")),
                }
            }
            // The connection closed meanwhile: nobody to answer.
            (Ok(_), _) => {}
            (Err(e), _) => {
                // Not reached: the shard bounds a read's length, and `p.op` is a read.
                let error = FsError::Io(format!("reply does not fit the protocol: {e}"));
                let (origin, conn) = (p.origin, p.conn);
                if let Some(reply) = self.read_reply(p, Err(error)) {
                    self.route_reply(origin, conn, reply);
                }
            }
        }
        self.shard.gather_done(g);
        if let Some(reason) = failed {
            self.drop_conn(slot, &reason);
        }
    }

    /// The background requests finished so far.
    fn progress(&mut self) -> Progress {
        let reads = self.shard.icache_reads_done();
        (reads, self.shard.data_requests_done(), self.shard.commits_done(), self.shard.log_moves())
    }

    /// Runs again the requests that stopped, once what each waits for moved
    /// (in arrival order: one that still waits keeps the later ones of its
    /// connection behind it); returns how many ran.
    fn run_stopped(&mut self) -> usize {
        let now = self.progress();
        let Some(waiting) = self.stopped.take_all(now) else { return 0 };
        let mut ran = 0;
        for w in waiting {
            if !w.ready(now) {
                self.stopped.put_back(w);
                continue;
            }
            ran += 1;
            self.stopped.running(&w);
            let reply = self.process_for(w.origin, w.conn, w.buf);
            self.stopped.take_tries();
            if let Some(reply) = reply {
                self.route_reply(w.origin, w.conn, reply);
            }
        }
        ran
    }

    /// Answers the reads whose device reads finished; returns how many.
    fn send_finished_reads(&mut self) -> usize {
        let finished = self.shard.take_finished_reads();
        let n = finished.len();
        for (id, result) in finished {
            let Some(p) = self.reads.remove(&id) else { continue };
            let (origin, conn) = (p.origin, p.conn);
            if let Some(buf) = self.read_reply(p, result) {
                self.route_reply(origin, conn, buf);
            }
        }
        n
    }

    /// The reply to read `p` whose output is `result`: on success, the bytes
    /// after `READ_REPLY_PREFIX` bytes of room, sealed into a frame in place
    /// by the memcpy pool when large (`None`: the pool sends it) or here; on
    /// failure, an error reply in the request's buffer.
    fn read_reply(&mut self, p: PendingRead, result: FsResult<Vec<u8>>) -> Option<Vec<u8>> {
        let result = result.and_then(|out| {
            let len = out.len() - READ_REPLY_PREFIX;
            if len > pfs_core::wire::MAX_IO_BYTES {
                return Err(FsError::Io(format!(
                    "reply does not fit the protocol: {len} bytes of read data"
                )));
            }
            Ok(out)
        });
        let mut out = match result {
            Ok(out) => out,
            Err(error) => {
                let reply = Frame {
                    request_id: p.request_id,
                    client: p.client,
                    body: Body::Error { op: p.op, error },
                };
                let mut buf = p.buf;
                buf.clear();
                reply.encode(&mut buf).expect("an error frame always encodes");
                return Some(buf);
            }
        };
        let (request_id, client, op) = (p.request_id, p.client, p.op);
        let sum = p.conn.sum;
        if let Some(port) = self.memcpy.as_mut() {
            if out.len() - READ_REPLY_PREFIX >= port.threshold_bytes {
                let (worker, origin, conn) = (self.id, p.origin, p.conn);
                let job = Job { worker, origin, conn, request_id, client, op, sum, buf: out };
                match port.offer(job) {
                    None => return None,
                    // The pool's queue is full: seal it here.
                    Some(job) => out = job.buf,
                }
            }
        }
        Frame::seal_read_reply(&mut out, request_id, client, op, sum).expect("size checked above");
        Some(out)
    }

    /// Encodes `reply` into `buf` (reused). A reply too large for the
    /// protocol becomes an error reply.
    fn encode_reply(reply: Frame, mut buf: Vec<u8>) -> Vec<u8> {
        let (request_id, client, op) = (reply.request_id, reply.client, reply.opcode());
        buf.clear();
        if let Err(e) = reply.encode(&mut buf) {
            let error = FsError::Io(format!("reply does not fit the protocol: {e}"));
            let fallback = Frame { request_id, client, body: Body::Error { op, error } };
            buf.clear();
            fallback.encode(&mut buf).expect("an error frame always encodes");
        }
        buf
    }

    fn serve_rings(&mut self) -> usize {
        let mut work = 0;
        for from in 0..self.ring_in.len() {
            // A bounded batch per ring keeps one busy peer from starving the rest.
            for _ in 0..64 {
                let Some(ring) = self.ring_in[from].as_mut() else { break };
                let Ok(task) = ring.pop() else { break };
                work += 1;
                match task {
                    Task::Request { from, conn, buf } => {
                        if let Some(reply) = self.process_for(from, conn, buf) {
                            self.push(from, Task::Reply { conn, buf: reply });
                        }
                    }
                    Task::Reply { conn, buf } => self.send_reply(conn, buf),
                }
            }
        }
        work
    }

    /// Commits the shard, waiting for it, and sends every reply that waited
    /// for a commit (on a failed shard: an error instead). For the drain.
    fn commit_and_release(&mut self) {
        let result = self.shard.commit();
        self.dirty_since = None;
        self.publish_usage();
        let held = std::mem::take(&mut self.after_commit);
        for (_, origin, conn, mut buf) in held {
            if let Err(e) = &result {
                // The change may not be durable: the caller must not be told it is.
                let header = FrameHeader::decode(&buf).expect("encoded here");
                let failed = error_reply(header, FsError::Io(format!("commit failed: {e}")));
                buf = failed;
            }
            self.route_reply(origin, conn, buf);
        }
    }

    /// Sends a reply to connection `conn` of worker `origin` (this one or another).
    fn route_reply(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        if origin == self.id {
            self.send_reply(conn, buf);
        } else {
            self.push(origin, Task::Reply { conn, buf });
        }
    }

    /// Whether the connection `waiter` came on is still open (the registry
    /// forgets a client's connection when it ends). A caller without a client
    /// id is not in the registry: it counts as connected.
    fn is_connected(&self, waiter: &Waiter) -> bool {
        if waiter.client.0 == 0 {
            return true;
        }
        let reg = self.clients.lock().expect("client registry lock");
        reg.get(&waiter.client) == Some(&(waiter.origin, waiter.conn))
    }

    /// Sends `req` unasked to `client` on its connection, wherever it is served.
    fn notify(&mut self, client: ClientId, req: Request) {
        let Some((worker, conn)) =
            self.clients.lock().expect("client registry lock").get(&client).copied()
        else {
            return; // Not connected here: its lease runs out by itself.
        };
        let frame = Frame { request_id: RequestId(0), client, body: Body::Request(req) };
        let buf = frame.to_bytes().expect("a notification always encodes");
        self.route_reply(worker, conn, buf);
    }

    /// Notes that the shard changed, so the commit timer runs.
    fn mark_dirty(&mut self) {
        self.dirty_since.get_or_insert(self.now);
    }

    fn push(&mut self, target: u16, task: Task) {
        if !self.backlog.is_empty() {
            self.backlog.push_back((target, task));
            return;
        }
        let ring = self.ring_out[target as usize].as_mut().expect("no ring to self");
        match ring.push(task) {
            Ok(()) => self.bells[target as usize].ring(),
            Err(rtrb::PushError::Full(task)) => self.backlog.push_back((target, task)),
        }
    }

    /// Retries tasks a full ring refused, in order.
    fn flush_backlog(&mut self) -> usize {
        let mut n = 0;
        while let Some((target, _)) = self.backlog.front() {
            let target = *target;
            let ring = self.ring_out[target as usize].as_mut().expect("no ring to self");
            if ring.is_full() {
                break;
            }
            let (_, task) = self.backlog.pop_front().expect("front exists");
            if ring.push(task).is_err() {
                unreachable!("the ring had room and only this thread pushes");
            }
            self.bells[target as usize].ring();
            n += 1;
        }
        n
    }

    /// Sends the replies the memcpy pool finished.
    fn take_copied(&mut self) -> usize {
        let mut work = 0;
        // Bounded by the return queue's depth.
        while let Some(done) = self.memcpy.as_mut().and_then(MemcpyPort::take) {
            work += 1;
            if done.origin == self.id {
                self.send_reply(done.conn, done.buf);
            } else {
                self.push(done.origin, Task::Reply { conn: done.conn, buf: done.buf });
            }
        }
        work
    }

    fn send_reply(&mut self, conn: ConnRef, buf: Vec<u8>) {
        if conn.slot == crate::peers::LOCAL_SLOT {
            // The reply to this worker's own message to another worker.
            return self.peers.deliver_local(conn.gen, buf);
        }
        let Some(state) = self.conns.get_mut(conn.slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if state.gen != conn.gen {
            return; // The connection closed and its slot was reused.
        }
        if let Err(r) = state.qp.post_send(WorkId(0), buf) {
            let reason = format!("cannot send a reply: {}", r.error);
            self.drop_conn(conn.slot as usize, &reason);
        }
    }

    fn close(&mut self, conn: ConnRef, reason: &str) {
        if let Some(state) = self.conns.get_mut(conn.slot as usize).and_then(Option::as_mut) {
            if state.gen == conn.gen {
                state.qp.close(reason);
                log::warn!("worker {}: closing {}: {reason}", self.id, state.qp.peer());
            }
        }
    }

    /// Workers per server: this server's, which every server shares (the
    /// cluster refuses a server whose count differs), known before the view.
    fn workers(&self) -> u32 {
        self.ring_out.len() as u32
    }

    /// Whether `parent/name` is a directory whose inode lives on another shard.
    fn names_remote_dir(&mut self, parent: pfs_core::InodeId, name: &[u8]) -> bool {
        match self.shard.lookup(parent, name) {
            Ok(e) => e.kind == pfs_core::FileType::Directory && !self.shard.has_inode(e.ino),
            Err(_) => false,
        }
    }

    /// Whether a cross-shard step waits for a peer server's reply.
    fn awaiting_peers(&self) -> bool {
        self.cross.awaiting_peer()
            || self.rmdirs.awaiting_peer()
            || self.outbox.awaiting_peer()
            || self.sweep.awaiting_peer()
    }

    /// Prepares to sleep until work arrives: arms the doorbell and the
    /// connections and looks once more. Returns how long to sleep in the epoll
    /// set (the caller lets go of the worker's lock meanwhile), or `None` when
    /// work is waiting or the worker waited for the device itself here.
    /// [`park_end`](Self::park_end) follows either way.
    fn park_begin(&mut self) -> Option<Duration> {
        self.tokens.expire(self.now);
        let bell = &self.bells[self.id as usize];
        bell.parked.store(true, Ordering::SeqCst);
        // Re-check after announcing the park: a producer that pushed before it saw
        // the flag did not ring.
        let rings_busy = self.ring_in.iter().flatten().any(|r| !r.is_empty());
        let conns_busy = self.conns.iter_mut().flatten().any(|c| !c.qp.prepare_wait());
        let copied = self.memcpy.as_ref().is_some_and(MemcpyPort::has_done);
        // Finished device requests are collected first, so the device's
        // descriptor wakes the park only for new ones; then the commit takes
        // its step (a request it submits now wakes the park when it finishes).
        // A device without a descriptor cannot wake it: then a commit under
        // way is polled, not slept on.
        self.shard.poll_device();
        self.shard.poll_commit();
        self.shard.poll_checkpoint();
        self.shard.poll_data_writes();
        let read = self.shard.has_finished_reads()
            || (!self.stopped.is_empty() && {
                let now = self.progress();
                self.stopped.moved(now)
            });
        let done = self.shard.commits_done();
        let released = self.after_commit.iter().any(|h| h.0 <= done);
        let device_wakes = self.shard.completion_fd().is_some();
        let device_polled = self.awaits_device() && !device_wakes;
        if !rings_busy
            && !conns_busy
            && !copied
            && self.backlog.is_empty()
            && !released
            && !read
            && !device_polled
            && !self.shard.checkpoint_wants_cpu()
            && self.shard.failure().is_none()
        {
            if self.awaits_device() && self.shard.wait_device() {
                // Nothing to serve but the commit's step or reads: wait for
                // the device itself, as a blocking commit or read did. A
                // request that arrives meanwhile waits for one device request.
                return None;
            }
            let timeout = match self.dirty_since {
                Some(t) => (t + self.opts.commit_interval).saturating_duration_since(self.now),
                None => PARK_MAX,
            };
            return Some(timeout.min(PARK_MAX));
        } else if device_polled {
            std::thread::yield_now();
        }
        None
    }

    /// Ends a park begun by [`park_begin`](Self::park_begin).
    fn park_end(&mut self) {
        let bell = &self.bells[self.id as usize];
        bell.parked.store(false, Ordering::SeqCst);
        bell.wake.drain();
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

    /// Whether a commit step or a read waits for the device.
    fn awaits_device(&self) -> bool {
        self.shard.committing()
            || self.shard.checkpointing()
            || !self.reads.is_empty()
            || !self.stopped.is_empty()
            || self.cross.has_stopped()
            || self.rmdirs.has_stopped()
            || self.outbox.has_stopped()
            || self.sweep.has_stopped()
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

/// An error reply to the request whose header is `header`.
fn error_reply(header: FrameHeader, error: FsError) -> Vec<u8> {
    // An unknown opcode never reaches here: the transport decoded the header and
    // `Frame::decode` refuses unknown opcodes before a request runs.
    let op =
        pfs_core::wire::Opcode::from_u16(header.opcode).unwrap_or(pfs_core::wire::Opcode::StatFs);
    let frame = Frame {
        request_id: RequestId(header.request_id.0),
        client: ClientId(header.client.0),
        body: Body::Error { op, error },
    };
    frame.to_bytes().expect("an error frame always encodes")
}

fn wall_clock_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
/// Messages to other shards (`peers.rs`): over the rings to a worker of this
/// server, over a connection to another.
impl<D: Device> Worker<D> {
    /// The server this worker belongs to.
    fn own_server(&self) -> ServerId {
        ServerId(self.shard.id().0 / self.workers())
    }

    /// Sends `req` to `worker` of `server`: over the rings when it is another
    /// worker of this server, else over a connection ([`Peers::send`]); its reply comes with
    /// [`peer_poll`](Self::peer_poll).
    fn peer_send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError> {
        if server != self.own_server() || worker.0 == u32::from(self.id) {
            return self.peers.send(server, worker, req);
        }
        let (request_id, conn, buf) = self.peers.local_message(worker, req)?;
        self.push(worker.0 as u16, Task::Request { from: self.id, conn, buf });
        Ok(request_id)
    }

    /// The reply to `id`, sent with [`peer_send`](Self::peer_send) to
    /// `server`, if it came: `Ok(None)` while waiting.
    fn peer_poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String> {
        self.peers.reply(server, id)
    }
}

impl<D: Device> Host<D> for Worker<D> {
    fn worker_id(&self) -> u16 {
        self.id
    }

    fn now(&self) -> Instant {
        self.now
    }

    fn shard(&mut self) -> &mut Shard<D> {
        &mut self.shard
    }

    fn workers(&self) -> u32 {
        Worker::workers(self)
    }

    fn shape(&self) -> Option<(u32, u32)> {
        self.peers.shape()
    }

    fn send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError> {
        self.peer_send(server, worker, req)
    }

    fn poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String> {
        self.peer_poll(server, id)
    }

    fn forget_conn(&mut self, server: ServerId) {
        self.peers.forget_conn(server);
    }

    fn connected(&self, w: &Waiter) -> bool {
        self.is_connected(w)
    }

    fn answer(&mut self, w: Waiter, body: Body) {
        let frame = Frame { request_id: w.request_id, client: w.client, body };
        let buf = frame.to_bytes().expect("a reply to a multi-shard step always encodes");
        self.reply_after_commit(w.origin, w.conn, buf);
    }

    fn changed(&mut self) {
        self.mark_dirty();
    }

    fn send_reply(&mut self, origin: u16, conn: ConnRef, buf: Vec<u8>) {
        self.route_reply(origin, conn, buf);
    }
}
