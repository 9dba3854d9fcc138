/* The one fake libcuda.so for gpumem's fake-driver tests (tests/support/fakecuda.rs builds
 * it and runs a test again with LD_LIBRARY_PATH pointing at it; tests/cuda and tests/pinned
 * use it). Device memory is host memory (device pointer == host address): cuMemAlloc is
 * posix_memalign, every copy is a synchronous memcpy, events record a timestamp, the copy16
 * "kernel" is a memcpy of n16 * 16 bytes, VMM sits on mmap (reserve = PROT_NONE range,
 * map + set access = read-write pages). One device "Fake H200" of 16 GiB, 2 MiB granularity,
 * 512 B texture alignment, 4 SMs, driver 13.0; FAKE_CUDA_DEVICES=N (read at cuInit, 1 to 8)
 * makes N such devices, each with its own primary context, that can all access each other
 * (one memory budget is shared). Peer rules are checked: cuCtxEnablePeerAccess once per pair
 * (again: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED), and the copy16 kernel may touch another
 * device's cuMemAlloc memory only with peer access enabled, and VMM pages only where
 * cuMemSetAccess granted its device.
 *
 * It checks the rules the real driver enforces: a current context for every call that needs
 * one; map only inside a reservation and not twice, access only on mapped pages, unmap whole
 * mappings, free only whole reservations; no double host registration; the primary context
 * never released more than retained. A broken rule prints "FAKE: ..." (the harness fails on
 * it). It checks data movement and call sequences, not performance or asynchrony. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>
#include <pthread.h>
#include <sys/mman.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUmemoryPool;
typedef unsigned long long CUdeviceptr;

enum {
    OK = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NOT_INITIALIZED = 3,
    INVALID_DEVICE = 101,
    INVALID_CONTEXT = 201,
    NOT_FOUND = 500,
    ALREADY_REGISTERED = 712,
    NOT_REGISTERED = 713,
};

static int initialised;
#define MAX_DEV 8
static int ndev = 1;
static char primary_ctx[MAX_DEV];
static int ctx_refs[MAX_DEV];
static int peer_on[MAX_DEV][MAX_DEV];
static int whole_mappings;
static __thread CUcontext current;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_REG 4096
static struct { uintptr_t start, len; } regs[MAX_REG];
static long live_host_allocs, live_dev_allocs, live_events, live_streams;

/* Device memory bookkeeping: segments, managed, mappings, reservations; physical handles. */
static const unsigned long long CAP = 16ULL << 30, G = 2ULL << 20;
static unsigned long long used = 0;
enum { SEG = 0, MANAGED = 1, MAPPING = 2, RESERVE = 3 };
struct rec { CUdeviceptr a; size_t n; int kind; int live; int dev; unsigned access; };
static struct rec recs[1 << 16]; static int nrec = 0;
static struct { size_t n; int live; } hs[1 << 16]; static int nh = 0;
static int cur_dev(void);
static void add(CUdeviceptr a, size_t n, int k) {
    int d = cur_dev();
    for (int i = 0; i < nrec; i++) if (!recs[i].live) { recs[i] = (struct rec){a, n, k, 1, d, 0}; return; }
    if (nrec == (1 << 16)) { fprintf(stderr, "FAKE: too many records\n"); abort(); }
    recs[nrec++] = (struct rec){a, n, k, 1, d, 0};
}
static struct rec *find(CUdeviceptr a, int k) {
    for (int i = 0; i < nrec; i++)
        if (recs[i].live && recs[i].kind == k && a >= recs[i].a && a < recs[i].a + recs[i].n) return &recs[i];
    return 0;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* The device of the current context (0 without one). */
static int cur_dev(void) { return current ? (int)((char *)current - primary_ctx) : 0; }

#define NEED_CTX() do { if (!initialised) return NOT_INITIALIZED; if (!current) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned flags) {
    (void)flags;
    const char *n = getenv("FAKE_CUDA_DEVICES");
    if (n && atoi(n) >= 1 && atoi(n) <= MAX_DEV) ndev = atoi(n);
    whole_mappings = getenv("FAKE_CUDA_WHOLE_MAPPINGS") != 0;
    initialised = 1;
    return OK;
}
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = ndev; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialised) return NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= ndev) return INVALID_DEVICE;
    *d = ordinal;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int a, CUdevice d) {
    (void)d;
    /* 14 texture alignment, 51 texture pitch alignment, 16 multiprocessor count; 102 VMM,
     * 115 memory pools, 83 managed memory, 89 concurrent managed access supported. */
    *v = a == 14 ? 512 : a == 51 ? 32 : a == 16 ? 4 : (a == 102 || a == 115 || a == 83 || a == 89) ? 1 : 0;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    strncpy(name, "Fake H200", len);
    if (len > 0) name[len - 1] = 0;
    return OK;
}
CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    char b[16];
    snprintf(b, sizeof b, "0000:%02X:00.0", 0x3B + 0x22 * d);
    strncpy(id, b, len);
    if (len > 0) id[len - 1] = 0;
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = CAP; return OK; }
CUresult cuDeviceCanAccessPeer(int *v, CUdevice a, CUdevice b) { *v = a != b && a >= 0 && b >= 0 && a < ndev && b < ndev; return OK; }
/* 1 performance rank, 2 access supported, 3 native atomics, 4 CUDA array access. */
CUresult cuDeviceGetP2PAttribute(int *v, int attr, CUdevice a, CUdevice b) {
    if (a < 0 || b < 0 || a >= ndev || b >= ndev || a == b) return INVALID_DEVICE;
    *v = attr == 1 ? 0 : 1;
    return OK;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!initialised) return NOT_INITIALIZED;
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    pthread_mutex_lock(&lock); ctx_refs[d]++; pthread_mutex_unlock(&lock);
    *c = &primary_ctx[d];
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    if (d < 0 || d >= ndev) return INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    ctx_refs[d]--;
    if (ctx_refs[d] < 0) { fprintf(stderr, "FAKE: ctx released too often\n"); abort(); }
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) {
    if (c && ((char *)c < primary_ctx || (char *)c >= primary_ctx + ndev)) return INVALID_CONTEXT;
    current = c;
    return OK;
}
CUresult cuCtxSynchronize(void) { return OK; }
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned flags) {
    NEED_CTX();
    if (flags) return INVALID_VALUE;
    if ((char *)peer < primary_ctx || (char *)peer >= primary_ctx + ndev) return INVALID_CONTEXT;
    int from = cur_dev(), to = (int)((char *)peer - primary_ctx);
    if (from == to) return INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    int was = peer_on[from][to];
    peer_on[from][to] = 1;
    pthread_mutex_unlock(&lock);
    return was ? 704 /* CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED */ : OK;
}

