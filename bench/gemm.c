/* GEMM at the shapes tandem's example models use.
 *
 *   bench_gemm [reps]
 *       the OpenBLAS that tandem links (held to one thread), tandem's own
 *       AVX-512 kernel (kern_sgemm.c), BLIS (serial) and, when present,
 *       oneDNN's sgemm, the last two loaded at run time so neither is a build
 *       dependency. One core, f32, row-major, best of several runs.
 *
 *   bench_gemm shapes [--reps N] [--only WORD] [--coretype-both]
 *       every product of the example models (MNIST MLP, LeNet-5, GPT-tiny)
 *       and of a GPT with 512 channels: each linear's forward, input and
 *       weight gradient, LeNet's convolution GEMMs as kern_gemm.c calls them,
 *       attention's per-head products; f32 and f64; one and two threads.
 *       tandem's GEMM (td__cpu_gemm_serial on one thread, td__cpu_gemm on a
 *       two-core device) against OpenBLAS's cblas_?gemm called directly with
 *       the same transposes and leading dimensions, timed alternately, the
 *       median of N runs of each. --only keeps the shapes whose model or name
 *       contains WORD. --coretype-both runs the table twice in child
 *       processes, with OPENBLAS_CORETYPE=Haswell and with it unset (OpenBLAS
 *       reads it when it loads), to show which path each shape should take
 *       whatever the variable says.
 *
 *   bench_gemm bf16 [--reps N] [--only WORD]
 *       the same products (and the MLP's at batch 1024) on one core in f32
 *       (td__cpu_gemm_serial) against the bf16 GEMM (kern_bgemm.c) by
 *       AVX512-BF16 where the CPU has it and by its emulation, timed in
 *       turn, the median of N runs of each. */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/cpu/cpu-kernels.h"
#include "device/device-impl.h"
#include "support/bench.h"
#include "tandem/tandem.h"

typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);
typedef int (*dnnl_fn)(char ta, char tb, long m, long n, long k, float alpha, const float *a,
                       long lda, const float *b, long ldb, float beta, float *c, long ldc);

typedef struct shape {
    const char *what;
    int ta, tb, m, n, k;
} shape;

static const shape shapes[] = {
    {"mlp fc1 fwd  (b128)", 0, 1, 128, 256, 784},
    {"mlp fc1 dW   (b128)", 1, 0, 256, 784, 128},
    {"mlp fc2 fwd  (b128)", 0, 1, 128, 128, 256},
    {"mlp fc2 dX   (b128)", 0, 0, 128, 256, 128},
    {"lenet conv1 per image", 0, 0, 6, 784, 25},
    {"lenet conv2 per image", 0, 0, 16, 100, 150},
    {"lenet conv2 dW per image", 0, 1, 16, 150, 100},
    {"lenet fc1 fwd (b64)", 0, 1, 64, 120, 400},
    {"gpt qkv fwd  (4096 tok)", 0, 1, 4096, 384, 128},
    {"gpt fc1 fwd  (4096 tok)", 0, 1, 4096, 512, 128},
    {"gpt fc2 fwd  (4096 tok)", 0, 1, 4096, 128, 512},
    {"gpt fc1 dW   (4096 tok)", 1, 0, 512, 128, 4096},
    {"gpt head fwd (4096 tok)", 0, 1, 4096, 256, 128},
    {"gpt att q k^T per head", 0, 1, 128, 128, 32},
    {"gpt att p v per head", 0, 0, 128, 32, 128},
};

static double best_gflops(int lib, void *fn, const shape *s, float *a, float *b, float *c,
                          int reps) {
    double best = 0, flop = 2.0 * s->m * s->n * s->k;
    int lda = s->ta ? s->m : s->k, ldb = s->tb ? s->k : s->n;
    /* small shapes: repeat inside each timing so it lasts long enough */
    int inner = (int)(2e8 / flop) + 1;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = td_clock_ns();
        for (int i = 0; i < inner; i++) {
            if (lib == 3)
                td__cpu_sgemm512(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, lda, b, ldb, 0.0f, c,
                                 s->n);
            else if (lib == 2)
                ((dnnl_fn)fn)(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, 1.0f, a, lda,
                              b, ldb, 0.0f, c, s->n);
            else
                ((sgemm_fn)fn)(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                               s->tb ? CblasTrans : CblasNoTrans, s->m, s->n, s->k, 1.0f, a, lda, b,
                               ldb, 0.0f, c, s->n);
        }
        double sec = (double)(td_clock_ns() - t0) / 1e9;
        double g = flop * inner / sec / 1e9;
        if (g > best)
            best = g;
    }
    return best;
}

