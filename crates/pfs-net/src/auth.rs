//! The cluster key and the HMAC-SHA256 challenge every connection starts with.
//!
//! ```text
//! client -> server  Hello      client nonce (32) | wanted features (u32)
//! server -> client  Challenge  server nonce (32) | server proof (32) | features (u32)
//! client -> server  Proof      client proof (32)
//! server -> client  Accept     credits (u32) | features (u32) | boot id (u64) |
//!                              shm name (u16 len, bytes)
//!                or Refuse     reason (UTF-8)
//! then, for RDMA (WANT_RDMA asked, OFFERS_RDMA granted):
//! client -> server  RdmaInfo   its queue pair address and sizes (`rdma::ConnInfo`)
//! server -> client  RdmaInfo   the server's, or Refuse
//! client -> server  RdmaReady  the client's queue pair can receive
//! proof = HMAC-SHA256(key, role | client nonce | server nonce), role "pfs-net server v1"
//! for the server's proof, and for the connecting side "pfs-net client v1", or
//! "pfs-net peer-server v1" when its Hello has [`PEER_IS_SERVER`]
//! ```
//!
//! **Roles.** A server that connects to another (cross-shard transactions) sets
//! [`PEER_IS_SERVER`], and its proof covers that role, so the bit cannot be
//! flipped on the way. Servers refuse server-internal requests on connections
//! without it. Every holder of the cluster key can still claim the role: the
//! key authenticates the cluster, not the kind of member.
//!
//! **Boot id.** The Accept carries the server process's boot id, random per
//! start: a client that sees it change knows the server restarted, and that
//! changes it had acknowledged but not yet committed may be lost (the write
//! verifier of NFS).
//!
//! Both sides prove the key, with fresh nonces from both, so a recorded handshake
//! cannot be replayed. A side that cannot check the other's proof says so in its
//! log and refuses with the text `cluster key mismatch: peer ADDR did not prove the
//! cluster key`.

use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::msg::{Kind, NetHeader, MSG_HEADER_LEN, NET_MAGIC};
use crate::poller::random_bytes;
use crate::NetError;

/// Bytes in a nonce and in a proof.
pub const NONCE_BYTES: usize = 32;
/// Shortest cluster key accepted.
pub const KEY_MIN_BYTES: usize = 16;
/// Longest cluster key accepted.
pub const KEY_MAX_BYTES: usize = 4096;
/// Longest handshake message payload.
pub const MAX_HANDSHAKE_PAYLOAD: u32 = 2048;
/// Longest refusal reason sent.
pub const MAX_REASON_BYTES: usize = 1024;
/// Hello feature: the client only asks for the shared-memory socket name, and will
/// come back over it (no queue pair is made of this connection when shm is offered).
pub const WANT_SHM: u32 = 1;
/// Accept feature: the server offers shared memory at the name that follows.
pub const OFFERS_SHM: u32 = 1;
/// Hello feature: the client wants an RDMA queue pair; after the Accept it sends its
/// `RdmaInfo` if the server offers RDMA (`docs/format.md`, "RDMA").
pub const WANT_RDMA: u32 = 2;
/// Accept feature: the server has an RDMA device and makes RDMA queue pairs.
pub const OFFERS_RDMA: u32 = 2;
/// Hello feature: the client will use slot RPC on this connection (it announces
/// its inbox first; [`crate::link`]).
pub const WANT_SLOTS: u32 = 4;
/// Hello feature: the connecting side is a storage server (a peer in a
/// cross-shard transaction), not a client.
pub const PEER_IS_SERVER: u32 = 8;

const SERVER_ROLE: &[u8] = b"pfs-net server v1";
const CLIENT_ROLE: &[u8] = b"pfs-net client v1";
const PEER_SERVER_ROLE: &[u8] = b"pfs-net peer-server v1";

