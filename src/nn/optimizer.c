/* Optimizers: SGD with momentum (and Nesterov), AdamW; warm-up and cosine
 * learning-rate schedules; clipping by the global gradient norm. The update
 * rules follow torch.optim.SGD and torch.optim.AdamW. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/trace.h"
#include "nn/nn-impl.h"

struct td_optimizer {
    td_model *m;
    td_optimizer_config cfg;
    int64_t steps;
    int shard, shards; /* ZeRO-1: this optimizer's shard of `shards` (0 of 1: all) */
    td_sumsq_reduce_fn reduce;
    void *reduce_arg;
    int skip_replicated; /* a shard's: leave its whole parameters out of the norm */
    double *terms;       /* (2 * nparams): the norm's sums of squares, for `reduce` */
    int per_param;       /* state tensors per parameter: 0, 1 (SGD) or 2 (AdamW) */
    size_t nstate;
    td_tensor **state;
    char **names;
    /* (nparams): updated already in the step under way (td_optimizer_step_params) */
    unsigned char *stepped;
};

static td_status check_config(const td_optimizer_config *c) {
    if (c->kind != TD_OPT_SGD && c->kind != TD_OPT_ADAMW)
        return td__error(TD_ERR_INVALID_ARG, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->lr >= 0) || !isfinite(c->lr))
        return td__error(TD_ERR_INVALID_ARG, "optimizer: learning rate %g", c->lr);
    if (!(c->momentum >= 0 && c->momentum < 1))
        return td__error(TD_ERR_INVALID_ARG, "optimizer: momentum %g is not in [0, 1)",
                         c->momentum);
    if (c->kind == TD_OPT_SGD && c->nesterov && c->momentum <= 0)
        return td__error(TD_ERR_INVALID_ARG, "optimizer: Nesterov needs a momentum above 0");
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 >= 0 && c->beta2 < 1))
        return td__error(TD_ERR_INVALID_ARG, "optimizer: betas (%g, %g) are not in [0, 1)",
                         c->beta1, c->beta2);
    if (!(c->eps >= 0) || !(c->weight_decay >= 0) || !(c->clip_norm >= 0) || !(c->min_lr >= 0))
        return td__error(TD_ERR_INVALID_ARG,
                         "optimizer: eps, weight decay, clip norm and min lr must be >= 0");
    if (c->schedule != TD_LR_CONSTANT && c->schedule != TD_LR_COSINE)
        return td__error(TD_ERR_INVALID_ARG, "optimizer: unknown schedule %d", (int)c->schedule);
    if (c->warmup_steps < 0 || c->total_steps < 0)
        return td__error(TD_ERR_INVALID_ARG, "optimizer: negative step counts");
    if (c->schedule == TD_LR_COSINE && c->total_steps <= 0)
        return td__error(TD_ERR_INVALID_ARG, "optimizer: the cosine schedule needs total_steps");
    return TD_OK;
}

void td_optimizer_shard_range(size_t numel, int rank, int size, size_t *first, size_t *count,
                              size_t *tail_first, size_t *tail) {
    size_t c = size > 0 ? numel / (size_t)size : numel;
    *first = (size_t)rank * c;
    *count = c;
    *tail_first = c * (size_t)(size > 0 ? size : 1);
    *tail = numel - *tail_first;
}

td_status td_optimizer_create(td_model *m, const td_optimizer_config *cfg, td_optimizer **out) {
    return td_optimizer_create_shard(m, cfg, 0, 1, out);
}

