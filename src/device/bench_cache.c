/* The cache of `tandem bench devices` (see bench_cache.h): where it is, its
 * keys, reading it without trusting it, and writing it atomically. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "device/bench_cache.h"
#include "device/device-impl.h"

#define CACHE_FILE  "bench-devices.json"
#define MAX_ENTRIES 256
#define PEER_PREFIX "peer "

int td_bench_cache_path(char *out, size_t n) {
    const char *v = getenv("TANDEM_BENCH_CACHE");
    int len;
    if (v && (!*v || !strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no")))
        return 0;
    if (v)
        len = snprintf(out, n, "%s", v);
    else if ((v = getenv("TANDEM_CACHE")) && *v)
        len = snprintf(out, n, "%s/" CACHE_FILE, v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        len = snprintf(out, n, "%s/tandem/" CACHE_FILE, v);
    else if ((v = getenv("HOME")) && *v)
        len = snprintf(out, n, "%s/.cache/tandem/" CACHE_FILE, v);
    else
        return 0;
    return len > 0 && (size_t)len < n;
}

const char *td_bench_build_id(void) {
    /* What changes the speed of one device: optimisation, sanitizers, and
     * which backends and libraries are in. The version stands for the rest. */
    return TD_VERSION_STRING
#ifdef __OPTIMIZE__
        " release"
#else
        " debug"
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
        " sanitized"
#endif
#ifdef TD_HAVE_CUDA
        " cuda"
#endif
#ifdef TD_HAVE_OPENCL
        " opencl"
#endif
#ifdef TD_HAVE_CLBLAST
        " clblast"
#endif
        ;
}

td_status td_bench_device_key(td_device *dev, char *out, size_t n) {
    td_device_info d;
    const td_device_options *o = &dev->opts;
    td_status st;
    if ((st = td_device_get_info(dev, &d)) != TD_OK)
        return st;
    /* Not the clock (it can be the current frequency, which moves) nor the
     * memory (a budget does not change the speed). */
    snprintf(out, n,
             "build=%s;backend=%s;name=%s;model=%s;vendor=%s;driver=%s;units=%d;cores=%s;"
             "isa=%s;fp64=%d;slowdown=%g;latency=%g;split=%d;denormals=%d",
             td_bench_build_id(), d.backend, d.name, d.model, d.vendor, d.driver, d.compute_units,
             d.cores, d.isa, d.fp64, o->has_slowdown ? o->slowdown : 1.0,
             o->has_latency ? o->latency_ms : 0.0, o->has_split ? o->split : 0,
             o->has_denormals ? o->denormals : -1);
    return TD_OK;
}

void td_bench_peer_key(const char *src_key, const char *dst_key, char *out, size_t n) {
    snprintf(out, n, PEER_PREFIX "%s -> %s", src_key, dst_key);
}

/* A figure that must be there: a positive finite number up to max. */
static int positive(const json_t *e, const char *field, double max) {
    const json_t *v = json_object_get(e, field);
    double x;
    if (!json_is_number(v))
        return 0;
    x = json_number_value(v);
    return isfinite(x) && x > 0 && x <= max;
}

/* One that may be null (f64 on a device without it). */
static int positive_or_null(const json_t *e, const char *field, double max) {
    const json_t *v = json_object_get(e, field);
    return json_is_null(v) || positive(e, field, max);
}

/* One added later (bf16): absent in older caches, which stay valid. */
static int optional_positive(const json_t *e, const char *field, double max) {
    return !json_object_get(e, field) || positive_or_null(e, field, max);
}

