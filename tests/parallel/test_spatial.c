/* The `spatial` strategy (split-frame) against one device training on the
 * same batches: small conv nets whose conv2d, pool and activation layers
 * run on horizontal bands of each image, with padding, strides, max and
 * average pooling, on 2 and 3 devices and on two of which one is three
 * times slower (whose band must be the smaller), at batch 1 and
 * 2, in f64 (1e-12) and f32 (1e-5); evaluation alike; a band thinner than a
 * kernel's halo refused by name; checkpoints that move to and from
 * `single`; bands re-balanced while a run goes on; the CLI; a lost device
 * carried on by the survivor. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/model_data.h"
#include "support/support.h"
#include "tandem/checkpoint.h"
#include "tandem/strategy.h"

#define STEPS 3

/* conv (padding 1), relu, max-pool, conv (padding 1), tanh, flatten, linear. */
static const char *plain_json =
    "{\"name\": \"sp_plain\", \"input\": {\"shape\": [2, 24, 10]}, \"layers\": ["
    "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1},"
    "{\"type\": \"relu\"}, {\"type\": \"maxpool\", \"kernel\": 2},"
    "{\"type\": \"conv2d\", \"out\": 3, \"kernel\": 3, \"padding\": 1},"
    "{\"type\": \"tanh\"}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 5}]}";

/* Strides and padding that do not divide the rows evenly: a 5x5 conv of
 * stride 2 and padding 2, an unpadded 3x3, a padded 3x3 average pool of
 * stride 1, a padded 3x3 max pool of stride 2, an activation first. */
static const char *strided_json =
    "{\"name\": \"sp_strided\", \"input\": {\"shape\": [1, 31, 9]}, \"layers\": ["
    "{\"type\": \"sigmoid\"},"
    "{\"type\": \"conv2d\", \"out\": 3, \"kernel\": 5, \"stride\": 2, \"padding\": 2},"
    "{\"type\": \"relu\"},"
    "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3},"
    "{\"type\": \"avgpool\", \"kernel\": 3, \"stride\": 1, \"padding\": 1},"
    "{\"type\": \"maxpool\", \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
    "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 4}]}";

/* Eight rows pooled to four, then a 5x5 kernel: on four devices each band
 * holds one row and the kernel reads two beyond it. */
static const char *thin_json =
    "{\"name\": \"sp_thin\", \"input\": {\"shape\": [1, 8, 8]}, \"layers\": ["
    "{\"type\": \"conv2d\", \"out\": 2, \"kernel\": 3, \"padding\": 1},"
    "{\"type\": \"maxpool\", \"kernel\": 2},"
    "{\"type\": \"conv2d\", \"out\": 2, \"kernel\": 5, \"padding\": 2},"
    "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 3}]}";

static td_strategy_config config(const char *name, td_dtype dt, int64_t batch) {
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    c.name = name;
    c.dtype = dt;
    c.seed = 7;
    c.opt.kind = TD_OPT_SGD;
    c.opt.lr = 0.1;
    c.opt.momentum = 0.9;
    c.opt.weight_decay = 0.01;
    c.batch = batch;
    return c;
}

/* Trains `name` on spec over d's batches. */
static td_strategy *train(const char *name, const char *spec, const char *json, td_dtype dt,
                          const td_test_data *d, td_group **g, td_step_result *last,
                          td_step_stats *stats) {
    td_strategy *s = NULL;
    td_strategy_config c = config(name, dt, d->n);
    char plan[4096];
    TD_ASSERT_OK(td_group_create_spec(spec, NULL, g));
    TD_ASSERT_OK(td_strategy_create(*g, json, "test", &c, &s));
    printf("%s on %s:\n%s", name, spec, td_strategy_plan(s, plan, sizeof plan));
    for (int k = 0; k < d->steps; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->b[k], (uint64_t)k, last, stats));
    return s;
}

/* Trains single and spatial alike and compares weights, the last loss and
 * an evaluation; want_plan (NULL: none) must be in spatial's plan. */
