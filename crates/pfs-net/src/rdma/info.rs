//! What two RDMA peers tell each other to connect their RC queue pairs (the
//! `RdmaInfo` handshake message) and to name a registered region (`RdmaRegion`).
//!
//! Both travel as payloads of transport messages (`msg`), so magic, version and
//! checksum are already checked; these decoders check every field, and bytes from a
//! hostile peer give an `Err` with the reason, never a panic. Layouts:
//! `docs/format.md`, "RDMA".

use crate::msg::MAX_MSG_BYTES;

/// Bytes in an encoded [`ConnInfo`].
pub const CONN_INFO_BYTES: usize = 44;
/// Bytes in an encoded [`RegionAd`].
pub const REGION_AD_BYTES: usize = 20;
/// Smallest RDMA message buffer: a region advertisement (header and payload) fits.
pub const MIN_MSG_BYTES: u32 = 64;
/// Most receive buffers or regions a peer may announce.
pub const MAX_ANNOUNCED: u32 = 1 << 16;
/// Queue pair numbers and packet sequence numbers are 24-bit.
const U24_MAX: u32 = (1 << 24) - 1;

/// One side's address and sizes for connecting a reliable-connected queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    /// The sender's queue pair number (24 bits; 0 and 1 are reserved by verbs).
    pub qp_num: u32,
    /// The first packet sequence number the sender sends (24 bits).
    pub psn: u32,
    /// The sender's port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The sender's active path MTU as verbs numbers it: 1 = 256 bytes .. 5 = 4096.
    pub mtu: u8,
    /// RDMA reads the sender serves at once as the responder.
    pub rd_atomic: u8,
    /// The sender's GID (all zero when it has none: InfiniBand without routing).
    pub gid: [u8; 16],
    /// Receive buffers the sender keeps posted.
    pub recv_depth: u32,
    /// Bytes in each of them: the largest message the peer may send.
    pub msg_bytes: u32,
    /// Region ids the sender accepts advertisements for (`0..max_regions`).
    pub max_regions: u32,
    /// The client id carried by reply immediates on this connection; chosen by the
    /// server, 0 from the client.
    pub imm_client: u16,
}

impl ConnInfo {
    /// The payload bytes.
    pub fn encode(&self) -> [u8; CONN_INFO_BYTES] {
        let mut b = [0u8; CONN_INFO_BYTES];
        b[0..4].copy_from_slice(&self.qp_num.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10] = self.mtu;
        b[11] = self.rd_atomic;
        b[12..28].copy_from_slice(&self.gid);
        b[28..32].copy_from_slice(&self.recv_depth.to_le_bytes());
        b[32..36].copy_from_slice(&self.msg_bytes.to_le_bytes());
        b[36..40].copy_from_slice(&self.max_regions.to_le_bytes());
        b[40..42].copy_from_slice(&self.imm_client.to_le_bytes());
        // 42..44 reserved, zero.
        b
    }

