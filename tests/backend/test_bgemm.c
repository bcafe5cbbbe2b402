/* The bf16 GEMM (kern_bgemm.c), every path this CPU runs: against f64 sums
 * of the bf16-rounded inputs' products (exact products, so only the order
 * of the f32 sums is left: a tight bound), against f32 on the unrounded
 * inputs (bf16's 8 bits: a loose one), and the paths against each other;
 * its rounding bit for bit against core/quant.h's; and the whole slot
 * through a device and the tensor layer with the device set to bf16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/quant.h"
#include "support/support.h"
#include "tensor/ops.h"

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

/* The slot through a device: threads split the product, the tensor layer
 * picks gemm_bf16 once the device is set to bf16, and an f64 product on the
 * same device stays f64. */
typedef struct dev_case {
    float *y_bf16, *y_f32;
    double y_f64;
} dev_case;

static td_status dev_task(td_device *dev, void *arg) {
    dev_case *dc = arg;
    enum { M = 96, N = 160, K = 300 };
    int64_t sa[2] = {M, K}, sb[2] = {N, K}, sc[2] = {M, N}, one[2] = {1, 1};
    td_tensor *a = NULL, *b = NULL, *c = NULL, *a64 = NULL, *c64 = NULL;
    uint32_t seed = 5;
    float *ha = malloc(sizeof(float) * M * K), *hb = malloc(sizeof(float) * N * K);
    double one64 = 1.0 / 3.0;
    for (int i = 0; i < M * K; i++)
        ha[i] = frand(&seed);
    for (int i = 0; i < N * K; i++)
        hb[i] = frand(&seed);
    TD_ASSERT_OK(td_tensor_create(dev, TD_F32, 2, sa, &a));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F32, 2, sb, &b));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F32, 2, sc, &c));
    TD_ASSERT_OK(td_tensor_write(a, ha, sizeof(float) * M * K));
    TD_ASSERT_OK(td_tensor_write(b, hb, sizeof(float) * N * K));
    TD_ASSERT_OK(td__op_matmul(c, a, 0, b, 1, 1.0, 0.0));
    TD_ASSERT_OK(td_tensor_read(c, dc->y_bf16, sizeof(float) * M * N));
    /* reference: the emulated path on this thread */
    assert_true(td__cpu_bgemm_serial(0, 0, 1, M, N, K, 1.0f, ha, K, hb, K, 0.0f, dc->y_f32, N));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 2, one, &a64));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 2, one, &c64));
    TD_ASSERT_OK(td_tensor_write(a64, &one64, sizeof one64));
    TD_ASSERT_OK(td__op_matmul(c64, a64, 0, a64, 0, 1.0, 0.0));
    TD_ASSERT_OK(td_tensor_read(c64, &dc->y_f64, sizeof dc->y_f64));
    td_tensor_destroy(a), td_tensor_destroy(b), td_tensor_destroy(c);
    td_tensor_destroy(a64), td_tensor_destroy(c64);
    free(ha), free(hb);
    return TD_OK;
}

static void device_in_bf16_uses_the_slot(void **state) {
    (void)state;
    td_device_list *list = NULL;
    td_device *dev;
    dev_case dc;
    TD_ASSERT_OK(td_devices_open("cpu", &list));
    dev = td_device_list_get(list, 0);
    assert_true(td_device_caps(dev) & TD_DEVICE_CAP_BF16);
    assert_int_equal(td_device_precision(dev), TD_PRECISION_F32);
    TD_ASSERT_OK(td_device_set_precision(dev, TD_PRECISION_BF16));
    assert_int_equal(td_device_precision(dev), TD_PRECISION_BF16);
    assert_true(strlen(td_device_bf16_path(dev)) > 0);
    dc.y_bf16 = malloc(sizeof(float) * 96 * 160);
    dc.y_f32 = malloc(sizeof(float) * 96 * 160);
    TD_ASSERT_OK(td_device_run(dev, dev_task, &dc));
    for (int i = 0; i < 96 * 160; i++)
        assert_true(fabsf(dc.y_bf16[i] - dc.y_f32[i]) <= 1e-4f * (1.0f + fabsf(dc.y_f32[i])));
    /* f64 is untouched: 1/3 squared to f64's precision, not bf16's */
    assert_true(fabs(dc.y_f64 - 1.0 / 9.0) < 1e-15);
    assert_int_equal(td_device_set_precision(dev, (td_precision)7), TD_ERR_INVALID_ARG);
    print_message("cpu in bf16 (%s): the tensor layer's matmul agrees with the serial kernel\n",
                  td_device_bf16_path(dev));
    free(dc.y_bf16), free(dc.y_f32);
    td_device_list_destroy(list);
}

