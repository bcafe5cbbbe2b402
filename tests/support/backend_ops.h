/* Every op of the kernel table on one backend's device against the CPU
 * backend (cpu:0), through the tensor-level API, in f64 and f32 on small odd
 * shapes (tolerance 1e-12 in f64, 1e-5 in f32, normwise). Shared by
 * tests/cuda/test_cuda_ops.c and tests/opencl/test_opencl_ops.c: each says
 * which device it tests (td_ops_backend), puts the cases below in its
 * cmocka table (TD_OPS_ALL_CASES), and adds its backend-only cases. */
#ifndef TD_TEST_BACKEND_OPS_H
#define TD_TEST_BACKEND_OPS_H

#include "device/kernels.h"
#include "support/support.h"

/* The backend under test. The strings are borrowed for as long as the cases run. */
typedef struct td_ops_backend {
    const char *name;          /* in messages beside "cpu": "opencl", "cuda" */
    const char *title;         /* in "... has a CPU kernel but no OpenCL one": "OpenCL" */
    const char *spec;          /* the one device compared with cpu:0: "opencl:0.0", "cuda:0" */
    const td_kernels *kernels; /* its kernel table, checked slot by slot against the CPU's */
} td_ops_backend;

/* Opens cpu:0 with b->spec for the cases below. On failure (no such device)
 * returns the open's status and opens nothing; the caller then skips. */
td_status td_ops_begin(const td_ops_backend *b);
/* Closes what td_ops_begin opened; NULL-safe when nothing is open. */
void td_ops_end(void);
/* 0: cpu:0; 1: the device under test. Valid between begin and end. */
td_device *td_ops_device(size_t i);
/* The strictest difference a comparison allows in dt: 1e-12 in f64, 1e-5 in f32. */
double td_ops_tol(td_dtype dt);

/* One backend's half of a comparison: the same tensors, made from the same
 * seeds, on each device. A build function fills the slots on s->dev in
 * s->dt; an op function runs on that device's host thread and may set
 * loss, correct and value, which are compared too. */
#define TD_OPS_SLOTS 12
typedef struct td_ops_side {
    td_device *dev;
    td_dtype dt;
    td_tensor *t[TD_OPS_SLOTS];
    td_buffer *ints[3];
    double loss;
    int64_t correct;
    double value;
} td_ops_side;

typedef void (*td_ops_build_fn)(td_ops_side *s, const void *p);
/* Slot `slot` of s as a tensor of shape[0..ndim), uniform in [lo, hi) from seed. */
td_tensor *td_ops_tensor(td_ops_side *s, int slot, int ndim, const int64_t *shape, uint64_t seed,
                         double lo, double hi);
typedef td_status (*td_ops_op_fn)(td_ops_side *s, const void *p);

/* Builds both sides, runs the op on each device's thread and compares the
 * slots in outs (terminated by -1), in f64 and then f32. Fails the test on
 * any difference beyond td_ops_tol(). */
void td_ops_compare(const char *what, td_ops_build_fn build, td_ops_op_fn op, const void *p,
                    const int *outs);

/* The batched-GEMM operands: slots 0-3 as 1-D tensors, a (3 of (5, 11), lda
 * 13), b^T (3 of (7, 11), ldb 11), c (3 of (5, 7), ldc 8) and c for k = 0
 * (2 of (5, 7)). p is unused. */
void td_ops_batched_build(td_ops_side *s, const void *p);

/* The cases, each a cmocka test on the devices of td_ops_begin. */
void td_ops_every_slot_is_implemented(void **state);
void td_ops_gemm_matches(void **state);
void td_ops_gemm_batched_matches(void **state);
void td_ops_elementwise_ops_match(void **state);
void td_ops_sumsq_matches(void **state);
void td_ops_dropout_masks_match(void **state);
void td_ops_optimizers_match(void **state);
void td_ops_bias_ops_match(void **state);
void td_ops_xent_matches_and_names_bad_labels(void **state);
void td_ops_layernorm_matches(void **state);
void td_ops_embed_matches_and_names_bad_tokens(void **state);
void td_ops_conv2d_matches(void **state);
void td_ops_pool_matches(void **state);
void td_ops_causal_softmax_matches(void **state);
void td_ops_attention_matches(void **state);
/* backend_ops_llama.c: RMSNorm, SwiGLU, rotary positions, grouped-query heads. */
void td_ops_rmsnorm_matches(void **state);
void td_ops_swiglu_matches(void **state);
void td_ops_rope_matches(void **state);
void td_ops_kv_heads_match(void **state);
/* b->spec split in two ("{split=2}"), both halves computing at once beside cpu:0. */
void td_ops_sub_devices_compute_at_once(void **state);

/* A cmocka table entry for td_ops_<name>, reported as <name>. */
#define TD_OPS_CASE(name)                                                                          \
    { #name, td_ops_##name, NULL, NULL, NULL }

/* Every case above, as cmocka table entries. */
#define TD_OPS_ALL_CASES                                                                           \
    TD_OPS_CASE(every_slot_is_implemented), TD_OPS_CASE(gemm_matches),                             \
        TD_OPS_CASE(gemm_batched_matches), TD_OPS_CASE(elementwise_ops_match),                     \
        TD_OPS_CASE(sumsq_matches), TD_OPS_CASE(dropout_masks_match),                              \
        TD_OPS_CASE(optimizers_match), TD_OPS_CASE(bias_ops_match),                                \
        TD_OPS_CASE(xent_matches_and_names_bad_labels), TD_OPS_CASE(layernorm_matches),            \
        TD_OPS_CASE(embed_matches_and_names_bad_tokens), TD_OPS_CASE(conv2d_matches),              \
        TD_OPS_CASE(pool_matches), TD_OPS_CASE(causal_softmax_matches),                            \
        TD_OPS_CASE(attention_matches), TD_OPS_CASE(rmsnorm_matches), TD_OPS_CASE(swiglu_matches), \
        TD_OPS_CASE(rope_matches), TD_OPS_CASE(kv_heads_match),                                    \
        TD_OPS_CASE(sub_devices_compute_at_once)

#endif