td_status td_optimizer_create_shard(td_model *m, const td_optimizer_config *cfg, int rank, int size,
                                    td_optimizer **out) {
    td_optimizer *o = NULL;
    td_status st;
    static const char *const sgd_names[] = {"momentum_buffer"};
    static const char *const adam_names[] = {"exp_avg", "exp_avg_sq"};
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_optimizer_create: out is NULL");
    *out = NULL;
    if (!m || !cfg)
        return td__error(TD_ERR_INVALID_ARG, "td_optimizer_create: model or config is NULL");
    if (size < 1 || rank < 0 || rank >= size)
        return td__error(TD_ERR_INVALID_ARG, "td_optimizer_create_shard: shard %d of %d", rank,
                         size);
    if ((st = check_config(cfg)) != TD_OK)
        return st;
    if (!(o = td__calloc(sizeof *o, "an optimizer")))
        return TD_ERR_OUT_OF_MEMORY;
    o->m = m;
    o->cfg = *cfg;
    o->shard = rank;
    o->shards = size;
    o->per_param = cfg->kind == TD_OPT_ADAMW ? 2 : cfg->momentum > 0 ? 1 : 0;
    o->nstate = m->nparams * (size_t)o->per_param;
    o->stepped = td__calloc(m->nparams + 1, "optimizer state");
    if (!(o->terms = td__calloc(sizeof *o->terms * (2 * m->nparams + 1), "optimizer state")) ||
        !o->stepped) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    if (o->nstate) {
        o->state = td__calloc(sizeof *o->state * o->nstate, "optimizer state");
        o->names = td__calloc(sizeof *o->names * o->nstate, "optimizer state");
        if (!o->state || !o->names) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
    }
    for (size_t i = 0; i < m->nparams; i++)
        for (int k = 0; k < o->per_param; k++) {
            size_t j = i * (size_t)o->per_param + (size_t)k;
            const td_tensor *p = m->params[i];
            char buf[192];
            snprintf(buf, sizeof buf, "%s.%s", m->names[i],
                     cfg->kind == TD_OPT_ADAMW ? adam_names[k] : sgd_names[k]);
            if (!(o->names[j] = td__strdup(buf))) {
                st = TD_ERR_OUT_OF_MEMORY;
                goto fail;
            }
            size_t first, count, tail_first, tail;
            int64_t len;
            td_optimizer_shard_range(p->numel, rank, size, &first, &count, &tail_first, &tail);
            len = (int64_t)(count + tail);
            if ((st = size == 1
                          ? td_tensor_create(m->dev, m->dtype, p->ndim, p->shape, &o->state[j])
                          : td_tensor_create(m->dev, m->dtype, 1, &len, &o->state[j])) != TD_OK ||
                (st = td_tensor_fill(o->state[j], 0.0)) != TD_OK)
                goto fail;
        }
    *out = o;
    return TD_OK;
fail:
    td_optimizer_destroy(o);
    return st;
}

void td_optimizer_destroy(td_optimizer *o) {
    if (!o)
        return;
    for (size_t i = 0; i < o->nstate; i++) {
        if (o->state)
            td_tensor_destroy(o->state[i]);
        if (o->names)
            free(o->names[i]);
    }
    free(o->state);
    free(o->names);
    free(o->terms);
    free(o->stepped);
    free(o);
}

static double lr_at(const td_optimizer_config *c, int64_t step) {
    double lr = c->lr;
    if (c->warmup_steps > 0 && step < c->warmup_steps)
        return lr * (double)(step + 1) / (double)c->warmup_steps;
    if (c->schedule == TD_LR_COSINE) {
        double span = (double)(c->total_steps - c->warmup_steps);
        double t = span > 0 ? (double)(step - c->warmup_steps) / span : 1.0;
        if (t > 1)
            t = 1;
        if (t < 0)
            t = 0;
        lr = c->min_lr + 0.5 * (c->lr - c->min_lr) * (1.0 + cos(3.14159265358979323846 * t));
    }
    return lr;
}

