/* Which reader a data path goes to, and the checks every format shares:
 * the held-out part, and the samples against the model's input and classes.
 * The choice is by what the path is (a folder) or how it is spelled (its
 * extension, or two .npy paths joined by a comma), never by guessing from
 * the bytes, so that a file in the wrong format gets that format's precise
 * complaint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/text.h"
#include "tandem/import.h"
#include "train/data-impl.h"
#include "train/train-impl.h"

#define TD_DEFAULT_SPLIT 0.1

typedef enum data_format {
    DATA_IDX_FOLDER,
    DATA_CSV,
    DATA_TENSORS,
    DATA_NPY_PAIR,
    DATA_NPY_ALONE, /* one .npy: an error that says how to name the pair */
    DATA_LLMC,      /* llm.c's token file (.bin) */
    DATA_OTHER,     /* text for a token model */
} data_format;

static int ends_with(const char *s, size_t len, const char *suffix) {
    size_t n = strlen(suffix);
    return len >= n && !strncasecmp(s + len - n, suffix, n);
}

/* What path names; for a pair, *comma is where the second path starts. */
static data_format format_of(const char *path, const char **comma) {
    struct stat sb;
    const char *c = strchr(path, ',');
    size_t len = strlen(path);
    *comma = NULL;
    if (c && !strchr(c + 1, ',') && ends_with(path, (size_t)(c - path), ".npy") &&
        ends_with(c + 1, strlen(c + 1), ".npy")) {
        *comma = c + 1;
        return DATA_NPY_PAIR;
    }
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return DATA_IDX_FOLDER;
    if (ends_with(path, len, ".csv"))
        return DATA_CSV;
    if (ends_with(path, len, ".safetensors"))
        return DATA_TENSORS;
    if (ends_with(path, len, ".npy"))
        return DATA_NPY_ALONE;
    if (ends_with(path, len, ".bin"))
        return DATA_LLMC;
    return DATA_OTHER;
}

/* One file of the array formats (CSV, safetensors, a .npy pair), given as
 * `setting` ("data_path" or "test_path"). */
static td_status open_arrays(const char *path, const char *setting, const td_data_options *o,
                             const td_model_info *mi, td_dataset **out) {
    const char *second;
    char x_path[4096];
    *out = NULL;
    switch (format_of(path, &second)) {
    case DATA_CSV:
        if (mi->kind == TD_INPUT_TOKENS)
            return td__error_setting(TD_ERR_INVALID_ARG, setting,
                                     "%s: a CSV table holds features; the model reads tokens "
                                     "(give a .safetensors or X.npy,Y.npy of token ids, or a text "
                                     "file) (`%s`)",
                                     path, setting);
        return td__csv_open(path, o->label_column, mi, out);
    case DATA_TENSORS: return td__tensors_open(path, mi, out);
    case DATA_NPY_PAIR:
        snprintf(x_path, sizeof x_path, "%.*s", (int)(second - 1 - path), path);
        return td__npy_open(x_path, second, mi, out);
    case DATA_NPY_ALONE:
        return td__error_setting(TD_ERR_INVALID_ARG, setting,
                                 "%s: a .npy file holds one array; give the features and the "
                                 "labels as `%s` X.npy,Y.npy",
                                 path, setting);
    default:
        return td__error_setting(
            TD_ERR_INVALID_ARG, setting,
            "%s: not a folder of MNIST IDX files, a .csv, a .safetensors, X.npy,Y.npy or an "
            "llm.c token file (.bin) (`%s`)",
            path, setting);
    }
}

/* "(1, 28, 28) (784 values)". */
static const char *shape_str(char *buf, size_t size, int ndim, const int64_t *shape,
                             int64_t values) {
    char s[64];
    snprintf(buf, size, "%s (%lld values)", td__shape_text(shape, ndim, s), (long long)values);
    return buf;
}