void openblas_set_num_threads(int n);

/* bench_gemm shapes ---------------------------------------------------------- */

typedef struct prod {
    char model[16], what[40];
    int ta, tb;
    int m, n, k, lda, ldb, ldc;
    double alpha;
} prod;

#define MAX_PRODS 128
static prod prods[MAX_PRODS];
static int nprods;

static void add(const char *model, const char *what, int ta, int tb, int m, int n, int k, int lda,
                int ldb, int ldc, double alpha) {
    prod *p = &prods[nprods++];
    snprintf(p->model, sizeof p->model, "%s", model);
    snprintf(p->what, sizeof p->what, "%s", what);
    p->ta = ta, p->tb = tb, p->m = m, p->n = n, p->k = k;
    p->lda = lda ? lda : (ta ? m : k);
    p->ldb = ldb ? ldb : (tb ? k : n);
    p->ldc = ldc ? ldc : n;
    p->alpha = alpha;
}

/* A linear layer's three products as layers.c asks for them, x (rows, in),
 * w (out, in): y = x w^T, dx = dy w, dw = dy^T x. */
static void add_linear(const char *model, const char *name, int rows, int in, int out) {
    char w[40];
    snprintf(w, sizeof w, "%s fwd", name);
    add(model, w, 0, 1, rows, out, in, 0, 0, 0, 1.0);
    snprintf(w, sizeof w, "%s dX", name);
    add(model, w, 0, 0, rows, in, out, 0, 0, 0, 1.0);
    snprintf(w, sizeof w, "%s dW", name);
    add(model, w, 1, 0, out, in, rows, 0, 0, 0, 1.0);
}

/* A GPT block's products at b sequences of t tokens, c channels, h heads
 * (kern_attn.c's per-head products read q, k, v from qkv (t, 3c) in place). */
static void add_gpt(const char *model, int b, int t, int c, int h, int vocab) {
    int d = c / h, bt = b * t;
    add_linear(model, "qkv", bt, c, 3 * c);
    add_linear(model, "proj", bt, c, c);
    add_linear(model, "mlp up", bt, c, 4 * c);
    add_linear(model, "mlp down", bt, 4 * c, c);
    add_linear(model, "head", bt, c, vocab);
    add(model, "att q k^T", 0, 1, t, t, d, 3 * c, 3 * c, t, 1.0 / 8);
    add(model, "att p v", 0, 0, t, d, t, t, 3 * c, c, 1.0);
    add(model, "att dp = dy v^T", 0, 1, t, t, d, c, 3 * c, t, 1.0);
    add(model, "att dv = p^T dy", 1, 0, t, d, t, t, c, 3 * c, 1.0);
    add(model, "att dq = ds k", 0, 0, t, d, t, t, 3 * c, 3 * c, 1.0);
    add(model, "att dk = ds^T q", 1, 0, t, d, t, t, 3 * c, 3 * c, 1.0);
}

static void make_prods(void) {
    /* MNIST MLP and LeNet-5 at the trainer's default batch, 64 */
    add_linear("mlp", "fc1", 64, 784, 256);
    add_linear("mlp", "fc2", 64, 256, 128);
    add_linear("mlp", "fc3", 64, 128, 10);
    /* kern_gemm.c's convolution GEMMs, g images side by side as its
     * group_size() picks them: conv1 (1 -> 6, 5x5, 28x28) g = 2, conv2
     * (6 -> 16, 5x5, 14x14 -> 10x10) g = 3 forward, 2 backward */
    add("lenet", "conv1 fwd", 0, 0, 6, 2 * 784, 25, 0, 0, 0, 1.0);
    add("lenet", "conv1 dW", 0, 1, 6, 25, 2 * 784, 0, 0, 0, 1.0);
    add("lenet", "conv2 fwd", 0, 0, 16, 3 * 100, 150, 0, 0, 0, 1.0);
    add("lenet", "conv2 dW", 0, 1, 16, 150, 2 * 100, 0, 0, 0, 1.0);
    add("lenet", "conv2 dcol", 1, 0, 150, 2 * 100, 16, 0, 0, 0, 1.0);
    add_linear("lenet", "fc1", 64, 400, 120);
    add_linear("lenet", "fc2", 64, 120, 84);
    add_linear("lenet", "fc3", 64, 84, 10);
    /* GPT-tiny at bench/train_vs_pytorch's batch, 32; the 512-channel GPT at 16 */
    add_gpt("gpt-tiny", 32, 128, 128, 4, 256);
    add_gpt("gpt-512", 16, 128, 512, 8, 256);
    /* bench/train_vs_pytorch's MLP at batch 1024 */
    add_linear("mlp-1024", "fc1", 1024, 784, 256);
    add_linear("mlp-1024", "fc2", 1024, 256, 128);
    add_linear("mlp-1024", "fc3", 1024, 128, 10);
}

