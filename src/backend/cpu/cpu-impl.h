/* The CPU backend's device context, shared by its files. */
#ifndef TD_BACKEND_CPU_IMPL_H
#define TD_BACKEND_CPU_IMPL_H

#include <hwloc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "backend/cpu/simd.h" /* td_cpu_simd, td__cpu_simd() */
#include "device/backend.h"

#define TD_CPU_MAX_PUS 256

typedef struct cpu_pool cpu_pool;

typedef struct cpu_device {
    int npus;
    int pus[TD_CPU_MAX_PUS]; /* OS indexes of the logical CPUs owned */
    hwloc_bitmap_t set;
    int pinned;      /* 1 once the host thread is bound */
    double slowdown; /* 1: none */
    cpu_pool *pool;  /* helper threads on pus[1..], NULL for one PU */
    /* How its threads treat subnormal numbers (a td__denormals): the
     * {denormals=} option, else TANDEM_DENORMALS, else flush. Set by the host
     * thread and each helper on itself when they start. */
    int denormals;
    /* 1: the kernels with products inside (convolution, fused attention)
     * multiply f32 from bf16-rounded inputs (td_device_set_precision) */
    atomic_int bf16;
} cpu_device;

/* "SSE4.2 AVX AVX2 FMA AVX-512F ..." of this CPU, into buf. */
void td__cpu_isa_string(char *buf, size_t n);

/* Runs fn(arg, i, n) for i in [0, n) where n is the device's thread count,
 * part i on the device's i-th core (0 is the calling host thread), and waits
 * for all. Kernels split their work by i. */
typedef void (*td_cpu_part_fn)(void *arg, int part, int nparts);
void td__cpu_parallel(cpu_device *cd, td_cpu_part_fn fn, void *arg);
int td__cpu_threads(const cpu_device *cd);

td_status td__cpu_pool_create(cpu_device *cd, hwloc_topology_t topo);
void td__cpu_pool_destroy(cpu_pool *pool);

extern const td_kernels td__cpu_kernels;

#endif
