/* tandem plot of a trace as a user runs it: a real short run's --trace
 * (two CPU devices, data parallel, the reduction overlapped so that the
 * collective engines have tracks) drawn as a timeline; the SVG checked as
 * XML and row by row against the trace read with jansson (a row per track
 * that has spans, a box per span), then rendered by rsvg-convert and the
 * pixels looked at; the other shape of Chrome's format (a bare list of
 * events) and traces it cannot draw.
 *
 * rsvg-convert (librsvg2-bin) and xmllint (libxml2-utils) come with
 * scripts/bootstrap; without them the test fails rather than skips. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support/png.h"
#include "support/support.h"

#define EXE   TD_TANDEM_EXE
#define MNIST TD_SOURCE_DIR "/data/mnist"
#define MLP   TD_SOURCE_DIR "/examples/mnist_mlp.json"

/* The trace's tracks: each (pid, tid)'s name and how many spans it has, and
 * the widest span of each category (in microseconds). */
#define MAX_TRACKS 32
typedef struct trace_counts {
    int n;
    struct {
        long long pid, tid;
        char name[64];
        int spans;
    } t[MAX_TRACKS];
    double widest[8]; /* by the categories' order in the legend */
    double end_us;    /* last span's end, from the first span's start */
} trace_counts;

static const char *const cat_names[8] = {"compute", "comm",   "copy", "wait",
                                         "idle",    "update", "step", "other"};
/* plot_svg.c's colours of those categories, as red, green, blue. */
static const unsigned char cat_rgb[8][3] = {
    {0x1f, 0x77, 0xb4}, {0xff, 0x7f, 0x0e}, {0x2c, 0xa0, 0x2c}, {0xb0, 0xb0, 0xb0},
    {0xe2, 0xe2, 0xe2}, {0x94, 0x67, 0xbd}, {0xc4, 0x9c, 0x94}, {0x7f, 0x7f, 0x7f}};

static int track_of(trace_counts *c, long long pid, long long tid) {
    for (int i = 0; i < c->n; i++)
        if (c->t[i].pid == pid && c->t[i].tid == tid)
            return i;
    assert_true(c->n < MAX_TRACKS);
    c->t[c->n].pid = pid;
    c->t[c->n].tid = tid;
    c->t[c->n].spans = 0;
    snprintf(c->t[c->n].name, sizeof c->t[c->n].name, "thread %lld", tid);
    return c->n++;
}

/* Reads the trace with jansson, apart from tandem's own reader. */
static void count_trace(const char *path, trace_counts *c) {
    json_error_t e;
    json_t *root = json_load_file(path, 0, &e), *ev;
    double first = 1e300, last = 0;
    size_t i;
    memset(c, 0, sizeof *c);
    if (!root)
        fail_msg("%s: %s (line %d)", path, e.text, e.line);
    json_array_foreach(json_object_get(root, "traceEvents"), i, ev) {
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        int k = track_of(c, json_integer_value(json_object_get(ev, "pid")),
                         json_integer_value(json_object_get(ev, "tid")));
        if (!strcmp(ph, "M") &&
            !strcmp(json_string_value(json_object_get(ev, "name")), "thread_name"))
            snprintf(c->t[k].name, sizeof c->t[k].name, "%s",
                     json_string_value(json_object_get(json_object_get(ev, "args"), "name")));
        if (strcmp(ph, "X"))
            continue;
        double ts = json_number_value(json_object_get(ev, "ts"));
        double dur = json_number_value(json_object_get(ev, "dur"));
        const char *cat = json_string_value(json_object_get(ev, "cat"));
        int ci = 7;
        for (int j = 0; j < 7; j++)
            if (cat && !strcmp(cat, cat_names[j]))
                ci = j;
        c->widest[ci] = dur > c->widest[ci] ? dur : c->widest[ci];
        first = ts < first ? ts : first;
        last = ts + dur > last ? ts + dur : last;
        c->t[k].spans++;
    }
    c->end_us = last - first;
    json_decref(root);
}

