/* An AVX-512 SGEMM for one core, so that f32 speed does not hang on which
 * kernels OpenBLAS picked (OPENBLAS_CORETYPE=Haswell holds it to AVX2): C (m,
 * n) = alpha op(A) op(B) + beta C, row-major.
 *
 * B is packed in strips of 32 columns (two vectors) by KC rows; the
 * micro-kernel keeps an mrv x 32 tile of C in 2 mrv registers (mrv 12, 8, 6
 * or 4, whichever pads m least) and streams B's strip while broadcasting mrv
 * rows of A from a packed strip (mrv x 384 floats, in L1 while the kernel
 * walks the packed B block, 384 x 384, in L2). A strip past m is zero rows;
 * columns past n are never read and are masked when storing. When A is one
 * strip, a plain B is read in place instead of packed; long, few dot
 * products (A B^T with k >= 8 max(m, n), C small) take dot_nt. */
#include <string.h>

#include "backend/cpu/cpu-kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define MR 12
#define NR 32
#define KC 384
#define NC 384
/* dot_nt's largest C: past it (a 128 x 384 block of a prefill's MLP, k
 * 3072) the packed kernel is twice as fast, below it (LeNet's 6 x 25 and 16
 * x 75 weight gradients) packing costs more than it saves. */
#define DOT_MAX_TILE 1536

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
    /* b (w <= NR rows, kc), rows ldb apart -> dst (kc, NR) */
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
    /* op(b)[pc:pc+kc, jc:jc+nc] -> bp (ceil(nc / NR), kc, NR) */
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

/* Asks for cache lines [part, part + 1) / parts of `rows` rows of `len`
 * floats, `ld` apart, to come into L2. Each micro-batch of a pipeline or
 * of an accumulation streams the weights, or their gradients, from memory
 * again: a block's packing, or its tiles' loads of C, waited for them where
 * the block before could have asked for them while it computed. (Inline
 * asm: GCC 12 drops __builtin_prefetch inside the target pragma above.) */
static void prefetch_rows(const float *p, int64_t rows, int64_t len, int64_t ld, int64_t part,
                          int64_t parts) {
    /* p (rows, len), rows ld apart: this part's share of their cache lines */
    int64_t per_row = (len * (int64_t)sizeof(float) + 63) / 64 + 1, lines = rows * per_row;
    int64_t l = part * lines / parts, end = (part + 1) * lines / parts;
    int64_t r = l / per_row, c = l % per_row;
    for (; l < end; l++) {
        const char *row = (const char *)(p + r * ld), *last = row + (len - 1) * sizeof(float);
        const char *line = row + c * 64 < last ? row + c * 64 : last;
        __asm__ volatile("prefetcht1 %0" : : "m"(*line));
        if (++c == per_row) {
            c = 0;
            r++;
        }
    }
}

/* The block of op(B) that follows [pc, jc] in the loops below, if any. */
static void prefetch_next_b(int tb, const float *b, int64_t ldb, int64_t pc, int64_t jc, int64_t k,
                            int64_t n, int64_t part, int64_t parts) {
    int64_t kc, nc;
    if (pc + KC < k) {
        pc += KC;
    } else if (jc + NC < n) {
        pc = 0;
        jc += NC;
    } else {
        return;
    }
    kc = k - pc < KC ? k - pc : KC;
    nc = n - jc < NC ? n - jc : NC;
    if (tb)
        prefetch_rows(b + jc * ldb + pc, nc, kc, ldb, part, parts);
    else
        prefetch_rows(b + pc * ldb + jc, kc, nc, ldb, part, parts);
}

/* Ap from op(A)[ir:ir+mr, pc:pc+kc], rows past mr zero, for a kernel of
 * mrv rows. A transposed A (a weight gradient's dY^T, rows of A 2-8 KiB
 * apart) becomes columns: ap[p * mrv + i], one masked load and store per p.
 * Read in place, those rows thrashed a few sets of L1 and the product ran at
 * 110-150 GFLOP/s where packed it runs near the FMA peak. A plain A becomes
 * rows: ap[i * ldp + p], each a copy of a row of A; ldp = kc + 16 keeps the
 * rows off each other's sets. Returns ldp (0 for the column layout). */
