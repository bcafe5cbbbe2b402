/* The reference the decoder and generator tests check against: a token
 * model's ordinary full forward (td_model_part_forward over one window),
 * with no cache. */
#ifndef TD_TEST_FULL_LOGITS_H
#define TD_TEST_FULL_LOGITS_H

#include "support/support.h"

/* logits (len, vocab) of tokens[0..len) (1 <= len <= the model's context),
 * the window padded with token 0: causal attention keeps the padding from
 * reaching positions before len. Fails the test on an error. */
void td_test_full_logits(td_model *m, const int32_t *tokens, int64_t len, double *logits);

#endif
