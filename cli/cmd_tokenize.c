/* cmd_tokenize.c — `kvsim tokenize`: the token ids kvsim's tokenizer (gpu_capture/tokenizer.h) gives a text or a
 * corpus of texts, and optionally its load time and encode speed. It exists so that the tokenizer.json support can
 * be compared id for id with Hugging Face's own Rust `tokenizers` library (tests/npm/encode_corpus.js prints the
 * same format from the library; tests/test_tokenizer_npm.c compares the two) and timed against it
 * (gpu_capture/BENCH.md, tokenizer section).
 *
 * Corpus format: one record a line, each a JSON string literal ("a\tb\r\n" with JSON escapes, so tabs, CR, LF and
 * any code point survive); blank lines and lines starting with '#' are skipped. Output: one line per record, the
 * ids separated by single spaces (an empty line for a text with no tokens).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/json.h"
#include "../gpu_capture/tokenizer.h"
#include "cli.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kvsim tokenize --tokenizer FILE (--text TEXT | --corpus FILE) [--bos] [--pieces] [--engine]\n"
               "                      [--repeat N] [--time]\n\n"
               "Prints the token ids of TEXT, or of every record of a corpus file (one line of space-separated ids\n"
               "per record). The tokenizer is a Hugging Face tokenizer.json (tokenizer_config.json beside it is read\n"
               "when present).\n"
               "  --tokenizer FILE  tokenizer.json\n"
               "  --text TEXT       one text (UTF-8)\n"
               "  --corpus FILE     one JSON string literal a line (\"a\\tb\\r\\n\"); blank and '#' lines skipped\n"
               "  --bos             prepend BOS when the tokenizer's configuration asks for it (default: raw ids)\n"
               "  --pieces          print each record's pre-tokenized pieces instead of ids, as one JSON array a line\n"
               "                    (after the normalizer and pre-tokenizer, before BPE; JSON.stringify's escaping)\n"
               "  --engine          run the GPT-2 / Llama 3 / Qwen2 Split regexes on the regex engine, not on their\n"
               "                    hand-written scanner (the two must agree; for tests)\n"
               "  --repeat N        with --time: encode the corpus N more times, timed (default 1)\n"
               "  --time            on stderr: load seconds, and encode MB/s over the corpus bytes (timed passes)\n"
               "Exit status: 0 success, 1 failure (bad tokenizer or corpus, text the vocabulary cannot represent),\n"
               "2 bad usage.\n");
}

typedef struct {
    char **text;
    size_t n, cap, bytes;
} corpus;

static void corpus_free(corpus *c) {
    for (size_t i = 0; i < c->n; i++) free(c->text[i]);
    free(c->text);
}

static kvs_status corpus_add(corpus *c, const char *s) {
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 64;
        char **t = realloc(c->text, cap * sizeof *t);
        if (!t) return kvs_fail(KVS_ERR_NOMEM, "tokenize: out of memory");
        c->text = t;
        c->cap = cap;
    }
    size_t n = strlen(s);
    if (!(c->text[c->n] = malloc(n + 1))) return kvs_fail(KVS_ERR_NOMEM, "tokenize: out of memory");
    memcpy(c->text[c->n++], s, n + 1);
    c->bytes += n;
    return KVS_OK;
}

static kvs_status corpus_load(const char *path, corpus *c) {
    char *data = NULL;
    size_t len = 0;
    kvs_status st = kvs_read_file(path, &data, &len);
    if (st != KVS_OK) return st;
    size_t line = 0;
    for (size_t i = 0; i < len && st == KVS_OK;) {
        size_t e = i;
        while (e < len && data[e] != '\n') e++;
        line++;
        size_t b = i;
        while (b < e && (data[b] == ' ' || data[b] == '\t' || data[b] == '\r')) b++;
        if (b < e && data[b] != '#') {
            kvs_json *v = NULL;
            st = kvs_json_parse(data + b, e - b, &v);
            if (st != KVS_OK) st = kvs_fail(st, "%s:%zu: %s", path, line, kvs_last_error());
            else if (kvs_json_type_of(v) != KVS_JSON_STRING)
                st = kvs_fail(KVS_ERR_FORMAT, "%s:%zu: a record must be one JSON string", path, line);
            else if (kvs_json_string_len(v) != strlen(kvs_json_string(v)))
                st = kvs_fail(KVS_ERR_FORMAT, "%s:%zu: a record must not hold U+0000", path, line);
            else
                st = corpus_add(c, kvs_json_string(v));
            kvs_json_free(v);
        }
        i = e + 1;
    }
    free(data);
    return st;
}

/* One piece as a JSON string the way JavaScript's JSON.stringify writes it (only '"', '\\' and control characters
 * escaped, short forms where JSON has them), so that a line compares byte for byte with the Rust library's. */
