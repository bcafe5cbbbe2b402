/* Groups: the configuration from the environment, creation over a device
 * list (each member's comm buffers), destruction (a group whose member never
 * came back is kept), the accessors, and shrinking to the survivors.
 * Running a group (td_group_run) and its error state are in group_run.c. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "device/spec.h"

#define MAX_SMALL (4u << 20)
#define MIN_SMALL (64u << 10)

/* Configuration ------------------------------------------------------------- */

/* Long enough for a member's first passes: a device that compiles its
 * kernels at first launch keeps its peers waiting meanwhile (PoCL, with an
 * empty kernel cache, took 20 s for the MNIST MLP's on a 2-core machine,
 * and more than 30 s with the machine busy). */
#define DEFAULT_TIMEOUT_MS 300000

static int env_timeout_ms(void) {
    const char *s = getenv("TANDEM_COMM_TIMEOUT_MS");
    long v;
    char *end;
    if (!s || !*s)
        return DEFAULT_TIMEOUT_MS;
    v = strtol(s, &end, 10);
    if (*end || v <= 0 || v > 86400000) {
        TD_LOG_WARN("TANDEM_COMM_TIMEOUT_MS=%s is not a number of milliseconds; using %d", s,
                    DEFAULT_TIMEOUT_MS);
        return DEFAULT_TIMEOUT_MS;
    }
    return (int)v;
}

static size_t env_switch_bytes(void) {
    const char *s = getenv("TANDEM_ALLREDUCE_SWITCH_BYTES");
    uint64_t v;
    if (!s || !*s)
        return TD_COMM_DEFAULT_SWITCH;
    if (td__parse_bytes(s, &v) != 0) {
        TD_LOG_WARN("TANDEM_ALLREDUCE_SWITCH_BYTES=%s is not a size; using %u", s,
                    TD_COMM_DEFAULT_SWITCH);
        return TD_COMM_DEFAULT_SWITCH;
    }
    return (size_t)v;
}

int td_group_timeout_ms(const td_group *g) {
    return g->timeout_ms;
}

int td_group_shares_cores(const td_group *g) {
    return g && g->spin_rounds <= 2;
}

const char *td_group_transport(const td_group *g) {
    if (!g)
        return "none";
    return g->tr->name;
}

/* Creation ------------------------------------------------------------------ */

static td_status member_init(td_group *g, td__member *m) {
    td_status st;
    size_t fifo_bytes = (size_t)TD_COMM_FIFO * g->chunk_bytes;
    m->host_memory = (td_device_caps(m->dev) & TD_DEVICE_CAP_HOST_MEMORY) != 0;
    if (m->host_memory) {
        /* Comm buffers live in the member's own memory (and count against
         * its budget), as NCCL's live on the GPU. */
        if ((st = td_buffer_alloc(m->dev, 2 * g->small_bytes, &m->small_buf)) != TD_OK)
            return st;
        m->small[0] = td__buffer_ptr(m->small_buf);
        if (g->nlocal > 2 && (st = td_buffer_alloc(m->dev, fifo_bytes, &m->fifo_buf)) != TD_OK)
            return st;
        m->fifo = m->fifo_buf ? td__buffer_ptr(m->fifo_buf) : NULL;
    } else {
        /* Other devices are staged through host memory (collectives.c). */
        if (!(m->small[0] = td__aligned_alloc(2 * g->small_bytes, "collective slots")))
            return TD_ERR_OUT_OF_MEMORY;
        if (g->nlocal > 2 && !(m->fifo = td__aligned_alloc(fifo_bytes, "a ring FIFO")))
            return TD_ERR_OUT_OF_MEMORY;
    }
    m->small[1] = (char *)m->small[0] + g->small_bytes;
    if (!(m->temp = td__aligned_alloc(g->chunk_bytes, "a collective's chunk")))
        return TD_ERR_OUT_OF_MEMORY;
    return TD_OK;
}

