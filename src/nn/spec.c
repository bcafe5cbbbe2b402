/* Reading a layer spec's fields, each checked; a message names the file,
 * the layer's place in the model and the field. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "nn/build-impl.h"

td_status td__spec_error(const build_ctx *b, const char *field, const char *what) {
    return td__error(TD_ERR_PARSE, "%s: %s.%s: %s", b->file, b->where, field, what);
}

td_status td__spec_int(const build_ctx *b, const char *key, int required, int64_t def, int64_t min,
                       int64_t max, int64_t *out) {
    json_t *v = json_object_get(b->spec, key);
    char msg[128];
    if (!v) {
        if (required)
            return td__spec_error(b, key, "missing (a required integer)");
        *out = def;
        return TD_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
        if (min == 1)
            snprintf(msg, sizeof msg, "expected a positive integer (at most %lld)", (long long)max);
        else
            snprintf(msg, sizeof msg, "expected an integer from %lld to %lld", (long long)min,
                     (long long)max);
        return td__spec_error(b, key, msg);
    }
    *out = json_integer_value(v);
    return TD_OK;
}

td_status td__spec_real(const build_ctx *b, const char *key, double def, double lo, double hi,
                        int hi_open, double *out) {
    json_t *v = json_object_get(b->spec, key);
    char msg[128];
    double x;
    if (!v) {
        *out = def;
        return TD_OK;
    }
    x = json_is_number(v) ? json_number_value(v) : NAN;
    if (!json_is_number(v) || !(x >= lo) || (hi_open ? !(x < hi) : !(x <= hi))) {
        snprintf(msg, sizeof msg, "expected a number in [%g, %g%s", lo, hi, hi_open ? ")" : "]");
        return td__spec_error(b, key, msg);
    }
    *out = x;
    return TD_OK;
}

td_status td__spec_bool(const build_ctx *b, const char *key, int def, int *out) {
    json_t *v = json_object_get(b->spec, key);
    if (!v) {
        *out = def;
        return TD_OK;
    }
    if (!json_is_boolean(v))
        return td__spec_error(b, key, "expected true or false");
    *out = json_is_true(v);
    return TD_OK;
}

td_status td__spec_keys(const build_ctx *b, const char *const *allowed) {
    const char *key;
    json_t *v;
    json_object_foreach(b->spec, key, v) {
        int ok = 0;
        (void)v;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = !strcmp(*a, key);
        if (!ok)
            return td__spec_error(b, key, "unknown field for this layer type");
    }
    return TD_OK;
}
