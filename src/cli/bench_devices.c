/* tandem bench devices: how fast each device is, measured through tandem's
 * own tensor ops and copies, as a table ranked by f32 GEMM GFLOP/s or as
 * JSON, and cached (td_bench_cache_read and td_bench_cache_write, in
 * tandem/device.h) so that a later run, and the data strategy's first
 * shares, need not measure again.
 *
 * Per device, on its own host thread, one device after another (so that
 * they do not share the memory bus while measured):
 *   GEMM        c (n, n) = a (n, n) b (n, n), f32, f64, then f32 with bf16
 *               products where the device has a bf16 path; n doubles from 128
 *               until one GEMM takes gemm.min_s (or gemm.max_n, or memory);
 *               GFLOP/s = 2 n^3 / median time (bench_devices_gemm.c)
 *   memory      y = a + b over stream_bytes each; GB/s counts the bytes read
 *               and written (3 x stream_bytes), STREAM's convention
 *   H2D, D2H    td_tensor_write and td_tensor_read of stream_bytes
 *   launch      y = x + 0.5 y on one element, waited for: the fixed cost of a pass
 * then, from the calling thread, a copy between each ordered pair of devices.
 * Every figure is the median of several repetitions after a warm-up. A
 * device slowed on purpose ({slowdown=F}, {latency=MS}) is slowed as the nn
 * layer slows its passes: each GEMM, add and tiny op takes F times as long,
 * and the tiny op MS more; copies are not slowed. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_devices.h"
#include "cli.h"
#include "tandem/tandem.h"

#define MAX_REPS    1001
#define MAX_DEVICES 64

typedef struct sizing {
    td_cli_gemm_sizing gemm;
    size_t stream_bytes;    /* each buffer of the add and of the copies */
    double stream_budget_s; /* the add and each copy: repetitions (3 at least) */
    int stream_reps;        /* and at most */
    int launch_reps;
} sizing;

/* About 0.3-0.5 s of GEMM per precision and device, 0.2 s for each of the
 * rest. */
static const sizing full_sizes = {
    .gemm = {.min_s = 0.04, .max_n = 8192, .budget_s = 0.3},
    .stream_bytes = 128u << 20,
    .stream_budget_s = 0.2,
    .stream_reps = 9,
    .launch_reps = 501,
};
/* For tests and a first look: small, so that noise shows more. */
static const sizing quick_sizes = {
    .gemm = {.min_s = 0.001, .max_n = 512, .budget_s = 0.06},
    .stream_bytes = 32u << 20,
    .stream_budget_s = 0.04,
    .stream_reps = 7,
    .launch_reps = 101,
};

typedef struct dev_result {
    td_device *dev;
    td_device_info info;
    char key[TD_BENCH_KEY_MAX];
    int64_t f32_n, f64_n, bf16_n; /* 0: not measured */
    double f32_gflops;            /* GEMM */
    double f64_gflops;            /* 0: n/a (no fp64) */
    double bf16_gflops;           /* f32 GEMM with bf16 products; 0: no bf16 path */
    double mem_gbs, h2d_gbs, d2h_gbs;
    double launch_us;
    int from_cache;
} dev_result;

typedef struct peer_result {
    int src, dst; /* indexes into the results */
    size_t bytes;
    double gbs;
    int from_cache;
} peer_result;

