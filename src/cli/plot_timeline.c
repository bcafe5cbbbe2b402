/* tandem plot of a trace (tandem train --trace, Chrome's trace-event JSON):
 * one row per track, the spans as boxes coloured by category over a time
 * axis in ms (plot_svg.c draws it).
 *
 * A track is a (pid, tid) pair, named by its thread_name metadata event
 * ("cpu:0", "cpu:0 comm", "trainer") and ordered by its thread_sort_index,
 * process by process; with several processes (mpirun) its name says the
 * rank. Complete events ("ph":"X", ts and dur in microseconds) are the
 * spans, and one whose ts is not a number or whose dur is not one of 0 or
 * more is an error naming it; other phases are skipped, and so is anything
 * that is not an event. Time runs from the first span's start. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plot.h"

/* A track as the events name it. */
typedef struct row {
    long long pid, tid, sort;
    int sort_given;
    td_plot_track t;
} row;

typedef struct timeline {
    const char *path;
    row *rows; /* (n,), malloc'ed */
    int n, cap;
    long long first_step, last_step; /* of the spans' args.step; 0: none */
    int processes;                   /* distinct pids */
} timeline;

static void timeline_deinit(timeline *tl) {
    for (int i = 0; i < tl->n; i++)
        free(tl->rows[i].t.spans);
    free(tl->rows);
}

/* The row of (pid, tid), added when new; NULL out of memory (said). */
static row *row_of(timeline *tl, long long pid, long long tid) {
    row *r;
    for (int i = 0; i < tl->n; i++)
        if (tl->rows[i].pid == pid && tl->rows[i].tid == tid)
            return &tl->rows[i];
    if (tl->n == tl->cap) {
        int cap = tl->cap ? 2 * tl->cap : 16;
        row *nr = realloc(tl->rows, (size_t)cap * sizeof *nr);
        if (!nr) {
            fprintf(stderr, "tandem plot: %s: out of memory\n", tl->path);
            return NULL;
        }
        tl->rows = nr;
        tl->cap = cap;
    }
    r = &tl->rows[tl->n++];
    memset(r, 0, sizeof *r);
    r->pid = pid;
    r->tid = tid;
    snprintf(r->t.name, sizeof r->t.name, "thread %lld", tid);
    return r;
}

static int add_span(timeline *tl, row *r, td_plot_span s) {
    td_plot_track *t = &r->t;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        td_plot_span *ns = realloc(t->spans, cap * sizeof *ns);
        if (!ns) {
            fprintf(stderr, "tandem plot: %s: out of memory\n", tl->path);
            return 1;
        }
        t->spans = ns;
        t->cap = cap;
    }
    t->spans[t->n++] = s;
    return 0;
}

/* An integer member of o; 0 when absent or not a number. */
static long long int_of(json_t *o, const char *key) {
    json_t *j = json_object_get(o, key);
    return json_is_number(j) ? (long long)json_number_value(j) : 0;
}

/* The metadata events: names and order of the tracks. */
static int read_meta(timeline *tl, json_t *e) {
    const char *what = json_string_value(json_object_get(e, "name"));
    json_t *args = json_object_get(e, "args");
    row *r;
    if (!what || !json_is_object(args) ||
        (strcmp(what, "thread_name") && strcmp(what, "thread_sort_index")))
        return 0;
    if (!(r = row_of(tl, int_of(e, "pid"), int_of(e, "tid"))))
        return 1;
    if (!strcmp(what, "thread_name") && json_string_value(json_object_get(args, "name")))
        snprintf(r->t.name, sizeof r->t.name, "%s",
                 json_string_value(json_object_get(args, "name")));
    else if (!strcmp(what, "thread_sort_index")) {
        r->sort = int_of(args, "sort_index");
        r->sort_given = 1;
    }
    return 0;
}

/* A number member of a complete event that must hold microseconds (at least
 * lo); 0, or 1 after saying what is wrong with it, naming the event. */
static int micros_of(timeline *tl, json_t *e, size_t index, const char *key, double lo,
                     double *out) {
    json_t *j = json_object_get(e, key);
    const char *name = json_string_value(json_object_get(e, "name"));
    char *text;
    if (json_is_number(j) && isfinite(json_number_value(j)) && json_number_value(j) >= lo) {
        *out = json_number_value(j);
        return 0;
    }
    text = j ? json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    fprintf(stderr,
            "tandem plot: %s: event %zu (\"%.60s\", a complete event): \"%s\" %s%.60s%s; it "
            "wants a number of microseconds%s\n",
            tl->path, index, name ? name : "unnamed", key, j ? "is " : "is missing",
            text ? text : "", j && !json_is_number(j) ? ", not a number" : "",
            lo == 0 ? ", 0 or more" : "");
    free(text);
    return 1;
}

/* A complete event (number `index` of the list): a span, t0 and t1 in
 * microseconds of the trace's clock (moved to ms from the first span
 * later). A start that is not a number, or a duration that is not one of 0
 * or more, is an error: drawn, or skipped, it would misstate the run. */
static int read_span(timeline *tl, json_t *e, size_t index) {
    json_t *step = json_object_get(json_object_get(e, "args"), "step");
    td_plot_span s = {0};
    double dur;
    row *r;
    if (micros_of(tl, e, index, "ts", -INFINITY, &s.t0) || micros_of(tl, e, index, "dur", 0, &dur))
        return 1;
    s.t1 = s.t0 + dur;
    s.cat = td_cli_plot_cat(json_string_value(json_object_get(e, "cat")));
    s.name = json_string_value(json_object_get(e, "name"));
    if (json_is_integer(step) && json_integer_value(step) > 0) {
        long long k = json_integer_value(step);
        tl->first_step = tl->first_step && tl->first_step < k ? tl->first_step : k;
        tl->last_step = tl->last_step > k ? tl->last_step : k;
    }
    if (!(r = row_of(tl, int_of(e, "pid"), int_of(e, "tid"))))
        return 1;
    return add_span(tl, r, s);
}

