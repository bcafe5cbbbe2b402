/* Products with compact weights on a logical CPU device: y = x W^T with W
 * in bf16 or q8_0, x and y f32 (the matmul_compact slot). Batch-1 decoding
 * reads every weight once per token, so these read W once, in its compact
 * bytes, rows split over the device's cores as kern_gemv.c splits f32 rows.
 *
 * As llama.cpp does, x is first rounded to the weights' kind: to q8_0 blocks
 * (so that a block's product is a sum of int8 products, exact in int32,
 * times the two scales) or to bf16 (so that each product is exact in f32).
 * Every path therefore computes the same products; only the order of the
 * f32 sums differs. The paths, best first, chosen at run time:
 *   q8_0: AVX512-VNNI vpdpbusd, two blocks a step | AVX2 vpmaddubsw | C
 *   bf16: AVX512-BF16 vdpbf16ps | AVX-512F widening | AVX2 widening | C
 * TANDEM_SIMD lowers the choice (isa.c) so each path can be run. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"
#include "core/quant.h"

/* Shares are whole groups of this many rows; below PARALLEL_MIN weight
 * bytes the product stays on the calling core. */
#define ROWS_ALIGN   16
#define PARALLEL_MIN (64.0 * 1024.0)

/* x rounded for the products: one row of it. */
typedef struct xrow {
    const td_block_q8_0 *q; /* q8_0: cols / 32 blocks */
    const float *qd;        /* their scales as f32 */
    const uint16_t *h;      /* bf16: cols values */
} xrow;

/* Portable C ----------------------------------------------------------------------------- */

static float dot_q8_0_c(const uint8_t *w, const xrow *x, int64_t nb) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * TD_Q8_0_BYTES;
        const int8_t *qw = (const int8_t *)(wb + 2);
        int32_t s = 0;
        for (int j = 0; j < TD_Q8_0_BLOCK; j++)
            s += (int32_t)qw[j] * x->q[b].qs[j];
        acc += (float)s * (td__f16_to_f32((uint16_t)(wb[0] | wb[1] << 8)) * x->qd[b]);
    }
    return acc;
}

static float dot_bf16_c(const uint16_t *w, const xrow *x, int64_t k) {
    float acc = 0.0f;
    for (int64_t p = 0; p < k; p++)
        acc += td__bf16_to_f32(w[p]) * td__bf16_to_f32(x->h[p]);
    return acc;
}

/* x86 paths ---------------------------------------------------------------------------- */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1

__attribute__((target("avx2"))) static float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma,f16c"))) static float dot_q8_0_avx2(const uint8_t *w, const xrow *x,
                                                                    int64_t nb) {
    /* per block: |qw| (u8) times qx with qw's sign (s8), pairs summed in
     * int16 (at most 2 * 127 * 127: no saturation), then in int32 */
    __m256 acc = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *wb = w + b * TD_Q8_0_BYTES;
        __m256i qw = _mm256_loadu_si256((const __m256i *)(wb + 2));
        __m256i qx = _mm256_loadu_si256((const __m256i *)x->q[b].qs);
        __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        __m256 s = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
        float d = _cvtsh_ss((unsigned short)(wb[0] | wb[1] << 8)) * x->qd[b];
        acc = _mm256_fmadd_ps(s, _mm256_set1_ps(d), acc);
    }
    return hsum256(acc);
}

