/* A bf16 GEMM with f32 accumulation, for mixed-precision training: C (m, n)
 * = alpha bf16(op(A)) bf16(op(B)) + beta C, where A, B and C are f32 in
 * memory and every input is rounded to bf16 as it is read, to nearest even
 * (core/quant.h's td__f32_to_bf16, bit for bit). The product of two bf16
 * values is exact in f32, so every path computes the same products and the
 * paths differ only in the order of their f32 sums:
 *
 *   AVX512-BF16: packing rounds A and B into pairs of bf16 along k and
 *     vdpbf16ps adds two products into each f32 lane; the blocking and the
 *     mrv x 32 micro-tiles are kern_sgemm.c's, with half as many steps over
 *     k and half the bytes per packed block;
 *   emulated (any other CPU, or TANDEM_SIMD=avx512f): op(A) and op(B)
 *     rounded into f32 copies, then the f32 GEMM on them (the own AVX-512
 *     kernel or OpenBLAS): bf16 inputs widened to f32, FMAs.
 *
 * Packed B: strips of 32 columns, each (kq, 32) words for kq = ceil(kc / 2)
 * pairs, word (q, j) = bf16(B[2q+1][j]) << 16 | bf16(B[2q][j]) (vdpbf16ps
 * multiplies low halves with low halves). A strip of A: the same pairs along
 * its rows, in rows (ap[i * ldp + q]) or in columns (ap[q * mrv + i]). A
 * missing partner (odd k) and columns past n are zeros. */
#include <assert.h>
#include <string.h>

#include "backend/cpu/cpu-kernels.h"
#include "core/quant.h"

/* Scratch slot 2: the emulated path's rounded copies, held while the f32
 * GEMM it calls uses slot 1. */
#define SLOT_COPIES 2

static void round_bf16_c(const float *x, float *y, size_t n) {
    for (size_t i = 0; i < n; i++)
        y[i] = td__bf16_to_f32(td__f32_to_bf16(x[i]));
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define MR 12
#define NR 32
#define KC 512 /* k values per block: 256 pairs */
#define NC 384

// clang-format off
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx2,fma")
#endif
// clang-format on

/* Each lane's f32 rounded to bf16 in its high half, the low half zero: the
 * integer form of td__f32_to_bf16 (the CPU's vcvtne2ps2bf16 would flush
 * subnormals), NaNs kept quiet with their sign. */
static inline __m512i round_hi(__m512 x) {
    __m512i u = _mm512_castps_si512(x), one = _mm512_set1_epi32(1);
    __m512i r =
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                             _mm512_and_si512(_mm512_srli_epi32(u, 16), one)));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
    return _mm512_and_si512(r, _mm512_set1_epi32((int)0xffff0000u));
}

/* Lane l of lo and hi, the bf16 of a pair: hi's in the high half. */
static inline __m512i pair_lanes(__m512i lo, __m512i hi) {
    return _mm512_or_si512(hi, _mm512_srli_epi32(lo, 16));
}

/* 2 n (<= 32) consecutive floats as n pairs in order, zeros past them. */
static inline __m512i pair_run(const float *x, int64_t cnt) {
    static const short idx[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31,
                                  33, 35, 37, 39, 41, 43, 45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
    __mmask16 m0 = cnt >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cnt) - 1);
    __mmask16 m1 = cnt >= 32  ? (__mmask16)0xffff
                   : cnt > 16 ? (__mmask16)((1u << (cnt - 16)) - 1)
                              : (__mmask16)0;
    __m512i lo = round_hi(_mm512_maskz_loadu_ps(m0, x)),
            hi = round_hi(_mm512_maskz_loadu_ps(m1, x + 16));
    /* the high halves (odd words) of lo then hi: x[0..31] as bf16, in order */
    return _mm512_permutex2var_epi16(lo, _mm512_loadu_si512((const void *)idx), hi);
}

