#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/error.h"

td_status td__read_file(const char *path, size_t max_bytes, uint8_t **out, size_t *len) {
    FILE *f = NULL;
    uint8_t *buf = NULL;
    long size;
    td_status st;
    struct stat sb;
    *out = NULL;
    *len = 0;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return td__error(TD_ERR_IO, "%s: not a regular file", path);
    if (!(f = fopen(path, "rb")))
        return td__error(TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = td__error(TD_ERR_IO, "%s: cannot find its size: %s", path, strerror(errno));
        goto fail;
    }
    if ((size_t)size > max_bytes) {
        st = td__error(TD_ERR_IO, "%s: %ld bytes; larger than the %zu this reader accepts", path,
                       size, max_bytes);
        goto fail;
    }
    if (!(buf = td__aligned_alloc((size_t)size, "a file's bytes"))) {
        st = td__error(TD_ERR_OUT_OF_MEMORY, "%s: no memory for %ld bytes", path, size);
        goto fail;
    }
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) {
        st = td__error(TD_ERR_IO, "%s: read failed: %s", path,
                       ferror(f) ? strerror(errno) : "file shrank while reading");
        goto fail;
    }
    fclose(f);
    *out = buf;
    *len = (size_t)size;
    return TD_OK;
fail:
    free(buf);
    fclose(f);
    return st;
}

td_status td__read_json_file(const char *path, size_t max_bytes, size_t flags, json_t **out) {
    uint8_t *bytes = NULL;
    size_t n = 0;
    json_error_t e;
    *out = NULL;
    TD_CHECK(td__read_file(path, max_bytes, &bytes, &n));
    *out = json_loadb((const char *)bytes, n, flags, &e);
    free(bytes);
    if (!*out)
        return td__error(TD_ERR_PARSE, "%s:%d:%d: %s", path, e.line, e.column, e.text);
    return TD_OK;
}
