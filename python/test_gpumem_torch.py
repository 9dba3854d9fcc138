"""Tests of gpumem_torch.py that need no GPU: argument checks (no torch needed), and the
library on the simulated device through ctypes when libgpumem_torch.so is built. Tests that
need torch are skipped, with a message, where it is not installed.

    python3 -m unittest discover -s python -v
(cargo test -p gpumem-torch runs it too, with GPUMEM_TORCH_LIB set to the built library.)
"""
import ctypes
import importlib.util
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpumem_torch as g  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None


def lib_or_none():
    try:
        return g.library_path()
    except FileNotFoundError:
        return None


class ConfChecks(unittest.TestCase):
    def test_good_confs_pass_through(self):
        self.assertEqual(g.check_conf(None), "")
        s = "strategy=paged,reserve=256MiB,release_threshold=4GiB"
        self.assertEqual(g.check_conf(s), s)
        self.assertEqual(g.check_conf({"strategy": "torch", "reserve": 0}), "strategy=torch,reserve=0")
        g.check_conf(" release_threshold = none , page_cache_pages=8, segment=1.5GB, backend=sim,")
        g.check_conf("strategy=paged-lazy,headroom=0.02,max_handle=64MiB,map_ahead=0")
        g.check_conf("grow_ahead=0.0156")

    def test_bad_keys_and_values_are_named(self):
        for conf, words in [
            ("colour=red", ["unknown key 'colour'", "strategy, mode, reserve"]),
            ("mode=eager", ["'eager'", "direct or pool"]),
            ("strategy=slab", ["'slab'", "'strategy'"]),
            ("reserve=12XB", ["'12XB'", "'reserve'"]),
            ("page_cache_pages=-3", ["'-3'", "'page_cache_pages'"]),
            ("backend=rocm", ["'rocm'", "cuda or sim"]),
            ("segment=0", ["'segment'"]),
            ("headroom=2%", ["'2%'", "'headroom'", "0.02"]),
            ("headroom=-1", ["'-1'", "'headroom'"]),
            ("grow_ahead=2", ["'2'", "'grow_ahead'", "from 0 to 1"]),
            ("max_handle=big", ["'big'", "'max_handle'"]),
            ("oops", ["'oops' is not key=value"]),
        ]:
            with self.assertRaises(ValueError, msg=conf) as cm:
                g.check_conf(conf)
            for w in words:
                self.assertIn(w, str(cm.exception), conf)

    def test_wrong_types_raise_type_error(self):
        for bad in (3, ["strategy=paged"], {1: "x"}):
            with self.assertRaises(TypeError):
                g.check_conf(bad)

    def test_install_checks_conf_before_loading_anything(self):
        # A bad conf must fail before torch or the library is touched: the library path
        # given does not exist, and the error is still the ValueError.
        with self.assertRaises(ValueError):
            g.install("strategy=slab", lib="/nonexistent/libgpumem_torch.so")
        with self.assertRaises(ValueError):
            with g.use_pool({"colour": "red"}, lib="/nonexistent/libgpumem_torch.so"):
                pass


class PathAndDeviceChecks(unittest.TestCase):
    def test_missing_library_lists_what_was_tried(self):
        with self.assertRaises(FileNotFoundError) as cm:
            g.library_path("/nonexistent/libgpumem_torch.so")
        self.assertIn("/nonexistent/libgpumem_torch.so", str(cm.exception))

    def test_record_checks_its_path(self):
        with self.assertRaises(TypeError):
            with g.record(42):
                pass
        with self.assertRaises(ValueError):
            with g.record(""):
                pass
        with self.assertRaises(FileNotFoundError):
            with g.record("/nonexistent-dir/trace.jsonl"):
                pass

    def test_device_arguments(self):
        self.assertEqual(g._device_index(3), 3)
        self.assertEqual(g._device_index("cuda:2"), 2)
        self.assertEqual(g._device_index("cuda"), 0)
        for bad, exc in [("cpu", ValueError), (True, TypeError), (99, ValueError),
                         (-1, ValueError), (1.0, TypeError)]:
            with self.assertRaises(exc, msg=repr(bad)):
                g._device_index(bad)


@unittest.skipIf(lib_or_none() is None, "libgpumem_torch.so not built "
                 "(cargo build -p gpumem-torch, or set GPUMEM_TORCH_LIB): skipped")
class LibraryOnTheSimulatedDevice(unittest.TestCase):
    """The module's calls into the library, with backend=sim (no GPU, no torch)."""

    @classmethod
    def setUpClass(cls):
        cls.h = g._load()
        g._configure(cls.h, "backend=sim,sim_capacity=1GiB,strategy=paged,reserve=0")

    def test_stats_record_empty_cache_and_peaks(self):
        h = self.h
        s0 = g.memory_stats(0)
        self.assertEqual(s0["backend"], "sim")
        self.assertEqual(s0["strategy"], "paged")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jsonl")
            with g.record(path):
                p = h.gpumem_malloc(1 << 20, 0, None)
                q = h.gpumem_malloc(3000, 0, ctypes.c_void_p(7))
                self.assertTrue(p and q and p != q)
                s = g.memory_stats("cuda:0")
                self.assertEqual(s["requested_bytes.all.current"] - s0["requested_bytes.all.current"],
                                 (1 << 20) + 3000)
                self.assertEqual(s["allocation.all.current"] - s0["allocation.all.current"], 2)
                h.gpumem_free(p, 1 << 20, 0, None)
                h.gpumem_free(q, 3000, 0, ctypes.c_void_p(7))
                self.assertIsNone(h.gpumem_malloc(2 << 30, 0, None), "out of memory is NULL")
            with open(path) as f:
                lines = [json.loads(x) for x in f]
        self.assertEqual([x["action"] for x in lines], ["alloc", "alloc", "free", "free", "oom"])
        self.assertEqual(lines[1]["stream"], 7)
        self.assertEqual(lines[0]["addr"], lines[2]["addr"])
        s = g.memory_stats(0)
        self.assertEqual(s["num_ooms"], s0["num_ooms"] + 1)
        self.assertEqual(s["live_blocks"], 0)
        g.reset_peak_memory_stats()
        self.assertEqual(g.memory_stats(0)["allocated_bytes.all.peak"], 0)
        self.assertGreaterEqual(g.empty_cache(), 0)
        self.assertEqual(g.memory_stats(0)["reserved_bytes.all.current"], 0)
        self.assertEqual(h.gpumem_validate(), 0)

    def test_settings_are_set_once(self):
        with self.assertRaises(RuntimeError) as cm:
            g._configure(self.h, "strategy=torch")
        self.assertIn("already configured", str(cm.exception))


@unittest.skipIf(not HAS_TORCH, "torch is not installed: install() and use_pool() "
                 "are checked on the GPU machine (scripts/bench/torch-compare.py --smoke)")
class NeedsTorch(unittest.TestCase):
    def test_install_is_refused_after_cuda_allocations(self):
        import torch
        if not torch.cuda.is_available():
            self.skipTest("torch has no CUDA device here: skipped")
        torch.empty(1, device="cuda")  # PyTorch's own allocator is now in use
        with self.assertRaises(RuntimeError) as cm:
            g.install("strategy=paged")
        self.assertIn("before the first CUDA allocation", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
