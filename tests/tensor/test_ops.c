/* Tensor ops against plain references computed here in f64: GEMM against a
 * triple loop, convolution and pooling against direct loops, the row kernels
 * against their textbook formulas, and every elementwise op of every SIMD
 * path. The whole suite runs at the CPU's best SIMD level and again, in child
 * processes, with TANDEM_SIMD=scalar and TANDEM_SIMD=avx2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu/cpu-impl.h"
#include "support/support.h"
#include "tensor/ops.h"

static td_device_list *g_list;

static td_tensor *make(td_dtype dt, int ndim, const int64_t *shape) {
    td_tensor *t = NULL;
    TD_ASSERT_OK(td_tensor_create(td_device_list_get(g_list, 0), dt, ndim, shape, &t));
    return t;
}

static td_tensor *make_rand(td_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    td_tensor *t = make(dt, ndim, shape);
    TD_ASSERT_OK(td_tensor_rand_normal(t, seed, 0, 0.0, 1.0));
    return t;
}

static double *host(const td_tensor *t) {
    double *v = malloc(sizeof(double) * (td_tensor_numel(t) + 1));
    TD_ASSERT_OK(td_tensor_read_f64(t, v, td_tensor_numel(t)));
    return v;
}

/* max |a - ref| / (tol_scale) must be <= tol. */
static void expect_close(const char *what, const double *a, const double *ref, size_t n,
                         double tol) {
    double worst = 0, scale = 1e-30;
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs(a[i] - ref[i]) / fmax(fabs(ref[i]), 1e-2 * scale);
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (!(worst <= tol))
        fail_msg("%s: relative error %.3g at %zu (%.9g, expected %.9g), tolerance %.1g", what,
                 worst, at, a[at], ref[at], tol);
}

static double tol_for(td_dtype dt) {
    return dt == TD_F32 ? 2e-5 : 1e-12;
}

/* Runs fn(arg) on the device thread and fails on its status. */
typedef td_status (*body_fn)(void *arg);
typedef struct body {
    body_fn fn;
    void *arg;
} body;
static td_status body_task(td_device *dev, void *arg) {
    body *b = arg;
    return b->fn(b->arg);
}
/* The status of the body comes back with its message on this thread. */
static td_status on_device(body_fn fn, void *arg) {
    body b = {fn, arg};
    return td_device_run(td_device_list_get(g_list, 0), body_task, &b);
}

/* GEMM ---------------------------------------------------------------------------- */

typedef struct gemm_case {
    td_dtype dt;
    int ta, tb;
    int64_t m, n, k;
    double alpha, beta;
    td_tensor *a, *b, *c;
    td_status st;
} gemm_case;

static td_status gemm_body(void *p) {
    gemm_case *g = p;
    return g->st = td__op_matmul(g->c, g->a, g->ta, g->b, g->tb, g->alpha, g->beta);
}

static void gemm_matches_triple_loop(void **state) {
    /* one-row products (1, n, k) take the CPU's gemv path: a k that is not
     * a whole vector, rows left over from blocks of four, split over cores */
    static const int64_t sizes[][3] = {{1, 1, 1},      {7, 5, 3},     {33, 17, 65},  {130, 70, 33},
                                       {300, 257, 64}, {64, 700, 90}, {48, 96, 420}, {1, 37, 19},
                                       {1, 1003, 77},  {1, 70, 1100}};
    for (int dti = 0; dti < 2; dti++)
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
            for (int t = 0; t < 4; t++) {
                gemm_case g;
                int64_t m = sizes[s][0], n = sizes[s][1], k = sizes[s][2];
                int64_t as[2], bs[2], cs[2] = {m, n};
                double *a, *b, *c0, *c, *ref;
                char what[96];
                memset(&g, 0, sizeof g);
                g.dt = dti ? TD_F64 : TD_F32;
                g.ta = t & 1;
                g.tb = t >> 1;
                g.alpha = 0.75;
                g.beta = s % 2 ? 0.5 : 0.0;
                as[0] = g.ta ? k : m;
                as[1] = g.ta ? m : k;
                bs[0] = g.tb ? n : k;
                bs[1] = g.tb ? k : n;
                g.a = make_rand(g.dt, 2, as, 1 + s);
                g.b = make_rand(g.dt, 2, bs, 2 + s);
                g.c = make_rand(g.dt, 2, cs, 3 + s);
                a = host(g.a);
                b = host(g.b);
                c0 = host(g.c);
                ref = malloc(sizeof(double) * (size_t)(m * n));
                for (int64_t i = 0; i < m; i++)
                    for (int64_t j = 0; j < n; j++) {
                        double sum = 0;
                        for (int64_t l = 0; l < k; l++)
                            sum += (g.ta ? a[l * m + i] : a[i * k + l]) *
                                   (g.tb ? b[j * k + l] : b[l * n + j]);
                        ref[i * n + j] = g.alpha * sum + g.beta * c0[i * n + j];
                    }
                (void)on_device(gemm_body, &g);
                TD_ASSERT_OK(g.st);
                c = host(g.c);
                snprintf(what, sizeof what, "gemm %s %c%c %lldx%lldx%lld", td_dtype_name(g.dt),
                         g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', (long long)m, (long long)n,
                         (long long)k);
                /* sums of k products: error grows like sqrt(k) eps */
                expect_close(what, c, ref, (size_t)(m * n), tol_for(g.dt) * 10);
                free(a);
                free(b);
                free(c0);
                free(c);
                free(ref);
                td_tensor_destroy(g.a);
                td_tensor_destroy(g.b);
                td_tensor_destroy(g.c);
            }
}

