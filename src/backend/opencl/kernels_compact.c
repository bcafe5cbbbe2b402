/* Products with compact weights (bf16, q8_0) on OpenCL devices: the
 * matmul_compact slot. As the CPU's kernels (kern_compact.c), x is first
 * rounded to the weights' kind, into scratch (compact_round_x: q8_0 blocks
 * with an f16 scale by vstore_half_rte, or bf16 by rounding to nearest
 * even), then one work-item per output sums a row: int8 block products in
 * int, times the two scales, or exact bf16 products, in the CPU's C path's
 * order, so PoCL gives the CPU's C results bit for bit. The OpenCL C here
 * is appended to td__ocl_source (one program per device and precision; the
 * kernels are f32 in both). attend_step, a decode step's attention on a
 * cache as stored, runs a work-item per query head. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/opencl/opencl-impl.h"
#include "core/error.h"
#include "core/quant.h"

/* clang-format off */
static const char compact_source[] =
    "/* x (n, cols) f32 -> xq: q8_0 blocks (fmt 2) or bf16 (fmt 1). */\n"
    "__kernel void compact_round_x(ulong n, ulong cols, int fmt, C(float, x), G(uchar, xq)) {\n"
    "  CAT(float, x);\n"
    "  AT(uchar, xq);\n"
    "  if (fmt == 1) {\n"
    "    LOOP(e, n * cols) {\n"
    "      uint u = as_uint(x[e]);\n"
    "      ushort h = (u & 0x7fffffffu) > 0x7f800000u ? (ushort)((u >> 16) | 0x40u)\n"
    "                                                : (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "      ((__global ushort *)xq)[e] = h;\n"
    "    }\n"
    "    return;\n"
    "  }\n"
    "  LOOP(b, n * (cols / 32)) {\n"
    "    __global const float *v = x + b * 32;\n"
    "    __global uchar *o = xq + b * 34;\n"
    "    float amax = 0.0f;\n"
    "    for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(v[j]));\n"
    "    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;\n"
    "    vstore_half_rte(d, 0, (__global half *)o);\n"
    "    for (int j = 0; j < 32; j++) ((__global char *)o)[2 + j] = (char)round(v[j] * id);\n"
    "  }\n"
    "}\n"
    "/* y (n, rows) = xq (n, cols) W^T for W (rows, cols) in fmt. */\n"
    "__kernel void matmul_compact(ulong n, ulong rows, ulong cols, int fmt, C(uchar, xq),\n"
    "                             C(uchar, w), G(float, y)) {\n"
    "  CAT(uchar, xq);\n"
    "  CAT(uchar, w);\n"
    "  AT(float, y);\n"
    "  ulong nb = cols / 32;\n"
    "  LOOP(e, n * rows) {\n"
    "    ulong i = e / rows, r = e % rows;\n"
    "    float acc = 0.0f;\n"
    "    if (fmt == 1) {\n"
    "      __global const ushort *wr = (__global const ushort *)w + r * cols;\n"
    "      __global const ushort *xr = (__global const ushort *)xq + i * cols;\n"
    "      for (ulong p = 0; p < cols; p++)\n"
    "        acc += as_float((uint)wr[p] << 16) * as_float((uint)xr[p] << 16);\n"
    "    } else {\n"
    "      __global const uchar *wr = w + r * nb * 34, *xr = xq + i * nb * 34;\n"
    "      for (ulong b = 0; b < nb; b++) {\n"
    "        __global const char *qw = (__global const char *)(wr + b * 34 + 2);\n"
    "        __global const char *qx = (__global const char *)(xr + b * 34 + 2);\n"
    "        int s = 0;\n"
    "        for (int j = 0; j < 32; j++) s += (int)qw[j] * (int)qx[j];\n"
    "        float dw = vload_half(0, (__global const half *)(wr + b * 34));\n"
    "        float dx = vload_half(0, (__global const half *)(xr + b * 34));\n"
    "        acc += (float)s * (dw * dx);\n"
    "      }\n"
    "    }\n"
    "    y[e] = acc;\n"
    "  }\n"
    "}\n"
    "/* n values between f32 and f16 (kind 1) or bf16 (kind 2), to nearest even. */\n"
    "__kernel void convert_half(ulong n, int kind, int to_half, C(uchar, src), G(uchar, dst)) {\n"
    "  CAT(uchar, src);\n"
    "  AT(uchar, dst);\n"
    "  LOOP(e, n) {\n"
    "    if (to_half && kind == 1) {\n"
    "      vstore_half_rte(((__global const float *)src)[e], e, (__global half *)dst);\n"
    "    } else if (to_half) {\n"
    "      uint u = as_uint(((__global const float *)src)[e]);\n"
    "      ((__global ushort *)dst)[e] = (u & 0x7fffffffu) > 0x7f800000u\n"
    "          ? (ushort)((u >> 16) | 0x40u) : (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);\n"
    "    } else if (kind == 1) {\n"
    "      ((__global float *)dst)[e] = vload_half(e, (__global const half *)src);\n"
    "    } else {\n"
    "      ((__global float *)dst)[e] = as_float((uint)((__global const ushort *)src)[e] << 16);\n"
    "    }\n"
    "  }\n"
    "}\n"
    "/* Element e of a cache in kind 0 (f32), 1 (f16) or 2 (bf16), as f32. */\n"
    "float cache_at(int kind, __global const uchar *b, ulong e) {\n"
    "  if (kind == 0) return ((__global const float *)b)[e];\n"
    "  if (kind == 1) return vload_half(e, (__global const half *)b);\n"
    "  return as_float((uint)((__global const ushort *)b)[e] << 16);\n"
    "}\n"
    "/* One position's attention, a work-item per query head i: its scores\n"
    " * against key head i / g into s (h, len), their softmax, y_i = p V. */\n"
    "__kernel void attend_step(ulong h, ulong g, ulong d, ulong len, ulong ld, int kind,\n"
    "                          float scale, C(float, q), C(uchar, k), C(uchar, v), G(float, s),\n"
    "                          G(float, y)) {\n"
    "  CAT(float, q);\n"
    "  CAT(uchar, k);\n"
    "  CAT(uchar, v);\n"
    "  AT(float, s);\n"
    "  AT(float, y);\n"
    "  LOOP(i, h) {\n"
    "    ulong col = (i / g) * d;\n"
    "    __global float *si = s + i * len;\n"
    "    float mx = -INFINITY, sum = 0.0f;\n"
    "    for (ulong t = 0; t < len; t++) {\n"
    "      float acc = 0.0f;\n"
    "      for (ulong c = 0; c < d; c++) acc += q[i * d + c] * cache_at(kind, k, t * ld + col + c);\n"
    "      si[t] = acc * scale;\n"
    "      mx = fmax(mx, si[t]);\n"
    "    }\n"
    "    for (ulong t = 0; t < len; t++) {\n"
    "      si[t] = exp(si[t] - mx);\n"
    "      sum += si[t];\n"
    "    }\n"
    "    for (ulong c = 0; c < d; c++) {\n"
    "      float acc = 0.0f;\n"
    "      for (ulong t = 0; t < len; t++) acc += si[t] * cache_at(kind, v, t * ld + col + c);\n"
    "      y[i * d + c] = acc / sum;\n"
    "    }\n"
    "  }\n"
    "}\n";
