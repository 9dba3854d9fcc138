#!/usr/bin/env python3
"""Compare PyTorch's CUDA allocator with gpumem's plug-in on real training (GPU machine).

usage:
  torch-compare.py [--out DIR] [--lib PATH] [--workloads resnet50,gpt2,bert,churn[,moe,seg]]
                   [--configs native,expandable,paged,torch] [--warmup N] [--steps N]
                   [--rounds R] [--budget-s S] [--smoke] [--soak] [--no-compare]

Each (workload, configuration) runs in its own process (an allocator is chosen once per
process), in an order that rotates from one workload to the next (and from one round to the
next) so that no configuration always runs first. Configurations:
  native       PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  paged        gpumem_torch.install("strategy=paged" + --gpumem-conf)
  lazy         gpumem_torch.install("strategy=paged-lazy" + --gpumem-conf)
  torch        gpumem_torch.install("strategy=torch" + --gpumem-conf): gpumem's emulation of
               PyTorch's allocator, a control
  --extra NAME=CONF   any other gpumem settings, e.g. p64k=strategy=paged,max_cached_block=64KiB

Per run: peak device memory (cudaMemGetInfo used bytes after every step minus the baseline
taken before the model loads; and the same with the allocator's own reserved high-water mark in
place of its sampled reserved bytes, which catches peaks inside a step), the allocator's peak
reserved and allocated bytes, median step time over the steps after warm-up, the median CPU
time until the step returns (before its synchronize; about the step time when the GPU waits for
Python), with gpumem the median time spent inside gpumem_malloc/gpumem_free per step
(GPUMEM_PROFILE=1 unless --no-gpumem-profile), the first 5 losses, OOMs. The workloads are seeded: every configuration sees the same shapes, data and
initial weights, so its losses must match native's.

--smoke: a quick check of the plug-in (allocate, train a few steps, stats, record a trace,
out-of-memory, use_pool, a too-late install). --soak: 1,000 steps of a small model under gpumem
(reserved flat after warm-up, no leaked block, no error).
Writes OUT/compare.json, OUT/compare.md (the table), OUT/smoke.json, OUT/soak.json.
"""
import argparse
import contextlib
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
import heldout_models  # scripts/record/heldout_models.py

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = ("resnet50", "gpt2", "bert", "churn")
# Held out: named only, never run by default, so that a setting tuned on WORKLOADS can be
# checked on models it has not seen (a 4-layer Mixtral, FCN-ResNet50 segmentation).
HELD_OUT = ("moe", "seg")
GPUMEM_CONFIGS = {"paged": "strategy=paged", "lazy": "strategy=paged-lazy", "torch": "strategy=torch"}
GIB = float(1 << 30)


def find_module_dir():
    for d in (HERE, os.path.join(HERE, "..", "..", "python")):
        if os.path.isfile(os.path.join(d, "gpumem_torch.py")):
            return os.path.abspath(d)
    sys.exit("torch-compare: gpumem_torch.py not found beside this script or in ../../python")


# ---------------------------------------------------------------- child side


def child_setup(config, conf, lib, deterministic):
    """Environment and allocator, before any CUDA allocation. Returns (torch, gpumem or None)."""
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    g = None
    if conf is not None:
        sys.path.insert(0, find_module_dir())
        import gpumem_torch as g
        g.install(conf, lib=lib)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    return torch, g


class Meter:
    """Device memory and the allocator's own figures, the same way for every configuration."""

    def __init__(self, torch, g):
        self.torch, self.g = torch, g
        free, total = torch.cuda.mem_get_info()
        self.base = total - free
        self.base_reserved = self.reserved()[0]
        self.peak_sampled = 0
        self.peak_nonalloc = 0
        self.samples = []

    def reserved(self):
        """(current, peak) reserved bytes of the allocator in use, and its peak allocated."""
        if self.g is not None:
            s = self.g.memory_stats()
            return s["reserved_bytes.all.current"], s["reserved_bytes.all.peak"], s["allocated_bytes.all.peak"]
        t = self.torch.cuda
        return t.memory_reserved(), t.max_memory_reserved(), t.max_memory_allocated()

    def sample(self):
        free, total = self.torch.cuda.mem_get_info()
        used = total - free - self.base
        cur, _, _ = self.reserved()
        self.peak_sampled = max(self.peak_sampled, used)
        self.peak_nonalloc = max(self.peak_nonalloc, used - (cur - self.base_reserved))
        self.samples.append(cur)
        return used

    def result(self):
        _, rpeak, apeak = self.reserved()
        return {
            "peak_device_sampled_bytes": self.peak_sampled,
            # memory outside the allocator at its highest, plus the allocator's reserved peak
            "peak_device_bytes": max(self.peak_sampled, self.peak_nonalloc + rpeak - self.base_reserved),
            "reserved_peak_bytes": rpeak,
            "allocated_peak_bytes": apeak,
            "baseline_bytes": self.base,
        }


