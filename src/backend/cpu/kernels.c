/* CPU kernels. Each splits its range over the device's cores. */
#include "backend/cpu/cpu-kernels.h"
#include "core/philox.h"

typedef struct fill_args {
    void *x;
    td_dtype dt;
    size_t n;
    double value;
} fill_args;

static void fill_part(void *p, int part, int nparts) {
    fill_args *a = p;
    size_t b, e;
    td__part_range(a->n, part, nparts, &b, &e);
    if (a->dt == TD_F32) {
        float *x = a->x, v = (float)a->value;
        for (size_t i = b; i < e; i++)
            x[i] = v;
    } else {
        double *x = a->x, v = a->value;
        for (size_t i = b; i < e; i++)
            x[i] = v;
    }
}

static td_status cpu_fill(void *ctx, void *x, td_dtype dt, size_t n, double value) {
    fill_args a = {x, dt, n, value};
    td__cpu_parallel(ctx, fill_part, &a);
    return TD_OK;
}

typedef struct rng_args {
    void *x;
    td_dtype dt;
    size_t n;
    td_rng_kind kind;
    uint64_t seed, offset;
    double a, b;
} rng_args;

static void rng_part(void *p, int part, int nparts) {
    rng_args *r = p;
    size_t b, e;
    td__part_range(r->n, part, nparts, &b, &e);
    for (size_t i = b; i < e; i++) {
        uint64_t k = r->offset + i;
        double v = r->kind == TD_RNG_UNIFORM ? r->a + (r->b - r->a) * td__rng_uniform_at(r->seed, k)
                                             : r->a + r->b * td__rng_normal_at(r->seed, k);
        if (r->dt == TD_F32)
            ((float *)r->x)[i] = (float)v;
        else
            ((double *)r->x)[i] = v;
    }
}

static td_status cpu_rng(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                         uint64_t offset, double a, double b) {
    rng_args r = {x, dt, n, kind, seed, offset, a, b};
    td__cpu_parallel(ctx, rng_part, &r);
    return TD_OK;
}

const td_kernels td__cpu_kernels = {
    .fill = cpu_fill,
    .rng = cpu_rng,
    .gemm = td__cpu_gemm_any,
    .gemm_bf16 = td__cpu_gemm_bf16,
    .gemm_batched = td__cpu_gemm_batched,
    .bias_add = td__cpu_bias_add,
    .bias_grad = td__cpu_bias_grad,
    .act_fwd = td__cpu_act_fwd,
    .act_bwd = td__cpu_act_bwd,
    .add = td__cpu_add,
    .axpby = td__cpu_axpby,
    .dropout = td__cpu_dropout,
    .xent = td__cpu_xent,
    .layernorm_fwd = td__cpu_layernorm_fwd,
    .layernorm_bwd = td__cpu_layernorm_bwd,
    .embed_fwd = td__cpu_embed_fwd,
    .embed_bwd = td__cpu_embed_bwd,
    .conv2d_fwd = td__cpu_conv2d_fwd,
    .conv2d_bwd = td__cpu_conv2d_bwd,
    .pool_fwd = td__cpu_pool_fwd,
    .pool_bwd = td__cpu_pool_bwd,
    .causal_softmax_fwd = td__cpu_causal_softmax_fwd,
    .causal_softmax_bwd = td__cpu_causal_softmax_bwd,
    .attention_fwd = td__cpu_attention_fwd,
    .attention_bwd = td__cpu_attention_bwd,
    .rmsnorm_fwd = td__cpu_rmsnorm_fwd,
    .rmsnorm_bwd = td__cpu_rmsnorm_bwd,
    .swiglu_fwd = td__cpu_swiglu_fwd,
    .swiglu_bwd = td__cpu_swiglu_bwd,
    .rope = td__cpu_rope,
    .kv_expand = td__cpu_kv_expand,
    .matmul_compact = td__cpu_matmul_compact,
    .convert_half = td__cpu_convert_half,
    .attend_step = td__cpu_attend_step,
    .kv_reduce = td__cpu_kv_reduce,
    .sumsq = td__cpu_sumsq,
    .sgd = td__cpu_sgd,
    .adamw = td__cpu_adamw,
};
