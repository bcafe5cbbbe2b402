/* tandem eval: a checkpoint's loss and accuracy on a data set. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

static void usage(FILE *out) {
    fprintf(out, "usage: tandem eval --checkpoint CKPT --data D [options]\n\n"
                 "Loads the model saved in CKPT (by tandem train --checkpoint) and reports its\n"
                 "mean loss and accuracy on D's test set: the MNIST test images for an MNIST\n"
                 "folder, the held-out last 10%% for a text file, the held-out samples (as\n"
                 "tandem train holds them out) for a .csv, .safetensors or X.npy,Y.npy.\n\n"
                 "  --checkpoint PATH  a tandem checkpoint (safetensors)\n"
                 "  --data PATH        IDX folder, text file, .csv, .safetensors or X.npy,Y.npy\n"
                 "  --test-data PATH   the test set is all of PATH (as tandem train's option)\n"
                 "  --holdout F        the fraction of --data held out (tandem train's --split;\n"
                 "                     default 0.1)\n"
                 "  --label-column NAME  the CSV column holding the labels (default label)\n"
                 "  --split NAME       test (default) or train\n"
                 "  --batch B          samples per forward pass (default 1000; 64 for text)\n"
                 "  --samples N        the first N samples only\n"
                 "  --devices SPEC     devices (default cpu)\n"
                 "  --strategy S       single (default: the first device), alternate or data\n"
                 "                     (whole batches round-robin over every device, weighted\n"
                 "                     by speed), pipeline (the layers cut into stages, one\n"
                 "                     per device), tensor (each layer split across the\n"
                 "                     devices) or tiles (each image's conv layers on\n"
                 "                     overlap tiles the devices pull from a queue)\n"
                 "  --strategy-option K=V  one of the strategy's options (tiles: grid=N)\n"
                 "  --weights W        f32, bf16 or q8_0: the weight matrices rounded to W\n"
                 "                     first (default: the checkpoint's; compact ones need no\n"
                 "                     optimizer state)\n"
                 "  --json             print one JSON object\n"
                 "  --help             show this help\n");
}

static const struct option options[] = {
    {"checkpoint", required_argument, NULL, 'c'},
    {"data", required_argument, NULL, 'd'},
    {"test-data", required_argument, NULL, 't'},
    {"holdout", required_argument, NULL, 'o'},
    {"label-column", required_argument, NULL, 'l'},
    {"split", required_argument, NULL, 's'},
    {"batch", required_argument, NULL, 'b'},
    {"samples", required_argument, NULL, 'n'},
    {"devices", required_argument, NULL, 'D'},
    {"strategy", required_argument, NULL, 'S'},
    {"strategy-option", required_argument, NULL, 'O'},
    {"json", no_argument, NULL, 'j'},
    {"weights", required_argument, NULL, 'w'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The checkpoint's model under strategy `name` over every device, its
 * shares (if any) from a calibration on the first training samples. The
 * strategy's optimizer is the checkpoint's (saved), whose state it loads. */
static td_status make_strategy(td_device_list *devs, const char *name, const char *strategy_options,
                               const char *ckpt, const char *json, td_dtype dtype,
                               const td_train_state *saved, int64_t batch, const td_dataset *calib,
                               td_group **group, td_strategy **s) {
    td_strategy_config cfg = TD_STRATEGY_CONFIG_INIT;
    td_loader *l = NULL;
    td_batch b;
    td_status st;
    cfg.name = name;
    cfg.options = strategy_options;
    cfg.dtype = dtype;
    cfg.batch = batch;
    cfg.opt = saved->opt;
    cfg.seed = saved->seed;
    if ((st = td_group_create(devs, NULL, group)) != TD_OK ||
        (st = td_strategy_create(*group, json, ckpt, &cfg, s)) != TD_OK ||
        (st = td_strategy_load(*s, ckpt, NULL)) != TD_OK)
        return st;
    if ((st = td_loader_create(calib, 64, 0, 0, &l)) != TD_OK)
        return st;
    st = td_loader_next(l, &b);
    if (st == TD_OK && b.n > 0)
        st = td_strategy_calibrate(*s, &b);
    td_loader_destroy(l);
    return st;
}

/* An evaluation-only strategy's note on what its devices did ("tiles each
 * device took: ..."), on stdout. */
static void print_note(const td_strategy *s) {
    td_strategy_about about;
    td_strategy_report words;
    td_run_figures none = {0};
    if (td_strategy_about_get(td_strategy_name(s), &about) != TD_OK || about.trains)
        return;
    td_strategy_report_make(s, &none, &words);
    if (words.note[0])
        printf("%s\n", words.note);
}

/* The weights evaluated: --weights, else the checkpoint's. */
static const char *weights_of(const char *ckpt, int weights) {
    td_weights w = TD_WEIGHTS_F32;
    if (weights >= 0)
        return td_weights_name((td_weights)weights);
    return td_checkpoint_read_weights(ckpt, &w) == TD_OK ? td_weights_name(w) : "f32";
}

static int known_strategy(const char *name) {
    td_strategy_about a;
    return td_strategy_about_get(name, &a) == TD_OK;
}

/* --weights: a td_weights into *out; 0 after printing why not. */
static int parse_weights(const char *s, int *out) {
    for (int w = TD_WEIGHTS_F32; w <= TD_WEIGHTS_Q8_0; w++)
        if (!strcmp(s, td_weights_name((td_weights)w)))
            return *out = w, 1;
    fprintf(stderr, "tandem eval: --weights is f32, bf16 or q8_0, not '%s'\n", s);
    return 0;
}

