/* fuzz_tokenizer_bin.c — libFuzzer harness of the llama2.c tokenizer.bin loader (gpu_capture/tokenizer.c;
 * llama2.c `build_tokenizer`: max_token_length, then per token a float score, an int length and the bytes):
 * the input is tokenizer.bin, loaded for 512 tokens (tok512.bin's count) and for 3; one that loads then encodes
 * and decodes a fixed text. Seeds: fuzz/corpus/tokenizer_bin.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("tokenizer.bin", data, size, path, sizeof path);
    static const int32_t counts[] = {512, 3};
    for (size_t c = 0; c < 2; c++) {
        kvs_tokenizer *t = NULL;
        if (kvs_tokenizer_load_llama2c(path, counts[c], &t) != KVS_OK) continue;
        int32_t ids[256];
        size_t n = 0;
        if (kvs_tokenizer_encode(t, "Once upon a time, caf\xc3\xa9", 1, ids, 256, &n) == KVS_OK) {
            char *text = NULL;
            if (kvs_tokenizer_decode(t, ids, n, &text) == KVS_OK) free(text);
        }
        kvs_tokenizer_free(t);
    }
    kvs_clear_error();
    return 0;
}