/* The output of an xmllint --xpath query on the SVG. */
static char *xpath(const char *svg, const char *query) {
    char cmd[1024], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "xmllint --xpath \"%s\" %s", query, svg);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("xmllint --xpath '%s' %s failed: %s", query, svg, err);
    free(err);
    for (size_t n = strlen(out); n > 0 && (out[n - 1] == '\n' || out[n - 1] == ' '); n--)
        out[n - 1] = '\0';
    return out;
}

static void require_tool(const char *tool, const char *package) {
    char cmd[256], *out = NULL, *err = NULL;
    snprintf(cmd, sizeof cmd, "command -v %s", tool);
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("%s not found: install %s (scripts/bootstrap does)", tool, package);
    free(out);
    free(err);
}

/* Runs "tandem <args>"; checks its status and that stderr holds needle. */
static void expect(const char *args, int want_rc, const char *err_needle) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' %s", EXE, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != want_rc)
        fail_msg("'%s' exited %d, expected %d\nstdout: %s\nstderr: %s", args, rc, want_rc, out,
                 err);
    if (err_needle && !strstr(err, err_needle))
        fail_msg("'%s': stderr lacks \"%s\": %s", args, err_needle, err);
    free(out);
    free(err);
}

/* A real run's trace (steps 2 to 4 of 5) and its timeline, made once. */
static int setup(void **state) {
    char cmd[2048], *out = NULL, *err = NULL;
    int rc;
    if (td_test_tmpdir_setup(state) != 0)
        return -1;
    snprintf(cmd, sizeof cmd,
             "('%s' train --model " MLP " --data " MNIST " --steps 5 --batch 128 --devices "
             "'cpu*2' --strategy data --overlap on --bucket-bytes 65536 --eval-samples 500 "
             "--quiet --trace %s --trace-steps 2:4 && '%s' plot %s -o %s)",
             EXE, td_test_tmp("run.json"), EXE, td_test_tmp("run.json"), td_test_tmp("tl.svg"));
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fprintf(stderr, "setup: '%s' exited %d\nstdout: %s\nstderr: %s\n", cmd, rc, out, err);
    free(out);
    free(err);
    return rc == 0 ? 0 : -1;
}

static void a_row_per_track_and_a_box_per_span(void **state) {
    const char *svg = td_test_tmp("tl.svg");
    char query[256], *out = NULL, *err = NULL, *text;
    trace_counts c;
    int rows = 0, devices = 0, engines = 0;
    (void)state;
    require_tool("xmllint", "libxml2-utils");
    snprintf(query, sizeof query, "xmllint --noout %s", svg);
    if (td_test_run_command(query, &out, &err) != 0)
        fail_msg("%s is not well-formed XML: %s", svg, err);
    free(out);
    free(err);
    count_trace(td_test_tmp("run.json"), &c);
    for (int i = 0; i < c.n; i++) {
        char *name, *boxes;
        if (c.t[i].spans == 0)
            continue;
        /* Rows come in the trace's track order (the trainer's first). */
        snprintf(query, sizeof query, "string(//*[local-name()='g'][@id='row-%d']/*[1])", rows);
        name = xpath(svg, query);
        snprintf(query, sizeof query,
                 "count(//*[local-name()='g'][@id='row-%d']/*[local-name()='rect']"
                 "[*[local-name()='title']])",
                 rows);
        boxes = xpath(svg, query);
        if (strcmp(name, c.t[i].name) || atoi(boxes) != c.t[i].spans)
            fail_msg("row %d: \"%s\" with %s boxes; the trace's track %d: \"%s\" with %d spans",
                     rows, name, boxes, i, c.t[i].name, c.t[i].spans);
        print_message("row %d: %-12s %4d spans\n", rows, name, c.t[i].spans);
        devices += !strncmp(name, "cpu:", 4) && !strstr(name, "comm");
        engines += strstr(name, " comm") != NULL;
        free(name);
        free(boxes);
        rows++;
    }
    snprintf(query, sizeof query, "count(//*[local-name()='g'][starts-with(@id, 'row-')])");
    text = xpath(svg, query);
    assert_int_equal(atoi(text), rows);
    free(text);
    /* The trainer, two devices and (overlapped) their collective engines. */
    assert_int_equal(devices, 2);
    assert_int_equal(engines, 2);
    text = (char *)td_test_read_file(svg, NULL);
    assert_non_null(strstr(text, "steps 2 to 4"));
    assert_non_null(strstr(text, ">time (ms)</text>"));
    {
        /* The axis starts at a round 0 ("0", or "0.0" when its step is
         * under 1 ms, as on a quiet machine). */
        const char *tick = strstr(text, "text-anchor=\"middle\">");
        char *end = NULL;
        assert_non_null(tick);
        tick += strlen("text-anchor=\"middle\">");
        assert_true(strtod(tick, &end) == 0 && end > tick && *end == '<');
    }
    for (int k = 0; k < 8; k++) { /* a legend entry per category seen */
        char entry[32];
        snprintf(entry, sizeof entry, ">%s</text>", cat_names[k]);
        if ((c.widest[k] > 0) != (strstr(text, entry) != NULL))
            fail_msg("category %s: %s spans, %s legend entry", cat_names[k],
                     c.widest[k] > 0 ? "has" : "no", strstr(text, entry) ? "a" : "no");
    }
    free(text);
}

