//! The fallback without CUDA: anonymous memory locked with `mlock`.

use super::{PinnedError, Result};

/// The soft `RLIMIT_MEMLOCK` of this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemlockLimit {
    /// No limit (`ulimit -l unlimited`).
    Unlimited,
    /// At most this many bytes may be locked (privileged processes, with `CAP_IPC_LOCK`,
    /// may lock more).
    Bytes(u64),
}

impl std::fmt::Display for MemlockLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemlockLimit::Unlimited => f.write_str("unlimited"),
            MemlockLimit::Bytes(b) => write!(f, "{b} B"),
        }
    }
}

/// Reads the soft `RLIMIT_MEMLOCK` (`getrlimit`).
///
/// # Errors
/// [`PinnedError::Os`] if `getrlimit` fails.
pub fn memlock_limit() -> Result<MemlockLimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return Err(PinnedError::Os {
            call: "getrlimit(RLIMIT_MEMLOCK)",
            bytes: 0,
            os: std::io::Error::last_os_error(),
        });
    }
    Ok(if r.rlim_cur == libc::RLIM_INFINITY {
        MemlockLimit::Unlimited
    } else {
        MemlockLimit::Bytes(r.rlim_cur)
    })
}

/// Bytes this process holds locked (`VmLck` of /proc/self/status), 0 if unknown.
pub(crate) fn locked_bytes_now() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmLck:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        })
        .map_or(0, |kb| kb * 1024)
}

/// The error for a refused `mlock` of `bytes` with OS error `os`.
pub(crate) fn memlock_error(bytes: usize, os: std::io::Error) -> PinnedError {
    PinnedError::MemlockLimit {
        bytes,
        limit: memlock_limit().map_or_else(|_| "unknown".to_string(), |l| l.to_string()),
        locked_bytes: locked_bytes_now(),
        os,
    }
}

/// The system page size in bytes.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Maps `len` bytes of anonymous, zeroed memory and locks them.
///
/// Returns the mapping's start and its length (rounded up to pages).
///
/// # Errors
/// [`PinnedError::Os`] if `mmap` fails; [`PinnedError::MemlockLimit`] if `mlock` is refused
/// (the mapping is unmapped first).
pub(crate) fn map_locked(len: usize) -> Result<(std::ptr::NonNull<u8>, usize)> {
    let page = page_size();
    let map_len = len
        .checked_add(page - 1)
        .map(|v| v & !(page - 1))
        .filter(|&v| v > 0)
        .ok_or_else(|| PinnedError::InvalidArgument(format!("cannot map {len} B")))?;
    // SAFETY: an anonymous private mapping with no address hint touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(PinnedError::Os {
            call: "mmap",
            bytes: len,
            os: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: [p, p + map_len) is the mapping just made.
    if unsafe { libc::mlock(p, map_len) } != 0 {
        let os = std::io::Error::last_os_error();
        // SAFETY: unmapping the mapping made above, which nothing else references.
        unsafe { libc::munmap(p, map_len) };
        return Err(memlock_error(len, os));
    }
    let ptr = std::ptr::NonNull::new(p.cast::<u8>())
        .ok_or_else(|| PinnedError::Internal("mmap returned null".into()))?;
    Ok((ptr, map_len))
}

/// Unlocks and unmaps a mapping made by [`map_locked`].
///
/// # Safety
/// 1. `(ptr, map_len)` was returned by [`map_locked`] and not yet unmapped.
/// 2. Nothing references the memory any more.
pub(crate) unsafe fn unmap_locked(ptr: std::ptr::NonNull<u8>, map_len: usize) {
    // SAFETY: the caller upholds the # Safety contract of this function.
    unsafe {
        // munmap unlocks the pages too; errors cannot be reported from Drop and leave nothing
        // behind that a retry would fix.
        libc::munlock(ptr.as_ptr().cast(), map_len);
        libc::munmap(ptr.as_ptr().cast(), map_len);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_readable_and_displayed() {
        let l = memlock_limit().unwrap();
        let s = l.to_string();
        assert!(s == "unlimited" || s.ends_with(" B"), "{s}");
    }

    #[test]
    fn a_refused_mlock_names_the_limit_and_the_fix() {
        let e = memlock_error(1 << 30, std::io::Error::from_raw_os_error(libc::ENOMEM));
        let msg = e.to_string();
        assert!(msg.contains("mlock of 1073741824 B refused"), "{msg}");
        assert!(msg.contains("RLIMIT_MEMLOCK is"), "{msg}");
        assert!(msg.contains("ulimit -l unlimited"), "{msg}");
    }

    #[test]
    fn map_lock_and_unmap_one_page() {
        match map_locked(100) {
            Ok((p, len)) => {
                assert_eq!(len, page_size());
                // SAFETY: test: the mapping is ours and zeroed.
                unsafe {
                    assert_eq!(*p.as_ptr(), 0);
                    unmap_locked(p, len);
                }
            }
            // One page over the limit: only possible with RLIMIT_MEMLOCK = 0.
            Err(e) => assert!(matches!(e, PinnedError::MemlockLimit { .. }), "{e}"),
        }
        assert!(matches!(
            map_locked(0),
            Err(PinnedError::InvalidArgument(_))
        ));
    }
}