static void member_deinit(td__member *m) {
    if (!m->dev)
        return;
    td__engine_stop(m);
    if (m->host_memory) {
        td_buffer_free(m->small_buf);
        td_buffer_free(m->fifo_buf);
    } else {
        free(m->small[0]);
        free(m->fifo);
    }
    free(m->temp);
}

/* Whether a thread may still use m: one of its collectives never ended (a
 * member stuck for good), or a run left its host thread behind. */
static int member_in_use(td__member *m) {
    return m->dev && (atomic_load(&m->busy_since) != 0 || td__device_is_left_behind(m->dev));
}

/* Groups a thread may still use, kept allocated (and reachable) to the end. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static td_group *kept[64];
static int nkept;

/* Keeps g, deinitialising only the members nobody uses, when a thread may
 * still use one of them; 1 when it did. */
static int keep_if_in_use(td_group *g) {
    int in_use = 0;
    for (int k = 0; g->members && k < g->nlocal; k++)
        in_use |= member_in_use(&g->members[k]);
    if (!in_use)
        return 0;
    for (int k = 0; k < g->nlocal; k++)
        if (!member_in_use(&g->members[k]))
            member_deinit(&g->members[k]);
    pthread_mutex_lock(&kept_lock);
    if (nkept < (int)(sizeof kept / sizeof *kept))
        kept[nkept++] = g;
    pthread_mutex_unlock(&kept_lock);
    /* Its devices too (when the group opened them): the stuck thread still
     * reads its member's device, so closing it would free that under it. */
    TD_LOG_WARN("a group whose member never came back stays allocated while its thread may use it");
    return 1;
}

void td_group_destroy(td_group *g) {
    if (!g || keep_if_in_use(g))
        return;
    for (int k = 0; g->members && k < g->nlocal; k++)
        member_deinit(&g->members[k]);
    if (g->tr && g->tr->release)
        g->tr->release(g);
    free(g->members);
    free(g->slots);
    td__fault_release(g);
    pthread_mutex_destroy(&g->fail_lock);
    td_device_list_destroy(g->owned_list);
    free(g);
}

/* Whether the members' host threads contend for cores: more members than
 * this process may use CPUs (mpirun binds each process to one), or two
 * devices bound to a common core (cpu*3 on two cores; the two survivors of
 * it that share one). */
static int members_share_cores(td_device *const *devs, size_t n) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        cpus = CPU_COUNT(&set);
    if ((long)n > cpus)
        return 1;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (td__device_cpus_overlap(devs[i], devs[j]))
                return 1;
    return 0;
}

