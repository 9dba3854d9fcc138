//! # gpumem_torch: gpumem as PyTorch's CUDA allocator
//!
//! `libgpumem_torch.so` exports the two entry points that
//! `torch.cuda.memory.CUDAPluggableAllocator(path, "gpumem_malloc", "gpumem_free")` loads,
//! and a few more for `python/gpumem_torch.py` (statistics, `empty_cache`, peaks, recording):
//!
//! ```c
//! void*   gpumem_malloc(ssize_t size, int device, cudaStream_t stream);
//! void    gpumem_free(void* ptr, ssize_t size, int device, cudaStream_t stream);
//! int     gpumem_configure(const char* conf);          /* before first use; see below */
//! ssize_t gpumem_stats_json(int device, char* buf, size_t len);
//! int64_t gpumem_empty_cache(void);                    /* bytes released, -1 on error */
//! void    gpumem_reset_peak_stats(void);
//! int     gpumem_record_start(const char* path);       /* JSON-lines trace */
//! int64_t gpumem_record_stop(void);                    /* lines written, -1 on error */
//! int     gpumem_validate(void);
//! ```
//!
//! One pool per device, created on first use, with the strategy and options of `GPUMEM_CONF`
//! (see [`conf`]; e.g. `strategy=paged,reserve=256MiB`), or of the string given to
//! `gpumem_configure` before the first call. By default (`mode=direct`, see [`gpumem::pool::DirectPool`]) the
//! pool has PyTorch's own stream semantics: a block freed on the device's main stream goes
//! straight back to the strategy and is reusable there at once by a request of any size
//! (unmapping of its pages waits for the GPU); a block freed on another stream, only after
//! that stream's work at the time of the free has completed. `mode=pool` uses gpumem's
//! [`gpumem::pool::DevicePool`] instead (size-class caches per stream; everything else
//! reaches the strategy behind an event), which costs memory and time under PyTorch's
//! run-ahead CPU (BENCHMARKS.md, "Plug-in in training", has the figures).
//!
//! At the C boundary nothing panics or unwinds: every export runs inside `catch_unwind`, and
//! a caught panic is reported once on stderr and turned into NULL / -1. A failed allocation
//! returns NULL (PyTorch raises `torch.OutOfMemoryError`) after the pool has released its
//! cache and retried; a 0-byte request returns NULL without touching the pool; a free of a
//! pointer the pool does not own (or of NULL) is ignored, and reported once. The state lives
//! in a process-wide static that is never dropped, so no CUDA call runs during process exit.
//!
//! With the environment variable `GPUMEM_PROFILE` set (to anything but `0`) when the plug-in
//! starts, the time spent inside `gpumem_malloc` and `gpumem_free` is kept (calls, nanoseconds,
//! calls over 20 µs) and reported under `profile` in `gpumem_stats_json`: the plug-in's own
//! share of a training step (`scripts/bench/torch-compare.py` reports it per step).
#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod conf;
pub mod state;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

use state::{Plugin, Report};

/// Result of `gpumem_configure`: the settings were taken as given.
pub const CONF_OK: c_int = 0;
/// Result of `gpumem_configure`: taken, but some items were ignored (reported on stderr).
pub const CONF_IGNORED_ITEMS: c_int = 1;
/// Result of `gpumem_configure`: too late, the plug-in already runs with other settings.
pub const CONF_TOO_LATE: c_int = -1;
/// Result of `gpumem_configure`: NULL or not UTF-8.
pub const CONF_BAD_STRING: c_int = -2;

static PLUGIN: OnceLock<Plugin> = OnceLock::new();
/// The settings text given to `gpumem_configure`, read once when the plug-in starts.
static CONF_TEXT: Mutex<Option<String>> = Mutex::new(None);

/// The settings text in force: what `gpumem_configure` gave, else `GPUMEM_CONF`, else "".
fn conf_text() -> String {
    CONF_TEXT
        .lock()
        .ok()
        .and_then(|g| g.clone())
        .or_else(|| std::env::var("GPUMEM_CONF").ok())
        .unwrap_or_default()
}

/// The process's plug-in, started on first use from the settings of `gpumem_configure`, else
/// `GPUMEM_CONF` (else the defaults); bad items of the
/// settings are reported once on stderr.
pub fn plugin() -> &'static Plugin {
    PLUGIN.get_or_init(|| {
        let (conf, errors) = conf::parse(&conf_text());
        let p = Plugin::new(conf, false);
        for e in errors {
            // Each ignored item is named (the once-per-kind rule is for the hot path).
            eprintln!("gpumem_torch: {e}");
            p.report(Report::Conf, || e.to_string());
        }
        p
    })
}

/// Runs `f`; a panic becomes `fallback` and is reported once.
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            // Reporting must not panic again: it only touches atomics and a mutex.
            let _ = catch_unwind(AssertUnwindSafe(|| {
                plugin().report(Report::Panic, || format!("internal panic caught: {msg}"))
            }));
            fallback
        }
    }
}

/// Reads a C string argument; `None` for NULL or non-UTF-8.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string that stays valid during the call.
unsafe fn c_str<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller promises a NUL-terminated string alive for the call.
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

/// Allocates `size` bytes on CUDA device `device` for use on `stream` (the signature
/// `CUDAPluggableAllocator` expects). Returns the block's device address, or NULL for 0
/// bytes, a negative size, a bad device, or out of memory (after release and retry).
#[no_mangle]
pub extern "C" fn gpumem_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        match plugin().malloc(size as i64, device, stream as u64) {
            Some(addr) => addr as *mut c_void,
            None => std::ptr::null_mut(),
        }
    })
}

