/* kvs_stats.c — ranks, Spearman's rank correlation and SPD log-determinants; see kvs_stats.h. */
#include "kvs_stats.h"
#include "kvs_rng.h"

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

double kvs_quantile_sorted(const double *x, size_t n, double q) {
    if (n == 1) return x[0];
    double pos = q * (double)(n - 1);
    size_t i = (size_t)floor(pos);
    if (i >= n - 1) return x[n - 1];
    double f = pos - (double)i;
    return x[i] + f * (x[i + 1] - x[i]);
}

static int cmp_double_asc(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

kvs_status kvs_bootstrap_mean(const double *x, size_t n, int reps, double level, uint64_t seed, kvs_interval *out) {
    if (n == 0 || reps < 1 || !(level > 0 && level < 1))
        return kvs_fail(KVS_ERR_INVALID_ARG, "bootstrap: n = %zu, reps = %d, level = %g (need n >= 1, reps >= 1, "
                                             "level in (0, 1))", n, reps, level);
    long double sum = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return kvs_fail(KVS_ERR_INVALID_ARG, "bootstrap: value %zu is not finite", i);
        sum += x[i];
    }
    *out = (kvs_interval){.mean = (double)(sum / (long double)n), .n = n, .level = level, .reps = reps};
    if (n == 1) { /* one unit: nothing to resample */
        out->lo = out->hi = out->mean;
        return KVS_OK;
    }
    double *means = malloc((size_t)reps * sizeof *means);
    if (!means) return kvs_fail(KVS_ERR_NOMEM, "bootstrap: out of memory");
    kvs_rng g;
    kvs_rng_seed(&g, seed, 0x626f6f74 /* "boot" */);
    for (int b = 0; b < reps; b++) {
        long double s = 0;
        for (size_t i = 0; i < n; i++) {
            /* a uniform unit: the 32-bit output scaled to [0, n) (n is a handful of traces: the bias is 2^-32 n) */
            size_t j = (size_t)(((uint64_t)kvs_rng_u32(&g) * (uint64_t)n) >> 32);
            s += x[j];
        }
        means[b] = (double)(s / (long double)n);
    }
    qsort(means, (size_t)reps, sizeof *means, cmp_double_asc);
    double a = (1.0 - level) / 2.0;
    out->lo = kvs_quantile_sorted(means, (size_t)reps, a);
    out->hi = kvs_quantile_sorted(means, (size_t)reps, 1.0 - a);
    free(means);
    return KVS_OK;
}

kvs_status kvs_bootstrap_mean_diff(const double *a, const double *b, size_t n, int reps, double level, uint64_t seed,
                                   kvs_interval *out) {
    if (n == 0) return kvs_bootstrap_mean(a, 0, reps, level, seed, out);
    double *d = malloc(n * sizeof *d);
    if (!d) return kvs_fail(KVS_ERR_NOMEM, "bootstrap: out of memory");
    for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    kvs_status st = kvs_bootstrap_mean(d, n, reps, level, seed, out);
    free(d);
    return st;
}

int kvs_interval_resolved(const kvs_interval *iv) {
    if (iv->n < 2) return 0;
    if (iv->lo > 0) return 1;
    if (iv->hi < 0) return -1;
    return 0;
}
