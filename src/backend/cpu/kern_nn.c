/* Row-wise neural-network kernels: softmax cross-entropy, layer norm,
 * embeddings, pooling and the causal softmax of attention. Written once over
 * the element type in tmpl/ and included here for f32 and f64; rows are
 * split over the device's cores. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"

typedef struct rows_args {
    td_dtype dt;
    int64_t rows, cols;
    double eps, scale, grad_scale;
    const void *x, *g, *b, *m, *r, *dy;
    void *y, *mean, *rstd, *dx;
    const int32_t *labels;
    int64_t bad_row[TD_CPU_MAX_PUS];
    double loss[TD_CPU_MAX_PUS];
    int64_t correct[TD_CPU_MAX_PUS];
    void *partial[TD_CPU_MAX_PUS];
    int failed;
} rows_args;

static int parts_for(void *ctx, double work) {
    return work < 32768 ? 1 : td__cpu_threads(ctx);
}

static void run_parts(void *ctx, double work, td_cpu_part_fn fn, void *arg) {
    if (parts_for(ctx, work) == 1)
        fn(arg, 0, 1);
    else
        td__cpu_parallel(ctx, fn, arg);
}

typedef void (*rows_fn)(rows_args *a, size_t r0, size_t r1);

/* A part's share of the rows, run by f32's or f64's row function. Each
 * caller passes a pair from one template in tmpl/, so this is the whole
 * dtype dispatch; static, it inlines into the callers. */
static void rows_part(void *p, int part, int nparts, rows_fn f32, rows_fn f64) {
    rows_args *a = p;
    size_t r0, r1;
    td__part_range((size_t)a->rows, part, nparts, &r0, &r1);
    if (a->dt == TD_F32)
        f32(a, r0, r1);
    else
        f64(a, r0, r1);
}

/* Softmax cross-entropy -------------------------------------------------------- */

#define T   float
#define SFX f32
#define EXP expf
#define LOG logf
#include "backend/cpu/tmpl/xent.h"
#define T   double
#define SFX f64
#define EXP exp
#define LOG log
#include "backend/cpu/tmpl/xent.h"

static void xent_part(void *p, int part, int nparts) {
    rows_args *a = p;
    size_t r0, r1;
    td__part_range((size_t)a->rows, part, nparts, &r0, &r1);
    a->bad_row[part] = -1;
    if (a->dt == TD_F32)
        xent_rows_f32(a, r0, r1, part);
    else
        xent_rows_f64(a, r0, r1, part);
}

td_status td__cpu_xent(void *ctx, td_dtype dt, int64_t rows, int64_t classes, const void *logits,
                       const int32_t *labels, void *dlogits, double grad_scale, double *loss_sum,
                       int64_t *correct) {
    /* logits, dlogits: (rows, classes); labels (rows) -> *loss_sum, *correct */
    rows_args a = {.dt = dt,
                   .rows = rows,
                   .cols = classes,
                   .x = logits,
                   .labels = labels,
                   .dx = dlogits,
                   .grad_scale = grad_scale};
    int parts = parts_for(ctx, (double)rows * (double)classes);
    *loss_sum = 0;
    *correct = 0;
    if (rows <= 0)
        return TD_OK;
    if (classes <= 0)
        return td__error(TD_ERR_INVALID_ARG, "cross-entropy over %lld classes", (long long)classes);
    run_parts(ctx, (double)rows * (double)classes, xent_part, &a);
    for (int i = 0; i < parts; i++) {
        if (a.bad_row[i] >= 0)
            return td__error(
                TD_ERR_INVALID_ARG, "cross-entropy: label %d at row %lld is outside [0, %lld)",
                (int)labels[a.bad_row[i]], (long long)a.bad_row[i], (long long)classes);
        *loss_sum += a.loss[i];
        *correct += a.correct[i];
    }
    return TD_OK;
}

/* Layer norm -------------------------------------------------------------------- */

#define T    float
#define SFX  f32
#define SQRT sqrtf
#include "backend/cpu/tmpl/layernorm.h"
#define T    double
#define SFX  f64
#define SQRT sqrt
#include "backend/cpu/tmpl/layernorm.h"

static void ln_fwd_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, ln_fwd_rows_f32, ln_fwd_rows_f64);
}

