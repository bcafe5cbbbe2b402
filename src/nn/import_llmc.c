/* llm.c's GPT-2 checkpoints and token files into tandem.
 *
 * A checkpoint (train_gpt2.py's write_model, read by train_gpt2.c's
 * gpt2_build_from_checkpoint) is 256 little-endian int32s: magic 20240326,
 * version (3: f32 parameters; 5: bf16), max_seq_len, vocab_size, num_layers,
 * num_heads, channels, padded_vocab_size; then the 16 parameter tensors, each
 * for all blocks together: wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b,
 * qkvw (L, 3C, C), qkvb (L, 3C), attprojw (L, C, C), attprojb, ln2w, ln2b,
 * fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C),
 * lnfb (C). Weights are already (out, in), as tandem's; the head is wte.
 * wte's rows past vocab_size are padding, dropped here. A token file is 256
 * int32s (magic 20240520, version 1, the count) and that many uint16s. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "core/file.h"
#include "nn/import-impl.h"

#define LLMC_MAGIC        20240326
#define LLMC_F32          3
#define LLMC_BF16         5
#define LLMC_TOKENS_MAGIC 20240520
#define LLMC_HEADER       256

/* The header's int32s (little-endian, as llm.c writes them on x86). */
static td_status read_header(const char *path, const unsigned char *buf, size_t n,
                             int32_t h[LLMC_HEADER]) {
    if (n < sizeof(int32_t) * LLMC_HEADER)
        return td__error(TD_ERR_CORRUPT,
                         "%s: %zu bytes, shorter than llm.c's header (256 int32s, 1024 bytes)",
                         path, n);
    memcpy(h, buf, sizeof(int32_t) * LLMC_HEADER);
    return TD_OK;
}

static td_status check_model_header(const char *path, const int32_t *h) {
    if (h[0] != LLMC_MAGIC)
        return td__error(TD_ERR_CORRUPT,
                         "%s: header[0] (magic) is %d, not %d: not an llm.c GPT-2 checkpoint%s",
                         path, h[0], LLMC_MAGIC,
                         h[0] == LLMC_TOKENS_MAGIC ? " (it is an llm.c token file)" : "");
    if (h[1] == LLMC_BF16)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: header[1] (version) is 5: bf16 parameters; tandem converts version "
                         "3 (f32): write the checkpoint in float32 (llm.c's train_gpt2.py writes "
                         "both)",
                         path);
    if (h[1] != LLMC_F32)
        return td__error(TD_ERR_UNSUPPORTED,
                         "%s: header[1] (version) is %d; tandem converts version 3 (f32 "
                         "parameters)",
                         path, h[1]);
    return TD_OK;
}

/* Elements of kind k in the file: for every block together where per block. */
static size_t file_numel(const td_gpt2_info *g, int64_t vp, td__gpt2_kind k) {
    int64_t s[2] = {1, 1};
    int nd = td__gpt2_shape(g, k, s);
    size_t n = (size_t)s[0] * (size_t)(nd == 2 ? s[1] : 1);
    if (k == TD__G_WTE)
        return (size_t)vp * (size_t)g->channels;
    return td__gpt2_per_block(k) ? n * (size_t)g->layers : n;
}

