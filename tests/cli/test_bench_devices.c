/* `tandem bench devices` as a user runs it: its JSON parsed back with a
 * real parser, every figure positive and finite, the ranking following the
 * figures (injected through the cache, so that it does not depend on how
 * busy the machine is: a slowed device's measured speed is for benches),
 * the GEMM figures against OpenBLAS timed here, the cache written, read
 * back, and not trusted when corrupt; errors; an OpenCL device when there
 * is one; and the data strategy's first shares from the cache. Every run
 * names its own cache file in this test's folder (the others run with
 * TANDEM_BENCH_CACHE=off). */
#include <cblas.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/cpu_flags.h"
#include "support/support.h"
#include "tandem/comm.h"
#include "tandem/parallel.h"

#define PAIR "'cpu:0,cpu:1{slowdown=3}'"

void openblas_set_num_threads(int n);

static char cache[1024]; /* this test's cache file (in a folder made by the run) */
static json_t *first;    /* the first run's output */

/* Runs "ENV tandem bench devices ARGS"; returns the exit status. */
static int run(const char *env, const char *args, char **out, char **err) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s '%s' bench devices %s", env, TD_TANDEM_EXE, args);
    return td_test_run_command(cmd, out, err);
}

/* Runs with this test's cache and --json, expects exit 0, parses stdout. */
static json_t *run_json(const char *args) {
    char env[1200], *out, *err;
    json_error_t jerr;
    json_t *root;
    int rc;
    snprintf(env, sizeof env, "TANDEM_BENCH_CACHE='%s'", cache);
    rc = run(env, args, &out, &err);
    if (rc != 0)
        fail_msg("'bench devices %s' exited %d\nstdout: %s\nstderr: %s", args, rc, out, err);
    if (!(root = json_loads(out, 0, &jerr)))
        fail_msg("not JSON (%s, line %d): %s", jerr.text, jerr.line, out);
    free(out);
    free(err);
    return root;
}

static double num(const json_t *o, const char *field) {
    const json_t *v = json_object_get(o, field);
    if (!json_is_number(v))
        fail_msg("field '%s' is missing or not a number", field);
    return json_number_value(v);
}

/* A positive finite number (and below an absurd bound). */
static double positive(const json_t *o, const char *field, double max) {
    double v = num(o, field);
    if (!(isfinite(v) && v > 0 && v < max))
        fail_msg("%s = %g: not a positive finite number below %g", field, v, max);
    return v;
}

static const json_t *device(const json_t *root, int rank) {
    const json_t *d = json_array_get(json_object_get(root, "devices"), (size_t)rank);
    assert_non_null(d);
    return d;
}

static const char *str(const json_t *o, const char *field) {
    const char *s = json_string_value(json_object_get(o, field));
    if (!s)
        fail_msg("field '%s' is missing or not a string", field);
    return s ? s : "";
}

static int from_cache(const json_t *root, int rank) {
    const json_t *v = json_object_get(device(root, rank), "from_cache");
    assert_true(json_is_boolean(v));
    return json_is_true(v);
}

/* Every CPU has a bf16 path (native or emulated): measured, a figure; from
 * a cache written before bf16 was measured, null. The class follows
 * /proc/cpuinfo's flags. No timing is compared: the machine is busy. */
static void check_bf16(const json_t *d) {
    const char *want = td_test_cpu_bf16_class(), *b = str(d, "bf16");
    if (want && strncmp(b, want, strlen(want)))
        fail_msg("bf16 is '%s'; /proc/cpuinfo's flags say '%s'", b, want);
    if (!want && strncmp(b, "native", 6) && strncmp(b, "emulated", 8))
        fail_msg("bf16 is '%s': neither native nor emulated", b);
    if (json_is_true(json_object_get(d, "from_cache")) &&
        json_is_null(json_object_get(d, "gemm_bf16_gflops"))) {
        assert_true(json_is_null(json_object_get(d, "gemm_bf16_n")));
        return;
    }
    positive(d, "gemm_bf16_gflops", 1e5);
    assert_true(json_is_integer(json_object_get(d, "gemm_bf16_n")));
    positive(d, "gemm_bf16_n", 1e5);
}

