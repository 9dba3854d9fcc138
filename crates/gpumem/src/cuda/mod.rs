//! The CUDA backend (cudarc, driver API loaded at run time).
