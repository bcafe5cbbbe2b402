/* Tensor-level ops of the Llama family: checks, then the device's kernel
 * (see ops.h and td_kernels). */
#include "tensor/tensor-impl.h"

td_status td__op_rmsnorm_fwd(double eps, const td_tensor *x, const td_tensor *w, td_tensor *y,
                             td_tensor *rstd) {
    const char *op = "rmsnorm_fwd";
    int64_t rows, cols;
    TD_CHECK(td__op_check_thread(y, op));
    TD_CHECK(td__op_check_like(y, x, 0, op, "x"));
    TD_CHECK(td__op_check_like(y, w, 0, op, "weight"));
    TD_CHECK(td__op_check_like(y, rstd, 0, op, "rstd"));
    rows = td__tensor_rows(x);
    cols = td__tensor_cols(x);
    TD_CHECK(td__op_check_numel(y, x->numel, op, "y"));
    TD_CHECK(td__op_check_numel(w, (size_t)cols, op, "weight"));
    TD_CHECK(td__op_check_numel(rstd, (size_t)rows, op, "rstd"));
    {
        KERNEL(y, rmsnorm_fwd);
        return k_->rmsnorm_fwd(ctx_, y->dtype, rows, cols, eps, x->data, w->data, y->data,
                               rstd->data);
    }
}

td_status td__op_rmsnorm_bwd(const td_tensor *x, const td_tensor *w, const td_tensor *rstd,
                             const td_tensor *dy, td_tensor *dx, td_tensor *dw, int acc) {
    const char *op = "rmsnorm_bwd";
    int64_t rows, cols;
    TD_CHECK(td__op_check_thread(x, op));
    TD_CHECK(td__op_check_like(x, w, 0, op, "weight"));
    TD_CHECK(td__op_check_like(x, rstd, 0, op, "rstd"));
    TD_CHECK(td__op_check_like(x, dy, 0, op, "dy"));
    TD_CHECK(td__op_check_like(x, dx, 1, op, "dx"));
    TD_CHECK(td__op_check_like(x, dw, 0, op, "dweight"));
    rows = td__tensor_rows(x);
    cols = td__tensor_cols(x);
    TD_CHECK(td__op_check_numel(dy, x->numel, op, "dy"));
    TD_CHECK(td__op_check_numel(dx, x->numel, op, "dx"));
    TD_CHECK(td__op_check_numel(w, (size_t)cols, op, "weight"));
    TD_CHECK(td__op_check_numel(dw, (size_t)cols, op, "dweight"));
    TD_CHECK(td__op_check_numel(rstd, (size_t)rows, op, "rstd"));
    {
        KERNEL(x, rmsnorm_bwd);
        return k_->rmsnorm_bwd(ctx_, x->dtype, rows, cols, x->data, w->data, rstd->data, dy->data,
                               dx ? dx->data : NULL, dw->data, acc);
    }
}

/* gu (.., 2f) against h (.., f) with as many rows. */
static td_status swiglu_shapes(const td_tensor *gu, const td_tensor *h, const char *op,
                               int64_t *rows, int64_t *f) {
    char s1[64], s2[64];
    *rows = td__tensor_rows(h);
    *f = td__tensor_cols(h);
    if (td__tensor_cols(gu) != 2 * *f || td__tensor_rows(gu) != *rows)
        return td__error(TD_ERR_SHAPE, "%s: gate and up %s do not match %s (twice its columns)", op,
                         td__shape_str(gu, s1), td__shape_str(h, s2));
    return TD_OK;
}

td_status td__op_swiglu_fwd(const td_tensor *gu, td_tensor *h) {
    const char *op = "swiglu_fwd";
    int64_t rows = 0, f = 0;
    TD_CHECK(td__op_check_thread(h, op));
    TD_CHECK(td__op_check_like(h, gu, 0, op, "gate and up"));
    TD_CHECK(swiglu_shapes(gu, h, op, &rows, &f));
    {
        KERNEL(h, swiglu_fwd);
        return k_->swiglu_fwd(ctx_, h->dtype, rows, f, gu->data, h->data);
    }
}

