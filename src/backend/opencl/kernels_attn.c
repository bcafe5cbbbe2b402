/* Fused causal self-attention: the GEMMs of every (sample, head) pair in one
 * batched CLBlast call each, and the causal softmax kernels over all pairs'
 * rows at once, in the CPU backend's order of operations. */
#include <stdlib.h>

#include "backend/opencl/opencl-impl.h"
#include "core/error.h"

#ifdef TD_HAVE_CLBLAST
#include <clblast_c.h>
#endif

/* Matrix (i, j) of an operand starts at off + i * sb + j * sh elements. */
typedef struct pair_operand {
    cl_mem mem;
    size_t off;
    int64_t ld, sb, sh;
} pair_operand;

/* C = alpha op(A) op(B) for each of nb x nh pairs. C is only written: its
 * old contents (zeroed by the caller where CLBlast is used) do not count. */
static td_status gemm_pairs(ocl_device *od, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                            int64_t k, double alpha, pair_operand a, pair_operand b, pair_operand c,
                            int64_t nb, int64_t nh) {
#ifdef TD_HAVE_CLBLAST
    size_t count = (size_t)(nb * nh), i = 0;
    size_t *offs = malloc(3 * count * sizeof *offs);
    double *scal = malloc(2 * count * sizeof *scal);
    CLBlastTranspose ota = ta ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastTranspose otb = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastStatusCode s;
    td_status st = TD_OK;
    if (!offs || !scal) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "%s: attention: no host memory for %zu GEMMs",
                       od->name, count);
        goto done;
    }
    for (int64_t bi = 0; bi < nb; bi++)
        for (int64_t hi = 0; hi < nh; hi++, i++) {
            offs[i] = a.off + (size_t)(bi * a.sb + hi * a.sh);
            offs[count + i] = b.off + (size_t)(bi * b.sb + hi * b.sh);
            offs[2 * count + i] = c.off + (size_t)(bi * c.sb + hi * c.sh);
        }
    pthread_mutex_lock(&td__clblast_lock);
    if (dt == TD_F32) {
        float *al = (float *)scal, *be = al + count;
        for (i = 0; i < count; i++) {
            al[i] = (float)alpha;
            be[i] = 0.0f;
        }
        s = CLBlastSgemmBatched(CLBlastLayoutRowMajor, ota, otb, (size_t)m, (size_t)n, (size_t)k,
                                al, a.mem, offs, (size_t)a.ld, b.mem, offs + count, (size_t)b.ld,
                                be, c.mem, offs + 2 * count, (size_t)c.ld, count, &od->queue, NULL);
    } else {
        for (i = 0; i < count; i++) {
            scal[i] = alpha;
            scal[count + i] = 0.0;
        }
        s = CLBlastDgemmBatched(CLBlastLayoutRowMajor, ota, otb, (size_t)m, (size_t)n, (size_t)k,
                                scal, a.mem, offs, (size_t)a.ld, b.mem, offs + count, (size_t)b.ld,
                                scal + count, c.mem, offs + 2 * count, (size_t)c.ld, count,
                                &od->queue, NULL);
    }
    pthread_mutex_unlock(&td__clblast_lock);
    if (s != CLBlastSuccess)
        st = td__error(s == CLBlastTempBufferAllocFailure ? TD_ERR_OUT_OF_MEMORY : TD_ERR_DEVICE,
                       "%s: CLBlast%cgemmBatched failed: %s (%d)", od->name,
                       dt == TD_F32 ? 'S' : 'D', td__ocl_error_name((cl_int)s), (int)s);
done:
    free(offs);
    free(scal);
    return st;
#else
    /* one strided batch over the heads per sample */
    for (int64_t bi = 0; bi < nb; bi++)
        TD_CHECK(td__ocl_gemm_plain(od, dt, ta, tb, m, n, k, alpha, a.mem,
                                    a.off + (size_t)(bi * a.sb), a.ld, a.sh, b.mem,
                                    b.off + (size_t)(bi * b.sb), b.ld, b.sh, 0.0, c.mem,
                                    c.off + (size_t)(bi * c.sb), c.ld, c.sh, nh));
    return TD_OK;
#endif
}

/* x[0:n] = 0 at (mem, byte offset); only needed before CLBlast's beta = 0. */
static td_status zero(ocl_device *od, td_dtype dt, cl_mem mem, size_t off, size_t n) {
#ifdef TD_HAVE_CLBLAST
    td_ocl_args a;
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_FILL));
    td__ocl_arg_mem(&a, mem, off);
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_real(&a, 0.0);
    return td__ocl_run(&a, n);
#else
    (void)od, (void)dt, (void)mem, (void)off, (void)n;
    return TD_OK;
#endif
}

static td_status resolve_elems(ocl_device *od, td_dtype dt, const void *p, cl_mem *mem,
                               size_t *off) {
    size_t bytes = 0;
    TD_CHECK(td__ocl_resolve(od, p, mem, &bytes));
    *off = bytes / td_dtype_size(dt);
    return TD_OK;
}

/* The causal softmax kernels over `mats` (t, t) matrices at (mem, element offset). */
static td_status softmax_fwd(ocl_device *od, td_dtype dt, int64_t mats, int64_t t, cl_mem p,
                             size_t off) {
    td_ocl_args a;
    size_t es = td_dtype_size(dt);
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_CAUSAL_SOFTMAX_FWD));
    td__ocl_arg_u64(&a, (uint64_t)(mats * t));
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_real(&a, 1.0); /* the scale is in the GEMM, as on the CPU */
    td__ocl_arg_mem(&a, p, off * es);
    td__ocl_arg_mem(&a, p, off * es);
    return td__ocl_run(&a, (size_t)(mats * t));
}

