/*
 * FAKE libnvidia-ml.so.1 for tests on machines without a GPU. NOT NVML.
 *
 * The real pynvml module (nvidia-ml-py) loads it like the real library, so tests exercise
 * pynvml's own ctypes marshalling together with runners/nvml.py: the struct layouts of the
 * v1, v2 and v3 process queries, NVML_VALUE_NOT_AVAILABLE, missing symbols. One device,
 * "FAKE NVML device", FAKE_TOTAL_MIB of memory.
 *
 * Its compute processes are what the FAKE CUDA driver (tests/fake_cuda.c) publishes: every
 * file <dir>/<pid> holding a decimal byte count, for pids that are alive. <dir> is
 * $LEAKBISECT_FAKE_NVML_DIR, else the FAKE_USAGE_DIR compiled in. Used memory is their sum.
 * $LEAKBISECT_FAKE_NVML_UNKNOWN=1 reports every process's memory as NVML_VALUE_NOT_AVAILABLE.
 * The graphics and MPS lists are empty.
 *
 * Compiled with -DFAKE_NO_V3 / -DFAKE_NO_V2 the _v3 / _v2 process queries are left out, as
 * on older drivers; the unsuffixed (v1) queries are always there.
 * Build: tests/fake_cuda.py build_fake_libnvml (gcc -shared -fPIC, soname libnvidia-ml.so.1).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FAKE_USAGE_DIR
#define FAKE_USAGE_DIR ""
#endif
#ifndef FAKE_TOTAL_MIB
#define FAKE_TOTAL_MIB 4096
#endif

typedef int nvmlReturn_t;
typedef struct fake_device { int index; } *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
};

#define MIB (1024ULL * 1024ULL)
#define MAX_PROCS 256
#define NOT_AVAILABLE (~0ULL)

static int initialized;
static struct fake_device the_device = {0};

struct proc { unsigned int pid; unsigned long long used; };

/* The live publishers: up to MAX_PROCS of them, sorted by nothing in particular. */
static int read_procs(struct proc *out) {
    const char *dir = getenv("LEAKBISECT_FAKE_NVML_DIR");
    if (!dir) dir = FAKE_USAGE_DIR;
    if (!dir[0]) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAX_PROCS) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        if (kill((pid_t)pid, 0) != 0 && errno != EPERM) continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned long long used;
        int ok = fscanf(f, "%llu", &used) == 1;
        fclose(f);
        if (ok) { out[n].pid = (unsigned int)pid; out[n].used = used; n++; }
    }
    closedir(d);
    return n;
}

static int unknown_memory(void) {
    const char *v = getenv("LEAKBISECT_FAKE_NVML_UNKNOWN");
    return v && strcmp(v, "1") == 0;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; initialized = 1; return 0; }
nvmlReturn_t nvmlInit_v2(void) { initialized = 1; return 0; }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return 0; }

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    default: return "FAKE NVML error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &the_device;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(char *buf, unsigned int len, const char *text) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!buf) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(buf, text);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    return d == &the_device ? copy_text(name, len, "FAKE NVML device") : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    return d == &the_device ? copy_text(uuid, len, "GPU-fa4e0000-0000-0000-0000-000000000000")
                            : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int len) {
    return copy_text(version, len, "999.99.99-FAKE");
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int len) {
    return copy_text(version, len, "12.999.99-FAKE");
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = 12040;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (d != &the_device || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc procs[MAX_PROCS];
    int n = read_procs(procs);
    unsigned long long used = 0;
    for (int i = 0; i < n; i++) used += procs[i].used;
    memory->total = FAKE_TOTAL_MIB * MIB;
    memory->used = used;
    memory->free = memory->total > used ? memory->total - used : 0;
    return NVML_SUCCESS;
}

/* The size protocol every process query shares: count in, count out, INSUFFICIENT_SIZE. */
static nvmlReturn_t size_check(unsigned int *count, int n, const void *infos) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if ((unsigned int)n > *count || (!infos && n > 0)) { *count = (unsigned int)n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

static nvmlReturn_t processes_v1(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos, int listed) {
    if (d != &the_device) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc procs[MAX_PROCS];
    int n = listed ? read_procs(procs) : 0;
    nvmlReturn_t r = size_check(count, n, infos);
    if (r != NVML_SUCCESS) return r;
    for (int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = unknown_memory() ? NOT_AVAILABLE : procs[i].used;
    }
    return NVML_SUCCESS;
}

__attribute__((unused)) static nvmlReturn_t processes_v2(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v2_t *infos, int listed) {
    if (d != &the_device) return NVML_ERROR_INVALID_ARGUMENT;
    struct proc procs[MAX_PROCS];
    int n = listed ? read_procs(procs) : 0;
    nvmlReturn_t r = size_check(count, n, infos);
    if (r != NVML_SUCCESS) return r;
    for (int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = unknown_memory() ? NOT_AVAILABLE : procs[i].used;
        infos[i].gpuInstanceId = 0xFFFFFFFFu; /* not MIG */
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    return NVML_SUCCESS;
}

#define QUERIES(KIND, LISTED)                                                                     \
    nvmlReturn_t nvmlDeviceGet##KIND##RunningProcesses(nvmlDevice_t d, unsigned int *c,          \
                                                       nvmlProcessInfo_v1_t *p) {                \
        return processes_v1(d, c, p, LISTED);                                                    \
    }                                                                                            \
    V2(KIND, LISTED)                                                                             \
    V3(KIND, LISTED)

#ifdef FAKE_NO_V2
#define V2(KIND, LISTED)
#else
#define V2(KIND, LISTED)                                                                          \
    nvmlReturn_t nvmlDeviceGet##KIND##RunningProcesses_v2(nvmlDevice_t d, unsigned int *c,       \
                                                          nvmlProcessInfo_v2_t *p) {             \
        return processes_v2(d, c, p, LISTED);                                                    \
    }
#endif
#ifdef FAKE_NO_V3
#define V3(KIND, LISTED)
#else
#define V3(KIND, LISTED)                                                                          \
    nvmlReturn_t nvmlDeviceGet##KIND##RunningProcesses_v3(nvmlDevice_t d, unsigned int *c,       \
                                                          nvmlProcessInfo_v2_t *p) {             \
        return processes_v2(d, c, p, LISTED);                                                    \
    }
#endif

QUERIES(Compute, 1)
QUERIES(Graphics, 0)
QUERIES(MPSCompute, 0)
