/* The tiles strategy: each image's conv layers on overlap tiles that the
 * devices pull from a queue. The stitched feature map equals the whole
 * image's, so evaluation gives one device's loss and counts bit for bit
 * (f64 and f32; LeNet-5 and a net with strides 2 and paddings on 40x40
 * images), on cpu*2, cpu*3 and a slowed pair; every tile is taken once;
 * a checkpoint moves through it; a model with nothing to tile is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/tiles-impl.h"
#include "support/dp_check.h"
#include "support/support.h"
#include "tandem/strategy.h"

#define SEED 11

/* conv 3x3 pad 1, max-pool, conv 3x3 stride 2 pad 1, relu, conv 5x5, then a classifier */
static const char *strided_json =
    "{\"name\": \"strided\", \"input\": {\"shape\": [2, 40, 40]}, \"layers\": ["
    "{\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    "{\"type\": \"maxpool\", \"kernel\": 2},"
    "{\"type\": \"conv2d\", \"out\": 6, \"kernel\": 3, \"stride\": 2, \"padding\": 1},"
    "{\"type\": \"relu\"}, {\"type\": \"conv2d\", \"out\": 5, \"kernel\": 3},"
    "{\"type\": \"avgpool\", \"kernel\": 2, \"stride\": 1},"
    "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 7}]}";

static char *lenet_json(void) {
    char path[512];
    size_t n;
    snprintf(path, sizeof path, "%s/examples/lenet5.json", TD_SOURCE_DIR);
    return (char *)td_test_read_file(path, &n);
}

/* `strategy` over spec evaluates the batches of d into res. */
static void evaluate(const char *strategy, const char *spec, const char *json, td_dtype dt,
                     const char *options, const td_dp_data *d, td_step_result *res,
                     td_strategy_report *words) {
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    td_run_figures f = {0};
    td_group *g = NULL;
    td_strategy *s = NULL;
    char plan[1024];
    c.name = strategy;
    c.dtype = dt;
    c.seed = SEED;
    c.options = options;
    TD_ASSERT_OK(td_group_create_spec(spec, NULL, &g));
    TD_ASSERT_OK(td_strategy_create(g, json, "tiles_test", &c, &s));
    if (words) {
        printf("%s", td_strategy_plan(s, plan, sizeof plan));
        TD_ASSERT_OK(td_strategy_save(s, td_test_tmp("tiles.safetensors"), NULL));
        TD_ASSERT_OK(td_strategy_load(s, td_test_tmp("tiles.safetensors"), NULL));
    }
    TD_ASSERT_OK(td_strategy_evaluate(s, d->batch, (size_t)d->steps, res));
    if (words)
        td_strategy_report_make(s, &f, words);
    td_strategy_destroy(s);
    td_group_destroy(g);
}

/* The tiles' total in a report's note: the numbers after each device. */
static long long tiles_taken(const char *note) {
    long long sum = 0;
    const char *at = strstr(note, "took:");
    assert_non_null(at);
    for (at += 5; *at;) {
        const char *sp = strchr(at + 1, ' ');
        if (!sp)
            break;
        sum += strtoll(sp + 1, NULL, 10);
        at = strchr(sp + 1, ' ') ? strchr(sp + 1, ' ') : sp + strlen(sp);
    }
    return sum;
}

static void equal_to_one_device(const char *json, int features, const char *options,
                                int tiles_an_image) {
    static const char *const specs[] = {"cpu*2", "cpu*3", "cpu:0,cpu:1{slowdown=3}"};
    td_dp_data *d = td_dp_data_create(3, 5, features, 7, 21, 22);
    for (int dt = 1; dt >= 0; dt--)
        for (size_t k = 0; k < sizeof specs / sizeof *specs; k++) {
            td_step_result one[3], tiled[3];
            td_strategy_report words;
            evaluate("single", "cpu:0", json, (td_dtype)dt, NULL, d, one, NULL);
            evaluate("tiles", specs[k], json, (td_dtype)dt, options, d, tiled, &words);
            printf("%s, %s: %s\n", specs[k], dt ? "f64" : "f32", words.note);
            for (int b = 0; b < d->steps; b++) {
                printf("  batch %d: loss sum %.17g, one device %.17g\n", b, tiled[b].loss_sum,
                       one[b].loss_sum);
                assert_true(tiled[b].loss_sum == one[b].loss_sum);
                assert_int_equal(tiled[b].correct, one[b].correct);
                assert_int_equal(tiled[b].count, one[b].count);
            }
            assert_int_equal(tiles_taken(words.note), (long long)tiles_an_image * d->steps);
        }
    td_dp_data_destroy(d);
}

static void lenet_tiled_equals_one_device(void **state) {
    char *json = lenet_json();
    (void)state;
    equal_to_one_device(json, 28 * 28, NULL, 9); /* a 5x5 map in tiles of 2: 3x3 */
    free(json);
}

static void strides_and_paddings_tiled_equal_one_device(void **state) {
    (void)state;
    /* 40 -> 40 -> 20 -> 10 -> 8 -> 7: tiles of 2 in a 4x4 grid */
    equal_to_one_device(strided_json, 2 * 40 * 40, "grid=4", 16);
}

/* A random conv net into json: 2 to 4 windows (conv2d of kernel 1, 3 or 5,
 * stride 1 or 2, any padding up to half the kernel; max or average pools
 * of 2 or 3), relus between, on a (c, h, w) image of 24 to 63 pixels a
 * side, then a classifier. */
static void random_net(uint64_t *r, char *json, size_t n, int *features) {
    int c = 1 + (int)(*r % 2), h = 24 + (int)((*r >> 8) % 40), w = 24 + (int)((*r >> 16) % 40);
    int windows = 2 + (int)((*r >> 24) % 3);
    size_t used = (size_t)snprintf(json, n,
                                   "{\"name\": \"random\", \"input\": {\"shape\": [%d, %d, %d]}, "
                                   "\"layers\": [",
                                   c, h, w);
    *features = c * h * w;
    for (int l = 0; l < windows; l++) {
        int k, s;
        *r = *r * 6364136223846793005ull + 1442695040888963407ull;
        k = 1 + 2 * (int)((*r >> 33) % 3);
        s = 1 + (int)((*r >> 40) % 2);
        if ((*r >> 45) % 3 == 0)
            used +=
                (size_t)snprintf(json + used, n - used, "{\"type\": \"%s\", \"kernel\": %d},",
                                 (*r >> 50) % 2 ? "maxpool" : "avgpool", 2 + (int)((*r >> 52) % 2));
        else
            used += (size_t)snprintf(json + used, n - used,
                                     "{\"type\": \"conv2d\", \"out\": 3, \"kernel\": %d, "
                                     "\"stride\": %d, \"padding\": %d}, {\"type\": \"relu\"},",
                                     k, s, (int)((*r >> 55) % (unsigned)(k / 2 + 1)));
    }
    snprintf(json + used, n - used,
             "{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 7}]}");
}

/* Random nets: every plan checks that each crop covers its tile's
 * receptive field (td__tiles_plan fails otherwise), and the tiles cover the
 * feature map once; the first few also evaluate as one device does. */
static void random_nets_tile_exactly(void **state) {
    uint64_t r = 12345;
    int planned = 0, evaluated = 0;
    (void)state;
    for (int i = 0; i < 300; i++) {
        char json[2048], *crop = NULL;
        int features, covered = 0;
        td_status st;
        td__tile_plan p;
        td_model_info info;
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        random_net(&r, json, sizeof json, &features);
        if (td_model_describe(json, "random", &info, NULL, 0) != TD_OK)
            continue; /* a map that shrank to nothing */
        st = td__tiles_plan(json, "random", 1 + (int)(r % 6), 1, &p, &crop);
        if (st == TD_ERR_INVALID_ARG)
            continue; /* one tile only */
        TD_ASSERT_OK(st);
        for (int t = 0; t < p.tiles; t++) {
            td__tile tl;
            td__tile_get(&p, t, &tl);
            assert_true(tl.ch0 >= 0 && tl.ch0 + p.crop_h <= p.h);
            assert_true(tl.cw0 >= 0 && tl.cw0 + p.crop_w <= p.w);
            covered += (int)((tl.oh1 - tl.oh0) * (tl.ow1 - tl.ow0));
        }
        assert_int_equal(covered, p.out_h * p.out_w);
        free(crop);
        planned++;
        if (evaluated < 6) {
            char opts[32];
            td_dp_data *d = td_dp_data_create(1, 3, features, 7, 31, 32);
            td_step_result one, tiled;
            snprintf(opts, sizeof opts, "grid=%d", p.grid_h > p.grid_w ? p.grid_h : p.grid_w);
            evaluate("single", "cpu:0", json, TD_F64, NULL, d, &one, NULL);
            evaluate("tiles", "cpu*2", json, TD_F64, opts, d, &tiled, NULL);
            printf("%s: %d tiles, loss sum %.17g, one device %.17g\n", json, p.tiles,
                   tiled.loss_sum, one.loss_sum);
            assert_true(tiled.loss_sum == one.loss_sum);
            td_dp_data_destroy(d);
            evaluated++;
        }
    }
    printf("%d random nets planned, %d evaluated\n", planned, evaluated);
    assert_true(planned >= 100 && evaluated == 6);
}

static void nothing_to_tile_is_refused(void **state) {
    char path[512], *mlp;
    size_t n;
    td_strategy_config c = TD_STRATEGY_CONFIG_INIT;
    td_group *g = NULL;
    td_strategy *s = NULL;
    (void)state;
    snprintf(path, sizeof path, "%s/examples/mnist_mlp.json", TD_SOURCE_DIR);
    mlp = (char *)td_test_read_file(path, &n);
    c.name = "tiles";
    TD_ASSERT_OK(td_group_create_spec("cpu*2", NULL, &g));
    TD_ASSERT_STATUS(td_strategy_create(g, mlp, "mnist_mlp", &c, &s), TD_ERR_UNSUPPORTED);
    printf("%s\n", td_last_error());
    assert_non_null(strstr(td_last_error(), "does not read images"));
    TD_ASSERT_STATUS(td_strategy_create(g,
                                        "{\"input\": {\"shape\": [1, 28, 28]}, \"layers\": ["
                                        "{\"type\": \"flatten\"}, {\"type\": \"linear\", "
                                        "\"out\": 10}]}",
                                        "flat", &c, &s),
                     TD_ERR_UNSUPPORTED);
    printf("%s\n", td_last_error());
    assert_non_null(strstr(td_last_error(), "flat has no spatial layers to tile"));
    c.options = "grid=1";
    TD_ASSERT_STATUS(td_strategy_create(g, strided_json, "strided", &c, &s), TD_ERR_INVALID_ARG);
    printf("%s\n", td_last_error());
    assert_non_null(strstr(td_last_error(), "no more than the 2 devices"));
    td_group_destroy(g);
    free(mlp);
}

/* `tandem ARGS`: its exit status, standard output and error (freed by the caller). */
static int tandem(const char *args, char **out, char **err) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", TD_TANDEM_EXE, args);
    return td_test_run_command(cmd, out, err);
}

