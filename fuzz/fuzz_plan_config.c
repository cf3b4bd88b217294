/* fuzz_plan_config.c — libFuzzer harness of the capacity planner's model reader (analysis/plan.c:
 * kvs_plan_model_from_config, what `kvsim plan --config` reads; ../shared/DESIGN.md "Analysis: capacity
 * planning"): the input is a config.json. A shape that loads must be positive and consistent (KV heads dividing
 * the query heads), and planning it must give finite, non-negative sizes: the parameter count, the KV bytes per
 * token (2 · layers · KV heads · head_dim · bytes, checked against that product), and kvs_plan_eval for every
 * nominal policy kind on an 80 GB GPU (max batch and max context searched; max context never above memory's bound
 * nor the model's context), a per-query-head constant policy among them, or the "impossible memory" error when
 * the weights alone do not fit. Seeds: fuzz/corpus/plan_config (the shared and fixture configs, OPT and Qwen2
 * forms). Dictionary: fuzz/dict/plan_config.dict.
 */
#include "fuzz.h"

#include <math.h>

#include "../analysis/plan.h"
#include "../common/kvs.h"

static int sane(double x) { return isfinite(x) && x >= 0; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("config.json", data, size, path, sizeof path);
    kvs_plan_setup s = {.kv_elem_bytes = 2, .weight_elem_bytes = 2, .gpu_bytes = 80e9, .n_gpus = 1,
                        .reserve_bytes = 1e9};
    if (kvs_plan_model_from_config(path, &s.model) == KVS_OK) {
        const kvs_plan_model *m = &s.model;
        if (m->n_layers < 1 || m->n_heads < 1 || m->n_kv_heads < 1 || m->head_dim < 1 || m->hidden < 1 ||
            m->intermediate < 1 || m->vocab < 1 || m->max_positions < 0 || m->n_heads % m->n_kv_heads)
            abort();
        double kv = kvs_plan_kv_bytes_per_token(m, 2);
        if (kv != 2.0 * m->n_layers * m->n_kv_heads * m->head_dim * 2 || !sane(kvs_plan_params(m))) abort();
        const kvs_plan_policy pols[] = {{.kind = KVS_PLAN_FULL},
                                        {.kind = KVS_PLAN_CONSTANT, .budget = 1024},
                                        {.kind = KVS_PLAN_CONSTANT, .budget = 1024, .per_query_head = 1},
                                        {.kind = KVS_PLAN_PROMPT_ONLY, .budget = 256},
                                        {.kind = KVS_PLAN_OFFLOAD, .budget = 64}};
        for (size_t i = 0; i < sizeof pols / sizeof pols[0]; i++) {
            kvs_plan_point p;
            kvs_status st = kvs_plan_eval(&s, &pols[i], 4096, 1024, 8, &p);
            if (st == KVS_OK) {
                if (!sane(p.seq_device_bytes) || !sane(p.total_bytes) || !sane(p.host_bytes) ||
                    !sane(p.pcie_bytes_per_step) || p.max_batch < 0 || p.max_context < 0 ||
                    p.max_context > p.max_context_memory ||
                    (m->max_positions > 0 && p.max_context > (int64_t)m->max_positions))
                    abort();
            } else if (st != KVS_ERR_INVALID_ARG) {
                abort();
            }
            kvs_clear_error();
        }
    }
    kvs_clear_error();
    return 0;
}
