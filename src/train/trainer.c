/* The training loop: data, model and optimizer, evaluation, metrics,
 * checkpoints and resume.
 *
 * One step is: the loader's next host batch -> replica_step() on the
 * device's own thread (forward, backward, optimizer), or with the data
 * strategy td_dp_step() over a group of every device (src/parallel), which
 * splits the batch by speed and all-reduces the gradients. The loop around
 * it is the same; t->m and t->opt are then rank 0's replica, which
 * evaluation and checkpoints use (after td_dp_refresh: rank 0 may have been
 * parked). */
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "tandem/checkpoint.h"
#include "train/train-impl.h"

typedef struct trainer {
    const td_train_config *cfg;
    td_device_list *devs;
    td_device *dev;
    td_model *m;
    td_optimizer *opt;
    td_dataset *train, *test;
    td_dataset_info info;
    td_loader *loader;
    td_train_state state;
    td_group *group; /* the data strategy's, else NULL */
    td_dp *dp;
    const char *saved; /* the run's newest checkpoint (written or resumed from), or NULL */
    int root;          /* this process reports and saves */
    int64_t dp_steps;  /* data-parallel steps in this process */
    td_train_summary *summary;
    FILE *metrics;
    uint64_t t0;          /* process start of the run */
    double train_seconds; /* in steps only */
    int64_t samples;      /* trained on in this process */
    /* The current epoch. */
    double ep_loss;
    int64_t ep_correct, ep_count, ep_samples, ep_batches;
    double ep_seconds;
} trainer;

typedef struct step_args {
    td_model *m;
    td_optimizer *opt;
    const td_batch *batch;
    double grad_scale;
    uint64_t dropout_step;
    td_step_result result;
} step_args;

/* One replica's step, on its device's thread. */
static td_status replica_step(td_device *dev, void *arg) {
    step_args *a = arg;
    td_status st =
        td_model_train_step(a->m, a->batch, a->grad_scale, 0, a->dropout_step, &a->result);
    if (st != TD_OK)
        return st;
    return td_optimizer_step(a->opt, NULL);
}

