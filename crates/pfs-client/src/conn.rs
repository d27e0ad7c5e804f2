//! One connection to one server, shared by the client's threads: sends are
//! serialised by a lock, and each caller waits for its own reply by request id
//! without holding the lock while it sleeps.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pfs_core::wire::{Body, Frame, Reply, Request, WriteRef};
use pfs_core::{ClientId, FsError, FsResult, RequestId};
use pfs_net::{ClusterKey, NetError, RpcClient, RpcOptions};

use crate::addrs::ServerAddrs;

/// Longest sleep between two looks at the connection while waiting for a reply.
const WAIT_SLICE: Duration = Duration::from_millis(2);
/// Most rounds of a parked worker a client thread runs for one request
/// ([`Conn::exchange`]) before it waits the usual way.
const INLINE_ROUNDS: usize = 8;
/// Largest write whose work a client thread does itself ([`Conn::send_write`]).
const INLINE_WRITE_MAX: usize = 16 << 10;

/// A server connection.
#[derive(Debug)]
pub struct Conn {
    rpc: Mutex<RpcClient>,
    /// Which server this is and where to ask for its address again when it
    /// cannot be reached ([`follow`](Self::follow)).
    follow: Option<(usize, Arc<ServerAddrs>)>,
    /// Pipelined writes sent and not yet reaped, over every open file. A reply
    /// holds its credit until its owner reaps it, and an owner may be parked (the
    /// kernel serialises writes to one inode), so these are kept to half the
    /// credits: the other half always serves calls whose caller is waiting.
    pipelined: AtomicUsize,
    /// How long a caller polls for its reply before it parks.
    reply_spin: Duration,
    /// Requests answered by worker rounds run on the caller's thread.
    inline_answers: AtomicU64,
}

/// What carries a server connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    /// The backend.
    pub backend: pfs_net::Backend,
    /// Slots of slot RPC, when it is on.
    pub slots: Option<u32>,
    /// Frames sent one-sided into the server's inbox, and replies taken out of ours.
    pub one_sided: (u64, u64),
}

/// How a wait for an answer ended.
#[derive(Debug)]
pub enum Waited {
    /// The server's reply, or the error it answered with (or a timeout).
    Answer(FsResult<(Reply, u64)>),
    /// The connection went down before the answer came.
    Dropped(FsError),
}

/// A request sent and not yet answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// Its id on the connection.
    pub id: RequestId,
    /// When the caller stops waiting.
    pub deadline: Instant,
    /// Its caller polls for the reply before parking ([`Conn::reply_spin`]):
    /// not for a write of more than [`INLINE_WRITE_MAX`] bytes, whose copy
    /// at the worker alone outlasts the spin.
    pub spin: bool,
}

/// What a poll for the raw reply to `id` found: `None` while it has not come.
fn raw_answer(rpc: &mut RpcClient, id: RequestId) -> Option<Result<Vec<u8>, Waited>> {
    match rpc.poll_raw(id) {
        Ok(Some((buf, _boot))) => Some(Ok(buf)),
        Ok(None) => None,
        Err(e @ NetError::Disconnected { .. }) => Some(Err(Waited::Dropped(net_error(e)))),
        Err(e) => Some(Err(Waited::Answer(Err(net_error(e))))),
    }
}

fn net_error(e: NetError) -> FsError {
    FsError::Io(e.to_string())
}

impl From<RpcClient> for Conn {
    fn from(rpc: RpcClient) -> Conn {
        Conn {
            rpc: Mutex::new(rpc),
            follow: None,
            pipelined: AtomicUsize::new(0),
            reply_spin: Duration::ZERO,
            inline_answers: AtomicU64::new(0),
        }
    }
}

impl Conn {
    /// Connects to the server at `addr`.
    pub fn connect(addr: SocketAddr, key: ClusterKey, opts: RpcOptions) -> FsResult<Conn> {
        let rpc = RpcClient::connect(addr, key, opts).map_err(net_error)?;
        Ok(Conn::from(rpc))
    }

    /// A connection to `addr` made at its first request (the server is down
    /// now; [`RpcClient::connect_later`]).
    pub fn connect_later(addr: SocketAddr, key: ClusterKey, opts: RpcOptions) -> Conn {
        Conn::from(RpcClient::connect_later(addr, key, opts))
    }

