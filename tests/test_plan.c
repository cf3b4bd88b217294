/* test_plan.c — capacity planning (analysis/plan.h, `kvsim plan`, results/results_plan.h, plots/plan_plot.h)
 * against the numbers the papers print and POLICY_SPEC §7 G3 hand-computes (R2, D1, M22, every G3 row, D10's
 * max-batch ratio), published parameter counts, hand-computed GQA cases, a measured profile from a real replay of
 * the bundled trace (the measured full cache must plan exactly as the nominal full cache), and bad input.
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

#include "analysis/plan.h"
#include "plots/plan_plot.h"
#include "results/results_plan.h"
#include "tests/util/cli_run.h"
#include "tests/util/testenv.h"

static const double GiB = 1073741824.0, TiB = 1099511627776.0;

/* a == b to 1e-12 relative (a least-squares fit rounds) */
static int near(double a, double b) { return fabs(a - b) <= 1e-12 * fabs(b) + 1e-9; }

static const kvs_plan_model *preset(const char *name) {
    const kvs_plan_model *m = NULL;
    assert_int_equal(kvs_plan_preset_find(name, &m), KVS_OK);
    return m;
}

static kvs_plan_setup setup_of(const char *name, const char *gpu_gib) {
    kvs_plan_setup s = {.model = *preset(name), .kv_elem_bytes = 2, .weight_elem_bytes = 2, .n_gpus = 1};
    if (gpu_gib) s.gpu_bytes = atof(gpu_gib) * GiB;
    return s;
}

static kvs_plan_point full_point(const char *name, int64_t context, int64_t response, int64_t batch) {
    kvs_plan_setup s = setup_of(name, NULL);
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    kvs_plan_point p;
    assert_int_equal(kvs_plan_eval(&s, &full, context, response, batch, &p), KVS_OK);
    return p;
}

/* ---- G3: every row (FP16 KV bytes per token) ---- */
static void test_g3_every_row(void **state) {
    (void)state;
    const struct {
        const char *name;
        double bytes;
    } g3[] = {{"Llama-3.1-8B", 131072},   {"Mistral-7B-v0.2", 131072}, {"Qwen2.5-7B", 57344},
              {"Phi-4", 204800},          {"Llama-2-7B", 524288},      {"Llama-3.1-70B", 327680},
              {"Llama-3.1-405B", 516096}, {"OPT-30B", 1376256}};
    for (size_t i = 0; i < sizeof g3 / sizeof g3[0]; i++)
        assert_true(kvs_plan_kv_bytes_per_token(preset(g3[i].name), 2) == g3[i].bytes);
    /* the preset list is there, and names are case-insensitive */
    const char *need[] = {"llama-3.1-8b", "Llama-3.1-70B", "Llama-3.1-405B", "Llama-2-7B", "Mistral-7B-v0.2",
                          "Qwen2.5-7B", "Qwen2.5-14B", "Phi-4", "OPT-30B"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) (void)preset(need[i]);
    /* Qwen2.5-14B: 2 x 48 x 8 x 128 x 2 */
    assert_true(kvs_plan_kv_bytes_per_token(preset("Qwen2.5-14B"), 2) == 196608);
}

/* ---- R2: Llama-3.1-70B, batch 32, 32K, fp16 = 343.6 GB = 320.0 GiB ---- */
static void test_r2_llama70b_320gib(void **state) {
    (void)state;
    kvs_plan_point p = full_point("Llama-3.1-70B", 32768, 0, 32);
    assert_true(p.total_bytes == 327680.0 * 32768 * 32);
    assert_true(fabs(p.total_bytes / 1e9 - 343.6) < 0.05);
    assert_true(p.total_bytes / GiB == 320.0);
}

/* ---- D1: OPT-30B, 1024 tokens, batch 128 = 180.4 GB (168 GiB) ---- */
static void test_d1_opt30b_180gb(void **state) {
    (void)state;
    kvs_plan_point p = full_point("OPT-30B", 1024, 0, 128);
    assert_true(p.total_bytes == 2.0 * 48 * 7168 * 2 * 1024 * 128);
    assert_true(fabs(p.total_bytes / 1e9 - 180.4) < 0.05);
    assert_true(p.total_bytes / GiB == 168.0);
    /* the same with the context split into prompt and response: only the total length counts for the full cache */
    kvs_plan_point q = full_point("OPT-30B", 512, 512, 128);
    assert_true(q.total_bytes == p.total_bytes);
}

