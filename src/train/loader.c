/* Seeded shuffling and batching over a data set, with the next batch made
 * ahead of time.
 *
 * Prefetch. Turning a batch's samples into floats or tokens (td_dataset_get)
 * is serial work: 0.5 ms of a 5 ms MLP step at batch 1024, during which the
 * devices would wait. So once a batch is handed out, a thread of the loader's
 * own fills the next one into a second buffer (double buffering) while the
 * caller trains on the first. The next batch is known in advance: it starts
 * where the one handed out ended, or at the next epoch's start. Nothing the
 * caller sees changes: the same batches in the same order, bit for bit, and
 * td_loader_position() says where the batch after the one handed out starts,
 * not where the prefetched one ends. A seek makes the guess useless: the job
 * is cancelled and the next call fills its batch itself, as does any call
 * whose job failed (so the error and its message come on the caller's
 * thread).
 *
 * Ownership. epoch and pos are the caller's alone. order[], perm_epoch and
 * the two slots are the caller's while no job is out (state IDLE); from the
 * moment the thread takes a job (QUEUED -> RUNNING) to its end (DONE) they
 * are the thread's, all but the slot handed out, which the caller may still
 * read. A job the thread has not taken yet, the caller takes back and does
 * itself (QUEUED -> IDLE): on a machine busier than its cores the thread may
 * not run for a while, and the caller then loses nothing by having asked.
 * A job already running it waits for (polling a while, as the device
 * threads do, then on a condition variable). The thread computes in the
 * floating-point mode of the thread that started it (core/fpmode.h), so a
 * prefetched batch is the one the caller would have made.
 *
 * When. TANDEM_PREFETCH=0 never prefetches (for comparisons), =1 always;
 * otherwise a loader prefetches when a batch holds at least PREFETCH_MIN
 * values, below which the hand-off costs about what it saves. The first two
 * batches are made in place, so a loader read once (a calibration batch)
 * starts no thread. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fpmode.h"
#include "core/log.h"
#include "core/spin.h"
#include "train/train-impl.h"

/* Tells the shuffle's Philox counters apart from other uses of the seed. */
#define TD_SHUFFLE_DOMAIN 0x53687566u /* "Shuf" */

/* Values (batch x features) from which a loader prefetches by default. */
#define PREFETCH_MIN 16384

/* Batches made in place before the thread starts. */
#define PREFETCH_AFTER 2

typedef struct slot {
    float *x;        /* (batch, features), NULL for tokens */
    int32_t *tokens; /* (batch, T), NULL for features */
    int32_t *labels; /* (batch, labels_per_sample) */
} slot;

/* A job's life: the caller queues it (from IDLE or DONE) and may take it
 * back before the thread starts it (QUEUED -> IDLE); the thread moves it
 * QUEUED -> RUNNING -> DONE, and it stays DONE, its result there to read,
 * until the caller queues the next. */
enum { JOB_IDLE, JOB_QUEUED, JOB_RUNNING, JOB_DONE };

typedef struct prefetcher {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;     /* a job was queued, or quit */
    pthread_cond_t finished; /* the job is DONE */
    int quit;                /* under lock */
    uint64_t fp_control;     /* the starting thread's (td__fp_control_get) */
    atomic_int state;        /* JOB_* */
    atomic_int cancel;       /* the running job is no longer wanted: stop early */
    /* The job, written by the caller while IDLE, before it is QUEUED. */
    int64_t epoch, pos;
    int slot;
    /* Its result, written by the thread before DONE: n samples, or ok = 0
     * when it failed or was cancelled. */
    int64_t n;
    int ok;
} prefetcher;

struct td_loader {
    const td_dataset *ds;
    td_dataset_info info;
    int64_t batch;
    uint64_t seed;
    int shuffle;
    int64_t epoch, pos; /* the next batch starts at order[pos] of epoch */
    int64_t perm_epoch; /* the epoch order[] holds, -1: none */
    int64_t *order;     /* (size) */
    slot slots[2];      /* slots[1] is allocated when the thread starts */
    int out;            /* the slot handed out last */
    int64_t handed;     /* batches handed out */
    int prefetch;       /* 1: prefetch from the PREFETCH_AFTER-th batch on */
    prefetcher *pf;     /* NULL until the first job */
    /* The job out or finished and not yet taken: (ahead_epoch, ahead_pos)
     * into slot 1 - out. */
    int ahead;
    int64_t ahead_epoch, ahead_pos;
};

static void slot_free(slot *s) {
    free(s->x);
    free(s->tokens);
    free(s->labels);
    memset(s, 0, sizeof *s);
}

