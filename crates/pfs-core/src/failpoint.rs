//! Failpoints: named places in the server where a test makes a failure happen on
//! a real process, the way FreeBSD's fail(9) and TiKV's `fail` do.
//!
//! `PFS_FAILPOINTS="name=N[,name=N...]"` in the environment makes the N-th pass
//! (counting from 1) through failpoint `name` fire, once. Unset, a pass costs one
//! load of an initialised `OnceLock` and a check of an empty list. The names:
//!
//! | name | where | what firing does |
//! |---|---|---|
//! | `shard.commit` | `Shard::start_commit` | the commit fails as a failed device sync would |
//! | `worker.panic` | a worker, before it runs a request | the worker panics |
//! | `device.read`, `device.write`, `device.sync` | the shard's device path (`DevIo`: blocking batches, data requests, commit steps) | that request fails with `EIO`, as a failing device's would |
//!
//! Some names are settings instead, read with [`setting`]: `commit.hold_ms=M` hands
//! every group-commit step's completion to its shard M ms late, without blocking
//! the worker, so a test sees requests served while a commit waits;
//! `read.hold_ms=M` does the same to finished data reads; `checkpoint.hold_ms=M`
//! holds every checkpoint's header write back M ms from the checkpoint's start,
//! so a test sees requests served while a checkpoint is under way;
//! `format.hold_ms=M` holds the last write of a format, zone 0's superblock, M
//! ms (logged), so a test can kill a first start that is formatting.
//!
//! A malformed variable is reported once on stderr and ignored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

#[derive(Debug)]
struct Point {
    name: String,
    fire_at: u64,
    passes: AtomicU64,
}

fn points() -> &'static [Point] {
    static POINTS: OnceLock<Vec<Point>> = OnceLock::new();
    POINTS.get_or_init(|| match std::env::var("PFS_FAILPOINTS") {
        Ok(spec) => parse(&spec).unwrap_or_else(|e| {
            eprintln!("PFS_FAILPOINTS={spec:?} ignored: {e}");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    })
}

fn parse(spec: &str) -> Result<Vec<Point>, String> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, n) = item.split_once('=').ok_or_else(|| format!("{item:?} is not name=N"))?;
        let fire_at: u64 = n.parse().map_err(|_| format!("{item:?}: {n:?} is not a count"))?;
        if fire_at == 0 {
            return Err(format!("{item:?}: passes count from 1"));
        }
        out.push(Point { name: name.to_owned(), fire_at, passes: AtomicU64::new(0) });
    }
    Ok(out)
}

/// The number `name=N` sets in `PFS_FAILPOINTS`, for a failpoint that is a
/// setting rather than a pass count (see the table above).
pub fn setting(name: &str) -> Option<u64> {
    points().iter().find(|p| p.name == name).map(|p| p.fire_at)
}

/// One pass through failpoint `name`: true exactly on the pass it is set to fire at.
pub fn fire(name: &str) -> bool {
    let points = points();
    if points.is_empty() {
        return false;
    }
    points
        .iter()
        .filter(|p| p.name == name)
        .any(|p| p.passes.fetch_add(1, Ordering::Relaxed) + 1 == p.fire_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_fires_once() {
        let p = parse("a=2, b=1").unwrap();
        assert_eq!((p[0].name.as_str(), p[0].fire_at), ("a", 2));
        assert_eq!((p[1].name.as_str(), p[1].fire_at), ("b", 1));
        assert!(parse("a").unwrap_err().contains("not name=N"));
        assert!(parse("a=x").unwrap_err().contains("not a count"));
        assert!(parse("a=0").unwrap_err().contains("from 1"));
        // Unset in the test environment: never fires.
        assert!(!fire("shard.commit"));
    }
}
