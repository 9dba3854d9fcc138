#!/usr/bin/env python3
"""A placement-only model of `paged-lazy`'s default (PyTorch's expandable segments, one
physical handle per growth), with two changes tried against issue 11's peak target and not
kept (BENCHMARKS.md, "Issue 11, thirteenth session"):

  moves  at a growth that would map more than the larger of the pool's peak so far and the
         peak of live bytes, unmap handles that no block touches and map them where the
         block goes (2 calls each, one cuMemSetAccess for all) before creating the rest;
         a handle is mapped only whole, as the driver demands (cuMemMap at a nonzero offset
         answers 801). Growths may fill the unmapped gaps that moves leave.
  aware  a block placed in a longer free run goes where the most bytes of whole handles
         stay idle (either end of the run, or a handle boundary inside it), so that a later
         growth finds handles to move; only for blocks of at least AWARE bytes.
  align  a block of at least ALIGN bytes that makes a growth (and no move) starts a handle of
         its own instead of sharing the last page of the one before, so that no neighbour
         touches its handle once it is freed.

Two pools as PyTorch's: requests of at most 1 MiB in one with 2 MiB pages (never moved),
the rest in one with 20 MiB pages. Requests rounded up to 512 B; the smallest fitting free
run is taken (lowest address first). Driver calls: a growth is cuMemCreate + cuMemMap +
cuMemSetAccess. Peak: of the two pools' mapped bytes together, divided by the peak of live
requested bytes. Against `gpumem replay -a paged-lazy` the baseline's peak agrees to the third
digit on gpt2_train, gpt2_eval, llama_accum, resnet_infer and vit_train, and its second-half
calls on gpt2_train, gpt2_eval, llama_accum and resnet_train; not on t5_train, bert_finetune
and mixed_sizes (rules of PyTorch's the model leaves out: streams, the small pool's own
rounding), nor on inference_with_empty_cache (no empty_cache here).

usage: handle-moves-proto.py TRACE.jsonl ...   (JSON lines from `gpumem convert`)
Prints a markdown table, per trace: peak ratio, second-half driver calls and handles moved,
for the baseline and each combination in CONFIGS.
"""
import bisect
import json
import sys

MIB = 1 << 20


def rup(x, a):
    return (x + a - 1) // a * a


def load(path):
    """(is_alloc, addr, size) events; a block freed twice or never allocated is skipped."""
    out, live = [], set()
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            a = e["action"]
            if a == "alloc":
                live.add(e["addr"])
                out.append((1, e["addr"], e["size"]))
            elif a in ("free_requested", "free_completed", "free") and e["addr"] in live:
                live.discard(e["addr"])
                out.append((0, e["addr"], 0))
    return out


