/* Compact weights (bf16, q8_0) on OpenCL (opencl:0.0; PoCL in CI): a GPT's
 * and a Llama's decoders on OpenCL against the same models' on the CPU
 * (cpu:0), prefilled and stepped. The products are the same exact ones on
 * both (x rounded to the weights' kind first); only the order of the f32
 * sums differs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "support/support.h"
#include "tandem/tandem.h"

#ifndef TD_HAVE_OPENCL
int main(void) {
    td_test_skip("no OpenCL device (built without OpenCL)");
}
#else

enum { T = 16, V = 64 };

static const char *gpt_json =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 64, \"positions\": true},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 2}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 128}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": 64}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 64}]}";

static const char *llama_json =
    "{\"input\": {\"tokens\": 16, \"vocab\": 64}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 64, \"positions\": false},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"attention\", \"heads\": 4, \"kv_heads\": 2, \"rope_theta\": 10000, "
    "\"qkv_bias\": false, \"proj_bias\": false}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"rmsnorm\"}, "
    "{\"type\": \"swiglu\", \"hidden\": 96}]},"
    "{\"type\": \"rmsnorm\"}, {\"type\": \"linear\", \"out\": 64, \"bias\": false}]}";

static td_device_list *cpu, *ocl;

static int setup(void **state) {
    (void)state;
    cpu = td_test_open("cpu:0");
    if (td_devices_open("opencl:0.0", &ocl) != TD_OK)
        td_test_skip("no OpenCL device opencl:0.0");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    td_device_list_destroy(ocl);
    td_device_list_destroy(cpu);
    return 0;
}

static void opencl_matches_cpu(const char *json, td_weights w) {
    td_model *m[2] = {NULL, NULL};
    td_decoder *d[2] = {NULL, NULL};
    td_device *dev[2] = {td_device_list_get(cpu, 0), td_device_list_get(ocl, 0)};
    int32_t tokens[T] = {3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 38, 4, 6};
    double logits[2][V], worst = 0, scale = 0;
    for (int k = 0; k < 2; k++) {
        /* one seed gives bitwise the same weights on every device */
        TD_ASSERT_OK(td_model_load_string(json, "test", dev[k], TD_F32, 7, &m[k]));
        TD_ASSERT_OK(td_model_set_weights(m[k], w));
        TD_ASSERT_OK(td_decoder_create(m[k], &d[k]));
    }
    for (int i = 4; i <= T; i++) {
        for (int k = 0; k < 2; k++)
            TD_ASSERT_OK(i == 4 ? td_decoder_prefill(d[k], tokens, 4, logits[k])
                                : td_decoder_step(d[k], tokens[i - 1], logits[k]));
        for (int v = 0; v < V; v++) {
            worst = fmax(worst, fabs(logits[0][v] - logits[1][v]));
            scale = fmax(scale, fabs(logits[0][v]));
        }
    }
    print_message("%s on OpenCL: max |logit - CPU's| %.2e of logits up to %.2f\n",
                  td_weights_name(w), worst, scale);
    assert_true(scale > 0.1 && worst <= 1e-4 * scale);
    for (int k = 0; k < 2; k++) {
        td_decoder_destroy(d[k]);
        td_model_destroy(m[k]);
    }
}

static void gpt_q8_0(void **state) {
    opencl_matches_cpu(gpt_json, TD_WEIGHTS_Q8_0);
}
static void gpt_bf16(void **state) {
    opencl_matches_cpu(gpt_json, TD_WEIGHTS_BF16);
}
static void llama_q8_0(void **state) {
    opencl_matches_cpu(llama_json, TD_WEIGHTS_Q8_0);
}
static void llama_bf16(void **state) {
    opencl_matches_cpu(llama_json, TD_WEIGHTS_BF16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gpt_q8_0),
        cmocka_unit_test(gpt_bf16),
        cmocka_unit_test(llama_q8_0),
        cmocka_unit_test(llama_bf16),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
#endif
