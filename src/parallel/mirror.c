/* The `mirror` strategy (graphics cards' Super-AA: both cards render the
 * same frame): every member holds a whole replica and computes the same
 * step on the same batch, and digests of the loss and gradients (every
 * check_weights steps the weights too) are compared before anyone updates
 * (mirror_step.c). It splits nothing and is no faster than one device: it
 * finds a device that computes wrong numbers without failing.
 *
 * Members of one kind (one backend and model) must agree bitwise, which
 * tandem's kernels give for the same inputs on the same kind of device;
 * members of several kinds compare within a tolerance (1e-9 of the
 * magnitude of each block of 64 values in f64, 1e-3 in f32), as do members
 * of one kind with deterministic=0 (for kernels that sum in a varying
 * order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/mirror-impl.h"
#include "parallel/strategy-impl.h"
#include "tensor/view.h"

static const td_strategy_option mirror_options[] = {
    {"check_weights", "N", "compare the weights every N steps too (default 16; 0: never)"},
    {"deterministic", "0|1",
     "1 (default): members of one kind must agree bitwise; 0: within the tolerance"},
    {"replicas", "R", "set by the mesh data:R,mirror:M: R replicas of M mirrored devices"},
    {NULL, NULL, NULL},
};

/* Whether every member is the same kind of device (backend and model). */
static int one_kind(td_group *g) {
    td_device_info a, b;
    if (td_device_get_info(td_group_device(g, 0), &a) != TD_OK)
        return 0;
    for (int r = 1; r < td_group_size(g); r++)
        if (td_device_get_info(td_group_device(g, r), &b) != TD_OK ||
            strcmp(a.backend, b.backend) || strcmp(a.model, b.model))
            return 0;
    return 1;
}

static td_status read_options(td_strategy *s, td__mirror *p) {
    int deterministic = 1;
    int64_t replicas = 1;
    p->check_weights = 16;
    TD_CHECK(td__option_count(s, "check_weights", 0, &p->check_weights));
    TD_CHECK(td__option_count(s, "replicas", 1, &replicas));
    if (replicas > 1) {
        TD_CHECK(td__mesh_open(p->g, (int)replicas, "mirror", &p->mesh));
        if (p->n / replicas < 2)
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                     "mirror: each of the %lld replicas needs 2 devices at least; "
                                     "the group has %d",
                                     (long long)replicas, p->n);
    }
    p->replicas = (int)replicas;
    p->per = p->n / p->replicas;
    TD_CHECK(td__option_flag(s, "deterministic", &deterministic));
    p->rule.exact = deterministic && one_kind(p->g);
    p->rule.tol = s->cfg.dtype == TD_F64 ? 1e-9 : 1e-3;
    return TD_OK;
}

/* Member r's replica, optimizer, digests and scratch. */
static td_status make_member(td_strategy *s, td__mirror *p, int r) {
    td_device *dev = td_group_device(p->g, r);
    size_t largest = 0;
    int P;
    TD_CHECK(td__tensor_check_dtype(dev, s->cfg.dtype));
    TD_CHECK(
        td_model_load_string(s->json, s->model_name, dev, s->cfg.dtype, s->cfg.seed, &p->m[r]));
    TD_CHECK(td_optimizer_create(p->m[r], &s->cfg.opt, &p->opt[r]));
    P = (int)td_model_param_count(p->m[r]);
    for (int i = 0; i < P; i++)
        if (td_tensor_nbytes(td_model_param(p->m[r], (size_t)i)) > largest)
            largest = td_tensor_nbytes(td_model_param(p->m[r], (size_t)i));
    TD_CHECK(td__digest_init(&p->dg[r], p->m[r]));
    TD_CHECK(td__digest_init(&p->first[r], p->m[r]));
    if (!(p->scratch[r] = td__calloc(largest + 8, "a mirror member's scratch")))
        return TD_ERR_OUT_OF_MEMORY;
    return td_buffer_alloc(dev, sizeof(float), &p->sync[r]);
}