CUresult cuGetErrorName(CUresult e, const char **s) {
    switch (e) {
    case OK: *s = "CUDA_SUCCESS"; break;
    case ALREADY_REGISTERED: *s = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"; break;
    case NOT_REGISTERED: *s = "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"; break;
    case INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; break;
    }
    return OK;
}
CUresult cuGetErrorString(CUresult e, const char **s) { return cuGetErrorName(e, s); }

/* Host memory. */
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags) {
    NEED_CTX();
    (void)flags;
    if (n == 0) return INVALID_VALUE;
    if (posix_memalign(p, 4096, n)) return OUT_OF_MEMORY;
    __atomic_add_fetch(&live_host_allocs, 1, __ATOMIC_SEQ_CST);
    return OK;
}
CUresult cuMemFreeHost(void *p) {
    NEED_CTX();
    free(p);
    __atomic_sub_fetch(&live_host_allocs, 1, __ATOMIC_SEQ_CST);
    return OK;
}
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    NEED_CTX();
    if (flags) return INVALID_VALUE;
    *d = (CUdeviceptr)(uintptr_t)p;
    return OK;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    NEED_CTX();
    (void)flags;
    uintptr_t a = (uintptr_t)p;
    if (n == 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int free_slot = -1;
    for (int i = 0; i < MAX_REG; i++) {
        if (regs[i].len == 0) { if (free_slot < 0) free_slot = i; continue; }
        /* Overlap at page granularity. */
        uintptr_t s0 = regs[i].start & ~(uintptr_t)4095, e0 = (regs[i].start + regs[i].len + 4095) & ~(uintptr_t)4095;
        uintptr_t s1 = a & ~(uintptr_t)4095, e1 = (a + n + 4095) & ~(uintptr_t)4095;
        if (s1 < e0 && s0 < e1) { pthread_mutex_unlock(&lock); return ALREADY_REGISTERED; }
    }
    if (free_slot < 0) { pthread_mutex_unlock(&lock); return OUT_OF_MEMORY; }
    regs[free_slot].start = a;
    regs[free_slot].len = n;
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuMemHostUnregister(void *p) {
    NEED_CTX();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_REG; i++) {
        if (regs[i].len && regs[i].start == (uintptr_t)p) {
            regs[i].len = 0;
            pthread_mutex_unlock(&lock);
            return OK;
        }
    }
    pthread_mutex_unlock(&lock);
    return NOT_REGISTERED;
}

