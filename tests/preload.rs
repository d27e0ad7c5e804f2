//! libpfs_preload with real programs: `pfs up` starts a cluster and its FUSE
//! mount; programs run with `LD_PRELOAD=libpfs_preload.so` on a `PFS_MOUNT`
//! path, and what they did is checked through the FUSE mount of the same
//! cluster (or against the mount's own answers, for errors).
//!
//! The library is built by `cargo test --workspace` (pfs-preload's own tests
//! make cargo build it into `target/debug/deps/`).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{up, PFS};

/// The shared library `cargo test --workspace` built (in `deps/`, beside this
/// test's executable; pfs-preload's own tests make cargo build it).
fn library() -> PathBuf {
    let lib = std::env::current_exe().unwrap().with_file_name("libpfs_preload.so");
    assert!(
        lib.exists(),
        "{} is missing: `cargo test` builds it (pfs-preload is a dev-dependency of pfs)",
        lib.display()
    );
    lib
}

/// A running `pfs up` and the environment that points the library at it.
struct Cluster {
    child: std::process::Child,
    _dir: TempDir,
    /// The FUSE mount.
    mnt: PathBuf,
    /// `PFS_MOUNT` for the library: a directory that does not exist here, so
    /// only the library can serve it.
    pfs: PathBuf,
    master: String,
    key: PathBuf,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("pfs-preload-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (data, mnt) = (dir.join("data"), dir.join("mnt"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&mnt).unwrap();
        let (child, master) = up(&data, &mnt);
        Cluster {
            child,
            mnt,
            pfs: dir.join("pfs"),
            master,
            key: data.join("cluster.key"),
            _dir: TempDir(dir),
        }
    }

    /// `program` with the library pointed at this cluster on `mount`.
    fn command(&self, mount: &Path, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("LD_PRELOAD", library())
            .env("PFS_MASTER", &self.master)
            .env("PFS_KEY", &self.key)
            .env("PFS_MOUNT", mount);
        c
    }

