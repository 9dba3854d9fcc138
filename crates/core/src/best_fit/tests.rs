use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// The policy written as plainly as possible: free ranges in a `Vec` by address, the
/// best fit by a scan for the least `(size, offset)` that holds the aligned block.
#[derive(Debug)]
struct Reference {
    /// Free ranges `(offset, bytes)`, in address order.
    free: Vec<(u64, u64)>,
    /// Live blocks: offset -> bytes.
    used: BTreeMap<u64, u64>,
}

impl Reference {
    fn new(capacity: u64) -> Self {
        let free = if capacity > 0 {
            vec![(0, capacity)]
        } else {
            vec![]
        };
        Reference {
            free,
            used: BTreeMap::new(),
        }
    }

    fn report(&self) -> ArenaReport {
        ArenaReport {
            free_bytes: self.free.iter().map(|r| r.1).sum(),
            largest_free_bytes: self.free.iter().map(|r| r.1).max().unwrap_or(0),
            allocations: self.used.len() as u64,
        }
    }

    fn allocate(&mut self, size_bytes: u64, align: u64) -> Result<(u64, u64), AllocError> {
        let size = size_bytes.max(1);
        let best = (0..self.free.len())
            .filter_map(|k| {
                let (o, s) = self.free[k];
                let a = align_up(o, align)?;
                (a - o <= s && s - (a - o) >= size).then_some((s, o, k, a))
            })
            .min();
        let Some((s, o, k, a)) = best else {
            let r = self.report();
            return Err(AllocError::OutOfMemory {
                requested_bytes: size_bytes,
                free_bytes: r.free_bytes,
                largest_free_bytes: r.largest_free_bytes,
            });
        };
        let mut pieces = Vec::new();
        if a > o {
            pieces.push((o, a - o));
        }
        if a + size < o + s {
            pieces.push((a + size, o + s - a - size));
        }
        self.free.splice(k..=k, pieces);
        self.used.insert(a, size);
        Ok((a, size))
    }

    fn deallocate(&mut self, offset: u64) -> Result<u64, AllocError> {
        let size = self
            .used
            .remove(&offset)
            .ok_or(AllocError::UnknownBlock { addr: offset })?;
        let k = self.free.partition_point(|r| r.0 < offset);
        self.free.insert(k, (offset, size));
        if k + 1 < self.free.len() && offset + size == self.free[k + 1].0 {
            self.free[k].1 += self.free.remove(k + 1).1;
        }
        if k > 0 && self.free[k - 1].0 + self.free[k - 1].1 == offset {
            self.free[k - 1].1 += self.free.remove(k).1;
        }
        Ok(size)
    }
}

#[derive(Debug, Clone)]
enum RefOp {
    Alloc { size: u64, align_shift: u32 },
    Free { pick: usize },
    FreeUnknown { offset: u64 },
}

/// Sizes that make ties and bin edges common: multiples of 256 B up to 16 KiB, small odd
/// sizes, powers of two and their neighbours, and anything up to the capacity.
fn ref_op(capacity: u64) -> impl Strategy<Value = RefOp> {
    let size = prop_oneof![
        4 => (0u64..=64).prop_map(|k| k * 256),
        2 => 0u64..=600,
        2 => (4u32..20, -1i64..=1).prop_map(|(e, d)| ((1i64 << e) + d) as u64),
        1 => 0u64..=capacity,
    ];
    prop_oneof![
        6 => (size, prop_oneof![3 => Just(0u32), 1 => 0u32..=12])
            .prop_map(|(size, align_shift)| RefOp::Alloc { size, align_shift }),
        5 => any::<usize>().prop_map(|pick| RefOp::Free { pick }),
        1 => (0u64..capacity).prop_map(|offset| RefOp::FreeUnknown { offset }),
    ]
}

/// Runs `ops` on a best-fit arena and on the reference side by side, checking after every
/// operation that they agree and that the arena validates.
fn same_as_reference(
    a: &mut BestFit,
    r: &mut Reference,
    ops: Vec<RefOp>,
) -> Result<(), TestCaseError> {
    for op in ops {
        match op {
            RefOp::Alloc { size, align_shift } => {
                let align = 1u64 << align_shift;
                prop_assert_eq!(a.allocate(size, align), r.allocate(size, align));
            }
            RefOp::Free { pick } => {
                if r.used.is_empty() {
                    continue;
                }
                let offset = *r.used.keys().nth(pick % r.used.len()).unwrap();
                prop_assert_eq!(a.deallocate(offset), r.deallocate(offset));
            }
            RefOp::FreeUnknown { offset } => {
                prop_assert_eq!(a.deallocate(offset), r.deallocate(offset));
            }
        }
        a.validate().unwrap();
        prop_assert_eq!(a.report(), r.report());
        prop_assert_eq!(a.free_ranges().collect::<Vec<_>>(), r.free.clone());
    }
    Ok(())
}