/* who: 0 OpenBLAS, 1 tandem, 2 tandem's own f32 kernel whatever
 * td__cpu_gemm_serial would pick. threads: 1 or 2 (dev: the two-core device). */
static void run_once(int who, td_dtype dt, int threads, void *dev, const prod *p, const void *a,
                     const void *b, void *c) {
    if (who == 2) {
        td__cpu_sgemm512(p->ta, p->tb, p->m, p->n, p->k, (float)p->alpha, a, p->lda, b, p->ldb,
                         0.0f, c, p->ldc);
        return;
    }
    if (who == 1) {
        if (threads == 1)
            td__cpu_gemm_serial(dt, p->ta, p->tb, p->m, p->n, p->k, p->alpha, a, p->lda, b, p->ldb,
                                0.0, c, p->ldc);
        else
            (void)td__cpu_gemm(dev, dt, p->ta, p->tb, p->m, p->n, p->k, p->alpha, a, p->lda, b,
                               p->ldb, 0.0, c, p->ldc);
        return;
    }
    if (dt == TD_F32)
        cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans,
                    p->tb ? CblasTrans : CblasNoTrans, p->m, p->n, p->k, (float)p->alpha, a, p->lda,
                    b, p->ldb, 0.0f, c, p->ldc);
    else
        cblas_dgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans,
                    p->tb ? CblasTrans : CblasNoTrans, p->m, p->n, p->k, p->alpha, a, p->lda, b,
                    p->ldb, 0.0, c, p->ldc);
}

static double time_gflops(int who, td_dtype dt, int threads, void *dev, const prod *p,
                          const void *a, const void *b, void *c, int inner) {
    double flop = 2.0 * p->m * p->n * p->k;
    uint64_t t0 = td_clock_ns();
    for (int i = 0; i < inner; i++)
        run_once(who, dt, threads, dev, p, a, b, c);
    return flop * inner / ((double)(td_clock_ns() - t0) / 1e9) / 1e9;
}

static void *filled(size_t n, td_dtype dt, uint64_t seed) {
    size_t es = td_dtype_size(dt);
    void *p = NULL;
    if (posix_memalign(&p, 64, n * es + 64) != 0)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        double v = td_rng_uniform(seed, i) - 0.5;
        if (dt == TD_F32)
            ((float *)p)[i] = (float)v;
        else
            ((double *)p)[i] = v;
    }
    return p;
}