/// The role the connecting side proves, from its Hello features.
fn connecting_role(features: u32) -> &'static [u8] {
    if features & PEER_IS_SERVER != 0 {
        PEER_SERVER_ROLE
    } else {
        CLIENT_ROLE
    }
}

type HmacSha256 = Hmac<Sha256>;

/// The cluster's shared secret. Its bytes never appear in `Debug` output or logs.
#[derive(Clone)]
pub struct ClusterKey {
    bytes: Vec<u8>,
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey({} bytes)", self.bytes.len())
    }
}

impl ClusterKey {
    /// A key from raw bytes, refused outside `KEY_MIN_BYTES..=KEY_MAX_BYTES`.
    pub fn from_bytes(bytes: &[u8]) -> Result<ClusterKey, String> {
        if bytes.len() < KEY_MIN_BYTES || bytes.len() > KEY_MAX_BYTES {
            return Err(format!(
                "key is {} bytes, expected {KEY_MIN_BYTES}..={KEY_MAX_BYTES}",
                bytes.len()
            ));
        }
        Ok(ClusterKey { bytes: bytes.to_vec() })
    }

    /// Reads the key file at `path` (its raw bytes are the key).
    pub fn load(path: &Path) -> Result<ClusterKey, NetError> {
        let fail = |reason: String| NetError::KeyFile { path: path.to_owned(), reason };
        let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        if meta.len() > KEY_MAX_BYTES as u64 {
            return Err(fail(format!("{} bytes, expected at most {KEY_MAX_BYTES}", meta.len())));
        }
        let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read: {e}")))?;
        ClusterKey::from_bytes(&bytes).map_err(fail)
    }

    /// Writes a new random 32-byte key to `path` (mode 0600), refusing to overwrite.
    pub fn generate(path: &Path) -> Result<ClusterKey, NetError> {
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |reason: String| NetError::KeyFile { path: path.to_owned(), reason };
        let mut bytes = [0u8; 32];
        random_bytes(&mut bytes).map_err(|e| fail(format!("no randomness: {e}")))?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| fail(format!("cannot create: {e}")))?;
        file.write_all(&bytes).map_err(|e| fail(format!("cannot write: {e}")))?;
        file.sync_all().map_err(|e| fail(format!("cannot sync: {e}")))?;
        Ok(ClusterKey { bytes: bytes.to_vec() })
    }

    fn mac(&self, role: &[u8], client_nonce: &[u8], server_nonce: &[u8]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.bytes).expect("HMAC takes any key length");
        m.update(role);
        m.update(client_nonce);
        m.update(server_nonce);
        m
    }

    /// The proof a side with `role` sends.
    fn prove(&self, role: &[u8], cn: &[u8], sn: &[u8]) -> [u8; NONCE_BYTES] {
        self.mac(role, cn, sn).finalize().into_bytes().into()
    }

    /// Checks a proof in constant time.
    fn check(&self, role: &[u8], cn: &[u8], sn: &[u8], proof: &[u8]) -> bool {
        self.mac(role, cn, sn).verify_slice(proof).is_ok()
    }
}

/// What the server said when it accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptInfo {
    /// Requests the client may have in flight.
    pub credits: u32,
    /// [`OFFERS_SHM`], [`OFFERS_RDMA`].
    pub features: u32,
    /// The server process's boot id (random per start).
    pub boot: u64,
    /// Abstract unix socket name of the shared-memory listener, if offered.
    pub shm_name: String,
}

