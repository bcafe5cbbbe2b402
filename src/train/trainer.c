/* The training loop: data, a strategy over the devices, evaluation,
 * metrics, checkpoints and resume.
 *
 * The run's devices form a group (across processes under mpirun) and a
 * strategy (src/parallel: single, data, pipeline) holds the model on them.
 * One step is: the loader's next host batch -> td_strategy_step(). The loop
 * is the same for every strategy: it evaluates, saves and resumes through
 * the strategy, and a device lost in any of those goes to recovery.c, which
 * carries on over the survivors or goes back to the newest checkpoint. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "train/train-impl.h"

/* A setting that contradicts another, the data or the checkpoint: the
 * caller's mistake (a usage error to the CLI). */
#define BAD_SETTING(t, ...)                                                                        \
    ((t)->summary->bad_setting = 1, td__error(TD_ERR_INVALID_ARG, __VA_ARGS__))

static double now_s(const td__trainer *t) {
    return (double)(td_clock_ns() - t->t0) * 1e-9;
}

/* v as a JSON number; null when it is not one (a step whose numbers were
 * lost with a device has no loss). */
static const char *json_number(char *buf, size_t n, double v) {
    if (!isfinite(v))
        return "null";
    snprintf(buf, n, "%.9g", v);
    return buf;
}

/* Each line goes out whole, in one write (the buffer holds a line: see
 * open_metrics), so a killed run leaves no torn line and loses none. */
static void end_metrics_line(td__trainer *t, const char *end) {
    fputs(end, t->metrics);
    fflush(t->metrics);
}

static void metrics_line(td__trainer *t, const char *event, const td_train_event *ev) {
    char loss[32], acc[32];
    if (!t->metrics)
        return;
    fprintf(t->metrics,
            "{\"event\":\"%s\",\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"accuracy\":%s,"
            "\"lr\":%.9g,\"samples_per_s\":%.6g,\"elapsed_s\":%.4f",
            event, (long long)ev->step, (long long)ev->epoch,
            json_number(loss, sizeof loss, ev->loss), json_number(acc, sizeof acc, ev->accuracy),
            ev->lr, ev->samples_per_s, ev->elapsed_s);
    if (ev->kind != TD_TRAIN_EVENT_STEP && !isnan(ev->eval_loss))
        fprintf(t->metrics, ",\"test_loss\":%.9g,\"test_accuracy\":%.6g", ev->eval_loss,
                ev->eval_accuracy);
    end_metrics_line(t, "}\n");
}

static td_status save_now(td__trainer *t) {
    if (!t->cfg->checkpoint)
        return TD_OK;
    /* Every process calls it; only the root writes. */
    td_loader_position(t->loader, &t->state.epoch, &t->state.sample);
    return td_strategy_save(t->s, t->cfg->checkpoint, &t->state);
}

static td_status save(td__trainer *t) {
    td_status st = td__train_despite_lost(t, save_now);
    if (st == TD_OK && t->cfg->checkpoint)
        t->saved = t->cfg->checkpoint;
    return st;
}

