/* tandem: data sets, seeded batching, and the training loop.
 *
 * Data sets live in host memory; a loader walks one in a seeded order and
 * fills host batches (td_batch, see nn.h) that a model copies to its device.
 * The order depends only on (seed, epoch), never on how many devices train,
 * so a run split across devices sees the same samples as a run on one. */
#ifndef TANDEM_TRAIN_H
#define TANDEM_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/nn.h"
#include "tandem/parallel.h"
#include "tandem/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* IDX files (MNIST) ----------------------------------------------------------
 *
 * An IDX file is a 4-byte magic number (two zero bytes, a type byte, the number
 * of dimensions), one 32-bit big-endian extent per dimension, then the data.
 * tandem reads type 0x08 (unsigned bytes) with 1 to 4 dimensions. */

typedef struct td_idx {
    int ndim;                  /* 1 (labels) to 4 */
    int64_t dims[TD_MAX_DIMS]; /* dims[0] is the number of items */
    uint8_t *data;             /* (dims[0], ..., dims[ndim-1]) bytes, malloc'ed */
    size_t size;               /* bytes in data */
} td_idx;

/* Parses an IDX file held in memory, gzip-compressed (as MNIST ships) or
 * not. Checks the magic number, the type, the extents and that the length is
 * exactly what the header says. `name` stands for the file in messages. On
 * failure *out is zeroed and the message says what is wrong (TD_ERR_CORRUPT,
 * TD_ERR_UNSUPPORTED). The caller releases *out with td_idx_deinit(). */
TD_API td_status td_idx_parse(const void *bytes, size_t n, const char *name, td_idx *out);
/* td_idx_parse() of the file at path; a missing file is TD_ERR_IO naming it. */
TD_API td_status td_idx_read(const char *path, td_idx *out);
/* Frees the data; NULL-safe and safe on a zeroed td_idx. */
TD_API void td_idx_deinit(td_idx *idx);

/* Data sets --------------------------------------------------------------- */

typedef struct td_dataset td_dataset;

typedef struct td_dataset_info {
    td_input_kind kind;         /* features (images) or tokens (text) */
    int64_t size;               /* samples */
    int ndim;                   /* per-sample input shape[0..ndim) */
    int64_t shape[TD_MAX_DIMS]; /* (1, 28, 28) for MNIST, (T) for text */
    int64_t features;           /* product of shape */
    int64_t num_classes;        /* 10, or the vocabulary size */
    int64_t labels_per_sample;  /* 1, or T for text */
} td_dataset_info;

/* Images and labels from two IDX files (images: (n, rows, cols) bytes;
 * labels: (n) bytes, each below 256). Pixels become floats
 *     x = (p / 255 - 0.1307) / 0.3081,
 * MNIST's training-set mean and standard deviation, as PyTorch's MNIST
 * examples do. Errors name the file. The caller destroys *out. */
TD_API td_status td_dataset_open_idx(const char *images_path, const char *labels_path,
                                     td_dataset **out);

/* The MNIST layout in dir: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
 * t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (gzipped or, without
 * .gz, not). *train gets 60,000 samples and *test 10,000. Any folder so laid
 * out (Fashion-MNIST, KMNIST) reads the same way; both parts are normalised
 * with the training images' mean and deviation of p / 255, each rounded to
 * 4 decimals (for MNIST exactly the 0.1307 and 0.3081 above). */
TD_API td_status td_mnist_open(const char *dir, td_dataset **train, td_dataset **test);

typedef enum td_text_vocab {
    TD_TEXT_BYTES = 0, /* 256 tokens: token = byte value */
    TD_TEXT_CHARS =
        1, /* the distinct bytes of the file, sorted: token = rank (65 for Tiny Shakespeare) */
} td_text_vocab;

typedef struct td_text_options {
    int64_t context;     /* T: tokens per sample */
    double val_fraction; /* the file's last part held out for validation, e.g. 0.1 */
    td_text_vocab vocab;
} td_text_options;

#define TD_TEXT_OPTIONS_INIT                                                                       \
    { .context = 128, .val_fraction = 0.1, .vocab = TD_TEXT_BYTES }

