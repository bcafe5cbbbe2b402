/* GEMM and convolution on a logical CPU device: the serial OpenBLAS called
 * by each of the device's threads on its own block, so a device computes on
 * its own cores only and BLAS never starts threads of its own. */
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"

/* Per-thread scratch ------------------------------------------------------- */

#define SCRATCH_SLOTS 2

typedef struct scratch {
    void *p[SCRATCH_SLOTS];
    size_t n[SCRATCH_SLOTS];
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p) {
    scratch *s = p;
    if (s) {
        for (int i = 0; i < SCRATCH_SLOTS; i++)
            free(s->p[i]);
        free(s);
    }
}

static void scratch_init(void) {
    (void)pthread_key_create(&scratch_key, scratch_free);
}

void *td__cpu_scratch_slot(int slot, size_t n) {
    scratch *s;
    pthread_once(&scratch_once, scratch_init);
    s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->n[slot] < n) {
        void *p = NULL;
        size_t want = (n + 4095) & ~(size_t)4095;
        if (posix_memalign(&p, 64, want) != 0)
            return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->n[slot] = want;
    }
    return s->p[slot];
}

/* GEMM ---------------------------------------------------------------------- */

void td__cpu_gemm_serial(td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                         const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                         void *c, int64_t ldc) {
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        /* BLAS may skip C entirely when k is 0; beta still applies. */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                if (dt == TD_F32) {
                    float *x = (float *)c + i * ldc + j;
                    *x = beta == 0 ? 0.0f : (float)beta * *x;
                } else {
                    double *x = (double *)c + i * ldc + j;
                    *x = beta == 0 ? 0.0 : beta * *x;
                }
            }
        return;
    }
    /* OpenBLAS is held to its AVX2 kernels (OPENBLAS_CORETYPE=Haswell); on
     * AVX-512 CPUs tandem's own kernel is faster for all but tiny products. */
    if (dt == TD_F32 && m >= 32 && n >= 16 && k >= 16 && td__cpu_simd() == TD_SIMD_AVX512 &&
        td__cpu_sgemm512(ta, tb, m, n, k, (float)alpha, a, lda, b, ldb, (float)beta, c, ldc))
        return;
    if (dt == TD_F32)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)m, (blasint)n, (blasint)k, (float)alpha, a, (blasint)lda, b,
                    (blasint)ldb, (float)beta, c, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb,
                    beta, c, (blasint)ldc);
}

typedef struct gemm_args {
    td_dtype dt;
    int ta, tb;
    int64_t m, n, k;
    double alpha, beta;
    const char *a, *b;
    char *c;
    int64_t lda, ldb, ldc;
    int64_t sa, sb, sc; /* batch strides in elements */
    int64_t batch;
    int split_n; /* split columns of C rather than rows */
} gemm_args;

/* Blocks are multiples of this many rows or columns, to keep BLAS's kernels
 * on full panels. */
#define GEMM_ALIGN 16

static void gemm_part(void *p, int part, int nparts) {
    gemm_args *g = p;
    size_t es = td_dtype_size(g->dt);
    int64_t total = g->split_n ? g->n : g->m;
    int64_t blocks = (total + GEMM_ALIGN - 1) / GEMM_ALIGN;
    size_t bb, be;
    int64_t lo, hi;
    td__part_range((size_t)blocks, part, nparts, &bb, &be);
    lo = (int64_t)bb * GEMM_ALIGN;
    hi = (int64_t)be * GEMM_ALIGN;
    if (hi > total)
        hi = total;
    if (lo >= hi)
        return;
    if (g->split_n) {
        /* C[:, lo:hi] = op(A) op(B)[:, lo:hi] */
        const char *b = g->b + (size_t)(g->tb ? lo * g->ldb : lo) * es;
        td__cpu_gemm_serial(g->dt, g->ta, g->tb, g->m, hi - lo, g->k, g->alpha, g->a, g->lda, b,
                            g->ldb, g->beta, g->c + (size_t)lo * es, g->ldc);
    } else {
        const char *a = g->a + (size_t)(g->ta ? lo : lo * g->lda) * es;
        td__cpu_gemm_serial(g->dt, g->ta, g->tb, hi - lo, g->n, g->k, g->alpha, a, g->lda, g->b,
                            g->ldb, g->beta, g->c + (size_t)(lo * g->ldc) * es, g->ldc);
    }
}

/* Below this many multiply-adds a GEMM stays on one core: waking helpers
 * costs more than it saves. */
#define GEMM_PARALLEL_MIN (64.0 * 64.0 * 64.0)

