/* The `pipeline` strategy against one device training on the same batches:
 * an MLP, LeNet-5, a small GPT with dropout and a small Llama, on 2 and 3
 * devices, one of them three times slower, in f64 (1e-12) and f32 (1e-5);
 * more devices than layers; a model too big for one device's budget that
 * trains when split; checkpoints that move between strategies; bad
 * micro-batch counts. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/model_data.h"
#include "support/support.h"
#include "tandem/strategy.h"

#define STEPS 3

static const char *mlp_json =
    "{\"name\": \"pp_mlp\", \"input\": {\"shape\": [12]}, \"layers\": ["
    "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"tanh\"},"
    "{\"type\": \"linear\", \"out\": 9}, {\"type\": \"relu\"},"
    "{\"type\": \"dropout\", \"p\": 0.25}, {\"type\": \"linear\", \"out\": 5}]}";

static const char *gpt_json =
    "{\"name\": \"pp_gpt\", \"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 32, \"positions\": true},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "    {\"type\": \"attention\", \"heads\": 4}]},"
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "    {\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"},"
    "    {\"type\": \"dropout\", \"p\": 0.1}, {\"type\": \"linear\", \"out\": 32}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";

/* llama_tiny's layers, smaller: RMSNorm, grouped-query attention with
 * rotary positions, SwiGLU (its weight gradients deferred like a linear's
 * on the stages that send their input gradient on first). */
static const char *llama_json =
    "{\"name\": \"pp_llama\", \"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 32, \"positions\": false},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"},"
    "    {\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 10000,"
    "     \"qkv_bias\": false, \"proj_bias\": false}]},"
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"},"
    "    {\"type\": \"swiglu\", \"hidden\": 48}]}]},"
    "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 64, \"bias\": false}]}";

/* The optimizer of a check: SGD with momentum, whose update is linear in
 * the gradients, so that the summation order's rounding stays there; or
 * AdamW, which divides each gradient by its own size and so magnifies the
 * rounding of gradients near zero (3e-12 in f64 on the GPT, 1e-3 in f32).
 * Both clip to a norm that binds: every stage's gradients together. */
static td_optimizer_config optimizer(td_optimizer_kind kind) {
    td_optimizer_config o = TD_OPTIMIZER_CONFIG_INIT;
    o.kind = kind;
    o.lr = kind == TD_OPT_ADAMW ? 0.01 : 0.1;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    o.clip_norm = 0.5;
    return o;
}

static td_optimizer_config opt_in_use; /* the check's */

/* config()'s options: one pipeline configuration at a time. */
static char options[64];

static td_strategy_config config(const char *name, td_dtype dt, int64_t batch, int64_t micro) {
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    c.name = name;
    c.dtype = dt;
    c.seed = 5;
    c.opt = opt_in_use;
    c.batch = batch;
    if (micro) /* a single's config leaves the pipeline's options as they are */
        snprintf(options, sizeof options, "micro_batches=%lld", (long long)micro);
    c.options = micro ? options : NULL;
    return c;
}

typedef struct ref_args {
    td_model *m;
    td_optimizer *o;
    const td_batch *b;
    double grad_scale;
    uint64_t step;
    td_step_result r;
} ref_args;

static td_status ref_step(td_device *dev, void *arg) {
    ref_args *a = arg;
    td_status st = td_model_train_step(a->m, a->b, a->grad_scale, 0, a->step, &a->r);
    return st != TD_OK ? st : td_optimizer_step(a->o, NULL);
}

/* One device (dev), no strategy, over d's batches. */
static td_model *reference(const char *json, td_device *dev, td_dtype dt, const td_test_data *d,
                           td_step_result *last) {
    td_model *m = NULL;
    td_optimizer *o = NULL;
    td_optimizer_config oc = opt_in_use;
    td_model_info info;
    TD_ASSERT_OK(td_model_load_string(json, "test", dev, dt, 5, &m));
    TD_ASSERT_OK(td_optimizer_create(m, &oc, &o));
    td_model_get_info(m, &info);
    for (int k = 0; k < d->steps; k++) {
        int64_t labels = d->n * (info.kind == TD_INPUT_TOKENS ? info.in_shape[0] : 1);
        ref_args a = {m, o, &d->b[k], 1.0 / (double)labels, (uint64_t)k, {0, 0, 0}};
        TD_ASSERT_OK(td_device_run(dev, ref_step, &a));
        *last = a.r;
    }
    td_optimizer_destroy(o);
    return m;
}