__attribute__((target("avx512f,avx512vl,avx512vnni,avx2,fma,f16c"))) static float
dot_q8_0_vnni(const uint8_t *w, const xrow *x, int64_t nb) {
    /* vpdpbusd: the 4-byte groups of |qw| . (qx with qw's sign) in one step */
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *w0 = w + b * TD_Q8_0_BYTES, *w1 = w0 + TD_Q8_0_BYTES;
        __m256i q0 = _mm256_loadu_si256((const __m256i *)(w0 + 2));
        __m256i q1 = _mm256_loadu_si256((const __m256i *)(w1 + 2));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x->q[b].qs);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)x->q[b + 1].qs);
        __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q0, q0),
                                         _mm256_sign_epi8(x0, q0));
        __m256i s1 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q1, q1),
                                         _mm256_sign_epi8(x1, q1));
        float d0 = _cvtsh_ss((unsigned short)(w0[0] | w0[1] << 8)) * x->qd[b];
        float d1 = _cvtsh_ss((unsigned short)(w1[0] | w1[1] << 8)) * x->qd[b + 1];
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(d1), acc1);
    }
    for (; b < nb; b++) {
        const uint8_t *w0 = w + b * TD_Q8_0_BYTES;
        __m256i q0 = _mm256_loadu_si256((const __m256i *)(w0 + 2));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)x->q[b].qs);
        __m256i s0 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q0, q0),
                                         _mm256_sign_epi8(x0, q0));
        float d0 = _cvtsh_ss((unsigned short)(w0[0] | w0[1] << 8)) * x->qd[b];
        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_set1_ps(d0), acc0);
    }
    return hsum256(_mm256_add_ps(acc0, acc1));
}

/* Two blocks a step in 512 bits: |qw| by vpabsb, qx negated where qw is
 * negative by a masked subtract, then one vpdpbusd and one FMA whose
 * scale vector holds each block's scale in its half. */
__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c"))) static float
dot_q8_0_vnni512(const uint8_t *w, const xrow *x, int64_t nb) {
    __m512 acc = _mm512_setzero_ps();
    const __m512i zero = _mm512_setzero_si512();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        const uint8_t *w0 = w + b * TD_Q8_0_BYTES, *w1 = w0 + TD_Q8_0_BYTES;
        __m512i qw = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + 2))),
            _mm256_loadu_si256((const __m256i *)(w1 + 2)), 1);
        __m512i qx = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x->q[b].qs)),
            _mm256_loadu_si256((const __m256i *)x->q[b + 1].qs), 1);
        __m512i sx = _mm512_mask_sub_epi8(qx, _mm512_movepi8_mask(qw), zero, qx);
        __m512i s = _mm512_dpbusd_epi32(zero, _mm512_abs_epi8(qw), sx);
        float d0 = _cvtsh_ss((unsigned short)(w0[0] | w0[1] << 8)) * x->qd[b];
        float d1 = _cvtsh_ss((unsigned short)(w1[0] | w1[1] << 8)) * x->qd[b + 1];
        __m512 d = _mm512_insertf32x8(_mm512_set1_ps(d0), _mm256_set1_ps(d1), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc);
    }
    float sum = _mm512_reduce_add_ps(acc);
    return b < nb
               ? sum + dot_q8_0_vnni(w + b * TD_Q8_0_BYTES, &(xrow){x->q + b, x->qd + b, NULL}, 1)
               : sum;
}

__attribute__((target("avx2,fma"))) static float dot_bf16_avx2(const uint16_t *w, const xrow *x,
                                                               int64_t k) {
    /* a bf16 is the top half of an f32: widen by shifting */
    __m256 acc = _mm256_setzero_ps();
    int64_t p = 0;
    for (; p + 8 <= k; p += 8) {
        __m256i wv = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + p)));
        __m256i xv = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x->h + p)));
        acc = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(wv, 16)),
                              _mm256_castsi256_ps(_mm256_slli_epi32(xv, 16)), acc);
    }
    float s = hsum256(acc);
    for (; p < k; p++)
        s += td__bf16_to_f32(w[p]) * td__bf16_to_f32(x->h[p]);
    return s;
}

__attribute__((target("avx512f"))) static float dot_bf16_avx512(const uint16_t *w, const xrow *x,
                                                                int64_t k) {
    __m512 acc = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 16 <= k; p += 16) {
        __m512i wv = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(w + p)));
        __m512i xv = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x->h + p)));
        acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wv, 16)),
                              _mm512_castsi512_ps(_mm512_slli_epi32(xv, 16)), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    for (; p < k; p++)
        s += td__bf16_to_f32(w[p]) * td__bf16_to_f32(x->h[p]);
    return s;
}

