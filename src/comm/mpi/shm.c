/* The MPI transport's shared-memory all-reduce.
 *
 * Processes on one machine reach each other faster through memory they all
 * map than through MPI: Open MPI's small all-reduce costs 0.3-0.5 us in
 * matching and progress where a flag on a shared cache line costs one
 * transfer of that line, and its nonblocking form (what a timeout needs)
 * costs twice the blocking one at every size. So when every process of a
 * group runs on one machine (in MPI's view, and under one host name and one
 * network namespace: namespaces stand for machines, as in scripts/nodes),
 * the leaders all-reduce through one segment:
 *
 *   flags[P]            one tick per process, each on its own cache line
 *   slots[2][P][CHUNK]  each process's input, double buffered by tick parity
 *   result[2][CHUNK]    the reduced chunk, each process writing its part
 *
 * A small message takes one barrier: each process copies its input into its
 * slot, publishes its tick, waits for everyone's and reduces all slots
 * itself. A larger one goes in chunks of two barriers: after the first each
 * process reduces its P-th of the chunk into result, after the second each
 * copies the whole result out. Every element is reduced in process order,
 * so every process gets the same bits. Parity keeps a slot from being
 * overwritten while a slower process still reads it: a process writes the
 * slots of tick t+2 only after everyone published t+1, which each does only
 * after reading what tick t left. Waits poll, so a process that never comes
 * costs the group's timeout, named, rather than a hang; one whose group
 * failed says so beside its tick, and the others stop waiting at once. */
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "comm/mpi/shm.h"
#include "core/error.h"
#include "core/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SHM_LINE   64
#define SHM_CHUNK  ((size_t)256 << 10) /* stays in cache between writer and readers */
#define SHM_SMALL  ((size_t)16 << 10)  /* up to here every process reduces it all */
#define SHM_STREAM ((size_t)4 << 20)   /* from here out is written past the caches */
#define SPIN_NS    20000u              /* then yield the core */

typedef struct shm_flag {
    _Alignas(SHM_LINE) atomic_uint_least64_t tick;
    atomic_int failed; /* its group failed: it will not come */
} shm_flag;

struct td__shm {
    void *base;
    size_t size;
    shm_flag *flags;
    char *slots[2];
    char *result[2];
    int process, nprocs;
    int *world;  /* each process's rank in MPI_COMM_WORLD, for messages */
    int crowded; /* more processes than cores: yield at once */
    uint64_t tick;
};

static size_t round_up(size_t n, size_t to) {
    return (n + to - 1) / to * to;
}

static size_t segment_size(int nprocs) {
    return round_up((size_t)nprocs * sizeof(shm_flag), 4096) + 2 * ((size_t)nprocs + 1) * SHM_CHUNK;
}

static void lay_out(td__shm *s) {
    char *data = (char *)s->base + round_up((size_t)s->nprocs * sizeof(shm_flag), 4096);
    s->flags = s->base;
    for (int p = 0; p < 2; p++) {
        s->slots[p] = data + (size_t)p * ((size_t)s->nprocs + 1) * SHM_CHUNK;
        s->result[p] = s->slots[p] + (size_t)s->nprocs * SHM_CHUNK;
    }
}

/* Process 0 makes and names the segment; the others map it by that name; it
 * is unlinked once everyone holds it, so nothing is left behind. */
static int map_segment(td__shm *s, MPI_Comm comm) {
    static atomic_uint made;
    char name[64] = "";
    int fd = -1, ok = 0, all_ok = 0;
    if (!s) { /* out of memory here: still answer every call, with a no */
        MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
        MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
        ok = 0;
        MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
        return 0;
    }
    if (s->process == 0)
        snprintf(name, sizeof name, "/tandem-%d-%u", (int)getpid(), atomic_fetch_add(&made, 1));
    MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm);
    if (s->process == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)s->size) != 0) {
            close(fd);
            fd = -1;
        }
    }
    ok = s->process == 0 ? fd >= 0 : 1;
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (ok && s->process != 0)
        fd = shm_open(name, O_RDWR, 0600);
    if (fd >= 0) {
        s->base = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (s->base == MAP_FAILED)
            s->base = NULL;
    }
    ok = s->base != NULL && s->world != NULL;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, comm);
    if (s->process == 0 && name[0])
        shm_unlink(name);
    if (!all_ok && s->base) {
        munmap(s->base, s->size);
        s->base = NULL;
    }
    return all_ok;
}

