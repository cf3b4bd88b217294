/* test_capture.c — end-to-end tests of `kvsim capture` (gpu_capture/capture.h, cli/cmd_capture.c) on the
 * real models in ../shared/models: the recorded trace holds exactly the PyTorch reference's tokens, text and
 * per-layer q/k/v/o/lse (tests/fixtures/gen_reference.py), `kvsim verify` passes and `kvsim export` gives
 * the same values; multi-turn role/turn bookkeeping; and bad input exits non-zero leaving no file.
 * The CLI under test is $KVSIM_BIN (so `make asan` tests the ASan binary).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#include "common/json.h"
#include "common/kvs_math.h"
#include "gpu_capture/capture.h"
#include "gpu_capture/cuda_backend.h"
#include "trace/trace.h"

static const char *kvsim_bin(void) {
    const char *b = getenv("KVSIM_BIN");
    return b ? b : "./kvsim";
}

static void need_models(void) {
    char p[4096];
    snprintf(p, sizeof p, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!kvs_test_exists(p)) {
        fprintf(stderr, "SKIP: %s absent (shared real models not installed)\n", p);
        skip();
    }
}

/* Runs a shell command line; @return its exit status (or -1). */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}


/* kvs_test_slurp(, NULL) of dir/name */
static char *slurp_in(const char *dir, const char *name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return kvs_test_slurp(p, NULL);
}

static void rm_dir(const char *dir) { assert_int_equal(run("rm -rf '%s'", dir), 0); }

/* Loads the float32 array of a version-1 .npy file written by `kvsim export`. */
static float *load_npy(const char *path, size_t *n) {
    char *raw;
    size_t len;
    assert_int_equal(kvs_read_file(path, &raw, &len), KVS_OK);
    assert_memory_equal(raw, "\x93NUMPY", 6);
    size_t hl = (size_t)((uint8_t)raw[8] | ((uint8_t)raw[9] << 8)), off = 10 + hl;
    assert_true(off <= len);
    *n = (len - off) / 4;
    float *f = malloc(len - off + 4);
    assert_non_null(f);
    memcpy(f, raw + off, len - off);
    free(raw);
    return f;
}

