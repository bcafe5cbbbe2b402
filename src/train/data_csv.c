/* CSV tables of numbers, read strictly (a subset of RFC 4180).
 *
 * The first record names the columns; every other record holds as many
 * cells, each a number (C's strtod syntax, so "1", "-2.5e3"), one of them in
 * the label column a whole number. Cells are separated by commas, records by
 * LF or CRLF; a cell may be double-quoted, with "" for a quote inside, and
 * then may hold commas and line breaks. Spaces around an unquoted cell are
 * dropped. Blank lines at the end are ignored, elsewhere refused. Anything
 * else (a ragged record, a stray quote, a cell that is not a number or holds
 * a NUL byte, a NaN or infinite feature) is an error naming the line and the column, since a
 * table read wrongly trains without complaint on nonsense. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "train/data-impl.h"
#include "train/train-impl.h"

/* A CSV file larger than this is refused before reading. */
#define TD_CSV_MAX_BYTES ((size_t)1 << 31)

typedef struct csv_reader {
    const char *p, *end;
    const char *name; /* the file, for messages */
    int64_t line;     /* the line p is on, from 1 */
    int64_t rec_line; /* the line the current record began on */
    char *cell;       /* the field just read, unquoted, NUL-terminated */
    size_t len, cap;  /* its length and the buffer's */
    char **names;     /* the header's column names (ncols) */
    int ncols, label; /* columns, and the label's index */
    const char *label_name;
} csv_reader;

static td_status grow_cell(csv_reader *r) {
    size_t cap = r->cap ? r->cap * 2 : 64;
    char *cell = realloc(r->cell, cap);
    if (!cell)
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for a cell of %zu bytes", r->name,
                         cap);
    r->cell = cell;
    r->cap = cap;
    return TD_OK;
}

static td_status append(csv_reader *r, char c) {
    if (r->len + 1 >= r->cap)
        TD_CHECK(grow_cell(r));
    r->cell[r->len++] = c;
    return TD_OK;
}

/* The column's number (from 1) and name for a message about cell col. */
static td_status cell_error(const csv_reader *r, int col, const char *what) {
    if (col < r->ncols)
        return td__error(TD_ERR_INVALID_ARG, "%s: line %lld, column %d (\"%s\"): %s", r->name,
                         (long long)r->rec_line, col + 1, r->names[col], what);
    return td__error(TD_ERR_INVALID_ARG, "%s: line %lld, column %d: %s", r->name,
                     (long long)r->rec_line, col + 1, what);
}

/* A line end at p: LF, or CR LF. */
static int at_line_end(const csv_reader *r, const char *p) {
    return p < r->end && (*p == '\n' || (*p == '\r' && p + 1 < r->end && p[1] == '\n'));
}

/* Moves past the separator after a field: *last when it ended a record. */
static td_status end_field(csv_reader *r, int col, int *last) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t'))
        r->p++;
    if (r->p < r->end && *r->p == '\r' && r->p + 1 == r->end)
        r->p++; /* a CR ending the file ends its last line */
    *last = 1;
    if (r->p >= r->end)
        return TD_OK;
    if (at_line_end(r, r->p)) {
        r->p += *r->p == '\r' ? 2 : 1;
        r->line++;
        return TD_OK;
    }
    if (*r->p == ',') {
        r->p++;
        *last = 0;
        return TD_OK;
    }
    return cell_error(r, col,
                      "text after the closing quote (a quote inside a quoted cell is "
                      "written \"\")");
}

static td_status read_quoted(csv_reader *r, int col) {
    int64_t from = r->line;
    r->p++;
    for (;;) {
        if (r->p >= r->end)
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: line %lld, column %d: a quoted cell never closes", r->name,
                             (long long)from, col + 1);
        if (*r->p == '"') {
            if (r->p + 1 < r->end && r->p[1] == '"') {
                TD_CHECK(append(r, '"'));
                r->p += 2;
                continue;
            }
            r->p++;
            return TD_OK;
        }
        if (*r->p == '\n')
            r->line++;
        TD_CHECK(append(r, *r->p++));
    }
}

static td_status read_unquoted(csv_reader *r, int col) {
    while (r->p < r->end && *r->p != ',' && !at_line_end(r, r->p)) {
        if (*r->p == '"')
            return cell_error(r, col, "a quote inside an unquoted cell (quote the whole cell)");
        TD_CHECK(append(r, *r->p++));
    }
    while (r->len > 0 && (r->cell[r->len - 1] == ' ' || r->cell[r->len - 1] == '\t' ||
                          (r->cell[r->len - 1] == '\r' && r->p >= r->end)))
        r->len--;
    return TD_OK;
}