static void gemm_refuses_bad_shapes(void **state) {
    gemm_case g;
    int64_t as[2] = {3, 4}, bs[2] = {5, 6}, cs[2] = {3, 6};
    memset(&g, 0, sizeof g);
    g.a = make(TD_F32, 2, as);
    g.b = make(TD_F32, 2, bs);
    g.c = make(TD_F32, 2, cs);
    g.alpha = 1;
    (void)on_device(gemm_body, &g);
    assert_int_equal(g.st, TD_ERR_SHAPE);
    td_test_assert_message_contains("(3, 4) x (5, 6)");
    /* off the device thread */
    TD_ASSERT_STATUS(td__op_matmul(g.c, g.a, 0, g.b, 0, 1, 0), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("host thread");
    td_tensor_destroy(g.a);
    td_tensor_destroy(g.b);
    td_tensor_destroy(g.c);
}

typedef struct batched_case {
    td_tensor *a, *b, *c;
    int64_t batch;
    td_status st;
} batched_case;

static td_status batched_body(void *p) {
    batched_case *g = p;
    /* c_i (4, 3) = a_i (4, 5) b_i^T, a_i every 20 elements, b_i (3, 5) with row stride 6 */
    td_gemm_operand a = {g->a, 0, 5, 20}, b = {g->b, 1, 6, 18}, c = {g->c, 0, 3, 12};
    return g->st = td__op_gemm_batched(0, 1, 4, 3, 5, 1.0, a, b, 0.0, c, g->batch);
}

static void gemm_batched_matches_loop(void **state) {
    int64_t an = 20 * 5, bn = 18 * 5, cn = 12 * 5;
    batched_case g = {make_rand(TD_F64, 1, &an, 4), make_rand(TD_F64, 1, &bn, 5),
                      make(TD_F64, 1, &cn), 5, TD_OK};
    double *a = host(g.a), *b = host(g.b), *c, ref[60];
    (void)on_device(batched_body, &g);
    TD_ASSERT_OK(g.st);
    c = host(g.c);
    for (int i = 0; i < 5; i++)
        for (int r = 0; r < 4; r++)
            for (int j = 0; j < 3; j++) {
                double s = 0;
                for (int l = 0; l < 5; l++)
                    s += a[i * 20 + r * 5 + l] * b[1 + i * 18 + j * 6 + l];
                ref[i * 12 + r * 3 + j] = s;
            }
    expect_close("gemm_batched", c, ref, 60, 1e-12);
    /* one more matrix would reach past the tensors */
    g.batch = 6;
    (void)on_device(batched_body, &g);
    assert_int_equal(g.st, TD_ERR_SHAPE);
    free(a);
    free(b);
    free(c);
    td_tensor_destroy(g.a);
    td_tensor_destroy(g.b);
    td_tensor_destroy(g.c);
}

/* Elementwise ---------------------------------------------------------------------- */

static double act_ref(td_act act, double x) {
    switch (act) {
    case TD_ACT_RELU: return x > 0 ? x : 0;
    case TD_ACT_GELU: return 0.5 * x * erfc(-x / sqrt(2.0));
    case TD_ACT_TANH: return tanh(x);
    case TD_ACT_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    default: return 1 / (1 + exp(-x));
    }
}

static double act_deriv_ref(td_act act, double x) {
    double s;
    switch (act) {
    case TD_ACT_RELU: return x > 0 ? 1 : 0;
    case TD_ACT_GELU: return 0.5 * erfc(-x / sqrt(2.0)) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
    case TD_ACT_TANH: return 1 - tanh(x) * tanh(x);
    case TD_ACT_GELU_TANH:
        s = tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + s) + 0.5 * x * (1 - s * s) * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
    default: s = 1 / (1 + exp(-x)); return s * (1 - s);
    }
}

typedef struct elem_case {
    td_act act;
    td_tensor *x, *y, *dy, *dx, *w, *g, *m, *v;
    double sumsq;
    td_opt_args o;
    int which;
    td_status st;
} elem_case;

static td_status elem_body(void *p) {
    elem_case *e = p;
    switch (e->which) {
    case 0:
        if ((e->st = td__op_act_fwd(e->act, e->x, e->y)) == TD_OK)
            e->st = td__op_act_bwd(e->act, e->x, e->y, e->dy, e->dx);
        break;
    case 1:
        if ((e->st = td__op_add(e->x, e->dy, e->y)) == TD_OK &&
            (e->st = td__op_axpby(0.5, e->x, -2.0, e->dy)) == TD_OK)
            e->st = td__op_sumsq(e->x, &e->sumsq);
        break;
    case 2: e->st = td__op_adamw(e->w, e->g, e->m, e->v, &e->o); break;
    case 3: e->st = td__op_sgd(e->w, e->g, e->m, &e->o); break;
    }
    return e->st;
}

