//! Replay of traces through allocators.