static void check_model(const char *model_rel, const char *ref_name) {
    char model[4096], p[4096], dir[] = "/tmp/kvs_capture_XXXXXX", out[4200];
    snprintf(model, sizeof model, "%s/%s", kvs_test_root(), model_rel);
    assert_non_null(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/t.kvt", dir);

    /* reference */
    snprintf(p, sizeof p, "%s/tests/fixtures/%s.ref.json", kvs_test_root(), ref_name);
    char *text = kvs_test_slurp(p, NULL);
    assert_non_null(text);
    kvs_json *meta;
    assert_int_equal(kvs_json_parse(text, strlen(text), &meta), KVS_OK);
    free(text);
    snprintf(p, sizeof p, "%s/tests/fixtures/%s.ref.f32", kvs_test_root(), ref_name);
    float *refd = (float *)(void *)kvs_test_slurp(p, NULL);
    assert_non_null(refd);
    const kvs_json *rt = kvs_json_get(meta, "tokens"), *rp = kvs_json_get(meta, "positions");
    size_t n_ref = kvs_json_len(rt);

    kvs_capture_opts o;
    memset(&o, 0, sizeof o);
    o.model_path = model;
    o.steps = (int)n_ref - 1;
    o.top_p = 1;
    o.dtype = KVS_DTYPE_F32;
    o.block = 16; /* several blocks, the last one partial */
    o.threads = 2;
    o.out_path = out;
    kvs_capture_result res;
    kvs_status s = kvs_capture_run(&o, &res);
    if (s != KVS_OK) fprintf(stderr, "capture: %s\n", kvs_last_error());
    assert_int_equal(s, KVS_OK);
    assert_int_equal(res.n_positions, (int64_t)n_ref);
    assert_int_equal(res.n_prompt, 1);
    for (size_t i = 0; i < n_ref; i++) assert_int_equal(res.tokens[i], (int32_t)kvs_json_number(kvs_json_at(rt, i)));
    assert_non_null(res.text);
    assert_string_equal(res.text, kvs_json_string(kvs_json_get(meta, "text")));
    assert_false(kvs_test_exists(dir) && run("test -e '%s.partial'", out) == 0);

    /* the trace holds the reference's tokens and records */
    kvs_trace *t;
    assert_int_equal(kvs_trace_open(out, &t), KVS_OK);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    assert_int_equal(info->n_positions, (int64_t)n_ref);
    assert_int_equal(info->prompt_len, 1);
    assert_int_equal(info->n_turns, 1);
    assert_int_equal(info->capture.max_new_tokens, (int)n_ref - 1);
    assert_non_null(strstr(info->capture.settings, "backend=cpu"));
    assert_non_null(strstr(info->capture.settings, "sampling=greedy"));
    assert_non_null(strstr(info->capture.settings, "seed="));
    /* the weight layout kvsim plan counts parameters with: both shared models tie the classifier to the embedding
     * (stories260K.bin's header has a positive vocab size; tinystories-656K's config.json says
     * tie_word_embeddings true) and have no attention biases */
    assert_non_null(strstr(info->capture.settings, " tie_word_embeddings=1 qkv_bias=0 o_bias=0"));
    const int32_t *tok = kvs_trace_tokens(t);
    for (size_t i = 0; i < n_ref; i++) assert_int_equal(tok[i], res.tokens[i]);
    const kvs_model_config *c = &info->model;
    int L = c->n_layers, H = c->n_heads, Hkv = c->n_kv_heads, d = c->head_dim, G = H / Hkv, B = info->capture.block_positions;
    size_t per_layer = (size_t)(2 * H * d + 2 * Hkv * d + H);
    kvs_trace_block *blk;
    assert_int_equal(kvs_trace_block_create(t, &blk), KVS_OK);
    for (size_t pi = 0; pi < kvs_json_len(rp); pi++) {
        int pos = (int)kvs_json_number(kvs_json_at(rp, pi));
        for (int l = 0; l < L; l++) {
            const float *r = refd + (pi * (size_t)L + (size_t)l) * per_layer;
            const float *rq = r, *rk = r + H * d, *rv = rk + Hkv * d, *ro = rv + Hkv * d, *rl = ro + H * d;
            float q[1024], k[1024], v[1024], ov[1024], lse[64];
            for (int kh = 0; kh < Hkv; kh++) {
                assert_int_equal(kvs_trace_read_block(t, l, kh, pos / B, blk), KVS_OK);
                int j = pos - (int)blk->first_pos;
                memcpy(q + kh * G * d, blk->q + (size_t)j * G * d, (size_t)G * d * sizeof(float));
                memcpy(ov + kh * G * d, blk->o + (size_t)j * G * d, (size_t)G * d * sizeof(float));
                memcpy(k + kh * d, blk->k + (size_t)j * d, (size_t)d * sizeof(float));
                memcpy(v + kh * d, blk->v + (size_t)j * d, (size_t)d * sizeof(float));
                memcpy(lse + kh * G, blk->lse + (size_t)j * G, (size_t)G * sizeof(float));
            }
            assert_true(kvs_rel_l2(rq, q, (size_t)H * d) <= 1e-4);
            assert_true(kvs_rel_l2(rk, k, (size_t)Hkv * d) <= 1e-4);
            assert_true(kvs_rel_l2(rv, v, (size_t)Hkv * d) <= 1e-4);
            assert_true(kvs_rel_l2(ro, ov, (size_t)H * d) <= 1e-4);
            assert_true(kvs_rel_l2(rl, lse, (size_t)H) <= 1e-4);
        }
    }
    kvs_trace_block_free(blk);

    /* kvsim verify passes; kvsim export gives the reader's values */
    assert_int_equal(run("'%s' verify '%s' > '%s/verify.txt' 2>&1", kvsim_bin(), out, dir), 0);
    assert_int_equal(run("'%s' export '%s' --what k --layer 1 --out '%s/k.npy' > /dev/null 2>&1", kvsim_bin(), out, dir), 0);
    snprintf(p, sizeof p, "%s/k.npy", dir);
    size_t nk;
    float *kk = load_npy(p, &nk);
    assert_int_equal(nk, n_ref * (size_t)Hkv * d);
    kvs_trace_block *b2;
    assert_int_equal(kvs_trace_block_create(t, &b2), KVS_OK);
    for (int kh = 0; kh < Hkv; kh++)
        for (int64_t bi = 0; bi < info->n_blocks; bi++) {
            assert_int_equal(kvs_trace_read_block(t, 1, kh, bi, b2), KVS_OK);
            for (int j = 0; j < b2->n_pos; j++)
                assert_memory_equal(kk + ((size_t)(b2->first_pos + j) * Hkv + kh) * d, b2->k + (size_t)j * d, (size_t)d * 4);
        }
    kvs_trace_block_free(b2);
    free(kk);
    kvs_trace_close(t);
    kvs_capture_result_free(&res);
    kvs_json_free(meta);
    free(refd);
    rm_dir(dir);
}

static void test_capture_stories260K_trace_matches_reference(void **state) {
    (void)state;
    need_models();
    check_model("../shared/models/stories260K.bin", "stories260K");
}

static void test_capture_tinystories656K_trace_matches_reference(void **state) {
    (void)state;
    need_models();
    check_model("../shared/models/tinystories-656K", "tinystories-656K");
}

static void test_cli_bad_input_exits_nonzero_and_leaves_no_file(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/stories260K.bin", kvs_test_root());
    const char *b = kvsim_bin();
    /* usage errors: exit 2 */
    assert_int_equal(run("'%s' capture --model '%s' --out '%s/a' --bogus 2>/dev/null", b, m, dir), 2);
    assert_int_equal(run("'%s' capture --model '%s' 2>/dev/null", b, m), 2); /* neither --out nor --no-trace */
    assert_int_equal(run("'%s' capture --model '%s' --no-trace --steps -1 2>/dev/null", b, m), 2);
    assert_int_equal(run("'%s' capture --model '%s' --no-trace --prompt a --prompt-ids 1 2>/dev/null", b, m), 2);
    assert_int_equal(run("'%s' capture --model '%s' --no-trace --max-positions 513 2>/dev/null", b, m), 2);
    /* failures: exit 1, clear message, no OUT and no OUT.partial */
    char p[4200];
    snprintf(p, sizeof p, "%s/err", dir);
    char *e;
    if (kvs_cuda_probe(NULL, 0) != KVS_OK) { /* CPU build, or no GPU: --device cuda must fail cleanly */
        assert_int_equal(run("'%s' capture --model '%s' --out '%s/a' --device cuda 2>'%s/err'", b, m, dir, dir), 1);
        e = kvs_test_slurp(p, NULL);
        assert_non_null(e);
        assert_non_null(strstr(e, "no CUDA device"));
        free(e);
    }
    assert_int_equal(run("'%s' capture --model '%s/none.bin' --out '%s/a' 2>'%s/err'", b, dir, dir, dir), 1);
    assert_int_equal(run("'%s' capture --model '%s' --prompt-ids 1,600 --out '%s/a' 2>'%s/err'", b, m, dir, dir), 1);
    e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "token id 600 is outside the vocabulary [0, 512)"));
    free(e);
    assert_int_equal(run("'%s' capture --model '%s' --prompt 'Once upon a time there was' --max-positions 3 "
                         "--out '%s/a' 2>'%s/err'", b, m, dir, dir), 1);
    e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "longer than the 3 positions allowed"));
    free(e);
    /* a truncated checkpoint */
    assert_int_equal(run("head -c 500000 '%s' > '%s/cut.bin'", m, dir), 0);
    assert_int_equal(run("'%s' capture --model '%s/cut.bin' --tokenizer '%s/../shared/models/tok512.bin' --out '%s/a' "
                         "2>'%s/err'", b, dir, kvs_test_root(), dir, dir), 1);
    e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "needs 1056540"));
    free(e);
    snprintf(p, sizeof p, "%s/a", dir);
    assert_false(kvs_test_exists(p));
    snprintf(p, sizeof p, "%s/a.partial", dir);
    assert_false(kvs_test_exists(p));
    rm_dir(dir);
}

