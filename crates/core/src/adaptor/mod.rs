//! Adaptors around a [`crate::Device`], as RMM composes resources: each wraps any device
//! (the simulated one or CUDA) and forwards every call, adding one thing.
//! - [`Capped`]: a memory limit below what the device has;
//! - [`Tracked`]: a record ([`VmmBook`]) of the VMM calls and segments that passed through;
//! - [`Metered`]: the physical bytes held (current and peak) in atomics that other threads
//!   read without a lock.
//!
//! Each implements [`crate::Device`] with [`crate::forward_device`], which forwards every
//! method it does not write out; one conformance test (below) checks that each forwards
//! every `Device` method.
mod capped;
mod metered;
mod tracked;
mod vmm_book;

pub use capped::Capped;
pub use metered::{Metered, Reserved};
pub use tracked::Tracked;
pub use vmm_book::{MappingRecord, PageRow, PageTable, VmmBook};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod conformance {
    //! Every adaptor forwards every [`Device`] method to the device it wraps: a probe device
    //! answers each method with a value of its own and counts the calls; each adaptor, with
    //! limits that never bite, must pass every call and every answer through.
    use super::*;
    use crate::{Device, DeviceError, DriverCall, DriverCounters, PhysHandle};
    use std::collections::BTreeMap;

    /// Every `Device` method, required and provided: adding a method to the trait without
    /// adding it here (and to the probe) fails `every_method_is_listed`.
    const METHODS: [&str; 16] = [
        "capacity_bytes",
        "granularity_bytes",
        "used_bytes",
        "counters",
        "alloc_segment",
        "free_segment",
        "reserve_va",
        "free_va",
        "create_physical",
        "release_physical",
        "map",
        "set_access",
        "unmap",
        "driver_used_bytes",
        "fill_pattern",
        "check_pattern",
    ];

    /// Answers with recognisable values and counts every call by method name.
    #[derive(Default)]
    struct Probe {
        calls: BTreeMap<&'static str, u32>,
    }

    impl Probe {
        fn hit(&mut self, m: &'static str) {
            *self.calls.entry(m).or_default() += 1;
        }
    }

    const G: u64 = 2 << 20;

    impl Device for Probe {
        fn capacity_bytes(&self) -> u64 {
            1 << 40
        }
        fn granularity_bytes(&self) -> u64 {
            G
        }
        fn used_bytes(&self) -> u64 {
            3 * G
        }
        fn counters(&self) -> DriverCounters {
            let mut c = DriverCounters::default();
            c.record(DriverCall::Alloc, 0.5);
            c
        }
        fn alloc_segment(&mut self, _bytes: u64) -> Result<u64, DeviceError> {
            self.hit("alloc_segment");
            Ok(0x1000_0000)
        }
        fn free_segment(&mut self, _addr: u64) -> Result<(), DeviceError> {
            self.hit("free_segment");
            Ok(())
        }
        fn reserve_va(&mut self, _bytes: u64) -> Result<u64, DeviceError> {
            self.hit("reserve_va");
            Ok(0x2000_0000)
        }
        fn free_va(&mut self, _va: u64, _bytes: u64) -> Result<(), DeviceError> {
            self.hit("free_va");
            Ok(())
        }
        fn create_physical(&mut self, _bytes: u64) -> Result<PhysHandle, DeviceError> {
            self.hit("create_physical");
            Ok(PhysHandle(77))
        }
        fn release_physical(&mut self, _handle: PhysHandle) -> Result<(), DeviceError> {
            self.hit("release_physical");
            Ok(())
        }
        fn map(&mut self, _va: u64, _bytes: u64, _handle: PhysHandle) -> Result<(), DeviceError> {
            self.hit("map");
            Ok(())
        }
        fn set_access(&mut self, _va: u64, _bytes: u64) -> Result<(), DeviceError> {
            self.hit("set_access");
            Ok(())
        }
        fn unmap(&mut self, _va: u64, _bytes: u64) -> Result<(), DeviceError> {
            self.hit("unmap");
            Ok(())
        }
        fn driver_used_bytes(&mut self) -> Option<u64> {
            self.hit("driver_used_bytes");
            Some(5 * G)
        }
        fn fill_pattern(
            &mut self,
            _addr: u64,
            _bytes: u64,
            _pattern: u32,
        ) -> Result<(), DeviceError> {
            self.hit("fill_pattern");
            Ok(())
        }
        fn check_pattern(
            &mut self,
            _addr: u64,
            _bytes: u64,
            _pattern: u32,
        ) -> Result<bool, DeviceError> {
            self.hit("check_pattern");
            Ok(true)
        }
    }

    /// Calls every method once on `d` and checks the answers are the probe's; returns the
    /// names of the methods whose answer came through.
    fn exercise(d: &mut dyn Device) -> Vec<&'static str> {
        let mut seen = Vec::new();
        let mut check = |name, ok: bool| {
            assert!(ok, "{name}: the probe's answer did not come through");
            seen.push(name);
        };
        check("capacity_bytes", d.capacity_bytes() == 1 << 40);
        check("granularity_bytes", d.granularity_bytes() == G);
        check("used_bytes", d.used_bytes() == 3 * G);
        check("counters", d.counters().get(DriverCall::Alloc) == 1);
        check("alloc_segment", d.alloc_segment(G) == Ok(0x1000_0000));
        check("free_segment", d.free_segment(0x1000_0000).is_ok());
        check("reserve_va", d.reserve_va(4 * G) == Ok(0x2000_0000));
        check(
            "create_physical",
            d.create_physical(G) == Ok(PhysHandle(77)),
        );
        check("map", d.map(0x2000_0000, G, PhysHandle(77)).is_ok());
        check("set_access", d.set_access(0x2000_0000, G).is_ok());
        check("fill_pattern", d.fill_pattern(0x2000_0000, G, 7).is_ok());
        check(
            "check_pattern",
            d.check_pattern(0x2000_0000, G, 7) == Ok(true),
        );
        check("driver_used_bytes", d.driver_used_bytes() == Some(5 * G));
        check("unmap", d.unmap(0x2000_0000, G).is_ok());
        check(
            "release_physical",
            d.release_physical(PhysHandle(77)).is_ok(),
        );
        check("free_va", d.free_va(0x2000_0000, 4 * G).is_ok());
        seen
    }

    #[test]
    fn every_method_is_listed() {
        let mut p = Probe::default();
        let seen = exercise(&mut p);
        assert_eq!(seen.len(), METHODS.len());
        assert_eq!(p.calls.len(), METHODS.len() - 4, "{:?}", p.calls);
    }

    /// Exercises every method through the adaptor `d` and checks that each mutating call
    /// reached the probe inside it once.
    fn assert_forwards<A: Device>(name: &str, mut d: A, probe: impl Fn(&A) -> &Probe) {
        let seen = exercise(&mut d);
        assert_eq!(seen.len(), METHODS.len());
        for m in &METHODS[4..] {
            assert_eq!(
                probe(&d).calls.get(m),
                Some(&1),
                "{name} does not forward {m}"
            );
        }
    }

    #[test]
    fn capped_forwards_every_method() {
        assert_forwards("Capped", Capped::new(Probe::default(), 1 << 40), |d| {
            &d.inner
        });
    }

    #[test]
    fn tracked_forwards_every_method() {
        assert_forwards("Tracked", Tracked::new(Probe::default()), |d| &d.inner);
    }

    #[test]
    fn metered_forwards_every_method() {
        let (d, _) = Metered::new(Probe::default());
        assert_forwards("Metered", d, |d| &d.inner);
    }

    /// An adaptor that writes no method out: [`crate::forward_device`] forwards them all.
    struct Bare {
        wrapped: Probe,
    }

    crate::forward_device! {
        impl Device for Bare => wrapped {}
    }

    #[test]
    fn forward_device_forwards_every_method_not_written_out() {
        assert_forwards(
            "Bare",
            Bare {
                wrapped: Probe::default(),
            },
            |d| &d.wrapped,
        );
    }
}
