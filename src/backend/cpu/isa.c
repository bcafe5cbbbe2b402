/* What SIMD the CPU offers: cpuid for the listing, and the OS's saved state
 * (xgetbv) for what kernels may actually use. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu-impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

typedef struct cpu_features {
    unsigned sse42 : 1, avx : 1, fma : 1, avx2 : 1, f16c : 1;
    unsigned avx512f : 1, avx512dq : 1, avx512bw : 1, avx512vl : 1, avx512vnni : 1;
    unsigned avx512bf16 : 1, avx512fp16 : 1, amx : 1;
    unsigned os_avx : 1, os_avx512 : 1;
} cpu_features;

static unsigned long long xgetbv0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static cpu_features detect(void) {
    cpu_features f;
    unsigned a, b, c, d;
    memset(&f, 0, sizeof f);
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return f;
    f.sse42 = (c >> 20) & 1;
    f.avx = (c >> 28) & 1;
    f.fma = (c >> 12) & 1;
    f.f16c = (c >> 29) & 1;
    if ((c >> 27) & 1) { /* OSXSAVE */
        unsigned long long xcr0 = xgetbv0();
        f.os_avx = (xcr0 & 0x6) == 0x6;
        f.os_avx512 = (xcr0 & 0xe6) == 0xe6;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f.avx2 = (b >> 5) & 1;
        f.avx512f = (b >> 16) & 1;
        f.avx512dq = (b >> 17) & 1;
        f.avx512bw = (b >> 30) & 1;
        f.avx512vl = (b >> 31) & 1;
        f.avx512vnni = (c >> 11) & 1;
        f.avx512fp16 = (d >> 23) & 1;
        f.amx = (d >> 24) & 1;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        f.avx512bf16 = (a >> 5) & 1;
    return f;
}

void td__cpu_isa_string(char *buf, size_t n) {
    cpu_features f = detect();
    size_t used = 0;
    struct {
        unsigned on;
        const char *name;
    } list[] = {
        {f.sse42, "SSE4.2"},
        {f.avx, "AVX"},
        {f.avx2, "AVX2"},
        {f.fma, "FMA"},
        {f.f16c, "F16C"},
        {f.avx512f, "AVX-512F"},
        {f.avx512dq, "AVX-512DQ"},
        {f.avx512bw, "AVX-512BW"},
        {f.avx512vl, "AVX-512VL"},
        {f.avx512vnni, "AVX-512-VNNI"},
        {f.avx512bf16, "AVX-512-BF16"},
        {f.avx512fp16, "AVX-512-FP16"},
        {f.amx, "AMX-BF16"},
    };
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof list / sizeof *list; i++)
        if (list[i].on && used + 1 < n)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? " " : "", list[i].name);
}

td_cpu_simd td__cpu_simd(void) {
    static atomic_int cached = -1;
    int level;
    const char *env;
    cpu_features f;
    if (atomic_load(&cached) >= 0)
        return (td_cpu_simd)atomic_load(&cached);
    f = detect();
    level = TD_SIMD_SCALAR;
    if (f.avx2 && f.fma && f.os_avx)
        level = TD_SIMD_AVX2;
    if (f.avx512f && f.os_avx512)
        level = TD_SIMD_AVX512;
    env = getenv("TANDEM_SIMD");
    if (env) {
        int cap = !strcmp(env, "scalar") ? TD_SIMD_SCALAR
                  : !strcmp(env, "avx2") ? TD_SIMD_AVX2
                                         : TD_SIMD_AVX512;
        if (cap < level)
            level = cap;
    }
    atomic_store(&cached, level); /* every thread computes the same value */
    return (td_cpu_simd)level;
}

/* TANDEM_SIMD=avx512f keeps AVX-512 but not its VNNI and BF16 extensions. */
static int extensions_allowed(void) {
    const char *env = getenv("TANDEM_SIMD");
    return td__cpu_simd() == TD_SIMD_AVX512 && !(env && !strcmp(env, "avx512f"));
}

/* cpuid traps to the hypervisor on virtual machines: ask once. */
static int cached_extension(atomic_int *cache, int want_bf16) {
    int v = atomic_load(cache);
    if (v < 0) {
        cpu_features f = detect();
        v = extensions_allowed() &&
            (want_bf16 ? f.avx512bf16
                       : f.avx512vnni && f.avx512vl && f.avx512bw && f.avx512dq && f.f16c);
        atomic_store(cache, v); /* every thread computes the same value */
    }
    return v;
}

int td__cpu_has_vnni(void) {
    static atomic_int cached = -1;
    return cached_extension(&cached, 0);
}

int td__cpu_has_bf16(void) {
    static atomic_int cached = -1;
    return cached_extension(&cached, 1);
}

#else

int td__cpu_has_vnni(void) {
    return 0;
}
int td__cpu_has_bf16(void) {
    return 0;
}

void td__cpu_isa_string(char *buf, size_t n) {
    snprintf(buf, n, "scalar");
}
td_cpu_simd td__cpu_simd(void) {
    return TD_SIMD_SCALAR;
}

#endif
