/* The OpenCL backend's device context. Device memory is addressed by
 * pointers like every other backend's: each cl_mem gets a range of virtual
 * addresses that no host memory uses, so the layers above may offset device
 * pointers as they do on CPUs and GPUs, and the backend turns a pointer back
 * into (cl_mem, offset). */
#ifndef TD_BACKEND_OPENCL_IMPL_H
#define TD_BACKEND_OPENCL_IMPL_H

#include <CL/cl.h>
#include <pthread.h>

#include "device/backend.h"

/* The kernels of td__ocl_source, in one program per precision. */
#define TD_OCL_KERNELS(X)                                                                          \
    X(FILL, fill)                                                                                  \
    X(RNG, rng)                                                                                    \
    X(ACT_FWD, act_fwd)                                                                            \
    X(ACT_BWD, act_bwd)                                                                            \
    X(ADD, add)                                                                                    \
    X(AXPBY, axpby)                                                                                \
    X(DROPOUT, dropout)                                                                            \
    X(SUMSQ, sumsq)                                                                                \
    X(SGD, sgd)                                                                                    \
    X(ADAMW, adamw)                                                                                \
    X(BIAS_ADD, bias_add)                                                                          \
    X(BIAS_GRAD, bias_grad)                                                                        \
    X(XENT, xent)                                                                                  \
    X(LAYERNORM_FWD, layernorm_fwd)                                                                \
    X(LAYERNORM_BWD_DX, layernorm_bwd_dx)                                                          \
    X(LAYERNORM_BWD_PARAMS, layernorm_bwd_params)                                                  \
    X(CAUSAL_SOFTMAX_FWD, causal_softmax_fwd)                                                      \
    X(CAUSAL_SOFTMAX_BWD, causal_softmax_bwd)                                                      \
    X(EMBED_FWD, embed_fwd)                                                                        \
    X(EMBED_BWD, embed_bwd)                                                                        \
    X(POOL_FWD, pool_fwd)                                                                          \
    X(POOL_BWD, pool_bwd)                                                                          \
    X(IM2COL, im2col)                                                                              \
    X(COL2IM, col2im)                                                                              \
    X(CONV_OUT, conv_out)                                                                          \
    X(CONV_DY_T, conv_dy_t)                                                                        \
    X(MAT_SCALE, mat_scale)                                                                        \
    X(GEMM_PLAIN, gemm_plain)                                                                      \
    X(RMSNORM_FWD, rmsnorm_fwd)                                                                    \
    X(RMSNORM_BWD_DX, rmsnorm_bwd_dx)                                                              \
    X(RMSNORM_BWD_W, rmsnorm_bwd_w)                                                                \
    X(SWIGLU_FWD, swiglu_fwd)                                                                      \
    X(SWIGLU_BWD, swiglu_bwd)                                                                      \
    X(COMPACT_ROUND_X, compact_round_x)                                                            \
    X(MATMUL_COMPACT, matmul_compact)                                                              \
    X(CONVERT_HALF, convert_half)                                                                  \
    X(ATTEND_STEP, attend_step)                                                                    \
    X(ROPE, rope)                                                                                  \
    X(KV_EXPAND, kv_expand)                                                                        \
    X(KV_REDUCE, kv_reduce)

typedef enum td_ocl_kernel_id {
#define TD_OCL_ENUM(id, name) TD_OCL_K_##id,
    TD_OCL_KERNELS(TD_OCL_ENUM)
#undef TD_OCL_ENUM
        TD_OCL_KERNEL_COUNT
} td_ocl_kernel_id;

typedef struct ocl_range {
    uintptr_t base; /* first virtual address */
    size_t nbytes;
    cl_mem mem;
} ocl_range;

typedef struct ocl_device {
    char name[32];
    cl_platform_id platform;
    cl_device_id device; /* a sub-device when split */
    int is_sub_device;
    int fp64;
    cl_context context;
    cl_command_queue queue;
    /* Per precision (td_dtype): td__ocl_source built on first use, and its
     * kernels created on first use. from_cache: 1 when the program came
     * from the on-disk binary cache. */
    cl_program program[2];
    int from_cache[2];
    cl_kernel kernels[2][TD_OCL_KERNEL_COUNT];
    cl_mem scratch; /* grown on demand; reused by ops in queue order */
    size_t scratch_size;
    ocl_range *allocs; /* sorted by base; touched by the host thread only */
    size_t nallocs, cap;
} ocl_device;

