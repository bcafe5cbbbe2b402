/* The f32 elementwise kernels written once over a few vector macros and
 * compiled twice by kern_elem.c: for AVX2 + FMA and for AVX-512F. Each
 * function takes [0, n) and leaves the tail that does not fill a vector to
 * the scalar code. Not a header to include elsewhere. */

#define TD_CAT2(a, b) a##b
#define TD_CAT(a, b)  TD_CAT2(a, b)
#define FN(name)      TD_CAT(name, SFX)

/* e^x for |x| < 88: 2^n * e^r with r in [-ln2/2, ln2/2] and a degree-6
 * polynomial (Cephes), relative error about 2e-7. */
static inline V FN(vexp)(V x) {
    V n, r, p;
    x = VMIN(VMAX(x, VSET1(-87.3f)), VSET1(88.3f));
    n = VROUND(VMUL(x, VSET1(1.44269504088896341f)));
    r = VFMA(n, VSET1(-0.693359375f), x);
    r = VFMA(n, VSET1(2.12194440e-4f), r);
    p = VSET1(1.9875691500E-4f);
    p = VFMA(p, r, VSET1(1.3981999507E-3f));
    p = VFMA(p, r, VSET1(8.3334519073E-3f));
    p = VFMA(p, r, VSET1(4.1665795894E-2f));
    p = VFMA(p, r, VSET1(1.6666665459E-1f));
    p = VFMA(p, r, VSET1(5.0000001201E-1f));
    p = VFMA(p, VMUL(r, r), VADD(r, VSET1(1.0f)));
    return VMUL(p, VPOW2I(n));
}

/* Phi(x) = 0.5 erfc(-x / sqrt 2), through the Numerical Recipes erfc
 * (fractional error below 1.2e-7 everywhere), so small tails keep their
 * relative accuracy. Also returns phi(x) = exp(-x^2/2) / sqrt(2 pi). */
static inline V FN(vphi)(V x, V *density) {
    V z = VMUL(VABS(x), VSET1(0.70710678118654752f));
    V t = VDIV(VSET1(1.0f), VFMA(z, VSET1(0.5f), VSET1(1.0f)));
    V p = VSET1(0.17087277f);
    V e, half_erfc;
    p = VFMA(p, t, VSET1(-0.82215223f));
    p = VFMA(p, t, VSET1(1.48851587f));
    p = VFMA(p, t, VSET1(-1.13520398f));
    p = VFMA(p, t, VSET1(0.27886807f));
    p = VFMA(p, t, VSET1(-0.18628806f));
    p = VFMA(p, t, VSET1(0.09678418f));
    p = VFMA(p, t, VSET1(0.37409196f));
    p = VFMA(p, t, VSET1(1.00002368f));
    p = VFMA(p, t, VSET1(-1.26551223f));
    e = FN(vexp)(VNEG(VMUL(z, z)));
    if (density)
        *density = VMUL(e, VSET1(0.39894228040143268f));
    /* erfc(z) = t exp(-z^2 + p); exp(-z^2 + p) = e * exp(p) */
    half_erfc = VMUL(VMUL(VSET1(0.5f), t), VMUL(e, FN(vexp)(p)));
    /* x < 0: Phi = erfc/2; else 1 - erfc/2 */
    return VSELNEG(x, half_erfc, VSUB(VSET1(1.0f), half_erfc));
}

static size_t FN(add)(size_t n, const float *a, const float *b, float *y) {
    size_t i = 0;
    for (; i + W <= n; i += W)
        VSTORE(y + i, VADD(VLOAD(a + i), VLOAD(b + i)));
    return i;
}

static size_t FN(axpby)(size_t n, float alpha, const float *x, float beta, float *y) {
    size_t i = 0;
    V va = VSET1(alpha), vb = VSET1(beta);
    if (beta == 0.0f)
        for (; i + W <= n; i += W)
            VSTORE(y + i, VMUL(va, VLOAD(x + i)));
    else
        for (; i + W <= n; i += W)
            VSTORE(y + i, VFMA(va, VLOAD(x + i), VMUL(vb, VLOAD(y + i))));
    return i;
}

static size_t FN(relu_fwd)(size_t n, const float *x, float *y) {
    size_t i = 0;
    V z = VSET1(0.0f);
    for (; i + W <= n; i += W)
        VSTORE(y + i, VMAX(VLOAD(x + i), z));
    return i;
}

static size_t FN(relu_bwd)(size_t n, const float *x, const float *dy, float *dx) {
    size_t i = 0;
    for (; i + W <= n; i += W)
        VSTORE(dx + i, VGTZ_SEL(VLOAD(x + i), VLOAD(dy + i)));
    return i;
}

/* h = silu(g) u = g u / (1 + e^-g) (SwiGLU's gate). */
static size_t FN(silu_gate)(size_t n, const float *g, const float *u, float *h) {
    size_t i = 0;
    for (; i + W <= n; i += W) {
        V v = VLOAD(g + i);
        V e = FN(vexp)(VNEG(v));
        VSTORE(h + i, VDIV(VMUL(v, VLOAD(u + i)), VADD(VSET1(1.0f), e)));
    }
    return i;
}

