//! `pfs fsx`: a model-checking file exerciser in the style of fsx.
//!
//! Seeded random operations on files of a directory, each checked against an
//! in-memory model of the file right after it runs: `pwrite`/`pread` at random
//! offsets and lengths (1 byte to `--max-len`, unaligned, across block
//! boundaries and holes), `truncate`/`ftruncate` up and down, `fsync`, close and
//! reopen, `O_APPEND` writes, `mmap` reads and shared writable `mmap` writes with
//! `msync`, `fallocate`, `stat` and `fstat` sizes, and a rename of a new file onto
//! the file. With `--procs N` it runs N processes, each on its own file and all on
//! one shared file where each owns disjoint stripes. On the first mismatch it
//! prints the seed, the process and the last operations, and fails.

use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Arguments of `pfs fsx`.
#[derive(Debug, clap::Args)]
pub struct FsxArgs {
    /// Directory to run in (a pfs mount, or any file system to check the model).
    pub dir: PathBuf,
    /// Random seed (default: from the clock; always printed, to replay a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Operations per process.
    #[arg(long, default_value_t = 5000)]
    pub ops: u64,
    /// Processes, each on its own file and on one shared file (disjoint stripes).
    #[arg(long, default_value_t = 2)]
    pub procs: u32,
    /// Longest read or write, in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_len: u64,
    /// Largest file size the operations aim at, in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    pub max_size: u64,
    /// pfs data layout of the files (block, file, io), set on a subdirectory
    /// through `user.pfs.file_layout`; `none` leaves the directory's own.
    #[arg(long, default_value = "none")]
    pub layout: String,
    /// Operations kept to print on a mismatch.
    #[arg(long, default_value_t = 24)]
    pub history: usize,
    /// Compare the whole file with the model every N operations (each
    /// operation's own range is always checked).
    #[arg(long, default_value_t = 250)]
    pub check_every: u64,
    /// Run as process P of the run (set by the parent; not for users).
    #[arg(long, hide = true)]
    pub proc_index: Option<u32>,
}

/// Bytes each process owns in turn in the shared file.
const STRIPE: u64 = 256 << 10;
/// Stripes in the shared file.
const STRIPES: u64 = 64;

/// Runs `pfs fsx`.
pub fn run(args: &FsxArgs) -> Result<(), String> {
    if !(1..=STRIPES).contains(&u64::from(args.procs)) {
        return Err(format!("--procs {}: from 1 to {STRIPES}", args.procs));
    }
    if args.ops == 0 || args.max_len == 0 || args.max_size < args.max_len {
        return Err(
            "--ops and --max-len must be positive, and --max-size at least --max-len".into()
        );
    }
    if let Some(p) = args.proc_index {
        let seed = args.seed.ok_or("--proc-index needs --seed")?;
        return Exerciser::new(args, seed, p)?.run();
    }
    let seed = args.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        t.map(|d| d.as_nanos() as u64).unwrap_or(1)
    });
    let dir = args.dir.join(format!("fsx-{seed}"));
    // A run left by a failure must not seed this one with its data.
    if dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
    }
    fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    if args.layout != "none" {
        set_layout(&dir, &args.layout)?;
    }
    println!(
        "fsx: seed {seed}, {} processes x {} operations, layout {}, in {}",
        args.procs,
        args.ops,
        args.layout,
        dir.display()
    );
    let shared = dir.join("shared");
    File::create(&shared).map_err(|e| format!("create {}: {e}", shared.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut children = Vec::new();
    for p in 0..args.procs {
        let child = Command::new(&exe)
            .arg("fsx")
            .arg(&dir)
            .args(["--seed", &seed.to_string(), "--ops", &args.ops.to_string()])
            .args(["--procs", &args.procs.to_string(), "--max-len", &args.max_len.to_string()])
            .args(["--max-size", &args.max_size.to_string()])
            .args(["--history", &args.history.to_string(), "--proc-index", &p.to_string()])
            .args(["--check-every", &args.check_every.to_string()])
            .spawn()
            .map_err(|e| format!("start process {p}: {e}"))?;
        children.push(child);
    }
    let mut failed = Vec::new();
    for (p, mut c) in children.into_iter().enumerate() {
        let st = c.wait().map_err(|e| format!("wait for process {p}: {e}"))?;
        if !st.success() {
            failed.push(p);
        }
    }
    if !failed.is_empty() {
        return Err(format!("fsx seed {seed}: processes {failed:?} found a mismatch (above)"));
    }
    fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
    println!("fsx: seed {seed}: {} operations checked, all match", args.ops * args.procs as u64);
    Ok(())
}

fn set_layout(dir: &Path, layout: &str) -> Result<(), String> {
    if !["block", "file", "io"].contains(&layout) {
        return Err(format!("--layout {layout}: expected block, file, io or none"));
    }
    let p = c_path(dir);
    let name = c"user.pfs.file_layout";
    // SAFETY: valid C strings and a value of the given length.
    let rc = unsafe {
        libc::setxattr(p.as_ptr(), name.as_ptr(), layout.as_ptr().cast(), layout.len(), 0)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("set layout {layout} on {}: {e}", dir.display()));
    }
    Ok(())
}

