/* fuzz_chat_template.c — libFuzzer harness of the chat-template interpreter (gpu_capture/chat_template.h, what
 * `kvsim capture --chat` and `kvsim chat-template` run on a model's tokenizer_config.json): the input up to its
 * first NUL is the template source; what follows, when it parses as a JSON array, is the messages (else a fixed
 * four-message conversation). A parse or render may fail, with a detail, but not crash, leak, hang past the step
 * limit or exceed the output limit; a success renders the same text twice (no hidden state). Seeds:
 * fuzz/corpus/chat_template (the five real families' templates and the test templates).
 */
#include "fuzz.h"

#include "../common/json.h"
#include "../common/kvs.h"
#include "../gpu_capture/chat_template.h"

static const kvs_chat_message conv[] = {
    {"system", "sys"}, {"user", " Hi \n"}, {"assistant", "<think>\nx\n</think>\n\nHello"}, {"user", "é 🙂"}};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    kvs_chat_template *t = NULL;
    kvs_json *msgs = NULL;
    if (nul && (size_t)(nul - data) + 1 < size &&
        kvs_json_parse((const char *)nul + 1, size - tlen - 1, &msgs) == KVS_OK && kvs_json_type_of(msgs) != KVS_JSON_ARRAY) {
        kvs_json_free(msgs);
        msgs = NULL;
    }
    kvs_status s = kvs_chat_template_parse(src, tlen, &t);
    if (s != KVS_OK) {
        if (t || !kvs_last_error()[0]) abort();
    } else {
        if (kvs_chat_template_set_token(t, "bos_token", "<s>") != KVS_OK) abort();
        kvs_chat_render_opts o = {.add_generation_prompt = 1, .date = (size & 1) ? "2024-07-26" : NULL};
        for (int pass = 0; pass < 2; pass++) {
            char *a = NULL, *b = NULL;
            size_t na = 0, nb = 0;
            kvs_status s1 = pass ? (msgs ? kvs_chat_render_json(t, msgs, &o, &a, &na) : KVS_ERR_END)
                                 : kvs_chat_render(t, conv, 4, &o, &a, &na);
            if (s1 == KVS_ERR_END) break;
            if (s1 == KVS_OK) {
                if (!a || na > KVS_CHAT_MAX_OUTPUT || a[na] != '\0') abort();
                kvs_status s2 = pass ? kvs_chat_render_json(t, msgs, &o, &b, &nb) : kvs_chat_render(t, conv, 4, &o, &b, &nb);
                if (s2 != KVS_OK || nb != na || memcmp(a, b, na)) abort();
            } else if (a || !kvs_last_error()[0]) {
                abort();
            }
            free(a);
            free(b);
        }
    }
    kvs_chat_template_free(t);
    kvs_json_free(msgs);
    kvs_clear_error();
    return 0;
}
