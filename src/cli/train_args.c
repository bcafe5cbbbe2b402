/* tandem train's options: the parser, apart from the run so that it can be
 * called (and fuzzed, fuzz/fuzz_cli.c) on an argv without training. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

/* Prints `text` in lines of at most 80 columns, each indented by 22 and
 * the first led by `lead`. */
static void print_wrapped(FILE *out, const char *lead, const char *text) {
    const char *at = text;
    int col = fprintf(out, "%22s%s", "", lead);
    while (*at) {
        size_t word = strcspn(at, " ");
        if (col + (int)word + 1 > 80) {
            fprintf(out, "\n%24s", "");
            col = 24;
        } else if (at != text) {
            col += fprintf(out, " ");
        }
        col += fprintf(out, "%.*s", (int)word, at);
        at += word;
        at += strspn(at, " ");
    }
    fprintf(out, "\n");
}

/* Each training strategy's line, from the strategy table. */
static void print_strategies(FILE *out) {
    for (const char *const *n = td_strategy_names(); *n; n++) {
        td_strategy_about a;
        char lead[32];
        if (td_strategy_about_get(*n, &a) != TD_OK || !a.trains)
            continue;
        snprintf(lead, sizeof lead, "%s:", a.name);
        print_wrapped(out, lead, a.summary);
    }
}

void td_cli_train_usage(FILE *out) {
    fprintf(out,
            "usage: tandem train --model M.json --data D [options]\n"
            "       tandem train --resume CKPT --data D [options]\n\n"
            "Trains the model M on D: an MNIST folder of IDX files (data/mnist) for image\n"
            "models, a text file (data/text/tinyshakespeare.txt) for token models, or your\n"
            "own: a .csv table, a .safetensors file (tensors x and y) or X.npy,Y.npy (see\n"
            "docs/train.md). Prints per-epoch loss, accuracy and throughput, then the test\n"
            "accuracy.\n\n"
            "  --model FILE        model JSON (examples/mnist_mlp.json, ...)\n"
            "  --data PATH         IDX folder, text file, .csv, .safetensors or X.npy,Y.npy\n"
            "  --test-data PATH    evaluate on PATH (same kind of file as --data) instead of\n"
            "                      a held-out part of it\n"
            "  --split F           hold out the fraction F of --data to evaluate on (default\n"
            "                      0.1; the same samples every run)\n"
            "  --label-column NAME the CSV column holding the labels (default label)\n"
            "  --epochs N          epochs to train (default 1)\n"
            "  --steps N           stop after N optimizer steps in all (with --epochs: first)\n"
            "  --batch B           samples per step (default 64)\n"
            "  --optimizer NAME    sgd (default) or adamw\n"
            "  --lr X              learning rate (default 0.01 sgd, 0.001 adamw)\n"
            "  --momentum X        SGD momentum (default 0.9)\n"
            "  --nesterov          SGD with Nesterov momentum\n"
            "  --weight-decay X    AdamW decoupled decay or SGD L2 (default 0)\n"
            "  --schedule NAME     constant (default) or cosine (to --min-lr)\n"
            "  --warmup N          linear warm-up steps (default 0)\n"
            "  --min-lr X          end of the cosine schedule (default 0)\n"
            "  --clip X            clip gradients to global norm X (default off)\n"
            "  --precision P       f32 (default), f64, or bf16: mixed precision, matrix\n"
            "                      products from bf16 inputs with f32 sums, f32 weights\n"
            "  --devices SPEC      devices (default cpu): 'cpu*2', 'cpu:0,cpu:1{slowdown=3}'\n"
            "  --strategy S        how the devices share the work (default single):\n");
    print_strategies(out);
    fprintf(out, "                      or a mesh of them, outermost axis first:\n"
                 "                        data:2,tensor:2 (two replicas, each split in two)\n");
    fprintf(out,
            "  --strategy-option K=V  one of the strategy's own options; the flags below\n"
            "                      are their spellings:\n"
            "  --deterministic     data: bitwise the same weights for any number of devices\n"
            "  --zero              data: ZeRO-1, each device keeps only its shard of the\n"
            "                      optimizer state (weights all-gathered after each step)\n"
            "  --bucket-bytes N    data: gradient all-reduce bucket size (default 4 MiB)\n"
            "  --overlap WHEN      data: reduce each bucket while backward goes on: auto\n"
            "                      (default: unless every device is a CPU device of this\n"
            "                      process, whose cores would do both), on or off\n"
            "  --micro-batches M   pipeline: micro-batches per step, at most the batch\n"
            "                      (default: four per device, or the batch if smaller)\n"
            "  --seed S            initialisation, data order and dropout (default 1)\n"
            "  --checkpoint PATH   save a checkpoint (safetensors) at each epoch's end and last\n"
            "  --checkpoint-every N  also every N steps\n"
            "  --resume PATH       continue the run saved in PATH (model, optimizer, data order);\n"
            "                      --batch, --seed, --precision, --optimizer, --warmup and\n"
            "                      --model must then match it, the other optimizer options\n"
            "                      apply from here on; the model is split across the\n"
            "                      devices as the checkpoint records, so the steps are\n"
            "                      bitwise those of a run that never stopped\n"
            "  --replan            resuming: split the model by what the devices measure now\n"
            "  --extend HOW        resuming a cosine schedule with a new end: stretch (default:\n"
            "                      it ends at the new end) or restart (a new cosine from --lr)\n"
            "  --metrics FILE      write JSON lines: one per step, epoch and the end\n"
            "  --trace FILE        write a timeline of every device (Chrome trace-event JSON:\n"
            "                      open it in https://ui.perfetto.dev): forward, backward,\n"
            "                      optimizer, collectives, copies and waits, per step\n"
            "  --trace-steps A:B   trace steps A to B only (from 1; 'A:' to the end)\n"
            "  --max-seconds X     stop after X seconds of training\n"
            "  --eval-samples N    evaluate on the first N test samples only\n"
            "  --eval-every N      also evaluate every N steps (a line and a metrics record)\n"
            "  --no-epoch-eval     evaluate at the end only\n"
            "  --summary           print a last line 'summary: {json}' for scripts\n"
            "  --monitor           show each device while it trains: busy fraction (NVML's\n"
            "                      utilisation for CUDA GPUs), memory in use, share of the\n"
            "                      batch, time in the step; redrawn in place on a terminal,\n"
            "                      else a plain line on stderr every 10 s\n"
            "  --quiet             no progress output\n"
            "  --help              show this help\n");
}

