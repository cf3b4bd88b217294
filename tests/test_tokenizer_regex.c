/* test_tokenizer_regex.c — tests of the tokenizer.json regex engine (gpu_capture/tokenizer_regex.c) and the Split
 * pre-tokenizer behaviours (tokenizer_pretok.c), without node: Oniguruma's leftmost-first semantics on small
 * cases worked out by hand, Unicode classes and simple case folding, refusals naming the construct, the step
 * budget against catastrophic backtracking, every Split behaviour, a Regex Replace normalizer, and the pieces the
 * Rust `tokenizers` library gave for the gpt-oss (o200k), DeepSeek-V3 and synthetic patterns on short corpus records
 * (tests/fixtures/tokenizer/corpus/split_sample.jsonl, written from tests/npm/split_corpus.js; the full comparison
 * with the library runs in test_tokenizer_npm.c).
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
#include "../gpu_capture/tokenizer.h"
#include "../gpu_capture/tokenizer_internal.h"
#include "../gpu_capture/tokenizer_regex.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

/* "ms,me" of the first match at or after `from`, "none", or "error" into out. */
static const char *find(const char *pat, const char *text, size_t from, char *out, size_t cap) {
    kvs_tok_rx *rx = NULL;
    kvs_status st = kvs_tok_rx_compile(pat, strlen(pat), 0, &rx);
    if (st != KVS_OK) {
        fprintf(stderr, "compile %s: %s\n", pat, kvs_last_error());
        snprintf(out, cap, "error");
        return out;
    }
    int found;
    size_t ms, me;
    uint64_t steps = 0;
    st = kvs_tok_rx_find(rx, text, strlen(text), from, &steps, &found, &ms, &me);
    if (st != KVS_OK) snprintf(out, cap, "error");
    else if (!found) snprintf(out, cap, "none");
    else snprintf(out, cap, "%zu,%zu", ms, me);
    kvs_tok_rx_free(rx);
    return out;
}

#define FIND(pat, text, from, want)                                                                                    \
    do {                                                                                                               \
        char b_[64];                                                                                                   \
        const char *g_ = find(pat, text, from, b_, sizeof b_);                                                         \
        if (strcmp(g_, want) != 0) fprintf(stderr, "pattern %s on \"%s\": %s, want %s\n", pat, text, g_, want);      \
        assert_string_equal(g_, want);                                                                                 \
    } while (0)

