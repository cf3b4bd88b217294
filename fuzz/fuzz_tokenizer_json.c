/* fuzz_tokenizer_json.c — libFuzzer harness of the Hugging Face tokenizer.json loader (gpu_capture/
 * tokenizer_hf.c: model BPE vocab and merges, added tokens, normalizer, pre-tokenizer and decoder chains): the
 * input is tokenizer.json; one that loads then encodes and decodes a few fixed texts, so a hostile chain shows
 * in time and memory (tests/test_limits.c, case (c)). Seeds: fuzz/corpus/tokenizer_json; dictionary
 * fuzz/dict/tokenizer_json.dict.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    kvs_fuzz_write("tokenizer.json", data, size, path, sizeof path);
    kvs_tokenizer *t = NULL;
    if (kvs_tokenizer_load_hf(path, &t) == KVS_OK) {
        static const char *const texts[] = {"Once upon a time", " a\n\tb  c ", "caf\xc3\xa9 \xe2\x96\x81 123", ""};
        int32_t ids[256];
        for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
            size_t n = 0;
            if (kvs_tokenizer_encode(t, texts[i], 1, ids, 256, &n) != KVS_OK) continue;
            char *text = NULL;
            if (kvs_tokenizer_decode(t, ids, n, &text) == KVS_OK) free(text);
        }
        int32_t v = kvs_tokenizer_vocab_size(t);
        int32_t some[4] = {0, v - 1, v / 2, kvs_tokenizer_eos(t) >= 0 ? kvs_tokenizer_eos(t) : 0};
        char *text = NULL;
        if (kvs_tokenizer_decode(t, some, 4, &text) == KVS_OK) free(text);
    }
    kvs_tokenizer_free(t);
    kvs_clear_error();
    return 0;
}