/* Near a category's colour (anti-aliased edges aside). */
static int near(const unsigned char *p, const unsigned char *rgb) {
    return p[3] > 200 && abs(p[0] - rgb[0]) + abs(p[1] - rgb[1]) + abs(p[2] - rgb[2]) < 24;
}

static void rendered_png_shows_the_boxes(void **state) {
    char cmd[1024], *out = NULL, *err = NULL;
    trace_counts c;
    td_test_image im;
    long inked = 0;
    (void)state;
    require_tool("rsvg-convert", "librsvg2-bin");
    snprintf(cmd, sizeof cmd, "rsvg-convert -f png -o %s %s", td_test_tmp("tl.png"),
             td_test_tmp("tl.svg"));
    if (td_test_run_command(cmd, &out, &err) != 0)
        fail_msg("rsvg-convert could not render: %s", err);
    free(out);
    free(err);
    im = td_test_read_png(td_test_tmp("tl.png"));
    for (int y = 0; y < im.h; y++)
        for (int x = 0; x < im.w; x++)
            inked += td_test_inked(td_test_pixel(&im, x, y));
    if (inked < (long)im.w * im.h / 20 || inked > (long)im.w * im.h * 9 / 10)
        fail_msg("%ld of %dx%d pixels drawn on: blank or smeared", inked, im.w, im.h);
    /* Every category with a span 4 pixels wide or more shows in its colour
     * (the axis is about 716 pixels for the whole trace, or a little more). */
    count_trace(td_test_tmp("run.json"), &c);
    for (int k = 0; k < 8; k++) {
        int found = 0;
        if (c.widest[k] / c.end_us * 716 * 0.8 < 4)
            continue;
        for (int y = 0; y < im.h && !found; y++)
            for (int x = 0; x < im.w && !found; x++)
                found = near(td_test_pixel(&im, x, y), cat_rgb[k]);
        if (!found)
            fail_msg("no %s box in the picture (its widest span: %.0f us of %.0f)", cat_names[k],
                     c.widest[k], c.end_us);
    }
    print_message("%ld of %dx%d pixels drawn on\n", inked, im.w, im.h);
    free(im.px);
}

