/* The generator: prefill the prompt, then choose one token at a time from
 * the decoder's logits (greedy, or sampled with temperature, top-k and
 * top-p from a counter-based random stream), sliding the window when the
 * context is full. Also loading a checkpoint's model in either precision. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tandem/checkpoint.h"
#include "tandem/generate.h"

/* Choosing a token ------------------------------------------------------------------ */

typedef struct candidate {
    int32_t id;
    double score; /* logit / temperature, then its weight */
} candidate;

/* Likeliest first; ties to the lower id, so every choice is reproducible. */
static int likelier_first(const void *pa, const void *pb) {
    const candidate *a = pa, *b = pb;
    if (a->score != b->score)
        return a->score > b->score ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static td_status check_config(const td_generate_config *cfg, int64_t vocab) {
    if (!(cfg->temperature >= 0) || !isfinite(cfg->temperature))
        return td__error(TD_ERR_INVALID_ARG, "generate: temperature %g is not a number >= 0",
                         cfg->temperature);
    if (cfg->top_k < 0)
        return td__error(TD_ERR_INVALID_ARG, "generate: top_k %lld is negative",
                         (long long)cfg->top_k);
    if (!(cfg->top_p > 0 && cfg->top_p <= 1))
        return td__error(TD_ERR_INVALID_ARG, "generate: top_p %g is outside (0, 1]", cfg->top_p);
    if (cfg->tokens < 0 || cfg->tokens > TD_GENERATE_MAX_TOKENS)
        return td__error_setting(TD_ERR_INVALID_ARG, "tokens",
                                 "generate: %lld tokens is outside [0, %lld] (`tokens`)",
                                 (long long)cfg->tokens, (long long)TD_GENERATE_MAX_TOKENS);
    if (cfg->token_limit < 0 || cfg->token_limit > vocab)
        return td__error(TD_ERR_INVALID_ARG,
                         "generate: token limit %lld is outside [0, %lld] (the vocabulary)",
                         (long long)cfg->token_limit, (long long)vocab);
    return TD_OK;
}

static int32_t arg_max(const double *logits, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return (int32_t)best;
}

/* How many of the sorted candidates top-p keeps: the fewest whose weights
 * reach p of the total (at least one). */
static int64_t nucleus(const candidate *c, int64_t k, double total, double p) {
    double sum = 0;
    for (int64_t i = 0; i < k; i++) {
        sum += c[i].score;
        if (sum >= p * total)
            return i + 1;
    }
    return k;
}

/* Weights exp((s - s_max)) over the k likeliest, then one draw. */
static int32_t sample(candidate *c, int64_t n, const td_generate_config *cfg, uint64_t index) {
    int64_t k = cfg->top_k > 0 && cfg->top_k < n ? cfg->top_k : n;
    double top = c[0].score, total = 0, u, sum = 0;
    for (int64_t i = 0; i < k; i++) {
        c[i].score = exp(c[i].score - top);
        total += c[i].score;
    }
    if (cfg->top_p < 1) {
        k = nucleus(c, k, total, cfg->top_p);
        total = 0;
        for (int64_t i = 0; i < k; i++)
            total += c[i].score;
    }
    u = td_rng_uniform(cfg->seed, index) * total;
    for (int64_t i = 0; i < k; i++) {
        sum += c[i].score;
        if (u < sum)
            return c[i].id;
    }
    return c[k - 1].id;
}

td_status td_generate_choose(const double *logits, int64_t vocab, const td_generate_config *cfg,
                             uint64_t index, int32_t *token) {
    candidate *c;
    int64_t n;
    if (!logits || !cfg || !token || vocab < 1)
        return td__error(TD_ERR_INVALID_ARG, "td_generate_choose: bad arguments");
    TD_CHECK(check_config(cfg, vocab));
    n = cfg->token_limit ? cfg->token_limit : vocab;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(logits[i]))
            return td__error(TD_ERR_INVALID_ARG,
                             "generate: the logit of token %lld is %g; the model's weights or "
                             "input are broken",
                             (long long)i, logits[i]);
    if (cfg->temperature == 0) {
        *token = arg_max(logits, n);
        return TD_OK;
    }
    if (!(c = td__calloc((size_t)n * sizeof *c, "sampling candidates")))
        return TD_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) {
        c[i].id = (int32_t)i;
        c[i].score = logits[i] / cfg->temperature;
    }
    qsort(c, (size_t)n, sizeof *c, likelier_first);
    *token = sample(c, n, cfg, index);
    free(c);
    return TD_OK;
}

