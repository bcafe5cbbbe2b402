/* The device-spec parser: the one place that reads "cpu:0{mem=512M},cuda:*". */
#ifndef TD_DEVICE_SPEC_H
#define TD_DEVICE_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/status.h"

/* Options in braces; a field is meaningful only when its has_ flag is set. */
typedef struct td_device_options {
    int has_cores, cores; /* cores=N: how many logical CPUs a CPU device owns */
    int has_mem;          /* mem=512M: memory budget in bytes */
    uint64_t mem;
    int has_slowdown; /* slowdown=3: every pass takes 3x as long */
    double slowdown;
    int has_latency; /* latency=2: every pass takes 2 ms more */
    double latency_ms;
    int has_split, split; /* split=2: one device presented as 2 */
    /* denormals=keep|flush: a CPU device's threads compute subnormal numbers
     * (keep) or treat them as 0 (flush, the default: see core/fpmode.h);
     * denormals is a td__denormals */
    int has_denormals, denormals;
} td_device_options;

typedef enum td_spec_index {
    TD_SPEC_INDEX_NONE = 0, /* "cpu" */
    TD_SPEC_INDEX_ONE,      /* "cpu:3", "opencl:0.1" */
    TD_SPEC_INDEX_ALL,      /* "cuda:*" */
} td_spec_index;

typedef struct td_spec_item {
    char text[96];    /* the item as written, for messages */
    char backend[16]; /* "cpu", "cuda", "opencl", "auto", "all" */
    td_spec_index index_kind;
    int index;     /* N of cpu:N, cuda:N; P of opencl:P.D */
    int sub_index; /* D of opencl:P.D, -1 when absent */
    int count;     /* K of cpu*K; 1 when absent */
    td_device_options opts;
} td_spec_item;

/* Parses spec into an array of items the caller frees with free(). On failure
 * the message quotes the spec and says where and why it is malformed. */
td_status td__spec_parse(const char *spec, td_spec_item **items, size_t *count);

/* Parses "512M", "2G", "1024" into bytes (K, M, G, T are powers of 1024;
 * an optional "iB" or "B" may follow). Returns 0 on success. */
int td__parse_bytes(const char *s, uint64_t *out);

#endif
