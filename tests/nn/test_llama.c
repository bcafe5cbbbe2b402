/* The Llama family's layers against direct f64 references written here
 * from their definitions (transformers' LlamaRMSNorm and LlamaMLP), in f64
 * (1e-12) and f32 (1e-5); and the model files the new fields refuse, with
 * their messages. (Backward: test_grad.c.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn-impl.h"
#include "support/support.h"

#define N 2 /* samples */

/* The values of the parameter whose name ends in `suffix`, malloc'ed. */
static double *param(td_model *m, const char *suffix, size_t *n) {
    for (size_t i = 0; i < td_model_param_count(m); i++) {
        const char *name = td_model_param_name(m, i);
        size_t ln = strlen(name), ls = strlen(suffix);
        if (ln >= ls && !strcmp(name + ln - ls, suffix)) {
            td_tensor *t = td_model_param(m, i);
            double *v = malloc(sizeof(double) * td_tensor_numel(t));
            TD_ASSERT_OK(td_tensor_read_f64(t, v, td_tensor_numel(t)));
            if (n)
                *n = td_tensor_numel(t);
            return v;
        }
    }
    fail_msg("no parameter named *%s", suffix);
    return NULL;
}

/* Gives the parameter ending in suffix random values around `center`. */
static void randomise(td_model *m, const char *suffix, double center, uint64_t seed) {
    size_t n = 0;
    double *v = param(m, suffix, &n);
    for (size_t i = 0; i < n; i++)
        v[i] = center + 0.5 * td_rng_normal(seed, (uint64_t)i);
    for (size_t i = 0; i < td_model_param_count(m); i++) {
        const char *name = td_model_param_name(m, i);
        if (strlen(name) >= strlen(suffix) && !strcmp(name + strlen(name) - strlen(suffix), suffix))
            TD_ASSERT_OK(td_tensor_write_f64(td_model_param(m, i), v, n));
    }
    free(v);
}

/* A layer's output after the last forward, as doubles (CPU memory is host memory). */
static double *layer_out(const td_layer *l) {
    const td_tensor *out = &l->out;
    double *v = malloc(sizeof(double) * out->numel);
    for (size_t i = 0; i < out->numel; i++)
        v[i] =
            out->dtype == TD_F32 ? ((const float *)out->data)[i] : ((const double *)out->data)[i];
    return v;
}

static void expect_close(const double *got, const double *want, size_t n, double tol,
                         const char *what) {
    double worst = 0, scale = 1;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(got[i] - want[i]));
    printf("  %-40s worst difference %.2g (of %.3g)\n", what, worst, scale);
    if (!(worst <= tol * scale))
        fail_msg("%s: differs from the reference by %g (tolerance %g)", what, worst, tol * scale);
}

/* y (rows, out) = x (rows, in) W^T + b (b may be NULL). */
static void ref_linear(const double *x, const double *w, const double *b, int64_t rows, int64_t in,
                       int64_t out, double *y) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
            double s = b ? b[o] : 0;
            for (int64_t i = 0; i < in; i++)
                s += x[r * in + i] * w[o * in + i];
            y[r * out + o] = s;
        }
}

/* x (n, in...) in f64 and as the floats the batch carries. */
static float *inputs(size_t count, double *x) {
    float *xf = malloc(sizeof(float) * count);
    for (size_t i = 0; i < count; i++) {
        xf[i] = (float)td_rng_normal(21, (uint64_t)i);
        x[i] = xf[i];
    }
    return xf;
}

static void run_forward(td_model *m, const float *x) {
    int32_t labels[N] = {0, 1};
    td_batch b = {N, x, NULL, labels};
    TD_ASSERT_OK(td_model_evaluate(m, &b, NULL));
}

/* RMSNorm and SwiGLU ------------------------------------------------------------------- */

enum { R = 4, C = 6, F = 5 };