/* `tandem eval` of ckpt's first 300 test images: the loss (to 9 digits
 * with --json in extra), and the output in *note. */
static double eval_loss(const char *ckpt, const char *devices, const char *extra, char **note) {
    char args[1024], *out = NULL, *err = NULL, *at;
    double loss;
    snprintf(args, sizeof args,
             "eval --checkpoint %s --data %s/data/mnist --samples 300 --batch 100 --devices '%s' "
             "%s",
             td_test_tmp(ckpt), TD_SOURCE_DIR, devices, extra);
    if (tandem(args, &out, &err) != 0)
        fail_msg("tandem %s: %s", args, err ? err : "");
    printf("%s", out);
    at = strstr(out, "loss");
    assert_non_null(at);
    loss = strtod(at + 6, NULL);
    *note = out;
    free(err);
    return loss;
}

static void tandem_eval_tiles(void **state) {
    char args[1024], *out = NULL, *err = NULL, *note = NULL;
    double one, tiled;
    (void)state;
    snprintf(args, sizeof args,
             "train --model %s/examples/lenet5.json --data %s/data/mnist --steps 3 --batch 32 "
             "--precision f64 --quiet --eval-samples 100 --no-epoch-eval --checkpoint %s",
             TD_SOURCE_DIR, TD_SOURCE_DIR, td_test_tmp("lenet.safetensors"));
    assert_int_equal(tandem(args, &out, &err), 0);
    free(out);
    free(err);
    one = eval_loss("lenet.safetensors", "cpu:0", "--json", &note);
    free(note);
    tiled = eval_loss("lenet.safetensors", "cpu:0,cpu:1{slowdown=3}",
                      "--json --strategy tiles --strategy-option grid=3", &note);
    printf("loss %.9g on one device, %.9g tiled\n", one, tiled);
    assert_true(tiled == one);
    free(note);
    eval_loss("lenet.safetensors", "cpu:0,cpu:1{slowdown=3}",
              "--strategy tiles --strategy-option grid=3", &note);
    assert_non_null(strstr(note, "tiles: 9 an image, 300 images; tiles each device took: cpu:0 "));
    free(note);
    /* a model with nothing to tile: exit 1 and why */
    snprintf(args, sizeof args,
             "train --model %s/examples/mnist_mlp.json --data %s/data/mnist --steps 1 --quiet "
             "--eval-samples 100 --no-epoch-eval --checkpoint %s",
             TD_SOURCE_DIR, TD_SOURCE_DIR, td_test_tmp("mlp.safetensors"));
    assert_int_equal(tandem(args, &out, &err), 0);
    free(out);
    free(err);
    snprintf(args, sizeof args,
             "eval --checkpoint %s --data %s/data/mnist --devices cpu*2 --strategy tiles",
             td_test_tmp("mlp.safetensors"), TD_SOURCE_DIR);
    assert_int_equal(tandem(args, &out, &err), 1);
    printf("%s", err);
    assert_non_null(strstr(err, "tiles: "));
    assert_non_null(strstr(err, "does not read images"));
    free(out);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lenet_tiled_equals_one_device),
        cmocka_unit_test(strides_and_paddings_tiled_equal_one_device),
        cmocka_unit_test(random_nets_tile_exactly),
        cmocka_unit_test(nothing_to_tile_is_refused),
        cmocka_unit_test(tandem_eval_tiles),
    };
    return cmocka_run_group_tests(tests, td_test_tmpdir_setup, td_test_tmpdir_teardown);
}