td_status td__cpu_layernorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                                const void *x, const void *gamma, const void *beta, void *y,
                                void *mean, void *rstd) {
    /* x, y: (rows, cols); gamma, beta: (cols); mean, rstd: (rows) */
    rows_args a = {.dt = dt,
                   .rows = rows,
                   .cols = cols,
                   .eps = eps,
                   .x = x,
                   .g = gamma,
                   .b = beta,
                   .y = y,
                   .mean = mean,
                   .rstd = rstd};
    run_parts(ctx, (double)rows * (double)cols, ln_fwd_part, &a);
    return TD_OK;
}

static void ln_bwd_part(void *p, int part, int nparts) {
    rows_args *a = p;
    size_t r0, r1, es = td_dtype_size(a->dt);
    char *buf = td__cpu_scratch(2 * (size_t)a->cols * es);
    a->partial[part] = buf;
    if (!buf) {
        a->failed = 1;
        return;
    }
    memset(buf, 0, 2 * (size_t)a->cols * es);
    td__part_range((size_t)a->rows, part, nparts, &r0, &r1);
    if (a->dt == TD_F32)
        ln_bwd_rows_f32(a, r0, r1, (float *)buf, (float *)buf + a->cols);
    else
        ln_bwd_rows_f64(a, r0, r1, (double *)buf, (double *)buf + a->cols);
}

td_status td__cpu_layernorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                                const void *gamma, const void *mean, const void *rstd,
                                const void *dy, void *dx, void *dgamma, void *dbeta, int acc) {
    /* x, dy, dx: (rows, cols); gamma, dgamma, dbeta: (cols); mean, rstd: (rows) */
    rows_args a = {.dt = dt,
                   .rows = rows,
                   .cols = cols,
                   .x = x,
                   .g = gamma,
                   .m = mean,
                   .r = rstd,
                   .dy = dy,
                   .dx = dx};
    int parts = parts_for(ctx, (double)rows * (double)cols);
    run_parts(ctx, (double)rows * (double)cols, ln_bwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "layer norm backward: no scratch memory");
    for (int64_t j = 0; j < 2 * cols; j++) {
        double s = 0;
        for (int p = 0; p < parts; p++)
            s +=
                dt == TD_F32 ? ((const float *)a.partial[p])[j] : ((const double *)a.partial[p])[j];
        void *dst = j < cols ? dgamma : dbeta;
        int64_t k = j < cols ? j : j - cols;
        if (dt == TD_F32)
            ((float *)dst)[k] = (float)(acc ? ((float *)dst)[k] + s : s);
        else
            ((double *)dst)[k] = acc ? ((double *)dst)[k] + s : s;
    }
    return TD_OK;
}

/* Embeddings ---------------------------------------------------------------------- */

typedef struct embed_args {
    td_dtype dt;
    int64_t b, t, c, vocab;
    const int32_t *tokens;
    const void *wte, *wpe, *dy;
    void *y, *dwte, *dwpe;
    int acc;
    int64_t bad[TD_CPU_MAX_PUS];
} embed_args;

static void embed_fwd_part(void *p, int part, int nparts) {
    /* positions [r0, r1) of tokens (b t) -> y (b t, c) */
    embed_args *a = p;
    size_t r0, r1, es = td_dtype_size(a->dt);
    td__part_range((size_t)(a->b * a->t), part, nparts, &r0, &r1);
    a->bad[part] = -1;
    for (size_t r = r0; r < r1; r++) {
        int32_t tok = a->tokens[r];
        int64_t pos = (int64_t)r % a->t;
        char *y = (char *)a->y + r * (size_t)a->c * es;
        if (tok < 0 || tok >= a->vocab) {
            if (a->bad[part] < 0)
                a->bad[part] = (int64_t)r;
            continue;
        }
        memcpy(y, (const char *)a->wte + (size_t)tok * (size_t)a->c * es, (size_t)a->c * es);
        if (!a->wpe)
            continue;
        for (int64_t j = 0; j < a->c; j++) {
            if (a->dt == TD_F32)
                ((float *)y)[j] += ((const float *)a->wpe)[pos * a->c + j];
            else
                ((double *)y)[j] += ((const double *)a->wpe)[pos * a->c + j];
        }
    }
}

