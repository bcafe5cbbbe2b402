#include "support/dp_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/parallel.h"

td_dp_data *td_dp_data_create(int steps, int size, int features, int classes, uint64_t x_seed,
                              uint64_t y_seed) {
    td_dp_data *d = calloc(1, sizeof *d);
    assert_non_null(d);
    d->steps = steps;
    d->size = size;
    d->features = features;
    d->classes = classes;
    d->x = malloc(sizeof *d->x * (size_t)steps * (size_t)size * (size_t)features);
    d->y = malloc(sizeof *d->y * (size_t)steps * (size_t)size);
    d->batch = malloc(sizeof *d->batch * (size_t)steps);
    assert_non_null(d->x);
    assert_non_null(d->y);
    assert_non_null(d->batch);
    for (int s = 0; s < steps; s++) {
        float *x = d->x + (size_t)s * (size_t)size * (size_t)features;
        int32_t *y = d->y + (size_t)s * (size_t)size;
        for (int i = 0; i < size * features; i++)
            x[i] = (float)td_rng_normal(x_seed, (uint64_t)(s * size * features + i));
        for (int i = 0; i < size; i++)
            y[i] = (int32_t)(td_rng_uniform(y_seed, (uint64_t)(s * size + i)) * classes);
        d->batch[s] = (td_batch){size, x, NULL, y};
    }
    return d;
}

void td_dp_data_destroy(td_dp_data *d) {
    if (!d)
        return;
    free(d->x);
    free(d->y);
    free(d->batch);
    free(d);
}

td_model *td_dp_train_single(const char *json, const char *name, uint64_t seed,
                             const td_optimizer_config *o, td_device *dev, td_dtype dt,
                             const td_dp_data *d, td_step_result *last) {
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    TD_ASSERT_OK(td_model_load_string(json, name, dev, dt, seed, &m));
    TD_ASSERT_OK(td_optimizer_create(m, o, &opt));
    for (int s = 0; s < d->steps; s++) {
        TD_ASSERT_OK(td_model_train_step(m, &d->batch[s], 1.0 / d->size, 0, (uint64_t)s, last));
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
    }
    td_optimizer_destroy(opt);
    return m;
}

double td_dp_tensor_diff(const td_tensor *a, const td_tensor *b) {
    size_t n = td_tensor_numel(b);
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), d = 0, m = 0;
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(td_tensor_numel(a), n);
    TD_ASSERT_OK(td_tensor_read_f64(a, x, n));
    TD_ASSERT_OK(td_tensor_read_f64(b, y, n));
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(x[i] - y[i]));
        m = fmax(m, fabs(y[i]));
    }
    free(x);
    free(y);
    return m > 0 ? d / m : d;
}

double td_dp_weights_diff(td_model *a, td_model *b) {
    double worst = 0;
    for (size_t p = 0; p < td_model_param_count(a); p++)
        worst = fmax(worst, td_dp_tensor_diff(td_model_param(a, p), td_model_param(b, p)));
    return worst;
}

double td_dp_checkpoint_diff(const char *path_a, const char *path_b) {
    td_device_list *l = NULL;
    td_model *ma = NULL, *mb = NULL;
    double worst;
    TD_ASSERT_OK(td_devices_open("cpu:0", &l));
    TD_ASSERT_OK(td_checkpoint_load_model(path_a, td_device_list_get(l, 0), &ma, NULL));
    TD_ASSERT_OK(td_checkpoint_load_model(path_b, td_device_list_get(l, 0), &mb, NULL));
    worst = td_dp_weights_diff(ma, mb);
    td_model_destroy(ma);
    td_model_destroy(mb);
    td_device_list_destroy(l);
    return worst;
}

void td_dp_assert_like_one_device(td_dp *dp, int members, td_model *ref, const td_step_result *res,
                                  const td_step_result *ref_res, int64_t batch, double tol,
                                  const char *what) {
    for (int r = 0; r < members; r++) {
        double diff = td_dp_weights_diff(td_dp_model(dp, r), ref);
        printf("%s: replica %d differs from one device by %.3g\n", what, r, diff);
        if (diff > tol)
            fail_msg("%s: replica %d differs from one device by %g (tolerance %g)", what, r, diff,
                     tol);
    }
    assert_int_equal(res->count, batch);
    assert_int_equal(res->correct, ref_res->correct);
    assert_true(fabs(res->loss_sum - ref_res->loss_sum) <= tol * 10 * fabs(ref_res->loss_sum));
}

/* The backend check ------------------------------------------------------------------------ */

#define FEATURES 20
#define CLASSES  7
#define SEED     3 /* the models' initial weights */

void td_dp_check_model(const char *name, char *json, size_t n) {
    snprintf(json, n,
             "{\"name\": \"%s\", \"input\": {\"shape\": [20]}, \"layers\": ["
             "{\"type\": \"linear\", \"out\": 24}, {\"type\": \"gelu\"},"
             "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"relu\"},"
             "{\"type\": \"linear\", \"out\": 7}]}",
             name);
}

td_dp_data *td_dp_check_data(void) {
    return td_dp_data_create(TD_DP_CHECK_STEPS, TD_DP_CHECK_BATCH, FEATURES, CLASSES, 91, 92);
}

td_optimizer_config td_dp_check_adamw(void) {
    td_optimizer_config o = TD_OPTIMIZER_CONFIG_INIT;
    o.kind = TD_OPT_ADAMW;
    o.lr = 0.01;
    o.weight_decay = 0.01;
    return o;
}

