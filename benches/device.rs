//! `UringDevice` throughput, comparable with fio (`benches/device-vs-fio.sh`).
//!
//! ```text
//! cargo bench --bench device -- --file /data/pfs-bench.img \
//!     [--workload randread|randwrite|read|write|all] [--qd 32] [--runtime 10] \
//!     [--submit-below 8]
//! ```
//!
//! One thread keeps `qd` requests in flight on registered buffers for `runtime` seconds
//! (4 KiB random read and write, 1 MiB sequential read and write, like fio's
//! `--rw=randread --bs=4k` etc.) and prints one line per workload:
//! `workload=randread bs=4096 qd=32 seconds=10.00 ios=... iops=... mib_s=...`.
//! `--submit-below` is `UringOptions::submit_below` (0: every request waits
//! for the next `wait`, batched).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pfs_store::device::{
    Device, IoCompletion, IoKind, IoRequest, UringDevice, UringOptions, SUBMIT_BELOW,
};

#[derive(Clone, Copy, Debug)]
struct Workload {
    name: &'static str,
    kind: IoKind,
    random: bool,
    block_bytes: usize,
}

const WORKLOADS: [Workload; 4] = [
    Workload { name: "randread", kind: IoKind::Read, random: true, block_bytes: 4096 },
    Workload { name: "randwrite", kind: IoKind::Write, random: true, block_bytes: 4096 },
    Workload { name: "read", kind: IoKind::Read, random: false, block_bytes: 1 << 20 },
    Workload { name: "write", kind: IoKind::Write, random: false, block_bytes: 1 << 20 },
];

#[derive(Debug)]
struct Args {
    file: PathBuf,
    workloads: Vec<Workload>,
    queue_depth: usize,
    runtime: Duration,
    submit_below: usize,
}

fn usage(msg: &str) -> ! {
    eprintln!("error: {msg}");
    eprintln!(
        "usage: device --file PATH [--workload randread|randwrite|read|write|all] \
         [--qd N] [--runtime SECONDS] [--submit-below N]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut file = None;
    let mut workload = "all".to_string();
    let mut queue_depth = 32;
    let mut submit_below = SUBMIT_BELOW;
    let mut runtime_s = 10.0;
    let mut runtime_explicit = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage(&format!("{arg} needs a value")));
        match arg.as_str() {
            "--file" => file = Some(PathBuf::from(value())),
            "--workload" => workload = value(),
            "--qd" => queue_depth = value().parse().unwrap_or_else(|_| usage("bad --qd")),
            "--submit-below" => {
                submit_below = value().parse().unwrap_or_else(|_| usage("bad --submit-below"))
            }
            "--runtime" => {
                runtime_s = value().parse().unwrap_or_else(|_| usage("bad --runtime"));
                runtime_explicit = Some(runtime_s);
            }
            // `cargo bench` passes `--bench`; filters are not used.
            "--bench" => {}
            other => usage(&format!("unknown argument {other}")),
        }
    }
    let file = match file {
        Some(f) => f,
        // Plain `cargo bench` runs every bench with no arguments: a short run on a
        // default file in target/ (laid out on first use), so the device is
        // measured there too; device-vs-fio.sh passes its own file and runtime.
        None => {
            if runtime_explicit.is_none() {
                runtime_s = 3.0;
            }
            default_file()
        }
    };
    let workloads = if workload == "all" {
        WORKLOADS.to_vec()
    } else {
        let w = WORKLOADS.iter().find(|w| w.name == workload);
        vec![*w.unwrap_or_else(|| usage(&format!("unknown workload {workload}")))]
    };
    let runtime = Duration::from_secs_f64(runtime_s);
    Args { file, workloads, queue_depth, runtime, submit_below }
}

/// Size of the file `cargo bench` uses when no `--file` is given.
const DEFAULT_FILE_BYTES: u64 = 512 << 20;

/// `target/bench-dev/device-bench.img`, written in full the first time (a sparse
/// file would read holes, not the disk).
fn default_file() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-dev");
    let path = dir.join("device-bench.img");
    let laid_out = std::fs::metadata(&path).map(|m| m.len() >= DEFAULT_FILE_BYTES);
    if !matches!(laid_out, Ok(true)) {
        eprintln!("device: laying out {} ({} MiB)", path.display(), DEFAULT_FILE_BYTES >> 20);
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let mut f = std::fs::File::create(&path)?;
            let chunk = vec![0x5au8; 1 << 20];
            for _ in 0..DEFAULT_FILE_BYTES >> 20 {
                std::io::Write::write_all(&mut f, &chunk)?;
            }
            f.sync_all()
        };
        if let Err(e) = write() {
            usage(&format!("cannot lay out {}: {e}; give --file", path.display()));
        }
    }
    eprintln!("device: no --file given: using {}", path.display());
    path
}

/// xorshift64*: cheap offsets, like fio's default random generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

struct Report {
    ios: u64,
    elapsed: Duration,
}

fn run(args: &Args, w: Workload) -> Report {
    let opts = UringOptions {
        queue_depth: args.queue_depth,
        registered_buffers: args.queue_depth,
        registered_buffer_size: w.block_bytes,
        spare_buffers: 0,
        size_bytes: None,
        preallocate: true,
        submit_below: args.submit_below,
    };
    let mut dev = UringDevice::open(&args.file, opts).unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1)
    });
    let blocks = dev.size_bytes() / w.block_bytes as u64;
    assert!(blocks > 0, "file smaller than one block");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut next_block = 0u64;
    let mut next_offset = || {
        let block = if w.random {
            rng.next() % blocks
        } else {
            let b = next_block;
            next_block = (next_block + 1) % blocks;
            b
        };
        block * w.block_bytes as u64
    };

    for tag in 0..args.queue_depth as u64 {
        let mut buf = dev.alloc_buf(w.block_bytes);
        assert!(buf.fixed_index().is_some(), "registered buffer");
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(tag as u8);
        }
        let req = IoRequest { tag, kind: w.kind, offset: next_offset(), buf };
        dev.submit(req).expect("queue has room");
    }

    let mut done: Vec<IoCompletion> = Vec::with_capacity(args.queue_depth);
    let mut ios = 0u64;
    let start = Instant::now();
    let deadline = start + args.runtime;
    loop {
        done.clear();
        dev.wait(&mut done, 1);
        let now = Instant::now();
        for c in done.drain(..) {
            if let Err(e) = c.result {
                eprintln!("error: {} on {}: {e}", w.name, args.file.display());
                std::process::exit(1);
            }
            ios += 1;
            if now < deadline {
                let req = IoRequest { tag: c.tag, kind: w.kind, offset: next_offset(), buf: c.buf };
                dev.submit(req).expect("a slot was just freed");
            } else {
                dev.free_buf(c.buf);
            }
        }
        if now >= deadline {
            let elapsed = now - start;
            // Drain what is still in flight; not counted.
            while dev.in_flight() > 0 {
                dev.wait(&mut done, 1);
                for c in done.drain(..) {
                    dev.free_buf(c.buf);
                }
            }
            return Report { ios, elapsed };
        }
    }
}

fn main() {
    let args = parse_args();
    for &w in &args.workloads {
        let r = run(&args, w);
        let seconds = r.elapsed.as_secs_f64();
        let iops = r.ios as f64 / seconds;
        let mib_s = iops * w.block_bytes as f64 / (1024.0 * 1024.0);
        println!(
            "workload={} bs={} qd={} seconds={seconds:.2} ios={} iops={iops:.0} mib_s={mib_s:.1}",
            w.name, w.block_bytes, args.queue_depth, r.ios
        );
    }
}
