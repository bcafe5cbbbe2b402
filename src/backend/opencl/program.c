/* Programs for OpenCL devices: built at run time from source, once per device
 * and precision, with the compiled binary cached on disk so that later runs
 * skip the (slow, on PoCL) compiler. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/opencl/opencl-impl.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"

static const char *const kernel_names[TD_OCL_KERNEL_COUNT] = {
#define TD_OCL_NAME(id, name) #name,
    TD_OCL_KERNELS(TD_OCL_NAME)
#undef TD_OCL_NAME
};

const char *td__ocl_kernel_name(td_ocl_kernel_id id) {
    return (unsigned)id < TD_OCL_KERNEL_COUNT ? kernel_names[id] : "?";
}

/* The binary cache -------------------------------------------------------- */

void td__ocl_cache_dir(char *buf, size_t n) {
    const char *env = getenv("TD_OPENCL_CACHE"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    buf[0] = '\0';
    if (env && *env) {
        if (strcmp(env, "off") && strcmp(env, "0"))
            snprintf(buf, n, "%s", env);
    } else if (xdg && *xdg) {
        snprintf(buf, n, "%s/tandem/opencl", xdg);
    } else if (home && *home) {
        snprintf(buf, n, "%s/.cache/tandem/opencl", home);
    }
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t fnv1a_str(uint64_t h, const char *s) {
    return fnv1a(h, s, strlen(s) + 1); /* the NUL keeps "ab"+"c" apart from "a"+"bc" */
}

/* A cache entry: this header, then the binary. The key repeats the hash of
 * (device, driver, options, source) the file is named by, so a file renamed
 * or written for something else is not taken; the sum is the binary's own
 * hash, so a torn or altered binary is not handed to the driver. */
typedef struct cache_header {
    char magic[8]; /* "TDOCLBIN" */
    uint64_t key, sum, size;
} cache_header;

/* mkdir -p; failures show up when the file is written. */
static void make_dirs(const char *path) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        (void)mkdir(buf, 0700);
        *p = '/';
    }
}

/* Whether the cache folder dir can be trusted, made (mode 0700) when it is
 * missing. A cached binary goes to the driver as it is and runs as the
 * device's code (PoCL's is native code, run in this process), and the
 * header's sum only catches a torn or damaged file: anyone who can write
 * the folder can write a binary with a matching sum. A MAC would need a
 * secret kept somewhere only this user can read, which is the same
 * requirement, so instead the folder must be a real folder of this user's
 * that no one else can write (as ssh asks of ~/.ssh); the files are checked
 * the same way when read (cache_read). A shared folder (TD_OPENCL_CACHE=/tmp,
 * say) is not used, and the run says so once. */
static int cache_dir_trusted(const char *dir) {
    static atomic_int warned;
    char file[600];
    struct stat sb;
    snprintf(file, sizeof file, "%s/x", dir);
    make_dirs(file);
    if (lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_uid == geteuid() &&
        !(sb.st_mode & (S_IWGRP | S_IWOTH)))
        return 1;
    if (!atomic_exchange(&warned, 1))
        TD_LOG_WARN("%s: %s, so the OpenCL binary cache is not used (a binary planted there "
                    "would run as kernels); give TD_OPENCL_CACHE a folder only you can write "
                    "(chmod 700), or off",
                    dir,
                    lstat(dir, &sb) != 0     ? strerror(errno)
                    : !S_ISDIR(sb.st_mode)   ? "not a folder"
                    : sb.st_uid != geteuid() ? "another user's folder"
                                             : "a folder others can write");
    return 0;
}

/* The cache file for (device, options, source), or "" when caching is off;
 * *key gets the hash it is named by. */
static void cache_path(const ocl_device *od, const char *src, const char *opts, char *path,
                       size_t n, uint64_t *key) {
    char dir[512], info[256];
    uint64_t h = 0xcbf29ce484222325ull;
    static const cl_device_info keys[] = {CL_DEVICE_NAME, CL_DEVICE_VENDOR, CL_DEVICE_VERSION,
                                          CL_DRIVER_VERSION};
    td__ocl_cache_dir(dir, sizeof dir);
    path[0] = '\0';
    if (!dir[0] || !cache_dir_trusted(dir))
        return;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        info[0] = '\0';
        clGetDeviceInfo(od->device, keys[i], sizeof info - 1, info, NULL);
        info[sizeof info - 1] = '\0';
        h = fnv1a_str(h, info);
    }
    info[0] = '\0';
    clGetPlatformInfo(od->platform, CL_PLATFORM_VERSION, sizeof info - 1, info, NULL);
    info[sizeof info - 1] = '\0';
    h = fnv1a_str(h, info);
    h = fnv1a_str(h, opts);
    h = fnv1a_str(h, src);
    *key = h;
    snprintf(path, n, "%s/%016llx.bin", dir, (unsigned long long)h);
}

