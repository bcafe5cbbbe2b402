/* The inside of a tensor: its struct, for the tensor layer and, through
 * tensor/ops.h, the nn layer that holds tensors and views by value and
 * launches kernels on them. Other layers use tensor/view.h. */
#ifndef TD_TENSOR_IMPL_H
#define TD_TENSOR_IMPL_H

#include "device/buffer.h"
#include "device/internal.h"
#include "device/kernels.h"
#include "tandem/tensor.h"
#include "tensor/view.h"

struct td_tensor {
    td_device *dev;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    size_t numel;
    td_buffer *buf;
    void *data; /* device pointer to element 0 */
};

/* The kernel table of the tensor's device. */
static inline const td_kernels *td__tensor_kernels(const td_tensor *t) {
    return td__device_kernels(t->dev);
}

/* TD_OK when a and b have one shape; else TD_ERR_SHAPE naming both shapes and `what`. */
td_status td__tensor_same_shape(const td_tensor *a, const td_tensor *b, const char *what);

/* "(2, 3, 4)" into buf. */
const char *td__shape_str(const td_tensor *t, char buf[64]);

#endif
