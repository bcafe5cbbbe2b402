/* The Llama family's layers against direct f64 references written here
 * from their definitions (transformers' LlamaRMSNorm, LlamaMLP, and
 * LlamaAttention with rotate_half and repeat_kv): RMSNorm, the SwiGLU MLP,
 * and attention with grouped-query heads, rotary positions (with Llama 3's
 * frequency scaling) and biases per projection, each in f64 (1e-12) and
 * f32 (1e-5), with the fused and the composed attention. And the model
 * files the new fields refuse, with their messages. (Backward: test_grad.c;
 * the KV-cache decoder: test_decode.c.) */
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

/* Attention ------------------------------------------------------------------------------ */

enum { T = 7, AC = 24 };

typedef struct att_case {
    const char *name;
    int heads, kv, qkv_bias, proj_bias;
    double theta; /* 0: no rotary positions */
    int scaled;   /* Llama 3's scaling: factor 4, bands 1 and 4, original 40 */
} att_case;

static const att_case att_cases[] = {
    {"gpt2 (4 heads, biases)", 4, 4, 1, 1, 0, 0},
    {"llama (4 heads, 2 kv, rope)", 4, 2, 0, 0, 10000, 0},
    {"qwen2 (6 heads, 2 kv, qkv bias)", 6, 2, 1, 0, 1e6, 0},
    {"multi-query llama3 scaling", 3, 1, 0, 1, 500, 1},
    {"rope, kv = heads", 2, 2, 1, 1, 100, 1},
};

/* transformers' _compute_llama3_parameters, written out. */
static double ref_freq(const att_case *a, int j, int d) {
    double f = 1.0 / pow(a->theta, 2.0 * j / d), wl = 2 * M_PI / f;
    if (!a->scaled || wl < 40.0 / 4)
        return f;
    if (wl > 40.0 / 1)
        return f / 4;
    double smooth = (40.0 / wl - 1) / (4 - 1);
    return (1 - smooth) * f / 4 + smooth * f;
}

/* One head's (d) rotate_half embedding at position p. */
static void ref_rope(const att_case *a, double *v, int d, int p) {
    for (int j = 0; j < d / 2; j++) {
        double ang = p * ref_freq(a, j, d), x1 = v[j], x2 = v[j + d / 2];
        v[j] = x1 * cos(ang) - x2 * sin(ang);
        v[j + d / 2] = x2 * cos(ang) + x1 * sin(ang);
    }
}