    /// `program args` with the library on `mount` (`PFS_MOUNT`).
    fn run_on(&self, mount: &Path, program: &str, args: &[&str]) -> Output {
        let out = self
            .command(mount, program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        println!("$ {program} {}", args.join(" "));
        println!("{}", String::from_utf8_lossy(&out.stdout));
        eprintln!("{}", String::from_utf8_lossy(&out.stderr));
        out
    }

    /// `program args` with the library on [`Cluster::pfs`]; must succeed.
    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self.run_on(&self.pfs, program, args);
        assert!(out.status.success(), "{program} {args:?} failed: {:?}", out.status);
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs Python `script` through the library with the pfs directory as its
    /// argument; its standard output.
    fn python(&self, script: &str) -> String {
        self.run("python3", &["-c", script, self.pfs.to_str().unwrap()])
    }

    /// Compiles the C program `source` (with `cc`) into the test's directory.
    fn compile(&self, name: &str, source: &str) -> PathBuf {
        let src = self._dir.0.join(format!("{name}.c"));
        let exe = self._dir.0.join(name);
        std::fs::write(&src, source).unwrap();
        let cc = Command::new("cc").arg("-O1").arg("-o").arg(&exe).arg(&src).output();
        let cc = cc.expect("cc (gcc) is needed: .ci/run installs it");
        assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
        exe
    }

    /// `program args DIR` run twice on the FUSE mount, first alone (DIR =
    /// `m`) and then through the library on the same cluster (`PFS_MOUNT` is
    /// the mount point, so every path under it is the library's; DIR = `l`);
    /// both must succeed. Their standard outputs: the mount's, the library's.
    fn mount_and_library(&self, program: &str, args: &[&str]) -> (String, String) {
        let (m_dir, l_dir) = (self.mnt.join("m"), self.mnt.join("l"));
        std::fs::create_dir_all(&m_dir).unwrap();
        std::fs::create_dir_all(&l_dir).unwrap();
        let mount = Command::new(program).args(args).arg(&m_dir).output().unwrap();
        assert!(mount.status.success(), "{}", String::from_utf8_lossy(&mount.stderr));
        let lib_args: Vec<&str> = args.iter().copied().chain([l_dir.to_str().unwrap()]).collect();
        let lib = self.run_on(&self.mnt, program, &lib_args);
        assert!(lib.status.success(), "{program} through the library failed");
        let m = String::from_utf8_lossy(&mount.stdout).into_owned();
        println!("mount:\n{m}");
        (m, String::from_utf8_lossy(&lib.stdout).into_owned())
    }

    /// A path under the library's mount.
    fn p(&self, rel: &str) -> String {
        self.pfs.join(rel).to_str().unwrap().to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: signals the child this test started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

fn diff(a: &Path, b: &Path) {
    let out =
        Command::new("diff").arg("-r").arg("--no-dereference").arg(a).arg(b).output().unwrap();
    assert!(
        out.status.success(),
        "diff -r {} {}:\n{}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn coreutils_reach_the_cluster_without_the_kernel() {
    let c = Cluster::start("coreutils");
    let src = c._dir.0.join("src.bin");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();

    c.run("mkdir", &["-p", &c.p("a/b/c")]);
    c.run("cp", &[src.to_str().unwrap(), &c.p("a/b/copy.bin")]);
    assert_eq!(std::fs::read(c.mnt.join("a/b/copy.bin")).unwrap(), data, "cp wrote the file");
    let dd_in = format!("if={}", c.p("a/b/copy.bin"));
    let dd_out = format!("of={}", c.p("a/dd.bin"));
    c.run("dd", &[&dd_in, &dd_out, "bs=64k", "status=none"]);
    assert_eq!(std::fs::read(c.mnt.join("a/dd.bin")).unwrap(), data, "dd copied the file");
    let cat = c.command(&c.pfs, "cat").arg(c.p("a/dd.bin")).output().unwrap();
    assert!(cat.status.success());
    assert_eq!(cat.stdout, data, "cat read the file");
    c.run("mv", &[&c.p("a/dd.bin"), &c.p("a/b/c/moved.bin")]);
    // (Not checked through the mount: its kernel may keep the old name for its
    // entry lifetime.)
    assert_eq!(c.run("ls", &[&c.p("a")]).split_whitespace().collect::<Vec<_>>(), ["b"]);
    assert_eq!(std::fs::metadata(c.mnt.join("a/b/c/moved.bin")).unwrap().len(), data.len() as u64);
    c.run("ln", &["-s", "c/moved.bin", &c.p("a/b/link")]);
    assert_eq!(std::fs::read_link(c.mnt.join("a/b/link")).unwrap(), Path::new("c/moved.bin"));
    assert_eq!(
        c.run("stat", &["-L", "-c", "%s %F", &c.p("a/b/link")]).trim(),
        "3000000 regular file"
    );
    let ls = c.run("ls", &["-1", &c.p("a/b")]);
    assert_eq!(ls.lines().collect::<Vec<_>>(), ["c", "copy.bin", "link"]);
    c.run("rm", &["-r", &c.p("a/b/c")]);
    assert_eq!(
        c.run("ls", &[&c.p("a/b")]).split_whitespace().collect::<Vec<_>>(),
        ["copy.bin", "link"]
    );
    // A process started inside the mount point works with relative paths.
    let script = "cd \"$1\" && mkdir rel && echo hi > rel/f && cat rel/f && pwd";
    let rel = c.command(&c.pfs, "sh").args(["-c", script, "sh", &c.p("a")]).output().unwrap();
    let out = String::from_utf8_lossy(&rel.stdout);
    assert!(rel.status.success(), "{}", String::from_utf8_lossy(&rel.stderr));
    assert_eq!(out.lines().collect::<Vec<_>>(), ["hi", &c.p("a")]);
    assert_eq!(std::fs::read(c.mnt.join("a/rel/f")).unwrap(), b"hi\n");
    // Redirections: the shell opens the pfs file, and the program it execs
    // (seq, wc) gets the descriptor and the working directory.
    let out = c.run(
        "sh",
        &[
            "-c",
            "cd \"$1\" && seq 1 1000 > seq.txt && seq 1001 1200 >> seq.txt && wc -l < seq.txt",
            "sh",
            &c.p("a"),
        ],
    );
    assert_eq!(out.trim(), "1200");
    let seq = std::fs::read_to_string(c.mnt.join("a/seq.txt")).unwrap();
    assert_eq!(seq.lines().count(), 1200);
    assert_eq!(seq.lines().last(), Some("1200"));
    // `cp -a` keeps modes: it sets each copy's access ACL, which the servers
    // turn into the mode (docs/posix.md "extended attributes").
    let tree = c._dir.0.join("modes");
    std::fs::create_dir_all(tree.join("d750")).unwrap();
    for (f, mode) in [("f644", 0o644), ("f755", 0o755), ("d750/f640", 0o640)] {
        std::fs::write(tree.join(f), f).unwrap();
        std::fs::set_permissions(tree.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(tree.join("d750"), std::fs::Permissions::from_mode(0o750)).unwrap();
    c.run("cp", &["-a", tree.to_str().unwrap(), &c.p("a/modes")]);
    for (f, mode) in [("f644", 0o644), ("f755", 0o755), ("d750", 0o750), ("d750/f640", 0o640)] {
        let got = std::fs::metadata(c.mnt.join("a/modes").join(f)).unwrap().permissions().mode();
        assert_eq!(got & 0o7777, mode, "{f}: {got:o}");
    }
}

#[test]
fn tar_trees_match_through_the_mount() {
    let c = Cluster::start("tar");
    // A tree with files of many sizes, a symbolic link and a hard link.
    let src = c._dir.0.join("tree");
    for d in 0..6 {
        let dir = src.join(format!("d{d}/sub"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..12usize {
            let len = (f * f * 997 + d * 13) % 200_000;
            let body: Vec<u8> = (0..len).map(|i| (i * 31 + f + d) as u8).collect();
            std::fs::write(dir.join(format!("f{f}")), body).unwrap();
        }
    }
    std::os::unix::fs::symlink("d0/sub/f3", src.join("link")).unwrap();
    std::fs::hard_link(src.join("d1/sub/f5"), src.join("hard")).unwrap();
    let tarball = c._dir.0.join("tree.tar");
    let ok =
        Command::new("tar").arg("-C").arg(&src).arg("-cf").arg(&tarball).arg(".").status().unwrap();
    assert!(ok.success());

    c.run("mkdir", &[&c.p("x")]);
    c.run("tar", &["-C", &c.p("x"), "-xf", tarball.to_str().unwrap()]);
    diff(&src, &c.mnt.join("x"));
    let hard = std::fs::metadata(c.mnt.join("x/hard")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&hard), 2, "tar made the hard link");

    // And back: tar reads the tree through the library.
    let back = c._dir.0.join("back.tar");
    c.run("tar", &["-C", &c.p("x"), "-cf", back.to_str().unwrap(), "."]);
    let out = c._dir.0.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let ok = Command::new("tar").arg("-C").arg(&out).arg("-xf").arg(&back).status().unwrap();
    assert!(ok.success());
    diff(&src, &out);
}

const PYTHON_FILES: &str = r#"
import os, sys
root = sys.argv[1]
os.makedirs(os.path.join(root, 'py/a'), exist_ok=True)
with open(os.path.join(root, 'py/a/f.txt'), 'w') as f:
    f.write('x' * 10000)
assert os.listdir(os.path.join(root, 'py/a')) == ['f.txt']
os.rename(os.path.join(root, 'py/a/f.txt'), os.path.join(root, 'py/g.txt'))
assert sorted(os.listdir(os.path.join(root, 'py'))) == ['a', 'g.txt']
assert os.stat(os.path.join(root, 'py/g.txt')).st_size == 10000
with open(os.path.join(root, 'py/g.txt'), 'rb') as f:
    f.seek(9990)
    assert f.read() == b'x' * 10
with open(os.path.join(root, 'py/g.txt'), 'a') as f:
    f.write('tail')
os.chdir(os.path.join(root, 'py'))
assert os.getcwd() == os.path.join(root, 'py')
assert open('g.txt').read().endswith('xtail')
os.symlink('g.txt', 'l')
assert os.path.realpath('l') == os.path.join(root, 'py/g.txt')
import mmap
with open('g.txt', 'r+b') as f:
    m = mmap.mmap(f.fileno(), 0)
    assert m[:3] == b'xxx'
    m[0:3] = b'abc'
    m.flush()
    m.close()
assert open('g.txt', 'rb').read(4) == b'abcx'
with open('eof', 'w') as f:
    f.write('ab')
r = open('eof')
assert r.read() == 'ab' and r.read() == ''
with open('eof', 'a') as f:
    f.write('cd')
assert r.read() == 'cd', 'a read at the old end sees what this process appended'
r.close()
fd = os.open('eof', os.O_RDONLY)
os.closerange(fd, fd + 1)
real = os.open('/proc/self/status', os.O_RDONLY)
assert real == fd and os.read(real, 5) == b'Name:', 'a closed pfs number is a kernel file again'
os.close(real)
fd = os.open('forked', os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b'parent1 ')
pid = os.fork()
if pid == 0:
    os.pwrite(fd, b'child ', 8)
    with open('from-child', 'w') as f:
        f.write('child')
    os.close(fd)
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
os.pwrite(fd, b'parent2', 14)
os.close(fd)
fd = os.open('vec', os.O_CREAT | os.O_RDWR, 0o644)
assert os.writev(fd, [b'ab', b'', b'cde']) == 5 and os.pwritev(fd, [b'XY'], 1) == 2
bufs = [bytearray(1), bytearray(3), bytearray(4)]
assert os.preadv(fd, bufs, 0) == 5 and bytes(bufs[0] + bufs[1] + bufs[2][:1]) == b'aXYde'
os.close(fd)
import subprocess
# posix_spawn (close_fds=False) and fork + exec (the default) both hand the pfs
# working directory to the child.
for close in (False, True):
    out = subprocess.run(['cat', 'g.txt'], close_fds=close, capture_output=True)
    assert out.returncode == 0 and out.stdout.startswith(b'abcx'), out
import threading
def worker(t):
    os.makedirs('threads/t%d' % t)
    for i in range(50):
        with open('threads/t%d/f%d' % (t, i), 'wb') as f:
            f.write(bytes([t]) * (i * 97 + 1))
    for i in range(50):
        with open('threads/t%d/f%d' % (t, i), 'rb') as f:
            assert f.read() == bytes([t]) * (i * 97 + 1)
ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
assert sorted(os.listdir('threads')) == ['t0', 't1', 't2', 't3']
assert all(len(os.listdir('threads/t%d' % t)) == 50 for t in range(4))
print('python ok')
"#;

#[test]
fn python_files_dirs_mmap_and_fork() {
    let c = Cluster::start("python");
    let out = c.python(PYTHON_FILES);
    assert_eq!(out.trim(), "python ok");
    let g = std::fs::read(c.mnt.join("py/g.txt")).unwrap();
    assert_eq!(g.len(), 10004);
    assert!(
        g.starts_with(b"abcx") && g.ends_with(b"xtail"),
        "the mmap write and the append reached the file"
    );
    assert_eq!(std::fs::read(c.mnt.join("py/forked")).unwrap(), b"parent1 child parent2");
    assert_eq!(std::fs::read(c.mnt.join("py/from-child")).unwrap(), b"child");
    for t in 0..4u8 {
        let f = std::fs::read(c.mnt.join(format!("py/threads/t{t}/f49"))).unwrap();
        assert_eq!(f, vec![t; 49 * 97 + 1], "thread {t}'s last file");
    }
}

/// A stat phase through the library: `stat` answers come from statahead
/// batches, right, with this process's own removals, renames, writes and
/// chmods in them at once (a write while the file is open for writing too),
/// and another client's changes (the FUSE mount) within the attribute lifetime.
const PYTHON_STATAHEAD: &str = r#"
import os, sys, time
d, other = sys.argv[1] + '/sa', sys.argv[2] + '/sa'
os.mkdir(d)
N = 300
for i in range(N):
    with open(f'{d}/f{i}', 'wb') as f:
        f.write(b'x' * i)
for i in range(N):
    assert os.stat(f'{d}/f{i}').st_size == i, i
def missing(p):
    try:
        os.stat(p)
        return False
    except FileNotFoundError:
        return True
os.unlink(f'{d}/f10')
os.rename(f'{d}/f11', f'{d}/g11')
os.rename(f'{d}/f12', f'{d}/f13')
assert missing(f'{d}/f10'), 'removed here'
assert missing(f'{d}/f11') and missing(f'{d}/f12'), 'renamed here'
assert os.stat(f'{d}/g11').st_size == 11 and os.stat(f'{d}/f13').st_size == 12
assert os.stat(f'{d}/f14').st_size == 14
with open(f'{d}/f15', 'ab', buffering=0) as f:
    f.write(b'xyz')
    assert os.stat(f'{d}/f15').st_size == 18, 'own write, file still open'
assert os.stat(f'{d}/f15').st_size == 18, 'own write'
os.truncate(f'{d}/f17', 5)
assert os.stat(f'{d}/f17').st_size == 5, 'own truncate by path'
os.utime(f'{d}/f18', (1, 7))
assert os.stat(f'{d}/f18').st_mtime == 7, 'own utime'
os.link(f'{d}/f19', f'{d}/h19')
assert os.stat(f'{d}/f19').st_nlink == 2, 'own link'
with open(f'{d}/new', 'wb') as f:
    pass
assert os.stat(f'{d}/new').st_size == 0, 'own create'
with open(f'{d}/new', 'ab') as f:
    f.write(b'four')
assert os.stat(f'{d}/new').st_size == 4, 'own write after an own create'
mode = os.stat(f'{d}/f99').st_mode & 0o777
os.chmod(f'{d}/f16', 0o600)
for i in range(16, 60):
    assert os.stat(f'{d}/f{i}').st_mode & 0o777 == (0o600 if i == 16 else mode), i
os.unlink(f'{other}/f20')
with open(f'{other}/f21', 'wb') as f:
    f.write(b'new')
time.sleep(1.1)
for i in range(20, N):
    p = f'{d}/f{i}'
    if i == 20:
        assert missing(p), 'removed by another client'
    else:
        assert os.stat(p).st_size == (3 if i == 21 else i), i
print('statahead ok')
"#;

/// Per inode: a write to one file leaves the other files' statahead entries
/// in use, and a `stat` of a file this process just created is answered from
/// its create (as the kernel answers from a CREATE reply).
const PYTHON_STATAHEAD_PER_INODE: &str = r#"
import os, sys
d = sys.argv[1] + '/pi'
os.mkdir(d)
N = 400
for i in range(N):
    with open(f'{d}/f{i}', 'wb') as f:
        f.write(b'x' * i)
for i in range(N):
    assert os.stat(f'{d}/f{i}').st_size == i, i
# Each stat after a write to another file: answered from the batches.
for i in range(1, N):
    with open(f'{d}/f0', 'ab') as f:
        f.write(b'y')
    assert os.stat(f'{d}/f{i}').st_size == i, i
assert os.stat(f'{d}/f0').st_size == N - 1
# Own creates, stat'ed at once: answered from the creates.
for i in range(200):
    with open(f'{d}/n{i}', 'wb') as f:
        pass
    assert os.stat(f'{d}/n{i}').st_size == 0
print('per inode ok')
"#;

/// Runs Python `script` through the library with `PFS_PRELOAD_STATS`, checks
/// that it printed `done`, and returns its standard error (the stats line).
fn python_stats(c: &Cluster, script: &str, args: &[&str], done: &str) -> String {
    let out = c
        .command(&c.pfs, "python3")
        .env("PFS_PRELOAD_STATS", "1")
        .args(["-c", script])
        .args(args)
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == done, "{stdout}\n{stderr}");
    stderr.into_owned()
}

/// [`python_stats`], and how many `stat`s statahead answered (from the
/// library's stats line) with that line for messages.
fn statahead_answered(c: &Cluster, script: &str, args: &[&str], done: &str) -> (u64, String) {
    let stderr = python_stats(c, script, args, done);
    let answered =
        stderr.split(", statahead ").nth(1).and_then(|s| s.split(' ').next()?.parse::<u64>().ok());
    (answered.unwrap_or_else(|| panic!("no statahead count: {stderr}")), stderr)
}

#[test]
fn statahead_keeps_other_files_entries_and_answers_own_creates() {
    let c = Cluster::start("statahead-ino");
    let args = [c.pfs.to_str().unwrap()];
    let (answered, stderr) =
        statahead_answered(&c, PYTHON_STATAHEAD_PER_INODE, &args, "per inode ok");
    // The second pass (399 stats, each after a write to f0) and the 200
    // creates: with entries dropped at every change, none of them would be.
    assert!(answered >= 500, "answered {answered}: {stderr}");
}

#[test]
fn stat_through_statahead_follows_changes() {
    let c = Cluster::start("statahead");
    let args = [c.pfs.to_str().unwrap(), c.mnt.to_str().unwrap()];
    let (answered, stderr) = statahead_answered(&c, PYTHON_STATAHEAD, &args, "statahead ok");
    // Most of the first pass's stats came from the batches.
    assert!(answered >= 200, "answered {answered}: {stderr}");
}

/// A directory another client (the FUSE mount) removes, or renames away, and
/// makes again while this process has its name cached, used here at once:
/// mdtest's iterations, or a job whose first rank clears its output
/// directory before a barrier. Names must lead to the new directory, and
/// unlink, rename and stat too.
const PYTHON_MADE_AGAIN: &str = r#"
import os, sys
pfs, mnt = sys.argv[1], sys.argv[2]
os.mkdir(f'{mnt}/again')
for r in range(20):
    a, b = f'{mnt}/again/out', f'{pfs}/again/out'
    os.mkdir(a)
    with open(f'{a}/x', 'wb') as f:
        f.write(b'x')
    with open(f'{b}/x', 'rb') as f:
        assert f.read() == b'x', r
    if r % 2 == 0:
        os.unlink(f'{a}/x')
        os.rmdir(a)
    else:
        # Renamed away: the old directory lives on (empty at the end).
        os.rename(a, f'{a}.{r}')
        os.unlink(f'{a}.{r}/x')
    os.mkdir(a)
    for n in ('y', 'z', 'u'):
        with open(f'{a}/{n}', 'wb') as f:
            f.write(n.encode())
    step = r % 5
    if step == 0:
        with open(f'{b}/f', 'wb') as f:
            f.write(b'f')
        with open(f'{a}/f', 'rb') as f:
            assert f.read() == b'f', r
    elif step == 1:
        with open(f'{b}/y', 'rb') as f:
            assert f.read() == b'y', r
    elif step == 2:
        os.mkdir(f'{b}/sub')
        assert os.path.isdir(f'{a}/sub'), r
    elif step == 3:
        os.unlink(f'{b}/z')
        assert not os.path.exists(f'{a}/z'), r
    else:
        os.rename(f'{b}/u', f'{b}/v')
        assert os.path.exists(f'{a}/v'), r
    assert os.stat(f'{b}/y').st_size == 1, r
    for n in os.listdir(a):
        p = f'{a}/{n}'
        os.rmdir(p) if os.path.isdir(p) else os.unlink(p)
    os.rmdir(a)
    if r % 2 == 1:
        assert os.listdir(f'{a}.{r}') == [], (r, os.listdir(f'{a}.{r}'))
        os.rmdir(f'{a}.{r}')
print('made again ok')
"#;

#[test]
fn a_directory_made_again_by_another_client_is_found_at_once() {
    let c = Cluster::start("made-again");
    let args = [c.pfs.to_str().unwrap(), c.mnt.to_str().unwrap()];
    python_stats(&c, PYTHON_MADE_AGAIN, &args, "made again ok");
}

/// Files created and closed without a write: a `stat` of each right after is
/// answered from its create (the close changed nothing); one written before
/// its close is not (its size is the written one).
const PYTHON_OWN_CREATES: &str = r#"
import os, sys
d = sys.argv[1] + '/own'
os.mkdir(d)
for i in range(300):
    with open(f'{d}/e{i}', 'wb') as f:
        pass
    assert os.stat(f'{d}/e{i}').st_size == 0, i
with open(f'{d}/w', 'wb') as f:
    f.write(b'abc')
assert os.stat(f'{d}/w').st_size == 3
fd = os.open(f'{d}/t', os.O_CREAT | os.O_WRONLY, 0o644)
os.ftruncate(fd, 9)
os.close(fd)
assert os.stat(f'{d}/t').st_size == 9
print('own creates ok')
"#;

#[test]
fn files_closed_without_writes_are_answered_from_their_create() {
    let c = Cluster::start("statahead-own");
    let args = [c.pfs.to_str().unwrap()];
    let (answered, stderr) = statahead_answered(&c, PYTHON_OWN_CREATES, &args, "own creates ok");
    // Each close used to count as a change: no stat was answered.
    assert!(answered >= 300, "answered {answered}: {stderr}");
}

/// Small files written through the mount (argv[2]), read through the library
/// (argv[1]): each open for reading brings the file's bytes with its lookup,
/// and its first read (whole, at an offset, past the end) is answered from
/// them; a change through this process between the open and the read is
/// seen, and so is another client's change closed before the open. An
/// `fstat` soon after the open is answered from its lookup, unless this
/// process changed the file or a name since.
const PYTHON_SMALL_READS: &str = r#"
import os, sys
lib, mnt = sys.argv[1] + '/small', sys.argv[2] + '/small'
os.mkdir(mnt)
def body(i, gen=0):
    return (f'{gen}:{i}:'.encode() * 600)[:3901 - i]
for i in range(200):
    with open(f'{mnt}/f{i}', 'wb') as f:
        f.write(body(i))
for i in range(200):
    with open(f'{lib}/f{i}', 'rb') as f:
        assert f.read() == body(i), i
fd = os.open(f'{lib}/f7', os.O_RDONLY)
assert os.pread(fd, 10, 100) == body(7)[100:110]
os.close(fd)
fd = os.open(f'{lib}/f8', os.O_RDONLY)
assert os.pread(fd, 10, 5000) == b''
os.close(fd)
# Changed through this process after the open: the first read sees it.
fd = os.open(f'{lib}/f9', os.O_RDONLY)
with open(f'{lib}/f9', 'wb') as f:
    f.write(body(9, 1))
assert os.read(fd, 8192) == body(9, 1)
os.close(fd)
# Changed through the mount (another client) and closed before the open.
with open(f'{mnt}/f10', 'wb') as f:
    f.write(body(10, 2))
with open(f'{lib}/f10', 'rb') as f:
    assert f.read() == body(10, 2)
# fstat soon after the open answers from its lookup: changes through this
# process since are seen.
os.link(f'{lib}/f11', f'{lib}/f11b')
fd = os.open(f'{lib}/f11', os.O_RDONLY)
assert os.fstat(fd).st_nlink == 2
os.unlink(f'{lib}/f11b')
assert os.fstat(fd).st_nlink == 1
os.chmod(f'{lib}/f11', 0o600)
assert os.fstat(fd).st_mode & 0o777 == 0o600
os.close(fd)
print('small reads ok')
"#;

#[test]
fn small_files_are_read_with_their_lookup() {
    let c = Cluster::start("small-reads");
    let args = [c.pfs.to_str().unwrap(), c.mnt.to_str().unwrap()];
    let stderr = python_stats(&c, PYTHON_SMALL_READS, &args, "small reads ok");
    let count = |after: &str| -> u64 {
        let n = stderr.split(after).next().and_then(|s| s.rsplit(' ').next());
        n.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no {after:?} in {stderr}"))
    };
    let (read, sent) =
        (count(" small files read with their lookup"), count(" requests to the servers"));
    // Of the 200 reads, f7, f8 and f10 (f9's was changed after its open):
    // those whose server still held the bytes in memory, nearly all (202 of
    // 203 in one run of the suite).
    assert!(read >= 180, "{read} read with their lookup: {stderr}");
    // A lookup and a read each without it: 400 and more.
    assert!(sent < 300, "{sent} requests: {stderr}");
}

/// A file unlinked while this process has it open stays readable and
/// writable through the open descriptor, out of listings, until its last
/// close; a file unlinked while another file is open goes at once.
const PYTHON_UNLINK_OPEN: &str = r#"
import os, sys
d = sys.argv[1] + '/uo'
os.mkdir(d)
keep = os.open(f'{d}/keep', os.O_CREAT | os.O_RDWR, 0o644)
os.write(keep, b'kept')
with open(f'{d}/plain', 'wb') as f:
    f.write(b'x')
os.unlink(f'{d}/plain')
assert not os.path.exists(f'{d}/plain')
fd = os.open(f'{d}/gone', os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b'hello')
os.unlink(f'{d}/gone')
assert sorted(os.listdir(d)) == ['keep'], os.listdir(d)
assert os.pread(fd, 5, 0) == b'hello'
os.pwrite(fd, b'J', 0)
assert os.pread(fd, 5, 0) == b'Jello' and os.fstat(fd).st_size == 5
os.close(fd)
assert sorted(os.listdir(d)) == ['keep'], os.listdir(d)
os.close(keep)
print('unlink open ok')
"#;

#[test]
fn a_file_unlinked_while_open_stays_readable_until_its_close() {
    let c = Cluster::start("unlink-open");
    let out = c.python(PYTHON_UNLINK_OPEN);
    assert_eq!(out.trim(), "unlink open ok");
    // Through the mount: no hidden name left behind.
    let names: Vec<_> = std::fs::read_dir(c.mnt.join("uo"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names, vec!["keep".to_string()]);
}

/// Python as root creates files and a directory after `setegid`/`seteuid`,
/// then again after switching back: each gets the effective ids of its
/// moment (the library keeps them between calls and reads them again after
/// any `set*id`).
const PYTHON_IDS: &str = r#"
import os, sys
d = sys.argv[1] + '/ids'
os.mkdir(d)
os.chmod(d, 0o777)
def make(name):
    os.close(os.open(d + '/' + name, os.O_CREAT | os.O_WRONLY, 0o644))
    os.mkdir(d + '/' + name + '.d')
make('root-before')
os.setegid(1234)
os.seteuid(4321)
make('user')
os.seteuid(0)
os.setegid(0)
make('root-after')
os.setresgid(0, 77, 0)
os.setresuid(0, 88, 0)
make('resid')
os.setresuid(0, 0, 0)
os.setresgid(0, 0, 0)
for n in ('root-before', 'user', 'root-after', 'resid'):
    for m in (n, n + '.d'):
        st = os.stat(d + '/' + m)
        print(m, st.st_uid, st.st_gid)
"#;

#[test]
fn new_files_get_the_effective_ids_of_their_moment() {
    let c = Cluster::start("ids");
    let out = c.python(PYTHON_IDS);
    let want =
        [("root-before", 0, 0), ("user", 4321, 1234), ("root-after", 0, 0), ("resid", 88, 77)];
    let mut lines = out.lines();
    for (name, uid, gid) in want {
        for m in [name.to_string(), format!("{name}.d")] {
            assert_eq!(lines.next(), Some(format!("{m} {uid} {gid}").as_str()), "{out}");
            // The same through the kernel's mount of the cluster.
            let meta = std::fs::metadata(c.mnt.join("ids").join(&m)).unwrap();
            use std::os::unix::fs::MetadataExt;
            assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{m} through the mount");
        }
    }
}

/// A C program on libc's own entry points (stdio, `freopen` of `stdout`,
/// directory streams, `mmap`, `statvfs`, `*at` calls relative to a directory
/// descriptor) under the directory in `argv[1]`.
const C_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed at line %d: %s\n", __LINE__, #c); exit(1); } } while (0)
static int no_dots(const struct dirent *e) { return e->d_name[0] != '.'; }
int main(int argc, char **argv) {
    char p[4096];
    CHECK(chdir(argv[1]) == 0);
    FILE *f = fopen("stdio.txt", "w");
    CHECK(f != NULL);
    for (int i = 0; i < 1000; i++) fprintf(f, "line %d\n", i);
    CHECK(fclose(f) == 0);
    f = fopen("stdio.txt", "a+");
    CHECK(f != NULL && fprintf(f, "appended\n") > 0 && fflush(f) == 0);
    rewind(f);
    CHECK(fgets(p, sizeof p, f) && strcmp(p, "line 0\n") == 0);
    CHECK(fclose(f) == 0);
    int dfd = open(".", O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0);
    CHECK(mkdirat(dfd, "sub", 0755) == 0);
    int fd = openat(dfd, "sub/x", O_CREAT | O_WRONLY | O_EXCL, 0600);
    CHECK(fd >= 0 && write(fd, "0123456789", 10) == 10 && close(fd) == 0);
    struct stat st;
    CHECK(fstatat(dfd, "sub/x", &st, 0) == 0 && st.st_size == 10 && (st.st_mode & 0777) == 0600);
    CHECK(renameat(dfd, "sub/x", dfd, "sub/y") == 0 && faccessat(dfd, "sub/y", R_OK, 0) == 0);
    fd = open("sub/y", O_RDONLY);
    char *m = mmap(NULL, 10, PROT_READ, MAP_PRIVATE, fd, 0);
    CHECK(m != MAP_FAILED && memcmp(m, "0123456789", 10) == 0 && munmap(m, 10) == 0);
    FILE *g = fdopen(fd, "r");
    CHECK(g != NULL && fileno(g) == fd && fgetc(g) == '0');
    CHECK(fclose(g) == 0);
    DIR *d = opendir("sub");
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n++;
    CHECK(n == 3 && closedir(d) == 0);
    struct dirent **list;
    n = scandir("sub", &list, NULL, alphasort);
    CHECK(n == 3 && strcmp(list[0]->d_name, ".") == 0 && strcmp(list[2]->d_name, "y") == 0);
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
    CHECK(scandir("sub", &list, no_dots, alphasort) == 1 && strcmp(list[0]->d_name, "y") == 0);
    free(list[0]);
    free(list);
    struct statvfs vfs;
    CHECK(statvfs(".", &vfs) == 0 && vfs.f_blocks > 0);
    CHECK(getcwd(p, sizeof p) != NULL && strcmp(p, argv[1]) == 0);
    pid_t pid;
    char *sh[] = {"sh", "-c", "wc -l < stdio.txt > spawned.txt", NULL};
    CHECK(posix_spawnp(&pid, "sh", NULL, NULL, sh, environ) == 0);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(system("wc -l < stdio.txt > system.txt") == 0);
    CHECK(system("exit 3") == 3 << 8);
    CHECK(freopen("out.txt", "w", stdout) != NULL);
    printf("through freopen %d\n", 42);
    fflush(stdout);
    CHECK(unlinkat(dfd, "sub/y", 0) == 0 && unlinkat(dfd, "sub", AT_REMOVEDIR) == 0);
    fprintf(stderr, "c ok\n");
    return 0;
}
"#;

#[test]
fn a_c_program_on_stdio_dirs_and_at_calls() {
    let c = Cluster::start("c");
    let exe = c.compile("prog", C_PROGRAM);
    c.run("mkdir", &[&c.p("c")]);
    let out = c.run_on(&c.pfs, exe.to_str().unwrap(), &[&c.p("c")]);
    assert!(out.status.success(), "the C program failed");
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "c ok");
    let text = std::fs::read_to_string(c.mnt.join("c/stdio.txt")).unwrap();
    assert_eq!(text.lines().count(), 1001);
    assert!(text.starts_with("line 0\n") && text.ends_with("line 999\nappended\n"));
    assert_eq!(std::fs::read_to_string(c.mnt.join("c/out.txt")).unwrap(), "through freopen 42\n");
    // posix_spawnp handed the pfs working directory to the shell.
    assert_eq!(std::fs::read_to_string(c.mnt.join("c/spawned.txt")).unwrap().trim(), "1001");
    // And so did system(3).
    assert_eq!(std::fs::read_to_string(c.mnt.join("c/system.txt")).unwrap().trim(), "1001");
}

/// Descriptors: a pfs descriptor is, to the kernel, an `O_PATH` descriptor
/// of `/dev/null` (duplicated from one the library keeps), so a raw system
/// call on it fails with `EBADF`; opening and closing leaks none; and a
/// program that closes every descriptor (a loop of `close`, `closefrom`,
/// `close_range`) or `dup2`s its own files onto every low number keeps
/// opening pfs files that are what they should be: the library's links stay
/// open (a `dup2` onto one fails with `EBUSY`). Before, the close loop cut
/// the library's links and the program aborted ("IO Safety violation").
/// (`busy > 0`: the library's links sit at low numbers, so the test sees them.)
const FDS_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "failed at line %d: %s\n", __LINE__, #c); exit(1); } } while (0)
static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}
/* A pfs descriptor reads "hello" through the library and is O_PATH to the kernel. */
static void check_pfs(int fd) {
    char b[8];
    CHECK(fd >= 0 && read(fd, b, 8) == 5 && memcmp(b, "hello", 5) == 0);
    CHECK(syscall(SYS_read, fd, b, 8) == -1 && errno == EBADF);
    CHECK(close(fd) == 0);
}
int main(int argc, char **argv) {
    CHECK(chdir(argv[1]) == 0);
    int fd = open("a", O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && write(fd, "hello", 5) == 5 && close(fd) == 0);
    int base = count_fds();
    for (int i = 0; i < 1000; i++) check_pfs(open("a", O_RDONLY));
    CHECK(count_fds() == base);
    /* A closed pfs descriptor's number is kept for the next pfs open, and
       given back before anything else takes the lowest free number. */
    int n = open("a", O_RDONLY);
    CHECK(n > 2 && close(n) == 0);
    int m = open("a", O_RDONLY);
    CHECK(m == n);
    check_pfs(m);
    int kf = open(argv[2], O_RDONLY);
    CHECK(kf == n && close(kf) == 0);
    /* Close-on-exec is each open's, whatever the kept number had. */
    m = open("a", O_RDONLY | O_CLOEXEC);
    CHECK(fcntl(m, F_GETFD) == FD_CLOEXEC && close(m) == 0);
    m = open("a", O_RDONLY);
    CHECK(fcntl(m, F_GETFD) == 0);
    CHECK(fcntl(m, F_SETFD, FD_CLOEXEC) == 0 && close(m) == 0);
    m = open("a", O_RDONLY);
    CHECK(fcntl(m, F_GETFD) == 0);
    check_pfs(m);
    /* A second close fails as it would have, and the kernel has the number. */
    m = open("a", O_RDONLY);
    CHECK(close(m) == 0);
    CHECK(close(m) == -1 && errno == EBADF);
    int p[2];
    CHECK(pipe(p) == 0 && p[0] == m && close(p[0]) == 0 && close(p[1]) == 0);
    /* dup2 onto a kept number makes it the program's: the next pfs open
       takes another. */
    kf = open(argv[2], O_RDONLY);
    m = open("a", O_RDONLY);
    CHECK(kf >= 0 && m >= 0 && close(m) == 0 && dup2(kf, m) == m);
    int o = open("a", O_RDONLY);
    CHECK(o != m);
    check_pfs(o);
    char kc;
    CHECK(pread(m, &kc, 1, 0) == 1 && kc == 'K' && close(m) == 0 && close(kf) == 0);
    CHECK(count_fds() == base);
    for (int i = 3; i < 1024; i++) close(i);
    check_pfs(open("a", O_RDONLY));
    closefrom(3);
    check_pfs(open("a", O_RDONLY));
    CHECK(close_range(3, ~0U, 0) == 0);
    check_pfs(open("a", O_RDONLY | O_CLOEXEC));
    int k = open(argv[2], O_RDONLY);
    CHECK(k >= 0);
    /* The library's links refuse to be replaced (EBUSY); its template moves. */
    char took[64] = {0};
    int busy = 0;
    for (int i = 3; i < 64; i++) {
        if (i == k) continue;
        int r = dup2(k, i);
        CHECK(r == i || (r == -1 && errno == EBUSY));
        took[i] = r == i;
        busy += r == -1;
    }
    CHECK(busy > 0);
    for (int i = 0; i < 10; i++) check_pfs(open("a", O_RDONLY));
    for (int i = 3; i < 64; i++) {
        char c;
        if (took[i]) CHECK(pread(i, &c, 1, 0) == 1 && c == 'K');
    }
    fprintf(stderr, "fds ok\n");
    return 0;
}
"#;

#[test]
fn descriptors_stay_the_librarys_whatever_the_program_closes() {
    let c = Cluster::start("fds");
    let exe = c.compile("fds", FDS_PROGRAM);
    let kernel_file = c._dir.0.join("kernel-file");
    std::fs::write(&kernel_file, b"K is a kernel file").unwrap();
    c.run("mkdir", &[&c.p("fds")]);
    let out =
        c.run_on(&c.pfs, exe.to_str().unwrap(), &[&c.p("fds"), kernel_file.to_str().unwrap()]);
    assert!(out.status.success(), "the descriptor program failed");
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "fds ok");
    assert_eq!(std::fs::read(c.mnt.join("fds/a")).unwrap(), b"hello");
}

/// Deep paths (23 to 40 components) resolve as shallow ones do: made,
/// written, listed, stat'ed and removed.
#[test]
fn deep_paths_resolve_through_the_library() {
    let c = Cluster::start("deep");
    let script = r#"
import os, sys
d = sys.argv[1]
parts = [f"l{i}" for i in range(40)]
for depth in (23, 24, 25, 40):
    p = os.path.join(d, f"t{depth}", *parts[:depth - 1])
    os.makedirs(p)
    with open(os.path.join(p, "f"), "w") as f:
        f.write(str(depth))
    with open(os.path.join(p, "f")) as f:
        assert f.read() == str(depth)
    assert os.stat(os.path.join(p, "f")).st_size == len(str(depth))
    assert os.listdir(p) == ["f"]
    os.unlink(os.path.join(p, "f"))
    assert not os.path.exists(os.path.join(p, "f"))
    with open(os.path.join(p, "g"), "w") as f:
        f.write("kept")
print("deep ok")
"#;
    assert_eq!(c.python(script).trim(), "deep ok");
    let mut p = c.mnt.join("t40");
    for i in 0..39 {
        p.push(format!("l{i}"));
    }
    assert_eq!(std::fs::read_to_string(p.join("g")).unwrap(), "kept");
}

/// Symbolic links met on the way (relative, with `..`, absolute, one after
/// the other) are followed by the library's walk as by the kernel's, in
/// opens, stats, `realpath` and unlinks; a loop of links is `ELOOP`.
#[test]
fn symbolic_links_on_the_way_resolve_through_the_library() {
    let c = Cluster::start("links");
    let script = r#"
import errno, os, sys
d = sys.argv[1] + '/sl'
os.makedirs(f'{d}/a/b')
with open(f'{d}/a/b/f', 'w') as f:
    f.write('deep')
os.symlink('a/b', f'{d}/ab')
os.symlink('../sl/ab', f'{d}/up')
os.symlink(f'{d}/a', f'{d}/abs')
os.symlink('up', f'{d}/chain')
assert open(f'{d}/ab/f').read() == 'deep'
assert open(f'{d}/up/f').read() == 'deep'
assert open(f'{d}/abs/b/f').read() == 'deep'
assert open(f'{d}/chain/f').read() == 'deep'
assert os.stat(f'{d}/chain/f').st_size == 4
assert os.path.realpath(f'{d}/chain/f') == f'{d}/a/b/f', os.path.realpath(f'{d}/chain/f')
os.symlink('loop2', f'{d}/loop1')
os.symlink('loop1', f'{d}/loop2')
try:
    os.stat(f'{d}/loop1/x')
    raise AssertionError('a loop of links resolved')
except OSError as e:
    assert e.errno == errno.ELOOP, e
os.unlink(f'{d}/up/f')
assert not os.path.exists(f'{d}/a/b/f')
print('links ok')
"#;
    assert_eq!(c.python(script).trim(), "links ok");
    assert!(c.mnt.join("sl/a/b").is_dir());
    assert!(!c.mnt.join("sl/a/b/f").exists());
}

/// An open-close loop reuses the number the last close left (no descriptor
/// system call per file), counted in the stats line.
#[test]
fn closed_descriptors_are_reused_by_the_next_open() {
    let c = Cluster::start("kept");
    let script = r#"
import os, sys
d = sys.argv[1]
for i in range(200):
    with open(f"{d}/f{i}", "w") as f:
        f.write("x")
for i in range(200):
    fd = os.open(f"{d}/f{i}", os.O_RDONLY)
    assert os.read(fd, 8) == b"x"
    os.close(fd)
print("kept ok")
"#;
    let stderr = python_stats(&c, script, &[c.pfs.to_str().unwrap()], "kept ok");
    let reused = stderr
        .split(" closed descriptors reused")
        .next()
        .and_then(|s| s.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no reuse count: {stderr}"));
    assert!(reused >= 398, "{reused} of 400 opens reused a descriptor: {stderr}");
    assert_eq!(std::fs::read_to_string(c.mnt.join("f199")).unwrap(), "x");
}

#[test]
fn git_commits_through_the_library() {
    let c = Cluster::start("git");
    let src = c._dir.0.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..20 {
        std::fs::write(src.join(format!("sub/f{i}.txt")), format!("file {i}\n").repeat(i + 1))
            .unwrap();
    }
    // mkstemp (the object files), rename, fsync, mmap of packs, utime: all
    // through the library, from git's own calls.
    let script = "set -e; cd \"$1\"; git init -q repo; cd repo; cp -r \"$2\" src; git add -A; \
        git -c user.email=t@example.invalid -c user.name=t commit -qm first; \
        echo more >> src/sub/f3.txt; git -c user.email=t@example.invalid -c user.name=t commit -qam second; \
        git gc -q; git log --oneline | wc -l; git status --porcelain | wc -l";
    let out = c.run("sh", &["-c", script, "sh", &c.pfs.to_string_lossy(), src.to_str().unwrap()]);
    assert_eq!(out.split_whitespace().collect::<Vec<_>>(), ["2", "0"], "two commits, clean tree");
    // The repository is sound seen through the mount, without the library.
    let fsck = Command::new("git")
        .arg("-C")
        .arg(c.mnt.join("repo"))
        .args(["fsck", "--strict"])
        .output()
        .unwrap();
    assert!(fsck.status.success(), "git fsck: {}", String::from_utf8_lossy(&fsck.stderr));
    let log = Command::new("git")
        .arg("-C")
        .arg(c.mnt.join("repo"))
        .args(["log", "--format=%s"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&log.stdout).lines().collect::<Vec<_>>(),
        ["second", "first"]
    );
}

/// Runs a list of failing calls under `root` and prints `name errno` for each:
/// the same script through the mount and through the library must print the
/// same lines.
const PYTHON_ERRORS: &str = r#"
import errno, os, sys
root = sys.argv[1]
os.chdir(root)
os.makedirs('e/dir/sub', exist_ok=True)
open('e/file', 'w').close()
def t(name, f):
    try:
        f()
        print(name, 'ok')
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
t('open missing', lambda: os.open('e/missing', os.O_RDONLY))
t('open excl', lambda: os.open('e/file', os.O_CREAT | os.O_EXCL | os.O_WRONLY))
t('open dir for write', lambda: os.open('e/dir', os.O_WRONLY))
t('open file as dir', lambda: os.open('e/file', os.O_RDONLY | os.O_DIRECTORY))
t('open under file', lambda: os.open('e/file/x', os.O_RDONLY))
t('mkdir exists', lambda: os.mkdir('e/dir'))
t('mkdir missing parent', lambda: os.mkdir('e/nope/x'))
t('rmdir not empty', lambda: os.rmdir('e/dir'))
t('rmdir file', lambda: os.rmdir('e/file'))
t('unlink dir', lambda: os.unlink('e/dir'))
t('unlink missing', lambda: os.unlink('e/missing'))
t('rename into itself', lambda: os.rename('e/dir', 'e/dir/sub/inner'))
t('rename dir over file', lambda: os.rename('e/dir', 'e/file'))
t('readlink file', lambda: os.readlink('e/file'))
t('truncate dir', lambda: os.truncate('e/dir', 0))
t('listdir file', lambda: os.listdir('e/file'))
t('stat trailing slash', lambda: os.stat('e/file/'))
t('getxattr missing', lambda: os.getxattr('e/file', 'user.none'))
t('setxattr replace missing', lambda: os.setxattr('e/file', 'user.a', b'1', os.XATTR_REPLACE))
t('setxattr create', lambda: os.setxattr('e/file', 'user.b', b'1', os.XATTR_CREATE))
t('setxattr create again', lambda: os.setxattr('e/file', 'user.b', b'1', os.XATTR_CREATE))
t('link dir', lambda: os.link('e/dir', 'e/dirlink'))
t('read write-only', lambda: os.read(os.open('e/file', os.O_WRONLY), 1))
t('write read-only', lambda: os.write(os.open('e/file', os.O_RDONLY), b'x'))
t('long name', lambda: os.open('e/' + 'n' * 300, os.O_CREAT | os.O_WRONLY))
t('chdir file', lambda: os.chdir('e/file'))
import fcntl
fd = os.open('e/file', os.O_RDWR | os.O_APPEND | os.O_CLOEXEC)
print('getfl', oct(fcntl.fcntl(fd, fcntl.F_GETFL)), 'getfd', fcntl.fcntl(fd, fcntl.F_GETFD))
fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)
print('setfl', oct(fcntl.fcntl(fd, fcntl.F_GETFL)))
"#;

#[test]
fn errors_are_the_mounts() {
    let c = Cluster::start("errors");
    let (m, l) = c.mount_and_library("python3", &["-c", PYTHON_ERRORS]);
    assert_eq!(m.lines().count(), 28, "every case ran");
    assert_eq!(l.lines().count(), 28, "every case ran through the library");
    for (a, b) in m.lines().zip(l.lines()) {
        assert_eq!(b, a, "the library answers as the mount does");
    }
}

#[test]
fn fio_pfs_bench_and_fsx_run_through_the_library() {
    let c = Cluster::start("tools");
    c.run("mkdir", &["-p", &c.p("fio"), &c.p("bench"), &c.p("fsx")]);
    let dir = format!("--directory={}", c.p("fio"));
    let out = c.run(
        "fio",
        &[
            "--name=w",
            &dir,
            "--ioengine=psync",
            "--rw=write",
            "--bs=1M",
            "--size=32M",
            "--end_fsync=1",
            "--verify=crc32c",
            "--do_verify=1",
            // No verify state file in the working directory (the repository).
            "--verify_state_save=0",
        ],
    );
    assert!(out.contains("err= 0"), "fio reported an error");
    assert_eq!(std::fs::metadata(c.mnt.join("fio/w.0.0")).unwrap().len(), 32 << 20);
    let target = c.p("bench");
    for (workload, size) in [
        ("md-easy", ["--files", "200"]),
        ("md-hard", ["--files", "200"]),
        ("io-easy", ["--segments", "16"]),
    ] {
        let out = c.run(PFS, &["bench", workload, size[0], size[1], &target]);
        assert!(out.contains("all phases verified"), "pfs bench {workload} verified its data");
    }
    for layout in ["none", "io"] {
        let dir = c.p("fsx");
        let fsx = ["fsx", "--ops", "400", "--max-size", "2097152", "--max-len", "262144"];
        let out = c.run(PFS, &[&fsx[..], &["--layout", layout, &dir]].concat());
        assert!(out.contains("all match"), "fsx (layout {layout}) found a mismatch");
    }
}

/// Stats two pfs paths and lists `/` with the library pointed at a cluster
/// that is not there, with `extra` environment; returns stdout and stderr.
fn unreachable(extra: &[(&str, &Path)]) -> (String, String) {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let script = "import os, sys\n\
        for p in sys.argv[1:3]:\n\
        \x20   try:\n\
        \x20       os.stat(p)\n\
        \x20   except OSError as e:\n\
        \x20       print(p.rsplit('/', 1)[1], e.errno)\n\
        print('root', len(os.listdir('/')) > 0)\n";
    let mut cmd = Command::new("python3");
    cmd.args(["-c", script, "/nowhere/pfs/a", "/nowhere/pfs/b"])
        .env("LD_PRELOAD", library())
        .env("PFS_MASTER", format!("127.0.0.1:{port}"))
        .env("PFS_MOUNT", "/nowhere/pfs");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}{stderr}");
    assert!(out.status.success(), "the program did not crash");
    (stdout, stderr)
}

#[test]
fn an_unreachable_cluster_is_one_message_and_eio() {
    let dir = std::env::temp_dir().join(format!("pfs-preload-down-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _clean = TempDir(dir.clone());
    let key = dir.join("cluster.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let (stdout, stderr) = unreachable(&[("PFS_KEY", &key)]);
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        ["a 5", "b 5", "root True"],
        "EIO, and other paths work"
    );
    assert_eq!(
        stderr.matches("libpfs_preload: cannot reach the pfs cluster").count(),
        1,
        "one message"
    );
    // A configuration that cannot be read: the message names it.
    let missing = dir.join("missing.toml");
    let (stdout, stderr) = unreachable(&[("PFS_KEY", &key), ("PFS_CONFIG", &missing)]);
    assert_eq!(stdout.lines().collect::<Vec<_>>(), ["a 5", "b 5", "root True"]);
    assert_eq!(stderr.matches("missing.toml").count(), 1, "one message, naming the file");
}

/// `O_APPEND` writes of two library clients and of the FUSE mount, at the
/// same time on one file, all land and none over another (docs/posix.md
/// "O_APPEND"). Until 2026-11-28 the library asked for the size and then
/// wrote there, and the mount's kernel wrote at the size it had cached.
#[test]
fn appends_of_library_clients_and_the_mount_never_overlap() {
    let c = Cluster::start("appends");
    std::fs::write(c.mnt.join("log"), b"").unwrap();
    // Writer W appends 200 records of 11 to 2,000 bytes, each a header and
    // its filler, with os.write on an O_APPEND descriptor (and a pwrite,
    // which appends all the same on Linux).
    let script = "import os, sys\n\
        path, w = sys.argv[1], int(sys.argv[2])\n\
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)\n\
        for i in range(200):\n\
        \x20   n = 11 + (i * 97 + w * 13) % 1990\n\
        \x20   h = f'<{w}:{i}:{n}>'.encode()\n\
        \x20   r = h + bytes([97 + (w + i) % 26]) * (n - len(h) - 1) + b'\\n'\n\
        \x20   (os.pwrite(fd, r, 0) if i % 2 else os.write(fd, r))\n";
    let lib_log = c.p("log");
    let mnt_log = c.mnt.join("log");
    let writers: Vec<std::process::Child> = (0..3)
        .map(|w| {
            let mut cmd =
                if w < 2 { c.command(&c.pfs, "python3") } else { Command::new("python3") };
            let path = if w < 2 { lib_log.clone() } else { mnt_log.to_str().unwrap().to_string() };
            cmd.args(["-c", script, &path, &w.to_string()]).spawn().unwrap()
        })
        .collect();
    for mut child in writers {
        assert!(child.wait().unwrap().success());
    }
    let log = std::fs::read(&mnt_log).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let mut at = 0;
    while at < log.len() {
        let end = at + log[at..].iter().position(|&b| b == b'>').expect("a record header");
        let head = std::str::from_utf8(&log[at + 1..end]).unwrap();
        let f: Vec<usize> = head.split(':').map(|x| x.parse().unwrap()).collect();
        let (w, i, n) = (f[0], f[1], f[2]);
        assert_eq!(n, 11 + (i * 97 + w * 13) % 1990, "record {head} at {at}");
        let body = &log[end + 1..at + n - 1];
        assert!(body.iter().all(|&b| b == 97 + ((w + i) % 26) as u8), "record {head} whole");
        assert_eq!(log[at + n - 1], b'\n');
        assert!(seen.insert((w, i)), "record {head} twice");
        at += n;
    }
    assert_eq!(seen.len(), 600, "every record of the three writers");
}

/// A record lock on the mount's `f` from this process: 0 or the errno.
fn mount_lock(f: &std::fs::File, typ: i32, start: i64, len: i64) -> i32 {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed flock is valid; its fields are set below.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = typ as i16;
    l.l_whence = libc::SEEK_SET as i16;
    l.l_start = start;
    l.l_len = len;
    // SAFETY: fcntl with a valid descriptor and a flock that outlives the call.
    match unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &mut l) } {
        0 => 0,
        _ => std::io::Error::last_os_error().raw_os_error().unwrap(),
    }
}

const LOCKF_PROGRAM: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>
#define E(call) ((call) == 0 ? 0 : errno)
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 1; }
    /* The mount holds bytes 0..99 and a flock of g. */
    printf("test %d\n", E(lockf(fd, F_TEST, 10)));
    printf("tlock %d\n", E(lockf(fd, F_TLOCK, 10)));
    lseek(fd, 100, SEEK_SET);
    printf("tlock100 %d\n", E(lockf(fd, F_TLOCK, 10)));
    printf("ulock100 %d\n", E(lockf(fd, F_ULOCK, 10)));
    int g = open(argv[2], O_RDWR);
    printf("flock %d\n", E(flock(g, LOCK_EX | LOCK_NB)));
    printf("flock_sh %d\n", E(flock(g, LOCK_SH | LOCK_NB)));
    return 0;
}
"#;

/// `fcntl`, `flock` and `lockf` locks of library clients and of the mount
/// see each other (an MPI-IO job may run some ranks through the library and
/// tools through the mount); a close, and the process's exit, give them
/// back. Before, the library refused record locks (`ENOLCK`) and `flock`.
#[test]
fn locks_of_library_clients_and_the_mount_see_each_other() {
    use std::io::{BufRead as _, Write as _};
    let c = Cluster::start("locks");
    std::fs::write(c.mnt.join("f"), vec![b'x'; 300]).unwrap();
    std::fs::write(c.mnt.join("g"), b"g").unwrap();
    let rw = |p: &Path| std::fs::OpenOptions::new().read(true).write(true).open(p).unwrap();
    let fm = rw(&c.mnt.join("f"));
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 0, 100), 0);
    let gm = rw(&c.mnt.join("g"));
    // SAFETY: flock on a valid descriptor.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&gm), libc::LOCK_EX) }, 0);

    let script = "import fcntl, os, struct, sys, time\n\
        f = os.open(sys.argv[1], os.O_RDWR)\n\
        try:\n\
        \x20   fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 50); print('got 50')\n\
        except BlockingIOError:\n\
        \x20   print('refused')\n\
        q = struct.pack('hhqqi', fcntl.F_WRLCK, 0, 50, 10, 0)\n\
        print(struct.unpack('hhqqi', fcntl.fcntl(f, fcntl.F_GETLK, q))[:4])\n\
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 100); print('got 100')\n\
        g = os.open(sys.argv[2], os.O_RDWR)\n\
        try:\n\
        \x20   fcntl.flock(g, fcntl.LOCK_EX | fcntl.LOCK_NB); print('flock got')\n\
        except BlockingIOError:\n\
        \x20   print('flock refused')\n\
        print('waiting', flush=True)\n\
        t = time.time(); fcntl.lockf(f, fcntl.LOCK_EX, 10, 0)\n\
        print('got 0 after %.2f' % (time.time() - t), flush=True)\n\
        sys.stdin.readline(); os.close(f); print('closed', flush=True)\n\
        f = os.open(sys.argv[1], os.O_RDWR)\n\
        fcntl.lockf(f, fcntl.LOCK_EX, 10, 200); print('held', flush=True)\n\
        sys.stdin.readline()\n";
    let mut py = c
        .command(&c.pfs, "python3")
        .args(["-c", script, &c.p("f"), &c.p("g")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
    let mut stdin = py.stdin.take().unwrap();
    let mut line = || {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l.trim().to_owned()
    };
    assert_eq!(line(), "refused", "the mount's range");
    assert_eq!(line(), "(1, 0, 0, 100)", "F_GETLK names it (pid 0: another client)");
    assert_eq!(line(), "got 100", "beside it");
    assert_eq!(line(), "flock refused");
    assert_eq!(line(), "waiting");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(mount_lock(&fm, libc::F_UNLCK, 0, 0), 0);
    let got = line();
    let waited: f64 = got.strip_prefix("got 0 after ").unwrap().parse().unwrap();
    assert!(waited >= 0.25, "F_SETLKW waited for the mount's unlock: {got}");
    // The library's locks hold against the mount, and go at its close.
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 0, 10), libc::EAGAIN);
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 100, 10), libc::EAGAIN);
    writeln!(stdin).unwrap();
    assert_eq!(line(), "closed");
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 0, 10), 0, "the library's close released");
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 100, 10), 0);
    // And at exit, without a close (pfs up's lease is 30 s: this is the exit).
    assert_eq!(line(), "held");
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 200, 10), libc::EAGAIN);
    writeln!(stdin).unwrap();
    assert!(py.wait().unwrap().success());
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 200, 10), 0, "released at the library's exit");

    // lockf(3) and flock(2) from C (glibc's lockf calls its own fcntl).
    assert_eq!(mount_lock(&fm, libc::F_UNLCK, 0, 0), 0);
    assert_eq!(mount_lock(&fm, libc::F_WRLCK, 0, 100), 0);
    let exe = c.compile("locks", LOCKF_PROGRAM);
    let out = c.run(exe.to_str().unwrap(), &[&c.p("f"), &c.p("g")]);
    let eagain = libc::EAGAIN;
    assert_eq!(
        out,
        format!(
            "test {}\ntlock {eagain}\ntlock100 0\nulock100 0\nflock {}\nflock_sh {}\n",
            libc::EACCES,
            libc::EWOULDBLOCK,
            libc::EWOULDBLOCK
        )
    );
}

