/* tandem: tensors. A tensor is a contiguous array of f32 or f64 with up to
 * four dimensions that lives on one device. */
#ifndef TANDEM_TENSOR_H
#define TANDEM_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TD_MAX_DIMS 4

typedef struct td_tensor td_tensor;

/* Creates an uninitialised tensor of shape[0..ndim) on dev. ndim is 0 (a
 * scalar) to 4; every extent is >= 0. On failure *out is NULL; out of device
 * memory is TD_ERR_OUT_OF_MEMORY naming the device. The caller destroys it. */
TD_API td_status td_tensor_create(td_device *dev, td_dtype dtype, int ndim, const int64_t *shape,
                                  td_tensor **out);
/* NULL-safe. */
TD_API void td_tensor_destroy(td_tensor *t);

TD_API td_device *td_tensor_device(const td_tensor *t);
TD_API td_dtype td_tensor_dtype(const td_tensor *t);
TD_API int td_tensor_ndim(const td_tensor *t);
/* Extent of dimension i, or 0 when i is out of range. */
TD_API int64_t td_tensor_dim(const td_tensor *t, int i);
TD_API size_t td_tensor_numel(const td_tensor *t);
TD_API size_t td_tensor_nbytes(const td_tensor *t);
/* The buffer that holds t's elements (a view's base's), and in *byte_offset
 * (when not NULL) where element 0 lies in it: for collectives and copies over
 * tensors. Borrowed: valid while t's memory lives. NULL (and offset 0) for NULL. */
TD_API td_buffer *td_tensor_buffer(const td_tensor *t, size_t *byte_offset);

/* Host data in the tensor's own type; nbytes must equal td_tensor_nbytes. */
TD_API td_status td_tensor_write(td_tensor *t, const void *host, size_t nbytes);
TD_API td_status td_tensor_read(const td_tensor *t, void *host, size_t nbytes);
/* Host data as doubles, converted to or from the tensor's type; n elements. */
TD_API td_status td_tensor_write_f64(td_tensor *t, const double *host, size_t n);
TD_API td_status td_tensor_read_f64(const td_tensor *t, double *host, size_t n);

/* dst = src for tensors of one shape and type on any two devices. */
TD_API td_status td_tensor_copy(td_tensor *dst, const td_tensor *src);

TD_API td_status td_tensor_fill(td_tensor *t, double value);
/* Element i gets number (offset + i) of stream `seed`, so a tensor split
 * across devices, each part given its own offset, holds the same numbers as
 * one tensor on one device. */
TD_API td_status td_tensor_rand_uniform(td_tensor *t, uint64_t seed, uint64_t offset, double lo,
                                        double hi);
TD_API td_status td_tensor_rand_normal(td_tensor *t, uint64_t seed, uint64_t offset, double mean,
                                       double stddev);

/* Arithmetic, for code that runs a device's own kernels directly (tandem
 * bench devices times them). Each runs on the tensors' device and must be
 * called from its host thread (inside td_device_run or a group's function),
 * else TD_ERR_INVALID_ARG; all tensors on one device and of one type. Work
 * may still be queued on the device when they return: td_device_sync waits
 * for it. */
/* c (m, n) = alpha op(a) op(b) + beta c, each tensor seen as a matrix of
 * (product of all but its last extent, last extent); trans_a and trans_b
 * transpose a and b. TD_ERR_SHAPE when the extents do not match. */
TD_API td_status td_tensor_matmul(td_tensor *c, const td_tensor *a, int trans_a, const td_tensor *b,
                                  int trans_b, double alpha, double beta);
/* y = a + b, element by element; the three have one element count. */
TD_API td_status td_tensor_add(const td_tensor *a, const td_tensor *b, td_tensor *y);
/* y = alpha x + beta y, element by element; x and y have one element count. */
TD_API td_status td_tensor_axpby(double alpha, const td_tensor *x, double beta, td_tensor *y);

typedef struct td_compare_result {
    double max_abs;     /* max |a - b| */
    double max_rel;     /* max |a - b| / max(|a|, |b|), 0 where both are 0 */
    size_t worst_index; /* where max_abs was found */
    size_t nonfinite;   /* positions where exactly one of a, b is NaN or inf, or they differ */
} td_compare_result;

/* Compares two tensors of one shape, on any devices and of any types, in f64. */
TD_API td_status td_tensor_compare(const td_tensor *a, const td_tensor *b, td_compare_result *out);

#ifdef __cplusplus
}
#endif
#endif
