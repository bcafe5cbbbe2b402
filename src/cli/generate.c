/* tandem generate: text from a token model's checkpoint, printed as it is
 * made: bytes as tokens, or GPT-2's BPE with --tokenizer. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tandem/tandem.h"

/* Each byte is a token, as tandem train reads text for a 256-token model. */
#define BYTE_TOKENS 256
/* A prompt file longer than this is refused: only the last context counts. */
#define PROMPT_MAX_BYTES ((size_t)64 << 20)

static void usage(FILE *out) {
    fprintf(out, "usage: tandem generate --checkpoint CKPT (--prompt TEXT | --prompt-file F) "
                 "[options]\n\n"
                 "Loads the token model saved in CKPT (by tandem train on a text file, with a\n"
                 "vocabulary of 256: each byte a token) and prints the prompt and N more bytes,\n"
                 "each as soon as it is chosen. Each token costs one position's forward: every\n"
                 "attention layer keeps its keys and values. When the model's context is full,\n"
                 "its last half is run again from position 0 and generation goes on.\n\n"
                 "With --tokenizer, the prompt is encoded and the tokens decoded with the BPE\n"
                 "tokenizer in DIR instead (a checkpoint made by tandem convert, say); its\n"
                 "end-of-sequence token, when it names one, ends the text.\n\n"
                 "  --checkpoint PATH   a tandem checkpoint (safetensors)\n"
                 "  --tokenizer DIR     tokenizer.json (Llama, Qwen2, Mistral), or GPT-2's\n"
                 "                      vocab.json and merges.txt, in DIR (default: each byte\n"
                 "                      a token)\n"
                 "  --prompt TEXT       the text to continue\n"
                 "  --prompt-file F     the text to continue, from a file\n"
                 "  --tokens N          bytes (tokens) to generate (default 200, at most\n"
                 "                      1000000)\n"
                 "  --temperature T     divides the logits; 0 is greedy (default 1)\n"
                 "  --top-k K           sample among the K likeliest bytes (default 0: all)\n"
                 "  --top-p P           then among the fewest whose probability reaches P\n"
                 "                      (default 1: all)\n"
                 "  --seed S            the same seed gives the same text (default 0)\n"
                 "  --devices SPEC      the devices (default cpu); several with tensor\n"
                 "  --strategy S        single: the first device does it all (default);\n"
                 "                      tensor: each device holds some heads and hidden\n"
                 "                      features of every layer and its part of the cache;\n"
                 "                      pipeline: each device holds consecutive layers (for\n"
                 "                      a model bigger than one device); pipeline:P,tensor:N:\n"
                 "                      P stages of N devices, each stage split as tensor\n"
                 "  --precision P       f32 or f64 (default: the checkpoint's)\n"
                 "  --weights W         f32, bf16 or q8_0: the weight matrices rounded to W\n"
                 "                      and read in it by the decoder (default: the\n"
                 "                      checkpoint's; tandem convert --quantize writes one)\n"
                 "  --kv-cache K        f32 (default), f16 or bf16: the keys and values kept,\n"
                 "                      each layer's in half the bytes (an f32 model)\n"
                 "  --summary           after the text, a line 'summary: {json}' with the\n"
                 "                      token counts and timings\n"
                 "  --help              show this help\n");
}

enum {
    OPT_PROMPT_FILE = 256,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_PRECISION,
    OPT_SUMMARY,
    OPT_TOKENIZER,
    OPT_WEIGHTS,
    OPT_KV_CACHE,
};

static const struct option options[] = {
    {"checkpoint", required_argument, NULL, 'c'},
    {"prompt", required_argument, NULL, 'p'},
    {"prompt-file", required_argument, NULL, OPT_PROMPT_FILE},
    {"tokens", required_argument, NULL, 'n'},
    {"temperature", required_argument, NULL, 't'},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"seed", required_argument, NULL, 's'},
    {"devices", required_argument, NULL, 'D'},
    {"strategy", required_argument, NULL, 'S'},
    {"precision", required_argument, NULL, OPT_PRECISION},
    {"weights", required_argument, NULL, OPT_WEIGHTS},
    {"kv-cache", required_argument, NULL, OPT_KV_CACHE},
    {"summary", no_argument, NULL, OPT_SUMMARY},
    {"tokenizer", required_argument, NULL, OPT_TOKENIZER},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

