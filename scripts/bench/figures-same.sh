#!/usr/bin/env bash
# Replay figures of the torch emulation (native and expandable_segments) and paged-lazy on
# every shipped trace, as JSON without the timing fields; `record DIR` writes them,
# `check DIR` compares against DIR byte for byte. Used to show that a change moves no figure.
set -euo pipefail
mode=${1:?record|check}; dir=${2:?DIR}; bin=${GPUMEM:-./target/release/gpumem}
traces=(traces/*.pickle.gz traces/external/* traces/validation/*.pickle.gz)
strip='walk(if type == "object" then del(.events_per_second, .seconds, .cpu_seconds) else . end)'
run() { # out-name, args...
  local name=$1; shift
  "$bin" replay "$@" --json | jq -S "$strip" >"$tmp/$name.json"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for t in "${traces[@]}"; do
  b=$(basename "$t" .pickle.gz)
  run "$b" "$t" --allocator paged-lazy,torch
  run "$b-exp" "$t" --allocator paged-lazy,torch --torch-conf expandable_segments:True
done
# Under memory pressure (OOMs, release of the cache, first mappings that fail) and with
# the smallest-capacity search, on the short traces.
for t in traces/mixed_sizes.pickle.gz traces/external/*; do
  b=$(basename "$t" .pickle.gz)
  run "$b-min" "$t" --allocator paged-lazy,torch --min-capacity
  run "$b-exp-min" "$t" --allocator paged-lazy,torch --torch-conf expandable_segments:True --min-capacity
  run "$b-exp-2g" "$t" --allocator paged-lazy,torch --torch-conf expandable_segments:True --capacity 2GiB
done
case $mode in
  record) mkdir -p "$dir"; cp "$tmp"/*.json "$dir"/; echo "recorded $(ls "$tmp" | wc -l) files in $dir" ;;
  check) diff -r "$dir" "$tmp" && echo "all $(ls "$tmp" | wc -l) figure files identical" ;;
  *) echo "record|check" >&2; exit 2 ;;
esac
