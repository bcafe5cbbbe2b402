/* The `tensor` strategy's plan: how much of every split unit (the heads of
 * an attention layer, the hidden features of an MLP pair) each member
 * holds. At creation every member in turn times a training step of the
 * whole model on one sample; each unit is cut in proportion to the speeds
 * with largest remainders (a device three times as fast gets 3 of 4 heads),
 * within what each device's memory holds. Where the speeds differ, the
 * members' shard steps are timed too and the shares moved so that the
 * replicated layers, which every member computes whole, count. A
 * checkpoint records the shares exactly (td__tp_split), so that a resumed
 * run cuts the same slices (td__tp_adopt_split). */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/tp-impl.h"

/* A member's weights and their state may take this share of its device's
 * free memory. */
#define MEM_HEADROOM 0.9

/* The most a measured shard step moves a share from the speed-based one. */
#define MAX_MOVE (1.0 / 16)
/* Speeds within this ratio count as alike: noise, or too close to gain from timing. */
#define EQUAL_SPEEDS 1.5

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
static td_status calibrate_member(tensor_par *p, tp_member *m) {
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
        assert(first[p->size - 1] + count[p->size - 1] == p->units[u].size);
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
        tp_member *m = &p->mb[k];
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

/* Member m's shard step on `one` (one sample, no update), the best of a
 * few, less the time spent in (and waiting at) the reductions. */
static td_status time_shard(const td_batch *one, tp_member *m) {
    m->shard_s = 0;
    for (int i = 0; i < 4; i++) {
        uint64_t t0 = td_clock_ns();
        double dt;
        m->comm_s = 0;
        TD_CHECK(td_model_train_step(m->m, one, 1.0, 0, 0, &m->res));
        dt = (double)(td_clock_ns() - t0) * 1e-9 - m->comm_s;
        if (i > 0 && (m->shard_s == 0 || dt < m->shard_s))
            m->shard_s = dt;
    }
    return TD_OK;
}

/* The shares, exactly (%.17g reads back as the same double). */
void td__tp_split(void *impl, char *buf, size_t n) {
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

td_status td__tp_use_shares(tensor_par *p, const double *share) {
    if (!memcmp(share, p->share, sizeof(double) * (size_t)p->size) && p->mb[0].m)
        return TD_OK; /* these slices are built */
    memcpy(p->share, share, sizeof(double) * (size_t)p->size);
    make_plans(p);
    for (int k = 0; k < p->size; k++) {
        td__tp_drop_member(&p->mb[k]);
        TD_CHECK(td__tp_make_member(p, k));
    }
    return TD_OK;
}

/* Every replica's members take the recorded shares. */
td_status td__tp_adopt_split(void *impl, const char *text, int *adopted) {
    tensor_par *p = impl;
    double share[TD_DP_MAX_MEMBERS];
    int n, replicas = p->mesh ? td__tp_mesh_replicas(p->mesh) : 1;
    TD_CHECK(parse_shares(text, share, &n));
    *adopted = n == p->size;
    for (int r = 0; r < replicas && *adopted; r++)
        TD_CHECK(td__tp_use_shares(r ? td__tp_mesh_replica(p->mesh, r) : p, share));
    return TD_OK;
}

/* Jobs on every member ---------------------------------------------------------- */

/* Calibration: one member at a time, so that they do not slow each other
 * down; the others wait at a sum of nothing. */
static td_status calibrate_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    tensor_par *p = arg;
    tp_member *m = &p->mb[rank];
    td_status st = TD_OK;
    (void)g;
    (void)dev;
    for (int turn = 0; turn < size; turn++) {
        double zero = 0;
        if (turn == rank)
            st = calibrate_member(p, m);
        TD_CHECK(td__tp_sum_scalar(m, &zero));
        TD_CHECK(st);
    }
    return TD_OK;
}

/* Timing the shards on one sample. */
typedef struct time_call {
    tensor_par *p;
    const td_batch *one;
} time_call;

static td_status time_job(td_group *g, td_device *dev, int rank, int size, void *arg) {
    time_call *c = arg;
    (void)g;
    (void)dev;
    (void)size;
    return time_shard(c->one, &c->p->mb[rank]);
}

/* Where the devices' speeds differ, times the first shards and, where the
 * measured steps call for other shares, builds the members again with them
 * (nothing is trained yet). Equal devices (within EQUAL_SPEEDS) keep the
 * even split, so timing noise moves nothing. */
td_status td__tp_rebalance(tensor_par *p) {
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
        time_call c = {p, &smp.b};
        st = td_group_run(p->g, time_job, &c);
    }
    sample_free(&smp);
    TD_CHECK(st);
    for (int k = 0; k < p->size; k++) /* the slowest process's, as in agree_speeds */
        TD_CHECK(td__procs_agree(&p->procs, k, &p->mb[k].shard_s, 1, TD_REDUCE_MAX));
    if (!refine_shares(p))
        return TD_OK;
    fit_memory(p);
    make_plans(p);
    for (int k = 0; k < p->size; k++) {
        td__tp_drop_member(&p->mb[k]);
        TD_CHECK(td__tp_make_member(p, k));
    }
    return TD_OK;
}

/* Across processes every process must cut the same slices: each member's
 * speed is taken as its slowest peer's, its memory as the least. */
static td_status agree_speeds(tensor_par *p) {
    for (int k = 0; k < p->size; k++) {
        double v[2] = {p->mb[k].alone_s, -(double)p->mb[k].mem_free};
        TD_CHECK(td__procs_agree(&p->procs, k, v, 2, TD_REDUCE_MAX));
        p->mb[k].alone_s = v[0];
        p->mb[k].mem_free = (uint64_t)-v[1];
    }
    return TD_OK;
}

td_status td__tp_plan(tensor_par *p) {
    TD_CHECK(td_group_run(p->g, calibrate_job, p));
    TD_CHECK(agree_speeds(p));
    make_shares(p);
    fit_memory(p);
    make_plans(p);
    return TD_OK;
}
