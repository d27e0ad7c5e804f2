//! Shared test helpers: a capturing logger, an echo server thread, keys.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pfs_core::{Body, ClientId, FileHandle, Frame, InodeId, Reply, Request, RequestId};
use pfs_net::{ClusterKey, FrameServer, Listener, ListenerConfig};

static LOGS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();

struct TestLogger;

impl log::Log for TestLogger {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            let line = format!("{} {}", r.level(), r.args());
            eprintln!("{line}");
            LOGS.get_or_init(Default::default).lock().unwrap().push(line);
        }
    }
    fn flush(&self) {}
}

/// Installs the capturing logger (once per test binary).
pub fn init_log() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        log::set_logger(&TestLogger).unwrap();
        log::set_max_level(log::LevelFilter::Info);
    });
}

/// Waits up to 5 s for a log line containing every piece of `all`.
pub fn wait_for_log(all: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let logs = LOGS.get_or_init(Default::default).lock().unwrap();
        if let Some(l) = logs.iter().find(|l| all.iter().all(|p| l.contains(p))) {
            return l.clone();
        }
        drop(logs);
        assert!(
            Instant::now() < deadline,
            "no log line with {all:?}; logs: {:#?}",
            LOGS.get().unwrap().lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn key(byte: u8) -> ClusterKey {
    ClusterKey::from_bytes(&[byte; 32]).unwrap()
}

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Echo rules: Write{data} -> Read(data); Fsync -> Fsync; Read -> no answer ever.
pub fn echo(req: Frame) -> Option<Frame> {
    let reply = match req.body {
        Body::Request(Request::Write { data, .. }) => Reply::Read(data),
        Body::Request(Request::Fsync { .. }) => Reply::Fsync,
        _ => return None,
    };
    Some(Frame { request_id: req.request_id, client: req.client, body: Body::Reply(reply) })
}

pub fn write_frame(data: Vec<u8>) -> Frame {
    Frame {
        request_id: RequestId(0),
        client: ClientId(7),
        body: Body::Request(Request::Write { ino: InodeId(5), fh: FileHandle(1), offset: 0, data }),
    }
}

pub fn read_frame() -> Frame {
    Frame {
        request_id: RequestId(0),
        client: ClientId(7),
        body: Body::Request(Request::Read {
            ino: InodeId(5),
            fh: FileHandle(1),
            offset: 0,
            size: 1,
            blocks: u32::MAX,
        }),
    }
}

/// An echo server on its own thread.
pub struct Server {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start(cfg: ListenerConfig) -> Server {
        let listener = Listener::bind(cfg).unwrap();
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut server = FrameServer::new(listener).unwrap();
            server.run_until(&s, echo);
        });
        Server { addr, stop, handle: Some(handle) }
    }

    pub fn echo(k: ClusterKey) -> Server {
        Server::start(ListenerConfig::new(loopback(), k))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
    }
}
