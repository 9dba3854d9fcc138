// Host memory and host<->device copies, the baselines of `gpumem bench pinned` and
// `gpumem bench transfer`.
//
// Method:
// - host allocation: cudaHostAlloc / cudaFreeHost, malloc + first touch (memset),
//   cudaHostRegister / cudaHostUnregister of that touched memory; medians of 5, by size.
// - copies: cudaMemcpyAsync on one non-blocking stream, timed with CUDA events around each
//   copy, 2 untimed copies then N timed ones (N = 200 up to 1 MiB, 30 up to 64 MiB, 8 above),
//   the median time; GB/s = 1e9 B/s. Host buffers: pageable (malloc, touched), pinned
//   (cudaHostAlloc default), write-combined (cudaHostAllocWriteCombined, H2D only), mapped
//   (a kernel on the device reads host memory through cudaHostGetDevicePointer).
// - pinned both directions at once (two streams, 256 MiB each way), and device to device
//   (1 GiB, read + write counted).
//
// Output: JSON lines {"program":"host_transfers","bench":"copy","kind":...,"dir":...,
// "size":...,"ms":...,"gbps":...} and {"bench":"host_alloc",...}.
#include <cstring>

#include "common.h"

using namespace baseline;

namespace {

constexpr size_t kMiB = size_t(1) << 20;

#ifdef __CUDACC__
// Reads `n` floats of host memory through its device pointer (zero-copy); writes only if the
// sum is a value it never takes, so that the read cannot be optimized away.
__global__ void read_host(const float* __restrict__ src, float* sink, size_t n) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  size_t stride = size_t(gridDim.x) * blockDim.x;
  float acc = 0.f;
  for (; i < n; i += stride) acc += src[i];
  if (acc == -1.2345f) sink[0] = acc;
}

void launch_read_host(const float* src, float* sink, size_t n, int sms, cudaStream_t s) {
  read_host<<<sms * 8, 256, 0, s>>>(src, sink, n);
  RT_CHECK(cudaGetLastError());
}
#else
void launch_read_host(const float*, float*, size_t, int, cudaStream_t);
#endif

void host_alloc(size_t size) {
  std::vector<double> ha, hf, mt, rg, ur;
  for (int i = 0; i < 5; i++) {
    void* h = nullptr;
    auto t0 = Clock::now();
    RT_CHECK(cudaHostAlloc(&h, size, cudaHostAllocDefault));
    ha.push_back(ns_since(t0));
    t0 = Clock::now();
    RT_CHECK(cudaFreeHost(h));
    hf.push_back(ns_since(t0));
    t0 = Clock::now();
    void* m = std::malloc(size);
    if (m == nullptr) {
      std::fprintf(stderr, "malloc(%zu) failed\n", size);
      std::exit(1);
    }
    std::memset(m, 1, size);
    mt.push_back(ns_since(t0));
    t0 = Clock::now();
    RT_CHECK(cudaHostRegister(m, size, cudaHostRegisterDefault));
    rg.push_back(ns_since(t0));
    t0 = Clock::now();
    RT_CHECK(cudaHostUnregister(m));
    ur.push_back(ns_since(t0));
    std::free(m);
  }
  std::printf(
      "{\"program\":\"host_transfers\",\"bench\":\"host_alloc\",\"size\":%zu,"
      "\"cudaHostAlloc_ns\":%.0f,\"cudaFreeHost_ns\":%.0f,\"malloc_touch_ns\":%.0f,"
      "\"cudaHostRegister_ns\":%.0f,\"cudaHostUnregister_ns\":%.0f}\n",
      size, median(ha), median(hf), median(mt), median(rg), median(ur));
  std::fflush(stdout);
}

struct Timer {
  cudaEvent_t start, stop;
  Timer() {
    RT_CHECK(cudaEventCreate(&start));
    RT_CHECK(cudaEventCreate(&stop));
  }
  ~Timer() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
};

// Median milliseconds of `reps` timed runs of `op` on `s` (after 2 untimed ones).
template <typename Op>
double time_ms(Timer& t, cudaStream_t s, int reps, Op op) {
  std::vector<double> ms;
  for (int r = 0; r < reps + 2; r++) {
    RT_CHECK(cudaEventRecord(t.start, s));
    op();
    RT_CHECK(cudaEventRecord(t.stop, s));
    RT_CHECK(cudaEventSynchronize(t.stop));
    float m = 0;
    RT_CHECK(cudaEventElapsedTime(&m, t.start, t.stop));
    if (r >= 2) ms.push_back(m);
  }
  return median(ms);
}

void print_copy(const char* kind, const char* dir, size_t size, double ms) {
  std::printf(
      "{\"program\":\"host_transfers\",\"bench\":\"copy\",\"kind\":\"%s\",\"dir\":\"%s\","
      "\"size\":%zu,\"ms\":%.4f,\"gbps\":%.2f}\n",
      kind, dir, size, ms, double(size) / (ms * 1e-3) / 1e9);
  std::fflush(stdout);
}

}  // namespace

