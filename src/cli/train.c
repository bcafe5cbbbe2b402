/* tandem train: trains a model described in JSON on a data set. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "tandem/tandem.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: tandem train --model M.json --data D [options]\n"
            "       tandem train --resume CKPT --data D [options]\n\n"
            "Trains the model M on D: an MNIST folder of IDX files (data/mnist) for image\n"
            "models, a text file (data/text/tinyshakespeare.txt) for token models. Prints\n"
            "per-epoch loss, accuracy and throughput, then the test accuracy.\n\n"
            "  --model FILE        model JSON (examples/mnist_mlp.json, ...)\n"
            "  --data PATH         MNIST folder or text file\n"
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
            "  --precision P       f32 (default) or f64\n"
            "  --devices SPEC      devices (default cpu): 'cpu*2', 'cpu:0,cpu:1{slowdown=3}'\n"
            "  --strategy S        single (default: the first device trains), data (a\n"
            "                      replica on every device, batches split by measured speed,\n"
            "                      gradients all-reduced; under mpirun, across processes) or\n"
            "                      pipeline (the layers cut into stages, one per device,\n"
            "                      micro-batches flowing through them)\n"
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
            "  --resume PATH       continue the run saved in PATH (model, optimizer, data order)\n"
            "  --metrics FILE      write JSON lines: one per step, epoch and the end\n"
            "  --max-seconds X     stop after X seconds of training\n"
            "  --eval-samples N    evaluate on the first N test samples only\n"
            "  --eval-every N      also evaluate every N steps (a line and a metrics record)\n"
            "  --no-epoch-eval     evaluate at the end only\n"
            "  --summary           print a last line 'summary: {json}' for scripts\n"
            "  --quiet             no progress output\n"
            "  --help              show this help\n");
}

enum {
    OPT_MODEL = 256,
    OPT_DATA,
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
    OPT_RESUME,
    OPT_METRICS,
    OPT_MAX_SECONDS,
    OPT_EVAL_SAMPLES,
    OPT_EVAL_EVERY,
    OPT_NO_EPOCH_EVAL,
    OPT_SUMMARY,
    OPT_QUIET,
    OPT_HELP,
};

static int known_strategy(const char *name) {
    for (const char *const *n = td_strategy_names(); *n; n++)
        if (!strcmp(*n, name))
            return 1;
    return 0;
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

/* The table of the members of a run over several devices: each one's share
 * and where its time went. Under pipeline its share is of the layers' cost,
 * its communication is the transfer of activations and their gradients,
 * and its wait is the pipeline's idle time. */
static void print_members(const td_train_summary *s) {
    int pipeline = !strcmp(s->strategy, "pipeline");
    if (pipeline || !strcmp(s->strategy, "tensor"))
        printf("\n%s", s->plan);
    printf("\n%-14s %9s %7s %11s %10s %10s %10s %8s\n", "device", "samples", "share", "compute s",
           pipeline ? "transfer s" : "comm s", "update s", pipeline ? "idle s" : "wait s",
           "parked");
    for (int r = 0; r < s->members && r < TD_DP_MAX_MEMBERS; r++)
        printf("%-14s %9lld %6.1f%% %11.3f %10.3f %10.3f %10.3f %8lld\n", s->member[r].name,
               (long long)s->member[r].samples, 100 * s->member[r].share, s->member[r].compute_s,
               s->member[r].comm_s, s->member[r].update_s, s->member[r].wait_s,
               (long long)s->member[r].parked_steps);
    for (int r = 0; r < s->members && r < TD_DP_MAX_MEMBERS; r++)
        if (s->member[r].parked_steps) {
            printf("parked: steps a device took no samples, its fixed cost per pass exceeding "
                   "the step the others took\n");
            break;
        }
    for (int r = 0; r < s->members && r < TD_DP_MAX_MEMBERS; r++)
        if (s->member[r].back_to_step)
            printf("lost: %s in step %lld; the other devices went back to the checkpoint of "
                   "step %lld and trained on\n",
                   s->member[r].name, (long long)s->member[r].lost_at_step,
                   (long long)s->member[r].back_to_step);
        else if (s->member[r].lost_at_step)
            printf("lost: %s in step %lld; the other devices trained on\n", s->member[r].name,
                   (long long)s->member[r].lost_at_step);
    if (pipeline)
        printf("pipeline: share: of the layers' cost; transfer: activations and their "
               "gradients copied in; idle: the bubble and waiting for the neighbours\n\n");
    else if (!strcmp(s->strategy, "tensor"))
        printf("tensor: every device takes every sample (the plan at the start says which heads "
               "and hidden features each holds); comm: the all-reduces of partial results and "
               "input gradients, waiting for the others included\n\n");
    else
        printf("gradient reduction: %d bucket%s, %d started during backward, %.0f%% of its time "
               "hidden behind backward; step time %.2fx the ideal\n\n",
               s->buckets, s->buckets == 1 ? "" : "s", s->buckets_in_backward, 100 * s->hidden,
               s->ideal_ratio);
}