/* The cached binary at path, malloc'ed, or NULL when absent or when its
 * header does not vouch for it (another key, a size or sum that differs). */
static unsigned char *cache_read(const char *path, uint64_t key, size_t *size) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    unsigned char *buf = NULL;
    cache_header h;
    struct stat sb;
    FILE *f;
    if (fd < 0)
        return NULL;
    /* This user's, and writable by no one else (see cache_dir_trusted). */
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() ||
        (sb.st_mode & (S_IWGRP | S_IWOTH))) {
        TD_LOG_INFO("%s: not a file only this user can write; rebuilding", path);
        close(fd);
        return NULL;
    }
    if (!(f = fdopen(fd, "rb"))) {
        close(fd);
        return NULL;
    }
    if (fread(&h, sizeof h, 1, f) == 1 && !memcmp(h.magic, "TDOCLBIN", 8) && h.key == key &&
        h.size > 0 && h.size < ((uint64_t)1 << 32) && (buf = malloc((size_t)h.size)) &&
        fread(buf, 1, (size_t)h.size, f) == h.size && fgetc(f) == EOF &&
        fnv1a(0xcbf29ce484222325ull, buf, (size_t)h.size) == h.sum) {
        *size = (size_t)h.size;
        fclose(f);
        return buf;
    }
    if (buf || h.key != key)
        TD_LOG_INFO("%s: not a cached binary for this build; rebuilding", path);
    free(buf);
    fclose(f);
    return NULL;
}

/* Writes the program's binary to path through a temporary file made with
 * mkstemp (O_EXCL, mode 0600) and a rename, so that readers never see half
 * a file and no one can plant one under the name. Failures only cost the
 * next run. */
static void cache_write(cl_program prog, const char *path, uint64_t key) {
    size_t size = 0;
    unsigned char *bin = NULL;
    char tmp[600];
    cache_header h;
    FILE *f;
    int fd;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) != CL_SUCCESS ||
        size == 0 || !(bin = malloc(size)))
        goto done;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL) != CL_SUCCESS)
        goto done;
    make_dirs(path);
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp || (fd = mkstemp(tmp)) < 0)
        goto done;
    if (!(f = fdopen(fd, "wb"))) {
        close(fd);
        remove(tmp);
        goto done;
    }
    memcpy(h.magic, "TDOCLBIN", 8);
    h.key = key;
    h.sum = fnv1a(0xcbf29ce484222325ull, bin, size);
    h.size = size;
    if (fwrite(&h, sizeof h, 1, f) != 1 || fwrite(bin, 1, size, f) != size) {
        fclose(f);
        remove(tmp);
        goto done;
    }
    if (fclose(f) != 0 || rename(tmp, path) != 0)
        remove(tmp);
done:
    free(bin);
}

/* Building ------------------------------------------------------------------ */

/* The message keeps the log's start (the first errors) within what fits. */
static td_status build_failed(ocl_device *od, cl_program prog, cl_int err) {
    size_t len = 0;
    char *log = NULL;
    td_status st;
    if (clGetProgramBuildInfo(prog, od->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &len) ==
            CL_SUCCESS &&
        len > 0 && (log = calloc(1, len + 1)) &&
        clGetProgramBuildInfo(prog, od->device, CL_PROGRAM_BUILD_LOG, len, log, NULL) != CL_SUCCESS)
        log[0] = '\0';
    st = td__error(TD_ERR_DEVICE, "%s: building OpenCL kernels failed (%s):\n%.1600s", od->name,
                   td__ocl_error_name(err), log && log[0] ? log : "(no build log)");
    free(log);
    return st;
}

