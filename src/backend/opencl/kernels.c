/* The td_kernels table for OpenCL: the kernels of td__ocl_source launched on
 * the device's in-order queue. Results that come back to the host (loss sums,
 * norms, bad labels or tokens) are read with blocking reads, so they are
 * final when the call returns; everything else is only queued. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/opencl/opencl-impl.h"
#include "core/error.h"

/* Launching ------------------------------------------------------------------- */

td_status td__ocl_begin(td_ocl_args *a, ocl_device *od, td_dtype dt, td_ocl_kernel_id id) {
    memset(a, 0, sizeof *a);
    a->od = od;
    a->dt = dt;
    a->id = id;
    return td__ocl_kernel(od, dt, id, &a->k);
}

static void arg_raw(td_ocl_args *a, size_t size, const void *value) {
    if (a->err == CL_SUCCESS && a->st == TD_OK) {
        cl_int err = clSetKernelArg(a->k, a->next, size, value);
        if (err != CL_SUCCESS) {
            a->err = err;
            a->bad = a->next;
        }
    }
    a->next++;
}

void td__ocl_arg_mem(td_ocl_args *a, cl_mem mem, size_t offset) {
    cl_ulong off = offset;
    arg_raw(a, sizeof mem, &mem);
    arg_raw(a, sizeof off, &off);
}

void td__ocl_arg_ptr(td_ocl_args *a, const void *devptr) {
    cl_mem mem = NULL;
    size_t off = 0;
    if (devptr && a->st == TD_OK)
        a->st = td__ocl_resolve(a->od, devptr, &mem, &off);
    td__ocl_arg_mem(a, mem, off);
}

void td__ocl_arg_u64(td_ocl_args *a, uint64_t v) {
    cl_ulong x = v;
    arg_raw(a, sizeof x, &x);
}

void td__ocl_arg_i64(td_ocl_args *a, int64_t v) {
    cl_long x = v;
    arg_raw(a, sizeof x, &x);
}

void td__ocl_arg_int(td_ocl_args *a, int v) {
    cl_int x = v;
    arg_raw(a, sizeof x, &x);
}

void td__ocl_arg_real(td_ocl_args *a, double v) {
    if (a->dt == TD_F64) {
        cl_double x = v;
        arg_raw(a, sizeof x, &x);
    } else {
        cl_float x = (cl_float)v;
        arg_raw(a, sizeof x, &x);
    }
}

void td__ocl_arg_acc(td_ocl_args *a, double v) {
    if (a->od->fp64) {
        cl_double x = v;
        arg_raw(a, sizeof x, &x);
    } else {
        cl_float x = (cl_float)v;
        arg_raw(a, sizeof x, &x);
    }
}

void td__ocl_arg_window(td_ocl_args *a, const td_conv_desc *d) {
    cl_long8 x;
    x.s[0] = d->h;
    x.s[1] = d->w;
    x.s[2] = d->oh;
    x.s[3] = d->ow;
    x.s[4] = d->kh;
    x.s[5] = d->kw;
    x.s[6] = d->stride;
    x.s[7] = d->pad;
    arg_raw(a, sizeof x, &x);
}

/* One work-item per item up to 2^30 (kernels loop beyond that): on CPU
 * devices a grid-stride loop over a small grid strides across pages, which
 * made a million-element add 10x slower on PoCL. Above one group's worth
 * the grid is a multiple of 64 so the runtime can pick whole groups. */
td_status td__ocl_run(td_ocl_args *a, size_t items) {
    size_t global = items;
    if (a->st != TD_OK)
        return a->st;
    if (a->err != CL_SUCCESS) {
        char call[96];
        snprintf(call, sizeof call, "clSetKernelArg(%s, %u)", td__ocl_kernel_name(a->id), a->bad);
        return td__ocl_status(a->err, call, a->od);
    }
    if (global == 0)
        return TD_OK;
    if (global > ((size_t)1 << 30))
        global = (size_t)1 << 30;
    else if (global > 64)
        global = (global + 63) / 64 * 64;
    {
        cl_int err =
            clEnqueueNDRangeKernel(a->od->queue, a->k, 1, NULL, &global, NULL, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            char call[96];
            snprintf(call, sizeof call, "clEnqueueNDRangeKernel(%s)", td__ocl_kernel_name(a->id));
            return td__ocl_status(err, call, a->od);
        }
    }
    return TD_OK;
}

