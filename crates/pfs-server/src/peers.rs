//! A worker's connections to servers, for the steps of operations that span
//! shards (cross-shard renames, bigdir rmdirs, follow-ups, the sweep).
//!
//! A connection is made on first use, from the cluster view, and never in the
//! worker's loop: a helper thread connects (a TCP connect and the handshake,
//! up to [`CONNECT_TIMEOUT`] against a server that does not answer) and rings
//! the worker when it is done. Until then a send fails with
//! [`PeerError::Connecting`], which the caller tries again as soon as the
//! worker wakes; a send to a server that could not be reached fails with
//! [`PeerError::Failed`], tried again after [`RETRY_AFTER`].
//!
//! A message to another worker of this server does not leave the process: it
//! travels over the worker rings as any forwarded request does
//! ([`Peers::local_message`]), named by a request id with [`LOCAL_BIT`] set, and
//! its reply comes back as a forwarded reply to a connection slot no
//! connection has ([`LOCAL_SLOT`]), which hands it to these tables.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pfs_core::wire::{Body, Frame, Reply, Request, Sum, View};
use pfs_core::{ClientId, FsError, RequestId, ServerId, WorkerId};
use pfs_net::{ClusterKey, NetError, RpcClient, RpcOptions};

use crate::msg::ConnRef;

/// The connection slot that stands for this worker's own requests to other
/// workers: their replies come back addressed to it.
pub const LOCAL_SLOT: u32 = u32::MAX;
/// Set in the request id of a message sent over the rings.
pub const LOCAL_BIT: u64 = 1 << 63;

/// Pause before sending again to a server that could not be reached.
pub const RETRY_AFTER: Duration = Duration::from_millis(500);
/// Longest a connect and its handshake may take (on the helper thread).
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long a request to a peer may wait for its reply.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the reply to `id` comes over a connection (epoll does not watch
/// peer connections, so a worker waiting for one polls rather than parks),
/// not over the rings (whose pushes wake a parked worker).
pub fn over_network(id: RequestId) -> bool {
    id.0 & LOCAL_BIT == 0
}

/// Wakes the worker that owns a [`Peers`] (a connect finished).
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Why a request could not be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerError {
    /// A connection to the server is being made; try again when woken.
    Connecting,
    /// The server is not in this server's view yet (it registered after the
    /// last heartbeat brought a view; the heartbeat beats fast until the view
    /// is complete): try again shortly.
    NotInView,
    /// The server could not be reached.
    Failed(String),
}

/// When to ask again for a server not in the view yet.
const NOT_IN_VIEW_RETRY: Duration = Duration::from_millis(50);

impl PeerError {
    /// When to try again.
    pub fn retry_at(&self, now: Instant) -> Instant {
        match self {
            PeerError::Connecting => now,
            PeerError::NotInView => now + NOT_IN_VIEW_RETRY,
            PeerError::Failed(_) => now + RETRY_AFTER,
        }
    }

    /// Whether it is worth a line in the log (a connect under way is not).
    pub fn is_failure(&self) -> bool {
        matches!(self, PeerError::Failed(_))
    }
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Connecting => f.write_str("connecting"),
            PeerError::NotInView => f.write_str("not in this server's view yet"),
            PeerError::Failed(e) => f.write_str(e),
        }
    }
}

/// One server's connection.
enum Link {
    /// None; the next send starts a connect, not before `retry_at`.
    Idle { retry_at: Option<Instant> },
    /// The helper thread connects; it sends the outcome here.
    Connecting(Receiver<Result<RpcClient, String>>),
    /// Connected (the link may have gone down since: checked at each send).
    Ready(Box<RpcClient>),
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Link::Idle { retry_at } => f.debug_struct("Idle").field("retry_at", retry_at).finish(),
            Link::Connecting(_) => f.write_str("Connecting"),
            Link::Ready(c) => f.debug_tuple("Ready").field(c).finish(),
        }
    }
}

/// Views that may wait for a worker to take them ([`Peers::take_view`]); the
/// heartbeat sends again at its next beat when a worker's queue is full.
pub const VIEW_QUEUE: usize = 2;

