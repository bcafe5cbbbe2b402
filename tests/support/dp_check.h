/* Data-parallel test support: fixed global batches, the single-device
 * reference they are checked against, and the checks that the `data`,
 * `pipeline` and `tensor` strategies over a group train like that
 * reference. Shared by tests/parallel/test_data_parallel.c,
 * tests/cuda/test_cuda_parallel.c and tests/opencl/test_opencl_parallel.c. */
#ifndef TD_TEST_DP_CHECK_H
#define TD_TEST_DP_CHECK_H

#include "support/support.h"
#include "tandem/parallel.h"
#include "tandem/strategy.h"

/* `steps` global batches of `size` samples each: features normal from
 * x_seed, labels uniform in [0, classes) from y_seed, the same on every run. */
typedef struct td_dp_data {
    int steps, size, features, classes;
    float *x;        /* (steps, size, features) */
    int32_t *y;      /* (steps, size) */
    td_batch *batch; /* (steps): batch[s] points into x and y */
} td_dp_data;

/* Makes the batches; fails the test if out of memory. The caller frees them
 * with td_dp_data_destroy(). */
td_dp_data *td_dp_data_create(int steps, int size, int features, int classes, uint64_t x_seed,
                              uint64_t y_seed);
/* NULL-safe. */
void td_dp_data_destroy(td_dp_data *d);

/* The reference: one model (json, named name, initialised from seed) on one
 * device, no strategy, trained with optimizer o over every batch of d; the
 * last step's result in *last. The caller destroys the model. */
td_model *td_dp_train_single(const char *json, const char *name, uint64_t seed,
                             const td_optimizer_config *o, td_device *dev, td_dtype dt,
                             const td_dp_data *d, td_step_result *last);

/* Largest |a - b| over two tensors of one size, relative to the largest |b|
 * (the plain difference when b is all zeros). */
double td_dp_tensor_diff(const td_tensor *a, const td_tensor *b);

/* The largest td_dp_tensor_diff over the parameters. */
double td_dp_weights_diff(td_model *a, td_model *b);

/* td_dp_weights_diff of two checkpoints' weights, loaded on cpu:0. */
double td_dp_checkpoint_diff(const char *path_a, const char *path_b);

/* Runs `[launcher ]tandem train` on the MNIST MLP (batch 64, lr 0.05, 200
 * test samples, quiet) on `devices` with the `extra` options, its checkpoint
 * saved as ckpt in the test directory; fails the test if it fails. Returns
 * its standard output, which the caller frees. launcher: "" or "mpirun
 * ...". */
char *td_dp_train_cli(const char *launcher, const char *devices, const char *extra,
                      const char *ckpt);

/* The same with the model file `model` instead of the MNIST MLP. */
char *td_dp_train_cli_model(const char *launcher, const char *model, const char *devices,
                            const char *extra, const char *ckpt);

/* Fails unless each of the first `members` replicas of dp equals ref within
 * tol, and the last step's result res is ref_res's for a batch of `batch`
 * samples; prints each replica's difference. `what` ("f64 on cpu*3", say)
 * starts the lines. */
void td_dp_assert_like_one_device(td_dp *dp, int members, td_model *ref, const td_step_result *res,
                                  const td_step_result *ref_res, int64_t batch, double tol,
                                  const char *what);

/* The backend check (the model, data and optimizer the CUDA and OpenCL
 * data-parallel tests share): an MLP 20-24-16-7 (gelu, relu) trained with
 * AdamW (lr 0.01, weight decay 0.01) on 4 batches of 41 samples. */
#define TD_DP_CHECK_STEPS 4
#define TD_DP_CHECK_BATCH 41 /* prime: no split is even */

/* The check's model as JSON, with "name": name, into json[0..n). */
void td_dp_check_model(const char *name, char *json, size_t n);
/* The check's batches; free with td_dp_data_destroy(). */
td_dp_data *td_dp_check_data(void);
/* The check's optimizer. */
td_optimizer_config td_dp_check_adamw(void);

/* Trains the check's model (named name) with the data strategy over the two
 * devices of spec, shares set unequal on purpose (speeds 1 and 2.5), in f64
 * and then f32, and fails unless every replica equals one CPU device within
 * 1e-12 (f64) or 1e-5 (f32), and the last step's count, correct and loss sum
 * match. Prints each replica's difference. */
void td_dp_check_equals_one_device(const char *spec, const char *name);

/* td_dp_weights_diff of a strategy's weights, saved to td_test_tmp and
 * loaded on cpu:0, against ref's. */
double td_strategy_weights_diff(td_strategy *s, td_model *ref);

/* The same model and batches through td_strategy_create's `strategy`
 * (pipeline: 4 micro-batches) over the devices of spec, with SGD and
 * momentum, whose update is linear in the gradients (AdamW magnifies the
 * rounding of near-zero gradients past the f32 tolerance under tensor's
 * sums); fails unless the weights, saved and loaded on cpu:0, equal one CPU
 * device's within 1e-12 (f64) or 1e-5 (f32) and the last step's count and
 * correct match. The checkpoint goes to td_test_tmp: the test program sets
 * up td_test_tmpdir_setup. */
void td_strategy_check_equals_one_device(const char *strategy, const char *spec, const char *name);

#endif