double td_optimizer_lr(const td_optimizer *o) {
    return o ? lr_at(&o->cfg, o->steps) : 0.0;
}
int64_t td_optimizer_steps(const td_optimizer *o) {
    return o ? o->steps : 0;
}
void td_optimizer_set_steps(td_optimizer *o, int64_t steps) {
    if (!o)
        return;
    o->steps = steps < 0 ? 0 : steps;
    memset(o->stepped, 0, o->m->nparams); /* a step begun is forgotten */
}
void td_optimizer_set_sumsq_reduce(td_optimizer *o, td_sumsq_reduce_fn reduce, void *arg) {
    if (o) {
        o->reduce = reduce;
        o->reduce_arg = arg;
    }
}
void td_optimizer_set_sumsq_skip_replicated(td_optimizer *o, int skip) {
    if (o)
        o->skip_replicated = skip ? 1 : 0;
}
int td_optimizer_shard_rank(const td_optimizer *o) {
    return o ? o->shard : 0;
}
int td_optimizer_shard_count(const td_optimizer *o) {
    return o ? o->shards : 1;
}
size_t td_optimizer_state_count(const td_optimizer *o) {
    return o ? o->nstate : 0;
}
td_tensor *td_optimizer_state(td_optimizer *o, size_t i) {
    return o && i < o->nstate ? o->state[i] : NULL;
}
const char *td_optimizer_state_name(const td_optimizer *o, size_t i) {
    return o && i < o->nstate ? o->names[i] : NULL;
}

typedef struct opt_step_args {
    td_optimizer *o;
    int want_norm; /* clipping or the caller needs the norm */
    double norm;
} opt_step_args;

/* The part of parameter i this optimizer owns: its own elements (part 0) and
 * the tail (part 1), as views of the parameter, its gradient and the state
 * tensors' matching elements (state[] gets up to 2). Returns 0 for an empty
 * part. A whole optimizer's part 0 is the whole tensor, and it has no part 1. */
static int part_views(td_optimizer *o, size_t i, int part, td_tensor *w, td_tensor *g,
                      td_tensor state[2]) {
    td_model *m = o->m;
    size_t first, count, tail_first, tail, off, len, soff;
    int64_t n;
    if (o->shards == 1) {
        if (part)
            return 0;
        *w = *m->params[i];
        *g = *m->grads[i];
        for (int k = 0; k < o->per_param; k++)
            state[k] = *o->state[i * (size_t)o->per_param + (size_t)k];
        return 1;
    }
    td_optimizer_shard_range(m->params[i]->numel, o->shard, o->shards, &first, &count, &tail_first,
                             &tail);
    off = part ? tail_first : first;
    len = part ? tail : count;
    soff = part ? count : 0;
    if (!len)
        return 0;
    n = (int64_t)len;
    /* In range by construction: the views cannot fail. */
    (void)td__tensor_view(w, m->params[i], off, 1, &n);
    (void)td__tensor_view(g, m->grads[i], off, 1, &n);
    for (int k = 0; k < o->per_param; k++)
        (void)td__tensor_view(&state[k], o->state[i * (size_t)o->per_param + (size_t)k], soff, 1,
                              &n);
    return 1;
}

/* The squared norm of the gradient: of the part this optimizer owns, summed
 * over the shards by its reducer (the tail counted by shard 0 only). The sum
 * runs over the parameters in order, each one's shard before its tail, so a
 * reducer given the terms can sum a whole model's the same way. */
static td_status grad_sumsq(td_optimizer *o, double *sum) {
    double shared = 0;
    td_status st;
    *sum = 0;
    memset(o->terms, 0, sizeof *o->terms * 2 * o->m->nparams);
    for (size_t i = 0; i < o->m->nparams; i++)
        for (int part = 0; part < 2; part++) {
            td_tensor w, g, state[2];
            double *s = &o->terms[2 * i + (size_t)part];
            if ((part && o->shard != 0) || !part_views(o, i, part, &w, &g, state))
                continue;
            if (o->skip_replicated && o->m->splits && o->m->slices[i].dim < 0)
                continue;
            if ((st = td__op_sumsq(&g, s)) != TD_OK)
                return st;
            /* rows held by two shards count once: the lower one's */
            if (o->shards == 1 && (st = td__slice_shared_sumsq(o->m, i, &shared)) != TD_OK)
                return st;
            *s -= shared;
            *sum += *s;
        }
    return o->reduce ? o->reduce(o->reduce_arg, o->terms, 2 * o->m->nparams, sum) : TD_OK;
}

/* The arguments of the update kernels for the step under way, the gradients
 * multiplied by grad_mul (clipping). */
