//! The statistic and the clock that the benchmarks of every layer share: the median of
//! repeated timings and the calling thread's CPU time.
//!
//! This module sits below `cuda`, `pinned` and `replay`, so that each of them can time its
//! work without importing the others.

/// Median of `v` (sorted in place); 0 for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// CPU seconds of the calling thread, when the platform tells (replay's CPU time and
/// `bench alloc`'s `cpu_share`).
pub fn thread_cpu_seconds() -> Option<f64> {
    cpu_time::ThreadTime::try_now()
        .ok()
        .map(|t| t.as_duration().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut []), 0.0);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn thread_cpu_time_does_not_go_back() {
        if let (Some(a), Some(b)) = (thread_cpu_seconds(), thread_cpu_seconds()) {
            assert!(b >= a);
        }
    }
}
