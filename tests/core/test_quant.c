/* bf16, f16 and q8_0 conversions (core/quant.h) against references that
 * share none of their code: bf16 and f16 rounding bit by bit against a
 * nearest-value search in f64 (ties to the even pattern, overflow past the
 * largest finite value plus half a step), over a sweep of f32 bit patterns
 * and the cases that matter (ties, NaN, inf, subnormals); q8_0 against the
 * fixture the `gguf` package's own code wrote (scripts/make_q8_0_fixture). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/quant.h"
#include "support/support.h"

#define FIXTURE TD_SOURCE_DIR "/tests/fixtures/q8_0"

static float from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The value of a bf16 pattern (positive, finite or inf) in f64, computed from
 * its fields; inf stands for 2^128, where IEEE's rounding overflows. */
static double bf16_value(uint32_t h) {
    int e = (int)((h >> 7) & 0xff);
    int m = (int)(h & 0x7f);
    if (e == 0xff)
        return ldexp(1.0, 128);
    return e ? ldexp(1.0 + m / 128.0, e - 127) : ldexp(m / 128.0, -126);
}

/* Nearest bf16 to x (not NaN) by comparing the two neighbours in f64. */
static uint16_t bf16_reference(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    uint32_t sign = u & 0x80000000u, lo = (u & 0x7fffffffu) >> 16, hi = lo + 1;
    double a = fabs((double)x), dl = a - bf16_value(lo), dh = bf16_value(hi) - a;
    uint32_t pick;
    if ((u & 0x7fffffffu) == 0x7f800000u)
        pick = lo; /* inf stays inf */
    else if (dl < dh || (dl == dh && !(lo & 1)))
        pick = lo;
    else
        pick = hi;
    return (uint16_t)((sign >> 16) | pick);
}

static void check_bf16(uint32_t u) {
    float x = from_bits(u);
    uint16_t got = td__f32_to_bf16(x);
    if (isnan(x)) {
        /* NaN stays NaN with its sign */
        if ((got & 0x7f80u) != 0x7f80u || !(got & 0x7fu) ||
            (got & 0x8000u) != ((u >> 16) & 0x8000u))
            fail_msg("bf16(NaN 0x%08x) = 0x%04x", u, got);
        return;
    }
    if (got != bf16_reference(x))
        fail_msg("bf16(0x%08x = %g) = 0x%04x, nearest even is 0x%04x", u, (double)x, got,
                 bf16_reference(x));
    /* and back exactly */
    if (isfinite(td__bf16_to_f32(got)) &&
        fabs((double)td__bf16_to_f32(got)) != (got & 0x7fff ? bf16_value(got & 0x7fffu) : 0.0))
        fail_msg("bf16 0x%04x reads back wrong", got);
}

static void bf16_rounds_to_nearest_even_bit_by_bit(void **state) {
    (void)state;
    static const uint32_t cases[] = {
        0x00000000u, 0x80000000u, /* signed zeros */
        0x3f808000u, 0x3f818000u,
        0x3f80c000u, 0x3f807fffu, /* ties to even (both ways), above, below */
        0x00008000u, 0x00018000u,
        0x00000001u, 0x007fffffu, /* subnormal ties, the smallest, the largest */
        0x7f7f7fffu, 0x7f7f8000u,
        0x7f7fffffu, 0xff7f8000u, /* below the overflow tie, at it, past it */
        0x7f800000u, 0xff800000u, /* infinities */
        0x7fc00000u, 0xffc00001u,
        0x7f800001u, 0x7fff0000u, /* NaNs, a signalling one among them */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_bf16(cases[i]);
    assert_int_equal(td__f32_to_bf16(from_bits(0x3f808000u)), 0x3f80); /* tie, even below */
    assert_int_equal(td__f32_to_bf16(from_bits(0x3f818000u)), 0x3f82); /* tie, even above */
    assert_int_equal(td__f32_to_bf16(from_bits(0x7f7f8000u)), 0x7f80); /* overflow to inf */
    assert_int_equal(td__f32_to_bf16(from_bits(0x00008000u)), 0x0000); /* subnormal tie to 0 */
    /* a sweep: every 4093rd pattern, both signs, NaNs included */
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4093)
        check_bf16((uint32_t)u);
}

