/* Every layer's backward against central finite differences in f64, and
 * every layer's f32 forward against its f64 forward. Each case is a tiny
 * model around the layer under test: a linear layer before it makes the
 * layer's input gradient show up in that linear layer's weight gradient. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/nn-impl.h"
#include "support/support.h"

typedef struct grad_case {
    const char *name;
    const char *json;
} grad_case;

static const grad_case cases[] = {
    {"linear_relu",
     "{\"input\": {\"shape\": [5]}, \"layers\": [{\"type\": \"linear\", \"out\": 7}, {\"type\": "
     "\"relu\"}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"linear_no_bias_3d",
     "{\"input\": {\"shape\": [3, 5]}, \"layers\": [{\"type\": \"linear\", \"out\": 6, \"bias\": "
     "false}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"gelu",
     "{\"input\": {\"shape\": [5]}, \"layers\": [{\"type\": \"linear\", \"out\": 7}, {\"type\": "
     "\"gelu\"}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"tanh",
     "{\"input\": {\"shape\": [5]}, \"layers\": [{\"type\": \"linear\", \"out\": 7}, {\"type\": "
     "\"tanh\"}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"sigmoid",
     "{\"input\": {\"shape\": [5]}, \"layers\": [{\"type\": \"linear\", \"out\": 7}, {\"type\": "
     "\"sigmoid\"}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"dropout",
     "{\"input\": {\"shape\": [5]}, \"layers\": [{\"type\": \"linear\", \"out\": 16}, {\"type\": "
     "\"dropout\", \"p\": 0.3}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"layernorm",
     "{\"input\": {\"shape\": [3, 6]}, \"layers\": [{\"type\": \"linear\", \"out\": 6}, "
     "{\"type\": \"layernorm\"}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 4}]}"},
    {"conv_pools",
     "{\"input\": {\"shape\": [2, 7, 6]}, \"layers\": [{\"type\": \"conv2d\", \"out\": 3, "
     "\"kernel\": 3, \"padding\": 1}, {\"type\": \"maxpool\", \"kernel\": 2}, {\"type\": "
     "\"conv2d\", \"out\": 4, \"kernel\": 2, \"stride\": 1}, {\"type\": \"avgpool\", \"kernel\": "
     "2, \"stride\": 1, \"padding\": 1}, {\"type\": \"flatten\"}, {\"type\": \"linear\", "
     "\"out\": 3}]}"},
    {"conv_stride",
     "{\"input\": {\"shape\": [3, 8, 8]}, \"layers\": [{\"type\": \"conv2d\", \"out\": 4, "
     "\"kernel\": 3, \"stride\": 2, \"padding\": 1, \"bias\": false}, {\"type\": \"conv2d\", "
     "\"out\": 2, \"kernel\": 1}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 3}]}"},
    {"gpt_block",
     "{\"input\": {\"tokens\": 5, \"vocab\": 7}, \"layers\": [{\"type\": \"embedding\", "
     "\"vocab\": 7, \"dim\": 8}, {\"type\": \"residual\", \"layers\": [{\"type\": "
     "\"layernorm\"}, {\"type\": \"attention\", \"heads\": 2}]}, {\"type\": \"residual\", "
     "\"layers\": [{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 16}, {\"type\": "
     "\"gelu\"}, {\"type\": \"linear\", \"out\": 8}]}, {\"type\": \"layernorm\"}, {\"type\": "
     "\"linear\", \"out\": 7}]}"},
    /* GPT-2's: GELU's tanh approximation, and a head that is the embedding's
     * table, whose gradient is the head's plus the embedding's */
    {"gpt2_tied_gelu_tanh",
     "{\"input\": {\"tokens\": 5, \"vocab\": 7}, \"layers\": [{\"type\": \"embedding\", "
     "\"vocab\": 7, \"dim\": 8}, {\"type\": \"residual\", \"layers\": [{\"type\": "
     "\"layernorm\"}, {\"type\": \"attention\", \"heads\": 2}]}, {\"type\": \"residual\", "
     "\"layers\": [{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 16}, "
     "{\"type\": \"gelu\", \"approximate\": \"tanh\"}, {\"type\": \"linear\", \"out\": 8}]}, "
     "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 7, \"bias\": false, "
     "\"tied\": true}]}"},
    {"rmsnorm", "{\"input\": {\"shape\": [3, 6]}, \"layers\": [{\"type\": \"linear\", \"out\": 6}, "
                "{\"type\": \"rmsnorm\", \"eps\": 1e-5}, {\"type\": \"flatten\"}, {\"type\": "
                "\"linear\", \"out\": 4}]}"},
    {"swiglu_bias",
     "{\"input\": {\"shape\": [3, 5]}, \"layers\": [{\"type\": \"linear\", \"out\": 6}, "
     "{\"type\": \"swiglu\", \"hidden\": 7, \"bias\": true}, {\"type\": \"flatten\"}, "
     "{\"type\": \"linear\", \"out\": 4}]}"},
    {"swiglu", "{\"input\": {\"shape\": [5]}, \"layers\": [{\"type\": \"linear\", \"out\": 6}, "
               "{\"type\": \"swiglu\", \"hidden\": 9}, {\"type\": \"linear\", \"out\": 4}]}"},
    /* Llama's: RMSNorm, grouped-query attention (2 query heads per key and
     * value head) with rotary positions and no biases, a SwiGLU MLP */
    {"llama_block",
     "{\"input\": {\"tokens\": 6, \"vocab\": 7}, \"layers\": [{\"type\": \"embedding\", "
     "\"vocab\": 7, \"dim\": 16, \"positions\": false}, {\"type\": \"residual\", "
     "\"layers\": [{\"type\": \"rmsnorm\"}, {\"type\": \"attention\", \"heads\": 4, "
     "\"kv_heads\": 2, \"rope_theta\": 10000, \"qkv_bias\": false, \"proj_bias\": "
     "false}]}, {\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
     "{\"type\": \"swiglu\", \"hidden\": 24}]}, {\"type\": \"rmsnorm\"}, {\"type\": "
     "\"linear\", \"out\": 7, \"bias\": false}]}"},
    /* Qwen2's q, k, v biases; multi-query (one key and value head); Llama
     * 3's frequency scaling, its three bands all met by a head of 8 */
    {"qwen2_mqa_scaled",
     "{\"input\": {\"tokens\": 5, \"vocab\": 7}, \"layers\": [{\"type\": \"embedding\", "
     "\"vocab\": 7, \"dim\": 24, \"positions\": false}, {\"type\": \"residual\", "
     "\"layers\": [{\"type\": \"rmsnorm\"}, {\"type\": \"attention\", \"heads\": 3, "
     "\"kv_heads\": 1, \"rope_theta\": 500, \"rope_scaling\": {\"type\": \"llama3\", "
     "\"factor\": 4, \"low_freq_factor\": 1, \"high_freq_factor\": 4, "
     "\"original_max_position_embeddings\": 40}, \"proj_bias\": false}]}, {\"type\": "
     "\"rmsnorm\"}, {\"type\": \"linear\", \"out\": 7}]}"},
    /* rotary positions with as many key and value heads as query heads */
    {"rope_mha",
     "{\"input\": {\"tokens\": 5, \"vocab\": 7}, \"layers\": [{\"type\": \"embedding\", "
     "\"vocab\": 7, \"dim\": 8, \"positions\": false}, {\"type\": \"attention\", "
     "\"heads\": 2, \"rope_theta\": 100}, {\"type\": \"linear\", \"out\": 7}]}"},
    {"embedding_no_positions",
     "{\"input\": {\"tokens\": 4, \"vocab\": 6}, \"layers\": [{\"type\": \"embedding\", "
     "\"vocab\": 6, \"dim\": 5, \"positions\": false}, {\"type\": \"tanh\"}, {\"type\": "
     "\"linear\", \"out\": 6}]}"},
};

