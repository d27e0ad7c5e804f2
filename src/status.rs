//! `pfs status`: the master's view of the cluster as a table.

use std::fmt::Write;

use pfs_core::wire::View;

/// Bytes as a short human figure (binary units).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The view as a table: one row per server, then a total line.
pub fn status_table(view: &View) -> String {
    let mut out = String::new();
    let registered = view.servers.len();
    let up = view.servers.iter().filter(|s| s.up).count();
    let _ = writeln!(
        out,
        "cluster view epoch {}: {registered} of {} servers registered, {up} up",
        view.epoch, view.servers_expected
    );
    let _ = writeln!(
        out,
        "{:<6} {:<22} {:>7} {:<6} {:>12} {:>21} {:>6} {:>19}",
        "SERVER",
        "ADDRESS",
        "WORKERS",
        "STATE",
        "LAST REPORT",
        "DATA USED / TOTAL",
        "USE%",
        "INODES USED / TOTAL"
    );
    let (mut used, mut total, mut iu, mut it) = (0u64, 0u64, 0u64, 0u64);
    for s in &view.servers {
        let u = &s.usage;
        used += u.used_bytes;
        total += u.total_bytes;
        iu += u.inodes_used;
        it += u.inodes_total;
        let last = if s.last_report_ms == u64::MAX {
            "never".to_owned()
        } else {
            format!("{:.1} s ago", s.last_report_ms as f64 / 1000.0)
        };
        let _ = writeln!(
            out,
            "{:<6} {:<22} {:>7} {:<6} {:>12} {:>21} {:>6} {:>19}",
            s.id.0,
            s.addr,
            s.workers,
            if s.up { "up" } else { "DOWN" },
            last,
            format!("{} / {}", human_bytes(u.used_bytes), human_bytes(u.total_bytes)),
            percent(u.used_bytes, u.total_bytes),
            format!("{} / {}", u.inodes_used, u.inodes_total),
        );
    }
    for missing in registered as u32..view.servers_expected {
        let _ = writeln!(out, "{missing:<6} {:<22} {:>7} {:<6}", "(not registered)", "-", "-");
    }
    let _ = writeln!(
        out,
        "total: {} of {} used ({}), {iu} of {it} inodes",
        human_bytes(used),
        human_bytes(total),
        percent(used, total)
    );
    out
}

fn percent(used: u64, total: u64) -> String {
    if total == 0 {
        "-".to_owned()
    } else {
        format!("{:.1}%", used as f64 * 100.0 / total as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pfs_core::wire::{ServerInfo, Usage};
    use pfs_core::ServerId;

    #[test]
    fn the_table_shows_health_usage_and_missing_servers() {
        let usage =
            Usage { total_bytes: 4 << 30, used_bytes: 1 << 30, inodes_total: 100, inodes_used: 7 };
        let view = View {
            epoch: 9,
            servers_expected: 3,
            servers: vec![
                ServerInfo {
                    id: ServerId(0),
                    addr: "10.0.0.1:7070".into(),
                    workers: 4,
                    up: true,
                    last_report_ms: 800,
                    usage,
                },
                ServerInfo {
                    id: ServerId(1),
                    addr: "10.0.0.2:7070".into(),
                    workers: 4,
                    up: false,
                    last_report_ms: 61_000,
                    usage: Usage::default(),
                },
            ],
        };
        let t = status_table(&view);
        assert!(t.contains("2 of 3 servers registered, 1 up"), "{t}");
        assert!(
            t.contains("10.0.0.1:7070") && t.contains("1.0 GiB / 4.0 GiB") && t.contains("25.0%"),
            "{t}"
        );
        assert!(
            t.lines().any(|l| l.contains("10.0.0.2:7070")
                && l.contains("DOWN")
                && l.contains("61.0 s ago")),
            "{t}"
        );
        assert!(t.lines().any(|l| l.starts_with('2') && l.contains("(not registered)")), "{t}");
        assert!(t.contains("total: 1.0 GiB of 4.0 GiB used (25.0%), 7 of 100 inodes"), "{t}");
        assert_eq!(human_bytes(1023), "1023 B");
    }
}
