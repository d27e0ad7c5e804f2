//! Paths: which ones are pfs paths, and the absolute, lexically normalized form
//! the library resolves. Pure functions, unit tested.

use std::borrow::Cow;

/// An absolute, normalized path (`/a/b`, no `.`, `..`, `//` or trailing `/`).
pub type AbsPath = Vec<u8>;

/// The directory under which every path is a pfs path (`PFS_MOUNT`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    prefix: AbsPath,
}

impl Mount {
    /// The mount at `dir`, which must be absolute and not `/` itself.
    pub fn new(dir: &[u8]) -> Result<Mount, String> {
        if !dir.starts_with(b"/") {
            return Err(format!("PFS_MOUNT={:?} is not an absolute path", lossy(dir)));
        }
        let prefix = normalize(b"/", dir);
        if prefix == b"/" {
            return Err("PFS_MOUNT=/ would take every path of the machine".into());
        }
        Ok(Mount { prefix })
    }

    /// The mount point.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The part of absolute normalized `abs` below the mount (`""` for the mount
    /// point itself, `a/b` below it), or `None` outside it.
    pub fn inside<'a>(&self, abs: &'a [u8]) -> Option<&'a [u8]> {
        let rest = abs.strip_prefix(self.prefix.as_slice())?;
        match rest {
            [] => Some(rest),
            [b'/', tail @ ..] => Some(tail),
            _ => None,
        }
    }

    /// The absolute path of `rel` (below the mount).
    pub fn join(&self, rel: &[u8]) -> AbsPath {
        let mut p = self.prefix.clone();
        if !rel.is_empty() {
            p.push(b'/');
            p.extend_from_slice(rel);
        }
        p
    }
}

/// Where an absolute path leads, for a mount.
#[derive(Debug, PartialEq, Eq)]
pub enum Absolute<'a> {
    /// Outside the mount: the kernel resolves it as written.
    Outside,
    /// Under the mount (normalized; the path as given when it was already).
    Inside(Cow<'a, [u8]>),
    /// It enters the mount and leaves it again through `..` (`/pfs/../etc`):
    /// the normalized path, which the kernel gets instead, since the mount
    /// point need not exist on this machine.
    Left(AbsPath),
}

/// Classifies absolute `path` for `mount`.
pub fn classify_absolute<'a>(mount: &Mount, path: &'a [u8]) -> Absolute<'a> {
    // The common case: a path elsewhere with nothing to normalize.
    if !path.starts_with(mount.prefix()) && !path.windows(2).any(|w| w == b".." || w == b"//") {
        return Absolute::Outside;
    }
    // The other common case: a pfs path with nothing to normalize, not copied.
    if is_normal(path) && mount.inside(path).is_some() {
        return Absolute::Inside(Cow::Borrowed(path));
    }
    let abs = normalize(b"/", path);
    if mount.inside(&abs).is_some() {
        return Absolute::Inside(Cow::Owned(abs));
    }
    // Did it enter the mount before its first `..`?
    let first_up = path.split(|&b| b == b'/').position(|c| c == b"..");
    let before: Vec<&[u8]> = path.split(|&b| b == b'/').take(first_up.unwrap_or(0)).collect();
    let entered = normalize(b"/", &before.join(&b'/'));
    if first_up.is_some() && mount.inside(&entered).is_some() {
        Absolute::Left(abs)
    } else {
        Absolute::Outside
    }
}

/// `path` made absolute against `cwd` (absolute) and normalized lexically: `.`
/// and empty components dropped, `..` removes the component before it (`/..`
/// is `/`). Symbolic links are not looked at here; pfs resolves those.
pub fn normalize(cwd: &[u8], path: &[u8]) -> AbsPath {
    if is_normal(path) {
        // Most paths programs pass: copied as they are.
        return path.to_vec();
    }
    normalize_parts(cwd, path)
}

