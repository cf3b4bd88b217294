/* test_model.c — golden tests of the CPU reference model runtime (gpu_capture/model.h, sampler.h,
 * threadpool.h) against the independent PyTorch reference (tests/fixtures/gen_reference.py) on both real
 * models in ../shared/models and on the tiny Qwen2 (bias, bf16) and Llama-3 (rope_scaling, fp16, sharded)
 * fixtures; the llama2.c -> HF conversion equivalence; and every class of bad checkpoint.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/util/testenv.h"

#include "common/json.h"
#include "common/kvs_math.h"
#include "gpu_capture/model.h"
#include "gpu_capture/sampler.h"
#include "common/threadpool.h"

#define TOL 1e-4

static void path_of(char *buf, size_t cap, const char *rel) { snprintf(buf, cap, "%s/%s", kvs_test_root(), rel); }

#define NEED_MODELS()                                                                                 \
    do {                                                                                              \
        char mp_[4096];                                                                               \
        path_of(mp_, sizeof mp_, "../shared/models/stories260K.bin");                                 \
        if (!kvs_test_exists(mp_)) {                                                                           \
            fprintf(stderr, "SKIP: %s absent (shared real models not installed)\n", mp_);             \
            skip();                                                                                   \
        }                                                                                             \
    } while (0)

/* ---- reference fixtures ---- */

typedef struct {
    kvs_json *meta;
    float *data;
    size_t n_floats;
    int32_t tokens[256];
    int n_tokens, prompt[64], n_prompt;
    int positions[16], n_positions;
} reference;

static void load_reference(const char *name, reference *ref) {
    char p[4096], rel[512];
    char *text;
    size_t len;
    memset(ref, 0, sizeof *ref);
    snprintf(rel, sizeof rel, "tests/fixtures/%s.ref.json", name);
    path_of(p, sizeof p, rel);
    assert_int_equal(kvs_read_file(p, &text, &len), KVS_OK);
    assert_int_equal(kvs_json_parse(text, len, &ref->meta), KVS_OK);
    free(text);
    const kvs_json *t = kvs_json_get(ref->meta, "tokens"), *pr = kvs_json_get(ref->meta, "prompt"),
                   *ps = kvs_json_get(ref->meta, "positions");
    ref->n_tokens = (int)kvs_json_len(t);
    for (int i = 0; i < ref->n_tokens; i++) ref->tokens[i] = (int32_t)kvs_json_number(kvs_json_at(t, (size_t)i));
    ref->n_prompt = (int)kvs_json_len(pr);
    for (int i = 0; i < ref->n_prompt; i++) ref->prompt[i] = (int)kvs_json_number(kvs_json_at(pr, (size_t)i));
    ref->n_positions = (int)kvs_json_len(ps);
    for (int i = 0; i < ref->n_positions; i++) ref->positions[i] = (int)kvs_json_number(kvs_json_at(ps, (size_t)i));
    snprintf(rel, sizeof rel, "tests/fixtures/%s.ref.f32", name);
    path_of(p, sizeof p, rel);
    assert_int_equal(kvs_read_file(p, &text, &len), KVS_OK);
    ref->data = (float *)(void *)text; /* malloc'd, so suitably aligned */
    ref->n_floats = len / 4;
}

static void free_reference(reference *ref) {
    kvs_json_free(ref->meta);
    free(ref->data);
}

static double worst_abs, worst_rel; /* over one run_golden, printed at its end */

static void expect_close(const char *what, int layer, int pos, const float *ref, const float *got, size_t n) {
    double e = kvs_rel_l2(ref, got, n);
    for (size_t i = 0; i < n; i++) worst_abs = fmax(worst_abs, fabs((double)ref[i] - (double)got[i]));
    worst_rel = fmax(worst_rel, e);
    if (!(e <= TOL)) {
        fprintf(stderr, "%s layer %d position %d: relative error %.3e > %.0e\n", what, layer, pos, e, TOL);
        fail();
    }
}

