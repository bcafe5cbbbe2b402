/* tandem train on a user's own data, as a user runs it: a linearly
 * separable table in CSV, the same in a .npy pair and a safetensors file,
 * each learnt to high test accuracy; and bad files, each refused with its
 * message and exit status 1 (2 for contradictory options). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/data_files.h"
#include "support/support.h"

#define EXE TD_TANDEM_EXE

#define ROWS 500

/* Runs "tandem <args>", checks the exit status and that stderr holds
 * err_needle; returns stdout (malloc'ed). */
static char *run(const char *args, int want_rc, const char *err_needle) {
    char cmd[4096], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' %s", EXE, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != want_rc)
        fail_msg("'%s' exited %d, expected %d\nstdout: %s\nstderr: %s", args, rc, want_rc,
                 out ? out : "", err ? err : "");
    if (err_needle && (!err || !strstr(err, err_needle)))
        fail_msg("'%s': stderr lacks \"%s\": %s", args, err_needle, err ? err : "");
    free(err);
    return out;
}

/* The test accuracy and test samples of the run's "summary: {json}" line. */
static double summary_accuracy(const char *out, long long *test_samples) {
    const char *line = strstr(out, "summary: ");
    json_error_t e;
    json_t *o;
    double acc;
    assert_non_null(line);
    assert_non_null(o = json_loads(line + 9, JSON_DISABLE_EOF_CHECK, &e));
    acc = json_number_value(json_object_get(o, "test_accuracy"));
    *test_samples = json_integer_value(json_object_get(o, "test_samples"));
    json_decref(o);
    return acc;
}

/* Points (u, v) in [-1, 1)^2 from a fixed generator, labelled by the side
 * of the line u + v / 2 = 0 they fall on, none nearer it than 0.1. */
static void make_points(float *x, int64_t *y) {
    uint64_t s = 12345;
    int n = 0;
    while (n < ROWS) {
        float p[2];
        for (int k = 0; k < 2; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            p[k] = (float)((double)(s >> 11) / (double)(1ull << 53) * 2 - 1);
        }
        if (p[0] + p[1] / 2 > -0.1f && p[0] + p[1] / 2 < 0.1f)
            continue;
        x[2 * n] = p[0];
        x[2 * n + 1] = p[1];
        y[n++] = p[0] + p[1] / 2 > 0;
    }
}

static void write_csv(const char *path, const float *x, const int64_t *y, int rows) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "u,v,label\n");
    for (int i = 0; i < rows; i++)
        fprintf(f, "%.9g,%.9g,%lld\n", x[2 * i], x[2 * i + 1], (long long)y[i]);
    fclose(f);
}

static const char model_json[] = "{\"name\": \"tiny\", \"input\": {\"shape\": [2]}, \"layers\": "
                                 "[{\"type\": \"linear\", \"out\": 8}, {\"type\": \"relu\"}, "
                                 "{\"type\": \"linear\", \"out\": 2}]}";

static int setup(void **state) {
    static float x[2 * ROWS];
    static int64_t y[ROWS];
    if (td_test_tmpdir_setup(state))
        return -1;
    make_points(x, y);
    td_test_write_file(td_test_tmp("tiny.json"), model_json, strlen(model_json));
    write_csv(td_test_tmp("lin.csv"), x, y, ROWS);
    /* The first 400 rows train, the last 100 test. */
    td_test_write_npy(td_test_tmp("x.npy"), "<f4", "(400, 2)", x, 400 * 2 * sizeof *x);
    td_test_write_npy(td_test_tmp("y.npy"), "<i8", "(400,)", y, 400 * sizeof *y);
    td_test_write_npy(td_test_tmp("tx.npy"), "<f4", "(100, 2)", x + 800, 100 * 2 * sizeof *x);
    td_test_write_npy(td_test_tmp("ty.npy"), "<i8", "(100,)", y + 400, 100 * sizeof *y);
    {
        td_test_st_entry e[] = {{"x", "F32", "[500,2]", x, sizeof x},
                                {"y", "I64", "[500]", y, sizeof y}};
        td_test_write_safetensors(td_test_tmp("lin.safetensors"), e, 2);
    }
    return 0;
}

#define TRAIN "train --quiet --summary --epochs 8 --batch 16 --lr 0.1 --model "

static void a_csv_table_is_learnt(void **state) {
    char args[2048], *out;
    long long n;
    double acc;
    snprintf(args, sizeof args, TRAIN "%s --data %s --checkpoint %s", td_test_tmp("tiny.json"),
             td_test_tmp("lin.csv"), td_test_tmp("lin.st"));
    out = run(args, 0, NULL);
    acc = summary_accuracy(out, &n);
    assert_int_equal(n, ROWS / 10); /* the default split holds out 10% */
    if (acc < 0.95)
        fail_msg("test accuracy %.3f on a separable table:\n%s", acc, out);
    free(out);
    /* tandem eval holds out the same rows, so it finds the same accuracy. */
    snprintf(args, sizeof args, "eval --json --checkpoint %s --data %s", td_test_tmp("lin.st"),
             td_test_tmp("lin.csv"));
    out = run(args, 0, NULL);
    {
        json_error_t e;
        json_t *o = json_loads(out, 0, &e);
        assert_non_null(o);
        assert_int_equal(json_integer_value(json_object_get(o, "labels")), ROWS / 10);
        assert_float_equal(json_number_value(json_object_get(o, "accuracy")), acc, 1e-9);
        json_decref(o);
    }
    free(out);
    /* Another label column, another split. */
    snprintf(args, sizeof args, TRAIN "%s --data %s --label-column v --split 0.2",
             td_test_tmp("tiny.json"), td_test_tmp("lin.csv"));
    free(run(args, 1, "v\"): label '"));
}

