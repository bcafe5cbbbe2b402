/* tandem train --monitor: a live view of the devices.
 *
 * Each step event brings the step's per-member numbers (td_step_stats); the
 * monitor adds them up between refreshes and then shows, per device:
 *   busy   compute time over the step time (the run's own counters), or,
 *          for a CUDA device when NVML is there, NVML's GPU utilisation
 *          over its last sample period ("util"; every process on the GPU
 *          counts, as nvidia-smi shows it);
 *   mem    td_device_mem_used() over the device's memory (its budget when
 *          {mem=...} set one);
 *   share  its share of the batch in the last step (of the layers' cost
 *          under pipeline);
 *   time   its own part of the step: the step less its wait for the others.
 *
 * On a terminal it redraws a block of lines in place (cursor up, erase
 * down), at most every TD_CLI_MONITOR_TTY_NS; elsewhere it writes one plain
 * line every TD_CLI_MONITOR_PLAIN_NS, the first after the first step.
 *
 * NVML is opened with dlopen("libnvidia-ml.so.1"), never linked, so the
 * command runs where there is no NVIDIA driver. A GPU is found in NVML by
 * its PCI address (td_device_info.pci_bus_id), which neither CUDA's
 * fastest-first numbering nor CUDA_VISIBLE_DEVICES changes. A device NVML
 * does not know falls back to the counters. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "monitor.h"
#include "tandem/tandem.h"

/* The few NVML declarations used (nvml.h, which is not needed to build). */
typedef int nvml_return; /* nvmlReturn_t: 0 is NVML_SUCCESS */
typedef struct nvml_device_st *nvml_device;
typedef struct nvml_utilization {
    unsigned int gpu, memory; /* percent of the last sample period */
} nvml_utilization;

typedef struct nvml {
    void *lib; /* NULL: not loaded (absent, or not tried: tried says) */
    int tried;
    nvml_return (*init)(void);
    nvml_return (*shutdown)(void);
    nvml_return (*by_pci_bus_id)(const char *, nvml_device *);
    nvml_return (*utilization)(nvml_device, nvml_utilization *);
} nvml;

/* What the monitor knows of one device, found once. */
typedef struct known_device {
    const td_device *dev;
    uint64_t mem_total; /* bytes; 0 unknown */
    nvml_device gpu;    /* NULL: use the counters */
} known_device;

/* One member's numbers since the last refresh. */
typedef struct member_sum {
    double compute_s, own_s, step_s; /* own: the step less its wait */
    double share;                    /* the last step's */
    int parked;                      /* in the last step */
} member_sum;

struct td_cli_monitor {
    FILE *out;
    int tty;
    int lines;          /* lines of the block on screen (tty) */
    uint64_t last_draw; /* td_clock_ns(); 0: never */
    int members;        /* of the steps summed */
    int steps;          /* summed since the last refresh */
    member_sum sum[TD_DP_MAX_MEMBERS];
    known_device known[TD_DP_MAX_MEMBERS];
    int nknown;
    nvml nv;
};

/* dlsym(lib, name) into the function pointer at fn (n bytes): POSIX makes
 * the bits of the void * a function's address; memcpy keeps C's aliasing
 * rules out of it. NULL when the library lacks the name. */
static void symbol(void *lib, const char *name, void *fn, size_t n) {
    void *p = dlsym(lib, name);
    memcpy(fn, &p, n < sizeof p ? n : sizeof p);
}

/* Loads NVML and initialises it; 0 when it is not there or will not start. */
static int nvml_load(nvml *nv) {
    if (nv->tried)
        return nv->lib != NULL;
    nv->tried = 1;
    if (!(nv->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)))
        return 0;
    symbol(nv->lib, "nvmlInit_v2", &nv->init, sizeof nv->init);
    symbol(nv->lib, "nvmlShutdown", &nv->shutdown, sizeof nv->shutdown);
    symbol(nv->lib, "nvmlDeviceGetHandleByPciBusId_v2", &nv->by_pci_bus_id,
           sizeof nv->by_pci_bus_id);
    symbol(nv->lib, "nvmlDeviceGetUtilizationRates", &nv->utilization, sizeof nv->utilization);
    if (!nv->init || !nv->shutdown || !nv->by_pci_bus_id || !nv->utilization || nv->init() != 0) {
        dlclose(nv->lib);
        nv->lib = NULL;
        return 0;
    }
    return 1;
}

/* NVML's handle of the GPU at PCI address `bus` (td_device_info's, which
 * holds whatever CUDA_VISIBLE_DEVICES renumbered); NULL when NVML is absent
 * or does not know it. */
static nvml_device nvml_find(nvml *nv, const char *bus) {
    nvml_device d = NULL;
    if (!bus[0] || !nvml_load(nv) || nv->by_pci_bus_id(bus, &d) != 0)
        return NULL;
    return d;
}

