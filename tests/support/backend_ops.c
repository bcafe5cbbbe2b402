#include "support/backend_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backends.h"
#include "core/error.h"
#include "device/device-impl.h"
#include "tensor/ops.h"

static const td_ops_backend *g_backend;
static td_device_list *g_list; /* cpu:0, g_backend->spec */

/* Short names inside this file. */
typedef td_ops_side side;
typedef td_ops_build_fn build_fn;
typedef td_ops_op_fn op_fn;
#define SLOTS TD_OPS_SLOTS

td_status td_ops_begin(const td_ops_backend *b) {
    char spec[256];
    td_status st;
    snprintf(spec, sizeof spec, "cpu:0,%s", b->spec);
    if ((st = td_devices_open(spec, &g_list)) != TD_OK)
        return st;
    g_backend = b;
    return TD_OK;
}

void td_ops_end(void) {
    td_device_list_destroy(g_list);
    g_list = NULL;
    g_backend = NULL;
}

td_device *td_ops_device(size_t i) {
    return td_device_list_get(g_list, i);
}

double td_ops_tol(td_dtype dt) {
    return dt == TD_F64 ? 1e-12 : 1e-5;
}

static double tol(td_dtype dt) {
    return td_ops_tol(dt);
}

/* Slot `slot` as a tensor of the given shape, uniform in [lo, hi) from seed. */
static td_tensor *mk(side *s, int slot, int ndim, const int64_t *shape, uint64_t seed, double lo,
                     double hi) {
    TD_ASSERT_OK(td_tensor_create(s->dev, s->dt, ndim, shape, &s->t[slot]));
    TD_ASSERT_OK(td_tensor_rand_uniform(s->t[slot], seed, 0, lo, hi));
    return s->t[slot];
}

td_tensor *td_ops_tensor(td_ops_side *s, int slot, int ndim, const int64_t *shape, uint64_t seed,
                         double lo, double hi) {
    return mk(s, slot, ndim, shape, seed, lo, hi);
}

static td_tensor *mk2(side *s, int slot, int64_t a, int64_t b, uint64_t seed) {
    int64_t shape[2] = {a, b};
    return mk(s, slot, 2, shape, seed, -1, 1);
}

static td_tensor *mk1(side *s, int slot, int64_t n, uint64_t seed) {
    return mk(s, slot, 1, &n, seed, -1, 1);
}

static void mk_ints(side *s, int slot, const int32_t *v, size_t n) {
    TD_ASSERT_OK(td_buffer_alloc(s->dev, n * sizeof *v + 4, &s->ints[slot]));
    if (n)
        TD_ASSERT_OK(td_buffer_write(s->ints[slot], 0, v, n * sizeof *v));
}

static void side_free(side *s) {
    for (int i = 0; i < SLOTS; i++)
        td_tensor_destroy(s->t[i]);
    for (int i = 0; i < 3; i++)
        td_buffer_free(s->ints[i]);
    memset(s, 0, sizeof *s);
}

typedef struct run_arg {
    op_fn fn;
    side *s;
    const void *p;
} run_arg;

static td_status on_device(td_device *dev, void *arg) {
    run_arg *r = arg;
    (void)dev;
    return r->fn(r->s, r->p);
}

static td_status run_on(side *s, op_fn fn, const void *p) {
    run_arg r = {fn, s, p};
    return td_device_run(s->dev, on_device, &r);
}

/* Both sides, s[0] on cpu:0 and s[1] on the device under test, built from p
 * in dt and the op run on each; the caller frees them with side_free(). */
static void build_and_run_both(side s[2], td_dtype dt, build_fn build, op_fn op, const void *p) {
    memset(s, 0, 2 * sizeof *s);
    for (int i = 0; i < 2; i++) {
        s[i].dev = td_device_list_get(g_list, (size_t)i);
        s[i].dt = dt;
        build(&s[i], p);
        TD_ASSERT_OK(run_on(&s[i], op, p));
    }
}

/* Bad input on the device under test alone: the op, on a side built from p
 * in dt, fails with TD_ERR_INVALID_ARG and a message containing each of
 * needles (NULL-terminated). */
