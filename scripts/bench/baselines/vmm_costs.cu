// CUDA virtual memory management call costs by size: the calls gpumem's `paged` strategy
// makes, and the points of the simulated device's driver-cost model (crates/core/src/sim.rs).
//
// Method: for each size (2 MiB = the granularity, 64 MiB, 1 GiB; isolated also 4 GiB and 16 GiB,
// the sizes of one coarse handle of `paged-lazy`), a cycle cuMemAddressReserve,
// cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease, cuMemAddressFree, each call
// timed on its own with steady_clock; medians of 50 cycles (1 GiB: 20, 4 GiB and above: 10).
// The cycle runs twice: "isolated" (nothing else mapped) and "loaded", with a background of
// 8 GiB mapped as 4096 pages of 2 MiB with access set (what a replay's pool holds), because calls that change
// the page table cost more while many mappings are live. A third table times cuMemSetAccess
// over N contiguous 2 MiB mappings (N = 1, 4, 32, 512) in the loaded context: `paged` maps a
// block page by page and sets access once over the whole block. A fourth times
// cuMemAddressReserve and cuMemAddressFree alone for 1 GiB to 1 TiB of address space.
//
// Output: JSON lines {"program":"vmm_costs","bench":"vmm_cycle","context":...,"size":...,
// "reserve_ns":..., ...}, {"bench":"set_access_pages","pages":N,...} and
// {"bench":"vmm_reserve","size":...,"reserve_ns":...,"address_free_ns":...}.
#include "common.h"

using namespace baseline;

namespace {

CUmemAllocationProp device_prop() {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  return prop;
}

CUmemAccessDesc read_write() {
  CUmemAccessDesc d = {};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return d;
}

// Background mappings: `pages` pages of `page` bytes in one reserved range, access set.
struct Background {
  CUdeviceptr va = 0;
  size_t page = 0;
  std::vector<CUmemGenericAllocationHandle> handles;

  void map(size_t pages, size_t page_bytes) {
    page = page_bytes;
    CUmemAllocationProp prop = device_prop();
    CUmemAccessDesc rw = read_write();
    DRV_CHECK(cuMemAddressReserve(&va, pages * page, 0, 0, 0));
    for (size_t i = 0; i < pages; i++) {
      CUmemGenericAllocationHandle h;
      DRV_CHECK(cuMemCreate(&h, page, &prop, 0));
      DRV_CHECK(cuMemMap(va + i * page, page, 0, h, 0));
      DRV_CHECK(cuMemSetAccess(va + i * page, page, &rw, 1));
      handles.push_back(h);
    }
  }

  void unmap() {
    for (size_t i = 0; i < handles.size(); i++) {
      DRV_CHECK(cuMemUnmap(va + i * page, page));
      DRV_CHECK(cuMemRelease(handles[i]));
    }
    if (va != 0) DRV_CHECK(cuMemAddressFree(va, handles.size() * page));
    handles.clear();
    va = 0;
  }
};

void cycle(const char* context, size_t size, int cycles) {
  CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc rw = read_write();
  std::vector<double> t[7];
  for (int i = 0; i < cycles + 1; i++) {
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    double ns[7];
    auto t0 = Clock::now();
    DRV_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    ns[0] = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemCreate(&h, size, &prop, 0));
    ns[1] = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemMap(va, size, 0, h, 0));
    ns[2] = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemSetAccess(va, size, &rw, 1));
    ns[3] = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemUnmap(va, size));
    ns[4] = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemRelease(h));
    ns[5] = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemAddressFree(va, size));
    ns[6] = ns_since(t0);
    if (i == 0) continue;  // warm-up cycle
    for (int k = 0; k < 7; k++) t[k].push_back(ns[k]);
  }
  std::printf(
      "{\"program\":\"vmm_costs\",\"bench\":\"vmm_cycle\",\"context\":\"%s\",\"size\":%zu,"
      "\"reserve_ns\":%.0f,\"create_ns\":%.0f,\"map_ns\":%.0f,\"set_access_ns\":%.0f,"
      "\"unmap_ns\":%.0f,\"release_ns\":%.0f,\"address_free_ns\":%.0f}\n",
      context, size, median(t[0]), median(t[1]), median(t[2]), median(t[3]), median(t[4]),
      median(t[5]), median(t[6]));
  std::fflush(stdout);
}

