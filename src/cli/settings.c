/* The library's settings as tandem's flags.
 *
 * The library names a setting as its C API does, between backquotes
 * (`dtype`, `test_path`), and records the one a failure is about
 * (td_last_error_setting()), because a program that embeds it has no flags.
 * This table is the one place that knows which flag sets each setting, for
 * every command: td_cli_fail() prints a library message with each setting it
 * knows replaced by its flag, so that "cpu:1 has no f64 arithmetic (`dtype`
 * f64)" reaches the user as "... (--precision f64)". */
#include <string.h>

#include "cli.h"

typedef struct setting_flag {
    const char *setting; /* td_train_config's field, td_data_options', ... */
    const char *flag;
} setting_flag;

static const setting_flag flags[] = {
    {"model_path", "--model"},
    {"data_path", "--data"},
    {"test_data_path", "--test-data"},
    {"test_path", "--test-data"}, /* td_data_options' name for it */
    {"split", "--split"},
    {"label_column", "--label-column"},
    {"epochs", "--epochs"},
    {"steps", "--steps"},
    {"batch", "--batch"},
    {"opt.kind", "--optimizer"},
    {"opt.lr", "--lr"},
    {"opt.momentum", "--momentum"},
    {"opt.nesterov", "--nesterov"},
    {"opt.weight_decay", "--weight-decay"},
    {"opt.schedule", "--schedule"},
    {"opt.warmup_steps", "--warmup"},
    {"opt.min_lr", "--min-lr"},
    {"opt.clip_norm", "--clip"},
    {"dtype", "--precision"},
    {"precision", "--precision"},
    {"devices", "--devices"},
    {"strategy", "--strategy"},
    {"deterministic", "--deterministic"},
    {"zero", "--zero"},
    {"bucket_bytes", "--bucket-bytes"},
    {"overlap", "--overlap"},
    {"micro_batches", "--micro-batches"},
    {"seed", "--seed"},
    {"checkpoint", "--checkpoint"},
    {"checkpoint_every", "--checkpoint-every"},
    {"resume", "--resume"},
    {"replan", "--replan"},
    {"extend", "--extend"},
    {"metrics", "--metrics"},
    {"trace_path", "--trace"},
    {"trace_first", "--trace-steps"}, /* one flag, FIRST:LAST, sets both */
    {"trace_last", "--trace-steps"},
    {"max_seconds", "--max-seconds"},
    {"eval_samples", "--eval-samples"},
    {"eval_every", "--eval-every"},
    {"tokens", "--tokens"},
    {"temperature", "--temperature"},
    {"top_k", "--top-k"},
    {"top_p", "--top-p"},
};

static const char *flag_of(const char *setting, size_t len) {
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++)
        if (strlen(flags[i].setting) == len && !strncmp(flags[i].setting, setting, len))
            return flags[i].flag;
    return NULL;
}

/* The flag that sets a setting ("dtype": "--precision"); NULL for NULL or
 * a setting no flag sets. */
static const char *setting_flag_of(const char *setting) {
    return setting ? flag_of(setting, strlen(setting)) : NULL;
}

/* Appends n bytes of s to out[*used..size), cutting at the end. */
static void put(char *out, size_t size, size_t *used, const char *s, size_t n) {
    if (*used + n >= size)
        n = size - 1 - *used;
    memcpy(out + *used, s, n);
    *used += n;
    out[*used] = '\0';
}

void td_cli_message_flags(const char *msg, const char *setting, char *out, size_t size) {
    const char *own = setting_flag_of(setting); /* NULL once the message names it */
    size_t used = 0;
    if (size == 0)
        return;
    out[0] = '\0';
    while (*msg) {
        const char *open = strchr(msg, '`');
        const char *close = open ? strchr(open + 1, '`') : NULL;
        const char *flag = close ? flag_of(open + 1, (size_t)(close - open - 1)) : NULL;
        if (!flag) {
            size_t n = close ? (size_t)(close + 1 - msg) : strlen(msg);
            put(out, size, &used, msg, n);
            msg += n;
            continue;
        }
        put(out, size, &used, msg, (size_t)(open - msg));
        put(out, size, &used, flag, strlen(flag));
        if (own && !strcmp(flag, own))
            own = NULL;
        msg = close + 1;
    }
    /* A message that does not name its setting still says which flag. */
    if (own) {
        put(out, size, &used, " (", 2);
        put(out, size, &used, own, strlen(own));
        put(out, size, &used, ")", 1);
    }
}
