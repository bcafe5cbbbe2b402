/* Tensor-parallel shards: finding a model's splittable units, building a
 * shard that holds a slice of each, and mapping its parameters to the whole
 * model's.
 *
 * The units are found on a dry build of the whole model: in every layer list
 * (the root, a residual's layers) a linear followed by an elementwise
 * activation, an optional dropout and another linear is a pair, scanned left
 * to right so that a linear ends at most one pair; every SwiGLU MLP is a
 * unit, and every attention layer, split by query heads (a grouped-query
 * shard also holds the key and value heads its query heads read, which
 * other shards may hold too). Layer uids follow the build
 * order, which the JSON alone fixes, so a table indexed by uid (td__split)
 * tells the real build what each layer holds: layers_build*.c shape and
 * initialise the slices from it and the layers (layers*.c) sum their
 * partial results through the model's reduce hook. A slice is initialised
 * from the whole parameter's stream, each contiguous run of it with the
 * counter offset of its place in the whole tensor, so its values are the
 * whole model's bit for bit. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/nn-impl.h"

/* Slices ------------------------------------------------------------------------ */

void td__slice_block(const td_param_slice *s, int b, int64_t *at, int64_t *count) {
    int64_t extent = s->shape[s->dim];
    if (!s->kv_extent) {
        *at = b * (extent / s->blocks) + s->first;
        *count = s->count;
    } else if (b == 0) {
        *at = s->first;
        *count = s->count;
    } else {
        *at = extent - (s->blocks - b) * s->kv_extent + s->kv_first;
        *count = s->kv_count;
    }
}

/* A slice as runs: for o < outer and each block, a run of (the block's
 * count) * inner elements, at its place in the part's row of held * inner
 * and in the whole tensor's row of extent * inner. */
typedef struct runs {
    int64_t outer, extent, inner, held;
} runs;

static runs slice_runs(const td_param_slice *s) {
    runs r = {1, 1, 1, 0};
    int64_t all = 1;
    for (int i = 0; i < s->ndim; i++)
        all *= s->shape[i];
    if (s->dim < 0) {
        r.extent = r.held = all;
        return r;
    }
    for (int i = 0; i < s->dim; i++)
        r.outer *= s->shape[i];
    for (int i = s->dim + 1; i < s->ndim; i++)
        r.inner *= s->shape[i];
    r.extent = s->shape[s->dim];
    for (int b = 0; b < s->blocks; b++) {
        int64_t at, count;
        td__slice_block(s, b, &at, &count);
        r.held += count;
    }
    return r;
}

/* Calls fn for every run: its offsets in the part and the whole tensor, in
 * elements, and its length. */
typedef void (*run_fn)(void *arg, int64_t part, int64_t whole, int64_t n);

static void each_run(const td_param_slice *s, run_fn fn, void *arg) {
    runs r = slice_runs(s);
    if (s->dim < 0) {
        fn(arg, 0, 0, r.held);
        return;
    }
    for (int64_t o = 0; o < r.outer; o++) {
        int64_t part = o * r.held;
        for (int b = 0; b < s->blocks; b++) {
            int64_t at, count;
            td__slice_block(s, b, &at, &count);
            if (count > 0)
                fn(arg, part * r.inner, (o * r.extent + at) * r.inner, count * r.inner);
            part += count;
        }
    }
}

typedef struct copy_args {
    size_t es;
    const char *src;
    char *dst;
    int to_whole;
} copy_args;

static void copy_run(void *arg, int64_t part, int64_t whole, int64_t n) {
    copy_args *c = arg;
    size_t p = (size_t)part * c->es, w = (size_t)whole * c->es, len = (size_t)n * c->es;
    if (c->to_whole)
        memcpy(c->dst + w, c->src + p, len);
    else
        memcpy(c->dst + p, c->src + w, len);
}

void td_param_slice_gather(const td_param_slice *s, size_t elem_size, const void *part,
                           void *whole) {
    copy_args c = {elem_size, part, whole, 1};
    if (s && part && whole)
        each_run(s, copy_run, &c);
}

