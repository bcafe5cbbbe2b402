/* Seeded shuffling and batching over a data set. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "train/train-impl.h"

/* Tells the shuffle's Philox counters apart from other uses of the seed. */
#define TD_SHUFFLE_DOMAIN 0x53687566u /* "Shuf" */

struct td_loader {
    const td_dataset *ds;
    td_dataset_info info;
    int64_t batch;
    uint64_t seed;
    int shuffle;
    int64_t epoch, pos; /* the next batch starts at order[pos] of epoch */
    int64_t perm_epoch; /* the epoch order[] holds, -1: none */
    int64_t *order;     /* (size) */
    float *x;           /* (batch, features) */
    int32_t *tokens;    /* (batch, T) */
    int32_t *labels;    /* (batch, labels_per_sample) */
};

void td_loader_destroy(td_loader *l) {
    if (!l)
        return;
    free(l->order);
    free(l->x);
    free(l->tokens);
    free(l->labels);
    free(l);
}

td_status td_loader_create(const td_dataset *ds, int64_t batch, uint64_t seed, int shuffle,
                           td_loader **out) {
    td_loader *l = NULL;
    size_t b;
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
    b = (size_t)batch;
    if (!(l->order = td__calloc((size_t)l->info.size * sizeof *l->order, "a shuffle order")) ||
        !(l->labels = td__calloc(b * (size_t)l->info.labels_per_sample * sizeof *l->labels,
                                 "a batch of labels")))
        goto oom;
    if (l->info.kind == TD_INPUT_FEATURES) {
        if (!(l->x = td__calloc(b * (size_t)l->info.features * sizeof *l->x, "a batch of inputs")))
            goto oom;
    } else if (!(l->tokens = td__calloc(b * (size_t)l->info.features * sizeof *l->tokens,
                                        "a batch of tokens"))) {
        goto oom;
    }
    *out = l;
    return TD_OK;
oom:
    td_loader_destroy(l);
    return TD_ERR_OUT_OF_MEMORY;
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

static void ensure_order(td_loader *l) {
    if (l->perm_epoch != l->epoch) {
        make_order(l, l->epoch, l->order);
        l->perm_epoch = l->epoch;
    }
}

td_status td_loader_next(td_loader *l, td_batch *out) {
    td_status st;
    int64_t n, f, lp;
    if (!l || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_loader_next: loader or out is NULL");
    memset(out, 0, sizeof *out);
    if (l->pos >= l->info.size) {
        l->epoch++;
        l->pos = 0;
        return TD_OK; /* n == 0: the epoch ended */
    }
    ensure_order(l);
    n = l->info.size - l->pos < l->batch ? l->info.size - l->pos : l->batch;
    f = l->info.features;
    lp = l->info.labels_per_sample;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = l->order[l->pos + i];
        if ((st = td_dataset_get(l->ds, s, l->x ? l->x + i * f : NULL,
                                 l->tokens ? l->tokens + i * f : NULL, l->labels + i * lp)) !=
            TD_OK)
            return st;
    }
    l->pos += n;
    out->n = n;
    out->x = l->x;
    out->tokens = l->tokens;
    out->labels = l->labels;
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
