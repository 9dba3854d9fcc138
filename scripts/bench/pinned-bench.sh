#!/usr/bin/env bash
# Pinned host memory measurements on a GPU machine; needs no Rust there, only binaries built
# elsewhere (cudarc loads libcuda at run time).
#
#   scripts/bench/pinned-bench.sh [GPUMEM_BINARY] [OUT_DIR]
#
# Optional: PINNED_CUDA_TESTS=path/to/pinned_cuda-<hash> (from
# `cargo test --release -p gpumem --test pinned_cuda --no-run`) runs the ignored CUDA tests.
# Writes transfer.json, transfer.svg, pinned.json, advise.txt, tests.txt (and the cached table
# under cache/gpumem/) into OUT_DIR.
set -uo pipefail
BIN=${1:-./gpumem}
DEST=${2:-${OUT:-./pinned-out}}
mkdir -p "$DEST"
export XDG_CACHE_HOME="$DEST/cache"
rc=0
"$BIN" bench transfer --staging-sweep --overlap --json --plot "$DEST/transfer.svg" \
    >"$DEST/transfer.json" || rc=1
"$BIN" bench pinned --json >"$DEST/pinned.json" || rc=1
{
    for args in "--size 4KiB --per-second 10000 --async" "--size 64MiB --per-second 100" \
        "--size 256MiB --per-second 10" "--size 1GiB" "--size 1GiB --direction d2h"; do
        echo "## gpumem advise $args"
        # shellcheck disable=SC2086
        "$BIN" advise $args || rc=1
    done
} >"$DEST/advise.txt" 2>&1
if [ -n "${PINNED_CUDA_TESTS:-}" ]; then
    "$PINNED_CUDA_TESTS" --ignored --test-threads 1 >"$DEST/tests.txt" 2>&1 || rc=1
fi
exit $rc
