/* test_tokenizer.c — tests of gpu_capture/tokenizer*.c: exact ids against the independent Python reference
 * in tests/fixtures/tokenizer/ (gen_tokenizer_fixtures.py), known facts about the real TinyStories
 * tokenizers in ../shared/models (README ids, "Once upon a time"), the Split-regex scanner on edge cases,
 * round trips and random-input fuzzing, and clear errors for malformed files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/util/testenv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gpu_capture/tokenizer.h"
#include "../gpu_capture/tokenizer_internal.h"
#include "../gpu_capture/unicode.h"

/* ---------------------------------------------------------------- paths */

static void path_of(char *out, size_t cap, const char *rel) { snprintf(out, cap, "%s/%s", kvs_test_root(), rel); }

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

/* Loads a real model tokenizer or skips the test with a message when ../shared/models is absent. */
static kvs_tokenizer *load_real(const char *which) {
    char p[4096];
    kvs_tokenizer *t = NULL;
    if (strcmp(which, "tok512") == 0) {
        path_of(p, sizeof p, "../shared/models/tok512.bin");
        if (!file_exists(p)) {
            fprintf(stderr, "SKIP: %s absent (shared models not installed)\n", p);
            return NULL;
        }
        assert_int_equal(kvs_tokenizer_load_llama2c(p, 512, &t), KVS_OK);
    } else {
        path_of(p, sizeof p, "../shared/models/tinystories-656K/tokenizer.json");
        if (!file_exists(p)) {
            fprintf(stderr, "SKIP: %s absent (shared models not installed)\n", p);
            return NULL;
        }
        assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_OK);
    }
    return t;
}

static kvs_tokenizer *load_fixture(const char *variant) {
    char p[4096], rel[256];
    snprintf(rel, sizeof rel, "tests/fixtures/tokenizer/bytelevel_%s/tokenizer.json", variant);
    path_of(p, sizeof p, rel);
    kvs_tokenizer *t = NULL;
    kvs_status st = kvs_tokenizer_load_hf(p, &t);
    if (st != KVS_OK) fprintf(stderr, "load %s: %s\n", p, kvs_last_error());
    assert_int_equal(st, KVS_OK);
    return t;
}

/* ---------------------------------------------------------------- helpers */

static int32_t *encode(const kvs_tokenizer *t, const char *text, int bos, size_t *n) {
    size_t cap = 4 * strlen(text) + 8;
    int32_t *ids = malloc(cap * sizeof *ids);
    assert_non_null(ids);
    kvs_status st = kvs_tokenizer_encode(t, text, bos, ids, cap, n);
    if (st != KVS_OK) fprintf(stderr, "encode \"%s\": %s\n", text, kvs_last_error());
    assert_int_equal(st, KVS_OK);
    return ids;
}

static char *decode(const kvs_tokenizer *t, const int32_t *ids, size_t n) {
    char *s = NULL;
    assert_int_equal(kvs_tokenizer_decode(t, ids, n, &s), KVS_OK);
    assert_non_null(s);
    return s;
}

static int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

/* NFC of a UTF-8 text (malloc'd): what decode returns for a tokenizer with the NFC normalizer. */
static char *nfc_text(const char *text) {
    size_t len = strlen(text), m = 0, nn = 0;
    uint32_t *cps = malloc((len + 1) * sizeof *cps), *norm = NULL;
    assert_non_null(cps);
    for (size_t i = 0; i < len;) {
        size_t cl = kvs_tok_utf8_next(text + i, len - i, &cps[m++]);
        assert_true(cl > 0);
        i += cl;
    }
    assert_int_equal(kvs_uni_nfc(cps, m, &norm, &nn), KVS_OK);
    char *out = malloc(4 * nn + 1);
    assert_non_null(out);
    size_t w = 0;
    for (size_t k = 0; k < nn; k++) w += kvs_tok_utf8_put(norm[k], out + w);
    out[w] = 0;
    free(cps);
    free(norm);
    return out;
}

/* Checks every row of a fixture TSV (hex text, add_bos, ids): exact ids, and the round trip
 * decode(encode(text)) == text (its NFC when nfc: the tokenizer normalizes) for rows with BOS whose text the
 * vocabulary represents (no special-token strings "<|", no <unk> id `unk`). Returns the number of rows checked. */
