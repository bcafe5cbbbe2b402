/* Softmax cross-entropy over rows, written once over the element type T and compiled by
 * kern_nn.c for each (T, SFX, EXP, LOG). Not a header to include elsewhere. */
#ifndef TD_T_NAME
#define TD_T_CAT2(a, b) a##_##b
#define TD_T_CAT(a, b)  TD_T_CAT2(a, b)
#define TD_T_NAME(name) TD_T_CAT(name, SFX)
#endif

static void TD_T_NAME(xent_rows)(rows_args *a, size_t r0, size_t r1, int part) {
    /* rows [r0, r1) of x, dx: (rows, cols = classes); labels (rows) */
    const T *x = a->x;
    T *d = a->dx;
    int64_t c = a->cols;
    double loss = 0;
    int64_t correct = 0;
    for (size_t r = r0; r < r1; r++) {
        const T *row = x + (int64_t)r * c;
        int32_t label = a->labels[r];
        int64_t arg = 0;
        T mx = row[0];
        double sum = 0;
        if (label < 0 || label >= c) {
            if (a->bad_row[part] < 0)
                a->bad_row[part] = (int64_t)r;
            continue;
        }
        for (int64_t j = 1; j < c; j++)
            if (row[j] > mx) {
                mx = row[j];
                arg = j;
            }
        if (d) {
            T *drow = d + (int64_t)r * c;
            T inv, gs = (T)a->grad_scale;
            for (int64_t j = 0; j < c; j++) {
                drow[j] = EXP(row[j] - mx);
                sum += drow[j];
            }
            inv = (T)(1.0 / sum) * gs;
            for (int64_t j = 0; j < c; j++)
                drow[j] *= inv;
            drow[label] -= gs;
        } else {
            for (int64_t j = 0; j < c; j++)
                sum += EXP(row[j] - mx);
        }
        loss += log(sum) - (double)(row[label] - mx);
        correct += arg == label;
    }
    a->loss[part] = loss;
    a->correct[part] = correct;
}

#undef T
#undef EXP
#undef LOG
#undef SFX
