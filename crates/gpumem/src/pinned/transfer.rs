//! Transfer measurements.
