/* test_task.c — tasks of the closed loop (sim/closed_loop.h "Tasks"): the task file format (first line, items,
 * comments, CRLF, every malformed line with its exact status and message), how an item is split into the tokens the
 * models read and the text expected after them, on both shared tokenizers with the token ids written out by hand
 * (SentencePiece-style " Lily"; a tokenizer whose pieces end in the space; one piece across the boundary), the text a
 * generation adds after the context, and whole-word matching; and examples/task.sh at one budget and policy on both
 * models (its tables and per-item listing). The tokenizer cases skip with a message when ../shared/models is absent,
 * the script when KVSIM_BIN is unset too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

#include "common/kvs.h"
#include "gpu_capture/tokenizer.h"
#include "sim/closed_loop.h"

/* ---- the file format ---- */

static kvs_status parse(const char *text, kvs_closed_loop_task **t) {
    return kvs_closed_loop_task_parse(text, strlen(text), "t.txt", t);
}

static void test_parse_items_comments_and_crlf(void **state) {
    (void)state;
    kvs_closed_loop_task *t = NULL;
    const char *text = "# kvsim task v1\r\n"
                       "# a comment\n"
                       "\n"
                       "   \t \n"
                       "Her name was\tLily\r\n"
                       "He said, \"Thank you,\tMr. Brown\n"
                       "A B C D\tE"; /* no newline at the end */
    assert_int_equal(parse(text, &t), KVS_OK);
    assert_int_equal(t->n_items, 3);
    assert_string_equal(t->items[0].context, "Her name was");
    assert_string_equal(t->items[0].answer, "Lily");
    assert_int_equal(t->items[0].line, 5);
    assert_string_equal(t->items[1].context, "He said, \"Thank you,");
    assert_string_equal(t->items[1].answer, "Mr. Brown");
    assert_int_equal(t->items[1].line, 6);
    assert_string_equal(t->items[2].answer, "E");
    assert_int_equal(t->items[2].line, 7);
    /* the identity is the content: the same bytes give the same hash, one byte more another */
    kvs_closed_loop_task *u = NULL;
    assert_int_equal(parse(text, &u), KVS_OK);
    assert_string_equal(t->sha256, u->sha256);
    kvs_closed_loop_task_free(u);
    char more[256];
    snprintf(more, sizeof more, "%s\n", text);
    assert_int_equal(parse(more, &u), KVS_OK);
    assert_string_not_equal(t->sha256, u->sha256);
    assert_int_equal(strlen(t->sha256), 64);
    kvs_closed_loop_task_free(u);
    kvs_closed_loop_task_free(t);
    kvs_closed_loop_task_free(NULL);
}

static void expect_bad(const char *text, size_t len, kvs_status want, const char *msg) {
    kvs_closed_loop_task *t = (kvs_closed_loop_task *)&t; /* not NULL: the call must reset it */
    kvs_status st = kvs_closed_loop_task_parse(text, len, "t.txt", &t);
    if (st != want || !strstr(kvs_last_error(), msg))
        fail_msg("parse of '%s': status %d (%s), want %d with '%s'", text, st, kvs_last_error(), want, msg);
    assert_null(t);
}