/* ds's samples against what the model reads. */
static td_status check_fits(const td_dataset *ds, const char *path, const td_model_info *mi) {
    td_dataset_info di;
    int64_t numel = 1;
    char a[128], b[128];
    td_dataset_get_info(ds, &di);
    for (int d = 0; d < mi->in_ndim; d++)
        numel *= mi->in_shape[d];
    if (di.features != numel)
        return td__error(TD_ERR_SHAPE, "%s: samples have shape %s; the model reads %s", path,
                         shape_str(a, sizeof a, di.ndim, di.shape, di.features),
                         shape_str(b, sizeof b, mi->in_ndim, mi->in_shape, numel));
    if (di.num_classes > mi->classes)
        return td__error(TD_ERR_SHAPE,
                         "%s: %lld classes (or tokens) in the data; the model outputs %lld", path,
                         (long long)di.num_classes, (long long)mi->classes);
    return TD_OK;
}

/* A folder of IDX files or a text file: formats that bring their own
 * held-out part. */
static td_status open_own_split(const char *path, data_format f, const td_data_options *o,
                                const td_model_info *mi, td_dataset **train, td_dataset **test) {
    if (o->test_path)
        return td__error_setting(TD_ERR_INVALID_ARG, "test_path",
                                 "%s: `test_path` goes with .csv, .safetensors and .npy data; %s",
                                 path,
                                 f == DATA_IDX_FOLDER ? "an IDX folder has its own t10k test files"
                                                      : "a text file holds out its end");
    if (f == DATA_IDX_FOLDER) {
        if (mi->kind == TD_INPUT_TOKENS)
            return td__error_setting(TD_ERR_INVALID_ARG, "data_path",
                                     "%s: a folder; the model reads tokens, so `data_path` must "
                                     "be a text file, a .safetensors or X.npy,Y.npy",
                                     path);
        if (o->split > 0)
            return td__error_setting(TD_ERR_INVALID_ARG, "split",
                                     "%s: `split` holds out part of one file; an IDX folder has "
                                     "its own t10k test files",
                                     path);
        return td_mnist_open(path, train, test);
    }
    {
        td_text_options t = TD_TEXT_OPTIONS_INIT;
        t.context = mi->in_shape[0];
        t.vocab = mi->classes >= 256 ? TD_TEXT_BYTES : TD_TEXT_CHARS;
        if (o->split > 0)
            t.val_fraction = o->split;
        return td_text_open(path, &t, train, test);
    }
}

/* Whether the start of path reads as text: no control byte but tab, LF, CR
 * and form feed in its first 4 KiB (UTF-8's bytes above 0x7F pass). An llm.c
 * token file's magic alone (C8 A5 34 01) fails this. */