static void test_multi_turn_capture_records_turns(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096], p[4200], out[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/tinystories-656K", kvs_test_root());
    snprintf(p, sizeof p, "%s/turns.txt", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("Once upon a time\n\nThe dog ran to the park.\n", f);
    fclose(f);
    snprintf(out, sizeof out, "%s/mt.kvt", dir);
    assert_int_equal(run("'%s' capture --model '%s' --turns '%s' --steps 6 --ignore-eos --dtype fp16 --out '%s' "
                         "> '%s/stdout' 2>&1", kvsim_bin(), m, p, out, dir), 0);
    kvs_trace *t;
    assert_int_equal(kvs_trace_open(out, &t), KVS_OK);
    const kvs_trace_info *info = kvs_trace_info_get(t);
    assert_int_equal(info->n_turns, 2);
    assert_int_equal(info->capture.dtype, KVS_DTYPE_F16);
    const kvs_turn *tu = info->turns;
    assert_int_equal(tu[0].begin, 0);
    assert_int_equal(tu[0].end - tu[0].prompt_end, 6);
    assert_int_equal(tu[1].begin, tu[0].end);
    assert_int_equal(tu[1].end - tu[1].prompt_end, 6);
    assert_true(tu[1].prompt_end > tu[1].begin);
    assert_int_equal(info->n_positions, tu[1].end);
    const int32_t *tok = kvs_trace_tokens(t);
    const uint8_t *roles = kvs_trace_roles(t);
    const int32_t *turn = kvs_trace_turn_of(t);
    assert_int_equal(tok[0], 1); /* BOS only at the start of turn 0 */
    assert_true(tok[tu[1].begin] != 1);
    for (int64_t i = 0; i < info->n_positions; i++) {
        int ti = i >= tu[1].begin;
        assert_int_equal(turn[i], ti);
        assert_int_equal(roles[i], i >= tu[ti].prompt_end ? KVS_ROLE_GENERATED : KVS_ROLE_PROMPT);
    }
    assert_non_null(strstr(info->capture.settings, "prompt_source=turns:"));
    kvs_trace_close(t);
    assert_int_equal(run("'%s' verify '%s' > /dev/null 2>&1", kvsim_bin(), out), 0);
    rm_dir(dir);
}

static void test_no_trace_and_sampling_are_deterministic(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096], p[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/stories260K.bin", kvs_test_root());
    const char *b = kvsim_bin();
    assert_int_equal(run("'%s' capture --model '%s' --no-trace --steps 20 --threads 1 > '%s/g1'", b, m, dir), 0);
    snprintf(p, sizeof p, "%s/g1", dir);
    char *g1 = kvs_test_slurp(p, NULL);
    assert_non_null(g1);
    assert_non_null(strstr(g1, "ids: 1,403,407,261,378,432,383,286,"));
    assert_non_null(strstr(g1, "Once upon a time, there was a little girl named Lily."));
    free(g1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(run("'%s' capture --model '%s' --no-trace --steps 30 --temperature 1.0 --top-p 0.9 --seed %d "
                             "--threads %d | head -1 > '%s/s%d'", b, m, i < 2 ? 7 : 8, i + 1, dir, i), 0);
    char *s0, *s1, *s2;
    s0 = slurp_in(dir, "s0");
    s1 = slurp_in(dir, "s1");
    s2 = slurp_in(dir, "s2");
    assert_true(s0 && s1 && s2);
    assert_true(strncmp(s0, "ids: 1,", 7) == 0);
    assert_string_equal(s0, s1);      /* same seed, different thread count: same tokens */
    assert_string_not_equal(s0, s2);  /* another seed samples differently */
    free(s0);
    free(s1);
    free(s2);
    /* --prompt-ids: BOS is prepended once, not again when the list already starts with it */
    static const char *const id_args[3] = {"--prompt-ids 5,6", "--prompt-ids 1,5,6", "--no-bos --prompt-ids 5,6"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(run("'%s' capture --model '%s' --no-trace --steps 2 %s | head -1 > '%s/p%d'", b, m, id_args[i],
                             dir, i + 1),
                         0);
    s0 = slurp_in(dir, "p1");
    s1 = slurp_in(dir, "p2");
    s2 = slurp_in(dir, "p3");
    assert_true(s0 && s1 && s2);
    assert_true(strncmp(s0, "ids: 1,5,6,", 11) == 0);
    assert_string_equal(s0, s1);
    assert_true(strncmp(s2, "ids: 5,6,", 9) == 0);
    free(s0);
    free(s1);
    free(s2);
    rm_dir(dir);
}

/* Line 1 ("ids: ...") of a capture's stdout saved in dir/name. */
static char *first_line(const char *dir, const char *name) {
    char *t = slurp_in(dir, name);
    assert_non_null(t);
    char *nl = strchr(t, '\n');
    if (nl) *nl = '\0';
    return t;
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_prompt_file_drops_one_trailing_newline_and_reads_stdin(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/stories260K.bin", kvs_test_root());
    const char *b = kvsim_bin();
    write_text(dir, "p1.txt", "Once upon\n");   /* what an editor saves */
    write_text(dir, "p2.txt", "Once upon\n\n"); /* a blank line the user typed: one newline stays */
    write_text(dir, "p3.txt", "Once upon\r\n");
    write_text(dir, "p5.txt", "Once upon\r"); /* a lone carriage return is no newline: it stays a token */
    assert_int_equal(run("'%s' capture --model '%s' --prompt 'Once upon' --steps 0 --no-trace > '%s/ref'", b, m, dir), 0);
    for (int i = 1; i <= 5; i += i == 3 ? 2 : 1)
        assert_int_equal(run("'%s' capture --model '%s' --prompt-file '%s/p%d.txt' --steps 0 --no-trace > '%s/o%d'", b, m,
                             dir, i, dir, i), 0);
    assert_int_equal(run("'%s' capture --model '%s' --prompt-file - --steps 0 --no-trace < '%s/p1.txt' > '%s/o4'", b, m,
                         dir, dir), 0);
    char *ref = first_line(dir, "ref"), *o1 = first_line(dir, "o1"), *o2 = first_line(dir, "o2"),
         *o3 = first_line(dir, "o3"), *o4 = first_line(dir, "o4");
    assert_string_equal(ref, "ids: 1,403,407");
    assert_string_equal(o1, ref);
    assert_string_equal(o3, ref);
    assert_string_equal(o4, ref); /* standard input */
    assert_string_equal(o2, "ids: 1,403,407,13"); /* "\n" is token 13 */
    char *o5 = first_line(dir, "o5");
    assert_string_equal(o5, "ids: 1,403,407,16"); /* "\r" (byte 0x0d) is token 16 */
    free(o5);
    free(ref);
    free(o1);
    free(o2);
    free(o3);
    free(o4);
    assert_int_equal(run("'%s' capture --help | grep -q 'ONE trailing newline'", b), 0);
    rm_dir(dir);
}

static void test_unknown_token_text_gets_a_warning(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/tinystories-656K", kvs_test_root());
    /* this tokenizer has no piece for these characters (its byte fallback lacks them): <unk>, id 0 */
    assert_int_equal(run("'%s' capture --model '%s' --prompt 'Hi \xc3\xbc and \xf0\x9f\x99\x82' --steps 1 --no-trace "
                         "> '%s/out' 2> '%s/err'", kvsim_bin(), m, dir, dir), 0);
    char *e = slurp_in(dir, "err"), *o = slurp_in(dir, "out");
    assert_non_null(strstr(e, "kvsim capture: warning: the tokenizer has no token for 2 pieces of the prompt text"));
    assert_non_null(strstr(e, "unknown token (id 0)"));
    assert_non_null(strstr(o, ",0,")); /* the ids show them */
    free(e);
    free(o);
    /* text it can represent: no warning */
    assert_int_equal(run("'%s' capture --model '%s' --prompt 'Once upon a time' --steps 1 --no-trace > /dev/null "
                         "2> '%s/err'", kvsim_bin(), m, dir), 0);
    e = slurp_in(dir, "err");
    assert_null(strstr(e, "warning"));
    free(e);
    rm_dir(dir);
}

static void test_truncate_cuts_a_prompt_that_does_not_fit(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096], p[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/stories260K.bin", kvs_test_root());
    const char *b = kvsim_bin(), *prompt = "Once upon a time there was a little girl"; /* BOS + 11 tokens */
    snprintf(p, sizeof p, "%s/err", dir);
    /* without --truncate: refused */
    assert_int_equal(run("'%s' capture --model '%s' --prompt '%s' --max-positions 8 --steps 3 --no-trace > /dev/null "
                         "2> '%s/err'", b, m, prompt, dir), 1);
    char *e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "longer than the 8 positions allowed"));
    free(e);
    /* left: BOS and the last 4 prompt tokens, room for the 3 generated ones */
    assert_int_equal(run("'%s' capture --model '%s' --prompt '%s' --max-positions 8 --steps 3 --truncate left "
                         "--no-trace > '%s/l' 2> '%s/err'", b, m, prompt, dir, dir), 0);
    char *l = first_line(dir, "l");
    assert_int_equal(strncmp(l, "ids: 1,376,298,315,421,", 23), 0);
    free(l);
    e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "--truncate left: the prompt was cut from 12 to 5 tokens (7 dropped from the start)"));
    free(e);
    l = slurp_in(dir, "l");
    assert_non_null(strstr(l, "8 positions (5 prompt, 3 generated)"));
    free(l);
    /* right: the first 5 tokens */
    assert_int_equal(run("'%s' capture --model '%s' --prompt '%s' --max-positions 8 --steps 3 --truncate=right "
                         "--no-trace > '%s/r' 2> '%s/err'", b, m, prompt, dir, dir), 0);
    char *r = first_line(dir, "r");
    assert_int_equal(strncmp(r, "ids: 1,403,407,261,378,", 23), 0);
    free(r);
    e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "(7 dropped from the end)"));
    free(e);
    /* a prompt that fits with its generated tokens is not touched, and says nothing */
    assert_int_equal(run("'%s' capture --model '%s' --prompt 'Once upon' --steps 3 --truncate left --no-trace "
                         "> '%s/n' 2> '%s/err'", b, m, dir, dir), 0);
    e = kvs_test_slurp(p, NULL);
    assert_string_equal(e, "");
    free(e);
    /* bad values and --turns: usage errors */
    assert_int_equal(run("'%s' capture --model '%s' --prompt a --truncate middle --no-trace 2>/dev/null", b, m), 2);
    write_text(dir, "turns.txt", "a\nb\n");
    assert_int_equal(run("'%s' capture --model '%s' --turns '%s/turns.txt' --truncate left --no-trace 2>'%s/err'", b, m,
                         dir, dir), 2);
    e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "--truncate cuts a single prompt, not --turns"));
    free(e);
    rm_dir(dir);
}

