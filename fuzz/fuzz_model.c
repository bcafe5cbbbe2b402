/* Fuzzes the JSON model loader: any bytes must give a model or a clean
 * error, never a crash, a leak or an out-of-bounds access. A model that
 * loads (and is small, to keep runs fast) also runs one training step on a
 * one-sample batch, so every architecture the loader accepts is one the
 * layers can run. The device has a small memory budget, so huge layers fail
 * as out of memory quickly. */
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static td_device_list *devices;

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char *json;
    td_model *m = NULL;
    if (!devices && td_devices_open("cpu:0{mem=32M}", &devices) != TD_OK)
        abort();
    if (!(json = malloc(size + 1)))
        return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    if (td_model_load_string(json, "fuzz.json", td_device_list_get(devices, 0), TD_F32, 1, &m) ==
        TD_OK) {
        int64_t shape[TD_MAX_DIMS], per = 1;
        int nd = td_model_input_shape(m, shape);
        float *x;
        int32_t *ints;
        td_step_result r;
        if (m == NULL || td_model_num_classes(m) < 1)
            abort();
        for (int i = 0; i < nd; i++)
            per *= shape[i];
        x = calloc((size_t)per, sizeof *x);
        ints = calloc((size_t)per, sizeof *ints);
        if (x && ints && td_model_num_weights(m) < 100000 && per < 100000) {
            td_batch b = {1, x, ints, ints};
            if (td_model_input_kind(m) == TD_INPUT_TOKENS)
                b.x = NULL;
            else
                b.tokens = NULL;
            /* may fail for lack of memory; must not crash */
            (void)td_model_train_step(m, &b, 1.0, 0, 0, &r);
        }
        free(x);
        free(ints);
        td_model_destroy(m);
    }
    free(json);
    return 0;
}
