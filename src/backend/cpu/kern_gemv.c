/* One-row products on a logical CPU device: the gemm slot's entry point. A
 * product with one row of A (batch-1 inference, a KV-cache decoder's step)
 * reads each element of B once, so its floor is B's bytes over the memory
 * bandwidth; a GEMM would first pack B (a second pass over it, and a write).
 * Here B streams once, its rows (or columns) split over the device's cores,
 * and every other product goes on to td__cpu_gemm (kern_gemm.c).
 *
 * The f32 form y = x W^T (W (n, k) row-major: a linear layer's forward, the
 * vocabulary head) runs an AVX-512 kernel with one accumulator per output,
 * so an output's sum does not depend on how the rows were split; the other
 * forms and dtypes go to OpenBLAS's serial gemv on each core's share. */
#include <cblas.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"

/* Below this many multiply-adds the product stays on the calling core. */
#define GEMV_PARALLEL_MIN (32.0 * 1024.0)

/* Rows at least this long are read four side by side (sgemv_rows4). */
#define ROWS_SIDE_BY_SIDE 2048

/* The outputs a part takes at a time: 64 rows of 576 columns are 147 KB. */
#define GEMV_CHUNK 64

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

// clang-format off
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
// clang-format on

/* y[j] = alpha x . w[j] + beta y[j] for rows j in [0, rows) of w (rows, k),
 * row stride ldw; beta 0 leaves y unread. Long rows: four side by side,
 * sharing each load of x. */
static void sgemv_rows4(int64_t rows, int64_t k, float alpha, const float *x, const float *w,
                        int64_t ldw, float beta, float *y) {
    /* w (rows, k), rows ldw apart; x (k) -> y (rows) */
    int64_t kf = k & ~(int64_t)15, j = 0;
    __mmask16 tail = (__mmask16)((1u << (k & 15)) - 1u);
    for (; j + 4 <= rows; j += 4) {
        const float *w0 = w + j * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t p = 0; p < kf; p += 16) {
            __m512 xv = _mm512_loadu_ps(x + p);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + p), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + p), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + p), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + p), xv, a3);
        }
        if (tail) {
            __m512 xv = _mm512_maskz_loadu_ps(tail, x + kf);
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w0 + kf), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w1 + kf), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w2 + kf), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w3 + kf), xv, a3);
        }
        float s[4] = {_mm512_reduce_add_ps(a0), _mm512_reduce_add_ps(a1), _mm512_reduce_add_ps(a2),
                      _mm512_reduce_add_ps(a3)};
        for (int i = 0; i < 4; i++)
            y[j + i] = beta == 0.0f ? alpha * s[i] : alpha * s[i] + beta * y[j + i];
    }
    /* the same sums, one row at a time */
    for (; j < rows; j++) {
        const float *w0 = w + j * ldw;
        __m512 a0 = _mm512_setzero_ps();
        float s;
        for (int64_t p = 0; p < kf; p += 16)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + p), _mm512_loadu_ps(x + p), a0);
        if (tail)
            a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, w0 + kf),
                                 _mm512_maskz_loadu_ps(tail, x + kf), a0);
        s = _mm512_reduce_add_ps(a0);
        y[j] = beta == 0.0f ? alpha * s : alpha * s + beta * y[j];
    }
}

/* The same for short rows (below ROWS_SIDE_BY_SIDE columns), a row at a
 * time in four partial sums: the rows are read in memory order, one
 * stream, which the prefetchers follow far better than four short rows
 * read side by side (a SmolLM's 576 columns streamed 30% faster so on a
 * Zen 4; at 3072 columns four side by side were 14% faster). */
static void sgemv_rows1(int64_t rows, int64_t k, float alpha, const float *x, const float *w,
                        int64_t ldw, float beta, float *y) {
    /* w (rows, k), rows ldw apart; x (k) -> y (rows) */
    int64_t k64 = k & ~(int64_t)63, k16 = k & ~(int64_t)15;
    __mmask16 tail = (__mmask16)((1u << (k & 15)) - 1u);
    for (int64_t j = 0; j < rows; j++) {
        const float *wj = w + j * ldw;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        float s;
        int64_t p = 0;
        for (; p < k64; p += 64) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wj + p), _mm512_loadu_ps(x + p), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(wj + p + 16), _mm512_loadu_ps(x + p + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(wj + p + 32), _mm512_loadu_ps(x + p + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(wj + p + 48), _mm512_loadu_ps(x + p + 48), a3);
        }
        for (; p < k16; p += 16)
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wj + p), _mm512_loadu_ps(x + p), a0);
        if (tail)
            a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, wj + k16),
                                 _mm512_maskz_loadu_ps(tail, x + k16), a1);
        s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
        y[j] = beta == 0.0f ? alpha * s : alpha * s + beta * y[j];
    }
}