static void expect_invalid_arg(td_dtype dt, build_fn build, op_fn op, const void *p,
                               const char *const *needles) {
    side s;
    memset(&s, 0, sizeof s);
    s.dev = td_device_list_get(g_list, 1);
    s.dt = dt;
    build(&s, p);
    TD_ASSERT_STATUS(run_on(&s, op, NULL), TD_ERR_INVALID_ARG);
    for (const char *const *n = needles; *n; n++)
        td_test_assert_message_contains(*n);
    side_free(&s);
}

/* max |got - want| / max |want| (normwise), and no NaN where want has none. */
static void check_slot(const char *what, int slot, const side *want, const side *got) {
    size_t n = td_tensor_numel(want->t[slot]);
    double *a = malloc((n + 1) * sizeof *a), *b = malloc((n + 1) * sizeof *b);
    double scale = 0, worst = 0;
    size_t at = 0;
    TD_ASSERT_OK(td_tensor_read_f64(want->t[slot], a, n));
    TD_ASSERT_OK(td_tensor_read_f64(got->t[slot], b, n));
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(a[i]));
    for (size_t i = 0; i < n; i++) {
        double e = isnan(a[i]) == isnan(b[i]) ? fabs(a[i] - b[i]) : INFINITY;
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (scale == 0)
        scale = 1;
    if (!(worst / scale <= tol(want->dt)))
        fail_msg("%s %s: slot %d differs at %zu: cpu %.17g, %s %.17g (error %.3g of %.3g)", what,
                 td_dtype_name(want->dt), slot, at, a[at], g_backend->name, b[at], worst / scale,
                 tol(want->dt));
    free(a);
    free(b);
}

static void check_close(const char *what, td_dtype dt, double want, double got) {
    if (!(fabs(want - got) <= tol(dt) * fmax(1, fabs(want))))
        fail_msg("%s %s: cpu %.17g, %s %.17g", what, td_dtype_name(dt), want, g_backend->name, got);
}

void td_ops_compare(const char *what, build_fn build, op_fn op, const void *p, const int *outs) {
    for (int d = 1; d >= 0; d--) {
        side s[2];
        build_and_run_both(s, (td_dtype)d, build, op, p);
        for (const int *o = outs; *o >= 0; o++)
            check_slot(what, *o, &s[0], &s[1]);
        check_close(what, (td_dtype)d, s[0].loss, s[1].loss);
        check_close(what, (td_dtype)d, s[0].value, s[1].value);
        assert_int_equal(s[0].correct, s[1].correct);
        side_free(&s[0]);
        side_free(&s[1]);
    }
}

/* Every slot the CPU backend fills, the backend under test fills too: a slot
 * added to src/device/kernels.h without a kernel there fails here. Except
 * gemm_bf16: a backend without it computes in f32 and the run says so
 * (issue 42; td_device_set_precision), which test_bgemm and the trainer's
 * tests check. */
void td_ops_every_slot_is_implemented(void **state) {
    typedef void (*slot_fn)(void);
    const unsigned char *cpu = (const void *)td__cpu_backend.kernels;
    const unsigned char *dev = (const void *)g_backend->kernels;
    assert_int_equal(sizeof(td_kernels) % sizeof(slot_fn), 0);
    for (size_t i = 0; i < sizeof(td_kernels) / sizeof(slot_fn); i++) {
        slot_fn c, o;
        memcpy(&c, cpu + i * sizeof c, sizeof c);
        memcpy(&o, dev + i * sizeof o, sizeof o);
        if (i == offsetof(td_kernels, gemm_bf16) / sizeof(slot_fn))
            continue;
        if (c && !o)
            fail_msg("slot %zu of td_kernels has a CPU kernel but no %s one", i, g_backend->title);
    }
}

/* GEMM ----------------------------------------------------------------------- */

typedef struct gemm_case {
    int ta, tb;
    int64_t m, n, k;
    double alpha, beta;
} gemm_case;

static void gemm_build(side *s, const void *p) {
    const gemm_case *g = p;
    mk2(s, 0, g->ta ? g->k : g->m, g->ta ? g->m : g->k, 1);
    mk2(s, 1, g->tb ? g->n : g->k, g->tb ? g->k : g->n, 2);
    mk2(s, 2, g->m, g->n, 3);
    if (g->beta == 0) /* must not leak through 0 * C */
        TD_ASSERT_OK(td_tensor_fill(s->t[2], NAN));
}

