/* Digests of a mirror member's step, their comparison, and the bit flips
 * fault injection plans (mirror-impl.h).
 *
 * A digest reads every gradient (and on some steps every weight) back to
 * the host once: a hash of the bytes decides bitwise equality, and per
 * block of 64 values a projection on a fixed ±1 vector with the sum of
 * magnitudes decides equality within a tolerance, for devices whose sums
 * round differently. A flipped bit moves its block's projection by the
 * change itself, so a flip is caught under a tolerance as soon as the
 * change is larger than the tolerance's share of its block's magnitude. */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "parallel/mirror-impl.h"

td_status td__digest_init(td__digest *d, td_model *m) {
    int P = (int)td_model_param_count(m);
    size_t entries = 1 + 2 * (size_t)P;
    memset(d, 0, sizeof *d);
    d->params = P;
    d->hash = td__calloc(entries * sizeof *d->hash, "a mirror digest");
    d->first = td__calloc((entries + 1) * sizeof *d->first, "a mirror digest");
    if (!d->hash || !d->first) {
        td__digest_deinit(d);
        return TD_ERR_OUT_OF_MEMORY;
    }
    d->first[1] = 1; /* the loss */
    for (size_t e = 1; e < entries; e++) {
        size_t n = td_tensor_numel(td_model_param(m, (e - 1) % (size_t)P));
        d->first[e + 1] = d->first[e] + (n + TD_DIGEST_BLOCK - 1) / TD_DIGEST_BLOCK;
    }
    d->proj = td__calloc(d->first[entries] * sizeof *d->proj, "a mirror digest");
    d->scale = td__calloc(d->first[entries] * sizeof *d->scale, "a mirror digest");
    if (!d->proj || !d->scale) {
        td__digest_deinit(d);
        return TD_ERR_OUT_OF_MEMORY;
    }
    return TD_OK;
}

void td__digest_deinit(td__digest *d) {
    free(d->hash);
    free(d->first);
    free(d->proj);
    free(d->scale);
    memset(d, 0, sizeof *d);
}

void td__digest_swap(td__digest *a, td__digest *b) {
    td__digest t = *a;
    *a = *b;
    *b = t;
}

