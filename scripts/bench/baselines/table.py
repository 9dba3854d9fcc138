#!/usr/bin/env python3
"""Turns the baseline programs' JSON lines into Markdown tables, and, given gpumem's
`bench alloc --json` output from the same run, states every speedup against the faster
baseline.

    python3 scripts/bench/baselines/table.py baselines.jsonl [bench-alloc.json]

Speedups: a DevicePool pair's median against the faster (smaller) of the baselines measured
in the same run: for the synchronous calls, gpumem's own cuMemAlloc+cuMemFree (Rust) and
the C++ cudaMalloc+cudaFree and cuMemAlloc+cuMemFree; for the stream-ordered ones, gpumem's
cuMemAllocAsync (Rust) and the C++ cudaMallocAsync+cudaFreeAsync.
"""
import json
import sys


def human(b):
    if isinstance(b, str):
        return b
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
    return f"{b} B"


def ns(x):
    if x is None:
        return "–"
    if x >= 1e6:
        return f"{x / 1e6:.2f} ms"
    if x >= 1e3:
        return f"{x / 1e3:.1f} µs"
    return f"{x:.0f} ns"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    lines = []
    for raw in open(sys.argv[1]):
        raw = raw.strip()
        if raw.startswith("{"):
            try:
                lines.append(json.loads(raw))
            except ValueError:
                pass
    bench = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
    out = []
    dev = next((l for l in lines if l.get("bench") == "device"), None)
    if dev:
        out.append(
            f"Device: {dev['name']}, cuMemGetInfo total {dev['mem_total_bytes']:,} B, "
            f"driver {dev['driver_version']}, runtime {dev['runtime_version']}."
        )

    # Device allocation: pair medians by size.
    pairs = [l for l in lines if "pair_ns" in l]
    sizes = []
    for l in pairs:
        if l["size"] not in sizes:
            sizes.append(l["size"])
    sizes.sort(key=lambda s: (isinstance(s, str), s if not isinstance(s, str) else 0))
    benches = []
    for l in pairs:
        if l["bench"] not in benches:
            benches.append(l["bench"])
    cell = {(l["bench"], l["size"]): l["pair_ns"] for l in pairs}
    if pairs:
        out.append("\n### Device allocation, median ns per alloc + free pair (C++ baselines)\n")
        out.append(table(["call"] + [human(s) for s in sizes],
                         [[b] + [ns(cell.get((b, s))) for s in sizes] for b in benches]))

    vmm = [l for l in lines if l.get("bench") == "vmm_cycle"]
    if vmm:
        out.append("\n### VMM calls, median per call (µs)\n")
        calls = ["reserve", "create", "map", "set_access", "unmap", "release", "address_free"]
        cols = [(l["context"], l["size"]) for l in vmm]
        rows = []
        for c in calls:
            rows.append([c] + [f"{l[c + '_ns'] / 1e3:.1f}" for l in vmm])
        out.append(table(["call"] + [f"{human(s)} {ctx}" for ctx, s in cols], rows))
    res = [l for l in lines if l.get("bench") == "vmm_reserve"]
    if res:
        out.append("\n### Address space alone (no memory behind it), median per call (µs)\n")
        out.append(table(["call"] + [human(l["size"]) for l in res],
                         [[c] + [f"{l[c + '_ns'] / 1e3:.1f}" for l in res]
                          for c in ["reserve", "address_free"]]))
    sap = [l for l in lines if l.get("bench") == "set_access_pages"]
    if sap:
        out.append("\n### cuMemSetAccess / cuMemUnmap over N contiguous 2 MiB mappings (8 GiB mapped besides), µs\n")
        out.append(table(["pages", "bytes", "set_access", "unmap"],
                         [[l["pages"], human(l["size"]), f"{l['set_access_ns'] / 1e3:.1f}",
                           f"{l['unmap_ns'] / 1e3:.1f}"] for l in sap]))

    host = [l for l in lines if l.get("bench") == "host_alloc"]
    if host:
        out.append("\n### Host memory, median per call\n")
        keys = ["cudaHostAlloc_ns", "cudaFreeHost_ns", "malloc_touch_ns", "cudaHostRegister_ns",
                "cudaHostUnregister_ns"]
        out.append(table(["call"] + [human(l["size"]) for l in host],
                         [[k[:-3]] + [ns(l[k]) for l in host] for k in keys]))
    copies = [l for l in lines if l.get("bench") == "copy" and "gbps" in l]
    if copies:
        out.append("\n### Copies (cudaMemcpyAsync, CUDA events), GB/s = 1e9 B/s\n")
        csizes = sorted({l["size"] for l in copies})
        kinds = []
        for l in copies:
            k = f"{l['kind']} {l['dir']}"
            if k not in kinds:
                kinds.append(k)
        g = {(f"{l['kind']} {l['dir']}", l["size"]): l["gbps"] for l in copies}
        out.append(table(["copy"] + [human(s) for s in csizes],
                         [[k] + [g.get((k, s), "–") for s in csizes] for k in kinds]))
    for l in lines:
        if l.get("bench") == "copy_both_ways_pinned":
            out.append(f"\nPinned, both directions at once: {l['gbps_total']} GB/s in total.")
        if l.get("dir") == "D2D":
            out.append(f"Device to device (1 GiB): {l['gbps_read_plus_write']} GB/s read + write.")

    if bench:
        out.append("\n### gpumem bench alloc (1 thread) against the faster baseline of this run\n")
        for d in bench:
            rows = [r for r in d["rows"] if r["threads"] == 1]

            def key(r):
                c = r["case"]
                return c["fixed"] if isinstance(c, dict) else "mixed"

            rust = {(r["backend"], key(r)): r["median_ns"] for r in rows}
            pools = sorted({r["backend"] for r in rows} - {"cuMemAlloc", "cuMemAllocAsync"})
            bsizes = []
            for r in rows:
                if key(r) not in bsizes:
                    bsizes.append(key(r))
            hdr = ["strategy"] + [human(s) for s in bsizes]
            sync_rows, async_rows = [], []
            for p in pools:
                srow, arow = [p], [p]
                for s in bsizes:
                    m = rust.get((p, s))
                    sync = [x for x in (rust.get(("cuMemAlloc", s)), cell.get(("cudaMalloc+cudaFree", s)),
                                        cell.get(("cuMemAlloc+cuMemFree", s))) if x]
                    asy = [x for x in (rust.get(("cuMemAllocAsync", s)),
                                       cell.get(("cudaMallocAsync+cudaFreeAsync", s))) if x]
                    srow.append(f"{min(sync) / m:,.0f}×" if m and sync else "–")
                    arow.append(f"{min(asy) / m:,.1f}×" if m and asy else "–")
                sync_rows.append(srow)
                async_rows.append(arow)
            out.append(f"{d['device']}: DevicePool pair vs the faster of cuMemAlloc+cuMemFree (Rust), "
                       "cudaMalloc+cudaFree and cuMemAlloc+cuMemFree (C++):\n")
            out.append(table(hdr, sync_rows))
            out.append("\nvs the faster of cuMemAllocAsync (Rust) and cudaMallocAsync+cudaFreeAsync (C++):\n")
            out.append(table(hdr, async_rows))
    print("\n".join(out))


if __name__ == "__main__":
    main()
