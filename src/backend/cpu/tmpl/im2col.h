/* im2col and col2im for the convolutions, written once over the element type T and compiled by
 * kern_gemm.c for each (T, SFX). Not a header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(im2col)(const td_conv_desc *d, const T *x, T *col, int64_t ld) {
    /* x (c, h, w) -> col (c kh kw, oh ow), rows ld apart */
    for (int64_t ci = 0; ci < d->c; ci++)
        for (int64_t ki = 0; ki < d->kh; ki++)
            for (int64_t kj = 0; kj < d->kw; kj++) {
                T *row = col + ((ci * d->kh + ki) * d->kw + kj) * ld;
                const T *plane = x + ci * d->h * d->w;
                int64_t lo, hi;
                valid_cols(d, kj, &lo, &hi);
                for (int64_t oi = 0; oi < d->oh; oi++) {
                    int64_t ii = oi * d->stride - d->pad + ki;
                    T *restrict out = row + oi * d->ow;
                    const T *restrict in = plane + ii * d->w;
                    if (ii < 0 || ii >= d->h) {
                        memset(out, 0, sizeof(T) * (size_t)d->ow);
                        continue;
                    }
                    for (int64_t oj = 0; oj < lo; oj++)
                        out[oj] = 0;
                    /* plain loops: rows are short, a memcpy call costs more */
                    if (d->stride == 1)
                        for (int64_t oj = lo; oj < hi; oj++)
                            out[oj] = in[oj + (kj - d->pad)];
                    else
                        for (int64_t oj = lo; oj < hi; oj++)
                            out[oj] = in[oj * d->stride + kj - d->pad];
                    for (int64_t oj = hi; oj < d->ow; oj++)
                        out[oj] = 0;
                }
            }
}
/* dx (c, h, w) = the sum of col's entries back at their pixels (overwritten). */
static void TD_T_NAME(col2im)(const td_conv_desc *d, const T *col, int64_t ld, T *x) {
    /* col (c kh kw, oh ow), rows ld apart -> x (c, h, w), summed */
    memset(x, 0, sizeof(T) * (size_t)(d->c * d->h * d->w));
    for (int64_t ci = 0; ci < d->c; ci++)
        for (int64_t ki = 0; ki < d->kh; ki++)
            for (int64_t kj = 0; kj < d->kw; kj++) {
                const T *row = col + ((ci * d->kh + ki) * d->kw + kj) * ld;
                T *plane = x + ci * d->h * d->w;
                int64_t lo, hi;
                valid_cols(d, kj, &lo, &hi);
                for (int64_t oi = 0; oi < d->oh; oi++) {
                    int64_t ii = oi * d->stride - d->pad + ki;
                    const T *in = row + oi * d->ow;
                    T *out = plane + ii * d->w;
                    if (ii < 0 || ii >= d->h)
                        continue;
                    if (d->stride == 1)
                        for (int64_t oj = lo; oj < hi; oj++)
                            out[oj + kj - d->pad] += in[oj];
                    else
                        for (int64_t oj = lo; oj < hi; oj++)
                            out[oj * d->stride + kj - d->pad] += in[oj];
                }
            }
}

#undef T
#undef SFX
