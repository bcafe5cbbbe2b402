/* Pipeline-parallel generation: the model's layers cut into consecutive
 * stages, one per device, each a model part with a decoder that keeps the
 * cache of its own attention layers. A pass runs the stages in order from
 * the calling thread: the first reads the tokens, each later one copies the
 * rows the one before it gave, the last gives the logits. One sequence
 * leaves nothing to overlap, so this is for a model too big for one device,
 * not for speed: the weights are cut in proportion to each device's
 * measured speed at reading them, so every device's part of a token takes
 * about as long.
 *
 * pipeline:P,tensor:N makes each stage N consecutive devices that split its
 * layers as `tensor` does (tp_decode.c): every member of a stage runs the
 * stage's pass on its own thread, their partial results summed within the
 * stage, and the next stage reads the first member's rows. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/pipeline-impl.h"
#include "parallel/strategy-impl.h"
#include "tensor/view.h"

/* A stage: its members' part models (shards when members > 1) and their
 * decoders, which own the models once built; d[0] NULL: an empty stage. */
typedef struct pstage {
    int members;
    td_device *dev[TD_DP_MAX_MEMBERS];
    td_group *g; /* the members' group (tensor stages) */
    td_model *m[TD_DP_MAX_MEMBERS];
    td_decoder *d[TD_DP_MAX_MEMBERS];
} pstage;

typedef struct pipe_dec {
    int n;
    pstage st[TD_PP_MAX_STAGES];
    /* the stage pass under way */
    const int32_t *tokens;
    const td_buffer *in;
    int64_t pos, n_rows;
    double *logits;
} pipe_dec;

/* The sum of a tensor stage's partial results, within the stage. */
static td_status stage_reduce(void *arg, td_tensor *t) {
    td_group *g = arg;
    td_buffer b = td__tensor_as_buffer(t);
    return td_allreduce(g, &b, 0, &b, 0, td_tensor_numel(t), td_tensor_dtype(t), TD_REDUCE_SUM);
}

typedef struct stage_call {
    pipe_dec *p;
    pstage *s;
    int last;
} stage_call;

static td_status member_pass(td_group *g, td_device *dev, int rank, int size, void *arg) {
    stage_call *c = arg;
    pipe_dec *p = c->p;
    (void)g;
    (void)dev;
    (void)size;
    return td_decoder_part_pass(c->s->d[rank], p->in ? NULL : p->tokens, p->in, p->pos, p->n_rows,
                                c->last ? p->logits : NULL);
}

static td_status pipe_pass(void *impl, const int32_t *tokens, int64_t pos, int64_t n,
                           double *logits) {
    pipe_dec *p = impl;
    int last = p->n - 1;
    p->tokens = tokens;
    p->in = NULL;
    p->pos = pos;
    p->n_rows = n;
    p->logits = logits;
    while (!p->st[last].d[0])
        last--;
    for (int k = 0; k <= last; k++) {
        stage_call c = {p, &p->st[k], k == last};
        if (!p->st[k].d[0])
            continue;
        TD_CHECK(p->st[k].members > 1 ? td_group_run(p->st[k].g, member_pass, &c)
                                      : member_pass(NULL, NULL, 0, 1, &c));
        p->in = td_decoder_part_output(p->st[k].d[0]);
    }
    return TD_OK;
}

static void pipe_destroy(void *impl) {
    pipe_dec *p = impl;
    if (!p)
        return;
    for (int k = 0; k < p->n; k++) {
        for (int j = 0; j < p->st[k].members; j++) {
            td_decoder_destroy(p->st[k].d[j]);
            td_model_destroy(p->st[k].m[j]);
        }
        td_group_destroy(p->st[k].g);
    }
    free(p);
}

/* Stage k takes top-level layers [first[k], end[k]): the cut that puts each
 * stage's weights nearest its share of all of them (a layer goes to the
 * stage its middle falls in). */
