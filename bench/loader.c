/* The loader's prefetch thread against loading in place (src/train/loader.c).
 *
 * For each batch size and each length of a stand-in training step (the
 * caller busy for W microseconds between batches, as it waits for its
 * devices), the time the caller spends in td_loader_next: the whole
 * conversion when loading in place; with prefetch, only the hand-off and
 * any wait for a batch not yet made. Loaders alternate in rounds and each
 * cell is the median of the rounds, since the cores' pace changes from
 * second to second on a shared virtual machine.
 *
 * The stand-in step leaves a core idle for the thread, which a real step
 * need not: on a machine whose devices use every core, the thread takes time
 * from them. `tandem train` with TANDEM_PREFETCH=0 and =1 measures that
 * (docs/benchmarks.md).
 *
 *   bench_loader [--data DIR] [--rounds N] [--ms MS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/bench.h"
#include "tandem/tandem.h"
#include "train/train-impl.h"

static void busy(uint64_t ns) {
    uint64_t t0 = td_clock_ns();
    while (td_clock_ns() - t0 < ns)
        ;
}

/* The caller's time in td_loader_next over about ms of batches, each
 * followed by work_us of busy work: the median call and the mean, in
 * microseconds. The median leaves out the calls during which another process
 * took the core. Returns -1 on failure. */
static int measure(const td_dataset *ds, int64_t batch, int prefetch, double work_us, double ms,
                   double *median, double *mean) {
    td_loader *l = NULL;
    td_batch b;
    uint64_t t0, work = (uint64_t)(work_us * 1e3), until;
    size_t n = 0, cap = 1 << 16;
    double *calls = malloc(cap * sizeof *calls), sum = 0;
    if (!calls || td_loader_create(ds, batch, 1, 1, &l) != TD_OK)
        goto fail;
    td__loader_set_prefetch(l, prefetch);
    /* Past the batches made in place before the thread starts. */
    for (int i = 0; i < 4; i++)
        if (td_loader_next(l, &b) != TD_OK)
            goto fail;
    until = td_clock_ns() + (uint64_t)(ms * 1e6);
    do {
        t0 = td_clock_ns();
        if (td_loader_next(l, &b) != TD_OK)
            goto fail;
        calls[n] = (double)(td_clock_ns() - t0) * 1e-3;
        sum += calls[n++];
        busy(work);
    } while (td_clock_ns() < until && n < cap);
    qsort(calls, n, sizeof *calls, td_bench_cmp_double);
    *median = calls[n / 2];
    *mean = sum / (double)n;
    td_loader_destroy(l);
    free(calls);
    return 0;
fail:
    fprintf(stderr, "bench_loader: %s\n", td_last_error());
    td_loader_destroy(l);
    free(calls);
    return -1;
}

int main(int argc, char **argv) {
    const char *data = "data/mnist";
    static const int64_t batches[] = {1, 4, 16, 32, 64, 256, 1024};
    static const double works[] = {0, 200, 1000};
    int rounds = 5;
    double ms = 300;
    td_dataset *train = NULL, *test = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ms") && i + 1 < argc)
            ms = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_loader [--data DIR] [--rounds N] [--ms MS]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 99 || !(ms > 0)) {
        fprintf(stderr, "bench_loader: --rounds from 1 to 99, --ms above 0\n");
        return 2;
    }
    if (td_mnist_open(data, &train, &test) != TD_OK) {
        fprintf(stderr, "bench_loader: %s\n", td_last_error());
        return 1;
    }
    printf("MNIST training images, shuffled: the caller's microseconds in td_loader_next\n"
           "per batch, each batch followed by W us of busy work (a stand-in step);\n"
           "median call / mean call, median of %d rounds of %.0f ms, alternating\n\n",
           rounds, ms);
    printf("%6s %7s %21s %21s\n", "batch", "W (us)", "in place", "prefetched");
    for (size_t bi = 0; bi < sizeof batches / sizeof *batches; bi++)
        for (size_t wi = 0; wi < sizeof works / sizeof *works; wi++) {
            double med[2][99], avg[2][99];
            for (int k = 0; k < rounds; k++)
                for (int p = 0; p < 2; p++)
                    if (measure(train, batches[bi], p, works[wi], ms, &med[p][k], &avg[p][k]))
                        return 1;
            for (int p = 0; p < 2; p++) {
                qsort(med[p], (size_t)rounds, sizeof **med, td_bench_cmp_double);
                qsort(avg[p], (size_t)rounds, sizeof **avg, td_bench_cmp_double);
            }
            printf("%6lld %7.0f %10.2f / %8.2f %10.2f / %8.2f\n", (long long)batches[bi], works[wi],
                   med[0][rounds / 2], avg[0][rounds / 2], med[1][rounds / 2], avg[1][rounds / 2]);
            fflush(stdout);
        }
    td_dataset_destroy(train);
    td_dataset_destroy(test);
    return 0;
}
