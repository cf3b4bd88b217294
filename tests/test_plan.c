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
#include <sqlite3.h>

#include "analysis/plan.h"
#include "gpu_capture/model.h"
#include "policies/registry.h"
#include "plots/plan_plot.h"
#include "results/results_plan.h"
#include "trace/trace.h"
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
     * 2*64*(C+10) <= 10104 => C <= 68 by memory, but the model's context of 64 leaves 64 - 10 = 54 */
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
    assert_int_equal(p.max_context_memory, 68);
    assert_int_equal(p.max_context, 54);
    assert_true(p.context_clamped);
    assert_int_equal(kvs_plan_eval(&s, &cons, 40, 10, 2, &p), KVS_OK);
    assert_int_equal(p.max_batch, 10104 / 512);
    assert_int_equal(p.max_context_memory, KVS_PLAN_UNBOUNDED);
    assert_int_equal(p.max_context, 54);
    s.model.max_positions = 0; /* not known: memory alone */
    assert_int_equal(kvs_plan_eval(&s, &cons, 40, 10, 2, &p), KVS_OK);
    assert_int_equal(p.max_context, KVS_PLAN_UNBOUNDED);
    assert_int_equal(kvs_plan_eval(&s, &full, 40, 10, 2, &p), KVS_OK);
    assert_int_equal(p.max_context, 68);
    assert_false(p.context_clamped);
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

/* A profile of a traced model with head_dim 8 at fp16 (tok = 32 bytes) and GQA groups of 2 (stories260K's shape). */
static kvs_plan_profile traced(const char *policy, const char *scope, int64_t budget, int64_t prompt, int per_q) {
    kvs_plan_profile p = {.run_id = 7, .budget_tokens = budget, .trace_head_dim = 8, .trace_elem_bytes = 2,
                          .tok_bytes = 32, .prompt_len = prompt, .per_query_head = per_q, .trace_group = 2};
    snprintf(p.policy, sizeof p.policy, "%s", policy);
    snprintf(p.budget_scope, sizeof p.budget_scope, "%s", scope);
    assert_int_equal(kvs_plan_aux_rule_of(policy, "", &p.aux_rule), KVS_OK);
    return p;
}

static double plan_seq(const kvs_plan_profile *p, const kvs_plan_setup *s, int64_t context, int64_t response) {
    kvs_plan_policy pol = {.kind = KVS_PLAN_MEASURED, .profile = p};
    kvs_plan_point pt;
    assert_int_equal(kvs_plan_eval(s, &pol, context, response, 1, &pt), KVS_OK);
    return pt.seq_device_bytes;
}

static void test_profile_fit_and_scaling(void **state) {
    (void)state;
    /* An every-step policy holding 64 tokens in one list plus 4 bytes of scores per held token (aux = 256 bytes = 8
     * token equivalents), measured at n = 100..199 (prompt 50: the cache is full from the first step on). */
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
    kvs_plan_profile p = traced("h2o", "every_step", 64, 50, 0);
    assert_int_equal(kvs_plan_profile_fit(&p, n, kv, aux, host, xfer, N), KVS_OK);
    assert_true(fabs(p.kv.a - 64) < 1e-9 && fabs(p.kv.b) < 1e-12);
    assert_true(fabs(p.aux.a - 8) < 1e-9 && fabs(p.host.b - 1) < 1e-12 && fabs(p.host.a) < 1e-6);
    assert_true(p.transfer.a == 0 && p.transfer.b == 0 && p.kv_r2 == 1);
    assert_int_equal(p.n_min, 100);
    assert_int_equal(p.n_max, 199);
    assert_int_equal(p.fit_n_min, 100);
    assert_int_equal(p.fit_points, N);
    /* planned on Llama-3.1-8B (tok = 2*128*2 = 512 per (layer, KV head); 32*8 = 256 of them): the KV keeps its 64
     * tokens per KV head; H2O's scores are one fp32 per held slot whatever head_dim: 256 bytes as measured */
    kvs_plan_setup s = setup_of("Llama-3.1-8B", NULL);
    kvs_plan_policy pol = {.kind = KVS_PLAN_MEASURED, .profile = &p};
    kvs_plan_point pt;
    assert_int_equal(kvs_plan_eval(&s, &pol, 1000, 500, 2, &pt), KVS_OK);
    assert_true(near(pt.seq_device_bytes, 256 * (64 * 512.0 + 256)));
    assert_true(near(pt.host_bytes, 2 * 256 * 1500 * 512.0));
    /* --aux-scale kv: proportional to head_dim in KV elements (x 128/8); none: as measured */
    p.aux_scale = KVS_PLAN_AUX_KV;
    assert_true(near(plan_seq(&p, &s, 1000, 500), 256 * (64 + 8) * 512.0));
    p.aux_scale = KVS_PLAN_AUX_NONE;
    assert_true(near(plan_seq(&p, &s, 1000, 500), 256 * (64 * 512.0 + 256)));
    /* a per-query-head run measured with groups of 2 holds 4 copies on Llama-3.1-8B's groups of 4, its scores too */
    p.aux_scale = KVS_PLAN_AUX_AUTO;
    p.per_query_head = 1;
    assert_true(near(plan_seq(&p, &s, 1000, 500), 2 * 256 * (64 * 512.0 + 256)));
    /* a prompt-only run is fitted against the generated tokens: 20 prompt tokens kept + everything generated */
    for (int i = 0; i < N; i++) kv[i] = 32.0 * (20 + (double)(n[i] - 50));
    kvs_plan_profile q = traced("snapkv", "prompt", 20, 50, 0);
    assert_int_equal(kvs_plan_profile_fit(&q, n, kv, NULL, NULL, NULL, N), KVS_OK);
    assert_true(q.x_is_generated);
    assert_true(fabs(plan_seq(&q, &s, 4000, 300) - 256 * (20 + 300) * 512.0) < 1e-3);
    /* a planned prompt below the budget keeps at most what it has seen: min(P, B) + generated = 10 + 300 */
    assert_true(fabs(plan_seq(&q, &s, 10, 300) - 256 * (10 + 300) * 512.0) < 1e-3);
    assert_int_equal(kvs_plan_profile_fit(&q, n, kv, NULL, NULL, NULL, 0), KVS_ERR_INVALID_ARG);
}

