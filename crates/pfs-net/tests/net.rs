//! pfs-net over real sockets on 127.0.0.1 and real shared memory.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use pfs_core::{Body, Reply};
use pfs_net::msg::{Kind, NetHeader};
use pfs_net::{
    connect, Backend, Completion, ConnectOptions, ListenerConfig, NetError, QueuePair, RegionRange,
    RpcClient, RpcOptions, TransportKind, WorkId,
};

fn opts(transport: TransportKind) -> RpcOptions {
    let mut o = RpcOptions::default();
    o.connect.transport = transport;
    o
}

fn echo_round_trips(transport: TransportKind, want: Backend) {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), opts(transport)).unwrap();
    assert_eq!(c.qp().unwrap().backend(), want);
    for len in [0usize, 1, 5000, 300_000, pfs_core::wire::MAX_IO_BYTES] {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let reply = c.call(&write_frame(data.clone()), Duration::from_secs(10)).unwrap();
        assert_eq!(reply.body, Body::Reply(Reply::Read(data)), "len {len}");
        assert_eq!(reply.client, pfs_core::ClientId(0));
    }
}

#[test]
fn round_trip_over_tcp() {
    echo_round_trips(TransportKind::Tcp, Backend::Tcp);
}

#[test]
fn round_trip_over_shm_chosen_automatically_on_loopback() {
    echo_round_trips(TransportKind::Auto, Backend::Shm);
}

#[test]
fn rdma_without_a_device_says_so_and_falls_back_to_tcp() {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), opts(TransportKind::Rdma)).unwrap();
    assert_eq!(c.qp().unwrap().backend(), Backend::Tcp);
    wait_for_log(&["rdma requested for", &server.addr.to_string(), "falling back to tcp"]);
    c.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap();
}

/// Large frames (read from a shm ring straight into a receive buffer) and
/// small ones (through the receive buffer) in flight together, in both
/// directions, each arriving whole and in its place.
#[test]
fn large_and_small_frames_interleaved_over_shm() {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), opts(TransportKind::Shm)).unwrap();
    assert_eq!(c.qp().unwrap().backend(), Backend::Shm);
    let lens = [70_000usize, 10, 65_500, 3, 200_000, 64 << 10, 1, 1 << 20, 66_000, 17];
    for round in 0..3u8 {
        let sent: Vec<_> = lens
            .iter()
            .map(|&len| {
                let data: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8 ^ round).collect();
                (c.send(&write_frame(data.clone())).unwrap(), data)
            })
            .collect();
        for (id, data) in sent {
            let deadline = Instant::now() + Duration::from_secs(10);
            let reply = loop {
                if let Some(f) = c.poll(id).unwrap() {
                    break f;
                }
                assert!(Instant::now() < deadline, "round {round}: no reply of {}", data.len());
            };
            assert!(
                reply.body == Body::Reply(Reply::Read(data.clone())),
                "round {round}: the reply of {} bytes differs",
                data.len()
            );
        }
    }
}

fn credits_bound_in_flight(transport: TransportKind) {
    init_log();
    let mut cfg = ListenerConfig::new(loopback(), key(1));
    cfg.credits = 8;
    let server = Server::start(cfg);
    let mut c = RpcClient::connect(server.addr, key(1), opts(transport)).unwrap();
    assert_eq!(c.credits(), 8, "the server grants fewer credits than the client asks for");
    for round in 0..3 {
        let ids: Vec<_> = (0..8).map(|i| c.send(&write_frame(vec![round, i])).unwrap()).collect();
        match c.send(&write_frame(vec![9])) {
            Err(NetError::NoCredit { in_flight: 8, .. }) => {}
            other => panic!("expected back-pressure, got {other:?}"),
        }
        for (i, id) in ids.into_iter().enumerate() {
            let deadline = Instant::now() + Duration::from_secs(5);
            let reply = loop {
                if let Some(f) = c.poll(id).unwrap() {
                    break f;
                }
                assert!(Instant::now() < deadline);
            };
            assert_eq!(reply.body, Body::Reply(Reply::Read(vec![round, i as u8])));
        }
        assert_eq!(c.in_flight(), 0);
    }
}

