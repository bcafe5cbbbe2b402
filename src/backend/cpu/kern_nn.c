/* Row-wise neural-network kernels: softmax cross-entropy, layer norm,
 * embeddings, pooling and the causal softmax of attention. Written once per
 * element type through macros; rows are split over the device's cores. */
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

/* A part's share of the rows, run by the element type's function NAME_rows_T. */
#define DEFINE_ROWS_PART(NAME)                                                                     \
    static void NAME##_part(void *p, int part, int nparts) {                                       \
        rows_args *a = p;                                                                          \
        size_t r0, r1;                                                                             \
        td__part_range((size_t)a->rows, part, nparts, &r0, &r1);                                   \
        if (a->dt == TD_F32)                                                                       \
            NAME##_rows_f32(a, r0, r1);                                                            \
        else                                                                                       \
            NAME##_rows_f64(a, r0, r1);                                                            \
    }

/* Softmax cross-entropy -------------------------------------------------------- */

#define DEFINE_XENT(T, sfx, EXP, LOG)                                                              \
    static void xent_rows_##sfx(rows_args *a, size_t r0, size_t r1, int part) {                    \
        const T *x = a->x;                                                                         \
        T *d = a->dx;                                                                              \
        int64_t c = a->cols;                                                                       \
        double loss = 0;                                                                           \
        int64_t correct = 0;                                                                       \
        for (size_t r = r0; r < r1; r++) {                                                         \
            const T *row = x + (int64_t)r * c;                                                     \
            int32_t label = a->labels[r];                                                          \
            int64_t arg = 0;                                                                       \
            T mx = row[0];                                                                         \
            double sum = 0;                                                                        \
            if (label < 0 || label >= c) {                                                         \
                if (a->bad_row[part] < 0)                                                          \
                    a->bad_row[part] = (int64_t)r;                                                 \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t j = 1; j < c; j++)                                                        \
                if (row[j] > mx) {                                                                 \
                    mx = row[j];                                                                   \
                    arg = j;                                                                       \
                }                                                                                  \
            if (d) {                                                                               \
                T *drow = d + (int64_t)r * c;                                                      \
                T inv, gs = (T)a->grad_scale;                                                      \
                for (int64_t j = 0; j < c; j++) {                                                  \
                    drow[j] = EXP(row[j] - mx);                                                    \
                    sum += drow[j];                                                                \
                }                                                                                  \
                inv = (T)(1.0 / sum) * gs;                                                         \
                for (int64_t j = 0; j < c; j++)                                                    \
                    drow[j] *= inv;                                                                \
                drow[label] -= gs;                                                                 \
            } else {                                                                               \
                for (int64_t j = 0; j < c; j++)                                                    \
                    sum += EXP(row[j] - mx);                                                       \
            }                                                                                      \
            loss += log(sum) - (double)(row[label] - mx);                                          \
            correct += arg == label;                                                               \
        }                                                                                          \
        a->loss[part] = loss;                                                                      \
        a->correct[part] = correct;                                                                \
    }

DEFINE_XENT(float, f32, expf, logf)
DEFINE_XENT(double, f64, exp, log)

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