/* The kernels with products inside them follow the device: a convolution
 * against f64 sums of its bf16-rounded inputs (and against the unrounded
 * ones once the device is f32 again), a batched GEMM likewise, and fused
 * attention near its f32 self but not equal to it. */
typedef struct inner_case {
    int bf16;
    float x[2 * 3 * 9 * 9], w[5 * 3 * 3 * 3], bias[5], y[2 * 5 * 9 * 9];
    float ba[3 * 6 * 20], bb[3 * 20 * 7], bc[3 * 6 * 7];
    float qkv[2 * 16 * 24], att[2][2 * 16 * 8];
} inner_case;

/* A tensor of shape (dims[0], ...) on dev, written from host when not NULL. */
static td_tensor *tensor_of(td_device *dev, int ndim, const int64_t *dims, const float *host) {
    td_tensor *t = NULL;
    TD_ASSERT_OK(td_tensor_create(dev, TD_F32, ndim, dims, &t));
    if (host)
        TD_ASSERT_OK(td_tensor_write(t, host, td_tensor_nbytes(t)));
    return t;
}

#define FLAT(n)                                                                                    \
    1, (const int64_t[]) {                                                                         \
        n                                                                                          \
    }

static td_status inner_task(td_device *dev, void *arg) {
    inner_case *ic = arg;
    td_conv_desc d = {.n = 2,
                      .c = 3,
                      .h = 9,
                      .w = 9,
                      .oc = 5,
                      .oh = 9,
                      .ow = 9,
                      .kh = 3,
                      .kw = 3,
                      .stride = 1,
                      .pad = 1};
    td_tensor *x = tensor_of(dev, FLAT(2 * 3 * 81), ic->x), *w = tensor_of(dev, FLAT(135), ic->w);
    td_tensor *bias = tensor_of(dev, FLAT(5), ic->bias);
    td_tensor *y = tensor_of(dev, FLAT(2 * 5 * 81), NULL);
    td_tensor *a = tensor_of(dev, FLAT(360), ic->ba), *b = tensor_of(dev, FLAT(420), ic->bb);
    td_tensor *c = tensor_of(dev, FLAT(126), NULL);
    td_tensor *qkv = tensor_of(dev, 3, (const int64_t[]){2, 16, 24}, ic->qkv);
    td_tensor *p = tensor_of(dev, 4, (const int64_t[]){2, 2, 16, 16}, NULL);
    td_tensor *att = tensor_of(dev, 3, (const int64_t[]){2, 16, 8}, NULL);
    td_gemm_operand oa = {a, 0, 20, 120}, ob = {b, 0, 7, 140}, oc = {c, 0, 7, 42};
    TD_ASSERT_OK(td__op_conv2d_fwd(&d, x, w, bias, y));
    TD_ASSERT_OK(td_tensor_read(y, ic->y, sizeof ic->y));
    TD_ASSERT_OK(td__op_gemm_batched(0, 0, 6, 7, 20, 1.0, oa, ob, 0.0, oc, 3));
    TD_ASSERT_OK(td_tensor_read(c, ic->bc, sizeof ic->bc));
    if (td__op_has_attention(dev)) {
        TD_ASSERT_OK(td__op_attention_fwd(2, 0.25, qkv, p, att));
        TD_ASSERT_OK(td_tensor_read(att, ic->att[ic->bf16], sizeof ic->att[0]));
    }
    td_tensor_destroy(x), td_tensor_destroy(w), td_tensor_destroy(bias), td_tensor_destroy(y);
    td_tensor_destroy(a), td_tensor_destroy(b), td_tensor_destroy(c);
    td_tensor_destroy(qkv), td_tensor_destroy(p), td_tensor_destroy(att);
    return TD_OK;
}

