/* What the device layer gives tandem's layers above it beyond
 * include/tandem/device.h: calls for the library's own use, not for users.
 * Unlike device-impl.h (the device and backend structs, for the device layer
 * and the backends only) it shows no struct: the layers above reach devices
 * and buffers through these and the public calls. */
#ifndef TD_DEVICE_INTERNAL_H
#define TD_DEVICE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "device/kernels.h"
#include "tandem/device.h"

/* The backend's pointer to buf's first byte: a host address on devices with
 * TD_DEVICE_CAP_HOST_MEMORY, a device address (only the device's kernels and
 * copies may use it) on the others. Valid while buf lives. */
void *td__buffer_ptr(const td_buffer *buf);

/* What the tensor layer needs to launch a kernel on dev, and no more of the
 * device: its backend's kernel table (NULL for a NULL dev) and the backend's
 * context that every kernel takes first. Narrow on purpose, so the device
 * struct stays in device-impl.h; out of line, since a call costs nanoseconds
 * next to the kernel it launches. Valid while dev is open. */
const td_kernels *td__device_kernels(const td_device *dev);
void *td__device_ctx(const td_device *dev);
/* The name of dev's backend ("cpu", "cuda", "opencl"), for messages. */
const char *td__device_backend_name(const td_device *dev);

/* dev's backend's own write (host to device) and read (device to host) of
 * nbytes at a backend pointer (td__buffer_ptr, or a tensor's data), with no
 * task and no range check: for code already on dev's host thread (inside a
 * task) that knows its range, as the nn layer's batch loads and logits
 * reads do. Synchronous on return; errors as the backend's. */
td_status td__device_write(td_device *dev, void *dst, const void *src, size_t nbytes);
td_status td__device_read(td_device *dev, void *dst, const void *src, size_t nbytes);

/* Whether two devices' host threads are bound to a common logical CPU. */
int td__device_cpus_overlap(const td_device *a, const td_device *b);

/* The {slowdown=F} and {latency=MS} options made real: called on the
 * device's thread after a pass that began at start_ns (td_clock_ns; the nn
 * layer calls it at the end of every forward and backward pass), it spins
 * (F - 1) times that pass's length plus MS milliseconds, so the device takes
 * F times as long plus a fixed cost per pass (as a driver's launch overhead
 * adds). Does nothing when F is 1 and MS 0. */
void td__device_throttle(td_device *dev, uint64_t start_ns);
/* For one stretch of a pass that waits for other devices between its
 * stretches (a tensor-parallel step's reductions), use the public
 * td_device_throttle(): the slowdown applies to each stretch, the fixed
 * latency (with_latency) once per pass. */
double td__device_slowdown(const td_device *dev);

/* A group left the device's host thread behind in a task it gave up
 * waiting for (td_group_run). If the thread is still in a task when the
 * device is closed, the close leaves it running rather than wait for ever. */
void td__device_left_behind(td_device *dev);
/* 1 from td__device_left_behind until dev's host thread comes back from
 * the task it was left behind in. Safe from any thread. */
int td__device_is_left_behind(const td_device *dev);

#endif
