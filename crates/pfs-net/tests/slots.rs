//! Slot RPC (`pfs_net::link`) over real tcp sockets and real shared memory: the
//! same protocol RDMA links run, with WRITE_WITH_IMM emulated by the queue pair.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use pfs_core::wire::stamp;
use pfs_core::{Body, ClientId, Frame, Reply, RequestId};
use pfs_net::rdma::ReplyImm;
use pfs_net::{
    Backend, Completion, Link, Listener, ListenerConfig, NetError, QueuePair, RegionId,
    RegionRange, RpcClient, RpcOptions, SlotRpc, TransportKind, WorkId, SLOT_BYTES,
};

fn slot_opts(transport: TransportKind, slots: u32) -> RpcOptions {
    let mut o = RpcOptions::default();
    o.connect.transport = transport;
    o.connect.slot_rpc = Some(SlotRpc { slots, inline_bytes: 4096 });
    o
}

fn slot_round_trips(transport: TransportKind, want: Backend) {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), slot_opts(transport, 4)).unwrap();
    let link = c.qp().unwrap();
    assert_eq!(link.backend(), want);
    assert_eq!(link.slots(), Some(4));
    assert_eq!(c.credits(), 4, "slots bound the requests in flight");
    let lens = [0usize, 1, 4000, 5000, 300_000, pfs_core::wire::MAX_IO_BYTES];
    for len in lens {
        let data: Vec<u8> = (0..len).map(|i| (i * 13 + len) as u8).collect();
        let reply = c.call(&write_frame(data.clone()), Duration::from_secs(10)).unwrap();
        assert_eq!(reply.body, Body::Reply(Reply::Read(data)), "len {len}");
    }
    let (sent, taken) = c.qp().unwrap().one_sided_frames();
    // Requests over 4096 bytes went one-sided; every reply came into the inbox.
    assert_eq!(sent, 3, "requests of 5000, 300000 and 1 MiB bytes");
    assert_eq!(taken, lens.len() as u64);
}

#[test]
fn slot_rpc_round_trips_over_tcp() {
    slot_round_trips(TransportKind::Tcp, Backend::Tcp);
}

#[test]
fn slot_rpc_round_trips_over_shm() {
    slot_round_trips(TransportKind::Shm, Backend::Shm);
}

#[test]
fn slot_rpc_keeps_every_slot_busy_and_answers_out_of_order() {
    init_log();
    let server = Server::echo(key(1));
    let mut c = RpcClient::connect(server.addr, key(1), slot_opts(TransportKind::Tcp, 3)).unwrap();
    for round in 0..20u8 {
        let ids: Vec<_> = (0..3u8)
            .map(|i| c.send(&write_frame(vec![round; 5000 + usize::from(i)])).unwrap())
            .collect();
        match c.send(&write_frame(vec![9])) {
            Err(NetError::NoCredit { in_flight: 3, .. }) => {}
            other => panic!("expected back-pressure at 3 slots, got {other:?}"),
        }
        // Reap the last first: each slot holds its own reply.
        for (i, id) in ids.into_iter().enumerate().rev() {
            let deadline = Instant::now() + Duration::from_secs(5);
            let reply = loop {
                if let Some(f) = c.poll(id).unwrap() {
                    break f;
                }
                assert!(Instant::now() < deadline, "reply to {i} in round {round}");
            };
            assert_eq!(reply.body, Body::Reply(Reply::Read(vec![round; 5000 + i])));
        }
    }
    assert_eq!(c.qp().unwrap().one_sided_frames(), (60, 60));
}

#[test]
fn a_client_without_slot_rpc_is_served_as_before() {
    init_log();
    let server = Server::echo(key(1));
    let mut o = RpcOptions::default();
    o.connect.transport = TransportKind::Tcp;
    let mut c = RpcClient::connect(server.addr, key(1), o).unwrap();
    assert_eq!(c.qp().unwrap().slots(), None);
    let reply = c.call(&write_frame(vec![5; 70_000]), Duration::from_secs(5)).unwrap();
    assert_eq!(reply.body, Body::Reply(Reply::Read(vec![5; 70_000])));
    assert_eq!(c.qp().unwrap().one_sided_frames(), (0, 0));
}

