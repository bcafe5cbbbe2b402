/* tandem tokenize: the ids a tokenizer gives a text (td_bpe_*,
 * include/tandem/tokenizer.h), to compare with one's own tools. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

static void usage(FILE *out) {
    fprintf(out, "usage: tandem tokenize --tokenizer DIR --text TEXT [--no-special]\n\n"
                 "Prints the token ids of TEXT, space-separated on one line, as tokenizers'\n"
                 "encode(TEXT).ids gives them (with the special tokens its post-processor puts\n"
                 "around a text, Llama's BOS say).\n\n"
                 "  --tokenizer DIR  tokenizer.json (and tokenizer_config.json), or GPT-2's\n"
                 "                   vocab.json and merges.txt, in DIR\n"
                 "  --text TEXT      the text\n"
                 "  --no-special     without those special tokens (add_special_tokens=False)\n"
                 "  --help           show this help\n");
}

static const struct option options[] = {
    {"tokenizer", required_argument, NULL, 't'},
    {"text", required_argument, NULL, 'x'},
    {"no-special", no_argument, NULL, 'n'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

int td_cli_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    int c, plain = 0;
    td_bpe *bpe = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    td_status st;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case 't': dir = optarg; break;
        case 'x': text = optarg; break;
        case 'n': plain = 1; break;
        case 'h': usage(stdout); return 0;
        case ':':
            fprintf(stderr, "tandem tokenize: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "tandem tokenize: unknown option '%s' (see tandem tokenize --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (optind < argc || !dir || !text) {
        fprintf(stderr, "tandem tokenize: %s\n",
                optind < argc ? "unexpected argument" : "--tokenizer and --text are required");
        return 2;
    }
    if ((st = td_bpe_load(dir, &bpe)) != TD_OK)
        return td_cli_fail("tokenize", st);
    st = plain ? td_bpe_encode(bpe, text, strlen(text), &ids, &n)
               : td_bpe_encode_special(bpe, text, strlen(text), &ids, &n);
    td_bpe_destroy(bpe);
    if (st != TD_OK)
        return td_cli_fail("tokenize", st);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? " " : "", ids[i]);
    putchar('\n');
    free(ids);
    return 0;
}
