//! The 32-bit immediate of a reply written with RDMA WRITE_WITH_IMM: which client
//! and which request slot the bytes just written answer (the self-identified RPC of
//! Octopus+, section 3.3.1), so the receiver finds the request without a search.
//!
//! ```text
//! bits 31..16  client: the id the server gave this connection in its RdmaInfo
//! bits 15..0   slot:   the request slot (the low 16 bits of the request id)
//! ```
//!
//! Sixteen slot bits cover every slot an [`RpcClient`](crate::RpcClient) can name
//! (`MAX_CREDITS` is 2^16). A value past either field is refused, never truncated:
//! a wrapped slot would complete someone else's request. Verbs carry the immediate
//! big-endian (network order); [`ReplyImm::to_wire`] and [`ReplyImm::from_wire`] do
//! that conversion, [`ReplyImm::bits`] and [`ReplyImm::from_bits`] are the host value.

use crate::NetError;

/// Bits of the immediate that hold the request slot.
pub const IMM_SLOT_BITS: u32 = 16;
/// Bits of the immediate that hold the client id.
pub const IMM_CLIENT_BITS: u32 = 32 - IMM_SLOT_BITS;
/// Largest slot an immediate can carry.
pub const IMM_SLOT_MAX: u32 = (1 << IMM_SLOT_BITS) - 1;
/// Largest client id an immediate can carry.
pub const IMM_CLIENT_MAX: u32 = (1 << IMM_CLIENT_BITS) - 1;

// Every slot the RPC client can use must fit.
const _: () = assert!(IMM_SLOT_MAX + 1 == crate::rpc::MAX_CREDITS);

/// A checked (client, slot) pair, as carried by a reply's immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReplyImm {
    bits: u32,
}

impl ReplyImm {
    /// The pair, or `Invalid` when `client` or `slot` does not fit its field.
    pub fn new(client: u32, slot: u32) -> Result<ReplyImm, NetError> {
        if client > IMM_CLIENT_MAX {
            return Err(NetError::Invalid(format!(
                "immediate client id {client} is over the {IMM_CLIENT_BITS}-bit limit {IMM_CLIENT_MAX}"
            )));
        }
        if slot > IMM_SLOT_MAX {
            return Err(NetError::Invalid(format!(
                "immediate slot {slot} is over the {IMM_SLOT_BITS}-bit limit {IMM_SLOT_MAX}"
            )));
        }
        Ok(ReplyImm { bits: (client << IMM_SLOT_BITS) | slot })
    }

    /// The pair a host-order immediate names; every `u32` names one.
    pub fn from_bits(bits: u32) -> ReplyImm {
        ReplyImm { bits }
    }

    /// The host-order immediate.
    pub fn bits(self) -> u32 {
        self.bits
    }

    /// The immediate as a work request carries it (network order).
    pub fn to_wire(self) -> u32 {
        self.bits.to_be()
    }

    /// The pair from the immediate of a work completion (network order).
    pub fn from_wire(wire: u32) -> ReplyImm {
        ReplyImm { bits: u32::from_be(wire) }
    }

    /// The client id.
    pub fn client(self) -> u32 {
        self.bits >> IMM_SLOT_BITS
    }

    /// The request slot.
    pub fn slot(self) -> u32 {
        self.bits & IMM_SLOT_MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fields_sit_where_the_layout_says() {
        let imm = ReplyImm::new(0x1234, 0xabcd).unwrap();
        assert_eq!(imm.bits(), 0x1234_abcd);
        assert_eq!(imm.to_wire().to_ne_bytes(), [0x12, 0x34, 0xab, 0xcd], "network order");
        assert_eq!(ReplyImm::from_wire(imm.to_wire()), imm);
        assert_eq!((imm.client(), imm.slot()), (0x1234, 0xabcd));
    }

    #[test]
    fn bounds_are_inclusive_and_one_past_is_refused() {
        let top = ReplyImm::new(IMM_CLIENT_MAX, IMM_SLOT_MAX).unwrap();
        assert_eq!(top.bits(), u32::MAX);
        assert_eq!((top.client(), top.slot()), (65_535, 65_535));
        let zero = ReplyImm::new(0, 0).unwrap();
        assert_eq!(zero.bits(), 0);

        let e = ReplyImm::new(0, IMM_SLOT_MAX + 1).unwrap_err().to_string();
        assert!(e.contains("slot 65536 is over the 16-bit limit 65535"), "{e}");
        let e = ReplyImm::new(IMM_CLIENT_MAX + 1, 0).unwrap_err().to_string();
        assert!(e.contains("client id 65536 is over the 16-bit limit 65535"), "{e}");
        assert!(ReplyImm::new(u32::MAX, u32::MAX).is_err());
    }

    proptest! {
        #[test]
        fn round_trips_every_pair_in_range(client in 0..=IMM_CLIENT_MAX, slot in 0..=IMM_SLOT_MAX) {
            let imm = ReplyImm::new(client, slot).unwrap();
            let back = ReplyImm::from_wire(imm.to_wire());
            prop_assert_eq!((back.client(), back.slot()), (client, slot));
            prop_assert_eq!(ReplyImm::from_bits(imm.bits()), imm);
        }

        #[test]
        fn refuses_every_pair_out_of_range(client in any::<u32>(), slot in any::<u32>()) {
            let fits = client <= IMM_CLIENT_MAX && slot <= IMM_SLOT_MAX;
            prop_assert_eq!(ReplyImm::new(client, slot).is_ok(), fits);
        }
    }
}
