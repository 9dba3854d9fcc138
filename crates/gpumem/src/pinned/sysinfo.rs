//! What the host offers: physical memory, the cgroup's memory limit, NUMA nodes.

use std::path::Path;

/// Physical memory of the machine, in bytes (`sysconf(_SC_PHYS_PAGES) × page size`), or
/// `None` if the OS does not say.
pub fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf has no preconditions; it returns -1 for unknown names.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if pages <= 0 || page <= 0 {
        return None;
    }
    (pages as u64).checked_mul(page as u64)
}

/// The memory limit of this process's cgroup (v2 `memory.max`, else v1
/// `memory.limit_in_bytes`), in bytes; `None` when unlimited or unknown.
pub fn cgroup_memory_limit_bytes() -> Option<u64> {
    cgroup_limit_from(Path::new("/sys/fs/cgroup"))
}

/// Reads the cgroup memory limit below `root` (a cgroup v2 or v1 mount point).
fn cgroup_limit_from(root: &Path) -> Option<u64> {
    for file in ["memory.max", "memory/memory.limit_in_bytes"] {
        if let Ok(text) = std::fs::read_to_string(root.join(file)) {
            return parse_cgroup_limit(&text);
        }
    }
    None
}

/// Parses a cgroup memory limit file: `max`, or bytes (v1 writes a huge number for "none").
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    // cgroup v1 reports "unlimited" as a page-rounded i64::MAX.
    (v < (1u64 << 62)).then_some(v)
}

/// Memory the machine can give this process without swapping, in bytes: `MemAvailable` of
/// /proc/meminfo, no more than the cgroup limit; `None` where neither is known.
pub fn available_memory_bytes() -> Option<u64> {
    let avail = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| parse_meminfo_available(&t));
    match (avail, cgroup_memory_limit_bytes()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
pub fn parse_meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses a measurement that needs `needed_bytes` of host memory when the machine has less
/// available ([`available_memory_bytes`]), instead of letting the allocation abort the
/// process. Passes when the OS does not say.
///
/// # Errors
/// [`super::PinnedError::HostMemory`] naming `what`, the bytes needed and available.
pub fn ensure_host_memory(needed_bytes: u64, what: &str) -> super::Result<()> {
    match available_memory_bytes() {
        Some(available_bytes) if needed_bytes > available_bytes => {
            Err(super::PinnedError::HostMemory {
                what: what.to_string(),
                needed_bytes,
                available_bytes,
            })
        }
        _ => Ok(()),
    }
}

/// The default cap of a [`super::PinnedPool`], in bytes: half of the smaller of physical
/// memory and the cgroup limit (pinned pages cannot be swapped out; the usual advice is to
/// keep them under half of RAM). 4 GiB when neither is known.
pub fn default_pinned_cap_bytes() -> u64 {
    let ram = match (physical_memory_bytes(), cgroup_memory_limit_bytes()) {
        (Some(a), Some(b)) => a.min(b),
        (Some(a), None) | (None, Some(a)) => a,
        (None, None) => 8 << 30,
    };
    ram / 2
}

/// NUMA node of the page that holds address `addr` (which must be touched), by
/// `get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`; `None` where the kernel does not say
/// (no NUMA, a container that forbids the call).
pub fn numa_node_of_address(addr: usize) -> Option<i32> {
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;
    let mut node: libc::c_int = -1;
    // SAFETY: get_mempolicy writes one int to `mode` and reads no user memory when nodemask is
    // null; `addr` is only used as an address to look up.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            addr as *const libc::c_void,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (rc == 0 && node >= 0).then_some(node)
}

/// NUMA node of a PCI device, from `/sys/bus/pci/devices/<bus id>/numa_node`; `None` when
/// unknown or `-1` (a single-node machine). `bus_id` as `cuDeviceGetPCIBusId` writes it
/// (`0000:3B:00.0`); case does not matter.
pub fn numa_node_of_pci(bus_id: &str) -> Option<i32> {
    let path = Path::new("/sys/bus/pci/devices").join(bus_id.trim().to_ascii_lowercase());
    let text = std::fs::read_to_string(path.join("numa_node")).ok()?;
    let n: i32 = text.trim().parse().ok()?;
    (n >= 0).then_some(n)
}

/// Number of NUMA nodes online (`/sys/devices/system/node/node*`), at least 1.
pub fn numa_node_count() -> usize {
    std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    n.starts_with("node") && n[4..].chars().all(|c| c.is_ascii_digit())
                })
                .count()
        })
        .unwrap_or(0)
        .max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_available_and_a_clear_refusal() {
        let text = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
        assert_eq!(parse_meminfo_available(text), Some(2 << 20));
        assert_eq!(parse_meminfo_available("MemTotal: 1 kB\n"), None);
        // 2^62 B is more than any machine has: refused with the figures, not an abort.
        match ensure_host_memory(1 << 62, "bench pinned at 4 EiB") {
            Err(super::super::PinnedError::HostMemory {
                needed_bytes,
                available_bytes,
                ..
            }) => {
                assert_eq!(needed_bytes, 1 << 62);
                assert!(available_bytes < needed_bytes);
            }
            other => assert!(available_memory_bytes().is_none(), "{other:?}"),
        }
        assert!(ensure_host_memory(4096, "a page").is_ok());
    }

    #[test]
    fn cgroup_limits_parse() {
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_cgroup_limit("9223372036854771712"), None);
        assert_eq!(parse_cgroup_limit("junk"), None);
    }

    #[test]
    fn cgroup_limit_read_from_a_v2_tree() {
        let dir = std::env::temp_dir().join(format!("gpumem-cg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.max"), "2147483648\n").unwrap();
        assert_eq!(cgroup_limit_from(&dir), Some(2 << 30));
        std::fs::write(dir.join("memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit_from(&dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn default_cap_is_half_of_the_smaller_limit() {
        let ram = physical_memory_bytes().unwrap();
        let limit = cgroup_memory_limit_bytes().map_or(ram, |c| c.min(ram));
        assert_eq!(default_pinned_cap_bytes(), limit / 2);
        assert!(ram > 1 << 28, "physical memory {ram} B looks wrong");
    }

    #[test]
    fn numa_node_of_a_touched_page() {
        let v = vec![1u8; 1 << 16];
        // Either the kernel answers with a node that exists, or (no NUMA support) nothing.
        if let Some(n) = numa_node_of_address(v.as_ptr() as usize) {
            assert!((n as usize) < numa_node_count().max(64));
        }
        assert_eq!(numa_node_of_pci("ffff:ff:ff.7"), None);
    }
}
