//! A record of the virtual-memory calls a device has made (reservations, physical handles,
//! mappings, access), and the page table drawn from it (`gpumem vmm`).
//!
//! [`VmmBook`] is kept by [`super::CudaDevice`] as it calls the driver, and by [`Tracked`],
//! which wraps any [`Device`] (the simulated one included) and records what passes through.
use std::collections::BTreeMap;

use gpumem_core::{Device, DeviceError, DriverCounters, PhysHandle};
use serde::Serialize;

/// One physical mapping inside a reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MappingRecord {
    /// Bytes mapped (a multiple of the granularity).
    pub bytes: u64,
    /// The physical handle mapped there.
    pub handle: u64,
    /// Device ordinals granted read-write access (cuMemSetAccess); empty until set.
    pub access: Vec<i32>,
}

/// What the device did through the VMM calls, kept in address order.
#[derive(Debug, Clone, Default)]
pub struct VmmBook {
    /// Reserved virtual ranges: start -> bytes.
    pub reservations: BTreeMap<u64, u64>,
    /// Live physical handles: handle -> bytes.
    pub handles: BTreeMap<u64, u64>,
    /// Mappings: va -> record.
    pub mappings: BTreeMap<u64, MappingRecord>,
}

/// State of one row of the page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PageState {
    /// Physical memory mapped here.
    Mapped,
    /// Reserved virtual space with nothing mapped.
    ReservedUnmapped,
}

/// One row of a page table: a mapped page (or run of pages from one handle) or a hole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PageRow {
    /// First virtual address of the row.
    pub va_start: u64,
    /// One past the last virtual address.
    pub va_end: u64,
    /// Physical handle (cuMemCreate), `None` for a hole.
    pub handle: Option<u64>,
    /// Bytes in the row.
    pub bytes: u64,
    /// Page size (the granularity) in bytes.
    pub page_bytes: u64,
    /// Mapped or reserved-unmapped.
    pub state: PageState,
    /// Device ordinals with read-write access.
    pub access: Vec<i32>,
}

/// The page table of one reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PageTable {
    /// Start of the reservation.
    pub va_start: u64,
    /// Bytes reserved.
    pub reserved_bytes: u64,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Rows in address order, holes included.
    pub rows: Vec<PageRow>,
}

impl VmmBook {
    /// Records a cuMemAddressReserve.
    pub fn on_reserve(&mut self, va: u64, bytes: u64) {
        self.reservations.insert(va, bytes);
    }
    /// Records a cuMemAddressFree.
    pub fn on_free_va(&mut self, va: u64) {
        self.reservations.remove(&va);
    }
    /// Records a cuMemCreate.
    pub fn on_create(&mut self, handle: u64, bytes: u64) {
        self.handles.insert(handle, bytes);
    }
    /// Records a cuMemRelease.
    pub fn on_release(&mut self, handle: u64) {
        self.handles.remove(&handle);
    }
    /// Records a cuMemMap.
    pub fn on_map(&mut self, va: u64, bytes: u64, handle: u64) {
        self.mappings.insert(
            va,
            MappingRecord {
                bytes,
                handle,
                access: Vec::new(),
            },
        );
    }
    /// Records a cuMemUnmap of `[va, va + bytes)` (drops every mapping inside).
    pub fn on_unmap(&mut self, va: u64, bytes: u64) {
        let end = va.saturating_add(bytes);
        let keys: Vec<u64> = self.mappings.range(va..end).map(|(k, _)| *k).collect();
        for k in keys {
            self.mappings.remove(&k);
        }
    }
    /// Records a cuMemSetAccess over `[va, va + bytes)`: `ordinal` gets (`grant`) or loses
    /// read-write access on every mapping that starts inside.
    pub fn on_set_access(&mut self, va: u64, bytes: u64, ordinal: i32, grant: bool) {
        let end = va.saturating_add(bytes);
        for (_, m) in self.mappings.range_mut(va..end) {
            m.access.retain(|&o| o != ordinal);
            if grant {
                m.access.push(ordinal);
                m.access.sort_unstable();
            }
        }
    }
    /// Whether `[va, va + bytes)` is entirely covered by mappings.
    pub fn is_mapped(&self, va: u64, bytes: u64) -> bool {
        let end = va.saturating_add(bytes);
        let mut at = va;
        // A mapping starting before `va` may cover it.
        if let Some((&s, m)) = self.mappings.range(..=va).next_back() {
            if s + m.bytes > va {
                at = s + m.bytes;
            }
        }
        for (&s, m) in self.mappings.range(at..end) {
            if s != at {
                return false;
            }
            at = s + m.bytes;
        }
        at >= end
    }
    /// Reservation containing `addr`: (start, bytes).
    pub fn reservation_of(&self, addr: u64) -> Option<(u64, u64)> {
        self.reservations
            .range(..=addr)
            .next_back()
            .filter(|(s, b)| addr < *s + *b)
            .map(|(s, b)| (*s, *b))
    }
    /// Mapping containing `addr`: (va, record).
    pub fn mapping_of(&self, addr: u64) -> Option<(u64, &MappingRecord)> {
        self.mappings
            .range(..=addr)
            .next_back()
            .filter(|(s, m)| addr < *s + m.bytes)
            .map(|(s, m)| (*s, m))
    }
    /// Page tables of every reservation, with `page_bytes` (the granularity) as page size.
    pub fn page_tables(&self, page_bytes: u64) -> Vec<PageTable> {
        self.reservations
            .iter()
            .map(|(&start, &bytes)| {
                let end = start + bytes;
                let mut rows = Vec::new();
                let mut at = start;
                let mut mapped = 0;
                for (&va, m) in self.mappings.range(start..end) {
                    if va > at {
                        rows.push(hole(at, va, page_bytes));
                    }
                    rows.push(PageRow {
                        va_start: va,
                        va_end: va + m.bytes,
                        handle: Some(m.handle),
                        bytes: m.bytes,
                        page_bytes,
                        state: PageState::Mapped,
                        access: m.access.clone(),
                    });
                    mapped += m.bytes;
                    at = va + m.bytes;
                }
                if at < end {
                    rows.push(hole(at, end, page_bytes));
                }
                PageTable {
                    va_start: start,
                    reserved_bytes: bytes,
                    mapped_bytes: mapped,
                    rows,
                }
            })
            .collect()
    }
}