fn c_path(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("paths have no NUL")
}

/// SplitMix64: small, seedable, the same everywhere.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A length from 1 to `max`, small ones as likely as large ones by magnitude.
    fn len(&mut self, max: u64) -> u64 {
        let bits = 64 - max.leading_zeros() as u64;
        let top = 1u64 << self.below(bits + 1).min(63);
        1 + self.below(top.min(max))
    }
}

/// One process of a run: its own file, its stripes of the shared file.
struct Exerciser {
    rng: Rng,
    seed: u64,
    proc_index: u32,
    procs: u32,
    ops: u64,
    max_len: u64,
    max_size: u64,
    path: PathBuf,
    file: File,
    model: Vec<u8>,
    shared: File,
    shared_model: Vec<u8>,
    history: VecDeque<String>,
    history_max: usize,
    check_every: u64,
    /// Fill byte of the next write: every write is told apart from the last.
    stamp: u8,
}

impl std::fmt::Debug for Exerciser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exerciser").field("seed", &self.seed).finish_non_exhaustive()
    }
}

type Check = Result<(), String>;

impl Exerciser {
    fn new(args: &FsxArgs, seed: u64, proc_index: u32) -> Result<Exerciser, String> {
        let path = args.dir.join(format!("file-{proc_index}"));
        let file = open_rw(&path, true)?;
        let shared_path = args.dir.join("shared");
        let shared = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&shared_path)
            .map_err(|e| format!("open {}: {e}", shared_path.display()))?;
        Ok(Exerciser {
            rng: Rng(seed ^ (u64::from(proc_index) + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
            seed,
            proc_index,
            procs: args.procs,
            ops: args.ops,
            max_len: args.max_len,
            max_size: args.max_size,
            path,
            file,
            model: Vec::new(),
            shared,
            shared_model: Vec::new(),
            history: VecDeque::new(),
            history_max: args.history.max(1),
            check_every: args.check_every.max(1),
            stamp: 0,
        })
    }

    fn run(mut self) -> Result<(), String> {
        for i in 0..self.ops {
            if let Err(e) = self.step(i) {
                eprintln!(
                    "fsx MISMATCH: seed {} process {} operation {i}: {e}\nlast operations:",
                    self.seed, self.proc_index
                );
                for h in &self.history {
                    eprintln!("  {h}");
                }
                // A write the file system acknowledged before it ran reports
                // its error at the next fsync: say what that is.
                for (name, f) in [("own file", &self.file), ("shared file", &self.shared)] {
                    match f.sync_all() {
                        Ok(()) => eprintln!("fsync of the {name} after the mismatch: ok"),
                        Err(e) => eprintln!("fsync of the {name} after the mismatch: {e}"),
                    }
                }
                eprintln!(
                    "replay: pfs fsx DIR --seed {} --procs {} --ops {}",
                    self.seed, self.procs, self.ops
                );
                return Err(format!("seed {}: {e}", self.seed));
            }
        }
        self.check_all("end")?;
        Ok(())
    }

    fn note(&mut self, i: u64, op: String) {
        if self.history.len() == self.history_max {
            self.history.pop_front();
        }
        self.history.push_back(format!("#{i} {op}"));
    }

    fn data(&mut self, len: u64) -> Vec<u8> {
        self.stamp = self.stamp.wrapping_add(1).max(1);
        let base = self.stamp;
        (0..len).map(|k| base.wrapping_add((k % 251) as u8)).collect()
    }

    fn step(&mut self, i: u64) -> Check {
        let op = self.rng.below(100);
        match op {
            0..=24 => self.op_write(i),
            25..=44 => self.op_read(i),
            45..=52 => self.op_truncate(i),
            53..=56 => self.op_fsync(i),
            57..=61 => self.op_reopen(i),
            62..=66 => self.op_append(i),
            67..=71 => self.op_mmap_read(i),
            72..=76 => self.op_mmap_write(i),
            77..=80 => self.op_fallocate(i),
            81..=82 => self.op_rename_onto(i),
            83..=92 => self.op_shared_write(i),
            _ => self.op_shared_read(i),
        }?;
        self.check_size(&format!("after #{i}"))?;
        if i % self.check_every == self.check_every - 1 {
            self.check_all(&format!("full check after #{i}"))?;
        }
        Ok(())
    }

    fn op_write(&mut self, i: u64) -> Check {
        let len = self.rng.len(self.max_len);
        let off = self.rng.below(self.max_size - len + 1);
        self.note(i, format!("pwrite off {off:#x} len {len:#x}"));
        let data = self.data(len);
        self.file.write_all_at(&data, off).map_err(|e| format!("pwrite: {e}"))?;
        apply(&mut self.model, off, &data);
        self.check_range(off, len, "pwrite")
    }

    fn op_read(&mut self, i: u64) -> Check {
        let len = self.rng.len(self.max_len);
        let end = (self.model.len() as u64).max(1) + self.max_len / 4;
        let off = self.rng.below(end);
        self.note(i, format!("pread off {off:#x} len {len:#x}"));
        self.check_range(off, len, "pread")
    }

    fn op_truncate(&mut self, i: u64) -> Check {
        let size = match self.rng.below(4) {
            0 => 0,
            1 => self.rng.below(self.model.len() as u64 + 1),
            _ => self.rng.below(self.max_size + 1),
        };
        let by_path = self.rng.below(2) == 0;
        self.note(i, format!("{} to {size:#x}", if by_path { "truncate" } else { "ftruncate" }));
        if by_path {
            let p = c_path(&self.path);
            // SAFETY: a valid C string.
            if unsafe { libc::truncate(p.as_ptr(), size as libc::off_t) } != 0 {
                return Err(format!("truncate: {}", std::io::Error::last_os_error()));
            }
        } else {
            self.file.set_len(size).map_err(|e| format!("ftruncate: {e}"))?;
        }
        self.model.resize(size as usize, 0);
        let tail = self.max_len.min(size);
        self.check_range(size - tail, tail + 1, "truncate")
    }

    fn op_fsync(&mut self, i: u64) -> Check {
        let data_only = self.rng.below(2) == 0;
        self.note(i, (if data_only { "fdatasync" } else { "fsync" }).into());
        let r = if data_only { self.file.sync_data() } else { self.file.sync_all() };
        r.map_err(|e| format!("fsync: {e}"))
    }

    fn op_reopen(&mut self, i: u64) -> Check {
        self.note(i, "close and reopen".into());
        self.file = open_rw(&self.path, false)?;
        let len = self.rng.len(self.max_len);
        let off = self.rng.below(self.model.len() as u64 + 1);
        self.check_range(off, len, "reopen")
    }

    fn op_append(&mut self, i: u64) -> Check {
        let len = self.rng.len(self.max_len.min(1 << 20));
        if self.model.len() as u64 + len > self.max_size {
            return self.op_truncate(i);
        }
        self.note(i, format!("O_APPEND write len {len:#x} at {:#x}", self.model.len()));
        let data = self.data(len);
        let f = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| format!("open O_APPEND: {e}"))?;
        use std::io::Write;
        (&f).write_all(&data).map_err(|e| format!("append: {e}"))?;
        drop(f);
        let off = self.model.len() as u64;
        apply(&mut self.model, off, &data);
        self.check_range(off, len, "append")
    }

