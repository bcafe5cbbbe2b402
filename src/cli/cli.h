/* The tandem command: one function per subcommand. */
#ifndef TD_CLI_H
#define TD_CLI_H

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

/* tandem train's options, parsed (train_args.c). */
typedef struct td_cli_train_args {
    td_train_config cfg; /* its strings point into the argv parsed */
    int summary;         /* --summary */
    int quiet;           /* --quiet */
    int monitor;         /* --monitor: the devices' live view (monitor.h) */
    int help;            /* --help: print td_cli_train_usage() and run nothing */
    int epochs_given;    /* --epochs (else --steps alone decides) */
    int extend_given;    /* --extend (which needs --resume) */
} td_cli_train_args;

/* Parses tandem train's argv (argv[0] the command's name; argv may be
 * permuted) into *out without opening or running anything. Returns 0, or
 * 2 (a usage error) after printing why to err. */
int td_cli_train_parse(int argc, char **argv, FILE *err, td_cli_train_args *out);
/* tandem train --help. */
void td_cli_train_usage(FILE *out);

/* Prints "tandem: <what>: <status name>: <detail>" to stderr and returns 1. */
int td_cli_fail(const char *what, int status);

#endif
