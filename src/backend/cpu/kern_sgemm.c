/* An AVX-512 SGEMM for one core, for CPUs whose OpenBLAS build is held to
 * its AVX2 (Haswell) kernels: C (m, n) = alpha op(A) op(B) + beta C, row-major.
 *
 * B is packed in strips of 32 columns (two vectors) by KC rows; the
 * micro-kernel keeps a 12 x 32 tile of C in 24 registers and streams B's
 * strip while broadcasting 12 rows of A, read in place (A's strip, 12 x 384
 * floats, stays in L1 while the kernel walks the packed B block, 384 x 384, in
 * L2). The last strip of fewer than 12 rows is packed with zero rows; columns
 * past n are zeros in the packed B and masked when storing. */
#include <string.h>

#include "backend/cpu/cpu-kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define MR 12
#define NR 32
#define KC 384
#define NC 384

// clang-format off
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
// clang-format on

/* r[i][j] <- r[j][i] for 16 rows of 16 floats. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* dst (kc, 32) from w <= 32 rows of b (b[j][p], row stride ldb), columns
 * past w zero: a transpose. A full strip goes in 16 x 16 register blocks:
 * the forward pass of a linear layer packs its whole weight this way every
 * step, whatever the batch, and a scalar scatter here was most of a small
 * batch's fixed cost. What is left (a partial strip, kc's last rows) reads
 * rows of b and scatters into columns. */
static void pack_bt(const float *b, int64_t ldb, int64_t kc, int64_t w, float *dst) {
    int64_t p0 = 0;
    for (; w == NR && p0 + 16 <= kc; p0 += 16)
        for (int h = 0; h < 2; h++) {
            __m512 r[16];
            for (int j = 0; j < 16; j++)
                r[j] = _mm512_loadu_ps(b + (h * 16 + j) * ldb + p0);
            transpose16(r);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_ps(dst + (p0 + i) * NR + h * 16, r[i]);
        }
    for (int64_t j = 0; j < NR; j++)
        for (int64_t p = p0; p < kc; p++)
            dst[p * NR + j] = j < w ? b[j * ldb + p] : 0;
}

/* Bp (ceil(nc / 32), kc, 32) from op(B)[pc:pc+kc, jc:jc+nc]. */
static void pack_b(int tb, const float *b, int64_t ldb, int64_t pc, int64_t jc, int64_t kc,
                   int64_t nc, float *bp) {
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        int64_t w = nc - j0 < NR ? nc - j0 : NR;
        float *dst = bp + j0 * kc;
        if (!tb) {
            for (int64_t p = 0; p < kc; p++) {
                const float *src = b + (pc + p) * ldb + jc + j0;
                if (w == NR) {
                    _mm512_storeu_ps(dst + p * NR, _mm512_loadu_ps(src));
                    _mm512_storeu_ps(dst + p * NR + 16, _mm512_loadu_ps(src + 16));
                } else {
                    int64_t j = 0;
                    for (; j < w; j++)
                        dst[p * NR + j] = src[j];
                    for (; j < NR; j++)
                        dst[p * NR + j] = 0;
                }
            }
        } else {
            pack_bt(b + (jc + j0) * ldb + pc, ldb, kc, w, dst);
        }
    }
}

/* Ap (kc, 12) from op(A)[ir:ir+mr, pc:pc+kc], rows past mr zero. */
static void pack_a(int ta, const float *a, int64_t lda, int64_t ir, int64_t pc, int64_t kc,
                   int64_t mr, float *ap) {
    if (ta) {
        for (int64_t p = 0; p < kc; p++) {
            const float *src = a + (pc + p) * lda + ir;
            int64_t i = 0;
            for (; i < mr; i++)
                ap[p * MR + i] = src[i];
            for (; i < MR; i++)
                ap[p * MR + i] = 0;
        }
        return;
    }
    for (int64_t i = 0; i < MR; i++) {
        if (i < mr) {
            const float *src = a + (ir + i) * lda + pc;
            for (int64_t p = 0; p < kc; p++)
                ap[p * MR + i] = src[p];
        } else {
            for (int64_t p = 0; p < kc; p++)
                ap[p * MR + i] = 0;
        }
    }
}

