#!/usr/bin/env bash
# figures-same.sh record|check DIR: every figure the trace commands print, on every trace
# under traces/, as files to compare byte for byte before and after a change that must move
# no figure (a refactor). Per trace: `replay -a all --json`, `replay -a paged-lazy --lazy-conf
# placement=pages --json`, `tune --json` and `tune --json --capacity 8GiB`, each with its stderr;
# on the short traces (mixed_sizes, external/) also `replay -a all` with --min-capacity and with
# --capacity 2GiB. Timing fields are dropped (events/s, seconds); modelled driver time stays
# (it is deterministic). `record DIR` writes them; `check DIR` compares against DIR.
# GPUMEM=path picks the binary (default target/release/gpumem). ~1 min on 2 cores.
set -euo pipefail
mode=${1:?record|check}; dir=$(realpath -m "${2:?DIR}"); bin=$(realpath -m "${GPUMEM:-./target/release/gpumem}")
cd "$(dirname "$0")/../.."
strip='walk(if type == "object" then del(.events_per_second, .seconds, .cpu_seconds, .wall_seconds, .replay_seconds, .elapsed_seconds) else . end)'
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
mapfile -t traces < <(find traces -type f \( -name '*.pickle.gz' -o -name '*.jsonl' \) | sort)
for t in "${traces[@]}"; do
  b=$(echo "$t" | sed 's#^traces/##; s#/#__#g; s#\.pickle\.gz$##; s#\.jsonl$##')
  "$bin" replay "$t" -a all --json 2>"$out/$b.replay.err" | jq -S "$strip" >"$out/$b.replay.json"
  "$bin" replay "$t" -a paged-lazy --lazy-conf placement=pages --json 2>"$out/$b.pages.err" | jq -S "$strip" >"$out/$b.pages.json"
  "$bin" tune "$t" --json 2>"$out/$b.tune.err" | jq -S "$strip" >"$out/$b.tune.json"
  "$bin" tune "$t" --json --capacity 8GiB 2>"$out/$b.tune8.err" | jq -S "$strip" >"$out/$b.tune8.json"
done
for t in traces/mixed_sizes.pickle.gz traces/external/*.pickle.gz; do
  b=$(basename "$t" .pickle.gz)
  "$bin" replay "$t" -a all --min-capacity --json 2>/dev/null | jq -S "$strip" >"$out/$b.min.json"
  "$bin" replay "$t" -a all --capacity 2GiB --json 2>/dev/null | jq -S "$strip" >"$out/$b.cap2g.json"
done
case $mode in
  record) mkdir -p "$dir"; cp "$out"/* "$dir"/; echo "recorded $(ls "$out" | wc -l) files in $dir" ;;
  check) diff -r "$dir" "$out" && echo "all $(ls "$out" | wc -l) figure files identical" ;;
  *) echo "record|check" >&2; exit 2 ;;
esac