/* A short prompt: an H2O run (groups of 2, gqa=expand: 2 lists) at budget 64 on a 16-token prompt fills its cache
 * during the first 48 decode steps, n = 17..64, and holds 2 x 64 slots (and 2 x 64 fp32 scores) from n = 65 on.
 * A line through all the steps is steep; the fit of the steady state gives what the same policy measured on a long
 * prompt gives. */
static void test_profile_steady_state(void **state) {
    (void)state;
    enum { N = 181 };
    int64_t n[N], nl[256];
    double kv[N], aux[N], kvl[256], auxl[256];
    for (int i = 0; i < N; i++) {
        n[i] = 17 + i;
        double held = n[i] < 64 ? (double)n[i] : 64; /* per list */
        kv[i] = 2 * held * 32.0;
        aux[i] = 2 * held * 4.0;
    }
    kvs_plan_profile p = traced("h2o", "every_step", 64, 16, 1);
    assert_int_equal(kvs_plan_profile_steady_from(&p), 65);
    assert_int_equal(kvs_plan_profile_fit(&p, n, kv, aux, NULL, NULL, N), KVS_OK);
    assert_int_equal(p.fit_n_min, 65);
    assert_int_equal(p.fit_n_max, 197);
    assert_int_equal(p.fit_points, 133);
    assert_int_equal(p.n_points, 181);
    assert_true(fabs(p.kv.a - 128) < 1e-9 && fabs(p.kv.b) < 1e-12 && fabs(p.aux.a - 16) < 1e-9);
    /* the bundled trace's shape: prompt 239, the cache full from the first decode step */
    for (int i = 0; i < 256; i++) nl[i] = 240 + i, kvl[i] = 2 * 64 * 32.0, auxl[i] = 2 * 64 * 4.0;
    kvs_plan_profile l = traced("h2o", "every_step", 64, 239, 1);
    assert_int_equal(kvs_plan_profile_steady_from(&l), 240);
    assert_int_equal(kvs_plan_profile_fit(&l, nl, kvl, auxl, NULL, NULL, 256), KVS_OK);
    /* by hand on Llama-3.1-8B at 8K + 8K: 256 (layer, KV head)s x 4 query heads x 64 x (512 bytes of K/V + 4 of score) */
    kvs_plan_setup s = setup_of("Llama-3.1-8B", NULL);
    const double want = 256.0 * 4 * 64 * (512 + 4);
    assert_true(near(plan_seq(&p, &s, 8192, 8192), want));
    assert_true(near(plan_seq(&l, &s, 8192, 8192), want));
    /* below the budget: 20 tokens held per list, 4 lists: 256 x 4 x 20 x (512 + 4) */
    assert_true(near(plan_seq(&p, &s, 20, 0), 256.0 * 4 * 20 * (512 + 4)));
    /* a run that never fills its budget is refused, naming the lengths */
    kvs_plan_profile r = traced("h2o", "every_step", 256, 16, 1);
    assert_int_equal(kvs_plan_profile_fit(&r, n, kv, aux, NULL, NULL, N), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "run 7 (h2o, budget 256) never reached its steady state: the longest "
                                          "sequence measured holds 197 tokens and the cache is full only from 257 "
                                          "(replay a longer trace, or a budget below 197)");
    /* a prompt-only run on a prompt shorter than its budget never compressed it */
    kvs_plan_profile q = traced("snapkv", "prompt", 64, 16, 1);
    assert_int_equal(kvs_plan_profile_steady_from(&q), -1);
    assert_int_equal(kvs_plan_profile_fit(&q, n, kv, NULL, NULL, NULL, N), KVS_ERR_INVALID_ARG);
    assert_non_null(strstr(kvs_last_error(), "run 7 (snapkv, budget 64) never compressed its prompt: the trace's "
                                             "prompt has 16 tokens"));
    /* at a budget the prompt reaches, every decode step is steady; the full cache's too */
    q = traced("snapkv", "prompt", 16, 16, 1);
    assert_int_equal(kvs_plan_profile_steady_from(&q), 17);
    q = traced("full", "none", 64, 16, 0);
    assert_int_equal(kvs_plan_profile_steady_from(&q), 17);
}