static void test_multi_turn_text_is_printed_turn_by_turn(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/tinystories-656K", kvs_test_root());
    write_text(dir, "turns.txt", "Once upon a time\n\nThe dog ran to the park.\n");
    assert_int_equal(run("'%s' capture --model '%s' --turns '%s/turns.txt' --steps 6 --ignore-eos --out '%s/mt.kvt' "
                         "> '%s/out' 2>&1", kvsim_bin(), m, dir, dir, dir), 0);
    char *o = slurp_in(dir, "out");
    assert_non_null(o);
    kvs_trace *t;
    char p[4200];
    snprintf(p, sizeof p, "%s/mt.kvt", dir);
    assert_int_equal(kvs_trace_open(p, &t), KVS_OK);
    const kvs_turn *tu = kvs_trace_info_get(t)->turns;
    char want[128];
    snprintf(want, sizeof want, "--- turn 0 (positions 0..%lld) ---\nOnce upon a time", (long long)tu[0].end - 1);
    assert_non_null(strstr(o, want));
    snprintf(want, sizeof want, "\n--- turn 1 (positions %lld..%lld) ---\n", (long long)tu[1].begin,
             (long long)tu[1].end - 1);
    assert_non_null(strstr(o, want));
    assert_non_null(strstr(strstr(o, want), "The dog ran to the park."));
    kvs_trace_close(t);
    free(o);
    rm_dir(dir);
}

