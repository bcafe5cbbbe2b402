/* Every op of the kernel table on OpenCL (opencl:0.0; PoCL in CI) against
 * the CPU backend (cpu:0), through the tensor-level API, in f64 and f32 on
 * small odd shapes (the cases shared with CUDA are in
 * tests/support/backend_ops.c); plus the OpenCL-only paths: the plain GEMM
 * kernel, build failures carry the build log, program binaries are cached,
 * and f64 without cl_khr_fp64 is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/support.h"

#ifndef TD_HAVE_OPENCL
int main(void) {
    td_test_skip("no OpenCL device (built without OpenCL)");
}
#else

#define CL_TARGET_OPENCL_VERSION 120
#include "backend/opencl/opencl-impl.h"
#include "support/backend_ops.h"
#include "tensor/ops.h"

static const td_ops_backend opencl = {"opencl", "OpenCL", "opencl:0.0", &td__opencl_kernels};

/* OpenCL-only paths ---------------------------------------------------------------------- */

/* The plain GEMM kernel (what builds without CLBlast use) against the CPU's
 * GEMM, on the operands of td_ops_batched_build, every transpose and k = 0. */
static td_status plain_run(td_ops_side *s, const void *p) {
    const int *tt = p;
    int ta = tt[0], tb = tt[1];
    /* a: 3 of (5, 11) or (11, 5), ld 13; b: 3 of (11, 7) or (7, 11), ld 11 */
    td_gemm_operand a = {s->t[0], 5, 13, 150}, b = {s->t[1], 0, 11, 130}, c = {s->t[2], 1, 8, 60};
    ocl_device *od;
    cl_mem am, bm, cm;
    size_t ao, bo, co, es = td_dtype_size(s->dt);
    td_status st;
    if (strcmp(td_device_name(s->dev), "opencl:0.0") != 0) {
        if ((st = td__op_gemm_batched(ta, tb, 5, 7, 11, 1.3, a, b, 0.4, c, 3)) != TD_OK)
            return st;
        return td__op_gemm_batched(ta, tb, 5, 7, 0, 1.3, a, b, 0.5, c, 1);
    }
    od = td__device_ctx(s->dev);
    if ((st = td__ocl_resolve(od, s->t[0]->data, &am, &ao)) ||
        (st = td__ocl_resolve(od, s->t[1]->data, &bm, &bo)) ||
        (st = td__ocl_resolve(od, s->t[2]->data, &cm, &co)))
        return st;
    if ((st = td__ocl_gemm_plain(od, s->dt, ta, tb, 5, 7, 11, 1.3, am, ao / es + 5, 13, 150, bm,
                                 bo / es, 11, 130, 0.4, cm, co / es + 1, 8, 60, 3)) != TD_OK)
        return st;
    return td__ocl_gemm_plain(od, s->dt, ta, tb, 5, 7, 0, 1.3, am, ao / es + 5, 13, 150, bm,
                              bo / es, 11, 130, 0.5, cm, co / es + 1, 8, 60, 1);
}

