/* The `data` strategy over OpenCL devices: PoCL sub-devices
 * (opencl:0.0{split=2}) and a mixed group (cpu:0 with opencl:0.0) train like
 * one CPU device on the same global batches, within the data-parallel
 * tolerances (f64 1e-12, f32 1e-5); an OpenCL member that is lost stops the
 * step with a status naming it, and the survivors train on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"
#include "tandem/comm.h"
#include "tandem/parallel.h"

#define FEATURES 20
#define CLASSES  7
#define BATCH    41 /* prime: no split is even */
#define STEPS    4

static const char *model_json = "{\"name\": \"dp_ocl\", \"input\": {\"shape\": [20]}, \"layers\": ["
                                "{\"type\": \"linear\", \"out\": 24}, {\"type\": \"gelu\"},"
                                "{\"type\": \"linear\", \"out\": 16}, {\"type\": \"relu\"},"
                                "{\"type\": \"linear\", \"out\": 7}]}";

typedef struct data {
    float x[STEPS][BATCH * FEATURES];
    int32_t y[STEPS][BATCH];
    td_batch batch[STEPS];
} data;

static void make_data(data *d) {
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < BATCH * FEATURES; i++)
            d->x[s][i] = (float)td_rng_normal(91, (uint64_t)(s * BATCH * FEATURES + i));
        for (int i = 0; i < BATCH; i++)
            d->y[s][i] = (int32_t)(td_rng_uniform(92, (uint64_t)(s * BATCH + i)) * CLASSES);
        d->batch[s] = (td_batch){BATCH, d->x[s], NULL, d->y[s]};
    }
}

static td_optimizer_config adamw(void) {
    td_optimizer_config o = TD_OPTIMIZER_CONFIG_INIT;
    o.kind = TD_OPT_ADAMW;
    o.lr = 0.01;
    o.weight_decay = 0.01;
    return o;
}

static td_model *train_single(td_device *dev, td_dtype dt, const data *d, td_step_result *last) {
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config o = adamw();
    TD_ASSERT_OK(td_model_load_string(model_json, "dp_ocl", dev, dt, 3, &m));
    TD_ASSERT_OK(td_optimizer_create(m, &o, &opt));
    for (int s = 0; s < STEPS; s++) {
        TD_ASSERT_OK(td_model_train_step(m, &d->batch[s], 1.0 / BATCH, 0, (uint64_t)s, last));
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
    }
    td_optimizer_destroy(opt);
    return m;
}

/* Largest |a - b| over the parameters, relative to the largest |b|. */
static double weights_diff(td_model *a, td_model *b) {
    double worst = 0;
    for (size_t p = 0; p < td_model_param_count(a); p++) {
        td_tensor *ta = td_model_param(a, p), *tb = td_model_param(b, p);
        size_t n = td_tensor_numel(ta);
        double *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb), scale = 0, dd = 0;
        TD_ASSERT_OK(td_tensor_read_f64(ta, ha, n));
        TD_ASSERT_OK(td_tensor_read_f64(tb, hb, n));
        for (size_t i = 0; i < n; i++) {
            scale = fmax(scale, fabs(hb[i]));
            dd = fmax(dd, fabs(ha[i] - hb[i]));
        }
        worst = fmax(worst, dd / scale);
        free(ha);
        free(hb);
    }
    return worst;
}

/* Trains with the data strategy over spec (shares set unequal on purpose)
 * and compares every replica with one CPU device. */
