"""gpumem as PyTorch's CUDA allocator, in three lines::

    import gpumem_torch
    gpumem_torch.install()                   # before the first CUDA tensor (strategy=paged-lazy)
    ...  # train as usual; gpumem_torch.memory_stats() for the figures

Pure Python, no build step: it loads ``libgpumem_torch.so`` (crates/torch, built with
``cargo build --release -p gpumem-torch``) through ctypes and hands its ``gpumem_malloc`` /
``gpumem_free`` to ``torch.cuda.memory.CUDAPluggableAllocator``.

What PyTorch does not forward to a pluggable allocator, and what to use instead:

- ``torch.cuda.memory_stats()``, ``max_memory_allocated()``, ``reset_peak_memory_stats()`` and
  ``torch.cuda.empty_cache()`` do not reach it: use this module's ``memory_stats()``,
  ``reset_peak_memory_stats()`` and ``empty_cache()``.
- ``torch.backends.cudnn.benchmark = True`` asks the allocator for ``cacheInfo``, which
  pluggable allocators lack; leave it False (PyTorch's default) under gpumem.
- ``install()`` must run before the first CUDA allocation of the process, and cannot be
  undone. To route only part of a program through gpumem, use ``use_pool()`` instead.

Settings (``conf``) use the syntax of ``GPUMEM_CONF``: ``key=value`` pairs separated by commas,
or a dict. Keys: strategy (paged-lazy, the default; paged, torch, tlsf, buddy, best-fit), mode (direct: PyTorch's
stream semantics, the default; pool: gpumem's DevicePool), reserve, release_threshold,
max_cached_block, shard_cache, segment (sizes such as 256MiB or 4GiB), page_cache_pages
(a whole number), placement (paged-lazy: segments, the default, or pages), headroom
(paged-lazy pages: a fraction such as 0.02), max_handle and map_ahead (paged-lazy pages:
sizes), grow_ahead (paged-lazy segments: a fraction from 0 to 1 of the bytes held that each
growth maps beyond the request, such as 0.0156), backend (cuda, or sim for tests without a GPU), sim_capacity.
"""

import contextlib
import ctypes
import json
import os
import re

__all__ = [
    "install",
    "memory_stats",
    "empty_cache",
    "reset_peak_memory_stats",
    "record",
    "use_pool",
    "library_path",
    "check_conf",
]

#: Keys GPUMEM_CONF accepts (the same list as crates/torch/src/conf.rs).
KEYS = (
    "strategy",
    "mode",
    "reserve",
    "release_threshold",
    "max_cached_block",
    "shard_cache",
    "segment",
    "page_cache_pages",
    "placement",
    "headroom",
    "max_handle",
    "map_ahead",
    "grow_ahead",
    "backend",
    "sim_capacity",
)
STRATEGIES = ("paged", "paged-lazy", "paged_lazy", "lazy", "torch", "tlsf", "buddy", "best-fit",
              "bestfit", "best_fit")
_SIZE = re.compile(r"^[0-9][0-9_]*(\.[0-9]+)?\s*([KMGT]i?B?|[KMGT]B|B)?$", re.IGNORECASE)
_SIZE_KEYS = ("reserve", "release_threshold", "max_cached_block", "shard_cache", "segment",
              "max_handle", "map_ahead",
              "sim_capacity")

_LIB = None  # the ctypes handle
_LIB_PATH = None
_PLUGGABLE = None  # torch.cuda.memory.CUDAPluggableAllocator, made once
_INSTALLED_CONF = None
_CONFIGURED = None  # the settings handed to the library


def check_conf(conf):
    """Validates ``conf`` (a ``GPUMEM_CONF`` string, a dict, or None) and returns it as a
    string. Raises ``TypeError`` for another type and ``ValueError`` naming the first bad
    key or value. Loads nothing."""
    if conf is None:
        return ""
    if isinstance(conf, dict):
        items = []
        for k, v in conf.items():
            if not isinstance(k, str):
                raise TypeError(f"gpumem conf keys are strings, got {k!r}")
            items.append(f"{k}={v}")
        conf = ",".join(items)
    if not isinstance(conf, str):
        raise TypeError(f"gpumem conf is a 'key=value,...' string or a dict, got {type(conf).__name__}")
    for item in (i.strip() for i in conf.split(",")):
        if not item:
            continue
        if "=" not in item:
            raise ValueError(f"gpumem conf: {item!r} is not key=value")
        key, value = (x.strip() for x in item.split("=", 1))
        if key not in KEYS:
            raise ValueError(f"gpumem conf: unknown key {key!r} (expected one of {', '.join(KEYS)})")
        if key == "strategy" and value not in STRATEGIES:
            raise ValueError(f"gpumem conf: bad value {value!r} for 'strategy' "
                             f"(expected one of paged, paged-lazy, torch, tlsf, buddy, best-fit)")
        if key == "mode" and value not in ("direct", "pool"):
            raise ValueError(f"gpumem conf: bad value {value!r} for 'mode' (expected direct or pool)")
        if key == "placement" and value not in ("segments", "pages"):
            raise ValueError(f"gpumem conf: bad value {value!r} for 'placement' (expected segments or pages)")
        if key == "backend" and value not in ("cuda", "sim"):
            raise ValueError(f"gpumem conf: bad value {value!r} for 'backend' (expected cuda or sim)")
        for fkey, top, example in (("headroom", 10.0, "0.02"), ("grow_ahead", 1.0, "0.0156")):
            if key != fkey:
                continue
            try:
                ok = 0.0 <= float(value) <= top
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"gpumem conf: bad value {value!r} for {fkey!r} "
                                 f"(expected a fraction from 0 to {top:g}, such as {example})")
        if key == "page_cache_pages" and not value.isdigit():
            raise ValueError(f"gpumem conf: bad value {value!r} for 'page_cache_pages' "
                             f"(expected a whole number)")
        if key in _SIZE_KEYS and not (key == "release_threshold" and value == "none"):
            if not _SIZE.match(value):
                raise ValueError(f"gpumem conf: bad value {value!r} for {key!r} "
                                 f"(expected a size such as 256MiB, 4GiB or 4096)")
            if key == "segment" and float(re.sub(r"[^0-9.]", "", value) or 0) == 0:
                raise ValueError("gpumem conf: bad value '0' for 'segment' (at least 1 byte)")
    return conf


