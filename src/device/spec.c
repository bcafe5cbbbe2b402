#include "device/spec.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/fpmode.h"

#define MAX_ITEMS 256

/* The names a spec item may start with, built in or not (a spec names a
 * backend this build lacks, and is told so when it is opened), and what each
 * takes after the name. This parser must know the grammar of backends that
 * are not built in, so it keeps it here rather than asking the backend
 * tables; TD_DEVICE_CAP_SUB_DEVICES says the same of the ones built in. */
enum {
    SPEC_SUB_INDEX = 1 << 0, /* "opencl:P.D" */
    SPEC_NO_INDEX = 1 << 1,  /* neither an index nor a count: "auto", "all" */
};
static const struct {
    const char *name;
    unsigned flags;
} known_backends[] = {
    {"cpu", 0},
    {"cuda", 0},
    {"opencl", SPEC_SUB_INDEX},
    {"auto", SPEC_NO_INDEX},
    {"all", SPEC_NO_INDEX},
};

/* A cursor over one item's text; every failure quotes the whole spec. */
typedef struct cursor {
    const char *spec;
    const char *p, *end;
} cursor;

static td_status fail_at(const cursor *c, const char *why) {
    return td__error(TD_ERR_PARSE, "device spec '%s': %s at offset %d", c->spec, why,
                     (int)(c->p - c->spec));
}

static int parse_uint(cursor *c, long max, long *out) {
    long v = 0;
    if (c->p >= c->end || !isdigit((unsigned char)*c->p))
        return -1;
    while (c->p < c->end && isdigit((unsigned char)*c->p)) {
        v = v * 10 + (*c->p - '0');
        if (v > max)
            return -1;
        c->p++;
    }
    *out = v;
    return 0;
}

