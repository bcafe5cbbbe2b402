/* A step of the `mirror` strategy (mirror-impl.h). Every member runs
 * forward and backward on the whole batch, flips a bit where fault
 * injection says so, and digests its loss and gradients (and, every
 * check_weights steps, its weights) on its own thread. A one-float
 * all-reduce is the members' barrier: past it every digest is written,
 * each member sorts the members by agreement (the same sort everywhere)
 * and, with one class, takes its optimizer step in the same run, so a step
 * that agrees costs the caller one hand-off, as one device's step does.
 * Otherwise nobody updates, and the caller settles it: a majority names
 * the others, which are dropped as a lost device is; without one (two
 * members) the step is computed again, and the member whose digest
 * changed had computed it wrong the first time; members that still
 * disagree stop the run. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/mirror-impl.h"

typedef struct pass_args {
    td__mirror *p;
    const td_batch *batch;
    uint64_t step;      /* keys dropout */
    int64_t fault_step; /* the step fault items name: step + 1 */
    double grad_scale;
    int weights; /* digest the weights too */
    int update;  /* compare at the barrier and update when all agree */
    td_step_result res[TD_DP_MAX_MEMBERS];
    uint64_t compute_ns[TD_DP_MAX_MEMBERS], digest_ns[TD_DP_MAX_MEMBERS];
    uint64_t compare_ns[TD_DP_MAX_MEMBERS], update_ns[TD_DP_MAX_MEMBERS];
    int updated[TD_DP_MAX_MEMBERS];
} pass_args;

static int sort_into_classes(const td__mirror *p, int *cls, int *entry);

/* Member `rank`'s rows of b: its replica's share, [*first, *first + n). */
static td_batch rows_of(const td__mirror *p, const td_batch *b, int rank, int64_t *first) {
    int64_t r = rank / p->per, lo = b->n * r / p->replicas, hi = b->n * (r + 1) / p->replicas;
    int64_t lps = p->labels_per_sample;
    td_batch out = {hi - lo, NULL, NULL, b->labels + lo * lps};
    out.x = b->x ? b->x + (size_t)lo * p->input_values : NULL;
    out.tokens = b->tokens ? b->tokens + lo * lps : NULL;
    *first = lo;
    return out;
}

typedef struct sum_args {
    td__mirror *p;
    int member; /* its rank in the whole group */
} sum_args;

/* In member j's group across the replicas: its gradients summed. */
static td_status sum_grads(td_group *g, td_device *dev, int rank, int size, void *arg) {
    sum_args *a = arg;
    td_model *m = a->p->m[a->member];
    (void)dev;
    (void)rank;
    (void)size;
    for (size_t i = 0; i < td_model_param_count(m); i++)
        TD_CHECK(td_allreduce_tensor(g, td_model_grad(m, i), TD_REDUCE_SUM));
    return TD_OK;
}

/* Member `rank`'s update: in a mesh, its gradients summed over the
 * replicas first (member j of each agreed with its own group, so every
 * member j adds the same numbers in the same order). */
static td_status update_member(td__mirror *p, int rank) {
    if (p->replicas > 1) {
        sum_args s = {p, rank};
        TD_CHECK(td_group_join(p->mesh.across[rank % p->per], sum_grads, &s));
    }
    return td_optimizer_step(p->opt[rank], NULL);
}

/* Past the barrier: every member's digest is written. Member `rank` takes
 * its optimizer step when all agree. */
static td_status compare_and_update(td_group *g, int rank, pass_args *a) {
    td__mirror *p = a->p;
    int cls[TD_DP_MAX_MEMBERS], entry = 0, agree;
    uint64_t t0, t1;
    td_status st;
    TD_CHECK(td_allreduce(g, p->sync[rank], 0, p->sync[rank], 0, 1, TD_F32, TD_REDUCE_SUM));
    t0 = td_clock_ns(); /* the wait at the barrier is the slower member's compute, not ours */
    agree = sort_into_classes(p, cls, &entry) == p->replicas;
    t1 = td_clock_ns();
    a->compare_ns[rank] = t1 - t0;
    if (!agree)
        return TD_OK;
    st = update_member(p, rank);
    a->update_ns[rank] = td_clock_ns() - t1;
    a->updated[rank] = st == TD_OK;
    return st;
}

