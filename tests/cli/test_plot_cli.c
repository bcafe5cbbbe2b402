/* tandem plot as a user runs it: the metrics of a real short run (two CPU
 * devices, data parallel) drawn as SVG; the SVG checked as XML and point by
 * point, then rendered by rsvg-convert and the pixels looked at (not blank,
 * the training loss falls from left to right in the loss panel); bad input
 * and usage errors.
 *
 * rsvg-convert (librsvg2-bin) and xmllint (libxml2-utils) come with
 * scripts/bootstrap; without them the test fails rather than skips, since
 * they are tools of the build machine, not devices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/png.h"
#include "support/support.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"

#define STEPS 30
/* The training loss's colour (the first of the palette) as red, green, blue. */
#define TRAIN_R 0x1f
#define TRAIN_G 0x77
#define TRAIN_B 0xb4

/* Runs "tandem <args>" and checks the exit status and that stderr (or
 * stdout for out_needle) holds the needle. */
static void expect(const char *args, int want_rc, const char *out_needle, const char *err_needle) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' %s", EXE, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != want_rc)
        fail_msg("'%s' exited %d, expected %d\nstdout: %s\nstderr: %s", args, rc, want_rc,
                 out ? out : "", err ? err : "");
    if (out_needle && (!out || !strstr(out, out_needle)))
        fail_msg("'%s': stdout lacks \"%s\": %s", args, out_needle, out ? out : "");
    if (err_needle && (!err || !strstr(err, err_needle)))
        fail_msg("'%s': stderr lacks \"%s\": %s", args, err_needle, err ? err : "");
    free(out);
    free(err);
}

/* Fails unless the tool is on PATH: bootstrap installs it. */
static void require_tool(const char *tool, const char *package) {
    char cmd[256], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "command -v %s", tool);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("%s not found: install %s (scripts/bootstrap does)", tool, package);
    free(out);
    free(err);
}

/* The metrics of a real run and their plot, made once for every test:
 * tmp/m.jsonl and tmp/run.svg. */
static int setup(void **state) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    if (td_test_tmpdir_setup(state) != 0)
        return -1;
    snprintf(cmd, sizeof cmd,
             "('%s' train --model " MLP " --data " MNIST " --steps %d --metrics %s "
             "--devices 'cpu*2' --strategy data --eval-samples 1000 --quiet && "
             "'%s' plot %s -o %s)",
             EXE, STEPS, td_test_tmp("m.jsonl"), EXE, td_test_tmp("m.jsonl"),
             td_test_tmp("run.svg"));
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fprintf(stderr, "setup: '%s' exited %d\nstdout: %s\nstderr: %s\n", cmd, rc, out ? out : "",
                err ? err : "");
    free(out);
    free(err);
    return rc == 0 ? 0 : -1;
}

/* The number of lines of path holding needle. */
static int count_lines(const char *path, const char *needle) {
    char *text = (char *)td_test_read_file(path, NULL), *save = NULL;
    int n = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        n += strstr(line, needle) != NULL;
    free(text);
    return n;
}

/* The number of points of the polyline with that id in svg; -1: none. */
static int polyline_points(const char *svg, const char *id) {
    char key[64];
    const char *p, *end;
    int n = 0;
    snprintf(key, sizeof key, "id=\"%s\"", id);
    if (!(p = strstr(svg, key)) || !(p = strstr(p, "points=\"")) || !(end = strchr(p + 8, '"')))
        return -1;
    for (p += 8; p < end; p++)
        n += *p == ',';
    return n;
}

static void help_and_usage_errors(void **state) {
    char args[1024];
    expect("--help", 0, "plot", NULL);
    expect("plot --help", 0, "-o, --output", NULL);
    snprintf(args, sizeof args, "plot %s", td_test_tmp("m.jsonl"));
    expect(args, 2, NULL, "-o OUT.svg is required");
    expect("plot -o x.svg", 2, NULL, "which metrics file?");
    expect("plot a.jsonl b.jsonl -o x.svg", 2, NULL, "one metrics file at a time");
    expect("plot --bogus a.jsonl -o x.svg", 2, NULL, "unknown option '--bogus'");
    expect("plot a.jsonl -o", 2, NULL, "-o needs a value");
}

/* Writes text to tmp/name and runs tandem plot on it, to tmp/bad.svg. */
static void expect_plot_of(const char *name, const char *text, int want_rc, const char *needle) {
    char args[1024], path[512];
    snprintf(path, sizeof path, "%s", td_test_tmp(name));
    td_test_write_file(path, text, strlen(text));
    snprintf(args, sizeof args, "plot %s -o %s", path, td_test_tmp("bad.svg"));
    expect(args, want_rc, NULL, needle);
    if (want_rc != 0 && access(td_test_tmp("bad.svg"), F_OK) == 0)
        fail_msg("a failed plot of %s left %s behind", name, td_test_tmp("bad.svg"));
}