static void test_leftmost_first_semantics(void **state) {
    (void)state;
    FIND("a|ab", "ab", 0, "0,1");          /* the first alternative wins, not the longest */
    FIND("ab|a", "ab", 0, "0,2");
    FIND("b", "aab", 0, "2,3");            /* leftmost start */
    FIND("x+", "axxxb", 0, "1,4");         /* greedy */
    FIND("x+?", "axxxb", 0, "1,2");        /* lazy */
    FIND("x*?y", "xxy", 0, "0,3");
    FIND("x{2,3}", "xxxxx", 0, "0,3");
    FIND("x{2}", "xxxxx", 0, "0,2");
    FIND("x{2,}", "xxxxx", 0, "0,5");
    FIND("x{,2}y", "xxxy", 0, "1,4");      /* Oniguruma's {,m} */
    FIND("x{2,3}?", "xxxxx", 0, "0,2");
    FIND("a{x", "a{x", 0, "0,3");          /* not an interval: literal '{' */
    FIND("\\s+(?!\\S)", "a   b", 1, "1,3"); /* gives back one space so that a space follows */
    FIND("\\s+(?!\\S)", "a   ", 1, "1,4");
    FIND("\\s*[\\r\\n]+", "  \n \n  x", 0, "0,5");
    FIND("(?=b).", "ab", 0, "1,2");
    FIND("(?!a).", "ab", 0, "1,2");
    FIND("^b", "a\nb", 0, "2,3");
    FIND("a$", "ab\na", 0, "3,4");
    FIND("\\Aa", "aa", 1, "none");
    FIND("a\\z", "aa", 0, "1,2");
    FIND("x*", "ab", 0, "0,0");            /* an empty match is a match */
    FIND("(?:ab)+", "ababa", 0, "0,4");
    FIND("a.c", "a\nc abc", 0, "4,7");     /* '.' is not '\n' */
    FIND("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+", " hello", 0, "0,6");
    FIND("\\p{N}{1,3}", "12345", 0, "0,3");
    FIND("\\p{N}{1,3}", "12345", 3, "3,5");
    FIND("[a-c-]+", "x-ab-", 0, "1,5");    /* a '-' at the end of a class is literal */
    FIND("[]a]+", "x]a", 0, "1,3");        /* a ']' first in a class is literal */
    FIND("\\x41\\u0042\\x{43}", "ABC", 0, "0,3");
    FIND("\\.\\*", "a.*", 0, "1,3");
    FIND("none", "abc", 0, "none");
    /* an unbounded repeat of what can match empty stops when an iteration matches empty (Oniguruma's empty check) */
    FIND("(a*)*b", "aab", 0, "0,3");
    FIND("(?:a|)+", "aab", 0, "0,2");
    FIND("(?:x*)*", "ab", 0, "0,0");
    FIND("(?:a?" "?)*?b", "aab", 0, "0,3"); /* split literal: no trigraph */
    FIND("(?:(?=a)|b)*a", "bba", 0, "0,3");
    /* a long run keeps thousands of alternatives pending: past the search's local stack, onto the heap */
    static char run[1200];
    memset(run, 'a', 1000);
    strcpy(run + 1000, "b");
    FIND("(?:a|x)+b", run, 0, "0,1001");
    FIND("(?:a|x)+c", run, 0, "none");
}

static void test_unicode_classes_and_case_folding(void **state) {
    (void)state;
    FIND("\\p{Lu}", "é\xc3\x89", 0, "2,4");             /* É is Lu, é is Ll */
    FIND("\\p{N}", "x\xc2\xbd", 0, "1,3");              /* ½ is No */
    FIND("\\pL+", "12ab", 0, "2,4");
    FIND("\\P{L}+", "ab12", 0, "2,4");
    FIND("\\p{^L}+", "ab12", 0, "2,4");
    FIND("[\\p{P}\\p{S}]+", "a\xe2\x82\xac\xc2\xab", 0, "1,6"); /* € (Sc) and « (Pi) */
    FIND("\\s", "a\xc2\x85", 0, "1,3");                 /* U+0085 is White_Space */
    FIND("\\s", "a\xef\xbb\xbf\xe2\x80\x8b", 0, "none"); /* U+FEFF and U+200B are not */
    FIND("\\d", "a\xd9\xa3", 0, "1,3");                 /* Arabic-Indic three is Nd */
    FIND("\\p{Letter}\\p{mark}", "e\xcc\x81", 0, "0,3");
    FIND("\\w+", "a_1\xcc\x81-", 0, "0,5");
    FIND("\\w+", "-\xc2\xbd\xe2\x85\xb7-", 0, "1,6");             /* \w holds No (one half) and Nl (roman eight) */
    FIND("[\\u4e00-\\u9fa5]+", "a\xe4\xb8\xad\xe6\x96\x87" "b", 0, "1,7");
    /* (?i:...) compares simple case foldings: U+017F long s folds to s, U+212A KELVIN SIGN to k */
    FIND("(?i:'s)", "'S", 0, "0,2");
    FIND("(?i:'s)", "'\xc5\xbf", 0, "0,3");
    FIND("(?i:'s)x", "'Kx", 0, "none");
    FIND("(?i:k)", "\xe2\x84\xaa", 0, "0,3");
    FIND("(?i:[a-c]+)", "xBCa", 0, "1,4");
    FIND("(?i:[A-C]+)", "xbcA", 0, "1,4");  /* lower case against an upper-case class: through the fold sources */
    FIND("(?i:[^a])", "Ab", 0, "1,2");                  /* the class is folded before its negation */
    FIND("(?i)ab|cd", "xCD", 0, "1,3");                 /* (?i) holds for the rest of the group, '|' included */
    FIND("a(?i)b", "AB", 0, "none");
    FIND("(?i:a(?-i:b))", "Ab", 0, "0,2");
    FIND("(?i:a(?-i:b))", "AB", 0, "none");
}

