/* Training checkpoints: a model, its optimizer and the run's position, in
 * one safetensors file. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tandem/checkpoint.h"

#define TD_CKPT_FORMAT "tandem-checkpoint-1"
#define TD_OPT_PREFIX  "optimizer."

static const char *opt_kind_name(td_optimizer_kind k) {
    return k == TD_OPT_ADAMW ? "adamw" : "sgd";
}

/* The optimizer configuration as JSON text (malloc'ed), doubles exact. */
static char *opt_to_json(const td_optimizer_config *c) {
    json_t *o = json_pack("{s:s,s:f,s:f,s:b,s:f,s:f,s:f,s:f,s:f,s:s,s:I,s:I,s:f}", "kind",
                          opt_kind_name(c->kind), "lr", c->lr, "momentum", c->momentum, "nesterov",
                          c->nesterov, "beta1", c->beta1, "beta2", c->beta2, "eps", c->eps,
                          "weight_decay", c->weight_decay, "clip_norm", c->clip_norm, "schedule",
                          c->schedule == TD_LR_COSINE ? "cosine" : "constant", "warmup_steps",
                          (json_int_t)c->warmup_steps, "total_steps", (json_int_t)c->total_steps,
                          "min_lr", c->min_lr);
    char *s =
        o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    return s;
}

static td_status opt_from_json(const char *file, const char *text, td_optimizer_config *c) {
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    const char *kind = NULL, *sched = NULL;
    int nesterov = 0;
    json_int_t warm = 0, total = 0;
    if (!o ||
        json_unpack_ex(o, &e, 0, "{s:s,s:F,s:F,s:b,s:F,s:F,s:F,s:F,s:F,s:s,s:I,s:I,s:F}", "kind",
                       &kind, "lr", &c->lr, "momentum", &c->momentum, "nesterov", &nesterov,
                       "beta1", &c->beta1, "beta2", &c->beta2, "eps", &c->eps, "weight_decay",
                       &c->weight_decay, "clip_norm", &c->clip_norm, "schedule", &sched,
                       "warmup_steps", &warm, "total_steps", &total, "min_lr", &c->min_lr) != 0) {
        json_decref(o);
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.optimizer\": %s", file, e.text);
    }
    c->kind = !strcmp(kind, "adamw") ? TD_OPT_ADAMW : TD_OPT_SGD;
    c->schedule = !strcmp(sched, "cosine") ? TD_LR_COSINE : TD_LR_CONSTANT;
    c->nesterov = nesterov;
    c->warmup_steps = warm;
    c->total_steps = total;
    json_decref(o);
    return TD_OK;
}

static td_status set_int(td_safetensors_writer *w, const char *key, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return td_safetensors_writer_set_meta(w, key, buf);
}

td_status td_checkpoint_save(const char *path, td_model *m, td_optimizer *opt,
                             const td_train_state *state) {
    td_safetensors_writer *w = NULL;
    td_train_state zero;
    char *ojson = NULL, buf[32];
    td_status st;
    if (!path || !m)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_save: path or model is NULL");
    if (td_optimizer_shard_count(opt) > 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: the optimizer holds one shard of %d (ZeRO-1); a checkpoint takes "
                         "the whole state (gather it first)",
                         path, td_optimizer_shard_count(opt));
    if (!state) {
        memset(&zero, 0, sizeof zero);
        state = &zero;
    }
    TD_TRY(td_safetensors_writer_create(&w));
    for (size_t i = 0; i < td_model_param_count(m); i++)
        TD_TRY(
            td_safetensors_writer_add_tensor(w, td_model_param_name(m, i), td_model_param(m, i)));
    if (opt)
        for (size_t i = 0; i < td_optimizer_state_count(opt); i++) {
            char name[512];
            snprintf(name, sizeof name, TD_OPT_PREFIX "%s", td_optimizer_state_name(opt, i));
            TD_TRY(td_safetensors_writer_add_tensor(w, name, td_optimizer_state(opt, i)));
        }
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.format", TD_CKPT_FORMAT));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.version", TD_VERSION_STRING));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.model", td_model_json(m)));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.dtype", td_dtype_name(td_model_dtype(m))));
    TD_TRY(set_int(w, "tandem.step", state->step));
    TD_TRY(set_int(w, "tandem.epoch", state->epoch));
    TD_TRY(set_int(w, "tandem.sample", state->sample));
    snprintf(buf, sizeof buf, "%" PRIu64, state->seed);
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.seed", buf));
    TD_TRY(set_int(w, "tandem.batch", state->batch));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.has_optimizer", opt ? "1" : "0"));
    if (!(ojson = opt_to_json(&state->opt))) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the metadata", path);
        goto fail;
    }
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.optimizer", ojson));
    if (state->vocab_len > 0) {
        char hex[2 * 256 + 1];
        int n = state->vocab_len > 256 ? 256 : state->vocab_len;
        for (int i = 0; i < n; i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)state->vocab[i]);
        hex[2 * n] = '\0';
        TD_TRY(td_safetensors_writer_set_meta(w, "tandem.vocab", hex));
    }
    TD_TRY(td_safetensors_writer_save(w, path));
    free(ojson);
    td_safetensors_writer_destroy(w);
    return TD_OK;