int td__parse_bytes(const char *s, uint64_t *out) {
    char *end;
    double v;
    double scale = 1;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s)
        return -1;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        scale = 1024.0;
        end++;
        break;
    case 'M':
        scale = 1024.0 * 1024;
        end++;
        break;
    case 'G':
        scale = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 'T':
        scale = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default: break;
    }
    if (scale > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return -1;
    v *= scale;
    if (!(v >= 1) || v > 1.8e19)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static td_status parse_option(const cursor *c, const char *key, const char *value,
                              td_device_options *o) {
    char *end;
    if (!strcmp(key, "cores")) {
        long v = strtol(value, &end, 10);
        if (o->has_cores)
            return td__error(TD_ERR_PARSE, "device spec '%s': option 'cores' given twice", c->spec);
        if (*end || end == value || v < 1 || v > 4096)
            return td__error(TD_ERR_PARSE,
                             "device spec '%s': cores=%s is not a core count from 1 to 4096",
                             c->spec, value);
        o->has_cores = 1;
        o->cores = (int)v;
    } else if (!strcmp(key, "mem")) {
        if (o->has_mem)
            return td__error(TD_ERR_PARSE, "device spec '%s': option 'mem' given twice", c->spec);
        if (td__parse_bytes(value, &o->mem))
            return td__error(TD_ERR_PARSE,
                             "device spec '%s': mem=%s is not a size (examples: 512M, 2G, 65536)",
                             c->spec, value);
        o->has_mem = 1;
    } else if (!strcmp(key, "slowdown")) {
        double v = strtod(value, &end);
        if (o->has_slowdown)
            return td__error(TD_ERR_PARSE, "device spec '%s': option 'slowdown' given twice",
                             c->spec);
        if (*end || end == value || !(v >= 1.0 && v <= 1000.0))
            return td__error(TD_ERR_PARSE,
                             "device spec '%s': slowdown=%s is not a factor from 1 to 1000",
                             c->spec, value);
        o->has_slowdown = 1;
        o->slowdown = v;
    } else if (!strcmp(key, "latency")) {
        double v = strtod(value, &end);
        if (o->has_latency)
            return td__error(TD_ERR_PARSE, "device spec '%s': option 'latency' given twice",
                             c->spec);
        if (*end || end == value || !(v >= 0.0 && v <= 10000.0))
            return td__error(TD_ERR_PARSE,
                             "device spec '%s': latency=%s is not a time in milliseconds from 0 to "
                             "10000",
                             c->spec, value);
        o->has_latency = 1;
        o->latency_ms = v;
    } else if (!strcmp(key, "split")) {
        long v = strtol(value, &end, 10);
        if (o->has_split)
            return td__error(TD_ERR_PARSE, "device spec '%s': option 'split' given twice", c->spec);
        if (*end || end == value || v < 1 || v > 64)
            return td__error(TD_ERR_PARSE, "device spec '%s': split=%s is not a count from 1 to 64",
                             c->spec, value);
        o->has_split = 1;
        o->split = (int)v;
    } else if (!strcmp(key, "denormals")) {
        td__denormals d;
        if (o->has_denormals)
            return td__error(TD_ERR_PARSE, "device spec '%s': option 'denormals' given twice",
                             c->spec);
        if (td__denormals_parse(value, &d) != 0)
            return td__error(TD_ERR_PARSE,
                             "device spec '%s': denormals=%s is neither 'keep' nor 'flush'",
                             c->spec, value);
        o->has_denormals = 1;
        o->denormals = (int)d;
    } else {
        return td__error(TD_ERR_PARSE,
                         "device spec '%s': unknown option '%s' (known: cores, mem, slowdown, "
                         "latency, split, denormals)",
                         c->spec, key);
    }
    return TD_OK;
}

/* Parses "{k=v,k=v}" from c->p, which points at '{'. */
static td_status parse_options(cursor *c, td_device_options *o) {
    const char *close = memchr(c->p, '}', (size_t)(c->end - c->p));
    const char *q;
    if (!close)
        return fail_at(c, "'{' without '}'");
    q = c->p + 1;
    if (q == close)
        return fail_at(c, "empty option list '{}'");
    while (q < close) {
        char key[32], value[64];
        const char *comma = memchr(q, ',', (size_t)(close - q));
        const char *stop = comma ? comma : close;
        const char *eq = memchr(q, '=', (size_t)(stop - q));
        size_t klen, vlen;
        td_status st;
        c->p = q;
        if (!eq)
            return fail_at(c, "option without '=' (write key=value)");
        klen = (size_t)(eq - q);
        vlen = (size_t)(stop - eq - 1);
        if (klen == 0 || klen >= sizeof key)
            return fail_at(c, "empty or overlong option name");
        if (vlen == 0 || vlen >= sizeof value)
            return fail_at(c, "empty or overlong option value");
        memcpy(key, q, klen);
        key[klen] = '\0';
        memcpy(value, eq + 1, vlen);
        value[vlen] = '\0';
        if ((st = parse_option(c, key, value, o)) != TD_OK)
            return st;
        q = comma ? comma + 1 : close;
        if (comma && q == close) {
            c->p = q;
            return fail_at(c, "trailing ',' in options");
        }
    }
    c->p = close + 1;
    return TD_OK;
}

static td_status parse_item(cursor *c, td_spec_item *it) {
    size_t n = 0;
    long v;
    td_status st;
    size_t len = (size_t)(c->end - c->p);
    int known = 0;
    unsigned flags = 0;

    memset(it, 0, sizeof *it);
    it->count = 1;
    it->sub_index = -1;
    if (len == 0)
        return fail_at(c, "empty item");
    if (len >= sizeof it->text)
        return fail_at(c, "item too long");
    memcpy(it->text, c->p, len);

    while (c->p < c->end && isalpha((unsigned char)*c->p) && n + 1 < sizeof it->backend)
        it->backend[n++] = (char)tolower((unsigned char)*c->p++);
    if (n == 0)
        return fail_at(c, "expected a backend name (cpu, cuda, opencl, auto, all)");
    for (size_t i = 0; i < sizeof known_backends / sizeof *known_backends; i++) {
        if (!strcmp(it->backend, known_backends[i].name)) {
            known = 1;
            flags = known_backends[i].flags;
        }
    }
    if (!known)
        return td__error(
            TD_ERR_NO_DEVICE,
            "device spec '%s': unknown backend '%s' (known: cpu, cuda, opencl, auto, all)", c->spec,
            it->backend);

    if (c->p < c->end && *c->p == ':') {
        c->p++;
        if (c->p < c->end && *c->p == '*') {
            c->p++;
            it->index_kind = TD_SPEC_INDEX_ALL;
        } else {
            if (parse_uint(c, 1 << 20, &v))
                return fail_at(c, "expected a device index or '*' after ':'");
            it->index_kind = TD_SPEC_INDEX_ONE;
            it->index = (int)v;
            if (c->p < c->end && *c->p == '.') {
                c->p++;
                if (parse_uint(c, 1 << 20, &v))
                    return fail_at(c, "expected a device number after '.'");
                it->sub_index = (int)v;
            }
        }
    }
    if (c->p < c->end && *c->p == '*') {
        c->p++;
        if (it->index_kind != TD_SPEC_INDEX_NONE)
            return fail_at(c, "'*K' applies to a whole backend ('cpu*2'), not to one device");
        if (parse_uint(c, 4096, &v) || v < 1)
            return fail_at(c, "expected a device count from 1 to 4096 after '*'");
        it->count = (int)v;
    }
    if (c->p < c->end && *c->p == '{') {
        if ((st = parse_options(c, &it->opts)) != TD_OK)
            return st;
    }
    if (c->p != c->end)
        return fail_at(c, "unexpected character");
    if (it->sub_index >= 0 && !(flags & SPEC_SUB_INDEX))
        return td__error(TD_ERR_PARSE,
                         "device spec '%s': '%s' has a P.D index, which only opencl devices take",
                         c->spec, it->text);
    if ((flags & SPEC_NO_INDEX) && (it->index_kind != TD_SPEC_INDEX_NONE || it->count != 1))
        return td__error(TD_ERR_PARSE, "device spec '%s': '%s' takes no index or count", c->spec,
                         it->backend);
    return TD_OK;
}

/* Trims the whitespace around [*b, *e). */
static void trim(const char **b, const char **e) {
    while (*b < *e && isspace((unsigned char)**b))
        (*b)++;
    while (*e > *b && isspace((unsigned char)(*e)[-1]))
        (*e)--;
}

td_status td__spec_parse(const char *spec, td_spec_item **items, size_t *count) {
    td_spec_item *out = NULL;
    size_t n = 0;
    const char *p;
    td_status st;
    *items = NULL;
    *count = 0;
    if (!spec)
        return td__error(TD_ERR_INVALID_ARG, "device spec is NULL");
    out = td__calloc(sizeof *out * MAX_ITEMS, "device spec items");
    if (!out)
        return TD_ERR_OUT_OF_MEMORY;
    p = spec;
    for (;;) {
        /* An item ends at a comma outside braces. */
        const char *b = p, *e = p;
        int depth = 0;
        cursor c;
        while (*e && !(*e == ',' && depth == 0)) {
            if (*e == '{')
                depth++;
            else if (*e == '}')
                depth--;
            e++;
        }
        const char *stop = e;
        c.spec = spec;
        trim(&b, &e);
        c.p = b;
        c.end = e;
        if (n == MAX_ITEMS) {
            st = fail_at(&c, "too many items (at most 256)");
            goto fail;
        }
        if ((st = parse_item(&c, &out[n])) != TD_OK)
            goto fail;
        n++;
        if (!*stop)
            break;
        p = stop + 1;
    }
    *items = out;
    *count = n;
    return TD_OK;
fail:
    free(out);
    return st;
}
