/* Setting a training run up and taking it down: the settings checked
 * against each other, the checkpoint resumed from and the data; the model
 * read; the devices, the group and the strategy made; the metrics file
 * opened (cut back to the resumed step). trainer.c runs the loop between. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "train/train-impl.h"

/* Opens the data the model reads (td_data_open: the format by the path). */
static td_status open_data(td__trainer *t, const td_model_info *mi) {
    const td_train_config *c = t->cfg;
    td_data_options o = {
        .test_path = c->test_data_path, .split = c->split, .label_column = c->label_column};
    if (!c->data_path)
        return td__error_setting(TD_ERR_INVALID_ARG, "data_path", "no data given (`data_path`)");
    TD_CHECK(td_data_open(c->data_path, &o, mi, &t->train, &t->test));
    td_dataset_get_info(t->train, &t->info);
    return TD_OK;
}

static void vocab_to_state(td__trainer *t) {
    size_t n;
    const uint8_t *v = td_dataset_vocab(t->train, &n);
    t->state.vocab_len = v ? (int)n : 0;
    if (v)
        memcpy(t->state.vocab, v, n);
}

/* A strategy that does not train, or options it does not have, are
 * mistakes found before anything is loaded. */
static td_status check_strategy_options(const td_train_config *c) {
    td_strategy_about about;
    TD_CHECK(td_strategy_about_get(c->strategy, &about));
    if (!about.trains)
        return td__error_setting(TD_ERR_INVALID_ARG, "strategy", "%s does not train: %s",
                                 about.name, about.summary);
    return td_strategy_check_options(about.name, c->strategy_options);
}

/* The strategy's configuration from the run's. */
static void strategy_config(td__trainer *t, td_dtype dtype) {
    const td_train_config *c = t->cfg;
    td_strategy_config sc = TD_STRATEGY_CONFIG_INIT;
    sc.name = c->strategy;
    sc.dtype = dtype;
    sc.seed = t->state.seed;
    sc.opt = t->state.opt;
    sc.batch = t->state.batch;
    sc.options = c->strategy_options;
    sc.replan = c->replan;
    t->scfg = sc;
}

/* The model's JSON (NUL-terminated) from its file. */
static td_status read_model(const char *path, char **out) {
    uint8_t *bytes = NULL;
    size_t len = 0;
    char *text;
    TD_CHECK(td__read_file(path, 64u << 20, &bytes, &len));
    if (!(text = realloc(bytes, len + 1))) {
        free(bytes);
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the model's JSON", path);
    }
    text[len] = '\0';
    *out = text;
    return TD_OK;
}

/* model_path given with resume: it must describe the checkpoint's model. */
static td_status check_model(td__trainer *t) {
    const td_train_config *c = t->cfg;
    td_model_info mi;
    char *text = NULL;
    json_t *given = NULL, *held = NULL;
    td_status st = TD_OK;
    TD_CHECK(read_model(c->model_path, &text));
    if ((st = td_model_describe(text, c->model_path, &mi, NULL, 0)) != TD_OK)
        goto done;
    given = json_loads(text, 0, NULL);
    held = json_loads(t->json, 0, NULL);
    if (!given || !held || !json_equal(given, held)) {
        const char *name = held ? json_string_value(json_object_get(held, "name")) : NULL;
        st = BAD_SETTING(t, "model_path",
                         "%s is not the model the checkpoint %s holds (\"%s\") (`model_path`): "
                         "leave `model_path` unset to resume it",
                         c->model_path, c->resume, name ? name : "unnamed");
    }
done:
    json_decref(given);
    json_decref(held);
    free(text);
    return st;
}

static const char *opt_name(td_optimizer_kind k) {
    return k == TD_OPT_ADAMW ? "adamw" : "sgd";
}

/* Settings chosen for a resumed run (td_train_config.given) that the
 * checkpoint fixes: they must be its own. */