td_status td__cpu_embed_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                            const int32_t *tokens, const void *wte, const void *wpe, void *y) {
    /* tokens (b, t), wte (vocab, c), wpe (>= t, c) -> y (b, t, c) */
    embed_args a = {.dt = dt,
                    .b = b,
                    .t = t,
                    .c = c,
                    .vocab = vocab,
                    .tokens = tokens,
                    .wte = wte,
                    .wpe = wpe,
                    .y = y};
    int parts = parts_for(ctx, (double)(b * t * c));
    run_parts(ctx, (double)(b * t * c), embed_fwd_part, &a);
    for (int i = 0; i < parts; i++)
        if (a.bad[i] >= 0)
            return td__error(TD_ERR_INVALID_ARG,
                             "embedding: token %d at (%lld, %lld) is outside [0, %lld)",
                             (int)tokens[a.bad[i]], (long long)(a.bad[i] / t),
                             (long long)(a.bad[i] % t), (long long)vocab);
    return TD_OK;
}

/* Each part owns a range of channels, so the scatter-add never races. */
static void embed_bwd_part(void *p, int part, int nparts) {
    /* channels [c0, c1) of dwte (vocab, c), dwpe (t, c) from dy (b t, c) */
    embed_args *a = p;
    size_t c0, c1;
    td__part_range((size_t)a->c, part, nparts, &c0, &c1);
    for (int64_t v = 0; !a->acc && v < a->vocab; v++)
        for (size_t j = c0; j < c1; j++) {
            if (a->dt == TD_F32)
                ((float *)a->dwte)[v * a->c + (int64_t)j] = 0;
            else
                ((double *)a->dwte)[v * a->c + (int64_t)j] = 0;
        }
    for (int64_t pos = 0; a->dwpe && !a->acc && pos < a->t; pos++)
        for (size_t j = c0; j < c1; j++) {
            if (a->dt == TD_F32)
                ((float *)a->dwpe)[pos * a->c + (int64_t)j] = 0;
            else
                ((double *)a->dwpe)[pos * a->c + (int64_t)j] = 0;
        }
    for (int64_t r = 0; r < a->b * a->t; r++) {
        int64_t tok = a->tokens[r], pos = r % a->t;
        if (tok < 0 || tok >= a->vocab)
            continue;
        for (size_t j = c0; j < c1; j++) {
            if (a->dt == TD_F32) {
                float g = ((const float *)a->dy)[r * a->c + (int64_t)j];
                ((float *)a->dwte)[tok * a->c + (int64_t)j] += g;
                if (a->dwpe)
                    ((float *)a->dwpe)[pos * a->c + (int64_t)j] += g;
            } else {
                double g = ((const double *)a->dy)[r * a->c + (int64_t)j];
                ((double *)a->dwte)[tok * a->c + (int64_t)j] += g;
                if (a->dwpe)
                    ((double *)a->dwpe)[pos * a->c + (int64_t)j] += g;
            }
        }
    }
}

td_status td__cpu_embed_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                            const int32_t *tokens, const void *dy, void *dwte, void *dwpe,
                            int acc) {
    /* tokens (b, t), dy (b, t, c) -> dwte (vocab, c), dwpe (>= t, c) */
    embed_args a = {.dt = dt,
                    .b = b,
                    .t = t,
                    .c = c,
                    .vocab = vocab,
                    .tokens = tokens,
                    .dy = dy,
                    .dwte = dwte,
                    .dwpe = dwpe,
                    .acc = acc};
    run_parts(ctx, (double)(b * t * c) + (double)(vocab * c), embed_bwd_part, &a);
    return TD_OK;
}

/* Pooling ------------------------------------------------------------------------- */

typedef struct pool_args {
    td_dtype dt;
    td_pool_kind kind;
    const td_conv_desc *d;
    const void *x, *dy;
    void *y, *dx;
    int32_t *argmax;
    const int32_t *cargmax;
} pool_args;

#define T   float
#define SFX f32
#include "backend/cpu/tmpl/pool.h"
#define T   double
#define SFX f64
#include "backend/cpu/tmpl/pool.h"

