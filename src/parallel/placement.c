/* Placements (placement.h): whole-model checkpoints written from, and read
 * into, whatever the members hold, and the survival rule. An item of a
 * holding is one of its tensors: parameter i for i < np, else optimizer
 * state i - np, which belongs to parameter (i - np) / per_param and is named
 * "optimizer.<its name>" in the file. */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/placement.h"

#define NAME_MAX_LEN 512

static size_t params_of(const td__holding *h) {
    return td_model_param_count(h->m);
}

static size_t states_of(const td__holding *h) {
    return h->opt ? td_optimizer_state_count(h->opt) : 0;
}

/* State tensors per parameter (0, 1 or 2). */
static size_t per_param(const td__holding *h) {
    size_t np = params_of(h);
    return np ? states_of(h) / np : 0;
}

static td_tensor *item_tensor(const td__holding *h, size_t i) {
    size_t np = params_of(h);
    return i < np ? td_model_param(h->m, i) : td_optimizer_state(h->opt, i - np);
}

static void item_name(const td__holding *h, size_t i, char *buf, size_t n) {
    size_t np = params_of(h);
    if (i < np)
        snprintf(buf, n, "%s", td_model_param_name(h->m, i));
    else
        snprintf(buf, n, "optimizer.%s", td_optimizer_state_name(h->opt, i - np));
}

static void item_slice(const td__holding *h, size_t i, td_param_slice *sl) {
    size_t np = params_of(h);
    td_model_param_slice(h->m, i < np ? i : (i - np) / per_param(h), sl);
}

static size_t numel_of(const td_param_slice *s) {
    size_t n = 1;
    for (int i = 0; i < s->ndim; i++)
        n *= (size_t)s->shape[i];
    return n;
}

/* The index of the item of h named `name`, or (size_t)-1. */
static size_t find_item(const td__holding *h, const char *name) {
    char buf[NAME_MAX_LEN];
    size_t all = params_of(h) + states_of(h);
    for (size_t i = 0; i < all; i++) {
        item_name(h, i, buf, sizeof buf);
        if (!strcmp(buf, name))
            return i;
    }
    return (size_t)-1;
}

/* The whole model's tensor names, parameters then optimizer state, each
 * once, in the order the holdings name them: *out (malloc'ed strings). */
static td_status whole_names(const td__holding *h, int n, char ***out, size_t *count) {
    size_t cap = 0, used = 0;
    char **names = NULL, buf[NAME_MAX_LEN];
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < n; k++) {
            size_t np = params_of(&h[k]), from = pass ? np : 0;
            size_t to = pass ? np + states_of(&h[k]) : np;
            for (size_t i = from; i < to; i++) {
                size_t j = 0;
                item_name(&h[k], i, buf, sizeof buf);
                while (j < used && strcmp(names[j], buf))
                    j++;
                if (j < used)
                    continue;
                if (used == cap) {
                    char **more = realloc(names, sizeof *names * (cap = cap ? 2 * cap : 64));
                    if (!more)
                        goto oom;
                    names = more;
                }
                if (!(names[used] = td__strdup(buf)))
                    goto oom;
                used++;
            }
        }
    *out = names;
    *count = used;
    return TD_OK;
oom:
    for (size_t j = 0; j < used; j++)
        free(names[j]);
    free(names);
    return td__error(TD_ERR_OUT_OF_MEMORY, "no memory for a checkpoint's names");
}

/* Puts the tensor `name` together from its holders into `whole` (host,
 * es-byte elements): from the first that holds it whole, else from every
 * holder's slice. *sl gets its slice in the first holder. */
static td_status gather(const td__holding *h, int n, const char *name, size_t es, void *whole) {
    td_status st = TD_OK;
    for (int k = 0; k < n && st == TD_OK; k++) {
        size_t i = find_item(&h[k], name), nb;
        td_param_slice sl;
        td_tensor *t;
        void *part;
        if (i == (size_t)-1)
            continue;
        t = item_tensor(&h[k], i);
        nb = td_tensor_nbytes(t);
        item_slice(&h[k], i, &sl);
        if (!(part = td__aligned_alloc(nb + 1, "a checkpoint's slice")))
            return TD_ERR_OUT_OF_MEMORY;
        st = td_tensor_read(t, part, nb);
        if (st == TD_OK)
            td_param_slice_gather(&sl, es, part, whole);
        free(part);
        if (sl.dim < 0)
            break; /* held whole: that holder's */
    }
    return st;
}

/* The whole tensor's shape: any holder's slice says it. */
static void whole_shape(const td__holding *h, int n, const char *name, td_param_slice *sl) {
    for (int k = 0; k < n; k++) {
        size_t i = find_item(&h[k], name);
        if (i != (size_t)-1) {
            item_slice(&h[k], i, sl);
            return;
        }
    }
    assert(!"a name no holding has");
}