/* Reads field col of the current record into r->cell; *last says whether it
 * ended the record. */
static td_status read_field(csv_reader *r, int col, int *last) {
    r->len = 0;
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t'))
        r->p++;
    if (r->p < r->end && *r->p == '"')
        TD_CHECK(read_quoted(r, col));
    else
        TD_CHECK(read_unquoted(r, col));
    if (r->len + 1 >= r->cap)
        TD_CHECK(grow_cell(r));
    r->cell[r->len] = '\0';
    /* The cell is parsed as a C string: a NUL inside would end it early, so
     * "2\0abc" would read as 2 and the rest be lost without a word. */
    if (memchr(r->cell, '\0', r->len))
        return cell_error(r, col, "a NUL byte inside the cell (is this a text file?)");
    return end_field(r, col, last);
}

/* At a record's start: 1 when only blank lines remain (the table's end). A
 * blank line before more records is an error. */
static td_status at_end(csv_reader *r, int *done) {
    const char *q = r->p;
    *done = 0;
    r->rec_line = r->line;
    if (r->p < r->end && !at_line_end(r, r->p))
        return TD_OK;
    while (q < r->end && (*q == '\n' || *q == '\r' || *q == ' ' || *q == '\t'))
        q++;
    if (q == r->end) {
        *done = 1;
        return TD_OK;
    }
    return td__error(TD_ERR_INVALID_ARG, "%s: line %lld is empty (blank lines only at the end)",
                     r->name, (long long)r->line);
}

static td_status read_header(csv_reader *r) {
    int last = 0, done;
    TD_CHECK(at_end(r, &done));
    if (done)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: empty; a CSV table starts with a header naming its columns", r->name);
    r->label = -1;
    while (!last) {
        char **names;
        TD_CHECK(read_field(r, r->ncols, &last));
        if (!(names = realloc(r->names, (size_t)(r->ncols + 1) * sizeof *names)))
            return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the header", r->name);
        r->names = names;
        if (!(r->names[r->ncols] = td__strdup(r->cell)))
            return TD_ERR_OUT_OF_MEMORY;
        r->ncols++;
        if (!strcmp(r->cell, r->label_name)) {
            if (r->label >= 0)
                return td__error(TD_ERR_INVALID_ARG,
                                 "%s: line 1: columns %d and %d are both named \"%s\"", r->name,
                                 r->label + 1, r->ncols, r->label_name);
            r->label = r->ncols - 1;
        }
    }
    if (r->label < 0)
        return td__error_setting(TD_ERR_INVALID_ARG, "label_column",
                                 "%s: line 1: no column named \"%s\" holds the labels (name it "
                                 "with `label_column`; the header has %d columns, the first "
                                 "\"%s\")",
                                 r->name, r->label_name, r->ncols, r->names[0]);
    if (r->ncols < 2)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: line 1: only the label column; a table needs features too", r->name);
    return TD_OK;
}

/* The cell just read as a feature: a finite number that a float holds. */
static td_status parse_feature(const csv_reader *r, int col, float *out) {
    char *end, what[160];
    double v;
    if (!r->cell[0])
        return cell_error(r, col, "an empty cell; every feature needs a number");
    v = strtod(r->cell, &end);
    if (end == r->cell || *end) {
        snprintf(what, sizeof what, "'%.60s' is not a number", r->cell);
        return cell_error(r, col, what);
    }
    *out = (float)v;
    if (isfinite(*out))
        return TD_OK;
    snprintf(what, sizeof what,
             isfinite(v) ? "%.60s is beyond float32's range"
                         : "'%.60s' is not finite; tandem refuses NaN and infinite features",
             r->cell);
    return cell_error(r, col, what);
}

/* The cell just read as a label: a whole number in [0, classes). */
static td_status parse_label(const csv_reader *r, int col, int64_t classes, int32_t *out) {
    char *end, what[160];
    double v, limit = classes > 0 ? (double)classes : 2147483647.0;
    if (!r->cell[0])
        return cell_error(r, col, "an empty label");
    v = strtod(r->cell, &end);
    if (end == r->cell || *end || v != floor(v)) {
        snprintf(what, sizeof what, "label '%.60s' is not a whole number", r->cell);
        return cell_error(r, col, what);
    }
    if (v < 0 || v >= limit) {
        snprintf(what, sizeof what, "label %.60s is outside the model's classes [0, %lld)", r->cell,
                 (long long)limit);
        return cell_error(r, col, what);
    }
    *out = (int32_t)v;
    return TD_OK;
}