static void cut_layers(const td_layer_info *li, int nl, const double *share, int n, int *first,
                       int *end) {
    double total = 0, cum = 0, target = 0;
    int at = 0;
    for (int i = 0; i < nl; i++)
        total += (double)li[i].weights + 1;
    for (int k = 0; k < n; k++) {
        first[k] = at;
        target += share[k] * total;
        while (at < nl && (k == n - 1 || cum + ((double)li[at].weights + 1) / 2 <= target))
            cum += (double)li[at++].weights + 1;
        end[k] = at;
    }
}

/* *table: the name of the embedding's table, which an untied head reads
 * (NULL: nothing tied); set by the stage holding the embedding, the first.
 * A tensor stage's members hold shards of its layers, sized by share. */
static td_status make_stage(pstage *s, const char *json, const char *checkpoint, td_dtype dtype,
                            int first, int end, int untied, const char **table, const double *share,
                            int64_t classes) {
    td_split_info units[TD_SHARD_MAX_UNITS];
    td_weights w = (td_weights)td_weights_default();
    int nunits = 0;
    if (s->members > 1)
        TD_CHECK(td_model_describe_splits(json, checkpoint, units, TD_SHARD_MAX_UNITS, &nunits));
    if (s->members > 1 && td_weights_default() < 0) /* the checkpoint's: whole q8_0 blocks */
        TD_CHECK(td_checkpoint_read_weights(checkpoint, &w));
    for (int j = 0; j < s->members; j++) {
        td_device *dev = s->dev[j];
        td_shard_plan plan;
        if (s->members == 1) {
            TD_CHECK(td_model_load_part(json, checkpoint, dev, dtype, 0, first, end, 1, &s->m[j]));
        } else {
            td__cut_units(units, nunits, share, s->members, w, j, &plan);
            TD_CHECK(td_model_load_part_shard(json, checkpoint, dev, dtype, 0, first, end, 1, &plan,
                                              &s->m[j]));
            td_model_set_reduce_hook(s->m[j], stage_reduce, s->g);
        }
        if (untied && first == 0 && j == 0)
            *table = td_model_param_name(s->m[j], 0);
        TD_CHECK(td_checkpoint_load_weights_alias(checkpoint, s->m[j], *table));
        TD_CHECK(td_decoder_create(s->m[j], &s->d[j]));
    }
    /* a split last stage: each member its slice of the head's rows, if the
     * head is a whole linear; else the first member all of them */
    if (s->members > 1 && end > 0 && classes > 0) {
        int64_t vfirst[TD_DP_MAX_MEMBERS], vcount[TD_DP_MAX_MEMBERS];
        td__cut_by_shares(classes, share, s->members, vfirst, vcount);
        for (int j = 0; j < s->members; j++)
            if (td_decoder_set_vocab_slice(s->d[j], vfirst[j], vcount[j]) == TD_ERR_UNSUPPORTED)
                TD_CHECK(
                    td_decoder_set_vocab_slice(s->d[j], 0, j == 0 ? td_decoder_vocab(s->d[j]) : 0));
    }
    /* each decoder alone reads its part: its gradients (and f32 copies of
     * packed matrices) go */
    for (int j = 0; j < s->members; j++) {
        td_decoder_take_model(s->d[j]);
        s->m[j] = NULL;
    }
    return TD_OK;
}

/* The members of stage k: devices [k * per, (k + 1) * per) of g. */
static td_status stage_group(td_group *g, int k, int per, td_group **out) {
    int out_ranks[TD_DP_MAX_MEMBERS], n = 0;
    for (int r = 0; r < td_group_size(g); r++)
        if (r / per != k)
            out_ranks[n++] = r;
    return td_group_shrink(g, out_ranks, (size_t)n, out);
}

/* The stages of the model in json over g's devices, `per` to a stage. A
 * head tied to the embedding gets a copy of the table, so that the two may
 * lie in different stages. */