typedef struct gen_args {
    const char *ckpt, *prompt, *prompt_file, *devices, *strategy, *tokenizer;
    int precision; /* -1: the checkpoint's */
    int weights;   /* a td_weights; -1: the checkpoint's */
    int kv_cache;  /* a td_kv_cache */
    int summary, help;
    td_generate_config cfg;
} gen_args;

static int parse_int(const char *flag, const char *s, long long lo, long long *out) {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo) {
        fprintf(stderr, "tandem generate: --%s wants an integer >= %lld, not '%s'\n", flag, lo, s);
        return 0;
    }
    if (!strcmp(flag, "tokens") && v > TD_GENERATE_MAX_TOKENS) {
        fprintf(stderr,
                "tandem generate: --tokens wants at most %lld, not '%s' (past the model's "
                "context the window slides and generation goes on; run again for more)\n",
                (long long)TD_GENERATE_MAX_TOKENS, s);
        return 0;
    }
    *out = v;
    return 1;
}

static int parse_real(const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    double v = strtod(s, &end);
    if (!*s || *end || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "tandem generate: --%s wants a number in [%g, %g], not '%s'\n", flag, lo,
                hi, s);
        return 0;
    }
    *out = v;
    return 1;
}

/* --kv-cache's names, by td_kv_cache. */
static const char *const kv_names[] = {"f32", "f16", "bf16"};

/* One option into *a; 0 after printing why it is wrong. */
static int take_option(int c, char **argv, gen_args *a) {
    long long v;
    switch (c) {
    case 'c': a->ckpt = optarg; return 1;
    case 'p': a->prompt = optarg; return 1;
    case OPT_PROMPT_FILE: a->prompt_file = optarg; return 1;
    case 'D': a->devices = optarg; return 1;
    case 'S': a->strategy = optarg; return 1;
    case OPT_SUMMARY: a->summary = 1; return 1;
    case OPT_TOKENIZER: a->tokenizer = optarg; return 1;
    case 'h': a->help = 1; return 1;
    case 'n': return parse_int("tokens", optarg, 0, &v) ? (a->cfg.tokens = v, 1) : 0;
    case OPT_TOP_K: return parse_int("top-k", optarg, 0, &v) ? (a->cfg.top_k = v, 1) : 0;
    case 's': return parse_int("seed", optarg, 0, &v) ? (a->cfg.seed = (uint64_t)v, 1) : 0;
    case 't': return parse_real("temperature", optarg, 0, 1e6, &a->cfg.temperature);
    case OPT_TOP_P:
        if (!parse_real("top-p", optarg, 0, 1, &a->cfg.top_p))
            return 0;
        if (a->cfg.top_p > 0)
            return 1;
        fprintf(stderr, "tandem generate: --top-p must be above 0\n");
        return 0;
    case OPT_PRECISION:
        if (!strcmp(optarg, "f32") || !strcmp(optarg, "f64")) {
            a->precision = !strcmp(optarg, "f64") ? TD_F64 : TD_F32;
            return 1;
        }
        fprintf(stderr, "tandem generate: --precision is f32 or f64, not '%s'\n", optarg);
        return 0;
    case OPT_WEIGHTS:
        for (int w = TD_WEIGHTS_F32; w <= TD_WEIGHTS_Q8_0; w++)
            if (!strcmp(optarg, td_weights_name((td_weights)w)))
                return a->weights = w, 1;
        fprintf(stderr, "tandem generate: --weights is f32, bf16 or q8_0, not '%s'\n", optarg);
        return 0;
    case OPT_KV_CACHE:
        for (int k = 0; k < 3; k++)
            if (!strcmp(optarg, kv_names[k]))
                return a->kv_cache = k, 1;
        fprintf(stderr, "tandem generate: --kv-cache is f32, f16 or bf16, not '%s'\n", optarg);
        return 0;
    case ':': fprintf(stderr, "tandem generate: %s needs a value\n", argv[optind - 1]); return 0;
    default:
        fprintf(stderr, "tandem generate: unknown option '%s' (see tandem generate --help)\n",
                argv[optind - 1]);
        return 0;
    }
}

