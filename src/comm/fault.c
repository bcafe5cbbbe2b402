/* Fault injection (TANDEM_FAULT, or td_group_config.fault), for testing how
 * groups fail:
 *
 *   ITEM[,ITEM...]     ITEM = [pP/]DEVICE@KIND:N[:MODE]
 *
 * DEVICE is a member's device name ("cpu:1"); pP/ limits the item to MPI
 * process P. KIND is allreduce, broadcast, reduce, allgather, reducescatter
 * or any. N counts that member's collectives of that kind, from 1. MODE is
 * hang (the default: the member stops answering, as a lost GPU does, so its
 * peers time out and name it, and its host thread comes back once they
 * gave up), stuck (the same, but its host thread never comes back, as with a
 * GPU hung for good) or error (it fails at once and tells its peers).
 * "cpu:1@allreduce:5" makes cpu:1 stop at its 5th all-reduce.
 *
 * KIND may instead be grad, act or weight: a bit flip, a device that
 * computes a wrong number without failing. N is then the step (from 1)
 * and MODE flip (the default, the only one). The group cannot reach into a
 * model, so the strategy asks td_group_fault_flip on each member's thread
 * at each step and flips the bit itself (mirror: the lowest exponent bit of
 * the largest element, which doubles or halves it). An item that
 * could never fire (a device not in the group, a count of 0) is refused. One
 * that did not fire by the time the group (and those shrunk from it) is
 * destroyed is named in a warning with what its device ran instead: which
 * collectives a run makes is the strategy's business (ZeRO-1 runs no
 * all-reduce, pipeline decoding no collective), so a test that counted on it
 * would otherwise pass for the wrong reason.
 *
 * A group shrunk from a group with faults (td_group_shrink: the data
 * strategy's group of the members not parked, the survivors of a loss)
 * shares its plan: a device's collectives count in both, and an item fires
 * once, so a fault can strike while some members sit out, and a second
 * item can strike after the survivors carried on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm-impl.h"
#include "comm/process.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

struct td__fault_plan {
    atomic_int refs;
    char text[256];
    int nitems;
    int process; /* this process's rank (td__group_process) */
    td__fault items[TD_COMM_MAX_FAULT];
    char item_text[TD_COMM_MAX_FAULT][128];
    int item_slot[TD_COMM_MAX_FAULT]; /* its device's counters, -1: another process's */
    atomic_int fired[TD_COMM_MAX_FAULT];
    size_t ndevs;
    td_device **devs;                       /* the first group's local devices */
    atomic_int (*calls)[TD_COLL_KINDS + 1]; /* per device: collectives per kind, and in all */
};

static const char *const kind_names[TD_COLL_KINDS] = {"allreduce", "broadcast", "reduce",
                                                      "allgather", "reducescatter"};

const char *td_collective_name(td_collective_kind kind) {
    return (unsigned)kind < TD_COLL_KINDS ? kind_names[kind] : "?";
}

static const char *const flip_names[TD_FLIP_TARGETS] = {"grad", "act", "weight"};

/* The mode after a flip item's step: flip, or nothing. */
static int parse_flip_mode(const char *rest, td__fault *f) {
    f->mode = TD__FAULT_FLIP;
    return !*rest || !strcmp(rest, ":flip");
}

static td_status parse_item(const char *item, td__fault *f) {
    char buf[128], *at, *kind, *colon, *end;
    long nth;
    snprintf(buf, sizeof buf, "%s", item);
    memset(f, 0, sizeof *f);
    f->process = -1;
    kind = buf;
    if (buf[0] == 'p' && strchr(buf, '/')) {
        long p = strtol(buf + 1, &end, 10);
        if (end == buf + 1 || *end != '/' || p < 0)
            goto bad;
        f->process = (int)p;
        kind = end + 1;
    }
    at = strchr(kind, '@');
    if (!at || at == kind)
        goto bad;
    *at = '\0';
    snprintf(f->device, sizeof f->device, "%s", kind);
    kind = at + 1;
    colon = strchr(kind, ':');
    if (!colon)
        goto bad;
    *colon = '\0';
    f->kind = -2;
    if (!strcmp(kind, "any"))
        f->kind = -1;
    for (int k = 0; k < TD_COLL_KINDS; k++)
        if (!strcmp(kind, kind_names[k]))
            f->kind = k;
    for (int k = 0; k < TD_FLIP_TARGETS; k++)
        if (!strcmp(kind, flip_names[k]))
            f->kind = TD__FAULT_FLIP_KIND + k;
    if (f->kind == -2)
        return td__error(TD_ERR_PARSE,
                         "fault injection item '%s': '%s' is not a collective (allreduce, "
                         "broadcast, reduce, allgather, reducescatter or any) nor a bit flip's "
                         "target (grad, act or weight)",
                         item, kind);
    nth = strtol(colon + 1, &end, 10);
    if (end != colon + 1 && nth < 1)
        return td__error(TD_ERR_PARSE,
                         "fault injection item '%s': %s count from 1, so a count of %ld could "
                         "never fire",
                         item, f->kind >= TD__FAULT_FLIP_KIND ? "steps" : "collectives", nth);
    if (end == colon + 1 || nth > 1000000000)
        goto bad;
    f->nth = (int)nth;
    if (f->kind >= TD__FAULT_FLIP_KIND) {
        if (!parse_flip_mode(end, f))
            goto bad;
        return TD_OK;
    }
    f->mode = TD__FAULT_HANG;
    if (*end == ':') {
        if (!strcmp(end + 1, "error"))
            f->mode = TD__FAULT_ERROR;
        else if (!strcmp(end + 1, "stuck"))
            f->mode = TD__FAULT_STUCK;
        else if (strcmp(end + 1, "hang"))
            goto bad;
    } else if (*end) {
        goto bad;
    }
    return TD_OK;
bad:
    return td__error(
        TD_ERR_PARSE,
        "fault injection item '%s' is malformed: expected "
        "[pP/]DEVICE@KIND:N[:hang|:stuck|:error], KIND one of allreduce, broadcast, reduce, "
        "allgather, reducescatter, any (as in cpu:1@allreduce:5), or a bit flip "
        "DEVICE@grad|act|weight:STEP[:flip] (as in cpu:1@grad:3)",
        item);
}