__attribute__((target("avx512f,avx512bf16"))) static float dot_bf16_dp(const uint16_t *w,
                                                                       const xrow *x, int64_t k) {
    /* vdpbf16ps: pairs of bf16 products summed into f32 lanes */
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + 64 <= k; p += 64) {
        __m512i w0 = _mm512_loadu_si512((const void *)(w + p));
        __m512i w1 = _mm512_loadu_si512((const void *)(w + p + 32));
        __m512i x0 = _mm512_loadu_si512((const void *)(x->h + p));
        __m512i x1 = _mm512_loadu_si512((const void *)(x->h + p + 32));
        acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)w0, (__m512bh)x0);
        acc1 = _mm512_dpbf16_ps(acc1, (__m512bh)w1, (__m512bh)x1);
    }
    for (; p + 32 <= k; p += 32)
        acc0 = _mm512_dpbf16_ps(acc0, (__m512bh)_mm512_loadu_si512((const void *)(w + p)),
                                (__m512bh)_mm512_loadu_si512((const void *)(x->h + p)));
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    for (; p < k; p++)
        s += td__bf16_to_f32(w[p]) * td__bf16_to_f32(x->h[p]);
    return s;
}
/* x rounded to q8_0 blocks as td__quantize_q8_0 does it, bit for bit: the
 * same f32 scale and reciprocal, the same products, and roundf's ties away
 * from zero (the fraction's test below), 32 values a block in two vectors.
 * The scales also go out as f32 (qd), as the dot products read them. */
__attribute__((target("avx512f,f16c"))) static void
quantize_row_avx512(const float *x, int64_t nb, td_block_q8_0 *q, float *qd) {
    const __m512 half = _mm512_set1_ps(0.5f);
    for (int64_t b = 0; b < nb; b++) {
        __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512 r[2];
        for (int k = 0; k < 2; k++) {
            __m512 p = _mm512_mul_ps(k ? v1 : v0, vid);
            __m512 t = _mm512_roundscale_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(p, t)), half, _CMP_GE_OQ);
            __m512 one = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_castps_si512(_mm512_set1_ps(1.0f)),
                _mm512_and_si512(_mm512_castps_si512(p), _mm512_set1_epi32(INT32_MIN))));
            r[k] = _mm512_mask_add_ps(t, up, t, one);
        }
        _mm_storeu_si128((__m128i *)q[b].qs, _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(r[0])));
        _mm_storeu_si128((__m128i *)(q[b].qs + 16),
                         _mm512_cvtsepi32_epi8(_mm512_cvttps_epi32(r[1])));
        q[b].d = td__f32_to_f16(d);
        qd[b] = td__f16_to_f32(q[b].d);
    }
}
#else
#define HAVE_X86 0
#endif

/* Choosing a path ------------------------------------------------------------------------- */

td_compact_path td__cpu_compact_best(td_weights fmt) {
    td_cpu_simd simd = td__cpu_simd();
    if (simd == TD_SIMD_AVX512 &&
        (fmt == TD_WEIGHTS_Q8_0 ? td__cpu_has_vnni() : td__cpu_has_bf16()))
        return TD_CPATH_EXT;
    if (simd == TD_SIMD_AVX512 && fmt == TD_WEIGHTS_BF16)
        return TD_CPATH_AVX512;
    return simd >= TD_SIMD_AVX2 ? TD_CPATH_AVX2 : TD_CPATH_SCALAR;
}

const char *td__cpu_compact_path_name(td_weights fmt, td_compact_path p) {
    static const char *q8[] = {"C (int32 sums)", "AVX2 vpmaddubsw", "AVX2 vpmaddubsw",
                               "AVX512-VNNI vpdpbusd"};
    static const char *bf[] = {"C", "AVX2 widening FMA", "AVX-512F widening FMA",
                               "AVX512-BF16 vdpbf16ps"};
    return fmt == TD_WEIGHTS_Q8_0 ? q8[p] : bf[p];
}