static void usage(FILE *out) {
    fprintf(out,
            "usage: tandem bench devices [--devices SPEC] [--json] [--quick] [--no-cache]\n\n"
            "Measures each device through tandem's own ops: f32, f64 and (where the device\n"
            "has a bf16 path) bf16-product GEMM GFLOP/s, memory\n"
            "bandwidth (a large add), host-to-device and device-to-host copies, copies between\n"
            "each pair of devices, and the fixed cost of a pass (a tiny op, waited for).\n"
            "Prints them ranked by f32 GFLOP/s. Figures are medians after a warm-up, cached\n"
            "per device and build in ~/.cache/tandem/bench-devices.json (TANDEM_CACHE=DIR,\n"
            "TANDEM_BENCH_CACHE=FILE or off); the data strategy starts from them.\n\n"
            "  --devices SPEC  devices to measure (default: all), such as 'cpu*2',\n"
            "                  'cpu:0,cpu:1{slowdown=3}', 'cuda:*,cpu'\n"
            "  --json          print one JSON object instead of a table\n"
            "  --quick         small sizes (well under a second a device): rougher figures\n"
            "  --no-cache      measure again even where the cache has figures (and\n"
            "                  write them)\n"
            "  --help          show this help\n");
}

static double seconds_since(uint64_t t0) {
    return (double)(td_clock_ns() - t0) * 1e-9;
}

/* Measuring one device, on its host thread -------------------------------- */

typedef struct measure {
    const sizing *z;
    dev_result *r;
    uint64_t mem_limit; /* bytes this measurement may take */
    double *t;          /* MAX_REPS times */
} measure;

/* One thing to time, and what it works on. */
typedef struct timed {
    td_status (*fn)(struct timed *x);
    td_device *slowed; /* throttled as a pass of a slowed device; NULL: not (copies) */
    int with_latency;  /* and {latency=MS} added: it stands for a whole pass */
    td_tensor *a, *b, *y;
    void *host;
    size_t bytes;
    td_buffer *src, *dst;
} timed;

static td_status run_add(timed *x) {
    td_status st = td_tensor_add(x->a, x->b, x->y);
    return st != TD_OK ? st : td_device_sync(x->slowed);
}
static td_status run_write(timed *x) {
    return td_tensor_write(x->y, x->host, x->bytes);
}
static td_status run_read(timed *x) {
    return td_tensor_read(x->y, x->host, x->bytes);
}
static td_status run_tiny(timed *x) {
    td_status st = td_tensor_axpby(1.0, x->a, 0.5, x->y);
    return st != TD_OK ? st : td_device_sync(x->slowed);
}
static td_status run_peer(timed *x) {
    td_status st = td_buffer_copy(x->dst, 0, x->src, 0, x->bytes);
    return st != TD_OK ? st : td_device_sync(td_buffer_device(x->dst));
}

/* Runs x `warm` times, then as many times as fill budget_s by the last
 * warm-up's time (3 to max), into t; *out gets the median in seconds. */
static td_status repeat(timed *x, int warm, double budget_s, int max, double *t, double *out) {
    int reps = max;
    for (int i = -warm; i < reps; i++) {
        uint64_t t0 = td_clock_ns();
        td_status st = x->fn(x);
        double s;
        if (st != TD_OK)
            return st;
        if (x->slowed)
            td_device_throttle(x->slowed, t0, x->with_latency);
        s = seconds_since(t0);
        if (i >= 0)
            t[i] = s;
        else if (i == -1 && budget_s > 0)
            reps = (int)fmin(fmax(budget_s / fmax(s, 1e-9), 3), max);
    }
    *out = td_cli_median(t, reps);
    return TD_OK;
}