/* Every field of a CPU device, as the JSON promises them. */
static void check_cpu_device(const json_t *d, int rank) {
    double f32 = positive(d, "gemm_f32_gflops", 1e5), f64 = positive(d, "gemm_f64_gflops", 1e5);
    assert_int_equal(json_integer_value(json_object_get(d, "rank")), rank);
    assert_string_equal(str(d, "backend"), "cpu");
    assert_true(json_is_integer(json_object_get(d, "gemm_f32_n")));
    assert_true(json_is_integer(json_object_get(d, "gemm_f64_n")));
    positive(d, "gemm_f32_n", 1e5);
    positive(d, "gemm_f64_n", 1e5);
    assert_true(fabs(num(d, "fp64_ratio") - f64 / f32) < 1e-9);
    assert_true(num(d, "vendor_fp64_ratio") == 0.5);
    positive(d, "mem_bw_gbs", 1e4);
    positive(d, "h2d_gbs", 1e4);
    positive(d, "d2h_gbs", 1e4);
    positive(d, "launch_us", 1e6);
    positive(d, "slowdown", 1e3);
    assert_true(json_is_string(json_object_get(d, "model")));
    check_bf16(d);
}

static void first_run(void) {
    if (!first)
        first = run_json("--devices " PAIR " --json --quick");
}

/* The device of root named name, whichever rank it has. */
static const json_t *named(const json_t *root, const char *name) {
    const json_t *devs = json_object_get(root, "devices"), *d;
    size_t i;
    json_array_foreach(devs, i, d) {
        if (!strcmp(str(d, "name"), name))
            return d;
    }
    fail_msg("no device named %s", name);
    return NULL;
}

/* Ranks are by f32 GFLOP/s, fastest first: whatever was measured, the
 * device ranked first has the larger figure. */
static void check_ranked_by_f32(const json_t *root) {
    const json_t *d0 = device(root, 0), *d1 = device(root, 1);
    if (!(num(d0, "gemm_f32_gflops") >= num(d1, "gemm_f32_gflops")))
        fail_msg("%s (%.1f GFLOP/s) is ranked above %s (%.1f)", str(d0, "name"),
                 num(d0, "gemm_f32_gflops"), str(d1, "name"), num(d1, "gemm_f32_gflops"));
}

static void json_has_every_field_and_ranks_by_f32(void **state) {
    const json_t *peers, *c;
    first_run();
    assert_int_equal(json_array_size(json_object_get(first, "devices")), 2);
    check_cpu_device(device(first, 0), 1);
    check_cpu_device(device(first, 1), 2);
    assert_false(from_cache(first, 0));
    assert_false(from_cache(first, 1));
    /* both directions between the two */
    peers = json_object_get(first, "peers");
    assert_int_equal(json_array_size(peers), 2);
    for (size_t i = 0; i < 2; i++) {
        const json_t *p = json_array_get(peers, i);
        positive(p, "gbs", 1e4);
        positive(p, "bytes", 1e12);
        assert_string_not_equal(str(p, "src"), str(p, "dst"));
    }
    assert_true(json_is_true(json_object_get(first, "quick")));
    positive(first, "seconds", 1e4);
    assert_string_equal(str(first, "version"), TD_VERSION_STRING);
    c = json_object_get(first, "cache");
    assert_string_equal(str(c, "path"), cache);
    assert_string_equal(str(c, "read"), "missing");
    assert_true(json_is_true(json_object_get(c, "written")));
    assert_int_equal(access(cache, R_OK), 0);
    check_ranked_by_f32(first);
    assert_true(num(named(first, "cpu:0"), "slowdown") == 1);
    assert_true(num(named(first, "cpu:1"), "slowdown") == 3);
    /* On a quiet machine about 3x; on a busy one anything (other work
     * pinned to cpu:0's core made it 0.78x once). Shown, not asserted:
     * bench/ holds the timing comparisons. */
    print_message("f32 GFLOP/s: cpu:0 over cpu:1{slowdown=3}: %.2fx\n",
                  num(named(first, "cpu:0"), "gemm_f32_gflops") /
                      num(named(first, "cpu:1"), "gemm_f32_gflops"));
}

/* A cache at path holding PAIR's two devices with these f32 GFLOP/s and
 * the copies between them, so that a run takes every figure from it. */
