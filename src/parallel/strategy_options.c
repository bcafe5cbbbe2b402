/* A strategy's own options: "key=value" items, comma-separated
 * ("zero=1,overlap=on"), each key one of its table's options. The
 * dispatcher checks every key when the strategy is created; the strategy
 * reads the values it knows with the typed readers here, whose messages
 * name the strategy, the option (between backquotes, so the CLI shows its
 * flag) and what it wants. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/strategy-impl.h"

/* Item i of text ("key=value"): *key and *value point into text with their
 * lengths; 0 past the last item. */
static int item(const char *text, int i, const char **key, size_t *klen, const char **value,
                size_t *vlen) {
    const char *at = text ? text : "";
    for (int k = 0; k < i && at; k++)
        at = strchr(at, ',') ? strchr(at, ',') + 1 : NULL;
    if (!at || !*at)
        return 0;
    size_t len = strchr(at, ',') ? (size_t)(strchr(at, ',') - at) : strlen(at);
    const char *eq = memchr(at, '=', len);
    *key = at;
    *klen = eq ? (size_t)(eq - at) : len;
    *value = eq ? eq + 1 : at + len;
    *vlen = eq ? len - *klen - 1 : 0;
    return 1;
}

static const td_strategy_option *find_option(const td_strategy_ops *ops, const char *key,
                                             size_t len) {
    for (const td_strategy_option *o = ops->options; o && o->name; o++)
        if (strlen(o->name) == len && !strncmp(o->name, key, len))
            return o;
    return NULL;
}

/* "`zero`, `overlap`" into buf, or "none". */
static const char *option_list(const td_strategy_ops *ops, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (const td_strategy_option *o = ops->options; o && o->name && used < n; o++)
        used += (size_t)snprintf(buf + used, n - used, "%s`%s`", used ? ", " : "", o->name);
    return buf[0] ? buf : "none";
}

td_status td__strategy_check_options(const td_strategy_ops *ops, const char *options) {
    const char *key, *value;
    size_t klen, vlen;
    char list[256];
    for (int i = 0; item(options, i, &key, &klen, &value, &vlen); i++) {
        if (!find_option(ops, key, klen))
            return td__error_setting(TD_ERR_INVALID_ARG, "strategy",
                                     "%s has no option `%.*s` (its options: %s)", ops->name,
                                     (int)klen, key, option_list(ops, list, sizeof list));
        if (value == key + klen)
            return td__error_setting(
                TD_ERR_INVALID_ARG, "strategy", "%s: option `%.*s` wants a value (%.*s=%s)",
                ops->name, (int)klen, key, (int)klen, key, find_option(ops, key, klen)->values);
    }
    return TD_OK;
}

const char *td__strategy_option(const td_strategy *s, const char *name, char *buf, size_t n) {
    const char *key, *value, *found = NULL;
    size_t klen, vlen, flen = 0;
    assert(find_option(s->ops, name, strlen(name)));
    for (int i = 0; item(s->cfg.options, i, &key, &klen, &value, &vlen); i++)
        if (klen == strlen(name) && !strncmp(key, name, klen)) {
            found = value; /* the last one given wins */
            flen = vlen;
        }
    if (!found)
        return NULL;
    snprintf(buf, n, "%.*s", (int)flen, found);
    return buf;
}

/* The refusal of value v for option `name`, which wants `wants`. */
static td_status bad_value(const td_strategy *s, const char *name, const char *v,
                           const char *wants) {
    return td__error_setting(TD_ERR_INVALID_ARG, name, "%s: `%s` wants %s, not '%s'", s->ops->name,
                             name, wants, v);
}

td_status td__option_choice(const td_strategy *s, const char *name, const char *const *choices,
                            int *index) {
    char v[64], wants[128];
    size_t used = 0;
    if (!td__strategy_option(s, name, v, sizeof v))
        return TD_OK;
    for (int i = 0; choices[i]; i++)
        if (!strcmp(v, choices[i])) {
            *index = i;
            return TD_OK;
        }
    wants[0] = '\0';
    for (int i = 0; choices[i] && used < sizeof wants; i++)
        used += (size_t)snprintf(wants + used, sizeof wants - used, "%s%s", i ? " or " : "",
                                 choices[i]);
    return bad_value(s, name, v, wants);
}

td_status td__option_flag(const td_strategy *s, const char *name, int *on) {
    static const char *const words[] = {"0", "1", "off", "on", "no", "yes", NULL};
    int i = -1;
    TD_CHECK(td__option_choice(s, name, words, &i));
    if (i >= 0)
        *on = i % 2;
    return TD_OK;
}

td_status td__option_count(const td_strategy *s, const char *name, int64_t least, int64_t *out) {
    char v[64], *end, wants[64];
    long long x;
    if (!td__strategy_option(s, name, v, sizeof v))
        return TD_OK;
    errno = 0;
    x = strtoll(v, &end, 10);
    if (!v[0] || *end || errno || x < least) {
        snprintf(wants, sizeof wants, "a whole number of at least %lld", (long long)least);
        return bad_value(s, name, v, wants);
    }
    *out = x;
    return TD_OK;
}