/* Reads nbytes at (mem, off) into host memory, waiting for the queue. */
static td_status read_mem(ocl_device *od, cl_mem mem, size_t off, void *dst, size_t nbytes) {
    TD_OCL_CHECK(clEnqueueReadBuffer(od->queue, mem, CL_TRUE, off, nbytes, dst, 0, NULL, NULL), od);
    return TD_OK;
}

static td_status read_ptr(ocl_device *od, const void *src, void *dst, size_t nbytes) {
    cl_mem mem = NULL;
    size_t off = 0;
    td_status st = td__ocl_resolve(od, src, &mem, &off);
    return st != TD_OK ? st : read_mem(od, mem, off, dst, nbytes);
}

static size_t acc_size(const ocl_device *od) {
    return od->fp64 ? sizeof(cl_double) : sizeof(cl_float);
}

static double acc_at(const ocl_device *od, const unsigned char *p, size_t i) {
    if (od->fp64) {
        double v;
        memcpy(&v, p + i * sizeof v, sizeof v);
        return v;
    } else {
        float v;
        memcpy(&v, p + i * sizeof v, sizeof v);
        return v;
    }
}

/* Fill and RNG ------------------------------------------------------------------ */

static td_status ocl_fill(void *ctx, void *x, td_dtype dt, size_t n, double value) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_FILL));
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_real(&a, value);
    return td__ocl_run(&a, n);
}

static td_status ocl_rng(void *ctx, void *x, td_dtype dt, size_t n, td_rng_kind kind, uint64_t seed,
                         uint64_t offset, double lo, double hi) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_RNG));
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_int(&a, kind == TD_RNG_NORMAL);
    td__ocl_arg_u64(&a, seed);
    td__ocl_arg_u64(&a, offset);
    td__ocl_arg_acc(&a, lo);
    td__ocl_arg_acc(&a, hi);
    return td__ocl_run(&a, n);
}

/* Elementwise ----------------------------------------------------------------- */

static td_status ocl_act_fwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x, void *y) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_ACT_FWD));
    td__ocl_arg_int(&a, (int)act);
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, y);
    return td__ocl_run(&a, n);
}

static td_status ocl_act_bwd(void *ctx, td_dtype dt, td_act act, size_t n, const void *x,
                             const void *y, const void *dy, void *dx) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_ACT_BWD));
    td__ocl_arg_int(&a, (int)act);
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_ptr(&a, dy);
    td__ocl_arg_ptr(&a, dx);
    return td__ocl_run(&a, n);
}

static td_status ocl_add(void *ctx, td_dtype dt, size_t n, const void *x, const void *y, void *z) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_ADD));
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_ptr(&a, z);
    return td__ocl_run(&a, n);
}

static td_status ocl_axpby(void *ctx, td_dtype dt, size_t n, double alpha, const void *x,
                           double beta, void *y) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_AXPBY));
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_real(&a, alpha);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_real(&a, beta);
    td__ocl_arg_ptr(&a, y);
    return td__ocl_run(&a, n);
}

static td_status ocl_dropout(void *ctx, td_dtype dt, size_t n, double p, uint64_t seed,
                             uint64_t offset, const void *x, void *y) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_DROPOUT));
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_acc(&a, p);
    td__ocl_arg_acc(&a, 1.0 / (1.0 - p));
    td__ocl_arg_u64(&a, seed);
    td__ocl_arg_u64(&a, offset);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, y);
    return td__ocl_run(&a, n);
}

/* Partial sums over fixed chunks, added on the host in chunk order: the
 * result does not depend on how the device schedules them. */
static td_status ocl_sumsq(void *ctx, td_dtype dt, size_t n, const void *x, double *out) {
    ocl_device *od = ctx;
    td_ocl_args a;
    size_t parts = n < 4096 ? 1 : (n + 4095) / 4096, chunk;
    unsigned char host[256 * sizeof(double)];
    cl_mem part = NULL;
    *out = 0;
    if (n == 0)
        return TD_OK;
    if (parts > 256)
        parts = 256;
    chunk = (n + parts - 1) / parts;
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_SUMSQ));
    TD_CHECK(td__ocl_scratch(od, parts * acc_size(od), &part));
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_u64(&a, chunk);
    td__ocl_arg_u64(&a, parts);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_mem(&a, part, 0);
    TD_CHECK(td__ocl_run(&a, parts));
    TD_CHECK(read_mem(od, part, 0, host, parts * acc_size(od)));
    for (size_t i = 0; i < parts; i++)
        *out += acc_at(od, host, i);
    return TD_OK;
}