/* Refuses an item for a device not in the group (unless it may be another
 * process's): it could never fire, and a test that counted on it would pass
 * for the wrong reason. */
static td_status check_device(const td_group *g, const char *item, const td__fault *f,
                              td_device *const *devs, size_t n) {
    char names[512] = "";
    size_t used = 0;
    if (g->tr->spans_processes)
        return TD_OK;
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(f->device, td_device_name(devs[i])))
            return TD_OK;
        if (used + 1 < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                     td_device_name(devs[i]));
    }
    return td__error(TD_ERR_INVALID_ARG,
                     "TANDEM_FAULT: item '%s' names %s, which is not one of this run's devices "
                     "(%s), so it could never fire",
                     item, f->device, names);
}

static void plan_free(td__fault_plan *p) {
    if (!p)
        return;
    free(p->devs);
    free(p->calls);
    free(p);
}

td_status td__fault_parse(td_group *g, const char *text, td_device *const *devs, size_t n) {
    char buf[256], *save = NULL, *item;
    td__fault_plan *p;
    td_status st;
    g->faults = NULL;
    if (!text || !*text)
        return TD_OK;
    if (!(p = td__calloc(sizeof *p, "a fault plan")))
        return TD_ERR_OUT_OF_MEMORY;
    p->devs = td__calloc(sizeof *p->devs * (n ? n : 1), "a fault plan");
    p->calls = td__calloc(sizeof *p->calls * (n ? n : 1), "a fault plan");
    if (!p->devs || !p->calls) {
        plan_free(p);
        return TD_ERR_OUT_OF_MEMORY;
    }
    atomic_init(&p->refs, 1);
    p->ndevs = n;
    for (size_t i = 0; i < n; i++) {
        p->devs[i] = devs[i];
        for (int k = 0; k <= TD_COLL_KINDS; k++)
            atomic_init(&p->calls[i][k], 0);
    }
    snprintf(p->text, sizeof p->text, "%s", text);
    snprintf(buf, sizeof buf, "%s", text);
    for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (p->nitems == TD_COMM_MAX_FAULT) {
            plan_free(p);
            return td__error(TD_ERR_PARSE, "fault injection '%s': more than %d items", text,
                             TD_COMM_MAX_FAULT);
        }
        if ((st = parse_item(item, &p->items[p->nitems])) != TD_OK) {
            plan_free(p);
            return td__error_prefix(st, "TANDEM_FAULT: ");
        }
        if ((st = check_device(g, item, &p->items[p->nitems], devs, n)) != TD_OK) {
            plan_free(p);
            return st;
        }
        atomic_init(&p->fired[p->nitems], 0);
        snprintf(p->item_text[p->nitems], sizeof p->item_text[0], "%s", item);
        p->item_slot[p->nitems] = -1;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(p->items[p->nitems].device, td_device_name(devs[i])))
                p->item_slot[p->nitems] = (int)i;
        p->nitems++;
    }
    g->faults = p;
    return TD_OK;
}

void td__fault_attach(td_group *g) {
    if (g->faults)
        g->faults->process = td__group_process(g);
    for (int k = 0; k < g->nlocal; k++) {
        td__member *m = &g->members[k];
        m->fault_slot = -1;
        for (size_t i = 0; g->faults && i < g->faults->ndevs; i++)
            if (g->faults->devs[i] == m->dev)
                m->fault_slot = (int)i;
    }
}

void td__fault_share(td_group *from, td_group *to) {
    td__fault_release(to);
    if ((to->faults = from->faults))
        atomic_fetch_add(&to->faults->refs, 1);
    td__fault_attach(to);
}

/* Warns of each item of this process's devices that never fired, with what
 * its device ran instead. The devices may be gone by now (a shrunk group
 * can outlive the list its first group owned): only counters are read. */
