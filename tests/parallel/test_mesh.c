/* Device meshes: data:2,tensor:2, data:2,pipeline:2 and pipeline:2,tensor:2
 * on four devices (two replicas, or two stages, each split in two), and
 * data:2,pipeline:2,tensor:2 on eight, train as
 * one device does, equal devices
 * and unequal ones, an MLP and a GPT; its checkpoints move to and from other strategies and resume
 * bit for bit; meshes that are not built, or that name another number of
 * devices than the group's, are refused by name; losing a device, the
 * other replica still holds its slices. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/dp_check.h"
#include "support/model_data.h"
#include "support/support.h"
#include "tandem/checkpoint.h"
#include "tandem/strategy.h"

/* 2 blocks, 32 channels, 4 heads, context 8, vocabulary 48; dropout. */
static const char *gpt_json =
    "{\"name\": \"mesh_gpt\", \"input\": {\"tokens\": 8, \"vocab\": 48}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 48, \"dim\": 32, \"positions\": true},"
    "{\"type\": \"dropout\", \"p\": 0.1},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "    {\"type\": \"attention\", \"heads\": 4}]},"
    "  {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "    {\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"},"
    "    {\"type\": \"linear\", \"out\": 32}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 48}]}";

static void an_mlp_trains_as_one_device(void **state) {
    (void)state;
    td_strategy_check_equals_one_device("data:2,tensor:2", "cpu*4", "mesh_mlp");
    /* unequal replicas (cpu*K spells no option per device): one device each */
    td_strategy_check_equals_one_device("data:2,tensor:1", "cpu:0,cpu:1{slowdown=3}",
                                        "mesh_mlp_slowed");
    td_strategy_check_equals_one_device("data:3,tensor:1", "cpu*3", "mesh_mlp_3x1");
    td_strategy_check_equals_one_device("data:2,pipeline:2", "cpu*4", "mesh_pp_mlp");
    td_strategy_check_equals_one_device("data:2,pipeline:1", "cpu:0,cpu:1{slowdown=3}",
                                        "mesh_pp_slowed");
    td_strategy_check_equals_one_device("pipeline:2,tensor:2", "cpu*4", "mesh_pt_mlp");
    /* three axes: replicas of a pipeline whose stages are split */
    td_strategy_check_equals_one_device("data:2,pipeline:1,tensor:2", "cpu*4", "mesh_dpt_mlp");
    td_strategy_check_equals_one_device("data:2,pipeline:2,tensor:2", "cpu*8", "mesh_dpt8_mlp");
    /* a stage split unequally: the slowed member takes a quarter of its units */
    td_strategy_check_equals_one_device("pipeline:1,tensor:2", "cpu:0,cpu:1{slowdown=3}",
                                        "mesh_pt_slowed");
}

static td_strategy_config config(const char *name, int64_t batch) {
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    c.name = name;
    c.dtype = TD_F64;
    c.seed = 7;
    c.opt.kind = TD_OPT_ADAMW;
    c.opt.eps = 1e-5; /* see test_tensor.c: a larger eps keeps AdamW's amplification in bounds */
    c.opt.lr = 0.01;
    c.opt.weight_decay = 0.01;
    c.opt.clip_norm = 0.5; /* binds: the norm of the gradients summed over the replicas */
    c.batch = batch;
    return c;
}

/* `name` over spec for `steps` steps of d; the checkpoint at path. */
static void train_and_save(const char *name, const char *spec, const td_test_data *d, int steps,
                           const char *path) {
    td_strategy_config c = config(name, d->n);
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_step_result r;
    char plan[4096];
    TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s));
    printf("%s on %s:\n%s", name, spec, td_strategy_plan(s, plan, sizeof plan));
    for (int k = 0; k < steps; k++)
        TD_ASSERT_OK(td_strategy_step(s, &d->b[k], (uint64_t)k, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(s, path, NULL));
    td_strategy_destroy(s);
    td_group_destroy(g);
}

static void a_gpt_trains_as_one_device(void **state) {
    td_test_data *d = td_test_data_create(gpt_json, 3, 4);
    double diff;
    (void)state;
    train_and_save("single", "cpu:0", d, 3, td_test_tmp("one.st"));
    train_and_save("data:2,tensor:2", "cpu*4", d, 3, td_test_tmp("mesh.st"));
    diff = td_dp_checkpoint_diff(td_test_tmp("one.st"), td_test_tmp("mesh.st"));
    printf("data:2,tensor:2, GPT, AdamW clipped: weights differ by %.3g\n", diff);
    assert_true(diff <= 1e-12);
    train_and_save("data:2,pipeline:2", "cpu*4", d, 3, td_test_tmp("mesh_pp.st"));
    diff = td_dp_checkpoint_diff(td_test_tmp("one.st"), td_test_tmp("mesh_pp.st"));
    printf("data:2,pipeline:2, GPT, AdamW clipped: weights differ by %.3g\n", diff);
    assert_true(diff <= 1e-12);
    train_and_save("pipeline:2,tensor:2", "cpu*4", d, 3, td_test_tmp("mesh_pt.st"));
    diff = td_dp_checkpoint_diff(td_test_tmp("one.st"), td_test_tmp("mesh_pt.st"));
    printf("pipeline:2,tensor:2, GPT, AdamW clipped: weights differ by %.3g\n", diff);
    assert_true(diff <= 1e-12);
    train_and_save("data:2,pipeline:2,tensor:2", "cpu*8", d, 3, td_test_tmp("mesh_dpt.st"));
    diff = td_dp_checkpoint_diff(td_test_tmp("one.st"), td_test_tmp("mesh_dpt.st"));
    printf("data:2,pipeline:2,tensor:2, GPT, AdamW clipped: weights differ by %.3g\n", diff);
    assert_true(diff <= 1e-12);
    /* a checkpoint of one mesh shape resumes under the others */
    for (int i = 0; i < 3; i++) {
        static const char *const meshes[] = {"data:2,pipeline:2", "pipeline:2,tensor:2",
                                             "data:2,pipeline:2,tensor:2"};
        td_strategy_config c = config(meshes[i], d->n);
        td_group *g = NULL;
        td_strategy *s = NULL;
        TD_ASSERT_OK(td_group_create_spec(i == 2 ? "cpu*8" : "cpu*4", NULL, &g));
        TD_ASSERT_OK(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s));
        TD_ASSERT_OK(td_strategy_load(s, td_test_tmp("mesh.st"), NULL));
        TD_ASSERT_OK(td_strategy_save(s, td_test_tmp("mesh_again.st"), NULL));
        assert_true(td_dp_checkpoint_diff(td_test_tmp("mesh.st"), td_test_tmp("mesh_again.st")) ==
                    0);
        td_strategy_destroy(s);
        td_group_destroy(g);
    }
    td_test_data_destroy(d);
}

