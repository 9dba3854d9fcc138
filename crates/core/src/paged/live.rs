//! The live blocks of a [`PagedPool`](super::PagedPool) by address: an
//! [`AddrTable`](crate::addr_table::AddrTable) (open addressing, one multiply a look-up).
//!
//! Every allocation inserts one entry and every free removes one, so the table's cost is paid
//! twice an event: a general hash map costs several times this one's instructions a pair
//! there (`docs/decisions.md`, "`paged`'s replay").
//! It iterates in slot order; the callers that need address order sort.
use super::LiveBlock;

/// Live blocks, address → [`LiveBlock`].
pub(crate) type LiveMap = crate::addr_table::AddrTable<LiveBlock>;