def library_path(lib=None):
    """The path of ``libgpumem_torch.so``: ``lib`` if given, else ``$GPUMEM_TORCH_LIB``, else
    the first that exists of: beside this file, ``target/release`` and ``target/debug`` of
    the repository this file lies in. Raises ``FileNotFoundError`` listing what was tried."""
    if lib is not None:
        lib = os.fspath(lib)
        if not os.path.isfile(lib):
            raise FileNotFoundError(f"gpumem_torch: no library at {lib!r}")
        return os.path.abspath(lib)
    env = os.environ.get("GPUMEM_TORCH_LIB")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"gpumem_torch: GPUMEM_TORCH_LIB={env!r} does not exist")
        return os.path.abspath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    tried = [os.path.join(here, "libgpumem_torch.so"),
             os.path.join(repo, "target", "release", "libgpumem_torch.so"),
             os.path.join(repo, "target", "debug", "libgpumem_torch.so")]
    for t in tried:
        if os.path.isfile(t):
            return t
    raise FileNotFoundError("gpumem_torch: libgpumem_torch.so not found (tried "
                            + ", ".join(tried)
                            + "); build it with `cargo build --release -p gpumem-torch` "
                              "or set GPUMEM_TORCH_LIB")


def _load(lib=None):
    global _LIB, _LIB_PATH
    if _LIB is not None:
        if lib is not None and os.path.abspath(os.fspath(lib)) != _LIB_PATH:
            raise RuntimeError(f"gpumem_torch: {_LIB_PATH} is already loaded; cannot switch to {lib!r}")
        return _LIB
    path = library_path(lib)
    h = ctypes.CDLL(path)
    h.gpumem_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    h.gpumem_malloc.restype = ctypes.c_void_p
    h.gpumem_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    h.gpumem_free.restype = None
    h.gpumem_configure.argtypes = [ctypes.c_char_p]
    h.gpumem_configure.restype = ctypes.c_int
    h.gpumem_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    h.gpumem_stats_json.restype = ctypes.c_ssize_t
    h.gpumem_empty_cache.argtypes = []
    h.gpumem_empty_cache.restype = ctypes.c_int64
    h.gpumem_reset_peak_stats.argtypes = []
    h.gpumem_reset_peak_stats.restype = None
    h.gpumem_record_start.argtypes = [ctypes.c_char_p]
    h.gpumem_record_start.restype = ctypes.c_int
    h.gpumem_record_stop.argtypes = []
    h.gpumem_record_stop.restype = ctypes.c_int64
    h.gpumem_validate.argtypes = []
    h.gpumem_validate.restype = ctypes.c_int
    _LIB, _LIB_PATH = h, path
    return h


def _configure(h, conf, explicit=True):
    """Hands ``conf`` to the library once; later calls must agree (or pass no conf)."""
    global _CONFIGURED
    if _CONFIGURED is not None:
        if explicit and conf != _CONFIGURED:
            raise RuntimeError(f"gpumem_torch: already configured with {_CONFIGURED!r}; "
                               "settings are set once per process, before gpumem's first use")
        return
    r = h.gpumem_configure(conf.encode())
    if r == -1:
        raise RuntimeError("gpumem_torch: the allocator already runs with other settings; "
                           "install() (or use_pool()) must come before its first use, once per process")
    if r not in (0, 1):
        raise RuntimeError(f"gpumem_torch: gpumem_configure failed ({r})")
    _CONFIGURED = conf


def _pluggable():
    global _PLUGGABLE
    if _PLUGGABLE is None:
        import torch
        _PLUGGABLE = torch.cuda.memory.CUDAPluggableAllocator(_LIB_PATH, "gpumem_malloc", "gpumem_free")
    return _PLUGGABLE