/* ---- M22: batch 256 at 128K / 32K / 4K ---- */
static void test_m22_tib(void **state) {
    (void)state;
    const struct {
        int64_t len;
        double t70, t405;
    } rows[] = {{131072, 10.0, 15.75}, {32768, 2.5, 3.9375}, {4096, 0.3125, 0.4921875}};
    for (size_t i = 0; i < 3; i++) {
        assert_true(full_point("Llama-3.1-70B", rows[i].len, 0, 256).total_bytes / TiB == rows[i].t70);
        assert_true(full_point("Llama-3.1-405B", rows[i].len, 0, 256).total_bytes / TiB == rows[i].t405);
    }
    assert_true(fabs(3.9375 - 3.94) < 0.005 && fabs(0.4921875 - 0.49) < 0.005); /* the spec's rounded figures */
}

/* ---- published parameter counts (weights from the shape) ---- */
static void test_params_match_published_counts(void **state) {
    (void)state;
    assert_true(kvs_plan_params(preset("Llama-2-7B")) == 6738415616.0);
    assert_true(kvs_plan_params(preset("Llama-3.1-8B")) == 8030261248.0);
    assert_true(kvs_plan_params(preset("Mistral-7B-v0.2")) == 7241732096.0);
    /* the large ones to the published rounding: 70.6B, 405.9B, ~30B, 14.7B */
    assert_true(fabs(kvs_plan_params(preset("Llama-3.1-70B")) / 1e9 - 70.55) < 0.01);
    assert_true(fabs(kvs_plan_params(preset("Llama-3.1-405B")) / 1e9 - 405.85) < 0.05);
    assert_true(fabs(kvs_plan_params(preset("OPT-30B")) / 1e9 - 29.97) < 0.01);
    assert_true(fabs(kvs_plan_params(preset("Phi-4")) / 1e9 - 14.66) < 0.01);
}

/* ---- D10: max batch of the full cache against H2O/D2O with budget = prompt (D2O §5.5, Table 5): in theory
 * (prompt + generated) / budget = 5x for every setting; the paper observed 4x (8/4/2/1 vs 32/16/8/4). ---- */
static void test_d10_max_batch_ratio(void **state) {
    (void)state;
    kvs_plan_setup s = setup_of("Llama-3-8B", "80"); /* A100-80G */
    const double pool = 80 * GiB - 8030261248.0 * 2;  /* the published parameter count, fp16 */
    const int64_t prompt[] = {256, 512, 1024, 2048}, gen[] = {1024, 2048, 4096, 8192};
    for (int i = 0; i < 4; i++) {
        kvs_plan_policy full = {.kind = KVS_PLAN_FULL}, h2o = {.kind = KVS_PLAN_CONSTANT, .budget = prompt[i]};
        kvs_plan_point pf, ph;
        assert_int_equal(kvs_plan_eval(&s, &full, prompt[i], gen[i], 1, &pf), KVS_OK);
        assert_int_equal(kvs_plan_eval(&s, &h2o, prompt[i], gen[i], 1, &ph), KVS_OK);
        assert_int_equal(pf.max_batch, (int64_t)floor(pool / ((double)(prompt[i] + gen[i]) * 131072)));
        assert_int_equal(ph.max_batch, (int64_t)floor(pool / ((double)prompt[i] * 131072)));
        double ratio = (double)ph.max_batch / (double)pf.max_batch;
        assert_true(ratio > 4.95 && ratio < 5.05);
    }
}

