/* trace_path: the run's timeline as a Chrome trace-event file.
 *
 * The recorder (core/trace.h) keeps each thread's spans; this file turns
 * them on for the steps asked for, and at the run's end writes
 *     {"displayTimeUnit":"ms","otherData":{...},"traceEvents":[...]}
 * with a process per MPI rank (pid: its rank), a track per thread (tid,
 * named by a thread_name metadata event: the device, "cpu:0 comm" for its
 * collective engine, "trainer") and a complete event ("ph":"X", ts and dur
 * in microseconds) per span, its step, bytes and micro-batch in args.
 * Every process writes its events as text with its clock moved onto the
 * first process's (measured at the start) and the first process gathers
 * them into the file, so one file holds every device of the job. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/process.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"
#include "train/train-impl.h"

struct td__train_trace {
    FILE *f;           /* the first process's file; NULL in the others */
    int64_t offset_ns; /* this process's clock to the first process's */
    uint64_t base_ns;  /* the first process's clock at the start: ts 0 */
    int process;       /* MPI rank; 0 alone */
    uint64_t load_t0;  /* td__trace_begin() before the loader's batch */
};

/* The recorder holds one session at a time per process. */
static atomic_int in_use;

td_status td__train_trace_check(td__trainer *t) {
    const td_train_config *c = t->cfg;
    int rank;
    if (c->trace_first < 0 || c->trace_last < 0 ||
        (c->trace_last > 0 && c->trace_first > c->trace_last))
        return BAD_SETTING(t, "trace_first",
                           "steps %lld to %lld cannot be traced: give first <= last, counting "
                           "from 1 (`trace_first`, `trace_last`)",
                           (long long)c->trace_first, (long long)c->trace_last);
    if (!c->trace_path) {
        if (c->trace_first || c->trace_last)
            return BAD_SETTING(t, "trace_path",
                               "steps to trace given (`trace_first`, `trace_last`), but there is "
                               "no `trace_path`");
        return TD_OK;
    }
    if (!*c->trace_path)
        return BAD_SETTING(t, "trace_path", "no file named for the trace (`trace_path` is empty)");
    /* Under mpirun only the first process writes it, perhaps on another
     * machine (the group that says which is made later). */
    td_comm_launch(&rank, NULL);
    if (rank > 0)
        return TD_OK;
    return td__train_check_output(c->trace_path, "trace_path", "the trace", 0);
}

td_status td__train_trace_begin(td__trainer *t) {
    const td_train_config *c = t->cfg;
    struct td__train_trace *tr;
    int expected = 0;
    td_status st;
    if (!c->trace_path)
        return TD_OK;
    if (!atomic_compare_exchange_strong(&in_use, &expected, 1))
        return td__error_setting(TD_ERR_INVALID_ARG, "trace_path",
                                 "%s: another run in this process is writing a trace; one at a "
                                 "time (`trace_path`)",
                                 c->trace_path);
    if (!(tr = td__calloc(sizeof *tr, "the trace"))) {
        atomic_store(&in_use, 0);
        return TD_ERR_OUT_OF_MEMORY;
    }
    t->trace = tr;
    tr->process = td__group_process(t->group);
    /* Opened now, so that a file that cannot be written fails the run
     * before it trains rather than after. */
    if (t->root && !(tr->f = fopen(c->trace_path, "w")))
        return td__error_setting(TD_ERR_IO, "trace_path",
                                 "%s: cannot open the trace for writing: %s (`trace_path`)",
                                 c->trace_path, strerror(errno));
    if ((st = td__group_clock_sync(t->group, &tr->offset_ns, &tr->base_ns)) != TD_OK)
        return td__error_prefix(st, "aligning the processes' clocks for the trace: ");
    td__trace_thread_name("trainer");
    td__trace_start();
    return TD_OK;
}

void td__train_trace_loading(td__trainer *t) {
    const td_train_config *c = t->cfg;
    int64_t step = t->state.step + 1; /* the one this batch is for, counted from 1 */
    if (!t->trace)
        return;
    t->trace->load_t0 = 0;
    if ((c->trace_first && step < c->trace_first) || (c->trace_last && step > c->trace_last)) {
        td__trace_pause();
        return;
    }
    td__trace_set_step(step);
    t->trace->load_t0 = td__trace_begin();
}

void td__train_trace_loaded(td__trainer *t, const td_batch *b) {
    if (!t->trace)
        return;
    td__trace_end(t->trace->load_t0, TD__TRACE_STEP, "load batch", -1);
    if (b->n == 0) /* the epoch's end: its evaluation and checkpoint are not a step's */
        td__trace_pause();
}

