/* See full_logits.h. */
#include <stdlib.h>
#include <string.h>

#include "support/full_logits.h"

void td_test_full_logits(td_model *m, const int32_t *tokens, int64_t len, double *logits) {
    int64_t shape[TD_MAX_DIMS], vocab = td_model_num_classes(m);
    int64_t t = (td_model_input_shape(m, shape), shape[0]);
    size_t es = td_model_dtype(m) == TD_F64 ? sizeof(double) : sizeof(float);
    int32_t *window = calloc((size_t)t, sizeof *window),
            *labels = calloc((size_t)t, sizeof *labels);
    void *host = malloc((size_t)(t * vocab) * es);
    td_batch b = {1, NULL, window, labels};
    assert_true(window && labels && host && len >= 1 && len <= t);
    memcpy(window, tokens, (size_t)len * sizeof *window);
    TD_ASSERT_OK(td_model_part_forward(m, 0, &b, 0, NULL, 0, 0, 1.0, NULL));
    TD_ASSERT_OK(td_buffer_read(td_model_part_output(m, 0), 0, host, (size_t)(t * vocab) * es));
    for (int64_t i = 0; i < len * vocab; i++)
        logits[i] = es == sizeof(double) ? ((double *)host)[i] : ((float *)host)[i];
    free(window);
    free(labels);
    free(host);
}
