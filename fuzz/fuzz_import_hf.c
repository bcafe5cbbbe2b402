/* Fuzzes the Hugging Face GPT-2 importer (td_import_hf_gpt2): the input's
 * first two bytes (little-endian) are config.json's length, then come
 * config.json's bytes and the rest is model.safetensors. Any bytes must give
 * a checkpoint that reads back with the model the importer described, or a
 * clean error with no checkpoint written; never a crash, a leak or a read
 * outside the files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static char dir[64], cfg[96], model[96], out[96];

/* The folder and its files go when the fuzzer exits. */
static void remove_files(void) {
    unlink(cfg);
    unlink(model);
    unlink(out);
    rmdir(dir);
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
    td_gpt2_info info;
    size_t ncfg;
    if (size < 2)
        return 0;
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/fuzz_import_hf.%ld", (long)getpid());
        mkdir(dir, 0700);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        snprintf(model, sizeof model, "%s/model.safetensors", dir);
        snprintf(out, sizeof out, "%s/out.safetensors", dir);
        atexit(remove_files);
    }
    ncfg = (size_t)data[0] | (size_t)data[1] << 8;
    if (ncfg > size - 2)
        ncfg = size - 2;
    if (!write_file(cfg, data + 2, ncfg) || !write_file(model, data + 2 + ncfg, size - 2 - ncfg))
        return 0;
    unlink(out);
    if (td_import_hf_gpt2(dir, out, NULL, &info) == TD_OK) {
        char *json = NULL;
        td_dtype dt;
        td_model_info mi;
        if (info.layers < 1 || info.heads < 1 || info.channels % info.heads || info.vocab < 1 ||
            info.context < 1)
            abort();
        /* What was written is a checkpoint whose model describes. */
        if (td_checkpoint_read_meta(out, &json, &dt, NULL) != TD_OK ||
            td_model_describe(json, out, &mi, NULL, 0) != TD_OK || mi.classes != info.vocab)
            abort();
        free(json);
    } else if (access(out, F_OK) == 0) {
        abort(); /* a failed import leaves no checkpoint */
    }
    return 0;
}
