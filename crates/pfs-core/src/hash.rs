//! A hasher for tables keyed by numbers the server chose (inode numbers,
//! metadata page numbers): the shard's tables, and the client's statahead
//! table. std's SipHash guards against keys an attacker picks, which these are
//! not, and cost 2-3% of a worker's time in md-easy stats over 200,000 inodes
//! (docs/benchmarks.md).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for inode and page numbers: a 128-bit folded multiply, good in low
/// and high bits.
#[derive(Default, Clone, Copy, Debug)]
pub struct NumHasher(u64);

impl Hasher for NumHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let m = u128::from(self.0 ^ x) * 0x9e37_79b9_7f4a_7c15_u128;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

/// A map keyed by server-chosen numbers, hashed with [`NumHasher`].
pub type NumMap<K, V> = HashMap<K, V, BuildHasherDefault<NumHasher>>;

/// A 64-bit key for a file name under a table's own `seed` (xxh3), for
/// tables that key names by number ([`NumMap`]) and keep the name beside the
/// value to check it: names are chosen by users, so a table picks a seed no
/// one can know in advance, and equal keys of different names (2^-64 for any
/// pair) only cost the table an entry.
pub fn name_key(seed: u64, name: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot_with_seed(seed, name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_numbers_spread_over_the_low_bits() {
        // hashbrown picks buckets from the low bits and tags from the top 7:
        // sequential inode numbers must not pile up in either.
        let b = BuildHasherDefault::<NumHasher>::default();
        let mut low = std::collections::HashSet::new();
        let mut top = std::collections::HashSet::new();
        for n in 0..4096u64 {
            let h = b.hash_one(crate::InodeId((1 << 40) + n));
            low.insert(h & 4095);
            top.insert(h >> 57);
        }
        assert!(low.len() > 2500, "{} of 4096 low-bit buckets used", low.len());
        assert_eq!(top.len(), 128, "every top-7-bit tag used");
    }
}