void td_param_slice_scatter(const td_param_slice *s, size_t elem_size, const void *whole,
                            void *part) {
    copy_args c = {elem_size, whole, part, 0};
    if (s && part && whole)
        each_run(s, copy_run, &c);
}

typedef struct init_args {
    td_tensor *param;
    uint64_t stream;
    int normal;
    double bound;
    td_status st;
} init_args;

/* A run's values: those of its place in the whole tensor's stream. */
static void init_run(void *arg, int64_t part, int64_t whole, int64_t n) {
    init_args *a = arg;
    td_tensor v;
    if (a->st != TD_OK)
        return;
    if ((a->st = td__tensor_view(&v, a->param, (size_t)part, 1, &n)) != TD_OK)
        return;
    a->st = a->normal ? td_tensor_rand_normal(&v, a->stream, (uint64_t)whole, 0.0, a->bound)
                      : td_tensor_rand_uniform(&v, a->stream, (uint64_t)whole, -a->bound, a->bound);
}

td_status td__model_add_param_slice(td_model *m, td_layer *l, const char *name,
                                    const td_param_slice *slice, int normal, double bound,
                                    td_tensor **param) {
    int64_t shape[TD_MAX_DIMS];
    init_args a = {NULL, 0, normal, bound, TD_OK};
    memcpy(shape, slice->shape, sizeof(int64_t) * (size_t)slice->ndim);
    if (slice->dim >= 0)
        shape[slice->dim] = slice_runs(slice).held;
    TD_CHECK(td__model_add_param(m, l, name, slice->ndim, shape, param));
    if (!*param) /* dry */
        return TD_OK;
    m->slices[m->nparams - 1] = *slice;
    /* the whole parameter's stream: its place among the whole model's */
    a.param = *param;
    a.stream = td__nn_mix64(m->seed ^ td__nn_mix64((uint64_t)m->param_serial - 1));
    each_run(slice, init_run, &a);
    return a.st;
}

td_status td__model_add_slice(td_model *m, td_layer *l, const char *name, int ndim,
                              const int64_t *whole, int dim, int blocks, int64_t first,
                              int64_t count, int normal, double bound, td_tensor **param) {
    td_param_slice s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    memcpy(s.shape, whole, sizeof(int64_t) * (size_t)ndim);
    s.dim = -1;
    s.blocks = 1;
    if (dim >= 0) {
        s.dim = dim;
        s.blocks = blocks;
        s.first = first;
        s.count = count;
    }
    return td__model_add_param_slice(m, l, name, &s, normal, bound, param);
}

td_status td__slice_shared_sumsq(const td_model *m, size_t i, double *out) {
    const td_param_slice *sl = &m->slices[i];
    runs r = slice_runs(sl);
    *out = 0;
    if (!m->splits || !sl->kv_shared)
        return TD_OK;
    assert(sl->dim == 0 && sl->blocks == 3);
    for (int b = 1; b < 3; b++) {
        int64_t n = sl->kv_shared * r.inner;
        td_tensor v;
        double part;
        TD_CHECK(td__tensor_view(&v, m->grads[i],
                                 (size_t)((sl->count + (b - 1) * sl->kv_count) * r.inner), 1, &n));
        TD_CHECK(td__op_sumsq(&v, &part));
        *out += part;
    }
    return TD_OK;
}

td_status td__model_reduce(td_model *m, td_tensor *t) {
    td_status st;
    if (!m->reduce)
        return TD_OK;
    /* A slowed device is slow at its compute, not at waiting for the others. */
    td_device_throttle(m->dev, m->stretch_start, 0);
    st = m->reduce(m->reduce_arg, t);
    m->stretch_start = td_clock_ns();
    return st;
}

td_status td__zero(td_tensor *t) {
    return t->numel ? td_tensor_fill(t, 0.0) : TD_OK;
}

/* Finding the units ---------------------------------------------------------------- */

typedef struct finder {
    td__split *splits; /* by uid */
    td_split_info *units;
    int nunits, max_units;
} finder;

static int is_act(const td_layer *l) {
    return l->vt == &td__act_vt;
}

