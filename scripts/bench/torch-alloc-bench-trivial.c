/* A trivial CUDA allocator for torch.cuda.memory.CUDAPluggableAllocator, used by
 * scripts/bench/torch-alloc-bench.py to measure what PyTorch's pluggable-allocator path costs by
 * itself (the floor any plug-in pays), apart from gpumem.
 *
 * Size classes of four steps per power of two (at most 25 % waste), one LIFO free list per
 * class, blocks never given back; new blocks come from cuMemAlloc (blocks under 1 MiB are cut
 * from 64 MiB chunks). Single-stream reuse only: a block is reused at once, whatever stream it
 * was freed on, so use it only for single-stream benchmarks. No CUDA headers are needed: libcuda
 * is opened with dlopen.
 *
 *   cc -O2 -shared -fPIC -o libtrivial_alloc.so scripts/bench/torch-alloc-bench-trivial.c -ldl -lpthread
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

typedef int (*mem_alloc_fn)(unsigned long long *, size_t);
typedef int (*mem_free_fn)(unsigned long long);
typedef int (*retain_fn)(void **, int);
typedef int (*set_current_fn)(void *);
typedef int (*device_get_fn)(int *, int);

#define CLASSES 256
#define SMALL_LIMIT (1u << 20)
#define CHUNK_BYTES (64ull << 20)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mem_alloc_fn mem_alloc;
static mem_free_fn mem_free;
static retain_fn primary_retain;
static set_current_fn set_current;
static device_get_fn device_get;
static uint64_t *free_list[CLASSES];
static size_t free_len[CLASSES], free_cap[CLASSES];
static unsigned long long chunk_next, chunk_end;
static uint64_t driver_calls;

/* Class of `n` bytes (n >= 1): four classes per power of two, from 512 B. */
static unsigned class_of(size_t n, size_t *class_bytes) {
  if (n < 512) n = 512;
  unsigned msb = 63 - __builtin_clzll((unsigned long long)n);
  unsigned long long base = 1ull << msb, step = base >> 2;
  unsigned long long up = (n + step - 1) & ~(step - 1);
  if (up == base << 1) { msb += 1; base <<= 1; step <<= 1; up = base; }
  unsigned sub = (unsigned)((up - base) / step);
  *class_bytes = (size_t)up;
  return (msb - 9) * 4 + sub;
}

static int load(void) {
  if (mem_alloc) return 0;
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!h) return -1;
  mem_alloc = (mem_alloc_fn)dlsym(h, "cuMemAlloc_v2");
  mem_free = (mem_free_fn)dlsym(h, "cuMemFree_v2");
  primary_retain = (retain_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
  set_current = (set_current_fn)dlsym(h, "cuCtxSetCurrent");
  device_get = (device_get_fn)dlsym(h, "cuDeviceGet");
  return mem_alloc && mem_free && primary_retain && set_current && device_get ? 0 : -1;
}

/* Frees every cached block of the large classes (each its own cuMemAlloc). */
static void release_large(void) {
  size_t cb;
  unsigned first = class_of(SMALL_LIMIT, &cb);
  for (unsigned c = first; c < CLASSES; c++) {
    while (free_len[c] > 0) mem_free(free_list[c][--free_len[c]]);
  }
}

static unsigned long long driver_alloc(size_t bytes, int device) {
  unsigned long long p = 0;
  driver_calls++;
  if (mem_alloc(&p, bytes) == 0) return p;
  /* No current context on this thread: bind the device's primary context. */
  int dev; void *ctx;
  if (device_get(&dev, device) || primary_retain(&ctx, dev) || set_current(ctx)) return 0;
  if (mem_alloc(&p, bytes) == 0) return p;
  /* Out of memory: give the cached large blocks back, then try once more. */
  release_large();
  return mem_alloc(&p, bytes) == 0 ? p : 0;
}

void *trivial_malloc(ssize_t size, int device, void *stream) {
  (void)stream;
  if (size <= 0) return NULL;
  size_t cb;
  unsigned c = class_of((size_t)size, &cb);
  if (c >= CLASSES) return NULL;
  pthread_mutex_lock(&lock);
  void *r = NULL;
  if (free_len[c] > 0) {
    r = (void *)(uintptr_t)free_list[c][--free_len[c]];
  } else if (load() == 0) {
    if (cb < SMALL_LIMIT) {
      if (chunk_next + cb > chunk_end) {
        chunk_next = driver_alloc(CHUNK_BYTES, device);
        chunk_end = chunk_next ? chunk_next + CHUNK_BYTES : 0;
      }
      if (chunk_next) { r = (void *)(uintptr_t)chunk_next; chunk_next += cb; }
    } else {
      r = (void *)(uintptr_t)driver_alloc(cb, device);
    }
  }
  pthread_mutex_unlock(&lock);
  return r;
}

void trivial_free(void *ptr, ssize_t size, int device, void *stream) {
  (void)device; (void)stream;
  if (!ptr || size <= 0) return;
  size_t cb;
  unsigned c = class_of((size_t)size, &cb);
  pthread_mutex_lock(&lock);
  if (free_len[c] == free_cap[c]) {
    size_t cap = free_cap[c] ? free_cap[c] * 2 : 64;
    uint64_t *v = realloc(free_list[c], cap * sizeof *v);
    if (!v) { pthread_mutex_unlock(&lock); return; } /* leaked, not reused */
    free_list[c] = v; free_cap[c] = cap;
  }
  free_list[c][free_len[c]++] = (uint64_t)(uintptr_t)ptr;
  pthread_mutex_unlock(&lock);
}

/* cuMemAlloc calls so far. */
uint64_t trivial_driver_calls(void) { return driver_calls; }