static void data_parallel_equals_one_device(const char *spec) {
    static const double speeds[2] = {1, 2.5};
    data *d = malloc(sizeof *d);
    td_device_list *one = NULL;
    make_data(d);
    TD_ASSERT_OK(td_devices_open("cpu:0", &one));
    for (int dt = 1; dt >= 0; dt--) {
        td_step_result ref_res, res;
        td_model *ref = train_single(td_device_list_get(one, 0), (td_dtype)dt, d, &ref_res);
        td_group *g = NULL;
        td_dp *dp = NULL;
        td_dp_config cfg = TD_DP_CONFIG_INIT;
        td_optimizer_config o = adamw();
        double tol = dt == TD_F64 ? 1e-12 : 1e-5;
        cfg.first_bucket_bytes = 256; /* several buckets even for this small model */
        cfg.bucket_bytes = 1024;
        cfg.rebalance = 0;
        TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
        TD_ASSERT_OK(td_dp_create(g, model_json, "dp_ocl", (td_dtype)dt, 3, &o, &cfg, &dp));
        TD_ASSERT_OK(td_balancer_set_speeds(td_dp_balancer(dp), speeds));
        for (int s = 0; s < STEPS; s++) {
            td_dp_stats stats;
            TD_ASSERT_OK(td_dp_step(dp, &d->batch[s], (uint64_t)s, &res, &stats));
            assert_int_equal(stats.members, 2);
            assert_int_equal(stats.m[0].samples + stats.m[1].samples, BATCH);
            assert_true(stats.m[1].samples > stats.m[0].samples);
        }
        for (int r = 0; r < 2; r++) {
            double diff = weights_diff(td_dp_model(dp, r), ref);
            printf("%s on %s: replica %d differs from one device by %.3g\n", dt ? "f64" : "f32",
                   spec, r, diff);
            if (diff > tol)
                fail_msg("%s on %s: replica %d differs from one device by %g (tolerance %g)",
                         dt ? "f64" : "f32", spec, r, diff, tol);
        }
        assert_int_equal(res.count, BATCH);
        assert_int_equal(res.correct, ref_res.correct);
        assert_true(fabs(res.loss_sum - ref_res.loss_sum) <= tol * 10 * fabs(ref_res.loss_sum));
        td_dp_destroy(dp);
        td_group_destroy(g);
        td_model_destroy(ref);
    }
    td_device_list_destroy(one);
    free(d);
}

static void sub_devices_train_like_one_device(void **state) {
    data_parallel_equals_one_device("opencl:0.0{split=2}");
}

static void cpu_and_opencl_train_like_one_device(void **state) {
    data_parallel_equals_one_device("cpu:0,opencl:0.0");
}

/* opencl:0.0 fails at its third all-reduce (injected: TANDEM_FAULT syntax),
 * in the first training step: the step returns TD_ERR_DEVICE_LOST naming
 * it; the group shrinks to cpu:0, which trains on from its own replica. */
static void a_lost_opencl_member_is_named_and_the_survivor_trains_on(void **state) {
    data *d = malloc(sizeof *d);
    td_group *g = NULL, *alive = NULL;
    td_group_config gc = TD_GROUP_CONFIG_INIT;
    td_dp *dp = NULL, *dp2 = NULL;
    td_dp_config cfg = TD_DP_CONFIG_INIT;
    td_optimizer_config o = adamw();
    td_step_result res;
    make_data(d);
    gc.fault = "opencl:0.0@allreduce:3:error";
    cfg.balancer.park = 0; /* both members take part in the step */
    cfg.rebalance = 0;
    TD_ASSERT_OK(td_group_create_spec("cpu:0,opencl:0.0", &gc, &g));
    TD_ASSERT_OK(td_dp_create(g, model_json, "dp_ocl", TD_F32, 3, &o, &cfg, &dp));
    TD_ASSERT_STATUS(td_dp_step(dp, &d->batch[0], 0, &res, NULL), TD_ERR_DEVICE_LOST);
    td_test_assert_message_contains("opencl:0.0");
    td_dp_destroy(dp);
    TD_ASSERT_OK(td_group_shrink(g, NULL, 0, &alive));
    assert_int_equal(td_group_size(alive), 1);
    TD_ASSERT_OK(td_dp_create(alive, model_json, "dp_ocl", TD_F32, 3, &o, &cfg, &dp2));
    for (int s = 0; s < STEPS; s++)
        TD_ASSERT_OK(td_dp_step(dp2, &d->batch[s], (uint64_t)s, &res, NULL));
    assert_int_equal(res.count, BATCH);
    td_dp_destroy(dp2);
    td_group_destroy(alive);
    td_group_destroy(g);
    free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sub_devices_train_like_one_device),
        cmocka_unit_test(cpu_and_opencl_train_like_one_device),
        cmocka_unit_test(a_lost_opencl_member_is_named_and_the_survivor_trains_on),
    };
    td_device_list *list = NULL;
    if (td_devices_open("opencl:0.0", &list) != TD_OK)
        td_test_skip("no OpenCL device");
    td_device_list_destroy(list);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