static td_status ocl_sgd(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *buf,
                         const td_opt_args *o) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_SGD));
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_ptr(&a, w);
    td__ocl_arg_ptr(&a, g);
    td__ocl_arg_ptr(&a, buf);
    td__ocl_arg_int(&a, buf != NULL);
    td__ocl_arg_real(&a, o->grad_mul);
    td__ocl_arg_real(&a, o->weight_decay);
    td__ocl_arg_real(&a, o->momentum);
    td__ocl_arg_real(&a, -o->lr);
    td__ocl_arg_int(&a, o->first);
    td__ocl_arg_int(&a, o->nesterov);
    return td__ocl_run(&a, n);
}

/* The scalars are rounded to the element type on the host, as the CPU does. */
static td_status ocl_adamw(void *ctx, td_dtype dt, size_t n, void *w, const void *g, void *m,
                           void *v, const td_opt_args *o) {
    td_ocl_args a;
    if (n == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_ADAMW));
    td__ocl_arg_u64(&a, n);
    td__ocl_arg_ptr(&a, w);
    td__ocl_arg_ptr(&a, g);
    td__ocl_arg_ptr(&a, m);
    td__ocl_arg_ptr(&a, v);
    td__ocl_arg_real(&a, 1.0 - o->lr * o->weight_decay);
    td__ocl_arg_real(&a, o->beta1);
    td__ocl_arg_real(&a, o->beta2);
    td__ocl_arg_real(&a, 1.0 - o->beta1);
    td__ocl_arg_real(&a, 1.0 - o->beta2);
    td__ocl_arg_real(&a, o->grad_mul);
    td__ocl_arg_real(&a, -o->lr / o->bias_corr1);
    td__ocl_arg_real(&a, 1.0 / sqrt(o->bias_corr2));
    td__ocl_arg_real(&a, o->eps);
    return td__ocl_run(&a, n);
}

/* Bias ---------------------------------------------------------------------------- */

static td_status ocl_bias_add(void *ctx, td_dtype dt, void *y, const void *bias, int64_t outer,
                              int64_t c, int64_t inner) {
    td_ocl_args a;
    size_t n = (size_t)(outer * c * inner);
    if (outer <= 0 || c <= 0 || inner <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_BIAS_ADD));
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_ptr(&a, bias);
    td__ocl_arg_u64(&a, (uint64_t)outer);
    td__ocl_arg_u64(&a, (uint64_t)c);
    td__ocl_arg_u64(&a, (uint64_t)inner);
    return td__ocl_run(&a, n);
}

td_status td__ocl_bias_grad(void *ctx, td_dtype dt, void *db, const void *dy, int64_t outer,
                            int64_t c, int64_t inner, int acc) {
    td_ocl_args a;
    if (c <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_BIAS_GRAD));
    td__ocl_arg_ptr(&a, db);
    td__ocl_arg_ptr(&a, outer > 0 && inner > 0 ? dy : NULL);
    td__ocl_arg_u64(&a, (uint64_t)(outer > 0 && inner > 0 ? outer : 0));
    td__ocl_arg_u64(&a, (uint64_t)c);
    td__ocl_arg_u64(&a, (uint64_t)(inner > 0 ? inner : 0));
    td__ocl_arg_int(&a, acc);
    return td__ocl_run(&a, (size_t)c);
}

/* Rows ------------------------------------------------------------------------------ */