/// SQLite (rollback journal) from two library clients and two processes on
/// the mount of the same cluster: locks, data read under them, and journals
/// made and removed by the others (docs/posix.md "locks"). Every transaction
/// counts the rows and adds one; each count is seen once.
#[test]
fn sqlite_through_the_library_and_the_mount() {
    let c = Cluster::start("sqlite");
    let script = "import sqlite3, sys\n\
        c = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)\n\
        if sys.argv[2] == 'init':\n\
        \x20   c.execute('create table t(w, n, pad)'); sys.exit(0)\n\
        for i in range(int(sys.argv[3])):\n\
        \x20   c.execute('begin immediate')\n\
        \x20   n = c.execute('select count(*) from t').fetchone()[0]\n\
        \x20   c.execute('insert into t values (?, ?, ?)', (sys.argv[2], n, 'x' * 3000))\n\
        \x20   c.execute('commit')\n\
        if sys.argv[2] == 'check':\n\
        \x20   print(c.execute('select count(*), count(distinct n) from t').fetchone(),\n\
        \x20         c.execute('pragma integrity_check').fetchone()[0])\n";
    let mnt_db = c.mnt.join("t.db").to_str().unwrap().to_string();
    let lib_db = c.p("t.db");
    let ok = Command::new("python3").args(["-c", script, &mnt_db, "init", "0"]).status();
    assert!(ok.unwrap().success());
    let writers: Vec<std::process::Child> = (0..4)
        .map(|w| {
            let (mut cmd, db) = if w < 2 {
                (c.command(&c.pfs, "python3"), &lib_db)
            } else {
                (Command::new("python3"), &mnt_db)
            };
            cmd.args(["-c", script, db, &w.to_string(), "100"])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for w in writers {
        let out = w.wait_with_output().unwrap();
        assert!(out.status.success(), "a writer failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = Command::new("python3").args(["-c", script, &mnt_db, "check", "0"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "(400, 400) ok");
}

/// A write through the library takes from a file what the kernel's takes
/// before a write through the mount: its file capability always, and the
/// set-user-ID bit (and the set-group-ID bit of a group-executable file)
/// when the writer lacks `CAP_FSETID` (here root without it, by
/// `setpriv --bounding-set=-fsetid`). Before, the library left them all.
#[test]
fn a_write_through_the_library_takes_what_the_kernels_takes() {
    use std::os::unix::fs::PermissionsExt as _;
    let c = Cluster::start("privs");
    // (name, mode, writer keeps CAP_FSETID, append, mode after)
    let cases = [
        ("suid", 0o6755, false, false, 0o0755),
        ("sgid-not-exec", 0o2745, false, false, 0o2745),
        ("root-keeps", 0o6755, true, false, 0o6755),
        ("appended", 0o6755, false, true, 0o0755),
    ];
    for (name, mode, _, _, _) in cases {
        let p = c.mnt.join(name);
        std::fs::write(&p, b"0123456789").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        let st = Command::new("setcap").arg("cap_net_raw+ep").arg(&p).status().expect("setcap");
        assert!(st.success());
    }
    for (name, _, fsetid, append, _) in cases {
        let script = if append {
            "import sys; f = open(sys.argv[1], 'ab'); f.write(b'x'); f.close()"
        } else {
            "import sys; f = open(sys.argv[1], 'r+b'); f.write(b'x'); f.close()"
        };
        let mut cmd = if fsetid {
            c.command(&c.pfs, "python3")
        } else {
            let mut s = c.command(&c.pfs, "setpriv");
            s.args(["--bounding-set=-fsetid", "python3"]);
            s
        };
        let st = cmd.args(["-c", script, &c.p(name)]).status().unwrap();
        assert!(st.success(), "{name}");
    }
    // The mount's kernel keeps attributes up to a second.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    for (name, _, _, _, after) in cases {
        let p = c.mnt.join(name);
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, after, "{name}: {mode:o}");
        let caps = Command::new("getcap").arg(&p).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&caps.stdout).trim(), "", "{name}: capability gone");
    }
}

