//! Configuration of the server, the master and the client, read from TOML.
//!
//! Every field has a default, so an empty file is a working single-node setup;
//! unknown fields are refused (a typo must not silently fall back to a default).
//! [`ConfigFile::validate`] checks ranges and names the field and the allowed values:
//! `workers = 0 is out of range: allowed 1..=256`.

use std::fmt::Display;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::{DirLayout, FileLayout};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A configuration that is wrong; the text names the field (and the file).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The text is not TOML, or does not fit the types (unknown field, wrong type).
    #[error("invalid TOML: {0}")]
    Toml(String),
    /// A numeric field outside its range.
    #[error("{field} = {value} is out of range: allowed {allowed}")]
    OutOfRange {
        /// The field, with its section when there is one (`server.workers`).
        field: String,
        /// The value found.
        value: String,
        /// The allowed range.
        allowed: String,
    },
    /// A field whose value is malformed or contradicts another field.
    #[error("{field} = {value} is invalid: {reason}")]
    Invalid {
        /// The field, with its section when there is one.
        field: String,
        /// The value found.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The file could not be read.
    #[error("cannot read config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file was read but is wrong.
    #[error("config file {}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The same error with `section.` in front of the field name.
    fn in_section(self, section: &str) -> ConfigError {
        match self {
            ConfigError::OutOfRange { field, value, allowed } => {
                ConfigError::OutOfRange { field: format!("{section}.{field}"), value, allowed }
            }
            ConfigError::Invalid { field, value, reason } => {
                ConfigError::Invalid { field: format!("{section}.{field}"), value, reason }
            }
            other => other,
        }
    }
}

/// Parsing, loading and validation shared by every configuration type.
pub trait ConfigFile: DeserializeOwned + Default {
    /// Checks every field's range and the relations between fields.
    fn validate(&self) -> Result<(), ConfigError>;

    /// Parses and validates TOML text.
    fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates the file at `path`; errors name the file.
    fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::from_toml_str(&text)
            .map_err(|e| ConfigError::InFile { path: path.to_owned(), source: Box::new(e) })
    }
}

/// Fails unless `min <= value <= max`.
fn check_range<T: PartialOrd + Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange {
            field: field.to_owned(),
            value: value.to_string(),
            allowed: format!("{min}..={max}"),
        });
    }
    Ok(())
}

/// Fails unless `addr` looks like `host:port` with a port in 1..=65535.
fn check_addr(field: &str, addr: &str) -> Result<(), ConfigError> {
    check_addr_port(field, addr, 1)
}

/// As [`check_addr`] for a listening address, where port 0 asks for a free one.
fn check_listen(field: &str, addr: &str) -> Result<(), ConfigError> {
    check_addr_port(field, addr, 0)
}

fn check_addr_port(field: &str, addr: &str, min_port: u16) -> Result<(), ConfigError> {
    let invalid = |reason: &str| ConfigError::Invalid {
        field: field.to_owned(),
        value: format!("{addr:?}"),
        reason: reason.to_owned(),
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| invalid("expected host:port"))?;
    if host.is_empty() {
        return Err(invalid("expected host:port, the host is empty"));
    }
    match port.parse::<u16>() {
        Ok(p) if p >= min_port => Ok(()),
        _ => Err(invalid(&format!("expected host:port with a port in {min_port}..=65535"))),
    }
}

/// Fails if `path` is empty.
fn check_path(field: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::Invalid {
            field: field.to_owned(),
            value: "\"\"".to_owned(),
            reason: "a path is required".to_owned(),
        });
    }
    Ok(())
}

/// How a worker waits when it has nothing to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PollMode {
    /// Spin forever: lowest latency, one core per worker always busy.
    Busy,
    /// Spin while spinning pays (up to `idle_spin_us`, adapted to the gaps
    /// between requests), then sleep on an eventfd until work arrives.
    #[default]
    Adaptive,
}