static void test_parse_rejects_malformed_files(void **state) {
    (void)state;
#define BAD(text, want, msg) expect_bad(text, strlen(text), want, msg)
    BAD("", KVS_ERR_FORMAT, "t.txt: empty file");
    BAD("context\tanswer\n", KVS_ERR_FORMAT, "t.txt:1: not a task file: the first line must be '# kvsim task v1'");
    BAD("# kvsim task v2\nA\tB\n", KVS_ERR_VERSION, "t.txt:1: task format '# kvsim task v2' is not supported");
    BAD("# kvsim task v10\nA\tB\n", KVS_ERR_VERSION, "is not supported (this kvsim reads '# kvsim task v1')");
    BAD("# kvsim task v1\n# only comments\n\n", KVS_ERR_FORMAT, "t.txt: no item");
    BAD("# kvsim task v1\nA\tB\nno tab here\n", KVS_ERR_FORMAT, "t.txt:3: an item is CONTEXT<TAB>ANSWER: no TAB");
    BAD("# kvsim task v1\nA\tB\tC\n", KVS_ERR_FORMAT, "t.txt:2: more than one TAB");
    BAD("# kvsim task v1\n\tB\n", KVS_ERR_FORMAT, "t.txt:2: empty context");
    BAD("# kvsim task v1\nA\t\n", KVS_ERR_FORMAT, "t.txt:2: empty answer");
    BAD("# kvsim task v1\nA \tB\n", KVS_ERR_FORMAT, "t.txt:2: white space at an end of the context");
    BAD("# kvsim task v1\n A\tB\n", KVS_ERR_FORMAT, "white space at an end of the context");
    BAD("# kvsim task v1\nA\t B\n", KVS_ERR_FORMAT, "t.txt:2: white space at an end of the answer");
    BAD("# kvsim task v1\nA\tB \r\n", KVS_ERR_FORMAT, "white space at an end of the answer");
#undef BAD
    expect_bad("# kvsim task v1\nA\0\tB\n", 19, KVS_ERR_FORMAT, "t.txt: a NUL byte");
    kvs_closed_loop_task *t = NULL;
    assert_int_equal(kvs_closed_loop_task_load("/nonexistent/task.txt", &t), KVS_ERR_IO);
    assert_null(t);
}

/* ---- items as the models read them ---- */

static kvs_tokenizer *tokenizer(const char *rel) {
    char p[4096];
    snprintf(p, sizeof p, "%s/../shared/models/%s", kvs_test_root(), rel);
    if (!kvs_test_exists(p)) return NULL;
    kvs_tokenizer *t = NULL;
    kvs_status st = strstr(rel, ".json") ? kvs_tokenizer_load_hf(p, &t) : kvs_tokenizer_load_llama2c(p, 512, &t);
    assert_int_equal(st, KVS_OK);
    return t;
}

#define NEED_TOKENIZER(t, rel)                                                                               \
    kvs_tokenizer *t = tokenizer(rel);                                                                       \
    if (!t) {                                                                                                \
        fprintf(stderr, "SKIP: ../shared/models/%s absent (shared real models not installed)\n", rel);       \
        skip();                                                                                              \
    }

static void split(const kvs_tokenizer *tok, const char *context, const char *answer, kvs_closed_loop_task_input *in) {
    kvs_closed_loop_task_item it = {.context = (char *)context, .answer = (char *)answer, .line = 7};
    assert_int_equal(kvs_closed_loop_task_tokenize(tok, &it, in), KVS_OK);
}

static void expect_ids(const kvs_closed_loop_task_input *in, const int32_t *ids, int64_t n, int64_t n_context) {
    assert_int_equal(in->n_tokens, n);
    assert_int_equal(in->n_context, n_context);
    for (int64_t i = 0; i < n; i++)
        if (in->tokens[i] != ids[i]) fail_msg("token %lld: %d, want %d", (long long)i, in->tokens[i], ids[i]);
}

/* stories260K's tokenizer (llama2.c, 512 pieces): a word's piece carries its leading space, so the models read the
 * context up to "," and " Lily" (id 317) is expected; a name with no " Name" piece is spelled after a lone space
 * piece (410), which the context then ends with, and the expected text has no space. */
