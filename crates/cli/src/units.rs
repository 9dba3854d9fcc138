//! The CLI's units are the library's ([`gpumem::units`]); this keeps the old names for the
//! modules that still use them.
pub use gpumem::units::{bytes as human_bytes, parse_size};