/* A character-level text data set. The file's first (1 - val_fraction) bytes
 * train, the rest validate. Training sample i is the window of T tokens
 * starting at byte i (every start, so a shuffled epoch is random windows
 * drawn without replacement); validation sample i starts at byte i * T (the
 * held-out text once, without overlap). Labels are the next byte of each
 * position. Either part too short for one window is TD_ERR_INVALID_ARG
 * naming the file. The caller destroys both. */
TD_API td_status td_text_open(const char *path, const td_text_options *opt, td_dataset **train,
                              td_dataset **val);

/* NULL-safe. */
TD_API void td_dataset_destroy(td_dataset *ds);
TD_API void td_dataset_get_info(const td_dataset *ds, td_dataset_info *out);
/* The file (or folder) the data set came from. Valid while ds lives. */
TD_API const char *td_dataset_source(const td_dataset *ds);
/* Text data sets with TD_TEXT_CHARS: the vocabulary, token i being byte
 * vocab[i], and its length; NULL and 0 otherwise. Valid while ds lives. */
TD_API const uint8_t *td_dataset_vocab(const td_dataset *ds, size_t *len);

/* How td_data_open() reads and divides a path (all zero: the defaults). */
typedef struct td_data_options {
    const char *test_path;    /* evaluation data in the same kind of file; NULL: a split */
    double split;             /* fraction held out when test_path is NULL; 0: 0.1 */
    const char *label_column; /* CSV: the labels' column; NULL: "label" */
} td_data_options;

/* Opens the training and evaluation data for the model mi describes, the
 * format chosen by path (docs/train.md):
 *   a folder                 IDX files in the MNIST layout (td_mnist_open)
 *   NAME.csv                 a table: a header, numeric columns, a label column
 *   NAME.safetensors         tensors "x" (N, ...) and "y" (N) or (N, T)
 *   X.npy,Y.npy              two .npy files: features (or tokens), labels
 *   any other file           text, for a model that reads tokens (td_text_open)
 * The files' samples must hold as many values as the model's input and their
 * labels (tokens) lie in [0, mi->classes). Without opt->test_path, a
 * fraction opt->split of the samples is held out (td_text_open's validation
 * part for text; for the array formats chosen by a shuffle with a fixed
 * seed, so every run holds out the same ones); an IDX folder brings its own
 * test files and takes neither. Errors name the file, and the row, column or
 * sample at fault. The caller destroys both. */
TD_API td_status td_data_open(const char *path, const td_data_options *opt, const td_model_info *mi,
                              td_dataset **train, td_dataset **test);

/* Writes sample `index` (0 <= index < size): its features into x (features
 * floats) for images or its tokens into tokens (T ints) for text, and its
 * labels_per_sample labels. The pointer not used by the kind may be NULL.
 * Thread-safe: reads only. */
TD_API td_status td_dataset_get(const td_dataset *ds, int64_t index, float *x, int32_t *tokens,
                                int32_t *labels);

/* Loaders: seeded shuffling and batching -------------------------------------
 *
 * Epoch e visits the samples in the order of a Fisher-Yates shuffle driven by
 * Philox with key seed and counters (i, e): the same (seed, epoch) gives the
 * same order on every machine and for every device count. Batches hold
 * `batch` samples; the epoch's last one may be smaller. */

typedef struct td_loader td_loader;

/* The loader borrows ds, which must outlive it. shuffle = 0 keeps the data
 * set's order (for evaluation). The caller destroys *out. */
TD_API td_status td_loader_create(const td_dataset *ds, int64_t batch, uint64_t seed, int shuffle,
                                  td_loader **out);
/* NULL-safe. */
TD_API void td_loader_destroy(td_loader *l);
/* Fills *out with the next batch of the current epoch; its arrays belong to
 * the loader and stay valid until the next call. At the end of an epoch
 * *out->n is 0 once and the following call starts the next epoch. */
TD_API td_status td_loader_next(td_loader *l, td_batch *out);
/* Where the next batch starts: the epoch and the position in its order. */
TD_API void td_loader_position(const td_loader *l, int64_t *epoch, int64_t *index);
/* Moves to (epoch, index) as td_loader_position() gave it, so that a resumed
 * run reads exactly what an uninterrupted one would have. */
