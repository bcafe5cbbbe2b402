/* What the importers share (import.c): a list of converted tensors that
 * becomes a checkpoint with its model JSON, and the parameters of tandem's
 * GPT-2 model by kind, their names and shapes and its JSON. import_hf.c and
 * import_llmc.c read GPT-2s into it, import_llama.c the Llama family. */
#ifndef TD_NN_IMPORT_IMPL_H
#define TD_NN_IMPORT_IMPL_H

#include "device/kernels.h"
#include "tandem/checkpoint.h"
#include "tandem/import.h"

/* A GPT-2's parameters by kind, in llm.c's order (its file stores them so,
 * each kind for every block together); TD__G_HEAD last, only untied. */
typedef enum td__gpt2_kind {
    TD__G_WTE,
    TD__G_WPE,
    TD__G_LN1W,
    TD__G_LN1B,
    TD__G_QKVW,
    TD__G_QKVB,
    TD__G_ATTPROJW,
    TD__G_ATTPROJB,
    TD__G_LN2W,
    TD__G_LN2B,
    TD__G_FCW,
    TD__G_FCB,
    TD__G_FCPROJW,
    TD__G_FCPROJB,
    TD__G_LNFW,
    TD__G_LNFB,
    TD__G_HEAD,
    TD__G_KINDS
} td__gpt2_kind;

/* 1 for the kinds every block has (its own ln_1 ... mlp.c_proj). */
int td__gpt2_per_block(td__gpt2_kind k);

/* The tandem shape of kind k: (out, in) for weights; returns its ndim. */
int td__gpt2_shape(const td_gpt2_info *g, td__gpt2_kind k, int64_t shape[2]);

/* Converted tensors in the model's parameter order. */
typedef struct td__ckpt_list {
    td_ckpt_entry *e;
    float **owned; /* per entry: its data when the list owns it, else NULL */
    size_t n, cap;
} td__ckpt_list;

/* Adds tensor `name` of shape (ndim dims): numel floats at data, owned by l
 * from now on when `owned` (freed even on failure), else borrowed until
 * td__ckpt_list_save. */
td_status td__ckpt_list_add(td__ckpt_list *l, const char *name, int ndim, const int64_t *shape,
                            float *data, int owned);

/* Checks the tensors against the model JSON (`what` names the model in
 * messages: the same count of weights), then saves them with it at path,
 * with state's zero optimizer state when state is not NULL (import.h);
 * *weights gets the count. */
td_status td__ckpt_list_save(const td__ckpt_list *l, const char *path, const char *json,
                             const char *what, const td_train_state *state, size_t *weights);

/* NULL-safe for an empty list; frees what l owns. */
void td__ckpt_list_free(td__ckpt_list *l);

/* The converted GPT-2: its description, activation and tensors. */
typedef struct td__gpt2_out {
    td_gpt2_info info;
    td_act act;
    const char *source; /* "Hugging Face transformers" or "llm.c", for the description */
    td__ckpt_list list;
} td__gpt2_out;

/* Checks the sizes in o->info (positive, within what a tandem model may
 * hold, heads dividing the channels); errors name `file` and the field as
 * `field_names` (7 names: context, vocab, layers, heads, channels, inner,
 * eps) call them in the source. */
td_status td__gpt2_check(const td_gpt2_info *g, const char *file, const char *const *field_names);

/* Adds the tensor of kind k of block `block` (ignored for kinds outside
 * blocks): numel(its shape) floats at data, owned by o from now on when
 * `owned` (freed even on failure), else borrowed until td__gpt2_save. */
td_status td__gpt2_add(td__gpt2_out *o, td__gpt2_kind k, int64_t block, float *data, int owned);

/* The model JSON and checks, then the checkpoint at path (with state's
 * zero optimizer state when state is not NULL, import.h); *info gets o's
 * description when not NULL. */
td_status td__gpt2_save(td__gpt2_out *o, const char *path, const td_train_state *state,
                        td_gpt2_info *info);

/* NULL-safe for an empty list; frees what o owns. */
void td__gpt2_free(td__gpt2_out *o);

#endif
