/* tandem train: trains a model described in JSON on a data set. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "monitor.h"
#include "tandem/tandem.h"

/* The table of the members of a run over several devices: each one's share
 * and where its time went, in the words of the strategy that ran
 * (td_strategy_report: its plan above, its columns, its note below). */
static void print_members(const td_train_summary *s) {
    const td_strategy_report *w = &s->report;
    if (w->show_plan)
        printf("\n%s", s->plan);
    printf("\n%-14s %9s %7s %11s %10s %10s %10s %8s\n", "device", "samples", "share", "compute s",
           w->comm_label, "update s", w->wait_label, "parked");
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
    printf("%s%s\n", w->note, w->note[0] ? "\n" : "");
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
    td_cli_monitor *monitor; /* --monitor; NULL: none */
} progress;

/* The progress line: the epoch, a bar of its batches, loss, throughput. */
static void format_bar(const progress *p, const td_train_event *ev, char *buf, size_t n) {
    char bar[31];
    int64_t total = ev->batches_per_epoch > 0 ? ev->batches_per_epoch : 1;
    int filled = (int)(30 * ev->batch_in_epoch / total);
    for (int i = 0; i < 30; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[30] = '\0';
    char of[32] = "";
    if (p->epochs > 0)
        snprintf(of, sizeof of, "/%lld", (long long)p->epochs);
    snprintf(buf, n, "epoch %lld%s [%s] %lld/%lld  loss %.4f  %.0f samples/s",
             (long long)ev->epoch + 1, of, bar, (long long)ev->batch_in_epoch, (long long)total,
             ev->loss, ev->samples_per_s);
}

static void draw_bar(progress *p, const td_train_event *ev) {
    char line[160];
    format_bar(p, ev, line, sizeof line);
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
}

/* Erases what the progress display drew on the terminal, before a line. */
static void clear_progress(progress *p) {
    if (p->monitor)
        td_cli_monitor_clear(p->monitor);
    else if (p->tty)
        fprintf(stderr, "\r\033[K");
}

static int on_event(void *arg, const td_train_event *ev) {
    progress *p = arg;
    if (interrupted == 1) {
        interrupted = 2;
        clear_progress(p);
        fprintf(stderr, "interrupted: stopping after this step (Ctrl-C again to quit now)\n");
        return 1;
    }
    if (p->quiet || !ev->root) /* under mpirun, rank 0's process reports */
        return 0;
    if (ev->kind == TD_TRAIN_EVENT_STEP) {
        uint64_t now = td_clock_ns();
        if (p->monitor) { /* it draws the progress line too, on a terminal */
            char head[160];
            format_bar(p, ev, head, sizeof head);
            td_cli_monitor_step(p->monitor, ev, head);
        }
        if (p->tty && !p->monitor && now - p->last_draw > 100000000ull) {
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
    clear_progress(p);
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

/* After the run, in the process that reports. */
static void report(const td_cli_train_args *a, const td_train_summary *sum) {
    printf("final test accuracy: %.2f%% (%lld samples, loss %.4f)  %lld steps, %.0f samples/s, "
           "%.1f s training\n",
           100 * sum->test_accuracy, (long long)sum->test_samples, sum->test_loss,
           (long long)sum->steps, sum->samples_per_s, sum->train_seconds);
    if (sum->samples > 0 && sum->max_lr == 0)
        fprintf(stderr, "tandem train: warning: the learning rate was 0 in every step of this run, "
                        "so no weight changed (--lr, --min-lr, --schedule; resuming: --extend)\n");
    if (sum->members > 1)
        print_members(sum);
    else if (sum->devices_named > 1)
        printf("trained on %s, the first of the %d devices --devices named (--strategy data "
               "or pipeline trains on all)\n",
               sum->device, sum->devices_named);
    if (sum->precision[0])
        printf("precision: %s\n", sum->precision);
    if (a->cfg.checkpoint)
        printf("checkpoint: %s\n", a->cfg.checkpoint);
    if (a->summary)
        printf("summary: {\"steps\":%lld,\"epochs\":%lld,\"samples\":%lld,\"train_seconds\":%.4f,"
               "\"samples_per_s\":%.2f,\"final_loss\":%.6g,\"test_loss\":%.6g,"
               "\"test_accuracy\":%.6g,\"test_samples\":%lld,\"stopped\":%s}\n",
               (long long)sum->steps, (long long)sum->epochs_done, (long long)sum->samples,
               sum->train_seconds, sum->samples_per_s,
               isnan(sum->final_loss) ? -1 : sum->final_loss,
               isnan(sum->test_loss) ? -1 : sum->test_loss,
               isnan(sum->test_accuracy) ? -1 : sum->test_accuracy, (long long)sum->test_samples,
               sum->stopped ? "true" : "false");
}

int td_cli_train(int argc, char **argv) {
    td_cli_train_args a;
    td_train_summary sum;
    progress prog = {0};
    td_status st;
    int rc = td_cli_train_parse(argc, argv, stderr, &a);
    if (rc != 0)
        return rc;
    if (a.help) {
        td_cli_train_usage(stdout);
        return 0;
    }
    prog.quiet = a.quiet;
    prog.tty = isatty(STDERR_FILENO);
    prog.epochs = a.cfg.epochs;
    if (a.monitor && !(prog.monitor = td_cli_monitor_create(stderr, prog.tty))) {
        fprintf(stderr, "tandem train: out of memory for --monitor\n");
        return 1;
    }
    a.cfg.callback = on_event;
    a.cfg.callback_arg = &prog;
    signal(SIGINT, on_sigint);
    st = td_train_run(&a.cfg, &sum);
    td_cli_monitor_destroy(prog.monitor);
    if (st != TD_OK) {
        rc = td_cli_fail("train", st);
        return sum.bad_setting ? 2 : rc;
    }
    if (sum.root) /* under mpirun, rank 0's process reports */
        report(&a, &sum);
    return 0;
}