/* Auxiliary state scales with what it depends on (policies' account(): h2o.c, morphkv.c, quest.c), by hand. */
static void test_aux_rules_by_hand(void **state) {
    (void)state;
    kvs_plan_setup s = setup_of("Llama-3.1-8B", NULL); /* G 4, head_dim 128, fp16 */
    int64_t n[4] = {300, 301, 302, 303};
    double kv[4], aux[4];
    /* H2O (gqa=expand) at 64 on stories260K (G 2, d 8, fp16): KV 2 x 64 rows of 32 bytes, aux 2 x 64 fp32 scores.
     * Llama-3.1-8B by hand: 4 x 64 x 512 + 4 x 64 x 4 = 132096 per (layer, KV head), 33.82 MB a sequence. */
    for (int i = 0; i < 4; i++) kv[i] = 2 * 64 * 32.0, aux[i] = 2 * 64 * 4.0;
    kvs_plan_profile h = traced("h2o", "every_step", 64, 239, 1);
    assert_int_equal(kvs_plan_profile_fit(&h, n, kv, aux, NULL, NULL, 4), KVS_OK);
    assert_true(near(plan_seq(&h, &s, 8192, 8192), 256.0 * (4 * 64 * 512 + 4 * 64 * 4)));
    assert_true(kvs_plan_aux_factor(&h, &s) == 2);
    /* MorphKV (profile=rows, one list per KV head) at C = 128, R = 32: aux = G R C fp32 = 2 x 32 x 128 x 4 = 32768
     * bytes. Llama-3.1-8B: 128 x 512 + 4 x 32 x 128 x 4 = 131072 per head: 33.55 MB (scaled like the KV, x 16,
     * it would be 151.0 MB; kept as measured, x 1, 25.17 MB: neither counts the G copies alone) */
    for (int i = 0; i < 4; i++) kv[i] = 128 * 32.0, aux[i] = 2.0 * 32 * 128 * 4;
    kvs_plan_profile m = traced("morphkv", "every_step", 128, 239, 0);
    assert_int_equal(kvs_plan_aux_rule_of("morphkv", "recent=32,profile=rows,fidelity=paper", &m.aux_rule), KVS_OK);
    assert_int_equal(kvs_plan_profile_fit(&m, n, kv, aux, NULL, NULL, 4), KVS_OK);
    assert_true(near(plan_seq(&m, &s, 8192, 8192), 256.0 * (128 * 512 + 4 * 32 * 128 * 4)));
    /* the override keeps the G copies and changes the head_dim / dtype dependence: kv x 4/2 x 128/8, none x 4/2 */
    m.aux_scale = KVS_PLAN_AUX_KV;
    assert_true(near(plan_seq(&m, &s, 8192, 8192), 256.0 * (128 * 512 + 32768.0 * 2 * 16)));
    m.aux_scale = KVS_PLAN_AUX_NONE;
    assert_true(near(plan_seq(&m, &s, 8192, 8192), 256.0 * (128 * 512 + 32768.0 * 2)));
    /* MorphKV profile=qz, paper: G R (d + 1) fp32 (the queries and Z) = 2 x 32 x 9 x 4; planned 4 x 32 x 129 x 4 */
    for (int i = 0; i < 4; i++) aux[i] = 2.0 * 32 * 9 * 4;
    m = traced("morphkv", "every_step", 128, 239, 0);
    assert_int_equal(kvs_plan_aux_rule_of("morphkv", "recent=32,profile=qz,fidelity=paper", &m.aux_rule), KVS_OK);
    assert_int_equal(m.aux_rule.head_dim_offset, 1);
    assert_int_equal(kvs_plan_profile_fit(&m, n, kv, aux, NULL, NULL, 4), KVS_OK);
    assert_true(near(plan_seq(&m, &s, 8192, 8192), 256.0 * (128 * 512 + 4.0 * 32 * 129 * 4)));
    /* ... ref mode keeps no Z: G R d */
    assert_int_equal(kvs_plan_aux_rule_of("morphkv", "profile=qz,fidelity=ref", &m.aux_rule), KVS_OK);
    assert_int_equal(m.aux_rule.head_dim_offset, 0);
    /* Quest: page min/max keys, 2 d per page in the KV dtype, once per KV head: 10 pages at d 8, fp16 = 320 bytes;
     * planned at fp8: 2 x 128 x 10 x 1 = 2560 bytes per head (and the KV at 1 byte per element) */
    for (int i = 0; i < 4; i++) kv[i] = (double)n[i] * 32, aux[i] = 2.0 * 8 * 10 * 2;
    kvs_plan_profile qp = traced("quest", "every_step", 64, 239, 0);
    assert_int_equal(kvs_plan_profile_fit(&qp, n, kv, aux, NULL, NULL, 4), KVS_OK);
    kvs_plan_setup s8 = s;
    s8.kv_elem_bytes = 1;
    assert_true(fabs(plan_seq(&qp, &s8, 300, 0) - 256.0 * (300 * 256 + 2.0 * 128 * 10 * 1)) < 1e-3);
    /* every registered policy has a rule; a name the planner does not know is refused */
    for (int i = 0; i < kvs_policy_count(); i++) {
        kvs_plan_aux_rule r;
        if (kvs_plan_aux_rule_of(kvs_policy_at(i)->name, "", &r) != KVS_OK)
            fail_msg("policy %s has no auxiliary scaling rule", kvs_policy_at(i)->name);
    }
    kvs_plan_aux_rule r;
    assert_int_equal(kvs_plan_aux_rule_of("nosuch", "", &r), KVS_ERR_INVALID_ARG);
    assert_string_equal(kvs_last_error(), "no auxiliary scaling rule for policy 'nosuch' (--aux-scale kv|none says one)");
}

/* A nominal per-query-head policy keeps G sets per KV head, as its replay measures. */
static void test_nominal_layout(void **state) {
    (void)state;
    kvs_plan_setup s = setup_of("Llama-3.1-8B", NULL);
    kvs_plan_policy c = {.kind = KVS_PLAN_CONSTANT, .budget = 64}, q = c, po = {.kind = KVS_PLAN_PROMPT_ONLY,
                                                                               .budget = 64, .per_query_head = 1};
    q.per_query_head = 1;
    kvs_plan_point a, b, d;
    assert_int_equal(kvs_plan_eval(&s, &c, 4096, 100, 1, &a), KVS_OK);
    assert_int_equal(kvs_plan_eval(&s, &q, 4096, 100, 1, &b), KVS_OK);
    assert_int_equal(kvs_plan_eval(&s, &po, 4096, 100, 1, &d), KVS_OK);
    assert_true(a.seq_device_bytes == 256.0 * 64 * 512);
    assert_true(b.seq_device_bytes == 256.0 * 4 * 64 * 512);
    assert_true(d.seq_device_bytes == 256.0 * 4 * (64 + 100) * 512);
}