static td_status gemm_run(side *s, const void *p) {
    const gemm_case *g = p;
    return td__op_matmul(s->t[2], s->t[0], g->ta, s->t[1], g->tb, g->alpha, g->beta);
}

void td_ops_gemm_matches(void **state) {
    static const int outs[] = {2, -1};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case g = {ta, tb, 37, 29, 53, 0.7, ta ? 0.0 : 0.3};
            td_ops_compare("gemm", gemm_build, gemm_run, &g, outs);
        }
    {
        /* big enough for CLBlast's indirect kernels (padding, transposes) */
        gemm_case g = {1, 0, 401, 389, 397, -1.1, 0.5};
        td_ops_compare("gemm large", gemm_build, gemm_run, &g, outs);
    }
}

/* Batched, with padded leading dimensions and a stride between matrices. */
void td_ops_batched_build(side *s, const void *p) {
    (void)p;
    mk1(s, 0, 3 * 150 + 5, 4); /* a: 3 of (5, 11) with lda 13, stride 70 (or 150) */
    mk1(s, 1, 3 * 130, 5);     /* b^T: 3 of (7, 11) with ldb 11, stride 99 (or 130) */
    mk1(s, 2, 3 * 60, 6);      /* c: 3 of (5, 7) with ldc 8, stride 60 */
    mk1(s, 3, 2 * 35 + 2, 7);  /* c for k = 0: 2 of (5, 7) */
}

static td_status batched_run(side *s, const void *p) {
    td_gemm_operand a = {s->t[0], 5, 13, 70}, b = {s->t[1], 0, 11, 99}, c = {s->t[2], 1, 8, 60};
    td_status st = td__op_gemm_batched(0, 1, 5, 7, 11, 1.3, a, b, 0.4, c, 3);
    td_gemm_operand a0 = {s->t[0], 0, 1, 0}, b0 = {s->t[1], 0, 7, 0}, c0 = {s->t[3], 2, 7, 35};
    (void)p;
    /* k = 0: C = beta C */
    return st != TD_OK ? st : td__op_gemm_batched(0, 0, 5, 7, 0, 1.0, a0, b0, 0.5, c0, 2);
}

void td_ops_gemm_batched_matches(void **state) {
    static const int outs[] = {2, 3, -1};
    td_ops_compare("gemm_batched", td_ops_batched_build, batched_run, NULL, outs);
}

/* Elementwise ------------------------------------------------------------------ */

static void elem_build(side *s, const void *p) {
    (void)p;
    mk1(s, 0, 1001, 7);
    mk1(s, 1, 1001, 8);
    mk1(s, 2, 1001, 9);
    mk1(s, 3, 1001, 10);
    mk1(s, 4, 1001, 11);
    mk1(s, 5, 1001, 12);
    mk1(s, 6, 1001, 13);
    TD_ASSERT_OK(td_tensor_rand_uniform(s->t[0], 7, 0, -4, 4));
}

static td_status elem_run(side *s, const void *p) {
    td_act act = *(const td_act *)p;
    td_status st;
    if ((st = td__op_act_fwd(act, s->t[0], s->t[1])) ||
        (st = td__op_act_bwd(act, s->t[0], s->t[1], s->t[2], s->t[3])) ||
        (st = td__op_add(s->t[0], s->t[1], s->t[4])) ||
        (st = td__op_axpby(0.25, s->t[0], -1.5, s->t[5])) ||
        (st = td__op_axpby(-3.0, s->t[1], 0.0, s->t[6])))
        return st;
    return td__op_sumsq(s->t[3], &s->value);
}

void td_ops_elementwise_ops_match(void **state) {
    static const int outs[] = {1, 3, 4, 5, 6, -1};
    static const td_act acts[] = {TD_ACT_RELU, TD_ACT_GELU, TD_ACT_TANH, TD_ACT_SIGMOID,
                                  TD_ACT_GELU_TANH};
    static const char *names[] = {"relu", "gelu", "tanh", "sigmoid", "gelu_tanh"};
    for (int i = 0; i < 5; i++)
        td_ops_compare(names[i], elem_build, elem_run, &acts[i], outs);
}

