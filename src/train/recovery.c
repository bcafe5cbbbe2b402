/* Training on after a lost device.
 *
 * A call on the strategy (a step, a checkpoint, an evaluation) failed with
 * TD_ERR_DEVICE_LOST in a group of this process's devices. The strategy
 * names the survivors; then either it carries on over them from the state
 * they hold (the data strategy with its optimizer replicated: the most
 * advanced survivor's replica), and says whether the failed step's update
 * was made, or the lost device held state no survivor has (a ZeRO-1 shard,
 * the only current replica, a pipeline's stage) and the run goes back to
 * its newest checkpoint: the strategy made afresh over the survivors and
 * loaded from it, the loader set back, as a run resumed from there on those
 * devices would go. Without a checkpoint the loss ends the run, with why.
 *
 * A lost device's host thread may never come back from the failed call (a
 * device hung for good): the strategy and group it may still touch are then
 * kept allocated to the end of the process. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "train/train-impl.h"

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kept_setup {
    td_strategy *s;
    td_group *g;
} kept[64];
static int nkept;

/* Whether a device of g that is not in the run's group now (a lost one)
 * still runs a task: its host thread has not come back from the call. */
static int lost_thread_out(const td__trainer *t, const td_group *g) {
    for (int r = 0; r < td_group_size(g); r++) {
        td_device *dev = td_group_device(g, r);
        if (dev && td_group_rank_of(t->group, dev) < 0 && td_device_busy(dev))
            return 1;
    }
    return 0;
}

/* Frees the strategy and group the run has left behind, unless a lost
 * device's host thread is still out in the failed call: then they are kept
 * (leaked once the list is full: freeing them could pull memory from under
 * the thread). */
static void retire(td__trainer *t, td_strategy *s, td_group *g) {
    if (!lost_thread_out(t, g)) {
        td_strategy_destroy(s);
        td_group_destroy(g);
        return;
    }
    TD_LOG_WARN("a lost device's host thread has not come back from the step; its group's "
                "replicas stay allocated while it may touch them");
    pthread_mutex_lock(&kept_lock);
    if (nkept < (int)(sizeof kept / sizeof *kept))
        kept[nkept++] = (struct kept_setup){s, g};
    pthread_mutex_unlock(&kept_lock);
}

/* The run goes on with s over survivors: the old ones retired, the shares
 * measured afresh. */
static td_status take_over(td__trainer *t, td_strategy *s, td_group *survivors) {
    td_strategy *old_s = t->s;
    td_group *old_group = t->group;
    t->s = s;
    t->group = survivors;
    retire(t, old_s, old_group);
    return td__train_calibrate(t);
}

/* The survivors go back to the run's newest checkpoint: weights, optimizer
 * state, step and the loader's place all as it saved them. Takes
 * survivors. */
static td_status rewind_to_checkpoint(td__trainer *t, td_group *survivors, const char *gone,
                                      const char *why, const char *what_went) {
    td_strategy *s = NULL;
    td_train_state saved;
    td_status st;
    if ((st = td_strategy_create(survivors, t->json, t->model_name, &t->scfg, &s)) != TD_OK ||
        (st = td_strategy_load(s, t->saved, &saved)) != TD_OK ||
        (st = td_loader_seek(t->loader, saved.epoch, saved.sample)) != TD_OK) {
        td_strategy_destroy(s);
        td_group_destroy(survivors);
        return td__error_prefix(st, "going back to %s after %s was lost: ", t->saved, gone);
    }
    TD_LOG_WARN("step %lld: %s lost (%s); %s, so training goes back to %s (step %lld) and goes "
                "on with the other %d device%s",
                (long long)t->state.step + 1, gone, why, what_went, t->saved, (long long)saved.step,
                td_group_size(survivors), td_group_size(survivors) == 1 ? "" : "s");
    for (int i = 0; i < t->summary->members; i++)
        if (t->summary->member[i].lost_at_step == t->state.step + 1)
            t->summary->member[i].back_to_step = saved.step;
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"event\":\"rewind\",\"step\":%lld,\"to_step\":%lld,\"lost\":\"%s\"}\n",
                (long long)t->state.step, (long long)saved.step, gone);
        fflush(t->metrics);
    }
    t->state = saved;
    /* As a resumed run starts: the epoch's numbers afresh. */
    t->ep_loss = 0;
    t->ep_correct = t->ep_count = t->ep_samples = t->ep_batches = 0;
    t->ep_seconds = 0;
    return take_over(t, s, survivors);
}

