//! The C ABI, called as PyTorch calls it, against the simulated device (`backend=sim`).
//!
//! The plug-in is one per process, so every test configures the same settings and works on
//! its own device ordinal (each ordinal gets its own simulated device and pool); only
//! [`peaks_reset_and_empty_cache`] calls the process-wide `empty_cache` / `reset_peak_stats`,
//! and only it asserts peaks or reserved bytes.
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

mod common;
use common::{get, stats};
use gpumem_torch::*;

const CONF: &str = "backend=sim,sim_capacity=4GiB,strategy=paged,reserve=0";

fn setup() {
    let c = CString::new(CONF).unwrap();
    // SAFETY: a valid NUL-terminated string.
    assert_eq!(unsafe { gpumem_configure(c.as_ptr()) }, CONF_OK);
}

fn stream(s: u64) -> *mut c_void {
    s as *mut c_void
}

fn malloc(size: isize, device: i32, s: u64) -> u64 {
    gpumem_malloc(size, device, stream(s)) as u64
}

fn free(ptr: u64, size: isize, device: i32, s: u64) {
    gpumem_free(ptr as *mut c_void, size, device, stream(s))
}

#[test]
fn alloc_and_free_keep_pytorch_figures() {
    setup();
    let dev = 0;
    let sizes: [isize; 6] = [1, 512, 4097, 1 << 20, 3 << 20, 100 << 20];
    let ptrs: Vec<u64> = sizes.iter().map(|&s| malloc(s, dev, 0)).collect();
    assert!(ptrs.iter().all(|&p| p != 0), "{ptrs:?}");
    let mut sorted = ptrs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), ptrs.len(), "distinct addresses");
    let s = stats(dev);
    let req: i64 = sizes.iter().map(|&x| x as i64).sum();
    // mode=direct hands out what `paged` sets aside: the request rounded up to 256 bytes.
    let alloc: i64 = sizes.iter().map(|&x| (x as i64 + 255) / 256 * 256).sum();
    assert_eq!(get(&s, "requested_bytes.all.current"), req);
    assert_eq!(get(&s, "allocated_bytes.all.current"), alloc);
    assert_eq!(get(&s, "allocation.all.current"), 6);
    assert_eq!(get(&s, "live_blocks"), 6);
    assert_eq!(get(&s, "num_alloc_calls"), 6);
    assert!(get(&s, "reserved_bytes.all.current") >= alloc);
    assert!(get(&s, "driver_calls.total") > 0);
    assert_eq!(s["strategy"], "paged");
    assert_eq!(s["backend"], "sim");
    for (&p, &size) in ptrs.iter().zip(&sizes) {
        free(p, size, dev, 0);
        assert_eq!(gpumem_validate(), 0);
    }
    let s = stats(dev);
    assert_eq!(get(&s, "requested_bytes.all.current"), 0);
    assert_eq!(get(&s, "allocated_bytes.all.current"), 0);
    assert_eq!(get(&s, "live_blocks"), 0);
    assert_eq!(get(&s, "pool_live_blocks"), 0);
    assert_eq!(get(&s, "num_free_calls"), 6);
    assert_eq!(get(&s, "num_bad_frees"), 0);
    assert_eq!(get(&s, "num_errors"), 0);
}

#[test]
fn zero_bytes_is_null_and_leaves_the_pool_alone() {
    setup();
    let dev = 1;
    assert_eq!(malloc(0, dev, 0), 0);
    assert_eq!(stats(dev)["initialized"], false, "no pool made for 0 bytes");
    let p = malloc(64, dev, 0);
    assert_ne!(p, 0);
    assert_eq!(malloc(0, dev, 0), 0);
    let s = stats(dev);
    assert_eq!(get(&s, "num_zero_byte_requests"), 1);
    assert_eq!(
        get(&s, "num_alloc_calls"),
        1,
        "0 bytes never reach the pool"
    );
    free(0, 0, dev, 0); // PyTorch frees the NULL of an empty tensor
    free(p, 64, dev, 0);
    let s = stats(dev);
    assert_eq!(get(&s, "num_bad_frees"), 0, "NULL is not a bad free");
    assert_eq!(get(&s, "live_blocks"), 0);
}

