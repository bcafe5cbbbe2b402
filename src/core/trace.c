/* The timeline recorder (see trace.h): per-thread buffers of spans, a
 * registry of them, sessions, and the snapshot the trace writer reads. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/trace.h"

/* A buffer grows by chunks, so a thread that records little costs little;
 * past MAX_CHUNKS (4M spans, 224 MiB) a thread's spans are counted, not kept. */
#define CHUNK_RECS 4096
#define MAX_CHUNKS 1024

typedef struct trace_buf {
    struct trace_buf *next; /* in the registry (under reg_lock) */
    char name[48];          /* the track's name (under reg_lock) */
    int retired;            /* its thread ended (under reg_lock) */
    /* The session its records belong to: the owner resets the buffer when
     * it records in a newer one, so no other thread ever writes it. */
    atomic_uint session;
    atomic_size_t n; /* records published (release) */
    atomic_uint_least64_t dropped;
    td__trace_rec *chunks[MAX_CHUNKS]; /* [CHUNK_RECS] each; set by the owner before n covers it */
} trace_buf;

atomic_int td__trace_on;
static atomic_int_least64_t cur_step;
static atomic_uint cur_session = 1;

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static trace_buf *registry;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static _Thread_local trace_buf *tl_buf;
static _Thread_local char tl_name[48];

static const char *const cat_names[TD__TRACE_CATS] = {
    "compute", "update", "comm", "copy", "wait", "idle", "step",
};

const char *td__trace_cat_name(int cat) {
    return cat >= 0 && cat < TD__TRACE_CATS ? cat_names[cat] : "other";
}

/* At a recording thread's end its buffer is kept for the writer, and freed
 * when the next session starts. */
static void on_thread_exit(void *p) {
    trace_buf *b = p;
    pthread_mutex_lock(&reg_lock);
    b->retired = 1;
    pthread_mutex_unlock(&reg_lock);
}

static void make_key(void) {
    (void)pthread_key_create(&exit_key, on_thread_exit);
}

static void buf_free(trace_buf *b) {
    for (size_t c = 0; c < MAX_CHUNKS && b->chunks[c]; c++)
        free(b->chunks[c]);
    free(b);
}

/* This thread's buffer, made and registered at its first record; NULL when
 * there is no memory (its spans are then lost, the run goes on). */
static trace_buf *attach(void) {
    trace_buf *b;
    pthread_once(&key_once, make_key);
    if (!(b = calloc(1, sizeof *b)))
        return NULL;
    memcpy(b->name, tl_name, sizeof b->name);
    pthread_mutex_lock(&reg_lock);
    b->next = registry;
    registry = b;
    pthread_mutex_unlock(&reg_lock);
    (void)pthread_setspecific(exit_key, b);
    tl_buf = b;
    return b;
}

void td__trace_add(const td__trace_rec *r) {
    trace_buf *b = tl_buf ? tl_buf : attach();
    unsigned s = atomic_load_explicit(&cur_session, memory_order_acquire);
    size_t n, c;
    td__trace_rec *dst;
    if (!b)
        return;
    if (atomic_load_explicit(&b->session, memory_order_relaxed) != s) {
        atomic_store_explicit(&b->n, 0, memory_order_relaxed);
        atomic_store_explicit(&b->dropped, 0, memory_order_relaxed);
        atomic_store_explicit(&b->session, s, memory_order_release);
    }
    n = atomic_load_explicit(&b->n, memory_order_relaxed);
    c = n / CHUNK_RECS;
    if (c >= MAX_CHUNKS ||
        (!b->chunks[c] && !(b->chunks[c] = malloc(sizeof(td__trace_rec) * CHUNK_RECS)))) {
        atomic_fetch_add_explicit(&b->dropped, 1, memory_order_relaxed);
        return;
    }
    dst = &b->chunks[c][n % CHUNK_RECS];
    *dst = *r;
    if (!dst->t1)
        dst->t1 = td_clock_ns();
    dst->step = atomic_load_explicit(&cur_step, memory_order_relaxed);
    atomic_store_explicit(&b->n, n + 1, memory_order_release);
}