static void activations_match_reference(void **state) {
    static const int64_t sizes[] = {1, 13, 1000 + 13, 100003};
    for (int dti = 0; dti < 2; dti++)
        for (size_t s = 0; s < 4; s++)
            for (int act = 0; act <= TD_ACT_GELU_TANH; act++) {
                td_dtype dt = dti ? TD_F64 : TD_F32;
                int64_t n = sizes[s];
                elem_case e;
                double *x, *dy, *y, *dx, *ry, *rdx;
                char what[64];
                memset(&e, 0, sizeof e);
                e.act = (td_act)act;
                e.x = make(dt, 1, &n);
                /* spread over [-6, 6] to reach the tails */
                TD_ASSERT_OK(td_tensor_rand_uniform(e.x, 21 + s, 0, -6.0, 6.0));
                e.dy = make_rand(dt, 1, &n, 22);
                e.y = make(dt, 1, &n);
                e.dx = make(dt, 1, &n);
                x = host(e.x);
                dy = host(e.dy);
                (void)on_device(elem_body, &e);
                TD_ASSERT_OK(e.st);
                y = host(e.y);
                dx = host(e.dx);
                ry = malloc(sizeof(double) * (size_t)n);
                rdx = malloc(sizeof(double) * (size_t)n);
                for (int64_t i = 0; i < n; i++) {
                    ry[i] = act_ref(e.act, x[i]);
                    rdx[i] = dy[i] * act_deriv_ref(e.act, x[i]);
                }
                snprintf(what, sizeof what, "act %d fwd %s n=%lld", act, td_dtype_name(dt),
                         (long long)n);
                expect_close(what, y, ry, (size_t)n, dt == TD_F32 ? 1e-5 : 1e-12);
                snprintf(what, sizeof what, "act %d bwd %s n=%lld", act, td_dtype_name(dt),
                         (long long)n);
                expect_close(what, dx, rdx, (size_t)n, dt == TD_F32 ? 1e-4 : 1e-12);
                free(x);
                free(dy);
                free(y);
                free(dx);
                free(ry);
                free(rdx);
                td_tensor_destroy(e.x);
                td_tensor_destroy(e.y);
                td_tensor_destroy(e.dy);
                td_tensor_destroy(e.dx);
            }
}

static void add_axpby_sumsq_match_reference(void **state) {
    static const int64_t sizes[] = {5, 1000 + 7, 70001};
    for (int dti = 0; dti < 2; dti++)
        for (size_t s = 0; s < 3; s++) {
            td_dtype dt = dti ? TD_F64 : TD_F32;
            int64_t n = sizes[s];
            elem_case e;
            double *x, *b, *y, *b2, *ry, *rb, ss = 0;
            memset(&e, 0, sizeof e);
            e.which = 1;
            e.x = make_rand(dt, 1, &n, 31);
            e.dy = make_rand(dt, 1, &n, 32);
            e.y = make(dt, 1, &n);
            x = host(e.x);
            b = host(e.dy);
            (void)on_device(elem_body, &e);
            TD_ASSERT_OK(e.st);
            y = host(e.y);
            b2 = host(e.dy);
            ry = malloc(sizeof(double) * (size_t)n);
            rb = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) {
                ry[i] = x[i] + b[i];
                rb[i] = 0.5 * x[i] - 2.0 * b[i];
                ss += x[i] * x[i];
            }
            expect_close("add", y, ry, (size_t)n, tol_for(dt));
            expect_close("axpby", b2, rb, (size_t)n, tol_for(dt));
            expect_close("sumsq", &e.sumsq, &ss, 1, dt == TD_F32 ? 1e-5 : 1e-12);
            free(x);
            free(b);
            free(y);
            free(b2);
            free(ry);
            free(rb);
            td_tensor_destroy(e.x);
            td_tensor_destroy(e.y);
            td_tensor_destroy(e.dy);
        }
}