/* Max context is clamped to the model's context less the response: Llama-3.1-8B on 80 GB (pool 80e9 - 2 x
 * 8030261248 bytes) fits 487819 tokens of full cache by memory, but its context is 131072; Llama-3-8B's 8192. */
static void test_max_context_clamped(void **state) {
    (void)state;
    const double pool = 80e9 - 2 * 8030261248.0;
    kvs_plan_setup s = setup_of("Llama-3.1-8B", NULL);
    s.gpu_bytes = 80e9;
    kvs_plan_policy full = {.kind = KVS_PLAN_FULL}, cons = {.kind = KVS_PLAN_CONSTANT, .budget = 1024};
    kvs_plan_point p;
    assert_int_equal(kvs_plan_eval(&s, &full, 4096, 0, 1, &p), KVS_OK);
    assert_int_equal(p.max_context_memory, (int64_t)floor(pool / 131072));
    assert_int_equal(p.max_context_memory, 487819);
    assert_int_equal(p.max_context, 131072);
    assert_true(p.context_clamped);
    assert_int_equal(kvs_plan_eval(&s, &full, 4096, 1000, 1, &p), KVS_OK);
    assert_int_equal(p.max_context, 131072 - 1000);
    assert_int_equal(kvs_plan_eval(&s, &cons, 4096, 0, 1, &p), KVS_OK); /* constant size: memory never binds */
    assert_int_equal(p.max_context_memory, KVS_PLAN_UNBOUNDED);
    assert_int_equal(p.max_context, 131072);
    assert_int_equal(kvs_plan_eval(&s, &full, 4096, 200000, 1, &p), KVS_OK); /* the response alone overflows */
    assert_int_equal(p.max_context, 0);
    s.model = *preset("Llama-3-8B");
    assert_int_equal(kvs_plan_eval(&s, &full, 4096, 0, 1, &p), KVS_OK);
    assert_int_equal(p.max_context_memory, 487819);
    assert_int_equal(p.max_context, 8192);
    /* at batch 64 memory binds first: floor(pool / 64 / 131072) = 7622 < 8192, not clamped */
    assert_int_equal(kvs_plan_eval(&s, &full, 4096, 0, 64, &p), KVS_OK);
    assert_int_equal(p.max_context, (int64_t)floor(pool / 64 / 131072));
    assert_false(p.context_clamped);
}

/* One parameter count whatever describes the model: a trace's header and settings, a config.json, and the capture's
 * loader (gpu_capture/model.c) agree on tinystories-656K (tied classifier) and stories260K (llama2.c, shared). */
static void test_params_one_count(void **state) {
    (void)state;
    char dir[512], bin[512];
    snprintf(dir, sizeof dir, "%s/../shared/models/tinystories-656K", kvs_test_root());
    snprintf(bin, sizeof bin, "%s/../shared/models/stories260K.bin", kvs_test_root());
    if (!kvs_test_exists(dir) || !kvs_test_exists(bin)) skip();
    kvs_model *model = NULL;
    assert_int_equal(kvs_model_load(dir, &model), KVS_OK);
    const kvs_model_info *mi = kvs_model_info_get(model);
    kvs_plan_model cfg, tr;
    assert_int_equal(kvs_plan_model_from_config(dir, &cfg), KVS_OK);
    assert_int_equal(cfg.tied_embeddings, 1);
    assert_true(kvs_plan_params(&cfg) == (double)mi->n_params);
    /* hand: 2 layers x (2 x 128 + 128 x 128 + 2 x 64 x 128 + 128 x 128 + 3 x 384 x 128) + 128 + 2048 x 128 */
    assert_true(kvs_plan_params(&cfg) == 2.0 * (256 + 16384 + 16384 + 16384 + 147456) + 128 + 262144);
    /* the header with a settings string that records the tie; without it the tie is not known (counted apart) */
    kvs_plan_model_from_trace(&mi->config, "backend=cpu architecture=LlamaForCausalLM tie_word_embeddings=1", "t.kvt",
                              &tr);
    assert_int_equal(tr.tied_embeddings, 1);
    assert_true(kvs_plan_params(&tr) == kvs_plan_params(&cfg));
    kvs_plan_model_from_trace(&mi->config, "backend=cpu model_format=hf architecture=LlamaForCausalLM", "t.kvt", &tr);
    assert_int_equal(tr.tied_embeddings, -1);
    assert_true(kvs_plan_params(&tr) == kvs_plan_params(&cfg) + 2048.0 * 128);
    tr.tied_embeddings = 1; /* what --tied-embeddings yes says */
    assert_true(kvs_plan_params(&tr) == kvs_plan_params(&cfg));
    kvs_model_free(model);
    /* Qwen2's q/k/v biases from the architecture; Llama's attention_bias in a config adds q/k/v and o biases */
    kvs_model_config c = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4, .dim = 8, .hidden_dim = 16,
                          .vocab_size = 10, .max_seq_len = 32};
    kvs_plan_model_from_trace(&c, "architecture=Qwen2ForCausalLM tie_word_embeddings=0", "q.kvt", &tr);
    assert_true(tr.qkv_bias && !tr.o_bias && tr.tied_embeddings == 0);
    /* per layer 2*8 + 8*8 + 2*4*8 + 8*8 + 3*16*8 + (8 + 2*4) biases; + 8 + 2 * 10 * 8 */
    assert_true(kvs_plan_params(&tr) == 16 + 64 + 64 + 64 + 384 + 16 + 8 + 160);
    char cdir[] = "/tmp/kvs_plan_bias_XXXXXX", path[128];
    assert_non_null(mkdtemp(cdir));
    snprintf(path, sizeof path, "%s/config.json", cdir);
    write_file(path, "{\"model_type\":\"llama\",\"num_hidden_layers\":1,\"num_attention_heads\":2,"
                     "\"num_key_value_heads\":1,\"hidden_size\":8,\"intermediate_size\":16,\"vocab_size\":10,"
                     "\"attention_bias\":true}");
    assert_int_equal(kvs_plan_model_from_config(path, &cfg), KVS_OK);
    assert_true(cfg.qkv_bias && cfg.o_bias);
    assert_true(kvs_plan_params(&cfg) == 16 + 64 + 64 + 64 + 384 + 16 + 8 + 8 + 160);
    unlink(path);
    rmdir(cdir);
    /* stories260K (llama2.c: the classifier shared with the embedding) */
    assert_int_equal(kvs_model_load(bin, &model), KVS_OK);
    mi = kvs_model_info_get(model);
    kvs_plan_model_from_trace(&mi->config, NULL, "s.kvt", &tr);
    tr.tied_embeddings = 1;
    assert_true(kvs_plan_params(&tr) == (double)mi->n_params);
    kvs_model_free(model);
}

