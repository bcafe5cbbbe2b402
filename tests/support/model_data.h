/* Seeded batches for any model the tests describe in JSON: features drawn
 * uniformly from [-1, 1) or tokens, and labels, the same on every run.
 * Shared by the strategy tests (tests/parallel/test_pipeline.c,
 * test_tensor.c). */
#ifndef TD_TEST_MODEL_DATA_H
#define TD_TEST_MODEL_DATA_H

#include "support/support.h"

#define TD_TEST_DATA_MAX_STEPS 8

typedef struct td_test_data {
    int steps;
    int64_t n; /* samples a batch */
    float *x;
    int32_t *tok, *lab;
    td_batch b[TD_TEST_DATA_MAX_STEPS]; /* b[k] points into x (or tok) and lab */
} td_test_data;

/* `steps` (at most TD_TEST_DATA_MAX_STEPS) batches of n samples for the
 * model in json; fails the test when it does not describe. Free with
 * td_test_data_destroy(). */
td_test_data *td_test_data_create(const char *json, int steps, int64_t n);
void td_test_data_destroy(td_test_data *d);

#endif
