/* Philox4x32-10 as an inline function that host and device code share, so a
 * GPU kernel makes exactly the numbers td_rng_uniform() makes on the host. */
#ifndef TD_CORE_PHILOX_H
#define TD_CORE_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define TD_HD __host__ __device__
#else
#define TD_HD
#endif

#define TD_PHILOX_M0 0xD2511F53u
#define TD_PHILOX_M1 0xCD9E8D57u
#define TD_PHILOX_W0 0x9E3779B9u
#define TD_PHILOX_W1 0xBB67AE85u

static inline TD_HD void td__philox4x32(const uint32_t ctr[4], uint64_t key, uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)TD_PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)TD_PHILOX_M1 * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c0 = n0;
        c1 = (uint32_t)p1;
        c2 = n2;
        c3 = (uint32_t)p0;
        k0 += TD_PHILOX_W0;
        k1 += TD_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* 53 random bits from two words, as a double in [0, 1). */
static inline TD_HD double td__u53(uint32_t hi, uint32_t lo) {
    uint64_t bits = ((uint64_t)hi << 21) ^ (lo >> 11);
    return (double)(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

/* Position i of stream `seed`: block i/2, two of its four words. */
static inline TD_HD double td__rng_uniform_at(uint64_t seed, uint64_t i) {
    uint32_t ctr[4] = {(uint32_t)(i >> 1), (uint32_t)(i >> 33), 0, 0}, r[4];
    td__philox4x32(ctr, seed, r);
    return (i & 1) ? td__u53(r[2], r[3]) : td__u53(r[0], r[1]);
}

/* Box-Muller over the pair that position i belongs to. */
static inline TD_HD double td__rng_normal_at(uint64_t seed, uint64_t i) {
    uint32_t ctr[4] = {(uint32_t)(i >> 1), (uint32_t)(i >> 33), 0, 0}, r[4];
    td__philox4x32(ctr, seed, r);
    double u1 = 1.0 - td__u53(r[0], r[1]);
    double u2 = td__u53(r[2], r[3]);
    double radius = sqrt(-2.0 * log(u1));
    double angle = 6.283185307179586476925 * u2;
    return (i & 1) ? radius * sin(angle) : radius * cos(angle);
}

#endif