/* --holdout: a fraction strictly between 0 and 1. */
static int parse_fraction(const char *s, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !(v > 0 && v < 1)) {
        fprintf(stderr, "tandem eval: --holdout wants a fraction between 0 and 1, not '%s'\n", s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_count(const char *flag, const char *s, long long *out) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || v < 1) {
        fprintf(stderr, "tandem eval: --%s wants an integer >= 1, not '%s'\n", flag, s);
        return 0;
    }
    *out = v;
    return 1;
}

int td_cli_eval(int argc, char **argv) {
    const char *ckpt = NULL, *data = NULL, *devices = "cpu", *split = "test", *strategy = NULL;
    td_group *group = NULL;
    td_strategy *strat = NULL;
    long long batch = 0, samples = 0;
    int c, json = 0, weights = -1;
    td_device_list *devs = NULL;
    char *model_json = NULL, strategy_options[512] = "";
    td_dtype dtype;
    td_train_state saved;
    td_model_info info;
    td_dataset *train = NULL, *test = NULL;
    td_step_result r;
    td_status st;
    td_data_options dopt = {0};
    uint64_t t0;
    double secs;
    int rc = 1;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case 'c': ckpt = optarg; break;
        case 'd': data = optarg; break;
        case 't': dopt.test_path = optarg; break;
        case 'l': dopt.label_column = optarg; break;
        case 'o':
            if (!parse_fraction(optarg, &dopt.split))
                return 2;
            break;
        case 's': split = optarg; break;
        case 'D': devices = optarg; break;
        case 'S':
            if (!known_strategy(optarg)) {
                char list[128] = "";
                for (const char *const *n = td_strategy_names(); *n; n++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                             list[0] ? ", " : "", *n);
                fprintf(stderr, "tandem eval: --strategy is one of %s, not '%s'\n", list, optarg);
                return 2;
            }
            strategy = optarg;
            break;
        case 'O':
            snprintf(strategy_options + strlen(strategy_options),
                     sizeof strategy_options - strlen(strategy_options), "%s%s",
                     strategy_options[0] ? "," : "", optarg);
            break;
        case 'j': json = 1; break;
        case 'w':
            if (!parse_weights(optarg, &weights))
                return 2;
            break;
        case 'b':
            if (!parse_count("batch", optarg, &batch))
                return 2;
            break;
        case 'n':
            if (!parse_count("samples", optarg, &samples))
                return 2;
            break;
        case 'h': usage(stdout); return 0;
        case ':': fprintf(stderr, "tandem eval: %s needs a value\n", argv[optind - 1]); return 2;
        default:
            fprintf(stderr, "tandem eval: unknown option '%s' (see tandem eval --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tandem eval: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!ckpt || !data) {
        fprintf(stderr, "tandem eval: --checkpoint and --data are required\n");
        return 2;
    }
    if (strcmp(split, "test") != 0 && strcmp(split, "train") != 0) {
        fprintf(stderr, "tandem eval: --split is test or train, not '%s'\n", split);
        return 2;
    }
    td_weights_set_default(weights);
    if ((st = td_checkpoint_read_meta(ckpt, &model_json, &dtype, &saved)) != TD_OK ||
        (st = td_model_describe(model_json, ckpt, &info, NULL, 0)) != TD_OK) {
        rc = td_cli_fail("eval", st);
        goto done;
    }
    st = td_data_open(data, &dopt, &info, &train, &test);
    if (!batch)
        batch = info.kind == TD_INPUT_TOKENS ? 64 : 1000;
    if (st == TD_OK)
        st = td_devices_open(devices, &devs);
    if (st == TD_OK)
        st = make_strategy(devs, strategy, strategy_options, ckpt, model_json, dtype, &saved, batch,
                           train, &group, &strat);
    if (st != TD_OK) {
        rc = td_cli_fail("eval", st);
        goto done;
    }
    t0 = td_clock_ns();
    st = td_evaluate_strategy(strat, !strcmp(split, "train") ? train : test, batch, samples, &r);
    if (st != TD_OK) {
        rc = td_cli_fail("eval", st);
        goto done;
    }
    secs = (double)(td_clock_ns() - t0) * 1e-9;
    if (json)
        printf("{\"checkpoint\":\"%s\",\"split\":\"%s\",\"weights\":\"%s\",\"loss\":%.9g,"
               "\"accuracy\":%.6g,\"labels\":%lld,\"seconds\":%.3f}\n",
               ckpt, split, weights_of(ckpt, weights), r.count ? r.loss_sum / (double)r.count : -1,
               r.count ? (double)r.correct / (double)r.count : -1, (long long)r.count, secs);
    else
        printf(
            "%s on %s (%s, %s weights): loss %.4f  accuracy %.2f%%  (%lld labels, %.2f s)\n", ckpt,
            data, split, weights_of(ckpt, weights), r.count ? r.loss_sum / (double)r.count : NAN,
            r.count ? 100.0 * (double)r.correct / (double)r.count : NAN, (long long)r.count, secs);
    if (!json)
        print_note(strat);
    rc = 0;
done:
    td_strategy_destroy(strat);
    td_group_destroy(group);
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    free(model_json);
    td_device_list_destroy(devs);
    return rc;
}