static void other_shapes_and_bad_traces(void **state) {
    char args[1024], *svg;
    const char *list = "[{\"name\":\"forward\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":0,"
                       "\"tid\":1,\"ts\":1000,\"dur\":500},\n"
                       " {\"name\":\"copy in\",\"cat\":\"copy\",\"ph\":\"X\",\"pid\":0,"
                       "\"tid\":1,\"ts\":1100,\"dur\":100},\n"
                       " {\"name\":\"x\",\"ph\":\"i\",\"pid\":0,\"tid\":2,\"ts\":1}]\n";
    (void)state;
    /* A bare list of events: one row (tid 2 has no span), two boxes, the
     * copy inside the forward. */
    td_test_write_file(td_test_tmp("list.json"), list, strlen(list));
    snprintf(args, sizeof args, "plot %s -o %s", td_test_tmp("list.json"), td_test_tmp("l.svg"));
    expect(args, 0, NULL);
    svg = (char *)td_test_read_file(td_test_tmp("l.svg"), NULL);
    assert_non_null(strstr(svg, "id=\"row-0\""));
    assert_null(strstr(svg, "id=\"row-1\""));
    assert_non_null(strstr(svg, "<title>forward: 0.500 ms</title>"));
    assert_non_null(strstr(svg, "<title>copy in: 0.100 ms</title>"));
    assert_non_null(strstr(svg, ">thread 1</text>"));
    free(svg);
    /* No spans; cut short; traceEvents not a list. */
    td_test_write_file(td_test_tmp("none.json"), "{\"traceEvents\":[]}", 18);
    snprintf(args, sizeof args, "plot %s -o %s", td_test_tmp("none.json"), td_test_tmp("n.svg"));
    expect(args, 1, "a trace without spans");
    td_test_write_file(td_test_tmp("torn.json"), "{\"displayTimeUnit\":\"ms\",\n\"traceEvents\":[",
                       40);
    snprintf(args, sizeof args, "plot %s -o %s", td_test_tmp("torn.json"), td_test_tmp("t.svg"));
    expect(args, 1, "a trace that is not whole JSON");
    td_test_write_file(td_test_tmp("bad.json"), "{\"traceEvents\":3}", 17);
    snprintf(args, sizeof args, "plot %s -o %s", td_test_tmp("bad.json"), td_test_tmp("b.svg"));
    expect(args, 1, "\"traceEvents\" is not a list of events");
    /* A span that ends before it starts, or starts at a string: refused,
     * naming the event, not drawn nor skipped without a word. */
    {
        static const struct {
            const char *event, *says;
        } bad[] = {
            {"{\"name\":\"forward\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1000,\"dur\":-5}",
             "event 1 (\"forward\", a complete event): \"dur\" is -5; it wants a number of "
             "microseconds, 0 or more"},
            {"{\"name\":\"backward\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":\"1200\","
             "\"dur\":5}",
             "event 1 (\"backward\", a complete event): \"ts\" is \"1200\", not a number; it "
             "wants a number of microseconds"},
            {"{\"name\":\"step\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":1200}",
             "event 1 (\"step\", a complete event): \"dur\" is missing"},
        };
        for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
            char text[1024];
            int n = snprintf(text, sizeof text,
                             "{\"traceEvents\":[{\"name\":\"ok\",\"ph\":\"X\",\"pid\":0,"
                             "\"tid\":1,\"ts\":900,\"dur\":50},\n%s]}",
                             bad[k].event);
            td_test_write_file(td_test_tmp("neg.json"), text, (size_t)n);
            snprintf(args, sizeof args, "plot %s -o %s", td_test_tmp("neg.json"),
                     td_test_tmp("neg.svg"));
            expect(args, 1, bad[k].says);
            assert_int_equal(access(td_test_tmp("neg.svg"), F_OK), -1);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_row_per_track_and_a_box_per_span),
        cmocka_unit_test(rendered_png_shows_the_boxes),
        cmocka_unit_test(other_shapes_and_bad_traces),
    };
    return cmocka_run_group_tests(tests, setup, td_test_tmpdir_teardown);
}
