#!/usr/bin/env bash
# heldout-settings.sh — record held-out workloads under other PYTORCH_CUDA_ALLOC_CONF settings
# (GPU machine), to check the torch emulation's options on traces it was never tuned on.
#
# usage: [HELDOUT_CONFS=$'conf\nconf'] scripts/bench/heldout-settings.sh OUTDIR [WORKLOAD ...]
#        (default workloads: seg_train gan_train lstm_lm moe_train)
# Writes OUTDIR/settings.tar.gz holding <setting-tag>/<workload>.pickle.gz and .stats.json,
# one fresh Python process per setting. Replay each with
# `gpumem replay T -a torch` (the trace's own allocator_settings are used) and compare
# `peak_reserved_bytes` with the stats' `reserved_bytes.all.peak`.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUTDIR=${1:?usage: heldout-settings.sh OUTDIR [WORKLOAD ...]}
shift
WORKLOADS=("$@")
[ "${#WORKLOADS[@]}" -gt 0 ] || WORKLOADS=(seg_train gan_train lstm_lm moe_train)
mkdir -p "$OUTDIR/settings" || exit 1
# HELDOUT_CONFS: the settings, one per line (default: the four below).
CONFS=${HELDOUT_CONFS:-"max_split_size_mb:128
roundup_power2_divisions:4
expandable_segments:True,roundup_power2_divisions:[256:4,>:1]
max_split_size_mb:256,roundup_power2_divisions:[64:8,>:2]"}
while IFS= read -r conf; do
  [ -n "$conf" ] || continue
  tag=$(echo "$conf" | tr -c 'A-Za-z0-9_\n' '_')
  echo "== $conf"
  PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 240 python3 "$ROOT/scripts/record/record-traces.py" \
    "$OUTDIR/settings/$tag" "${WORKLOADS[@]}"
done <<<"$CONFS"
tar -C "$OUTDIR" -czf "$OUTDIR/settings.tar.gz" settings && rm -rf "$OUTDIR/settings"
