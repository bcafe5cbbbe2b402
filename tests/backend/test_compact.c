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

/* One step's attention (attend_step) against f64 on the stored values: h
 * query heads over kv key/value heads, K and V rows inside wider cache rows
 * (ld), in f32, f16 and bf16; d of 64 (the vector path) and 24 (C). */
static void check_attend(int kind, int64_t h, int64_t kv, int64_t d, int64_t len) {
    uint32_t seed = 11;
    int64_t ld = (h + 2 * kv) * d + 3, g = h / kv;
    size_t n = (size_t)(len * ld), es = kind ? 2 : 4;
    float *q = malloc((size_t)(h * d) * sizeof *q), *y = malloc((size_t)(h * d) * sizeof *y);
    float *vals = malloc(n * sizeof *vals);
    unsigned char *cache = malloc(n * es);
    double *s = malloc((size_t)len * sizeof *s);
    for (int64_t i = 0; i < h * d; i++)
        q[i] = frand(&seed);
    for (size_t i = 0; i < n; i++) {
        float v = frand(&seed);
        if (kind == 0)
            ((float *)cache)[i] = vals[i] = v;
        else if (kind == 1)
            vals[i] = td__f16_to_f32(((uint16_t *)cache)[i] = td__f32_to_f16(v));
        else
            vals[i] = td__bf16_to_f32(((uint16_t *)cache)[i] = td__f32_to_bf16(v));
    }
    TD_ASSERT_OK(td__cpu_attend_step(NULL, kind, h, kv, d, len, 0.125f, q, cache + h * d * es,
                                     cache + (h + kv) * d * es, ld, y));
    for (int64_t i = 0; i < h; i++) {
        int64_t kc = h * d + (i / g) * d, vc = (h + kv) * d + (i / g) * d;
        double mx = -1e300, sum = 0;
        for (int64_t t = 0; t < len; t++) {
            s[t] = 0;
            for (int64_t c = 0; c < d; c++)
                s[t] += (double)q[i * d + c] * vals[t * ld + kc + c];
            s[t] *= 0.125;
            mx = fmax(mx, s[t]);
        }
        for (int64_t t = 0; t < len; t++)
            sum += s[t] = exp(s[t] - mx);
        for (int64_t c = 0; c < d; c++) {
            double ref = 0;
            for (int64_t t = 0; t < len; t++)
                ref += s[t] / sum * vals[t * ld + vc + c];
            if (!(fabs(y[i * d + c] - ref) <= 2e-5))
                fail_msg("attend_step kind %d, d %lld: y[%lld, %lld] = %.9g, f64 says %.9g", kind,
                         (long long)d, (long long)i, (long long)c, (double)y[i * d + c], ref);
        }
    }
    print_message("attend_step kind %d: %lld heads over %lld, d %lld, %lld positions: agrees "
                  "with f64\n",
                  kind, (long long)h, (long long)kv, (long long)d, (long long)len);
    free(q), free(y), free(vals), free(cache), free(s);
}

static void attend_step_matches_f64(void **state) {
    (void)state;
    for (int kind = 0; kind <= 2; kind++) {
        check_attend(kind, 4, 2, 64, 37);
        check_attend(kind, 3, 3, 24, 5);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(q8_0_products_match_f64),
        cmocka_unit_test(bf16_products_match_f64),
        cmocka_unit_test(q8_0_refuses_rows_that_split_a_block),
        cmocka_unit_test(attend_step_matches_f64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
