/* The pipeline's plan: each layer timed alone on each device, then the cut
 * into consecutive stages that makes the slowest stage fastest while every
 * stage fits its device (a dynamic programme over members and layers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/pipeline-impl.h"

/* Samples a layer is timed on: a micro-batch, or this many when larger. */
#define TIMED_SAMPLES 8
/* A stage may take this share of its device's free memory. */
#define MEM_HEADROOM 0.9
/* Slots beyond 1F1B's take no more than this share of it. */
#define EXTRA_SLOTS_ROOM 0.75

typedef struct measure {
    const td_pp_need *need;
    int64_t n;          /* samples timed */
    double *cost;       /* [member][layer] seconds for n samples; INFINITY: does not fit */
    uint64_t *mem_free; /* [member] */
} measure;

static int64_t per_sample(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* A zeroed device buffer of `bytes`. */
static td_status zeros(td_device *dev, size_t bytes, td_buffer **out) {
    td_status st;
    void *host = td__calloc(bytes ? bytes : 1, "a planning buffer");
    if (!host)
        return TD_ERR_OUT_OF_MEMORY;
    st = td_buffer_alloc(dev, bytes, out);
    if (st == TD_OK && (st = td_buffer_write(*out, 0, host, bytes)) != TD_OK) {
        td_buffer_free(*out);
        *out = NULL;
    }
    free(host);
    return st;
}

/* Forward and backward of layer i alone over batch b (its input and its
 * output's gradient zeros): the faster of two passes after a warm-up. */
static td_status time_layer(td_device *dev, const measure *ms, int i, const td_batch *b,
                            double *seconds) {
    const td_pp_need *nd = ms->need;
    const td_layer_info *li = nd->layers;
    size_t dsize = nd->dtype == TD_F64 ? 8 : 4;
    int last = i == nd->info->layers - 1;
    td_model *part = NULL;
    td_buffer *in = NULL, *dout = NULL;
    td_status st;
    *seconds = INFINITY;
    st = td_model_load_part(nd->json, nd->name, dev, nd->dtype, nd->seed, i, i + 1, 1, &part);
    if (st == TD_OK && i > 0)
        st = zeros(dev,
                   (size_t)(ms->n * per_sample(li[i - 1].out_shape, li[i - 1].out_ndim)) * dsize,
                   &in);
    if (st == TD_OK && !last)
        st = zeros(dev, (size_t)(ms->n * per_sample(li[i].out_shape, li[i].out_ndim)) * dsize,
                   &dout);
    for (int rep = 0; st == TD_OK && rep < 3; rep++) {
        uint64_t t0 = td_clock_ns();
        if ((st = td_model_part_forward(part, 0, b, 0, in, 1, 0, 1.0, NULL)) == TD_OK &&
            (st = td_model_part_backward(part, 0, dout, 0)) == TD_OK && rep > 0)
            *seconds = fmin(*seconds, (double)(td_clock_ns() - t0) * 1e-9);
    }
    td_buffer_free(dout);
    td_buffer_free(in);
    td_model_destroy(part);
    if (st == TD_ERR_OUT_OF_MEMORY) { /* the layer does not fit this device alone */
        *seconds = INFINITY;
        return TD_OK;
    }
    return st;
}

static td_status measure_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    measure *ms = arg;
    const td_model_info *info = ms->need->info;
    int64_t n = ms->n, feats = per_sample(info->in_shape, info->in_ndim);
    int64_t labels = info->kind == TD_INPUT_TOKENS ? info->in_shape[0] : 1;
    td_device_info di;
    td_batch b;
    void *x = NULL;
    int32_t *lab = NULL;
    td_status st = TD_OK;
    (void)g, (void)size;
    if ((st = td_device_get_info(dev, &di)) != TD_OK)
        return st;
    ms->mem_free[rank] = di.mem_free;
    x = td__calloc((size_t)(n * feats) * 4, "a planning batch");
    lab = td__calloc((size_t)(n * labels) * sizeof *lab, "a planning batch");
    if (!x || !lab) {
        free(x);
        free(lab);
        return td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory planning the pipeline");
    }
    b.n = n;
    b.x = info->kind == TD_INPUT_TOKENS ? NULL : x;
    b.tokens = info->kind == TD_INPUT_TOKENS ? x : NULL;
    b.labels = lab;
    for (int i = 0; st == TD_OK && i < info->layers; i++)
        st = time_layer(dev, ms, i, &b, &ms->cost[(size_t)rank * (size_t)info->layers + (size_t)i]);
    free(x);
    free(lab);
    return st;
}

/* Activation slots member k needs under 1F1B: one per micro-batch it can
 * hold between forward and backward, the stages from it to the last. */
static int slots_1f1b(const td_pp_plan *plan, int k, int64_t micro_batches) {
    int active = 0, index = 0;
    for (int r = 0; r < plan->members; r++)
        if (plan->end[r] > plan->first[r]) {
            if (r < k)
                index++;
            active++;
        }
    return (int)(active - index < micro_batches ? active - index : micro_batches);
}

/* Bytes a member needs to hold layers [a, b): weights, their gradients and
 * the optimizer's state, and the activations of `slots` micro-batches. */
