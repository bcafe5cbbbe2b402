#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tensor/tensor-impl.h"

const char *td__shape_str(const td_tensor *t, char buf[64]) {
    size_t used = (size_t)snprintf(buf, 64, "(");
    for (int i = 0; i < t->ndim && used < 64; i++)
        used += (size_t)snprintf(buf + used, 64 - used, "%s%lld", i ? ", " : "",
                                 (long long)t->shape[i]);
    if (used < 64)
        snprintf(buf + used, 64 - used, ")");
    return buf;
}

td_status td__tensor_same_shape(const td_tensor *a, const td_tensor *b, const char *what) {
    char sa[64], sb[64];
    int same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++)
        same = a->shape[i] == b->shape[i];
    if (same)
        return TD_OK;
    return td__error(TD_ERR_SHAPE, "%s: shapes %s on %s and %s on %s differ", what,
                     td__shape_str(a, sa), td_device_name(a->dev), td__shape_str(b, sb),
                     td_device_name(b->dev));
}

td_status td__tensor_check_dtype(const td_device *dev, td_dtype dtype) {
    if (!dev || dtype != TD_F64 || td_device_supports_f64(dev))
        return TD_OK;
    return td__error_setting(TD_ERR_UNSUPPORTED, "dtype",
                             "%s has no f64 arithmetic (`dtype` f64): use f32 or another device",
                             td_device_name(dev));
}

td_status td_tensor_create(td_device *dev, td_dtype dtype, int ndim, const int64_t *shape,
                           td_tensor **out) {
    td_tensor *t;
    size_t numel = 1;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_create: out is NULL");
    *out = NULL;
    if (!dev)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_create: device is NULL");
    if (dtype != TD_F32 && dtype != TD_F64)
        return td__error(TD_ERR_DTYPE, "td_tensor_create: unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > TD_MAX_DIMS || (ndim > 0 && !shape))
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_create: %d dimensions (0 to %d allowed)",
                         ndim, TD_MAX_DIMS);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return td__error(TD_ERR_SHAPE, "td_tensor_create: dimension %d is %lld", i,
                             (long long)shape[i]);
        if (shape[i] > 0 && numel > (SIZE_MAX / 8) / (size_t)shape[i])
            return td__error(TD_ERR_OUT_OF_MEMORY, "td_tensor_create: shape too large");
        numel *= (size_t)shape[i];
    }
    TD_CHECK(td__tensor_check_dtype(dev, dtype));
    t = td__calloc(sizeof *t, "a tensor");
    if (!t)
        return TD_ERR_OUT_OF_MEMORY;
    t->dev = dev;
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    if ((st = td_buffer_alloc(dev, numel * td_dtype_size(dtype), &t->buf)) != TD_OK) {
        free(t);
        return st;
    }
    t->data = t->buf->ptr;
    *out = t;
    return TD_OK;
}

void td_tensor_destroy(td_tensor *t) {
    if (!t)
        return;
    td_buffer_free(t->buf);
    free(t);
}

void td__tensor_release(td_tensor *t) {
    if (!t)
        return;
    td_buffer_free(t->buf);
    t->buf = NULL;
    t->data = NULL;
}

td_device *td_tensor_device(const td_tensor *t) {
    return t ? t->dev : NULL;
}
td_dtype td_tensor_dtype(const td_tensor *t) {
    return t ? t->dtype : TD_F32;
}
int td_tensor_ndim(const td_tensor *t) {
    return t ? t->ndim : 0;
}
int64_t td_tensor_dim(const td_tensor *t, int i) {
    return t && i >= 0 && i < t->ndim ? t->shape[i] : 0;
}
size_t td_tensor_numel(const td_tensor *t) {
    return t ? t->numel : 0;
}
td_buffer *td_tensor_buffer(const td_tensor *t, size_t *byte_offset) {
    if (byte_offset)
        *byte_offset = t ? (size_t)((const char *)t->data - (const char *)t->buf->ptr) : 0;
    return t ? t->buf : NULL;
}
size_t td_tensor_nbytes(const td_tensor *t) {
    return t ? t->numel * td_dtype_size(t->dtype) : 0;
}

td_buffer td__tensor_as_buffer(const td_tensor *t) {
    td_buffer b = {t->dev, t->data, t->numel * td_dtype_size(t->dtype)};
    return b;
}

static td_status check_nbytes(const td_tensor *t, size_t nbytes, const char *what) {
    char s[64];
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "%s: tensor is NULL", what);
    if (nbytes != td_tensor_nbytes(t))
        return td__error(TD_ERR_INVALID_ARG, "%s: %zu bytes given for a %s tensor %s of %zu bytes",
                         what, nbytes, td_dtype_name(t->dtype), td__shape_str(t, s),
                         td_tensor_nbytes(t));
    return TD_OK;
}

td_status td_tensor_write(td_tensor *t, const void *host, size_t nbytes) {
    td_status st = check_nbytes(t, nbytes, "td_tensor_write");
    return st ? st : td_buffer_write(t->buf, 0, host, nbytes);
}

