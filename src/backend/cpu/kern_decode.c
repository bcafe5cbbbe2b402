/* One decoded position's attention on a logical CPU device (the attend_step
 * slot): each query head's scores against its key head's cached rows, their
 * softmax, and the sum of the value rows they weigh.
 *
 * A decode step reads every cached key and value once, and the composed
 * path (two batched GEMMs and a cross-entropy kernel, decode.c) packs K for
 * a GEMM of one row and, with a half-precision cache, first widens the
 * whole cache into an f32 copy. This kernel reads the rows where they are,
 * in f32, f16 or bf16, widening 16 values at a time, with the query heads
 * shared among the device's cores. */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/error.h"
#include "core/quant.h"

/* Below this many cached bytes a step stays on the calling core. */
#define PARALLEL_MIN (64.0 * 1024.0)

typedef struct attend_args {
    int kind; /* 0: f32, 1: f16, 2: bf16 */
    int64_t h, g, d, len, ld;
    float scale;
    const float *q;
    const void *k, *v;
    float *y;
    float *s; /* (h, len) scores, then probabilities */
} attend_args;

static float value_at(int kind, const void *base, size_t i) {
    if (kind == 0)
        return ((const float *)base)[i];
    return kind == 1 ? td__f16_to_f32(((const uint16_t *)base)[i])
                     : td__bf16_to_f32(((const uint16_t *)base)[i]);
}

/* Portable C: one head. */
static void head_c(const attend_args *a, int64_t i) {
    const float *q = a->q + i * a->d;
    size_t col = (size_t)((i / a->g) * a->d);
    float *s = a->s + i * a->len, *y = a->y + i * a->d;
    for (int64_t t = 0; t < a->len; t++) {
        float acc = 0.0f;
        for (int64_t c = 0; c < a->d; c++)
            acc += q[c] * value_at(a->kind, a->k, (size_t)(t * a->ld) + col + (size_t)c);
        s[t] = acc;
    }
    td__cpu_softmax_row_f32(s, (size_t)a->len, a->scale);
    for (int64_t c = 0; c < a->d; c++)
        y[c] = 0.0f;
    for (int64_t t = 0; t < a->len; t++)
        for (int64_t c = 0; c < a->d; c++)
            y[c] += s[t] * value_at(a->kind, a->v, (size_t)(t * a->ld) + col + (size_t)c);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86 1

/* 16 values of a row from element i, widened to f32 (both widenings exact). */
__attribute__((target("avx512f"))) static inline __m512 load16(int kind, const void *base,
                                                               size_t i) {
    if (kind == 0)
        return _mm512_loadu_ps((const float *)base + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i));
    return kind == 1 ? _mm512_cvtph_ps(h)
                     : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* d a multiple of 16, at most 256: q and the output held in registers' worth
 * of stack, one pass over K and one over V. */
__attribute__((target("avx512f"))) static void head_avx512(const attend_args *a, int64_t i) {
    const float *q = a->q + i * a->d;
    size_t col = (size_t)((i / a->g) * a->d);
    int64_t nv = a->d / 16;
    float *s = a->s + i * a->len, *y = a->y + i * a->d;
    __m512 qv[16], acc[16];
    for (int64_t c = 0; c < nv; c++)
        qv[c] = _mm512_loadu_ps(q + 16 * c);
    for (int64_t t = 0; t < a->len; t++) {
        size_t row = (size_t)(t * a->ld) + col;
        __m512 sum = _mm512_mul_ps(qv[0], load16(a->kind, a->k, row));
        for (int64_t c = 1; c < nv; c++)
            sum = _mm512_fmadd_ps(qv[c], load16(a->kind, a->k, row + (size_t)(16 * c)), sum);
        s[t] = _mm512_reduce_add_ps(sum);
    }
    td__cpu_softmax_row_f32(s, (size_t)a->len, a->scale);
    for (int64_t c = 0; c < nv; c++)
        acc[c] = _mm512_setzero_ps();
    for (int64_t t = 0; t < a->len; t++) {
        size_t row = (size_t)(t * a->ld) + col;
        __m512 p = _mm512_set1_ps(s[t]);
        for (int64_t c = 0; c < nv; c++)
            acc[c] = _mm512_fmadd_ps(p, load16(a->kind, a->v, row + (size_t)(16 * c)), acc[c]);
    }
    for (int64_t c = 0; c < nv; c++)
        _mm512_storeu_ps(y + 16 * c, acc[c]);
}
#else
#define HAVE_X86 0
#endif

static void heads_range(const attend_args *a, int64_t lo, int64_t hi) {
#if HAVE_X86
    if (td__cpu_simd() == TD_SIMD_AVX512 && a->d % 16 == 0 && a->d <= 256) {
        for (int64_t i = lo; i < hi; i++)
            head_avx512(a, i);
        return;
    }
#endif
    for (int64_t i = lo; i < hi; i++)
        head_c(a, i);
}

static void attend_part(void *arg, int part, int nparts) {
    const attend_args *a = arg;
    size_t lo, hi;
    td__part_range((size_t)a->h, part, nparts, &lo, &hi);
    heads_range(a, (int64_t)lo, (int64_t)hi);
}

td_status td__cpu_attend_step(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                              float scale, const float *q, const void *k, const void *v, int64_t ld,
                              float *y) {
    cpu_device *cd = ctx;
    attend_args a = {kind, h, kv > 0 ? h / kv : 0, d, len, ld, scale, q, k, v, y, NULL};
    if (kind < 0 || kind > 2 || h < 1 || kv < 1 || h % kv || d < 1 || len < 1 || ld < 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "attend_step: kind %d, %lld heads over %lld, d %lld, %lld positions, "
                         "rows of %lld",
                         kind, (long long)h, (long long)kv, (long long)d, (long long)len,
                         (long long)ld);
    if (!(a.s = malloc((size_t)(h * len) * sizeof *a.s)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "attend_step: no memory for %lld scores",
                         (long long)(h * len));
    if (!cd || td__cpu_threads(cd) == 1 ||
        2.0 * (double)(kv * d * len) * (kind ? 2.0 : 4.0) < PARALLEL_MIN)
        heads_range(&a, 0, h);
    else
        td__cpu_parallel(cd, attend_part, &a);
    free(a.s);
    return TD_OK;
}