#[test]
fn credits_bound_in_flight_over_tcp() {
    credits_bound_in_flight(TransportKind::Tcp);
}

#[test]
fn credits_bound_in_flight_over_shm() {
    credits_bound_in_flight(TransportKind::Shm);
}

#[test]
fn send_queue_hands_the_buffer_back_when_full() {
    init_log();
    let server = Server::echo(key(1));
    let mut o = ConnectOptions { transport: TransportKind::Tcp, ..Default::default() };
    o.limits.send_depth = 2;
    let mut qp = connect(server.addr, &key(1), &o).unwrap();
    let bad = qp.post_send(WorkId(99), vec![1, 2, 3]).unwrap_err();
    assert!(bad.error.to_string().contains("not one encoded frame"), "{}", bad.error);
    let frame = write_frame(vec![0; 1 << 20]).to_bytes().unwrap();
    // Without polling completions, a third post is refused and its buffer handed back.
    let mut refused = None;
    for i in 0..64 {
        if let Err(r) = qp.post_send(WorkId(i), frame.clone()) {
            refused = Some(r);
            break;
        }
    }
    let r = refused.expect("the send queue is bounded");
    assert!(matches!(r.error, NetError::Full { what: "send queue", depth: 2 }), "{}", r.error);
    assert_eq!(r.buf.len(), frame.len());
}

/// A raw server: a thread that accepts links (`setup` runs on each), polls
/// them, and hands each completion to `on` until a link fails.
type RawServer = (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
);

fn raw_server(
    server_key: pfs_net::ClusterKey,
    mut setup: impl FnMut(&mut pfs_net::Link) + Send + 'static,
    mut on: impl FnMut(&mut pfs_net::Link, Completion) + Send + 'static,
) -> RawServer {
    let mut listener =
        pfs_net::Listener::bind(ListenerConfig::new(loopback(), server_key)).unwrap();
    let addr = listener.local_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        let mut conns = Vec::new();
        let mut out = Vec::new();
        let mut done = Vec::with_capacity(64);
        while !s.load(std::sync::atomic::Ordering::Acquire) {
            listener.accept(&mut out).unwrap();
            for mut qp in out.drain(..) {
                setup(&mut qp);
                conns.push(qp);
            }
            conns.retain_mut(|qp| {
                done.clear();
                if qp.poll_cq(&mut done).is_err() {
                    return false;
                }
                for c in done.drain(..) {
                    on(qp, c);
                }
                true
            });
            std::thread::yield_now();
        }
    });
    (addr, stop, h)
}

/// A server thread that registers a 4 KiB region on each connection and only polls.
fn region_server(server_key: pfs_net::ClusterKey) -> RawServer {
    let setup = |qp: &mut pfs_net::Link| {
        let r = qp.register_region(4096).unwrap();
        qp.region_mut(r)[..4].copy_from_slice(b"SRVR");
    };
    raw_server(server_key, setup, |_, _| {})
}

/// The next completion of `qp`, in order: one poll may bring several (a
/// reply and the send completion of its request), and those after the first
/// wait in `pending` for the next call (taking the last of a poll's and
/// dropping the others lost a reply now and then: "no completion").
fn wait_completion(
    qp: &mut pfs_net::Link,
    pending: &mut std::collections::VecDeque<Completion>,
) -> Result<Completion, NetError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::with_capacity(64);
    loop {
        if let Some(c) = pending.pop_front() {
            return Ok(c);
        }
        qp.poll_cq(&mut out)?;
        pending.extend(out.drain(..));
        if let Some(c) = pending.pop_front() {
            return Ok(c);
        }
        assert!(Instant::now() < deadline, "no completion");
        if qp.prepare_wait() {
            pfs_net::wait_readable(qp.wait_fd(), Some(Duration::from_millis(100))).unwrap();
        }
    }
}