static void add_unit(finder *f, td_split_kind kind, const td_layer *l, int span, int64_t size,
                     int64_t width, size_t weights) {
    if (f->nunits < TD_SHARD_MAX_UNITS) {
        td_split_info *u = &f->units[f->nunits];
        memset(u, 0, sizeof *u);
        u->kind = kind;
        u->size = size;
        u->width = width;
        snprintf(u->layer, sizeof u->layer, "%s", l->path);
        u->weights = weights;
        u->span = span;
        u->group = l->vt == &td__attention_vt ? l->heads / l->kv_heads : 1;
    }
    f->nunits++;
}

static void mark(finder *f, const td_layer *l, td__split_kind kind) {
    f->splits[l->uid].kind = kind;
    f->splits[l->uid].unit = f->nunits;
}

static void find_units(finder *f, const td_layer *l) {
    /* A SwiGLU MLP splits by hidden features: gate and up rows, down columns. */
    if (l->vt == &td__swiglu_vt) {
        mark(f, l, TD__SPLIT_GATED);
        add_unit(f, TD_SPLIT_MLP, l, 1, l->hidden, 1,
                 l->weights - (l->has_bias ? (size_t)l->in_shape[l->in_ndim - 1] : 0));
        return;
    }
    if (l->vt == &td__attention_vt) {
        mark(f, l, TD__SPLIT_HEADS);
        /* qkv weight and bias, the projection's weight: all but its bias */
        add_unit(f, TD_SPLIT_HEADS, l, 1, l->heads, l->in_shape[1] / l->heads,
                 l->weights - (l->proj_bias ? (size_t)l->in_shape[1] : 0));
        return;
    }
    if (l->vt == &td__residual_vt) {
        find_units(f, l->children[0]);
        return;
    }
    if (l->vt != &td__sequential_vt)
        return;
    for (int i = 0; i < l->nchildren; i++) {
        td_layer *a = l->children[i], *second = NULL;
        int mid = 0;
        /* a tied linear's weight is the embedding's, which shards replicate */
        if (a->vt == &td__linear_vt && !a->tied && i + 2 < l->nchildren &&
            is_act(l->children[i + 1])) {
            mid = 1;
            if (l->children[i + 2]->vt == &td__dropout_vt)
                mid = 2;
            if (i + mid + 1 < l->nchildren && l->children[i + mid + 1]->vt == &td__linear_vt &&
                !l->children[i + mid + 1]->tied)
                second = l->children[i + mid + 1];
        }
        if (!second) {
            find_units(f, a);
            continue;
        }
        mark(f, a, TD__SPLIT_OUT);
        for (int k = 1; k <= mid; k++)
            mark(f, l->children[i + k], TD__SPLIT_MID);
        mark(f, second, TD__SPLIT_IN);
        add_unit(f, TD_SPLIT_MLP, a, mid + 2, a->out_features, 1,
                 a->weights + second->weights -
                     (second->has_bias ? (size_t)second->out_features : 0));
        i += mid + 1;
    }
}

/* Describes json's units into *f (splits by uid: f->splits, malloc'ed). */
static td_status find(const char *json, const char *name, finder *f, int *nsplits,
                      td_model_info *info) {
    td_model *m = NULL;
    TD_CHECK(td__model_build(json, name, NULL, TD_F32, 0, 0, -1, 0, NULL, 0, &m));
    if (!(f->splits =
              td__calloc(sizeof *f->splits * (size_t)(m->nlayers_made + 1), "a model's splits"))) {
        td_model_destroy(m);
        return TD_ERR_OUT_OF_MEMORY;
    }
    *nsplits = m->nlayers_made;
    find_units(f, m->root);
    if (info)
        *info = m->info;
    td_model_destroy(m);
    if (f->nunits > TD_SHARD_MAX_UNITS)
        return td__error(TD_ERR_UNSUPPORTED, "%s: %d splittable units; shards take at most %d",
                         name ? name : "<model>", f->nunits, TD_SHARD_MAX_UNITS);
    return TD_OK;
}