td_status td_tensor_read(const td_tensor *t, void *host, size_t nbytes) {
    td_status st = check_nbytes(t, nbytes, "td_tensor_read");
    return st ? st : td_buffer_read(t->buf, 0, host, nbytes);
}

td_status td_tensor_write_f64(td_tensor *t, const double *host, size_t n) {
    td_status st;
    float *tmp;
    if ((st = check_nbytes(t, n * td_dtype_size(t ? t->dtype : TD_F32), "td_tensor_write_f64")))
        return st;
    if (t->dtype == TD_F64)
        return td_buffer_write(t->buf, 0, host, n * sizeof(double));
    if (!(tmp = td__aligned_alloc(n * sizeof *tmp, "converting to f32")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++)
        tmp[i] = (float)host[i];
    st = td_buffer_write(t->buf, 0, tmp, n * sizeof *tmp);
    free(tmp);
    return st;
}

td_status td_tensor_read_f64(const td_tensor *t, double *host, size_t n) {
    td_status st;
    float *tmp;
    if ((st = check_nbytes(t, n * td_dtype_size(t ? t->dtype : TD_F32), "td_tensor_read_f64")))
        return st;
    if (t->dtype == TD_F64)
        return td_buffer_read(t->buf, 0, host, n * sizeof(double));
    if (!(tmp = td__aligned_alloc(n * sizeof *tmp, "converting from f32")))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td_buffer_read(t->buf, 0, tmp, n * sizeof *tmp)) == TD_OK)
        for (size_t i = 0; i < n; i++)
            host[i] = tmp[i];
    free(tmp);
    return st;
}

td_status td_tensor_copy(td_tensor *dst, const td_tensor *src) {
    td_status st;
    if (!dst || !src)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_copy: tensor is NULL");
    if ((st = td__tensor_same_shape(dst, src, "td_tensor_copy")) != TD_OK)
        return st;
    if (dst->dtype != src->dtype)
        return td__error(TD_ERR_DTYPE, "td_tensor_copy: %s to %s; convert explicitly",
                         td_dtype_name(src->dtype), td_dtype_name(dst->dtype));
    return td_buffer_copy(dst->buf, 0, src->buf, 0, td_tensor_nbytes(src));
}

typedef struct init_args {
    td_tensor *t;
    int rng;
    td_rng_kind kind;
    uint64_t seed, offset;
    double a, b;
} init_args;

static td_status init_task(td_device *dev, void *arg) {
    init_args *x = arg;
    const td_kernels *k = td__tensor_kernels(x->t);
    if (x->rng)
        return k->rng(td__device_ctx(dev), x->t->data, x->t->dtype, x->t->numel, x->kind, x->seed,
                      x->offset, x->a, x->b);
    return k->fill(td__device_ctx(dev), x->t->data, x->t->dtype, x->t->numel, x->a);
}

td_status td_tensor_fill(td_tensor *t, double value) {
    init_args x = {t, 0, TD_RNG_UNIFORM, 0, 0, value, 0};
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_fill: tensor is NULL");
    return td_device_run(t->dev, init_task, &x);
}

td_status td_tensor_rand_uniform(td_tensor *t, uint64_t seed, uint64_t offset, double lo,
                                 double hi) {
    init_args x = {t, 1, TD_RNG_UNIFORM, seed, offset, lo, hi};
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_rand_uniform: tensor is NULL");
    return td_device_run(t->dev, init_task, &x);
}

td_status td_tensor_rand_normal(td_tensor *t, uint64_t seed, uint64_t offset, double mean,
                                double stddev) {
    init_args x = {t, 1, TD_RNG_NORMAL, seed, offset, mean, stddev};
    if (!t)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_rand_normal: tensor is NULL");
    return td_device_run(t->dev, init_task, &x);
}

td_status td_tensor_compare(const td_tensor *a, const td_tensor *b, td_compare_result *out) {
    double *ha = NULL, *hb = NULL;
    td_status st;
    if (!a || !b || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_tensor_compare: NULL argument");
    memset(out, 0, sizeof *out);
    TD_TRY(td__tensor_same_shape(a, b, "td_tensor_compare"));
    ha = td__aligned_alloc(a->numel * sizeof *ha, "comparing tensors");
    hb = td__aligned_alloc(b->numel * sizeof *hb, "comparing tensors");
    if (!ha || !hb) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    TD_TRY(td_tensor_read_f64(a, ha, a->numel));
    TD_TRY(td_tensor_read_f64(b, hb, b->numel));
    for (size_t i = 0; i < a->numel; i++) {
        double x = ha[i], y = hb[i];
        double d, m;
        if (!isfinite(x) || !isfinite(y)) {
            /* Equal infinities agree; anything else with a NaN or inf does not. */
            if (!(x == y))
                out->nonfinite++;
            continue;
        }
        d = fabs(x - y);
        m = fmax(fabs(x), fabs(y));
        if (d > out->max_abs) {
            out->max_abs = d;
            out->worst_index = i;
        }
        if (m > 0 && d / m > out->max_rel)
            out->max_rel = d / m;
    }
    st = TD_OK;
fail:
    free(ha);
    free(hb);
    return st;
}
