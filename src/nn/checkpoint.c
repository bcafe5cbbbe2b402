/* Training checkpoints: a model, its optimizer and the run's position, in
 * one safetensors file. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "nn/checkpoint-impl.h"
#include "nn/nn-impl.h"
#include "nn/safetensors.h"
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

static td_status set_int(td_safetensors_writer *w, const char *key, long long v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return td_safetensors_writer_set_meta(w, key, buf);
}

td_status td_checkpoint_save(const char *path, td_model *m, td_optimizer *opt,
                             const td_train_state *state) {
    if (!m)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_save: path or model is NULL");
    return td_checkpoint_save_parts(path, &m, opt ? &opt : NULL, 1, state);
}

/* Every checkpoint's metadata: the format, the model, its dtype and the run state. */
static td_status write_meta(td_safetensors_writer *w, const char *path, const char *json,
                            td_dtype dtype, int has_opt, const td_train_state *state) {
    char *ojson = NULL, buf[32];
    td_status st;
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.format", TD_CKPT_FORMAT));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.version", TD_VERSION_STRING));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.model", json));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.dtype", td_dtype_name(dtype)));
    TD_TRY(set_int(w, "tandem.step", state->step));
    TD_TRY(set_int(w, "tandem.epoch", state->epoch));
    TD_TRY(set_int(w, "tandem.sample", state->sample));
    snprintf(buf, sizeof buf, "%" PRIu64, state->seed);
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.seed", buf));
    TD_TRY(set_int(w, "tandem.batch", state->batch));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.has_optimizer", has_opt ? "1" : "0"));
    if (!(ojson = opt_to_json(&state->opt))) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the metadata", path);
        goto fail;
    }
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.optimizer", ojson));
    if (state->vocab_len > 0) {
        char hex[2 * 256 + 1];
        int nv = state->vocab_len > 256 ? 256 : state->vocab_len;
        for (int i = 0; i < nv; i++)
            snprintf(hex + 2 * i, 3, "%02x", (unsigned char)state->vocab[i]);
        hex[2 * nv] = '\0';
        TD_TRY(td_safetensors_writer_set_meta(w, "tandem.vocab", hex));
    }
    if (state->split[0])
        TD_TRY(td_safetensors_writer_set_meta(w, "tandem.split", state->split));
    st = TD_OK;
fail:
    free(ojson);
    return st;
}

/* Adds part m's parameters, or with opt its optimizer's state, to w. */
static td_status add_part(td_safetensors_writer *w, const char *path, td_model *m,
                          td_optimizer *opt) {
    td_status st;
    if (!opt) {
        for (size_t i = 0; i < td_model_param_count(m); i++)
            TD_TRY(td_safetensors_writer_add_tensor(w, td_model_param_name(m, i),
                                                    td_model_param(m, i)));
        return TD_OK;
    }
    if (td_optimizer_shard_count(opt) > 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "%s: the optimizer holds one shard of %d (ZeRO-1); a checkpoint takes "
                         "the whole state (gather it first)",
                         path, td_optimizer_shard_count(opt));
    for (size_t i = 0; i < td_optimizer_state_count(opt); i++) {
        char name[512];
        snprintf(name, sizeof name, TD_OPT_PREFIX "%s", td_optimizer_state_name(opt, i));
        TD_TRY(td_safetensors_writer_add_tensor(w, name, td_optimizer_state(opt, i)));
    }
    return TD_OK;
fail:
    return st;
}