static void print_piece(const char *p, size_t n, void *ctx) {
    int *first = ctx;
    fputs(*first ? "\"" : ",\"", stdout);
    *first = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\b') fputs("\\b", stdout);
        else if (c == '\f') fputs("\\f", stdout);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

/* The ids of text into *ids (grown as needed). */
static kvs_status encode(const kvs_tokenizer *t, const char *text, int bos, int32_t **ids, size_t *cap,
                         size_t *n) {
    for (;;) {
        kvs_status st = kvs_tokenizer_encode(t, text, bos, *ids, *cap, n);
        if (st != KVS_ERR_RANGE) return st;
        size_t want = *n > 2 * *cap ? *n : 2 * *cap + 16;
        int32_t *p = realloc(*ids, want * sizeof *p);
        if (!p) return kvs_fail(KVS_ERR_NOMEM, "tokenize: out of memory");
        *ids = p;
        *cap = want;
    }
}

int kvs_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *tok_path = NULL, *text = NULL, *corpus_path = NULL;
    int bos = 0, timing = 0, pieces = 0, engine = 0;
    long repeat = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (kvs_cli_is_help(a)) {
            usage(stdout);
            return KVS_EXIT_OK;
        }
        if (!strcmp(a, "--bos")) bos = 1;
        else if (!strcmp(a, "--time")) timing = 1;
        else if (!strcmp(a, "--pieces")) pieces = 1;
        else if (!strcmp(a, "--engine")) engine = 1;
        else if (!strcmp(a, "--tokenizer") || !strcmp(a, "--text") || !strcmp(a, "--corpus") ||
                 !strcmp(a, "--repeat")) {
            if (i + 1 >= argc) return kvs_cli_usage_error(cmd, "%s needs a value", a);
            const char *v = argv[++i];
            if (!strcmp(a, "--tokenizer")) tok_path = v;
            else if (!strcmp(a, "--text")) text = v;
            else if (!strcmp(a, "--corpus")) corpus_path = v;
            else if (kvs_cli_parse_long(a, v, 1, 1000000, &repeat) != KVS_OK)
                return kvs_cli_fail(cmd, KVS_ERR_INVALID_ARG);
        } else {
            return kvs_cli_usage_error(cmd, "unknown argument '%s'", a);
        }
    }
    if (!tok_path) return kvs_cli_usage_error(cmd, "--tokenizer FILE is required");
    if (!text == !corpus_path) return kvs_cli_usage_error(cmd, "give exactly one of --text and --corpus");
    corpus c = {0};
    kvs_tokenizer *t = NULL;
    int32_t *ids = NULL;
    size_t cap = 0, n = 0;
    kvs_status st = text ? corpus_add(&c, text) : corpus_load(corpus_path, &c);
    double t0 = kvs_now_s(), t_load = 0, t_enc = 0;
    if (st == KVS_OK) st = kvs_tokenizer_load_hf(tok_path, &t);
    t_load = kvs_now_s() - t0;
    if (st == KVS_OK && engine) kvs_tokenizer_use_scanner(t, 0);
    for (size_t k = 0; st == KVS_OK && pieces && k < c.n; k++) {
        int first = 1;
        putchar('[');
        if ((st = kvs_tokenizer_pretokenize(t, c.text[k], print_piece, &first)) != KVS_OK) {
            st = kvs_fail(st, "record %zu: %s", k + 1, kvs_last_error());
            break;
        }
        printf("]\n");
    }
    for (size_t k = 0; st == KVS_OK && !pieces && k < c.n; k++) {
        if ((st = encode(t, c.text[k], bos, &ids, &cap, &n)) != KVS_OK) {
            st = kvs_fail(st, "record %zu: %s", k + 1, kvs_last_error());
            break;
        }
        for (size_t j = 0; j < n; j++) printf(j ? " %d" : "%d", (int)ids[j]);
        printf("\n");
    }
    /* timed passes, without printing (the first pass above also warmed the caches) */
    if (st == KVS_OK && timing) {
        double t1 = kvs_now_s();
        for (long r = 0; st == KVS_OK && r < repeat; r++)
            for (size_t k = 0; st == KVS_OK && k < c.n; k++) st = encode(t, c.text[k], bos, &ids, &cap, &n);
        t_enc = kvs_now_s() - t1;
    }
    if (st == KVS_OK && timing) {
        double mb = (double)c.bytes * (double)repeat / 1e6;
        fprintf(stderr, "load_s %.3f encode_s %.3f bytes %zu repeat %ld mb_per_s %.2f\n", t_load, t_enc, c.bytes,
                repeat, t_enc > 0 ? mb / t_enc : 0.0);
    }
    free(ids);
    kvs_tokenizer_free(t);
    corpus_free(&c);
    return st == KVS_OK ? KVS_EXIT_OK : kvs_cli_fail(cmd, st);
}
