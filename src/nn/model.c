/* Models: parameters, the activation arenas, and the training and
 * evaluation steps of a whole model. Parsing and building are in describe.c,
 * parts' passes in part.c. See docs/models.md for the schema. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/text.h"
#include "core/trace.h"
#include "device/graph.h"
#include "device/internal.h"
#include "nn/nn-impl.h"

/* Parameters ------------------------------------------------------------------- */

/* A parameter must fit a tensor, and all of them together the total limit. */
static td_status check_param_size(const td_model *m, const td_layer *l, const char *name, int ndim,
                                  const int64_t *shape) {
    int64_t numel = td__nn_numel(shape, ndim);
    char s[64];
    if (numel < 0)
        return td__error(TD_ERR_PARSE,
                         "%s: parameter %s.%s %s has more than the %lld elements a tensor may "
                         "hold",
                         m->file, l->path, name, td__shape_text(shape, ndim, s),
                         (long long)TD_MODEL_MAX_TENSOR);
    if ((int64_t)m->serial_weights + numel > TD_MODEL_MAX_TOTAL)
        return td__error(TD_ERR_PARSE,
                         "%s: parameter %s.%s: the model's parameters come to more than %lld "
                         "elements",
                         m->file, l->path, name, (long long)TD_MODEL_MAX_TOTAL);
    return TD_OK;
}

/* "<path>.<name>", malloc'ed: as long as the nesting makes it. */
static char *param_name(const char *path, const char *name) {
    size_t n = strlen(path) + strlen(name) + 2;
    char *full = td__calloc(n, "a parameter name");
    if (full)
        snprintf(full, n, "%s.%s", path, name);
    return full;
}

td_status td__model_add_param(td_model *m, td_layer *l, const char *name, int ndim,
                              const int64_t *shape, td_tensor **param) {
    td_status st;
    td_tensor *p = NULL, *g = NULL;
    char *full = NULL;
    *param = NULL;
    if (m->param_serial - l->first_serial >= TD_LAYER_MAX_PARAMS)
        return td__error(TD_ERR_INTERNAL, "%s: too many parameters", l->path);
    TD_CHECK(check_param_size(m, l, name, ndim, shape));
    m->param_serial++;
    m->serial_weights += (size_t)td__nn_numel(shape, ndim);
    if (m->dry)
        return TD_OK;
    if (m->nparams == m->cap_params) {
        size_t cap = m->cap_params ? m->cap_params * 2 : 16;
        td_tensor **np = realloc(m->params, sizeof *np * cap);
        if (np)
            m->params = np;
        td_tensor **ng = realloc(m->grads, sizeof *ng * cap);
        if (ng)
            m->grads = ng;
        char **nn = realloc(m->names, sizeof *nn * cap);
        if (nn)
            m->names = nn;
        td_param_slice *ns = realloc(m->slices, sizeof *ns * cap);
        if (ns)
            m->slices = ns;
        if (!np || !ng || !nn || !ns)
            return td__error(TD_ERR_OUT_OF_MEMORY, "out of memory for a model's parameters");
        m->cap_params = cap;
    }
    if (!(full = param_name(l->path, name)))
        return TD_ERR_OUT_OF_MEMORY;
    if ((st = td_tensor_create(m->dev, m->dtype, ndim, shape, &p)) != TD_OK ||
        (st = td_tensor_create(m->dev, m->dtype, ndim, shape, &g)) != TD_OK ||
        (st = td_tensor_fill(g, 0.0)) != TD_OK) {
        td_tensor_destroy(p);
        td_tensor_destroy(g);
        free(full);
        return st;
    }
    m->params[m->nparams] = p;
    m->grads[m->nparams] = g;
    m->names[m->nparams] = full;
    /* whole, until td__model_add_slice says otherwise */
    memset(&m->slices[m->nparams], 0, sizeof m->slices[m->nparams]);
    m->slices[m->nparams].ndim = ndim;
    memcpy(m->slices[m->nparams].shape, shape, sizeof(int64_t) * (size_t)ndim);
    m->slices[m->nparams].dim = -1;
    m->slices[m->nparams].blocks = 1;
    m->nparams++;
    *param = p;
    return TD_OK;
}

