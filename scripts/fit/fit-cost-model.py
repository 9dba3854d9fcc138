#!/usr/bin/env python3
"""Refit the simulated device's driver-cost model to real replays on the H200.

usage: fit-cost-model.py REPLAY_JSONL... [--basis BIN] [--out DATA_JSON] [--allocators A,B,..]

REPLAY_JSONL is the replay.jsonl that `scripts/gpu-check.sh run replay` writes on the device
(`gpumem replay T --device cuda --canary --allocator all --json`, one line per trace), or
the lazy.jsonl of `run lazy` (paged-lazy under other --lazy-conf settings); several files are
joined. For
every single-device trace in it and every allocator named (default paged, paged-lazy, torch),
the same trace is replayed here on the simulated device by the `cost_basis` example
(`cargo build --release --example cost_basis`; a `paged-lazy` replay with the settings its
report echoes in `lazy_conf`), which prints per call kind the number of
calls, the sum of their isolated costs (`sim::h200_call_points`, interpolated) and the sum of
isolated cost x mappings live at the call. The counts must equal the real ones, kind by kind
(else the replay is left out, and said so).

The model prices a page-table call (create, map, set_access, unmap, release) at isolated x
(alpha + beta x mappings live); per kind, (alpha, beta) >= 0 are fitted by least squares on
the relative error of that kind's real seconds over all replays that make it. Other calls
(alloc, free, reserve, address_free) cost their isolated figure. Prints the fitted factors,
then per replay the modelled and real seconds with the factors fitted, and the mean
|ln(modelled / real)|. --out writes the data the `cost_model` test checks
(crates/gpumem/tests/data/h200_replay_driver_time_by_mappings.json).
"""
import argparse
import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE_TABLE = ["create", "map", "set_access", "unmap", "release"]
# `lazy_conf` as a replay report echoes paged-lazy's defaults (before grow_ahead existed).
DEFAULT_LAZY = "placement=segments,headroom=0,max_handle=1073741824,map_ahead=1073741824"


def find_trace(name):
    for d in ["traces", "traces/external", "traces/validation"]:
        p = os.path.join(ROOT, d, name)
        if os.path.exists(p):
            return p
    return None


def basis(binary, path, allocator, lazy_conf):
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: build it with `cargo build --release --example "
                 "cost_basis` or pass --basis")
    cmd = [binary, path, allocator] + ([lazy_conf] if lazy_conf else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)["sim"]


def fit(rows):
    """(alpha, beta) >= 0 minimising sum((alpha*i + beta*m) / r - 1)^2 over rows (i, m, r)."""
    a11 = sum((i / r) ** 2 for i, m, r in rows)
    a12 = sum((i / r) * (m / r) for i, m, r in rows)
    a22 = sum((m / r) ** 2 for i, m, r in rows)
    b1 = sum(i / r for i, m, r in rows)
    b2 = sum(m / r for i, m, r in rows)
    det = a11 * a22 - a12 * a12
    if det > 0:
        alpha = (b1 * a22 - b2 * a12) / det
        beta = (a11 * b2 - a12 * b1) / det
        if alpha >= 0 and beta >= 0:
            return alpha, beta
    # On the boundary: the better of beta = 0 and alpha = 0.
    cands = []
    if a11 > 0:
        cands.append((b1 / a11, 0.0))
    if a22 > 0:
        cands.append((0.0, b2 / a22))

    def loss(ab):
        return sum(((ab[0] * i + ab[1] * m) / r - 1) ** 2 for i, m, r in rows)

    return min(cands, key=loss)


