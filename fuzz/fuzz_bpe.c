/* Fuzzes GPT-2's BPE tokenizer files: the input is vocab.json, a NUL,
 * merges.txt, a NUL and a text (a missing part is empty). Any bytes must
 * load a tokenizer or give a clean error; a loaded one must encode the text
 * into ids below its vocabulary size that decode to the very bytes (its
 * contract: byte-level, so lossless), and refuse an id past the vocabulary.
 * Never a crash, a leak or a read outside the files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static char vocab[64], merges[64];

/* The next part of [*p, end): up to a NUL or the end; *p moves past it. */
static const unsigned char *part(const unsigned char **p, const unsigned char *end, size_t *n) {
    const unsigned char *start = *p, *nul = memchr(start, 0, (size_t)(end - start));
    *n = (size_t)((nul ? nul : end) - start);
    *p = nul ? nul + 1 : end;
    return start;
}

/* The files go when the fuzzer exits. */
static void remove_files(void) {
    unlink(vocab);
    unlink(merges);
}

static int write_file(const char *path, const unsigned char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    if (n && fwrite(bytes, 1, n, f) != n) {
        fclose(f);
        return 0;
    }
    return fclose(f) == 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    const unsigned char *p = data, *end = data + size, *v, *m, *text;
    size_t nv, nm, nt;
    td_bpe *t = (td_bpe *)1;
    if (!vocab[0]) {
        snprintf(vocab, sizeof vocab, "/tmp/fuzz_bpe.%ld.vocab.json", (long)getpid());
        snprintf(merges, sizeof merges, "/tmp/fuzz_bpe.%ld.merges.txt", (long)getpid());
        atexit(remove_files);
    }
    v = part(&p, end, &nv);
    m = part(&p, end, &nm);
    text = part(&p, end, &nt);
    nt = (size_t)(end - text); /* the text may hold NULs */
    if (!write_file(vocab, v, nv) || !write_file(merges, m, nm))
        return 0;
    if (td_bpe_load_files(vocab, merges, &t) != TD_OK) {
        if (t)
            abort();
        return 0;
    }
    {
        int32_t *ids = NULL, bad = (int32_t)td_bpe_vocab_size(t);
        size_t count = 0, len = 0;
        char *back = NULL;
        if (td_bpe_encode(t, (const char *)text, nt, &ids, &count) != TD_OK)
            abort();
        for (size_t i = 0; i < count; i++)
            if (ids[i] < 0 || ids[i] >= td_bpe_vocab_size(t))
                abort();
        if (td_bpe_decode(t, ids, count, &back, &len) != TD_OK || len != nt ||
            (nt && memcmp(back, text, nt)))
            abort();
        free(ids);
        free(back);
        back = NULL;
        if (td_bpe_decode(t, &bad, 1, &back, &len) == TD_OK || back)
            abort();
    }
    td_bpe_destroy(t);
    return 0;
}
