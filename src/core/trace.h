/* The timeline recorder: what each thread did, and when, for a trace file.
 *
 * Every thread that records owns a buffer of fixed-size records (a span:
 * start, end, a static name, a category, bytes) that only it writes, so
 * recording takes no lock: the record goes in, then the buffer's count is
 * published with a release store. The buffer is made at the thread's first
 * record and registered once (under a lock) in a process-wide list, from
 * which td__trace_snapshot() copies every thread's records of the current
 * session for the writer (src/train/trace_write.c). A thread's name (its
 * device's, "cpu:1"; "cpu:1 comm" for its collective engine; "trainer")
 * names its track.
 *
 * Off, a span costs one predictable branch on a relaxed load: sites read
 *     uint64_t tr = td__trace_begin();
 *     ... work ...
 *     td__trace_end(tr, TD__TRACE_COMPUTE, "forward", -1);
 * and td__trace_begin() returns 0 unless recording is on, which
 * td__trace_end() takes as "not recorded". The two are inline for that
 * reason only; everything else lives in trace.c.
 *
 * Sessions: td__trace_start() begins one (records of earlier sessions are
 * dropped as each thread next records), td__trace_set_step() switches
 * recording on for one step and stamps its number on what follows,
 * td__trace_pause() switches it off. Buffers of threads that ended stay
 * readable until the next session starts. */
#ifndef TD_CORE_TRACE_H
#define TD_CORE_TRACE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "tandem/core.h"

typedef enum td__trace_cat {
    TD__TRACE_COMPUTE = 0, /* forward, backward */
    TD__TRACE_UPDATE = 1,  /* the optimizer step */
    TD__TRACE_COMM = 2,    /* one collective (its name is its kind) */
    TD__TRACE_COPY = 3,    /* host to device, device to host, between devices */
    TD__TRACE_WAIT = 4,    /* waiting for a collective or for another member */
    TD__TRACE_IDLE = 5,    /* a step the device sat out (parked) */
    TD__TRACE_STEP = 6,    /* the trainer's side: loading a batch, the whole step */
    TD__TRACE_CATS = 7,
} td__trace_cat;

/* One span. */
typedef struct td__trace_rec {
    uint64_t t0, t1;   /* td_clock_ns() at its start and end */
    const char *name;  /* static storage */
    const char *track; /* NULL: the recording thread's; else the thread named so (it must
                          outlive the session: a device's name) */
    int64_t bytes;     /* bytes moved or reduced; -1: none */
    int64_t step;      /* the step td__trace_set_step() gave */
    int32_t item;      /* a micro-batch; -1: none */
    int32_t cat;       /* td__trace_cat */
} td__trace_rec;

/* Non-zero while recording; read by td__trace_begin(). */
extern atomic_int td__trace_on;

/* td_clock_ns() when recording is on, else 0. */
static inline uint64_t td__trace_begin(void) {
    if (__builtin_expect(atomic_load_explicit(&td__trace_on, memory_order_relaxed), 0))
        return td_clock_ns();
    return 0;
}

/* Records the span from t0 (td__trace_begin) to now with everything else
 * given; copies *r, filling t1 when it is 0, and the step. */
void td__trace_add(const td__trace_rec *r);

/* The span from t0 (td__trace_begin's; 0: not recording, nothing to do) to
 * now, on this thread's track. name: static storage. bytes: -1 for none. */
static inline void td__trace_end(uint64_t t0, td__trace_cat cat, const char *name, int64_t bytes) {
    if (__builtin_expect(t0 != 0, 0)) {
        td__trace_rec r = {.t0 = t0, .name = name, .bytes = bytes, .item = -1, .cat = (int32_t)cat};
        td__trace_add(&r);
    }
}

/* Names this thread's track (printf format; cut at 47 bytes). Cheap: it is
 * kept in a thread-local until the thread records. */
void td__trace_thread_name(const char *fmt, ...) TD_PRINTF(1, 2);

/* Begins a session: recording stays off until td__trace_set_step(). Not
 * while another thread records (between steps). */
void td__trace_start(void);
/* Recording on, stamping `step` on the spans from now on. */
void td__trace_set_step(int64_t step);
/* Recording off (the session goes on). */
void td__trace_pause(void);

/* One thread's records of the session, sorted by start (the longer first
 * where two start together, so a span comes before those it holds). */
typedef struct td__trace_track {
    char name[48];
    td__trace_rec *recs;
    size_t n;
    uint64_t dropped; /* records that found the buffer full */
} td__trace_track;

/* Copies every thread's records of the current session. Safe while threads
 * record (a record that arrives meanwhile may or may not be in). The caller
 * frees with td__trace_snapshot_free(). */
td_status td__trace_snapshot(td__trace_track **tracks, size_t *ntracks);
void td__trace_snapshot_free(td__trace_track *tracks, size_t ntracks);

/* "compute", "update", "comm", "copy", "wait", "idle", "step". */
const char *td__trace_cat_name(int cat);

#endif
