#!/usr/bin/env bash
# run.sh — builds gpumem's baseline programs with nvcc and runs them on the GPU, so that
# gpumem's benchmarks and the baselines they are compared against are measured in the same
# run on the same machine (scripts/gpu-check.sh does this in its `baselines` step).
#
#   scripts/bench/baselines/run.sh OUT.jsonl [OUT.md]
#
# Programs (sources here; each prints JSON lines, see the comment at the top of each):
#   alloc_costs.cu     cudaMalloc/cudaFree, cuMemAlloc/cuMemFree, cudaMallocAsync/cudaFreeAsync
#   vmm_costs.cu       cuMemAddressReserve .. cuMemAddressFree by size, isolated and with 8 GiB mapped
#   host_transfers.cu  cudaHostAlloc, cudaHostRegister, pageable/pinned/write-combined/mapped copies
#   c10_alloc.cpp      PyTorch's caching allocator from C++ (only when python3 can import torch)
# Needs nvcc (CUDA 12 or 13) and the driver; no network. NVCC_ARCH overrides the target
# (default sm_90, the H100/H200). The table (OUT.md, default next to OUT.jsonl) is made by
# table.py; a program that fails to build or run is reported and the others still run.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run.sh OUT.jsonl [OUT.md]}
md=${2:-${out%.jsonl}.md}
: >"$out"
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13*/bin /usr/local/cuda-12*/bin /opt/cuda/bin; do
    [ -x "$d/nvcc" ] && PATH="$d:$PATH" && break
  done
fi
command -v nvcc >/dev/null || { echo "nvcc not found (PATH, /usr/local/cuda*/bin): baselines not built"; exit 2; }
arch=${NVCC_ARCH:-sm_90}
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
rc=0
echo "== nvcc $(nvcc --version | tail -1)"
for prog in alloc_costs vmm_costs host_transfers; do
  if nvcc -O2 -std=c++17 -arch="$arch" -I"$here" -o "$build/$prog" "$here/$prog.cu" -lcuda 2>"$build/$prog.err"; then
    echo "== $prog"
    "$build/$prog" | tee -a "$out" || { echo "== $prog failed"; rc=1; }
  else
    echo "== $prog: build failed"; cat "$build/$prog.err"; rc=1
  fi
done
torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)
if [ -n "$torch_dir" ]; then
  cuda_inc=$(dirname "$(dirname "$(command -v nvcc)")")/include
  abi=$(python3 -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
  if g++ -O2 -std=c++17 -D_GLIBCXX_USE_CXX11_ABI="$abi" -o "$build/c10_alloc" "$here/c10_alloc.cpp" \
      -I"$torch_dir/include" -I"$cuda_inc" -L"$torch_dir/lib" -lc10 -lc10_cuda \
      -Wl,-rpath,"$torch_dir/lib" 2>"$build/c10.err"; then
    echo "== c10_alloc (PyTorch $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null))"
    "$build/c10_alloc" | tee -a "$out" || { echo "== c10_alloc failed"; rc=1; }
  else
    echo "== c10_alloc: build failed"; head -20 "$build/c10.err"; rc=1
  fi
else
  echo "== c10_alloc: skipped (python3 cannot import torch)"
fi
if command -v python3 >/dev/null; then
  python3 "$here/table.py" "$out" >"$md" && echo "== table in $md" && cat "$md"
fi
exit $rc
