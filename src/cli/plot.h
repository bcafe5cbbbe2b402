/* tandem plot's SVG writer (plot_svg.c): panels of line series over a
 * shared x axis, stacked vertically, for plot.c to fill from a metrics file. */
#ifndef TD_CLI_PLOT_H
#define TD_CLI_PLOT_H

#include <stddef.h>
#include <stdio.h>

/* Series in one panel: more are dropped (plot.c says so). */
#define TD_PLOT_MAX_SERIES 16

/* One curve: points in the order they came, x ascending or not. */
typedef struct td_plot_series {
    char name[48]; /* the legend's text */
    int markers;   /* 1: a circle on every point (sparse series, test loss) */
    double *x, *y; /* (n,) each, malloc'ed, cap allocated */
    size_t n, cap;
} td_plot_series;

/* One quantity: a plot area with its own y axis, a title and a legend. */
typedef struct td_plot_panel {
    const char *id;    /* ids of its SVG elements: "<id>-area", "<id>-<series index>" */
    const char *title; /* above the plot area, left */
    int unit_range;    /* 1: y runs over [0, 1] whatever the data */
    int allow_log;     /* 1: log y when the positive data span more than 2 decades */
    int nseries;
    td_plot_series series[TD_PLOT_MAX_SERIES];
} td_plot_panel;

/* The series of p named name, added (empty, with markers as given) when p
 * has none of that name. NULL when p already holds TD_PLOT_MAX_SERIES. */
td_plot_series *td_cli_plot_series(td_plot_panel *p, const char *name, int markers);

/* Appends (x, y). Returns 0, or -1 when out of memory (s is unchanged). */
int td_cli_plot_add(td_plot_series *s, double x, double y);

/* Frees the points of p's series; p itself is the caller's. NULL does nothing. */
void td_cli_plot_panel_deinit(td_plot_panel *p);

/* Writes one SVG document to out: title at the top, then each panel that
 * holds a point, all over the same x range (labelled xlabel at the bottom).
 * Series of more points than the plot is pixels wide keep each pixel
 * column's first, lowest, highest and last point. Returns the number of
 * panels drawn (0: nothing to draw, and nothing written), or -1 when out of
 * memory (the document is cut short). */
int td_cli_plot_svg(FILE *out, const char *title, const char *xlabel, const td_plot_panel *panels,
                    int npanels);

/* A timeline: a trace of tandem train --trace (plot_timeline.c reads it) ---- */

/* What a span did; each has its colour and a legend entry. */
typedef enum td_plot_cat {
    TD_PLOT_COMPUTE = 0, /* forward, backward */
    TD_PLOT_COMM,        /* a collective */
    TD_PLOT_COPY,        /* host and device copies */
    TD_PLOT_WAIT,        /* waiting for a collective or another member */
    TD_PLOT_IDLE,        /* a step sat out (parked) */
    TD_PLOT_UPDATE,      /* the optimizer step */
    TD_PLOT_STEP,        /* the trainer's: loading a batch, the whole step */
    TD_PLOT_OTHER,       /* a category tandem does not write */
    TD_PLOT_CATS,
} td_plot_cat;

/* The category a trace names "compute", "comm", ...; TD_PLOT_OTHER for any
 * other name or NULL. */
td_plot_cat td_cli_plot_cat(const char *name);

/* One span of a track. */
typedef struct td_plot_span {
    double t0, t1;    /* ms from the timeline's start; t0 <= t1 */
    int cat;          /* td_plot_cat */
    int depth;        /* spans of its track that hold it; it is drawn inside them */
    const char *name; /* borrowed (from the parsed trace) */
} td_plot_span;

/* One row: a thread of the run (a device's, its collective engine's, the
 * trainer's), its spans sorted by start, the longer first where two start
 * together. */
typedef struct td_plot_track {
    char name[64];
    td_plot_span *spans; /* (n,), malloc'ed, cap allocated */
    size_t n, cap;
} td_plot_track;

/* Writes one SVG document to out: the title, a legend of the categories
 * that occur, a row per track (id "row-<index>", its name in a <title> and
 * at its left; a <rect> per span, coloured by category, nested spans drawn
 * inside those that hold them) and a time axis in ms with round ticks.
 * Returns the number of spans drawn (0: none, and nothing written). */
long td_cli_plot_timeline_svg(FILE *out, const char *title, const td_plot_track *tracks,
                              int ntracks);

/* tandem plot of a trace: root is the parsed file (its traceEvents, or the
 * bare array of events Chrome's format also allows), path its name for
 * messages. Writes out_path; returns 0, or 1 after saying why not. */
struct json_t;
int td_cli_plot_trace(const char *path, struct json_t *root, const char *out_path);

#endif