/* ---- hand-computed GQA cases ---- */
static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_gqa_hand_cases(void **state) {
    (void)state;
    char dir[] = "/tmp/kvs_plan_cfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    /* 2 layers, 4 query heads sharing 2 KV heads, hidden 16 => head_dim 4; KV/token = 2*2*2*4*bytes */
    write_file(path, "{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                     "\"num_key_value_heads\":2,\"hidden_size\":16,\"intermediate_size\":32,\"vocab_size\":10,"
                     "\"max_position_embeddings\":64,\"tie_word_embeddings\":true}");
    kvs_plan_model m;
    assert_int_equal(kvs_plan_model_from_config(dir, &m), KVS_OK); /* the folder */
    assert_int_equal(m.head_dim, 4);
    assert_true(kvs_plan_kv_bytes_per_token(&m, 2) == 64);
    assert_true(kvs_plan_kv_bytes_per_token(&m, 1) == 32);
    assert_true(kvs_plan_kv_bytes_per_token(&m, 0.5) == 16);
    /* params by hand: per layer q 16*16 + k,v 2*16*8 + o 16*16 + mlp 3*16*32 + norms 32 = 2336; 2 layers 4672;
     * tied embedding 10*16 = 160; final norm 16 => 4848 */
    assert_true(kvs_plan_params(&m) == 4848);
    /* policies at prompt 40, response 10 (n = 50), budget 8, batch 3: per (layer, KV head) token size 2*4*2 = 16 */
    kvs_plan_setup s = {.model = m, .kv_elem_bytes = 2, .weight_elem_bytes = 2, .n_gpus = 1};
    const struct {
        kvs_plan_kind kind;
        double tokens, host, xfer;
    } want[] = {{KVS_PLAN_FULL, 50, 0, 0},
                {KVS_PLAN_CONSTANT, 8, 0, 0},
                {KVS_PLAN_PROMPT_ONLY, 8 + 10, 0, 0},
                {KVS_PLAN_OFFLOAD, 8, 50, 9}};
    for (int i = 0; i < 4; i++) {
        kvs_plan_policy pol = {.kind = want[i].kind, .budget = 8};
        kvs_plan_point p;
        assert_int_equal(kvs_plan_eval(&s, &pol, 40, 10, 3, &p), KVS_OK);
        assert_true(p.seq_device_bytes == want[i].tokens * 64);
        assert_true(p.total_bytes == 3 * want[i].tokens * 64);
        assert_true(p.host_bytes == 3 * want[i].host * 64);
        assert_true(p.pcie_bytes_per_step == 3 * want[i].xfer * 64);
    }
    /* capacity: 2 GPUs of 10000 bytes, reserve 100 each, weights 4848*2 = 9696 => pool 2*9900 - 9696 = 10104.
     * full at 40+10: 3200 bytes per sequence => max batch 3; max context at batch 2 with 10 generated:
     * 2*64*(C+10) <= 10104 => C <= 68 */
    s.gpu_bytes = 10000;
    s.n_gpus = 2;
    s.reserve_bytes = 100;
    double pool;
    assert_int_equal(kvs_plan_kv_pool(&s, &pool), KVS_OK);
    assert_true(pool == 10104);
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL}, cons = {.kind = KVS_PLAN_CONSTANT, .budget = 8};
    kvs_plan_point p;
    assert_int_equal(kvs_plan_eval(&s, &full, 40, 10, 2, &p), KVS_OK);
    assert_int_equal(p.max_batch, 3);
    assert_int_equal(p.max_context, 68);
    assert_int_equal(kvs_plan_eval(&s, &cons, 40, 10, 2, &p), KVS_OK);
    assert_int_equal(p.max_batch, 10104 / 512);
    assert_int_equal(p.max_context, KVS_PLAN_UNBOUNDED);
    assert_int_equal(kvs_plan_eval(&s, &cons, 40, 10, 1000, &p), KVS_OK);
    assert_int_equal(p.max_context, 0); /* 1000 sequences of 8 tokens never fit */
    /* impossible memory: the weights alone exceed the GPUs */
    s.gpu_bytes = 3000;
    assert_int_equal(kvs_plan_kv_pool(&s, &pool), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "impossible memory"));
    /* MHA when num_key_value_heads is absent; OPT counts ffn_dim */
    write_file(path, "{\"model_type\":\"opt\",\"num_hidden_layers\":1,\"num_attention_heads\":2,\"hidden_size\":8,"
                     "\"ffn_dim\":16,\"vocab_size\":5,\"max_position_embeddings\":6}");
    assert_int_equal(kvs_plan_model_from_config(path, &m), KVS_OK);
    assert_int_equal(m.n_kv_heads, 2);
    assert_true(kvs_plan_kv_bytes_per_token(&m, 2) == 2 * 1 * 8 * 2);
    /* OPT by hand: 4*(64+8) + (128+16) + (128+8) + 32 = 600; tied embedding 40; positions (6+2)*8 = 64; final LN 16 */
    assert_true(kvs_plan_params(&m) == 720);
    /* malformed and incomplete configs */
    write_file(path, "{\"num_hidden_layers\":2}");
    assert_int_equal(kvs_plan_model_from_config(path, &m), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "num_attention_heads is missing"));
    write_file(path, "{\"num_hidden_layers\":");
    assert_int_equal(kvs_plan_model_from_config(path, &m), KVS_ERR_FORMAT);
    /* a derived head_dim has the bound an explicit one has: 2048 / 1 > 1024 refused, 1024 / 1 accepted */
    write_file(path, "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"num_attention_heads\":1,"
                     "\"hidden_size\":2048,\"intermediate_size\":8,\"vocab_size\":5}");
    assert_int_equal(kvs_plan_model_from_config(path, &m), KVS_ERR_FORMAT);
    assert_non_null(strstr(kvs_last_error(), "head_dim = hidden_size / num_attention_heads = 2048 is out of range"));
    write_file(path, "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"num_attention_heads\":1,"
                     "\"hidden_size\":1024,\"intermediate_size\":8,\"vocab_size\":5}");
    assert_int_equal(kvs_plan_model_from_config(path, &m), KVS_OK);
    assert_int_equal(m.head_dim, KVS_TRACE_MAX_HEAD_DIM);
    unlink(path);
    rmdir(dir);
}

