/* The collectives benchmark behind bench_collectives and `tandem bench
 * collectives`: algbw and busbw as nccl-tests defines them, for the local
 * transport and (under mpirun, started by the benchmark itself) the MPI
 * transport, beside a single-core memcpy and Open MPI's own MPI_Allreduce,
 * with the floors the comm layer promises checked at the end.
 *
 * nccl-tests' definitions, for n members, S bytes and time t:
 *   algbw = S / t
 *   busbw = algbw * 2(n-1)/n   all-reduce
 *         = algbw * (n-1)/n    all-gather, reduce-scatter (S: the whole gathered size)
 *         = algbw              broadcast, reduce */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef TD_HAVE_MPI
#include <mpi.h>
#endif

#include "comm/bench.h"
#include "comm/comm-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "device/spec.h"

#define MAX_SIZES 32

typedef struct bench_opts {
    const char *devices;
    size_t min_bytes, max_bytes;
    int kinds_mask;
    int mpi;       /* also run the MPI section */
    int mpi_child; /* this process is one of mpirun's */
    int np;
    size_t mpi_max_bytes;
    int calibrate;
    const char *respawn; /* arguments that lead back here: "" or "bench collectives" */
} bench_opts;

typedef struct bench_run {
    const bench_opts *o;
    size_t sizes[MAX_SIZES];
    int nsizes;
    double ns[TD_COMM_KINDS][MAX_SIZES]; /* median per op, 0: not run */
    int mpi; /* the MPI section: fewer repetitions at big sizes (MPI is slow here) */
} bench_run;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fewer repetitions for big sizes keep a default run under a minute. */
static int reps_for(size_t bytes, int mpi) {
    if (mpi && bytes >= (16u << 20))
        return 3;
    if (bytes <= 64)
        return 3000;
    if (bytes <= (64u << 10))
        return 300;
    if (bytes <= (4u << 20))
        return 40;
    if (bytes <= (16u << 20))
        return 11;
    return 15;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

static void elements(td_collective_kind kind, size_t bytes, int n, size_t *count) {
    size_t elems = bytes / 4;
    *count =
        kind == TD_COLL_ALLGATHER || kind == TD_COLL_REDUCE_SCATTER ? elems / (size_t)n : elems;
}

static td_status bench_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    bench_run *r = arg;
    size_t max = r->sizes[r->nsizes - 1];
    td_buffer *send = NULL, *recv = NULL;
    double *t = NULL;
    td_status st = TD_OK;
    void *zeros = NULL;
    TD_TRY(td_buffer_alloc(dev, max, &send));
    TD_TRY(td_buffer_alloc(dev, max, &recv));
    zeros = td__calloc(max, "benchmark data");
    t = td__calloc(sizeof *t * 4000, "benchmark times");
    if (!zeros || !t) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    /* Touch every page before timing; zeros keep sums finite. */
    TD_TRY(td_buffer_write(send, 0, zeros, max));
    TD_TRY(td_buffer_write(recv, 0, zeros, max));
    for (int kind = 0; kind < TD_COMM_KINDS; kind++) {
        if (!(r->o->kinds_mask & (1 << kind)))
            continue;
        for (int s = 0; s < r->nsizes; s++) {
            size_t count;
            int reps = reps_for(r->sizes[s], r->mpi);
            td_collective c = {
                (td_collective_kind)kind, send, 0, recv, 0, 0, TD_F32, TD_REDUCE_SUM, 0};
            elements(c.kind, r->sizes[s], n, &count);
            if (count == 0)
                continue;
            c.count = count;
            for (int i = -2; i < reps; i++) {
                uint64_t t0 = td_clock_ns();
                TD_TRY(td_collective_run(g, &c));
                if (i >= 0)
                    t[i] = (double)(td_clock_ns() - t0);
            }
            if (rank == 0)
                r->ns[kind][s] = median(t, reps);
        }
    }
fail:
    free(zeros);
    free(t);
    td_buffer_free(send);
    td_buffer_free(recv);
    return st;
}

static double memcpy_ns(size_t bytes, char *a, char *b) {
    int reps = reps_for(bytes, 0);
    double t[4000];
    for (int i = -2; i < reps; i++) {
        uint64_t t0 = td_clock_ns();
        memcpy(b, a, bytes);
        /* Keep the copy from being optimised away. */
        __asm__ __volatile__("" : : "r"(b) : "memory");
        if (i >= 0)
            t[i] = (double)(td_clock_ns() - t0);
    }
    return median(t, reps);
}

