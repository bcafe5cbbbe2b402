/* The CPU backend's kernels, split over several files; kernels.c gathers
 * them into td__cpu_kernels. Each runs on the device's host thread and
 * splits its work over the device's cores with td__cpu_parallel(). */
#ifndef TD_BACKEND_CPU_KERNELS_H
#define TD_BACKEND_CPU_KERNELS_H

#include "backend/cpu/cpu-impl.h"

/* The [begin, end) of part i of n when `total` items are split evenly. */
static inline void td__part_range(size_t total, int part, int nparts, size_t *begin, size_t *end) {
    *begin = total * (size_t)part / (size_t)nparts;
    *end = total * (size_t)(part + 1) / (size_t)nparts;
}

/* Scratch memory of at least n bytes owned by the calling thread, kept and
 * reused between calls (freed when the thread ends). NULL when out of memory.
 * Slot 0 is for kernels; slot 1 belongs to GEMM, which kernels call while
 * holding slot 0; slot 2 to the bf16 GEMM's rounded inputs, held while it
 * calls the f32 GEMM. */
void *td__cpu_scratch_slot(int slot, size_t n);
static inline void *td__cpu_scratch(size_t n) {
    return td__cpu_scratch_slot(0, n);
}

/* The AVX-512 SGEMM (kern_sgemm.c) on the calling thread; 0 when it could not
 * run (no memory, or not built for this CPU), and the caller uses BLAS. */
int td__cpu_sgemm512(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* 1 when td__cpu_gemm_serial computes an (m, n, k) product of type dt with
 * tandem's own kernel, 0 when it calls OpenBLAS (kern_gemm.c). */
int td__cpu_gemm_own(td_dtype dt, int64_t m, int64_t n, int64_t k);

/* im2col of one image for a stride-1 convolution in AVX-512 (kern_conv512.c):
 * col (c*kh*kw, oh*ow), rows ld apart. 0 when it could not run (another
 * stride, rows too long, or not built for this CPU): the caller's loop does. */
int td__cpu_im2col512(const td_conv_desc *d, const float *x, float *col, int64_t ld);

/* Serial GEMM on the calling thread (cblas), row-major. */
void td__cpu_gemm_serial(td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                         const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                         void *c, int64_t ldc);

/* kern_gemv.c: the table's gemm. Products with one row of A stream B once,
 * split over the device's cores; others go on to td__cpu_gemm. */
td_status td__cpu_gemm_any(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                           double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                           double beta, void *c, int64_t ldc);

/* kern_bgemm.c: products of f32 matrices with their inputs rounded to bf16
 * and f32 sums. td__cpu_bgemm_serial computes one on the calling thread,
 * by AVX512-BF16 when native (the CPU must have it) or emulated; 0 when it
 * found no memory. td__cpu_bgemm_native says whether this CPU (and
 * TANDEM_SIMD) allows the native path; the name says what each path runs. */
int td__cpu_bgemm_serial(int native, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc);
int td__cpu_bgemm_native(void);
const char *td__cpu_bgemm_path_name(int native);
/* y[0:n] = x rounded to bf16 (td__f32_to_bf16's bits) and widened back. */
void td__cpu_round_bf16(const float *x, float *y, size_t n);

/* The serial GEMM of a kernel with products inside it (convolution, fused
 * attention) on cd: from bf16-rounded inputs when cd is set to bf16 and dt
 * is f32, else td__cpu_gemm_serial. 0 when it found no memory. */
int td__cpu_gemm_inner(cpu_device *cd, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc);

/* kern_gemm.c; td__cpu_gemm_bf16 is the table's gemm_bf16. */
td_status td__cpu_gemm_bf16(void *ctx, int ta, int tb, int64_t m, int64_t n, int64_t k,
                            double alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            double beta, float *c, int64_t ldc);
td_status td__cpu_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc);
td_status td__cpu_gemm_batched(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                               int64_t k, double alpha, const void *a, int64_t lda,
                               int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                               double beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch);
td_status td__cpu_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *bias, void *y);
td_status td__cpu_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *dy, void *dx, void *dw, void *db, int acc);

/* kern_elem.c: SIMD elementwise ops and reductions */
/* row[0:n] = softmax(scale * row) in place, at the CPU's SIMD level. */
void td__cpu_softmax_row_f32(float *row, size_t n, float scale);
/* h[0:n] = silu(g) u = g u / (1 + e^-g), vectorised (kern_elem.c). */
void td__cpu_silu_gate_f32(size_t n, const float *g, const float *u, float *h);
td_status td__cpu_bias_add(void *ctx, td_dtype dt, void *y, const void *bias, int64_t outer,
                           int64_t c, int64_t inner);
