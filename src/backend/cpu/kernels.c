/* CPU kernels. Each splits its range over the device's cores. */
#include "backend/cpu/cpu-impl.h"
#include "core/philox.h"

/* The [begin, end) of part i of n when `total` items are split evenly. */
static void part_range(size_t total, int part, int nparts, size_t *begin, size_t *end) {
    *begin = total * (size_t)part / (size_t)nparts;
    *end = total * (size_t)(part + 1) / (size_t)nparts;
}

typedef struct fill_args {
    void *x;
    td_dtype dt;
    size_t n;
    double value;
} fill_args;

static void fill_part(void *p, int part, int nparts) {
    fill_args *a = p;
    size_t b, e;
    part_range(a->n, part, nparts, &b, &e);
    if (a->dt == TD_F32) {
        float *x = a->x, v = (float)a->value;
        for (size_t i = b; i < e; i++)
            x[i] = v;
    } else {
        double *x = a->x, v = a->value;
        for (size_t i = b; i < e; i++)
            x[i] = v;
    }
}

static td_status cpu_fill(void *ctx, void *x, td_dtype dt, size_t n, double value) {
    fill_args a = {x, dt, n, value};
    td__cpu_parallel(ctx, fill_part, &a);
    return TD_OK;
}

typedef struct rng_args {
    void *x;
    td_dtype dt;
    size_t n;
    td_rng_kind kind;
    uint64_t seed, offset;
    double a, b;
} rng_args;

static void rng_part(void *p, int part, int nparts) {
    rng_args *r = p;
    size_t b, e;
    part_range(r->n, part, nparts, &b, &e);
    for (size_t i = b; i < e; i++) {
        uint64_t k = r->offset + i;
        double v = r->kind == TD_RNG_UNIFORM ? r->a + (r->b - r->a) * td__rng_uniform_at(r->seed, k)
                                             : r->a + r->b * td__rng_normal_at(r->seed, k);
        if (r->dt == TD_F32)
            ((float *)r->x)[i] = (float)v;
        else
            ((double *)r->x)[i] = v;
    }
}

static td_status cpu_rng(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                         uint64_t offset, double a, double b) {
    rng_args r = {x, dt, n, kind, seed, offset, a, b};
    td__cpu_parallel(ctx, rng_part, &r);
    return TD_OK;
}

const td_kernels td__cpu_kernels = {
    .fill = cpu_fill,
    .rng = cpu_rng,
};
