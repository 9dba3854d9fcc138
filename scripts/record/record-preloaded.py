#!/usr/bin/env python3
"""Record the commonest kind of snapshot (GPU machine): GPT-2 small loaded and one training
step run *before* `_record_memory_history`, then 8 steps of random shape recorded.

usage: [PYTORCH_CUDA_ALLOC_CONF=...] record-preloaded.py OUTDIR TAG

Writes OUTDIR/gpt2_preloaded_TAG.pickle.gz and its torch.cuda.memory_stats() peaks (after
torch.cuda.reset_peak_memory_stats() at the start of recording) in
OUTDIR/gpt2_preloaded_TAG.stats.json. The snapshot starts with the segments of the weights,
the optimizer state and the cached blocks of the first step; traces/warm_process/ ships the
two recorded on the H200 (TAG native, and expandable under expandable_segments:True).
"""
import gzip
import json
import os
import random
import shutil
import sys

import torch

import gpt2_workload  # beside this script


def main():
    out, tag = sys.argv[1], sys.argv[2]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    random.seed(0)
    _, _, _, step = gpt2_workload.trainer(torch, dev)
    step(8, 512)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    for _ in range(8):
        step(random.choice([4, 8, 12]), random.choice([256, 512, 1024]))
    torch.cuda.synchronize()
    raw = os.path.join(out, f"gpt2_preloaded_{tag}.pickle")
    torch.cuda.memory._dump_snapshot(raw)
    with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    os.remove(raw)
    s = torch.cuda.memory_stats()
    keys = [
        "reserved_bytes.all.peak",
        "requested_bytes.all.peak",
        "allocated_bytes.all.peak",
        "num_alloc_retries",
    ]
    with open(os.path.join(out, f"gpt2_preloaded_{tag}.stats.json"), "w") as f:
        json.dump({k: s[k] for k in keys}, f)
    print(tag, s["reserved_bytes.all.peak"])


if __name__ == "__main__":
    main()
