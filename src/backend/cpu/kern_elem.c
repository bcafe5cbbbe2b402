/* Elementwise kernels and reductions. f32 has AVX-512 and AVX2 paths written
 * with intrinsics (kern_simd_body.h, compiled twice with
 * __attribute__((target(...))) on every function, so this file builds
 * without -mavx512f); the level is chosen at run time by td__cpu_simd(). f64
 * and the tails run the scalar code, which is also the reference the vector
 * paths are tested against. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"
#include "core/philox.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define TD_X86_SIMD 1
#include <immintrin.h>
#endif

/* Scalar reference ---------------------------------------------------------- */

static double phi_cdf(double x) {
    return 0.5 * erfc(-x * 0.70710678118654752440);
}
static float phi_cdf_f(float x) {
    return 0.5f * erfcf(-x * 0.70710678f);
}

#define T    float
#define SFX  f32
#define EXP  expf
#define CDF  phi_cdf_f
#define TANH tanhf
#include "backend/cpu/tmpl/elem_scalar.h"
#define T    double
#define SFX  f64
#define EXP  exp
#define CDF  phi_cdf
#define TANH tanh
#include "backend/cpu/tmpl/elem_scalar.h"

/* Vector paths ---------------------------------------------------------------- */

#ifdef TD_X86_SIMD

/* Every function between BEGIN and END gets __attribute__((target(...))). */
// clang-format off
#if defined(__clang__)
#define TD_TARGET_BEGIN_AVX2 _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define TD_TARGET_BEGIN_AVX512 _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx2,fma\"))), apply_to = function)")
#define TD_TARGET_END _Pragma("clang attribute pop")
#else
#define TD_TARGET_BEGIN_AVX2 _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
#define TD_TARGET_BEGIN_AVX512 _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx2,fma\")")
#define TD_TARGET_END _Pragma("GCC pop_options")
#endif
// clang-format on

TD_TARGET_BEGIN_AVX2
#define SFX              _avx2
#define V                __m256
#define W                8
#define VLOAD            _mm256_loadu_ps
#define VSTORE           _mm256_storeu_ps
#define VSET1            _mm256_set1_ps
#define VADD             _mm256_add_ps
#define VSUB             _mm256_sub_ps
#define VMUL             _mm256_mul_ps
#define VDIV             _mm256_div_ps
#define VFMA             _mm256_fmadd_ps
#define VMAX             _mm256_max_ps
#define VMIN             _mm256_min_ps
#define VSQRT            _mm256_sqrt_ps
#define VROUND(x)        _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VABS(x)          _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x)
#define VNEG(x)          _mm256_xor_ps(x, _mm256_set1_ps(-0.0f))
#define VGTZ_SEL(x, v)   _mm256_and_ps(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GT_OQ), v)
#define VSELNEG(x, a, b) _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ))
#define VPOW2I(n)                                                                                  \
    _mm256_castsi256_ps(                                                                           \
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
static inline float hmax_avx2(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline float hsum_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#define VHSUM hsum_avx2
#define VHMAX hmax_avx2
#include "backend/cpu/kern_simd_body.h"
#undef SFX
#undef V
#undef W
#undef VLOAD
#undef VSTORE
#undef VSET1
#undef VADD
#undef VSUB
#undef VMUL
#undef VDIV
#undef VFMA
#undef VMAX
#undef VMIN
#undef VSQRT
#undef VROUND
#undef VABS
#undef VNEG
#undef VGTZ_SEL
#undef VSELNEG
#undef VPOW2I
#undef VHSUM
#undef VHMAX
TD_TARGET_END

TD_TARGET_BEGIN_AVX512
#define SFX       _avx512
#define V         __m512
#define W         16
#define VLOAD     _mm512_loadu_ps
#define VSTORE    _mm512_storeu_ps
#define VSET1     _mm512_set1_ps
#define VADD      _mm512_add_ps
#define VSUB      _mm512_sub_ps
#define VMUL      _mm512_mul_ps
#define VDIV      _mm512_div_ps
#define VFMA      _mm512_fmadd_ps
#define VMAX      _mm512_max_ps
#define VMIN      _mm512_min_ps
#define VSQRT     _mm512_sqrt_ps
#define VROUND(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define VABS(x)   _mm512_abs_ps(x)
#define VNEG(x)                                                                                    \
    _mm512_castsi512_ps(                                                                           \
        _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000)))