impl AcceptInfo {
    /// The Accept payload.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(18 + self.shm_name.len());
        p.extend_from_slice(&self.credits.to_le_bytes());
        p.extend_from_slice(&self.features.to_le_bytes());
        p.extend_from_slice(&self.boot.to_le_bytes());
        p.extend_from_slice(&(self.shm_name.len() as u16).to_le_bytes());
        p.extend_from_slice(self.shm_name.as_bytes());
        p
    }

    fn decode(p: &[u8]) -> Result<AcceptInfo, String> {
        const FIXED: usize = 18;
        if p.len() < FIXED {
            return Err(format!("accept message of {} bytes, expected at least {FIXED}", p.len()));
        }
        let credits = u32::from_le_bytes(p[0..4].try_into().expect("4"));
        let features = u32::from_le_bytes(p[4..8].try_into().expect("4"));
        let boot = u64::from_le_bytes(p[8..16].try_into().expect("8"));
        let name_len = u16::from_le_bytes([p[16], p[17]]) as usize;
        if p.len() != FIXED + name_len {
            return Err(format!("accept message names {name_len} bytes, has {}", p.len() - FIXED));
        }
        let shm_name = String::from_utf8(p[FIXED..].to_vec())
            .map_err(|_| "accept message: shm name is not UTF-8".to_owned())?;
        if credits == 0 {
            return Err("accept message grants 0 credits".into());
        }
        Ok(AcceptInfo { credits, features, boot, shm_name })
    }
}

/// Encodes a handshake message of `kind` with `payload`.
pub(crate) fn message(kind: Kind, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() <= MAX_HANDSHAKE_PAYLOAD as usize);
    let mut out = Vec::with_capacity(MSG_HEADER_LEN + payload.len());
    let h = NetHeader { kind, region: 0, len: payload.len() as u32, offset: 0, token: 0 };
    h.encode(payload, &mut out);
    out
}

/// A Refuse message carrying `reason` (cut to [`MAX_REASON_BYTES`]).
pub(crate) fn refusal(reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(MAX_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    message(Kind::Refuse, &reason.as_bytes()[..end])
}

/// Reads one handshake message from a blocking stream.
pub(crate) fn read_message<S: Read>(s: &mut S, peer: &str) -> Result<(Kind, Vec<u8>), NetError> {
    let mut head = [0u8; MSG_HEADER_LEN];
    s.read_exact(&mut head).map_err(|e| io_or_closed("read handshake from", peer, e))?;
    let magic = u32::from_le_bytes(head[..4].try_into().expect("4"));
    if magic != NET_MAGIC {
        return Err(NetError::protocol(peer, format!("handshake: bad magic 0x{magic:08x}")));
    }
    let h = NetHeader::decode(&head)
        .map_err(|r| NetError::protocol(peer, format!("handshake: {r}")))?;
    if h.len > MAX_HANDSHAKE_PAYLOAD {
        return Err(NetError::protocol(peer, format!("handshake message of {} bytes", h.len)));
    }
    let mut payload = vec![0u8; h.len as usize];
    s.read_exact(&mut payload).map_err(|e| io_or_closed("read handshake from", peer, e))?;
    let stored = u32::from_le_bytes(head[28..32].try_into().expect("4"));
    if crate::msg::checksum(&head[..28], &payload) != stored {
        return Err(NetError::protocol(peer, "handshake: checksum mismatch"));
    }
    Ok((h.kind, payload))
}

fn io_or_closed(op: &'static str, peer: &str, e: std::io::Error) -> NetError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => NetError::Closed { peer: peer.to_owned() },
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            NetError::HandshakeTimeout { peer: peer.to_owned(), timeout_ms: 0 }
        }
        _ => NetError::io(op, peer, e),
    }
}

