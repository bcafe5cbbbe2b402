/* What the device layer gives tandem's layers above it beyond
 * include/tandem/device.h: calls for the library's own use, not for users.
 * Unlike device-impl.h (the device and backend structs, for the device layer
 * and the backends only) it shows no struct: the layers above reach devices
 * and buffers through these and the public calls. */
#ifndef TD_DEVICE_INTERNAL_H
#define TD_DEVICE_INTERNAL_H

#include <stdint.h>

#include "tandem/device.h"

/* The backend's pointer to buf's first byte: a host address on devices with
 * TD_DEVICE_CAP_HOST_MEMORY, a device address (only the device's kernels and
 * copies may use it) on the others. Valid while buf lives. */
void *td__buffer_ptr(const td_buffer *buf);

/* Whether two devices' host threads are bound to a common logical CPU. */
int td__device_cpus_overlap(const td_device *a, const td_device *b);

/* The {slowdown=F} and {latency=MS} options made real: called on the
 * device's thread after a pass that began at start_ns (td_clock_ns; the nn
 * layer calls it at the end of every forward and backward pass), it spins
 * (F - 1) times that pass's length plus MS milliseconds, so the device takes
 * F times as long plus a fixed cost per pass (as a driver's launch overhead
 * adds). Does nothing when F is 1 and MS 0. */
void td__device_throttle(td_device *dev, uint64_t start_ns);
/* The same for one stretch of a pass that waits for other devices between
 * its stretches (a tensor-parallel step's reductions): the slowdown applies
 * to each stretch, the fixed latency (with_latency) once per pass. */
void td__device_throttle_part(td_device *dev, uint64_t start_ns, int with_latency);
double td__device_slowdown(const td_device *dev);

/* A group left the device's host thread behind in a task it gave up
 * waiting for (td_group_run). If the thread is still in a task when the
 * device is closed, the close leaves it running rather than wait for ever. */
void td__device_left_behind(td_device *dev);
/* 1 from td__device_left_behind until dev's host thread comes back from
 * the task it was left behind in. Safe from any thread. */
int td__device_is_left_behind(const td_device *dev);

#endif
