//! Durability contracts on real server processes (docs/reliability.md):
//!
//! - A worker panic and a failed commit fail-stop the whole server: it exits
//!   non-zero with the reason in its log, and after a restart what was durable is
//!   there (failpoints `worker.panic` and `shard.commit`, `PFS_FAILPOINTS`).
//! - A client whose acknowledged changes were not yet durable when their server
//!   restarted gets `EIO` from the next `fsync` of the file, once (close
//!   succeeds: it is not a commit).
//! - Servers refuse server-internal requests from clients with `EPERM`, log it,
//!   and go on serving.
//! - A worker answers requests while its group commit waits for the device
//!   (failpoint `commit.hold_ms`), while a read waits for its device read
//!   (failpoint `read.hold_ms`), and while a checkpoint is under way (failpoint
//!   `checkpoint.hold_ms`); lookups and stats of inodes whose metadata pages
//!   are not in memory read them in the background.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::procs::{wait_timeout, ClusterProcs};
use pfs_client::conn::{rpc_options, Conn};
use pfs_client::FileSystem;
use pfs_core::wire::{Reply, Request};
use pfs_core::{ClientId, FileHandle, FsError, InodeId};
use pfs_net::ClusterKey;

fn log_of(c: &ClusterProcs, n: u32) -> String {
    log_of_dir(&c.dir, n)
}

fn write_synced(fs: &dyn FileSystem, name: &[u8], data: &[u8]) -> InodeId {
    let (a, fh) = fs.create(InodeId::ROOT, name, 0o644, 0, 0, 0).unwrap();
    fs.write(a.ino, fh, 0, data).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    fs.release(a.ino, fh).unwrap();
    fs.fsyncdir(InodeId::ROOT, FileHandle(0), false).unwrap();
    a.ino
}

/// The whole content of `name` in the root.
/// A bare connection to server 0 of `c` as client `id`, for requests the
/// native client never sends.
fn raw_conn(c: &ClusterProcs, dir: &std::path::Path, id: ClientId) -> Conn {
    let key = ClusterKey::load(&dir.join("cluster.key")).unwrap();
    let t = Duration::from_secs(5);
    let view = pfs_client::cluster::fetch_view(c.master_addr, &key, t).unwrap();
    let addr: SocketAddr = view.servers[0].addr.parse().unwrap();
    Conn::connect(addr, key, rpc_options(id, t, t)).unwrap()
}

fn read_back(fs: &dyn FileSystem, name: &[u8]) -> Vec<u8> {
    common::read_all(fs, fs.lookup(InodeId::ROOT, name).unwrap().ino).unwrap()
}

fn read_back_checked(fs: &dyn FileSystem, name: &[u8]) -> Result<Vec<u8>, FsError> {
    common::read_all(fs, fs.lookup(InodeId::ROOT, name)?.ino)
}

/// Restarts server 0 with `failpoints`, drives requests until it stops by
/// itself, and returns its exit status and log.
fn run_until_fail_stop(
    c: &mut ClusterProcs,
    failpoints: &str,
) -> (std::process::ExitStatus, String) {
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[("PFS_FAILPOINTS", failpoints)]));
    c.wait_registered(1);
    let fs = c.client();
    for i in 0..2000 {
        let name = format!("busy{i}");
        if let Ok((a, fh)) = fs.create(InodeId::ROOT, name.as_bytes(), 0o644, 0, 0, 0) {
            let _ = fs.write(a.ino, fh, 0, b"some bytes");
            let _ = fs.fsync(a.ino, fh, false);
            let _ = fs.release(a.ino, fh);
        }
        if c.servers[0].as_mut().unwrap().try_wait().unwrap().is_some() {
            break;
        }
    }
    drop(fs);
    let mut child = c.servers[0].take().unwrap();
    let status =
        wait_timeout(&mut child, Duration::from_secs(30)).expect("the server stops by itself");
    (status, log_of(c, 0))
}