#define REFUSE(pat, status, needle)                                                                                    \
    do {                                                                                                               \
        kvs_tok_rx *rx_ = NULL;                                                                                        \
        kvs_status s_ = kvs_tok_rx_compile(pat, strlen(pat), 0, &rx_);                                                 \
        if (s_ != (status) || !strstr(kvs_last_error(), needle))                                                       \
            fprintf(stderr, "pattern %s: status %d, message %s\n", pat, (int)s_, kvs_last_error());                    \
        assert_int_equal(s_, status);                                                                                  \
        assert_null(rx_);                                                                                              \
        assert_non_null(strstr(kvs_last_error(), needle));                                                             \
    } while (0)

static void test_refusals_name_the_construct(void **state) {
    (void)state;
    REFUSE("(a)\\1", KVS_ERR_UNSUPPORTED, "backreference");
    REFUSE("(?<=a)b", KVS_ERR_UNSUPPORTED, "lookbehind");
    REFUSE("(?<!a)b", KVS_ERR_UNSUPPORTED, "lookbehind");
    REFUSE("\\p{Han}", KVS_ERR_UNSUPPORTED, "general category");
    REFUSE("a++", KVS_ERR_UNSUPPORTED, "possessive");
    REFUSE("(?>a)", KVS_ERR_UNSUPPORTED, "atomic");
    REFUSE("a{1001}", KVS_ERR_UNSUPPORTED, "above 1000");
    REFUSE("\\bword", KVS_ERR_UNSUPPORTED, "\\b");
    REFUSE("[[:alpha:]]", KVS_ERR_UNSUPPORTED, "nested class");
    REFUSE("[a&&b]", KVS_ERR_UNSUPPORTED, "intersection");
    REFUSE("(?m:a)", KVS_ERR_UNSUPPORTED, "option");
    REFUSE("(?<n>a)", KVS_ERR_UNSUPPORTED, "named group");
    REFUSE("\\q", KVS_ERR_UNSUPPORTED, "escape");
    REFUSE("(", KVS_ERR_FORMAT, "')'");
    REFUSE("a)", KVS_ERR_FORMAT, "unbalanced");
    REFUSE("[a", KVS_ERR_FORMAT, "unterminated");
    REFUSE("*a", KVS_ERR_FORMAT, "nothing to repeat");
    REFUSE("[z-a]", KVS_ERR_FORMAT, "out of order");
    REFUSE("a\\", KVS_ERR_FORMAT, "backslash");
    REFUSE("\\x{110000}", KVS_ERR_FORMAT, "Unicode");
    REFUSE("x{3,2}", KVS_ERR_FORMAT, "m < n");
    REFUSE("\xff", KVS_ERR_FORMAT, "UTF-8");
    REFUSE("(?:(?:a{1000}){1000})", KVS_ERR_RANGE, "instructions");
    char deep[1024] = {0};
    for (int i = 0; i < 300; i++) strcat(deep, "(");
    REFUSE(deep, KVS_ERR_UNSUPPORTED, "nesting");
}