/* Stores rows [0, mr) of the tile: C = alpha acc + beta C, columns masked. */
static inline void store_tile(__m512 *c0, __m512 *c1, float *c, int64_t ldc, int64_t mr, int64_t nr,
                              float alpha, float beta) {
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32  ? (__mmask16)0xFFFF
                   : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1)
                             : (__mmask16)0;
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int i = 0; i < mr; i++) {
        float *row = c + i * ldc;
        __m512 r0 = _mm512_mul_ps(va, c0[i]), r1 = _mm512_mul_ps(va, c1[i]);
        if (beta != 0.0f) {
            r0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), r0);
            r1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), r1);
        }
        _mm512_mask_storeu_ps(row, m0, r0);
        _mm512_mask_storeu_ps(row + 16, m1, r1);
    }
}

/* C[0:mr, 0:nr] = alpha (A Bp) + beta C where A(i, p) = a[i + p * cs]: a
 * packed strip (cs = MR) or a transposed A read in place (cs = lda). */
static void kernel_cols(int64_t kc, const float *a, int64_t cs, const float *bp, float *c,
                        int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kc; p++) {
        __m512 b0 = _mm512_loadu_ps(bp + p * NR), b1 = _mm512_loadu_ps(bp + p * NR + 16);
        const float *arow = a + p * cs;
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(arow[i]);
            c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
        }
    }
    store_tile(c0, c1, c, ldc, mr, nr, alpha, beta);
}

/* The same with A(i, p) = a[i * lda + p]: A's rows read in place. */
static void kernel_rows(int64_t kc, const float *a, int64_t lda, const float *bp, float *c,
                        int64_t ldc, int64_t nr, float alpha, float beta) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (int64_t p = 0; p < kc; p++) {
        __m512 b0 = _mm512_loadu_ps(bp + p * NR), b1 = _mm512_loadu_ps(bp + p * NR + 16);
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++) {
            __m512 av = _mm512_set1_ps(a[i * lda + p]);
            c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
        }
    }
    store_tile(c0, c1, c, ldc, MR, nr, alpha, beta);
}

// clang-format off
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
// clang-format on

int td__cpu_sgemm512(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    /* packed B block (KC x NC) and one packed A strip (KC x MR) */
    float *bp = td__cpu_scratch_slot(1, sizeof(float) * (KC * NC + KC * MR));
    float *ap;
    if (!bp)
        return 0;
    ap = bp + KC * NC;
    for (int64_t jc = 0; jc < n; jc += NC) {
        int64_t nc = n - jc < NC ? n - jc : NC;
        for (int64_t pc = 0; pc < k; pc += KC) {
            int64_t kc = k - pc < KC ? k - pc : KC;
            float bet = pc == 0 ? beta : 1.0f;
            pack_b(tb, b, ldb, pc, jc, kc, nc, bp);
            for (int64_t ir = 0; ir < m; ir += MR) {
                int64_t mr = m - ir < MR ? m - ir : MR;
                /* Whole strips read A in place; the last, short one is packed
                 * with zero rows so the kernel never reads past A. */
                if (mr < MR)
                    pack_a(ta, a, lda, ir, pc, kc, mr, ap);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int64_t nr = nc - jr < NR ? nc - jr : NR;
                    float *ct = c + ir * ldc + jc + jr;
                    const float *bt = bp + jr * kc;
                    if (mr < MR)
                        kernel_cols(kc, ap, MR, bt, ct, ldc, mr, nr, alpha, bet);
                    else if (ta)
                        kernel_cols(kc, a + pc * lda + ir, lda, bt, ct, ldc, MR, nr, alpha, bet);
                    else
                        kernel_rows(kc, a + ir * lda + pc, lda, bt, ct, ldc, nr, alpha, bet);
                }
            }
        }
    }
    return 1;
}

#else

int td__cpu_sgemm512(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    return 0;
}

#endif
