/* test_plan_codec.c — `kvsim plan --codec` (analysis/plan.h, the codec byte rule): hand-computed bytes per token
 * and per sequence for int, kivi, hf and fp8 codecs on Llama-3.1-8B (32 layers, 8 KV heads, d 128), the 16-bit
 * residual counted exactly at the planned length (the saw-tooth's top inside a decode), the planner's bytes against
 * a second count (sim/codec.h's kvs_codec_state_bytes on real streams), a measured profile carrying the codec, the
 * CLI's text, JSON, CSV and database, and bad input (--kv-dtype int4, bad specs).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <sqlite3.h>

#include "analysis/plan.h"
#include "sim/codec.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

static kvs_codec *codec_of(const char *spec) {
    kvs_codec *c = NULL;
    assert_int_equal(kvs_codec_parse(spec, &c), KVS_OK);
    return c;
}

/* Llama-3.1-8B with a codec, no GPU memory */
static kvs_plan_setup llama8b(const kvs_codec *c) {
    const kvs_plan_model *m = NULL;
    assert_int_equal(kvs_plan_preset_find("Llama-3.1-8B", &m), KVS_OK);
    kvs_plan_setup s = {.model = *m, .kv_elem_bytes = 2, .codec = c, .weight_elem_bytes = 2, .n_gpus = 1};
    return s;
}

static double seq_bytes(const kvs_plan_setup *s, kvs_plan_kind kind, int64_t budget, int64_t context,
                        int64_t response) {
    kvs_plan_policy pol = {.kind = kind, .budget = budget};
    kvs_plan_point pt;
    assert_int_equal(kvs_plan_eval(s, &pol, context, response, 1, &pt), KVS_OK);
    return pt.seq_device_bytes;
}

/* int4, per-token groups of 32 channels for K and V: a row is 128 x 4 / 8 = 64 B of codes + 4 groups x (fp16 scale
 * + fp16 zero) = 80 B; x 2 (K, V) x 8 KV heads x 32 layers = 40,960 B per token against 131,072 at fp16. */
static void test_int4_llama8b(void **state) {
    (void)state;
    kvs_codec *c = codec_of("int:bits=4,group=32,k_axis=channel,v_axis=channel");
    kvs_plan_setup s = llama8b(c);
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_K, 128) == 80);
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_V, 128) == 80);
    assert_true(kvs_plan_codec_bytes_per_token(&s.model, c) == 40960);
    assert_true(kvs_plan_kv_bytes_per_token(&s.model, 2) == 131072);
    /* no row held in 16 bits: the full cache is the tokens times 40,960 at every length */
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4096, 0) == 4096.0 * 40960);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4096, 1000) == 5096.0 * 40960);
    assert_true(seq_bytes(&s, KVS_PLAN_CONSTANT, 1024, 4096, 1000) == 1024.0 * 40960);
    assert_true(seq_bytes(&s, KVS_PLAN_PROMPT_ONLY, 1024, 4096, 1000) == 2024.0 * 40960);
    kvs_codec_free(c);

    /* K token-axis (groups of 32 positions per channel: 128 x 4 B of scale/zero per 32 positions = 16 B a row, the
     * same as 4 channel groups) and V channel-axis: 80 + 80 again; but the unfilled key group is held in 16 bits:
     * at 4100 tokens 4100 mod 32 = 4 keys x 256 B */
    c = codec_of("int:bits=4,group=32");
    s = llama8b(c);
    assert_string_equal(kvs_codec_spec(c), "int:bits=4,group=32,k_axis=token,v_axis=channel");
    assert_true(kvs_plan_codec_bytes_per_token(&s.model, c) == 40960);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 4100, 4100), 4);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_V, 4100, 4100), 0);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4100, 0) == 256.0 * (4 * 256 + 4096 * 80 + 4100 * 80));
    /* context 4096, response 30: the decode reaches 4126, 30 keys unquantized = the top of the group's saw-tooth
     * (4127 would quantize 4096..4127); at 4126 it is both the end and the top */
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4096, 30) == 256.0 * (30 * 256 + 4096 * 80 + 4126 * 80));
    /* response 32: the end (4128: 0 held) is smaller than 4127 (31 held), the peak */
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4096, 32) == 256.0 * (31 * 256 + 4096 * 80 + 4127 * 80));
    kvs_codec_free(c);

    /* 3 bits pack at 3/8 byte: 48 B of codes + one 128-channel group's 4 B */
    c = codec_of("int:bits=3,group=128,k_axis=channel,v_axis=channel");
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_K, 128) == 52);
    assert_true(kvs_codec_position_bytes(c, 128) == 104);
    kvs_codec_free(c);
}