static int check_tsv(const kvs_tokenizer *t, const char *rel, int32_t unk, int bos_adds_space, int nfc) {
    char p[4096];
    path_of(p, sizeof p, rel);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int rows = 0;
    while (getline(&line, &cap, f) > 0) {
        if (line[0] == '#') continue;
        char *tab1 = strchr(line, '\t');
        assert_non_null(tab1);
        char *tab2 = strchr(tab1 + 1, '\t');
        assert_non_null(tab2);
        size_t hex_len = (size_t)(tab1 - line);
        char *text = calloc(hex_len / 2 + 1, 1);
        assert_non_null(text);
        for (size_t i = 0; i + 1 < hex_len; i += 2) text[i / 2] = (char)(hexval(line[i]) * 16 + hexval(line[i + 1]));
        int bos = atoi(tab1 + 1);
        int32_t want[4096];
        size_t n_want = 0;
        for (char *q = tab2 + 1; *q && *q != '\n';) {
            char *end;
            long v = strtol(q, &end, 10);
            assert_true(end != q);
            want[n_want++] = (int32_t)v;
            q = end;
            while (*q == ' ') q++;
        }
        size_t n;
        int32_t *ids = encode(t, text, bos, &n);
        if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
            fprintf(stderr, "%s: ids differ for \"%s\" (bos %d):\n want", rel, text, bos);
            for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got");
            for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
            fail();
        }
        int has_unk = 0;
        for (size_t i = 0; i < n; i++) has_unk |= ids[i] == unk;
        if (!strstr(text, "<|") && !has_unk) {
            char *back = decode(t, ids, n);
            if (nfc) {
                char *want_text = nfc_text(text);
                assert_string_equal(back, want_text);
                free(want_text);
            } else if (bos || !bos_adds_space || text[0] == '\0') {
                assert_string_equal(back, text);
            } else { /* llama2.c keeps the dummy-prefix space when there is no BOS before it */
                assert_int_equal(back[0], ' ');
                assert_string_equal(back + 1, text);
            }
            free(back);
        }
        free(ids);
        free(text);
        rows++;
    }
    free(line);
    fclose(f);
    return rows;
}

/* ---------------------------------------------------------------- llama2.c tok512 */

static void test_tok512_matches_reference_ids(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("tok512");
    if (!t) { skip(); return; }
    assert_int_equal(check_tsv(t, "tests/fixtures/tokenizer/expected_tok512.tsv", -1, 1, 0), 40);
    kvs_tokenizer_free(t);
}

static void test_tok512_once_upon_a_time(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("tok512");
    if (!t) { skip(); return; }
    assert_int_equal(kvs_tokenizer_vocab_size(t), 512);
    assert_int_equal(kvs_tokenizer_bos(t), 1);
    assert_int_equal(kvs_tokenizer_eos(t), 2);
    size_t n;
    int32_t *ids = encode(t, "Once upon a time", 0, &n);
    char cat[256] = "";
    for (size_t i = 0; i < n; i++) strcat(cat, kvs_tokenizer_piece(t, ids[i]));
    assert_string_equal(cat, " Once upon a time");
    free(ids);
    /* README: greedy decoding of stories260K from BOS begins with these ids */
    static const int32_t greedy[] = {1, 403, 407, 261, 378, 432, 383, 286};
    char *s = decode(t, greedy, 8);
    assert_memory_equal(s, "Once upon a time,", 17);
    free(s);
    ids = encode(t, "Once upon a time,", 1, &n);
    assert_int_equal(n, 6);
    assert_memory_equal(ids, greedy, 6 * sizeof *ids);
    free(ids);
    kvs_tokenizer_free(t);
}

