/* The processes of a group (process.h): the MPI transport's, or this one. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm-impl.h"
#include "comm/process.h"
#include "core/alloc.h"
#include "core/error.h"

static int several_processes(const td_group *g) {
    return g && g->transport == TD_TRANSPORT_MPI && g->nlocal < g->size;
}

int td__group_process(const td_group *g) {
#ifdef TD_HAVE_MPI
    if (g && g->transport == TD_TRANSPORT_MPI)
        return td__mpi_process(g);
#endif
    (void)g;
    return 0;
}

td_status td__group_clock_sync(td_group *g, int64_t *offset_ns, uint64_t *base_ns) {
#ifdef TD_HAVE_MPI
    if (several_processes(g))
        return td__mpi_clock_sync(g, offset_ns, base_ns);
#endif
    *offset_ns = 0;
    *base_ns = td_clock_ns();
    return TD_OK;
}

td_status td__group_gather_text(td_group *g, const char *text, size_t n, char **all,
                                size_t *all_n) {
#ifdef TD_HAVE_MPI
    if (several_processes(g))
        return td__mpi_gather_text(g, text, n, all, all_n);
#endif
    *all_n = 0;
    if (!(*all = td__calloc(n + 1, "a trace's text")))
        return TD_ERR_OUT_OF_MEMORY;
    memcpy(*all, text, n);
    *all_n = n;
    return TD_OK;
}
