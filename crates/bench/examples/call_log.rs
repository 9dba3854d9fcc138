//! Replays one trace through one strategy on the simulated device and prints a digest of
//! every driver call it made, in order, with its arguments and answer (and of every block
//! address the allocator returned): two builds that print the same digest made the same
//! placement decisions and the same driver calls in the same order. For checking that a
//! speed change changed no decision.
//!
//! `cargo run --release -p gpumem-bench --example call_log -- TRACE ALLOCATOR [CAPACITY_BYTES]`
use std::hash::Hasher;

use gpumem::core::config::AllocatorConfig;
use gpumem::core::sim::SimDevice;
use gpumem::core::strategy::Strategy;
use gpumem::core::{forward_device, Allocator, Device, DeviceError, PhysHandle};
use gpumem::replay::{self, ReplayConfig};
use gpumem::trace::{read_path, ReadConfig};

/// FNV-1a over the words it is fed.
struct Digest(u64);

impl Hasher for Digest {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
}

/// A device that digests every call passing through it.
struct Logged {
    inner: SimDevice,
    digest: Digest,
    calls: u64,
}

impl Logged {
    fn log<T: std::fmt::Debug>(&mut self, kind: u8, args: &[u64], r: &Result<T, DeviceError>) {
        self.calls += 1;
        self.digest.write_u8(kind);
        for &a in args {
            self.digest.write_u64(a);
        }
        match r {
            Ok(v) => self.digest.write(format!("ok {v:?}").as_bytes()),
            Err(e) => self.digest.write(format!("err {e}").as_bytes()),
        }
    }
}

forward_device! {
    impl Device for Logged => inner {
        fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let r = self.inner.alloc_segment(bytes);
            self.log(0, &[bytes], &r);
            r
        }
        fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
            let r = self.inner.free_segment(addr);
            self.log(1, &[addr], &r);
            r
        }
        fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            let r = self.inner.reserve_va(bytes);
            self.log(2, &[bytes], &r);
            r
        }
        fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            let r = self.inner.free_va(va, bytes);
            self.log(3, &[va, bytes], &r);
            r
        }
        fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
            let r = self.inner.create_physical(bytes);
            self.log(4, &[bytes], &r);
            r
        }
        fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
            let r = self.inner.release_physical(handle);
            self.log(5, &[handle.0], &r);
            r
        }
        fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
            let r = self.inner.map(va, bytes, handle);
            self.log(6, &[va, bytes, handle.0], &r);
            r
        }
        fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            let r = self.inner.set_access(va, bytes);
            self.log(7, &[va, bytes], &r);
            r
        }
        fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
            let r = self.inner.unmap(va, bytes);
            self.log(8, &[va, bytes], &r);
            r
        }
    }
}

/// Passes every call to the strategy and digests the blocks it returns.
struct Watched {
    inner: Box<dyn Allocator>,
    digest: Digest,
}

impl Allocator for Watched {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn allocate(
        &mut self,
        dev: &mut dyn Device,
        size_bytes: u64,
        align: u64,
        stream: u64,
    ) -> Result<gpumem::core::Block, gpumem::core::AllocError> {
        let r = self.inner.allocate(dev, size_bytes, align, stream);
        match &r {
            Ok(b) => self.digest.write_u64(b.addr),
            Err(e) => self.digest.write(format!("{e}").as_bytes()),
        }
        r
    }
    fn deallocate(
        &mut self,
        dev: &mut dyn Device,
        addr: u64,
    ) -> Result<(), gpumem::core::AllocError> {
        self.inner.deallocate(dev, addr)
    }
    fn empty_cache(&mut self, dev: &mut dyn Device) -> Result<u64, gpumem::core::AllocError> {
        self.inner.empty_cache(dev)
    }
    fn stats(&self) -> gpumem::core::Stats {
        self.inner.stats()
    }
    fn validate(&self) -> Result<(), gpumem::core::AllocError> {
        self.inner.validate()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(name)) = (args.next(), args.next()) else {
        return Err("usage: call_log TRACE ALLOCATOR [CAPACITY_BYTES]".into());
    };
    let trace = read_path(std::path::Path::new(&path), ReadConfig::default())?;
    let summary = replay::summarize(&trace, 0);
    let mut dev = Logged {
        inner: match args.next() {
            Some(c) => SimDevice::new(c.parse()?),
            None => SimDevice::default(),
        },
        digest: Digest(0xcbf2_9ce4_8422_2325),
        calls: 0,
    };
    let mut a = Watched {
        inner: name.parse::<Strategy>()?.build(&AllocatorConfig::default()),
        digest: Digest(0xcbf2_9ce4_8422_2325),
    };
    let opts = ReplayConfig::default();
    replay::replay_summarized(&trace, &summary, &mut a, &mut dev, &opts, &mut |_| {})?;
    println!(
        "{name} {path}: {} driver calls, call digest {:016x}, block digest {:016x}",
        dev.calls,
        dev.digest.finish(),
        a.digest.finish()
    );
    Ok(())
}
