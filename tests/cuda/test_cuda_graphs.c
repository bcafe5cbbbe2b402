/* The CUDA backend's training-step graphs and its staged copies: a step
 * replayed from a recorded graph gives what the eager step gives (losses,
 * hits, weights) for the MLP, LeNet-5 and a small GPT in f64 and f32; a batch
 * size change falls back to eager and records again; dropout keeps a model
 * eager; TANDEM_CUDA_GRAPHS=0 switches graphs off; a bad label in a replayed
 * step is still named. Copies: host<->device through the pinned staging
 * buffer for sizes around and above it, and device<->device staged through
 * pinned memory (TANDEM_CUDA_PEER=0) between logical GPUs. Skipped without a
 * CUDA device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support/support.h"

#ifndef TD_HAVE_CUDA
int main(void) {
    td_test_skip("no CUDA device (built without CUDA)");
}
#else

#include "nn/nn-impl.h"

#define STEPS 7

typedef struct model_case {
    const char *name, *json; /* json: a file under examples/ when it ends in .json */
    int64_t batch;
    int sgd;
} model_case;

static const char *gpt_small =
    "{\"name\": \"gpt_small\", \"input\": {\"tokens\": 16, \"vocab\": 40}, \"layers\": ["
    "{\"type\": \"embedding\", \"vocab\": 40, \"dim\": 32, \"positions\": true},"
    "{\"type\": \"repeat\", \"count\": 2, \"layers\": ["
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "  {\"type\": \"attention\", \"heads\": 4}]},"
    " {\"type\": \"residual\", \"layers\": [{\"type\": \"layernorm\"},"
    "  {\"type\": \"linear\", \"out\": 64}, {\"type\": \"gelu\"}, {\"type\": \"linear\", "
    "\"out\": 32}]}]},"
    "{\"type\": \"layernorm\"}, {\"type\": \"linear\", \"out\": 40}]}";

static const char *mlp_dropout =
    "{\"name\": \"mlp_dropout\", \"input\": {\"shape\": [20]}, \"layers\": ["
    "{\"type\": \"linear\", \"out\": 32}, {\"type\": \"relu\"}, {\"type\": \"dropout\", \"p\": "
    "0.25}, {\"type\": \"linear\", \"out\": 7}]}";

static td_model *load(const model_case *c, td_device *dev, td_dtype dt) {
    td_model *m = NULL;
    size_t len = strlen(c->json);
    if (len > 5 && !strcmp(c->json + len - 5, ".json")) {
        char path[512];
        snprintf(path, sizeof path, "%s/examples/%s", TD_SOURCE_DIR, c->json);
        TD_ASSERT_OK(td_model_load(path, dev, dt, 5, &m));
    } else {
        TD_ASSERT_OK(td_model_load_string(c->json, c->name, dev, dt, 5, &m));
    }
    return m;
}

/* Batch s of n samples for m, the same on every call. */
typedef struct host_batch {
    float *x;
    int32_t *tokens, *labels;
    td_batch b;
} host_batch;

static void make_batch(td_model *m, int64_t n, int s, host_batch *hb) {
    int64_t shape[TD_MAX_DIMS];
    int nd = td_model_input_shape(m, shape);
    size_t per = 1, nl;
    int64_t classes = td_model_num_classes(m);
    for (int i = 0; i < nd; i++)
        per *= (size_t)shape[i];
    memset(hb, 0, sizeof *hb);
    if (td_model_input_kind(m) == TD_INPUT_TOKENS) {
        nl = (size_t)n * per;
        hb->tokens = malloc(nl * sizeof *hb->tokens);
        for (size_t i = 0; i < nl; i++)
            hb->tokens[i] = (int32_t)(td_rng_uniform(71, (uint64_t)s * 100000 + i) * classes);
    } else {
        nl = (size_t)n;
        hb->x = malloc((size_t)n * per * sizeof *hb->x);
        for (size_t i = 0; i < (size_t)n * per; i++)
            hb->x[i] = (float)td_rng_normal(72, (uint64_t)s * 1000000 + i);
    }
    hb->labels = malloc(nl * sizeof *hb->labels);
    for (size_t i = 0; i < nl; i++)
        hb->labels[i] = (int32_t)(td_rng_uniform(73, (uint64_t)s * 100000 + i) * classes);
    hb->b = (td_batch){n, hb->x, hb->tokens, hb->labels};
}

