//! What one worker does in each phase: untimed set-up, [`Control::go`] (the
//! barrier), the timed loop, then checks that need not be timed. Every read is
//! checked against the pattern its owner wrote.

use super::particles;
use super::pattern::{self, PatternKey};
use super::proto::{now_ns, Outcome};
use super::target::Target;
use super::workload::{
    ckpt_file, expect_file, io_easy_file, io_hard_file, io_hard_offset, peer, rank_dir, set_path,
    shared_dir, Workload,
};
use super::{BenchError, Params};

/// A worker's link to the coordinator while a phase runs.
pub trait Control {
    /// Reports "set up" and waits for everyone (the barrier); the start time.
    fn go(&self) -> Result<u64, BenchError>;
    /// Whether the stonewall fell: a stonewalled loop stops at the next item.
    fn stopped(&self) -> bool;
    /// Items done so far, for the progress bar.
    fn progress(&self, items: u64);
}

/// Everything a phase needs.
pub struct Ctx<'a, T: Target> {
    /// The target.
    pub t: &'a T,
    /// This worker's rank.
    pub rank: u32,
    /// The run directory.
    pub run: &'a str,
    /// Sizes and counts.
    pub p: &'a Params,
    /// Per-rank counts of the stonewalled phase.
    pub counts: &'a [u64],
    /// The coordinator.
    pub ctl: &'a dyn Control,
}

impl<T: Target> std::fmt::Debug for Ctx<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx").field("rank", &self.rank).field("run", &self.run).finish()
    }
}

impl<T: Target> Ctx<'_, T> {
    fn peer(&self) -> u32 {
        peer(self.rank, self.p.procs)
    }
}

/// Counts of a running loop.
#[derive(Debug, Default)]
struct Tally {
    items: u64,
    ops: u64,
    bytes: u64,
}

impl Tally {
    fn outcome(&self, start_ns: u64, end_ns: u64) -> Outcome {
        Outcome { items: self.items, ops: self.ops, bytes: self.bytes, start_ns, end_ns }
    }
}

/// Runs phase `phase` of `w` as rank `cx.rank`.
pub fn run<T: Target>(w: Workload, phase: usize, cx: &Ctx<'_, T>) -> Result<Outcome, BenchError> {
    let def = w.phases()[phase];
    let items = w.items(phase, cx.rank, cx.p, cx.counts);
    // Only a stonewalled phase listens to the stonewall.
    let stop = || def.stonewall && cx.ctl.stopped();
    match (w, def.name) {
        (Workload::MdEasy, "create") => md_create(cx, items, 0, &stop),
        (Workload::MdEasy, "stat") => md_easy_stat(cx, items),
        (Workload::MdEasy, "remove") => md_remove(cx, items, w),
        (Workload::MdHard, "create") => md_create(cx, items, cx.p.size_bytes.expect("size"), &stop),
        (Workload::MdHard, "stat") => md_hard_stat(cx, items),
        (Workload::MdHard, "read") => md_hard_read(cx, items),
        (Workload::MdHard, "remove") => md_remove(cx, items, w),
        (Workload::IoEasy | Workload::IoHard, "write") => io_write(cx, w, items, &stop),
        (Workload::IoEasy | Workload::IoHard, "read") => io_read(cx, w, items),
        (Workload::Mdwb, "precreate") => mdwb_precreate(cx, items),
        (Workload::Mdwb, "mixed") => mdwb_mixed(cx, items, &stop),
        (Workload::Mdwb, "cleanup") => mdwb_cleanup(cx, items),
        (Workload::Ckpt, "checkpoint") => ckpt_write(cx),
        (Workload::Ckpt, "restart") => ckpt_read(cx),
        (w, name) => unreachable!("{} has no phase {name}", w.name()),
    }
}