/// The storage server (`pfs-server serve`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on, `host:port` (port 0 picks a free one).
    pub listen: String,
    /// Address clients are told to connect to, `host:port`; empty: `listen`, which
    /// must then be a concrete address (not 0.0.0.0).
    pub advertise: String,
    /// Block device or file holding the shards' zones.
    pub data_path: PathBuf,
    /// Bytes of `data_path` to use, split evenly into one zone per worker; 0 uses the
    /// whole device (or the existing file's size).
    pub device_size_bytes: u64,
    /// When the data file is created or grown to `device_size_bytes`: allocate all
    /// of it now (`fallocate`), so a full disk stops the server at start; `false`
    /// allocates only each zone's metadata and WAL, file data takes space as it is
    /// written, and a full disk then fails data writes with ENOSPC (fsync and
    /// metadata keep working). No effect on block devices.
    pub preallocate: bool,
    /// Worker threads, each owning one shard.
    pub workers: u32,
    /// How idle workers wait.
    pub poll_mode: PollMode,
    /// Longest time an idle worker spins before it sleeps (`adaptive` only):
    /// the worker doubles its spin after a sleep that a spin this long would
    /// have avoided and halves it after a longer one; 0 never spins.
    pub idle_spin_us: u64,
    /// Whether a client thread in the server's own process (`pfs up`: the
    /// mount beside the server) runs a parked worker's rounds itself instead
    /// of waking it: a request over shared memory then costs no wake-up of
    /// the worker and none of the client thread (docs/cluster.md "Polling").
    /// No effect on clients in other processes or hosts.
    pub inline_rounds: bool,
    /// Threads sealing large read replies off the workers; 0 seals on the worker.
    pub memcpy_threads: u32,
    /// Read replies with at least this much data go to the memcpy threads.
    pub memcpy_threshold_bytes: u64,
    /// Inode cache blocks per worker (16 inodes, 4 KiB each); unset sizes it
    /// from memory ([`ServerConfig::icache_block_count`]).
    pub icache_blocks: Option<u32>,
    /// Largest share of inode cache blocks that may be dirty before write-back.
    pub dirty_ratio: f64,
    /// Read cache of file data per worker, MiB (`pfs_store::shard::cache`);
    /// unset sizes it from memory ([`ServerConfig::read_cache_bytes`]), 0 turns
    /// it off.
    pub read_cache_mib: Option<u64>,
    /// Read-ahead of sequential readers, in multiples of their read
    /// (DESIGN.md: 10, the default), read in the background into buffers of
    /// at most half the read cache's size; 0 reads no more than asked
    /// (docs/cluster.md, "Server read cache").
    pub read_ahead_factor: u64,
    /// Write-ahead log bytes per worker.
    pub wal_size_bytes: u64,
    /// Slots in each worker-to-worker ring.
    pub ring_depth: u32,
    /// io_uring submission queue entries per worker.
    pub io_queue_depth: u32,
    /// While fewer device requests than this are with the kernel, each goes
    /// to it as it is made; past that, a worker round's requests go together
    /// (0: always together).
    pub io_submit_below: u32,
    /// Slots in the memcpy work queue.
    pub memcpy_queue_depth: u32,
    /// How long a client's file locks last without a renewal, ms: a client
    /// that died or lost its network holds others back at most this long
    /// (clients renew every third of it).
    pub lock_lease_ms: u64,
    /// Requests a connection may have outstanding.
    pub connection_queue_depth: u32,
    /// File holding the cluster's shared secret.
    pub key_file: PathBuf,
    /// The master, `host:port`.
    pub master: String,
    /// Offer RDMA queue pairs to clients that ask (a build with the `rdma` feature
    /// and an RDMA device); without them the server logs why and clients that ask
    /// fall back to tcp.
    pub rdma: bool,
    /// RDMA device (`mlx5_0`); empty takes the first one found.
    pub rdma_device: String,
    /// Port of the RDMA device, from 1.
    pub rdma_port: u8,
    /// Index in the port's GID table (RoCE v2 wants a routable GID's index).
    pub rdma_gid_index: u8,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "0.0.0.0:7070".into(),
            advertise: String::new(),
            data_path: "/var/lib/pfs/data".into(),
            device_size_bytes: 0,
            preallocate: true,
            workers: 4,
            poll_mode: PollMode::Adaptive,
            idle_spin_us: 100,
            inline_rounds: false,
            memcpy_threads: 2,
            memcpy_threshold_bytes: 4 * KIB,
            icache_blocks: None,
            dirty_ratio: 0.05,
            read_cache_mib: None,
            read_ahead_factor: 10,
            wal_size_bytes: 256 * MIB,
            ring_depth: 1024,
            io_queue_depth: 256,
            io_submit_below: 8,
            lock_lease_ms: 30_000,
            memcpy_queue_depth: 1024,
            connection_queue_depth: 128,
            key_file: "/etc/pfs/cluster.key".into(),
            master: "127.0.0.1:7000".into(),
            rdma: false,
            rdma_device: String::new(),
            rdma_port: 1,
            rdma_gid_index: 0,
        }
    }
}