td_status td_import_llmc_gpt2(const char *file, const char *out, const td_train_state *state,
                              td_gpt2_info *info) {
    static const char *const fields[] = {"header[2] (max_seq_len)", "header[3] (vocab_size)",
                                         "header[4] (num_layers)",  "header[5] (num_heads)",
                                         "header[6] (channels)",    "4 x channels",
                                         "layer norm epsilon"};
    td__gpt2_out o;
    unsigned char *buf = NULL;
    int32_t h[LLMC_HEADER];
    size_t n = 0, off[TD__G_KINDS], total = 0;
    int64_t vp;
    td_status st;
    memset(&o, 0, sizeof o);
    if (!file || !out)
        return td__error(TD_ERR_INVALID_ARG, "td_import_llmc_gpt2: file or out is NULL");
    o.source = "llm.c";
    o.act = TD_ACT_GELU_TANH; /* llm.c's gelu_forward */
    TD_TRY(td__read_file(file, (size_t)1 << 38, &buf, &n));
    TD_TRY(read_header(file, buf, n, h));
    TD_TRY(check_model_header(file, h));
    o.info = (td_gpt2_info){.context = h[2],
                            .vocab = h[3],
                            .layers = h[4],
                            .heads = h[5],
                            .channels = h[6],
                            .inner = 4 * (int64_t)h[6],
                            .eps = 1e-5, /* llm.c's layernorm_forward */
                            .tied = 1};
    vp = h[7];
    TD_TRY(td__gpt2_check(&o.info, file, fields));
    if (vp < o.info.vocab || vp > o.info.vocab + ((int64_t)1 << 20)) {
        st = td__error(TD_ERR_CORRUPT,
                       "%s: header[7] (padded_vocab_size) is %lld; expected at least header[3] "
                       "(vocab_size) = %lld",
                       file, (long long)vp, (long long)o.info.vocab);
        goto fail;
    }
    /* Where each kind starts, in floats after the header. */
    for (int k = 0; k < TD__G_HEAD; k++) {
        off[k] = total;
        total += file_numel(&o.info, vp, (td__gpt2_kind)k);
    }
    if (n != sizeof(int32_t) * LLMC_HEADER + total * sizeof(float)) {
        st = td__error(TD_ERR_CORRUPT,
                       "%s: %zu bytes; the header's shapes (max_seq_len %lld, vocab %lld padded to "
                       "%lld, %lld layers, %lld channels) need %zu: %s",
                       file, n, (long long)o.info.context, (long long)o.info.vocab, (long long)vp,
                       (long long)o.info.layers, (long long)o.info.channels,
                       sizeof(int32_t) * LLMC_HEADER + total * sizeof(float),
                       n < sizeof(int32_t) * LLMC_HEADER + total * sizeof(float)
                           ? "truncated"
                           : "it has more than a checkpoint holds");
        goto fail;
    }
    {
        /* the data follow the 1024-byte header, so floats stay aligned */
        float *p = (float *)(void *)(buf + sizeof(int32_t) * LLMC_HEADER);
        /* the first vocab rows of wte: the rest pads the vocabulary */
        TD_TRY(td__gpt2_add(&o, TD__G_WTE, 0, p + off[TD__G_WTE], 0));
        TD_TRY(td__gpt2_add(&o, TD__G_WPE, 0, p + off[TD__G_WPE], 0));
        for (int64_t b = 0; b < o.info.layers; b++)
            for (int k = TD__G_LN1W; k <= TD__G_FCPROJB; k++) {
                size_t per = file_numel(&o.info, vp, (td__gpt2_kind)k) / (size_t)o.info.layers;
                TD_TRY(td__gpt2_add(&o, (td__gpt2_kind)k, b, p + off[k] + (size_t)b * per, 0));
            }
        TD_TRY(td__gpt2_add(&o, TD__G_LNFW, 0, p + off[TD__G_LNFW], 0));
        TD_TRY(td__gpt2_add(&o, TD__G_LNFB, 0, p + off[TD__G_LNFB], 0));
    }
    TD_TRY(td__gpt2_save(&o, out, state, info));
fail:
    td__gpt2_free(&o);
    free(buf);
    return st;
}

td_status td_import_llmc_tokens(const char *file, int32_t **tokens, size_t *count) {
    unsigned char *buf = NULL;
    int32_t h[LLMC_HEADER];
    size_t n = 0;
    td_status st;
    if (!tokens || !count)
        return td__error(TD_ERR_INVALID_ARG, "td_import_llmc_tokens: tokens or count is NULL");
    *tokens = NULL;
    *count = 0;
    if (!file)
        return td__error(TD_ERR_INVALID_ARG, "td_import_llmc_tokens: file is NULL");
    TD_TRY(td__read_file(file, (size_t)1 << 36, &buf, &n));
    TD_TRY(read_header(file, buf, n, h));
    if (h[0] != LLMC_TOKENS_MAGIC) {
        st = td__error(TD_ERR_CORRUPT,
                       "%s: header[0] (magic) is %d, not %d: not an llm.c token file%s", file, h[0],
                       LLMC_TOKENS_MAGIC,
                       h[0] == LLMC_MAGIC ? " (it is an llm.c GPT-2 checkpoint)" : "");
        goto fail;
    }
    if (h[1] != 1) {
        st = td__error(TD_ERR_UNSUPPORTED,
                       "%s: header[1] (version) is %d; tandem reads version 1 (uint16 tokens)",
                       file, h[1]);
        goto fail;
    }
    if (h[2] < 0 || n != sizeof(int32_t) * LLMC_HEADER + (size_t)h[2] * sizeof(uint16_t)) {
        st = td__error(TD_ERR_CORRUPT, "%s: %zu bytes; header[2] (the token count %d) needs %zu",
                       file, n, h[2],
                       sizeof(int32_t) * LLMC_HEADER + (size_t)(h[2] < 0 ? 0 : h[2]) * 2);
        goto fail;
    }
    if (!(*tokens = td__calloc((size_t)h[2] * sizeof **tokens + 1, "llm.c tokens"))) {
        st = TD_ERR_OUT_OF_MEMORY;
        goto fail;
    }
    for (size_t i = 0; i < (size_t)h[2]; i++) {
        uint16_t t;
        memcpy(&t, buf + sizeof(int32_t) * LLMC_HEADER + 2 * i, 2);
        (*tokens)[i] = t;
    }
    *count = (size_t)h[2];
    st = TD_OK;
fail:
    free(buf);
    return st;
}