static td_status make_stages(pipe_dec *p, td_group *g, int per, const char *json,
                             const char *checkpoint, td_dtype dtype) {
    td_model_info info;
    td_layer_info *li = NULL;
    double alone[TD_DP_MAX_MEMBERS], speed[TD_PP_MAX_STAGES], share[TD_PP_MAX_STAGES];
    double within[TD_PP_MAX_STAGES][TD_DP_MAX_MEMBERS];
    int first[TD_PP_MAX_STAGES], end[TD_PP_MAX_STAGES];
    char *untied = NULL;
    const char *table = NULL;
    td_status st;
    TD_CHECK(td_model_untie(json, checkpoint, &untied));
    if (untied)
        json = untied;
    TD_TRY(td_model_describe(json, checkpoint, &info, NULL, 0));
    if (!(li = td__calloc(sizeof *li * (size_t)info.layers, "the layers' sizes"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    TD_TRY(td_model_describe(json, checkpoint, &info, li, info.layers));
    /* a stage reads its weights as fast as its members together */
    for (int k = 0; k < p->n; k++) {
        speed[k] = 0;
        for (int j = 0; j < per; j++) {
            TD_TRY(td__speed_probe(td_group_device(g, k * per + j), dtype, &alone[j]));
            speed[k] += 1.0 / alone[j];
        }
        td__shares_from_speed(alone, per, within[k]);
        speed[k] = 1.0 / speed[k];
    }
    td__shares_from_speed(speed, p->n, share);
    cut_layers(li, info.layers, share, p->n, first, end);
    for (int k = 0; k < p->n; k++) {
        p->st[k].members = per;
        for (int j = 0; j < per; j++)
            p->st[k].dev[j] = td_group_device(g, k * per + j);
        if (per > 1)
            TD_TRY(stage_group(g, k, per, &p->st[k].g));
        if (first[k] < end[k])
            TD_TRY(make_stage(&p->st[k], json, checkpoint, dtype, first[k], end[k], untied != NULL,
                              &table, within[k], end[k] == info.layers ? info.classes : 0));
    }
fail:
    free(li);
    free(untied);
    return st;
}

/* The members of each stage: the mesh's tensor=N, else 1. */
static td_status members_per_stage(const char *options, int64_t *per) {
    td_strategy s;
    memset(&s, 0, sizeof s);
    s.ops = &td__strategy_pipeline;
    s.cfg.options = options;
    *per = 1;
    return td__option_count(&s, "tensor", 1, per);
}

td_status td__pipeline_decoder(td_group *g, const char *checkpoint, td_dtype dtype,
                               const char *options, td_decoder **out) {
    pipe_dec *p = td__calloc(sizeof *p, "a pipeline decoder");
    td_decoder_impl impl = {pipe_pass, pipe_destroy, p, 0, 0, 0};
    char *json = NULL;
    int64_t per = 1;
    td_dtype saved;
    td_status st;
    if (!p)
        return TD_ERR_OUT_OF_MEMORY;
    TD_TRY(members_per_stage(options, &per));
    if (per > TD_DP_MAX_MEMBERS || td_group_size(g) % per != 0) {
        st = td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                               "pipeline: stages of %lld devices do not divide %d devices",
                               (long long)per, td_group_size(g));
        goto fail;
    }
    p->n = td_group_size(g) / (int)per;
    if (p->n > TD_PP_MAX_STAGES) {
        st = td__error(TD_ERR_INVALID_ARG, "pipeline: %d stages; at most %d", p->n,
                       TD_PP_MAX_STAGES);
        goto fail;
    }
    for (int k = 0; k < td_group_size(g); k++)
        TD_TRY(td__tensor_check_dtype(td_group_device(g, k), dtype));
    TD_TRY(td_checkpoint_read_meta(checkpoint, &json, &saved, NULL));
    TD_TRY(make_stages(p, g, (int)per, json, checkpoint, dtype));
    /* the first stage holds the embedding (its tokens), the last the head */
    for (int k = 0; k < p->n; k++)
        if (p->st[k].d[0]) {
            impl.context = td_decoder_context(p->st[k].d[0]);
            impl.token_limit =
                impl.token_limit ? impl.token_limit : td_decoder_token_limit(p->st[k].d[0]);
            impl.vocab = td_decoder_vocab(p->st[k].d[0]);
        }
    TD_TRY(td_decoder_create_custom(&impl, out));
    free(json);
    return TD_OK;
fail:
    free(json);
    pipe_destroy(p);
    return st;
}