static void inject(const char *path, double f32_fast, double f32_slowed) {
    td_device_list *l = td_test_open("cpu:0,cpu:1{slowdown=3}");
    char key[2][TD_BENCH_KEY_MAX], peer[TD_BENCH_PEER_KEY_MAX], *text;
    json_t *entries = json_object();
    const double f32[2] = {f32_fast, f32_slowed};
    for (int i = 0; i < 2; i++) {
        TD_ASSERT_OK(td_bench_device_key(td_device_list_get(l, (size_t)i), key[i], sizeof key[i]));
        json_object_set_new(
            entries, key[i],
            json_pack("{s:s, s:s, s:b, s:I, s:f, s:I, s:f, s:I, s:f, s:f, s:f, s:f}", "device",
                      i ? "cpu:1" : "cpu:0", "build", td_bench_build_id(), "quick", 1,
                      "measured_unix", (json_int_t)1700000000, "gemm_f32_gflops", f32[i],
                      "gemm_f32_n", (json_int_t)512, "gemm_f64_gflops", f32[i] / 2, "gemm_f64_n",
                      (json_int_t)512, "mem_bw_gbs", 10.0, "h2d_gbs", 5.0, "d2h_gbs", 5.0,
                      "launch_us", 2.0));
    }
    for (int i = 0; i < 2; i++) {
        td_bench_peer_key(key[i], key[1 - i], peer, sizeof peer);
        json_object_set_new(entries, peer,
                            json_pack("{s:s, s:s, s:s, s:b, s:I, s:I, s:f}", "src",
                                      i ? "cpu:1" : "cpu:0", "dst", i ? "cpu:0" : "cpu:1", "build",
                                      td_bench_build_id(), "quick", 1, "measured_unix",
                                      (json_int_t)1700000000, "bytes", (json_int_t)1 << 20, "gbs",
                                      4.0));
    }
    text = json_dumps(entries, 0);
    TD_ASSERT_OK(td_bench_cache_write(path, text));
    free(text);
    json_decref(entries);
    td_device_list_destroy(l);
}

/* The ranking comes from the figures, not from the names or the order
 * given: with the slowed device's figure the lower it ranks second, with
 * it the higher (a cache measured on a machine busy elsewhere) first. */
static void the_ranking_follows_the_figures(void **state) {
    char env[1200], *out, *err;
    const char *path = td_test_tmp("injected/bench-devices.json");
    static const struct {
        double fast, slowed;
        const char *first;
    } cases[] = {{90.0, 30.0, "cpu:0"}, {40.0, 120.0, "cpu:1"}};
    (void)state;
    snprintf(env, sizeof env, "TANDEM_BENCH_CACHE='%s'", path);
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        json_t *root;
        json_error_t jerr;
        inject(path, cases[k].fast, cases[k].slowed);
        assert_int_equal(run(env, "--devices " PAIR " --json --quick", &out, &err), 0);
        if (!(root = json_loads(out, 0, &jerr)))
            fail_msg("not JSON (%s): %s", jerr.text, out);
        free(out);
        free(err);
        assert_true(from_cache(root, 0) && from_cache(root, 1));
        /* The injected entries predate bf16: they still load, without it. */
        assert_true(json_is_null(json_object_get(device(root, 0), "gemm_bf16_gflops")));
        assert_string_equal(str(device(root, 0), "name"), cases[k].first);
        check_cpu_device(device(root, 0), 1);
        check_cpu_device(device(root, 1), 2);
        assert_true(num(named(root, "cpu:0"), "gemm_f32_gflops") == cases[k].fast);
        assert_true(num(named(root, "cpu:1"), "gemm_f32_gflops") == cases[k].slowed);
        assert_true(num(named(root, "cpu:1"), "slowdown") == 3);
        json_decref(root);
    }
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GFLOP/s of OpenBLAS on one thread here, n x n x n, the fastest of 15:
 * this process is not pinned to a core as a device's thread is, and on a
 * shared machine the fastest is the least disturbed. */
static double blas_gflops(int f64, int n) {
    size_t nn = (size_t)n * (size_t)n;
    void *a = calloc(nn, 8), *b = calloc(nn, 8), *c = calloc(nn, 8);
    double t[15];
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    for (size_t i = 0; i < nn; i++) {
        if (f64) {
            ((double *)a)[i] = (double)(i % 7) * 0.25;
            ((double *)b)[i] = (double)(i % 5) * 0.5;
        } else {
            ((float *)a)[i] = (float)(i % 7) * 0.25f;
            ((float *)b)[i] = (float)(i % 5) * 0.5f;
        }
    }
    openblas_set_num_threads(1);
    for (int r = -2; r < 15; r++) {
        double t0 = now_s();
        if (f64)
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, a, n, b, n, 0.0, c,
                        n);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
        if (r >= 0)
            t[r] = now_s() - t0;
    }
    free(a);
    free(b);
    free(c);
    qsort(t, 15, sizeof *t, cmp_double);
    return 2.0 * (double)n * n * n / t[0] * 1e-9;
}

