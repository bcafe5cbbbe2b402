/* The tandem command: one function per subcommand. */
#ifndef TD_CLI_H
#define TD_CLI_H

/* Each returns the process exit status: 0 on success, 1 on failure (with the
 * message printed), 2 on a usage error. */
int td_cli_devices(int argc, char **argv);
int td_cli_train(int argc, char **argv);
int td_cli_eval(int argc, char **argv);
int td_cli_bench(int argc, char **argv);

/* Prints "tandem: <what>: <status name>: <detail>" to stderr and returns 1. */
int td_cli_fail(const char *what, int status);

#endif
