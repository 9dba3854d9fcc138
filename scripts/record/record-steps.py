#!/usr/bin/env python3
"""Record allocation traces of training loops whose steps repeat (GPU machine), with the
step boundaries in the snapshot, for planned allocation.

usage: scripts/record/record-steps.py OUTDIR [WORKLOAD ...]          (all workloads by default)
       scripts/record/record-steps.py --one WORKLOAD OUTDIR           (one run in this process; internal)

Each workload runs twice, each time in a process of its own: once under PyTorch's native
allocator, recording the snapshot (torch.cuda.memory._record_memory_history with
global_record_annotations=True, so every `record_function` range lands in the snapshot's
`external_annotations`), and once under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
for its memory_stats() only. Every training step runs inside
`torch.profiler.record_function(f"ProfilerStep#{i}")`, the name torch.profiler's schedule
gives a step. Written: OUTDIR/<w>.pickle.gz (Python frames dropped when the file would
exceed 4 MB), OUTDIR/<w>-native.stats.json and OUTDIR/<w>-expandable_segments_True.stats.json.
Runs are seeded: the two processes see the same shapes. Models are built from their configs
(random weights: no download).

Fixed shapes (every step after the first allocates the same sizes in the same order):
  lm_ckpt        a 6-layer GPT-2 (768 wide), activation checkpointing, AdamW, bf16 autocast,
                 batch 8 × 1024, 40 steps
  lm_accum       the same model without checkpointing, 4 micro-batches of 4 × 512 a step
                 (gradient accumulation), 30 steps
  vit_amp        torchvision ViT-B/16 at 224 × 224, batch 64, fp16 autocast with a GradScaler,
                 SGD with momentum, 30 steps
  t5_fixed       T5 (6 + 6 layers, 512 wide), AdamW, bf16 autocast, batch 16, source 256 /
                 target 64 tokens, 40 steps
  prefetch_side  ResNet-50 training, batch 64 at 224 × 224, each step's batch made one step
                 ahead on a side stream (record_stream on the compute stream), SGD, 40 steps
Bucketed shapes (a random length each step, padded up to a multiple of 64: at most 16 shapes):
  lm_bucketed    a 4-layer GPT-2 (512 wide), AdamW, bf16, batch 8, length 1..1024 → 64·⌈l/64⌉,
                 240 steps
  bert_bucketed  BERT (6 layers, 768 wide) sequence classification, AdamW, fp32, batch 16,
                 length 16..512 → 64·⌈l/64⌉ (8 shapes), 200 steps
"""
import gzip
import json
import os
import pickle
import random
import subprocess
import sys
import time

STATS = ["allocated_bytes.all.peak", "reserved_bytes.all.peak", "active_bytes.all.peak",
         "requested_bytes.all.peak", "inactive_split_bytes.all.peak", "segment.all.peak",
         "num_alloc_retries", "num_ooms", "allocation.all.allocated", "num_device_alloc",
         "num_device_free", "segment.all.allocated"]


def gpt2(torch, dev, n_layer, n_embd, n_head, n_positions):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions)
    return cfg, GPT2LMHeadModel(cfg).to(dev)


def steps(torch, n, body):
    """Runs body(i) for each step inside a ProfilerStep#i range; returns the first loss."""
    first = None
    for i in range(n):
        with torch.profiler.record_function(f"ProfilerStep#{i}"):
            loss = body(i)
        if first is None:
            first = float(loss)
    return first