impl ServerConfig {
    /// Each worker's Icache blocks: `icache_blocks`, or when unset 1/64 of
    /// `memory_bytes` (the machine's) shared by the workers, 16 MiB to 1 GiB
    /// each (4,096 to 262,144 blocks of 4 KiB, 65,536 to 4 Mi inodes). Blocks
    /// take memory only once an inode page is read into them.
    pub fn icache_block_count(&self, memory_bytes: u64) -> u32 {
        match self.icache_blocks {
            Some(blocks) => blocks,
            None => {
                let bytes =
                    (memory_bytes / 64 / u64::from(self.workers.max(1))).clamp(16 * MIB, GIB);
                (bytes / ICACHE_BLOCK_BYTES) as u32
            }
        }
    }

    /// Each worker's read cache in bytes: `read_cache_mib`, or when unset 1/64 of
    /// `memory_bytes` (the machine's) shared by the workers, 16 MiB to 1 GiB each.
    pub fn read_cache_bytes(&self, memory_bytes: u64) -> u64 {
        match self.read_cache_mib {
            Some(mib) => mib * MIB,
            None => (memory_bytes / 64 / u64::from(self.workers.max(1))).clamp(16 * MIB, GIB),
        }
    }
}

/// Bytes of one Icache block (one metadata page).
const ICACHE_BLOCK_BYTES: u64 = 4096;

/// Smallest zone a worker can run with: metadata, data and its log.
const ZONE_MIN_BYTES: u64 = 64 * MIB;

impl ConfigFile for ServerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check_listen("listen", &self.listen)?;
        if !self.advertise.is_empty() {
            check_addr("advertise", &self.advertise)?;
        }
        check_path("data_path", &self.data_path)?;
        check_range("workers", self.workers, 1, 256)?;
        if self.device_size_bytes != 0 {
            let min = ZONE_MIN_BYTES * u64::from(self.workers);
            check_range("device_size_bytes", self.device_size_bytes, min, 1 << 60)
                .map_err(|e| explain_zero(e, "0 (the whole device)"))?;
        }
        check_range("idle_spin_us", self.idle_spin_us, 0, 1_000_000)?;
        check_range("memcpy_threads", self.memcpy_threads, 0, 64)?;
        check_range("memcpy_threshold_bytes", self.memcpy_threshold_bytes, 0, 64 * MIB)?;
        if let Some(blocks) = self.icache_blocks {
            check_range("icache_blocks", blocks, 1, 1 << 24)?;
        }
        if !(self.dirty_ratio > 0.0 && self.dirty_ratio <= 1.0) {
            return Err(ConfigError::OutOfRange {
                field: "dirty_ratio".into(),
                value: self.dirty_ratio.to_string(),
                allowed: "greater than 0, at most 1".into(),
            });
        }
        check_range("read_ahead_factor", self.read_ahead_factor, 0, 64)?;
        if let Some(mib) = self.read_cache_mib {
            check_range("read_cache_mib", mib, 0, 1 << 20)?;
        }
        check_range("wal_size_bytes", self.wal_size_bytes, MIB, 64 * GIB)?;
        check_range("ring_depth", self.ring_depth, 2, 1 << 20)?;
        check_range("io_queue_depth", self.io_queue_depth, 1, 32768)?;
        check_range("io_submit_below", self.io_submit_below, 0, 32768)?;
        check_range("lock_lease_ms", self.lock_lease_ms, 300, 3_600_000)?;
        check_range("memcpy_queue_depth", self.memcpy_queue_depth, 1, 1 << 20)?;
        check_range("connection_queue_depth", self.connection_queue_depth, 1, 65536)?;
        check_path("key_file", &self.key_file)?;
        check_addr("master", &self.master)?;
        check_range("rdma_port", self.rdma_port, 1, 255)?;
        Ok(())
    }
}

