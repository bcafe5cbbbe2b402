/* The CPU backend's SIMD level, for the layers above it that have kernels of
 * their own over host memory (comm's reductions): the one choice every CPU
 * kernel follows. Narrow on purpose: the CPU device's context stays in
 * cpu-impl.h, private to the backend. */
#ifndef TD_BACKEND_CPU_SIMD_H
#define TD_BACKEND_CPU_SIMD_H

/* SIMD levels the kernels may use, best last. */
typedef enum td_cpu_simd {
    TD_SIMD_SCALAR = 0,
    TD_SIMD_AVX2 = 1,   /* AVX2 + FMA */
    TD_SIMD_AVX512 = 2, /* AVX-512F */
} td_cpu_simd;

/* The best SIMD level this CPU and OS support (TANDEM_SIMD=scalar|avx2|avx512
 * lowers it, for testing each path). */
td_cpu_simd td__cpu_simd(void);
/* Whether AVX512-VNNI (int8 dot products) and AVX512-BF16 may be used: the
 * CPU has them, the OS saves AVX-512 state, and TANDEM_SIMD does not lower
 * the level below them ("avx512f": AVX-512 without either). */
int td__cpu_has_vnni(void);
int td__cpu_has_bf16(void);

#endif