def train_step(torch, m, opt, autocast, **inputs):
    """One step of a Hugging Face model: the forward (bf16 autocast when `autocast`), the
    backward, the optimizer step, gradients set to None; returns the loss, detached."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = m(**inputs).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.detach()


def lm_ckpt(torch, dev):
    cfg, m = gpt2(torch, dev, 6, 768, 12, 1024)
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.config.use_cache = False
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        ids = torch.randint(0, cfg.vocab_size, (8, 1024), device=dev)
        return train_step(torch, m, opt, True, input_ids=ids, labels=ids)
    return steps(torch, 40, body)


def lm_accum(torch, dev):
    cfg, m = gpt2(torch, dev, 6, 768, 12, 1024)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        total = 0.0
        for _ in range(4):
            ids = torch.randint(0, cfg.vocab_size, (4, 512), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=ids, labels=ids).loss / 4
            loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total
    return steps(torch, 30, body)


def vit_amp(torch, dev):
    import torchvision
    m = torchvision.models.vit_b_16().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda")

    def body(i):
        x = torch.randn(64, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (64,), device=dev)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    return steps(torch, 30, body)


def t5_fixed(torch, dev):
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(d_model=512, num_layers=6, num_heads=8, d_ff=2048, decoder_start_token_id=0,
                   pad_token_id=0)
    m = T5ForConditionalGeneration(cfg).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        src = torch.randint(0, cfg.vocab_size, (16, 256), device=dev)
        tgt = torch.randint(0, cfg.vocab_size, (16, 64), device=dev)
        return train_step(torch, m, opt, True, input_ids=src, labels=tgt)
    return steps(torch, 40, body)


def prefetch_side(torch, dev):
    import torchvision
    m = torchvision.models.resnet50().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()

    def make():
        with torch.cuda.stream(side):
            return (torch.randn(64, 3, 224, 224, device=dev),
                    torch.randint(0, 1000, (64,), device=dev))
    nxt = [make()]

    def body(i):
        main.wait_stream(side)
        x, y = nxt[0]
        x.record_stream(main)
        y.record_stream(main)
        nxt[0] = make()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    first = steps(torch, 40, body)
    torch.cuda.synchronize()
    return first


def bucket(n):
    return 64 * ((n + 63) // 64)


def lm_bucketed(torch, dev):
    cfg, m = gpt2(torch, dev, 4, 512, 8, 1024)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        seq = bucket(random.randint(1, 1024))
        ids = torch.randint(0, cfg.vocab_size, (8, seq), device=dev)
        return train_step(torch, m, opt, True, input_ids=ids, labels=ids)
    return steps(torch, 240, body)


def bert_bucketed(torch, dev):
    from transformers import BertConfig, BertForSequenceClassification
    m = BertForSequenceClassification(BertConfig(num_hidden_layers=6, num_labels=2)).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def body(i):
        seq = bucket(random.randint(16, 512))
        ids = torch.randint(0, 30522, (16, seq), device=dev)
        labels = torch.randint(0, 2, (16,), device=dev)
        return train_step(torch, m, opt, False, input_ids=ids, labels=labels)
    return steps(torch, 200, body)


WORKLOADS = {f.__name__: f for f in [lm_ckpt, lm_accum, vit_amp, t5_fixed, prefetch_side,
                                     lm_bucketed, bert_bucketed]}


NO_FRAMES = {"lm_ckpt"}


def strip_frames(snap):
    for dev in snap.get("device_traces", []):
        for e in dev:
            e.pop("frames", None)
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            b.pop("frames", None)


def one(name, out):
    import torch
    dev = torch.device("cuda")
    torch.manual_seed(0)
    random.seed(0)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "native"
    record = conf == "native"
    if record:
        # PyTorch 2.11 fails the backward pass of activation checkpointing while it captures
        # Python stacks for the memory history (pytorch#179536): lm_ckpt records no frames.
        context = None if name in NO_FRAMES else "all"
        torch.cuda.memory._record_memory_history(max_entries=4_000_000, context=context,
                                                 global_record_annotations=True)
    t0 = time.time()
    first = WORKLOADS[name](torch, dev)
    torch.cuda.synchronize()
    secs = time.time() - t0
    stats = torch.cuda.memory_stats()
    tag = conf.replace(":", "_")
    rec = {"workload": name, "conf": conf, "torch": torch.__version__,
           **{k: stats[k] for k in STATS}, "first_loss": first, "seconds": round(secs, 2)}
    with open(os.path.join(out, f"{name}-{tag}.stats.json"), "w") as f:
        json.dump(rec, f)
    if record:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        data = pickle.dumps(snap)
        if len(gzip.compress(data, 6)) > 4_000_000:
            strip_frames(snap)
            data = pickle.dumps(snap)
        with gzip.open(os.path.join(out, name + ".pickle.gz"), "wb", 9) as g:
            g.write(data)
        n = sum(len(d) for d in snap["device_traces"])
        ann = len(snap.get("external_annotations", []))
        print(f"{name}: {n} events, {ann} annotations", flush=True)
    print(f"{name} [{conf}]: {secs:.1f} s, reserved peak {stats['reserved_bytes.all.peak']/2**30:.3f} GiB,"
          f" requested peak {stats['requested_bytes.all.peak']/2**30:.3f} GiB, first loss {first!r}",
          flush=True)


def main():
    if sys.argv[1] == "--one":
        return one(sys.argv[2], sys.argv[3])
    out, names = sys.argv[1], sys.argv[2:] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        sys.exit(f"unknown workload {unknown}; known: {', '.join(WORKLOADS)}")
    os.makedirs(out, exist_ok=True)
    failed = 0
    for name in names:
        for conf in ["", "expandable_segments:True"]:
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
            r = subprocess.run([sys.executable, __file__, "--one", name, out], env=env)
            if r.returncode:
                print(f"{name} [{conf or 'native'}]: failed ({r.returncode})", flush=True)
                failed += 1
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