/* The figures are checked against OpenBLAS called here, not against
 * themselves. f64 GEMM on a CPU device is OpenBLAS's dgemm on one core, so
 * the two agree up to noise; f32 is tandem's own AVX-512 kernel where the
 * CPU has it (OpenBLAS is held to its AVX2 kernels), up to about twice as
 * fast, and never far slower. The bounds are wide because tandem's figure
 * is a median and this one the fastest run: on a busy machine the median
 * comes out low. What they catch is a figure wrong by a large factor (an
 * op not waited for, a miscounted size). */
static void gemm_agrees_with_openblas_timed_here(void **state) {
    const json_t *fast;
    double t32, t64, b32, b64;
    first_run();
    fast = device(first, 0);
    t32 = num(fast, "gemm_f32_gflops");
    t64 = num(fast, "gemm_f64_gflops");
    b32 = blas_gflops(0, (int)num(fast, "gemm_f32_n"));
    b64 = blas_gflops(1, (int)num(fast, "gemm_f64_n"));
    print_message("cpu:0 against cblas here: f32 %.1f vs %.1f, f64 %.1f vs %.1f GFLOP/s\n", t32,
                  b32, t64, b64);
    if (!(t64 > b64 / 6 && t64 < b64 * 3))
        fail_msg("f64: tandem %.1f GFLOP/s, cblas_dgemm %.1f: not within 1/6x to 3x", t64, b64);
    /* tandem's own kernel is compiled as the library is: unoptimised or
     * with sanitizers, it is that much slower, as it should be */
    if (strstr(str(first, "build"), "release") == NULL ||
        strstr(str(first, "build"), "sanitized") != NULL) {
        print_message("f32 not compared: a %s build\n", str(first, "build"));
        return;
    }
    if (!(t32 > b32 / 6 && t32 < b32 * 5))
        fail_msg("f32: tandem %.1f GFLOP/s, cblas_sgemm %.1f: not within 1/6x to 5x", t32, b32);
}

static void a_second_run_reads_the_cache(void **state) {
    json_t *again;
    const json_t *c;
    first_run();
    again = run_json("--devices " PAIR " --json --quick");
    for (int r = 0; r < 2; r++) {
        assert_true(from_cache(again, r));
        assert_string_equal(str(device(again, r), "name"), str(device(first, r), "name"));
        /* the very figures, not measured again */
        assert_true(num(device(again, r), "gemm_f32_gflops") ==
                    num(device(first, r), "gemm_f32_gflops"));
        assert_true(num(device(again, r), "launch_us") == num(device(first, r), "launch_us"));
    }
    for (size_t i = 0; i < 2; i++)
        assert_true(json_is_true(
            json_object_get(json_array_get(json_object_get(again, "peers"), i), "from_cache")));
    assert_true(num(again, "seconds") < num(first, "seconds"));
    c = json_object_get(again, "cache");
    assert_string_equal(str(c, "read"), "ok");
    assert_false(json_is_true(json_object_get(c, "written")));
    json_decref(again);
}

/* The text table, from an injected cache: ranked by f32, the fp64 ratio
 * beside the vendor's, and where the figures came from. */
static void the_table_ranks_by_f32(void **state) {
    char env[1200], *out, *err, *one, *two;
    const char *path = td_test_tmp("table/bench-devices.json");
    (void)state;
    inject(path, 30.0, 90.0); /* the slowed device's figure the higher: it ranks first */
    snprintf(env, sizeof env, "TANDEM_BENCH_CACHE='%s'", path);
    assert_int_equal(run(env, "--devices " PAIR " --quick", &out, &err), 0);
    one = strstr(out, "   1 cpu:1");
    two = strstr(out, "   2 cpu:0");
    if (!one || !two || two < one)
        fail_msg("cpu:1 (90 GFLOP/s) is not ranked above cpu:0 (30):\n%s", out);
    assert_non_null(strstr(out, "f32 GFLOP/s"));
    assert_non_null(strstr(out, "fp64:32"));
    assert_non_null(strstr(out, "bf16 GFLOP/s"));
    assert_non_null(strstr(out, "1:2 ")); /* the vendor's fp64:fp32 for a CPU */
    assert_non_null(strstr(out, "cpu:0        -> cpu:1"));
    assert_non_null(strstr(out, " cache\n"));
    free(out);
    free(err);
}