/* Half a run under the mesh, the rest under single, and the other way. */
static void checkpoints_move_to_and_from_the_mesh(void **state) {
    td_test_data *d = td_test_data_create(gpt_json, 4, 4);
    td_group *g1 = NULL, *g4 = NULL;
    td_strategy_config c1 = config("single", 4), c4 = config("data:2,tensor:2", 4);
    td_strategy *one = NULL, *mesh = NULL;
    td_step_result r;
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu:0", NULL, &g1));
    TD_ASSERT_OK(td_group_create_spec("cpu*4", NULL, &g4));
    TD_ASSERT_OK(td_strategy_create(g4, gpt_json, "mesh_gpt", &c4, &mesh));
    for (int k = 0; k < 2; k++)
        TD_ASSERT_OK(td_strategy_step(mesh, &d->b[k], (uint64_t)k, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(mesh, td_test_tmp("half.st"), NULL));
    TD_ASSERT_OK(td_strategy_create(g1, gpt_json, "mesh_gpt", &c1, &one));
    TD_ASSERT_OK(td_strategy_load(one, td_test_tmp("half.st"), NULL));
    assert_int_equal(td_strategy_steps(one), 2);
    for (int k = 2; k < 4; k++) {
        TD_ASSERT_OK(td_strategy_step(one, &d->b[k], (uint64_t)k, &r, NULL));
        TD_ASSERT_OK(td_strategy_step(mesh, &d->b[k], (uint64_t)k, &r, NULL));
    }
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("a.st"), NULL));
    TD_ASSERT_OK(td_strategy_save(mesh, td_test_tmp("b.st"), NULL));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("a.st"), td_test_tmp("b.st")) <= 1e-12);
    /* and single's checkpoint into a fresh mesh: every replica takes it */
    td_strategy_destroy(mesh);
    TD_ASSERT_OK(td_strategy_create(g4, gpt_json, "mesh_gpt", &c4, &mesh));
    TD_ASSERT_OK(td_strategy_load(mesh, td_test_tmp("a.st"), NULL));
    TD_ASSERT_OK(td_strategy_save(mesh, td_test_tmp("c.st"), NULL));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("a.st"), td_test_tmp("c.st")) == 0);
    TD_ASSERT_OK(td_strategy_step(one, &d->b[0], 4, &r, NULL));
    TD_ASSERT_OK(td_strategy_step(mesh, &d->b[0], 4, &r, NULL));
    TD_ASSERT_OK(td_strategy_save(one, td_test_tmp("a.st"), NULL));
    TD_ASSERT_OK(td_strategy_save(mesh, td_test_tmp("c.st"), NULL));
    assert_true(td_dp_checkpoint_diff(td_test_tmp("a.st"), td_test_tmp("c.st")) <= 1e-12);
    td_strategy_destroy(one);
    td_strategy_destroy(mesh);
    td_group_destroy(g1);
    td_group_destroy(g4);
    td_test_data_destroy(d);
}

