/* tandem plot's SVG writer: stacked panels, one y axis each, one x axis
 * range for all, ticks at round values (1, 2 or 5 times a power of ten, or
 * every decade on a log axis), a legend above each plot area.
 *
 * The document is plain SVG 1.1 with no script or CSS, so that a browser,
 * rsvg-convert and an XML checker all read it the same way. Coordinates are
 * user units of one pixel at 96 dpi. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"

/* Page and panel geometry, in pixels. */
enum {
    PAGE_W = 860,
    MARGIN_L = 72, /* room for the y tick labels */
    MARGIN_R = 24,
    PLOT_W = PAGE_W - MARGIN_L - MARGIN_R,
    TITLE_H = 40,
    HEAD_H = 26, /* a panel's title and legend */
    PLOT_H = 160,
    FOOT_H = 30,   /* x tick labels */
    XLABEL_H = 18, /* the x axis' name, under the last panel */
    PANEL_H = HEAD_H + PLOT_H + FOOT_H,
};

/* Tableau's ten colours: distinct in print and for most colour-blind eyes. */
static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

td_plot_series *td_cli_plot_series(td_plot_panel *p, const char *name, int markers) {
    td_plot_series *s;
    for (int i = 0; i < p->nseries; i++)
        if (!strcmp(p->series[i].name, name))
            return &p->series[i];
    if (p->nseries == TD_PLOT_MAX_SERIES)
        return NULL;
    s = &p->series[p->nseries++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->markers = markers;
    return s;
}

int td_cli_plot_add(td_plot_series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

void td_cli_plot_panel_deinit(td_plot_panel *p) {
    if (!p)
        return;
    for (int i = 0; i < p->nseries; i++) {
        free(p->series[i].x);
        free(p->series[i].y);
    }
    p->nseries = 0;
}

/* An axis: data value v sits at fraction (v - lo) / (hi - lo) of its length
 * (of the logarithms on a log axis), with a tick every `step` from lo (every
 * decade on a log axis). */
typedef struct axis {
    double lo, hi, step;
    int log;
} axis;

/* The round number (1, 2 or 5 times a power of ten) nearest x, or the
 * smallest at least x when ceil. */
static double round_number(double x, int ceil_it) {
    double e = pow(10, floor(log10(x))), f = x / e;
    if (ceil_it)
        return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * e;
}

/* About `ticks` round ticks that cover [lo, hi] (Heckbert's "nice numbers",
 * Graphics Gems, 1990). */
static axis linear_axis(double lo, double hi, int ticks) {
    axis a = {0};
    if (!(hi > lo)) { /* one value: a little room around it */
        double d = lo == 0 ? 1 : fabs(lo) * 0.1;
        lo -= d;
        hi += d;
    }
    a.step = round_number(round_number(hi - lo, 1) / (ticks - 1), 0);
    a.lo = floor(lo / a.step) * a.step;
    a.hi = ceil(hi / a.step) * a.step;
    return a;
}

static axis log_axis(double lo, double hi) {
    axis a = {0};
    a.log = 1;
    a.lo = pow(10, floor(log10(lo)));
    a.hi = pow(10, ceil(log10(hi)));
    return a;
}

/* Where v falls along an axis of `len` pixels, 0 at lo. */
static double axis_pos(const axis *a, double v, double len) {
    if (a->log)
        return (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo)) * len;
    return (v - a->lo) / (a->hi - a->lo) * len;
}

/* The ticks' values; returns how many (at most max). */
static int axis_ticks(const axis *a, double *v, int max) {
    int n = 0;
    if (a->log) {
        for (double d = log10(a->lo); d <= log10(a->hi) + 1e-9 && n < max; d++)
            v[n++] = pow(10, d);
        return n;
    }
    for (int i = 0; n < max; i++) {
        double t = a->lo + i * a->step;
        if (t > a->hi + a->step * 1e-6)
            break;
        /* lo + i * step misses 0 by a rounding error: "-0" and "1e-17" */
        v[n++] = fabs(t) < a->step * 1e-6 ? 0 : t;
    }
    return n;
}

/* A tick's label with as many decimals as the step needs and no more. */
static void tick_label(const axis *a, double v, char *buf, size_t n) {
    int decimals = 0;
    if (!a->log && a->step < 1)
        decimals = (int)ceil(-log10(a->step) - 1e-9);
    if (a->log || fabs(v) >= 1e6 || decimals > 6)
        snprintf(buf, n, "%g", v);
    else
        snprintf(buf, n, "%.*f", decimals, v);
}

/* s, with XML's special characters escaped. */
static void put_text(FILE *out, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

/* The y range of a panel's points: [*lo, *hi], and *pos_lo the smallest
 * positive value (for a log axis). Returns the number of points. */
static size_t panel_range(const td_plot_panel *p, double *lo, double *hi, double *pos_lo) {
    size_t n = 0;
    *lo = INFINITY, *hi = -INFINITY, *pos_lo = INFINITY;
    for (int i = 0; i < p->nseries; i++)
        for (size_t j = 0; j < p->series[i].n; j++) {
            double y = p->series[i].y[j];
            *lo = fmin(*lo, y);
            *hi = fmax(*hi, y);
            if (y > 0)
                *pos_lo = fmin(*pos_lo, y);
            n++;
        }
    return n;
}

static axis panel_y_axis(const td_plot_panel *p) {
    double lo, hi, pos_lo;
    axis a = {.lo = 0, .hi = 1, .step = 0.2};
    panel_range(p, &lo, &hi, &pos_lo);
    if (p->unit_range && lo >= 0 && hi <= 1)
        return a;
    if (p->allow_log && lo > 0 && hi / lo > 100)
        return log_axis(lo, hi);
    return linear_axis(lo, hi, 5);
}

/* The points of s to draw: all of them when there are fewer than two per
 * pixel column, else each column's first, lowest, highest and last (in the
 * order they came), which keeps the curve's envelope. Writes indices to
 * keep and returns their count. */
static size_t thin_points(const td_plot_series *s, const axis *x, size_t *keep) {
    size_t n = 0, i = 0;
    if (s->n <= 2 * (size_t)PLOT_W) {
        for (; i < s->n; i++)
            keep[i] = i;
        return s->n;
    }
    while (i < s->n) {
        long col = lround(axis_pos(x, s->x[i], PLOT_W));
        size_t first = i, lo = i, hi = i, last = i;
        while (last + 1 < s->n && lround(axis_pos(x, s->x[last + 1], PLOT_W)) == col) {
            last++;
            lo = s->y[last] < s->y[lo] ? last : lo;
            hi = s->y[last] > s->y[hi] ? last : hi;
        }
        size_t pick[4] = {first, lo < hi ? lo : hi, lo < hi ? hi : lo, last};
        for (int k = 0; k < 4; k++)
            if (n == 0 || keep[n - 1] < pick[k])
                keep[n++] = pick[k];
        i = last + 1;
    }
    return n;
}

/* Gridlines, tick marks and labels of both axes around the plot area at
 * (left, top). */
static void put_axes(FILE *out, const axis *x, const axis *y, int left, int top) {
    double v[64];
    char label[32];
    int n = axis_ticks(y, v, 64);
    for (int i = 0; i < n; i++) {
        double py = top + PLOT_H - axis_pos(y, v[i], PLOT_H);
        tick_label(y, v[i], label, sizeof label);
        fprintf(out,
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>"
                "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#333\"/>"
                "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                left, py, left + PLOT_W, py, left - 5, py, left, py, left - 8, py + 4, label);
    }
    n = axis_ticks(x, v, 64);
    for (int i = 0; i < n; i++) {
        double px = left + axis_pos(x, v[i], PLOT_W);
        tick_label(x, v[i], label, sizeof label);
        fprintf(out,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#e3e3e3\"/>"
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#333\"/>"
                "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                px, top, px, top + PLOT_H, px, top + PLOT_H, px, top + PLOT_H + 5, px,
                top + PLOT_H + 18, label);
    }
    fprintf(out, "<polyline points=\"%d,%d %d,%d %d,%d\" fill=\"none\" stroke=\"#333\"/>\n", left,
            top, left, top + PLOT_H, left + PLOT_W, top + PLOT_H);
}

/* The panel's title, then one entry per series: a stroke of its colour and
 * its name. Widths are guessed at 7 pixels a character. */
static void put_legend(FILE *out, const td_plot_panel *p, int top) {
    int lx = MARGIN_L + 7 * (int)strlen(p->title) + 28, ly = top + 17;
    fprintf(out, "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">", MARGIN_L, ly);
    put_text(out, p->title);
    fputs("</text>\n", out);
    /* A lone series named as its panel needs no legend. */
    if (p->nseries == 1 && !strcmp(p->series[0].name, p->title))
        return;
    for (int i = 0; i < p->nseries; i++) {
        const char *c = palette[i % (sizeof palette / sizeof *palette)];
        fprintf(
            out,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2.5\"/>",
            lx, ly - 4, lx + 18, ly - 4, c);
        if (p->series[i].markers)
            fprintf(out, "<circle cx=\"%d\" cy=\"%d\" r=\"3\" fill=\"%s\"/>", lx + 9, ly - 4, c);
        fprintf(out, "<text x=\"%d\" y=\"%d\">", lx + 23, ly);
        put_text(out, p->series[i].name);
        fputs("</text>\n", out);
        lx += 23 + 7 * (int)strlen(p->series[i].name) + 18;
    }
}

/* One series as a polyline (id "<panel id>-<index>"), circles on its
 * points when it has markers. keep: scratch of s->n indices. */
static void put_series(FILE *out, const td_plot_panel *p, int index, const axis *x, const axis *y,
                       int top, size_t *keep) {
    const td_plot_series *s = &p->series[index];
    const char *c = palette[index % (sizeof palette / sizeof *palette)];
    size_t n = thin_points(s, x, keep);
    fprintf(out,
            "<polyline id=\"%s-%d\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
            "stroke-linejoin=\"round\" points=\"",
            p->id, index, c);
    for (size_t k = 0; k < n; k++)
        fprintf(out, "%s%.1f,%.1f", k ? " " : "", MARGIN_L + axis_pos(x, s->x[keep[k]], PLOT_W),
                top + PLOT_H - axis_pos(y, s->y[keep[k]], PLOT_H));
    fputs("\"/>\n", out);
    for (size_t k = 0; s->markers && k < n; k++)
        fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                MARGIN_L + axis_pos(x, s->x[keep[k]], PLOT_W),
                top + PLOT_H - axis_pos(y, s->y[keep[k]], PLOT_H), c);
}

/* A panel whose header starts at y = top: returns 0, or -1 out of memory. */
static int put_panel(FILE *out, const td_plot_panel *p, const axis *x, int top) {
    axis y = panel_y_axis(p);
    int area = top + HEAD_H;
    size_t most = 0;
    size_t *keep;
    for (int i = 0; i < p->nseries; i++)
        most = p->series[i].n > most ? p->series[i].n : most;
    if (!(keep = malloc((most ? most : 1) * sizeof *keep)))
        return -1;
    put_legend(out, p, top);
    fprintf(out,
            "<rect id=\"%s-area\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"#fff\"/>\n"
            "<clipPath id=\"%s-clip\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\"/>"
            "</clipPath>\n",
            p->id, MARGIN_L, area, PLOT_W, PLOT_H, p->id, MARGIN_L - 3, area - 3, PLOT_W + 6,
            PLOT_H + 6);
    put_axes(out, x, &y, MARGIN_L, area);
    fprintf(out, "<g clip-path=\"url(#%s-clip)\">\n", p->id);
    for (int i = 0; i < p->nseries; i++)
        put_series(out, p, i, x, &y, area, keep);
    fputs("</g>\n", out);
    free(keep);
    return 0;
}

int td_cli_plot_svg(FILE *out, const char *title, const char *xlabel, const td_plot_panel *panels,
                    int npanels) {
    double xlo = INFINITY, xhi = -INFINITY, lo, hi, pos_lo;
    int drawn = 0, top = TITLE_H, height;
    axis x;
    for (int i = 0; i < npanels; i++)
        if (panel_range(&panels[i], &lo, &hi, &pos_lo) > 0) {
            drawn++;
            for (int k = 0; k < panels[i].nseries; k++)
                for (size_t j = 0; j < panels[i].series[k].n; j++) {
                    xlo = fmin(xlo, panels[i].series[k].x[j]);
                    xhi = fmax(xhi, panels[i].series[k].x[j]);
                }
        }
    if (!drawn)
        return 0;
    x = linear_axis(xlo, xhi, 9);
    height = TITLE_H + drawn * PANEL_H + XLABEL_H;
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" "
            "font-size=\"12\" fill=\"#222\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
            "<text x=\"%d\" y=\"26\" font-size=\"16\" font-weight=\"bold\">",
            PAGE_W, height, PAGE_W, height, MARGIN_L);
    put_text(out, title);
    fputs("</text>\n", out);
    for (int i = 0; i < npanels; i++) {
        if (panel_range(&panels[i], &lo, &hi, &pos_lo) == 0)
            continue;
        if (put_panel(out, &panels[i], &x, top) != 0)
            return -1;
        top += PANEL_H;
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", MARGIN_L + PLOT_W / 2, top + 6);
    put_text(out, xlabel);
    fputs("</text>\n</svg>\n", out);
    return drawn;
}

/* The timeline ---------------------------------------------------------------
 *
 * A row per track under one time axis; a span is a box from its start to its
 * end, in its category's colour, inset by 3 pixels a side for each span that
 * holds it, so that a copy inside a forward shows within it. A span narrower
 * than half a pixel is drawn half a pixel wide: it is there. */

enum {
    TL_LEFT = 120, /* room for the tracks' names */
    TL_W = PAGE_W - TL_LEFT - MARGIN_R,
    TL_LEGEND_H = 24,
    TL_ROW_H = 22,
    TL_ROW_GAP = 6,
    TL_INSET = 3,
};

static const struct {
    const char *name, *colour;
} cats[TD_PLOT_CATS] = {
    [TD_PLOT_COMPUTE] = {"compute", "#1f77b4"}, [TD_PLOT_COMM] = {"comm", "#ff7f0e"},
    [TD_PLOT_COPY] = {"copy", "#2ca02c"},       [TD_PLOT_WAIT] = {"wait", "#b0b0b0"},
    [TD_PLOT_IDLE] = {"idle", "#e2e2e2"},       [TD_PLOT_UPDATE] = {"update", "#9467bd"},
    [TD_PLOT_STEP] = {"step", "#c49c94"},       [TD_PLOT_OTHER] = {"other", "#7f7f7f"},
};

td_plot_cat td_cli_plot_cat(const char *name) {
    for (int c = 0; name && c < TD_PLOT_OTHER; c++)
        if (!strcmp(name, cats[c].name))
            return (td_plot_cat)c;
    return TD_PLOT_OTHER;
}

/* A box and a coloured name for each category that occurs. */
static void put_timeline_legend(FILE *out, const int *seen, int top) {
    int lx = TL_LEFT;
    for (int c = 0; c < TD_PLOT_CATS; c++) {
        if (!seen[c])
            continue;
        fprintf(out,
                "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"12\" fill=\"%s\" stroke=\"#666\" "
                "stroke-width=\"0.5\"/><text x=\"%d\" y=\"%d\">%s</text>\n",
                lx, top + 4, cats[c].colour, lx + 19, top + 14, cats[c].name);
        lx += 19 + 7 * (int)strlen(cats[c].name) + 18;
    }
}

/* Row i's boxes (and its band and name) with its top at y = top. */
static void put_row(FILE *out, const td_plot_track *t, int i, const axis *x, int top) {
    /* A hairline of white parts boxes that touch (one step after another). */
    fprintf(out, "<g id=\"row-%d\" stroke=\"#fff\" stroke-width=\"0.4\"><title>", i);
    put_text(out, t->name);
    fprintf(out,
            "</title>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" "
            "stroke=\"none\"/><text x=\"%d\" y=\"%d\" text-anchor=\"end\" stroke=\"none\">",
            TL_LEFT, top, TL_W, TL_ROW_H, i % 2 ? "#f4f4f4" : "#fafafa", TL_LEFT - 8,
            top + TL_ROW_H / 2 + 4);
    put_text(out, t->name);
    fputs("</text>\n", out);
    for (size_t k = 0; k < t->n; k++) {
        const td_plot_span *s = &t->spans[k];
        double x0 = TL_LEFT + axis_pos(x, s->t0, TL_W),
               w = axis_pos(x, s->t1, TL_W) - axis_pos(x, s->t0, TL_W);
        int inset = s->depth * TL_INSET < TL_ROW_H / 2 - 2 ? s->depth * TL_INSET : TL_ROW_H / 2 - 2;
        fprintf(out, "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\"><title>",
                x0, top + inset, w > 0.5 ? w : 0.5, TL_ROW_H - 2 * inset, cats[s->cat].colour);
        put_text(out, s->name ? s->name : "");
        fprintf(out, ": %.3f ms</title></rect>\n", s->t1 - s->t0);
    }
    fputs("</g>\n", out);
}

long td_cli_plot_timeline_svg(FILE *out, const char *title, const td_plot_track *tracks,
                              int ntracks) {
    int seen[TD_PLOT_CATS] = {0}, top, height, plot_h = ntracks * (TL_ROW_H + TL_ROW_GAP);
    double end = 0, v[64];
    char label[32];
    long spans = 0;
    axis x;
    for (int i = 0; i < ntracks; i++)
        for (size_t k = 0; k < tracks[i].n; k++) {
            seen[tracks[i].spans[k].cat] = 1;
            end = fmax(end, tracks[i].spans[k].t1);
            spans++;
        }
    if (spans == 0)
        return 0;
    x = linear_axis(0, end, 9);
    top = TITLE_H + TL_LEGEND_H;
    height = top + plot_h + FOOT_H + XLABEL_H;
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" "
            "font-size=\"12\" fill=\"#222\">\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n"
            "<text x=\"%d\" y=\"26\" font-size=\"16\" font-weight=\"bold\">",
            PAGE_W, height, PAGE_W, height, TL_LEFT);
    put_text(out, title);
    fputs("</text>\n", out);
    put_timeline_legend(out, seen, TITLE_H);
    for (int i = 0; i < ntracks; i++)
        put_row(out, &tracks[i], i, &x, top + i * (TL_ROW_H + TL_ROW_GAP));
    /* The time axis: gridlines over the rows, ticks and labels under them. */
    for (int i = 0, n = axis_ticks(&x, v, 64); i < n; i++) {
        double px = TL_LEFT + axis_pos(&x, v[i], TL_W);
        tick_label(&x, v[i], label, sizeof label);
        fprintf(out,
                "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#999\" "
                "stroke-opacity=\"0.35\"/><line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
                "stroke=\"#333\"/><text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                px, top, px, top + plot_h, px, top + plot_h, px, top + plot_h + 5, px,
                top + plot_h + 18, label);
    }
    fprintf(out,
            "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/>\n"
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">time (ms)</text>\n</svg>\n",
            TL_LEFT, top + plot_h, TL_LEFT + TL_W, top + plot_h, TL_LEFT + TL_W / 2,
            top + plot_h + FOOT_H + 6);
    return spans;
}
