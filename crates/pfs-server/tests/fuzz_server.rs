//! A live server (real sockets, io_uring data file) fed 100,000 mutated request
//! frames on authenticated connections: each is answered (an error reply for
//! what does not decode) or, for a broken header, the connection is closed with
//! a reason. Throughout, a good client keeps being served, and the server never
//! fail-stops. `PFS_FUZZ_SERVER_FRAMES` sets the count, `PFS_FUZZ_SEED` the seed
//! (printed).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use pfs_client::FileSystem;
use pfs_core::wire::{stamp, Body, Frame, RenameFlags, Request, TokenMode, XattrSetMode};
use pfs_core::{ClientId, FileHandle, FileLayout, InodeId, RequestId, SetAttr};
use pfs_net::ClusterKey;

const HEADER: usize = 32;

fn connect(addr: SocketAddr, key: &ClusterKey) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    pfs_net::auth::client_handshake(&mut s, key, &addr.to_string(), 0).unwrap();
    s
}

/// Reads one frame: its request id and bytes; `None` when the server closed.
fn read_frame(s: &mut TcpStream) -> Option<(u64, Vec<u8>)> {
    let mut head = [0u8; HEADER];
    s.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes(head[24..28].try_into().unwrap()) as usize;
    let mut frame = head.to_vec();
    frame.resize(HEADER + len, 0);
    s.read_exact(&mut frame[HEADER..]).ok()?;
    Some((u64::from_le_bytes(frame[16..24].try_into().unwrap()), frame))
}