static void optimizer_kernels_match_reference(void **state) {
    static const int64_t sizes[] = {3, 1000 + 9, 65537};
    for (int dti = 0; dti < 2; dti++)
        for (size_t s = 0; s < 3; s++)
            for (int kind = 2; kind <= 3; kind++) {
                td_dtype dt = dti ? TD_F64 : TD_F32;
                int64_t n = sizes[s];
                elem_case e;
                double *w, *g, *m, *v, *w2, *m2, *v2, *rw, *rm, *rv;
                memset(&e, 0, sizeof e);
                e.which = kind;
                e.w = make_rand(dt, 1, &n, 41);
                e.g = make_rand(dt, 1, &n, 42);
                e.m = make_rand(dt, 1, &n, 43);
                e.v = make(dt, 1, &n);
                TD_ASSERT_OK(td_tensor_rand_uniform(e.v, 44, 0, 0.0, 1.0));
                e.o.lr = 0.01;
                e.o.grad_mul = 0.8;
                e.o.weight_decay = 0.1;
                e.o.momentum = 0.9;
                e.o.nesterov = (int)s % 2;
                e.o.beta1 = 0.9;
                e.o.beta2 = 0.99;
                e.o.eps = 1e-8;
                e.o.bias_corr1 = 1 - pow(0.9, 3);
                e.o.bias_corr2 = 1 - pow(0.99, 3);
                w = host(e.w);
                g = host(e.g);
                m = host(e.m);
                v = host(e.v);
                (void)on_device(elem_body, &e);
                TD_ASSERT_OK(e.st);
                w2 = host(e.w);
                m2 = host(e.m);
                v2 = host(e.v);
                rw = malloc(sizeof(double) * (size_t)n);
                rm = malloc(sizeof(double) * (size_t)n);
                rv = malloc(sizeof(double) * (size_t)n);
                for (int64_t i = 0; i < n; i++) {
                    double gi = g[i] * e.o.grad_mul;
                    if (kind == 2) {
                        /* torch.optim.AdamW */
                        double wi = w[i] * (1 - e.o.lr * e.o.weight_decay);
                        rm[i] = 0.9 * m[i] + 0.1 * gi;
                        rv[i] = 0.99 * v[i] + 0.01 * gi * gi;
                        rw[i] = wi - e.o.lr / e.o.bias_corr1 * rm[i] /
                                         (sqrt(rv[i]) / sqrt(e.o.bias_corr2) + e.o.eps);
                    } else {
                        /* torch.optim.SGD, not the first step */
                        double d = gi + e.o.weight_decay * w[i];
                        rm[i] = 0.9 * m[i] + d;
                        rv[i] = v[i];
                        rw[i] = w[i] - e.o.lr * (e.o.nesterov ? d + 0.9 * rm[i] : rm[i]);
                    }
                }
                expect_close(kind == 2 ? "adamw w" : "sgd w", w2, rw, (size_t)n,
                             dt == TD_F32 ? 1e-5 : 1e-12);
                expect_close(kind == 2 ? "adamw m" : "sgd buf", m2, rm, (size_t)n,
                             dt == TD_F32 ? 1e-5 : 1e-12);
                expect_close("adamw v", v2, rv, (size_t)n, dt == TD_F32 ? 1e-5 : 1e-12);
                free(w);
                free(g);
                free(m);
                free(v);
                free(w2);
                free(m2);
                free(v2);
                free(rw);
                free(rm);
                free(rv);
                td_tensor_destroy(e.w);
                td_tensor_destroy(e.g);
                td_tensor_destroy(e.m);
                td_tensor_destroy(e.v);
            }
}

/* Convolution and pooling ------------------------------------------------------------ */

typedef struct conv_case {
    td_conv_desc d;
    td_tensor *x, *w, *b, *y, *ya, *ym;
    td_buffer *argmax;
    td_status st;
} conv_case;

static td_status conv_body(void *p) {
    conv_case *c = p;
    td_conv_desc pd = c->d;
    pd.oc = pd.c;
    if ((c->st = td__op_conv2d_fwd(&c->d, c->x, c->w, c->b, c->y)) != TD_OK)
        return c->st;
    pd.oh = (pd.h + 2 * pd.pad - pd.kh) / pd.stride + 1;
    pd.ow = (pd.w + 2 * pd.pad - pd.kw) / pd.stride + 1;
    if ((c->st = td__op_pool_fwd(TD_POOL_AVG, &pd, c->x, c->ya, NULL)) != TD_OK)
        return c->st;
    return c->st = td__op_pool_fwd(TD_POOL_MAX, &pd, c->x, c->ym, c->argmax);
}

