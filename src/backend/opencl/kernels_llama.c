/* The Llama family's slots of the OpenCL kernel table: RMSNorm, the SwiGLU
 * gate, rotary positions and grouped-query heads (kernels in kernels_cl.c),
 * each only queued. */
#include "backend/opencl/opencl-impl.h"
#include "core/error.h"

td_status td__ocl_rmsnorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                              const void *x, const void *w, void *y, void *rstd) {
    td_ocl_args a;
    if (rows <= 0 || cols <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_RMSNORM_FWD));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)cols);
    td__ocl_arg_real(&a, eps);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, w);
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_ptr(&a, rstd);
    return td__ocl_run(&a, (size_t)rows);
}

td_status td__ocl_rmsnorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                              const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                              int acc) {
    td_ocl_args a;
    if (cols <= 0)
        return TD_OK;
    if (rows < 0)
        rows = 0;
    if (dx && rows > 0) {
        TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_RMSNORM_BWD_DX));
        td__ocl_arg_u64(&a, (uint64_t)rows);
        td__ocl_arg_u64(&a, (uint64_t)cols);
        td__ocl_arg_ptr(&a, x);
        td__ocl_arg_ptr(&a, w);
        td__ocl_arg_ptr(&a, rstd);
        td__ocl_arg_ptr(&a, dy);
        td__ocl_arg_ptr(&a, dx);
        TD_CHECK(td__ocl_run(&a, (size_t)rows));
    }
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_RMSNORM_BWD_W));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)cols);
    td__ocl_arg_ptr(&a, rows ? x : NULL);
    td__ocl_arg_ptr(&a, rows ? rstd : NULL);
    td__ocl_arg_ptr(&a, rows ? dy : NULL);
    td__ocl_arg_ptr(&a, dw);
    td__ocl_arg_int(&a, acc);
    return td__ocl_run(&a, (size_t)cols);
}

td_status td__ocl_swiglu_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             void *h) {
    td_ocl_args a;
    if (rows <= 0 || f <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_SWIGLU_FWD));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)f);
    td__ocl_arg_ptr(&a, gu);
    td__ocl_arg_ptr(&a, h);
    return td__ocl_run(&a, (size_t)(rows * f));
}

td_status td__ocl_swiglu_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             const void *dh, void *dgu) {
    td_ocl_args a;
    if (rows <= 0 || f <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_SWIGLU_BWD));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)f);
    td__ocl_arg_ptr(&a, gu);
    td__ocl_arg_ptr(&a, dh);
    td__ocl_arg_ptr(&a, dgu);
    return td__ocl_run(&a, (size_t)(rows * f));
}

td_status td__ocl_rope(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                       int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                       int inverse, void *x) {
    td_ocl_args a;
    if (b <= 0 || t <= 0 || heads <= 0 || d < 2)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_ROPE));
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_u64(&a, (uint64_t)(b * t));
    td__ocl_arg_u64(&a, (uint64_t)ld);
    td__ocl_arg_u64(&a, (uint64_t)col);
    td__ocl_arg_u64(&a, (uint64_t)heads);
    td__ocl_arg_u64(&a, (uint64_t)d);
    td__ocl_arg_u64(&a, (uint64_t)pos0);
    td__ocl_arg_u64(&a, (uint64_t)npos);
    td__ocl_arg_ptr(&a, tab);
    td__ocl_arg_int(&a, inverse);
    td__ocl_arg_ptr(&a, x);
    return td__ocl_run(&a, (size_t)(b * t * heads * (d / 2)));
}

td_status td__ocl_kv_expand(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *raw, void *qkv) {
    td_ocl_args a;
    if (rows <= 0 || m.h <= 0 || m.kv <= 0 || d <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_KV_EXPAND));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)m.h);
    td__ocl_arg_u64(&a, (uint64_t)m.kv);
    td__ocl_arg_u64(&a, (uint64_t)m.g);
    td__ocl_arg_u64(&a, (uint64_t)m.skew);
    td__ocl_arg_u64(&a, (uint64_t)d);
    td__ocl_arg_ptr(&a, raw);
    td__ocl_arg_ptr(&a, qkv);
    return td__ocl_run(&a, (size_t)(rows * 3 * m.h * d));
}

td_status td__ocl_kv_reduce(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *dqkv, void *draw) {
    td_ocl_args a;
    if (rows <= 0 || m.h <= 0 || m.kv <= 0 || d <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_KV_REDUCE));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)m.h);
    td__ocl_arg_u64(&a, (uint64_t)m.kv);
    td__ocl_arg_u64(&a, (uint64_t)m.g);
    td__ocl_arg_u64(&a, (uint64_t)m.skew);
    td__ocl_arg_u64(&a, (uint64_t)d);
    td__ocl_arg_ptr(&a, dqkv);
    td__ocl_arg_ptr(&a, draw);
    return td__ocl_run(&a, (size_t)(rows * (m.h + 2 * m.kv) * d));
}