td_status td__cpu_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
    cpu_device *cd = ctx;
    gemm_args g = {dt, ta, tb, m, n, k, alpha, beta, a, b, c, lda, ldb, ldc, 0, 0, 0, 1, 0};
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return td__error(TD_ERR_UNSUPPORTED, "gemm: %lld x %lld x %lld exceeds BLAS's int range",
                         (long long)m, (long long)n, (long long)k);
    if (td__cpu_threads(cd) == 1 || (double)m * (double)n * (double)k < GEMM_PARALLEL_MIN) {
        td__cpu_gemm_serial(dt, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return TD_OK;
    }
    g.split_n = n > m;
    td__cpu_parallel(cd, gemm_part, &g);
    return TD_OK;
}

static void gemm_batched_part(void *p, int part, int nparts) {
    gemm_args *g = p;
    size_t es = td_dtype_size(g->dt), b0, b1;
    td__part_range((size_t)g->batch, part, nparts, &b0, &b1);
    for (size_t i = b0; i < b1; i++)
        td__cpu_gemm_serial(g->dt, g->ta, g->tb, g->m, g->n, g->k, g->alpha,
                            g->a + i * (size_t)g->sa * es, g->lda, g->b + i * (size_t)g->sb * es,
                            g->ldb, g->beta, g->c + i * (size_t)g->sc * es, g->ldc);
}

td_status td__cpu_gemm_batched(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                               int64_t k, double alpha, const void *a, int64_t lda,
                               int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                               double beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch) {
    cpu_device *cd = ctx;
    gemm_args g = {dt, ta,  tb,  m,   n,        k,        alpha,    beta,  a, b,
                   c,  lda, ldb, ldc, stride_a, stride_b, stride_c, batch, 0};
    int threads = td__cpu_threads(cd);
    if (batch <= 0)
        return TD_OK;
    if (batch < threads) {
        /* Few big matrices: parallelise inside each. */
        size_t es = td_dtype_size(dt);
        for (int64_t i = 0; i < batch; i++) {
            td_status st = td__cpu_gemm(ctx, dt, ta, tb, m, n, k, alpha,
                                        (const char *)a + (size_t)(i * stride_a) * es, lda,
                                        (const char *)b + (size_t)(i * stride_b) * es, ldb, beta,
                                        (char *)c + (size_t)(i * stride_c) * es, ldc);
            if (st != TD_OK)
                return st;
        }
        return TD_OK;
    }
    td__cpu_parallel(cd, gemm_batched_part, &g);
    return TD_OK;
}

/* Convolution through im2col ------------------------------------------------ */

/* The output columns [*lo, *hi) whose input column oj*stride - pad + kj lies
 * inside [0, w). */
static void valid_cols(const td_conv_desc *d, int64_t kj, int64_t *lo, int64_t *hi) {
    int64_t off = kj - d->pad; /* input column of output column 0 */
    int64_t a = off >= 0 ? 0 : (-off + d->stride - 1) / d->stride;
    int64_t b = d->w - 1 - off >= 0 ? (d->w - 1 - off) / d->stride + 1 : 0;
    *lo = a < d->ow ? a : d->ow;
    *hi = b < d->ow ? b : d->ow;
    if (*hi < *lo)
        *hi = *lo;
}

/* col (c*kh*kw, oh*ow) from one image x (c, h, w); the valid stretch of each
 * row is one copy when the stride is 1. */
