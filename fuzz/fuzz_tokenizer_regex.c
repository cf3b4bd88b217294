/* fuzz_tokenizer_regex.c — libFuzzer harness of the tokenizer.json regex engine (gpu_capture/tokenizer_regex.c) and
 * the Split pre-tokenizer (tokenizer_pretok.c): a corrupt or hostile pattern must be refused with a message or run
 * within its step budget — no crash, no exponential time. Input: one flags byte (bit 0: a {"String": ...} literal
 * pattern; bits 1-3: the Split behaviour modulo 5; bit 4: invert), the pattern up to the first NUL byte, then the
 * text (used when it is valid UTF-8). The budget is lowered to 2^20 steps per text so that a hostile pattern costs
 * milliseconds. Seeds: fuzz/corpus/tokenizer_regex (the real tokenizers' patterns, gpt-oss's o200k, the synthetic
 * ones of tests/fixtures/tokenizer/corpus/split_patterns.json, and (a|a)*b-style hostile ones); dictionary
 * fuzz/dict/tokenizer_regex.dict.
 */
#include "fuzz.h"

#include <string.h>

#include "../common/kvs.h"
#include "../gpu_capture/tokenizer_internal.h"
#include "../gpu_capture/tokenizer_regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int flags = data[0];
    const char *pat = (const char *)data + 1;
    const uint8_t *nul = memchr(data + 1, 0, size - 1);
    size_t pat_len = nul ? (size_t)(nul - (data + 1)) : size - 1;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t text_len = nul ? size - 2 - pat_len : 0;
    kvs_tok_pre_step ps = {.kind = KVS_TOK_PRE_SPLIT, .regex = KVS_TOK_RE_NONE, .behavior = ((flags >> 1) & 7) % 5,
                           .invert = (flags >> 4) & 1};
    if (kvs_tok_rx_compile(pat, pat_len, flags & 1, &ps.rx) == KVS_OK) {
        kvs_tok_rx_set_step_budget(ps.rx, 1u << 20);
        int utf8 = 1;
        for (size_t i = 0; i < text_len && utf8;) {
            uint32_t cp;
            size_t n = kvs_tok_utf8_next(text + i, text_len - i, &cp);
            if (n == 0) utf8 = 0;
            i += n;
        }
        if (utf8) {
            kvs_tok_piece *pc = NULL;
            size_t np = 0;
            if (kvs_tok_split_pieces(&ps, text, text_len, 0, &pc, &np) == KVS_OK) {
                /* the pieces lie in the text, in order, without overlap */
                size_t at = 0;
                for (size_t i = 0; i < np; i++) {
                    if (pc[i].start < at || pc[i].end < pc[i].start || pc[i].end > text_len) __builtin_trap();
                    at = pc[i].end;
                }
                free(pc);
            }
        }
        kvs_tok_rx_free(ps.rx);
    }
    kvs_clear_error();
    return 0;
}
