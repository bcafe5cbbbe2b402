/* The strategy dispatcher: checks arguments, keeps what every strategy
 * needs (the group, the model's JSON, the configuration) in td_strategy,
 * finds the strategy's table by name and fills the optional slots it leaves
 * NULL with their defaults. */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/strategy-impl.h"

static const td_strategy_ops *const strategies[] = {
    &td__strategy_single,    &td__strategy_data,   &td__strategy_pipeline, &td__strategy_tensor,
    &td__strategy_alternate, &td__strategy_mirror, &td__strategy_tiles,    &td__strategy_spatial,
};

#define NSTRATEGIES (sizeof strategies / sizeof *strategies)

static const char *names[NSTRATEGIES + 1]; /* the tables' names, NULL-terminated */
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void fill_names(void) {
    for (size_t i = 0; i < NSTRATEGIES; i++)
        names[i] = strategies[i]->name;
}

const char *const *td_strategy_names(void) {
    pthread_once(&names_once, fill_names);
    return names;
}

static const td_strategy_ops *find(const char *name) {
    for (size_t i = 0; i < NSTRATEGIES; i++)
        if (!strcmp(strategies[i]->name, name))
            return strategies[i];
    return NULL;
}

/* "single, data, pipeline" into buf. */
static const char *known(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NSTRATEGIES && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", strategies[i]->name);
    return buf;
}

/* The table of `name`, a strategy or a mesh (mesh.c), with the options the
 * mesh adds (extra) and the devices it names (*devices; 0: any number). */
static td_status resolve(const char *name, const td_strategy_ops **ops, char *extra, size_t n,
                         int *devices) {
    const char *base;
    char list[128];
    TD_CHECK(td__mesh_resolve(name ? name : "single", &base, extra, n, devices));
    if (!(*ops = find(base)))
        return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                 "unknown strategy '%s' (known: %s)", name,
                                 known(list, sizeof list));
    return TD_OK;
}

td_status td_strategy_about_get(const char *name, td_strategy_about *out) {
    const td_strategy_ops *ops;
    char extra[64];
    int i = 0, devices;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_about_get: out is NULL");
    memset(out, 0, sizeof *out);
    TD_CHECK(resolve(name, &ops, extra, sizeof extra, &devices));
    out->name = ops->name;
    out->summary = ops->summary;
    out->min_members = ops->min_members > 0 ? ops->min_members : 1;
    out->max_members = ops->max_members;
    out->trains = !ops->evaluates_only;
    out->generates = ops->decoder != NULL;
    for (const td_strategy_option *o = ops->options; o && o->name; o++, i++) {
        assert(i < 8);
        out->option_name[i] = o->name;
        out->option_values[i] = o->values;
        out->option_help[i] = o->help;
    }
    return TD_OK;
}

td_status td_strategy_check_options(const char *name, const char *options) {
    const td_strategy_ops *ops;
    char extra[64];
    int devices;
    TD_CHECK(resolve(name, &ops, extra, sizeof extra, &devices));
    return td__strategy_check_options(ops, options);
}

void td_strategy_report_make(const td_strategy *s, const td_run_figures *f,
                             td_strategy_report *out) {
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    snprintf(out->comm_label, sizeof out->comm_label, "comm s");
    snprintf(out->wait_label, sizeof out->wait_label, "wait s");
    if (s && f && s->ops->report)
        s->ops->report(s->impl, f, out);
}

/* TD_ERR_INVALID_ARG unless g's size suits ops. */
static td_status check_member_count(const td_strategy_ops *ops, const td_group *g) {
    int n = td_group_size(g), least = ops->min_members > 0 ? ops->min_members : 1;
    if (n < least)
        return td__error_setting(TD_ERR_INVALID_ARG, "devices",
                                 "%s runs on at least %d devices; the group has %d", ops->name,
                                 least, n);
    if (ops->max_members > 0 && n > ops->max_members)
        return td__error_setting(TD_ERR_INVALID_ARG, "devices",
                                 "%s runs on %d device%s; the group has %d", ops->name,
                                 ops->max_members, ops->max_members == 1 ? "" : "s", n);
    return TD_OK;
}

