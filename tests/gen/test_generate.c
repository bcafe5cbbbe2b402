/* The generator: greedy generation against the arg-max chain of the full
 * forward (sliding window included), reproducible sampling from a seed,
 * top-k and top-p against their definitions, bad settings, and loading a
 * checkpoint in the other precision. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "support/full_logits.h"
#include "support/support.h"

/* A context of 12 so that the tests slide the window. */
static const char *const small_gpt =
    "{\"input\": {\"tokens\": 12, \"vocab\": 48}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 48, \"dim\": 32},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"attention\", \"heads\": 2}]},"
    "{\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"}, "
    "{\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"}, "
    "{\"type\": \"linear\", \"out\": 32}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 48}]}";

enum { T = 12, V = 48, MAX_TOKENS = 64 };

typedef struct collected {
    int n;
    int32_t tok[MAX_TOKENS];
} collected;

static int collect(void *arg, int32_t token) {
    collected *c = arg;
    if (c->n < MAX_TOKENS)
        c->tok[c->n++] = token;
    return 0;
}

typedef struct fixture {
    td_device_list *list;
    td_model *m;
    td_decoder *d;
} fixture;

static void open_model(fixture *f, td_dtype dtype, uint64_t seed) {
    f->list = td_test_open("cpu");
    TD_ASSERT_OK(td_model_load_string(small_gpt, "small_gpt", td_device_list_get(f->list, 0), dtype,
                                      seed, &f->m));
    TD_ASSERT_OK(td_decoder_create(f->m, &f->d));
}

static void close_model(fixture *f) {
    td_decoder_destroy(f->d);
    td_model_destroy(f->m);
    td_device_list_destroy(f->list);
}

static int32_t arg_max(const double *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* The greedy chain with the full forward over the window the generator
 * documents: the sequence while it fits, then its last T / 2 tokens. */
static void reference_greedy(td_model *m, const int32_t *prompt, int n, int count, int32_t *out) {
    int32_t win[T];
    double logits[T * V];
    int len = n;
    memcpy(win, prompt, sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < count; i++) {
        td_test_full_logits(m, win, len, logits);
        out[i] = arg_max(logits + (len - 1) * V, V);
        if (len == T) {
            memmove(win, win + T - (T / 2 - 1), sizeof(int32_t) * (T / 2 - 1));
            len = T / 2 - 1;
        }
        win[len++] = out[i];
    }
}

static void greedy_equals_the_full_forward_chain(void **state) {
    fixture f;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    td_generate_stats s;
    collected got = {0};
    const int32_t prompt[3] = {5, 17, 40};
    int32_t want[40];
    open_model(&f, TD_F64, 11);
    cfg.tokens = 40;
    cfg.temperature = 0;
    TD_ASSERT_OK(td_generate(f.d, prompt, 3, &cfg, collect, &got, &s));
    reference_greedy(f.m, prompt, 3, 40, want);
    assert_int_equal(got.n, 40);
    assert_memory_equal(got.tok, want, sizeof want);
    assert_int_equal(s.prompt_tokens, 3);
    assert_int_equal(s.generated_tokens, 40);
    /* 39 tokens enter the window after the prompt: 9 fill it, the 10th
     * slides it back to 6 positions, and every 7th after that */
    assert_int_equal(s.slides, 5);
    assert_true(s.prefill_ms >= 0 && s.decode_ms >= 0);
    close_model(&f);
}

static void a_seed_gives_the_same_tokens(void **state) {
    fixture f;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    collected a = {0}, b = {0}, c = {0}, greedy = {0}, top1 = {0};
    const int32_t prompt[2] = {1, 2};
    open_model(&f, TD_F32, 5);
    cfg.tokens = 30;
    cfg.temperature = 1.5;
    cfg.seed = 42;
    TD_ASSERT_OK(td_generate(f.d, prompt, 2, &cfg, collect, &a, NULL));
    TD_ASSERT_OK(td_generate(f.d, prompt, 2, &cfg, collect, &b, NULL));
    assert_memory_equal(a.tok, b.tok, sizeof a.tok);
    cfg.seed = 43;
    TD_ASSERT_OK(td_generate(f.d, prompt, 2, &cfg, collect, &c, NULL));
    assert_true(memcmp(a.tok, c.tok, sizeof a.tok) != 0);
    cfg.top_k = 1;
    TD_ASSERT_OK(td_generate(f.d, prompt, 2, &cfg, collect, &top1, NULL));
    cfg.top_k = 0;
    cfg.temperature = 0;
    TD_ASSERT_OK(td_generate(f.d, prompt, 2, &cfg, collect, &greedy, NULL));
    assert_memory_equal(top1.tok, greedy.tok, sizeof top1.tok);
    close_model(&f);
}

static int stop_after_three(void *arg, int32_t token) {
    collected *c = arg;
    collect(c, token);
    return c->n == 3;
}

static void the_callback_can_stop(void **state) {
    fixture f;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    td_generate_stats s;
    collected got = {0};
    int32_t prompt[20];
    open_model(&f, TD_F32, 2);
    for (int i = 0; i < 20; i++)
        prompt[i] = i;
    cfg.tokens = 10;
    /* a prompt longer than the context: its last 12 tokens */
    TD_ASSERT_OK(td_generate(f.d, prompt, 20, &cfg, stop_after_three, &got, &s));
    assert_int_equal(got.n, 3);
    assert_int_equal(s.generated_tokens, 3);
    assert_int_equal(s.prompt_tokens, T);
    close_model(&f);
}

/* Frequencies of many draws against the distribution top-k and top-p
 * define: logits log(0.5, 0.25, 0.15, 0.1). */
static void top_k_and_top_p_follow_their_definitions(void **state) {
    const double logits[4] = {log(0.5), log(0.25), log(0.15), log(0.1)};
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    struct {
        int64_t top_k;
        double top_p;
        double want[4];
    } cases[] = {
        {0, 1.0, {0.5, 0.25, 0.15, 0.1}},
        {2, 1.0, {2 / 3.0, 1 / 3.0, 0, 0}},
        {0, 0.8, {0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0}},
        {3, 0.5, {1, 0, 0, 0}},
    };
    enum { DRAWS = 20000 };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int count[4] = {0};
        cfg.top_k = cases[k].top_k;
        cfg.top_p = cases[k].top_p;
        for (uint64_t i = 0; i < DRAWS; i++) {
            int32_t t;
            TD_ASSERT_OK(td_generate_choose(logits, 4, &cfg, i, &t));
            assert_true(t >= 0 && t < 4);
            count[t]++;
        }
        for (int t = 0; t < 4; t++) {
            double p = cases[k].want[t], got = (double)count[t] / DRAWS;
            /* five standard deviations of a binomial frequency */
            if (fabs(got - p) > 5 * sqrt(p * (1 - p) / DRAWS) + 1e-12)
                fail_msg("case %zu: token %d drawn %.4f of the time, expected %.4f", k, t, got, p);
        }
    }
    cfg.top_k = 0;
    cfg.top_p = 1;
    cfg.token_limit = 3;
    cfg.temperature = 0;
    {
        const double last_best[4] = {0, 1, 2, 3};
        int32_t t;
        TD_ASSERT_OK(td_generate_choose(last_best, 4, &cfg, 0, &t));
        assert_int_equal(t, 2);
    }
}

