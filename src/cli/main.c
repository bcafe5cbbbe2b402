/* tandem: the command-line tool. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"devices", td_cli_devices, "list the devices here: memory, fp64, SIMD, peers"},
    {"train", td_cli_train, "train a model (JSON) on a data set; checkpoints, resume, metrics"},
    {"eval", td_cli_eval, "a checkpoint's loss and accuracy on a data set"},
    {"generate", td_cli_generate, "text from a checkpoint (GPT, Llama), streamed"},
    {"bench", td_cli_bench, "benchmarks: 'bench devices' GFLOP/s and GB/s, 'bench collectives'"},
    {"plot", td_cli_plot, "draw a metrics file (tandem train --metrics) as an SVG"},
    {"convert", td_cli_convert,
     "GPT-2 and Llama-family weights (Hugging Face, llm.c) into a "
     "tandem checkpoint"},
    {"tokenize", td_cli_tokenize,
     "the token ids a tokenizer (tokenizer.json, GPT-2's) gives a text"},
};

static void usage(FILE *out) {
    fprintf(out, "usage: tandem <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n'tandem <command> --help' describes a command's options.\n");
}

int td_cli_fail(const char *what, int status) {
    char detail[4096];
    td_cli_message_flags(td_last_error(), td_last_error_setting(), detail, sizeof detail);
    fprintf(stderr, "tandem: %s: %s%s%s\n", what, td_status_str((td_status)status),
            *detail ? ": " : "", detail);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tandem %s\n", TD_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            int rc = commands[i].run(argc - 1, argv + 1);
            /* Under mpirun the other processes may be waiting for this one
             * in a collective: end them now rather than at their timeout. */
            if (rc != 0)
                td_comm_mpi_abort(rc);
            return rc;
        }
    fprintf(stderr, "tandem: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