static void plain_gemm_kernel_matches(void **state) {
    static const int outs[] = {2, -1};
    static const int tt[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
    for (int i = 0; i < 4; i++)
        td_ops_compare("gemm_plain", td_ops_batched_build, plain_run, tt[i], outs);
}

typedef struct build_arg {
    const char *src;
    int from_cache;
} build_arg;

static td_status build_on_device(td_device *dev, void *arg) {
    build_arg *b = arg;
    cl_program prog = NULL;
    td_status st =
        td__ocl_build(td__device_ctx(dev), b->src, "-cl-std=CL1.2", &prog, &b->from_cache);
    if (prog)
        clReleaseProgram(prog);
    return st;
}

static void broken_source_gives_the_build_log(void **state) {
    build_arg b = {"__kernel void k(__global float *x) { x[0] = undeclared_thing; }\n", 0};
    TD_ASSERT_STATUS(td_device_run(td_ops_device(1), build_on_device, &b), TD_ERR_DEVICE);
    td_test_assert_message_contains("opencl:0.0");
    td_test_assert_message_contains("CL_BUILD_PROGRAM_FAILURE");
    td_test_assert_message_contains("undeclared_thing"); /* from the build log */
}

static void binaries_are_cached_by_source(void **state) {
    char dir[] = "/tmp/td-ocl-cache-XXXXXX", got[256];
    char *old = getenv("TD_OPENCL_CACHE") ? strdup(getenv("TD_OPENCL_CACHE")) : NULL;
    build_arg b = {"__kernel void k(__global float *x) { x[0] = 1.5f; }\n", -1};
    assert_non_null(mkdtemp(dir));
    setenv("TD_OPENCL_CACHE", dir, 1);
    td__ocl_cache_dir(got, sizeof got);
    assert_string_equal(got, dir);
    TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
    assert_int_equal(b.from_cache, 0);
    TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
    assert_int_equal(b.from_cache, 1);
    {
        /* a damaged cache file is rebuilt from source and replaced */
        char cmd[300];
        snprintf(cmd, sizeof cmd, "for f in '%s'/*.bin; do echo damaged > \"$f\"; done", dir);
        assert_int_equal(system(cmd), 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 1);
    }
    {
        /* A binary runs as kernels, and its sum is no MAC: a folder or a file
         * that others can write is not read from (and the folder not
         * written to); a file others could write is rebuilt and replaced. */
        char cmd[300];
        assert_int_equal(chmod(dir, 0777), 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 0);
        assert_int_equal(chmod(dir, 0700), 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 1);
        snprintf(cmd, sizeof cmd, "chmod 666 '%s'/*.bin", dir);
        assert_int_equal(system(cmd), 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 1);
        snprintf(cmd, sizeof cmd, "[ -z \"$(find '%s' -name '*.bin' -perm /022)\" ]", dir);
        assert_int_equal(system(cmd), 0);
    }
    b.src = "__kernel void k(__global float *x) { x[0] = 2.5f; }\n"; /* another source */
    TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
    assert_int_equal(b.from_cache, 0);
    {
        /* One source's entry under the other's name (a renamed or planted
         * file) is not taken; nor is a binary with bytes changed after its
         * header; and writing leaves no temporary file behind. */
        const char *first = "__kernel void k(__global float *x) { x[0] = 1.5f; }\n";
        const char *second = b.src;
        char cmd[400];
        int cached = 0;
        snprintf(cmd, sizeof cmd, "set -- '%s'/*.bin; [ $# -eq 2 ] && cp \"$1\" \"$2\"", dir);
        assert_int_equal(system(cmd), 0);
        b.src = first;
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        cached += b.from_cache;
        b.src = second;
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        cached += b.from_cache;
        assert_int_equal(cached, 1);
        snprintf(cmd, sizeof cmd,
                 "for f in '%s'/*.bin; do printf 'XYZW' | dd of=\"$f\" bs=1 seek=48 conv=notrunc "
                 "2>/dev/null; done",
                 dir);
        assert_int_equal(system(cmd), 0);
        TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
        assert_int_equal(b.from_cache, 0);
        snprintf(cmd, sizeof cmd, "[ -z \"$(ls '%s' | grep -v '\\.bin$')\" ]", dir);
        assert_int_equal(system(cmd), 0);
    }
    setenv("TD_OPENCL_CACHE", "off", 1);
    td__ocl_cache_dir(got, sizeof got);
    assert_string_equal(got, "");
    TD_ASSERT_OK(td_device_run(td_ops_device(1), build_on_device, &b));
    assert_int_equal(b.from_cache, 0);
    if (old)
        setenv("TD_OPENCL_CACHE", old, 1);
    else
        unsetenv("TD_OPENCL_CACHE");
    free(old);
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

static td_status add_without_fp64(td_device *dev, void *arg) {
    ocl_device *od = td__device_ctx(dev);
    td_tensor **t = arg;
    int had = od->fp64;
    td_status st;
    od->fp64 = 0; /* as a device without cl_khr_fp64 */
    st = td__op_add(t[0], t[0], t[1]);
    od->fp64 = had;
    return st;
}

static void f64_is_refused_without_fp64(void **state) {
    td_device *dev = td_ops_device(1);
    int64_t n = 5;
    td_tensor *t[2] = {NULL, NULL};
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 1, &n, &t[0]));
    TD_ASSERT_OK(td_tensor_create(dev, TD_F64, 1, &n, &t[1]));
    TD_ASSERT_STATUS(td_device_run(dev, add_without_fp64, t), TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("opencl:0.0");
    td_test_assert_message_contains("fp64");
    td_tensor_destroy(t[0]);
    td_tensor_destroy(t[1]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        TD_OPS_ALL_CASES,
        cmocka_unit_test(plain_gemm_kernel_matches),
        cmocka_unit_test(broken_source_gives_the_build_log),
        cmocka_unit_test(binaries_are_cached_by_source),
        cmocka_unit_test(f64_is_refused_without_fp64),
    };
    int rc;
    if (td_ops_begin(&opencl) != TD_OK)
        td_test_skip("no OpenCL device");
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    td_ops_end();
    return rc;
}

#endif
