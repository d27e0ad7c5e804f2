//! Runs a durable workload on one shard over a real file with `UringDevice`, and
//! prints `durable N` after file N is committed. The SIGKILL crash test kills it at
//! a random moment and checks every file it reported durable.
//!
//! Usage: pfs-shard-torture --file PATH --size BYTES [--format] --start N --count N

use std::io::Write;
use std::process::ExitCode;

use pfs_core::{InodeId, ShardId};
use pfs_store::device::{UringDevice, UringOptions};
use pfs_store::{CreateArgs, FormatOptions, Shard, ShardOptions};

/// The bytes of workload file `i`: a size and pattern derived from `i`.
fn content(i: u64) -> Vec<u8> {
    let len = (i * 7919 % 150_000 + 1) as usize;
    (0..len).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

fn usage() -> ExitCode {
    eprintln!("usage: pfs-shard-torture --file PATH --size BYTES [--format] --start N --count N");
    eprintln!("Writes files f<N>.. with known contents, committing each; prints 'durable N'.");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut file, mut size, mut format, mut start, mut count) = (None, None, false, 0u64, 0u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned();
        match a.as_str() {
            "--file" => file = val(),
            "--size" => size = val().and_then(|v| v.parse::<u64>().ok()),
            "--format" => format = true,
            "--start" => start = val().and_then(|v| v.parse().ok()).unwrap_or(0),
            "--count" => count = val().and_then(|v| v.parse().ok()).unwrap_or(0),
            "--help" | "-h" => return usage(),
            other => {
                eprintln!("unknown argument {other:?}");
                return usage();
            }
        }
    }
    let (Some(file), Some(size)) = (file, size) else { return usage() };
    let opts = UringOptions {
        queue_depth: 64,
        registered_buffers: 16,
        registered_buffer_size: 1 << 20,
        spare_buffers: 16,
        size_bytes: Some(size),
        preallocate: false,
        submit_below: pfs_store::device::SUBMIT_BELOW,
    };
    let dev = match UringDevice::open(&file, opts) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pfs-shard-torture: {e}");
            return ExitCode::FAILURE;
        }
    };
    let shard = if format {
        Shard::format(dev, &FormatOptions::new(ShardId(0), size), ShardOptions::default())
    } else {
        Shard::open(dev, 0, ShardOptions::default())
    };
    let mut shard = match shard {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pfs-shard-torture: {file}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    for i in start..start + count {
        let name = format!("f{i}");
        let result = (|| {
            let attr = shard.create(InodeId::ROOT, name.as_bytes(), CreateArgs::file(0o644))?;
            let data = content(i);
            for (k, chunk) in data.chunks(20_000).enumerate() {
                shard.write(attr.ino, (k * 20_000) as u64, chunk)?;
            }
            shard.fsync(attr.ino)
        })();
        if let Err(e) = result {
            eprintln!("pfs-shard-torture: file {name}: {e}");
            return ExitCode::FAILURE;
        }
        // Only now may anyone rely on it.
        if writeln!(out, "durable {i}").and_then(|_| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