static void test_tok512_byte_fallback_round_trip(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("tok512");
    if (!t) { skip(); return; }
    static const char *texts[] = {"café", "日本", "naïve façade — 東京 😀!", "tab\there\nnew line", "a"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        size_t n;
        int32_t *ids = encode(t, texts[k], 1, &n);
        char *s = decode(t, ids, n);
        assert_string_equal(s, texts[k]);
        free(s);
        free(ids);
    }
    /* "日本" is not in the 512-token vocabulary: each byte becomes its <0xNN> piece, id = byte + 3 */
    size_t n;
    int32_t *ids = encode(t, "日本", 0, &n);
    assert_int_equal(n, 7);
    assert_int_equal(ids[1], 0xE6 + 3);
    assert_string_equal(kvs_tokenizer_piece(t, ids[1]), "<0xE6>");
    free(ids);
    kvs_tokenizer_free(t);
}

/* ---------------------------------------------------------------- HF tinystories-656K */

static void test_tinystories_matches_reference_ids(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("hf");
    if (!t) { skip(); return; }
    assert_int_equal(check_tsv(t, "tests/fixtures/tokenizer/expected_tinystories.tsv", 0, 0, 0), 40);
    kvs_tokenizer_free(t);
}

static void test_tinystories_readme_facts(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("hf");
    if (!t) { skip(); return; }
    assert_int_equal(kvs_tokenizer_vocab_size(t), 2048);
    assert_int_equal(kvs_tokenizer_bos(t), 1);
    assert_int_equal(kvs_tokenizer_eos(t), 2);
    assert_string_equal(kvs_tokenizer_piece(t, 1), "<|start_story|>");
    static const int32_t greedy[] = {1, 147, 201, 282, 215, 286, 598, 1662};
    char *s = decode(t, greedy, 8);
    assert_memory_equal(s, "Once upon a time, there was a little girl named Lily. She ", 58);
    free(s);
    /* streaming: decode_piece over the sequence concatenates to the full decode */
    char all[512] = "";
    int32_t prev = -1;
    for (size_t i = 0; i < 8; i++) {
        char *p = NULL;
        assert_int_equal(kvs_tokenizer_decode_piece(t, prev, greedy[i], &p), KVS_OK);
        strcat(all, p);
        free(p);
        prev = greedy[i];
    }
    assert_memory_equal(all, "Once upon a time, there was a little girl named Lily. She ", 58);
    kvs_tokenizer_free(t);
}

static void test_tinystories_unknown_characters_fuse_to_unk(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("hf");
    if (!t) { skip(); return; }
    /* This vocabulary has byte_fallback true but no <0xNN> pieces, so non-ASCII text falls back to
     * <unk> (id 0), and fuse_unk makes one <unk> of the run "日本". */
    size_t n;
    int32_t *ids = encode(t, "日本", 0, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 80); /* "▁" from the Prepend normalizer */
    assert_int_equal(ids[1], 0);
    free(ids);
    kvs_tokenizer_free(t);
}

/* ---------------------------------------------------------------- byte-level fixtures */

static void test_bytelevel_llama3_matches_reference_ids(void **state) {
    (void)state;
    kvs_tokenizer *t = load_fixture("llama3");
    assert_int_equal(kvs_tokenizer_bos(t), kvs_tokenizer_vocab_size(t) - 3); /* from the template */
    assert_int_equal(kvs_tokenizer_eos(t), kvs_tokenizer_vocab_size(t) - 2);
    assert_int_equal(check_tsv(t, "tests/fixtures/tokenizer/expected_bytelevel_llama3.tsv", -1, 0, 0), 72);
    kvs_tokenizer_free(t);
}