static td_status check_given(td__trainer *t, td_dtype dtype) {
    const td_train_config *c = t->cfg;
    const td_optimizer_config *want = &c->opt, *o = &t->state.opt;
    unsigned g = c->given;
    if (c->model_path)
        TD_CHECK(check_model(t));
    if ((g & TD_GIVEN_BATCH) && c->batch != t->state.batch)
        return BAD_SETTING(t, "batch",
                           "%s was trained with batch %lld, not %lld (`batch`): leave `batch` "
                           "unset to resume",
                           c->resume, (long long)t->state.batch, (long long)c->batch);
    if ((g & TD_GIVEN_SEED) && c->seed != t->state.seed)
        return BAD_SETTING(t, "seed",
                           "%s was trained with seed %llu, not %llu (`seed`): leave `seed` unset "
                           "to resume",
                           c->resume, (unsigned long long)t->state.seed,
                           (unsigned long long)c->seed);
    if ((g & TD_GIVEN_DTYPE) && c->dtype != dtype)
        return BAD_SETTING(t, "dtype",
                           "%s holds %s weights, not %s (`dtype`): leave `dtype` unset to "
                           "resume",
                           c->resume, dtype == TD_F64 ? "f64" : "f32",
                           c->dtype == TD_F64 ? "f64" : "f32");
    if ((g & TD_GIVEN_OPTIMIZER) && want->kind != o->kind)
        return BAD_SETTING(t, "opt.kind",
                           "%s holds the state of %s, not %s (`opt.kind`): leave `opt.kind` "
                           "unset to resume",
                           c->resume, opt_name(o->kind), opt_name(want->kind));
    if ((g & TD_GIVEN_WARMUP) && want->warmup_steps != o->warmup_steps)
        return BAD_SETTING(t, "opt.warmup_steps",
                           "%s has a warm-up of %lld steps, not %lld (`opt.warmup_steps`): it "
                           "counts from the run's first step, so leave `opt.warmup_steps` unset "
                           "to resume",
                           c->resume, (long long)o->warmup_steps, (long long)want->warmup_steps);
    return TD_OK;
}

/* The optimizer's other settings chosen for a resumed run: they apply from
 * the resumed step on. */
static void apply_given(td__trainer *t) {
    const td_optimizer_config *want = &t->cfg->opt;
    td_optimizer_config *o = &t->state.opt;
    unsigned g = t->cfg->given;
    if (g & TD_GIVEN_LR)
        o->lr = want->lr;
    if (g & TD_GIVEN_MOMENTUM)
        o->momentum = want->momentum;
    if (g & TD_GIVEN_NESTEROV)
        o->nesterov = want->nesterov;
    if (g & TD_GIVEN_WEIGHT_DECAY)
        o->weight_decay = want->weight_decay;
    if (g & TD_GIVEN_CLIP)
        o->clip_norm = want->clip_norm;
    if (g & TD_GIVEN_SCHEDULE)
        o->schedule = want->schedule;
    if (g & TD_GIVEN_MIN_LR)
        o->min_lr = want->min_lr;
}

/* The model's description and the run's state: from the checkpoint when
 * resuming, else from the model file and the configuration. */
static td_status read_run(td__trainer *t, td_dtype *dtype) {
    const td_train_config *c = t->cfg;
    if (c->resume) {
        TD_CHECK(td_checkpoint_read_meta(c->resume, &t->json, dtype, &t->state));
        t->saved = c->resume;
        t->model_name = c->resume;
        TD_CHECK(check_given(t, *dtype));
        apply_given(t);
        return TD_OK;
    }
    if (!c->model_path)
        return td__error_setting(TD_ERR_INVALID_ARG, "model_path", "no model given (`model_path`)");
    TD_CHECK(read_model(c->model_path, &t->json));
    t->model_name = c->model_path;
    *dtype = c->dtype;
    t->state.seed = c->seed;
    t->state.batch = c->batch;
    t->state.opt = c->opt;
    return TD_OK;
}

/* Mixed precision on every device that has bf16 products, before the
 * strategy builds anything on them; the others compute in f32, and the run
 * says so once (a warning per such device, and the summary's words). */