static void check_like_one_device(const char *json, const char *spec, td_dtype dt, int64_t batch,
                                  double tol, const char *want_plan) {
    td_test_data *d = td_test_data_create(json, STEPS, batch);
    td_group *g1 = NULL, *g = NULL;
    td_step_result r1, r, e1[STEPS], e[STEPS];
    td_step_stats stats;
    td_strategy *one = train("single", "cpu:0", json, dt, d, &g1, &r1, NULL);
    td_strategy *sp = train("spatial", spec, json, dt, d, &g, &r, &stats);
    char plan[4096];
    double diff;
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("one.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_save(sp, td_test_tmp("sp.safetensors"), NULL));
    diff = td_dp_checkpoint_diff(td_test_tmp("one.safetensors"), td_test_tmp("sp.safetensors"));
    printf("spatial on %s, %s, batch %lld: weights differ by %.3g (tol %g), loss %.17g vs %.17g; "
           "member 0: compute %.3f ms, exchanges %.3f ms (halo %.3f ms)\n",
           spec, dt == TD_F64 ? "f64" : "f32", (long long)batch, diff, tol, r.loss_sum, r1.loss_sum,
           stats.m[0].compute_s * 1e3, stats.m[0].comm_s * 1e3, stats.m[0].halo_s * 1e3);
    assert_true(diff <= tol);
    assert_true(fabs(r.loss_sum - r1.loss_sum) <= 10 * tol * fabs(r1.loss_sum));
    assert_int_equal(r.count, r1.count);
    assert_int_equal(stats.members, td_group_size(g));
    if (stats.members > 1)
        assert_true(stats.m[0].comm_s > 0);
    TD_ASSERT_OK(td_strategy_evaluate(one, d->b, STEPS, e1));
    TD_ASSERT_OK(td_strategy_evaluate(sp, d->b, STEPS, e));
    for (int k = 0; k < STEPS; k++) {
        assert_true(fabs(e[k].loss_sum - e1[k].loss_sum) <= 10 * tol * fabs(e1[k].loss_sum));
        assert_int_equal(e[k].correct, e1[k].correct);
    }
    td_strategy_plan(sp, plan, sizeof plan);
    if (want_plan && !strstr(plan, want_plan))
        fail_msg("the plan does not say \"%s\":\n%s", want_plan, plan);
    td_strategy_destroy(sp);
    td_strategy_destroy(one);
    td_group_destroy(g);
    td_group_destroy(g1);
    td_test_data_destroy(d);
}

static void plain_like_one_device(void **state) {
    (void)state;
    for (int b = 1; b <= 2; b++) {
        check_like_one_device(plain_json, "cpu*2", TD_F64, b, 1e-12, NULL);
        check_like_one_device(plain_json, "cpu*3", TD_F64, b, 1e-12, NULL);
    }
    check_like_one_device(plain_json, "cpu*3", TD_F32, 2, 1e-5, NULL);
}

static void strided_like_one_device(void **state) {
    (void)state;
    check_like_one_device(strided_json, "cpu*2", TD_F64, 1, 1e-12, NULL);
    check_like_one_device(strided_json, "cpu*3", TD_F64, 2, 1e-12, NULL);
    check_like_one_device(strided_json, "cpu*2", TD_F32, 1, 1e-5, NULL);
}

/* Large enough that compute, not fixed costs, decides the measured speeds. */
static const char *wide_json =
    "{\"name\": \"sp_wide\", \"input\": {\"shape\": [3, 64, 48]}, \"layers\": ["
    "{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 3, \"padding\": 1},"
    "{\"type\": \"relu\"},"
    "{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 3, \"padding\": 1},"
    "{\"type\": \"maxpool\", \"kernel\": 2},"
    "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 5}]}";

/* One device three times slower: the larger band goes to the faster one
 * (three quarters of the rows on an idle machine; how much more follows
 * the speeds measured, which a loaded machine blurs). */
/* The rows cpu:0 holds of layer 0 in s's plan, of *all; -1 when the plan
 * does not say. */
static long long rows_of_cpu0(td_strategy *s, long long *all) {
    char plan[4096];
    long long fast = 0;
    const char *line;
    td_strategy_plan(s, plan, sizeof plan);
    line = strstr(plan, "cpu:0: ");
    if (!line || sscanf(line, "cpu:0: rows [0, %lld) of %lld", &fast, all) != 2)
        return -1;
    return fast;
}

static void unequal_bands_like_one_device(void **state) {
    td_strategy_config c = config("spatial", TD_F64, 1);
    int most = 0;
    (void)state;
    check_like_one_device(plain_json, "cpu:0,cpu:1{slowdown=3}", TD_F64, 1, 1e-12, NULL);
    check_like_one_device(wide_json, "cpu:0,cpu:1{slowdown=3}", TD_F64, 1, 1e-12, NULL);
    /* the measured speeds size the bands; a machine busy with other work
     * blurs one measurement, so the fast device must win one of three */
    for (int tries = 0; tries < 3 && !most; tries++) {
        td_group *g = NULL;
        td_strategy *s = NULL;
        long long all = 0, fast;
        TD_ASSERT_OK(td_group_create_spec("cpu:0,cpu:1{slowdown=3}", NULL, &g));
        TD_ASSERT_OK(td_strategy_create(g, wide_json, "wide", &c, &s));
        fast = rows_of_cpu0(s, &all);
        printf("try %d: cpu:0 holds %lld of %lld rows\n", tries + 1, fast, all);
        most = 2 * fast > all;
        td_strategy_destroy(s);
        td_group_destroy(g);
    }
    if (!most)
        fail_msg("cpu:0, three times as fast, did not hold more than half the rows in 3 tries");
}

/* A checkpoint at path of json's initial weights (seed 7, SGD as config())
 * that records spatial's split `shares`. */
static void save_start(const char *json, const char *shares, const char *path) {
    td_strategy_config c = config("single", TD_F64, 1);
    td_device_list *l = td_test_open("cpu:0");
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_train_state st;
    TD_ASSERT_OK(td_model_load_string(json, "start", td_device_list_get(l, 0), TD_F64, 7, &m));
    TD_ASSERT_OK(td_optimizer_create(m, &c.opt, &opt));
    memset(&st, 0, sizeof st);
    st.seed = 7;
    st.batch = 1;
    st.opt = c.opt;
    snprintf(st.split, sizeof st.split, "spatial %s", shares);
    TD_ASSERT_OK(td_checkpoint_save(path, m, opt, &st));
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    td_device_list_destroy(l);
}

/* While it runs the bands follow the measured compute: a run resumed from
 * a checkpoint whose bands gave the slow device of a pair (twelve times
 * slower, a margin a machine busy with other work does not blur) three
 * quarters of the rows trains on those unequal bands, moves rows to the
 * fast device until it holds more than half, and still trains as one
 * device does. */
static void bands_rebalance_while_running(void **state) {
    td_test_data *d = td_test_data_create(wide_json, 8, 1);
    td_strategy_config c = config("single", TD_F64, 1), cs = config("spatial", TD_F64, 1);
    td_group *g1 = NULL, *g = NULL;
    td_strategy *one = NULL, *sp = NULL;
    td_step_result r;
    long long all = 0;
    int moved = 0;
    (void)state;
    /* the start: the initial weights, the slow device's three quarters recorded */
    save_start(wide_json, "0.25 0.75", td_test_tmp("start.safetensors"));
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g1));
    TD_ASSERT_OK(td_group_create_spec("cpu:0,cpu:1{slowdown=12}", NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g1, wide_json, "wide", &c, &one));
    TD_ASSERT_OK(td_strategy_create(g, wide_json, "wide", &cs, &sp));
    TD_ASSERT_OK(td_strategy_load(sp, td_test_tmp("start.safetensors"), NULL));
    assert_int_equal(rows_of_cpu0(sp, &all), 16);
    for (int k = 0; k < 16; k++) {
        TD_ASSERT_OK(td_strategy_step(one, &d->b[k % 8], (uint64_t)k, &r, NULL));
        TD_ASSERT_OK(td_strategy_step(sp, &d->b[k % 8], (uint64_t)k, &r, NULL));
        moved |= 2 * rows_of_cpu0(sp, &all) > all;
    }
    printf("after 16 steps cpu:0 holds %lld of %lld rows\n", rows_of_cpu0(sp, &all), all);
    if (!moved)
        fail_msg("the bands did not move to the faster device in 16 steps");
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("one16.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_save(sp, td_test_tmp("sp16.safetensors"), NULL));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("one16.safetensors"),
                                      td_test_tmp("sp16.safetensors")) <= 1e-12);
    td_strategy_destroy(sp);
    td_strategy_destroy(one);
    td_group_destroy(g);
    td_group_destroy(g1);
    td_test_data_destroy(d);
}