/* Device memory. */
static CUresult alloc(CUdeviceptr *p, size_t n, int k) {
    NEED_CTX();
    if (n == 0) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (used + n > CAP) { pthread_mutex_unlock(&lock); return OUT_OF_MEMORY; }
    void *m = 0;
    if (posix_memalign(&m, 512, n)) { pthread_mutex_unlock(&lock); return OUT_OF_MEMORY; }
    used += n;
    *p = (CUdeviceptr)(uintptr_t)m;
    add(*p, n, k);
    pthread_mutex_unlock(&lock);
    memset(m, 0xEE, n);
    __atomic_add_fetch(&live_dev_allocs, 1, __ATOMIC_SEQ_CST);
    return OK;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc(p, n, SEG); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { (void)f; return alloc(p, n, MANAGED); }
CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CTX();
    pthread_mutex_lock(&lock);
    for (int i = 0; i < nrec; i++)
        if (recs[i].live && recs[i].a == p && recs[i].kind < MAPPING) {
            recs[i].live = 0;
            used -= recs[i].n;
            free((void *)(uintptr_t)p);
            pthread_mutex_unlock(&lock);
            __atomic_sub_fetch(&live_dev_allocs, 1, __ATOMIC_SEQ_CST);
            return OK;
        }
    pthread_mutex_unlock(&lock);
    fprintf(stderr, "FAKE: bad cuMemFree %llx\n", p);
    return INVALID_VALUE;
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    *pitch = (w + 511) & ~511ULL;
    return alloc(p, *pitch * h, SEG);
}
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = CAP - used; *t = CAP; return OK; }
typedef struct { int type; int id; } Loc;
CUresult cuMemPrefetchAsync_v2(CUdeviceptr p, size_t n, Loc l, unsigned f, CUstream s) {
    (void)n; (void)l; (void)f; (void)s;
    return find(p, MANAGED) ? OK : INVALID_VALUE;
}
CUresult cuMemAdvise_v2(CUdeviceptr p, size_t n, int a, Loc l) { (void)n; (void)a; (void)l; return find(p, MANAGED) ? OK : INVALID_VALUE; }
CUresult cuMemsetD32_v2(CUdeviceptr p, unsigned v, size_t n) { unsigned *q = (unsigned *)(uintptr_t)p; for (size_t i = 0; i < n; i++) q[i] = v; return OK; }
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { memcpy(d, (void *)(uintptr_t)s, n); return OK; }
CUresult cuPointerGetAttribute(void *out, int attr, CUdeviceptr p) {
    pthread_mutex_lock(&lock);
    struct rec *r = find(p, SEG);
    if (!r) r = find(p, MANAGED);
    if (!r) r = find(p, MAPPING);
    pthread_mutex_unlock(&lock);
    if (!r) return INVALID_VALUE;
    switch (attr) {
    case 9: *(int *)out = r->dev; break;           /* device ordinal */
    case 2: *(unsigned *)out = 2; break;           /* memory type: device */
    case 11: *(CUdeviceptr *)out = r->a; break;    /* range start */
    case 12: *(size_t *)out = r->n; break;         /* range size */
    case 13: *(int *)out = 1; break;               /* mapped */
    case 8: *(int *)out = r->kind == MANAGED; break; /* is managed */
    default: return INVALID_VALUE;
    }
    return OK;
}