fn one_sided(transport: TransportKind, want: Backend) {
    init_log();
    let (addr, stop, h) = region_server(key(1));
    let o = ConnectOptions { transport, ..Default::default() };
    let mut qp = connect(addr, &key(1), &o).unwrap();
    assert_eq!(qp.backend(), want);
    let local = qp.register_region(8192).unwrap();
    qp.region_mut(local)[..5].copy_from_slice(b"hello");
    let remote = pfs_net::RegionId(0);
    qp.post_write(WorkId(1), RegionRange { region: local, offset: 0, len: 5 }, remote, 100)
        .unwrap();
    let mut pending = std::collections::VecDeque::new();
    let done = wait_completion(&mut qp, &mut pending).unwrap();
    assert!(matches!(done, Completion::Write { wr: WorkId(1) }));
    qp.post_read(WorkId(2), RegionRange { region: local, offset: 1000, len: 105 }, remote, 0)
        .unwrap();
    let done = wait_completion(&mut qp, &mut pending).unwrap();
    assert!(matches!(done, Completion::Read { wr: WorkId(2) }));
    let got = &qp.region(local)[1000..1105];
    assert_eq!(&got[..4], b"SRVR");
    assert_eq!(&got[100..105], b"hello");
    // Local bounds are the caller's error; remote bounds are checked by the peer,
    // which drops the connection and logs why.
    let e = qp
        .post_write(WorkId(3), RegionRange { region: local, offset: 8190, len: 5 }, remote, 0)
        .unwrap_err();
    assert!(e.to_string().contains("outside region"), "{e}");
    qp.post_write(WorkId(4), RegionRange { region: local, offset: 0, len: 5 }, remote, 4094)
        .unwrap();
    let e = wait_completion(&mut qp, &mut pending).unwrap_err();
    assert!(matches!(e, NetError::Closed { .. } | NetError::Io { .. }), "{e}");
    wait_for_log(&["one-sided write: 5 bytes at offset 4094 are outside region 0 of 4096 bytes"]);
    stop.store(true, std::sync::atomic::Ordering::Release);
    h.join().unwrap();
}

#[test]
fn one_sided_write_and_read_over_tcp() {
    one_sided(TransportKind::Tcp, Backend::Tcp);
}

#[test]
fn one_sided_write_and_read_over_shm() {
    one_sided(TransportKind::Shm, Backend::Shm);
}

#[test]
fn a_request_never_answered_times_out() {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), opts(TransportKind::Tcp)).unwrap();
    let start = Instant::now();
    let e = c.call(&read_frame(), Duration::from_millis(200)).unwrap_err();
    let took = start.elapsed();
    assert!(matches!(e, NetError::TimedOut { timeout_ms: 200, .. }), "{e}");
    assert!(took >= Duration::from_millis(200) && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(c.in_flight(), 0, "the timed-out request gave its credit back");
    c.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap();
}

fn reconnects(transport: TransportKind) {
    init_log();
    let server = Server::echo(key(1));
    let addr = server.addr;
    let mut o = opts(transport);
    o.backoff_min = Duration::from_millis(5);
    o.backoff_max = Duration::from_millis(50);
    let mut c = RpcClient::connect(addr, key(1), o).unwrap();
    c.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap();
    drop(server);
    let e = c.call(&write_frame(vec![2]), Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(e, NetError::Disconnected { .. } | NetError::TimedOut { .. }),
        "while the server is down: {e}"
    );
    let _again = Server::start(ListenerConfig::new(addr, key(1)));
    let reply = c.call(&write_frame(vec![3]), Duration::from_secs(10)).unwrap();
    assert_eq!(reply.body, Body::Reply(Reply::Read(vec![3])));
}

#[test]
fn reconnects_after_the_server_restarts_over_tcp() {
    reconnects(TransportKind::Tcp);
}

#[test]
fn reconnects_after_the_server_restarts_over_shm() {
    reconnects(TransportKind::Auto);
}