#define NCASES (sizeof cases / sizeof *cases)
#define BATCH  3

typedef struct data {
    float *x;
    int32_t *tokens, *labels;
    td_batch batch;
} data;

static void make_data(td_model *m, data *d) {
    int64_t shape[TD_MAX_DIMS], per = 1;
    int nd = td_model_input_shape(m, shape);
    int tok = td_model_input_kind(m) == TD_INPUT_TOKENS;
    int64_t classes = td_model_num_classes(m);
    for (int i = 0; i < nd; i++)
        per *= shape[i];
    d->x = malloc(sizeof(float) * (size_t)(BATCH * per));
    d->tokens = malloc(sizeof(int32_t) * (size_t)(BATCH * per));
    d->labels = malloc(sizeof(int32_t) * (size_t)(BATCH * per));
    for (int64_t i = 0; i < BATCH * per; i++) {
        d->x[i] = (float)td_rng_normal(11, (uint64_t)i);
        d->tokens[i] = (int32_t)(td_rng_uniform(12, (uint64_t)i) * (double)classes);
        d->labels[i] = (int32_t)(td_rng_uniform(13, (uint64_t)i) * (double)classes);
    }
    d->batch.n = BATCH;
    d->batch.x = tok ? NULL : d->x;
    d->batch.tokens = tok ? d->tokens : NULL;
    d->batch.labels = d->labels;
}

static void free_data(data *d) {
    free(d->x);
    free(d->tokens);
    free(d->labels);
}

static double loss_at(td_model *m, data *d) {
    td_step_result r;
    /* train mode (dropout on, same stream every call) */
    TD_ASSERT_OK(td_model_train_step(m, &d->batch, 1.0, 0, 5, &r));
    return r.loss_sum;
}

