/* bf16, f16 and q8_0 conversions (core/quant.h). Written on the bits, not
 * with the CPU's conversion instructions: those flush subnormals
 * (vcvtneps2bf16) or may not exist, and files must not depend on the CPU
 * that wrote them. */
#include "core/quant.h"

#include <math.h>
#include <string.h>

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t td__f32_to_bf16(float x) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* NaN: keep sign and payload top, quiet */
    /* adding 0x7fff plus the kept part's lowest bit rounds half to even; a
     * carry into the exponent is the right rounding (up to inf included) */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float td__bf16_to_f32(uint16_t h) {
    return bits_f32((uint32_t)h << 16);
}

uint16_t td__f32_to_f16(float x) {
    uint32_t u = f32_bits(x), sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
    if (abs >= 0x477ff000u) /* 65520 and up round to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {
        /* below f16's smallest normal 2^-14: a multiple of 2^-24, rounded to
         * nearest even by the FPU's own float addition (exact otherwise) */
        float r = bits_f32(abs) + 0.5f; /* ulp of 0.5f is 2^-24 */
        return (uint16_t)(sign | (f32_bits(r) - 0x3f000000u));
    }
    /* normal: rebias the exponent (127 -> 15), round 13 mantissa bits away */
    abs += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | (abs >> 13));
}

float td__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) /* zero or subnormal: m 2^-24, exact in f32 */
        return sign ? -ldexpf((float)m, -24) : ldexpf((float)m, -24);
    return bits_f32(sign | ((e + 127 - 15) << 23) | (m << 13));
}

void td__quantize_q8_0(const float *x, size_t n, td_block_q8_0 *out) {
    for (size_t b = 0; b < n / TD_Q8_0_BLOCK; b++) {
        const float *v = x + b * TD_Q8_0_BLOCK;
        float amax = 0.0f, d, id;
        for (int j = 0; j < TD_Q8_0_BLOCK; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        /* ggml divides by d in f32 before d is rounded to f16: keep that */
        d = amax / 127.0f;
        id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = td__f32_to_f16(d);
        for (int j = 0; j < TD_Q8_0_BLOCK; j++)
            out[b].qs[j] = (int8_t)roundf(v[j] * id);
    }
}

void td__dequantize_q8_0(const td_block_q8_0 *b, size_t n, float *y) {
    for (size_t i = 0; i < n / TD_Q8_0_BLOCK; i++) {
        float d = td__f16_to_f32(b[i].d);
        for (int j = 0; j < TD_Q8_0_BLOCK; j++)
            y[i * TD_Q8_0_BLOCK + j] = (float)b[i].qs[j] * d;
    }
}

void td__q8_0_pack(const td_block_q8_0 *b, size_t nblocks, uint8_t *out) {
    for (size_t i = 0; i < nblocks; i++) {
        uint8_t *o = out + i * TD_Q8_0_BYTES;
        o[0] = (uint8_t)(b[i].d & 0xffu); /* little-endian, as ggml on x86 */
        o[1] = (uint8_t)(b[i].d >> 8);
        memcpy(o + 2, b[i].qs, TD_Q8_0_BLOCK);
    }
}

void td__q8_0_unpack(const uint8_t *in, size_t nblocks, td_block_q8_0 *b) {
    for (size_t i = 0; i < nblocks; i++) {
        const uint8_t *p = in + i * TD_Q8_0_BYTES;
        b[i].d = (uint16_t)(p[0] | (p[1] << 8));
        memcpy(b[i].qs, p + 2, TD_Q8_0_BLOCK);
    }
}
