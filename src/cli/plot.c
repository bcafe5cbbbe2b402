/* tandem plot: a metrics file of tandem train (--metrics, JSON lines) drawn
 * as one SVG: loss, accuracy and learning rate over the steps and, when the
 * file has "devices" lines (the data strategy), each device's share of the
 * batch and how busy it was. A trace of tandem train --trace is drawn as a
 * timeline instead (plot_timeline.c): the file's first JSON value says
 * which it is.
 *
 * Lines are read in the file's order, so a resumed run's appended lines
 * continue its curves. Events other than step, eval, epoch, done and
 * devices are skipped: a newer tandem may write more. A null number (a step
 * whose loss was lost with a device) is left out; the curve joins the
 * points either side. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "plot.h"

static void usage(FILE *out) {
    fprintf(out, "usage: tandem plot METRICS.jsonl -o OUT.svg\n"
                 "       tandem plot TRACE.json -o OUT.svg\n\n"
                 "Draws a metrics file of 'tandem train --metrics' as one SVG, a panel per\n"
                 "quantity over the steps: the loss (training batches, and the test set where\n"
                 "the file has it; a log axis when it spans more than two decades), the\n"
                 "accuracy, the learning rate and, when several devices trained with the data\n"
                 "strategy, each device's share of the batch and its busy fraction (compute\n"
                 "time over the step's time).\n\n"
                 "A trace of 'tandem train --trace' is drawn as a timeline: a row per track\n"
                 "(each device, its collective engine, the trainer), each span a box coloured\n"
                 "by what it did (compute, comm, copy, wait, idle, update, step), over a time\n"
                 "axis in ms.\n\n"
                 "  -o, --output FILE  the SVG to write (required)\n"
                 "  -h, --help         show this help\n");
}

static const struct option options[] = {
    {"output", required_argument, NULL, 'o'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* The panels, in the order they are stacked. */
enum { LOSS, ACCURACY, LR, SHARE, BUSY, NPANELS };

/* What has been read so far, and where. */
typedef struct plot_data {
    const char *path;
    long line;                /* the line being read, from 1 */
    long steps;               /* step lines */
    double last_test_step;    /* the newest test point's step (epoch and done repeat it) */
    int dropped;              /* 1: a device did not fit in the panels (said once) */
    td_plot_panel p[NPANELS]; /* LOSS .. BUSY */
} plot_data;

static void plot_data_init(plot_data *d, const char *path) {
    memset(d, 0, sizeof *d);
    d->path = path;
    d->last_test_step = NAN;
    d->p[LOSS] = (td_plot_panel){.id = "loss", .title = "loss", .allow_log = 1};
    d->p[ACCURACY] = (td_plot_panel){.id = "accuracy", .title = "accuracy (%)"};
    d->p[LR] = (td_plot_panel){.id = "lr", .title = "learning rate"};
    d->p[SHARE] = (td_plot_panel){.id = "share", .title = "share of the batch", .unit_range = 1};
    d->p[BUSY] =
        (td_plot_panel){.id = "busy", .title = "busy (compute / step time)", .unit_range = 1};
}

static void plot_data_deinit(plot_data *d) {
    for (int i = 0; i < NPANELS; i++)
        td_cli_plot_panel_deinit(&d->p[i]);
}

/* "tandem plot: FILE:LINE: what", and 1 (the exit status). */
static int bad_line(const plot_data *d, const char *what, const char *field) {
    fprintf(stderr, "tandem plot: %s:%ld: %s%s%s\n", d->path, d->line, what, field ? " " : "",
            field ? field : "");
    return 1;
}

/* o[key] as a number: 1 and *v when it is one, 0 when it is absent or null
 * (or not finite), -1 (said) when it is something else. */
static int number(const plot_data *d, const char *event, json_t *o, const char *key, double *v) {
    json_t *j = json_object_get(o, key);
    char what[96];
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_number(j)) {
        snprintf(what, sizeof what, "a %s event whose \"%s\" is not a number", event, key);
        bad_line(d, what, NULL);
        return -1;
    }
    *v = json_number_value(j);
    return isfinite(*v) ? 1 : 0;
}

/* Adds (x, y) to panel p's series `name`. Returns 0, or 1 (said) out of memory. */
static int add_point(plot_data *d, int p, const char *name, int markers, double x, double y) {
    td_plot_series *s = td_cli_plot_series(&d->p[p], name, markers);
    if (!s) {
        if (!d->dropped)
            fprintf(stderr, "tandem plot: %s: more than %d devices; the rest are not drawn\n",
                    d->path, TD_PLOT_MAX_SERIES);
        d->dropped = 1;
        return 0;
    }
    if (td_cli_plot_add(s, x, y) != 0) {
        fprintf(stderr, "tandem plot: %s: out of memory\n", d->path);
        return 1;
    }
    return 0;
}

