/* Products with compact weights (the CPU backend's matmul_compact, every
 * path this CPU runs) against f64 sums of the dequantized weights times x
 * rounded as the kernels round it (q8_0 blocks, or bf16): the sums of
 * exact products, so the only difference left is the order of f32 sums. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/quant.h"
#include "support/support.h"

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) / 16777216.0 * 2.0 - 1.0);
}

/* W (rows, cols) in fmt's bytes, and its dequantized values. */
static void *make_weights(td_weights fmt, int64_t rows, int64_t cols, const float *w, float *deq) {
    size_t n = (size_t)(rows * cols);
    if (fmt == TD_WEIGHTS_BF16) {
        uint16_t *h = malloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++) {
            h[i] = td__f32_to_bf16(w[i]);
            deq[i] = td__bf16_to_f32(h[i]);
        }
        return h;
    }
    td_block_q8_0 *b = malloc(n / TD_Q8_0_BLOCK * sizeof *b);
    uint8_t *packed = malloc(n / TD_Q8_0_BLOCK * TD_Q8_0_BYTES);
    td__quantize_q8_0(w, n, b);
    td__dequantize_q8_0(b, n, deq);
    td__q8_0_pack(b, n / TD_Q8_0_BLOCK, packed);
    free(b);
    return packed;
}

/* x as the kernels see it. */
static void round_x(td_weights fmt, int64_t n, const float *x, float *xr) {
    if (fmt == TD_WEIGHTS_BF16) {
        for (int64_t i = 0; i < n; i++)
            xr[i] = td__bf16_to_f32(td__f32_to_bf16(x[i]));
        return;
    }
    td_block_q8_0 *b = malloc((size_t)n / TD_Q8_0_BLOCK * sizeof *b);
    td__quantize_q8_0(x, (size_t)n, b);
    td__dequantize_q8_0(b, (size_t)n, xr);
    free(b);
}

static void check_format(td_weights fmt, int64_t n, int64_t rows, int64_t cols) {
    uint32_t seed = 7;
    size_t nw = (size_t)(rows * cols), nx = (size_t)(n * cols);
    float *w = malloc(nw * sizeof *w), *deq = malloc(nw * sizeof *deq);
    float *x = malloc(nx * sizeof *x), *xr = malloc(nx * sizeof *xr);
    float *y = malloc((size_t)(n * rows) * sizeof *y);
    for (size_t i = 0; i < nw; i++)
        w[i] = frand(&seed) * (i % 7 == 0 ? 3.0f : 0.05f); /* outliers, as trained weights have */
    for (size_t i = 0; i < nx; i++)
        x[i] = frand(&seed);
    void *packed = make_weights(fmt, rows, cols, w, deq);
    for (int64_t i = 0; i < n; i++)
        round_x(fmt, cols, x + i * cols, xr + i * cols);
    for (int p = TD_CPATH_SCALAR; p <= (int)td__cpu_compact_best(fmt); p++) {
        memset(y, 0xff, (size_t)(n * rows) * sizeof *y);
        TD_ASSERT_OK(
            td__cpu_matmul_compact_path((td_compact_path)p, fmt, n, rows, cols, x, packed, y));
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < rows; r++) {
                double ref = 0.0, mag = 0.0;
                for (int64_t c = 0; c < cols; c++) {
                    ref += (double)deq[r * cols + c] * xr[i * cols + c];
                    mag += fabs((double)deq[r * cols + c] * xr[i * cols + c]);
                }
                if (!(fabs(y[i * rows + r] - ref) <= 2e-6 * mag + 1e-30))
                    fail_msg("%s by %s: y[%lld, %lld] = %.9g, f64 says %.9g", td_weights_name(fmt),
                             td__cpu_compact_path_name(fmt, (td_compact_path)p), (long long)i,
                             (long long)r, (double)y[i * rows + r], ref);
            }
        print_message("%s by %s: %lld x %lld, %lld rows of x: agrees with f64\n",
                      td_weights_name(fmt), td__cpu_compact_path_name(fmt, (td_compact_path)p),
                      (long long)rows, (long long)cols, (long long)n);
    }
    free(w), free(deq), free(x), free(xr), free(y), free(packed);
}

static void q8_0_products_match_f64(void **state) {
    (void)state;
    check_format(TD_WEIGHTS_Q8_0, 1, 37, 96);  /* odd rows, an odd count of blocks */
    check_format(TD_WEIGHTS_Q8_0, 3, 64, 768); /* a prefill's rows */
}

static void bf16_products_match_f64(void **state) {
    (void)state;
    check_format(TD_WEIGHTS_BF16, 1, 37, 100); /* a tail after the vectors */
    check_format(TD_WEIGHTS_BF16, 3, 64, 768);
}

static void q8_0_refuses_rows_that_split_a_block(void **state) {
    (void)state;
    float x[40] = {0}, y[1];
    uint8_t w[68] = {0};
    assert_int_equal(
        td__cpu_matmul_compact_path(TD_CPATH_SCALAR, TD_WEIGHTS_Q8_0, 1, 1, 40, x, w, y),
        TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("not whole blocks of 32");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(q8_0_products_match_f64),
        cmocka_unit_test(bf16_products_match_f64),
        cmocka_unit_test(q8_0_refuses_rows_that_split_a_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