/* The common 2x2 max-pool with stride 2 and no padding, f32. */
static void maxpool2_planes_f32(pool_args *a, size_t p0, size_t p1) {
    /* planes [p0, p1) of x (n c, h, w) -> y, argmax: (n c, oh, ow) */
    const td_conv_desc *d = a->d;
    int64_t hw = d->h * d->w, ohw = d->oh * d->ow;
    for (size_t pl = p0; pl < p1; pl++) {
        const float *x = (const float *)a->x + (int64_t)pl * hw;
        float *y = (float *)a->y + (int64_t)pl * ohw;
        int32_t *am = a->argmax ? a->argmax + (int64_t)pl * ohw : NULL;
        for (int64_t oi = 0; oi < d->oh; oi++) {
            const float *r0 = x + 2 * oi * d->w, *r1 = r0 + d->w;
            for (int64_t oj = 0; oj < d->ow; oj++) {
                /* selects rather than branches: on real data the winner is a coin toss */
                int64_t j = 2 * oj, top = 2 * oi * d->w + j, bot = top + d->w;
                float a0 = r0[j], a1 = r0[j + 1], a2 = r1[j], a3 = r1[j + 1];
                int up = a1 > a0, dn = a3 > a2;
                float mu = up ? a1 : a0, md = dn ? a3 : a2;
                int64_t iu = top + up, id = bot + dn;
                int lower = md > mu;
                float best = lower ? md : mu;
                int64_t at = lower ? id : iu;
                y[oi * d->ow + oj] = best;
                if (am)
                    am[oi * d->ow + oj] = (int32_t)at;
            }
        }
    }
}

static void pool_fwd_part(void *p, int part, int nparts) {
    pool_args *a = p;
    size_t p0, p1;
    const td_conv_desc *d = a->d;
    td__part_range((size_t)(a->d->n * a->d->c), part, nparts, &p0, &p1);
    if (a->dt == TD_F32 && a->kind == TD_POOL_MAX && d->kh == 2 && d->kw == 2 && d->stride == 2 &&
        d->pad == 0) {
        maxpool2_planes_f32(a, p0, p1);
        return;
    }
    if (a->dt == TD_F32)
        pool_fwd_planes_f32(a, p0, p1);
    else
        pool_fwd_planes_f64(a, p0, p1);
}

static void pool_bwd_part(void *p, int part, int nparts) {
    pool_args *a = p;
    size_t p0, p1;
    td__part_range((size_t)(a->d->n * a->d->c), part, nparts, &p0, &p1);
    if (a->dt == TD_F32)
        pool_bwd_planes_f32(a, p0, p1);
    else
        pool_bwd_planes_f64(a, p0, p1);
}

td_status td__cpu_pool_fwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                           const void *x, void *y, int32_t *argmax) {
    /* x (n, c, h, w) -> y, argmax: (n, c, oh, ow) */
    pool_args a = {dt, kind, d, x, NULL, y, NULL, argmax, NULL};
    run_parts(ctx, (double)(d->n * d->c * d->h * d->w), pool_fwd_part, &a);
    return TD_OK;
}

td_status td__cpu_pool_bwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                           const void *dy, const int32_t *argmax, void *dx) {
    /* dy, argmax: (n, c, oh, ow) -> dx (n, c, h, w) */
    pool_args a = {dt, kind, d, NULL, dy, NULL, dx, NULL, argmax};
    if (kind == TD_POOL_MAX && !argmax)
        return td__error(TD_ERR_INVALID_ARG, "max-pool backward without the forward's arg-max");
    run_parts(ctx, (double)(d->n * d->c * d->h * d->w), pool_bwd_part, &a);
    return TD_OK;
}

/* Causal softmax ------------------------------------------------------------------ */

#define T   float
#define SFX f32
#define EXP expf
#include "backend/cpu/tmpl/causal_softmax.h"
#define T   double
#define SFX f64
#define EXP exp
#include "backend/cpu/tmpl/causal_softmax.h"

static void csm_fwd_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, csm_fwd_rows_f32, csm_fwd_rows_f64);
}

static void csm_bwd_part(void *p, int part, int nparts) {
    rows_part(p, part, nparts, csm_bwd_rows_f32, csm_bwd_rows_f64);
}

td_status td__cpu_causal_softmax_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                     const void *s, void *p) {
    /* s, p: (rows, t, t) */
    rows_args a = {.dt = dt, .rows = rows * t, .cols = t, .scale = scale, .x = s, .y = p};
    run_parts(ctx, (double)(rows * t * t), csm_fwd_part, &a);
    return TD_OK;
}

td_status td__cpu_causal_softmax_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                     const void *p, const void *dp, void *ds) {
    /* p, dp, ds: (rows, t, t) */
    rows_args a = {
        .dt = dt, .rows = rows * t, .cols = t, .scale = scale, .x = p, .dy = dp, .dx = ds};
    run_parts(ctx, (double)(rows * t * t), csm_bwd_part, &a);
    return TD_OK;
}