static void conv_and_pool_match_direct_loops(void **state) {
    static const int64_t cfg[][7] = {/* n, c, h, w, oc, k, stride; pad = k / 2 on even rows */
                                     {2, 3, 9, 7, 4, 3, 1},
                                     {3, 2, 8, 8, 5, 3, 2},
                                     {1, 1, 28, 28, 6, 5, 1},
                                     {4, 3, 5, 6, 2, 1, 1},
                                     {2, 3, 7, 6, 4, 3, 1},
                                     /* 2x2 windows, stride 2, no padding */
                                     {3, 4, 10, 12, 2, 2, 2},
                                     /* rows of 37: three vectors, the last partial */
                                     {2, 2, 5, 37, 3, 3, 1}};
    for (int dti = 0; dti < 2; dti++)
        for (size_t i = 0; i < sizeof cfg / sizeof *cfg; i++) {
            conv_case c;
            td_conv_desc *d = &c.d;
            td_dtype dt = dti ? TD_F64 : TD_F32;
            double *x, *w, *b, *y, *ya, *ym, *ry, *rya, *rym;
            int64_t xs[4], ws[4], ys[4], ps[4];
            memset(&c, 0, sizeof c);
            d->n = cfg[i][0];
            d->c = cfg[i][1];
            d->h = cfg[i][2];
            d->w = cfg[i][3];
            d->oc = cfg[i][4];
            d->kh = d->kw = cfg[i][5];
            d->stride = cfg[i][6];
            d->pad = i % 2 ? 0 : d->kh / 2;
            d->oh = (d->h + 2 * d->pad - d->kh) / d->stride + 1;
            d->ow = (d->w + 2 * d->pad - d->kw) / d->stride + 1;
            xs[0] = d->n, xs[1] = d->c, xs[2] = d->h, xs[3] = d->w;
            ws[0] = d->oc, ws[1] = d->c, ws[2] = d->kh, ws[3] = d->kw;
            ys[0] = d->n, ys[1] = d->oc, ys[2] = d->oh, ys[3] = d->ow;
            ps[0] = d->n, ps[1] = d->c, ps[2] = d->oh, ps[3] = d->ow;
            c.x = make_rand(dt, 4, xs, 51);
            c.w = make_rand(dt, 4, ws, 52);
            c.b = make_rand(dt, 1, &d->oc, 53);
            c.y = make(dt, 4, ys);
            c.ya = make(dt, 4, ps);
            c.ym = make(dt, 4, ps);
            TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(g_list, 0),
                                         sizeof(int32_t) * td_tensor_numel(c.ym), &c.argmax));
            x = host(c.x);
            w = host(c.w);
            b = host(c.b);
            (void)on_device(conv_body, &c);
            TD_ASSERT_OK(c.st);
            y = host(c.y);
            ya = host(c.ya);
            ym = host(c.ym);
            ry = malloc(sizeof(double) * td_tensor_numel(c.y));
            rya = malloc(sizeof(double) * td_tensor_numel(c.ya));
            rym = malloc(sizeof(double) * td_tensor_numel(c.ym));
            for (int64_t n = 0; n < d->n; n++)
                for (int64_t o = 0; o < d->oc; o++)
                    for (int64_t oi = 0; oi < d->oh; oi++)
                        for (int64_t oj = 0; oj < d->ow; oj++) {
                            double s = b[o];
                            for (int64_t ci = 0; ci < d->c; ci++)
                                for (int64_t ki = 0; ki < d->kh; ki++)
                                    for (int64_t kj = 0; kj < d->kw; kj++) {
                                        int64_t ii = oi * d->stride - d->pad + ki;
                                        int64_t jj = oj * d->stride - d->pad + kj;
                                        if (ii < 0 || jj < 0 || ii >= d->h || jj >= d->w)
                                            continue;
                                        s += x[((n * d->c + ci) * d->h + ii) * d->w + jj] *
                                             w[((o * d->c + ci) * d->kh + ki) * d->kw + kj];
                                    }
                            ry[((n * d->oc + o) * d->oh + oi) * d->ow + oj] = s;
                        }
            for (int64_t n = 0; n < d->n; n++)
                for (int64_t ci = 0; ci < d->c; ci++)
                    for (int64_t oi = 0; oi < d->oh; oi++)
                        for (int64_t oj = 0; oj < d->ow; oj++) {
                            double s = 0, mx = -INFINITY;
                            for (int64_t ki = 0; ki < d->kh; ki++)
                                for (int64_t kj = 0; kj < d->kw; kj++) {
                                    int64_t ii = oi * d->stride - d->pad + ki;
                                    int64_t jj = oj * d->stride - d->pad + kj;
                                    double v;
                                    if (ii < 0 || jj < 0 || ii >= d->h || jj >= d->w)
                                        continue;
                                    v = x[((n * d->c + ci) * d->h + ii) * d->w + jj];
                                    s += v;
                                    mx = fmax(mx, v);
                                }
                            rya[((n * d->c + ci) * d->oh + oi) * d->ow + oj] =
                                s / (double)(d->kh * d->kw);
                            rym[((n * d->c + ci) * d->oh + oi) * d->ow + oj] = mx;
                        }
            expect_close("conv2d", y, ry, td_tensor_numel(c.y), tol_for(dt) * 10);
            expect_close("avgpool", ya, rya, td_tensor_numel(c.ya), tol_for(dt));
            expect_close("maxpool", ym, rym, td_tensor_numel(c.ym), 0);
            /* each arg-max points at its window's maximum (CPU memory is host memory) */
            for (size_t o = 0; o < td_tensor_numel(c.ym); o++) {
                size_t plane = o / (size_t)(d->oh * d->ow);
                int32_t at = ((const int32_t *)c.argmax->ptr)[o];
                assert_true(at >= 0 && at < d->h * d->w);
                assert_true(x[plane * (size_t)(d->h * d->w) + (size_t)at] == ym[o]);
            }
            free(x);
            free(w);
            free(b);
            free(y);
            free(ya);
            free(ym);
            free(ry);
            free(rya);
            free(rym);
            td_buffer_free(c.argmax);
            td_tensor_destroy(c.x);
            td_tensor_destroy(c.w);
            td_tensor_destroy(c.b);
            td_tensor_destroy(c.y);
            td_tensor_destroy(c.ya);
            td_tensor_destroy(c.ym);
        }
}

typedef struct conv_bwd_case {
    td_conv_desc d;
    td_tensor *x, *w, *dy, *dx, *dw, *db;
    td_status st;
} conv_bwd_case;

static td_status conv_bwd_body(void *p) {
    conv_bwd_case *c = p;
    return c->st = td__op_conv2d_bwd(&c->d, c->x, c->w, c->dy, c->dx, c->dw, c->db, 0);
}

