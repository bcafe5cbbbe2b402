/* The training loop: data, a strategy over the devices, evaluation,
 * metrics, checkpoints and resume (setting up and taking down: train_setup.c).
 *
 * The run's devices form a group (across processes under mpirun) and a
 * strategy (src/parallel: single, data, pipeline, tensor) holds the model.
 * One step is: the loader's next host batch -> td_strategy_step(). The loop
 * is the same for every strategy: it evaluates, saves and resumes through
 * the strategy, and a device lost in any of those goes to recovery.c, which
 * carries on over the survivors or goes back to the newest checkpoint. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/trace.h"
#include "train/train-impl.h"

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

/* The strategy's words for the member table, from the run's figures. */
static void report_words(td__trainer *t, td_train_summary *out) {
    td_run_figures f = {.steps = t->stat_steps,
                        .hidden = out->hidden,
                        .ideal_ratio = out->ideal_ratio,
                        .buckets = out->buckets,
                        .buckets_in_backward = out->buckets_in_backward};
    td_strategy_report_make(t->s, &f, &out->report);
}

static void finish_member_stats(td__trainer *t, td_train_summary *out) {
    int64_t steps = t->stat_steps > 0 ? t->stat_steps : 1;
    for (int r = 0; r < out->members; r++)
        out->member[r].share = t->batch_samples > 0 ? t->share_sum[r] / t->batch_samples : 0;
    out->hidden /= (double)steps;
    out->ideal_ratio /= (double)steps;
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
    report_words(t, out);
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
    if ((st = td__train_setup(&t)) == TD_OK) {
        t.bpe = td_loader_batches_per_epoch(t.loader);
        /* Epochs are counted from the loader's place, which a return to a
         * checkpoint sets back, so an epoch trained twice counts once. */
        td_loader_position(t.loader, &first_epoch, NULL);
        if ((st = train(&t)) == TD_OK)
            finish(&t, first_epoch);
        st = td__train_trace_end(&t, st);
    }
    td__train_teardown(&t);
    return st;
}
