//! A master and two servers of two workers each in this process, on real sockets
//! and io_uring data files, driven through the native client.

mod common;

use std::time::Duration;

use common::*;
use pfs_client::FileSystem;
use pfs_core::routing::dentry_shard;
use pfs_core::wire::{RenameFlags, XattrSetMode};
use pfs_core::{DirLayout, FileType, FsError, InodeId, SetAttr};

fn write_file(fs: &dyn FileSystem, parent: InodeId, name: &str, data: &[u8]) -> InodeId {
    let (attr, fh) = fs.create(parent, name.as_bytes(), 0o644, 0, 0, 0).unwrap();
    for (k, chunk) in data.chunks(100_000).enumerate() {
        fs.write(attr.ino, fh, (k * 100_000) as u64, chunk).unwrap();
    }
    fs.release(attr.ino, fh).unwrap();
    attr.ino
}

fn read_file(fs: &dyn FileSystem, ino: InodeId) -> Vec<u8> {
    read_all(fs, ino).unwrap()
}

#[test]
fn a_two_server_cluster_serves_files_and_survives_a_restart() {
    let dir = test_dir("inprocess");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 2)).unwrap();
    let servers: Vec<_> = (0..2)
        .map(|n| {
            let cfg = server_config(&dir, &key_file, master.addr(), n, 2, 0);
            pfs_server::start(&cfg, Duration::from_secs(10)).unwrap()
        })
        .collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.addr().port()).collect();
    let fs = client(master.addr(), &key);

    // Files of every size class in the root (a bigdir: names spread over 4 shards).
    let mut inos = Vec::new();
    for i in 0..40u64 {
        inos.push(write_file(&fs, InodeId::ROOT, &format!("f{i}"), &content(i)));
    }
    for (i, &ino) in inos.iter().enumerate() {
        assert_eq!(read_file(&fs, ino), content(i as u64), "file f{i}");
        assert_eq!(
            fs.lookup(InodeId::ROOT, format!("f{i}").as_bytes()).unwrap().size,
            content(i as u64).len() as u64
        );
    }
    let mut names: Vec<Vec<u8>> = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = fs.readdir(InodeId::ROOT, after.as_deref(), 7).unwrap();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().name.clone());
        names.extend(page.into_iter().map(|e| e.name));
    }
    names.sort();
    let mut want: Vec<Vec<u8>> = (0..40).map(|i| format!("f{i}").into_bytes()).collect();
    want.sort();
    assert_eq!(names, want);

    // Directories, a regular-layout one with a rename inside, errors.
    let d = fs.mkdir(InodeId::ROOT, b"dir", 0o755, 0, 0).unwrap();
    assert_eq!(d.kind, FileType::Directory);
    assert_eq!(fs.mkdir(InodeId::ROOT, b"dir", 0o755, 0, 0).unwrap_err(), FsError::Exists);
    let r = fs.mkdir(d.ino, b"reg", 0o755, 0, 0).unwrap();
    fs.setxattr(r.ino, b"user.pfs.dir_layout", b"regular", Default::default()).unwrap();
    write_file(&fs, r.ino, "a", b"hello");
    fs.rename(r.ino, b"a", r.ino, b"b", RenameFlags::empty()).unwrap();
    assert_eq!(fs.lookup(r.ino, b"a").unwrap_err(), FsError::NotFound);
    assert_eq!(read_file(&fs, fs.lookup(r.ino, b"b").unwrap().ino), b"hello");
    assert_eq!(fs.rmdir(d.ino, b"reg").unwrap_err(), FsError::NotEmpty);
    fs.unlink(r.ino, b"b").unwrap();
    fs.rmdir(d.ino, b"reg").unwrap();
    write_file(&fs, d.ino, "x", b"x");
    assert_eq!(fs.rmdir(InodeId::ROOT, b"dir").unwrap_err(), FsError::NotEmpty);
    assert_eq!(fs.unlink(InodeId::ROOT, b"dir").unwrap_err(), FsError::IsDir);
    assert_eq!(fs.lookup(InodeId::ROOT, &[b'n'; 256]).unwrap_err(), FsError::NameTooLong);

    // Renames between names on different shards (most names of a bigdir).
    for i in 0..10u64 {
        fs.rename(
            InodeId::ROOT,
            format!("f{i}").as_bytes(),
            d.ino,
            format!("moved{i}").as_bytes(),
            RenameFlags::empty(),
        )
        .unwrap();
    }
    for i in 0..10u64 {
        assert_eq!(
            fs.lookup(InodeId::ROOT, format!("f{i}").as_bytes()).unwrap_err(),
            FsError::NotFound
        );
        let a = fs.lookup(d.ino, format!("moved{i}").as_bytes()).unwrap();
        assert_eq!(read_file(&fs, a.ino), content(i));
    }
    // Replace, noreplace and exchange across shards.
    fs.rename(d.ino, b"moved0", d.ino, b"moved1", RenameFlags::empty()).unwrap();
    assert_eq!(read_file(&fs, fs.lookup(d.ino, b"moved1").unwrap().ino), content(0));
    assert_eq!(
        fs.rename(d.ino, b"moved2", d.ino, b"moved3", RenameFlags::NOREPLACE).unwrap_err(),
        FsError::Exists
    );
    fs.rename(d.ino, b"moved2", d.ino, b"moved3", RenameFlags::EXCHANGE).unwrap();
    assert_eq!(read_file(&fs, fs.lookup(d.ino, b"moved3").unwrap().ino), content(2));
    assert_eq!(read_file(&fs, fs.lookup(d.ino, b"moved2").unwrap().ino), content(3));
    assert_eq!(
        fs.rename(d.ino, b"nope", d.ino, b"moved3", RenameFlags::empty()).unwrap_err(),
        FsError::NotFound
    );
    for i in 0..10u64 {
        let from = if i == 0 { "moved1".to_string() } else { format!("moved{i}") };
        if i == 1 {
            continue;
        }
        let back = match i {
            2 => 3,
            3 => 2,
            _ => i,
        };
        fs.rename(
            d.ino,
            from.as_bytes(),
            InodeId::ROOT,
            format!("f{back}").as_bytes(),
            RenameFlags::empty(),
        )
        .unwrap();
    }
    assert_eq!(read_file(&fs, fs.lookup(InodeId::ROOT, b"f0").unwrap().ino), content(0));
    let f1 = write_file(&fs, InodeId::ROOT, "f1", &content(1));
    assert_eq!(read_file(&fs, f1), content(1));

    // Truncate frees blocks on other shards; the space comes back on unlink.
    let big = fs.lookup(InodeId::ROOT, b"f37").unwrap();
    assert!(big.size > 200_000, "f37 spans several blocks");
    let before = fs.statfs().unwrap();
    fs.setattr(big.ino, &SetAttr { size: Some(70_000), ..SetAttr::default() }).unwrap();
    assert_eq!(read_file(&fs, big.ino), content(37)[..70_000].to_vec());
    fs.unlink(InodeId::ROOT, b"f37").unwrap();
    // Freed pages count as free once the change is committed (within 50 ms).
    let mut after_free = fs.statfs().unwrap();
    for _ in 0..100 {
        if after_free.blocks_free > before.blocks_free {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        after_free = fs.statfs().unwrap();
    }
    assert!(after_free.blocks_free > before.blocks_free, "{before:?} -> {after_free:?}");

    // A client kept across the restart, with a file open.
    let kept = client(master.addr(), &key);
    let f0 = kept.lookup(InodeId::ROOT, b"f5").unwrap().ino;
    let kept_fh = kept.open(f0, 0).unwrap();
    assert_eq!(kept.read(f0, kept_fh, 0, 100).unwrap(), content(5)[..100]);
    // Stop both servers (checkpoint) and start them again on the same ports.
    drop(fs);
    for s in servers {
        s.stop().unwrap();
    }
    let servers: Vec<_> = (0..2)
        .map(|n| {
            let cfg = server_config(&dir, &key_file, master.addr(), n, 2, ports[n as usize]);
            pfs_server::start(&cfg, Duration::from_secs(10)).unwrap()
        })
        .collect();
    let fs = client(master.addr(), &key);
    for i in 0..37u64 {
        let a = fs.lookup(InodeId::ROOT, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(read_file(&fs, a.ino), content(i), "file f{i} after restart");
    }
    assert_eq!(fs.lookup(InodeId::ROOT, b"f37").unwrap_err(), FsError::NotFound);
    // Its first read after the restart finds the connection dropped and is
    // sent again on the new one, by read and read_with alike (no EIO).
    let mut got = Vec::new();
    kept.read_with(f0, kept_fh, 0, 100, &mut |d| got = d.to_vec()).unwrap();
    assert_eq!(got, content(5)[..100]);
    assert_eq!(kept.read(f0, kept_fh, 100, 100).unwrap(), content(5)[100..200]);
    drop(kept);
    drop(fs);
    for s in servers {
        s.stop().unwrap();
    }
    master.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cached_directory_name_is_invalidated_when_another_client_changes_it() {
    with_two_long_ttl_clients("tokens", |a, b| {
        let seen = record_invalidations(&a);

        let d = b.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
        assert_eq!(a.lookup(InodeId::ROOT, b"d").unwrap().ino, d.ino);
        let (hits, _) = a.dentry_cache_stats();
        assert_eq!(a.lookup(InodeId::ROOT, b"d").unwrap().ino, d.ino);
        assert_eq!(a.dentry_cache_stats().0, hits + 1, "the second lookup is a cache hit");
        // Served from A's cache now: B's rename must reach A as an invalidation.
        b.rename(InodeId::ROOT, b"d", InodeId::ROOT, b"e", RenameFlags::empty()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match a.lookup(InodeId::ROOT, b"d") {
                Err(FsError::NotFound) => break,
                Ok(_) => assert!(std::time::Instant::now() < deadline, "A still sees the old name"),
                Err(e) => panic!("{e}"),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(a.lookup(InodeId::ROOT, b"e").unwrap().ino, d.ino);
        let got = seen.lock().unwrap().clone();
        assert!(
            got.contains(&pfs_client::Invalidation::Entry {
                parent: InodeId::ROOT,
                name: b"d".to_vec()
            }),
            "the kernel callback was told: {got:?}"
        );
        // rmdir by B is seen by A as well.
        b.rmdir(InodeId::ROOT, b"e").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while a.lookup(InodeId::ROOT, b"e").is_ok() {
            assert!(std::time::Instant::now() < deadline, "A still sees the removed directory");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// A token invalidation reaches its client whichever worker serves the
/// client's connection: the directories live on both shards, and A's one
/// connection is served by one worker, so for one of them the worker that
/// revokes A's token hands the invalidation to the other.
#[test]
fn an_invalidation_reaches_a_client_whichever_worker_serves_it() {
    with_two_long_ttl_clients("tokens-workers", |a, b| {
        // Told only by a server's invalidation, not when a lease runs out.
        let seen = record_invalidations(&a);
        let mut dirs = Vec::new();
        for i in 0..64 {
            let d = b.mkdir(InodeId::ROOT, format!("p{i}").as_bytes(), 0o755, 0, 0).unwrap();
            if !dirs.iter().any(|(_, s)| *s == d.ino.shard()) {
                dirs.push((d.ino, d.ino.shard()));
            }
        }
        assert_eq!(dirs.len(), 2, "64 directories all on one shard: {dirs:?}");
        for (dir, shard) in dirs {
            let x = b.mkdir(dir, b"x", 0o755, 0, 0).unwrap();
            assert_eq!(a.lookup(dir, b"x").unwrap().ino, x.ino);
            b.rename(dir, b"x", dir, b"y", RenameFlags::empty()).unwrap();
            let told = pfs_client::Invalidation::Inode { ino: dir };
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !seen.lock().unwrap().contains(&told) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "A was never told of the rename in the directory on {shard:?}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(a.lookup(dir, b"x"), Err(FsError::NotFound));
        }
    });
}

/// What the servers' invalidations tell `client`'s kernel callback, as it is told.
fn record_invalidations(
    client: &pfs_client::Cluster,
) -> std::sync::Arc<std::sync::Mutex<Vec<pfs_client::Invalidation>>> {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    client.set_invalidator(Box::new(move |inv| s.lock().unwrap().push(inv)));
    seen
}

/// One master and one server of 2 workers, and two clients A and B whose cached
/// names outlive the test (only an invalidation can end one): runs `body(A, B)`.
fn with_two_long_ttl_clients(
    name: &str,
    body: impl FnOnce(pfs_client::Cluster, pfs_client::Cluster),
) {
    let dir = test_dir(name);
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let cfg = server_config(&dir, &key_file, master.addr(), 0, 2, 0);
    let server = pfs_server::start(&cfg, Duration::from_secs(10)).unwrap();
    let client = || {
        let mut o = pfs_client::ClusterOptions::new(master.addr(), key.clone());
        o.dentry_ttl = Duration::from_secs(600);
        pfs_client::Cluster::connect(o).unwrap()
    };
    body(client(), client());
    server.stop().unwrap();
    master.stop();
}

/// A directory renamed away and replaced by a new one of the same name, right
/// before another client looks the name up: that client, which cached the
/// old name under its read token, finds the new directory. The rename waits
/// for its acknowledgment (docs/cluster.md, "Dentry cache and tokens");
/// before, it went on at once and the other client's cache answered the old
/// directory until its notification thread ran.
#[test]
fn a_directory_renamed_away_is_not_found_under_its_name_by_another_client() {
    let dir = test_dir("renamed-away");
    let cluster = Local::start(&dir, 2, 2);
    let (a, b) = (cluster.client(), cluster.client());
    for round in 0..20 {
        let old = a.mkdir(InodeId::ROOT, b"out", 0o755, 0, 0).unwrap();
        // B caches the name (its lookup takes a read token on the root).
        assert_eq!(b.lookup(InodeId::ROOT, b"out").unwrap().ino, old.ino);
        assert_eq!(b.lookup(InodeId::ROOT, b"out").unwrap().ino, old.ino);
        let away = format!("away{round}");
        a.rename(InodeId::ROOT, b"out", InodeId::ROOT, away.as_bytes(), RenameFlags::empty())
            .unwrap();
        let new = a.mkdir(InodeId::ROOT, b"out", 0o755, 0, 0).unwrap();
        let found = b.lookup(InodeId::ROOT, b"out").unwrap();
        assert_eq!(found.ino, new.ino, "round {round}: B found the renamed directory");
        a.rmdir(InodeId::ROOT, b"out").unwrap();
        a.rmdir(InodeId::ROOT, away.as_bytes()).unwrap();
    }
    let (hits, _) = b.dentry_cache_stats();
    assert!(hits >= 20, "B answered from its dentry cache ({hits} hits): the test reached it");
    drop((a, b));
    cluster.stop();
}

/// Another client's rename that falls between a lookup's reply and the caching
/// of its name (made to fall there by the lookup hook) never leaves the old
/// name cached: neither when the lookup ran before this client held a read
/// token (no invalidation was owed to it), nor when it held one.
#[test]
fn a_rename_inside_a_lookup_never_leaves_the_old_name_cached() {
    use std::sync::{Arc, Mutex};

    with_two_long_ttl_clients("tokens-race", |a, b| {
        let b = Arc::new(b);
        b.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
        // The next lookup of `name` by A: B renames it to `to` right after the reply.
        type Rename = (&'static [u8], &'static [u8]);
        let planned: Arc<Mutex<Option<Rename>>> = Arc::new(Mutex::new(None));
        let (p, bb) = (planned.clone(), b.clone());
        a.set_lookup_hook(Box::new(move |parent, name| {
            let step = p.lock().unwrap().take_if(|(from, _)| *from == name);
            if let Some((from, to)) = step {
                bb.rename(parent, from, parent, to, RenameFlags::empty()).unwrap();
            }
        }));

        // A holds no token on the root yet: B's rename owes it no invalidation.
        *planned.lock().unwrap() = Some((b"d", b"e"));
        assert!(a.lookup(InodeId::ROOT, b"d").is_ok(), "the answer from before the rename");
        assert!(planned.lock().unwrap().is_none(), "the hook ran");
        assert_eq!(a.lookup(InodeId::ROOT, b"d").unwrap_err(), FsError::NotFound);

        // A holds a token now (taken above): B's rename revokes it mid-lookup.
        *planned.lock().unwrap() = Some((b"e", b"f"));
        assert!(a.lookup(InodeId::ROOT, b"e").is_ok());
        assert!(planned.lock().unwrap().is_none(), "the hook ran");
        assert_eq!(a.lookup(InodeId::ROOT, b"e").unwrap_err(), FsError::NotFound);

        // Undisturbed, a name is cached and the next lookup is a hit.
        let f = a.lookup(InodeId::ROOT, b"f").unwrap();
        let (hits, _) = a.dentry_cache_stats();
        assert_eq!(a.lookup(InodeId::ROOT, b"f").unwrap().ino, f.ino);
        assert_eq!(a.dentry_cache_stats().0, hits + 1, "the second lookup is a cache hit");
    });
}

#[test]
fn rmdir_of_a_bigdir_checks_every_shard_while_creates_go_on() {
    let dir = test_dir("rmdir-big");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 2)).unwrap();
    let servers: Vec<_> = (0..2)
        .map(|n| {
            let cfg = server_config(&dir, &key_file, master.addr(), n, 2, 0);
            pfs_server::start(&cfg, Duration::from_secs(10)).unwrap()
        })
        .collect();
    let a = client(master.addr(), &key);
    let b = client(master.addr(), &key);

    // One entry, on whichever of the 4 shards its name hashes to, keeps it.
    let e = a.mkdir(InodeId::ROOT, b"e", 0o755, 0, 0).unwrap();
    let (f, fh) = a.create(e.ino, b"only", 0o644, 0, 0, 0).unwrap();
    a.release(f.ino, fh).unwrap();
    assert_eq!(b.rmdir(InodeId::ROOT, b"e").unwrap_err(), FsError::NotEmpty);
    a.unlink(e.ino, b"only").unwrap();
    b.rmdir(InodeId::ROOT, b"e").unwrap();
    assert_eq!(a.lookup(InodeId::ROOT, b"e").unwrap_err(), FsError::NotFound);

    // Creates racing rmdirs: every rmdir sees the directory non-empty, every
    // create succeeds (a create that meets a seal waits and retries).
    let d = a.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
    let (f, fh) = a.create(d.ino, b"first", 0o644, 0, 0, 0).unwrap();
    a.release(f.ino, fh).unwrap();
    std::thread::scope(|s| {
        let creator = s.spawn(|| {
            for i in 0..150 {
                let (f, fh) = a.create(d.ino, format!("a{i}").as_bytes(), 0o644, 0, 0, 0).unwrap();
                a.release(f.ino, fh).unwrap();
            }
        });
        let mut refused = 0;
        while !creator.is_finished() {
            assert_eq!(b.rmdir(InodeId::ROOT, b"d").unwrap_err(), FsError::NotEmpty);
            refused += 1;
        }
        assert!(refused > 0, "rmdir raced the creates at least once");
    });
    assert_eq!(a.readdir(d.ino, None, 1000).unwrap().len(), 151);
    for i in 0..150 {
        a.unlink(d.ino, format!("a{i}").as_bytes()).unwrap();
    }
    a.unlink(d.ino, b"first").unwrap();
    b.rmdir(InodeId::ROOT, b"d").unwrap();
    assert!(a.readdir(InodeId::ROOT, None, 100).unwrap().is_empty());
    // The seals are gone: a new directory of the same name works normally.
    let d2 = a.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
    let (f, fh) = a.create(d2.ino, b"x", 0o644, 0, 0, 0).unwrap();
    a.release(f.ino, fh).unwrap();
    drop((a, b));
    for s in servers {
        s.stop().unwrap();
    }
    master.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two handles on one file (two processes writing a shared file through FUSE):
/// the kernel parks one writer while the other writes, so the parked handle's
/// pipelined writes are reaped by nobody. They must not take every credit of the
/// connection, or the next call (here a getattr, under FUSE the getxattr of a
/// write) waits for a credit that never comes.
#[test]
fn pipelined_writes_of_a_parked_handle_leave_credits_for_others() {
    let dir = test_dir("pipeline-credits");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let cfg = server_config(&dir, &key_file, master.addr(), 0, 1, 0);
    let _server = pfs_server::start(&cfg, Duration::from_secs(10)).unwrap();
    let mut o = pfs_client::ClusterOptions::new(master.addr(), key.clone());
    o.connect_timeout = Duration::from_secs(10);
    o.request_timeout = Duration::from_secs(3);
    let fs = pfs_client::Cluster::connect(o).unwrap();

    let (attr, a) = fs.create(InodeId::ROOT, b"shared", 0o644, 0, 0, 0).unwrap();
    let b = fs.open(attr.ino, 0).unwrap();
    let block = vec![7u8; 65536];
    // Handle a fills its window (64 writes) and is never touched again until
    // the end; handle b writes the other half of the file.
    for k in 0..64u64 {
        fs.write(attr.ino, a, k * 65536, &block).unwrap();
    }
    for k in 64..200u64 {
        fs.write(attr.ino, b, k * 65536, &block).unwrap();
    }
    let got = fs.getattr(attr.ino).expect("a call after both handles' writes gets a credit");
    assert_eq!(got.ino, attr.ino);
    fs.release(attr.ino, b).unwrap();
    fs.release(attr.ino, a).unwrap();
    assert_eq!(fs.getattr(attr.ino).unwrap().size, 200 * 65536);
    let fh = fs.open(attr.ino, 0).unwrap();
    for k in [0u64, 63, 64, 199] {
        assert_eq!(fs.read(attr.ino, fh, k * 65536, 65536).unwrap(), block, "block {k}");
    }
    fs.release(attr.ino, fh).unwrap();
}

/// A worker keeps the tasks its full rings to a peer refuse in a backlog;
/// at the backlog's bound it takes no new requests from its connections
/// until its peers took the backlog down. With rings of two tasks, four
/// clients writing pipelined blocks across both workers fill it at once:
/// the workers pause, nothing deadlocks (each serves its rings every round),
/// and every byte lands where it belongs.
#[test]
fn a_full_backlog_pauses_new_requests_and_every_write_lands() {
    let dir = test_dir("backlog");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let mut cfg = server_config(&dir, &key_file, master.addr(), 0, 2, 0);
    cfg.ring_depth = 2;
    // Client threads of this test must not run the workers' rounds for
    // them: the rings' traffic is the workers' own.
    cfg.inline_rounds = false;
    let server = pfs_server::start(&cfg, Duration::from_secs(10)).unwrap();
    let block = |t: u64, k: u64| vec![(t * 31 + k) as u8; 65536];
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (key, addr) = (key.clone(), master.addr());
            s.spawn(move || {
                let fs = client(addr, &key);
                let name = format!("f{t}");
                let (attr, fh) = fs.create(InodeId::ROOT, name.as_bytes(), 0o644, 0, 0, 0).unwrap();
                for k in 0..96u64 {
                    fs.write(attr.ino, fh, k * 65536, &block(t, k)).unwrap();
                }
                fs.release(attr.ino, fh).unwrap();
                let fh = fs.open(attr.ino, 0).unwrap();
                for k in 0..96u64 {
                    let got = fs.read(attr.ino, fh, k * 65536, 65536).unwrap();
                    assert!(got == block(t, k), "file {t}, block {k}");
                }
                fs.release(attr.ino, fh).unwrap();
            });
        }
    });
    let (high, pauses) = server.backlog();
    println!("backlog: peaked at {high} tasks, new requests paused in {pauses} rounds");
    assert!(pauses > 0, "the backlog (peak {high}) never reached its bound");
    server.stop().unwrap();
    master.stop();
}

/// A device queue of two requests, four clients writing large files and
/// small ones across both workers: requests that find the queue full wait in
/// the shard's queue, data writes stop while too many wait, and no worker
/// ever waits for the device while it serves. Every byte reads back.
#[test]
fn a_full_device_queue_never_stops_a_worker() {
    let dir = test_dir("full-queue");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let mut cfg = server_config(&dir, &key_file, master.addr(), 0, 2, 0);
    cfg.io_queue_depth = 2;
    let server = pfs_server::start(&cfg, Duration::from_secs(10)).unwrap();
    let waits = server.device_waits();
    let big = |t: u64, k: u64| vec![(t * 37 + k) as u8; 256 << 10];
    let small = |t: u64, k: u64| vec![(t * 11 + k) as u8 ^ 0x5a; 3901];
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (key, addr) = (key.clone(), master.addr());
            s.spawn(move || {
                let fs = client(addr, &key);
                let name = format!("big{t}");
                let (attr, fh) = fs.create(InodeId::ROOT, name.as_bytes(), 0o644, 0, 0, 0).unwrap();
                for k in 0..24u64 {
                    fs.write(attr.ino, fh, k * (256 << 10), &big(t, k)).unwrap();
                }
                fs.fsync(attr.ino, fh, false).unwrap();
                fs.release(attr.ino, fh).unwrap();
                let mut files = Vec::new();
                for k in 0..200u64 {
                    files.push(write_file(&fs, InodeId::ROOT, &format!("s{t}.{k}"), &small(t, k)));
                }
                let fh = fs.open(attr.ino, 0).unwrap();
                for k in 0..24u64 {
                    let got = fs.read(attr.ino, fh, k * (256 << 10), 256 << 10).unwrap();
                    assert!(got == big(t, k), "file {t}, piece {k}");
                }
                fs.release(attr.ino, fh).unwrap();
                for (k, ino) in files.into_iter().enumerate() {
                    assert_eq!(read_file(&fs, ino), small(t, k as u64), "small file {t}.{k}");
                }
            });
        }
    });
    server.stop().unwrap();
    master.stop();
    println!("waits while serving {}, requests held for room {}", waits.total(), waits.held_back());
    assert!(waits.held_back() > 0, "the queue of two was never full");
    assert_eq!(waits.total(), 0, "a worker waited for the device while serving");
}

/// Slot RPC (the RDMA protocol: replies written one-sided into the client's
/// inbox) carries the whole client over tcp and over shm: data of every size,
/// metadata, and token invalidations (which still come by SEND) in between.
#[test]
fn slot_rpc_carries_data_metadata_and_invalidations_over_tcp_and_shm() {
    use std::sync::{Arc, Mutex};

    let dir = test_dir("slot-rpc");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let cfg = server_config(&dir, &key_file, master.addr(), 0, 2, 0);
    let server = pfs_server::start(&cfg, Duration::from_secs(10)).unwrap();
    let slotted = |transport| {
        let mut o = pfs_client::ClusterOptions::new(master.addr(), key.clone());
        o.transport = transport;
        o.slot_rpc = Some(pfs_net::SlotRpc { slots: 8, inline_bytes: 8192 });
        o.dentry_ttl = Duration::from_secs(600);
        o.request_timeout = Duration::from_secs(10);
        pfs_client::Cluster::connect(o).unwrap()
    };
    let a = slotted(pfs_net::TransportKind::Tcp);
    let b = slotted(pfs_net::TransportKind::Shm);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    a.set_invalidator(Box::new(move |inv| s.lock().unwrap().push(inv)));

    let d = a.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
    let mut inos = Vec::new();
    for i in 0..12u64 {
        let writer: &dyn FileSystem = if i % 2 == 0 { &a } else { &b };
        inos.push(write_file(writer, d.ino, &format!("f{i}"), &content(i)));
    }
    for (i, &ino) in inos.iter().enumerate() {
        assert_eq!(read_file(&a, ino), content(i as u64), "f{i} read over tcp");
        assert_eq!(read_file(&b, ino), content(i as u64), "f{i} read over shm");
    }
    // A caches the name; B's rename reaches A as an invalidation.
    assert_eq!(a.lookup(d.ino, b"f0").unwrap().ino, inos[0]);
    assert_eq!(a.lookup(InodeId::ROOT, b"d").unwrap().ino, d.ino);
    b.rename(InodeId::ROOT, b"d", InodeId::ROOT, b"e", RenameFlags::empty()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.lookup(InodeId::ROOT, b"d").is_ok() {
        assert!(std::time::Instant::now() < deadline, "A still sees the old name");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!seen.lock().unwrap().is_empty(), "A was told of the rename");
    assert_eq!(a.lookup(InodeId::ROOT, b"e").unwrap().ino, d.ino);

    for (c, backend) in [(&a, pfs_net::Backend::Tcp), (&b, pfs_net::Backend::Shm)] {
        let links = c.links();
        let l = links[0].expect("connected");
        assert_eq!((l.backend, l.slots), (backend, Some(8)));
        // Every reply came through the inbox; large writes went one-sided.
        assert!(l.one_sided.1 > 50, "{backend:?}: {:?}", l.one_sided);
        assert!(l.one_sided.0 > 0, "{backend:?}: {:?}", l.one_sided);
    }
    drop((a, b));
    server.stop().unwrap();
    master.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ring size a client asks for (`shm_ring_kib`) is the one its
/// shared-memory connections get, and data of every size crosses rings
/// smaller and larger than a frame alike.
#[test]
fn shared_memory_rings_take_the_size_the_client_asks_for() {
    let dir = test_dir("shm-ring");
    let cluster = Local::start(&dir, 1, 2);
    let ring_maps = |ring: u64| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .filter(|l| l.contains("pfs-net-shm"))
            .filter(|l| {
                let range = l.split_whitespace().next().unwrap();
                let (a, b) = range.split_once('-').unwrap();
                let len = u64::from_str_radix(b, 16).unwrap() - u64::from_str_radix(a, 16).unwrap();
                len == 4096 + 2 * ring
            })
            .count()
    };
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    for (k, ring) in [(0, 4u64 << 10), (1, 8u64 << 20)] {
        assert_eq!(ring_maps(ring), 0, "no ring of {ring} bytes yet");
        let mut o = pfs_client::ClusterOptions::new(cluster.master.addr(), cluster.key.clone());
        o.transport = pfs_net::TransportKind::Shm;
        o.shm_ring_bytes = ring as u32;
        o.request_timeout = Duration::from_secs(10);
        let fs = pfs_client::Cluster::connect(o).unwrap();
        // Mapped by the client and by the server (this process): one link.
        assert_eq!(ring_maps(ring), 2, "the client's link has rings of {ring} bytes");
        let name = format!("f{k}");
        let (attr, fh) = fs.create(InodeId::ROOT, name.as_bytes(), 0o644, 0, 0, 0).unwrap();
        for (i, chunk) in data.chunks(1 << 20).enumerate() {
            fs.write(attr.ino, fh, (i << 20) as u64, chunk).unwrap();
        }
        fs.release(attr.ino, fh).unwrap();
        assert!(read_file(&fs, attr.ino) == data, "3 MB over rings of {ring} bytes");
        drop(fs);
    }
    cluster.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The checkpoint pattern (write a temporary file, rename it over the old one)
/// in a bigdir, where the old file's inode and data live on other shards than
/// its name: every replaced file must be freed, or the cluster fills up.
#[test]
fn renames_over_files_free_what_they_replace_on_every_shard() {
    let dir = test_dir("rename-frees");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let before = fs.statfs().unwrap();
    let data = vec![7u8; 300_000];
    for round in 0..6 {
        for i in 0..20 {
            write_file(&fs, InodeId::ROOT, &format!("ckpt{i}.tmp"), &data);
            fs.rename(
                InodeId::ROOT,
                format!("ckpt{i}.tmp").as_bytes(),
                InodeId::ROOT,
                format!("ckpt{i}").as_bytes(),
                RenameFlags::empty(),
            )
            .unwrap_or_else(|e| panic!("round {round}, file {i}: {e}"));
        }
    }
    let after = fs.statfs().unwrap();
    // 20 files remain; each rename freed the one it replaced (inode and pages).
    assert_eq!(before.files_free - after.files_free, 20, "inodes leaked: {before:?} -> {after:?}");
    let pages_per_file = (data.len() as u64).div_ceil(after.block_size as u64);
    let used = before.blocks_free - after.blocks_free;
    assert!(
        used <= 20 * (pages_per_file + 16),
        "{used} blocks in use for 20 files of {pages_per_file}: replaced files leaked their data"
    );
    for i in 0..20 {
        let a = fs.lookup(InodeId::ROOT, format!("ckpt{i}").as_bytes()).unwrap();
        assert_eq!(read_file(&fs, a.ino), data);
    }
    drop(fs);
    cluster.stop();
}

/// A hard link made on another shard than its file's home while another
/// client removes the file's last name: the link either counts (the file
/// lives on under the new name) or fails with `ENOENT` and leaves no name.
/// Before, the home found no inode to count when the removal came first, and
/// the new name was left naming a removed file.
#[test]
fn a_link_racing_the_removal_of_its_file_never_leaves_a_dangling_name() {
    use std::sync::{Arc, Barrier};
    let dir = test_dir("link-race");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let rounds = 300;
    let inos: Vec<InodeId> =
        (0..rounds).map(|i| write_file(&fs, InodeId::ROOT, &format!("f{i}"), b"x")).collect();
    let start = Arc::new(Barrier::new(2));
    let remover = {
        let (fs, start, inos) = (cluster.client(), start.clone(), inos.clone());
        std::thread::spawn(move || {
            for (i, &ino) in inos.iter().enumerate() {
                start.wait();
                // As the link's client asks the file's type first: the
                // removal then meets the link near its shard's commit.
                fs.getattr(ino).unwrap();
                fs.unlink(InodeId::ROOT, format!("f{i}").as_bytes()).unwrap();
            }
        })
    };
    let linker = {
        let (fs, inos) = (cluster.client(), inos.clone());
        std::thread::spawn(move || {
            (0..rounds)
                .map(|i| {
                    start.wait();
                    fs.link(inos[i], InodeId::ROOT, format!("l{i}").as_bytes()).map(|_| ())
                })
                .collect::<Vec<_>>()
        })
    };
    remover.join().unwrap();
    let linked = linker.join().unwrap();
    let check = cluster.client();
    // Every name left names a file that exists.
    let mut listed = std::collections::HashSet::new();
    let mut after = None;
    loop {
        let page = check.readdir(InodeId::ROOT, after.as_deref(), 64).unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.name.clone());
        for e in page {
            let name = String::from_utf8_lossy(&e.name).into_owned();
            assert!(check.getattr(e.ino).is_ok(), "{name} names a removed file");
            listed.insert(name);
        }
    }
    let (mut made, mut refused) = (0, 0);
    for (i, result) in linked.iter().enumerate() {
        let name = format!("l{i}");
        match result {
            Ok(()) => {
                made += 1;
                assert!(listed.contains(&name), "{name} was linked and is not there");
                let e = check.lookup(InodeId::ROOT, name.as_bytes()).unwrap();
                assert_eq!(
                    check.getattr(e.ino).unwrap().nlink,
                    1,
                    "{name}: its other name is gone"
                );
            }
            Err(FsError::NotFound) => {
                refused += 1;
                assert!(!listed.contains(&name), "{name}: the link failed and its name stayed");
            }
            Err(e) => panic!("link {name}: {e}"),
        }
    }
    eprintln!("{rounds} links racing removals: {made} made, {refused} failed with ENOENT");
    drop((fs, check));
    cluster.stop();
}

#[test]
fn rmdir_of_a_directory_whose_name_moved_to_another_shard_checks_its_home() {
    let dir = test_dir("rmdir-moved");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let before = fs.statfs().unwrap();
    let d = fs.mkdir(InodeId::ROOT, b"d0", 0o755, 0, 0).unwrap();
    let inner = write_file(&fs, d.ino, "inner", b"still here");
    // The root is a bigdir: renamed, the name lands on other shards than the
    // directory's inode (and its entries) most of the time.
    for i in 0..8 {
        let (from, to) = (format!("d{i}"), format!("d{}", i + 1));
        fs.rename(
            InodeId::ROOT,
            from.as_bytes(),
            InodeId::ROOT,
            to.as_bytes(),
            RenameFlags::empty(),
        )
        .unwrap();
        assert_eq!(fs.rmdir(InodeId::ROOT, to.as_bytes()).unwrap_err(), FsError::NotEmpty);
        assert_eq!(fs.lookup(InodeId::ROOT, to.as_bytes()).unwrap().ino, d.ino, "{to}");
        assert_eq!(read_file(&fs, inner), b"still here");
    }
    fs.unlink(d.ino, b"inner").unwrap();
    fs.rmdir(InodeId::ROOT, b"d8").unwrap();
    assert_eq!(fs.lookup(InodeId::ROOT, b"d8").unwrap_err(), FsError::NotFound);
    // The directory's inode went at its home, and the root's count with it.
    assert_eq!(fs.statfs().unwrap().files_free, before.files_free);
    assert_eq!(fs.getattr(InodeId::ROOT).unwrap().nlink, 2);
    drop(fs);
    cluster.stop();
}

/// Two clients at once each move one of two directories under the other:
/// one move is made and the other refused (`EINVAL`), never both, which
/// would leave the two in a cycle the root cannot reach. Before the rename
/// lock both walks up the parents could pass before either move.
#[test]
fn two_clients_moving_two_directories_each_under_the_other_never_make_a_cycle() {
    use std::sync::{Arc, Barrier};
    let dir = test_dir("rename-cycle-race");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let rounds = 60;
    for i in 0..rounds {
        for d in ["a", "b"] {
            fs.mkdir(InodeId::ROOT, format!("{d}{i}").as_bytes(), 0o755, 0, 0).unwrap();
        }
    }
    let start = Arc::new(Barrier::new(2));
    // Client `from` moves `{from}{i}` into `{into}{i}` in each round.
    let mover = |from: &'static str, into: &'static str| {
        let (fs, start) = (cluster.client(), start.clone());
        std::thread::spawn(move || {
            (0..rounds)
                .map(|i| {
                    start.wait();
                    let parent = fs.lookup(InodeId::ROOT, format!("{into}{i}").as_bytes())?;
                    fs.rename(
                        InodeId::ROOT,
                        format!("{from}{i}").as_bytes(),
                        parent.ino,
                        from.as_bytes(),
                        RenameFlags::empty(),
                    )
                })
                .collect::<Vec<_>>()
        })
    };
    let (ab, ba) = (mover("a", "b"), mover("b", "a"));
    let (ab, ba) = (ab.join().unwrap(), ba.join().unwrap());
    let check = cluster.client();
    let mut first = [0, 0];
    for i in 0..rounds {
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        match (&ab[i], &ba[i]) {
            (Ok(()), Err(FsError::Invalid(_)) | Err(FsError::NotFound)) => first[0] += 1,
            (Err(FsError::Invalid(_)) | Err(FsError::NotFound), Ok(())) => first[1] += 1,
            other => panic!("round {i}: moves {a} into {b} and {b} into {a} gave {other:?}"),
        }
        // Whichever was moved, the other is still in the root and holds it.
        let top = match &ab[i] {
            Ok(()) => &b,
            Err(_) => &a,
        };
        let t = check.lookup(InodeId::ROOT, top.as_bytes()).unwrap();
        let inner = if top == &b { "a" } else { "b" };
        check.lookup(t.ino, inner.as_bytes()).unwrap_or_else(|e| panic!("{top}/{inner}: {e}"));
    }
    eprintln!("{rounds} rounds: a into b first {}, b into a first {}", first[0], first[1]);
    drop((fs, check));
    cluster.stop();
}

/// A create through a handle of a bigdir taken before the directory was
/// removed (by its rmdir, or by a rename over it) fails with `ESTALE` on
/// every shard, not only at the directory's home: the other shards were
/// told it is gone. Before, a name on another shard than the home landed in
/// a directory no path reaches. (`ESTALE`, not `ENOENT`: the kernel, or
/// libpfs_preload, then walks the path again and finds a directory made
/// since under the same name.) A rename into it too, on the target's shard,
/// whether that is the source's (a same-shard rename) or not (the
/// participant of a cross-shard one, whose refusal reaches the client).
#[test]
fn a_create_in_a_removed_bigdir_fails_on_every_shard() {
    let dir = test_dir("gone-dirs");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    // A client per name, each with the directory's layout cached from before
    // its removal, so each create goes to the name's shard (a client that
    // met `Stale` forgets the layout, and its next create would stop at the
    // home's answer that the directory is gone). Two names on each shard.
    let ready = |d: InodeId| -> Vec<(pfs_client::Cluster, String)> {
        let mut per_shard = [0; 4];
        (0..)
            .map(|j| format!("x{j}"))
            .filter(|n| {
                let at = dentry_shard(d, DirLayout::BigDir, n.as_bytes(), 2, 2).0 as usize;
                per_shard[at] += 1;
                per_shard[at] <= 2
            })
            .take(8)
            .map(|n| {
                let c = cluster.client();
                assert_eq!(c.lookup(d, b"none").unwrap_err(), FsError::NotFound);
                (c, n)
            })
            .collect()
    };
    // Files to rename in from elsewhere (from every shard: a rename into
    // the removed directory is a cross-shard one for most of them).
    let src = fs.mkdir(InodeId::ROOT, b"src", 0o755, 0, 0).unwrap();
    type Ready = Vec<(pfs_client::Cluster, String)>;
    let stale = |(creators, movers): (Ready, Ready), d: InodeId, how: &str| {
        for (c, n) in &creators {
            assert_eq!(
                c.create(d, n.as_bytes(), 0o644, 0, 0, 0).map(|_| ()),
                Err(FsError::Stale),
                "{n} in a directory removed by {how}"
            );
        }
        for (c, n) in &movers {
            let from = format!("{how}-{n}");
            write_file(&fs, src.ino, &from, b"moved");
            assert_eq!(
                c.rename(src.ino, from.as_bytes(), d, n.as_bytes(), RenameFlags::empty()),
                Err(FsError::Stale),
                "{from} renamed into a directory removed by {how}"
            );
            assert!(fs.lookup(src.ino, from.as_bytes()).is_ok(), "{from} stays where it was");
        }
    };
    let removed = fs.mkdir(InodeId::ROOT, b"removed", 0o755, 0, 0).unwrap();
    let clients = (ready(removed.ino), ready(removed.ino));
    fs.rmdir(InodeId::ROOT, b"removed").unwrap();
    stale(clients, removed.ino, "rmdir");
    let replaced = fs.mkdir(InodeId::ROOT, b"replaced", 0o755, 0, 0).unwrap();
    let by = fs.mkdir(InodeId::ROOT, b"by", 0o755, 0, 0).unwrap();
    let clients = (ready(replaced.ino), ready(replaced.ino));
    fs.rename(InodeId::ROOT, b"by", InodeId::ROOT, b"replaced", RenameFlags::empty()).unwrap();
    stale(clients, replaced.ino, "a rename over it");
    // The directory that took its name takes new names.
    assert_eq!(fs.lookup(InodeId::ROOT, b"replaced").unwrap().ino, by.ino);
    write_file(&fs, by.ino, "x0", b"here");
    drop(fs);
    cluster.stop();
}

/// A rename over an empty directory while another client creates a file in
/// it through a handle taken before: either the create comes first and the
/// rename is refused (`ENOTEMPTY`), or the rename comes first and the create
/// fails (`ESTALE`); never both succeed, which left the new file in a
/// directory no path reaches (the client checked emptiness by listing, and a
/// create could land between the listing and the rename).
#[test]
fn a_rename_over_a_directory_racing_a_create_in_it_never_strands_the_file() {
    use std::sync::{Arc, Barrier};
    let dir = test_dir("rename-over-dir-race");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let rounds = 60;
    let targets: Vec<InodeId> = (0..rounds)
        .map(|i| {
            fs.mkdir(InodeId::ROOT, format!("s{i}").as_bytes(), 0o755, 0, 0).unwrap();
            fs.mkdir(InodeId::ROOT, format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap().ino
        })
        .collect();
    let start = Arc::new(Barrier::new(2));
    let renamer = {
        let (fs, start) = (cluster.client(), start.clone());
        std::thread::spawn(move || {
            (0..rounds)
                .map(|i| {
                    start.wait();
                    let (s, d) = (format!("s{i}"), format!("d{i}"));
                    fs.rename(
                        InodeId::ROOT,
                        s.as_bytes(),
                        InodeId::ROOT,
                        d.as_bytes(),
                        RenameFlags::empty(),
                    )
                })
                .collect::<Vec<_>>()
        })
    };
    let creator = {
        let fs = cluster.client();
        std::thread::spawn(move || {
            targets
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    start.wait();
                    // Later in some rounds than others, to meet the rename
                    // at each of its steps.
                    std::thread::sleep(Duration::from_micros(150 * (i % 10) as u64));
                    let (attr, fh) = fs.create(d, b"new", 0o644, 0, 0, 0)?;
                    fs.release(attr.ino, fh)
                })
                .collect::<Vec<_>>()
        })
    };
    let (renamed, created) = (renamer.join().unwrap(), creator.join().unwrap());
    let (mut first_create, mut first_rename) = (0, 0);
    for i in 0..rounds {
        let d = fs.lookup(InodeId::ROOT, format!("d{i}").as_bytes()).unwrap();
        match (&renamed[i], &created[i]) {
            (Err(FsError::NotEmpty), Ok(())) => {
                first_create += 1;
                fs.lookup(d.ino, b"new").unwrap_or_else(|e| panic!("d{i}/new: {e}"));
            }
            (Ok(()), Err(FsError::Stale)) => {
                first_rename += 1;
                assert_eq!(fs.lookup(d.ino, b"new").unwrap_err(), FsError::NotFound);
            }
            other => panic!("round {i}: rename s{i} over d{i} and a create in d{i}: {other:?}"),
        }
    }
    eprintln!("{rounds} rounds: the create first {first_create}, the rename first {first_rename}");
    drop(fs);
    cluster.stop();
}

/// Two clients at once each rename a name onto the other's: each
/// coordinator locks its source name, and each participant finds its target
/// locked, so both are refused with `TryAgain` and retry. Both must get
/// through (or find the name moved away), never both time out with `EAGAIN`.
#[test]
fn two_renames_each_onto_the_others_source_both_get_through() {
    use std::sync::{Arc, Barrier};
    let dir = test_dir("rename-swap-race");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let rounds = 40;
    for i in 0..rounds {
        write_file(&fs, InodeId::ROOT, &format!("x{i}"), b"x");
        write_file(&fs, InodeId::ROOT, &format!("y{i}"), b"y");
    }
    let start = Arc::new(Barrier::new(2));
    let renamer = |from: &'static str, to: &'static str| {
        let (fs, start) = (cluster.client(), start.clone());
        std::thread::spawn(move || {
            (0..rounds)
                .map(|i| {
                    start.wait();
                    let (a, b) = (format!("{from}{i}"), format!("{to}{i}"));
                    let begun = std::time::Instant::now();
                    let r = fs.rename(
                        InodeId::ROOT,
                        a.as_bytes(),
                        InodeId::ROOT,
                        b.as_bytes(),
                        RenameFlags::empty(),
                    );
                    (r, begun.elapsed())
                })
                .collect::<Vec<_>>()
        })
    };
    let (xy, yx) = (renamer("x", "y"), renamer("y", "x"));
    let (xy, yx) = (xy.join().unwrap(), yx.join().unwrap());
    let slowest = xy.iter().chain(&yx).map(|(_, t)| *t).max().unwrap();
    for i in 0..rounds {
        for (r, t) in [&xy[i], &yx[i]] {
            assert!(
                matches!(r, Ok(()) | Err(FsError::NotFound)),
                "round {i}: {r:?} after {t:?} (x{i} onto y{i} and y{i} onto x{i} at once)"
            );
        }
    }
    eprintln!("{rounds} rounds of crossed renames; the slowest took {slowest:?}");
    drop(fs);
    cluster.stop();
}

/// Another client's layout change of a directory reaches this client within
/// a second: its cached layout runs out, and the names it creates after that
/// go where the new layout looks for them. (It routed them by the old layout
/// for as long as its cache kept it, and names on shards the new layout does
/// not look at could be found by no one.)
#[test]
fn a_directory_layout_changed_by_another_client_is_followed_within_a_second() {
    let dir = test_dir("layout-change");
    let cluster = Local::start(&dir, 2, 2);
    let (a, b) = (cluster.client(), cluster.client());
    let d = a.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
    assert_eq!(a.getxattr(d.ino, b"user.pfs.dir_layout").unwrap(), b"bigdir");
    b.setxattr(d.ino, b"user.pfs.dir_layout", b"regular", XattrSetMode::Any).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    for k in 0..16 {
        write_file(&a, d.ino, &format!("x{k}"), b"x");
    }
    for k in 0..16 {
        let name = format!("x{k}");
        b.lookup(d.ino, name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert_eq!(b.readdir(d.ino, None, 64).unwrap().len(), 16);
    drop((a, b));
    cluster.stop();
}

/// A client that cached a directory's layout just before another client
/// changed it makes, renames and links names in it by the old layout for up
/// to a second. Each lands where the new layout looks for it: the shards
/// refuse names the new layout does not place on them (`Misrouted`) and the
/// client routes again. Both ways (bigdir to regular and back), each kind of
/// new name with the old layout cached.
#[test]
fn names_made_by_a_client_that_cached_the_old_layout_land_where_the_new_one_looks() {
    let dir = test_dir("layout-race");
    let cluster = Local::start(&dir, 2, 2);
    let (a, b, c) = (cluster.client(), cluster.client(), cluster.client());
    let src = b.mkdir(InodeId::ROOT, b"src", 0o755, 0, 0).unwrap();
    let mut round = 0;
    for to in ["regular", "bigdir"] {
        let list = |fs: &pfs_client::Cluster, dir: InodeId| {
            let mut listed: Vec<String> = Vec::new();
            let mut after: Option<Vec<u8>> = None;
            loop {
                let batch = fs.readdir(dir, after.as_deref(), 16).unwrap();
                let Some(last) = batch.last() else { break };
                after = Some(last.name.clone());
                listed.extend(batch.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()));
            }
            listed.sort();
            listed
        };
        let kinds = ["create", "rename", "link", "mkdir", "lookup", "unlink", "rmdir", "readdir"];
        for kind in kinds {
            round += 1;
            let name = format!("d{round}");
            let d = a.mkdir(InodeId::ROOT, name.as_bytes(), 0o755, 0, 0).unwrap();
            if to == "bigdir" {
                a.setxattr(d.ino, b"user.pfs.dir_layout", b"regular", XattrSetMode::Any).unwrap();
            }
            // B caches the layout (its lookup of the name brings it).
            b.lookup(InodeId::ROOT, name.as_bytes()).unwrap();
            let from = b.getxattr(d.ino, b"user.pfs.dir_layout").unwrap();
            assert_ne!(from, to.as_bytes());
            a.setxattr(d.ino, b"user.pfs.dir_layout", to.as_bytes(), XattrSetMode::Any).unwrap();
            // Within the second B still has the old layout cached.
            let mut names = Vec::new();
            for k in 0..8 {
                let mut n = format!("{kind}{k}");
                if kind == "mkdir" {
                    // Half of them on a shard both layouts place them on
                    // (nothing refuses those), half elsewhere.
                    let same = |n: &str| {
                        let at = |l| dentry_shard(d.ino, l, n.as_bytes(), 2, 2);
                        at(DirLayout::Regular) == at(DirLayout::BigDir)
                    };
                    n = (0..)
                        .map(|j| format!("{kind}{k}-{j}"))
                        .find(|n| same(n) == (k % 2 == 0))
                        .unwrap();
                }
                match kind {
                    "create" => {
                        write_file(&b, d.ino, &n, n.as_bytes());
                    }
                    "rename" => {
                        let old = format!("{to}-{n}");
                        write_file(&b, src.ino, &old, n.as_bytes());
                        b.rename(
                            src.ino,
                            old.as_bytes(),
                            d.ino,
                            n.as_bytes(),
                            RenameFlags::empty(),
                        )
                        .unwrap_or_else(|e| panic!("{to}: rename {n}: {e}"));
                    }
                    "link" => {
                        let f = write_file(&b, src.ino, &format!("{to}-{n}"), n.as_bytes());
                        b.link(f, d.ino, n.as_bytes())
                            .unwrap_or_else(|e| panic!("{to}: link {n}: {e}"));
                    }
                    "mkdir" => {
                        let sub = b
                            .mkdir(d.ino, n.as_bytes(), 0o755, 0, 0)
                            .unwrap_or_else(|e| panic!("{to}: mkdir {n}: {e}"));
                        // It inherits the new layout, not the one B cached.
                        let got = c.getxattr(sub.ino, b"user.pfs.dir_layout").unwrap();
                        assert_eq!(got, to.as_bytes(), "{to}: {n}'s layout");
                    }
                    // Names A made by the new layout, which B looks for by
                    // the old one: found, and removed, all the same.
                    "lookup" => {
                        let f = write_file(&a, d.ino, &n, n.as_bytes());
                        let found = b
                            .lookup(d.ino, n.as_bytes())
                            .unwrap_or_else(|e| panic!("{to}: lookup {n}: {e}"));
                        assert_eq!(found.ino, f);
                    }
                    "unlink" | "rmdir" => {
                        if kind == "unlink" {
                            write_file(&a, d.ino, &n, n.as_bytes());
                        } else {
                            a.mkdir(d.ino, n.as_bytes(), 0o755, 0, 0).unwrap();
                        }
                        if k % 2 == 1 {
                            names.push(n);
                            continue;
                        }
                        let gone = if kind == "unlink" {
                            b.unlink(d.ino, n.as_bytes())
                        } else {
                            b.rmdir(d.ino, n.as_bytes())
                        };
                        gone.unwrap_or_else(|e| panic!("{to}: {kind} {n}: {e}"));
                        assert_eq!(c.lookup(d.ino, n.as_bytes()).unwrap_err(), FsError::NotFound);
                        continue;
                    }
                    // Names A made by the new layout, which B lists by the
                    // old one: all there.
                    "readdir" => {
                        write_file(&a, d.ino, &n, n.as_bytes());
                        names.push(n);
                        if k == 7 {
                            names.sort();
                            assert_eq!(list(&b, d.ino), names, "{to}: B's listing");
                        }
                        continue;
                    }
                    _ => unreachable!(),
                }
                names.push(n);
            }
            // A client that never saw the old layout finds every name, by
            // lookup and in the listing.
            for n in &names {
                c.lookup(d.ino, n.as_bytes()).unwrap_or_else(|e| panic!("{to}: {n}: {e}"));
            }
            names.sort();
            assert_eq!(list(&c, d.ino), names, "{to}: the listing holds every name");
        }
    }
    drop((a, b, c));
    cluster.stop();
}

#[test]
fn a_directory_is_never_moved_into_its_own_subtree_across_shards() {
    let dir = test_dir("rename-cycle");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    // A chain of bigdirs: each name, and so each inode, on any shard.
    let mut chain = vec![InodeId::ROOT];
    for i in 0..6 {
        let d = fs.mkdir(*chain.last().unwrap(), format!("d{i}").as_bytes(), 0o755, 0, 0).unwrap();
        chain.push(d.ino);
    }
    // Move a middle one away and back, so its inode's name has lived elsewhere.
    fs.rename(chain[2], b"d2", InodeId::ROOT, b"away", RenameFlags::empty()).unwrap();
    fs.rename(InodeId::ROOT, b"away", chain[2], b"d2", RenameFlags::empty()).unwrap();
    let deepest = *chain.last().unwrap();
    for (i, parent) in chain[..6].iter().enumerate() {
        let name = format!("d{i}");
        let e = fs
            .rename(*parent, name.as_bytes(), deepest, b"loop", RenameFlags::empty())
            .unwrap_err();
        assert!(matches!(e, FsError::Invalid(_)), "d{i} under its own subtree: {e:?}");
        assert_eq!(fs.lookup(*parent, name.as_bytes()).unwrap().ino, chain[i + 1]);
    }
    // Moving the deepest one up is fine.
    fs.rename(chain[5], b"d5", InodeId::ROOT, b"up", RenameFlags::empty()).unwrap();
    assert_eq!(fs.lookup(InodeId::ROOT, b"up").unwrap().ino, deepest);
    drop(fs);
    cluster.stop();
}

/// A file `prefix{b}` for the first `b` in `blocks` whose write through a
/// second handle (`far(b)`: offset and bytes, in block `b`) lands away from
/// the file's home: after the first handle wrote `head` at 0, `other` (another
/// client, which this one's unpublished writes do not reach) still sees the
/// size `head.len()`. Returns the file, the first handle, the second and `b`.
fn unpublished_far_write(
    fs: &pfs_client::Cluster,
    other: &pfs_client::Cluster,
    prefix: &str,
    blocks: std::ops::Range<u64>,
    head: &[u8],
    far: impl Fn(u64) -> (u64, Vec<u8>),
) -> (InodeId, pfs_core::FileHandle, pfs_core::FileHandle, u64) {
    for b in blocks {
        let name = format!("{prefix}{b}");
        let (a, near) = fs.create(InodeId::ROOT, name.as_bytes(), 0o644, 0, 0, 0).unwrap();
        if !head.is_empty() {
            fs.write(a.ino, near, 0, head).unwrap();
        }
        let second = fs.open(a.ino, 0).unwrap();
        let (at, bytes) = far(b);
        fs.write(a.ino, second, at, &bytes).unwrap();
        // Pipelined: give a write at the home time to land (if it has not, the
        // block is taken for remote and the test only gets weaker).
        std::thread::sleep(Duration::from_millis(50));
        if other.getattr(a.ino).unwrap().size == head.len() as u64 {
            return (a.ino, near, second, b);
        }
        fs.release(a.ino, near).unwrap();
        fs.release(a.ino, second).unwrap();
    }
    panic!("no block away from the home for {prefix}");
}

/// Two handles of one file (two writers of an N-1 file, or a close after a
/// reopen): one writes far out on another shard than the file's home and has
/// not published its size when the other closes with a smaller end. Publishing
/// that smaller size must not free the first writer's data there.
#[test]
fn a_smaller_published_size_keeps_another_writers_data_elsewhere() {
    let dir = test_dir("two-writers");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let other = cluster.client();
    let block = 64 << 10;
    let far_data: Vec<u8> = (0..block).map(|i| (i % 251) as u8).collect();
    // A far block away from the home: the home's size (seen by another
    // client, which this one's writes do not reach) stays 0 after writing it.
    let (ino, near, far, b) = unpublished_far_write(&fs, &other, "shared", 32..96, &[], |b| {
        (b * block as u64, far_data.clone())
    });
    // The near handle publishes a smaller end first, then the far one.
    fs.write(ino, near, 0, &[9; 100_000]).unwrap();
    fs.release(ino, near).unwrap();
    fs.release(ino, far).unwrap();
    let all = read_file(&fs, ino);
    assert_eq!(all.len() as u64, (b + 1) * block as u64);
    assert_eq!(&all[..100_000], &[9; 100_000][..]);
    assert!(
        all[(b * block as u64) as usize..] == far_data[..],
        "the far writer's data was freed by the near writer's close"
    );
    drop(other);
    drop(fs);
    cluster.stop();
}

#[test]
fn open_sends_nothing_and_a_file_removed_meanwhile_fails_at_its_first_read() {
    let dir = test_dir("open-removed");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let other = cluster.client();
    let ino = write_file(&fs, InodeId::ROOT, "gone", b"soon removed");
    // This client has looked the file up (its layout is known); another removes it.
    assert_eq!(fs.lookup(InodeId::ROOT, b"gone").unwrap().ino, ino);
    other.unlink(InodeId::ROOT, b"gone").unwrap();
    // The open checks nothing at the servers, so it succeeds; the first read and
    // getattr find no inode (ESTALE through a mount; docs/posix.md).
    let fh = fs.open(ino, libc::O_RDONLY as u32).unwrap();
    assert_eq!(fs.read(ino, fh, 0, 100), Err(FsError::NotFound));
    assert_eq!(fs.getattr(ino).map(|a| a.ino), Err(FsError::NotFound));
    fs.release(ino, fh).unwrap();
    // An inode this client never saw still costs one request, which checks it.
    let fresh = cluster.client();
    assert_eq!(fresh.open(ino, 0).map(|_| ()), Err(FsError::NotFound));
    drop((fs, other, fresh));
    cluster.stop();
}

/// Issue 15, small files: creating a 3901-byte file (create, write, close) is two
/// round trips to one shard, and reading it back one. In a `bigdir` a name that
/// lands away from the directory's home also updates the directory's times there
/// (one more). (That the shard's data writes of many such files share a device
/// write is `neighbouring_small_writes_reach_the_device_as_one_write` in
/// pfs-store.)
#[test]
fn a_small_file_costs_two_round_trips_to_one_shard_and_its_read_one() {
    let dir = test_dir("small-file-trips");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let delta = |before: &[u64], after: &[u64]| -> Vec<u64> {
        after.iter().zip(before).map(|(a, b)| a - b).collect()
    };
    let regular = fs.mkdir(InodeId::ROOT, b"regular", 0o755, 0, 0).unwrap().ino;
    fs.setxattr(regular, b"user.pfs.dir_layout", b"regular", Default::default()).unwrap();
    let bigdir = fs.mkdir(InodeId::ROOT, b"bigdir", 0o755, 0, 0).unwrap().ino;
    for (parent, kind) in [(regular, "regular"), (bigdir, "bigdir")] {
        // The first create in a directory also takes the directory's token.
        write_file(&fs, parent, "warm-up", b"x");
        let mut shards_used = std::collections::BTreeSet::new();
        let mut touched = 0;
        for i in 0..40u8 {
            let data = vec![i; 3901];
            let name = format!("{kind}-{i}");
            let before = fs.requests_sent();
            let (attr, fh) = fs.create(parent, name.as_bytes(), 0o644, 0, 0, 0).unwrap();
            fs.write(attr.ino, fh, 0, &data).unwrap();
            fs.flush(attr.ino, fh).unwrap();
            fs.release(attr.ino, fh).unwrap();
            let d = delta(&before, &fs.requests_sent());
            // The file's shard got the create and the write; anything else is
            // the one touch of the directory at its home.
            let shard = d.iter().position(|&n| n >= 2).unwrap_or_else(|| panic!("{name}: {d:?}"));
            let others: u64 = d.iter().sum::<u64>() - d[shard];
            assert_eq!(d[shard], 2, "{name}: create and write, nothing at close: {d:?}");
            match kind {
                "regular" => assert_eq!(others, 0, "{name}: one shard: {d:?}"),
                _ => assert!(others <= 1, "{name}: at most the directory's touch: {d:?}"),
            }
            touched += others;
            shards_used.insert(shard);

            // A reader looks the name up, opens and reads it.
            let before = fs.requests_sent();
            fs.lookup(parent, name.as_bytes()).unwrap();
            let fh = fs.open(attr.ino, libc::O_RDONLY as u32).unwrap();
            assert_eq!(fs.read(attr.ino, fh, 0, 8192).unwrap(), data, "{name}");
            fs.release(attr.ino, fh).unwrap();
            let d = delta(&before, &fs.requests_sent());
            let lookup_and_read = "the lookup, an open that sends nothing, one read";
            assert_eq!(d.iter().sum::<u64>(), 2, "{name}: {lookup_and_read}: {d:?}");
            assert_eq!(d[shard], 2, "{name}: all to the file's shard: {d:?}");
        }
        if kind == "regular" {
            assert_eq!(shards_used.len(), 1, "a regular directory's files stay with it");
        } else {
            // Names spread over the 4 shards; those away from home touch it.
            assert!(shards_used.len() > 1, "40 names on one shard of 4: {shards_used:?}");
            assert!(touched > 0 && touched < 40, "{touched} touches of the home");
        }
    }
    drop(fs);
    cluster.stop();
}

/// `read_with` (the bytes handed over in the reply's buffer when one request
/// to the home answers) and `read_into` (each shard's reply copied to its place
/// in the caller's buffer) give what `read` gives: within the first block,
/// across shards, at and past the end of the file, and the same error for a
/// removed file.
#[test]
fn read_with_hands_over_what_read_returns() {
    let dir = test_dir("read-with");
    let cluster = Local::start(&dir, 2, 2);
    let fs = cluster.client();
    let data: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let ino = write_file(&fs, InodeId::ROOT, "f", &data);
    let fh = fs.open(ino, libc::O_RDONLY as u32).unwrap();
    let with = |offset: u64, size: u32| -> Result<Vec<u8>, FsError> {
        let mut got = None;
        fs.read_with(ino, fh, offset, size, &mut |d| got = Some(d.to_vec()))?;
        Ok(got.expect("read_with calls back once on success"))
    };
    for (offset, size) in [
        (0, 10),
        (100, 60_000),
        (0, 65_536),
        (60_000, 300_000),
        (699_990, 100),
        (700_000, 5),
        (0, 1 << 20),
    ] {
        let want = fs.read(ino, fh, offset, size).unwrap();
        let end = (offset as usize + size as usize).min(data.len()).max(offset as usize);
        assert!(want == data[(offset as usize).min(data.len())..end], "read at {offset} +{size}");
        assert!(with(offset, size).unwrap() == want, "read_with at {offset} +{size}");
        // Into a buffer that holds old bytes: every byte of the range is
        // written (the file's own), and nothing past what was read.
        let mut buf = vec![0xee; size as usize + 3];
        let n = fs.read_into(ino, fh, offset, &mut buf[..size as usize]).unwrap();
        assert!(n == want.len() && buf[..n] == want[..], "read_into at {offset} +{size}");
        assert_eq!(buf[size as usize..], [0xee; 3], "read_into wrote past its buffer");
    }
    // A sparse file read by another client (its size unknown there): one
    // request per shard, holes and blocks no shard holds read as zeros, the
    // read ends at the size.
    let (sparse, sfh) = fs.create(InodeId::ROOT, b"sparse", 0o644, 0, 0, 0).unwrap();
    fs.write(sparse.ino, sfh, 0, b"head").unwrap();
    fs.write(sparse.ino, sfh, 400_000, b"middle").unwrap();
    fs.write(sparse.ino, sfh, 3 * 65_536 - 2, b"edge").unwrap();
    fs.release(sparse.ino, sfh).unwrap();
    let mut want = vec![0u8; 400_006];
    want[..4].copy_from_slice(b"head");
    want[400_000..].copy_from_slice(b"middle");
    want[3 * 65_536 - 2..3 * 65_536 + 2].copy_from_slice(b"edge");
    let other = cluster.client();
    let ofh = other.open(sparse.ino, libc::O_RDONLY as u32).unwrap();
    for offset in [0u64, 1, 65_535, 131_074] {
        let w = &want[offset as usize..];
        assert!(other.read(sparse.ino, ofh, offset, 1 << 20).unwrap() == w, "sparse at {offset}");
        let mut buf = vec![0xee; 1 << 20];
        let n = other.read_into(sparse.ino, ofh, offset, &mut buf).unwrap();
        assert!(buf[..n] == *w, "sparse read_into at {offset}");
        let mut got = Vec::new();
        other.read_with(sparse.ino, ofh, offset, 1 << 20, &mut |d| got = d.to_vec()).unwrap();
        assert!(got == w, "sparse read_with at {offset}");
    }
    other.release(sparse.ino, ofh).unwrap();
    drop(other);
    fs.unlink(InodeId::ROOT, b"f").unwrap();
    let gone = fs.create(InodeId::ROOT, b"g", 0o644, 0, 0, 0).unwrap();
    fs.release(gone.0.ino, gone.1).unwrap();
    fs.lookup(InodeId::ROOT, b"g").unwrap();
    // The open right after the lookup sends nothing; the file is removed
    // after it, and the read finds the file gone.
    let fh2 = fs.open(gone.0.ino, libc::O_RDONLY as u32).unwrap();
    fs.unlink(InodeId::ROOT, b"g").unwrap();
    // Any other open asks the file's home.
    assert_eq!(fs.open(gone.0.ino, libc::O_RDONLY as u32), Err(FsError::NotFound));
    let r = fs.read_with(gone.0.ino, fh2, 0, 10, &mut |_| panic!("no bytes of a removed file"));
    assert!(r.is_err(), "a read of a removed file fails");
    assert_eq!(r, fs.read(gone.0.ino, fh2, 0, 10).map(|_| ()));
    let mut buf = [0u8; 10];
    assert_eq!(fs.read_into(gone.0.ino, fh2, 0, &mut buf).map(|_| ()), r);
    fs.release(ino, fh).unwrap();
    drop(fs);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two handles of one file in one client (two processes on one mount, as
/// fsx's shared file): one wrote past the end on another shard than the home
/// and has not published it; a read through the other handle of the home's
/// first block is clamped there to the home's smaller size. It must read the
/// block whole (a hole, zeros), not end early: the kernel takes a short read
/// for the end of the file and shrinks its size, so the writer's next read
/// of its own bytes found nothing (CI, fsx seed 707956). By `read_with` (the
/// mount), `read_into` (the library) and `read`.
#[test]
fn a_read_at_the_home_counts_another_handles_unpublished_writes() {
    let dir = test_dir("unpublished-read");
    let cluster = Local::start(&dir, 1, 2);
    let fs = cluster.client();
    let other = cluster.client();
    let block = 64u64 << 10;
    for way in ["read_with", "read_into", "read"] {
        // A block away from the home: the home's size (seen by another
        // client) stays 100 after the writer wrote it.
        let (ino, reader, writer, b) =
            unpublished_far_write(&fs, &other, way, 1..64, &[1; 100], |b| {
                (b * block + 10, b"far".to_vec())
            });
        let got = match way {
            "read_with" => {
                let mut got = Vec::new();
                fs.read_with(ino, reader, 0, block as u32, &mut |d| got = d.to_vec()).unwrap();
                got
            }
            "read_into" => {
                let mut buf = vec![0xee; block as usize];
                let n = fs.read_into(ino, reader, 0, &mut buf).unwrap();
                buf.truncate(n);
                buf
            }
            _ => fs.read(ino, reader, 0, block as u32).unwrap(),
        };
        assert_eq!(got.len() as u64, block, "{way}: the first block read whole");
        assert!(got[..100] == [1; 100] && got[100..].iter().all(|&b| b == 0), "{way}");
        fs.release(ino, writer).unwrap();
        fs.release(ino, reader).unwrap();
        assert_eq!(other.getattr(ino).unwrap().size, b * block + 13, "{way}");
    }
    drop(other);
    drop(fs);
    cluster.stop();
}

/// A client in the server's own process runs a parked worker's rounds on its
/// own thread (`inline_rounds`, as `pfs up` does, `pfs_net::inline`): threads
/// that create, write, read, sync, rename and remove files at once get the
/// answers the worker's thread gives; paced requests (the worker parked
/// between them) are answered that way; what they made survives a restart;
/// and a server without the setting answers none that way.
#[test]
fn client_threads_run_a_parked_workers_rounds_and_get_the_same_answers() {
    let dir = test_dir("inline-rounds");
    let (key_file, key) = key(&dir);
    let master = pfs_server::start_master(&master_config(&dir, &key_file, 1)).unwrap();
    let start = |inline: bool| {
        let mut cfg = server_config(&dir, &key_file, master.addr(), 0, 2, 0);
        cfg.inline_rounds = inline;
        pfs_server::start(&cfg, Duration::from_secs(10)).unwrap()
    };
    // Paced lookups of `names` in `d`: the worker parks between them.
    let paced = |fs: &pfs_client::Cluster, d: InodeId, names: &[String]| -> u64 {
        let before = fs.inline_answers();
        for name in names {
            std::thread::sleep(Duration::from_millis(2));
            fs.lookup(d, name.as_bytes()).unwrap();
        }
        fs.inline_answers() - before
    };
    let server = start(true);
    let fs = client(master.addr(), &key);
    let root = fs.mkdir(InodeId::ROOT, b"inline", 0o755, 0, 0).unwrap().ino;
    // What each thread's directory holds at the end: name -> content seed.
    let kept: Vec<(InodeId, Vec<(String, u64)>)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || {
                    let d = fs.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0).unwrap().ino;
                    let mut kept = Vec::new();
                    for i in 0..60u64 {
                        let seed = (t * 60 + i) % 45;
                        let name = format!("f{i}");
                        let ino = write_file(fs, d, &name, &content(seed));
                        assert_eq!(read_file(fs, ino), content(seed), "t{t}/{name}");
                        if i % 7 == 0 {
                            let fh = fs.open(ino, 0).unwrap();
                            fs.fsync(ino, fh, false).unwrap();
                            fs.release(ino, fh).unwrap();
                        }
                        match i % 3 {
                            0 => {
                                let to = format!("g{i}");
                                fs.rename(
                                    d,
                                    name.as_bytes(),
                                    d,
                                    to.as_bytes(),
                                    RenameFlags::empty(),
                                )
                                .unwrap();
                                assert_eq!(fs.lookup(d, to.as_bytes()).unwrap().ino, ino);
                                assert!(matches!(
                                    fs.lookup(d, name.as_bytes()),
                                    Err(FsError::NotFound)
                                ));
                                kept.push((to, seed));
                            }
                            1 => {
                                fs.unlink(d, name.as_bytes()).unwrap();
                                assert!(matches!(
                                    fs.lookup(d, name.as_bytes()),
                                    Err(FsError::NotFound)
                                ));
                            }
                            _ => kept.push((name, seed)),
                        }
                    }
                    (d, kept)
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (d0, names0) = &kept[0];
    let names: Vec<String> = names0.iter().map(|(n, _)| n.clone()).collect();
    let inline = paced(&fs, *d0, &names);
    assert!(
        inline * 2 >= names.len() as u64,
        "{inline} of {} paced lookups answered by this thread's rounds",
        names.len()
    );
    drop(fs);
    server.stop().unwrap();

    let server = start(false);
    let fs = client(master.addr(), &key);
    for (d, names) in &kept {
        let mut listed: Vec<String> = fs
            .readdir(*d, None, 1000)
            .unwrap()
            .into_iter()
            .map(|e| String::from_utf8(e.name).unwrap())
            .collect();
        listed.sort();
        let mut want: Vec<String> = names.iter().map(|(n, _)| n.clone()).collect();
        want.sort();
        assert_eq!(listed, want, "directory {d:?} after the restart");
        for (name, seed) in names {
            let ino = fs.lookup(*d, name.as_bytes()).unwrap().ino;
            assert_eq!(read_file(&fs, ino), content(*seed), "{name} after the restart");
        }
    }
    assert_eq!(paced(&fs, *d0, &names), 0, "a server without inline_rounds is woken instead");
    drop(fs);
    server.stop().unwrap();
    master.stop();
}