td_status td__cpu_bias_grad(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer,
                            int64_t c, int64_t inner, int acc);
td_status td__cpu_act_fwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, void *y);
td_status td__cpu_act_bwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x,
                          const void *y, const void *dy, void *dx);
td_status td__cpu_add(void *ctx, td_dtype dt, size_t n, const void *a, const void *b, void *y);
td_status td__cpu_axpby(void *ctx, td_dtype dt, size_t n, double alpha, const void *x, double beta,
                        void *y);
td_status td__cpu_dropout(void *ctx, td_dtype dt, size_t n, double p, uint64_t seed,
                          uint64_t offset, const void *x, void *y);
td_status td__cpu_sumsq(void *ctx, td_dtype dt, size_t n, const void *x, double *out);
td_status td__cpu_sgd(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *buf,
                      const td_opt_args *o);
td_status td__cpu_adamw(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *m, void *v,
                        const td_opt_args *o);

/* kern_attn.c */
td_status td__cpu_attention_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, void *p, void *y);
td_status td__cpu_attention_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, const void *p, const void *dy,
                                void *dqkv);

/* kern_nn.c */
td_status td__cpu_xent(void *ctx, td_dtype dt, int64_t rows, int64_t classes, const void *logits,
                       const int32_t *labels, void *dlogits, double grad_scale, double *loss_sum,
                       int64_t *correct);
td_status td__cpu_layernorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                                const void *x, const void *gamma, const void *beta, void *y,
                                void *mean, void *rstd);
td_status td__cpu_layernorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                                const void *gamma, const void *mean, const void *rstd,
                                const void *dy, void *dx, void *dgamma, void *dbeta, int acc);
td_status td__cpu_embed_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                            const int32_t *tokens, const void *wte, const void *wpe, void *y);
td_status td__cpu_embed_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t vocab,
                            const int32_t *tokens, const void *dy, void *dwte, void *dwpe, int acc);
td_status td__cpu_pool_fwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                           const void *x, void *y, int32_t *argmax);
td_status td__cpu_pool_bwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                           const void *dy, const int32_t *argmax, void *dx);
td_status td__cpu_causal_softmax_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                     const void *s, void *p);
td_status td__cpu_causal_softmax_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t t, double scale,
                                     const void *p, const void *dp, void *ds);

/* kern_llama.c: see td_kernels for each */
td_status td__cpu_rmsnorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                              const void *x, const void *w, void *y, void *rstd);
td_status td__cpu_rmsnorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                              const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                              int acc);
td_status td__cpu_swiglu_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             void *h);
td_status td__cpu_swiglu_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             const void *dh, void *dgu);
td_status td__cpu_rope(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                       int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                       int inverse, void *x);
td_status td__cpu_kv_expand(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *raw, void *qkv);
td_status td__cpu_kv_reduce(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *dqkv, void *draw);

/* Compact weights (kern_compact.c). The paths, worst to best; EXT is the
 * format's own instructions (VNNI for q8_0, AVX512-BF16 for bf16). */
typedef enum td_compact_path {
    TD_CPATH_SCALAR = 0,
    TD_CPATH_AVX2 = 1,
    TD_CPATH_AVX512 = 2,
    TD_CPATH_EXT = 3,
} td_compact_path;
/* The best path this CPU (and TANDEM_SIMD) allows for fmt, and its name
 * with the instruction that does the work ("AVX512-VNNI vpdpbusd"). */
td_compact_path td__cpu_compact_best(td_weights fmt);
const char *td__cpu_compact_path_name(td_weights fmt, td_compact_path p);
/* The matmul_compact slot, and the same on the calling thread by a given
 * path (which the CPU must support): for tests that run every path. */
td_status td__cpu_matmul_compact(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                                 const float *x, const void *w, float *y);
td_status td__cpu_convert_half(void *ctx, int kind, int to_half, size_t n, const void *src,
                               void *dst);
td_status td__cpu_attend_step(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                              float scale, const float *q, const void *k, const void *v, int64_t ld,
                              float *y);
td_status td__cpu_matmul_compact_path(td_compact_path path, td_weights fmt, int64_t n, int64_t rows,
                                      int64_t cols, const float *x, const void *w, float *y);

#endif
