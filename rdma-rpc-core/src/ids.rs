//! [`IdMap`]: hash maps keyed by numbers this process hands out itself (call ids, operation
//! ids, connection ids, window keys, the addresses of DOCA objects), hashed with one
//! multiplication instead of SipHash.
//!
//! SipHash (std's default) protects a table whose keys an attacker chooses from being
//! flooded with collisions. The keys here are chosen by this process, sequential or salted,
//! and a peer only ever *looks up* keys in them (a window key in a descriptor, a call id in a
//! frame): a lookup never grows a table, so a weak hash costs an attacker's own connection at
//! most one slow probe. SipHash's cost, on the other hand, is paid by every call: measured
//! over DOCA, the transport's three maps took about 3,100 instructions of the 42,600 of a
//! 64 B call (callgrind, both sides together).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by numbers this process chose (see the module's documentation).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing's multiplier: 2^64 divided by the golden ratio, odd.
const FIBONACCI: u64 = 0x9e37_79b9_7f4a_7c15;

/// A second odd multiplier (splitmix64's) for the final fold.
const FOLD: u64 = 0xbf58_476d_1ce4_e5b9;

/// The hasher of [`IdMap`]: each word is mixed in with a multiplication.
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl IdHasher {
    fn mix(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(FIBONACCI);
    }
}

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // A product's low bits depend only on the key's low bits (all zero for aligned
        // addresses), and the table picks a bucket by the low bits: fold the 128-bit product
        // with a second multiplier, so every bit of the result depends on every bit of the key.
        let wide = u128::from(self.0) * u128::from(FOLD);
        (wide as u64) ^ ((wide >> 64) as u64)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.mix(u64::from_le_bytes(chunk.try_into().expect("eight bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.mix(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.mix(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    fn hash<T: std::hash::Hash>(value: T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(value)
    }

    /// hashbrown picks a bucket with the hash's low bits: keys that differ only above them
    /// (aligned addresses, ids in steps of a power of two) must still land apart.
    #[test]
    fn aligned_keys_spread_over_the_low_bits() {
        for step in [1u64, 8, 64, 4096, 1 << 20] {
            let buckets: std::collections::HashSet<u64> = (0..256u64)
                .map(|i| hash(0x7f00_0000_0000 + i * step) & 255)
                .collect();
            // 256 random hashes fill about 162 of 256 buckets; clustered ones a handful.
            assert!(
                buckets.len() > 100,
                "keys {step} apart fell into {} of 256 buckets",
                buckets.len()
            );
        }
    }

    #[test]
    fn equal_keys_hash_equal_and_different_ones_differ() {
        assert_eq!(hash(42u64), hash(42u64));
        assert_ne!(hash(42u64), hash(43u64));
        assert_ne!(hash(7u32), hash(7u64.wrapping_add(1 << 40)));
        assert_ne!(hash([1u8; 9].as_slice()), hash([1u8; 10].as_slice()));
    }

    #[test]
    fn a_map_keyed_by_addresses_works() {
        let mut map: IdMap<usize, usize> = IdMap::default();
        for i in 0..10_000usize {
            map.insert(0x5555_0000_0000 + i * 64, i);
        }
        for i in 0..10_000usize {
            assert_eq!(map.get(&(0x5555_0000_0000 + i * 64)), Some(&i));
        }
        assert_eq!(map.get(&1), None);
    }
}