static void rmsnorm_swiglu(td_dtype dt, double tol) {
    static const char *json =
        "{\"input\": {\"shape\": [4, 6]}, \"layers\": [{\"type\": \"rmsnorm\", \"eps\": 0.01}, "
        "{\"type\": \"swiglu\", \"hidden\": 5, \"bias\": true}, {\"type\": \"flatten\"}, "
        "{\"type\": \"linear\", \"out\": 3}]}";
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    double x[N * R * C], norm[N * R * C], gu[N * R * 2 * F], h[N * R * F], y[N * R * C];
    double *w, *wgu, *bgu, *wd, *bd, *got;
    float *xf = inputs(N * R * C, x);
    TD_ASSERT_OK(td_model_load_string(json, "rms_swiglu", td_device_list_get(list, 0), dt, 5, &m));
    randomise(m, "0.weight", 1.0, 31); /* RMSNorm's weight starts at ones */
    run_forward(m, xf);
    w = param(m, "0.weight", NULL);
    wgu = param(m, "gate_up.weight", NULL);
    bgu = param(m, "gate_up.bias", NULL);
    wd = param(m, "down.weight", NULL);
    bd = param(m, "down.bias", NULL);
    /* LlamaRMSNorm: x / sqrt(mean(x^2) + eps) * w */
    for (int r = 0; r < N * R; r++) {
        double ss = 0;
        for (int j = 0; j < C; j++)
            ss += x[r * C + j] * x[r * C + j];
        for (int j = 0; j < C; j++)
            norm[r * C + j] = x[r * C + j] / sqrt(ss / C + 0.01) * w[j];
    }
    got = layer_out(m->root->children[0]);
    expect_close(got, norm, N * R * C, tol, dt == TD_F64 ? "rmsnorm f64" : "rmsnorm f32");
    free(got);
    /* LlamaMLP: down(silu(gate(x)) * up(x)) */
    ref_linear(norm, wgu, bgu, N * R, C, 2 * F, gu);
    for (int r = 0; r < N * R; r++)
        for (int j = 0; j < F; j++) {
            double g = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
            h[r * F + j] = g / (1 + exp(-g)) * u;
        }
    ref_linear(h, wd, bd, N * R, F, C, y);
    got = layer_out(m->root->children[1]);
    expect_close(got, y, N * R * C, tol, dt == TD_F64 ? "swiglu f64" : "swiglu f32");
    free(got);
    free(w);
    free(wgu);
    free(bgu);
    free(wd);
    free(bd);
    free(xf);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

static void rmsnorm_swiglu_f64(void **state) {
    rmsnorm_swiglu(TD_F64, 1e-12);
}
static void rmsnorm_swiglu_f32(void **state) {
    rmsnorm_swiglu(TD_F32, 1e-5);
}

/* Bad model files ------------------------------------------------------------------------- */

static void expect_refused(const char *layer, const char *needle) {
    char json[512];
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    snprintf(json, sizeof json,
             "{\"input\": {\"tokens\": 8, \"vocab\": 10}, \"layers\": [{\"type\": \"embedding\", "
             "\"vocab\": 10, \"dim\": 12, \"positions\": false}, %s, {\"type\": \"linear\", "
             "\"out\": 10}]}",
             layer);
    TD_ASSERT_STATUS(
        td_model_load_string(json, "bad.json", td_device_list_get(list, 0), TD_F32, 1, &m),
        TD_ERR_PARSE);
    assert_null(m);
    td_test_assert_message_contains("bad.json: layers[1].");
    td_test_assert_message_contains(needle);
    td_device_list_destroy(list);
}

static void bad_fields_are_refused(void **state) {
    expect_refused("{\"type\": \"rmsnorm\", \"eps\": -1}", "eps: expected a number");
    expect_refused("{\"type\": \"rmsnorm\", \"bias\": true}", "bias: unknown field");
    expect_refused("{\"type\": \"swiglu\"}", "hidden: missing");
    expect_refused("{\"type\": \"swiglu\", \"hidden\": 0}", "hidden: expected a positive integer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rmsnorm_swiglu_f64),
        cmocka_unit_test(rmsnorm_swiglu_f32),
        cmocka_unit_test(bad_fields_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
