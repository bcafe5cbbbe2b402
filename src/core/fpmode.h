/* Subnormal numbers on the threads that compute.
 *
 * A float below 2^-126 (a double below 2^-1022) is subnormal. x86 cores take
 * a microcode assist on every operation that reads or makes one, about a
 * hundred cycles instead of a few, so a layer whose gradients decay towards
 * zero can run many times slower for numbers too small to matter. Two bits of
 * the SSE/AVX control register MXCSR avoid that: FTZ (flush to zero: a
 * subnormal result becomes 0) and DAZ (denormals are zero: a subnormal input
 * reads as 0). On aarch64 FPCR.FZ does both for single and double precision.
 *
 * The mode belongs to a thread (C11 7.6: each thread starts with its
 * creator's), so every thread that runs CPU kernels sets it itself: a CPU
 * device's host thread and its helpers (src/backend/cpu). The default is to
 * flush; TANDEM_DENORMALS=keep or the device option {denormals=keep} keeps
 * IEEE gradual underflow. Elsewhere (other CPUs, other compilers) setting the
 * mode does nothing and says so by its return value. */
#ifndef TD_CORE_FPMODE_H
#define TD_CORE_FPMODE_H

#include <stdint.h>

typedef enum td__denormals {
    TD__DENORMALS_FLUSH = 0, /* FTZ and DAZ: subnormals become 0 (the default) */
    TD__DENORMALS_KEEP = 1,  /* IEEE: subnormals are computed exactly */
} td__denormals;

/* The process default: TANDEM_DENORMALS ("keep" or "flush"; unset: flush),
 * read once. Another value is warned about and flushes. Thread-safe. */
td__denormals td__denormals_default(void);

/* Parses "keep" or "flush" into *out; returns 0, or -1 for anything else. */
int td__denormals_parse(const char *s, td__denormals *out);

/* Sets the calling thread's subnormal handling. Returns 1 when the thread
 * now handles them as asked, 0 when it was asked to flush on a target
 * without such a mode (it keeps IEEE behaviour). */
int td__denormals_set(td__denormals mode);

/* The calling thread's mode as td__denormals_set left it (KEEP where there is
 * no such mode, or when only one of FTZ and DAZ is set). */
td__denormals td__denormals_get(void);

/* The calling thread's whole floating-point control word (MXCSR on x86-64,
 * FPCR on aarch64, 0 elsewhere) and its restoration on another thread, so
 * that a helper thread computes exactly as the thread it works for would. */
uint64_t td__fp_control_get(void);
void td__fp_control_set(uint64_t word);

#endif