class Pool:
    def __init__(s, page, moves, aware, align=0):
        s.page, s.moves, s.aware, s.align = page, moves, aware, align
        s.base = 1 << 40
        s.starts, s.lens = [], {}  # free runs on mapped handles, by address
        s.hstarts, s.handles = [], {}  # mapped handles
        s.mapped = s.peak = s.calls = s.nmoves = 0

    def add_free(s, a, n):
        if n <= 0:
            return
        i = bisect.bisect_left(s.starts, a)
        if i > 0 and s.starts[i - 1] + s.lens[s.starts[i - 1]] == a:
            i -= 1
            a = s.starts.pop(i)
            n += s.lens.pop(a)
        if i < len(s.starts) and a + n == s.starts[i]:
            n += s.lens.pop(s.starts.pop(i))
        s.starts.insert(i, a)
        s.lens[a] = n

    def take(s, a, n):
        i = bisect.bisect_right(s.starts, a) - 1
        r = s.starts.pop(i)
        rl = s.lens.pop(r)
        assert r <= a and a + n <= r + rl
        s.add_free(r, a - r)
        s.add_free(a + n, r + rl - a - n)

    def map_handle(s, a, n):
        bisect.insort(s.hstarts, a)
        s.handles[a] = n
        s.mapped += n
        s.peak = max(s.peak, s.mapped)
        s.add_free(a, n)

    def unmap_handle(s, h):
        hl = s.handles.pop(h)
        s.hstarts.remove(h)
        s.take(h, hl)
        s.mapped -= hl

    def idle_handles_in(s, r, l):
        i = bisect.bisect_left(s.hstarts, r)
        out = []
        while i < len(s.hstarts) and s.hstarts[i] + s.handles[s.hstarts[i]] <= r + l:
            out.append(s.hstarts[i])
            i += 1
        return out

    def idle_after(s, r, l, a, n):
        parts = ((r, a - r), (a + n, r + l - a - n))
        return sum(s.handles[h] for pr, pl in parts if pl > 0 for h in s.idle_handles_in(pr, pl))

    def place_in_run(s, r, l, n):
        if not (s.aware and l > n and n >= s.aware):
            return r
        cands = {r, r + l - n}
        i = bisect.bisect_left(s.hstarts, r)
        while i < len(s.hstarts) and s.hstarts[i] < r + l:
            b = s.hstarts[i]
            if b + n <= r + l:
                cands.add(b)
            e = b + s.handles[b]
            if r <= e - n and e <= r + l:
                cands.add(e - n)
            i += 1
        return max(sorted(cands), key=lambda c: s.idle_after(r, l, c, n))

    def alloc(s, n, peak_live):
        best = None
        for r in s.starts:
            l = s.lens[r]
            if l >= n and (best is None or l < best[1]):
                best = (r, l)
        if best:
            a = s.place_in_run(best[0], best[1], n)
            s.take(a, n)
            return a
        limit = max(s.peak, peak_live)
        if s.align and n >= s.align and not (s.moves and s.mapped + rup(n, s.page) > limit):
            end = s.hstarts[-1] + s.handles[s.hstarts[-1]] if s.hstarts else s.base
            s.map_handle(end, rup(n, s.page))
            s.calls += 3
            s.take(end, n)
            return end
        # Grow: into the unmapped gap (or the end) that needs the fewest new bytes.
        gaps, prev = [], s.base
        for h in s.hstarts:
            if h > prev:
                gaps.append((prev, h))
            prev = h + s.handles[h]
        gaps.append((prev, None))
        bestg = None
        for g0, g1 in gaps:
            i = bisect.bisect_left(s.starts, g0) - 1
            a = s.starts[i] if i >= 0 and s.starts[i] + s.lens[s.starts[i]] == g0 else g0
            if g1 is not None and (g0 - a) + (g1 - g0) + s.lens.get(g1, 0) < n:
                continue
            new = rup(max(0, a + n - g0), s.page)
            if g1 is not None:
                new = min(new, g1 - g0)
            if bestg is None or new < bestg[0]:
                bestg = (new, a, g0, g1)
        new, a, g0, g1 = bestg
        if s.moves and s.mapped + new > limit:
            cand = [
                h
                for r in list(s.starts)
                for h in s.idle_handles_in(r, s.lens[r])
                if not (h < a + n and h + s.handles[h] > a)
            ]
            cand.sort(key=lambda h: -s.handles[h])
            moved = 0
            for h in cand:
                if new <= 0 or s.mapped + new <= limit:
                    break
                hl = s.handles[h]
                if g1 is not None and g0 + hl > g1:
                    continue
                s.unmap_handle(h)
                s.map_handle(g0, hl)
                g0 += hl
                new -= hl
                s.calls += 2
                moved += 1
            s.nmoves += moved
            s.calls += 1 if moved else 0
        if new > 0:
            size = rup(new, s.page) if g1 is None else min(rup(new, s.page), g1 - g0)
            s.map_handle(g0, size)
            s.calls += 3
        s.take(a, n)
        return a


def run(ev, moves, aware, align):
    pools = (Pool(2 * MIB, False, 0), Pool(20 * MIB, moves, aware, align))
    where, live, peak_live, peak, half_calls = {}, 0, 0, 0, 0
    for i, (k, addr, size) in enumerate(ev):
        if i == len(ev) // 2:
            half_calls = sum(p.calls for p in pools)
        if k:
            n = rup(max(size, 1), 512)
            p = pools[n > MIB]
            live += size
            peak_live = max(peak_live, live)
            where[addr] = (p, p.alloc(n, peak_live), n, size)
            peak = max(peak, pools[0].mapped + pools[1].mapped)
        else:
            p, a, n, size = where.pop(addr)
            live -= size
            p.add_free(a, n)
    calls = sum(p.calls for p in pools)
    return peak / peak_live, calls - half_calls, pools[1].nmoves


CONFIGS = [
    ("baseline", False, 0, 0),
    ("moves", True, 0, 0),
    ("moves+aware>=256MiB", True, 256 * MIB, 0),
    ("moves+aware>=1GiB", True, 1024 * MIB, 0),
    ("aware>=256MiB", False, 256 * MIB, 0),
    ("align>=256MiB", False, 0, 256 * MIB),
    ("moves+aware+align>=64MiB", True, 64 * MIB, 64 * MIB),
]

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("| trace | " + " | ".join(c[0] for c in CONFIGS) + " |")
    print("|---" * (len(CONFIGS) + 1) + "|")
    for path in sys.argv[1:]:
        ev = load(path)
        cells = []
        for _, moves, aware, align in CONFIGS:
            ratio, calls2, nmoves = run(ev, moves, aware, align)
            cells.append(f"{ratio:.4f}, {calls2} calls, {nmoves} moved")
        name = path.rsplit("/", 1)[-1].split(".")[0]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