static void check_like_one_device_with(const char *json, const char *spec, td_dtype dt,
                                       int64_t batch, int64_t micro, td_optimizer_config opt,
                                       double tol) {
    td_optimizer_kind kind = opt.kind;
    opt_in_use = opt;
    td_test_data *d = td_test_data_create(json, STEPS, batch);
    td_device_list *one = td_test_open("cpu:0");
    td_step_result ref_last = {0, 0, 0}, last = {0, 0, 0};
    td_model *ref = reference(json, td_device_list_get(one, 0), dt, d, &ref_last);
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c = config("pipeline", dt, batch, micro);
    td_step_stats stats;
    char plan[2048];
    double diff;
    TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, json, "test", &c, &s));
    printf("%s\n", td_strategy_plan(s, plan, sizeof plan));
    for (int k = 0; k < d->steps; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->b[k], (uint64_t)k, &last, &stats));
    diff = td_strategy_weights_diff(s, ref);
    printf(
        "pipeline on %s, %s, %s, %lld micro-batches: weights differ by %.3g (tol %g), loss %.17g "
        "vs %.17g, bubble %.2f (theory %.2f)\n",
        spec, dt == TD_F64 ? "f64" : "f32", kind == TD_OPT_ADAMW ? "AdamW" : "SGD",
        (long long)stats.micro_batches, diff, tol, last.loss_sum, ref_last.loss_sum, stats.bubble,
        stats.bubble_theory);
    assert_true(diff <= tol);
    assert_true(fabs(last.loss_sum - ref_last.loss_sum) <= tol * fabs(ref_last.loss_sum) + 1e-300);
    assert_int_equal(last.correct, ref_last.correct);
    assert_int_equal(last.count, ref_last.count);
    td_strategy_destroy(s);
    td_group_destroy(g);
    td_model_destroy(ref);
    td_device_list_destroy(one);
    td_test_data_destroy(d);
}

static void check_like_one_device(const char *json, const char *spec, td_dtype dt, int64_t batch,
                                  int64_t micro, td_optimizer_kind kind, double tol) {
    check_like_one_device_with(json, spec, dt, batch, micro, optimizer(kind), tol);
}

static td_optimizer_config unclipped(td_optimizer_kind kind) {
    td_optimizer_config o = optimizer(kind);
    o.clip_norm = 0;
    return o;
}

/* Without clipping, every stage but the first carries its last weight
 * gradients and its optimizer step into the next step (pipeline_run.c):
 * steps, an evaluation between them, a checkpoint saved and loaded back
 * mid-run, all as `single` on one device would have them, within rounding.
 * An update paid late, twice or not at all shows at once. */
static void the_tail_carried_over_is_paid_before_it_is_read(void **state) {
    td_test_data *d = td_test_data_create(gpt_json, 4, 6);
    td_group *g = NULL, *g1 = NULL;
    td_strategy *pp = NULL, *one = NULL;
    td_strategy_config c, cs;
    td_step_result r, e_pp[2], e_one[2];
    (void)state;
    opt_in_use = unclipped(TD_OPT_SGD);
    c = config("pipeline", TD_F64, 6, 3);
    cs = config("single", TD_F64, 6, 0);
    check_like_one_device_with(gpt_json, "cpu*3", TD_F64, 6, 3, unclipped(TD_OPT_SGD), 1e-12);
    check_like_one_device_with(gpt_json, "cpu:0,cpu:1{slowdown=3}", TD_F32, 6, 3,
                               unclipped(TD_OPT_SGD), 1e-5);
    opt_in_use = unclipped(TD_OPT_SGD);
    TD_ASSERT_OK(td_group_create_spec("cpu*3", NULL, &g));
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g1));
    TD_ASSERT_OK(td_strategy_create(g, gpt_json, "test", &c, &pp));
    TD_ASSERT_OK(td_strategy_create(g1, gpt_json, "test", &cs, &one));
    for (int k = 0; k < 4; k++) {
        TD_ASSERT_OK(td_strategy_step(pp, &d->b[k], (uint64_t)k, &r, NULL));
        TD_ASSERT_OK(td_strategy_step(one, &d->b[k], (uint64_t)k, &r, NULL));
        if (k == 1) {
            TD_ASSERT_OK(td_strategy_evaluate(pp, d->b, 2, e_pp));
            TD_ASSERT_OK(td_strategy_evaluate(one, d->b, 2, e_one));
            for (int i = 0; i < 2; i++)
                assert_true(fabs(e_pp[i].loss_sum - e_one[i].loss_sum) <=
                            1e-12 * fabs(e_one[i].loss_sum));
        }
        if (k == 2) {
            TD_ASSERT_OK(td_strategy_save(pp, td_test_tmp("mid.safetensors"), NULL));
            TD_ASSERT_OK(td_strategy_load(pp, td_test_tmp("mid.safetensors"), NULL));
        }
    }
    TD_ASSERT_OK(td_strategy_save(pp, td_test_tmp("pp_end.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("one_end.safetensors"), NULL));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("pp_end.safetensors"),
                                      td_test_tmp("one_end.safetensors")) <= 1e-12);
    td_strategy_destroy(one);
    td_strategy_destroy(pp);
    td_group_destroy(g1);
    td_group_destroy(g);
    td_test_data_destroy(d);
}

