/* The `tensor` strategy (Megatron-style tensor parallelism): member k of the
 * group holds a shard of the model (td_model_load_shard): a slice of every
 * splittable unit (the hidden features of an MLP pair, the heads of an
 * attention layer) and every other layer whole. Slices follow measured
 * speed: at creation every member in turn times a training step of the
 * whole model on one sample, and each unit is cut in proportion to the speeds with
 * largest remainders (a device three times as fast gets 3 of 4 heads).
 *
 * Every member takes the whole batch. A step runs each member's forward and
 * backward on its own thread; the partial outputs of each unit and their
 * input gradients are summed across the members by small all-reduces (the
 * model's reduce hook), so every member computes the replicated layers on
 * the same numbers and gets the same gradients for them. Each member
 * updates what it holds, layer by layer in the backward where it can
 * (backward()), else after it; clipping needs the norm of the
 * whole gradient: every member's sum of squares over its slices, plus the
 * replicated parameters once (member 0's), all-reduced. The step ends with
 * an all-gather of every member's numbers and timings, a collective, so a
 * lost member fails the step as under the other strategies.
 *
 * Checkpoints are whole-model files: saving gathers each parameter's slices
 * (and its optimizer state's) into the whole tensor in host memory; loading
 * scatters each member's slices out of the whole tensors. Under mpirun
 * each process splits the model over its own devices and takes its rows of
 * the batch (tensor_procs.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/placement.h"
#include "parallel/strategy-impl.h"
#include "parallel/tensor-impl.h"
#include "tensor/view.h"

/* A member's weights and their state may take this share of its device's
 * free memory. */
#define MEM_HEADROOM 0.9

/* The most a measured shard step moves a share from the speed-based one. */
#define MAX_MOVE (1.0 / 16)
/* Speeds within this ratio count as alike: noise, or too close to gain from timing. */
#define EQUAL_SPEEDS 1.5

enum {
    MODE_CALIBRATE,
    MODE_STEP, /* forward, backward and update */
    MODE_EVALUATE,
    MODE_TIME,     /* time the shards */
    MODE_BACKWARD, /* across processes: forward and backward, */
    MODE_UPDATE,   /* then, the gradients summed, the update */
};

/* Per member and step, gathered: compute, communication and update seconds,
 * loss sum, correct, count. */
#define STAT_WORDS 6

typedef struct member {
    td_group *group;
    td_device *dev;
    int rank;
    td_model *m;
    td_optimizer *opt;
    td_shard_plan plan;
    td_buffer *stats_send, *stats_all; /* (STAT_WORDS), (size, STAT_WORDS) f64 */
    td_buffer *scalar;                 /* (1) f64: the gradients' squared norm, summed */
    double alone_s;                    /* calibration: a whole-model step on one sample */
    double shard_s;                    /* calibration: its first shard's step, less waiting */
    uint64_t mem_free;                 /* calibration: its device's free memory, bytes */
    double comm_s, compute_s, update_s;
    td_status early_st; /* the first failure of an update in the backward */
    td_step_result res;
} member;

typedef struct tensor_par {
    td_strategy *s;
    td_group *g; /* this process's members */
    td__tp_procs procs;
    int size;
    td_model_info info;
    int64_t lps; /* labels per sample */
    td_split_info units[TD_SHARD_MAX_UNITS];
    int nunits;
    double share[TD_DP_MAX_MEMBERS];
    member mb[TD_DP_MAX_MEMBERS];

    /* The call under way. */
    int mode; /* a MODE_ */
    const td_batch *batch;
    int64_t first; /* the batch's first sample in the global batch */
    td_batch rows; /* across processes: this process's rows of it */
    uint64_t step;
    double grad_scale;
    const td_batch *evals;
    size_t nevals;
    td_step_result *eval_res;
} tensor_par;

/* The hook the shards sum their partial activations through. */
static td_status reduce_hook(void *arg, td_tensor *t) {
    member *m = arg;
    /* t is a view into the model's activations: a buffer over its elements */
    td_buffer b = td__tensor_as_buffer(t);
    uint64_t t0 = td_clock_ns();
    td_status st =
        td_allreduce(m->group, &b, 0, &b, 0, td_tensor_numel(t), td_tensor_dtype(t), TD_REDUCE_SUM);
    m->comm_s += (double)(td_clock_ns() - t0) * 1e-9;
    return st;
}

