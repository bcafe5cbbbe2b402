/* The CPU backend: logical devices that each own a set of logical CPUs, a
 * host thread pinned to them, and their own memory accounting. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backends.h"
#include "backend/cpu/cpu-impl.h"
#include "backend/cpu/cpu-kernels.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/fpmode.h"
#include "core/log.h"

/* The machine as hwloc sees it, loaded once and then only read. */
static struct {
    pthread_once_t once;
    hwloc_topology_t topo;
    int npus;
    int pus[TD_CPU_MAX_PUS]; /* the logical CPUs this process may use */
    char error[256];
} machine = {.once = PTHREAD_ONCE_INIT};

static void machine_load(void) {
    hwloc_bitmap_t allowed = NULL;
    int pu;
    /* Each device splits its GEMMs over its own cores; BLAS stays on the
     * calling thread (see CMakeLists.txt for why not the serial build). */
    openblas_set_num_threads(1);
    if (hwloc_topology_init(&machine.topo) != 0 || hwloc_topology_load(machine.topo) != 0) {
        snprintf(machine.error, sizeof machine.error, "hwloc could not read the CPU topology");
        return;
    }
    allowed = hwloc_bitmap_alloc();
    /* Respect taskset and cgroup limits: only the CPUs we may run on. */
    if (!allowed || hwloc_get_cpubind(machine.topo, allowed, HWLOC_CPUBIND_PROCESS) != 0)
        hwloc_bitmap_copy(allowed, hwloc_topology_get_allowed_cpuset(machine.topo));
    hwloc_bitmap_foreach_begin(pu, allowed) {
        if (machine.npus < TD_CPU_MAX_PUS)
            machine.pus[machine.npus++] = pu;
    }
    hwloc_bitmap_foreach_end();
    hwloc_bitmap_free(allowed);
    if (machine.npus == 0)
        snprintf(machine.error, sizeof machine.error,
                 "no logical CPU is available to this process");
}

static int machine_ready(void) {
    pthread_once(&machine.once, machine_load);
    return machine.npus > 0;
}

static const char *machine_info(const char *key) {
    hwloc_obj_t root = hwloc_get_root_obj(machine.topo);
    const char *v = root ? hwloc_obj_get_info_by_name(root, key) : NULL;
    if (!v) {
        hwloc_obj_t pkg = hwloc_get_obj_by_type(machine.topo, HWLOC_OBJ_PACKAGE, 0);
        v = pkg ? hwloc_obj_get_info_by_name(pkg, key) : NULL;
    }
    return v ? v : "";
}

static int cpu_count(void) {
    return machine_ready() ? machine.npus : 0;
}

static void cpu_describe(char *buf, size_t n) {
    if (!machine_ready())
        snprintf(buf, n, "cpu: none (%s)", machine.error);
    else if (machine.npus == 1)
        snprintf(buf, n, "cpu: cpu:0 (1 logical CPU)");
    else
        snprintf(buf, n, "cpu: cpu:0 ... cpu:%d (%d logical CPUs)", machine.npus - 1, machine.npus);
}

static void cpu_close(void *ctx) {
    cpu_device *cd = ctx;
    if (!cd)
        return;
    td__cpu_pool_destroy(cd->pool);
    hwloc_bitmap_free(cd->set);
    free(cd);
}

/* Makes a device owning `n` logical CPUs starting at position `first` of the
 * allowed list (wrapping, so more devices than cores share cores). */
static td_status add_device(td_device_sink *sink, const char *name, int first, int n,
                            const td_device_options *opts) {
    cpu_device *cd = td__calloc(sizeof *cd, "a CPU device");
    if (!cd)
        return TD_ERR_OUT_OF_MEMORY;
    cd->set = hwloc_bitmap_alloc();
    if (!cd->set) {
        free(cd);
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory creating %s", name);
    }
    if (n > machine.npus)
        n = machine.npus;
    cd->npus = n;
    for (int i = 0; i < n; i++) {
        cd->pus[i] = machine.pus[(first + i) % machine.npus];
        hwloc_bitmap_set(cd->set, (unsigned)cd->pus[i]);
    }
    cd->slowdown = opts->has_slowdown ? opts->slowdown : 1.0;
    cd->denormals = opts->has_denormals ? opts->denormals : (int)td__denormals_default();
    return td__device_sink_add(sink, &td__cpu_backend, name, cd, opts);
}