static void npy_pairs_and_safetensors_files_are_learnt(void **state) {
    char args[2048], *out;
    long long n;
    double acc;
    char test[1024];
    /* td_test_tmp() keeps four names at a time. */
    snprintf(test, sizeof test, "%s,%s", td_test_tmp("tx.npy"), td_test_tmp("ty.npy"));
    snprintf(args, sizeof args, TRAIN "%s --data %s,%s --test-data %s", td_test_tmp("tiny.json"),
             td_test_tmp("x.npy"), td_test_tmp("y.npy"), test);
    out = run(args, 0, NULL);
    acc = summary_accuracy(out, &n);
    assert_int_equal(n, 100);
    if (acc < 0.95)
        fail_msg("test accuracy %.3f on separable .npy data:\n%s", acc, out);
    free(out);
    snprintf(args, sizeof args, TRAIN "%s --data %s --split 0.3", td_test_tmp("tiny.json"),
             td_test_tmp("lin.safetensors"));
    out = run(args, 0, NULL);
    acc = summary_accuracy(out, &n);
    assert_int_equal(n, 150);
    if (acc < 0.95)
        fail_msg("test accuracy %.3f on a separable safetensors file:\n%s", acc, out);
    free(out);
}

/* tandem train on the CSV text for the tiny model exits want_rc, saying needle. */
static void expect_csv(const char *text, const char *extra, int want_rc, const char *needle) {
    char args[2048];
    td_test_write_file(td_test_tmp("bad.csv"), text, strlen(text));
    snprintf(args, sizeof args, TRAIN "%s --data %s %s", td_test_tmp("tiny.json"),
             td_test_tmp("bad.csv"), extra);
    free(run(args, want_rc, needle));
}

static void bad_files_are_refused_with_their_message(void **state) {
    char args[2048];
    float x[6] = {0, 1, 2, 3, 4, 5};
    unsigned char *bytes;
    size_t n;
    expect_csv("u,v,label\n1,2,0\n3,4\n", "", 1, "bad.csv: line 3 has 2 cells; the header has 3");
    expect_csv("u,v,label\n1,2,0\n3,abc,1\n", "", 1,
               "line 3, column 2 (\"v\"): 'abc' is not a "
               "number");
    expect_csv("u,v,label\n1,2,0\n3,NaN,1\n", "", 1,
               "line 3, column 2 (\"v\"): 'NaN' is not finite");
    expect_csv("u,v,label\n1,2,0\n3,4,2\n", "", 1,
               "line 3, column 3 (\"label\"): label 2 is outside the model's classes [0, 2)");
    expect_csv("u,v,w,label\n1,2,3,0\n3,4,5,1\n", "", 1,
               "samples have shape (3) (3 values); the model reads (2) (2 values)");
    expect_csv("u,v,y\n1,2,0\n3,4,1\n", "", 1, "no column named \"label\"");
    expect_csv("u,v,label\n1,2,0\n3,4,1\n", "--split 1.5", 2, "--split wants a fraction");
    expect_csv("u,v,label\n1,2,0\n3,4,1\n", "--split 0.5 --test-data x.csv", 2,
               "--split and --test-data");
    /* .npy: truncated, column-major, rows that do not match. */
    bytes = td_test_read_file(td_test_tmp("x.npy"), &n);
    td_test_write_file(td_test_tmp("cut.npy"), bytes, n - 7);
    free(bytes);
    snprintf(args, sizeof args, TRAIN "%s --data %s,%s", td_test_tmp("tiny.json"),
             td_test_tmp("cut.npy"), td_test_tmp("y.npy"));
    free(run(args, 1, "cut.npy: truncated"));
    td_test_write_npy_v(td_test_tmp("f.npy"), 1, "<f4", "True", "(3, 2)", x, sizeof x);
    snprintf(args, sizeof args, TRAIN "%s --data %s,%s", td_test_tmp("tiny.json"),
             td_test_tmp("f.npy"), td_test_tmp("y.npy"));
    free(run(args, 1, "fortran_order is True"));
    td_test_write_npy(td_test_tmp("f.npy"), "<f4", "(3, 2)", x, sizeof x);
    free(run(args, 1, "has 3 rows but"));
    snprintf(args, sizeof args, TRAIN "%s --data %s", td_test_tmp("tiny.json"),
             td_test_tmp("x.npy"));
    free(run(args, 1, "--data X.npy,Y.npy"));
    snprintf(args, sizeof args, TRAIN "%s --data %s", td_test_tmp("tiny.json"),
             td_test_tmp("tiny.json"));
    free(run(args, 1, "not a folder of MNIST IDX files, a .csv"));
}

static void help_names_the_data_options(void **state) {
    char *out = run("train --help", 0, NULL);
    assert_non_null(strstr(out, "--test-data"));
    assert_non_null(strstr(out, "--split"));
    assert_non_null(strstr(out, "--label-column"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_csv_table_is_learnt),
        cmocka_unit_test(npy_pairs_and_safetensors_files_are_learnt),
        cmocka_unit_test(bad_files_are_refused_with_their_message),
        cmocka_unit_test(help_names_the_data_options),
    };
    return cmocka_run_group_tests(tests, setup, td_test_tmpdir_teardown);
}