TD_API td_status td_loader_seek(td_loader *l, int64_t epoch, int64_t index);
/* ceil(size / batch). */
TD_API int64_t td_loader_batches_per_epoch(const td_loader *l);
/* The sample at position i of epoch e's order (for tests and tools). */
TD_API td_status td_loader_order(const td_loader *l, int64_t epoch, int64_t i, int64_t *sample);

/* The trainer ---------------------------------------------------------------- */

typedef enum td_train_event_kind {
    TD_TRAIN_EVENT_STEP = 0,  /* after each optimizer step */
    TD_TRAIN_EVENT_EPOCH = 1, /* at each epoch's end, after evaluation */
    TD_TRAIN_EVENT_DONE = 2,  /* once, after the final evaluation */
    TD_TRAIN_EVENT_EVAL = 3,  /* after an evaluation every eval_every steps */
} td_train_event_kind;

typedef struct td_train_event {
    td_train_event_kind kind;
    int root;               /* 1 in the process that reports (MPI rank 0, or the only one) */
    int64_t step;           /* optimizer steps taken so far (over the whole run) */
    int64_t total_steps;    /* steps the run will take, when known; else 0 */
    int64_t epoch;          /* 0-based epoch the step belongs to */
    int64_t batch_in_epoch; /* batches done in this epoch */
    int64_t batches_per_epoch;
    double loss;          /* STEP: this batch's mean loss; EPOCH/DONE: the epoch's train loss */
    double accuracy;      /* STEP: this batch's; EPOCH/DONE: the epoch's train accuracy */
    double lr;            /* the rate the step used */
    double samples_per_s; /* STEP: since the epoch began; EPOCH: the epoch's; DONE: the run's */
    double eval_loss;     /* EPOCH/DONE: test (or validation) mean loss; NAN when not run */
    double eval_accuracy; /* EPOCH/DONE: test (or validation) accuracy */
    double elapsed_s;     /* since the run (this process) began */
    /* STEP: the step's timings per member (member r is the group's rank r),
     * and the group that took it (td_group_device() gives a member's device,
     * NULL for one in another process); both borrowed for the callback's
     * duration. NULL in other events, and stats NULL for a step that a lost
     * device's recovery took. */
    const td_step_stats *stats;
    const td_group *group;
} td_train_event;

/* The settings a caller chose (td_train_config.given, or'ed). When resuming,
 * the checkpoint supplies the rest; those chosen are held against it. */
typedef enum td_train_given {
    TD_GIVEN_BATCH = 1u << 0,
    TD_GIVEN_SEED = 1u << 1,
    TD_GIVEN_DTYPE = 1u << 2,
    TD_GIVEN_OPTIMIZER = 1u << 3, /* opt.kind */
    TD_GIVEN_LR = 1u << 4,
    TD_GIVEN_MOMENTUM = 1u << 5,
    TD_GIVEN_NESTEROV = 1u << 6,
    TD_GIVEN_WEIGHT_DECAY = 1u << 7,
    TD_GIVEN_CLIP = 1u << 8,
    TD_GIVEN_SCHEDULE = 1u << 9,
    TD_GIVEN_WARMUP = 1u << 10,
    TD_GIVEN_MIN_LR = 1u << 11,
} td_train_given;

/* What a resumed cosine schedule does over the run's new length. */
typedef enum td_train_extend {
    /* Keeps its start and ends at the new last step: a longer run goes on
     * from a higher rate than the checkpoint's last step had. */
    TD_EXTEND_STRETCH = 0,
    /* A new cosine from opt.lr (the checkpoint's unless TD_GIVEN_LR) at the
     * resumed step down to min_lr at the new last step, without warm-up.
     * The checkpoint records the phase's first step as its warmup_steps. */
    TD_EXTEND_RESTART = 1,
} td_train_extend;

/* Called on the thread that runs td_train_run(). A non-zero return stops
 * the run after the current step (the checkpoint is still written). */
typedef int (*td_train_callback)(void *arg, const td_train_event *ev);

