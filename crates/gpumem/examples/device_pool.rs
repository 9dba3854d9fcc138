//! A DevicePool on the simulated device: stream-ordered reuse, record_stream, pitched
//! blocks, trim. Run: `cargo run -p gpumem --example device_pool`.
//! On a GPU, build the pool over `gpumem::cuda::open(0)?` with `CudaEvents` instead.
use gpumem::pool::ManualEvents;
use gpumem::pool::{DevicePool, PoolConfig};
use gpumem_core::config::AllocatorConfig;
use gpumem_core::sim::SimDevice;
use gpumem_core::strategy::Strategy;
use gpumem_core::Device;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let pool = DevicePool::new(
        Strategy::Tlsf.build(&AllocatorConfig::default()),
        SimDevice::new(8 << 30),
        Box::new(ManualEvents::immediate()),
        PoolConfig::default(), // pre-reserves 256 MiB
    )?;
    let (s1, s2) = (1, 2);
    let a = pool.alloc(1 << 20, s1)?;
    let addr = a.addr();
    drop(a);
    let b = pool.alloc(1 << 20, s1)?; // same stream: reused at once
    assert_eq!(b.addr(), addr);
    let mut c = pool.alloc(4096, s1)?;
    c.record_stream(s2); // used on s2 too: reused only after events on s1 and s2
    let img = pool.alloc_pitched(1000, 768, 1, s2)?;
    println!("pitched: {} B rows for 1000 B of width", img.pitch_bytes);
    drop((b, c, img));
    println!("{:#?}", pool.stats()?);
    let released = pool.empty_cache()?;
    println!(
        "trim gave back {released} B; device now holds {} B",
        pool.with_device(|d| d.used_bytes())?
    );
    Ok(())
}
