/* Helpers every benchmark program shares (bench/support/, compiled into
 * each bench_* executable). */
#ifndef TD_BENCH_SUPPORT_H
#define TD_BENCH_SUPPORT_H

/* Orders doubles ascending, for qsort. */
int td_bench_cmp_double(const void *a, const void *b);
/* The median of v[0..n) (the mean of the middle two when n is even); v is
 * left as it was. n > 0. */
double td_bench_median(const double *v, int n);
/* The whole of a file, NUL-terminated (free it), or NULL. */
char *td_bench_slurp(const char *path);

#endif
