/* The tensor layer's own helpers. The tensor's struct, which the nn layer
 * holds by value, is in tensor/ops.h; other layers use tensor/view.h. */
#ifndef TD_TENSOR_IMPL_H
#define TD_TENSOR_IMPL_H

#include "tensor/ops.h"

/* TD_OK when a and b have one shape; else TD_ERR_SHAPE naming both shapes and `what`. */
td_status td__tensor_same_shape(const td_tensor *a, const td_tensor *b, const char *what);

/* "(2, 3, 4)" into buf. */
const char *td__shape_str(const td_tensor *t, char buf[64]);

#endif