td_status td_model_describe_splits(const char *json, const char *name, td_split_info *units,
                                   int max_units, int *count) {
    td_split_info all[TD_SHARD_MAX_UNITS];
    finder f;
    td_status st;
    int nsplits;
    if (!json || !count)
        return td__error(TD_ERR_INVALID_ARG, "td_model_describe_splits: json or count is NULL");
    *count = 0;
    memset(&f, 0, sizeof f);
    f.units = all;
    st = find(json, name, &f, &nsplits, NULL);
    free(f.splits);
    if (st != TD_OK)
        return st;
    for (int i = 0; units && i < f.nunits && i < max_units; i++)
        units[i] = all[i];
    *count = f.nunits;
    return TD_OK;
}

/* Shards ----------------------------------------------------------------------- */

/* Layers [first, end) (end -1: to the last) of the shard `plan` describes,
 * with `slots` activation slots. */
static td_status load_sliced(const char *json, const char *name, td_device *dev, td_dtype dtype,
                             uint64_t seed, int first, int end, int slots,
                             const td_shard_plan *plan, td_model **out) {
    td_split_info units[TD_SHARD_MAX_UNITS];
    td_model_info info;
    finder f;
    td_status st;
    int nsplits = 0;
    if (!name)
        name = "<model>";
    memset(&f, 0, sizeof f);
    f.units = units;
    if ((st = find(json, name, &f, &nsplits, &info)) != TD_OK)
        goto done;
    if (plan->units != f.nunits) {
        st = td__error(TD_ERR_INVALID_ARG,
                       "%s: the shard plan has %d units; the model has %d splittable units", name,
                       plan->units, f.nunits);
        goto done;
    }
    for (int k = 0; k < f.nunits; k++)
        if (plan->first[k] < 0 || plan->count[k] < 0 ||
            plan->first[k] + plan->count[k] > units[k].size) {
            st = td__error(TD_ERR_INVALID_ARG,
                           "%s: shard plan unit %d (%s at %s): [%lld, %lld) is not within its "
                           "%lld %s",
                           name, k, units[k].kind == TD_SPLIT_HEADS ? "attention" : "MLP pair",
                           units[k].layer, (long long)plan->first[k],
                           (long long)(plan->first[k] + plan->count[k]), (long long)units[k].size,
                           units[k].kind == TD_SPLIT_HEADS ? "heads" : "hidden features");
            goto done;
        }
    for (int i = 0; i < nsplits; i++) {
        td__split *s = &f.splits[i];
        if (s->kind == TD__SPLIT_NONE)
            continue;
        s->first = plan->first[s->unit];
        s->count = plan->count[s->unit];
        s->total = units[s->unit].size;
    }
    if ((st = td__model_build(json, name, dev, dtype, seed, first, end, slots, f.splits, nsplits,
                              out)) != TD_OK)
        goto done;
    (*out)->info.num_weights = info.num_weights; /* the whole model's */
done:
    free(f.splits);
    return st;
}

td_status td_model_load_shard(const char *json, const char *name, td_device *dev, td_dtype dtype,
                              uint64_t seed, const td_shard_plan *plan, td_model **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_shard: out is NULL");
    *out = NULL;
    if (!json || !dev || !plan)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_shard: json, device or plan is NULL");
    return load_sliced(json, name, dev, dtype, seed, 0, -1, 1, plan, out);
}

td_status td_model_load_part_shard(const char *json, const char *name, td_device *dev,
                                   td_dtype dtype, uint64_t seed, int first, int end, int slots,
                                   const td_shard_plan *plan, td_model **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_part_shard: out is NULL");
    *out = NULL;
    if (!json || !dev || !plan)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_load_part_shard: json, device or plan is NULL");
    if (first < 0 || end <= first || slots < 1 || slots > 4096)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_load_part_shard: layers [%d, %d) with %d slots is not a part",
                         first, end, slots);
    return load_sliced(json, name, dev, dtype, seed, first, end, slots, plan, out);
}

int td_model_is_shard(const td_model *m) {
    return m && m->splits != NULL;
}

void td_model_set_reduce_hook(td_model *m, td_reduce_fn fn, void *arg) {
    if (!m)
        return;
    m->reduce = fn;
    m->reduce_arg = arg;
}

void td_model_param_slice(const td_model *m, size_t i, td_param_slice *out) {
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    out->dim = -1;
    out->blocks = 1;
    if (m && i < m->nparams)
        *out = m->slices[i];
}