/* Room for one more row in out. */
static td_status reserve_row(const csv_reader *r, td__csv *out, int64_t *cap) {
    float *x;
    int32_t *labels;
    int64_t n;
    if (out->rows < *cap)
        return TD_OK;
    n = *cap ? *cap * 2 : 256;
    if (!(x = realloc(out->x, (size_t)n * (size_t)out->features * sizeof *x)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %lld rows", r->name,
                         (long long)n);
    out->x = x;
    if (!(labels = realloc(out->labels, (size_t)n * sizeof *labels)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %lld rows", r->name,
                         (long long)n);
    out->labels = labels;
    *cap = n;
    return TD_OK;
}

static td_status read_row(csv_reader *r, int64_t classes, td__csv *out) {
    float *x = out->x + (size_t)out->rows * (size_t)out->features;
    int last = 0, col, f = 0;
    char what[96];
    for (col = 0; !last; col++) {
        if (col == r->ncols) {
            snprintf(what, sizeof what, "more cells than the header's %d columns", r->ncols);
            return cell_error(r, col, what);
        }
        TD_CHECK(read_field(r, col, &last));
        if (col == r->label)
            TD_CHECK(parse_label(r, col, classes, &out->labels[out->rows]));
        else
            TD_CHECK(parse_feature(r, col, &x[f++]));
    }
    if (col < r->ncols)
        return td__error(TD_ERR_INVALID_ARG, "%s: line %lld has %d cells; the header has %d",
                         r->name, (long long)r->rec_line, col, r->ncols);
    out->rows++;
    return TD_OK;
}

static void reader_deinit(csv_reader *r) {
    for (int i = 0; i < r->ncols; i++)
        free(r->names[i]);
    free(r->names);
    free(r->cell);
}

void td__csv_deinit(td__csv *csv) {
    if (!csv)
        return;
    free(csv->x);
    free(csv->labels);
    memset(csv, 0, sizeof *csv);
}

td_status td__csv_parse(const char *text, size_t n, const char *name, const char *label_column,
                        int64_t classes, td__csv *out) {
    csv_reader r;
    int64_t cap = 0;
    int done = 0;
    td_status st;
    memset(out, 0, sizeof *out);
    memset(&r, 0, sizeof r);
    r.p = text;
    r.end = text + n;
    r.name = name ? name : "<memory>";
    r.label_name = label_column ? label_column : "label";
    r.line = 1;
    if (n >= 3 && !memcmp(text, "\xEF\xBB\xBF", 3))
        r.p += 3; /* the byte order mark spreadsheets write */
    TD_TRY(read_header(&r));
    out->features = r.ncols - 1;
    for (;;) {
        TD_TRY(at_end(&r, &done));
        if (done)
            break;
        TD_TRY(reserve_row(&r, out, &cap));
        TD_TRY(read_row(&r, classes, out));
    }
    if (out->rows == 0) {
        st = td__error(TD_ERR_INVALID_ARG, "%s: a header but no rows of data", r.name);
        goto fail;
    }
    reader_deinit(&r);
    return TD_OK;
fail:
    reader_deinit(&r);
    td__csv_deinit(out);
    return st;
}

td_status td__csv_open(const char *path, const char *label_column, const td_model_info *mi,
                       td_dataset **out) {
    uint8_t *bytes = NULL;
    size_t n = 0;
    td__csv csv;
    td_dataset_info info;
    td_status st;
    *out = NULL;
    TD_CHECK(td__read_file(path, TD_CSV_MAX_BYTES, &bytes, &n));
    st = td__csv_parse((const char *)bytes, n, path, label_column, mi->classes, &csv);
    free(bytes);
    if (st != TD_OK)
        return st;
    memset(&info, 0, sizeof info);
    info.kind = TD_INPUT_FEATURES;
    info.size = csv.rows;
    info.ndim = 1;
    info.shape[0] = csv.features;
    info.features = csv.features;
    info.labels_per_sample = 1;
    for (int64_t i = 0; i < csv.rows; i++)
        if (csv.labels[i] + 1 > info.num_classes)
            info.num_classes = csv.labels[i] + 1;
    return td__dataset_adopt(path, &info, csv.x, NULL, csv.labels, out);
}