td_status td__op_swiglu_bwd(const td_tensor *gu, const td_tensor *dh, td_tensor *dgu) {
    const char *op = "swiglu_bwd";
    int64_t rows = 0, f = 0;
    TD_CHECK(td__op_check_thread(dgu, op));
    TD_CHECK(td__op_check_like(dgu, gu, 0, op, "gate and up"));
    TD_CHECK(td__op_check_like(dgu, dh, 0, op, "dh"));
    TD_CHECK(swiglu_shapes(gu, dh, op, &rows, &f));
    TD_CHECK(td__op_check_numel(dgu, gu->numel, op, "dgu"));
    {
        KERNEL(dgu, swiglu_bwd);
        return k_->swiglu_bwd(ctx_, dgu->dtype, rows, f, gu->data, dh->data, dgu->data);
    }
}

td_status td__op_rope(const td_tensor *tab, int64_t pos0, int64_t col, int64_t heads, int64_t d,
                      int inverse, td_tensor *x) {
    const char *op = "rope";
    char s1[64], s2[64];
    TD_CHECK(td__op_check_thread(x, op));
    TD_CHECK(td__op_check_like(x, tab, 0, op, "table"));
    if (x->ndim != 3 || tab->ndim != 3 || tab->shape[0] != 2 || d <= 0 || d % 2 ||
        tab->shape[2] != d / 2 || col < 0 || heads < 0 || col + heads * d > x->shape[2] ||
        pos0 < 0 || pos0 + x->shape[1] > tab->shape[1])
        return td__error(TD_ERR_SHAPE,
                         "%s: %lld heads of %lld from column %lld at positions from %lld: x %s is "
                         "not (b, t, width) or the table %s is not (2, positions, %lld)",
                         op, (long long)heads, (long long)d, (long long)col, (long long)pos0,
                         td__shape_str(x, s1), td__shape_str(tab, s2), (long long)(d / 2));
    {
        KERNEL(x, rope);
        return k_->rope(ctx_, x->dtype, x->shape[0], x->shape[1], x->shape[2], col, heads, d, pos0,
                        tab->shape[1], tab->data, inverse, x->data);
    }
}

/* raw (.., (h + 2 kv) d) against qkv (.., 3 h d). */
static td_status kv_shapes(td_kv_map m, int64_t d, const td_tensor *raw, const td_tensor *qkv,
                           const char *op, int64_t *rows) {
    char s1[64], s2[64];
    *rows = td__tensor_rows(qkv);
    if (m.h <= 0 || m.kv <= 0 || m.g <= 0 || m.skew < 0 || m.skew >= m.g || d <= 0 ||
        (m.h - 1 + m.skew) / m.g >= m.kv || td__tensor_cols(raw) != (m.h + 2 * m.kv) * d ||
        td__tensor_cols(qkv) != 3 * m.h * d || td__tensor_rows(raw) != *rows)
        return td__error(TD_ERR_SHAPE,
                         "%s: %lld query heads from %lld on, in groups of %lld, and %lld "
                         "key/value heads of %lld: %s and %s do not fit",
                         op, (long long)m.h, (long long)m.skew, (long long)m.g, (long long)m.kv,
                         (long long)d, td__shape_str(raw, s1), td__shape_str(qkv, s2));
    return TD_OK;
}

td_status td__op_kv_expand(td_kv_map m, int64_t d, const td_tensor *raw, td_tensor *qkv) {
    const char *op = "kv_expand";
    int64_t rows = 0;
    TD_CHECK(td__op_check_thread(qkv, op));
    TD_CHECK(td__op_check_like(qkv, raw, 0, op, "raw"));
    TD_CHECK(kv_shapes(m, d, raw, qkv, op, &rows));
    {
        KERNEL(qkv, kv_expand);
        return k_->kv_expand(ctx_, qkv->dtype, rows, m, d, raw->data, qkv->data);
    }
}

td_status td__op_kv_reduce(td_kv_map m, int64_t d, const td_tensor *dqkv, td_tensor *draw) {
    const char *op = "kv_reduce";
    int64_t rows = 0;
    TD_CHECK(td__op_check_thread(draw, op));
    TD_CHECK(td__op_check_like(draw, dqkv, 0, op, "dqkv"));
    TD_CHECK(kv_shapes(m, d, draw, dqkv, op, &rows));
    {
        KERNEL(draw, kv_reduce);
        return k_->kv_reduce(ctx_, draw->dtype, rows, m, d, dqkv->data, draw->data);
    }
}
