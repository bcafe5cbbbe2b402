/* Compact number formats for weights: bf16, f16 (q8_0's scale) and q8_0,
 * converted bit for bit as the formats' owners define them, so a weight
 * written here reads the same in PyTorch (bf16), numpy (f16) and llama.cpp
 * (q8_0). Pure functions over host memory; kernels that compute on compact
 * weights live with their backends. */
#ifndef TD_CORE_QUANT_H
#define TD_CORE_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* q8_0 (ggml's block_q8_0): 32 weights share one f16 scale d = amax / 127;
 * each weight is q = round(x / d) (half away from zero), read as q * d. */
#define TD_Q8_0_BLOCK 32
#define TD_Q8_0_BYTES 34 /* the scale's 2 bytes, then the 32 int8s */

typedef struct td_block_q8_0 {
    uint16_t d;               /* f16 bits */
    int8_t qs[TD_Q8_0_BLOCK]; /* in [-127, 127] */
} td_block_q8_0;

/* Bytes of one row of cols weights in a compact format (1: bf16, 2: q8_0,
 * as td_weights; cols a multiple of 32 for q8_0). */
static inline size_t td__compact_row_bytes(int fmt, int64_t cols) {
    return fmt == 2 ? (size_t)(cols / TD_Q8_0_BLOCK) * TD_Q8_0_BYTES : (size_t)cols * 2u;
}

/* f32 -> bf16 by rounding to nearest, ties to even; NaN stays NaN (quiet,
 * sign kept), infinities and subnormals round like any other value. */
uint16_t td__f32_to_bf16(float x);
float td__bf16_to_f32(uint16_t h);

/* f32 -> IEEE binary16 by rounding to nearest, ties to even (as numpy's
 * astype(float16) and F16C's vcvtps2ph): overflow to inf, NaN quiet. */
uint16_t td__f32_to_f16(float x);
float td__f16_to_f32(uint16_t h);

/* n (a multiple of 32) values of x into n / 32 blocks, as ggml's
 * quantize_row_q8_0_ref and the gguf package's Q8_0.quantize_blocks. */
void td__quantize_q8_0(const float *x, size_t n, td_block_q8_0 *out);
/* n values back: y = q * d. */
void td__dequantize_q8_0(const td_block_q8_0 *b, size_t n, float *y);

/* The packed 34-byte form that q8_0 weights take in memory and on disk
 * (no padding between blocks): block i at 34 i. */
void td__q8_0_pack(const td_block_q8_0 *b, size_t nblocks, uint8_t *out);
void td__q8_0_unpack(const uint8_t *in, size_t nblocks, td_block_q8_0 *b);

#endif
