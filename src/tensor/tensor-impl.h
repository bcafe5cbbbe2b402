/* The inside of a tensor, for the layers above that launch kernels on it. */
#ifndef TD_TENSOR_IMPL_H
#define TD_TENSOR_IMPL_H

#include "device/device-impl.h"
#include "tandem/tensor.h"

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
    return t->dev->ops->kernels;
}

/* TD_OK when a and b have one shape; else TD_ERR_SHAPE naming both shapes and `what`. */
td_status td__tensor_same_shape(const td_tensor *a, const td_tensor *b, const char *what);

/* TD_OK when dev does arithmetic in dtype (every device does f32); else
 * TD_ERR_UNSUPPORTED naming dev, about the setting "dtype". A NULL dev (a
 * member in another process) is another's to check. */
td_status td__tensor_check_dtype(const td_device *dev, td_dtype dtype);

/* "(2, 3, 4)" into buf. */
const char *td__shape_str(const td_tensor *t, char buf[64]);

#endif
