//! `PYTORCH_CUDA_ALLOC_CONF`: the settings of PyTorch's caching allocator that change where
//! memory goes, parsed with PyTorch's own grammar (`c10/core/AllocatorConfig.cpp` and
//! `c10/cuda/CUDAAllocatorConfig.cpp`, PyTorch 2.11).
//!
//! The string is a comma-separated list of `key:value` pairs; a value may be a bracketed list
//! (`roundup_power2_divisions:[256:1,512:2,>:8]`); spaces are ignored. Keys that change the
//! device memory PyTorch takes are emulated (see [`TorchConfig`]); keys that only change
//! locking, pinned host memory or CUDA-graph capture are accepted and have no effect here;
//! `backend:cudaMallocAsync` and unknown keys are refused.
use std::fmt;

/// Number of size intervals `roundup_power2_divisions` distinguishes
/// (`kRoundUpPowerOfTwoIntervals`): 1 MiB, 2 MiB, ..., 32 GiB and above.
pub const ROUNDUP_INTERVALS: usize = 16;
/// log2 of the first interval's start, 1 MiB (`kRoundUpPowerOfTwoStart`).
const ROUNDUP_START_LOG2: u32 = 20;
const MIB: u64 = 1 << 20;
/// Smallest accepted `max_split_size_mb` and `max_non_split_rounding_mb`, in MiB
/// (`kLargeBuffer / kMB`).
pub const MIN_SPLIT_SETTING_MIB: u64 = 20;

/// The emulated settings. [`Default`] is PyTorch with `PYTORCH_CUDA_ALLOC_CONF` unset
/// ("native").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TorchConfig {
    /// `max_split_size_mb` in bytes: free blocks of at least this size are never split, and
    /// a request below it never takes one (`u64::MAX` = unlimited, the default).
    pub max_split_size_bytes: u64,
    /// `max_non_split_rounding_mb` in bytes: a request of at least `max_split_size` takes a
    /// cached oversize block only if the block is less than this much larger (20 MiB).
    pub max_non_split_rounding_bytes: u64,
    /// `roundup_power2_divisions` per size interval (index 0: sizes below 2 MiB, index k:
    /// `[2^k, 2^(k+1))` MiB, index 15: 32 GiB and above); 0 or 1 = plain 512-byte rounding.
    pub roundup_power2_divisions: [u64; ROUNDUP_INTERVALS],
    /// `garbage_collection_threshold` (fraction of the allowed memory, 0 = off). Acts only
    /// with a memory limit ([`TorchConfig::allowed_memory_bytes`]).
    pub garbage_collection_threshold: f64,
    /// `expandable_segments:True`: one growing segment per stream and pool, mapped in pages
    /// of 2 MiB (small pool) and 20 MiB (large pool).
    pub expandable_segments: bool,
    /// `per_process_memory_fraction`: the share of the device capacity PyTorch may take
    /// (1.0 = no limit).
    pub per_process_memory_fraction: f64,
    /// The memory limit in bytes (`set_per_process_memory_fraction` × total memory), when one
    /// is set: `cudaMalloc` is not even tried past it.
    pub allowed_memory_bytes: Option<u64>,
    /// The device capacity is the memory limit (as if `set_per_process_memory_fraction` had
    /// set it there): `gpumem replay --capacity` and `gpumem tune --capacity` set this, so
    /// `garbage_collection_threshold` acts. (The device itself refuses past its capacity, so
    /// the emulation leaves that refusal to it: for expandable segments the device counts the
    /// pages mapped where PyTorch's limit counts the allocation size.)
    pub limit_to_capacity: bool,
}

// Thresholds and fractions are never NaN: `parse` and `from_recorded` refuse them.
impl Eq for TorchConfig {}

