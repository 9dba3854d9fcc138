#!/usr/bin/env bash
# heldout-check.sh — check gpumem on workloads it was never tuned on (GPU machine).
#
# usage (device machine, repository root, after `scripts/gpu-check.sh build` here):
#   scripts/bench/heldout-check.sh [OUTDIR]        (default: $OUT, else carry/out)
#
# 1. Records the held-out traces of scripts/record/record-traces.py (moe_train, gpt2_generate,
#    seg_train, lstm_lm, gan_train) into OUTDIR/heldout/, with PyTorch's own
#    memory_stats() of each run. They are not shipped: bring them back, then replay them here
#    (`python3 scripts/bench/validate-targets.py OUTDIR/heldout/*.pickle.gz`, `gpumem replay`).
# 2. Replays each with --device cuda --canary --allocator paged-lazy,torch (real driver calls,
#    canary bytes checked) into OUTDIR/heldout-replay.jsonl.
# 3. Runs scripts/bench/torch-compare.py on the held-out plug-in workloads (moe, seg): native,
#    expandable_segments and gpumem's paged-lazy, one round, into OUTDIR/heldout-torch/.
# Everything is packed into OUTDIR/heldout.tar.gz last.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${1:-${OUT:-$ROOT/carry/out}}
GPUMEM=$ROOT/carry/gpumem
mkdir -p "$OUTDIR/heldout" || exit 1
[ -x "$GPUMEM" ] || { echo "heldout-check: $GPUMEM missing (run scripts/gpu-check.sh build first)" >&2; exit 1; }

echo "== record held-out traces"
timeout 300 python3 "$ROOT/scripts/record/record-traces.py" "$OUTDIR/heldout" held-out

echo "== replay on the GPU (paged-lazy, torch; canary)"
: >"$OUTDIR/heldout-replay.jsonl"
for t in "$OUTDIR"/heldout/*.pickle.gz; do
  [ -f "$t" ] || continue
  if timeout 120 "$GPUMEM" replay "$t" --device cuda --canary --allocator paged-lazy,torch \
    --json --no-plan >"$OUTDIR/one.json" 2>"$OUTDIR/one.err"; then
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["file"]=sys.argv[2]; print(json.dumps(d))' \
      "$OUTDIR/one.json" "$(basename "$t")" >>"$OUTDIR/heldout-replay.jsonl"
    echo "   $(basename "$t"): ok"
  else
    echo "   $(basename "$t"): FAILED: $(tail -3 "$OUTDIR/one.err")"
  fi
done
rm -f "$OUTDIR/one.json" "$OUTDIR/one.err"

echo "== PyTorch with the plug-in on held-out workloads"
timeout 300 python3 "$ROOT/scripts/bench/torch-compare.py" --lib "$ROOT/carry/torch/libgpumem_torch.so" \
  --out "$OUTDIR/heldout-torch" --workloads moe,seg --configs native,expandable,lazy \
  --warmup 3 --steps 12 --budget-s 280
cat "$OUTDIR/heldout-torch/compare.md" 2>/dev/null
# The device tool brings back few files: one archive of everything.
tar -C "$OUTDIR" -czf "$OUTDIR/heldout.tar.gz" heldout heldout-replay.jsonl heldout-torch &&
  rm -rf "$OUTDIR/heldout" "$OUTDIR/heldout-torch" "$OUTDIR/heldout-replay.jsonl"