/// Adds the one value outside the range that is allowed too.
fn explain_zero(e: ConfigError, also: &str) -> ConfigError {
    match e {
        ConfigError::OutOfRange { field, value, allowed } => {
            ConfigError::OutOfRange { field, value, allowed: format!("{also} or {allowed}") }
        }
        other => other,
    }
}

/// The cluster master (`pfs-server master`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// Address servers and clients connect to, `host:port`.
    pub listen: String,
    /// File holding the cluster's shared secret.
    pub key_file: PathBuf,
    /// How often servers report to the master.
    pub heartbeat_interval_ms: u64,
    /// A server silent this long is marked down.
    pub down_after_ms: u64,
    /// Storage servers in the cluster: routing spreads over exactly this many, so
    /// clients wait until all of them registered.
    pub servers: u32,
    /// File where the master keeps the view (server ids and addresses) across
    /// restarts.
    pub state_path: PathBuf,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            listen: "0.0.0.0:7000".into(),
            key_file: "/etc/pfs/cluster.key".into(),
            heartbeat_interval_ms: 1000,
            down_after_ms: 10_000,
            servers: 1,
            state_path: "/var/lib/pfs/master.state".into(),
        }
    }
}

impl ConfigFile for MasterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check_listen("listen", &self.listen)?;
        check_path("key_file", &self.key_file)?;
        check_range("heartbeat_interval_ms", self.heartbeat_interval_ms, 10, 60_000)?;
        check_range("servers", self.servers, 1, crate::wire::cluster::MAX_SERVERS as u32)?;
        check_path("state_path", &self.state_path)?;
        // Fewer than two missed heartbeats must never mark a server down.
        let min_down = 2 * self.heartbeat_interval_ms;
        check_range("down_after_ms", self.down_after_ms, min_down, 3_600_000).map_err(
            |e| match e {
                ConfigError::OutOfRange { field, value, allowed } => ConfigError::OutOfRange {
                    field,
                    value,
                    allowed: format!("{allowed} (at least 2 x heartbeat_interval_ms)"),
                },
                other => other,
            },
        )?;
        Ok(())
    }
}

/// How a client reaches the storage servers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared memory to a server on this host, tcp to the others.
    #[default]
    Auto,
    /// TCP only.
    Tcp,
    /// Shared memory only (every server on this host).
    Shm,
    /// RDMA; a server or host without it is reached over tcp, with a warning.
    Rdma,
}

