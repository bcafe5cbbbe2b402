/* The safetensors reader and writer, against the format's byte layout. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "support/support.h"
#include "tandem/checkpoint.h"

/* A file laid out by hand: 8-byte little-endian length, JSON, data. */
static unsigned char *hand_made(const char *json, const void *data, size_t ndata, size_t *n) {
    size_t h = strlen(json);
    unsigned char *b = malloc(8 + h + ndata);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, json, h);
    memcpy(b + 8 + h, data, ndata);
    *n = 8 + h + ndata;
    return b;
}

static const float F[6] = {1.5f, -2.0f, 0.25f, 3.0e-3f, -0.0f, 1e30f};
static const double D[4] = {3.141592653589793, -1e-300, 2.0, 0.5};

static void writes_the_spec_layout(void **state) {
    td_safetensors_writer *w;
    char path[512];
    int64_t s23[2] = {2, 3}, s4[1] = {4}, s05[2] = {0, 5};
    unsigned char *b;
    size_t n;
    uint64_t h = 0;
    json_t *root, *t, *meta;
    json_error_t jerr;
    snprintf(path, sizeof path, "%s/a.safetensors", td_test_tmpdir());
    TD_ASSERT_OK(td_safetensors_writer_create(&w));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "w", TD_F32, 2, s23, F));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "d", TD_F64, 1, s4, D));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "scalar", TD_F32, 0, NULL, F + 1));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "empty", TD_F64, 2, s05, NULL));
    TD_ASSERT_OK(td_safetensors_writer_set_meta(w, "note", "hello"));
    TD_ASSERT_OK(td_safetensors_writer_set_meta(w, "note", "héllo, \"world\"\n"));
    TD_ASSERT_STATUS(td_safetensors_writer_add(w, "w", TD_F32, 2, s23, F), TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_safetensors_writer_add(w, "__metadata__", TD_F32, 2, s23, F),
                     TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_safetensors_writer_set_meta(w, "tandem.crc32", "0"), TD_ERR_INVALID_ARG);
    TD_ASSERT_OK(td_safetensors_writer_save(w, path));
    td_safetensors_writer_destroy(w);

    b = td_test_read_file(path, &n);
    for (int i = 7; i >= 0; i--)
        h = h << 8 | b[i];
    assert_int_equal(h % 8, 0); /* data starts aligned */
    assert_int_equal(n, 8 + h + 6 * 4 + 4 * 8 + 4);
    root = json_loadb((const char *)b + 8, h, 0, &jerr);
    assert_non_null(root);
    t = json_object_get(root, "w");
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F32");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t, "shape"), 1)), 3);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0)), 0);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 1)), 24);
    t = json_object_get(root, "d");
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), "F64");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0)), 24);
    assert_int_equal(json_array_size(json_object_get(json_object_get(root, "scalar"), "shape")), 0);
    meta = json_object_get(root, "__metadata__");
    assert_string_equal(json_string_value(json_object_get(meta, "note")), "héllo, \"world\"\n");
    assert_non_null(json_string_value(json_object_get(meta, "tandem.crc32")));
    /* The data, little-endian, in the order added. */
    assert_memory_equal(b + 8 + h, F, sizeof F);
    assert_memory_equal(b + 8 + h + 24, D, sizeof D);
    json_decref(root);
    free(b);
}

static void reads_back_what_it_wrote(void **state) {
    td_safetensors *st;
    const td_st_tensor *t;
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", td_test_tmpdir());
    TD_ASSERT_OK(td_safetensors_load(path, &st));
    assert_int_equal(td_safetensors_count(st), 4);
    assert_true(td_safetensors_has_checksum(st));
    assert_string_equal(td_safetensors_meta(st, "note"), "héllo, \"world\"\n");
    assert_null(td_safetensors_meta(st, "absent"));
    t = td_safetensors_find(st, "w");
    assert_non_null(t);
    assert_int_equal(t->dtype, TD_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->numel, 6);
    assert_memory_equal(t->data, F, sizeof F);
    t = td_safetensors_find(st, "d");
    assert_int_equal(t->dtype, TD_F64);
    assert_memory_equal(t->data, D, sizeof D);
    t = td_safetensors_find(st, "scalar");
    assert_int_equal(t->ndim, 0);
    assert_int_equal(t->numel, 1);
    t = td_safetensors_find(st, "empty");
    assert_int_equal(t->numel, 0);
    assert_int_equal(t->nbytes, 0);
    assert_null(td_safetensors_find(st, "nope"));
    assert_null(td_safetensors_tensor(st, 4));
    td_safetensors_destroy(st);
    td_safetensors_destroy(NULL);
}