/* ---- the measured profile: a line through token equivalents, scaled to the planned model ---- */
static void test_profile_fit_and_scaling(void **state) {
    (void)state;
    /* traced model: head_dim 8, fp16 => tok = 32 bytes. A constant-size policy holding 64 tokens plus 4 bytes of
     * scores per held token (aux = 256 bytes = 8 token equivalents), measured at n = 100..199. */
    enum { N = 100 };
    int64_t n[N];
    double kv[N], aux[N], host[N], xfer[N];
    for (int i = 0; i < N; i++) {
        n[i] = 100 + i;
        kv[i] = 64 * 32.0;
        aux[i] = 256;
        host[i] = 32.0 * (double)n[i]; /* the full cache on the host */
        xfer[i] = NAN;                 /* not recorded: 0 */
    }
    kvs_plan_profile p = {.tok_bytes = 32, .prompt_len = 50};
    assert_int_equal(kvs_plan_profile_fit(&p, n, kv, aux, host, xfer, N), KVS_OK);
    assert_true(fabs(p.kv.a - 64) < 1e-9 && fabs(p.kv.b) < 1e-12);
    assert_true(fabs(p.aux.a - 8) < 1e-9 && fabs(p.host.b - 1) < 1e-12 && fabs(p.host.a) < 1e-6);
    assert_true(p.transfer.a == 0 && p.transfer.b == 0 && p.kv_r2 == 1);
    assert_int_equal(p.n_min, 100);
    assert_int_equal(p.n_max, 199);
    /* planned on Llama-3.1-8B (tok = 2*128*2 = 512 per (layer, KV head); 32*8 = 256 of them) */
    kvs_plan_setup s = setup_of("Llama-3.1-8B", NULL);
    kvs_plan_policy pol = {.kind = KVS_PLAN_MEASURED, .profile = &p};
    kvs_plan_point pt;
    assert_int_equal(kvs_plan_eval(&s, &pol, 1000, 500, 2, &pt), KVS_OK);
    assert_true(near(pt.seq_device_bytes, 256 * (64 + 8) * 512.0));       /* aux scaled like KV */
    assert_true(near(pt.host_bytes, 2 * 256 * 1500 * 512.0));
    p.aux_scale = KVS_PLAN_AUX_NONE;
    assert_int_equal(kvs_plan_eval(&s, &pol, 1000, 500, 2, &pt), KVS_OK);
    assert_true(near(pt.seq_device_bytes, 256 * (64 * 512.0 + 256))); /* aux kept as measured */
    /* a per-query-head run measured with groups of 2 holds 4 copies on Llama-3.1-8B's groups of 4 */
    p.aux_scale = KVS_PLAN_AUX_KV;
    p.per_query_head = 1;
    p.trace_group = 2;
    assert_int_equal(kvs_plan_eval(&s, &pol, 1000, 500, 2, &pt), KVS_OK);
    assert_true(near(pt.seq_device_bytes, 2 * 256 * (64 + 8) * 512.0));
    /* a prompt-only run is fitted against the generated tokens: 20 prompt tokens kept + everything generated */
    for (int i = 0; i < N; i++) kv[i] = 32.0 * (20 + (double)(n[i] - 50));
    kvs_plan_profile q = {.tok_bytes = 32, .prompt_len = 50, .x_is_generated = 1};
    assert_int_equal(kvs_plan_profile_fit(&q, n, kv, NULL, NULL, NULL, N), KVS_OK);
    kvs_plan_policy qp = {.kind = KVS_PLAN_MEASURED, .profile = &q};
    assert_int_equal(kvs_plan_eval(&s, &qp, 4000, 300, 1, &pt), KVS_OK);
    assert_true(fabs(pt.seq_device_bytes - 256 * (20 + 300) * 512.0) < 1e-3);
    assert_int_equal(kvs_plan_profile_fit(&q, n, kv, NULL, NULL, NULL, 0), KVS_ERR_INVALID_ARG);
}