/* Opens the data the model reads (td_data_open: the format by the path). */
static td_status open_data(td__trainer *t, const td_model_info *mi) {
    const td_train_config *c = t->cfg;
    td_data_options o = {
        .test_path = c->test_data_path, .split = c->split, .label_column = c->label_column};
    if (!c->data_path)
        return td__error(TD_ERR_INVALID_ARG, "no data given (--data)");
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

td_status td__train_calibrate(td__trainer *t) {
    td_loader *l = NULL;
    td_batch b;
    td_status st;
    int64_t n = t->state.batch < 256 ? t->state.batch : 256;
    /* A batch of the first samples, in order: the training order is left as
     * it is. */
    TD_TRY(td_loader_create(t->train, n, 0, 0, &l));
    TD_TRY(td_loader_next(l, &b));
    if (b.n > 0)
        TD_TRY(td_strategy_calibrate(t->s, &b));
    td_loader_destroy(l);
    return TD_OK;
fail:
    td_loader_destroy(l);
    return st;
}

struct td_train_member *td__train_member_row(td__trainer *t, int rank) {
    td_train_summary *out = t->summary;
    td_device *dev = td_group_device(t->group, rank);
    char name[sizeof out->member[0].name];
    int i = 0;
    if (dev)
        snprintf(name, sizeof name, "%s", td_device_name(dev));
    else
        snprintf(name, sizeof name, "rank %d", rank); /* in another process */
    while (i < out->members && strcmp(out->member[i].name, name))
        i++;
    if (i == out->members && out->members < TD_DP_MAX_MEMBERS)
        snprintf(out->member[out->members++].name, sizeof name, "%s", name);
    return &out->member[i < TD_DP_MAX_MEMBERS ? i : TD_DP_MAX_MEMBERS - 1];
}

/* Per-member totals of the run, and for several members the per-step
 * metrics line. */
static void add_member_stats(td__trainer *t, const td_step_stats *ds, int64_t batch) {
    td_train_summary *out = t->summary;
    t->stat_steps++;
    t->batch_samples += (double)batch;
    out->hidden += ds->hidden_fraction;
    out->buckets = ds->buckets;
    out->buckets_in_backward = ds->buckets_in_backward;
    out->ideal_ratio += ds->ideal_s > 0 ? ds->step_s / ds->ideal_s : 0;
    for (int r = 0; r < ds->members && r < TD_DP_MAX_MEMBERS; r++) {
        struct td_train_member *m = td__train_member_row(t, r);
        m->samples += ds->m[r].samples;
        m->compute_s += ds->m[r].compute_s;
        m->comm_s += ds->m[r].comm_s;
        m->update_s += ds->m[r].update_s;
        m->wait_s += ds->m[r].wait_s;
        m->parked_steps += ds->m[r].parked;
        t->share_sum[m - out->member] += ds->m[r].share * (double)batch;
    }
    if (t->metrics && ds->members > 1) {
        fprintf(t->metrics,
                "{\"event\":\"devices\",\"step\":%lld,\"step_s\":%.6f,"
                "\"ideal_s\":%.6f,\"hidden\":%.4f,\"buckets\":%d,\"buckets_in_backward\":%d,"
                "\"devices\":[",
                (long long)t->state.step + 1, ds->step_s, ds->ideal_s, ds->hidden_fraction,
                ds->buckets, ds->buckets_in_backward);
        for (int r = 0; r < ds->members && r < TD_DP_MAX_MEMBERS; r++)
            fprintf(t->metrics,
                    "%s{\"name\":\"%s\",\"samples\":%lld,\"share\":%.4f,\"compute_s\":%.6f,"
                    "\"comm_s\":%.6f,\"update_s\":%.6f,\"wait_s\":%.6f,\"parked\":%s}",
                    r ? "," : "", td__train_member_row(t, r)->name, (long long)ds->m[r].samples,
                    ds->m[r].share, ds->m[r].compute_s, ds->m[r].comm_s, ds->m[r].update_s,
                    ds->m[r].wait_s, ds->m[r].parked ? "true" : "false");
        end_metrics_line(t, "]}\n");
    }
    if (ds->stragglers[0] && t->root)
        fprintf(stderr, "tandem: %s", ds->stragglers);
}

static void finish_member_stats(td__trainer *t, td_train_summary *out) {
    int64_t steps = t->stat_steps > 0 ? t->stat_steps : 1;
    for (int r = 0; r < out->members; r++)
        out->member[r].share = t->batch_samples > 0 ? t->share_sum[r] / t->batch_samples : 0;
    out->hidden /= (double)steps;
    out->ideal_ratio /= (double)steps;
}

/* Options of one strategy given to another are mistakes. */
static td_status check_strategy_options(const td_train_config *c) {
    const char *name = c->strategy ? c->strategy : "single";
    const char *const *names = td_strategy_names();
    char list[128] = "";
    size_t i = 0;
    while (names[i] && strcmp(names[i], name))
        i++;
    if (!names[i]) {
        for (i = 0; names[i]; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "",
                     names[i]);
        return td__error(TD_ERR_INVALID_ARG, "unknown strategy '%s' for training (%s)", name, list);
    }
    if (strcmp(name, "data") && (c->zero || c->deterministic || c->overlap >= 0))
        return td__error(TD_ERR_INVALID_ARG, "%s belongs to the data strategy (--strategy data)",
                         c->zero            ? "ZeRO-1 (--zero)"
                         : c->deterministic ? "deterministic mode (--deterministic)"
                                            : "overlapping the reduction (--overlap)");
    if (strcmp(name, "pipeline") && c->micro_batches)
        return td__error(TD_ERR_INVALID_ARG,
                         "micro-batches (--micro-batches) belong to the pipeline strategy "
                         "(--strategy pipeline)");
    if (c->micro_batches < 0)
        return td__error(TD_ERR_INVALID_ARG,
                         "%lld micro-batches: give at least 1 (--micro-batches)",
                         (long long)c->micro_batches);
    return TD_OK;
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
    sc.data.deterministic = c->deterministic;
    sc.data.zero = c->zero;
    sc.data.overlap = c->overlap;
    if (c->bucket_bytes) {
        sc.data.bucket_bytes = c->bucket_bytes;
        sc.data.first_bucket_bytes = c->bucket_bytes / 16 ? c->bucket_bytes / 16 : 1;
    }
    sc.micro_batches = c->micro_batches;
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

/* --model given with --resume: it must describe the checkpoint's model. */
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
        st = BAD_SETTING(t,
                         "%s is not the model the checkpoint %s holds (\"%s\") (--model): leave "
                         "--model out to resume it",
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
        return BAD_SETTING(t,
                           "%s was trained with batch %lld, not %lld (--batch): leave --batch "
                           "out to resume",
                           c->resume, (long long)t->state.batch, (long long)c->batch);
    if ((g & TD_GIVEN_SEED) && c->seed != t->state.seed)
        return BAD_SETTING(t,
                           "%s was trained with seed %llu, not %llu (--seed): leave --seed out "
                           "to resume",
                           c->resume, (unsigned long long)t->state.seed,
                           (unsigned long long)c->seed);
    if ((g & TD_GIVEN_DTYPE) && c->dtype != dtype)
        return BAD_SETTING(t,
                           "%s holds %s weights, not %s (--precision): leave --precision out "
                           "to resume",
                           c->resume, dtype == TD_F64 ? "f64" : "f32",
                           c->dtype == TD_F64 ? "f64" : "f32");
    if ((g & TD_GIVEN_OPTIMIZER) && want->kind != o->kind)
        return BAD_SETTING(t,
                           "%s holds the state of %s, not %s (--optimizer): leave --optimizer "
                           "out to resume",
                           c->resume, opt_name(o->kind), opt_name(want->kind));
    if ((g & TD_GIVEN_WARMUP) && want->warmup_steps != o->warmup_steps)
        return BAD_SETTING(t,
                           "%s has a warm-up of %lld steps, not %lld (--warmup): it counts from "
                           "the run's first step, so leave --warmup out to resume",
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
        return td__error(TD_ERR_INVALID_ARG, "no model given (--model)");
    TD_CHECK(read_model(c->model_path, &t->json));
    t->model_name = c->model_path;
    *dtype = c->dtype;
    t->state.seed = c->seed;
    t->state.batch = c->batch;
    t->state.opt = c->opt;
    return TD_OK;
}

/* A group over every device (every process's, under mpirun) and the
 * strategy on it, resumed from the checkpoint when there is one. */
static td_status make_strategy(td__trainer *t, td_dtype dtype) {
    td_group_config gcfg = TD_GROUP_CONFIG_INIT;
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    if (np && atoi(np) > 1)
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

/* The files the run writes: found wrong now, not at the first save. */
static td_status check_outputs(td__trainer *t) {
    const td_train_config *c = t->cfg;
    char dir[4096];
    struct stat sb;
    if (c->metrics && c->checkpoint && same_file(c->metrics, c->checkpoint))
        return BAD_SETTING(t, "--metrics and --checkpoint both name %s", c->metrics);
    if (c->metrics && c->resume && same_file(c->metrics, c->resume))
        return BAD_SETTING(t, "--metrics and --resume both name %s", c->metrics);
    if (!c->checkpoint)
        return TD_OK;
    if (stat(c->checkpoint, &sb) == 0 && !S_ISREG(sb.st_mode))
        return td__error(TD_ERR_IO,
                         "%s: not a regular file, so no checkpoint can replace it "
                         "(--checkpoint)",
                         c->checkpoint);
    snprintf(dir, sizeof dir, "%s", c->checkpoint);
    if (access(dirname(dir), W_OK) != 0)
        return td__error(TD_ERR_IO, "%s: cannot write a checkpoint there: %s (--checkpoint)",
                         c->checkpoint, strerror(errno));
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
        return td__error(TD_ERR_IO, "%s: cannot open the metrics file for writing (--metrics): %s",
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

static td_status setup(td__trainer *t) {
    const td_train_config *c = t->cfg;
    td_model_info mi;
    td_dtype dtype = TD_F32;
    if (c->batch < 1)
        return BAD_SETTING(t, "batch size %lld must be at least 1 (--batch)", (long long)c->batch);
    if (c->epochs < 0 || c->steps < 0 || (c->epochs == 0 && c->steps == 0))
        return BAD_SETTING(t, "give a positive number of epochs or steps (--epochs, --steps)");
    if (c->devices && !*c->devices)
        return BAD_SETTING(t, "no devices named (--devices is empty; leave it out for cpu)");
    TD_CHECK(check_strategy_options(c));
    TD_CHECK(check_outputs(t));
    TD_CHECK(td__train_trace_check(t));
    TD_CHECK(td_devices_open(c->devices ? c->devices : "cpu", &t->devs));
    TD_CHECK(read_run(t, &dtype));
    TD_CHECK(td_model_describe(t->json, t->model_name, &mi, NULL, 0));
    TD_CHECK(open_data(t, &mi));
    if (t->state.batch > t->info.size)
        return BAD_SETTING(t, "batch %lld is more than the %lld training samples of %s (--batch)",
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

static void teardown(td__trainer *t) {
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

static td_status evaluate_now(td__trainer *t) {
    int64_t batch = t->info.kind == TD_INPUT_TOKENS ? t->state.batch : 1000;
    return td_evaluate_strategy(t->s, t->test, batch, t->cfg->eval_samples, &t->evaluated);
}

static td_status eval_test(td__trainer *t, double *loss, double *acc) {
    td_step_result r;
    TD_CHECK(td__train_despite_lost(t, evaluate_now));
    r = t->evaluated;
    *loss = r.count ? r.loss_sum / (double)r.count : NAN;
    *acc = r.count ? (double)r.correct / (double)r.count : NAN;
    return TD_OK;
}

static void fill_epoch_event(td__trainer *t, td_train_event *ev) {
    ev->loss = t->ep_count ? t->ep_loss / (double)t->ep_count : NAN;
    ev->accuracy = t->ep_count ? (double)t->ep_correct / (double)t->ep_count : NAN;
    ev->samples_per_s = t->ep_seconds > 0 ? (double)t->ep_samples / t->ep_seconds : 0;
}

/* Whether a device lost since step was reached sent the run back to an
 * earlier checkpoint: what was about step is then to do again. */
static int went_back(const td__trainer *t, int64_t step) {
    return t->state.step < step;
}

static void note_eval(td__trainer *t, const td_train_event *ev) {
    t->last_eval_loss = ev->eval_loss;
    t->last_eval_acc = ev->eval_accuracy;
    t->last_eval_step = t->state.step;
}

/* An event of `kind` in `epoch` at the run's current step, the rest zero. */
static td_train_event event_now(const td__trainer *t, td_train_event_kind kind, int64_t epoch) {
    td_train_event ev;
    memset(&ev, 0, sizeof ev);
    ev.kind = kind;
    ev.root = t->root;
    ev.step = t->state.step;
    ev.total_steps = t->state.opt.total_steps;
    ev.epoch = epoch;
    ev.batch_in_epoch = t->ep_batches;
    ev.batches_per_epoch = t->bpe;
    return ev;
}

/* The epoch ended: evaluate, report, save. */
static td_status end_epoch(td__trainer *t, int64_t epoch) {
    const td_train_config *cfg = t->cfg;
    td_train_event ev;
    ev = event_now(t, TD_TRAIN_EVENT_EPOCH, epoch);
    ev.lr = td_strategy_lr(t->s);
    fill_epoch_event(t, &ev);
    ev.eval_loss = ev.eval_accuracy = NAN;
    if (cfg->eval_each_epoch || (cfg->epochs > 0 && epoch + 1 >= cfg->epochs)) {
        TD_CHECK(eval_test(t, &ev.eval_loss, &ev.eval_accuracy));
        if (went_back(t, ev.step)) /* the epoch is to train again */
            return TD_OK;
        note_eval(t, &ev);
    }
    ev.elapsed_s = now_s(t);
    t->summary->final_loss = ev.loss;
    metrics_line(t, "epoch", &ev);
    TD_CHECK(save(t));
    if (went_back(t, ev.step))
        return TD_OK;
    if (cfg->callback && cfg->callback(cfg->callback_arg, &ev))
        t->stop = 1;
    t->ep_loss = 0;
    t->ep_correct = t->ep_count = t->ep_samples = t->ep_batches = 0;
    t->ep_seconds = 0;
    return TD_OK;
}

/* The strategy's step on b; a device lost in it goes to recovery, after
 * which the survivors take the step again, or it was taken, or the run
 * went back to its checkpoint (*rewound). */
static td_status strategy_step(td__trainer *t, const td_batch *b, td_step_result *r, int *rewound,
                               td_step_stats *ds, int *have_stats) {
    int64_t before = td_strategy_steps(t->s);
    td__after_loss after = TD__STEP_TO_REDO;
    td_status st = td_strategy_step(t->s, b, (uint64_t)t->state.step, r, ds);
    *rewound = *have_stats = 0;
    while (st == TD_ERR_DEVICE_LOST) { /* a retake can lose a device too */
        TD_CHECK(td__train_carry_on(t, st, before, &after));
        if (after == TD__STEPS_REWOUND) {
            *rewound = 1;
            return TD_OK;
        }
        memset(r, 0, sizeof *r); /* its numbers went with the device */
        st = after == TD__STEP_TAKEN ? TD_OK
                                     : td_strategy_step(t->s, b, (uint64_t)t->state.step, r, ds);
    }
    TD_CHECK(st);
    if (after != TD__STEP_TAKEN) {
        add_member_stats(t, ds, b->n);
        *have_stats = 1;
    }
    return TD_OK;
}

/* One step on b (gathered from s0 on), and what follows it: the step's
 * report, a checkpoint and an evaluation when they are due. */
static td_status take_step(td__trainer *t, const td_batch *b, uint64_t s0, int64_t epoch) {
    const td_train_config *cfg = t->cfg;
    td_train_event ev;
    td_step_result r = {0, 0, 0};
    td_step_stats ds;
    double dt, lr = td_strategy_lr(t->s);
    int rewound, have_stats;
    uint64_t tr = td__trace_begin();
    TD_CHECK(strategy_step(t, b, &r, &rewound, &ds, &have_stats));
    td__train_trace_stepped(t, tr);
    if (rewound)
        return TD_OK;
    dt = (double)(td_clock_ns() - s0) * 1e-9;
    if (lr > t->summary->max_lr)
        t->summary->max_lr = lr;
    t->state.step++;
    t->train_seconds += dt;
    t->samples += b->n;
    t->ep_seconds += dt;
    t->ep_samples += b->n;
    t->ep_batches++;
    t->ep_loss += r.loss_sum;
    t->ep_correct += r.correct;
    t->ep_count += r.count;
    if (!isfinite(r.loss_sum))
        return td__error(TD_ERR_INTERNAL,
                         "the loss became %g at step %lld (learning rate %g too high?)", r.loss_sum,
                         (long long)t->state.step, lr);
    ev = event_now(t, TD_TRAIN_EVENT_STEP, epoch);
    ev.loss = r.count ? r.loss_sum / (double)r.count : NAN;
    ev.accuracy = r.count ? (double)r.correct / (double)r.count : NAN;
    ev.lr = lr;
    ev.samples_per_s = t->ep_seconds > 0 ? (double)t->ep_samples / t->ep_seconds : 0;
    ev.eval_loss = ev.eval_accuracy = NAN;
    ev.elapsed_s = now_s(t);
    ev.stats = have_stats ? &ds : NULL;
    ev.group = t->group;
    metrics_line(t, "step", &ev);
    if (cfg->callback && cfg->callback(cfg->callback_arg, &ev))
        t->stop = 1;
    ev.stats = NULL; /* the EVAL event below is not the step's */
    ev.group = NULL;
    if (cfg->max_seconds > 0 && t->train_seconds >= cfg->max_seconds)
        t->stop = 1;
    if (t->stop)
        t->summary->stopped = 1;
    if (cfg->checkpoint_every > 0 && t->state.step % cfg->checkpoint_every == 0)
        TD_CHECK(save(t));
    if (went_back(t, ev.step) || cfg->eval_every <= 0 || t->state.step % cfg->eval_every != 0)
        return TD_OK;
    ev.kind = TD_TRAIN_EVENT_EVAL;
    TD_CHECK(eval_test(t, &ev.eval_loss, &ev.eval_accuracy));
    if (went_back(t, ev.step)) /* evaluated again when it comes back */
        return TD_OK;
    note_eval(t, &ev);
    ev.elapsed_s = now_s(t);
    metrics_line(t, "eval", &ev);
    if (cfg->callback && cfg->callback(cfg->callback_arg, &ev))
        t->stop = t->summary->stopped = 1;
    return TD_OK;
}

/* Whether the run has steps left, by the step count and the loader's
 * epoch (*epoch). */
static int steps_remain(const td__trainer *t, int64_t *epoch) {
    td_loader_position(t->loader, epoch, NULL);
    if (t->cfg->steps > 0 && t->state.step >= t->cfg->steps)
        return 0;
    return !(t->cfg->epochs > 0 && *epoch >= t->cfg->epochs);
}

/* Trains until the steps or epochs are done or the run is stopped, then
 * makes the final evaluation (unless the last epoch's end just made one)
 * and checkpoint; a device lost in those may send the run back to an
 * earlier checkpoint, from which the steps are taken again. */
static td_status train(td__trainer *t) {
    int64_t steps_taken, epoch;
    td_batch b;
    do {
        while (!t->stop && steps_remain(t, &epoch)) {
            /* Throughput counts gathering the batch as well as the step. */
            uint64_t s0 = td_clock_ns();
            td__train_trace_loading(t);
            TD_CHECK(td_loader_next(t->loader, &b));
            td__train_trace_loaded(t, &b);
            TD_CHECK(b.n == 0 ? end_epoch(t, epoch) : take_step(t, &b, s0, epoch));
        }
        steps_taken = t->state.step;
        if (t->last_eval_step != t->state.step)
            TD_CHECK(eval_test(t, &t->last_eval_loss, &t->last_eval_acc));
        if (t->ep_count > 0)
            t->summary->final_loss = t->ep_loss / (double)t->ep_count;
        TD_CHECK(save(t));
    } while (went_back(t, steps_taken) && !t->stop);
    return TD_OK;
}

/* The summary and the last event. */
static void finish(td__trainer *t, int64_t first_epoch) {
    const td_train_config *cfg = t->cfg;
    td_train_summary *out = t->summary;
    td_dataset_info ti;
    td_train_event ev;
    int64_t last_epoch;
    for (int r = 0; r < td_group_size(t->group) && !out->device[0]; r++)
        if (td_group_device(t->group, r))
            snprintf(out->device, sizeof out->device, "%s",
                     td_device_name(td_group_device(t->group, r)));
    snprintf(out->strategy, sizeof out->strategy, "%s", td_strategy_name(t->s));
    td_strategy_plan(t->s, out->plan, sizeof out->plan);
    out->devices_named = (int)td_device_list_count(t->devs);
    out->root = t->root;
    finish_member_stats(t, out);
    out->steps = t->state.step;
    td_loader_position(t->loader, &last_epoch, NULL);
    out->epochs_done = last_epoch - first_epoch;
    out->samples = t->samples;
    out->train_seconds = t->train_seconds;
    out->samples_per_s = t->train_seconds > 0 ? (double)t->samples / t->train_seconds : 0;
    out->test_loss = t->last_eval_loss;
    out->test_accuracy = t->last_eval_acc;
    td_dataset_get_info(t->test, &ti);
    out->test_samples =
        cfg->eval_samples > 0 && cfg->eval_samples < ti.size ? cfg->eval_samples : ti.size;
    ev = event_now(t, TD_TRAIN_EVENT_DONE, last_epoch);
    ev.batch_in_epoch = 0;
    ev.loss = out->final_loss;
    ev.accuracy = t->ep_count ? (double)t->ep_correct / (double)t->ep_count : NAN;
    ev.lr = td_strategy_lr(t->s);
    ev.samples_per_s = out->samples_per_s;
    ev.eval_loss = t->last_eval_loss;
    ev.eval_accuracy = t->last_eval_acc;
    ev.elapsed_s = now_s(t);
    metrics_line(t, "done", &ev);
    if (cfg->callback)
        cfg->callback(cfg->callback_arg, &ev);
}

td_status td_train_run(const td_train_config *cfg, td_train_summary *out) {
    td__trainer t;
    int64_t first_epoch;
    td_status st;
    if (!cfg || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_train_run: NULL argument");
    memset(out, 0, sizeof *out);
    out->test_loss = out->test_accuracy = out->final_loss = NAN;
    memset(&t, 0, sizeof t);
    t.summary = out;
    t.cfg = cfg;
    t.t0 = td_clock_ns();
    t.last_eval_loss = t.last_eval_acc = NAN;
    t.last_eval_step = -1;
    if ((st = setup(&t)) == TD_OK) {
        t.bpe = td_loader_batches_per_epoch(t.loader);
        /* Epochs are counted from the loader's place, which a return to a
         * checkpoint sets back, so an epoch trained twice counts once. */
        td_loader_position(t.loader, &first_epoch, NULL);
        if ((st = train(&t)) == TD_OK)
            finish(&t, first_epoch);
        st = td__train_trace_end(&t, st);
    }
    teardown(&t);
    return st;
}