static void round_bf16_512(const float *x, float *y, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_si512((void *)(y + i), round_hi(_mm512_loadu_ps(x + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_epi32(y + i, m, round_hi(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* r[i][j] <- r[j][i] for 16 rows of 16 words. */
static inline void transpose16(__m512i ri[16]) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++)
        r[i] = _mm512_castsi512_ps(ri[i]);
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
        ri[i] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
        ri[i + 8] = _mm512_castps_si512(_mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd));
    }
}

static inline __mmask16 lanes(int64_t cnt) {
    return cnt >= 16 ? (__mmask16)0xffff : cnt <= 0 ? (__mmask16)0 : (__mmask16)((1u << cnt) - 1);
}

/* bp (ceil(nc / 32), kq, 32) words from op(B)[pc:pc+kc, jc:jc+nc]. */
static void pack_b(int tb, const float *b, int64_t ldb, int64_t pc, int64_t jc, int64_t kc,
                   int64_t nc, uint32_t *bp) {
    int64_t kq = (kc + 1) / 2;
    assert(kc > 0 && kc <= KC && nc > 0 && nc <= NC);
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        int64_t w = nc - j0 < NR ? nc - j0 : NR;
        uint32_t *dst = bp + j0 * kq;
        if (!tb) {
            /* rows 2q and 2q + 1 of B, 32 columns: lane by lane */
            for (int64_t q = 0; q < kq; q++) {
                const float *r0 = b + (pc + 2 * q) * ldb + jc + j0;
                int two = 2 * q + 1 < kc;
                for (int h = 0; h < 2; h++) {
                    __mmask16 m = lanes(w - 16 * h);
                    __m512i lo = round_hi(_mm512_maskz_loadu_ps(m, r0 + 16 * h));
                    __m512i hi = two ? round_hi(_mm512_maskz_loadu_ps(m, r0 + ldb + 16 * h))
                                     : _mm512_setzero_si512();
                    _mm512_storeu_si512((void *)(dst + q * NR + 16 * h), pair_lanes(lo, hi));
                }
            }
            continue;
        }
        /* B^T's rows hold each column's pairs side by side: 16 columns by
         * 16 pairs at a time, transposed in registers */
        for (int64_t q0 = 0; q0 < kq; q0 += 16) {
            int64_t nq = kq - q0 < 16 ? kq - q0 : 16;
            for (int h = 0; h < 2; h++) {
                __m512i r[16];
                for (int j = 0; j < 16; j++)
                    r[j] = 16 * h + j < w ? pair_run(b + (jc + j0 + 16 * h + j) * ldb + pc + 2 * q0,
                                                     kc - 2 * q0 < 32 ? kc - 2 * q0 : 32)
                                          : _mm512_setzero_si512();
                transpose16(r);
                for (int64_t q = 0; q < nq; q++)
                    _mm512_storeu_si512((void *)(dst + (q0 + q) * NR + 16 * h), r[q]);
            }
        }
    }
}

/* ap from op(A)[ir:ir+mr, pc:pc+kc] for a kernel of mrv rows, rows past mr
 * zero. A transposed A becomes columns (ap[q * mrv + i]: rows 2q and 2q + 1
 * of A lane by lane, as for B); a plain A becomes rows (ap[i * ldp + q]: a
 * row's consecutive pairs), ldp = kq + 16 keeping the rows off each other's
 * cache sets. Returns ldp (0 for the columns). */
static int64_t pack_a(int ta, const float *a, int64_t lda, int64_t ir, int64_t pc, int64_t kc,
                      int64_t mr, int mrv, uint32_t *ap) {
    int64_t kq = (kc + 1) / 2, ldp = kq + 16;
    assert(mr > 0 && mr <= mrv && mrv <= MR && kc <= KC);
    if (ta) {
        __mmask16 m = lanes(mr), all = lanes(mrv);
        for (int64_t q = 0; q < kq; q++) {
            const float *r0 = a + (pc + 2 * q) * lda + ir;
            __m512i lo = round_hi(_mm512_maskz_loadu_ps(m, r0));
            __m512i hi = 2 * q + 1 < kc ? round_hi(_mm512_maskz_loadu_ps(m, r0 + lda))
                                        : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(ap + q * mrv, all, pair_lanes(lo, hi));
        }
        return 0;
    }
    for (int64_t i = 0; i < mrv; i++) {
        uint32_t *dst = ap + i * ldp;
        if (i >= mr) {
            memset(dst, 0, sizeof(uint32_t) * (size_t)kq);
            continue;
        }
        for (int64_t q = 0; q < kq; q += 16) {
            __m512i v =
                pair_run(a + (ir + i) * lda + pc + 2 * q, kc - 2 * q < 32 ? kc - 2 * q : 32);
            _mm512_mask_storeu_epi32(dst + q, lanes(kq - q), v);
        }
    }
    return ldp;
}

#include "backend/cpu/kern_tile512-impl.h"

// clang-format off
#if defined(__clang__)
#pragma clang attribute pop
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512bf16,avx2,fma"))), apply_to = function)
#else
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16,avx2,fma")
#endif
// clang-format on

/* C[0:mr, 0:nr] = alpha (Ap Bp) + beta C over kq pairs; inlined with mrv
 * and the layout constant, once per kernel below. */
static inline __attribute__((always_inline)) void kernel_body(const int mrv, const int rows,
                                                              int64_t kq, const uint32_t *ap,
                                                              int64_t ldp, const uint32_t *bp,
                                                              float *c, int64_t ldc, int64_t mr,
                                                              int64_t nr, float alpha, float beta) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < mrv; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    for (int64_t q = 0; q < kq; q++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(bp + q * NR));
        __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(bp + q * NR + 16));
#pragma GCC unroll 12
        for (int i = 0; i < mrv; i++) {
            __m512bh av =
                (__m512bh)_mm512_set1_epi32((int)(rows ? ap[i * ldp + q] : ap[q * mrv + i]));
            c0[i] = _mm512_dpbf16_ps(c0[i], av, b0);
            c1[i] = _mm512_dpbf16_ps(c1[i], av, b1);
        }
    }
    store_tile(mrv, c0, c1, c, ldc, mr, lanes(nr), lanes(nr - 16), alpha, beta);
}