impl Default for TorchConfig {
    fn default() -> Self {
        TorchConfig {
            max_split_size_bytes: u64::MAX,
            max_non_split_rounding_bytes: MIN_SPLIT_SETTING_MIB * MIB,
            roundup_power2_divisions: [0; ROUNDUP_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            per_process_memory_fraction: 1.0,
            allowed_memory_bytes: None,
            limit_to_capacity: false,
        }
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` string that PyTorch would refuse, or that gpumem cannot
/// emulate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PYTORCH_CUDA_ALLOC_CONF `{conf}`: {message}")]
pub struct ConfError {
    /// The whole string.
    pub conf: String,
    /// What is wrong, naming the key.
    pub message: String,
}

/// Keys accepted that do not change device memory (locking, pinned host memory, graphs).
const NO_EFFECT_KEYS: [&str; 8] = [
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
];

/// The keys gpumem emulates, for messages.
const EMULATED_KEYS: &str = "max_split_size_mb, max_non_split_rounding_mb, \
    roundup_power2_divisions, garbage_collection_threshold, expandable_segments, \
    per_process_memory_fraction, backend:native";

/// PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own, whitespace goes.
fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(ch.to_string());
        } else if !ch.is_whitespace() {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Parser<'a> {
    conf: &'a str,
    tokens: Vec<String>,
    i: usize,
}

impl Parser<'_> {
    fn err(&self, message: String) -> ConfError {
        ConfError {
            conf: self.conf.to_string(),
            message,
        }
    }

    fn next(&mut self, what: &str) -> Result<String, ConfError> {
        match self.tokens.get(self.i) {
            Some(t) => {
                self.i += 1;
                Ok(t.clone())
            }
            None => Err(self.err(format!("expected {what}, found the end"))),
        }
    }

    fn expect(&mut self, tok: &str, after: &str) -> Result<(), ConfError> {
        let t = self.next(&format!("`{tok}` after {after}"))?;
        if t == tok {
            Ok(())
        } else {
            Err(self.err(format!("expected `{tok}` after {after}, found `{t}`")))
        }
    }

    fn uint(&mut self, key: &str) -> Result<u64, ConfError> {
        let t = self.next(&format!("a value for {key}"))?;
        t.parse::<u64>().map_err(|_| {
            self.err(format!(
                "{key}: expected a non-negative integer, found `{t}`"
            ))
        })
    }

    fn float(&mut self, key: &str) -> Result<f64, ConfError> {
        let t = self.next(&format!("a value for {key}"))?;
        match t.parse::<f64>() {
            Ok(v) if v.is_finite() => Ok(v),
            _ => Err(self.err(format!("{key}: expected a number, found `{t}`"))),
        }
    }

    fn boolean(&mut self, key: &str) -> Result<bool, ConfError> {
        let t = self.next(&format!("True or False for {key}"))?;
        match t.as_str() {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(self.err(format!(
                "Expected a single True/False argument for {key}, found `{t}`"
            ))),
        }
    }

    /// Skips a value (a single token or a bracketed list) of a key without effect.
    fn skip_value(&mut self, key: &str) -> Result<(), ConfError> {
        let t = self.next(&format!("a value for {key}"))?;
        if t == "[" {
            loop {
                if self.next(&format!("`]` closing the list of {key}"))? == "]" {
                    break;
                }
            }
        }
        Ok(())
    }

    fn roundup(&mut self, conf: &mut TorchConfig) -> Result<(), ConfError> {
        let key = "roundup_power2_divisions";
        let first = self.next(&format!("a value for {key}"))?;
        let divs = &mut conf.roundup_power2_divisions;
        if first != "[" {
            let v: u64 = first.parse().map_err(|_| {
                self.err(format!("{key}: expected a power of two, found `{first}`"))
            })?;
            if !crate::align::is_pow2(v) {
                return Err(self.err(format!(
                    "{key}: For roundups, the divisons has to be power of 2 (found {v})"
                )));
            }
            *divs = [v; ROUNDUP_INTERVALS];
            return Ok(());
        }
        let mut first_value = true;
        let mut last_index = 0usize;
        loop {
            let interval = self.next(&format!("an interval (MiB) or `>` in {key}"))?;
            if interval == "]" {
                break;
            }
            self.expect(":", &format!("interval `{interval}` of {key}"))?;
            let t = self.next(&format!("divisions for interval `{interval}`"))?;
            let val: u64 = t.parse().map_err(|_| {
                self.err(format!(
                    "{key}: expected divisions (a power of two or 0) for `{interval}`, found `{t}`"
                ))
            })?;
            if val != 0 && !crate::align::is_pow2(val) {
                return Err(self.err(format!(
                    "{key}: For roundups, the divisons has to be power of 2 or 0 to disable roundup (found {val} for `{interval}`)"
                )));
            }
            if interval == ">" {
                // PyTorch fills every interval above the last one given (that one keeps its
                // value: PyTorch 2.11 records `[64:8,>:2]` as 8 divisions at 64 MiB and 2 from
                // 128 MiB on), or all of them when `>` comes first.
                let from = if first_value { 0 } else { last_index + 1 };
                for d in divs.iter_mut().skip(from) {
                    *d = val;
                }
            } else {
                let mib: u64 = interval.parse().map_err(|_| {
                    self.err(format!(
                        "{key}: expected an interval in MiB (a power of two) or `>`, found `{interval}`"
                    ))
                })?;
                if !crate::align::is_pow2(mib) {
                    return Err(self.err(format!(
                        "{key}: For roundups, the intervals have to be power of 2 (found {mib})"
                    )));
                }
                let index = (mib.ilog2() as usize).min(ROUNDUP_INTERVALS - 1);
                if first_value {
                    for d in divs.iter_mut().take(index) {
                        *d = val;
                    }
                    first_value = false;
                }
                divs[index] = val;
                last_index = index;
            }
            match self.tokens.get(self.i).map(String::as_str) {
                Some("]") => {}
                _ => self.expect(",", &format!("an entry of {key}"))?,
            }
        }
        Ok(())
    }
}

impl TorchConfig {
    /// Parses a `PYTORCH_CUDA_ALLOC_CONF` string (empty = native).
    ///
    /// # Errors
    /// [`ConfError`] naming the key for an unknown key, a malformed or out-of-range value
    /// (with PyTorch's limits: `max_split_size_mb` ≥ 20, `garbage_collection_threshold` in
    /// (0, 1), divisions powers of two, `per_process_memory_fraction` in [0, 1]), or
    /// `backend:cudaMallocAsync`, which is a different allocator.
    ///
    /// ```
    /// use gpumem_core::config::TorchConfig;
    /// let c = TorchConfig::parse("expandable_segments:True,max_split_size_mb:128")?;
    /// assert!(c.expandable_segments);
    /// assert_eq!(c.max_split_size_bytes, 128 << 20);
    /// assert!(TorchConfig::parse("max_split_size_mb:8").is_err());
    /// assert!(TorchConfig::parse("expandable:True").is_err());
    /// # Ok::<(), gpumem_core::config::ConfError>(())
    /// ```
    pub fn parse(conf: &str) -> Result<TorchConfig, ConfError> {
        let mut c = TorchConfig::default();
        let mut p = Parser {
            conf,
            tokens: tokenize(conf),
            i: 0,
        };
        while p.i < p.tokens.len() {
            let key = p.next("a key")?;
            p.expect(":", &format!("key `{key}`"))?;
            match key.as_str() {
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let mb = p.uint(&key)?;
                    if mb < MIN_SPLIT_SETTING_MIB {
                        return Err(p.err(format!(
                            "CachingAllocator option {key} too small, must be >= {MIN_SPLIT_SETTING_MIB} (found {mb})"
                        )));
                    }
                    let bytes = mb.saturating_mul(MIB);
                    if key == "max_split_size_mb" {
                        c.max_split_size_bytes = bytes;
                    } else {
                        c.max_non_split_rounding_bytes = bytes;
                    }
                }
                "garbage_collection_threshold" => {
                    let v = p.float(&key)?;
                    if !(v > 0.0 && v < 1.0) {
                        return Err(p.err(format!(
                            "garbage_collect_threshold is invalid, set it in (0.0, 1.0) (found {v})"
                        )));
                    }
                    c.garbage_collection_threshold = v;
                }
                "roundup_power2_divisions" => p.roundup(&mut c)?,
                "expandable_segments" => c.expandable_segments = p.boolean(&key)?,
                "per_process_memory_fraction" => {
                    let v = p.float(&key)?;
                    if !(0.0..=1.0).contains(&v) {
                        return Err(p.err(format!(
                            "per_process_memory_fraction is invalid, set it in [0.0, 1.0] (found {v})"
                        )));
                    }
                    c.per_process_memory_fraction = v;
                }
                "backend" => {
                    let v = p.next("a value for backend")?;
                    match v.as_str() {
                        "native" => {}
                        "cudaMallocAsync" => {
                            return Err(p.err(
                                "backend:cudaMallocAsync is CUDA's stream-ordered allocator, not the caching allocator gpumem emulates".into(),
                            ))
                        }
                        other => {
                            return Err(p.err(format!(
                                "Unknown allocator backend `{other}`, options are native and cudaMallocAsync"
                            )))
                        }
                    }
                }
                k if NO_EFFECT_KEYS.contains(&k) => p.skip_value(&key)?,
                other => {
                    return Err(p.err(format!(
                        "Unrecognized key '{other}' in CUDA allocator config (gpumem emulates {EMULATED_KEYS})"
                    )))
                }
            }
            if p.i < p.tokens.len() {
                p.expect(",", &format!("the value of `{key}`"))?;
                if p.i == p.tokens.len() {
                    return Err(p.err("a trailing `,` with no key after it".into()));
                }
            }
        }
        Ok(c)
    }

