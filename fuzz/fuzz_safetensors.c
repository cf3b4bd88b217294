/* fuzz_safetensors.c — libFuzzer harness of the safetensors loader (gpu_capture/model.c; the safetensors
 * format: u64 header length, JSON header of dtype / shape / data_offsets per tensor, tensor bytes): the input is
 * model.safetensors beside the fixed config.json of fuzz/fixed/ (a tiny Llama), so the header and the shapes
 * are checked against a real config without large weights. Seeds: fuzz/corpus/safetensors.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/model.h"

static char config_text[4096];
static size_t config_len;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char p[4096];
    snprintf(p, sizeof p, "%s/fuzz/fixed/config.json", kvs_fuzz_root());
    FILE *f = fopen(p, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_safetensors: %s missing (set KVSIM_ROOT to the repository)\n", p);
        abort();
    }
    config_len = fread(config_text, 1, sizeof config_text, f);
    fclose(f);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("config.json", (const uint8_t *)config_text, config_len, path, sizeof path);
    kvs_fuzz_write("model.safetensors", data, size, path, sizeof path);
    kvs_model *m = NULL;
    if (kvs_model_load(kvs_fuzz_dir(), &m) == KVS_OK) {
        volatile int sink = kvs_model_info_get(m)->config.n_layers;
        (void)sink;
    }
    kvs_model_free(m);
    kvs_clear_error();
    return 0;
}