    fn op_mmap_read(&mut self, i: u64) -> Check {
        let size = self.model.len() as u64;
        if size == 0 {
            return Ok(());
        }
        let off = self.rng.below(size);
        let len = self.rng.len(self.max_len).min(size - off);
        self.note(i, format!("mmap read off {off:#x} len {len:#x}"));
        let map = Map::new(&self.file, size as usize, false)?;
        let got = &map.bytes()[off as usize..(off + len) as usize];
        compare(got, &self.model[off as usize..(off + len) as usize], off, "mmap read")
    }

    fn op_mmap_write(&mut self, i: u64) -> Check {
        let size = self.model.len() as u64;
        if size == 0 {
            return Ok(());
        }
        let off = self.rng.below(size);
        let len = self.rng.len(self.max_len).min(size - off);
        self.note(i, format!("mmap write off {off:#x} len {len:#x} + msync"));
        let data = self.data(len);
        let mut map = Map::new(&self.file, size as usize, true)?;
        map.bytes_mut()[off as usize..(off + len) as usize].copy_from_slice(&data);
        map.sync()?;
        drop(map);
        apply(&mut self.model, off, &data);
        self.check_range(off, len, "mmap write")
    }

    fn op_fallocate(&mut self, i: u64) -> Check {
        let len = self.rng.len(self.max_len);
        let off = self.rng.below(self.max_size - len + 1);
        let keep = self.rng.below(2) == 0;
        self.note(
            i,
            format!("fallocate off {off:#x} len {len:#x}{}", if keep { " KEEP_SIZE" } else { "" }),
        );
        let mode = if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        // SAFETY: a valid descriptor.
        let rc = unsafe {
            libc::fallocate(self.file.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t)
        };
        if rc != 0 {
            return Err(format!("fallocate: {}", std::io::Error::last_os_error()));
        }
        if !keep && (self.model.len() as u64) < off + len {
            self.model.resize((off + len) as usize, 0);
        }
        Ok(())
    }