/* ---- the CLI ---- */
typedef struct {
    char dir[64], out[128], err[128];
} cli_fx;

static int cli_setup(void **state) {
    cli_fx *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/kvs_plan_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->out, sizeof f->out, "%s/out", f->dir);
    snprintf(f->err, sizeof f->err, "%s/err", f->dir);
    *state = f;
    return 0;
}

static int cli_teardown(void **state) {
    cli_fx *f = *state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}


/* Runs kvsim with args; returns its exit status, output in f->out / f->err. */
static int run(cli_fx *f, const char *const *args) { return kvs_test_cli(f->out, f->err, args); }

static void expect_out(cli_fx *f, const char *needle) {
    char *t = kvs_test_slurp(f->out, NULL);
    if (!strstr(t, needle)) fail_msg("'%s' not in the output:\n%s", needle, t);
    free(t);
}
static void expect_err(cli_fx *f, const char *needle) {
    char *t = kvs_test_slurp(f->err, NULL);
    if (!strstr(t, needle)) fail_msg("'%s' not in stderr:\n%s", needle, t);
    free(t);
}

static void test_cli_reproduces_the_papers(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *r2[] = {"plan", "--model", "Llama-3.1-70B", "--batch", "32", "--context", "32768", NULL};
    assert_int_equal(run(f, r2), 0);
    expect_out(f, "343.6 GB = 320.0 GiB");
    expect_out(f, "KV / token  327680 bytes");
    const char *d1[] = {"plan", "--model", "OPT-30B", "--batch", "128", "--context", "1024", NULL};
    assert_int_equal(run(f, d1), 0);
    expect_out(f, "180.4 GB = 168.0 GiB");
    const char *m22[] = {"plan", "--model", "Llama-3.1-405B", "--batch", "256", "--context", "131072", "--csv", NULL};
    assert_int_equal(run(f, m22), 0);
    /* 516096 * 131072 * 256 = 15.75 TiB, exactly in bytes */
    expect_out(f, "full,full cache,,131072,0,256,67645734912,17317308137472,0,0,,\n");
    const char *list[] = {"plan", "--list-presets", NULL};
    assert_int_equal(run(f, list), 0);
    expect_out(f, "Qwen2.5-14B");
    expect_out(f, "config.json of facebook/opt-30b");
    /* D10 through the CLI: H2O (registry name: every-step budget) at budget = prompt, the settings of Table 5 */
    const char *d10[] = {"plan", "--model", "Llama-3-8B", "--gpu-mem", "80GiB", "--policy", "h2o", "--budget", "256",
                         "--context", "256", "--response", "1024", "--json", NULL};
    assert_int_equal(run(f, d10), 0);
    expect_out(f, "\"policy\":\"constant\"");
    expect_out(f, "\"series\":\"full\",\"label\":\"full cache\",\"budget\":null,\"context\":256,\"response\":1024,"
                  "\"batch\":1,\"seq_device_bytes\":167772160,");
}

