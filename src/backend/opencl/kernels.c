/* The td_kernels table for OpenCL: OpenCL C compiled at run time, one
 * program per device, launched on the device's in-order queue. */
#include "backend/opencl/opencl-impl.h"
#include "core/error.h"

/* Philox here must match src/core/philox.h bit for bit: the tests compare. */
const char td__ocl_source[] =
    /* No fused multiply-add: the host computes a + b * u with two roundings. */
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "#ifdef TD_FP64\n"
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "typedef double real_t;\n"
    "#else\n"
    "typedef float real_t;\n"
    "#endif\n"
    "void philox(uint c0, uint c1, uint c2, uint c3, ulong key, uint *out) {\n"
    "  uint k0 = (uint)key, k1 = (uint)(key >> 32);\n"
    "  for (int r = 0; r < 10; r++) {\n"
    "    uint hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;\n"
    "    uint hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;\n"
    "    uint n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;\n"
    "    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;\n"
    "    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;\n"
    "  }\n"
    "  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;\n"
    "}\n"
    "real_t u53(uint hi, uint lo) {\n"
    "  ulong bits = (((ulong)hi << 21) ^ (lo >> 11)) & ((1ul << 53) - 1);\n"
    "  return (real_t)bits * (real_t)(1.0 / 9007199254740992.0);\n"
    "}\n"
    "real_t rng_at(ulong seed, ulong i, int normal) {\n"
    "  uint r[4];\n"
    "  philox((uint)(i >> 1), (uint)(i >> 33), 0, 0, seed, r);\n"
    "  if (!normal) return (i & 1) ? u53(r[2], r[3]) : u53(r[0], r[1]);\n"
    "  real_t u1 = (real_t)1 - u53(r[0], r[1]), u2 = u53(r[2], r[3]);\n"
    "  real_t radius = sqrt((real_t)-2 * log(u1));\n"
    "  real_t angle = (real_t)6.283185307179586476925 * u2;\n"
    "  return (i & 1) ? radius * sin(angle) : radius * cos(angle);\n"
    "}\n"
    "__kernel void fill_f32(__global float *x, ulong off, ulong n, float v) {\n"
    "  x = (__global float *)((__global char *)x + off);\n"
    "  for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) x[i] = v;\n"
    "}\n"
    "__kernel void rng_f32(__global float *x, ulong off, ulong n, int normal, ulong seed,\n"
    "                      ulong offset, double a, double b) {\n"
    "  x = (__global float *)((__global char *)x + off);\n"
    "  for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) {\n"
    "    real_t u = rng_at(seed, offset + i, normal);\n"
    "    x[i] = (float)(normal ? (real_t)a + (real_t)b * u : (real_t)a + ((real_t)b - "
    "(real_t)a) * u);\n"
    "  }\n"
    "}\n"
    "#ifdef TD_FP64\n"
    "__kernel void fill_f64(__global double *x, ulong off, ulong n, double v) {\n"
    "  x = (__global double *)((__global char *)x + off);\n"
    "  for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) x[i] = v;\n"
    "}\n"
    "__kernel void rng_f64(__global double *x, ulong off, ulong n, int normal, ulong seed,\n"
    "                      ulong offset, double a, double b) {\n"
    "  x = (__global double *)((__global char *)x + off);\n"
    "  for (ulong i = get_global_id(0); i < n; i += get_global_size(0)) {\n"
    "    double u = rng_at(seed, offset + i, normal);\n"
    "    x[i] = normal ? a + b * u : a + (b - a) * u;\n"
    "  }\n"
    "}\n"
    "#endif\n";

/* A 1-D launch over n items; the kernels loop, so the grid stays bounded. */
static td_status launch(ocl_device *od, cl_kernel k, size_t n, const char *name) {
    size_t global = n < 65536 ? (n ? n : 1) : 65536;
    TD_OCL_CHECK(clEnqueueNDRangeKernel(od->queue, k, 1, NULL, &global, NULL, 0, NULL, NULL), od);
    (void)name;
    return TD_OK;
}

static td_status f64_check(const ocl_device *od, td_dtype dt) {
    if (dt == TD_F64 && !od->fp64)
        return td__error(TD_ERR_UNSUPPORTED, "%s has no fp64 (cl_khr_fp64)", od->name);
    return TD_OK;
}

static td_status ocl_fill(void *ctx, void *x, td_dtype dt, size_t n, double value) {
    ocl_device *od = ctx;
    cl_kernel k;
    cl_mem mem = NULL;
    size_t off = 0;
    cl_ulong off64, n64 = n;
    td_status st;
    if (n == 0)
        return TD_OK;
    if ((st = f64_check(od, dt)) || (st = td__ocl_resolve(od, x, &mem, &off)) ||
        (st = td__ocl_kernel(od, dt == TD_F64 ? "fill_f64" : "fill_f32", &k)))
        return st;
    off64 = off;
    clSetKernelArg(k, 0, sizeof mem, &mem);
    clSetKernelArg(k, 1, sizeof off64, &off64);
    clSetKernelArg(k, 2, sizeof n64, &n64);
    if (dt == TD_F64) {
        TD_OCL_CHECK(clSetKernelArg(k, 3, sizeof value, &value), od);
    } else {
        float v = (float)value;
        TD_OCL_CHECK(clSetKernelArg(k, 3, sizeof v, &v), od);
    }
    return launch(od, k, n, "fill");
}

static td_status ocl_rng(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                         uint64_t offset, double a, double b) {
    ocl_device *od = ctx;
    cl_kernel k;
    cl_mem mem = NULL;
    size_t off = 0;
    cl_ulong off64, n64 = n, seed64 = seed, offset64 = offset;
    cl_int normal = kind == TD_RNG_NORMAL;
    td_status st;
    if (n == 0)
        return TD_OK;
    if ((st = f64_check(od, dt)) || (st = td__ocl_resolve(od, x, &mem, &off)) ||
        (st = td__ocl_kernel(od, dt == TD_F64 ? "rng_f64" : "rng_f32", &k)))
        return st;
    off64 = off;
    clSetKernelArg(k, 0, sizeof mem, &mem);
    clSetKernelArg(k, 1, sizeof off64, &off64);
    clSetKernelArg(k, 2, sizeof n64, &n64);
    clSetKernelArg(k, 3, sizeof normal, &normal);
    clSetKernelArg(k, 4, sizeof seed64, &seed64);
    clSetKernelArg(k, 5, sizeof offset64, &offset64);
    clSetKernelArg(k, 6, sizeof a, &a);
    TD_OCL_CHECK(clSetKernelArg(k, 7, sizeof b, &b), od);
    return launch(od, k, n, "rng");
}

const td_kernels td__opencl_kernels = {
    .fill = ocl_fill,
    .rng = ocl_rng,
};