static double bus_factor(td_collective_kind kind, int n) {
    switch (kind) {
    case TD_COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case TD_COLL_ALLGATHER:
    case TD_COLL_REDUCE_SCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

static const char *fmt_size(size_t b, char buf[32]) {
    if (b >= (1u << 20))
        snprintf(buf, 32, "%zu MiB", b >> 20);
    else if (b >= 1024)
        snprintf(buf, 32, "%zu KiB", b >> 10);
    else
        snprintf(buf, 32, "%zu B", b);
    return buf;
}

static int make_sizes(const bench_opts *o, size_t max, size_t *sizes) {
    int n = 0;
    for (size_t b = o->min_bytes; b <= max && n < MAX_SIZES; b *= 4) {
        sizes[n++] = b;
        /* 64 MiB is where the bandwidth floor starts: always measure it. */
        if (b < (64u << 20) && b * 4 > (64u << 20) && max >= (64u << 20) && n < MAX_SIZES)
            sizes[n++] = 64u << 20;
    }
    if (n && sizes[n - 1] != max && max > sizes[n - 1] && n < MAX_SIZES)
        sizes[n++] = max;
    return n;
}

static int run_local(const bench_opts *o) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    bench_run *r = NULL;
    char *a = NULL, *b = NULL;
    double copy_ns[MAX_SIZES];
    int n, rc = 1, floors_ok = 1;
    td_status st;
    cfg.fault = "";
    r = td__calloc(sizeof *r, "a benchmark");
    if (!r)
        return 1;
    r->o = o;
    r->nsizes = make_sizes(o, o->max_bytes, r->sizes);
    if ((st = td_group_create_spec(o->devices, &cfg, &g)) != TD_OK) {
        fprintf(stderr, "bench collectives: %s: %s\n", td_status_name(st), td_last_error());
        goto done;
    }
    n = td_group_size(g);
    if (o->calibrate) {
        size_t sw = 0;
        if ((st = td_group_calibrate(g, &sw)) != TD_OK) {
            fprintf(stderr, "calibration: %s: %s\n", td_status_name(st), td_last_error());
            goto done;
        }
        printf("calibrated all-reduce switch point (direct exchange below, shared queue or ring "
               "from): %zu bytes\n",
               sw);
    }
    printf("# tandem collectives, local transport: %d devices (%s), f32 sum, out of place\n", n,
           o->devices);
    printf("# switch point %zu B (TANDEM_ALLREDUCE_SWITCH_BYTES or td_group_calibrate)\n",
           td_group_switch_bytes(g));
    printf("# times are medians over repetitions; busbw per nccl-tests; memcpy: one core\n");
    if ((st = td_group_run(g, bench_fn, r)) != TD_OK) {
        fprintf(stderr, "bench collectives: %s: %s\n", td_status_name(st), td_last_error());
        goto done;
    }
    a = td__aligned_alloc(o->max_bytes, "memcpy source");
    b = td__aligned_alloc(o->max_bytes, "memcpy destination");
    if (!a || !b)
        goto done;
    memset(a, 1, o->max_bytes);
    memset(b, 2, o->max_bytes);
    for (int s = 0; s < r->nsizes; s++)
        copy_ns[s] = memcpy_ns(r->sizes[s], a, b);
    printf("%-14s %10s %12s %12s %12s %12s %14s\n", "collective", "size", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "memcpy(GB/s)", "busbw/memcpy");
    for (int kind = 0; kind < TD_COMM_KINDS; kind++) {
        for (int s = 0; s < r->nsizes; s++) {
            double t = r->ns[kind][s], algbw, busbw, cbw;
            char sz[32];
            if (t <= 0)
                continue;
            algbw = (double)r->sizes[s] / t; /* bytes per ns = GB/s */
            busbw = algbw * bus_factor((td_collective_kind)kind, n);
            cbw = (double)r->sizes[s] / copy_ns[s];
            printf("%-14s %10s %12.2f %12.3f %12.3f %12.3f %14.2f\n",
                   td_collective_name((td_collective_kind)kind), fmt_size(r->sizes[s], sz), t / 1e3,
                   algbw, busbw, cbw, busbw / cbw);
        }
    }
    /* The floors, for two local devices. */
    if (n == 2 && (o->kinds_mask & 1)) {
        for (int s = 0; s < r->nsizes; s++) {
            double busbw, cbw;
            char sz[32];
            if (r->sizes[s] < (64u << 20) || r->ns[0][s] <= 0)
                continue;
            busbw = (double)r->sizes[s] / r->ns[0][s] * bus_factor(TD_COLL_ALLREDUCE, n);
            cbw = (double)r->sizes[s] / copy_ns[s];
            printf("floor: all-reduce busbw at %s >= 0.8 x memcpy: %.2f GB/s vs 0.8 x %.2f = "
                   "%.2f GB/s: %s\n",
                   fmt_size(r->sizes[s], sz), busbw, cbw, 0.8 * cbw,
                   busbw >= 0.8 * cbw ? "PASS" : "FAIL");
            floors_ok &= busbw >= 0.8 * cbw;
        }
        for (int s = 0; s < r->nsizes; s++) {
            if (r->sizes[s] != 8)
                continue;
            printf("floor: 8-byte all-reduce median <= 5 us: %.2f us: %s\n", r->ns[0][s] / 1e3,
                   r->ns[0][s] <= 5000 ? "PASS" : "FAIL");
            floors_ok &= r->ns[0][s] <= 5000;
        }
    } else {
        printf("floors: n/a (they are defined for 2 local devices running all-reduce)\n");
    }
    rc = floors_ok ? 0 : 3;
done:
    free(a);
    free(b);
    td_group_destroy(g);
    free(r);
    return rc;
}

#ifdef TD_HAVE_MPI
/* One device per process, so the MPI transport's numbers compare with
 * MPI_Allreduce on the same processes. */
static int run_mpi_child(const bench_opts *o) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    bench_run *r = NULL;
    bench_opts mo = *o;
    char spec[32];
    int process = 0, nprocs = 1, rc = 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    td_status st;
    double raw[MAX_SIZES];
    char *buf = NULL;
    cfg.transport = TD_TRANSPORT_MPI;
    cfg.fault = "";
    mo.kinds_mask = 1;
    r = td__calloc(sizeof *r, "a benchmark");
    if (!r)
        return 1;
    r->o = &mo;
    r->mpi = 1;
    r->nsizes = make_sizes(o, o->mpi_max_bytes, r->sizes);
    /* tandem initialises MPI with the group; the spec needs the rank first. */
    td_comm_launch(&process, NULL);
    /* mpirun binds each process to its own core: "cpu" is that core. */
    snprintf(spec, sizeof spec, "cpu");
    (void)cpus;
    if ((st = td_group_create_spec(spec, &cfg, &g)) != TD_OK) {
        fprintf(stderr, "bench collectives (mpi): %s: %s\n", td_status_name(st), td_last_error());
        goto done;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &process);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    if ((st = td_group_run(g, bench_fn, r)) != TD_OK) {
        fprintf(stderr, "bench collectives (mpi): %s: %s\n", td_status_name(st), td_last_error());
        goto done;
    }
    buf = td__calloc(r->sizes[r->nsizes - 1], "MPI benchmark data");
    if (!buf)
        goto done;
    for (int s = 0; s < r->nsizes; s++) {
        int reps = reps_for(r->sizes[s], 1);
        double t[4000];
        if (reps > 1000)
            reps = 1000;
        for (int i = -2; i < reps; i++) {
            uint64_t t0 = td_clock_ns();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)(r->sizes[s] / 4), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            if (i >= 0)
                t[i] = (double)(td_clock_ns() - t0);
        }
        raw[s] = median(t, reps);
    }
    if (process == 0) {
        printf("\n# tandem all-reduce, mpi transport: %d processes, one device each, f32 sum\n",
               nprocs);
        printf("%-14s %10s %12s %12s %14s %14s %12s\n", "collective", "size", "time(us)",
               "busbw(GB/s)", "MPI time(us)", "MPI busbw", "tandem/MPI");
        for (int s = 0; s < r->nsizes; s++) {
            char sz[32];
            double f = bus_factor(TD_COLL_ALLREDUCE, nprocs);
            double bw = (double)r->sizes[s] / r->ns[0][s] * f;
            double mbw = (double)r->sizes[s] / raw[s] * f;
            printf("%-14s %10s %12.2f %12.3f %14.2f %14.3f %12.2f\n", "allreduce",
                   fmt_size(r->sizes[s], sz), r->ns[0][s] / 1e3, bw, raw[s] / 1e3, mbw, bw / mbw);
        }
        fflush(stdout);
    }
    rc = 0;
