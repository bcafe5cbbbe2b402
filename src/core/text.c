#include "core/text.h"

#include <stddef.h>
#include <stdio.h>

const char *td__shape_text(const int64_t *s, int n, char buf[64]) {
    size_t used = (size_t)snprintf(buf, 64, "(");
    for (int i = 0; i < n && used < 64; i++)
        used += (size_t)snprintf(buf + used, 64 - used, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (used < 64)
        snprintf(buf + used, 64 - used, ")");
    return buf;
}
