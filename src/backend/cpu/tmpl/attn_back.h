/* The attention softmax's backward over rows, written once over the element type T and compiled by
 * kern_attn.c for each (T, SFX). Not a header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

/* dp (t, t) becomes scale * p * (dp - rowsum(p dp)). */
static void TD_T_NAME(softmax_back_rows)(const T *p, T *dp, int64_t t, T scale) {
    /* p, dp: (t, t) */
    for (int64_t i = 0; i < t; i++) {
        const T *pr = p + i * t;
        T *dr = dp + i * t, dot = 0;
        for (int64_t j = 0; j <= i; j++)
            dot += pr[j] * dr[j];
        for (int64_t j = 0; j <= i; j++)
            dr[j] = scale * pr[j] * (dr[j] - dot);
        for (int64_t j = i + 1; j < t; j++)
            dr[j] = 0;
    }
}

#undef T
#undef SFX
