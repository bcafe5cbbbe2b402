/* Data sets in host memory: images with labels (IDX), byte-level text, and
 * arrays read from users' files (data-impl.h). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"
#include "train/data-impl.h"
#include "train/train-impl.h"

/* MNIST's training-set pixel mean and standard deviation (of p / 255). */
#define TD_MNIST_MEAN 0.1307
#define TD_MNIST_STD  0.3081

/* The key of the shuffle that picks a held-out part (td__dataset_split):
 * fixed, so that a file splits the same way whatever the run's seed. */
#define TD_SPLIT_KEY    0x5370646174617365ull /* "Spdatase" */
#define TD_SPLIT_DOMAIN 0x53706c74u           /* "Splt" */

/* A text file larger than this is refused (Tiny Shakespeare is 1.1 MB). */
#define TD_TEXT_MAX_BYTES ((size_t)1 << 31)

struct td_dataset {
    td_dataset_info info;
    char source[1024];
    /* Images: (size, features) pixels and (size) labels. */
    uint8_t *pixels;
    uint8_t *labels;
    float lut[256]; /* pixel value -> normalised float */
    /* Text: bytes [0, len), windows of T starting every `stride` bytes. */
    uint8_t *text;
    size_t len;
    int64_t stride;
    int32_t token_of[256];
    uint8_t vocab[256];
    size_t vocab_len; /* 0 for TD_TEXT_BYTES */
    /* A token stream (td__dataset_tokens): windows of T starting every
     * `stride` tokens of stream[0, len). */
    int32_t *stream;
    /* Arrays (td__dataset_adopt): (size, features) floats or (size, T)
     * tokens, and (size, labels_per_sample) labels. */
    float *ax;
    int32_t *atokens;
    int32_t *alabels;
};

void td_dataset_destroy(td_dataset *ds) {
    if (!ds)
        return;
    free(ds->pixels);
    free(ds->labels);
    free(ds->text);
    free(ds->stream);
    free(ds->ax);
    free(ds->atokens);
    free(ds->alabels);
    free(ds);
}

void td_dataset_get_info(const td_dataset *ds, td_dataset_info *out) {
    if (ds)
        *out = ds->info;
    else
        memset(out, 0, sizeof *out);
}

const char *td_dataset_source(const td_dataset *ds) {
    return ds ? ds->source : "";
}

const uint8_t *td_dataset_vocab(const td_dataset *ds, size_t *len) {
    if (len)
        *len = ds ? ds->vocab_len : 0;
    return ds && ds->vocab_len ? ds->vocab : NULL;
}

/* td_dataset_get() of an array data set: copies of its rows. */
static td_status array_get(const td_dataset *ds, int64_t index, float *x, int32_t *tokens,
                           int32_t *labels) {
    size_t f = (size_t)ds->info.features, lp = (size_t)ds->info.labels_per_sample;
    if (ds->ax && !x)
        return td__error(TD_ERR_INVALID_ARG, "td_dataset_get: %s holds features; x is NULL",
                         ds->source);
    if (ds->atokens && !tokens)
        return td__error(TD_ERR_INVALID_ARG, "td_dataset_get: %s holds tokens; tokens is NULL",
                         ds->source);
    if (ds->ax)
        memcpy(x, ds->ax + (size_t)index * f, f * sizeof *x);
    else
        memcpy(tokens, ds->atokens + (size_t)index * f, f * sizeof *tokens);
    memcpy(labels, ds->alabels + (size_t)index * lp, lp * sizeof *labels);
    return TD_OK;
}