static td_opt_args kernel_args(const td_optimizer *o, double grad_mul) {
    const td_optimizer_config *c = &o->cfg;
    td_opt_args k;
    memset(&k, 0, sizeof k);
    k.lr = lr_at(c, o->steps);
    k.grad_mul = grad_mul;
    k.weight_decay = c->weight_decay;
    k.momentum = c->momentum;
    k.nesterov = c->nesterov;
    k.first = o->steps == 0;
    k.beta1 = c->beta1;
    k.beta2 = c->beta2;
    k.eps = c->eps;
    k.bias_corr1 = 1.0 - pow(c->beta1, (double)(o->steps + 1));
    k.bias_corr2 = 1.0 - pow(c->beta2, (double)(o->steps + 1));
    return k;
}

/* Updates parameter i (the parts this optimizer owns) unless this step did. */
static td_status update_param(td_optimizer *o, size_t i, const td_opt_args *k) {
    if (o->stepped[i])
        return TD_OK;
    for (int part = 0; part < 2; part++) {
        td_tensor w, g, state[2];
        td_status st;
        if (!part_views(o, i, part, &w, &g, state))
            continue;
        st = o->cfg.kind == TD_OPT_ADAMW ? td__op_adamw(&w, &g, &state[0], &state[1], k)
                                         : td__op_sgd(&w, &g, o->per_param ? &state[0] : NULL, k);
        if (st != TD_OK)
            return st;
    }
    o->stepped[i] = 1;
    return TD_OK;
}

static td_status opt_step_task(td_device *dev, void *arg) {
    opt_step_args *a = arg;
    td_optimizer *o = a->o;
    const td_optimizer_config *c = &o->cfg;
    td_opt_args k;
    td_status st;
    double sum = 0;
    (void)dev;
    if (a->want_norm && (st = grad_sumsq(o, &sum)) != TD_OK)
        return st;
    a->norm = a->want_norm ? sqrt(sum) : 0.0;
    /* As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when above. */
    k = kernel_args(o, c->clip_norm > 0 && a->norm > c->clip_norm ? c->clip_norm / (a->norm + 1e-6)
                                                                  : 1.0);
    for (size_t i = 0; i < o->m->nparams; i++)
        if ((st = update_param(o, i, &k)) != TD_OK)
            return st;
    memset(o->stepped, 0, o->m->nparams);
    o->steps++;
    return TD_OK;
}

typedef struct params_args {
    td_optimizer *o;
    size_t first, count;
} params_args;

static td_status params_task(td_device *dev, void *arg) {
    params_args *a = arg;
    td_opt_args k = kernel_args(a->o, 1.0);
    (void)dev;
    for (size_t i = a->first; i < a->first + a->count; i++)
        TD_CHECK(update_param(a->o, i, &k));
    return TD_OK;
}

td_status td_optimizer_step_params(td_optimizer *o, size_t first, size_t count) {
    params_args a = {o, first, count};
    if (!o)
        return td__error(TD_ERR_INVALID_ARG, "td_optimizer_step_params: optimizer is NULL");
    if (o->cfg.clip_norm > 0)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_optimizer_step_params: clipping needs the whole gradient's norm "
                         "first; update with td_optimizer_step");
    if (first > o->m->nparams || count > o->m->nparams - first)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_optimizer_step_params: parameters [%zu, %zu) of %zu", first,
                         first + count, o->m->nparams);
    return td_device_run(o->m->dev, params_task, &a);
}

/* opt_step_task, traced on the device's host thread (whoever called). */
static td_status traced_step_task(td_device *dev, void *arg) {
    uint64_t tr = td__trace_begin();
    td_status st = opt_step_task(dev, arg);
    td__trace_end(tr, TD__TRACE_UPDATE, "optimizer step", -1);
    return st;
}

td_status td_optimizer_step(td_optimizer *o, double *grad_norm) {
    opt_step_args a = {o, 1, 0};
    td_status st;
    if (!o)
        return td__error(TD_ERR_INVALID_ARG, "td_optimizer_step: optimizer is NULL");
    a.want_norm = grad_norm != NULL || o->cfg.clip_norm > 0;
    st = td_device_run(o->m->dev, traced_step_task, &a);
    if (grad_norm)
        *grad_norm = a.norm;
    return st;
}