static const struct option options[] = {
    {"model", required_argument, NULL, OPT_MODEL},
    {"data", required_argument, NULL, OPT_DATA},
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
    {"micro-batches", required_argument, NULL, OPT_MICRO_BATCHES},
    {"seed", required_argument, NULL, OPT_SEED},
    {"checkpoint", required_argument, NULL, OPT_CHECKPOINT},
    {"checkpoint-every", required_argument, NULL, OPT_CHECKPOINT_EVERY},
    {"resume", required_argument, NULL, OPT_RESUME},
    {"metrics", required_argument, NULL, OPT_METRICS},
    {"max-seconds", required_argument, NULL, OPT_MAX_SECONDS},
    {"eval-samples", required_argument, NULL, OPT_EVAL_SAMPLES},
    {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
    {"no-epoch-eval", no_argument, NULL, OPT_NO_EPOCH_EVAL},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

static int parse_int(const char *cmd, const char *flag, const char *s, long long lo,
                     long long *out) {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo) {
        fprintf(stderr, "tandem %s: --%s wants an integer >= %lld, not '%s'\n", cmd, flag, lo, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_double(const char *cmd, const char *flag, const char *s, double lo, double *out) {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < lo) {
        fprintf(stderr, "tandem %s: --%s wants a number >= %g, not '%s'\n", cmd, flag, lo, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* Ctrl-C asks the run to stop after the current step, evaluate and save its
 * checkpoint; a second one ends the process at once. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    interrupted = 1;
    signal(sig, SIG_DFL);
}

/* What the progress display knows. */
typedef struct progress {
    int tty, quiet;
    uint64_t last_draw;
    int64_t epochs;
} progress;

static void draw_bar(progress *p, const td_train_event *ev) {
    char bar[31];
    int64_t total = ev->batches_per_epoch > 0 ? ev->batches_per_epoch : 1;
    int filled = (int)(30 * ev->batch_in_epoch / total);
    for (int i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[30] = '\0';
    char of[32] = "";
    if (p->epochs > 0)
        snprintf(of, sizeof of, "/%lld", (long long)p->epochs);
    fprintf(stderr, "\r\033[Kepoch %lld%s [%s] %lld/%lld  loss %.4f  %.0f samples/s",
            (long long)ev->epoch + 1, of, bar, (long long)ev->batch_in_epoch, (long long)total,
            ev->loss, ev->samples_per_s);
    fflush(stderr);
}

static int on_event(void *arg, const td_train_event *ev) {
    progress *p = arg;
    if (interrupted == 1) {
        interrupted = 2;
        fprintf(stderr, "%sinterrupted: stopping after this step (Ctrl-C again to quit now)\n",
                p->tty ? "\r\033[K" : "");
        return 1;
    }
    if (p->quiet)
        return 0;
    if (ev->kind == TD_TRAIN_EVENT_STEP) {
        uint64_t now = td_clock_ns();
        if (p->tty && now - p->last_draw > 100000000ull) {
            draw_bar(p, ev);
            p->last_draw = now;
        } else if (!p->tty && ev->batches_per_epoch >= 10 &&
                   ev->batch_in_epoch %
                           (ev->batches_per_epoch / 10 > 500 ? 500 : ev->batches_per_epoch / 10) ==
                       0) {
            printf("  step %lld  epoch %lld  %lld/%lld  loss %.4f  lr %.3g  %.0f samples/s\n",
                   (long long)ev->step, (long long)ev->epoch + 1, (long long)ev->batch_in_epoch,
                   (long long)ev->batches_per_epoch, ev->loss, ev->lr, ev->samples_per_s);
            fflush(stdout);
        }
        return 0;
    }
    if (p->tty)
        fprintf(stderr, "\r\033[K");
    if (ev->kind == TD_TRAIN_EVENT_EVAL) {
        printf("step %lld: test loss %.4f  accuracy %.2f%%  (%.1f s)\n", (long long)ev->step,
               ev->eval_loss, 100 * ev->eval_accuracy, ev->elapsed_s);
        fflush(stdout);
    }
    if (ev->kind == TD_TRAIN_EVENT_EPOCH) {
        printf("epoch %lld: train loss %.4f  accuracy %.2f%%  %.0f samples/s",
               (long long)ev->epoch + 1, ev->loss, 100 * ev->accuracy, ev->samples_per_s);
        if (!isnan(ev->eval_loss))
            printf("  |  test loss %.4f  accuracy %.2f%%", ev->eval_loss, 100 * ev->eval_accuracy);
        printf("  (%.1f s)\n", ev->elapsed_s);
        fflush(stdout);
    }
    return 0;
}

int td_cli_train(int argc, char **argv) {
    td_train_config cfg = TD_TRAIN_CONFIG_INIT;
    td_train_summary sum;
    progress prog = {0};
    long long iv;
    double dv;
    int c, summary = 0, lr_given = 0, epochs_given = 0;
    td_status st;
    opterr = 0;
    optind = 1;
    cfg.devices = "cpu";
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case OPT_MODEL: cfg.model_path = optarg; break;
        case OPT_DATA: cfg.data_path = optarg; break;
        case OPT_EPOCHS:
            if (!parse_int("train", "epochs", optarg, 1, &iv))
                return 2;
            cfg.epochs = iv;
            epochs_given = 1;
            break;
        case OPT_STEPS:
            if (!parse_int("train", "steps", optarg, 1, &iv))
                return 2;
            cfg.steps = iv;
            break;
        case OPT_BATCH:
            if (!parse_int("train", "batch", optarg, 1, &iv))
                return 2;
            cfg.batch = iv;
            break;
        case OPT_OPTIMIZER:
            if (!strcmp(optarg, "sgd"))
                cfg.opt.kind = TD_OPT_SGD;
            else if (!strcmp(optarg, "adamw"))
                cfg.opt.kind = TD_OPT_ADAMW;
            else {
                fprintf(stderr, "tandem train: --optimizer is sgd or adamw, not '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_LR:
            if (!parse_double("train", "lr", optarg, 0, &dv))
                return 2;
            cfg.opt.lr = dv;
            lr_given = 1;
            break;
        case OPT_MOMENTUM:
            if (!parse_double("train", "momentum", optarg, 0, &dv))
                return 2;
            cfg.opt.momentum = dv;
            break;
        case OPT_NESTEROV: cfg.opt.nesterov = 1; break;
        case OPT_WD:
            if (!parse_double("train", "weight-decay", optarg, 0, &dv))
                return 2;
            cfg.opt.weight_decay = dv;
            break;
        case OPT_SCHEDULE:
            if (!strcmp(optarg, "constant"))
                cfg.opt.schedule = TD_LR_CONSTANT;
            else if (!strcmp(optarg, "cosine"))
                cfg.opt.schedule = TD_LR_COSINE;
            else {
                fprintf(stderr, "tandem train: --schedule is constant or cosine, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case OPT_WARMUP:
            if (!parse_int("train", "warmup", optarg, 0, &iv))
                return 2;
            cfg.opt.warmup_steps = iv;
            break;
        case OPT_MIN_LR:
            if (!parse_double("train", "min-lr", optarg, 0, &dv))
                return 2;
            cfg.opt.min_lr = dv;
            break;
        case OPT_CLIP:
            if (!parse_double("train", "clip", optarg, 0, &dv))
                return 2;
            cfg.opt.clip_norm = dv;
            break;
        case OPT_PRECISION:
            if (!strcmp(optarg, "f32"))
                cfg.dtype = TD_F32;
            else if (!strcmp(optarg, "f64"))
                cfg.dtype = TD_F64;
            else {
                fprintf(stderr, "tandem train: --precision is f32 or f64, not '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_DEVICES: cfg.devices = optarg; break;
        case OPT_STRATEGY:
            if (!known_strategy(optarg)) {
                char list[128];
                fprintf(stderr, "tandem train: --strategy is %s, not '%s'\n",
                        strategy_list(list, sizeof list), optarg);
                return 2;
            }
            cfg.strategy = optarg;
            break;
        case OPT_DETERMINISTIC: cfg.deterministic = 1; break;
        case OPT_ZERO: cfg.zero = 1; break;
        case OPT_BUCKET_BYTES:
            if (!parse_int("train", "bucket-bytes", optarg, 64, &iv))
                return 2;
            cfg.bucket_bytes = (size_t)iv;
            break;
        case OPT_OVERLAP:
            if (!strcmp(optarg, "auto"))
                cfg.overlap = -1;
            else if (!strcmp(optarg, "on") || !strcmp(optarg, "off"))
                cfg.overlap = !strcmp(optarg, "on");
            else {
                fprintf(stderr, "tandem train: --overlap is auto, on or off, not '%s'\n", optarg);
                return 2;
            }
            break;
        case OPT_MICRO_BATCHES:
            if (!parse_int("train", "micro-batches", optarg, 1, &iv))
                return 2;
            cfg.micro_batches = iv;
            break;
        case OPT_SEED:
            if (!parse_int("train", "seed", optarg, 0, &iv))
                return 2;
            cfg.seed = (uint64_t)iv;
            break;
        case OPT_CHECKPOINT: cfg.checkpoint = optarg; break;
        case OPT_CHECKPOINT_EVERY:
            if (!parse_int("train", "checkpoint-every", optarg, 1, &iv))
                return 2;
            cfg.checkpoint_every = iv;
            break;
        case OPT_RESUME: cfg.resume = optarg; break;
        case OPT_METRICS: cfg.metrics = optarg; break;
        case OPT_MAX_SECONDS:
            if (!parse_double("train", "max-seconds", optarg, 0, &dv))
                return 2;
            cfg.max_seconds = dv;
            break;
        case OPT_EVAL_SAMPLES:
            if (!parse_int("train", "eval-samples", optarg, 1, &iv))
                return 2;
            cfg.eval_samples = iv;
            break;
        case OPT_EVAL_EVERY:
            if (!parse_int("train", "eval-every", optarg, 1, &iv))
                return 2;
            cfg.eval_every = iv;
            break;
        case OPT_NO_EPOCH_EVAL: cfg.eval_each_epoch = 0; break;
        case OPT_SUMMARY: summary = 1; break;
        case OPT_QUIET: prog.quiet = 1; break;
        case 'h':
        case OPT_HELP: usage(stdout); return 0;
        case ':': fprintf(stderr, "tandem train: %s needs a value\n", argv[optind - 1]); return 2;
        default:
            fprintf(stderr, "tandem train: unknown option '%s' (see tandem train --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tandem train: unexpected argument '%s' (see tandem train --help)\n",
                argv[optind]);
        return 2;
    }
    if (!cfg.model_path && !cfg.resume) {
        fprintf(stderr, "tandem train: --model is required (or --resume)\n");
        return 2;
    }
    if (!cfg.data_path) {
        fprintf(stderr, "tandem train: --data is required\n");
        return 2;
    }
    if (cfg.steps > 0 && !epochs_given)
        cfg.epochs = 0; /* steps alone decide */
    if (!lr_given && cfg.opt.kind == TD_OPT_ADAMW)
        cfg.opt.lr = 1e-3;
    prog.tty = isatty(STDERR_FILENO);
    prog.epochs = cfg.epochs;
    cfg.callback = on_event;
    cfg.callback_arg = &prog;
    signal(SIGINT, on_sigint);
    if ((st = td_train_run(&cfg, &sum)) != TD_OK)
        return td_cli_fail("train", st);
    if (!sum.root)
        return 0; /* under mpirun, rank 0's process reports */
    printf("final test accuracy: %.2f%% (%lld samples, loss %.4f)  %lld steps, %.0f samples/s, "
           "%.1f s training\n",
           100 * sum.test_accuracy, (long long)sum.test_samples, sum.test_loss,
           (long long)sum.steps, sum.samples_per_s, sum.train_seconds);
    if (sum.members > 1)
        print_members(&sum);
    else if (sum.devices_named > 1)
        printf("trained on %s, the first of the %d devices --devices named (--strategy data "
               "or pipeline trains on all)\n",
               sum.device, sum.devices_named);
    if (cfg.checkpoint)
        printf("checkpoint: %s\n", cfg.checkpoint);
    if (summary)
        printf("summary: {\"steps\":%lld,\"epochs\":%lld,\"samples\":%lld,\"train_seconds\":%.4f,"
               "\"samples_per_s\":%.2f,\"final_loss\":%.6g,\"test_loss\":%.6g,"
               "\"test_accuracy\":%.6g,\"test_samples\":%lld,\"stopped\":%s}\n",
               (long long)sum.steps, (long long)sum.epochs_done, (long long)sum.samples,
               sum.train_seconds, sum.samples_per_s, isnan(sum.final_loss) ? -1 : sum.final_loss,
               isnan(sum.test_loss) ? -1 : sum.test_loss,
               isnan(sum.test_accuracy) ? -1 : sum.test_accuracy, (long long)sum.test_samples,
               sum.stopped ? "true" : "false");
    return 0;
}
