/* The OpenCL backend's device context. Device memory is addressed by
 * pointers like every other backend's: each cl_mem gets a range of virtual
 * addresses that no host memory uses, so the layers above may offset device
 * pointers as they do on CPUs and GPUs, and the backend turns a pointer back
 * into (cl_mem, offset). */
#ifndef TD_BACKEND_OPENCL_IMPL_H
#define TD_BACKEND_OPENCL_IMPL_H

#include <CL/cl.h>

#include "device/device-impl.h"

typedef struct ocl_range {
    uintptr_t base; /* first virtual address */
    size_t nbytes;
    cl_mem mem;
} ocl_range;

typedef struct ocl_device {
    char name[32];
    cl_platform_id platform;
    cl_device_id device; /* a sub-device when split */
    int is_sub_device;
    int fp64;
    cl_context context;
    cl_command_queue queue;
    cl_program program; /* the kernels of kernels_cl.c, built on first use */
    cl_kernel *kernels; /* created lazily, indexed by td__ocl_kernel_id */
    ocl_range *allocs;  /* sorted by base; touched by the host thread only */
    size_t nallocs, cap;
} ocl_device;

/* Turns an OpenCL error into a status whose message names the call, the
 * device and the error's name. */
td_status td__ocl_status(cl_int err, const char *call, const ocl_device *od);
const char *td__ocl_error_name(cl_int err);

#define TD_OCL_CHECK(call, od)                                                                     \
    do {                                                                                           \
        cl_int err_ = (call);                                                                      \
        if (err_ != CL_SUCCESS)                                                                    \
            return td__ocl_status(err_, #call, (od));                                              \
    } while (0)

/* (cl_mem, offset) of a device pointer; TD_ERR_INVALID_ARG when the pointer
 * is not inside an allocation of this device. */
td_status td__ocl_resolve(const ocl_device *od, const void *ptr, cl_mem *mem, size_t *offset);

/* The kernel called name, from the device's program (built and cached on
 * first use; a build failure's message carries the build log). */
td_status td__ocl_kernel(ocl_device *od, const char *name, cl_kernel *out);

extern const char td__ocl_source[];
extern const td_kernels td__opencl_kernels;

#endif
