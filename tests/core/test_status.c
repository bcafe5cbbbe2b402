#include <math.h>
#include <string.h>

#include "core/error.h"
#include "support/support.h"

static void names_and_messages_come_from_one_table(void **state) {
    assert_string_equal(td_status_name(TD_OK), "TD_OK");
    assert_string_equal(td_status_name(TD_ERR_OUT_OF_MEMORY), "TD_ERR_OUT_OF_MEMORY");
    assert_string_equal(td_status_str(TD_ERR_DEVICE_LOST), "device lost");
    assert_string_equal(td_status_name((td_status)-999), "TD_UNKNOWN");
    assert_int_equal(TD_OK, 0);
    assert_true(TD_ERR_INVALID_ARG < 0);
}

static void message_is_per_thread_and_prefixable(void **state) {
    td_clear_error();
    assert_string_equal(td_last_error(), "");
    assert_int_equal(td__error(TD_ERR_PARSE, "field %s", "lr"), TD_ERR_PARSE);
    assert_string_equal(td_last_error(), "field lr");
    td__error_prefix(TD_ERR_PARSE, "model.json: ");
    assert_string_equal(td_last_error(), "model.json: field lr");
}

static void a_message_about_a_setting_names_it(void **state) {
    td_clear_error();
    assert_null(td_last_error_setting());
    assert_int_equal(
        td__error_setting(TD_ERR_INVALID_ARG, "batch", "batch %d: at least 1 (`batch`)", 0),
        TD_ERR_INVALID_ARG);
    assert_string_equal(td_last_error(), "batch 0: at least 1 (`batch`)");
    assert_string_equal(td_last_error_setting(), "batch");
    /* A prefix adds context to the same failure; a new failure is its own. */
    td__error_prefix(TD_ERR_INVALID_ARG, "run: ");
    assert_string_equal(td_last_error_setting(), "batch");
    td__error(TD_ERR_IO, "x.json: cannot read");
    assert_null(td_last_error_setting());
    /* A message carried from another thread keeps the setting it came with. */
    td__error_set("cpu:1 has no f64 arithmetic (`dtype` f64)", "dtype");
    assert_string_equal(td_last_error_setting(), "dtype");
    td__error_set_message("lost");
    assert_null(td_last_error_setting());
    td__error_setting(TD_ERR_INVALID_ARG, "seed", "seed");
    td_clear_error();
    assert_null(td_last_error_setting());
}

static void philox_matches_the_published_known_answers(void **state) {
    /* Known-answer vectors from Random123's kat_vectors for philox4x32_10. */
    uint32_t zero[4] = {0, 0, 0, 0}, out[4];
    uint32_t ones[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    uint32_t pi[4] = {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u};
    td_philox(zero, 0, out);
    assert_int_equal(out[0], 0x6627e8d5u);
    assert_int_equal(out[1], 0xe169c58du);
    assert_int_equal(out[2], 0xbc57ac4cu);
    assert_int_equal(out[3], 0x9b00dbd8u);
    td_philox(ones, 0xffffffffffffffffull, out);
    assert_int_equal(out[0], 0x408f276du);
    assert_int_equal(out[1], 0x41c83b0eu);
    assert_int_equal(out[2], 0xa20bc7c6u);
    assert_int_equal(out[3], 0x6d5451fdu);
    td_philox(pi, ((uint64_t)0x299f31d0u << 32) | 0xa4093822u, out);
    assert_int_equal(out[0], 0xd16cfe09u);
    assert_int_equal(out[1], 0x94fdccebu);
    assert_int_equal(out[2], 0x5001e420u);
    assert_int_equal(out[3], 0x24126ea1u);
}

static void uniform_and_normal_have_the_right_moments(void **state) {
    const int n = 200000;
    double su = 0, su2 = 0, sn = 0, sn2 = 0, sn4 = 0;
    for (int i = 0; i < n; i++) {
        double u = td_rng_uniform(42, (uint64_t)i), z = td_rng_normal(42, (uint64_t)i);
        assert_true(u >= 0.0 && u < 1.0);
        su += u;
        su2 += u * u;
        sn += z;
        sn2 += z * z;
        sn4 += z * z * z * z;
    }
    /* Standard errors: mean of U ~ 0.29/sqrt(n) = 6.5e-4; allow 5 of them. */
    assert_true(fabs(su / n - 0.5) < 3.3e-3);
    assert_true(fabs(su2 / n - 1.0 / 3.0) < 3.3e-3);
    assert_true(fabs(sn / n) < 1.2e-2);
    assert_true(fabs(sn2 / n - 1.0) < 1.6e-2);
    assert_true(fabs(sn4 / n - 3.0) < 0.12);
    /* Different seeds give different streams. */
    assert_true(td_rng_uniform(1, 0) != td_rng_uniform(2, 0));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_and_messages_come_from_one_table),
        cmocka_unit_test(message_is_per_thread_and_prefixable),
        cmocka_unit_test(a_message_about_a_setting_names_it),
        cmocka_unit_test(philox_matches_the_published_known_answers),
        cmocka_unit_test(uniform_and_normal_have_the_right_moments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