/* KIVI-2 (G 32, R 128): keys per channel over 32 positions: 32 B of codes + 128 x 4 / 32 = 16 B; values per token:
 * 32 + 4 x 4 = 48 B; 96 B a position, 24,576 per token. The residual: after a 4096-token prefill 4096 mod 128 = 0
 * keys and min(4096, 128) = 128 values in 16 bits (256 B a row). */
static void test_kivi_residual(void **state) {
    (void)state;
    kvs_codec *c = codec_of("kivi");
    kvs_plan_setup s = llama8b(c);
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_K, 128) == 48);
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_V, 128) == 48);
    assert_true(kvs_plan_codec_bytes_per_token(&s.model, c) == 24576);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4096, 0) == 256.0 * (4096 * 48 + 128 * 256 + 3968 * 48));
    /* a 4000-token prompt: 4000 mod 128 = 32 keys and 128 values held */
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 4000, 4000), 32);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4000, 0) ==
                256.0 * (32 * 256 + 3968 * 48 + 128 * 256 + 3872 * 48));
    /* context 4096, response 200: at 4224 the key residual holds 128 (4224 - 128 x floor(4223/128)) and the values
     * 129, 458,960 B per head; at the end, 4296, 72 keys and 129 values, 454,224 B: the peak is inside */
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 4096, 4224), 128);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_V, 4096, 4224), 129);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 4096, 4296), 72);
    assert_true(kvs_plan_codec_bytes(c, 128, 4096, 4296, 4296) == 454224);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 4096, 200) == 256.0 * 458960);
    /* a budget of 64 below the residual: every resident row is one of the 16-bit rows (the upper bound) */
    assert_true(seq_bytes(&s, KVS_PLAN_CONSTANT, 64, 4096, 200) == 256.0 * 2 * 64 * 256);
    kvs_codec_free(c);
}

/* hf (quanto int4, groups of 64 channels, residual 128): 64 + 2 x 4 = 72 B a row for K and V; the prompt quantized
 * at prefill, the residual filling from the first decode step: with context 1000 and response 300 the top is at
 * 1256 (128 held), above the end 1300 (44 held). */
static void test_hf_residual(void **state) {
    (void)state;
    kvs_codec *c = codec_of("hf");
    kvs_plan_setup s = llama8b(c);
    assert_string_equal(kvs_codec_spec(c), "hf:bits=4,group=64,residual=128");
    assert_true(kvs_plan_codec_bytes_per_token(&s.model, c) == 256.0 * 144);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 1000, 1000), 0);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_V, 1000, 1256), 128);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_V, 1000, 1257), 1);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 1000, 1300), 44);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 1000, 0) == 1000.0 * 256 * 144);
    assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 1000, 300) == 256.0 * 2 * (128 * 256 + 1128 * 72));
    kvs_codec_free(c);
}

/* fp8: a byte per element, 65,536 B per token; scale=prompt adds fp32 K and V scales: per=head 8 B per (layer, KV
 * head) = 2,048 B a sequence, per=tensor 8 B per layer = 256 B; a numeric scale is the deployment's constant. */
