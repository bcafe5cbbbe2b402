/* The device registry: the backends this tandem was built with, and
 * opening the devices a spec names through them (td_devices_open). It sits
 * above the backends, as ggml's registry does: the device layer below names
 * no backend and calls no code above it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backends.h"
#include "core/error.h"

static const td_backend_ops *const built_in[] = {
    &td__cpu_backend,
#ifdef TD_HAVE_CUDA
    &td__cuda_backend,
#endif
#ifdef TD_HAVE_OPENCL
    &td__opencl_backend,
#endif
    NULL,
};

static const char *const left_out[] = {
#ifndef TD_HAVE_CUDA
    "cuda: not built in (no nvcc at configure time)",
#endif
#ifndef TD_HAVE_OPENCL
    "opencl: not built in (no OpenCL headers at configure time)",
#endif
    NULL,
};

static const td_backend_ops *const *td__backends(void) {
    return built_in;
}

static const char *const *td__backends_left_out(void) {
    return left_out;
}

/* Finding a backend -------------------------------------------------------- */

static const td_backend_ops *find_backend(const char *name) {
    for (const td_backend_ops *const *b = td__backends(); *b; b++)
        if (!strcmp((*b)->name, name))
            return *b;
    return NULL;
}

/* What `auto` opens when no TD_DEVICE_CAP_AUTO backend has a device: the
 * backend of this process's own cores. */
static const td_backend_ops *fallback_backend(void) {
    for (const td_backend_ops *const *b = td__backends(); *b; b++)
        if ((*b)->caps & TD_DEVICE_CAP_HOST_CORES)
            return *b;
    return NULL;
}

/* "cpu: cpu:0, cpu:1; cuda: none (...)" for error messages. */
static void describe_all(char *buf, size_t n) {
    size_t used = 0;
    const td_backend_ops *const *b;
    const char *const *missing;
    buf[0] = '\0';
    for (b = td__backends(); *b && used + 1 < n; b++) {
        char line[512];
        (*b)->describe(line, sizeof line);
        used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? "; " : "", line);
    }
    for (missing = td__backends_left_out(); *missing && used + 1 < n; missing++)
        used += (size_t)snprintf(buf + used, n - used, "; %s", *missing);
}

static td_status open_backend_item(const td_backend_ops *b, const td_spec_item *item,
                                   td_device_sink *sink) {
    td_status st = b->open(item, sink);
    if (st == TD_ERR_NO_DEVICE) {
        char here[1024];
        describe_all(here, sizeof here);
        td__error_prefix(st, "device spec item '%s': ", item->text);
        /* Append the listing after the backend's own reason. */
        {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s. Devices here: %s", td_last_error(), here);
            td__error_set(msg, td_last_error_setting());
        }
    }
    return st;
}

static td_status open_item(const td_spec_item *item, td_device_sink *sink) {
    const td_backend_ops *b;
    if (!strcmp(item->backend, "all") || !strcmp(item->backend, "auto")) {
        int want_all = !strcmp(item->backend, "all");
        int gpus = 0;
        td_status st;
        for (const td_backend_ops *const *each = td__backends(); *each; each++) {
            const td_backend_ops *bk = *each;
            td_spec_item every = *item;
            int n;
            if (!want_all && !(bk->caps & TD_DEVICE_CAP_AUTO))
                continue; /* auto takes GPUs first; the CPU is the fallback below. */
            n = bk->count();
            if (n <= 0) {
                char line[512];
                bk->describe(line, sizeof line);
                td__device_list_note(sink, line);
                continue;
            }
            snprintf(every.backend, sizeof every.backend, "%s", bk->name);
            every.index_kind = TD_SPEC_INDEX_ALL;
            if ((st = bk->open(&every, sink)) != TD_OK)
                return st;
            gpus += !(bk->caps & TD_DEVICE_CAP_HOST_CORES);
        }
        if (!want_all && gpus == 0) {
            const td_backend_ops *host = fallback_backend();
            td_spec_item cpu = *item;
            if (!host)
                return td__error(TD_ERR_NO_DEVICE, "device spec item '%s': no CPU backend",
                                 item->text);
            snprintf(cpu.backend, sizeof cpu.backend, "%s", host->name);
            return host->open(&cpu, sink);
        }
        return TD_OK;
    }
    b = find_backend(item->backend);
    if (!b) {
        char here[1024];
        describe_all(here, sizeof here);
        return td__error(TD_ERR_NO_DEVICE,
                         "device spec item '%s': the %s backend is not built into this tandem. "
                         "Devices here: %s",
                         item->text, item->backend, here);
    }
    return open_backend_item(b, item, sink);
}

/* The parsed spec's items, opened in order. */
typedef struct spec_items {
    const td_spec_item *items;
    size_t n;
} spec_items;

static td_status open_items(void *arg, td_device_sink *sink) {
    const spec_items *si = arg;
    for (size_t i = 0; i < si->n; i++)
        TD_CHECK(open_item(&si->items[i], sink));
    return TD_OK;
}

td_status td_devices_open(const char *spec, td_device_list **out) {
    td_spec_item *items = NULL;
    spec_items si;
    td_status st;
    if (!out)
        return td__error(TD_ERR_INVALID_ARG, "td_devices_open: out is NULL");
    *out = NULL;
    TD_CHECK(td__spec_parse(spec, &items, &si.n));
    si.items = items;
    st = td__device_list_open(open_items, &si, out);
    free(items);
    return st;
}