td_status td_dataset_get(const td_dataset *ds, int64_t index, float *x, int32_t *tokens,
                         int32_t *labels) {
    if (!ds || !labels)
        return td__error(TD_ERR_INVALID_ARG, "td_dataset_get: data set or labels is NULL");
    if (index < 0 || index >= ds->info.size)
        return td__error(TD_ERR_INVALID_ARG, "%s: sample %lld out of range [0, %lld)", ds->source,
                         (long long)index, (long long)ds->info.size);
    if (ds->alabels)
        return array_get(ds, index, x, tokens, labels);
    if (ds->info.kind == TD_INPUT_FEATURES) {
        const uint8_t *p = ds->pixels + (size_t)index * (size_t)ds->info.features;
        if (!x)
            return td__error(TD_ERR_INVALID_ARG, "td_dataset_get: %s holds images; x is NULL",
                             ds->source);
        for (int64_t i = 0; i < ds->info.features; i++)
            x[i] = ds->lut[p[i]];
        labels[0] = ds->labels[index];
        return TD_OK;
    }
    if (!tokens)
        return td__error(TD_ERR_INVALID_ARG, "td_dataset_get: %s holds text; tokens is NULL",
                         ds->source);
    if (ds->stream) {
        const int32_t *s = ds->stream + (size_t)index * (size_t)ds->stride;
        memcpy(tokens, s, (size_t)ds->info.shape[0] * sizeof *tokens);
        memcpy(labels, s + 1, (size_t)ds->info.shape[0] * sizeof *labels);
        return TD_OK;
    }
    const uint8_t *t = ds->text + (size_t)index * (size_t)ds->stride;
    for (int64_t i = 0; i < ds->info.shape[0]; i++) {
        tokens[i] = ds->token_of[t[i]];
        labels[i] = ds->token_of[t[i + 1]];
    }
    return TD_OK;
}

/* Pixel p becomes (p / 255 - mean) / std. */
static void set_lut(td_dataset *ds, double mean, double std) {
    for (int v = 0; v < 256; v++)
        ds->lut[v] = (float)(((double)v / 255.0 - mean) / std);
}

static td_status dataset_alloc(const char *source, td_dataset **out) {
    td_dataset *ds = td__calloc(sizeof *ds, "a data set");
    *out = ds;
    if (!ds)
        return TD_ERR_OUT_OF_MEMORY;
    snprintf(ds->source, sizeof ds->source, "%s", source);
    return TD_OK;
}

td_status td_dataset_open_idx(const char *images_path, const char *labels_path, td_dataset **out) {
    td_idx im = {0}, lb = {0};
    td_dataset *ds = NULL;
    td_status st;
    int maxlab = 0;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_dataset_open_idx: out is NULL");
    *out = NULL;
    if (!images_path || !labels_path)
        return td__error(TD_ERR_INVALID_ARG, "td_dataset_open_idx: a path is NULL");
    TD_TRY(td_idx_read(images_path, &im));
    TD_TRY(td_idx_read(labels_path, &lb));
    if (im.ndim < 2) {
        st =
            td__error(TD_ERR_CORRUPT,
                      "%s: an image file needs at least 2 dimensions (items, pixels...); it has %d",
                      images_path, im.ndim);
        goto fail;
    }
    if (lb.ndim != 1) {
        st = td__error(TD_ERR_CORRUPT, "%s: a label file has 1 dimension; it has %d", labels_path,
                       lb.ndim);
        goto fail;
    }
    if (im.dims[0] != lb.dims[0]) {
        st = td__error(TD_ERR_CORRUPT, "%s has %lld images but %s has %lld labels", images_path,
                       (long long)im.dims[0], labels_path, (long long)lb.dims[0]);
        goto fail;
    }
    TD_TRY(dataset_alloc(images_path, &ds));
    ds->info.kind = TD_INPUT_FEATURES;
    ds->info.size = im.dims[0];
    ds->info.features = (int64_t)(im.size / (size_t)im.dims[0]);
    if (im.ndim == 2) {
        ds->info.ndim = 1;
        ds->info.shape[0] = im.dims[1];
    } else if (im.ndim == 3) {
        /* One channel: (1, rows, cols), as a CNN reads it; an MLP sees the same floats. */
        ds->info.ndim = 3;
        ds->info.shape[0] = 1;
        ds->info.shape[1] = im.dims[1];
        ds->info.shape[2] = im.dims[2];
    } else {
        ds->info.ndim = 3;
        for (int d = 0; d < 3; d++)
            ds->info.shape[d] = im.dims[d + 1];
    }
    for (size_t i = 0; i < lb.size; i++)
        if (lb.data[i] > maxlab)
            maxlab = lb.data[i];
    ds->info.num_classes = maxlab + 1;
    ds->info.labels_per_sample = 1;
    set_lut(ds, TD_MNIST_MEAN, TD_MNIST_STD);
    ds->pixels = im.data;
    ds->labels = lb.data;
    *out = ds;
    return TD_OK;
fail:
    td_idx_deinit(&im);
    td_idx_deinit(&lb);
    td_dataset_destroy(ds);
    return st;
}

