/* A device buffer's record, shown to the layers above the device layer on
 * purpose and narrowly: the nn layer makes non-owning views of parts of a
 * buffer (workspaces, a model part's output rows) as values of this struct,
 * and the tensor layer reads its pointer and size on every op. The device
 * object and the backend interface stay in device-impl.h and backend.h.
 * Only the device layer allocates and frees buffers (td_buffer_alloc,
 * td_buffer_free); a view made here must never be freed. */
#ifndef TD_DEVICE_BUFFER_H
#define TD_DEVICE_BUFFER_H

#include <stddef.h>

#include "tandem/device.h"

struct td_buffer {
    td_device *dev;
    void *ptr; /* the backend's pointer: host memory for CPU devices */
    size_t nbytes;
};

#endif