typedef struct td_train_config {
    const char *model_path; /* model JSON; NULL when resuming takes the checkpoint's */
    const char *data_path;  /* td_data_open's path: an IDX folder, .csv, .safetensors, ... */
    const char *devices;    /* device spec; the first device trains; NULL: "cpu" */
    td_dtype dtype;
    /* TD_PRECISION_BF16: mixed precision, the matrix products of every
     * device that has bf16 ones (td_device_set_precision) from bf16-rounded
     * inputs with f32 sums; weights, gradients, optimizer state and
     * reductions stay f32. Needs dtype f32 (else TD_ERR_INVALID_ARG); a
     * device without bf16 products computes in f32, and the run says so
     * once (a warning, and td_train_summary.precision). */
    td_precision precision;
    int64_t epochs;           /* epochs to train; 0 with steps > 0: steps decide */
    int64_t steps;            /* stop after this many optimizer steps in all; 0: epochs decide */
    int64_t batch;            /* samples per step */
    uint64_t seed;            /* initialisation, data order and dropout */
    td_optimizer_config opt;  /* total_steps 0: filled in from epochs/steps */
    double max_seconds;       /* stop after this much training time; 0: no limit */
    int64_t eval_samples;     /* evaluate on at most this many test samples; 0: all */
    int eval_each_epoch;      /* evaluate at every epoch's end, not only at the end */
    const char *checkpoint;   /* written at each epoch's end and at the end; NULL: none */
    int64_t checkpoint_every; /* also every this many steps; 0: not */
    const char *resume;       /* a checkpoint to continue from; NULL: start afresh */
    int replan;               /* resuming: split the model as measured now, not as the
                                 checkpoint recorded (td_strategy_config.replan) */
    const char *metrics;      /* JSON lines, one per step and per epoch; NULL: none */
    td_train_callback callback;
    void *callback_arg;
    int64_t eval_every; /* also evaluate every this many steps; 0: not */
    /* More of the data (td_data_open): evaluation data, the fraction held out
     * without it (0: 0.1), and a CSV file's label column (NULL: "label"). */
    const char *test_data_path;
    double split;
    const char *label_column;
    /* How the devices share the work (td_strategy_names): NULL or "single"
     * trains on the first device; "data" keeps a replica on every device
     * (and, under mpirun, in every process) and splits each batch by
     * measured speed; "pipeline" cuts the model's layers into stages, one
     * per device. */
    const char *strategy;
    /* The strategy's own options (td_strategy_config.options): "zero=1" for
     * data, "micro_batches=8" for pipeline; NULL: its defaults. */
    const char *strategy_options;
    /* Resuming: model_path, when set, must be the checkpoint's model; of the
     * settings in `given`, batch, seed, dtype, the optimizer's kind and its
     * warm-up must equal the checkpoint's (else TD_ERR_INVALID_ARG naming
     * both values), and the optimizer's other settings apply from the
     * resumed step on. Settings not given are the checkpoint's. */
    unsigned given;
    td_train_extend extend; /* resuming a cosine schedule: stretch or restart it */
    /* A timeline of the steps (a Chrome trace-event JSON file, for
     * https://ui.perfetto.dev or chrome://tracing): a track per device host
     * thread and one for the trainer, with forward, backward, the optimizer
     * step, each collective (kind, bytes), copies, waits and parked steps.
     * Under mpirun the first process writes every process's (pid: the
     * rank). NULL: none. Left out of TD_TRAIN_CONFIG_INIT: zero is off. */
    const char *trace_path;
    int64_t trace_first, trace_last; /* steps recorded, from 1; 0: from the first, to the last */
} td_train_config;

#define TD_TRAIN_CONFIG_INIT                                                                       \
    {                                                                                              \
        .model_path = NULL, .data_path = NULL, .devices = NULL, .dtype = TD_F32,                   \
        .precision = TD_PRECISION_F32, .epochs = 1, .steps = 0, .batch = 64, .seed = 1,            \
        .opt = TD_OPTIMIZER_CONFIG_INIT, .max_seconds = 0.0, .eval_samples = 0,                    \
        .eval_each_epoch = 1, .checkpoint = NULL, .checkpoint_every = 0, .resume = NULL,           \
        .replan = 0, .metrics = NULL, .callback = NULL, .callback_arg = NULL, .eval_every = 0,     \
        .strategy = NULL, .strategy_options = NULL, .given = 0, .extend = TD_EXTEND_STRETCH        \
    }

