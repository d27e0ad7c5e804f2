//! RDMA: reliable-connected queue pairs over verbs (cargo feature `rdma`, through
//! `sideway`), and the pure encodings they use, which every build has.
//!
//! - [`imm`]: the 32-bit immediate of a reply write, (client id, slot).
//! - [`info`]: the `RdmaInfo` handshake payload and the `RdmaRegion` advertisement.
//! - `device` (feature): opening the device, its port, GID and protection domain.
//! - `verbs` (feature): [`RdmaQp`], the [`QueuePair`](crate::QueuePair) over an RC
//!   queue pair: SEND/RECV for frames, RDMA WRITE/READ for one-sided operations,
//!   WRITE_WITH_IMM for replies written straight into the client's region.
//! - `setup` (feature): the client's [`connect`] and the listener's side of the
//!   exchange, over the authenticated TCP handshake.
//!
//! RPC runs over an RDMA queue pair through [`Link`](crate::Link) with slot RPC:
//! requests by SEND, replies (and requests too large for a SEND) written straight
//! into the peer's registered inbox with WRITE_WITH_IMM.
//!
//! Without a device (or without the feature) [`device_count`] says why, and
//! [`crate::connect`] with [`TransportKind::Rdma`](crate::TransportKind::Rdma) logs
//! that and uses tcp.

pub mod imm;
pub mod info;

#[cfg(feature = "rdma")]
mod device;
#[cfg(feature = "rdma")]
mod dma;
#[cfg(feature = "rdma")]
mod setup;
#[cfg(feature = "rdma")]
mod verbs;

#[cfg(feature = "rdma")]
pub use device::RdmaDevice;
pub use imm::ReplyImm;
pub use info::{ConnInfo, RegionAd};
#[cfg(feature = "rdma")]
pub use setup::{connect, connect_with};
#[cfg(feature = "rdma")]
pub(crate) use setup::{connect_booted, Offer, ServerSetup, SetupStep};
#[cfg(feature = "rdma")]
pub use verbs::RdmaQp;

/// Default bytes of each RDMA send and receive buffer (see [`RdmaConfig::msg_bytes`]).
pub const DEFAULT_MSG_BYTES: u32 = 16 << 10;

/// Default slots of an RDMA link's slot RPC (see [`RdmaConfig::slots`]).
pub const DEFAULT_SLOTS: u32 = 32;

/// Which RDMA device and port to use, and the size of message buffers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RdmaConfig {
    /// Device name (`mlx5_0`); `None` takes the first one found.
    pub device: Option<String>,
    /// Port of the device, from 1.
    pub port: u8,
    /// Index in the port's GID table (RoCE v2 wants a routable GID's index).
    pub gid_index: u8,
    /// Bytes of each send and receive buffer, and so the largest frame
    /// [`post_send`](crate::QueuePair::post_send) takes; bulk data goes one-sided.
    /// A connection pins `(send_depth + recv_depth) * msg_bytes` bytes.
    pub msg_bytes: u32,
    /// Slots of the slot RPC (`crate::link`) a client asks for, which bounds its
    /// requests in flight; each side pins `2 * slots * SLOT_BYTES` more.
    pub slots: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            device: None,
            port: 1,
            gid_index: 0,
            msg_bytes: DEFAULT_MSG_BYTES,
            slots: DEFAULT_SLOTS,
        }
    }
}

/// RDMA devices on this host (at least one), or why there are none.
#[cfg(feature = "rdma")]
pub fn device_count() -> Result<usize, String> {
    match sideway::ibverbs::device::DeviceList::new() {
        Ok(list) if list.is_empty() => Err("no RDMA devices: the verbs library lists none".into()),
        Ok(list) => Ok(list.len()),
        Err(e) => Err(format!("no RDMA devices: {}", device::chain(&e))),
    }
}

/// What a listener offers RDMA with: nothing, in a build without the feature.
#[cfg(not(feature = "rdma"))]
#[derive(Debug, Default)]
pub(crate) struct Offer;

#[cfg(not(feature = "rdma"))]
impl Offer {
    /// Logs that RDMA was asked for and cannot be offered.
    pub(crate) fn new(cfg: Option<&RdmaConfig>, at: &str) -> Offer {
        if cfg.is_some() {
            log::warn!("{at} does not offer rdma: {}", NO_FEATURE);
        }
        Offer
    }

    /// Never.
    pub(crate) fn offered(&self) -> bool {
        false
    }
}

#[cfg(not(feature = "rdma"))]
const NO_FEATURE: &str = "this build has no RDMA support (cargo feature `rdma`)";

/// RDMA devices on this host (at least one), or why there are none.
#[cfg(not(feature = "rdma"))]
pub fn device_count() -> Result<usize, String> {
    Err(NO_FEATURE.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine has no RDMA device (and no libibverbs), so discovery must fail
    /// and say why; on a host with a NIC set `PFS_TEST_HAS_RDMA=1` to skip.
    #[test]
    fn device_count_says_why_there_is_no_device() {
        if std::env::var_os("PFS_TEST_HAS_RDMA").is_some() {
            return;
        }
        let e = device_count().expect_err("no RDMA device on a test machine");
        if cfg!(feature = "rdma") {
            assert!(e.starts_with("no RDMA devices: "), "{e}");
            assert!(e.len() > "no RDMA devices: ".len(), "the reason follows: {e}");
        } else {
            assert!(e.contains("cargo feature `rdma`"), "{e}");
        }
    }

    #[test]
    fn default_buffers_hold_an_advertisement_and_fit_the_limit() {
        let c = RdmaConfig::default();
        assert!((info::MIN_MSG_BYTES..=crate::msg::MAX_MSG_BYTES as u32).contains(&c.msg_bytes));
        assert_eq!((c.port, c.gid_index, c.device), (1, 0, None));
    }
}