/* The mean and deviation of p / 255 over the images of ds, each rounded to
 * 4 decimals as MNIST's are quoted: for MNIST the statistic is 0.130660...
 * and 0.308108..., so its folder is normalised exactly as before. */
static void pixel_stats(const td_dataset *ds, double *mean, double *std) {
    size_t n = (size_t)ds->info.size * (size_t)ds->info.features, count[256] = {0};
    double s = 0, s2 = 0, m, var;
    for (size_t i = 0; i < n; i++)
        count[ds->pixels[i]]++;
    for (int v = 0; v < 256; v++) {
        s += (double)count[v] * v / 255.0;
        s2 += (double)count[v] * (v / 255.0) * (v / 255.0);
    }
    m = s / (double)n;
    var = s2 / (double)n - m * m;
    *mean = round(m * 1e4) / 1e4;
    *std = round(sqrt(var > 0 ? var : 0) * 1e4) / 1e4;
    if (*std <= 0) /* every pixel alike: centre only */
        *std = 1;
}

/* dir/stem.gz when it exists, else dir/stem. */
static void find_file(const char *dir, const char *stem, char *buf, size_t n) {
    struct stat sb;
    snprintf(buf, n, "%s/%s.gz", dir, stem);
    if (stat(buf, &sb) == 0)
        return;
    snprintf(buf, n, "%s/%s", dir, stem);
    if (stat(buf, &sb) == 0)
        return;
    snprintf(buf, n, "%s/%s.gz", dir, stem); /* named in the error */
}

td_status td_mnist_open(const char *dir, td_dataset **train, td_dataset **test) {
    char im[PATH_MAX], lb[PATH_MAX];
    td_status st;
    struct stat sb;
    if (!train || !test)
        return td__error(TD_ERR_INVALID_ARG, "td_mnist_open: out is NULL");
    *train = *test = NULL;
    if (!dir)
        return td__error(TD_ERR_INVALID_ARG, "td_mnist_open: dir is NULL");
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return td__error(TD_ERR_IO, "%s: not a folder (MNIST needs a folder of IDX files)", dir);
    find_file(dir, "train-images-idx3-ubyte", im, sizeof im);
    find_file(dir, "train-labels-idx1-ubyte", lb, sizeof lb);
    TD_TRY(td_dataset_open_idx(im, lb, train));
    find_file(dir, "t10k-images-idx3-ubyte", im, sizeof im);
    find_file(dir, "t10k-labels-idx1-ubyte", lb, sizeof lb);
    TD_TRY(td_dataset_open_idx(im, lb, test));
    {
        double mean, std;
        pixel_stats(*train, &mean, &std);
        set_lut(*train, mean, std);
        set_lut(*test, mean, std);
    }
    return TD_OK;
fail:
    td_dataset_destroy(*train);
    *train = NULL;
    return st;
}

static td_status text_part(const char *path, const uint8_t *bytes, size_t len, int64_t T,
                           int is_val, const td_dataset *model, td_dataset **out) {
    td_dataset *ds = NULL;
    td_status st;
    int64_t size = is_val ? (int64_t)((len - 1) / (size_t)T) : (int64_t)(len - (size_t)T);
    if (len < (size_t)T + 1 || size < 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: the %s part has %zu bytes; a window of context %lld needs %lld", path,
                         is_val ? "validation" : "training", len, (long long)T, (long long)T + 1);
    TD_TRY(dataset_alloc(path, &ds));
    if (!(ds->text = malloc(len))) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %zu bytes", path, len);
        goto fail;
    }
    memcpy(ds->text, bytes, len);
    ds->len = len;
    ds->stride = is_val ? T : 1;
    ds->info = model->info;
    ds->info.size = size;
    memcpy(ds->token_of, model->token_of, sizeof ds->token_of);
    memcpy(ds->vocab, model->vocab, sizeof ds->vocab);
    ds->vocab_len = model->vocab_len;
    *out = ds;
    return TD_OK;