/* Greedy decoding of `m` over the reference's prompt; compares tokens and the per-layer records. */
static void run_golden(kvs_model *m, const reference *ref, int threads) {
    const kvs_model_config *c = &kvs_model_info_get(m)->config;
    kvs_threadpool *pool;
    kvs_model_state *st;
    assert_int_equal(kvs_threadpool_create(threads, &pool), KVS_OK);
    assert_int_equal(kvs_model_state_create(m, ref->n_tokens, pool, &st), KVS_OK);
    kvs_sampler *smp;
    assert_int_equal(kvs_sampler_create(c->vocab_size, 0, 1, 0, &smp), KVS_OK);
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t per_layer = 2 * qd + 2 * kvd + (size_t)c->n_heads;
    assert_int_equal(ref->n_floats, (size_t)ref->n_positions * c->n_layers * per_layer);
    int32_t tok = ref->tokens[0];
    int pi = 0;
    const float *last = NULL;
    worst_abs = worst_rel = 0;
    for (int pos = 0; pos < ref->n_tokens; pos++) {
        assert_int_equal(tok, ref->tokens[pos]);
        const float *logits;
        assert_int_equal(kvs_model_forward(st, tok, pos, &logits), KVS_OK);
        last = logits;
        if (pi < ref->n_positions && ref->positions[pi] == pos) {
            const float *r = ref->data + (size_t)pi * c->n_layers * per_layer;
            for (int l = 0; l < c->n_layers; l++, r += per_layer) {
                kvs_layer_record rec;
                assert_int_equal(kvs_model_state_layer(st, l, &rec), KVS_OK);
                expect_close("q", l, pos, r, rec.q, qd);
                expect_close("k", l, pos, r + qd, rec.k, kvd);
                expect_close("v", l, pos, r + qd + kvd, rec.v, kvd);
                expect_close("o", l, pos, r + qd + 2 * kvd, rec.o, qd);
                expect_close("lse", l, pos, r + 2 * qd + 2 * kvd, rec.lse, (size_t)c->n_heads);
            }
            pi++;
        }
        tok = pos + 1 < ref->n_prompt ? ref->prompt[pos + 1] : kvs_sampler_sample(smp, logits);
    }
    assert_int_equal(pi, ref->n_positions);
    const kvs_json *ll = kvs_json_get(ref->meta, "last_logits");
    if (ll) { /* the classifier, final norm and soft-capping, which greedy tokens alone cannot pin down */
        assert_int_equal(kvs_json_len(ll), (size_t)c->vocab_size);
        float *want = malloc((size_t)c->vocab_size * sizeof *want);
        assert_non_null(want);
        for (int i = 0; i < c->vocab_size; i++) want[i] = (float)kvs_json_number(kvs_json_at(ll, (size_t)i));
        expect_close("logits", -1, ref->n_tokens - 1, want, last, (size_t)c->vocab_size);
        free(want);
    }
    fprintf(stderr, "%s, %d thread(s): max |diff| %.3g, max relative L2 error %.3g over the recorded arrays\n",
            c->model_name, threads, worst_abs, worst_rel);
    kvs_sampler_free(smp);
    kvs_model_state_free(st);
    kvs_threadpool_free(pool);
}

static void test_stories260K_matches_torch_reference(void **state) {
    (void)state;
    NEED_MODELS();
    char p[4096];
    path_of(p, sizeof p, "../shared/models/stories260K.bin");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_string_equal(info->config.model_name, "stories260K");
    assert_int_equal(info->config.n_kv_heads, 4);
    assert_int_equal(info->config.rope_layout, KVS_ROPE_ADJACENT);
    assert_int_equal(info->n_params, 260032);
    reference ref;
    load_reference("stories260K", &ref);
    static const int32_t readme[] = {1, 403, 407, 261, 378, 432, 383, 286};
    for (int i = 0; i < 8; i++) assert_int_equal(ref.tokens[i], readme[i]);
    run_golden(m, &ref, 1);
    run_golden(m, &ref, 3); /* threading changes nothing */
    free_reference(&ref);
    kvs_model_free(m);
}

static void test_tinystories656K_matches_torch_reference(void **state) {
    (void)state;
    NEED_MODELS();
    char p[4096];
    path_of(p, sizeof p, "../shared/models/tinystories-656K");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_string_equal(info->config.model_name, "tinystories-656K");
    assert_string_equal(info->architecture, "LlamaForCausalLM");
    assert_int_equal(info->config.rope_layout, KVS_ROPE_HALVES);
    assert_int_equal(info->bos_id, 1);
    assert_true(kvs_model_is_eos(m, 2));
    reference ref;
    load_reference("tinystories-656K", &ref);
    static const int32_t readme[] = {1, 147, 201, 282, 215, 286, 598, 1662};
    for (int i = 0; i < 8; i++) assert_int_equal(ref.tokens[i], readme[i]);
    run_golden(m, &ref, 2);
    free_reference(&ref);
    kvs_model_free(m);
}

static void test_qwen2_bias_bf16_fixture_matches_reference(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/qwen2_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_int_equal(info->qkv_bias, 1);
    assert_int_equal(info->weight_dtype, KVS_DTYPE_BF16);
    assert_true(info->config.rope_theta == 1e6f);
    reference ref;
    load_reference("qwen2_tiny", &ref);
    run_golden(m, &ref, 2);
    free_reference(&ref);
    kvs_model_free(m);
}

static void test_llama3_rope_scaling_sharded_fp16_matches_reference(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/llama3_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_int_equal(info->rope_llama3, 1);
    assert_int_equal(info->weight_dtype, KVS_DTYPE_F16);
    assert_int_equal(info->config.head_dim, 16);
    assert_int_equal(info->n_eos, 2);
    reference ref;
    load_reference("llama3_tiny", &ref);
    run_golden(m, &ref, 1);
    free_reference(&ref);
    kvs_model_free(m);
}

/* head_dim given apart from hidden_size (3 heads x 24 = 72 != 32), a group of 3 query heads per KV head,
 * fp32 weights, untied classifier */
static void test_mistral_wide_heads_fp32_fixture_matches_reference(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/mistral_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_int_equal(info->weight_dtype, KVS_DTYPE_F32);
    assert_int_equal(info->config.head_dim, 24);
    assert_int_equal(info->config.n_heads * info->config.head_dim, 72);
    assert_int_equal(info->config.dim, 32);
    assert_int_equal(info->config.n_kv_heads, 1);
    reference ref;
    load_reference("mistral_tiny", &ref);
    run_golden(m, &ref, 2);
    free_reference(&ref);
    kvs_model_free(m);
}

