//! The page-table view of the VMM calls a device made (`gpumem vmm`), on any [`Device`]:
//! the book and the recording adaptor live in core ([`VmmBook`], [`Tracked`]); here are what
//! a device tells of its memory ([`Introspect`], `gpumem inspect`), the text rendering and the
//! demonstration arena.
use gpumem_core::adaptor::Tracked;
use gpumem_core::sim::SimDevice;
use gpumem_core::{Device, DeviceError, PhysHandle};

use crate::cuda::{CudaDevice, PointerInfo};

use crate::units::bytes_compact;

use gpumem_core::adaptor::{PageTable, VmmBook};
use gpumem_core::vmm::PageState;

/// What a device can tell of its memory beyond the [`Device`] calls: its cuMemAlloc
/// segments, its book of VMM calls, and the driver's own view of a pointer.
pub trait Introspect: Device {
    /// The live cuMemAlloc segments, as (address, bytes).
    fn segment_list(&self) -> Vec<(u64, u64)>;
    /// The reservations, physical handles and mappings made so far.
    fn book(&self) -> &VmmBook;
    /// What the driver says of `addr` (`cuPointerGetAttributes`), or the error as text;
    /// `None` where there is no driver (the simulated device).
    fn driver_view(&self, addr: u64) -> Option<Result<PointerInfo, String>>;
}

impl Introspect for CudaDevice {
    fn segment_list(&self) -> Vec<(u64, u64)> {
        self.segments()
    }
    fn book(&self) -> &VmmBook {
        self.vmm_book()
    }
    fn driver_view(&self, addr: u64) -> Option<Result<PointerInfo, String>> {
        Some(self.pointer_info(addr).map_err(|e| e.to_string()))
    }
}

impl Introspect for Tracked<SimDevice> {
    fn segment_list(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|(a, b)| (*a, *b)).collect()
    }
    fn book(&self) -> &VmmBook {
        &self.book
    }
    fn driver_view(&self, _addr: u64) -> Option<Result<PointerInfo, String>> {
        None
    }
}