int main() {
  print_device("host_transfers");
  for (size_t s : {kMiB, 16 * kMiB, 256 * kMiB, 1024 * kMiB}) host_alloc(s);

  cudaDeviceProp p;
  RT_CHECK(cudaGetDeviceProperties(&p, 0));
  const size_t max_size = 1024 * kMiB;
  void* dev = nullptr;
  void* sink = nullptr;
  RT_CHECK(cudaMalloc(&dev, max_size));
  RT_CHECK(cudaMalloc(&sink, 64));
  void* pageable = std::malloc(max_size);
  if (pageable == nullptr) {
    std::fprintf(stderr, "malloc(%zu) failed\n", max_size);
    return 1;
  }
  std::memset(pageable, 1, max_size);
  void *pinned = nullptr, *wc = nullptr, *mapped = nullptr;
  RT_CHECK(cudaHostAlloc(&pinned, max_size, cudaHostAllocDefault));
  RT_CHECK(cudaHostAlloc(&wc, max_size, cudaHostAllocWriteCombined));
  RT_CHECK(cudaHostAlloc(&mapped, max_size, cudaHostAllocMapped));
  std::memset(pinned, 1, max_size);
  std::memset(wc, 1, max_size);
  std::memset(mapped, 0, max_size);
  float* mapped_dev = nullptr;
  RT_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped_dev), mapped, 0));

  cudaStream_t s;
  RT_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Timer t;
  struct Host {
    const char* kind;
    void* ptr;
    bool d2h;
  };
  const Host hosts[] = {{"pageable", pageable, true}, {"pinned", pinned, true},
                        {"write_combined", wc, false}};
  for (size_t size : {size_t(4096), 64 * size_t(1024), kMiB, 8 * kMiB, 64 * kMiB, 256 * kMiB,
                      1024 * kMiB}) {
    int reps = size <= kMiB ? 200 : (size <= 64 * kMiB ? 30 : 8);
    for (const Host& h : hosts) {
      double ms = time_ms(t, s, reps, [&] {
        RT_CHECK(cudaMemcpyAsync(dev, h.ptr, size, cudaMemcpyHostToDevice, s));
      });
      print_copy(h.kind, "H2D", size, ms);
      if (!h.d2h) continue;
      ms = time_ms(t, s, reps, [&] {
        RT_CHECK(cudaMemcpyAsync(h.ptr, dev, size, cudaMemcpyDeviceToHost, s));
      });
      print_copy(h.kind, "D2H", size, ms);
    }
    double ms = time_ms(t, s, reps, [&] {
      launch_read_host(mapped_dev, static_cast<float*>(sink), size / sizeof(float),
                       p.multiProcessorCount, s);
    });
    print_copy("mapped_zero_copy_read", "H2D", size, ms);
  }

  // Pinned, both directions at once on two streams.
  {
    cudaStream_t s2;
    RT_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    void* dev2 = nullptr;
    const size_t each = 256 * kMiB;
    RT_CHECK(cudaMalloc(&dev2, each));
    std::vector<double> ns;
    for (int r = 0; r < 10; r++) {
      auto t0 = Clock::now();
      RT_CHECK(cudaMemcpyAsync(dev, pinned, each, cudaMemcpyHostToDevice, s));
      RT_CHECK(cudaMemcpyAsync(static_cast<char*>(pinned) + 512 * kMiB, dev2, each,
                               cudaMemcpyDeviceToHost, s2));
      RT_CHECK(cudaStreamSynchronize(s));
      RT_CHECK(cudaStreamSynchronize(s2));
      if (r >= 2) ns.push_back(ns_since(t0));
    }
    std::printf(
        "{\"program\":\"host_transfers\",\"bench\":\"copy_both_ways_pinned\",\"size_each\":%zu,"
        "\"gbps_total\":%.2f}\n",
        each, 2.0 * double(each) / (median(ns) * 1e-9) / 1e9);
    RT_CHECK(cudaFree(dev2));
    RT_CHECK(cudaStreamDestroy(s2));
  }
  // Device to device, read + write counted.
  {
    void* dev2 = nullptr;
    RT_CHECK(cudaMalloc(&dev2, max_size));
    double ms = time_ms(t, s, 10, [&] {
      RT_CHECK(cudaMemcpyAsync(dev2, dev, max_size, cudaMemcpyDeviceToDevice, s));
    });
    std::printf(
        "{\"program\":\"host_transfers\",\"bench\":\"copy\",\"kind\":\"device\",\"dir\":\"D2D\","
        "\"size\":%zu,\"ms\":%.4f,\"gbps_read_plus_write\":%.1f}\n",
        max_size, ms, 2.0 * double(max_size) / (ms * 1e-3) / 1e9);
    RT_CHECK(cudaFree(dev2));
  }
  RT_CHECK(cudaStreamDestroy(s));
  RT_CHECK(cudaFreeHost(pinned));
  RT_CHECK(cudaFreeHost(wc));
  RT_CHECK(cudaFreeHost(mapped));
  std::free(pageable);
  RT_CHECK(cudaFree(dev));
  RT_CHECK(cudaFree(sink));
  return 0;
}
