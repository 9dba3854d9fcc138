#!/usr/bin/env python3
"""Where a PyTorch allocation's time goes: PyTorch's own allocator, its pluggable-allocator
path, and gpumem's plug-in (GPU machine).

usage:
  torch-alloc-bench.py --lib libgpumem_torch.so [--trivial libtrivial_alloc.so] [--out DIR]
                       [--tests micro,ctypes,step] [--ops N] [--steps N]

Each measurement runs in its own process (an allocator is chosen once per process):
  micro   torch.empty(n, dtype=uint8, device="cuda") and its release, sizes 512 B .. 64 MiB
          (seeded, log-uniform), two patterns: `pair` (allocate, free at once) and `window`
          (16 live tensors, a random one replaced each operation); microseconds per
          allocation + free, under PyTorch's allocator (native), a trivial pluggable allocator
          (scripts/bench/torch-alloc-bench-trivial.c: size classes, free lists, no statistics: what
          any plug-in pays for PyTorch's pluggable path), and gpumem (strategy=torch, paged).
  ctypes  the same sizes through ctypes straight into gpumem_malloc/gpumem_free and
          trivial_malloc/trivial_free, no PyTorch: gpumem's own cost above the trivial one.
  step    GPT-2 training steps (12x768, AdamW, bf16 autocast, deterministic as in
          torch-compare.py) at two fixed shapes: wall time, CPU time until the step returns
          (before the synchronize), GPU kernel time of one step (torch.profiler), and with
          gpumem its own time inside gpumem_malloc/gpumem_free (GPUMEM_PROFILE=1).
  compare torch-compare.py's own workload (--workload, its seeded shapes: a new shape most
          steps) and timing loop, per step: wall, CPU, gpumem's time and driver calls; then
          one profiled step of a repeated shape and one of a new shape.
Writes OUT/alloc-bench.json and OUT/alloc-bench.md.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

# The workloads live in scripts/record/; gpu-check.sh carries them beside this script.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "record"))
import gpt2_workload  # scripts/record/gpt2_workload.py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_module_dir():
    for d in (HERE, os.path.join(HERE, "..", "..", "python")):
        if os.path.isfile(os.path.join(d, "gpumem_torch.py")):
            return os.path.abspath(d)
    sys.exit("torch-alloc-bench: gpumem_torch.py not found beside this script or in ../../python")


def sizes(n, seed=13):
    r = random.Random(seed)
    return [max(1, int(2 ** r.uniform(9, 26))) for _ in range(n)]


def setup(a):
    """Installs the allocator of `a.alloc` before any CUDA allocation; returns (torch, stats fn)."""
    import torch
    stats = None
    if a.alloc == "trivial":
        alloc = torch.cuda.memory.CUDAPluggableAllocator(a.trivial, "trivial_malloc", "trivial_free")
        torch.cuda.memory.change_current_allocator(alloc)
    elif a.alloc == "gpumem":
        sys.path.insert(0, find_module_dir())
        import gpumem_torch as g
        g.install(a.conf, lib=a.lib)
        stats = g.memory_stats
    return torch, stats


def gpumem_summary(stats):
    if stats is None:
        return None
    s = stats()
    keys = ("num_alloc_calls", "num_free_calls", "driver_calls.total", "driver_seconds", "main_stream",
            "side_stream_frees", "side_stream_waits", "unmaps_postponed", "unmaps_waited", "profile",
            "num_errors", "num_bad_frees")
    return {k: s.get(k) for k in keys}


def child_micro(a):
    torch, stats = setup(a)
    ss = sizes(a.ops)
    dev = torch.device("cuda")
    for n in set(ss[:2000]):  # warm the allocator's caches
        torch.empty(n, dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    out = {}
    t = time.perf_counter()
    for n in ss:
        x = torch.empty(n, dtype=torch.uint8, device=dev)
        del x
    out["pair_us"] = (time.perf_counter() - t) / len(ss) * 1e6
    r = random.Random(7)
    live = [torch.empty(n, dtype=torch.uint8, device=dev) for n in ss[:16]]
    t = time.perf_counter()
    for n in ss:
        live[r.randrange(16)] = torch.empty(n, dtype=torch.uint8, device=dev)
    out["window_us"] = (time.perf_counter() - t) / len(ss) * 1e6
    del live
    # The Python/dispatcher floor: a CPU tensor of 0 elements through the same call.
    t = time.perf_counter()
    for _ in range(len(ss)):
        x = torch.empty(0, dtype=torch.uint8)
        del x
    out["cpu_empty0_us"] = (time.perf_counter() - t) / len(ss) * 1e6
    torch.cuda.synchronize()
    out["gpumem"] = gpumem_summary(stats)
    return out


def child_ctypes(a):
    import ctypes
    out = {}
    for name, path, m, f in (("trivial", a.trivial, "trivial_malloc", "trivial_free"),
                             ("gpumem", a.lib, "gpumem_malloc", "gpumem_free")):
        if not path:
            continue
        h = ctypes.CDLL(path)
        if name == "gpumem":
            h.gpumem_configure.argtypes = [ctypes.c_char_p]
            h.gpumem_configure(a.conf.encode())
        mal, fre = getattr(h, m), getattr(h, f)
        mal.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        mal.restype = ctypes.c_void_p
        fre.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        fre.restype = None
        ss = sizes(a.ops)
        for n in set(ss[:2000]):
            p = mal(n, 0, None)
            fre(p, n, 0, None)
        t = time.perf_counter()
        for n in ss:
            p = mal(n, 0, None)
            fre(p, n, 0, None)
        out[name + "_pair_us"] = (time.perf_counter() - t) / len(ss) * 1e6
    return out


def child_step(a):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if a.alloc == "gpumem":
        os.environ["GPUMEM_PROFILE"] = "1"
    torch, stats = setup(a)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    *_, step = gpt2_workload.trainer(torch, dev)

    def prof_state():
        if stats is None:
            return None
        return stats().get("profile")

    out = {"shapes": {}}
    for bs, seq in ((16, 1024), (4, 128)):
        walls, cpus, gm = [], [], []
        for i in range(a.warmup + a.steps):
            torch.cuda.synchronize()
            p0 = prof_state()
            t0 = time.perf_counter()
            step(bs, seq)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            p1 = prof_state()
            if i >= a.warmup:
                walls.append((t2 - t0) * 1e3)
                cpus.append((t1 - t0) * 1e3)
                if p0 is not None:
                    gm.append({k: p1[k] - p0[k] for k in ("malloc_calls", "malloc_ns", "free_calls", "free_ns",
                                                          "slow_calls", "slow_ns")})
        rec = {"wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus),
               "walls": walls, "cpus": cpus}
        if gm:
            rec["gpumem_per_step"] = gm[len(gm) // 2]
        # One step under the profiler: kernel time on the GPU, and the busiest CPU-side calls.
        from torch.profiler import profile, ProfilerActivity
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(bs, seq)
            torch.cuda.synchronize()
        ka = prof.key_averages()
        dev_total = 0.0
        for e in ka:
            v = getattr(e, "self_device_time_total", None)
            if v is None:
                v = getattr(e, "self_cuda_time_total", 0.0)
            dev_total += v
        rec["profiled_gpu_kernel_ms"] = dev_total / 1e3
        try:
            rec["profile_cpu_table"] = ka.table(sort_by="self_cpu_time_total", row_limit=18)
        except Exception as e:  # noqa: BLE001 - a table is a convenience
            rec["profile_cpu_table"] = f"no table: {e}"
        out["shapes"][f"{bs}x{seq}"] = rec
    out["gpumem"] = gpumem_summary(stats)
    return out


def load_compare():
    """torch-compare.py (beside this script) as a module: its seeded workloads."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("torch_compare", os.path.join(HERE, "torch-compare.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def profiled(torch, fn):
    """Runs fn() once under torch.profiler: (GPU kernel ms, CPU table, synchronising calls)."""
    from torch.profiler import profile, ProfilerActivity
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ka = prof.key_averages()
    dev_total, syncs = 0.0, {}
    for e in ka:
        v = getattr(e, "self_device_time_total", None)
        dev_total += v if v is not None else getattr(e, "self_cuda_time_total", 0.0)
        if any(w in e.key for w in ("Synchronize", "Malloc", "Free", "MemGetInfo", "EventQuery")):
            syncs[e.key] = [e.count, round(e.self_cpu_time_total / 1e3, 3)]
    try:
        table = ka.table(sort_by="self_cpu_time_total", row_limit=25)
    except Exception as e:  # noqa: BLE001 - a table is a convenience
        table = f"no table: {e}"
    return dev_total / 1e3, table, syncs