static int looks_like_text(const char *path) {
    unsigned char head[4096];
    size_t n;
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    n = fread(head, 1, sizeof head, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (head[i] < 0x20 && head[i] != '\t' && head[i] != '\n' && head[i] != '\r' &&
            head[i] != '\f')
            return 0;
    return n > 0;
}

/* td_import_llmc_tokens(path) failed with st. The format is chosen by the
 * name alone, so a text corpus named .bin fails as a broken token file:
 * when it reads as text, the message says how to train on it as text. */
static td_status llmc_failed(const char *path, td_status st) {
    char msg[1024];
    size_t base = strlen(path) - 4; /* without ".bin" */
    if (st != TD_ERR_CORRUPT || !looks_like_text(path))
        return st;
    snprintf(msg, sizeof msg, "%s", td_last_error());
    return td__error(st,
                     "%s; it looks like text, and tandem reads any .bin as llm.c tokens: rename "
                     "it (to %.*s.txt, say) to train on it as a text corpus",
                     msg, (int)base, path);
}

/* llm.c's token files (GPT-2 tokens as its dev/data scripts write them):
 * data X_train.bin with test data X_val.bin, or one file whose end is
 * held out, as a text file's is. */
static td_status open_llmc(const char *path, const td_data_options *o, const td_model_info *mi,
                           td_dataset **train, td_dataset **test) {
    const char *second;
    int32_t *tok = NULL, *held = NULL;
    size_t n = 0, nheld = 0, ntrain;
    int64_t T = mi->in_shape[0];
    td_status st;
    if (mi->kind != TD_INPUT_TOKENS)
        return td__error_setting(TD_ERR_INVALID_ARG, "data_path",
                                 "%s: an llm.c token file holds tokens; the model reads features "
                                 "(`data_path`)",
                                 path);
    if (o->test_path && format_of(o->test_path, &second) != DATA_LLMC)
        return td__error_setting(TD_ERR_INVALID_ARG, "test_path",
                                 "%s: `data_path` is an llm.c token file, so `test_path` must be "
                                 "one too (.bin)",
                                 o->test_path);
    if ((st = td_import_llmc_tokens(path, &tok, &n)) != TD_OK)
        return llmc_failed(path, st);
    if (o->test_path) {
        if ((st = td_import_llmc_tokens(o->test_path, &held, &nheld)) != TD_OK) {
            free(tok);
            return llmc_failed(o->test_path, st);
        }
        ntrain = n;
    } else {
        ntrain = (size_t)((double)n * (1.0 - (o->split > 0 ? o->split : TD_DEFAULT_SPLIT)));
        nheld = n - ntrain;
        if (!(held = malloc((nheld ? nheld : 1) * sizeof *held))) {
            free(tok);
            return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %zu tokens", path, nheld);
        }
        memcpy(held, tok + ntrain, nheld * sizeof *held);
    }
    if ((st = td__dataset_tokens(path, tok, ntrain, T, 0, train)) != TD_OK) {
        free(held);
        return st;
    }
    return td__dataset_tokens(o->test_path ? o->test_path : path, held, nheld, T, 1, test);
}

td_status td_data_open(const char *path, const td_data_options *opt, const td_model_info *mi,
                       td_dataset **train, td_dataset **test) {
    td_data_options o = {0};
    td_dataset *all = NULL;
    const char *second;
    data_format f;
    td_status st;
    struct stat sb;
    if (!train || !test)
        return td__error(TD_ERR_INVALID_ARG, "td_data_open: out is NULL");
    *train = *test = NULL;
    if (!path || !mi)
        return td__error_setting(TD_ERR_INVALID_ARG, "data_path", "no data given (`data_path`)");
    if (opt)
        o = *opt;
    if (o.split < 0 || o.split >= 1)
        return td__error_setting(TD_ERR_INVALID_ARG, "split",
                                 "split %g is outside (0, 1) (`split`)", o.split);
    if (o.test_path && o.split > 0)
        return td__error_setting(TD_ERR_INVALID_ARG, "split",
                                 "`split` and `test_path` both say what to evaluate on; give one");
    f = format_of(path, &second);
    if (f != DATA_NPY_PAIR && stat(path, &sb) != 0)
        return td__error_setting(TD_ERR_IO, "data_path", "%s: no such file or folder (`data_path`)",
                                 path);
    if (f == DATA_LLMC) {
        TD_TRY(open_llmc(path, &o, mi, train, test));
    } else if (f == DATA_IDX_FOLDER || (f == DATA_OTHER && mi->kind == TD_INPUT_TOKENS)) {
        TD_TRY(open_own_split(path, f, &o, mi, train, test));
    } else if (o.test_path) {
        TD_TRY(open_arrays(path, "data_path", &o, mi, train));
        TD_TRY(open_arrays(o.test_path, "test_path", &o, mi, test));
    } else {
        TD_TRY(open_arrays(path, "data_path", &o, mi, &all));
        TD_TRY(check_fits(all, path, mi)); /* the shape first: a split's complaint is moot */
        TD_TRY(td__dataset_split(all, o.split > 0 ? o.split : TD_DEFAULT_SPLIT, train, test));
    }
    TD_TRY(check_fits(*train, path, mi));
    TD_TRY(check_fits(*test, o.test_path ? o.test_path : path, mi));
    td_dataset_destroy(all);
    return TD_OK;
fail:
    td_dataset_destroy(all);
    td_dataset_destroy(*train);
    td_dataset_destroy(*test);
    *train = *test = NULL;
    return st;
}