/* A td_strategy of ops over g with copies of json, name and cfg, and no
 * state yet; NULL when out of memory. */
static td_strategy *alloc_strategy(const td_strategy_ops *ops, td_group *g, const char *json,
                                   const char *name, const td_strategy_config *cfg) {
    td_strategy *s = td__calloc(sizeof *s, "a strategy");
    if (!s)
        return NULL;
    s->ops = ops;
    s->group = g;
    s->cfg = *cfg;
    s->cfg.name = ops->name; /* the caller's string need not outlive s */
    s->json = td__strdup(json);
    s->model_name = td__strdup(name ? name : "(model)");
    s->cfg.options = s->options = td__strdup(cfg->options ? cfg->options : "");
    if (!s->json || !s->model_name || !s->options) {
        td_strategy_destroy(s);
        return NULL;
    }
    return s;
}

td_status td_strategy_create(td_group *g, const char *model_json, const char *model_name,
                             const td_strategy_config *cfg, td_strategy **out) {
    const td_strategy_ops *ops;
    td_strategy_config c;
    td_strategy *s;
    td_status st;
    char extra[64], options[512];
    int devices;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_create: out is NULL");
    *out = NULL;
    if (!g || !model_json || !cfg)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_create: group, model or config is NULL");
    TD_CHECK(resolve(cfg->name, &ops, extra, sizeof extra, &devices));
    if (td_group_size(g) < 1)
        return td__error(TD_ERR_INVALID_ARG, "%s: the group has no device", ops->name);
    if (devices && td_group_size(g) != devices)
        return td__error_setting(TD_ERR_INVALID_ARG, "devices",
                                 "the mesh %s names %d devices; the group has %d", cfg->name,
                                 devices, td_group_size(g));
    TD_CHECK(td__strategy_check_options(ops, cfg->options));
    if (td_group_size(g) < ops->min_members)
        return check_member_count(ops, g);
    c = *cfg;
    snprintf(options, sizeof options, "%s%s%s", cfg->options ? cfg->options : "",
             cfg->options && cfg->options[0] && extra[0] ? "," : "", extra);
    c.options = options;
    if (!(s = alloc_strategy(ops, g, model_json, model_name, &c)))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = ops->create(s)) != TD_OK) {
        td_strategy_destroy(s);
        return st;
    }
    *out = s;
    return TD_OK;
}

void td_strategy_destroy(td_strategy *s) {
    if (!s)
        return;
    if (s->ops && s->ops->destroy)
        s->ops->destroy(s->impl);
    free(s->json);
    free(s->model_name);
    free(s->options);
    free(s);
}

const char *td_strategy_name(const td_strategy *s) {
    return s ? s->ops->name : NULL;
}

td_group *td_strategy_group(td_strategy *s) {
    return s ? s->group : NULL;
}

void td_strategy_model_info(const td_strategy *s, td_model_info *out) {
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (s)
        s->ops->model_info(s->impl, out);
}

const char *td_strategy_plan(const td_strategy *s, char *buf, size_t n) {
    if (!buf || n == 0)
        return buf;
    buf[0] = '\0';
    return s && s->ops->plan ? s->ops->plan(s->impl, buf, n) : buf;
}

td_status td_strategy_calibrate(td_strategy *s, const td_batch *sample) {
    if (!s || !sample || sample->n < 1)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_calibrate: needs a batch of samples");
    return s->ops->calibrate ? s->ops->calibrate(s->impl, sample) : TD_OK;
}

td_status td_strategy_step(td_strategy *s, const td_batch *batch, uint64_t step,
                           td_step_result *res, td_step_stats *stats) {
    if (!s || !batch || batch->n < 1 || !batch->labels || !res)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_step: needs a batch with labels");
    if (s->ops->evaluates_only)
        return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                 "%s evaluates only; it takes no training step", s->ops->name);
    return s->ops->step(s->impl, batch, step, res, stats);
}

