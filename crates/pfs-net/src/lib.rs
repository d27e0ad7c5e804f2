//! pfs-net: the verbs-shaped transport under pfs. No async runtime: queue pairs are
//! polled by their owner and park on a descriptor when idle.
//!
//! - [`transport`]: the [`QueuePair`] trait, work ids, regions, completions.
//! - [`qp`]: [`Qp`], the queue pair of the tcp and shm backends; one-sided
//!   write/read emulated with messages the peer's poll applies.
//! - `msg`: what travels on a link (pfs-core frames and transport messages) and the
//!   bounded receive buffer that cuts a byte stream into them.
//! - [`shm`]: shared-memory rings with eventfd wake-ups, fds passed by `SCM_RIGHTS`.
//! - [`auth`]: the cluster key and the HMAC-SHA256 handshake.
//! - [`listener`]: non-blocking accept, handshakes, connection limit.
//! - [`link`]: [`Link`], a connection over any backend, and slot RPC (replies
//!   written one-sided into the client's inbox with an immediate).
//! - [`connect`](mod@connect): client set-up: RDMA when asked for, shm for a
//!   same-host server, else tcp.
//! - [`rpc`]: [`RpcClient`], request ids, credits, timeouts, reconnect with back-off.
//! - [`serve`]: [`FrameServer`], a simple request loop for tests and tools.
//! - [`rdma`]: RDMA queue pairs over verbs (feature `rdma`: `RdmaQp`,
//!   `rdma::connect`), the reply immediate and the connection-info encoding.
//! - `poller`: epoll and eventfd wrappers.
//! - [`fdguard`]: the descriptors pfs-net keeps open, which libpfs_preload keeps
//!   the host program from closing.
//!
//! Byte layouts: `docs/format.md`, "Transport and handshake".

pub mod auth;
pub mod connect;
mod error;
pub mod fdguard;
pub mod inline;
pub mod link;
pub mod listener;
pub mod msg;
pub mod poller;
pub mod qp;
pub mod rdma;
pub mod rpc;
pub mod serve;
pub mod shm;
pub mod transport;

pub use auth::ClusterKey;
pub use connect::{connect, ConnectOptions, TransportKind};
pub use error::NetError;
pub use link::{Link, SlotRpc, SLOT_BYTES};
pub use listener::{Listener, ListenerConfig};
pub use poller::{wait_readable, Epoll, EventFd};
pub use qp::{Qp, QpLimits, POLL_BATCH};
pub use rpc::{link_sum, RpcClient, RpcOptions};
pub use serve::FrameServer;
pub use transport::{Backend, Completion, QueuePair, RegionId, RegionRange, Rejected, WorkId};