/* ---- the CLI ---- */
typedef kvs_test_cli_fx cli_fx;

/* Runs kvsim with args; returns its exit status, output in f->out / f->err. */
static int run(cli_fx *f, const char *const *args) { return kvs_test_cli_run(f, args); }

static void expect_out(cli_fx *f, const char *needle) { assert_true(kvs_test_file_has(f->out, needle)); }
static void expect_err(cli_fx *f, const char *needle) { assert_true(kvs_test_file_has(f->err, needle)); }

/* seq_device_bytes of series `id` at (context, response) in the CSV output of the last run; -1 when absent. */
static double csv_seq(cli_fx *f, const char *id, long long context, long long response) {
    char *t = kvs_test_slurp(f->out, NULL), *save = NULL;
    double v = -1;
    for (char *line = strtok_r(t, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *fld[16];
        if (kvs_test_csv_fields(line, fld, 16) < 15 || strcmp(fld[1], id)) continue;
        if (atoll(fld[4]) == context && atoll(fld[5]) == response) v = atof(fld[7]);
    }
    free(t);
    return v;
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
    expect_out(f, "kind,series,label,budget,context,response,batch,seq_device_bytes,total_bytes,host_bytes,"
                  "pcie_bytes_per_step,max_batch,max_context,max_context_memory,context_clamped,kv,"
                  "kv_bytes_per_token\n");
    expect_out(f, "full,full,full cache,,131072,0,256,67645734912,17317308137472,0,0,,,,0,fp16,516096\n");
    const char *list[] = {"plan", "--list-presets", NULL};
    assert_int_equal(run(f, list), 0);
    expect_out(f, "Qwen2.5-14B");
    expect_out(f, "config.json of facebook/opt-30b");
    /* D10 through the CLI: H2O (registry name: every-step budget) at budget = prompt, the settings of Table 5 */
    const char *d10[] = {"plan", "--model", "Llama-3-8B", "--gpu-mem", "80GiB", "--policy", "h2o", "--budget", "256",
                         "--context", "256", "--response", "1024", "--json", NULL};
    assert_int_equal(run(f, d10), 0);
    expect_out(f, "\"policy\":\"constant\",\"planned_series\":\"h2o B=256 nominal\"");
    expect_out(f, "{\"kind\":\"full\",\"series\":\"full\",\"label\":\"full cache\",\"budget\":null,\"context\":256,"
                  "\"response\":1024,\"batch\":1,\"seq_device_bytes\":167772160,");
    /* H2O's default layout keeps a set per query head: 4 x 256 x 131072 bytes, at Llama-3-8B's groups of 4; with
     * gqa=mean one set per KV head, D2O Table 5's 5x (pool = 80 GiB - 2 x 8030261248 bytes) */
    expect_out(f, "{\"kind\":\"constant\",\"series\":\"h2o B=256 nominal\",\"label\":\"h2o, budget 256, nominal "
                  "(constant, 4 sets per KV head)\",\"budget\":256,\"context\":256,\"response\":1024,\"batch\":1,"
                  "\"seq_device_bytes\":134217728,");
    const char *mean[] = {"plan", "--model", "Llama-3-8B", "--gpu-mem", "80GiB", "--policy", "h2o:gqa=mean", "--budget",
                          "256", "--context", "256", "--response", "1024", "--csv", NULL};
    assert_int_equal(run(f, mean), 0);
    char line[256];
    /* max context: memory never binds a constant size; the model's 8192 less the 1024 generated does */
    snprintf(line, sizeof line, "constant,h2o B=256 nominal,\"h2o, budget 256, nominal (constant)\",256,256,1024,1,"
                                "33554432,33554432,0,0,%lld,7168,unbounded,1,fp16,131072\n",
             (long long)floor((80 * GiB - 2 * 8030261248.0) / 33554432));
    expect_out(f, line);
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
    const char *aux[] = {"plan", "--model", "Phi-4", "--aux-scale", "half", NULL};
    assert_int_equal(run(f, aux), 2);
    expect_err(f, "--aux-scale: 'half' is not auto, kv or none");
    const char *tie[] = {"plan", "--model", "Phi-4", "--tied-embeddings", "maybe", NULL};
    assert_int_equal(run(f, tie), 2);
    expect_err(f, "--tied-embeddings: 'maybe' is not yes or no");
    const char *pol[] = {"plan", "--model", "Phi-4", "--policy", "h2o:gqa=sideways", NULL};
    assert_int_equal(run(f, pol), 2);
    expect_err(f, "--policy: 'h2o:gqa=sideways' is neither full, constant, prompt-only, offload nor a registered "
                  "policy (kvsim policies): ");
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
    /* nominal full at 239+256 = 495 tokens: 495 * 131072 bytes per sequence, 4 sequences; the measured line must
     * give the same (up to the fit's rounding) */
    double want = 495.0 * 131072, meas = csv_seq(f, "measured full B=64 (run 1)", 239, 256);
    assert_true(fabs(meas - want) / want < 1e-6);
    assert_true(csv_seq(f, "full", 239, 256) == want);
    /* the window at 64: 64 tokens per KV head, no auxiliary state; with --db and both plots */
    snprintf(png, sizeof png, "%s/mem.png", f->dir);
    snprintf(svg, sizeof svg, "%s/batch.svg", f->dir);
    const char *win[] = {"plan", "--model", "Llama-3.1-8B", "--profile", db, "--policy", "window", "--budget", "64",
                         "--context", "239", "--response", "256", "--gpu-mem", "80GB", "--json", "--db", db,
                         "--plot-memory", png, "--plot-batch", svg, NULL};
    assert_int_equal(run(f, win), 0);
    expect_out(f, "{\"kind\":\"measured\",\"series\":\"measured window B=64 (run 2)\",\"label\":\"measured: window, "
                  "budget 64 (run 2)\",\"budget\":64,\"context\":239,\"response\":256,\"batch\":1,"
                  "\"seq_device_bytes\":8388608,");
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
        if (!strcmp(rows[0].points[i].series, "measured window B=64 (run 2)") && rows[0].points[i].context == 239 &&
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

/* The steady state through the CLI: H2O and MorphKV measured on a trace whose prompt (16 tokens) is shorter than
 * their budgets plan the same as on the bundled trace (prompt 239, the cache full from the first decode step), and
 * both as computed by hand; SnapKV on the short prompt is refused; the printed fit names its steps; the stored
 * series name their policy and budget; --run with another run's --policy is refused; the max context is clamped;
 * the weights of a trace whose tie is not recorded are said so, and --tied-embeddings gives the loader's count. */
static void test_cli_steady_state_and_scaling(void **state) {
    cli_fx *f = *state;
    if (!kvs_test_kvsim_bin()) skip();
    char model[512], bundled[512], shortt[160], sdb[160], bdb[160], pdb[160];
    snprintf(model, sizeof model, "%s/../shared/models/stories260K.bin", kvs_test_root());
    snprintf(bundled, sizeof bundled, "%s/examples/stories260K.kvt", kvs_test_root());
    if (!kvs_test_exists(model)) skip();
    snprintf(shortt, sizeof shortt, "%s/short.kvt", f->dir);
    snprintf(sdb, sizeof sdb, "%s/short.db", f->dir);
    snprintf(bdb, sizeof bdb, "%s/bundled.db", f->dir);
    snprintf(pdb, sizeof pdb, "%s/plans.db", f->dir);
    const char *cap[] = {"capture", "--model", model, "--prompt", "Once upon a time, there was a little dog named Max",
                         "--steps", "200", "--out", shortt, NULL};
    assert_int_equal(run(f, cap), 0);
    kvs_trace *tr = NULL;
    assert_int_equal(kvs_trace_open(shortt, &tr), KVS_OK);
    const int64_t P = kvs_trace_info_get(tr)->prompt_len, N = kvs_trace_info_get(tr)->n_positions;
    kvs_trace_close(tr);
    assert_true(P < 64 && N > 129); /* the prompt is shorter than both budgets, the run longer */
    const char *rs[] = {"replay", shortt, "--db", sdb, "--policy", "h2o", "--policy", "morphkv", "--policy", "snapkv",
                        "--budgets", "64,128", "--series-every", "1", "--threads", "2", NULL};
    assert_int_equal(run(f, rs), 0);
    const char *rb[] = {"replay", bundled, "--db", bdb, "--policy", "h2o", "--policy", "morphkv", "--budgets", "64,128",
                        "--series-every", "1", "--threads", "2", NULL};
    assert_int_equal(run(f, rb), 0);
    /* by hand on Llama-3.1-8B (256 (layer, KV head)s, G 4, 512 bytes of K/V per token and KV head at fp16):
     *   H2O (gqa=expand) at 64: 4 sets of 64 slots, each 512 bytes of K/V and a 4-byte fp32 score
     *   MorphKV at 128 (recent 32): 128 slots of K/V, and G R C = 4 x 32 x 128 fp32 profile values */
    const double h2o = 256.0 * 4 * 64 * (512 + 4), morph = 256.0 * (128 * 512 + 4 * 32 * 128 * 4);
    const char *dbs[2] = {sdb, bdb};
    for (int d = 0; d < 2; d++) {
        const char *ph[] = {"plan", "--model", "Llama-3.1-8B", "--profile", dbs[d], "--policy", "h2o", "--budget", "64",
                            "--context", "8192", "--response", "8192", "--csv", NULL};
        assert_int_equal(run(f, ph), 0);
        double v = csv_seq(f, "measured h2o B=64 (run 1)", 8192, 8192);
        if (!near(v, h2o)) fail_msg("%s: h2o at 64 plans %.17g, by hand %.17g", dbs[d], v, h2o);
        /* the nominal series of the same policy keeps the same 4 sets (KV only: no scores) */
        assert_true(csv_seq(f, "h2o B=64 nominal", 8192, 8192) == 256.0 * 4 * 64 * 512);
        const char *pm[] = {"plan", "--model", "Llama-3.1-8B", "--profile", dbs[d], "--policy", "morphkv", "--budget",
                            "128", "--context", "8192", "--response", "8192", "--csv", NULL};
        assert_int_equal(run(f, pm), 0);
        v = csv_seq(f, "measured morphkv B=128 (run 4)", 8192, 8192);
        if (!near(v, morph)) fail_msg("%s: morphkv at 128 plans %.17g, by hand %.17g", dbs[d], v, morph);
    }
    /* the text names the steps the fit used: decode steps with the cache full, n = 65..N of the N - P measured */
    const char *txt[] = {"plan", "--model", "Llama-3.1-8B", "--profile", sdb, "--policy", "h2o", "--budget", "64",
                         "--gpu-mem", "80GB", "--context", "8192", "--response", "8192", NULL};
    assert_int_equal(run(f, txt), 0);
    char want[512];
    snprintf(want, sizeof want, "steady state from n = 65 (decode steps with the cache full, n > budget 64): fitted "
                                "on n = 65..%lld, %lld of the %lld measured steps",
             (long long)N, (long long)(N - 64), (long long)(N - P));
    expect_out(f, want);
    expect_out(f, "device token equivalents per KV head = 128 + 0 x n (KV) + 16 + 0 x n (aux)"); /* 2 x 64, 2 x 64 x 4 / 32 */
    expect_out(f, "auxiliary state auto: per list, independent of head_dim, in auxiliary elements as measured (a "
                  "score per held slot, per list); x 2 on the planned model"); /* G 4 / G 2 */
    /* max context at 8192 generated: the model's 131072 - 8192 = 122880 binds; memory alone: pool / 131072 - 8192 */
    const double pool = 80e9 - 2 * 8030261248.0;
    expect_out(f, "122880 (model)");
    snprintf(want, sizeof want, "memory alone allows full cache: %lld;", (long long)floor(pool / 131072) - 8192);
    expect_out(f, want);
    const char *js[] = {"plan", "--model", "Llama-3.1-8B", "--profile", sdb, "--policy", "h2o", "--budget", "64",
                        "--json", NULL};
    assert_int_equal(run(f, js), 0);
    snprintf(want, sizeof want, "\"n_min\":%lld,\"n_max\":%lld,\"n_points\":%lld,\"steady_from\":65,\"fit_n_min\":65,"
                                "\"fit_n_max\":%lld,\"fit_points\":%lld,",
             (long long)P + 1, (long long)N, (long long)(N - P), (long long)N, (long long)(N - 64));
    expect_out(f, want);
    expect_out(f, "\"aux_factor\":2,\"copies\":2,\"tok_bytes\":32,");
    /* a budget one below the longest sequence: one steady step, a flat line, said so */
    char odb[160], bud[32];
    snprintf(odb, sizeof odb, "%s/one.db", f->dir);
    snprintf(bud, sizeof bud, "%lld", (long long)N - 1);
    const char *r1[] = {"replay", shortt, "--db", odb, "--policy", "h2o", "--budgets", bud, "--series-every", "1",
                        "--threads", "2", NULL};
    assert_int_equal(run(f, r1), 0);
    const char *p1[] = {"plan", "--model", "Llama-3.1-8B", "--profile", odb, NULL};
    assert_int_equal(run(f, p1), 0);
    snprintf(want, sizeof want, "the measured profile's steady state is a single step (n = %lld)", (long long)N);
    expect_err(f, want);
    /* SnapKV on the 16-token prompt at 64 never compressed anything: no steady state, refused */
    const char *snap[] = {"plan", "--model", "Llama-3.1-8B", "--profile", sdb, "--policy", "snapkv", "--budget", "64",
                          NULL};
    assert_int_equal(run(f, snap), 2);
    snprintf(want, sizeof want, "run 5 (snapkv, budget 64) never compressed its prompt: the trace's prompt has %lld "
                                "tokens", (long long)P);
    expect_err(f, want);
    /* --run with the --policy of another run */
    const char *mism[] = {"plan", "--model", "Llama-3.1-8B", "--profile", sdb, "--run", "2", "--policy", "morphkv",
                          NULL};
    assert_int_equal(run(f, mism), 2);
    expect_err(f, "run 2 is h2o at budget 128, not morphkv: give --run alone, or --policy and --budget without --run");
    /* the stored series name their policy and budget */
    const char *st[] = {"plan", "--model", "Llama-3.1-8B", "--profile", sdb, "--run", "4", "--db", pdb, NULL};
    assert_int_equal(run(f, st), 0);
    kvs_results_db *h = NULL;
    assert_int_equal(kvs_results_open_readonly(pdb, &h), KVS_OK);
    kvs_results_plan_row *rows = NULL;
    int64_t n = 0;
    assert_int_equal(kvs_results_query_plans(h, &rows, &n), KVS_OK);
    assert_int_equal(n, 1);
    const char *ids[] = {"full", "constant B=128", "prompt-only B=128", "morphkv B=128 nominal",
                         "measured morphkv B=128 (run 4)"};
    for (size_t k = 0; k < 5; k++) {
        int found = 0;
        for (int64_t i = 0; i < rows[0].n_points; i++) found |= !strcmp(rows[0].points[i].series, ids[k]);
        if (!found) fail_msg("series '%s' not stored", ids[k]);
    }
    for (int64_t i = 0; i < rows[0].n_points; i++)
        if (!strncmp(rows[0].points[i].series, "measured", 8)) assert_int_equal(rows[0].points[i].budget, 128);
    kvs_results_plan_rows_free(rows, n);
    kvs_results_close(h);
    /* a plans table written before the steady-state columns gains them; the stored fit is the printed one */
    char mig[160];
    snprintf(mig, sizeof mig, "%s/old.db", f->dir);
    assert_int_equal(kvs_results_open(mig, &h), KVS_OK); /* a results database, then an old plans table in it */
    kvs_results_close(h);
    sqlite3 *sq = NULL;
    assert_int_equal(sqlite3_open(mig, &sq), SQLITE_OK);
    assert_int_equal(sqlite3_exec(sq, "CREATE TABLE plans (id INTEGER PRIMARY KEY AUTOINCREMENT, created_at TEXT NOT "
                                      "NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ','now')), kvsim_version TEXT, "
                                      "trace_id INTEGER, model TEXT NOT NULL, model_source TEXT, n_layers INTEGER NOT "
                                      "NULL, n_heads INTEGER NOT NULL, n_kv_heads INTEGER NOT NULL, head_dim INTEGER "
                                      "NOT NULL, params REAL, kv_dtype TEXT NOT NULL, kv_bytes_per_token REAL NOT "
                                      "NULL, weight_dtype TEXT, weight_bytes REAL NOT NULL, n_gpus INTEGER NOT NULL, "
                                      "gpu_bytes REAL, reserve_bytes REAL NOT NULL, kv_pool_bytes REAL, batch INTEGER "
                                      "NOT NULL, context INTEGER NOT NULL, response INTEGER NOT NULL, policy TEXT NOT "
                                      "NULL, budget INTEGER, profile_db TEXT, profile_run_id INTEGER, profile_policy "
                                      "TEXT, profile_params TEXT, profile_x TEXT, aux_scale TEXT, kv_a REAL, kv_b "
                                      "REAL, aux_a REAL, aux_b REAL, host_a REAL, host_b REAL, transfer_a REAL, "
                                      "transfer_b REAL, fit_r2 REAL);",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(sq);
    const char *mg[] = {"plan", "--model", "Llama-3.1-8B", "--profile", sdb, "--run", "1", "--db", mig, NULL};
    assert_int_equal(run(f, mg), 0);
    assert_int_equal(sqlite3_open(mig, &sq), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    assert_int_equal(sqlite3_prepare_v2(sq, "SELECT fit_n_min, fit_n_max, fit_points, aux_scale FROM plans", -1, &q,
                                        NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_int64(q, 0), 65);
    assert_int_equal(sqlite3_column_int64(q, 1), N);
    assert_int_equal(sqlite3_column_int64(q, 2), N - 64);
    assert_string_equal((const char *)sqlite3_column_text(q, 3), "auto: per list, independent of head_dim, in "
                                                                 "auxiliary elements as measured (a score per held "
                                                                 "slot, per list)");
    sqlite3_finalize(q);
    sqlite3_close(sq);
    /* the weights of a trace: a trace captured now records the tie, and the count is the loader's without a
     * warning; the bundled trace (captured before the settings carried it) does not: a warning, counted apart;
     * said, the loader's count */
    kvs_model *mdl = NULL;
    assert_int_equal(kvs_model_load(model, &mdl), KVS_OK);
    const unsigned long long loaded = (unsigned long long)kvs_model_info_get(mdl)->n_params;
    kvs_model_free(mdl);
    const char *trc[] = {"plan", "--trace", shortt, "--json", NULL};
    assert_int_equal(run(f, trc), 0);
    expect_out(f, "\"tied_embeddings\":true");
    snprintf(want, sizeof want, "\"params\":%llu}", loaded);
    expect_out(f, want);
    char *quiet = kvs_test_slurp(f->err, NULL);
    assert_null(strstr(quiet, "does not record whether the classifier is tied"));
    free(quiet);
    const char *tw[] = {"plan", "--trace", bundled, "--json", NULL};
    assert_int_equal(run(f, tw), 0);
    expect_err(f, "does not record whether the classifier is tied to the token embedding: the weights count it apart "
                  "(0.03277 million parameters more than tied)"); /* vocab 512 x dim 64 */
    expect_out(f, "\"tied_embeddings\":null");
    snprintf(want, sizeof want, "\"params\":%llu}", loaded + 512 * 64);
    expect_out(f, want);
    snprintf(want, sizeof want, "\"params\":%llu}", loaded);
    const char *tt[] = {"plan", "--trace", bundled, "--tied-embeddings", "yes", "--json", NULL};
    assert_int_equal(run(f, tt), 0);
    expect_out(f, want);
    /* the same HF model described by its config.json and by a trace of it: one count */
    char hf[512], hft[160];
    snprintf(hf, sizeof hf, "%s/../shared/models/tinystories-656K", kvs_test_root());
    snprintf(hft, sizeof hft, "%s/hf.kvt", f->dir);
    if (kvs_test_exists(hf)) {
        const char *caph[] = {"capture", "--model", hf, "--prompt", "Once upon a time", "--steps", "4", "--out", hft,
                              NULL};
        assert_int_equal(run(f, caph), 0);
        const char *pc[] = {"plan", "--config", hf, "--json", NULL};
        assert_int_equal(run(f, pc), 0);
        expect_out(f, "\"params\":656000}"); /* 2 x 196864 + 128 + 2048 x 128, tied */
        const char *pt[] = {"plan", "--trace", hft, "--tied-embeddings", "yes", "--json", NULL};
        assert_int_equal(run(f, pt), 0);
        expect_out(f, "\"params\":656000}");
    }
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
        cmocka_unit_test(test_profile_steady_state),
        cmocka_unit_test(test_aux_rules_by_hand),
        cmocka_unit_test(test_nominal_layout),
        cmocka_unit_test(test_max_context_clamped),
        cmocka_unit_test(test_params_one_count),
        cmocka_unit_test(test_plot_script_names_every_series),
        cmocka_unit_test_setup_teardown(test_cli_reproduces_the_papers, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_bad_input, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_measured_profile_from_replay, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test_setup_teardown(test_cli_steady_state_and_scaling, kvs_test_cli_setup, kvs_test_cli_teardown),
        cmocka_unit_test(test_option_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