fail:
    free(ojson);
    td_safetensors_writer_destroy(w);
    return st;
}

/* A metadata integer; missing or malformed is TD_ERR_CORRUPT naming the key. */
static td_status meta_int(const td_safetensors *sf, const char *key, long long lo, long long *out) {
    const char *v = td_safetensors_meta(sf, key);
    char *end;
    long long x;
    if (!v)
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"%s\" is missing", td_safetensors_name(sf),
                         key);
    x = strtoll(v, &end, 10);
    if (!*v || *end || x < lo)
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"%s\" = \"%.40s\" is not a valid integer",
                         td_safetensors_name(sf), key, v);
    *out = x;
    return TD_OK;
}

static td_status read_state(const td_safetensors *sf, td_train_state *s) {
    const char *file = td_safetensors_name(sf), *v;
    long long x;
    td_status st;
    memset(s, 0, sizeof *s);
    TD_TRY(meta_int(sf, "tandem.step", 0, &x));
    s->step = x;
    TD_TRY(meta_int(sf, "tandem.epoch", 0, &x));
    s->epoch = x;
    TD_TRY(meta_int(sf, "tandem.sample", 0, &x));
    s->sample = x;
    TD_TRY(meta_int(sf, "tandem.batch", 0, &x));
    s->batch = x;
    if (!(v = td_safetensors_meta(sf, "tandem.seed")))
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.seed\" is missing", file);
    s->seed = strtoull(v, NULL, 10);
    if (!(v = td_safetensors_meta(sf, "tandem.optimizer")))
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.optimizer\" is missing", file);
    TD_TRY(opt_from_json(file, v, &s->opt));
    if ((v = td_safetensors_meta(sf, "tandem.vocab"))) {
        size_t n = strlen(v);
        if (n % 2 || n > 512)
            return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.vocab\" is not hex bytes",
                             file);
        for (size_t i = 0; i < n / 2; i++) {
            unsigned b;
            if (sscanf(v + 2 * i, "%2x", &b) != 1)
                return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.vocab\" is not hex bytes",
                                 file);
            s->vocab[i] = (char)b;
        }
        s->vocab_len = (int)(n / 2);
    }
    return TD_OK;
fail:
    return st;
}