static void sumsq_build(side *s, const void *p) {
    mk1(s, 0, *(const int64_t *)p, 14);
}

static td_status sumsq_run(side *s, const void *p) {
    (void)p;
    return td__op_sumsq(s->t[0], &s->value);
}

void td_ops_sumsq_matches(void **state) {
    static const int outs[] = {-1};
    static const int64_t sizes[] = {1, 4095, 100003, 2000003};
    for (int i = 0; i < 4; i++)
        td_ops_compare("sumsq", sumsq_build, sumsq_run, &sizes[i], outs);
}

/* Dropout: the same mask bit for bit. */
static td_status dropout_run(side *s, const void *p) {
    (void)p;
    return td__op_dropout(0.3, 99, 12345, s->t[0], s->t[1]);
}

static void dropout_build(side *s, const void *p) {
    (void)p;
    mk1(s, 0, 10007, 15);
    mk1(s, 1, 10007, 16);
}

void td_ops_dropout_masks_match(void **state) {
    static const int outs[] = {1, -1};
    td_ops_compare("dropout", dropout_build, dropout_run, NULL, outs);
    for (int d = 0; d < 2; d++) {
        side s[2];
        double *y[2];
        size_t dropped = 0;
        build_and_run_both(s, (td_dtype)d, dropout_build, dropout_run, NULL);
        for (int i = 0; i < 2; i++) {
            y[i] = malloc(10007 * sizeof(double));
            TD_ASSERT_OK(td_tensor_read_f64(s[i].t[1], y[i], 10007));
        }
        for (size_t i = 0; i < 10007; i++) {
            if ((y[0][i] == 0) != (y[1][i] == 0))
                fail_msg("dropout %s: masks differ at %zu", d ? "f64" : "f32", i);
            dropped += y[0][i] == 0;
        }
        assert_true(dropped > 2500 && dropped < 3500);
        free(y[0]);
        free(y[1]);
        side_free(&s[0]);
        side_free(&s[1]);
    }
}

/* Optimizers over three steps. */
static void opt_build(side *s, const void *p) {
    (void)p;
    mk1(s, 0, 777, 17); /* w */
    mk1(s, 1, 777, 18); /* g */
    mk1(s, 2, 777, 19); /* momentum or m */
    mk1(s, 3, 777, 20); /* v */
    TD_ASSERT_OK(td_tensor_rand_uniform(s->t[3], 20, 0, 0, 0.1));
    mk1(s, 4, 777, 21); /* w for plain SGD */
}

static td_status opt_run(side *s, const void *p) {
    td_opt_args o;
    td_status st;
    (void)p;
    for (int step = 1; step <= 3; step++) {
        memset(&o, 0, sizeof o);
        o.lr = 0.05;
        o.grad_mul = 0.8;
        o.weight_decay = 0.01;
        o.momentum = 0.9;
        o.nesterov = step == 3;
        o.first = step == 1;
        if ((st = td__op_sgd(s->t[0], s->t[1], s->t[2], &o)) != TD_OK)
            return st;
        o.momentum = 0;
        if ((st = td__op_sgd(s->t[4], s->t[1], NULL, &o)) != TD_OK)
            return st;
        o.beta1 = 0.9;
        o.beta2 = 0.999;
        o.eps = 1e-8;
        o.bias_corr1 = 1 - pow(0.9, step);
        o.bias_corr2 = 1 - pow(0.999, step);
        if ((st = td__op_adamw(s->t[0], s->t[1], s->t[2], s->t[3], &o)) != TD_OK)
            return st;
    }
    return TD_OK;
}

void td_ops_optimizers_match(void **state) {
    static const int outs[] = {0, 2, 3, 4, -1};
    td_ops_compare("sgd+adamw", opt_build, opt_run, NULL, outs);
}

/* Bias ---------------------------------------------------------------------------- */

static void bias_build(side *s, const void *p) {
    (void)p;
    mk1(s, 0, 3 * 5 * 7, 22);
    mk1(s, 1, 5, 23);
    mk1(s, 2, 9 * 13, 24);
    mk1(s, 3, 13, 25);
    mk1(s, 4, 5, 26);
    mk1(s, 5, 13, 27);
}