static void check_case(const grad_case *c, td_device *dev) {
    td_model *m = NULL;
    data d;
    double worst = 0;
    TD_ASSERT_OK(td_model_load_string(c->json, c->name, dev, TD_F64, 3, &m));
    make_data(m, &d);
    for (size_t p = 0; p < td_model_param_count(m); p++) {
        td_tensor *w = td_model_param(m, p), *g = td_model_grad(m, p);
        size_t n = td_tensor_numel(w), stride = n > 40 ? n / 40 + 1 : 1;
        double *wv = malloc(sizeof(double) * n), *gv = malloc(sizeof(double) * n);
        double num = 0, den = 0;
        loss_at(m, &d);
        TD_ASSERT_OK(td_tensor_read_f64(g, gv, n));
        TD_ASSERT_OK(td_tensor_read_f64(w, wv, n));
        for (size_t i = 0; i < n; i += stride) {
            double keep = wv[i], h = 1e-5 * fmax(1.0, fabs(keep)), lp, lm, fd;
            wv[i] = keep + h;
            TD_ASSERT_OK(td_tensor_write_f64(w, wv, n));
            lp = loss_at(m, &d);
            wv[i] = keep - h;
            TD_ASSERT_OK(td_tensor_write_f64(w, wv, n));
            lm = loss_at(m, &d);
            wv[i] = keep;
            fd = (lp - lm) / (2 * h);
            num += (fd - gv[i]) * (fd - gv[i]);
            den += fmax(fd * fd, gv[i] * gv[i]);
        }
        TD_ASSERT_OK(td_tensor_write_f64(w, wv, n));
        if (den > 0 && sqrt(num / den) > worst)
            worst = sqrt(num / den);
        if (den == 0)
            fail_msg("%s: %s has an all-zero gradient", c->name, td_model_param_name(m, p));
        if (sqrt(num / den) > 1e-6)
            fail_msg("%s: %s: relative error %.3g against finite differences", c->name,
                     td_model_param_name(m, p), sqrt(num / den));
        free(wv);
        free(gv);
    }
    printf("  %-24s worst relative error %.2g\n", c->name, worst);
    free_data(&d);
    td_model_destroy(m);
}

/* On one core and on every core (the kernels' split and partial sums). */
static void backward_matches_finite_differences(void **state) {
    static const char *const specs[] = {"cpu:0", "cpu"};
    for (int s = 0; s < 2; s++) {
        td_device_list *list = NULL;
        TD_ASSERT_OK(td_devices_open(specs[s], &list));
        printf(" on %s:\n", specs[s]);
        for (size_t i = 0; i < NCASES; i++)
            check_case(&cases[i], td_device_list_get(list, 0));
        /* attention composed of gemm_batched and the causal softmax, as on a
         * backend without the fused kernels */
        td__nn_generic_attention = 1;
        for (size_t i = 0; i < NCASES; i++)
            if (strstr(cases[i].json, "attention"))
                check_case(&cases[i], td_device_list_get(list, 0));
        td__nn_generic_attention = 0;
        td_device_list_destroy(list);
    }
}

/* The logits of the last forward pass, as doubles. CPU memory is host memory. */
static double *read_logits(td_model *m, size_t *n) {
    const td_tensor *out = &m->root->out;
    double *v = malloc(sizeof(double) * out->numel);
    for (size_t i = 0; i < out->numel; i++)
        v[i] =
            out->dtype == TD_F32 ? ((const float *)out->data)[i] : ((const double *)out->data)[i];
    *n = out->numel;
    return v;
}

static void f32_forward_matches_f64(void **state) {
    td_device_list *list = NULL;
    TD_ASSERT_OK(td_devices_open("cpu", &list));
    for (size_t i = 0; i < 2 * NCASES; i++) {
        td_model *m32 = NULL, *m64 = NULL;
        /* the second round: the composed attention in f64 against the fused one in f32 */
        const grad_case *c = &cases[i % NCASES];
        data d;
        td_step_result r32, r64;
        size_t n32, n64;
        double *a, *b, worst = 0, scale = 0;
        if (i >= NCASES && !strstr(c->json, "attention"))
            continue;
        TD_ASSERT_OK(
            td_model_load_string(c->json, c->name, td_device_list_get(list, 0), TD_F32, 9, &m32));
        TD_ASSERT_OK(
            td_model_load_string(c->json, c->name, td_device_list_get(list, 0), TD_F64, 9, &m64));
        make_data(m64, &d);
        TD_ASSERT_OK(td_model_evaluate(m32, &d.batch, &r32));
        td__nn_generic_attention = i >= NCASES;
        TD_ASSERT_OK(td_model_evaluate(m64, &d.batch, &r64));
        td__nn_generic_attention = 0;
        a = read_logits(m32, &n32);
        b = read_logits(m64, &n64);
        assert_int_equal(n32, n64);
        for (size_t k = 0; k < n64; k++)
            scale = fmax(scale, fabs(b[k]));
        /* relative to the largest logit, so values near 0 do not dominate */
        for (size_t k = 0; k < n64; k++)
            worst = fmax(worst, fabs(a[k] - b[k]) / scale);
        if (worst > 1e-4)
            fail_msg("%s: f32 logits differ from f64 by %.3g relative", c->name, worst);
        if (fabs(r32.loss_sum - r64.loss_sum) > 1e-4 * fabs(r64.loss_sum))
            fail_msg("%s: f32 loss %.9g, f64 %.9g", c->name, r32.loss_sum, r64.loss_sum);
        free(a);
        free(b);
        free_data(&d);
        td_model_destroy(m32);
        td_model_destroy(m64);
    }
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(backward_matches_finite_differences),
        cmocka_unit_test(f32_forward_matches_f64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
