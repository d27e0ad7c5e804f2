//! The SIGKILL soak: real server processes killed at random moments under a
//! mixed workload from two client processes, restarted, and checked.
//!
//! Each round, two clients (this binary in the `soak` child role) run random
//! operations in their own two directories: `c<id>` (a bigdir, entries on every
//! shard) and `r<id>` (a regular directory, entries at its home), so renames
//! between them cross shards. Before an operation a client prints `U <path>` for
//! every name it may change; once the operation is durable (fsync of the file,
//! fsyncdir of the directories) it prints the outcome: `D file <path> <len>
//! <crc>`, `D dir <path>`, `D absent <path>`, or `D same <path>` for an
//! operation that was refused and changed nothing. Operations left without
//! fsync leave their names uncertain until the next durable outcome. A client
//! also makes hard links of its files in its other directory and removes them
//! (the link's name is all the model tracks; `pfs fsck` checks link counts).
//!
//! After a random 1.3 to 3.5 s (a restarted server grants no write token in its
//! first second, so renames wait that long) the parent kills a random server (sometimes all
//! of them) and both clients with SIGKILL, restarts the servers, and checks with
//! a fresh client: every name with a durable outcome has exactly that state and
//! content, and no directory holds a name the clients never used. Then the
//! servers stop and `pfs fsck` must find the shards clean (work still in flight,
//! a cross-shard rename or a follow-up, it counts as done and notes).
//!
//! `PFS_SOAK_ROUNDS` (default 10) sets the rounds, `PFS_SOAK_SEED` the seed
//! (printed), `PFS_SOAK_KEEP=1` keeps the directory with the server logs. `harness =
//! false`: `main` runs the rounds or a child role.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use common::procs::{child_client, kill, spawn_child, ClusterProcs, Sizing, CHILD_ROLE};
use common::read_all;
use pfs_client::{Cluster, FileSystem};
use pfs_core::wire::{RenameFlags, XattrSetMode};
use pfs_core::{FileType, FsError, InodeId, SetAttr};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SERVERS: u32 = 2;
const WORKERS: u32 = 2;
const CLIENTS: u64 = 2;
const FILES: u32 = 12;
const SUBDIRS: u32 = 4;

/// The state a name must have after a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Known {
    Absent,
    Dir,
    File(u64, u32),
}

#[derive(Clone, Debug)]
struct Name {
    known: Known,
    uncertain: bool,
    /// `uncertain` before the operation under way (restored by `D same`).
    before: bool,
}

impl Name {
    fn durable(known: Known) -> Name {
        Name { known, uncertain: false, before: false }
    }
}

