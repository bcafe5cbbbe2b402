/* The inside of a strategy: a table of functions per strategy, chosen by
 * name in strategy.c. Adding a strategy is one file set under src/parallel/
 * implementing these and one entry in strategy.c's table.
 *
 * The dispatcher (strategy.c) checks arguments, keeps the group, the model
 * JSON and the configuration in td_strategy, and calls the table. Optional
 * slots are NULL: calibrate (nothing to measure), survivors (the group less
 * its failed members), carry_on (a loss always goes back to a checkpoint),
 * decoder (the strategy does not generate). */
#ifndef TD_STRATEGY_IMPL_H
#define TD_STRATEGY_IMPL_H

#include "parallel/placement.h"
#include "tandem/generate.h"
#include "tandem/strategy.h"

/* One of a strategy's own options, for checking and usage texts. */
typedef struct td_strategy_option {
    const char *name;   /* "zero" */
    const char *values; /* "0|1" */
    const char *help;   /* "ZeRO-1: each device keeps its shard of the optimizer state" */
} td_strategy_option;

typedef struct td_strategy_ops {
    const char *name;
    const char *summary; /* one line for usage texts (td_strategy_about) */
    int min_members;     /* the fewest devices it runs on; 0: 1 */
    int max_members;     /* the most it uses (0: all): training leaves the rest idle, a
                            decoder refuses a larger group */
    int evaluates_only;  /* 1: evaluation, no training steps */
    const td_strategy_option *options; /* its own, NULL-terminated by name; NULL: none */
    /* The words of the run's report (td_strategy_report_make); NULL: the
     * plain member table with no note. */
    void (*report)(void *impl, const td_run_figures *f, td_strategy_report *out);
    /* Builds the strategy's state over s->group from s->json and s->cfg into
     * s->impl; on failure leaves nothing s->ops->destroy cannot free. */
    td_status (*create)(td_strategy *s);
    void (*destroy)(void *impl); /* NULL-safe */
    void (*model_info)(void *impl, td_model_info *out);
    const char *(*plan)(void *impl, char *buf, size_t n);
    td_status (*calibrate)(void *impl, const td_batch *sample);
    td_status (*step)(void *impl, const td_batch *batch, uint64_t step, td_step_result *res,
                      td_step_stats *stats);
    td_status (*evaluate)(void *impl, const td_batch *batches, size_t n, td_step_result *per_batch);
    td_status (*save)(void *impl, const char *path, const td_train_state *state);
    td_status (*load)(void *impl, const char *path, td_train_state *state);
    double (*lr)(void *impl);
    int64_t (*steps)(void *impl);
    /* The split this strategy made, as text a checkpoint records after its
     * name ("0.75 0.25"): enough to cut the same slices again. NULL (or
     * "" written): it makes none that changes the numbers. */
    void (*split)(void *impl, char *buf, size_t n);
    /* Cuts the slices a checkpoint recorded (the text `split` wrote) in
     * place of those made at creation, before the checkpoint is loaded.
     * *adopted 0, without error, when the text does not fit this group
     * (another member count): the creation's plan stays. */
    td_status (*adopt_split)(void *impl, const char *text, int *adopted);
    /* What each member of this process holds, for the survival rule
     * (placement.h): at most TD_DP_MAX_MEMBERS into h, *n of them. NULL:
     * the rule is the strategy's carry_on alone. */
    void (*holdings)(void *impl, td__holding *h, int *n);
    td_status (*survivors)(void *impl, td_group **out);
    td_status (*carry_on)(td_strategy *s, td_group *survivors, int64_t steps_before,
                          td_strategy *next, int *step_taken, const char **why);
    /* A decoder of the model in checkpoint over g's devices, in dtype, that
     * owns what it builds (td_strategy_decoder_create); options: a mesh's
     * ("tensor=N" for pipeline:P,tensor:N; "" for one axis). */
    td_status (*decoder)(td_group *g, const char *checkpoint, td_dtype dtype, const char *options,
                         td_decoder **out);
} td_strategy_ops;