static double stage_bytes(const td_pp_need *nd, int64_t slots, int a, int b) {
    size_t dsize = nd->dtype == TD_F64 ? 8 : 4;
    double states = nd->opt->kind == TD_OPT_ADAMW ? 2 : 1;
    int64_t micro = (nd->batch + nd->micro_batches - 1) / nd->micro_batches;
    double w = 0, act = 0;
    for (int i = a; i < b; i++) {
        w += (double)nd->layers[i].weights;
        act += (double)nd->layers[i].act_per_sample;
    }
    if (b > a && a > 0) /* the input and its gradient, received */
        act += 2.0 * (double)per_sample(nd->layers[a - 1].out_shape, nd->layers[a - 1].out_ndim);
    return ((2 + states) * w + act * (double)micro * (double)slots) * (double)dsize;
}

/* The cut must fit with every member holding as many micro-batches as
 * there are members (1F1B's most). */
static double cut_bytes(const td_pp_need *nd, int members, int a, int b) {
    return stage_bytes(nd, members < nd->micro_batches ? members : nd->micro_batches, a, b);
}

/* Whether a stage may begin at layer i. */
static int may_begin(const td_pp_need *nd, int i) {
    return !nd->joined || i == 0 || i >= nd->info->layers || !nd->joined[i];
}

/* A step's estimate under pipeline_run.c's schedule, from the stage times
 * s_k (per step). Where the stages carry their tails over
 * (td__pp_tails_carry), a stage pays what it carried while its first input
 * is on the way, and the slowest stage sets the step: max s_k, a tie going
 * to the smaller sum of s_k. Otherwise the first micro-batch passes every
 * stage before the slowest sets the pace for the other M - 1: sum s_k / M +
 * (M - 1) max s_k / M. */
typedef struct estimate {
    double step, sum;
} estimate;

static estimate step_estimate(const td_pp_need *nd, const double *pre, int p, int L,
                              const int *cut) {
    double worst = 0;
    estimate e = {0, 0};
    int64_t m = nd->micro_batches;
    for (int k = 0; k < p; k++) {
        double t = pre[k * (L + 1) + cut[k + 1]] - pre[k * (L + 1) + cut[k]];
        e.sum += t;
        worst = fmax(worst, t);
    }
    e.step = td__pp_tails_carry(nd->opt) ? worst : (e.sum + (double)(m - 1) * worst) / (double)m;
    return e;
}

static int shorter(estimate a, estimate b) {
    const double rel = 1e-9;
    return a.step < b.step * (1 - rel) ||
           (a.step <= b.step * (1 + rel) && a.sum < b.sum * (1 - rel));
}

/* Moves the cut's boundaries one layer at a time while that shortens the
 * estimated step and the stages still fit: the slowest-stage cut the
 * programme found leaves the other stages' boundaries wherever its ties fell.
 * cut[k] is member k's first layer, cut[p] = L. */
static void refine(const td_pp_need *nd, const measure *ms, const double *pre, int p, int L,
                   int *cut) {
    estimate best = step_estimate(nd, pre, p, L, cut), t;
    for (int moved = 1; moved;) {
        moved = 0;
        for (int b = 1; b < p; b++)
            for (int dir = -1; dir <= 1; dir += 2) {
                cut[b] += dir;
                if (cut[b] >= cut[b - 1] && cut[b] <= cut[b + 1] &&
                    (cut[b] == cut[b + 1] || may_begin(nd, cut[b])) &&
                    cut_bytes(nd, p, cut[b - 1], cut[b]) <=
                        MEM_HEADROOM * (double)ms->mem_free[b - 1] &&
                    cut_bytes(nd, p, cut[b], cut[b + 1]) <=
                        MEM_HEADROOM * (double)ms->mem_free[b] &&
                    shorter(t = step_estimate(nd, pre, p, L, cut), best)) {
                    best = t;
                    moved = 1;
                } else {
                    cut[b] -= dir;
                }
            }
    }
}

/* A stage whose memory holds more micro-batches than 1F1B needs takes up
 * to one slot per micro-batch (at most TD_PP_MAX_SLOTS): then it runs forwards ahead, as its memory
 * allows (but for the last stage, pipeline_run.c), and leaves the weight
 * gradients it owes to fill its waits. Its weights and their gradients are
 * streamed less often between other traffic (GPT 4 x 512 on two one-core
 * devices, 8 micro-batches: a step 0.267 s with 1F1B's slots, 0.246 s with
 * 8). Such a stage runs as many forwards before its first backward as it
 * has slots, and the stage after needs as many of them before its own: so
 * no stage holds more slots than the one before it, or the two would wait
 * for each other. *prev: the slots of the stage before (before the first,
 * the micro-batch count up to TD_PP_MAX_SLOTS). */
