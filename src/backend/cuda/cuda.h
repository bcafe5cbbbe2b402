/* What the CUDA backend gives the layers above it: a CUDA device's GPU and
 * stream, for the NCCL transport (src/comm/nccl/), which queues its
 * collectives on the device's own stream. Narrow on purpose: the device's
 * context (cuda-impl.h) stays private to the backend. Built only with CUDA
 * (TD_HAVE_CUDA); valid for the devices with TD_DEVICE_CAP_NCCL. */
#ifndef TD_BACKEND_CUDA_H
#define TD_BACKEND_CUDA_H

#include "tandem/device.h"

/* The CUDA device number of dev's GPU; -1 when dev is not a CUDA device.
 * Two devices with one number share a GPU ({split=2}). Safe from any thread. */
int td__cuda_ordinal(const td_device *dev);
/* dev's in-order stream, a cudaStream_t; NULL when dev is not a CUDA device.
 * Valid while dev is open. */
void *td__cuda_stream(const td_device *dev);
/* Makes dev's GPU the calling thread's (cudaSetDevice): for threads other
 * than dev's host thread that queue work on its stream. On failure the
 * message names dev and CUDA's error. */
td_status td__cuda_select(const td_device *dev);
/* TD_OK once the work queued on dev's stream is done, TD_IN_PROGRESS while
 * it is not, else the error, translated, with a message naming dev. Never
 * blocks. */
td_status td__cuda_stream_query(const td_device *dev);

#endif