void td__trace_thread_name(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_name, sizeof tl_name, fmt, ap);
    va_end(ap);
    if (tl_buf) {
        pthread_mutex_lock(&reg_lock);
        memcpy(tl_buf->name, tl_name, sizeof tl_name);
        pthread_mutex_unlock(&reg_lock);
    }
}

void td__trace_start(void) {
    trace_buf **p;
    atomic_store_explicit(&td__trace_on, 0, memory_order_relaxed);
    pthread_mutex_lock(&reg_lock);
    for (p = &registry; *p;) {
        trace_buf *b = *p;
        if (b->retired) {
            *p = b->next;
            buf_free(b);
        } else {
            p = &b->next;
        }
    }
    atomic_fetch_add_explicit(&cur_session, 1, memory_order_release);
    pthread_mutex_unlock(&reg_lock);
}

void td__trace_set_step(int64_t step) {
    atomic_store_explicit(&cur_step, step, memory_order_relaxed);
    atomic_store_explicit(&td__trace_on, 1, memory_order_release);
}

void td__trace_pause(void) {
    atomic_store_explicit(&td__trace_on, 0, memory_order_release);
}

static int by_start(const void *pa, const void *pb) {
    const td__trace_rec *a = pa, *b = pb;
    if (a->t0 != b->t0)
        return a->t0 < b->t0 ? -1 : 1;
    if (a->t1 != b->t1)
        return a->t1 > b->t1 ? -1 : 1;
    return 0;
}

/* Copies b's published records into t. */
static td_status copy_buf(trace_buf *b, td__trace_track *t) {
    size_t n = atomic_load_explicit(&b->n, memory_order_acquire);
    memcpy(t->name, b->name, sizeof t->name);
    t->dropped = atomic_load_explicit(&b->dropped, memory_order_relaxed);
    if (!(t->recs = td__calloc(sizeof *t->recs * (n ? n : 1), "a trace's spans")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i += CHUNK_RECS) {
        size_t k = n - i < CHUNK_RECS ? n - i : CHUNK_RECS;
        memcpy(t->recs + i, b->chunks[i / CHUNK_RECS], sizeof *t->recs * k);
    }
    t->n = n;
    qsort(t->recs, n, sizeof *t->recs, by_start);
    return TD_OK;
}

td_status td__trace_snapshot(td__trace_track **tracks, size_t *ntracks) {
    unsigned s = atomic_load_explicit(&cur_session, memory_order_acquire);
    size_t count = 0, k = 0;
    td__trace_track *out;
    td_status st = TD_OK;
    *tracks = NULL;
    *ntracks = 0;
    pthread_mutex_lock(&reg_lock);
    for (trace_buf *b = registry; b; b = b->next)
        count += atomic_load_explicit(&b->session, memory_order_acquire) == s;
    out = td__calloc(sizeof *out * (count ? count : 1), "a trace's tracks");
    for (trace_buf *b = registry; out && b && st == TD_OK && k < count; b = b->next)
        /* a thread that joined the session since the count waits for the next snapshot */
        if (atomic_load_explicit(&b->session, memory_order_acquire) == s)
            st = copy_buf(b, &out[k++]);
    pthread_mutex_unlock(&reg_lock);
    if (!out)
        return TD_ERR_OUT_OF_MEMORY;
    if (st != TD_OK) {
        td__trace_snapshot_free(out, k);
        return st;
    }
    *tracks = out;
    *ntracks = k;
    return TD_OK;
}

void td__trace_snapshot_free(td__trace_track *tracks, size_t ntracks) {
    for (size_t i = 0; tracks && i < ntracks; i++)
        free(tracks[i].recs);
    free(tracks);
}
