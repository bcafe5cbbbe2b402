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

#define SCRATCH_SLOTS 3

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

/* f32 on AVX-512 goes to tandem's own kernel (kern_sgemm.c) except when C
 * has fewer than 16 columns (a classifier's 10 outputs), where the kernel's
 * 32-column tiles are mostly padding. The choice does not depend on which
 * kernels OpenBLAS picked (OPENBLAS_CORETYPE): `bench_gemm shapes
 * --coretype-both` measured every product of the example models both ways,
 * and for each the path chosen is the faster under Haswell kernels and the
 * better worst case of the two (docs/benchmarks.md). f64 stays with
 * OpenBLAS: there is no own f64 kernel. */
int td__cpu_gemm_own(td_dtype dt, int64_t m, int64_t n, int64_t k) {
    (void)m, (void)k;
    return dt == TD_F32 && n >= 16 && td__cpu_simd() == TD_SIMD_AVX512;
}

void td__cpu_gemm_serial(td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                         const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                         void *c, int64_t ldc) {
    /* c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c; rows lda, ldb, ldc apart */
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
    if (td__cpu_gemm_own(dt, m, n, k) &&
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

int td__cpu_gemm_inner(cpu_device *cd, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
    if (dt == TD_F32 && cd && atomic_load(&cd->bf16))
        return td__cpu_bgemm_serial(td__cpu_bgemm_native(), ta, tb, m, n, k, (float)alpha, a, lda,
                                    b, ldb, (float)beta, c, ldc);
    td__cpu_gemm_serial(dt, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 1;
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
    int bf16;    /* f32 products of bf16-rounded inputs (kern_bgemm.c) */
    int native;  /* ... by AVX512-BF16, not the emulation */
    int failed;  /* a part found no memory (bf16 only) */
} gemm_args;

/* One part's product, of g's kind. */
static void part_gemm(gemm_args *g, int64_t m, int64_t n, const char *a, const char *b, char *c) {
    if (!g->bf16) {
        td__cpu_gemm_serial(g->dt, g->ta, g->tb, m, n, g->k, g->alpha, a, g->lda, b, g->ldb,
                            g->beta, c, g->ldc);
        return;
    }
    if (!td__cpu_bgemm_serial(g->native, g->ta, g->tb, m, n, g->k, (float)g->alpha,
                              (const float *)a, g->lda, (const float *)b, g->ldb, (float)g->beta,
                              (float *)c, g->ldc))
        g->failed = 1;
}

/* Blocks are multiples of this many rows or columns, to keep BLAS's kernels
 * on full panels. */
#define GEMM_ALIGN 16

static void gemm_part(void *p, int part, int nparts) {
    /* c (m, n) = alpha op(a) op(b) + beta c: this part's rows (columns if split_n) */
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
        part_gemm(g, g->m, hi - lo, g->a, b, g->c + (size_t)lo * es);
    } else {
        const char *a = g->a + (size_t)(g->ta ? lo : lo * g->lda) * es;
        part_gemm(g, hi - lo, g->n, a, g->b, g->c + (size_t)(lo * g->ldc) * es);
    }
}

/* Below this many multiply-adds a GEMM stays on one core: waking helpers
 * costs more than it saves. */
#define GEMM_PARALLEL_MIN (64.0 * 64.0 * 64.0)

/* Runs g, split over cd's cores when it is big enough. */
static td_status gemm_run(cpu_device *cd, gemm_args *g) {
    if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX)
        return td__error(TD_ERR_UNSUPPORTED, "gemm: %lld x %lld x %lld exceeds BLAS's int range",
                         (long long)g->m, (long long)g->n, (long long)g->k);
    if (td__cpu_threads(cd) == 1 ||
        (double)g->m * (double)g->n * (double)g->k < GEMM_PARALLEL_MIN) {
        part_gemm(g, g->m, g->n, g->a, g->b, g->c);
    } else {
        g->split_n = g->n > g->m;
        td__cpu_parallel(cd, gemm_part, g);
    }
    if (g->failed)
        return td__error(TD_ERR_OUT_OF_MEMORY,
                         "gemm_bf16: no memory for the rounded inputs of a %lld x %lld x %lld "
                         "product",
                         (long long)g->m, (long long)g->n, (long long)g->k);
    return TD_OK;
}

td_status td__cpu_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
    /* c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c; rows lda, ldb, ldc apart */
    gemm_args g = {.dt = dt,
                   .ta = ta,
                   .tb = tb,
                   .m = m,
                   .n = n,
                   .k = k,
                   .alpha = alpha,
                   .beta = beta,
                   .a = a,
                   .b = b,
                   .c = c,
                   .lda = lda,
                   .ldb = ldb,
                   .ldc = ldc,
                   .batch = 1};
    return gemm_run(ctx, &g);
}

