/* Fuzzes a checkpoint's metadata: the input, as lines KEY=VALUE, becomes
 * the metadata of an otherwise valid checkpoint (its checksum right) of a
 * small model, which is then read back. Any metadata must give the model or
 * a clean error naming the field, never a crash, a leak or undefined
 * behaviour. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static const char *model =
    "{\"name\": \"f\", \"input\": {\"shape\": [3]}, \"layers\": [{\"type\": \"linear\", \"out\": "
    "2}]}";

static td_device_list *devices;
static char path[64];

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td_safetensors_writer *w = NULL;
    td_model *m = NULL;
    char *text = malloc(size + 1), *json = NULL;
    float weight[6] = {0}, bias[2] = {0};
    int64_t ws[2] = {2, 3}, bs[1] = {2};
    td_dtype dt;
    td_train_state s;
    if (!devices && td_devices_open("cpu:0{mem=16M}", &devices) != TD_OK)
        abort();
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/fuzz_ckpt_meta.%ld.safetensors", (long)getpid());
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    if (td_safetensors_writer_create(&w) != TD_OK)
        abort();
    td_safetensors_writer_add(w, "layers.0.weight", TD_F32, 2, ws, weight);
    td_safetensors_writer_add(w, "layers.0.bias", TD_F32, 1, bs, bias);
    td_safetensors_writer_set_meta(w, "tandem.model", model);
    for (char *line = text, *end; line; line = end) {
        char *eq;
        if ((end = strchr(line, '\n')))
            *end++ = '\0';
        if (!(eq = strchr(line, '=')))
            continue;
        *eq = '\0';
        td_safetensors_writer_set_meta(w, line, eq + 1); /* may refuse: not UTF-8, reserved */
    }
    if (td_safetensors_writer_save(w, path) == TD_OK) {
        if (td_checkpoint_read_meta(path, &json, &dt, &s) == TD_OK && (!json || s.batch < 0))
            abort();
        free(json);
        if (td_checkpoint_load_model(path, td_device_list_get(devices, 0), &m, &s) == TD_OK && !m)
            abort();
        td_model_destroy(m);
        unlink(path);
    }
    td_safetensors_writer_destroy(w);
    free(text);
    return 0;
}
