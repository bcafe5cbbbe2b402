/* GEMM through CLBlast (row-major, on the cl_mem and offset each device
 * pointer maps to) and convolution as im2col + one GEMM per chunk of images.
 * Builds without CLBlast fall back to a plain GEMM kernel. */
#include <stdio.h>

#include "backend/opencl/opencl-impl.h"
#include "core/error.h"

#ifdef TD_HAVE_CLBLAST
#include <clblast_c.h>
#endif

/* Temporaries of one convolution chunk start on these boundaries. */
#define SCRATCH_ALIGN 4096
/* Images per chunk are bounded so the im2col buffers stay this small. */
#define CONV_SCRATCH_MAX ((size_t)64 << 20)

static size_t align_up(size_t n) {
    return (n + SCRATCH_ALIGN - 1) / SCRATCH_ALIGN * SCRATCH_ALIGN;
}

/* c = beta c over a batch of (m, n) blocks, exactly 0 when beta is 0. */
static td_status mat_scale(ocl_device *od, td_dtype dt, int64_t m, int64_t n, cl_mem c,
                           size_t c_off, int64_t ldc, int64_t stride_c, int64_t batch,
                           double beta) {
    td_ocl_args a;
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_MAT_SCALE));
    td__ocl_arg_u64(&a, (uint64_t)batch);
    td__ocl_arg_u64(&a, (uint64_t)m);
    td__ocl_arg_u64(&a, (uint64_t)n);
    td__ocl_arg_u64(&a, (uint64_t)ldc);
    td__ocl_arg_u64(&a, (uint64_t)stride_c);
    td__ocl_arg_real(&a, beta);
    td__ocl_arg_mem(&a, c, c_off * td_dtype_size(dt));
    return td__ocl_run(&a, (size_t)(batch * m * n));
}

#ifdef TD_HAVE_CLBLAST
pthread_mutex_t td__clblast_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *clblast_name(CLBlastStatusCode s) {
    switch (s) {
    case CLBlastNotImplemented: return "CLBlastNotImplemented";
    case CLBlastInvalidMatrixA: return "CLBlastInvalidMatrixA";
    case CLBlastInvalidMatrixB: return "CLBlastInvalidMatrixB";
    case CLBlastInvalidMatrixC: return "CLBlastInvalidMatrixC";
    case CLBlastInvalidDimension: return "CLBlastInvalidDimension";
    case CLBlastInvalidLeadDimA: return "CLBlastInvalidLeadDimA";
    case CLBlastInvalidLeadDimB: return "CLBlastInvalidLeadDimB";
    case CLBlastInvalidLeadDimC: return "CLBlastInvalidLeadDimC";
    case CLBlastInsufficientMemoryA: return "CLBlastInsufficientMemoryA";
    case CLBlastInsufficientMemoryB: return "CLBlastInsufficientMemoryB";
    case CLBlastInsufficientMemoryC: return "CLBlastInsufficientMemoryC";
    case CLBlastInsufficientMemoryTemp: return "CLBlastInsufficientMemoryTemp";
    case CLBlastInvalidBatchCount: return "CLBlastInvalidBatchCount";
    case CLBlastInvalidLocalMemUsage: return "CLBlastInvalidLocalMemUsage";
    case CLBlastNoDoublePrecision: return "CLBlastNoDoublePrecision";
    case CLBlastDatabaseError: return "CLBlastDatabaseError";
    case CLBlastUnknownError: return "CLBlastUnknownError";
    case CLBlastUnexpectedError: return "CLBlastUnexpectedError";
    default: return td__ocl_error_name((cl_int)s); /* the codes shared with OpenCL */
    }
}

static td_status clblast_status(ocl_device *od, CLBlastStatusCode s, const char *call) {
    td_status st = TD_ERR_DEVICE;
    if (s == CLBlastTempBufferAllocFailure || s == CLBlastOpenCLOutOfResources ||
        s == CLBlastOpenCLOutOfHostMemory)
        st = TD_ERR_OUT_OF_MEMORY;
    return td__error(st, "%s: %s failed: %s (%d)", od->name, call, clblast_name(s), (int)s);
}
#endif