/* With the option rebalance=0 the bands stay those the run started with,
 * however unequal the devices. */
static void rebalance_off_keeps_the_bands(void **state) {
    td_test_data *d = td_test_data_create(wide_json, 8, 1);
    td_strategy_config cs = config("spatial", TD_F64, 1);
    td_group *g = NULL;
    td_strategy *sp = NULL;
    td_step_result r;
    long long all = 0;
    (void)state;
    cs.options = "rebalance=0";
    save_start(wide_json, "0.25 0.75", td_test_tmp("start_off.safetensors"));
    TD_ASSERT_OK(td_group_create_spec("cpu:0,cpu:1{slowdown=12}", NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, wide_json, "wide", &cs, &sp));
    TD_ASSERT_OK(td_strategy_load(sp, td_test_tmp("start_off.safetensors"), NULL));
    for (int k = 0; k < 8; k++) /* two looks at the shares */
        TD_ASSERT_OK(td_strategy_step(sp, &d->b[k], (uint64_t)k, &r, NULL));
    assert_int_equal(rows_of_cpu0(sp, &all), 16);
    td_strategy_destroy(sp);
    td_group_destroy(g);
    td_test_data_destroy(d);
}

/* A member keeps its band's activations, not the image's: on a tall image
 * cut in two even bands (recorded, so that timing does not decide) each
 * member uses less device memory than one device training alone (the
 * weights, their gradients and momentum, which every member holds whole,
 * are small beside the activations here). */
