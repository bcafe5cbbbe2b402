/* im2col in AVX-512 for convolutions of stride 1. The rows im2col copies are
 * short (an output row: 28 floats for LeNet-5's first layer, 10 for its
 * second), so the plain loop spent its time on remainders and zero fills;
 * here each 16 floats of a row is one masked load, whose lanes outside the
 * image read as zeros (the padding), and one masked store. Masked-off lanes
 * are never accessed, so reading "before" an image row is safe. */
#include "backend/cpu/cpu-kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>

#define MAX_CHUNKS 64 /* rows of up to 1024 outputs */

// clang-format off
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif
// clang-format on

/* The lanes [lo, hi) of the 16 from j0, as a mask. */
static __mmask16 lanes(int64_t j0, int64_t lo, int64_t hi) {
    int64_t a = lo - j0 < 0 ? 0 : lo - j0, b = hi - j0 > 16 ? 16 : hi - j0;
    if (b <= a)
        return 0;
    return (__mmask16)((((uint32_t)1 << (b - a)) - 1) << a);
}

int td__cpu_im2col512(const td_conv_desc *d, const float *x, float *col, int64_t ld) {
    /* x (c, h, w) -> col (c kh kw, oh ow), rows ld apart */
    int64_t chunks = (d->ow + 15) / 16;
    __mmask16 store[MAX_CHUNKS], load[MAX_CHUNKS];
    if (d->stride != 1 || chunks > MAX_CHUNKS)
        return 0;
    for (int64_t j = 0; j < chunks; j++)
        store[j] = lanes(j * 16, 0, d->ow);
    for (int64_t ci = 0; ci < d->c; ci++)
        for (int64_t kj = 0; kj < d->kw; kj++) {
            /* Output column oj reads input column oj + off. */
            int64_t off = kj - d->pad;
            for (int64_t j = 0; j < chunks; j++)
                load[j] = lanes(j * 16, -off, d->w - off) & store[j];
            for (int64_t ki = 0; ki < d->kh; ki++) {
                float *row = col + ((ci * d->kh + ki) * d->kw + kj) * ld;
                const float *plane = x + ci * d->h * d->w;
                for (int64_t oi = 0; oi < d->oh; oi++) {
                    int64_t ii = oi - d->pad + ki;
                    float *out = row + oi * d->ow;
                    if (ii < 0 || ii >= d->h) {
                        for (int64_t j = 0; j < chunks; j++)
                            _mm512_mask_storeu_ps(out + j * 16, store[j], _mm512_setzero_ps());
                        continue;
                    }
                    /* An address, not a pointer into the image: with off < 0
                     * it lies before the row, in lanes that are masked off. */
                    uintptr_t in = (uintptr_t)(plane + ii * d->w) + (uintptr_t)(off * 4);
                    for (int64_t j = 0; j < chunks; j++)
                        _mm512_mask_storeu_ps(
                            out + j * 16, store[j],
                            _mm512_maskz_loadu_ps(load[j], (const void *)(in + (uintptr_t)j * 64)));
                }
            }
        }
    return 1;
}

// clang-format off
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
// clang-format on

#else

int td__cpu_im2col512(const td_conv_desc *d, const float *x, float *col, int64_t ld) {
    (void)d, (void)x, (void)col, (void)ld;
    return 0;
}

#endif