/* The planner ------------------------------------------------------------------- */

static td_status plan_overflow(const td_nn_plan *p) {
    return td__error(TD_ERR_OUT_OF_MEMORY, "the activations of %lld samples overflow a size",
                     (long long)p->n);
}

td_status td__plan_tensor(td_nn_plan *p, td_tensor *view, int batched, int ndim,
                          const int64_t *shape) {
    int64_t full[TD_MAX_DIMS];
    int nd = 0;
    size_t numel = 1, start;
    if (batched)
        full[nd++] = p->n;
    for (int i = 0; i < ndim; i++) {
        if (nd >= TD_MAX_DIMS)
            return td__error(TD_ERR_INTERNAL, "activation with more than %d dimensions",
                             TD_MAX_DIMS);
        full[nd++] = shape[i];
    }
    /* Checked: a dry plan sizes models before anything is refused for being too large. */
    for (int i = 0; i < nd; i++)
        if (__builtin_mul_overflow(numel, (size_t)full[i], &numel))
            return plan_overflow(p);
    if (__builtin_add_overflow(p->used, PLAN_ALIGN - 1, &start) ||
        __builtin_add_overflow(start / PLAN_ALIGN * PLAN_ALIGN, numel, &p->used))
        return plan_overflow(p);
    start = start / PLAN_ALIGN * PLAN_ALIGN;
    if (!p->dry) {
        td_status st = td__tensor_view(view, p->base, start, nd, full);
        if (st != TD_OK)
            return st;
    }
    return TD_OK;
}