/* Per-row losses and verdicts come back and are added in row order. */
static td_status ocl_xent(void *ctx, td_dtype dt, int64_t rows, int64_t classes, const void *logits,
                          const int32_t *labels, void *dlogits, double grad_scale, double *loss_sum,
                          int64_t *correct) {
    ocl_device *od = ctx;
    td_ocl_args a;
    size_t as = acc_size(od), loss_bytes = ((size_t)rows * as + 255) / 256 * 256;
    size_t nbytes = loss_bytes + (size_t)rows * sizeof(cl_int);
    unsigned char *host = NULL;
    cl_mem scratch = NULL;
    td_status st;
    *loss_sum = 0;
    *correct = 0;
    if (rows <= 0)
        return TD_OK;
    if (classes <= 0)
        return td__error(TD_ERR_INVALID_ARG, "cross-entropy over %lld classes", (long long)classes);
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_XENT));
    TD_CHECK(td__ocl_scratch(od, nbytes, &scratch));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)classes);
    td__ocl_arg_ptr(&a, logits);
    td__ocl_arg_ptr(&a, labels);
    td__ocl_arg_ptr(&a, dlogits);
    td__ocl_arg_int(&a, dlogits != NULL);
    td__ocl_arg_real(&a, grad_scale);
    td__ocl_arg_mem(&a, scratch, 0);
    td__ocl_arg_mem(&a, scratch, loss_bytes);
    TD_CHECK(td__ocl_run(&a, (size_t)rows));
    if (!(host = malloc(nbytes)))
        return td__error(TD_ERR_OUT_OF_MEMORY, "%s: cross-entropy: no host memory for %lld rows",
                         od->name, (long long)rows);
    if ((st = read_mem(od, scratch, 0, host, nbytes)) != TD_OK)
        goto done;
    for (int64_t r = 0; r < rows; r++) {
        cl_int verdict;
        memcpy(&verdict, host + loss_bytes + (size_t)r * sizeof verdict, sizeof verdict);
        if (verdict < 0) {
            int32_t label = 0;
            (void)read_ptr(od, labels + r, &label, sizeof label);
            st = td__error(TD_ERR_INVALID_ARG,
                           "cross-entropy on %s: label %d at row %lld is outside [0, %lld)",
                           od->name, (int)label, (long long)r, (long long)classes);
            goto done;
        }
        *loss_sum += acc_at(od, host, (size_t)r);
        *correct += verdict;
    }
    st = TD_OK;
done:
    free(host);
    if (st != TD_OK) {
        *loss_sum = 0;
        *correct = 0;
    }
    return st;
}

static td_status ocl_layernorm_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols, double eps,
                                   const void *x, const void *gamma, const void *beta, void *y,
                                   void *mean, void *rstd) {
    td_ocl_args a;
    if (rows <= 0 || cols <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_LAYERNORM_FWD));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)cols);
    td__ocl_arg_real(&a, eps);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, gamma);
    td__ocl_arg_ptr(&a, beta);
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_ptr(&a, mean);
    td__ocl_arg_ptr(&a, rstd);
    return td__ocl_run(&a, (size_t)rows);
}

static td_status ocl_layernorm_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t cols,
                                   const void *x, const void *gamma, const void *mean,
                                   const void *rstd, const void *dy, void *dx, void *dgamma,
                                   void *dbeta, int acc) {
    td_ocl_args a;
    if (cols <= 0)
        return TD_OK;
    if (rows < 0)
        rows = 0;
    if (dx && rows > 0) {
        TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_LAYERNORM_BWD_DX));
        td__ocl_arg_u64(&a, (uint64_t)rows);
        td__ocl_arg_u64(&a, (uint64_t)cols);
        td__ocl_arg_ptr(&a, x);
        td__ocl_arg_ptr(&a, gamma);
        td__ocl_arg_ptr(&a, mean);
        td__ocl_arg_ptr(&a, rstd);
        td__ocl_arg_ptr(&a, dy);
        td__ocl_arg_ptr(&a, dx);
        TD_CHECK(td__ocl_run(&a, (size_t)rows));
    }
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_LAYERNORM_BWD_PARAMS));
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)cols);
    td__ocl_arg_ptr(&a, rows ? x : NULL);
    td__ocl_arg_ptr(&a, rows ? mean : NULL);
    td__ocl_arg_ptr(&a, rows ? rstd : NULL);
    td__ocl_arg_ptr(&a, rows ? dy : NULL);
    td__ocl_arg_ptr(&a, dgamma);
    td__ocl_arg_ptr(&a, dbeta);
    td__ocl_arg_int(&a, acc);
    return td__ocl_run(&a, (size_t)cols);
}

