/* tandem convert: weights from Hugging Face transformers (GPT-2 and the Llama
 * family) or llm.c (GPT-2) into a tandem checkpoint (the library's
 * td_import_*, include/tandem/import.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

static void usage(FILE *out) {
    fprintf(out, "usage: tandem convert --from hf|llmc|tandem SOURCE --out CKPT [options]\n\n"
                 "Converts a model into a tandem checkpoint (f32) that tandem generate, tandem\n"
                 "eval and tandem train --resume load; its model JSON is in the checkpoint. It\n"
                 "is a run at step 0: the optimizer's state is a fresh one's (zeros), so that\n"
                 "train --resume fine-tunes from the weights (with --lr and the like).\n\n"
                 "  --from hf DIR      a folder as transformers' save_pretrained writes it:\n"
                 "                     config.json and model.safetensors (or the shards of\n"
                 "                     model.safetensors.index.json): GPT2LMHeadModel,\n"
                 "                     LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM\n"
                 "  --from llmc FILE   llm.c's checkpoint (gpt2_124M.bin: version 3, f32)\n"
                 "  --from tandem CKPT a tandem checkpoint, with --quantize\n"
                 "  --out PATH         the checkpoint to write (safetensors)\n"
                 "  --optimizer NAME   adamw (default), sgd, or none: the weights only (a third\n"
                 "                     of the size with adamw; generate reads it, eval and\n"
                 "                     train --resume do not)\n"
                 "  --quantize W       bf16 or q8_0: the weight matrices in that format\n"
                 "                     (bf16 rounded to nearest even; q8_0 as llama.cpp's\n"
                 "                     blocks of 32 int8 values and an f16 scale), the\n"
                 "                     weights only; generate and eval read it\n"
                 "  --batch B          the batch a resumed run trains with (default 8)\n"
                 "  --seed S           its seed: data order and dropout (default 1)\n"
                 "  --help             show this help\n\n"
                 "Then: tandem generate --checkpoint CKPT --tokenizer DIR --prompt TEXT, with\n"
                 "DIR holding tokenizer.json (or GPT-2's vocab.json and merges.txt).\n");
}

static const struct option options[] = {
    {"from", required_argument, NULL, 'f'},
    {"out", required_argument, NULL, 'o'},
    {"optimizer", required_argument, NULL, 'p'},
    {"batch", required_argument, NULL, 'b'},
    {"seed", required_argument, NULL, 's'},
    {"quantize", required_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

typedef struct convert_args {
    const char *from, *source, *out;
    int help, weights_only;
    td_weights quantize; /* f32: none */
    td_train_state state;
} convert_args;

/* An integer option in [lo, hi] into *out; 0 after printing why not. */
static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    if (*s && !*end && !errno && *out >= lo && *out <= hi)
        return 1;
    fprintf(stderr, "tandem convert: --%s wants an integer from %lld to %lld, not '%s'\n", flag, lo,
            hi, s);
    return 0;
}

/* --optimizer: the kind and the defaults tandem train gives it. */
static int parse_optimizer(const char *s, convert_args *a) {
    td_optimizer_config init = TD_OPTIMIZER_CONFIG_INIT;
    a->state.opt = init;
    a->weights_only = !strcmp(s, "none");
    if (!strcmp(s, "adamw")) {
        a->state.opt.kind = TD_OPT_ADAMW;
        a->state.opt.lr = 0.001;
    } else if (strcmp(s, "sgd") != 0 && !a->weights_only) {
        fprintf(stderr, "tandem convert: --optimizer is adamw, sgd or none, not '%s'\n", s);
        return 0;
    }
    return 1;
}

