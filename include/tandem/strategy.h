/* tandem: strategies — how the devices of a group share one model's
 * training and evaluation, behind one interface.
 *
 *   single    the group's first device holds the model and does everything
 *   data      a replica on every device; each batch split by measured speed,
 *             gradients all-reduced (td_dp in parallel.h)
 *   pipeline  the model's layers cut into consecutive stages, one per
 *             device; each batch cut into micro-batches that flow through
 *             the stages in the 1F1B order
 *   tensor    each layer split across the devices (an MLP pair by hidden
 *             features, attention by heads, sized by measured speed; the
 *             rest replicated), partial results all-reduced: batch size 1
 *   mirror    every device computes the same step; digests of the loss,
 *             gradients and weights are compared to catch a device that
 *             computes wrong numbers (Super-AA)
 *   tiles     evaluation: each image's conv layers on overlap tiles the
 *             devices pull from a queue, stitched exactly (SuperTiling)
 *
 * The trainer, `tandem eval` and C programs drive each the same way: create
 * it over a group, step, evaluate, save and load whole-model checkpoints. A
 * checkpoint holds the whole model under its own parameter names whatever
 * strategy wrote it, so a run saved under one strategy resumes under any
 * other. Every call is made from one thread that is no member's host thread;
 * for a group over several MPI processes every process makes the same calls.
 */
#ifndef TANDEM_STRATEGY_H
#define TANDEM_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/checkpoint.h"
#include "tandem/comm.h"
#include "tandem/generate.h"
#include "tandem/nn.h"
#include "tandem/parallel.h"
#include "tandem/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_strategy td_strategy;

typedef struct td_strategy_config {
    const char *name; /* td_strategy_names(); NULL: "single" */
    /* The strategy's own options, "key=value" comma-separated (td_strategy_about
     * lists them: "zero=1,overlap=on" for data, "micro_batches=8" for
     * pipeline); NULL or "": its defaults. A key it does not know is an
     * error naming it. */
    const char *options;
    td_dtype dtype;          /* of the weights and activations */
    uint64_t seed;           /* initialisation (as td_model_load's) and dropout */
    td_optimizer_config opt; /* every member's optimizer */
    int64_t batch;           /* samples a step takes (the plan's micro-batches come from it) */
    int replan; /* loading a checkpoint this strategy wrote: keep the split made at creation
                   rather than cut the recorded one again (see td_strategy_load) */
} td_strategy_config;

#define TD_STRATEGY_CONFIG_INIT                                                                    \
    {                                                                                              \
        .name = NULL, .options = NULL, .dtype = TD_F32, .seed = 1,                                 \
        .opt = TD_OPTIMIZER_CONFIG_INIT, .batch = 64, .replan = 0                                  \
    }

/* The strategy names, NULL-terminated, for messages and usage texts. */
TD_API const char *const *td_strategy_names(void);

/* What a strategy is, for usage texts and for checking a configuration
 * before anything is built. */
typedef struct td_strategy_about {
    const char *name;
    const char *summary; /* one line: what it splits */
    int min_members;     /* the fewest devices it runs on */
    int max_members;     /* the most it uses (0: all): training leaves the others idle,
                            generation refuses more */
    int trains;          /* 0: it evaluates only */
    int generates;       /* it makes a decoder (td_strategy_decoder_create) */
    /* Its options: option i's name, its values ("0|1") and a line of help;
     * NULL past the last. */
    const char *option_name[8], *option_values[8], *option_help[8];
} td_strategy_about;

/* Fills *out for the strategy `name`; TD_ERR_INVALID_ARG naming the known
 * ones when there is none of that name. */
TD_API td_status td_strategy_about_get(const char *name, td_strategy_about *out);
/* TD_ERR_INVALID_ARG, naming it, for the first key of options that the
 * strategy `name` does not have (td_strategy_create checks the same, and
 * the values too). */
TD_API td_status td_strategy_check_options(const char *name, const char *options);

/* What a run's report is made of: the figures its steps gave, added up by
 * the caller (the trainer) from td_step_stats. */
typedef struct td_run_figures {
    int64_t steps;
    double hidden;                    /* mean hidden_fraction */
    double ideal_ratio;               /* mean step time over the ideal */
    int buckets, buckets_in_backward; /* the last step's */
} td_run_figures;

/* The words a strategy reports a run with, beside the member table. */
typedef struct td_strategy_report {
    int show_plan;       /* print the plan above the member table */
    char comm_label[16]; /* the table's communication column: "comm s", "transfer s" */
    char wait_label[16]; /* its waiting column: "wait s", "idle s" */
    char note[512];      /* lines under the table; "" none */
} td_strategy_report;

/* Fills *out with s's words for a run that gave the figures f. */
TD_API void td_strategy_report_make(const td_strategy *s, const td_run_figures *f,
                                    td_strategy_report *out);

/* Creates the strategy cfg->name over g's devices for the model described by
 * model_json (`model_name` stands for its file in messages), its weights
 * initialised from cfg->seed exactly as td_model_load would, so every
 * strategy starts from the same weights. g must outlive the strategy. An
 * unknown name, a device without f64 for an f64 model, or a model that does
 * not fit the devices' memory is an error naming the name, device or
 * budget. On failure *out is NULL. */