/* The data strategy starts from the cached f32 GFLOP/s before any
 * calibration, and from equal shares with the cache off. */
static void cached_figures_give_the_first_shares(void **state) {
    static const char *model = "{\"name\": \"m\", \"input\": {\"shape\": [4]}, \"layers\": ["
                               "{\"type\": \"linear\", \"out\": 3}]}";
    td_optimizer_config o = TD_OPTIMIZER_CONFIG_INIT;
    json_t *now;
    td_group *g = NULL;
    td_dp *dp = NULL;
    double g0, g1, want;
    first_run();
    /* what the cache holds now (a quick read) */
    now = run_json("--devices " PAIR " --json --quick");
    assert_true(from_cache(now, 0) && from_cache(now, 1));
    g0 = num(named(now, "cpu:0"), "gemm_f32_gflops");
    g1 = num(named(now, "cpu:1"), "gemm_f32_gflops");
    want = g0 / (g0 + g1);
    json_decref(now);

    setenv("TANDEM_BENCH_CACHE", cache, 1);
    TD_ASSERT_OK(td_group_create_spec("cpu:0,cpu:1{slowdown=3}", NULL, &g));
    TD_ASSERT_OK(td_dp_create(g, model, "m", TD_F32, 1, &o, NULL, &dp));
    print_message("first share of cpu:0 from the cache: %.3f (want %.3f)\n",
                  td_balancer_share(td_dp_balancer(dp), 0), want);
    assert_true(fabs(td_balancer_share(td_dp_balancer(dp), 0) - want) < 0.01);
    td_dp_destroy(dp);

    setenv("TANDEM_BENCH_CACHE", "off", 1);
    TD_ASSERT_OK(td_dp_create(g, model, "m", TD_F32, 1, &o, NULL, &dp));
    assert_true(fabs(td_balancer_share(td_dp_balancer(dp), 0) - 0.5) < 0.01);
    td_dp_destroy(dp);
    td_group_destroy(g);
}

/* Garbage in the cache file: ignored, said so, measured again, rewritten. */
static void a_corrupt_cache_is_ignored_and_rewritten(void **state) {
    static const char junk[] = "{\"format\": \"tandem-bench-devices\", \"entries\": {";
    json_t *root, *file;
    const json_t *c;
    first_run();
    td_test_write_file(cache, junk, sizeof junk - 1);
    root = run_json("--devices " PAIR " --json --quick");
    assert_false(from_cache(root, 0));
    assert_false(from_cache(root, 1));
    check_cpu_device(device(root, 0), 1);
    c = json_object_get(root, "cache");
    assert_string_equal(str(c, "read"), "invalid");
    assert_non_null(strstr(str(c, "problem"), "not JSON"));
    assert_true(json_is_true(json_object_get(c, "written")));
    json_decref(root);
    file = json_load_file(cache, 0, NULL);
    assert_non_null(file);
    assert_string_equal(str(file, "format"), "tandem-bench-devices");
    assert_int_equal(json_object_size(json_object_get(file, "entries")), 4); /* 2 + 2 peers */
    json_decref(file);
}

/* Well-formed JSON with figures that cannot be: not trusted. */
static void implausible_cached_figures_are_not_trusted(void **state) {
    json_t *file, *e, *root;
    const char *key;
    int n = 0;
    first_run();
    file = json_load_file(cache, 0, NULL);
    assert_non_null(file);
    json_object_foreach(json_object_get(file, "entries"), key, e) {
        if (json_object_get(e, "device")) {
            /* one negative, one absurd */
            json_object_set_new(e, "gemm_f32_gflops", json_real(n++ ? 1e30 : -5.0));
        }
    }
    assert_int_equal(n, 2);
    assert_int_equal(json_dump_file(file, cache, 0), 0);
    json_decref(file);
    root = run_json("--devices " PAIR " --json --quick");
    assert_false(from_cache(root, 0));
    assert_false(from_cache(root, 1));
    check_cpu_device(device(root, 0), 1);
    check_cpu_device(device(root, 1), 2);
    assert_string_equal(str(json_object_get(root, "cache"), "read"), "partly invalid");
    /* the peers' entries were fine and kept */
    assert_true(json_is_true(
        json_object_get(json_array_get(json_object_get(root, "peers"), 0), "from_cache")));
    json_decref(root);
}

