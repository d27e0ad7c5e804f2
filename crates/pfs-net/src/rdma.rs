//! RDMA device discovery (cargo feature `rdma`, through `sideway`).
//!
//! Only discovery is built: RC queue pairs over verbs are not implemented yet, and
//! [`connect`](crate::connect) falls back to TCP with a warning either way.

/// RDMA devices on this host, or why there can be none.
#[cfg(feature = "rdma")]
pub fn device_count() -> Result<usize, String> {
    match sideway::ibverbs::device::DeviceList::new() {
        Ok(list) => Ok(list.len()),
        Err(e) => Err(format!("no RDMA devices: {e}")),
    }
}

/// RDMA devices on this host, or why there can be none.
#[cfg(not(feature = "rdma"))]
pub fn device_count() -> Result<usize, String> {
    Err("this build has no RDMA support (cargo feature `rdma`)".into())
}
