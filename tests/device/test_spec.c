/* The device-spec parser: what it accepts, and what it refuses and says. */
#include <stdlib.h>
#include <string.h>

#include "device/spec.h"
#include "support/support.h"

static td_spec_item *parse_ok(const char *spec, size_t *n) {
    td_spec_item *items = NULL;
    TD_ASSERT_OK(td__spec_parse(spec, &items, n));
    return items;
}

static void parse_fails(const char *spec, td_status want, const char *needle) {
    td_spec_item *items = (td_spec_item *)0x1;
    size_t n = 99;
    td_status st = td__spec_parse(spec, &items, &n);
    if (st != want)
        fail_msg("'%s' gave %s, expected %s: %s", spec, td_status_name(st), td_status_name(want),
                 td_last_error());
    assert_null(items);
    assert_int_equal(n, 0);
    td_test_assert_message_contains(needle);
}

static void plain_items(void **state) {
    size_t n;
    td_spec_item *it = parse_ok("cpu", &n);
    assert_int_equal(n, 1);
    assert_string_equal(it[0].backend, "cpu");
    assert_int_equal(it[0].index_kind, TD_SPEC_INDEX_NONE);
    assert_int_equal(it[0].count, 1);
    free(it);

    it = parse_ok("cpu:0, cpu:1", &n);
    assert_int_equal(n, 2);
    assert_int_equal(it[0].index_kind, TD_SPEC_INDEX_ONE);
    assert_int_equal(it[0].index, 0);
    assert_int_equal(it[1].index, 1);
    assert_string_equal(it[1].text, "cpu:1");
    free(it);

    it = parse_ok("cpu*2", &n);
    assert_int_equal(n, 1);
    assert_int_equal(it[0].count, 2);
    free(it);

    it = parse_ok("cuda:*,opencl:0.1,auto", &n);
    assert_int_equal(n, 3);
    assert_int_equal(it[0].index_kind, TD_SPEC_INDEX_ALL);
    assert_string_equal(it[1].backend, "opencl");
    assert_int_equal(it[1].index, 0);
    assert_int_equal(it[1].sub_index, 1);
    assert_string_equal(it[2].backend, "auto");
    free(it);
}

static void options_in_braces(void **state) {
    size_t n;
    td_spec_item *it = parse_ok("cpu:0{cores=1,mem=512M},cpu:1{slowdown=2.5},cuda:0{split=2}", &n);
    assert_int_equal(n, 3);
    assert_true(it[0].opts.has_cores);
    assert_int_equal(it[0].opts.cores, 1);
    assert_true(it[0].opts.has_mem);
    assert_int_equal(it[0].opts.mem, 512ull << 20);
    assert_false(it[0].opts.has_slowdown);
    assert_true(it[1].opts.has_slowdown);
    assert_true(it[1].opts.slowdown == 2.5);
    assert_int_equal(it[2].opts.split, 2);
    free(it);
}

static void byte_sizes(void **state) {
    uint64_t v;
    assert_int_equal(td__parse_bytes("1024", &v), 0);
    assert_int_equal(v, 1024);
    assert_int_equal(td__parse_bytes("4K", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(td__parse_bytes("2GiB", &v), 0);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(td__parse_bytes("1.5M", &v), 0);
    assert_int_equal(v, 3ull << 19);
    assert_int_not_equal(td__parse_bytes("", &v), 0);
    assert_int_not_equal(td__parse_bytes("12Q", &v), 0);
    assert_int_not_equal(td__parse_bytes("-5", &v), 0);
    assert_int_not_equal(td__parse_bytes("0", &v), 0);
}

static void malformed_specs_are_refused_with_a_reason(void **state) {
    parse_fails("", TD_ERR_PARSE, "empty item");
    parse_fails("cpu,,cpu:1", TD_ERR_PARSE, "empty item");
    parse_fails("gpu:0", TD_ERR_NO_DEVICE, "unknown backend 'gpu'");
    parse_fails("cpu:", TD_ERR_PARSE, "expected a device index");
    parse_fails("cpu:x", TD_ERR_PARSE, "expected a device index");
    parse_fails("cpu*0", TD_ERR_PARSE, "device count");
    parse_fails("cpu:0*2", TD_ERR_PARSE, "whole backend");
    parse_fails("cpu{cores=1", TD_ERR_PARSE, "without '}'");
    parse_fails("cpu{}", TD_ERR_PARSE, "empty option list");
    parse_fails("cpu{cores}", TD_ERR_PARSE, "without '='");
    parse_fails("cpu{cores=0}", TD_ERR_PARSE, "cores=0");
    parse_fails("cpu{cores=1,cores=2}", TD_ERR_PARSE, "given twice");
    parse_fails("cpu{mem=lots}", TD_ERR_PARSE, "mem=lots");
    parse_fails("cpu{colour=red}", TD_ERR_PARSE, "unknown option 'colour'");
    parse_fails("cpu{slowdown=0.5}", TD_ERR_PARSE, "slowdown=0.5");
    parse_fails("cpu{latency=-1}", TD_ERR_PARSE, "latency=-1");
    parse_fails("cpu{latency=2ms}", TD_ERR_PARSE, "time in milliseconds");
    parse_fails("cpu:0.1", TD_ERR_PARSE, "only opencl");
    parse_fails("auto:0", TD_ERR_PARSE, "takes no index");
    parse_fails("cpu:0 junk", TD_ERR_PARSE, "unexpected character");
    parse_fails("cpu:99999999999", TD_ERR_PARSE, "device index");
    parse_fails(NULL, TD_ERR_INVALID_ARG, "NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_items),
        cmocka_unit_test(options_in_braces),
        cmocka_unit_test(byte_sizes),
        cmocka_unit_test(malformed_specs_are_refused_with_a_reason),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