static td_status group_create(td_device *const *devs, size_t n, const td_group_config *cfg_in,
                              const td_group *parent, td_group **out) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    td_status st;
    *out = NULL;
    if (cfg_in)
        cfg = *cfg_in;
    if (n == 0 && cfg.transport != TD_TRANSPORT_MPI)
        return td__error(TD_ERR_INVALID_ARG, "td_group_create: no devices");
    if (n > 4096)
        return td__error(TD_ERR_INVALID_ARG, "td_group_create: %zu devices (4096 at most)", n);
    g = td__aligned_alloc(sizeof *g, "a group");
    if (g)
        memset(g, 0, sizeof *g);
    if (!g)
        return TD_ERR_OUT_OF_MEMORY;
    pthread_mutex_init(&g->fail_lock, NULL);
    atomic_init(&g->aborted, 0);
    atomic_init(&g->running, 0);
    for (int i = 0; i < 2; i++) {
        atomic_init(&g->work_next[i], 0);
        atomic_init(&g->work_done[i], 0);
    }
    g->fail_rank = -1;
    g->mpi_parent = parent;
    g->cfg = cfg;
    g->cfg.fault = NULL; /* borrowed; the plan keeps the text */
    g->nlocal = (int)n;
    g->size = (int)n;
    g->timeout_ms = cfg.timeout_ms > 0 ? cfg.timeout_ms : env_timeout_ms();
    g->switch_bytes = cfg.switch_bytes ? cfg.switch_bytes : env_switch_bytes();
    g->small_bytes = g->switch_bytes < MIN_SMALL   ? MIN_SMALL
                     : g->switch_bytes > MAX_SMALL ? MAX_SMALL
                                                   : (g->switch_bytes + 63) & ~(size_t)63;
    g->chunk_bytes = cfg.chunk_bytes ? (cfg.chunk_bytes + 7) & ~(size_t)7 : TD_COMM_DEFAULT_CHUNK;
    g->algorithm = cfg.algorithm;
    /* Members that share cores: a waiting member must give its core away
     * soon, since the peer it waits for may be queued behind it. */
    g->spin_rounds = members_share_cores(devs, n) ? 2 : 4096;
    TD_TRY(td__transport_choose(cfg.transport, devs, n, &g->tr));
    TD_TRY(td__fault_parse(g, cfg.fault ? cfg.fault : getenv("TANDEM_FAULT"), devs, n));

    g->members = td__calloc(sizeof *g->members * (n ? n : 1), "group members");
    if (!g->members) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    g->slots = td__aligned_alloc(sizeof *g->slots * (n ? n : 1), "group slots");
    if (!g->slots) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    memset(g->slots, 0, sizeof *g->slots * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        atomic_init(&g->slots[i].posted, 0);
        atomic_init(&g->slots[i].prog, 0);
    }
    if (g->tr->span)
        TD_TRY(g->tr->span(g)); /* sets size and rank0 */
    for (size_t i = 0; i < n; i++) {
        td__member *m = &g->members[i];
        m->g = g;
        m->local = (int)i;
        m->rank = g->rank0 + (int)i;
        m->dev = devs[i];
        atomic_init(&m->failed, 0);
        atomic_init(&m->busy_since, 0);
        atomic_init(&m->busy_seq, 0);
        atomic_init(&m->busy_kind, 0);
        atomic_init(&m->async_issued, 0);
        atomic_init(&m->async_done, 0);
        for (int r = 0; r < TD_COMM_RECORD; r++)
            atomic_init(&m->record[r].seq, 0);
        for (size_t j = 0; j < i; j++)
            if (devs[j] == devs[i]) {
                st = td__error(TD_ERR_INVALID_ARG, "td_group_create: %s is listed twice",
                               td_device_name(devs[i]));
                goto fail;
            }
        TD_TRY(member_init(g, m));
    }
    td__fault_attach(g);
    if (g->tr->connect)
        TD_TRY(g->tr->connect(g));
    *out = g;
    return TD_OK;
fail:
    td_group_destroy(g);
    return st;
}

td_status td_group_create(td_device_list *devices, const td_group_config *cfg, td_group **out) {
    size_t n = td_device_list_count(devices);
    td_device **devs;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_group_create: out is NULL");
    *out = NULL;
    devs = td__calloc(sizeof *devs * (n ? n : 1), "a device array");
    if (!devs)
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++)
        devs[i] = td_device_list_get(devices, i);
    st = group_create(devs, n, cfg, NULL, out);
    free(devs);
    return st;
}

td_status td_group_create_devices(td_device *const *devs, size_t n, const td_group_config *cfg,
                                  td_group **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_group_create_devices: out is NULL");
    *out = NULL;
    if (n && !devs)
        return td__error(TD_ERR_INVALID_ARG, "td_group_create_devices: devs is NULL");
    return group_create(devs, n, cfg, NULL, out);
}

td_status td_group_create_spec(const char *spec, const td_group_config *cfg, td_group **out) {
    td_device_list *list = NULL;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_group_create_spec: out is NULL");
    *out = NULL;
    if ((st = td_devices_open(spec, &list)) != TD_OK)
        return st;
    if ((st = td_group_create(list, cfg, out)) != TD_OK) {
        td_device_list_destroy(list);
        return st;
    }
    (*out)->owned_list = list;
    return TD_OK;
}