static void test_tokenize_llama2c_items(void **state) {
    (void)state;
    NEED_TOKENIZER(tok, "tok512.bin");
    kvs_closed_loop_task_input in;
    split(tok, "Mom said, \"Good job,", "Lily", &in);
    /* BOS, " M" "om" " said" "," " \"" "G" "oo" "d" " " "j" "o" "b" ",", then " Lily" */
    const int32_t lily[] = {1, 392, 287, 336, 432, 313, 463, 347, 418, 410, 449, 414, 430, 432, 317};
    expect_ids(&in, lily, 15, 14);
    assert_string_equal(in.expected, " Lily");
    kvs_closed_loop_task_input_clear(&in);
    kvs_closed_loop_task_input_clear(&in); /* a cleared input clears again */

    split(tok, "Mom said, \"Good job,", "Anna", &in);
    const int32_t anna[] = {1, 392, 287, 336, 432, 313, 463, 347, 418, 410, 449, 414, 430, 432, 410, 447, 416, 416, 412};
    expect_ids(&in, anna, 19, 15);
    assert_string_equal(in.expected, "Anna");

    /* what a generation adds after the context: " Lily," (317, 432) matches, " Mom" (392, 287) does not */
    char *text = NULL;
    const int32_t good[] = {317, 432}, bad[] = {392, 287};
    kvs_closed_loop_task_input_clear(&in);
    split(tok, "Mom said, \"Good job,", "Lily", &in);
    assert_int_equal(kvs_closed_loop_task_continuation(tok, &in, good, 2, &text), KVS_OK);
    assert_string_equal(text, " Lily,");
    assert_int_equal(kvs_closed_loop_task_match(text, in.expected), 1);
    free(text);
    assert_int_equal(kvs_closed_loop_task_continuation(tok, &in, bad, 2, &text), KVS_OK);
    assert_string_equal(text, " Mom");
    assert_int_equal(kvs_closed_loop_task_match(text, in.expected), 0);
    free(text);
    assert_int_equal(kvs_closed_loop_task_continuation(tok, &in, good, 0, &text), KVS_OK);
    assert_string_equal(text, "");
    assert_int_equal(kvs_closed_loop_task_match(text, in.expected), 0);
    free(text);
    kvs_closed_loop_task_input_clear(&in);
    kvs_tokenizer_free(tok);
}

/* tinystories-656K's tokenizer (BPE, 2048 pieces ending in "▁"): the space goes with the context (",▁" 94, then
 * "Lily" 629); where one piece spans the boundary (",▁Tim" 1384) the models read up to "job" and ", Tim" is
 * expected. */
static void test_tokenize_hf_items(void **state) {
    (void)state;
    NEED_TOKENIZER(tok, "tinystories-656K/tokenizer.json");
    kvs_closed_loop_task_input in;
    split(tok, "Mom said, \"Good job,", "Lily", &in);
    const int32_t lily[] = {1, 80, 927, 204, 1816, 398, 1794, 94, 629};
    expect_ids(&in, lily, 9, 8);
    assert_string_equal(in.expected, "Lily");
    kvs_closed_loop_task_input_clear(&in);

    split(tok, "Mom said, \"Good job,", "Tim", &in);
    const int32_t tim[] = {1, 80, 927, 204, 1816, 398, 1794, 1384};
    expect_ids(&in, tim, 8, 7);
    assert_string_equal(in.expected, ", Tim");
    char *text = NULL;
    const int32_t gen[] = {1384, 94};
    assert_int_equal(kvs_closed_loop_task_continuation(tok, &in, gen, 2, &text), KVS_OK);
    assert_string_equal(text, ", Tim, ");
    assert_int_equal(kvs_closed_loop_task_match(text, in.expected), 1);
    free(text);
    kvs_closed_loop_task_input_clear(&in);
    kvs_tokenizer_free(tok);
}

/* A context the tokenizer joins whole to its answer leaves nothing to read: a clear error naming the line. */
static void test_tokenize_rejects_a_context_with_no_token_of_its_own(void **state) {
    (void)state;
    NEED_TOKENIZER(tok, "tinystories-656K/tokenizer.json");
    kvs_closed_loop_task_input in;
    kvs_closed_loop_task_item it = {.context = ",", .answer = "Tim", .line = 12};
    assert_int_equal(kvs_closed_loop_task_tokenize(tok, &it, &in), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "task item at line 12: the tokenizer joins the whole context"));
    assert_null(in.tokens);
    assert_null(in.expected);
    kvs_tokenizer_free(tok);
}

/* ---- whole-word matching ---- */