static void test_bytelevel_qwen2_matches_reference_ids(void **state) {
    (void)state;
    kvs_tokenizer *t = load_fixture("qwen2");
    assert_int_equal(kvs_tokenizer_bos(t), -1);
    assert_int_equal(check_tsv(t, "tests/fixtures/tokenizer/expected_bytelevel_qwen2.tsv", -1, 0, 1), 72);
    /* NFC composes e + U+0301 into U+00E9 before the pre-tokenizer: the same ids as the precomposed text */
    int32_t ids[64], ids2[64];
    size_t n, n2;
    assert_int_equal(kvs_tokenizer_encode(t, "cafe\xcc\x81 \xe1\x84\x80\xe1\x85\xa1", 0, ids, 64, &n), KVS_OK);
    assert_int_equal(kvs_tokenizer_encode(t, "caf\xc3\xa9 \xea\xb0\x80", 0, ids2, 64, &n2), KVS_OK);
    assert_int_equal(n, n2);
    assert_memory_equal(ids, ids2, n * sizeof ids[0]);
    /* U+0301 alone after ASCII (its lead byte 0xCC is the smallest that starts a code point NFC can change) */
    assert_int_equal(kvs_tokenizer_encode(t, "cafe\xcc\x81", 0, ids, 64, &n), KVS_OK);
    assert_int_equal(kvs_tokenizer_encode(t, "caf\xc3\xa9", 0, ids2, 64, &n2), KVS_OK);
    assert_int_equal(n, n2);
    assert_memory_equal(ids, ids2, n * sizeof ids[0]);
    assert_int_equal(kvs_tokenizer_encode(t, "cafe\xcc\x81 \xe1\x84\x80\xe1\x85\xa1", 0, ids, 64, &n), KVS_OK);
    char *back = NULL;
    assert_int_equal(kvs_tokenizer_decode(t, ids, n, &back), KVS_OK);
    assert_string_equal(back, "caf\xc3\xa9 \xea\xb0\x80");
    free(back);
    kvs_tokenizer_free(t);
}

/* Splits s with the scanner and compares with the expected pieces separated by '|'. */
static void expect_split(int regex, const char *s, const char *want) {
    char got[512] = "";
    size_t len = strlen(s);
    for (size_t pos = 0; pos < len;) {
        size_t m = kvs_tok_pretok_match(regex, s, len, pos);
        assert_true(m >= 1 && pos + m <= len);
        if (pos) strcat(got, "|");
        strncat(got, s + pos, m);
        pos += m;
    }
    assert_string_equal(got, want);
}

static void test_split_regex_edge_cases(void **state) {
    (void)state;
    expect_split(KVS_TOK_RE_LLAMA3, "I'M you'll we've 'd", "I|'M| you|'ll| we|'ve| '|d");
    expect_split(KVS_TOK_RE_GPT2, "I'M you'll", "I|'|M| you|'ll");
    expect_split(KVS_TOK_RE_LLAMA3, "1 12 123 1234 12345", "1| |12| |123| |123|4| |123|45");
    expect_split(KVS_TOK_RE_QWEN2, "x 123", "x| |1|2|3");
    expect_split(KVS_TOK_RE_GPT2, "x 12345", "x| 12345");
    expect_split(KVS_TOK_RE_LLAMA3, "a  b   c", "a| | b|  | c");
    expect_split(KVS_TOK_RE_LLAMA3, "a\n\nb\r\n  c  ", "a|\n\n|b|\r\n| | c|  ");
    expect_split(KVS_TOK_RE_LLAMA3, "x\t\ty", "x|\t|\ty");
    expect_split(KVS_TOK_RE_LLAMA3, "hi!!! ?.\n\nok", "hi|!!!| ?.\n\n|ok");
    expect_split(KVS_TOK_RE_LLAMA3, "😀😀 x", "😀😀| x");
    expect_split(KVS_TOK_RE_LLAMA3, "日本語テキスト abc", "日本語テキスト| abc");
    expect_split(KVS_TOK_RE_LLAMA3, "Αθήνα Москва", "Αθήνα| Москва");
    expect_split(KVS_TOK_RE_LLAMA3, "$x (y)", "$x| (|y|)");
}