td_status td_checkpoint_save_parts(const char *path, td_model *const *parts,
                                   td_optimizer *const *opts, int n, const td_train_state *state) {
    td_safetensors_writer *w = NULL;
    td_train_state zero;
    td_model *m;
    td_status st;
    if (!path || !parts || n < 1 || !parts[0])
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_save: path or model is NULL");
    m = parts[0];
    for (int k = 1; k < n; k++)
        if (!parts[k] || strcmp(td_model_json(parts[k]), td_model_json(m)) != 0 ||
            td_model_dtype(parts[k]) != td_model_dtype(m))
            return td__error(TD_ERR_INVALID_ARG,
                             "%s: part %d is not a part of the same model in the same dtype", path,
                             k);
    if (!state) {
        memset(&zero, 0, sizeof zero);
        state = &zero;
    }
    TD_TRY(td_safetensors_writer_create(&w));
    /* Parameters first, then the optimizer's state, whatever the parts: the
     * file is the one a whole model writes. */
    for (int k = 0; k < n; k++)
        TD_TRY(add_part(w, path, parts[k], NULL));
    for (int k = 0; opts && k < n; k++)
        TD_TRY(add_part(w, path, parts[k], opts[k]));
    TD_TRY(write_meta(w, path, td_model_json(m), td_model_dtype(m), opts != NULL, state));
    TD_TRY(td_safetensors_writer_save(w, path));
    td_safetensors_writer_destroy(w);
    return TD_OK;
fail:
    td_safetensors_writer_destroy(w);
    return st;
}

td_status td_checkpoint_save_weights(const char *path, td_model *m, td_weights fmt,
                                     const td_train_state *state) {
    td_safetensors_writer *w = NULL;
    td_train_state zero;
    unsigned char *matrix = NULL;
    td_status st;
    if (!path || !m || fmt < TD_WEIGHTS_F32 || fmt > TD_WEIGHTS_Q8_0)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_save_weights: bad argument");
    if (fmt != TD_WEIGHTS_F32 && td_model_dtype(m) != TD_F32)
        return td__error(TD_ERR_DTYPE, "%s: %s weights are saved from an f32 model", path,
                         td_weights_name(fmt));
    memset(&zero, 0, sizeof zero);
    TD_TRY(td__model_matrix_flags(m, &matrix));
    TD_TRY(td_safetensors_writer_create(&w));
    for (size_t i = 0; i < td_model_param_count(m); i++)
        TD_TRY(matrix[i] && fmt != TD_WEIGHTS_F32
                   ? td__ckpt_add_compact(w, td_model_param_name(m, i), fmt, td_model_param(m, i))
                   : td_safetensors_writer_add_tensor(w, td_model_param_name(m, i),
                                                      td_model_param(m, i)));
    TD_TRY(write_meta(w, path, td_model_json(m), TD_F32, 0, state ? state : &zero));
    TD_TRY(td_safetensors_writer_set_meta(w, "tandem.weights", td_weights_name(fmt)));
    TD_TRY(td_safetensors_writer_save(w, path));
fail:
    free(matrix);
    td_safetensors_writer_destroy(w);
    return st;
}

td_status td_checkpoint_save_host(const char *path, const char *model_json, td_dtype dtype,
                                  const td_ckpt_entry *entries, size_t n, int has_optimizer,
                                  const td_train_state *state) {
    td_safetensors_writer *w = NULL;
    td_train_state zero;
    td_status st;
    if (!path || !model_json || (n && !entries))
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_save_host: NULL argument");
    if (!state) {
        memset(&zero, 0, sizeof zero);
        state = &zero;
    }
    TD_TRY(td_safetensors_writer_create(&w));
    for (size_t i = 0; i < n; i++)
        TD_TRY(td_safetensors_writer_add(w, entries[i].name, dtype, entries[i].ndim,
                                         entries[i].shape, entries[i].data));
    TD_TRY(write_meta(w, path, model_json, dtype, has_optimizer, state));
    TD_TRY(td_safetensors_writer_save(w, path));
    td_safetensors_writer_destroy(w);
    return TD_OK;
fail:
    td_safetensors_writer_destroy(w);
    return st;
}

/* Reading the metadata ----------------------------------------------------------
 *
 * Every field is range-checked, so that a damaged or hand-made file is an
 * error naming the field rather than a run that overflows a counter or
 * trains with another optimizer than the one saved. */