TD_API td_status td_strategy_create(td_group *g, const char *model_json, const char *model_name,
                                    const td_strategy_config *cfg, td_strategy **out);
/* NULL-safe. */
TD_API void td_strategy_destroy(td_strategy *s);

TD_API const char *td_strategy_name(const td_strategy *s);
TD_API td_group *td_strategy_group(td_strategy *s);
/* What the model reads and predicts: kind, input shape, classes. */
TD_API void td_strategy_model_info(const td_strategy *s, td_model_info *out);
/* A line per member saying what it holds ("cpu:0: layers 0-5, 12.1 MB"), for
 * the run's report. Written into buf (truncated to n); returns buf. */
TD_API const char *td_strategy_plan(const td_strategy *s, char *buf, size_t n);

/* Measures the members on a few passes over `sample` (no update) and sizes
 * their shares from it; nothing to do for strategies without shares. */
TD_API td_status td_strategy_calibrate(td_strategy *s, const td_batch *sample);

/* One training step on the global batch (host memory; the same in every
 * process). `step` keys dropout. *res gets the whole batch's loss sum and
 * counts; *stats (may be NULL) where the time went, member by member. */
TD_API td_status td_strategy_step(td_strategy *s, const td_batch *batch, uint64_t step,
                                  td_step_result *res, td_step_stats *stats);

/* Forward only over n batches: per_batch[i] gets batch i's result, what one
 * device evaluating batch i gives. */
TD_API td_status td_strategy_evaluate(td_strategy *s, const td_batch *batches, size_t n,
                                      td_step_result *per_batch);

/* Writes the whole model and optimizer state with `state` to path, as
 * td_checkpoint_save does for one model (atomically; only the process of
 * global rank 0 writes). state NULL: the strategy's step count, seed,
 * batch and optimizer configuration, at data position 0. */
TD_API td_status td_strategy_save(td_strategy *s, const char *path, const td_train_state *state);
/* Loads a whole-model checkpoint (weights, optimizer state, step count) into
 * every member's part; *state (may be NULL) gets its run state, in every
 * process. A checkpoint this strategy wrote over as many members records
 * its split (td_train_state.split): the members first cut those slices
 * again, whatever the devices measure now, so the resumed run takes
 * bitwise the steps the saved one would have (cfg.replan keeps the split
 * made at creation instead). Saving records the split. The checkpoint's model must be the
 * strategy's. The configuration stays the strategy's: its seed keys dropout, so a run resumed the
 * way it was saved creates the strategy with the checkpoint's seed and optimizer configuration
 * (td_checkpoint_read_meta). */
TD_API td_status td_strategy_load(td_strategy *s, const char *path, td_train_state *state);

/* The learning rate the next step will use, and optimizer steps taken. */
TD_API double td_strategy_lr(const td_strategy *s);
TD_API int64_t td_strategy_steps(const td_strategy *s);

/* After a call failed with TD_ERR_DEVICE_LOST: a new group of the members
 * less those lost (the caller destroys it). */
TD_API td_status td_strategy_survivors(td_strategy *s, td_group **out);

/* Carries the run on over `survivors` (a group td_strategy_survivors made)
 * from the state the survivors hold: *out is a new strategy over them and
 * *step_taken says whether the failed step's update was made (steps_before:
 * the optimizer steps counted before that step). TD_ERR_UNSUPPORTED, with
 * *why saying what was lost, when the lost members held state no survivor
 * has: then the run can only go back to a checkpoint (td_strategy_create
 * over the survivors, then td_strategy_load). s stays as it is. */
TD_API td_status td_strategy_carry_on(td_strategy *s, td_group *survivors, int64_t steps_before,
                                      td_strategy **out, int *step_taken, const char **why);

/* Generation -------------------------------------------------------------------
 *
 * A decoder (generate.h: td_decoder_prefill, td_decoder_step, td_generate)
 * of the model a checkpoint holds, over g's devices, in dtype (the
 * checkpoint's values converted), the way `strategy` splits it:
 *   single  the whole model and its KV cache on g's first device
 *   tensor  each device a shard (tensor's slices, sized by each device's
 *           measured speed at reading weights), the KV cache of its own
 *           heads, and a slice of the head's vocabulary rows; each step
 *           sums the units' partial outputs by small all-reduces
 *   pipeline each device consecutive layers (weights in proportion to its
 *           measured speed) with the cache of its attention layers; the
 *           stages run one after another: for a model bigger than a device
 * Greedy decoding gives the same tokens whatever the strategy and devices,
 * up to rounding. Other strategies do not generate: TD_ERR_UNSUPPORTED
 * saying which do. The decoder owns the models it builds; g must outlive
 * it. Calls as td_strategy's: from one thread that is no member's host
 * thread. */
TD_API td_status td_strategy_decoder_create(td_group *g, const char *strategy,
                                            const char *checkpoint, td_dtype dtype,
                                            td_decoder **out);

#ifdef __cplusplus
}
#endif
#endif
