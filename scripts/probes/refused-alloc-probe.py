#!/usr/bin/env python3
"""How long does the driver take to refuse an allocation larger than the device?

usage: refused-alloc-probe.py [--device N] [--repeats N]

gpumem's simulated device charges every driver call a modelled time that grows with its
size (BENCHMARKS.md, "The driver cost model"). A request larger than the whole device is
refused by the driver, and the question is what such a refusal costs: the cost of a call
of that size (capped at the device's capacity, what the model did), or about that of the
smallest call. This probe asks the driver directly, through ctypes and libcuda (no toolkit,
no PyTorch), timing cuMemAlloc and cuMemCreate of 2^63 bytes, 1 TiB and the device's total
memory + 1 GiB (each refused), beside a granted cuMemAlloc / cuMemCreate of 2 MiB and of
1 GiB (each freed again, the free not timed). Prints one JSON object: for each call and
size, the CUresult and the median and minimum of `--repeats` timings, in microseconds.

Exit status 0 when every call it needed to set up succeeded; 2 when there is no driver or
no device.
"""
import argparse
import ctypes
import json
import statistics
import sys
import time

from cuda_ctypes import Driver, pinned_prop


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    ap.add_argument("--repeats", type=int, default=21, help="timings per case (default 21)")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    d = Driver.open(a.device)
    if d is None:
        return 2
    cu, must = d.cu, d.must
    u64 = ctypes.c_uint64
    size_t = ctypes.c_size_t
    total = size_t()
    must("cuDeviceTotalMem_v2", ctypes.byref(total), d.dev)
    prop = pinned_prop(a.device)

    def alloc(n):
        p = u64()
        t = time.perf_counter_ns()
        r = int(cu.cuMemAlloc_v2(ctypes.byref(p), size_t(n)))
        dt = time.perf_counter_ns() - t
        if r == 0:
            must("cuMemFree_v2", p)
        return r, dt

    def create(n):
        h = u64()
        t = time.perf_counter_ns()
        r = int(cu.cuMemCreate(ctypes.byref(h), size_t(n), ctypes.byref(prop), u64(0)))
        dt = time.perf_counter_ns() - t
        if r == 0:
            must("cuMemRelease", h)
        return r, dt

    sizes = {
        "2MiB": 2 << 20,
        "1GiB": 1 << 30,
        "total+1GiB": total.value + (1 << 30),
        "1TiB": 1 << 40,
        "2^63": 1 << 63,
    }
    out = {"device_total_bytes": total.value, "repeats": a.repeats, "calls": {}}
    for call, f in (("cuMemAlloc", alloc), ("cuMemCreate", create)):
        for label, n in sizes.items():
            f(n)  # warm-up, not timed
            runs = [f(n) for _ in range(a.repeats)]
            out["calls"][f"{call} {label}"] = {
                "bytes": n,
                "result": runs[-1][0],
                "median_us": statistics.median(dt for _, dt in runs) / 1000,
                "min_us": min(dt for _, dt in runs) / 1000,
            }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