/* Forward, backward and the digest on member `rank`'s thread, with the bit
 * flips planned for it at this step. */
static td_status member_pass(td_group *g, td_device *dev, int rank, int size, void *arg) {
    pass_args *a = arg;
    td__mirror *p = a->p;
    td_model *m = p->m[rank];
    int64_t first;
    td_batch rows = rows_of(p, a->batch, rank, &first), b = rows;
    uint64_t t0, t1;
    (void)dev;
    (void)size;
    assert(rank >= 0 && rank < p->n);
    if (td_group_fault_flip(g, rank, TD_FLIP_WEIGHT, a->fault_step))
        TD_CHECK(td__flip_tensor(td_model_param(m, 0), p->scratch[rank]));
    if (td_group_fault_flip(g, rank, TD_FLIP_ACT, a->fault_step))
        td__flip_batch(&rows, (size_t)rows.n * p->input_values, p->xcopy[rank], p->tcopy[rank], &b);
    t0 = td_clock_ns();
    TD_CHECK(td_model_train_slice(m, &b, first, a->grad_scale, 0, a->step, &a->res[rank]));
    t1 = td_clock_ns();
    if (td_group_fault_flip(g, rank, TD_FLIP_GRAD, a->fault_step))
        TD_CHECK(td__flip_tensor(td_model_grad(m, 0), p->scratch[rank]));
    TD_CHECK(td__digest_model(m, a->res[rank].loss_sum, a->weights, p->rule.exact, p->scratch[rank],
                              &p->dg[rank]));
    a->compute_ns[rank] = t1 - t0;
    a->digest_ns[rank] = td_clock_ns() - t1;
    return a->update ? compare_and_update(g, rank, a) : TD_OK;
}

typedef struct update_args {
    td__mirror *p;
    uint64_t update_ns[TD_DP_MAX_MEMBERS];
} update_args;

static td_status member_update(td_group *g, td_device *dev, int rank, int size, void *arg) {
    update_args *a = arg;
    uint64_t t0 = td_clock_ns();
    td_status st;
    (void)g;
    (void)dev;
    (void)size;
    st = update_member(a->p, rank);
    a->update_ns[rank] = td_clock_ns() - t0;
    return st;
}

/* Room for a flipped copy of a batch of n samples on every member. */
static td_status ensure_capacity(td__mirror *p, int64_t n) {
    size_t values = (size_t)n * p->input_values;
    if (n <= p->capacity)
        return TD_OK;
    for (int r = 0; r < p->n; r++) {
        free(p->xcopy[r]);
        free(p->tcopy[r]);
        p->xcopy[r] = td__calloc(values * sizeof *p->xcopy[r] + 1, "a mirror input copy");
        p->tcopy[r] = td__calloc(values * sizeof *p->tcopy[r] + 1, "a mirror input copy");
        if (!p->xcopy[r] || !p->tcopy[r])
            return TD_ERR_OUT_OF_MEMORY;
    }
    p->capacity = n;
    return TD_OK;
}

/* cls[r]: the first member that r agrees with (r itself when none before
 * it does); the number of classes. *entry: what the first disagreement seen
 * was about. */
static int sort_into_classes(const td__mirror *p, int *cls, int *entry) {
    int classes = 0;
    for (int r = 0; r < p->n; r++) {
        cls[r] = r;
        for (int q = r - r % p->per; q < r; q++) { /* the members of r's replica */
            int e;
            if (cls[q] != q)
                continue;
            if (td__digest_agree(&p->dg[q], &p->dg[r], p->rule, &e)) {
                cls[r] = q;
                break;
            }
            *entry = e;
        }
        classes += cls[r] == r;
    }
    return classes;
}

/* rep[g]: the class more than half of group g's members are in (a group:
 * one replica's mirrored members), or -1; 1 when every group has one. */
