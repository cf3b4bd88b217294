/* fuzz_turns.c — libFuzzer harness of the `kvsim capture --turns FILE` parser (gpu_capture/capture.c,
 * kvs_capture_split_turns): the input, up to its first NUL, is the file's text. Every turn returned must be a
 * non-empty string inside the text without a line break of the file ('\n' in a turn comes only from the
 * two-character escape). Seeds: fuzz/corpus/turns.
 */
#include "fuzz.h"

#include "../common/kvs.h"
#include "../gpu_capture/capture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = kvs_fuzz_cstr(data, size);
    size_t len = strlen(text), escapes = 0;
    for (size_t i = 0; i + 1 < len; i++)
        if (text[i] == '\\' && text[i + 1] == 'n') escapes++, i++;
    char **turns = NULL;
    size_t n = 0;
    if (kvs_capture_split_turns(text, &turns, &n) == KVS_OK) {
        size_t newlines = 0;
        for (size_t i = 0; i < n; i++) {
            if (turns[i] < text || turns[i] >= text + len || turns[i][0] == '\0') abort();
            for (const char *c = turns[i]; *c; c++) newlines += *c == '\n';
        }
        if (newlines > escapes) abort(); /* a newline of the file itself leaked into a turn */
        free(turns);
    }
    free(text);
    kvs_clear_error();
    return 0;
}
