//! `pfs layout get|set PATH`: a directory's metadata layout and the data layout
//! its new files get, through the extended attributes `user.pfs.dir_layout` and
//! `user.pfs.file_layout` of a mounted pfs.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The metadata layout attribute (`regular` or `bigdir`).
pub const DIR_LAYOUT: &str = "user.pfs.dir_layout";
/// The data layout attribute (`block`, `file` or `io`).
pub const FILE_LAYOUT: &str = "user.pfs.file_layout";
const DIR_CHOICES: &[&str] = &["regular", "bigdir"];
const FILE_CHOICES: &[&str] = &["block", "file", "io"];

fn cpath(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains a NUL byte", path.display()))
}

fn explain(path: &Path, attr: &str, e: std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTEMPTY) => format!(
            "{}: directory not empty: its metadata layout can change only while it is empty",
            path.display()
        ),
        Some(libc::ENODATA) | Some(libc::EOPNOTSUPP) => format!(
            "{}: no {attr}: is it on a pfs mount? (other file systems have no pfs layouts)",
            path.display()
        ),
        _ => format!("{}: {attr}: {e}", path.display()),
    }
}

/// Reads extended attribute `attr` of `path`.
pub fn get_attr(path: &Path, attr: &str) -> Result<String, String> {
    let p = cpath(path)?;
    let a = CString::new(attr).expect("attribute names have no NUL");
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and a buffer of the length passed.
    let n = unsafe { libc::getxattr(p.as_ptr(), a.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(explain(path, attr, std::io::Error::last_os_error()));
    }
    buf.truncate(n as usize);
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Sets extended attribute `attr` of `path` to `value`.
pub fn set_attr(path: &Path, attr: &str, value: &str) -> Result<(), String> {
    let p = cpath(path)?;
    let a = CString::new(attr).expect("attribute names have no NUL");
    // SAFETY: valid C strings and a value of the length passed.
    let rc =
        unsafe { libc::setxattr(p.as_ptr(), a.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if rc != 0 {
        return Err(explain(path, attr, std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The effective layouts of `path` as `pfs layout get` prints them.
pub fn get(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = String::new();
    if meta.is_dir() {
        out += &format!("dir_layout  {}\n", get_attr(path, DIR_LAYOUT)?);
    }
    out += &format!("file_layout {}\n", get_attr(path, FILE_LAYOUT)?);
    Ok(out)
}

/// Sets the layouts that are `Some`, after checking their names.
pub fn set(path: &Path, dir: Option<&str>, file: Option<&str>) -> Result<(), String> {
    if dir.is_none() && file.is_none() {
        return Err("nothing to set: give --dir regular|bigdir and/or --file block|file|io".into());
    }
    if let Some(d) = dir {
        if !DIR_CHOICES.contains(&d) {
            return Err(format!("--dir {d:?}: expected one of {}", DIR_CHOICES.join(", ")));
        }
        set_attr(path, DIR_LAYOUT, d)?;
    }
    if let Some(f) = file {
        if !FILE_CHOICES.contains(&f) {
            return Err(format!("--file {f:?}: expected one of {}", FILE_CHOICES.join(", ")));
        }
        set_attr(path, FILE_LAYOUT, f)?;
    }
    Ok(())
}