    /// While server `server` cannot be reached, asks `addrs` where it listens
    /// now, and connects there from then on.
    pub fn follow(mut self, server: usize, addrs: Arc<ServerAddrs>) -> Conn {
        self.follow = Some((server, addrs));
        self
    }

    /// Points the connection at where the master says its server listens,
    /// if that moved (called while the server cannot be reached).
    fn follow_move(&self, deadline: Instant) {
        let Some((server, addrs)) = &self.follow else { return };
        let budget = deadline.saturating_duration_since(Instant::now());
        if let Some(addr) = addrs.lookup(*server, budget) {
            self.rpc.lock().expect("connection lock").retarget(addr);
        }
    }

    /// Polls up to `spin` for each reply before parking (0, the default: parks
    /// at once).
    pub fn reply_spin(mut self, spin: Duration) -> Conn {
        self.reply_spin = spin;
        self
    }

    /// Most pipelined writes allowed in flight: half the credits, at least one.
    pub fn pipeline_limit(&self) -> usize {
        (self.rpc.lock().expect("connection lock").credits() / 2).max(1)
    }

    /// Takes room for one pipelined write; `false` when the pipeline is full
    /// (reap a write, then try again).
    pub fn reserve_pipelined(&self, limit: usize) -> bool {
        self.pipelined
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
            .is_ok()
    }

