/* Layer norm over rows, forward and backward, written once over the element type T and compiled by
 * kern_nn.c for each (T, SFX, SQRT). Not a header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(ln_fwd_rows)(rows_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of x, y: (rows, cols); g, b: (cols); mean, rstd: (rows) */
    int64_t c = a->cols;
    const T *g = a->g, *bt = a->b;
    for (size_t r = r0; r < r1; r++) {
        const T *x = (const T *)a->x + (int64_t)r * c;
        T *y = (T *)a->y + (int64_t)r * c;
        T mu = 0, var = 0, rs, ps[16] = {0}, pv[16] = {0};
        int64_t j0 = c / 16 * 16;
        /* 16 partial sums, so the compiler can vectorise the reductions */
        for (int64_t j = 0; j < j0; j += 16)
            for (int q = 0; q < 16; q++)
                ps[q] += x[j + q];
        for (int64_t j = j0; j < c; j++)
            mu += x[j];
        for (int q = 0; q < 16; q++)
            mu += ps[q];
        mu /= (T)c;
        for (int64_t j = 0; j < j0; j += 16)
            for (int q = 0; q < 16; q++)
                pv[q] += (x[j + q] - mu) * (x[j + q] - mu);
        for (int64_t j = j0; j < c; j++)
            var += (x[j] - mu) * (x[j] - mu);
        for (int q = 0; q < 16; q++)
            var += pv[q];
        var /= (T)c;
        rs = (T)1 / SQRT(var + (T)a->eps);
        for (int64_t j = 0; j < c; j++)
            y[j] = (x[j] - mu) * rs * g[j] + bt[j];
        ((T *)a->mean)[r] = mu;
        ((T *)a->rstd)[r] = rs;
    }
}
/* dx only; the parameter sums are done per part into partial buffers. */
static void TD_T_NAME(ln_bwd_rows)(rows_args *a, size_t r0, size_t r1, T *dg, T *db) {
    /* rows [r0, r1) of x, dy, dx: (rows, cols); g, dg, db: (cols); m, r: (rows) */
    int64_t c = a->cols;
    const T *g = a->g;
    for (size_t r = r0; r < r1; r++) {
        const T *x = (const T *)a->x + (int64_t)r * c;
        const T *dy = (const T *)a->dy + (int64_t)r * c;
        T mu = ((const T *)a->m)[r], rs = ((const T *)a->r)[r];
        T sum_dn = 0, sum_dn_n = 0, pa[16] = {0}, pb[16] = {0};
        int64_t j0 = c / 16 * 16;
        for (int64_t j = 0; j < j0; j += 16)
            for (int q = 0; q < 16; q++) {
                T n = (x[j + q] - mu) * rs;
                T dn = dy[j + q] * g[j + q];
                pa[q] += dn;
                pb[q] += dn * n;
                dg[j + q] += dy[j + q] * n;
                db[j + q] += dy[j + q];
            }
        for (int64_t j = j0; j < c; j++) {
            T n = (x[j] - mu) * rs;
            T dn = dy[j] * g[j];
            sum_dn += dn;
            sum_dn_n += dn * n;
            dg[j] += dy[j] * n;
            db[j] += dy[j];
        }
        for (int q = 0; q < 16; q++) {
            sum_dn += pa[q];
            sum_dn_n += pb[q];
        }
        sum_dn /= (T)c;
        sum_dn_n /= (T)c;
        if (a->dx) {
            T *dx = (T *)a->dx + (int64_t)r * c;
            for (int64_t j = 0; j < c; j++) {
                T n = (x[j] - mu) * rs;
                dx[j] = (dy[j] * g[j] - sum_dn - n * sum_dn_n) * rs;
            }
        }
    }
}

#undef T
#undef SQRT
#undef SFX
