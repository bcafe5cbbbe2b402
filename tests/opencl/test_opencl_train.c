/* Whole models train on OpenCL (opencl:0.0; PoCL in CI) as on the CPU
 * backend: the same seed gives the same losses, step by step, and the same
 * parameters after a few AdamW steps, within tolerances by precision. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

static td_device_list *g_list; /* cpu:0, opencl:0.0, opencl:0.0/0, opencl:0.0/1 */

#define STEPS 4

typedef struct model_case {
    const char *file;
    int64_t batch;
} model_case;

/* Trains `file` on device i for STEPS steps; losses[s] gets step s's mean loss
 * and params (malloc'ed) every parameter, concatenated, as doubles. */
static void train(const model_case *c, size_t dev_index, td_dtype dt, double *losses,
                  double **params, size_t *nparams) {
    char path[512];
    td_model *m = NULL;
    td_optimizer *opt = NULL;
    td_optimizer_config cfg = TD_OPTIMIZER_CONFIG_INIT;
    int64_t shape[TD_MAX_DIMS];
    int64_t per = 1, n = c->batch, classes;
    int nd;
    float *x = NULL;
    int32_t *tokens = NULL, *labels;
    td_batch b;
    size_t total, at = 0;
    snprintf(path, sizeof path, "%s/examples/%s", TD_SOURCE_DIR, c->file);
    TD_ASSERT_OK(td_model_load(path, td_device_list_get(g_list, dev_index), dt, 7, &m));
    cfg.kind = TD_OPT_ADAMW;
    cfg.lr = 1e-3;
    cfg.weight_decay = 0.01;
    cfg.clip_norm = 1.0;
    TD_ASSERT_OK(td_optimizer_create(m, &cfg, &opt));
    nd = td_model_input_shape(m, shape);
    for (int i = 0; i < nd; i++)
        per *= shape[i];
    classes = td_model_num_classes(m);
    memset(&b, 0, sizeof b);
    b.n = n;
    if (td_model_input_kind(m) == TD_INPUT_TOKENS) {
        tokens = malloc((size_t)(n * per) * sizeof *tokens);
        labels = malloc((size_t)(n * per) * sizeof *labels);
        for (int64_t i = 0; i < n * per; i++) {
            tokens[i] = (int32_t)(td_rng_uniform(11, (uint64_t)i) * (double)classes);
            labels[i] = (int32_t)(td_rng_uniform(12, (uint64_t)i) * (double)classes);
        }
        b.tokens = tokens;
    } else {
        x = malloc((size_t)(n * per) * sizeof *x);
        labels = malloc((size_t)n * sizeof *labels);
        for (int64_t i = 0; i < n * per; i++)
            x[i] = (float)td_rng_uniform(11, (uint64_t)i);
        for (int64_t i = 0; i < n; i++)
            labels[i] = (int32_t)(i % classes);
        b.x = x;
    }
    b.labels = labels;
    for (int s = 0; s < STEPS; s++) {
        td_step_result r;
        TD_ASSERT_OK(
            td_model_train_step(m, &b, 1.0 / (double)(tokens ? n * per : n), 0, (uint64_t)s, &r));
        TD_ASSERT_OK(td_optimizer_step(opt, NULL));
        losses[s] = r.loss_sum / (double)r.count;
    }
    total = td_model_num_weights(m);
    *params = malloc(total * sizeof **params);
    *nparams = total;
    for (size_t i = 0; i < td_model_param_count(m); i++) {
        td_tensor *p = td_model_param(m, i);
        TD_ASSERT_OK(td_tensor_read_f64(p, *params + at, td_tensor_numel(p)));
        at += td_tensor_numel(p);
    }
    assert_int_equal(at, total);
    td_optimizer_destroy(opt);
    td_model_destroy(m);
    free(x);
    free(tokens);
    free(labels);
}

/* Trains on cpu:0 and on OpenCL device `ocl` of g_list; compares. */
static void trains_like_the_cpu_on(const model_case *c, size_t ocl) {
    for (int d = 1; d >= 0; d--) {
        td_dtype dt = (td_dtype)d;
        double lc[STEPS], lo[STEPS], *pc = NULL, *po = NULL, scale = 0, worst = 0;
        double tol_loss = dt == TD_F64 ? 1e-10 : 1e-4, tol_param = dt == TD_F64 ? 1e-10 : 1e-3;
        size_t nc = 0, no = 0;
        train(c, 0, dt, lc, &pc, &nc);
        train(c, ocl, dt, lo, &po, &no);
        assert_int_equal(nc, no);
        for (int s = 0; s < STEPS; s++) {
            printf("%s %s step %d: cpu %.12f opencl %.12f\n", c->file, td_dtype_name(dt), s, lc[s],
                   lo[s]);
            if (!(fabs(lc[s] - lo[s]) <= tol_loss * fabs(lc[s])))
                fail_msg("%s %s: step %d loss cpu %.17g, opencl %.17g", c->file, td_dtype_name(dt),
                         s, lc[s], lo[s]);
        }
        assert_true(lc[STEPS - 1] < lc[0]); /* it learned something */
        for (size_t i = 0; i < nc; i++) {
            scale = fmax(scale, fabs(pc[i]));
            worst = fmax(worst, fabs(pc[i] - po[i]));
        }
        printf("%s %s: parameters differ by %.3g of %.3g\n", c->file, td_dtype_name(dt), worst,
               scale);
        if (!(worst <= tol_param * scale))
            fail_msg("%s %s: parameters differ by %.3g (max %.3g)", c->file, td_dtype_name(dt),
                     worst, scale);
        free(pc);
        free(po);
    }
}

static void trains_like_the_cpu(const model_case *c) {
    trains_like_the_cpu_on(c, 1);
}

static void mnist_mlp_trains_like_the_cpu(void **state) {
    model_case c = {"mnist_mlp.json", 64};
    trains_like_the_cpu(&c);
}

static void lenet5_trains_like_the_cpu(void **state) {
    model_case c = {"lenet5.json", 16};
    trains_like_the_cpu(&c);
}

static void gpt_tiny_trains_like_the_cpu(void **state) {
    model_case c = {"gpt_tiny.json", 2};
    trains_like_the_cpu(&c);
}

/* A sub-device of opencl:0.0{split=2} is a device of its own. */
static void mnist_mlp_trains_on_a_sub_device(void **state) {
    model_case c = {"mnist_mlp.json", 32};
    assert_string_equal(td_device_name(td_device_list_get(g_list, 3)), "opencl:0.0/1");
    trains_like_the_cpu_on(&c, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mnist_mlp_trains_like_the_cpu),
        cmocka_unit_test(lenet5_trains_like_the_cpu),
        cmocka_unit_test(gpt_tiny_trains_like_the_cpu),
        cmocka_unit_test(mnist_mlp_trains_on_a_sub_device),
    };
    int rc;
    if (td_devices_open("cpu:0,opencl:0.0,opencl:0.0{split=2}", &g_list) != TD_OK)
        td_test_skip("no OpenCL device");
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    td_device_list_destroy(g_list);
    return rc;
}