td_status td__cpu_gemm_bf16(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k,
                            double alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            double beta, float *c, int64_t ldc) {
    /* c (m, n) = alpha bf16(op(a)) (m, k) bf16(op(b)) (k, n) + beta c, f32 sums */
    gemm_args g = {.dt = TD_F32,
                   .ta = ta,
                   .tb = tb,
                   .m = m,
                   .n = n,
                   .k = k,
                   .alpha = alpha,
                   .beta = beta,
                   .a = (const char *)a,
                   .b = (const char *)b,
                   .c = (char *)c,
                   .lda = lda,
                   .ldb = ldb,
                   .ldc = ldc,
                   .batch = 1,
                   .bf16 = 1,
                   .native = td__cpu_bgemm_native()};
    return gemm_run(ctx, &g);
}

static void gemm_batched_part(void *p, int part, int nparts) {
    /* this part's matrices of the batch, each c (m, n) = alpha op(a) op(b) + beta c */
    gemm_args *g = p;
    size_t es = td_dtype_size(g->dt), b0, b1;
    td__part_range((size_t)g->batch, part, nparts, &b0, &b1);
    for (size_t i = b0; i < b1; i++)
        part_gemm(g, g->m, g->n, g->a + i * (size_t)g->sa * es, g->b + i * (size_t)g->sb * es,
                  g->c + i * (size_t)g->sc * es);
}