void td__train_trace_stepped(td__trainer *t, uint64_t tr) {
    if (!t->trace)
        return;
    td__trace_end(tr, TD__TRACE_STEP, "step", -1);
    td__trace_pause();
}

/* Writing ------------------------------------------------------------------- */

/* s as a JSON string's contents. */
static void put_json_text(FILE *f, const char *s) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
}

/* ns as microseconds, exactly (three decimals). */
static void put_us(FILE *f, int64_t ns) {
    if (ns < 0) {
        fputc('-', f);
        ns = -ns;
    }
    fprintf(f, "%lld.%03lld", (long long)(ns / 1000), (long long)(ns % 1000));
}

/* The trainer's track first, then the others by name (a device's engine
 * right after the device), unnamed last. */
static int track_order(const void *pa, const void *pb) {
    const td__trace_track *a = pa, *b = pb;
    int ta = !strcmp(a->name, "trainer"), tb = !strcmp(b->name, "trainer");
    if (ta != tb)
        return tb - ta;
    if (!a->name[0] != !b->name[0])
        return !a->name[0] - !b->name[0];
    return strcmp(a->name, b->name);
}

/* The tid of the track named `name` (tracks 0..n, tid = index + 1); for a
 * name no thread recorded under (a parked device's thread, idle all
 * along), one after them, whose metadata put_tracks writes. */
static int tid_of(const td__trace_track *tracks, size_t n, const char *name, const char **extra,
                  size_t *nextra) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tracks[i].name, name))
            return (int)i + 1;
    for (size_t i = 0; i < *nextra; i++)
        if (!strcmp(extra[i], name))
            return (int)(n + i) + 1;
    if (*nextra < 64)
        extra[(*nextra)++] = name;
    return (int)(n + *nextra);
}

static void put_track_name(FILE *f, int pid, int tid, const char *name) {
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"",
            pid, tid);
    put_json_text(f, name);
    fprintf(f,
            "\"}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
            "\"args\":{\"sort_index\":%d}},\n",
            pid, tid, tid);
}

static void put_span(FILE *f, const struct td__train_trace *tt, int tid, const td__trace_rec *r) {
    fprintf(f, "{\"name\":\"");
    put_json_text(f, r->name);
    fprintf(f, "\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":",
            td__trace_cat_name(r->cat), tt->process, tid);
    put_us(f, (int64_t)r->t0 + tt->offset_ns - (int64_t)tt->base_ns);
    fprintf(f, ",\"dur\":");
    put_us(f, (int64_t)(r->t1 - r->t0));
    fprintf(f, ",\"args\":{\"step\":%lld", (long long)r->step);
    if (r->bytes >= 0)
        fprintf(f, ",\"bytes\":%lld", (long long)r->bytes);
    if (r->cat == TD__TRACE_COMM) {
        fprintf(f, ",\"kind\":\"");
        put_json_text(f, r->name);
        fputc('"', f);
    }
    if (r->item >= 0)
        fprintf(f, ",\"micro_batch\":%d", r->item);
    fprintf(f, "}},\n");
}

/* A span and the track it goes on. */
typedef struct placed {
    int tid;
    const td__trace_rec *r;
} placed;

/* By track, then as td__trace_snapshot sorts: spans on one track come from
 * several threads when one recorded for another (a parked device). */
static int by_track(const void *pa, const void *pb) {
    const placed *a = pa, *b = pb;
    if (a->tid != b->tid)
        return a->tid < b->tid ? -1 : 1;
    if (a->r->t0 != b->r->t0)
        return a->r->t0 < b->r->t0 ? -1 : 1;
    if (a->r->t1 != b->r->t1)
        return a->r->t1 > b->r->t1 ? -1 : 1;
    return 0;
}

static void put_process_name(FILE *f, int pid, int processes) {
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"", pid);
    if (processes > 1)
        fprintf(f, "rank %d on ", pid);
    else
        fprintf(f, "tandem on ");
    put_json_text(f, host);
    fprintf(f,
            "\"}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
            "\"args\":{\"sort_index\":%d}},\n",
            pid, pid);
}

