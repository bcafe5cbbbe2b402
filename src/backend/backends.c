/* The backends this tandem was built with, for the device layer below. */
#include "backend/backends.h"

static const td_backend_ops *const built_in[] = {
    &td__cpu_backend,
#ifdef TD_HAVE_CUDA
    &td__cuda_backend,
#endif
#ifdef TD_HAVE_OPENCL
    &td__opencl_backend,
#endif
    NULL,
};

static const char *const left_out[] = {
#ifndef TD_HAVE_CUDA
    "cuda: not built in (no nvcc at configure time)",
#endif
#ifndef TD_HAVE_OPENCL
    "opencl: not built in (no OpenCL headers at configure time)",
#endif
    NULL,
};

const td_backend_ops *const *td__backends(void) {
    return built_in;
}

const char *const *td__backends_left_out(void) {
    return left_out;
}
