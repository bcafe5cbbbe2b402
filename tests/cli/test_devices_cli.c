/* `tandem devices` as a user runs it: JSON parsed back with a real parser,
 * the text table, errors and exit codes. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "support/cpu_flags.h"
#include "support/support.h"

static int run(const char *args, char **out, char **err) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s", TD_TANDEM_EXE, args);
    return td_test_run_command(cmd, out, err);
}

static void json_lists_two_cpu_devices_for_cpu_times_2(void **state) {
    char *out, *err;
    json_error_t jerr;
    json_t *root, *devs;
    assert_int_equal(run("devices --devices 'cpu*2' --json", &out, &err), 0);
    root = json_loads(out, 0, &jerr);
    if (!root)
        fail_msg("not JSON (%s at line %d): %s", jerr.text, jerr.line, out);
    devs = json_object_get(root, "devices");
    assert_true(json_is_array(devs));
    assert_int_equal(json_array_size(devs), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(devs, i);
        char want[16];
        snprintf(want, sizeof want, "cpu:%zu", i);
        assert_string_equal(json_string_value(json_object_get(d, "name")), want);
        assert_string_equal(json_string_value(json_object_get(d, "backend")), "cpu");
        assert_true(json_is_true(json_object_get(d, "fp64")));
        assert_true(json_integer_value(json_object_get(d, "compute_units")) >= 1);
        assert_true(json_integer_value(json_object_get(d, "memory_total_bytes")) > 0);
        assert_true(json_is_array(json_object_get(d, "simd")));
    }
    json_decref(root);
    free(out);
    free(err);
}

static void json_of_everything_parses_and_carries_notes(void **state) {
    char *out, *err;
    json_t *root;
    assert_int_equal(run("devices --json", &out, &err), 0);
    root = json_loads(out, 0, NULL);
    assert_non_null(root);
    assert_true(json_array_size(json_object_get(root, "devices")) >= 1);
    assert_true(json_is_array(json_object_get(root, "notes")));
    json_decref(root);
    free(out);
    free(err);
}

static void a_budget_shows_in_the_table(void **state) {
    char *out, *err;
    assert_int_equal(run("devices --devices 'cpu:0{mem=512M}'", &out, &err), 0);
    assert_non_null(strstr(out, "cpu:0"));
    assert_non_null(strstr(out, "512.0 MiB total"));
    assert_non_null(strstr(out, "(budget)"));
    free(out);
    free(err);
}

/* s's first word is want, or (want NULL: the flags are not known) one of
 * the two or three classes in any. */
static void assert_class(const char *what, const char *s, const char *want,
                         const char *const *any) {
    size_t n = strcspn(s, " ");
    if (want) {
        if (n != strlen(want) || strncmp(s, want, n))
            fail_msg("%s is '%s'; /proc/cpuinfo's flags say '%s'", what, s, want);
        return;
    }
    for (; *any; any++)
        if (n == strlen(*any) && !strncmp(s, *any, n))
            return;
    fail_msg("%s is '%s': not a class it may take", what, s);
}

/* bf16 and int8 classes as /proc/cpuinfo's flags have them, in the JSON and
 * in the table; a GPU backend (where there is one) has no bf16 path. */
static void bf16_and_int8_follow_the_cpu_flags(void **state) {
    static const char *const bf16_any[] = {"native", "emulated", NULL};
    static const char *const int8_any[] = {"VNNI", "AVX2", "none", NULL};
    const char *bf16 = td_test_cpu_bf16_class(), *int8 = td_test_cpu_int8_class();
    char *out, *err, line[128];
    json_t *root, *d;
    size_t i;
    (void)state;
    assert_int_equal(run("devices --json", &out, &err), 0);
    assert_non_null(root = json_loads(out, 0, NULL));
    json_array_foreach(json_object_get(root, "devices"), i, d) {
        const char *b = json_string_value(json_object_get(d, "bf16"));
        const char *q = json_string_value(json_object_get(d, "int8"));
        const char *backend = json_string_value(json_object_get(d, "backend"));
        assert_non_null(b);
        assert_non_null(q);
        if (!strcmp(backend, "cpu")) {
            assert_class("cpu bf16", b, bf16, bf16_any);
            assert_class("cpu int8", q, int8, int8_any);
        } else {
            assert_class("GPU bf16", b, "none", NULL);
        }
    }
    json_decref(root);
    free(out);
    free(err);
    assert_int_equal(run("devices --devices cpu", &out, &err), 0);
    if (bf16) {
        snprintf(line, sizeof line, "%-16s %s", "bf16 products", bf16);
        assert_non_null(strstr(out, line));
    }
    if (int8) {
        snprintf(line, sizeof line, "%-16s %s", "int8 dot", int8);
        assert_non_null(strstr(out, line));
    }
    assert_non_null(strstr(out, "bf16 products"));
    assert_non_null(strstr(out, "int8 dot"));
    free(out);
    free(err);
}

static void errors_are_clear_and_exit_non_zero(void **state) {
    char *out, *err;
    assert_int_equal(run("devices --devices cpu:999", &out, &err), 1);
    assert_non_null(strstr(err, "there is no cpu:999"));
    free(out);
    free(err);
    assert_int_equal(run("devices --devices 'cpu{mem=x}'", &out, &err), 1);
    assert_non_null(strstr(err, "mem=x is not a size"));
    free(out);
    free(err);
    assert_int_equal(run("devices --frobnicate", &out, &err), 2);
    assert_non_null(strstr(err, "usage: tandem devices"));
    free(out);
    free(err);
    assert_int_equal(run("levitate", &out, &err), 2);
    assert_non_null(strstr(err, "unknown command 'levitate'"));
    free(out);
    free(err);
}

static void help_is_on_every_command(void **state) {
    char *out, *err;
    assert_int_equal(run("--help", &out, &err), 0);
    assert_non_null(strstr(out, "devices"));
    free(out);
    free(err);
    assert_int_equal(run("devices --help", &out, &err), 0);
    assert_non_null(strstr(out, "--json"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_lists_two_cpu_devices_for_cpu_times_2),
        cmocka_unit_test(json_of_everything_parses_and_carries_notes),
        cmocka_unit_test(a_budget_shows_in_the_table),
        cmocka_unit_test(bf16_and_int8_follow_the_cpu_flags),
        cmocka_unit_test(errors_are_clear_and_exit_non_zero),
        cmocka_unit_test(help_is_on_every_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
