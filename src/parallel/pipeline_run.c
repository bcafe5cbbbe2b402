/* One step of the `pipeline` strategy on its stages: the channels between
 * neighbouring stages, the 1F1B schedule each member runs on its own host
 * thread, the gradient norm summed over the stages, and the gathering of
 * each stage's numbers (see pipeline.c for the whole design). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/trace.h"
#include "parallel/pipeline-impl.h"
#include "parallel/strategy-impl.h"

/* Channels ---------------------------------------------------------------- */

static void chan_reset(channel *c) {
    pthread_mutex_lock(&c->mu);
    c->posted = c->consumed = 0;
    pthread_mutex_unlock(&c->mu);
}

/* Whether message j of c was posted (or, for_consumed, taken); under c->mu. */
static int reached(const channel *c, int64_t j, int for_consumed) {
    return for_consumed ? c->consumed > j : c->posted > j;
}

/* Waits until message j is reached (above), the pipeline aborts, or the group's timeout
 * passes; `what` names what is awaited, `who` from whom. */
static td_status chan_wait(pipeline *p, channel *c, int64_t j, int for_consumed, const char *what,
                           int who) {
    struct timespec now, until;
    uint64_t deadline = td_clock_ns() + (uint64_t)td_group_timeout_ms(p->g) * 1000000u;
    td_status st = TD_OK;
    pthread_mutex_lock(&c->mu);
    while (!reached(c, j, for_consumed) && st == TD_OK) {
        if (__atomic_load_n(&p->abort, __ATOMIC_ACQUIRE))
            st = td__error(TD_ERR_DEVICE_LOST, "pipeline: stopped, another stage failed");
        else if (td_clock_ns() > deadline)
            st = td__error(TD_ERR_DEVICE_LOST,
                           "pipeline: %s (%s) did not %s micro-batch %lld within %d ms",
                           td_device_name(p->st[who].dev), what, for_consumed ? "take" : "send",
                           (long long)j, td_group_timeout_ms(p->g));
        else {
            clock_gettime(CLOCK_REALTIME, &now);
            until = now;
            until.tv_nsec += 20000000; /* wake to look at the group and the deadline */
            if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&c->cv, &c->mu, &until);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static int chan_ready(channel *c, int64_t j, int for_consumed) {
    int ready;
    pthread_mutex_lock(&c->mu);
    ready = reached(c, j, for_consumed);
    pthread_mutex_unlock(&c->mu);
    return ready;
}

static void chan_post(channel *c, int64_t j, const td_buffer *buf) {
    pthread_mutex_lock(&c->mu);
    c->buf[j % TD_PP_MAX_SLOTS] = buf;
    c->posted = j + 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Into c's host copy of message j, `bytes` of buf, on the sender's thread;
 * the place is free, as the message before it there was taken (wait_taken). */
static td_status stage_on_host(channel *c, int64_t j, const td_buffer *buf, size_t bytes) {
    int at = (int)(j % TD_PP_MAX_SLOTS);
    if (c->host_bytes[at] < bytes) {
        free(c->host[at]);
        c->host_bytes[at] = 0;
        if (!(c->host[at] = td__aligned_alloc(bytes, "a pipeline message on the host")))
            return TD_ERR_OUT_OF_MEMORY;
        c->host_bytes[at] = bytes;
    }
    return td_buffer_read(buf, 0, c->host[at], bytes);
}

/* Posts `bytes` of buf as message j of c, from stage s, staged on the host
 * where c says so (the time counted as s's transfer). */
static td_status send(stage *s, channel *c, int64_t j, const td_buffer *buf, size_t bytes) {
    if (c->staged) {
        uint64_t t0 = td_clock_ns();
        td_status st = stage_on_host(c, j, buf, bytes);
        s->comm_s += (double)(td_clock_ns() - t0) * 1e-9;
        TD_CHECK(st);
    }
    chan_post(c, j, buf);
    return TD_OK;
}

static void chan_consumed(channel *c, int64_t j) {
    pthread_mutex_lock(&c->mu);
    c->consumed = j + 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void abort_all(pipeline *p) {
    __atomic_store_n(&p->abort, 1, __ATOMIC_RELEASE);
    for (int k = 0; k < p->size; k++) {
        /* the other replicas' stage k may be waiting for this one's sum */
        if (p->st[k].across)
            td_group_abort(p->st[k].across, "a stage of another replica failed");
        if (p->st[k].tgroup) /* likewise the members splitting a stage with it */
            td_group_abort(p->st[k].tgroup, "another pipeline of the mesh failed");
        pthread_mutex_lock(&p->fwd[k].mu);
        pthread_cond_broadcast(&p->fwd[k].cv);
        pthread_mutex_unlock(&p->fwd[k].mu);
        pthread_mutex_lock(&p->bwd[k].mu);
        pthread_cond_broadcast(&p->bwd[k].cv);
        pthread_mutex_unlock(&p->bwd[k].mu);
    }
}

/* Grows the stage's receive buffer to at least `bytes` (on its own thread). */
static td_status ensure_recv(stage *s, size_t bytes) {
    if (s->recv_bytes >= bytes)
        return TD_OK;
    td_buffer_free(s->recv);
    s->recv = NULL;
    s->recv_bytes = 0;
    TD_CHECK(td_buffer_alloc(s->dev, bytes, &s->recv));
    s->recv_bytes = bytes;
    return TD_OK;
}

/* The span from t0 (td__trace_begin's) to now, of micro-batch j. */
static void trace_micro(uint64_t t0, td__trace_cat cat, const char *name, int64_t j) {
    if (t0) {
        td__trace_rec r = {.t0 = t0, .name = name, .bytes = -1, .item = (int32_t)j, .cat = cat};
        td__trace_add(&r);
    }
}

/* Deferred weight gradients ------------------------------------------------
 *
 * A stage sends its input's gradient on as soon as it has it and computes
 * its weight gradients afterwards: while it waits for a neighbour, or when
 * the micro-batch's slot is wanted for the next forward, or at the end of
 * the step. So the stage before gets its gradient one weight-GEMM pass
 * earlier, and the tail of the step, where the first stage waits for the
 * last micro-batch to come back, is filled with the weight gradients it
 * still owes. Each micro-batch's weights are done in order, with the flag
 * its backward had: the gradients are bitwise those of a fused backward. */

/* The weight gradients of micro-batches before `upto`, in one pass over
 * the layers. */
static td_status weights_upto(stage *s, int64_t upto) {
    int slots[MAX_MICRO];
    int64_t end = upto < s->b_done ? upto : s->b_done, n = end - s->w_next;
    uint64_t t0, tr;
    td_status st;
    if (n < 1)
        return TD_OK;
    for (int64_t j = s->w_next; j < end; j++)
        slots[j - s->w_next] = (int)(j % s->slots);
    t0 = td_clock_ns();
    tr = td__trace_begin();
    st = td_model_part_backward_weights_many(s->part, slots, (int)n);
    trace_micro(tr, TD__TRACE_COMPUTE, "weight gradients", s->w_next);
    s->compute_s += (double)(td_clock_ns() - t0) * 1e-9;
    if (st == TD_OK)
        s->w_next = end;
    return st;
}

/* Until message j of c is there (or taken), does weight gradients owed. */
static td_status weights_while_waiting(stage *s, channel *c, int64_t j, int for_consumed) {
    while (s->w_next < s->b_done && !chan_ready(c, j, for_consumed))
        TD_CHECK(weights_upto(s, s->w_next + 1));
    return TD_OK;
}

/* Takes message j of c (from member `from`) into the stage's receive buffer. */
static td_status receive(pipeline *p, stage *s, channel *c, int64_t j, int from, size_t bytes) {
    uint64_t t1, tr;
    td_status st;
    TD_CHECK(weights_while_waiting(s, c, j, 0));
    tr = td__trace_begin();
    st = chan_wait(p, c, j, 0, "the stage before or after", from);
    const td_buffer *src;
    t1 = td_clock_ns();
    trace_micro(tr, TD__TRACE_WAIT, "wait for neighbour", j);
    if (st == TD_OK)
        st = ensure_recv(s, bytes);
    if (st != TD_OK)
        return st;
    pthread_mutex_lock(&c->mu);
    src = c->buf[j % TD_PP_MAX_SLOTS];
    pthread_mutex_unlock(&c->mu);
    st = c->staged ? td_buffer_write(s->recv, 0, c->host[j % TD_PP_MAX_SLOTS], bytes)
                   : td_buffer_copy(s->recv, 0, src, 0, bytes);
    s->comm_s += (double)(td_clock_ns() - t1) * 1e-9;
    if (st == TD_OK)
        chan_consumed(c, j);
    return st;
}

/* Before a stage overwrites the buffer it posted for micro-batch j - slots
 * (the same slot), the neighbour must have taken it. */
static td_status wait_taken(pipeline *p, stage *s, channel *c, int64_t j, int to) {
    uint64_t tr;
    td_status st = TD_OK;
    if (j < s->slots)
        return TD_OK;
    TD_CHECK(weights_while_waiting(s, c, j - s->slots, 1));
    tr = td__trace_begin();
    st = chan_wait(p, c, j - s->slots, 1, "the next stage", to);
    trace_micro(tr, TD__TRACE_WAIT, "wait for neighbour to take", j - s->slots);
    return st;
}

/* The schedule ------------------------------------------------------------ */

static size_t act_bytes(const pipeline *p, int layer, int64_t n) {
    const td_layer_info *li = &p->layers[layer];
    size_t e = (size_t)n;
    for (int d = 0; d < li->out_ndim; d++)
        e *= (size_t)li->out_shape[d];
    return e * (p->s->cfg.dtype == TD_F64 ? 8 : 4);
}

/* Micro-batch j of the step, a view into the batch (evaluation's are views
 * already). */
static td_batch micro(const pipeline *p, int64_t j) {
    int64_t lps = p->info.kind == TD_INPUT_TOKENS ? p->info.in_shape[0] : 1, feats = 1;
    const td_batch *b = p->batch;
    td_batch mb;
    if (p->evals)
        return p->evals[j];
    for (int d = 0; d < p->info.in_ndim; d++)
        feats *= p->info.in_shape[d];
    mb.n = p->cnt[j];
    mb.x = b->x ? b->x + p->off[j] * feats : NULL;
    mb.tokens = b->tokens ? b->tokens + p->off[j] * feats : NULL;
    mb.labels = b->labels ? b->labels + p->off[j] * lps : NULL;
    return mb;
}

static td_status forward(pipeline *p, stage *s, int k, int64_t j) {
    td_batch mb = micro(p, j);
    int slot = (int)(j % s->slots), first, end;
    const td_buffer *in = NULL;
    td_step_result r;
    uint64_t t0, tr;
    td_status st;
    td_model_part_range(s->part, &first, &end, NULL);
    if (p->prev[k] >= 0) {
        TD_CHECK(receive(p, s, &p->fwd[p->prev[k]], j, p->prev[k], act_bytes(p, first - 1, mb.n)));
        in = s->recv;
    }
    if (p->next[k] >= 0)
        TD_CHECK(wait_taken(p, s, &p->fwd[k], j, p->next[k]));
    if (p->train) /* the slot's last micro-batch must be done with it */
        TD_CHECK(weights_upto(s, j - s->slots + 1));
    t0 = td_clock_ns();
    tr = td__trace_begin();
    st = td_model_part_forward(s->part, slot, &mb, p->evals ? 0 : p->first + p->off[j], in,
                               p->train, p->step, p->grad_scale, &r);
    trace_micro(tr, TD__TRACE_COMPUTE, "forward", j);
    s->compute_s += (double)(td_clock_ns() - t0) * 1e-9;
    if (st != TD_OK)
        return st;
    if (p->next[k] >= 0)
        TD_CHECK(send(s, &p->fwd[k], j, td_model_part_output(s->part, slot),
                      act_bytes(p, end - 1, mb.n)));
    else if (p->evals) { /* micro-batches end in order: each batch's sum in one order */
        td_step_result *e = &p->eval_res[p->eval_of[j]];
        e->loss_sum += r.loss_sum;
        e->correct += r.correct;
        e->count += r.count;
    } else {
        s->res.loss_sum += r.loss_sum;
        s->res.correct += r.correct;
        s->res.count += r.count;
    }
    return TD_OK;
}

static td_status backward(pipeline *p, stage *s, int k, int64_t j) {
    int slot = (int)(j % s->slots), first, end;
    const td_buffer *dout = NULL;
    uint64_t t0, tr;
    td_status st;
    td_model_part_range(s->part, &first, &end, NULL);
    if (p->next[k] >= 0) {
        TD_CHECK(
            receive(p, s, &p->bwd[p->next[k]], j, p->next[k], act_bytes(p, end - 1, p->cnt[j])));
        dout = s->recv;
    }
    if (p->prev[k] >= 0)
        TD_CHECK(wait_taken(p, s, &p->bwd[k], j, p->prev[k]));
    t0 = td_clock_ns();
    tr = td__trace_begin();
    st = td_model_part_backward_input(s->part, slot, dout, j > 0);
    trace_micro(tr, TD__TRACE_COMPUTE, "backward", j);
    s->compute_s += (double)(td_clock_ns() - t0) * 1e-9;
    if (st != TD_OK)
        return st;
    s->b_done = j + 1;
    if (p->prev[k] >= 0)
        TD_CHECK(send(s, &p->bwd[k], j, td_model_part_input_grad(s->part, slot),
                      act_bytes(p, first - 1, p->cnt[j])));
    return TD_OK;
}

/* The step's tail carried over --------------------------------------------
 *
 * Every stage but the first waits at the start of a step for its first
 * input, which comes through the stages before it. So such a stage does not
 * finish its step: once its last backward has gone back it pays the weight
 * gradients it owes only until the first stage has finished, and it takes
 * the rest and its optimizer step at the start of the next step (or before
 * anything reads its weights, td__pp_settle), while its input is on the way.
 * The sums and their order are unchanged. Clipping's norm is a collective
 * over all the stages' updates, so with clipping every stage finishes. */

int td__pp_tails_carry(const td_optimizer_config *opt) {
    return !(opt->clip_norm > 0);
}

/* Replicas (a mesh) take their updates within the step: a tail carried
 * into the next step would have its cross-replica sum wait for the others
 * outside their run (a checkpoint settles one replica alone). */
static int carries_tail(const pipeline *p, int k) {
    return p->train && p->prev[k] >= 0 && !p->st[k].across && td__pp_tails_carry(&p->s->cfg.opt);
}

/* On the group across the replicas: the stage's gradients summed. */
static td_status sum_across(td_group *g, td_device *dev, int rank, int size, void *arg) {
    stage *s = arg;
    (void)dev, (void)rank, (void)size;
    for (size_t i = 0; i < td_model_param_count(s->part); i++)
        TD_CHECK(td_allreduce_tensor(g, td_model_grad(s->part, i), TD_REDUCE_SUM));
    return TD_OK;
}

static td_status update(stage *s) {
    uint64_t t0 = td_clock_ns();
    td_status st;
    if (s->across) { /* the same stage of every replica: their gradients summed first */
        TD_CHECK(td_group_join(s->across, sum_across, s));
        s->comm_s += (double)(td_clock_ns() - t0) * 1e-9;
        t0 = td_clock_ns();
    }
    st = td_optimizer_step(s->opt, NULL);
    s->update_s += (double)(td_clock_ns() - t0) * 1e-9;
    return st;
}

/* The weight gradients and the optimizer step a stage still owes from the
 * step before; then, as after a failed step, any weight gradients owed (their
 * slots refuse a forward until paid). */
static td_status settle(stage *s) {
    TD_CHECK(weights_upto(s, s->b_done));
    if (s->update_owed) {
        TD_CHECK(update(s));
        s->update_owed = 0;
    }
    s->w_next = s->b_done = 0;
    return TD_OK;
}

/* Weight gradients owed, one micro-batch at a time, until the first stage
 * has finished the step. */
static td_status weights_while_first_runs(pipeline *p, stage *s) {
    while (s->w_next < s->b_done && !__atomic_load_n(&p->first_done, __ATOMIC_ACQUIRE))
        TD_CHECK(weights_upto(s, s->w_next + 1));
    return TD_OK;
}

/* Forwards stage k runs before its first backward: as many as its slots
 * hold, so that the stages after it never wait for an input; but none on
 * the last stage, which nobody waits on for an input, while the stages
 * before it wait for each gradient it sends back. */
static int64_t forwards_ahead(const pipeline *p, const stage *s, int k) {
    if (p->next[k] < 0)
        return 0;
    return s->slots - 1 < p->m ? s->slots - 1 : p->m;
}

/* Stage k's share of a step: 1F1B, with forwards ahead (above), then its
 * optimizer step (or the step's tail, carried over). */
static td_status run_schedule(pipeline *p, stage *s, int k) {
    int64_t m = p->m, warm = forwards_ahead(p, s, k);
    TD_CHECK(settle(s));
    if (!p->train) {
        for (int64_t j = 0; j < m; j++)
            TD_CHECK(forward(p, s, k, j));
        return TD_OK;
    }
    for (int64_t j = 0; j < warm; j++)
        TD_CHECK(forward(p, s, k, j));
    for (int64_t j = 0; j < m; j++) {
        if (j + warm < m)
            TD_CHECK(forward(p, s, k, j + warm));
        TD_CHECK(backward(p, s, k, j));
    }
    if (carries_tail(p, k)) {
        s->update_owed = 1;
        return weights_while_first_runs(p, s);
    }
    TD_CHECK(weights_upto(s, m));
    TD_CHECK(update(s));
    if (p->prev[k] < 0)
        __atomic_store_n(&p->first_done, 1, __ATOMIC_RELEASE);
    return TD_OK;
}

/* The squared norm of every stage's gradients, for clipping (each stage's
 * optimizer calls it from its step). Each stage's terms go into its own
 * places of a model-long vector that is summed over the stages: only one
 * stage's term is not zero in each place, so the sum is exact, and the terms
 * then add up in the model's order: the norm is one device's, bitwise,
 * wherever the cuts fall. */
static td_status sum_terms_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    stage *s = arg;
    (void)dev, (void)rank, (void)size;
    return td_allreduce(g, s->terms, 0, s->terms, 0, s->p->nterms, TD_F64, TD_REDUCE_SUM);
}

td_status td__pp_sum_over_stages(void *arg, const double *terms, size_t n, double *sumsq) {
    stage *s = arg;
    pipeline *p = s->p;
    double sum = 0;
    memset(s->terms_host, 0, sizeof(double) * p->nterms);
    if (n)
        memcpy(s->terms_host + s->term_first, terms, sizeof(double) * n);
    TD_CHECK(td_buffer_write(s->terms, 0, s->terms_host, sizeof(double) * p->nterms));
    TD_CHECK(td_allreduce(s->group, s->terms, 0, s->terms, 0, p->nterms, TD_F64, TD_REDUCE_SUM));
    if (s->tgroup) /* and over the members that split the stages: the shards' terms */
        TD_CHECK(td_group_join(s->tgroup, sum_terms_member, s));
    TD_CHECK(td_buffer_read(s->terms, 0, s->terms_host, sizeof(double) * p->nterms));
    for (size_t i = 0; i < p->nterms; i++)
        sum += s->terms_host[i];
    *sumsq = sum;
    return TD_OK;
}

static td_status gather_stats(td_group *g, stage *s) {
    td__member_row row = {.compute_s = s->compute_s,
                          .comm_s = s->comm_s,
                          .update_s = s->update_s,
                          .loss_sum = s->res.loss_sum,
                          .correct = (double)s->res.correct,
                          .count = (double)s->res.count};
    return td__rows_gather(g, &s->rows, &row);
}

static td_status member_run(td_group *g, td_device *dev, int rank, int size, void *arg) {
    pipeline *p = arg;
    stage *s = &p->st[rank];
    td_status st = TD_OK;
    (void)dev, (void)size;
    s->compute_s = s->comm_s = s->update_s = 0;
    memset(&s->res, 0, sizeof s->res);
    if (s->part)
        st = run_schedule(p, s, rank);
    else if (p->train && p->s->cfg.opt.clip_norm > 0) { /* the others' norm waits for ours */
        double zero = 0;
        st = td__pp_sum_over_stages(s, NULL, 0, &zero);
    }
    if (st != TD_OK) {
        abort_all(p);
        return st;
    }
    return p->evals ? TD_OK : gather_stats(g, s);
}

/* Splits a batch of n samples into p->m micro-batches as even as can be. */
void td__pp_split(pipeline *p, int64_t n) {
    int64_t off = 0;
    p->m = p->micro_batches < n ? p->micro_batches : n;
    for (int64_t j = 0; j < p->m; j++) {
        p->cnt[j] = n / p->m + (j < n % p->m);
        p->off[j] = off;
        off += p->cnt[j];
    }
}

static td_status settle_member(td_group *g, td_device *dev, int rank, int size, void *arg) {
    stage *s = &((pipeline *)arg)->st[rank];
    (void)g, (void)dev, (void)size;
    return s->part ? settle(s) : TD_OK;
}

td_status td__pp_settle(pipeline *p) {
    return td_group_run(p->g, settle_member, p);
}

td_status td__pp_run(pipeline *p) {
    __atomic_store_n(&p->abort, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&p->first_done, 0, __ATOMIC_RELEASE);
    for (int k = 0; k < p->size; k++) {
        chan_reset(&p->fwd[k]);
        chan_reset(&p->bwd[k]);
    }
    return td_group_run(p->g, member_run, p);
}