static void sgemv_rows512(int64_t rows, int64_t k, float alpha, const float *x, const float *w,
                          int64_t ldw, float beta, float *y) {
    if (k >= ROWS_SIDE_BY_SIDE)
        sgemv_rows4(rows, k, alpha, x, w, ldw, beta, y);
    else
        sgemv_rows1(rows, k, alpha, x, w, ldw, beta, y);
}

// clang-format off
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
// clang-format on

#define HAVE_SGEMV512 1
#else
#define HAVE_SGEMV512 0
#endif

typedef struct gemv_args {
    td_dtype dt;
    int tb;
    int64_t n, k;
    double alpha, beta;
    const char *x; /* (k) contiguous */
    const char *b; /* tb: (n, k), else (k, n); rows ldb apart */
    int64_t ldb;
    char *y; /* (n) contiguous */
    int simd512;
    atomic_llong next; /* the next chunk of outputs a part may take (gemv_part) */
} gemv_args;

/* Outputs [lo, hi) of y = alpha op(B)^T x + beta y on the calling thread. */
static void gemv_range(const gemv_args *g, int64_t lo, int64_t hi) {
    /* x (k), op(b)^T (n, k) -> y[lo:hi] of y (n) */
    size_t es = td_dtype_size(g->dt);
    int64_t cnt = hi - lo;
    if (cnt <= 0)
        return;
    /* BLAS scales y by beta first; 0 * NaN left in a fresh buffer is NaN */
    if (g->beta == 0.0)
        memset(g->y + (size_t)lo * es, 0, (size_t)cnt * es);
    if (g->tb) {
        /* y[lo:hi] = B[lo:hi, :] x: rows of B */
        const char *b = g->b + (size_t)(lo * g->ldb) * es;
#if HAVE_SGEMV512
        if (g->dt == TD_F32 && g->simd512) {
            sgemv_rows512(cnt, g->k, (float)g->alpha, (const float *)g->x, (const float *)b, g->ldb,
                          (float)g->beta, (float *)g->y + lo);
            return;
        }
#endif
        if (g->dt == TD_F32)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)cnt, (blasint)g->k, (float)g->alpha,
                        (const float *)b, (blasint)g->ldb, (const float *)g->x, 1, (float)g->beta,
                        (float *)g->y + lo, 1);
        else
            cblas_dgemv(CblasRowMajor, CblasNoTrans, (blasint)cnt, (blasint)g->k, g->alpha,
                        (const double *)b, (blasint)g->ldb, (const double *)g->x, 1, g->beta,
                        (double *)g->y + lo, 1);
    } else {
        /* y[lo:hi] = B[:, lo:hi]^T x: a column block of B */
        const char *b = g->b + (size_t)lo * es;
        if (g->dt == TD_F32)
            cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)g->k, (blasint)cnt, (float)g->alpha,
                        (const float *)b, (blasint)g->ldb, (const float *)g->x, 1, (float)g->beta,
                        (float *)g->y + lo, 1);
        else
            cblas_dgemv(CblasRowMajor, CblasTrans, (blasint)g->k, (blasint)cnt, g->alpha,
                        (const double *)b, (blasint)g->ldb, (const double *)g->x, 1, g->beta,
                        (double *)g->y + lo, 1);
    }
}

/* The parts take chunks of GEMV_CHUNK outputs in turn until none is left:
 * cores that share memory bandwidth rarely stream at the same speed, and a
 * fixed half each left the faster waiting for the slower (a tenth of a
 * SmolLM's decode step). An output's sum is the same whoever takes it. */
static void gemv_part(void *p, int part, int nparts) {
    gemv_args *g = p;
    int64_t lo;
    (void)part;
    (void)nparts;
    while ((lo = atomic_fetch_add_explicit(&g->next, GEMV_CHUNK, memory_order_relaxed)) < g->n)
        gemv_range(g, lo, lo + GEMV_CHUNK < g->n ? lo + GEMV_CHUNK : g->n);
}

td_status td__cpu_gemm_any(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                           double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                           double beta, void *c, int64_t ldc) {
    /* c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c; rows lda, ldb, ldc apart */
    cpu_device *cd = ctx;
    gemv_args g;
    /* One row of A, read in place: op(A) (1, k) is contiguous unless A is
     * a transposed column with a stride. */
    if (m != 1 || n < 1 || k < 1 || (ta && lda != 1) || n > INT32_MAX || k > INT32_MAX ||
        ldb > INT32_MAX)
        return td__cpu_gemm(ctx, dt, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    g.dt = dt;
    g.tb = tb;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.x = a;
    g.b = b;
    g.ldb = ldb;
    g.y = c;
    g.simd512 = td__cpu_simd() == TD_SIMD_AVX512;
    atomic_init(&g.next, 0);
    if (td__cpu_threads(cd) == 1 || (double)n * (double)k < GEMV_PARALLEL_MIN)
        gemv_range(&g, 0, n);
    else
        td__cpu_parallel(cd, gemv_part, &g);
    return TD_OK;
}