static td_status bias_run(side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_bias_add(s->t[0], s->t[1], 3, 5, 7)) ||
        (st = td__op_bias_add(s->t[2], s->t[3], 9, 13, 1)) ||
        (st = td__op_bias_grad(s->t[4], s->t[0], 3, 5, 7, 1)) ||
        (st = td__op_bias_grad(s->t[5], s->t[2], 9, 13, 1, 0)))
        return st;
    return td__op_bias_grad(s->t[5], s->t[2], 9, 13, 1, 1);
}

void td_ops_bias_ops_match(void **state) {
    static const int outs[] = {0, 2, 4, 5, -1};
    td_ops_compare("bias", bias_build, bias_run, NULL, outs);
}

/* Cross-entropy ----------------------------------------------------------------- */

static const int32_t labels[11] = {3, 0, 6, 6, 1, 2, 5, 4, 0, 6, 3};

static void xent_build(side *s, const void *p) {
    const int32_t *lab = p ? p : labels;
    mk2(s, 0, 11, 7, 28);
    TD_ASSERT_OK(td_tensor_rand_uniform(s->t[0], 28, 0, -3, 3));
    mk2(s, 1, 11, 7, 29);
    mk_ints(s, 0, lab, 11);
}

static td_status xent_run(side *s, const void *p) {
    double loss2 = 0;
    int64_t correct2 = 0;
    td_status st = td__op_xent(s->t[0], s->ints[0], s->t[1], 0.125, &s->loss, &s->correct);
    if (st != TD_OK)
        return st;
    if ((st = td__op_xent(s->t[0], s->ints[0], NULL, 1.0, &loss2, &correct2)) != TD_OK)
        return st;
    s->value = loss2 + (double)correct2;
    (void)p;
    return TD_OK;
}

void td_ops_xent_matches_and_names_bad_labels(void **state) {
    static const int outs[] = {1, -1};
    static const char *const names_row_and_label[] = {"row 5", "label 7", NULL};
    int32_t bad[11];
    td_ops_compare("xent", xent_build, xent_run, NULL, outs);
    memcpy(bad, labels, sizeof bad);
    bad[5] = 7;
    expect_invalid_arg(TD_F32, xent_build, xent_run, bad, names_row_and_label);
}

/* Layer norm ------------------------------------------------------------------------ */

static void ln_build(side *s, const void *p) {
    (void)p;
    mk2(s, 0, 7, 33, 30); /* x */
    mk1(s, 1, 33, 31);    /* gamma */
    mk1(s, 2, 33, 32);    /* beta */
    mk2(s, 3, 7, 33, 33); /* y */
    mk1(s, 4, 7, 34);     /* mean */
    mk1(s, 5, 7, 35);     /* rstd */
    mk2(s, 6, 7, 33, 36); /* dy */
    mk2(s, 7, 7, 33, 37); /* dx */
    mk1(s, 8, 33, 38);    /* dgamma */
    mk1(s, 9, 33, 39);    /* dbeta */
}

static td_status ln_run(side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_layernorm_fwd(1e-5, s->t[0], s->t[1], s->t[2], s->t[3], s->t[4], s->t[5])) ||
        (st = td__op_layernorm_bwd(s->t[0], s->t[1], s->t[4], s->t[5], s->t[6], s->t[7], s->t[8],
                                   s->t[9], 0)))
        return st;
    /* again without dx, accumulating */
    return td__op_layernorm_bwd(s->t[0], s->t[1], s->t[4], s->t[5], s->t[6], NULL, s->t[8], s->t[9],
                                1);
}

void td_ops_layernorm_matches(void **state) {
    static const int outs[] = {3, 4, 5, 7, 8, 9, -1};
    td_ops_compare("layernorm", ln_build, ln_run, NULL, outs);
}

/* Embeddings ------------------------------------------------------------------------- */

static const int32_t tokens[15] = {3, 16, 0, 7, 7, 2, 11, 16, 5, 9, 1, 1, 14, 0, 8};

