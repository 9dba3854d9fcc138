/* A fake libcuda.so for exercising gpumem's pinned-memory CUDA paths without a GPU.
 *
 * "Device" memory is host memory (device pointer == host address), every copy is a
 * synchronous memcpy, events record a timestamp, the copy16 "kernel" is a memcpy of n16 * 16
 * bytes. Registrations are tracked so double registration fails like the real driver.
 * Built and loaded by tests/pinned_fakecuda.rs (cc -shared -fPIC -o libcuda.so libcuda.c).
 * It checks data movement and call sequences, not performance or asynchrony. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
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
static char primary_ctx;
static __thread CUcontext current;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_REG 4096
static struct { uintptr_t start, len; } regs[MAX_REG];
static long live_host_allocs, live_dev_allocs, live_events, live_streams;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define NEED_CTX() do { if (!initialised) return NOT_INITIALIZED; if (!current) return INVALID_CONTEXT; } while (0)

CUresult cuInit(unsigned flags) { (void)flags; initialised = 1; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!initialised) return NOT_INITIALIZED;
    if (ordinal != 0) return INVALID_DEVICE;
    *d = 0;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attrib, CUdevice d) {
    (void)d;
    *v = attrib == 16 /* MULTIPROCESSOR_COUNT */ ? 4 : 1;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    strncpy(name, "Fake CUDA device", len);
    if (len > 0) name[len - 1] = 0;
    return OK;
}
CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
    (void)d;
    strncpy(id, "0000:3B:00.0", len);
    if (len > 0) id[len - 1] = 0;
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { (void)d; *b = (size_t)1 << 34; return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!initialised) return NOT_INITIALIZED;
    (void)d;
    *c = &primary_ctx;
    return OK;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
CUresult cuCtxSynchronize(void) { return OK; }

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
CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) {
    NEED_CTX();
    void *p;
    if (n == 0) return INVALID_VALUE;
    if (posix_memalign(&p, 256, n)) return OUT_OF_MEMORY;
    memset(p, 0xEE, n);
    *d = (CUdeviceptr)(uintptr_t)p;
    __atomic_add_fetch(&live_dev_allocs, 1, __ATOMIC_SEQ_CST);
    return OK;
}
CUresult cuMemFree_v2(CUdeviceptr d) {
    NEED_CTX();
    free((void *)(uintptr_t)d);
    __atomic_sub_fetch(&live_dev_allocs, 1, __ATOMIC_SEQ_CST);
    return OK;
}

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