int td__bench_entry_valid(const char *key, const json_t *e) {
    /* Far above any device of today: 10 PFLOP/s, 1 PB/s, 10 s per op. */
    const double gflops = 1e7, gbs = 1e6, us = 1e7, size = 1e6;
    if (strlen(key) >= TD_BENCH_PEER_KEY_MAX || !json_is_object(e) ||
        !json_is_string(json_object_get(e, "build")) ||
        !json_is_boolean(json_object_get(e, "quick")))
        return 0;
    if (!strncmp(key, PEER_PREFIX, strlen(PEER_PREFIX)))
        return positive(e, "gbs", gbs) && positive(e, "bytes", 1e15);
    if (!json_is_string(json_object_get(e, "device")))
        return 0;
    return positive(e, "gemm_f32_gflops", gflops) && positive(e, "gemm_f32_n", size) &&
           positive_or_null(e, "gemm_f64_gflops", gflops) &&
           positive_or_null(e, "gemm_f64_n", size) && positive(e, "mem_bw_gbs", gbs) &&
           positive(e, "h2d_gbs", gbs) && positive(e, "d2h_gbs", gbs) &&
           positive(e, "launch_us", us) && optional_positive(e, "gemm_bf16_gflops", gflops) &&
           optional_positive(e, "gemm_bf16_n", size);
}

json_t *td__bench_cache_load(const char *path, td_bench_cache_state *state, char *why,
                             size_t why_size) {
    json_t *root = NULL, *entries = json_object(), *all, *e;
    json_error_t jerr;
    const char *key;
    size_t dropped = 0;
    char first[160] = "";
    if (why && why_size)
        why[0] = '\0';
    *state = TD_BENCH_CACHE_MISSING;
    if (!entries)
        return NULL;
    if (access(path, F_OK) != 0)
        return entries;
    *state = TD_BENCH_CACHE_INVALID;
    root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        if (why)
            snprintf(why, why_size, "not JSON (%s, line %d)", jerr.text, jerr.line);
        return entries;
    }
    all = json_object_get(root, "entries");
    if (!json_is_object(root) || !json_is_string(json_object_get(root, "format")) ||
        strcmp(json_string_value(json_object_get(root, "format")), TD_BENCH_CACHE_FORMAT) != 0 ||
        json_integer_value(json_object_get(root, "format_version")) != TD_BENCH_CACHE_VERSION ||
        !json_is_object(all)) {
        if (why)
            snprintf(why, why_size, "not a cache of format '%s' version %d", TD_BENCH_CACHE_FORMAT,
                     TD_BENCH_CACHE_VERSION);
        json_decref(root);
        return entries;
    }
    json_object_foreach(all, key, e) {
        if (td__bench_entry_valid(key, e)) {
            json_object_set(entries, key, e);
        } else {
            if (!dropped++) {
                const json_t *d = json_object_get(e, "device");
                snprintf(first, sizeof first, "%s",
                         json_is_string(d) ? json_string_value(d) : "a peer copy");
            }
        }
    }
    json_decref(root);
    *state = dropped ? TD_BENCH_CACHE_PARTLY : TD_BENCH_CACHE_OK;
    if (dropped && why)
        snprintf(why, why_size, "%zu entr%s with missing or implausible figures (the first: %s)",
                 dropped, dropped == 1 ? "y" : "ies", first);
    return entries;
}

/* mkdir -p of path's directory. */
static td_status make_dirs(const char *path) {
    char dir[4096];
    char *slash;
    snprintf(dir, sizeof dir, "%s", path);
    if (!(slash = strrchr(dir, '/')) || slash == dir)
        return TD_OK;
    *slash = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return td__error(TD_ERR_IO, "cannot make %s: %s", dir, strerror(errno));
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return td__error(TD_ERR_IO, "cannot make %s: %s", dir, strerror(errno));
    return TD_OK;
}

static json_int_t measured_at(const json_t *e) {
    return json_integer_value(json_object_get(e, "measured_unix"));
}

/* Drops the oldest entries beyond MAX_ENTRIES. */
static void trim(json_t *entries) {
    while (json_object_size(entries) > MAX_ENTRIES) {
        const char *key;
        char oldest[TD_BENCH_PEER_KEY_MAX] = "";
        json_t *e;
        json_int_t t = 0;
        json_object_foreach(entries, key, e) {
            if (!*oldest || measured_at(e) < t) {
                snprintf(oldest, sizeof oldest, "%s", key);
                t = measured_at(e);
            }
        }
        /* loading left out keys too long to copy, so this cannot fail */
        if (json_object_del(entries, oldest) != 0)
            break;
    }
}