#define DEFINE_LN(T, sfx, SQRT)                                                                    \
    static void ln_fwd_rows_##sfx(rows_args *a, size_t r0, size_t r1) {                            \
        int64_t c = a->cols;                                                                       \
        const T *g = a->g, *bt = a->b;                                                             \
        for (size_t r = r0; r < r1; r++) {                                                         \
            const T *x = (const T *)a->x + (int64_t)r * c;                                         \
            T *y = (T *)a->y + (int64_t)r * c;                                                     \
            T mu = 0, var = 0, rs, ps[16] = {0}, pv[16] = {0};                                     \
            int64_t j0 = c / 16 * 16;                                                              \
            /* 16 partial sums, so the compiler can vectorise the reductions */                    \
            for (int64_t j = 0; j < j0; j += 16)                                                   \
                for (int q = 0; q < 16; q++)                                                       \
                    ps[q] += x[j + q];                                                             \
            for (int64_t j = j0; j < c; j++)                                                       \
                mu += x[j];                                                                        \
            for (int q = 0; q < 16; q++)                                                           \
                mu += ps[q];                                                                       \
            mu /= (T)c;                                                                            \
            for (int64_t j = 0; j < j0; j += 16)                                                   \
                for (int q = 0; q < 16; q++)                                                       \
                    pv[q] += (x[j + q] - mu) * (x[j + q] - mu);                                    \
            for (int64_t j = j0; j < c; j++)                                                       \
                var += (x[j] - mu) * (x[j] - mu);                                                  \
            for (int q = 0; q < 16; q++)                                                           \
                var += pv[q];                                                                      \
            var /= (T)c;                                                                           \
            rs = (T)1 / SQRT(var + (T)a->eps);                                                     \
            for (int64_t j = 0; j < c; j++)                                                        \
                y[j] = (x[j] - mu) * rs * g[j] + bt[j];                                            \
            ((T *)a->mean)[r] = mu;                                                                \
            ((T *)a->rstd)[r] = rs;                                                                \
        }                                                                                          \
    }                                                                                              \
    /* dx only; the parameter sums are done per part into partial buffers. */                      \
    static void ln_bwd_rows_##sfx(rows_args *a, size_t r0, size_t r1, T *dg, T *db) {              \
        int64_t c = a->cols;                                                                       \
        const T *g = a->g;                                                                         \
        for (size_t r = r0; r < r1; r++) {                                                         \
            const T *x = (const T *)a->x + (int64_t)r * c;                                         \
            const T *dy = (const T *)a->dy + (int64_t)r * c;                                       \
            T mu = ((const T *)a->m)[r], rs = ((const T *)a->r)[r];                                \
            T sum_dn = 0, sum_dn_n = 0, pa[16] = {0}, pb[16] = {0};                                \
            int64_t j0 = c / 16 * 16;                                                              \
            for (int64_t j = 0; j < j0; j += 16)                                                   \
                for (int q = 0; q < 16; q++) {                                                     \
                    T n = (x[j + q] - mu) * rs;                                                    \
                    T dn = dy[j + q] * g[j + q];                                                   \
                    pa[q] += dn;                                                                   \
                    pb[q] += dn * n;                                                               \
                    dg[j + q] += dy[j + q] * n;                                                    \
                    db[j + q] += dy[j + q];                                                        \
                }                                                                                  \
            for (int64_t j = j0; j < c; j++) {                                                     \
                T n = (x[j] - mu) * rs;                                                            \
                T dn = dy[j] * g[j];                                                               \
                sum_dn += dn;                                                                      \
                sum_dn_n += dn * n;                                                                \
                dg[j] += dy[j] * n;                                                                \
                db[j] += dy[j];                                                                    \
            }                                                                                      \
            for (int q = 0; q < 16; q++) {                                                         \
                sum_dn += pa[q];                                                                   \
                sum_dn_n += pb[q];                                                                 \
            }                                                                                      \
            sum_dn /= (T)c;                                                                        \
            sum_dn_n /= (T)c;                                                                      \
            if (a->dx) {                                                                           \
                T *dx = (T *)a->dx + (int64_t)r * c;                                               \
                for (int64_t j = 0; j < c; j++) {                                                  \
                    T n = (x[j] - mu) * rs;                                                        \
                    dx[j] = (dy[j] * g[j] - sum_dn - n * sum_dn_n) * rs;                           \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

DEFINE_LN(float, f32, sqrtf)
DEFINE_LN(double, f64, sqrt)

DEFINE_ROWS_PART(ln_fwd)

td_status td__cpu_layernorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                                const void *x, const void *gamma, const void *beta, void *y,
                                void *mean, void *rstd) {
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

#define DEFINE_POOL(T, sfx)                                                                        \
    static void pool_fwd_planes_##sfx(pool_args *a, size_t p0, size_t p1) {                        \
        const td_conv_desc *d = a->d;                                                              \
        int64_t hw = d->h * d->w, ohw = d->oh * d->ow;                                             \
        T inv = (T)1 / (T)(d->kh * d->kw);                                                         \
        for (size_t pl = p0; pl < p1; pl++) {                                                      \
            const T *x = (const T *)a->x + (int64_t)pl * hw;                                       \
            T *y = (T *)a->y + (int64_t)pl * ohw;                                                  \
            int32_t *am = a->argmax ? a->argmax + (int64_t)pl * ohw : NULL;                        \
            for (int64_t oi = 0; oi < d->oh; oi++) {                                               \
                int64_t i0 = oi * d->stride - d->pad;                                              \
                int64_t ia = i0 < 0 ? 0 : i0, ib = i0 + d->kh > d->h ? d->h : i0 + d->kh;          \
                for (int64_t oj = 0; oj < d->ow; oj++) {                                           \
                    int64_t j0 = oj * d->stride - d->pad;                                          \
                    int64_t ja = j0 < 0 ? 0 : j0, jb = j0 + d->kw > d->w ? d->w : j0 + d->kw;      \
                    T best = x[ia * d->w + ja], sum = 0;                                           \
                    int64_t where = ia * d->w + ja;                                                \
                    for (int64_t ii = ia; ii < ib; ii++)                                           \
                        for (int64_t jj = ja; jj < jb; jj++) {                                     \
                            T v = x[ii * d->w + jj];                                               \
                            sum += v;                                                              \
                            if (v > best) {                                                        \
                                best = v;                                                          \
                                where = ii * d->w + jj;                                            \
                            }                                                                      \
                        }                                                                          \
                    if (a->kind == TD_POOL_MAX) {                                                  \
                        y[oi * d->ow + oj] = best;                                                 \
                        if (am)                                                                    \
                            am[oi * d->ow + oj] = (int32_t)where;                                  \
                    } else {                                                                       \
                        y[oi * d->ow + oj] = sum * inv;                                            \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void pool_bwd_planes_##sfx(pool_args *a, size_t p0, size_t p1) {                        \
        const td_conv_desc *d = a->d;                                                              \
        int64_t hw = d->h * d->w, ohw = d->oh * d->ow;                                             \
        for (size_t pl = p0; pl < p1; pl++) {                                                      \
            const T *dy = (const T *)a->dy + (int64_t)pl * ohw;                                    \
            T *dx = (T *)a->dx + (int64_t)pl * hw;                                                 \
            memset(dx, 0, sizeof(T) * (size_t)hw);                                                 \
            if (a->kind == TD_POOL_MAX) {                                                          \
                const int32_t *am = a->cargmax + (int64_t)pl * ohw;                                \
                for (int64_t o = 0; o < ohw; o++)                                                  \
                    if (am[o] >= 0)                                                                \
                        dx[am[o]] += dy[o];                                                        \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t oi = 0; oi < d->oh; oi++)                                                 \
                for (int64_t oj = 0; oj < d->ow; oj++) {                                           \
                    int64_t i0 = oi * d->stride - d->pad, j0 = oj * d->stride - d->pad;            \
                    T g = dy[oi * d->ow + oj] / (T)(d->kh * d->kw);                                \
                    for (int64_t ki = 0; ki < d->kh; ki++)                                         \
                        for (int64_t kj = 0; kj < d->kw; kj++) {                                   \
                            int64_t ii = i0 + ki, jj = j0 + kj;                                    \
                            if (ii >= 0 && ii < d->h && jj >= 0 && jj < d->w)                      \
                                dx[ii * d->w + jj] += g;                                           \
                        }                                                                          \
                }                                                                                  \
        }                                                                                          \
    }

DEFINE_POOL(float, f32)
DEFINE_POOL(double, f64)

/* The common 2x2 max-pool with stride 2 and no padding, f32. */
static void maxpool2_planes_f32(pool_args *a, size_t p0, size_t p1) {
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
    pool_args a = {dt, kind, d, x, NULL, y, NULL, argmax, NULL};
    run_parts(ctx, (double)(d->n * d->c * d->h * d->w), pool_fwd_part, &a);
    return TD_OK;
}

td_status td__cpu_pool_bwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                           const void *dy, const int32_t *argmax, void *dx) {
    pool_args a = {dt, kind, d, NULL, dy, NULL, dx, NULL, argmax};
    if (kind == TD_POOL_MAX && !argmax)
        return td__error(TD_ERR_INVALID_ARG, "max-pool backward without the forward's arg-max");
    run_parts(ctx, (double)(d->n * d->c * d->h * d->w), pool_bwd_part, &a);
    return TD_OK;
}

/* Causal softmax ------------------------------------------------------------------ */

#define DEFINE_CSM(T, sfx, EXP)                                                                    \
    static void csm_fwd_rows_##sfx(rows_args *a, size_t r0, size_t r1) {                           \
        int64_t t = a->cols;                                                                       \
        T sc = (T)a->scale;                                                                        \
        for (size_t r = r0; r < r1; r++) {                                                         \
            int64_t i = (int64_t)r % t; /* row within its (t, t) matrix */                         \
            const T *s = (const T *)a->x + (int64_t)r * t;                                         \
            T *p = (T *)a->y + (int64_t)r * t;                                                     \
            T mx = s[0], sum = 0, inv;                                                             \
            for (int64_t j = 1; j <= i; j++)                                                       \
                mx = s[j] > mx ? s[j] : mx;                                                        \
            for (int64_t j = 0; j <= i; j++) {                                                     \
                p[j] = EXP(sc * (s[j] - mx));                                                      \
                sum += p[j];                                                                       \
            }                                                                                      \
            inv = (T)1 / sum;                                                                      \
            for (int64_t j = 0; j <= i; j++)                                                       \
                p[j] *= inv;                                                                       \
            for (int64_t j = i + 1; j < t; j++)                                                    \
                p[j] = 0;                                                                          \
        }                                                                                          \
    }                                                                                              \
    static void csm_bwd_rows_##sfx(rows_args *a, size_t r0, size_t r1) {                           \
        int64_t t = a->cols;                                                                       \
        T sc = (T)a->scale;                                                                        \
        for (size_t r = r0; r < r1; r++) {                                                         \
            int64_t i = (int64_t)r % t;                                                            \
            const T *p = (const T *)a->x + (int64_t)r * t;                                         \
            const T *dp = (const T *)a->dy + (int64_t)r * t;                                       \
            T *ds = (T *)a->dx + (int64_t)r * t;                                                   \
            T dot = 0;                                                                             \
            for (int64_t j = 0; j <= i; j++)                                                       \
                dot += p[j] * dp[j];                                                               \
            for (int64_t j = 0; j <= i; j++)                                                       \
                ds[j] = sc * p[j] * (dp[j] - dot);                                                 \
            for (int64_t j = i + 1; j < t; j++)                                                    \
                ds[j] = 0;                                                                         \
        }                                                                                          \
    }

DEFINE_CSM(float, f32, expf)
DEFINE_CSM(double, f64, exp)

DEFINE_ROWS_PART(csm_fwd)

DEFINE_ROWS_PART(csm_bwd)

td_status td__cpu_causal_softmax_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                     const void *s, void *p) {
    rows_args a = {.dt = dt, .rows = rows * t, .cols = t, .scale = scale, .x = s, .y = p};
    run_parts(ctx, (double)(rows * t * t), csm_fwd_part, &a);
    return TD_OK;
}

td_status td__cpu_causal_softmax_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                     const void *p, const void *dp, void *ds) {
    rows_args a = {
        .dt = dt, .rows = rows * t, .cols = t, .scale = scale, .x = p, .dy = dp, .dx = ds};
    run_parts(ctx, (double)(rows * t * t), csm_bwd_part, &a);
    return TD_OK;
}