static void embed_build(side *s, const void *p) {
    int64_t y[3] = {3, 5, 11};
    mk2(s, 0, 17, 11, 40); /* wte */
    mk2(s, 1, 6, 11, 41);  /* wpe, one row more than t */
    mk(s, 2, 3, y, 42, -1, 1);
    mk(s, 3, 3, y, 43, -1, 1);
    mk(s, 4, 3, y, 44, -1, 1); /* dy */
    mk2(s, 5, 17, 11, 45);     /* dwte */
    mk2(s, 6, 6, 11, 46);      /* dwpe */
    mk2(s, 7, 17, 11, 47);     /* dwte, accumulated */
    mk_ints(s, 0, p ? p : tokens, 15);
}

static td_status embed_run(side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_embed_fwd(s->ints[0], s->t[0], s->t[1], s->t[2])) ||
        (st = td__op_embed_fwd(s->ints[0], s->t[0], NULL, s->t[3])) ||
        (st = td__op_embed_bwd(s->ints[0], s->t[4], s->t[5], s->t[6], 0)))
        return st;
    return td__op_embed_bwd(s->ints[0], s->t[4], s->t[7], NULL, 1);
}

void td_ops_embed_matches_and_names_bad_tokens(void **state) {
    static const int outs[] = {2, 3, 5, 7, -1};
    static const char *const names_token[] = {"token -2 at (1, 2)", NULL};
    int32_t bad[15];
    td_ops_compare("embed", embed_build, embed_run, NULL, outs);
    memcpy(bad, tokens, sizeof bad);
    bad[7] = -2; /* (1, 2) */
    bad[13] = 17;
    expect_invalid_arg(TD_F64, embed_build, embed_run, bad, names_token);
}

/* Convolution -------------------------------------------------------------------------- */

static td_conv_desc conv_desc(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oc, int64_t kh,
                              int64_t kw, int64_t stride, int64_t pad) {
    td_conv_desc d = {n, c, h, w, oc, 0, 0, kh, kw, stride, pad};
    d.oh = (h + 2 * pad - kh) / stride + 1;
    d.ow = (w + 2 * pad - kw) / stride + 1;
    return d;
}

static void conv_build(side *s, const void *p) {
    const td_conv_desc *d = p;
    int64_t x[4] = {d->n, d->c, d->h, d->w}, w[4] = {d->oc, d->c, d->kh, d->kw};
    int64_t y[4] = {d->n, d->oc, d->oh, d->ow};
    mk(s, 0, 4, x, 50, -1, 1); /* x */
    mk(s, 1, 4, w, 51, -1, 1); /* w */
    mk1(s, 2, d->oc, 52);      /* bias */
    mk(s, 3, 4, y, 53, -1, 1); /* y */
    mk(s, 4, 4, y, 54, -1, 1); /* y without bias */
    mk(s, 5, 4, y, 55, -1, 1); /* dy */
    mk(s, 6, 4, x, 56, -1, 1); /* dx */
    mk(s, 7, 4, w, 57, -1, 1); /* dw */
    mk1(s, 8, d->oc, 58);      /* db */
    mk(s, 9, 4, w, 59, -1, 1); /* dw, accumulated without dx */
    mk1(s, 10, d->oc, 60);     /* db, accumulated */
}

static td_status conv_run(side *s, const void *p) {
    const td_conv_desc *d = p;
    td_status st;
    if ((st = td__op_conv2d_fwd(d, s->t[0], s->t[1], s->t[2], s->t[3])) ||
        (st = td__op_conv2d_fwd(d, s->t[0], s->t[1], NULL, s->t[4])) ||
        (st = td__op_conv2d_bwd(d, s->t[0], s->t[1], s->t[5], s->t[6], s->t[7], s->t[8], 0)))
        return st;
    return td__op_conv2d_bwd(d, s->t[0], s->t[1], s->t[5], NULL, s->t[9], s->t[10], 1);
}

void td_ops_conv2d_matches(void **state) {
    static const int outs[] = {3, 4, 6, 7, 8, 9, 10, -1};
    td_conv_desc d1 = conv_desc(3, 2, 9, 7, 4, 3, 3, 2, 1);
    td_conv_desc d2 = conv_desc(2, 5, 6, 5, 3, 1, 1, 1, 0);
    td_conv_desc d3 = conv_desc(2, 3, 8, 8, 5, 5, 3, 1, 2);
    td_ops_compare("conv2d 3x3/2 pad 1", conv_build, conv_run, &d1, outs);
    td_ops_compare("conv2d 1x1", conv_build, conv_run, &d2, outs);
    td_ops_compare("conv2d 5x3 pad 2", conv_build, conv_run, &d3, outs);
}

