/* `tandem bench collectives` (and bench/bench_collectives): algbw and busbw
 * as nccl-tests defines them, for the local transport and (under mpirun,
 * started by the benchmark itself) the MPI transport, beside a single-core
 * memcpy and Open MPI's own MPI_Allreduce, with the floors the comm layer
 * promises checked: all-reduce busbw at 64 MiB and up >= 0.8x memcpy and an
 * 8-byte all-reduce within 5 us (two local devices), and the MPI transport
 * at least as fast as MPI_Allreduce at every size (medians). Only the public
 * API: the CLI is a user of the library like any other.
 *
 * nccl-tests' definitions, for n members, S bytes and time t:
 *   algbw = S / t
 *   busbw = algbw * 2(n-1)/n   all-reduce
 *         = algbw * (n-1)/n    all-gather, reduce-scatter (S: the whole gathered size)
 *         = algbw              broadcast, reduce */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef TD_HAVE_MPI
#include <mpi.h>
#endif

#include "bench_collectives.h"
#include "cli.h"
#include "tandem/tandem.h"

#define MAX_SIZES 32
#define MAX_REPS  4000 /* the most repetitions reps_for asks */

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
    double ns[TD_COLL_KINDS][MAX_SIZES]; /* median per op, 0: not run */
    int mpi;           /* the MPI section: fewer repetitions at big sizes (MPI is slow here) */
    const void *zeros; /* (sizes[nsizes - 1]) bytes of 0, read by every member */
    double *times;     /* (group size, MAX_REPS): each member's repetitions, by rank */
    double mpi_ns[MAX_SIZES]; /* the MPI section: MPI_Allreduce's medians */
} bench_run;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Fewer repetitions for big sizes keep a default run under a minute. */
static int reps_for(size_t bytes, int mpi) {
    if (mpi && bytes >= (16u << 20))
        return 5;
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
    double *t = r->times + (size_t)rank * MAX_REPS;
    td_status st = TD_OK;
    TD_CLI_TRY(td_buffer_alloc(dev, max, &send));
    TD_CLI_TRY(td_buffer_alloc(dev, max, &recv));
    /* Touch every page before timing; zeros keep sums finite. */
    TD_CLI_TRY(td_buffer_write(send, 0, r->zeros, max));
    TD_CLI_TRY(td_buffer_write(recv, 0, r->zeros, max));
    for (int kind = 0; kind < TD_COLL_KINDS; kind++) {
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
                TD_CLI_TRY(td_collective_run(g, &c));
                if (i >= 0)
                    t[i] = (double)(td_clock_ns() - t0);
            }
            if (rank == 0)
                r->ns[kind][s] = median(t, reps);
        }
    }
fail:
    td_buffer_free(send);
    td_buffer_free(recv);
    return st;
}