static void test_fp8_scales(void **state) {
    (void)state;
    const char *specs[] = {"fp8", "fp8:scale=prompt,per=head", "fp8:format=e5m2,scale=prompt"};
    const double extra[] = {0, 2048, 256};
    for (int i = 0; i < 3; i++) {
        kvs_codec *c = codec_of(specs[i]);
        kvs_plan_setup s = llama8b(c);
        assert_true(kvs_plan_codec_bytes_per_token(&s.model, c) == 65536);
        assert_true(seq_bytes(&s, KVS_PLAN_FULL, 0, 1000, 0) == 1000.0 * 65536 + extra[i]);
        assert_true(seq_bytes(&s, KVS_PLAN_CONSTANT, 100, 1000, 24) == 100.0 * 65536 + extra[i]);
        kvs_codec_free(c);
    }
}

/* The planner's bytes against a second count: real streams of each codec (sim/codec.h) advanced step by step,
 * kvs_codec_state_bytes over every position (the full cache) and over the most recent m (a window) where a window's
 * groups are whole rows (no token axis), at every decode step. */
static void test_against_codec_state(void **state) {
    (void)state;
    const char *specs[] = {"int:bits=4,group=4",
                           "int:bits=2,group=8,k_axis=token,v_axis=token",
                           "int:bits=3,group=5,k_axis=channel,v_axis=channel",
                           "kivi:bits=2,group=4,residual=8",
                           "kivi:bits=4,group=8,residual=8",
                           "hf:bits=2,group=8,residual=6",
                           "fp8:scale=prompt,per=head",
                           "fp8"};
    const int per_rows[] = {0, 0, 1, 0, 0, 1, 1, 1}; /* no token-axis group: a window's bytes are its rows' */
    const int64_t d = 16, P = 21, N = 90, m = 12;
    float *k = malloc(sizeof(float) * (size_t)(N * d)), *v = malloc(sizeof(float) * (size_t)(N * d));
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < N * d; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        k[i] = (float)((double)(x % 20001) / 10000.0 - 1.0);
        v[i] = (float)((double)((x >> 20) % 20001) / 10000.0 - 1.0);
    }
    int64_t pos[90];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_codec *c = codec_of(specs[i]);
        kvs_codec_state *st = NULL;
        assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill(st, k, v, P), KVS_OK);
        const int per_row = per_rows[i];
        for (int64_t n = P + 1; n <= N; n++) {
            assert_int_equal(kvs_codec_state_advance(st, k, v, n), KVS_OK);
            for (int64_t j = 0; j < n; j++) pos[j] = j;
            kvs_codec_bytes b;
            assert_int_equal(kvs_codec_state_bytes(st, pos, n, &b), KVS_OK);
            double plan = kvs_plan_codec_bytes(c, d, P, n, (double)n) + kvs_plan_codec_head_bytes(c, d);
            if (plan != b.total) fail_msg("%s at n = %lld: plan %.17g, codec state %.17g", specs[i], (long long)n, plan,
                                          b.total);
            for (int t = 0; t < 2; t++)
                assert_int_equal(kvs_plan_codec_held(c, (kvs_codec_tensor)t, P, n),
                                 n - kvs_codec_state_quantized(st, (kvs_codec_tensor)t));
            if (!per_row) continue;
            assert_int_equal(kvs_codec_state_bytes(st, pos + (n - m), m, &b), KVS_OK);
            plan = kvs_plan_codec_bytes(c, d, P, n, (double)m) + kvs_plan_codec_head_bytes(c, d);
            if (plan != b.total) fail_msg("%s window at n = %lld: plan %.17g, codec state %.17g", specs[i],
                                          (long long)n, plan, b.total);
        }
        kvs_codec_state_free(st);
        kvs_codec_free(c);
    }
    free(k);
    free(v);
}

/* think (key channel pruning) against the same second count: the full cache and a window of the most recent m at
 * every decode step, K rows below P - recent pruned to the kept channels, every other row whole, the mask once. */