// cuMemAddressReserve and cuMemAddressFree alone, of `size` bytes of address space (no memory
// behind it): the strategies reserve far more address space than they map (an expandable
// segment of `paged-lazy` reserves at least 64 GiB).
void reserve_only(size_t size, int reps) {
  std::vector<double> r, f;
  for (int i = 0; i < reps + 1; i++) {
    CUdeviceptr va;
    auto t0 = Clock::now();
    DRV_CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
    double a = ns_since(t0);
    t0 = Clock::now();
    DRV_CHECK(cuMemAddressFree(va, size));
    double b = ns_since(t0);
    if (i == 0) continue;  // warm-up
    r.push_back(a);
    f.push_back(b);
  }
  std::printf(
      "{\"program\":\"vmm_costs\",\"bench\":\"vmm_reserve\",\"size\":%zu,"
      "\"reserve_ns\":%.0f,\"address_free_ns\":%.0f}\n",
      size, median(r), median(f));
  std::fflush(stdout);
}

// cuMemSetAccess once over `pages` contiguous mappings of `page` bytes.
void set_access_pages(size_t pages, size_t page, int reps) {
  CUmemAllocationProp prop = device_prop();
  CUmemAccessDesc rw = read_write();
  CUdeviceptr va;
  DRV_CHECK(cuMemAddressReserve(&va, pages * page, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> hs(pages);
  for (size_t i = 0; i < pages; i++) DRV_CHECK(cuMemCreate(&hs[i], page, &prop, 0));
  std::vector<double> set, unmap;
  for (int r = 0; r < reps; r++) {
    for (size_t i = 0; i < pages; i++) DRV_CHECK(cuMemMap(va + i * page, page, 0, hs[i], 0));
    auto t0 = Clock::now();
    DRV_CHECK(cuMemSetAccess(va, pages * page, &rw, 1));
    set.push_back(ns_since(t0));
    t0 = Clock::now();
    DRV_CHECK(cuMemUnmap(va, pages * page));
    unmap.push_back(ns_since(t0));
  }
  for (auto h : hs) DRV_CHECK(cuMemRelease(h));
  DRV_CHECK(cuMemAddressFree(va, pages * page));
  std::printf(
      "{\"program\":\"vmm_costs\",\"bench\":\"set_access_pages\",\"context\":\"loaded\","
      "\"pages\":%zu,\"size\":%zu,\"set_access_ns\":%.0f,\"unmap_ns\":%.0f}\n",
      pages, pages * page, median(set), median(unmap));
  std::fflush(stdout);
}

}  // namespace

int main() {
  print_device("vmm_costs");
  CUmemAllocationProp prop = device_prop();
  size_t gmin = 0, grec = 0;
  DRV_CHECK(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  DRV_CHECK(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  std::printf(
      "{\"program\":\"vmm_costs\",\"bench\":\"granularity\",\"minimum\":%zu,"
      "\"recommended\":%zu}\n",
      gmin, grec);
  const size_t sizes[] = {gmin, 32 * gmin, 512 * gmin};  // 2 MiB, 64 MiB, 1 GiB at 2 MiB
  for (size_t s : sizes) cycle("isolated", s, s >= (size_t(1) << 30) ? 20 : 50);
  for (size_t s : {2048 * gmin, 8192 * gmin}) cycle("isolated", s, 10);  // 4 GiB, 16 GiB
  for (size_t s : {size_t(1) << 30, size_t(64) << 30, size_t(256) << 30, size_t(1) << 40}) {
    reserve_only(s, 20);
  }
  Background bg;
  bg.map(4096, gmin);
  for (size_t s : sizes) cycle("loaded", s, s >= (size_t(1) << 30) ? 20 : 50);
  for (size_t n : {size_t(1), size_t(4), size_t(32), size_t(512)}) {
    set_access_pages(n, gmin, n >= 512 ? 10 : 30);
  }
  bg.unmap();
  return 0;
}