/* Every member's v, summed. */
static td_status sum_scalar(member *m, double *v) {
    TD_CHECK(td_buffer_write(m->scalar, 0, v, sizeof *v));
    TD_CHECK(td_allreduce(m->group, m->scalar, 0, m->scalar, 0, 1, TD_F64, TD_REDUCE_SUM));
    return td_buffer_read(m->scalar, 0, v, sizeof *v);
}

/* The squared norm of the whole gradient, for clipping: each member's
 * optimizer counts its slices, member 0's also the replicated parameters. */
static td_status sum_over_members(void *arg, const double *terms, size_t n, double *sumsq) {
    (void)terms;
    (void)n;
    return sum_scalar(arg, sumsq);
}

/* Calibration ------------------------------------------------------------------- */

/* A sample the model reads: zeros, token 0, label 0. */
typedef struct sample {
    float *x;
    int32_t *tokens, *labels;
    td_batch b;
} sample;

static td_status sample_make(const td_model_info *info, sample *s) {
    size_t feats = 1, lps = info->kind == TD_INPUT_TOKENS ? (size_t)info->in_shape[0] : 1;
    memset(s, 0, sizeof *s);
    for (int i = 0; i < info->in_ndim; i++)
        feats *= (size_t)info->in_shape[i];
    s->x = td__calloc(sizeof(float) * feats, "a calibration sample");
    s->tokens = td__calloc(sizeof(int32_t) * feats, "a calibration sample");
    s->labels = td__calloc(sizeof(int32_t) * lps, "a calibration sample");
    if (!s->x || !s->tokens || !s->labels)
        return TD_ERR_OUT_OF_MEMORY;
    s->b.n = 1;
    s->b.x = info->kind == TD_INPUT_FEATURES ? s->x : NULL;
    s->b.tokens = info->kind == TD_INPUT_TOKENS ? s->tokens : NULL;
    s->b.labels = s->labels;
    return TD_OK;
}

static void sample_free(sample *s) {
    free(s->x);
    free(s->tokens);
    free(s->labels);
}

/* Times a whole-model step on one sample on this member's device: the best
 * of 24 after a warm-up. A model that does not fit counts as speed 1 on
 * every device (alone_s 0: even shares). */
static td_status calibrate_member(tensor_par *p, member *m) {
    td_strategy *s = p->s;
    td_model *whole = NULL;
    td_step_result r;
    sample smp;
    td_device_info di;
    td_status st;
    m->alone_s = 0;
    if ((st = td_device_get_info(m->dev, &di)) != TD_OK)
        return st;
    m->mem_free = di.mem_free;
    if ((st = sample_make(&p->info, &smp)) != TD_OK)
        goto done;
    st = td_model_load_string(s->json, s->model_name, m->dev, s->cfg.dtype, s->cfg.seed, &whole);
    if (st == TD_ERR_OUT_OF_MEMORY) {
        st = TD_OK;
        goto done;
    }
    if (st != TD_OK)
        goto done;
    for (int i = 0; i < 25 && st == TD_OK; i++) {
        uint64_t t0 = td_clock_ns();
        double dt;
        st = td_model_train_step(whole, &smp.b, 1.0, 0, 0, &r);
        dt = (double)(td_clock_ns() - t0) * 1e-9;
        if (i > 0 && (m->alone_s == 0 || dt < m->alone_s))
            m->alone_s = dt;
    }
done:
    td_model_destroy(whole);
    sample_free(&smp);
    return st;
}

static void make_shares(tensor_par *p) {
    double alone[TD_DP_MAX_MEMBERS];
    for (int k = 0; k < p->size; k++)
        alone[k] = p->mb[k].alone_s;
    td__shares_from_speed(alone, p->size, p->share);
}