def child_compare(a):
    """torch-compare.py's own workload and timing loop, per step: wall, CPU until the step
    returns, gpumem's time and driver calls inside it; then profiled steps."""
    if a.alloc == "gpumem":
        os.environ["GPUMEM_PROFILE"] = "1"
    tc = load_compare()
    sys.argv = sys.argv[:1]
    if a.alloc == "trivial":
        import torch
        torch.cuda.memory.change_current_allocator(
            torch.cuda.memory.CUDAPluggableAllocator(a.trivial, "trivial_malloc", "trivial_free"))
        torch, g = tc.child_setup("native", None, None, True)
    else:
        torch, g = tc.child_setup(a.alloc, a.conf if a.alloc == "gpumem" else None, a.lib, True)
    # A pluggable allocator other than gpumem has no statistics for the meter.
    meter = tc.Meter(torch, g) if a.alloc != "trivial" else None
    n = a.warmup + a.steps
    shapes = tc.schedule(a.workload, n)
    tc.schedule = lambda name, k: shapes  # build() then reads this list, extended below
    step, keep = tc.build(torch, a.workload, n)

    def gstate():
        if g is None:
            if a.alloc == "native":
                s = torch.cuda.memory_stats()
                return {"segments": s.get("num_device_alloc", 0), "frees": s.get("num_device_free", 0)}
            return {}
        s = g.memory_stats()
        p = s.get("profile") or {}
        return {"malloc_ns": p.get("malloc_ns", 0), "free_ns": p.get("free_ns", 0),
                "calls": p.get("malloc_calls", 0) + p.get("free_calls", 0),
                "slow_calls": p.get("slow_calls", 0), "slow_ns": p.get("slow_ns", 0),
                "driver": s.get("driver_calls", {})}

    rows = []
    for i in range(n):
        torch.cuda.synchronize()
        s0 = gstate()
        t0 = time.perf_counter()
        step(i)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        s1 = gstate()
        if meter is not None:
            meter.sample()
        d = {}
        for k, v in s1.items():
            if isinstance(v, dict):
                d[k] = {kk: vv - s0[k].get(kk, 0) for kk, vv in v.items() if vv - s0[k].get(kk, 0)}
            else:
                d[k] = v - s0[k]
        rows.append({"i": i, "shape": shapes[i], "wall_ms": round((t2 - t0) * 1e3, 2),
                     "cpu_ms": round((t1 - t0) * 1e3, 2), "delta": d})
    timed = rows[a.warmup:]
    out = {"rows": rows, "median_wall_ms": statistics.median(r["wall_ms"] for r in timed),
           "median_cpu_ms": statistics.median(r["cpu_ms"] for r in timed)}
    prof = {}
    for label, idx in (("repeat", n - 1), ("new", None)):
        if idx is None:
            shapes.append((16, 640) if a.workload == "gpt2" else (64, 320))
            idx = len(shapes) - 1
        ms, table, syncs = profiled(torch, lambda: step(idx))
        prof[label] = {"shape": shapes[idx], "gpu_kernel_ms": round(ms, 2), "calls": syncs, "table": table}
    out["profiled"] = prof
    if g is not None:
        s = g.memory_stats()
        out["gpumem"] = {k: s.get(k) for k in ("driver_calls", "profile", "main_stream", "side_stream_frees")}
    return out


