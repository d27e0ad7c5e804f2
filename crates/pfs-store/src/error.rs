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
    /// A format parameter is out of range; the text names it.
    #[error("invalid shard geometry: {0}")]
    Geometry(String),
}

impl From<StoreError> for FsError {
    fn from(e: StoreError) -> FsError {
        match e {
            StoreError::Fs(e) => e,
            e => FsError::Io(e.to_string()),
        }
    }
}

impl From<DeviceError> for FsError {
    fn from(e: DeviceError) -> FsError {
        FsError::Io(e.to_string())
    }
}