static void test_step_budget_stops_catastrophic_backtracking(void **state) {
    (void)state;
    kvs_tok_rx *rx = NULL;
    assert_int_equal(kvs_tok_rx_compile("(a|a)*b", 7, 0, &rx), KVS_OK);
    char text[64];
    memset(text, 'a', 40);
    text[40] = 0;
    int found;
    size_t ms, me;
    uint64_t steps = 0;
    double t0 = kvs_now_s();
    /* 2^40 paths: refused after the default budget, in well under a second's worth of steps */
    assert_int_equal(kvs_tok_rx_find(rx, text, 40, 0, &steps, &found, &ms, &me), KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "backtracks"));
    assert_true(steps > (1u << 24) && steps <= (1u << 24) + 1);
    assert_true(kvs_now_s() - t0 < 10.0);
    kvs_tok_rx_set_step_budget(rx, 1000);
    steps = 0;
    assert_int_equal(kvs_tok_rx_find(rx, text, 40, 0, &steps, &found, &ms, &me), KVS_ERR_UNSUPPORTED);
    /* a short text fits the budget and finds no match */
    steps = 0;
    assert_int_equal(kvs_tok_rx_find(rx, text, 4, 0, &steps, &found, &ms, &me), KVS_OK);
    assert_int_equal(found, 0);
    /* the counter is shared: searches that each fit, together past the budget, are refused */
    steps = 990;
    assert_int_equal(kvs_tok_rx_find(rx, text, 4, 0, &steps, &found, &ms, &me), KVS_ERR_UNSUPPORTED);
    kvs_tok_rx_free(rx);
    /* the same through a Split: "(a|a)*b|." matches one character after an exponential failure at each start. The
     * budget is the word's, not each search's: with room for 1.5 times the first search's steps the split is refused
     * (the later searches add up to about as much again), with room for 3 times it goes through. */
    kvs_tok_pre_step ps = {.kind = KVS_TOK_PRE_SPLIT, .regex = KVS_TOK_RE_NONE, .behavior = KVS_TOK_SPLIT_ISOLATED};
    assert_int_equal(kvs_tok_rx_compile("(a|a)*b|.", 9, 0, &ps.rx), KVS_OK);
    steps = 0;
    assert_int_equal(kvs_tok_rx_find(ps.rx, text, 12, 0, &steps, &found, &ms, &me), KVS_OK);
    assert_int_equal(me, 1);
    uint64_t first = steps;
    kvs_tok_piece *pc = NULL;
    size_t np = 0;
    kvs_tok_rx_set_step_budget(ps.rx, first * 3 / 2);
    assert_int_equal(kvs_tok_split_pieces(&ps, text, 12, 0, &pc, &np), KVS_ERR_UNSUPPORTED);
    assert_null(pc);
    kvs_tok_rx_set_step_budget(ps.rx, first * 3);
    assert_int_equal(kvs_tok_split_pieces(&ps, text, 12, 0, &pc, &np), KVS_OK);
    assert_int_equal(np, 12);
    free(pc);
    kvs_tok_rx_free(ps.rx);
}

/* The pieces of text under a Split step (pattern literal or regex), joined with '|'. */
static void split(const char *pat, int literal, int behavior, int invert, const char *text, char *out, size_t cap) {
    kvs_tok_pre_step ps = {.kind = KVS_TOK_PRE_SPLIT, .regex = KVS_TOK_RE_NONE, .behavior = behavior,
                           .invert = invert};
    assert_int_equal(kvs_tok_rx_compile(pat, strlen(pat), literal, &ps.rx), KVS_OK);
    kvs_tok_piece *pc = NULL;
    size_t n = 0;
    assert_int_equal(kvs_tok_split_pieces(&ps, text, strlen(text), 0, &pc, &n), KVS_OK);
    out[0] = 0;
    for (size_t i = 0; i < n; i++) {
        if (pc[i].end == pc[i].start) continue; /* empty pieces are dropped by the words list */
        size_t l = strlen(out);
        snprintf(out + l, cap - l, "%s%.*s", l ? "|" : "", (int)(pc[i].end - pc[i].start), text + pc[i].start);
    }
    free(pc);
    kvs_tok_rx_free(ps.rx);
}

