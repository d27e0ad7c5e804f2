//! Servers report at the interval the master asks for: with a 50 ms interval and
//! a server marked down after 150 ms of silence, a live server is never seen down.

use std::time::{Duration, Instant};

use pfs_core::{MasterConfig, ServerConfig};

#[test]
fn a_live_server_reports_at_the_masters_interval() {
    let dir = std::env::temp_dir().join(format!("pfs-heartbeat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("cluster.key");
    let k = pfs_net::ClusterKey::generate(&key).unwrap();
    let master = pfs_server::start_master(&MasterConfig {
        listen: "127.0.0.1:0".into(),
        key_file: key.clone(),
        heartbeat_interval_ms: 50,
        down_after_ms: 150,
        servers: 1,
        state_path: dir.join("master.state"),
    })
    .unwrap();
    let server = pfs_server::start(
        &ServerConfig {
            listen: "127.0.0.1:0".into(),
            data_path: dir.join("data.img"),
            device_size_bytes: 256 << 20,
            workers: 1,
            wal_size_bytes: 8 << 20,
            key_file: key,
            master: master.addr().to_string(),
            ..ServerConfig::default()
        },
        Duration::from_secs(10),
    )
    .unwrap();
    let end = Instant::now() + Duration::from_millis(1500);
    let mut looks = 0;
    while Instant::now() < end {
        let view =
            pfs_client::cluster::fetch_view(master.addr(), &k, Duration::from_secs(2)).unwrap();
        let s = &view.servers[0];
        assert!(s.up, "a live server was marked down ({} ms since its report)", s.last_report_ms);
        looks += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(looks > 20);
    server.stop().unwrap();
    // Once it stops reporting it goes down within the configured time.
    let gone = Instant::now() + Duration::from_secs(3);
    loop {
        let view =
            pfs_client::cluster::fetch_view(master.addr(), &k, Duration::from_secs(2)).unwrap();
        if !view.servers[0].up {
            break;
        }
        assert!(Instant::now() < gone, "a stopped server is still up");
        std::thread::sleep(Duration::from_millis(20));
    }
    master.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