/* This process's events, each followed by ",\n". */
static td_status put_process(FILE *f, const struct td__train_trace *tt, td__trace_track *tracks,
                             size_t n, int processes) {
    const char *extra[64];
    size_t nextra = 0, total = 0, k = 0;
    uint64_t dropped = 0;
    placed *all;
    put_process_name(f, tt->process, processes);
    qsort(tracks, n, sizeof *tracks, track_order);
    for (size_t i = 0; i < n; i++) {
        char unnamed[32];
        if (!tracks[i].name[0])
            snprintf(unnamed, sizeof unnamed, "thread %zu", i + 1);
        put_track_name(f, tt->process, (int)i + 1, tracks[i].name[0] ? tracks[i].name : unnamed);
        dropped += tracks[i].dropped;
        total += tracks[i].n;
    }
    if (!(all = td__calloc(sizeof *all * (total ? total : 1), "the trace's spans")))
        return TD_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < tracks[i].n; j++) {
            const td__trace_rec *r = &tracks[i].recs[j];
            all[k].tid = r->track ? tid_of(tracks, n, r->track, extra, &nextra) : (int)i + 1;
            all[k++].r = r;
        }
    qsort(all, total, sizeof *all, by_track);
    for (size_t i = 0; i < nextra; i++)
        put_track_name(f, tt->process, (int)(n + i) + 1, extra[i]);
    for (size_t i = 0; i < total; i++)
        put_span(f, tt, all[i].tid, all[i].r);
    free(all);
    if (dropped)
        TD_LOG_WARN("the trace lost %llu spans: a thread recorded more than its buffer holds "
                    "(tracing fewer steps keeps them all)",
                    (unsigned long long)dropped);
    return TD_OK;
}

/* This process's events as text (malloc'ed). */
static td_status process_text(const td__trainer *t, char **text, size_t *n) {
    td__trace_track *tracks = NULL;
    size_t ntracks = 0;
    FILE *f;
    td_status st;
    TD_CHECK(td__trace_snapshot(&tracks, &ntracks));
    *text = NULL;
    *n = 0;
    if (!(f = open_memstream(text, n))) {
        td__trace_snapshot_free(tracks, ntracks);
        return td__error(TD_ERR_OUT_OF_MEMORY, "no memory for the trace's text");
    }
    st = put_process(f, t->trace, tracks, ntracks,
                     td_group_size(t->group) > td_group_local_size(t->group) ? 2 : 1);
    td__trace_snapshot_free(tracks, ntracks);
    if (fclose(f) != 0 || st != TD_OK) {
        free(*text);
        *text = NULL;
        return td__error(TD_ERR_OUT_OF_MEMORY, "no memory for the trace's text");
    }
    return TD_OK;
}

/* The file around the events of every process (all, n bytes, each event
 * followed by ",\n"). */
static td_status write_file(const td__trainer *t, const char *all, size_t n) {
    const td_train_config *c = t->cfg;
    FILE *f = t->trace->f;
    int bad;
    while (n > 0 && (all[n - 1] == '\n' || all[n - 1] == ','))
        n--; /* the last event's separator */
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"tandem %s\",\"steps\":\"",
            TD_VERSION_STRING);
    if (c->trace_first)
        fprintf(f, "%lld", (long long)c->trace_first);
    fputc(':', f);
    if (c->trace_last)
        fprintf(f, "%lld", (long long)c->trace_last);
    fprintf(f, "\"},\n\"traceEvents\":[\n");
    fwrite(all, 1, n, f);
    fprintf(f, "\n]}\n");
    bad = ferror(f);
    bad |= fclose(f) != 0;
    t->trace->f = NULL;
    if (bad)
        return td__error_setting(TD_ERR_IO, "trace_path",
                                 "%s: cannot write the trace: %s (`trace_path`)", c->trace_path,
                                 strerror(errno));
    return TD_OK;
}

td_status td__train_trace_end(td__trainer *t, td_status run) {
    char *text = NULL, *all = NULL, *why = NULL;
    const char *why_setting = NULL;
    size_t n = 0, all_n = 0;
    td_status st;
    if (!t->trace || !t->group)
        return run;
    td__trace_pause();
    /* A failed run under mpirun leaves its processes in different places:
     * gathering could wait for ever, and the CLI ends the job anyway. */
    if (run != TD_OK && td_group_size(t->group) > td_group_local_size(t->group))
        return run;
    /* A failed run's trace is written too (it shows where it stopped); its
     * message is the failure's. */
    if (run != TD_OK) {
        why = strdup(td_last_error());
        why_setting = td_last_error_setting();
    }
    st = process_text(t, &text, &n);
    if (st == TD_OK)
        st = td__group_gather_text(t->group, text, n, &all, &all_n);
    if (st == TD_OK && t->trace->f)
        st = write_file(t, all, all_n);
    free(text);
    free(all);
    if (run == TD_OK)
        return st;
    if (why)
        td__error_set(why, why_setting);
    free(why);
    return run;
}

void td__train_trace_close(td__trainer *t) {
    if (!t->trace)
        return;
    td__trace_pause();
    if (t->trace->f)
        fclose(t->trace->f);
    free(t->trace);
    t->trace = NULL;
    atomic_store(&in_use, 0);
}