static td_status softmax_bwd(ocl_device *od, td_dtype dt, int64_t mats, int64_t t, double scale,
                             cl_mem p, size_t p_off, cl_mem dp, size_t dp_off) {
    td_ocl_args a;
    size_t es = td_dtype_size(dt);
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_CAUSAL_SOFTMAX_BWD));
    td__ocl_arg_u64(&a, (uint64_t)(mats * t));
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_real(&a, scale);
    td__ocl_arg_mem(&a, p, p_off * es);
    td__ocl_arg_mem(&a, dp, dp_off * es);
    td__ocl_arg_mem(&a, dp, dp_off * es);
    return td__ocl_run(&a, (size_t)(mats * t));
}

td_status td__ocl_attention_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, void *p, void *y) {
    ocl_device *od = ctx;
    int64_t d = h > 0 ? c / h : 0;
    size_t es = td_dtype_size(dt);
    cl_mem qm = NULL, pm = NULL, ym = NULL;
    size_t qo = 0, po = 0, yo = 0;
    pair_operand q, k, v, pp, yy;
    if (b <= 0 || t <= 0 || d <= 0)
        return TD_OK;
    TD_CHECK(resolve_elems(od, dt, qkv, &qm, &qo));
    TD_CHECK(resolve_elems(od, dt, p, &pm, &po));
    TD_CHECK(resolve_elems(od, dt, y, &ym, &yo));
    q = (pair_operand){qm, qo, 3 * c, t * 3 * c, d};
    k = (pair_operand){qm, qo + (size_t)c, 3 * c, t * 3 * c, d};
    v = (pair_operand){qm, qo + (size_t)(2 * c), 3 * c, t * 3 * c, d};
    pp = (pair_operand){pm, po, t, h * t * t, t * t};
    yy = (pair_operand){ym, yo, c, t * c, d};
    /* p (t, t) = scale q k^T, then the causal softmax in place; y (t, d) = p v */
    TD_CHECK(zero(od, dt, pm, po * es, (size_t)(b * h * t * t)));
    TD_CHECK(gemm_pairs(od, dt, 0, 1, t, t, d, scale, q, k, pp, b, h));
    TD_CHECK(softmax_fwd(od, dt, b * h, t, pm, po));
    TD_CHECK(zero(od, dt, ym, yo * es, (size_t)(b * t * c)));
    return gemm_pairs(od, dt, 0, 0, t, d, t, 1.0, pp, v, yy, b, h);
}

td_status td__ocl_attention_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, const void *p, const void *dy,
                                void *dqkv) {
    ocl_device *od = ctx;
    int64_t d = h > 0 ? c / h : 0;
    size_t es = td_dtype_size(dt);
    cl_mem qm = NULL, pm = NULL, dym = NULL, dqm = NULL, sm = NULL;
    size_t qo = 0, po = 0, dyo = 0, dqo = 0;
    pair_operand q, k, v, pp, dyy, dq, dk, dv, dp;
    if (b <= 0 || t <= 0 || d <= 0)
        return TD_OK;
    TD_CHECK(resolve_elems(od, dt, qkv, &qm, &qo));
    TD_CHECK(resolve_elems(od, dt, p, &pm, &po));
    TD_CHECK(resolve_elems(od, dt, dy, &dym, &dyo));
    TD_CHECK(resolve_elems(od, dt, dqkv, &dqm, &dqo));
    TD_CHECK(td__ocl_scratch(od, (size_t)(b * h * t * t) * es, &sm));
    q = (pair_operand){qm, qo, 3 * c, t * 3 * c, d};
    k = (pair_operand){qm, qo + (size_t)c, 3 * c, t * 3 * c, d};
    v = (pair_operand){qm, qo + (size_t)(2 * c), 3 * c, t * 3 * c, d};
    dq = (pair_operand){dqm, dqo, 3 * c, t * 3 * c, d};
    dk = (pair_operand){dqm, dqo + (size_t)c, 3 * c, t * 3 * c, d};
    dv = (pair_operand){dqm, dqo + (size_t)(2 * c), 3 * c, t * 3 * c, d};
    pp = (pair_operand){pm, po, t, h * t * t, t * t};
    dp = (pair_operand){sm, 0, t, h * t * t, t * t};
    dyy = (pair_operand){dym, dyo, c, t * c, d};
    /* dp (t, t) = dy (t, d) v^T; dv (t, d) = p^T dy */
    TD_CHECK(zero(od, dt, sm, 0, (size_t)(b * h * t * t)));
    TD_CHECK(gemm_pairs(od, dt, 0, 1, t, t, d, 1.0, dyy, v, dp, b, h));
    TD_CHECK(zero(od, dt, dqm, dqo * es, (size_t)(b * t * 3 * c)));
    TD_CHECK(gemm_pairs(od, dt, 1, 0, t, d, t, 1.0, pp, dyy, dv, b, h));
    /* ds = scale p (dp - rowsum(p dp)) in place; dq = ds k; dk = ds^T q */
    TD_CHECK(softmax_bwd(od, dt, b * h, t, scale, pm, po, sm, 0));
    TD_CHECK(gemm_pairs(od, dt, 0, 0, t, d, t, 1.0, dp, k, dq, b, h));
    return gemm_pairs(od, dt, 1, 0, t, d, t, 1.0, dp, q, dk, b, h);
}
