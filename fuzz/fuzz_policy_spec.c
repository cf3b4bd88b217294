/* fuzz_policy_spec.c — libFuzzer harness of the policy spec parser (sim/policy.c, kvs_policy_parse: "NAME",
 * "NAME:key=value,...", "NAME@PRESET[:...]"; the `--policy` option of `kvsim replay`): the input, as a string up
 * to its first NUL, is parsed; a spec that parses is re-parsed from its canonical form, which must give the same
 * canonical form (the parser's own round trip), and validated against a small model at a few budgets.
 * Seeds: fuzz/corpus/policy_spec; dictionary fuzz/dict/policy_spec.dict (policy, preset and parameter names).
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../sim/policy.h"
#include "../policies/registry.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *spec = kvs_fuzz_cstr(data, size);
    kvs_policy_config cfg;
    if (kvs_policy_parse(spec, &cfg) == KVS_OK) {
        char again[sizeof cfg.canonical + 128];
        snprintf(again, sizeof again, "%s%s%s", cfg.ops->name, cfg.canonical[0] ? ":" : "", cfg.canonical);
        kvs_policy_config cfg2;
        if (kvs_policy_parse(again, &cfg2) != KVS_OK || strcmp(cfg.canonical, cfg2.canonical) != 0) {
            fprintf(stderr, "canonical form does not round-trip: \"%s\" -> \"%s\": %s\n", spec, again,
                    kvs_last_error());
            abort();
        }
        kvs_policy_model m = {0};
        m.n_layers = 2;
        m.n_heads = 4;
        m.n_kv_heads = 2;
        m.group = 2;
        m.head_dim = 8;
        m.scale = 0.35f;
        m.kv_bytes = 2;
        m.aux_bytes = 4;
        m.max_seq_len = 128;
        m.n_positions = 64;
        m.prompt_len = 32;
        static const int64_t budgets[] = {1, 8, 64, 1000};
        char notes[512];
        for (int i = 0; i < 4; i++)
            if (kvs_policy_validate(&cfg, &m, budgets[i]) == KVS_OK)
                (void)kvs_policy_notes(&cfg, &m, budgets[i], notes, sizeof notes);
    }
    free(spec);
    kvs_clear_error();
    return 0;
}