/* Virtual memory management. */
CUresult cuMemGetAllocationGranularity(size_t *g, const void *prop, int o) { (void)prop; (void)o; *g = G; return OK; }
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t al, CUdeviceptr a, unsigned long long f) {
    (void)al; (void)a; (void)f;
    if (n % G) return INVALID_VALUE;
    void *m = mmap(0, n + G, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return OUT_OF_MEMORY;
    CUdeviceptr b = ((CUdeviceptr)(uintptr_t)m + G - 1) & ~(G - 1);
    pthread_mutex_lock(&lock); add(b, n, RESERVE); pthread_mutex_unlock(&lock);
    *p = b;
    return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
    pthread_mutex_lock(&lock);
    struct rec *r = find(p, RESERVE);
    if (!r || r->a != p || r->n != n) {
        pthread_mutex_unlock(&lock);
        fprintf(stderr, "FAKE: bad AddressFree p=%llx n=%zu\n", p, n);
        return INVALID_VALUE;
    }
    r->live = 0;
    pthread_mutex_unlock(&lock);
    munmap((void *)(uintptr_t)p, n);
    return OK;
}
CUresult cuMemCreate(unsigned long long *h, size_t n, const void *prop, unsigned long long f) {
    (void)prop; (void)f;
    if (n % G) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (used + n > CAP) { pthread_mutex_unlock(&lock); return OUT_OF_MEMORY; }
    int i = 0;
    while (i < nh && hs[i].live) i++;
    if (i == nh) { if (nh == (1 << 16)) { pthread_mutex_unlock(&lock); return OUT_OF_MEMORY; } nh++; }
    used += n; hs[i].n = n; hs[i].live = 1; *h = i + 1;
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuMemRelease(unsigned long long h) {
    pthread_mutex_lock(&lock);
    if (h < 1 || h > (unsigned long long)nh || !hs[h - 1].live) {
        pthread_mutex_unlock(&lock);
        fprintf(stderr, "FAKE: bad release\n");
        return INVALID_VALUE;
    }
    hs[h - 1].live = 0; used -= hs[h - 1].n;
    pthread_mutex_unlock(&lock);
    return OK;
}
CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, unsigned long long h, unsigned long long f) {
    (void)off; (void)h; (void)f;
    pthread_mutex_lock(&lock);
    if (!find(p, RESERVE) || find(p, MAPPING)) {
        pthread_mutex_unlock(&lock);
        fprintf(stderr, "FAKE: bad map p=%llx n=%zu\n", p, n);
        return INVALID_VALUE;
    }
    add(p, n, MAPPING);
    pthread_mutex_unlock(&lock);
    mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return OK;
}
/* CUmemAccessDesc: CUmemLocation {type, id}, flags (0 none, 1 read, 3 read-write). */
typedef struct { int type; int id; int flags; } AccessDesc;
CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const void *d, size_t c) {
    const AccessDesc *desc = d;
    pthread_mutex_lock(&lock);
    for (CUdeviceptr a = p; a < p + n; a += G)
        if (!find(a, MAPPING)) { pthread_mutex_unlock(&lock); fprintf(stderr, "FAKE: access on unmapped\n"); return INVALID_VALUE; }
    /* FAKE_CUDA_WHOLE_MAPPINGS=1: the range must start and end at mapping boundaries (the
     * strictest reading of the driver's "containing all allocations"). */
    if (whole_mappings) {
        struct rec *first = find(p, MAPPING), *last = find(p + n - 1, MAPPING);
        if (first->a != p || last->a + last->n != p + n) { pthread_mutex_unlock(&lock); return INVALID_VALUE; }
    }
    for (size_t i = 0; i < c; i++)
        if (desc[i].type != 1 || desc[i].id < 0 || desc[i].id >= ndev) { pthread_mutex_unlock(&lock); return INVALID_DEVICE; }
    for (CUdeviceptr a = p; a < p + n;) {
        struct rec *r = find(a, MAPPING);
        for (size_t i = 0; i < c; i++) {
            if (desc[i].flags) r->access |= 1u << desc[i].id;
            else r->access &= ~(1u << desc[i].id);
        }
        a = r->a + r->n;
    }
    pthread_mutex_unlock(&lock);
    mprotect((void *)(uintptr_t)p, n, PROT_READ | PROT_WRITE);
    return OK;
}
CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
    pthread_mutex_lock(&lock);
    for (CUdeviceptr a = p; a < p + n;) {
        struct rec *r = find(a, MAPPING);
        if (!r) { pthread_mutex_unlock(&lock); fprintf(stderr, "FAKE: bad unmap\n"); return INVALID_VALUE; }
        r->live = 0;
        a = r->a + r->n;
    }
    pthread_mutex_unlock(&lock);
    mmap((void *)(uintptr_t)p, n, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return OK;
}

/* Stream-ordered allocation (the default memory pool). */
static int default_pool;
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d) { (void)d; *p = &default_pool; return OK; }
CUresult cuMemPoolSetAttribute(CUmemoryPool p, int a, void *v) { (void)p; (void)a; (void)v; return OK; }
CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t n) { (void)p; (void)n; return OK; }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc(p, n, SEG); }
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }

/* Copies: synchronous. */
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) {
    NEED_CTX(); (void)st;
    memcpy((void *)(uintptr_t)d, s, n);
    return OK;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) {
    NEED_CTX(); (void)st;
    memcpy(d, (void *)(uintptr_t)s, n);
    return OK;
}
CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) {
    NEED_CTX(); (void)st;
    if (!dc || !sc) return INVALID_CONTEXT;
    memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return OK;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    NEED_CTX(); (void)st;
    memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return OK;
}

/* Streams and events. */
CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    NEED_CTX(); (void)flags;
    *s = malloc(1);
    __atomic_add_fetch(&live_streams, 1, __ATOMIC_SEQ_CST);
    return OK;
}
CUresult cuStreamDestroy_v2(CUstream s) { NEED_CTX(); free(s); __atomic_sub_fetch(&live_streams, 1, __ATOMIC_SEQ_CST); return OK; }
CUresult cuStreamSynchronize(CUstream s) { NEED_CTX(); (void)s; return OK; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) { NEED_CTX(); (void)s; (void)e; (void)f; return OK; }
CUresult cuEventCreate(CUevent *e, unsigned flags) {
    NEED_CTX(); (void)flags;
    double *t = malloc(sizeof(double));
    *t = 0;
    *e = t;
    __atomic_add_fetch(&live_events, 1, __ATOMIC_SEQ_CST);
    return OK;
}
CUresult cuEventDestroy_v2(CUevent e) { NEED_CTX(); free(e); __atomic_sub_fetch(&live_events, 1, __ATOMIC_SEQ_CST); return OK; }
CUresult cuEventRecord(CUevent e, CUstream s) { NEED_CTX(); (void)s; *(double *)e = now(); return OK; }
CUresult cuEventQuery(CUevent e) { NEED_CTX(); (void)e; return OK; }
CUresult cuEventSynchronize(CUevent e) { NEED_CTX(); (void)e; return OK; }
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) {
    NEED_CTX();
    *ms = (float)((*(double *)b - *(double *)a) * 1e3);
    return OK;
}
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

/* The copy16 kernel. */
static char module_tag, function_tag;
CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    NEED_CTX();
    if (!strstr((const char *)image, ".entry copy16(")) return INVALID_VALUE;
    *m = &module_tag;
    return OK;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    NEED_CTX();
    if (m != &module_tag || strcmp(name, "copy16")) return NOT_FOUND;
    *f = &function_tag;
    return OK;
}
CUresult cuModuleUnload(CUmodule m) { NEED_CTX(); (void)m; return OK; }
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, CUstream s, void **params, void **extra) {
    NEED_CTX();
    (void)s; (void)extra; (void)shmem;
    if (f != &function_tag || gx == 0 || bx == 0 || gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > 1024)
        return INVALID_VALUE;
    uint64_t src = *(uint64_t *)params[0], dst = *(uint64_t *)params[1], n16 = *(uint64_t *)params[2];
    /* A kernel reaches another device's memory only through peer access (cuMemAlloc memory)
     * or a cuMemSetAccess grant (VMM pages). Host memory (no record) is not checked. */
    uint64_t ends[2][2] = {{src, src + n16 * 16}, {dst, dst + n16 * 16}};
    int me = cur_dev();
    pthread_mutex_lock(&lock);
    for (int k = 0; k < 2 && n16; k++) {
        for (uint64_t a = ends[k][0]; a < ends[k][1];) {
            struct rec *r = find(a, MAPPING);
            if (r) {
                if (!(r->access & (1u << me))) {
                    pthread_mutex_unlock(&lock);
                    fprintf(stderr, "FAKE: kernel on device %d touches VMM pages not granted to it\n", me);
                    return 700; /* CUDA_ERROR_ILLEGAL_ADDRESS */
                }
                a = r->a + r->n;
                continue;
            }
            r = find(a, SEG);
            if (r && r->dev != me && !peer_on[me][r->dev]) {
                pthread_mutex_unlock(&lock);
                fprintf(stderr, "FAKE: kernel on device %d touches device %d's memory without peer access\n", me, r->dev);
                return 700;
            }
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    memcpy((void *)(uintptr_t)dst, (void *)(uintptr_t)src, n16 * 16);
    return OK;
}

/* For the tests: what is still alive. */
long fake_cuda_live(int what) {
    switch (what) {
    case 0: return live_host_allocs;
    case 1: return live_dev_allocs;
    case 2: return live_events;
    default: return live_streams;
    }
}