static int shapes_main(int reps, const char *only, const char *argv0) {
    td_device_list *list = NULL;
    void *dev;
    const char *ct = getenv("OPENBLAS_CORETYPE");
    char cpu[128] = "";
    td_device_info info;
    make_prods();
    if (td_devices_open("cpu", &list) != TD_OK) {
        fprintf(stderr, "%s: %s\n", argv0, td_last_error());
        return 1;
    }
    dev = td_device_list_get(list, 0)->ctx;
    if (td_device_get_info(td_device_list_get(list, 0), &info) == TD_OK)
        snprintf(cpu, sizeof cpu, "%s", info.model);
    openblas_set_num_threads(1);
    printf("GFLOP/s, median of %d runs alternating tandem and OpenBLAS; CPU %s; "
           "OPENBLAS_CORETYPE=%s; 2 threads: a %d-core device against OpenBLAS on 2 threads\n",
           reps, cpu, ct ? ct : "(unset)", td__cpu_threads(dev));
    printf("%-9s %-17s %2s %16s  %-4s %7s %7s %5s   %7s %7s %5s  %7s %4s\n", "model", "product",
           "tr", "m,n,k", "type", "td 1t", "ob 1t", "ratio", "td 2t", "ob 2t", "ratio", "own 1t",
           "path");
    for (int i = 0; i < nprods; i++) {
        const prod *p = &prods[i];
        char dims[32];
        if (only && !strstr(p->model, only) && !strstr(p->what, only))
            continue;
        snprintf(dims, sizeof dims, "%d,%d,%d", p->m, p->n, p->k);
        for (int t = 0; t < 2; t++) {
            td_dtype dt = t ? TD_F64 : TD_F32;
            size_t na = (size_t)(p->ta ? p->k : p->m) * (size_t)p->lda;
            size_t nb = (size_t)(p->tb ? p->n : p->k) * (size_t)p->ldb;
            size_t nc = (size_t)p->m * (size_t)p->ldc;
            void *a = filled(na, dt, 1), *b = filled(nb, dt, 2), *c = filled(nc, dt, 3);
            double flop = 2.0 * p->m * p->n * p->k;
            int inner = (int)((dt == TD_F32 ? 1e8 : 5e7) / flop) + 1;
            double g[2][2][64], own[64];
            if (!a || !b || !c)
                return 1;
            printf("%-9s %-17s %c%c %16s  %-4s", p->model, p->what, p->ta ? 'T' : 'N',
                   p->tb ? 'T' : 'N', dims, td_dtype_name(dt));
            for (int th = 1; th <= 2; th++) {
                double med[2];
                openblas_set_num_threads(1);
                for (int who = 0; who < 2; who++) /* warm up */
                    (void)time_gflops(who, dt, th, dev, p, a, b, c, 1);
                for (int r = 0; r < reps; r++)
                    for (int who = 0; who < 2; who++) {
                        openblas_set_num_threads(who == 0 ? th : 1);
                        g[th - 1][who][r] = time_gflops(who, dt, th, dev, p, a, b, c, inner);
                    }
                for (int who = 0; who < 2; who++)
                    med[who] = td_bench_median(g[th - 1][who], reps);
                printf(" %7.1f %7.1f %5.2f  ", med[1], med[0], med[1] / med[0]);
            }
            openblas_set_num_threads(1);
            if (dt == TD_F32 && td__cpu_simd() == TD_SIMD_AVX512) {
                (void)time_gflops(2, dt, 1, dev, p, a, b, c, 1);
                for (int r = 0; r < reps; r++)
                    own[r] = time_gflops(2, dt, 1, dev, p, a, b, c, inner);
                printf("%7.1f", td_bench_median(own, reps));
            } else {
                printf("%7s", "-");
            }
            printf(" %4s\n", td__cpu_gemm_own(dt, p->m, p->n, p->k) ? "own" : "blas");
            fflush(stdout);
            free(a);
            free(b);
            free(c);
        }
    }
    td_device_list_destroy(list);
    return 0;
}

/* bench_gemm bf16 ------------------------------------------------------------ */

/* One core: who 0 f32, 1 bf16 native, 2 bf16 emulated; GFLOP/s of inner runs. */
static double time_bf16(int who, const prod *p, const float *a, const float *b, float *c,
                        int inner) {
    double flop = 2.0 * p->m * p->n * p->k;
    uint64_t t0 = td_clock_ns();
    for (int i = 0; i < inner; i++) {
        if (who == 0)
            td__cpu_gemm_serial(TD_F32, p->ta, p->tb, p->m, p->n, p->k, p->alpha, a, p->lda, b,
                                p->ldb, 0.0, c, p->ldc);
        else
            (void)td__cpu_bgemm_serial(who == 1, p->ta, p->tb, p->m, p->n, p->k, (float)p->alpha, a,
                                       p->lda, b, p->ldb, 0.0f, c, p->ldc);
    }
    return flop * inner / ((double)(td_clock_ns() - t0) / 1e9) / 1e9;
}

static int bf16_main(int reps, const char *only) {
    int native = td__cpu_bgemm_native();
    make_prods();
    openblas_set_num_threads(1);
    printf("GFLOP/s on one core, median of %d runs in turn; bf16: %s\n", reps,
           td__cpu_bgemm_path_name(native));
    printf("%-9s %-17s %2s %16s %8s %8s %8s %6s\n", "model", "product", "tr", "m,n,k", "f32",
           "bf16", "bf16-emu", "bf16x");
    for (int i = 0; i < nprods; i++) {
        const prod *p = &prods[i];
        size_t na = (size_t)(p->ta ? p->k : p->m) * (size_t)p->lda;
        size_t nb = (size_t)(p->tb ? p->n : p->k) * (size_t)p->ldb;
        int inner = (int)(1e8 / (2.0 * p->m * p->n * p->k)) + 1;
        double g[3][64], med[3] = {0, 0, 0};
        char dims[32];
        float *a, *b, *c;
        if (only && !strstr(p->model, only) && !strstr(p->what, only))
            continue;
        a = filled(na, TD_F32, 1), b = filled(nb, TD_F32, 2);
        c = filled((size_t)p->m * (size_t)p->ldc, TD_F32, 3);
        if (!a || !b || !c)
            return 1;
        for (int who = 0; who < 3; who++) /* warm up */
            if (who != 1 || native)
                (void)time_bf16(who, p, a, b, c, 1);
        for (int r = 0; r < reps; r++)
            for (int who = 0; who < 3; who++)
                if (who != 1 || native)
                    g[who][r] = time_bf16(who, p, a, b, c, inner);
        for (int who = 0; who < 3; who++)
            if (who != 1 || native)
                med[who] = td_bench_median(g[who], reps);
        snprintf(dims, sizeof dims, "%d,%d,%d", p->m, p->n, p->k);
        printf("%-9s %-17s %c%c %16s %8.1f %8.1f %8.1f %6.2f\n", p->model, p->what,
               p->ta ? 'T' : 'N', p->tb ? 'T' : 'N', dims, med[0], med[1], med[2],
               (native ? med[1] : med[2]) / med[0]);
        fflush(stdout);
        free(a), free(b), free(c);
    }
    return 0;
}