/* Counters (steps, epochs, samples) stay below this, leaving room to count on. */
#define META_MAX_COUNT ((long long)1 << 62)
/* The most samples td_model_train_step takes at once. */
#define META_MAX_BATCH ((long long)1 << 24)

static td_status meta_missing(const td_safetensors *sf, const char *key) {
    return td__error(TD_ERR_CORRUPT, "%s: metadata \"%s\" is missing", td_safetensors_name(sf),
                     key);
}

/* A metadata integer in [lo, hi]; missing, malformed or out of range is
 * TD_ERR_CORRUPT naming the key. */
static td_status meta_int(const td_safetensors *sf, const char *key, long long lo, long long hi,
                          long long *out) {
    const char *v = td_safetensors_meta(sf, key);
    char *end;
    long long x;
    if (!v)
        return meta_missing(sf, key);
    errno = 0;
    x = strtoll(v, &end, 10);
    if (!*v || *end || errno == ERANGE || x < lo || x > hi)
        return td__error(TD_ERR_CORRUPT,
                         "%s: metadata \"%s\" = \"%.40s\" is not an integer from %lld to %lld",
                         td_safetensors_name(sf), key, v, lo, hi);
    *out = x;
    return TD_OK;
}

/* The seed: any uint64_t, in decimal digits only (strtoull would take a sign). */
static td_status meta_seed(const td_safetensors *sf, uint64_t *out) {
    const char *v = td_safetensors_meta(sf, "tandem.seed");
    char *end;
    if (!v)
        return meta_missing(sf, "tandem.seed");
    errno = 0;
    *out = strtoull(v, &end, 10);
    if (*v < '0' || *v > '9' || *end || errno == ERANGE)
        return td__error(TD_ERR_CORRUPT,
                         "%s: metadata \"tandem.seed\" = \"%.40s\" is not an integer from 0 to "
                         "%" PRIu64,
                         td_safetensors_name(sf), v, UINT64_MAX);
    return TD_OK;
}

static td_status meta_format(const td_safetensors *sf) {
    const char *v = td_safetensors_meta(sf, "tandem.format");
    if (v && !strcmp(v, TD_CKPT_FORMAT))
        return TD_OK;
    return td__error(TD_ERR_CORRUPT,
                     "%s: not a tandem checkpoint (metadata \"tandem.format\" is %s%s%s)",
                     td_safetensors_name(sf), v ? "\"" : "", v ? v : "missing", v ? "\"" : "");
}

static td_status meta_has_optimizer(const td_safetensors *sf) {
    const char *v = td_safetensors_meta(sf, "tandem.has_optimizer");
    if (!v)
        return meta_missing(sf, "tandem.has_optimizer");
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return td__error(TD_ERR_CORRUPT,
                         "%s: metadata \"tandem.has_optimizer\" = \"%.40s\" is not 0 or 1",
                         td_safetensors_name(sf), v);
    return TD_OK;
}

