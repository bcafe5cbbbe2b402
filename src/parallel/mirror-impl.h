/* The inside of the `mirror` strategy (mirror.c): every member computes the
 * same step, and digests of what each computed are compared before anyone
 * updates. mirror_digest.c makes and compares the digests and flips the bits
 * that fault injection plans. */
#ifndef TD_MIRROR_IMPL_H
#define TD_MIRROR_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/strategy-impl.h"
#include "tandem/comm.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"
#include "tandem/strategy.h"

/* Values per block of the comparison with a tolerance: a flipped bit that
 * doubles a tensor's largest value moves its block's projection by at
 * least 1/64 of the block's magnitude, far above the tolerance, where
 * over a whole tensor of 100k values it would be lost in it. */
#define TD_DIGEST_BLOCK 64

/* One member's digest of a step. Entry 0 is the loss, entry 1 + i parameter
 * i's gradient, entry 1 + P + i parameter i's weight (filled on the steps
 * that check weights). Each entry has a hash of its bytes (the bitwise
 * comparison) and, for the comparison with a tolerance, per block of
 * TD_DIGEST_BLOCK values a projection on a fixed ±1 vector and the sum of
 * their magnitudes. */
typedef struct td__digest {
    int params;      /* P */
    int has_weights; /* entries 1 + P .. 1 + 2P are filled */
    uint64_t *hash;  /* (1 + 2P) */
    size_t *first;   /* (2 + 2P): entry e's blocks are [first[e], first[e + 1]) */
    double *proj;    /* (blocks) */
    double *scale;   /* (blocks) */
} td__digest;

/* How two digests are compared: bitwise (exact), or each entry's
 * projection within tol times its scale. */
typedef struct td__digest_rule {
    int exact;
    double tol;
} td__digest_rule;

/* Allocates d for the parameters of m; TD_ERR_OUT_OF_MEMORY. */
td_status td__digest_init(td__digest *d, td_model *m);
/* NULL-safe on a zeroed digest. */
void td__digest_deinit(td__digest *d);
void td__digest_swap(td__digest *a, td__digest *b);

/* The digest of m's gradients and loss_sum (and its weights when `weights`)
 * into d, reading each tensor through scratch (at least the largest
 * tensor's bytes); hashes alone when the comparison will be exact. On m's
 * device's thread. */
td_status td__digest_model(td_model *m, double loss_sum, int weights, int exact, void *scratch,
                           td__digest *d);

/* 1 when a and b agree under rule; else 0 with *entry the first entry that
 * differs. Weights count only when both digests have them. */
int td__digest_agree(const td__digest *a, const td__digest *b, td__digest_rule rule, int *entry);

/* What entry e of a digest of m is, into buf: "the loss", "the gradient of
 * layers.0.weight", "the weights layers.0.weight". */
const char *td__digest_entry_name(td_model *m, int e, char *buf, size_t n);

/* Flips the lowest exponent bit of t's element of largest magnitude (it
 * doubles or halves), through scratch. On t's device's thread. */
td_status td__flip_tensor(td_tensor *t, void *scratch);

/* The step's input with one number flipped, in copy (as many floats as
 * b->x holds, or tokens): features as td__flip_tensor does, a token model's
 * first token moved to its neighbour. *out points into copy. */
void td__flip_batch(const td_batch *b, size_t values, float *xcopy, int32_t *tcopy, td_batch *out);

/* What a run's checks found, for the report (carried over to the strategy
 * the survivors of a dropped member carry on with). */
typedef struct td__mirror_counts {
    int64_t steps;         /* steps whose digests were compared */
    int64_t weight_checks; /* of them, with the weights */
    int64_t disagreements; /* steps whose members disagreed */
    int64_t recomputed;    /* of them, settled by computing the step again */
    int64_t dropped;       /* members the majority named and dropped */
    double check_s;        /* the slowest member's digest time plus the comparison, summed */
    double step_s;         /* the steps' wall time, summed */
    char found[256];       /* "step 3: cpu:1 (the gradient of layers.0.weight), recomputed; " */
} td__mirror_counts;

/* The strategy's state: a whole replica and optimizer per member. In a
 * mesh (data:R,mirror:M) the members are R data-parallel replicas of M
 * mirrored members each: replica r, members [r M, (r + 1) M), takes its
 * rows of each batch, its members compare among themselves, and member j
 * of every replica sums its gradients with the others' (mesh.across[j]). */
typedef struct td__mirror {
    td_strategy *s;
    td_group *g;
    int n;
    int replicas, per; /* R, and M = n / R members each */
    td__mesh mesh;     /* R > 1 */
    td_model *m[TD_DP_MAX_MEMBERS];
    td_optimizer *opt[TD_DP_MAX_MEMBERS];
    td__digest dg[TD_DP_MAX_MEMBERS];    /* this pass's digests */
    td__digest first[TD_DP_MAX_MEMBERS]; /* the first pass's, while recomputing */
    void *scratch[TD_DP_MAX_MEMBERS];    /* the largest tensor's bytes */
    td_buffer *sync[TD_DP_MAX_MEMBERS];  /* one f32 on each device: the digests' barrier */
    float *xcopy[TD_DP_MAX_MEMBERS];     /* a flipped input: (batch, input...) */
    int32_t *tcopy[TD_DP_MAX_MEMBERS];   /* or its tokens: (batch, T) */
    size_t input_values;                 /* values per sample of the input */
    int64_t capacity;                    /* samples xcopy and tcopy hold */
    td_model_info info;
    int64_t labels_per_sample;
    int64_t check_weights; /* compare the weights every N steps; 0: never */
    td__digest_rule rule;
    int odd[TD_DP_MAX_MEMBERS]; /* members the majority named: left out of the survivors */
    td__mirror_counts counts;
} td__mirror;

/* One step of the strategy (mirror_step.c): every member computes it, the
 * digests are compared, and the members update only when they agree. A
 * member the majority names is marked odd and the step fails with
 * TD_ERR_DEVICE_LOST (the trainer drops it through td_strategy_survivors
 * and carries on); two members that disagree compute the step again, and
 * still disagreeing fail it with TD_ERR_DEVICE naming both. */
td_status td__mirror_step(td__mirror *p, const td_batch *batch, uint64_t step, td_step_result *res,
                          td_step_stats *stats);

#endif
