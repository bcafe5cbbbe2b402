/* Fault injection (TANDEM_FAULT, or td_group_config.fault), for testing how
 * groups fail:
 *
 *   ITEM[,ITEM...]     ITEM = [pP/]DEVICE@KIND:N[:MODE]
 *
 * DEVICE is a member's device name ("cpu:1"); pP/ limits the item to MPI
 * process P. KIND is allreduce, broadcast, reduce, allgather, reducescatter
 * or any. N counts that member's collectives of that kind, from 1. MODE is
 * hang (the default: the member stops answering, as a lost GPU does, so its
 * peers time out and name it) or error (it fails at once and tells its peers).
 * "cpu:1@allreduce:5" makes cpu:1 stop at its 5th all-reduce. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm-impl.h"
#include "core/error.h"

static const char *const kind_names[TD_COMM_KINDS] = {"allreduce", "broadcast", "reduce",
                                                      "allgather", "reducescatter"};

const char *td_collective_name(td_collective_kind kind) {
    return (unsigned)kind < TD_COMM_KINDS ? kind_names[kind] : "?";
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
    for (int k = 0; k < TD_COMM_KINDS; k++)
        if (!strcmp(kind, kind_names[k]))
            f->kind = k;
    if (f->kind == -2)
        goto bad;
    nth = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || nth < 1 || nth > 1000000000)
        goto bad;
    f->nth = (int)nth;
    f->hang = 1;
    if (*end == ':') {
        if (!strcmp(end + 1, "error"))
            f->hang = 0;
        else if (strcmp(end + 1, "hang"))
            goto bad;
    } else if (*end) {
        goto bad;
    }
    return TD_OK;
bad:
    return td__error(TD_ERR_PARSE,
                     "fault injection item '%s' is malformed: expected "
                     "[pP/]DEVICE@KIND:N[:hang|:error], KIND one of allreduce, broadcast, reduce, "
                     "allgather, reducescatter, any (as in cpu:1@allreduce:5)",
                     item);
}

td_status td__fault_parse(td_group *g, const char *text) {
    char buf[256], *save = NULL, *item;
    td_status st;
    g->nfaults = 0;
    if (!text || !*text)
        return TD_OK;
    snprintf(g->fault_text, sizeof g->fault_text, "%s", text);
    snprintf(buf, sizeof buf, "%s", text);
    for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        if (g->nfaults == TD_COMM_MAX_FAULT)
            return td__error(TD_ERR_PARSE, "fault injection '%s': more than %d items", text,
                             TD_COMM_MAX_FAULT);
        if ((st = parse_item(item, &g->faults[g->nfaults])) != TD_OK)
            return td__error_prefix(st, "TANDEM_FAULT: ");
        g->nfaults++;
    }
    return TD_OK;
}

static int this_process(const td_group *g, int process) {
    int here = 0;
    if (process < 0)
        return 1;
#ifdef TD_HAVE_MPI
    here = td__mpi_process(g);
#endif
    return here == process;
}

td_status td__fault_check(td__member *m, td_collective_kind kind) {
    td_group *g = m->g;
    int n_kind = ++m->calls[kind];
    int n_any = ++m->calls[TD_COMM_KINDS];
    for (int i = 0; i < g->nfaults; i++) {
        const td__fault *f = &g->faults[i];
        if (strcmp(f->device, td_device_name(m->dev)) || !this_process(g, f->process))
            continue;
        if ((f->kind < 0 ? n_any : f->kind == (int)kind ? n_kind : -1) != f->nth)
            continue;
        atomic_store(&m->failed, 1);
        if (!f->hang)
            return td__group_fail(g, m->rank,
                                  "%s (rank %d) failed at its %s number %d: injected by "
                                  "TANDEM_FAULT=%s",
                                  td_device_name(m->dev), m->rank,
                                  f->kind < 0 ? "collective" : td_collective_name(kind), f->nth,
                                  g->fault_text);
        /* Stop answering, as a lost device does, until the peers gave up on
         * us; alone (or with every peer hung too) give up after the timeout. */
        {
            uint64_t start = td_clock_ns();
            /* Twice the timeout and a second: the peers' own timeout comes first. */
            uint64_t limit = ((uint64_t)td__group_timeout_ms(g) * 2 + 1000) * 1000000u;
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
                         f->kind < 0 ? "collective" : td_collective_name(kind), f->nth,
                         g->fault_text);
    }
    return TD_OK;
}
