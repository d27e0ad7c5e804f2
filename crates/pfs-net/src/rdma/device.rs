//! [`RdmaDevice`]: an opened RDMA device, the port and GID used, and one protection
//! domain shared by every queue pair made on it.

use std::fmt;
use std::sync::Arc;

use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;

use super::RdmaConfig;
use crate::NetError;

/// An opened device with an active port, ready to make queue pairs.
pub struct RdmaDevice {
    pub(crate) pd: Arc<ProtectionDomain>,
    pub(crate) context: Arc<DeviceContext>,
    pub(crate) name: String,
    pub(crate) port: u8,
    pub(crate) gid_index: u8,
    pub(crate) lid: u16,
    pub(crate) gid: [u8; 16],
    /// Active path MTU as verbs numbers it (1 = 256 .. 5 = 4096).
    pub(crate) mtu: u8,
    /// Work requests one queue can hold.
    pub(crate) max_qp_wr: u32,
    /// RDMA reads a queue pair may serve, and start, at once.
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_init_rd_atomic: u8,
}

impl fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RdmaDevice({} port {} gid index {})", self.name, self.port, self.gid_index)
    }
}

/// An error and its sources, `: `-joined (sideway wraps the OS error).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    for _ in 0..8 {
        let Some(cause) = next else { break };
        let text = cause.to_string();
        if !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        next = cause.source();
    }
    s
}

fn unavailable(reason: String) -> NetError {
    NetError::Unavailable { transport: "rdma", reason }
}

impl RdmaDevice {
    /// Opens the device `cfg` names (or the first), checks that its port is active,
    /// and reads the port's LID, GID and MTU.
    pub fn open(cfg: &RdmaConfig) -> Result<Arc<RdmaDevice>, NetError> {
        let list = DeviceList::new()
            .map_err(|e| unavailable(format!("no RDMA devices: {}", chain(&e))))?;
        let device = match &cfg.device {
            Some(want) => list.iter().find(|d| d.name() == *want).ok_or_else(|| {
                let names: Vec<String> = list.iter().map(|d| d.name()).collect();
                unavailable(format!("no RDMA device {want} (devices: {names:?})"))
            })?,
            None => list.iter().next().ok_or_else(|| {
                unavailable("no RDMA devices: the verbs library lists none".into())
            })?,
        };
        let name = device.name();
        let fail = |what: &str, e: &dyn std::error::Error| {
            unavailable(format!("{what} of RDMA device {name}: {}", chain(e)))
        };
        let context = device.open().map_err(|e| fail("open", &e))?;
        let attr = context.query_device().map_err(|e| fail("query", &e))?;
        let port = context.query_port(cfg.port).map_err(|e| fail("query port", &e))?;
        if port.port_state() != PortState::Active {
            return Err(unavailable(format!(
                "port {} of RDMA device {name} is {:?}, not active",
                cfg.port,
                port.port_state()
            )));
        }
        let gid = context
            .query_gid(cfg.port, cfg.gid_index.into())
            .map_err(|e| fail("query the GID", &e))?;
        let pd = context.alloc_pd().map_err(|e| fail("allocate a protection domain", &e))?;
        let dev = RdmaDevice {
            pd,
            name,
            port: cfg.port,
            gid_index: cfg.gid_index,
            lid: port.lid(),
            gid: gid.raw,
            mtu: port.active_mtu() as u32 as u8,
            max_qp_wr: attr.max_qp_wr().max(0) as u32,
            max_rd_atomic: attr.max_qp_rd_atom().clamp(0, 255) as u8,
            max_init_rd_atomic: attr.max_qp_init_rd_atom().clamp(0, 255) as u8,
            context,
        };
        log::info!(
            "RDMA device {} port {}: lid {}, mtu {} bytes, {} work requests per queue",
            dev.name,
            dev.port,
            dev.lid,
            128u32 << dev.mtu,
            dev.max_qp_wr
        );
        Ok(Arc::new(dev))
    }
}