static void bad_input_is_a_clear_error(void **state) {
    const char *step =
        "{\"event\":\"step\",\"step\":1,\"loss\":2.3,\"accuracy\":0.1,\"lr\":0.01}\n";
    char text[1024], args[1024];
    expect("plot /nonexistent/m.jsonl -o x.svg", 1, NULL,
           "/nonexistent/m.jsonl: No such file or directory");
    expect_plot_of("empty.jsonl", "", 1, "empty.jsonl: empty: no metrics lines");
    expect_plot_of("blank.jsonl", "\n  \n", 1, "blank.jsonl: empty");
    snprintf(text, sizeof text, "%s%s{\"event\":\"step\",\"step\":3,\"loss\":\n%s", step, step,
             step);
    expect_plot_of("torn.jsonl", text, 1, "torn.jsonl:3: not JSON");
    snprintf(text, sizeof text, "%s{\"event\":\"step\",\"step\":2,\"loss\":\"low\"}\n", step);
    expect_plot_of("field.jsonl", text, 1,
                   "field.jsonl:2: a step event whose \"loss\" is not a number");
    expect_plot_of("nostep.jsonl", "{\"event\":\"step\",\"loss\":1}\n", 1,
                   "nostep.jsonl:1: a step event without \"step\"");
    expect_plot_of("array.jsonl", "[1, 2]\n", 1, "array.jsonl:1: not a JSON object");
    expect_plot_of("noevent.jsonl", "{\"step\":1}\n", 1, "noevent.jsonl:1: no \"event\"");
    expect_plot_of("devs.jsonl", "{\"event\":\"devices\",\"step\":1,\"devices\":3}\n", 1,
                   "devs.jsonl:1: a devices event whose \"devices\" is not a list");
    expect_plot_of("other.jsonl", "{\"event\":\"epoch\",\"step\":5,\"test_loss\":1}\n", 1,
                   "other.jsonl: no step events");
    /* Events it does not know are skipped. */
    snprintf(text, sizeof text, "{\"event\":\"future\",\"step\":[]}\n%s", step);
    expect_plot_of("future.jsonl", text, 0, NULL);
    snprintf(args, sizeof args, "plot %s -o /nonexistent/run.svg", td_test_tmp("m.jsonl"));
    expect(args, 1, NULL, "/nonexistent/run.svg: No such file or directory (-o)");
}

static void svg_is_xml_with_a_point_per_step(void **state) {
    char cmd[1024], *out = NULL, *err = NULL, *svg;
    int steps = count_lines(td_test_tmp("m.jsonl"), "\"event\":\"step\"");
    int devices = count_lines(td_test_tmp("m.jsonl"), "\"event\":\"devices\"");
    require_tool("xmllint", "libxml2-utils");
    snprintf(cmd, sizeof cmd, "xmllint --noout %s", td_test_tmp("run.svg"));
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("%s is not well-formed XML: %s", td_test_tmp("run.svg"), err ? err : "");
    free(out);
    free(err);
    assert_int_equal(steps, STEPS);
    assert_int_equal(devices, STEPS);
    svg = (char *)td_test_read_file(td_test_tmp("run.svg"), NULL);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    /* Training loss, accuracy and learning rate: a point per step line. */
    assert_int_equal(polyline_points(svg, "loss-0"), steps);
    assert_int_equal(polyline_points(svg, "accuracy-0"), steps);
    assert_int_equal(polyline_points(svg, "lr-0"), steps);
    /* The test loss at the run's end; two devices' shares and busy fractions. */
    assert_int_equal(polyline_points(svg, "loss-1"), 1);
    assert_int_equal(polyline_points(svg, "share-0"), devices);
    assert_int_equal(polyline_points(svg, "share-1"), devices);
    assert_int_equal(polyline_points(svg, "busy-1"), devices);
    assert_int_equal(polyline_points(svg, "share-2"), -1);
    assert_non_null(strstr(svg, ">cpu:0</text>"));
    assert_non_null(strstr(svg, ">cpu:1</text>"));
    assert_non_null(strstr(svg, ">learning rate</text>"));
    free(svg);
}

/* The training loss's colour, give or take its anti-aliased edge. */
static int train_colour(const unsigned char *p) {
    return p[3] > 200 && abs(p[0] - TRAIN_R) + abs(p[1] - TRAIN_G) + abs(p[2] - TRAIN_B) < 48;
}

