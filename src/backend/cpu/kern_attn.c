/* Fused causal self-attention: each of the device's cores takes whole
 * (sample, head) pairs and runs their GEMMs, softmax and backward in its own
 * caches, one dispatch per layer instead of several per sample. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"

typedef struct attn_args {
    cpu_device *cd;
    td_dtype dt;
    int64_t b, t, c, h;
    double scale;
    const char *qkv, *p, *dy;
    char *pw, *y, *dqkv;
    int failed;
} attn_args;

/* Row i of p (t, t) = softmax over j <= i of p's raw scores, zeros after
 * (f64; f32 rows go through td__cpu_softmax_row_f32, vectorised). */
static void softmax_rows_f64(double *p, int64_t t) {
    /* p (t, t), in place */
    for (int64_t i = 0; i < t; i++) {
        double *row = p + i * t, mx = row[0], sum = 0, inv;
        for (int64_t j = 1; j <= i; j++)
            mx = row[j] > mx ? row[j] : mx;
        for (int64_t j = 0; j <= i; j++) {
            row[j] = exp(row[j] - mx);
            sum += row[j];
        }
        inv = 1.0 / sum;
        for (int64_t j = 0; j <= i; j++)
            row[j] *= inv;
        for (int64_t j = i + 1; j < t; j++)
            row[j] = 0;
    }
}

#define T   float
#define SFX f32
#include "backend/cpu/tmpl/attn_back.h"
#define T   double
#define SFX f64
#include "backend/cpu/tmpl/attn_back.h"

static void attn_fwd_part(void *arg, int part, int nparts) {
    /* this part's (image, head) pairs: qkv (b, t, 3c) -> p (b, h, t, t), y (b, t, c) */
    attn_args *a = arg;
    size_t es = td_dtype_size(a->dt), p0, p1;
    int64_t t = a->t, c = a->c, d = c / a->h;
    td__part_range((size_t)(a->b * a->h), part, nparts, &p0, &p1);
    for (size_t pair = p0; pair < p1; pair++) {
        int64_t bi = (int64_t)pair / a->h, hi = (int64_t)pair % a->h;
        const char *q = a->qkv + (size_t)(bi * t * 3 * c + hi * d) * es;
        const char *k = q + (size_t)c * es, *v = q + (size_t)(2 * c) * es;
        char *p = a->pw + pair * (size_t)(t * t) * es;
        char *y = a->y + (size_t)(bi * t * c + hi * d) * es;
        /* p (t, t) = scale q (t, d) k^T, then the causal softmax in place */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 0, 1, t, t, d, a->scale, q, 3 * c, k, 3 * c, 0.0, p,
                                t)) {
            a->failed = 1;
            return;
        }
        if (a->dt == TD_F32) {
            for (int64_t i = 0; i < t; i++) {
                float *row = (float *)p + i * t;
                td__cpu_softmax_row_f32(row, (size_t)(i + 1), 1.0f);
                memset(row + i + 1, 0, sizeof(float) * (size_t)(t - i - 1));
            }
        } else {
            softmax_rows_f64((double *)p, t);
        }
        /* y (t, d) = p v */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 0, 0, t, d, t, 1.0, p, t, v, 3 * c, 0.0, y, c)) {
            a->failed = 1;
            return;
        }
    }
}

td_status td__cpu_attention_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, void *p, void *y) {
    /* qkv (b, t, 3c), h heads of c/h -> p (b, h, t, t), y (b, t, c) */
    attn_args a = {.cd = ctx,
                   .dt = dt,
                   .b = b,
                   .t = t,
                   .c = c,
                   .h = h,
                   .scale = scale,
                   .qkv = qkv,
                   .pw = p,
                   .y = y};
    td__cpu_parallel(ctx, attn_fwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "attention: no memory for bf16 products");
    return TD_OK;
}

static void attn_bwd_part(void *arg, int part, int nparts) {
    /* this part's (image, head) pairs: qkv, dqkv (b, t, 3c); p (b, h, t, t); dy (b, t, c) */
    attn_args *a = arg;
    size_t es = td_dtype_size(a->dt), p0, p1;
    int64_t t = a->t, c = a->c, d = c / a->h;
    char *dp = td__cpu_scratch((size_t)(t * t) * es);
    td__part_range((size_t)(a->b * a->h), part, nparts, &p0, &p1);
    if (!dp) {
        a->failed = 1;
        return;
    }
    for (size_t pair = p0; pair < p1; pair++) {
        int64_t bi = (int64_t)pair / a->h, hi = (int64_t)pair % a->h;
        size_t off = (size_t)(bi * t * 3 * c + hi * d) * es;
        const char *q = a->qkv + off, *k = q + (size_t)c * es, *v = q + (size_t)(2 * c) * es;
        char *dq = a->dqkv + off, *dk = dq + (size_t)c * es, *dv = dq + (size_t)(2 * c) * es;
        const char *p = a->p + pair * (size_t)(t * t) * es;
        const char *dy = a->dy + (size_t)(bi * t * c + hi * d) * es;
        /* dp (t, t) = dy (t, d) v^T; dv (t, d) = p^T dy */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 0, 1, t, t, d, 1.0, dy, c, v, 3 * c, 0.0, dp, t) ||
            !td__cpu_gemm_inner(a->cd, a->dt, 1, 0, t, d, t, 1.0, p, t, dy, c, 0.0, dv, 3 * c)) {
            a->failed = 1;
            return;
        }
        if (a->dt == TD_F32)
            softmax_back_rows_f32((const float *)p, (float *)dp, t, (float)a->scale);
        else
            softmax_back_rows_f64((const double *)p, (double *)dp, t, a->scale);
        /* dq = ds k; dk = ds^T q */
        if (!td__cpu_gemm_inner(a->cd, a->dt, 0, 0, t, d, t, 1.0, dp, t, k, 3 * c, 0.0, dq,
                                3 * c) ||
            !td__cpu_gemm_inner(a->cd, a->dt, 1, 0, t, d, t, 1.0, dp, t, q, 3 * c, 0.0, dk,
                                3 * c)) {
            a->failed = 1;
            return;
        }
    }
}

td_status td__cpu_attention_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, const void *p, const void *dy,
                                void *dqkv) {
    /* qkv (b, t, 3c), p (b, h, t, t), dy (b, t, c) -> dqkv (b, t, 3c) */
    attn_args a = {.cd = ctx,
                   .dt = dt,
                   .b = b,
                   .t = t,
                   .c = c,
                   .h = h,
                   .scale = scale,
                   .qkv = qkv,
                   .p = p,
                   .dy = dy,
                   .dqkv = dqkv};
    td__cpu_parallel(ctx, attn_bwd_part, &a);
    if (a.failed)
        return td__error(TD_ERR_OUT_OF_MEMORY, "attention backward: no scratch memory");
    return TD_OK;
}