    /// Gives back the room of a pipelined write that was reaped or never sent.
    pub fn release_pipelined(&self) {
        let before = self.pipelined.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "released a pipelined write never reserved");
    }

    /// Pipelined writes in flight now.
    pub fn pipelined(&self) -> usize {
        self.pipelined.load(Ordering::Acquire)
    }

    /// The connection as it is now; `None` while it is down.
    pub fn link_info(&self) -> Option<LinkInfo> {
        use pfs_net::QueuePair;
        let rpc = self.rpc.lock().expect("connection lock");
        let link = rpc.qp()?;
        Some(LinkInfo {
            backend: link.backend(),
            slots: link.slots(),
            one_sided: link.one_sided_frames(),
        })
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.rpc.lock().expect("connection lock").addr()
    }

    /// Sends `req` for processing worker `worker`; waits (up to `timeout`) for a
    /// credit or a reconnection.
    pub fn send(&self, req: Request, worker: u16, timeout: Duration) -> FsResult<Sent> {
        let frame =
            Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(req) };
        self.send_by(timeout, |rpc, deadline| rpc.send_to(&frame, worker, deadline))
    }

    /// [`send`](Self::send), but to a server that may be down: while it cannot
    /// be reached, one more try after asking where it listens now, and then
    /// the error, instead of trying again until `timeout` (`statfs` sums the
    /// servers that answer).
    pub fn send_if_reachable(
        &self,
        req: Request,
        worker: u16,
        timeout: Duration,
    ) -> FsResult<Sent> {
        let frame =
            Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(req) };
        self.send_within(timeout, 1, |rpc, deadline| rpc.send_to(&frame, worker, deadline))
    }

    /// Sends `req` and waits for its answer ([`send`](Self::send), then
    /// [`wait_answer`](Self::wait_answer)). On a shared-memory connection to a
    /// server in this process whose worker is parked, this thread runs the
    /// worker's rounds itself until the answer is there, instead of waking the
    /// worker and then sleeping until it wakes this thread ([`pfs_net::inline`]).
    pub fn exchange(&self, req: Request, worker: u16, timeout: Duration) -> FsResult<Waited> {
        self.exchange_by(req, worker, timeout, &mut |conn, rpc, id| {
            conn.answered(rpc.poll_boot(id))
        })
    }

    /// [`exchange`](Self::exchange) that hands over the reply frame as
    /// received ([`wait_raw`](Self::wait_raw)): a data read.
    pub fn exchange_raw(
        &self,
        req: Request,
        worker: u16,
        timeout: Duration,
    ) -> FsResult<Result<RawReply<'_>, Waited>> {
        let got = self.exchange_by(req, worker, timeout, &mut |_, rpc, id| raw_answer(rpc, id))?;
        Ok(got.map(|buf| RawReply { conn: self, buf: Some(buf) }))
    }

    /// Sends `req` and polls for its answer with `poll`, running a parked
    /// worker's rounds on this thread when it may ([`exchange`](Self::exchange)).
    fn exchange_by<T>(
        &self,
        req: Request,
        worker: u16,
        timeout: Duration,
        poll: &mut dyn FnMut(&Conn, &mut RpcClient, RequestId) -> Option<T>,
    ) -> FsResult<T> {
        let frame =
            Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(req) };
        // Not while this client's pipelined writes may be in the worker's
        // hands: the rounds would do their work here, in line, where the
        // worker's own thread overlaps it with this thread's.
        if self.pipelined() == 0 {
            let send = &mut |rpc: &mut RpcClient, deadline| rpc.send_to(&frame, worker, deadline);
            let answer = &mut |rpc: &mut RpcClient, id| poll(self, rpc, id);
            match self.send_inline(timeout, send, answer) {
                Some(Ok(answer)) => {
                    self.inline_answers.fetch_add(1, Ordering::Relaxed);
                    return Ok(answer);
                }
                Some(Err(sent)) => return Ok(self.wait_for(sent, |rpc| poll(self, rpc, sent.id))),
                None => {}
            }
        }
        let sent = self.send_by(timeout, |rpc, deadline| rpc.send_to(&frame, worker, deadline))?;
        Ok(self.wait_for(sent, |rpc| poll(self, rpc, sent.id)))
    }

    /// Requests answered by worker rounds this connection's callers ran
    /// ([`exchange`](Self::exchange)).
    pub fn inline_answers(&self) -> u64 {
        self.inline_answers.load(Ordering::Relaxed)
    }

    /// The worker serving this connection, when a client thread may run its
    /// rounds (a server in this process that offered it).
    fn inline(&self) -> Option<std::sync::Arc<dyn pfs_net::inline::Inline>> {
        let key = self.rpc.lock().expect("connection lock").qp()?.inline_key()?;
        pfs_net::inline::find(key)
    }

    /// When this connection's worker is parked in this process and may be run
    /// here ([`pfs_net::inline`]): sends with `send` (which rings no one), then
    /// runs the worker's rounds until `answer` finds the reply (`Ok`), nothing
    /// moves or [`INLINE_ROUNDS`] ran (`Err`: sent, the answer still to come).
    /// `None` when nothing was sent this way (the caller sends as usual).
    fn send_inline<T>(
        &self,
        timeout: Duration,
        send: &mut dyn FnMut(&mut RpcClient, Instant) -> Result<RequestId, NetError>,
        answer: &mut dyn FnMut(&mut RpcClient, RequestId) -> Option<T>,
    ) -> Option<Result<T, Sent>> {
        if !pfs_net::inline::wanted() {
            return None;
        }
        let mut outcome = None;
        self.inline()?.run_parked(&mut |round| {
            let deadline = Instant::now() + timeout;
            // No credit or no connection: the usual way waits for them.
            let Ok(id) = send(&mut self.rpc.lock().expect("connection lock"), deadline) else {
                return;
            };
            let sent = Sent { id, deadline, spin: true };
            for _ in 0..INLINE_ROUNDS {
                let work = round();
                if let Some(a) = answer(&mut self.rpc.lock().expect("connection lock"), id) {
                    outcome = Some(Ok(a));
                    return;
                }
                if work == 0 {
                    break;
                }
            }
            // Forwarded to another worker, or behind other work: the
            // worker's thread is woken for what is left.
            outcome = Some(Err(sent));
        });
        outcome
    }

    /// [`send`](Self::send) of a write whose data the caller holds: the data is
    /// copied once, into the frame.
    pub fn send_write(
        &self,
        write: &WriteRef<'_>,
        worker: u16,
        timeout: Duration,
    ) -> FsResult<Sent> {
        // A small write: its work is done here, as an inline call's is (a
        // larger one overlaps the worker's thread with this one's instead).
        if write.data.len() <= INLINE_WRITE_MAX {
            let send = &mut |rpc: &mut RpcClient, deadline| rpc.send_write(write, worker, deadline);
            let no_answer = &mut |_: &mut RpcClient, _| None::<()>;
            if let Some(Err(sent)) = self.send_inline(timeout, send, no_answer) {
                return Ok(sent);
            }
        }
        let sent =
            self.send_by(timeout, |rpc, deadline| rpc.send_write(write, worker, deadline))?;
        // A large write's reply comes after the worker copied the data: 256 KiB took
        // longer than the spin, which then only took the core from the
        // worker (the native client's io-easy writes: 8-13% slower with a
        // 50 µs spin on every reply, docs/benchmarks.md forty-first session).
        Ok(Sent { spin: write.data.len() <= INLINE_WRITE_MAX, ..sent })
    }

    /// Sends with `send`, waiting (up to `timeout`) for a credit or a
    /// reconnection.
    fn send_by(
        &self,
        timeout: Duration,
        send: impl FnMut(&mut RpcClient, Instant) -> Result<RequestId, NetError>,
    ) -> FsResult<Sent> {
        self.send_within(timeout, usize::MAX, send)
    }

    /// [`send_by`](Self::send_by), trying again at most `reconnects` times
    /// while the server cannot be reached.
    fn send_within(
        &self,
        timeout: Duration,
        mut reconnects: usize,
        mut send: impl FnMut(&mut RpcClient, Instant) -> Result<RequestId, NetError>,
    ) -> FsResult<Sent> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut rpc = self.rpc.lock().expect("connection lock");
            match send(&mut rpc, deadline) {
                Ok(id) => return Ok(Sent { id, deadline, spin: true }),
                Err(NetError::NoCredit { .. }) if Instant::now() < deadline => {
                    drop(rpc);
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(NetError::Disconnected { .. })
                    if Instant::now() < deadline && reconnects > 0 =>
                {
                    reconnects -= 1;
                    drop(rpc);
                    self.follow_move(deadline);
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err(e) => return Err(net_error(e)),
            }
        }
    }

    /// Waits for the reply to `sent`; an error reply becomes `Err`.
    pub fn wait(&self, sent: Sent) -> FsResult<Reply> {
        self.wait_boot(sent).map(|(r, _)| r)
    }

    /// [`wait`](Self::wait), and the boot id of the server process that answered.
    pub fn wait_boot(&self, sent: Sent) -> FsResult<(Reply, u64)> {
        match self.wait_answer(sent) {
            Waited::Answer(r) => r,
            Waited::Dropped(e) => Err(e),
        }
    }

    /// The answer to `sent` if it has come, without waiting.
    pub fn try_answer(&self, sent: Sent) -> Option<Waited> {
        let polled = self.rpc.lock().expect("connection lock").poll_boot(sent.id);
        self.answered(polled)
    }

    /// What a poll for an answer found: `None` while it has not come.
    fn answered(&self, polled: Result<Option<(Frame, u64)>, NetError>) -> Option<Waited> {
        match polled {
            Ok(Some((frame, boot))) => Some(Waited::Answer(match frame.body {
                Body::Reply(r) => Ok((r, boot)),
                Body::Error { error, .. } => Err(error),
                Body::Request(r) => Err(FsError::Io(format!(
                    "{} answered with a request ({:?})",
                    self.addr(),
                    r.opcode()
                ))),
            })),
            Ok(None) => None,
            Err(e @ NetError::Disconnected { .. }) => Some(Waited::Dropped(net_error(e))),
            Err(e) => Some(Waited::Answer(Err(net_error(e)))),
        }
    }

    /// Waits for the answer to `sent`: the reply or the server's error, or
    /// `Dropped` when the connection went down first (a restarted server; the
    /// request may or may not have run).
    pub fn wait_answer(&self, sent: Sent) -> Waited {
        self.wait_for(sent, |rpc| self.answered(rpc.poll_boot(sent.id)))
    }

    /// Waits for the reply to `sent` and hands over its frame as received
    /// (the transport checked it); the buffer goes back to the connection
    /// when the [`RawReply`] is dropped. `Err(Waited::Dropped)` when the
    /// connection went down first, as [`wait_answer`](Self::wait_answer) says.
    pub fn wait_raw(&self, sent: Sent) -> Result<RawReply<'_>, Waited> {
        let buf = self.wait_for(sent, |rpc| raw_answer(rpc, sent.id))?;
        Ok(RawReply { conn: self, buf: Some(buf) })
    }

    /// Closes the connection over a reply that does not decode; the error.
    pub fn bad_reply(&self, e: pfs_core::wire::WireError) -> FsError {
        net_error(self.rpc.lock().expect("connection lock").bad_frame(e))
    }

    /// Polls with `poll` until it gives an answer: for `reply_spin` first,
    /// yielding the core between polls, then parking on the connection
    /// between polls.
    fn wait_for<T>(&self, sent: Sent, mut poll: impl FnMut(&mut RpcClient) -> Option<T>) -> T {
        // Poll a little before parking: a reply that comes within
        // `reply_spin` costs no eventfd write at the server and no wake-up here.
        let spin = if sent.spin { self.reply_spin } else { Duration::ZERO };
        let spin_until = Instant::now() + spin;
        loop {
            let mut rpc = self.rpc.lock().expect("connection lock");
            if let Some(answer) = poll(&mut rpc) {
                return answer;
            }
            if Instant::now() < spin_until {
                drop(rpc);
                // Yield rather than spin: where callers and the worker share
                // cores (`pfs up`, two bench processes on two cores), a worker
                // waiting for this core runs at once instead of after this
                // spin; with nothing else to run the call returns at once.
                // (docs/benchmarks.md, twenty-fourth session: creates and
                // removes 19-46% faster through the native client and the
                // library, less CPU per operation.)
                std::thread::yield_now();
                continue;
            }
            // Arm the wake-up before parking: a shared-memory peer rings the
            // eventfd only for a reader that said it sleeps.
            let connected = rpc.qp().is_some();
            let fd = rpc.arm_wait();
            drop(rpc);
            let left = sent.deadline.saturating_duration_since(Instant::now());
            match fd {
                Some(fd) => {
                    let _ = pfs_net::wait_readable(fd, Some(left.min(WAIT_SLICE)));
                }
                // Something arrived meanwhile: poll again at once.
                None if connected => {}
                None => std::thread::sleep(left.min(WAIT_SLICE)),
            }
        }
    }

    /// Notices that the server died while this connection sat idle
    /// ([`RpcClient::check_peer`]).
    pub fn check_peer(&self) {
        self.rpc.lock().expect("connection lock").check_peer();
    }

    /// The directories whose read tokens the server revoked since the last call.
    pub fn take_invalidations(&self) -> Vec<pfs_core::InodeId> {
        let mut out = Vec::new();
        let mut rpc = self.rpc.lock().expect("connection lock");
        while let Some(n) = rpc.next_notification() {
            match n {
                Ok(Frame { body: Body::Request(Request::TokenInvalidate { dir }), .. }) => {
                    out.push(dir)
                }
                Ok(other) => log::warn!("{}: unexpected message {:?}", rpc.addr(), other.opcode()),
                Err(e) => log::warn!("{}: bad notification: {e}", rpc.addr()),
            }
        }
        out
    }

    /// Sends `req` and waits for its reply.
    pub fn call(&self, req: Request, worker: u16, timeout: Duration) -> FsResult<Reply> {
        let sent = self.send(req, worker, timeout)?;
        self.wait(sent)
    }
}

/// A reply frame as received ([`Conn::wait_raw`]), read in place; its buffer
/// goes back to the connection when dropped.
#[derive(Debug)]
pub struct RawReply<'a> {
    conn: &'a Conn,
    buf: Option<Vec<u8>>,
}

impl RawReply<'_> {
    /// The frame's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.buf.as_deref().expect("held until dropped")
    }
}

impl Drop for RawReply<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.conn.rpc.lock().expect("connection lock").give_back(buf);
        }
    }
}

/// Connection options of a client with id `client`.
pub fn rpc_options(
    client: ClientId,
    connect_timeout: Duration,
    request_timeout: Duration,
) -> RpcOptions {
    let mut o = RpcOptions { client, timeout: request_timeout, ..RpcOptions::default() };
    o.connect.timeout = connect_timeout;
    o
}
