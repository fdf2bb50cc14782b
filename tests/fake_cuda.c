/*
 * FAKE CUDA driver (libcuda) for tests on machines without a GPU. NOT a GPU driver.
 *
 * Exports the few driver-API symbols the GPU fixtures (service/example/gpu/repro.py) call,
 * with the real signatures and CUresult codes, and behaves like this:
 *
 *   cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet, cuDeviceGetName,
 *   cuDeviceTotalMem_v2, cuGetErrorName, cuGetErrorString:
 *       one device, "FAKE CUDA device", FAKE_TOTAL_MIB of "device memory".
 *   cuCtxCreate_v2 / cuCtxDestroy_v2:
 *       a context; it "uses" FAKE_CONTEXT_MIB of device memory, as a real context does.
 *   cuMemAlloc_v2 / cuMemFree_v2:
 *       device memory is only a counter (no host memory is used); beyond the total,
 *       CUDA_ERROR_OUT_OF_MEMORY, as a full GPU answers.
 *   cuMemHostAlloc / cuMemFreeHost:
 *       real pages: mmap(MAP_SHARED | MAP_ANONYMOUS), every page touched, so host RSS
 *       grows as *shared* memory (RssShmem), the way pinned host memory is expected to.
 *
 * So that a FAKE NVML (tests/fake_nvml.py published mode, tests/fake_libnvml.c) can report
 * per-process device memory, the library publishes this process's device usage (context +
 * allocations, in bytes, one decimal line) in the file <dir>/<nsino>.<nspid> after every
 * change, written to a temporary name (.<nsino>.<nspid>.tmp) and renamed so a reader never
 * sees half a number; cuCtxDestroy_v2 removes it. <dir> is $LEAKBISECT_FAKE_CUDA_DIR, else
 * the FAKE_USAGE_DIR compiled in; empty means "do not publish".
 *
 * The name is this process's identity as its own PID namespace knows it: <nsino> is the
 * inode of its PID namespace (stat("/proc/self/ns/pid").st_ino, the namespace's identity
 * whichever /proc is mounted) and <nspid> is getpid() there. A trial runs in a PID
 * namespace of its own (runners/shim.py: the script is pid 2 inside), while NVML's reader
 * (the runner's sampler) is on the host and, like a real NVIDIA driver, reports host
 * (initial-namespace) pids: the FAKE NVML resolves the pair to the host pid through the
 * host's /proc (the process of that namespace whose NSpid ends with <nspid>). Without a
 * namespace <nsino> is the host's own and <nspid> the host pid.
 *
 * Environment (read by cuInit):
 *   LEAKBISECT_FAKE_CUDA_DIR          where to publish usage (see above)
 *   LEAKBISECT_FAKE_CUDA_TOTAL_MIB    device memory (default FAKE_TOTAL_MIB)
 *   LEAKBISECT_FAKE_CUDA_CONTEXT_MIB  a context's footprint (default FAKE_CONTEXT_MIB)
 *   LEAKBISECT_FAKE_CUDA_FAIL         "SYMBOL=CODE": that call returns CODE (error paths)
 *
 * Single-threaded, as the fixtures are. Build: tests/fake_cuda.py (gcc -shared -fPIC).
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef FAKE_USAGE_DIR
#define FAKE_USAGE_DIR ""
#endif
#ifndef FAKE_TOTAL_MIB
#define FAKE_TOTAL_MIB 4096
#endif
#ifndef FAKE_CONTEXT_MIB
#define FAKE_CONTEXT_MIB 64
#endif

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct fake_ctx *CUcontext;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
};

#define MIB (1024ULL * 1024ULL)
#define MAX_BLOCKS 16384

struct fake_ctx { int alive; };
struct block { uintptr_t addr; size_t size; };

static int initialized;
static struct fake_ctx the_ctx;
static unsigned long long total_bytes, context_bytes, device_used;
static CUdeviceptr next_dptr = 0x7f0000000000ULL;
static struct block device_blocks[MAX_BLOCKS], host_blocks[MAX_BLOCKS];
static char usage_dir[4096];
static char fail_symbol[128];
static int fail_code;

static unsigned long long env_mib(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    return (v && *v) ? strtoull(v, NULL, 10) * MIB : dflt * MIB;
}

/* The injected failure for `symbol`, or CUDA_SUCCESS. */
static CUresult injected(const char *symbol) {
    return (fail_symbol[0] && strcmp(fail_symbol, symbol) == 0) ? fail_code : CUDA_SUCCESS;
}

