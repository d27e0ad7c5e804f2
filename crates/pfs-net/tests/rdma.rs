//! RDMA on a machine without an RDMA NIC: asking for it falls back to a working tcp
//! queue pair with a warning that says why, a listener told to offer it says why it
//! does not, and a client that wants it from a server that does not offer it gets
//! the plain handshake. What needs a NIC is not tested here.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pfs_core::{Body, Frame, Reply};
use pfs_net::auth::{client_handshake, OFFERS_RDMA, WANT_RDMA};
use pfs_net::rdma::RdmaConfig;
use pfs_net::{
    connect, Backend, Completion, ConnectOptions, ListenerConfig, QueuePair, TransportKind, WorkId,
};

/// Set on a host with an RDMA device to skip the tests that expect none.
fn host_has_rdma() -> bool {
    std::env::var_os("PFS_TEST_HAS_RDMA").is_some()
}

#[test]
fn connect_asked_for_rdma_without_a_device_returns_a_working_tcp_queue_pair() {
    if host_has_rdma() {
        return;
    }
    init_log();
    let server = Server::echo(key(1));
    let o = ConnectOptions { transport: TransportKind::Rdma, ..Default::default() };
    let mut qp = connect(server.addr, &key(1), &o).unwrap();
    assert_eq!(qp.backend(), Backend::Tcp);
    let why = if cfg!(feature = "rdma") { "no RDMA devices: " } else { "cargo feature `rdma`" };
    wait_for_log(&["rdma requested for", &server.addr.to_string(), why, "falling back to tcp"]);

    // The queue pair works: a request goes out and its echo comes back.
    qp.post_recv(Vec::new()).unwrap();
    let frame = write_frame(b"over tcp".to_vec()).to_bytes().unwrap();
    qp.post_send(WorkId(1), frame).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    let reply = loop {
        qp.poll_cq(&mut out).unwrap();
        if let Some(i) = out.iter().position(|c| matches!(c, Completion::Recv { .. })) {
            let Completion::Recv { buf } = out.swap_remove(i) else { unreachable!() };
            break Frame::decode(&buf).unwrap();
        }
        assert!(Instant::now() < deadline, "no reply over the fallback queue pair");
        if qp.prepare_wait() {
            pfs_net::wait_readable(qp.wait_fd(), Some(Duration::from_millis(50))).unwrap();
        }
    };
    assert_eq!(reply.body, Body::Reply(Reply::Read(b"over tcp".to_vec())));
}

#[test]
fn a_listener_told_to_offer_rdma_without_a_device_says_why_and_does_not() {
    if host_has_rdma() {
        return;
    }
    init_log();
    let mut cfg = ListenerConfig::new(loopback(), key(1));
    cfg.rdma = Some(RdmaConfig::default());
    let listener = pfs_net::Listener::bind(cfg).unwrap();
    assert!(!listener.offers_rdma());
    let at = listener.local_addr().to_string();
    wait_for_log(&["listener on", &at, "does not offer rdma"]);
}

#[test]
fn a_client_wanting_rdma_from_a_server_without_it_gets_the_plain_accept() {
    init_log();
    let server = Server::echo(key(1));
    let mut s = std::net::TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let info = client_handshake(&mut s, &key(1), "test", WANT_RDMA).unwrap();
    assert_eq!(info.features & OFFERS_RDMA, 0, "{info:?}");
    assert!(info.credits > 0);
}

#[cfg(feature = "rdma")]
#[test]
fn rdma_connect_without_a_device_is_unavailable_and_says_why() {
    if host_has_rdma() {
        return;
    }
    let server = Server::echo(key(1));
    let e = pfs_net::rdma::connect(server.addr, &key(1), &ConnectOptions::default()).unwrap_err();
    assert!(matches!(e, pfs_net::NetError::Unavailable { transport: "rdma", .. }), "{e}");
    assert!(e.to_string().contains("no RDMA devices: "), "{e}");
}
