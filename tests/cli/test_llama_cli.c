/* tandem convert, tokenize and generate on a Llama folder as a user runs
 * them (the README's tour), on tests/fixtures/hf/llama (made by
 * scripts/make_hf_fixtures): the folder becomes a checkpoint, tokenize
 * prints the ids tokenizers gave the prompt (BOS first), and generate
 * greedily continues the prompt with the tokens transformers chose, their
 * bytes as the fixture spells them out, on one device and split over
 * three; the generation stops at the tokenizer's EOS
 * without printing it; bad folders exit 1 with the file and field named. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "support/dp_check.h"
#include "support/support.h"

#define EXE     TD_TANDEM_EXE
#define FIXTURE TD_SOURCE_DIR "/tests/fixtures/hf/llama"
#define TEXT    TD_SOURCE_DIR "/data/text/tinyshakespeare.txt"

static char *run(const char *args, int want_rc, const char *err_needle) {
    char cmd[4096], *out = NULL, *err = NULL;
    int rc;
    snprintf(cmd, sizeof cmd, "'%s' %s", EXE, args);
    rc = td_test_run_command(cmd, &out, &err);
    if (rc != want_rc)
        fail_msg("'%s' exited %d, expected %d\nstdout: %s\nstderr: %s", args, rc, want_rc,
                 out ? out : "", err ? err : "");
    if (err_needle && (!err || !strstr(err, err_needle)))
        fail_msg("'%s': stderr lacks \"%s\": %s", args, err_needle, err ? err : "");
    free(err);
    return out;
}

static json_t *reference(void) {
    json_error_t e;
    json_t *ref = json_load_file(FIXTURE "/reference.json", 0, &e);
    assert_non_null(ref);
    return ref;
}

static void converts_tokenizes_and_generates(void **state) {
    json_t *ref = reference(), *v;
    const char *prompt = json_string_value(json_object_get(ref, "greedy_text"));
    char args[2048], want[1024], *out;
    size_t i, k = 0;
    snprintf(args, sizeof args, "convert --from hf '" FIXTURE "' --out '%s' --optimizer none",
             td_test_tmp("llama.safetensors"));
    out = run(args, 0, NULL);
    if (!strstr(out, "LlamaForCausalLM, 2 blocks, 6 heads on 3 key/value heads, 48 channels, "
                     "context 64, vocabulary 378"))
        fail_msg("convert printed \"%s\"", out);
    free(out);

    /* the prompt's ids, as tokenizers' encode(prompt).ids */
    json_array_foreach(json_object_get(ref, "greedy_prompt"), i, v) k += (size_t)snprintf(
        want + k, sizeof want - k, "%s%d", i ? " " : "", (int)json_integer_value(v));
    snprintf(want + k, sizeof want - k, "\n");
    snprintf(args, sizeof args, "tokenize --tokenizer '" FIXTURE "' --text '%s'", prompt);
    assert_string_equal(prompt, "KING HENRY:\nWhat");
    out = run(args, 0, NULL);
    assert_string_equal(out, want);
    free(out);

    /* greedy: the prompt, then the bytes of transformers' tokens */
    k = (size_t)snprintf(want, sizeof want, "%s", prompt);
    for (const char *h = json_string_value(json_object_get(ref, "greedy_bytes")); h[0] && h[1];
         h += 2) {
        unsigned byte;
        assert_int_equal(sscanf(h, "%2x", &byte), 1);
        want[k++] = (char)byte;
    }
    want[k++] = '\n';
    want[k] = '\0';
    snprintf(args, sizeof args,
             "generate --checkpoint '%s' --tokenizer '" FIXTURE "' --prompt '%s' --tokens %zu "
             "--temperature 0",
             td_test_tmp("llama.safetensors"), prompt,
             json_array_size(json_object_get(ref, "greedy_tokens")));
    out = run(args, 0, NULL);
    assert_string_equal(out, want);
    free(out);
    /* the same text split over three devices, one slowed: query heads cut
     * within the groups of key/value heads */
    snprintf(args + strlen(args), sizeof args - strlen(args),
             " --devices 'cpu*2,cpu*1{slowdown=3}' --strategy tensor");
    out = run(args, 0, NULL);
    assert_string_equal(out, want);
    free(out);
    json_decref(ref);
}

/* A tokenizer whose EOS is the model's first greedy token: generate prints
 * the prompt alone. */