/* The mode open(path, O_CREAT, 0666) would give, as any file the user
 * makes: mkstemp's 0600 with the umask's permissions added back. The umask is
 * read from /proc (umask() sets it while reading it, for every thread);
 * without /proc the file stays 0600. */
static mode_t new_file_mode(void) {
    char line[128];
    unsigned mask = 077;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Umask: %o", &mask) == 1)
            break;
    if (f)
        fclose(f);
    return (mode_t)(0666 & ~mask);
}

td_status td__bench_cache_save(const char *path, json_t *entries) {
    char tmp[4096];
    json_t *root = NULL;
    FILE *f = NULL;
    int fd = -1, len;
    td_status st;
    if ((st = make_dirs(path)) != TD_OK)
        return st;
    len = snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    if (len < 0 || (size_t)len >= sizeof tmp)
        return td__error(TD_ERR_IO, "cache path too long: %s", path);
    trim(entries);
    root = json_pack("{s:s, s:i, s:O}", "format", TD_BENCH_CACHE_FORMAT, "format_version",
                     TD_BENCH_CACHE_VERSION, "entries", entries);
    if (!root)
        return td__error(TD_ERR_OUT_OF_MEMORY, "writing %s", path);
    if ((fd = mkstemp(tmp)) < 0) {
        st = td__error(TD_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        goto fail;
    }
    (void)fchmod(fd, new_file_mode());
    if (!(f = fdopen(fd, "w"))) {
        st = td__error(TD_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        goto fail;
    }
    if (json_dumpf(root, f, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 || fputc('\n', f) == EOF ||
        fflush(f) != 0 || fsync(fileno(f)) != 0) {
        st = td__error(TD_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
        fclose(f);
        unlink(tmp);
        goto fail;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        st = td__error(TD_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        goto fail;
    }
    json_decref(root);
    return TD_OK;
fail:
    json_decref(root);
    return st;
}

td_status td_bench_cache_read(const char *path, char **entries_json, td_bench_cache_state *state,
                              char *why, size_t why_size) {
    json_t *entries = td__bench_cache_load(path, state, why, why_size);
    *entries_json = entries ? json_dumps(entries, JSON_COMPACT) : NULL;
    json_decref(entries);
    if (!*entries_json)
        return td__error(TD_ERR_OUT_OF_MEMORY, "reading the bench cache %s", path);
    return TD_OK;
}

td_status td_bench_cache_write(const char *path, const char *entries_json) {
    json_error_t jerr;
    json_t *entries = json_loads(entries_json, JSON_REJECT_DUPLICATES, &jerr);
    td_status st;
    if (!json_is_object(entries)) {
        json_decref(entries);
        return td__error(TD_ERR_PARSE, "bench cache %s: entries to write are not a JSON object",
                         path);
    }
    st = td__bench_cache_save(path, entries);
    json_decref(entries);
    return st;
}

int td__bench_cache_gflops(td_device *const *devs, int n, double *gflops) {
    char path[4096], key[TD_BENCH_KEY_MAX];
    td_bench_cache_state state;
    json_t *entries;
    int found = 0;
    if (!td_bench_cache_path(path, sizeof path))
        return 0;
    entries = td__bench_cache_load(path, &state, NULL, 0);
    if (!entries)
        return 0;
    for (int i = 0; i < n; i++) {
        const json_t *e;
        if (td_bench_device_key(devs[i], key, sizeof key) != TD_OK)
            break;
        /* Only valid entries were kept; the key carries the build. */
        if (!(e = json_object_get(entries, key)))
            break;
        gflops[i] = json_number_value(json_object_get(e, "gemm_f32_gflops"));
        found++;
    }
    json_decref(entries);
    if (found == n)
        TD_LOG_DEBUG("first shares from the bench cache %s", path);
    return found == n;
}