fail:
    td_dataset_destroy(ds);
    return st;
}

td_status td_text_open(const char *path, const td_text_options *opt, td_dataset **train,
                       td_dataset **val) {
    td_text_options o = TD_TEXT_OPTIONS_INIT;
    td_dataset proto;
    uint8_t *bytes = NULL;
    size_t len = 0, ntrain;
    td_status st;
    if (!train || !val)
        return td__error(TD_ERR_INVALID_ARG, "td_text_open: out is NULL");
    *train = *val = NULL;
    if (!path)
        return td__error(TD_ERR_INVALID_ARG, "td_text_open: path is NULL");
    if (opt)
        o = *opt;
    if (o.context < 1 || o.context > (1 << 20))
        return td__error(TD_ERR_INVALID_ARG, "%s: context %lld is outside [1, 1048576]", path,
                         (long long)o.context);
    if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0))
        return td__error(TD_ERR_INVALID_ARG, "%s: validation fraction %g is outside (0, 1)", path,
                         o.val_fraction);
    TD_TRY(td__read_file(path, TD_TEXT_MAX_BYTES, &bytes, &len));
    memset(&proto, 0, sizeof proto);
    proto.info.kind = TD_INPUT_TOKENS;
    proto.info.ndim = 1;
    proto.info.shape[0] = o.context;
    proto.info.features = o.context;
    proto.info.labels_per_sample = o.context;
    if (o.vocab == TD_TEXT_CHARS) {
        int seen[256] = {0};
        for (size_t i = 0; i < len; i++)
            seen[bytes[i]] = 1;
        for (int b = 0; b < 256; b++)
            if (seen[b]) {
                proto.token_of[b] = (int32_t)proto.vocab_len;
                proto.vocab[proto.vocab_len++] = (uint8_t)b;
            }
        proto.info.num_classes = (int64_t)proto.vocab_len;
    } else {
        for (int b = 0; b < 256; b++)
            proto.token_of[b] = b;
        proto.info.num_classes = 256;
    }
    ntrain = (size_t)((double)len * (1.0 - o.val_fraction));
    if (ntrain > len)
        ntrain = len;
    TD_TRY(text_part(path, bytes, ntrain, o.context, 0, &proto, train));
    TD_TRY(text_part(path, bytes + ntrain, len - ntrain, o.context, 1, &proto, val));
    free(bytes);
    return TD_OK;
fail:
    free(bytes);
    td_dataset_destroy(*train);
    *train = NULL;
    return st;
}

td_status td__dataset_tokens(const char *source, int32_t *tokens, size_t len, int64_t T, int is_val,
                             td_dataset **out) {
    td_dataset *ds = NULL;
    int64_t size, top = 0;
    td_status st;
    *out = NULL;
    if (len < (size_t)T + 1) {
        free(tokens);
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: the %s part has %zu tokens; a window of context %lld needs %lld",
                         source, is_val ? "validation" : "training", len, (long long)T,
                         (long long)T + 1);
    }
    size = is_val ? (int64_t)((len - 1) / (size_t)T) : (int64_t)(len - (size_t)T);
    if ((st = dataset_alloc(source, &ds)) != TD_OK) {
        free(tokens);
        return st;
    }
    for (size_t i = 0; i < len; i++)
        top = tokens[i] > top ? tokens[i] : top;
    ds->stream = tokens;
    ds->len = len;
    ds->stride = is_val ? T : 1;
    ds->info.kind = TD_INPUT_TOKENS;
    ds->info.size = size;
    ds->info.ndim = 1;
    ds->info.shape[0] = T;
    ds->info.features = T;
    ds->info.labels_per_sample = T;
    ds->info.num_classes = top + 1;
    *out = ds;
    return TD_OK;
}

