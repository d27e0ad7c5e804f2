//! Why a transport operation failed.

use std::path::PathBuf;

/// Errors of the transport layer; the text names the peer and what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// A system call failed.
    #[error("{op} {peer}: {source}")]
    Io {
        /// What was being done (`connect to`, `read from`, ...).
        op: &'static str,
        /// The peer or local address involved.
        peer: String,
        /// The system error.
        source: std::io::Error,
    },
    /// The peer sent bytes that break the protocol; the connection is closed.
    #[error("peer {peer} broke the protocol: {reason}")]
    Protocol {
        /// The peer.
        peer: String,
        /// What was wrong and where.
        reason: String,
    },
    /// The peer closed the connection.
    #[error("peer {peer} closed the connection")]
    Closed {
        /// The peer.
        peer: String,
    },
    /// The connection failed earlier; it stays unusable.
    #[error("connection to {peer} is down: {reason}")]
    Down {
        /// The peer.
        peer: String,
        /// Why it went down.
        reason: String,
    },
    /// The peer did not prove it holds the cluster key.
    #[error("cluster key mismatch: peer {peer} did not prove the cluster key")]
    KeyMismatch {
        /// The peer.
        peer: String,
    },
    /// The peer refused the connection and said why.
    #[error("{peer} refused the connection: {reason}")]
    Refused {
        /// The peer.
        peer: String,
        /// Its reason.
        reason: String,
    },
    /// The handshake did not finish in time.
    #[error("handshake with {peer} did not finish within {timeout_ms} ms")]
    HandshakeTimeout {
        /// The peer.
        peer: String,
        /// The limit.
        timeout_ms: u64,
    },
    /// The cluster key file is missing or unusable.
    #[error("cluster key file {}: {reason}", path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A queue is full: back-pressure, try again after polling completions.
    #[error("{what} is full ({depth} entries)")]
    Full {
        /// The queue.
        what: &'static str,
        /// Its depth.
        depth: usize,
    },
    /// Every request credit of the connection is in use.
    #[error("no request credit left: {in_flight} requests in flight to {peer}")]
    NoCredit {
        /// The server.
        peer: String,
        /// Requests awaiting a reply (the credit limit).
        in_flight: usize,
    },
    /// No reply came before the deadline.
    #[error("request {request_id} to {peer} timed out after {timeout_ms} ms")]
    TimedOut {
        /// The request.
        request_id: u64,
        /// The server.
        peer: String,
        /// The timeout.
        timeout_ms: u64,
    },
    /// Not connected; the client reconnects after a back-off.
    #[error("not connected to {peer} (next attempt in {retry_in_ms} ms): {reason}")]
    Disconnected {
        /// The server.
        peer: String,
        /// Time until the next connection attempt.
        retry_in_ms: u64,
        /// Why the last connection failed or ended.
        reason: String,
    },
    /// A request id this client has no request for.
    #[error("no request {0} is in flight")]
    UnknownRequest(u64),
    /// A local argument is invalid (region bounds, buffer contents, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A frame could not be encoded or decoded.
    #[error("frame from {peer}: {source}")]
    Wire {
        /// The peer.
        peer: String,
        /// The wire error.
        source: pfs_core::WireError,
    },
    /// A transport that this build or machine cannot provide.
    #[error("transport {transport} is unavailable: {reason}")]
    Unavailable {
        /// The transport.
        transport: &'static str,
        /// Why.
        reason: String,
    },
}

impl NetError {
    /// Whether the peer could not be reached (down, restarting, gone from
    /// its address), as opposed to reached and refusing (a wrong key, a
    /// protocol it does not speak): a later attempt may succeed.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            NetError::Io { .. }
                | NetError::Closed { .. }
                | NetError::Down { .. }
                | NetError::HandshakeTimeout { .. }
                | NetError::Disconnected { .. }
        )
    }

    /// An [`NetError::Io`] error.
    pub(crate) fn io(op: &'static str, peer: impl Into<String>, source: std::io::Error) -> Self {
        NetError::Io { op, peer: peer.into(), source }
    }

    /// A [`NetError::Protocol`] error.
    pub(crate) fn protocol(peer: impl Into<String>, reason: impl Into<String>) -> Self {
        NetError::Protocol { peer: peer.into(), reason: reason.into() }
    }
}