#define DEFINE_IM2COL(T, sfx)                                                                      \
    static void im2col_##sfx(const td_conv_desc *d, const T *x, T *col) {                          \
        int64_t ohw = d->oh * d->ow;                                                               \
        for (int64_t ci = 0; ci < d->c; ci++)                                                      \
            for (int64_t ki = 0; ki < d->kh; ki++)                                                 \
                for (int64_t kj = 0; kj < d->kw; kj++) {                                           \
                    T *row = col + ((ci * d->kh + ki) * d->kw + kj) * ohw;                         \
                    const T *plane = x + ci * d->h * d->w;                                         \
                    int64_t lo, hi;                                                                \
                    valid_cols(d, kj, &lo, &hi);                                                   \
                    for (int64_t oi = 0; oi < d->oh; oi++) {                                       \
                        int64_t ii = oi * d->stride - d->pad + ki;                                 \
                        T *restrict out = row + oi * d->ow;                                        \
                        const T *restrict in = plane + ii * d->w;                                  \
                        if (ii < 0 || ii >= d->h) {                                                \
                            memset(out, 0, sizeof(T) * (size_t)d->ow);                             \
                            continue;                                                              \
                        }                                                                          \
                        for (int64_t oj = 0; oj < lo; oj++)                                        \
                            out[oj] = 0;                                                           \
                        /* plain loops: rows are short, a memcpy call costs more */                \
                        if (d->stride == 1)                                                        \
                            for (int64_t oj = lo; oj < hi; oj++)                                   \
                                out[oj] = in[oj + (kj - d->pad)];                                  \
                        else                                                                       \
                            for (int64_t oj = lo; oj < hi; oj++)                                   \
                                out[oj] = in[oj * d->stride + kj - d->pad];                        \
                        for (int64_t oj = hi; oj < d->ow; oj++)                                    \
                            out[oj] = 0;                                                           \
                    }                                                                              \
                }                                                                                  \
    }                                                                                              \
    /* dx (c, h, w) = the sum of col's entries back at their pixels (overwritten). */              \
    static void col2im_##sfx(const td_conv_desc *d, const T *col, T *x) {                          \
        int64_t ohw = d->oh * d->ow;                                                               \
        memset(x, 0, sizeof(T) * (size_t)(d->c * d->h * d->w));                                    \
        for (int64_t ci = 0; ci < d->c; ci++)                                                      \
            for (int64_t ki = 0; ki < d->kh; ki++)                                                 \
                for (int64_t kj = 0; kj < d->kw; kj++) {                                           \
                    const T *row = col + ((ci * d->kh + ki) * d->kw + kj) * ohw;                   \
                    T *plane = x + ci * d->h * d->w;                                               \
                    int64_t lo, hi;                                                                \
                    valid_cols(d, kj, &lo, &hi);                                                   \
                    for (int64_t oi = 0; oi < d->oh; oi++) {                                       \
                        int64_t ii = oi * d->stride - d->pad + ki;                                 \
                        const T *in = row + oi * d->ow;                                            \
                        T *out = plane + ii * d->w;                                                \
                        if (ii < 0 || ii >= d->h)                                                  \
                            continue;                                                              \
                        if (d->stride == 1)                                                        \
                            for (int64_t oj = lo; oj < hi; oj++)                                   \
                                out[oj + kj - d->pad] += in[oj];                                   \
                        else                                                                       \
                            for (int64_t oj = lo; oj < hi; oj++)                                   \
                                out[oj * d->stride + kj - d->pad] += in[oj];                       \
                    }                                                                              \
                }                                                                                  \
    }

DEFINE_IM2COL(float, f32)
DEFINE_IM2COL(double, f64)

typedef struct conv_args {
    td_dtype dt;
    const td_conv_desc *d;
    const char *x, *w, *bias, *dy;
    char *y, *dx;
    void *partial[TD_CPU_MAX_PUS]; /* per part: (oc, ckk) dw then (oc) db */
    int failed;
} conv_args;

static int conv_is_identity(const td_conv_desc *d) {
    return d->kh == 1 && d->kw == 1 && d->stride == 1 && d->pad == 0;
}

static void conv_fwd_part(void *p, int part, int nparts) {
    conv_args *a = p;
    const td_conv_desc *d = a->d;
    size_t es = td_dtype_size(a->dt), n0, n1;
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow;
    void *col = NULL;
    td__part_range((size_t)d->n, part, nparts, &n0, &n1);
    if (n0 >= n1)
        return;
    if (!conv_is_identity(d) && !(col = td__cpu_scratch((size_t)(ckk * ohw) * es))) {
        a->failed = 1;
        return;
    }
    for (size_t i = n0; i < n1; i++) {
        const char *xi = a->x + i * (size_t)(d->c * d->h * d->w) * es;
        char *yi = a->y + i * (size_t)(d->oc * ohw) * es;
        const void *src = xi;
        if (col) {
            if (a->dt == TD_F32)
                im2col_f32(d, (const float *)xi, col);
            else
                im2col_f64(d, (const double *)xi, col);
            src = col;
        }
        /* y_i (oc, ohw) = w (oc, ckk) col (ckk, ohw) + bias */
        if (a->bias) {
            for (int64_t o = 0; o < d->oc; o++)
                for (int64_t j = 0; j < ohw; j++) {
                    if (a->dt == TD_F32)
                        ((float *)yi)[o * ohw + j] = ((const float *)a->bias)[o];
                    else
                        ((double *)yi)[o * ohw + j] = ((const double *)a->bias)[o];
                }
        }
        td__cpu_gemm_serial(a->dt, 0, 0, d->oc, ohw, ckk, 1.0, a->w, ckk, src, ohw,
                            a->bias ? 1.0 : 0.0, yi, ohw);
    }
}

td_status td__cpu_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *bias, void *y) {
    conv_args a;
    memset(&a, 0, sizeof a);
    a.dt = dt;
    a.d = d;
    a.x = x;
    a.w = w;
    a.bias = bias;
    a.y = y;
    td__cpu_parallel(ctx, conv_fwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "conv2d: no memory for the im2col buffer");
    return TD_OK;
}

