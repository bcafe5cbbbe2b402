/* Fuzzes llm.c's readers: the input's first byte picks the token file
 * reader (td_import_llmc_tokens, odd) or the GPT-2 checkpoint importer
 * (td_import_llmc_gpt2, even); the rest is the file. Any bytes must give
 * tokens that fit uint16 (as many as the header says) or a checkpoint whose
 * model the importer described, or a clean error with nothing returned or
 * written; never a crash, a leak or a read outside the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static char in[64], out[64];

/* The files go when the fuzzer exits. */
static void remove_files(void) {
    unlink(in);
    unlink(out);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    FILE *f;
    if (size < 1)
        return 0;
    if (!in[0]) {
        snprintf(in, sizeof in, "/tmp/fuzz_import_llmc.%ld.bin", (long)getpid());
        snprintf(out, sizeof out, "/tmp/fuzz_import_llmc.%ld.safetensors", (long)getpid());
        atexit(remove_files);
    }
    if (!(f = fopen(in, "wb")))
        return 0;
    if (size > 1 && fwrite(data + 1, 1, size - 1, f) != size - 1) {
        fclose(f);
        return 0;
    }
    if (fclose(f) != 0)
        return 0;
    if (data[0] & 1) {
        int32_t *tokens = (int32_t *)1;
        size_t count = 1;
        if (td_import_llmc_tokens(in, &tokens, &count) == TD_OK) {
            /* 256 int32s of header, then the tokens as uint16 */
            if (count != (size - 1 - 1024) / 2)
                abort();
            for (size_t i = 0; i < count; i++)
                if (tokens[i] < 0 || tokens[i] > 65535)
                    abort();
            free(tokens);
        } else if (tokens || count) {
            abort();
        }
        return 0;
    }
    unlink(out);
    {
        td_gpt2_info info;
        if (td_import_llmc_gpt2(in, out, NULL, &info) == TD_OK) {
            char *json = NULL;
            td_dtype dt;
            td_model_info mi;
            if (td_checkpoint_read_meta(out, &json, &dt, NULL) != TD_OK ||
                td_model_describe(json, out, &mi, NULL, 0) != TD_OK || mi.classes != info.vocab)
                abort();
            free(json);
        } else if (access(out, F_OK) == 0) {
            abort();
        }
    }
    return 0;
}