done:
    free(buf);
    td_group_destroy(g);
    free(r);
    return rc;
}
#endif

static int spawn_mpi(const bench_opts *o) {
    char cmd[1024], self[512];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    int status;
    if (len <= 0)
        return 1;
    self[len] = '\0';
    fflush(stdout);
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np %d '%s' %s --mpi-child "
             "--max-bytes %zu --min-bytes %zu",
             o->np, self, o->respawn, o->mpi_max_bytes, o->min_bytes);
    status = system(cmd);
    if (status != 0) {
        fprintf(stderr, "bench collectives: the MPI section failed (%s)\n", cmd);
        return 1;
    }
    return 0;
}

static int usage(FILE *f) {
    fprintf(f, "usage: collectives [--devices SPEC] [--min-bytes N] [--max-bytes N] "
               "[--only KIND] [--no-mpi] [--np N] [--mpi-max-bytes N] [--calibrate]\n"
               "  Times every collective from 8 B to 256 MiB on the local transport (default "
               "cpu*2),\n  then all-reduce on the MPI transport under mpirun beside "
               "MPI_Allreduce, and checks the floors.\n  Exit status 3 when a floor fails.\n");
    return f == stdout ? 0 : 2;
}

int td__comm_bench(int argc, char **argv, const char *respawn) {
    bench_opts o;
    int rc;
    memset(&o, 0, sizeof o);
    o.devices = "cpu*2";
    o.min_bytes = 8;
    o.max_bytes = 256u << 20;
    o.mpi_max_bytes = 256u << 20;
    o.kinds_mask = (1 << TD_COMM_KINDS) - 1;
    o.np = 2;
    o.respawn = respawn ? respawn : "";
#ifdef TD_HAVE_MPI
    o.mpi = 1;
#endif
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t bytes;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout);
        if (!strcmp(a, "--no-mpi")) {
            o.mpi = 0;
        } else if (!strcmp(a, "--mpi-child")) {
            o.mpi_child = 1;
        } else if (!strcmp(a, "--calibrate")) {
            o.calibrate = 1;
        } else if (!v) {
            return usage(stderr);
        } else if (!strcmp(a, "--devices")) {
            o.devices = v, i++;
        } else if (!strcmp(a, "--np")) {
            o.np = atoi(v), i++;
        } else if (!strcmp(a, "--only")) {
            o.kinds_mask = 0;
            for (int k = 0; k < TD_COMM_KINDS; k++)
                if (!strcmp(v, td_collective_name((td_collective_kind)k)))
                    o.kinds_mask = 1 << k;
            if (!o.kinds_mask)
                return usage(stderr);
            i++;
        } else if (!strcmp(a, "--min-bytes") || !strcmp(a, "--max-bytes") ||
                   !strcmp(a, "--mpi-max-bytes")) {
            if (td__parse_bytes(v, &bytes) != 0 || bytes < 4)
                return usage(stderr);
            if (!strcmp(a, "--min-bytes"))
                o.min_bytes = (size_t)bytes;
            else if (!strcmp(a, "--max-bytes"))
                o.max_bytes = (size_t)bytes;
            else
                o.mpi_max_bytes = (size_t)bytes;
            i++;
        } else {
            return usage(stderr);
        }
    }
    if (o.min_bytes > o.max_bytes || o.np < 1)
        return usage(stderr);
#ifdef TD_HAVE_MPI
    if (o.mpi_child) {
        o.mpi_max_bytes = o.max_bytes;
        return run_mpi_child(&o);
    }
#else
    if (o.mpi_child) {
        fprintf(stderr, "bench collectives: this tandem has no MPI\n");
        return 1;
    }
#endif
    rc = run_local(&o);
    if (o.mpi && o.mpi_max_bytes >= o.min_bytes) {
        if (o.mpi_max_bytes > o.max_bytes)
            o.mpi_max_bytes = o.max_bytes;
        if (spawn_mpi(&o) != 0 && rc == 0)
            rc = 1;
    } else if (!o.mpi) {
        printf("\n# mpi section skipped (--no-mpi, or no MPI in this build)\n");
    }
    return rc;
}