/// A counter in a file incremented under an exclusive lock (read, add one,
/// write, unlock) by a library client and a process on the mount loses no
/// update: each lock taken reads what the other wrote.
#[test]
fn a_locked_counter_through_the_library_and_the_mount_loses_no_update() {
    let c = Cluster::start("counter");
    let script = "import fcntl, os, sys, time\n\
        f = os.open(sys.argv[1], os.O_RDWR)\n\
        for i in range(100):\n\
        \x20   fcntl.lockf(f, fcntl.LOCK_EX, 0, 0)\n\
        \x20   n = int.from_bytes(os.pread(f, 8, 0), 'little')\n\
        \x20   os.pwrite(f, (n + 1).to_bytes(8, 'little'), 0)\n\
        \x20   fcntl.lockf(f, fcntl.LOCK_UN, 0, 0)\n\
        \x20   time.sleep(0.001)\n";
    std::fs::write(c.mnt.join("counter"), 0u64.to_le_bytes()).unwrap();
    let mnt = c.mnt.join("counter").to_str().unwrap().to_string();
    let lib = c.command(&c.pfs, "python3").args(["-c", script, &c.p("counter")]).spawn().unwrap();
    let m = Command::new("python3").args(["-c", script, &mnt]).spawn().unwrap();
    for mut p in [lib, m] {
        assert!(p.wait().unwrap().success());
    }
    let got = std::fs::read(c.mnt.join("counter")).unwrap();
    assert_eq!(u64::from_le_bytes(got[..8].try_into().unwrap()), 200, "updates lost");
}