    /// Checks and decodes a payload.
    pub fn decode(p: &[u8]) -> Result<ConnInfo, String> {
        if p.len() != CONN_INFO_BYTES {
            return Err(format!("rdma info of {} bytes, expected {CONN_INFO_BYTES}", p.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().expect("4 bytes"));
        let info = ConnInfo {
            qp_num: u32_at(0),
            psn: u32_at(4),
            lid: u16::from_le_bytes([p[8], p[9]]),
            mtu: p[10],
            rd_atomic: p[11],
            gid: p[12..28].try_into().expect("16 bytes"),
            recv_depth: u32_at(28),
            msg_bytes: u32_at(32),
            max_regions: u32_at(36),
            imm_client: u16::from_le_bytes([p[40], p[41]]),
        };
        if !(2..=U24_MAX).contains(&info.qp_num) {
            return Err(format!("rdma info: queue pair number {} is not in 2..2^24", info.qp_num));
        }
        if info.psn > U24_MAX {
            return Err(format!("rdma info: packet sequence number {} is over 24 bits", info.psn));
        }
        if !(1..=5).contains(&info.mtu) {
            return Err(format!("rdma info: path mtu code {} is not in 1..=5", info.mtu));
        }
        if info.lid == 0 && info.gid == [0; 16] {
            return Err("rdma info: neither a LID nor a GID to reach the peer at".into());
        }
        if !(1..=MAX_ANNOUNCED).contains(&info.recv_depth) {
            return Err(format!(
                "rdma info: {} receive buffers, expected 1..={MAX_ANNOUNCED}",
                info.recv_depth
            ));
        }
        if !(MIN_MSG_BYTES..=MAX_MSG_BYTES as u32).contains(&info.msg_bytes) {
            return Err(format!(
                "rdma info: message buffers of {} bytes, expected {MIN_MSG_BYTES}..={MAX_MSG_BYTES}",
                info.msg_bytes
            ));
        }
        if info.max_regions > MAX_ANNOUNCED {
            return Err(format!(
                "rdma info: {} regions, expected at most {MAX_ANNOUNCED}",
                info.max_regions
            ));
        }
        if p[42..44] != [0, 0] {
            return Err("rdma info: reserved bytes 42..44 are not zero".into());
        }
        Ok(info)
    }

    /// The path MTU in bytes.
    pub fn mtu_bytes(&self) -> u32 {
        128 << self.mtu
    }
}

/// A registered region as its owner announces it: the peer's one-sided writes and
/// reads name it by id and the NIC reaches it by address and remote key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionAd {
    /// Virtual address of byte 0 in the owner's memory.
    pub addr: u64,
    /// Bytes in the region.
    pub len: u64,
    /// The remote key of its memory registration.
    pub rkey: u32,
}

impl RegionAd {
    /// The payload bytes (the region id travels in the message header).
    pub fn encode(&self) -> [u8; REGION_AD_BYTES] {
        let mut b = [0u8; REGION_AD_BYTES];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Checks and decodes a payload.
    pub fn decode(p: &[u8]) -> Result<RegionAd, String> {
        if p.len() != REGION_AD_BYTES {
            return Err(format!(
                "region advertisement of {} bytes, expected {REGION_AD_BYTES}",
                p.len()
            ));
        }
        let ad = RegionAd {
            addr: u64::from_le_bytes(p[0..8].try_into().expect("8 bytes")),
            len: u64::from_le_bytes(p[8..16].try_into().expect("8 bytes")),
            rkey: u32::from_le_bytes(p[16..20].try_into().expect("4 bytes")),
        };
        if ad.addr.checked_add(ad.len).is_none() {
            return Err(format!(
                "region advertisement: {} bytes at 0x{:x} wrap the address space",
                ad.len, ad.addr
            ));
        }
        Ok(ad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> ConnInfo {
        ConnInfo {
            qp_num: 0x00_1234,
            psn: 0xab_cdef,
            lid: 7,
            mtu: 5,
            rd_atomic: 16,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            recv_depth: 256,
            msg_bytes: 16 << 10,
            max_regions: 64,
            imm_client: 9,
        }
    }

    #[test]
    fn conn_info_round_trips_and_sits_where_the_layout_says() {
        let info = sample();
        let b = info.encode();
        assert_eq!(ConnInfo::decode(&b), Ok(info));
        assert_eq!(b[0..4], [0x34, 0x12, 0, 0]);
        assert_eq!(b[4..8], [0xef, 0xcd, 0xab, 0]);
        assert_eq!((b[8], b[10], b[11]), (7, 5, 16));
        assert_eq!(b[12..14], [0xfe, 0x80]);
        assert_eq!(b[40..44], [9, 0, 0, 0]);
        assert_eq!(info.mtu_bytes(), 4096);
        assert_eq!(ConnInfo { mtu: 1, ..info }.mtu_bytes(), 256);
    }

    #[test]
    fn conn_info_refuses_each_bad_field_with_its_name() {
        let good = sample();
        let cases: [(ConnInfo, &str); 9] = [
            (ConnInfo { qp_num: 1, ..good }, "queue pair number 1"),
            (ConnInfo { qp_num: 1 << 24, ..good }, "queue pair number 16777216"),
            (ConnInfo { psn: 1 << 24, ..good }, "packet sequence number"),
            (ConnInfo { mtu: 0, ..good }, "path mtu code 0"),
            (ConnInfo { mtu: 6, ..good }, "path mtu code 6"),
            (ConnInfo { lid: 0, gid: [0; 16], ..good }, "neither a LID nor a GID"),
            (ConnInfo { recv_depth: 0, ..good }, "0 receive buffers"),
            (ConnInfo { msg_bytes: 63, ..good }, "message buffers of 63 bytes"),
            (ConnInfo { max_regions: MAX_ANNOUNCED + 1, ..good }, "65537 regions"),
        ];
        for (info, want) in cases {
            let e = ConnInfo::decode(&info.encode()).unwrap_err();
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
        let mut b = good.encode();
        b[43] = 1;
        assert!(ConnInfo::decode(&b).unwrap_err().contains("reserved"));
        assert!(ConnInfo::decode(&b[..43]).unwrap_err().contains("43 bytes, expected 44"));
        // A GID alone (RoCE) and a LID alone (InfiniBand) are both addresses.
        assert!(ConnInfo::decode(&ConnInfo { lid: 0, ..good }.encode()).is_ok());
        assert!(ConnInfo::decode(&ConnInfo { gid: [0; 16], ..good }.encode()).is_ok());
    }

    #[test]
    fn region_ad_round_trips_and_refuses_wrapping_ranges() {
        let ad = RegionAd { addr: 0x7f00_0000_1000, len: 1 << 20, rkey: 0xdead_beef };
        let b = ad.encode();
        assert_eq!(RegionAd::decode(&b), Ok(ad));
        assert_eq!(b[16..20], 0xdead_beef_u32.to_le_bytes());
        let wrap = RegionAd { addr: u64::MAX - 1, len: 2, rkey: 1 };
        assert!(RegionAd::decode(&wrap.encode()).unwrap_err().contains("wrap"));
        assert!(RegionAd::decode(&b[..19]).unwrap_err().contains("19 bytes"));
    }

    proptest! {
        #[test]
        fn conn_info_decode_never_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(info) = ConnInfo::decode(&bytes) {
                // Whatever decodes re-encodes to the same bytes.
                prop_assert_eq!(&info.encode()[..], &bytes[..]);
            }
        }

        #[test]
        fn conn_info_decode_survives_mutations(pos in 0..CONN_INFO_BYTES, xor in 1..=255u8) {
            let mut b = sample().encode();
            b[pos] ^= xor;
            match ConnInfo::decode(&b) {
                Ok(info) => prop_assert_ne!(info, sample()),
                Err(e) => prop_assert!(e.starts_with("rdma info")),
            }
        }

        #[test]
        fn region_ad_decode_never_panics_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
            if let Ok(ad) = RegionAd::decode(&bytes) {
                prop_assert_eq!(&ad.encode()[..], &bytes[..]);
                prop_assert!(ad.addr.checked_add(ad.len).is_some());
            }
        }
    }
}