static void test_think_against_codec_state(void **state) {
    (void)state;
    const char *specs[] = {"think:ratio=0.5,window=4,recent=8", "think", "think:ratio=0.3,window=2,recent=40"};
    const int64_t d = 16, P = 21, N = 60, m = 12;
    const int group = 2;
    float *k = malloc(sizeof(float) * (size_t)(N * d)), *v = malloc(sizeof(float) * (size_t)(N * d));
    float *q = malloc(sizeof(float) * (size_t)(P * group * d));
    uint64_t x = 88172645463325252ull;
    for (int64_t i = 0; i < N * d; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        k[i] = (float)((double)(x % 20001) / 10000.0 - 1.0);
        v[i] = (float)((double)((x >> 20) % 20001) / 10000.0 - 1.0);
        if (i < P * group * d) q[i] = (float)((double)((x >> 40) % 20001) / 10000.0 - 1.0);
    }
    int64_t pos[60];
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        kvs_codec *c = codec_of(specs[i]);
        kvs_codec_state *st = NULL;
        assert_int_equal(kvs_codec_state_create(c, d, N, &st), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill_queries(st, q, P, group), KVS_OK);
        assert_int_equal(kvs_codec_state_prefill(st, k, v, P), KVS_OK);
        for (int64_t n = P + 1; n <= N; n++) {
            assert_int_equal(kvs_codec_state_advance(st, k, v, n), KVS_OK);
            for (int64_t j = 0; j < n; j++) pos[j] = j;
            kvs_codec_bytes b;
            assert_int_equal(kvs_codec_state_bytes(st, pos, n, &b), KVS_OK);
            const int prunes = kvs_plan_codec_held(c, KVS_CODEC_K, P, n) < n; /* the mask is held with a pruned row */
            double plan = kvs_plan_codec_bytes(c, d, P, n, (double)n) + (prunes ? kvs_plan_codec_head_bytes(c, d) : 0);
            if (plan != b.total) fail_msg("%s at n = %lld: plan %.17g, codec state %.17g", specs[i], (long long)n, plan,
                                          b.total);
            assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, P, n), n - kvs_codec_state_quantized(st, KVS_CODEC_K));
            /* a window of the newest m rows: every row whole (m <= recent) or the oldest pruned ones beyond it */
            assert_int_equal(kvs_codec_state_bytes(st, pos + (n - m), m, &b), KVS_OK);
            const int window_prunes = n - m < P - kvs_plan_codec_held(c, KVS_CODEC_K, P, P);
            plan = kvs_plan_codec_bytes(c, d, P, n, (double)m) + (window_prunes ? kvs_plan_codec_head_bytes(c, d) : 0);
            if (plan != b.total) fail_msg("%s window at n = %lld: plan %.17g, codec state %.17g", specs[i],
                                          (long long)n, plan, b.total);
        }
        kvs_codec_state_free(st);
        kvs_codec_free(c);
    }
    /* by hand: Llama-3.1-8B's d = 128 at the default ratio 0.4 keeps 128 - 51 = 77 channels: a pruned K row 154 B */
    kvs_codec *c = codec_of("think");
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_K, 128) == 154.0);
    assert_true(kvs_plan_codec_row_bytes(c, KVS_CODEC_V, 128) == 256.0);
    assert_true(kvs_plan_codec_head_bytes(c, 128) == 128.0);
    assert_int_equal(kvs_plan_codec_held(c, KVS_CODEC_K, 1000, 1100), 1100 - 968);
    kvs_codec_free(c);
    free(k);
    free(v);
    free(q);
}

/* A measured profile carries the codec like the nominal kinds: its positions (token equivalents) x the codec's
 * bytes, the residual included. */
