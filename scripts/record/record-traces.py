#!/usr/bin/env python3
"""Record real allocation traces of PyTorch workloads (GPU machine): a validation set for
allocator policies, other than the traces shipped in traces/.

usage: record-traces.py OUTDIR [WORKLOAD ... | held-out]

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
Held out (named only, not recorded by default: a policy tuned on the traces in the
repository can be checked on workloads it has never seen; `held-out` names them all). Some
of their recordings now ship as regression tests of the torch emulation
(traces/warm_process/, traces/settings/, traces/limits/); new recordings are new checks:
  moe_train        a 4-layer Mixtral (8 experts, top-2 routing: per-expert token counts
                   vary every step), AdamW, bf16 autocast, 15 steps, random length 128–1024
  gpt2_generate    GPT-2 small generate() with a growing KV cache, greedy, 128 new tokens,
                   batch 1 / 8 / 32 and prompts of 32–256 tokens, no empty_cache
  seg_train        torchvision FCN-ResNet50 segmentation, SGD, bf16 autocast, 12 steps,
                   batch 4–8 of random image sizes 256–512
  lstm_lm          a 2-layer LSTM language model (cuDNN), packed sequences of random
                   lengths, Adam, fp32, 30 steps
  gan_train        a DCGAN generator and discriminator trained in turn (two optimizers),
                   bf16 autocast, 25 steps, batch 64–256
  stream_prefetch  ResNet-18 training whose batches are made on a side stream one step
                   ahead (allocated on that stream, record_stream on the compute stream),
                   SGD, 20 steps, batch 32–128
  graph_infer      ResNet-18 inference captured in a CUDA graph (torch.cuda.graph: a private
                   memory pool), replayed 20 times, with eager inference at other batch sizes
                   between
"""
import gzip
import json
import os
import random
import shutil
import sys
import time

import torch

import gpt2_workload  # beside this script (scripts/record/gpt2_workload.py)
import heldout_models  # beside this script (scripts/record/heldout_models.py)

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


def moe_train():
    cfg, model = heldout_models.mixtral(dev)

    def batch():
        seq = random.choice([128, 256, 512, 1024])
        ids = torch.randint(0, cfg.vocab_size, (8, seq), device=dev)
        return {"input_ids": ids, "labels": ids}

    adamw_steps(model, batch, 15)


def gpt2_generate():
    cfg, model = gpt2_workload.model(dev)
    model.eval()
    with torch.no_grad():
        for bs in [1, 8, 32]:
            for _ in range(2):
                prompt = random.choice([32, 64, 128, 256])
                ids = torch.randint(0, cfg.vocab_size, (bs, prompt), device=dev)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=128,
                        min_new_tokens=128,
                        do_sample=False,
                        pad_token_id=0,
                    )