/* The monitor's record of dev, made the first time it is met. */
static known_device *know(td_cli_monitor *m, td_device *dev) {
    known_device *k;
    td_device_info info;
    for (int i = 0; i < m->nknown; i++)
        if (m->known[i].dev == dev)
            return &m->known[i];
    if (m->nknown == TD_DP_MAX_MEMBERS)
        return NULL;
    k = &m->known[m->nknown++];
    memset(k, 0, sizeof *k);
    k->dev = dev;
    if (td_device_get_info(dev, &info) != TD_OK)
        return k;
    k->mem_total = info.mem_total;
    k->gpu = nvml_find(&m->nv, info.pci_bus_id);
    return k;
}

td_cli_monitor *td_cli_monitor_create(FILE *out, int tty) {
    td_cli_monitor *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->out = out;
    m->tty = tty;
    return m;
}

void td_cli_monitor_destroy(td_cli_monitor *m) {
    if (!m)
        return;
    if (m->nv.lib) {
        m->nv.shutdown();
        dlclose(m->nv.lib);
    }
    free(m);
}

void td_cli_monitor_clear(td_cli_monitor *m) {
    if (!m || !m->tty || m->lines == 0)
        return;
    fprintf(m->out, "\033[%dA\r\033[J", m->lines);
    fflush(m->out);
    m->lines = 0;
}

/* bytes as "512K", "1.5M", "7.8G". */
static void put_bytes(char *buf, size_t n, double bytes) {
    const char *unit = "KMGTP";
    int u = 0;
    bytes /= 1024;
    while (bytes >= 1000 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, n, bytes < 10 ? "%.1f%c" : "%.0f%c", bytes, unit[u]);
}

/* A bar of w cells (at most 32), filled to the fraction f. */
static const char *bar(char *buf, int w, double f) {
    int filled = (int)(f * w + 0.5);
    if (w > 32)
        w = 32;
    for (int i = 0; i < w; i++)
        buf[i] = i < filled ? '#' : '.';
    buf[w] = '\0';
    return buf;
}

/* One device's numbers for a refresh. */
typedef struct member_view {
    char name[32];
    double busy; /* fraction; from NVML when nvml */
    int nvml;
    int mem_known; /* its device is in this process */
    double mem_used, mem_total;
    double share, own_ms;
    int parked;
} member_view;

static void view_member(td_cli_monitor *m, const td_group *g, int r, member_view *v) {
    const member_sum *s = &m->sum[r];
    td_device *dev = g ? td_group_device(g, r) : NULL;
    known_device *k = dev ? know(m, dev) : NULL;
    nvml_utilization u;
    memset(v, 0, sizeof *v);
    if (dev)
        snprintf(v->name, sizeof v->name, "%s", td_device_name(dev));
    else
        snprintf(v->name, sizeof v->name, "rank %d", r); /* in another process */
    v->busy = s->step_s > 0 ? s->compute_s / s->step_s : 0;
    if (k && k->gpu && m->nv.utilization(k->gpu, &u) == 0) {
        v->busy = u.gpu / 100.0;
        v->nvml = 1;
    }
    if (v->busy > 1)
        v->busy = 1;
    if (dev) {
        v->mem_known = 1;
        v->mem_used = (double)td_device_mem_used(dev);
        v->mem_total = k ? (double)k->mem_total : 0;
    }
    v->share = s->share;
    v->own_ms = m->steps ? 1e3 * s->own_s / m->steps : 0;
    v->parked = s->parked;
}

/* "1.2M/7.8G", or "1.2M" when the total is unknown, or "-". */
static void mem_text(const member_view *v, char *buf, size_t n) {
    char used[16], total[16];
    if (!v->mem_known) {
        snprintf(buf, n, "-");
        return;
    }
    put_bytes(used, sizeof used, v->mem_used);
    if (v->mem_total <= 0) {
        snprintf(buf, n, "%s", used);
        return;
    }
    put_bytes(total, sizeof total, v->mem_total);
    snprintf(buf, n, "%s/%s", used, total);
}

/* The terminal's width in columns; 100 when it will not say. */
static int columns(FILE *out) {
    struct winsize ws;
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
        return ws.ws_col;
    return 100;
}

/* The block: head, then a line per device, each cut to the terminal's
 * width so that none wraps (the cursor goes back up by lines). */
