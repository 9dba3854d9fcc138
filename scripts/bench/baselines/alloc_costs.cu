// Device allocation costs on the GPU, the baselines of `gpumem bench alloc`:
//   cudaMalloc / cudaFree (runtime API), cuMemAlloc / cuMemFree (driver API, the calls
//   gpumem's own Rust baseline makes), cudaMallocAsync / cudaFreeAsync on the default memory
//   pool with its release threshold at the maximum (memory kept between pairs).
//
// Method, for every size of `bench alloc` (256 B .. 1 GiB), and 4 and 16 GiB: each call is timed on its own
// with steady_clock on the host; a pair's figure is the median allocation plus the median
// free (200 pairs below 256 MiB, 20 from 256 MiB, 10 from 4 GiB; async: 2000 pairs, the stream synchronized
// once at the end). The mixed case allocates bench alloc's 1000 mixed sizes (1 KiB .. 4 MiB,
// same generator and seed), then frees them all; one warm-up round, then 3 timed rounds, the
// figure being the median round's time divided by 1000.
//
// Output: JSON lines {"program":"alloc_costs","bench":...,"size":...,"alloc_ns":...,
// "free_ns":...,"pair_ns":...}.
#include "common.h"

using namespace baseline;

namespace {

struct Pair {
  double alloc_ns;
  double free_ns;
};

template <typename Alloc, typename Free>
Pair time_each_call(size_t size, int pairs, Alloc alloc, Free free_fn) {
  std::vector<double> a, f;
  a.reserve(pairs);
  f.reserve(pairs);
  // One untimed pair first: the first call of a size can fault in driver state.
  free_fn(alloc(size));
  for (int i = 0; i < pairs; i++) {
    auto t0 = Clock::now();
    void* p = alloc(size);
    a.push_back(ns_since(t0));
    auto t1 = Clock::now();
    free_fn(p);
    f.push_back(ns_since(t1));
  }
  return {median(a), median(f)};
}

template <typename Alloc, typename Free>
double time_mixed(const std::vector<size_t>& sizes, Alloc alloc, Free free_fn) {
  std::vector<void*> live(sizes.size());
  std::vector<double> rounds;
  for (int r = 0; r < 4; r++) {
    auto t0 = Clock::now();
    for (size_t i = 0; i < sizes.size(); i++) live[i] = alloc(sizes[i]);
    for (size_t i = 0; i < sizes.size(); i++) free_fn(live[i]);
    double ns = ns_since(t0) / double(sizes.size());
    if (r > 0) rounds.push_back(ns);  // round 0 warms up
  }
  return median(rounds);
}

void print_pair(const char* bench, size_t size, Pair p) {
  std::printf(
      "{\"program\":\"alloc_costs\",\"bench\":\"%s\",\"size\":%zu,\"alloc_ns\":%.0f,"
      "\"free_ns\":%.0f,\"pair_ns\":%.0f}\n",
      bench, size, p.alloc_ns, p.free_ns, p.alloc_ns + p.free_ns);
  std::fflush(stdout);
}

void print_mixed(const char* bench, double ns) {
  std::printf("{\"program\":\"alloc_costs\",\"bench\":\"%s\",\"size\":\"mixed\",\"pair_ns\":%.0f}\n",
              bench, ns);
  std::fflush(stdout);
}

}  // namespace

int main() {
  print_device("alloc_costs");
  const std::vector<size_t> sizes = bench_alloc_sizes();
  const std::vector<size_t> mixed = mixed_sizes(kMixedSeed);

  auto rt_alloc = [](size_t s) {
    void* p = nullptr;
    RT_CHECK(cudaMalloc(&p, s));
    return p;
  };
  auto rt_free = [](void* p) { RT_CHECK(cudaFree(p)); };
  auto drv_alloc = [](size_t s) {
    CUdeviceptr p = 0;
    DRV_CHECK(cuMemAlloc(&p, s));
    return reinterpret_cast<void*>(p);
  };
  auto drv_free = [](void* p) { DRV_CHECK(cuMemFree(reinterpret_cast<CUdeviceptr>(p))); };

  for (size_t s : sizes) {
    int pairs = s >= (size_t(256) << 20) ? 20 : 200;
    print_pair("cudaMalloc+cudaFree", s, time_each_call(s, pairs, rt_alloc, rt_free));
    print_pair("cuMemAlloc+cuMemFree", s, time_each_call(s, pairs, drv_alloc, drv_free));
  }
  // The cost model's points above 1 GiB (a first segment of PyTorch's can be several GiB).
  for (size_t s : {size_t(4) << 30, size_t(16) << 30}) {
    print_pair("cudaMalloc+cudaFree", s, time_each_call(s, 10, rt_alloc, rt_free));
    print_pair("cuMemAlloc+cuMemFree", s, time_each_call(s, 10, drv_alloc, drv_free));
  }
  print_mixed("cudaMalloc+cudaFree", time_mixed(mixed, rt_alloc, rt_free));
  print_mixed("cuMemAlloc+cuMemFree", time_mixed(mixed, drv_alloc, drv_free));

  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaMemPool_t pool;
  RT_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  uint64_t keep_all = UINT64_MAX;
  RT_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  auto async_alloc = [stream](size_t s) {
    void* p = nullptr;
    RT_CHECK(cudaMallocAsync(&p, s, stream));
    return p;
  };
  auto async_free = [stream](void* p) { RT_CHECK(cudaFreeAsync(p, stream)); };
  for (size_t s : sizes) {
    Pair p = time_each_call(s, 2000, async_alloc, async_free);
    RT_CHECK(cudaStreamSynchronize(stream));
    print_pair("cudaMallocAsync+cudaFreeAsync", s, p);
  }
  double m = time_mixed(mixed, async_alloc, async_free);
  RT_CHECK(cudaStreamSynchronize(stream));
  print_mixed("cudaMallocAsync+cudaFreeAsync", m);
  RT_CHECK(cudaStreamDestroy(stream));
  return 0;
}
