/* What the tensor layer gives the layers above that move tensors between
 * devices but do not compute with them (the parallel layer), beyond the
 * accessors of include/tandem/tensor.h: two calls, and not the tensor's
 * struct. Narrow on purpose: the struct stays in tensor/ops.h (for nn), so a
 * strategy cannot come to depend on how a tensor or a view is laid out.
 * These are out of line: each runs once a collective or once a model's
 * set-up, next to work that costs microseconds. */
#ifndef TD_TENSOR_VIEW_H
#define TD_TENSOR_VIEW_H

#include "device/buffer.h"
#include "tandem/tensor.h"

/* TD_OK when dev does arithmetic in dtype (every device does f32); else
 * TD_ERR_UNSUPPORTED naming dev, about the setting "dtype". A NULL dev (a
 * member in another process) is another's to check. */
td_status td__tensor_check_dtype(const td_device *dev, td_dtype dtype);

/* A buffer over exactly t's elements (t a view or not): {t's device, t's
 * element 0, td_tensor_nbytes(t)}, for handing a tensor to a collective at
 * offset 0. A view that owns nothing: never td_buffer_free it; valid while
 * t's memory lives. */
td_buffer td__tensor_as_buffer(const td_tensor *t);

#endif