static void mirror_destroy(void *impl) {
    td__mirror *p = impl;
    if (!p)
        return;
    for (int r = 0; r < TD_DP_MAX_MEMBERS; r++) {
        td_optimizer_destroy(p->opt[r]);
        td_model_destroy(p->m[r]);
        td__digest_deinit(&p->dg[r]);
        td__digest_deinit(&p->first[r]);
        free(p->scratch[r]);
        td_buffer_free(p->sync[r]);
        free(p->xcopy[r]);
        free(p->tcopy[r]);
    }
    td__mesh_close(&p->mesh);
    free(p);
}

static td_status mirror_create(td_strategy *s) {
    td__mirror *p = td__calloc(sizeof *p, "the mirror strategy");
    int64_t shape[TD_MAX_DIMS];
    int dims;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    s->impl = p;
    p->s = s;
    p->g = s->group;
    p->n = td_group_size(p->g);
    if (td_group_local_size(p->g) != p->n)
        return td__error(TD_ERR_UNSUPPORTED, "mirror: runs within one process; this group spans "
                                             "several");
    if (p->n < 2 || p->n > TD_DP_MAX_MEMBERS)
        return td__error_setting(TD_ERR_INVALID_ARG, "devices",
                                 "mirror compares 2 to %d devices; the group has %d",
                                 TD_DP_MAX_MEMBERS, p->n);
    TD_CHECK(read_options(s, p));
    for (int r = 0; r < p->n; r++)
        TD_CHECK(make_member(s, p, r));
    td_model_get_info(p->m[0], &p->info);
    p->labels_per_sample = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1;
    dims = td_model_input_shape(p->m[0], shape);
    p->input_values = 1;
    for (int i = 0; i < dims; i++)
        p->input_values *= (size_t)shape[i];
    return TD_OK;
}

static td_status mirror_step(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                             td_step_stats *stats) {
    return td__mirror_step(impl, batch, step, res, stats);
}

/* Forward only, on the first member: evaluation changes nothing that a
 * later step would not compare. */
static td_status mirror_evaluate(void *impl, const td_batch *batches, size_t n,
                                 td_step_result *per_batch) {
    td__mirror *p = impl;
    for (size_t i = 0; i < n; i++)
        TD_CHECK(td_model_evaluate(p->m[0], &batches[i], &per_batch[i]));
    return TD_OK;
}

static td_status mirror_save(void *impl, const char *path, const td_train_state *state) {
    td__mirror *p = impl;
    return td_checkpoint_save(path, p->m[0], p->opt[0], state);
}

static td_status mirror_load(void *impl, const char *path, td_train_state *state) {
    td__mirror *p = impl;
    for (int r = 0; r < p->n; r++)
        TD_CHECK(td_checkpoint_load(path, p->m[r], p->opt[r], r ? NULL : state));
    return TD_OK;
}

static double mirror_lr(void *impl) {
    return td_optimizer_lr(((td__mirror *)impl)->opt[0]);
}

static int64_t mirror_steps(void *impl) {
    return td_optimizer_steps(((td__mirror *)impl)->opt[0]);
}

static void mirror_model_info(void *impl, td_model_info *out) {
    *out = ((td__mirror *)impl)->info;
}

static const char *mirror_plan(void *impl, char *buf, size_t n) {
    td__mirror *p = impl;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < p->n && used < n; r++)
        used += (size_t)snprintf(buf + used, n - used,
                                 "%s: a replica of the whole model, %s rows of every batch\n",
                                 td_device_name(td_group_device(p->g, r)),
                                 p->replicas == 1 ? "all"
                                 : r / p->per     ? "the later"
                                                  : "the first");
    if (p->replicas > 1 && used < n)
        used += (size_t)snprintf(buf + used, n - used,
                                 "%d groups of %d mirrored devices, each its share of a batch, "
                                 "their gradients summed\n",
                                 p->replicas, p->per);
    if (used < n)
        snprintf(buf + used, n - used, "digests compared %s; weights every %lld steps\n",
                 p->rule.exact ? "bitwise" : "within a tolerance", (long long)p->check_weights);
    return buf;
}

/* A whole replica on every member. */
static void mirror_holdings(void *impl, td__holding *h, int *n) {
    td__mirror *p = impl;
    for (int r = 0; r < p->n; r++)
        h[r] = (td__holding){p->m[r], p->opt[r], r};
    *n = p->n;
}