    /// The settings a snapshot recorded (its `allocator_settings`): `conf` is the
    /// `PYTORCH_CUDA_ALLOC_CONF` string when it was recorded and non-empty (it is then
    /// parsed, and the division list PyTorch recorded, when there is one, replaces the one
    /// read from the string: it is PyTorch's own reading); otherwise the individual fields: `max_split_size` in bytes (`None` or
    /// unlimited when PyTorch wrote -1), the threshold, the expandable flag and the
    /// divisions as `(interval start in MiB, divisions)` pairs.
    ///
    /// # Errors
    /// [`ConfError`] when the string does not parse or a field is out of PyTorch's range.
    pub fn from_recorded(
        conf: &str,
        max_split_size_bytes: Option<u64>,
        garbage_collection_threshold: Option<f64>,
        expandable_segments: Option<bool>,
        roundup_power2_divisions: &[(String, u64)],
    ) -> Result<TorchConfig, ConfError> {
        let err = |message: String| ConfError {
            conf: "(recorded allocator_settings)".into(),
            message,
        };
        if !conf.trim().is_empty() {
            // The string, with PyTorch's own reading of its division list where it recorded
            // one (the authority on how its fill rules read the string).
            let mut c = TorchConfig::parse(conf)?;
            if !roundup_power2_divisions.is_empty() {
                c.roundup_power2_divisions = [0; ROUNDUP_INTERVALS];
                for (interval, divs) in roundup_power2_divisions {
                    c.roundup_power2_divisions[recorded_interval_index(interval).map_err(err)?] =
                        *divs;
                }
            }
            return Ok(c);
        }
        let mut c = TorchConfig::default();
        if let Some(m) = max_split_size_bytes {
            c.max_split_size_bytes = m;
        }
        if let Some(g) = garbage_collection_threshold {
            if !g.is_finite() || !(0.0..1.0).contains(&g) {
                return Err(err(format!("garbage_collection_threshold {g}")));
            }
            c.garbage_collection_threshold = g;
        }
        c.expandable_segments = expandable_segments.unwrap_or(false);
        for (interval, divs) in roundup_power2_divisions {
            c.roundup_power2_divisions[recorded_interval_index(interval).map_err(err)?] = *divs;
        }
        Ok(c)
    }

