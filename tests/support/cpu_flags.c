/* /proc/cpuinfo's flags, read the way a person would check them. */
#include "cpu_flags.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first "flags" line into buf (" flag1 flag2 ... ", padded with spaces
 * so that a word matches as " word "); 0 when there is none. */
static int read_flags(char *buf, size_t n) {
    static char line[8192];
    FILE *f = fopen("/proc/cpuinfo", "r");
    int found = 0;
    if (!f)
        return 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "flags", 5) || !colon)
            continue;
        line[strcspn(line, "\n")] = '\0';
        snprintf(buf, n, " %s ", colon + 1);
        found = 1;
    }
    fclose(f);
    return found;
}

static int has(const char *flags, const char *word) {
    char w[64];
    snprintf(w, sizeof w, " %s ", word);
    return strstr(flags, w) != NULL;
}

static const char *classify(int bf16) {
    static char flags[8200];
    const char *env = getenv("TANDEM_SIMD");
    if ((env && *env) || !read_flags(flags, sizeof flags))
        return NULL;
    if (bf16)
        return has(flags, "avx512_bf16") && has(flags, "avx512f") ? "native" : "emulated";
    if (has(flags, "avx512_vnni") && has(flags, "avx512f") && has(flags, "avx512vl") &&
        has(flags, "avx512bw") && has(flags, "avx512dq") && has(flags, "f16c"))
        return "VNNI";
    return has(flags, "avx2") && has(flags, "fma") ? "AVX2" : "none";
}

const char *td_test_cpu_bf16_class(void) {
    return classify(1);
}

const char *td_test_cpu_int8_class(void) {
    return classify(0);
}