typedef struct td_train_summary {
    int64_t steps;        /* optimizer steps taken in all (including before a resume) */
    int64_t epochs_done;  /* complete epochs */
    int64_t samples;      /* samples trained on by this process */
    double train_seconds; /* time in training steps (this process) */
    double samples_per_s; /* samples / train_seconds */
    double final_loss;    /* mean train loss of the last epoch (or of the steps since it began) */
    double test_loss;     /* on the test or validation set; NAN when not evaluated */
    double test_accuracy;
    int64_t test_samples;
    int stopped;   /* 1 when max_seconds or the callback ended the run early */
    double max_lr; /* the highest learning rate a step of this run took; 0 when none */
    /* 1 when td_train_run failed because a setting contradicts another, the
     * data or the checkpoint: the caller's mistake rather than the run's */
    int bad_setting;
    char device[32];   /* the device that trained ("cpu:0"), or the first of several */
    int devices_named; /* devices --devices opened (in this process) */
    char strategy[16]; /* the strategy that trained ("single", "data", "pipeline", "tensor") */
    /* With precision bf16: what computed each device's products, "cpu:0
     * bf16 (AVX512-BF16 vdpbf16ps)" or "opencl:0.0 f32 (no bf16 products)",
     * separated by "; "; "" in f32 */
    char precision[256];
    char plan[2048]; /* what each device held at the end (td_strategy_plan), a line each */
    td_strategy_report report; /* the strategy's words for the member table */
    /* Every member's totals over the run (td_step_stats added up). */
    int members;        /* devices that trained, all processes; 1 for "single" */
    int root;           /* 1 in the process that reports (MPI rank 0, or the only one) */
    double hidden;      /* mean share of the gradient reduction hidden behind backward */
    double ideal_ratio; /* mean step time over the ideal (work / sum of speeds) */
    int buckets, buckets_in_backward; /* the last step's (td_step_stats) */
    struct td_train_member {
        char name[32];
        int64_t samples;
        double share;         /* of all samples (data), or of the layers' cost (pipeline) */
        double compute_s;     /* forward and backward */
        double comm_s;        /* data: waiting for reductions after backward (exposed);
                                 pipeline: copying activations and their gradients in */
        double update_s;      /* the optimizer step (and ZeRO-1's gather of the weights) */
        double wait_s;        /* idle until the slowest member finished */
        int64_t parked_steps; /* steps it sat out (see td_balancer_parked) */
        /* 0, or the step in which it was lost (the others went on); lost
         * between steps (a checkpoint or an evaluation brought replicas up
         * to date), the step after */
        int64_t lost_at_step;
        /* 0, or the step of the checkpoint the others went back to when it
         * was lost holding state none of them had (its ZeRO-1 shard of the
         * optimizer state, or the only current replica) */
        int64_t back_to_step;
    } member[TD_DP_MAX_MEMBERS];
} td_train_summary;

/* Trains cfg->model_path on cfg->data_path: loads or resumes, runs the
 * steps, evaluates, writes the checkpoint and the metrics, and reports
 * through cfg->callback. Errors name the file, flag or device at fault. */
TD_API td_status td_train_run(const td_train_config *cfg, td_train_summary *out);

/* Evaluates a model on the whole of ds (in order, batch samples at a time):
 * *out gets the loss sum, the correct count and the label count. */
TD_API td_status td_evaluate(td_model *m, const td_dataset *ds, int64_t batch, int64_t max_samples,
                             td_step_result *out);

/* The same with the `alternate` strategy: whole batches go round-robin,
 * weighted by speed, across the replicas of dp; the result equals
 * td_evaluate() on one of them exactly (the batches' sums are added in
 * order). */
TD_API td_status td_evaluate_alternate(td_dp *dp, const td_dataset *ds, int64_t batch,
                                       int64_t max_samples, td_step_result *out);

/* The same through a strategy (td_strategy_evaluate): the batches' results
 * are added in order, so the result equals td_evaluate() on one device up to
 * what the strategy's own arithmetic changes (nothing for single, data and
 * alternate). */
TD_API td_status td_evaluate_strategy(td_strategy *s, const td_dataset *ds, int64_t batch,
                                      int64_t max_samples, td_step_result *out);

#ifdef __cplusplus
}
#endif
#endif
