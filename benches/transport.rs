//! Transport round trip: a small request frame to an echo server thread and its
//! reply, over tcp and over shared memory on loopback, each plain and with slot RPC
//! (replies written one-sided into the client's inbox, the protocol of RDMA links);
//! one at a time (latency), 32 in flight (throughput), a 64 KiB write and a 64 KiB
//! read. Client and server both busy-poll, as workers do.
//!
//! `cargo bench --bench transport`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pfs_core::{Body, ClientId, FileHandle, Frame, InodeId, Reply, Request, RequestId};
use pfs_net::{
    ClusterKey, FrameServer, Listener, ListenerConfig, RpcClient, RpcOptions, SlotRpc,
    TransportKind,
};

const IN_FLIGHT: usize = 32;

struct Echo {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Echo {
    fn start(key: ClusterKey) -> Echo {
        let mut cfg = ListenerConfig::new("127.0.0.1:0".parse().expect("addr"), key);
        cfg.credits = IN_FLIGHT as u32;
        let listener = Listener::bind(cfg).expect("bind");
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut server = FrameServer::new(listener).expect("server");
            server.run_until(&s, |req| {
                let reply = match req.body {
                    Body::Request(Request::Write { data, .. }) => {
                        Reply::Write { written: data.len() as u32, ctime_before: 0, ctime: 0 }
                    }
                    Body::Request(Request::Read { size, .. }) => {
                        Reply::Read(vec![7; size as usize])
                    }
                    _ => Reply::Fsync,
                };
                Some(Frame {
                    request_id: req.request_id,
                    client: req.client,
                    body: Body::Reply(reply),
                })
            });
        });
        Echo { addr, stop, thread: Some(thread) }
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().expect("echo thread");
        }
    }
}

fn request(body: Request) -> Frame {
    Frame { request_id: RequestId(0), client: ClientId(1), body: Body::Request(body) }
}

fn fsync() -> Frame {
    request(Request::Fsync { ino: InodeId(9), fh: FileHandle(1), datasync: true })
}

fn write(len: usize) -> Frame {
    request(Request::Write { ino: InodeId(9), fh: FileHandle(1), offset: 0, data: vec![7; len] })
}

fn read(len: u32) -> Frame {
    request(Request::Read {
        ino: InodeId(9),
        fh: FileHandle(1),
        offset: 0,
        size: len,
        blocks: u32::MAX,
    })
}

/// Sends and busy-polls until the reply is here.
fn round_trip(c: &mut RpcClient, frame: &Frame) {
    let id = c.send(frame).expect("send");
    while c.poll(id).expect("poll").is_none() {}
}

fn bench(crit: &mut Criterion) {
    let key = ClusterKey::from_bytes(&[5; 32]).expect("key");
    let echo = Echo::start(key.clone());
    let variants = [
        ("tcp", TransportKind::Tcp, false),
        ("tcp_slots", TransportKind::Tcp, true),
        ("shm", TransportKind::Shm, false),
        ("shm_slots", TransportKind::Shm, true),
    ];
    for (name, transport, slots) in variants {
        let mut opts = RpcOptions::default();
        opts.connect.transport = transport;
        opts.connect.slot_rpc =
            slots.then_some(SlotRpc { slots: IN_FLIGHT as u32, ..SlotRpc::default() });
        let mut c = RpcClient::connect(echo.addr, key.clone(), opts).expect("connect");
        let small = fsync();
        let mut g = crit.benchmark_group(format!("transport_{name}"));
        g.measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1))
            .sample_size(20);
        g.throughput(Throughput::Elements(1));
        g.bench_function("round_trip_small", |b| b.iter(|| round_trip(&mut c, &small)));
        g.throughput(Throughput::Elements(IN_FLIGHT as u64));
        let mut ids = Vec::with_capacity(IN_FLIGHT);
        g.bench_function("pipelined_32_small", |b| {
            b.iter(|| {
                ids.extend((0..IN_FLIGHT).map(|_| c.send(&small).expect("send")));
                for id in ids.drain(..) {
                    while c.poll(id).expect("poll").is_none() {}
                }
            })
        });
        let big = write(64 << 10);
        g.throughput(Throughput::Bytes(64 << 10));
        g.bench_function("round_trip_write_64k", |b| b.iter(|| round_trip(&mut c, &big)));
        let read = read(64 << 10);
        g.bench_function("round_trip_read_64k", |b| b.iter(|| round_trip(&mut c, &read)));
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