static void a_member_holds_less_than_one_device(void **state) {
    static const char *tall = "{\"input\": {\"shape\": [1, 256, 64]}, \"layers\": ["
                              "{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 3, \"padding\": 1},"
                              "{\"type\": \"relu\"},"
                              "{\"type\": \"conv2d\", \"out\": 8, \"kernel\": 3, \"padding\": 1},"
                              "{\"type\": \"relu\"}, {\"type\": \"maxpool\", \"kernel\": 8},"
                              "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 3}]}";
    td_test_data *d = td_test_data_create(tall, 1, 1);
    td_group *g1 = NULL, *g = NULL;
    td_strategy *one = NULL, *sp = NULL;
    td_strategy_config c = config("single", TD_F64, 1), cs = config("spatial", TD_F64, 1);
    td_step_result r;
    uint64_t whole, band[2];
    (void)state;
    cs.options = "rebalance=0";
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g1));
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g1, tall, "tall", &c, &one));
    TD_ASSERT_OK(td_strategy_create(g, tall, "tall", &cs, &sp));
    save_start(tall, "0.5 0.5", td_test_tmp("even.safetensors"));
    TD_ASSERT_OK(td_strategy_load(sp, td_test_tmp("even.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_step(one, &d->b[0], 0, &r, NULL));
    TD_ASSERT_OK(td_strategy_step(sp, &d->b[0], 0, &r, NULL));
    whole = td_device_mem_used(td_group_device(g1, 0));
    for (int k = 0; k < 2; k++)
        band[k] = td_device_mem_used(td_group_device(g, k));
    printf("device memory: one device %.2f MB; spatial's members %.2f and %.2f MB\n",
           (double)whole / 1e6, (double)band[0] / 1e6, (double)band[1] / 1e6);
    assert_true(band[0] < whole && band[1] < whole);
    td_strategy_destroy(sp);
    td_strategy_destroy(one);
    td_group_destroy(g);
    td_group_destroy(g1);
    td_test_data_destroy(d);
}

static void thin_band_refused(void **state) {
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c = config("spatial", TD_F64, 1);
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu*4", NULL, &g));
    assert_int_equal(td_strategy_create(g, thin_json, "thin", &c, &s), TD_ERR_INVALID_ARG);
    assert_null(s);
    printf("refused: %s\n", td_last_error());
    /* which layer is named first follows the measured shares */
    assert_non_null(strstr(td_last_error(), "spatial: layer "));
    assert_non_null(strstr(td_last_error(), "thinner than the kernel's halo"));
    td_group_destroy(g);
}

/* A model with no conv or pool before its dense layers is refused too. */
static void nothing_to_band_refused(void **state) {
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c = config("spatial", TD_F64, 1);
    const char *mlp = "{\"input\": {\"shape\": [6]}, \"layers\": [{\"type\": \"linear\", "
                      "\"out\": 3}]}";
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    assert_int_equal(td_strategy_create(g, mlp, "mlp", &c, &s), TD_ERR_UNSUPPORTED);
    printf("refused: %s\n", td_last_error());
    assert_non_null(strstr(td_last_error(), "images"));
    td_group_destroy(g);
}

/* A checkpoint of spatial resumes under single and the other way round,
 * with the same numbers as a run that never moved. */
static void checkpoints_move(void **state) {
    td_test_data *d = td_test_data_create(plain_json, STEPS, 1);
    td_group *g1 = NULL, *g = NULL, *g2 = NULL;
    td_strategy *one = NULL, *sp = NULL, *back = NULL;
    td_strategy_config c = config("single", TD_F64, 1), cs = config("spatial", TD_F64, 1);
    td_step_result r;
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g1));
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g2));
    TD_ASSERT_OK(td_strategy_create(g1, plain_json, "test", &c, &one));
    for (int k = 0; k < STEPS; k++)
        TD_ASSERT_OK(td_strategy_step(one, &d->b[k], (uint64_t)k, &r, NULL));
    /* spatial takes over after the first step, single after the second */
    TD_ASSERT_OK(td_strategy_create(g2, plain_json, "test", &c, &back));
    TD_ASSERT_OK(td_strategy_step(back, &d->b[0], 0, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(back, td_test_tmp("first.safetensors"), NULL));
    td_strategy_destroy(back);
    TD_ASSERT_OK(td_strategy_create(g, plain_json, "test", &cs, &sp));
    TD_ASSERT_OK(td_strategy_load(sp, td_test_tmp("first.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_step(sp, &d->b[1], 1, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(sp, td_test_tmp("second.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_create(g2, plain_json, "test", &c, &back));
    TD_ASSERT_OK(td_strategy_load(back, td_test_tmp("second.safetensors"), NULL));
    assert_int_equal(td_strategy_steps(back), 2);
    TD_ASSERT_OK(td_strategy_step(back, &d->b[2], 2, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(back, td_test_tmp("moved.safetensors"), NULL));
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("stayed.safetensors"), NULL));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("stayed.safetensors"),
                                      td_test_tmp("moved.safetensors")) <= 1e-12);
    td_strategy_destroy(back);
    td_strategy_destroy(sp);
    td_strategy_destroy(one);
    td_group_destroy(g);
    td_group_destroy(g1);
    td_group_destroy(g2);
    td_test_data_destroy(d);
}

