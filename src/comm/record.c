/* The per-group record of the last collectives: each member remembers its
 * own last TD_COMM_RECORD collectives (sequence number, kind, size, when it
 * arrived and when it finished); a report lines them up by sequence number,
 * so a member that never arrived shows as such. */
#include <stdio.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"

static td__record_entry *entry(td__member *m, uint64_t seq) {
    return &m->record[seq % TD_COMM_RECORD];
}

void td__record_arrive(td__member *m, const td__op *op) {
    td__record_entry *e = entry(m, op->seq);
    atomic_store_explicit(&e->seq, 0, memory_order_relaxed);
    atomic_store_explicit(&e->kind, (int)op->kind, memory_order_relaxed);
    atomic_store_explicit(&e->dtype, (int)op->dtype, memory_order_relaxed);
    atomic_store_explicit(&e->count, op->count, memory_order_relaxed);
    atomic_store_explicit(&e->done_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&e->status, 1, memory_order_relaxed);
    atomic_store_explicit(&e->arrive_ns, td_clock_ns(), memory_order_relaxed);
    atomic_store_explicit(&e->seq, op->seq, memory_order_release);
}

void td__record_done(td__member *m, const td__op *op, td_status st) {
    td__record_entry *e = entry(m, op->seq);
    atomic_store_explicit(&e->status, (int)st, memory_order_relaxed);
    atomic_store_explicit(&e->done_ns, td_clock_ns(), memory_order_release);
}

/* The newest sequence number any local member reached. */
static uint64_t newest(td_group *g) {
    uint64_t top = 0;
    for (int k = 0; k < g->nlocal; k++)
        for (int i = 0; i < TD_COMM_RECORD; i++) {
            uint64_t s = atomic_load_explicit(&g->members[k].record[i].seq, memory_order_acquire);
            if (s > top)
                top = s;
        }
    return top;
}

void td__record_missing(td_group *g, uint64_t seq, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < g->nlocal && used + 1 < n; k++) {
        td__member *m = &g->members[k];
        uint64_t s = atomic_load_explicit(&entry(m, seq)->seq, memory_order_acquire);
        if (s != seq)
            used += (size_t)snprintf(buf + used, n - used, "%s%s (rank %d)", used ? ", " : "",
                                     td_device_name(m->dev), m->rank);
    }
    if (!used)
        snprintf(buf, n, "a member in another process");
}

const char *td_group_record(td_group *g, char *buf, size_t n) {
    size_t used = 0;
    uint64_t top, first, t0 = 0;
    if (!buf || n == 0)
        return buf;
    buf[0] = '\0';
    if (!g)
        return buf;
    top = newest(g);
    first = top >= TD_COMM_RECORD ? top - TD_COMM_RECORD + 1 : 1;
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (used + 1 < n)                                                                          \
            used += (size_t)snprintf(buf + used, n - used, __VA_ARGS__);                           \
    } while (0)
    PUT("group of %d (%s transport, %d here), last collectives:", g->size, td_group_transport(g),
        g->nlocal);
    if (top == 0) {
        PUT(" none");
        return buf;
    }
    /* Times are relative to the first arrival shown. */
    for (int k = 0; k < g->nlocal; k++) {
        td__record_entry *e = entry(&g->members[k], first);
        if (atomic_load_explicit(&e->seq, memory_order_acquire) == first) {
            uint64_t a = atomic_load_explicit(&e->arrive_ns, memory_order_relaxed);
            if (!t0 || a < t0)
                t0 = a;
        }
    }
    for (uint64_t s = first; s <= top; s++) {
        int kind = -1, dtype = 0;
        uint64_t count = 0;
        char size[32];
        for (int k = 0; k < g->nlocal && kind < 0; k++) {
            td__record_entry *e = entry(&g->members[k], s);
            if (atomic_load_explicit(&e->seq, memory_order_acquire) == s) {
                kind = atomic_load_explicit(&e->kind, memory_order_relaxed);
                dtype = atomic_load_explicit(&e->dtype, memory_order_relaxed);
                count = atomic_load_explicit(&e->count, memory_order_relaxed);
            }
        }
        PUT("\n  #%llu %s %llu x %s (%s):", (unsigned long long)s,
            kind >= 0 ? td_collective_name((td_collective_kind)kind) : "?",
            (unsigned long long)count, td_dtype_name((td_dtype)dtype),
            td__format_bytes((double)count * td_dtype_size((td_dtype)dtype), size));
        for (int k = 0; k < g->nlocal; k++) {
            td__member *m = &g->members[k];
            td__record_entry *e = entry(m, s);
            if (atomic_load_explicit(&e->seq, memory_order_acquire) != s) {
                PUT(" %s NEVER ARRIVED;", td_device_name(m->dev));
                continue;
            }
            {
                uint64_t a = atomic_load_explicit(&e->arrive_ns, memory_order_relaxed);
                uint64_t d = atomic_load_explicit(&e->done_ns, memory_order_acquire);
                int st = atomic_load_explicit(&e->status, memory_order_relaxed);
                double at = t0 && a >= t0 ? (double)(a - t0) / 1e6 : 0.0;
                if (!d)
                    PUT(" %s arrived +%.3f ms, still waiting;", td_device_name(m->dev), at);
                else
                    PUT(" %s arrived +%.3f ms, %s after %.3f ms;", td_device_name(m->dev), at,
                        st == TD_OK ? "done" : td_status_name((td_status)st),
                        (double)(d - a) / 1e6);
            }
        }
    }
#undef PUT
    return buf;
}
