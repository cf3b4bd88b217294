/* metrics.c — the metric table (see metrics.h). One line per metric, in kvs_metric order. */
#include "metrics.h"

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
