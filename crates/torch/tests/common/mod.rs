//! Helpers shared by the C-ABI tests: the plug-in's statistics as JSON.
#![allow(clippy::unwrap_used)]

use gpumem_torch::gpumem_stats_json;
use serde_json::Value;

/// `gpumem_stats_json` of `device`, parsed.
pub fn stats(device: i32) -> Value {
    let mut buf = vec![0u8; 1 << 16];
    // SAFETY: buf has buf.len() writable bytes.
    let n = unsafe { gpumem_stats_json(device, buf.as_mut_ptr().cast(), buf.len()) };
    assert!(n > 0 && (n as usize) < buf.len(), "{n}");
    serde_json::from_slice(&buf[..n as usize]).unwrap()
}

/// The integer `k` of a statistics object; panics (naming it) when it is missing.
pub fn get(s: &Value, k: &str) -> i64 {
    s[k].as_i64()
        .unwrap_or_else(|| panic!("{k} missing in {s}"))
}