static void test_cli_bad_input(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    const char *unknown[] = {"plan", "--model", "GPT-5", NULL};
    assert_int_equal(run(f, unknown), 2);
    expect_err(f, "unknown preset 'GPT-5' (kvsim plan --list-presets lists them)");
    const char *impossible[] = {"plan", "--model", "Llama-3.1-405B", "--gpu-mem", "80GB", "--gpus", "8", NULL};
    assert_int_equal(run(f, impossible), 2);
    expect_err(f, "impossible memory: Llama-3.1-405B needs 811.7 GB");
    const char *none[] = {"plan", "--batch", "2", NULL};
    assert_int_equal(run(f, none), 2);
    expect_err(f, "give exactly one of --model PRESET");
    const char *dtype[] = {"plan", "--model", "Phi-4", "--kv-dtype", "fp4", NULL};
    assert_int_equal(run(f, dtype), 2);
    expect_err(f, "unknown dtype 'fp4'");
    /* an empty file is not a results database */
    char db[160];
    snprintf(db, sizeof db, "%s/empty.db", f->dir);
    write_file(db, "");
    const char *empty[] = {"plan", "--model", "Phi-4", "--profile", db, NULL};
    assert_int_equal(run(f, empty), 1);
    expect_err(f, "kvsim plan: ");
    char *e = kvs_test_slurp(f->err, NULL);
    assert_non_null(strstr(e, db));
    free(e);
    /* a results database without runs */
    snprintf(db, sizeof db, "%s/noruns.db", f->dir);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open(db, &h), KVS_OK);
    kvs_results_close(h);
    const char *noruns[] = {"plan", "--model", "Phi-4", "--profile", db, NULL};
    assert_int_equal(run(f, noruns), 1);
    expect_err(f, "no complete runs in the database: nothing to plan with");
    /* ... and it has no plan results either */
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_plan_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_query_plans(h, &rows, &n), KVS_ERR_DB);
    assert_non_null(strstr(kvs_last_error(), "no plan results"));
    kvs_results_close(h);
}

/* A real replay of the bundled trace: the measured full cache must plan exactly like the nominal full cache, and a
 * constant-size policy keeps its budget of token equivalents (plus its measured auxiliary state). */