#define VGTZ_SEL(x, v)                                                                             \
    _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ), v)
#define VSELNEG(x, a, b)                                                                           \
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), b, a)
#define VPOW2I(n)                                                                                  \
    _mm512_castsi512_ps(                                                                           \
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#define VHSUM _mm512_reduce_add_ps
#define VHMAX _mm512_reduce_max_ps
#include "backend/cpu/kern_simd_body.h"
TD_TARGET_END

#endif

/* Row softmax ------------------------------------------------------------------ */

void td__cpu_softmax_row_f32(float *row, size_t n, float scale) {
    /* row (n), in place */
    float mx, sum = 0, inv;
    if (n == 0)
        return;
#ifdef TD_X86_SIMD
    {
        int simd = td__cpu_simd();
        if (simd == TD_SIMD_AVX512) {
            softmax_row_avx512(n, row, scale, NULL);
            return;
        }
        if (simd == TD_SIMD_AVX2) {
            softmax_row_avx2(n, row, scale, NULL);
            return;
        }
    }
#endif
    mx = row[0];
    for (size_t i = 1; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (size_t i = 0; i < n; i++) {
        row[i] = expf(scale * (row[i] - mx));
        sum += row[i];
    }
    inv = 1.0f / sum;
    for (size_t i = 0; i < n; i++)
        row[i] *= inv;
}

void td__cpu_silu_gate_f32(size_t n, const float *g, const float *u, float *h) {
    size_t i = 0;
#ifdef TD_X86_SIMD
    {
        int simd = td__cpu_simd();
        if (simd == TD_SIMD_AVX512)
            i = silu_gate_avx512(n, g, u, h);
        else if (simd == TD_SIMD_AVX2)
            i = silu_gate_avx2(n, g, u, h);
    }
#endif
    for (; i < n; i++)
        h[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* Dispatch ------------------------------------------------------------------ */

typedef enum elem_op {
    OP_ACT_FWD,
    OP_ACT_BWD,
    OP_ADD,
    OP_AXPBY,
    OP_DROPOUT,
    OP_SUMSQ,
    OP_SGD,
    OP_ADAMW,
} elem_op;

typedef struct elem_args {
    elem_op op;
    td_dtype dt;
    td_act act;
    size_t n;
    const void *a, *b, *c;
    void *y, *z, *u;
    double alpha, beta;
    uint64_t seed, offset;
    const td_opt_args *opt;
    int simd;
    double partial[TD_CPU_MAX_PUS];
} elem_args;

#define AT(p, i, es)   ((p) ? (void *)((char *)(p) + (i) * (es)) : NULL)
#define CAT_(p, i, es) ((p) ? (const void *)((const char *)(p) + (i) * (es)) : NULL)

/* Runs the op over [b, e): the vector path first when there is one, then the
 * scalar code over what it left. */
static void elem_range(elem_args *r, size_t b, size_t e, int part) {
    /* elements [b, e) of each of r's arrays (a, b, c, y, z, u): (n) */
    size_t es = td_dtype_size(r->dt), n = e - b, done = 0;
    const void *a = CAT_(r->a, b, es), *bb = CAT_(r->b, b, es), *c = CAT_(r->c, b, es);
    void *y = AT(r->y, b, es), *z = AT(r->z, b, es), *u = AT(r->u, b, es);
    double sq = 0, sq_tail = 0;
    if (r->dt == TD_F32 && r->simd != TD_SIMD_SCALAR) {
#ifdef TD_X86_SIMD
        int w512 = r->simd == TD_SIMD_AVX512;
        switch (r->op) {
        case OP_ACT_FWD:
            if (r->act == TD_ACT_RELU)
                done = w512 ? relu_fwd_avx512(n, a, y) : relu_fwd_avx2(n, a, y);
            else if (r->act == TD_ACT_GELU)
                done = w512 ? gelu_fwd_avx512(n, a, y) : gelu_fwd_avx2(n, a, y);
            break;
        case OP_ACT_BWD:
            if (r->act == TD_ACT_RELU)
                done = w512 ? relu_bwd_avx512(n, a, c, y) : relu_bwd_avx2(n, a, c, y);
            else if (r->act == TD_ACT_GELU)
                done = w512 ? gelu_bwd_avx512(n, a, c, y) : gelu_bwd_avx2(n, a, c, y);
            break;
        case OP_ADD: done = w512 ? add_avx512(n, a, bb, y) : add_avx2(n, a, bb, y); break;
        case OP_AXPBY:
            done = w512 ? axpby_avx512(n, (float)r->alpha, a, (float)r->beta, y)
                        : axpby_avx2(n, (float)r->alpha, a, (float)r->beta, y);
            break;
        case OP_SUMSQ: done = w512 ? sumsq_avx512(n, a, &sq) : sumsq_avx2(n, a, &sq); break;
        case OP_SGD:
            done = w512 ? sgd_avx512(n, y, a, z, r->opt) : sgd_avx2(n, y, a, z, r->opt);
            break;
        case OP_ADAMW:
            done = w512 ? adamw_avx512(n, y, a, z, u, r->opt) : adamw_avx2(n, y, a, z, u, r->opt);
            break;
        case OP_DROPOUT: break;
        }
#endif
    }
    n -= done;
    a = CAT_(a, done, es);
    bb = CAT_(bb, done, es);
    c = CAT_(c, done, es);
    y = AT(y, done, es);
    z = AT(z, done, es);
    u = AT(u, done, es);
    switch (r->op) {
    case OP_ACT_FWD:
        if (r->dt == TD_F32)
            act_fwd_f32(r->act, n, a, y);
        else
            act_fwd_f64(r->act, n, a, y);
        break;
    case OP_ACT_BWD:
        /* a: x, bb: y, c: dy, y: dx */
        if (r->dt == TD_F32)
            act_bwd_f32(r->act, n, a, bb, c, y);
        else
            act_bwd_f64(r->act, n, a, bb, c, y);
        break;
    case OP_ADD:
        if (r->dt == TD_F32)
            add_f32(n, a, bb, y);
        else
            add_f64(n, a, bb, y);
        break;
    case OP_AXPBY:
        if (r->dt == TD_F32)
            axpby_f32(n, (float)r->alpha, a, (float)r->beta, y);
        else
            axpby_f64(n, r->alpha, a, r->beta, y);
        break;
    case OP_SUMSQ:
        if (r->dt == TD_F32)
            sumsq_f32(n, a, &sq_tail);
        else
            sumsq_f64(n, a, &sq_tail);
        r->partial[part] = sq + sq_tail;
        break;
    case OP_SGD:
        if (r->dt == TD_F32)
            sgd_f32(n, y, a, z, r->opt);
        else
            sgd_f64(n, y, a, z, r->opt);
        break;
    case OP_ADAMW:
        if (r->dt == TD_F32)
            adamw_f32(n, y, a, z, u, r->opt);
        else
            adamw_f64(n, y, a, z, u, r->opt);
        break;
    case OP_DROPOUT: {
        double keep = 1.0 / (1.0 - r->alpha);
        for (size_t i = 0; i < n; i++) {
            int kept = td__rng_uniform_at(r->seed, r->offset + b + i) >= r->alpha;
            if (r->dt == TD_F32)
                ((float *)y)[i] = kept ? (float)(((const float *)a)[i] * keep) : 0.0f;
            else
                ((double *)y)[i] = kept ? ((const double *)a)[i] * keep : 0.0;
        }
        break;
    }
    }
}

static void elem_part(void *p, int part, int nparts) {
    elem_args *r = p;
    size_t b, e, blocks = (r->n + 15) / 16;
    /* Split on 16-element boundaries so each part's vectors stay whole. */
    td__part_range(blocks, part, nparts, &b, &e);
    b *= 16;
    e *= 16;
    if (e > r->n)
        e = r->n;
    if (b > e)
        b = e;
    elem_range(r, b, e, part);
}

/* Below this many elements an op stays on one core. */
#define ELEM_PARALLEL_MIN 32768

static void elem_run(void *ctx, elem_args *r) {
    r->simd = td__cpu_simd();
    if (r->n < ELEM_PARALLEL_MIN || td__cpu_threads(ctx) == 1) {
        elem_range(r, 0, r->n, 0);
        return;
    }
    td__cpu_parallel(ctx, elem_part, r);
}

td_status td__cpu_act_fwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, void *y) {
    /* x, y: (n) */
    elem_args r = {.op = OP_ACT_FWD, .dt = dt, .act = act, .n = n, .a = x, .y = y};
    elem_run(ctx, &r);
    return TD_OK;
}

td_status td__cpu_act_bwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x,
                          const void *y, const void *dy, void *dx) {
    /* x, y, dy, dx: (n) */
    elem_args r = {
        .op = OP_ACT_BWD, .dt = dt, .act = act, .n = n, .a = x, .b = y, .c = dy, .y = dx};
    elem_run(ctx, &r);
    return TD_OK;
}

td_status td__cpu_add(void *ctx, td_dtype dt, size_t n, const void *a, const void *b, void *y) {
    /* a, b, y: (n) */
    elem_args r = {.op = OP_ADD, .dt = dt, .n = n, .a = a, .b = b, .y = y};
    elem_run(ctx, &r);
    return TD_OK;
}

td_status td__cpu_axpby(void *ctx, td_dtype dt, size_t n, double alpha, const void *x, double beta,
                        void *y) {
    /* x, y: (n) */
    elem_args r = {.op = OP_AXPBY, .dt = dt, .n = n, .a = x, .y = y, .alpha = alpha, .beta = beta};
    elem_run(ctx, &r);
    return TD_OK;
}

td_status td__cpu_dropout(void *ctx, td_dtype dt, size_t n, double p, uint64_t seed,
                          uint64_t offset, const void *x, void *y) {
    /* x, y: (n) */
    elem_args r = {.op = OP_DROPOUT,
                   .dt = dt,
                   .n = n,
                   .a = x,
                   .y = y,
                   .alpha = p,
                   .seed = seed,
                   .offset = offset};
    elem_run(ctx, &r);
    return TD_OK;
}

td_status td__cpu_sumsq(void *ctx, td_dtype dt, size_t n, const void *x, double *out) {
    /* x (n) -> *out */
    elem_args r = {.op = OP_SUMSQ, .dt = dt, .n = n, .a = x};
    int parts = n < ELEM_PARALLEL_MIN ? 1 : td__cpu_threads(ctx);
    elem_run(ctx, &r);
    *out = 0;
    /* In part order, so the sum does not depend on timing. */
    for (int i = 0; i < parts; i++)
        *out += r.partial[i];
    return TD_OK;
}

td_status td__cpu_sgd(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *buf,
                      const td_opt_args *o) {
    /* w, g, buf: (n) */
    elem_args r = {.op = OP_SGD, .dt = dt, .n = n, .a = g, .y = w, .z = buf, .opt = o};
    elem_run(ctx, &r);
    return TD_OK;
}

td_status td__cpu_adamw(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *m, void *v,
                        const td_opt_args *o) {
    /* w, g, m, v: (n) */
    elem_args r = {.op = OP_ADAMW, .dt = dt, .n = n, .a = g, .y = w, .z = m, .u = v, .opt = o};
    elem_run(ctx, &r);
    return TD_OK;
}

/* Bias ----------------------------------------------------------------------- */

typedef struct bias_args {
    td_dtype dt;
    char *y;
    const char *b;
    int64_t outer, c, inner;
    int simd;
} bias_args;

/* Linear layers (inner 1): rows [r0, r1) of (outer, c) each get the bias vector. */
static void bias_add_vec_rows(bias_args *a, size_t r0, size_t r1) {
    /* rows [r0, r1) of y (outer, c) += b (c) */
    size_t es = td_dtype_size(a->dt), n = (size_t)a->c;
    for (size_t r = r0; r < r1; r++) {
        char *row = a->y + r * n * es;
        size_t done = 0;
#ifdef TD_X86_SIMD
        if (a->dt == TD_F32 && a->simd == TD_SIMD_AVX512)
            done = bias_rows_avx512(n, (float *)row, (const float *)a->b);
        else if (a->dt == TD_F32 && a->simd == TD_SIMD_AVX2)
            done = bias_rows_avx2(n, (float *)row, (const float *)a->b);
#endif
        for (size_t i = done; i < n; i++) {
            if (a->dt == TD_F32)
                ((float *)row)[i] += ((const float *)a->b)[i];
            else
                ((double *)row)[i] += ((const double *)a->b)[i];
        }
    }
}

/* Convolutions: planes [p0, p1) of (outer, c) each get their channel's bias. */
static void bias_add_planes(bias_args *a, size_t p0, size_t p1) {
    /* planes [p0, p1) of y (outer c, inner) += b (c), one value a plane */
    size_t es = td_dtype_size(a->dt), n = (size_t)a->inner;
    for (size_t pl = p0; pl < p1; pl++) {
        int64_t ch = (int64_t)pl % a->c;
        char *row = a->y + pl * n * es;
        size_t done = 0;
        if (a->dt == TD_F32) {
            float bv = ((const float *)a->b)[ch];
#ifdef TD_X86_SIMD
            if (a->simd == TD_SIMD_AVX512)
                done = add_scalar_avx512(n, (float *)row, bv);
            else if (a->simd == TD_SIMD_AVX2)
                done = add_scalar_avx2(n, (float *)row, bv);
#endif
            for (size_t i = done; i < n; i++)
                ((float *)row)[i] += bv;
        } else {
            double bv = ((const double *)a->b)[ch];
            for (size_t i = 0; i < n; i++)
                ((double *)row)[i] += bv;
        }
    }
}

static void bias_add_part(void *p, int part, int nparts) {
    bias_args *a = p;
    size_t r0, r1;
    if (a->inner == 1) {
        td__part_range((size_t)a->outer, part, nparts, &r0, &r1);
        bias_add_vec_rows(a, r0, r1);
    } else {
        td__part_range((size_t)(a->outer * a->c), part, nparts, &r0, &r1);
        bias_add_planes(a, r0, r1);
    }
}

td_status td__cpu_bias_add(void *ctx, td_dtype dt, void *y, const void *bias, int64_t outer,
                           int64_t c, int64_t inner) {
    /* y (outer, c, inner) += bias (c) */
    bias_args a = {dt, y, bias, outer, c, inner, td__cpu_simd()};
    if ((size_t)(outer * c * inner) < ELEM_PARALLEL_MIN)
        bias_add_part(&a, 0, 1);
    else
        td__cpu_parallel(ctx, bias_add_part, &a);
    return TD_OK;
}

typedef struct bias_grad_args {
    td_dtype dt;
    char *db;
    const char *dy;
    int64_t outer, c, inner;
    int acc;
} bias_grad_args;

/* Each part owns a range of channels, so no two parts write one sum. */
static void bias_grad_part(void *p, int part, int nparts) {
    /* channels [c0, c1) of db (c) from dy (outer, c, inner) */
    bias_grad_args *a = p;
    size_t c0, c1;
    td__part_range((size_t)a->c, part, nparts, &c0, &c1);
    if (a->dt == TD_F32) {
        float *db = (float *)a->db;
        const float *dy = (const float *)a->dy;
        if (a->inner == 1) {
            /* Sums of this batch first, then added: accumulating two equal
             * batches gives exactly twice one. */
            for (size_t b0 = c0; b0 < c1; b0 += 256) {
                float sum[256];
                size_t w = c1 - b0 < 256 ? c1 - b0 : 256;
                memset(sum, 0, sizeof sum);
                for (int64_t o = 0; o < a->outer; o++) {
                    const float *row = dy + o * a->c + b0;
                    for (size_t j = 0; j < w; j++)
                        sum[j] += row[j];
                }
                for (size_t j = 0; j < w; j++)
                    db[b0 + j] = a->acc ? db[b0 + j] + sum[j] : sum[j];
            }
            return;
        }
        for (size_t ch = c0; ch < c1; ch++) {
            double s = 0;
            for (int64_t o = 0; o < a->outer; o++) {
                const float *row = dy + (o * a->c + (int64_t)ch) * a->inner;
                for (int64_t i = 0; i < a->inner; i++)
                    s += row[i];
            }
            db[ch] = (float)(a->acc ? db[ch] + s : s);
        }
    } else {
        double *db = (double *)a->db;
        const double *dy = (const double *)a->dy;
        for (size_t ch = c0; ch < c1; ch++)
            if (!a->acc)
                db[ch] = 0;
        for (int64_t o = 0; o < a->outer; o++)
            for (size_t ch = c0; ch < c1; ch++) {
                const double *row = dy + (o * a->c + (int64_t)ch) * a->inner;
                double s = 0;
                for (int64_t i = 0; i < a->inner; i++)
                    s += row[i];
                db[ch] += s;
            }
    }
}

td_status td__cpu_bias_grad(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer,
                            int64_t c, int64_t inner, int acc) {
    /* dy (outer, c, inner) -> db (c) */
    bias_grad_args a = {dt, db, dy, outer, c, inner, acc};
    if ((size_t)(outer * c * inner) < ELEM_PARALLEL_MIN || c < td__cpu_threads(ctx))
        bias_grad_part(&a, 0, 1);
    else
        td__cpu_parallel(ctx, bias_grad_part, &a);
    return TD_OK;
}