fn corpus() -> Vec<Vec<u8>> {
    let root = InodeId::ROOT;
    let name = |n: &str| n.as_bytes().to_vec();
    let reqs = vec![
        Request::Lookup { parent: root, name: name("x") },
        Request::GetAttr { ino: root },
        Request::SetAttr { ino: root, set: SetAttr { perm: Some(0o755), ..SetAttr::default() } },
        Request::Create {
            parent: root,
            name: name("fz"),
            perm: 0o644,
            uid: 0,
            gid: 0,
            flags: 0,
            layout: FileLayout::Block,
        },
        Request::Unlink { parent: root, name: name("fz") },
        Request::Rename {
            parent: root,
            name: name("a"),
            new_parent: root,
            new_name: name("b"),
            flags: RenameFlags::empty(),
        },
        Request::ReadDir {
            ino: root,
            after: Vec::new(),
            max_entries: 10,
            max_bytes: 4096,
            plus: true,
            layout: pfs_core::DirLayout::BigDir,
        },
        Request::Write { ino: root, fh: FileHandle(0), offset: 0, data: vec![1; 100] },
        Request::Read { ino: root, fh: FileHandle(0), offset: 0, size: 4096, blocks: u32::MAX },
        Request::StatFs,
        Request::SetXattr {
            ino: root,
            name: name("user.k"),
            value: vec![3; 20],
            mode: XattrSetMode::Any,
        },
        Request::GetXattr { ino: root, name: name("user.k") },
        Request::TokenAcquire { dir: root, mode: TokenMode::Read },
        Request::ExtendSize { ino: root, size: 10 },
        Request::AdjustDir { dir: root, nlink_delta: 0 },
        Request::LayoutGet { ino: root },
        // (No Fsync: each would wait for a device sync, and its body is two
        // fields the others cover.)
    ];
    reqs.into_iter()
        .map(|r| {
            Frame { request_id: RequestId(0), client: ClientId(3), body: Body::Request(r) }
                .to_bytes()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_hundred_thousand_mutated_frames_leave_the_server_serving() {
    let seed: u64 = std::env::var("PFS_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64 | 1);
    let frames: usize = std::env::var("PFS_FUZZ_SERVER_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    println!("fuzz: {frames} frames to a live server, seed {seed} (PFS_FUZZ_SEED={seed} replays)");
    let dir = test_dir("fuzz-server");
    let cluster = Local::start(&dir, 1, 2);
    let (server, key) = (&cluster.servers[0], cluster.key.clone());
    let addr = server.addr();
    let fs = cluster.client();
    let corpus = corpus();
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut s = connect(addr, &key);
    let (mut answered, mut closed, mut errors) = (0u64, 0u64, 0u64);
    // Batches of frames in flight at once (well under the connection's credits),
    // so the server sees them as a busy client's would arrive.
    const BATCH: usize = 16;
    let mut i = 0;
    while i < frames {
        let mut batch = Vec::with_capacity(BATCH * 256);
        let mut ids = std::collections::BTreeSet::new();
        for _ in 0..BATCH.min(frames - i) {
            let mut f = corpus[(next() % corpus.len() as u64) as usize].clone();
            let header_too = next() % 500 == 0;
            for _ in 0..1 + next() % 4 {
                let body = f.len() - HEADER;
                let at = HEADER + (next() % (body.max(1) as u64)) as usize;
                match next() % 5 {
                    0 if body > 0 => f[at] ^= 1 << (next() % 8),
                    1 if body > 0 => f[at] = next() as u8,
                    2 => f.truncate(at.min(f.len())),
                    3 => f.insert(at.min(f.len()), next() as u8),
                    _ if body > 8 => {
                        let end = (at + 4).min(f.len());
                        f[at..end].fill(0xff)
                    }
                    _ => {}
                }
            }
            let len = (f.len() - HEADER) as u32;
            f[24..28].copy_from_slice(&len.to_le_bytes());
            i += 1;
            let id = i as u64;
            stamp(&mut f, ClientId(3), RequestId(id), (next() % 2) as u16);
            if header_too {
                let (at, bit) = ((next() % 28) as usize, 1u8 << (next() % 8));
                if (24..28).contains(&at) && f[at] & bit == 0 {
                    // A length raised to more bytes than follow, yet under
                    // the frame bound, is a frame still arriving: the server
                    // rightly waits for the rest, and the test waited out its
                    // 10 s read timeout (about ten times a run: 105 of its
                    // 108 s). The length's top bit instead: past any bound,
                    // the connection is closed. (A length lowered reads the
                    // rest as the next header, which fails its checks.)
                    f[27] ^= 0x80;
                } else {
                    f[at] ^= bit;
                }
            }
            ids.insert(id);
            batch.extend_from_slice(&f);
        }
        let mut alive = s.write_all(&batch).is_ok();
        while alive && !ids.is_empty() {
            match read_frame(&mut s) {
                Some((id, reply)) => {
                    if ids.remove(&id) {
                        answered += 1;
                        if let Ok(Frame { body: Body::Error { .. }, .. }) = Frame::decode(&reply) {
                            errors += 1;
                        }
                    }
                }
                None => alive = false,
            }
        }
        if !alive {
            // A broken header closes the connection (the frames after it in the
            // batch are not answered).
            closed += 1;
            s = connect(addr, &key);
        }
        if i % 10_000 < BATCH {
            fs.getattr(InodeId::ROOT).unwrap_or_else(|e| panic!("seed {seed}, frame {i}: {e}"));
            assert_eq!(server.failure(), None, "seed {seed}, frame {i}: the server fail-stopped");
        }
    }
    // The good client is served in full, and the server is whole.
    let (a, fh) = fs.create(InodeId::ROOT, b"after-fuzz", 0o644, 0, 0, 0).unwrap();
    fs.write(a.ino, fh, 0, b"still here").unwrap();
    fs.release(a.ino, fh).unwrap();
    let fh = fs.open(a.ino, 0).unwrap();
    assert_eq!(fs.read(a.ino, fh, 0, 100).unwrap(), b"still here");
    fs.release(a.ino, fh).unwrap();
    assert_eq!(server.failure(), None, "seed {seed}: the server fail-stopped");
    println!(
        "fuzz: {answered} frames answered ({errors} with an error), {closed} connections \
         closed for a broken header, server still serving"
    );
    assert!(answered > frames as u64 / 2, "most frames have a valid header and get an answer");
    assert!(
        errors > 0 && closed > 0,
        "the mutations reach both the decoders and the header checks"
    );
    drop(fs);
    cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