/// What a hostile server writes into the client's inbox instead of a reply.
#[derive(Clone, Copy)]
enum Bad {
    /// Bytes that are not a frame.
    Garbage,
    /// An immediate naming a slot the client does not have.
    SlotPastTheEnd,
    /// A well-formed request (not a reply) in the slot.
    RequestNotReply,
    /// A well-formed reply to another slot's request.
    OtherSlot,
}

/// A server that sets up slot RPC like any other, then answers the first request
/// by writing `bad` into the client's inbox.
fn hostile_server(bad: Bad) -> (SocketAddr, Arc<AtomicBool>, JoinHandle<()>) {
    let mut listener = Listener::bind(ListenerConfig::new(loopback(), key(1))).unwrap();
    let addr = listener.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        let mut conns: Vec<(Link, Option<RegionId>)> = Vec::new();
        let mut out = Vec::new();
        let mut done = Vec::new();
        while !s.load(Ordering::Acquire) {
            listener.accept(&mut out).unwrap();
            for mut l in out.drain(..) {
                for _ in 0..8 {
                    l.post_recv(Vec::new()).unwrap();
                }
                conns.push((l, None));
            }
            for (l, evil) in &mut conns {
                done.clear();
                if l.poll_cq(&mut done).is_err() {
                    continue;
                }
                if l.slots().is_some() && evil.is_none() {
                    *evil = Some(l.register_region(SLOT_BYTES).unwrap());
                }
                for c in done.drain(..) {
                    let Completion::Recv { buf } = c else { continue };
                    let req = Frame::decode(&buf).unwrap();
                    let slot = (req.request_id.0 & 0xffff) as u32;
                    let reply = |id: u64| {
                        let f = Frame {
                            request_id: RequestId(id),
                            client: req.client,
                            body: Body::Reply(Reply::Fsync),
                        };
                        f.to_bytes().unwrap()
                    };
                    let (bytes, imm_slot) = match bad {
                        Bad::Garbage => (vec![0xab; 200], slot),
                        Bad::SlotPastTheEnd => (reply(req.request_id.0), 9),
                        Bad::RequestNotReply => {
                            let mut b = write_frame(vec![1, 2, 3]).to_bytes().unwrap();
                            stamp(&mut b, ClientId(0), req.request_id, 0);
                            (b, slot)
                        }
                        Bad::OtherSlot => (reply(req.request_id.0 + 1), slot),
                    };
                    let region = evil.expect("slot rpc is set up before a request");
                    l.region_mut(region)[..bytes.len()].copy_from_slice(&bytes);
                    let local = RegionRange { region, offset: 0, len: bytes.len() as u32 };
                    let off = u64::from(slot) * SLOT_BYTES as u64;
                    let imm = ReplyImm::new(0, imm_slot).unwrap();
                    l.post_write_imm(WorkId(1), local, RegionId(0), off, imm).unwrap();
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    (addr, stop, h)
}

fn client_refuses(bad: Bad, want: &str) {
    init_log();
    let (addr, stop, h) = hostile_server(bad);
    let mut c = RpcClient::connect(addr, key(1), slot_opts(TransportKind::Tcp, 4)).unwrap();
    let e = c.call(&write_frame(vec![1]), Duration::from_secs(5)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, NetError::Disconnected { .. }), "{e:?}");
    assert!(text.contains(want), "{text}");
    wait_for_log(&["closing connection to", want]);
    stop.store(true, Ordering::Release);
    h.join().unwrap();
}

#[test]
fn garbage_in_the_inbox_closes_the_link_with_the_reason() {
    client_refuses(Bad::Garbage, "inbox slot 0: bad magic");
}

#[test]
fn an_immediate_past_the_slots_closes_the_link_with_the_reason() {
    client_refuses(Bad::SlotPastTheEnd, "immediate names client 0 slot 9");
}

#[test]
fn a_request_in_the_inbox_of_a_client_closes_the_link() {
    client_refuses(Bad::RequestNotReply, "inbox slot 0 holds request");
}

#[test]
fn a_reply_for_another_slot_closes_the_link() {
    client_refuses(Bad::OtherSlot, "inbox slot 0 holds a reply to");
}