struct td_strategy {
    const td_strategy_ops *ops;
    td_group *group;
    char *json;       /* the model's JSON text */
    char *model_name; /* its file, for messages */
    char *options;    /* cfg.options' copy */
    char why[256];    /* td_strategy_carry_on's *why when it names a tensor */
    td_strategy_config cfg;
    void *impl;
};

/* Sizing members' shares (shares.c) ---------------------------------------------- */

/* The best time of a few products of one row with a weight matrix larger
 * than the caches on dev alone, in dtype: its speed at reading weights.
 * Call it from a thread that is no device's, one device at a time. */
td_status td__speed_probe(td_device *dev, td_dtype dtype, double *seconds);
/* Shares of n members in proportion to their speeds (1 / alone_s; any
 * alone_s not positive: even), rounded to eighths and summing to 1: timing
 * noise moves no work between equal devices, while a device three times as
 * fast still gets three quarters. */
void td__shares_from_speed(const double *alone_s, int n, double *share);
/* Cuts [0, size) into n consecutive ranges in rank order, [first[k],
 * first[k] + count[k]), in proportion to share, the largest remainders
 * first (ties to the lower rank); a range may be empty. */
void td__cut_by_shares(int64_t size, const double *share, int n, int64_t *first, int64_t *count);
/* Member j's slices (of n members, by share) of every splittable unit:
 * `tensor`'s cut, kept to whole q8_0 blocks when the weights are w. */
void td__cut_units(const td_split_info *units, int nunits, const double *share, int n, td_weights w,
                   int j, td_shard_plan *plan);

/* Meshes (mesh.c): `name` ("data:2,tensor:2", or a plain strategy name) as
 * the strategy that runs it (*strategy), the options the mesh sets for it
 * ("replicas=2" into options, "" when none) and the devices its axes
 * multiply to (*devices; 0 for a plain name). A composition not built is
 * TD_ERR_UNSUPPORTED naming it. */
td_status td__mesh_resolve(const char *name, const char **strategy, char *options, size_t n,
                           int *devices);

/* A mesh's groups over g: `replicas` replicas of n = size / replicas
 * consecutive members; rgroup[r], replica r's members; across[k], member k
 * of every replica. Each is g less the others (td_group_shrink), so it
 * shares g's timeouts and injected faults. */
typedef struct td__mesh {
    int replicas, n;
    td_group *rgroup[TD_DP_MAX_MEMBERS];
    td_group *across[TD_DP_MAX_MEMBERS];
} td__mesh;

/* Makes m's groups over g; TD_ERR_INVALID_ARG, naming the strategy `what`,
 * when replicas does not divide g's size. What was made stays in m for
 * td__mesh_close. */
td_status td__mesh_open(td_group *g, int replicas, const char *what, td__mesh *m);
void td__mesh_close(td__mesh *m);
/* fn(args[r]) for r < n, every one at once on a thread of its own (a
 * group's run blocks its caller); the first failure, with its message. */
td_status td__mesh_run_all(int n, td_status (*fn)(void *arg), void *const *args);

/* Options (strategy_options.c) ---------------------------------------------------- */

/* TD_ERR_INVALID_ARG naming the first key of options ("k=v,k=v") that is
 * not one of ops' options, or has no value. */
td_status td__strategy_check_options(const td_strategy_ops *ops, const char *options);
/* The value given for s's option `name` (the last one given), copied into
 * buf; NULL when not given. */
const char *td__strategy_option(const td_strategy *s, const char *name, char *buf, size_t n);
/* Typed readers: leave *out as it is when the option is not given; a value
 * of another kind is TD_ERR_INVALID_ARG naming the option and what it wants. */
td_status td__option_flag(const td_strategy *s, const char *name, int *out);
td_status td__option_count(const td_strategy *s, const char *name, int64_t least, int64_t *out);
td_status td__option_choice(const td_strategy *s, const char *name, const char *const *choices,
                            int *index);

extern const td_strategy_ops td__strategy_single;
extern const td_strategy_ops td__strategy_data;
extern const td_strategy_ops td__strategy_pipeline;
extern const td_strategy_ops td__strategy_tensor;
extern const td_strategy_ops td__strategy_alternate;
extern const td_strategy_ops td__strategy_mirror;
extern const td_strategy_ops td__strategy_tiles;
extern const td_strategy_ops td__strategy_spatial;

#endif