/// Connections to other servers (and this one), made on first use.
pub struct Peers {
    key: ClusterKey,
    /// The cluster view as the heartbeat last sent it.
    view: Option<View>,
    /// New views from the heartbeat (no lock between it and the worker).
    feed: Receiver<View>,
    links: Vec<Link>,
    wake: Option<Wake>,
    /// Messages to other workers of this server in flight (by the id in
    /// their `ConnRef`), with their reply once it came.
    local: HashMap<u32, Option<Vec<u8>>>,
    next_local: u32,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers").field("links", &self.links).finish_non_exhaustive()
    }
}

impl Peers {
    /// Peers found through the views `feed` brings, proving `key`; `wake` is
    /// called when a connect made in the background finishes.
    pub fn new(key: ClusterKey, feed: Receiver<View>, wake: Option<Wake>) -> Peers {
        let links = Vec::new();
        Peers { key, view: None, feed, links, wake, local: HashMap::new(), next_local: 0 }
    }

    /// Takes the newest view the heartbeat sent, if one came (a worker calls
    /// it at the start of each round).
    pub(crate) fn take_view(&mut self) {
        while let Ok(v) = self.feed.try_recv() {
            self.view = Some(v);
        }
    }

    /// Servers and workers per server in the view, once it is complete.
    pub(crate) fn shape(&self) -> Option<(u32, u32)> {
        let v = self.view.as_ref()?;
        if !v.is_complete() {
            return None;
        }
        Some((v.servers_expected, v.servers.first()?.workers))
    }

    /// Drops the connection to `server` (it failed); the next use reconnects.
    pub(crate) fn forget_conn(&mut self, server: ServerId) {
        if let Some(l) = self.links.get_mut(server.0 as usize) {
            *l = Link::Idle { retry_at: None };
        }
    }

    fn addr_of(&self, server: ServerId) -> Result<SocketAddr, String> {
        let v = self.view.as_ref().ok_or("no cluster view yet")?;
        let info = v
            .servers
            .iter()
            .find(|i| i.id == server)
            .ok_or_else(|| format!("server {server} is not in the view"))?;
        info.addr.parse().map_err(|_| format!("server {server} has address {:?}", info.addr))
    }

    /// Starts connecting to `server` on a helper thread.
    fn start_connect(&mut self, server: ServerId) -> Result<Link, String> {
        let addr = self.addr_of(server)?;
        let (tx, rx) = sync_channel(1);
        let (key, wake) = (self.key.clone(), self.wake.clone());
        let mut o = RpcOptions { credits: 64, timeout: REQUEST_TIMEOUT, ..RpcOptions::default() };
        o.connect.timeout = CONNECT_TIMEOUT;
        // Proves the server role: peers run internal requests only for servers.
        o.connect.as_server = true;
        std::thread::Builder::new()
            .name(format!("pfs-peer-{server}"))
            .spawn(move || {
                let made = RpcClient::connect(addr, key, o).map_err(|e| e.to_string());
                let _ = tx.send(made);
                if let Some(wake) = wake {
                    wake();
                }
            })
            .map_err(|e| format!("cannot start a thread to connect to server {server}: {e}"))?;
        Ok(Link::Connecting(rx))
    }

    /// The connection to `server`, or why there is none yet.
    fn conn(&mut self, server: ServerId) -> Result<&mut RpcClient, PeerError> {
        let s = server.0 as usize;
        if self.links.len() <= s {
            self.links.resize_with(s + 1, || Link::Idle { retry_at: None });
        }
        // A link that went down is made again off the loop, not by the
        // client's own reconnect (which blocks).
        if matches!(&self.links[s], Link::Ready(c) if c.qp().is_none()) {
            self.links[s] = Link::Idle { retry_at: None };
        }
        if let Link::Connecting(rx) = &self.links[s] {
            match rx.try_recv() {
                Ok(Ok(c)) => self.links[s] = Link::Ready(Box::new(c)),
                Ok(Err(e)) => {
                    self.links[s] = Link::Idle { retry_at: Some(Instant::now() + RETRY_AFTER) };
                    return Err(PeerError::Failed(e));
                }
                Err(TryRecvError::Empty) => return Err(PeerError::Connecting),
                Err(TryRecvError::Disconnected) => {
                    self.links[s] = Link::Idle { retry_at: None };
                    return Err(PeerError::Failed("the connecting thread ended".into()));
                }
            }
        }
        if let Link::Idle { retry_at } = self.links[s] {
            if retry_at.is_some_and(|t| Instant::now() < t) {
                return Err(PeerError::Failed(format!("server {server} was unreachable")));
            }
            let in_view =
                self.view.as_ref().is_some_and(|v| v.servers.iter().any(|i| i.id == server));
            if !in_view {
                return Err(PeerError::NotInView);
            }
            self.links[s] = self.start_connect(server).map_err(PeerError::Failed)?;
            return Err(PeerError::Connecting);
        }
        match &mut self.links[s] {
            Link::Ready(c) => Ok(c),
            _ => unreachable!("every other state returned above"),
        }
    }