/* Pooling ------------------------------------------------------------------------------ */

static void pool_build(side *s, const void *p) {
    const td_conv_desc *d = p;
    int64_t x[4] = {d->n, d->c, d->h, d->w}, y[4] = {d->n, d->c, d->oh, d->ow};
    mk(s, 0, 4, x, 61, -1, 1);
    mk(s, 1, 4, y, 62, -1, 1); /* max */
    mk(s, 2, 4, y, 63, -1, 1); /* avg */
    mk(s, 3, 4, y, 64, -1, 1); /* dy */
    mk(s, 4, 4, x, 65, -1, 1); /* dx max */
    mk(s, 5, 4, x, 66, -1, 1); /* dx avg */
    TD_ASSERT_OK(td_buffer_alloc(s->dev, td_tensor_numel(s->t[1]) * 4, &s->ints[0]));
}

static td_status pool_run(side *s, const void *p) {
    const td_conv_desc *d = p;
    td_status st;
    if ((st = td__op_pool_fwd(TD_POOL_MAX, d, s->t[0], s->t[1], s->ints[0])) ||
        (st = td__op_pool_fwd(TD_POOL_AVG, d, s->t[0], s->t[2], NULL)) ||
        (st = td__op_pool_bwd(TD_POOL_MAX, d, s->t[3], s->ints[0], s->t[4])))
        return st;
    return td__op_pool_bwd(TD_POOL_AVG, d, s->t[3], NULL, s->t[5]);
}

void td_ops_pool_matches(void **state) {
    static const int outs[] = {1, 2, 4, 5, -1};
    td_conv_desc ds[2] = {conv_desc(2, 3, 7, 9, 3, 3, 3, 2, 1),
                          conv_desc(1, 2, 8, 6, 2, 2, 2, 2, 0)};
    for (int k = 0; k < 2; k++) {
        td_ops_compare("pool", pool_build, pool_run, &ds[k], outs);
        /* arg-max positions equal too */
        {
            side s[2];
            size_t n = (size_t)(ds[k].n * ds[k].c * ds[k].oh * ds[k].ow);
            int32_t *am[2];
            build_and_run_both(s, TD_F64, pool_build, pool_run, &ds[k]);
            for (int i = 0; i < 2; i++) {
                am[i] = malloc(n * 4);
                TD_ASSERT_OK(td_buffer_read(s[i].ints[0], 0, am[i], n * 4));
            }
            assert_memory_equal(am[0], am[1], n * 4);
            free(am[0]);
            free(am[1]);
            side_free(&s[0]);
            side_free(&s[1]);
        }
    }
}

/* Causal softmax ------------------------------------------------------------------------ */

static void csm_build(side *s, const void *p) {
    int64_t shape[3] = {3, 9, 9};
    (void)p;
    mk(s, 0, 3, shape, 70, -3, 3);
    mk(s, 1, 3, shape, 71, -1, 1);
    mk(s, 2, 3, shape, 72, -1, 1);
    mk(s, 3, 3, shape, 73, -1, 1);
}

static td_status csm_run(side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_causal_softmax_fwd(0.37, s->t[0], s->t[1])) ||
        (st = td__op_causal_softmax_bwd(0.37, s->t[1], s->t[2], s->t[3])))
        return st;
    return td__op_causal_softmax_bwd(0.37, s->t[1], s->t[2], s->t[2]); /* in place */
}

void td_ops_causal_softmax_matches(void **state) {
    static const int outs[] = {1, 2, 3, -1};
    td_ops_compare("causal_softmax", csm_build, csm_run, NULL, outs);
}

/* Fused attention: qkv (2, 7, 3 * 12) in 3 heads of 4. */
static void attn_build(side *s, const void *p) {
    int64_t qkv[3] = {2, 7, 36}, pp[4] = {2, 3, 7, 7}, y[3] = {2, 7, 12};
    (void)p;
    mk(s, 0, 3, qkv, 74, -2, 2);
    mk(s, 1, 4, pp, 75, -1, 1);
    mk(s, 2, 3, y, 76, -1, 1);
    mk(s, 3, 3, y, 77, -1, 1); /* dy */
    mk(s, 4, 3, qkv, 78, -1, 1);
    TD_ASSERT_OK(td_tensor_fill(s->t[1], NAN)); /* outputs are only written */
    TD_ASSERT_OK(td_tensor_fill(s->t[4], NAN));
}