/// Runs the client side of the handshake on a blocking stream (with timeouts set);
/// [`connect`](crate::connect) uses it, and tools that speak raw bytes after it.
pub fn client_handshake<S: Read + Write>(
    s: &mut S,
    key: &ClusterKey,
    peer: &str,
    features: u32,
) -> Result<AcceptInfo, NetError> {
    let mut cn = [0u8; NONCE_BYTES];
    random_bytes(&mut cn).map_err(|e| NetError::io("get randomness for", peer, e))?;
    let mut hello = cn.to_vec();
    hello.extend_from_slice(&features.to_le_bytes());
    s.write_all(&message(Kind::Hello, &hello))
        .map_err(|e| NetError::io("send hello to", peer, e))?;
    let (kind, p) = read_message(s, peer)?;
    let p = match kind {
        Kind::Challenge if p.len() == 2 * NONCE_BYTES + 4 => p,
        Kind::Refuse => return Err(refused(peer, &p)),
        _ => return Err(NetError::protocol(peer, format!("expected a challenge, got {kind:?}"))),
    };
    let (sn, server_proof) = (&p[..NONCE_BYTES], &p[NONCE_BYTES..2 * NONCE_BYTES]);
    let server_ok = key.check(SERVER_ROLE, &cn, sn, server_proof);
    // Answer even when the server's proof is wrong: the server then names us in its
    // log as the side that did not prove the key, and says so in its refusal.
    let proof = key.prove(connecting_role(features), &cn, sn);
    s.write_all(&message(Kind::Proof, &proof))
        .map_err(|e| NetError::io("send proof to", peer, e))?;
    let (kind, p) = read_message(s, peer)?;
    match kind {
        Kind::Refuse => Err(refused(peer, &p)),
        Kind::Accept if !server_ok => {
            let e = NetError::KeyMismatch { peer: peer.to_owned() };
            log::warn!("{e}");
            let _ = s.write_all(&refusal(&e.to_string()));
            Err(e)
        }
        Kind::Accept => AcceptInfo::decode(&p).map_err(|r| NetError::protocol(peer, r)),
        _ => Err(NetError::protocol(peer, format!("expected accept or refuse, got {kind:?}"))),
    }
}

pub(crate) fn refused(peer: &str, reason: &[u8]) -> NetError {
    let reason = String::from_utf8_lossy(reason).into_owned();
    let e = NetError::Refused { peer: peer.to_owned(), reason };
    log::warn!("{e}");
    e
}

/// Where the server side of a handshake is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ServerState {
    AwaitHello,
    AwaitProof,
    Done,
}

/// What the server should do after a handshake message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ServerStep {
    /// Send these bytes and wait for the next message.
    Reply(Vec<u8>),
    /// The peer proved the key: send these bytes (the Accept); the connection is up.
    /// `wants_shm` tells that the client asked only for the shm name.
    Accepted {
        /// The Accept message.
        reply: Vec<u8>,
        /// The client's Hello had [`WANT_SHM`].
        wants_shm: bool,
        /// The client's Hello had [`WANT_RDMA`].
        wants_rdma: bool,
        /// The client's Hello had [`WANT_SLOTS`].
        wants_slots: bool,
    },
    /// Refuse: log the reason, send the Refuse message, close.
    Refuse(String),
}

/// The server side of the handshake, driven one message at a time by the listener.
#[derive(Debug)]
pub(crate) struct ServerHandshake {
    state: ServerState,
    client_nonce: [u8; NONCE_BYTES],
    server_nonce: [u8; NONCE_BYTES],
    wants_shm: bool,
    wants_rdma: bool,
    wants_slots: bool,
    peer_is_server: bool,
}

impl ServerHandshake {
    /// The peer said it is a server ([`PEER_IS_SERVER`]) and proved it with the key.
    pub(crate) fn peer_is_server(&self) -> bool {
        self.state == ServerState::Done && self.peer_is_server
    }

    /// A handshake waiting for the client's Hello.
    pub(crate) fn new() -> ServerHandshake {
        ServerHandshake {
            state: ServerState::AwaitHello,
            client_nonce: [0; NONCE_BYTES],
            server_nonce: [0; NONCE_BYTES],
            wants_shm: false,
            wants_rdma: false,
            wants_slots: false,
            peer_is_server: false,
        }
    }