static void free_batch(host_batch *hb) {
    free(hb->x);
    free(hb->tokens);
    free(hb->labels);
}

/* The batch size of step s: full, except one short step in the middle, after
 * which the graph is recorded again. */
static int64_t batch_of(const model_case *c, int s) {
    return s == 3 ? c->batch - 1 : c->batch;
}

typedef struct run {
    td_step_result res[STEPS];
    td_model *m;
    td_optimizer *opt;
} run;

static void train(const model_case *c, td_device *dev, td_dtype dt, run *r) {
    td_optimizer_config o = TD_OPTIMIZER_CONFIG_INIT;
    memset(r, 0, sizeof *r);
    r->m = load(c, dev, dt);
    o.kind = c->sgd ? TD_OPT_SGD : TD_OPT_ADAMW;
    o.lr = c->sgd ? 0.05 : 1e-3;
    o.clip_norm = c->sgd ? 0 : 1.0;
    TD_ASSERT_OK(td_optimizer_create(r->m, &o, &r->opt));
    for (int s = 0; s < STEPS; s++) {
        host_batch hb;
        int64_t n = batch_of(c, s);
        int64_t per = td_model_input_kind(r->m) == TD_INPUT_TOKENS ? r->m->in_shape[0] : 1;
        make_batch(r->m, n, s, &hb);
        TD_ASSERT_OK(
            td_model_train_step(r->m, &hb.b, 1.0 / (double)(n * per), 0, (uint64_t)s, &r->res[s]));
        TD_ASSERT_OK(td_optimizer_step(r->opt, NULL));
        free_batch(&hb);
    }
}

static void done(run *r) {
    td_optimizer_destroy(r->opt);
    td_model_destroy(r->m);
}

static double weights_diff(td_model *a, td_model *b) {
    double worst = 0;
    for (size_t p = 0; p < td_model_param_count(a); p++) {
        td_tensor *ta = td_model_param(a, p), *tb = td_model_param(b, p);
        size_t n = td_tensor_numel(ta);
        double *ha = malloc(n * sizeof *ha), *hb = malloc(n * sizeof *hb), scale = 1e-30, dd = 0;
        TD_ASSERT_OK(td_tensor_read_f64(ta, ha, n));
        TD_ASSERT_OK(td_tensor_read_f64(tb, hb, n));
        for (size_t i = 0; i < n; i++) {
            scale = fmax(scale, fabs(hb[i]));
            dd = fmax(dd, isnan(ha[i]) != isnan(hb[i]) ? INFINITY : fabs(ha[i] - hb[i]));
        }
        worst = fmax(worst, dd / scale);
        free(ha);
        free(hb);
    }
    return worst;
}

/* Opens cuda:0 with TANDEM_CUDA_GRAPHS as given (NULL: unset). */
static td_device_list *open_gpu(const char *graphs) {
    td_device_list *list;
    if (graphs)
        setenv("TANDEM_CUDA_GRAPHS", graphs, 1);
    else
        unsetenv("TANDEM_CUDA_GRAPHS");
    list = td_test_open("cuda:0");
    unsetenv("TANDEM_CUDA_GRAPHS");
    return list;
}