/* Where this process runs, as far as a network can tell: a hash of its host
 * name and its network namespace. Nodes made of namespaces on one kernel
 * (containers, scripts/nodes) share the kernel's memory, and often
 * /dev/shm, but stand for machines: their traffic must go over their
 * network. (FNV-1a: a collision would take two names of 64 equal bits.) */
static uint64_t node_key(void) {
    char key[320] = "", net[64] = "";
    uint64_t h = 14695981039346656037ull;
    ssize_t n = readlink("/proc/self/ns/net", net, sizeof net - 1);
    net[n > 0 ? n : 0] = '\0';
    gethostname(key, 256);
    key[256] = '\0';
    strcat(key, " ");
    strcat(key, net);
    for (const char *c = key; *c; c++)
        h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return h;
}

/* Every process on one machine: in MPI's view (its shared-memory
 * communicator), and under one host name and one network namespace. A
 * collective; the same answer in every process. */
static int on_one_machine(MPI_Comm comm, int nprocs) {
    MPI_Comm node;
    int here = 0;
    uint64_t key = node_key(), mine[2] = {key, ~key}, most[2] = {0, 0};
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return 0;
    MPI_Comm_size(node, &here);
    MPI_Comm_free(&node);
    if (here != nprocs)
        return 0;
    /* the largest key and the complement of the smallest: equal when all are */
    if (MPI_Allreduce(mine, most, 2, MPI_UINT64_T, MPI_MAX, comm) != MPI_SUCCESS)
        return 0;
    return most[0] == ~most[1];
}