    /// Divisions that apply to a rounded-to-512 request of `size_bytes`
    /// (`AcceleratorAllocatorConfig::roundup_power2_divisions(size)`).
    pub fn divisions_for(&self, size_bytes: u64) -> u64 {
        let log = 63 - size_bytes.max(1).leading_zeros();
        let index = log.saturating_sub(ROUNDUP_START_LOG2) as usize;
        self.roundup_power2_divisions[index.min(ROUNDUP_INTERVALS - 1)]
    }

    /// The memory limit in bytes on a device of `capacity_bytes` (PyTorch's
    /// `allowed_memory_maximum`): the smallest of [`TorchConfig::allowed_memory_bytes`],
    /// `per_process_memory_fraction` × capacity (when the fraction is below 1) and the
    /// capacity itself under [`TorchConfig::limit_to_capacity`]; `None` when none applies.
    pub fn allowed_bytes(&self, capacity_bytes: u64) -> Option<u64> {
        let by_fraction = (self.per_process_memory_fraction < 1.0)
            .then_some((self.per_process_memory_fraction * capacity_bytes as f64) as u64);
        [
            self.allowed_memory_bytes,
            by_fraction,
            self.limit_to_capacity.then_some(capacity_bytes),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether every setting is PyTorch's default (the memory limit aside).
    pub fn is_native(&self) -> bool {
        TorchConfig {
            allowed_memory_bytes: None,
            limit_to_capacity: false,
            ..*self
        } == TorchConfig::default()
    }

    /// The `PYTORCH_CUDA_ALLOC_CONF` string for these settings (empty for native); it parses
    /// back to the same settings. The memory limit is not part of it.
    pub fn to_conf_string(&self) -> String {
        let d = TorchConfig::default();
        let mut parts: Vec<String> = Vec::new();
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.max_split_size_bytes != d.max_split_size_bytes {
            parts.push(format!(
                "max_split_size_mb:{}",
                self.max_split_size_bytes / MIB
            ));
        }
        if self.max_non_split_rounding_bytes != d.max_non_split_rounding_bytes {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding_bytes / MIB
            ));
        }
        let r = &self.roundup_power2_divisions;
        if r != &d.roundup_power2_divisions {
            if r.iter().all(|&v| v == r[0]) && r[0] != 0 {
                parts.push(format!("roundup_power2_divisions:{}", r[0]));
            } else {
                let list: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(k, v)| format!("{}:{v}", 1u64 << k))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        if self.garbage_collection_threshold != 0.0 {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                self.garbage_collection_threshold
            ));
        }
        if self.per_process_memory_fraction < 1.0 {
            parts.push(format!(
                "per_process_memory_fraction:{}",
                self.per_process_memory_fraction
            ));
        }
        parts.join(",")
    }
}