    /// Handles one message (`None`: the peer sent a pfs frame instead).
    pub(crate) fn on_message(
        &mut self,
        key: &ClusterKey,
        peer: &str,
        msg: Option<(Kind, &[u8])>,
        accept: &AcceptInfo,
    ) -> ServerStep {
        let mismatch = |why: &str| {
            ServerStep::Refuse(format!(
                "{} ({why})",
                NetError::KeyMismatch { peer: peer.to_owned() }
            ))
        };
        let Some((kind, p)) = msg else {
            return mismatch("it sent a frame before the handshake");
        };
        match (self.state, kind) {
            (ServerState::AwaitHello, Kind::Hello) if p.len() == NONCE_BYTES + 4 => {
                self.client_nonce.copy_from_slice(&p[..NONCE_BYTES]);
                let features = u32::from_le_bytes(p[NONCE_BYTES..].try_into().expect("4"));
                self.wants_shm = features & WANT_SHM != 0;
                self.wants_rdma = features & WANT_RDMA != 0;
                self.wants_slots = features & WANT_SLOTS != 0;
                self.peer_is_server = features & PEER_IS_SERVER != 0;
                if random_bytes(&mut self.server_nonce).is_err() {
                    return ServerStep::Refuse("server has no randomness".into());
                }
                let mut c = self.server_nonce.to_vec();
                c.extend_from_slice(&key.prove(
                    SERVER_ROLE,
                    &self.client_nonce,
                    &self.server_nonce,
                ));
                c.extend_from_slice(&accept.features.to_le_bytes());
                self.state = ServerState::AwaitProof;
                ServerStep::Reply(message(Kind::Challenge, &c))
            }
            (ServerState::AwaitProof, Kind::Proof) if p.len() == NONCE_BYTES => {
                let role = if self.peer_is_server { PEER_SERVER_ROLE } else { CLIENT_ROLE };
                if !key.check(role, &self.client_nonce, &self.server_nonce, p) {
                    return ServerStep::Refuse(
                        NetError::KeyMismatch { peer: peer.to_owned() }.to_string(),
                    );
                }
                self.state = ServerState::Done;
                ServerStep::Accepted {
                    reply: message(Kind::Accept, &accept.encode()),
                    wants_shm: self.wants_shm,
                    wants_rdma: self.wants_rdma,
                    wants_slots: self.wants_slots,
                }
            }
            (_, Kind::Refuse) => ServerStep::Refuse(format!(
                "peer {peer} refused: {}",
                String::from_utf8_lossy(&p[..p.len().min(MAX_REASON_BYTES)])
            )),
            (state, kind) => mismatch(&format!(
                "it sent {kind:?} with {} payload bytes while the server awaited {}",
                p.len(),
                if state == ServerState::AwaitHello { "a hello" } else { "a proof" }
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_key_role_and_nonces() {
        let a = ClusterKey::from_bytes(&[1; 32]).unwrap();
        let b = ClusterKey::from_bytes(&[2; 32]).unwrap();
        let p = a.prove(CLIENT_ROLE, &[3; 32], &[4; 32]);
        assert!(a.check(CLIENT_ROLE, &[3; 32], &[4; 32], &p));
        assert!(!b.check(CLIENT_ROLE, &[3; 32], &[4; 32], &p));
        assert!(!a.check(SERVER_ROLE, &[3; 32], &[4; 32], &p));
        assert!(!a.check(CLIENT_ROLE, &[3; 32], &[5; 32], &p));
        assert_eq!(format!("{a:?}"), "ClusterKey(32 bytes)");
        assert!(ClusterKey::from_bytes(&[0; 8]).unwrap_err().contains("8 bytes"));
    }

    #[test]
    fn key_file_errors_name_the_file() {
        let path = std::env::temp_dir().join(format!("pfs-net-key-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let err = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cluster key file {}: cannot read", path.display())));
        let key = ClusterKey::generate(&path).unwrap();
        assert_eq!(ClusterKey::load(&path).unwrap().bytes, key.bytes);
        assert!(ClusterKey::generate(&path).is_err(), "never overwrites a key");
        std::fs::remove_file(&path).unwrap();
    }
}
