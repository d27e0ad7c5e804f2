//! Coordinator ⇄ worker messages: one JSON object a line on the worker's stdin
//! and stdout; and the clock both sides read.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// Longest line either side accepts (a `Prepare` carries one count per rank).
pub const LINE_MAX_BYTES: usize = 1 << 20;

/// Coordinator to worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Who the worker is and where the run lives; answered by `Ready` once the
    /// target is open.
    Hello {
        /// This worker's rank, `0..procs`.
        rank: u32,
        /// The run directory, relative to the target.
        run: String,
    },
    /// Get phase `phase` ready (untimed set-up), answered by `Prepared`.
    /// `counts[r]` is what rank r made in the stonewalled phase so far (the
    /// configured count before it ran).
    Prepare {
        /// Index into the workload's phases.
        phase: usize,
        /// Per-rank counts.
        counts: Vec<u64>,
    },
    /// Start the prepared phase now (everyone is ready: the barrier).
    Go,
    /// Stonewall: finish the operation under way and report.
    Stop,
    /// Exit.
    Quit,
}

/// What one worker did in one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Loop iterations (files, transfers, mdwb iterations).
    pub items: u64,
    /// File system operations counted for the rate.
    pub ops: u64,
    /// Bytes read or written.
    pub bytes: u64,
    /// When it started ([`now_ns`]).
    pub start_ns: u64,
    /// When it finished ([`now_ns`]).
    pub end_ns: u64,
}

/// Worker to coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FromWorker {
    /// The target is open.
    Ready,
    /// The phase is set up; waiting for `Go`.
    Prepared,
    /// Iterations done so far in the running phase.
    Progress {
        /// Iterations.
        items: u64,
    },
    /// The phase finished and verified.
    Done(Outcome),
    /// The phase failed; the text says where and why.
    Failed {
        /// The error.
        error: String,
    },
}

/// Writes `msg` as one line and flushes.
pub fn send<W: Write, M: Serialize>(w: &mut W, msg: &M) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

/// Reads one message; `None` at end of input.
pub fn recv<R: BufRead + ?Sized, M: for<'de> Deserialize<'de>>(
    r: &mut R,
) -> std::io::Result<Option<M>> {
    let mut line = String::new();
    let n = std::io::Read::take(&mut *r, LINE_MAX_BYTES as u64).read_line(&mut line)?;
    if n == 0 {
        return Ok(None);
    }
    if !line.ends_with('\n') {
        return Err(std::io::Error::other(format!(
            "message longer than {LINE_MAX_BYTES} bytes or cut short"
        )));
    }
    serde_json::from_str(&line)
        .map(Some)
        .map_err(|e| std::io::Error::other(format!("bad message {:?}: {e}", line.trim_end())))
}

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the host, so
/// the earliest start and latest finish of different workers compare.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write to; CLOCK_MONOTONIC always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_lines() {
        let mut buf = Vec::new();
        send(&mut buf, &ToWorker::Prepare { phase: 2, counts: vec![5, 7] }).unwrap();
        send(&mut buf, &ToWorker::Go).unwrap();
        let mut r = std::io::Cursor::new(buf);
        let a: Option<ToWorker> = recv(&mut r).unwrap();
        let b: Option<ToWorker> = recv(&mut r).unwrap();
        let c: Option<ToWorker> = recv(&mut r).unwrap();
        assert_eq!(a, Some(ToWorker::Prepare { phase: 2, counts: vec![5, 7] }));
        assert_eq!(b, Some(ToWorker::Go));
        assert_eq!(c, None);
    }

    #[test]
    fn a_cut_or_bad_line_is_an_error() {
        let mut r = std::io::Cursor::new(b"\"Go\"".to_vec());
        assert!(recv::<_, ToWorker>(&mut r).is_err());
        let mut r = std::io::Cursor::new(b"{\"Nope\":1}\n".to_vec());
        assert!(recv::<_, ToWorker>(&mut r).is_err());
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        let b = now_ns();
        assert!(b >= a);
    }
}
