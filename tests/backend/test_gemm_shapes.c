/* The CPU backend's serial GEMM (kern_gemm.c's td__cpu_gemm_serial, and
 * under it kern_sgemm.c's AVX-512 kernel called directly) against a naive
 * triple loop in f64: odd sizes that are not multiples of the vector width
 * or of the kernel's strips (1, 3, 17, 63, 65, 129), every transpose, f32 and
 * f64, alpha and beta, leading dimensions wider than the matrices. Padding
 * past each matrix's columns holds NaN, so a kernel that reads it, or writes
 * C there, fails. Runs on the test's own thread: no device needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "support/support.h"

/* Extra columns past each matrix's own, NaN-filled. */
#define PAD 3

typedef struct mat {
    double *v; /* (rows, ld) */
    int64_t rows, cols, ld;
} mat;

static mat mat_make(int64_t rows, int64_t cols, uint64_t seed) {
    mat m = {NULL, rows, cols, cols + PAD};
    m.v = malloc(sizeof(double) * (size_t)(rows * m.ld + 1));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < m.ld; j++)
            m.v[i * m.ld + j] =
                j < cols ? td_rng_uniform(seed, (uint64_t)(i * m.ld + j)) - 0.5 : NAN;
    return m;
}

/* m's values in dt, as a buffer of the same layout. */
static void *as_dtype(const mat *m, td_dtype dt) {
    size_t n = (size_t)(m->rows * m->ld);
    void *p = malloc(n * td_dtype_size(dt) + 64);
    for (size_t i = 0; i < n; i++) {
        if (dt == TD_F32)
            ((float *)p)[i] = (float)m->v[i];
        else
            ((double *)p)[i] = m->v[i];
    }
    return p;
}

static double get(const void *p, td_dtype dt, size_t i) {
    return dt == TD_F32 ? (double)((const float *)p)[i] : ((const double *)p)[i];
}

typedef enum path { PATH_SERIAL, PATH_OWN } path;

/* Runs one product through `via` and checks every element of C, and that C's
 * padding is untouched. Returns the number of bad elements. */
static int check(path via, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                 double alpha, double beta, uint64_t seed) {
    mat a = mat_make(ta ? k : m, ta ? m : k, seed);
    mat b = mat_make(tb ? n : k, tb ? k : n, seed + 1);
    mat c = mat_make(m, n, seed + 2);
    void *pa = as_dtype(&a, dt), *pb = as_dtype(&b, dt), *pc = as_dtype(&c, dt);
    double tol = dt == TD_F32 ? 2e-6 : 1e-14;
    int bad = 0;
    if (via == PATH_OWN) {
        if (!td__cpu_sgemm512(ta, tb, m, n, k, (float)alpha, pa, a.ld, pb, b.ld, (float)beta, pc,
                              c.ld))
            bad = -1; /* no memory: reported below */
    } else {
        td__cpu_gemm_serial(dt, ta, tb, m, n, k, alpha, pa, a.ld, pb, b.ld, beta, pc, c.ld);
    }
    for (int64_t i = 0; i < m && bad >= 0; i++)
        for (int64_t j = 0; j < c.ld; j++) {
            double got = get(pc, dt, (size_t)(i * c.ld + j)), want, mag = 0, s = 0;
            if (j >= n) {
                if (!isnan(got) && bad++ < 3)
                    fprintf(stderr, "  C[%lld][%lld] (padding) written: %g\n", (long long)i,
                            (long long)j, got);
                continue;
            }
            for (int64_t l = 0; l < k; l++) {
                double x = ta ? a.v[l * a.ld + i] : a.v[i * a.ld + l];
                double y = tb ? b.v[j * b.ld + l] : b.v[l * b.ld + j];
                s += x * y;
                mag += fabs(x * y);
            }
            /* c's input went through dt too */
            want = alpha * s +
                   beta * (dt == TD_F32 ? (double)(float)c.v[i * c.ld + j] : c.v[i * c.ld + j]);
            mag = fabs(alpha) * mag + fabs(beta * c.v[i * c.ld + j]) + 1e-30;
            if (!(fabs(got - want) <= tol * mag * 8 + tol) && bad++ < 3)
                fprintf(stderr, "  C[%lld][%lld] = %.9g, want %.9g\n", (long long)i, (long long)j,
                        got, want);
        }
    if (bad)
        fprintf(stderr, "%s %s %c%c m=%lld n=%lld k=%lld alpha=%g beta=%g: %d bad\n",
                via == PATH_OWN ? "sgemm512" : "gemm_serial", td_dtype_name(dt), ta ? 'T' : 'N',
                tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k, alpha, beta, bad);
    free(a.v);
    free(b.v);
    free(c.v);
    free(pa);
    free(pb);
    free(pc);
    return bad;
}

static const int64_t odd[] = {1, 3, 17, 63, 65, 129};
#define NODD (sizeof odd / sizeof *odd)

/* Every (m, n, k) of the odd sizes, every transpose; beta 0 and 0.5 in turn. */
static int sweep(path via, td_dtype dt) {
    int bad = 0, i = 0;
    for (size_t x = 0; x < NODD; x++)
        for (size_t y = 0; y < NODD; y++)
            for (size_t z = 0; z < NODD; z++)
                for (int t = 0; t < 4; t++, i++)
                    bad += check(via, dt, t & 1, t >> 1, odd[x], odd[y], odd[z], 0.75,
                                 i % 2 ? 0.5 : 0.0, (uint64_t)i * 3) != 0;
    return bad;
}

/* Products past the kernel's blocks (k > 384, n > 384: several B blocks, beta
 * applied once) and the models' own: LeNet's convolutions (6 and 16 rows: the
 * 6- and 8-row strips, B read in place), a GPT weight gradient. */
static const int64_t big[][3] = {{6, 1568, 25},  {6, 25, 1568},  {16, 300, 150}, {16, 150, 200},
                                 {150, 200, 16}, {13, 401, 390}, {5, 777, 385},  {8, 33, 769},
                                 {4, 100, 7},    {10, 84, 64},   {256, 130, 200}};

static int sweep_big(path via, td_dtype dt) {
    int bad = 0;
    for (size_t s = 0; s < sizeof big / sizeof *big; s++)
        for (int t = 0; t < 4; t++)
            bad += check(via, dt, t & 1, t >> 1, big[s][0], big[s][1], big[s][2], -1.25,
                         t % 2 ? 1.0 : 0.0, 1000 + s * 4 + (size_t)t) != 0;
    return bad;
}

static void own_kernel_matches_triple_loop(void **state) {
    (void)state;
    if (td__cpu_simd() != TD_SIMD_AVX512) {
        printf("skipped: this CPU has no AVX-512, so the own kernel never runs\n");
        return;
    }
    assert_int_equal(sweep(PATH_OWN, TD_F32), 0);
    assert_int_equal(sweep_big(PATH_OWN, TD_F32), 0);
}

static void serial_gemm_matches_triple_loop_f32(void **state) {
    (void)state;
    assert_int_equal(sweep(PATH_SERIAL, TD_F32), 0);
    assert_int_equal(sweep_big(PATH_SERIAL, TD_F32), 0);
}

static void serial_gemm_matches_triple_loop_f64(void **state) {
    (void)state;
    assert_int_equal(sweep(PATH_SERIAL, TD_F64), 0);
    assert_int_equal(sweep_big(PATH_SERIAL, TD_F64), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(own_kernel_matches_triple_loop),
        cmocka_unit_test(serial_gemm_matches_triple_loop_f32),
        cmocka_unit_test(serial_gemm_matches_triple_loop_f64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