static float dot_row(td_compact_path p, td_weights fmt, const void *wrow, const xrow *x,
                     int64_t cols) {
#if HAVE_X86
    if (fmt == TD_WEIGHTS_Q8_0) {
        if (p == TD_CPATH_EXT)
            return dot_q8_0_vnni512(wrow, x, cols / TD_Q8_0_BLOCK);
        if (p != TD_CPATH_SCALAR)
            return dot_q8_0_avx2(wrow, x, cols / TD_Q8_0_BLOCK);
    } else {
        if (p == TD_CPATH_EXT)
            return dot_bf16_dp(wrow, x, cols);
        if (p == TD_CPATH_AVX512)
            return dot_bf16_avx512(wrow, x, cols);
        if (p == TD_CPATH_AVX2)
            return dot_bf16_avx2(wrow, x, cols);
    }
#else
    (void)p;
#endif
    return fmt == TD_WEIGHTS_Q8_0 ? dot_q8_0_c(wrow, x, cols / TD_Q8_0_BLOCK)
                                  : dot_bf16_c(wrow, x, cols);
}

/* One product: x rounded once, then rows of W shared among the parts. */
typedef struct compact_args {
    td_compact_path path;
    td_weights fmt;
    int64_t n, rows, cols;
    size_t row_bytes;
    const uint8_t *w;
    xrow *x; /* n rows */
    float *y;
} compact_args;

static void rows_range(const compact_args *a, int64_t lo, int64_t hi) {
    /* y[i, lo:hi] = x_i . W[lo:hi] for each of the n rows of x; a row of W
     * stays in cache for every row of x (a prefill streams W once) */
    for (int64_t r = lo; r < hi; r++)
        for (int64_t i = 0; i < a->n; i++)
            a->y[i * a->rows + r] =
                dot_row(a->path, a->fmt, a->w + (size_t)r * a->row_bytes, &a->x[i], a->cols);
}

static void compact_part(void *arg, int part, int nparts) {
    const compact_args *a = arg;
    int64_t groups = (a->rows + ROWS_ALIGN - 1) / ROWS_ALIGN;
    size_t gb, ge;
    td__part_range((size_t)groups, part, nparts, &gb, &ge);
    int64_t hi = (int64_t)ge * ROWS_ALIGN;
    rows_range(a, (int64_t)gb * ROWS_ALIGN, hi < a->rows ? hi : a->rows);
}

/* x (n, cols) rounded into xs (n rows) in buf: q8_0 blocks and their f32
 * scales, or bf16 values. */
static void round_x(td_weights fmt, int64_t n, int64_t cols, const float *x, void *buf, xrow *xs) {
    int64_t nb = cols / TD_Q8_0_BLOCK;
    for (int64_t i = 0; i < n; i++) {
        if (fmt == TD_WEIGHTS_Q8_0) {
            /* the f32 scales first: they need 4-byte alignment, blocks 2 */
            float *qd = (float *)buf + i * nb;
            td_block_q8_0 *q = (td_block_q8_0 *)((float *)buf + n * nb) + i * nb;
#if HAVE_X86
            if (td__cpu_simd() == TD_SIMD_AVX512) {
                quantize_row_avx512(x + i * cols, nb, q, qd);
                xs[i].q = q, xs[i].qd = qd, xs[i].h = NULL;
                continue;
            }
#endif
            td__quantize_q8_0(x + i * cols, (size_t)cols, q);
            for (int64_t b = 0; b < nb; b++)
                qd[b] = td__f16_to_f32(q[b].d);
            xs[i].q = q, xs[i].qd = qd, xs[i].h = NULL;
        } else {
            uint16_t *h = (uint16_t *)buf + i * cols;
            for (int64_t p = 0; p < cols; p++)
                h[p] = td__f32_to_bf16(x[i * cols + p]);
            xs[i].q = NULL, xs[i].qd = NULL, xs[i].h = h;
        }
    }
}