/* Loads the verified file sf into m and opt. */
static td_status load_into(const td_safetensors *sf, td_model *m, td_optimizer *opt,
                           td_train_state *state) {
    const char *file = td_safetensors_name(sf), *v;
    td_train_state s;
    td_status st;
    if (!(v = td_safetensors_meta(sf, "tandem.format")) || strcmp(v, TD_CKPT_FORMAT) != 0)
        return td__error(TD_ERR_CORRUPT,
                         "%s: not a tandem checkpoint (metadata \"tandem.format\" is %s%s%s)", file,
                         v ? "\"" : "", v ? v : "missing", v ? "\"" : "");
    if (!td_safetensors_has_checksum(sf))
        return td__error(TD_ERR_CORRUPT, "%s: the checksum \"tandem.crc32\" is missing", file);
    if ((v = td_safetensors_meta(sf, "tandem.dtype")) &&
        strcmp(v, td_dtype_name(td_model_dtype(m))) != 0)
        return td__error(TD_ERR_DTYPE, "%s: the checkpoint is %s; the model is %s", file, v,
                         td_dtype_name(td_model_dtype(m)));
    if (td_optimizer_shard_count(opt) > 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: the optimizer holds one shard of %d (ZeRO-1); load the whole "
                         "state, then hand each member its shard",
                         file, td_optimizer_shard_count(opt));
    TD_TRY(read_state(sf, &s));
    for (size_t i = 0; i < td_model_param_count(m); i++)
        TD_TRY(td_safetensors_read_tensor(sf, td_model_param_name(m, i), td_model_param(m, i)));
    if (opt) {
        v = td_safetensors_meta(sf, "tandem.has_optimizer");
        if (!v || strcmp(v, "1") != 0)
            return td__error(TD_ERR_CORRUPT,
                             "%s: holds no optimizer state (saved with the weights only)", file);
        for (size_t i = 0; i < td_optimizer_state_count(opt); i++) {
            char name[512];
            snprintf(name, sizeof name, TD_OPT_PREFIX "%s", td_optimizer_state_name(opt, i));
            TD_TRY(td_safetensors_read_tensor(sf, name, td_optimizer_state(opt, i)));
        }
        td_optimizer_set_steps(opt, s.step);
    }
    /* Every tensor must belong to the model (a bigger model's file is not this one's). */
    for (size_t i = 0; i < td_safetensors_count(sf); i++) {
        const char *name = td_safetensors_tensor(sf, i)->name;
        int found = 0;
        if (!strncmp(name, TD_OPT_PREFIX, strlen(TD_OPT_PREFIX))) {
            found = !opt; /* ignored when the optimizer is not wanted */
            for (size_t k = 0; opt && !found && k < td_optimizer_state_count(opt); k++)
                found = !strcmp(name + strlen(TD_OPT_PREFIX), td_optimizer_state_name(opt, k));
        } else {
            for (size_t k = 0; !found && k < td_model_param_count(m); k++)
                found = !strcmp(name, td_model_param_name(m, k));
        }
        if (!found)
            return td__error(TD_ERR_SHAPE, "%s: tensor \"%s\" is not part of this model%s", file,
                             name, opt ? " and optimizer" : "");
    }
    if (state)
        *state = s;
    return TD_OK;
fail:
    return st;
}

td_status td_checkpoint_load(const char *path, td_model *m, td_optimizer *opt,
                             td_train_state *state) {
    td_safetensors *sf = NULL;
    td_status st;
    if (!path || !m)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_load: path or model is NULL");
    TD_TRY(td_safetensors_load(path, &sf));
    TD_TRY(load_into(sf, m, opt, state));
    td_safetensors_destroy(sf);
    return TD_OK;
fail:
    td_safetensors_destroy(sf);
    return st;
}

td_status td_checkpoint_load_model(const char *path, td_device *dev, td_model **out,
                                   td_train_state *state) {
    td_safetensors *sf = NULL;
    td_model *m = NULL;
    td_train_state s;
    const char *json, *dt;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_load_model: out is NULL");
    *out = NULL;
    if (!path || !dev)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_load_model: path or device is NULL");
    TD_TRY(td_safetensors_load(path, &sf));
    if (!(json = td_safetensors_meta(sf, "tandem.model"))) {
        st = td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.model\" (the model JSON) is missing",
                       path);
        goto fail;
    }
    dt = td_safetensors_meta(sf, "tandem.dtype");
    if (!dt || (strcmp(dt, "f32") != 0 && strcmp(dt, "f64") != 0)) {
        st = td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.dtype\" is missing or not f32/f64",
                       path);
        goto fail;
    }
    /* The model's seed also keys its dropout streams: a resumed run needs the same one. */
    TD_TRY(read_state(sf, &s));
    TD_TRY(td_model_load_string(json, path, dev, !strcmp(dt, "f64") ? TD_F64 : TD_F32, s.seed, &m));
    TD_TRY(load_into(sf, m, NULL, state));
    td_safetensors_destroy(sf);
    *out = m;
    return TD_OK;
fail:
    td_model_destroy(m);
    td_safetensors_destroy(sf);
    return st;
}
