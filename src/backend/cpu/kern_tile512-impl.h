/* The f32 and bf16 AVX-512 GEMM kernels' shared pieces (kern_sgemm.c,
 * kern_bgemm.c): both accumulate 12-row tiles of 32 f32 columns. Included
 * inside each file's AVX-512 target region. */
#ifndef TD_BACKEND_CPU_KERN_TILE512_IMPL_H
#define TD_BACKEND_CPU_KERN_TILE512_IMPL_H

#include <immintrin.h>
#include <stdint.h>

/* Stores rows [0, mr) of the tile: C = alpha acc + beta C, columns masked. */
static inline __attribute__((always_inline)) void store_tile(const int mrv, __m512 *c0, __m512 *c1,
                                                             float *c, int64_t ldc, int64_t mr,
                                                             __mmask16 m0, __mmask16 m1,
                                                             float alpha, float beta) {
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    /* Over the constant mrv, so the accumulators stay in registers. */
#pragma GCC unroll 12
    for (int i = 0; i < mrv; i++) {
        float *row = c + i * ldc;
        __m512 r0 = _mm512_mul_ps(va, c0[i]), r1 = _mm512_mul_ps(va, c1[i]);
        if (i >= mr)
            break;
        if (beta != 0.0f) {
            r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), r0);
            r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), r1);
        }
        _mm512_mask_storeu_ps(row, m0, r0);
        _mm512_mask_storeu_ps(row + 16, m1, r1);
    }
}

/* Rows per strip for m rows: the fewest strips, then the tallest kernel
 * (LeNet's convolutions have 6 and 16 output channels: 6 and 8 waste
 * nothing where 12 wasted half and a third). */
static int strip_rows(int64_t m) {
    static const int opts[] = {12, 8, 6, 4};
    int best = 12;
    int64_t best_pad = (m + 11) / 12 * 12 - m;
    for (int i = 1; i < 4; i++) {
        int64_t pad = (m + opts[i] - 1) / opts[i] * opts[i] - m;
        if (pad < best_pad) {
            best = opts[i];
            best_pad = pad;
        }
    }
    return best;
}

#endif