    fn op_rename_onto(&mut self, i: u64) -> Check {
        let len = self.rng.below(self.max_len.min(1 << 20) + 1);
        self.note(i, format!("rename a new file of {len:#x} bytes onto the file"));
        let data = self.data(len);
        let tmp = self.path.with_extension("new");
        fs::write(&tmp, &data).map_err(|e| format!("write {}: {e}", tmp.display()))?;
        fs::rename(&tmp, &self.path).map_err(|e| format!("rename: {e}"))?;
        // The old descriptor still reads the old file; the name is the new one.
        self.file = open_rw(&self.path, false)?;
        self.model = data;
        self.check_all("rename onto")
    }

    /// A stripe of the shared file this process owns, and an offset range in it.
    fn own_range(&mut self) -> (u64, u64) {
        let k = self.rng.below(STRIPES / u64::from(self.procs));
        let stripe = k * u64::from(self.procs) + u64::from(self.proc_index);
        let len = self.rng.len(STRIPE);
        let off = stripe * STRIPE + self.rng.below(STRIPE - len + 1);
        (off, len)
    }

    fn op_shared_write(&mut self, i: u64) -> Check {
        let (off, len) = self.own_range();
        self.note(i, format!("shared pwrite off {off:#x} len {len:#x}"));
        let data = self.data(len);
        self.shared.write_all_at(&data, off).map_err(|e| format!("shared pwrite: {e}"))?;
        apply(&mut self.shared_model, off, &data);
        self.check_shared(off, len)
    }

    fn op_shared_read(&mut self, i: u64) -> Check {
        let (off, len) = self.own_range();
        self.note(i, format!("shared pread off {off:#x} len {len:#x}"));
        self.check_shared(off, len)
    }