/// A raw TCP connection that passed the handshake, to send bad bytes on.
/// A client made before its server listens connects at its first request;
/// pointed at another address (the server moved), it drops its link there
/// and connects to the new one at once.
fn follows_a_moved_server(transport: TransportKind) {
    init_log();
    let a = Server::echo(key(1));
    let b = Server::echo(key(1));
    let later = Server::echo(key(1));
    let later_addr = later.addr;
    drop(later);
    let mut o = opts(transport);
    o.backoff_min = Duration::from_millis(5);
    o.backoff_max = Duration::from_millis(50);
    // Nothing listens at `later_addr` now: no link, and no error yet.
    let mut c = RpcClient::connect_later(later_addr, key(1), o.clone());
    assert!(c.qp().is_none());
    let e = c.call(&write_frame(vec![1]), Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, NetError::Disconnected { .. }), "nothing listens yet: {e}");
    c.retarget(a.addr);
    assert_eq!(c.addr(), a.addr);
    let reply = c.call(&write_frame(vec![2]), Duration::from_secs(5)).unwrap();
    assert_eq!(reply.body, Body::Reply(Reply::Read(vec![2])));
    let boot_a = c.server_boot().expect("connected to a");
    // Moved while connected: the link to `a` goes, the next call reaches `b`.
    c.retarget(b.addr);
    assert!(c.qp().is_none(), "the link to the old address is dropped");
    let reply = c.call(&write_frame(vec![3]), Duration::from_secs(5)).unwrap();
    assert_eq!(reply.body, Body::Reply(Reply::Read(vec![3])));
    assert_ne!(c.server_boot(), Some(boot_a), "another server answered");
    // The same address again changes nothing.
    c.retarget(b.addr);
    assert!(c.qp().is_some());
}

#[test]
fn follows_a_moved_server_over_tcp() {
    follows_a_moved_server(TransportKind::Tcp);
}

#[test]
fn follows_a_moved_server_over_shm() {
    follows_a_moved_server(TransportKind::Auto);
}

/// A connection whose server went away while nothing was asked of it
/// notices at a check, not by a request sent into the dead link. (A server
/// that stops in this process closes its rings, which the check's poll
/// sees; one killed with SIGKILL leaves them open and is found by the
/// check's look at its unix socket, which scenario 3 of
/// `pfs-server/tests/cluster.rs` covers: it fails without that look.)
#[test]
fn an_idle_shm_link_notices_its_server_died() {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), opts(TransportKind::Auto)).unwrap();
    assert_eq!(c.qp().unwrap().backend(), Backend::Shm);
    c.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap();
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.qp().is_some() {
        assert!(Instant::now() < deadline, "the dead server was not noticed");
        std::thread::sleep(Duration::from_millis(5));
        c.check_peer();
    }
}

fn raw_authenticated(addr: std::net::SocketAddr) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    pfs_net::auth::client_handshake(&mut s, &key(1), &addr.to_string(), 0).unwrap();
    let me = s.local_addr().unwrap().to_string();
    (s, me)
}

fn assert_closed_by_server(s: &mut TcpStream) {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected the server to close, read {n} bytes"),
    }
}