static void test_cli_measured_profile_from_replay(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char trace[512], db[160], png[160], svg[160];
    snprintf(trace, sizeof trace, "%s/examples/stories260K.kvt", kvs_test_root());
    snprintf(db, sizeof db, "%s/r.db", f->dir);
    const char *replay[] = {"replay", trace, "--db", db, "--policy", "full", "--policy", "window", "--budgets", "64",
                            "--series-every", "1", "--threads", "2", NULL};
    assert_int_equal(run(f, replay), 0);
    /* two runs match without a choice */
    const char *two[] = {"plan", "--model", "Llama-3.1-8B", "--profile", db, NULL};
    assert_int_equal(run(f, two), 2);
    expect_err(f, "2 runs match: choose one with --run ID");
    const char *full[] = {"plan", "--model", "Llama-3.1-8B", "--profile", db, "--policy", "full", "--context", "239",
                          "--response", "256", "--batch", "4", "--csv", NULL};
    assert_int_equal(run(f, full), 0);
    char *t = kvs_test_slurp(f->out, NULL);
    /* nominal full at 239+256 = 495 tokens: 495 * 131072 bytes per sequence, 4 sequences; the measured line must
     * give the same (up to the fit's rounding) */
    double want = 495.0 * 131072, meas = -1;
    for (char *line = strtok(t, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "measured,", 9)) continue;
        long long c, r, b;
        double seq;
        char *p = strchr(line + 10, '"') ? strchr(strchr(line + 10, '"') + 1, ',') : strchr(line + 9, ',');
        assert_non_null(p);
        if (sscanf(p, ",,%lld,%lld,%lld,%lf", &c, &r, &b, &seq) == 4 && c == 239 && r == 256) meas = seq;
    }
    free(t);
    assert_true(fabs(meas - want) / want < 1e-6);
    /* the window at 64: 64 tokens per KV head, no auxiliary state; with --db and both plots */
    snprintf(png, sizeof png, "%s/mem.png", f->dir);
    snprintf(svg, sizeof svg, "%s/batch.svg", f->dir);
    const char *win[] = {"plan", "--model", "Llama-3.1-8B", "--profile", db, "--policy", "window", "--budget", "64",
                         "--context", "239", "--response", "256", "--gpu-mem", "80GB", "--json", "--db", db,
                         "--plot-memory", png, "--plot-batch", svg, NULL};
    assert_int_equal(run(f, win), 0);
    expect_out(f, "\"series\":\"measured\",\"label\":\"measured: window, budget 64 (run 2)\",\"budget\":null,"
                  "\"context\":239,\"response\":256,\"batch\":1,\"seq_device_bytes\":8388608,");
    expect_err(f, "recorded in");
    char *img = kvs_test_slurp(png, NULL);
    assert_memory_equal(img, "\x89PNG", 4);
    free(img);
    img = kvs_test_slurp(svg, NULL);
    assert_non_null(strstr(img, "<svg"));
    assert_non_null(strstr(img, "measured: window, budget 64"));
    free(img);
    /* the plan is in the database beside the runs it measured */
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(db, &h), KVS_OK);
    kvs_results_plan_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_query_plans(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 1);
    assert_string_equal(rows[0].policy, "measured");
    assert_true(rows[0].kv_bytes_per_token == 131072);
    int found = 0;
    for (int64_t i = 0; i < rows[0].n_points; i++)
        if (!strcmp(rows[0].points[i].series, "measured") && rows[0].points[i].context == 239 &&
            rows[0].points[i].response == 256) {
            assert_true(rows[0].points[i].seq_device_bytes == 8388608);
            assert_int_equal(rows[0].points[i].max_batch, (int64_t)floor((80e9 - 8030261248.0 * 2) / 8388608));
            found = 1;
        }
    assert_true(found);
    kvs_results_plan_rows_free(rows, n);
    kvs_results_close(h);
    /* a run replayed without its per-step series cannot give a profile */
    snprintf(db, sizeof db, "%s/noseries.db", f->dir);
    const char *plain[] = {"replay", trace, "--db", db, "--policy", "full", "--budgets", "64", "--threads", "2", NULL};
    assert_int_equal(run(f, plain), 0);
    const char *noseries[] = {"plan", "--model", "Phi-4", "--profile", db, NULL};
    assert_int_equal(run(f, noseries), 1);
    expect_err(f, "has no per-step series");
}

static void test_plot_script_names_every_series(void **state) {
    (void)state;
    const char *labels[] = {"full cache", "constant, budget 8"}, *xl[] = {"256+1024", "512+2048"};
    const double x[] = {0, 100, 200}, y[] = {1, 2, 3, 1, 1, 1}, yb[] = {10, 5, 50, 0};
    kvs_plot_plan p = {.kind = KVS_PLOT_PLAN_MEMORY, .title = "t", .n_series = 2, .labels = labels, .n_x = 3,
                       .x = x, .y = y, .hline = 4 * GiB};
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(kvs_plot_plan_write_script(&p, 0, "/tmp/x.png", f), KVS_OK);
    fclose(f);
    assert_non_null(strstr(buf, "# series: full cache\n0 9.3132257461547852e-10\n"));
    assert_non_null(strstr(buf, "# series: constant, budget 8\n"));
    assert_non_null(strstr(buf, "first 4 to graph 1")); /* the KV pool line at 4 GiB */
    free(buf);
    kvs_plot_plan b = {.kind = KVS_PLOT_PLAN_MAX_BATCH, .title = "t", .n_series = 2, .labels = labels, .n_x = 2,
                       .x_labels = xl, .y = yb, .hline = NAN};
    f = open_memstream(&buf, &len);
    assert_int_equal(kvs_plot_plan_write_script(&b, 1, "/tmp/x.svg", f), KVS_OK);
    fclose(f);
    assert_non_null(strstr(buf, "\"256+1024\" 10\n\"512+2048\" 5\n"));
    assert_non_null(strstr(buf, "\"512+2048\" ?\n")); /* nothing fits: no bar on the log axis */
    free(buf);
    b.n_series = 0;
    assert_int_equal(kvs_plot_plan_write_script(&b, 1, "/tmp/x.svg", stderr), KVS_ERR_INVALID_ARG);
}

