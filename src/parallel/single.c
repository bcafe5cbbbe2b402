/* The `single` strategy: the group's first device holds the whole model and
 * its optimizer and does everything; the other members stay idle. A step
 * is forward, backward and the optimizer step on that device's thread. It
 * runs within one process: a group spanning several is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/strategy-impl.h"
#include "tensor/view.h"

typedef struct single {
    td_device *dev;
    td_model *m;
    td_optimizer *opt;
    td_model_info info;
    int64_t labels_per_sample; /* T for a token model, else 1 */
} single;

typedef struct step_args {
    single *p;
    const td_batch *batch;
    double grad_scale;
    uint64_t step;
    td_step_result result;
    uint64_t c0, c1, c2; /* forward and backward from c0, the update from c1 to c2 */
} step_args;

/* One step, on the device's thread. */
static td_status step_on_device(td_device *dev, void *arg) {
    step_args *a = arg;
    td_status st;
    (void)dev;
    a->c0 = td_clock_ns();
    st = td_model_train_step(a->p->m, a->batch, a->grad_scale, 0, a->step, &a->result);
    a->c1 = td_clock_ns();
    if (st == TD_OK)
        st = td_optimizer_step(a->p->opt, NULL);
    a->c2 = td_clock_ns();
    return st;
}

static td_status single_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                             td_step_stats *stats) {
    single *p = impl;
    step_args a;
    uint64_t t0 = td_clock_ns();
    td_status st;
    memset(&a, 0, sizeof a);
    a.p = p;
    a.batch = batch;
    a.grad_scale = 1.0 / (double)(batch->n * p->labels_per_sample);
    a.step = step;
    if ((st = td_device_run(p->dev, step_on_device, &a)) != TD_OK)
        return st;
    *res = a.result;
    if (stats) {
        td_member_stats *m = &stats->m[0];
        memset(stats, 0, sizeof *stats);
        stats->members = 1;
        stats->step_s = (double)(td_clock_ns() - t0) * 1e-9;
        stats->ideal_s = stats->step_s;
        m->samples = batch->n;
        m->share = 1.0;
        m->compute_s = (double)(a.c1 - a.c0) * 1e-9;
        m->update_s = (double)(a.c2 - a.c1) * 1e-9;
        m->wait_s = stats->step_s - m->compute_s - m->update_s;
        if (m->wait_s < 0)
            m->wait_s = 0;
    }
    return TD_OK;
}

static td_status single_evaluate(void *impl, const td_batch *batches, size_t n,
                                 td_step_result *per_batch) {
    single *p = impl;
    for (size_t i = 0; i < n; i++)
        TD_CHECK(td_model_evaluate(p->m, &batches[i], &per_batch[i]));
    return TD_OK;
}

static td_status single_save(void *impl, const char *path, const td_train_state *state) {
    single *p = impl;
    return td_checkpoint_save(path, p->m, p->opt, state);
}

static td_status single_load(void *impl, const char *path, td_train_state *state) {
    single *p = impl;
    return td_checkpoint_load(path, p->m, p->opt, state);
}

static double single_lr(void *impl) {
    return td_optimizer_lr(((single *)impl)->opt);
}

static int64_t single_steps(void *impl) {
    return td_optimizer_steps(((single *)impl)->opt);
}

static void single_model_info(void *impl, td_model_info *out) {
    *out = ((single *)impl)->info;
}

static const char *single_plan(void *impl, char *buf, size_t n) {
    single *p = impl;
    snprintf(buf, n, "%s: the whole model, %d layers, %.1f MB of weights\n", td_device_name(p->dev),
             p->info.layers,
             (double)p->info.num_weights * (double)td_dtype_size(td_model_dtype(p->m)) / 1e6);
    return buf;
}

static void single_destroy(void *impl) {
    single *p = impl;
    if (!p)
        return;
    td_optimizer_destroy(p->opt);
    td_model_destroy(p->m);
    free(p);
}

static td_status single_create(td_strategy *s) {
    single *p = td__calloc(sizeof *p, "the single strategy");
    td_group *g = s->group;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    s->impl = p;
    if (td_group_local_size(g) != td_group_size(g) || !td_group_device(g, 0))
        return td__error(TD_ERR_UNSUPPORTED,
                         "single: trains on one device of one process; this group spans "
                         "several processes (the data strategy trains across them)");
    p->dev = td_group_device(g, 0);
    TD_CHECK(td__tensor_check_dtype(p->dev, s->cfg.dtype));
    TD_CHECK(
        td_model_load_string(s->json, s->model_name, p->dev, s->cfg.dtype, s->cfg.seed, &p->m));
    TD_CHECK(td_optimizer_create(p->m, &s->cfg.opt, &p->opt));
    td_model_get_info(p->m, &p->info);
    p->labels_per_sample = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1;
    return TD_OK;
}

/* Generation: the nn decoder of the whole model on the first device, which
 * owns the model. */
static td_status single_decoder(td_group *g, const char *checkpoint, td_dtype dtype,
                                const char *options, td_decoder **out) {
    td_device *dev = td_group_device(g, 0);
    td_model *m = NULL;
    char *json = NULL;
    td_dtype saved;
    td_status st;
    (void)options; /* single is no mesh axis */
    TD_TRY(td__tensor_check_dtype(dev, dtype));
    TD_TRY(td_checkpoint_read_meta(checkpoint, &json, &saved, NULL));
    TD_TRY(td_model_load_string(json, checkpoint, dev, dtype, 0, &m));
    TD_TRY(td_checkpoint_load_weights(checkpoint, m));
    TD_TRY(td_decoder_create(m, out));
    td_decoder_take_model(*out);
    free(json);
    return TD_OK;
fail:
    free(json);
    td_model_destroy(m);
    return st;
}

const td_strategy_ops td__strategy_single = {
    .name = "single",
    .summary = "the first device trains; the others stay idle",
    .max_members = 1,
    .create = single_create,
    .destroy = single_destroy,
    .model_info = single_model_info,
    .plan = single_plan,
    .step = single_step,
    .evaluate = single_evaluate,
    .save = single_save,
    .load = single_load,
    .lr = single_lr,
    .steps = single_steps,
    .decoder = single_decoder,
};