/// md-easy and md-hard create: files `0..items` of this rank, `size` bytes each.
fn md_create<T: Target>(
    cx: &Ctx<'_, T>,
    items: u64,
    size: u64,
    stop: &dyn Fn() -> bool,
) -> Result<Outcome, BenchError> {
    let (t, r) = (cx.t, cx.rank);
    let shared = shared_dir(cx.run);
    let mut buf = vec![0u8; size as usize];
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items && !stop() {
        let i = n.items;
        if size == 0 {
            set_path(&mut path, format_args!("{}/d{r}/f{i}", cx.run));
        } else {
            set_path(&mut path, format_args!("{shared}/f{r}.{i}"));
        }
        let mut f = t.create(&path)?;
        if size > 0 {
            pattern::fill(&mut buf, PatternKey::new(r, i), 0);
            t.write_at(&mut f, 0, &buf)?;
        }
        t.close(f)?;
        n.items += 1;
        n.ops += 1;
        n.bytes += size;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

/// The path of the peer's file `i` in md-easy or md-hard.
fn md_peer_path<T: Target>(cx: &Ctx<'_, T>, w: Workload, path: &mut String, i: u64) {
    let p = cx.peer();
    match w {
        Workload::MdEasy => set_path(path, format_args!("{}/d{p}/f{i}", cx.run)),
        _ => set_path(path, format_args!("{}/shared/f{p}.{i}", cx.run)),
    }
}

fn md_easy_stat<T: Target>(cx: &Ctx<'_, T>, items: u64) -> Result<Outcome, BenchError> {
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items {
        md_peer_path(cx, Workload::MdEasy, &mut path, n.items);
        expect_file(cx.t, &path, 0)?;
        n.items += 1;
        n.ops += 1;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

fn md_hard_stat<T: Target>(cx: &Ctx<'_, T>, items: u64) -> Result<Outcome, BenchError> {
    let size = cx.p.size_bytes.expect("size");
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items {
        md_peer_path(cx, Workload::MdHard, &mut path, n.items);
        expect_file(cx.t, &path, size)?;
        n.items += 1;
        n.ops += 1;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

/// Reads file `path` whole into `buf` (which must be one byte longer than the
/// expected `size`, to see a file that is too long) and checks it holds `size`
/// bytes of `key`'s pattern.
pub fn read_and_verify<T: Target>(
    t: &T,
    path: &str,
    key: PatternKey,
    size: u64,
    buf: &mut [u8],
) -> Result<(), BenchError> {
    assert_eq!(buf.len() as u64, size + 1, "buffer of size + 1 bytes");
    let mut f = t.open(path, false)?;
    let got = t.read_at(&mut f, 0, buf);
    t.close(f)?;
    let got = got? as u64;
    if got != size {
        return Err(BenchError::verify(path, format!("read {got} bytes, expected {size}")));
    }
    pattern::check(&buf[..size as usize], key, 0)
        .map_err(|m| BenchError::verify(path, m.to_string()))
}

fn md_hard_read<T: Target>(cx: &Ctx<'_, T>, items: u64) -> Result<Outcome, BenchError> {
    let size = cx.p.size_bytes.expect("size");
    let mut buf = vec![0u8; size as usize + 1];
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items {
        md_peer_path(cx, Workload::MdHard, &mut path, n.items);
        read_and_verify(cx.t, &path, PatternKey::new(cx.peer(), n.items), size, &mut buf)?;
        n.items += 1;
        n.ops += 1;
        n.bytes += size;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

fn md_remove<T: Target>(cx: &Ctx<'_, T>, items: u64, w: Workload) -> Result<Outcome, BenchError> {
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items {
        md_peer_path(cx, w, &mut path, n.items);
        cx.t.unlink(&path)?;
        n.items += 1;
        n.ops += 1;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

/// io-easy and io-hard write: `items` transfers of this rank, then close.
fn io_write<T: Target>(
    cx: &Ctx<'_, T>,
    w: Workload,
    items: u64,
    stop: &dyn Fn() -> bool,
) -> Result<Outcome, BenchError> {
    let (t, r, procs) = (cx.t, cx.rank, cx.p.procs);
    let tr = cx.p.transfer_bytes.expect("transfer");
    let mut buf = vec![0u8; tr as usize];
    let key = PatternKey::new(r, 0);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    let mut f = match w {
        Workload::IoEasy => t.create(&io_easy_file(cx.run, r))?,
        _ => t.open(&io_hard_file(cx.run), true)?,
    };
    while n.items < items && !stop() {
        let off = match w {
            Workload::IoEasy => n.items * tr,
            _ => io_hard_offset(n.items, r, procs, tr),
        };
        pattern::fill(&mut buf, key, off);
        t.write_at(&mut f, off, &buf)?;
        n.items += 1;
        n.ops += 1;
        n.bytes += tr;
        cx.ctl.progress(n.items);
    }
    t.close(f)?;
    Ok(n.outcome(start, now_ns()))
}

/// io-easy and io-hard read: the peer's `items` transfers, each checked.
fn io_read<T: Target>(cx: &Ctx<'_, T>, w: Workload, items: u64) -> Result<Outcome, BenchError> {
    let (t, procs, p) = (cx.t, cx.p.procs, cx.peer());
    let tr = cx.p.transfer_bytes.expect("transfer");
    let mut buf = vec![0u8; tr as usize];
    let key = PatternKey::new(p, 0);
    let path = match w {
        Workload::IoEasy => io_easy_file(cx.run, p),
        _ => io_hard_file(cx.run),
    };
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    let mut f = t.open(&path, false)?;
    while n.items < items {
        let off = match w {
            Workload::IoEasy => n.items * tr,
            _ => io_hard_offset(n.items, p, procs, tr),
        };
        let got = t.read_at(&mut f, off, &mut buf)?;
        if got as u64 != tr {
            let what = format!("short read at offset {off}: {got} of {tr} bytes");
            return Err(BenchError::verify(&path, what));
        }
        pattern::check(&buf, key, off).map_err(|m| BenchError::verify(&path, m.to_string()))?;
        n.items += 1;
        n.ops += 1;
        n.bytes += tr;
        cx.ctl.progress(n.items);
    }
    if w == Workload::IoEasy {
        // The file ends where the writer stopped.
        let got = t.read_at(&mut f, items * tr, &mut buf[..1])?;
        if got != 0 {
            let what = format!("data past the end of what was written ({} bytes)", items * tr);
            return Err(BenchError::verify(&path, what));
        }
    }
    t.close(f)?;
    Ok(n.outcome(start, now_ns()))
}

/// Creates `path` with `size` bytes of `key`'s pattern.
fn write_small<T: Target>(
    t: &T,
    path: &str,
    key: PatternKey,
    buf: &mut [u8],
) -> Result<(), BenchError> {
    pattern::fill(buf, key, 0);
    let mut f = t.create(path)?;
    t.write_at(&mut f, 0, buf)?;
    t.close(f)?;
    Ok(())
}

fn mdwb_precreate<T: Target>(cx: &Ctx<'_, T>, items: u64) -> Result<Outcome, BenchError> {
    let (t, r) = (cx.t, cx.rank);
    let size = cx.p.size_bytes.expect("size");
    let dir = rank_dir(cx.run, r);
    let mut buf = vec![0u8; size as usize];
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items {
        set_path(&mut path, format_args!("{dir}/f{}", n.items));
        write_small(t, &path, PatternKey::new(r, n.items), &mut buf)?;
        n.items += 1;
        n.ops += 1;
        n.bytes += size;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

/// Iteration k on the peer's directory: stat, read and remove its oldest file
/// `k`, create file `k + window`. The peer's pattern keys every file of its
/// directory, whoever wrote it.
fn mdwb_mixed<T: Target>(
    cx: &Ctx<'_, T>,
    items: u64,
    stop: &dyn Fn() -> bool,
) -> Result<Outcome, BenchError> {
    let (t, p) = (cx.t, cx.peer());
    let size = cx.p.size_bytes.expect("size");
    let window = cx.p.window.expect("window");
    let dir = rank_dir(cx.run, p);
    let mut buf = vec![0u8; size as usize + 1];
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items && !stop() {
        let k = n.items;
        set_path(&mut path, format_args!("{dir}/f{k}"));
        expect_file(t, &path, size)?;
        read_and_verify(t, &path, PatternKey::new(p, k), size, &mut buf)?;
        t.unlink(&path)?;
        set_path(&mut path, format_args!("{dir}/f{}", k + window));
        write_small(t, &path, PatternKey::new(p, k + window), &mut buf[..size as usize])?;
        n.items += 1;
        n.ops += 4;
        n.bytes += 2 * size;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

/// Reads and removes the window left in the peer's directory: files
/// `counts[rank]..counts[rank] + window` (this rank ran the mixed phase there).
fn mdwb_cleanup<T: Target>(cx: &Ctx<'_, T>, items: u64) -> Result<Outcome, BenchError> {
    let (t, p) = (cx.t, cx.peer());
    let size = cx.p.size_bytes.expect("size");
    let first = cx.counts[cx.rank as usize];
    let dir = rank_dir(cx.run, p);
    let mut buf = vec![0u8; size as usize + 1];
    let mut path = String::with_capacity(256);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    while n.items < items {
        let i = first + n.items;
        set_path(&mut path, format_args!("{dir}/f{i}"));
        read_and_verify(t, &path, PatternKey::new(p, i), size, &mut buf)?;
        t.unlink(&path)?;
        n.items += 1;
        n.ops += 2;
        n.bytes += size;
        cx.ctl.progress(n.items);
    }
    Ok(n.outcome(start, now_ns()))
}

/// The transfers of a checkpoint: (offset, length) of each write or read.
fn ckpt_pieces(p: &Params) -> impl Iterator<Item = (u64, u64)> {
    let n = p.particles.expect("particles");
    let tr = p.transfer_bytes.expect("transfer");
    (0..particles::ARRAYS.len()).flat_map(move |a| {
        let r = particles::array_range(a, n);
        (r.start..r.end).step_by(tr as usize).map(move |o| (o, tr.min(r.end - o)))
    })
}

fn ckpt_write<T: Target>(cx: &Ctx<'_, T>) -> Result<Outcome, BenchError> {
    let t = cx.t;
    // The application holds its arrays before it checkpoints them.
    let data = particles::generate(cx.rank, cx.p.particles.expect("particles"));
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    let mut f = t.create(&ckpt_file(cx.run, cx.rank))?;
    for (off, len) in ckpt_pieces(cx.p) {
        t.write_at(&mut f, off, &data[off as usize..(off + len) as usize])?;
        n.items += 1;
        n.ops += 1;
        n.bytes += len;
        cx.ctl.progress(n.items);
    }
    t.close(f)?;
    Ok(n.outcome(start, now_ns()))
}

fn ckpt_read<T: Target>(cx: &Ctx<'_, T>) -> Result<Outcome, BenchError> {
    let (t, p) = (cx.t, cx.peer());
    let particles_n = cx.p.particles.expect("particles");
    let path = ckpt_file(cx.run, p);
    let mut data = vec![0u8; particles::file_bytes(particles_n) as usize + 1];
    // The application allocates its arrays before it restarts into them, as it
    // generates them before it checkpoints: touch every page now, so the timed
    // part reads into memory that exists (fio's buffer does) and not into pages
    // the kernel has yet to fault in and clear.
    prefault(&mut data);
    let mut n = Tally::default();
    let start = cx.ctl.go()?;
    let mut f = t.open(&path, false)?;
    for (off, len) in ckpt_pieces(cx.p) {
        let got = t.read_at(&mut f, off, &mut data[off as usize..(off + len) as usize])?;
        if got as u64 != len {
            let what = format!("short read at offset {off}: {got} of {len} bytes");
            return Err(BenchError::verify(&path, what));
        }
        n.items += 1;
        n.ops += 1;
        n.bytes += len;
        cx.ctl.progress(n.items);
    }
    let end = data.len() - 1;
    let past = t.read_at(&mut f, end as u64, &mut data[end..])?;
    t.close(f)?;
    let end_ns = now_ns();
    if past != 0 {
        return Err(BenchError::verify(&path, format!("data past the checkpoint's {end} bytes")));
    }
    // Restart checks every particle, outside the timed part.
    particles::verify(&data[..end], p, particles_n).map_err(|e| BenchError::verify(&path, e))?;
    Ok(n.outcome(start, end_ns))
}

/// Writes to every page of `buf`, so none is faulted in later.
fn prefault(buf: &mut [u8]) {
    const PAGE: usize = 4096;
    for i in (0..buf.len()).step_by(PAGE) {
        // SAFETY: `i` is in bounds; a volatile write keeps the store.
        unsafe { std::ptr::write_volatile(buf.as_mut_ptr().add(i), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::target::PosixTarget;

    /// A fresh directory, removed on drop.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let p = std::env::temp_dir().join(format!("pfs-bench-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn good_file(dir: &std::path::Path, name: &str, key: PatternKey, size: usize) {
        let mut data = vec![0u8; size];
        pattern::fill(&mut data, key, 0);
        std::fs::write(dir.join(name), data).unwrap();
    }

    #[test]
    fn a_good_file_verifies() {
        let s = Scratch::new("good");
        let t = PosixTarget::new(&s.0).unwrap();
        good_file(&s.0, "f", PatternKey::new(1, 7), 3901);
        let mut buf = vec![0u8; 3902];
        read_and_verify(&t, "f", PatternKey::new(1, 7), 3901, &mut buf).unwrap();
    }

    #[test]
    fn a_corrupt_byte_is_reported_with_file_and_offset() {
        let s = Scratch::new("corrupt");
        let t = PosixTarget::new(&s.0).unwrap();
        good_file(&s.0, "f", PatternKey::new(1, 7), 3901);
        let mut data = std::fs::read(s.0.join("f")).unwrap();
        data[1234] = data[1234].wrapping_add(1);
        std::fs::write(s.0.join("f"), data).unwrap();
        let mut buf = vec![0u8; 3902];
        let e = read_and_verify(&t, "f", PatternKey::new(1, 7), 3901, &mut buf).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, BenchError::Verify { .. }), "{msg}");
        assert!(msg.contains("f: wrong content at offset 1234"), "{msg}");
    }

    #[test]
    fn a_file_of_another_rank_or_size_is_caught() {
        let s = Scratch::new("other");
        let t = PosixTarget::new(&s.0).unwrap();
        good_file(&s.0, "mine", PatternKey::new(0, 7), 3901);
        good_file(&s.0, "long", PatternKey::new(1, 7), 3902);
        good_file(&s.0, "short", PatternKey::new(1, 7), 100);
        let mut buf = vec![0u8; 3902];
        let e = read_and_verify(&t, "mine", PatternKey::new(1, 7), 3901, &mut buf).unwrap_err();
        assert!(e.to_string().contains("mine: wrong content at offset 0"), "{e}");
        let e = read_and_verify(&t, "long", PatternKey::new(1, 7), 3901, &mut buf).unwrap_err();
        assert!(e.to_string().contains("long: read 3902 bytes, expected 3901"), "{e}");
        let e = read_and_verify(&t, "short", PatternKey::new(1, 7), 3901, &mut buf).unwrap_err();
        assert!(e.to_string().contains("short: read 100 bytes, expected 3901"), "{e}");
        let e = read_and_verify(&t, "missing", PatternKey::new(1, 7), 3901, &mut buf).unwrap_err();
        assert!(matches!(e, BenchError::Target(ref t) if t.is_not_found()), "{e}");
    }

    #[test]
    fn stat_checks_type_and_size() {
        let s = Scratch::new("stat");
        let t = PosixTarget::new(&s.0).unwrap();
        good_file(&s.0, "f", PatternKey::new(0, 0), 10);
        std::fs::create_dir(s.0.join("d")).unwrap();
        expect_file(&t, "f", 10).unwrap();
        assert!(expect_file(&t, "f", 0)
            .unwrap_err()
            .to_string()
            .contains("f: size 10, expected 0"));
        assert!(expect_file(&t, "d", 0).unwrap_err().to_string().contains("not a regular file"));
    }
}
