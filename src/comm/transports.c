/* The transports built into this tandem, and the choice among them: the one
 * place that knows which were configured in. */
#include "comm/comm-impl.h"
#include "core/error.h"

#ifdef TD_HAVE_MPI
extern const td__transport td__transport_mpi;
#endif
#ifdef TD_HAVE_NCCL
extern const td__transport td__transport_nccl;
#endif

static const td__transport *const built[] = {
    [TD_TRANSPORT_LOCAL] = &td__transport_local,
#ifdef TD_HAVE_MPI
    [TD_TRANSPORT_MPI] = &td__transport_mpi,
#endif
#ifdef TD_HAVE_NCCL
    [TD_TRANSPORT_NCCL] = &td__transport_nccl,
#endif
};

/* What a build needs for each transport, for the message when it lacks one. */
static const char *const needs[] = {
    [TD_TRANSPORT_MPI] = "the mpi transport is not built into this tandem (no MPI at configure "
                         "time)",
    [TD_TRANSPORT_NCCL] = "the nccl transport is not built into this tandem (no CUDA or NCCL)",
};

#define COUNT(a) (sizeof(a) / sizeof *(a))

/* Whether NCCL can run the collectives of a group of devs. */
static int all_nccl(td_device *const *devs, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(td_device_caps(devs[i]) & TD_DEVICE_CAP_NCCL))
            return 0;
    return n > 0;
}

static const td__transport *built_in(td_transport kind) {
    return (unsigned)kind < COUNT(built) ? built[kind] : NULL;
}

td_status td__transport_choose(td_transport kind, td_device *const *devs, size_t n,
                               const td__transport **out) {
    *out = NULL;
    if (kind == TD_TRANSPORT_AUTO)
        kind = n > 1 && all_nccl(devs, n) && built_in(TD_TRANSPORT_NCCL) ? TD_TRANSPORT_NCCL
                                                                         : TD_TRANSPORT_LOCAL;
    if (!built_in(kind))
        return td__error(TD_ERR_UNSUPPORTED, "%s",
                         (unsigned)kind < COUNT(needs) && needs[kind]
                             ? needs[kind]
                             : "td_group_create: unknown transport");
    if (kind == TD_TRANSPORT_NCCL && !all_nccl(devs, n))
        return td__error(TD_ERR_INVALID_ARG, "the nccl transport needs CUDA devices only");
    *out = built_in(kind);
    return TD_OK;
}

#ifndef TD_HAVE_MPI
/* The public MPI calls of a build without MPI: nothing to finalise or end. */
void td_comm_mpi_finalize(void) {}
void td_comm_mpi_abort(int code) {
    (void)code;
}
#endif
