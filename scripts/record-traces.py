#!/usr/bin/env python3
"""Record real allocation traces of PyTorch workloads (GPU machine): a validation set for
allocator policies, other than the traces shipped in traces/.

usage: record-traces.py OUTDIR [WORKLOAD ...]

Each workload runs in this process after torch.cuda.empty_cache() and a fresh
torch.cuda.memory._record_memory_history(max_entries=2,000,000), and its snapshot
(torch.cuda.memory._dump_snapshot) is written gzip'd to OUTDIR/<workload>.pickle.gz, with
torch.cuda.memory_stats() of the run in OUTDIR/<workload>.stats.json. Workloads are seeded
(the same shapes on every run). Models are built from their configs (random weights: no
download). Workloads:
  bert_finetune    BERT-base sequence classification, AdamW, fp32, batch 32 × 128, 30 steps
  t5_train         T5-small seq2seq, AdamW, bf16 autocast, 20 steps, random lengths 64–512
  vit_train        torchvision ViT-B/16, SGD, bf16 autocast, 15 steps, batch 32–96
  llama_accum      a 6-layer Llama, AdamW, bf16 autocast, 12 steps × 4 micro-batches of
                   random length 256–2048 (gradient accumulation)
  gpt2_eval        GPT-2 small, 16 fixed-shape steps, then an eval pass at 4 × the batch
                   (a late peak, like a validation loop)
  resnet_infer     ResNet-50 inference under no_grad, batch doubling 8 → 512, with
                   torch.cuda.empty_cache() after each size
"""
import gzip
import json
import os
import random
import shutil
import sys
import time

import torch

import gpt2_workload  # beside this script (scripts/gpt2_workload.py)

dev = torch.device("cuda")


def seed():
    torch.manual_seed(0)
    random.seed(0)


def adamw_steps(model, batches, steps, autocast=True):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        kwargs = batches()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**kwargs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def bert_finetune():
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(num_labels=2)).to(dev)

    def batch():
        ids = torch.randint(0, 30522, (32, 128), device=dev)
        return {"input_ids": ids, "labels": torch.randint(0, 2, (32,), device=dev)}

    adamw_steps(model, batch, 30, autocast=False)


def t5_train():
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        d_model=512, num_layers=6, num_heads=8, d_ff=2048, decoder_start_token_id=0, pad_token_id=0
    )
    model = T5ForConditionalGeneration(cfg).to(dev)

    def batch():
        bs = random.choice([8, 16, 32])
        src, tgt = random.choice([64, 128, 256, 512]), random.choice([32, 64, 128])
        return {
            "input_ids": torch.randint(0, cfg.vocab_size, (bs, src), device=dev),
            "labels": torch.randint(0, cfg.vocab_size, (bs, tgt), device=dev),
        }

    adamw_steps(model, batch, 20)


def vit_train():
    import torchvision

    model = torchvision.models.vit_b_16().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(15):
        bs = random.choice([32, 64, 96])
        x = torch.randn(bs, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (bs,), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def llama_accum():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(12):
        for _ in range(4):
            seq = random.choice([256, 512, 1024, 2048])
            ids = torch.randint(0, cfg.vocab_size, (4, seq), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss / 4
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def gpt2_eval():
    cfg, model = gpt2_workload.model(dev)
    adamw_steps(model, lambda: gpt2_workload.batch(torch, cfg, 8, 512, dev), 16)
    model.eval()
    with torch.no_grad():
        for _ in range(4):
            ids = torch.randint(0, cfg.vocab_size, (32, 1024), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                model(input_ids=ids, labels=ids)


def resnet_infer():
    import torchvision

    model = torchvision.models.resnet50().to(dev).eval()
    with torch.no_grad():
        bs = 8
        while bs <= 512:
            for _ in range(3):
                x = torch.randn(bs, 3, 224, 224, device=dev)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    model(x)
            torch.cuda.empty_cache()
            bs *= 2


WORKLOADS = {
    f.__name__: f
    for f in [bert_finetune, t5_train, vit_train, llama_accum, gpt2_eval, resnet_infer]
}


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or list(WORKLOADS)
    os.makedirs(out, exist_ok=True)
    for name in names:
        seed()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        t0 = time.time()
        WORKLOADS[name]()
        torch.cuda.synchronize()
        raw = os.path.join(out, name + ".pickle")
        torch.cuda.memory._dump_snapshot(raw)
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        os.remove(raw)
        stats = torch.cuda.memory_stats()
        with open(os.path.join(out, name + ".stats.json"), "w") as f:
            json.dump(
                {
                    k: stats[k]
                    for k in [
                        "reserved_bytes.all.peak",
                        "requested_bytes.all.peak",
                        "allocated_bytes.all.peak",
                        "num_alloc_retries",
                    ]
                },
                f,
            )
        print(
            f"{name}: {time.time() - t0:.1f} s, reserved peak "
            f"{stats['reserved_bytes.all.peak'] / 2**30:.2f} GiB, requested peak "
            f"{stats['requested_bytes.all.peak'] / 2**30:.2f} GiB",
            flush=True,
        )
        # The next workload starts from a clean pool.
        import gc

        gc.collect()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