/* The CLI's inputs: a data set that scripts/make_shapes writes (8 images
 * of 64x64) and a small conv net for it, made once in the test directory. */
static void cli_inputs(char *data, size_t nd, char *model, size_t nm) {
    static int made;
    char cmd[2048], *out = NULL, *err = NULL;
    FILE *f;
    snprintf(data, nd, "%s/shapes", td_test_tmpdir());
    snprintf(model, nm, "%s/shapes64.json", td_test_tmpdir());
    if (made)
        return;
    snprintf(cmd, sizeof cmd, "python3 %s/scripts/make_shapes %s --n 8 --size 64", TD_SOURCE_DIR,
             data);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("'%s' failed: %s", cmd, err ? err : "");
    free(out);
    free(err);
    assert_non_null(f = fopen(model, "w"));
    fputs("{\"input\": {\"shape\": [1, 64, 64]}, \"layers\": ["
          "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 5, \"stride\": 2, \"padding\": 2},"
          "{\"type\": \"relu\"}, {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, "
          "\"padding\": 1}, {\"type\": \"maxpool\", \"kernel\": 4},"
          "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 4}]}",
          f);
    fclose(f);
    made = 1;
}

/* `[env ]tandem train` of the model on the data for 6 steps in f64, its
 * checkpoint as ckpt in the test directory; its standard output. */