def schedule(name, n):
    """The seeded shape schedule of a workload (the same for every configuration)."""
    r = random.Random({"resnet50": 1, "gpt2": 2, "bert": 3, "churn": 4, "soak": 5, "moe": 6, "seg": 7}[name])
    if name == "moe":
        return [(r.choice([4, 8]), r.choice([128, 256, 512, 1024])) for _ in range(n)]
    if name == "seg":
        return [(r.choice([4, 6, 8]), r.choice([256, 320, 384, 448, 512])) for _ in range(n)]
    if name == "resnet50":
        return [(r.choice([16, 32, 64, 96]), r.choice([160, 192, 224, 256])) for _ in range(n)]
    if name == "gpt2":
        return [(r.choice([4, 8, 12, 16]), r.choice([128, 256, 384, 512, 768, 1024])) for _ in range(n)]
    if name == "bert":
        return [(r.choice([16, 32, 48, 64]), r.choice([64, 128, 256, 384, 512])) for _ in range(n)]
    if name == "soak":
        combos = [(b, s) for b in (4, 8, 16) for s in (64, 128, 256)]
        warm = combos[:]  # every shape once during warm-up, then random
        return warm + [r.choice(combos) for _ in range(n - len(warm))]
    return [r.random() for _ in range(n)]


def build(torch, name, n_steps):
    """Returns step(i) -> loss tensor or None, for workload `name`."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    shapes = schedule(name, n_steps)
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50().to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(i):
            bs, res = shapes[i]
            x = torch.randn(bs, 3, res, res, device=dev).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (bs,), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step, (model, opt)
    if name in ("gpt2", "soak"):
        _, model, opt, train = gpt2_workload.trainer(torch, dev, "small" if name == "gpt2" else "tiny")

        def step(i):
            return train(*shapes[i])
        return step, (model, opt)
    if name == "bert":
        from transformers import BertConfig, BertForSequenceClassification
        cfg = BertConfig()  # bert-base shape, random weights (no download on the GPU machine)
        model = BertForSequenceClassification(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-5)

        def step(i):
            bs, seq = shapes[i]
            ids = torch.randint(0, cfg.vocab_size, (bs, seq), device=dev)
            mask = torch.ones(bs, seq, dtype=torch.long, device=dev)
            labels = torch.randint(0, 2, (bs,), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step, (model, opt)
    if name == "moe":
        cfg, model = heldout_models.mixtral(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(i):
            bs, seq = shapes[i]
            ids = torch.randint(0, cfg.vocab_size, (bs, seq), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step, (model, opt)
    if name == "seg":
        model = heldout_models.fcn(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step(i):
            bs, side = shapes[i]
            x, y = heldout_models.fcn_batch(torch, bs, side, dev)
            loss = heldout_models.fcn_loss(torch, model, x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        return step, (model, opt)
    if name == "churn":
        # The mixed-sizes churn of torch_traces.py: heavy-tailed sizes, random frees, <= 400
        # live; one "step" is 300 operations.
        rng = random.Random(4)
        live = []

        def step(i):
            for _ in range(300):
                if rng.random() < 0.55 or not live:
                    n = max(1, min(int(rng.lognormvariate(13, 2.5)), 1 << 30))
                    live.append(torch.empty(n, dtype=torch.uint8, device=dev))
                else:
                    live.pop(rng.randrange(len(live)))
                if len(live) > 400:
                    live.pop(rng.randrange(len(live)))
            return None
        return step, (live,)
    raise SystemExit(f"unknown workload {name!r}")


def gpumem_ns(g):
    """Nanoseconds spent inside gpumem_malloc/gpumem_free so far (GPUMEM_PROFILE=1), or None."""
    if g is None:
        return None
    p = g.memory_stats().get("profile")
    return None if p is None else p["malloc_ns"] + p["free_ns"]


def run_child(a):
    out = {"workload": a.workload, "config": a.config, "conf": a.conf, "pid": os.getpid()}
    t_start = time.time()
    try:
        torch, g = child_setup(a.config, a.conf, a.lib, not a.nondeterministic)
        out["torch"] = torch.__version__
        out["device"] = torch.cuda.get_device_name(0)
        meter = Meter(torch, g)
        n = a.warmup + a.steps
        step, keep = build(torch, a.workload, n)
        times, cpu_times, gpumem_times, losses, ooms = [], [], [], [], 0
        prof0 = gpumem_ns(g)
        for i in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                loss = step(i)
                t_cpu = time.perf_counter() - t0
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                if loss is not None and len(losses) < 5:
                    losses.append(loss.item())
            except torch.OutOfMemoryError as e:
                ooms += 1
                dt = None
                out.setdefault("oom_message", str(e)[:300])
            meter.sample()
            prof1 = gpumem_ns(g)
            if i >= a.warmup and dt is not None:
                times.append(dt)
                cpu_times.append(t_cpu)
                if prof1 is not None:
                    gpumem_times.append((prof1 - prof0) / 1e9)
            prof0 = prof1
        out.update(meter.result())
        out["median_step_s"] = statistics.median(times) if times else None
        out["step_s"] = times
        # CPU time until the step returned (before the synchronize): close to the step time
        # when the GPU waits for Python, as in these workloads on the H200.
        out["median_cpu_s"] = statistics.median(cpu_times) if cpu_times else None
        # Time inside gpumem_malloc/gpumem_free per step (GPUMEM_PROFILE=1).
        out["median_gpumem_s"] = statistics.median(gpumem_times) if gpumem_times else None
        out["first_losses"] = losses
        out["ooms"] = ooms
        if g is not None:
            s = g.memory_stats()
            out["gpumem"] = {k: s.get(k) for k in (
                "mode", "num_ooms", "num_alloc_retries", "num_bad_frees", "num_errors", "driver_calls.total",
                "driver_seconds", "cache_hits", "cache_misses", "fragmentation", "requested_bytes.all.peak",
                "num_alloc_calls", "pending_blocks", "unmaps_postponed", "unmaps_waited", "side_stream_waits",
                "first_reports")}
    except Exception as e:  # keep the other runs going; the parent reports it
        import traceback
        out["error"] = f"{type(e).__name__}: {e}"[:800]
        out["traceback"] = traceback.format_exc()[-2000:]
    out["seconds"] = round(time.time() - t_start, 2)
    with open(a.result, "w") as f:
        json.dump(out, f)


# ---------------------------------------------------------------- smoke and soak


def run_smoke(a):
    """Checks the plug-in end to end in this process (gpumem installed)."""
    res = {"checks": {}}
    c = res["checks"]
    torch, g = child_setup("paged", "strategy=paged", a.lib, False)
    x = torch.randn(1024, 1024, device="cuda")
    y = (x @ x).sum().item()
    c["matmul"] = y == y
    z = torch.empty(0, device="cuda")
    c["empty_tensor"] = z.numel() == 0
    s = g.memory_stats()
    c["stats_allocated"] = s["allocated_bytes.all.current"] >= 4 << 20
    res["stats_after_alloc"] = s
    step, keep = build(torch, "soak", 12)
    with g.record(os.path.join(a.out, "smoke-trace.jsonl")) as path:
        losses = [step(i).item() for i in range(3)]
    c["record_lines"] = sum(1 for _ in open(path))
    c["losses"] = losses
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
        c["oom"] = "no error"
    except Exception as e:
        c["oom"] = f"{type(e).__name__}: {str(e)[:200]}"
    w = torch.randn(256, 256, device="cuda")
    c["alloc_after_oom"] = float(w.sum().item()) == float(w.sum().item())
    s = g.memory_stats()
    c["num_ooms"] = s["num_ooms"]
    c["num_alloc_retries"] = s["num_alloc_retries"]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q = torch.randn(1 << 20, device="cuda")
        q2 = q * 2
    side.synchronize()
    c["side_stream"] = bool((q2 == q * 2).all().item())
    del q, q2
    torch.backends.cudnn.benchmark = True
    try:
        conv = torch.nn.Conv2d(3, 8, 3).cuda()
        conv(torch.randn(2, 3, 32, 32, device="cuda")).sum().item()
        c["cudnn_benchmark"] = "ok"
    except Exception as e:
        c["cudnn_benchmark"] = f"{type(e).__name__}: {str(e)[:200]}"
    torch.backends.cudnn.benchmark = False
    g.reset_peak_memory_stats()
    del x, y, z, w, keep, step
    import gc
    gc.collect()
    torch.cuda.synchronize()
    c["empty_cache_bytes"] = g.empty_cache()
    s = g.memory_stats()
    c["reserved_after_empty_cache"] = s["reserved_bytes.all.current"]
    c["live_blocks_at_end"] = s["live_blocks"]
    c["bad_frees"] = s["num_bad_frees"]
    c["errors"] = s["num_errors"]
    res["stats_end"] = s
    return res


def run_smoke_pool(a):
    """In a process that keeps PyTorch's allocator: a too-late install(), and use_pool()."""
    res = {"checks": {}}
    c = res["checks"]
    import torch
    sys.path.insert(0, find_module_dir())
    import gpumem_torch as g
    x = torch.randn(1024, device="cuda")
    try:
        g.install("strategy=paged", lib=a.lib)
        c["too_late_install"] = "no error"
    except RuntimeError as e:
        c["too_late_install"] = str(e)[:300]
    try:
        with g.use_pool("strategy=paged", lib=a.lib):
            t = torch.randn(1 << 20, device="cuda")
        s = g.memory_stats()
        c["use_pool_live_blocks"] = s["live_blocks"]
        c["use_pool_tensor_ok"] = bool(torch.isfinite(t.sum()).item())
        c["native_untouched"] = torch.cuda.memory_allocated() >= x.numel() * 4
        del t
    except Exception as e:
        c["use_pool"] = f"{type(e).__name__}: {str(e)[:300]}"
    return res