td_status td__dataset_adopt(const char *source, const td_dataset_info *info, float *x,
                            int32_t *tokens, int32_t *labels, td_dataset **out) {
    td_dataset *ds = NULL;
    td_status st;
    *out = NULL;
    if ((st = dataset_alloc(source, &ds)) != TD_OK) {
        free(x);
        free(tokens);
        free(labels);
        return st;
    }
    ds->info = *info;
    ds->ax = x;
    ds->atokens = tokens;
    ds->alabels = labels;
    *out = ds;
    return TD_OK;
}

/* The samples of ds whose in_test flag is `want`, `size` of them, as a new
 * data set. */
static td_status take_rows(const td_dataset *ds, const uint8_t *in_test, int want, int64_t size,
                           td_dataset **out) {
    td_dataset_info info = ds->info;
    size_t f = (size_t)info.features, lp = (size_t)info.labels_per_sample, k = 0;
    float *x = NULL;
    int32_t *tokens = NULL, *labels = NULL;
    *out = NULL;
    if ((ds->ax && !(x = td__calloc((size_t)size * f * sizeof *x, "a data set's features"))) ||
        (ds->atokens &&
         !(tokens = td__calloc((size_t)size * f * sizeof *tokens, "a data set's tokens"))) ||
        !(labels = td__calloc((size_t)size * lp * sizeof *labels, "a data set's labels"))) {
        free(x);
        free(tokens);
        return TD_ERR_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < ds->info.size; i++) {
        if (in_test[i] != want)
            continue;
        if (x)
            memcpy(x + k * f, ds->ax + (size_t)i * f, f * sizeof *x);
        if (tokens)
            memcpy(tokens + k * f, ds->atokens + (size_t)i * f, f * sizeof *tokens);
        memcpy(labels + k * lp, ds->alabels + (size_t)i * lp, lp * sizeof *labels);
        k++;
    }
    info.size = size;
    return td__dataset_adopt(ds->source, &info, x, tokens, labels, out);
}

td_status td__dataset_split(const td_dataset *ds, double fraction, td_dataset **train,
                            td_dataset **test) {
    int64_t n = ds->info.size, ntest = (int64_t)llround((double)n * fraction);
    int64_t *order = NULL;
    uint8_t *in_test = NULL;
    td_status st;
    *train = *test = NULL;
    if (!ds->alabels)
        return td__error(TD_ERR_INVALID_ARG, "%s: only array data sets split", ds->source);
    if (ntest < 1 || ntest >= n)
        return td__error_setting(TD_ERR_INVALID_ARG, "split",
                                 "%s: holding out %g of %lld samples leaves %s empty (`split`)",
                                 ds->source, fraction, (long long)n,
                                 ntest < 1 ? "the test part" : "the training part");
    if (!(order = td__calloc((size_t)n * sizeof *order, "a split's order")) ||
        !(in_test = td__calloc((size_t)n, "a split's flags"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (int64_t i = 0; i < n; i++)
        order[i] = i;
    /* The first ntest places of a Fisher-Yates shuffle: place i takes a
     * sample uniform among those not yet taken. */
    for (int64_t i = 0; i < ntest; i++) {
        uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), 0, TD_SPLIT_DOMAIN}, r[4];
        uint64_t u = 0, span = (uint64_t)(n - i), j;
        td_philox(ctr, TD_SPLIT_KEY, r);
        u = (uint64_t)r[0] << 32 | r[1];
        j = (uint64_t)i + (uint64_t)(((unsigned __int128)u * span) >> 64);
        int64_t t = order[i];
        order[i] = order[j];
        order[j] = t;
        in_test[order[i]] = 1;
    }
    TD_TRY(take_rows(ds, in_test, 0, n - ntest, train));
    TD_TRY(take_rows(ds, in_test, 1, ntest, test));
    free(order);
    free(in_test);
    return TD_OK;
fail:
    free(order);
    free(in_test);
    td_dataset_destroy(*train);
    *train = NULL;
    return st;
}
