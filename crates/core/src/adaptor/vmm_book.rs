//! [`VmmBook`]: a record of the virtual-memory calls a device has made (reservations,
//! physical handles, mappings, access), and the page table drawn from it (`gpumem vmm`).
//! Kept by the CUDA device as it calls the driver, and by [`super::Tracked`] around any
//! [`crate::Device`].
use std::collections::BTreeMap;

use serde::Serialize;

use crate::vmm::PageState;

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
    /// read-write access on every mapping that overlaps it (one that starts before `va` and
    /// covers it included).
    pub fn on_set_access(&mut self, va: u64, bytes: u64, ordinal: i32, grant: bool) {
        let end = va.saturating_add(bytes);
        let from = match self.mappings.range(..=va).next_back() {
            Some((&s, m)) if s + m.bytes > va => s,
            _ => va,
        };
        if from >= end {
            return;
        }
        for (_, m) in self.mappings.range_mut(from..end) {
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
        // One mapping covers the whole range (a range past `end` would panic).
        if at >= end {
            return true;
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

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    /// A range inside one larger mapping: covered, and access changes reach that mapping
    /// (a peer grant on the pages of one block of a large mapping).
    #[test]
    fn a_range_inside_one_mapping() {
        let mut b = VmmBook::default();
        b.on_reserve(0, 64 * G);
        b.on_map(4 * G, 16 * G, 1);
        b.on_set_access(4 * G, 16 * G, 0, true);
        assert!(b.is_mapped(6 * G, 2 * G));
        assert!(b.is_mapped(4 * G, 16 * G));
        assert!(b.is_mapped(19 * G, G));
        assert!(!b.is_mapped(19 * G, 2 * G), "runs past the mapping");
        assert!(!b.is_mapped(2 * G, 4 * G), "starts before the mapping");
        b.on_set_access(6 * G, 2 * G, 1, true);
        assert_eq!(
            b.mapping_of(4 * G).map(|(_, m)| m.access.clone()),
            Some(vec![0, 1])
        );
        b.on_set_access(6 * G, 2 * G, 1, false);
        assert_eq!(
            b.mapping_of(4 * G).map(|(_, m)| m.access.clone()),
            Some(vec![0])
        );
        // Two mappings back to back cover a range across both; a hole does not.
        b.on_map(20 * G, 4 * G, 2);
        assert!(b.is_mapped(18 * G, 4 * G));
        b.on_map(26 * G, 2 * G, 3);
        assert!(!b.is_mapped(22 * G, 5 * G));
        b.on_set_access(22 * G, 6 * G, 1, true);
        let access = |va| b.mapping_of(va).map(|(_, m)| m.access.clone());
        assert_eq!(access(20 * G), Some(vec![1]));
        assert_eq!(access(26 * G), Some(vec![1]));
        assert_eq!(access(4 * G), Some(vec![0]), "untouched");
    }
}
