/* fuzz_model_llama2c.c — libFuzzer harness of the llama2.c checkpoint loader (gpu_capture/model.c, the
 * `run.c` format: a 7-int header, then the weights): the input is the .bin file. A header whose shapes do not
 * match the file size must be refused before anything is sized from it. Seeds: fuzz/corpus/model_llama2c (tiny
 * checkpoints with weights; never the shared models, which are too large to commit).
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("model.bin", data, size, path, sizeof path);
    kvs_model *m = NULL;
    if (kvs_model_load(path, &m) == KVS_OK) {
        const kvs_model_info *in = kvs_model_info_get(m);
        volatile int sink = in->config.n_layers + kvs_model_is_eos(m, 0) + kvs_model_is_eos(m, in->config.vocab_size - 1);
        (void)sink;
    }
    kvs_model_free(m);
    kvs_clear_error();
    return 0;
}