#[test]
fn bad_sizes_and_devices_are_null() {
    setup();
    let before = stats(2)["reports"]["bad_argument"].as_i64().unwrap();
    assert_eq!(malloc(-1, 2, 0), 0);
    assert_eq!(malloc(isize::MIN, 2, 0), 0);
    assert_eq!(malloc(256, -1, 0), 0);
    assert_eq!(malloc(256, 1 << 20, 0), 0);
    let after = stats(2)["reports"]["bad_argument"].as_i64().unwrap();
    assert!(after >= before + 4, "{before} -> {after}");
    assert_eq!(stats(2)["initialized"], false);
    // SAFETY: len 0 writes nothing; -1 is refused before any write.
    let r = unsafe { gpumem_stats_json(-1, std::ptr::null_mut(), 0) };
    assert_eq!(r, -1);
}

#[test]
fn bad_pointers_are_ignored_and_counted() {
    setup();
    let dev = 3;
    let a = malloc(1000, dev, 0);
    assert_ne!(a, 0);
    free(0xdead_0000, 16, dev, 0); // never handed out
    free(a + 256, 744, dev, 0); // inside a live block
    free(a, 1000, dev, 0);
    free(a, 1000, dev, 0); // double free
    free(a, 1000, 63, 0); // a device without a pool
    let s = stats(dev);
    assert_eq!(get(&s, "num_bad_frees"), 3);
    assert_eq!(get(&s, "live_blocks"), 0);
    assert_eq!(get(&s, "num_errors"), 0);
    assert!(s["reports"]["bad_free"].as_i64().unwrap() >= 4);
    let first = s["first_reports"].as_array().unwrap();
    assert!(
        first
            .iter()
            .any(|m| m.as_str().unwrap().contains("not a live block")
                || m.as_str().unwrap().contains("has no pool")),
        "{first:?}"
    );
    assert_eq!(gpumem_validate(), 0);
    // The pool still works, and reuses the block.
    let b = malloc(1000, dev, 0);
    assert_eq!(b, a, "the freed block is reused on its stream");
    free(b, 1000, dev, 0);
}

#[test]
fn streams_are_ordered_and_null_is_the_default_stream() {
    setup();
    let dev = 4;
    // The first stream to allocate (here NULL, the default stream) is the main stream: a
    // block freed there is reusable there at once, by any size.
    let d = malloc(1 << 20, dev, 0);
    free(d, 1 << 20, dev, 0);
    let e = malloc(1 << 20, dev, 0);
    assert_eq!(e, d, "reused at once on its own stream");
    free(e, 1 << 20, dev, 0);
    let s = stats(dev);
    assert_eq!(get(&s, "side_stream_waits"), 0);
    // A side stream first waits for the main stream's work (it may get memory freed there).
    let (s7, s9) = (0x7000, 0x9000);
    let a = malloc(4096, dev, s7);
    assert_ne!(a, 0);
    assert_eq!(get(&stats(dev), "side_stream_waits"), 1);
    let b = malloc(4096, dev, s9);
    assert_eq!(
        get(&stats(dev), "side_stream_waits"),
        1,
        "nothing freed on main since"
    );
    // A block freed on a side stream waits for that stream's event before reuse (the
    // simulated device's events complete at once: it is back by the next call).
    free(a, 4096, dev, s7);
    free(b, 4096, dev, s9);
    let c = malloc(4096, dev, 0);
    let s = stats(dev);
    assert_eq!(get(&s, "pending_blocks"), 0);
    assert_eq!(get(&s, "live_blocks"), 1);
    free(c, 4096, dev, 0);
    assert_eq!(get(&stats(dev), "live_blocks"), 0);
    assert_eq!(gpumem_validate(), 0);
}