/// [`normalize`] component by component.
fn normalize_parts(cwd: &[u8], path: &[u8]) -> AbsPath {
    let mut parts: Vec<&[u8]> = Vec::new();
    let start: &[u8] = if path.starts_with(b"/") { b"" } else { cwd };
    for c in start.split(|&b| b == b'/').chain(path.split(|&b| b == b'/')) {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = Vec::with_capacity(path.len() + cwd.len() + 1);
    for c in &parts {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    out
}

/// Whether `path` is absolute and already what [`normalize`] makes of it: no
/// empty, `.` or `..` component and no trailing `/` (but `/` itself).
fn is_normal(path: &[u8]) -> bool {
    if path == b"/" {
        return true;
    }
    path.first() == Some(&b'/')
        && !path.ends_with(b"/")
        && path[1..].split(|&b| b == b'/').all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// Whether `path` ends in `/` (or `/.`) after a name: then it must name a
/// directory.
pub fn wants_dir(path: &[u8]) -> bool {
    path.len() > 1 && (path.ends_with(b"/") || path.ends_with(b"/."))
}

/// The components of a relative path below the mount.
pub fn components(rel: &[u8]) -> impl Iterator<Item = &[u8]> {
    rel.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// Bytes as text for messages.
pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_resolves_dots_and_slashes_against_the_cwd() {
        assert_eq!(normalize(b"/a/b", b"c"), b"/a/b/c");
        assert_eq!(normalize(b"/a/b", b"./c/../d//e/"), b"/a/b/d/e");
        assert_eq!(normalize(b"/a/b", b"../../../x"), b"/x");
        assert_eq!(normalize(b"/a", b"/p//q/."), b"/p/q");
        assert_eq!(normalize(b"/", b".."), b"/");
        assert_eq!(normalize(b"/a", b""), b"/a");
    }

    /// Every path of up to four components from a small alphabet, absolute
    /// or not, with or without a trailing `/`: the copy of a path already
    /// normal gives what the component walk gives.
    #[test]
    fn normal_paths_are_copied_as_the_walk_would_build_them() {
        let alphabet: [&[u8]; 5] = [b"a", b"bc", b".", b"..", b""];
        let mut checked = 0;
        for n in 0..=4u32 {
            for code in 0..5usize.pow(n) {
                let mut comps = Vec::new();
                let mut c = code;
                for _ in 0..n {
                    comps.push(alphabet[c % 5]);
                    c /= 5;
                }
                let joined = comps.join(&b'/');
                for (lead, trail) in [("", ""), ("/", ""), ("", "/"), ("/", "/")] {
                    let p = [lead.as_bytes(), &joined, trail.as_bytes()].concat();
                    for cwd in [&b"/"[..], b"/x/y"] {
                        assert_eq!(
                            normalize(cwd, &p),
                            normalize_parts(cwd, &p),
                            "{:?} against {:?}",
                            lossy(&p),
                            lossy(cwd)
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(is_normal(b"/a/bc") && is_normal(b"/") && !is_normal(b"/a/") && !is_normal(b"a"));
        assert_eq!(checked, 6248);
    }

    #[test]
    fn absolute_paths_are_pfs_ones_kernel_ones_or_leave_the_mount() {
        let m = Mount::new(b"/pfs").unwrap();
        assert_eq!(classify_absolute(&m, b"/etc/passwd"), Absolute::Outside);
        let inside = |p: &[u8]| Absolute::Inside(Cow::Owned(p.to_vec()));
        assert_eq!(classify_absolute(&m, b"/pfs"), inside(b"/pfs"));
        assert!(matches!(classify_absolute(&m, b"/pfs/a"), Absolute::Inside(Cow::Borrowed(_))));
        assert_eq!(classify_absolute(&m, b"//pfs/./a//b"), inside(b"/pfs/a/b"));
        assert_eq!(classify_absolute(&m, b"/etc/../pfs/a"), inside(b"/pfs/a"));
        assert_eq!(classify_absolute(&m, b"/pfs/a/../../etc"), Absolute::Left(b"/etc".to_vec()));
        assert_eq!(classify_absolute(&m, b"/pfs/.."), Absolute::Left(b"/".to_vec()));
        // Outside the mount all along: the kernel reads `..` after symlinks.
        assert_eq!(classify_absolute(&m, b"/pfsx/link/../f"), Absolute::Outside);
        assert_eq!(classify_absolute(&m, b"/pfsx"), Absolute::Outside);
        assert_eq!(classify_absolute(&m, b"/usr/lib/../bin"), Absolute::Outside);
    }

    #[test]
    fn a_mount_knows_its_paths_and_no_others() {
        let m = Mount::new(b"/pfs/").unwrap();
        assert_eq!(m.prefix(), b"/pfs");
        assert_eq!(m.inside(b"/pfs"), Some(&b""[..]));
        assert_eq!(m.inside(b"/pfs/a/b"), Some(&b"a/b"[..]));
        assert_eq!(m.inside(b"/pfsx/a"), None);
        assert_eq!(m.inside(b"/etc"), None);
        assert_eq!(m.join(b""), b"/pfs");
        assert_eq!(m.join(b"a"), b"/pfs/a");
        assert!(Mount::new(b"pfs").unwrap_err().contains("absolute"));
        assert!(Mount::new(b"/a/..").is_err());
    }

    #[test]
    fn components_and_directory_suffixes() {
        assert_eq!(components(b"a//b/").collect::<Vec<_>>(), vec![&b"a"[..], &b"b"[..]]);
        assert!(wants_dir(b"a/"));
        assert!(wants_dir(b"a/."));
        assert!(!wants_dir(b"/"));
        assert!(!wants_dir(b"a"));
    }
}