td_status td__ocl_gemm_plain(ocl_device *od, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                             int64_t k, double alpha, cl_mem a, size_t a_off, int64_t lda,
                             int64_t stride_a, cl_mem b, size_t b_off, int64_t ldb,
                             int64_t stride_b, double beta, cl_mem c, size_t c_off, int64_t ldc,
                             int64_t stride_c, int64_t batch) {
    td_ocl_args g;
    size_t es = td_dtype_size(dt);
    if (m <= 0 || n <= 0 || batch <= 0)
        return TD_OK;
    if (k < 0)
        k = 0;
    TD_CHECK(td__ocl_begin(&g, od, dt, TD_OCL_K_GEMM_PLAIN));
    td__ocl_arg_int(&g, ta);
    td__ocl_arg_int(&g, tb);
    td__ocl_arg_u64(&g, (uint64_t)m);
    td__ocl_arg_u64(&g, (uint64_t)n);
    td__ocl_arg_u64(&g, (uint64_t)k);
    td__ocl_arg_real(&g, alpha);
    td__ocl_arg_mem(&g, a, a_off * es);
    td__ocl_arg_u64(&g, (uint64_t)lda);
    td__ocl_arg_u64(&g, (uint64_t)stride_a);
    td__ocl_arg_mem(&g, b, b_off * es);
    td__ocl_arg_u64(&g, (uint64_t)ldb);
    td__ocl_arg_u64(&g, (uint64_t)stride_b);
    td__ocl_arg_real(&g, beta);
    td__ocl_arg_mem(&g, c, c_off * es);
    td__ocl_arg_u64(&g, (uint64_t)ldc);
    td__ocl_arg_u64(&g, (uint64_t)stride_c);
    td__ocl_arg_u64(&g, (uint64_t)batch);
    return td__ocl_run(&g, (size_t)(batch * m * n));
}

td_status td__ocl_gemm_mem(ocl_device *od, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                           int64_t k, double alpha, cl_mem a, size_t a_off, int64_t lda,
                           int64_t stride_a, cl_mem b, size_t b_off, int64_t ldb, int64_t stride_b,
                           double beta, cl_mem c, size_t c_off, int64_t ldc, int64_t stride_c,
                           int64_t batch) {
#ifndef TD_HAVE_CLBLAST
    return td__ocl_gemm_plain(od, dt, ta, tb, m, n, k, alpha, a, a_off, lda, stride_a, b, b_off,
                              ldb, stride_b, beta, c, c_off, ldc, stride_c, batch);
#else
    if (m <= 0 || n <= 0 || batch <= 0)
        return TD_OK;
    if (k <= 0 || beta == 0) {
        /* k = 0 leaves beta C; with beta 0, C is zeroed first so that
         * whatever it held (NaN included) cannot leak through 0 * C. */
        TD_CHECK(mat_scale(od, dt, m, n, c, c_off, ldc, stride_c, batch, beta));
        if (k <= 0)
            return TD_OK;
    }
    {
        CLBlastTranspose ota = ta ? CLBlastTransposeYes : CLBlastTransposeNo;
        CLBlastTranspose otb = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
        CLBlastStatusCode s;
        const char *call;
        TD_CHECK(
            td__ocl_kernel(od, dt, TD_OCL_K_MAT_SCALE, &(cl_kernel){NULL})); /* the fp64 check */
        pthread_mutex_lock(&td__clblast_lock);
        if (batch == 1 && dt == TD_F32) {
            call = "CLBlastSgemm";
            s = CLBlastSgemm(CLBlastLayoutRowMajor, ota, otb, (size_t)m, (size_t)n, (size_t)k,
                             (float)alpha, a, a_off, (size_t)lda, b, b_off, (size_t)ldb,
                             (float)beta, c, c_off, (size_t)ldc, &od->queue, NULL);
        } else if (batch == 1) {
            call = "CLBlastDgemm";
            s = CLBlastDgemm(CLBlastLayoutRowMajor, ota, otb, (size_t)m, (size_t)n, (size_t)k,
                             alpha, a, a_off, (size_t)lda, b, b_off, (size_t)ldb, beta, c, c_off,
                             (size_t)ldc, &od->queue, NULL);
        } else if (dt == TD_F32) {
            call = "CLBlastSgemmStridedBatched";
            s = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, ota, otb, (size_t)m, (size_t)n,
                                           (size_t)k, (float)alpha, a, a_off, (size_t)lda,
                                           (size_t)stride_a, b, b_off, (size_t)ldb,
                                           (size_t)stride_b, (float)beta, c, c_off, (size_t)ldc,
                                           (size_t)stride_c, (size_t)batch, &od->queue, NULL);
        } else {
            call = "CLBlastDgemmStridedBatched";
            s = CLBlastDgemmStridedBatched(
                CLBlastLayoutRowMajor, ota, otb, (size_t)m, (size_t)n, (size_t)k, alpha, a, a_off,
                (size_t)lda, (size_t)stride_a, b, b_off, (size_t)ldb, (size_t)stride_b, beta, c,
                c_off, (size_t)ldc, (size_t)stride_c, (size_t)batch, &od->queue, NULL);
        }
        pthread_mutex_unlock(&td__clblast_lock);
        if (s != CLBlastSuccess)
            return clblast_status(od, s, call);
        return TD_OK;
    }