    /// Own bytes of the shared file; others' stripes are not compared (they
    /// become visible at their close, commit consistency).
    fn check_shared(&mut self, off: u64, len: u64) -> Check {
        let mut got = vec![0u8; len as usize];
        let n = read_at(&self.shared, &mut got, off)?;
        let mut want = vec![0u8; len as usize];
        let have = self.shared_model.len().saturating_sub(off as usize).min(len as usize);
        if have > 0 {
            want[..have].copy_from_slice(&self.shared_model[off as usize..off as usize + have]);
        }
        if n < have {
            return Err(format!(
                "shared file: read {n} bytes at {off:#x}, own data reaches {:#x}",
                off as usize + have
            ));
        }
        compare(&got[..have], &want[..have], off, "shared read")
    }

    fn check_size(&self, when: &str) -> Check {
        let fstat = self.file.metadata().map_err(|e| format!("fstat: {e}"))?.len();
        let stat = fs::metadata(&self.path).map_err(|e| format!("stat: {e}"))?.len();
        let want = self.model.len() as u64;
        if fstat != want || stat != want {
            return Err(format!(
                "{when}: fstat size {fstat:#x}, stat size {stat:#x}, model {want:#x}"
            ));
        }
        let shared = self.shared.metadata().map_err(|e| format!("fstat shared: {e}"))?.len();
        if shared < self.shared_model.len() as u64 {
            return Err(format!(
                "{when}: shared file size {shared:#x} below own data end {:#x}",
                self.shared_model.len()
            ));
        }
        Ok(())
    }

    /// Reads `len` bytes at `off` and compares them (and the short read at EOF).
    fn check_range(&self, off: u64, len: u64, what: &str) -> Check {
        let mut got = vec![0u8; len as usize];
        let n = read_at(&self.file, &mut got, off)?;
        let want_n = (self.model.len() as u64).saturating_sub(off).min(len) as usize;
        if n != want_n {
            return Err(format!(
                "{what}: read at {off:#x} len {len:#x} gave {n:#x} bytes, model {want_n:#x}"
            ));
        }
        if n == 0 {
            return Ok(());
        }
        compare(&got[..n], &self.model[off as usize..off as usize + n], off, what)
    }

    fn check_all(&self, what: &str) -> Check {
        self.check_size(what)?;
        let mut off = 0u64;
        let len = self.model.len() as u64;
        while off <= len {
            let n = (len - off).clamp(1, 4 << 20);
            self.check_range(off, n, what)?;
            off += n;
        }
        Ok(())
    }
}

fn open_rw(path: &Path, create: bool) -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(create)
        .custom_flags(0)
        .open(path)
        .map_err(|e| format!("open {}: {e}", path.display()))
}

/// Reads until `buf` is full or end of file; returns the bytes read.
fn read_at(f: &File, buf: &mut [u8], off: u64) -> Result<usize, String> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(format!("pread at {:#x}: {e}", off + n as u64)),
        }
    }
    Ok(n)
}

fn apply(model: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(data);
}

fn compare(got: &[u8], want: &[u8], base: u64, what: &str) -> Check {
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(k) => {
            let bad = got[k..].iter().zip(&want[k..]).take_while(|(a, b)| a != b).count();
            Err(format!(
                "{what}: byte {:#x} is {:#04x}, model {:#04x} ({bad} bytes differ from there)",
                base + k as u64,
                got[k],
                want[k]
            ))
        }
    }
}

/// A shared mapping of a file's first `len` bytes.
struct Map {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Map {
    fn new(f: &File, len: usize, write: bool) -> Result<Map, String> {
        let prot = if write { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_READ };
        // SAFETY: a valid descriptor; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, f.as_raw_fd(), 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(format!("mmap of {len:#x} bytes: {}", std::io::Error::last_os_error()));
        }
        Ok(Map { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` mapped bytes, alive until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, mapped writable.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast(), self.len) }
    }

    fn sync(&self) -> Check {
        // SAFETY: the mapping is ours.
        if unsafe { libc::msync(self.ptr, self.len, libc::MS_SYNC) } != 0 {
            return Err(format!("msync: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}