td_status td_strategy_evaluate(td_strategy *s, const td_batch *batches, size_t n,
                               td_step_result *per_batch) {
    if (!s || (n && (!batches || !per_batch)))
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_evaluate: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (batches[i].n < 1 || !batches[i].labels)
            return td__error(TD_ERR_INVALID_ARG, "td_strategy_evaluate: batch %zu is empty", i);
    return n ? s->ops->evaluate(s->impl, batches, n, per_batch) : TD_OK;
}

/* The run state to save: `state` (NULL: the strategy's own) with the
 * strategy's split. */
static void state_to_save(const td_strategy *s, const td_train_state *state, td_train_state *out) {
    int used;
    if (state)
        *out = *state;
    else {
        memset(out, 0, sizeof *out);
        out->step = td_strategy_steps(s);
        out->seed = s->cfg.seed;
        out->batch = s->cfg.batch;
        out->opt = s->cfg.opt;
    }
    out->split[0] = '\0';
    if (!s->ops->split)
        return;
    used = snprintf(out->split, sizeof out->split, "%s ", s->ops->name);
    s->ops->split(s->impl, out->split + used, sizeof out->split - (size_t)used);
    if (!out->split[used]) /* no split that changes the numbers this time */
        out->split[0] = '\0';
}

td_status td_strategy_save(td_strategy *s, const char *path, const td_train_state *state) {
    td_train_state st;
    if (!s || !path)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_save: strategy or path is NULL");
    state_to_save(s, state, &st);
    return s->ops->save(s->impl, path, &st);
}

/* Before loading path: cuts the slices its split records, when this
 * strategy wrote it and the configuration does not ask to re-plan. */
static td_status adopt_split(td_strategy *s, const char *path) {
    td_train_state st;
    td_dtype dtype;
    char *json = NULL;
    size_t len = strlen(s->ops->name);
    int adopted = 0;
    td_status ret;
    if (!s->ops->adopt_split || s->cfg.replan)
        return TD_OK;
    TD_CHECK(td_checkpoint_read_meta(path, &json, &dtype, &st));
    free(json);
    if (strncmp(st.split, s->ops->name, len) != 0 || st.split[len] != ' ')
        return TD_OK; /* another strategy's, or none: this one's plan */
    ret = s->ops->adopt_split(s->impl, st.split + len + 1, &adopted);
    if (ret == TD_ERR_CORRUPT) {
        char why[256];
        snprintf(why, sizeof why, "%s", td_last_error());
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.split\" = \"%.64s\": %s", path,
                         st.split, why);
    }
    TD_CHECK(ret);
    if (!adopted)
        TD_LOG_INFO("%s: %s: the recorded split \"%s\" is for other devices; re-planned", path,
                    s->ops->name, st.split);
    return TD_OK;
}

td_status td_strategy_load(td_strategy *s, const char *path, td_train_state *state) {
    if (!s || !path)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_load: strategy or path is NULL");
    TD_CHECK(adopt_split(s, path));
    return s->ops->load(s->impl, path, state);
}

double td_strategy_lr(const td_strategy *s) {
    return s ? s->ops->lr(s->impl) : 0.0;
}

int64_t td_strategy_steps(const td_strategy *s) {
    return s ? s->ops->steps(s->impl) : 0;
}

td_status td_strategy_survivors(td_strategy *s, td_group **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_survivors: out is NULL");
    *out = NULL;
    if (!s)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_survivors: strategy is NULL");
    return s->ops->survivors ? s->ops->survivors(s->impl, out)
                             : td_group_shrink(s->group, NULL, 0, out);
}

/* The survival rule: whether the members of s left in survivors still hold
 * every parameter between them (placement.h); else s->why names one they
 * lost. 1 for a strategy that publishes no holdings. */
