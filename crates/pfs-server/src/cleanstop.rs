//! The clean-stop mark: a server that stopped cleanly (every worker drained,
//! committed and checkpointed) keeps its boot id for its next start, so
//! clients whose changes it acknowledged can still `fsync` them after a
//! `systemctl restart` instead of getting `EIO` (docs/reliability.md, "Boot
//! ids").
//!
//! The mark is a small text file beside a file-backed data path
//! (`<data_path>.clean-stop`; a block device gets none, and every start a new
//! boot id, as before). It names the boot id and, per zone, the format id and
//! the generation of the checkpoint the stop wrote. A start takes the mark
//! (reads it and removes it, durably, before it serves), and keeps the boot id
//! only if every zone opens from exactly that checkpoint with no log record to
//! replay: a crash after the start finds no mark, and a data file formatted,
//! restored or written to since does not match.

use std::io::Write;
use std::path::{Path, PathBuf};

/// First line of a mark.
const MAGIC: &str = "pfs clean stop 1";
/// Longest mark read (a line per zone; 256 workers at most).
const MARK_BYTES_MAX: u64 = 64 * 1024;

/// What a clean stop left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The boot id the server had.
    pub boot: u64,
    /// Per zone, in worker order: its format id and checkpoint generation.
    pub zones: Vec<(u64, u64)>,
    /// File lock ranges the workers kept at the stop (`None`: a mark of an
    /// older version, which did not say): with none, the next start needs no
    /// grace period for reclaims.
    pub locks_held: Option<u64>,
}

impl Mark {
    fn encode(&self) -> String {
        let mut s = format!("{MAGIC}\nboot {:016x}\n", self.boot);
        if let Some(n) = self.locks_held {
            s.push_str(&format!("locks {n}\n"));
        }
        for (w, (format, gen)) in self.zones.iter().enumerate() {
            s.push_str(&format!("zone {w} {format:016x} {gen}\n"));
        }
        let sum = crc32c::crc32c(s.as_bytes());
        s.push_str(&format!("crc {sum:08x}\n"));
        s
    }

    fn decode(text: &str) -> Result<Mark, String> {
        let body_end = text.rfind("crc ").ok_or("no checksum line")?;
        let (body, crc_line) = text.split_at(body_end);
        let want = u32::from_str_radix(crc_line.trim_start_matches("crc ").trim(), 16)
            .map_err(|_| "bad checksum line")?;
        if crc32c::crc32c(body.as_bytes()) != want {
            return Err("checksum mismatch".into());
        }
        let mut lines = body.lines();
        if lines.next() != Some(MAGIC) {
            return Err(format!("first line is not {MAGIC:?}"));
        }
        let boot = lines
            .next()
            .and_then(|l| l.strip_prefix("boot "))
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or("no boot line")?;
        let mut lines = lines.peekable();
        let locks_held = match lines.peek().and_then(|l| l.strip_prefix("locks ")) {
            Some(n) => {
                let n = n.parse().map_err(|_| "bad locks line")?;
                lines.next();
                Some(n)
            }
            None => None,
        };
        let mut zones = Vec::new();
        for (w, line) in lines.enumerate() {
            let f: Vec<&str> = line.split(' ').collect();
            let ok = f.len() == 4 && f[0] == "zone" && f[1] == w.to_string();
            let format = u64::from_str_radix(f.get(2).unwrap_or(&""), 16).ok();
            let gen = f.get(3).and_then(|g| g.parse().ok());
            match (ok, format, gen) {
                (true, Some(format), Some(gen)) => zones.push((format, gen)),
                _ => return Err(format!("bad zone line {line:?}")),
            }
        }
        Ok(Mark { boot, zones, locks_held })
    }