/* The add (memory bandwidth), then the copies in and out on its output. */
static td_status time_stream(td_device *dev, measure *m) {
    const sizing *z = m->z;
    timed x = {0};
    int64_t numel;
    double s;
    td_status st;
    x.bytes = z->stream_bytes;
    while (x.bytes > (1u << 20) && 3 * (uint64_t)x.bytes > m->mem_limit)
        x.bytes /= 2;
    numel = (int64_t)(x.bytes / 4);
    x.bytes = (size_t)numel * 4;
    /* a, b, y: (numel) */
    TD_CLI_TRY(td_tensor_create(dev, TD_F32, 1, &numel, &x.a));
    TD_CLI_TRY(td_tensor_create(dev, TD_F32, 1, &numel, &x.b));
    TD_CLI_TRY(td_tensor_create(dev, TD_F32, 1, &numel, &x.y));
    TD_CLI_TRY(td_tensor_fill(x.a, 1));
    TD_CLI_TRY(td_tensor_fill(x.b, 2));
    TD_CLI_TRY(td_tensor_fill(x.y, 0));
    x.fn = run_add;
    x.slowed = dev;
    TD_CLI_TRY(repeat(&x, 1, z->stream_budget_s, z->stream_reps, m->t, &s));
    m->r->mem_gbs = 3.0 * (double)x.bytes / s * 1e-9;

    /* 64-byte aligned, as the library's buffers are; aligned_alloc wants a
     * multiple of the alignment, and bytes is one (a multiple of 1 MiB). */
    if (!(x.host = aligned_alloc(64, x.bytes))) {
        td_clear_error(); /* the caller's "out of memory" names the device */
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    memset(x.host, 0, x.bytes); /* every page touched before timing */
    x.slowed = NULL;
    x.fn = run_write;
    TD_CLI_TRY(repeat(&x, 1, z->stream_budget_s, z->stream_reps, m->t, &s));
    m->r->h2d_gbs = (double)x.bytes / s * 1e-9;
    x.fn = run_read;
    TD_CLI_TRY(repeat(&x, 1, z->stream_budget_s, z->stream_reps, m->t, &s));
    m->r->d2h_gbs = (double)x.bytes / s * 1e-9;
fail:
    free(x.host);
    td_tensor_destroy(x.a);
    td_tensor_destroy(x.b);
    td_tensor_destroy(x.y);
    return st;
}

/* A one-element op, waited for: what every kernel launch of a pass costs
 * at least, the per-pass latency of a slowed device included. */
static td_status time_launch(td_device *dev, measure *m) {
    int64_t one = 1;
    timed x = {0};
    double s;
    td_status st;
    TD_CLI_TRY(td_tensor_create(dev, TD_F32, 1, &one, &x.a));
    TD_CLI_TRY(td_tensor_create(dev, TD_F32, 1, &one, &x.y));
    TD_CLI_TRY(td_tensor_fill(x.a, 1));
    TD_CLI_TRY(td_tensor_fill(x.y, 0));
    x.fn = run_tiny;
    x.slowed = dev;
    x.with_latency = 1;
    TD_CLI_TRY(repeat(&x, 10, 0, m->z->launch_reps, m->t, &s));
    m->r->launch_us = s * 1e6;
fail:
    td_tensor_destroy(x.a);
    td_tensor_destroy(x.y);
    return st;
}

static td_status measure_task(td_device *dev, void *arg) {
    measure *m = arg;
    dev_result *r = m->r;
    const td_cli_gemm_sizing *g = &m->z->gemm;
    TD_CLI_CHECK(td_cli_bench_gemm(dev, TD_F32, g, m->mem_limit, m->t, &r->f32_n, &r->f32_gflops));
    if (r->info.fp64)
        TD_CLI_CHECK(
            td_cli_bench_gemm(dev, TD_F64, g, m->mem_limit, m->t, &r->f64_n, &r->f64_gflops));
    if (r->info.caps & TD_DEVICE_CAP_BF16)
        TD_CLI_CHECK(
            td_cli_bench_gemm_bf16(dev, g, m->mem_limit, m->t, &r->bf16_n, &r->bf16_gflops));
    TD_CLI_CHECK(time_stream(dev, m));
    return time_launch(dev, m);
}

static td_status measure_device(dev_result *r, const sizing *z) {
    measure m = {z, r, 0, NULL};
    uint64_t mem = r->info.mem_free ? r->info.mem_free : r->info.mem_total;
    td_status st;
    /* Half of what is free: a GPU shared with others, a budget. */
    m.mem_limit = mem ? mem / 2 : (uint64_t)1 << 30;
    if (!(m.t = calloc(MAX_REPS, sizeof *m.t))) {
        td_clear_error();
        return TD_ERR_OUT_OF_MEMORY;
    }
    st = td_device_run(r->dev, measure_task, &m);
    free(m.t);
    return st;
}

/* A copy from one device to another, from the calling thread. */
static td_status measure_peer(const dev_result *rs, peer_result *p, const sizing *z, double *t) {
    const dev_result *s = &rs[p->src], *d = &rs[p->dst];
    uint64_t free_s = s->info.mem_free ? s->info.mem_free : s->info.mem_total;
    uint64_t free_d = d->info.mem_free ? d->info.mem_free : d->info.mem_total;
    timed x = {0};
    double sec;
    td_status st = TD_OK;
    x.bytes = z->stream_bytes;
    while (x.bytes > (1u << 20) &&
           (2 * (uint64_t)x.bytes > free_s || 2 * (uint64_t)x.bytes > free_d))
        x.bytes /= 2;
    p->bytes = x.bytes;
    TD_CLI_TRY(td_buffer_alloc(s->dev, x.bytes, &x.src));
    TD_CLI_TRY(td_buffer_alloc(d->dev, x.bytes, &x.dst));
    if (!(x.host = calloc(x.bytes, 1))) {
        td_clear_error();
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    TD_CLI_TRY(td_buffer_write(x.src, 0, x.host, x.bytes));
    TD_CLI_TRY(td_buffer_write(x.dst, 0, x.host, x.bytes));
    x.fn = run_peer;
    TD_CLI_TRY(repeat(&x, 1, z->stream_budget_s, z->stream_reps, t, &sec));
    p->gbs = (double)x.bytes / sec * 1e-9;
fail:
    free(x.host);
    td_buffer_free(x.src);
    td_buffer_free(x.dst);
    return st;
}

/* The cache ------------------------------------------------------------------ */

/* Whether a cached entry serves this run: a quick run takes any, a full run
 * only a full one. */
static int entry_serves(const json_t *e, int quick) {
    return e && (quick || !json_is_true(json_object_get(e, "quick")));
}

static void from_entry(dev_result *r, const json_t *e) {
    const json_t *f64 = json_object_get(e, "gemm_f64_gflops");
    const json_t *bf16 = json_object_get(e, "gemm_bf16_gflops");
    r->f32_gflops = json_number_value(json_object_get(e, "gemm_f32_gflops"));
    r->f32_n = (int64_t)json_number_value(json_object_get(e, "gemm_f32_n"));
    r->f64_gflops = json_is_number(f64) ? json_number_value(f64) : 0;
    r->f64_n = r->f64_gflops > 0 ? (int64_t)json_number_value(json_object_get(e, "gemm_f64_n")) : 0;
    /* Absent from caches written before bf16 was measured: shown as n/a. */
    r->bf16_gflops = json_is_number(bf16) ? json_number_value(bf16) : 0;
    r->bf16_n =
        r->bf16_gflops > 0 ? (int64_t)json_number_value(json_object_get(e, "gemm_bf16_n")) : 0;
    r->mem_gbs = json_number_value(json_object_get(e, "mem_bw_gbs"));
    r->h2d_gbs = json_number_value(json_object_get(e, "h2d_gbs"));
    r->d2h_gbs = json_number_value(json_object_get(e, "d2h_gbs"));
    r->launch_us = json_number_value(json_object_get(e, "launch_us"));
    r->from_cache = 1;
}

static json_t *real_or_null(double v) {
    return v > 0 && isfinite(v) ? json_real(v) : json_null();
}

static json_t *to_entry(const dev_result *r, int quick) {
    json_t *e = json_pack("{s:s, s:s, s:b, s:I, s:f, s:I, s:o, s:o, s:f, s:f, s:f, s:f}", "device",
                          r->info.name, "build", td_bench_build_id(), "quick", quick,
                          "measured_unix", (json_int_t)time(NULL), "gemm_f32_gflops", r->f32_gflops,
                          "gemm_f32_n", (json_int_t)r->f32_n, "gemm_f64_gflops",
                          real_or_null(r->f64_gflops), "gemm_f64_n",
                          r->f64_n ? json_integer(r->f64_n) : json_null(), "mem_bw_gbs", r->mem_gbs,
                          "h2d_gbs", r->h2d_gbs, "d2h_gbs", r->d2h_gbs, "launch_us", r->launch_us);
    if (e) {
        json_object_set_new(e, "gemm_bf16_gflops", real_or_null(r->bf16_gflops));
        json_object_set_new(e, "gemm_bf16_n", r->bf16_n ? json_integer(r->bf16_n) : json_null());
    }
    return e;
}

static json_t *peer_entry(const dev_result *rs, const peer_result *p, int quick) {
    return json_pack("{s:s, s:s, s:s, s:b, s:I, s:I, s:f}", "src", rs[p->src].info.name, "dst",
                     rs[p->dst].info.name, "build", td_bench_build_id(), "quick", quick,
                     "measured_unix", (json_int_t)time(NULL), "bytes", (json_int_t)p->bytes, "gbs",
                     p->gbs);
}

static const char *state_name(td_bench_cache_state s) {
    switch (s) {
    case TD_BENCH_CACHE_OFF: return "off";
    case TD_BENCH_CACHE_MISSING: return "missing";
    case TD_BENCH_CACHE_OK: return "ok";
    case TD_BENCH_CACHE_PARTLY: return "partly invalid";
    default: return "invalid";
    }
}

/* Output --------------------------------------------------------------------- */

static int by_f32_desc(const void *a, const void *b) {
    const dev_result *x = *(dev_result *const *)a, *y = *(dev_result *const *)b;
    if (x->f32_gflops != y->f32_gflops)
        return x->f32_gflops < y->f32_gflops ? 1 : -1;
    return x < y ? -1 : x > y; /* ties keep the spec's order */
}

static void print_ratio(char *buf, size_t n, double r) {
    if (r > 0)
        snprintf(buf, n, "1:%.2g", 1.0 / r);
    else
        snprintf(buf, n, "n/a");
}

static void print_table(dev_result **ranked, int nd, const dev_result *rs, const peer_result *ps,
                        int np, const char *spec, int quick, const char *cache_path,
                        td_bench_cache_state state, int written, double wall_s) {
    int measured = 0;
    printf("# tandem bench devices: %s (%s sizes; medians after a warm-up)\n", spec,
           quick ? "quick" : "full");
    printf("# ranked by f32 GEMM GFLOP/s; mem: y = a + b, bytes read + written; launch: a\n"
           "# one-element op, waited for (the fixed cost of every pass); bf16: f32 GEMM\n"
           "# with bf16 products, n/a without a bf16 path (tandem devices says which)\n");
    printf("%-4s %-12s %-7s %17s %17s %9s %9s %18s %9s %9s %9s %10s %s\n", "rank", "device",
           "backend", "f32 GFLOP/s (n)", "f64 GFLOP/s (n)", "fp64:32", "vendor", "bf16 GFLOP/s (n)",
           "mem GB/s", "H2D GB/s", "D2H GB/s", "launch us", "source");
    for (int k = 0; k < nd; k++) {
        const dev_result *r = ranked[k];
        char f32[32], f64[32], ratio[16], vendor[16], bf16[32];
        snprintf(f32, sizeof f32, "%.1f (%lld)", r->f32_gflops, (long long)r->f32_n);
        if (r->f64_gflops > 0)
            snprintf(f64, sizeof f64, "%.1f (%lld)", r->f64_gflops, (long long)r->f64_n);
        else
            snprintf(f64, sizeof f64, "n/a");
        if (r->bf16_gflops > 0)
            snprintf(bf16, sizeof bf16, "%.1f (%lld)", r->bf16_gflops, (long long)r->bf16_n);
        else
            snprintf(bf16, sizeof bf16, "n/a");
        print_ratio(ratio, sizeof ratio, r->f64_gflops > 0 ? r->f64_gflops / r->f32_gflops : 0);
        print_ratio(vendor, sizeof vendor, r->info.fp64 ? r->info.fp64_rate : 0);
        if (r->info.fp64 && r->info.fp64_rate <= 0)
            snprintf(vendor, sizeof vendor, "?");
        printf("%4d %-12s %-7s %17s %17s %9s %9s %18s %9.2f %9.2f %9.2f %10.2f %s\n", k + 1,
               r->info.name, r->info.backend, f32, f64, ratio, vendor, bf16, r->mem_gbs, r->h2d_gbs,
               r->d2h_gbs, r->launch_us, r->from_cache ? "cache" : "measured");
        measured += !r->from_cache;
    }
    for (int k = 0; k < nd; k++)
        if (*ranked[k]->info.model || ranked[k]->info.slowdown > 1)
            printf("#   %s: %s%s\n", ranked[k]->info.name, ranked[k]->info.model,
                   ranked[k]->info.slowdown > 1 ? " (slowed on purpose)" : "");
    if (np) {
        printf("\npeer copies, one direction (GB/s):\n");
        for (int i = 0; i < np; i++) {
            char sz[32];
            printf("  %-12s -> %-12s %9.2f   (%s, %s)\n", rs[ps[i].src].info.name,
                   rs[ps[i].dst].info.name, ps[i].gbs, td_cli_format_bytes((double)ps[i].bytes, sz),
                   ps[i].from_cache ? "cache" : "measured");
        }
    }
    if (state == TD_BENCH_CACHE_OFF)
        printf("\ncache: off (TANDEM_BENCH_CACHE=off, or no home folder)\n");
    else
        printf("\ncache: %s (%d of %d devices measured now%s)\n", cache_path, measured, nd,
               written ? ", written" : "");
    printf("took %.1f s\n", wall_s);
}

static json_t *device_json(const dev_result *r, int rank) {
    json_t *o = json_object();
    json_object_set_new(o, "rank", json_integer(rank));
    json_object_set_new(o, "name", json_string(r->info.name));
    json_object_set_new(o, "backend", json_string(r->info.backend));
    json_object_set_new(o, "model", json_string(r->info.model));
    json_object_set_new(o, "slowdown", json_real(r->info.slowdown));
    json_object_set_new(o, "gemm_f32_gflops", json_real(r->f32_gflops));
    json_object_set_new(o, "gemm_f32_n", json_integer(r->f32_n));
    json_object_set_new(o, "gemm_f64_gflops", real_or_null(r->f64_gflops));
    json_object_set_new(o, "gemm_f64_n", r->f64_n ? json_integer(r->f64_n) : json_null());
    json_object_set_new(o, "gemm_bf16_gflops", real_or_null(r->bf16_gflops));
    json_object_set_new(o, "gemm_bf16_n", r->bf16_n ? json_integer(r->bf16_n) : json_null());
    json_object_set_new(o, "bf16", json_string(r->info.bf16));
    json_object_set_new(o, "fp64_ratio",
                        r->f64_gflops > 0 ? json_real(r->f64_gflops / r->f32_gflops) : json_null());
    json_object_set_new(o, "vendor_fp64_ratio", real_or_null(r->info.fp64_rate));
    json_object_set_new(o, "mem_bw_gbs", json_real(r->mem_gbs));
    json_object_set_new(o, "h2d_gbs", json_real(r->h2d_gbs));
    json_object_set_new(o, "d2h_gbs", json_real(r->d2h_gbs));
    json_object_set_new(o, "launch_us", json_real(r->launch_us));
    json_object_set_new(o, "from_cache", json_boolean(r->from_cache));
    return o;
}

static void print_json(dev_result **ranked, int nd, const dev_result *rs, const peer_result *ps,
                       int np, const char *spec, int quick, const char *cache_path,
                       td_bench_cache_state state, const char *why, int written, double wall_s) {
    json_t *root = json_object(), *devs = json_array(), *peers = json_array(), *cache;
    json_object_set_new(root, "version", json_string(TD_VERSION_STRING));
    json_object_set_new(root, "build", json_string(td_bench_build_id()));
    json_object_set_new(root, "devices_spec", json_string(spec));
    json_object_set_new(root, "quick", json_boolean(quick));
    for (int k = 0; k < nd; k++)
        json_array_append_new(devs, device_json(ranked[k], k + 1));
    json_object_set_new(root, "devices", devs);
    for (int i = 0; i < np; i++)
        json_array_append_new(
            peers, json_pack("{s:s, s:s, s:I, s:f, s:b}", "src", rs[ps[i].src].info.name, "dst",
                             rs[ps[i].dst].info.name, "bytes", (json_int_t)ps[i].bytes, "gbs",
                             ps[i].gbs, "from_cache", ps[i].from_cache));
    json_object_set_new(root, "peers", peers);
    cache = json_pack("{s:o, s:s, s:o, s:b}", "path",
                      state == TD_BENCH_CACHE_OFF ? json_null() : json_string(cache_path), "read",
                      state_name(state), "problem", *why ? json_string(why) : json_null(),
                      "written", written);
    json_object_set_new(root, "cache", cache);
    json_object_set_new(root, "seconds", json_real(wall_s));
    json_dumpf(root, stdout, JSON_INDENT(2));
    printf("\n");
    json_decref(root);
}

/* The command ---------------------------------------------------------------- */

int td_cli_bench_devices(int argc, char **argv) {
    static const struct option opts[] = {
        {"devices", required_argument, NULL, 'd'}, {"json", no_argument, NULL, 'j'},
        {"quick", no_argument, NULL, 'q'},         {"no-cache", no_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0},
    };
    const char *spec = "all";
    int as_json = 0, quick = 0, no_cache = 0, c, rc = 1, nd = 0, np = 0, written = 0, dirty = 0;
    char cache_path[4096] = "", why[256] = "";
    td_bench_cache_state state = TD_BENCH_CACHE_OFF;
    td_device_list *list = NULL;
    dev_result *rs = NULL, *ranked[MAX_DEVICES];
    peer_result *ps = NULL;
    json_t *entries = NULL;
    double *t = NULL;
    const sizing *z;
    uint64_t t0 = td_clock_ns();
    td_status st;

    optind = 1;
    while ((c = getopt_long(argc, argv, "d:jqnh", opts, NULL)) != -1) {
        switch (c) {
        case 'd': spec = optarg; break;
        case 'j': as_json = 1; break;
        case 'q': quick = 1; break;
        case 'n': no_cache = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "tandem bench devices: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    z = quick ? &quick_sizes : &full_sizes;
    if ((st = td_devices_open(spec, &list)) != TD_OK)
        return td_cli_fail("bench devices", st);
    nd = (int)td_device_list_count(list);
    if (nd > MAX_DEVICES) {
        fprintf(stderr, "tandem bench devices: %d devices; at most %d at once\n", nd, MAX_DEVICES);
        goto done;
    }
    rs = calloc((size_t)nd, sizeof *rs);
    ps = calloc((size_t)(nd * nd + 1), sizeof *ps);
    t = calloc(MAX_REPS, sizeof *t);
    if (!rs || !ps || !t) {
        td_clear_error();
        rc = td_cli_fail("bench devices", TD_ERR_OUT_OF_MEMORY);
        goto done;
    }
    for (int i = 0; i < nd; i++) {
        rs[i].dev = td_device_list_get(list, i);
        if ((st = td_device_get_info(rs[i].dev, &rs[i].info)) != TD_OK ||
            (st = td_bench_device_key(rs[i].dev, rs[i].key, sizeof rs[i].key)) != TD_OK) {
            rc = td_cli_fail("bench devices", st);
            goto done;
        }
        ranked[i] = &rs[i];
    }

    if (td_bench_cache_path(cache_path, sizeof cache_path)) {
        char *text = NULL;
        if ((st = td_bench_cache_read(cache_path, &text, &state, why, sizeof why)) != TD_OK) {
            rc = td_cli_fail("bench devices", st);
            goto done;
        }
        entries = json_loads(text, 0, NULL);
        free(text);
        if (!entries) {
            td_clear_error();
            rc = td_cli_fail("bench devices: reading the cache", TD_ERR_OUT_OF_MEMORY);
            goto done;
        }
        /* What was left out is rewritten below, whatever else happens. */
        dirty = state == TD_BENCH_CACHE_INVALID || state == TD_BENCH_CACHE_PARTLY;
        if (*why)
            fprintf(stderr,
                    "tandem bench devices: ignoring %s in the cache %s: %s; measuring "
                    "again and rewriting it\n",
                    state == TD_BENCH_CACHE_INVALID ? "everything" : "some entries", cache_path,
                    why);
    }

    for (int i = 0; i < nd; i++) {
        const json_t *e = entries && !no_cache ? json_object_get(entries, rs[i].key) : NULL;
        if (entry_serves(e, quick)) {
            from_entry(&rs[i], e);
            continue;
        }
        if (!as_json) {
            fprintf(stderr, "measuring %s ...\n", rs[i].info.name);
        }
        if ((st = measure_device(&rs[i], z)) != TD_OK) {
            char what[128];
            snprintf(what, sizeof what, "bench devices: %s", rs[i].info.name);
            rc = td_cli_fail(what, st);
            goto done;
        }
        if (entries)
            json_object_set_new(entries, rs[i].key, to_entry(&rs[i], quick));
        dirty = 1;
    }
    for (int i = 0; i < nd; i++)
        for (int j = 0; j < nd; j++) {
            char key[TD_BENCH_PEER_KEY_MAX];
            const json_t *e;
            peer_result *p = &ps[np];
            if (i == j)
                continue;
            p->src = i;
            p->dst = j;
            td_bench_peer_key(rs[i].key, rs[j].key, key, sizeof key);
            e = entries && !no_cache ? json_object_get(entries, key) : NULL;
            if (entry_serves(e, quick)) {
                p->gbs = json_number_value(json_object_get(e, "gbs"));
                p->bytes = (size_t)json_number_value(json_object_get(e, "bytes"));
                p->from_cache = 1;
            } else {
                if ((st = measure_peer(rs, p, z, t)) != TD_OK) {
                    char what[160];
                    snprintf(what, sizeof what, "bench devices: copy %s -> %s", rs[i].info.name,
                             rs[j].info.name);
                    rc = td_cli_fail(what, st);
                    goto done;
                }
                if (entries)
                    json_object_set_new(entries, key, peer_entry(rs, p, quick));
                dirty = 1;
            }
            np++;
        }

    if (entries && dirty) {
        char *text = json_dumps(entries, JSON_COMPACT);
        if (!text)
            fprintf(stderr, "tandem bench devices: the cache was not written: out of memory\n");
        else if ((st = td_bench_cache_write(cache_path, text)) == TD_OK)
            written = 1;
        else
            fprintf(stderr, "tandem bench devices: the cache was not written: %s\n",
                    td_last_error());
        free(text);
    }
    qsort(ranked, (size_t)nd, sizeof *ranked, by_f32_desc);
    if (as_json)
        print_json(ranked, nd, rs, ps, np, spec, quick, cache_path, state, why, written,
                   seconds_since(t0));
    else {
        print_table(ranked, nd, rs, ps, np, spec, quick, cache_path, state, written,
                    seconds_since(t0));
        if (*td_device_list_notes(list))
            printf("%s", td_device_list_notes(list));
    }
    rc = 0;
done:
    json_decref(entries);
    free(t);
    free(ps);
    free(rs);
    td_device_list_destroy(list);
    return rc;
}