/* A batch big enough that each core works through several groups of images. */
static void conv_backward_matches_direct_loops(void **state) {
    for (int dti = 0; dti < 2; dti++) {
        td_dtype dt = dti ? TD_F64 : TD_F32;
        conv_bwd_case c;
        td_conv_desc *d = &c.d;
        int64_t xs[4], ws[4], ys[4];
        double *x, *w, *dy, *dx, *dw, *db, *rdx, *rdw, *rdb;
        memset(&c, 0, sizeof c);
        d->n = 50, d->c = 3, d->h = 32, d->w = 32, d->oc = 8, d->kh = d->kw = 5;
        d->stride = 1, d->pad = 2, d->oh = 32, d->ow = 32;
        xs[0] = d->n, xs[1] = d->c, xs[2] = d->h, xs[3] = d->w;
        ws[0] = d->oc, ws[1] = d->c, ws[2] = d->kh, ws[3] = d->kw;
        ys[0] = d->n, ys[1] = d->oc, ys[2] = d->oh, ys[3] = d->ow;
        c.x = make_rand(dt, 4, xs, 81);
        c.w = make_rand(dt, 4, ws, 82);
        c.dy = make_rand(dt, 4, ys, 83);
        c.dx = make(dt, 4, xs);
        c.dw = make(dt, 4, ws);
        c.db = make(dt, 1, &d->oc);
        x = host(c.x);
        w = host(c.w);
        dy = host(c.dy);
        (void)on_device(conv_bwd_body, &c);
        TD_ASSERT_OK(c.st);
        dx = host(c.dx);
        dw = host(c.dw);
        db = host(c.db);
        rdx = calloc(td_tensor_numel(c.dx), sizeof(double));
        rdw = calloc(td_tensor_numel(c.dw), sizeof(double));
        rdb = calloc((size_t)d->oc, sizeof(double));
        for (int64_t n = 0; n < d->n; n++)
            for (int64_t o = 0; o < d->oc; o++)
                for (int64_t oi = 0; oi < d->oh; oi++)
                    for (int64_t oj = 0; oj < d->ow; oj++) {
                        double g = dy[((n * d->oc + o) * d->oh + oi) * d->ow + oj];
                        rdb[o] += g;
                        for (int64_t ci = 0; ci < d->c; ci++)
                            for (int64_t ki = 0; ki < d->kh; ki++)
                                for (int64_t kj = 0; kj < d->kw; kj++) {
                                    int64_t ii = oi - d->pad + ki, jj = oj - d->pad + kj;
                                    int64_t xi = ((n * d->c + ci) * d->h + ii) * d->w + jj;
                                    int64_t wi = ((o * d->c + ci) * d->kh + ki) * d->kw + kj;
                                    if (ii < 0 || jj < 0 || ii >= d->h || jj >= d->w)
                                        continue;
                                    rdw[wi] += g * x[xi];
                                    rdx[xi] += g * w[wi];
                                }
                    }
        expect_close("conv2d backward dx", dx, rdx, td_tensor_numel(c.dx), tol_for(dt) * 10);
        expect_close("conv2d backward dw", dw, rdw, td_tensor_numel(c.dw), tol_for(dt) * 50);
        expect_close("conv2d backward db", db, rdb, (size_t)d->oc, tol_for(dt) * 50);
        free(x);
        free(w);
        free(dy);
        free(dx);
        free(dw);
        free(db);
        free(rdx);
        free(rdw);
        free(rdb);
        td_tensor_destroy(c.x);
        td_tensor_destroy(c.w);
        td_tensor_destroy(c.dy);
        td_tensor_destroy(c.dx);
        td_tensor_destroy(c.dw);
        td_tensor_destroy(c.db);
    }
}

/* Row kernels ---------------------------------------------------------------------- */

typedef struct row_case {
    td_tensor *x, *g, *b, *y, *mean, *rstd, *s, *p, *dl;
    td_buffer *labels;
    double loss, good_loss;
    int64_t correct, good_correct;
    td_status st, st_bad;
} row_case;

static td_status rows_body(void *p) {
    row_case *r = p;
    if ((r->st = td__op_layernorm_fwd(1e-5, r->x, r->g, r->b, r->y, r->mean, r->rstd)) != TD_OK)
        return r->st;
    if ((r->st = td__op_causal_softmax_fwd(0.5, r->s, r->p)) != TD_OK)
        return r->st;
    if ((r->st = td__op_xent(r->x, r->labels, r->dl, 0.25, &r->loss, &r->correct)) != TD_OK)
        return r->st;
    r->good_loss = r->loss;
    r->good_correct = r->correct;
    ((int32_t *)r->labels->ptr)[3] = 99; /* a label past the classes */
    return r->st_bad = td__op_xent(r->x, r->labels, NULL, 1.0, &r->loss, &r->correct);
}

