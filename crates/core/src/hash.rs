//! The one hasher of every general map keyed by a device address or a handle id (the trace
//! readers' live addresses, the replay's summaries): `rustc_hash` 2's `FxHasher`, whose
//! `finish` rotates the product so that the
//! well-mixed high bits pick the bucket. Device addresses are 256-byte to 2 MiB aligned: a
//! bare multiplicative hash leaves their low bits equal, and a hash map that takes its
//! bucket from the low bits then chains them all. Not keyed (no defence against a hostile
//! file beyond slowing its own reading down); SipHash would cost more than the allocator's
//! whole hit path.
//!
//! The two maps that take an insert and a removal on every allocate/free pair of a replay
//! (`paged`'s live blocks, the replay's live trace addresses) are
//! [`AddrTable`](crate::addr_table::AddrTable)s instead: one multiply a look-up and no
//! tombstones.
use std::collections::HashMap;

pub use rustc_hash::FxBuildHasher as AddrBuildHasher;

/// A hash map keyed by a device address, a handle id or a `(device, address)` pair.
pub type AddrMap<K, V> = HashMap<K, V, AddrBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// Distinct values of the low `bits` bits (the bucket index of a table of `2^bits`)
    /// over 4096 keys 2 MiB apart.
    fn low_bits_spread<K: std::hash::Hash>(key: impl Fn(u64) -> K, bits: u32) -> usize {
        let b = AddrBuildHasher;
        let mut low = std::collections::HashSet::new();
        for i in 0..4096u64 {
            low.insert(b.hash_one(key(0x7f00_0000_0000 + (i << 21))) & ((1 << bits) - 1));
        }
        low.len()
    }

    #[test]
    fn aligned_addresses_spread_over_buckets() {
        // 4096 random keys into 4096 buckets fill ≈ 63 % of them.
        for n in [
            low_bits_spread(|a| a, 12),
            low_bits_spread(|a| (0u32, a), 12),
        ] {
            assert!(n > 2400, "only {n} distinct low-12-bit values");
        }
        // Sequential handle ids: 1997 of 4096 values with rustc-hash 2.1 (half the
        // buckets), against 1 distinct value for a hasher without a final mix on 2 MiB keys.
        let b = AddrBuildHasher;
        let low: std::collections::HashSet<u64> =
            (1..=4096u64).map(|i| b.hash_one(i) & 0xfff).collect();
        assert!(low.len() > 1800, "{}", low.len());
    }

    #[test]
    fn the_map_works() {
        let mut m: AddrMap<u64, u32> = AddrMap::default();
        m.insert(1 << 21, 1);
        m.insert(2 << 21, 2);
        assert_eq!(m.get(&(2 << 21)), Some(&2));
        assert_eq!(m.len(), 2);
    }
}