static void rendered_png_shows_the_falling_loss(void **state) {
    char cmd[1024], *out = NULL, *err = NULL, *svg;
    const char *at;
    int ax, ay, aw, ah, inked_n = 0, cols = 0, left = -1, right = -1;
    double y_left = 0, y_right = 0;
    int n_left = 0, n_right = 0;
    td_test_image im;
    require_tool("rsvg-convert", "librsvg2-bin");
    snprintf(cmd, sizeof cmd, "rsvg-convert -f png -o %s %s", td_test_tmp("run.png"),
             td_test_tmp("run.svg"));
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("rsvg-convert could not render %s: %s", td_test_tmp("run.svg"), err ? err : "");
    free(out);
    free(err);
    im = td_test_read_png(td_test_tmp("run.png"));
    for (int y = 0; y < im.h; y++)
        for (int x = 0; x < im.w; x++)
            inked_n += td_test_inked(td_test_pixel(&im, x, y));
    /* Axes, gridlines, text and five panels' curves: a few percent of the page. */
    if (inked_n < im.w * im.h / 50 || inked_n > im.w * im.h / 2)
        fail_msg("%d of %dx%d pixels drawn on: blank or smeared", inked_n, im.w, im.h);

    /* The loss panel's plot area, as the SVG places it (1 unit = 1 pixel). */
    svg = (char *)td_test_read_file(td_test_tmp("run.svg"), NULL);
    at = strstr(svg, "id=\"loss-area\"");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "id=\"loss-area\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"",
                            &ax, &ay, &aw, &ah),
                     4);
    free(svg);
    assert_true(ax + aw <= im.w && ay + ah <= im.h);
    /* The curve's columns: it spans the panel (the steps run from the first
     * tick to the last). */
    for (int x = ax; x < ax + aw; x++)
        for (int y = ay; y < ay + ah; y++)
            if (train_colour(td_test_pixel(&im, x, y))) {
                cols++;
                left = left < 0 ? x : left;
                right = x;
                break;
            }
    if (cols < aw / 2)
        fail_msg("the training loss shows in %d of the loss panel's %d columns", cols, aw);
    /* Loss falls: the curve's first tenth sits higher (smaller y) than its last. */
    for (int x = left; x <= right; x++)
        for (int y = ay; y < ay + ah; y++) {
            if (!train_colour(td_test_pixel(&im, x, y)))
                continue;
            if (x < left + (right - left) / 10)
                y_left += y, n_left++;
            else if (x > right - (right - left) / 10)
                y_right += y, n_right++;
        }
    assert_true(n_left > 0 && n_right > 0);
    print_message("%d of %dx%d pixels drawn on; the training loss from y %.1f to y %.1f\n", inked_n,
                  im.w, im.h, y_left / n_left, y_right / n_right);
    if (!(y_left / n_left < y_right / n_right - aw / 40.0))
        fail_msg("the loss curve starts at y %.1f and ends at y %.1f: it does not fall",
                 y_left / n_left, y_right / n_right);
    free(im.px);
}

/* A loss over three decades gets a log axis; a long run's curve is thinned
 * to a few points per pixel column; no devices lines, no device panels. */
static void long_runs_and_wide_losses(void **state) {
    const char *path = td_test_tmp("long.jsonl");
    char args[1024], *svg;
    FILE *f = fopen(path, "w");
    int points;
    assert_non_null(f);
    for (int s = 1; s <= 20000; s++)
        fprintf(f, "{\"event\":\"step\",\"step\":%d,\"loss\":%g,\"accuracy\":0.5,\"lr\":0.1}\n", s,
                10.0 * pow(1e-4, s / 20000.0) * (1 + 0.3 * (s % 7 == 0)));
    fclose(f);
    snprintf(args, sizeof args, "plot %s -o %s", path, td_test_tmp("long.svg"));
    expect(args, 0, NULL, NULL);
    svg = (char *)td_test_read_file(td_test_tmp("long.svg"), NULL);
    points = polyline_points(svg, "loss-0");
    if (points < 500 || points > 4 * 800)
        fail_msg("20000 steps drawn as %d points", points);
    /* Decades: 0.001 to 10 (or more). */
    assert_non_null(strstr(svg, ">0.001</text>"));
    assert_non_null(strstr(svg, ">10</text>"));
    assert_null(strstr(svg, "share-0"));
    assert_null(strstr(svg, "busy-0"));
    free(svg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(help_and_usage_errors),
        cmocka_unit_test(bad_input_is_a_clear_error),
        cmocka_unit_test(svg_is_xml_with_a_point_per_step),
        cmocka_unit_test(rendered_png_shows_the_falling_loss),
        cmocka_unit_test(long_runs_and_wide_losses),
    };
    return cmocka_run_group_tests(tests, setup, td_test_tmpdir_teardown);
}