static void bad_settings_are_refused(void **state) {
    fixture f;
    td_generate_config cfg = TD_GENERATE_CONFIG_INIT;
    const int32_t prompt[1] = {0}, bad_prompt[1] = {V};
    const double nan_logits[2] = {0, NAN};
    int32_t t;
    open_model(&f, TD_F32, 1);
    cfg.temperature = -1;
    TD_ASSERT_STATUS(td_generate(f.d, prompt, 1, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("temperature");
    cfg.temperature = 1;
    cfg.top_p = 0;
    TD_ASSERT_STATUS(td_generate(f.d, prompt, 1, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("top_p");
    cfg.top_p = 1;
    cfg.top_k = -2;
    TD_ASSERT_STATUS(td_generate(f.d, prompt, 1, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    cfg.top_k = 0;
    cfg.token_limit = V + 1;
    TD_ASSERT_STATUS(td_generate(f.d, prompt, 1, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    cfg.token_limit = 0;
    TD_ASSERT_STATUS(td_generate(f.d, prompt, 0, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("empty");
    TD_ASSERT_STATUS(td_generate(f.d, bad_prompt, 1, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    TD_ASSERT_STATUS(td_generate_choose(nan_logits, 2, &cfg, 0, &t), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("logit of token 1");
    cfg.tokens = TD_GENERATE_MAX_TOKENS + 1;
    TD_ASSERT_STATUS(td_generate(f.d, prompt, 1, &cfg, NULL, NULL, NULL), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("generate: 1000001 tokens is outside [0, 1000000] (`tokens`)");
    assert_string_equal(td_last_error_setting(), "tokens");
    cfg.tokens = 0;
    TD_ASSERT_OK(td_generate(f.d, prompt, 1, &cfg, NULL, NULL, NULL));
    close_model(&f);
}

/* A checkpoint saved in f64 loads in f32 with its values rounded, and
 * generates what the f64 model does greedily here. */
static void a_checkpoint_loads_in_either_precision(void **state) {
    fixture f;
    td_model *m32 = NULL, *m64 = NULL;
    const char *path = td_test_tmp("gpt.safetensors");
    td_tensor *a, *b;
    td_compare_result cmp;
    open_model(&f, TD_F64, 9);
    TD_ASSERT_OK(td_checkpoint_save(path, f.m, NULL, NULL));
    TD_ASSERT_OK(td_generate_load_model(path, td_device_list_get(f.list, 0), TD_F32, &m32));
    TD_ASSERT_OK(td_generate_load_model(path, td_device_list_get(f.list, 0), TD_F64, &m64));
    assert_int_equal(td_model_dtype(m32), TD_F32);
    assert_int_equal(td_model_param_count(m32), td_model_param_count(f.m));
    for (size_t i = 0; i < td_model_param_count(f.m); i++) {
        a = td_model_param(f.m, i);
        TD_ASSERT_OK(td_tensor_compare(a, td_model_param(m32, i), &cmp));
        assert_true(cmp.max_rel <= 1e-7);
        b = td_model_param(m64, i);
        TD_ASSERT_OK(td_tensor_compare(a, b, &cmp));
        assert_true(cmp.max_abs == 0);
    }
    td_model_destroy(m32);
    TD_ASSERT_STATUS(td_generate_load_model(td_test_tmp("none.safetensors"),
                                            td_device_list_get(f.list, 0), TD_F32, &m32),
                     TD_ERR_IO);
    assert_null(m32);
    td_model_destroy(m64);
    close_model(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_equals_the_full_forward_chain),
        cmocka_unit_test(a_seed_gives_the_same_tokens),
        cmocka_unit_test(the_callback_can_stop),
        cmocka_unit_test(top_k_and_top_p_follow_their_definitions),
        cmocka_unit_test(bad_settings_are_refused),
        cmocka_unit_test(a_checkpoint_loads_in_either_precision),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