static td_status set_precision(td__trainer *t, td_dtype dtype) {
    const td_train_config *c = t->cfg;
    char *out = t->summary->precision;
    size_t cap = sizeof t->summary->precision, used = 0;
    if (c->precision == TD_PRECISION_F32)
        return TD_OK;
    if (c->precision != TD_PRECISION_BF16)
        return BAD_SETTING(t, "precision", "unknown precision %d (`precision`: f32 or bf16)",
                           (int)c->precision);
    if (dtype == TD_F64 && c->resume)
        return BAD_SETTING(t, "precision",
                           "%s holds f64 weights; bf16 mixed precision (`precision`) keeps f32 "
                           "master weights: resume it in f64",
                           c->resume);
    if (dtype == TD_F64)
        return BAD_SETTING(t, "precision",
                           "bf16 mixed precision (`precision`) keeps f32 master weights; it "
                           "cannot train f64 ones (`dtype`)");
    for (size_t i = 0; i < td_device_list_count(t->devs); i++) {
        td_device *d = td_device_list_get(t->devs, i);
        int ok = td_device_set_precision(d, TD_PRECISION_BF16) == TD_OK;
        if (!ok)
            TD_LOG_WARN("%s: its backend has no bf16 matrix products; it computes in f32",
                        td_device_name(d));
        if (used < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s%s %s", used ? "; " : "",
                                     td_device_name(d), ok ? "bf16 (" : "f32 (no bf16 products)");
        if (ok && used < cap)
            used += (size_t)snprintf(out + used, cap - used, "%s)", td_device_bf16_path(d));
    }
    return TD_OK;
}

/* A group over every device (every process's, under mpirun) and the
 * strategy on it, resumed from the checkpoint when there is one. */
static td_status make_strategy(td__trainer *t, td_dtype dtype) {
    td_group_config gcfg = TD_GROUP_CONFIG_INIT;
    int processes;
    td_comm_launch(NULL, &processes);
    if (processes > 1)
        gcfg.transport = TD_TRANSPORT_MPI;
    TD_CHECK(td_group_create(t->devs, &gcfg, &t->group));
    strategy_config(t, dtype);
    TD_CHECK(td_strategy_create(t->group, t->json, t->model_name, &t->scfg, &t->s));
    if (t->cfg->resume)
        TD_CHECK(td_strategy_load(t->s, t->cfg->resume, NULL));
    t->root = td_group_device(t->group, 0) != NULL;
    return td__train_calibrate(t);
}

/* path with its folder resolved, so that two spellings of one file, made
 * yet or not, compare equal. */
static void resolve_path(const char *path, char *out, size_t n) {
    char dir[4096], base[4096], real[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(base, sizeof base, "%s", path);
    if (realpath(dirname(dir), real))
        snprintf(out, n, "%s/%s", real, basename(base));
    else
        snprintf(out, n, "%s", path);
}

static int same_file(const char *a, const char *b) {
    char ra[8192], rb[8192];
    resolve_path(a, ra, sizeof ra);
    resolve_path(b, rb, sizeof rb);
    return !strcmp(ra, rb);
}

td_status td__train_check_output(const char *path, const char *setting, const char *what,
                                 int replaced) {
    char buf[4096];
    const char *dir;
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (!S_ISREG(sb.st_mode))
            return td__error_setting(TD_ERR_IO, setting,
                                     "%s: not a regular file, so %s cannot replace it (`%s`)", path,
                                     what, setting);
        if (!replaced && access(path, W_OK) != 0)
            return td__error_setting(TD_ERR_IO, setting, "%s: cannot write %s there: %s (`%s`)",
                                     path, what, strerror(errno), setting);
        return TD_OK;
    }
    snprintf(buf, sizeof buf, "%s", path);
    dir = dirname(buf);
    /* access() alone passes a regular file as the folder ("data.csv/m.jsonl"),
     * and the output would then fail only when it is created. */
    if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return td__error_setting(TD_ERR_IO, setting,
                                 "%s: cannot write %s there: %s is not a folder (`%s`)", path, what,
                                 dir, setting);
    if (stat(dir, &sb) != 0 || access(dir, W_OK | X_OK) != 0)
        return td__error_setting(TD_ERR_IO, setting, "%s: cannot write %s there: %s (`%s`)", path,
                                 what, strerror(errno), setting);
    return TD_OK;
}

