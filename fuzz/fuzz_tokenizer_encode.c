/* fuzz_tokenizer_encode.c — libFuzzer harness of the tokenizers' encode and decode on arbitrary bytes
 * (gpu_capture/tokenizer*.c): the input, as text (up to its first NUL), is encoded by each fixed tokenizer — the
 * byte-level Llama-3 and Qwen2 fixtures of tests/fixtures/tokenizer, and, when ../shared/models is present, the
 * TinyStories tokenizer.json and llama2.c tok512.bin — and the ids are decoded again, whole and piece by piece.
 * Seeds: fuzz/corpus/tokenizer_encode.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/tokenizer.h"

static kvs_tokenizer *toks[4];
static int n_toks;

static void load(const char *rel, int llama2c) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", kvs_fuzz_root(), rel);
    if (access(p, R_OK) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s absent, skipped\n", p);
        return;
    }
    kvs_status s = llama2c ? kvs_tokenizer_load_llama2c(p, 512, &toks[n_toks]) : kvs_tokenizer_load_hf(p, &toks[n_toks]);
    if (s != KVS_OK) {
        fprintf(stderr, "fuzz_tokenizer_encode: %s\n", kvs_last_error());
        abort();
    }
    n_toks++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    load("tests/fixtures/tokenizer/bytelevel_llama3/tokenizer.json", 0);
    load("tests/fixtures/tokenizer/bytelevel_qwen2/tokenizer.json", 0);
    load("../shared/models/tinystories-656K/tokenizer.json", 0);
    load("../shared/models/tok512.bin", 1);
    if (n_toks < 2) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = kvs_fuzz_cstr(data, size);
    size_t cap = size + 2;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) abort();
    for (int k = 0; k < n_toks; k++) {
        size_t n = 0;
        kvs_status s = kvs_tokenizer_encode(toks[k], text, 1, ids, cap, &n);
        if (s != KVS_OK) continue;
        char *out = NULL;
        if (kvs_tokenizer_decode(toks[k], ids, n, &out) == KVS_OK) free(out);
        for (size_t i = 0; i < n && i < 64; i++) {
            char *piece = NULL;
            if (kvs_tokenizer_decode_piece(toks[k], i ? ids[i - 1] : -1, ids[i], &piece) == KVS_OK) free(piece);
        }
    }
    free(ids);
    free(text);
    kvs_clear_error();
    return 0;
}