void td_dp_check_equals_one_device(const char *spec, const char *name) {
    static const double speeds[2] = {1, 2.5};
    td_dp_data *d = td_dp_check_data();
    td_device_list *one = NULL;
    char json[512];
    td_dp_check_model(name, json, sizeof json);
    TD_ASSERT_OK(td_devices_open("cpu:0", &one));
    for (int dt = 1; dt >= 0; dt--) {
        td_step_result ref_res, res;
        td_optimizer_config o = td_dp_check_adamw();
        td_model *ref = td_dp_train_single(json, name, SEED, &o, td_device_list_get(one, 0),
                                           (td_dtype)dt, d, &ref_res);
        td_group *g = NULL;
        td_dp *dp = NULL;
        td_dp_config cfg = TD_DP_CONFIG_INIT;
        double tol = dt == TD_F64 ? 1e-12 : 1e-5;
        char what[256];
        cfg.first_bucket_bytes = 256; /* several buckets even for this small model */
        cfg.bucket_bytes = 1024;
        cfg.rebalance = 0;
        TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
        TD_ASSERT_OK(td_dp_create(g, json, name, (td_dtype)dt, SEED, &o, &cfg, &dp));
        TD_ASSERT_OK(td_balancer_set_speeds(td_dp_balancer(dp), speeds));
        for (int s = 0; s < TD_DP_CHECK_STEPS; s++) {
            td_step_stats stats;
            TD_ASSERT_OK(td_dp_step(dp, &d->batch[s], (uint64_t)s, &res, &stats));
            assert_int_equal(stats.members, 2);
            assert_int_equal(stats.m[0].samples + stats.m[1].samples, TD_DP_CHECK_BATCH);
            assert_true(stats.m[1].samples > stats.m[0].samples);
        }
        snprintf(what, sizeof what, "%s on %s", dt ? "f64" : "f32", spec);
        td_dp_assert_like_one_device(dp, 2, ref, &res, &ref_res, TD_DP_CHECK_BATCH, tol, what);
        td_dp_destroy(dp);
        td_group_destroy(g);
        td_model_destroy(ref);
    }
    td_device_list_destroy(one);
    td_dp_data_destroy(d);
}

double td_strategy_weights_diff(td_strategy *s, td_model *ref) {
    td_device_list *l = NULL;
    td_model *m = NULL;
    double diff;
    TD_ASSERT_OK(td_devices_open("cpu:0", &l));
    TD_ASSERT_OK(td_strategy_save(s, td_test_tmp("strategy_check.safetensors"), NULL));
    TD_ASSERT_OK(td_checkpoint_load_model(td_test_tmp("strategy_check.safetensors"),
                                          td_device_list_get(l, 0), &m, NULL));
    diff = td_dp_weights_diff(m, ref);
    td_model_destroy(m);
    td_device_list_destroy(l);
    return diff;
}

void td_strategy_check_equals_one_device(const char *strategy, const char *spec, const char *name) {
    td_dp_data *d = td_dp_check_data();
    td_device_list *one = NULL;
    char json[512];
    td_dp_check_model(name, json, sizeof json);
    TD_ASSERT_OK(td_devices_open("cpu:0", &one));
    for (int dt = 1; dt >= 0; dt--) {
        td_step_result ref_res, res = {0, 0, 0};
        td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
        td_model *ref;
        td_group *g = NULL;
        td_strategy *s = NULL;
        double tol = dt == TD_F64 ? 1e-12 : 1e-5, diff;
        char plan[2048];
        c.name = strategy;
        c.dtype = (td_dtype)dt;
        c.seed = SEED;
        c.batch = TD_DP_CHECK_BATCH;
        c.options = strcmp(strategy, "pipeline") ? NULL : "micro_batches=4";
        c.opt.kind = TD_OPT_SGD;
        c.opt.lr = 0.1;
        c.opt.momentum = 0.9;
        c.opt.weight_decay = 0.01;
        ref = td_dp_train_single(json, name, SEED, &c.opt, td_device_list_get(one, 0), (td_dtype)dt,
                                 d, &ref_res);
        TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
        TD_ASSERT_OK(td_strategy_create(g, json, name, &c, &s));
        printf("%s", td_strategy_plan(s, plan, sizeof plan));
        for (int k = 0; k < TD_DP_CHECK_STEPS; k++)
            TD_ASSERT_OK(td_strategy_step(s, &d->batch[k], (uint64_t)k, &res, NULL));
        diff = td_strategy_weights_diff(s, ref);
        printf("%s on %s, %s: weights differ from one device by %.3g (tol %g)\n", strategy, spec,
               dt ? "f64" : "f32", diff, tol);
        assert_true(diff <= tol);
        assert_int_equal(res.count, ref_res.count);
        assert_int_equal(res.correct, ref_res.correct);
        td_strategy_destroy(s);
        td_group_destroy(g);
        td_model_destroy(ref);
    }
    td_device_list_destroy(one);
    td_dp_data_destroy(d);
}

char *td_dp_train_cli_model(const char *launcher, const char *model, const char *devices,
                            const char *extra, const char *ckpt) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd,
             "%s%s train --model %s --data %s/data/mnist --batch 64 --lr 0.05 --eval-samples 200 "
             "--no-epoch-eval --quiet --devices '%s' %s --checkpoint %s/%s",
             launcher, TD_TANDEM_EXE, model, TD_SOURCE_DIR, devices, extra, td_test_tmpdir(), ckpt);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("'%s' exited %d: %s", cmd, rc, err ? err : "");
    free(err);
    return out;
}

char *td_dp_train_cli(const char *launcher, const char *devices, const char *extra,
                      const char *ckpt) {
    return td_dp_train_cli_model(launcher, TD_SOURCE_DIR "/examples/mnist_mlp.json", devices, extra,
                                 ckpt);
}
