#!/usr/bin/env python3
"""Writes traces/multigpu/two_devices.jsonl: a synthetic data-parallel training trace on two
devices (gpumem JSON lines), for `gpumem replay --device all` on a 2-GPU machine.

Each device holds weights (allocated once), then runs steps: activations allocated forward
and freed backward, gradients per layer, an all-reduce bucket, and a few odd-sized
temporaries on a second stream. Device 1 runs the same model with a different batch share
(its activations are 3/4 of device 0's) and its own temporaries, so the two devices' pools
see different sizes. Deterministic (fixed seed)."""
import json
import random
import sys

rng = random.Random(15)
out = []
next_addr = {0: 1 << 20, 1: 1 << 40}
live = {0: [], 1: []}
t = 0


def alloc(dev, size, stream=0):
    global t
    a = next_addr[dev]
    next_addr[dev] += 1 << 12 if size < 1 << 12 else (size + 4095) // 4096 * 4096
    t += rng.randint(1, 40)
    e = {"action": "alloc", "addr": a, "size": size, "device": dev, "time_us": t}
    if stream:
        e["stream"] = stream
    out.append(e)
    return a


def free(dev, a):
    global t
    t += rng.randint(1, 40)
    out.append({"action": "free", "addr": a, "device": dev, "time_us": t})


layers = [rng.choice([4, 8, 16, 32]) << 20 for _ in range(12)]
weights = {d: [alloc(d, w) for w in layers] for d in (0, 1)}
for step in range(40):
    for dev in (0, 1):
        share = 4 if dev == 0 else 3
        acts = []
        for w in layers:
            acts.append(alloc(dev, w // 4 * share + rng.randint(0, 4095)))
            if rng.random() < 0.5:
                tmp = alloc(dev, rng.randint(512, 600_000), stream=7)
                free(dev, tmp)
        grads = []
        for w, a in zip(reversed(layers), reversed(acts)):
            grads.append(alloc(dev, w))
            free(dev, a)
        bucket = alloc(dev, 25 << 20)
        for g in grads:
            free(dev, g)
        free(dev, bucket)
for dev in (0, 1):
    for a in weights[dev]:
        free(dev, a)
path = sys.argv[1] if len(sys.argv) > 1 else "traces/multigpu/two_devices.jsonl"
with open(path, "w") as f:
    for e in out:
        f.write(json.dumps(e, separators=(",", ":")) + "\n")
print(f"{path}: {len(out)} events")