    /// Whether zones that opened as `opened` (per zone: format id, the
    /// generation opened from, records replayed) are the ones this mark
    /// describes, untouched since.
    pub fn matches(&self, opened: &[(u64, u64, u64)]) -> bool {
        self.zones.len() == opened.len()
            && self
                .zones
                .iter()
                .zip(opened)
                .all(|(&(f, g), &(of, og, replayed))| f == of && g == og && replayed == 0)
    }
}

/// Where the mark of `data_path` lives: beside it when it is a regular file.
pub fn mark_path(data_path: &Path) -> Option<PathBuf> {
    let meta = std::fs::metadata(data_path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut name = data_path.file_name()?.to_os_string();
    name.push(".clean-stop");
    Some(data_path.with_file_name(name))
}

/// Takes the mark at `path`: reads it and removes it durably. `None` when
/// there is none, it does not read back whole, or it cannot be removed (a
/// mark that outlived this start would vouch for a later crash); each case
/// but the first is logged.
pub fn take(path: &Path) -> Option<Mark> {
    let text = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Ok(m) if m.len() > MARK_BYTES_MAX => Err(format!("{} bytes", m.len())),
        _ => std::fs::read_to_string(path).map_err(|e| e.to_string()),
    };
    if let Err(e) = remove_durably(path) {
        log::warn!("cannot remove {}: {e}; the boot id is not kept", path.display());
        return None;
    }
    match text.and_then(|t| Mark::decode(&t)) {
        Ok(m) => Some(m),
        Err(e) => {
            log::warn!("ignoring {}: {e}", path.display());
            None
        }
    }
}

/// Writes `mark` to `path` durably (a temporary file, synced, renamed over).
pub fn put(path: &Path, mark: &Mark) -> std::io::Result<()> {
    let tmp = path.with_extension("clean-stop.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(mark.encode().as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

fn remove_durably(path: &Path) -> std::io::Result<()> {
    std::fs::remove_file(path)?;
    sync_dir(path)
}

fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark() -> Mark {
        Mark { boot: 0xfeed_f00d, zones: vec![(7, 12), (9, 3)], locks_held: Some(2) }
    }

    #[test]
    fn a_mark_reads_back_and_is_taken_once() {
        let dir = std::env::temp_dir().join(format!("pfs-cleanstop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("data");
        std::fs::write(&data, b"").unwrap();
        let path = mark_path(&data).unwrap();
        assert_eq!(path, dir.join("data.clean-stop"));
        put(&path, &mark()).unwrap();
        assert_eq!(take(&path), Some(mark()));
        assert!(!path.exists(), "taken means removed");
        assert_eq!(take(&path), None);
        assert_eq!(mark_path(&dir), None, "a directory (as a block device) gets no mark");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_mark_is_refused() {
        let good = mark().encode();
        assert_eq!(Mark::decode(&good), Ok(mark()));
        let flipped = good.replace("zone 1 0000000000000009 3", "zone 1 0000000000000009 4");
        assert!(Mark::decode(&flipped).unwrap_err().contains("checksum"));
        assert!(Mark::decode(&good[..good.len() / 2]).is_err(), "cut short");
        assert!(Mark::decode("").is_err());
        // A mark of before the lock count: read, the count unknown.
        let old = Mark { locks_held: None, ..mark() };
        assert_eq!(Mark::decode(&old.encode()), Ok(old.clone()));
        assert!(!old.encode().contains("locks"));
        assert!(good.contains("\nlocks 2\n"));
    }

    #[test]
    fn a_mark_matches_only_zones_opened_from_its_checkpoints_with_nothing_replayed() {
        let m = mark();
        assert!(m.matches(&[(7, 12, 0), (9, 3, 0)]));
        assert!(!m.matches(&[(7, 12, 1), (9, 3, 0)]), "a record was logged after the stop");
        assert!(!m.matches(&[(7, 13, 0), (9, 3, 0)]), "another checkpoint since");
        assert!(!m.matches(&[(8, 12, 0), (9, 3, 0)]), "formatted again");
        assert!(!m.matches(&[(7, 12, 0)]), "another worker count");
    }
}