fn data_for(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

// ---- the client ----

struct Worker {
    fs: Cluster,
    id: u64,
    rng: StdRng,
    out: std::io::StdoutLock<'static>,
    dirs: [(InodeId, String); 2],
    ops: u64,
}

impl Worker {
    fn say(&mut self, line: String) {
        writeln!(self.out, "{line}").unwrap();
        self.out.flush().unwrap();
    }

    fn uncertain(&mut self, path: &str) {
        self.say(format!("U {path}"));
    }

    fn pick_file(&mut self) -> (InodeId, String, String) {
        let (dir, dname) = self.dirs[self.rng.gen_range(0..2)].clone();
        let name = format!("f{}", self.rng.gen_range(0..FILES));
        let path = format!("{dname}/{name}");
        (dir, name, path)
    }

    fn write_file(&mut self, ino: InodeId, data: &[u8]) -> Result<(), FsError> {
        let fh = self.fs.open(ino, 0)?;
        let mut r = Ok(());
        for (k, chunk) in data.chunks(200_000).enumerate() {
            if let Err(e) = self.fs.write(ino, fh, (k * 200_000) as u64, chunk) {
                r = Err(e);
                break;
            }
        }
        let r = r.and_then(|()| self.fs.fsync(ino, fh, false));
        r.and(self.fs.release(ino, fh))
    }

    /// create tmp, write, fsync, close, rename over the name, fsyncdir.
    fn put(&mut self) -> Result<(), FsError> {
        let (dir, name, path) = self.pick_file();
        let tmp = format!("{name}.tmp");
        let tmp_path = format!("{}/{tmp}", self.dirs.iter().find(|d| d.0 == dir).unwrap().1);
        self.uncertain(&path);
        self.uncertain(&tmp_path);
        let len = match self.rng.gen_range(0..10) {
            0 => 0,
            1 => self.rng.gen_range(300_000..1_100_000),
            _ => self.rng.gen_range(1..70_000),
        };
        self.ops += 1;
        let data = data_for(self.id << 40 | self.ops, len);
        let (attr, existed) = match self.fs.create(dir, tmp.as_bytes(), 0o644, 0, 0, 0) {
            Ok((a, fh)) => {
                self.fs.release(a.ino, fh)?;
                (a, false)
            }
            Err(FsError::Exists) => (self.fs.lookup(dir, tmp.as_bytes())?, true),
            Err(e) => return Err(e),
        };
        self.say(format!("I put {path} through {tmp_path} inode {} existed {existed}", attr.ino));
        self.fs.setattr(attr.ino, &SetAttr { size: Some(0), ..SetAttr::default() })?;
        self.write_file(attr.ino, &data)?;
        self.fs.rename(dir, tmp.as_bytes(), dir, name.as_bytes(), RenameFlags::empty())?;
        self.fs.fsyncdir(dir, pfs_core::FileHandle(0), false)?;
        self.say(format!("D file {path} {} {:08x}", data.len(), crc32c::crc32c(&data)));
        self.say(format!("D absent {tmp_path}"));
        Ok(())
    }

    /// Rewrites part of an existing file in place, or cuts it, then fsync.
    fn change(&mut self) -> Result<(), FsError> {
        let (dir, name, path) = self.pick_file();
        self.uncertain(&path);
        let attr = match self.fs.lookup(dir, name.as_bytes()) {
            Ok(a) => a,
            Err(FsError::NotFound) => {
                self.say(format!("D same {path}"));
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let mut data = read_all(&self.fs, attr.ino)?;
        self.say(format!("I change {path} inode {} of {} bytes", attr.ino, data.len()));
        let fh = self.fs.open(attr.ino, 0)?;
        if self.rng.gen_bool(0.5) {
            let at = self.rng.gen_range(0..=data.len());
            self.ops += 1;
            let patch = data_for(self.id << 40 | self.ops, self.rng.gen_range(1..100_000));
            self.fs.write(attr.ino, fh, at as u64, &patch)?;
            if data.len() < at + patch.len() {
                data.resize(at + patch.len(), 0);
            }
            data[at..at + patch.len()].copy_from_slice(&patch);
        } else {
            let size = self.rng.gen_range(0..=data.len());
            self.fs
                .setattr(attr.ino, &SetAttr { size: Some(size as u64), ..SetAttr::default() })?;
            data.truncate(size);
        }
        self.fs.fsync(attr.ino, fh, false)?;
        self.fs.release(attr.ino, fh)?;
        self.say(format!("D file {path} {} {:08x}", data.len(), crc32c::crc32c(&data)));
        Ok(())
    }

    /// Renames one name over another, usually across the two directories.
    fn rename(&mut self, sync: bool) -> Result<(), FsError> {
        let (from_dir, from, from_path) = self.pick_file();
        let (to_dir, to, to_path) = self.pick_file();
        if from_path == to_path {
            return Ok(());
        }
        // Both names become uncertain; the model keeps what the source was.
        self.say(format!("M {from_path} {to_path}"));
        match self.fs.rename(from_dir, from.as_bytes(), to_dir, to.as_bytes(), RenameFlags::empty())
        {
            Ok(()) => {}
            Err(FsError::NotFound) => {
                self.say(format!("D same {from_path}"));
                self.say(format!("D same {to_path}"));
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if sync {
            self.fs.fsyncdir(from_dir, pfs_core::FileHandle(0), false)?;
            self.fs.fsyncdir(to_dir, pfs_core::FileHandle(0), false)?;
            self.say(format!("D moved {from_path} {to_path}"));
        }
        Ok(())
    }

    fn unlink(&mut self, sync: bool) -> Result<(), FsError> {
        let (dir, name, path) = self.pick_file();
        self.uncertain(&path);
        match self.fs.unlink(dir, name.as_bytes()) {
            Ok(()) => {}
            Err(FsError::NotFound) => {
                self.say(format!("D same {path}"));
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        if sync {
            self.fs.fsyncdir(dir, pfs_core::FileHandle(0), false)?;
            self.say(format!("D absent {path}"));
        }
        Ok(())
    }

    /// A hard link of a file under a name in the client's other directory
    /// (its inode's home is usually another shard than the new name's, so
    /// the link is counted by a follow-up), then the link's removal, made
    /// durable. Kills land in either half; `pfs fsck` after each round
    /// checks the link counts. The model tracks the link's name only.
    fn link(&mut self) -> Result<(), FsError> {
        let (dir, name, path) = self.pick_file();
        let other = self.dirs.iter().find(|d| d.0 != dir).expect("two directories").clone();
        let lname = format!("{name}.l");
        let lpath = format!("{}/{lname}", other.1);
        self.uncertain(&lpath);
        let file = match self.fs.lookup(dir, name.as_bytes()) {
            Ok(a) if a.kind == FileType::Regular => a,
            Ok(_) | Err(FsError::NotFound) => {
                self.say(format!("D same {lpath}"));
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.say(format!("I link {path} inode {} as {lpath}", file.ino));
        match self.fs.link(file.ino, other.0, lname.as_bytes()) {
            Ok(_) => {
                let linked = self.fs.lookup(other.0, lname.as_bytes())?;
                assert_eq!(linked.ino, file.ino, "{lpath}: a link of {path}");
                assert_eq!(linked.nlink, file.nlink + 1, "{lpath}: the link count of {path}");
            }
            // Left by a kill in an earlier link: removed below all the same.
            Err(FsError::Exists) => {}
            Err(e) => return Err(e),
        }
        self.fs.unlink(other.0, lname.as_bytes())?;
        self.fs.fsyncdir(other.0, pfs_core::FileHandle(0), false)?;
        self.say(format!("D absent {lpath}"));
        Ok(())
    }

    /// mkdir or rmdir of a subdirectory of the bigdir.
    fn subdir(&mut self) -> Result<(), FsError> {
        let (dir, dname) = self.dirs[0].clone();
        let name = format!("d{}", self.rng.gen_range(0..SUBDIRS));
        let path = format!("{dname}/{name}");
        self.uncertain(&path);
        let made = match self.fs.mkdir(dir, name.as_bytes(), 0o755, 0, 0) {
            Ok(_) => true,
            Err(FsError::Exists) => false,
            Err(e) => return Err(e),
        };
        if !made {
            self.fs.rmdir(dir, name.as_bytes())?;
        }
        self.fs.fsyncdir(dir, pfs_core::FileHandle(0), false)?;
        let state = if made { "dir" } else { "absent" };
        self.say(format!("D {state} {path}"));
        Ok(())
    }

    fn step(&mut self) -> Result<(), FsError> {
        match self.rng.gen_range(0..21) {
            0..=6 => self.put(),
            7..=9 => self.change(),
            10..=12 => self.rename(true),
            13 => self.rename(false),
            14 | 15 => self.unlink(true),
            16 => self.unlink(false),
            17 => self.link(),
            _ => self.subdir(),
        }
    }
}

fn child_soak(id: u64, seed: u64) {
    let fs = child_client();
    let c = fs.lookup(InodeId::ROOT, format!("c{id}").as_bytes()).unwrap().ino;
    let r = fs.lookup(InodeId::ROOT, format!("r{id}").as_bytes()).unwrap().ino;
    let out = Box::leak(Box::new(std::io::stdout())).lock();
    let mut w = Worker {
        fs,
        id,
        rng: StdRng::seed_from_u64(seed),
        out,
        dirs: [(c, format!("c{id}")), (r, format!("r{id}"))],
        ops: seed << 20,
    };
    // Runs until killed; errors (a server going down) are reported and the
    // names the operation touched stay uncertain.
    loop {
        if let Err(e) = w.step() {
            w.say(format!("E {e}"));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

// ---- the parent ----

/// Applies one client line to the model; `moves` keeps the source's state of
/// each rename under way.
fn apply(
    model: &mut BTreeMap<String, Name>,
    moves: &mut BTreeMap<(String, String), Name>,
    line: &str,
) -> Result<(), String> {
    let f: Vec<&str> = line.split(' ').collect();
    let name = |model: &mut BTreeMap<String, Name>, p: &str| -> Name {
        model.entry(p.to_owned()).or_insert(Name::durable(Known::Absent)).clone()
    };
    let start_op = |model: &mut BTreeMap<String, Name>, p: &str| {
        let n = model.entry(p.to_owned()).or_insert(Name::durable(Known::Absent));
        n.before = n.uncertain;
        n.uncertain = true;
    };
    match f.as_slice() {
        ["U", p] => start_op(model, p),
        ["D", "same", p] => {
            let n = model.get_mut(*p).ok_or_else(|| format!("{line:?} without its U line"))?;
            n.uncertain = n.before;
        }
        ["D", "absent", p] => {
            model.insert(p.to_string(), Name::durable(Known::Absent));
        }
        ["D", "dir", p] => {
            model.insert(p.to_string(), Name::durable(Known::Dir));
        }
        ["D", "file", p, len, crc] => {
            let len = len.parse().map_err(|_| format!("bad line {line:?}"))?;
            let crc = u32::from_str_radix(crc, 16).map_err(|_| format!("bad line {line:?}"))?;
            model.insert(p.to_string(), Name::durable(Known::File(len, crc)));
        }
        ["M", from, to] => {
            let src = name(model, from);
            moves.insert((from.to_string(), to.to_string()), src);
            start_op(model, from);
            start_op(model, to);
        }
        ["D", "moved", from, to] => {
            let src = moves
                .remove(&(from.to_string(), to.to_string()))
                .ok_or_else(|| format!("{line:?} without its M line"))?;
            if src.uncertain {
                // What moved was not known durable: the target is as uncertain.
                if let Some(n) = model.get_mut(*to) {
                    n.uncertain = true;
                }
            } else {
                model.insert(to.to_string(), Name::durable(src.known));
            }
            model.insert(from.to_string(), Name::durable(Known::Absent));
        }
        ["E", ..] | ["I", ..] => {}
        _ => return Err(format!("unknown line {line:?}")),
    }
    Ok(())
}

/// The last lines that named each path, for the failure message.
type History = BTreeMap<String, Vec<String>>;

fn remember(history: &mut History, round: u32, line: &str) {
    for p in line.split(' ').filter(|w| w.contains('/')) {
        let h = history.entry(p.to_owned()).or_default();
        if h.len() >= 12 {
            h.remove(0);
        }
        h.push(format!("round {round}: {line}"));
    }
}

/// Checks the cluster against the model; returns how many names were checked.
fn check(fs: &Cluster, model: &BTreeMap<String, Name>, history: &History, round: u32) -> usize {
    let mut checked = 0;
    for (path, n) in model {
        if n.uncertain {
            continue;
        }
        checked += 1;
        let mut dir = InodeId::ROOT;
        let parts: Vec<&str> = path.split('/').collect();
        for p in &parts[..parts.len() - 1] {
            dir = fs.lookup(dir, p.as_bytes()).unwrap().ino;
        }
        let last = parts[parts.len() - 1];
        let found = fs.lookup(dir, last.as_bytes());
        match (&n.known, found) {
            (Known::Absent, Err(FsError::NotFound)) => {}
            (Known::Dir, Ok(a)) if a.kind == FileType::Directory => {}
            (Known::File(len, crc), Ok(a)) if a.kind == FileType::Regular => {
                let data = read_all(fs, a.ino).unwrap();
                let got = (data.len() as u64, crc32c::crc32c(&data));
                if got != (*len, *crc) {
                    // Whose content it is, as far as the histories tell: the
                    // lines of every path that wrote exactly these bytes.
                    let tail = format!(" {} {:08x}", got.0, got.1);
                    let whose: Vec<&String> = history
                        .values()
                        .flatten()
                        .filter(|l| l.contains(": D file ") && l.ends_with(&tail))
                        .collect();
                    panic!(
                        "round {round}: {path} (inode {}) has other content than its last fsync \
                         acknowledged: {got:?} where {:?} was; its history: {:#?}; lines that \
                         wrote the content found: {whose:#?}",
                        a.ino,
                        (*len, *crc),
                        history.get(path)
                    );
                }
            }
            (want, got) => panic!(
                "round {round}: {path} should be {want:?} (durably acknowledged), found {got:?}; \
                 its history: {:#?}",
                history.get(path)
            ),
        }
    }
    // Nothing appears that no client made.
    for id in 0..CLIENTS {
        for d in [format!("c{id}"), format!("r{id}")] {
            let ino = fs.lookup(InodeId::ROOT, d.as_bytes()).unwrap().ino;
            let mut after: Option<Vec<u8>> = None;
            loop {
                let page = fs.readdir(ino, after.as_deref(), 64).unwrap();
                let Some(last) = page.last() else { break };
                after = Some(last.name.clone());
                for e in page {
                    let path = format!("{d}/{}", String::from_utf8_lossy(&e.name));
                    assert!(
                        model.contains_key(&path),
                        "round {round}: {path} exists, and no client ever made it"
                    );
                }
            }
        }
    }
    checked
}

fn setup(c: &ClusterProcs) {
    let fs = c.client();
    for id in 0..CLIENTS {
        // Under the root, a bigdir, new directories are bigdirs too.
        fs.mkdir(InodeId::ROOT, format!("c{id}").as_bytes(), 0o755, 0, 0).unwrap();
        let r = fs.mkdir(InodeId::ROOT, format!("r{id}").as_bytes(), 0o755, 0, 0).unwrap();
        fs.setxattr(r.ino, b"user.pfs.dir_layout", b"regular", XattrSetMode::Any).unwrap();
        fs.fsyncdir(r.ino, pfs_core::FileHandle(0), false).unwrap();
    }
    fs.fsyncdir(InodeId::ROOT, pfs_core::FileHandle(0), false).unwrap();
}

fn main() {
    if let Ok(role) = std::env::var(CHILD_ROLE) {
        let f: Vec<&str> = role.split(':').collect();
        match f.as_slice() {
            ["soak", id, seed] => child_soak(id.parse().unwrap(), seed.parse().unwrap()),
            _ => panic!("unknown child role {role}"),
        }
        return;
    }
    let rounds: u32 =
        std::env::var("PFS_SOAK_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let seed: u64 = std::env::var("PFS_SOAK_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    println!("soak: {rounds} rounds, seed {seed} (PFS_SOAK_SEED={seed} replays the choices)");
    let dir = common::test_dir("soak");
    // Server 1 at the smallest sizes: its pages are evicted, written back
    // and read again all the time, and its device queue is full.
    let sizing = |n| if n == 1 { Sizing::SMALL } else { Sizing::DEFAULT };
    let mut c = ClusterProcs::start_sized(&dir, SERVERS, WORKERS, sizing);
    setup(&c);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model: BTreeMap<String, Name> = BTreeMap::new();
    let mut history = History::new();
    let (mut durable_ops, mut checked_total, mut kills) = (0u64, 0usize, 0u32);
    // Hard links made and removed durably (`Worker::link`).
    let mut links = 0u64;
    let mut fsck_notes = 0usize;
    let mut lost_creates: BTreeSet<pfs_core::InodeId> = BTreeSet::new();
    let started = Instant::now();
    for round in 1..=rounds {
        let kids: Vec<_> = (0..CLIENTS)
            .map(|id| spawn_child(&c, &format!("soak:{id}:{}", rng.gen::<u32>())))
            .collect();
        // The first second after the servers' restart, renames wait for
        // the token grace (docs/cluster.md, "Dentry cache and tokens").
        let run_for = Duration::from_millis(rng.gen_range(1300..3500));
        std::thread::sleep(run_for);
        let victims: BTreeSet<usize> = match rng.gen_range(0..4) {
            0 => (0..SERVERS as usize).collect(),
            _ => [rng.gen_range(0..SERVERS as usize)].into(),
        };
        for &v in &victims {
            c.kill_server(v);
            kills += 1;
        }
        for (child, _) in &kids {
            kill(child);
        }
        for (mut child, rx) in kids {
            child.wait().unwrap();
            let mut moves = BTreeMap::new();
            for line in rx.iter() {
                if line.starts_with("D ") {
                    durable_ops += 1;
                }
                if line.starts_with("D absent ") && line.ends_with(".l") {
                    links += 1;
                }
                remember(&mut history, round, &line);
                apply(&mut model, &mut moves, &line)
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
            }
        }
        for &v in &victims {
            c.servers[v] = Some(c.spawn_server(v as u32, &[]));
        }
        c.wait_registered(SERVERS);
        let fs = c.client();
        let checked = check(&fs, &model, &history, round);
        checked_total += checked;
        drop(fs);
        // The shards' own consistency: stop every server and run pfs fsck.
        c.stop_servers();
        let configs: Vec<_> = (0..SERVERS).map(|n| c.server_config(n)).collect();
        // Every operation spanning shards finishes on the servers (follow-ups,
        // docs/cluster.md), so fsck must find nothing: not even what it could
        // repair. What is still in flight (an intent, a follow-up not yet
        // applied) it counts as done and notes. One thing a crash leaves that
        // only the servers' sweep frees: data a client wrote on other shards
        // for a file whose create its home lost, so only for files whose home
        // server was killed. The last round checks that the sweep freed it all.
        let report = fsck_report(&configs, round);
        for line in report.lines().filter(|l| l.starts_with("problem:")) {
            let Some(ino) = orphan_data_inode(line) else {
                panic!("round {round}: pfs fsck found problems:\n{report}")
            };
            let home_server = ino.shard().map_or(0, |s| s.0 / WORKERS) as usize;
            if victims.contains(&home_server) {
                lost_creates.insert(ino);
            } else if !lost_creates.contains(&ino) {
                panic!("round {round}: data of inode {ino} outlived it:\n{report}");
            }
        }
        let in_flight = report.lines().filter(|l| l.starts_with("note:")).count();
        fsck_notes += in_flight;
        for n in 0..SERVERS {
            c.servers[n as usize] = Some(c.spawn_server(n, &[]));
        }
        c.wait_registered(SERVERS);
        // The master may still list the old processes: a client that connects
        // to every server proves the new ones listen (and handle SIGTERM).
        drop(c.client());
        println!(
            "soak round {round}: killed server(s) {victims:?} after {run_for:?}; \
             {checked} durable names intact; pfs fsck clean ({in_flight} notes of work in flight)"
        );
    }
    // The sweep frees what lost creates left (it looks every 2 s).
    std::thread::sleep(Duration::from_secs(6));
    c.stop_servers();
    let configs: Vec<_> = (0..SERVERS).map(|n| c.server_config(n)).collect();
    let report = fsck_report(&configs, rounds + 1);
    assert!(
        !report.contains("problem:"),
        "after the last round the sweep should have freed the data of lost creates \
         ({} files):\n{report}",
        lost_creates.len()
    );
    c.stop();
    for n in 0..SERVERS {
        let log = std::fs::read_to_string(dir.join(format!("server-{n}.log"))).unwrap_or_default();
        let (stops, waits) = serving_waits(&log);
        println!(
            "soak: server {n} ({} MiB log, {} Icache blocks, device queue {}): while serving, its \
             workers waited for the device {waits} times over {stops} stops that were not kills",
            sizing(n).wal_size_bytes >> 20,
            sizing(n).icache_blocks,
            sizing(n).io_queue_depth,
        );
    }
    if std::env::var_os("PFS_SOAK_KEEP").is_some() {
        println!("soak: kept {} (PFS_SOAK_KEEP)", dir.display());
        // The directory removes itself when dropped.
        std::mem::forget(dir);
    }
    assert!(links > 0, "no hard link was made and removed in {rounds} rounds");
    println!(
        "soak: {rounds} rounds, {kills} server kills, {durable_ops} durable operations \
         acknowledged ({links} hard links made and removed), {checked_total} name checks, 0 \
         lost, in {:?}; pfs fsck clean after every round ({fsck_notes} notes of work in \
         flight, data of {} lost creates swept)",
        started.elapsed(),
        lost_creates.len()
    );
}

/// From a server's log: how many times a worker stopped (not killed) and
/// logged how often it waited for the device while serving, and the sum.
fn serving_waits(log: &str) -> (usize, u64) {
    const AT: &str = "while serving, waited for the device ";
    let waits: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split_once(AT))
        .filter_map(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .collect();
    (waits.len(), waits.iter().sum())
}

/// Runs `pfs fsck` (no repairs) on the stopped servers; its report.
fn fsck_report(configs: &[pfs_core::ServerConfig], round: u32) -> String {
    let mut report = Vec::new();
    pfs_server::fsck::run(configs, false, &mut report)
        .unwrap_or_else(|e| panic!("round {round}: pfs fsck: {e}"));
    String::from_utf8_lossy(&report).into_owned()
}

/// The inode of a `N data pages of inode X, which does not exist` problem.
fn orphan_data_inode(line: &str) -> Option<pfs_core::InodeId> {
    let rest = line.split(" data pages of inode ").nth(1)?;
    let ino = rest.strip_suffix(", which does not exist")?;
    Some(pfs_core::InodeId(ino.parse().ok()?))
}
