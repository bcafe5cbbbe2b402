/* GEMM at the shapes tandem's example models use: the OpenBLAS that tandem
 * links (held to one thread), tandem's own AVX-512 kernel (kern_sgemm.c), BLIS (serial) and,
 * when present, oneDNN's sgemm, the last two loaded at run time so neither is
 * a build dependency. One core, f32, row-major, best of several runs. Prints
 * GFLOP/s per shape and library.
 *
 *   bench_gemm [reps]        (OPENBLAS_CORETYPE=Haswell stays set) */
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/cpu/cpu-kernels.h"
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

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
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