/// Renders page tables as text, one line per row (mapped runs and holes), for `gpumem vmm`.
pub fn render(tables: &[PageTable]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for t in tables {
        let _ = writeln!(
            s,
            "arena {:#x}: {} reserved, {} mapped",
            t.va_start,
            bytes_compact(t.reserved_bytes),
            bytes_compact(t.mapped_bytes)
        );
        let _ = writeln!(
            s,
            "  {:<33} {:>10} {:>10} {:>9}  {:<17} access",
            "virtual range", "handle", "bytes", "page", "state"
        );
        for r in &t.rows {
            let h = r.handle.map_or("-".to_string(), |h| format!("{h:#x}"));
            let st = match r.state {
                PageState::Mapped => "mapped",
                PageState::ReservedUnmapped => "reserved-unmapped",
            };
            let acc = if r.access.is_empty() {
                "-".to_string()
            } else {
                r.access
                    .iter()
                    .map(|o| format!("gpu{o}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let _ = writeln!(
                s,
                "  [{:#014x}, {:#014x}) {:>10} {:>10} {:>9}  {:<17} {}",
                r.va_start,
                r.va_end,
                h,
                bytes_compact(r.bytes),
                bytes_compact(r.page_bytes),
                st,
                acc
            );
        }
    }
    s
}

/// A demonstration arena for `gpumem vmm`: reserves `reserve_bytes`, maps every other page of
/// the first `map_pages` pages (leaving holes), and grants this device access. Returns the
/// reservation's start.
///
/// # Errors
/// The first device call that failed (what was done before it is undone), or
/// [`DeviceError::Invalid`] for a `reserve_bytes` that rounds up past 2^64 bytes.
pub fn demo_arena(
    dev: &mut dyn Device,
    reserve_bytes: u64,
    map_pages: u64,
) -> Result<u64, DeviceError> {
    let g = dev.granularity_bytes();
    let bytes = reserve_bytes
        .div_ceil(g)
        .max(1)
        .checked_mul(g)
        .ok_or_else(|| DeviceError::Invalid {
            call: "cuMemAddressReserve",
            detail: format!(
                "{reserve_bytes} B rounded up to whole pages of {g} B is more than 2^64 bytes"
            ),
        })?;
    let va = dev.reserve_va(bytes)?;
    let pages = map_pages.min(bytes / g);
    let mut done: Vec<(u64, PhysHandle)> = Vec::new();
    let mut step = || -> Result<(), DeviceError> {
        for i in (0..pages).step_by(2) {
            let h = dev.create_physical(g)?;
            let at = va + i * g;
            if let Err(e) = dev.map(at, g, h) {
                let _ = dev.release_physical(h);
                return Err(e);
            }
            done.push((at, h));
            dev.set_access(at, g)?;
        }
        Ok(())
    };
    if let Err(e) = step() {
        for (at, h) in done {
            let _ = dev.unmap(at, g);
            let _ = dev.release_physical(h);
        }
        let _ = dev.free_va(va, bytes);
        return Err(e);
    }
    Ok(va)
}

/// Undoes [`demo_arena`] using the book: unmaps and releases every mapping of the reservation
/// at `va`, then frees the range.
///
/// # Errors
/// The first device call that failed.
pub fn teardown(dev: &mut dyn Device, book: &VmmBook, va: u64) -> Result<(), DeviceError> {
    let Some((start, bytes)) = book.reservation_of(va) else {
        return Err(DeviceError::Invalid {
            call: "cuMemAddressFree",
            detail: format!("{va:#x} is not a reservation"),
        });
    };
    let maps: Vec<(u64, u64, u64)> = book
        .mappings
        .range(start..start + bytes)
        .map(|(&a, m)| (a, m.bytes, m.handle))
        .collect();
    for (a, b, h) in maps {
        dev.unmap(a, b)?;
        dev.release_physical(PhysHandle(h))?;
    }
    dev.free_va(start, bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    #[test]
    fn page_table_of_a_sparse_arena() {
        let mut d = Tracked::new(SimDevice::new(1 << 30));
        let va = demo_arena(&mut d, 8 * G, 5).expect("arena");
        let tables = d.book.page_tables(G);
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        assert_eq!(t.va_start, va);
        assert_eq!(t.reserved_bytes, 8 * G);
        // Pages 0, 2, 4 mapped; 1, 3 and 5..8 holes.
        assert_eq!(t.mapped_bytes, 3 * G);
        let states: Vec<(u64, PageState)> = t
            .rows
            .iter()
            .map(|r| ((r.va_start - va) / G, r.state))
            .collect();
        assert_eq!(
            states,
            vec![
                (0, PageState::Mapped),
                (1, PageState::ReservedUnmapped),
                (2, PageState::Mapped),
                (3, PageState::ReservedUnmapped),
                (4, PageState::Mapped),
                (5, PageState::ReservedUnmapped),
            ]
        );
        assert_eq!(t.rows[5].bytes, 3 * G);
        assert_eq!(t.rows[0].access, vec![0]);
        assert_eq!(d.inner.used_bytes(), 3 * G);
        let text = render(&tables);
        assert!(text.contains("reserved-unmapped"), "{text}");
        assert!(text.contains("8 MiB") || text.contains("16 MiB"), "{text}");
        assert!(d.book.is_mapped(va, G));
        assert!(!d.book.is_mapped(va, 2 * G));
        let book = d.book.clone();
        teardown(&mut d, &book, va).expect("teardown");
        assert_eq!(d.inner.used_bytes(), 0);
        assert!(d.book.reservations.is_empty());
        assert!(d.book.mappings.is_empty());
        assert!(d.book.handles.is_empty());
    }

    #[test]
    fn demo_arena_unwinds_on_a_fault() {
        for fault in 0..6 {
            let mut sim = SimDevice::new(1 << 30);
            sim.inject_fault_at(Some(fault));
            let mut d = Tracked::new(sim);
            assert!(demo_arena(&mut d, 4 * G, 3).is_err(), "fault {fault}");
            assert_eq!(d.inner.used_bytes(), 0, "fault {fault}");
            assert!(d.book.reservations.is_empty(), "fault {fault}");
        }
    }

    #[test]
    fn access_grants_and_revokes_per_ordinal() {
        let mut b = VmmBook::default();
        b.on_reserve(0x1000_0000, 4 * G);
        b.on_map(0x1000_0000, G, 7);
        b.on_map(0x1000_0000 + G, G, 8);
        b.on_set_access(0x1000_0000, 2 * G, 0, true);
        b.on_set_access(0x1000_0000, 2 * G, 1, true);
        b.on_set_access(0x1000_0000 + G, G, 1, false);
        assert_eq!(
            b.mapping_of(0x1000_0000 + 5).map(|m| m.1.access.clone()),
            Some(vec![0, 1])
        );
        assert_eq!(
            b.mapping_of(0x1000_0000 + G).map(|m| m.1.access.clone()),
            Some(vec![0])
        );
        assert_eq!(
            b.reservation_of(0x1000_0000 + 3 * G),
            Some((0x1000_0000, 4 * G))
        );
        assert_eq!(b.reservation_of(0x1000_0000 + 4 * G), None);
    }
}