def install(conf=None, lib=None):
    """Makes gpumem PyTorch's CUDA allocator for the rest of the process.

    ``conf``: settings (see the module doc), checked before anything is loaded: an unknown
    key or bad value raises ``ValueError``. ``lib``: the path of ``libgpumem_torch.so`` (see
    ``library_path``). Must run before the first CUDA allocation: raises ``RuntimeError``
    saying so when it is too late. Calling it again with the same settings does nothing.
    Returns the ``CUDAPluggableAllocator``."""
    global _INSTALLED_CONF
    conf = check_conf(conf)
    if _INSTALLED_CONF is not None:
        if conf != _INSTALLED_CONF:
            raise RuntimeError(f"gpumem_torch: already installed with conf {_INSTALLED_CONF!r}")
        return _pluggable()
    import torch
    if torch.cuda.is_initialized() and torch.cuda.memory_reserved() > 0:
        raise RuntimeError("gpumem_torch.install() must run before the first CUDA allocation: "
                           "PyTorch's own allocator already holds "
                           f"{torch.cuda.memory_reserved()} bytes; call it at the top of the program")
    h = _load(lib)
    _configure(h, conf)
    alloc = _pluggable()
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError("gpumem_torch.install() must run before the first CUDA allocation "
                           f"(PyTorch: {e})") from e
    _INSTALLED_CONF = conf
    return alloc


def _device_index(device):
    if device is None:
        try:
            import torch
            return torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        except ImportError:
            return 0
    if isinstance(device, bool):
        raise TypeError("device is an int, a 'cuda:N' string or a torch.device, not a bool")
    if isinstance(device, int):
        idx = device
    elif isinstance(device, str):
        m = re.fullmatch(r"cuda(?::(\d+))?", device.strip())
        if not m:
            raise ValueError(f"device {device!r}: expected 'cuda' or 'cuda:N'")
        idx = int(m.group(1) or 0)
    elif getattr(device, "type", None) == "cuda":
        idx = device.index if device.index is not None else _device_index(None)
    else:
        raise TypeError(f"device is an int, a 'cuda:N' string or a torch.device, got {device!r}")
    if not 0 <= idx < 64:
        raise ValueError(f"device {idx} out of range 0..63")
    return idx


def memory_stats(device=None):
    """gpumem's figures for ``device`` (default: the current one) as a dict, with PyTorch's
    ``memory_stats()`` names where they exist (``allocated_bytes.all.current``/``peak``,
    ``reserved_bytes.all.*``, ``requested_bytes.all.*``, ``num_alloc_retries``, ``num_ooms``)
    and gpumem's own (``driver_calls``, ``fragmentation``, ``live_blocks``, caches, failures)."""
    idx = _device_index(device)
    h = _load()
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        n = h.gpumem_stats_json(idx, buf, size)
        if n < 0:
            raise RuntimeError(f"gpumem_torch: no statistics for device {idx}")
        if n < size:
            return json.loads(buf.value.decode())
        size = n + 1


def empty_cache():
    """Gives gpumem's cached device memory back to the driver (what ``torch.cuda.empty_cache()``
    does for PyTorch's own allocator; it does not reach gpumem). Returns the bytes released."""
    r = _load().gpumem_empty_cache()
    if r < 0:
        raise RuntimeError("gpumem_torch: empty_cache failed (the reason is on stderr)")
    return r


def reset_peak_memory_stats():
    """Sets every ``*.peak`` figure of ``memory_stats()`` to its current value."""
    _load().gpumem_reset_peak_stats()


@contextlib.contextmanager
def record(path):
    """Context manager: writes gpumem's JSON-lines trace of every allocation and free inside
    the block to ``path`` (replay it with ``gpumem replay PATH``). Blocks live at the start
    are written as ``preexisting`` lines."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"record(path): path is a str or os.PathLike, got {type(path).__name__}")
    p = os.fsencode(path)
    if not p:
        raise ValueError("record(path): empty path")
    parent = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"record(path): folder {os.fsdecode(parent)!r} does not exist")
    h = _load()
    if h.gpumem_record_start(p) != 0:
        raise RuntimeError(f"gpumem_torch: cannot record to {os.fsdecode(p)!r} (the reason is on stderr)")
    try:
        yield os.fsdecode(p)
    finally:
        if h.gpumem_record_stop() < 0:
            raise RuntimeError(f"gpumem_torch: the trace {os.fsdecode(p)!r} is incomplete (see stderr)")


@contextlib.contextmanager
def use_pool(conf=None, lib=None, device=None):
    """Context manager: routes the CUDA allocations made inside the block through gpumem, the
    rest of the program keeping PyTorch's allocator (``torch.cuda.MemPool`` over gpumem's
    ``CUDAPluggableAllocator``). ``conf`` and ``lib`` as for ``install()`` (settings apply
    from gpumem's first use on). Yields the ``MemPool``; tensors made inside stay valid after."""
    explicit = conf is not None
    conf = check_conf(conf)
    import torch
    h = _load(lib)
    _configure(h, conf, explicit)
    pool = torch.cuda.MemPool(_pluggable().allocator())
    with torch.cuda.use_mem_pool(pool, device=device):
        yield pool