static int by_start(const void *pa, const void *pb) {
    const td_plot_span *a = pa, *b = pb;
    if (a->t0 != b->t0)
        return a->t0 < b->t0 ? -1 : 1;
    if (a->t1 != b->t1)
        return a->t1 > b->t1 ? -1 : 1;
    return 0;
}

static int by_place(const void *pa, const void *pb) {
    const row *a = pa, *b = pb;
    long long ka = a->sort_given ? a->sort : a->tid, kb = b->sort_given ? b->sort : b->tid;
    if (a->pid != b->pid)
        return a->pid < b->pid ? -1 : 1;
    if (ka != kb)
        return ka < kb ? -1 : 1;
    return a->tid < b->tid ? -1 : a->tid > b->tid;
}

/* Rows in order, without those that hold no span; spans sorted, in ms from
 * the first start, each with its depth (how many spans of its row hold it:
 * those still open when it starts). */
static void arrange(timeline *tl) {
    double t_min = INFINITY, open[64];
    int kept = 0;
    for (int i = 0; i < tl->n; i++)
        for (size_t k = 0; k < tl->rows[i].t.n; k++)
            t_min = fmin(t_min, tl->rows[i].t.spans[k].t0);
    qsort(tl->rows, (size_t)tl->n, sizeof *tl->rows, by_place);
    for (int i = 0; i < tl->n; i++) {
        row *r = &tl->rows[i];
        int depth = 0;
        if (r->t.n == 0) {
            free(r->t.spans);
            continue;
        }
        if (kept == 0 || tl->rows[kept - 1].pid != r->pid)
            tl->processes++;
        qsort(r->t.spans, r->t.n, sizeof *r->t.spans, by_start);
        for (size_t k = 0; k < r->t.n; k++) {
            td_plot_span *s = &r->t.spans[k];
            s->t0 = (s->t0 - t_min) / 1000;
            s->t1 = (s->t1 - t_min) / 1000;
            while (depth > 0 && open[depth - 1] <= s->t0)
                depth--;
            s->depth = depth;
            if (depth < 64)
                open[depth++] = s->t1;
        }
        tl->rows[kept++] = *r;
    }
    tl->n = kept;
    /* With several processes, a row's name says whose. */
    for (int i = 0; i < tl->n && tl->processes > 1; i++) {
        char name[sizeof tl->rows[i].t.name];
        snprintf(name, sizeof name, "rank %lld %s", tl->rows[i].pid, tl->rows[i].t.name);
        memcpy(tl->rows[i].t.name, name, sizeof name);
    }
}

/* Writes the SVG; 0, or 1 after saying why not (and removing the file). */
static int write_timeline(timeline *tl, const char *out_path, long spans) {
    const char *base = strrchr(tl->path, '/') ? strrchr(tl->path, '/') + 1 : tl->path;
    char title[256], steps[64] = "";
    td_plot_track *tracks = malloc((size_t)(tl->n ? tl->n : 1) * sizeof *tracks);
    FILE *out;
    long drawn;
    if (!tracks) {
        fprintf(stderr, "tandem plot: %s: out of memory\n", tl->path);
        return 1;
    }
    for (int i = 0; i < tl->n; i++)
        tracks[i] = tl->rows[i].t;
    if (tl->first_step == tl->last_step && tl->first_step)
        snprintf(steps, sizeof steps, "step %lld, ", tl->first_step);
    else if (tl->first_step)
        snprintf(steps, sizeof steps, "steps %lld to %lld, ", tl->first_step, tl->last_step);
    snprintf(title, sizeof title, "%s: %s%d tracks, %ld spans", base, steps, tl->n, spans);
    if (!(out = fopen(out_path, "w"))) {
        fprintf(stderr, "tandem plot: %s: %s (-o)\n", out_path, strerror(errno));
        free(tracks);
        return 1;
    }
    drawn = td_cli_plot_timeline_svg(out, title, tracks, tl->n);
    free(tracks);
    if (fclose(out) != 0 || drawn != spans) {
        fprintf(stderr, "tandem plot: %s: %s\n", out_path, strerror(errno));
        unlink(out_path);
        return 1;
    }
    return 0;
}

int td_cli_plot_trace(const char *path, json_t *root, const char *out_path) {
    json_t *events = json_is_array(root) ? root : json_object_get(root, "traceEvents"), *e;
    timeline tl = {.path = path};
    long spans = 0;
    size_t i;
    int rc = 0;
    if (!json_is_array(events)) {
        fprintf(stderr, "tandem plot: %s: \"traceEvents\" is not a list of events\n", path);
        return 1;
    }
    json_array_foreach(events, i, e) {
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (!ph)
            continue;
        if (!strcmp(ph, "M"))
            rc = read_meta(&tl, e);
        else if (!strcmp(ph, "X"))
            rc = read_span(&tl, e, i);
        if (rc)
            break;
    }
    for (int k = 0; k < tl.n; k++)
        spans += (long)tl.rows[k].t.n;
    if (rc == 0 && spans == 0) {
        fprintf(stderr,
                "tandem plot: %s: a trace without spans (complete events, \"ph\":\"X\"): nothing "
                "to draw (tandem train --trace records the steps --trace-steps names)\n",
                path);
        rc = 1;
    }
    if (rc == 0) {
        arrange(&tl);
        rc = write_timeline(&tl, out_path, spans);
    }
    timeline_deinit(&tl);
    return rc;
}