/* in: 1 rounds to bf16 first */
static double in(float v, int round) {
    return round ? bf(v) : (double)v;
}

static void check_inner(const inner_case *ic) {
    int r = ic->bf16;
    for (int n = 0; n < 2; n++)
        for (int o = 0; o < 5; o++)
            for (int i = 0; i < 9; i++)
                for (int j = 0; j < 9; j++) {
                    double ref = ic->bias[o], mag = fabs(ic->bias[o]);
                    for (int ch = 0; ch < 3; ch++)
                        for (int u = 0; u < 3; u++)
                            for (int v = 0; v < 3; v++) {
                                int yi = i + u - 1, xj = j + v - 1;
                                double prod;
                                if (yi < 0 || yi >= 9 || xj < 0 || xj >= 9)
                                    continue;
                                prod = in(ic->x[((n * 3 + ch) * 9 + yi) * 9 + xj], r) *
                                       in(ic->w[((o * 3 + ch) * 3 + u) * 3 + v], r);
                                ref += prod;
                                mag += fabs(prod);
                            }
                    double got = ic->y[((n * 5 + o) * 9 + i) * 9 + j];
                    if (!(fabs(got - ref) <= 4e-6 * mag))
                        fail_msg("conv2d in %s: y = %.9g, f64 says %.9g", r ? "bf16" : "f32", got,
                                 ref);
                }
    for (int q = 0; q < 3; q++)
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 7; j++) {
                double ref = 0, mag = 0;
                for (int k = 0; k < 20; k++) {
                    double prod =
                        in(ic->ba[q * 120 + i * 20 + k], r) * in(ic->bb[q * 140 + k * 7 + j], r);
                    ref += prod;
                    mag += fabs(prod);
                }
                if (!(fabs(ic->bc[q * 42 + i * 7 + j] - ref) <= 4e-6 * mag))
                    fail_msg("gemm_batched in %s: c = %.9g, f64 says %.9g", r ? "bf16" : "f32",
                             (double)ic->bc[q * 42 + i * 7 + j], ref);
            }
}

static void kernels_with_products_inside_follow_the_device(void **state) {
    (void)state;
    static inner_case ic;
    td_device_list *list = NULL;
    td_device *dev;
    uint32_t seed = 9;
    int differ = 0;
    float *all[] = {ic.x, ic.w, ic.bias, ic.ba, ic.bb, ic.qkv};
    size_t lens[] = {sizeof ic.x,  sizeof ic.w,  sizeof ic.bias,
                     sizeof ic.ba, sizeof ic.bb, sizeof ic.qkv};
    for (size_t v = 0; v < sizeof all / sizeof *all; v++)
        for (size_t i = 0; i < lens[v] / sizeof(float); i++)
            all[v][i] = frand(&seed);
    TD_ASSERT_OK(td_devices_open("cpu", &list));
    dev = td_device_list_get(list, 0);
    for (int r = 1; r >= 0; r--) {
        ic.bf16 = r;
        TD_ASSERT_OK(td_device_set_precision(dev, r ? TD_PRECISION_BF16 : TD_PRECISION_F32));
        TD_ASSERT_OK(td_device_run(dev, inner_task, &ic));
        check_inner(&ic);
    }
    for (int i = 0; i < 2 * 16 * 8; i++) {
        assert_true(fabsf(ic.att[1][i] - ic.att[0][i]) <= 0.02f);
        differ += ic.att[1][i] != ic.att[0][i];
    }
    assert_true(differ > 0);
    print_message("conv2d and gemm_batched agree with f64 in bf16 and in f32; fused attention in "
                  "bf16 differs from f32 in %d of 256 outputs, by at most 0.02\n",
                  differ);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rounding_matches_core_bit_for_bit),
        cmocka_unit_test(products_match_f64_on_every_path),
        cmocka_unit_test(device_in_bf16_uses_the_slot),
        cmocka_unit_test(kernels_with_products_inside_follow_the_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
