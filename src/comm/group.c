/* Groups: creation over a device list, td_group_run (one task per member on
 * its own host thread), the error state, and shrinking to the survivors. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/spin.h"

#define MAX_SMALL (4u << 20)
#define MIN_SMALL (64u << 10)

static _Thread_local td__member *current_member;

td__member *td__comm_current(void) {
    return current_member;
}

void td__comm_set_current(td__member *m) {
    current_member = m;
}

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
    switch (g->transport) {
    case TD_TRANSPORT_MPI: return "mpi";
    case TD_TRANSPORT_NCCL: return "nccl";
    default: return "local";
    }
}

/* Failure ------------------------------------------------------------------- */

td_status td__group_fail(td_group *g, int rank, const char *fmt, ...) {
    va_list ap;
    pthread_mutex_lock(&g->fail_lock);
    if (!atomic_load(&g->aborted)) {
        va_start(ap, fmt);
        vsnprintf(g->fail_reason, sizeof g->fail_reason, fmt, ap);
        va_end(ap);
        g->fail_rank = rank;
        g->fail_status = TD_ERR_DEVICE_LOST;
        if (rank >= g->rank0 && rank < g->rank0 + g->nlocal)
            atomic_store(&g->members[rank - g->rank0].failed, 1);
        atomic_store_explicit(&g->aborted, 1, memory_order_release);
        TD_LOG_WARN("group failed: %s", g->fail_reason);
    }
    pthread_mutex_unlock(&g->fail_lock);
    return td__group_lost(g);
}

td_status td__group_lost(td_group *g) {
    pthread_mutex_lock(&g->fail_lock);
    td__error_set_message(g->fail_reason);
    pthread_mutex_unlock(&g->fail_lock);
    return TD_ERR_DEVICE_LOST;
}

/* How long a member may stay in one collective: see td__member_stuck. */
static uint64_t stuck_ns(const td_group *g) {
    return ((uint64_t)g->timeout_ms + 1000) * 1000000u;
}

int td__member_stuck(td__member *m, uint64_t now_ns) {
    uint64_t since = atomic_load(&m->busy_since);
    return since && now_ns > since && now_ns - since > stuck_ns(m->g);
}

td_status td__member_give_up(td__member *m) {
    atomic_store(&m->failed, 1);
    return td__group_fail(m->g, m->rank,
                          "%s (rank %d) has not come back from its collective #%llu (%s) in %llu "
                          "ms: the device is stuck",
                          td_device_name(m->dev), m->rank,
                          (unsigned long long)atomic_load(&m->busy_seq),
                          td_collective_name((td_collective_kind)atomic_load(&m->busy_kind)),
                          (unsigned long long)(stuck_ns(m->g) / 1000000u));
}

td_status td_group_error(td_group *g) {
    if (!g)
        return td__error(TD_ERR_INVALID_ARG, "td_group_error: group is NULL");
    if (!atomic_load(&g->aborted))
        return TD_OK;
    return td__group_lost(g);
}

/* Creation ------------------------------------------------------------------ */