/* Returns 0, or 2 after printing a usage error. */
static int parse_args(int argc, char **argv, convert_args *a) {
    int c;
    long long v;
    memset(a, 0, sizeof *a);
    parse_optimizer("adamw", a);
    a->state.batch = 8;
    a->state.seed = 1;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1) {
        switch (c) {
        case 'f': a->from = optarg; break;
        case 'o': a->out = optarg; break;
        case 'p':
            if (!parse_optimizer(optarg, a))
                return 2;
            break;
        case 'b':
            if (!parse_int("batch", optarg, 1, 1 << 24, &v))
                return 2;
            a->state.batch = v;
            break;
        case 's':
            if (!parse_int("seed", optarg, 0, 1LL << 53, &v))
                return 2;
            a->state.seed = (uint64_t)v;
            break;
        case 'q':
            if (strcmp(optarg, "bf16") != 0 && strcmp(optarg, "q8_0") != 0) {
                fprintf(stderr, "tandem convert: --quantize is bf16 or q8_0, not '%s'\n", optarg);
                return 2;
            }
            a->quantize = !strcmp(optarg, "bf16") ? TD_WEIGHTS_BF16 : TD_WEIGHTS_Q8_0;
            break;
        case 'h': a->help = 1; break;
        case ':': fprintf(stderr, "tandem convert: %s needs a value\n", argv[optind - 1]); return 2;
        default:
            fprintf(stderr, "tandem convert: unknown option '%s' (see tandem convert --help)\n",
                    argv[optind - 1]);
            return 2;
        }
    }
    if (a->help)
        return 0;
    if (optind < argc)
        a->source = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "tandem convert: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->from || (strcmp(a->from, "hf") != 0 && strcmp(a->from, "llmc") != 0 &&
                     strcmp(a->from, "tandem") != 0)) {
        fprintf(stderr, "tandem convert: --from is hf, llmc or tandem%s%s%s\n",
                a->from ? ", not '" : "", a->from ? a->from : "", a->from ? "'" : "");
        return 2;
    }
    if (!strcmp(a->from, "tandem") && a->quantize == TD_WEIGHTS_F32) {
        fprintf(stderr, "tandem convert: --from tandem converts with --quantize bf16|q8_0\n");
        return 2;
    }
    if (!a->source) {
        fprintf(stderr, "tandem convert: --from %s needs the %s to convert\n", a->from,
                !strcmp(a->from, "hf") ? "folder" : "file");
        return 2;
    }
    if (!a->out) {
        fprintf(stderr, "tandem convert: --out is required\n");
        return 2;
    }
    return 0;
}

/* What was converted, in one line. */
static void report(const convert_args *a, const td_hf_info *g) {
    printf("%s: %s, %lld blocks, %lld heads", a->source, g->arch, (long long)g->layers,
           (long long)g->heads);
    if (g->kv_heads != g->heads)
        printf(" on %lld key/value head%s", (long long)g->kv_heads, g->kv_heads == 1 ? "" : "s");
    printf(", %lld channels, context %lld, vocabulary %lld, %zu weights%s%s%s%s -> %s\n",
           (long long)g->channels, (long long)g->context, (long long)g->vocab, g->weights,
           g->tied ? " (head tied to the embedding)" : "", a->weights_only ? ", weights only" : "",
           a->quantize != TD_WEIGHTS_F32 ? ", matrices in " : "",
           a->quantize != TD_WEIGHTS_F32 ? td_weights_name(a->quantize) : "", a->out);
}

/* Writes the f32 checkpoint at path to out with its matrices in fmt,
 * weights only (out may be path). */
static td_status quantize(const char *path, const char *out, td_weights fmt) {
    td_device_list *devs = NULL;
    td_model *m = NULL;
    td_train_state state;
    td_status st = td_devices_open("cpu", &devs);
    if (st == TD_OK)
        st = td_checkpoint_load_model(path, td_device_list_get(devs, 0), &m, &state);
    if (st == TD_OK)
        st = td_checkpoint_save_weights(out, m, fmt, &state);
    td_model_destroy(m);
    td_device_list_destroy(devs);
    return st;
}

int td_cli_convert(int argc, char **argv) {
    convert_args a;
    td_hf_info info;
    td_gpt2_info g;
    const td_train_state *state;
    td_status st;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0 || a.help) {
        if (a.help)
            usage(stdout);
        return rc;
    }
    if (a.quantize != TD_WEIGHTS_F32)
        a.weights_only = 1; /* optimizer state stays f32 by nature: a compact file has none */
    state = a.weights_only ? NULL : &a.state;
    if (!strcmp(a.from, "tandem")) {
        if ((st = quantize(a.source, a.out, a.quantize)) != TD_OK)
            return td_cli_fail("convert", st);
        printf("%s -> %s: weight matrices in %s, weights only\n", a.source, a.out,
               td_weights_name(a.quantize));
        return 0;
    }
    if (!strcmp(a.from, "hf")) {
        st = td_import_hf(a.source, a.out, state, &info);
    } else {
        st = td_import_llmc_gpt2(a.source, a.out, state, &g);
        memset(&info, 0, sizeof info);
        info.arch = "GPT-2";
        info.context = g.context, info.vocab = g.vocab, info.layers = g.layers;
        info.heads = info.kv_heads = g.heads, info.channels = g.channels;
        info.tied = g.tied, info.weights = g.weights;
    }
    if (st == TD_OK && a.quantize != TD_WEIGHTS_F32)
        st = quantize(a.out, a.out, a.quantize);
    if (st != TD_OK)
        return td_cli_fail("convert", st);
    report(&a, &info);
    return 0;
}