static td_status slot_alloc(const td_loader *l, slot *s) {
    size_t b = (size_t)l->batch, f = (size_t)l->info.features;
    if (!(s->labels = td__calloc(b * (size_t)l->info.labels_per_sample * sizeof *s->labels,
                                 "a batch of labels")) ||
        (l->info.kind == TD_INPUT_FEATURES
             ? !(s->x = td__calloc(b * f * sizeof *s->x, "a batch of inputs"))
             : !(s->tokens = td__calloc(b * f * sizeof *s->tokens, "a batch of tokens")))) {
        slot_free(s);
        return TD_ERR_OUT_OF_MEMORY;
    }
    return TD_OK;
}

/* Makes the caller the owner (see the top): takes the job back if the
 * thread has not started it, or waits for its end. Returns 1 when a job ran
 * to its end (DONE: its result is there to read), 0 when there is none. */
static int settle(const td_loader *l) {
    prefetcher *pf = l->pf;
    int queued = JOB_QUEUED, st;
    uint64_t start, budget;
    if (!pf)
        return 0;
    st = atomic_load_explicit(&pf->state, memory_order_acquire);
    if (st == JOB_IDLE || st == JOB_DONE)
        return st == JOB_DONE;
    if (atomic_compare_exchange_strong_explicit(&pf->state, &queued, JOB_IDLE, memory_order_acquire,
                                                memory_order_acquire))
        return 0;
    /* Running. A sleep costs a wake-up of tens of microseconds (core/spin.h). */
    start = td_clock_ns();
    budget = td__spin_ns();
    while (atomic_load_explicit(&pf->state, memory_order_acquire) != JOB_DONE &&
           td_clock_ns() - start < budget)
        sched_yield();
    pthread_mutex_lock(&pf->lock);
    while (atomic_load_explicit(&pf->state, memory_order_acquire) != JOB_DONE)
        pthread_cond_wait(&pf->finished, &pf->lock);
    pthread_mutex_unlock(&pf->lock);
    return 1;
}

static void prefetcher_stop(td_loader *l) {
    prefetcher *pf = l->pf;
    if (!pf)
        return;
    atomic_store_explicit(&pf->cancel, 1, memory_order_relaxed);
    pthread_mutex_lock(&pf->lock);
    pf->quit = 1;
    pthread_cond_signal(&pf->wake);
    pthread_mutex_unlock(&pf->lock);
    pthread_join(pf->thread, NULL);
    pthread_mutex_destroy(&pf->lock);
    pthread_cond_destroy(&pf->wake);
    pthread_cond_destroy(&pf->finished);
    free(pf);
    l->pf = NULL;
    l->ahead = 0;
}

void td_loader_destroy(td_loader *l) {
    if (!l)
        return;
    prefetcher_stop(l);
    free(l->order);
    slot_free(&l->slots[0]);
    slot_free(&l->slots[1]);
    free(l);
}

/* TANDEM_PREFETCH: 0 never, 1 always, unset by the batch's size. */
static int prefetch_default(const td_loader *l) {
    const char *s = getenv("TANDEM_PREFETCH");
    if (s && !strcmp(s, "0"))
        return 0;
    if (s && !strcmp(s, "1"))
        return 1;
    if (s && *s)
        TD_LOG_WARN("TANDEM_PREFETCH=%s is neither 0 nor 1; prefetching by batch size", s);
    return l->batch * l->info.features >= PREFETCH_MIN;
}

td_status td_loader_create(const td_dataset *ds, int64_t batch, uint64_t seed, int shuffle,
                           td_loader **out) {
    td_loader *l = NULL;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_loader_create: out is NULL");
    *out = NULL;
    if (!ds)
        return td__error(TD_ERR_INVALID_ARG, "td_loader_create: data set is NULL");
    if (batch < 1 || batch > (1 << 24))
        return td__error(TD_ERR_INVALID_ARG, "batch size %lld is outside [1, 16777216]",
                         (long long)batch);
    if (!(l = td__calloc(sizeof *l, "a loader")))
        return TD_ERR_OUT_OF_MEMORY;
    l->ds = ds;
    td_dataset_get_info(ds, &l->info);
    l->batch = batch;
    l->seed = seed;
    l->shuffle = shuffle;
    l->perm_epoch = -1;
    l->prefetch = prefetch_default(l);
    if (!(l->order = td__calloc((size_t)l->info.size * sizeof *l->order, "a shuffle order")) ||
        slot_alloc(l, &l->slots[0]) != TD_OK) {
        td_loader_destroy(l);
        return TD_ERR_OUT_OF_MEMORY;
    }
    *out = l;
    return TD_OK;
}

