/* Fuzzes the text data reader: the input's first byte picks the options
 * (context, held-out fraction, vocabulary), the rest is the file. Any bytes
 * must give the two data sets, whose every sample reads back within its
 * vocabulary, or a clean error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static char path[64];

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td_text_options o = TD_TEXT_OPTIONS_INIT;
    td_dataset *train = NULL, *val = NULL;
    FILE *f;
    if (size < 1)
        return 0;
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/fuzz_text.%ld.txt", (long)getpid());
    o.context = 1 + (data[0] & 15);
    o.val_fraction = (double)((data[0] >> 4) & 7) / 8.0;
    o.vocab = data[0] >> 7 ? TD_TEXT_CHARS : TD_TEXT_BYTES;
    if (!(f = fopen(path, "wb")))
        return 0;
    fwrite(data + 1, 1, size - 1, f);
    fclose(f);
    if (td_text_open(path, &o, &train, &val) == TD_OK) {
        td_dataset *sets[2] = {train, val};
        int32_t tokens[16], labels[16];
        for (int k = 0; k < 2; k++) {
            td_dataset_info info;
            td_dataset_get_info(sets[k], &info);
            if (info.size < 1 || info.shape[0] != o.context)
                abort();
            for (int64_t i = 0; i < info.size && i < 64; i++) {
                if (td_dataset_get(sets[k], i, NULL, tokens, labels) != TD_OK)
                    abort();
                for (int64_t t = 0; t < o.context; t++)
                    if (tokens[t] < 0 || tokens[t] >= info.num_classes || labels[t] < 0 ||
                        labels[t] >= info.num_classes)
                        abort();
            }
        }
    }
    td_dataset_destroy(train);
    td_dataset_destroy(val);
    unlink(path);
    return 0;
}