td_status td__plan_ints(td_nn_plan *p, td_buffer *view, size_t count) {
    p->iused = (p->iused + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
    if (!p->dry) {
        if ((p->iused + count) * sizeof(int32_t) > p->ibase->nbytes)
            return td__error(TD_ERR_INTERNAL, "int workspace overflow");
        view->dev = p->ibase->dev;
        view->ptr = (int32_t *)p->ibase->ptr + p->iused;
        view->nbytes = count * sizeof(int32_t);
    }
    p->iused += count;
    return TD_OK;
}

size_t td__model_labels_per_sample(const td_model *m) {
    return m->kind == TD_INPUT_TOKENS ? (size_t)m->in_shape[0] : 1;
}

static td_status plan_all(td_model *m, td_nn_plan *p) {
    td_layer *root = m->root;
    if (m->part_first > 0 || m->kind == TD_INPUT_FEATURES) {
        TD_CHECK(td__plan_tensor(p, &m->input, 1, root->in_ndim, root->in_shape));
    } else {
        int64_t one = 1;
        /* a placeholder input: the embedding reads the tokens */
        TD_CHECK(td__plan_tensor(p, &m->input, 0, 1, &one));
        TD_CHECK(td__plan_ints(p, &m->tokens, (size_t)(p->n * m->in_shape[0])));
    }
    if (m->part_end == m->info.layers)
        TD_CHECK(td__plan_ints(p, &m->labels, (size_t)p->n * td__model_labels_per_sample(m)));
    TD_CHECK(m->bands ? td__band_plan(m, p) : root->vt->plan(root, p, &m->input));
    if (m->part_first > 0)
        TD_CHECK(td__plan_tensor(p, &m->in_grad, 1, root->in_ndim, root->in_shape));
    return TD_OK;
}

td_status td__model_prepare(td_model *m, int slot, int64_t n, int infer) {
    td_status st;
    td_nn_slot *s = &m->slots[slot];
    td_nn_plan p;
    /* an arena sized for inference is too small for training */
    if (n > s->cap_n || (s->cap_infer && !infer)) {
        int64_t len;
        memset(&p, 0, sizeof p);
        p.dev = m->dev;
        p.n = n;
        p.dry = 1;
        p.infer = infer;
        if ((st = plan_all(m, &p)) != TD_OK)
            return st;
        if (m->cur_slot == slot)
            m->cur_slot = -1;
        td_tensor_destroy(s->arena);
        td_buffer_free(s->iarena);
        s->arena = NULL;
        s->iarena = NULL;
        s->cap_n = 0;
        len = (int64_t)p.used;
        if ((st = td_tensor_create(m->dev, m->dtype, 1, &len, &s->arena)) != TD_OK)
            return st;
        if ((st = td_buffer_alloc(m->dev, (p.iused + 1) * sizeof(int32_t), &s->iarena)) != TD_OK)
            return st;
        s->cap_n = n;
        s->cap_infer = infer;
    }
    if (slot != m->cur_slot || n != m->planned_n || infer != m->planned_infer) {
        memset(&p, 0, sizeof p);
        p.dev = m->dev;
        p.n = n;
        p.infer = infer;
        p.base = s->arena;
        p.ibase = s->iarena;
        m->cur_slot = -1;
        if ((st = plan_all(m, &p)) != TD_OK)
            return st;
        m->cur_slot = slot;
        m->planned_infer = infer;
        m->planned_n = n;
    }
    return TD_OK;
}

/* Steps ------------------------------------------------------------------------ */

typedef struct step_args {
    td_model *m;
    const td_batch *batch;
    double grad_scale;
    int accumulate, train;
    uint64_t dropout_step;
    td_step_result *out;
    int64_t first; /* the batch's first sample's place in the whole batch */
} step_args;

uint64_t td__model_dropout_seed(const td_model *m, uint64_t dropout_step) {
    return td__nn_mix64(m->seed ^ td__nn_mix64(dropout_step ^ 0xD80F00D5ull));
}

static td_status write_dev(td_model *m, void *dst, const void *src, size_t nbytes) {
    uint64_t tr = td__trace_begin();
    td_status st = td__device_write(m->dev, dst, src, nbytes);
    td__trace_end(tr, TD__TRACE_COPY, "copy HtoD", (int64_t)nbytes);
    return st;
}

td_status td__model_load_batch(td_model *m, const td_batch *b, int inputs, int labels) {
    td_status st;
    size_t nl = (size_t)b->n * td__model_labels_per_sample(m);
    if (!inputs) {
        /* a later part: its input comes from the part before */
    } else if (m->kind == TD_INPUT_FEATURES) {
        size_t count = m->input.numel;
        if (!b->x)
            return td__error(TD_ERR_INVALID_ARG, "model batch: x is NULL for a features model");
        if (m->dtype == TD_F32) {
            if ((st = write_dev(m, m->input.data, b->x, count * sizeof(float))) != TD_OK)
                return st;
        } else {
            double *tmp;
            if (m->host_tmp_n < count) {
                free(m->host_tmp);
                m->host_tmp_n = 0;
                if (!(m->host_tmp = td__aligned_alloc(count * sizeof(double), "a batch")))
                    return TD_ERR_OUT_OF_MEMORY;
                m->host_tmp_n = count;
            }
            tmp = m->host_tmp;
            for (size_t i = 0; i < count; i++)
                tmp[i] = b->x[i];
            if ((st = write_dev(m, m->input.data, tmp, count * sizeof(double))) != TD_OK)
                return st;
        }
    } else {
        if (!b->tokens)
            return td__error(TD_ERR_INVALID_ARG, "model batch: tokens is NULL for a token model");
        if ((st = write_dev(m, m->tokens.ptr, b->tokens,
                            (size_t)b->n * (size_t)m->in_shape[0] * sizeof(int32_t))) != TD_OK)
            return st;
    }
    if (!labels)
        return TD_OK;
    if (!b->labels)
        return td__error(TD_ERR_INVALID_ARG, "model batch: labels is NULL");
    return write_dev(m, m->labels.ptr, b->labels, nl * sizeof(int32_t));
}

/* Forward, loss and, when training, backward over the loaded batch. Only
 * queues device work; *loss_sum and *correct are final on return, or, while a
 * graph is being recorded, at each replay. */
static td_status run_passes(td_model *m, const step_args *a, double *loss_sum, int64_t *correct) {
    td_status st;
    td_nn_run r;
    uint64_t tr;
    memset(&r, 0, sizeof r);
    r.model = m;
    r.train = a->train;
    r.acc = a->accumulate;
    r.dropout_seed = td__model_dropout_seed(m, a->dropout_step);
    r.first_sample = a->first;
    r.tokens = m->kind == TD_INPUT_TOKENS ? &m->tokens : NULL;
    if (m->bands)
        return td__band_passes(m, &r, a->grad_scale, loss_sum, correct);
    tr = td__trace_begin();
    if ((st = m->root->vt->forward(m->root, &m->input, &r)) != TD_OK)
        return st;
    if ((st = td__op_xent(&m->root->out, &m->labels, a->train ? &m->root->dout : NULL,
                          a->grad_scale, loss_sum, correct)) != TD_OK)
        return st;
    td__trace_end(tr, TD__TRACE_COMPUTE, "forward", -1); /* the loss included */
    if (!a->train)
        return TD_OK;
    tr = td__trace_begin();
    st = m->root->vt->backward(m->root, &m->input, NULL, &r);
    td__trace_end(tr, TD__TRACE_COMPUTE, "backward", -1);
    return st;
}

/* The training step as a device graph -------------------------------------------
 *
 * On a backend that records graphs (CUDA), a training step whose batch size,
 * gradient scale and accumulate flag are those of the step before is recorded
 * once and then replayed: the batch is written into the same arena views as
 * always and one launch runs forward, loss and backward, which for small
 * models saves most of the time spent launching kernels. Everything a graph
 * holds is fixed at recording, so models whose step reads a value that changes
 * from step to step stay eager: a dropout layer (its seed), a gradient hook
 * (the data strategy reduces from it), a shard's reduce hook. The optimizer is not part of the
 * graph: its learning rate and bias corrections are per-step arguments. A recording that fails is
 * said once in the log and the model trains eagerly from then on. TANDEM_CUDA_GRAPHS=0 switches
 * graphs off. */

static int has_dropout(const td_layer *l) {
    if (!strcmp(l->vt->type, "dropout") && l->p > 0)
        return 1;
    for (int i = 0; i < l->nchildren; i++)
        if (has_dropout(l->children[i]))
            return 1;
    return 0;
}

static void graph_drop(td_model *m) {
    td__graph_destroy(m->graph);
    m->graph = NULL;
}

/* Runs the step by replaying (recording first if needed) and sets *done, or
 * leaves *done 0 for the eager path. A failure of a replay is the step's. */
static td_status graph_step(td_model *m, const step_args *a, td_step_result *res, int *done) {
    td_status st;
    td_graph *g = NULL;
    *done = 0;
    if (!a->train || m->graph_off || m->hook || m->reduce || m->bands)
        return TD_OK;
    if (!m->graph_checked) {
        m->graph_checked = 1;
        m->graph_off = !td__device_has_graphs(m->dev) || has_dropout(m->root);
        if (m->graph_off)
            return TD_OK;
    }
    if (!m->graph || m->graph_n != a->batch->n || m->graph_cap != m->slots[0].cap_n ||
        m->graph_scale != a->grad_scale || m->graph_acc != a->accumulate) {
        int again = m->graph_n == a->batch->n && m->graph_cap == m->slots[0].cap_n &&
                    m->graph_scale == a->grad_scale && m->graph_acc == a->accumulate;
        graph_drop(m);
        m->graph_n = a->batch->n;
        m->graph_cap = m->slots[0].cap_n;
        m->graph_scale = a->grad_scale;
        m->graph_acc = a->accumulate;
        /* The first step of a shape runs eagerly: it grows the backend's
         * scratch to what the step needs, which must not happen while
         * recording, and a shape seen only once is not worth recording. */
        if (!again)
            return TD_OK;
        if ((st = td__graph_begin(m->dev)) != TD_OK) {
            if (st != TD_ERR_UNSUPPORTED)
                TD_LOG_WARN("%s: cannot record the training step as a graph (%s); training "
                            "eagerly",
                            td_device_name(m->dev), td_last_error());
            m->graph_off = 1;
            return TD_OK;
        }
        st = run_passes(m, a, &m->graph_loss, &m->graph_correct);
        if (st != TD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", td_last_error());
            td__graph_end(m->dev, &g);
            td__graph_destroy(g);
            TD_LOG_WARN("%s: recording the training step as a graph failed (%s); training "
                        "eagerly",
                        td_device_name(m->dev), why);
            m->graph_off = 1;
            return TD_OK;
        }
        if ((st = td__graph_end(m->dev, &g)) != TD_OK) {
            TD_LOG_WARN("%s: recording the training step as a graph failed (%s); training "
                        "eagerly",
                        td_device_name(m->dev), td_last_error());
            m->graph_off = 1;
            return TD_OK;
        }
        m->graph = g;
        TD_LOG_INFO("%s: training step recorded as a graph (batch %lld)", td_device_name(m->dev),
                    (long long)a->batch->n);
    }
    {
        uint64_t tr = td__trace_begin();
        if ((st = td__graph_launch(m->graph)) != TD_OK)
            return st;
        /* One launch: forward and backward are not told apart. */
        td__trace_end(tr, TD__TRACE_COMPUTE, "forward+backward (graph)", -1);
    }
    m->graph_replays++;
    res->loss_sum = m->graph_loss;
    res->correct = m->graph_correct;
    *done = 1;
    return TD_OK;
}

static td_status step_task(td_device *dev, void *arg) {
    step_args *a = arg;
    td_model *m = a->m;
    td_status st;
    td_step_result res = {0, 0, 0};
    int done = 0;
    m->stretch_start = td_clock_ns();
    if ((st = td__model_prepare(m, 0, a->batch->n, 0)) != TD_OK)
        return st;
    if ((st = td__model_load_batch(m, a->batch, 1, 1)) != TD_OK)
        return st;
    if ((st = graph_step(m, a, &res, &done)) != TD_OK)
        return st;
    if (!done && (st = run_passes(m, a, &res.loss_sum, &res.correct)) != TD_OK)
        return st;
    res.count = (int64_t)((size_t)a->batch->n * td__model_labels_per_sample(m));
    if (a->out)
        *a->out = res;
    /* A device slowed on purpose ({slowdown=F}, {latency=MS}) is slowed
     * here, whatever strategy runs it (a shard's reductions slowed the
     * stretches before them). */
    td__device_throttle(dev, m->stretch_start);
    return TD_OK;
}

static td_status run_step(td_model *m, const td_batch *batch, step_args *a) {
    if (!m || !batch)
        return td__error(TD_ERR_INVALID_ARG, "model step: model or batch is NULL");
    if (batch->n <= 0 || batch->n > (1 << 24))
        return td__error(TD_ERR_INVALID_ARG, "model step: batch of %lld samples",
                         (long long)batch->n);
    if (m->part_first != 0 || m->part_end != m->info.layers)
        return td__error(TD_ERR_INVALID_ARG,
                         "model step: a part (layers [%d, %d) of %d) runs through "
                         "td_model_part_forward and td_model_part_backward",
                         m->part_first, m->part_end, m->info.layers);
    return td_device_run(m->dev, step_task, a);
}

td_status td_model_train_step(td_model *m, const td_batch *batch, double grad_scale, int accumulate,
                              uint64_t dropout_step, td_step_result *out) {
    return td_model_train_slice(m, batch, 0, grad_scale, accumulate, dropout_step, out);
}

td_status td_model_train_slice(td_model *m, const td_batch *slice, int64_t first, double grad_scale,
                               int accumulate, uint64_t dropout_step, td_step_result *out) {
    step_args a = {m, slice, grad_scale, accumulate, 1, dropout_step, out, first};
    if (first < 0)
        return td__error(TD_ERR_INVALID_ARG, "model step: a slice cannot start at sample %lld",
                         (long long)first);
    return run_step(m, slice, &a);
}

td_status td_model_evaluate(td_model *m, const td_batch *batch, td_step_result *out) {
    step_args a = {m, batch, 0.0, 0, 0, 0, out, 0};
    return run_step(m, batch, &a);
}

/* Loading (parsing and building: describe.c) ------------------------------------------ */

td_status td_model_load_string(const char *json, const char *name, td_device *dev, td_dtype dtype,
                               uint64_t seed, td_model **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_string: out is NULL");
    *out = NULL;
    if (!json || !dev)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_string: json or device is NULL");
    return td__model_build(json, name, dev, dtype, seed, 0, -1, 1, NULL, 0, out);
}

td_status td_model_load(const char *path, td_device *dev, td_dtype dtype, uint64_t seed,
                        td_model **out) {
    FILE *f;
    char *text = NULL;
    long len;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load: out is NULL");
    *out = NULL;
    if (!path)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load: path is NULL");
    if (!(f = fopen(path, "rb")))
        return td__error(TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return td__error(TD_ERR_IO, "%s: cannot read its size", path);
    }
    if (len > (64 << 20)) {
        fclose(f);
        return td__error(TD_ERR_PARSE, "%s: %ld bytes is too large for a model file", path, len);
    }
    if (!(text = td__calloc((size_t)len + 1, "a model file"))) {
        fclose(f);
        return TD_ERR_OUT_OF_MEMORY;
    }
    if (fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(text);
        return td__error(TD_ERR_IO, "%s: read failed", path);
    }
    fclose(f);
    st = td_model_load_string(text, path, dev, dtype, seed, out);
    free(text);
    return st;
}

void td_model_destroy(td_model *m) {
    if (!m)
        return;
    graph_drop(m);
    td__bands_free(m->bands);
    td__layer_destroy(m->root);
    for (size_t i = 0; i < m->nparams; i++) {
        td_tensor_destroy(m->params[i]);
        td_tensor_destroy(m->grads[i]);
        free(m->names[i]);
    }
    free(m->params);
    free(m->grads);
    free(m->names);
    free(m->slices);
    free(m->splits);
    for (int i = 0; m->slots && i < m->nslots; i++) {
        td_tensor_destroy(m->slots[i].arena);
        td_buffer_free(m->slots[i].iarena);
    }
    free(m->slots);
    free(m->host_tmp);
    free(m->json);
    free(m);
}

/* Accessors ----------------------------------------------------------------------- */

td_device *td_model_device(const td_model *m) {
    return m ? m->dev : NULL;
}
td_dtype td_model_dtype(const td_model *m) {
    return m ? m->dtype : TD_F32;
}
td_input_kind td_model_input_kind(const td_model *m) {
    return m ? m->kind : TD_INPUT_FEATURES;
}
int td_model_input_shape(const td_model *m, int64_t shape[TD_MAX_DIMS]) {
    if (!m)
        return 0;
    for (int i = 0; i < m->in_ndim; i++)
        shape[i] = m->in_shape[i];
    return m->in_ndim;
}
int64_t td_model_num_classes(const td_model *m) {
    return m ? m->classes : 0;
}
const char *td_model_json(const td_model *m) {
    return m ? m->json : NULL;
}
void td__model_release_grads(td_model *m) {
    for (size_t i = 0; m && i < m->nparams; i++)
        td__tensor_release(m->grads[i]);
}

size_t td_model_param_count(const td_model *m) {
    return m ? m->nparams : 0;
}
td_tensor *td_model_param(td_model *m, size_t i) {
    return m && i < m->nparams ? m->params[i] : NULL;
}
td_tensor *td_model_grad(td_model *m, size_t i) {
    return m && i < m->nparams ? m->grads[i] : NULL;
}
const char *td_model_param_name(const td_model *m, size_t i) {
    return m && i < m->nparams ? m->names[i] : NULL;
}
size_t td_model_num_weights(const td_model *m) {
    size_t n = 0;
    for (size_t i = 0; m && i < m->nparams; i++)
        n += m->params[i]->numel;
    return n;
}
void td__model_grads_ready(td_model *m, size_t first, size_t count) {
    if (!m->hook || !count)
        return;
    /* The hook may update the weights there and then (an optimizer in the
     * backward): a slowed device is slow at its compute, not at that. */
    td_device_throttle(m->dev, m->stretch_start, 0);
    m->hook(m->hook_arg, first, count);
    m->stretch_start = td_clock_ns();
}

void td_model_set_grad_hook(td_model *m, td_grad_ready_fn fn, void *arg) {
    if (!m)
        return;
    m->hook = fn;
    m->hook_arg = arg;
}
