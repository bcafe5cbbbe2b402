/* Max and average pooling over planes, written once over the element type T and compiled by
 * kern_nn.c for each (T, SFX). Not a header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(pool_fwd_planes)(pool_args *a, size_t p0, size_t p1) {
    /* planes [p0, p1) of x (n c, h, w) -> y, argmax: (n c, oh, ow) */
    const td_conv_desc *d = a->d;
    int64_t hw = d->h * d->w, ohw = d->oh * d->ow;
    T inv = (T)1 / (T)(d->kh * d->kw);
    for (size_t pl = p0; pl < p1; pl++) {
        const T *x = (const T *)a->x + (int64_t)pl * hw;
        T *y = (T *)a->y + (int64_t)pl * ohw;
        int32_t *am = a->argmax ? a->argmax + (int64_t)pl * ohw : NULL;
        for (int64_t oi = 0; oi < d->oh; oi++) {
            int64_t i0 = oi * d->stride - d->pad;
            int64_t ia = i0 < 0 ? 0 : i0, ib = i0 + d->kh > d->h ? d->h : i0 + d->kh;
            for (int64_t oj = 0; oj < d->ow; oj++) {
                int64_t j0 = oj * d->stride - d->pad;
                int64_t ja = j0 < 0 ? 0 : j0, jb = j0 + d->kw > d->w ? d->w : j0 + d->kw;
                T best = x[ia * d->w + ja], sum = 0;
                int64_t where = ia * d->w + ja;
                for (int64_t ii = ia; ii < ib; ii++)
                    for (int64_t jj = ja; jj < jb; jj++) {
                        T v = x[ii * d->w + jj];
                        sum += v;
                        if (v > best) {
                            best = v;
                            where = ii * d->w + jj;
                        }
                    }
                if (a->kind == TD_POOL_MAX) {
                    y[oi * d->ow + oj] = best;
                    if (am)
                        am[oi * d->ow + oj] = (int32_t)where;
                } else {
                    y[oi * d->ow + oj] = sum * inv;
                }
            }
        }
    }
}
static void TD_T_NAME(pool_bwd_planes)(pool_args *a, size_t p0, size_t p1) {
    /* planes [p0, p1) of dy, argmax: (n c, oh, ow) -> dx (n c, h, w) */
    const td_conv_desc *d = a->d;
    int64_t hw = d->h * d->w, ohw = d->oh * d->ow;
    for (size_t pl = p0; pl < p1; pl++) {
        const T *dy = (const T *)a->dy + (int64_t)pl * ohw;
        T *dx = (T *)a->dx + (int64_t)pl * hw;
        memset(dx, 0, sizeof(T) * (size_t)hw);
        if (a->kind == TD_POOL_MAX) {
            const int32_t *am = a->cargmax + (int64_t)pl * ohw;
            for (int64_t o = 0; o < ohw; o++)
                if (am[o] >= 0)
                    dx[am[o]] += dy[o];
            continue;
        }
        for (int64_t oi = 0; oi < d->oh; oi++)
            for (int64_t oj = 0; oj < d->ow; oj++) {
                int64_t i0 = oi * d->stride - d->pad, j0 = oj * d->stride - d->pad;
                T g = dy[oi * d->ow + oj] / (T)(d->kh * d->kw);
                for (int64_t ki = 0; ki < d->kh; ki++)
                    for (int64_t kj = 0; kj < d->kw; kj++) {
                        int64_t ii = i0 + ki, jj = j0 + kj;
                        if (ii >= 0 && ii < d->h && jj >= 0 && jj < d->w)
                            dx[ii * d->w + jj] += g;
                    }
            }
    }
}

#undef T
#undef SFX