/* The largest share member k's memory holds: its slices of the split
 * weights and the replicated rest, each with its gradient and optimizer
 * state, within MEM_HEADROOM of what its device has free (the headroom is
 * for activations); 1 when the whole model fits. */
static double memory_cap(const tensor_par *p, int k) {
    const td_strategy_config *c = &p->s->cfg;
    double dsize = c->dtype == TD_F64 ? 8 : 4, split = 0, rest, room;
    double per_weight = dsize * (2 + (c->opt.kind == TD_OPT_ADAMW ? 2 : 1));
    for (int u = 0; u < p->nunits; u++)
        split += (double)p->units[u].weights;
    rest = (double)p->info.num_weights - split;
    room = MEM_HEADROOM * (double)p->mb[k].mem_free / per_weight - rest;
    return split > 0 ? fmax(0, fmin(1, room / split)) : 1;
}

/* Moves what members were given beyond their memory caps to the others, in
 * proportion to their shares, so that speed decides only among the splits
 * that fit (two 36 MB devices each hold half of a 51 MB model, not three
 * quarters however fast one measured). When no split fits, make_member
 * reports the device out of memory. */
static void fit_memory(tensor_par *p) {
    double cap[TD_DP_MAX_MEMBERS];
    for (int k = 0; k < p->size; k++)
        cap[k] = memory_cap(p, k);
    for (int round = 0; round < p->size; round++) {
        double excess = 0, under = 0;
        for (int k = 0; k < p->size; k++)
            if (p->share[k] > cap[k]) {
                excess += p->share[k] - cap[k];
                p->share[k] = cap[k];
            }
        for (int k = 0; k < p->size; k++)
            if (p->share[k] < cap[k])
                under += p->share[k];
        if (excess <= 0 || under <= 0)
            return;
        for (int k = 0; k < p->size; k++)
            if (p->share[k] < cap[k])
                p->share[k] += excess * p->share[k] / under;
    }
}

static void make_plans(tensor_par *p) {
    for (int u = 0; u < p->nunits; u++) {
        int64_t first[TD_DP_MAX_MEMBERS], count[TD_DP_MAX_MEMBERS];
        td__cut_by_shares(p->units[u].size, p->share, p->size, first, count);
        for (int k = 0; k < p->size; k++) {
            p->mb[k].plan.units = p->nunits;
            p->mb[k].plan.first[u] = first[k];
            p->mb[k].plan.count[u] = count[k];
        }
    }
}

/* The share of the split weights member k's plan holds. */
static double split_fraction(const tensor_par *p, int k) {
    double mine = 0, all = 0;
    for (int u = 0; u < p->nunits; u++) {
        const td_split_info *in = &p->units[u];
        mine += (double)in->weights * (double)p->mb[k].plan.count[u] / (double)in->size;
        all += (double)in->weights;
    }
    return all > 0 ? mine / all : 0;
}

/* Shares that balance the members' measured shard steps. Member k's step is
 * a part every member computes whole, R_k, plus its fraction x_k of the
 * split part, S_k: its whole-model step alone is R_k + S_k, its shard's
 * R_k + x_k S_k. Speed-proportional shares give a slow device its full
 * share of the replicated work on top; these equalise R_k + x_k S_k
 * instead, to 32nds, moving no share by more than MAX_MOVE: a tiny model's
 * timings are mostly fixed costs, and would hand a slow device nothing.
 * Returns 1 when the shares changed. */