    /// Sends `req` to `worker` of `server`.
    pub(crate) fn send(
        &mut self,
        server: ServerId,
        worker: WorkerId,
        req: Request,
    ) -> Result<RequestId, PeerError> {
        let frame =
            Frame { request_id: RequestId(0), client: ClientId(0), body: Body::Request(req) };
        let c = self.conn(server)?;
        c.send_to(&frame, worker.0 as u16, Instant::now() + REQUEST_TIMEOUT)
            .map_err(|e| PeerError::Failed(e.to_string()))
    }

    /// A new id for a message over the rings, waiting for its reply.
    fn local_id(&mut self) -> u32 {
        loop {
            self.next_local = self.next_local.wrapping_add(1);
            if !self.local.contains_key(&self.next_local) {
                self.local.insert(self.next_local, None);
                return self.next_local;
            }
        }
    }

    /// The reply to message `id` over the rings came (a reply nobody waits
    /// for any more is dropped).
    pub(crate) fn deliver_local(&mut self, id: u32, buf: Vec<u8>) {
        if let Some(slot) = self.local.get_mut(&id) {
            *slot = Some(buf);
        }
    }

    /// The reply to message `id` over the rings if it came.
    fn poll_local(&mut self, id: u32) -> Result<Option<Result<Reply, FsError>>, String> {
        match self.local.get(&id) {
            None => Err(format!("no message {id} to another worker is in flight")),
            Some(None) => Ok(None),
            Some(Some(_)) => {
                let buf = self.local.remove(&id).flatten().expect("a reply, seen above");
                // Encoded by a worker of this process: no checksum pass.
                match Frame::decode_received(&buf) {
                    Ok(Frame { body: Body::Reply(r), .. }) => Ok(Some(Ok(r))),
                    Ok(Frame { body: Body::Error { error, .. }, .. }) => Ok(Some(Err(error))),
                    Ok(_) => Err("a request came back as the reply".into()),
                    Err(e) => Err(format!("a worker's reply does not decode: {e}")),
                }
            }
        }
    }