/* The event's step, which every event plotted has. Returns 0, or 1 (said). */
static int event_step(const plot_data *d, const char *event, json_t *o, double *step) {
    int got = number(d, event, o, "step", step);
    if (got < 0)
        return 1;
    if (got == 0) {
        char what[64];
        snprintf(what, sizeof what, "a %s event without \"step\"", event);
        return bad_line(d, what, NULL);
    }
    return 0;
}

/* One training step: the batch's loss and accuracy, the learning rate. */
static int on_step(plot_data *d, const char *event, json_t *o) {
    double step = 0, v = 0;
    int got, rc = 0;
    if (event_step(d, event, o, &step))
        return 1;
    d->steps++;
    if ((got = number(d, event, o, "loss", &v)) < 0)
        return 1;
    if (got)
        rc |= add_point(d, LOSS, "train", 0, step, v);
    if ((got = number(d, event, o, "accuracy", &v)) < 0)
        return 1;
    if (got)
        rc |= add_point(d, ACCURACY, "train", 0, step, 100 * v);
    if ((got = number(d, event, o, "lr", &v)) < 0)
        return 1;
    if (got)
        rc |= add_point(d, LR, "learning rate", 0, step, v);
    return rc;
}

/* An evaluation on the test set (eval, epoch and done lines): one point of
 * each test curve. An epoch's end and the run's end repeat the newest
 * evaluation at the same step, which is drawn once. */
static int on_test(plot_data *d, const char *event, json_t *o) {
    double step = 0, loss = 0, acc = 0;
    int got_loss, got_acc, rc = 0;
    if (event_step(d, event, o, &step))
        return 1;
    if ((got_loss = number(d, event, o, "test_loss", &loss)) < 0 ||
        (got_acc = number(d, event, o, "test_accuracy", &acc)) < 0)
        return 1;
    if ((!got_loss && !got_acc) || step == d->last_test_step)
        return 0;
    d->last_test_step = step;
    if (got_loss)
        rc |= add_point(d, LOSS, "test", 1, step, loss);
    if (got_acc)
        rc |= add_point(d, ACCURACY, "test", 1, step, 100 * acc);
    return rc;
}

/* One device of a devices line: its share and compute time over the step's. */
static int on_member(plot_data *d, double step, double step_s, json_t *m) {
    const char *name = json_string_value(json_object_get(m, "name"));
    double share = 0, compute = 0;
    int got_share, got_compute, rc = 0;
    if (!json_is_object(m) || !name)
        return bad_line(d, "a devices event with a device that has no \"name\"", NULL);
    if ((got_share = number(d, "devices", m, "share", &share)) < 0 ||
        (got_compute = number(d, "devices", m, "compute_s", &compute)) < 0)
        return 1;
    if (got_share)
        rc |= add_point(d, SHARE, name, 0, step, share);
    if (got_compute && step_s > 0)
        rc |= add_point(d, BUSY, name, 0, step, compute / step_s);
    return rc;
}

/* One data-parallel step, per device. */
static int on_devices(plot_data *d, const char *event, json_t *o) {
    json_t *members = json_object_get(o, "devices"), *m;
    double step = 0, step_s = 0;
    size_t i;
    if (event_step(d, event, o, &step) || number(d, event, o, "step_s", &step_s) < 0)
        return 1;
    if (!json_is_array(members))
        return bad_line(d, "a devices event whose \"devices\" is not a list", NULL);
    json_array_foreach(members, i, m) {
        if (on_member(d, step, step_s, m))
            return 1;
    }
    return 0;
}

static const struct {
    const char *name;
    int (*read)(plot_data *d, const char *event, json_t *o);
} events[] = {
    {"step", on_step}, {"eval", on_test},       {"epoch", on_test},
    {"done", on_test}, {"devices", on_devices},
};

/* One line of the file: 0, or 1 after saying what is wrong with it. */
static int read_line(plot_data *d, const char *text) {
    json_error_t e;
    json_t *o = json_loads(text, JSON_DECODE_ANY, &e);
    const char *event;
    int rc = 0;
    if (!o) {
        fprintf(stderr, "tandem plot: %s:%ld: not JSON: %s (column %d)\n", d->path, d->line, e.text,
                e.column);
        return 1;
    }
    if (!json_is_object(o))
        rc = bad_line(d, "not a JSON object (a metrics line is {\"event\": ...})", NULL);
    else if (!(event = json_string_value(json_object_get(o, "event"))))
        rc = bad_line(d, "no \"event\" name: not a line of tandem train --metrics", NULL);
    else
        for (size_t i = 0; i < sizeof events / sizeof *events; i++)
            if (!strcmp(event, events[i].name)) {
                rc = events[i].read(d, event, o);
                break;
            }
    json_decref(o);
    return rc;
}

static int blank(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
        s++;
    return !*s;
}

