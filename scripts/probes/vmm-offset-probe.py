#!/usr/bin/env python3
"""Does cuMemMap map part of a physical handle (a nonzero offset) on this driver?

usage: vmm-offset-probe.py [--device N]

The CUDA driver API documents cuMemMap(ptr, size, offset, handle, flags) as mapping `size`
bytes of the handle from byte `offset` (ptr, size and offset multiples of the minimum
granularity), while its parameter note still says that offset "currently must be zero". If a
sub-range of one handle can be mapped, and mapped a second time elsewhere (an alias), then
physical memory created in a few large handles (few cuMemCreate calls) could still be placed
page by page: the question behind gpumem's paged-lazy trade (BENCHMARKS.md, issue 11). This
probe asks the driver directly, through ctypes and libcuda (no toolkit, no PyTorch), and
prints one JSON object:

  granularity_bytes       the minimum granularity
  map_with_offset         the CUresult of mapping pages 3..5 of an 8-page handle at a second
                          address (0 = CUDA_SUCCESS)
  alias_reads_back        whether bytes written through the first mapping read back through
                          the second (only when the map succeeded)
  partial_unmap           the CUresult of unmapping the first 2 pages of the 8-page mapping
                          (the documentation asks for the whole mapped range)

Exit status 0 when every call it needed to set up succeeded, whatever the answers; 2 when
there is no driver or no device.
"""
import argparse
import ctypes
import json
import sys

from cuda_ctypes import Driver, Location, LOCATION_TYPE_DEVICE, pinned_prop

GRANULARITY_MINIMUM = 0
ACCESS_READWRITE = 3


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    a = ap.parse_args()
    d = Driver.open(a.device)
    if d is None:
        return 2
    call, must = d.call, d.must
    u64 = ctypes.c_uint64
    prop = pinned_prop(a.device)
    gran = ctypes.c_size_t()
    must("cuMemGetAllocationGranularity", ctypes.byref(gran), ctypes.byref(prop),
         GRANULARITY_MINIMUM)
    g = gran.value
    handle = ctypes.c_uint64()
    must("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(8 * g), ctypes.byref(prop),
         u64(0))
    va = u64()
    must("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(16 * g), ctypes.c_size_t(0),
         u64(0), u64(0))
    desc = AccessDesc()
    desc.location.type = LOCATION_TYPE_DEVICE
    desc.location.id = a.device
    desc.flags = ACCESS_READWRITE
    base = va.value
    must("cuMemMap", u64(base), ctypes.c_size_t(8 * g), ctypes.c_size_t(0), handle, u64(0))
    must("cuMemSetAccess", u64(base), ctypes.c_size_t(8 * g), ctypes.byref(desc),
         ctypes.c_size_t(1))

    out = {"granularity_bytes": g}
    alias = base + 8 * g
    r = call("cuMemMap", u64(alias), ctypes.c_size_t(2 * g), ctypes.c_size_t(3 * g), handle,
             u64(0))
    out["map_with_offset"] = r
    if r == 0:
        must("cuMemSetAccess", u64(alias), ctypes.c_size_t(2 * g), ctypes.byref(desc),
             ctypes.c_size_t(1))
        words = (2 * g) // 4
        must("cuMemsetD32_v2", u64(base + 3 * g), ctypes.c_uint(0x5A17C0DE),
             ctypes.c_size_t(words))
        must("cuCtxSynchronize")
        buf = (ctypes.c_uint32 * words)()
        must("cuMemcpyDtoH_v2", buf, u64(alias), ctypes.c_size_t(2 * g))
        out["alias_reads_back"] = all(x == 0x5A17C0DE for x in buf)
        must("cuMemUnmap", u64(alias), ctypes.c_size_t(2 * g))
    out["partial_unmap"] = call("cuMemUnmap", u64(base), ctypes.c_size_t(2 * g))
    if out["partial_unmap"] == 0:
        call("cuMemUnmap", u64(base + 2 * g), ctypes.c_size_t(6 * g))
    else:
        must("cuMemUnmap", u64(base), ctypes.c_size_t(8 * g))
    must("cuMemRelease", handle)
    must("cuMemAddressFree", u64(base), ctypes.c_size_t(16 * g))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
