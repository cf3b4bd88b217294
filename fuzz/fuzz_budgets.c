/* fuzz_budgets.c — libFuzzer harness of the budget list parser (sim/replay.c, kvs_replay_parse_budgets: the
 * `--budgets 16,32,64` / `10%,20%` option of `kvsim replay`): the first two input bytes choose the prompt length
 * and position count (1..256 each, prompt <= positions), the rest, up to its first NUL, is the list. Every
 * budget accepted must be in [1, n_positions] with its fraction -1 (tokens) or in (0, 1]: what the parser
 * promises replay. Seeds: fuzz/corpus/budgets.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../sim/replay.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int64_t n_positions = 1 + data[0], prompt_len = 1 + data[1] % n_positions;
    char *text = kvs_fuzz_cstr(data + 2, size - 2);
    int64_t *budgets = NULL;
    double *fractions = NULL;
    int n = 0;
    if (kvs_replay_parse_budgets(text, prompt_len, n_positions, &budgets, &fractions, &n) == KVS_OK) {
        for (int i = 0; i < n; i++)
            if (budgets[i] < 1 || budgets[i] > n_positions ||
                !(fractions[i] == -1.0 || (fractions[i] > 0.0 && fractions[i] <= 1.0))) {
                fprintf(stderr, "\"%s\" (prompt %lld, positions %lld): budget %d = %lld, fraction %g\n", text,
                        (long long)prompt_len, (long long)n_positions, i, (long long)budgets[i], fractions[i]);
                abort();
            }
        free(budgets);
        free(fractions);
    }
    free(text);
    kvs_clear_error();
    return 0;
}
