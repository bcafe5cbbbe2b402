/* The Llama family's kernels on the CPU: RMSNorm, the SwiGLU gate, rotary
 * position embedding and the grouped-query expansion of key and value
 * heads. Written once over the element type in tmpl/llama.h; rows are split
 * over the device's cores, and the RMSNorm weight's gradient is summed per
 * part and then in part order, so results never depend on thread timing. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"

typedef struct llama_args {
    td_dtype dt;
    int64_t rows, cols;
    double eps;
    const void *x, *w, *rstd_in, *dy;
    void *y, *rstd, *dx;
    /* rope: x (b t, ld), heads of d columns from col; positions pos0 + row % t */
    int64_t t, ld, col, heads, d, pos0, npos;
    td_kv_map map; /* kv_expand, kv_reduce */
    int inverse;
    void *partial[TD_CPU_MAX_PUS];
    int failed;
} llama_args;

static int parts_for(void *ctx, double work) {
    return work < 32768 ? 1 : td__cpu_threads(ctx);
}

static void run_parts(void *ctx, double work, td_cpu_part_fn fn, void *arg) {
    if (parts_for(ctx, work) == 1)
        fn(arg, 0, 1);
    else
        td__cpu_parallel(ctx, fn, arg);
}

typedef void (*rows_fn)(llama_args *a, size_t r0, size_t r1);

static void rows_part(void *p, int part, int nparts, rows_fn f32, rows_fn f64) {
    llama_args *a = p;
    size_t r0, r1;
    td__part_range((size_t)a->rows, part, nparts, &r0, &r1);
    if (a->dt == TD_F32)
        f32(a, r0, r1);
    else
        f64(a, r0, r1);
}

static void silu_gate_f64(size_t n, const double *g, const double *u, double *h) {
    for (size_t j = 0; j < n; j++)
        h[j] = g[j] / (1 + exp(-g[j])) * u[j];
}

#define T         float
#define SFX       f32
#define SQRT      sqrtf
#define EXP       expf
#define SILU_GATE td__cpu_silu_gate_f32
#include "backend/cpu/tmpl/llama.h"
#define T         double
#define SFX       f64
#define SQRT      sqrt
#define EXP       exp
#define SILU_GATE silu_gate_f64
#include "backend/cpu/tmpl/llama.h"

/* RMSNorm ----------------------------------------------------------------------- */

static void rms_fwd_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, rms_fwd_rows_f32, rms_fwd_rows_f64);
}

td_status td__cpu_rmsnorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                              const void *x, const void *w, void *y, void *rstd) {
    /* x, y: (rows, cols); w: (cols); rstd: (rows) */
    llama_args a = {
        .dt = dt, .rows = rows, .cols = cols, .eps = eps, .x = x, .w = w, .y = y, .rstd = rstd};
    run_parts(ctx, (double)rows * (double)cols, rms_fwd_part, &a);
    return TD_OK;
}

static void rms_bwd_part(void *p, int part, int nparts) {
    llama_args *a = p;
    size_t r0, r1, es = td_dtype_size(a->dt);
    char *buf = td__cpu_scratch((size_t)a->cols * es);
    a->partial[part] = buf;
    if (!buf) {
        a->failed = 1;
        return;
    }
    memset(buf, 0, (size_t)a->cols * es);
    td__part_range((size_t)a->rows, part, nparts, &r0, &r1);
    if (a->dt == TD_F32)
        rms_bwd_rows_f32(a, r0, r1, (float *)buf);
    else
        rms_bwd_rows_f64(a, r0, r1, (double *)buf);
}

td_status td__cpu_rmsnorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                              const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                              int acc) {
    /* x, dy, dx: (rows, cols); w, dw: (cols); rstd: (rows) */
    llama_args a = {
        .dt = dt, .rows = rows, .cols = cols, .x = x, .w = w, .rstd_in = rstd, .dy = dy, .dx = dx};
    int parts = parts_for(ctx, (double)rows * (double)cols);
    run_parts(ctx, (double)rows * (double)cols, rms_bwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "RMSNorm backward: no scratch memory");
    for (int64_t j = 0; j < cols; j++) {
        double s = 0;
        for (int p = 0; p < parts; p++)
            s +=
                dt == TD_F32 ? ((const float *)a.partial[p])[j] : ((const double *)a.partial[p])[j];
        if (dt == TD_F32)
            ((float *)dw)[j] = (float)(acc ? ((float *)dw)[j] + s : s);
        else
            ((double *)dw)[j] = acc ? ((double *)dw)[j] + s : s;
    }
    return TD_OK;
}

/* SwiGLU ------------------------------------------------------------------------ */

static void swiglu_fwd_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, swiglu_fwd_rows_f32, swiglu_fwd_rows_f64);
}

td_status td__cpu_swiglu_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             void *h) {
    /* gu (rows, 2f) -> h (rows, f) */
    llama_args a = {.dt = dt, .rows = rows, .cols = f, .x = gu, .y = h};
    run_parts(ctx, (double)rows * (double)f * 8, swiglu_fwd_part, &a);
    return TD_OK;
}

static void swiglu_bwd_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, swiglu_bwd_rows_f32, swiglu_bwd_rows_f64);
}

td_status td__cpu_swiglu_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             const void *dh, void *dgu) {
    /* gu, dgu (rows, 2f); dh (rows, f) */
    llama_args a = {.dt = dt, .rows = rows, .cols = f, .x = gu, .dy = dh, .dx = dgu};
    run_parts(ctx, (double)rows * (double)f * 8, swiglu_bwd_part, &a);
    return TD_OK;
}

/* Rotary embedding and grouped-query heads ------------------------------------------ */

static void rope_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, rope_rows_f32, rope_rows_f64);
}

td_status td__cpu_rope(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                       int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                       int inverse, void *x) {
    /* x (b, t, ld) in place; tab (2, npos, d/2) */
    llama_args a = {.dt = dt,
                    .rows = b * t,
                    .t = t,
                    .ld = ld,
                    .col = col,
                    .heads = heads,
                    .d = d,
                    .pos0 = pos0,
                    .npos = npos,
                    .w = tab,
                    .inverse = inverse,
                    .y = x};
    run_parts(ctx, (double)(b * t) * (double)(heads * d) * 4, rope_part, &a);
    return TD_OK;
}

static void kv_expand_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, kv_expand_rows_f32, kv_expand_rows_f64);
}

td_status td__cpu_kv_expand(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *raw, void *qkv) {
    /* raw (rows, (h + 2 kv) d) -> qkv (rows, 3 h d) */
    llama_args a = {.dt = dt, .rows = rows, .map = m, .d = d, .x = raw, .y = qkv};
    run_parts(ctx, (double)rows * (double)(3 * m.h * d), kv_expand_part, &a);
    return TD_OK;
}

static void kv_reduce_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, kv_reduce_rows_f32, kv_reduce_rows_f64);
}

td_status td__cpu_kv_reduce(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *dqkv, void *draw) {
    /* dqkv (rows, 3 h d) -> draw (rows, (h + 2 kv) d) */
    llama_args a = {.dt = dt, .rows = rows, .map = m, .d = d, .dy = dqkv, .dx = draw};
    run_parts(ctx, (double)rows * (double)(3 * m.h * d), kv_reduce_part, &a);
    return TD_OK;
}
