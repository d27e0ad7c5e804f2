//! A run's results: built from the workers' outcomes, printed as a table,
//! written and read as JSON.

use std::fmt::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::proto::Outcome;
use super::workload::{Metric, Workload};
use super::Params;

/// Version of the JSON layout.
pub const FORMAT_VERSION: u32 = 1;

/// One rank's share of a phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    /// The rank.
    pub rank: u32,
    /// Iterations (files, transfers, mdwb iterations).
    pub items: u64,
    /// Operations.
    pub ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Its start, after the phase's earliest start.
    pub start_s: f64,
    /// Its own duration.
    pub seconds: f64,
}

/// One phase: the aggregate over ranks, and each rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    /// The phase's name.
    pub name: String,
    /// Iterations, all ranks.
    pub items: u64,
    /// Operations, all ranks.
    pub ops: u64,
    /// Bytes, all ranks.
    pub bytes: u64,
    /// Latest finish minus earliest start.
    pub seconds: f64,
    /// `ops / seconds`.
    pub ops_per_s: f64,
    /// `bytes / MiB / seconds`.
    pub mib_per_s: f64,
    /// The headline figure: `ops_per_s` or `mib_per_s`, as `unit` says.
    pub rate: f64,
    /// `ops/s` or `MiB/s`.
    pub unit: Metric,
    /// Whether `--time` ended it.
    pub stonewalled: bool,
    /// CPU seconds (user + system, all threads) the workers and the `--cpu-of`
    /// processes spent during the phase.
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// `cpu_s` per operation, in microseconds.
    #[serde(default)]
    pub cpu_us_per_op: Option<f64>,
    /// Per rank.
    pub ranks: Vec<RankReport>,
}

impl PhaseReport {
    /// Aggregates the outcomes of every rank (index = rank).
    pub fn new(name: &str, unit: Metric, stonewalled: bool, outcomes: &[Outcome]) -> PhaseReport {
        assert!(!outcomes.is_empty(), "a phase has at least one rank");
        let start = outcomes.iter().map(|o| o.start_ns).min().expect("ranks");
        let end = outcomes.iter().map(|o| o.end_ns).max().expect("ranks");
        // A phase of no work on a coarse clock would divide by zero.
        let seconds = (end.saturating_sub(start)).max(1) as f64 / 1e9;
        let items = outcomes.iter().map(|o| o.items).sum();
        let ops: u64 = outcomes.iter().map(|o| o.ops).sum();
        let bytes: u64 = outcomes.iter().map(|o| o.bytes).sum();
        let ops_per_s = ops as f64 / seconds;
        let mib_per_s = bytes as f64 / (1u64 << 20) as f64 / seconds;
        let ranks = outcomes
            .iter()
            .enumerate()
            .map(|(r, o)| RankReport {
                rank: r as u32,
                items: o.items,
                ops: o.ops,
                bytes: o.bytes,
                start_s: (o.start_ns - start) as f64 / 1e9,
                seconds: o.end_ns.saturating_sub(o.start_ns) as f64 / 1e9,
            })
            .collect();
        let rate = match unit {
            Metric::OpsPerSec => ops_per_s,
            Metric::MibPerSec => mib_per_s,
        };
        PhaseReport {
            name: name.into(),
            items,
            ops,
            bytes,
            seconds,
            ops_per_s,
            mib_per_s,
            rate,
            unit,
            stonewalled,
            cpu_s: None,
            cpu_us_per_op: None,
            ranks,
        }
    }

    /// Records `cpu_ns` of CPU time spent during the phase.
    pub fn set_cpu(&mut self, cpu_ns: u64) {
        let s = cpu_ns as f64 / 1e9;
        self.cpu_s = Some(s);
        self.cpu_us_per_op = (self.ops > 0).then(|| s * 1e6 / self.ops as f64);
    }
}

/// A whole run, as `--json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunReport {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// The pfs version that ran it.
    pub pfs_version: String,
    /// The workload.
    pub workload: Workload,
    /// The run's name in charts.
    pub label: String,
    /// TARGET as given.
    pub target: String,
    /// `posix` or `native`.
    pub target_kind: String,
    /// When it started, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Sizes and counts.
    pub params: Params,
    /// Every phase, in order; all verified.
    pub phases: Vec<PhaseReport>,
}

