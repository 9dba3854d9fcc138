#!/usr/bin/env python3
"""Replay speed of every strategy on every shipped trace, one core, simulated device.

usage: replay-speed.py [--gpumem PATH] [--runs N] [--cpu K] [--json FILE] [TRACE ...]

Issue 11's target: every strategy replays at >= 10 M events/s on one core. This runs
`gpumem replay TRACE --allocator A --json --no-plan` (simulated device) once per strategy
and trace, `--runs` times in rotation (each round visits every strategy of a trace before
the next round, so that a slow spell of the host is spread over all of them), pinned to
CPU `--cpu` with `taskset` when it is installed, and reads `events_per_second` (events
divided by the CPU seconds of the replaying thread). Prints a markdown table of the median
(M events/s; the best in brackets), strategies as columns, and the count of traces at or
above 10 M/s per strategy; `--json FILE` writes every run.

Default traces: the single-device traces of traces/ (top level, external, validation,
warm_process, settings, limits). Exit status 1 when a replay fails.
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys

STRATEGIES = ["buddy", "tlsf", "best-fit", "torch", "paged", "paged-lazy"]
TARGET = 10e6


def default_traces(root):
    pats = ["traces/*.pickle.gz", "traces/external/*.pickle.gz", "traces/validation/*.pickle.gz",
            "traces/warm_process/*.pickle.gz", "traces/settings/*.pickle.gz",
            "traces/limits/*.pickle.gz"]
    out = []
    for p in pats:
        out += sorted(glob.glob(os.path.join(root, p)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--gpumem", default=os.path.join(root, "target/release-lto/gpumem"),
                    help="the gpumem binary (default target/release-lto/gpumem)")
    ap.add_argument("--runs", type=int, default=5, help="runs per strategy and trace (default 5)")
    ap.add_argument("--cpu", type=int, default=0, help="CPU to pin to with taskset (default 0)")
    ap.add_argument("--json", metavar="FILE", help="write every run here (JSON lines)")
    ap.add_argument("--allocator", default=",".join(STRATEGIES),
                    help="comma-separated strategies (default all six)")
    ap.add_argument("traces", nargs="*", help="trace files (default: the shipped ones)")
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    if not os.access(a.gpumem, os.X_OK):
        ap.error(f"{a.gpumem}: not an executable gpumem binary (build it with "
                 "`cargo build --profile release-lto -p gpumem-cli`)")
    strategies = [s for s in a.allocator.split(",") if s]
    traces = a.traces or default_traces(root)
    if not traces:
        ap.error("no traces")
    pin = ["taskset", "-c", str(a.cpu)] if shutil.which("taskset") else []
    log = open(a.json, "w") if a.json else None
    table = {}
    for t in traces:
        name = os.path.relpath(os.path.abspath(t), os.path.join(root, "traces"))
        name = name.replace(".pickle.gz", "")
        speeds = {s: [] for s in strategies}
        events = None
        for _ in range(a.runs):
            for s in strategies:
                cmd = pin + [a.gpumem, "replay", t, "--allocator", s, "--json", "--no-plan"]
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"{name} {s}: replay failed ({p.returncode}): {p.stderr.strip()}",
                          file=sys.stderr)
                    return 1
                r = json.loads(p.stdout)
                al = r["allocators"][0]
                speeds[s].append(al["events_per_second"])
                events = r["trace"].get("events", events)
                if log:
                    log.write(json.dumps({"trace": name, "allocator": s,
                                          "events_per_second": al["events_per_second"]}) + "\n")
        table[name] = (events, speeds)
        print(f"{name}: " + ", ".join(f"{s} {statistics.median(v) / 1e6:.2f}"
                                      for s, v in speeds.items()), file=sys.stderr, flush=True)
    print("| trace (events) | " + " | ".join(strategies) + " |")
    print("|---|" + "---|" * len(strategies))
    met = {s: 0 for s in strategies}
    for name, (events, speeds) in table.items():
        cells = []
        for s in strategies:
            med = statistics.median(speeds[s])
            met[s] += med >= TARGET
            cell = f"{med / 1e6:.2f} ({max(speeds[s]) / 1e6:.2f})"
            cells.append(cell if med >= TARGET else f"**{cell}**")
        ev = f"{events:,}" if isinstance(events, int) else "?"
        print(f"| {name} ({ev}) | " + " | ".join(cells) + " |")
    print("| median at or above 10 M/s | " + " | ".join(
        f"{met[s]}/{len(table)}" for s in strategies) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
