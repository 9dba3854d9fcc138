//! Pinned (page-locked) host memory.