    /// The reply to `id` from `server` if it came: `Ok(None)` while waiting.
    pub(crate) fn poll(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String> {
        let Some(Link::Ready(c)) = self.links.get_mut(server.0 as usize) else {
            return Err("not connected".into());
        };
        match c.poll(id) {
            Ok(None) => Ok(None),
            Ok(Some(Frame { body: Body::Reply(r), .. })) => Ok(Some(Ok(r))),
            Ok(Some(Frame { body: Body::Error { error, .. }, .. })) => Ok(Some(Err(error))),
            Ok(Some(_)) => Err("a request came back as the reply".into()),
            Err(e @ (NetError::Disconnected { .. } | NetError::TimedOut { .. })) => {
                Err(e.to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Peers {
    /// A message to `worker` of this server, to travel over the worker rings
    /// as a forwarded request: its request id (with [`LOCAL_BIT`]), the
    /// connection slot its reply comes back to ([`LOCAL_SLOT`]), and the
    /// encoded frame.
    pub(crate) fn local_message(
        &mut self,
        worker: WorkerId,
        req: Request,
    ) -> Result<(RequestId, ConnRef, Vec<u8>), PeerError> {
        let id = self.local_id();
        let request_id = RequestId(LOCAL_BIT | u64::from(id));
        let frame = Frame { request_id, client: ClientId(0), body: Body::Request(req) };
        let mut buf = Vec::new();
        if let Err(e) = frame.encode_as(&mut buf, ClientId(0), request_id, worker.0 as u16) {
            self.local.remove(&id);
            return Err(PeerError::Failed(format!(
                "cannot encode a message to worker {worker}: {e}"
            )));
        }
        Ok((request_id, ConnRef { slot: LOCAL_SLOT, gen: id, sum: Sum::Full }, buf))
    }

    /// The reply to `id`, sent to `server` (over a connection, or over the
    /// rings: [`local_message`](Self::local_message)), if it came: `Ok(None)`
    /// while waiting.
    pub(crate) fn reply(
        &mut self,
        server: ServerId,
        id: RequestId,
    ) -> Result<Option<Result<Reply, FsError>>, String> {
        if id.0 & LOCAL_BIT != 0 {
            return self.poll_local(id.0 as u32);
        }
        self.poll(server, id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn view_with(addr: SocketAddr) -> Receiver<View> {
        let info = pfs_core::wire::ServerInfo {
            id: ServerId(0),
            addr: addr.to_string(),
            workers: 1,
            up: true,
            last_report_ms: 0,
            usage: pfs_core::wire::Usage::default(),
        };
        let (tx, rx) = sync_channel(VIEW_QUEUE);
        tx.send(View { epoch: 1, servers_expected: 1, servers: vec![info] }).unwrap();
        rx
    }

    /// A server the view does not hold yet (it registered after the last
    /// heartbeat) is asked for again shortly, not after `RETRY_AFTER`, and
    /// is not logged as a failure. (A cross-shard rename in a cluster's
    /// first second waited 0.5 s for it.)
    #[test]
    fn a_server_not_in_the_view_yet_is_asked_again_shortly() {
        let dir = tempfile_dir();
        let key_path = dir.join("key-not-in-view");
        ClusterKey::generate(&key_path).unwrap();
        let key = ClusterKey::load(&key_path).unwrap();
        let mut peers = Peers::new(key, view_with("127.0.0.1:9".parse().unwrap()), None);
        peers.take_view();
        let e = peers.send(ServerId(1), WorkerId(0), Request::StatFs).unwrap_err();
        assert_eq!(e, PeerError::NotInView);
        assert!(!e.is_failure());
        let now = Instant::now();
        assert!(e.retry_at(now) < now + RETRY_AFTER / 5, "{:?}", e.retry_at(now) - now);
        let _ = std::fs::remove_file(&key_path);
    }

    /// A server that accepts connections and never answers the handshake:
    /// a send to it fails at once with `Connecting` (the connect runs on a
    /// helper thread, not in the caller), the helper wakes the owner when
    /// its handshake times out, and the next send reports the failure and
    /// waits `RETRY_AFTER` before connecting again.
    #[test]
    fn a_server_that_never_answers_never_blocks_a_send() {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let woken = Arc::new(AtomicUsize::new(0));
        let w = woken.clone();
        let wake: Wake = Arc::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        });
        let dir = tempfile_dir();
        let key_path = dir.join("key");
        ClusterKey::generate(&key_path).unwrap();
        let key = ClusterKey::load(&key_path).unwrap();
        let mut peers = Peers::new(key, view_with(addr), Some(wake));
        peers.take_view();
        let send = |p: &mut Peers| p.send(ServerId(0), WorkerId(0), Request::StatFs);
        assert_eq!(send(&mut peers), Err(PeerError::Connecting));
        // Again while the helper waits for the handshake: still no wait here.
        assert_eq!(send(&mut peers), Err(PeerError::Connecting));
        let (conn, _) = silent.accept().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while woken.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "the helper never woke its owner");
            std::thread::sleep(Duration::from_millis(10));
        }
        let failed = send(&mut peers);
        assert!(matches!(&failed, Err(PeerError::Failed(_))), "{failed:?}");
        let now = Instant::now();
        assert_eq!(failed.unwrap_err().retry_at(now), now + RETRY_AFTER);
        // Not connecting again before the pause is over.
        let again = send(&mut peers);
        assert!(
            matches!(&again, Err(PeerError::Failed(e)) if e.contains("unreachable")),
            "{again:?}"
        );
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("pfs-peers-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