static int hex_digit(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The optional text vocabulary: up to 256 bytes as pairs of hex digits. */
static td_status meta_vocab(const td_safetensors *sf, td_train_state *s) {
    const char *v = td_safetensors_meta(sf, "tandem.vocab");
    size_t n;
    if (!v)
        return TD_OK;
    n = strlen(v);
    if (n % 2 || n > 2 * 256)
        return td__error(TD_ERR_CORRUPT,
                         "%s: metadata \"tandem.vocab\" is not up to 256 bytes in hex",
                         td_safetensors_name(sf));
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hex_digit(v[2 * i]), lo = hex_digit(v[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return td__error(TD_ERR_CORRUPT,
                             "%s: metadata \"tandem.vocab\": \"%.2s\" at %zu is not a hex byte",
                             td_safetensors_name(sf), v + 2 * i, 2 * i);
        s->vocab[i] = (char)(hi << 4 | lo);
    }
    s->vocab_len = (int)(n / 2);
    return TD_OK;
}

static td_status opt_field_error(const char *file, const char *field, const char *what) {
    return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.optimizer\": \"%s\" %s", file, field,
                     what);
}

/* A real in [lo, hi], or [lo, hi) when hi_open; always finite. */
static td_status opt_real(const char *file, const char *field, double x, double lo, double hi,
                          int hi_open) {
    char what[96];
    if (isfinite(x) && x >= lo && (hi_open ? x < hi : x <= hi))
        return TD_OK;
    if (isinf(hi))
        snprintf(what, sizeof what, "= %g is not a finite number >= %g", x, lo);
    else
        snprintf(what, sizeof what, "= %g is not in [%g, %g%s", x, lo, hi, hi_open ? ")" : "]");
    return opt_field_error(file, field, what);
}

/* The names opt_to_json writes, and nothing else. */
static td_status opt_names(const char *file, const char *kind, const char *sched,
                           td_optimizer_config *c) {
    if (!strcmp(kind, "sgd"))
        c->kind = TD_OPT_SGD;
    else if (!strcmp(kind, "adamw"))
        c->kind = TD_OPT_ADAMW;
    else
        return opt_field_error(file, "kind", "is not \"sgd\" or \"adamw\"");
    if (!strcmp(sched, "constant"))
        c->schedule = TD_LR_CONSTANT;
    else if (!strcmp(sched, "cosine"))
        c->schedule = TD_LR_COSINE;
    else
        return opt_field_error(file, "schedule", "is not \"constant\" or \"cosine\"");
    return TD_OK;
}

/* The ranges td_optimizer_create accepts, field by field. */
static td_status opt_ranges(const char *file, const td_optimizer_config *c) {
    TD_CHECK(opt_real(file, "lr", c->lr, 0, INFINITY, 0));
    TD_CHECK(opt_real(file, "momentum", c->momentum, 0, 1, 1));
    TD_CHECK(opt_real(file, "beta1", c->beta1, 0, 1, 1));
    TD_CHECK(opt_real(file, "beta2", c->beta2, 0, 1, 1));
    TD_CHECK(opt_real(file, "eps", c->eps, 0, INFINITY, 0));
    TD_CHECK(opt_real(file, "weight_decay", c->weight_decay, 0, INFINITY, 0));
    TD_CHECK(opt_real(file, "clip_norm", c->clip_norm, 0, INFINITY, 0));
    TD_CHECK(opt_real(file, "min_lr", c->min_lr, 0, INFINITY, 0));
    if (c->warmup_steps < 0 || c->warmup_steps > META_MAX_COUNT)
        return opt_field_error(file, "warmup_steps", "is negative or too large");
    if (c->total_steps < 0 || c->total_steps > META_MAX_COUNT)
        return opt_field_error(file, "total_steps", "is negative or too large");
    return TD_OK;
}

static td_status opt_from_json(const char *file, const char *text, td_optimizer_config *c) {
    json_error_t e;
    json_t *o = json_loads(text, 0, &e);
    const char *kind = NULL, *sched = NULL;
    int nesterov = 0;
    json_int_t warm = 0, total = 0;
    td_status st;
    if (!o ||
        json_unpack_ex(o, &e, JSON_STRICT, "{s:s,s:F,s:F,s:b,s:F,s:F,s:F,s:F,s:F,s:s,s:I,s:I,s:F}",
                       "kind", &kind, "lr", &c->lr, "momentum", &c->momentum, "nesterov", &nesterov,
                       "beta1", &c->beta1, "beta2", &c->beta2, "eps", &c->eps, "weight_decay",
                       &c->weight_decay, "clip_norm", &c->clip_norm, "schedule", &sched,
                       "warmup_steps", &warm, "total_steps", &total, "min_lr", &c->min_lr) != 0) {
        json_decref(o);
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.optimizer\": %s", file, e.text);
    }
    c->nesterov = nesterov;
    c->warmup_steps = warm;
    c->total_steps = total;
    if ((st = opt_names(file, kind, sched, c)) == TD_OK)
        st = opt_ranges(file, c);
    json_decref(o);
    return st;
}