#[test]
fn bad_frames_disconnect_only_their_sender() {
    init_log();
    let server = Server::echo(key(1));
    let mut good = RpcClient::connect(server.addr, key(1), opts(TransportKind::Tcp)).unwrap();
    let valid = write_frame(vec![1, 2, 3]).to_bytes().unwrap();

    let mut wrong_version = valid.clone();
    wrong_version[4] = 200;
    let version_refused =
        format!("frame header: protocol version 200, expected {}", pfs_core::wire::VERSION);
    let mut oversize = valid.clone();
    oversize[24..28].copy_from_slice(&(pfs_core::wire::MAX_FRAME_PAYLOAD as u32 + 1).to_le_bytes());
    let mut bad_sum = valid.clone();
    *bad_sum.last_mut().unwrap() ^= 0xff;
    let mut bad_body = valid.clone();
    bad_body[6] = 15; // opcode Read: the Write payload does not decode as a Read
    let crc = pfs_net::msg::checksum(&bad_body[..28], &bad_body[32..]);
    bad_body[28..32].copy_from_slice(&crc.to_le_bytes());

    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: pfs\r\n\r\nxxxxxxxxxxxx".to_vec(),
            false,
            "bad magic 0x20544547",
        ),
        ("wrong version", wrong_version, false, &version_refused),
        (
            "oversize",
            oversize,
            false,
            "frame header: frame payload length 1052673 is over the limit 1052672",
        ),
        ("bad checksum", bad_sum, false, "checksum mismatch"),
        (
            "truncated",
            valid[..valid.len() - 2].to_vec(),
            true,
            "truncated message: the connection ended",
        ),
        ("undecodable body", bad_body, false, "undecodable request frame"),
    ];
    for (what, bytes, then_close, reason) in cases {
        let (mut s, me) = raw_authenticated(server.addr);
        s.write_all(&bytes).unwrap();
        if then_close {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        wait_for_log(&[&me, reason]);
        assert_closed_by_server(&mut s);
        let reply =
            good.call(&write_frame(what.as_bytes().to_vec()), Duration::from_secs(5)).unwrap();
        assert_eq!(reply.body, Body::Reply(Reply::Read(what.as_bytes().to_vec())), "after {what}");
    }
    // A transport message naming an unknown kind, and one-sided traffic out of range.
    let (mut s, me) = raw_authenticated(server.addr);
    let mut m = Vec::new();
    NetHeader { kind: Kind::Write, region: 3, len: 1, offset: 0, token: 0 }.encode(&[1], &mut m);
    s.write_all(&m).unwrap();
    wait_for_log(&[&me, "one-sided write: region 3 is not registered"]);
    assert_closed_by_server(&mut s);
    good.call(&write_frame(vec![4]), Duration::from_secs(5)).unwrap();
}

fn refusal_text(s: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    assert!(all.len() >= 32, "expected a refusal, got {} bytes", all.len());
    let h = NetHeader::decode(&all[..32]).unwrap();
    assert_eq!(h.kind, Kind::Refuse);
    String::from_utf8(all[32..32 + h.len as usize].to_vec()).unwrap()
}

#[test]
fn wrong_key_is_refused_with_the_reason_on_both_sides() {
    init_log();
    let server = Server::echo(key(1));
    for transport in [TransportKind::Tcp, TransportKind::Auto] {
        let e = RpcClient::connect(server.addr, key(2), opts(transport)).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "{} refused the connection: cluster key mismatch: peer 127.0.0.1:",
                server.addr
            )),
            "{text}"
        );
        assert!(text.ends_with("did not prove the cluster key"), "{text}");
        let reason = text.split_once("refused the connection: ").unwrap().1;
        wait_for_log(&["refusing connection from", reason]);
    }
}

#[test]
fn missing_key_is_refused_with_the_reason_on_both_sides() {
    init_log();
    let mut cfg = ListenerConfig::new(loopback(), key(1));
    cfg.handshake_timeout = Duration::from_millis(200);
    let server = Server::start(cfg);
    // A client without the key that sends requests straight away.
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let me = s.local_addr().unwrap().to_string();
    s.write_all(&write_frame(vec![1]).to_bytes().unwrap()).unwrap();
    let text = refusal_text(&mut s);
    assert_eq!(
        text,
        format!("cluster key mismatch: peer {me} did not prove the cluster key (it sent a frame before the handshake)")
    );
    wait_for_log(&["refusing connection from", &text]);
    // A client that says nothing is refused when the handshake time is up.
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let me = s.local_addr().unwrap().to_string();
    let text = refusal_text(&mut s);
    assert!(
        text.contains(&format!("cluster key mismatch: peer {me} did not prove the cluster key")),
        "{text}"
    );
    wait_for_log(&["refusing connection from", &me, "did not finish within 200 ms"]);
    // A missing key file is an error that names the file.
    let e = pfs_net::ClusterKey::load(std::path::Path::new("/nonexistent/pfs/cluster.key"))
        .unwrap_err();
    assert!(
        e.to_string().starts_with("cluster key file /nonexistent/pfs/cluster.key: cannot read"),
        "{e}"
    );
}