static td_status member_init(td_group *g, td__member *m) {
    td_status st;
    size_t fifo_bytes = (size_t)TD_COMM_FIFO * g->chunk_bytes;
    m->host_memory = !strcmp(m->dev->ops->name, "cpu");
    if (m->host_memory) {
        /* Comm buffers live in the member's own memory (and count against
         * its budget), as NCCL's live on the GPU. */
        if ((st = td_buffer_alloc(m->dev, 2 * g->small_bytes, &m->small_buf)) != TD_OK)
            return st;
        m->small[0] = m->small_buf->ptr;
        if (g->nlocal > 2 && (st = td_buffer_alloc(m->dev, fifo_bytes, &m->fifo_buf)) != TD_OK)
            return st;
        m->fifo = m->fifo_buf ? m->fifo_buf->ptr : NULL;
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
    return m->dev && (atomic_load(&m->busy_since) != 0 || atomic_load(&m->dev->left_behind));
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
    TD_LOG_WARN("a group whose member never came back stays allocated while its thread may use it");
    td_device_list_destroy(g->owned_list);
    return 1;
}

void td_group_destroy(td_group *g) {
    if (!g || keep_if_in_use(g))
        return;
    for (int k = 0; g->members && k < g->nlocal; k++)
        member_deinit(&g->members[k]);
#ifdef TD_HAVE_NCCL
    td__nccl_group_deinit(g);
#endif
#ifdef TD_HAVE_MPI
    td__mpi_group_deinit(g);
#endif
    free(g->members);
    free(g->slots);
    td__fault_release(g);
    pthread_mutex_destroy(&g->fail_lock);
    td_device_list_destroy(g->owned_list);
    free(g);
}

static int all_cuda(td_device *const *devs, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(devs[i]->ops->name, "cuda"))
            return 0;
    return n > 0;
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
    TD_TRY(td__fault_parse(g, cfg.fault ? cfg.fault : getenv("TANDEM_FAULT"), devs, n));

    g->transport = cfg.transport;
    if (g->transport == TD_TRANSPORT_AUTO) {
        g->transport = TD_TRANSPORT_LOCAL;
#ifdef TD_HAVE_NCCL
        if (all_cuda(devs, n) && n > 1)
            g->transport = TD_TRANSPORT_NCCL;
#endif
    }
#ifndef TD_HAVE_MPI
    if (g->transport == TD_TRANSPORT_MPI) {
        st = td__error(TD_ERR_UNSUPPORTED, "the mpi transport is not built into this tandem (no "
                                           "MPI at configure time)");
        goto fail;
    }
#endif
#ifndef TD_HAVE_NCCL
    if (g->transport == TD_TRANSPORT_NCCL) {
        st = td__error(TD_ERR_UNSUPPORTED,
                       "the nccl transport is not built into this tandem (no CUDA or NCCL)");
        goto fail;
    }
#endif
    if (g->transport == TD_TRANSPORT_NCCL && !all_cuda(devs, n)) {
        st = td__error(TD_ERR_INVALID_ARG, "the nccl transport needs CUDA devices only");
        goto fail;
    }

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
#ifdef TD_HAVE_MPI
    if (g->transport == TD_TRANSPORT_MPI)
        TD_TRY(td__mpi_group_init(g)); /* sets size and rank0 */
#endif
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
#ifdef TD_HAVE_NCCL
    if (g->transport == TD_TRANSPORT_NCCL)
        TD_TRY(td__nccl_group_init(g));
#endif
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

/* Running ------------------------------------------------------------------- */

/* Shared by td_group_run and the member tasks; the last one out frees it, so
 * a member that never returns does not leave the others a dangling pointer. */
typedef struct run_state {
    td_group *g;
    td_group_fn fn;
    void *arg;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_uint finished;    /* changed under lock; also polled without it */
    unsigned char *returned; /* per local member, under lock */
    atomic_int refs;
} run_state;

typedef struct run_task {
    run_state *rs;
    td__member *m;
} run_task;

static void run_release(run_state *rs) {
    if (atomic_fetch_sub(&rs->refs, 1) == 1) {
        pthread_mutex_destroy(&rs->lock);
        pthread_cond_destroy(&rs->cond);
        free(rs->returned);
        free(rs);
    }
}

static td_status member_task(td_device *dev, void *p) {
    run_task *t = p;
    run_state *rs = t->rs;
    td__member *m = t->m;
    td_group *g = m->g;
    td_status st, drained;
    current_member = m;
    st = rs->fn(g, dev, m->rank, g->size, rs->arg);
    /* Collectives started and not waited for still finish inside the run. */
    if ((drained = td__engine_drain(m)) != TD_OK && st == TD_OK)
        st = drained;
    current_member = NULL;
    if (st != TD_OK && !atomic_load(&g->aborted)) {
        /* This member is the first to fail: its peers must not wait for it. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        td__group_fail(g, m->rank, "%s (rank %d) failed: %s: %s", td_device_name(dev), m->rank,
                       td_status_name(st), msg);
        td__error_set_message(msg);
    }
    pthread_mutex_lock(&rs->lock);
    atomic_fetch_add_explicit(&rs->finished, 1, memory_order_release);
    rs->returned[m->local] = 1;
    pthread_cond_broadcast(&rs->cond);
    pthread_mutex_unlock(&rs->lock);
    free(t);
    run_release(rs);
    return st;
}

/* Whether every one of the first n members that has not returned is stuck
 * (at least one), failing the group for them: nobody else would, when the
 * stuck member is alone or its peers returned. A second later than the
 * member's host thread gives up on its own stuck engine, so that the thread
 * is not left behind as it comes back. Called under rs->lock. */
static int all_out_stuck(run_state *rs, td_group *g, int n) {
    uint64_t now = td_clock_ns() - 1000000000u;
    int out = 0, stuck = 0;
    for (int k = 0; k < n; k++) {
        if (rs->returned[k])
            continue;
        out++;
        if (td__member_stuck(&g->members[k], now)) {
            stuck++;
            (void)td__member_give_up(&g->members[k]);
        }
    }
    return out > 0 && stuck == out;
}

/* How long the caller of a run polls before it sleeps: as long as the
 * group's last run took and half again, so that steps of a few to tens of
 * milliseconds find their caller awake (waking it costs 0.05-0.1 ms on a
 * virtual machine, 1.5% of a 7 ms step), within 4 and 25 times
 * TANDEM_SPIN_US: a longer step hides a wake-up. */
static uint64_t caller_spin_ns(const td_group *g) {
    uint64_t least = 4 * td__spin_ns(), most = 25 * td__spin_ns();
    uint64_t want = g->last_run_ns + g->last_run_ns / 2;
    return want < least ? least : want > most ? most : want;
}

td_status td_group_run(td_group *g, td_group_fn fn, void *arg) {
    uint64_t start = td_clock_ns();
    run_state *rs;
    td_event **evs = NULL;
    td_status *sts = NULL;
    char **msgs = NULL;
    td_status st = TD_OK;
    int submitted = 0, expected = 0;
    uint64_t abort_seen = 0;
    if (!g || !fn)
        return td__error(TD_ERR_INVALID_ARG, "td_group_run: group or function is NULL");
    for (int k = 0; k < g->nlocal; k++)
        if (td_device_current() == g->members[k].dev)
            return td__error(TD_ERR_INVALID_ARG,
                             "td_group_run: called from %s's host thread, a member of the group "
                             "(it would wait for itself)",
                             td_device_name(g->members[k].dev));
    if (atomic_exchange(&g->running, 1))
        return td__error(TD_ERR_INVALID_ARG, "td_group_run: the group is already running");
    rs = td__calloc(sizeof *rs, "a group run");
    evs = td__calloc(sizeof *evs * (size_t)(g->nlocal + 1), "group run events");
    sts = td__calloc(sizeof *sts * (size_t)(g->nlocal + 1), "group run results");
    msgs = td__calloc(sizeof *msgs * (size_t)(g->nlocal + 1), "group run messages");
    if (rs)
        rs->returned = td__calloc((size_t)g->nlocal + 1, "group run flags");
    if (!rs || !rs->returned || !evs || !sts || !msgs) {
        if (rs)
            free(rs->returned);
        free(rs);
        free(evs);
        free(sts);
        free(msgs);
        atomic_store(&g->running, 0);
        return TD_ERR_OUT_OF_MEMORY;
    }
    rs->g = g;
    rs->fn = fn;
    rs->arg = arg;
    pthread_mutex_init(&rs->lock, NULL);
    pthread_cond_init(&rs->cond, NULL);
    atomic_init(&rs->refs, 1);
    for (int k = 0; k < g->nlocal; k++) {
        run_task *t = td__calloc(sizeof *t, "a member task");
        if (!t) {
            st = TD_ERR_OUT_OF_MEMORY;
            break;
        }
        t->rs = rs;
        t->m = &g->members[k];
        atomic_fetch_add(&rs->refs, 1);
        if ((st = td_device_submit(g->members[k].dev, member_task, t, &evs[k])) != TD_OK) {
            atomic_fetch_sub(&rs->refs, 1);
            free(t);
            break;
        }
        submitted++;
    }
    if (st != TD_OK) {
        /* The members already started would wait for the others. */
        td__group_fail(g, -1, "td_group_run could not start every member: %s", td_last_error());
    }
    expected = submitted;
    (void)td__spin_until(&rs->finished, (unsigned)expected, caller_spin_ns(g));

    /* Wait for every member; once the group failed, give stragglers the
     * timeout (plus a second) and then leave them behind. */
    pthread_mutex_lock(&rs->lock);
    while (atomic_load(&rs->finished) < (unsigned)expected) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&rs->cond, &rs->lock, &ts);
        if (all_out_stuck(rs, g, expected))
            break;
        if (atomic_load(&g->aborted)) {
            uint64_t now = td_clock_ns();
            if (!abort_seen)
                abort_seen = now;
            else if (now - abort_seen > ((uint64_t)g->timeout_ms + 1000) * 1000000u)
                break;
        }
    }
    pthread_mutex_unlock(&rs->lock);

    for (int k = 0; k < submitted; k++) {
        int returned;
        pthread_mutex_lock(&rs->lock);
        returned = rs->returned[k];
        pthread_mutex_unlock(&rs->lock);
        if (returned) {
            sts[k] = td_event_wait(evs[k]);
        } else if (td__member_stuck(&g->members[k], td_clock_ns())) {
            sts[k] = td__error(TD_ERR_DEVICE_LOST, "stuck in a collective; left running");
        } else {
            sts[k] = td__error(TD_ERR_DEVICE_LOST,
                               "did not return within %d ms after the group failed; left running",
                               g->timeout_ms);
        }
        if (!returned) {
            atomic_store(&g->members[k].failed, 1);
            td__device_left_behind(g->members[k].dev);
        }
        msgs[k] = sts[k] != TD_OK ? td__strdup(td_last_error()) : NULL;
        td_event_destroy(evs[k]);
    }
    if (st == TD_OK) {
        /* The member that broke the group when it is here and failed, else the
         * lowest rank that failed. */
        int pick = -1;
        int cause = g->fail_rank - g->rank0;
        if (atomic_load(&g->aborted) && cause >= 0 && cause < submitted && sts[cause] != TD_OK)
            pick = cause;
        for (int k = 0; k < submitted && pick < 0; k++)
            if (sts[k] != TD_OK)
                pick = k;
        if (pick >= 0) {
            char reason[1024];
            pthread_mutex_lock(&g->fail_lock);
            snprintf(reason, sizeof reason, "%s", g->fail_reason);
            pthread_mutex_unlock(&g->fail_lock);
            st = sts[pick];
            if (*reason && (!msgs[pick] || !strstr(msgs[pick], reason)))
                td__error(st, "member %d (%s): %s (the group failed: %s)", g->members[pick].rank,
                          td_device_name(g->members[pick].dev), msgs[pick] ? msgs[pick] : "",
                          reason);
            else
                td__error(st, "member %d (%s): %s", g->members[pick].rank,
                          td_device_name(g->members[pick].dev), msgs[pick] ? msgs[pick] : "");
        }
    }
    for (int k = 0; k < submitted; k++)
        free(msgs[k]);
    free(msgs);
    free(sts);
    free(evs);
    run_release(rs);
    g->last_run_ns = td_clock_ns() - start;
    atomic_store(&g->running, 0);
    return st;
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
#ifdef TD_HAVE_MPI
    if (g->transport == TD_TRANSPORT_MPI)
        TD_TRY(td__mpi_agree_failed(g, gone));
#endif
    for (int k = 0; k < g->nlocal; k++)
        if (!gone[g->members[k].rank])
            devs[n++] = g->members[k].dev;
    cfg = g->cfg;
    cfg.timeout_ms = g->timeout_ms;
    cfg.switch_bytes = g->switch_bytes;
    cfg.chunk_bytes = g->chunk_bytes;
    cfg.fault = ""; /* it shares g's plan instead (below) */
    if (n == 0 && g->transport != TD_TRANSPORT_MPI) {
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