static void mlp_on_two_and_three_devices(void **state) {
    (void)state;
    check_like_one_device(mlp_json, "cpu*2", TD_F64, 37, 4, TD_OPT_SGD, 1e-12);
    check_like_one_device(mlp_json, "cpu*3", TD_F64, 37, 5, TD_OPT_SGD, 1e-12);
    check_like_one_device(mlp_json, "cpu*2", TD_F32, 37, 3, TD_OPT_ADAMW, 1e-5);
}

static void lenet_on_two_devices(void **state) {
    char *json = (char *)td_test_read_file(TD_SOURCE_DIR "/examples/lenet5.json", NULL);
    (void)state;
    check_like_one_device(json, "cpu*2", TD_F64, 12, 3, TD_OPT_SGD, 1e-12);
    free(json);
}

static void gpt_with_dropout_on_three_devices(void **state) {
    (void)state;
    check_like_one_device(gpt_json, "cpu*3", TD_F64, 6, 3, TD_OPT_SGD, 1e-12);
    check_like_one_device(gpt_json, "cpu*2", TD_F32, 6, 2, TD_OPT_SGD, 1e-5);
}

static void llama_on_three_devices(void **state) {
    (void)state;
    check_like_one_device(llama_json, "cpu*3", TD_F64, 6, 3, TD_OPT_SGD, 1e-12);
    check_like_one_device(llama_json, "cpu*2", TD_F32, 4, 2, TD_OPT_SGD, 1e-5);
}

/* Layers of the plan line of device `name` in plan text. */
static int layers_of(const char *plan, const char *name) {
    const char *line = strstr(plan, name);
    int a, b;
    if (!line || sscanf(line + strlen(name), ": layers %d-%d", &a, &b) != 2)
        return 0;
    return b - a + 1;
}

/* A device three times slower gets less of the model (of the GPT's 7
 * layers, the fast one takes the embedding and most blocks), and the result
 * is the same. */
static void a_slowed_device_gets_fewer_layers(void **state) {
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c;
    char plan[2048];
    (void)state;
    check_like_one_device(gpt_json, "cpu:0,cpu:1{slowdown=3}", TD_F64, 4, 4, TD_OPT_SGD, 1e-12);
    c = config("pipeline", TD_F64, 4, 4);
    TD_ASSERT_OK(td_group_create_spec("cpu:0,cpu:1{slowdown=3}", NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, gpt_json, "test", &c, &s));
    td_strategy_plan(s, plan, sizeof plan);
    assert_true(layers_of(plan, "cpu:0") > layers_of(plan, "cpu:1"));
    td_strategy_destroy(s);
    td_group_destroy(g);
}

static int slots_of(const char *plan, const char *name) {
    const char *line = strstr(plan, name), *at = line ? strstr(line, " MB, ") : NULL;
    int slots;
    double ms;
    if (!at || sscanf(at, " MB, %lf ms a step measured, %d micro-batch slot", &ms, &slots) != 2)
        return 0;
    return slots;
}

/* Stages hold as many micro-batches as their memory has room for, up to
 * one slot each, but never more than the stage before (whose forwards they
 * wait for): here the second stage's memory could hold all eight, the
 * first's only 1F1B's two. The result is one device's. */