static int majorities(const td__mirror *p, const int *cls, int *rep) {
    int all = 1;
    for (int g = 0; g < p->replicas; g++) {
        int lo = g * p->per, hi = lo + p->per;
        rep[g] = -1;
        for (int c = lo; c < hi && rep[g] < 0; c++) {
            int members = 0;
            for (int r = lo; r < hi; r++)
                members += cls[r] == c;
            if (2 * members > p->per)
                rep[g] = c;
        }
        all &= rep[g] >= 0;
    }
    return all;
}

/* "cpu:0, cpu:1 and cpu:2": the members r with pick[r], into buf. */
static const char *member_names(const td__mirror *p, const int *pick, char *buf, size_t n) {
    int chosen[TD_DP_MAX_MEMBERS], k = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (int r = 0; r < p->n; r++)
        if (pick[r])
            chosen[k++] = r;
    for (int i = 0; i < k && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s",
                                 i == 0       ? ""
                                 : i == k - 1 ? " and "
                                              : ", ",
                                 td_device_name(td_group_device(p->g, chosen[i])));
    return buf;
}

static void note_found(td__mirror *p, uint64_t step, const char *who, const char *what,
                       const char *outcome) {
    size_t used = strlen(p->counts.found);
    if (used + 1 < sizeof p->counts.found)
        snprintf(p->counts.found + used, sizeof p->counts.found - used, "step %llu: %s (%s), %s; ",
                 (unsigned long long)step + 1, who, what, outcome);
}

/* The members outside their group's majority class (rep[g]) are marked
 * odd and the step fails as a lost device's would, naming them. */
static td_status drop_odd(td__mirror *p, const int *cls, const int *rep, uint64_t step) {
    int odd[TD_DP_MAX_MEMBERS] = {0}, e = 0, first = -1, k = 0, agree = 0, r0;
    char who[256], what[160];
    for (int r = 0; r < p->n; r++)
        if ((odd[r] = p->odd[r] = cls[r] != rep[r / p->per])) {
            first = first < 0 ? r : first;
            k++;
        }
    assert(first >= 0);
    r0 = rep[first / p->per];
    for (int r = first - first % p->per; r < first - first % p->per + p->per; r++)
        agree += cls[r] == r0;
    td__digest_agree(&p->dg[r0], &p->dg[first], p->rule, &e);
    td__digest_entry_name(p->m[r0], e, what, sizeof what);
    member_names(p, odd, who, sizeof who);
    p->counts.dropped += k;
    note_found(p, step, who, what, "dropped");
    return td__error(TD_ERR_DEVICE_LOST,
                     "mirror: step %llu: %s computed %s unlike the %d other members, which agree; "
                     "%s dropped and the step computed again without %s",
                     (unsigned long long)step + 1, who, what, agree, k == 1 ? "it is" : "they are",
                     k == 1 ? "it" : "them");
}

/* No majority: every member computes the step again. A member whose digest
 * changed computed it wrong the first time; if they now agree the step
 * goes on, else the run stops naming them all. */
static td_status recompute(td__mirror *p, pass_args *a, int entry, uint64_t step) {
    int cls[TD_DP_MAX_MEMBERS], changed[TD_DP_MAX_MEMBERS] = {0}, all[TD_DP_MAX_MEMBERS] = {0},
                                e = 0, any = 0;
    char who[256], what[160];
    td__digest_entry_name(p->m[0], entry, what, sizeof what);
    for (int r = 0; r < p->n; r++)
        td__digest_swap(&p->dg[r], &p->first[r]);
    TD_CHECK(td_group_run(p->g, member_pass, a));
    for (int r = 0; r < p->n; r++) {
        any |= changed[r] = !td__digest_agree(&p->first[r], &p->dg[r], p->rule, &e);
        all[r] = 1;
    }
    if (sort_into_classes(p, cls, &e) == p->replicas) {
        p->counts.recomputed++;
        member_names(p, changed, who, sizeof who);
        note_found(p, step, any ? who : "no member changed", what, "recomputed");
        TD_LOG_WARN("mirror: step %llu: the members disagreed on %s; computed again, they agree: "
                    "%s had computed it wrong",
                    (unsigned long long)step + 1, what, any ? who : "none of them");
        return TD_OK;
    }
    td__digest_entry_name(p->m[0], e, what, sizeof what);
    member_names(p, all, who, sizeof who);
    note_found(p, step, who, what, "stopped");
    return td__error(TD_ERR_DEVICE,
                     "mirror: step %llu: %s disagree on %s, and still do after computing the step "
                     "again: one of them computes wrong numbers. The run stops before the step's "
                     "update; the last checkpoint written stays as it was",
                     (unsigned long long)step + 1, who, what);
}