/// Calls past reading and writing, each printed with its result, for
/// `calls_past_read_and_write_answer_as_the_mount`: `fcntl`'s other
/// commands, `readahead`, `sync_file_range`, `syncfs`, `mknod`/`mknodat`
/// (with a directory descriptor, as stress-ng calls it), `mkfifo`, and the
/// file size limit (`RLIMIT_FSIZE`: `EFBIG`, and a child killed by
/// `SIGXFSZ`). Lines starting `lease` or `query` are the library's own (no
/// lease is granted; `F_DUPFD_QUERY` needs Linux 6.10).
const CALLS_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#define T(name, call) do { errno = 0; long r_ = (long)(call); \
    printf("%s %ld %s\n", name, r_, r_ < 0 ? strerror(errno) : ""); } while (0)
int main(int argc, char **argv) {
    char p[512], q[600];
    snprintf(p, sizeof p, "%s/f", argv[1]);
    snprintf(q, sizeof q, "%s/node", argv[1]);
    int fd = open(p, O_CREAT | O_RDWR | O_TRUNC, 0600);
    struct f_owner_ex ox = { F_OWNER_PGRP, getpgrp() };
    uint64_t hint = 9;
    T("getown", fcntl(fd, F_GETOWN));
    T("setown", fcntl(fd, F_SETOWN, getpid()));
    printf("getown is pid %d\n", fcntl(fd, F_GETOWN) == getpid());
    T("setown of no process", fcntl(fd, F_SETOWN, 999999999));
    T("setown_ex", fcntl(fd, F_SETOWN_EX, &ox));
    ox.type = 9; ox.pid = 0;
    T("getown_ex", fcntl(fd, F_GETOWN_EX, &ox));
    printf("owner is the group %d\n", ox.type == F_OWNER_PGRP && ox.pid == getpgrp());
    ox.type = 7; T("setown_ex of a bad type", fcntl(fd, F_SETOWN_EX, &ox));
    T("getsig", fcntl(fd, F_GETSIG));
    T("setsig", fcntl(fd, F_SETSIG, SIGUSR1));
    T("getsig again", fcntl(fd, F_GETSIG));
    T("setsig 65", fcntl(fd, F_SETSIG, 65));
    T("getlease", fcntl(fd, F_GETLEASE));
    T("lease read", fcntl(fd, F_SETLEASE, F_RDLCK));
    T("lease write", fcntl(fd, F_SETLEASE, F_WRLCK));
    T("setlease unlock", fcntl(fd, F_SETLEASE, F_UNLCK));
    T("setlease 9", fcntl(fd, F_SETLEASE, 9));
    T("notify", fcntl(fd, F_NOTIFY, DN_MODIFY));
    T("getpipe_sz", fcntl(fd, F_GETPIPE_SZ));
    T("get_seals", fcntl(fd, F_GET_SEALS));
    T("get_rw_hint", fcntl(fd, F_GET_RW_HINT, &hint)); printf("hint %lu\n", (unsigned long)hint);
    hint = 3; T("set_rw_hint", fcntl(fd, F_SET_RW_HINT, &hint));
    hint = 0; T("get_rw_hint again", fcntl(fd, F_GET_RW_HINT, &hint)); printf("hint %lu\n", (unsigned long)hint);
    hint = 99; T("set_rw_hint 99", fcntl(fd, F_SET_RW_HINT, &hint));
    T("command 9999", fcntl(fd, 9999));
    int dup = fcntl(fd, F_DUPFD, 100);
    printf("query same %d other %d\n", fcntl(fd, 1027, dup), fcntl(fd, 1027, 0));
    close(dup);
    T("readahead", readahead(fd, 0, 4096));
    T("sync_file_range", sync_file_range(fd, 0, 4096, SYNC_FILE_RANGE_WRITE));
    T("sync_file_range bad flags", sync_file_range(fd, 0, 4096, 0x100));
    T("sync_file_range negative", sync_file_range(fd, -1, 4096, SYNC_FILE_RANGE_WRITE));
    T("syncfs", syncfs(fd));
    sync();
    T("mknod fifo", mknod(q, S_IFIFO | 0600, 0)); unlink(q);
    T("mknod regular", mknod(q, S_IFREG | 0640, 0));
    struct stat st;
    T("stat regular", stat(q, &st)); printf("mode %o size %ld\n", st.st_mode, (long)st.st_size); unlink(q);
    T("mknod char", mknod(q, S_IFCHR | 0600, makedev(1, 3)));
    T("stat char", stat(q, &st)); printf("mode %o rdev %d:%d\n", st.st_mode, major(st.st_rdev), minor(st.st_rdev)); unlink(q);
    int dir = open(argv[1], O_RDONLY | O_DIRECTORY);
    T("mknodat block", mknodat(dir, "node", S_IFBLK | 0600, makedev(8, 0x123)));
    T("stat block", stat(q, &st)); printf("mode %o rdev %d:%d\n", st.st_mode, major(st.st_rdev), minor(st.st_rdev)); unlink(q);
    close(dir);
    T("mknod socket", mknod(q, S_IFSOCK | 0600, 0)); unlink(q);
    T("mknod directory", mknod(q, S_IFDIR | 0700, 0));
    T("mknod bad type", mknod(q, 0170000 | 0600, 0));
    T("mknod existing", mknod(p, S_IFIFO | 0600, 0));
    T("mkfifo", mkfifo(q, 0600));
    T("stat fifo", stat(q, &st)); printf("mode %o\n", st.st_mode); unlink(q);
    pid_t child = fork();
    if (child == 0) {
        struct rlimit rl = { 1000, 1000 };
        setrlimit(RLIMIT_FSIZE, &rl);
        pwrite(fd, "x", 1, 5000);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    printf("child killed by signal %d\n", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    struct rlimit rl = { 100000, 100000 };
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &rl);
    T("pwrite across the limit", pwrite(fd, "abcd", 4, 99998));
    T("pwrite at the limit", pwrite(fd, "abcd", 4, 100000));
    T("empty pwrite past the limit", pwrite(fd, "", 0, 200000));
    T("ftruncate past the limit", ftruncate(fd, 200000));
    T("ftruncate below the limit", ftruncate(fd, 50000));
    T("fallocate past the limit", fallocate(fd, 0, 90000, 20000));
    T("fallocate keeping the size", fallocate(fd, FALLOC_FL_KEEP_SIZE, 90000, 20000));
    T("truncate past the limit", truncate(p, 200000));
    int ap = open(p, O_WRONLY | O_APPEND);
    T("ftruncate to the limit", ftruncate(fd, 100000));
    T("append at the limit", write(ap, "z", 1));
    close(ap);
    fstat(fd, &st); printf("size %ld\n", (long)st.st_size);
    close(fd);
    return 0;
}
"#;

/// The calls of [`CALLS_PROGRAM`] through the library answer as they do on
/// the mount, line by line. Until 2026-11-28 the library sent `readahead`,
/// `sync_file_range`, `syncfs`, `mknodat` with a directory descriptor and the
/// other `fcntl` commands to the kernel (`EBADF`, `ENOTDIR`, `EINVAL`), and
/// wrote past `RLIMIT_FSIZE` (found with stress-ng's readahead, sync-file,
/// io, mknod, fcntl and fsize stressors).
#[test]
fn calls_past_read_and_write_answer_as_the_mount() {
    let c = Cluster::start("calls");
    let exe = c.compile("calls", CALLS_PROGRAM);
    let (m, l) = c.mount_and_library(exe.to_str().unwrap(), &[]);
    let own = |line: &&str| line.starts_with("lease") || line.starts_with("query");
    let (m_lines, l_lines): (Vec<&str>, Vec<&str>) =
        (m.lines().filter(|l| !own(l)).collect(), l.lines().filter(|l| !own(l)).collect());
    assert_eq!(l_lines.len(), m_lines.len(), "every call ran through the library");
    assert!(m_lines.len() > 50, "the program ran to its end");
    for (a, b) in m_lines.iter().zip(&l_lines) {
        assert_eq!(b, a, "the library answers as the mount does");
    }
    // The mount's kernel grants local leases; the library none (another
    // node may hold the file open).
    for lease in ["lease read", "lease write"] {
        assert!(l.contains(&format!("{lease} -1 Resource temporarily unavailable")), "{lease}");
    }
    assert!(l.contains("query same 1 other 0"), "F_DUPFD_QUERY through the library");
    assert!(m.contains("child killed by signal 25"), "the kernel's SIGXFSZ");
    assert!(m.contains("size 100000"), "nothing written past the limit");
}

/// POSIX asynchronous I/O, for `posix_aio_through_the_library_as_the_mount`
/// (with a second argument, a child after `fork` issues its own request: not
/// with glibc's own, whose child waits for its parent's threads).
const AIO_PROGRAM: &str = r#"
#define _GNU_SOURCE
#include <aio.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static volatile sig_atomic_t sigs, asyncio;
static volatile int threads;
static void on_sig(int s, siginfo_t *si, void *u) {
    sigs++;
    if (si->si_code == SI_ASYNCIO && si->si_value.sival_int == 42) asyncio++;
}
static void on_done(union sigval v) { if (v.sival_int == 7) __sync_fetch_and_add(&threads, 1); }
static void wait_one(struct aiocb *a) {
    const struct aiocb *l[1] = { a };
    while (aio_error(a) == EINPROGRESS) aio_suspend(l, 1, NULL);
}
int main(int argc, char **argv) {
    char p[512];
    snprintf(p, sizeof p, "%s/aio", argv[1]);
    int fd = open(p, O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0) { perror("open"); return 1; }
    struct sigaction sa = {0};
    sa.sa_sigaction = on_sig; sa.sa_flags = SA_SIGINFO; sigaction(SIGUSR1, &sa, 0);
    sigset_t block, old;
    sigemptyset(&block); sigaddset(&block, SIGUSR1);
    static char w[65536];
    for (int i = 0; i < (int)sizeof w; i++) w[i] = (char)(i * 7 + 3);
    /* A write whose signal the program waits for with sigsuspend. */
    sigprocmask(SIG_BLOCK, &block, &old);
    struct aiocb a = {0};
    a.aio_fildes = fd; a.aio_buf = w; a.aio_nbytes = 8192; a.aio_offset = 4096;
    a.aio_sigevent.sigev_notify = SIGEV_SIGNAL; a.aio_sigevent.sigev_signo = SIGUSR1;
    a.aio_sigevent.sigev_value.sival_int = 42;
    if (aio_write(&a)) { perror("aio_write"); return 1; }
    while (sigs == 0) sigsuspend(&old);
    sigprocmask(SIG_SETMASK, &old, 0);
    printf("write: error %d return %zd, signals %d (SI_ASYNCIO %d)\n", aio_error(&a), aio_return(&a), sigs, asyncio);
    /* A bad fsync operation, then a good one. */
    struct aiocb s = {0};
    s.aio_fildes = fd; s.aio_sigevent.sigev_notify = SIGEV_NONE;
    errno = 0;
    int r = aio_fsync(12345, &s);
    printf("fsync of a bad op: %d %s\n", r, strerror(errno));
    if (aio_fsync(O_SYNC, &s)) { perror("aio_fsync"); return 1; }
    wait_one(&s);
    printf("fsync: error %d return %zd\n", aio_error(&s), aio_return(&s));
    /* 64 writes in flight, waited for with aio_suspend, then read back. */
    static struct aiocb many[64];
    const struct aiocb *ml[64];
    for (int i = 0; i < 64; i++) {
        memset(&many[i], 0, sizeof many[i]);
        many[i].aio_fildes = fd; many[i].aio_buf = w + (i % 8) * 4096; many[i].aio_nbytes = 4096;
        many[i].aio_offset = 65536 + i * 4096; many[i].aio_sigevent.sigev_notify = SIGEV_NONE;
        if (aio_write(&many[i])) { perror("aio_write of many"); return 1; }
        ml[i] = &many[i];
    }
    for (int left = 64; left > 0;) {
        aio_suspend(ml, 64, NULL);
        left = 0;
        for (int i = 0; i < 64; i++) left += aio_error(&many[i]) == EINPROGRESS;
    }
    int ok = 0, same = 0;
    char back[4096];
    for (int i = 0; i < 64; i++) {
        ok += aio_error(&many[i]) == 0 && aio_return(&many[i]) == 4096;
        pread(fd, back, 4096, 65536 + i * 4096);
        same += memcmp(back, w + (i % 8) * 4096, 4096) == 0;
    }
    printf("64 writes: %d ended well, %d read back\n", ok, same);
    /* lio_listio LIO_WAIT: two reads (one over a hole) and a null entry. */
    char r1[4096], r2[8192];
    memset(r1, 1, sizeof r1); memset(r2, 1, sizeof r2);
    struct aiocb b = {0}, c = {0};
    b.aio_fildes = fd; b.aio_buf = r1; b.aio_nbytes = 4096; b.aio_offset = 0; b.aio_lio_opcode = LIO_READ;
    c.aio_fildes = fd; c.aio_buf = r2; c.aio_nbytes = 8192; c.aio_offset = 4096; c.aio_lio_opcode = LIO_READ;
    struct aiocb *list[3] = { &b, NULL, &c };
    if (lio_listio(LIO_WAIT, list, 3, NULL)) { perror("lio_listio"); return 1; }
    int zero = 1;
    for (int i = 0; i < 4096; i++) if (r1[i]) zero = 0;
    printf("listio: %zd %zd, hole zero %d, data same %d\n", aio_return(&b), aio_return(&c), zero, memcmp(r2, w, 8192) == 0);
    /* lio_listio LIO_NOWAIT, notified on a thread: a read past the end. */
    struct sigevent ev = {0};
    ev.sigev_notify = SIGEV_THREAD; ev.sigev_notify_function = on_done; ev.sigev_value.sival_int = 7;
    struct aiocb d = {0};
    d.aio_fildes = fd; d.aio_buf = r1; d.aio_nbytes = 100; d.aio_offset = 10000000; d.aio_lio_opcode = LIO_READ;
    struct aiocb *list2[1] = { &d };
    if (lio_listio(LIO_NOWAIT, list2, 1, &ev)) { perror("lio_listio nowait"); return 1; }
    for (int i = 0; i < 10000 && (aio_error(&d) == EINPROGRESS || threads == 0); i++) usleep(1000);
    printf("past the end: error %d return %zd, thread notified %d\n", aio_error(&d), aio_return(&d), threads);
    /* A negative offset; a cancel of what ended. */
    struct aiocb e = {0};
    e.aio_fildes = fd; e.aio_buf = r1; e.aio_nbytes = 10; e.aio_offset = -1;
    if (aio_read(&e) == 0) wait_one(&e);
    printf("negative offset: error %s return %zd\n", strerror(aio_error(&e)), aio_return(&e));
    printf("cancel of an ended request: %s\n", aio_cancel(fd, &a) == AIO_ALLDONE ? "AIO_ALLDONE" : "other");
    if (argc > 2) {
        pid_t pid = fork();
        if (pid == 0) {
            struct aiocb f = {0};
            f.aio_fildes = fd; f.aio_buf = back; f.aio_nbytes = 4096; f.aio_offset = 4096;
            if (aio_read(&f)) _exit(2);
            wait_one(&f);
            _exit(aio_return(&f) == 4096 && memcmp(back, w, 4096) == 0 ? 0 : 3);
        }
        int st;
        waitpid(pid, &st, 0);
        printf("child: exit %d\n", WEXITSTATUS(st));
    }
    close(fd);
    return 0;
}
"#;

/// POSIX asynchronous I/O on pfs descriptors through the library answers as
/// glibc's does on the mount, line by line; a child after `fork` issues its
/// own. Until 2026-11-28 every request failed with `EBADF` (glibc's threads
/// call its internal `pread`, out of the library's reach; stress-ng's aio
/// stressor), and ROMIO's `MPI_File_iwrite` uses them.
#[test]
fn posix_aio_through_the_library_as_the_mount() {
    let c = Cluster::start("aio");
    let exe = c.compile("aio", AIO_PROGRAM);
    let (m, l) = c.mount_and_library(exe.to_str().unwrap(), &[]);
    assert!(m.contains("64 writes: 64 ended well, 64 read back"), "glibc on the mount");
    assert_eq!(l, m, "the library answers as glibc on the mount does");
    let forked = c.run_on(&c.pfs, exe.to_str().unwrap(), &[&c.p(""), "fork"]);
    assert!(forked.status.success());
    assert!(String::from_utf8_lossy(&forked.stdout).contains("child: exit 0"));
}

/// stress-ng's file system stressors (a test suite none of us wrote), a
/// group of them at a time, on the mount and through the library: every
/// stressor must finish without a failure and do some work (`--verify`
/// checks the data where the stressor can). Left out: `dup` (a clone that
/// races the library's own connection for a descriptor number), `fcntl` and
/// `iomix` (raw `syscall(2)`s that bypass the library), `aiol` (kernel AIO
/// and io_uring are the kernel's), `io-uring` (fails on ext4 here too),
/// `fiemap` and `inode-flags` (FUSE has neither extent maps nor inode flags:
/// they do nothing on either). `lease` runs on the mount only: the library
/// grants no lease. Through the library this found `readlink` failing with
/// `ESTALE` on the mount (symlink), and in the library `readahead`,
/// `sync_file_range`, `syncfs`, `mknodat` with a directory descriptor,
/// POSIX AIO and `RLIMIT_FSIZE` (readahead, sync-file, io, mknod, aio,
/// fsize).
#[test]
fn stress_ng_file_stressors_on_the_mount_and_through_the_library() {
    // The slow ones (seconds for 8 operations) each in a group of its own.
    const SLOW: [&str; 5] = ["symlink", "xattr", "link", "mmap", "chdir"];
    const GROUPS: [&str; 5] = [
        "access chmod chown copy-file dentry dir dirdeep symlink",
        "dirmany fallocate filename flock fpunch fsize fstat xattr",
        "getdent hdd io link locka lockf lockofd mknod",
        "open rename sync-file touch utime readahead revio seek mmap",
        "lease msync sendfile splice file-ioctl chdir aio",
    ];
    let c = Cluster::start("stressng");
    let found = Command::new("stress-ng").arg("--version").output();
    assert!(found.is_ok_and(|o| o.status.success()), "stress-ng is needed: .ci/run installs it");
    std::fs::create_dir_all(c.mnt.join("m")).unwrap();
    std::fs::create_dir_all(c.mnt.join("l")).unwrap();
    for (through, dir) in [("the mount", "m"), ("the library", "l")] {
        for group in GROUPS {
            let mut args: Vec<String> = Vec::new();
            for s in group.split(' ') {
                if s == "lease" && through == "the library" {
                    // No lease is granted: it would only wait out the timeout.
                    continue;
                }
                // Each runs until it did 8 of its operations (2 of the slow
                // ones), or for 8 s.
                let ops = if SLOW.contains(&s) { "2" } else { "8" };
                args.extend([format!("--{s}"), "1".into(), format!("--{s}-ops"), ops.into()]);
            }
            let path = c.mnt.join(dir);
            args.extend(
                ["--timeout", "8", "--verify", "--metrics-brief", "--temp-path"].map(String::from),
            );
            args.push(path.to_str().unwrap().into());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let t = std::time::Instant::now();
            // In the directory itself: the open stressor leaves a file in the
            // working directory.
            let mut stress = if through == "the mount" {
                Command::new("stress-ng")
            } else {
                c.command(&c.mnt, "stress-ng")
            };
            let out = stress.current_dir(&path).args(&args).output().unwrap();
            println!("stress-ng {group} through {through}: {:.1} s", t.elapsed().as_secs_f64());
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "stress-ng {group} through {through}:\n{text}");
            let failed: Vec<&str> =
                text.lines().filter(|l| l.contains(" fail: ") || l.contains(" error: ")).collect();
            assert!(failed.is_empty(), "stress-ng {group} through {through}:\n{text}");
            for s in group.split(' ') {
                if s == "lease" && through == "the library" {
                    continue;
                }
                // "stress-ng: metrc: [pid] <stressor> <bogo ops> ..."
                let ops = text.lines().find_map(|l| {
                    let mut w = l.split_whitespace().skip(3);
                    (w.next() == Some(s)).then(|| w.next()?.parse::<u64>().ok()).flatten()
                });
                assert!(ops.is_some_and(|n| n > 0), "{s} did no work through {through}:\n{text}");
            }
        }
    }
}