static void reads_a_file_made_by_hand(void **state) {
    /* Tensors listed out of data order; no tandem checksum; no padding. */
    static const char json[] = "{\"b\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
                               "\"__metadata__\":{\"format\":\"pt\"},"
                               "\"a\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[0,8]}}";
    unsigned char data[16];
    float a[2] = {1.5f, -2.0f};
    double bb = 0.125;
    size_t n;
    unsigned char *file;
    td_safetensors *st;
    memcpy(data, a, 8);
    memcpy(data + 8, &bb, 8);
    file = hand_made(json, data, 16, &n);
    TD_ASSERT_OK(td_safetensors_parse(file, n, "hand.safetensors", &st));
    free(file); /* the reader keeps its own copy */
    assert_false(td_safetensors_has_checksum(st));
    assert_string_equal(td_safetensors_meta(st, "format"), "pt");
    assert_string_equal(td_safetensors_tensor(st, 0)->name, "a");
    assert_string_equal(td_safetensors_tensor(st, 1)->name, "b");
    assert_memory_equal(td_safetensors_find(st, "a")->data, a, 8);
    assert_memory_equal(td_safetensors_find(st, "b")->data, &bb, 8);
    td_safetensors_destroy(st);
}

static void bytes_into_tensors(void **state) {
    td_device_list *devs;
    td_tensor *t, *wrong;
    td_safetensors *st;
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    float back[6];
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", td_test_tmpdir());
    TD_ASSERT_OK(td_devices_open("cpu", &devs));
    TD_ASSERT_OK(td_tensor_create(td_device_list_get(devs, 0), TD_F32, 2, s23, &t));
    TD_ASSERT_OK(td_safetensors_load(path, &st));
    TD_ASSERT_OK(td_safetensors_read_tensor(st, "w", t));
    TD_ASSERT_OK(td_tensor_read(t, back, sizeof back));
    assert_memory_equal(back, F, sizeof F);
    TD_ASSERT_STATUS(td_safetensors_read_tensor(st, "d", t), TD_ERR_DTYPE);
    td_test_assert_message_contains("\"d\"");
    TD_ASSERT_STATUS(td_safetensors_read_tensor(st, "missing", t), TD_ERR_CORRUPT);
    td_test_assert_message_contains("\"missing\" is missing");
    TD_ASSERT_OK(td_tensor_create(td_device_list_get(devs, 0), TD_F32, 2, s32, &wrong));
    TD_ASSERT_STATUS(td_safetensors_read_tensor(st, "w", wrong), TD_ERR_SHAPE);
    td_test_assert_message_contains("shape (2, 3); the model needs (3, 2)");
    td_test_assert_message_contains(path);
    /* A tensor written from a device reads back the same. */
    {
        td_safetensors_writer *w;
        char p2[512];
        snprintf(p2, sizeof p2, "%s/t.safetensors", td_test_tmpdir());
        TD_ASSERT_OK(td_safetensors_writer_create(&w));
        TD_ASSERT_OK(td_safetensors_writer_add_tensor(w, "layers.0.weight", t));
        TD_ASSERT_OK(td_safetensors_writer_save(w, p2));
        td_safetensors_writer_destroy(w);
        td_safetensors_destroy(st);
        TD_ASSERT_OK(td_safetensors_load(p2, &st));
        assert_memory_equal(td_safetensors_find(st, "layers.0.weight")->data, F, sizeof F);
    }
    td_safetensors_destroy(st);
    td_tensor_destroy(t);
    td_tensor_destroy(wrong);
    td_device_list_destroy(devs);
}

/* Parses a hand-made file and expects `want` with `needle` in the message. */
static void expect_bad(const char *json, const void *data, size_t ndata, td_status want,
                       const char *needle) {
    size_t n;
    unsigned char *b = hand_made(json, data, ndata, &n);
    td_safetensors *st = (td_safetensors *)1;
    TD_ASSERT_STATUS(td_safetensors_parse(b, n, "bad.safetensors", &st), want);
    td_test_assert_message_contains("bad.safetensors");
    td_test_assert_message_contains(needle);
    assert_null(st);
    free(b);
}

