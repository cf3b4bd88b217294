/* kvs_stats.c — ranks, Spearman's rank correlation and SPD log-determinants; see kvs_stats.h. */
#include "kvs_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double v;
    size_t i;
} valued_index;

static int cmp_valued(const void *a, const void *b) {
    const valued_index *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i; /* a total order: qsort is not stable */
}

kvs_status kvs_ranks(const double *x, size_t n, double *rank) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) return kvs_fail(KVS_ERR_INVALID_ARG, "ranks: value %zu is NaN", i);
    if (n == 0) return KVS_OK;
    valued_index *s = malloc(n * sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "ranks: out of memory");
    for (size_t i = 0; i < n; i++) s[i] = (valued_index){x[i], i};
    qsort(s, n, sizeof *s, cmp_valued);
    for (size_t a = 0; a < n;) {
        size_t b = a + 1;
        while (b < n && s[b].v == s[a].v) b++;
        double r = 0.5 * (double)(a + 1 + b); /* mean of the 1-based ranks a+1 .. b */
        for (size_t k = a; k < b; k++) rank[s[k].i] = r;
        a = b;
    }
    free(s);
    return KVS_OK;
}

kvs_status kvs_spearman(const double *x, const double *y, size_t n, double *rho) {
    if (n < 2) return kvs_fail(KVS_ERR_INVALID_ARG, "spearman: needs at least 2 pairs, got %zu", n);
    double *rx = malloc(2 * n * sizeof *rx);
    if (!rx) return kvs_fail(KVS_ERR_NOMEM, "spearman: out of memory");
    double *ry = rx + n;
    kvs_status st = kvs_ranks(x, n, rx);
    if (st == KVS_OK) st = kvs_ranks(y, n, ry);
    if (st != KVS_OK) {
        free(rx);
        return st;
    }
    /* Both rankings have mean (n+1)/2; Pearson on the centred ranks. */
    double m = 0.5 * (double)(n + 1), sxy = 0, sxx = 0, syy = 0;
    for (size_t i = 0; i < n; i++) {
        double a = rx[i] - m, b = ry[i] - m;
        sxy += a * b;
        sxx += a * a;
        syy += b * b;
    }
    free(rx);
    *rho = sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : NAN;
    return KVS_OK;
}

kvs_status kvs_logdet_spd(const double *A, size_t d, double *logdet) {
    if (d == 0) {
        *logdet = 0;
        return KVS_OK;
    }
    double *L = malloc(d * d * sizeof *L);
    if (!L) return kvs_fail(KVS_ERR_NOMEM, "logdet: out of memory");
    memcpy(L, A, d * d * sizeof *L);
    double sum = 0;
    for (size_t j = 0; j < d; j++) {
        double diag = L[j * d + j];
        for (size_t k = 0; k < j; k++) diag -= L[j * d + k] * L[j * d + k];
        if (!(diag > 0)) {
            free(L);
            return kvs_fail(KVS_ERR_RANGE, "logdet: the matrix is not positive definite (pivot %zu is %g)", j, diag);
        }
        double ljj = sqrt(diag);
        L[j * d + j] = ljj;
        sum += log(ljj);
        for (size_t i = j + 1; i < d; i++) {
            double v = L[i * d + j];
            for (size_t k = 0; k < j; k++) v -= L[i * d + k] * L[j * d + k];
            L[i * d + j] = v / ljj;
        }
    }
    free(L);
    *logdet = 2 * sum;
    return KVS_OK;
}