static double memcpy_ns(size_t bytes, char *a, char *b) {
    int reps = reps_for(bytes, 0);
    double t[MAX_REPS];
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

/* The benchmark's own host memory: the zeros every member writes from and
 * n members' repetition times. 0, or 1 after saying what was short. */
static int alloc_run(bench_run *r, size_t zero_bytes, int n, const char *section) {
    r->zeros = calloc(zero_bytes, 1);
    r->times = calloc((size_t)n * MAX_REPS, sizeof *r->times);
    if (!r->zeros || !r->times) {
        fprintf(stderr, "bench collectives%s: out of host memory for %zu bytes of data\n", section,
                zero_bytes);
        return 1;
    }
    return 0;
}

static void free_run(bench_run *r) {
    if (r) {
        free((void *)r->zeros);
        free(r->times);
        free(r);
    }
}

/* 64-byte aligned host memory for the memcpy reference (aligned_alloc wants
 * a multiple of the alignment). */
static char *alloc_aligned(size_t bytes) {
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
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
    if (!(r = calloc(1, sizeof *r))) {
        fprintf(stderr, "bench collectives: out of host memory\n");
        return 1;
    }
    r->o = o;
    r->nsizes = make_sizes(o, o->max_bytes, r->sizes);
    if ((st = td_group_create_spec(o->devices, &cfg, &g)) != TD_OK) {
        fprintf(stderr, "bench collectives: %s: %s\n", td_status_name(st), td_last_error());
        goto done;
    }
    n = td_group_size(g);
    if (alloc_run(r, r->sizes[r->nsizes - 1], n, ""))
        goto done;
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
    a = alloc_aligned(o->max_bytes);
    b = alloc_aligned(o->max_bytes);
    if (!a || !b) {
        fprintf(stderr, "bench collectives: out of host memory for memcpy's 2 x %zu bytes\n",
                o->max_bytes);
        goto done;
    }
    memset(a, 1, o->max_bytes);
    memset(b, 2, o->max_bytes);
    for (int s = 0; s < r->nsizes; s++)
        copy_ns[s] = memcpy_ns(r->sizes[s], a, b);
    printf("%-14s %10s %12s %12s %12s %12s %14s\n", "collective", "size", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "memcpy(GB/s)", "busbw/memcpy");
    for (int kind = 0; kind < TD_COLL_KINDS; kind++) {
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
    free_run(r);
    return rc;
}

#ifdef TD_HAVE_MPI
/* The MPI floor, on process 0 (the one with the medians): tandem's MPI
 * transport no slower than MPI_Allreduce on the same processes at any size.
 * Times, not busbw, are compared, so that one process (busbw 0) works too.
 * Returns 1 when it holds. */
static int mpi_floor(const bench_run *r) {
    double worst = 0;
    int worst_s = -1;
    char sz[32];
    for (int s = 0; s < r->nsizes; s++) {
        double ratio = r->mpi_ns[s] / r->ns[0][s]; /* tandem speed / MPI speed */
        if (worst_s < 0 || ratio < worst) {
            worst = ratio;
            worst_s = s;
        }
    }
    if (worst_s < 0)
        return 1;
    printf("floor: mpi transport >= 1.0x MPI_Allreduce at every size (medians): worst %.2f at %s: "
           "%s\n",
           worst, fmt_size(r->sizes[worst_s], sz), worst >= 1.0 ? "PASS" : "FAIL");
    return worst >= 1.0;
}

#ifdef TD_HAVE_MPI
/* tandem's all-reduce and MPI_Allreduce on the same processes, turn about
 * at each repetition, so that both meet the same moments of a noisy
 * machine; from the member's thread, the only one calling MPI meanwhile. */
static td_status mpi_turns_fn(td_group *g, td_device *dev, int rank, int n, void *arg) {
    bench_run *r = arg;
    size_t max = r->sizes[r->nsizes - 1];
    td_buffer *send = NULL, *recv = NULL;
    double *t = r->times, *m = r->times + MAX_REPS;
    char *raw = calloc(max, 1);
    td_status st = TD_OK;
    (void)rank;
    (void)n;
    if (!raw) {
        fprintf(stderr, "bench collectives (mpi): out of host memory\n");
        return TD_ERR_OUT_OF_MEMORY;
    }
    TD_CLI_TRY(td_buffer_alloc(dev, max, &send));
    TD_CLI_TRY(td_buffer_alloc(dev, max, &recv));
    /* Touch every page before timing; zeros keep sums finite. */
    TD_CLI_TRY(td_buffer_write(send, 0, r->zeros, max));
    TD_CLI_TRY(td_buffer_write(recv, 0, r->zeros, max));
    for (int s = 0; s < r->nsizes; s++) {
        int reps = reps_for(r->sizes[s], 1);
        td_collective c = {TD_COLL_ALLREDUCE, send, 0, recv, 0, r->sizes[s] / 4, TD_F32,
                           TD_REDUCE_SUM,     0};
        if (reps > 1000)
            reps = 1000;
        for (int i = -2; i < reps; i++) {
            uint64_t t0 = td_clock_ns(), t1, t2;
            TD_CLI_TRY(td_collective_run(g, &c));
            t1 = td_clock_ns();
            MPI_Allreduce(MPI_IN_PLACE, raw, (int)c.count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t2 = td_clock_ns();
            if (i >= 0) {
                t[i] = (double)(t1 - t0);
                m[i] = (double)(t2 - t1);
            }
        }
        r->ns[0][s] = median(t, reps);
        r->mpi_ns[s] = median(m, reps);
    }
fail:
    td_buffer_free(send);
    td_buffer_free(recv);
    free(raw);
    return st;
}
#endif

/* One device per process, so the MPI transport's numbers compare with
 * MPI_Allreduce on the same processes. Returns 0, 1 on failure, or 3 when
 * the floor fails; every process returns the same floor verdict, so that
 * mpirun's exit status carries it whichever process it reports. */
static int run_mpi_child(const bench_opts *o) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    bench_run *r = NULL;
    bench_opts mo = *o;
    int process = 0, nprocs = 1, rc = 1, floor_ok = 1;
    td_status st;
    cfg.transport = TD_TRANSPORT_MPI;
    cfg.fault = "";
    mo.kinds_mask = 1;
    if (!(r = calloc(1, sizeof *r))) {
        fprintf(stderr, "bench collectives (mpi): out of host memory\n");
        return 1;
    }
    r->o = &mo;
    r->mpi = 1;
    r->nsizes = make_sizes(o, o->mpi_max_bytes, r->sizes);
    /* mpirun binds each process to its own core: "cpu" is that core. tandem
     * initialises MPI with the group. */
    if ((st = td_group_create_spec("cpu", &cfg, &g)) != TD_OK) {
        fprintf(stderr, "bench collectives (mpi): %s: %s\n", td_status_name(st), td_last_error());
        goto done;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &process);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    /* times: the member's repetitions, then MPI's */
    if (alloc_run(r, r->sizes[r->nsizes - 1], 2, " (mpi)"))
        goto done;
    if ((st = td_group_run(g, mpi_turns_fn, r)) != TD_OK) {
        fprintf(stderr, "bench collectives (mpi): %s: %s\n", td_status_name(st), td_last_error());
        goto done;
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
            double mbw = (double)r->sizes[s] / r->mpi_ns[s] * f;
            printf("%-14s %10s %12.2f %12.3f %14.2f %14.3f %12.2f\n", "allreduce",
                   fmt_size(r->sizes[s], sz), r->ns[0][s] / 1e3, bw, r->mpi_ns[s] / 1e3, mbw,
                   r->mpi_ns[s] / r->ns[0][s]);
        }
        floor_ok = mpi_floor(r);
        fflush(stdout);
    }
    MPI_Bcast(&floor_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    rc = floor_ok ? 0 : 3;
done:
    td_group_destroy(g);
    free_run(r);
    /* Every process finished and agrees on the verdict: finalise MPI now, so
     * that a failed floor ends the job as an exit status, not as the
     * MPI_Abort tandem's main sends after a process fails (which a crash,
     * rc 1, still gets, to end processes waiting for this one). */
    if (rc != 1)
        td_comm_mpi_finalize();
    return rc;
}
#endif

/* Runs the MPI section as o->np processes under mpirun, each this program
 * again with --mpi-child. Returns 0, 3 when its floor failed, or 1 when it
 * could not run or crashed (mpirun's own status is neither 0 nor 3). */
static int spawn_mpi(const bench_opts *o) {
    char cmd[1024], self[512];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    int status;
    if (len <= 0) {
        fprintf(stderr, "bench collectives: cannot find this program to start it under mpirun\n");
        return 1;
    }
    self[len] = '\0';
    fflush(stdout);
    snprintf(cmd, sizeof cmd,
             "mpirun --allow-run-as-root --oversubscribe -np %d '%s' %s --mpi-child "
             "--max-bytes %zu --min-bytes %zu",
             o->np, self, o->respawn, o->mpi_max_bytes, o->min_bytes);
    status = system(cmd);
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 3)
        return 3;
    if (status != -1 && WIFEXITED(status))
        fprintf(stderr, "bench collectives: the MPI section failed with exit status %d (%s)\n",
                WEXITSTATUS(status), cmd);
    else
        fprintf(stderr, "bench collectives: the MPI section did not finish (%s)\n", cmd);
    return 1;
}

static int usage(FILE *f) {
    fprintf(f, "usage: collectives [--devices SPEC] [--min-bytes N] [--max-bytes N] "
               "[--only KIND] [--no-mpi] [--np N] [--mpi-max-bytes N] [--calibrate]\n"
               "  Times every collective from 8 B to 256 MiB on the local transport (default "
               "cpu*2),\n  then all-reduce on the MPI transport under mpirun beside "
               "MPI_Allreduce, and checks the floors.\n  Exit status 3 when a floor fails.\n");
    return f == stdout ? 0 : 2;
}

int td_cli_bench_collectives(int argc, char **argv, const char *respawn) {
    bench_opts o;
    int rc;
    memset(&o, 0, sizeof o);
    o.devices = "cpu*2";
    o.min_bytes = 8;
    o.max_bytes = 256u << 20;
    o.mpi_max_bytes = 256u << 20;
    o.kinds_mask = (1 << TD_COLL_KINDS) - 1;
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
            for (int k = 0; k < TD_COLL_KINDS; k++)
                if (!strcmp(v, td_collective_name((td_collective_kind)k)))
                    o.kinds_mask = 1 << k;
            if (!o.kinds_mask)
                return usage(stderr);
            i++;
        } else if (!strcmp(a, "--min-bytes") || !strcmp(a, "--max-bytes") ||
                   !strcmp(a, "--mpi-max-bytes")) {
            if (td_cli_parse_bytes(v, &bytes) != 0 || bytes < 4)
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
        int mpi_rc;
        if (o.mpi_max_bytes > o.max_bytes)
            o.mpi_max_bytes = o.max_bytes;
        mpi_rc = spawn_mpi(&o);
        /* A failure outranks a failed floor: its numbers are missing. */
        if (mpi_rc == 1 || (mpi_rc == 3 && rc == 0))
            rc = mpi_rc;
    } else if (!o.mpi) {
        printf("\n# mpi section skipped (--no-mpi, or no MPI in this build)\n");
    }
    return rc;
}
