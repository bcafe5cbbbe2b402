/* Model parts (pipeline stages): forward and backward of top-level layers
 * [first, end) of a model, one micro-batch per activation slot.
 *
 * A pass is three steps. A task on the part's device makes the slot's arena
 * fit the micro-batch and carves the layer views onto it; then the calling
 * thread copies the activations (or gradients) from the neighbouring part
 * into the slot with td_buffer_copy, which may need the other device's
 * thread, so it must not run inside this device's task (two parts copying
 * from each other would wait on each other); then a second task runs the
 * layers. Dropout draws from the step's seed and each sample's place in the
 * whole batch, as td_model_train_slice does, so a batch cut into micro-batches
 * drops what one pass over it would. A part is used by one thread at a time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "device/internal.h"
#include "nn/nn-impl.h"

td_status td_model_load_part(const char *json, const char *name, td_device *dev, td_dtype dtype,
                             uint64_t seed, int first, int end, int slots, td_model **out) {
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_part: out is NULL");
    *out = NULL;
    if (!json || !dev)
        return td__error(TD_ERR_INVALID_ARG, "td_model_load_part: json or device is NULL");
    if (first < 0 || end <= first)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_load_part: layers [%d, %d) is not a part (0 <= first < end)",
                         first, end);
    if (slots < 1 || slots > 4096)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_load_part: %d activation slots (expected 1 to 4096)", slots);
    return td__model_build(json, name, dev, dtype, seed, first, end, slots, NULL, 0, out);
}

void td_model_part_range(const td_model *m, int *first, int *end, size_t *first_param) {
    if (first)
        *first = m ? m->part_first : 0;
    if (end)
        *end = m ? m->part_end : 0;
    if (first_param)
        *first_param = m ? m->part_first_param : 0;
}

static int is_last(const td_model *m) {
    return m->part_end == m->info.layers;
}

static size_t dsize(const td_model *m) {
    return m->dtype == TD_F64 ? sizeof(double) : sizeof(float);
}

/* A view as a buffer, for td_buffer_copy and the caller. */
static td_buffer as_buffer(const td_model *m, const td_tensor *view) {
    td_buffer b = {m->dev, view->data, view->numel * dsize(m)};
    return b;
}

typedef struct part_args {
    td_model *m;
    int slot;
    int64_t n;
    const td_batch *mb;
    int64_t first_sample;
    int train, accumulate, defer;
    uint64_t dropout_step;
    double grad_scale;
    td_step_result *res;
} part_args;

static td_status prepare_task(td_device *dev, void *arg) {
    part_args *a = arg;
    return td__model_prepare(a->m, a->slot, a->n, 0);
}

/* Copies bytes of src into the carved view dst, after checking src's size. */
static td_status copy_in(td_model *m, const td_tensor *dst, const td_buffer *src,
                         const char *what) {
    td_buffer d = as_buffer(m, dst);
    if (src->nbytes < d.nbytes)
        return td__error(TD_ERR_INVALID_ARG,
                         "model part [%d, %d): %s has %zu bytes; the micro-batch needs %zu",
                         m->part_first, m->part_end, what, src->nbytes, d.nbytes);
    return td_buffer_copy(&d, 0, src, 0, d.nbytes);
}

static td_status forward_task(td_device *dev, void *arg) {
    part_args *a = arg;
    td_model *m = a->m;
    td_nn_slot *s = &m->slots[a->slot];
    td_layer *root = m->root;
    td_step_result res = {0, 0, 0};
    td_nn_run r;
    m->stretch_start = td_clock_ns(); /* a reduction in between starts it again */
    TD_CHECK(td__model_prepare(m, a->slot, a->n, 0));
    TD_CHECK(td__model_load_batch(m, a->mb, m->part_first == 0, is_last(m)));
    memset(&r, 0, sizeof r);
    r.model = m;
    r.train = a->train;
    r.dropout_seed = td__model_dropout_seed(m, a->dropout_step);
    r.first_sample = a->first_sample;
    r.tokens = m->kind == TD_INPUT_TOKENS && m->part_first == 0 ? &m->tokens : NULL;
    TD_CHECK(root->vt->forward(root, &m->input, &r));
    if (is_last(m)) {
        TD_CHECK(td__op_xent(&root->out, &m->labels, a->train ? &root->dout : NULL, a->grad_scale,
                             &res.loss_sum, &res.correct));
        res.count = (int64_t)((size_t)a->n * td__model_labels_per_sample(m));
    }
    s->n = a->n;
    s->train = a->train;
    s->dropout_seed = r.dropout_seed;
    s->first_sample = a->first_sample;
    s->out = as_buffer(m, &root->out);
    s->forward_done = 1;
    if (a->res)
        *a->res = res;
    td__device_throttle(dev, m->stretch_start);
    return TD_OK;
}