/* The optional "tandem.split": printable text that fits td_train_state. */
static td_status meta_split(const td_safetensors *sf, td_train_state *s) {
    const char *v = td_safetensors_meta(sf, "tandem.split");
    if (!v)
        return TD_OK; /* written before splits were recorded, or by one device */
    if (strlen(v) >= sizeof s->split)
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.split\" is longer than %zu bytes",
                         td_safetensors_name(sf), sizeof s->split - 1);
    for (const char *c = v; *c; c++)
        if (*c < ' ' || *c > '~')
            return td__error(TD_ERR_CORRUPT,
                             "%s: metadata \"tandem.split\" has a byte 0x%02x that is not text",
                             td_safetensors_name(sf), (unsigned char)*c);
    memcpy(s->split, v, strlen(v) + 1);
    return TD_OK;
}

static td_status read_state(const td_safetensors *sf, td_train_state *s) {
    const char *v;
    long long x;
    memset(s, 0, sizeof *s);
    TD_CHECK(meta_format(sf));
    TD_CHECK(meta_int(sf, "tandem.step", 0, META_MAX_COUNT, &x));
    s->step = x;
    TD_CHECK(meta_int(sf, "tandem.epoch", 0, META_MAX_COUNT, &x));
    s->epoch = x;
    TD_CHECK(meta_int(sf, "tandem.sample", 0, META_MAX_COUNT, &x));
    s->sample = x;
    TD_CHECK(meta_int(sf, "tandem.batch", 0, META_MAX_BATCH, &x));
    s->batch = x;
    TD_CHECK(meta_seed(sf, &s->seed));
    TD_CHECK(meta_has_optimizer(sf));
    if (!(v = td_safetensors_meta(sf, "tandem.optimizer")))
        return meta_missing(sf, "tandem.optimizer");
    TD_CHECK(opt_from_json(td_safetensors_name(sf), v, &s->opt));
    TD_CHECK(meta_split(sf, s));
    return meta_vocab(sf, s);
}

static td_status load_converted(const char *path, const td_safetensors *sf, td_model *m, size_t i,
                                const char *missing_from);

static int holds_optimizer(const td_safetensors *sf) {
    const char *v = td_safetensors_meta(sf, "tandem.has_optimizer");
    return v && !strcmp(v, "1");
}

/* Optimizer state is kept exactly: F32 or F64 (the reader checks which). */
static td_status check_exact(const td_safetensors *sf, const td_st_tensor *t) {
    const char *dt = t ? td__safetensors_dtype(sf, t) : "F32";
    if (strcmp(dt, "F32") != 0 && strcmp(dt, "F64") != 0)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: tensor %s has dtype %s; optimizer state is F32 "
                         "or F64",
                         td_safetensors_name(sf), t->name, dt);
    return TD_OK;
}

/* Parameter i from sf: exactly when the file holds it in the model's dtype,
 * else converted (compact weights among others). */
static td_status read_param(const td_safetensors *sf, td_model *m, size_t i) {
    const char *name = td_model_param_name(m, i);
    const td_st_tensor *t = td_safetensors_find(sf, name);
    const char *want = td_model_dtype(m) == TD_F64 ? "F64" : "F32";
    if (t && !strcmp(td__safetensors_dtype(sf, t), want))
        return td_safetensors_read_tensor(sf, name, td_model_param(m, i));
    return load_converted(td_safetensors_name(sf), sf, m, i, NULL);
}

/* Loads the verified file sf into m and opt. A whole model must hold every
 * tensor of the file; a part (whole 0) must be a part of the file's model. */
