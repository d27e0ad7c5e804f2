//! A real cluster of processes on 127.0.0.x: a master and three `pfs-server`
//! processes of two workers each, and client processes (this test binary run
//! again in a child role) driving the native client.
//!
//! 1. Two clients run a mixed metadata and data workload, each checking every
//!    read against its own model; afterwards a third client checks that the
//!    cluster holds exactly the union of both models.
//! 2. A server is killed with SIGKILL while a client writes, fsyncs and closes
//!    files, and started again: every file whose fsync and close succeeded is intact,
//!    calls in flight fail or succeed, and the client never hangs.
//! 3. A server comes back at another address (its node replaced): a client
//!    connected before and one connected while it was down both follow it
//!    (they ask the master again), and so do the other servers.
//!
//! `harness = false`: `main` runs the scenarios, or a child role when
//! `PFS_CLUSTER_CHILD` is set.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use common::content;
use common::procs::{child_client, spawn_child, wait_timeout, ClusterProcs, CHILD_ROLE};
use common::read_all;
use pfs_client::FileSystem;
use pfs_core::wire::RenameFlags;
use pfs_core::{FileType, FsError, InodeId, SetAttr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SERVERS: u32 = 3;
const WORKERS: u32 = 2;

fn write_all(
    fs: &dyn FileSystem,
    parent: InodeId,
    name: &[u8],
    data: &[u8],
) -> Result<(), FsError> {
    let (attr, fh) = fs.create(parent, name, 0o644, 0, 0, 0)?;
    let mut r = Ok(());
    for (k, chunk) in data.chunks(150_000).enumerate() {
        if let Err(e) = fs.write(attr.ino, fh, (k * 150_000) as u64, chunk) {
            r = Err(e);
            break;
        }
    }
    // Close makes the file visible, fsync durable (docs/reliability.md).
    let r = r.and_then(|()| fs.fsync(attr.ino, fh, false));
    let closed = fs.release(attr.ino, fh);
    r.and(closed)
}

/// Mixed workload in directory `c<id>` checked against a model; prints the model.
fn child_mixed(id: u64) {
    let fs = child_client();
    let top = fs.mkdir(InodeId::ROOT, format!("c{id}").as_bytes(), 0o755, 0, 0).unwrap();
    let sub = fs.mkdir(top.ino, b"sub", 0o755, 0, 0).unwrap();
    let dirs = [(top.ino, "".to_string()), (sub.ino, "sub/".to_string())];
    let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut rng = StdRng::seed_from_u64(0x5eed + id);
    for step in 0..300u64 {
        let (dir, prefix) = &dirs[rng.gen_range(0..2)];
        let name = format!("n{}", rng.gen_range(0..40));
        let path = format!("{prefix}{name}");
        match rng.gen_range(0..10) {
            0..=3 => {
                let data = content(step * 13 + id);
                let r = write_all(&fs, *dir, name.as_bytes(), &data);
                match model.contains_key(&path) {
                    true => assert_eq!(r, Err(FsError::Exists), "create of existing {path}"),
                    false => {
                        r.unwrap();
                        model.insert(path, data);
                    }
                }
            }
            4 | 5 => {
                let r = fs.lookup(*dir, name.as_bytes());
                match model.get(&path) {
                    Some(data) => {
                        assert_eq!(&read_all(&fs, r.unwrap().ino).unwrap(), data, "read {path}")
                    }
                    None => assert_eq!(r.unwrap_err(), FsError::NotFound, "lookup {path}"),
                }
            }
            6 => {
                let r = fs.unlink(*dir, name.as_bytes());
                match model.remove(&path) {
                    Some(_) => r.unwrap(),
                    None => assert_eq!(r.unwrap_err(), FsError::NotFound),
                }
            }
            7 | 8 => {
                let (to_dir, to_prefix) = &dirs[rng.gen_range(0..2)];
                let to_name = format!("n{}", rng.gen_range(0..40));
                let to_path = format!("{to_prefix}{to_name}");
                let r = fs.rename(
                    *dir,
                    name.as_bytes(),
                    *to_dir,
                    to_name.as_bytes(),
                    RenameFlags::empty(),
                );
                match model.remove(&path) {
                    Some(data) => {
                        r.unwrap();
                        model.insert(to_path, data);
                    }
                    None => {
                        assert_eq!(r.unwrap_err(), FsError::NotFound, "rename of missing {path}")
                    }
                }
            }
            _ => {
                if let Some(data) = model.get_mut(&path) {
                    let size = rng.gen_range(0..=data.len() as u64);
                    let a = fs.lookup(*dir, name.as_bytes()).unwrap();
                    fs.setattr(a.ino, &SetAttr { size: Some(size), ..SetAttr::default() }).unwrap();
                    data.truncate(size as usize);
                }
            }
        }
    }
    for (path, data) in &model {
        println!("file c{id}/{path} {} {:08x}", data.len(), crc32c::crc32c(data));
    }
    println!("done");
}

/// Writes, fsyncs, closes and reports files until told to stop by a missing server.
fn child_durable() {
    let fs = child_client();
    let dir = fs.mkdir(InodeId::ROOT, b"durable", 0o755, 0, 0).unwrap();
    let mut out = std::io::stdout().lock();
    for i in 0..400u64 {
        let started = Instant::now();
        let r = write_all(&fs, dir.ino, format!("f{i}").as_bytes(), &content(i));
        // No call may hang: every one ends within the request timeout (3 s), a
        // write-and-close within a few of them.
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "file {i} took {:?}",
            started.elapsed()
        );
        match r {
            Ok(()) => writeln!(out, "durable {i}").unwrap(),
            Err(e) => writeln!(out, "failed {i} {e}").unwrap(),
        }
        out.flush().unwrap();
    }
    writeln!(out, "done").unwrap();
}