td_status td_evaluate(td_model *m, const td_dataset *ds, int64_t batch, int64_t max_samples,
                      td_step_result *out) {
    td_loader *l = NULL;
    td_batch b;
    td_step_result r;
    int64_t seen = 0;
    td_status st;
    if (!m || !ds || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_evaluate: NULL argument");
    memset(out, 0, sizeof *out);
    TD_TRY(td_loader_create(ds, batch, 0, 0, &l));
    for (;;) {
        TD_TRY(td_loader_next(l, &b));
        if (b.n == 0)
            break;
        if (max_samples > 0 && seen + b.n > max_samples)
            b.n = max_samples - seen;
        TD_TRY(td_model_evaluate(m, &b, &r));
        out->loss_sum += r.loss_sum;
        out->correct += r.correct;
        out->count += r.count;
        seen += b.n;
        if (max_samples > 0 && seen >= max_samples)
            break;
    }
    td_loader_destroy(l);
    return TD_OK;
fail:
    td_loader_destroy(l);
    return st;
}

/* Host copies of batches: the loader reuses its buffers, and every batch of
 * an alternate evaluation must exist at once. */
typedef struct batch_copy {
    float *x;
    int32_t *tokens, *labels;
} batch_copy;

static void free_copies(batch_copy *c, size_t n) {
    for (size_t i = 0; c && i < n; i++) {
        free(c[i].x);
        free(c[i].tokens);
        free(c[i].labels);
    }
    free(c);
}

td_status td_evaluate_alternate(td_dp *dp, const td_dataset *ds, int64_t batch, int64_t max_samples,
                                td_step_result *out) {
    td_loader *l = NULL;
    td_dataset_info info;
    td_batch b, *batches = NULL;
    td_step_result *res = NULL;
    batch_copy *copies = NULL;
    size_t n = 0, cap = 0;
    int64_t seen = 0;
    td_status st;
    if (!dp || !ds || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_evaluate_alternate: NULL argument");
    memset(out, 0, sizeof *out);
    td_dataset_get_info(ds, &info);
    TD_TRY(td_loader_create(ds, batch, 0, 0, &l));
    for (;;) {
        size_t nx, nl;
        TD_TRY(td_loader_next(l, &b));
        if (b.n == 0)
            break;
        if (max_samples > 0 && seen + b.n > max_samples)
            b.n = max_samples - seen;
        if (n == cap) {
            size_t c2 = cap ? 2 * cap : 16;
            td_batch *nb = realloc(batches, c2 * sizeof *nb);
            batch_copy *nc = realloc(copies, c2 * sizeof *nc);
            if (nb)
                batches = nb;
            if (nc)
                copies = nc;
            if (!nb || !nc) {
                st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory holding batches");
                goto fail;
            }
            memset(copies + cap, 0, (c2 - cap) * sizeof *copies);
            cap = c2;
        }
        nx = (size_t)(b.n * info.features);
        nl = (size_t)(b.n * info.labels_per_sample);
        copies[n].labels = malloc(nl * sizeof(int32_t));
        if (b.x)
            copies[n].x = malloc(nx * sizeof(float));
        if (b.tokens)
            copies[n].tokens = malloc(nx * sizeof(int32_t));
        if (!copies[n].labels || (b.x && !copies[n].x) || (b.tokens && !copies[n].tokens)) {
            n++;
            st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory holding batches");
            goto fail;
        }
        memcpy(copies[n].labels, b.labels, nl * sizeof(int32_t));
        if (b.x)
            memcpy(copies[n].x, b.x, nx * sizeof(float));
        if (b.tokens)
            memcpy(copies[n].tokens, b.tokens, nx * sizeof(int32_t));
        batches[n] = (td_batch){b.n, copies[n].x, copies[n].tokens, copies[n].labels};
        n++;
        seen += b.n;
        if (max_samples > 0 && seen >= max_samples)
            break;
    }
    res = calloc(n ? n : 1, sizeof *res);
    if (!res) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory");
        goto fail;
    }
    TD_TRY(td_dp_evaluate(dp, batches, n, res));
    for (size_t i = 0; i < n; i++) {
        out->loss_sum += res[i].loss_sum;
        out->correct += res[i].correct;
        out->count += res[i].count;
    }
    st = TD_OK;
fail:
    free(res);
    free(batches);
    free_copies(copies, n);
    td_loader_destroy(l);
    return st;
}

static double now_s(const trainer *t) {
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

static void metrics_line(trainer *t, const char *event, const td_train_event *ev) {
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
    fputs("}\n", t->metrics);
    if (ev->kind != TD_TRAIN_EVENT_STEP)
        fflush(t->metrics);
}

static td_status despite_lost_devices(trainer *t, td_status (*op)(trainer *));

/* ZeRO-1: the shards of the optimizer state, put together for the
 * checkpoint in a whole optimizer that lives while it is written (rank 0's
 * device holds the whole state for that while). */
static td_status save_gathered(trainer *t) {
    td_optimizer *whole = NULL;
    td_status st;
    if (t->root && (st = td_optimizer_create(t->m, &t->state.opt, &whole)) != TD_OK)
        return st;
    st = td_dp_gather_optimizer(t->dp, whole);
    if (st == TD_OK && t->root) {
        td_loader_position(t->loader, &t->state.epoch, &t->state.sample);
        st = td_checkpoint_save(t->cfg->checkpoint, t->m, whole, &t->state);
    }
    td_optimizer_destroy(whole);
    return st;
}

static td_status save_now(trainer *t) {
    td_status st;
    if (!t->cfg->checkpoint)
        return TD_OK;
    /* Every process calls the refresh; only the root writes. */
    if (t->dp && (st = td_dp_refresh(t->dp)) != TD_OK)
        return st;
    if (t->dp && t->cfg->zero)
        return save_gathered(t);
    if (!t->root)
        return TD_OK;
    td_loader_position(t->loader, &t->state.epoch, &t->state.sample);
    return td_checkpoint_save(t->cfg->checkpoint, t->m, t->opt, &t->state);
}

static td_status save(trainer *t) {
    td_status st = despite_lost_devices(t, save_now);
    if (st == TD_OK && t->cfg->checkpoint)
        t->saved = t->cfg->checkpoint;
    return st;
}

/* A checkpoint's model on dev, an optimizer holding its saved state, and
 * the run's state it was saved with. */
static td_status open_checkpoint(const char *path, td_device *dev, td_model **m, td_optimizer **o,
                                 td_train_state *s) {
    td_status st = td_checkpoint_load_model(path, dev, m, s);
    *o = NULL;
    if (st == TD_OK && (st = td_optimizer_create(*m, &s->opt, o)) == TD_OK)
        st = td_checkpoint_load(path, *m, *o, NULL);
    if (st != TD_OK) {
        td_optimizer_destroy(*o);
        td_model_destroy(*m);
        *o = NULL, *m = NULL;
    }
    return st;
}

/* Opens the data the model reads: MNIST for features, text for tokens. */
static td_status open_data(trainer *t) {
    const td_train_config *c = t->cfg;
    int64_t shape[TD_MAX_DIMS], numel = 1, classes = td_model_num_classes(t->m);
    int nd = td_model_input_shape(t->m, shape);
    struct stat sb;
    td_status st;
    for (int d = 0; d < nd; d++)
        numel *= shape[d];
    if (!c->data_path)
        return td__error(TD_ERR_INVALID_ARG, "no data given (--data)");
    if (stat(c->data_path, &sb) != 0)
        return td__error(TD_ERR_IO, "%s: no such file or folder (--data)", c->data_path);
    if (td_model_input_kind(t->m) == TD_INPUT_TOKENS) {
        td_text_options o = TD_TEXT_OPTIONS_INIT;
        if (S_ISDIR(sb.st_mode))
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: a folder; the model reads tokens, so --data must be a text file",
                             c->data_path);
        o.context = shape[0];
        o.vocab = classes >= 256 ? TD_TEXT_BYTES : TD_TEXT_CHARS;
        TD_TRY(td_text_open(c->data_path, &o, &t->train, &t->test));
    } else {
        if (!S_ISDIR(sb.st_mode))
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: not a folder; the model reads images, so --data must be a "
                             "folder of MNIST IDX files",
                             c->data_path);
        TD_TRY(td_mnist_open(c->data_path, &t->train, &t->test));
    }
    td_dataset_get_info(t->train, &t->info);
    if (t->info.features != numel)
        return td__error(TD_ERR_SHAPE, "%s: samples have %lld values; the model reads %lld",
                         c->data_path, (long long)t->info.features, (long long)numel);
    if (t->info.num_classes > classes)
        return td__error(TD_ERR_SHAPE,
                         "%s: %lld classes (or tokens) in the data; the model outputs %lld",
                         c->data_path, (long long)t->info.num_classes, (long long)classes);
    return TD_OK;
fail:
    return st;
}

