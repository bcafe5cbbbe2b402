/* Byte sizes on the command line: read ("4K", "256MiB", "1.5G") and shown
 * ("23.5 GiB"). The CLI's one place for them; binary units throughout. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

int td_cli_parse_bytes(const char *s, uint64_t *out) {
    char *end;
    double v, scale = 1;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s)
        return -1;
    switch (toupper((unsigned char)*end)) {
    case 'K': scale = 1024.0; break;
    case 'M': scale = 1024.0 * 1024; break;
    case 'G': scale = 1024.0 * 1024 * 1024; break;
    case 'T': scale = 1024.0 * 1024 * 1024 * 1024; break;
    default: break;
    }
    if (scale > 1) {
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    v *= scale;
    /* 1.8e19 is just under 2^64: larger would not convert. */
    if (!(v >= 1) || v > 1.8e19)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

const char *td_cli_format_bytes(double n, char buf[32]) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (n >= 1024.0 && u < 4) {
        n /= 1024.0;
        u++;
    }
    snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", n, units[u]);
    return buf;
}