static void test_split_behaviours(void **state) {
    (void)state;
    char b[256];
    /* values as the Rust library's SplitDelimiterBehavior gives them (tests/npm/split_corpus.js) */
    split(" ", 1, KVS_TOK_SPLIT_ISOLATED, 0, "a  b", b, sizeof b);
    assert_string_equal(b, "a| | |b");
    split(" ", 1, KVS_TOK_SPLIT_MERGED_PREV, 0, "a  b", b, sizeof b);
    assert_string_equal(b, "a | |b");
    split(" ", 1, KVS_TOK_SPLIT_MERGED_NEXT, 0, "a  b", b, sizeof b);
    assert_string_equal(b, "a| | b");
    split(" ", 1, KVS_TOK_SPLIT_REMOVED, 0, "a  b", b, sizeof b);
    assert_string_equal(b, "a|b");
    split(" ", 1, KVS_TOK_SPLIT_CONTIGUOUS, 0, "a  b", b, sizeof b);
    assert_string_equal(b, "a|  |b");
    split("\\d", 0, KVS_TOK_SPLIT_CONTIGUOUS, 0, "ab123c4", b, sizeof b);
    assert_string_equal(b, "ab|123|c|4");
    split("\\p{L}+", 0, KVS_TOK_SPLIT_REMOVED, 1, "ab, cd!", b, sizeof b);
    assert_string_equal(b, "ab|cd");
    split("\\p{P}+", 0, KVS_TOK_SPLIT_MERGED_NEXT, 0, "x.y!!z", b, sizeof b);
    assert_string_equal(b, "x|.y|!!z");
    split("x*", 0, KVS_TOK_SPLIT_ISOLATED, 0, "abxxc", b, sizeof b);
    assert_string_equal(b, "a|b|xx|c"); /* empty matches cut between characters, not after a match */
}

/* Every record of split_sample.jsonl: the engine's pieces are the Rust library's. */
static void test_rust_library_sample_pieces(void **state) {
    (void)state;
    char p[4096];
    snprintf(p, sizeof p, "%s/tests/fixtures/tokenizer/corpus/split_patterns.json", kvs_test_root());
    size_t len;
    char *pt = kvs_test_slurp(p, &len);
    assert_non_null(pt);
    kvs_json *pats = NULL;
    assert_int_equal(kvs_json_parse(pt, len, &pats), KVS_OK);
    snprintf(p, sizeof p, "%s/tests/fixtures/tokenizer/corpus/split_sample.jsonl", kvs_test_root());
    char *sample = kvs_test_slurp(p, &len);
    assert_non_null(sample);
    int n = 0, bad = 0, gpt_oss = 0;
    for (char *line = sample, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (line[0] == '#' || !line[0]) continue;
        kvs_json *rec = NULL;
        assert_int_equal(kvs_json_parse(line, strlen(line), &rec), KVS_OK);
        const char *name = kvs_json_string(kvs_json_get(rec, "pattern"));
        const char *text = kvs_json_string(kvs_json_get(rec, "text"));
        const kvs_json *want = kvs_json_get(rec, "pieces");
        const kvs_json *pre = NULL;
        for (size_t k = 0; k < kvs_json_len(pats); k++)
            if (!strcmp(kvs_json_string(kvs_json_get(kvs_json_at(pats, k), "name")), name))
                pre = kvs_json_get(kvs_json_at(pats, k), "pre_tokenizer");
        assert_non_null(pre);
        const kvs_json *pat = kvs_json_get(pre, "pattern");
        const char *re = kvs_json_string(kvs_json_get(pat, "Regex"));
        const char *beh = kvs_json_string(kvs_json_get(pre, "behavior"));
        static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext",
                                            "Contiguous"};
        int b = -1;
        for (int k = 0; k < 5; k++)
            if (!strcmp(beh, names[k])) b = k;
        assert_true(b >= 0);
        kvs_tok_pre_step ps = {.kind = KVS_TOK_PRE_SPLIT, .regex = KVS_TOK_RE_NONE, .behavior = b,
                               .invert = kvs_json_bool(kvs_json_get(pre, "invert"))};
        const char *src = re ? re : kvs_json_string(kvs_json_get(pat, "String"));
        assert_int_equal(kvs_tok_rx_compile(src, strlen(src), re == NULL, &ps.rx), KVS_OK);
        kvs_tok_piece *pc = NULL;
        size_t np = 0, k = 0;
        assert_int_equal(kvs_tok_split_pieces(&ps, text, strlen(text), 0, &pc, &np), KVS_OK);
        int ok = 1;
        for (size_t i = 0; i < np; i++) {
            if (pc[i].end == pc[i].start) continue;
            const kvs_json *w = kvs_json_at(want, k++);
            if (!w || kvs_json_string_len(w) != pc[i].end - pc[i].start ||
                memcmp(kvs_json_string(w), text + pc[i].start, pc[i].end - pc[i].start) != 0)
                ok = 0;
        }
        if (k != kvs_json_len(want)) ok = 0;
        if (!ok) {
            fprintf(stderr, "%s: pieces differ from the Rust library's on %s\n", name, line);
            bad++;
        }
        n++;
        gpt_oss += !strcmp(name, "gpt_oss");
        free(pc);
        kvs_tok_rx_free(ps.rx);
        kvs_json_free(rec);
    }
    assert_true(n >= 100);
    assert_true(gpt_oss >= 40);
    assert_int_equal(bad, 0);
    free(sample);
    free(pt);
    kvs_json_free(pats);
}

