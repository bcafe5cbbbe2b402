#ifndef TD_BACKEND_BACKENDS_H
#define TD_BACKEND_BACKENDS_H

#include "device/backend.h"

/* Each backend's operations, defined in its own folder; the registry
 * (registry.c) lists them. The device layer never names them. */
extern const td_backend_ops td__cpu_backend;
#ifdef TD_HAVE_CUDA
extern const td_backend_ops td__cuda_backend;
#endif
#ifdef TD_HAVE_OPENCL
extern const td_backend_ops td__opencl_backend;
#endif

#endif