static void vocab_to_state(trainer *t) {
    size_t n;
    const uint8_t *v = td_dataset_vocab(t->train, &n);
    t->state.vocab_len = v ? (int)n : 0;
    if (v)
        memcpy(t->state.vocab, v, n);
}

/* Shares from each device's measured speed on a batch of the first samples
 * (in order: the training order is left as it is). */
static td_status calibrate(trainer *t) {
    td_loader *l = NULL;
    td_batch b;
    td_status st;
    int64_t n = t->state.batch < 256 ? t->state.batch : 256;
    TD_TRY(td_loader_create(t->train, n, 0, 0, &l));
    TD_TRY(td_loader_next(l, &b));
    if (b.n > 0)
        TD_TRY(td_dp_calibrate(t->dp, &b));
    td_loader_destroy(l);
    return TD_OK;
fail:
    td_loader_destroy(l);
    return st;
}

/* Replicas on every member of t->group that start from model m and
 * optimizer o (on global rank 0's process; NULL elsewhere): rank 0's
 * replica takes m's weights and o's state, the others get them from it, and
 * t->m, t->opt and t->dev become rank 0's replica's (or the first local
 * one's). m and o stay the caller's; the shares are calibrated afresh. */
static td_status make_replicas(trainer *t, td_model *m, td_optimizer *o) {
    const td_train_config *c = t->cfg;
    td_dp_config dcfg = TD_DP_CONFIG_INIT;
    int first = -1;
    td_status st;
    dcfg.deterministic = c->deterministic;
    dcfg.zero = c->zero;
    dcfg.overlap = c->overlap;
    if (c->bucket_bytes) {
        dcfg.bucket_bytes = c->bucket_bytes;
        dcfg.first_bucket_bytes = c->bucket_bytes / 16 ? c->bucket_bytes / 16 : 1;
    }
    TD_TRY(td_dp_create(t->group, td_model_json(m), c->model_path ? c->model_path : c->resume,
                        td_model_dtype(m), t->state.seed, &t->state.opt, &dcfg, &t->dp));
    for (int r = 0; r < td_group_size(t->group) && first < 0; r++)
        if (td_group_device(t->group, r))
            first = r;
    t->root = td_group_device(t->group, 0) != NULL;
    if (t->root)
        for (size_t p = 0; p < td_model_param_count(m); p++)
            TD_TRY(td_tensor_copy(td_model_param(td_dp_model(t->dp, 0), p), td_model_param(m, p)));
    TD_TRY(td_dp_sync_replicas(t->dp));
    TD_TRY(td_dp_scatter_optimizer(t->dp, t->root ? o : NULL));
    t->m = td_dp_model(t->dp, first);
    t->opt = td_dp_optimizer(t->dp, first);
    t->dev = td_model_device(t->m);
    return calibrate(t);
fail:
    return st;
}

/* A group over every device (every process's, under mpirun) with a
 * replica on each. The single-device model and optimizer, already loaded or
 * resumed, hand over to the replicas, so resuming needs the checkpoint in
 * one place only. */
static td_status setup_data_parallel(trainer *t) {
    td_group_config gcfg = TD_GROUP_CONFIG_INIT;
    const char *np = getenv("OMPI_COMM_WORLD_SIZE");
    td_model *m = t->m;
    td_optimizer *o = t->opt;
    td_status st;
    if (np && atoi(np) > 1)
        gcfg.transport = TD_TRANSPORT_MPI;
    if ((st = td_group_create(t->devs, &gcfg, &t->group)) != TD_OK)
        return st;
    st = make_replicas(t, m, o);
    /* The replicas own the model and optimizer from here on. */
    if (t->dp) {
        td_optimizer_destroy(o);
        td_model_destroy(m);
        if (st != TD_OK)
            t->m = NULL, t->opt = NULL;
    }
    return st;
}

/* The summary's row of the group's member `rank`, found by its name (a
 * lost device keeps its row while the survivors' ranks change); a new row
 * when it has none. */