static void test_capture_out_link_stdout_and_write_errors(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096], p[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/stories260K.bin", kvs_test_root());
    const char *b = kvsim_bin();
    /* through a symbolic link: the target gets the trace, the link stays */
    assert_int_equal(run("cd '%s' && ln -s real.kvt link.kvt && '%s' capture --model '%s' --steps 5 --threads 1 "
                         "--out link.kvt > out 2>&1", dir, b, m), 0);
    assert_int_equal(run("test -L '%s/link.kvt' && test -f '%s/real.kvt'", dir, dir), 0);
    assert_int_equal(run("'%s' verify '%s/link.kvt' > /dev/null", b, dir), 0);
    assert_int_equal(run("ls '%s' | grep -q partial", dir), 1);
    /* to standard output: the same bytes, the text on stderr */
    assert_int_equal(run("'%s' capture --model '%s' --steps 5 --threads 1 --out - > '%s/s.kvt' 2> '%s/err'", b, m, dir,
                         dir), 0);
    assert_int_equal(run("cmp -s '%s/s.kvt' '%s/real.kvt'", dir, dir), 0);
    snprintf(p, sizeof p, "%s/err", dir);
    char *e = kvs_test_slurp(p, NULL);
    assert_non_null(strstr(e, "trace to standard output"));
    free(e);
    /* a write error on standard output: exit 1 */
    if (access("/dev/full", W_OK) == 0) {
        assert_int_equal(run("'%s' capture --model '%s' --steps 2 --no-trace > /dev/full 2> '%s/err'", b, m, dir), 1);
        e = kvs_test_slurp(p, NULL);
        assert_non_null(strstr(e, "failed: No space left on device"));
        free(e);
        assert_int_equal(run("'%s' capture --model '%s' --steps 2 --out - > /dev/full 2> /dev/null", b, m), 1);
    }
    rm_dir(dir);
}

