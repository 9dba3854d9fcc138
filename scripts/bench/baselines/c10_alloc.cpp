// PyTorch's CUDA caching allocator called from C++ (no Python), the baseline BENCHMARKS.md
// quotes beside `gpumem bench alloc`: c10::cuda::CUDACachingAllocator::raw_alloc +
// raw_delete of one size, warm (the block comes from the allocator's cache).
//
// Method: 1000 untimed pairs, then batches of 1000 pairs timed with steady_clock; the
// figure is the median batch divided by 1000 (the same batching as gpumem's pools, whose
// pairs also take tens of nanoseconds). Mixed: bench alloc's 1000 mixed sizes allocated,
// then freed; one warm-up round, median of 3 rounds divided by 1000.
// Built by scripts/bench/baselines/run.sh against the installed PyTorch (skipped without one).
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

namespace {
using Clock = std::chrono::steady_clock;
namespace alloc = c10::cuda::CUDACachingAllocator;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// Same generator and seed as crates/gpumem/src/cuda/bench.rs (and common.h).
std::vector<size_t> mixed_sizes() {
  std::vector<size_t> out;
  uint64_t x = 0x9e3779b97f4a7c15ull | 1;
  for (int i = 0; i < 1000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double e = 10.0 + double(x % 12000) / 1000.0;
    uint64_t s = uint64_t(std::pow(2.0, e));
    out.push_back(size_t(std::min<uint64_t>(std::max<uint64_t>(s, 1 << 10), 4 << 20)));
  }
  return out;
}
}  // namespace

int main() {
  alloc::init(c10::cuda::device_count());
  const size_t sizes[] = {256, 4096, size_t(1) << 20, size_t(16) << 20, size_t(256) << 20,
                          size_t(1) << 30};
  for (size_t s : sizes) {
    for (int i = 0; i < 1000; i++) alloc::raw_delete(alloc::raw_alloc(s));
    std::vector<double> batches;
    for (int b = 0; b < 50; b++) {
      auto t0 = Clock::now();
      for (int i = 0; i < 1000; i++) alloc::raw_delete(alloc::raw_alloc(s));
      batches.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                        1000.0);
    }
    std::printf("{\"program\":\"c10_alloc\",\"bench\":\"c10 raw_alloc+raw_delete\",\"size\":%zu,"
                "\"pair_ns\":%.1f}\n",
                s, median(batches));
    std::fflush(stdout);
  }
  const std::vector<size_t> mixed = mixed_sizes();
  std::vector<void*> live(mixed.size());
  std::vector<double> rounds;
  for (int r = 0; r < 4; r++) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < mixed.size(); i++) live[i] = alloc::raw_alloc(mixed[i]);
    for (void* p : live) alloc::raw_delete(p);
    double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                double(mixed.size());
    if (r > 0) rounds.push_back(ns);
  }
  std::printf("{\"program\":\"c10_alloc\",\"bench\":\"c10 raw_alloc+raw_delete\",\"size\":\"mixed\","
              "\"pair_ns\":%.1f}\n",
              median(rounds));
  return 0;
}