static int refine_shares(tensor_par *p) {
    double R[TD_DP_MAX_MEMBERS], S[TD_DP_MAX_MEMBERS], x[TD_DP_MAX_MEMBERS];
    double sum = 0;
    int active[TD_DP_MAX_MEMBERS], changed = 0;
    for (int k = 0; k < p->size; k++) {
        member *m = &p->mb[k];
        double f = split_fraction(p, k);
        if (m->alone_s <= 0 || m->shard_s <= 0 || f >= 0.999)
            return 0;
        S[k] = (m->alone_s - m->shard_s) / (1 - f);
        if (!(S[k] > 0))
            return 0;
        R[k] = fmax(0, m->alone_s - S[k]);
        active[k] = 1;
    }
    for (int round = 0; round < p->size; round++) {
        double num = 1, den = 0, t;
        int dropped = 0;
        for (int k = 0; k < p->size; k++)
            if (active[k]) {
                num += R[k] / S[k];
                den += 1 / S[k];
            }
        t = num / den;
        for (int k = 0; k < p->size; k++) {
            x[k] = active[k] ? (t - R[k]) / S[k] : 0;
            if (x[k] < 0) {
                active[k] = 0;
                dropped = 1;
            }
        }
        if (!dropped)
            break;
    }
    for (int k = 0; k < p->size; k++) {
        x[k] = fmin(fmax(x[k], p->share[k] - MAX_MOVE), p->share[k] + MAX_MOVE);
        x[k] = fmax(round(32 * x[k]) / 32, 1.0 / 64);
        sum += x[k];
    }
    for (int k = 0; k < p->size; k++) {
        changed |= fabs(x[k] / sum - p->share[k]) > 1e-9;
        p->share[k] = x[k] / sum;
    }
    return changed;
}

/* Steps ------------------------------------------------------------------------ */

static td_status gather_stats(td_group *g, member *m) {
    double v[STAT_WORDS] = {
        m->compute_s,           m->comm_s,           m->update_s, m->res.loss_sum,
        (double)m->res.correct, (double)m->res.count};
    TD_CHECK(td_buffer_write(m->stats_send, 0, v, sizeof v));
    return td_allgather(g, m->stats_send, 0, m->stats_all, 0, STAT_WORDS, TD_F64);
}

/* Member m's shard step on p->batch (one sample, no update), the best of a
 * few, less the time spent in (and waiting at) the reductions. */
static td_status time_shard(tensor_par *p, member *m) {
    m->shard_s = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t t0 = td_clock_ns();
        double dt;
        m->comm_s = 0;
        TD_CHECK(td_model_train_step(m->m, p->batch, 1.0, 0, 0, &m->res));
        dt = (double)(td_clock_ns() - t0) * 1e-9 - m->comm_s;
        if (i > 0 && (m->shard_s == 0 || dt < m->shard_s))
            m->shard_s = dt;
    }
    return TD_OK;
}

/* The gradient hook of a step whose update may run in the backward: updates
 * the layer whose gradients are final. */
static void update_early(void *arg, size_t first, size_t count) {
    member *m = arg;
    uint64_t t0 = td_clock_ns();
    td_status st = td_optimizer_step_params(m->opt, first, count);
    if (m->early_st == TD_OK)
        m->early_st = st;
    m->update_s += (double)(td_clock_ns() - t0) * 1e-9;
}

/* Forward and backward; with `early`, each layer's update as soon as its
 * gradients are final, between the layers' compute: the members' updates
 * then do not all stream their optimizer state at once, which on CPU
 * devices sharing one memory bus slows every one of them. */
static td_status backward(tensor_par *p, member *m, int early) {
    uint64_t t0 = td_clock_ns();
    td_status st;
    m->comm_s = m->compute_s = m->update_s = 0;
    m->early_st = TD_OK;
    memset(&m->res, 0, sizeof m->res);
    if (early)
        td_model_set_grad_hook(m->m, update_early, m);
    st = td_model_train_slice(m->m, p->batch, p->first, p->grad_scale, 0, p->step, &m->res);
    if (early)
        td_model_set_grad_hook(m->m, NULL, NULL);
    TD_CHECK(st);
    TD_CHECK(m->early_st);
    m->compute_s = fmax(0, (double)(td_clock_ns() - t0) * 1e-9 - m->comm_s - m->update_s);
    return TD_OK;
}

static td_status update(td_group *g, member *m) {
    uint64_t t0 = td_clock_ns();
    TD_CHECK(td_optimizer_step(m->opt, NULL));
    m->update_s += (double)(td_clock_ns() - t0) * 1e-9;
    return gather_stats(g, m);
}

/* The update may run in the backward where it needs no more than the
 * layer's own gradients: no clipping (the whole gradient's norm), and no
 * other processes (their gradients summed first). */