enum {
    OPT_MODEL = 256,
    OPT_DATA,
    OPT_TEST_DATA,
    OPT_SPLIT,
    OPT_LABEL_COLUMN,
    OPT_EPOCHS,
    OPT_STEPS,
    OPT_BATCH,
    OPT_OPTIMIZER,
    OPT_LR,
    OPT_MOMENTUM,
    OPT_NESTEROV,
    OPT_WD,
    OPT_SCHEDULE,
    OPT_WARMUP,
    OPT_MIN_LR,
    OPT_CLIP,
    OPT_PRECISION,
    OPT_DEVICES,
    OPT_STRATEGY,
    OPT_DETERMINISTIC,
    OPT_ZERO,
    OPT_BUCKET_BYTES,
    OPT_OVERLAP,
    OPT_MICRO_BATCHES,
    OPT_SEED,
    OPT_CHECKPOINT,
    OPT_CHECKPOINT_EVERY,
    OPT_STRATEGY_OPTION,
    OPT_RESUME,
    OPT_REPLAN,
    OPT_EXTEND,
    OPT_METRICS,
    OPT_TRACE,
    OPT_TRACE_STEPS,
    OPT_MAX_SECONDS,
    OPT_EVAL_SAMPLES,
    OPT_EVAL_EVERY,
    OPT_NO_EPOCH_EVAL,
    OPT_SUMMARY,
    OPT_QUIET,
    OPT_MONITOR,
    OPT_HELP,
};

/* A strategy's name, or a mesh of them ("data:2,tensor:2"). */
static int known_strategy(const char *name) {
    td_strategy_about a;
    return td_strategy_about_get(name, &a) == TD_OK;
}

/* "single, data, pipeline or tensor" into buf. */
static const char *strategy_list(char *buf, size_t size) {
    const char *const *n = td_strategy_names();
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; n[i] && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s",
                                 i == 0 ? "" : (n[i + 1] ? ", " : " or "), n[i]);
    return buf;
}

