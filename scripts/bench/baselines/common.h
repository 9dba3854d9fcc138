// Shared helpers of gpumem's baseline programs: error checks, timing, medians, JSON lines.
//
// Every program prints one JSON object per line on stdout (what scripts/bench/baselines/run.sh
// collects and turns into a table); errors go to stderr and end the program with status 1.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#define RT_CHECK(x)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (x);                                                            \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x,           \
                   cudaGetErrorString(err_));                                          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

#define DRV_CHECK(x)                                                                   \
  do {                                                                                 \
    CUresult res_ = (x);                                                               \
    if (res_ != CUDA_SUCCESS) {                                                        \
      const char* name_ = "unknown";                                                   \
      cuGetErrorName(res_, &name_);                                                    \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, name_);   \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace baseline {

using Clock = std::chrono::steady_clock;

// Nanoseconds since `t0`.
inline double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// Median (upper median for an even count); NaN for no samples.
inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The sizes gpumem's `bench alloc` measures, in bytes.
inline std::vector<size_t> bench_alloc_sizes() {
  return {256, 4096, size_t(1) << 20, size_t(16) << 20, size_t(256) << 20, size_t(1) << 30};
}

// The mixed case of `gpumem bench alloc` (crates/gpumem/src/cuda/bench.rs, mixed_sizes):
// 1000 sizes, log-uniform between 1 KiB and 4 MiB, from the same xorshift generator, so that
// the two programs allocate exactly the same sizes for the same seed.
inline std::vector<size_t> mixed_sizes(uint64_t seed) {
  std::vector<size_t> out;
  uint64_t x = seed | 1;
  for (int i = 0; i < 1000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    double e = 10.0 + double(x % 12000) / 1000.0;
    uint64_t s = uint64_t(std::pow(2.0, e));
    s = std::min<uint64_t>(std::max<uint64_t>(s, 1 << 10), 4 << 20);
    out.push_back(size_t(s));
  }
  return out;
}

// The seed thread 0 of `gpumem bench alloc` uses for the mixed case.
constexpr uint64_t kMixedSeed = 0x9e3779b97f4a7c15ull;

// Device 0's name and cuMemGetInfo total/free, as the first line of every program.
inline void print_device(const char* program) {
  RT_CHECK(cudaSetDevice(0));
  RT_CHECK(cudaFree(nullptr));  // creates the primary context
  cudaDeviceProp p;
  RT_CHECK(cudaGetDeviceProperties(&p, 0));
  size_t free_b = 0, total_b = 0;
  RT_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int driver = 0, runtime = 0;
  RT_CHECK(cudaDriverGetVersion(&driver));
  RT_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf(
      "{\"program\":\"%s\",\"bench\":\"device\",\"name\":\"%s\",\"sms\":%d,"
      "\"mem_total_bytes\":%zu,\"mem_free_bytes\":%zu,\"driver_version\":%d,"
      "\"runtime_version\":%d}\n",
      program, p.name, p.multiProcessorCount, total_b, free_b, driver, runtime);
}

}  // namespace baseline
