/* The processes of a group (process.h): the MPI transport's, or this one. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "comm/process.h"
#include "core/alloc.h"
#include "core/error.h"

/* An environment variable as a non-negative int; -1 when unset or not one. */
static int env_int(const char *name) {
    const char *v = getenv(name);
    char *end;
    long n = v ? strtol(v, &end, 10) : -1;
    return v && *v && !*end && n >= 0 && n < (1L << 30) ? (int)n : -1;
}

void td_comm_launch(int *rank, int *size) {
    int r = env_int("OMPI_COMM_WORLD_RANK"), n = env_int("OMPI_COMM_WORLD_SIZE");
    if (n < 1) {
        r = env_int("PMI_RANK");
        n = env_int("PMI_SIZE");
    }
    if (n < 1 || r < 0 || r >= n)
        r = 0, n = 1;
    if (rank)
        *rank = r;
    if (size)
        *size = n;
}

static int several_processes(const td_group *g) {
    return g && g->tr->spans_processes && g->nlocal < g->size;
}

int td__group_process(const td_group *g) {
    return g && g->tr->process ? g->tr->process(g) : 0;
}

td_status td__group_clock_sync(td_group *g, int64_t *offset_ns, uint64_t *base_ns) {
    if (several_processes(g) && g->tr->clock_sync)
        return g->tr->clock_sync(g, offset_ns, base_ns);
    *offset_ns = 0;
    *base_ns = td_clock_ns();
    return TD_OK;
}

td_status td__group_gather_text(td_group *g, const char *text, size_t n, char **all,
                                size_t *all_n) {
    if (several_processes(g) && g->tr->gather_text)
        return g->tr->gather_text(g, text, n, all, all_n);
    *all_n = 0;
    if (!(*all = td__calloc(n + 1, "a trace's text")))
        return TD_ERR_OUT_OF_MEMORY;
    memcpy(*all, text, n);
    *all_n = n;
    return TD_OK;
}