static struct td_train_member *member_row(trainer *t, int rank) {
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

/* The rank in g of this process's member (of `among`, when not NULL) whose
 * replica's optimizer has counted the most steps (a parked replica falls
 * behind while it sits steps out), or -1. */
static int most_advanced(td_dp *dp, const td_group *g, const td_group *among) {
    int best = -1;
    for (int r = 0; r < td_group_size(g); r++)
        if (td_group_device(g, r) &&
            (!among || td_group_rank_of(among, td_group_device(g, r)) >= 0) &&
            (best < 0 || td_optimizer_steps(td_dp_optimizer(dp, r)) >
                             td_optimizer_steps(td_dp_optimizer(dp, best))))
            best = r;
    return best;
}

/* Replicas and groups that stay allocated to the end of the process: a lost
 * device's host thread that never came back from its step may still touch
 * them. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept_setup {
    td_dp *dp;
    td_group *g;
} kept[64];
static int nkept;

/* Whether a device of g that is not in the run's group now (a lost one)
 * still runs a task: its host thread has not come back from the step. */
static int lost_thread_out(const trainer *t, const td_group *g) {
    for (int r = 0; r < td_group_size(g); r++) {
        td_device *dev = td_group_device(g, r);
        if (dev && td_group_rank_of(t->group, dev) < 0 && td_device_busy(dev))
            return 1;
    }
    return 0;
}

/* Frees the replicas and group the run has left behind, unless a lost
 * device's host thread is still out in the failed step (a device hung for
 * good): then they are kept (leaked once the list is full: freeing them
 * could pull memory from under the thread). */
static void retire(trainer *t, td_dp *dp, td_group *g) {
    if (!lost_thread_out(t, g)) {
        td_dp_destroy(dp);
        td_group_destroy(g);
        return;
    }
    TD_LOG_WARN("a lost device's host thread has not come back from the step; its group's "
                "replicas stay allocated while it may touch them");
    pthread_mutex_lock(&kept_lock);
    if (nkept < (int)(sizeof kept / sizeof *kept))
        kept[nkept++] = (struct kept_setup){dp, g};
    pthread_mutex_unlock(&kept_lock);
}

/* What a lost device left the step: to be taken again by the survivors,
 * taken already, or the run gone back to its newest checkpoint. */
typedef enum { STEP_TO_REDO, STEP_TAKEN, STEPS_REWOUND } after_loss;

/* The survivors of a loss go back to the run's newest checkpoint: weights,
 * optimizer state, step and the loader's place all as it saved them, on
 * replicas over the survivors, so that from there the run trains as one
 * resumed from that checkpoint on those devices would. Takes survivors. */
static td_status rewind_to_checkpoint(trainer *t, td_group *survivors, const char *gone,
                                      const char *why, const char *what_went) {
    td_group *old_group = t->group;
    td_dp *old_dp = t->dp;
    td_model *m = NULL;
    td_optimizer *o = NULL;
    td_train_state s;
    td_status st;
    if ((st = open_checkpoint(t->saved, td_group_device(survivors, 0), &m, &o, &s)) != TD_OK ||
        (st = td_loader_seek(t->loader, s.epoch, s.sample)) != TD_OK) {
        td_optimizer_destroy(o);
        td_model_destroy(m);
        td_group_destroy(survivors);
        return td__error_prefix(st, "going back to %s after %s was lost: ", t->saved, gone);
    }
    TD_LOG_WARN("step %lld: %s lost (%s); %s, so training goes back to %s (step %lld) and goes "
                "on with the other %d device%s",
                (long long)t->state.step + 1, gone, why, what_went, t->saved, (long long)s.step,
                td_group_size(survivors), td_group_size(survivors) == 1 ? "" : "s");
    for (int i = 0; i < t->summary->members; i++)
        if (t->summary->member[i].lost_at_step == t->state.step + 1)
            t->summary->member[i].back_to_step = s.step;
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"event\":\"rewind\",\"step\":%lld,\"to_step\":%lld,\"lost\":\"%s\"}\n",
                (long long)t->state.step, (long long)s.step, gone);
        fflush(t->metrics);
    }
    t->state = s;
    /* As a resumed run starts: the epoch's numbers afresh. */
    t->ep_loss = 0;
    t->ep_correct = t->ep_count = t->ep_samples = t->ep_batches = 0;
    t->ep_seconds = 0;
    t->group = survivors;
    t->dp = NULL;
    st = make_replicas(t, m, o);
    if (!t->dp) /* t->m and t->opt were old_dp's */
        t->m = NULL, t->opt = NULL;
    td_optimizer_destroy(o);
    td_model_destroy(m);
    retire(t, old_dp, old_group);
    return st;
}

/* A device lost during a data-parallel step, in a group of this process's
 * devices: training goes on without it. With the optimizer replicated, a
 * group of the others gets replicas of an up-to-date survivor's weights and
 * optimizer state. A lost member fails every survivor's collective at the
 * same one, so the survivors either all took the step's update (the loss
 * came in the step's last exchange, of its numbers) or none did. When the
 * lost device held state no survivor has (its ZeRO-1 shard of the optimizer
 * state, or the only current replica while the others sat steps out), the
 * survivors go back to the run's newest checkpoint instead. Without one the
 * loss ends the run, with why. */
