//! Errors of the storage layer.

use pfs_core::FsError;

use crate::device::DeviceError;

/// Why a shard could not be formatted, opened or recovered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// On-disk bytes that fail a check (magic, version, checksum, bounds).
    #[error("corruption: {0}")]
    Corruption(String),
    /// The device failed.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// An operation during format or recovery failed.
    #[error("{0}")]
    Fs(#[from] FsError),
    /// The zone's metadata, checkpoints and WAL could not be allocated on the
    /// device (a sparse data file on a full disk).
    #[error(
        "cannot allocate the zone's metadata and WAL ({bytes} bytes at offset {offset}): {error}"
    )]
    Reserve {
        /// Bytes asked for.
        bytes: u64,
        /// Where they start on the device.
        offset: u64,
        /// What the device said.
        error: DeviceError,
    },
    /// A format parameter is out of range; the text names it.
    #[error("invalid shard geometry: {0}")]
    Geometry(String),
}

impl From<StoreError> for FsError {
    fn from(e: StoreError) -> FsError {
        match e {
            StoreError::Fs(e) => e,
            StoreError::Device(e) => e.into(),
            e => FsError::Io(e.to_string()),
        }
    }
}

impl From<DeviceError> for FsError {
    /// A full disk under a sparse data file is ENOSPC to the client; any other
    /// device failure is EIO, with the device's message.
    fn from(e: DeviceError) -> FsError {
        match e {
            DeviceError::Io { errno: libc::ENOSPC, .. } => FsError::NoSpace,
            e => FsError::Io(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_enospc_and_other_device_errors_are_eio() {
        let full = DeviceError::Io { offset: 4096, errno: libc::ENOSPC };
        assert_eq!(FsError::from(full.clone()), FsError::NoSpace);
        assert_eq!(FsError::from(StoreError::Device(full)), FsError::NoSpace);
        let bad = FsError::from(DeviceError::Io { offset: 8192, errno: libc::EIO });
        assert!(matches!(&bad, FsError::Io(m) if m.contains("8192")), "{bad:?}");
    }
}