/* Reads the whole file into d. Returns 0, or 1 after saying why not. */
static int read_metrics(plot_data *d) {
    FILE *f = fopen(d->path, "r");
    char *text = NULL;
    size_t cap = 0;
    long lines = 0;
    int rc = 0;
    if (!f) {
        fprintf(stderr, "tandem plot: %s: %s\n", d->path, strerror(errno));
        return 1;
    }
    while (rc == 0 && getline(&text, &cap, f) != -1) {
        d->line++;
        if (blank(text))
            continue;
        lines++;
        rc = read_line(d, text);
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "tandem plot: %s: cannot read: %s\n", d->path, strerror(errno));
        rc = 1;
    } else if (rc == 0 && lines == 0) {
        fprintf(stderr, "tandem plot: %s: empty: no metrics lines to plot\n", d->path);
        rc = 1;
    } else if (rc == 0 && d->steps == 0) {
        fprintf(stderr,
                "tandem plot: %s: no step events among its %ld lines: nothing to plot "
                "(tandem train --metrics writes one per step)\n",
                d->path, lines);
        rc = 1;
    }
    free(text);
    fclose(f);
    return rc;
}

/* Writes the SVG to out_path. Returns 0, or 1 after saying why not (and
 * removing what it wrote). */
static int write_svg(plot_data *d, const char *out_path) {
    const char *base = strrchr(d->path, '/') ? strrchr(d->path, '/') + 1 : d->path;
    char title[256];
    FILE *out = fopen(out_path, "w");
    int drawn;
    if (!out) {
        fprintf(stderr, "tandem plot: %s: %s (-o)\n", out_path, strerror(errno));
        return 1;
    }
    snprintf(title, sizeof title, "%s: %ld steps", base, d->steps);
    drawn = td_cli_plot_svg(out, title, "step", d->p, NPANELS);
    if (fclose(out) != 0 || drawn <= 0) {
        fprintf(stderr, "tandem plot: %s: %s\n", out_path,
                drawn < 0    ? "out of memory"
                : drawn == 0 ? "no numbers to plot (every loss, accuracy and rate is null)"
                             : strerror(errno));
        unlink(out_path);
        return 1;
    }
    return 0;
}

/* The file's first JSON value when the file is a trace (an object with
 * "traceEvents", or a list whose first item is an event with "ph"), in
 * *trace; else *trace is NULL: a metrics file, whose first line is its
 * first value, or a file that read_metrics finds fault with line by line.
 * Returns 0, or 1 after saying that a trace does not parse. */
static int read_trace(const char *path, json_t **trace) {
    json_error_t e;
    json_t *root = json_load_file(path, JSON_DISABLE_EOF_CHECK, &e), *first;
    char head[256] = "";
    FILE *f;
    *trace = NULL;
    if (root) {
        first = json_array_get(root, 0);
        if ((json_is_object(root) && json_object_get(root, "traceEvents")) ||
            (json_is_object(first) && json_object_get(first, "ph")))
            *trace = root;
        else
            json_decref(root);
        return 0;
    }
    /* A trace cut short (a run killed while writing it) says so at its head. */
    if ((f = fopen(path, "r"))) {
        size_t n = fread(head, 1, sizeof head - 1, f);
        head[n] = '\0';
        fclose(f);
    }
    if (!strstr(head, "\"traceEvents\"") && !strstr(head, "\"displayTimeUnit\""))
        return 0;
    fprintf(stderr, "tandem plot: %s:%d: a trace that is not whole JSON: %s (column %d)\n", path,
            e.line, e.text, e.column);
    return 1;
}

int td_cli_plot(int argc, char **argv) {
    const char *out_path = NULL;
    plot_data d;
    int c, rc;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":ho:", options, NULL)) != -1) {
        switch (c) {
        case 'o': out_path = optarg; break;
        case 'h': usage(stdout); return 0;
        case ':': fprintf(stderr, "tandem plot: %s needs a value\n", argv[optind - 1]); return 2;
        default:
            fprintf(stderr, "tandem plot: unknown option '%s'\n\n", argv[optind - 1]);
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind != 1 || !out_path) {
        fprintf(stderr, "tandem plot: %s\n\n",
                argc - optind > 1 ? "one metrics file at a time"
                : !out_path       ? "-o OUT.svg is required"
                                  : "which metrics file? (tandem train --metrics FILE)");
        usage(stderr);
        return 2;
    }
    json_t *trace;
    if (read_trace(argv[optind], &trace) != 0)
        return 1;
    if (trace) {
        rc = td_cli_plot_trace(argv[optind], trace, out_path);
        json_decref(trace);
        return rc;
    }
    plot_data_init(&d, argv[optind]);
    rc = read_metrics(&d);
    if (rc == 0)
        rc = write_svg(&d, out_path);
    plot_data_deinit(&d);
    return rc;
}
