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

#include "tandem/generate.h"
#include "tandem/strategy.h"

typedef struct td_strategy_ops {
    const char *name;
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
    td_status (*survivors)(void *impl, td_group **out);
    td_status (*carry_on)(td_strategy *s, td_group *survivors, int64_t steps_before,
                          td_strategy *next, int *step_taken, const char **why);
    /* A decoder of the model in checkpoint over g's devices, in dtype, that
     * owns what it builds (td_strategy_decoder_create). */
    td_status (*decoder)(td_group *g, const char *checkpoint, td_dtype dtype, td_decoder **out);
} td_strategy_ops;

struct td_strategy {
    const td_strategy_ops *ops;
    td_group *group;
    char *json;       /* the model's JSON text */
    char *model_name; /* its file, for messages */
    td_strategy_config cfg;
    void *impl;
};

extern const td_strategy_ops td__strategy_single;
extern const td_strategy_ops td__strategy_data;
extern const td_strategy_ops td__strategy_pipeline;
extern const td_strategy_ops td__strategy_tensor;

#endif