static void replay_equals_eager(const model_case *c, int expect_graphs) {
    td_device_list *on = open_gpu(NULL), *off = open_gpu("0");
    for (int d = 1; d >= 0; d--) {
        td_dtype dt = (td_dtype)d;
        double tol = dt == TD_F64 ? 1e-11 : 2e-5;
        run g, e;
        train(c, td_device_list_get(on, 0), dt, &g);
        train(c, td_device_list_get(off, 0), dt, &e);
        for (int s = 0; s < STEPS; s++) {
            double dl = fabs(g.res[s].loss_sum - e.res[s].loss_sum);
            if (!(dl <= tol * fmax(1, fabs(e.res[s].loss_sum))))
                fail_msg("%s %s step %d: loss %.17g replayed, %.17g eager", c->name,
                         td_dtype_name(dt), s, g.res[s].loss_sum, e.res[s].loss_sum);
            assert_int_equal(g.res[s].count, e.res[s].count);
            if (dt == TD_F64)
                assert_int_equal(g.res[s].correct, e.res[s].correct);
        }
        {
            double wd = weights_diff(g.m, e.m);
            printf("%s %s: %llu of %d steps replayed; weights differ from eager by %.3g\n", c->name,
                   td_dtype_name(dt), (unsigned long long)g.m->graph_replays, STEPS, wd);
            if (!(wd <= tol * 10))
                fail_msg("%s %s: weights differ from eager by %g", c->name, td_dtype_name(dt), wd);
        }
        /* Steps 0, 3 and 4 start a batch size and run eagerly; 1 and 5
         * record and replay; 2 and 6 replay. */
        if (expect_graphs)
            assert_true(g.m->graph_replays >= 4);
        else
            assert_int_equal(g.m->graph_replays, 0);
        assert_int_equal(e.m->graph_replays, 0);
        done(&g);
        done(&e);
    }
    td_device_list_destroy(on);
    td_device_list_destroy(off);
}

static void mlp_replays_like_eager(void **state) {
    static const model_case c = {"mnist_mlp", "mnist_mlp.json", 64, 1};
    replay_equals_eager(&c, 1);
}

static void lenet5_replays_like_eager(void **state) {
    static const model_case c = {"lenet5", "lenet5.json", 16, 1};
    replay_equals_eager(&c, 1);
}

static void gpt_replays_like_eager(void **state) {
    static const model_case c = {"gpt_small", NULL, 6, 0};
    model_case cc = c;
    cc.json = gpt_small;
    replay_equals_eager(&cc, 1);
}

static void dropout_stays_eager(void **state) {
    model_case c = {"mlp_dropout", NULL, 33, 1};
    c.json = mlp_dropout;
    replay_equals_eager(&c, 0);
}

static void a_bad_label_in_a_replay_is_named(void **state) {
    static const model_case c = {"mnist_mlp", "mnist_mlp.json", 32, 1};
    td_device_list *list = open_gpu(NULL);
    td_model *m = load(&c, td_device_list_get(list, 0), TD_F32);
    td_step_result r;
    host_batch hb;
    make_batch(m, c.batch, 0, &hb);
    for (int s = 0; s < 3; s++)
        TD_ASSERT_OK(td_model_train_step(m, &hb.b, 1.0 / 32, 0, 0, &r));
    assert_true(m->graph_replays >= 1);
    hb.labels[17] = 10; /* classes are 0..9 */
    TD_ASSERT_STATUS(td_model_train_step(m, &hb.b, 1.0 / 32, 0, 0, &r), TD_ERR_INVALID_ARG);
    td_test_assert_message_contains("row 17");
    free_batch(&hb);
    td_model_destroy(m);
    td_device_list_destroy(list);
}

/* Copies ------------------------------------------------------------------------ */

static unsigned char *pattern(size_t n, unsigned seed) {
    unsigned char *p = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i + seed) * 2246822519u >> 13);
    return p;
}

/* Writes, copies and reads sizes around the staging halves (half = 32 KiB
 * with TANDEM_CUDA_STAGING=64K) on list devices 0 -> 1, at an odd offset. */
