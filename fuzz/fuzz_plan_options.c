/* fuzz_plan_options.c — libFuzzer harness of the option strings `kvsim plan` parses (analysis/plan.c): the first
 * byte picks the parser, the rest is the option's text: a preset name (kvs_plan_preset_find, --model), a dtype
 * (kvs_plan_dtype_bytes, --kv-dtype / --weights), a --responses list (kvs_plan_parse_list) or a --settings list
 * (kvs_plan_parse_settings). Accepted values must be what the option documents: a preset whose name matches the
 * text case-insensitively; 0.5, 1, 2 or 4 bytes; at most KVS_PLAN_MAX_LIST numbers in range, each list item
 * printing back to its decimal text modulo sign and leading zeros. Seeds: fuzz/corpus/plan_options.
 */
#include "fuzz.h"

#include <strings.h>

#include "../analysis/plan.h"
#include "../common/kvs.h"

/* Every item of a comma list parsed into v[0..n): the list has n items. */
static void check_items(const char *text, int n) {
    int items = 1;
    for (const char *p = text; *p; p++) items += *p == ',';
    if (items - (text[strlen(text) - 1] == ',') != n) abort(); /* one trailing comma is accepted */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *text = kvs_fuzz_cstr(data + 1, size - 1);
    if (strlen(text) != size - 1) { /* an option value never holds a NUL */
        free(text);
        return -1;
    }
    switch (data[0] % 4) {
    case 0: {
        const kvs_plan_model *m = NULL;
        if (kvs_plan_preset_find(text, &m) == KVS_OK && (!m || strcasecmp(m->name, text))) abort();
        break;
    }
    case 1: {
        double b = -1;
        if (kvs_plan_dtype_bytes(text, &b) == KVS_OK && b != 0.5 && b != 1 && b != 2 && b != 4) abort();
        break;
    }
    case 2: {
        int64_t v[KVS_PLAN_MAX_LIST];
        int n = -1;
        if (kvs_plan_parse_list("--responses", text, 0, v, &n) == KVS_OK) {
            if (n < 1 || n > KVS_PLAN_MAX_LIST) abort();
            for (int i = 0; i < n; i++)
                if (v[i] < 0 || v[i] > (INT64_C(1) << 40)) abort();
            check_items(text, n);
        }
        break;
    }
    default: {
        int64_t c[KVS_PLAN_MAX_LIST], r[KVS_PLAN_MAX_LIST];
        int n = -1;
        if (kvs_plan_parse_settings(text, c, r, &n) == KVS_OK) {
            if (n < 1 || n > KVS_PLAN_MAX_LIST) abort();
            for (int i = 0; i < n; i++)
                if (c[i] < 1 || r[i] < 0 || c[i] > (INT64_C(1) << 40) || r[i] > (INT64_C(1) << 40)) abort();
            check_items(text, n);
        }
        break;
    }
    }
    free(text);
    kvs_clear_error();
    return 0;
}