static void fill_stats(const td__mirror *p, const pass_args *a, const uint64_t *update_ns,
                       double step_s, double compare_s, td_step_stats *stats) {
    memset(stats, 0, sizeof *stats);
    stats->members = p->n;
    stats->step_s = step_s;
    stats->ideal_s = step_s;
    for (int r = 0; r < p->n; r++) {
        td_member_stats *m = &stats->m[r];
        int64_t first;
        m->samples = rows_of(p, a->batch, r, &first).n;
        m->share = 1.0 / p->replicas;
        m->compute_s = (double)a->compute_ns[r] * 1e-9;
        m->comm_s = (double)(a->digest_ns[r] + a->compare_ns[r]) * 1e-9 + compare_s;
        m->update_s = (double)update_ns[r] * 1e-9;
        m->wait_s = step_s - m->compute_s - m->comm_s - m->update_s;
        m->wait_s = m->wait_s > 0 ? m->wait_s : 0;
    }
}

td_status td__mirror_step(td__mirror *p, const td_batch *batch, uint64_t step, td_step_result *res,
                          td_step_stats *stats) {
    pass_args *a = td__calloc(sizeof *a, "a mirror step");
    update_args u;
    const uint64_t *update_ns;
    int cls[TD_DP_MAX_MEMBERS], entry = 0, agreed = 1;
    uint64_t t0 = td_clock_ns(), c0, c1, slowest = 0;
    td_status st;
    if (!a)
        return TD_ERR_OUT_OF_MEMORY;
    memset(&u, 0, sizeof u);
    u.p = a->p = p;
    a->batch = batch;
    a->step = step;
    a->fault_step = (int64_t)step + 1;
    a->grad_scale = 1.0 / (double)(batch->n * p->labels_per_sample);
    a->weights = p->check_weights > 0 && td_optimizer_steps(p->opt[0]) % p->check_weights == 0;
    a->update = 1;
    TD_TRY(ensure_capacity(p, batch->n));
    TD_TRY(td_group_run(p->g, member_pass, a));
    c0 = td_clock_ns();
    for (int r = 0; r < p->n; r++)
        agreed &= a->updated[r];
    a->update = 0; /* a pass computed again leaves the update to the caller */
    if (!agreed) {
        int rep[TD_DP_MAX_MEMBERS];
        sort_into_classes(p, cls, &entry); /* as the members did: a group split in classes */
        p->counts.disagreements++;
        TD_TRY(majorities(p, cls, rep) ? drop_odd(p, cls, rep, step)
                                       : recompute(p, a, entry, step));
    }
    c1 = td_clock_ns();
    if (!agreed)
        TD_TRY(td_group_run(p->g, member_update, &u));
    update_ns = agreed ? a->update_ns : u.update_ns;
    for (int r = 0; r < p->n; r++)
        slowest = a->digest_ns[r] + a->compare_ns[r] > slowest ? a->digest_ns[r] + a->compare_ns[r]
                                                               : slowest;
    p->counts.steps++;
    p->counts.weight_checks += a->weights;
    p->counts.check_s += (double)(slowest + (c1 - c0)) * 1e-9;
    p->counts.step_s += (double)(td_clock_ns() - t0) * 1e-9;
    memset(res, 0, sizeof *res);
    for (int g = 0; g < p->replicas; g++) { /* each group's first member: its rows */
        res->loss_sum += a->res[g * p->per].loss_sum;
        res->correct += a->res[g * p->per].correct;
        res->count += a->res[g * p->per].count;
    }
    if (stats)
        fill_stats(p, a, update_ns, (double)(td_clock_ns() - t0) * 1e-9, (double)(c1 - c0) * 1e-9,
                   stats);
    st = TD_OK;
fail:
    free(a);
    return st;
}