/* The --responses and --settings parsers (analysis/plan.c; cli/cmd_plan.c prints their messages): values,
 * bounds, the exact messages, and the 64-item limit. */
static void test_option_lists(void **state) {
    (void)state;
    int64_t v[KVS_PLAN_MAX_LIST], c[KVS_PLAN_MAX_LIST], r[KVS_PLAN_MAX_LIST];
    int n = -1;
    assert_int_equal(kvs_plan_parse_list("--responses", "0,1024,1099511627776,", 0, v, &n), KVS_OK);
    assert_int_equal(n, 3);
    assert_true(v[0] == 0 && v[1] == 1024 && v[2] == (INT64_C(1) << 40));
    assert_int_equal(kvs_plan_parse_list("--responses", "1,,2", 0, v, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--responses: '1,,2' is not a list of at most 64 numbers");
    assert_int_equal(kvs_plan_parse_list("--responses", "1099511627777", 0, v, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--responses: '1099511627777' is out of range [0, 1099511627776]");
    assert_int_equal(kvs_plan_parse_list("--responses", "99999999999999999999", 0, v, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--responses: '99999999999999999999' is out of range [0, 1099511627776]");
    assert_int_equal(kvs_plan_parse_list("--responses", "12x", 0, v, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--responses: '12x' is not an integer");
    assert_int_equal(kvs_plan_parse_list("--responses", "", 0, v, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--responses: empty list");
    char many[400] = "";
    for (int i = 0; i < 65; i++) strcat(many, i ? ",1" : "1");
    assert_int_equal(kvs_plan_parse_list("--responses", many, 0, v, &n), KVS_ERR_INVALID_ARG);
    many[strlen(many) - 2] = '\0'; /* 64 items */
    assert_int_equal(kvs_plan_parse_list("--responses", many, 0, v, &n), KVS_OK);
    assert_int_equal(n, 64);
    assert_int_equal(kvs_plan_parse_settings("256+1024,512+0", c, r, &n), KVS_OK);
    assert_int_equal(n, 2);
    assert_true(c[0] == 256 && r[0] == 1024 && c[1] == 512 && r[1] == 0);
    assert_int_equal(kvs_plan_parse_settings("256", c, r, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--settings: '256' is not CONTEXT+RESPONSE");
    assert_int_equal(kvs_plan_parse_settings("0+1", c, r, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--settings context: '0' is out of range [1, 1099511627776]");
    assert_int_equal(kvs_plan_parse_settings("1+2+3", c, r, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--settings response: '2+3' is not an integer");
    assert_int_equal(kvs_plan_parse_settings(",", c, r, &n), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "--settings: ',' is not a list of CONTEXT+RESPONSE");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_g3_every_row),
        cmocka_unit_test(test_r2_llama70b_320gib),
        cmocka_unit_test(test_d1_opt30b_180gb),
        cmocka_unit_test(test_m22_tib),
        cmocka_unit_test(test_params_match_published_counts),
        cmocka_unit_test(test_d10_max_batch_ratio),
        cmocka_unit_test(test_gqa_hand_cases),
        cmocka_unit_test(test_profile_fit_and_scaling),
        cmocka_unit_test(test_plot_script_names_every_series),
        cmocka_unit_test_setup_teardown(test_cli_reproduces_the_papers, cli_setup, cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_bad_input, cli_setup, cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_measured_profile_from_replay, cli_setup, cli_teardown),
        cmocka_unit_test(test_option_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
