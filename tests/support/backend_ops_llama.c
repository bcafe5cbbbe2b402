/* The Llama family's ops on the backend under test against the CPU (see
 * backend_ops.h): RMSNorm forward and backward (with and without dx,
 * accumulating), the SwiGLU gate, rotary positions forward and inverse at
 * an offset position, and grouped-query expansion and its reduction. */
#include "support/backend_ops.h"
#include "tensor/ops.h"

static td_tensor *mk2(td_ops_side *s, int slot, int64_t a, int64_t b, uint64_t seed) {
    int64_t shape[2] = {a, b};
    return td_ops_tensor(s, slot, 2, shape, seed, -1, 1);
}

static td_tensor *mk1(td_ops_side *s, int slot, int64_t n, uint64_t seed, double lo) {
    return td_ops_tensor(s, slot, 1, &n, seed, lo, 1);
}

static void rms_build(td_ops_side *s, const void *p) {
    (void)p;
    mk2(s, 0, 7, 33, 130);  /* x */
    mk1(s, 1, 33, 131, -1); /* w */
    mk2(s, 2, 7, 33, 132);  /* y */
    mk1(s, 3, 7, 133, -1);  /* rstd */
    mk2(s, 4, 7, 33, 134);  /* dy */
    mk2(s, 5, 7, 33, 135);  /* dx */
    mk1(s, 6, 33, 136, -1); /* dw */
}

static td_status rms_run(td_ops_side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_rmsnorm_fwd(1e-5, s->t[0], s->t[1], s->t[2], s->t[3])) ||
        (st = td__op_rmsnorm_bwd(s->t[0], s->t[1], s->t[3], s->t[4], s->t[5], s->t[6], 0)))
        return st;
    /* again without dx, accumulating */
    return td__op_rmsnorm_bwd(s->t[0], s->t[1], s->t[3], s->t[4], NULL, s->t[6], 1);
}

void td_ops_rmsnorm_matches(void **state) {
    static const int outs[] = {2, 3, 5, 6, -1};
    td_ops_compare("rmsnorm", rms_build, rms_run, NULL, outs);
}

static void swiglu_build(td_ops_side *s, const void *p) {
    (void)p;
    mk2(s, 0, 9, 2 * 13, 140); /* gu */
    mk2(s, 1, 9, 13, 141);     /* h */
    mk2(s, 2, 9, 13, 142);     /* dh */
    mk2(s, 3, 9, 2 * 13, 143); /* dgu */
}

static td_status swiglu_run(td_ops_side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_swiglu_fwd(s->t[0], s->t[1])))
        return st;
    return td__op_swiglu_bwd(s->t[0], s->t[2], s->t[3]);
}

void td_ops_swiglu_matches(void **state) {
    static const int outs[] = {1, 3, -1};
    td_ops_compare("swiglu", swiglu_build, swiglu_run, NULL, outs);
}

/* x (2, 5, 40): 3 heads of 8 from column 6 rotated at positions 4..8 of a
 * table of 11, then rotated back from column 6 + 24 for 2 heads. */
static void rope_build(td_ops_side *s, const void *p) {
    int64_t x[3] = {2, 5, 40}, tab[3] = {2, 11, 4};
    (void)p;
    td_ops_tensor(s, 0, 3, x, 150, -1, 1);
    td_ops_tensor(s, 1, 3, tab, 151, -1, 1);
}

static td_status rope_run(td_ops_side *s, const void *p) {
    td_status st;
    (void)p;
    if ((st = td__op_rope(s->t[1], 4, 6, 3, 8, 0, s->t[0])))
        return st;
    return td__op_rope(s->t[1], 2, 30, 1, 8, 1, s->t[0]);
}

void td_ops_rope_matches(void **state) {
    static const int outs[] = {0, -1};
    td_ops_compare("rope", rope_build, rope_run, NULL, outs);
}

/* 6 query heads and 2 key/value heads of 5, over 7 rows; and a shard's 4
 * query heads from the third of a group of 3, which read 2 key/value heads. */
static void kv_build(td_ops_side *s, const void *p) {
    (void)p;
    mk2(s, 0, 7, (6 + 4) * 5, 160); /* raw */
    mk2(s, 1, 7, 3 * 6 * 5, 161);   /* qkv */
    mk2(s, 2, 7, 3 * 6 * 5, 162);   /* dqkv */
    mk2(s, 3, 7, (6 + 4) * 5, 163); /* draw */
    mk2(s, 4, 7, (4 + 4) * 5, 164); /* the shard's raw */
    mk2(s, 5, 7, 3 * 4 * 5, 165);   /* qkv */
    mk2(s, 6, 7, 3 * 4 * 5, 166);   /* dqkv */
    mk2(s, 7, 7, (4 + 4) * 5, 167); /* draw */
}

static td_status kv_run(td_ops_side *s, const void *p) {
    td_kv_map whole = {6, 2, 3, 0}, shard = {4, 2, 3, 2};
    td_status st;
    (void)p;
    if ((st = td__op_kv_expand(whole, 5, s->t[0], s->t[1])) ||
        (st = td__op_kv_reduce(whole, 5, s->t[2], s->t[3])) ||
        (st = td__op_kv_expand(shard, 5, s->t[4], s->t[5])))
        return st;
    return td__op_kv_reduce(shard, 5, s->t[6], s->t[7]);
}

void td_ops_kv_heads_match(void **state) {
    static const int outs[] = {1, 3, 5, 7, -1};
    td_ops_compare("kv_expand and kv_reduce", kv_build, kv_run, NULL, outs);
}