static td_status check_slot(const td_model *m, int slot, const char *fn) {
    if (!m)
        return td__error(TD_ERR_INVALID_ARG, "%s: model is NULL", fn);
    if (slot < 0 || slot >= m->nslots)
        return td__error(TD_ERR_INVALID_ARG, "%s: slot %d of a part with %d slots", fn, slot,
                         m->nslots);
    return TD_OK;
}

td_status td_model_part_forward(td_model *m, int slot, const td_batch *mb, int64_t first_sample,
                                const td_buffer *in, int train, uint64_t dropout_step,
                                double grad_scale, td_step_result *res) {
    part_args a;
    td_nn_slot *s;
    if (res)
        memset(res, 0, sizeof *res);
    TD_CHECK(check_slot(m, slot, "td_model_part_forward"));
    if (!mb)
        return td__error(TD_ERR_INVALID_ARG, "td_model_part_forward: micro-batch is NULL");
    if (mb->n <= 0 || mb->n > (1 << 24))
        return td__error(TD_ERR_INVALID_ARG, "td_model_part_forward: micro-batch of %lld samples",
                         (long long)mb->n);
    if (first_sample < 0)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_part_forward: a micro-batch cannot start at sample %lld",
                         (long long)first_sample);
    if (m->part_first > 0 && !in)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_part_forward: part [%d, %d) reads the activations of layer "
                         "%d: `in` is NULL",
                         m->part_first, m->part_end, m->part_first - 1);
    s = &m->slots[slot];
    if (s->weights_owed)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_part_forward: slot %d still owes the weight gradients of its "
                         "last micro-batch (td_model_part_backward_weights)",
                         slot);
    s->forward_done = 0;
    s->backward_done = 0;
    memset(&a, 0, sizeof a);
    a.m = m;
    a.slot = slot;
    a.n = mb->n;
    a.mb = mb;
    a.first_sample = first_sample;
    a.train = train;
    a.dropout_step = dropout_step;
    a.grad_scale = grad_scale;
    a.res = res;
    TD_CHECK(td_device_run(m->dev, prepare_task, &a));
    if (m->part_first > 0)
        TD_CHECK(copy_in(m, &m->input, in, "the input (in)"));
    return td_device_run(m->dev, forward_task, &a);
}

const td_buffer *td_model_part_output(td_model *m, int slot) {
    if (!m || slot < 0 || slot >= m->nslots || !m->slots[slot].forward_done)
        return NULL;
    return &m->slots[slot].out;
}

/* Carves the slot's views and sets up a run going back through its
 * forward: the dropout stream and tokens that forward had. */
static td_status backward_run(td_model *m, int slot, int accumulate, td_nn_run *r) {
    td_nn_slot *s = &m->slots[slot];
    TD_CHECK(td__model_prepare(m, slot, s->n, 0));
    memset(r, 0, sizeof *r);
    r->model = m;
    r->train = 1;
    r->acc = accumulate;
    r->dropout_seed = s->dropout_seed;
    r->first_sample = s->first_sample;
    r->tokens = m->kind == TD_INPUT_TOKENS && m->part_first == 0 ? &m->tokens : NULL;
    return TD_OK;
}

static td_status backward_task(td_device *dev, void *arg) {
    part_args *a = arg;
    td_model *m = a->m;
    td_nn_slot *s = &m->slots[a->slot];
    td_layer *root = m->root;
    td_nn_run r;
    m->stretch_start = td_clock_ns(); /* a reduction in between starts it again */
    TD_CHECK(backward_run(m, a->slot, a->accumulate, &r));
    r.defer = a->defer;
    TD_CHECK(root->vt->backward(root, &m->input, m->part_first > 0 ? &m->in_grad : NULL, &r));
    if (m->part_first > 0)
        s->in_grad = as_buffer(m, &m->in_grad);
    s->backward_done = 1;
    s->weights_owed = a->defer;
    s->accumulate = a->accumulate;
    td__device_throttle(dev, m->stretch_start);
    return TD_OK;
}