/* Generating ---------------------------------------------------------------------- */

static double ms_since(uint64_t t0) {
    return (double)(td_clock_ns() - t0) * 1e-6;
}

/* The next position's logits after `token`: a step, or, with the cache
 * full, a prefill of the window's last `keep` tokens (token the last). */
static td_status advance(td_decoder *d, int32_t *win, int64_t keep, int32_t token, double *logits,
                         td_generate_stats *s) {
    int64_t pos = td_decoder_position(d), ctx = td_decoder_context(d);
    if (pos < ctx) {
        win[pos] = token;
        return td_decoder_step(d, token, logits);
    }
    memmove(win, win + ctx - (keep - 1), (size_t)(keep - 1) * sizeof *win);
    win[keep - 1] = token;
    s->slides++;
    return td_decoder_prefill(d, win, keep, logits);
}

td_status td_generate(td_decoder *d, const int32_t *prompt, int64_t n,
                      const td_generate_config *cfg, td_token_fn fn, void *arg,
                      td_generate_stats *stats) {
    td_generate_stats s = {0, 0, 0, 0, 0};
    int64_t ctx, vocab, start, keep;
    int32_t *win = NULL, token;
    double *logits = NULL;
    uint64_t t0;
    td_status st;
    if (!d || !prompt || !cfg) {
        st = td__error(TD_ERR_INVALID_ARG, "td_generate: decoder, prompt or config is NULL");
        goto fail;
    }
    ctx = td_decoder_context(d);
    vocab = td_decoder_vocab(d);
    keep = ctx / 2 > 1 ? ctx / 2 : 1;
    if (n < 1) {
        st = td__error(TD_ERR_INVALID_ARG, "td_generate: the prompt is empty");
        goto fail;
    }
    TD_TRY(check_config(cfg, vocab));
    if (!(win = td__calloc((size_t)ctx * sizeof *win, "the generation window")) ||
        !(logits = td__calloc((size_t)vocab * sizeof *logits, "logits"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    /* a prompt longer than the context: its last window */
    start = n < ctx ? n : ctx;
    memcpy(win, prompt + (n - start), (size_t)start * sizeof *win);
    t0 = td_clock_ns();
    TD_TRY(td_decoder_prefill(d, win, start, logits));
    s.prompt_tokens = start;
    s.prefill_ms = ms_since(t0);
    for (int64_t i = 0; i < cfg->tokens; i++) {
        t0 = td_clock_ns();
        TD_TRY(td_generate_choose(logits, vocab, cfg, (uint64_t)i, &token));
        s.decode_ms += ms_since(t0);
        s.generated_tokens++;
        if ((fn && fn(arg, token)) || i + 1 == cfg->tokens)
            break;
        t0 = td_clock_ns();
        TD_TRY(advance(d, win, keep, token, logits, &s));
        s.decode_ms += ms_since(t0);
    }
    st = TD_OK;
fail:
    free(win);
    free(logits);
    if (stats)
        *stats = s;
    return st;
}

/* Loading a checkpoint in either precision ---------------------------------------- */

td_status td_generate_load_model(const char *checkpoint, td_device *dev, td_dtype dtype,
                                 td_model **out) {
    char *json = NULL;
    td_dtype saved;
    td_model *m = NULL;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_generate_load_model: out is NULL");
    *out = NULL;
    if (!checkpoint || !dev)
        return td__error(TD_ERR_INVALID_ARG, "td_generate_load_model: path or device is NULL");
    TD_TRY(td_checkpoint_read_meta(checkpoint, &json, &saved, NULL));
    TD_TRY(td_model_load_string(json, checkpoint, dev, dtype, 0, &m));
    if (saved == dtype)
        TD_TRY(td_checkpoint_load(checkpoint, m, NULL, NULL));
    else
        TD_TRY(td_checkpoint_load_weights(checkpoint, m));
    *out = m;
    m = NULL;
fail:
    td_model_destroy(m);
    free(json);
    return st;
}