/* Runs this program's shapes table in a child with OPENBLAS_CORETYPE set to
 * value (NULL: unset). */
static int run_child(const char *value, int reps, const char *only) {
    char rs[16];
    pid_t pid;
    int status = 0;
    snprintf(rs, sizeof rs, "%d", reps);
    fflush(stdout);
    if ((pid = fork()) < 0)
        return 1;
    if (pid == 0) {
        char *args[] = {"bench_gemm",           "shapes",     "--reps", rs,
                        only ? "--only" : NULL, (char *)only, NULL};
        if (value)
            setenv("OPENBLAS_CORETYPE", value, 1);
        else
            unsetenv("OPENBLAS_CORETYPE");
        execv("/proc/self/exe", args);
        _exit(127);
    }
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (argc > 1 && strcmp(argv[1], "bf16") == 0) {
        const char *only = NULL;
        reps = 5;
        for (int i = 2; i + 1 < argc; i += 2) {
            if (strcmp(argv[i], "--reps") == 0)
                reps = atoi(argv[i + 1]);
            else if (strcmp(argv[i], "--only") == 0)
                only = argv[i + 1];
        }
        return bf16_main(reps < 1 || reps > 64 ? 5 : reps, only);
    }
    if (argc > 1 && strcmp(argv[1], "shapes") == 0) {
        const char *only = NULL;
        int both = 0;
        reps = 5;
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
                reps = atoi(argv[++i]);
            else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
                only = argv[++i];
            else if (strcmp(argv[i], "--coretype-both") == 0)
                both = 1;
            else {
                fprintf(stderr, "usage: %s shapes [--reps N] [--only WORD] [--coretype-both]\n",
                        argv[0]);
                return 2;
            }
        }
        if (reps < 1 || reps > 64)
            reps = 5;
        if (both) {
            const char *was = getenv("OPENBLAS_CORETYPE");
            int rc = run_child(was ? was : "Haswell", reps, only);
            return rc | run_child(NULL, reps, only);
        }
        return shapes_main(reps, only, argv[0]);
    }
    void *blis =
        dlopen("/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4", RTLD_NOW | RTLD_LOCAL);
    void *dnnl = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    void *fns[4] = {(void *)cblas_sgemm, blis ? dlsym(blis, "cblas_sgemm") : NULL,
                    dnnl ? dlsym(dnnl, "dnnl_sgemm") : NULL,
                    td__cpu_simd() == TD_SIMD_AVX512 ? (void *)td__cpu_sgemm512 : NULL};
    size_t big = (size_t)4096 * 4096;
    float *a = malloc(big * sizeof *a), *b = malloc(big * sizeof *b), *c = malloc(big * sizeof *c);
    if (!a || !b || !c)
        return 1;
    openblas_set_num_threads(1); /* one core, as each of tandem's threads */
    for (size_t i = 0; i < big; i++) {
        a[i] = (float)td_rng_uniform(1, i) - 0.5f;
        b[i] = (float)td_rng_uniform(2, i) - 0.5f;
    }
    printf("one core, f32, GFLOP/s (best of %d)%s\n", reps,
           getenv("OPENBLAS_CORETYPE") ? "" : "  [OPENBLAS_CORETYPE is not set]");
    printf("%-28s %14s %10s %10s %10s %10s\n", "shape", "m,n,k", "OpenBLAS", "BLIS", "oneDNN",
           "tandem512");
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        char dims[32];
        snprintf(dims, sizeof dims, "%d,%d,%d", shapes[s].m, shapes[s].n, shapes[s].k);
        printf("%-28s %14s", shapes[s].what, dims);
        for (int lib = 0; lib < 4; lib++) {
            if (fns[lib])
                printf(" %10.1f", best_gflops(lib, fns[lib], &shapes[s], a, b, c, reps));
            else
                printf(" %10s", "-");
        }
        printf("\n");
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
