/* Subnormal handling per thread: see fpmode.h. */
#include "core/fpmode.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"

#if defined(__x86_64__) || (defined(__i386__) && defined(__SSE__))
#include <xmmintrin.h>
#define TD_FP_MXCSR 1
/* MXCSR bit 15 (FTZ) and bit 6 (DAZ). */
#define MXCSR_FTZ 0x8000u
#define MXCSR_DAZ 0x0040u
#elif defined(__aarch64__)
#define TD_FP_FPCR 1
/* FPCR bit 24 (FZ): subnormal inputs and results of single- and
 * double-precision operations are 0. (FZ16, bit 19, would do the same for
 * half precision, which tandem does not compute in.) */
#define FPCR_FZ    (UINT64_C(1) << 24)
static uint64_t read_fpcr(void) {
    uint64_t v;
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(v));
    return v;
}
static void write_fpcr(uint64_t v) {
    __asm__ __volatile__("msr fpcr, %0" : : "r"(v));
}
#endif
/* Other targets: no mode to set; subnormals stay IEEE and the calls below
 * say so (td__denormals_set returns 0). */

int td__denormals_parse(const char *s, td__denormals *out) {
    if (!s)
        return -1;
    if (!strcmp(s, "keep")) {
        *out = TD__DENORMALS_KEEP;
        return 0;
    }
    if (!strcmp(s, "flush")) {
        *out = TD__DENORMALS_FLUSH;
        return 0;
    }
    return -1;
}

td__denormals td__denormals_default(void) {
    /* -1: not read yet. Two threads reading it at once read the same value. */
    static atomic_int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const char *s = getenv("TANDEM_DENORMALS");
        td__denormals d = TD__DENORMALS_FLUSH;
        if (s && *s && td__denormals_parse(s, &d) != 0) {
            TD_LOG_WARN("TANDEM_DENORMALS=%s is neither 'keep' nor 'flush'; flushing", s);
            d = TD__DENORMALS_FLUSH;
        }
        v = (int)d;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return (td__denormals)v;
}

int td__denormals_set(td__denormals mode) {
#if defined(TD_FP_MXCSR)
    unsigned csr = _mm_getcsr();
    if (mode == TD__DENORMALS_FLUSH)
        csr |= MXCSR_FTZ | MXCSR_DAZ;
    else
        csr &= ~(MXCSR_FTZ | MXCSR_DAZ);
    _mm_setcsr(csr);
    return 1;
#elif defined(TD_FP_FPCR)
    uint64_t fpcr = read_fpcr();
    write_fpcr(mode == TD__DENORMALS_FLUSH ? fpcr | FPCR_FZ : fpcr & ~FPCR_FZ);
    return 1;
#else
    return mode == TD__DENORMALS_KEEP;
#endif
}

td__denormals td__denormals_get(void) {
#if defined(TD_FP_MXCSR)
    unsigned both = MXCSR_FTZ | MXCSR_DAZ;
    return (_mm_getcsr() & both) == both ? TD__DENORMALS_FLUSH : TD__DENORMALS_KEEP;
#elif defined(TD_FP_FPCR)
    return read_fpcr() & FPCR_FZ ? TD__DENORMALS_FLUSH : TD__DENORMALS_KEEP;
#else
    return TD__DENORMALS_KEEP;
#endif
}

uint64_t td__fp_control_get(void) {
#if defined(TD_FP_MXCSR)
    return _mm_getcsr();
#elif defined(TD_FP_FPCR)
    return read_fpcr();
#else
    return 0;
#endif
}

void td__fp_control_set(uint64_t word) {
#if defined(TD_FP_MXCSR)
    _mm_setcsr((unsigned)word);
#elif defined(TD_FP_FPCR)
    write_fpcr(word);
#else
    (void)word;
#endif
}
