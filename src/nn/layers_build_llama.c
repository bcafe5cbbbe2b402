/* Building the Llama family's layers, RMSNorm and the SwiGLU MLP, from
 * their JSON specs; rows of layer_kinds in layers_build.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "nn/build-impl.h"
#include "nn/nn-impl.h"

td_status td__build_rmsnorm(build_ctx *b, td_layer *l, int variant, int in_ndim,
                            const int64_t *in) {
    static const char *const keys[] = {"type", "eps", NULL};
    int64_t c;
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_real(b, "eps", 1e-6, 0.0, 1.0, 0, &l->eps));
    if (in_ndim < 1)
        return td__build_shape_error(b, "at least one dimension of", in_ndim, in);
    l->vt = &td__rmsnorm_vt;
    c = in[in_ndim - 1];
    TD_CHECK(td__model_add_param(b->m, l, "weight", 1, &c, &l->param[0]));
    return l->param[0] ? td_tensor_fill(l->param[0], 1.0) : TD_OK;
}

/* Whole parameters, each from U(+-1/sqrt(fan_in)) like a linear's. */
static td_status add_uniform(td_model *m, td_layer *l, const char *name, int ndim,
                             const int64_t *shape, int64_t fan_in, td_tensor **p) {
    return td__model_add_slice(m, l, name, ndim, shape, -1, 1, 0, 0, 0, 1.0 / sqrt((double)fan_in),
                               p);
}

td_status td__build_swiglu(build_ctx *b, td_layer *l, int variant, int in_ndim, const int64_t *in) {
    static const char *const keys[] = {"type", "hidden", "bias", NULL};
    td_model *m = b->m;
    int64_t c, s[2];
    TD_CHECK(td__spec_keys(b, keys));
    TD_CHECK(td__spec_int(b, "hidden", 1, 0, 1, 1 << 24, &l->hidden));
    TD_CHECK(td__spec_bool(b, "bias", 0, &l->has_bias));
    if (in_ndim < 1)
        return td__build_shape_error(b, "at least one dimension of", in_ndim, in);
    l->vt = &td__swiglu_vt;
    c = in[in_ndim - 1];
    /* gate_up: the gate's rows, then the up projection's */
    s[0] = 2 * l->hidden;
    s[1] = c;
    TD_CHECK(add_uniform(m, l, "gate_up.weight", 2, s, c, &l->param[0]));
    if (l->has_bias)
        TD_CHECK(add_uniform(m, l, "gate_up.bias", 1, s, c, &l->param[1]));
    s[0] = c;
    s[1] = l->hidden;
    TD_CHECK(add_uniform(m, l, "down.weight", 2, s, l->hidden, &l->param[2]));
    if (l->has_bias)
        TD_CHECK(add_uniform(m, l, "down.bias", 1, s, l->hidden, &l->param[3]));
    return TD_OK;
}