static void test_measured_profile(void **state) {
    (void)state;
    kvs_codec *c = codec_of("int:bits=4,group=32");
    kvs_plan_setup s = llama8b(c);
    kvs_plan_profile p = {.run_id = 3, .budget_tokens = 64, .trace_head_dim = 8, .trace_elem_bytes = 2,
                          .tok_bytes = 32, .prompt_len = 100, .trace_group = 2};
    snprintf(p.policy, sizeof p.policy, "window");
    snprintf(p.budget_scope, sizeof p.budget_scope, "every_step");
    assert_int_equal(kvs_plan_aux_rule_of("window", "", &p.aux_rule), KVS_OK);
    p.kv.a = 64; /* 64 token equivalents per KV head at every length */
    kvs_plan_policy meas = {.kind = KVS_PLAN_MEASURED, .profile = &p};
    /* at 4100 tokens: 4 keys of the unfilled group in 16 bits, 60 quantized; 64 quantized values */
    kvs_plan_footprint f = kvs_plan_footprint_at(&meas, &s, 4000, 4100);
    assert_true(f.device == 4 * 256 + 60 * 80 + 64 * 80);
    kvs_plan_policy nom = {.kind = KVS_PLAN_CONSTANT, .budget = 64};
    assert_true(kvs_plan_footprint_at(&nom, &s, 4000, 4100).device == f.device);
    /* the full cache measured as a line through n: the same bytes as the nominal full cache */
    p.kv.a = 0, p.kv.b = 1;
    snprintf(p.policy, sizeof p.policy, "full");
    snprintf(p.budget_scope, sizeof p.budget_scope, "none");
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    kvs_plan_point a, b;
    assert_int_equal(kvs_plan_eval(&s, &meas, 4096, 30, 1, &a), KVS_OK);
    assert_int_equal(kvs_plan_eval(&s, &full, 4096, 30, 1, &b), KVS_OK);
    assert_true(a.seq_device_bytes == b.seq_device_bytes);
    assert_true(a.seq_device_bytes == 256.0 * (30 * 256 + 4096 * 80 + 4126 * 80));
    kvs_codec_free(c);
}

/* ---- the CLI ---- */
typedef kvs_test_cli_fx cli_fx;

static int run(cli_fx *f, const char *const *args) { return kvs_test_cli_run(f, args); }

static void expect_in(const char *path, const char *needle) { assert_true(kvs_test_file_has(path, needle)); }