/* ---------------------------------------------------------------- fuzz */

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static int valid_utf8(const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0; i < n;) {
        size_t k = kvs_tok_utf8_next(s + i, n - i, &cp);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

static void fuzz_one(const kvs_tokenizer *t, const char *text, int must_round_trip_any_bytes) {
    size_t len = strlen(text), n = 0;
    int32_t ids[1024];
    kvs_status st = kvs_tokenizer_encode(t, text, 1, ids, 1024, &n);
    if (!must_round_trip_any_bytes && !valid_utf8(text, len)) {
        assert_int_equal(st, KVS_ERR_INVALID_ARG);
        return;
    }
    assert_int_equal(st, KVS_OK);
    char *s = decode(t, ids, n);
    assert_memory_equal(s, text, len + 1);
    free(s);
}

static void fuzz(const kvs_tokenizer *t, int any_bytes) {
    uint64_t seed = 12345;
    char buf[80];
    static const uint32_t pool[] = {'a', 'Z', ' ', '\n', '\t', '\'', '1', '9', '!', '.', 0xE9, 0x3B1, 0x416,
                                    0x65E5, 0x3042, 0xAC00, 0x1F600, 0x2028, 0xA0, 0x2460, 0xFF11, 0x10FFFD};
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = rng_next(&seed) % 40, k = 0;
        if (iter % 2 == 0) { /* random bytes (no NUL: the API takes C strings) */
            for (size_t i = 0; i < len; i++) buf[k++] = (char)(1 + rng_next(&seed) % 255);
        } else { /* random valid UTF-8 drawn from a pool of interesting characters */
            for (size_t i = 0; i < len && k + 4 < sizeof buf; i++)
                k += kvs_tok_utf8_put(pool[rng_next(&seed) % (sizeof pool / sizeof pool[0])], buf + k);
        }
        buf[k] = '\0';
        fuzz_one(t, buf, any_bytes);
    }
}

static void test_fuzz_bytelevel_round_trip(void **state) {
    (void)state;
    kvs_tokenizer *t = load_fixture("llama3");
    fuzz(t, 0);
    kvs_tokenizer_free(t);
}

static void test_fuzz_byte_fallback_round_trip(void **state) {
    (void)state;
    kvs_tokenizer *t = load_real("tok512");
    if (!t) { skip(); return; }
    fuzz(t, 1); /* llama2.c byte fallback represents any byte sequence */
    kvs_tokenizer_free(t);
}

/* ---------------------------------------------------------------- errors */

static char tmpdir[64];

