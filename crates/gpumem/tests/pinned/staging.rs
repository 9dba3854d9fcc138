//! The staging ring against a fake DMA engine that copies host to host on its own thread,
//! late, and checks that no staging buffer changes while its copy is pending.

use gpumem::pinned::{CopyKind, PinnedError, StagingConfig, StagingDma, StagingRing};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

enum Op {
    H2d {
        slot: usize,
        src: usize,
        dst_off: usize,
        len: usize,
        hash: u64,
    },
    D2h {
        slot: usize,
        src_off: usize,
        dst: usize,
        len: usize,
    },
}

fn hash(b: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

struct Shared {
    done: Mutex<Vec<usize>>,
    cv: Condvar,
    device: Mutex<Vec<u8>>,
    overwritten: Mutex<Vec<usize>>,
}

/// A copy engine on a thread: copies happen `delay` after they are queued, in order.
struct FakeDma {
    tx: Option<mpsc::Sender<Op>>,
    issued: Vec<usize>,
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
    fail_at: Option<usize>,
    starts: usize,
}

impl FakeDma {
    fn new(device_len: usize, slots: usize, delay: Duration) -> Self {
        let shared = Arc::new(Shared {
            done: Mutex::new(vec![0; slots]),
            cv: Condvar::new(),
            device: Mutex::new(vec![0; device_len]),
            overwritten: Mutex::new(Vec::new()),
        });
        let (tx, rx) = mpsc::channel::<Op>();
        let sh = Arc::clone(&shared);
        let worker = std::thread::spawn(move || {
            while let Ok(op) = rx.recv() {
                std::thread::sleep(delay);
                let slot = match op {
                    Op::H2d {
                        slot,
                        src,
                        dst_off,
                        len,
                        hash: h,
                    } => {
                        // SAFETY: the ring keeps the staging buffer alive and promises
                        // not to touch it until `wait(slot)`; the hash checks the promise.
                        let s = unsafe { std::slice::from_raw_parts(src as *const u8, len) };
                        if hash(s) != h {
                            sh.overwritten.lock().unwrap().push(slot);
                        }
                        sh.device.lock().unwrap()[dst_off..dst_off + len].copy_from_slice(s);
                        slot
                    }
                    Op::D2h {
                        slot,
                        src_off,
                        dst,
                        len,
                    } => {
                        // SAFETY: as above, for writing.
                        let d = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
                        d.copy_from_slice(&sh.device.lock().unwrap()[src_off..src_off + len]);
                        slot
                    }
                };
                sh.done.lock().unwrap()[slot] += 1;
                sh.cv.notify_all();
            }
        });
        Self {
            tx: Some(tx),
            issued: vec![0; slots],
            shared,
            worker: Some(worker),
            fail_at: None,
            starts: 0,
        }
    }

    fn check_fail(&mut self) -> Result<(), PinnedError> {
        self.starts += 1;
        if self.fail_at == Some(self.starts) {
            return Err(gpumem_core::DeviceError::Driver {
                call: "cuMemcpyHtoDAsync",
                name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
            }
            .into());
        }
        Ok(())
    }
}

impl StagingDma for FakeDma {
    unsafe fn start_h2d(
        &mut self,
        slot: usize,
        src: *const u8,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), PinnedError> {
        self.check_fail()?;
        // SAFETY: the caller promises `[src, src + len)` is readable until `wait(slot)`.
        let h = hash(unsafe { std::slice::from_raw_parts(src, len) });
        self.issued[slot] += 1;
        self.tx
            .as_ref()
            .unwrap()
            .send(Op::H2d {
                slot,
                src: src as usize,
                dst_off: dst_offset,
                len,
                hash: h,
            })
            .unwrap();
        Ok(())
    }

    unsafe fn start_d2h(
        &mut self,
        slot: usize,
        src_offset: usize,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), PinnedError> {
        self.check_fail()?;
        self.issued[slot] += 1;
        self.tx
            .as_ref()
            .unwrap()
            .send(Op::D2h {
                slot,
                src_off: src_offset,
                dst: dst as usize,
                len,
            })
            .unwrap();
        Ok(())
    }

    fn wait(&mut self, slot: usize) -> Result<(), PinnedError> {
        let mut done = self.shared.done.lock().unwrap();
        while done[slot] < self.issued[slot] {
            done = self.shared.cv.wait(done).unwrap();
        }
        Ok(())
    }
}

impl Drop for FakeDma {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(w) = self.worker.take() {
            w.join().unwrap();
        }
    }
}

fn config(chunk: usize, buffers: usize, threads: usize, copy: CopyKind) -> StagingConfig {
    StagingConfig {
        chunk_bytes: chunk,
        buffers,
        threads,
        copy,
    }
}

fn ring(c: StagingConfig) -> Option<StagingRing> {
    match StagingRing::new_locked(c) {
        Ok(r) => Some(r),
        Err(e) => {
            assert!(matches!(e, PinnedError::MemlockLimit { .. }), "{e}");
            None
        }
    }
}

fn data(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 131 + seed * 7) % 253) as u8)
        .collect()
}

#[test]
fn h2d_and_d2h_move_every_byte_without_touching_busy_buffers() {
    // Sizes that are not multiples of the chunk, shorter than one chunk, and many chunks.
    for (chunk, buffers, threads, copy) in [
        (64 << 10, 2, 3, CopyKind::Libc),
        (48 << 10, 3, 2, CopyKind::NonTemporal),
        (1 << 20, 1, 4, CopyKind::NonTemporal),
    ] {
        let Some(mut r) = ring(config(chunk, buffers, threads, copy)) else {
            return;
        };
        for len in [1usize, 1000, chunk, chunk + 1, 10 * chunk + 4097] {
            let src = data(len, len);
            let mut dma = FakeDma::new(len, buffers, Duration::from_micros(300));
            r.stage_h2d(&src, &mut dma).unwrap();
            assert_eq!(*dma.shared.device.lock().unwrap(), src, "h2d {chunk} {len}");
            assert!(dma.shared.overwritten.lock().unwrap().is_empty());

            let mut back = vec![0u8; len];
            r.stage_d2h(&mut back, &mut dma).unwrap();
            assert_eq!(back, src, "d2h {chunk} {len}");
        }
    }
}

#[test]
fn a_failed_dma_is_reported_and_the_ring_stays_usable() {
    let Some(mut r) = ring(config(32 << 10, 2, 2, CopyKind::Libc)) else {
        return;
    };
    let src = data(10 * (32 << 10), 1);
    let mut dma = FakeDma::new(src.len(), 2, Duration::from_micros(100));
    dma.fail_at = Some(4);
    let e = r.stage_h2d(&src, &mut dma).unwrap_err();
    assert!(e.to_string().contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{e}");
    // Every queued copy finished before the error came back.
    assert_eq!(*dma.shared.done.lock().unwrap(), dma.issued);
    let mut dma = FakeDma::new(src.len(), 2, Duration::from_micros(100));
    r.stage_h2d(&src, &mut dma).unwrap();
    assert_eq!(*dma.shared.device.lock().unwrap(), src);
}

#[test]
fn zero_sizes_are_refused() {
    for c in [
        config(0, 2, 2, CopyKind::Libc),
        config(4096, 0, 2, CopyKind::Libc),
        config(4096, 2, 0, CopyKind::Libc),
    ] {
        assert!(matches!(
            StagingRing::new_locked(c),
            Err(PinnedError::InvalidArgument(_))
        ));
    }
}