static void malformed_files_are_clear_errors(void **state) {
    unsigned char z[64] = {0};
    td_safetensors *st;
    unsigned char lenonly[8] = {200, 0, 0, 0, 0, 0, 0, 0};
    TD_ASSERT_STATUS(td_safetensors_parse(z, 5, "bad.safetensors", &st), TD_ERR_CORRUPT);
    td_test_assert_message_contains("shorter than the 8-byte header length");
    TD_ASSERT_STATUS(td_safetensors_parse(lenonly, 8, "bad.safetensors", &st), TD_ERR_CORRUPT);
    td_test_assert_message_contains("header length 200");
    expect_bad("{\"a\":", z, 0, TD_ERR_CORRUPT, "header JSON");
    expect_bad("[1,2]", z, 0, TD_ERR_CORRUPT, "not a JSON object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", z, 7,
               TD_ERR_CORRUPT, "\"a\": data ends at byte 8, past the 7 bytes");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", z, 8,
               TD_ERR_CORRUPT, "\"a\": shape and dtype need");
    expect_bad("{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", z, 8,
               TD_ERR_UNSUPPORTED, "\"a\": dtype \"I64\"");
    expect_bad("{\"a\":{\"dtype\":\"F17\",\"shape\":[1],\"data_offsets\":[0,8]}}", z, 8,
               TD_ERR_CORRUPT, "dtype \"F17\"");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", z, 4,
               TD_ERR_CORRUPT, "shape[0]");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
               "\"data_offsets\":[0,4]}}",
               z, 4, TD_ERR_CORRUPT, "too many");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", z, 4, TD_ERR_CORRUPT,
               "\"data_offsets\"");
    /* Gaps, overlaps and trailing bytes. */
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", z, 8,
               TD_ERR_CORRUPT, "begins at 4");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               z, 8, TD_ERR_CORRUPT, "without gaps or overlaps");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", z, 12,
               TD_ERR_CORRUPT, "cover 4 bytes of data, the file holds 12");
    expect_bad("{\"__metadata__\":{\"k\":1}}", z, 0, TD_ERR_CORRUPT, "metadata \"k\"");
    expect_bad("{\"__metadata__\":[]}", z, 0, TD_ERR_CORRUPT, "\"__metadata__\" is not");
    expect_bad("{\"a\":1}", z, 0, TD_ERR_CORRUPT, "\"a\": entry is not an object");
    expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
               z, 4, TD_ERR_CORRUPT, "header JSON");
}

static void corrupted_copies_of_a_good_file_are_errors(void **state) {
    char path[512], bad[512];
    unsigned char *b;
    size_t n;
    uint64_t h = 0;
    td_safetensors *st;
    snprintf(path, sizeof path, "%s/a.safetensors", td_test_tmpdir());
    snprintf(bad, sizeof bad, "%s/bad.safetensors", td_test_tmpdir());
    b = td_test_read_file(path, &n);
    for (int i = 7; i >= 0; i--)
        h = h << 8 | b[i];
    td_test_write_file(bad, b, n - 1);
    TD_ASSERT_STATUS(td_safetensors_load(bad, &st), TD_ERR_CORRUPT);
    td_test_assert_message_contains(bad);
    td_test_assert_message_contains("truncated");
    b[8 + h + 5] ^= 0x10; /* one bit of tensor w */
    td_test_write_file(bad, b, n);
    TD_ASSERT_STATUS(td_safetensors_load(bad, &st), TD_ERR_CORRUPT);
    td_test_assert_message_contains("checksum mismatch");
    b[8 + h + 5] ^= 0x10;
    {
        /* A metadata value changed in place ("hé" -> "hf" keeps the length). */
        unsigned char *p = memmem(b, n, "llo, ", 5);
        assert_non_null(p);
        p[0] = 'L';
        td_test_write_file(bad, b, n);
        TD_ASSERT_STATUS(td_safetensors_load(bad, &st), TD_ERR_CORRUPT);
        td_test_assert_message_contains("checksum mismatch");
        p[0] = 'l';
    }
    b[3] = 1; /* header length far past the end */
    td_test_write_file(bad, b, n);
    TD_ASSERT_STATUS(td_safetensors_load(bad, &st), TD_ERR_CORRUPT);
    td_test_assert_message_contains("does not fit the file");
    free(b);
    snprintf(bad, sizeof bad, "%s/absent.safetensors", td_test_tmpdir());
    TD_ASSERT_STATUS(td_safetensors_load(bad, &st), TD_ERR_IO);
    td_test_assert_message_contains(bad);
}

