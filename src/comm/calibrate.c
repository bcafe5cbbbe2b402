/* Measuring the switch point between the direct exchange and the
 * large-message algorithm (the shared queue for a local all-reduce). */
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

td_status td__collective_run_algo(td_group *g, const td_collective *c, td_comm_algorithm algo);

#define CAL_MIN   64u
#define CAL_MAX   (1u << 20)
#define CAL_SIZES 15 /* 64 B to 1 MiB by factors of 2 */
#define CAL_REPS  21

typedef struct cal_args {
    double direct_ns[CAL_SIZES]; /* median per size, measured by rank 0's first local member */
    double ring_ns[CAL_SIZES];   /* the large-message algorithm */
} cal_args;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static td_status cal_fn(td_group *g, td_device *dev, int rank, int size, void *p) {
    cal_args *a = p;
    td_buffer *buf = NULL;
    td_status st;
    int measure = td_group_device(g, rank) && rank == g->rank0;
    TD_TRY(td_buffer_alloc(dev, CAL_MAX, &buf));
    {
        /* Zeros: sums stay finite however often they run. */
        void *zeros = td__calloc(CAL_MAX, "calibration data");
        if (!zeros) {
            st = TD_ERR_OUT_OF_MEMORY;
            goto fail;
        }
        st = td_buffer_write(buf, 0, zeros, CAL_MAX);
        free(zeros);
        TD_TRY(st);
    }
    for (int s = 0; s < CAL_SIZES; s++) {
        size_t bytes = (size_t)CAL_MIN << s;
        td_collective c = {TD_COLL_ALLREDUCE, buf, 0, buf, 0, bytes / 4, TD_F32, TD_REDUCE_SUM, 0};
        for (int algo = 0; algo < 2; algo++) {
            double t[CAL_REPS];
            /* Above the switch a local all-reduce takes the shared queue. */
            td_comm_algorithm which = !algo                           ? TD_ALGO_DIRECT
                                      : g->tr == &td__transport_local ? TD_ALGO_SHARED
                                                                      : TD_ALGO_RING;
            for (int i = 0; i < 3; i++)
                TD_TRY(td__collective_run_algo(g, &c, which));
            for (int i = 0; i < CAL_REPS; i++) {
                uint64_t t0 = td_clock_ns();
                TD_TRY(td__collective_run_algo(g, &c, which));
                t[i] = (double)(td_clock_ns() - t0);
            }
            if (measure) {
                qsort(t, CAL_REPS, sizeof *t, cmp_double);
                (algo ? a->ring_ns : a->direct_ns)[s] = t[CAL_REPS / 2];
            }
        }
    }
    td_buffer_free(buf);
    return TD_OK;
fail:
    td_buffer_free(buf);
    return st;
}

td_status td_group_calibrate(td_group *g, size_t *switch_bytes) {
    cal_args a;
    td_status st;
    size_t sw = (size_t)CAL_MAX * 2; /* the direct exchange everywhere it fits */
    if (!g)
        return td__error(TD_ERR_INVALID_ARG, "td_group_calibrate: group is NULL");
    memset(&a, 0, sizeof a);
    if ((st = td_group_run(g, cal_fn, &a)) != TD_OK)
        return st;
    if (g->nlocal > 1) {
        /* The switch that fits the measurements best: direct below it, the
         * large-message algorithm from it, each size weighing its time over
         * the better of the two (so that one noisy size cannot move it far),
         * among the sizes the direct exchange can take (its slot size). */
        int top = 0, best = 0;
        double best_cost = 0;
        while (top + 1 < CAL_SIZES && ((size_t)CAL_MIN << (top + 1)) <= g->small_bytes)
            top++;
        for (int cut = 0; cut <= top + 1; cut++) {
            double cost = 0;
            for (int s = 0; s <= top; s++) {
                double lo = a.direct_ns[s] < a.ring_ns[s] ? a.direct_ns[s] : a.ring_ns[s];
                cost += (s < cut ? a.direct_ns[s] : a.ring_ns[s]) / (lo > 0 ? lo : 1);
            }
            if (cut == 0 || cost < best_cost) {
                best_cost = cost;
                best = cut;
            }
        }
        if (best <= top)
            sw = (size_t)CAL_MIN << best;
        /* The direct exchange is limited to its slot size. */
        if (sw > g->small_bytes)
            sw = g->small_bytes;
        g->switch_bytes = sw;
        for (int s = 0; s < CAL_SIZES; s++)
            TD_LOG_INFO("calibration: %zu B direct %.2f us ring %.2f us", (size_t)CAL_MIN << s,
                        a.direct_ns[s] / 1e3, a.ring_ns[s] / 1e3);
    }
    if (switch_bytes)
        *switch_bytes = g->switch_bytes;
    return TD_OK;
}