static void test_match_whole_words(void **state) {
    (void)state;
    static const struct {
        const char *gen, *exp;
        int want;
    } cases[] = {
        {" Lily! You", " Lily", 1},  {"Lily", " Lily", 1},       {" Lily", "Lily", 1},
        {" Lilypad", " Lily", 0},    {" Lil", " Lily", 0},       {" Tim", " Timmy", 0},
        {" Timmy", " Tim", 0},       {" Tim's hat", " Tim", 1},  {" Tim2", " Tim", 0},
        {" Mom", " Lily", 0},        {"", " Lily", 0},           {"anything", "  ", 0},
        {", Tim,", ", Tim", 1},      {" Tim", ", Tim", 0},       {" Mr. Brown.", "Mr. Brown", 1},
        {" Lily.", " Lily.", 1},     {" Lily.x", " Lily.", 1},   {" Zoé", " Zo", 0},
        {"\n Lily\n", " Lily", 1},   {" lily", " Lily", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (kvs_closed_loop_task_match(cases[i].gen, cases[i].exp) != cases[i].want)
            fail_msg("match('%s', '%s') != %d", cases[i].gen, cases[i].exp, cases[i].want);
}

/* ---- the study script ---- */

static void test_task_script_runs_on_both_models(void **state) {
    (void)state;
    char model[4200], dir[64] = "/tmp/kvsim_task_XXXXXX", cmd[9000], path[256];
    snprintf(model, sizeof model, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!kvs_test_kvsim_bin() || !kvs_test_exists(model)) {
        fprintf(stderr, "SKIP: KVSIM_BIN unset or ../shared/models absent\n");
        skip();
    }
    if (kvs_test_sanitized()) {
        print_message("the task study script runs in the plain suite (minutes under the sanitizers)\n");
        skip();
    }
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "TASK_OUT='%s' KVSIM_BIN='%s' sh '%s/examples/task.sh' 64 window >'%s/log' 2>&1", dir,
             kvs_test_kvsim_bin(), kvs_test_root(), dir);
    int rc = system(cmd);
    snprintf(path, sizeof path, "%s/log", dir);
    char *log = kvs_test_slurp(path, NULL);
    assert_non_null(log);
    if (rc != 0) fail_msg("task.sh failed:\n%s", log);
    const char *want[] = {"== stories260K", "== tinystories-656K", "model stories260K,", "model tinystories-656K,",
                          "(full cache)        -  ", "window             64  ", "object_recall, full cache: "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(log, want[i])) fail_msg("task.sh output lacks '%s':\n%s", want[i], log);
    assert_null(strstr(log, "nan"));
    free(log);
    const char *names[] = {"stories260K", "tinystories-656K"};
    for (int m = 0; m < 2; m++) {
        snprintf(path, sizeof path, "%s/results_%s.db", dir, names[m]);
        assert_true(kvs_test_exists(path));
        snprintf(cmd, sizeof cmd, "rm -f '%s' '%s-wal' '%s-shm'", path, path, path);
        assert_int_equal(system(cmd), 0);
        const char *files[] = {"name_recall", "object_recall", "items"};
        for (int f = 0; f < 3; f++) {
            snprintf(path, sizeof path, "%s/%s_%s.txt", dir, files[f], names[m]);
            if (f == 2 && !kvs_test_exists(path)) continue; /* sqlite3 not installed */
            char *text = kvs_test_slurp(path, NULL);
            assert_non_null(text);
            if (f == 2) { /* one line per name item: line | answer | 0/1 | continuation */
                int lines = 0;
                for (char *c = text; *c; c++) lines += *c == '\n';
                assert_int_equal(lines, 32);
                assert_non_null(strstr(text, "7 | Lily | "));
            }
            free(text);
            unlink(path);
        }
    }
    snprintf(path, sizeof path, "%s/log", dir);
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_items_comments_and_crlf),
        cmocka_unit_test(test_parse_rejects_malformed_files),
        cmocka_unit_test(test_tokenize_llama2c_items),
        cmocka_unit_test(test_tokenize_hf_items),
        cmocka_unit_test(test_tokenize_rejects_a_context_with_no_token_of_its_own),
        cmocka_unit_test(test_match_whole_words),
        cmocka_unit_test(test_task_script_runs_on_both_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