static size_t FN(gelu_fwd)(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + W <= n; i += W) {
        V v = VLOAD(x + i);
        VSTORE(y + i, VMUL(v, FN(vphi)(v, NULL)));
    }
    return i;
}

static size_t FN(gelu_bwd)(size_t n, const float *x, const float *dy, float *dx) {
    size_t i = 0;
    for (; i + W <= n; i += W) {
        V v = VLOAD(x + i), dens;
        V cdf = FN(vphi)(v, &dens);
        VSTORE(dx + i, VMUL(VLOAD(dy + i), VFMA(v, dens, cdf)));
    }
    return i;
}

static size_t FN(bias_rows)(size_t n, float *y, const float *b) {
    size_t i = 0;
    for (; i + W <= n; i += W)
        VSTORE(y + i, VADD(VLOAD(y + i), VLOAD(b + i)));
    return i;
}

static size_t FN(add_scalar)(size_t n, float *y, float b) {
    size_t i = 0;
    V vb = VSET1(b);
    for (; i + W <= n; i += W)
        VSTORE(y + i, VADD(VLOAD(y + i), vb));
    return i;
}

/* Sums 8 * W squares at a time into a float vector, and blocks into a double. */
static size_t FN(sumsq)(size_t n, const float *x, double *out) {
    size_t i = 0;
    double total = 0;
    while (i + W <= n) {
        V acc = VSET1(0.0f);
        size_t end = i + 1024 < n ? i + 1024 : n;
        for (; i + W <= end; i += W) {
            V v = VLOAD(x + i);
            acc = VFMA(v, v, acc);
        }
        total += (double)VHSUM(acc);
    }
    *out = total;
    return i;
}

static size_t FN(adamw)(size_t n, float *w, const float *g, float *m, float *v,
                        const td_opt_args *o) {
    size_t i = 0;
    V decay = VSET1((float)(1.0 - o->lr * o->weight_decay));
    V b1 = VSET1((float)o->beta1), b2 = VSET1((float)o->beta2);
    V c1 = VSET1((float)(1.0 - o->beta1)), c2 = VSET1((float)(1.0 - o->beta2));
    V gm = VSET1((float)o->grad_mul);
    V step = VSET1((float)(-o->lr / o->bias_corr1));
    V isq2 = VSET1((float)(1.0 / sqrt(o->bias_corr2)));
    V eps = VSET1((float)o->eps);
    for (; i + W <= n; i += W) {
        V gi = VMUL(VLOAD(g + i), gm);
        V mi = VFMA(b1, VLOAD(m + i), VMUL(c1, gi));
        V vi = VFMA(b2, VLOAD(v + i), VMUL(c2, VMUL(gi, gi)));
        V denom = VFMA(VSQRT(vi), isq2, eps);
        V wi = VMUL(VLOAD(w + i), decay);
        VSTORE(m + i, mi);
        VSTORE(v + i, vi);
        VSTORE(w + i, VFMA(step, VDIV(mi, denom), wi));
    }
    return i;
}

static size_t FN(sgd)(size_t n, float *w, const float *g, float *buf, const td_opt_args *o) {
    size_t i = 0;
    V gm = VSET1((float)o->grad_mul), wd = VSET1((float)o->weight_decay);
    V mom = VSET1((float)o->momentum), nlr = VSET1((float)-o->lr);
    for (; i + W <= n; i += W) {
        V wi = VLOAD(w + i);
        V gi = VFMA(wd, wi, VMUL(VLOAD(g + i), gm));
        if (buf) {
            V b = o->first ? gi : VFMA(mom, VLOAD(buf + i), gi);
            VSTORE(buf + i, b);
            gi = o->nesterov ? VFMA(mom, b, gi) : b;
        }
        VSTORE(w + i, VFMA(nlr, gi, wi));
    }
    return i;
}

/* row[0:n] = softmax(scale * row) in place: max, exp and sum, scale. */
static size_t FN(softmax_row)(size_t n, float *row, float scale, double *sum_out) {
    size_t i = 0;
    float mx = row[0], sum = 0, inv;
    V vmx = VSET1(row[0]), vsum = VSET1(0.0f), vs = VSET1(scale), vneg;
    for (; i + W <= n; i += W)
        vmx = VMAX(vmx, VLOAD(row + i));
    mx = VHMAX(vmx);
    for (; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    vneg = VSET1(-mx * scale);
    for (i = 0; i + W <= n; i += W) {
        V e = FN(vexp)(VFMA(VLOAD(row + i), vs, vneg));
        VSTORE(row + i, e);
        vsum = VADD(vsum, e);
    }
    sum = VHSUM(vsum);
    for (; i < n; i++) {
        row[i] = expf(scale * (row[i] - mx));
        sum += row[i];
    }
    inv = 1.0f / sum;
    for (i = 0; i + W <= n; i += W)
        VSTORE(row + i, VMUL(VLOAD(row + i), VSET1(inv)));
    for (; i < n; i++)
        row[i] *= inv;
    if (sum_out)
        *sum_out = sum;
    return n;
}

#undef FN
#undef TD_CAT
#undef TD_CAT2