static void copy_round_trip(td_device_list *list, const size_t *sizes, size_t nsizes) {
    for (size_t k = 0; k < nsizes; k++) {
        size_t n = sizes[k], off = 3;
        unsigned char *src = pattern(n, (unsigned)k), *dst = malloc(n + 1);
        td_buffer *a = NULL, *b = NULL;
        TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(list, 0), n + off, &a));
        TD_ASSERT_OK(td_buffer_alloc(td_device_list_get(list, 1), n + off, &b));
        TD_ASSERT_OK(td_buffer_write(a, off, src, n));
        memset(dst, 0, n + 1);
        TD_ASSERT_OK(td_buffer_read(a, off, dst, n));
        if (memcmp(dst, src, n))
            fail_msg("write then read of %zu bytes differs", n);
        TD_ASSERT_OK(td_buffer_copy(b, off, a, off, n));
        memset(dst, 0, n + 1);
        TD_ASSERT_OK(td_buffer_read(b, off, dst, n));
        if (memcmp(dst, src, n))
            fail_msg("device-to-device copy of %zu bytes differs", n);
        td_buffer_free(a);
        td_buffer_free(b);
        free(src);
        free(dst);
    }
}

static void small_staging_chunks_every_copy(void **state) {
    static const size_t sizes[] = {1,          32767,         32768,          32769,
                                   65536 + 17, 3 * 65536 + 5, (1u << 20) + 7, (9u << 20) + 1};
    td_device_list *list;
    setenv("TANDEM_CUDA_STAGING", "64K", 1);
    setenv("TANDEM_CUDA_PEER", "0", 1); /* device to device through pinned memory */
    list = td_test_open("cuda:0{split=2}");
    unsetenv("TANDEM_CUDA_STAGING");
    unsetenv("TANDEM_CUDA_PEER");
    copy_round_trip(list, sizes, sizeof sizes / sizeof *sizes);
    td_device_list_destroy(list);
}

static void default_staging_chunks_large_copies(void **state) {
    /* The default staging buffer is 8 MiB in two halves of 4 MiB. */
    static const size_t sizes[] = {(4u << 20) - 1, 4u << 20, (4u << 20) + 1, (8u << 20) + 3,
                                   (21u << 20) + 5};
    td_device_list *list;
    setenv("TANDEM_CUDA_PEER", "0", 1);
    list = td_test_open("cuda:0{split=2}");
    unsetenv("TANDEM_CUDA_PEER");
    copy_round_trip(list, sizes, sizeof sizes / sizeof *sizes);
    td_device_list_destroy(list);
}

/* A copy between devices waits for what the source's queue still computes. */
static void a_copy_waits_for_the_source(void **state) {
    td_device_list *list = td_test_open("cuda:0{split=2}");
    int64_t n = 1 << 24;
    td_tensor *a = NULL, *b = NULL;
    float *h = malloc((size_t)n * sizeof *h);
    TD_ASSERT_OK(td_tensor_create(td_device_list_get(list, 0), TD_F32, 1, &n, &a));
    TD_ASSERT_OK(td_tensor_create(td_device_list_get(list, 1), TD_F32, 1, &n, &b));
    for (int round = 0; round < 3; round++) {
        TD_ASSERT_OK(td_tensor_rand_normal(a, 5, 0, 0, 1)); /* queued, not waited for */
        TD_ASSERT_OK(td_tensor_fill(a, 1.5 + round));
        TD_ASSERT_OK(td_tensor_copy(b, a));
        TD_ASSERT_OK(td_tensor_read(b, h, (size_t)n * sizeof *h));
        for (int64_t i = 0; i < n; i += 4099)
            if (h[i] != (float)(1.5 + round))
                fail_msg("round %d: element %lld is %g, not %g", round, (long long)i, h[i],
                         1.5 + round);
    }
    free(h);
    td_tensor_destroy(a);
    td_tensor_destroy(b);
    td_device_list_destroy(list);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mlp_replays_like_eager),
        cmocka_unit_test(lenet5_replays_like_eager),
        cmocka_unit_test(gpt_replays_like_eager),
        cmocka_unit_test(dropout_stays_eager),
        cmocka_unit_test(a_bad_label_in_a_replay_is_named),
        cmocka_unit_test(small_staging_chunks_every_copy),
        cmocka_unit_test(default_staging_chunks_large_copies),
        cmocka_unit_test(a_copy_waits_for_the_source),
    };
    td_test_require_devices("cuda:0", "CUDA device");
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