/* Returns 0, or 2 after printing a usage error. */
static int parse_args(int argc, char **argv, gen_args *a) {
    td_generate_config init = TD_GENERATE_CONFIG_INIT;
    int c;
    memset(a, 0, sizeof *a);
    a->cfg = init;
    a->cfg.tokens = 200;
    a->cfg.token_limit = BYTE_TOKENS;
    a->devices = "cpu";
    a->strategy = NULL; /* the strategy table's default */
    a->precision = -1;
    a->weights = -1;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", options, NULL)) != -1)
        if (!take_option(c, argv, a))
            return 2;
    if (a->help)
        return 0;
    if (optind < argc) {
        fprintf(stderr, "tandem generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a->ckpt) {
        fprintf(stderr, "tandem generate: --checkpoint is required\n");
        return 2;
    }
    if (!a->prompt == !a->prompt_file) {
        fprintf(stderr, "tandem generate: give one of --prompt and --prompt-file\n");
        return 2;
    }
    if (a->prompt && !*a->prompt) {
        fprintf(stderr, "tandem generate: --prompt is empty; the model needs a byte to start "
                        "from\n");
        return 2;
    }
    return 0;
}

/* The prompt's bytes (malloc'ed) into *out, *n of them; 1 on failure
 * (printed). */
static int read_prompt(const gen_args *a, unsigned char **out, size_t *n) {
    FILE *f;
    long len;
    if (a->prompt) {
        *n = strlen(a->prompt);
        *out = malloc(*n);
        if (*out)
            memcpy(*out, a->prompt, *n);
        return *out ? 0 : (fprintf(stderr, "tandem generate: out of memory\n"), 1);
    }
    if (!(f = fopen(a->prompt_file, "rb"))) {
        fprintf(stderr, "tandem generate: %s: cannot open (--prompt-file): %s\n", a->prompt_file,
                strerror(errno));
        return 1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        (size_t)len > PROMPT_MAX_BYTES || len == 0 || !(*out = malloc((size_t)len)) ||
        fread(*out, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr,
                "tandem generate: %s: cannot read it, or it is empty or over %zu bytes "
                "(--prompt-file)\n",
                a->prompt_file, PROMPT_MAX_BYTES);
        fclose(f);
        return 1;
    }
    fclose(f);
    *n = (size_t)len;
    return 0;
}

/* A checkpoint generate can read tokens with: a token model of 256 tokens or
 * more for bytes, of at least the tokenizer's for BPE (bpe not NULL). 0, or
 * 1 after printing why not. */
static int check_model_kind(const char *ckpt, const char *json, const td_bpe *bpe) {
    td_model_info info;
    td_status st = td_model_describe(json, ckpt, &info, NULL, 0);
    if (st != TD_OK)
        return td_cli_fail("generate", st);
    if (info.kind != TD_INPUT_TOKENS) {
        fprintf(stderr,
                "tandem generate: %s: the model reads features (images), not tokens; "
                "generate needs a token model such as examples/gpt_tiny.json\n",
                ckpt);
        return 1;
    }
    if (bpe && info.classes < td_bpe_vocab_size(bpe)) {
        fprintf(stderr,
                "tandem generate: %s: the model's vocabulary is %lld tokens; the tokenizer "
                "(--tokenizer) has %lld, so they are not each other's\n",
                ckpt, (long long)info.classes, (long long)td_bpe_vocab_size(bpe));
        return 1;
    }
    if (!bpe && info.classes < BYTE_TOKENS) {
        fprintf(stderr,
                "tandem generate: %s: the model's vocabulary is %lld characters of its "
                "training text, not the 256 bytes generate reads and writes; train with a "
                "vocabulary of 256\n",
                ckpt, (long long)info.classes);
        return 1;
    }
    return 0;
}

/* Prints a token's bytes: itself, or its BPE text when arg is a td_bpe;
 * the tokenizer's end-of-sequence token is not printed and stops the text. */
static int print_token(void *arg, int32_t token) {
    size_t n = 0;
    const char *s = arg ? td_bpe_token_bytes(arg, token, &n) : NULL;
    if (arg && token == td_bpe_eos(arg))
        return 1;
    if (arg)
        fwrite(s, 1, s ? n : 0, stdout);
    else
        putchar(token);
    fflush(stdout);
    return 0;
}

/* The prompt's tokens (malloc'ed) into *out and *count: its bytes, or its
 * BPE encoding with the tokenizer's special tokens (Llama's BOS). 0, or 1
 * after printing why not. */
static int prompt_tokens(const td_bpe *bpe, const unsigned char *prompt, size_t n, int32_t **out,
                         size_t *count) {
    td_status st;
    if (bpe) {
        if ((st = td_bpe_encode_special(bpe, (const char *)prompt, n, out, count)) != TD_OK)
            return td_cli_fail("generate", st);
        return 0;
    }
    if (!(*out = malloc(n * sizeof **out))) {
        fprintf(stderr, "tandem generate: out of memory for the prompt\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        (*out)[i] = prompt[i];
    *count = n;
    return 0;
}

/* The group's device names as a JSON array. */
static json_t *device_names(td_group *g) {
    json_t *a = json_array();
    for (int k = 0; a && k < td_group_size(g); k++)
        json_array_append_new(a, json_string(td_device_name(td_group_device(g, k))));
    return a;
}

/* The weights the decoders read, and on the first device the kernels that
 * read compact ones, into the summary. */
static void add_weights(json_t *o, const gen_args *a, td_group *g) {
    td_weights w = TD_WEIGHTS_F32;
    td_device_info info;
    if (a->weights >= 0)
        w = (td_weights)a->weights;
    else if (td_checkpoint_read_weights(a->ckpt, &w) != TD_OK)
        w = TD_WEIGHTS_F32;
    json_object_set_new(o, "weights", json_string(td_weights_name(w)));
    json_object_set_new(o, "kv_cache", json_string(kv_names[a->kv_cache]));
    if (w != TD_WEIGHTS_F32 && td_device_get_info(td_group_device(g, 0), &info) == TD_OK)
        json_object_set_new(o, "kernels", json_string(info.compact_kernels));
}

static void print_summary(const gen_args *a, td_group *g, td_dtype dtype, td_decoder *d,
                          const td_generate_stats *s) {
    double per = s->generated_tokens ? s->decode_ms / (double)s->generated_tokens : 0;
    td_strategy_about about;
    const char *strategy = td_strategy_about_get(a->strategy, &about) == TD_OK ? about.name : "";
    json_t *o = json_pack(
        "{s:I, s:I, s:I, s:f, s:f, s:f, s:o, s:s, s:s, s:I, s:f, s:I, s:f, s:I}", "prompt_tokens",
        (json_int_t)s->prompt_tokens, "generated_tokens", (json_int_t)s->generated_tokens, "slides",
        (json_int_t)s->slides, "prefill_ms", s->prefill_ms, "decode_ms_per_token", per,
        "tokens_per_s", s->decode_ms > 0 ? 1e3 * (double)s->generated_tokens / s->decode_ms : 0.0,
        "devices", device_names(g), "strategy", strategy, "precision", td_dtype_name(dtype),
        "context", (json_int_t)td_decoder_context(d), "temperature", a->cfg.temperature, "top_k",
        (json_int_t)a->cfg.top_k, "top_p", a->cfg.top_p, "seed", (json_int_t)a->cfg.seed);
    char *text;
    if (o)
        add_weights(o, a, g);
    text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (text)
        printf("summary: %s\n", text);
    free(text);
    json_decref(o);
}

/* Loads, generates, prints. Returns the exit status. */
static int run(const gen_args *a, const unsigned char *prompt, size_t n) {
    td_device_list *devs = NULL;
    td_group *g = NULL;
    td_decoder *d = NULL;
    char *json = NULL;
    td_dtype saved, dtype;
    int32_t *tokens = NULL;
    size_t ntok = 0;
    td_generate_config cfg = a->cfg;
    td_bpe *bpe = NULL;
    td_generate_stats s;
    td_strategy_about about;
    td_status st;
    int rc = 1;
    if (a->tokenizer && (st = td_bpe_load(a->tokenizer, &bpe)) != TD_OK) {
        rc = td_cli_fail("generate", st);
        goto done;
    }
    if ((st = td_checkpoint_read_meta(a->ckpt, &json, &saved, NULL)) != TD_OK) {
        rc = td_cli_fail("generate", st);
        goto done;
    }
    if ((rc = check_model_kind(a->ckpt, json, bpe)) != 0)
        goto done;
    rc = 1;
    if ((st = td_devices_open(a->devices, &devs)) != TD_OK) {
        rc = td_cli_fail("generate", st);
        goto done;
    }
    if (td_strategy_about_get(a->strategy, &about) == TD_OK && about.max_members > 0 &&
        td_device_list_count(devs) > (size_t)about.max_members) {
        fprintf(stderr,
                "tandem generate: --devices %s names %zu devices; --strategy %s runs on "
                "%s (--strategy tensor splits the model across several)\n",
                a->devices, td_device_list_count(devs), about.name,
                about.max_members == 1 ? "one" : "fewer");
        rc = 2;
        goto done;
    }
    dtype = a->precision < 0 ? saved : (td_dtype)a->precision;
    td_weights_set_default(a->weights);
    td_decoder_set_default_kv_cache((td_kv_cache)a->kv_cache);
    if ((st = td_group_create(devs, NULL, &g)) != TD_OK ||
        (st = td_strategy_decoder_create(g, a->strategy, a->ckpt, dtype, &d)) != TD_OK) {
        rc = td_cli_fail("generate", st);
        goto done;
    }
    if ((rc = prompt_tokens(bpe, prompt, n, &tokens, &ntok)) != 0)
        goto done;
    rc = 1;
    if (ntok == 0) {
        fprintf(stderr, "tandem generate: the prompt has no tokens\n");
        goto done;
    }
    /* sample only what the tokenizer can write (a padded vocabulary's tail is not) */
    if (bpe)
        cfg.token_limit = td_bpe_vocab_size(bpe) < td_decoder_vocab(d) ? td_bpe_vocab_size(bpe) : 0;
    fwrite(prompt, 1, n, stdout);
    fflush(stdout);
    st = td_generate(d, tokens, (int64_t)ntok, &cfg, print_token, bpe, &s);
    putchar('\n');
    if (st != TD_OK) {
        rc = td_cli_fail("generate", st);
        goto done;
    }
    if (a->summary)
        print_summary(a, g, dtype, d, &s);
    rc = 0;
done:
    free(tokens);
    td_decoder_destroy(d);
    td_group_destroy(g);
    free(json);
    td_bpe_destroy(bpe);
    td_device_list_destroy(devs);
    return rc;
}

int td_cli_generate(int argc, char **argv) {
    gen_args a;
    unsigned char *prompt = NULL;
    size_t n = 0;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc;
    if (a.help) {
        usage(stdout);
        return 0;
    }
    if ((rc = read_prompt(&a, &prompt, &n)) != 0)
        return rc;
    rc = run(&a, prompt, n);
    free(prompt);
    return rc;
}
