/* Whole-model checkpoints of the `tensor` strategy. Every shard holds the
 * whole model's parameters under their names, each with its slice
 * (td_model_param_slice); an optimizer's state tensors follow its
 * parameters, per_param of them each. Saving reads every shard's slice of a
 * tensor into the whole tensor in host memory and writes the file
 * td_checkpoint_save would; loading cuts each shard's slices out of the
 * file's whole tensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/tensor-impl.h"

static size_t numel_of(const td_param_slice *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->shape[i];
    return n;
}

/* State tensors per parameter (0, 1 or 2). */
static size_t per_param(td_model *m, td_optimizer *o) {
    size_t np = td_model_param_count(m);
    return o && np ? td_optimizer_state_count(o) / np : 0;
}

/* The tensor of shard k that item j is: parameter j, or optimizer state
 * j - np. */
static td_tensor *item(td_model *m, td_optimizer *o, size_t j, size_t np) {
    return j < np ? td_model_param(m, j) : td_optimizer_state(o, j - np);
}

/* Puts item j together from every shard into `whole` (host, dtype bytes). */
static td_status gather(td_model *const *shards, td_optimizer *const *opts, int n, size_t j,
                        size_t np, size_t pp, size_t es, void *whole) {
    td_param_slice sl;
    void *part = NULL;
    td_status st = TD_OK;
    for (int k = 0; k < n && st == TD_OK; k++) {
        td_tensor *t = item(shards[k], opts ? opts[k] : NULL, j, np);
        size_t nb = td_tensor_nbytes(t);
        td_model_param_slice(shards[k], j < np ? j : (j - np) / pp, &sl);
        if (sl.dim < 0 && k > 0)
            break; /* replicated: shard 0's */
        if (!(part = td__aligned_alloc(nb + 1, "a checkpoint's slice")))
            return TD_ERR_OUT_OF_MEMORY;
        st = td_tensor_read(t, part, nb);
        if (st == TD_OK)
            td_param_slice_gather(&sl, es, part, whole);
        free(part);
    }
    return st;
}

td_status td__tensor_save(td_model *const *shards, td_optimizer *const *opts, int n,
                          const char *path, const td_train_state *state) {
    td_model *m0 = shards[0];
    td_dtype dt = td_model_dtype(m0);
    size_t es = td_dtype_size(dt), np = td_model_param_count(m0);
    size_t pp = per_param(m0, opts ? opts[0] : NULL), total = np + np * pp;
    td_ckpt_entry *e = td__calloc(sizeof *e * (total + 1), "a checkpoint's tensors");
    char **names = td__calloc(sizeof *names * (total + 1), "a checkpoint's names");
    td_status st = TD_OK;
    if (!e || !names) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto done;
    }
    for (size_t j = 0; j < total && st == TD_OK; j++) {
        td_param_slice sl;
        const char *name =
            j < np ? td_model_param_name(m0, j) : td_optimizer_state_name(opts[0], j - np);
        td_model_param_slice(m0, j < np ? j : (j - np) / pp, &sl);
        if (!(names[j] = td__calloc(strlen(name) + 16, "a checkpoint's name")) ||
            !(e[j].data = td__aligned_alloc(numel_of(&sl) * es + 1, "a whole tensor"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            break;
        }
        snprintf(names[j], strlen(name) + 16, "%s%s", j < np ? "" : "optimizer.", name);
        e[j].name = names[j];
        e[j].ndim = sl.ndim;
        memcpy(e[j].shape, sl.shape, sizeof e[j].shape);
        st = gather(shards, opts, n, j, np, pp, es, (void *)e[j].data);
    }
    if (st == TD_OK)
        st = td_checkpoint_save_host(path, td_model_json(m0), dt, e, total, opts != NULL, state);
done:
    for (size_t j = 0; j < total; j++) {
        if (e)
            free((void *)e[j].data);
        if (names)
            free(names[j]);
    }
    free(e);
    free(names);
    return st;
}

/* Writes shard k's slice of the file's tensor `name` into t. */
static td_status scatter(const td_safetensors *sf, const char *name, const td_param_slice *sl,
                         td_tensor *t) {
    const td_st_tensor *w = td_safetensors_find(sf, name);
    size_t nb = td_tensor_nbytes(t);
    void *part;
    td_status st;
    if (!w)
        return td__error(TD_ERR_CORRUPT, "%s: tensor \"%s\" is missing", td_safetensors_name(sf),
                         name);
    if (w->dtype != td_tensor_dtype(t))
        return td__error(TD_ERR_DTYPE, "%s: tensor \"%s\" is %s; the model is %s",
                         td_safetensors_name(sf), name, td_dtype_name(w->dtype),
                         td_dtype_name(td_tensor_dtype(t)));
    if (w->ndim != sl->ndim || memcmp(w->shape, sl->shape, sizeof(int64_t) * (size_t)sl->ndim))
        return td__error(TD_ERR_SHAPE, "%s: tensor \"%s\" has another shape than the model's",
                         td_safetensors_name(sf), name);
    if (!(part = td__aligned_alloc(nb + 1, "a checkpoint's slice")))
        return TD_ERR_OUT_OF_MEMORY;
    /* the file's bytes may be unaligned: the copies are byte copies */
    td_param_slice_scatter(sl, td_dtype_size(w->dtype), w->data, part);
    st = td_tensor_write(t, part, nb);
    free(part);
    return st;
}

td_status td__tensor_load(td_model *const *shards, td_optimizer *const *opts, int n,
                          const char *path, td_train_state *state) {
    td_safetensors *sf = NULL;
    td_train_state s;
    td_dtype dt;
    char *json = NULL;
    const char *v;
    td_status st;
    TD_TRY(td_checkpoint_read_meta(path, &json, &dt, &s));
    if (strcmp(json, td_model_json(shards[0])) != 0) {
        st = td__error(TD_ERR_SHAPE, "%s: holds another model than the one being loaded", path);
        goto fail;
    }
    if (dt != td_model_dtype(shards[0])) {
        st = td__error(TD_ERR_DTYPE, "%s: the checkpoint is %s; the model is %s", path,
                       td_dtype_name(dt), td_dtype_name(td_model_dtype(shards[0])));
        goto fail;
    }
    TD_TRY(td_safetensors_load(path, &sf));
    v = td_safetensors_meta(sf, "tandem.has_optimizer");
    if (opts && (!v || strcmp(v, "1") != 0)) {
        st = td__error(TD_ERR_CORRUPT, "%s: holds no optimizer state (saved with the weights only)",
                       path);
        goto fail;
    }
    for (int k = 0; k < n; k++) {
        td_model *m = shards[k];
        td_optimizer *o = opts ? opts[k] : NULL;
        size_t np = td_model_param_count(m), pp = per_param(m, o);
        for (size_t j = 0; j < np + np * pp; j++) {
            td_param_slice sl;
            char name[512];
            td_model_param_slice(m, j < np ? j : (j - np) / pp, &sl);
            if (j < np)
                snprintf(name, sizeof name, "%s", td_model_param_name(m, j));
            else
                snprintf(name, sizeof name, "optimizer.%s", td_optimizer_state_name(o, j - np));
            TD_TRY(scatter(sf, name, &sl, item(m, o, j, np)));
        }
        if (o)
            td_optimizer_set_steps(o, s.step);
    }
    if (state)
        *state = s;
    st = TD_OK;
fail:
    free(json);
    td_safetensors_destroy(sf);
    return st;
}