/* The f16 values, from their fields, sorted (the positive finite ones). */
static double f16_value(uint32_t h) {
    int e = (int)((h >> 10) & 0x1f), m = (int)(h & 0x3ff);
    return e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m / 1024.0, -14);
}

static uint16_t f16_reference(float x) {
    double a = fabs((double)x);
    uint32_t lo = 0, hi = 0x7c00; /* search the largest pattern <= a, inf as 2^16 */
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (f16_value(mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    double vl = f16_value(lo), vh = lo + 1 == 0x7c00 ? 65536.0 : f16_value(lo + 1);
    uint32_t pick = (a - vl < vh - a || (a - vl == vh - a && !(lo & 1))) ? lo : lo + 1;
    if (isinf(x))
        pick = 0x7c00;
    return (uint16_t)(pick | (signbit(x) ? 0x8000u : 0));
}

static void f16_rounds_to_nearest_even_bit_by_bit(void **state) {
    (void)state;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 8191) {
        float x = from_bits((uint32_t)u);
        uint16_t got = td__f32_to_f16(x);
        if (isnan(x)) {
            assert_true((got & 0x7c00u) == 0x7c00u && (got & 0x3ffu));
            continue;
        }
        if (got != f16_reference(x))
            fail_msg("f16(0x%08x = %g) = 0x%04x, nearest even is 0x%04x", (unsigned)u, (double)x,
                     got, f16_reference(x));
    }
    /* every f16 reads back as its value, and converts back to itself */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        assert_true((double)td__f16_to_f32((uint16_t)h) == f16_value(h));
        assert_int_equal(td__f32_to_f16(td__f16_to_f32((uint16_t)(h | 0x8000u))), h | 0x8000u);
    }
    assert_int_equal(td__f32_to_f16(65520.0f), 0x7c00);          /* the overflow tie goes to inf */
    assert_int_equal(td__f32_to_f16(65519.996f), 0x7bff);        /* just below it does not */
    assert_int_equal(td__f32_to_f16(ldexpf(3.0f, -26)), 0x0001); /* 0.75 of the smallest: up */
    assert_int_equal(td__f32_to_f16(ldexpf(1.0f, -25)), 0x0000); /* half of it: to even, 0 */
}

static float *read_floats(const char *path, size_t *n) {
    size_t bytes;
    float *v = (float *)td_test_read_file(path, &bytes);
    assert_non_null(v);
    *n = bytes / sizeof *v;
    return v;
}

static void q8_0_matches_the_gguf_package(void **state) {
    (void)state;
    size_t n, nd, nq;
    float *x = read_floats(FIXTURE "/values.f32", &n);
    float *want = read_floats(FIXTURE "/dequantized.f32", &nd);
    uint8_t *blocks = td_test_read_file(FIXTURE "/blocks.q8_0", &nq);
    size_t nb = n / TD_Q8_0_BLOCK;
    td_block_q8_0 *b = calloc(nb, sizeof *b);
    uint8_t *packed = calloc(nb, TD_Q8_0_BYTES);
    float *y = calloc(n, sizeof *y);
    assert_true(n == 256 && nd == n && nq == nb * TD_Q8_0_BYTES);
    td__quantize_q8_0(x, n, b);
    td__q8_0_pack(b, nb, packed);
    for (size_t i = 0; i < nq; i++)
        if (packed[i] != blocks[i])
            fail_msg("q8_0 byte %zu (block %zu) is 0x%02x; gguf wrote 0x%02x", i, i / TD_Q8_0_BYTES,
                     packed[i], blocks[i]);
    td__q8_0_unpack(blocks, nb, b);
    td__dequantize_q8_0(b, n, y);
    assert_memory_equal(y, want, n * sizeof *y);
    free(x), free(want), free(blocks), free(b), free(packed), free(y);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bf16_rounds_to_nearest_even_bit_by_bit),
        cmocka_unit_test(f16_rounds_to_nearest_even_bit_by_bit),
        cmocka_unit_test(q8_0_matches_the_gguf_package),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