/// Gives back the block at `ptr` (from [`gpumem_malloc`] on `device`). NULL is ignored; a
/// pointer gpumem did not hand out is counted, reported once on stderr and ignored. The
/// block's own size and stream (recorded at allocation) are used, not `size` and `stream`.
#[no_mangle]
pub extern "C" fn gpumem_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    guard((), || {
        plugin().free(ptr as u64, size as i64, device, stream as u64)
    })
}

/// Sets the plug-in's settings (the `GPUMEM_CONF` syntax) before its first use; overrides
/// the environment variable. Returns [`CONF_OK`], [`CONF_IGNORED_ITEMS`] (bad items named on
/// stderr, defaults used for them), [`CONF_TOO_LATE`] if the plug-in already started with
/// other settings (the same settings again return [`CONF_OK`]), or [`CONF_BAD_STRING`].
///
/// # Safety
/// `conf` is NULL or a NUL-terminated string valid for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn gpumem_configure(conf: *const c_char) -> c_int {
    // SAFETY: the caller's promise on `conf` is ours.
    let Some(text) = (unsafe { c_str(conf) }) else {
        return CONF_BAD_STRING;
    };
    guard(CONF_TOO_LATE, || {
        if let Some(p) = PLUGIN.get() {
            let (wanted, _) = conf::parse(text);
            return if *p.conf() == wanted {
                CONF_OK
            } else {
                CONF_TOO_LATE
            };
        }
        if let Ok(mut g) = CONF_TEXT.lock() {
            *g = Some(text.to_string());
        }
        let (wanted, errors) = conf::parse(text);
        if *plugin().conf() != wanted {
            CONF_TOO_LATE // another thread started the plug-in first
        } else if errors.is_empty() {
            CONF_OK
        } else {
            CONF_IGNORED_ITEMS
        }
    })
}

/// Writes device `device`'s statistics as a JSON object (PyTorch's `memory_stats()` names
/// where they exist) into `buf` (`len` bytes), NUL-terminated, like `snprintf`: returns the
/// length of the whole text without the NUL (if it is `>= len` the text was cut; call again
/// with a larger buffer), or -1 on error. `buf` may be NULL when `len` is 0.
///
/// # Safety
/// `buf` is NULL or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpumem_stats_json(device: c_int, buf: *mut c_char, len: usize) -> isize {
    let text = guard(None, || {
        let d = usize::try_from(device).ok()?;
        Some(match PLUGIN.get() {
            Some(p) => p.stats_json(d).to_string(),
            // Not started: report the settings it would start with, and zeros, without
            // starting it (so gpumem_configure still works afterwards).
            None => Plugin::new(conf::parse(&conf_text()).0, true)
                .stats_json(d)
                .to_string(),
        })
    });
    let Some(text) = text else { return -1 };
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `buf` has `len` writable bytes (caller's promise) and `n + 1 <= len`; the
        // source is our own string, which cannot overlap the caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            *buf.add(n) = 0;
        }
    }
    text.len() as isize
}

/// Gives the cached memory of every device back to the driver (flushes the stream caches,
/// waits for their events). Returns the bytes released, or -1 on error (reported once).
#[no_mangle]
pub extern "C" fn gpumem_empty_cache() -> i64 {
    let Some(p) = PLUGIN.get() else { return 0 };
    guard(-1, || match p.empty_cache() {
        Ok(b) => b as i64,
        Err(e) => {
            p.report(Report::PoolError, || format!("empty_cache: {e}"));
            -1
        }
    })
}

/// Sets every peak figure (allocated, requested, reserved, blocks) to its current value.
#[no_mangle]
pub extern "C" fn gpumem_reset_peak_stats() {
    if let Some(p) = PLUGIN.get() {
        guard((), || p.reset_peak_stats())
    }
}

/// Starts writing gpumem's JSON-lines trace to the file `path` (created or truncated): a
/// `preexisting` line per live block, then one line per allocation and free. Returns 0, or
/// -1 (the reason on stderr): NULL path, already recording, or the file cannot be created.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string valid for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn gpumem_record_start(path: *const c_char) -> c_int {
    // SAFETY: the caller's promise on `path` is ours.
    let Some(path) = (unsafe { c_str(path) }) else {
        eprintln!("gpumem_torch: record_start: the path is NULL or not UTF-8");
        return -1;
    };
    guard(-1, || match plugin().record_start(path) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpumem_torch: record_start: {e}");
            -1
        }
    })
}

/// Stops the recording and closes the file. Returns the lines written (0 if none was
/// running), or -1 if the file could not be written (the reason on stderr).
#[no_mangle]
pub extern "C" fn gpumem_record_stop() -> i64 {
    guard(-1, || match plugin().record_stop() {
        Ok(n) => n as i64,
        Err(e) => {
            eprintln!("gpumem_torch: record_stop: {e}");
            -1
        }
    })
}

/// Checks every pool's invariants: 0 if they hold, -1 if not (the reason on stderr).
#[no_mangle]
pub extern "C" fn gpumem_validate() -> c_int {
    let Some(p) = PLUGIN.get() else { return 0 };
    guard(-1, || match p.validate() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("gpumem_torch: validate: {e}");
            -1
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_fallback_and_is_counted() {
        let before = plugin().stats_json(0)["reports"]["panic"].as_u64().unwrap();
        let r = guard(-7, || -> i32 { panic!("boom") });
        assert_eq!(r, -7);
        let s = plugin().stats_json(0);
        assert_eq!(s["reports"]["panic"].as_u64().unwrap(), before + 1);
        assert!(s["first_reports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m.as_str().unwrap().contains("internal panic caught: boom")));
    }
}
