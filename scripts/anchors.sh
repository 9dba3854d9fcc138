#!/usr/bin/env bash
# anchors.sh: build and run the anchor programs (the figures gpumem competes against) on the
# device machine, so that gpumem's benchmarks and the anchors are measured in the same run.
#
# The programs are not part of gpumem: `scripts/gpu-check.sh build` copies them from
# ../shared/anchors into the git-ignored carry/anchors/ when that folder exists.
#   scripts/anchors.sh CARRY_ANCHORS_DIR OUTFILE.jsonl
# Each program prints JSON lines; each line is prefixed by nothing and appended to OUTFILE.
set -u
dir=$1
out=$2
: >"$out"
[ -d "$dir" ] || { echo "no anchors in $dir (gpu-check build copies them from ../shared/anchors)"; exit 0; }
command -v nvcc >/dev/null || { echo "nvcc not found: anchors not run"; exit 0; }
tmp=$(mktemp -d)
rc=0
for prog in anchors staging; do
  [ -f "$dir/$prog.cu" ] || continue
  if nvcc -O2 -std=c++17 -arch=sm_90 -o "$tmp/$prog" "$dir/$prog.cu" -lcuda 2>"$tmp/$prog.err"; then
    echo "== $prog"
    "$tmp/$prog" | tee -a "$out" || rc=1
  else
    echo "== $prog: build failed"; cat "$tmp/$prog.err"; rc=1
  fi
done
if [ -f "$dir/c10bench.cpp" ]; then
  T=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
  CUDA_INC=$(dirname "$(dirname "$(command -v nvcc)")")/include
  abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
  if [ -n "$T" ] && g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI="$abi" -o "$tmp/c10bench" "$dir/c10bench.cpp" \
      -I"$T/include" -I"$CUDA_INC" -L"$T/lib" -lc10 -lc10_cuda -Wl,-rpath,"$T/lib" 2>"$tmp/c10.err"; then
    echo "== c10bench (PyTorch caching allocator from C++)"
    "$tmp/c10bench" | tee -a "$out" || rc=1
  else
    echo "== c10bench: build failed"; head -20 "$tmp/c10.err"; rc=1
  fi
fi
rm -rf "$tmp"
exit $rc
