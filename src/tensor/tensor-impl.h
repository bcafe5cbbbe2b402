/* The tensor layer's own helpers. The tensor's struct, which the nn layer
 * holds by value, is in tensor/ops.h; other layers use tensor/view.h. */
#ifndef TD_TENSOR_IMPL_H
#define TD_TENSOR_IMPL_H

#include "core/error.h"
#include "tensor/ops.h"

/* TD_OK when a and b have one shape; else TD_ERR_SHAPE naming both shapes and `what`. */
td_status td__tensor_same_shape(const td_tensor *a, const td_tensor *b, const char *what);

/* "(2, 3, 4)" into buf. */
const char *td__shape_str(const td_tensor *t, char buf[64]);

/* The kernel slot `slot` of t's device, or a TD_ERR_UNSUPPORTED return. */
#define KERNEL(t, slot)                                                                            \
    const td_kernels *k_ = td__tensor_kernels(t);                                                  \
    if (!k_ || !k_->slot)                                                                          \
        return td__error(TD_ERR_UNSUPPORTED, "%s: op '%s' is not implemented by the %s backend",   \
                         td_device_name((t)->dev), #slot, td__device_backend_name((t)->dev));      \
    void *ctx_ = td__device_ctx((t)->dev)

/* The checks every op makes, each failing with a message that names the op
 * and the argument: called on t's device's host thread; t (NULL allowed
 * when may_be_null) on ref's device with ref's dtype; t (NULL passes) with
 * `want` elements; buffer b on ref's device with at least nbytes. */
td_status td__op_check_thread(const td_tensor *t, const char *op);
td_status td__op_check_like(const td_tensor *ref, const td_tensor *t, int may_be_null,
                            const char *op, const char *name);
td_status td__op_check_numel(const td_tensor *t, size_t want, const char *op, const char *name);
td_status td__op_check_buffer(const td_tensor *ref, const td_buffer *b, size_t nbytes,
                              const char *op, const char *name);

#endif