/* Turns an OpenCL error into a status whose message names the call, the
 * device and the error's name. */
td_status td__ocl_status(cl_int err, const char *call, const ocl_device *od);
const char *td__ocl_error_name(cl_int err);

#define TD_OCL_CHECK(call, od)                                                                     \
    do {                                                                                           \
        cl_int err_ = (call);                                                                      \
        if (err_ != CL_SUCCESS)                                                                    \
            return td__ocl_status(err_, #call, (od));                                              \
    } while (0)

/* (cl_mem, offset) of a device pointer; TD_ERR_INVALID_ARG when the pointer
 * is not inside an allocation of this device. */
td_status td__ocl_resolve(const ocl_device *od, const void *ptr, cl_mem *mem, size_t *offset);

/* Builds `src` with `opts` for od's device. The binary is cached on disk,
 * keyed by platform, device, driver, options and source (see
 * td__ocl_cache_dir); *from_cache (may be NULL) says whether it came from
 * there. A build failure is TD_ERR_DEVICE whose message carries the build
 * log. The caller releases *out. Runs on od's host thread. */
td_status td__ocl_build(ocl_device *od, const char *src, const char *opts, cl_program *out,
                        int *from_cache);

/* The program binary cache folder: $TD_OPENCL_CACHE, else
 * $XDG_CACHE_HOME/tandem/opencl, else ~/.cache/tandem/opencl; "" when
 * caching is off (TD_OPENCL_CACHE=off or no home). A folder that is not this
 * user's alone to write (program.c says why) is not used. */
void td__ocl_cache_dir(char *buf, size_t n);

/* Kernel `id` of the program for dt (built and kernels created on first
 * use). f64 on a device without cl_khr_fp64 is TD_ERR_UNSUPPORTED naming the
 * device. The kernel stays owned by od. */
td_status td__ocl_kernel(ocl_device *od, td_dtype dt, td_ocl_kernel_id id, cl_kernel *out);

/* A device buffer of at least nbytes for one op's temporaries, owned by od;
 * valid until the next call (the in-order queue keeps earlier users safe). */
td_status td__ocl_scratch(ocl_device *od, size_t nbytes, cl_mem *out);

/* "fill", "gemm_plain": the kernel's name in td__ocl_source. */
const char *td__ocl_kernel_name(td_ocl_kernel_id id);

/* Releases the programs, kernels and scratch (thread_deinit). */
void td__ocl_release_programs(ocl_device *od);

/* Setting a kernel's arguments in order, then launching it. The first
 * failure is kept and reported by td__ocl_run, so a launch reads as a list of
 * td__ocl_arg_* calls. Pointer arguments become (cl_mem, byte offset) pairs,
 * as every kernel of td__ocl_source takes them. */
typedef struct td_ocl_args {
    ocl_device *od;
    td_dtype dt;
    td_ocl_kernel_id id;
    cl_kernel k;
    cl_uint next; /* the next argument's index */
    cl_int err;   /* the first clSetKernelArg failure */
    cl_uint bad;  /* its index */
    td_status st; /* the first failure of another kind */
} td_ocl_args;

/* Looks the kernel up (building the program on first use). */
td_status td__ocl_begin(td_ocl_args *a, ocl_device *od, td_dtype dt, td_ocl_kernel_id id);
void td__ocl_arg_ptr(td_ocl_args *a, const void *devptr); /* NULL: a NULL buffer */
void td__ocl_arg_mem(td_ocl_args *a, cl_mem mem, size_t offset);
void td__ocl_arg_u64(td_ocl_args *a, uint64_t v);
void td__ocl_arg_i64(td_ocl_args *a, int64_t v);
void td__ocl_arg_int(td_ocl_args *a, int v);
void td__ocl_arg_real(td_ocl_args *a, double v); /* float or double as dt */
void td__ocl_arg_acc(td_ocl_args *a, double v);  /* double where the device has fp64 */
/* {h, w, oh, ow, kh, kw, stride, pad} as one long8. */
void td__ocl_arg_window(td_ocl_args *a, const td_conv_desc *d);
/* Enqueues the kernel over `items` work-items (it loops when fewer run). */
td_status td__ocl_run(td_ocl_args *a, size_t items);

/* C (batch of (m, n)) = alpha op(A) op(B) + beta C on (cl_mem, element
 * offset) operands: CLBlast where the build has it, else a plain kernel. */
td_status td__ocl_gemm_mem(ocl_device *od, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                           int64_t k, double alpha, cl_mem a, size_t a_off, int64_t lda,
                           int64_t stride_a, cl_mem b, size_t b_off, int64_t ldb, int64_t stride_b,
                           double beta, cl_mem c, size_t c_off, int64_t ldc, int64_t stride_c,
                           int64_t batch);

/* The same with the plain kernel of td__ocl_source (one work-item per
 * element of C), which builds without CLBlast use; for tests too. */
td_status td__ocl_gemm_plain(ocl_device *od, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                             int64_t k, double alpha, cl_mem a, size_t a_off, int64_t lda,
                             int64_t stride_a, cl_mem b, size_t b_off, int64_t ldb,
                             int64_t stride_b, double beta, cl_mem c, size_t c_off, int64_t ldc,
                             int64_t stride_c, int64_t batch);

/* The slots of td__opencl_kernels defined in kernels_conv.c. */
td_status td__ocl_gemm(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                       double beta, void *c, int64_t ldc);
td_status td__ocl_gemm_batched(void *ctx, td_dtype dt, int ta, int tb, int64_t m, int64_t n,
                               int64_t k, double alpha, const void *a, int64_t lda,
                               int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                               double beta, void *c, int64_t ldc, int64_t stride_c, int64_t batch);
td_status td__ocl_conv2d_fwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *bias, void *y);
td_status td__ocl_conv2d_bwd(void *ctx, td_dtype dt, const td_conv_desc *d, const void *x,
                             const void *w, const void *dy, void *dx, void *dw, void *db, int acc);