def run_soak(a):
    torch, g = child_setup("paged", "strategy=" + a.soak_strategy + a.gpumem_conf, a.lib, False)
    n, warm = a.soak_steps, 100
    step, keep = build(torch, "soak", n)
    reserved, errors, t0 = [], 0, time.time()
    rec = g.record(a.soak_record) if a.soak_record else contextlib.nullcontext()
    with rec:
        for i in range(n):
            try:
                step(i).item()
            except Exception as e:
                errors += 1
                last = f"{type(e).__name__}: {str(e)[:200]}"
            reserved.append(g.memory_stats()["reserved_bytes.all.current"])
    tail = reserved[warm:]
    # Steps (after warm-up) at which reserved first rose above its step-`warm` value.
    rises, high = [], tail[0] if tail else 0
    for i, r in enumerate(tail[1:], 1):
        if r > high:
            rises.append(warm + i)
            high = r
    del keep, step
    import gc
    gc.collect()
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    torch.clear_autocast_cache()
    g.empty_cache()
    s = g.memory_stats()
    res = {
        "steps": n, "warmup": warm, "seconds": round(time.time() - t0, 1),
        "reserved_after_warmup": tail[0] if tail else None,
        "reserved_max_after_warmup": max(tail) if tail else None,
        "reserved_min_after_warmup": min(tail) if tail else None,
        "reserved_flat": bool(tail) and max(tail) == tail[0],
        "reserved_rises_at_steps": rises[:50],
        "reserved_after_empty_cache": s["reserved_bytes.all.current"],
        "leaked_blocks": s["live_blocks"], "errors": errors + s["num_errors"],
        "bad_frees": s["num_bad_frees"], "ooms": s["num_ooms"],
        "driver_calls": s["driver_calls.total"],
        "unmaps_postponed": s.get("unmaps_postponed"), "unmaps_waited": s.get("unmaps_waited"),
        "mode": s.get("mode"),
    }
    if errors:
        res["last_error"] = last
    return res