static void stages_hold_what_their_memory_allows(void **state) {
    char *json = (char *)td_test_read_file(TD_SOURCE_DIR "/examples/mnist_mlp.json", NULL);
    const char *tight = "cpu:0{mem=3M},cpu:1{mem=3M}", *roomy = "cpu*2";
    td_strategy_config c = config("pipeline", TD_F32, 64, 8);
    td_group *g = NULL;
    td_strategy *s = NULL;
    char plan[2048];
    (void)state;
    opt_in_use = optimizer(TD_OPT_SGD);
    TD_ASSERT_OK(td_group_create_spec(tight, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, json, "test", &c, &s));
    td_strategy_plan(s, plan, sizeof plan);
    printf("%s", plan);
    assert_int_equal(slots_of(plan, "cpu:0"), 2);
    assert_int_equal(slots_of(plan, "cpu:1"), 2);
    td_strategy_destroy(s);
    td_group_destroy(g);
    TD_ASSERT_OK(td_group_create_spec(roomy, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, json, "test", &c, &s));
    td_strategy_plan(s, plan, sizeof plan);
    assert_int_equal(slots_of(plan, "cpu:0"), 8);
    assert_int_equal(slots_of(plan, "cpu:1"), 8);
    td_strategy_destroy(s);
    td_group_destroy(g);
    check_like_one_device(json, tight, TD_F32, 64, 8, TD_OPT_SGD, 1e-5);
    check_like_one_device(json, roomy, TD_F32, 64, 8, TD_OPT_SGD, 1e-5);
    free(json);
}

/* 100 micro-batches, each stage with room for all: a stage holds at most
 * as many as a channel does (64), or a message would be overwritten before
 * the next stage took it. */
static void more_micro_batches_than_a_channel_holds(void **state) {
    (void)state;
    check_like_one_device(mlp_json, "cpu*2", TD_F64, 100, 100, TD_OPT_SGD, 1e-12);
}

static void more_devices_than_layers(void **state) {
    const char *one_layer = "{\"name\": \"one\", \"input\": {\"shape\": [6]}, \"layers\": ["
                            "{\"type\": \"linear\", \"out\": 3}]}";
    (void)state;
    check_like_one_device(one_layer, "cpu*3", TD_F64, 8, 2, TD_OPT_SGD, 1e-12);
}

/* Two steps, a checkpoint, a new strategy resuming from it on devices that
 * cut the model elsewhere (one is slowed), two more steps: bitwise the same as
 * four steps in one go, clipping included; and the checkpoint opens under
 * `single` with the same weights. */
static void checkpoints_move_between_strategies(void **state) {
    td_test_data *d = td_test_data_create(gpt_json, 4, 4);
    opt_in_use = optimizer(TD_OPT_ADAMW);
    td_group *g = NULL, *slowed = NULL;
    td_strategy *a = NULL, *b = NULL, *one = NULL;
    td_strategy_config c = config("pipeline", TD_F64, 4, 2), cs = config("single", TD_F64, 4, 0);
    td_step_result r;
    td_train_state ts, back;
    (void)state;
    memset(&ts, 0, sizeof ts);
    ts.step = 2;
    ts.seed = 5;
    ts.batch = 4;
    ts.opt = c.opt;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_OK(td_group_create_spec("cpu:0,cpu:1{slowdown=3}", NULL, &slowed));
    TD_ASSERT_OK(td_strategy_create(g, gpt_json, "test", &c, &a));
    TD_ASSERT_OK(td_strategy_create(slowed, gpt_json, "test", &c, &b));
    for (int k = 0; k < 2; k++)
        TD_ASSERT_OK(td_strategy_step(a, &d->b[k], (uint64_t)k, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(a, td_test_tmp("half.safetensors"), &ts));
    TD_ASSERT_OK(td_strategy_load(b, td_test_tmp("half.safetensors"), &back));
    assert_int_equal(back.step, 2);
    assert_int_equal(td_strategy_steps(b), 2);
    TD_ASSERT_OK(td_strategy_create(g, gpt_json, "test", &cs, &one));
    TD_ASSERT_OK(td_strategy_load(one, td_test_tmp("half.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("single.safetensors"), &ts));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("half.safetensors"),
                                      td_test_tmp("single.safetensors")) == 0.0);
    for (int k = 2; k < 4; k++) {
        TD_ASSERT_OK(td_strategy_step(a, &d->b[k], (uint64_t)k, &r, NULL));
        TD_ASSERT_OK(td_strategy_step(b, &d->b[k], (uint64_t)k, &r, NULL));
    }
    TD_ASSERT_OK(td_strategy_save(a, td_test_tmp("a.safetensors"), &ts));
    TD_ASSERT_OK(td_strategy_save(b, td_test_tmp("b.safetensors"), &ts));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("a.safetensors"), td_test_tmp("b.safetensors")) ==
                0.0);
    td_strategy_destroy(one);
    td_strategy_destroy(b);
    td_strategy_destroy(a);
    td_group_destroy(slowed);
    td_group_destroy(g);
    td_test_data_destroy(d);
}