CHILDREN = {"micro": child_micro, "ctypes": child_ctypes, "step": child_step, "compare": child_compare}


def run_child(a):
    out = {"test": a.child, "alloc": a.alloc, "conf": a.conf}
    try:
        out.update(CHILDREN[a.child](a))
    except Exception as e:  # noqa: BLE001 - reported by the parent
        import traceback
        out["error"] = f"{type(e).__name__}: {e}"[:800]
        out["traceback"] = traceback.format_exc()[-2000:]
    with open(a.result, "w") as f:
        json.dump(out, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="alloc-bench-out")
    ap.add_argument("--lib", required=False, help="libgpumem_torch.so")
    ap.add_argument("--trivial", default=None, help="libtrivial_alloc.so (from torch-alloc-bench-trivial.c)")
    ap.add_argument("--tests", default="micro,ctypes,step")
    ap.add_argument("--ops", type=int, default=200_000)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--step-allocs", default="native,trivial,gpumem:strategy=torch")
    ap.add_argument("--micro-allocs", default="native,trivial,gpumem:strategy=torch,gpumem:strategy=paged")
    ap.add_argument("--compare-allocs", default="gpumem:strategy=torch,native,trivial")
    ap.add_argument("--workload", default="gpt2", help="for --tests compare: a torch-compare.py workload")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--alloc", default="native", help=argparse.SUPPRESS)
    ap.add_argument("--conf", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return run_child(a)
    os.makedirs(a.out, exist_ok=True)
    plan = []
    tests = a.tests.split(",")
    if "micro" in tests:
        plan += [("micro", x) for x in a.micro_allocs.split(",")]
    if "ctypes" in tests:
        plan += [("ctypes", "gpumem:strategy=torch")]
    if "step" in tests:
        plan += [("step", x) for x in a.step_allocs.split(",")]
    if "compare" in tests:
        plan += [("compare", x) for x in a.compare_allocs.split(",")]
    results = []
    for test, spec in plan:
        alloc, _, conf = spec.partition(":")
        if alloc == "trivial" and not a.trivial:
            continue
        res = os.path.join(a.out, f"r{len(results)}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", test, "--alloc", alloc, "--conf", conf,
               "--result", res, "--ops", str(a.ops), "--warmup", str(a.warmup), "--steps", str(a.steps),
               "--workload", a.workload]
        if a.lib:
            cmd += ["--lib", os.path.abspath(a.lib)]
        if a.trivial:
            cmd += ["--trivial", os.path.abspath(a.trivial)]
        t = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        try:
            with open(res) as f:
                r = json.load(f)
            os.remove(res)
        except (OSError, ValueError):
            r = {"test": test, "alloc": alloc, "conf": conf, "error": f"no result (rc {p.returncode})"}
        r["seconds"] = round(time.time() - t, 1)
        if p.returncode != 0 or "error" in r:
            r["stderr"] = p.stderr[-1500:]
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k not in ("shapes", "rows", "profiled")})[:1500], flush=True)
        for row in r.get("rows", []):
            print(f"  step {row['i']} {row['shape']}: wall {row['wall_ms']} ms, cpu {row['cpu_ms']} ms, {row['delta']}",
                  flush=True)
        for label, pr in r.get("profiled", {}).items():
            print(f"  profiled {label} {pr['shape']}: kernels {pr['gpu_kernel_ms']} ms, {pr['calls']}", flush=True)
        for shape, rec in r.get("shapes", {}).items():
            print(f"  {shape}: wall {rec['wall_ms']:.1f} ms, cpu {rec['cpu_ms']:.1f} ms, "
                  f"gpu kernels {rec['profiled_gpu_kernel_ms']:.1f} ms, gpumem {rec.get('gpumem_per_step')}",
                  flush=True)
    with open(os.path.join(a.out, "alloc-bench.json"), "w") as f:
        json.dump({"results": results, "args": vars(a)}, f, indent=1)
    lines = ["| test | allocator | figure |", "|---|---|---|"]
    for r in results:
        name = r["alloc"] + (f" ({r['conf']})" if r.get("conf") else "")
        if "error" in r:
            lines.append(f"| {r['test']} | {name} | error: {r['error']} |")
        elif r["test"] == "micro":
            lines.append(f"| micro | {name} | pair {r['pair_us']:.2f} µs, window {r['window_us']:.2f} µs "
                         f"(CPU empty(0) {r['cpu_empty0_us']:.2f} µs) |")
        elif r["test"] == "ctypes":
            lines.append(f"| ctypes | {name} | " + ", ".join(f"{k} {v:.2f} µs" for k, v in r.items()
                                                             if k.endswith("_us")) + " |")
        elif r["test"] == "compare":
            lines.append(f"| compare {a.workload} | {name} | median wall {r['median_wall_ms']:.1f} ms, "
                         f"CPU {r['median_cpu_ms']:.1f} ms |")
        else:
            for shape, rec in r["shapes"].items():
                lines.append(f"| step {shape} | {name} | wall {rec['wall_ms']:.1f} ms, CPU {rec['cpu_ms']:.1f} ms, "
                             f"kernels {rec['profiled_gpu_kernel_ms']:.1f} ms, gpumem {rec.get('gpumem_per_step')} |")
    with open(os.path.join(a.out, "alloc-bench.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