#[test]
fn a_worker_panic_and_a_failed_commit_stop_the_server_and_lose_nothing_durable() {
    let dir = common::test_dir("failstop");
    let mut c = ClusterProcs::start(&dir, 1, 2);
    let fs = c.client();
    write_synced(&fs, b"kept", b"durable before the failure");
    drop(fs);

    let (status, log) = run_until_fail_stop(&mut c, "worker.panic=40");
    assert!(!status.success(), "a panicked worker must stop the server non-zero: {status}");
    assert!(log.contains("fail-stop: worker") && log.contains("panicked"), "log says why:\n{log}");
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    assert_eq!(read_back(&c.client(), b"kept"), b"durable before the failure");

    let (status, log) = run_until_fail_stop(&mut c, "shard.commit=30");
    assert!(!status.success(), "a failed commit must stop the server non-zero: {status}");
    assert!(log.contains("commit failed"), "log says why:\n{log}");
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    let fs = c.client();
    assert_eq!(read_back(&fs, b"kept"), b"durable before the failure");
    write_synced(&fs, b"after", b"serving again");
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A file `f` in the root whose create is durable and whose write of `data`
/// was acknowledged (flushed) but not synced, with its open handle.
fn acknowledged_unsynced(fs: &dyn FileSystem, data: &[u8]) -> (InodeId, FileHandle) {
    let (a, fh) = fs.create(InodeId::ROOT, b"f", 0o644, 0, 0, 0).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    fs.write(a.ino, fh, 0, data).unwrap();
    fs.flush(a.ino, fh).unwrap();
    (a.ino, fh)
}

/// The error of an `fsync` whose changes a restarted server may have lost.
fn assert_restarted(err: &FsError) {
    assert!(matches!(err, FsError::Io(m) if m.contains("restarted")), "{err:?}");
}

#[test]
fn fsync_fails_after_a_restart_that_may_have_lost_acknowledged_writes() {
    let dir = common::test_dir("bootid");
    let mut c = ClusterProcs::start(&dir, 1, 2);
    let fs = c.client();
    let (ino, fh) = acknowledged_unsynced(&fs, b"acknowledged, not yet durable");
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    assert_restarted(&fs.fsync(ino, fh, false).unwrap_err());
    // Reported once: what is written from now on is durable again.
    fs.write(ino, fh, 0, b"written again").unwrap();
    fs.fsync(ino, fh, false).unwrap();
    fs.release(ino, fh).unwrap();

    // Close is not fsync: it succeeds after the restart (it only makes the
    // writes visible), and the loss goes to whoever syncs the file next, here
    // through another handle.
    let fh = fs.open(ino, 0).unwrap();
    fs.write(ino, fh, 0, b"acknowledged again").unwrap();
    fs.flush(ino, fh).unwrap();
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    fs.release(ino, fh).unwrap();
    // A read on the dropped connection goes again on the new one (no EIO).
    let fh = fs.open(ino, 0).unwrap();
    assert_restarted(&fs.fsync(ino, fh, false).unwrap_err());
    fs.fsync(ino, fh, false).unwrap();
    fs.release(ino, fh).unwrap();
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Changes acknowledged seconds before a crash were made durable by the
/// shard's own commit, and the client's background check learned so: its
/// `fsync` after the restart succeeds and the bytes are there. (It reported
/// `EIO` for every change since the file's last `fsync`, however old.)
#[test]
fn fsync_after_a_restart_succeeds_for_changes_checked_durable_before_it() {
    let dir = common::test_dir("swept");
    let mut c = ClusterProcs::start(&dir, 1, 2);
    let fs = c.client();
    let (ino, fh) = acknowledged_unsynced(&fs, b"acknowledged seconds before the crash");
    // Two sweeps of one second each and then some: the first takes marks
    // one sweep old.
    std::thread::sleep(Duration::from_secs(4));
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    fs.fsync(ino, fh, false).expect("changes checked durable before the crash");
    assert_eq!(read_back(&fs, b"f"), b"acknowledged seconds before the crash");
    // What the check had not seen yet is still reported.
    fs.write(ino, fh, 0, b"acknowledged just before a crash").unwrap();
    fs.flush(ino, fh).unwrap();
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    assert_restarted(&fs.fsync(ino, fh, false).unwrap_err());
    fs.release(ino, fh).unwrap();
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server stopped cleanly (SIGTERM: drain, commit, checkpoint) keeps its
/// boot id, so a client's acknowledged changes fsync fine after the restart;
/// the mark is gone while the server runs, and a crash after that restart
/// gets a new id again (EIO).
#[test]
fn fsync_after_a_clean_restart_succeeds() {
    let dir = common::test_dir("cleanstop");
    let mut c = ClusterProcs::start(&dir, 1, 2);
    let fs = c.client();
    let (ino, fh) = acknowledged_unsynced(&fs, b"acknowledged before a clean stop");
    let data = c.server_config(0).data_path;
    let mark = pfs_server::cleanstop::mark_path(&data).unwrap();
    assert!(!mark.exists(), "no mark while the server runs");
    c.stop_servers();
    assert!(mark.exists(), "a clean stop leaves {}", mark.display());
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    fs.fsync(ino, fh, false).expect("fsync after a clean restart");
    assert!(!mark.exists(), "the start took the mark");
    assert_eq!(read_back(&fs, b"f"), b"acknowledged before a clean stop");
    assert!(log_of(&c, 0).contains("the last stop was clean"), "{}", log_of(&c, 0));

    // The kept id does not outlive a crash: changes acknowledged after the
    // clean restart are reported lost after a SIGKILL.
    fs.write(ino, fh, 0, b"acknowledged, then a crash").unwrap();
    fs.flush(ino, fh).unwrap();
    c.kill_server(0);
    assert!(!mark.exists());
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    assert_restarted(&fs.fsync(ino, fh, false).unwrap_err());
    fs.release(ino, fh).unwrap();

    // A mark whose zones changed since (here: another checkpoint, as an
    // offline `pfs fsck` takes) is refused: a new boot id.
    let fh = fs.open(ino, 0).unwrap();
    fs.write(ino, fh, 0, b"acknowledged, then fsck").unwrap();
    fs.flush(ino, fh).unwrap();
    c.stop_servers();
    assert!(mark.exists());
    let kept = std::fs::read_to_string(&mark).unwrap();
    let cfg = c.server_config(0);
    let (shards, lock) = pfs_server::server::open_for_check(&cfg).unwrap();
    drop(shards);
    drop(lock);
    assert_eq!(std::fs::read_to_string(&mark).unwrap(), kept);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    assert_restarted(&fs.fsync(ino, fh, false).unwrap_err());
    assert!(log_of(&c, 0).contains("the zones changed since"), "{}", log_of(&c, 0));
    fs.release(ino, fh).unwrap();
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn servers_refuse_internal_requests_from_clients() {
    let dir = common::test_dir("internal");
    let c = ClusterProcs::start(&dir, 1, 2);
    let t = Duration::from_secs(5);
    let conn = raw_conn(&c, &dir, ClientId(77));
    let follow = pfs_core::wire::FollowOp::Drop { ino: InodeId::ROOT };
    for req in [
        Request::SealDir { txn: 1, dir: InodeId::ROOT },
        Request::TxnForget { txn: 1, dir_removed: false },
        Request::FollowUps { from: pfs_core::ShardId(1), ops: vec![(1 << 48, follow)] },
        Request::DropInode { ino: InodeId::ROOT },
        Request::AddLink { ino: InodeId::ROOT },
    ] {
        assert_eq!(conn.call(req, 0, t).unwrap_err(), FsError::NotPermitted);
    }
    // The connection and the server go on serving.
    assert!(matches!(conn.call(Request::StatFs, 0, t).unwrap(), Reply::StatFs(_)));
    // Servers themselves still run cross-shard operations (they prove the role).
    let fs = c.client();
    let d = fs.mkdir(InodeId::ROOT, b"d", 0o755, 0, 0).unwrap();
    fs.rmdir(InodeId::ROOT, b"d").unwrap();
    let _ = d;
    for i in 0..20 {
        let (a, fh) = fs.create(InodeId::ROOT, format!("x{i}").as_bytes(), 0o644, 0, 0, 0).unwrap();
        fs.release(a.ino, fh).unwrap();
        fs.rename(
            InodeId::ROOT,
            format!("x{i}").as_bytes(),
            InodeId::ROOT,
            format!("y{i}").as_bytes(),
            pfs_core::wire::RenameFlags::empty(),
        )
        .unwrap();
    }
    assert!(log_of(&c, 0).contains("refused server-internal request"));
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creates, writes and fsyncs `name`; the first error is returned as is.
fn try_write_synced(fs: &dyn FileSystem, name: &[u8], data: &[u8]) -> Result<(), FsError> {
    let (a, fh) = fs.create(InodeId::ROOT, name, 0o644, 0, 0, 0)?;
    let r = fs.write(a.ino, fh, 0, data).and_then(|_| fs.fsync(a.ino, fh, false));
    let closed = fs.release(a.ino, fh);
    r?;
    closed?;
    fs.fsyncdir(InodeId::ROOT, FileHandle(0), false)
}

/// A device that fails a write, a sync or a read in the middle of the work: the
/// client gets `EIO` (never a wrong answer), the server goes on or fail-stops (a
/// failed data write or read leaves no trace and is survivable; a failed log
/// write or sync is not), and after a restart every file whose fsync succeeded
/// is intact.
#[test]
fn device_errors_reach_the_client_as_eio_and_lose_nothing_acknowledged() {
    let dir = common::test_dir("devfault");
    let mut c = ClusterProcs::start(&dir, 1, 2);
    let mut kept: Vec<(String, Vec<u8>)> = Vec::new();
    let specs = [
        "device.write=40",
        "device.write=150",
        "device.sync=12",
        "device.sync=40",
        // Far enough that a failed read is a client's, not the start's (which
        // would fail the start).
        "device.read=1000",
    ];
    for spec in specs {
        c.kill_server(0);
        c.servers[0] = Some(c.spawn_server(0, &[("PFS_FAILPOINTS", spec)]));
        c.wait_registered(1);
        let fs = c.client();
        let mut surfaced = None;
        for i in 0..4000 {
            if spec.starts_with("device.read") {
                // Reads of what is there (the server has no read cache).
                let (name, data) = &kept[i as usize % kept.len()];
                match read_back_checked(&fs, name.as_bytes()) {
                    Ok(got) => assert_eq!(&got, data, "{spec}: {name} read wrong"),
                    Err(e) => {
                        surfaced = Some(e);
                        break;
                    }
                }
                continue;
            }
            if i >= 400 {
                break;
            }
            let name = format!("{spec}-{i}");
            let data = common::content(i * 31 + kept.len() as u64);
            match try_write_synced(&fs, name.as_bytes(), &data) {
                Ok(()) => kept.push((name, data)),
                Err(e) => {
                    surfaced = Some(e);
                    break;
                }
            }
        }
        let e = surfaced.unwrap_or_else(|| panic!("{spec}: the injected fault never surfaced"));
        assert!(matches!(e, FsError::Io(_)), "{spec}: the client got {e:?}, not EIO");
        drop(fs);
        // Fail-stopped or not, restart without the fault and check.
        let mut child = c.servers[0].take().unwrap();
        let stopped = child.try_wait().unwrap();
        if stopped.is_none() {
            common::procs::kill(&child);
        }
        child.wait().unwrap();
        c.servers[0] = Some(c.spawn_server(0, &[]));
        c.wait_registered(1);
        let fs = c.client();
        for (name, data) in &kept {
            assert_eq!(&read_back(&fs, name.as_bytes()), data, "{spec}: {name} after restart");
        }
        println!("{spec}: EIO reached the client; server fail-stopped: {}", stopped.is_some());
    }
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn data_of_a_file_that_does_not_exist_is_swept() {
    let dir = common::test_dir("sweep");
    let c = ClusterProcs::start(&dir, 1, 2);
    let t = Duration::from_secs(5);
    let conn = raw_conn(&c, &dir, ClientId(78));
    // What a client leaves when its file's home crashes before the create is
    // durable: data on another shard (worker 0) of an inode its home (worker 1,
    // shard 1) does not have.
    let ino = InodeId::compose(pfs_core::ShardId(1), 1 << 30);
    let layout = pfs_core::FileLayout::Block;
    let write = Request::WriteData { ino, layout, offset: 65536, data: vec![9; 1000] };
    assert!(matches!(conn.call(write, 0, t).unwrap(), Reply::WriteData { written: 1000 }));
    let read = || match conn.call(
        Request::ReadData {
            ino,
            layout,
            offset: 65536,
            size: 1000,
            blocks: pfs_core::wire::ALL_BLOCKS,
        },
        0,
        t,
    ) {
        Ok(Reply::ReadData(d)) => d,
        other => panic!("read: {other:?}"),
    };
    assert_eq!(read(), vec![9; 1000]);
    // The data shard asks the home every 2 s and frees it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while read().iter().any(|&b| b != 0) {
        assert!(std::time::Instant::now() < deadline, "the data was never swept");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(log_of(&c, 0).contains(&format!("freed the data of inode {ino}")));
    // A file that exists keeps its data.
    let fs = c.client();
    let (a, fh) = fs.create(InodeId::ROOT, b"kept", 0o644, 0, 0, 0).unwrap();
    let data = vec![5u8; 300_000];
    fs.write(a.ino, fh, 0, &data).unwrap();
    fs.release(a.ino, fh).unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(common::read_all(&fs, a.ino).unwrap(), data);
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cluster of one server with one worker, restarted with `failpoints`
/// (`PFS_FAILPOINTS`), in a new test directory named `name`.
fn one_worker_with(name: &str, failpoints: &str) -> (common::TestDir, ClusterProcs) {
    let dir = common::test_dir(name);
    let mut c = ClusterProcs::start(&dir, 1, 1);
    // Registered is not yet formatted: a server registers for its id, then
    // formats its zones. The kill below is meant for a running server (a cut
    // format has its own test, `a_first_start_killed_while_it_formats_starts_again`):
    // serving a client means the zones are formatted.
    c.client().getattr(InodeId::ROOT).expect("the first server serves");
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[("PFS_FAILPOINTS", failpoints)]));
    c.wait_registered(1);
    (dir, c)
}

/// A read that misses the cache waits for its device read beside the other
/// requests: with finished reads handed out 600 ms late (failpoint
/// `read.hold_ms`), another client's stat and create on the same single
/// worker are answered while the read waits, and the read returns the bytes.
#[test]
fn a_worker_serves_requests_while_a_read_waits_for_the_device() {
    const HOLD_MS: u64 = 600;
    let (dir, c) = one_worker_with("read-beside", &format!("read.hold_ms={HOLD_MS}"));
    let fs = c.client();
    let other = c.client();
    // Whole blocks: not kept in the read cache once written, so the read
    // below goes to the device.
    let data: Vec<u8> = (0..512u32 << 10).map(|i| (i % 251) as u8).collect();
    let (a, fh) = fs.create(InodeId::ROOT, b"on-disk", 0o644, 0, 0, 0).unwrap();
    fs.write(a.ino, fh, 0, &data).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    let reading = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let got = fs.read(a.ino, fh, 0, data.len() as u32).unwrap();
        let end = std::time::Instant::now();
        fs.release(a.ino, fh).unwrap();
        assert!(got == data, "the read returned other bytes");
        (start, end)
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(other.getattr(a.ino).unwrap().size, 512 << 10);
    let (b, bfh) = other.create(InodeId::ROOT, b"beside", 0o644, 0, 0, 0).unwrap();
    other.release(b.ino, bfh).unwrap();
    let served = std::time::Instant::now();
    let (start, read) = reading.join().unwrap();
    assert!(
        read.duration_since(start) >= Duration::from_millis(HOLD_MS),
        "the read returned after {:?}: it did not wait for the held device read",
        read.duration_since(start)
    );
    assert!(
        served + Duration::from_millis(HOLD_MS / 2) <= read,
        "the stat and create were answered {:?} after the read started, only {:?} \
         before it returned: the worker waited for the read",
        served.duration_since(start),
        read.saturating_duration_since(served)
    );
    drop(other);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A read in flight when its server dies is sent again once the server is
/// back, through `read_with` as through `read`, and returns the bytes: a read
/// changes nothing, so the caller does not see the restart. The read is held
/// at the first server process (failpoint `read.hold_ms`) so that the kill
/// comes while it waits.
#[test]
fn a_read_in_flight_when_its_server_dies_is_sent_again() {
    let (dir, mut c) = one_worker_with("read-resent", "read.hold_ms=3000");
    let fs = c.client();
    let data: Vec<u8> = (0..256u32 << 10).map(|i| (i % 247) as u8).collect();
    let (a, fh) = fs.create(InodeId::ROOT, b"on-disk", 0o644, 0, 0, 0).unwrap();
    fs.write(a.ino, fh, 0, &data).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    let want = data.clone();
    let reading = std::thread::spawn(move || {
        let mut got = Vec::new();
        let r = fs.read_with(a.ino, fh, 0, want.len() as u32, &mut |d| got = d.to_vec());
        (r, got == want)
    });
    std::thread::sleep(Duration::from_millis(500));
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    let (r, same) = reading.join().unwrap();
    assert_eq!(r, Ok(()), "the read after the restart");
    assert!(same, "the read returned other bytes");
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The group commit runs beside the requests: while an `fsync` waits for a
/// commit whose device steps are held back (failpoint `commit.hold_ms`), the
/// same worker answers another client's stat and create at once.
#[test]
fn a_worker_serves_requests_while_a_commit_waits_for_the_device() {
    const HOLD_MS: u64 = 300;
    let (dir, c) = one_worker_with("commit-beside", &format!("commit.hold_ms={HOLD_MS}"));
    let fs = c.client();
    let other = c.client();
    let (a, fh) = fs.create(InodeId::ROOT, b"synced", 0o644, 0, 0, 0).unwrap();
    fs.write(a.ino, fh, 0, b"made durable by the fsync").unwrap();
    let syncing = std::thread::spawn(move || {
        let start = std::time::Instant::now();
        fs.fsync(a.ino, fh, false).unwrap();
        let end = std::time::Instant::now();
        fs.release(a.ino, fh).unwrap();
        (start, end)
    });
    std::thread::sleep(Duration::from_millis(50));
    // The fsync's commit writes the log and syncs it: at least two held steps.
    assert_eq!(other.getattr(a.ino).unwrap().ino, a.ino);
    let (b, bfh) = other.create(InodeId::ROOT, b"beside", 0o644, 0, 0, 0).unwrap();
    other.release(b.ino, bfh).unwrap();
    let served = std::time::Instant::now();
    let (start, synced) = syncing.join().unwrap();
    assert!(
        synced.duration_since(start) >= Duration::from_millis(2 * HOLD_MS),
        "the fsync returned after {:?}: it did not wait for the held commit",
        synced.duration_since(start)
    );
    assert!(
        served + Duration::from_millis(HOLD_MS) <= synced,
        "the stat and create were answered {:?} after the fsync started, only {:?} \
         before it returned: the worker waited for the commit",
        served.duration_since(start),
        synced.saturating_duration_since(served)
    );
    drop(other);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint runs beside the requests: with its header held back 3 s
/// (failpoint `checkpoint.hold_ms`), the same worker creates, writes and
/// makes durable another file while it is under way; the checkpoint then
/// finishes, and after a SIGKILL everything made durable is there.
#[test]
fn a_worker_serves_requests_while_a_checkpoint_is_under_way() {
    const HOLD_MS: u64 = 3000;
    let (dir, mut c) = one_worker_with("ckpt-beside", &format!("checkpoint.hold_ms={HOLD_MS}"));
    let fs = c.client();
    let (a, fh) = fs.create(InodeId::ROOT, b"big-xattrs", 0o644, 0, 0, 0).unwrap();
    let value = vec![7u8; 60 << 10];
    let set = pfs_core::wire::XattrSetMode::Any;
    // Records of 60 KiB fill the log's half (4 MiB of the test's 8) fast.
    let started = "checkpoint started beside the requests";
    let mut n = 0;
    while !log_of(&c, 0).contains(started) {
        fs.setxattr(a.ino, format!("user.k{}", n % 16).as_bytes(), &value, set).unwrap();
        n += 1;
        assert!(n < 2000, "no checkpoint started after {n} records of 60 KiB");
    }
    let t = std::time::Instant::now();
    let (b, bfh) = fs.create(InodeId::ROOT, b"beside", 0o644, 0, 0, 0).unwrap();
    fs.write(b.ino, bfh, 0, b"written while the checkpoint ran").unwrap();
    fs.fsync(b.ino, bfh, false).unwrap();
    fs.release(b.ino, bfh).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    let served = t.elapsed();
    let finished = "checkpointed beside the requests";
    assert!(
        !log_of(&c, 0).contains(finished),
        "the checkpoint finished before the requests beside it were answered ({served:?})"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !log_of(&c, 0).contains(finished) {
        assert!(std::time::Instant::now() < deadline, "the checkpoint never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        t.elapsed() >= Duration::from_millis(HOLD_MS / 2),
        "the checkpoint finished {:?} after the requests started: not held",
        t.elapsed()
    );
    drop(fs);
    c.kill_server(0);
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    let fs = c.client();
    assert_eq!(
        common::read_all(&fs, fs.lookup(InodeId::ROOT, b"beside").unwrap().ino).unwrap(),
        b"written while the checkpoint ran"
    );
    assert_eq!(fs.getxattr(a.ino, b"user.k0").unwrap(), value);
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stops the server cleanly (checkpoint: nothing to replay) and starts it
/// again, so no inode page is in memory.
fn restart_cold(c: &mut ClusterProcs) {
    c.stop_servers();
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
}

/// Runs `each(client, i, inos[i])` for every file, the even ones on one
/// client and the odd ones on another, at once.
fn on_two_clients(
    c: &ClusterProcs,
    inos: &std::sync::Arc<Vec<InodeId>>,
    each: impl Fn(&pfs_client::Cluster, usize, InodeId) + Copy + Send + 'static,
) {
    let workers: Vec<_> = (0..2)
        .map(|k| {
            let fs = c.client();
            let inos = inos.clone();
            std::thread::spawn(move || {
                for (i, ino) in inos.iter().enumerate().skip(k).step_by(2) {
                    each(&fs, i, *ino);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

/// Requests on inodes whose pages are not in memory read them in the
/// background and run again: after a clean restart (nothing resident) of a
/// server with 6,000 files and an Icache of 256 pages, two clients look up
/// and stat every file at once; after another, they chmod a third of the
/// files and remove the rest. Every answer is right, and the server's stop
/// log counts the background reads.
#[test]
fn lookups_of_cold_inodes_read_their_pages_in_the_background() {
    let dir = common::test_dir("cold-lookups");
    let mut c = ClusterProcs::start(&dir, 1, 1);
    let fs = c.client();
    let d = fs.mkdir(InodeId::ROOT, b"many", 0o755, 0, 0).unwrap().ino;
    let inos = files_in(&fs, d, 6000, |_| Vec::new());
    drop(fs);
    restart_cold(&mut c);
    on_two_clients(&c, &inos, move |fs, i, ino| {
        let found = fs.lookup(d, format!("f{i}").as_bytes()).unwrap();
        assert_eq!(found.ino, ino, "f{i}");
        let attr = fs.getattr(ino).unwrap();
        assert_eq!((attr.ino, attr.perm & 0o777), (ino, 0o600), "f{i}");
    });
    // Changes of cold inodes: a restart again, then every third file
    // chmodded and every other one removed, by two clients at once.
    restart_cold(&mut c);
    on_two_clients(&c, &inos, move |fs, i, ino| {
        let name = format!("f{i}");
        if i % 3 == 0 {
            let set = pfs_core::SetAttr { perm: Some(0o640), ..Default::default() };
            fs.setattr(ino, &set).unwrap();
            assert_eq!(fs.getattr(ino).unwrap().perm & 0o777, 0o640, "{name}");
        } else {
            fs.unlink(d, name.as_bytes()).unwrap();
            assert_eq!(fs.lookup(d, name.as_bytes()).unwrap_err(), FsError::NotFound);
        }
    });
    let fs = c.client();
    for (i, ino) in inos.iter().enumerate() {
        let found = fs.lookup(d, format!("f{i}").as_bytes());
        if i % 3 == 0 {
            assert_eq!(found.unwrap().ino, *ino, "f{i}");
        } else {
            assert_eq!(found.unwrap_err(), FsError::NotFound, "f{i}");
        }
    }
    drop(fs);
    c.stop_servers();
    let reads = stop_count(&c, "background_reads");
    assert!(reads >= 100, "{reads} inode pages read in the background");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Files `f0`..`f{n-1}` in `d`, file `i` holding `data(i)`; their inodes.
fn files_in(
    fs: &pfs_client::Cluster,
    d: InodeId,
    n: usize,
    data: impl Fn(usize) -> Vec<u8>,
) -> std::sync::Arc<Vec<InodeId>> {
    let mut inos = Vec::new();
    for i in 0..n {
        let (a, fh) = fs.create(d, format!("f{i}").as_bytes(), 0o600, 0, 0, 0).unwrap();
        let bytes = data(i);
        if !bytes.is_empty() {
            fs.write(a.ino, fh, 0, &bytes).unwrap();
        }
        fs.release(a.ino, fh).unwrap();
        inos.push(a.ino);
    }
    std::sync::Arc::new(inos)
}

/// The count `name` in the last stop line of server 0's log.
fn stop_count(c: &ClusterProcs, name: &str) -> u64 {
    let log = log_of(c, 0);
    let stats = log.rsplit("checkpointed, stopping;").next().unwrap();
    stats
        .split(&format!("{name}: "))
        .nth(1)
        .and_then(|r| r.split(|ch: char| !ch.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the stop log: {stats}"))
}

/// Appends to files whose blocks are not in memory (a restarted server):
/// each write first stops at the inode's page and then at the old bytes its
/// block merges, reads them in the background, and runs again once they are
/// in memory. Two clients append to 2,000 files at once; every file then
/// holds its old bytes and the appended ones, after another restart too, and
/// the server's stop log counts the deferred merges.
#[test]
fn appends_to_cold_blocks_read_the_old_bytes_in_the_background() {
    let dir = common::test_dir("cold-appends");
    let mut c = ClusterProcs::start(&dir, 1, 1);
    let fs = c.client();
    let d = fs.mkdir(InodeId::ROOT, b"many", 0o755, 0, 0).unwrap().ino;
    let old = |i: usize| -> Vec<u8> { (0..3000).map(|k| (k * 31 + i) as u8).collect() };
    let new = |i: usize| -> Vec<u8> { format!("appended to f{i}").into_bytes() };
    let inos = files_in(&fs, d, 2000, old);
    drop(fs);
    restart_cold(&mut c);
    on_two_clients(&c, &inos, move |fs, i, ino| {
        let fh = fs.open(ino, libc::O_WRONLY as u32).unwrap();
        assert_eq!(fs.write(ino, fh, 3000, &new(i)).unwrap(), new(i).len() as u32, "f{i}");
        fs.release(ino, fh).unwrap();
    });
    c.stop_servers();
    let merges = stop_count(&c, "merges_deferred");
    assert!(merges >= 100, "{merges} merges read their old bytes in the background");
    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    let fs = c.client();
    for (i, &ino) in inos.iter().enumerate() {
        let mut want = old(i);
        want.extend_from_slice(&new(i));
        assert_eq!(common::read_all(&fs, ino).unwrap(), want, "f{i}");
    }
    drop(fs);
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A regular directory (entries at its home) under the root homed on server
/// `server` (2 workers each), other than the shards in `not`.
fn regular_dir_on(fs: &dyn FileSystem, server: u32, not: &[u32]) -> (InodeId, u32) {
    for n in 0..64 {
        let name = format!("d{server}-{}-{n}", not.len());
        let a = fs.mkdir(InodeId::ROOT, name.as_bytes(), 0o755, 0, 0).unwrap();
        let shard = a.ino.shard().unwrap().0;
        if shard / 2 == server && !not.contains(&shard) {
            let layout = pfs_core::wire::XattrSetMode::Any;
            fs.setxattr(a.ino, b"user.pfs.dir_layout", b"regular", layout).unwrap();
            return (a.ino, shard);
        }
    }
    panic!("64 directories and none homed on server {server}");
}

fn put(fs: &dyn FileSystem, dir: InodeId, name: &[u8], data: &[u8]) {
    let (a, fh) = fs.create(dir, name, 0o644, 0, 0, 0).unwrap();
    fs.write(a.ino, fh, 0, data).unwrap();
    fs.fsync(a.ino, fh, false).unwrap();
    fs.release(a.ino, fh).unwrap();
    fs.fsyncdir(dir, FileHandle(0), false).unwrap();
}

fn content(fs: &dyn FileSystem, dir: InodeId, name: &[u8]) -> Result<Vec<u8>, FsError> {
    common::read_all(fs, fs.lookup(dir, name)?.ino)
}

/// The source name of a cross-shard rename under way is locked until the
/// rename ends, and a rename whose client left never lands afterwards.
///
/// `a/src` (server 0) is renamed over `b/dst` (server 1) while server 1 is
/// down, by a client that then disconnects. Meanwhile a lookup of `a/src`
/// and a rename of `c/x` (another shard of server 0) over it are refused with
/// `TryAgain` (the client retries them until its timeout): the first could
/// see a name the rename already moved, the second would free the inode
/// `b/dst` may point to. Once server 1 is back, the rename, which it never
/// applied, is abandoned: `a/src` and `b/dst` keep their files.
#[test]
fn a_rename_under_way_locks_its_source_and_is_abandoned_when_its_client_leaves() {
    let dir = common::test_dir("rename-left");
    let mut c = ClusterProcs::start(&dir, 2, 2);
    let fs = c.client();
    let probe = c.client_with_timeout(Duration::from_millis(1500));
    let (a, a_shard) = regular_dir_on(&fs, 0, &[]);
    let (b, b_shard) = regular_dir_on(&fs, 1, &[]);
    let (cd, _) = regular_dir_on(&fs, 0, &[a_shard]);
    put(&fs, a, b"src", b"the source");
    put(&fs, b, b"dst", b"the target");
    put(&fs, cd, b"x", b"another file");
    c.kill_server(1);

    let left = raw_conn(&c, &dir, ClientId(91));
    let rename = Request::RenameCross {
        parent: a,
        name: b"src".to_vec(),
        new_parent: b,
        new_name: b"dst".to_vec(),
        flags: pfs_core::wire::RenameFlags::empty(),
        target_server: pfs_core::ServerId(1),
        target_worker: pfs_core::WorkerId(b_shard % 2),
    };
    let _sent = left.send(rename, (a_shard % 2) as u16, Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(200));

    assert_eq!(probe.lookup(a, b"src").unwrap_err(), FsError::TryAgain, "lookup of a moving name");
    let onto = probe.rename(cd, b"x", a, b"src", pfs_core::wire::RenameFlags::empty());
    assert_eq!(onto, Err(FsError::TryAgain), "a rename onto a moving name");

    drop(left);
    // The coordinator asks server 1 again every 500 ms; the first time after
    // the client left, it marks the rename as resumed.
    std::thread::sleep(Duration::from_millis(1200));
    c.servers[1] = Some(c.spawn_server(1, &[]));
    c.wait_registered(2);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let src = loop {
        match content(&probe, a, b"src") {
            Err(FsError::TryAgain) if std::time::Instant::now() < deadline => continue,
            other => break other,
        }
    };
    assert_eq!(src.as_deref(), Ok(&b"the source"[..]), "a/src after the abandoned rename");
    assert_eq!(content(&probe, b, b"dst").as_deref(), Ok(&b"the target"[..]), "b/dst");
    assert_eq!(content(&probe, cd, b"x").as_deref(), Ok(&b"another file"[..]), "c/x");
    assert!(log_of(&c, 0).contains("its client left"), "server 0 did not log the abandon");
    drop((fs, probe));
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Steps of operations that span the workers of one server travel over its
/// worker rings, never over a connection from the server to itself: on one
/// server with 2 workers, renames across its two shards (the root is a
/// bigdir: its names are spread over both), a bigdir's rmdir and the
/// follow-ups they log all complete, and the server never connects to a peer.
#[test]
fn work_across_the_workers_of_one_server_stays_inside_it() {
    let dir = common::test_dir("one-server-rings");
    let c = ClusterProcs::start(&dir, 1, 2);
    let fs = c.client();
    let root = InodeId::ROOT;
    for n in 0..16 {
        put(&fs, root, format!("f{n}").as_bytes(), format!("file {n}").as_bytes());
    }
    // 16 names over 2 shards: most renames below cross them.
    for n in 0..16 {
        let (from, to) = (format!("f{n}"), format!("g{}", 15 - n));
        fs.rename(root, from.as_bytes(), root, to.as_bytes(), pfs_core::wire::RenameFlags::empty())
            .unwrap();
    }
    let sub = fs.mkdir(root, b"sub", 0o755, 0, 0).unwrap();
    fs.rmdir(root, b"sub").unwrap();
    assert_eq!(fs.getattr(sub.ino).unwrap_err(), FsError::NotFound);
    fs.fsyncdir(root, FileHandle(0), false).unwrap();
    for n in 0..16 {
        let want = format!("file {n}");
        let got = content(&fs, root, format!("g{}", 15 - n).as_bytes()).unwrap();
        assert_eq!(got, want.as_bytes(), "g{}", 15 - n);
        assert_eq!(fs.lookup(root, format!("f{n}").as_bytes()).unwrap_err(), FsError::NotFound);
    }
    drop(fs);
    c.stop();
    let log = log_of_dir(&dir, 0);
    let own =
        log.lines().filter(|l| l.contains("pfs_net::rpc") && l.contains("connected to 127.0.0.2"));
    assert_eq!(own.count(), 0, "the server connected to itself:\n{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn log_of_dir(dir: &std::path::Path, n: u32) -> String {
    std::fs::read_to_string(dir.join(format!("server-{n}.log"))).unwrap()
}

/// A first start killed while it formats starts again: a format begins with
/// an intent over zone 0's superblock (which server it formats for) and ends
/// with zone 0's superblock, so a start cut before that (held by failpoint
/// `format.hold_ms`, then SIGKILL) leaves a device the next start formats
/// again as the same server, with a warning, instead of one that never
/// starts (or that the master refuses as a new server in its place). A device
/// in use whose zone 0 was damaged is refused, not formatted over.
#[test]
fn a_first_start_killed_while_it_formats_starts_again() {
    let dir = common::test_dir("cutformat");
    let mut c = ClusterProcs::configure(&dir, 1, 2);
    let child = c.spawn_server(0, &[("PFS_FAILPOINTS", "format.hold_ms=60000")]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(dir.join("server-0.log"))
        .unwrap_or_default()
        .contains("zone 0's superblock waits")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the format never reached zone 0's superblock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    common::procs::kill(&child);
    c.servers.push(Some(child));
    c.kill_server(0);
    assert_eq!(c.serving_lines(0), 0, "killed before it served");
    // The data file as the kill left it: zone 0 holding the intent, not its
    // superblock.
    let img = dir.join("server-0.img");
    let zone0 = std::fs::read(&img).unwrap()[..4096].to_vec();
    assert_eq!(&zone0[..8], b"PFSFMTIN", "zone 0 holds no format intent");

    c.servers[0] = Some(c.spawn_server(0, &[]));
    c.wait_registered(1);
    c.wait_serving(0, 0);
    let log = log_of(&c, 0);
    assert!(log.contains("as server 0 was cut short"), "no warning of the cut format:\n{log}");
    let fs = c.client();
    write_synced(&fs, b"after", b"formatted again");
    assert_eq!(read_back(&fs, b"after"), b"formatted again");
    drop(fs);
    c.stop_servers();

    // In use, then zone 0's superblock lost: the start stops and says so,
    // and the other zone is left as it was.
    let mut data = std::fs::read(&img).unwrap();
    let zones_before = data[4096..].to_vec();
    data[..4096].fill(0);
    std::fs::write(&img, &data).unwrap();
    let mut child = c.spawn_server(0, &[]);
    let status = wait_timeout(&mut child, Duration::from_secs(30)).expect("the start stops");
    assert!(!status.success(), "a start over a damaged zone 0 succeeded");
    let log = log_of(&c, 0);
    assert!(log.contains("some zones formatted and others not"), "no word of the damage:\n{log}");
    assert_eq!(std::fs::read(&img).unwrap()[4096..], zones_before[..], "the start wrote the zones");
    c.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