static size_t round_bytes(td_weights fmt, int64_t n, int64_t cols) {
    return fmt == TD_WEIGHTS_Q8_0
               ? (size_t)(n * (cols / TD_Q8_0_BLOCK)) * (sizeof(td_block_q8_0) + sizeof(float))
               : (size_t)(n * cols) * sizeof(uint16_t);
}

static td_status run_compact(cpu_device *cd, td_compact_path path, td_weights fmt, int64_t n,
                             int64_t rows, int64_t cols, const float *x, const void *w, float *y) {
    /* x (n, cols), W (rows, cols) compact -> y (n, rows) */
    compact_args a = {path, fmt, n, rows, cols, 0, w, NULL, y};
    void *buf;
    if (fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_INVALID_ARG,
                         "matmul_compact: q8_0 rows of %lld values are not whole blocks of 32",
                         (long long)cols);
    a.row_bytes = fmt == TD_WEIGHTS_Q8_0 ? (size_t)(cols / TD_Q8_0_BLOCK) * TD_Q8_0_BYTES
                                         : (size_t)cols * sizeof(uint16_t);
    buf = malloc(round_bytes(fmt, n, cols) + 64);
    a.x = malloc((size_t)n * sizeof *a.x);
    if (!buf || !a.x) {
        free(buf);
        free(a.x);
        return td__error(TD_ERR_OUT_OF_MEMORY, "matmul_compact: no memory to round x");
    }
    round_x(fmt, n, cols, x, buf, a.x);
    if (!cd || td__cpu_threads(cd) == 1 || (double)rows * (double)a.row_bytes < PARALLEL_MIN)
        rows_range(&a, 0, rows);
    else
        td__cpu_parallel(cd, compact_part, &a);
    free(buf);
    free(a.x);
    return TD_OK;
}

td_status td__cpu_matmul_compact_path(td_compact_path path, td_weights fmt, int64_t n, int64_t rows,
                                      int64_t cols, const float *x, const void *w, float *y) {
    return run_compact(NULL, path, fmt, n, rows, cols, x, w, y);
}

td_status td__cpu_matmul_compact(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                                 const float *x, const void *w, float *y) {
    return run_compact(ctx, td__cpu_compact_best(fmt), fmt, n, rows, cols, x, w, y);
}

/* Half-precision key/value caches ---------------------------------------------------- */

#if HAVE_X86
/* 2-byte values to f32, 8 at a time: F16C for f16, a shift for bf16 (both
 * exact); the tail and the other direction (a pass's few rows) in C. */
__attribute__((target("avx2,f16c"))) static size_t widen_x86(int kind, size_t n,
                                                             const uint16_t *src, float *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + i));
        __m256 f = kind == 1 ? _mm256_cvtph_ps(h)
                             : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
        _mm256_storeu_ps(dst + i, f);
    }
    return i;
}
#endif

td_status td__cpu_convert_half(void *ctx, int kind, int to_half, size_t n, const void *src,
                               void *dst) {
    size_t i = 0;
    (void)ctx;
    if (to_half) {
        for (; i < n; i++)
            ((uint16_t *)dst)[i] = kind == 1 ? td__f32_to_f16(((const float *)src)[i])
                                             : td__f32_to_bf16(((const float *)src)[i]);
        return TD_OK;
    }
#if HAVE_X86
    if (td__cpu_simd() >= TD_SIMD_AVX2)
        i = widen_x86(kind, n, src, dst);
#endif
    for (; i < n; i++)
        ((float *)dst)[i] = kind == 1 ? td__f16_to_f32(((const uint16_t *)src)[i])
                                      : td__bf16_to_f32(((const uint16_t *)src)[i]);
    return TD_OK;
}