td_status td__ocl_bias_grad(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer,
                            int64_t c, int64_t inner, int acc);
/* In kernels_attn.c. */
td_status td__ocl_attention_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, void *p, void *y);
td_status td__ocl_attention_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c, int64_t h,
                                double scale, const void *qkv, const void *p, const void *dy,
                                void *dqkv);
/* In kernels_llama.c: see td_kernels for each. */
td_status td__ocl_rmsnorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                              const void *x, const void *w, void *y, void *rstd);
td_status td__ocl_rmsnorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, const void *x,
                              const void *w, const void *rstd, const void *dy, void *dx, void *dw,
                              int acc);
td_status td__ocl_swiglu_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             void *h);
td_status td__ocl_swiglu_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t f, const void *gu,
                             const void *dh, void *dgu);
td_status td__ocl_rope(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t ld, int64_t col,
                       int64_t heads, int64_t d, int64_t pos0, int64_t npos, const void *tab,
                       int inverse, void *x);
td_status td__ocl_kv_expand(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *raw, void *qkv);
td_status td__ocl_kv_reduce(void *ctx, td_dtype dt, int64_t rows, td_kv_map m, int64_t d,
                            const void *dqkv, void *draw);

extern const char td__ocl_source[];
/* td__ocl_source with the compact weights' kernels after it (kernels_compact.c):
 * what a device's programs are built from; NULL when out of memory. */
const char *td__ocl_program_source(void);
td_status td__ocl_matmul_compact(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                                 const float *x, const void *w, float *y);
td_status td__ocl_convert_half(void *ctx, int kind, int to_half, size_t n, const void *src,
                               void *dst);
td_status td__ocl_attend_step(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                              float scale, const float *q, const void *k, const void *v, int64_t ld,
                              float *y);
extern const td_kernels td__opencl_kernels;

/* CLBlast 1.5 builds its tuning database on a routine's first call without a
 * lock; two devices' threads calling it at once corrupt it (AddressSanitizer
 * showed a use after free). Every CLBlast call holds this lock; the calls
 * only enqueue work, so holding it is short. */
extern pthread_mutex_t td__clblast_lock;

#endif