static void write_file(const char *name, const void *data, size_t n, char *path_out) {
    sprintf(path_out, "%s/%s", tmpdir, name);
    FILE *f = fopen(path_out, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static kvs_status load_json_text(const char *json) {
    char p[256];
    write_file("tokenizer.json", json, strlen(json), p);
    kvs_tokenizer *t = NULL;
    kvs_status st = kvs_tokenizer_load_hf(p, &t);
    assert_true(st == KVS_OK ? t != NULL : t == NULL);
    kvs_tokenizer_free(t);
    return st;
}

#define VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}"

/* Added tokens are found leftmost-longest (the `tokenizers` rule) through a trie: the llama3 fixture with Llama-3's
 * 256 reserved special tokens and tokens that are prefixes of one another ("<|x|>", "<|x|>y", a repeated content
 * whose first entry wins), on random texts of whole tokens, their prefixes and plain words, against a naive
 * leftmost-longest split over the tokens in file order with every plain segment encoded on its own. */
static void test_added_tokens_leftmost_longest(void **state) {
    (void)state;
    char src[4096], dir[] = "/tmp/kvs_tok_added_XXXXXX", dst[256];
    path_of(src, sizeof src, "tests/fixtures/tokenizer/bytelevel_llama3/tokenizer.json");
    assert_non_null(mkdtemp(dir));
    snprintf(dst, sizeof dst, "%s/tokenizer.json", dir);
    size_t n_json = 0;
    char *json = kvs_test_slurp(src, &n_json);
    assert_non_null(json);
    const char *key = "\"added_tokens\"";
    char *at = strstr(json, key);
    assert_non_null(at);
    char *open = strchr(at, '[');
    assert_non_null(open);
    FILE *f = fopen(dst, "w");
    assert_non_null(f);
    fwrite(json, 1, (size_t)(open + 1 - json), f);
    enum { N_EXTRA = 256 + 4 };
    static char contents[N_EXTRA][48];
    for (int i = 0; i < 256; i++) snprintf(contents[i], sizeof contents[i], "<|reserved_special_token_%d|>", i);
    snprintf(contents[256], sizeof contents[256], "<|x|>");
    snprintf(contents[257], sizeof contents[257], "<|x|>y");
    snprintf(contents[258], sizeof contents[258], "<|x|>");  /* a repeated content: the first (id 815) wins */
    snprintf(contents[259], sizeof contents[259], "|>z");
    for (int i = 0; i < N_EXTRA; i++)
        fprintf(f, "{\"id\": %d, \"content\": \"%s\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                   "\"normalized\": false, \"special\": true},",
                559 + i, contents[i]);
    fputs(open + 1, f);
    assert_int_equal(fclose(f), 0);
    free(json);
    kvs_tokenizer *t = NULL;
    kvs_status st = kvs_tokenizer_load_hf(dst, &t);
    if (st != KVS_OK) fprintf(stderr, "load %s: %s\n", dst, kvs_last_error());
    assert_int_equal(st, KVS_OK);
    assert_int_equal(t->n_added, 3 + N_EXTRA);
    static const char *const words[] = {"Once", " upon", " a time", "<|", "|>", "x", "y", "z", " ", "\n", "<", "|"};
    uint64_t rng = 88172645463325252ULL;
    char text[2048];
    int32_t want[4096];
    for (int trial = 0; trial < 300; trial++) {
        size_t len = 0;
        int parts = 1 + trial % 12;
        for (int k = 0; k < parts; k++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            const char *piece;
            size_t cut = 0;
            switch (rng % 4) {
            case 0: piece = t->added[(rng >> 8) % t->n_added].content; break;
            case 1: /* a proper prefix of an added token */
                piece = t->added[(rng >> 8) % t->n_added].content;
                cut = 1 + (rng >> 20) % (strlen(piece) - 1);
                break;
            default: piece = words[(rng >> 8) % (sizeof words / sizeof *words)]; break;
            }
            size_t pl = cut ? cut : strlen(piece);
            assert_true(len + pl < sizeof text);
            memcpy(text + len, piece, pl);
            len += pl;
        }
        text[len] = 0;
        /* the naive split: at the first position where some added token matches, the longest (first among equal) */
        size_t n_want = 0, from = 0;
        for (;;) {
            size_t pos = from, best_len = 0, best = 0;
            for (; pos < len && !best_len; pos++)
                for (size_t k = 0; k < t->n_added; k++) {
                    size_t al = t->added[k].len;
                    if (al <= len - pos && al > best_len && !memcmp(text + pos, t->added[k].content, al))
                        best_len = al, best = k;
                }
            size_t seg_end = best_len ? pos - 1 : len;
            if (seg_end > from) {
                char seg[2048];
                memcpy(seg, text + from, seg_end - from);
                seg[seg_end - from] = 0;
                size_t n;
                int32_t *ids = encode(t, seg, 0, &n);
                memcpy(want + n_want, ids, n * sizeof *ids);
                n_want += n;
                free(ids);
            }
            if (!best_len) break;
            want[n_want++] = t->added[best].id;
            from = seg_end + best_len;
        }
        size_t n;
        int32_t *ids = encode(t, text, 0, &n);
        if (n != n_want || memcmp(ids, want, n * sizeof *ids)) fail_msg("trial %d: \"%s\": ids differ", trial, text);
        free(ids);
    }
    kvs_tokenizer_free(t);
    unlink(dst);
    rmdir(dir);
}

static void test_malformed_files_are_clear_errors(void **state) {
    (void)state;
    strcpy(tmpdir, "/tmp/kvs_tok_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    char p[256];
    kvs_tokenizer *t = NULL;

    /* llama2.c */
    static const uint8_t tiny[] = {4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 'a', 0, 0, 0, 0, 2, 0, 0, 0, 'b'};
    write_file("tok.bin", tiny, sizeof tiny, p);
    assert_int_equal(kvs_tokenizer_load_llama2c(p, 3, &t), KVS_ERR_TRUNCATED);
    assert_non_null(strstr(kvs_last_error(), "token 1"));
    assert_int_equal(kvs_tokenizer_load_llama2c(p, 1, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "trailing"));
    assert_int_equal(kvs_tokenizer_load_llama2c(p, 0, &t), KVS_ERR_INVALID_ARG);
    assert_null(t);
    static const uint8_t neg[] = {4, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    write_file("neg.bin", neg, sizeof neg, p);
    assert_int_equal(kvs_tokenizer_load_llama2c(p, 1, &t), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "length -1"));
    assert_int_equal(kvs_tokenizer_load_llama2c("/nonexistent/tok.bin", 1, &t), KVS_ERR_IO);

    /* tokenizer.json */
    assert_int_equal(load_json_text("{\"model\": {"), KVS_ERR_FORMAT);
    assert_int_equal(load_json_text("{\"model\": {\"type\": \"BPE\", \"merges\": []}}"), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "model.vocab"));
    assert_int_equal(load_json_text("{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}"), KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "model.type \"Unigram\""));
    assert_int_equal(load_json_text("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [\"a c\"]}}"),
                     KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "merges[0]"));
    assert_int_equal(load_json_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -5}, \"merges\": []}}"),
                     KVS_ERR_RANGE);
    assert_int_equal(load_json_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}}}"),
                     KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "id 0"));
    /* a script property is regex syntax the engine refuses, naming the field and the construct */
    assert_int_equal(load_json_text("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": "
                                    "\"\\\\p{Han}+\"}, \"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\", " VOCAB "}}"),
                     KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "Split.pattern.Regex"));
    assert_non_null(strstr(kvs_last_error(), "other than a general category"));
    assert_int_equal(load_json_text("{\"normalizer\": {\"type\": \"NFKC\"}, \"model\": {\"type\": \"BPE\", " VOCAB "}}"),
                     KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "normalizer.type \"NFKC\""));
    assert_int_equal(load_json_text("{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", " VOCAB "}}"),
                     KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "decoder.type"));

    /* a minimal valid file: merges by rank, ids out of range on decode, buffer too small on encode */
    assert_int_equal(load_json_text("{\"model\": {\"type\": \"BPE\", " VOCAB ", \"merges\": [[\"a\", \"b\"]]}}"),
                     KVS_OK);
    sprintf(p, "%s/tokenizer.json", tmpdir);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_OK);
    int32_t ids[4];
    size_t n;
    assert_int_equal(kvs_tokenizer_encode(t, "abab", 1, ids, 4, &n), KVS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 2);
    assert_int_equal(kvs_tokenizer_encode(t, "aaaaaa", 0, ids, 4, &n), KVS_ERR_RANGE);
    assert_int_equal(n, 6);
    assert_int_equal(kvs_tokenizer_encode(t, "c", 0, ids, 4, &n), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "U+0063"));
    char *s = NULL;
    int32_t bad[] = {0, 3};
    assert_int_equal(kvs_tokenizer_decode(t, bad, 2, &s), KVS_ERR_RANGE);
    assert_null(s);
    bad[1] = -1;
    assert_int_equal(kvs_tokenizer_decode(t, bad, 2, &s), KVS_ERR_RANGE);
    assert_null(kvs_tokenizer_piece(t, 3));
    /* no decoder in the file: tokens are joined with spaces, as the tokenizers library does */
    int32_t two[] = {2, 0};
    s = decode(t, two, 2);
    assert_string_equal(s, "ab a");
    free(s);
    kvs_tokenizer_free(t);
    kvs_tokenizer_free(NULL);

    unlink(p);
    sprintf(p, "%s/tok.bin", tmpdir);
    unlink(p);
    sprintf(p, "%s/neg.bin", tmpdir);
    unlink(p);
    assert_int_equal(rmdir(tmpdir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tok512_matches_reference_ids),
        cmocka_unit_test(test_tok512_once_upon_a_time),
        cmocka_unit_test(test_tok512_byte_fallback_round_trip),
        cmocka_unit_test(test_tinystories_matches_reference_ids),
        cmocka_unit_test(test_tinystories_readme_facts),
        cmocka_unit_test(test_tinystories_unknown_characters_fuse_to_unk),
        cmocka_unit_test(test_bytelevel_llama3_matches_reference_ids),
        cmocka_unit_test(test_bytelevel_qwen2_matches_reference_ids),
        cmocka_unit_test(test_split_regex_edge_cases),
        cmocka_unit_test(test_fuzz_bytelevel_round_trip),
        cmocka_unit_test(test_fuzz_byte_fallback_round_trip),
        cmocka_unit_test(test_added_tokens_leftmost_longest),
        cmocka_unit_test(test_malformed_files_are_clear_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