static int64_t pack_a(int ta, const float *a, int64_t lda, int64_t ir, int64_t pc, int64_t kc,
                      int64_t mr, int mrv, float *ap) {
    /* op(a)[ir:ir+mr, pc:pc+kc] -> ap (kc, mrv) or (mrv, ldp) */
    if (ta) {
        __mmask16 m = (__mmask16)((1u << mr) - 1), all = (__mmask16)((1u << mrv) - 1);
        const float *src = a + pc * lda + ir;
        for (int64_t p = 0; p < kc; p++)
            _mm512_mask_storeu_ps(ap + p * mrv, all, _mm512_maskz_loadu_ps(m, src + p * lda));
        return 0;
    }
    int64_t ldp = kc + 16;
    for (int64_t i = 0; i < mrv; i++) {
        float *dst = ap + i * ldp;
        const float *src = a + (ir + i) * lda + pc;
        int64_t p = 0;
        if (i >= mr) {
            memset(dst, 0, sizeof(float) * (size_t)kc);
            continue;
        }
        for (; p + 16 <= kc; p += 16)
            _mm512_storeu_ps(dst + p, _mm512_loadu_ps(src + p));
        if (p < kc) {
            __mmask16 m = (__mmask16)((1u << (kc - p)) - 1);
            _mm512_mask_storeu_ps(dst + p, m, _mm512_maskz_loadu_ps(m, src + p));
        }
    }
    return ldp;
}

#include "backend/cpu/kern_tile512-impl.h"

/* C[0:mr, 0:nr] = alpha (Ap Bp) + beta C for a packed A of mrv rows: in
 * columns, A(i, p) = ap[p * mrv + i] (ldp 0), or in rows, ap[i * ldp + p].
 * B(p, j) = bp[p * bs + j]: a packed strip (bs = NR) or B's rows in place;
 * columns past nr are never read.
 * Inlined with mrv and the layout constant, once per kernel below. */
static inline __attribute__((always_inline)) void
kernel_body(const int mrv, const int rows, int64_t kc, const float *ap, int64_t ldp,
            const float *bp, int64_t bs, float *c, int64_t ldc, int64_t mr, int64_t nr, float alpha,
            float beta) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int i = 0; i < mrv; i++) {
        c0[i] = _mm512_setzero_ps();
        c1[i] = _mm512_setzero_ps();
    }
    __mmask16 m0 = nr >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nr) - 1);
    __mmask16 m1 = nr >= 32  ? (__mmask16)0xFFFF
                   : nr > 16 ? (__mmask16)((1u << (nr - 16)) - 1)
                             : (__mmask16)0;
    for (int64_t p = 0; p < kc; p++) {
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bp + p * bs),
               b1 = _mm512_maskz_loadu_ps(m1, bp + p * bs + 16);
#pragma GCC unroll 12
        for (int i = 0; i < mrv; i++) {
            __m512 av = _mm512_set1_ps(rows ? ap[i * ldp + p] : ap[p * mrv + i]);
            c0[i] = _mm512_fmadd_ps(av, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(av, b1, c1[i]);
        }
    }
    store_tile(mrv, c0, c1, c, ldc, mr, m0, m1, alpha, beta);
}

/* C = alpha A B^T + beta C as dot products, for a plain A and a transposed B
 * whose rows are long and few: a convolution's weight gradient, dW (oc, ckk)
 * = dY (oc, n ohw) col^T, LeNet's first is (6, 25, 1568). Packing B for so few
 * rows of A cost more than the product, and a 12 x 32 tile of a 6 x 25 C was
 * mostly padding. Tiles of 3 x 4 dot products, 16 lanes each, over k; a
 * tile's rows and columns past the edge repeat the last one and are not
 * stored. */
static void dot_nt(int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    /* a (m, k), b (n, k) -> c (m, n) = alpha a b^T + beta c */
    for (int64_t i0 = 0; i0 < m; i0 += 3)
        for (int64_t j0 = 0; j0 < n; j0 += 4) {
            const float *ar[3], *br[4];
            __m512 acc[3][4];
            for (int r = 0; r < 3; r++)
                ar[r] = a + (i0 + r < m ? i0 + r : m - 1) * lda;
            for (int q = 0; q < 4; q++)
                br[q] = b + (j0 + q < n ? j0 + q : n - 1) * ldb;
#pragma GCC unroll 12
            for (int x = 0; x < 12; x++)
                acc[x / 4][x % 4] = _mm512_setzero_ps();
            for (int64_t p = 0; p < k; p += 16) {
                __mmask16 mk = k - p >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (k - p)) - 1);
                __m512 av[3], bv[4];
#pragma GCC unroll 3
                for (int r = 0; r < 3; r++)
                    av[r] = _mm512_maskz_loadu_ps(mk, ar[r] + p);
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++)
                    bv[q] = _mm512_maskz_loadu_ps(mk, br[q] + p);