static td_status backward(td_model *m, int slot, const td_buffer *dout, int accumulate, int defer,
                          const char *fn) {
    part_args a;
    td_nn_slot *s;
    TD_CHECK(check_slot(m, slot, fn));
    s = &m->slots[slot];
    if (!s->forward_done || !s->train)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: slot %d holds no training forward to go back through", fn, slot);
    if (s->backward_done)
        return td__error(TD_ERR_INVALID_ARG, "%s: slot %d went back through its forward already",
                         fn, slot);
    if (!dout && !is_last(m))
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: part [%d, %d) does not end the model: dout (the gradient of layer "
                         "%d's output) is NULL",
                         fn, m->part_first, m->part_end, m->part_end - 1);
    memset(&a, 0, sizeof a);
    a.m = m;
    a.slot = slot;
    a.n = s->n;
    a.accumulate = accumulate ? 1 : 0;
    a.defer = defer;
    TD_CHECK(td_device_run(m->dev, prepare_task, &a));
    /* on the last part a given dout stands in for the loss's gradient */
    if (dout)
        TD_CHECK(copy_in(m, &m->root->dout, dout, "the output gradient (dout)"));
    return td_device_run(m->dev, backward_task, &a);
}

td_status td_model_part_backward(td_model *m, int slot, const td_buffer *dout, int accumulate) {
    return backward(m, slot, dout, accumulate, 0, "td_model_part_backward");
}

td_status td_model_part_backward_input(td_model *m, int slot, const td_buffer *dout,
                                       int accumulate) {
    return backward(m, slot, dout, accumulate, 1, "td_model_part_backward_input");
}

typedef struct weights_args {
    td_model *m;
    const int *slots;
    int count;
} weights_args;

/* The weight gradients slot owes for top-level layer `layer`. */
static td_status layer_weights(td_model *m, int layer, int slot) {
    td_nn_run r;
    TD_CHECK(backward_run(m, slot, m->slots[slot].accumulate, &r));
    return td__seq_child_weights(m->root, layer, &m->input, &r);
}

/* Top-level layer by layer, each one's gradients from every slot in turn:
 * a layer's weight gradients (a GPT block's 8 MB) are added to count times
 * while they are in cache, where slot after slot streamed every layer's
 * from memory each time (the weight-gradient GEMMs of a micro-batch of one
 * 128-token sample read and write 6 MB for 2 ms of compute). Each layer
 * still adds the slots in the order given. A head tied to the embedding
 * adds to the embedding's gradient: there slot by slot, as the other order
 * would change that sum. */
static td_status weights_task(td_device *dev, void *arg) {
    weights_args *a = arg;
    td_model *m = a->m;
    int layers = m->root->nchildren;
    m->stretch_start = td_clock_ns(); /* a reduction in between starts it again */
    if (m->embed && m->embed->tied) {
        for (int q = 0; q < a->count; q++)
            for (int i = layers - 1; i >= 0; i--)
                TD_CHECK(layer_weights(m, i, a->slots[q]));
    } else {
        for (int i = layers - 1; i >= 0; i--)
            for (int q = 0; q < a->count; q++)
                TD_CHECK(layer_weights(m, i, a->slots[q]));
    }
    for (int q = 0; q < a->count; q++)
        m->slots[a->slots[q]].weights_owed = 0;
    td__device_throttle(dev, m->stretch_start);
    return TD_OK;
}

td_status td_model_part_backward_weights_many(td_model *m, const int *slots, int count) {
    weights_args a = {m, slots, count};
    if (count < 1 || !slots)
        return td__error(TD_ERR_INVALID_ARG,
                         "td_model_part_backward_weights_many: %s (expected at least one slot)",
                         slots ? "count is 0 or less" : "slots is NULL");
    for (int q = 0; q < count; q++) {
        TD_CHECK(check_slot(m, slots[q], "td_model_part_backward_weights"));
        if (!m->slots[slots[q]].weights_owed)
            return td__error(TD_ERR_INVALID_ARG,
                             "td_model_part_backward_weights: slot %d owes no weight gradients "
                             "(its last backward was not td_model_part_backward_input)",
                             slots[q]);
        for (int e = 0; e < q; e++)
            if (slots[e] == slots[q])
                return td__error(TD_ERR_INVALID_ARG,
                                 "td_model_part_backward_weights_many: slot %d given twice",
                                 slots[q]);
    }
    return td_device_run(m->dev, weights_task, &a);
}

td_status td_model_part_backward_weights(td_model *m, int slot) {
    return td_model_part_backward_weights_many(m, &slot, 1);
}

const td_buffer *td_model_part_input_grad(td_model *m, int slot) {
    if (!m || m->part_first == 0 || slot < 0 || slot >= m->nslots || !m->slots[slot].backward_done)
        return NULL;
    return &m->slots[slot].in_grad;
}