void td__loader_set_prefetch(td_loader *l, int on) {
    if (l)
        l->prefetch = on != 0;
}

/* Fisher-Yates from the end: position i swaps with j uniform in [0, i],
 * j drawn from Philox(key seed, counter (i, epoch, domain)). */
static void make_order(const td_loader *l, int64_t epoch, int64_t *order) {
    int64_t n = l->info.size;
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    if (!l->shuffle)
        return;
    for (int64_t i = n - 1; i > 0; i--) {
        uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), (uint32_t)epoch,
                           TD_SHUFFLE_DOMAIN ^ (uint32_t)((uint64_t)epoch >> 32)};
        uint32_t r[4];
        uint64_t u, j, span = (uint64_t)i + 1;
        td_philox(ctr, l->seed, r);
        /* 64 random bits times span, high word: uniform up to span / 2^64. */
        u = (uint64_t)r[0] << 32 | r[1];
        j = (uint64_t)(((unsigned __int128)u * span) >> 64);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
}

/* Fills slot s with the batch at position pos of epoch's order: *n samples.
 * Run by whoever owns order[] and the slot (see the top). A set *cancel
 * stops it early with *n = -1. */
static td_status fill(td_loader *l, int64_t epoch, int64_t pos, int s, const atomic_int *cancel,
                      int64_t *n) {
    td_status st;
    slot *sl = &l->slots[s];
    int64_t f = l->info.features, lp = l->info.labels_per_sample;
    int64_t count = l->info.size - pos < l->batch ? l->info.size - pos : l->batch;
    *n = -1;
    if (l->perm_epoch != epoch) {
        make_order(l, epoch, l->order);
        l->perm_epoch = epoch;
    }
    for (int64_t i = 0; i < count; i++) {
        int64_t smp = l->order[pos + i];
        if (cancel && atomic_load_explicit(cancel, memory_order_relaxed))
            return TD_OK;
        if ((st = td_dataset_get(l->ds, smp, sl->x ? sl->x + i * f : NULL,
                                 sl->tokens ? sl->tokens + i * f : NULL, sl->labels + i * lp)) !=
            TD_OK)
            return st;
    }
    *n = count;
    return TD_OK;
}

static void *prefetch_main(void *p) {
    td_loader *l = p;
    prefetcher *pf = l->pf;
    td__fp_control_set(pf->fp_control);
    pthread_mutex_lock(&pf->lock);
    for (;;) {
        int queued = JOB_QUEUED, ok;
        int64_t n;
        while (!pf->quit && atomic_load_explicit(&pf->state, memory_order_relaxed) != JOB_QUEUED)
            pthread_cond_wait(&pf->wake, &pf->lock);
        if (pf->quit)
            break;
        pthread_mutex_unlock(&pf->lock);
        /* The caller may have taken it back meanwhile. */
        if (atomic_compare_exchange_strong_explicit(&pf->state, &queued, JOB_RUNNING,
                                                    memory_order_acquire, memory_order_relaxed)) {
            ok = fill(l, pf->epoch, pf->pos, pf->slot, &pf->cancel, &n) == TD_OK && n >= 0;
            pf->n = n;
            pf->ok = ok;
            atomic_store_explicit(&pf->state, JOB_DONE, memory_order_release);
            /* Under the lock, so that a caller between its check and its
             * wait still hears it. */
            pthread_mutex_lock(&pf->lock);
            pthread_cond_signal(&pf->finished);
        } else {
            pthread_mutex_lock(&pf->lock);
        }
    }
    pthread_mutex_unlock(&pf->lock);
    return NULL;
}

/* Starts the thread (and the second slot); on failure the loader stays
 * synchronous. */
static int prefetcher_start(td_loader *l) {
    prefetcher *pf;
    if (slot_alloc(l, &l->slots[1]) != TD_OK)
        return 0;
    if (!(pf = td__calloc(sizeof *pf, "a loader's prefetch thread"))) {
        slot_free(&l->slots[1]);
        return 0;
    }
    pthread_mutex_init(&pf->lock, NULL);
    pthread_cond_init(&pf->wake, NULL);
    pthread_cond_init(&pf->finished, NULL);
    atomic_init(&pf->state, JOB_IDLE);
    atomic_init(&pf->cancel, 0);
    pf->fp_control = td__fp_control_get();
    l->pf = pf;
    if (pthread_create(&pf->thread, NULL, prefetch_main, l) != 0) {
        TD_LOG_DEBUG("could not start a loader's prefetch thread; loading in place");
        pthread_mutex_destroy(&pf->lock);
        pthread_cond_destroy(&pf->wake);
        pthread_cond_destroy(&pf->finished);
        free(pf);
        l->pf = NULL;
        slot_free(&l->slots[1]);
        return 0;
    }
    return 1;
}