td_status td__cpu_gemm_batched(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                               int64_t k, double alpha, const void *a, int64_t lda,
                               int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                               double beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch) {
    /* batch x [c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c], stride_* apart */
    cpu_device *cd = ctx;
    gemm_args g = {.dt = dt,
                   .ta = ta,
                   .tb = tb,
                   .m = m,
                   .n = n,
                   .k = k,
                   .alpha = alpha,
                   .beta = beta,
                   .a = a,
                   .b = b,
                   .c = c,
                   .lda = lda,
                   .ldb = ldb,
                   .ldc = ldc,
                   .sa = stride_a,
                   .sb = stride_b,
                   .sc = stride_c,
                   .batch = batch};
    int threads = td__cpu_threads(cd);
    /* attention's products composed by the tensor layer follow the device's
     * precision as the fused kernels do */
    g.bf16 = dt == TD_F32 && atomic_load(&cd->bf16);
    g.native = g.bf16 && td__cpu_bgemm_native();
    if (batch <= 0)
        return TD_OK;
    if (batch < threads) {
        /* Few big matrices: parallelise inside each. */
        size_t es = td_dtype_size(dt);
        for (int64_t i = 0; i < batch; i++) {
            gemm_args one = g;
            one.a += (size_t)(i * stride_a) * es;
            one.b += (size_t)(i * stride_b) * es;
            one.c += (size_t)(i * stride_c) * es;
            one.batch = 1;
            TD_CHECK(gemm_run(cd, &one));
        }
        return TD_OK;
    }
    td__cpu_parallel(cd, gemm_batched_part, &g);
    if (g.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY,
                         "gemm_batched: no memory for the rounded inputs of bf16 products");
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

/* col (c*kh*kw, oh*ow), rows ld apart, from one image x (c, h, w). */

#define T   float
#define SFX f32
#include "backend/cpu/tmpl/im2col.h"
#define T   double
#define SFX f64
#include "backend/cpu/tmpl/im2col.h"

typedef struct conv_args {
    cpu_device *cd;
    td_dtype dt;
    const td_conv_desc *d;
    const char *x, *w, *bias, *dy;
    char *y, *dx;
    void *partial[TD_CPU_MAX_PUS]; /* per part: (oc, ckk) dw then (oc) db */
    int failed;
} conv_args;

/* Images per GEMM: enough that the GEMMs are wide (k or n = g * oh * ow),
 * few enough that the buffers, `per_image` bytes each, stay near 256 KiB.
 * Then im2col's output is still in the core's L2 when the GEMM reads it;
 * with 4 MiB it went through the L3 the cores share. LeNet-5's step, 4 MiB
 * against 256 KiB, interleaved: 2% longer on one core and 5% on two devices
 * with OpenBLAS held to Haswell kernels, 12-15% longer without. */
static int64_t group_size(size_t per_image, size_t n) {
    size_t g = per_image ? ((size_t)256 << 10) / per_image : n;
    if (g < 1)
        g = 1;
    return (int64_t)(g < n ? g : n);
}

static void im2col_any(td_dtype dt, const td_conv_desc *d, const void *x, void *col, int64_t ld) {
    if (dt == TD_F32 && td__cpu_simd() == TD_SIMD_AVX512 && td__cpu_im2col512(d, x, col, ld))
        return;
    if (dt == TD_F32)
        im2col_f32(d, x, col, ld);
    else
        im2col_f64(d, x, col, ld);
}

/* dst rows (rows, n) with stride ldd = src rows with stride lds, plus bias[row]
 * when bias is not NULL. */
static void copy_rows(td_dtype dt, void *dst, int64_t ldd, const void *src, int64_t lds,
                      int64_t rows, int64_t n, const void *bias) {
    for (int64_t r = 0; r < rows; r++) {
        if (dt == TD_F32) {
            float *o = (float *)dst + r * ldd, b = bias ? ((const float *)bias)[r] : 0.0f;
            const float *in = (const float *)src + r * lds;
            for (int64_t j = 0; j < n; j++)
                o[j] = in[j] + b;
        } else {
            double *o = (double *)dst + r * ldd, b = bias ? ((const double *)bias)[r] : 0.0;
            const double *in = (const double *)src + r * lds;
            for (int64_t j = 0; j < n; j++)
                o[j] = in[j] + b;
        }
    }
}

/* Each part takes its images in groups of g: im2col of the group side by side
 * (ckk, g ohw), one GEMM, then the outputs back to (n, oc, ohw) with the bias. */
static void conv_fwd_part(void *p, int part, int nparts) {
    /* images [n0, n1) of x (n, c, h, w) -> y (n, oc, oh, ow) */
    conv_args *a = p;
    const td_conv_desc *d = a->d;
    size_t es = td_dtype_size(a->dt), n0, n1;
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow, g;
    char *col, *tmp;
    td__part_range((size_t)d->n, part, nparts, &n0, &n1);
    if (n0 >= n1)
        return;
    g = group_size((size_t)((ckk + d->oc) * ohw) * es, n1 - n0);
    if (!(col = td__cpu_scratch((size_t)((ckk + d->oc) * g * ohw) * es))) {
        a->failed = 1;
        return;
    }
    tmp = col + (size_t)(ckk * g * ohw) * es;
    for (size_t i0 = n0; i0 < n1; i0 += (size_t)g) {
        int64_t gi = (int64_t)(n1 - i0) < g ? (int64_t)(n1 - i0) : g, ld = gi * ohw;
        for (int64_t k = 0; k < gi; k++)
            im2col_any(a->dt, d, a->x + (i0 + (size_t)k) * (size_t)(d->c * d->h * d->w) * es,
                       col + (size_t)(k * ohw) * es, ld);
        /* tmp (oc, gi ohw) = w (oc, ckk) col (ckk, gi ohw) */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 0, 0, d->oc, ld, ckk, 1.0, a->w, ckk, col, ld, 0.0,
                                tmp, ld)) {
            a->failed = 1;
            return;
        }
        for (int64_t k = 0; k < gi; k++)
            copy_rows(a->dt, a->y + (i0 + (size_t)k) * (size_t)(d->oc * ohw) * es, ohw,
                      tmp + (size_t)(k * ohw) * es, ld, d->oc, ohw, a->bias);
    }
}

td_status td__cpu_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *bias, void *y) {
    /* x (n, c, h, w), w (oc, c, kh, kw), bias (oc) -> y (n, oc, oh, ow) */
    conv_args a = {.cd = ctx, .dt = dt, .d = d, .x = x, .w = w, .bias = bias, .y = y};
    td__cpu_parallel(ctx, conv_fwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "conv2d: no memory for the im2col buffer");
    return TD_OK;
}

/* Groups of g images as in the forward: dy of the group side by side
 * (oc, g ohw), dw += dy col^T and db += row sums into this part's partial
 * sums, dcol = w^T dy back to the images' dx through col2im. */
