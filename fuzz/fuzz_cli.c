/* Fuzzes tandem train's option parser: the input, split at NUL bytes, is an
 * argv. Any argv must give 0 or 2 without a crash or a leak, and one that
 * parses must describe a run the trainer can start from (nothing runs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#define MAX_ARGS 64

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* What a parsed argv promises the trainer. */
static void check(const td_cli_train_args *a) {
    const td_train_config *c = &a->cfg;
    if (a->help)
        return;
    if (!c->data_path || (!c->model_path && !c->resume) || c->batch < 1 ||
        (c->epochs < 1 && c->steps < 1) || (c->devices && !*c->devices) || c->opt.lr < 0 ||
        (c->extend != TD_EXTEND_STRETCH && !c->resume))
        abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static FILE *quiet;
    char *text = malloc(size + 1), *argv[MAX_ARGS + 2];
    td_cli_train_args a;
    int argc = 0, rc;
    if (!text)
        return 0;
    if (!quiet && !(quiet = fopen("/dev/null", "w")))
        abort();
    memcpy(text, data, size);
    text[size] = '\0';
    argv[argc++] = "train";
    for (size_t at = 0; at < size && argc <= MAX_ARGS; at += strlen(text + at) + 1)
        argv[argc++] = text + at;
    argv[argc] = NULL;
    rc = td_cli_train_parse(argc, argv, quiet, &a);
    if (rc == 0)
        check(&a);
    else if (rc != 2)
        abort();
    free(text);
    return 0;
}
