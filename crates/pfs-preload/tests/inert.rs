//! The library loaded into programs that do not use pfs: without `PFS_MOUNT`
//! (and with one they never touch) a program behaves exactly as without it.
//! (Programs on pfs paths: the root package's tests/preload.rs, which needs a
//! cluster; this test also makes `cargo test` build the library for it.)

use std::path::PathBuf;
use std::process::Command;

/// The library `cargo test` built with this test: `target/<profile>/deps/`,
/// beside this test's executable.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let lib = exe.with_file_name("libpfs_preload.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    lib
}

fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, Vec<u8>, Vec<u8>) {
    let mut c = Command::new(program);
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    (out.status.success(), out.stdout, out.stderr)
}

#[test]
fn programs_that_do_not_use_pfs_see_no_difference() {
    let lib = library();
    let lib = lib.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("pfs-preload-inert-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/f"), b"hello\n").unwrap();
    let d = dir.to_str().unwrap();
    let script = format!(
        "cd {d} && ls -la sub | wc -l && cat sub/f && cp sub/f g && mv g h && cat h && \
         seq 1 5 > s && wc -l < s && tar -cf t.tar sub && tar -tf t.tar && rm -r h s t.tar && ls"
    );
    let plain = run("sh", &["-c", &script], &[]);
    assert!(plain.0, "{}", String::from_utf8_lossy(&plain.2));
    for env in [vec![("LD_PRELOAD", lib)], vec![("LD_PRELOAD", lib), ("PFS_MOUNT", "/nowhere/pfs")]]
    {
        let with = run("sh", &["-c", &script], &env);
        assert!(with.0, "{}", String::from_utf8_lossy(&with.2));
        assert_eq!(
            String::from_utf8_lossy(&with.1),
            String::from_utf8_lossy(&plain.1),
            "with {env:?}"
        );
        assert!(with.2.is_empty(), "nothing on stderr: {}", String::from_utf8_lossy(&with.2));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_relative_mount_is_refused_with_a_message() {
    let lib = library();
    let (ok, out, err) = run(
        "cat",
        &["/proc/self/comm"],
        &[("LD_PRELOAD", lib.to_str().unwrap()), ("PFS_MOUNT", "pfs")],
    );
    assert!(ok);
    assert_eq!(out, b"cat\n");
    let err = String::from_utf8_lossy(&err);
    assert!(err.contains("PFS_MOUNT=\"pfs\" is not an absolute path"), "{err}");
}
