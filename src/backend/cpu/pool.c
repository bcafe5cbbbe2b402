/* A logical CPU device with several cores runs a kernel on all of them: its
 * host thread takes part 0 and one helper thread per other core takes the
 * rest. Helpers are pinned to their cores, so a device never computes on a
 * core it does not own.
 *
 * A training step is hundreds of small kernels, so the hand-off must cost
 * far less than a sleep and a wake-up (tens of microseconds): the helpers and
 * the host spin for a short while on atomics before they block on a
 * condition variable. The cores spun on are the device's own. */
#include <stdatomic.h>
#include <stdlib.h>

#include "backend/cpu/cpu-impl.h"
#include "core/alloc.h"
#include "core/fpmode.h"
#include "core/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* About 50 microseconds of spinning before blocking. */
#define SPIN_ROUNDS 20000

typedef struct helper {
    cpu_pool *pool;
    int part;
    int pu;
    pthread_t thread;
} helper;

struct cpu_pool {
    int nthreads; /* helpers + the host thread */
    helper *helpers;
    hwloc_topology_t topo;
    pthread_mutex_t lock;
    pthread_cond_t start, finished;
    atomic_ulong generation; /* one more per kernel */
    atomic_int pending;      /* helpers still running this kernel */
    atomic_int stopping;
    td_cpu_part_fn fn; /* written before generation is bumped */
    void *arg;
    int denormals; /* the device's td__denormals, set by each helper on itself */
};

/* Waits until the generation moves past seen (or the pool stops). */
static unsigned long wait_for_work(cpu_pool *pool, unsigned long seen) {
    unsigned long g;
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        if ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) != seen ||
            atomic_load(&pool->stopping))
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&pool->lock);
    while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stopping))
        pthread_cond_wait(&pool->start, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    return g;
}

static void *helper_main(void *p) {
    helper *h = p;
    cpu_pool *pool = h->pool;
    unsigned long seen = 0;
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (set) {
        hwloc_bitmap_only(set, (unsigned)h->pu);
        if (hwloc_set_cpubind(pool->topo, set, HWLOC_CPUBIND_THREAD) != 0)
            TD_LOG_DEBUG("could not pin a helper thread to logical CPU %d", h->pu);
        hwloc_bitmap_free(set);
    }
    td__denormals_set((td__denormals)pool->denormals);
    for (;;) {
        seen = wait_for_work(pool, seen);
        if (atomic_load(&pool->stopping))
            return NULL;
        pool->fn(pool->arg, h->part, pool->nthreads);
        if (atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel) == 1) {
            /* The last helper wakes the host if it went to sleep. */
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->finished);
            pthread_mutex_unlock(&pool->lock);
        }
    }
}

td_status td__cpu_pool_create(cpu_device *cd, hwloc_topology_t topo) {
    cpu_pool *pool;
    cd->pool = NULL;
    if (cd->npus <= 1)
        return TD_OK;
    pool = td__calloc(sizeof *pool, "a CPU thread pool");
    if (!pool)
        return TD_ERR_OUT_OF_MEMORY;
    pool->helpers = td__calloc(sizeof *pool->helpers * (size_t)cd->npus, "a CPU thread pool");
    if (!pool->helpers) {
        free(pool);
        return TD_ERR_OUT_OF_MEMORY;
    }
    pool->topo = topo;
    pool->denormals = cd->denormals;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->start, NULL);
    pthread_cond_init(&pool->finished, NULL);
    atomic_init(&pool->generation, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->stopping, 0);
    pool->nthreads = 1;
    for (int i = 1; i < cd->npus; i++) {
        helper *h = &pool->helpers[i];
        h->pool = pool;
        h->part = i;
        h->pu = cd->pus[i];
        if (pthread_create(&h->thread, NULL, helper_main, h) != 0) {
            TD_LOG_WARN("could only start %d of %d threads for a CPU device", i, cd->npus);
            break;
        }
        pool->nthreads++;
    }
    cd->pool = pool;
    return TD_OK;
}

void td__cpu_pool_destroy(cpu_pool *pool) {
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->stopping, 1);
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->nthreads; i++)
        pthread_join(pool->helpers[i].thread, NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->start);
    pthread_cond_destroy(&pool->finished);
    free(pool->helpers);
    free(pool);
}

int td__cpu_threads(const cpu_device *cd) {
    return cd->pool ? cd->pool->nthreads : 1;
}

void td__cpu_parallel(cpu_device *cd, td_cpu_part_fn fn, void *arg) {
    cpu_pool *pool = cd->pool;
    int spins = 0;
    if (!pool || pool->nthreads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->pending, pool->nthreads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_release);
    /* Under the lock, so a helper between its check and its wait still hears it. */
    pthread_mutex_lock(&pool->lock);
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);

    fn(arg, 0, pool->nthreads);

    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0 && spins++ < SPIN_ROUNDS)
        cpu_relax();
    if (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&pool->lock);
        while (atomic_load(&pool->pending) > 0)
            pthread_cond_wait(&pool->finished, &pool->lock);
        pthread_mutex_unlock(&pool->lock);
    }
}
