"""Writes a synthetic allocation trace in gpumem JSON lines, for sizing `gpumem report` on large
traces: N events (default 1,000,000), sizes from 512 B to 600 MiB, at most 800 live blocks,
frees mostly LIFO with 30 % random. Deterministic (seeded).
Usage: python3 scripts/bench/synth-trace.py OUT.jsonl [EVENTS]"""
import random
import sys

out_path = sys.argv[1]
events = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
random.seed(7)
live = []
addr = 1
sizes = [512, 4096, 65536, 1 << 20, 3 << 20, 8 << 20, 24 << 20, 64 << 20, 200 << 20]
with open(out_path, "w") as out:
    for _ in range(events):
        if live and (random.random() < 0.5 or len(live) > 800):
            i = random.randrange(len(live)) if random.random() < 0.3 else len(live) - 1
            out.write('{"action":"free","addr":%d}\n' % live.pop(i))
        else:
            s = random.choice(sizes) * random.randint(1, 3) + random.randrange(0, 512)
            out.write('{"action":"alloc","addr":%d,"size":%d}\n' % (addr, s))
            live.append(addr)
            addr += 1