static void conv_bwd_part(void *p, int part, int nparts) {
    /* images [n0, n1): dy (n, oc, oh, ow) -> dx (n, c, h, w), partial dw, db */
    conv_args *a = p;
    const td_conv_desc *d = a->d;
    size_t es = td_dtype_size(a->dt), n0, n1;
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow, g;
    size_t per_image = (size_t)((ckk * (a->dx ? 2 : 1) + d->oc) * ohw) * es;
    size_t dwsz = (size_t)(d->oc * ckk + d->oc) * es;
    char *buf, *col, *dyb, *dcol, *dw;
    td__part_range((size_t)d->n, part, nparts, &n0, &n1);
    a->partial[part] = NULL;
    g = group_size(per_image, n1 > n0 ? n1 - n0 : 1);
    if (!(buf = td__cpu_scratch(per_image * (size_t)g + dwsz))) {
        a->failed = 1;
        return;
    }
    col = buf;
    dyb = col + (size_t)(ckk * g * ohw) * es;
    dcol = dyb + (size_t)(d->oc * g * ohw) * es;
    dw = buf + per_image * (size_t)g;
    memset(dw, 0, dwsz);
    a->partial[part] = dw;
    for (size_t i0 = n0; i0 < n1; i0 += (size_t)g) {
        int64_t gi = (int64_t)(n1 - i0) < g ? (int64_t)(n1 - i0) : g, ld = gi * ohw;
        for (int64_t k = 0; k < gi; k++) {
            size_t i = i0 + (size_t)k;
            im2col_any(a->dt, d, a->x + i * (size_t)(d->c * d->h * d->w) * es,
                       col + (size_t)(k * ohw) * es, ld);
            copy_rows(a->dt, dyb + (size_t)(k * ohw) * es, ld,
                      a->dy + i * (size_t)(d->oc * ohw) * es, ohw, d->oc, ohw, NULL);
        }
        /* dw (oc, ckk) += dy (oc, gi ohw) col^T (gi ohw, ckk) */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 0, 1, d->oc, ckk, ld, 1.0, dyb, ld, col, ld, 1.0, dw,
                                ckk)) {
            a->failed = 1;
            return;
        }
        /* db (oc) += row sums of dy, eight partial sums so the loop vectorises */
        for (int64_t o = 0; o < d->oc; o++) {
            if (a->dt == TD_F32) {
                const float *pl = (const float *)dyb + o * ld;
                float psum[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
                int64_t j = 0;
                for (; j + 8 <= ld; j += 8)
                    for (int q = 0; q < 8; q++)
                        psum[q] += pl[j + q];
                for (; j < ld; j++)
                    s += pl[j];
                for (int q = 0; q < 8; q++)
                    s += psum[q];
                ((float *)dw)[d->oc * ckk + o] += s;
            } else {
                const double *pl = (const double *)dyb + o * ld;
                double s = 0;
                for (int64_t j = 0; j < ld; j++)
                    s += pl[j];
                ((double *)dw)[d->oc * ckk + o] += s;
            }
        }
        if (!a->dx)
            continue;
        /* dcol (ckk, gi ohw) = w^T (ckk, oc) dy (oc, gi ohw) */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 1, 0, ckk, ld, d->oc, 1.0, a->w, ckk, dyb, ld, 0.0,
                                dcol, ld)) {
            a->failed = 1;
            return;
        }
        for (int64_t k = 0; k < gi; k++) {
            char *dxi = a->dx + (i0 + (size_t)k) * (size_t)(d->c * d->h * d->w) * es;
            if (a->dt == TD_F32)
                col2im_f32(d, (const float *)(dcol + (size_t)(k * ohw) * es), ld, (float *)dxi);
            else
                col2im_f64(d, (const double *)(dcol + (size_t)(k * ohw) * es), ld, (double *)dxi);
        }
    }
}

td_status td__cpu_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *dy, void *dx, void *dw, void *db, int acc) {
    /* x, dx: (n, c, h, w); w, dw: (oc, c, kh, kw); dy (n, oc, oh, ow); db (oc) */
    conv_args a = {.cd = ctx, .dt = dt, .d = d, .x = x, .w = w, .dy = dy, .dx = dx};
    int nparts = td__cpu_threads(ctx);
    int64_t ckk = d->c * d->kh * d->kw, total = d->oc * ckk + d->oc;
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
