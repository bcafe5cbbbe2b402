/* The bench cache through the public API (tandem/device.h), as `tandem bench
 * devices` uses it: where it is, its keys, entries read back as JSON text
 * after a write, what reading leaves out, and writes that are refused. The
 * command's own runs are tests/cli/test_bench_devices.c. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/support.h"

/* A device entry with plausible figures, as the command writes one. */
static json_t *device_entry(const char *name) {
    return json_pack("{s:s, s:s, s:b, s:I, s:f, s:I, s:n, s:n, s:f, s:f, s:f, s:f}", "device", name,
                     "build", td_bench_build_id(), "quick", 1, "measured_unix",
                     (json_int_t)1700000000, "gemm_f32_gflops", 50.0, "gemm_f32_n", (json_int_t)512,
                     "gemm_f64_gflops", "gemm_f64_n", "mem_bw_gbs", 10.0, "h2d_gbs", 5.0, "d2h_gbs",
                     5.0, "launch_us", 2.0);
}

/* Reads the cache at path; returns the entries parsed and *state. */
static json_t *read_entries(const char *path, td_bench_cache_state *state, char *why, size_t n) {
    char *text = NULL;
    json_t *entries;
    TD_ASSERT_OK(td_bench_cache_read(path, &text, state, why, n));
    assert_non_null(text);
    entries = json_loads(text, 0, NULL);
    free(text);
    assert_true(json_is_object(entries));
    return entries;
}

static void the_path_follows_the_environment(void **state) {
    char path[4096];
    setenv("TANDEM_BENCH_CACHE", "off", 1);
    assert_int_equal(td_bench_cache_path(path, sizeof path), 0);
    setenv("TANDEM_BENCH_CACHE", "/somewhere/cache.json", 1);
    assert_int_equal(td_bench_cache_path(path, sizeof path), 1);
    assert_string_equal(path, "/somewhere/cache.json");
    unsetenv("TANDEM_BENCH_CACHE");
    setenv("TANDEM_CACHE", "/tmp/dir", 1);
    assert_int_equal(td_bench_cache_path(path, sizeof path), 1);
    assert_string_equal(path, "/tmp/dir/bench-devices.json");
    assert_int_equal(td_bench_cache_path(path, 8), 0); /* does not fit: off */
    unsetenv("TANDEM_CACHE");
    setenv("TANDEM_BENCH_CACHE", "off", 1);
}

static void keys_name_the_build_and_the_options(void **state) {
    td_device_list *l = td_test_open("cpu:0,cpu:1{slowdown=2}");
    char a[TD_BENCH_KEY_MAX], b[TD_BENCH_KEY_MAX], p[TD_BENCH_PEER_KEY_MAX];
    TD_ASSERT_OK(td_bench_device_key(td_device_list_get(l, 0), a, sizeof a));
    TD_ASSERT_OK(td_bench_device_key(td_device_list_get(l, 1), b, sizeof b));
    assert_non_null(strstr(a, td_bench_build_id()));
    assert_string_not_equal(a, b);
    assert_non_null(strstr(b, "slowdown=2")); /* a slowed device is another key */
    td_bench_peer_key(a, b, p, sizeof p);
    assert_non_null(strstr(p, a));
    assert_non_null(strstr(p, b));
    assert_string_not_equal(p, a);
    td_device_list_destroy(l);
}

static void entries_written_are_read_back(void **state) {
    const char *path = td_test_tmp("sub/folder/cache.json");
    td_device_list *l = td_test_open("cpu:0");
    char key[TD_BENCH_KEY_MAX], why[256], *text;
    td_bench_cache_state st;
    json_t *entries = read_entries(path, &st, why, sizeof why);
    assert_int_equal(st, TD_BENCH_CACHE_MISSING);
    assert_int_equal(json_object_size(entries), 0);
    assert_string_equal(why, "");

    TD_ASSERT_OK(td_bench_device_key(td_device_list_get(l, 0), key, sizeof key));
    json_object_set_new(entries, key, device_entry("cpu:0"));
    text = json_dumps(entries, 0);
    TD_ASSERT_OK(td_bench_cache_write(path, text)); /* makes the folders too */
    free(text);
    json_decref(entries);

    entries = read_entries(path, &st, why, sizeof why);
    assert_int_equal(st, TD_BENCH_CACHE_OK);
    assert_int_equal(json_object_size(entries), 1);
    assert_true(
        json_real_value(json_object_get(json_object_get(entries, key), "gemm_f32_gflops")) == 50.0);
    json_decref(entries);
    td_device_list_destroy(l);
}

/* The cache is written as any file the user makes: its mode follows the
 * umask (it was 0644 whatever the umask said). */
static void the_file_s_mode_follows_the_umask(void **state) {
    static const mode_t masks[] = {077, 027, 022, 002};
    const char *path = td_test_tmp("mode/cache.json");
    (void)state;
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        mode_t old = umask(masks[i]);
        struct stat sb;
        TD_ASSERT_OK(td_bench_cache_write(path, "{}"));
        umask(old);
        assert_int_equal(stat(path, &sb), 0);
        if ((sb.st_mode & 0777) != (0666 & ~masks[i]))
            fail_msg("umask %03o: the cache is %03o, not %03o", (unsigned)masks[i],
                     (unsigned)(sb.st_mode & 0777), (unsigned)(0666 & ~masks[i]));
    }
}

static void implausible_entries_are_left_out(void **state) {
    const char *path = td_test_tmp("partly.json");
    char why[256], *text;
    td_bench_cache_state st;
    json_t *entries = json_object(), *bad = device_entry("cpu:1");
    json_object_set_new(bad, "gemm_f32_gflops", json_real(-1));
    json_object_set_new(entries, "good", device_entry("cpu:0"));
    json_object_set_new(entries, "bad", bad);
    text = json_dumps(entries, 0);
    TD_ASSERT_OK(td_bench_cache_write(path, text));
    free(text);
    json_decref(entries);
    entries = read_entries(path, &st, why, sizeof why);
    assert_int_equal(st, TD_BENCH_CACHE_PARTLY);
    assert_non_null(json_object_get(entries, "good"));
    assert_null(json_object_get(entries, "bad"));
    assert_non_null(strstr(why, "cpu:1"));
    json_decref(entries);

    td_test_write_file(path, "not json", 8);
    entries = read_entries(path, &st, NULL, 0);
    assert_int_equal(st, TD_BENCH_CACHE_INVALID);
    assert_int_equal(json_object_size(entries), 0);
    json_decref(entries);
}

static void a_write_of_no_object_is_refused(void **state) {
    const char *path = td_test_tmp("kept.json");
    size_t n;
    unsigned char *before, *after;
    TD_ASSERT_OK(td_bench_cache_write(path, "{}"));
    before = td_test_read_file(path, &n);
    TD_ASSERT_STATUS(td_bench_cache_write(path, "[1, 2]"), TD_ERR_PARSE);
    td_test_assert_message_contains("kept.json");
    TD_ASSERT_STATUS(td_bench_cache_write(path, "{"), TD_ERR_PARSE);
    after = td_test_read_file(path, NULL);
    assert_string_equal((const char *)before, (const char *)after); /* untouched */
    free(before);
    free(after);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(the_path_follows_the_environment),
        cmocka_unit_test(keys_name_the_build_and_the_options),
        cmocka_unit_test(entries_written_are_read_back),
        cmocka_unit_test(implausible_entries_are_left_out),
        cmocka_unit_test(the_file_s_mode_follows_the_umask),
        cmocka_unit_test(a_write_of_no_object_is_refused),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
