/* Placements: what each member of a strategy holds. A holding is a model
 * (a replica, a pipeline stage's part, or a tensor shard) and its optimizer;
 * each of its parameters is a parameter of the whole model under the same
 * name, whole or a slice of it (td_model_param_slice), and its optimizer's
 * state tensors follow its parameters. From the holdings alone come the
 * whole-model checkpoint (each tensor put together from its holders), the
 * loading of one (each holder cutting its slice out), and whether some of
 * the holders still hold every tensor (the survival rule). */
#ifndef TD_PARALLEL_PLACEMENT_H
#define TD_PARALLEL_PLACEMENT_H

#include "tandem/checkpoint.h"
#include "tandem/nn.h"

typedef struct td__holding {
    td_model *m;
    td_optimizer *opt; /* NULL: weights only */
    int member;        /* its rank in the strategy's group */
} td__holding;

/* Saves the whole model that h[0..n) hold together as the checkpoint
 * td_checkpoint_save writes for it: the parameters in the model's order
 * (the order the holdings name them, in rank order), then the optimizer's
 * state; a tensor held whole is taken from its first holder, one held in
 * slices is gathered from every holder. Every holding has an optimizer, or
 * none has. */
td_status td__placement_save(const td__holding *h, int n, const char *path,
                             const td_train_state *state);
/* Loads a whole-model checkpoint of the holdings' model into each holding:
 * its slice of every tensor it holds, and its optimizer's step count;
 * *state (may be NULL) gets the run state. */
td_status td__placement_load(const td__holding *h, int n, const char *path, td_train_state *state);
/* Copies what from[0..nf) hold into to[0..nt) (another placement of the
 * same model: a strategy carrying on over survivors), tensor by tensor
 * through host memory, and sets to's optimizers' step counts to steps. */
td_status td__placement_copy(const td__holding *from, int nf, const td__holding *to, int nt,
                             int64_t steps);
/* 1 when the holdings h[k] with alive[k] (indexed as h) hold all of every parameter that
 * the holdings together hold; else 0, and `lost` (n bytes) names the first
 * parameter they do not cover. */
int td__placement_covers(const td__holding *h, int n, const int *alive, char *lost, size_t size);

#endif
