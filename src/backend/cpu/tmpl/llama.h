/* The Llama family's row kernels (RMSNorm, the SwiGLU gate, rotary position
 * embedding, grouped-query head expansion), written once over the element
 * type T and compiled by kern_llama.c for each (T, SFX, SQRT, EXP,
 * SILU_GATE). Not a
 * header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(rms_fwd_rows)(llama_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of x, y: (rows, cols); w: (cols); rstd: (rows) */
    int64_t c = a->cols;
    const T *w = a->w;
    for (size_t r = r0; r < r1; r++) {
        const T *x = (const T *)a->x + (int64_t)r * c;
        T *y = (T *)a->y + (int64_t)r * c;
        T ss = 0, ps[16] = {0}, rs;
        int64_t j0 = c / 16 * 16;
        /* 16 partial sums, so the compiler can vectorise the reduction */
        for (int64_t j = 0; j < j0; j += 16)
            for (int q = 0; q < 16; q++)
                ps[q] += x[j + q] * x[j + q];
        for (int64_t j = j0; j < c; j++)
            ss += x[j] * x[j];
        for (int q = 0; q < 16; q++)
            ss += ps[q];
        rs = (T)1 / SQRT(ss / (T)c + (T)a->eps);
        for (int64_t j = 0; j < c; j++)
            y[j] = x[j] * rs * w[j];
        ((T *)a->rstd)[r] = rs;
    }
}

/* dx = r (dy w - x r^2 mean(dy w x)); dw (this part's sums) += dy x r. */
static void TD_T_NAME(rms_bwd_rows)(llama_args *a, size_t r0, size_t r1, T *dw) {
    /* rows [r0, r1) of x, dy, dx: (rows, cols); w, dw: (cols); rstd: (rows) */
    int64_t c = a->cols;
    const T *w = a->w;
    for (size_t r = r0; r < r1; r++) {
        const T *x = (const T *)a->x + (int64_t)r * c;
        const T *dy = (const T *)a->dy + (int64_t)r * c;
        T rs = ((const T *)a->rstd_in)[r], dot = 0;
        for (int64_t j = 0; j < c; j++) {
            dot += dy[j] * w[j] * x[j];
            dw[j] += dy[j] * x[j] * rs;
        }
        dot /= (T)c;
        if (a->dx) {
            T *dx = (T *)a->dx + (int64_t)r * c;
            for (int64_t j = 0; j < c; j++)
                dx[j] = rs * (dy[j] * w[j] - x[j] * rs * rs * dot);
        }
    }
}

/* h = silu(g) u = g u / (1 + exp(-g)), g and u the halves of a gu row. */
static void TD_T_NAME(swiglu_fwd_rows)(llama_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of gu (rows, 2f), h (rows, f) */
    int64_t f = a->cols;
    for (size_t r = r0; r < r1; r++) {
        const T *g = (const T *)a->x + (int64_t)r * 2 * f, *u = g + f;
        T *h = (T *)a->y + (int64_t)r * f;
        SILU_GATE((size_t)f, g, u, h);
    }
}

/* dg = dh u s (1 + g (1 - s)), du = dh g s, with s = sigmoid(g). */
static void TD_T_NAME(swiglu_bwd_rows)(llama_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of gu, dgu (rows, 2f), dh (rows, f) */
    int64_t f = a->cols;
    for (size_t r = r0; r < r1; r++) {
        const T *g = (const T *)a->x + (int64_t)r * 2 * f, *u = g + f;
        const T *dh = (const T *)a->dy + (int64_t)r * f;
        T *dg = (T *)a->dx + (int64_t)r * 2 * f, *du = dg + f;
        for (int64_t j = 0; j < f; j++) {
            T s = (T)1 / ((T)1 + EXP(-g[j])), gj = g[j], uj = u[j];
            dg[j] = dh[j] * uj * s * ((T)1 + gj * ((T)1 - s));
            du[j] = dh[j] * gj * s;
        }
    }
}

/* Each head's pairs (j, j + d/2) rotated by the angle of the row's position:
 * x' = x cos - y sin, y' = y cos + x sin (sin negated for the inverse). */
static void TD_T_NAME(rope_rows)(llama_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of x (b t, ld); tab (2, npos, d/2): cos rows, then sin rows */
    int64_t half = a->d / 2;
    const T *cs = a->w, *sn = (const T *)a->w + a->npos * half;
    T sign = a->inverse ? (T)-1 : (T)1;
    for (size_t r = r0; r < r1; r++) {
        int64_t pos = a->pos0 + (int64_t)r % a->t;
        const T *c = cs + pos * half, *s = sn + pos * half;
        T *row = (T *)a->y + (int64_t)r * a->ld + a->col;
        for (int64_t h = 0; h < a->heads; h++) {
            T *x = row + h * a->d, *y = x + half;
            for (int64_t j = 0; j < half; j++) {
                T xj = x[j], yj = y[j], sj = sign * s[j];
                x[j] = xj * c[j] - yj * sj;
                y[j] = yj * c[j] + xj * sj;
            }
        }
    }
}

/* raw (rows, (h + 2 kv) d) to qkv (rows, 3 h d): query head i keeps its
 * place and gets key and value head (i + skew) / g (td_kv_map). */
static void TD_T_NAME(kv_expand_rows)(llama_args *a, size_t r0, size_t r1) {
    int64_t h = a->map.h, kv = a->map.kv, d = a->d, wr = (h + 2 * kv) * d, c = h * d;
    for (size_t r = r0; r < r1; r++) {
        const T *raw = (const T *)a->x + (int64_t)r * wr;
        T *qkv = (T *)a->y + (int64_t)r * 3 * c;
        memcpy(qkv, raw, sizeof(T) * (size_t)c);
        for (int64_t i = 0; i < h; i++) {
            int64_t j = (i + a->map.skew) / a->map.g;
            memcpy(qkv + c + i * d, raw + c + j * d, sizeof(T) * (size_t)d);
            memcpy(qkv + 2 * c + i * d, raw + c + (kv + j) * d, sizeof(T) * (size_t)d);
        }
    }
}

/* The expansion's backward: each key and value head's gradient is the sum
 * over its query heads, in head order. */
static void TD_T_NAME(kv_reduce_rows)(llama_args *a, size_t r0, size_t r1) {
    int64_t h = a->map.h, kv = a->map.kv, d = a->d, wr = (h + 2 * kv) * d, c = h * d;
    for (size_t r = r0; r < r1; r++) {
        const T *dqkv = (const T *)a->dy + (int64_t)r * 3 * c;
        T *draw = (T *)a->dx + (int64_t)r * wr;
        memcpy(draw, dqkv, sizeof(T) * (size_t)c);
        for (int64_t j = 0; j < 2 * kv; j++) {
            /* j < kv: key head j; else value head j - kv; its query heads [lo, hi) */
            int64_t head = j < kv ? j : j - kv, lo, hi;
            const T *src = dqkv + (j < kv ? c : 2 * c);
            T *dst = draw + c + j * d;
            td__kv_queries(a->map, head, &lo, &hi);
            for (int64_t e = 0; e < d; e++) {
                T s = 0;
                for (int64_t k = lo; k < hi; k++)
                    s += src[k * d + e];
                dst[e] = s;
            }
        }
    }
}

#undef T
#undef SQRT
#undef EXP
#undef SILU_GATE
#undef SFX
