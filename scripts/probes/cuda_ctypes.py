"""The CUDA driver API through ctypes and libcuda, for the probes in scripts/probes/ (no toolkit, no
PyTorch): the allocation-property structures of the VMM calls, and a primary context made
current on one device. Shared by vmm-offset-probe.py and refused-alloc-probe.py.
"""
import ctypes
import sys

ALLOCATION_TYPE_PINNED = 1
LOCATION_TYPE_DEVICE = 1


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("allocFlags", AllocFlags)]


def pinned_prop(ordinal):
    """CUmemAllocationProp of pinned device memory on device `ordinal` (what cuMemCreate and
    cuMemGetAllocationGranularity take)."""
    prop = AllocationProp()
    prop.type = ALLOCATION_TYPE_PINNED
    prop.location.type = LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    return prop


class Driver:
    """libcuda with device `ordinal`'s primary context current. `call` returns a call's
    CUresult; `must` exits with the call's name and CUresult when it is not CUDA_SUCCESS.
    Build it with `Driver.open`, which says why on standard error and returns None when there
    is no driver or no usable device."""

    def __init__(self, cu, ordinal):
        self.cu = cu
        self.dev = ctypes.c_int()
        self.must("cuDeviceGet", ctypes.byref(self.dev), ordinal)
        ctx = ctypes.c_void_p()
        self.must("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self.dev)
        self.must("cuCtxSetCurrent", ctx)

    @classmethod
    def open(cls, ordinal):
        try:
            cu = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            print(f"no CUDA driver (libcuda.so.1): {e}", file=sys.stderr)
            return None
        if int(cu.cuInit(0)) != 0:
            print("cuInit failed: no usable CUDA device", file=sys.stderr)
            return None
        return cls(cu, ordinal)

    def call(self, name, *args):
        return int(getattr(self.cu, name)(*args))

    def must(self, name, *args):
        r = self.call(name, *args)
        if r != 0:
            raise SystemExit(f"{name} failed with CUresult {r}")