/* The files the run writes: found wrong now, not at the first save, and
 * all of them before any is created (open_metrics, td__train_trace_begin),
 * so that a bad one leaves no empty other behind. Two settings naming one
 * file would lose one output, or overwrite an input, without a word. */
static td_status check_outputs(td__trainer *t) {
    const td_train_config *c = t->cfg;
    /* Each output against every file named after it; the checkpoint may be
     * the one resumed from, since it goes on being saved there. */
    const struct {
        const char *setting, *path;
    } files[] = {
        {"metrics", c->metrics},
        {"trace_path", c->trace_path},
        {"checkpoint", c->checkpoint},
        {"resume", c->resume},
        {"model_path", c->model_path},
        {"data_path", c->data_path},
        {"test_data_path", c->test_data_path},
    };
    const size_t outputs = 3, n = sizeof files / sizeof *files;
    int rank;
    for (size_t i = 0; i < outputs; i++)
        for (size_t j = i + 1; j < n; j++)
            if (files[i].path && files[j].path && !(i == 2 && j == 3) &&
                same_file(files[i].path, files[j].path))
                return BAD_SETTING(t, files[i].setting, "`%s` and `%s` both name %s",
                                   files[i].setting, files[j].setting, files[i].path);
    if (c->checkpoint)
        TD_CHECK(td__train_check_output(c->checkpoint, "checkpoint", "a checkpoint", 1));
    /* Under mpirun only the first process writes the metrics, perhaps on
     * another machine (the group that says which is made later). */
    td_comm_launch(&rank, NULL);
    if (c->metrics && rank == 0)
        TD_CHECK(td__train_check_output(c->metrics, "metrics", "the metrics", 0));
    return TD_OK;
}

/* A process killed while saving path leaves its temporary file
 * (path.tmp.XXXXXX, td_safetensors_writer_save) behind for ever. Only this
 * run writes path's, so those there at its start are stale. */
static void remove_stale_temporaries(const char *path) {
    char dir[4096], file[4096], prefix[4096], name[8192];
    const char *folder;
    struct dirent *e;
    DIR *d;
    size_t n;
    snprintf(dir, sizeof dir, "%s", path);
    snprintf(file, sizeof file, "%s", path);
    folder = dirname(dir);
    snprintf(prefix, sizeof prefix, "%s.tmp.", basename(file));
    n = strlen(prefix);
    if (!(d = opendir(folder)))
        return;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, n) && strlen(e->d_name + n) == 6 &&
            snprintf(name, sizeof name, "%s/%s", folder, e->d_name) < (int)sizeof name &&
            unlink(name) == 0)
            TD_LOG_INFO("%s: removed a temporary file a killed run left", name);
    closedir(d);
}

/* A resumed run's metrics go on from the checkpoint's step: the lines after
 * it (a killed run's, the last perhaps torn) are cut off, so that the file
 * holds each step once. */
static td_status cut_metrics(const char *path, int64_t step) {
    FILE *f = fopen(path, "r+");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    off_t keep = 0;
    int bad;
    if (!f)
        return errno == ENOENT ? TD_OK
                               : td__error(TD_ERR_IO, "%s: cannot open the metrics file: %s", path,
                                           strerror(errno));
    while ((n = getline(&line, &cap, f)) > 0) {
        const char *at = strstr(line, "\"step\":");
        if (line[n - 1] != '\n' || !at || strtoll(at + 7, NULL, 10) > step)
            break;
        keep += n;
    }
    free(line);
    bad = ftruncate(fileno(f), keep) != 0;
    fclose(f);
    if (bad)
        return td__error(TD_ERR_IO, "%s: cannot cut the metrics back to step %lld: %s", path,
                         (long long)step, strerror(errno));
    return TD_OK;
}

