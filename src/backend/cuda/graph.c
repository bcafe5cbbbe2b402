/* CUDA graphs: a step's ops captured on the device's stream once and
 * replayed; results for the host land in the graph's pinned area and are
 * finished after each replay. Scratch memory that a live graph may still use
 * is retired, not freed, until the last graph goes. */
#include <stdlib.h>

#include "backend/cuda/cuda-impl.h"
#include "core/alloc.h"
#include "core/error.h"

/* What a recorded graph may hand to the host: results of 64 ops at most. */
#define READBACK_BYTES 4096
#define MAX_DEFERRED   64

struct cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    unsigned char *readback; /* pinned, READBACK_BYTES: results copied here at each replay */
    size_t readback_used;
    cuda_deferred deferred[MAX_DEFERRED];
    int ndeferred;
    int failed; /* an op refused to be recorded */
};

/* Keeps a scratch block that recorded graphs may still use until the last of
 * them is destroyed. */
static td_status retire_scratch(cuda_device *cd, void *p) {
    if (cd->nretired == cd->cap_retired) {
        int cap = cd->cap_retired ? 2 * cd->cap_retired : 4;
        void **r = realloc(cd->retired, sizeof *r * (size_t)cap);
        if (!r)
            return td__error(TD_ERR_OUT_OF_MEMORY, "%s: out of host memory", cd->name);
        cd->retired = r;
        cd->cap_retired = cap;
    }
    cd->retired[cd->nretired++] = p;
    return TD_OK;
}

void td__cuda_free_retired(cuda_device *cd) {
    for (int i = 0; i < cd->nretired; i++)
        cudaFree(cd->retired[i]);
    cd->nretired = 0;
}

td_status td__cuda_scratch(cuda_device *cd, size_t nbytes, void **out) {
    if (nbytes > cd->scratch_size) {
        size_t want = nbytes < 2 * cd->scratch_size ? 2 * cd->scratch_size : nbytes;
        if (cd->capture) {
            char a[32];
            cd->capture->failed = 1;
            return td__error(TD_ERR_UNSUPPORTED,
                             "%s: scratch memory would grow to %s while recording a graph",
                             cd->name, td__format_bytes((double)nbytes, a));
        }
        if (cd->scratch) {
            if (cd->live_graphs > 0) {
                td_status st = retire_scratch(cd, cd->scratch);
                if (st != TD_OK)
                    return st;
            } else {
                cudaFree(cd->scratch);
            }
        }
        cd->scratch = NULL;
        cd->scratch_size = 0;
        TD_CUDA_CHECK(cudaMalloc(&cd->scratch, want), cd);
        cd->scratch_size = want;
    }
    *out = cd->scratch;
    return TD_OK;
}

td_status td__cuda_not_while_recording(cuda_device *cd, const char *what) {
    cd->capture->failed = 1;
    return td__error(TD_ERR_UNSUPPORTED, "%s: %s while recording a graph", cd->name, what);
}

static void graph_free(cuda_graph *g) {
    if (!g)
        return;
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    if (g->graph)
        cudaGraphDestroy(g->graph);
    if (g->readback)
        cudaFreeHost(g->readback);
    free(g);
}

td_status td__cuda_defer(cuda_device *cd, const void *src, size_t nbytes, const cuda_deferred *d) {
    cuda_graph *g = cd->capture;
    size_t off;
    if (!g)
        return td__error(TD_ERR_INTERNAL, "%s: td__cuda_defer outside a recording", cd->name);
    off = (g->readback_used + 15) / 16 * 16;
    if (g->ndeferred == MAX_DEFERRED || off + nbytes > READBACK_BYTES) {
        g->failed = 1;
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: more results for the host than a graph holds (%d)", cd->name,
                         MAX_DEFERRED);
    }
    TD_CUDA_CHECK(
        cudaMemcpyAsync(g->readback + off, src, nbytes, cudaMemcpyDeviceToHost, cd->stream), cd);
    g->deferred[g->ndeferred] = *d;
    g->deferred[g->ndeferred].offset = off;
    g->ndeferred++;
    g->readback_used = off + nbytes;
    return TD_OK;
}

