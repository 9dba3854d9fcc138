#!/usr/bin/env python3
"""Two GPUs under gpumem's PyTorch plug-in (issue 15, item 5): a model trained on cuda:1, a
tensor moved cuda:0 -> cuda:1 -> cuda:0, every byte compared, and each device's gpumem pool
back to its starting allocated bytes once the tensors are gone (freed on the right pool).
The work is recorded as a gpumem trace (events carry their device) for
`gpumem replay TRACE --device all --canary`.

Usage: torch-multigpu.py --lib libgpumem_torch.so [--trace two_gpus.jsonl]
Prints one JSON object on stdout; exit status 0 when every check passed (or with fewer
than two GPUs, printing "skipped: N device(s)"), 1 otherwise."""
import argparse
import gc
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path of libgpumem_torch.so")
    ap.add_argument("--trace", default=None, help="write the recorded trace here")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.lib)))
    import gpumem_torch  # noqa: E402  (beside the library in carry/torch)

    gpumem_torch.install("strategy=paged", lib=args.lib)
    import torch  # noqa: E402

    n = torch.cuda.device_count()
    out = {"devices": n, "checks": {}, "stats": {}}
    if n < 2:
        out["skipped"] = f"skipped: {n} device(s)"
        print(json.dumps(out))
        return 0
    checks = out["checks"]

    def allocated(d):
        return gpumem_torch.memory_stats(d)["allocated_bytes.all.current"]

    # Touch both devices once so their pools exist, then take the starting figures.
    for d in (0, 1):
        torch.empty(1, device=f"cuda:{d}")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    start = {d: allocated(d) for d in (0, 1)}

    def work():
        torch.manual_seed(15)
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)
        ).to("cuda:1")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(256, 1024, device="cuda:1")
        for _ in range(5):
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        checks["model_on_cuda1_loss_finite"] = bool(torch.isfinite(loss).item())
        checks["model_params_on_cuda1"] = all(p.device == torch.device("cuda:1") for p in model.parameters())
        held1 = allocated(1)
        checks["cuda1_pool_holds_the_model"] = held1 > start[1]
        # A tensor moved between the devices, byte for byte (compared as int32 words).
        a = torch.randint(-(2**31), 2**31 - 1, (64 << 20,), dtype=torch.int32, device="cuda:0")
        b = a.to("cuda:1")
        c = b.to("cuda:0")
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        checks["moved_0_to_1_exact"] = bool(torch.equal(b.cpu(), a.cpu()))
        checks["moved_back_exact"] = bool(torch.equal(c, a))
        checks["cuda0_pool_holds_the_tensors"] = allocated(0) >= start[0] + 2 * a.numel() * 4
        checks["cuda1_pool_holds_the_copy"] = allocated(1) >= held1 + b.numel() * 4
        out["stats"]["while_held"] = {d: allocated(d) for d in (0, 1)}
        del model, opt, x, loss, a, b, c

    # Once unrecorded: PyTorch keeps some memory for the rest of the process on first use
    # (cuBLAS workspaces); the starting figures are taken after it.
    work()
    gc.collect()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    start.update({d: allocated(d) for d in (0, 1)})
    checks.clear()
    if args.trace:
        with gpumem_torch.record(args.trace):
            work()
    else:
        work()
    gc.collect()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    end = {d: allocated(d) for d in (0, 1)}
    out["stats"]["start"] = start
    out["stats"]["end"] = end
    for d in (0, 1):
        checks[f"cuda{d}_pool_back_to_start"] = end[d] == start[d]
    out["ok"] = all(checks.values())
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
