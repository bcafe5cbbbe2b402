#include "core/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void *td__calloc(size_t n, const char *what) {
    void *p = calloc(1, n ? n : 1);
    if (!p)
        td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory allocating %zu bytes for %s", n, what);
    return p;
}

void *td__aligned_alloc(size_t n, const char *what) {
    void *p = NULL;
    /* posix_memalign accepts any size, unlike aligned_alloc. */
    if (posix_memalign(&p, 64, n ? n : 64) != 0) {
        td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory allocating %zu bytes for %s", n, what);
        return NULL;
    }
    return p;
}

char *td__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (!p) {
        td__error(TD_ERR_OUT_OF_MEMORY, "out of host memory copying a string");
        return NULL;
    }
    return memcpy(p, s, n);
}

const char *td__format_bytes(double n, char buf[32]) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (n >= 1024.0 && u < 4) {
        n /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%.0f B", n);
    else
        snprintf(buf, 32, "%.1f %s", n, units[u]);
    return buf;
}