/* The group less the members the majority named (and any that failed). */
static td_status mirror_survivors(void *impl, td_group **out) {
    td__mirror *p = impl;
    int exclude[TD_DP_MAX_MEMBERS], k = 0;
    for (int r = 0; r < p->n; r++)
        if (p->odd[r] || td_group_member_failed(p->g, r))
            exclude[k++] = r;
    return td_group_shrink(p->g, exclude, (size_t)k, out);
}

/* Removes the `replicas` items from options ("k=v,k=v"), in place. */
static void drop_replicas(char *options) {
    char *at = options;
    while (at && *at) {
        char *end = strchr(at, ',');
        size_t len = end ? (size_t)(end - at) + 1 : strlen(at);
        if (!strncmp(at, "replicas=", 9))
            memmove(at, at + len, strlen(at + len) + 1);
        else
            at = end ? end + 1 : NULL;
    }
    if (options && *options && options[strlen(options) - 1] == ',')
        options[strlen(options) - 1] = '\0';
}

/* Replicas over the survivors from a survivor's replica. Nobody updated in
 * the step that named the odd member, so the step is taken again. */
static td_status mirror_carry_on(td_strategy *s, td_group *survivors, int64_t steps_before,
                                 td_strategy *next, int *step_taken, const char **why) {
    td__mirror *p = s->impl, *q;
    td__holding from[TD_DP_MAX_MEMBERS], to[TD_DP_MAX_MEMBERS];
    int nf = 0, nt = 0;
    (void)steps_before;
    if (td_group_size(survivors) < 2) {
        *why = "mirror compares two devices at least, and one is left";
        return td__error(TD_ERR_UNSUPPORTED, "mirror: %s", *why);
    }
    drop_replicas(next->options); /* a mesh less a member carries on as one mirror */
    TD_CHECK(mirror_create(next));
    q = next->impl;
    q->counts = p->counts;
    for (int r = 0; r < p->n; r++)
        if (!p->odd[r] && td_group_rank_of(survivors, td_group_device(p->g, r)) >= 0) {
            from[nf++] = (td__holding){p->m[r], p->opt[r], r};
            break;
        }
    if (!nf) {
        *why = "no member that computed like the majority is left";
        return td__error(TD_ERR_UNSUPPORTED, "mirror: %s", *why);
    }
    mirror_holdings(q, to, &nt);
    *step_taken = 0;
    return td__placement_copy(from, nf, to, nt, td_optimizer_steps(from[0].opt));
}

static void mirror_report(void *impl, const td_run_figures *f, td_strategy_report *out) {
    td__mirror *p = impl;
    const td__mirror_counts *c = &p->counts;
    (void)f;
    snprintf(out->comm_label, sizeof out->comm_label, "digest s");
    snprintf(out->note, sizeof out->note,
             "mirror: %lld steps compared (%s), %lld with the weights; %lld disagreement%s: %lld "
             "settled by computing again, %lld device%s dropped; digests and comparison %.1f%% "
             "of the step time%s%s",
             (long long)c->steps, p->rule.exact ? "bitwise" : "within a tolerance",
             (long long)c->weight_checks, (long long)c->disagreements,
             c->disagreements == 1 ? "" : "s", (long long)c->recomputed, (long long)c->dropped,
             c->dropped == 1 ? "" : "s", c->step_s > 0 ? 100 * c->check_s / c->step_s : 0.0,
             c->found[0] ? "\n" : "", c->found);
}

const td_strategy_ops td__strategy_mirror = {
    .name = "mirror",
    .summary = "every device computes the same step; digests of the loss, gradients and weights "
               "are compared to catch a device computing wrong numbers",
    .min_members = 2,
    .options = mirror_options,
    .report = mirror_report,
    .create = mirror_create,
    .destroy = mirror_destroy,
    .model_info = mirror_model_info,
    .plan = mirror_plan,
    .step = mirror_step,
    .evaluate = mirror_evaluate,
    .save = mirror_save,
    .load = mirror_load,
    .lr = mirror_lr,
    .steps = mirror_steps,
    .holdings = mirror_holdings,
    .survivors = mirror_survivors,
    .carry_on = mirror_carry_on,
};