# ---------------------------------------------------------------- parent side


def fmt_gib(b):
    return "—" if b is None else f"{b / GIB:.2f}"


def table(results, configs):
    by = {}
    for r in results:
        by.setdefault(r["workload"], {}).setdefault(r["config"], []).append(r)
    lines = ["| workload | config | peak device GiB (min of runs) | ratio to native | reserved peak GiB | "
             "median step ms | step time vs native (per-run) | median CPU ms | gpumem ms/step | first losses | "
             "max loss diff vs native | OOMs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w, per in by.items():
        nat = per.get("native", [])
        nat_ok = [r for r in nat if "error" not in r]
        nat_peak = min((r["peak_device_bytes"] for r in nat_ok), default=None)
        nat_med = [r["median_step_s"] for r in nat_ok if r.get("median_step_s")]
        nat_loss = nat_ok[0]["first_losses"] if nat_ok else []
        for cfg in configs:
            runs = per.get(cfg, [])
            if not runs:
                continue
            ok = [r for r in runs if "error" not in r]
            if not ok:
                lines.append(f"| {w} | {cfg} | error: {runs[0]['error'][:120]} |||||||||")
                continue
            peak = min(r["peak_device_bytes"] for r in ok)
            ratio = f"{peak / nat_peak:.3f}" if nat_peak else "—"
            meds = [r["median_step_s"] for r in ok if r.get("median_step_s")]
            med = statistics.median(meds) if meds else None
            if nat_med and meds:
                rel = [f"{(m / n - 1) * 100:+.1f}%" for m, n in zip(meds, nat_med)]
                rel = ", ".join(rel)
            else:
                rel = "—"
            cpu = [r["median_cpu_s"] for r in ok if r.get("median_cpu_s")]
            cpu = f"{statistics.median(cpu) * 1e3:.1f}" if cpu else "—"
            gm = [r["median_gpumem_s"] for r in ok if r.get("median_gpumem_s") is not None]
            gm = f"{statistics.median(gm) * 1e3:.2f}" if gm else "—"
            loss = ok[0]["first_losses"]
            diff = max((abs(x - y) for x, y in zip(loss, nat_loss)), default=None)
            diffs = "—" if diff is None or cfg == "native" else f"{diff:.1e}"
            lines.append(
                f"| {w} | {cfg} | {fmt_gib(peak)} | {ratio} | {fmt_gib(min(r['reserved_peak_bytes'] for r in ok))} | "
                f"{'—' if med is None else f'{med * 1e3:.1f}'} | {rel} | {cpu} | {gm} | "
                f"{', '.join(f'{x:.6f}' for x in loss[:5]) or '—'} | {diffs} | {sum(r['ooms'] for r in ok)} |")
    return "\n".join(lines)


def config_conf(cfg, extra):
    if cfg in ("native", "expandable"):
        return None
    if cfg in GPUMEM_CONFIGS:
        return GPUMEM_CONFIGS[cfg] + extra
    if "=" in cfg:
        return cfg.split("=", 1)[1]
    raise SystemExit(f"unknown configuration {cfg!r}")


def spawn(a, workload, cfg, result):
    name = cfg.split("=", 1)[0]
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if name == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONUNBUFFERED"] = "1"
    if not a.no_gpumem_profile:
        env["GPUMEM_PROFILE"] = "1"  # two clock reads per call: gpumem's own time per step
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--workload", workload, "--config", name,
           "--result", result, "--warmup", str(a.warmup), "--steps", str(a.steps)]
    conf = config_conf(cfg, a.gpumem_conf)
    if conf is not None:
        cmd += ["--conf", conf]
    if a.lib:
        cmd += ["--lib", a.lib]
    if a.nondeterministic:
        cmd += ["--nondeterministic"]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, timeout=a.run_timeout_s, capture_output=True, text=True)
        tail = (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        return {"workload": workload, "config": name, "error": f"timed out after {a.run_timeout_s} s"}
    try:
        with open(result) as f:
            r = json.load(f)
    except (OSError, ValueError):
        r = {"workload": workload, "config": name, "error": f"no result (exit {p.returncode}): {tail}"}
    r["config"] = name
    r["wall_s"] = round(time.time() - t0, 1)
    if p.returncode != 0 or "error" in r:
        r["log_tail"] = tail
    return r


def sub_json(a, mode):
    """Runs --smoke/--smoke-pool/--soak in a child process and returns its JSON."""
    path = os.path.join(a.out, f"{mode}.part.json")
    cmd = [sys.executable, os.path.abspath(__file__), f"--{mode}-child", "--result", path, "--out", a.out,
           "--soak-steps", str(a.soak_steps), "--soak-strategy", a.soak_strategy,
           "--soak-record", a.soak_record,
           "--gpumem-conf", a.gpumem_conf]
    if a.lib:
        cmd += ["--lib", a.lib]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    try:
        p = subprocess.run(cmd, env=env, timeout=a.run_timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": "timed out"}
    try:
        with open(path) as f:
            r = json.load(f)
        os.remove(path)
    except (OSError, ValueError):
        r = {"error": f"exit {p.returncode}"}
    r["log_tail"] = (p.stdout + p.stderr)[-1500:]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="torch-compare-out")
    ap.add_argument("--lib", default=None, help="libgpumem_torch.so (default: gpumem_torch.library_path())")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--configs", default="native,expandable,lazy,paged,torch")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=CONF",
                    help="one more gpumem configuration, e.g. p64k=strategy=paged,max_cached_block=64KiB")
    ap.add_argument("--gpumem-conf", default="", help="appended to each gpumem configuration, e.g. ,reserve=0")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no run after this many seconds")
    ap.add_argument("--run-timeout-s", type=float, default=240)
    ap.add_argument("--no-gpumem-profile", action="store_true",
                    help="do not time gpumem's own calls (GPUMEM_PROFILE)")
    ap.add_argument("--nondeterministic", action="store_true",
                    help="skip torch.use_deterministic_algorithms (losses may then differ after step 1)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--soak", action="store_true")
    ap.add_argument("--soak-steps", type=int, default=1000)
    ap.add_argument("--soak-record", default="", help="write gpumem's JSON-lines trace of the soak here")
    ap.add_argument("--soak-strategy", default="paged-lazy", help="gpumem strategy of the soak (paged, paged-lazy, ...)")
    ap.add_argument("--no-compare", action="store_true")
    # child modes
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke_pool-child", dest="smoke_pool_child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--soak-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload")
    ap.add_argument("--config")
    ap.add_argument("--conf")
    ap.add_argument("--result")
    a = ap.parse_args()
    if a.warmup < 0 or a.steps < 1:
        ap.error("--warmup must be >= 0 and --steps >= 1")

    if a.child:
        return run_child(a)
    for mode, fn in (("smoke_child", run_smoke), ("smoke_pool_child", run_smoke_pool), ("soak_child", run_soak)):
        if getattr(a, mode):
            try:
                r = fn(a)
            except Exception as e:
                import traceback
                r = {"error": f"{type(e).__name__}: {e}"[:800], "traceback": traceback.format_exc()[-2000:]}
            with open(a.result, "w") as f:
                json.dump(r, f)
            return

    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    if a.smoke:
        r = {"gpumem": sub_json(a, "smoke"), "pool": sub_json(a, "smoke_pool")}
        with open(os.path.join(a.out, "smoke.json"), "w") as f:
            json.dump(r, f, indent=1)
        print("smoke:", json.dumps({k: v.get("checks", v.get("error")) for k, v in r.items()}, indent=1))
    if a.soak:
        r = sub_json(a, "soak")
        with open(os.path.join(a.out, "soak.json"), "w") as f:
            json.dump(r, f, indent=1)
        print("soak:", json.dumps({k: v for k, v in r.items() if k != "log_tail"}))
        if "error" in r:
            print(r["log_tail"])
    if a.no_compare:
        return
    workloads = [w.strip() for w in a.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS + HELD_OUT:
            ap.error(f"unknown workload {w!r} (expected {', '.join(WORKLOADS + HELD_OUT)})")
    configs = [c.strip() for c in a.configs.split(",") if c.strip()] + a.extra
    for c in configs:
        config_conf(c, "")
    names = [c.split("=", 1)[0] for c in configs]
    results, skipped = [], []
    k = 0
    for rnd in range(a.rounds):
        for w in workloads:
            order = configs[k % len(configs):] + configs[:k % len(configs)]
            k += 1
            for cfg in order:
                if time.time() - t0 > a.budget_s:
                    skipped.append((w, cfg))
                    continue
                r = spawn(a, w, cfg, os.path.join(a.out, "run.part.json"))
                r["round"] = rnd
                results.append(r)
                print(f"[{time.time() - t0:6.0f}s] {w:9} {cfg.split('=')[0]:10} "
                      + (f"error: {r['error'][:300]}" if "error" in r else
                         f"peak {fmt_gib(r['peak_device_bytes'])} GiB (sampled {fmt_gib(r['peak_device_sampled_bytes'])}),"
                         f" reserved {fmt_gib(r['reserved_peak_bytes'])} GiB, median step "
                         f"{(r['median_step_s'] or 0) * 1e3:.1f} ms, losses {r['first_losses'][:3]}, ooms {r['ooms']},"
                         f" {r['wall_s']} s"), flush=True)
                if "error" in r and r.get("log_tail"):
                    print(r["log_tail"][-800:])
    try:
        os.remove(os.path.join(a.out, "run.part.json"))
    except OSError:
        pass
    md = table(results, names)
    with open(os.path.join(a.out, "compare.json"), "w") as f:
        json.dump({"results": results, "skipped": skipped, "args": vars(a)}, f, indent=1)
    with open(os.path.join(a.out, "compare.md"), "w") as f:
        f.write(md + "\n")
    print(md)
    if skipped:
        print(f"skipped (budget): {skipped}")


if __name__ == "__main__":
    main()
