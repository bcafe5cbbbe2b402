/* Products with compact weights (bf16, q8_0): checks, then the device's
 * matmul_compact kernel (see ops.h and td_kernels). */
#include "core/quant.h"
#include "tensor/tensor-impl.h"

td_status td__op_matmul_compact(td_tensor *y, const td_tensor *x, td_weights fmt, const void *w,
                                int64_t rows, int64_t cols) {
    const char *op = "matmul_compact";
    char sx[64], sy[64];
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    if (y->dtype != TD_F32 || fmt == TD_WEIGHTS_F32)
        return td__error(TD_ERR_DTYPE,
                         "matmul_compact: %s weights with %s activations; compact "
                         "weights compute with f32 activations",
                         td_weights_name(fmt), td_dtype_name(y->dtype));
    if (td__tensor_cols(x) != cols || td__tensor_cols(y) != rows ||
        td__tensor_rows(x) != td__tensor_rows(y))
        return td__error(TD_ERR_SHAPE, "matmul_compact: %s x (%lld, %lld)^T into %s",
                         td__shape_str(x, sx), (long long)rows, (long long)cols,
                         td__shape_str(y, sy));
    if (fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_SHAPE,
                         "matmul_compact: q8_0 rows of %lld values are not whole "
                         "blocks of %d",
                         (long long)cols, TD_Q8_0_BLOCK);
    {
        KERNEL(y, matmul_compact);
        return k_->matmul_compact(ctx_, fmt, td__tensor_rows(x), rows, cols, x->data, w, y->data);
    }
}