/* Gives the thread the batch after the one in slot `out`, into the other
 * slot. The caller owns everything (settle). */
static void prefetch_next(td_loader *l) {
    prefetcher *pf;
    if (!l->pf && !prefetcher_start(l)) {
        l->prefetch = 0;
        return;
    }
    pf = l->pf;
    l->ahead = 1;
    l->ahead_epoch = l->pos < l->info.size ? l->epoch : l->epoch + 1;
    l->ahead_pos = l->pos < l->info.size ? l->pos : 0;
    pf->epoch = l->ahead_epoch;
    pf->pos = l->ahead_pos;
    pf->slot = 1 - l->out;
    atomic_store_explicit(&pf->cancel, 0, memory_order_relaxed);
    atomic_store_explicit(&pf->state, JOB_QUEUED, memory_order_release);
    pthread_mutex_lock(&pf->lock);
    pthread_cond_signal(&pf->wake);
    pthread_mutex_unlock(&pf->lock);
}

td_status td_loader_next(td_loader *l, td_batch *out) {
    int64_t n = -1;
    int s;
    if (!l || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_loader_next: loader or out is NULL");
    memset(out, 0, sizeof *out);
    if (l->pos >= l->info.size) {
        l->epoch++;
        l->pos = 0;
        return TD_OK; /* n == 0: the epoch ended */
    }
    if (settle(l) && l->ahead && l->pf->ok && l->ahead_epoch == l->epoch &&
        l->ahead_pos == l->pos) {
        s = 1 - l->out;
        n = l->pf->n;
    } else {
        td_status st;
        /* The slot handed out last: its batch is no longer the caller's. */
        s = l->out;
        l->ahead = 0;
        if ((st = fill(l, l->epoch, l->pos, s, NULL, &n)) != TD_OK)
            return st;
    }
    l->ahead = 0;
    l->out = s;
    l->pos += n;
    l->handed++;
    if (l->prefetch && l->handed >= PREFETCH_AFTER)
        prefetch_next(l);
    out->n = n;
    out->x = l->slots[s].x;
    out->tokens = l->slots[s].tokens;
    out->labels = l->slots[s].labels;
    return TD_OK;
}

void td_loader_position(const td_loader *l, int64_t *epoch, int64_t *index) {
    if (epoch)
        *epoch = l ? l->epoch : 0;
    if (index)
        *index = l ? l->pos : 0;
}

td_status td_loader_seek(td_loader *l, int64_t epoch, int64_t index) {
    if (!l)
        return td__error(TD_ERR_INVALID_ARG, "td_loader_seek: loader is NULL");
    if (epoch < 0 || index < 0 || index > l->info.size)
        return td__error(TD_ERR_INVALID_ARG,
                         "data position (epoch %lld, sample %lld) is outside the data set of %lld",
                         (long long)epoch, (long long)index, (long long)l->info.size);
    l->epoch = epoch;
    l->pos = index;
    /* The batch being made is not the next one any more: the next call
     * takes it back or waits for its early end. */
    if (l->ahead) {
        atomic_store_explicit(&l->pf->cancel, 1, memory_order_relaxed);
        l->ahead = 0;
    }
    return TD_OK;
}

int64_t td_loader_batches_per_epoch(const td_loader *l) {
    return l ? (l->info.size + l->batch - 1) / l->batch : 0;
}

td_status td_loader_order(const td_loader *l, int64_t epoch, int64_t i, int64_t *sample) {
    if (!l || !sample || epoch < 0 || i < 0 || i >= l->info.size)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_loader_order: position %lld of epoch %lld is "
                         "outside the data set",
                         (long long)i, (long long)epoch);
    /* order[] may be the thread's while it works. */
    (void)settle(l);
    if (l->perm_epoch == epoch) {
        *sample = l->order[i];
        return TD_OK;
    }
    int64_t *tmp = malloc((size_t)l->info.size * sizeof *tmp);
    if (!tmp)
        return td__error(TD_ERR_OUT_OF_MEMORY, "td_loader_order: no memory");
    make_order(l, epoch, tmp);
    *sample = tmp[i];
    free(tmp);
    return TD_OK;
}