static td_status ocl_causal_softmax_fwd(void *ctx, td_dtype dt, int64_t rows, int64_t t,
                                        double scale, const void *s, void *p) {
    td_ocl_args a;
    if (rows <= 0 || t <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_CAUSAL_SOFTMAX_FWD));
    td__ocl_arg_u64(&a, (uint64_t)(rows * t));
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_real(&a, scale);
    td__ocl_arg_ptr(&a, s);
    td__ocl_arg_ptr(&a, p);
    return td__ocl_run(&a, (size_t)(rows * t));
}

static td_status ocl_causal_softmax_bwd(void *ctx, td_dtype dt, int64_t rows, int64_t t,
                                        double scale, const void *p, const void *dp, void *ds) {
    td_ocl_args a;
    if (rows <= 0 || t <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_CAUSAL_SOFTMAX_BWD));
    td__ocl_arg_u64(&a, (uint64_t)(rows * t));
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_real(&a, scale);
    td__ocl_arg_ptr(&a, p);
    td__ocl_arg_ptr(&a, dp);
    td__ocl_arg_ptr(&a, ds);
    return td__ocl_run(&a, (size_t)(rows * t));
}

/* Embeddings -------------------------------------------------------------------------- */

/* A device flag gets the first bad position; it is read back before return. */
static td_status ocl_embed_fwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c,
                               int64_t vocab, const int32_t *tokens, const void *wte,
                               const void *wpe, void *y) {
    ocl_device *od = ctx;
    td_ocl_args a;
    cl_mem flag = NULL;
    cl_int none = INT_MAX, bad = INT_MAX;
    int64_t rows = b * t;
    if (rows <= 0 || c <= 0)
        return TD_OK;
    if (rows >= INT_MAX)
        return td__error(TD_ERR_INVALID_ARG, "%s: embedding of %lld positions is too large",
                         od->name, (long long)rows);
    TD_CHECK(td__ocl_begin(&a, od, dt, TD_OCL_K_EMBED_FWD));
    TD_CHECK(td__ocl_scratch(od, sizeof(cl_int), &flag));
    TD_OCL_CHECK(
        clEnqueueFillBuffer(od->queue, flag, &none, sizeof none, 0, sizeof none, 0, NULL, NULL),
        od);
    td__ocl_arg_u64(&a, (uint64_t)rows);
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_u64(&a, (uint64_t)c);
    td__ocl_arg_i64(&a, vocab);
    td__ocl_arg_ptr(&a, tokens);
    td__ocl_arg_ptr(&a, wte);
    td__ocl_arg_ptr(&a, wpe);
    td__ocl_arg_int(&a, wpe != NULL);
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_mem(&a, flag, 0);
    TD_CHECK(td__ocl_run(&a, (size_t)(rows * c)));
    TD_CHECK(read_mem(od, flag, 0, &bad, sizeof bad));
    if (bad != INT_MAX) {
        int32_t tok = 0;
        (void)read_ptr(od, tokens + bad, &tok, sizeof tok);
        return td__error(TD_ERR_INVALID_ARG,
                         "embedding on %s: token %d at (%lld, %lld) is outside [0, %lld)", od->name,
                         (int)tok, (long long)(bad / t), (long long)(bad % t), (long long)vocab);
    }
    return TD_OK;
}

static td_status ocl_embed_bwd(void *ctx, td_dtype dt, int64_t b, int64_t t, int64_t c,
                               int64_t vocab, const int32_t *tokens, const void *dy, void *dwte,
                               void *dwpe, int acc) {
    td_ocl_args a;
    if (c <= 0)
        return TD_OK;
    if (!acc) {
        TD_CHECK(ocl_fill(ctx, dwte, dt, (size_t)(vocab * c), 0.0));
        if (dwpe)
            TD_CHECK(ocl_fill(ctx, dwpe, dt, (size_t)(t * c), 0.0));
    }
    if (b * t <= 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_EMBED_BWD));
    td__ocl_arg_u64(&a, (uint64_t)(b * t));
    td__ocl_arg_u64(&a, (uint64_t)t);
    td__ocl_arg_u64(&a, (uint64_t)c);
    td__ocl_arg_i64(&a, vocab);
    td__ocl_arg_ptr(&a, tokens);
    td__ocl_arg_ptr(&a, dy);
    td__ocl_arg_ptr(&a, dwte);
    td__ocl_arg_ptr(&a, dwpe);
    td__ocl_arg_int(&a, dwpe != NULL);
    return td__ocl_run(&a, (size_t)c);
}