#[test]
fn connections_past_the_limit_are_refused() {
    init_log();
    let mut cfg = ListenerConfig::new(loopback(), key(1));
    cfg.max_connections = 2;
    let server = Server::start(cfg);
    let mut a = RpcClient::connect(server.addr, key(1), opts(TransportKind::Tcp)).unwrap();
    let mut b = RpcClient::connect(server.addr, key(1), opts(TransportKind::Shm)).unwrap();
    a.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap();
    b.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap();
    let e = RpcClient::connect(server.addr, key(1), opts(TransportKind::Tcp)).unwrap_err();
    let want = format!("server {} is at its limit of 2 connections", server.addr);
    assert!(e.to_string().contains(&want), "{e}");
    wait_for_log(&["refusing connection from", &want]);
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut c = loop {
        match RpcClient::connect(server.addr, key(1), opts(TransportKind::Tcp)) {
            Ok(c) => break c,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("a slot frees when a client leaves: {e}"),
        }
    };
    c.call(&write_frame(vec![2]), Duration::from_secs(5)).unwrap();
}

/// A server thread that answers each write with its data, sealed as a
/// worker seals a read reply (summed by `link_sum` of the link), and reports
/// for each request whether its frame was summed over its header only.
fn flag_server(server_key: pfs_net::ClusterKey, seen: std::sync::mpsc::Sender<bool>) -> RawServer {
    use pfs_core::wire::{FrameHeader, FLAG_HEADER_SUM};
    let setup = |qp: &mut pfs_net::Link| {
        for _ in 0..qp.credits() {
            qp.post_recv(Vec::new()).unwrap();
        }
    };
    let on = move |qp: &mut pfs_net::Link, c: Completion| {
        let Completion::Recv { buf } = c else { return };
        let h = FrameHeader::decode(&buf).unwrap();
        seen.send(h.flags & FLAG_HEADER_SUM != 0).unwrap();
        let reply = echo(pfs_core::Frame::decode_received(&buf).unwrap()).unwrap();
        let mut bytes = Vec::new();
        let sum = pfs_net::link_sum(qp.backend());
        reply.encode_summed(&mut bytes, reply.client, reply.request_id, 0, sum).unwrap();
        qp.post_send(WorkId(0), bytes).unwrap();
        qp.post_recv(buf).unwrap();
    };
    raw_server(server_key, setup, on)
}

/// Through shared memory a frame's checksum covers its header only (the
/// payload never leaves this host's memory; summing it cost about a tenth
/// of the CPU of a large transfer): requests and replies both ways. Over TCP every
/// frame is summed whole, and a frame summed over its header only is refused.
#[test]
fn frames_through_shared_memory_are_summed_over_their_header_only() {
    init_log();
    for (transport, want) in [(TransportKind::Shm, true), (TransportKind::Tcp, false)] {
        let (tx, rx) = std::sync::mpsc::channel();
        let (addr, stop, h) = flag_server(key(1), tx);
        let mut c = RpcClient::connect(addr, key(1), opts(transport)).unwrap();
        for len in [0usize, 100, 70_000, 1 << 20] {
            let data: Vec<u8> = (0..len).map(|i| (i * 11 + len) as u8).collect();
            let reply = c.call(&write_frame(data.clone()), Duration::from_secs(10)).unwrap();
            assert!(reply.body == Body::Reply(Reply::Read(data)), "{transport:?}, {len} bytes");
            assert_eq!(rx.recv().unwrap(), want, "{transport:?}, {len} bytes");
        }
        drop(c);
        stop.store(true, std::sync::atomic::Ordering::Release);
        h.join().unwrap();
    }
    // A peer that sends one over TCP breaks the protocol: the server says why.
    let (tx, _rx) = std::sync::mpsc::channel();
    let (addr, stop, h) = flag_server(key(1), tx);
    let o = ConnectOptions { transport: TransportKind::Tcp, ..Default::default() };
    let mut qp = connect(addr, &key(1), &o).unwrap();
    let mut bytes = Vec::new();
    let frame = write_frame(vec![5; 1000]);
    let sum = pfs_core::wire::Sum::Header;
    frame.encode_summed(&mut bytes, frame.client, pfs_core::RequestId(1), 0, sum).unwrap();
    qp.post_send(WorkId(1), bytes).unwrap();
    wait_for_log(&["only its header", "arrived over another link"]);
    stop.store(true, std::sync::atomic::Ordering::Release);
    h.join().unwrap();
}

