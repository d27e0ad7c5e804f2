//! CPU time of processes, from `/proc/PID/stat`: what a phase cost, summed over
//! the workers and the file system's processes on this host.

/// User plus system CPU time of process `pid`, all its threads, in nanoseconds.
pub fn process_cpu_ns(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    parse_stat(&text).ok_or_else(|| format!("{path}: not the stat format this reads"))
}

/// The utime + stime of one `/proc/PID/stat` line, in nanoseconds.
fn parse_stat(text: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses itself: the fields that follow start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    // Fields 3.. follow; utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime).saturating_mul(1_000_000_000) / clock_ticks())
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// The summed CPU time of `pids`; the first error names the process.
pub fn total_cpu_ns(pids: &[u32]) -> Result<u64, String> {
    pids.iter().try_fold(0u64, |sum, &p| Ok(sum + process_cpu_ns(p)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_utime_and_stime_after_an_odd_command_name() {
        let ticks = clock_ticks();
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 2 3";
        assert_eq!(parse_stat(line), Some(300 * 1_000_000_000 / ticks));
        assert_eq!(parse_stat("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_spends_cpu() {
        let me = std::process::id();
        let before = process_cpu_ns(me).expect("own stat");
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let after = process_cpu_ns(me).expect("own stat");
        assert!(after > before, "100 ms of spinning shows as CPU time ({before} -> {after})");
        assert!(process_cpu_ns(u32::MAX).is_err());
    }
}