static td_status cpu_open(const td_spec_item *item, td_device_sink *sink) {
    const td_device_options *o = &item->opts;
    char name[32];
    td_status st;
    if (!machine_ready())
        return td__error(TD_ERR_NO_DEVICE, "cpu: %s", machine.error);
    if (o->has_split)
        return td__error(TD_ERR_INVALID_ARG,
                         "device spec item '%s': CPU devices are split with 'cpu*N', not {split=N}",
                         item->text);
    switch (item->index_kind) {
    case TD_SPEC_INDEX_ONE:
        if (item->index >= machine.npus)
            return td__error(TD_ERR_NO_DEVICE,
                             "there is no cpu:%d: this process may use %d logical CPU%s (cpu:0 to "
                             "cpu:%d)",
                             item->index, machine.npus, machine.npus == 1 ? "" : "s",
                             machine.npus - 1);
        snprintf(name, sizeof name, "cpu:%d", item->index);
        return add_device(sink, name, item->index, o->has_cores ? o->cores : 1, o);
    case TD_SPEC_INDEX_ALL:
        for (int i = 0; i < machine.npus; i++) {
            snprintf(name, sizeof name, "cpu:%d", i);
            if ((st = add_device(sink, name, i, o->has_cores ? o->cores : 1, o)) != TD_OK)
                return st;
        }
        return TD_OK;
    case TD_SPEC_INDEX_NONE:
        if (item->count == 1)
            return add_device(sink, "cpu", 0, o->has_cores ? o->cores : machine.npus, o);
        if (item->count > machine.npus)
            TD_LOG_INFO("%d CPU devices on %d logical CPUs: devices share cores", item->count,
                        machine.npus);
        for (int k = 0; k < item->count; k++) {
            /* An even split: device k owns [k*P/K, (k+1)*P/K), at least one. */
            int first = (int)((long)k * machine.npus / item->count);
            int last = (int)((long)(k + 1) * machine.npus / item->count);
            int n = last > first ? last - first : 1;
            snprintf(name, sizeof name, "cpu:%d", k);
            if ((st = add_device(sink, name, first, o->has_cores ? o->cores : n, o)) != TD_OK)
                return st;
        }
        return TD_OK;
    }
    return td__error(TD_ERR_INTERNAL, "cpu: unknown index kind");
}

static td_status cpu_thread_init(void *ctx) {
    cpu_device *cd = ctx;
    /* Pinning can be refused (containers, other OSes); the device still works. */
    cd->pinned = hwloc_set_cpubind(machine.topo, cd->set, HWLOC_CPUBIND_THREAD) == 0;
    if (!cd->pinned)
        TD_LOG_DEBUG("could not pin a CPU device's host thread to its cores");
    /* Before the helpers start, which set it again on themselves. BLAS runs
     * on these threads (held to one thread: see machine_load), so its GEMMs
     * flush too. */
    if (!td__denormals_set((td__denormals)cd->denormals))
        TD_LOG_DEBUG("this build cannot flush subnormal numbers to zero");
    return td__cpu_pool_create(cd, machine.topo);
}

static int read_clock_mhz(int pu) {
    char path[128];
    FILE *f;
    long khz = 0;
    double mhz = 0;
    char line[256];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq", pu);
    if ((f = fopen(path, "r"))) {
        if (fscanf(f, "%ld", &khz) != 1)
            khz = 0;
        fclose(f);
        if (khz > 0)
            return (int)(khz / 1000);
    }
    if (!(f = fopen("/proc/cpuinfo", "r")))
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "cpu MHz : %lf", &mhz) == 1 || sscanf(line, "cpu MHz\t: %lf", &mhz) == 1)
            break;
    fclose(f);
    return (int)(mhz + 0.5);
}

static uint64_t mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static void format_pu_list(const cpu_device *cd, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < cd->npus && used + 1 < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%d", i ? "," : "", cd->pus[i]);
}