static void report_unfired(const td__fault_plan *p) {
    for (int i = 0; i < p->nitems; i++) {
        const td__fault *f = &p->items[i];
        int d = p->item_slot[i], kinds, all;
        if (atomic_load(&p->fired[i]) || d < 0 || (f->process >= 0 && f->process != p->process))
            continue;
        if (f->mode == TD__FAULT_FLIP) {
            TD_LOG_WARN("TANDEM_FAULT item '%s' never fired: no step %d flipped a bit of %s on "
                        "%s (the strategy did not take that step there, or checks no numbers)",
                        p->item_text[i], f->nth, flip_names[f->kind - TD__FAULT_FLIP_KIND],
                        f->device);
            continue;
        }
        all = atomic_load(&p->calls[d][TD_COLL_KINDS]);
        kinds = f->kind < 0 ? all : atomic_load(&p->calls[d][f->kind]);
        if (f->kind < 0)
            TD_LOG_WARN("TANDEM_FAULT item '%s' never fired: %s ran %d collectives in all",
                        p->item_text[i], f->device, all);
        else
            TD_LOG_WARN("TANDEM_FAULT item '%s' never fired: %s ran %d %s of its %d "
                        "collectives%s",
                        p->item_text[i], f->device, kinds, td_collective_name(f->kind), all,
                        kinds ? "" : " (this run makes none of that kind)");
    }
}

void td__fault_release(td_group *g) {
    if (g->faults && atomic_fetch_sub(&g->faults->refs, 1) == 1) {
        report_unfired(g->faults);
        plan_free(g->faults);
    }
    g->faults = NULL;
}

static int this_process(const td_group *g, int process) {
    return process < 0 || td__group_process(g) == process;
}

/* Never comes back, as a GPU hung for good: the thread sleeps until the
 * process ends, touching nothing (its group and plan may be freed). */
static void stay_stuck(void) {
    for (;;)
        pause();
}

td_status td__fault_check(td__member *m, td_collective_kind kind) {
    td_group *g = m->g;
    td__fault_plan *p = g->faults;
    int n_kind, n_any;
    if (!p || m->fault_slot < 0)
        return TD_OK;
    n_kind = atomic_fetch_add(&p->calls[m->fault_slot][kind], 1) + 1;
    n_any = atomic_fetch_add(&p->calls[m->fault_slot][TD_COLL_KINDS], 1) + 1;
    for (int i = 0; i < p->nitems; i++) {
        const td__fault *f = &p->items[i];
        if (f->mode == TD__FAULT_FLIP || strcmp(f->device, td_device_name(m->dev)) ||
            !this_process(g, f->process))
            continue;
        if ((f->kind < 0 ? n_any : f->kind == (int)kind ? n_kind : -1) != f->nth)
            continue;
        if (atomic_exchange(&p->fired[i], 1))
            continue;
        atomic_store(&m->failed, 1);
        if (f->mode == TD__FAULT_STUCK)
            stay_stuck();
        if (f->mode == TD__FAULT_ERROR)
            return td__group_fail(g, m->rank,
                                  "%s (rank %d) failed at its %s number %d: injected by "
                                  "TANDEM_FAULT=%s",
                                  td_device_name(m->dev), m->rank,
                                  f->kind < 0 ? "collective" : td_collective_name(kind), f->nth,
                                  p->text);
        /* Stop answering, as a lost device does, until the peers gave up on
         * us; alone (or with every peer hung too) give up after the timeout. */
        {
            uint64_t start = td_clock_ns();
            /* Twice the timeout and a second: the peers' own timeout comes first. */
            uint64_t limit = ((uint64_t)td_group_timeout_ms(g) * 2 + 1000) * 1000000u;
            while (!atomic_load(&g->aborted)) {
                struct timespec ts = {0, 1000000};
                if (td_clock_ns() - start > limit)
                    td__group_fail(g, m->rank, "%s (rank %d) stopped answering",
                                   td_device_name(m->dev), m->rank);
                nanosleep(&ts, NULL);
            }
        }
        return td__error(TD_ERR_DEVICE_LOST,
                         "%s (rank %d) stopped answering at its %s number %d: injected by "
                         "TANDEM_FAULT=%s",
                         td_device_name(m->dev), m->rank,
                         f->kind < 0 ? "collective" : td_collective_name(kind), f->nth, p->text);
    }
    return TD_OK;
}

int td_group_fault_flip(td_group *g, int rank, td_flip_target what, int64_t step) {
    td__fault_plan *p = g ? g->faults : NULL;
    td_device *dev = g ? td_group_device(g, rank) : NULL;
    if (!p || !dev)
        return 0;
    for (int i = 0; i < p->nitems; i++) {
        const td__fault *f = &p->items[i];
        if (f->mode != TD__FAULT_FLIP || f->kind != TD__FAULT_FLIP_KIND + (int)what ||
            f->nth != step || strcmp(f->device, td_device_name(dev)) ||
            !this_process(g, f->process))
            continue;
        if (!atomic_exchange(&p->fired[i], 1))
            return 1;
    }
    return 0;
}