static td_status load_into(const td_safetensors *sf, td_model *m, td_optimizer *opt, int whole,
                           td_train_state *state) {
    const char *file = td_safetensors_name(sf), *v;
    td_train_state s;
    td_status st;
    TD_CHECK(read_state(sf, &s));
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
    if (!whole && (!(v = td_safetensors_meta(sf, "tandem.model")) || strcmp(v, td_model_json(m))))
        return td__error(TD_ERR_SHAPE, "%s: holds another model than the one being loaded", file);
    for (size_t i = 0; i < td_model_param_count(m); i++)
        TD_TRY(read_param(sf, m, i));
    TD_TRY(td__ckpt_weights_meta(sf, &m->weights));
    TD_TRY(td__model_take_default_weights(m));
    if (opt && m->weights != TD_WEIGHTS_F32 && !holds_optimizer(sf)) {
        TD_LOG_INFO("%s: compact weights without optimizer state: the optimizer keeps its own",
                    file);
    } else if (opt) {
        v = td_safetensors_meta(sf, "tandem.has_optimizer");
        if (!v || strcmp(v, "1") != 0)
            return td__error(TD_ERR_CORRUPT,
                             "%s: holds no optimizer state (saved with the weights only)", file);
        for (size_t i = 0; i < td_optimizer_state_count(opt); i++) {
            char name[512];
            snprintf(name, sizeof name, TD_OPT_PREFIX "%s", td_optimizer_state_name(opt, i));
            TD_TRY(check_exact(sf, td_safetensors_find(sf, name)));
            TD_TRY(td_safetensors_read_tensor(sf, name, td_optimizer_state(opt, i)));
        }
        td_optimizer_set_steps(opt, s.step);
    }
    /* Every tensor must belong to the model (a bigger model's file is not this one's). */
    for (size_t i = 0; whole && i < td_safetensors_count(sf); i++) {
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

/* The model JSON and dtype a checkpoint's metadata holds. */
static td_status model_meta(const td_safetensors *sf, const char **json, td_dtype *dtype) {
    const char *path = td_safetensors_name(sf), *dt;
    if (!(*json = td_safetensors_meta(sf, "tandem.model")))
        return td__error(TD_ERR_CORRUPT,
                         "%s: metadata \"tandem.model\" (the model JSON) is missing", path);
    dt = td_safetensors_meta(sf, "tandem.dtype");
    if (!dt || (strcmp(dt, "f32") != 0 && strcmp(dt, "f64") != 0))
        return td__error(TD_ERR_CORRUPT, "%s: metadata \"tandem.dtype\" is missing or not f32/f64",
                         path);
    *dtype = !strcmp(dt, "f64") ? TD_F64 : TD_F32;
    return TD_OK;
}

td_status td_checkpoint_read_meta(const char *path, char **model_json, td_dtype *dtype,
                                  td_train_state *state) {
    td_safetensors *sf = NULL;
    td_train_state s;
    const char *json;
    td_status st;
    if (!path || !model_json || !dtype)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_read_meta: NULL argument");
    *model_json = NULL;
    TD_TRY(td__safetensors_load_any(path, &sf));
    TD_TRY(model_meta(sf, &json, dtype));
    TD_TRY(read_state(sf, &s));
    if (!(*model_json = strdup(json))) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the model JSON", path);
        goto fail;
    }
    if (state)
        *state = s;
    td_safetensors_destroy(sf);
    return TD_OK;
fail:
    td_safetensors_destroy(sf);
    return st;
}

/* Loads the file at path into m and opt (see load_into for whole). */
static td_status load_file(const char *path, td_model *m, td_optimizer *opt, int whole,
                           td_train_state *state) {
    td_safetensors *sf = NULL;
    td_status st;
    if (!path || !m)
        return td__error(TD_ERR_INVALID_ARG, "%s: path or model is NULL",
                         whole ? "td_checkpoint_load" : "td_checkpoint_load_part");
    if ((st = td__safetensors_load_any(path, &sf)) == TD_OK)
        st = load_into(sf, m, opt, whole, state);
    td_safetensors_destroy(sf);
    return st;
}

td_status td_checkpoint_load_part(const char *path, td_model *m, td_optimizer *opt,
                                  td_train_state *state) {
    return load_file(path, m, opt, 0, state);
}

td_status td_checkpoint_load(const char *path, td_model *m, td_optimizer *opt,
                             td_train_state *state) {
    return load_file(path, m, opt, 1, state);
}

td_status td_checkpoint_load_model(const char *path, td_device *dev, td_model **out,
                                   td_train_state *state) {
    td_safetensors *sf = NULL;
    td_model *m = NULL;
    td_train_state s;
    const char *json;
    td_dtype dtype;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_load_model: out is NULL");
    *out = NULL;
    if (!path || !dev)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_load_model: path or device is NULL");
    TD_TRY(td__safetensors_load_any(path, &sf));
    TD_TRY(model_meta(sf, &json, &dtype));
    /* The model's seed also keys its dropout streams: a resumed run needs the same one. */
    TD_TRY(read_state(sf, &s));
    TD_TRY(td_model_load_string(json, path, dev, dtype, s.seed, &m));
    TD_TRY(load_into(sf, m, NULL, 1, state));
    td_safetensors_destroy(sf);
    *out = m;
    return TD_OK;
fail:
    td_model_destroy(m);
    td_safetensors_destroy(sf);
    return st;
}

/* Weights in either precision --------------------------------------------------- */

/* Parameter i of m: its whole tensor converted, then its slice written (a
 * whole parameter straight from the conversion: the peak of memory while a
 * model loads is a big table's f64 copies). */
static td_status load_converted(const char *path, const td_safetensors *sf, td_model *m, size_t i,
                                const char *missing_from) {
    td_tensor *p = td_model_param(m, i);
    const char *name = td_model_param_name(m, i);
    const td_st_tensor *t = td_safetensors_find(sf, name);
    if (!t && missing_from)
        t = td_safetensors_find(sf, missing_from);
    size_t numel = td_tensor_numel(p), nwhole = 1;
    double *whole, *part;
    td_param_slice sl;
    td_status st;
    td_model_param_slice(m, i, &sl);
    if (!t)
        return td__error(TD_ERR_CORRUPT, "%s: tensor %s is missing", path, name);
    for (int d = 0; d < sl.ndim; d++)
        nwhole *= (size_t)sl.shape[d];
    whole = malloc((nwhole ? nwhole : 1) * sizeof *whole);
    part = sl.dim < 0 ? whole : malloc((numel ? numel : 1) * sizeof *part);
    if (!whole || !part) {
        free(whole);
        free(part);
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no host memory to convert tensor %s", path,
                         name);
    }
    if ((st = td__ckpt_values(sf, t, sl.ndim, sl.shape, whole)) == TD_OK) {
        if (part != whole)
            td_param_slice_scatter(&sl, sizeof *whole, whole, part);
        st = td_tensor_write_f64(p, part, numel);
    }
    if (part != whole)
        free(part);
    free(whole);
    return st;
}

td_status td_checkpoint_load_weights_alias(const char *path, td_model *m,
                                           const char *missing_from) {
    td_safetensors *sf = NULL;
    td_status st = TD_OK;
    if (!path || !m)
        return td__error(TD_ERR_INVALID_ARG, "td_checkpoint_load_weights: path or model is NULL");
    TD_CHECK(td__safetensors_load_any(path, &sf));
    for (size_t i = 0; i < td_model_param_count(m) && st == TD_OK; i++)
        st = load_converted(path, sf, m, i, missing_from);
    if (st == TD_OK)
        st = td__ckpt_weights_meta(sf, &m->weights);
    if (st == TD_OK)
        st = td__model_take_default_weights(m);
    td_safetensors_destroy(sf);
    return st;
}

td_status td_checkpoint_load_weights(const char *path, td_model *m) {
    return td_checkpoint_load_weights_alias(path, m, NULL);
}