/* TANDEM_BENCH_CACHE=off: nothing read or written; TANDEM_CACHE=DIR: the
 * file in DIR. */
static void the_cache_can_be_moved_or_switched_off(void **state) {
    char env[1200], path[1200], *out, *err;
    json_t *root;
    assert_int_equal(run("TANDEM_BENCH_CACHE=off", "--devices cpu:0 --json --quick", &out, &err),
                     0);
    root = json_loads(out, 0, NULL);
    assert_non_null(root);
    assert_string_equal(str(json_object_get(root, "cache"), "read"), "off");
    assert_true(json_is_null(json_object_get(json_object_get(root, "cache"), "path")));
    assert_false(json_is_true(json_object_get(json_object_get(root, "cache"), "written")));
    json_decref(root);
    free(out);
    free(err);

    snprintf(path, sizeof path, "%s", td_test_tmp("dir"));
    snprintf(env, sizeof env, "env -u TANDEM_BENCH_CACHE TANDEM_CACHE='%s'", path);
    assert_int_equal(run(env, "--devices cpu:0 --json --quick", &out, &err), 0);
    root = json_loads(out, 0, NULL);
    assert_non_null(root);
    strncat(path, "/bench-devices.json", sizeof path - strlen(path) - 1);
    assert_string_equal(str(json_object_get(root, "cache"), "path"), path);
    assert_int_equal(access(path, R_OK), 0);
    json_decref(root);
    free(out);
    free(err);
}

static void errors_are_clear(void **state) {
    char *out, *err;
    assert_int_equal(run("TANDEM_BENCH_CACHE=off", "--devices cpu:999 --quick", &out, &err), 1);
    assert_non_null(strstr(err, "cpu:999"));
    free(out);
    free(err);
    assert_int_equal(run("", "--bogus", &out, &err), 2);
    assert_non_null(strstr(err, "usage: tandem bench devices"));
    free(out);
    free(err);
    assert_int_equal(run("", "--help", &out, &err), 0);
    assert_non_null(strstr(out, "--quick"));
    free(out);
    free(err);
}

static void an_opencl_device_is_measured_too(void **state) {
    td_device_list *l = NULL;
    json_t *root;
    const json_t *d;
    if (td_devices_open("opencl:0.0", &l) != TD_OK) {
        print_message("skipped: no OpenCL device (%s)\n", td_last_error());
        skip();
    }
    td_device_list_destroy(l);
    root = run_json("--devices 'cpu:0,opencl:0.0' --json --quick");
    for (int r = 0; r < 2; r++) {
        d = device(root, r);
        positive(d, "gemm_f32_gflops", 1e6);
        positive(d, "mem_bw_gbs", 1e5);
        positive(d, "h2d_gbs", 1e5);
        positive(d, "d2h_gbs", 1e5);
        positive(d, "launch_us", 1e6);
        if (!json_is_null(json_object_get(d, "gemm_f64_gflops")))
            positive(d, "gemm_f64_gflops", 1e6);
        print_message("%s: %.1f GFLOP/s f32, launch %.1f us\n", str(d, "name"),
                      num(d, "gemm_f32_gflops"), num(d, "launch_us"));
    }
    assert_int_equal(json_array_size(json_object_get(root, "peers")), 2);
    json_decref(root);
}

static int setup(void **state) {
    if (td_test_tmpdir_setup(state) != 0)
        return -1;
    /* in a folder that does not exist yet: the run makes it */
    snprintf(cache, sizeof cache, "%s", td_test_tmp("new/bench-devices.json"));
    return 0;
}

static int teardown(void **state) {
    json_decref(first);
    first = NULL;
    return td_test_tmpdir_teardown(state);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_has_every_field_and_ranks_by_f32),
        cmocka_unit_test(the_ranking_follows_the_figures),
        cmocka_unit_test(gemm_agrees_with_openblas_timed_here),
        cmocka_unit_test(a_second_run_reads_the_cache),
        cmocka_unit_test(the_table_ranks_by_f32),
        cmocka_unit_test(cached_figures_give_the_first_shares),
        cmocka_unit_test(a_corrupt_cache_is_ignored_and_rewritten),
        cmocka_unit_test(implausible_cached_figures_are_not_trusted),
        cmocka_unit_test(the_cache_can_be_moved_or_switched_off),
        cmocka_unit_test(errors_are_clear),
        cmocka_unit_test(an_opencl_device_is_measured_too),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