static td_status carry_on_without_lost(trainer *t, td_status lost, int64_t steps_before,
                                       after_loss *after) {
    char why[1024], gone[256] = "";
    const char *what_went = NULL;
    td_group *survivors = NULL, *old_group = t->group;
    td_dp *old_dp = t->dp;
    int from;
    td_status st;
    snprintf(why, sizeof why, "%s", td_last_error());
    if (strcmp(td_group_transport(old_group), "local"))
        return td__error(lost, "%s (a group over %s does not carry on without a member)", why,
                         td_group_transport(old_group));
    if ((st = td_dp_survivors(old_dp, &survivors)) != TD_OK)
        return st;
    if (td_group_size(survivors) == 0) {
        td_group_destroy(survivors);
        return td__error(lost, "%s (no device is left)", why);
    }
    if (td_group_size(survivors) == td_group_size(old_group)) { /* none of its members failed */
        td_group_destroy(survivors);
        return td__error(lost, "%s", why);
    }
    for (int r = 0; r < td_group_size(old_group); r++)
        if (td_group_device(old_group, r) &&
            td_group_rank_of(survivors, td_group_device(old_group, r)) < 0) {
            member_row(t, r)->lost_at_step = t->state.step + 1;
            snprintf(gone + strlen(gone), sizeof gone - strlen(gone), "%s%s", *gone ? ", " : "",
                     td_device_name(td_group_device(old_group, r)));
        }
    from = most_advanced(old_dp, old_group, survivors);
    if (t->cfg->zero)
        what_went = "its shard of the ZeRO-1 optimizer state was the only copy";
    else if (td_optimizer_steps(td_dp_optimizer(old_dp, from)) < steps_before)
        what_went = "the devices left had sat steps out, parked, and it held the only current "
                    "replica";
    if (what_went && !t->saved) {
        td_group_destroy(survivors);
        return td__error(lost,
                         "%s (%s, and this run has no checkpoint to go back to: give "
                         "--checkpoint with --checkpoint-every)",
                         why, what_went);
    }
    if (what_went) {
        *after = STEPS_REWOUND;
        return rewind_to_checkpoint(t, survivors, gone, why, what_went);
    }
    *after = td_optimizer_steps(td_dp_optimizer(old_dp, from)) > steps_before ? STEP_TAKEN
                                                                              : STEP_TO_REDO;
    TD_LOG_WARN("step %lld: %s lost (%s); training goes on with the other %d device%s",
                (long long)t->state.step + 1, gone, why, td_group_size(survivors),
                td_group_size(survivors) == 1 ? "" : "s");
    t->group = survivors;
    t->dp = NULL;
    st = make_replicas(t, td_dp_model(old_dp, from), td_dp_optimizer(old_dp, from));
    if (!t->dp) /* t->m and t->opt were old_dp's */
        t->m = NULL, t->opt = NULL;
    retire(t, old_dp, old_group);
    return st;
}

/* Runs op, which works between steps on every replica (a checkpoint, which
 * brings parked replicas up to date or gathers ZeRO-1's shards; the refresh
 * before an evaluation). A device lost in it is handled as after a loss in
 * a step's last exchange (the survivors' replicas made current, or the run
 * gone back to its checkpoint), and op runs again. */
static td_status despite_lost_devices(trainer *t, td_status (*op)(trainer *)) {
    td_status st;
    while ((st = op(t)) == TD_ERR_DEVICE_LOST && t->dp) {
        after_loss after;
        int64_t steps =
            td_optimizer_steps(td_dp_optimizer(t->dp, most_advanced(t->dp, t->group, NULL)));
        TD_CHECK(carry_on_without_lost(t, st, steps, &after));
    }
    return st;
}

/* Per-member totals of a data-parallel run, and the per-step metrics line. */
static void add_member_stats(trainer *t, const td_dp_stats *ds, td_train_summary *out) {
    t->dp_steps++;
    out->hidden += ds->hidden_fraction;
    out->buckets = ds->buckets;
    out->buckets_in_backward = ds->buckets_in_backward;
    out->ideal_ratio += ds->ideal_s > 0 ? ds->step_s / ds->ideal_s : 0;
    for (int r = 0; r < ds->members && r < TD_DP_MAX_MEMBERS; r++) {
        struct td_train_member *m = member_row(t, r);
        m->samples += ds->m[r].samples;
        m->compute_s += ds->m[r].compute_s;
        m->comm_s += ds->m[r].comm_s;
        m->update_s += ds->m[r].update_s;
        m->wait_s += ds->m[r].wait_s;
        m->parked_steps += ds->m[r].parked;
    }
    if (t->metrics) {
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
                    r ? "," : "", member_row(t, r)->name, (long long)ds->m[r].samples,
                    ds->m[r].share, ds->m[r].compute_s, ds->m[r].comm_s, ds->m[r].update_s,
                    ds->m[r].wait_s, ds->m[r].parked ? "true" : "false");
        fputs("]}\n", t->metrics);
    }
    if (ds->stragglers[0] && t->root)
        fprintf(stderr, "tandem: %s", ds->stragglers);
}