/* A GPT of 256 channels: too big for one device's budget, trained on two. */
static void a_model_too_big_for_one_device_trains_split(void **state) {
    const char *wide =
        "{\"name\": \"wide\", \"input\": {\"tokens\": 8, \"vocab\": 64}, \"layers\": ["
        "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 256, \"positions\": true},"
        "{\"type\": \"repeat\", \"count\": 4, \"layers\": ["
        "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
        "    {\"type\": \"attention\", \"heads\": 4}]},"
        "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
        "    {\"type\": \"linear\", \"out\": 1024}, {\"type\": \"gelu\"},"
        "    {\"type\": \"linear\", \"out\": 256}]}]},"
        "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";
    /* 3.2 M weights: 12.7 MB each of weights, gradients and the two AdamW
     * moments, about 51 MB in all; 36 MB is enough for half of it. */
    opt_in_use = optimizer(TD_OPT_ADAMW);
    td_strategy_config c = config("pipeline", TD_F32, 4, 2), cs = config("single", TD_F32, 4, 0);
    td_group *g1 = NULL, *g2 = NULL;
    td_strategy *s = NULL;
    td_test_data *d = td_test_data_create(wide, 2, 4);
    td_step_result r;
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu:0{mem=36M}", NULL, &g1));
    TD_ASSERT_STATUS(td_strategy_create(g1, wide, "wide.json", &cs, &s), TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("cpu:0");
    assert_null(s);
    TD_ASSERT_STATUS(td_strategy_create(g1, wide, "wide.json", &c, &s), TD_ERR_OUT_OF_MEMORY);
    td_test_assert_message_contains("cpu:0");
    TD_ASSERT_OK(td_group_create_spec("cpu:0{mem=36M},cpu:1{mem=36M}", NULL, &g2));
    TD_ASSERT_OK(td_strategy_create(g2, wide, "wide.json", &c, &s));
    for (int k = 0; k < 2; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->b[k], (uint64_t)k, &r, NULL));
    assert_true(isfinite(r.loss_sum) && r.count == 4 * 8);
    td_strategy_destroy(s);
    td_group_destroy(g2);
    td_group_destroy(g1);
    td_test_data_destroy(d);
}

static void bad_micro_batch_counts(void **state) {
    opt_in_use = optimizer(TD_OPT_SGD);
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c = config("pipeline", TD_F64, 4, 5);
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_STATUS(td_strategy_create(g, mlp_json, "test", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("5 micro-batches (`micro_batches`) for a batch of 4 samples");
    c.options = "micro_batches=-1";
    TD_ASSERT_STATUS(td_strategy_create(g, mlp_json, "test", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("pipeline: `micro_batches` wants a whole number of at least 1, "
                                    "not '-1'");
    c.options = "micro_batches=4,zero=1";
    TD_ASSERT_STATUS(td_strategy_create(g, mlp_json, "test", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains(
        "pipeline has no option `zero` (its options: `micro_batches`, `replicas`, `tensor`)");
    c.options = "micro_batches";
    TD_ASSERT_STATUS(td_strategy_create(g, mlp_json, "test", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("option `micro_batches` wants a value (micro_batches=M)");
    assert_null(s);
    td_group_destroy(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mlp_on_two_and_three_devices),
        cmocka_unit_test(lenet_on_two_devices),
        cmocka_unit_test(gpt_with_dropout_on_three_devices),
        cmocka_unit_test(llama_on_three_devices),
        cmocka_unit_test(a_slowed_device_gets_fewer_layers),
        cmocka_unit_test(stages_hold_what_their_memory_allows),
        cmocka_unit_test(more_micro_batches_than_a_channel_holds),
        cmocka_unit_test(more_devices_than_layers),
        cmocka_unit_test(the_tail_carried_over_is_paid_before_it_is_read),
        cmocka_unit_test(checkpoints_move_between_strategies),
        cmocka_unit_test(a_model_too_big_for_one_device_trains_split),
        cmocka_unit_test(bad_micro_batch_counts),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