/* clang-format on */

static char *all_source;
static pthread_once_t all_once = PTHREAD_ONCE_INIT;

static void join_sources(void) {
    size_t a = strlen(td__ocl_source), b = strlen(compact_source);
    if ((all_source = malloc(a + b + 1))) {
        memcpy(all_source, td__ocl_source, a);
        memcpy(all_source + a, compact_source, b + 1);
    }
}

const char *td__ocl_program_source(void) {
    pthread_once(&all_once, join_sources);
    return all_source;
}

td_status td__ocl_matmul_compact(void *ctx, td_weights fmt, int64_t n, int64_t rows, int64_t cols,
                                 const float *x, const void *w, float *y) {
    ocl_device *od = ctx;
    size_t xbytes = (size_t)n * td__compact_row_bytes(fmt, cols);
    cl_mem xq;
    td_ocl_args a;
    if (n <= 0 || rows <= 0)
        return TD_OK;
    if (fmt == TD_WEIGHTS_Q8_0 && cols % TD_Q8_0_BLOCK)
        return td__error(TD_ERR_INVALID_ARG,
                         "matmul_compact: q8_0 rows of %lld values are not whole blocks of 32",
                         (long long)cols);
    TD_CHECK(td__ocl_scratch(od, xbytes, &xq));
    TD_CHECK(td__ocl_begin(&a, od, TD_F32, TD_OCL_K_COMPACT_ROUND_X));
    td__ocl_arg_u64(&a, (uint64_t)n);
    td__ocl_arg_u64(&a, (uint64_t)cols);
    td__ocl_arg_int(&a, (int)fmt);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_mem(&a, xq, 0);
    TD_CHECK(td__ocl_run(&a, fmt == TD_WEIGHTS_Q8_0 ? (size_t)(n * (cols / TD_Q8_0_BLOCK))
                                                    : (size_t)(n * cols)));
    TD_CHECK(td__ocl_begin(&a, od, TD_F32, TD_OCL_K_MATMUL_COMPACT));
    td__ocl_arg_u64(&a, (uint64_t)n);
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)cols);
    td__ocl_arg_int(&a, (int)fmt);
    td__ocl_arg_mem(&a, xq, 0);
    td__ocl_arg_ptr(&a, w);
    td__ocl_arg_ptr(&a, y);
    return td__ocl_run(&a, (size_t)(n * rows));
}