/* Each process's rank in MPI_COMM_WORLD: a local call, no communication. */
static void world_ranks(td__shm *s, MPI_Comm comm) {
    MPI_Group mine, world;
    int *ranks = malloc(sizeof *ranks * (size_t)s->nprocs);
    if (!ranks)
        return;
    for (int p = 0; p < s->nprocs; p++)
        ranks[p] = p;
    MPI_Comm_group(comm, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    s->world = malloc(sizeof *s->world * (size_t)s->nprocs);
    if (s->world)
        MPI_Group_translate_ranks(mine, s->nprocs, ranks, world, s->world);
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    free(ranks);
}

td_status td__shm_open(MPI_Comm comm, int process, int nprocs, td__shm **out) {
    const char *env = getenv("TANDEM_MPI_SHM");
    td__shm *s;
    *out = NULL;
    if (nprocs < 2 || (env && !strcmp(env, "0")) || !on_one_machine(comm, nprocs))
        return TD_OK;
    s = calloc(1, sizeof *s);
    if (s) {
        s->process = process;
        s->nprocs = nprocs;
        s->size = segment_size(nprocs);
        s->crowded = sysconf(_SC_NPROCESSORS_ONLN) < nprocs;
        world_ranks(s, comm);
    }
    /* Every process takes part in map_segment's calls, whatever failed here. */
    if (!map_segment(s, comm)) {
        TD_LOG_INFO("the mpi transport: no shared memory segment of %zu bytes (/dev/shm); "
                    "all-reducing through MPI",
                    segment_size(nprocs));
        td__shm_close(s);
        return TD_OK;
    }
    lay_out(s);
    *out = s;
    return TD_OK;
}

void td__shm_close(td__shm *s) {
    if (!s)
        return;
    if (s->base)
        munmap(s->base, s->size);
    free(s->world);
    free(s);
}

/* Waiting ------------------------------------------------------------------- */

static td_status timed_out(td__shm *s, td__member *m, const td__op *o, int late) {
    td_group *g = m->g;
    char rec[4096];
    td__group_fail(g, -1,
                   "collective #%llu (%s): timed out after %d ms in shared memory: MPI process %d "
                   "never arrived",
                   (unsigned long long)o->seq, td_collective_name(o->kind), g->timeout_ms,
                   s->world[late]);
    TD_LOG_ERROR("%s\n%s", td_last_error(), td_group_record(g, rec, sizeof rec));
    return td__group_lost(g);
}

void td__shm_failed(td__shm *s) {
    atomic_store_explicit(&s->flags[s->process].failed, 1, memory_order_release);
}

static td_status peer_failed(td__shm *s, td__member *m, const td__op *o, int q) {
    td_group *g = m->g;
    td__group_fail(g, -1, "collective #%llu (%s): MPI process %d failed and will not come",
                   (unsigned long long)o->seq, td_collective_name(o->kind), s->world[q]);
    return td__group_lost(g);
}

/* Publishes this process's tick t and waits until every process has. */
static td_status barrier(td__shm *s, td__member *m, const td__op *o, uint64_t t) {
    td_group *g = m->g;
    uint64_t start = 0, limit = (uint64_t)g->timeout_ms * 1000000u;
    atomic_store_explicit(&s->flags[s->process].tick, t, memory_order_release);
    for (int q = 0; q < s->nprocs; q++) {
        unsigned rounds = 0;
        while (atomic_load_explicit(&s->flags[q].tick, memory_order_acquire) < t) {
            uint64_t now;
            cpu_relax();
            if (++rounds % 64)
                continue;
            now = td_clock_ns();
            if (!start)
                start = now;
            if (atomic_load_explicit(&g->aborted, memory_order_acquire))
                return td__group_lost(g);
            if (atomic_load_explicit(&s->flags[q].failed, memory_order_acquire))
                return peer_failed(s, m, o, q);
            if (now - start > limit)
                return timed_out(s, m, o, q);
            if (s->crowded || now - start > SPIN_NS) {
                if (now - start < 100000000u) {
                    sched_yield();
                } else {
                    struct timespec ts = {0, 50000};
                    nanosleep(&ts, NULL);
                }
            }
        }
    }
    return TD_OK;
}

/* All-reducing ---------------------------------------------------------------- */

static char *slot(const td__shm *s, uint64_t t, int process) {
    return s->slots[t & 1] + (size_t)process * SHM_CHUNK;
}

/* dst = the op, in process order, over every process's slot of tick t from
 * byte off, n elements; this process's term read from mine instead when
 * that is not NULL (its own part, which it did not copy). */
static void reduce_slots(const td__shm *s, uint64_t t, void *dst, size_t off, size_t n, td_dtype dt,
                         td_reduce_op op, const char *mine) {
    const char *term[2];
    for (int q = 0; q < 2; q++)
        term[q] = mine && q == s->process ? mine : slot(s, t, q) + off;
    td__reduce2(dst, term[0], term[1], n, dt, op);
    for (int q = 2; q < s->nprocs; q++)
        td__reduce2(dst, dst, mine && q == s->process ? mine : slot(s, t, q) + off, n, dt, op);
}

td_status td__shm_allreduce(td__shm *s, td__member *m, const td__op *o, const void *in, void *out) {
    const size_t es = td_dtype_size(o->dtype), bytes = o->count * es;
    const td_reduce_op op = o->op == TD_REDUCE_MEAN ? TD_REDUCE_SUM : o->op;
    td_status st = TD_OK;
    int streamed = 0;
    if (bytes <= SHM_SMALL) {
        uint64_t t = ++s->tick;
        memcpy(slot(s, t, s->process), in, bytes);
        TD_TRY(barrier(s, m, o, t));
        reduce_slots(s, t, out, 0, o->count, o->dtype, op, NULL);
        return TD_OK;
    }
    for (size_t done = 0; done < bytes; done += SHM_CHUNK) {
        const size_t nb = bytes - done < SHM_CHUNK ? bytes - done : SHM_CHUNK, n = nb / es;
        const size_t lo = n * (size_t)s->process / (size_t)s->nprocs,
                     hi = n * ((size_t)s->process + 1) / (size_t)s->nprocs;
        const char *from = (const char *)in + done;
        uint64_t t = ++s->tick;
        /* the others' parts only: this process reduces its own from in */
        memcpy(slot(s, t, s->process), from, lo * es);
        memcpy(slot(s, t, s->process) + hi * es, from + hi * es, (n - hi) * es);
        TD_TRY(barrier(s, m, o, t));
        reduce_slots(s, t, s->result[t & 1] + lo * es, lo * es, hi - lo, o->dtype, op,
                     from + lo * es);
        TD_TRY(barrier(s, m, o, ++s->tick));
        if (bytes >= SHM_STREAM)
            streamed |= td__stream_copy((char *)out + done, s->result[t & 1], nb);
        else
            memcpy((char *)out + done, s->result[t & 1], nb);
    }
fail:
    if (streamed) /* before other threads of the process read out */
        td__stream_fence();
    return st;
}