static const struct option options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"data", required_argument, NULL, OPT_DATA},
    {"test-data", required_argument, NULL, OPT_TEST_DATA},
    {"split", required_argument, NULL, OPT_SPLIT},
    {"label-column", required_argument, NULL, OPT_LABEL_COLUMN},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"steps", required_argument, NULL, OPT_STEPS},
    {"batch", required_argument, NULL, OPT_BATCH},
    {"optimizer", required_argument, NULL, OPT_OPTIMIZER},
    {"lr", required_argument, NULL, OPT_LR},
    {"momentum", required_argument, NULL, OPT_MOMENTUM},
    {"nesterov", no_argument, NULL, OPT_NESTEROV},
    {"weight-decay", required_argument, NULL, OPT_WD},
    {"schedule", required_argument, NULL, OPT_SCHEDULE},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"min-lr", required_argument, NULL, OPT_MIN_LR},
    {"clip", required_argument, NULL, OPT_CLIP},
    {"precision", required_argument, NULL, OPT_PRECISION},
    {"devices", required_argument, NULL, OPT_DEVICES},
    {"strategy", required_argument, NULL, OPT_STRATEGY},
    {"deterministic", no_argument, NULL, OPT_DETERMINISTIC},
    {"zero", no_argument, NULL, OPT_ZERO},
    {"bucket-bytes", required_argument, NULL, OPT_BUCKET_BYTES},
    {"overlap", required_argument, NULL, OPT_OVERLAP},
    {"strategy-option", required_argument, NULL, OPT_STRATEGY_OPTION},
    {"micro-batches", required_argument, NULL, OPT_MICRO_BATCHES},
    {"seed", required_argument, NULL, OPT_SEED},
    {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
    {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"replan", no_argument, NULL, OPT_REPLAN},
    {"extend", required_argument, NULL, OPT_EXTEND},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"trace", required_argument, NULL, OPT_TRACE},
    {"trace-steps", required_argument, NULL, OPT_TRACE_STEPS},
    {"max-seconds", required_argument, NULL, OPT_MAX_SECONDS},
    {"eval-samples", required_argument, NULL, OPT_EVAL_SAMPLES},
    {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
    {"no-epoch-eval", no_argument, NULL, OPT_NO_EPOCH_EVAL},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"monitor", no_argument, NULL, OPT_MONITOR},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* Appends key=value (key "": value is the whole item) to the strategy's
 * options (the flags are their CLI spellings); the strategy checks them. */
static int add_strategy_option(td_cli_train_args *a, const char *key, const char *value) {
    size_t used = strlen(a->strategy_options);
    snprintf(a->strategy_options + used, sizeof a->strategy_options - used, "%s%s%s%s",
             used ? "," : "", key, key[0] ? "=" : "", value);
    a->cfg.strategy_options = a->strategy_options;
    return 1;
}

/* --strategy-option K=V, as it is. */
static int add_strategy_item(FILE *err, td_cli_train_args *a, const char *item) {
    const char *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1] || strchr(item, ',')) {
        fprintf(err, "tandem train: --strategy-option wants KEY=VALUE, not '%s'\n", item);
        return 0;
    }
    return add_strategy_option(a, "", item);
}