/* This process as its PID namespace knows it: "<nsino>.<nspid>" (see the header). */
static int identity(char *out, size_t len) {
    struct stat ns;
    if (stat("/proc/self/ns/pid", &ns) != 0) return 0;
    snprintf(out, len, "%llu.%d", (unsigned long long)ns.st_ino, (int)getpid());
    return 1;
}

static void publish(void) {
    if (!usage_dir[0]) return;
    char id[64], path[4200], tmp[4200];
    if (!identity(id, sizeof id)) return;
    snprintf(path, sizeof path, "%s/%s", usage_dir, id);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", usage_dir, id);
    if (!the_ctx.alive) { unlink(path); return; }
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%llu\n", device_used);
    fclose(f);
    rename(tmp, path);
}

static int put_block(struct block *table, uintptr_t addr, size_t size) {
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (table[i].addr == 0) { table[i].addr = addr; table[i].size = size; return 1; }
    return 0;
}

static size_t take_block(struct block *table, uintptr_t addr) {
    for (int i = 0; i < MAX_BLOCKS; i++)
        if (table[i].addr == addr) { size_t s = table[i].size; table[i].addr = 0; return s; }
    return 0;
}

CUresult cuInit(unsigned int flags) {
    (void)flags;
    const char *fail = getenv("LEAKBISECT_FAKE_CUDA_FAIL");
    if (fail && strchr(fail, '=')) {
        size_t n = (size_t)(strchr(fail, '=') - fail);
        if (n >= sizeof fail_symbol) n = sizeof fail_symbol - 1;
        memcpy(fail_symbol, fail, n);
        fail_symbol[n] = 0;
        fail_code = atoi(strchr(fail, '=') + 1);
    }
    CUresult r = injected("cuInit");
    if (r) return r;
    const char *dir = getenv("LEAKBISECT_FAKE_CUDA_DIR");
    snprintf(usage_dir, sizeof usage_dir, "%s", dir ? dir : FAKE_USAGE_DIR);
    total_bytes = env_mib("LEAKBISECT_FAKE_CUDA_TOTAL_MIB", FAKE_TOTAL_MIB);
    context_bytes = env_mib("LEAKBISECT_FAKE_CUDA_CONTEXT_MIB", FAKE_CONTEXT_MIB);
    initialized = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 12040;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = injected("cuDeviceGet");
    if (r) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "FAKE CUDA device");
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)total_bytes;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = injected("cuCtxCreate_v2");
    if (r) return r;
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (the_ctx.alive) return CUDA_ERROR_INVALID_VALUE; /* one context is all the fixtures use */
    the_ctx.alive = 1;
    device_used = context_bytes;
    *pctx = &the_ctx;
    publish();
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != &the_ctx || !the_ctx.alive) return CUDA_ERROR_INVALID_CONTEXT;
    the_ctx.alive = 0;
    device_used = 0;
    memset(device_blocks, 0, sizeof device_blocks);
    publish();
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!the_ctx.alive) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = injected("cuMemAlloc_v2");
    if (r) return r;
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t rounded = (bytesize + 2 * MIB - 1) / (2 * MIB) * (2 * MIB); /* 2 MiB pages */
    if (device_used + rounded > total_bytes) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!put_block(device_blocks, (uintptr_t)next_dptr, rounded)) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = next_dptr;
    next_dptr += rounded;
    device_used += rounded;
    publish();
    return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!the_ctx.alive) return CUDA_ERROR_INVALID_CONTEXT;
    size_t size = take_block(device_blocks, (uintptr_t)dptr);
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    device_used -= size;
    publish();
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags) {
    (void)flags;
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!the_ctx.alive) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult r = injected("cuMemHostAlloc");
    if (r) return r;
    if (!pp || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, bytesize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 0x5a, bytesize); /* resident at once, as page-locked memory is */
    if (!put_block(host_blocks, (uintptr_t)p, bytesize)) {
        munmap(p, bytesize);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
    if (!initialized) return CUDA_ERROR_NOT_INITIALIZED;
    size_t size = take_block(host_blocks, (uintptr_t)p);
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    munmap(p, size);
    return CUDA_SUCCESS;
}

static const char *error_name(CUresult code) {
    switch (code) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult code, const char **name) {
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    *name = error_name(code);
    return *name ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult code, const char **text) {
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    *text = error_name(code) ? "FAKE CUDA driver error" : NULL;
    return *text ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