/* Qwen3: per-head q/k RMSNorm before RoPE, head_dim 16 given apart from hidden 32 / 4 heads, bf16, tied */
static void test_qwen3_qk_norm_fixture_matches_reference(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/qwen3_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_string_equal(info->architecture, "Qwen3ForCausalLM");
    assert_int_equal(info->qk_norm, 1);
    assert_int_equal(info->qkv_bias, 0);
    assert_int_equal(info->norm_plus_one, 0);
    assert_int_equal(kvs_model_config_has_windows(&info->config), 0);
    /* 2 layers x (2*32 norms + 64*32 q + 2*32*32 k/v + 32*64 o + 3*64*32 FFN + 2*16 q/k norms) + 32 + 64*32 */
    assert_int_equal(info->n_params, 2 * (64 + 2048 + 2048 + 2048 + 6144 + 32) + 32 + 2048);
    reference ref;
    load_reference("qwen3_tiny", &ref);
    run_golden(m, &ref, 1);
    run_golden(m, &ref, 2);
    free_reference(&ref);
    kvs_model_free(m);
}

/* Gemma-3: sliding/full/sliding/sliding layers (layer_types; the pattern would differ) with a 6-position window
 * that positions 7 and 20 exceed, per-kind RoPE bases (linear scaling on the full layer only), (1 + w) norms, four
 * per layer, q/k norms, scaled embedding, GeGLU, query_pre_attn_scalar, final soft-capping. */
static void test_gemma3_sliding_fixture_matches_reference(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/gemma3_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_string_equal(info->architecture, "Gemma3ForCausalLM");
    assert_int_equal(info->norm_plus_one, 1);
    assert_int_equal(info->sandwich_norm, 1);
    assert_int_equal(info->gelu_tanh, 1);
    assert_int_equal(info->sliding_window, 6);
    static const int32_t win[4] = {6, 0, 6, 6};
    for (int l = 0; l < 4; l++) assert_int_equal(kvs_model_config_window(&info->config, l), win[l]);
    assert_true(info->embed_scale == 6.9375f); /* sqrt(48) = 6.9282 in bf16 */
    assert_true(fabsf(info->config.attn_scale - 0.20412415f) < 1e-7f); /* 24^-1/2, not 16^-1/2 */
    assert_true(info->final_softcap == 5.0f);
    assert_true(info->rope_linear_factor == 4.0f && info->rope_local_theta == 10000.0f);
    assert_true(kvs_model_is_eos(m, 1) && kvs_model_is_eos(m, 63));
    reference ref;
    load_reference("gemma3_tiny", &ref);
    run_golden(m, &ref, 1);
    run_golden(m, &ref, 3);
    free_reference(&ref);
    kvs_model_free(m);
}

/* ---- writing checkpoints from C (conversion and malformed-input tests) ---- */

typedef struct {
    const char *name;
    const char *dtype; /* "F32" unless overridden */
    int nd;
    uint64_t dims[2];
    const float *data; /* fp32 source */
} st_tensor_src;

/* Writes a safetensors file from fp32 sources: F16 and BF16 tensors are stored rounded to 2 bytes, any other
 * dtype name as the 4-byte fp32 bytes (so unsupported dtypes reach the loader's checks). `extra_end` makes
 * the last tensor claim that many bytes more than it has. */
static size_t st_elem_size(const char *dtype) { return dtype && (!strcmp(dtype, "F16") || !strcmp(dtype, "BF16")) ? 2 : 4; }

static void write_safetensors(const char *path, const st_tensor_src *t, int n, const char *metadata, uint64_t extra_end) {
    char *hdr = malloc(1 << 20);
    assert_non_null(hdr);
    size_t o = 0;
    uint64_t off = 0;
    o += (size_t)sprintf(hdr + o, "{");
    if (metadata) o += (size_t)sprintf(hdr + o, "\"__metadata__\":%s,", metadata);
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int k = 0; k < t[i].nd; k++) numel *= t[i].dims[k];
        uint64_t data_bytes = numel * st_elem_size(t[i].dtype);
        uint64_t bytes = data_bytes + (i == n - 1 ? extra_end : 0);
        o += (size_t)sprintf(hdr + o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name,
                             t[i].dtype ? t[i].dtype : "F32");
        for (int k = 0; k < t[i].nd; k++) o += (size_t)sprintf(hdr + o, "%s%llu", k ? "," : "", (unsigned long long)t[i].dims[k]);
        o += (size_t)sprintf(hdr + o, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                             (unsigned long long)(off + bytes));
        off += data_bytes;
    }
    o += (size_t)sprintf(hdr + o, "}");
    while (o % 8) hdr[o++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t len8[8];
    kvs_put_u64(len8, o);
    fwrite(len8, 1, 8, f);
    fwrite(hdr, 1, o, f);
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int k = 0; k < t[i].nd; k++) numel *= t[i].dims[k];
        if (st_elem_size(t[i].dtype) == 2) {
            uint8_t *h = malloc(numel * 2);
            assert_non_null(h);
            kvs_encode(strcmp(t[i].dtype, "F16") ? KVS_DTYPE_BF16 : KVS_DTYPE_F16, t[i].data, numel, h);
            fwrite(h, 2, numel, f);
            free(h);
        } else {
            fwrite(t[i].data, 4, numel, f);
        }
    }
    fclose(f);
    free(hdr);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

#define STORIES_HF_CONFIG \
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":172,\"num_hidden_layers\":5," \
    "\"num_attention_heads\":8,\"num_key_value_heads\":%d,\"vocab_size\":512,\"max_position_embeddings\":512," \
    "\"rope_theta\":10000.0,\"rms_norm_eps\":1e-05,\"tie_word_embeddings\":true,\"bos_token_id\":1,\"eos_token_id\":2," \
    "\"hidden_act\":\"silu\"}"