static void saves_are_atomic(void **state) {
    td_safetensors_writer *w;
    td_safetensors *st;
    char path[512], sub[512];
    int64_t s1[1] = {1};
    DIR *d;
    struct dirent *e;
    snprintf(path, sizeof path, "%s/a.safetensors", td_test_tmpdir());
    TD_ASSERT_OK(td_safetensors_writer_create(&w));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "x", TD_F32, 1, s1, F));
    TD_ASSERT_OK(td_safetensors_writer_save(w, path)); /* over the old file */
    /* A folder that does not exist: an error, and nothing written. */
    snprintf(sub, sizeof sub, "%s/no/such/dir/c.safetensors", td_test_tmpdir());
    TD_ASSERT_STATUS(td_safetensors_writer_save(w, sub), TD_ERR_IO);
    td_test_assert_message_contains(sub);
    td_safetensors_writer_destroy(w);
    TD_ASSERT_OK(td_safetensors_load(path, &st));
    assert_int_equal(td_safetensors_count(st), 1);
    td_safetensors_destroy(st);
    /* No temporary files are left behind. */
    assert_non_null(d = opendir(td_test_tmpdir()));
    while ((e = readdir(d)))
        assert_null(strstr(e->d_name, ".tmp."));
    closedir(d);
}

/* A saved file gets the mode the umask gives new files (it was 0644 always). */
static void saves_follow_the_umask(void **state) {
    static const mode_t masks[] = {077, 022, 027};
    td_safetensors_writer *w;
    int64_t s1[1] = {1};
    char path[512];
    struct stat sb;
    mode_t old = umask(022);
    snprintf(path, sizeof path, "%s/mode.safetensors", td_test_tmpdir());
    TD_ASSERT_OK(td_safetensors_writer_create(&w));
    TD_ASSERT_OK(td_safetensors_writer_add(w, "x", TD_F32, 1, s1, F));
    for (size_t i = 0; i < sizeof masks / sizeof *masks; i++) {
        umask(masks[i]);
        TD_ASSERT_OK(td_safetensors_writer_save(w, path));
        assert_int_equal(stat(path, &sb), 0);
        assert_int_equal(sb.st_mode & 0777, 0666 & ~masks[i]);
    }
    umask(old);
    td_safetensors_writer_destroy(w);
}

static void python_safetensors_reads_it_when_installed(void **state) {
    /* The benchmark's virtual environment has the safetensors package. */
    const char *py = TD_SOURCE_DIR "/bench/.venv/bin/python";
    char cmd[2048], path[512], *out = NULL, *err = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/py.safetensors", td_test_tmpdir());
    if (access(py, X_OK) != 0 ||
        td_test_run_command("'" TD_SOURCE_DIR "/bench/.venv/bin/python' -c 'import safetensors, "
                            "numpy'",
                            &out, &err) != 0) {
        free(out);
        free(err);
        printf("note: python safetensors check skipped (bench/.venv lacks safetensors, numpy)\n");
        return;
    }
    free(out);
    free(err);
    {
        td_safetensors_writer *w;
        int64_t s23[2] = {2, 3}, s4[1] = {4};
        TD_ASSERT_OK(td_safetensors_writer_create(&w));
        TD_ASSERT_OK(td_safetensors_writer_add(w, "w", TD_F32, 2, s23, F));
        TD_ASSERT_OK(td_safetensors_writer_add(w, "d", TD_F64, 1, s4, D));
        TD_ASSERT_OK(td_safetensors_writer_set_meta(w, "step", "12"));
        TD_ASSERT_OK(td_safetensors_writer_save(w, path));
        td_safetensors_writer_destroy(w);
    }
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"from safetensors import safe_open\n"
             "f = safe_open('%s', framework='numpy')\n"
             "w = f.get_tensor('w'); d = f.get_tensor('d')\n"
             "print(w.dtype, w.shape, w[0,0], w[0,1], d.dtype, d[0], f.metadata()['step'])\"",
             py, path);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("python failed: %s %s", out, err);
    assert_non_null(strstr(out, "float32 (2, 3) 1.5 -2.0 float64 3.141592653589793 12"));
    free(out);
    free(err);
    /* And tandem reads what Python's package writes. */
    snprintf(cmd, sizeof cmd,
             "'%s' -c \"import numpy as np\nfrom safetensors.numpy import save_file\n"
             "save_file({'b': np.arange(6, dtype=np.float64).reshape(3, 2), "
             "'a': np.array([0.5, -1], dtype=np.float32)}, '%s', metadata={'k': 'v'})\"",
             py, path);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != 0)
        fail_msg("python failed: %s %s", out, err);
    free(out);
    free(err);
    {
        td_safetensors *st;
        const td_st_tensor *t;
        double b[6];
        TD_ASSERT_OK(td_safetensors_load(path, &st));
        assert_string_equal(td_safetensors_meta(st, "k"), "v");
        t = td_safetensors_find(st, "b");
        assert_int_equal(t->dtype, TD_F64);
        assert_int_equal(t->shape[0], 3);
        assert_int_equal(t->shape[1], 2);
        memcpy(b, t->data, sizeof b);
        assert_true(b[5] == 5.0);
        t = td_safetensors_find(st, "a");
        assert_int_equal(t->dtype, TD_F32);
        td_safetensors_destroy(st);
    }
}