// ---- scenarios ----

fn mixed_workload(c: &ClusterProcs) {
    let kids: Vec<_> = (0..2).map(|id| spawn_child(c, &format!("mixed:{id}"))).collect();
    let mut expected: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for (mut child, rx) in kids {
        let mut done = false;
        for line in rx.iter() {
            if line == "done" {
                done = true;
            } else if let Some(rest) = line.strip_prefix("file ") {
                let f: Vec<&str> = rest.split(' ').collect();
                expected.insert(
                    f[0].to_owned(),
                    (f[1].parse().unwrap(), u32::from_str_radix(f[2], 16).unwrap()),
                );
            }
        }
        let status = wait_timeout(&mut child, Duration::from_secs(60)).expect("client exits");
        assert!(status.success() && done, "client failed: {status}");
    }
    // A third client sees exactly what both models say.
    let fs = c.client();
    let mut found: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    let mut stack = vec![(InodeId::ROOT, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let page = fs.readdir(dir, after.as_deref(), 16).unwrap();
            let Some(last) = page.last() else { break };
            after = Some(last.name.clone());
            for e in page {
                let name = String::from_utf8(e.name).unwrap();
                if e.kind == FileType::Directory {
                    stack.push((e.ino, format!("{prefix}{name}/")));
                } else {
                    let data = read_all(&fs, fs.lookup(dir, name.as_bytes()).unwrap().ino).unwrap();
                    found.insert(
                        format!("{prefix}{name}"),
                        (data.len() as u64, crc32c::crc32c(&data)),
                    );
                }
            }
        }
    }
    assert_eq!(found, expected, "the cluster's files differ from the clients' models");
    println!("mixed workload: {} files match the models of 2 clients", found.len());
}

fn sigkill_a_server(c: &mut ClusterProcs) {
    let (mut child, rx) = spawn_child(c, "durable");
    let mut durable = Vec::new();
    let mut failed = 0;
    let mut killed = false;
    let mut restarted = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(e) => panic!("the client went silent ({e}): a call hangs"),
        };
        assert!(Instant::now() < deadline, "workload did not finish");
        if line == "done" {
            break;
        }
        if let Some(i) = line.strip_prefix("durable ") {
            durable.push(i.parse::<u64>().unwrap());
        } else if line.starts_with("failed ") {
            failed += 1;
        }
        if !killed && durable.len() == 60 {
            c.kill_server(1);
            killed = true;
        }
        if killed && !restarted && failed >= 3 {
            c.servers[1] = Some(c.spawn_server(1, &[]));
            restarted = true;
        }
    }
    let status = wait_timeout(&mut child, Duration::from_secs(30)).expect("client exits");
    assert!(status.success(), "durable client failed: {status}");
    assert!(killed && restarted, "the kill happened ({killed}) and the restart ({restarted})");
    c.wait_registered(SERVERS);
    let fs = c.client();
    let dir = fs.lookup(InodeId::ROOT, b"durable").unwrap();
    for &i in &durable {
        let a = fs
            .lookup(dir.ino, format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("durable f{i}: {e}"));
        assert_eq!(read_all(&fs, a.ino).unwrap(), content(i), "durable file f{i}");
    }
    assert!(durable.len() > 60, "writes resumed after the restart ({} durable)", durable.len());
    println!(
        "sigkill: {} durable files intact, {failed} calls failed while server 1 was down",
        durable.len()
    );
}

