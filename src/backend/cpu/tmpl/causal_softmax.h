/* The causal softmax over rows, forward and backward, written once over the element type T and
 * compiled by kern_nn.c for each (T, SFX, EXP). Not a header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(csm_fwd_rows)(rows_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of x = s, y = p: (rows, cols = t) */
    int64_t t = a->cols;
    T sc = (T)a->scale;
    for (size_t r = r0; r < r1; r++) {
        int64_t i = (int64_t)r % t; /* row within its (t, t) matrix */
        const T *s = (const T *)a->x + (int64_t)r * t;
        T *p = (T *)a->y + (int64_t)r * t;
        T mx = s[0], sum = 0, inv;
        for (int64_t j = 1; j <= i; j++)
            mx = s[j] > mx ? s[j] : mx;
        for (int64_t j = 0; j <= i; j++) {
            p[j] = EXP(sc * (s[j] - mx));
            sum += p[j];
        }
        inv = (T)1 / sum;
        for (int64_t j = 0; j <= i; j++)
            p[j] *= inv;
        for (int64_t j = i + 1; j < t; j++)
            p[j] = 0;
    }
}
static void TD_T_NAME(csm_bwd_rows)(rows_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of x = p, dy = dp, dx = ds: (rows, cols = t) */
    int64_t t = a->cols;
    T sc = (T)a->scale;
    for (size_t r = r0; r < r1; r++) {
        int64_t i = (int64_t)r % t;
        const T *p = (const T *)a->x + (int64_t)r * t;
        const T *dp = (const T *)a->dy + (int64_t)r * t;
        T *ds = (T *)a->dx + (int64_t)r * t;
        T dot = 0;
        for (int64_t j = 0; j <= i; j++)
            dot += p[j] * dp[j];
        for (int64_t j = 0; j <= i; j++)
            ds[j] = sc * p[j] * (dp[j] - dot);
        for (int64_t j = i + 1; j < t; j++)
            ds[j] = 0;
    }
}

#undef T
#undef EXP
#undef SFX