static void hold_extra_slots(const td_pp_need *nd, const measure *ms, td_pp_plan *out, int k,
                             int64_t *prev) {
    int a = out->first[k], b = out->end[k];
    int64_t least = slots_1f1b(out, k, nd->micro_batches), slots = *prev;
    if (a == b) {
        out->slots[k] = 0;
        out->bytes[k] = 0;
        return;
    }
    while (slots > least &&
           stage_bytes(nd, slots, a, b) > EXTRA_SLOTS_ROOM * MEM_HEADROOM * (double)ms->mem_free[k])
        slots--;
    out->slots[k] = (int)slots;
    out->bytes[k] = (size_t)stage_bytes(nd, slots, a, b);
    *prev = slots;
}

/* The cut: best[k][i] is the slowest stage's time when members [0, k) take
 * layers [0, i). */
static td_status cut(td_group *g, const td_pp_need *nd, const measure *ms, td_pp_plan *out) {
    int p = td_group_size(g), L = nd->info->layers;
    double scale = (double)nd->batch / (double)ms->n;
    double *best = NULL, *pre = NULL;
    int *from = NULL, cut[TD_PP_MAX_STAGES + 1];
    td_status st = TD_OK;
    best = calloc((size_t)(p + 1) * (size_t)(L + 1), sizeof *best);
    from = calloc((size_t)(p + 1) * (size_t)(L + 1), sizeof *from);
    pre = calloc((size_t)p * (size_t)(L + 1), sizeof *pre); /* prefix sums of cost */
    if (!best || !from || !pre) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory planning the pipeline");
        goto done;
    }
    for (int k = 0; k < p; k++)
        for (int i = 0; i < L; i++)
            pre[k * (L + 1) + i + 1] = pre[k * (L + 1) + i] + ms->cost[k * L + i] * scale;
#define BEST(k, i) best[(k) * (L + 1) + (i)]
#define FROM(k, i) from[(k) * (L + 1) + (i)]
    for (int i = 0; i <= L; i++)
        BEST(0, i) = i == 0 ? 0 : INFINITY;
    for (int k = 1; k <= p; k++)
        for (int i = 0; i <= L; i++) {
            BEST(k, i) = INFINITY;
            FROM(k, i) = i;
            for (int j = i; j >= 0; j--) {
                double t = pre[(k - 1) * (L + 1) + i] - pre[(k - 1) * (L + 1) + j];
                double worst = fmax(BEST(k - 1, j), t);
                if (j < i && (cut_bytes(nd, p, j, i) > MEM_HEADROOM * (double)ms->mem_free[k - 1] ||
                              !may_begin(nd, j)))
                    continue;
                if (worst < BEST(k, i)) {
                    BEST(k, i) = worst;
                    FROM(k, i) = j;
                }
            }
        }
    if (!isfinite(BEST(p, L))) {
        char devs[512] = "";
        for (int k = 0; k < p; k++)
            snprintf(devs + strlen(devs), sizeof devs - strlen(devs), "%s%s (%.1f MB free)",
                     k ? ", " : "", td_device_name(td_group_device(g, k)),
                     (double)ms->mem_free[k] / 1e6);
        st = td__error(TD_ERR_OUT_OF_MEMORY,
                       "%s: out of memory: the model (%.1f MB of weights, gradients, optimizer "
                       "state and activations) does not fit %s even cut into %d stages",
                       nd->name, cut_bytes(nd, p, 0, L) / 1e6, devs, p);
        goto done;
    }
    cut[p] = L;
    for (int k = p, i = L; k >= 1; k--)
        i = cut[k - 1] = FROM(k, i);
    refine(nd, ms, pre, p, L, cut);
    out->members = p;
    for (int k = 0; k < p; k++) {
        int j = cut[k], i = cut[k + 1];
        out->first[k] = j;
        out->end[k] = i;
        out->seconds[k] = pre[k * (L + 1) + i] - pre[k * (L + 1) + j];
        out->alone_s[k] = pre[k * (L + 1) + L];
    }
    int64_t prev = nd->micro_batches < TD_PP_MAX_SLOTS ? nd->micro_batches : TD_PP_MAX_SLOTS;
    for (int k = 0; k < p; k++)
        hold_extra_slots(nd, ms, out, k, &prev);
#undef BEST
#undef FROM
done:
    free(best);
    free(from);
    free(pre);
    return st;
}

td_status td__pp_plan(td_group *g, const td_pp_need *need, td_pp_plan *out) {
    int p = td_group_size(g), L = need->info->layers;
    measure ms;
    td_status st;
    memset(out, 0, sizeof *out);
    if (p > TD_PP_MAX_STAGES)
        return td__error(TD_ERR_INVALID_ARG, "pipeline: at most %d devices", TD_PP_MAX_STAGES);
    ms.need = need;
    ms.n = (need->batch + need->micro_batches - 1) / need->micro_batches;
    if (ms.n > TIMED_SAMPLES)
        ms.n = TIMED_SAMPLES;
    ms.cost = calloc((size_t)p * (size_t)L, sizeof *ms.cost);
    ms.mem_free = calloc((size_t)p, sizeof *ms.mem_free);
    if (!ms.cost || !ms.mem_free) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory planning the pipeline");
        goto done;
    }
    if ((st = td_group_run(g, measure_member, &ms)) != TD_OK)
        goto done;
    st = cut(g, need, &ms, out);
done:
    free(ms.cost);
    free(ms.mem_free);
    return st;
}