#endif
}

/* (cl_mem, element offset) of a device pointer. */
static td_status resolve_elems(ocl_device *od, td_dtype dt, const void *p, cl_mem *mem,
                               size_t *off) {
    size_t bytes = 0;
    TD_CHECK(td__ocl_resolve(od, p, mem, &bytes));
    if (bytes % td_dtype_size(dt))
        return td__error(TD_ERR_INVALID_ARG, "%s: GEMM operand %p is not aligned to %s", od->name,
                         p, td_dtype_name(dt));
    *off = bytes / td_dtype_size(dt);
    return TD_OK;
}

td_status td__ocl_gemm_batched(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                               int64_t k, double alpha, const void *a, int64_t lda,
                               int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                               double beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch) {
    ocl_device *od = ctx;
    cl_mem am = NULL, bm = NULL, cm = NULL;
    size_t ao = 0, bo = 0, co = 0;
    if (m <= 0 || n <= 0 || batch <= 0)
        return TD_OK;
    TD_CHECK(resolve_elems(od, dt, c, &cm, &co));
    if (k > 0) {
        TD_CHECK(resolve_elems(od, dt, a, &am, &ao));
        TD_CHECK(resolve_elems(od, dt, b, &bm, &bo));
    }
    return td__ocl_gemm_mem(od, dt, ta, tb, m, n, k, alpha, am, ao, lda, stride_a, bm, bo, ldb,
                            stride_b, beta, cm, co, ldc, stride_c, batch);
}

td_status td__ocl_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc) {
    return td__ocl_gemm_batched(ctx, dt, ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc,
                                0, 1);
}

/* Convolution ------------------------------------------------------------------------ */

/* How many images one chunk takes when each needs per_image scratch bytes. */
static int64_t chunk_images(int64_t n, size_t per_image) {
    int64_t nb = (int64_t)(CONV_SCRATCH_MAX / (per_image ? per_image : 1));
    return nb < 1 ? 1 : nb > n ? n : nb;
}

/* col (c kh kw, nb oh ow) at (scratch, col_off) from nb images at x. */
static td_status im2col(ocl_device *od, td_dtype dt, const td_conv_desc *d, int64_t nb,
                        const void *x, cl_mem col, size_t col_off) {
    td_ocl_args a;
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_IM2COL));
    td__ocl_arg_u64(&a, (uint64_t)nb);
    td__ocl_arg_u64(&a, (uint64_t)d->c);
    td__ocl_arg_window(&a, d);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_mem(&a, col, col_off);
    return td__ocl_run(&a, (size_t)(d->c * d->kh * d->kw * nb * d->oh * d->ow));
}

td_status td__ocl_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *bias, void *y) {
    ocl_device *od = ctx;
    size_t es = td_dtype_size(dt);
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow;
    int64_t nb = chunk_images(d->n, (size_t)((ckk + d->oc) * ohw) * es);
    cl_mem scratch = NULL, wm = NULL;
    size_t wo = 0, col_bytes = align_up((size_t)(ckk * nb * ohw) * es);
    if (d->n <= 0)
        return TD_OK;
    TD_CHECK(resolve_elems(od, dt, w, &wm, &wo));
    TD_CHECK(td__ocl_scratch(od, col_bytes + (size_t)(d->oc * nb * ohw) * es, &scratch));
    for (int64_t i0 = 0; i0 < d->n; i0 += nb) {
        int64_t cnt = d->n - i0 < nb ? d->n - i0 : nb, cols = cnt * ohw;
        td_ocl_args a;
        TD_CHECK(im2col(od, dt, d, cnt, (const char *)x + (size_t)(i0 * d->c * d->h * d->w) * es,
                        scratch, 0));
        /* yt (oc, cnt ohw) = w (oc, ckk) col (ckk, cnt ohw) */
        TD_CHECK(td__ocl_gemm_mem(od, dt, 0, 0, d->oc, cols, ckk, 1.0, wm, wo, ckk, 0, scratch, 0,
                                  cols, 0, 0.0, scratch, col_bytes / es, cols, 0, 1));
        TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_CONV_OUT));
        td__ocl_arg_u64(&a, (uint64_t)cnt);
        td__ocl_arg_u64(&a, (uint64_t)d->oc);
        td__ocl_arg_u64(&a, (uint64_t)ohw);
        td__ocl_arg_mem(&a, scratch, col_bytes);
        td__ocl_arg_ptr(&a, bias);
        td__ocl_arg_int(&a, bias != NULL);
        td__ocl_arg_ptr(&a, (char *)y + (size_t)(i0 * d->oc * ohw) * es);
        TD_CHECK(td__ocl_run(&a, (size_t)(cnt * d->oc * ohw)));
    }
    return TD_OK;
}