def read_replays(src, wanted, basis_bin):
    """The replays of one replay.jsonl / lazy.jsonl joined with their simulated basis."""
    replays = []
    try:
        with open(src, "rb") as f:
            raw = f.read().split(b"\n")
    except OSError as e:
        sys.exit(f"{src}: {e.strerror}")
    for n, line in enumerate(raw, 1):
        if not line.strip():
            continue
        where = f"{src}: line {n}"
        try:
            d = json.loads(line.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            sys.exit(f"{where}: not JSON ({e}); expected a replay.jsonl of "
                     "scripts/gpu-check.sh")
        if not isinstance(d, dict) or "trace" not in d or "rc" not in d:
            sys.exit(f"{where}: expected an object with keys trace, rc and report (a line "
                     "of the replay.jsonl of scripts/gpu-check.sh), not this")
        if d.get("rc") != 0 or "report" not in d:
            print(f"{where}: {d['trace']} did not replay (rc {d.get('rc')}), left out",
                  file=sys.stderr)
            continue
        path = find_trace(d["trace"])
        if path is None or path.endswith(".jsonl"):
            print(f"{where}: {d['trace']}: not a single-device trace of traces/ here, left out",
                  file=sys.stderr)
            continue
        for a in d["report"]["allocators"]:
            if a["name"] not in wanted:
                continue
            real_calls = {k: v for k, v in a["driver_calls"].items() if v}
            real_secs = {k: a["driver_seconds"][k] for k in real_calls}
            lazy = a.get("lazy_conf") if a["name"] == "paged-lazy" else None
            sim = basis(basis_bin, path, a["name"], lazy)
            counts = {k: v["calls"] for k, v in sim.items()}
            if counts != real_calls:
                print(f"{src}: {d['trace']} / {a['name']}: simulated calls {counts} differ from "
                      f"the real {real_calls}, left out", file=sys.stderr)
                continue
            label = a["name"]
            if lazy and lazy.removesuffix(",grow_ahead=0") != DEFAULT_LAZY:
                label += f" ({lazy})"
            replays.append({"trace": d["trace"].split(".")[0], "allocator": label,
                            "real_seconds": real_secs, "real_calls": real_calls,
                            "sim": sim})
    return replays


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[1],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("replay_jsonl", nargs="+",
                    help="replay.jsonl (or lazy.jsonl) of `scripts/gpu-check.sh run replay` "
                    "(or `run lazy`) on a GPU machine: one JSON object per line with keys "
                    "trace, rc and report (the output of `gpumem replay T --device cuda "
                    "--allocator all --json`)")
    target_dir = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    ap.add_argument("--basis", default=os.path.join(target_dir, "release/examples/cost_basis"),
                    help="the cost_basis example binary")
    ap.add_argument("--out", help="write the cost_model test's data here")
    ap.add_argument("--allocators", default="paged,paged-lazy,torch",
                    help="allocators of the replays to fit, comma-separated")
    args = ap.parse_args()
    wanted = args.allocators.split(",")
    replays = []
    for src in args.replay_jsonl:
        replays += read_replays(src, wanted, args.basis)
    if not replays:
        sys.exit(f"{', '.join(args.replay_jsonl)}: no replay to fit (none of {args.allocators} replayed a "
                 "single-device trace of traces/ with rc 0)")
    factors = {}
    for k in PAGE_TABLE:
        rows = [(r["sim"][k]["isolated_seconds"], r["sim"][k]["isolated_seconds_x_mappings"],
                 r["real_seconds"][k]) for r in replays
                if k in r["sim"] and r["real_seconds"].get(k, 0) > 0]
        if rows:
            factors[k] = fit(rows)
    print("fitted (alpha, beta per 1,000 mappings):")
    for k, (a, b) in factors.items():
        print(f"  {k:11} {a:.2f} {b * 1e3:.3f}")
    logs = []
    print(f"\n{'trace':28} {'allocator':11} {'real s':>9} {'model s':>9} {'ratio':>6}")
    for r in replays:
        real = sum(r["real_seconds"].values())
        model = 0.0
        for k, s in r["sim"].items():
            a, b = factors.get(k, (1.0, 0.0))
            model += a * s["isolated_seconds"] + b * s["isolated_seconds_x_mappings"]
        ratio = model / real
        logs.append(abs(math.log(ratio)))
        print(f"{r['trace']:28} {r['allocator']:11} {real:9.4f} {model:9.4f} {ratio:6.2f}")
    print(f"\nmean |ln(model / real)| {sum(logs) / len(logs):.3f} over {len(logs)} replays, "
          f"worst factor {math.exp(max(logs)):.2f}")
    if args.out:
        about = ("Real driver seconds per call kind of `gpumem replay T --device cuda --canary` "
                 "on the lent H200 (driver 580, CUDA 13.0), from "
                 f"{', '.join(os.path.basename(p) for p in args.replay_jsonl)} of "
                 "scripts/gpu-check.sh (`run replay`: --allocator all; `run lazy`: paged-lazy "
                 "under the --lazy-conf its label names), for "
                 f"{', '.join(wanted)}. `sim` holds, for the same replay on the simulated device "
                 "(the counts per kind equal the real ones), per call kind: the number of calls, "
                 "the sum of their isolated costs (h200_isolated_call_seconds) and the sum of "
                 "isolated cost x mappings live at the call (examples/cost_basis.rs). Written by "
                 "scripts/fit/fit-cost-model.py, which also fitted the cost model's (alpha, beta) per "
                 "kind (sim::mapping_cost_factors); the test cost_model checks the model against "
                 "these figures.")
        with open(args.out, "w") as g:
            json.dump({"about": about, "replays": replays}, g, indent=1)
            g.write("\n")


if __name__ == "__main__":
    main()