static td_status cpu_info(void *ctx, td_device_info *out) {
    cpu_device *cd = ctx;
    hwloc_bitmap_t nodes = hwloc_bitmap_alloc();
    snprintf(out->model, sizeof out->model, "%s", machine_info("CPUModel"));
    snprintf(out->vendor, sizeof out->vendor, "%s", machine_info("CPUVendor"));
    out->compute_units = cd->npus;
    out->clock_mhz = read_clock_mhz(cd->pus[0]);
    out->mem_total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    out->mem_free = mem_available();
    out->fp64 = 1;
    /* SIMD lanes hold half as many doubles as floats. */
    out->fp64_rate = 0.5;
    td__cpu_isa_string(out->isa, sizeof out->isa);
    snprintf(out->compact_kernels, sizeof out->compact_kernels, "q8_0: %s; bf16: %s",
             td__cpu_compact_path_name(TD_WEIGHTS_Q8_0, td__cpu_compact_best(TD_WEIGHTS_Q8_0)),
             td__cpu_compact_path_name(TD_WEIGHTS_BF16, td__cpu_compact_best(TD_WEIGHTS_BF16)));
    {
        int native = td__cpu_bgemm_native();
        td_compact_path q8 = td__cpu_compact_best(TD_WEIGHTS_Q8_0);
        snprintf(out->bf16, sizeof out->bf16, "%s (%s)", native ? "native" : "emulated",
                 native ? td__cpu_bgemm_path_name(1) : "widened to f32, f32 GEMM");
        if (q8 == TD_CPATH_SCALAR)
            snprintf(out->int8, sizeof out->int8, "none (C int32 sums)");
        else
            snprintf(out->int8, sizeof out->int8, "%s (%s)", q8 == TD_CPATH_EXT ? "VNNI" : "AVX2",
                     td__cpu_compact_path_name(TD_WEIGHTS_Q8_0, q8));
    }
    format_pu_list(cd, out->cores, sizeof out->cores);
    out->pinned = cd->pinned;
    out->numa_node = -1;
    if (nodes) {
        hwloc_cpuset_to_nodeset(machine.topo, cd->set, nodes);
        if (hwloc_bitmap_weight(nodes) == 1)
            out->numa_node = hwloc_bitmap_first(nodes);
        hwloc_bitmap_free(nodes);
    }
    return TD_OK;
}

/* Linux overcommits: a huge malloc can succeed and the process be killed
 * later when it touches the pages. Asking for more than the machine has is
 * refused here, while it is still a clean error. */
static td_status cpu_alloc(void *ctx, size_t nbytes, void **ptr) {
    uint64_t total = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    *ptr = NULL;
    if (nbytes > total) {
        char a[32], b[32];
        return td__error(TD_ERR_OUT_OF_MEMORY, "allocating %s exceeds this machine's memory (%s)",
                         td__format_bytes((double)nbytes, a), td__format_bytes((double)total, b));
    }
    *ptr = td__aligned_alloc(nbytes, "device memory");
    return *ptr ? TD_OK : TD_ERR_OUT_OF_MEMORY;
}

static void cpu_free(void *ctx, void *ptr) {
    free(ptr);
}

static td_status cpu_memcpy(void *ctx, void *dst, const void *src, size_t nbytes) {
    memcpy(dst, src, nbytes);
    return TD_OK;
}

/* CPU devices share one address space, so a peer copy is a memcpy run by the
 * destination's thread, as a GPU's copy engine would read its peer. */
static td_status cpu_copy_peer(void *dst_ctx, void *dst, void *src_ctx, const void *src,
                               size_t nbytes) {
    memcpy(dst, src, nbytes);
    return TD_OK;
}

static const char *cpu_bf16_path(void) {
    return td__cpu_bgemm_path_name(td__cpu_bgemm_native());
}

static void cpu_set_precision(void *ctx, td_precision p) {
    atomic_store(&((cpu_device *)ctx)->bf16, p == TD_PRECISION_BF16);
}

const td_backend_ops td__cpu_backend = {
    .api_version = TD_BACKEND_API_VERSION,
    .name = "cpu",
    .caps = TD_DEVICE_CAP_HOST_MEMORY | TD_DEVICE_CAP_HOST_CORES,
    .describe = cpu_describe,
    .count = cpu_count,
    .open = cpu_open,
    .close = cpu_close,
    .thread_init = cpu_thread_init,
    .thread_deinit = NULL,
    .info = cpu_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .write = cpu_memcpy,
    .read = cpu_memcpy,
    .copy = cpu_memcpy,
    .copy_peer = cpu_copy_peer,
    .sync = NULL,
    .kernels = &td__cpu_kernels,
    .bf16_path = cpu_bf16_path,
    .set_precision = cpu_set_precision,
};