static void generation_stops_at_eos(void **state) {
    json_t *ref = reference(), *cfg, *doc, *v;
    int32_t first =
        (int32_t)json_integer_value(json_array_get(json_object_get(ref, "greedy_tokens"), 0));
    char dir[600], path[700], args[2048], *text, *out;
    const char *tok, *spelling = NULL;
    json_error_t e;
    size_t n;
    unsigned char *b;
    snprintf(dir, sizeof dir, "%s", td_test_tmp("eos"));
    assert_int_equal(mkdir(dir, 0755), 0);
    b = td_test_read_file(FIXTURE "/tokenizer.json", &n);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    td_test_write_file(path, b, n);
    free(b);
    /* the first greedy token as the vocabulary spells it */
    assert_non_null(doc = json_load_file(FIXTURE "/tokenizer.json", 0, &e));
    json_object_foreach(json_object_get(json_object_get(doc, "model"), "vocab"), tok, v) {
        if (json_integer_value(v) == first)
            spelling = tok;
    }
    assert_non_null(spelling);
    assert_non_null(
        cfg = json_load_file(FIXTURE "/tokenizer_config.json", JSON_DECODE_INT_AS_REAL, &e));
    json_object_set_new(cfg, "eos_token", json_string(spelling));
    text = json_dumps(cfg, 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    td_test_write_file(path, text, strlen(text));
    free(text);
    json_decref(cfg);
    json_decref(doc);
    snprintf(args, sizeof args, "convert --from hf '" FIXTURE "' --out '%s' --optimizer none",
             td_test_tmp("llama2.safetensors"));
    free(run(args, 0, NULL));
    snprintf(args, sizeof args,
             "generate --checkpoint '%s' --tokenizer '%s' --prompt 'KING HENRY:\nWhat' "
             "--tokens 8 --temperature 0 --summary",
             td_test_tmp("llama2.safetensors"), dir);
    out = run(args, 0, NULL);
    if (strncmp(out, "KING HENRY:\nWhat\nsummary: ", 25) != 0 ||
        !strstr(out, "\"generated_tokens\":1,"))
        fail_msg("generate printed \"%s\": expected the prompt alone, one token generated", out);
    free(out);
    json_decref(ref);
}

static void bad_folders_are_clear_errors(void **state) {
    char args[1024];
    snprintf(args, sizeof args, "convert --from hf '%s' --out '%s'", td_test_tmp("nowhere"),
             td_test_tmp("x.safetensors"));
    free(run(args, 1, "nowhere/config.json"));
    free(run("tokenize --tokenizer '" FIXTURE "'", 2, "--tokenizer and --text are required"));
    /* a merge of a token the vocabulary lacks */
    {
        json_error_t e;
        json_t *doc = json_load_file(FIXTURE "/tokenizer.json", 0, &e);
        char dir[600], path[700], *text;
        assert_non_null(doc);
        json_array_append_new(json_object_get(json_object_get(doc, "model"), "merges"),
                              json_pack("[s,s]", "a", "nothing-like-this"));
        snprintf(dir, sizeof dir, "%s", td_test_tmp("badmerge"));
        assert_int_equal(mkdir(dir, 0755), 0);
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        text = json_dumps(doc, 0);
        td_test_write_file(path, text, strlen(text));
        free(text);
        json_decref(doc);
        snprintf(args, sizeof args, "tokenize --tokenizer '%s' --text hello", dir);
        free(run(args, 1, "tokenizer.json: \"model\": \"merges\"["));
    }
}

/* The converted checkpoint (f32) fine-tunes alike under every strategy:
 * three SGD steps from it under data, pipeline and tensor (three devices,
 * one slowed, its query heads cut within the groups) end where one device's
 * do, within f32 rounding. */
static void fine_tunes_under_every_strategy(void **state) {
    static const char *const runs[][2] = {
        {"data", "'cpu*2'"}, {"pipeline", "'cpu*2'"}, {"tensor", "'cpu*2,cpu*1{slowdown=3}'"}};
    char args[2048], one[600], other[600];
    (void)state;
    snprintf(args, sizeof args,
             "convert --from hf '" FIXTURE "' --out '%s' --optimizer sgd --batch 4 --seed 3",
             td_test_tmp("base.safetensors"));
    free(run(args, 0, NULL));
    snprintf(one, sizeof one, "%s", td_test_tmp("single.safetensors"));
    for (int k = -1; k < 3; k++) {
        const char *name = k < 0 ? "single" : runs[k][0], *devices = k < 0 ? "cpu:0" : runs[k][1];
        snprintf(other, sizeof other, "%s", td_test_tmp(name));
        snprintf(args, sizeof args,
                 "train --resume '%s' --data '" TEXT "' --steps 3 --lr 0.05 --eval-samples 4 "
                 "--no-epoch-eval --quiet --strategy %s --devices %s --checkpoint '%s'",
                 td_test_tmp("base.safetensors"), name, devices, k < 0 ? one : other);
        free(run(args, 0, NULL));
        if (k < 0) {
            double moved = td_dp_checkpoint_diff(td_test_tmp("base.safetensors"), one);
            printf("single: the weights moved by %.3g\n", moved);
            assert_true(moved > 1e-6);
        } else {
            double diff = td_dp_checkpoint_diff(one, other);
            printf("%s on %s: %.3g from single\n", name, devices, diff);
            assert_true(diff <= 1e-5);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(converts_tokenizes_and_generates),
        cmocka_unit_test(generation_stops_at_eos),
        cmocka_unit_test(fine_tunes_under_every_strategy),
        cmocka_unit_test(bad_folders_are_clear_errors),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
