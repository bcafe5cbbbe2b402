/* Small texts for messages. */
#ifndef TD_CORE_TEXT_H
#define TD_CORE_TEXT_H

#include <stdint.h>

/* "(2, 3)" for the n sizes at s, written into buf (cut to fit); returns buf. */
const char *td__shape_text(const int64_t *s, int n, char buf[64]);

#endif