static void finish_member_stats(trainer *t, td_train_summary *out) {
    int64_t total = 0;
    int64_t steps = t->dp_steps > 0 ? t->dp_steps : 1;
    if (!t->dp) {
        out->members = 1;
        snprintf(out->member[0].name, sizeof out->member[0].name, "%s", td_device_name(t->dev));
        out->member[0].samples = t->samples;
        out->member[0].share = 1.0;
        out->member[0].compute_s = t->train_seconds;
        return;
    }
    for (int r = 0; r < out->members; r++)
        total += out->member[r].samples;
    for (int r = 0; r < out->members; r++)
        out->member[r].share = total ? (double)out->member[r].samples / (double)total : 0;
    out->hidden /= (double)steps;
    out->ideal_ratio /= (double)steps;
}

static td_status setup(trainer *t) {
    const td_train_config *c = t->cfg;
    td_train_state resumed;
    td_status st;
    const char *spec = c->devices && *c->devices ? c->devices : "cpu";
    if (c->batch < 1)
        return td__error(TD_ERR_INVALID_ARG, "batch size %lld must be at least 1",
                         (long long)c->batch);
    if (c->epochs < 0 || c->steps < 0 || (c->epochs == 0 && c->steps == 0))
        return td__error(TD_ERR_INVALID_ARG, "give a positive number of epochs or steps");
    TD_TRY(td_devices_open(spec, &t->devs));
    t->dev = td_device_list_get(t->devs, 0);
    if (c->resume) {
        TD_TRY(open_checkpoint(c->resume, t->dev, &t->m, &t->opt, &resumed));
        t->state = resumed;
        t->saved = c->resume;
    } else {
        if (!c->model_path)
            return td__error(TD_ERR_INVALID_ARG, "no model given (--model)");
        if (c->dtype == TD_F64 && !td_device_supports_f64(t->dev))
            return td__error(TD_ERR_UNSUPPORTED, "%s has no f64 arithmetic (--precision f64)",
                             td_device_name(t->dev));
        TD_TRY(td_model_load(c->model_path, t->dev, c->dtype, c->seed, &t->m));
        t->state.seed = c->seed;
        t->state.batch = c->batch;
        t->state.opt = c->opt;
    }
    TD_TRY(open_data(t));
    TD_TRY(td_loader_create(t->train, t->state.batch, t->state.seed, 1, &t->loader));
    if (!c->resume && t->state.opt.total_steps == 0)
        t->state.opt.total_steps =
            c->steps > 0 ? c->steps : c->epochs * td_loader_batches_per_epoch(t->loader);
    if (c->resume) {
        size_t n;
        const uint8_t *v = td_dataset_vocab(t->train, &n);
        if ((int)n != t->state.vocab_len || (n && memcmp(v, t->state.vocab, n) != 0))
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: the text's characters differ from those the checkpoint %s "
                             "was trained on",
                             c->data_path, c->resume);
        TD_TRY(td_loader_seek(t->loader, t->state.epoch, t->state.sample));
    }
    vocab_to_state(t);
    if (!c->resume)
        TD_TRY(td_optimizer_create(t->m, &t->state.opt, &t->opt));
    t->root = 1;
    if (c->strategy && !strcmp(c->strategy, "data"))
        TD_TRY(setup_data_parallel(t));
    else if (c->strategy && strcmp(c->strategy, "single") != 0)
        return td__error(TD_ERR_INVALID_ARG, "unknown strategy '%s' for training (single, data)",
                         c->strategy);
    else if (c->zero || c->deterministic || c->overlap >= 0)
        return td__error(TD_ERR_INVALID_ARG, "%s belongs to the data strategy (--strategy data)",
                         c->zero            ? "ZeRO-1 (--zero)"
                         : c->deterministic ? "deterministic mode (--deterministic)"
                                            : "overlapping the reduction (--overlap)");
    if (c->checkpoint) {
        /* Found out now, not after an epoch of training. */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", c->checkpoint);
        if (access(dirname(dir), W_OK) != 0)
            return td__error(TD_ERR_IO, "%s: cannot write a checkpoint there: %s", c->checkpoint,
                             strerror(errno));
    }
    if (c->metrics && t->root && !(t->metrics = fopen(c->metrics, c->resume ? "a" : "w")))
        return td__error(TD_ERR_IO, "%s: cannot open the metrics file for writing", c->metrics);
    return TD_OK;
fail:
    return st;
}

static void teardown(trainer *t) {
    if (t->metrics)
        fclose(t->metrics);
    td_loader_destroy(t->loader);
    if (t->dp) {
        /* The replicas own the model and optimizer then. */
        td_dp_destroy(t->dp);
    } else {
        td_optimizer_destroy(t->opt);
        td_model_destroy(t->m);
    }
    td_group_destroy(t->group);
    td_dataset_destroy(t->train);
    td_dataset_destroy(t->test);
    td_device_list_destroy(t->devs);
}

static td_status refresh_replicas(trainer *t) {
    return t->dp ? td_dp_refresh(t->dp) : TD_OK;
}

static td_status eval_test(trainer *t, double *loss, double *acc) {
    td_step_result r;
    int64_t batch = t->info.kind == TD_INPUT_TOKENS ? t->state.batch : 1000;
    td_status st = despite_lost_devices(t, refresh_replicas);
    if (st == TD_OK)
        st = td_evaluate(t->m, t->test, batch, t->cfg->eval_samples, &r);
    if (st != TD_OK)
        return st;
    *loss = r.count ? r.loss_sum / (double)r.count : NAN;
    *acc = r.count ? (double)r.correct / (double)r.count : NAN;
    return TD_OK;
}