static int parse_int(FILE *err, const char *flag, const char *s, long long lo, long long *out) {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo) {
        fprintf(err, "tandem train: --%s wants an integer >= %lld, not '%s'\n", flag, lo, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_double(FILE *err, const char *flag, const char *s, double lo, double *out) {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo) {
        fprintf(err, "tandem train: --%s wants a number >= %g, not '%s'\n", flag, lo, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* A word among `names` (NULL-terminated) into *out (its index); else a
 * usage error listing them. */
static int parse_word(FILE *err, const char *flag, const char *s, const char *const *names,
                      int *out) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 1;
        }
    fprintf(err, "tandem train: --%s is", flag);
    for (int i = 0; names[i]; i++)
        fprintf(err, "%s%s", i == 0 ? " " : (names[i + 1] ? ", " : " or "), names[i]);
    fprintf(err, ", not '%s'\n", s);
    return 0;
}

/* The options that take a whole number (eval-every the last). */
static int parse_count(FILE *err, int c, const char *arg, td_cli_train_args *a) {
    td_train_config *cfg = &a->cfg;
    long long v;
    switch (c) {
    case OPT_EPOCHS:
        if (!parse_int(err, "epochs", arg, 1, &v))
            return 0;
        cfg->epochs = v;
        a->epochs_given = 1;
        return 1;
    case OPT_STEPS:
        if (!parse_int(err, "steps", arg, 1, &v))
            return 0;
        cfg->steps = v;
        return 1;
    case OPT_BATCH:
        if (!parse_int(err, "batch", arg, 1, &v))
            return 0;
        cfg->batch = v;
        cfg->given |= TD_GIVEN_BATCH;
        return 1;
    case OPT_WARMUP:
        if (!parse_int(err, "warmup", arg, 0, &v))
            return 0;
        cfg->opt.warmup_steps = v;
        cfg->given |= TD_GIVEN_WARMUP;
        return 1;
    case OPT_BUCKET_BYTES:
        if (!parse_int(err, "bucket-bytes", arg, 64, &v))
            return 0;
        return add_strategy_option(a, "bucket_bytes", arg);
    case OPT_MICRO_BATCHES:
        if (!parse_int(err, "micro-batches", arg, 1, &v))
            return 0;
        return add_strategy_option(a, "micro_batches", arg);
    case OPT_SEED:
        if (!parse_int(err, "seed", arg, 0, &v))
            return 0;
        cfg->seed = (uint64_t)v;
        cfg->given |= TD_GIVEN_SEED;
        return 1;
    case OPT_CHECKPOINT_EVERY:
        if (!parse_int(err, "checkpoint-every", arg, 1, &v))
            return 0;
        cfg->checkpoint_every = v;
        return 1;
    case OPT_EVAL_SAMPLES:
        if (!parse_int(err, "eval-samples", arg, 1, &v))
            return 0;
        cfg->eval_samples = v;
        return 1;
    default:
        if (!parse_int(err, "eval-every", arg, 1, &v))
            return 0;
        cfg->eval_every = v;
        return 1;
    }
}

/* The options that take a real number: where it goes and the flag it marks
 * as given (0: none). */
static int parse_real(FILE *err, int c, const char *arg, td_cli_train_args *a) {
    td_train_config *cfg = &a->cfg;
    static const struct {
        int opt;
        const char *flag;
        unsigned given;
    } reals[] = {
        {OPT_LR, "lr", TD_GIVEN_LR},
        {OPT_MOMENTUM, "momentum", TD_GIVEN_MOMENTUM},
        {OPT_WD, "weight-decay", TD_GIVEN_WEIGHT_DECAY},
        {OPT_MIN_LR, "min-lr", TD_GIVEN_MIN_LR},
        {OPT_CLIP, "clip", TD_GIVEN_CLIP},
        {OPT_MAX_SECONDS, "max-seconds", 0},
    };
    double *dest[] = {&cfg->opt.lr,     &cfg->opt.momentum,  &cfg->opt.weight_decay,
                      &cfg->opt.min_lr, &cfg->opt.clip_norm, &cfg->max_seconds};
    size_t i = 0;
    while (reals[i].opt != c)
        i++;
    if (!parse_double(err, reals[i].flag, arg, 0, dest[i]))
        return 0;
    cfg->given |= reals[i].given;
    return 1;
}

/* The options that name one of a few words. */
static int parse_choice(FILE *err, int c, const char *arg, td_cli_train_args *a) {
    static const char *const optimizers[] = {"sgd", "adamw", NULL};
    static const char *const schedules[] = {"constant", "cosine", NULL};
    static const char *const precisions[] = {"f32", "f64", "bf16", NULL};
    static const char *const overlaps[] = {"auto", "on", "off", NULL};
    static const char *const extends[] = {"stretch", "restart", NULL};
    td_train_config *cfg = &a->cfg;
    int i;
    switch (c) {
    case OPT_OPTIMIZER:
        if (!parse_word(err, "optimizer", arg, optimizers, &i))
            return 0;
        cfg->opt.kind = i ? TD_OPT_ADAMW : TD_OPT_SGD;
        cfg->given |= TD_GIVEN_OPTIMIZER;
        return 1;
    case OPT_SCHEDULE:
        if (!parse_word(err, "schedule", arg, schedules, &i))
            return 0;
        cfg->opt.schedule = i ? TD_LR_COSINE : TD_LR_CONSTANT;
        cfg->given |= TD_GIVEN_SCHEDULE;
        return 1;
    case OPT_PRECISION:
        if (!parse_word(err, "precision", arg, precisions, &i))
            return 0;
        cfg->dtype = i == 1 ? TD_F64 : TD_F32;
        cfg->precision = i == 2 ? TD_PRECISION_BF16 : TD_PRECISION_F32;
        /* bf16 trains f32 weights but does not insist on them when resuming:
         * an f64 checkpoint gets the trainer's word on precision instead */
        if (i != 2)
            cfg->given |= TD_GIVEN_DTYPE;
        return 1;
    case OPT_OVERLAP:
        if (!parse_word(err, "overlap", arg, overlaps, &i))
            return 0;
        return add_strategy_option(a, "overlap", overlaps[i]);
    case OPT_EXTEND:
        if (!parse_word(err, "extend", arg, extends, &i))
            return 0;
        cfg->extend = i ? TD_EXTEND_RESTART : TD_EXTEND_STRETCH;
        a->extend_given = 1;
        return 1;
    default:
        if (!known_strategy(arg)) {
            char list[128];
            if (strchr(arg, ':')) /* a mesh: the library says what is wrong with it */
                fprintf(err, "tandem train: --strategy: %s\n", td_last_error());
            else
                fprintf(err, "tandem train: --strategy is %s, not '%s'\n",
                        strategy_list(list, sizeof list), arg);
            return 0;
        }
        cfg->strategy = arg;
        return 1;
    }
}

/* --split: a fraction strictly between 0 and 1. */
static int parse_split(FILE *err, const char *arg, td_train_config *cfg) {
    double v;
    if (!parse_double(err, "split", arg, 0, &v))
        return 0;
    if (v <= 0 || v >= 1) {
        fprintf(err, "tandem train: --split wants a fraction between 0 and 1, not '%s'\n", arg);
        return 0;
    }
    cfg->split = v;
    return 1;
}

/* --trace-steps A:B (or A: for to the end): steps from 1, A <= B. */
static int parse_trace_steps(FILE *err, const char *s, td_train_config *cfg) {
    char *end;
    const char *rest;
    long long first, last = 0;
    errno = 0;
    first = strtoll(s, &end, 10);
    rest = end + 1;
    if (end != s && *end == ':' && !errno && first >= 1) {
        if (*rest)
            last = strtoll(rest, &end, 10);
        if (!*rest || (end != rest && !*end && !errno && last >= first)) {
            cfg->trace_first = first;
            cfg->trace_last = last;
            return 1;
        }
    }
    fprintf(err,
            "tandem train: --trace-steps wants FIRST:LAST or FIRST: (steps from 1, FIRST <= "
            "LAST), not '%s'\n",
            s);
    return 0;
}

/* One option; 0 after printing why it is wrong. */
static int parse_option(FILE *err, int c, const char *arg, td_cli_train_args *a) {
    td_train_config *cfg = &a->cfg;
    switch (c) {
    case OPT_MODEL: cfg->model_path = arg; return 1;
    case OPT_DATA: cfg->data_path = arg; return 1;
    case OPT_TEST_DATA: cfg->test_data_path = arg; return 1;
    case OPT_SPLIT: return parse_split(err, arg, cfg);
    case OPT_LABEL_COLUMN: cfg->label_column = arg; return 1;
    case OPT_DEVICES: cfg->devices = arg; return 1;
    case OPT_CHECKPOINT: cfg->checkpoint = arg; return 1;
    case OPT_RESUME: cfg->resume = arg; return 1;
    case OPT_REPLAN: cfg->replan = 1; return 1;
    case OPT_METRICS: cfg->metrics = arg; return 1;
    case OPT_TRACE: cfg->trace_path = arg; return 1;
    case OPT_TRACE_STEPS: return parse_trace_steps(err, arg, cfg);
    case OPT_NESTEROV:
        cfg->opt.nesterov = 1;
        cfg->given |= TD_GIVEN_NESTEROV;
        return 1;
    case OPT_DETERMINISTIC: return add_strategy_option(a, "deterministic", "1");
    case OPT_ZERO: return add_strategy_option(a, "zero", "1");
    case OPT_STRATEGY_OPTION: return add_strategy_item(err, a, arg);
    case OPT_NO_EPOCH_EVAL: cfg->eval_each_epoch = 0; return 1;
    case OPT_SUMMARY: a->summary = 1; return 1;
    case OPT_QUIET: a->quiet = 1; return 1;
    case OPT_MONITOR: a->monitor = 1; return 1;
    case 'h':
    case OPT_HELP: a->help = 1; return 1;
    case OPT_LR:
    case OPT_MOMENTUM:
    case OPT_WD:
    case OPT_MIN_LR:
    case OPT_CLIP:
    case OPT_MAX_SECONDS: return parse_real(err, c, arg, a);
    case OPT_OPTIMIZER:
    case OPT_SCHEDULE:
    case OPT_PRECISION:
    case OPT_OVERLAP:
    case OPT_EXTEND:
    case OPT_STRATEGY: return parse_choice(err, c, arg, a);
    case OPT_EPOCHS:
    case OPT_STEPS:
    case OPT_BATCH:
    case OPT_WARMUP:
    case OPT_BUCKET_BYTES:
    case OPT_MICRO_BATCHES:
    case OPT_SEED:
    case OPT_CHECKPOINT_EVERY:
    case OPT_EVAL_SAMPLES:
    case OPT_EVAL_EVERY: return parse_count(err, c, arg, a);
    default: return 0; /* getopt_long gives only the table's values, ':' and '?' */
    }
}

/* What the options say together. */
static int check_together(FILE *err, td_cli_train_args *a) {
    td_train_config *cfg = &a->cfg;
    if (!cfg->model_path && !cfg->resume) {
        fprintf(err, "tandem train: --model is required (or --resume)\n");
        return 0;
    }
    if (!cfg->data_path) {
        fprintf(err, "tandem train: --data is required\n");
        return 0;
    }
    if (cfg->test_data_path && cfg->split > 0) {
        fprintf(err, "tandem train: --split and --test-data both say what to evaluate on; give "
                     "one\n");
        return 0;
    }
    if ((cfg->trace_first || cfg->trace_last) && !cfg->trace_path) {
        fprintf(err, "tandem train: --trace-steps says which steps --trace records; there is no "
                     "--trace\n");
        return 0;
    }
    if (a->monitor && a->quiet) {
        fprintf(err, "tandem train: --monitor shows the devices while --quiet shows nothing; "
                     "give one\n");
        return 0;
    }
    if (a->extend_given && !cfg->resume) {
        fprintf(err, "tandem train: --extend says how --resume goes on; there is no --resume\n");
        return 0;
    }
    if (cfg->steps > 0 && !a->epochs_given)
        cfg->epochs = 0; /* steps alone decide */
    if (!(cfg->given & TD_GIVEN_LR) && cfg->opt.kind == TD_OPT_ADAMW)
        cfg->opt.lr = 1e-3;
    return 1;
}

int td_cli_train_parse(int argc, char **argv, FILE *err, td_cli_train_args *out) {
    td_train_config init = TD_TRAIN_CONFIG_INIT;
    int c, at;
    memset(out, 0, sizeof *out);
    out->cfg = init;
    opterr = 0;
    optind = 0; /* 0, not 1: glibc then forgets a previous call's state */
    while ((at = -1, c = getopt_long(argc, argv, ":h", options, &at)) != -1) {
        if (c == ':') {
            fprintf(err, "tandem train: %s needs a value\n", argv[optind - 1]);
            return 2;
        }
        if (c == '?') {
            fprintf(err, "tandem train: unknown option '%s' (see tandem train --help)\n",
                    argv[optind - 1]);
            return 2;
        }
        if (optarg && !*optarg && at >= 0) {
            fprintf(err, "tandem train: --%s is empty\n", options[at].name);
            return 2;
        }
        if (!parse_option(err, c, optarg, out))
            return 2;
        if (out->help)
            return 0;
    }
    if (optind < argc) {
        fprintf(err, "tandem train: unexpected argument '%s' (see tandem train --help)\n",
                argv[optind]);
        return 2;
    }
    return check_together(err, out) ? 0 : 2;
}