static void row_kernels_match_formulas(void **state) {
    for (int dti = 0; dti < 2; dti++) {
        td_dtype dt = dti ? TD_F64 : TD_F32;
        int64_t xs[2] = {37, 19}, ss[3] = {3, 9, 9}, rows = 37, cols = 19;
        row_case r;
        double *x, *g, *b, *y, *s, *p, *dl, loss = 0, got_loss;
        int64_t correct = 0;
        int32_t *labels;
        memset(&r, 0, sizeof r);
        r.x = make_rand(dt, 2, xs, 61);
        r.g = make_rand(dt, 1, &cols, 62);
        r.b = make_rand(dt, 1, &cols, 63);
        r.y = make(dt, 2, xs);
        r.dl = make(dt, 2, xs);
        r.mean = make(dt, 1, &rows);
        r.rstd = make(dt, 1, &rows);
        r.s = make_rand(dt, 3, ss, 64);
        r.p = make(dt, 3, ss);
        TD_ASSERT_OK(
            td_buffer_alloc(td_device_list_get(g_list, 0), sizeof(int32_t) * 37, &r.labels));
        labels = r.labels->ptr; /* CPU device memory is host memory */
        for (int i = 0; i < 37; i++)
            labels[i] = (i * 7) % 19;
        x = host(r.x);
        g = host(r.g);
        b = host(r.b);
        s = host(r.s);
        (void)on_device(rows_body, &r);
        TD_ASSERT_OK(r.st);
        assert_int_equal(r.st_bad, TD_ERR_INVALID_ARG);
        got_loss = r.good_loss;
        td_test_assert_message_contains("label 99 at row 3");
        y = host(r.y);
        p = host(r.p);
        dl = host(r.dl);
        {
            double *ry = malloc(sizeof(double) * 37 * 19), *rd = malloc(sizeof(double) * 37 * 19);
            double *rp = malloc(sizeof(double) * 3 * 81);
            for (int i = 0; i < 37; i++) {
                double mu = 0, var = 0, mx = -INFINITY, z = 0;
                int arg = 0;
                for (int j = 0; j < 19; j++)
                    mu += x[i * 19 + j] / 19;
                for (int j = 0; j < 19; j++)
                    var += (x[i * 19 + j] - mu) * (x[i * 19 + j] - mu) / 19;
                for (int j = 0; j < 19; j++) {
                    ry[i * 19 + j] = (x[i * 19 + j] - mu) / sqrt(var + 1e-5) * g[j] + b[j];
                    if (x[i * 19 + j] > mx) {
                        mx = x[i * 19 + j];
                        arg = j;
                    }
                }
                for (int j = 0; j < 19; j++)
                    z += exp(x[i * 19 + j]);
                for (int j = 0; j < 19; j++)
                    rd[i * 19 + j] = 0.25 * (exp(x[i * 19 + j]) / z - (j == (i * 7) % 19));
                loss += log(z) - x[i * 19 + (i * 7) % 19];
                correct += arg == (i * 7) % 19;
            }
            for (int m = 0; m < 3; m++)
                for (int i = 0; i < 9; i++) {
                    double z = 0;
                    for (int j = 0; j <= i; j++)
                        z += exp(0.5 * s[(m * 9 + i) * 9 + j]);
                    for (int j = 0; j < 9; j++)
                        rp[(m * 9 + i) * 9 + j] =
                            j <= i ? exp(0.5 * s[(m * 9 + i) * 9 + j]) / z : 0;
                }
            expect_close("layernorm", y, ry, 37 * 19, tol_for(dt) * 5);
            expect_close("softmax cross-entropy gradient", dl, rd, 37 * 19, tol_for(dt) * 5);
            expect_close("causal softmax", p, rp, 3 * 81, tol_for(dt) * 5);
            free(ry);
            free(rd);
            free(rp);
        }
        expect_close("cross-entropy loss", &got_loss, &loss, 1, tol_for(dt) * 5);
        assert_int_equal(r.good_correct, correct);
        free(y);
        free(p);
        free(dl);
        free(x);
        free(g);
        free(b);
        free(s);
        td_buffer_free(r.labels);
        td_tensor_destroy(r.x);
        td_tensor_destroy(r.g);
        td_tensor_destroy(r.b);
        td_tensor_destroy(r.y);
        td_tensor_destroy(r.dl);
        td_tensor_destroy(r.mean);
        td_tensor_destroy(r.rstd);
        td_tensor_destroy(r.s);
        td_tensor_destroy(r.p);
    }
}

/* Attention ------------------------------------------------------------------------------ */

typedef struct attn_case {
    td_tensor *qkv, *p, *y, *dy, *dqkv, *s, *ps, *ys, *dys;
    int64_t b, t, c, h;
    td_status st;
} attn_case;

static td_status attn_body(void *arg) {
    attn_case *a = arg;
    double scale = 1.0 / sqrt((double)(a->c / a->h));
    if ((a->st = td__op_attention_fwd(a->h, scale, a->qkv, a->p, a->y)) != TD_OK)
        return a->st;
    return a->st = td__op_attention_bwd(a->h, scale, a->qkv, a->p, a->dy, a->dqkv);
}

/* The fused kernels against the attention formulas, forward and backward
 * (the backward against central differences of <dy, y> in f64 is in
 * tests/nn/test_grad.c; here the f32 paths meet an f64 reference). */