static int can_update_early(const tensor_par *p) {
    return p->s->cfg.opt.clip_norm <= 0 && p->procs.nprocs == 1;
}

static td_status member_run(td_group *g, td_device *dev, int rank, int size, void *arg) {
    tensor_par *p = arg;
    member *m = &p->mb[rank];
    (void)dev;
    switch (p->mode) {
    case MODE_CALIBRATE: {
        /* one member at a time, so that they do not slow each other down */
        td_status st = TD_OK;
        for (int turn = 0; turn < size; turn++) {
            double zero = 0;
            if (turn == rank)
                st = calibrate_member(p, m);
            TD_CHECK(sum_scalar(m, &zero));
            TD_CHECK(st);
        }
        return TD_OK;
    }
    case MODE_TIME: return time_shard(p, m);
    case MODE_EVALUATE:
        for (size_t i = 0; i < p->nevals; i++) {
            td_step_result r;
            TD_CHECK(td_model_evaluate(m->m, &p->evals[i], &r));
            if (rank == 0)
                p->eval_res[i] = r;
        }
        return TD_OK;
    case MODE_BACKWARD: return backward(p, m, 0);
    case MODE_UPDATE: return update(g, m);
    default: TD_CHECK(backward(p, m, can_update_early(p))); return update(g, m);
    }
}

static void fill_stats(tensor_par *p, const double *all, int64_t n, double step_s,
                       td_step_stats *stats) {
    double speed = 0;
    memset(stats, 0, sizeof *stats);
    stats->members = p->size;
    stats->step_s = step_s;
    for (int k = 0; k < p->size; k++)
        speed += p->mb[k].alone_s > 0 ? 1.0 / p->mb[k].alone_s : 0;
    /* calibration timed one sample of the whole model */
    stats->ideal_s = speed > 0 ? (double)n / speed : 0;
    for (int k = 0; k < p->size; k++) {
        td_member_stats *m = &stats->m[k];
        const double *v = all + (size_t)k * STAT_WORDS;
        m->samples = n;
        m->share = p->share[k];
        m->compute_s = v[0];
        m->comm_s = v[1];
        m->update_s = v[2];
        m->wait_s = fmax(0, step_s - v[0] - v[1] - v[2]);
    }
}

/* Across processes: this process's rows, then every member's gradients
 * summed with its peers in the other processes, then the update; the
 * step's numbers summed over the processes. */
static td_status step_across(tensor_par *p, const td_batch *batch) {
    p->rows = td__tp_procs_rows(&p->procs, batch, &p->info, &p->first);
    p->batch = &p->rows;
    p->mode = MODE_BACKWARD;
    TD_CHECK(td_group_run(p->g, member_run, p));
    for (int k = 0; k < p->size; k++) {
        uint64_t t0 = td_clock_ns();
        TD_CHECK(td__tp_procs_sum_grads(&p->procs, k, p->mb[k].m));
        p->mb[k].comm_s += (double)(td_clock_ns() - t0) * 1e-9;
    }
    p->mode = MODE_UPDATE;
    return td_group_run(p->g, member_run, p);
}

static td_status tp_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                         td_step_stats *stats) {
    tensor_par *p = impl;
    double all[TD_DP_MAX_MEMBERS * STAT_WORDS];
    uint64_t t0 = td_clock_ns();
    p->step = step;
    p->grad_scale = 1.0 / (double)(batch->n * p->lps);
    p->first = 0;
    p->batch = batch;
    p->mode = MODE_STEP;
    TD_CHECK(p->procs.nprocs > 1 ? step_across(p, batch) : td_group_run(p->g, member_run, p));
    TD_CHECK(
        td_buffer_read(p->mb[0].stats_all, 0, all, sizeof(double) * STAT_WORDS * (size_t)p->size));
    /* every member computed the same loss: member 0's; summed over processes */
    TD_CHECK(td__tp_procs_agree(&p->procs, 0, all + 3, 3, TD_REDUCE_SUM));
    res->loss_sum = all[3];
    res->correct = (int64_t)all[4];
    res->count = (int64_t)all[5];
    if (stats)
        fill_stats(p, all, p->batch->n, (double)(td_clock_ns() - t0) * 1e-9, stats);
    p->batch = NULL;
    return TD_OK;
}