static int survivors_hold_all(td_strategy *s, const td_group *survivors) {
    td__holding h[TD_DP_MAX_MEMBERS];
    int alive[TD_DP_MAX_MEMBERS], n = 0;
    char lost[200];
    if (!s->ops->holdings)
        return 1;
    s->ops->holdings(s->impl, h, &n);
    assert(n <= TD_DP_MAX_MEMBERS);
    for (int k = 0; k < n; k++) {
        td_device *dev = td_group_device(s->group, h[k].member);
        alive[k] = dev && td_group_rank_of(survivors, dev) >= 0;
    }
    if (n == 0 || td__placement_covers(h, n, alive, lost, sizeof lost))
        return 1;
    snprintf(s->why, sizeof s->why, "a lost device held the only copy of its part of %s", lost);
    return 0;
}

td_status td_strategy_carry_on(td_strategy *s, td_group *survivors, int64_t steps_before,
                               td_strategy **out, int *step_taken, const char **why) {
    static const char *const no_copy = "a lost device held state no survivor has";
    td_strategy *next;
    td_status st;
    if (!out || !step_taken || !why)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_carry_on: NULL argument");
    *out = NULL;
    *step_taken = 0;
    *why = NULL;
    if (!s || !survivors)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_carry_on: strategy or group is NULL");
    if (!survivors_hold_all(s, survivors)) {
        *why = s->why;
        return td__error(TD_ERR_UNSUPPORTED, "%s: %s", s->ops->name, s->why);
    }
    if (!s->ops->carry_on) {
        *why = no_copy;
        return td__error(TD_ERR_UNSUPPORTED, "%s: %s", s->ops->name, no_copy);
    }
    if (!(next = alloc_strategy(s->ops, survivors, s->json, s->model_name, &s->cfg)))
        return TD_ERR_OUT_OF_MEMORY;
    st = s->ops->carry_on(s, survivors, steps_before, next, step_taken, why);
    if (st != TD_OK) {
        td_strategy_destroy(next);
        return st;
    }
    *out = next;
    return TD_OK;
}

/* Generation ------------------------------------------------------------------------ */

/* "single, tensor": the strategies that generate, into buf. */
static const char *generating(char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < NSTRATEGIES && used < n; i++)
        if (strategies[i]->decoder)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? ", " : "",
                                     strategies[i]->name);
    return buf;
}

td_status td_strategy_decoder_create(td_group *g, const char *strategy, const char *checkpoint,
                                     td_dtype dtype, td_decoder **out) {
    const td_strategy_ops *ops;
    char list[128], extra[64];
    int devices;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_strategy_decoder_create: out is NULL");
    *out = NULL;
    if (!g || !checkpoint)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_strategy_decoder_create: group or checkpoint is NULL");
    TD_CHECK(resolve(strategy, &ops, extra, sizeof extra, &devices));
    /* data replicas take separate batches: one sequence gains nothing */
    if (devices && td_group_size(g) != devices)
        return td__error_setting(TD_ERR_INVALID_ARG, "devices",
                                 "the mesh %s names %d devices; the group has %d", strategy,
                                 devices, td_group_size(g));
    if (strstr(extra, "replicas="))
        return td__error_setting(TD_ERR_UNSUPPORTED, "strategy",
                                 "%s: generation runs on tensor, pipeline or pipeline:P,tensor:N; "
                                 "a data axis serves separate batches, not one sequence",
                                 strategy);
    if (!ops->decoder)
        return td__error(TD_ERR_UNSUPPORTED, "%s: does not generate (these do: %s)", ops->name,
                         generating(list, sizeof list));
    if (td_group_local_size(g) != td_group_size(g) || td_group_size(g) < 1)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: generates within one process; this group spans several", ops->name);
    TD_CHECK(check_member_count(ops, g));
    return ops->decoder(g, checkpoint, dtype, extra, out);
}