td_status td__cuda_graph_begin(void *ctx) {
    cuda_device *cd = ctx;
    cuda_graph *g;
    cudaError_t err;
    if (cd->graphs_off)
        return td__error(TD_ERR_UNSUPPORTED, "%s: CUDA graphs are off (TANDEM_CUDA_GRAPHS=0)",
                         cd->name);
    if (cd->capture)
        return td__error(TD_ERR_INTERNAL, "%s: a graph is being recorded already", cd->name);
    if (!(g = td__calloc(sizeof *g, "a CUDA graph")))
        return TD_ERR_OUT_OF_MEMORY;
    err = cudaHostAlloc((void **)&g->readback, READBACK_BYTES, cudaHostAllocDefault);
    /* Thread-local mode: only this thread is barred from unsafe calls such as
     * cudaMalloc, so the host threads of the other logical devices on this
     * GPU go on as they were. */
    if (err == cudaSuccess)
        err = cudaStreamBeginCapture(cd->stream, cudaStreamCaptureModeThreadLocal);
    if (err != cudaSuccess) {
        cudaGetLastError();
        graph_free(g);
        return td__cuda_status(err, "cudaStreamBeginCapture", cd);
    }
    cd->capture = g;
    return TD_OK;
}

td_status td__cuda_graph_end(void *ctx, void **out) {
    cuda_device *cd = ctx;
    cuda_graph *g = cd->capture;
    cudaError_t err;
    td_status st = TD_OK;
    *out = NULL;
    if (!g)
        return td__error(TD_ERR_INTERNAL, "%s: no graph is being recorded", cd->name);
    cd->capture = NULL;
    err = cudaStreamEndCapture(cd->stream, &g->graph);
    if (err != cudaSuccess) {
        cudaGetLastError();
        st = td__cuda_status(err, "cudaStreamEndCapture", cd);
    } else if (g->failed) {
        st = td__error(TD_ERR_UNSUPPORTED, "%s: an op could not be recorded", cd->name);
    } else if ((err = cudaGraphInstantiate(&g->exec, g->graph, 0)) != cudaSuccess) {
        cudaGetLastError();
        st = td__cuda_status(err, "cudaGraphInstantiate", cd);
    }
    if (st != TD_OK) {
        graph_free(g);
        return st;
    }
    cd->live_graphs++;
    *out = g;
    return TD_OK;
}

td_status td__cuda_graph_launch(void *ctx, void *graph) {
    cuda_device *cd = ctx;
    cuda_graph *g = graph;
    td_status st;
    if (cd->capture)
        return td__cuda_not_while_recording(cd, "launching a graph");
    TD_CUDA_CHECK(cudaGraphLaunch(g->exec, cd->stream), cd);
    TD_CUDA_CHECK(cudaStreamSynchronize(cd->stream), cd);
    for (int i = 0; i < g->ndeferred; i++) {
        const cuda_deferred *d = &g->deferred[i];
        if ((st = d->finish(cd, d, g->readback + d->offset)) != TD_OK)
            return st;
    }
    return TD_OK;
}

void td__cuda_graph_destroy(void *ctx, void *graph) {
    cuda_device *cd = ctx;
    if (!graph)
        return;
    graph_free(graph);
    if (--cd->live_graphs == 0)
        td__cuda_free_retired(cd);
}

void td__cuda_graph_abandon(cuda_device *cd) {
    cudaGraph_t g = NULL;
    if (!cd->capture)
        return;
    if (cudaStreamEndCapture(cd->stream, &g) == cudaSuccess && g)
        cudaGraphDestroy(g);
    graph_free(cd->capture);
    cd->capture = NULL;
}
