//! A running server (master, server, real sockets and data file) facing bad
//! peers: garbage, broken frames, a wrong key, a stale routing target. Each bad
//! peer is refused or disconnected with a logged reason, and a good client keeps
//! being served throughout.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::*;
use pfs_client::FileSystem;
use pfs_core::wire::{stamp, Body, Frame, Reply, Request};
use pfs_core::{ClientId, FsError, InodeId, RequestId};
use pfs_net::{ClusterKey, RpcClient, RpcOptions};

static LOGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

struct Capture;

impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            LOGS.get_or_init(Default::default).lock().unwrap().push(format!(
                "{} {}",
                r.level(),
                r.args()
            ));
        }
    }
    fn flush(&self) {}
}

fn wait_for_log(all: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(l) = LOGS
            .get_or_init(Default::default)
            .lock()
            .unwrap()
            .iter()
            .find(|l| all.iter().all(|p| l.contains(p)))
        {
            return l.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no log line with {all:?}: {:#?}",
            LOGS.get().unwrap().lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn raw(addr: SocketAddr, key: &ClusterKey) -> (TcpStream, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    pfs_net::auth::client_handshake(&mut s, key, &addr.to_string(), 0).unwrap();
    let me = s.local_addr().unwrap().to_string();
    (s, me)
}

fn assert_closed(s: &mut TcpStream) {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected the server to close the connection, read {n} bytes"),
    }
}

#[test]
fn bad_peers_are_cut_off_and_good_clients_keep_being_served() {
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let dir = test_dir("bad-input");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let server = pfs_server::start(
        &server_config(&dir, &key_file, master.addr(), 0, 2, 0),
        Duration::from_secs(10),
    )
    .unwrap();
    let addr = server.addr();
    let fs = client(master.addr(), &key);
    let mut files = 0;
    let mut still_serving = |what: &str| {
        let (a, fh) =
            fs.create(InodeId::ROOT, format!("after-{what}").as_bytes(), 0o644, 0, 0, 0).unwrap();
        fs.write(a.ino, fh, 0, what.as_bytes()).unwrap();
        fs.release(a.ino, fh).unwrap();
        files += 1;
        assert_eq!(fs.readdir(InodeId::ROOT, None, 1000).unwrap().len(), files, "after {what}");
    };
    still_serving("start");

    let valid = Frame {
        request_id: RequestId(1),
        client: ClientId(3),
        body: Body::Request(Request::GetAttr { ino: InodeId::ROOT }),
    }
    .to_bytes()
    .unwrap();
    let mut wrong_version = valid.clone();
    wrong_version[4] = 200;
    let version_refused = format!("protocol version 200, expected {}", pfs_core::wire::VERSION);
    let mut oversize = valid.clone();
    oversize[24..28].copy_from_slice(&(pfs_core::wire::MAX_FRAME_PAYLOAD as u32 + 1).to_le_bytes());
    let mut bad_sum = valid.clone();
    *bad_sum.last_mut().unwrap() ^= 0xff;
    let cases: Vec<(&str, Vec<u8>, bool, &str)> = vec![
        (
            "garbage",
            b"GET / HTTP/1.1\r\nHost: pfs\r\n\r\nxxxxxxxxxxxx".to_vec(),
            false,
            "bad magic",
        ),
        ("version", wrong_version, false, &version_refused),
        ("oversize", oversize, false, "is over the limit"),
        ("checksum", bad_sum, false, "checksum mismatch"),
        ("truncated", valid[..valid.len() - 2].to_vec(), true, "truncated message"),
    ];
    for (what, bytes, then_close, reason) in cases {
        let (mut s, me) = raw(addr, &key);
        s.write_all(&bytes).unwrap();
        if then_close {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        wait_for_log(&[&me, reason]);
        assert_closed(&mut s);
        still_serving(what);
    }

    // A wrong key is refused, and both sides say why.
    let wrong = ClusterKey::from_bytes(&[9; 32]).unwrap();
    let e = RpcClient::connect(addr, wrong, RpcOptions::default()).unwrap_err().to_string();
    assert!(e.contains("cluster key mismatch"), "{e}");
    wait_for_log(&["refusing connection from", "did not prove the cluster key"]);
    still_serving("wrong key");

    // A request routed to a worker the server does not have (a stale view) gets
    // an error that says so, on a connection that stays up.
    let mut rpc = RpcClient::connect(addr, key.clone(), RpcOptions::default()).unwrap();
    let frame = Frame {
        request_id: RequestId(0),
        client: ClientId(0),
        body: Body::Request(Request::StatFs),
    };
    match rpc.call_to(&frame, 7, Duration::from_secs(5)).unwrap().body {
        Body::Error { error: FsError::Invalid(text), .. } => {
            assert!(text.contains("runs 2 workers"), "{text}")
        }
        other => panic!("expected an error, got {other:?}"),
    }
    let ok = rpc.call_to(&frame, 1, Duration::from_secs(5)).unwrap();
    assert!(matches!(ok.body, Body::Reply(Reply::StatFs(_))), "{ok:?}");
    // A master request sent to a storage server is refused by name.
    let mut bytes = Frame {
        request_id: RequestId(0),
        client: ClientId(0),
        body: Body::Request(Request::GetView),
    }
    .to_bytes()
    .unwrap();
    stamp(&mut bytes, ClientId(0), RequestId(5), 0);
    let reply = rpc.call(&Frame::decode(&bytes).unwrap(), Duration::from_secs(5)).unwrap();
    assert!(
        matches!(reply.body, Body::Error { error: FsError::Invalid(ref t), .. } if t.contains("master")),
        "{reply:?}"
    );
    still_serving("stale worker");

    drop(fs);
    server.stop().unwrap();
    master.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
