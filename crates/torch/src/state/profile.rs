//! The plug-in's profile of its own calls (`GPUMEM_PROFILE`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

/// Calls taking longer than this count as slow in the profile.
pub(super) const SLOW_CALL_NS: u64 = 20_000;

/// Time spent inside `malloc` and `free`, kept when the environment variable
/// `GPUMEM_PROFILE` is set (to anything but `0`) when the plug-in starts: the plug-in's own
/// share of a training step, apart from PyTorch's. Two clock reads a call.
#[derive(Debug, Default)]
pub(super) struct Profile {
    malloc_calls: AtomicU64,
    malloc_ns: AtomicU64,
    free_calls: AtomicU64,
    free_ns: AtomicU64,
    /// Calls over [`SLOW_CALL_NS`], and their time.
    slow_calls: AtomicU64,
    slow_ns: AtomicU64,
    max_ns: AtomicU64,
}

impl Profile {
    pub(super) fn from_env() -> Option<Self> {
        std::env::var_os("GPUMEM_PROFILE")
            .filter(|v| !v.is_empty() && v != "0")
            .map(|_| Profile::default())
    }
    pub(super) fn record(&self, malloc: bool, since: Instant) {
        let ns = since.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let (calls, total) = if malloc {
            (&self.malloc_calls, &self.malloc_ns)
        } else {
            (&self.free_calls, &self.free_ns)
        };
        calls.fetch_add(1, Ordering::Relaxed);
        total.fetch_add(ns, Ordering::Relaxed);
        if ns > SLOW_CALL_NS {
            self.slow_calls.fetch_add(1, Ordering::Relaxed);
            self.slow_ns.fetch_add(ns, Ordering::Relaxed);
        }
        self.max_ns.fetch_max(ns, Ordering::Relaxed);
    }
    pub(super) fn json(&self) -> Value {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "malloc_calls": l(&self.malloc_calls),
            "malloc_ns": l(&self.malloc_ns),
            "free_calls": l(&self.free_calls),
            "free_ns": l(&self.free_ns),
            "slow_calls": l(&self.slow_calls),
            "slow_ns": l(&self.slow_ns),
            "slow_threshold_ns": SLOW_CALL_NS,
            "max_ns": l(&self.max_ns),
        })
    }
}
