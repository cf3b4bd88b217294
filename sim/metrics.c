/* metrics.c — the metric table (see metrics.h). One line per metric, in kvs_metric order. */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KVS_METRIC_ROW_(E, name, label, unit, kind, hib, help) [KVS_M_##E] = {#name, label, unit, help, kind, hib},
const kvs_metric_info kvs_metric_table[KVS_N_METRICS] = {KVS_METRIC_LIST(KVS_METRIC_ROW_)};
#undef KVS_METRIC_ROW_

const char *const kvs_stat_names[KVS_N_STATS] = {"n", "mean", "p50", "p95", "max", "min"};

int kvs_metric_find(const char *name) {
    for (int i = 0; i < KVS_N_METRICS; i++)
        if (name && !strcmp(kvs_metric_table[i].name, name)) return i;
    return -1;
}

/* The comparator of the sorted samples: ascending, NaN refused before. */
static int cmp_sample(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

kvs_status kvs_results_stat_compute(const double *samples, int64_t n, kvs_results_stat *out) {
    if (!out) return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: NULL output");
    memset(out, 0, sizeof *out);
    if (n < 0) return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: negative sample count %" PRId64, n);
    if (n == 0) return KVS_OK;
    if (!samples) return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: NULL samples for n = %" PRId64, n);
    if ((uint64_t)n > SIZE_MAX / sizeof(double))
        return kvs_fail(KVS_ERR_NOMEM, "stat_compute: %" PRId64 " samples do not fit in memory", n);
    /* NaN has no rank: sorting it would silently corrupt every percentile, so it is refused. */
    for (int64_t i = 0; i < n; i++)
        if (isnan(samples[i]))
            return kvs_fail(KVS_ERR_INVALID_ARG, "stat_compute: sample %" PRId64 " of %" PRId64 " is NaN", i, n);
    double *sorted = malloc((size_t)n * sizeof *sorted);
    if (!sorted) return kvs_fail(KVS_ERR_NOMEM, "stat_compute: out of memory for %" PRId64 " samples", n);
    memcpy(sorted, samples, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_sample);
    /* Kahan-compensated sum: runs aggregate up to millions of samples of very different magnitude. */
    double sum = 0.0, comp = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double y = sorted[i] - comp, t = sum + y;
        comp = (t - sum) - y;
        sum = t;
    }
    out->n = n;
    out->mean = sum / (double)n;
    out->min = sorted[0];
    out->max = sorted[n - 1];
    /* Nearest rank, index ceil(p*n)-1, in integer arithmetic so 0.95*20 cannot round up to 20. */
    out->p50 = sorted[(n + 1) / 2 - 1];
    out->p95 = sorted[(95 * n + 99) / 100 - 1];
    free(sorted);
    return KVS_OK;
}