/// The client: FUSE mount or native API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// The master, `host:port`.
    pub master: String,
    /// File holding the cluster's shared secret.
    pub key_file: PathBuf,
    /// Time to connect to a server or the master.
    pub connect_timeout_ms: u64,
    /// Time a request may take before it fails with `TimedOut`.
    pub request_timeout_ms: u64,
    /// Writes sent but not yet acknowledged, per open file; more waits.
    pub max_unfinished_writes: u32,
    /// Make every write synchronous (`-o strict`).
    pub strict: bool,
    /// How long a cached dentry (under a read token) stays valid.
    pub dentry_ttl_ms: u64,
    /// Most dentries cached; 0 disables the cache.
    pub dentry_cache_entries: u32,
    /// Layout of directories created without an inherited one.
    pub dir_layout: DirLayout,
    /// Layout of files created without an inherited one.
    pub file_layout: FileLayout,
    /// Transport to the servers.
    pub transport: Transport,
    /// RDMA device (`mlx5_0`); empty takes the first one found.
    pub rdma_device: String,
    /// Port of the RDMA device, from 1.
    pub rdma_port: u8,
    /// Index in the port's GID table.
    pub rdma_gid_index: u8,
    /// Slots of slot RPC per server connection: the requests in flight on it.
    /// Each slot pins twice the largest frame (about 2 MiB) on both sides.
    pub rpc_slots: u32,
    /// Use slot RPC (replies written into the client's inbox, the RDMA protocol)
    /// over tcp and shm too; RDMA connections always use it.
    pub slot_rpc: bool,
    /// KiB in each direction's ring of a shared-memory connection (a power of
    /// two): a reply that fits is written whole, a larger one is streamed
    /// through it in turns (docs/benchmarks.md: 4 MiB rings against 256 KiB).
    pub shm_ring_kib: u32,
    /// How long a caller polls for its reply before it parks (microseconds; 0
    /// parks at once), yielding its core between polls. A reply that comes
    /// within it costs no wake-up on either side. 50: a caller whose worker
    /// runs on another core waits longer than 5 for its reply, and each
    /// park then cost a cross-core wake-up (docs/cluster.md "Polling",
    /// docs/benchmarks.md, forty-first session).
    pub reply_spin_us: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            master: "127.0.0.1:7000".into(),
            key_file: "/etc/pfs/cluster.key".into(),
            connect_timeout_ms: 5_000,
            request_timeout_ms: 30_000,
            max_unfinished_writes: 64,
            strict: false,
            dentry_ttl_ms: 1_000,
            dentry_cache_entries: 65_536,
            dir_layout: DirLayout::BigDir,
            file_layout: FileLayout::Block,
            transport: Transport::Auto,
            rdma_device: String::new(),
            rdma_port: 1,
            rdma_gid_index: 0,
            rpc_slots: 32,
            slot_rpc: false,
            shm_ring_kib: 4096,
            reply_spin_us: 50,
        }
    }
}

impl ConfigFile for ClientConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check_addr("master", &self.master)?;
        check_path("key_file", &self.key_file)?;
        check_range("connect_timeout_ms", self.connect_timeout_ms, 1, 600_000)?;
        check_range("request_timeout_ms", self.request_timeout_ms, 1, 3_600_000)?;
        check_range("max_unfinished_writes", self.max_unfinished_writes, 1, 65536)?;
        check_range("dentry_ttl_ms", self.dentry_ttl_ms, 0, 3_600_000)?;
        check_range("dentry_cache_entries", self.dentry_cache_entries, 0, 1 << 24)?;
        check_range("rdma_port", self.rdma_port, 1, 255)?;
        check_range("rpc_slots", self.rpc_slots, 1, 4096)?;
        check_range("reply_spin_us", self.reply_spin_us, 0, 1000)?;
        check_range("shm_ring_kib", self.shm_ring_kib, 4, 65536)?;
        if !self.shm_ring_kib.is_power_of_two() {
            return Err(ConfigError::Invalid {
                field: "shm_ring_kib".into(),
                value: self.shm_ring_kib.to_string(),
                reason: "not a power of two".into(),
            });
        }
        Ok(())
    }
}

/// One file with a section per role, `[server]`, `[master]`, `[client]`, for the
/// all-in-one `pfs up`; each section may be left out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PfsConfig {
    /// The storage server.
    pub server: ServerConfig,
    /// The master.
    pub master: MasterConfig,
    /// The client.
    pub client: ClientConfig,
}