static void ref_attention(const att_case *a, const double *x, const double *wqkv,
                          const double *bqkv, const double *wo, const double *bo, double *y) {
    int h = a->heads, kv = a->kv, d = AC / h, w = (h + 2 * kv) * d;
    double *qkv = malloc(sizeof(double) * N * T * w), *yh = malloc(sizeof(double) * N * T * AC);
    ref_linear(x, wqkv, bqkv, N * T, AC, w, qkv);
    for (int b = 0; b < N; b++)
        for (int t = 0; t < T; t++) {
            double *row = qkv + (b * T + t) * w;
            for (int i = 0; a->theta > 0 && i < h + kv; i++)
                ref_rope(a, row + i * d, d, t); /* q heads, then k heads */
        }
    for (int b = 0; b < N; b++)
        for (int i = 0; i < h; i++) {
            int j = i / (h / kv); /* repeat_kv */
            for (int t = 0; t < T; t++) {
                double s[T], mx = -1e300, sum = 0;
                const double *q = qkv + (b * T + t) * w + i * d;
                for (int u = 0; u <= t; u++) {
                    const double *k = qkv + (b * T + u) * w + h * d + j * d;
                    s[u] = 0;
                    for (int e = 0; e < d; e++)
                        s[u] += q[e] * k[e];
                    s[u] /= sqrt((double)d);
                    mx = fmax(mx, s[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += (s[u] = exp(s[u] - mx));
                for (int e = 0; e < d; e++) {
                    double acc = 0;
                    for (int u = 0; u <= t; u++)
                        acc += s[u] / sum * qkv[(b * T + u) * w + (h + kv) * d + j * d + e];
                    yh[(b * T + t) * AC + i * d + e] = acc;
                }
            }
        }
    ref_linear(yh, wo, bo, N * T, AC, AC, y);
    free(qkv);
    free(yh);
}

static void attention_case(const att_case *a, td_dtype dt, int generic, double tol) {
    char json[768], what[96];
    td_device_list *list = td_test_open("cpu");
    td_model *m = NULL;
    double x[N * T * AC], y[N * T * AC];
    double *wqkv, *bqkv = NULL, *wo, *bo = NULL, *got;
    float *xf = inputs(N * T * AC, x);
    char rope[256] = "";
    if (a->theta > 0)
        snprintf(rope, sizeof rope, ", \"rope_theta\": %.17g%s", a->theta,
                 a->scaled ? ", \"rope_scaling\": {\"type\": \"llama3\", \"factor\": 4, "
                             "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                             "\"original_max_position_embeddings\": 40}"
                           : "");
    snprintf(json, sizeof json,
             "{\"input\": {\"shape\": [%d, %d]}, \"layers\": [{\"type\": \"attention\", "
             "\"heads\": %d, \"kv_heads\": %d, \"qkv_bias\": %s, \"proj_bias\": %s%s}, "
             "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 3}]}",
             T, AC, a->heads, a->kv, a->qkv_bias ? "true" : "false",
             a->proj_bias ? "true" : "false", rope);
    td__nn_generic_attention = generic;
    TD_ASSERT_OK(td_model_load_string(json, a->name, td_device_list_get(list, 0), dt, 9, &m));
    run_forward(m, xf);
    wqkv = param(m, "qkv.weight", NULL);
    if (a->qkv_bias)
        bqkv = param(m, "qkv.bias", NULL);
    wo = param(m, "proj.weight", NULL);
    if (a->proj_bias)
        bo = param(m, "proj.bias", NULL);
    assert_int_equal(td_model_param_count(m), 2 + a->qkv_bias + a->proj_bias + 2);
    ref_attention(a, x, wqkv, bqkv, wo, bo, y);
    got = layer_out(m->root->children[0]);
    snprintf(what, sizeof what, "%s %s%s", a->name, dt == TD_F64 ? "f64" : "f32",
             generic ? " composed" : "");
    expect_close(got, y, N * T * AC, tol, what);
    free(got);
    free(wqkv);
    free(bqkv);
    free(wo);
    free(bo);
    free(xf);
    td_model_destroy(m);
    td_device_list_destroy(list);
    td__nn_generic_attention = 0;
}

static void attention_matches_reference(void **state) {
    for (size_t i = 0; i < sizeof att_cases / sizeof *att_cases; i++)
        for (int generic = 0; generic < 2; generic++) {
            attention_case(&att_cases[i], TD_F64, generic, 1e-12);
            attention_case(&att_cases[i], TD_F32, generic, 1e-5);
        }
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
    expect_refused("{\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 3}",
                   "kv_heads: 3 key/value heads cannot serve 4 query heads");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"kv_heads\": 4}", "kv_heads");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"kv_heads\": 0}",
                   "kv_heads: expected a positive integer");
    expect_refused("{\"type\": \"attention\", \"heads\": 4, \"rope_theta\": 10000}",
                   "rope_theta: rotary positions need an even head width");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"rope_theta\": -1}", "rope_theta");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"rope_scaling\": {\"type\": "
                   "\"llama3\"}}",
                   "rope_scaling: needs rope_theta");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"rope_theta\": 1e4, "
                   "\"rope_scaling\": {\"type\": \"yarn\"}}",
                   "rope_scaling.type: expected \"llama3\"");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"rope_theta\": 1e4, "
                   "\"rope_scaling\": {\"type\": \"llama3\", \"factr\": 8}}",
                   "rope_scaling.factr: unknown field");
    expect_refused("{\"type\": \"attention\", \"heads\": 2, \"qkv_bias\": 1}",
                   "qkv_bias: expected true or false");
    expect_refused("{\"type\": \"rmsnorm\", \"eps\": -1}", "eps: expected a number");
    expect_refused("{\"type\": \"rmsnorm\", \"bias\": true}", "bias: unknown field");
    expect_refused("{\"type\": \"swiglu\"}", "hidden: missing");
    expect_refused("{\"type\": \"swiglu\", \"hidden\": 0}", "hidden: expected a positive integer");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rmsnorm_swiglu_f64),
        cmocka_unit_test(rmsnorm_swiglu_f32),
        cmocka_unit_test(attention_matches_reference),
        cmocka_unit_test(bad_fields_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