/* A tokenizer.json with a Regex Replace normalizer and a Split String pre-tokenizer loads and runs; a hostile
 * pattern is refused at load with the file, the field and the construct in the message. */
static void test_loader_regex_replace_and_refusals(void **state) {
    (void)state;
    char dir[256], p[512];
    assert_int_equal(kvs_test_make_tmp(dir, sizeof dir), 0);
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    const char *ok = "{\"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" {2,}\"}, "
                     "\"content\": \"_\"},"
                     " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"_\"}, \"behavior\": "
                     "\"MergedWithNext\", \"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0},"
                     " \"merges\": []}}";
    assert_int_equal(kvs_test_spit_text(p, ok), 0);
    kvs_tokenizer *t = NULL;
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_OK);
    /* the pieces joined with '|': "  " and more become "_", and each piece starts at a "_" */
    char got[256] = {0};
    kvs_tok_words w = {0};
    kvs_tok_out o = {NULL, 0, 0, &w};
    assert_int_equal(kvs_tok_hf_encode(t, "a b   c  d", 10, &o), KVS_OK);
    for (size_t i = 0; i < w.n; i++) {
        size_t l = strlen(got);
        snprintf(got + l, sizeof got - l, "%s%.*s", i ? "|" : "", (int)w.len[i], w.text.p + w.off[i]);
    }
    assert_string_equal(got, "a b|_c|_d");
    kvs_tok_words_free(&w);
    kvs_tokenizer_free(t);
    const char *hostile = "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?<=x)y\"}, "
                          "\"behavior\": \"Isolated\", \"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": "
                          "{\"a\": 0}, \"merges\": []}}";
    assert_int_equal(kvs_test_spit_text(p, hostile), 0);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(kvs_last_error(), "pre_tokenizer Split.pattern.Regex"));
    assert_non_null(strstr(kvs_last_error(), "lookbehind"));
    assert_non_null(strstr(kvs_last_error(), dir));
    /* a pattern that loads but backtracks exponentially on a text: encode refuses (never KVS_ERR_RANGE, which would
     * tell the caller to grow its id buffer and retry) */
    const char *slow = "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a|a)*b|.\"}, "
                       "\"behavior\": \"Isolated\", \"invert\": false}, \"model\": {\"type\": \"BPE\", \"vocab\": "
                       "{\"a\": 0}, \"merges\": []}}";
    assert_int_equal(kvs_test_spit_text(p, slow), 0);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_OK);
    int32_t ids[64];
    size_t n_ids;
    assert_int_equal(kvs_tokenizer_encode(t, "aaaaaaaaaaaa", 0, ids, 64, &n_ids), KVS_OK);
    assert_int_equal(n_ids, 12);
    assert_int_equal(kvs_tokenizer_encode(t, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 0, ids, 64, &n_ids),
                     KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "backtracks"));
    kvs_tokenizer_free(t);
    t = NULL;
    const char *beh = "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, \"behavior\": "
                      "\"Sideways\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}";
    assert_int_equal(kvs_test_spit_text(p, beh), 0);
    assert_int_equal(kvs_tokenizer_load_hf(p, &t), KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "Sideways"));
    kvs_test_rm_rf(dir);
}

