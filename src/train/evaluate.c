/* Evaluation over a data set: on one model (td_evaluate), across a data
 * strategy's replicas (td_evaluate_alternate), or through any strategy
 * (td_evaluate_strategy). The batches' results are added in order, so every
 * way gives one device's numbers. */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "train/train-impl.h"

td_status td_evaluate(td_model *m, const td_dataset *ds, int64_t batch, int64_t max_samples,
                      td_step_result *out) {
    td_loader *l = NULL;
    td_batch b;
    td_step_result r;
    int64_t seen = 0;
    td_status st;
    if (!m || !ds || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_evaluate: NULL argument");
    memset(out, 0, sizeof *out);
    TD_TRY(td_loader_create(ds, batch, 0, 0, &l));
    for (;;) {
        TD_TRY(td_loader_next(l, &b));
        if (b.n == 0)
            break;
        if (max_samples > 0 && seen + b.n > max_samples)
            b.n = max_samples - seen;
        TD_TRY(td_model_evaluate(m, &b, &r));
        out->loss_sum += r.loss_sum;
        out->correct += r.correct;
        out->count += r.count;
        seen += b.n;
        if (max_samples > 0 && seen >= max_samples)
            break;
    }
    td_loader_destroy(l);
    return TD_OK;
fail:
    td_loader_destroy(l);
    return st;
}

/* Host copies of batches: the loader reuses its buffers, and every batch of
 * an alternate evaluation must exist at once. */
typedef struct batch_copy {
    float *x;
    int32_t *tokens, *labels;
} batch_copy;

static void free_copies(batch_copy *c, size_t n) {
    for (size_t i = 0; c && i < n; i++) {
        free(c[i].x);
        free(c[i].tokens);
        free(c[i].labels);
    }
    free(c);
}

/* Evaluates the first max_samples (0: all) of ds, batch samples at a time,
 * through fn(ctx, batches, n, per_batch) over every batch at once; *out
 * gets the batches' sums added in order. */
typedef td_status (*evaluate_fn)(void *ctx, const td_batch *batches, size_t n,
                                 td_step_result *per_batch);

static td_status evaluate_all(evaluate_fn fn, void *ctx, const td_dataset *ds, int64_t batch,
                              int64_t max_samples, td_step_result *out) {
    td_loader *l = NULL;
    td_dataset_info info;
    td_batch b, *batches = NULL;
    td_step_result *res = NULL;
    batch_copy *copies = NULL;
    size_t n = 0, cap = 0;
    int64_t seen = 0;
    td_status st;
    memset(out, 0, sizeof *out);
    td_dataset_get_info(ds, &info);
    TD_TRY(td_loader_create(ds, batch, 0, 0, &l));
    for (;;) {
        size_t nx, nl;
        TD_TRY(td_loader_next(l, &b));
        if (b.n == 0)
            break;
        if (max_samples > 0 && seen + b.n > max_samples)
            b.n = max_samples - seen;
        if (n == cap) {
            size_t c2 = cap ? 2 * cap : 16;
            td_batch *nb = realloc(batches, c2 * sizeof *nb);
            batch_copy *nc = realloc(copies, c2 * sizeof *nc);
            if (nb)
                batches = nb;
            if (nc)
                copies = nc;
            if (!nb || !nc) {
                st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory holding batches");
                goto fail;
            }
            memset(copies + cap, 0, (c2 - cap) * sizeof *copies);
            cap = c2;
        }
        nx = (size_t)(b.n * info.features);
        nl = (size_t)(b.n * info.labels_per_sample);
        copies[n].labels = malloc(nl * sizeof(int32_t));
        if (b.x)
            copies[n].x = malloc(nx * sizeof(float));
        if (b.tokens)
            copies[n].tokens = malloc(nx * sizeof(int32_t));
        if (!copies[n].labels || (b.x && !copies[n].x) || (b.tokens && !copies[n].tokens)) {
            n++;
            st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory holding batches");
            goto fail;
        }
        memcpy(copies[n].labels, b.labels, nl * sizeof(int32_t));
        if (b.x)
            memcpy(copies[n].x, b.x, nx * sizeof(float));
        if (b.tokens)
            memcpy(copies[n].tokens, b.tokens, nx * sizeof(int32_t));
        batches[n] = (td_batch){b.n, copies[n].x, copies[n].tokens, copies[n].labels};
        n++;
        seen += b.n;
        if (max_samples > 0 && seen >= max_samples)
            break;
    }
    res = calloc(n ? n : 1, sizeof *res);
    if (!res) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory");
        goto fail;
    }
    TD_TRY(fn(ctx, batches, n, res));
    for (size_t i = 0; i < n; i++) {
        out->loss_sum += res[i].loss_sum;
        out->correct += res[i].correct;
        out->count += res[i].count;
    }
    st = TD_OK;
fail:
    free(res);
    free(batches);
    free_copies(copies, n);
    td_loader_destroy(l);
    return st;
}

static td_status dp_evaluate(void *ctx, const td_batch *batches, size_t n,
                             td_step_result *per_batch) {
    return td_dp_evaluate(ctx, batches, n, per_batch);
}

td_status td_evaluate_alternate(td_dp *dp, const td_dataset *ds, int64_t batch, int64_t max_samples,
                                td_step_result *out) {
    if (!dp || !ds || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_evaluate_alternate: NULL argument");
    return evaluate_all(dp_evaluate, dp, ds, batch, max_samples, out);
}

static td_status strategy_evaluate(void *ctx, const td_batch *batches, size_t n,
                                   td_step_result *per_batch) {
    return td_strategy_evaluate(ctx, batches, n, per_batch);
}

td_status td_evaluate_strategy(td_strategy *s, const td_dataset *ds, int64_t batch,
                               int64_t max_samples, td_step_result *out) {
    if (!s || !ds || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_evaluate_strategy: NULL argument");
    return evaluate_all(strategy_evaluate, s, ds, batch, max_samples, out);
}
