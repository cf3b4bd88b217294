/* fuzz_config_json.c — libFuzzer harness of the Hugging Face config.json reader (gpu_capture/model.c, through
 * common/json.c): the input is config.json beside the fixed tiny model.safetensors of fuzz/fixed/, so a config
 * that parses is then checked against real tensor shapes. Seeds: fuzz/corpus/config_json; dictionary
 * fuzz/dict/config_json.dict (the keys the loader reads).
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/model.h"

static uint8_t *weights;
static size_t weights_len;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char p[4096];
    snprintf(p, sizeof p, "%s/fuzz/fixed/model.safetensors", kvs_fuzz_root());
    FILE *f = fopen(p, "rb");
    if (!f || !(weights = malloc(1 << 20))) {
        fprintf(stderr, "fuzz_config_json: %s missing (set KVSIM_ROOT to the repository)\n", p);
        abort();
    }
    weights_len = fread(weights, 1, 1 << 20, f);
    fclose(f);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("model.safetensors", weights, weights_len, path, sizeof path);
    kvs_fuzz_write("config.json", data, size, path, sizeof path);
    kvs_model *m = NULL;
    if (kvs_model_load(kvs_fuzz_dir(), &m) == KVS_OK) {
        volatile int sink = kvs_model_info_get(m)->n_eos;
        (void)sink;
    }
    kvs_model_free(m);
    kvs_clear_error();
    return 0;
}