static void conv_bwd_part(void *p, int part, int nparts) {
    conv_args *a = p;
    const td_conv_desc *d = a->d;
    size_t es = td_dtype_size(a->dt), n0, n1;
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow;
    int identity = conv_is_identity(d);
    size_t colsz = identity ? 0 : (size_t)(ckk * ohw) * es;
    size_t dcolsz = a->dx && !identity ? colsz : 0;
    size_t dwsz = (size_t)(d->oc * ckk + d->oc) * es;
    char *buf, *col, *dcol, *dw;
    td__part_range((size_t)d->n, part, nparts, &n0, &n1);
    a->partial[part] = NULL;
    if (!(buf = td__cpu_scratch(colsz + dcolsz + dwsz))) {
        a->failed = 1;
        return;
    }
    col = buf;
    dcol = buf + colsz;
    dw = buf + colsz + dcolsz;
    memset(dw, 0, dwsz);
    a->partial[part] = dw;
    for (size_t i = n0; i < n1; i++) {
        const char *xi = a->x + i * (size_t)(d->c * d->h * d->w) * es;
        const char *dyi = a->dy + i * (size_t)(d->oc * ohw) * es;
        const void *src = xi;
        if (!identity) {
            if (a->dt == TD_F32)
                im2col_f32(d, (const float *)xi, (float *)col);
            else
                im2col_f64(d, (const double *)xi, (double *)col);
            src = col;
        }
        /* dw (oc, ckk) += dy_i (oc, ohw) col^T (ohw, ckk) */
        td__cpu_gemm_serial(a->dt, 0, 1, d->oc, ckk, ohw, 1.0, dyi, ohw, src, ohw, 1.0, dw, ckk);
        /* db (oc) += the sums of dy_i's planes, eight partial sums per plane
         * so the loop vectorises */
        for (int64_t o = 0; o < d->oc; o++) {
            if (a->dt == TD_F32) {
                const float *pl = (const float *)dyi + o * ohw;
                float psum[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
                int64_t j = 0;
                for (; j + 8 <= ohw; j += 8)
                    for (int q = 0; q < 8; q++)
                        psum[q] += pl[j + q];
                for (; j < ohw; j++)
                    s += pl[j];
                for (int q = 0; q < 8; q++)
                    s += psum[q];
                ((float *)dw)[d->oc * ckk + o] += s;
            } else {
                const double *pl = (const double *)dyi + o * ohw;
                double s = 0;
                for (int64_t j = 0; j < ohw; j++)
                    s += pl[j];
                ((double *)dw)[d->oc * ckk + o] += s;
            }
        }
        if (a->dx) {
            char *dxi = a->dx + i * (size_t)(d->c * d->h * d->w) * es;
            /* dcol (ckk, ohw) = w^T (ckk, oc) dy_i (oc, ohw) */
            td__cpu_gemm_serial(a->dt, 1, 0, ckk, ohw, d->oc, 1.0, a->w, ckk, dyi, ohw, 0.0,
                                identity ? (void *)dxi : (void *)dcol, ohw);
            if (!identity) {
                if (a->dt == TD_F32)
                    col2im_f32(d, (const float *)dcol, (float *)dxi);
                else
                    col2im_f64(d, (const double *)dcol, (double *)dxi);
            }
        }
    }
}

td_status td__cpu_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *dy, void *dx, void *dw, void *db, int acc) {
    conv_args a;
    int nparts = td__cpu_threads(ctx);
    int64_t ckk = d->c * d->kh * d->kw, total = d->oc * ckk + d->oc;
    memset(&a, 0, sizeof a);
    a.dt = dt;
    a.d = d;
    a.x = x;
    a.w = w;
    a.dy = dy;
    a.dx = dx;
    td__cpu_parallel(ctx, conv_bwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "conv2d backward: no memory for its buffers");
    /* Sum the parts' partial gradients in part order, so the result does not
     * depend on timing. */
    for (int64_t j = 0; j < total; j++) {
        double s = 0;
        for (int p = 0; p < nparts; p++) {
            if (!a.partial[p])
                continue;
            s +=
                dt == TD_F32 ? ((const float *)a.partial[p])[j] : ((const double *)a.partial[p])[j];
        }
        if (j < d->oc * ckk) {
            if (dt == TD_F32)
                ((float *)dw)[j] = (float)(acc ? ((float *)dw)[j] + s : s);
            else
                ((double *)dw)[j] = acc ? ((double *)dw)[j] + s : s;
        } else if (db) {
            int64_t o = j - d->oc * ckk;
            if (dt == TD_F32)
                ((float *)db)[o] = (float)(acc ? ((float *)db)[o] + s : s);
            else
                ((double *)db)[o] = acc ? ((double *)db)[o] + s : s;
        }
    }
    return TD_OK;
}