static void attention_matches_formulas(void **state) {
    for (int dti = 0; dti < 2; dti++) {
        td_dtype dt = dti ? TD_F64 : TD_F32;
        attn_case a;
        int64_t qs[3], ps[4], ys[3];
        double *qkv, *dy, *y, *dq, *ry, *rdq;
        int64_t b, t, c, h, d;
        memset(&a, 0, sizeof a);
        a.b = b = 3;
        a.t = t = 19;
        a.c = c = 24;
        a.h = h = 3;
        d = c / h;
        qs[0] = b, qs[1] = t, qs[2] = 3 * c;
        ps[0] = b, ps[1] = h, ps[2] = t, ps[3] = t;
        ys[0] = b, ys[1] = t, ys[2] = c;
        a.qkv = make_rand(dt, 3, qs, 71);
        a.dy = make_rand(dt, 3, ys, 72);
        a.p = make(dt, 4, ps);
        a.y = make(dt, 3, ys);
        a.dqkv = make(dt, 3, qs);
        qkv = host(a.qkv);
        dy = host(a.dy);
        (void)on_device(attn_body, &a);
        TD_ASSERT_OK(a.st);
        y = host(a.y);
        dq = host(a.dqkv);
        ry = calloc((size_t)(b * t * c), sizeof(double));
        rdq = calloc((size_t)(b * t * 3 * c), sizeof(double));
        for (int64_t n = 0; n < b; n++)
            for (int64_t hh = 0; hh < h; hh++) {
                double *pm = calloc((size_t)(t * t), sizeof(double));
                double *dp = calloc((size_t)(t * t), sizeof(double));
#define Q(i, j)  qkv[(n * t + (i)) * 3 * c + hh * d + (j)]
#define K(i, j)  qkv[(n * t + (i)) * 3 * c + c + hh * d + (j)]
#define V(i, j)  qkv[(n * t + (i)) * 3 * c + 2 * c + hh * d + (j)]
#define DY(i, j) dy[(n * t + (i)) * c + hh * d + (j)]
#define DQ(i, j) rdq[(n * t + (i)) * 3 * c + hh * d + (j)]
#define DK(i, j) rdq[(n * t + (i)) * 3 * c + c + hh * d + (j)]
#define DV(i, j) rdq[(n * t + (i)) * 3 * c + 2 * c + hh * d + (j)]
                for (int64_t i = 0; i < t; i++) {
                    double mx = -INFINITY, z = 0;
                    for (int64_t j = 0; j <= i; j++) {
                        double sc = 0;
                        for (int64_t e = 0; e < d; e++)
                            sc += Q(i, e) * K(j, e);
                        pm[i * t + j] = sc / sqrt((double)d);
                        mx = fmax(mx, pm[i * t + j]);
                    }
                    for (int64_t j = 0; j <= i; j++)
                        z += (pm[i * t + j] = exp(pm[i * t + j] - mx));
                    for (int64_t j = 0; j <= i; j++)
                        pm[i * t + j] /= z;
                    for (int64_t e = 0; e < d; e++) {
                        double acc = 0;
                        for (int64_t j = 0; j <= i; j++)
                            acc += pm[i * t + j] * V(j, e);
                        ry[(n * t + i) * c + hh * d + e] = acc;
                    }
                }
                for (int64_t i = 0; i < t; i++) {
                    double dot = 0;
                    for (int64_t j = 0; j <= i; j++) {
                        for (int64_t e = 0; e < d; e++) {
                            dp[i * t + j] += DY(i, e) * V(j, e);
                            DV(j, e) += pm[i * t + j] * DY(i, e);
                        }
                        dot += pm[i * t + j] * dp[i * t + j];
                    }
                    for (int64_t j = 0; j <= i; j++) {
                        double ds = pm[i * t + j] * (dp[i * t + j] - dot) / sqrt((double)d);
                        for (int64_t e = 0; e < d; e++) {
                            DQ(i, e) += ds * K(j, e);
                            DK(j, e) += ds * Q(i, e);
                        }
                    }
                }
#undef Q
#undef K
#undef V
#undef DY
#undef DQ
#undef DK
#undef DV
                free(pm);
                free(dp);
            }
        expect_close("attention forward", y, ry, (size_t)(b * t * c), tol_for(dt) * 10);
        expect_close("attention backward", dq, rdq, (size_t)(b * t * 3 * c), tol_for(dt) * 20);
        free(qkv);
        free(dy);
        free(y);
        free(dq);
        free(ry);
        free(rdq);
        td_tensor_destroy(a.qkv);
        td_tensor_destroy(a.dy);
        td_tensor_destroy(a.p);
        td_tensor_destroy(a.y);
        td_tensor_destroy(a.dqkv);
    }
}

/* The SIMD levels ---------------------------------------------------------------------- */

static int run_suite(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemm_matches_triple_loop),
        cmocka_unit_test(gemm_refuses_bad_shapes),
        cmocka_unit_test(gemm_batched_matches_loop),
        cmocka_unit_test(activations_match_reference),
        cmocka_unit_test(add_axpby_sumsq_match_reference),
        cmocka_unit_test(optimizer_kernels_match_reference),
        cmocka_unit_test(conv_and_pool_match_direct_loops),
        cmocka_unit_test(conv_backward_matches_direct_loops),
        cmocka_unit_test(row_kernels_match_formulas),
        cmocka_unit_test(attention_matches_formulas),
    };
    static const char *const names[] = {"scalar", "avx2", "avx512"};
    int rc;
    printf("SIMD level: %s\n", names[td__cpu_simd()]);
    /* "cpu": every core this process may use, so the split paths run too. */
    TD_ASSERT_OK(td_devices_open("cpu", &g_list));
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    td_device_list_destroy(g_list);
    return rc;
}

int main(int argc, char **argv) {
    static const char *const levels[] = {"scalar", "avx2"};
    int failed = 0;
    if (getenv("TD_TEST_OPS_CHILD"))
        return run_suite();
    failed |= run_suite() != 0;
    for (int i = 0; i < 2; i++) {
        pid_t pid;
        int status = 0;
        fflush(stdout);
        pid = fork();
        if (pid == 0) {
            setenv("TANDEM_SIMD", levels[i], 1);
            setenv("TD_TEST_OPS_CHILD", "1", 1);
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            printf("FAILED with TANDEM_SIMD=%s\n", levels[i]);
            failed = 1;
        }
    }
    return failed;
}
