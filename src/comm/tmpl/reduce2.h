/* d = OP(a, b) element by element over T, written once and compiled by
 * reduce.c for each (NAME, T, OP). Not a header to include elsewhere.
 * d may equal a or b (in place), so loads of a block happen before its
 * stores. */
static void NAME(T *d, const T *a, const T *b, size_t n) {
    /* d, a, b: (n) */
    size_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        T t[BLOCK];
        for (int j = 0; j < BLOCK; j++) {
            T x = a[i + j], y = b[i + j];
            t[j] = OP(x, y);
        }
        for (int j = 0; j < BLOCK; j++)
            d[i + j] = t[j];
    }
    for (; i < n; i++) {
        T x = a[i], y = b[i];
        d[i] = OP(x, y);
    }
}

#undef NAME
#undef T
#undef OP