static td_status tp_evaluate(void *impl, const td_batch *batches, size_t n,
                             td_step_result *per_batch) {
    tensor_par *p = impl;
    p->mode = MODE_EVALUATE;
    p->evals = batches;
    p->nevals = n;
    p->eval_res = per_batch;
    return n ? td_group_run(p->g, member_run, p) : TD_OK;
}

/* Checkpoints (placement.c) and the rest ----------------------------------------- */

/* Every member's shard and optimizer, in rank order. */
static void holdings_of(const tensor_par *p, td__holding *h) {
    for (int k = 0; k < p->size; k++)
        h[k] = (td__holding){p->mb[k].m, p->mb[k].opt, k};
}

static void tp_holdings(void *impl, td__holding *h, int *n) {
    holdings_of(impl, h);
    *n = ((tensor_par *)impl)->size;
}

static td_status tp_save(void *impl, const char *path, const td_train_state *state) {
    tensor_par *p = impl;
    td__holding h[TD_DP_MAX_MEMBERS];
    if (p->procs.process != 0) /* every process holds the same model: one writes */
        return TD_OK;
    holdings_of(p, h);
    return td__placement_save(h, p->size, path, state);
}

static td_status tp_load(void *impl, const char *path, td_train_state *state) {
    tensor_par *p = impl;
    td__holding h[TD_DP_MAX_MEMBERS];
    holdings_of(p, h);
    return td__placement_load(h, p->size, path, state);
}

static double tp_lr(void *impl) {
    return td_optimizer_lr(((tensor_par *)impl)->mb[0].opt);
}

static int64_t tp_steps(void *impl) {
    return td_optimizer_steps(((tensor_par *)impl)->mb[0].opt);
}

static void tp_model_info(void *impl, td_model_info *out) {
    *out = ((tensor_par *)impl)->info;
}

static const char *tp_plan_text(void *impl, char *buf, size_t n) {
    tensor_par *p = impl;
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < p->size && used < n; k++) {
        member *m = &p->mb[k];
        int64_t heads = 0, all_heads = 0, feats = 0, all_feats = 0;
        int natt = 0, nmlp = 0;
        for (int u = 0; u < p->nunits; u++) {
            if (p->units[u].kind == TD_SPLIT_HEADS) {
                heads += m->plan.count[u];
                all_heads += p->units[u].size;
                natt++;
            } else {
                feats += m->plan.count[u];
                all_feats += p->units[u].size;
                nmlp++;
            }
        }
        used += (size_t)snprintf(
            buf + used, n - used,
            "%s: %lld of %lld heads in %d attention layer%s, %lld of %lld hidden features in %d "
            "MLP%s; %.0f%% by measured speed (%.2f ms a whole-model step alone), %.2f MB of "
            "weights\n",
            td_device_name(m->dev), (long long)heads, (long long)all_heads, natt,
            natt == 1 ? "" : "s", (long long)feats, (long long)all_feats, nmlp,
            nmlp == 1 ? "" : "s", 100 * p->share[k], m->alone_s * 1e3,
            (double)td_model_num_weights(m->m) * (double)td_dtype_size(p->s->cfg.dtype) / 1e6);
    }
    return buf;
}

/* The shares, exactly (%.17g reads back as the same double). */
static void tp_split(void *impl, char *buf, size_t n) {
    tensor_par *p = impl;
    size_t used = 0;
    buf[0] = '\0';
    for (int k = 0; k < p->size && used < n; k++)
        used += (size_t)snprintf(buf + used, n - used, "%s%.17g", k ? " " : "", p->share[k]);
}

/* The shares tp_split wrote into share[0..*n) (at most TD_DP_MAX_MEMBERS);
 * TD_ERR_CORRUPT unless they are numbers from 0 to 1 summing to 1. */