/* Sanitizers reserve their shadow memory as address space, so no limit on
 * it can be set under them. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ADDRESS_LIMIT_WORKS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ADDRESS_LIMIT_WORKS 0
#endif
#endif
#ifndef ADDRESS_LIMIT_WORKS
#define ADDRESS_LIMIT_WORKS 1
#endif

/* Leaves room in this process's address space for `room` more bytes. */
static void limit_address_space(size_t room) {
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    struct rlimit rl;
    if (!f || fscanf(f, "%lu", &pages) != 1)
        _exit(2);
    fclose(f);
    rl.rlim_cur = rl.rlim_max = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + room;
    if (setrlimit(RLIMIT_AS, &rl) != 0)
        _exit(2);
}

/* Issue 26, item 10: a file is held once while loaded, not read and then
 * copied. A child whose address space has room for 1.5 copies of a 128 MiB
 * file (sparse: quick to write) must load it. */
static void loading_holds_the_file_once(void **state) {
    const size_t nbytes = (size_t)128 << 20;
    char json[160];
    unsigned char len[8];
    size_t h;
    FILE *f;
    pid_t pid;
    int status;
    h = (size_t)snprintf(json, sizeof json,
                         "{\"t\":{\"dtype\":\"F32\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}}",
                         nbytes / 4, nbytes);
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)h >> (8 * i));
    assert_non_null(f = fopen(td_test_tmp("big.st"), "wb"));
    assert_int_equal(fwrite(len, 1, 8, f), 8);
    assert_int_equal(fwrite(json, 1, h, f), h);
    assert_int_equal(fflush(f), 0);
    assert_int_equal(ftruncate(fileno(f), (off_t)(8 + h + nbytes)), 0);
    fclose(f);
    if (!ADDRESS_LIMIT_WORKS)
        printf("(under a sanitizer: loaded without an address-space limit)\n");
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        td_safetensors *st = NULL;
        td_status s;
        if (ADDRESS_LIMIT_WORKS)
            limit_address_space(nbytes + nbytes / 2);
        s = td_safetensors_load(td_test_tmp("big.st"), &st);
        if (s == TD_OK && td_safetensors_find(st, "t")->nbytes != nbytes)
            s = TD_ERR_INTERNAL;
        td_safetensors_destroy(st);
        _exit(s == TD_OK ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(writes_the_spec_layout),
        cmocka_unit_test(reads_back_what_it_wrote),
        cmocka_unit_test(reads_a_file_made_by_hand),
        cmocka_unit_test(bytes_into_tensors),
        cmocka_unit_test(malformed_files_are_clear_errors),
        cmocka_unit_test(corrupted_copies_of_a_good_file_are_errors),
        cmocka_unit_test(saves_are_atomic),
        cmocka_unit_test(saves_follow_the_umask),
        cmocka_unit_test(python_safetensors_reads_it_when_installed),
        cmocka_unit_test(loading_holds_the_file_once),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