static void fill_epoch_event(trainer *t, td_train_event *ev) {
    ev->loss = t->ep_count ? t->ep_loss / (double)t->ep_count : NAN;
    ev->accuracy = t->ep_count ? (double)t->ep_correct / (double)t->ep_count : NAN;
    ev->samples_per_s = t->ep_seconds > 0 ? (double)t->ep_samples / t->ep_seconds : 0;
}

/* Whether a device lost since step was reached sent the run back to an
 * earlier checkpoint: what was about step is then to do again. */
static int went_back(const trainer *t, int64_t step) {
    return t->state.step < step;
}

td_status td_train_run(const td_train_config *cfg, td_train_summary *out) {
    trainer t;
    td_train_event ev;
    td_batch b;
    td_status st;
    double last_eval_loss = NAN, last_eval_acc = NAN;
    int64_t last_eval_step = -1, first_epoch, last_epoch, bpe;
    int64_t steps_taken;
    int stop = 0;
    if (!cfg || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_train_run: NULL argument");
    memset(out, 0, sizeof *out);
    out->test_loss = out->test_accuracy = out->final_loss = NAN;
    memset(&t, 0, sizeof t);
    t.summary = out;
    t.cfg = cfg;
    t.t0 = td_clock_ns();
    TD_TRY(setup(&t));
    bpe = td_loader_batches_per_epoch(t.loader);
    /* Epochs are counted from the loader's place, which a return to a
     * checkpoint sets back, so an epoch trained twice counts once. */
    td_loader_position(t.loader, &first_epoch, NULL);
    memset(&ev, 0, sizeof ev);
train_on:
    while (!stop) {
        int64_t epoch, pos;
        uint64_t s0;
        if (cfg->steps > 0 && t.state.step >= cfg->steps)
            break;
        td_loader_position(t.loader, &epoch, &pos);
        if (cfg->epochs > 0 && epoch >= cfg->epochs)
            break;
        /* Throughput counts gathering the batch as well as the step. */
        s0 = td_clock_ns();
        TD_TRY(td_loader_next(t.loader, &b));
        if (b.n == 0) {
            /* The epoch ended: evaluate, report, save. */
            int last = cfg->epochs > 0 && epoch + 1 >= cfg->epochs;
            memset(&ev, 0, sizeof ev);
            ev.kind = TD_TRAIN_EVENT_EPOCH;
            ev.step = t.state.step;
            ev.total_steps = t.state.opt.total_steps;
            ev.epoch = epoch;
            ev.batch_in_epoch = t.ep_batches;
            ev.batches_per_epoch = bpe;
            ev.lr = td_optimizer_lr(t.opt);
            fill_epoch_event(&t, &ev);
            ev.eval_loss = ev.eval_accuracy = NAN;
            if (cfg->eval_each_epoch || last) {
                TD_TRY(eval_test(&t, &ev.eval_loss, &ev.eval_accuracy));
                if (went_back(&t, ev.step)) /* the epoch is to train again */
                    continue;
                last_eval_loss = ev.eval_loss;
                last_eval_acc = ev.eval_accuracy;
                last_eval_step = t.state.step;
            }
            ev.elapsed_s = now_s(&t);
            out->final_loss = ev.loss;
            metrics_line(&t, "epoch", &ev);
            TD_TRY(save(&t));
            if (went_back(&t, ev.step))
                continue;
            if (cfg->callback && cfg->callback(cfg->callback_arg, &ev))
                stop = 1;
            t.ep_loss = 0;
            t.ep_correct = t.ep_count = t.ep_samples = t.ep_batches = 0;
            t.ep_seconds = 0;
            continue;
        }
        {
            step_args a;
            double dt, lr = td_optimizer_lr(t.opt);
            int64_t count = b.n * t.info.labels_per_sample;
            memset(&a, 0, sizeof a);
            a.m = t.m;
            a.opt = t.opt;
            a.batch = &b;
            a.grad_scale = 1.0 / (double)count;
            a.dropout_step = (uint64_t)t.state.step;
            if (t.dp) {
                td_dp_stats ds;
                int64_t before =
                    td_optimizer_steps(td_dp_optimizer(t.dp, most_advanced(t.dp, t.group, NULL)));
                after_loss after = STEP_TO_REDO;
                st = td_dp_step(t.dp, &b, a.dropout_step, &a.result, &ds);
                if (st == TD_ERR_DEVICE_LOST) {
                    TD_TRY(carry_on_without_lost(&t, st, before, &after));
                    if (after == STEPS_REWOUND)
                        continue;
                    memset(&a.result, 0, sizeof a.result); /* its numbers went with the device */
                    st = after == STEP_TAKEN ? TD_OK
                                             : td_dp_step(t.dp, &b, a.dropout_step, &a.result, &ds);
                }
                TD_TRY(st);
                if (after != STEP_TAKEN)
                    add_member_stats(&t, &ds, out);
            } else {
                TD_TRY(td_device_run(t.dev, replica_step, &a));
            }
            dt = (double)(td_clock_ns() - s0) * 1e-9;
            t.state.step++;
            t.train_seconds += dt;
            t.samples += b.n;
            t.ep_seconds += dt;
            t.ep_samples += b.n;
            t.ep_batches++;
            t.ep_loss += a.result.loss_sum;
            t.ep_correct += a.result.correct;
            t.ep_count += a.result.count;
            if (!isfinite(a.result.loss_sum)) {
                st = td__error(TD_ERR_INTERNAL,
                               "the loss became %g at step %lld (learning rate %g too high?)",
                               a.result.loss_sum, (long long)t.state.step, lr);
                goto fail;
            }
            memset(&ev, 0, sizeof ev);
            ev.kind = TD_TRAIN_EVENT_STEP;
            ev.step = t.state.step;
            ev.total_steps = t.state.opt.total_steps;
            ev.epoch = epoch;
            ev.batch_in_epoch = t.ep_batches;
            ev.batches_per_epoch = bpe;
            ev.loss = a.result.count ? a.result.loss_sum / (double)a.result.count : NAN;
            ev.accuracy = a.result.count ? (double)a.result.correct / (double)a.result.count : NAN;
            ev.lr = lr;
            ev.samples_per_s = t.ep_seconds > 0 ? (double)t.ep_samples / t.ep_seconds : 0;
            ev.eval_loss = ev.eval_accuracy = NAN;
            ev.elapsed_s = now_s(&t);
            metrics_line(&t, "step", &ev);
            if (cfg->callback && cfg->callback(cfg->callback_arg, &ev))
                stop = 1;
            if (cfg->max_seconds > 0 && t.train_seconds >= cfg->max_seconds)
                stop = 1;
            if (stop)
                out->stopped = 1;
            if (cfg->checkpoint_every > 0 && t.state.step % cfg->checkpoint_every == 0)
                TD_TRY(save(&t));
            if (went_back(&t, ev.step))
                continue;
            if (cfg->eval_every > 0 && t.state.step % cfg->eval_every == 0) {
                ev.kind = TD_TRAIN_EVENT_EVAL;
                TD_TRY(eval_test(&t, &ev.eval_loss, &ev.eval_accuracy));
                if (went_back(&t, ev.step)) /* evaluated again when it comes back */
                    continue;
                last_eval_loss = ev.eval_loss;
                last_eval_acc = ev.eval_accuracy;
                last_eval_step = t.state.step;
                ev.elapsed_s = now_s(&t);
                metrics_line(&t, "eval", &ev);
                if (cfg->callback && cfg->callback(cfg->callback_arg, &ev))
                    stop = out->stopped = 1;
            }
        }
    }
    /* The end: a final evaluation unless the last epoch's end just made one. */
    steps_taken = t.state.step;
    if (last_eval_step != t.state.step)
        TD_TRY(eval_test(&t, &last_eval_loss, &last_eval_acc));
    if (t.ep_count > 0)
        out->final_loss = t.ep_loss / (double)t.ep_count;
    TD_TRY(save(&t));
    /* A device lost in those sent the run back to an earlier checkpoint: the
     * steps from there are still to take. */
    if (went_back(&t, steps_taken) && !stop)
        goto train_on;
    snprintf(out->device, sizeof out->device, "%s", td_device_name(t.dev));
    out->devices_named = (int)td_device_list_count(t.devs);
    out->root = t.root;
    finish_member_stats(&t, out);
    out->steps = t.state.step;
    td_loader_position(t.loader, &last_epoch, NULL);
    out->epochs_done = last_epoch - first_epoch;
    out->samples = t.samples;
    out->train_seconds = t.train_seconds;
    out->samples_per_s = t.train_seconds > 0 ? (double)t.samples / t.train_seconds : 0;
    out->test_loss = last_eval_loss;
    out->test_accuracy = last_eval_acc;
    {
        td_dataset_info ti;
        td_dataset_get_info(t.test, &ti);
        out->test_samples =
            cfg->eval_samples > 0 && cfg->eval_samples < ti.size ? cfg->eval_samples : ti.size;
    }
    memset(&ev, 0, sizeof ev);
    ev.kind = TD_TRAIN_EVENT_DONE;
    ev.step = t.state.step;
    ev.total_steps = t.state.opt.total_steps;
    td_loader_position(t.loader, &ev.epoch, NULL);
    ev.batches_per_epoch = bpe;
    ev.loss = out->final_loss;
    ev.accuracy = t.ep_count ? (double)t.ep_correct / (double)t.ep_count : NAN;
    ev.lr = td_optimizer_lr(t.opt);
    ev.samples_per_s = out->samples_per_s;
    ev.eval_loss = last_eval_loss;
    ev.eval_accuracy = last_eval_acc;
    ev.elapsed_s = now_s(&t);
    metrics_line(&t, "done", &ev);
    if (cfg->callback)
        cfg->callback(cfg->callback_arg, &ev);
    teardown(&t);
    return TD_OK;
fail:
    teardown(&t);
    return st;
}