int td_group_size(const td_group *g) {
    return g ? g->size : 0;
}

int td_group_local_size(const td_group *g) {
    return g ? g->nlocal : 0;
}

td_device *td_group_device(const td_group *g, int rank) {
    if (!g || rank < g->rank0 || rank >= g->rank0 + g->nlocal)
        return NULL;
    return g->members[rank - g->rank0].dev;
}

int td_group_rank_of(const td_group *g, const td_device *dev) {
    for (int k = 0; g && dev && k < g->nlocal; k++)
        if (g->members[k].dev == dev)
            return g->rank0 + k;
    return -1;
}

int td_group_member_failed(const td_group *g, int rank) {
    if (!g || rank < g->rank0 || rank >= g->rank0 + g->nlocal)
        return 0;
    return atomic_load(&g->members[rank - g->rank0].failed);
}

size_t td_group_switch_bytes(const td_group *g) {
    return g ? g->switch_bytes : 0;
}

/* Shrinking ----------------------------------------------------------------- */

/* Every member of g was lost: says which, as users name them. */
static td_status none_left(const td_group *g) {
    char names[512] = "";
    size_t used = 0;
    for (int k = 0; k < g->nlocal && used + 1 < sizeof names; k++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s",
                                 k == 0               ? ""
                                 : k == g->nlocal - 1 ? " and "
                                                      : ", ",
                                 td_device_name(g->members[k].dev));
    return td__error(TD_ERR_DEVICE_LOST, "no device is left: %s %s lost", names,
                     g->nlocal == 1 ? "was" : "were");
}

td_status td_group_shrink(td_group *g, const int *exclude, size_t n_exclude, td_group **out) {
    td_device **devs = NULL;
    unsigned char *gone = NULL;
    td_group_config cfg;
    size_t n = 0;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_group_shrink: out is NULL");
    *out = NULL;
    if (!g || (n_exclude && !exclude))
        return td__error(TD_ERR_INVALID_ARG, "td_group_shrink: group or exclude list is NULL");
    gone = td__calloc((size_t)g->size, "a shrink mask");
    devs = td__calloc(sizeof *devs * (size_t)(g->nlocal + 1), "a device array");
    if (!gone || !devs) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (size_t i = 0; i < n_exclude; i++) {
        if (exclude[i] < 0 || exclude[i] >= g->size) {
            st = td__error(TD_ERR_INVALID_ARG, "td_group_shrink: rank %d is not in the group of %d",
                           exclude[i], g->size);
            goto fail;
        }
        gone[exclude[i]] = 1;
    }
    if (n_exclude == 0)
        for (int k = 0; k < g->nlocal; k++)
            if (td_group_member_failed(g, g->members[k].rank))
                gone[g->members[k].rank] = 1;
    if (g->tr->agree_failed)
        TD_TRY(g->tr->agree_failed(g, gone));
    for (int k = 0; k < g->nlocal; k++)
        if (!gone[g->members[k].rank])
            devs[n++] = g->members[k].dev;
    cfg = g->cfg;
    cfg.timeout_ms = g->timeout_ms;
    cfg.switch_bytes = g->switch_bytes;
    cfg.chunk_bytes = g->chunk_bytes;
    cfg.fault = ""; /* it shares g's plan instead (below) */
    if (n == 0 && !g->tr->spans_processes) {
        st = none_left(g);
        goto fail;
    }
    TD_TRY(group_create(devs, n, &cfg, g, out));
    (*out)->mpi_parent = NULL;
    td__fault_share(g, *out);
    if (n == 0) {
        /* MPI: this process took part in the split but has no member left. */
        td_group_destroy(*out);
        *out = NULL;
        st = none_left(g);
        goto fail;
    }
    free(devs);
    free(gone);
    return TD_OK;
fail:
    free(devs);
    free(gone);
    return st;
}
