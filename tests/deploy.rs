//! The deploy/ files: the systemd units pass `systemd-analyze verify` (through
//! deploy/check.sh) and every example config loads and validates.

use std::path::Path;
use std::process::Command;

use pfs_core::config::ConfigFile;
use pfs_core::{ClientConfig, MasterConfig, ServerConfig};

fn deploy(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy").join(file)
}

#[test]
fn systemd_units_verify() {
    let out = Command::new("bash").arg(deploy("check.sh")).output().unwrap();
    assert!(
        out.status.success(),
        "deploy/check.sh failed (CI installs systemd for systemd-analyze):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn example_configs_load_and_validate() {
    let m = MasterConfig::load(&deploy("master.toml")).unwrap();
    let s = ServerConfig::load(&deploy("server.toml")).unwrap();
    let c = ClientConfig::load(&deploy("client.toml")).unwrap();
    // The examples are a cluster: servers and clients name the master it runs.
    let port = |a: &str| a.rsplit(':').next().unwrap().to_string();
    assert_eq!(port(&s.master), port(&m.listen));
    assert_eq!(port(&c.master), port(&m.listen));
    assert_eq!(s.key_file, m.key_file);
    assert_eq!(c.key_file, m.key_file);
}

#[test]
fn fstab_example_names_the_helper() {
    let fstab = std::fs::read_to_string(deploy("fstab.example")).unwrap();
    let line =
        fstab.lines().find(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty()).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 6, "{line}");
    assert_eq!(fields[2], "fuse.pfs-fuse");
    assert!(fields[3].contains("key="), "{line}");
}