static td_status parse_shares(const char *text, double *share, int *n) {
    const char *at = text;
    double sum = 0;
    for (*n = 0; *at; (*n)++) {
        char *end;
        if (*n == TD_DP_MAX_MEMBERS)
            return td__error(TD_ERR_CORRUPT, "more than %d shares", TD_DP_MAX_MEMBERS);
        share[*n] = strtod(at, &end);
        if (end == at || !(share[*n] >= 0 && share[*n] <= 1))
            return td__error(TD_ERR_CORRUPT, "\"%.20s\" is not a share from 0 to 1", at);
        sum += share[*n];
        for (at = end; *at == ' '; at++)
            ;
    }
    if (!(sum > 0.999 && sum < 1.001))
        return td__error(TD_ERR_CORRUPT, "the shares add up to %g, not 1", sum);
    return TD_OK;
}

static void drop_member(member *m);
static td_status make_member(tensor_par *p, int k);

static td_status tp_adopt_split(void *impl, const char *text, int *adopted) {
    tensor_par *p = impl;
    double share[TD_DP_MAX_MEMBERS];
    int n;
    TD_CHECK(parse_shares(text, share, &n));
    *adopted = n == p->size;
    if (!*adopted || !memcmp(share, p->share, sizeof(double) * (size_t)p->size))
        return TD_OK;
    memcpy(p->share, share, sizeof(double) * (size_t)p->size);
    make_plans(p);
    for (int k = 0; k < p->size; k++) {
        drop_member(&p->mb[k]);
        TD_CHECK(make_member(p, k));
    }
    return TD_OK;
}

/* What make_member made. */
static void drop_member(member *m) {
    td_optimizer_destroy(m->opt);
    td_model_destroy(m->m);
    td_buffer_free(m->stats_send);
    td_buffer_free(m->stats_all);
    m->opt = NULL;
    m->m = NULL;
    m->stats_send = m->stats_all = NULL;
}

static void tp_destroy(void *impl) {
    tensor_par *p = impl;
    if (!p)
        return;
    for (int k = 0; k < p->size; k++) {
        drop_member(&p->mb[k]);
        td_buffer_free(p->mb[k].scalar);
    }
    td__tp_procs_close(&p->procs);
    free(p);
}

static td_status check_group(tensor_par *p) {
    td_strategy *s = p->s;
    if (p->size > TD_DP_MAX_MEMBERS)
        return td__error(TD_ERR_INVALID_ARG, "tensor: %d devices; at most %d", p->size,
                         TD_DP_MAX_MEMBERS);
    for (int k = 0; k < p->size; k++)
        TD_CHECK(td__tensor_check_dtype(td_group_device(p->g, k), s->cfg.dtype));
    return TD_OK;
}

static td_status make_member(tensor_par *p, int k) {
    td_strategy *s = p->s;
    member *m = &p->mb[k];
    TD_CHECK(td_buffer_alloc(m->dev, sizeof(double) * STAT_WORDS, &m->stats_send));
    TD_CHECK(td_buffer_alloc(m->dev, sizeof(double) * STAT_WORDS * (size_t)p->size, &m->stats_all));
    TD_CHECK(td_model_load_shard(s->json, s->model_name, m->dev, s->cfg.dtype, s->cfg.seed,
                                 &m->plan, &m->m));
    td_model_set_reduce_hook(m->m, reduce_hook, m);
    TD_CHECK(td_optimizer_create(m->m, &s->cfg.opt, &m->opt));
    td_optimizer_set_sumsq_reduce(m->opt, sum_over_members, m);
    td_optimizer_set_sumsq_skip_replicated(m->opt, k != 0);
    return TD_OK;
}

/* Where the devices' speeds differ, times the first shards and, where the
 * measured steps call for other shares, builds the members again with them
 * (nothing is trained yet). Equal devices (within EQUAL_SPEEDS) keep the
 * even split, so timing noise moves nothing. */