#define KERNELS(X) X(12) X(8) X(6) X(4)
#define KERNEL_DEF(R)                                                                              \
    static void kernel_cols##R(int64_t kq, const uint32_t *ap, const uint32_t *bp, float *c,       \
                               int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {     \
        kernel_body(R, 0, kq, ap, 0, bp, c, ldc, mr, nr, alpha, beta);                             \
    }                                                                                              \
    static void kernel_rows##R(int64_t kq, const uint32_t *ap, int64_t ldp, const uint32_t *bp,    \
                               float *c, int64_t ldc, int64_t mr, int64_t nr, float alpha,         \
                               float beta) {                                                       \
        kernel_body(R, 1, kq, ap, ldp, bp, c, ldc, mr, nr, alpha, beta);                           \
    }
KERNELS(KERNEL_DEF)

// clang-format off
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
// clang-format on

static int gemm_dpbf16(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc) {
    /* c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c; rows ld* apart */
    /* packed B block (KC/2 x NC words) and one packed A strip (MR rows of KC/2 + 16) */
    uint32_t *bp = td__cpu_scratch_slot(1, sizeof(uint32_t) * (KC / 2 * NC + MR * (KC / 2 + 16)));
    uint32_t *ap;
    int mrv = strip_rows(m);
    if (!bp)
        return 0;
    /* a B block's strips fill whole 32-column slots: NC must be their multiple */
    assert(NC % NR == 0 && KC % 2 == 0);
    ap = bp + KC / 2 * NC;
    for (int64_t jc = 0; jc < n; jc += NC) {
        int64_t nc = n - jc < NC ? n - jc : NC;
        for (int64_t pc = 0; pc < k; pc += KC) {
            int64_t kc = k - pc < KC ? k - pc : KC, kq = (kc + 1) / 2;
            float bet = pc == 0 ? beta : 1.0f;
            pack_b(tb, b, ldb, pc, jc, kc, nc, bp);
            for (int64_t ir = 0; ir < m; ir += mrv) {
                int64_t mr = m - ir < mrv ? m - ir : mrv;
                int64_t ldp = pack_a(ta, a, lda, ir, pc, kc, mr, mrv, ap);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int64_t nr = nc - jr < NR ? nc - jr : NR;
                    float *ct = c + ir * ldc + jc + jr;
                    const uint32_t *bt = bp + jr * kq;
#define KERNEL_CALL(R)                                                                             \
    case R:                                                                                        \
        if (ldp)                                                                                   \
            kernel_rows##R(kq, ap, ldp, bt, ct, ldc, mr, nr, alpha, bet);                          \
        else                                                                                       \
            kernel_cols##R(kq, ap, bt, ct, ldc, mr, nr, alpha, bet);                               \
        break;
                    switch (mrv) { KERNELS(KERNEL_CALL) }
#undef KERNEL_CALL
                }
            }
        }
    }
    return 1;
}
#define HAVE_DPBF16 1
#else
#define HAVE_DPBF16 0
#endif

void td__cpu_round_bf16(const float *x, float *y, size_t n) {
#if HAVE_DPBF16
    if (td__cpu_simd() == TD_SIMD_AVX512) {
        round_bf16_512(x, y, n);
        return;
    }
#endif
    round_bf16_c(x, y, n);
}

int td__cpu_bgemm_native(void) {
    return HAVE_DPBF16 && td__cpu_has_bf16();
}

const char *td__cpu_bgemm_path_name(int native) {
    return native ? "AVX512-BF16 vdpbf16ps" : "emulated: bf16 inputs widened to f32, f32 GEMM";
}

/* dst (rows, cols) tight = src (rows, cols), rows lds apart, each rounded. */
static void copy_rounded(const float *src, int64_t lds, int64_t rows, int64_t cols, float *dst) {
    for (int64_t r = 0; r < rows; r++)
        td__cpu_round_bf16(src + r * lds, dst + r * cols, (size_t)cols);
}

static int gemm_emulated(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    /* op(a) and op(b) rounded as stored: ra (ar, ac), rb (br, bc) */
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    size_t na = ((size_t)(ar * ac) + 15) & ~(size_t)15;
    float *ra = td__cpu_scratch_slot(SLOT_COPIES, sizeof(float) * (na + (size_t)(br * bc)));
    if (!ra)
        return 0;
    copy_rounded(a, lda, ar, ac, ra);
    copy_rounded(b, ldb, br, bc, ra + na);
    td__cpu_gemm_serial(TD_F32, ta, tb, m, n, k, alpha, ra, ac, ra + na, bc, beta, c, ldc);
    return 1;
}

int td__cpu_bgemm_serial(int native, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    if (m <= 0 || n <= 0)
        return 1;
    if (k <= 0) { /* C = beta C, as the f32 GEMM does it */
        td__cpu_gemm_serial(TD_F32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return 1;
    }
#if HAVE_DPBF16
    if (native)
        return gemm_dpbf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
    (void)native;
#endif
    return gemm_emulated(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