#pragma GCC unroll 12
                for (int x = 0; x < 12; x++)
                    acc[x / 4][x % 4] = _mm512_fmadd_ps(av[x / 4], bv[x % 4], acc[x / 4][x % 4]);
            }
            for (int r = 0; r < 3 && i0 + r < m; r++)
                for (int q = 0; q < 4 && j0 + q < n; q++) {
                    float *o = c + (i0 + r) * ldc + j0 + q;
                    float v = alpha * _mm512_reduce_add_ps(acc[r][q]);
                    *o = beta != 0.0f ? v + beta * *o : v;
                }
        }
}

#define KERNELS(X) X(12) X(8) X(6) X(4)
#define KERNEL_DEF(R)                                                                              \
    static void kernel_cols##R(int64_t kc, const float *ap, const float *bp, int64_t bs, float *c, \
                               int64_t ldc, int64_t mr, int64_t nr, float alpha, float beta) {     \
        kernel_body(R, 0, kc, ap, 0, bp, bs, c, ldc, mr, nr, alpha, beta);                         \
    }                                                                                              \
    static void kernel_rows##R(int64_t kc, const float *ap, int64_t ldp, const float *bp,          \
                               int64_t bs, float *c, int64_t ldc, int64_t mr, int64_t nr,          \
                               float alpha, float beta) {                                          \
        kernel_body(R, 1, kc, ap, ldp, bp, bs, c, ldc, mr, nr, alpha, beta);                       \
    }
KERNELS(KERNEL_DEF)

// clang-format off
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
// clang-format on

int td__cpu_sgemm512(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    /* c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c, f32; rows ld* apart */
    /* packed B block (KC x NC) and one packed A strip (MR rows of KC + 16) */
    float *bp = td__cpu_scratch_slot(1, sizeof(float) * (KC * NC + MR * (KC + 16)));
    float *ap;
    int mrv = strip_rows(m);
    if (!ta && tb && k >= 8 * (m > n ? m : n) && m * n <= DOT_MAX_TILE) {
        dot_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return 1;
    }
    if (!bp)
        return 0;
    ap = bp + KC * NC;
    for (int64_t jc = 0; jc < n; jc += NC) {
        int64_t nc = n - jc < NC ? n - jc : NC;
        for (int64_t pc = 0; pc < k; pc += KC) {
            int64_t kc = k - pc < KC ? k - pc : KC;
            float bet = pc == 0 ? beta : 1.0f;
            /* One strip of A uses each packed B once: a plain B is read in
             * place then (LeNet's convolutions: 6 and 16 rows). */
            int in_place = !tb && m <= mrv;
            int64_t bs = in_place ? ldb : NR;
            if (!in_place)
                pack_b(tb, b, ldb, pc, jc, kc, nc, bp);
            for (int64_t ir = 0; ir < m; ir += mrv) {
                int64_t mr = m - ir < mrv ? m - ir : mrv;
                int64_t ldp = pack_a(ta, a, lda, ir, pc, kc, mr, mrv, ap);
                if (bet != 0.0f && ir + mrv < m) /* the next strip's tiles of C */
                    prefetch_rows(c + (ir + mrv) * ldc + jc,
                                  m - ir - mrv < mrv ? m - ir - mrv : mrv, nc, ldc, 0, 1);
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    int64_t nr = nc - jr < NR ? nc - jr : NR;
                    float *ct = c + ir * ldc + jc + jr;
                    const float *bt = in_place ? b + pc * ldb + jc + jr : bp + jr * kc;
                    if (!in_place)
                        prefetch_next_b(tb, b, ldb, pc, jc, k, n,
                                        (ir / mrv) * ((nc + NR - 1) / NR) + jr / NR,
                                        ((m + mrv - 1) / mrv) * ((nc + NR - 1) / NR));
#define KERNEL_CALL(R)                                                                             \
    case R:                                                                                        \
        if (ldp)                                                                                   \
            kernel_rows##R(kc, ap, ldp, bt, bs, ct, ldc, mr, nr, alpha, bet);                      \
        else                                                                                       \
            kernel_cols##R(kc, ap, bt, bs, ct, ldc, mr, nr, alpha, bet);                           \
        break;
                    switch (mrv) { KERNELS(KERNEL_CALL) }
#undef KERNEL_CALL
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
