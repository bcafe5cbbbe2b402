/* Element-wise reduction kernels for the collectives, over host memory.
 * Blocks of 16 with a fixed trip count let the compiler vectorise them at
 * -O2 without a cost model that must guess the length. They are memory
 * bound, so the SIMD width hardly matters. */
#include <stddef.h>

#include "comm/comm-impl.h"

#define BLOCK 16

#define DEFINE_REDUCE(name, T, EXPR)                                                               \
    static void name(T *d, const T *a, const T *b, size_t n) {                                     \
        size_t i = 0;                                                                              \
        for (; i + BLOCK <= n; i += BLOCK) {                                                       \
            T t[BLOCK];                                                                            \
            for (int j = 0; j < BLOCK; j++) {                                                      \
                T x = a[i + j], y = b[i + j];                                                      \
                t[j] = EXPR;                                                                       \
            }                                                                                      \
            for (int j = 0; j < BLOCK; j++)                                                        \
                d[i + j] = t[j];                                                                   \
        }                                                                                          \
        for (; i < n; i++) {                                                                       \
            T x = a[i], y = b[i];                                                                  \
            d[i] = EXPR;                                                                           \
        }                                                                                          \
    }

/* d may equal a or b (in place), so loads of a block happen before its stores. */
DEFINE_REDUCE(sum_f32, float, x + y)
DEFINE_REDUCE(max_f32, float, x > y ? x : y)
DEFINE_REDUCE(min_f32, float, x < y ? x : y)
DEFINE_REDUCE(sum_f64, double, x + y)
DEFINE_REDUCE(max_f64, double, x > y ? x : y)
DEFINE_REDUCE(min_f64, double, x < y ? x : y)

void td__reduce2(void *dst, const void *a, const void *b, size_t n, td_dtype dt, td_reduce_op op) {
    if (n == 0)
        return;
    if (dt == TD_F64) {
        switch (op) {
        case TD_REDUCE_SUM:
        case TD_REDUCE_MEAN: sum_f64(dst, a, b, n); return;
        case TD_REDUCE_MAX: max_f64(dst, a, b, n); return;
        case TD_REDUCE_MIN: min_f64(dst, a, b, n); return;
        }
    } else {
        switch (op) {
        case TD_REDUCE_SUM:
        case TD_REDUCE_MEAN: sum_f32(dst, a, b, n); return;
        case TD_REDUCE_MAX: max_f32(dst, a, b, n); return;
        case TD_REDUCE_MIN: min_f32(dst, a, b, n); return;
        }
    }
}

void td__scale(void *x, size_t n, td_dtype dt, double divisor) {
    if (dt == TD_F64) {
        double *p = x;
        for (size_t i = 0; i < n; i++)
            p[i] /= divisor;
    } else {
        float *p = x;
        float d = (float)divisor;
        for (size_t i = 0; i < n; i++)
            p[i] /= d;
    }
}