/// Both sides with `holes` free ranges of `hole` bytes between live blocks of `pin`
/// bytes (as many as fit).
fn fragmented(capacity: u64, holes: usize, hole: u64, pin: u64) -> (BestFit, Reference) {
    let mut a = BestFit::new(capacity);
    let mut r = Reference::new(capacity);
    let mut freed = Vec::new();
    for _ in 0..holes {
        let h = a.allocate(hole, 1);
        assert_eq!(h, r.allocate(hole, 1));
        assert_eq!(a.allocate(pin, 1), r.allocate(pin, 1));
        freed.extend(h.ok().map(|(o, _)| o));
    }
    for o in freed {
        assert_eq!(a.deallocate(o), r.deallocate(o));
    }
    a.validate().unwrap();
    (a, r)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every choice, error, free range and report figure equals the plain reference's,
    /// and the arena validates, after every operation.
    #[test]
    fn same_choices_as_a_plain_scan(
        capacity in prop_oneof![Just(1u64 << 16), 1u64..=100_000, Just(1u64 << 20)],
        ops in proptest::collection::vec(ref_op(1 << 16), 1..400),
    ) {
        let mut a = BestFit::new(capacity);
        let mut r = Reference::new(capacity);
        same_as_reference(&mut a, &mut r, ops)?;
    }

    /// The same with up to 400 same-size holes first: bins that turn into B-trees and
    /// back, holes that only fit unaligned.
    #[test]
    fn same_choices_with_crowded_bins(
        holes in 0usize..400,
        hole in prop_oneof![Just(256u64), 250u64..=270, 1u64..=600],
        pin in 1u64..=300,
        ops in proptest::collection::vec(ref_op(1 << 16), 1..300),
    ) {
        let (mut a, mut r) = fragmented(1 << 20, holes, hole, pin);
        same_as_reference(&mut a, &mut r, ops)?;
    }
}

#[test]
fn aligned_request_skips_a_hole_that_only_fits_unaligned() {
    let mut a = BestFit::new(1 << 20);
    let (_p, _) = a.allocate(5, 1).unwrap(); // [0, 5)
    let (x, _) = a.allocate(10, 1).unwrap(); // [5, 15)
    let (_y, _) = a.allocate(300, 1).unwrap(); // [15, 315)
    let (_z, _) = a.allocate(1000, 1).unwrap(); // [315, 1315)
    a.deallocate(x).unwrap(); // hole [5, 15): big enough, but not at a 1024 boundary
    let (w, s) = a.allocate(8, 1024).unwrap();
    assert_eq!((w, s), (2048, 8));
    a.validate().unwrap();
    assert_eq!(
        a.free_ranges().collect::<Vec<_>>(),
        vec![(5, 10), (1315, 733), (2056, (1 << 20) - 2056)]
    );
}

#[test]
fn ties_go_to_the_lowest_address_within_a_bin_and_across_bins() {
    // Holes of 300 B at 1000 and at 0, of 290 B (same bin) at 2000, 4096 B at 3000.
    let mut a = BestFit::new(1 << 20);
    let mut at = Vec::new();
    for size in [300, 700, 300, 700, 290, 710, 4096, 100] {
        at.push(a.allocate(size, 1).unwrap().0);
    }
    for k in [4, 2, 0, 6] {
        a.deallocate(at[k]).unwrap();
    }
    a.validate().unwrap();
    assert_eq!(
        a.allocate(295, 1).unwrap().0,
        at[0],
        "300 B at the lower address"
    );
    assert_eq!(a.allocate(295, 1).unwrap().0, at[2], "the other 300 B hole");
    assert_eq!(
        a.allocate(1, 1).unwrap().0,
        at[0] + 295,
        "5 B left of the first hole"
    );
    assert_eq!(
        a.allocate(280, 1).unwrap().0,
        at[4],
        "290 B, smaller than 4096"
    );
    assert_eq!(a.allocate(1000, 1).unwrap().0, at[6], "next bin up");
    a.validate().unwrap();
}

#[test]
fn largest_free_and_node_slots_are_recycled() {
    let mut a = BestFit::new(1 << 20);
    for _ in 0..100 {
        let (x, _) = a.allocate(100, 64).unwrap();
        let (y, _) = a.allocate(300, 1).unwrap();
        a.deallocate(x).unwrap();
        a.deallocate(y).unwrap();
    }
    assert!(a.nodes.len() <= 4, "{} node slots", a.nodes.len());
    assert_eq!(a.report().largest_free_bytes, 1 << 20);
    a.validate().unwrap();
    assert_eq!(a.allocate(1 << 20, 1).unwrap(), (0, 1 << 20));
    assert_eq!(a.report().largest_free_bytes, 0);
}
