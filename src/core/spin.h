/* Waiting without sleeping, for a short while.
 *
 * A thread that sleeps on a futex between two short steps pays for its wake-up:
 * tens of microseconds on a virtual machine whose idle virtual CPU halts (on
 * the 2-vCPU machine tandem is developed on, 30-50 us per wake-up and now and
 * then over a millisecond), against steps of a millisecond or two. So the
 * threads that wait for the next step poll first. They poll with sched_yield,
 * not with pause: a waiting thread must give its core to any thread that has
 * work, since on a machine with fewer cores than threads that thread may be
 * the one it waits for. TANDEM_SPIN_US (default 1000, 0: never) is how long
 * a device thread polls for its next task; the caller of a group run polls
 * for its members about as long as their last run took, within 4 and 25
 * times TANDEM_SPIN_US. */
#ifndef TD_CORE_SPIN_H
#define TD_CORE_SPIN_H

#include <stdatomic.h>
#include <stdint.h>

/* TANDEM_SPIN_US in nanoseconds, read once. */
uint64_t td__spin_ns(void);

/* Polls until *flag >= want or budget_ns have passed; returns whether the
 * flag got there. */
int td__spin_until(const atomic_uint *flag, unsigned want, uint64_t budget_ns);

#endif
