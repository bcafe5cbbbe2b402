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

#endif