/* splitmix64's finaliser: every input bit moves every output bit. */
static uint64_t mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rotl(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

/* xxHash64's round: bijective in w for a given acc, so words that differ
 * leave lanes that differ. */
static uint64_t hash_round(uint64_t acc, uint64_t w) {
    acc += w * 0xc2b2ae3d27d4eb4full;
    return rotl(acc, 31) * 0x9e3779b185ebca87ull;
}

/* Four independent lanes, so the multiplies overlap: the digest of a
 * replica's gradients runs at memory speed, not at one multiply's latency
 * per word. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t v[4] = {1, 2, 3, 4}, w[4], tail = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        memcpy(w, b + i, 32);
        for (int k = 0; k < 4; k++)
            v[k] = hash_round(v[k], w[k]);
    }
    for (; i + 8 <= n; i += 8) {
        memcpy(w, b + i, 8);
        v[0] = hash_round(v[0], w[0]);
    }
    for (; i < n; i++)
        tail = (tail << 8) | b[i];
    v[1] = hash_round(v[1], tail);
    return mix(v[0] ^ rotl(v[1], 7) ^ rotl(v[2], 12) ^ rotl(v[3], 18) ^ n);
}

/* The projection's sign for element i: the top bit of a Fibonacci hash. */
static double sign_of(size_t i) {
    return ((uint64_t)i * 0x9e3779b97f4a7c15ull) >> 63 ? -1.0 : 1.0;
}

/* Entry e of d from n values of dtype dt at p; the blocks' projections
 * only for a comparison within a tolerance (not exact). */
static void digest_values(td__digest *d, int e, const void *p, size_t n, td_dtype dt, int exact) {
    assert(d->first[e] + (n + TD_DIGEST_BLOCK - 1) / TD_DIGEST_BLOCK == d->first[e + 1]);
    for (size_t i = 0; !exact && i < n; i += TD_DIGEST_BLOCK) {
        size_t b = d->first[e] + i / TD_DIGEST_BLOCK,
               end = i + TD_DIGEST_BLOCK < n ? i + TD_DIGEST_BLOCK : n;
        double proj = 0, scale = 0;
        for (size_t j = i; j < end; j++) {
            double v = dt == TD_F64 ? ((const double *)p)[j] : (double)((const float *)p)[j];
            proj += sign_of(j) * v;
            scale += fabs(v);
        }
        d->proj[b] = proj;
        d->scale[b] = scale;
    }
    d->hash[e] = hash_bytes(p, n * td_dtype_size(dt));
}

td_status td__digest_model(td_model *m, double loss_sum, int weights, int exact, void *scratch,
                           td__digest *d) {
    int P = d->params;
    assert((size_t)P == td_model_param_count(m));
    digest_values(d, 0, &loss_sum, 1, TD_F64, exact);
    for (int i = 0; i < P; i++) {
        td_tensor *g = td_model_grad(m, (size_t)i);
        TD_CHECK(td_tensor_read(g, scratch, td_tensor_nbytes(g)));
        digest_values(d, 1 + i, scratch, td_tensor_numel(g), td_tensor_dtype(g), exact);
    }
    d->has_weights = weights;
    for (int i = 0; weights && i < P; i++) {
        td_tensor *w = td_model_param(m, (size_t)i);
        TD_CHECK(td_tensor_read(w, scratch, td_tensor_nbytes(w)));
        digest_values(d, 1 + P + i, scratch, td_tensor_numel(w), td_tensor_dtype(w), exact);
    }
    return TD_OK;
}

static int entry_agrees(const td__digest *a, const td__digest *b, int e, td__digest_rule rule) {
    if (a->hash[e] == b->hash[e])
        return 1;
    if (rule.exact)
        return 0;
    for (size_t k = a->first[e]; k < a->first[e + 1]; k++)
        if (!(fabs(a->proj[k] - b->proj[k]) <= rule.tol * fmax(a->scale[k], b->scale[k])))
            return 0;
    return 1;
}

int td__digest_agree(const td__digest *a, const td__digest *b, td__digest_rule rule, int *entry) {
    int P = a->params, entries = 1 + P + (a->has_weights && b->has_weights ? P : 0);
    assert(a->params == b->params);
    for (int e = 0; e < entries; e++)
        if (!entry_agrees(a, b, e, rule)) {
            *entry = e;
            return 0;
        }
    return 1;
}

const char *td__digest_entry_name(td_model *m, int e, char *buf, size_t n) {
    int P = (int)td_model_param_count(m);
    if (e == 0)
        snprintf(buf, n, "the loss");
    else if (e <= P)
        snprintf(buf, n, "the gradient of %s", td_model_param_name(m, (size_t)e - 1));
    else
        snprintf(buf, n, "the weights %s", td_model_param_name(m, (size_t)(e - 1 - P)));
    return buf;
}

/* The lowest exponent bit of values[i]'s largest-magnitude element, flipped. */
static void flip_largest(void *values, size_t n, td_dtype dt) {
    size_t best = 0;
    if (!n)
        return;
    if (dt == TD_F64) {
        double *v = values;
        uint64_t bits;
        for (size_t i = 1; i < n; i++)
            best = fabs(v[i]) > fabs(v[best]) ? i : best;
        memcpy(&bits, &v[best], 8);
        bits ^= 1ull << 52;
        memcpy(&v[best], &bits, 8);
    } else {
        float *v = values;
        uint32_t bits;
        for (size_t i = 1; i < n; i++)
            best = fabsf(v[i]) > fabsf(v[best]) ? i : best;
        memcpy(&bits, &v[best], 4);
        bits ^= 1u << 23;
        memcpy(&v[best], &bits, 4);
    }
}

td_status td__flip_tensor(td_tensor *t, void *scratch) {
    TD_CHECK(td_tensor_read(t, scratch, td_tensor_nbytes(t)));
    flip_largest(scratch, td_tensor_numel(t), td_tensor_dtype(t));
    return td_tensor_write(t, scratch, td_tensor_nbytes(t));
}

void td__flip_batch(const td_batch *b, size_t values, float *xcopy, int32_t *tcopy, td_batch *out) {
    *out = *b;
    if (b->x) {
        memcpy(xcopy, b->x, values * sizeof *xcopy);
        flip_largest(xcopy, values, TD_F32);
        out->x = xcopy;
    } else if (b->tokens && values) {
        memcpy(tcopy, b->tokens, values * sizeof *tcopy);
        tcopy[0] = tcopy[0] ? tcopy[0] - 1 : 1; /* a neighbour id stays in the vocabulary */
        out->tokens = tcopy;
    }
}