/// Server 2 is stopped, its config moved to another address, and started
/// again: clients connected before and during the move reach its files and
/// make new ones, renames across servers included.
fn a_server_moves(c: &mut ClusterProcs) {
    const DIRS: u64 = 24;
    let moved = 2usize;
    let early = c.client_with_timeout(Duration::from_secs(20));
    let top = early.mkdir(InodeId::ROOT, b"moves", 0o755, 0, 0).unwrap();
    let mut dirs = Vec::new();
    for i in 0..DIRS {
        let d = early.mkdir(top.ino, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap();
        write_all(&early, d.ino, b"f", &content(i)).unwrap();
        dirs.push(d.ino);
    }
    let on_moved = |fs: &pfs_client::Cluster| -> u64 {
        let w = WORKERS as usize;
        fs.requests_sent()[moved * w..(moved + 1) * w].iter().sum()
    };
    assert!(on_moved(&early) > 0, "some of the files are on server {moved}");
    let whole = early.statfs().unwrap();

    c.kill_server(moved);
    // A client that connects while the server is down: the rest of the
    // namespace is there, the server's part once it is back.
    let mut o = pfs_client::ClusterOptions::new(
        c.master_addr,
        pfs_net::ClusterKey::load(&c.dir.join("cluster.key")).unwrap(),
    );
    o.request_timeout = Duration::from_secs(20);
    let late = pfs_client::Cluster::connect(o).expect("a client connects while one server is down");
    // `df` answers for the servers that are up, at once, rather than waiting
    // out the request timeout (20 s) and failing.
    for (who, fs) in [("early", &early), ("late", &late)] {
        let started = Instant::now();
        let st =
            fs.statfs().unwrap_or_else(|e| panic!("{who}: statfs with server {moved} down: {e}"));
        assert!(started.elapsed() < Duration::from_secs(10), "{who}: took {:?}", started.elapsed());
        let servers = u64::from(SERVERS);
        assert_eq!(st.blocks, whole.blocks / servers * (servers - 1), "{who}: the others' blocks");
        assert!(
            st.files > 0 && st.files < whole.files,
            "{who}: {} of {} inodes",
            st.files,
            whole.files
        );
    }
    let old = c.server_config(moved as u32).listen;
    let ip = "127.0.0.20";
    let new = format!("{ip}:{}", common::procs::free_port(ip));
    let path = c.dir.join(format!("server-{moved}.toml"));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(&format!("listen = \"{old}\""), &format!("listen = \"{new}\"")),
    )
    .unwrap();
    assert_eq!(c.server_config(moved as u32).listen, new, "the config moved");
    c.servers[moved] = Some(c.spawn_server(moved as u32, &[]));
    let key = pfs_net::ClusterKey::load(&c.dir.join("cluster.key")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = pfs_client::cluster::fetch_view(c.master_addr, &key, Duration::from_secs(2));
        if v.is_ok_and(|v| v.servers[moved].addr == new && v.servers[moved].up) {
            break;
        }
        assert!(Instant::now() < deadline, "server {moved} did not register at {new}");
        std::thread::sleep(Duration::from_millis(50));
    }

    for (who, fs) in [("early", &early), ("late", &late)] {
        let before = on_moved(fs);
        for (i, &d) in dirs.iter().enumerate() {
            let f = fs.lookup(d, b"f").unwrap_or_else(|e| panic!("{who}: d{i}/f: {e}"));
            assert_eq!(read_all(fs, f.ino).unwrap(), content(i as u64), "{who}: d{i}/f");
            let name = format!("{who}{i}");
            write_all(fs, d, name.as_bytes(), &content(100 + i as u64))
                .unwrap_or_else(|e| panic!("{who}: d{i}/{name}: {e}"));
            // Into the next directory: across servers for most of them.
            let next = dirs[(i + 1) % dirs.len()];
            fs.rename(d, name.as_bytes(), next, name.as_bytes(), RenameFlags::empty())
                .unwrap_or_else(|e| panic!("{who}: rename d{i}/{name}: {e}"));
        }
        assert!(on_moved(fs) > before, "{who} reached server {moved} at its new address");
    }
    let check = c.client();
    for (i, &d) in dirs.iter().enumerate() {
        for who in ["early", "late"] {
            let from = (i + dirs.len() - 1) % dirs.len();
            let f = check
                .lookup(d, format!("{who}{from}").as_bytes())
                .unwrap_or_else(|e| panic!("d{i}/{who}{from}: {e}"));
            assert_eq!(read_all(&check, f.ino).unwrap(), content(100 + from as u64));
        }
    }
    println!("moved: server {moved} from {old} to {new}, followed by clients and servers");

    // Without the root's server nothing is reachable: a client connecting
    // then fails at once, naming it, instead of waiting out its requests.
    drop((early, late, check));
    c.kill_server(0);
    let mut o = pfs_client::ClusterOptions::new(
        c.master_addr,
        pfs_net::ClusterKey::load(&c.dir.join("cluster.key")).unwrap(),
    );
    o.request_timeout = Duration::from_secs(20);
    let started = Instant::now();
    let e = pfs_client::Cluster::connect(o).expect_err("the root's server is down");
    assert!(e.to_string().contains("server 0"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    let before = c.serving_lines(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_serving(0, before);
    c.wait_registered(SERVERS);
}

fn main() {
    if let Ok(role) = std::env::var(CHILD_ROLE) {
        match role.split_once(':') {
            Some(("mixed", id)) => child_mixed(id.parse().unwrap()),
            None if role == "durable" => child_durable(),
            _ => panic!("unknown child role {role}"),
        }
        return;
    }
    let dir = common::test_dir("cluster-procs");
    let mut c = ClusterProcs::start(&dir, SERVERS, WORKERS);
    mixed_workload(&c);
    sigkill_a_server(&mut c);
    a_server_moves(&mut c);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
    println!("cluster: ok");
}
