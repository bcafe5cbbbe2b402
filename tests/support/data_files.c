/* Writers of .npy and safetensors files for the data readers' tests. */
#include "support/data_files.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

void td_test_write_npy_v(const char *path, int version, const char *descr, const char *fortran,
                         const char *shape, const void *data, size_t nbytes) {
    char dict[512];
    unsigned char *buf;
    size_t pre = version == 1 ? 10 : 12, len, hlen;
    len = (size_t)snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }",
                           descr, fortran, shape);
    hlen = (pre + len + 1 + 63) / 64 * 64 - pre; /* spaces, then '\n', to a multiple of 64 */
    assert_non_null(buf = malloc(pre + hlen + nbytes + 1));
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)version;
    buf[7] = 0;
    buf[8] = (unsigned char)hlen;
    buf[9] = (unsigned char)(hlen >> 8);
    if (version > 1)
        buf[10] = buf[11] = 0;
    memcpy(buf + pre, dict, len);
    memset(buf + pre + len, ' ', hlen - len - 1);
    buf[pre + hlen - 1] = '\n';
    if (nbytes)
        memcpy(buf + pre + hlen, data, nbytes);
    td_test_write_file(path, buf, pre + hlen + nbytes);
    free(buf);
}

void td_test_write_npy(const char *path, const char *descr, const char *shape, const void *data,
                       size_t nbytes) {
    td_test_write_npy_v(path, 1, descr, "False", shape, data, nbytes);
}

void td_test_write_safetensors(const char *path, const td_test_st_entry *e, int n) {
    char header[4096];
    size_t len = 0, off = 0, total;
    unsigned char *buf;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(
            header + len, sizeof header - len,
            "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}", i ? "," : "",
            e[i].name, e[i].dtype, e[i].shape, off, off + e[i].nbytes);
        off += e[i].nbytes;
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    assert_true(len < sizeof header);
    total = 8 + len + off;
    assert_non_null(buf = malloc(total));
    for (int b = 0; b < 8; b++)
        buf[b] = (unsigned char)((uint64_t)len >> (8 * b));
    memcpy(buf + 8, header, len);
    off = 8 + len;
    for (int i = 0; i < n; i++) {
        memcpy(buf + off, e[i].data, e[i].nbytes);
        off += e[i].nbytes;
    }
    td_test_write_file(path, buf, total);
    free(buf);
}
