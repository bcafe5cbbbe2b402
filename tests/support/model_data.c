/* Seeded batches for the strategy tests (see model_data.h). */
#include <stdlib.h>

#include "support/model_data.h"

static uint64_t next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

td_test_data *td_test_data_create(const char *json, int steps, int64_t n) {
    td_model_info info;
    td_test_data *d = calloc(1, sizeof *d);
    int64_t feats = 1, lps;
    uint64_t s = 12345;
    assert_non_null(d);
    assert_true(steps >= 1 && steps <= TD_TEST_DATA_MAX_STEPS);
    TD_ASSERT_OK(td_model_describe(json, "test", &info, NULL, 0));
    for (int i = 0; i < info.in_ndim; i++)
        feats *= info.in_shape[i];
    lps = info.kind == TD_INPUT_TOKENS ? info.in_shape[0] : 1;
    d->steps = steps;
    d->n = n;
    d->x = calloc((size_t)(steps * n * feats), sizeof *d->x);
    d->tok = calloc((size_t)(steps * n * feats), sizeof *d->tok);
    d->lab = calloc((size_t)(steps * n * lps), sizeof *d->lab);
    assert_true(d->x && d->tok && d->lab);
    for (int64_t i = 0; i < steps * n * feats; i++) {
        d->x[i] = (float)((double)next(&s) / (double)(1ull << 31) - 0.5) * 2.0f;
        d->tok[i] = (int32_t)(next(&s) % (uint64_t)info.classes);
    }
    for (int64_t i = 0; i < steps * n * lps; i++)
        d->lab[i] = (int32_t)(next(&s) % (uint64_t)info.classes);
    for (int k = 0; k < steps; k++) {
        d->b[k].n = n;
        d->b[k].x = info.kind == TD_INPUT_TOKENS ? NULL : d->x + k * n * feats;
        d->b[k].tokens = info.kind == TD_INPUT_TOKENS ? d->tok + k * n * feats : NULL;
        d->b[k].labels = d->lab + k * n * lps;
    }
    return d;
}

void td_test_data_destroy(td_test_data *d) {
    if (!d)
        return;
    free(d->x);
    free(d->tok);
    free(d->lab);
    free(d);
}