/* kvsim tokenize: the ids are the library's, the pieces its pre-tokenizer's, the --time byte count the corpus's;
 * bad usage exits 2, a bad corpus line 1 naming the line. */
static void test_cli_tokenize(void **state) {
    kvs_test_cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char tok[4096], corpus[256], err_line[512];
    snprintf(tok, sizeof tok, "%s/tests/fixtures/tokenizer/bytelevel_llama3/tokenizer.json", kvs_test_root());
    snprintf(corpus, sizeof corpus, "%s/c.jsonl", f->dir);
    assert_int_equal(kvs_test_spit_text(corpus, "# comment\n\"Hello world\"\n\n  \"a\\tb\\r\\n\"\n"), 0);
    const char *pieces[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, "--pieces", NULL};
    assert_int_equal(kvs_test_cli_run(f, pieces), 0);
    char *out = kvs_test_slurp(f->out, NULL);
    assert_non_null(out);
    assert_string_equal(out, "[\"Hello\",\"\xc4\xa0world\"]\n[\"a\",\"\xc4\x89" "b\",\"\xc4\x8d\xc4\x8a\"]\n");
    free(out);
    /* ids: the library's own encode of the two records, printed the same way */
    kvs_tokenizer *t = NULL;
    assert_int_equal(kvs_tokenizer_load_hf(tok, &t), KVS_OK);
    char want[512] = {0};
    const char *recs[] = {"Hello world", "a\tb\r\n"};
    for (int r = 0; r < 2; r++) {
        int32_t ids[64];
        size_t n;
        assert_int_equal(kvs_tokenizer_encode(t, recs[r], 0, ids, 64, &n), KVS_OK);
        for (size_t i = 0; i < n; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), i ? " %d" : "%d", ids[i]);
        strcat(want, "\n");
    }
    kvs_tokenizer_free(t);
    const char *ids[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, "--time", "--repeat", "2", NULL};
    assert_int_equal(kvs_test_cli_run(f, ids), 0);
    out = kvs_test_slurp(f->out, NULL);
    assert_string_equal(out, want);
    free(out);
    /* 11 + 5 bytes, encoded twice in the timed passes */
    assert_true(kvs_test_file_has(f->err, "bytes 16 repeat 2 mb_per_s"));
    const char *usage1[] = {"tokenize", "--text", "x", NULL};
    assert_int_equal(kvs_test_cli_run(f, usage1), 2);
    const char *usage2[] = {"tokenize", "--tokenizer", tok, "--text", "x", "--corpus", corpus, NULL};
    assert_int_equal(kvs_test_cli_run(f, usage2), 2);
    const char *usage3[] = {"tokenize", "--tokenizer", tok, "--text", "x", "--time", "--repeat", "0", NULL};
    assert_int_equal(kvs_test_cli_run(f, usage3), 2);
    assert_int_equal(kvs_test_spit_text(corpus, "\"ok\"\n123\n"), 0);
    const char *bad[] = {"tokenize", "--tokenizer", tok, "--corpus", corpus, NULL};
    assert_int_equal(kvs_test_cli_run(f, bad), 1);
    snprintf(err_line, sizeof err_line, "%s:2: a record must be one JSON string", corpus);
    assert_true(kvs_test_file_has(f->err, err_line));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leftmost_first_semantics),
        cmocka_unit_test(test_unicode_classes_and_case_folding),
        cmocka_unit_test(test_refusals_name_the_construct),
        cmocka_unit_test(test_step_budget_stops_catastrophic_backtracking),
        cmocka_unit_test(test_split_behaviours),
        cmocka_unit_test(test_rust_library_sample_pieces),
        cmocka_unit_test(test_loader_regex_replace_and_refusals),
        cmocka_unit_test_setup_teardown(test_cli_tokenize, kvs_test_cli_setup, kvs_test_cli_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