static td_status rebalance(tensor_par *p) {
    sample smp;
    td_status st;
    double lo = INFINITY, hi = 0;
    for (int k = 0; k < p->size; k++) {
        lo = fmin(lo, p->mb[k].alone_s);
        hi = fmax(hi, p->mb[k].alone_s);
    }
    /* equal devices keep the even split: nothing to time */
    if (p->size < 2 || !(lo > 0) || hi < EQUAL_SPEEDS * lo)
        return TD_OK;
    if ((st = sample_make(&p->info, &smp)) == TD_OK) {
        p->mode = MODE_TIME;
        p->batch = &smp.b;
        st = td_group_run(p->g, member_run, p);
        p->batch = NULL;
    }
    sample_free(&smp);
    TD_CHECK(st);
    for (int k = 0; k < p->size; k++) /* the slowest process's, as in agree_speeds */
        TD_CHECK(td__tp_procs_agree(&p->procs, k, &p->mb[k].shard_s, 1, TD_REDUCE_MAX));
    if (!refine_shares(p))
        return TD_OK;
    fit_memory(p);
    make_plans(p);
    for (int k = 0; k < p->size; k++) {
        drop_member(&p->mb[k]);
        TD_CHECK(make_member(p, k));
    }
    return TD_OK;
}

/* Across processes every process must cut the same slices: each member's
 * speed is taken as its slowest peer's, its memory as the least. */
static td_status agree_speeds(tensor_par *p) {
    for (int k = 0; k < p->size; k++) {
        double v[2] = {p->mb[k].alone_s, -(double)p->mb[k].mem_free};
        TD_CHECK(td__tp_procs_agree(&p->procs, k, v, 2, TD_REDUCE_MAX));
        p->mb[k].alone_s = v[0];
        p->mb[k].mem_free = (uint64_t)-v[1];
    }
    return TD_OK;
}

static td_status tp_create(td_strategy *s) {
    tensor_par *p = td__calloc(sizeof *p, "the tensor strategy");
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    s->impl = p;
    p->s = s;
    TD_CHECK(td__tp_procs_open(s->group, &p->procs));
    p->g = p->procs.local ? p->procs.local : s->group;
    p->size = td_group_size(p->g);
    TD_CHECK(check_group(p));
    TD_CHECK(td_model_describe(s->json, s->model_name, &p->info, NULL, 0));
    p->lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1;
    TD_CHECK(
        td_model_describe_splits(s->json, s->model_name, p->units, TD_SHARD_MAX_UNITS, &p->nunits));
    if (p->nunits == 0)
        return td__error_setting(
            TD_ERR_UNSUPPORTED, "strategy",
            "tensor: %s has no layer to split across devices (an MLP pair: linear, "
            "activation, linear; or attention); use `strategy` data or pipeline",
            s->model_name ? s->model_name : "the model");
    for (int k = 0; k < p->size; k++) {
        p->mb[k].group = p->g;
        p->mb[k].dev = td_group_device(p->g, k);
        p->mb[k].rank = k;
        TD_CHECK(td_buffer_alloc(p->mb[k].dev, sizeof(double), &p->mb[k].scalar));
    }
    p->mode = MODE_CALIBRATE;
    TD_CHECK(td_group_run(p->g, member_run, p));
    TD_CHECK(agree_speeds(p));
    make_shares(p);
    fit_memory(p);
    make_plans(p);
    for (int k = 0; k < p->size; k++)
        TD_CHECK(make_member(p, k));
    return rebalance(p);
}

static void tp_report(const td_run_figures *f, td_strategy_report *out) {
    (void)f;
    out->show_plan = 1;
    snprintf(out->note, sizeof out->note,
             "tensor: every device takes every sample (the plan at the start says which heads "
             "and hidden features each holds); comm: the all-reduces of partial results and "
             "input gradients, waiting for the others included");
}

const td_strategy_ops td__strategy_tensor = {
    .name = "tensor",
    .summary = "each layer's heads and hidden features split across the devices: batch size 1",
    .report = tp_report,
    .create = tp_create,
    .destroy = tp_destroy,
    .model_info = tp_model_info,
    .plan = tp_plan_text,
    .step = tp_step,
    .evaluate = tp_evaluate,
    .save = tp_save,
    .load = tp_load,
    .lr = tp_lr,
    .steps = tp_steps,
    .split = tp_split,
    .holdings = tp_holdings,
    .adopt_split = tp_adopt_split,
    .decoder = td__tensor_decoder,
};