static void meshes_not_built_are_refused(void **state) {
    td_group *g = NULL;
    td_strategy *s = NULL;
    td_strategy_config c = config("tensor:2,pipeline:2", 4);
    td_strategy_about a;
    (void)state;
    TD_ASSERT_OK(td_group_create_spec("cpu*4", NULL, &g));
    TD_ASSERT_STATUS(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s), TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("the tensor axis is the inner one");
    td_test_assert_message_contains("pipeline:2,tensor:2");
    c.name = "tensor:2,data:2";
    TD_ASSERT_STATUS(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s), TD_ERR_UNSUPPORTED);
    td_test_assert_message_contains("pipeline:P,tensor:N and data:R,pipeline:P,tensor:N run yet");
    c.name = "data:3,tensor:2";
    TD_ASSERT_STATUS(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("the mesh data:3,tensor:2 names 6 devices; the group has 4");
    c.name = "data:2,diagonal:2";
    TD_ASSERT_STATUS(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("no axis 'diagonal' (axes: data, tensor, pipeline, mirror)");
    c.name = "data:x";
    TD_ASSERT_STATUS(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("the size of axis data is not a whole number");
    c.name = "data:2,tensor:2";
    c.batch = 1;
    {
        td_test_data *d = td_test_data_create(gpt_json, 1, 1);
        td_step_result r;
        TD_ASSERT_OK(td_strategy_create(g, gpt_json, "mesh_gpt", &c, &s));
        TD_ASSERT_STATUS(td_strategy_step(s, &d->b[0], 0, &r, NULL), TD_ERR_INVALID_ARG);
        td_test_assert_message_contains("a batch of 1 samples for 2 replicas");
        td_strategy_destroy(s);
        td_test_data_destroy(d);
    }
    TD_ASSERT_OK(td_strategy_about_get("data:2,tensor:2", &a));
    assert_string_equal(a.name, "tensor");
    TD_ASSERT_OK(td_strategy_about_get("pipeline:4", &a));
    assert_string_equal(a.name, "pipeline");
    td_group_destroy(g);
}

/* cpu:1 fails in step 3 of data:2,tensor:2 (its 20th all-reduce, inside
 * its replica's backward, before any update): the other replica holds its
 * slices, so the three devices left carry on as tensor without a
 * checkpoint, take the step again, and end with one device's weights. */
static void a_lost_device_s_replica_carries_on(void **state) {
    static const char *const steps = "--steps 15 --precision f64 --batch 256 --no-epoch-eval";
    char *out, *lost;
    double d;
    (void)state;
    free(td_dp_train_cli("", "cpu:0", steps, "one256.st"));
    out = td_dp_train_cli("TANDEM_FAULT=cpu:1@allreduce:20:error ", "cpu*4",
                          "--steps 15 --precision f64 --batch 256 --no-epoch-eval "
                          "--strategy data:2,tensor:2",
                          "lost.st");
    lost = strstr(out, "lost: cpu:1 in step ");
    if (!lost || !strstr(lost, "the other devices trained on"))
        fail_msg("the run did not carry on after cpu:1: %s", out);
    free(out);
    d = td_dp_checkpoint_diff(td_test_tmp("lost.st"), td_test_tmp("one256.st"));
    printf("data:2,tensor:2 less cpu:1: differs from one device by %g\n", d);
    assert_true(d <= 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(an_mlp_trains_as_one_device),
        cmocka_unit_test(a_gpt_trains_as_one_device),
        cmocka_unit_test(checkpoints_move_to_and_from_the_mesh),
        cmocka_unit_test(meshes_not_built_are_refused),
        cmocka_unit_test(a_lost_device_s_replica_carries_on),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
