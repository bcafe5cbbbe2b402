/* Fuzzes the TANDEM_FAULT syntax: any text given as a group's fault plan
 * must give the group or a clean error, never a crash or a leak. */
#include <stdlib.h>
#include <string.h>

#include "tandem/tandem.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static td_device_list *devices;

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    td_group_config cfg = TD_GROUP_CONFIG_INIT;
    td_group *g = NULL;
    char *text = malloc(size + 1);
    if (!devices && td_devices_open("cpu*2", &devices) != TD_OK)
        abort();
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    cfg.transport = TD_TRANSPORT_LOCAL;
    cfg.fault = text;
    if (td_group_create(devices, &cfg, &g) == TD_OK && !g)
        abort();
    td_group_destroy(g);
    free(text);
    return 0;
}