static void test_cli_outputs(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *spec = "int:bits=4,group=32,k_axis=channel,v_axis=channel";
    const char *text[] = {"plan", "--model", "Llama-3.1-8B", "--codec", "int:bits=4,group=32,k_axis=channel",
                          "--context", "4096", NULL};
    assert_int_equal(run(f, text), 0);
    expect_in(f->out, "KV / token  40960 bytes (40.96 KB = 40.00 KiB) = 32 layers x 8 KV heads x (K 80 + V 80 bytes "
                      "per row) (codec int:bits=4,group=32,k_axis=channel,v_axis=channel; fp16: 131072)");
    expect_in(f->out, "* full cache                                                   167.8 MB = 160.0 MiB");
    /* the check above can fail: text that is not there, a file that is not there */
    assert_false(kvs_test_file_has(f->out, "* full cache 167.8 MB"));
    assert_false(kvs_test_file_has("/nonexistent/out", "KV"));
    const char *json[] = {"plan", "--model", "Llama-3.1-8B", "--codec", "kivi", "--context", "4096", "--json", NULL};
    assert_int_equal(run(f, json), 0);
    expect_in(f->out, "\"kv_dtype\":\"kivi:bits=2,group=32,residual=128\",\"codec\":\"kivi:bits=2,group=32,"
                      "residual=128\",\"kv_bytes_per_token\":24576,\"codec_k_row_bytes\":48,\"codec_v_row_bytes\":48,"
                      "\"codec_held_k\":0,\"codec_held_v\":128,\"codec_held_bytes\":6815744,\"codec_scale_bytes\":0");
    /* 256 x (4096 x 48 + 128 x 256 + 3968 x 48) = 107,479,040; its 16-bit rows beyond their quantized size:
     * 256 x 128 x (256 - 48) = 6,815,744 */
    expect_in(f->out, "\"series\":\"full\",\"label\":\"full cache\",\"budget\":null,\"context\":4096,\"response\":0,"
                      "\"batch\":1,\"seq_device_bytes\":107479040");
    const char *plain[] = {"plan", "--model", "Llama-3.1-8B", "--json", NULL};
    assert_int_equal(run(f, plain), 0);
    expect_in(f->out, "\"kv_dtype\":\"fp16\",\"codec\":null,\"kv_bytes_per_token\":131072,");
    const char *csv[] = {"plan", "--model", "Llama-3.1-8B", "--codec", spec, "--context", "1000", "--csv", NULL};
    assert_int_equal(run(f, csv), 0);
    expect_in(f->out, ",max_context_memory,context_clamped,kv,kv_bytes_per_token\n");
    expect_in(f->out, "full,full,full cache,,1000,0,1,40960000,40960000,0,0,,,,0,"
                      "\"int:bits=4,group=32,k_axis=channel,v_axis=channel\",40960\n");
    /* the database: the canonical spec and its bytes per token */
    char db[160];
    snprintf(db, sizeof db, "%s/p.db", f->dir);
    const char *dbrun[] = {"plan", "--model", "Llama-3.1-8B", "--codec", "fp8:scale=prompt,per=head", "--db", db,
                           NULL};
    assert_int_equal(run(f, dbrun), 0);
    sqlite3 *h = NULL;
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT kv_dtype, kv_bytes_per_token FROM plans", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(q, 0), "fp8:format=e4m3,scale=prompt,per=head");
    assert_true(sqlite3_column_double(q, 1) == 65536);
    sqlite3_finalize(q);
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT seq_device_bytes FROM plan_points WHERE series = 'full' AND "
                                           "context = 4096 AND response = 0", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_true(sqlite3_column_double(q, 0) == 4096.0 * 65536 + 2048);
    sqlite3_finalize(q);
    sqlite3_close(h);
}

static void test_cli_bad_input(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *int4[] = {"plan", "--model", "Llama-3.1-8B", "--kv-dtype", "int4", NULL};
    assert_int_equal(run(f, int4), 2);
    expect_in(f->err, "--kv-dtype int4 is not a plain element size: a 4-bit KV cache holds fp16 scales and zero "
                      "points beside its codes; say which with --codec int:bits=4");
    const char *both[] = {"plan", "--model", "Llama-3.1-8B", "--kv-dtype", "fp16", "--codec", "kivi", NULL};
    assert_int_equal(run(f, both), 2);
    expect_in(f->err, "--kv-dtype and --codec exclude each other");
    const struct {
        const char *spec, *msg;
    } bad[] = {{"int4", "--codec: codec: unknown codec 'int4' (one of int, kivi, hf, fp8, think)"},
               {"int:bits=5", "--codec: codec int: bits=5 not one of {2,3,4,8}"},
               {"kivi:residual=33", "--codec: codec kivi: residual=33 must be a multiple of group=32"},
               {"fp8:per=head", "--codec: codec fp8: per=head needs scale=prompt"},
               {"", "--codec: codec: empty spec"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *args[] = {"plan", "--model", "Llama-3.1-8B", "--codec", bad[i].spec, NULL};
        assert_int_equal(run(f, args), 2);
        expect_in(f->err, bad[i].msg);
        char *out = kvs_test_slurp(f->out, NULL);
        assert_string_equal(out, "");
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int4_llama8b),
        cmocka_unit_test(test_kivi_residual),
        cmocka_unit_test(test_hf_residual),
        cmocka_unit_test(test_fp8_scales),
        cmocka_unit_test(test_against_codec_state),
        cmocka_unit_test(test_think_against_codec_state),
        cmocka_unit_test(test_measured_profile),
        cmocka_unit_test_setup_teardown(test_cli_outputs, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_bad_input, kvs_test_cli_setup, kvs_test_cli_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
