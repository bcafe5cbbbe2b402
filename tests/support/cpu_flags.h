/* What `tandem devices` should say about this CPU's bf16 and int8 products,
 * worked out from /proc/cpuinfo alone, apart from the library's cpuid code. */
#ifndef TD_TEST_CPU_FLAGS_H
#define TD_TEST_CPU_FLAGS_H

/* The class of bf16 products td_device_info.bf16 should start with:
 * "native" where the flags have avx512_bf16, else "emulated". NULL where
 * TANDEM_SIMD caps the ISA or /proc/cpuinfo cannot be read: then a test
 * checks only that the class is one of the two. Static. */
const char *td_test_cpu_bf16_class(void);

/* The class of int8 dot products td_device_info.int8 should start with:
 * "VNNI" where the flags have avx512_vnni with avx512vl, avx512bw, avx512dq
 * and f16c (what the q8_0 kernel needs; AVX-VNNI alone is not used), else
 * "AVX2" with avx2 and fma, else "none". NULL as above. Static. */
const char *td_test_cpu_int8_class(void);

#endif