td_status td__placement_save(const td__holding *h, int n, const char *path,
                             const td_train_state *state) {
    td_dtype dt = td_model_dtype(h[0].m);
    size_t es = td_dtype_size(dt), total = 0;
    char **names = NULL;
    td_ckpt_entry *e = NULL;
    td_status st;
    assert(n > 0);
    TD_CHECK(whole_names(h, n, &names, &total));
    if (!(e = td__calloc(sizeof *e * (total + 1), "a checkpoint's tensors"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto done;
    }
    st = TD_OK;
    for (size_t j = 0; j < total && st == TD_OK; j++) {
        td_param_slice sl;
        whole_shape(h, n, names[j], &sl);
        if (!(e[j].data = td__aligned_alloc(numel_of(&sl) * es + 1, "a whole tensor"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            break;
        }
        e[j].name = names[j];
        e[j].ndim = sl.ndim;
        memcpy(e[j].shape, sl.shape, sizeof e[j].shape);
        st = gather(h, n, names[j], es, (void *)e[j].data);
    }
    if (st == TD_OK)
        st = td_checkpoint_save_host(path, td_model_json(h[0].m), dt, e, total, h[0].opt != NULL,
                                     state);
done:
    for (size_t j = 0; j < total; j++) {
        if (e)
            free((void *)e[j].data);
        free(names[j]);
    }
    free(e);
    free(names);
    return st;
}

/* Writes the holder's slice of the file's tensor `name` into t. */
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

/* The file's model and dtype must be the holdings'; an optimizer's state
 * must be there when the holdings have optimizers. */
static td_status check_file(const td__holding *h, const char *path, const td_safetensors *sf,
                            const char *json, td_dtype dt) {
    const char *v = td_safetensors_meta(sf, "tandem.has_optimizer");
    if (strcmp(json, td_model_json(h->m)) != 0)
        return td__error(TD_ERR_SHAPE, "%s: holds another model than the one being loaded", path);
    if (dt != td_model_dtype(h->m))
        return td__error(TD_ERR_DTYPE, "%s: the checkpoint is %s; the model is %s", path,
                         td_dtype_name(dt), td_dtype_name(td_model_dtype(h->m)));
    if (h->opt && (!v || strcmp(v, "1") != 0))
        return td__error(TD_ERR_CORRUPT,
                         "%s: holds no optimizer state (saved with the weights only)", path);
    return TD_OK;
}

td_status td__placement_load(const td__holding *h, int n, const char *path, td_train_state *state) {
    td_safetensors *sf = NULL;
    td_train_state s;
    td_dtype dt;
    char *json = NULL, name[NAME_MAX_LEN];
    td_status st;
    TD_TRY(td_checkpoint_read_meta(path, &json, &dt, &s));
    TD_TRY(td_safetensors_load(path, &sf));
    if (!td_safetensors_has_checksum(sf)) {
        st = td__error(TD_ERR_CORRUPT, "%s: the checksum \"tandem.crc32\" is missing", path);
        goto fail;
    }
    TD_TRY(check_file(&h[0], path, sf, json, dt));
    for (int k = 0; k < n; k++) {
        size_t all = params_of(&h[k]) + states_of(&h[k]);
        for (size_t i = 0; i < all; i++) {
            td_param_slice sl;
            item_name(&h[k], i, name, sizeof name);
            item_slice(&h[k], i, &sl);
            TD_TRY(scatter(sf, name, &sl, item_tensor(&h[k], i)));
        }
        if (h[k].opt)
            td_optimizer_set_steps(h[k].opt, s.step);
    }
    if (state)
        *state = s;
    st = TD_OK;
fail:
    free(json);
    td_safetensors_destroy(sf);
    return st;
}

/* Writes the holder's slice of `whole` (host) into t. */
static td_status put_slice(const td_param_slice *sl, size_t es, const void *whole, td_tensor *t) {
    size_t nb = td_tensor_nbytes(t);
    void *part = td__aligned_alloc(nb + 1, "a slice");
    td_status st;
    if (!part)
        return TD_ERR_OUT_OF_MEMORY;
    td_param_slice_scatter(sl, es, whole, part);
    st = td_tensor_write(t, part, nb);
    free(part);
    return st;
}

td_status td__placement_copy(const td__holding *from, int nf, const td__holding *to, int nt,
                             int64_t steps) {
    size_t es = td_dtype_size(td_model_dtype(to[0].m)), total = 0;
    char **names = NULL;
    td_status st = TD_OK;
    TD_CHECK(whole_names(to, nt, &names, &total));
    for (size_t j = 0; j < total && st == TD_OK; j++) {
        td_param_slice whole_sl;
        void *whole;
        whole_shape(to, nt, names[j], &whole_sl);
        if (!(whole = td__aligned_alloc(numel_of(&whole_sl) * es + 1, "a whole tensor"))) {
            st = TD_ERR_OUT_OF_MEMORY;
            break;
        }
        st = gather(from, nf, names[j], es, whole);
        for (int k = 0; k < nt && st == TD_OK; k++) {
            size_t i = find_item(&to[k], names[j]);
            td_param_slice sl;
            if (i == (size_t)-1)
                continue;
            item_slice(&to[k], i, &sl);
            st = put_slice(&sl, es, whole, item_tensor(&to[k], i));
        }
        free(whole);
    }
    for (size_t j = 0; j < total; j++)
        free(names[j]);
    free(names);
    for (int k = 0; k < nt && st == TD_OK; k++)
        if (to[k].opt)
            td_optimizer_set_steps(to[k].opt, steps);
    return st;
}

int td__placement_covers(const td__holding *h, int n, const int *alive, char *lost, size_t size) {
    char name[NAME_MAX_LEN];
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < params_of(&h[k]); i++) {
            td_param_slice sl;
            int64_t held = 0, whole = 0;
            item_name(&h[k], i, name, sizeof name);
            for (int q = 0; q < n; q++) {
                size_t at = find_item(&h[q], name);
                if (at == (size_t)-1)
                    continue;
                item_slice(&h[q], at, &sl);
                /* block 0: of grouped blocks, the query heads, whose
                 * holders hold the key and value heads they read */
                whole = sl.dim < 0     ? 1
                        : sl.kv_extent ? sl.shape[sl.dim] - (sl.blocks - 1) * sl.kv_extent
                                       : sl.shape[sl.dim] / sl.blocks;
                /* block 0's slices of one tensor are disjoint: their counts add up */
                if (alive[q])
                    held += sl.dim < 0 ? 1 : sl.count;
            }
            if (held < whole) {
                snprintf(lost, size, "%s", name);
                return 0;
            }
        }
    return 1;
}