def seg_train():
    model = heldout_models.fcn(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(12):
        bs = random.choice([4, 6, 8])
        side = random.choice([256, 320, 384, 448, 512])
        x, y = heldout_models.fcn_batch(torch, bs, side, dev)
        loss = heldout_models.fcn_loss(torch, model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def lstm_lm():
    vocab, width = 16384, 1024
    emb = torch.nn.Embedding(vocab, width).to(dev)
    lstm = torch.nn.LSTM(width, width, num_layers=2, batch_first=True).to(dev)
    head = torch.nn.Linear(width, vocab).to(dev)
    params = [*emb.parameters(), *lstm.parameters(), *head.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    for _ in range(30):
        bs = random.choice([16, 32, 64])
        lengths = sorted((random.randint(16, 256) for _ in range(bs)), reverse=True)
        ids = torch.randint(0, vocab, (bs, lengths[0]), device=dev)
        packed = torch.nn.utils.rnn.pack_padded_sequence(
            emb(ids), torch.tensor(lengths), batch_first=True
        )
        out, _ = lstm(packed)
        logits = head(out.data)
        target = torch.nn.utils.rnn.pack_padded_sequence(
            ids, torch.tensor(lengths), batch_first=True
        ).data
        loss = torch.nn.functional.cross_entropy(logits, target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def gan_train():
    nn = torch.nn
    gen = nn.Sequential(
        nn.ConvTranspose2d(128, 512, 4, 1, 0), nn.BatchNorm2d(512), nn.ReLU(),
        nn.ConvTranspose2d(512, 256, 4, 2, 1), nn.BatchNorm2d(256), nn.ReLU(),
        nn.ConvTranspose2d(256, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.ReLU(),
        nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh(),
    ).to(dev)
    disc = nn.Sequential(
        nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2),
        nn.Conv2d(64, 128, 4, 2, 1), nn.BatchNorm2d(128), nn.LeakyReLU(0.2),
        nn.Conv2d(128, 256, 4, 2, 1), nn.BatchNorm2d(256), nn.LeakyReLU(0.2),
        nn.Conv2d(256, 512, 4, 2, 1), nn.BatchNorm2d(512), nn.LeakyReLU(0.2),
        nn.Conv2d(512, 1, 4, 1, 0), nn.Flatten(),
    ).to(dev)
    og = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    od = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.functional.binary_cross_entropy_with_logits
    for _ in range(25):
        bs = random.choice([64, 128, 256])
        real = torch.randn(bs, 3, 64, 64, device=dev)
        z = torch.randn(bs, 128, 1, 1, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fake = gen(z)
            d_loss = bce(disc(real), torch.ones(bs, 1, device=dev)) + bce(
                disc(fake.detach()), torch.zeros(bs, 1, device=dev)
            )
        d_loss.backward()
        od.step()
        od.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            g_loss = bce(disc(fake), torch.ones(bs, 1, device=dev))
        g_loss.backward()
        og.step()
        og.zero_grad(set_to_none=True)
        od.zero_grad(set_to_none=True)


def stream_prefetch():
    import torchvision

    model = torchvision.models.resnet18().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()

    def make():
        bs = random.choice([32, 64, 128])
        with torch.cuda.stream(side):
            x = torch.randn(bs, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (bs,), device=dev)
        return x, y

    nxt = make()
    for _ in range(20):
        main.wait_stream(side)
        x, y = nxt
        x.record_stream(main)
        y.record_stream(main)
        nxt = make()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del x, y
    torch.cuda.synchronize()


def graph_infer():
    import torchvision

    model = torchvision.models.resnet18().to(dev).eval()
    static_x = torch.randn(64, 3, 224, 224, device=dev)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = model(static_x)
        for _ in range(20):
            static_x.copy_(torch.randn(64, 3, 224, 224, device=dev))
            g.replay()
            static_y.sum().item()
            bs = random.choice([16, 32, 128])
            model(torch.randn(bs, 3, 224, 224, device=dev))
    del g, static_y


WORKLOADS = {
    f.__name__: f
    for f in [bert_finetune, t5_train, vit_train, llama_accum, gpt2_eval, resnet_infer]
}
HELD_OUT = {
    f.__name__: f
    for f in [moe_train, gpt2_generate, seg_train, lstm_lm, gan_train, stream_prefetch, graph_infer]
}


def main():
    out = sys.argv[1]
    names = sys.argv[2:] or list(WORKLOADS)
    if names == ["held-out"]:
        names = list(HELD_OUT)
    unknown = [n for n in names if n not in WORKLOADS | HELD_OUT]
    if unknown:
        sys.exit(f"unknown workload {unknown}; known: {', '.join(WORKLOADS | HELD_OUT)}")
    os.makedirs(out, exist_ok=True)
    for name in names:
        seed()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        t0 = time.time()
        try:
            (WORKLOADS | HELD_OUT)[name]()
        except Exception as e:  # one broken workload must not cost the others' traces
            torch.cuda.memory._record_memory_history(enabled=None)
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
            continue
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