/* --steps beyond what the context leaves after the prompt: decoding stops at the positions allowed and the trace
 * records that many as its max_new_tokens (what RocketKV, Quest and SparQ plan with), never the --steps given. */
static void test_steps_beyond_the_context_are_not_recorded(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX", m[4096], out[4200];
    assert_non_null(mkdtemp(dir));
    snprintf(m, sizeof m, "%s/../shared/models/stories260K.bin", kvs_test_root());
    snprintf(out, sizeof out, "%s/t.kvt", dir);
    kvs_capture_opts o;
    memset(&o, 0, sizeof o);
    o.model_path = m;
    o.steps = 100000;
    o.max_positions = 40;
    o.ignore_eos = 1;
    o.top_p = 1;
    o.dtype = KVS_DTYPE_F16;
    o.threads = 1;
    o.out_path = out;
    kvs_capture_result res;
    assert_int_equal(kvs_capture_run(&o, &res), KVS_OK);
    assert_int_equal(res.n_positions, 40);
    assert_int_equal(res.max_new_tokens, 40 - res.n_prompt);
    kvs_trace *t;
    assert_int_equal(kvs_trace_open(out, &t), KVS_OK);
    assert_int_equal(kvs_trace_info_get(t)->capture.max_new_tokens, 40 - res.n_prompt);
    kvs_trace_close(t);
    kvs_capture_result_free(&res);
    assert_int_equal(run("rm -rf '%s'", dir), 0);
}