td_status td__ocl_convert_half(void *ctx, int kind, int to_half, size_t n, const void *src,
                               void *dst) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, TD_F32, TD_OCL_K_CONVERT_HALF));
    td__ocl_arg_u64(&a, (uint64_t)n);
    td__ocl_arg_int(&a, kind);
    td__ocl_arg_int(&a, to_half);
    td__ocl_arg_ptr(&a, src);
    td__ocl_arg_ptr(&a, dst);
    return td__ocl_run(&a, n);
}

td_status td__ocl_attend_step(void *ctx, int kind, int64_t h, int64_t kv, int64_t d, int64_t len,
                              float scale, const float *q, const void *k, const void *v, int64_t ld,
                              float *y) {
    ocl_device *od = ctx;
    cl_mem s;
    td_ocl_args a;
    if (kind < 0 || kind > 2 || h < 1 || kv < 1 || h % kv || d < 1 || len < 1 || ld < 1)
        return td__error(TD_ERR_INVALID_ARG,
                         "attend_step: kind %d, %lld heads over %lld, d %lld, %lld positions, "
                         "rows of %lld",
                         kind, (long long)h, (long long)kv, (long long)d, (long long)len,
                         (long long)ld);
    TD_CHECK(td__ocl_scratch(od, (size_t)(h * len) * sizeof(float), &s));
    TD_CHECK(td__ocl_begin(&a, od, TD_F32, TD_OCL_K_ATTEND_STEP));
    td__ocl_arg_u64(&a, (uint64_t)h);
    td__ocl_arg_u64(&a, (uint64_t)(h / kv));
    td__ocl_arg_u64(&a, (uint64_t)d);
    td__ocl_arg_u64(&a, (uint64_t)len);
    td__ocl_arg_u64(&a, (uint64_t)ld);
    td__ocl_arg_int(&a, kind);
    td__ocl_arg_real(&a, scale);
    td__ocl_arg_ptr(&a, q);
    td__ocl_arg_ptr(&a, k);
    td__ocl_arg_ptr(&a, v);
    td__ocl_arg_mem(&a, s, 0);
    td__ocl_arg_ptr(&a, y);
    return td__ocl_run(&a, (size_t)h);
}
