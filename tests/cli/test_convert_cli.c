/* tandem convert and tandem generate --tokenizer as a user runs them, on the
 * GPT-2 fixture of tests/fixtures/gpt2_tiny (see its make_fixture.py): the
 * Hugging Face folder and the llm.c file each become a checkpoint that
 * greedily continues the fixture's prompt with the tokens transformers
 * chose, decoded; tandem eval and train --resume take it; bad input gives a
 * message naming file and field, and exit status 1 (2 for usage). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/support.h"

#define EXE         TD_TANDEM_EXE
#define FIXTURE     TD_SOURCE_DIR "/tests/fixtures/gpt2_tiny"
#define SHAKESPEARE TD_SOURCE_DIR "/data/text/tinyshakespeare.txt"

/* Runs "tandem <args>", checks the status and, when given, that stderr
 * holds err_needle; returns stdout (the caller frees it). */
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

/* The fixture's prompt followed by transformers' greedy tokens, decoded by
 * tandem's tokenizer (its agreement with GPT2Tokenizer: tests/train). */
static char *expected_text(const char **prompt) {
    static char text[256];
    json_error_t e;
    json_t *ref = json_load_file(FIXTURE "/reference.json", 0, &e), *v;
    int32_t ids[64];
    size_t i, len;
    char *dec = NULL;
    td_bpe *bpe = NULL;
    assert_non_null(ref);
    json_array_foreach(json_object_get(ref, "greedy_tokens"), i, v) ids[i] =
        (int32_t)json_integer_value(v);
    TD_ASSERT_OK(td_bpe_load(FIXTURE, &bpe));
    TD_ASSERT_OK(td_bpe_decode(bpe, ids, json_array_size(json_object_get(ref, "greedy_tokens")),
                               &dec, &len));
    snprintf(text, sizeof text, "%s", json_string_value(json_object_get(ref, "greedy_text")));
    *prompt = strdup(text);
    assert_true(strlen(text) + len + 1 < sizeof text);
    memcpy(text + strlen(text), dec, len + 1);
    free(dec);
    td_bpe_destroy(bpe);
    json_decref(ref);
    return text;
}

/* Greedy generation from ckpt prints the prompt, transformers' tokens and a newline. */
static void generates_transformers_tokens(const char *ckpt) {
    char args[2048], *out;
    const char *prompt = NULL;
    const char *want = expected_text(&prompt);
    snprintf(args, sizeof args,
             "generate --checkpoint '%s' --tokenizer '" FIXTURE "' --prompt '%s' --tokens 20 "
             "--temperature 0",
             ckpt, prompt);
    out = run(args, 0, NULL);
    if (strncmp(out, want, strlen(want)) != 0 || strcmp(out + strlen(want), "\n") != 0)
        fail_msg("generate printed \"%s\", expected \"%s\\n\"", out, want);
    free(out);
    free((char *)prompt);
}

static void converts_hf_and_generates(void **state) {
    char args[1024], *out;
    snprintf(args, sizeof args, "convert --from hf '" FIXTURE "' --out '%s'",
             td_test_tmp("hf.safetensors"));
    out = run(args, 0, NULL);
    if (!strstr(out, "GPT2LMHeadModel, 2 blocks, 4 heads, 64 channels, context 64, vocabulary 300"))
        fail_msg("convert printed \"%s\"", out);
    free(out);
    generates_transformers_tokens(td_test_tmp("hf.safetensors"));
}

static void converts_llmc_and_generates(void **state) {
    char args[1024];
    snprintf(args, sizeof args,
             "convert --from llmc '" FIXTURE "/gpt2_tiny_llmc.bin' --out '%s' --optimizer none",
             td_test_tmp("llmc.safetensors"));
    free(run(args, 0, NULL));
    generates_transformers_tokens(td_test_tmp("llmc.safetensors"));
    /* weights only: eval has no optimizer state to load */
    snprintf(args, sizeof args, "eval --checkpoint '%s' --data '" SHAKESPEARE "' --samples 4",
             td_test_tmp("llmc.safetensors"));
    free(run(args, 1, "holds no optimizer state"));
}

/* The default checkpoint is a run at step 0: eval and train --resume take it. */
static void eval_and_resume_take_the_checkpoint(void **state) {
    char args[2048], *out;
    json_error_t e;
    json_t *o;
    snprintf(args, sizeof args,
             "convert --from hf '" FIXTURE "' --out '%s' --optimizer adamw --batch 4 --seed 3",
             td_test_tmp("fine.safetensors"));
    free(run(args, 0, NULL));
    snprintf(args, sizeof args,
             "eval --checkpoint '%s' --data '" SHAKESPEARE "' --samples 8 --json",
             td_test_tmp("fine.safetensors"));
    out = run(args, 0, NULL);
    o = json_loads(out, JSON_DISABLE_EOF_CHECK, &e);
    assert_non_null(o);
    assert_true(json_number_value(json_object_get(o, "loss")) > 0);
    json_decref(o);
    free(out);
    snprintf(args, sizeof args,
             "train --resume '%s' --data '" SHAKESPEARE "' --steps 2 --lr 0.0003 --eval-samples 4 "
             "--no-epoch-eval --quiet --checkpoint '%s'",
             td_test_tmp("fine.safetensors"), td_test_tmp("tuned.safetensors"));
    free(run(args, 0, NULL));
    generates_transformers_tokens(td_test_tmp("fine.safetensors"));
}

/* A copy of the fixture folder whose config.json says model_type "bert". */
static const char *bert_folder(void) {
    static char dir[512];
    char path[600];
    size_t n;
    unsigned char *b;
    const char *cfg = "{\"model_type\": \"bert\", \"n_embd\": 64}";
    snprintf(dir, sizeof dir, "%s", td_test_tmp("bert"));
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    td_test_write_file(path, cfg, strlen(cfg));
    b = td_test_read_file(FIXTURE "/model.safetensors", &n);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    td_test_write_file(path, b, n);
    free(b);
    return dir;
}

static void bad_input_is_a_clear_error(void **state) {
    char args[1024];
    snprintf(args, sizeof args, "convert --from hf '%s' --out '%s'", bert_folder(),
             td_test_tmp("x.safetensors"));
    free(run(args, 1,
             "bert/config.json: \"model_type\": \"bert\": tandem converts GPT2LMHeadModel"));
    snprintf(args, sizeof args, "convert --from llmc '" FIXTURE "/tokens_llmc.bin' --out '%s'",
             td_test_tmp("x.safetensors"));
    free(run(args, 1, "tokens_llmc.bin: header[0] (magic) is 20240520, not 20240326"));
    snprintf(args, sizeof args, "convert --from hf '" FIXTURE "'");
    free(run(args, 2, "--out is required"));
    free(run("convert --from onnx x --out y", 2, "--from is hf, llmc or tandem, not 'onnx'"));
    free(run("convert --from hf x --out y --optimizer lion", 2,
             "--optimizer is adamw, sgd or "
             "none, not 'lion'"));
    snprintf(args, sizeof args, "generate --checkpoint '%s' --tokenizer '%s' --prompt hi",
             td_test_tmp("hf.safetensors"), td_test_tmp("nowhere"));
    free(run(args, 1, "nowhere/vocab.json"));
    assert_true(access(td_test_tmp("x.safetensors"), F_OK) != 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(converts_hf_and_generates),
        cmocka_unit_test(converts_llmc_and_generates),
        cmocka_unit_test(eval_and_resume_take_the_checkpoint),
        cmocka_unit_test(bad_input_is_a_clear_error),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