/* Pooling ------------------------------------------------------------------------------ */

static td_status ocl_pool_fwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                              const void *x, void *y, int32_t *argmax) {
    td_ocl_args a;
    size_t planes = (size_t)(d->n * d->c);
    if (planes == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_POOL_FWD));
    td__ocl_arg_int(&a, kind == TD_POOL_AVG);
    td__ocl_arg_u64(&a, planes);
    td__ocl_arg_window(&a, d);
    td__ocl_arg_ptr(&a, x);
    td__ocl_arg_ptr(&a, y);
    td__ocl_arg_ptr(&a, kind == TD_POOL_MAX ? argmax : NULL);
    td__ocl_arg_int(&a, kind == TD_POOL_MAX && argmax != NULL);
    return td__ocl_run(&a, planes * (size_t)(d->oh * d->ow));
}

static td_status ocl_pool_bwd(void *ctx, td_dtype dt, td_pool_kind kind, const td_conv_desc *d,
                              const void *dy, const int32_t *argmax, void *dx) {
    td_ocl_args a;
    size_t planes = (size_t)(d->n * d->c);
    if (kind == TD_POOL_MAX && !argmax)
        return td__error(TD_ERR_INVALID_ARG, "max-pool backward without the forward's arg-max");
    if (planes == 0)
        return TD_OK;
    TD_CHECK(td__ocl_begin(&a, ctx, dt, TD_OCL_K_POOL_BWD));
    td__ocl_arg_int(&a, kind == TD_POOL_AVG);
    td__ocl_arg_u64(&a, planes);
    td__ocl_arg_window(&a, d);
    td__ocl_arg_ptr(&a, dy);
    td__ocl_arg_ptr(&a, kind == TD_POOL_MAX ? argmax : NULL);
    td__ocl_arg_ptr(&a, dx);
    return td__ocl_run(&a, planes * (size_t)(d->h * d->w));
}

const td_kernels td__opencl_kernels = {
    .fill = ocl_fill,
    .rng = ocl_rng,
    .gemm = td__ocl_gemm,
    .gemm_batched = td__ocl_gemm_batched,
    .bias_add = ocl_bias_add,
    .bias_grad = td__ocl_bias_grad,
    .act_fwd = ocl_act_fwd,
    .act_bwd = ocl_act_bwd,
    .add = ocl_add,
    .axpby = ocl_axpby,
    .dropout = ocl_dropout,
    .xent = ocl_xent,
    .layernorm_fwd = ocl_layernorm_fwd,
    .layernorm_bwd = ocl_layernorm_bwd,
    .embed_fwd = ocl_embed_fwd,
    .embed_bwd = ocl_embed_bwd,
    .conv2d_fwd = td__ocl_conv2d_fwd,
    .conv2d_bwd = td__ocl_conv2d_bwd,
    .pool_fwd = ocl_pool_fwd,
    .pool_bwd = ocl_pool_bwd,
    .causal_softmax_fwd = ocl_causal_softmax_fwd,
    .causal_softmax_bwd = ocl_causal_softmax_bwd,
    .attention_fwd = td__ocl_attention_fwd,
    .attention_bwd = td__ocl_attention_bwd,
    .rmsnorm_fwd = td__ocl_rmsnorm_fwd,
    .rmsnorm_bwd = td__ocl_rmsnorm_bwd,
    .swiglu_fwd = td__ocl_swiglu_fwd,
    .swiglu_bwd = td__ocl_swiglu_bwd,
    .rope = td__ocl_rope,
    .kv_expand = td__ocl_kv_expand,
    .kv_reduce = td__ocl_kv_reduce,
    .matmul_compact = td__ocl_matmul_compact,
    .convert_half = td__ocl_convert_half,
    .attend_step = td__ocl_attend_step,
    .sumsq = ocl_sumsq,
    .sgd = ocl_sgd,
    .adamw = ocl_adamw,
};
