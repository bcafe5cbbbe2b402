/* The scalar elementwise kernels and optimizers, written once over the element type T and compiled
 * by kern_elem.c for each (T, SFX, EXP, CDF, TANH). Not a header to include elsewhere. */
/* The tanh approximation of GELU: sqrt(2/pi) and the cubic's coefficient. */
#ifndef GELU_K
#define GELU_K ((T)0.79788456080286535588)
#define GELU_C ((T)0.044715)
#endif
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(act_fwd)(td_act act, size_t n, const T *x, T *y) {
    /* x, y: (n) */
    for (size_t i = 0; i < n; i++) {
        T v = x[i];
        switch (act) {
        case TD_ACT_RELU: y[i] = v > 0 ? v : (T)0; break;
        case TD_ACT_GELU: y[i] = v * CDF(v); break;
        case TD_ACT_TANH: y[i] = TANH(v); break;
        case TD_ACT_SIGMOID: y[i] = (T)1 / ((T)1 + EXP(-v)); break;
        case TD_ACT_GELU_TANH:
            y[i] = (T)0.5 * v * ((T)1 + TANH(GELU_K * (v + GELU_C * v * v * v)));
            break;
        }
    }
}
static void TD_T_NAME(act_bwd)(td_act act, size_t n, const T *x, const T *y, const T *dy, T *dx) {
    /* x, y, dy, dx: (n) */
    for (size_t i = 0; i < n; i++) {
        T v = x[i], d = 0;
        switch (act) {
        case TD_ACT_RELU: d = v > 0 ? (T)1 : (T)0; break;
        case TD_ACT_GELU: d = CDF(v) + v * EXP((T)-0.5 * v * v) * (T)0.39894228040143267794; break;
        case TD_ACT_TANH: d = (T)1 - y[i] * y[i]; break;
        case TD_ACT_SIGMOID: d = y[i] * ((T)1 - y[i]); break;
        case TD_ACT_GELU_TANH: {
            T t = TANH(GELU_K * (v + GELU_C * v * v * v));
            d = (T)0.5 * ((T)1 + t) +
                (T)0.5 * v * ((T)1 - t * t) * GELU_K * ((T)1 + (T)3 * GELU_C * v * v);
            break;
        }
        }
        dx[i] = dy[i] * d;
    }
}
static void TD_T_NAME(add)(size_t n, const T *a, const T *b, T *y) {
    /* a, b, y: (n) */
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}
static void TD_T_NAME(axpby)(size_t n, T alpha, const T *x, T beta, T *y) {
    /* x, y: (n) */
    if (beta == 0)
        for (size_t i = 0; i < n; i++)
            y[i] = alpha * x[i];
    else
        for (size_t i = 0; i < n; i++)
            y[i] = alpha * x[i] + beta * y[i];
}
static void TD_T_NAME(sumsq)(size_t n, const T *x, double *out) {
    /* x (n) -> *out */
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    *out = s;
}
static void TD_T_NAME(adamw)(size_t n, T *w, const T *g, T *m, T *v, const td_opt_args *o) {
    /* w, g, m, v: (n) */
    T decay = (T)(1.0 - o->lr * o->weight_decay), b1 = (T)o->beta1, b2 = (T)o->beta2;
    T c1 = (T)(1.0 - o->beta1), c2 = (T)(1.0 - o->beta2), gm = (T)o->grad_mul;
    T step = (T)(-o->lr / o->bias_corr1), isq2 = (T)(1.0 / sqrt(o->bias_corr2));
    T eps = (T)o->eps;
    for (size_t i = 0; i < n; i++) {
        T gi = g[i] * gm;
        T mi = b1 * m[i] + c1 * gi;
        T vi = b2 * v[i] + c2 * (gi * gi);
        T denom = (T)sqrt((double)vi) * isq2 + eps;
        m[i] = mi;
        v[i] = vi;
        w[i] = step * (mi / denom) + w[i] * decay;
    }
}
static void TD_T_NAME(sgd)(size_t n, T *w, const T *g, T *buf, const td_opt_args *o) {
    /* w, g, buf: (n) */
    T gm = (T)o->grad_mul, wd = (T)o->weight_decay, mom = (T)o->momentum, nlr = (T)-o->lr;
    for (size_t i = 0; i < n; i++) {
        T gi = wd * w[i] + g[i] * gm;
        if (buf) {
            T b = o->first ? gi : mom * buf[i] + gi;
            buf[i] = b;
            gi = o->nesterov ? mom * b + gi : b;
        }
        w[i] = nlr * gi + w[i];
    }
}

#undef T
#undef EXP
#undef CDF
#undef TANH
#undef SFX
