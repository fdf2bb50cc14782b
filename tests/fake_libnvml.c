/*
 * FAKE libnvidia-ml.so.1 for tests on machines without a GPU. NOT NVML.
 *
 * The real pynvml module (nvidia-ml-py) loads it like the real library, so tests exercise
 * pynvml's own ctypes marshalling together with runners/nvml.py: the struct layouts of the
 * v1, v2 and v3 process queries, NVML_VALUE_NOT_AVAILABLE, missing symbols. One device,
 * "FAKE NVML device", FAKE_TOTAL_MIB of memory.
 *
 * Its compute processes are what the FAKE CUDA driver (tests/fake_cuda.c) publishes: every
 * file <dir>/<nsino>.<nspid> holding a decimal byte count, where <nsino> is the inode of the
 * publisher's PID namespace and <nspid> its pid there. Like a real driver, which reports
 * host (initial-namespace) pids whatever namespace a process runs in (a trial's script is
 * pid 2 of its own namespace: runners/shim.py), it lists each one under its pid in this
 * process's /proc: the process there whose /proc/PID/ns/pid has inode <nsino> and whose
 * "NSpid:" line in /proc/PID/status ends with <nspid> (its first NSpid field). Fast path:
 * /proc/<nspid> itself, when it is that process (no namespace). A file nobody alive
 * resolves to (the process is gone), or older than its process's start (left by a dead
 * process whose namespace inode and pid were reused), is not listed. <dir> is
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
#define STALE_SLACK_S 0.05 /* two clock ticks and the uptime's rounding */
#define NOT_AVAILABLE (~0ULL)

static int initialized;
static struct fake_device the_device = {0};

struct proc { unsigned int pid; unsigned long long used; };

/* A usage file: who published it (namespace inode, pid there), what, when; its host pid. */
struct published {
    unsigned long long ino;
    long nspid;
    unsigned long long used;
    double mtime;
    long host;
};

/* "<nsino>.<nspid>" -> 1 and the two numbers; anything else (a .tmp, a stray file) -> 0. */
static int parse_name(const char *name, unsigned long long *ino, long *nspid) {
    char *end;
    if (name[0] < '0' || name[0] > '9') return 0;
    *ino = strtoull(name, &end, 10);
    if (*end != '.' || end[1] < '0' || end[1] > '9') return 0;
    *nspid = strtol(end + 1, &end, 10);
    return *end == 0 && *ino > 0 && *nspid > 0;
}

/* The inode of /proc/<pid>/ns/pid (its PID namespace), or 0 when it cannot be read. */
static unsigned long long ns_inode(long pid) {
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%ld/ns/pid", pid);
    return stat(path, &st) == 0 ? (unsigned long long)st.st_ino : 0;
}

/* /proc/<pid>/status "NSpid:": its first (this /proc's) and last (its own namespace's)
 * pids; 0 when it cannot be read (gone). */
static int nspids(long pid, long *first, long *last) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%ld/status", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6) != 0) continue;
        for (char *p = line + 6, *end;; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p) break;
            if (!found) *first = v;
            *last = v;
            found = 1;
        }
    }
    fclose(f);
    return found;
}

/* Whether host process `pid` is the publisher (inode, nspid) of `e`. */
static int is_publisher(long pid, const struct published *e) {
    long first, last;
    return ns_inode(pid) == e->ino && nspids(pid, &first, &last) && last == e->nspid;
}

/* Seconds since the epoch at which host process `pid` started, to a clock tick (10 ms);
 * < 0 when unknown. The boot time is now less /proc/uptime, not /proc/stat's whole-second
 * btime: a usage file a dead trial wrote a few hundred milliseconds before the next trial
 * (same namespace inode, same pid 2) started must still read as older than it. */
static double start_time(long pid) {
    static double boot = -1;
    char path[64], buf[1024];
    if (boot < 0) {
        FILE *f = fopen("/proc/uptime", "r");
        if (!f) return -1;
        double up;
        int ok = fscanf(f, "%lf", &up) == 1;
        fclose(f);
        if (!ok) return -1;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        boot = (double)now.tv_sec + (double)now.tv_nsec / 1e9 - up;
    }
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    /* After "pid (comm)": state (field 3) ... starttime (field 22, clock ticks since boot). */
    unsigned long long ticks;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u"
                            " %*d %*d %*d %*d %*d %*d %llu", &ticks) != 1)
        return -1;
    return boot + (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

/* Resolve every entry's host pid (0: nobody alive is its publisher): the fast path, then
 * one scan of /proc for the rest. */
static void resolve(struct published *e, int n) {
    int unresolved = 0;
    for (int i = 0; i < n; i++) {
        e[i].host = is_publisher(e[i].nspid, &e[i]) ? e[i].nspid : 0;
        if (!e[i].host) unresolved++;
    }
    if (!unresolved) return;
    DIR *d = opendir("/proc");
    if (!d) return;
    struct dirent *de;
    while (unresolved && (de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        unsigned long long ino = ns_inode(pid);
        if (!ino) continue;
        long first = 0, last = 0;
        int have = 0;
        for (int i = 0; i < n; i++) {
            if (e[i].host || e[i].ino != ino) continue;
            if (!have && !(have = nspids(pid, &first, &last))) break;
            if (last == e[i].nspid) { e[i].host = first; unresolved--; }
        }
    }
    closedir(d);
}

/* The live publishers: up to MAX_PROCS of them, under their host pids, in no particular
 * order. */
static int read_procs(struct proc *out) {
    const char *dir = getenv("LEAKBISECT_FAKE_NVML_DIR");
    if (!dir) dir = FAKE_USAGE_DIR;
    if (!dir[0]) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct published e[MAX_PROCS];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < MAX_PROCS) {
        if (!parse_name(de->d_name, &e[n].ino, &e[n].nspid)) continue;
        char path[4352];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        struct stat st;
        int ok = fstat(fileno(f), &st) == 0 && fscanf(f, "%llu", &e[n].used) == 1;
        fclose(f);
        if (!ok) continue;
        e[n].mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
        n++;
    }
    closedir(d);
    resolve(e, n);
    int listed = 0;
    for (int i = 0; i < n; i++) {
        long pid = e[i].host;
        if (pid <= 0) continue; /* gone */
        if (kill((pid_t)pid, 0) != 0 && errno != EPERM) continue;
        double started = start_time(pid);
        if (started >= 0 && e[i].mtime + STALE_SLACK_S < started) continue; /* an earlier process's */
        out[listed].pid = (unsigned int)pid;
        out[listed].used = e[i].used;
        listed++;
    }
    return listed;
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