/* The run cannot go back: no checkpoint was written yet. Says what to give
 * only when something is missing; with both given, when the first comes. */
static td_status no_checkpoint_yet(td__trainer *t, td_status lost, const char *why,
                                   const char *what_went) {
    const td_train_config *c = t->cfg;
    if (!c->checkpoint)
        return td__error_setting(lost, "checkpoint",
                                 "%s (%s, and this run has no checkpoint to go back to: give "
                                 "`checkpoint` with `checkpoint_every`)",
                                 why, what_went);
    if (c->checkpoint_every <= 0)
        return td__error_setting(lost, "checkpoint_every",
                                 "%s (%s, and this run saves %s only at its end, so there is no "
                                 "checkpoint to go back to: give `checkpoint_every` too)",
                                 why, what_went, c->checkpoint);
    return td__error_setting(lost, "checkpoint_every",
                             "%s (%s, and there is no checkpoint to go back to yet: the first is "
                             "saved after step %lld (`checkpoint_every` %lld), and step %lld "
                             "failed)",
                             why, what_went, (long long)c->checkpoint_every,
                             (long long)c->checkpoint_every, (long long)t->state.step + 1);
}

td_status td__train_carry_on(td__trainer *t, td_status lost, int64_t steps_before,
                             td__after_loss *after) {
    char why[1024], gone[256] = "";
    const char *what_went = NULL;
    td_group *survivors = NULL, *old_group = t->group;
    td_strategy *next = NULL;
    int taken = 0;
    td_status st;
    snprintf(why, sizeof why, "%s", td_last_error());
    *after = TD__STEP_TO_REDO;
    if (strcmp(td_group_transport(old_group), "local"))
        return td__error(lost, "%s (a group over %s does not carry on without a member)", why,
                         td_group_transport(old_group));
    if ((st = td_strategy_survivors(t->s, &survivors)) != TD_OK) {
        char none[512];
        snprintf(none, sizeof none, "%s", td_last_error());
        return td__error(st, "%s (%s)", why, none);
    }
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
            td__train_member_row(t, r)->lost_at_step = t->state.step + 1;
            snprintf(gone + strlen(gone), sizeof gone - strlen(gone), "%s%s", *gone ? ", " : "",
                     td_device_name(td_group_device(old_group, r)));
        }
    st = td_strategy_carry_on(t->s, survivors, steps_before, &next, &taken, &what_went);
    if (st == TD_ERR_UNSUPPORTED && what_went) {
        if (!t->saved) {
            td_group_destroy(survivors);
            return no_checkpoint_yet(t, lost, why, what_went);
        }
        *after = TD__STEPS_REWOUND;
        return rewind_to_checkpoint(t, survivors, gone, why, what_went);
    }
    if (st != TD_OK) {
        td_group_destroy(survivors);
        return st;
    }
    *after = taken ? TD__STEP_TAKEN : TD__STEP_TO_REDO;
    TD_LOG_WARN("step %lld: %s lost (%s); training goes on with the other %d device%s",
                (long long)t->state.step + 1, gone, why, td_group_size(survivors),
                td_group_size(survivors) == 1 ? "" : "s");
    return take_over(t, next, survivors);
}

td_status td__train_despite_lost(td__trainer *t, td_status (*op)(td__trainer *)) {
    td_status st;
    while ((st = op(t)) == TD_ERR_DEVICE_LOST) {
        td__after_loss after;
        TD_CHECK(td__train_carry_on(t, st, td_strategy_steps(t->s), &after));
    }
    return st;
}
