//! Values of the cluster messages: server registration, usage reports, the view.

use super::cursor::{Reader, Writer};
use super::types::Codec;
use super::WireError;
use crate::ServerId;

/// Longest server address text (`host:port`).
pub const MAX_ADDR_BYTES: usize = 255;
/// Most servers a view lists.
pub const MAX_SERVERS: usize = 4096;

/// A server's usage, as it reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Data bytes in all its shards.
    pub total_bytes: u64,
    /// Data bytes in use.
    pub used_bytes: u64,
    /// Inode slots in all its shards.
    pub inodes_total: u64,
    /// Inode slots in use.
    pub inodes_used: u64,
}

/// One server in the cluster view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// Its index in the view; routing uses it.
    pub id: ServerId,
    /// Where clients connect, `host:port`.
    pub addr: String,
    /// Worker threads (shards) it runs.
    pub workers: u32,
    /// Whether it reported within the master's `down_after_ms`.
    pub up: bool,
    /// Milliseconds since its last report (`u64::MAX`: never).
    pub last_report_ms: u64,
    /// Its last reported usage.
    pub usage: Usage,
}

/// The cluster view the master hands out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Changes whenever a server registers or goes up or down.
    pub epoch: u64,
    /// Servers the cluster is configured for; routing needs all of them.
    pub servers_expected: u32,
    /// The servers registered so far, in id order.
    pub servers: Vec<ServerInfo>,
}

impl View {
    /// Whether every expected server registered, so clients can route.
    pub fn is_complete(&self) -> bool {
        self.servers.len() == self.servers_expected as usize
    }
}

pub(crate) fn write_addr(w: &mut Writer<'_>, addr: &str) -> Result<(), WireError> {
    w.bytes16("server address", addr.as_bytes(), MAX_ADDR_BYTES)
}

pub(crate) fn read_addr(r: &mut Reader<'_>) -> Result<String, WireError> {
    let b = r.bytes16("server address", MAX_ADDR_BYTES)?;
    String::from_utf8(b.to_vec())
        .map_err(|_| WireError::BadValue { what: "server address (not UTF-8)", value: 0 })
}

impl Codec for Usage {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u64(self.total_bytes);
        w.u64(self.used_bytes);
        w.u64(self.inodes_total);
        w.u64(self.inodes_used);
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(Usage {
            total_bytes: r.u64("usage total bytes")?,
            used_bytes: r.u64("usage used bytes")?,
            inodes_total: r.u64("usage inodes total")?,
            inodes_used: r.u64("usage inodes used")?,
        })
    }
}

impl ServerInfo {
    /// Fewest bytes one entry takes on the wire (an empty address).
    const MIN_WIRE_BYTES: usize = 4 + 2 + 4 + 1 + 8 + 32;
}

impl Codec for ServerInfo {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.u32(self.id.0);
        write_addr(w, &self.addr)?;
        w.u32(self.workers);
        w.bool(self.up);
        w.u64(self.last_report_ms);
        self.usage.put(w)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(ServerInfo {
            id: ServerId(r.u32("server id")?),
            addr: read_addr(r)?,
            workers: r.u32("server workers")?,
            up: r.bool("server up")?,
            last_report_ms: r.u64("server last report")?,
            usage: Usage::get(r)?,
        })
    }
}

impl Codec for View {
    fn put(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        super::cursor::check_len("view servers", self.servers.len(), MAX_SERVERS)?;
        w.u64(self.epoch);
        w.u32(self.servers_expected);
        w.count("view servers", self.servers.len())?;
        for s in &self.servers {
            s.put(w)?;
        }
        Ok(())
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let epoch = r.u64("view epoch")?;
        let servers_expected = r.u32("view servers expected")?;
        let count = r.count("view servers", ServerInfo::MIN_WIRE_BYTES)?;
        super::cursor::check_len("view servers", count, MAX_SERVERS)?;
        let mut servers = Vec::with_capacity(count);
        for _ in 0..count {
            servers.push(ServerInfo::get(r)?);
        }
        Ok(View { epoch, servers_expected, servers })
    }
}