static void draw_block(td_cli_monitor *m, const td_train_event *ev, const char *head) {
    int cols = columns(m->out), namew = 6, w;
    double step_ms = m->steps ? 1e3 * m->sum[0].step_s / m->steps : 0;
    member_view v[TD_DP_MAX_MEMBERS];
    char line[512];
    for (int r = 0; r < m->members; r++) {
        view_member(m, ev->group, r, &v[r]);
        if ((int)strlen(v[r].name) > namew)
            namew = (int)strlen(v[r].name);
    }
    /* Three bars share what the text leaves of the width. */
    w = (cols - 1 - (namew + 71)) / 3;
    w = w < 4 ? 4 : w > 20 ? 20 : w;
    td_cli_monitor_clear(m);
    snprintf(line, sizeof line, "%s  | step %.1f ms", head ? head : "", step_ms);
    fprintf(m->out, "\r\033[K%.*s\n", cols - 1, line);
    for (int r = 0; r < m->members; r++) {
        char b1[33], b2[33], b3[33], mem[32];
        double mf = v[r].mem_total > 0 ? v[r].mem_used / v[r].mem_total : 0;
        mem_text(&v[r], mem, sizeof mem);
        snprintf(line, sizeof line,
                 "  %-*s  %s [%s] %3.0f%%  mem [%s] %-11s  share [%s] %5.1f%%  time %7.1f ms%s",
                 namew, v[r].name, v[r].nvml ? "util" : "busy", bar(b1, w, v[r].busy),
                 100 * v[r].busy, bar(b2, w, mf), mem, bar(b3, w, v[r].share), 100 * v[r].share,
                 v[r].own_ms, v[r].parked ? "  parked" : "");
        fprintf(m->out, "\r\033[K%.*s\n", cols - 1, line);
    }
    fflush(m->out);
    m->lines = 1 + m->members;
}

/* One line for a log: "monitor: step N, X ms/step: cpu:0 busy 62% mem
 * 1.2M/7.8G share 50.3% time 12.1 ms; cpu:1 ...". */
static void draw_line(td_cli_monitor *m, const td_train_event *ev) {
    double step_ms = m->steps ? 1e3 * m->sum[0].step_s / m->steps : 0;
    fprintf(m->out, "monitor: step %lld, %.1f ms/step:", (long long)ev->step, step_ms);
    for (int r = 0; r < m->members; r++) {
        member_view v;
        char mem[32];
        view_member(m, ev->group, r, &v);
        mem_text(&v, mem, sizeof mem);
        fprintf(m->out, "%s %s %s %.0f%% mem %s share %.1f%% time %.1f ms%s", r ? ";" : "", v.name,
                v.nvml ? "util" : "busy", 100 * v.busy, mem, 100 * v.share, v.own_ms,
                v.parked ? " parked" : "");
    }
    fputc('\n', m->out);
    fflush(m->out);
}

/* The trainer wrote "tandem: <stragglers>" to stderr under the block before
 * this step's event: the terminal rows that took. */
static int straggler_rows(const td_cli_monitor *m, const char *text) {
    int cols = columns(m->out), rows = 0;
    size_t len = strlen("tandem: ");
    for (const char *p = text; *p; p++) {
        if (*p != '\n') {
            len++;
            continue;
        }
        rows += len == 0 ? 1 : (int)((len + (size_t)cols - 1) / (size_t)cols);
        len = 0;
    }
    return rows + (len > 0);
}

void td_cli_monitor_step(td_cli_monitor *m, const td_train_event *ev, const char *head) {
    const td_step_stats *ds = ev->stats;
    uint64_t now = td_clock_ns();
    if (!m || ev->kind != TD_TRAIN_EVENT_STEP || !ds || ds->members < 1)
        return;
    /* Lines the trainer wrote under the block (a straggler named, see
     * add_member_stats in src/train/trainer.c) go above it, where they
     * stay: the block is erased with them, they are written again, and the
     * block is drawn now under them. */
    if (m->tty && m->lines > 0 && ds->stragglers[0]) {
        m->lines += straggler_rows(m, ds->stragglers);
        td_cli_monitor_clear(m);
        fprintf(m->out, "tandem: %s", ds->stragglers);
        m->last_draw = 0;
    }
    if (ds->members != m->members) { /* the first step, or a device lost */
        memset(m->sum, 0, sizeof m->sum);
        m->steps = 0;
        m->members = ds->members < TD_DP_MAX_MEMBERS ? ds->members : TD_DP_MAX_MEMBERS;
    }
    for (int r = 0; r < m->members; r++) {
        const td_member_stats *s = &ds->m[r];
        m->sum[r].compute_s += s->compute_s;
        m->sum[r].own_s += ds->step_s > s->wait_s ? ds->step_s - s->wait_s : 0;
        m->sum[r].step_s += ds->step_s;
        m->sum[r].share = s->share;
        m->sum[r].parked = s->parked;
    }
    m->steps++;
    if (m->last_draw &&
        now - m->last_draw < (m->tty ? TD_CLI_MONITOR_TTY_NS : TD_CLI_MONITOR_PLAIN_NS))
        return;
    if (m->tty)
        draw_block(m, ev, head);
    else
        draw_line(m, ev);
    m->last_draw = now;
    memset(m->sum, 0, sizeof m->sum);
    m->steps = 0;
}