td_status td__ocl_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *dy, void *dx, void *dw, void *db, int acc) {
    ocl_device *od = ctx;
    size_t es = td_dtype_size(dt);
    int64_t ckk = d->c * d->kh * d->kw, ohw = d->oh * d->ow;
    int64_t nb = chunk_images(d->n, (size_t)((ckk * (dx ? 2 : 1) + d->oc) * ohw) * es);
    cl_mem scratch = NULL, wm = NULL, dwm = NULL;
    size_t wo = 0, dwo = 0;
    size_t col_bytes = align_up((size_t)(ckk * nb * ohw) * es);
    size_t dyt_bytes = align_up((size_t)(d->oc * nb * ohw) * es);
    TD_CHECK(resolve_elems(od, dt, w, &wm, &wo));
    TD_CHECK(resolve_elems(od, dt, dw, &dwm, &dwo));
    if (db)
        TD_CHECK(td__ocl_bias_grad(od, dt, db, d->n > 0 ? dy : NULL, d->n, d->oc, ohw, acc));
    if (d->n <= 0)
        return acc ? TD_OK : mat_scale(od, dt, d->oc, ckk, dwm, dwo, ckk, 0, 1, 0.0);
    TD_CHECK(td__ocl_scratch(od, col_bytes + dyt_bytes + (dx ? col_bytes : 0), &scratch));
    for (int64_t i0 = 0; i0 < d->n; i0 += nb) {
        int64_t cnt = d->n - i0 < nb ? d->n - i0 : nb, cols = cnt * ohw;
        td_ocl_args a;
        TD_CHECK(im2col(od, dt, d, cnt, (const char *)x + (size_t)(i0 * d->c * d->h * d->w) * es,
                        scratch, 0));
        TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_CONV_DY_T));
        td__ocl_arg_u64(&a, (uint64_t)cnt);
        td__ocl_arg_u64(&a, (uint64_t)d->oc);
        td__ocl_arg_u64(&a, (uint64_t)ohw);
        td__ocl_arg_ptr(&a, (const char *)dy + (size_t)(i0 * d->oc * ohw) * es);
        td__ocl_arg_mem(&a, scratch, col_bytes);
        TD_CHECK(td__ocl_run(&a, (size_t)(cnt * d->oc * ohw)));
        /* dw (oc, ckk) (+)= dyt (oc, cnt ohw) col^T (cnt ohw, ckk) */
        TD_CHECK(td__ocl_gemm_mem(od, dt, 0, 1, d->oc, ckk, cols, 1.0, scratch, col_bytes / es,
                                  cols, 0, scratch, 0, cols, 0, i0 == 0 && !acc ? 0.0 : 1.0, dwm,
                                  dwo, ckk, 0, 1));
        if (!dx)
            continue;
        /* dcol (ckk, cnt ohw) = w^T (ckk, oc) dyt (oc, cnt ohw), then back to pixels */
        TD_CHECK(td__ocl_gemm_mem(od, dt, 1, 0, ckk, cols, d->oc, 1.0, wm, wo, ckk, 0, scratch,
                                  col_bytes / es, cols, 0, 0.0, scratch,
                                  (col_bytes + dyt_bytes) / es, cols, 0, 1));
        TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_COL2IM));
        td__ocl_arg_u64(&a, (uint64_t)cnt);
        td__ocl_arg_u64(&a, (uint64_t)d->c);
        td__ocl_arg_window(&a, d);
        td__ocl_arg_mem(&a, scratch, col_bytes + dyt_bytes);
        td__ocl_arg_ptr(&a, (char *)dx + (size_t)(i0 * d->c * d->h * d->w) * es);
        TD_CHECK(td__ocl_run(&a, (size_t)(cnt * d->c * d->h * d->w)));
    }
    return TD_OK;
}
