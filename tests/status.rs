//! `pfs status` against a running master and server (real sockets, real data file).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use pfs_core::{MasterConfig, ServerConfig};
use pfs_net::ClusterKey;

fn dir(name: &str) -> PathBuf {
    let d =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn status_prints_servers_health_and_usage_and_refuses_a_wrong_key() {
    let d = dir("status");
    let key = d.join("cluster.key");
    ClusterKey::generate(&key).unwrap();
    let mcfg = MasterConfig {
        listen: "127.0.0.1:0".into(),
        key_file: key.clone(),
        servers: 2,
        state_path: d.join("master.state"),
        ..MasterConfig::default()
    };
    let master = pfs_server::start_master(&mcfg).unwrap();
    let scfg = ServerConfig {
        listen: "127.0.0.1:0".into(),
        data_path: d.join("server.img"),
        device_size_bytes: 128 << 20,
        workers: 1,
        key_file: key.clone(),
        master: master.addr().to_string(),
        wal_size_bytes: 8 << 20,
        icache_blocks: Some(64),
        ..ServerConfig::default()
    };
    let server = pfs_server::start(&scfg, Duration::from_secs(10)).unwrap();
    // Usage arrives with the first heartbeat.
    std::thread::sleep(Duration::from_millis(1500));

    let pfs = env!("CARGO_BIN_EXE_pfs");
    let out = Command::new(pfs)
        .args(["status", "--master", &master.addr().to_string(), "--key", key.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "pfs status failed: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 of 2 servers registered, 1 up"), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains(&server.addr().to_string()))
        .expect("a row for the server");
    assert!(row.contains(" up ") && row.contains("MiB"), "{row}");
    assert!(text.contains("(not registered)"), "{text}");

    let wrong = d.join("wrong.key");
    ClusterKey::generate(&wrong).unwrap();
    let out = Command::new(pfs)
        .args(["status", "--master", &master.addr().to_string(), "--key", wrong.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong key must fail");
    assert!(err.contains("key"), "the message names the key: {err}");

    server.stop().unwrap();
    master.stop();
    let _ = std::fs::remove_dir_all(&d);
}
