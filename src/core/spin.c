#include "core/spin.h"

#include <sched.h>
#include <stdlib.h>

#include "core/log.h"
#include "tandem/core.h"

#define DEFAULT_SPIN_US 1000

uint64_t td__spin_ns(void) {
    static atomic_llong cached = -1;
    long long v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *s = getenv("TANDEM_SPIN_US");
        char *end = NULL;
        long long us = s && *s ? strtoll(s, &end, 10) : DEFAULT_SPIN_US;
        if (s && *s && (*end || us < 0)) {
            TD_LOG_WARN("TANDEM_SPIN_US=%s is not a count of microseconds; using %d", s,
                        DEFAULT_SPIN_US);
            us = DEFAULT_SPIN_US;
        }
        v = us * 1000;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return (uint64_t)v;
}

int td__spin_until(const atomic_uint *flag, unsigned want, uint64_t budget_ns) {
    uint64_t start;
    if (atomic_load_explicit(flag, memory_order_acquire) >= want)
        return 1;
    if (!budget_ns)
        return 0;
    start = td_clock_ns();
    do {
        sched_yield();
        if (atomic_load_explicit(flag, memory_order_acquire) >= want)
            return 1;
    } while (td_clock_ns() - start < budget_ns);
    return 0;
}
