/* The bf16 GEMM (kern_bgemm.c), every path this CPU runs: against f64 sums
 * of the bf16-rounded inputs' products (exact products, so only the order
 * of the f32 sums is left: a tight bound), against f32 on the unrounded
 * inputs (bf16's 8 bits: a loose one), and the paths against each other;
 * and its rounding bit for bit against core/quant.h's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/quant.h"
#include "support/support.h"

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s;
}

static float frand(uint32_t *s) {
    return (float)((lcg(s) >> 8) / 16777216.0 * 2.0 - 1.0);
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static void rounding_matches_core_bit_for_bit(void **state) {
    (void)state;
    /* ties both ways, the largest finite values (one rounds to inf),
     * infinities, NaNs with payloads, subnormals, zeros, then random bits */
    static const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0x7f7fffffu, 0x7f7f7fffu,
        0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffa5a5a5u,
        0x00000001u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x00000000u, 0x80000000u};
    enum { N = 4099 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint32_t seed = 11;
    size_t ns = sizeof special / sizeof *special;
    for (size_t i = 0; i < N; i++)
        x[i] = bits_f32(i < ns ? special[i] : lcg(&seed));
    td__cpu_round_bf16(x, y, N);
    for (size_t i = 0; i < N; i++) {
        uint32_t want = (uint32_t)td__f32_to_bf16(x[i]) << 16;
        if (f32_bits(y[i]) != want)
            fail_msg("x = 0x%08x: rounded to 0x%08x, td__f32_to_bf16 says 0x%08x", f32_bits(x[i]),
                     f32_bits(y[i]), want);
    }
    free(x), free(y);
}

typedef struct shape {
    int ta, tb;
    int64_t m, n, k;
    double alpha, beta;
} shape;

/* op(X) (r, c) stored as X (r, c) or, transposed, (c, r) with rows ld apart. */
static double at(const float *x, int t, int64_t ld, int64_t i, int64_t j) {
    return t ? x[j * ld + i] : x[i * ld + j];
}

static double bf(double v) {
    return td__bf16_to_f32(td__f32_to_bf16((float)v));
}

/* Runs s by `native` and checks it; y gets the result for comparing paths. */
static void check_shape(const shape *s, int native, float *y_out) {
    uint32_t seed = (uint32_t)(s->m * 131 + s->n * 7 + s->k + s->ta * 2 + s->tb);
    int64_t lda = (s->ta ? s->m : s->k) + 3, ldb = (s->tb ? s->k : s->n) + 5, ldc = s->n + 2;
    size_t na = (size_t)((s->ta ? s->k : s->m) * lda), nb = (size_t)((s->tb ? s->n : s->k) * ldb);
    size_t nc = (size_t)(s->m * ldc);
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b), *c = malloc(nc * sizeof *c);
    float *c0 = malloc(nc * sizeof *c0);
    double worst = 0;
    for (size_t i = 0; i < na; i++)
        a[i] = frand(&seed) * (i % 5 == 0 ? 4.0f : 1.0f);
    for (size_t i = 0; i < nb; i++)
        b[i] = frand(&seed) * 0.25f;
    for (size_t i = 0; i < nc; i++)
        c0[i] = frand(&seed);
    memcpy(c, c0, nc * sizeof *c);
    assert_true(td__cpu_bgemm_serial(native, s->ta, s->tb, s->m, s->n, s->k, (float)s->alpha, a,
                                     lda, b, ldb, (float)s->beta, c, ldc));
    for (int64_t i = 0; i < s->m; i++)
        for (int64_t j = 0; j < s->n; j++) {
            double ref = 0, ref32 = 0, mag = 0;
            for (int64_t p = 0; p < s->k; p++) {
                double x = at(a, s->ta, lda, i, p), w = at(b, s->tb, ldb, p, j);
                ref += bf(x) * bf(w);
                ref32 += x * w;
                mag += fabs(x * w);
            }
            mag = fabs(s->alpha) * mag + fabs(s->beta * c0[i * ldc + j]);
            ref = s->alpha * ref + s->beta * c0[i * ldc + j];
            ref32 = s->alpha * ref32 + s->beta * c0[i * ldc + j];
            double got = c[i * ldc + j], err = fabs(got - ref);
            /* f32 sums of exact products: a few ulps of the magnitude */
            if (!(err <= 4e-6 * mag + 1e-30))
                fail_msg("%s, %s%lldx%lld x %s%lldx%lld: c[%lld, %lld] = %.9g, f64 of the bf16 "
                         "inputs says %.9g",
                         td__cpu_bgemm_path_name(native), s->ta ? "T" : "", (long long)s->m,
                         (long long)s->k, s->tb ? "T" : "", (long long)s->k, (long long)s->n,
                         (long long)i, (long long)j, got, ref);
            /* two inputs of 8 significant bits: each product within 2^-8 */
            if (!(fabs(got - ref32) <= 0.0079 * mag + 1e-30))
                fail_msg("c[%lld, %lld] = %.9g is far from f32's %.9g", (long long)i, (long long)j,
                         got, ref32);
            if (mag > 0 && err / mag > worst)
                worst = err / mag;
            if (y_out)
                y_out[i * s->n + j] = (float)got;
        }
    /* columns past n and C's padding untouched */
    for (int64_t i = 0; i < s->m; i++)
        for (int64_t j = s->n; j < ldc; j++)
            assert_true(f32_bits(c[i * ldc + j]) == f32_bits(c0[i * ldc + j]));
    print_message("%-48s op(A) %s%lld x %lld, op(B) %s: worst error %.2g of the magnitude\n",
                  td__cpu_bgemm_path_name(native), s->ta ? "^T " : "", (long long)s->m,
                  (long long)s->k, s->tb ? "^T" : "", worst);
    free(a), free(b), free(c), free(c0);
}

static const shape shapes[] = {
    {0, 1, 64, 256, 784, 1.0, 0.0},  /* a linear layer's forward: x W^T */
    {1, 0, 256, 784, 64, 1.0, 1.0},  /* its weight gradient, accumulated: dY^T x */
    {0, 0, 64, 784, 256, 1.0, 0.0},  /* its input gradient: dY W */
    {1, 1, 13, 45, 77, 0.5, -2.0},   /* odd everything, both transposed */
    {0, 0, 7, 33, 1, 1.0, 0.0},      /* k = 1: one half of one pair */
    {0, 1, 30, 400, 1100, 1.0, 0.5}, /* several blocks of k and of n */
    {1, 0, 25, 17, 531, -1.0, 0.0},  /* an odd k past a block */
};

static void products_match_f64_on_every_path(void **state) {
    (void)state;
    int native = td__cpu_bgemm_native();
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        float *y0 = malloc((size_t)(s->m * s->n) * sizeof *y0);
        float *y1 = malloc((size_t)(s->m * s->n) * sizeof *y1);
        check_shape(s, 0, y0);
        if (native) {
            check_shape(s, 1, y1);
            /* the same products, summed in another order */
            for (int64_t j = 0; j < s->m * s->n; j++)
                assert_true(fabsf(y0[j] - y1[j]) <= 1e-4f * (1.0f + fabsf(y0[j])));
        }
        free(y0), free(y1);
    }
    if (!native)
        print_message("this CPU has no AVX512-BF16 (or TANDEM_SIMD hides it): the emulated path "
                      "alone was checked\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rounding_matches_core_bit_for_bit),
        cmocka_unit_test(products_match_f64_on_every_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
