/* A logical CPU device with several cores runs a kernel on all of them: its
 * host thread takes part 0 and one helper thread per other core takes the
 * rest. Helpers are pinned to their cores, so a device never computes on a
 * core it does not own. */
#include <stdlib.h>

#include "backend/cpu/cpu-impl.h"
#include "core/alloc.h"
#include "core/log.h"

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
    unsigned long generation;
    int pending;
    int stopping;
    td_cpu_part_fn fn;
    void *arg;
};

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
    for (;;) {
        td_cpu_part_fn fn;
        void *arg;
        pthread_mutex_lock(&pool->lock);
        while (pool->generation == seen && !pool->stopping)
            pthread_cond_wait(&pool->start, &pool->lock);
        if (pool->stopping) {
            pthread_mutex_unlock(&pool->lock);
            return NULL;
        }
        seen = pool->generation;
        fn = pool->fn;
        arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);

        fn(arg, h->part, pool->nthreads);

        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->finished);
        pthread_mutex_unlock(&pool->lock);
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
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->start, NULL);
    pthread_cond_init(&pool->finished, NULL);
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
    pool->stopping = 1;
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
    if (!pool || pool->nthreads == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->pending = pool->nthreads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->start);
    pthread_mutex_unlock(&pool->lock);

    fn(arg, 0, pool->nthreads);

    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->finished, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