fn hole(a: u64, b: u64, page_bytes: u64) -> PageRow {
    PageRow {
        va_start: a,
        va_end: b,
        handle: None,
        bytes: b - a,
        page_bytes,
        state: PageState::ReservedUnmapped,
        access: Vec::new(),
    }
}

/// Renders page tables as the seed draws them: one line per row.
pub fn render(tables: &[PageTable]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for t in tables {
        let _ = writeln!(
            s,
            "arena {:#x}: {} reserved, {} mapped",
            t.va_start,
            human(t.reserved_bytes),
            human(t.mapped_bytes)
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
                human(r.bytes),
                human(r.page_bytes),
                st,
                acc
            );
        }
    }
    s
}

/// Bytes in binary units (`2 MiB`, `512 B`).
pub fn human(bytes: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// Wraps any [`Device`] and records its VMM calls in a [`VmmBook`] (for the simulated device's
/// page table; [`super::CudaDevice`] keeps its own).
#[derive(Debug, Clone, Default)]
pub struct Tracked<D> {
    /// The wrapped device.
    pub inner: D,
    /// What was reserved and mapped through it.
    pub book: VmmBook,
    /// Live segments (cuMemAlloc) made through it: addr -> bytes.
    pub segments: BTreeMap<u64, u64>,
}

impl<D: Device> Tracked<D> {
    /// Wraps `inner`.
    pub fn new(inner: D) -> Self {
        Tracked {
            inner,
            book: VmmBook::default(),
            segments: BTreeMap::new(),
        }
    }
}

impl<D: Device> Device for Tracked<D> {
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn granularity_bytes(&self) -> u64 {
        self.inner.granularity_bytes()
    }
    fn used_bytes(&self) -> u64 {
        self.inner.used_bytes()
    }
    fn counters(&self) -> DriverCounters {
        self.inner.counters()
    }
    fn alloc_segment(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let a = self.inner.alloc_segment(bytes)?;
        self.segments.insert(a, bytes);
        Ok(a)
    }
    fn free_segment(&mut self, addr: u64) -> Result<(), DeviceError> {
        self.inner.free_segment(addr)?;
        self.segments.remove(&addr);
        Ok(())
    }
    fn reserve_va(&mut self, bytes: u64) -> Result<u64, DeviceError> {
        let va = self.inner.reserve_va(bytes)?;
        self.book.on_reserve(va, bytes);
        Ok(va)
    }
    fn free_va(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        self.inner.free_va(va, bytes)?;
        self.book.on_free_va(va);
        Ok(())
    }
    fn create_physical(&mut self, bytes: u64) -> Result<PhysHandle, DeviceError> {
        let h = self.inner.create_physical(bytes)?;
        self.book.on_create(h.0, bytes);
        Ok(h)
    }
    fn release_physical(&mut self, handle: PhysHandle) -> Result<(), DeviceError> {
        self.inner.release_physical(handle)?;
        self.book.on_release(handle.0);
        Ok(())
    }
    fn map(&mut self, va: u64, bytes: u64, handle: PhysHandle) -> Result<(), DeviceError> {
        self.inner.map(va, bytes, handle)?;
        self.book.on_map(va, bytes, handle.0);
        Ok(())
    }
    fn set_access(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        self.inner.set_access(va, bytes)?;
        self.book.on_set_access(va, bytes, 0, true);
        Ok(())
    }
    fn unmap(&mut self, va: u64, bytes: u64) -> Result<(), DeviceError> {
        self.inner.unmap(va, bytes)?;
        self.book.on_unmap(va, bytes);
        Ok(())
    }
    fn fill_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<(), DeviceError> {
        self.inner.fill_pattern(addr, bytes, pattern)
    }
    fn check_pattern(&mut self, addr: u64, bytes: u64, pattern: u32) -> Result<bool, DeviceError> {
        self.inner.check_pattern(addr, bytes, pattern)
    }
}

/// A demonstration arena for `gpumem vmm`: reserves `reserve_bytes`, maps every other page of
/// the first `map_pages` pages (leaving holes), and grants this device access. Returns the
/// reservation's start.
///
/// # Errors
/// The first device call that failed (what was done before it is undone).
pub fn demo_arena(
    dev: &mut dyn Device,
    reserve_bytes: u64,
    map_pages: u64,
) -> Result<u64, DeviceError> {
    let g = dev.granularity_bytes();
    let bytes = reserve_bytes.div_ceil(g).max(1) * g;
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
    use gpumem_core::sim::SimDevice;

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

    #[test]
    fn human_sizes() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(2 << 20), "2 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
