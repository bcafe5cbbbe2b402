/* The inside of the train layer, shared by its files and the checkpoint code. */
#ifndef TD_TRAIN_IMPL_H
#define TD_TRAIN_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/file.h" /* td__read_file */
#include "tandem/checkpoint.h"
#include "tandem/train.h"

/* Unpacks one gzip stream (n bytes at in) into a malloc'ed buffer of at most
 * max_out bytes. Truncated, corrupt or oversized input is TD_ERR_CORRUPT
 * naming `name`. */
td_status td__gunzip(const uint8_t *in, size_t n, const char *name, size_t max_out, uint8_t **out,
                     size_t *out_len);

/* Turns the loader's prefetch thread on or off (loader.c), whatever
 * TANDEM_PREFETCH and the batch's size chose; for tests. Takes effect from
 * the next td_loader_next(). */
void td__loader_set_prefetch(td_loader *l, int on);

/* A run of td_train_run (trainer.c), and its recovery from lost devices
 * (recovery.c). */
typedef struct td__trainer {
    const td_train_config *cfg;
    td_device_list *devs;
    td_group *group; /* the strategy's devices: all of them, or the survivors of a loss */
    td_strategy *s;
    td_strategy_config scfg; /* what s was made with (and a replacement is) */
    char *json;              /* the model's JSON */
    const char *model_name;  /* its file (or the checkpoint's), for messages */
    td_dataset *train, *test;
    td_dataset_info info;
    td_loader *loader;
    td_train_state state;
    const char *saved;        /* the run's newest checkpoint (written or resumed from), or NULL */
    int root;                 /* this process reports and saves */
    int stop;                 /* the callback or the time limit ended the run */
    int64_t bpe;              /* batches per epoch */
    td_step_result evaluated; /* the last evaluation's sums */
    double last_eval_loss, last_eval_acc;
    int64_t last_eval_step; /* the step of the last evaluation, or -1 */
    td_train_summary *summary;
    FILE *metrics;
    uint64_t t0;          /* process start of the run */
    double train_seconds; /* in steps only */
    int64_t samples;      /* trained on in this process */
    /* The members' numbers: steps reported, and per summary row its shares
     * weighted by the batches' samples, over all the batches' samples. */
    int64_t stat_steps;
    double share_sum[TD_DP_MAX_MEMBERS], batch_samples;
    /* The current epoch. */
    double ep_loss;
    int64_t ep_correct, ep_count, ep_samples, ep_batches;
    double ep_seconds;
    struct td__train_trace *trace; /* trace_path (trace_write.c); NULL: none */
} td__trainer;

/* The summary's row of the group's member `rank`, found by its name (a
 * lost device keeps its row while the survivors' ranks change); a new row
 * when it has none. */
struct td_train_member *td__train_member_row(td__trainer *t, int rank);

/* A setting that contradicts another, the data or the checkpoint: the
 * caller's mistake (a usage error to the CLI), about `setting`
 * (td__error_setting). */
#define BAD_SETTING(t, setting, ...)                                                               \
    ((t)->summary->bad_setting = 1, td__error_setting(TD_ERR_INVALID_ARG, setting, __VA_ARGS__))

/* Checks the run's settings, opens the devices, the data and the metrics
 * file, and makes the strategy (train_setup.c); td__train_teardown frees
 * what it made, also after a failure. */
td_status td__train_setup(td__trainer *t);
void td__train_teardown(td__trainer *t);

/* Measures the strategy's members on the first training samples. */
td_status td__train_calibrate(td__trainer *t);

/* What a lost device left the step: to be taken again by the survivors,
 * taken already, or the run gone back to its newest checkpoint. */
typedef enum td__after_loss { TD__STEP_TO_REDO, TD__STEP_TAKEN, TD__STEPS_REWOUND } td__after_loss;

/* After a call on t->s failed with `lost` (TD_ERR_DEVICE_LOST): the run goes
 * on over the survivors (*after says what became of the step;
 * steps_before: the optimizer steps counted before it), or back to its
 * newest checkpoint, or ends with why. */
td_status td__train_carry_on(td__trainer *t, td_status lost, int64_t steps_before,
                             td__after_loss *after);

/* Runs op, which works between steps on every member (a checkpoint, an
 * evaluation). A device lost in it is handled as after a loss in a step's
 * last exchange, and op runs again. */
td_status td__train_despite_lost(td__trainer *t, td_status (*op)(td__trainer *));

/* The run's timeline (trace_write.c), when cfg->trace_path is set; each
 * does nothing otherwise. check: the settings and that the file can be
 * written, before anything is opened; begin: after the strategy is made,
 * in every process (the clocks are aligned); loading/loaded around the
 * loader's next batch and stepped after the step (tr: td__trace_begin()
 * before it) switch recording on for the steps asked for and off between
 * them; end: after the run, in every process, writes the file (on the
 * first process) and returns `run` when that failed, else the writing's
 * status; close (teardown) releases what is left. */
td_status td__train_trace_check(td__trainer *t);

/* Whether the run can write path as `what` ("the trace"), which `setting`
 * names: TD_ERR_IO naming path and setting when something other than a
 * regular file is there, its folder is missing, not a folder or not
 * writable, or (unless `replaced`: a file saved by renaming a new one over
 * it needs only its folder) the file is not writable. Creates nothing. */
td_status td__train_check_output(const char *path, const char *setting, const char *what,
                                 int replaced);
td_status td__train_trace_begin(td__trainer *t);
void td__train_trace_loading(td__trainer *t);
void td__train_trace_loaded(td__trainer *t, const td_batch *b);
void td__train_trace_stepped(td__trainer *t, uint64_t tr);
td_status td__train_trace_end(td__trainer *t, td_status run);
void td__train_trace_close(td__trainer *t);

#endif