static td_status attn_run(side *s, const void *p) {
    td_status st;
    (void)p;
    if (!td__op_has_attention(s->dev))
        return td__error(TD_ERR_UNSUPPORTED, "%s has no fused attention", td_device_name(s->dev));
    if ((st = td__op_attention_fwd(3, 0.5, s->t[0], s->t[1], s->t[2])) != TD_OK)
        return st;
    return td__op_attention_bwd(3, 0.5, s->t[0], s->t[1], s->t[3], s->t[4]);
}

void td_ops_attention_matches(void **state) {
    static const int outs[] = {1, 2, 4, -1};
    td_ops_compare("attention", attn_build, attn_run, NULL, outs);
}

/* Sub-devices work at once: each host thread runs its own GEMMs (CLBlast,
 * cuBLAS) and kernels on its own queue, and every result equals the CPU's. */
typedef struct busy {
    td_tensor *a, *b, *c, *y;
} busy;

static td_status busy_run(td_device *dev, void *arg) {
    busy *w = arg;
    td_status st = TD_OK;
    (void)dev;
    for (int i = 0; i < 20 && st == TD_OK; i++)
        if ((st = td__op_matmul(w->c, w->a, 0, w->b, 1, 1.0, 0.0)) == TD_OK)
            st = td__op_act_fwd(TD_ACT_GELU, w->c, w->y);
    return st;
}

void td_ops_sub_devices_compute_at_once(void **state) {
    td_device_list *parts = NULL;
    td_device *cpu = td_device_list_get(g_list, 0);
    int64_t sa[2] = {64, 96}, sb[2] = {80, 96}, sc[2] = {64, 80};
    busy w[3];
    td_event *ev[2];
    char spec[256];
    snprintf(spec, sizeof spec, "%s{split=2}", g_backend->spec);
    TD_ASSERT_OK(td_devices_open(spec, &parts));
    for (int d = 0; d < 2; d++) {
        memset(w, 0, sizeof w);
        for (int i = 0; i < 3; i++) {
            td_device *dev = i < 2 ? td_device_list_get(parts, (size_t)i) : cpu;
            TD_ASSERT_OK(td_tensor_create(dev, (td_dtype)d, 2, sa, &w[i].a));
            TD_ASSERT_OK(td_tensor_create(dev, (td_dtype)d, 2, sb, &w[i].b));
            TD_ASSERT_OK(td_tensor_create(dev, (td_dtype)d, 2, sc, &w[i].c));
            TD_ASSERT_OK(td_tensor_create(dev, (td_dtype)d, 2, sc, &w[i].y));
            TD_ASSERT_OK(td_tensor_rand_uniform(w[i].a, 80, 0, -1, 1));
            TD_ASSERT_OK(td_tensor_rand_uniform(w[i].b, 81, 0, -1, 1));
        }
        for (int i = 0; i < 2; i++)
            TD_ASSERT_OK(
                td_device_submit(td_device_list_get(parts, (size_t)i), busy_run, &w[i], &ev[i]));
        TD_ASSERT_OK(td_device_run(cpu, busy_run, &w[2]));
        for (int i = 0; i < 2; i++) {
            td_compare_result r;
            TD_ASSERT_OK(td_event_wait(ev[i]));
            td_event_destroy(ev[i]);
            TD_ASSERT_OK(td_tensor_compare(w[2].y, w[i].y, &r));
            if (!(r.max_abs <= tol((td_dtype)d) * 10) || r.nonfinite)
                fail_msg("sub-device %d %s: differs from the CPU by %g", i,
                         td_dtype_name((td_dtype)d), r.max_abs);
        }
        for (int i = 0; i < 3; i++) {
            td_tensor_destroy(w[i].a);
            td_tensor_destroy(w[i].b);
            td_tensor_destroy(w[i].c);
            td_tensor_destroy(w[i].y);
        }
    }
    td_device_list_destroy(parts);
}
