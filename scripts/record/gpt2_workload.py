"""GPT-2 training on the GPU, the one workload shared by torch-compare.py (its `gpt2` and
`soak` workloads), torch-alloc-bench.py (`step`, and `compare` through torch-compare.py),
record-traces.py (`gpt2_eval`) and record-preloaded.py (`trainer`). Models are built from
their configs (random weights: no download); torch and transformers are imported by the
caller / on first use, so importing this module costs nothing.

  SIZES      the two model shapes: `small` (GPT-2 small, 12 layers × 768) and `tiny` (2 × 256,
             a vocabulary of 8,192: torch-compare.py's soak)
  model()    (config, model on `dev`)
  batch()    one batch of random token ids of shape (bs, seq), the labels being the ids
  trainer()  (config, model, AdamW optimizer, step): step(bs, seq) runs one training step
             (bf16 autocast, backward, optimizer step, gradients set to None) and returns the
             loss

record-traces.py runs model() and batch() through its own AdamW loop (the one of its other
workloads), so that the traces it records keep their exact allocation order.
"""

SIZES = {
    "small": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
    "tiny": dict(n_layer=2, n_embd=256, n_head=4, n_positions=256, vocab_size=8192),
}


def model(dev, size="small"):
    """GPT2LMHeadModel of SIZES[size], random weights, on `dev`: returns (config, model)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(**SIZES[size])
    return cfg, GPT2LMHeadModel(cfg).to(dev)


def batch(torch, cfg, bs, seq, dev):
    """Random token ids of shape (bs, seq) on `dev`, as model inputs and labels."""
    ids = torch.randint(0, cfg.vocab_size, (bs, seq), device=dev)
    return {"input_ids": ids, "labels": ids}


def trainer(torch, dev, size="small"):
    """(config, model, optimizer, step) for training GPT-2 of SIZES[size] with AdamW
    (lr 1e-4); step(bs, seq) trains on one random batch and returns the loss tensor."""
    cfg, m = model(dev, size)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)

    def step(bs, seq):
        ids = torch.randint(0, cfg.vocab_size, (bs, seq), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return cfg, m, opt, step