/* From the cache; 0 when absent or unusable (a stale or foreign binary). */
static int build_from_cache(ocl_device *od, const char *path, uint64_t key, const char *opts,
                            cl_program *out) {
    size_t size = 0;
    unsigned char *bin = path[0] ? cache_read(path, key, &size) : NULL;
    const unsigned char *cbin = bin;
    cl_int err, bin_status = CL_SUCCESS;
    cl_program prog;
    if (!bin)
        return 0;
    prog = clCreateProgramWithBinary(od->context, 1, &od->device, &size, &cbin, &bin_status, &err);
    free(bin);
    if (err != CL_SUCCESS || bin_status != CL_SUCCESS)
        return 0;
    if (clBuildProgram(prog, 1, &od->device, opts, NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(prog);
        return 0;
    }
    *out = prog;
    return 1;
}

td_status td__ocl_build(ocl_device *od, const char *src, const char *opts, cl_program *out,
                        int *from_cache) {
    char path[600];
    uint64_t key = 0;
    cl_int err;
    cl_program prog;
    *out = NULL;
    if (from_cache)
        *from_cache = 0;
    cache_path(od, src, opts, path, sizeof path, &key);
    if (build_from_cache(od, path, key, opts, out)) {
        if (from_cache)
            *from_cache = 1;
        return TD_OK;
    }
    prog = clCreateProgramWithSource(od->context, 1, &src, NULL, &err);
    TD_OCL_CHECK(err, od);
    err = clBuildProgram(prog, 1, &od->device, opts, NULL, NULL);
    if (err != CL_SUCCESS) {
        td_status st = build_failed(od, prog, err);
        clReleaseProgram(prog);
        return st;
    }
    if (path[0])
        cache_write(prog, path, key);
    *out = prog;
    return TD_OK;
}

td_status td__ocl_kernel(ocl_device *od, td_dtype dt, td_ocl_kernel_id id, cl_kernel *out) {
    cl_int err;
    td_status st;
    int p = dt == TD_F64;
    if (p && !od->fp64)
        return td__error(TD_ERR_UNSUPPORTED, "%s has no fp64 (cl_khr_fp64): f64 is unsupported",
                         od->name);
    if (!od->program[p]) {
        /* Correctly rounded division and sqrt keep f32 results close to the CPU's. */
        const char *opts = p          ? "-cl-std=CL1.2 -DTD_FP64 -DTD_REAL_F64"
                           : od->fp64 ? "-cl-std=CL1.2 -DTD_FP64 "
                                        "-cl-fp32-correctly-rounded-divide-sqrt"
                                      : "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt";
        const char *src = td__ocl_program_source();
        if (!src)
            return td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for the program source",
                             od->name);
        if ((st = td__ocl_build(od, src, opts, &od->program[p], &od->from_cache[p])) != TD_OK)
            return st;
    }
    if (!od->kernels[p][id]) {
        od->kernels[p][id] = clCreateKernel(od->program[p], kernel_names[id], &err);
        if (err != CL_SUCCESS) {
            char call[96];
            od->kernels[p][id] = NULL;
            snprintf(call, sizeof call, "clCreateKernel(%s)", kernel_names[id]);
            return td__ocl_status(err, call, od);
        }
    }
    *out = od->kernels[p][id];
    return TD_OK;
}

td_status td__ocl_scratch(ocl_device *od, size_t nbytes, cl_mem *out) {
    cl_int err;
    if (nbytes == 0)
        nbytes = 1;
    if (od->scratch_size < nbytes) {
        size_t want = od->scratch_size * 2 > nbytes ? od->scratch_size * 2 : nbytes;
        cl_mem mem = clCreateBuffer(od->context, CL_MEM_READ_WRITE, want, NULL, &err);
        if (err != CL_SUCCESS) {
            char a[32];
            return td__error(TD_ERR_OUT_OF_MEMORY, "%s: clCreateBuffer of %s scratch failed: %s",
                             od->name, td__format_bytes((double)want, a), td__ocl_error_name(err));
        }
        /* Commands already queued keep the old buffer alive until they finish. */
        if (od->scratch)
            clReleaseMemObject(od->scratch);
        od->scratch = mem;
        od->scratch_size = want;
    }
    *out = od->scratch;
    return TD_OK;
}

void td__ocl_release_programs(ocl_device *od) {
    for (int p = 0; p < 2; p++) {
        for (int i = 0; i < TD_OCL_KERNEL_COUNT; i++)
            if (od->kernels[p][i]) {
                clReleaseKernel(od->kernels[p][i]);
                od->kernels[p][i] = NULL;
            }
        if (od->program[p])
            clReleaseProgram(od->program[p]);
        od->program[p] = NULL;
    }
    if (od->scratch)
        clReleaseMemObject(od->scratch);
    od->scratch = NULL;
    od->scratch_size = 0;
}