impl ConfigFile for PfsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.server.validate().map_err(|e| e.in_section("server"))?;
        self.master.validate().map_err(|e| e.in_section("master"))?;
        self.client.validate().map_err(|e| e.in_section("client"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commented examples in deploy/ are what operators copy: every field in
    /// them must exist and validate.
    #[test]
    fn the_deploy_examples_parse_and_validate() {
        let server = ServerConfig::from_toml_str(include_str!("../../../deploy/server.toml"));
        let server = server.unwrap();
        assert!(!server.rdma, "the example leaves RDMA off");
        assert!(server.preallocate, "the example keeps the default");
        let sparse = ServerConfig::from_toml_str("preallocate = false").unwrap();
        assert!(!sparse.preallocate);
        MasterConfig::from_toml_str(include_str!("../../../deploy/master.toml")).unwrap();
        let client = ClientConfig::from_toml_str(include_str!("../../../deploy/client.toml"));
        let client = client.unwrap();
        assert_eq!(
            (client.transport, client.rpc_slots, client.slot_rpc),
            (Transport::Auto, 32, false)
        );
        let bad = ClientConfig::from_toml_str("transport = \"infiniband\"").unwrap_err();
        assert!(bad.to_string().contains("infiniband"), "{bad}");
        let bad = ClientConfig::from_toml_str("rpc_slots = 0").unwrap_err();
        assert!(bad.to_string().contains("rpc_slots"), "{bad}");
    }

    fn server_err(toml: &str) -> String {
        ServerConfig::from_toml_str(toml).unwrap_err().to_string()
    }

    #[test]
    fn defaults_are_valid() {
        ServerConfig::default().validate().unwrap();
        MasterConfig::default().validate().unwrap();
        ClientConfig::default().validate().unwrap();
        PfsConfig::default().validate().unwrap();
        assert_eq!(ServerConfig::from_toml_str("").unwrap(), ServerConfig::default());
        assert_eq!(ServerConfig::default().dirty_ratio, 0.05);
        assert_eq!(ClientConfig::default().dir_layout, DirLayout::BigDir);
    }

    #[test]
    fn the_read_cache_is_sized_from_memory_unless_set() {
        let auto = ServerConfig { workers: 2, ..ServerConfig::default() };
        assert_eq!(auto.read_cache_bytes(24 * GIB), 192 * MIB, "1/64 of 24 GiB over 2 workers");
        assert_eq!(auto.read_cache_bytes(GIB), 16 * MIB, "at least 16 MiB");
        assert_eq!(auto.read_cache_bytes(1 << 50), GIB, "at most 1 GiB");
        let off = ServerConfig::from_toml_str("read_cache_mib = 0").unwrap();
        assert_eq!(off.read_cache_bytes(24 * GIB), 0);
        let set = ServerConfig::from_toml_str("read_cache_mib = 100").unwrap();
        assert_eq!(set.read_cache_bytes(24 * GIB), 100 * MIB);
        let e = ServerConfig::from_toml_str("read_cache_mib = 9999999").unwrap_err();
        assert!(e.to_string().contains("read_cache_mib"), "{e}");
        assert_eq!(ServerConfig::default().read_ahead_factor, 10);
    }

    #[test]
    fn the_icache_is_sized_from_memory_unless_set() {
        let auto = ServerConfig { workers: 2, ..ServerConfig::default() };
        assert_eq!(auto.icache_block_count(24 * GIB), 49_152, "1/64 of 24 GiB over 2 workers");
        assert_eq!(auto.icache_block_count(GIB), 4096, "at least 16 MiB");
        assert_eq!(auto.icache_block_count(1 << 50), 262_144, "at most 1 GiB");
        let set = ServerConfig::from_toml_str("icache_blocks = 256").unwrap();
        assert_eq!(set.icache_block_count(24 * GIB), 256);
        let e = ServerConfig::from_toml_str("icache_blocks = 0").unwrap_err();
        assert!(e.to_string().contains("icache_blocks"), "{e}");
        let e = ServerConfig::from_toml_str("read_ahead_factor = 65").unwrap_err();
        assert!(e.to_string().contains("read_ahead_factor"), "{e}");
    }

    #[test]
    fn fields_parse() {
        let server = ServerConfig::from_toml_str(
            r#"
            listen = "node7:7070"
            data_path = "/dev/nvme0n1"
            device_size_bytes = 1099511627776
            workers = 16
            poll_mode = "busy"
            dirty_ratio = 0.1
            "#,
        )
        .unwrap();
        assert_eq!(server.workers, 16);
        assert_eq!(server.poll_mode, PollMode::Busy);
        assert_eq!(server.data_path, PathBuf::from("/dev/nvme0n1"));
        assert_eq!(server.icache_blocks, ServerConfig::default().icache_blocks);

        let client = ClientConfig::from_toml_str(
            "strict = true\ndir_layout = \"regular\"\nfile_layout = \"io\"\n",
        )
        .unwrap();
        assert!(client.strict);
        assert_eq!((client.dir_layout, client.file_layout), (DirLayout::Regular, FileLayout::Io));

        let all =
            PfsConfig::from_toml_str("[server]\nworkers = 2\n[master]\ndown_after_ms = 5000\n")
                .unwrap();
        assert_eq!((all.server.workers, all.master.down_after_ms), (2, 5000));
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused() {
        let err = server_err("wokers = 4");
        assert!(err.contains("unknown field `wokers`"), "{err}");
        let err = server_err("poll_mode = \"sometimes\"");
        assert!(err.contains("sometimes"), "{err}");
        let err = server_err("workers = \"four\"");
        assert!(err.starts_with("invalid TOML") && err.contains("workers"), "{err}");
        let err = PfsConfig::from_toml_str("[sever]\n").unwrap_err().to_string();
        assert!(err.contains("unknown field `sever`"), "{err}");
    }

    #[test]
    fn server_ranges_name_the_field() {
        let cases = [
            ("workers = 0", "workers = 0 is out of range: allowed 1..=256"),
            ("workers = 257", "workers = 257 is out of range: allowed 1..=256"),
            (
                "workers = 2\ndevice_size_bytes = 1000",
                "device_size_bytes = 1000 is out of range: allowed 0 (the whole device) or \
                 134217728..=1152921504606846976",
            ),
            (
                "idle_spin_us = 2000000",
                "idle_spin_us = 2000000 is out of range: allowed 0..=1000000",
            ),
            ("memcpy_threads = 65", "memcpy_threads = 65 is out of range: allowed 0..=64"),
            (
                "memcpy_threshold_bytes = 68719476736",
                "memcpy_threshold_bytes = 68719476736 is out of range: allowed 0..=67108864",
            ),
            ("icache_blocks = 0", "icache_blocks = 0 is out of range: allowed 1..=16777216"),
            (
                "dirty_ratio = 0.0",
                "dirty_ratio = 0 is out of range: allowed greater than 0, at most 1",
            ),
            (
                "dirty_ratio = 1.5",
                "dirty_ratio = 1.5 is out of range: allowed greater than 0, at most 1",
            ),
            (
                "dirty_ratio = nan",
                "dirty_ratio = NaN is out of range: allowed greater than 0, at most 1",
            ),
            (
                "wal_size_bytes = 1",
                "wal_size_bytes = 1 is out of range: allowed 1048576..=68719476736",
            ),
            ("ring_depth = 1", "ring_depth = 1 is out of range: allowed 2..=1048576"),
            ("io_queue_depth = 0", "io_queue_depth = 0 is out of range: allowed 1..=32768"),
            (
                "memcpy_queue_depth = 0",
                "memcpy_queue_depth = 0 is out of range: allowed 1..=1048576",
            ),
            (
                "connection_queue_depth = 0",
                "connection_queue_depth = 0 is out of range: allowed 1..=65536",
            ),
            ("listen = \"nohost\"", "listen = \"nohost\" is invalid: expected host:port"),
            (
                "listen = \":7070\"",
                "listen = \":7070\" is invalid: expected host:port, the host is empty",
            ),
            (
                "master = \"m:0\"",
                "master = \"m:0\" is invalid: expected host:port with a port in 1..=65535",
            ),
            ("data_path = \"\"", "data_path = \"\" is invalid: a path is required"),
            ("key_file = \"\"", "key_file = \"\" is invalid: a path is required"),
        ];
        for (toml, want) in cases {
            assert_eq!(server_err(toml), want, "for {toml:?}");
        }
        ServerConfig::from_toml_str("device_size_bytes = 0").unwrap();
    }

    #[test]
    fn master_and_client_ranges_name_the_field() {
        let master = |t: &str| MasterConfig::from_toml_str(t).unwrap_err().to_string();
        assert_eq!(
            master("heartbeat_interval_ms = 5"),
            "heartbeat_interval_ms = 5 is out of range: allowed 10..=60000"
        );
        assert_eq!(
            master("heartbeat_interval_ms = 1000\ndown_after_ms = 1500"),
            "down_after_ms = 1500 is out of range: allowed 2000..=3600000 \
             (at least 2 x heartbeat_interval_ms)"
        );
        assert_eq!(master("listen = \"x\""), "listen = \"x\" is invalid: expected host:port");
        assert_eq!(master("key_file = \"\""), "key_file = \"\" is invalid: a path is required");

        let client = |t: &str| ClientConfig::from_toml_str(t).unwrap_err().to_string();
        let cases = [
            (
                "connect_timeout_ms = 0",
                "connect_timeout_ms = 0 is out of range: allowed 1..=600000",
            ),
            (
                "request_timeout_ms = 0",
                "request_timeout_ms = 0 is out of range: allowed 1..=3600000",
            ),
            (
                "max_unfinished_writes = 0",
                "max_unfinished_writes = 0 is out of range: allowed 1..=65536",
            ),
            (
                "dentry_ttl_ms = 3600001",
                "dentry_ttl_ms = 3600001 is out of range: allowed 0..=3600000",
            ),
            (
                "dentry_cache_entries = 16777217",
                "dentry_cache_entries = 16777217 is out of range: allowed 0..=16777216",
            ),
            ("reply_spin_us = 1001", "reply_spin_us = 1001 is out of range: allowed 0..=1000"),
            ("shm_ring_kib = 2", "shm_ring_kib = 2 is out of range: allowed 4..=65536"),
            ("shm_ring_kib = 3000", "shm_ring_kib = 3000 is invalid: not a power of two"),
            (
                "master = \"m:x\"",
                "master = \"m:x\" is invalid: expected host:port with a port in 1..=65535",
            ),
            ("key_file = \"\"", "key_file = \"\" is invalid: a path is required"),
        ];
        for (toml, want) in cases {
            assert_eq!(client(toml), want, "for {toml:?}");
        }

        let err = PfsConfig::from_toml_str("[client]\nmax_unfinished_writes = 0\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "client.max_unfinished_writes = 0 is out of range: allowed 1..=65536"
        );
    }

    #[test]
    fn load_names_the_file() {
        let dir = std::env::temp_dir().join(format!("pfs-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("server.toml");
        std::fs::write(&path, "workers = 0\n").unwrap();
        let err = ServerConfig::load(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("config file {}: workers = 0 is out of range: allowed 1..=256", path.display())
        );
        std::fs::write(&path, "workers = 8\n").unwrap();
        assert_eq!(ServerConfig::load(&path).unwrap().workers, 8);
        let missing = dir.join("missing.toml");
        let err = ServerConfig::load(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("cannot read config file {}:", missing.display())),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