impl RunReport {
    /// Reads a `--json` file.
    pub fn load(path: &Path) -> Result<RunReport, String> {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let r: RunReport =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if r.format_version != FORMAT_VERSION {
            return Err(format!(
                "{}: format version {}, this pfs reads {FORMAT_VERSION}",
                path.display(),
                r.format_version
            ));
        }
        Ok(r)
    }

    /// Writes it as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let mut text = serde_json::to_vec_pretty(self).expect("a report serializes");
        text.push(b'\n');
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The sizes in words, e.g. `1000 files/proc, 3901 B`.
    pub fn sizes(&self) -> String {
        let p = &self.params;
        let mut parts = Vec::new();
        let files_word = if self.workload == Workload::Mdwb { "iterations" } else { "files" };
        let cap = if p.time_s.is_some() { " max" } else { "" };
        if let Some(f) = p.files {
            parts.push(format!("{f}{cap} {files_word}/proc"));
        }
        if let Some(w) = p.window {
            parts.push(format!("window {w}"));
        }
        if let Some(s) = p.size_bytes {
            parts.push(format!("{s} B files"));
        }
        if let Some(s) = p.segments {
            parts.push(format!("{s}{cap} segments/proc"));
        }
        if let Some(t) = p.transfer_bytes {
            parts.push(format!("{t} B transfers"));
        }
        if let Some(n) = p.particles {
            parts.push(format!("{n} particles/proc"));
        }
        if let Some(t) = p.time_s {
            parts.push(format!("stonewall {t} s"));
        }
        parts.join(", ")
    }

    /// The readable table `pfs bench` prints.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pfs bench {} on {} ({}), {} procs: {}",
            self.workload.name(),
            self.target,
            self.target_kind,
            self.params.procs,
            self.sizes()
        );
        let _ = writeln!(
            out,
            "{:<11} {:>10} {:>10} {:>9} {:>12} {:>10} {:>10}",
            "phase", "ops", "MiB", "seconds", "ops/s", "MiB/s", "CPU us/op"
        );
        for ph in &self.phases {
            let mib = ph.bytes as f64 / (1u64 << 20) as f64;
            let (mib, mib_s) = if ph.bytes == 0 {
                ("-".to_string(), "-".to_string())
            } else {
                (format!("{mib:.1}"), format!("{:.1}", ph.mib_per_s))
            };
            let mark = if ph.stonewalled { " (stonewall)" } else { "" };
            let cpu = ph.cpu_us_per_op.map_or("-".to_string(), |c| format!("{c:.1}"));
            let _ = writeln!(
                out,
                "{:<11} {:>10} {:>10} {:>9.3} {:>12.0} {:>10} {:>10}{mark}",
                ph.name, ph.ops, mib, ph.seconds, ph.ops_per_s, mib_s, cpu
            );
        }
        let _ = writeln!(out, "all phases verified");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(items: u64, bytes: u64, start_ns: u64, end_ns: u64) -> Outcome {
        Outcome { items, ops: items, bytes, start_ns, end_ns }
    }

    #[test]
    fn the_rate_spans_earliest_start_to_latest_finish() {
        let outs =
            [o(100, 0, 1_000_000_000, 1_500_000_000), o(100, 0, 1_100_000_000, 2_000_000_000)];
        let p = PhaseReport::new("create", Metric::OpsPerSec, false, &outs);
        assert_eq!(p.ops, 200);
        assert!((p.seconds - 1.0).abs() < 1e-9);
        assert!((p.rate - 200.0).abs() < 1e-6);
        assert!((p.ranks[1].start_s - 0.1).abs() < 1e-9);
        assert!((p.ranks[0].seconds - 0.5).abs() < 1e-9);
    }

    #[test]
    fn cpu_per_op_divides_by_the_operations() {
        let mut p = PhaseReport::new("create", Metric::OpsPerSec, false, &[o(200, 0, 0, 1)]);
        assert_eq!(p.cpu_us_per_op, None);
        p.set_cpu(50_000_000);
        assert_eq!(p.cpu_s, Some(0.05));
        assert!((p.cpu_us_per_op.expect("ops > 0") - 250.0).abs() < 1e-9);
    }

    #[test]
    fn bandwidth_is_in_mib() {
        let outs = [o(4, 2 << 20, 0, 500_000_000), o(4, 2 << 20, 0, 500_000_000)];
        let p = PhaseReport::new("write", Metric::MibPerSec, false, &outs);
        assert!((p.rate - 8.0).abs() < 1e-9);
        assert_eq!(p.unit.unit(), "MiB/s");
    }
}