/* Converts stories260K.bin into an HF folder at `dir`: q/k rows of each head reordered from llama2.c's
 * adjacent-pair layout to rotate_half's [0,2,4,...,d-2, 1,3,...,d-1]. The embedding is stored as `embed_dt`
 * and the other matrices as `matrix_dt` (safetensors dtype names; NULL = F32), vectors as F32. Returns the
 * permuted q/k buffer (caller frees). */
static float *convert_stories_to_hf(const char *bin, const char *dir, int n_tensors_limit, const char *embed_dt,
                                    const char *matrix_dt) {
    char *raw;
    size_t len;
    assert_int_equal(kvs_read_file(bin, &raw, &len), KVS_OK);
    const int dim = 64, hid = 172, L = 5, Hkv = 4, V = 512, hd = 8, kvd = Hkv * hd;
    const float *p = (const float *)(void *)(raw + 28);
    const float *emb = p, *rms_att = emb + V * dim, *wq = rms_att + L * dim, *wk = wq + L * dim * dim,
                *wv = wk + L * kvd * dim, *wo = wv + L * kvd * dim, *rms_ffn = wo + L * dim * dim,
                *w1 = rms_ffn + L * dim, *w2 = w1 + L * hid * dim, *w3 = w2 + L * dim * hid, *rms_f = w3 + L * hid * dim;
    float *perm = malloc((size_t)L * (dim + kvd) * dim * sizeof(float));
    assert_non_null(perm);
    float *pq = perm, *pk = perm + (size_t)L * dim * dim;
    for (int l = 0; l < L; l++)
        for (int which = 0; which < 2; which++) {
            int rows = which ? kvd : dim;
            const float *src = (which ? wk : wq) + (size_t)l * rows * dim;
            float *dst = (which ? pk : pq) + (size_t)l * rows * dim;
            for (int r = 0; r < rows; r++) {
                int h = r / hd, i = r % hd;
                int from = i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1;
                memcpy(dst + (size_t)r * dim, src + (size_t)(h * hd + from) * dim, dim * sizeof(float));
            }
        }
    st_tensor_src t[64];
    int n = 0;
    char names[64][96];
    t[n++] = (st_tensor_src){"model.embed_tokens.weight", embed_dt, 2, {V, dim}, emb};
    t[n++] = (st_tensor_src){"model.norm.weight", NULL, 1, {dim, 0}, rms_f};
    for (int l = 0; l < L; l++) {
        struct {
            const char *suffix;
            int nd;
            uint64_t d0, d1;
            const float *data;
        } s[] = {
            {"input_layernorm.weight", 1, dim, 0, rms_att + l * dim},
            {"post_attention_layernorm.weight", 1, dim, 0, rms_ffn + l * dim},
            {"self_attn.q_proj.weight", 2, dim, dim, pq + (size_t)l * dim * dim},
            {"self_attn.k_proj.weight", 2, kvd, dim, pk + (size_t)l * kvd * dim},
            {"self_attn.v_proj.weight", 2, kvd, dim, wv + (size_t)l * kvd * dim},
            {"self_attn.o_proj.weight", 2, dim, dim, wo + (size_t)l * dim * dim},
            {"mlp.gate_proj.weight", 2, hid, dim, w1 + (size_t)l * hid * dim},
            {"mlp.down_proj.weight", 2, dim, hid, w2 + (size_t)l * dim * hid},
            {"mlp.up_proj.weight", 2, hid, dim, w3 + (size_t)l * hid * dim},
        };
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
            snprintf(names[n], sizeof names[n], "model.layers.%d.%s", l, s[i].suffix);
            t[n] = (st_tensor_src){names[n], s[i].nd == 2 ? matrix_dt : NULL, s[i].nd, {s[i].d0, s[i].d1}, s[i].data};
            n++;
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    write_safetensors(path, t, n_tensors_limit > 0 && n_tensors_limit < n ? n_tensors_limit : n, NULL, 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    char cfg[1024];
    snprintf(cfg, sizeof cfg, STORIES_HF_CONFIG, 4);
    write_text(path, cfg);
    free(raw);
    return perm;
}

static void rm_dir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_llama2c_and_converted_hf_agree(void **state) {
    (void)state;
    NEED_MODELS();
    char bin[4096], dir[] = "/tmp/kvs_model_XXXXXX";
    path_of(bin, sizeof bin, "../shared/models/stories260K.bin");
    assert_non_null(mkdtemp(dir));
    free(convert_stories_to_hf(bin, dir, 0, NULL, NULL));
    kvs_model *a, *b;
    assert_int_equal(kvs_model_load(bin, &a), KVS_OK);
    assert_int_equal(kvs_model_load(dir, &b), KVS_OK);
    assert_int_equal(kvs_model_info_get(b)->config.rope_layout, KVS_ROPE_HALVES);
    kvs_model_state *sa, *sb;
    assert_int_equal(kvs_model_state_create(a, 64, NULL, &sa), KVS_OK);
    assert_int_equal(kvs_model_state_create(b, 64, NULL, &sb), KVS_OK);
    const int L = 5, H = 8, Hkv = 4, hd = 8;
    int32_t ta = 1, tb = 1;
    for (int pos = 0; pos < 40; pos++) {
        assert_int_equal(ta, tb);
        const float *la, *lb;
        assert_int_equal(kvs_model_forward(sa, ta, pos, &la), KVS_OK);
        assert_int_equal(kvs_model_forward(sb, tb, pos, &lb), KVS_OK);
        for (int l = 0; l < L; l++) {
            kvs_layer_record ra, rb;
            assert_int_equal(kvs_model_state_layer(sa, l, &ra), KVS_OK);
            assert_int_equal(kvs_model_state_layer(sb, l, &rb), KVS_OK);
            /* q/k: HF element i of a head is llama2.c element perm(i) */
            float qa[64], ka[32];
            for (int h = 0; h < H; h++)
                for (int i = 0; i < hd; i++) {
                    int from = i < hd / 2 ? 2 * i : 2 * (i - hd / 2) + 1;
                    qa[h * hd + i] = ra.q[h * hd + from];
                    if (h < Hkv) ka[h * hd + i] = ra.k[h * hd + from];
                }
            expect_close("converted q", l, pos, qa, rb.q, 64);
            expect_close("converted k", l, pos, ka, rb.k, 32);
            expect_close("converted v", l, pos, ra.v, rb.v, 32);
            expect_close("converted o", l, pos, ra.o, rb.o, 64);
            expect_close("converted lse", l, pos, ra.lse, rb.lse, 8);
        }
        int32_t na = 0, nb = 0;
        for (int i = 1; i < 512; i++) {
            if (la[i] > la[na]) na = i;
            if (lb[i] > lb[nb]) nb = i;
        }
        ta = na;
        tb = nb;
    }
    kvs_model_state_free(sa);
    kvs_model_state_free(sb);
    kvs_model_free(a);
    kvs_model_free(b);
    rm_dir(dir);
}

/* The device dtype (kvs_model_info.weight_dtype) is the matrices' common dtype: bf16 matrices with fp32 norms
 * give bf16; an fp16 embedding beside fp32 matrices gives fp32 (nothing would be rounded on a GPU). */
static void test_weight_dtype_is_the_matrices_common_dtype(void **state) {
    (void)state;
    NEED_MODELS();
    char bin[4096], dir[] = "/tmp/kvs_model_XXXXXX";
    path_of(bin, sizeof bin, "../shared/models/stories260K.bin");
    assert_non_null(mkdtemp(dir));
    const struct {
        const char *embed, *matrix;
        kvs_dtype want;
    } cases[] = {{"BF16", "BF16", KVS_DTYPE_BF16}, {"F16", "F16", KVS_DTYPE_F16}, {"F16", NULL, KVS_DTYPE_F32},
                 {NULL, "BF16", KVS_DTYPE_F32},    {"F16", "BF16", KVS_DTYPE_F32}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        free(convert_stories_to_hf(bin, dir, 0, cases[i].embed, cases[i].matrix));
        kvs_model *m = NULL;
        assert_int_equal(kvs_model_load(dir, &m), KVS_OK);
        assert_int_equal(kvs_model_info_get(m)->weight_dtype, cases[i].want);
        kvs_model_state *st = NULL;
        assert_int_equal(kvs_model_state_create(m, 8, NULL, &st), KVS_OK);
        const float *logits;
        assert_int_equal(kvs_model_forward(st, 1, 0, &logits), KVS_OK);
        assert_true(isfinite(logits[0]));
        kvs_model_state_free(st);
        kvs_model_free(m);
    }
    rm_dir(dir);
}

/* ---- bad checkpoints ---- */

static void expect_load_fail(const char *path, kvs_status want, const char *msg_part) {
    kvs_model *m = (kvs_model *)1;
    kvs_clear_error();
    kvs_status s = kvs_model_load(path, &m);
    if (s != want || !strstr(kvs_last_error(), msg_part)) {
        fprintf(stderr, "load %s: status %d (%s), want %d and '%s'\n", path, s, kvs_last_error(), want, msg_part);
        fail();
    }
    assert_null(m);
}

static void copy_prefix(const char *src, const char *dst, size_t n, const void *append, size_t an) {
    char *raw;
    size_t len;
    assert_int_equal(kvs_read_file(src, &raw, &len), KVS_OK);
    FILE *f = fopen(dst, "wb");
    assert_non_null(f);
    fwrite(raw, 1, n < len ? n : len, f);
    if (append) fwrite(append, 1, an, f);
    fclose(f);
    free(raw);
}

static void test_bad_llama2c_checkpoints_fail_clearly(void **state) {
    (void)state;
    NEED_MODELS();
    char bin[4096], dir[] = "/tmp/kvs_model_XXXXXX", p[4200];
    path_of(bin, sizeof bin, "../shared/models/stories260K.bin");
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/missing.bin", dir);
    expect_load_fail(p, KVS_ERR_IO, "cannot open");
    snprintf(p, sizeof p, "%s/trunc.bin", dir);
    copy_prefix(bin, p, 1000000, NULL, 0);
    expect_load_fail(p, KVS_ERR_TRUNCATED, "file is 1000000 bytes but the header (dim 64");
    copy_prefix(bin, p, 20, NULL, 0);
    expect_load_fail(p, KVS_ERR_TRUNCATED, "shorter than the 28-byte llama2.c header");
    copy_prefix(bin, p, 1056540, "junk", 4);
    expect_load_fail(p, KVS_ERR_FORMAT, "4 unexpected trailing bytes");
    int32_t bad_hdr[7] = {64, 172, 5, 8, 3, 512, 512};
    copy_prefix(bin, p, 0, bad_hdr, sizeof bad_hdr);
    expect_load_fail(p, KVS_ERR_FORMAT, "n_kv_heads (3) does not divide n_heads (8)");
    int32_t zero_hdr[7] = {0, 172, 5, 8, 4, 512, 512};
    copy_prefix(bin, p, 0, zero_hdr, sizeof zero_hdr);
    expect_load_fail(p, KVS_ERR_FORMAT, "header field dim (0) is invalid");
    static const char ak42[32] = "ak42\x01";
    copy_prefix(bin, p, 0, ak42, sizeof ak42);
    expect_load_fail(p, KVS_ERR_UNSUPPORTED, "ak42");
    rm_dir(dir);
}

static void test_bad_hf_checkpoints_fail_clearly(void **state) {
    (void)state;
    NEED_MODELS();
    char bin[4096], dir[] = "/tmp/kvs_model_XXXXXX", p[4200], cfg[1024];
    path_of(bin, sizeof bin, "../shared/models/stories260K.bin");
    assert_non_null(mkdtemp(dir));
    expect_load_fail(dir, KVS_ERR_IO, "config.json");
    free(convert_stories_to_hf(bin, dir, 0, NULL, NULL));
    snprintf(p, sizeof p, "%s/config.json", dir);
    snprintf(cfg, sizeof cfg, STORIES_HF_CONFIG, 3);
    write_text(p, cfg);
    expect_load_fail(dir, KVS_ERR_FORMAT, "config.json: num_key_value_heads (3) does not divide num_attention_heads (8)");
    write_text(p, "{\"architectures\":[\"GPT2LMHeadModel\"]}");
    expect_load_fail(dir, KVS_ERR_UNSUPPORTED, "architectures[0] \"GPT2LMHeadModel\" is not supported");
    write_text(p, "{\"architectures\":[\"LlamaForCausalLM\"], \"hidden_size\": 64,");
    expect_load_fail(dir, KVS_ERR_FORMAT, "config.json: json: unexpected end of input");
    snprintf(cfg, sizeof cfg, STORIES_HF_CONFIG, 4);
    cfg[strlen(cfg) - 1] = '\0';
    strcat(cfg, ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}");
    write_text(p, cfg);
    expect_load_fail(dir, KVS_ERR_UNSUPPORTED, "rope_scaling type \"yarn\" is not supported");
    snprintf(cfg, sizeof cfg, STORIES_HF_CONFIG, 4);
    write_text(p, cfg);
    kvs_model *m;
    assert_int_equal(kvs_model_load(dir, &m), KVS_OK); /* the folder is fine again */
    kvs_model_free(m);

    /* missing tensor: only the first 12 tensors written */
    free(convert_stories_to_hf(bin, dir, 13, NULL, NULL));
    expect_load_fail(dir, KVS_ERR_FORMAT, "tensor model.layers.1.self_attn.q_proj.weight is missing");

    /* wrong shape, bad dtype, offsets past the end */
    float small[64 * 4] = {0};
    st_tensor_src t1[] = {{"model.embed_tokens.weight", NULL, 2, {512, 32}, NULL}};
    float *zeros = calloc(512 * 64, sizeof(float));
    assert_non_null(zeros);
    t1[0].data = zeros;
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_safetensors(p, t1, 1, NULL, 0);
    expect_load_fail(dir, KVS_ERR_FORMAT, "tensor model.embed_tokens.weight has shape [512, 32], expected [512, 64]");
    st_tensor_src t2[] = {{"model.embed_tokens.weight", "I8", 2, {512, 64}, zeros}};
    write_safetensors(p, t2, 1, NULL, 0);
    expect_load_fail(dir, KVS_ERR_UNSUPPORTED, "tensor model.embed_tokens.weight has dtype I8");
    st_tensor_src t3[] = {{"model.norm.weight", NULL, 1, {64, 0}, small},
                          {"model.embed_tokens.weight", NULL, 2, {512, 64}, zeros}};
    write_safetensors(p, t3, 2, NULL, 16); /* last tensor claims 16 bytes more than it has */
    expect_load_fail(dir, KVS_ERR_FORMAT, "tensor model.embed_tokens.weight: data_offsets span 131088 bytes");
    /* header length past the end of the file */
    uint8_t hdr[16];
    kvs_put_u64(hdr, 1000);
    memcpy(hdr + 8, "{\"a\":1}", 8);
    copy_prefix(p, p, 0, hdr, sizeof hdr);
    expect_load_fail(dir, KVS_ERR_TRUNCATED, "safetensors header length 1000 runs past the end");
    /* truncated data section */
    write_safetensors(p, t3, 2, NULL, 0);
    struct stat stt;
    assert_int_equal(stat(p, &stt), 0);
    assert_int_equal(truncate(p, stt.st_size - 100), 0);
    expect_load_fail(dir, KVS_ERR_TRUNCATED, "lies past the end of the data");
    free(zeros);
    rm_dir(dir);
}

/* ---- fuzz: corrupt checkpoints never crash the loaders ---- */

static uint64_t fuzz_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void write_bytes(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Loads `path`; a failure must carry a detail, a success must decode one token (the loader accepted a
 * consistent file, so the forward pass must run on it without touching memory out of bounds). */
static void load_expect_clean(const char *path) {
    kvs_model *m = NULL;
    kvs_clear_error();
    kvs_status s = kvs_model_load(path, &m);
    if (s != KVS_OK) {
        assert_null(m);
        assert_true(kvs_last_error()[0] != '\0');
        return;
    }
    const kvs_model_info *info = kvs_model_info_get(m);
    kvs_model_state *st = NULL;
    int ctx = info->config.max_seq_len < 4 ? info->config.max_seq_len : 4;
    if (kvs_model_state_create(m, ctx, NULL, &st) == KVS_OK) {
        const float *logits;
        kvs_status fs = kvs_model_forward(st, 0, 0, &logits);
        assert_true(fs == KVS_OK || fs == KVS_ERR_RANGE);
    }
    kvs_model_state_free(st);
    kvs_model_free(m);
}

/* Random byte changes in the header region and random truncations of both checkpoint formats (and of
 * config.json): every load either succeeds on a consistent file or fails with a detail; run under
 * `make asan` this is the loaders' memory-safety fuzz. */
static void test_fuzz_corrupt_checkpoints_never_crash(void **state) {
    (void)state;
    NEED_MODELS();
    char src[4096], dir[] = "/tmp/kvs_model_fuzz_XXXXXX", p[4200], cfg_path[4200];
    assert_non_null(mkdtemp(dir));
    uint64_t rng = 0x9E3779B97F4A7C15ull;

    /* llama2.c: the 28-byte header, and cut points anywhere */
    path_of(src, sizeof src, "../shared/models/stories260K.bin");
    uint8_t *bin;
    size_t bin_len;
    assert_int_equal(kvs_read_file(src, (char **)&bin, &bin_len), KVS_OK);
    uint8_t *work = malloc(bin_len);
    assert_non_null(work);
    snprintf(p, sizeof p, "%s/f.bin", dir);
    static const int32_t edge[] = {0, 1, -1, 2, 3, 7, 512, 65536, 0x7fffffff, (int32_t)0x80000000};
    for (int it = 0; it < 150; it++) {
        memcpy(work, bin, bin_len);
        size_t n = bin_len;
        uint64_t r = fuzz_next(&rng);
        if (r % 3 == 0) {
            work[fuzz_next(&rng) % 28] = (uint8_t)fuzz_next(&rng);
        } else if (r % 3 == 1) {
            int32_t v = edge[fuzz_next(&rng) % (sizeof edge / sizeof edge[0])];
            memcpy(work + 4 * (fuzz_next(&rng) % 7), &v, 4);
        } else {
            n = (size_t)(fuzz_next(&rng) % bin_len);
        }
        write_bytes(p, work, n);
        load_expect_clean(p);
    }
    free(work);
    free(bin);

    /* Hugging Face: safetensors header bytes, truncations, and config.json bytes */
    char st_src[4200], cfg_src[4200];
    path_of(st_src, sizeof st_src, "../shared/models/tinystories-656K/model.safetensors");
    path_of(cfg_src, sizeof cfg_src, "../shared/models/tinystories-656K/config.json");
    uint8_t *st, *cfg;
    size_t st_len, cfg_len;
    assert_int_equal(kvs_read_file(st_src, (char **)&st, &st_len), KVS_OK);
    assert_int_equal(kvs_read_file(cfg_src, (char **)&cfg, &cfg_len), KVS_OK);
    uint64_t hdr_len = 0;
    memcpy(&hdr_len, st, 8); /* little-endian host (x86_64, aarch64) */
    assert_true(hdr_len > 0 && hdr_len + 8 < st_len);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    work = malloc(st_len);
    uint8_t *cwork = malloc(cfg_len);
    assert_true(work && cwork);
    for (int it = 0; it < 150; it++) {
        memcpy(work, st, st_len);
        memcpy(cwork, cfg, cfg_len);
        size_t n = st_len, cn = cfg_len;
        uint64_t r = fuzz_next(&rng) % 4;
        if (r == 0) {
            for (int k = 0; k < 1 + (int)(fuzz_next(&rng) % 3); k++)
                work[fuzz_next(&rng) % (8 + hdr_len)] = (uint8_t)fuzz_next(&rng);
        } else if (r == 1) {
            n = (size_t)(fuzz_next(&rng) % st_len);
        } else if (r == 2) {
            cwork[fuzz_next(&rng) % cfg_len] = (uint8_t)fuzz_next(&rng);
        } else {
            cn = (size_t)(fuzz_next(&rng) % cfg_len);
        }
        write_bytes(p, work, n);
        write_bytes(cfg_path, cwork, cn);
        load_expect_clean(dir);
    }
    free(work);
    free(cwork);
    free(st);
    free(cfg);
    rm_dir(dir);
}

static void test_forward_rejects_bad_token_and_position(void **state) {
    (void)state;
    char p[4096];
    path_of(p, sizeof p, "tests/fixtures/qwen2_tiny");
    kvs_model *m;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    kvs_model_state *st;
    assert_int_equal(kvs_model_state_create(m, 0, NULL, &st), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_model_state_create(m, 65, NULL, &st), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_model_state_create(m, 4, NULL, &st), KVS_OK);
    const float *lg;
    assert_int_equal(kvs_model_forward(st, 64, 0, &lg), KVS_ERR_RANGE);
    assert_non_null(strstr(kvs_last_error(), "token id 64 is outside the vocabulary [0, 64)"));
    assert_int_equal(kvs_model_forward(st, -1, 0, &lg), KVS_ERR_RANGE);
    assert_int_equal(kvs_model_forward(st, 1, 4, &lg), KVS_ERR_RANGE);
    assert_int_equal(kvs_model_forward(st, 1, 1, &lg), KVS_ERR_STATE); /* skipping position 0 */
    kvs_layer_record rec;
    assert_int_equal(kvs_model_state_layer(st, 0, &rec), KVS_ERR_STATE);
    assert_int_equal(kvs_model_forward(st, 1, 0, &lg), KVS_OK);
    assert_int_equal(kvs_model_state_layer(st, 2, &rec), KVS_ERR_RANGE);
    kvs_model_state_free(st);
    kvs_model_free(m);
}

static void test_sampler_deterministic_and_valid(void **state) {
    (void)state;
    float logits[16];
    for (int i = 0; i < 16; i++) logits[i] = (float)(i % 5);
    kvs_sampler *g, *a, *b, *c, *n;
    assert_int_equal(kvs_sampler_create(16, 0, 1, 1, &g), KVS_OK);
    assert_int_equal(kvs_sampler_sample(g, logits), 4); /* argmax, lowest id among the ties 4, 9, 14 */
    assert_int_equal(kvs_sampler_create(16, 1.0f, 1, 7, &a), KVS_OK);
    assert_int_equal(kvs_sampler_create(16, 1.0f, 1, 7, &b), KVS_OK);
    assert_int_equal(kvs_sampler_create(16, 1.0f, 1, 8, &c), KVS_OK);
    assert_int_equal(kvs_sampler_create(16, 1.0f, 0.3f, 9, &n), KVS_OK);
    int diff = 0, hist[16] = {0};
    for (int i = 0; i < 2000; i++) {
        int32_t x = kvs_sampler_sample(a, logits), y = kvs_sampler_sample(b, logits), z = kvs_sampler_sample(c, logits);
        assert_int_equal(x, y);
        diff += x != z;
        assert_true(x >= 0 && x < 16);
        hist[x]++;
        int32_t t = kvs_sampler_sample(n, logits); /* nucleus 0.3: only the three logit-4 tokens */
        assert_true(t == 4 || t == 9 || t == 14);
    }
    assert_true(diff > 0);
    /* temperature 1: P(logit 4) / P(logit 0) = e^4 ~ 54.6; the logit-0 tokens are rare but possible */
    assert_true(hist[4] + hist[9] + hist[14] > hist[0] + hist[5] + hist[10] + hist[15]);
    kvs_sampler *bad;
    assert_int_equal(kvs_sampler_create(16, -1, 1, 0, &bad), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sampler_create(16, 1, 0, 0, &bad), KVS_ERR_INVALID_ARG);
    assert_int_equal(kvs_sampler_create(16, 1, 1.5f, 0, &bad), KVS_ERR_INVALID_ARG);
    kvs_sampler_free(g);
    kvs_sampler_free(a);
    kvs_sampler_free(b);
    kvs_sampler_free(c);
    kvs_sampler_free(n);
    kvs_sampler_free(NULL);
}

typedef struct {
    int hits[8];
} pool_ctx;

static void mark(void *ctx, int worker, int n_workers) {
    pool_ctx *c = ctx;
    assert_true(n_workers >= 1 && worker < n_workers);
    c->hits[worker]++;
}

static void test_threadpool_runs_every_worker_once(void **state) {
    (void)state;
    kvs_threadpool *p;
    assert_int_equal(kvs_threadpool_create(4, &p), KVS_OK);
    assert_int_equal(kvs_threadpool_size(p), 4);
    pool_ctx c = {{0}};
    for (int i = 0; i < 1000; i++) kvs_threadpool_run(p, mark, &c);
    for (int w = 0; w < 4; w++) assert_int_equal(c.hits[w], 1000);
    kvs_threadpool_free(p);
    kvs_threadpool_free(NULL);
    pool_ctx d = {{0}};
    kvs_threadpool_run(NULL, mark, &d);
    assert_int_equal(d.hits[0], 1);
    assert_int_equal(kvs_threadpool_create(2000, &p), KVS_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories260K_matches_torch_reference),
        cmocka_unit_test(test_tinystories656K_matches_torch_reference),
        cmocka_unit_test(test_qwen2_bias_bf16_fixture_matches_reference),
        cmocka_unit_test(test_llama3_rope_scaling_sharded_fp16_matches_reference),
        cmocka_unit_test(test_mistral_wide_heads_fp32_fixture_matches_reference),
        cmocka_unit_test(test_qwen3_qk_norm_fixture_matches_reference),
        cmocka_unit_test(test_gemma3_sliding_fixture_matches_reference),
        cmocka_unit_test(test_llama2c_and_converted_hf_agree),
        cmocka_unit_test(test_weight_dtype_is_the_matrices_common_dtype),
        cmocka_unit_test(test_bad_llama2c_checkpoints_fail_clearly),
        cmocka_unit_test(test_bad_hf_checkpoints_fail_clearly),
        cmocka_unit_test(test_fuzz_corrupt_checkpoints_never_crash),
        cmocka_unit_test(test_forward_rejects_bad_token_and_position),
        cmocka_unit_test(test_sampler_deterministic_and_valid),
        cmocka_unit_test(test_threadpool_runs_every_worker_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