/* A trace is its content: one prompt file captured from one model gives the same bytes whichever spelling of the
 * model's and the prompt's paths the command was given, from any folder, on any number of threads (the settings
 * record the files' names, not their paths, and not the thread count, which changes no number). */
static void test_same_capture_from_any_path_is_one_file(void **state) {
    (void)state;
    need_models();
    char dir[] = "/tmp/kvs_capture_XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *models[] = {"stories260K.bin", "tinystories-656K"};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(run("cd '%s' && '%s' capture --model '../shared/models/%s' --prompt-file "
                             "examples/prompts/story_bird.txt --steps 24 --ignore-eos --quiet --threads 1 --out "
                             "'%s/a.kvt' > /dev/null",
                             kvs_test_root(), kvsim_bin(), models[k], dir),
                         0);
        assert_int_equal(run("cd '%s' && '%s' capture --model '%s/../shared/models/%s' --prompt-file "
                             "'%s/examples/prompts/story_bird.txt' --steps 24 --ignore-eos --quiet --threads 2 --out "
                             "b.kvt > /dev/null",
                             dir, kvsim_bin(), kvs_test_root(), models[k], kvs_test_root()),
                         0);
        assert_int_equal(run("cmp -s '%s/a.kvt' '%s/b.kvt'", dir, dir), 0);
        kvs_trace *t;
        char b[4200];
        snprintf(b, sizeof b, "%s/b.kvt", dir);
        assert_int_equal(kvs_trace_open(b, &t), KVS_OK);
        const char *set = kvs_trace_info_get(t)->capture.settings;
        assert_non_null(strstr(set, "prompt_source=file:story_bird.txt "));
        assert_null(strstr(set, "threads="));
        assert_null(strstr(set, "/"));
        kvs_trace_close(t);
    }
    assert_int_equal(run("rm -rf '%s'", dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_stories260K_trace_matches_reference),
        cmocka_unit_test(test_capture_tinystories656K_trace_matches_reference),
        cmocka_unit_test(test_cli_bad_input_exits_nonzero_and_leaves_no_file),
        cmocka_unit_test(test_multi_turn_capture_records_turns),
        cmocka_unit_test(test_no_trace_and_sampling_are_deterministic),
        cmocka_unit_test(test_prompt_file_drops_one_trailing_newline_and_reads_stdin),
        cmocka_unit_test(test_unknown_token_text_gets_a_warning),
        cmocka_unit_test(test_truncate_cuts_a_prompt_that_does_not_fit),
        cmocka_unit_test(test_multi_turn_text_is_printed_turn_by_turn),
        cmocka_unit_test(test_capture_out_link_stdout_and_write_errors),
        cmocka_unit_test(test_steps_beyond_the_context_are_not_recorded),
        cmocka_unit_test(test_same_capture_from_any_path_is_one_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