impl fmt::Display for TorchConfig {
    /// The conf string, or `native` for the defaults.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.to_conf_string();
        if s.is_empty() {
            f.write_str("native")
        } else {
            f.write_str(&s)
        }
    }
}

/// The index in [`TorchConfig::roundup_power2_divisions`] of a recorded interval key (its
/// size in MiB, a power of two, as PyTorch's `allocator_settings` names it).
fn recorded_interval_index(interval: &str) -> Result<usize, String> {
    let mib: u64 = interval
        .trim()
        .parse()
        .map_err(|_| format!("roundup_power2_divisions interval `{interval}`"))?;
    if !crate::align::is_pow2(mib) {
        return Err(format!("roundup_power2_divisions interval {mib}"));
    }
    Ok((mib.ilog2() as usize).min(ROUNDUP_INTERVALS - 1))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn native_and_round_trip() {
        let n = TorchConfig::parse("").unwrap();
        assert!(n.is_native());
        assert_eq!(n.to_string(), "native");
        for s in [
            "expandable_segments:True",
            "max_split_size_mb:128",
            "roundup_power2_divisions:4",
            "garbage_collection_threshold:0.6",
            "expandable_segments:True,max_split_size_mb:256",
            "roundup_power2_divisions:[1:1,2:1,4:1,8:1,16:1,32:1,64:1,128:1,256:1,512:2,1024:8,2048:8,4096:8,8192:8,16384:8,32768:8]",
        ] {
            let c = TorchConfig::parse(s).unwrap();
            assert!(!c.is_native(), "{s}");
            assert_eq!(TorchConfig::parse(&c.to_conf_string()).unwrap(), c, "{s}");
        }
        let c = TorchConfig::parse(" max_split_size_mb : 128 , backend:native ").unwrap();
        assert_eq!(c.max_split_size_bytes, 128 * MIB);
        let c = TorchConfig::parse("release_lock_on_cudamalloc:True,pinned_num_register_threads:8")
            .unwrap();
        assert!(c.is_native());
    }

    #[test]
    fn division_list_follows_pytorch_fill_rules() {
        // The first entry also fills every interval below it; `>` fills every interval above
        // the last one given. PyTorch 2.11's own `allocator_settings` for `[64:8,>:2]` (a
        // snapshot recorded on the H200, 2026-12-01): 8 for 1..64 MiB, 2 from 128 MiB on.
        let c = TorchConfig::parse("roundup_power2_divisions:[64:8,>:2]").unwrap();
        let mut want = [2u64; ROUNDUP_INTERVALS];
        for w in want.iter_mut().take(7) {
            *w = 8;
        }
        assert_eq!(c.roundup_power2_divisions, want);
        let c = TorchConfig::parse("roundup_power2_divisions:[256:1,512:2,>:8]").unwrap();
        let mut want = [1u64; ROUNDUP_INTERVALS];
        want[9] = 2;
        for w in want.iter_mut().skip(10) {
            *w = 8;
        }
        assert_eq!(c.roundup_power2_divisions, want);
        // `>` alone: every interval.
        let c = TorchConfig::parse("roundup_power2_divisions:[>:4]").unwrap();
        assert_eq!(c.roundup_power2_divisions, [4u64; ROUNDUP_INTERVALS]);
        let c = TorchConfig::parse("roundup_power2_divisions:[64:8,256:4,1024:4,>:1]").unwrap();
        assert_eq!(c.divisions_for(512), 8); // below 1 MiB: interval 0
        assert_eq!(c.divisions_for(64 * MIB), 8);
        assert_eq!(c.divisions_for(128 * MIB), 0); // not given, not filled
        assert_eq!(c.divisions_for(256 * MIB), 4);
        assert_eq!(c.divisions_for(1024 * MIB), 4); // the last interval given keeps its value
        assert_eq!(c.divisions_for(2048 * MIB), 1);
        assert_eq!(c.divisions_for(1 << 40), 1);
    }

    #[test]
    fn bad_strings_name_the_key() {
        for (s, needle) in [
            ("expandable:True", "Unrecognized key 'expandable'"),
            ("max_split_size_mb:8", "max_split_size_mb too small"),
            (
                "max_split_size_mb:abc",
                "max_split_size_mb: expected a non-negative integer",
            ),
            (
                "max_split_size_mb",
                "expected `:` after key `max_split_size_mb`",
            ),
            (
                "garbage_collection_threshold:1.5",
                "garbage_collect_threshold is invalid",
            ),
            ("roundup_power2_divisions:3", "has to be power of 2"),
            (
                "roundup_power2_divisions:[256:3]",
                "has to be power of 2 or 0",
            ),
            (
                "roundup_power2_divisions:[100:4]",
                "intervals have to be power of 2",
            ),
            ("roundup_power2_divisions:[256:4", "found the end"),
            ("expandable_segments:true", "True/False"),
            ("backend:cudaMallocAsync", "not the caching allocator"),
            (
                "max_split_size_mb:128 expandable_segments:True",
                "expected a non-negative integer",
            ),
            (
                "max_split_size_mb:128;expandable_segments:True",
                "expected a non-negative integer",
            ),
            ("expandable_segments:True:max_split_size_mb", "expected `,`"),
            ("max_split_size_mb:128,", "trailing"),
            (
                "per_process_memory_fraction:2",
                "per_process_memory_fraction is invalid",
            ),
        ] {
            let e = TorchConfig::parse(s).expect_err(s);
            assert!(e.to_string().contains(needle), "{s}: {e}");
            assert!(e.to_string().contains(s), "{s}: {e}");
        }
    }

    #[test]
    fn recorded_settings() {
        let divs: Vec<(String, u64)> = (0..16).map(|k| ((1u64 << k).to_string(), 0)).collect();
        let c = TorchConfig::from_recorded("", None, Some(0.0), Some(false), &divs).unwrap();
        assert!(c.is_native());
        let mut divs4 = divs.clone();
        for d in &mut divs4 {
            d.1 = 4;
        }
        let c = TorchConfig::from_recorded("", Some(128 * MIB), None, Some(true), &divs4).unwrap();
        assert_eq!(
            c.to_conf_string(),
            "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:4"
        );
        let c = TorchConfig::from_recorded("max_split_size_mb:256", None, None, None, &[]).unwrap();
        assert_eq!(c.max_split_size_bytes, 256 * MIB);
    }

    #[test]
    fn memory_limit() {
        let c = TorchConfig::parse("per_process_memory_fraction:0.5").unwrap();
        assert_eq!(c.allowed_bytes(1000), Some(500));
        let c = TorchConfig {
            allowed_memory_bytes: Some(300),
            ..c
        };
        assert_eq!(c.allowed_bytes(1000), Some(300));
        assert_eq!(TorchConfig::default().allowed_bytes(1000), None);
        let c = TorchConfig {
            limit_to_capacity: true,
            ..TorchConfig::default()
        };
        assert_eq!(c.allowed_bytes(1000), Some(1000));
    }
}