static char *train_cli(const char *env, const char *devices, const char *strategy,
                       const char *ckpt) {
    char data[1024], model[1024], cmd[4096], *out = NULL, *err = NULL;
    int rc;
    cli_inputs(data, sizeof data, model, sizeof model);
    snprintf(cmd, sizeof cmd,
             "%s%s train --model %s --data %s/x.npy,%s/y.npy --batch 1 --steps 6 --precision f64 "
             "--no-epoch-eval --devices '%s' --strategy %s --checkpoint %s/%s",
             env, TD_TANDEM_EXE, model, data, data, devices, strategy, td_test_tmpdir(), ckpt);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("'%s' exited %d: %s", cmd, rc, err ? err : "");
    free(err);
    return out;
}

/* `tandem train --strategy spatial` on cpu*2 against --strategy single: the
 * same checkpoint within 1e-12 in f64. */
static void cli_trains_spatial(void **state) {
    char *out;
    (void)state;
    free(train_cli("", "cpu:0", "single", "cli_one.safetensors"));
    out = train_cli("", "cpu*2", "spatial", "cli_sp.safetensors");
    printf("%s", out);
    assert_non_null(strstr(out, "rows [0, "));
    free(out);
    assert_true(td_dp_checkpoint_diff(td_test_tmp("cli_one.safetensors"),
                                      td_test_tmp("cli_sp.safetensors")) <= 1e-12);
}

/* cpu:1 fails at its 9th all-gather (a halo exchange of step 3): every
 * member holds the whole model, so cpu:0 carries on alone without a
 * checkpoint, takes the step again and ends with one device's weights. */
static void a_lost_device_carries_on(void **state) {
    char *out, *lost;
    (void)state;
    free(train_cli("", "cpu:0", "single", "cli_one.safetensors"));
    out = train_cli("TANDEM_FAULT=cpu:1@allgather:9:error ", "cpu*2", "spatial",
                    "cli_lost.safetensors");
    lost = strstr(out, "lost: cpu:1 in step ");
    if (!lost || !strstr(lost, "the other devices trained on"))
        fail_msg("the run did not carry on after cpu:1: %s", out);
    free(out);
    assert_true(td_dp_checkpoint_diff(td_test_tmp("cli_one.safetensors"),
                                      td_test_tmp("cli_lost.safetensors")) <= 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_like_one_device),
        cmocka_unit_test(strided_like_one_device),
        cmocka_unit_test(unequal_bands_like_one_device),
        cmocka_unit_test(bands_rebalance_while_running),
        cmocka_unit_test(rebalance_off_keeps_the_bands),
        cmocka_unit_test(a_member_holds_less_than_one_device),
        cmocka_unit_test(thin_band_refused),
        cmocka_unit_test(nothing_to_band_refused),
        cmocka_unit_test(checkpoints_move),
        cmocka_unit_test(cli_trains_spatial),
        cmocka_unit_test(a_lost_device_carries_on),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
