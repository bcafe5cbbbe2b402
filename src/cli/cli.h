/* The tandem command: one function per subcommand. */
#ifndef TD_CLI_H
#define TD_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "tandem/train.h"

/* Each returns the process exit status: 0 on success, 1 on failure (with the
 * message printed), 2 on a usage error. */
int td_cli_devices(int argc, char **argv);
int td_cli_train(int argc, char **argv);
int td_cli_eval(int argc, char **argv);
int td_cli_bench(int argc, char **argv);
int td_cli_generate(int argc, char **argv);
int td_cli_plot(int argc, char **argv);
int td_cli_convert(int argc, char **argv);
int td_cli_tokenize(int argc, char **argv);

/* tandem train's options, parsed (train_args.c). */
typedef struct td_cli_train_args {
    td_train_config cfg; /* its strings point into the argv parsed */
    int summary;         /* --summary */
    int quiet;           /* --quiet */
    int monitor;         /* --monitor: the devices' live view (monitor.h) */
    int help;            /* --help: print td_cli_train_usage() and run nothing */
    int epochs_given;    /* --epochs (else --steps alone decides) */
    int extend_given;    /* --extend (which needs --resume) */
    /* cfg.strategy_options: what --zero, --overlap, --deterministic,
     * --bucket-bytes and --micro-batches spell, "key=value" comma-separated */
    char strategy_options[256];
} td_cli_train_args;

/* Parses tandem train's argv (argv[0] the command's name; argv may be
 * permuted) into *out without opening or running anything. Returns 0, or
 * 2 (a usage error) after printing why to err. */
int td_cli_train_parse(int argc, char **argv, FILE *err, td_cli_train_args *out);
/* tandem train --help. */
void td_cli_train_usage(FILE *out);

/* A byte size as options take it (bytes.c): digits, a fraction allowed, then
 * an optional K, M, G or T (binary: 1024), an optional i and an optional B:
 * "4096", "4K", "256MiB", "1.5G". Returns 0 with *out, or -1 (*out untouched)
 * for anything else or a size under 1 byte. */
int td_cli_parse_bytes(const char *s, uint64_t *out);
/* "512 B", "23.5 GiB": n bytes for people, into buf (32 bytes); returns buf. */
const char *td_cli_format_bytes(double n, char buf[32]);

/* Evaluates a call returning td_status and jumps to `fail` on failure, with
 * the status kept in `st`: one cleanup path, as in the library (whose own
 * macro is internal). */
#define TD_CLI_TRY(call)                                                                           \
    do {                                                                                           \
        if ((st = (call)) != TD_OK)                                                                \
            goto fail;                                                                             \
    } while (0)

/* Evaluates a call returning td_status and returns its failure at once: for
 * functions with nothing to release on the way out. */
#define TD_CLI_CHECK(call)                                                                         \
    do {                                                                                           \
        td_status st_ = (call);                                                                    \
        if (st_ != TD_OK)                                                                          \
            return st_;                                                                            \
    } while (0)

/* Prints "tandem: <what>: <status name>: <detail>" to stderr and returns 1;
 * the detail is td_last_error() in the flags' words (td_cli_message_flags). */
int td_cli_fail(const char *what, int status);

/* A library message for tandem's user, into out (cut at size): each setting
 * it names between backquotes that a flag sets becomes that flag, and when
 * it does not name `setting` (the one the failure is about, or NULL), that
 * setting's flag follows in parentheses (settings.c). */
void td_cli_message_flags(const char *msg, const char *setting, char *out, size_t size);

#endif