#[test]
fn several_threads_never_share_a_byte() {
    setup();
    let dev = 5;
    let live: Arc<Mutex<BTreeMap<u64, u64>>> = Arc::default();
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let live = Arc::clone(&live);
            std::thread::spawn(move || {
                let mut rng = t * 0x9E37_79B9 + 1;
                let mut mine: Vec<(u64, isize, u64)> = Vec::new();
                for _ in 0..3000 {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    if rng % 5 < 3 || mine.is_empty() {
                        let size = (1 + rng % (1 << (8 + rng % 14))) as isize;
                        let s = if rng % 3 == 0 { 0 } else { 0x100 + t };
                        let p = malloc(size, dev, s);
                        assert_ne!(p, 0);
                        let mut l = live.lock().unwrap();
                        if let Some((&a, &n)) = l.range(..=p).next_back() {
                            assert!(a + n <= p, "{p:#x} inside [{a:#x}, +{n})");
                        }
                        if let Some((&a, _)) = l.range(p..).next() {
                            assert!(p + size as u64 <= a, "{p:#x}+{size} overlaps {a:#x}");
                        }
                        l.insert(p, size as u64);
                        drop(l);
                        mine.push((p, size, s));
                    } else {
                        let i = (rng as usize / 7) % mine.len();
                        let (p, size, s) = mine.swap_remove(i);
                        live.lock().unwrap().remove(&p);
                        free(p, size, dev, s);
                    }
                }
                for (p, size, s) in mine {
                    live.lock().unwrap().remove(&p);
                    free(p, size, dev, s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = stats(dev);
    assert_eq!(get(&s, "live_blocks"), 0);
    assert_eq!(get(&s, "pool_live_blocks"), 0);
    assert_eq!(get(&s, "allocated_bytes.all.current"), 0);
    assert_eq!(get(&s, "num_bad_frees"), 0);
    assert_eq!(get(&s, "num_errors"), 0);
    assert_eq!(get(&s, "num_alloc_calls"), get(&s, "num_free_calls"));
    assert_eq!(gpumem_validate(), 0);
}

#[test]
fn out_of_memory_is_null_after_a_retry_and_the_pool_goes_on() {
    setup();
    let dev = 6;
    let a = malloc(1 << 30, dev, 0);
    assert_ne!(a, 0);
    free(a, 1 << 30, dev, 0); // cached: the retry must release it
    assert_eq!(malloc(5 << 30, dev, 0), 0, "more than the device has");
    let big = malloc(3 << 30, dev, 0);
    assert_ne!(big, 0, "the cached 1 GiB was released to make room");
    let s = stats(dev);
    assert_eq!(get(&s, "num_ooms"), 1);
    assert!(get(&s, "num_alloc_retries") >= 1);
    assert!(s["reports"]["out_of_memory"].as_i64().unwrap() >= 1);
    free(big, 3 << 30, dev, 0);
    assert_eq!(get(&stats(dev), "live_blocks"), 0);
}

#[test]
fn configure_refuses_other_settings_once_started() {
    setup();
    let other = CString::new("backend=sim,strategy=torch").unwrap();
    // SAFETY: valid strings or NULL.
    unsafe {
        assert_eq!(gpumem_configure(other.as_ptr()), CONF_TOO_LATE);
        assert_eq!(gpumem_configure(std::ptr::null()), CONF_BAD_STRING);
        let same = CString::new(format!(" {CONF} ")).unwrap();
        assert_eq!(gpumem_configure(same.as_ptr()), CONF_OK);
    }
}

#[test]
fn stats_json_is_cut_like_snprintf() {
    setup();
    let full = stats(7).to_string();
    let mut buf = [0xffu8; 10];
    // SAFETY: buf has 10 writable bytes; NULL with len 0 writes nothing.
    unsafe {
        let n = gpumem_stats_json(7, buf.as_mut_ptr().cast(), buf.len());
        assert_eq!(n as usize, full.len());
        assert_eq!(&buf[..9], &full.as_bytes()[..9]);
        assert_eq!(buf[9], 0);
        assert_eq!(
            gpumem_stats_json(7, std::ptr::null_mut(), 0) as usize,
            full.len()
        );
    }
}

#[test]
fn record_writes_a_trace_gpumem_reads_back() {
    setup();
    let dev = 8;
    let dir = std::env::temp_dir().join(format!("gpumem-torch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.jsonl");
    let before = malloc(2048, dev, 0);
    let c = CString::new(path.to_str().unwrap()).unwrap();
    let missing = CString::new("/nonexistent-dir/x.jsonl").unwrap();
    // SAFETY: valid strings or NULL.
    unsafe {
        assert_eq!(gpumem_record_start(missing.as_ptr()), -1);
        assert_eq!(gpumem_record_start(std::ptr::null()), -1);
        assert_eq!(gpumem_record_start(c.as_ptr()), 0);
        assert_eq!(gpumem_record_start(c.as_ptr()), -1, "already recording");
    }
    let a = malloc(1 << 20, dev, 0x42);
    free(before, 2048, dev, 0);
    assert_eq!(malloc(64 << 30, dev, 0), 0); // an oom line
    free(a, 1 << 20, dev, 0x42);
    let lines = gpumem_record_stop();
    assert_eq!(gpumem_record_stop(), 0, "nothing running");
    let trace = gpumem::trace::read_path(&path, Default::default()).unwrap();
    // Other tests allocate on other devices meanwhile: count only this device's lines.
    let ours: Vec<_> = trace
        .events
        .iter()
        .filter(|e| e.device == dev as u32)
        .collect();
    use gpumem::trace::Action;
    let n = |a: Action| ours.iter().filter(|e| e.action == a).count();
    assert_eq!(
        (n(Action::Alloc), n(Action::Free), n(Action::Oom)),
        (1, 2, 1)
    );
    let pre: Vec<_> = trace
        .preexisting
        .iter()
        .filter(|p| p.device == dev as u32)
        .collect();
    assert_eq!(pre.len(), 1);
    assert_eq!((pre[0].addr, pre[0].size_bytes), (before, 2048));
    let alloc = ours.iter().find(|e| e.action == Action::Alloc).unwrap();
    assert_eq!(
        (alloc.addr, alloc.size_bytes, alloc.stream),
        (a, 1 << 20, 0x42)
    );
    assert!(lines as usize >= trace.events.len() + trace.preexisting.len() - 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn peaks_reset_and_empty_cache() {
    setup();
    let dev = 9;
    let a = malloc(8 << 20, dev, 0);
    let b = malloc(2 << 20, dev, 0);
    free(a, 8 << 20, dev, 0);
    let s = stats(dev);
    assert_eq!(get(&s, "allocated_bytes.all.peak"), 10 << 20);
    assert_eq!(get(&s, "allocated_bytes.all.current"), 2 << 20);
    assert!(get(&s, "reserved_bytes.all.peak") >= 10 << 20);
    gpumem_reset_peak_stats();
    let s = stats(dev);
    assert_eq!(get(&s, "allocated_bytes.all.peak"), 2 << 20);
    assert_eq!(get(&s, "requested_bytes.all.peak"), 2 << 20);
    assert_eq!(
        get(&s, "reserved_bytes.all.peak"),
        get(&s, "reserved_bytes.all.current")
    );
    free(b, 2 << 20, dev, 0);
    assert!(gpumem_empty_cache() >= 0);
    let s = stats(dev);
    assert_eq!(get(&s, "reserved_bytes.all.current"), 0, "{s}");
    assert_eq!(get(&s, "cached_blocks"), 0);
}
