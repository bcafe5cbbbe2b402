/* Running a group: td_group_run (one task per member on its own host
 * thread, waiting for them, leaving stuck ones behind), the member each host
 * thread runs as, and the group's error state: failing it, members stuck in
 * a collective, td_group_error. Creation and shrinking are in group.c. */
#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/spin.h"

static _Thread_local td__member *current_member;

td__member *td__comm_current(void) {
    return current_member;
}

void td__comm_set_current(td__member *m) {
    current_member = m;
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
        if (g->tr && g->tr->failed)
            g->tr->failed(g);
        TD_LOG_WARN("group failed: %s", g->fail_reason);
    }
    pthread_mutex_unlock(&g->fail_lock);
    return td__group_lost(g);
}

void td_group_abort(td_group *g, const char *why) {
    if (g)
        (void)td__group_fail(g, -1, "%s", why ? why : "aborted");
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
    assert(m->dev == dev && m->rank >= 0 && m->rank < g->size);
    assert(!current_member); /* a member runs one group's function at a time */
    current_member = m;
    st = rs->fn(g, dev, m->rank, g->size, rs->arg);
    /* Collectives started and not waited for still finish inside the run. */
    if ((drained = td__engine_drain(m)) != TD_OK && st == TD_OK)
        st = drained;
    current_member = NULL;
    if (st != TD_OK && !atomic_load(&g->aborted)) {
        /* This member is the first to fail: its peers must not wait for it. */
        char msg[1024];
        const char *setting = td_last_error_setting(); /* a static name, or NULL */
        snprintf(msg, sizeof msg, "%s", td_last_error());
        td__group_fail(g, m->rank, "%s (rank %d) failed: %s: %s", td_device_name(dev), m->rank,
                       td_status_name(st), msg);
        td__error_set(msg, setting);
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

td_status td_group_join(td_group *g, td_group_fn fn, void *arg) {
    td__member *outer = current_member, *m = NULL;
    td_device *dev = td_device_current();
    td_status st, drained;
    if (!g || !fn)
        return td__error(TD_ERR_INVALID_ARG, "td_group_join: group or function is NULL");
    for (int k = 0; k < g->nlocal && !m; k++)
        if (dev && g->members[k].dev == dev)
            m = &g->members[k];
    if (!m)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_group_join: called off the host thread of a member of the group");
    current_member = m;
    st = fn(g, dev, m->rank, g->size, arg);
    if ((drained = td__engine_drain(m)) != TD_OK && st == TD_OK)
        st = drained;
    current_member = outer;
    if (st != TD_OK && !atomic_load(&g->aborted)) {
        char msg[1024];
        const char *setting = td_last_error_setting();
        snprintf(msg, sizeof msg, "%s", td_last_error());
        td__group_fail(g, m->rank, "%s (rank %d) failed: %s: %s", td_device_name(dev), m->rank,
                       td_status_name(st), msg);
        td__error_set(msg, setting);
    }
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