static td_status open_metrics(td__trainer *t) {
    const td_train_config *c = t->cfg;
    if (c->resume)
        TD_CHECK(cut_metrics(c->metrics, t->state.step));
    if (!(t->metrics = fopen(c->metrics, c->resume ? "a" : "w")))
        return td__error_setting(TD_ERR_IO, "metrics",
                                 "%s: cannot open the metrics file for writing (`metrics`): %s",
                                 c->metrics, strerror(errno));
    /* Larger than any line, so that a line leaves in one write. */
    setvbuf(t->metrics, NULL, _IOFBF, 1 << 16);
    return TD_OK;
}

/* The cosine schedule's length: the run's, which a resumed run may have
 * changed (td_train_extend). */
static void fit_schedule(td__trainer *t) {
    const td_train_config *c = t->cfg;
    td_optimizer_config *o = &t->state.opt;
    int64_t end = c->steps > 0 ? c->steps : c->epochs * td_loader_batches_per_epoch(t->loader);
    if (!c->resume) {
        if (o->total_steps == 0)
            o->total_steps = end;
        return;
    }
    if (o->schedule != TD_LR_COSINE)
        return;
    if (c->extend == TD_EXTEND_RESTART)
        o->warmup_steps = t->state.step;
    o->total_steps = end;
}

td_status td__train_setup(td__trainer *t) {
    const td_train_config *c = t->cfg;
    td_model_info mi;
    td_dtype dtype = TD_F32;
    if (c->batch < 1)
        return BAD_SETTING(t, "batch", "batch size %lld must be at least 1 (`batch`)",
                           (long long)c->batch);
    if (c->epochs < 0 || c->steps < 0 || (c->epochs == 0 && c->steps == 0))
        return BAD_SETTING(t, "epochs",
                           "give a positive number of epochs or steps (`epochs`, `steps`)");
    if (c->devices && !*c->devices)
        return BAD_SETTING(t, "devices",
                           "no devices named (`devices` is empty; leave it unset for cpu)");
    TD_CHECK(check_strategy_options(c));
    TD_CHECK(check_outputs(t));
    TD_CHECK(td__train_trace_check(t));
    TD_CHECK(td_devices_open(c->devices ? c->devices : "cpu", &t->devs));
    TD_CHECK(read_run(t, &dtype));
    TD_CHECK(set_precision(t, dtype));
    TD_CHECK(td_model_describe(t->json, t->model_name, &mi, NULL, 0));
    TD_CHECK(open_data(t, &mi));
    if (t->state.batch > t->info.size)
        return BAD_SETTING(t, "batch",
                           "batch %lld is more than the %lld training samples of %s (`batch`)",
                           (long long)t->state.batch, (long long)t->info.size, c->data_path);
    TD_CHECK(td_loader_create(t->train, t->state.batch, t->state.seed, 1, &t->loader));
    fit_schedule(t);
    if (c->resume) {
        size_t n;
        const uint8_t *v = td_dataset_vocab(t->train, &n);
        if ((int)n != t->state.vocab_len || (n && memcmp(v, t->state.vocab, n) != 0))
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: the text's characters differ from those the checkpoint %s "
                             "was trained on",
                             c->data_path, c->resume);
        TD_CHECK(td_loader_seek(t->loader, t->state.epoch, t->state.sample));
    }
    vocab_to_state(t);
    TD_CHECK(make_strategy(t, dtype));
    if (c->checkpoint && t->root)
        remove_stale_temporaries(c->checkpoint);
    if (c->metrics && t->root)
        TD_CHECK(open_metrics(t));
    TD_CHECK(td__train_trace_begin(t));
    return TD_OK;
}

void td__train_teardown(td__trainer *t) {
    td__train_trace_close(t);
    if (t->metrics)
        fclose(t->metrics);
    td_loader_destroy(t->loader);
    td_strategy_destroy(t->s);
    td_group_destroy(t->group);
    td_dataset_destroy(t->train);
    td_dataset_destroy(t->test);
    td_device_list_destroy(t->devs);
    free(t->json);
}
