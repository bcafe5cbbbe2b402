/* The local transport's wait: until a peer's flag reaches a value, the group
 * fails, or the group's timeout passes (then the peer is named and the
 * group's record of its last collectives logged). Spins with pause first,
 * then yields the core, then sleeps: devices may outnumber cores. */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "comm/comm-impl.h"
#include "core/error.h"
#include "core/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

td_status td__comm_wait(td__member *m, atomic_uint_least64_t *p, uint64_t want, int waiting_for,
                        uint64_t seq) {
    td_group *g = m->g;
    uint64_t start = 0, limit;
    unsigned rounds = 0;
    if (atomic_load_explicit(p, memory_order_acquire) >= want)
        return TD_OK;
    limit = (uint64_t)td_group_timeout_ms(g) * 1000000u;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (atomic_load_explicit(p, memory_order_acquire) >= want)
                return TD_OK;
            cpu_relax();
        }
        if (atomic_load_explicit(&g->aborted, memory_order_acquire))
            return td__group_lost(g);
        rounds++;
        if (rounds > (unsigned)g->spin_rounds) {
            /* A peer that is this late is probably not running: let it have the core. */
            if (rounds < 4096u + (unsigned)g->spin_rounds) {
                sched_yield();
            } else {
                struct timespec ts = {0,
                                      rounds < 8192u + (unsigned)g->spin_rounds ? 20000 : 200000};
                nanosleep(&ts, NULL);
            }
        }
        if ((rounds & 31) == 1) {
            uint64_t now = td_clock_ns();
            if (!start) {
                start = now;
            } else if (now - start > limit) {
                char who[512];
                int rank = -1;
                if (waiting_for >= 0) {
                    rank = g->members[waiting_for].rank;
                    snprintf(who, sizeof who, "%s (rank %d)",
                             td_device_name(g->members[waiting_for].dev), rank);
                } else {
                    td__record_missing(g, seq, who, sizeof who);
                }
                td__group_fail(g, rank,
                               "collective #%llu: timed out after %d ms waiting for %s, which "
                               "never arrived",
                               (unsigned long long)seq, td_group_timeout_ms(g), who);
                {
                    char rec[4096];
                    TD_LOG_ERROR("%s\n%s", td_last_error(), td_group_record(g, rec, sizeof rec));
                }
                return td__group_lost(g);
            }
        }
    }
}