/// A reply sent in pieces (`Link::send_gathered`, as a server sends a read
/// from its read-ahead buffers) reaches the client through shared memory as
/// the one frame it is, whatever the pieces (empty ones, ones that wrap the
/// ring); pieces that are not one frame are refused with the reason; over TCP
/// there is no room for it at all.
fn gathered_replies(transport: TransportKind, want: Backend) {
    init_log();
    use pfs_core::wire::{Frame, Opcode, Sum};
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let d = data.clone();
    let on = move |qp: &mut pfs_net::Link, c: Completion| {
        let Completion::Recv { buf } = c else { return };
        let req = Frame::decode(&buf).unwrap();
        let Body::Request(pfs_core::Request::Read { size, .. }) = req.body else { return };
        let len = size as usize;
        let head = Frame::read_reply_header(len, req.request_id, req.client, Opcode::Read).unwrap();
        let room = qp.gather_room();
        if qp.backend() != Backend::Shm {
            assert_eq!(room, 0, "no gathered sends over {:?}", qp.backend());
            assert!(qp.send_gathered(&[&head, &d[..len]]).is_err());
            let mut out = head.to_vec();
            out.extend_from_slice(&d[..len]);
            pfs_core::wire::Frame::seal_read_reply(
                &mut out,
                req.request_id,
                req.client,
                Opcode::Read,
                Sum::Full,
            )
            .unwrap();
            qp.post_send(WorkId(1), out).unwrap();
            let _ = qp.post_recv(buf);
            return;
        }
        assert!(room >= head.len() + len, "room {room} for {len} bytes");
        // Not one frame: refused, nothing sent.
        if len > 0 {
            let e = qp.send_gathered(&[&head, &d[..len - 1]]).unwrap_err();
            assert!(e.to_string().contains("not one encoded frame"), "{e}");
        }
        // Uneven pieces, an empty one among them.
        let cut = len / 3;
        qp.send_gathered(&[&head, &d[..cut], &[], &d[cut..len]]).unwrap();
        let _ = qp.post_recv(buf);
    };
    let setup = |qp: &mut pfs_net::Link| {
        for _ in 0..qp.credits() {
            qp.post_recv(Vec::new()).unwrap();
        }
    };
    let (addr, stop, h) = raw_server(key(1), setup, on);
    let o = ConnectOptions { transport, ..Default::default() };
    let mut qp = connect(addr, &key(1), &o).unwrap();
    assert_eq!(qp.backend(), want);
    for _ in 0..4 {
        qp.post_recv(Vec::new()).unwrap();
    }
    let mut pending = std::collections::VecDeque::new();
    // 4 MiB rings: 30 replies of up to 300,000 bytes wrap them several times.
    for (i, len) in (0..30).map(|i| (i, [0usize, 1, 4096, 299_999, 300_000][i % 5])) {
        let mut req = read_frame();
        req.request_id = pfs_core::RequestId(i as u64 + 1);
        if let Body::Request(pfs_core::Request::Read { size, .. }) = &mut req.body {
            *size = len as u32;
        }
        qp.post_send(WorkId(i as u64), req.to_bytes().unwrap()).unwrap();
        let buf = loop {
            match wait_completion(&mut qp, &mut pending).unwrap() {
                Completion::Recv { buf } => break buf,
                Completion::Send { buf, .. } => qp.post_recv(buf).unwrap(),
                other => panic!("unexpected {other:?}"),
            }
        };
        let reply = Frame::decode(&buf).unwrap();
        assert_eq!(reply.request_id.0, i as u64 + 1);
        let Body::Reply(Reply::Read(got)) = reply.body else { panic!("{:?}", reply.body) };
        assert!(got == data[..len], "reply {i}: {len} bytes");
        qp.post_recv(buf).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    h.join().unwrap();
}

#[test]
fn gathered_replies_over_shm() {
    gathered_replies(TransportKind::Shm, Backend::Shm);
}

#[test]
fn no_gathered_replies_over_tcp() {
    gathered_replies(TransportKind::Tcp, Backend::Tcp);
}
