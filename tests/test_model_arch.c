/* test_model_arch.c — what the Qwen3 / Gemma-3 loader (gpu_capture/model.c, parse_qwen3_gemma3) accepts and
 * refuses: configs edited from the tiny fixtures (tests/fixtures/qwen3_tiny, gemma3_tiny; their weights linked):
 * the Gemma-3 layer pattern without layer_types, a nested text_config, and clear KVS_ERR_UNSUPPORTED / FORMAT
 * errors for what the CPU forward pass does not implement (attention logit soft-capping, another activation, an
 * unknown layer type, Qwen3's sliding window), and the closed-loop attention hook refused past a window.
 * The numerical agreement with the PyTorch reference is tests/test_model.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/kvs.h"
#include "gpu_capture/model.h"
#include "tests/util/testenv.h"

/* A folder in c->dir named `name` holding `config` and a link to the fixture's weights. */
static void make_variant(const kvs_test_tmp *c, const char *fixture, const char *name, const char *config,
                         char *dir, size_t cap) {
    snprintf(dir, cap, "%s/%s", c->dir, name);
    char p[4096], w[4096];
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(p, sizeof p, "%s/config.json", dir);
    assert_int_equal(kvs_test_spit_text(p, config), 0);
    snprintf(w, sizeof w, "%s/tests/fixtures/%s/model.safetensors", kvs_test_root(), fixture);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(symlink(w, p), 0);
}

/* The gemma3_tiny config with `extra` JSON members added (keys the base does not have), layer_types left out when
 * drop_layer_types, and `rope` as its rope_scaling (NULL: the fixture's linear factor 4). */
static void gemma_config_rope(char *out, size_t cap, const char *extra, int drop_layer_types, const char *rope) {
    snprintf(out, cap,
             "{%s\"architectures\":[\"Gemma3ForCausalLM\"],\"model_type\":\"gemma3_text\",\"hidden_size\":48,"
             "\"intermediate_size\":96,\"num_hidden_layers\":4,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
             "\"head_dim\":16,\"vocab_size\":64,\"max_position_embeddings\":256,\"rope_theta\":1000000.0,"
             "\"rope_local_base_freq\":10000.0,\"rope_scaling\":%s,"
             "\"rms_norm_eps\":1e-6,\"sliding_window\":6,\"sliding_window_pattern\":3,%s"
             "\"query_pre_attn_scalar\":24,\"final_logit_softcapping\":5.0,\"tie_word_embeddings\":true,"
             "\"bos_token_id\":2,\"eos_token_id\":[1,63],\"torch_dtype\":\"bfloat16\"}",
             extra, rope ? rope : "{\"rope_type\":\"linear\",\"factor\":4.0}", drop_layer_types ? "" :
             "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"sliding_attention\"],");
}

static void gemma_config(char *out, size_t cap, const char *extra, int drop_layer_types) {
    gemma_config_rope(out, cap, extra, drop_layer_types, NULL);
}

static void expect_refused(const kvs_test_tmp *c, const char *fixture, const char *name, const char *config,
                           kvs_status want, const char *msg) {
    char dir[512];
    make_variant(c, fixture, name, config, dir, sizeof dir);
    kvs_model *m = NULL;
    kvs_status s = kvs_model_load(dir, &m);
    if (s != want || !strstr(kvs_last_error(), msg)) {
        fprintf(stderr, "%s: status %d (want %d), message: %s (want: %s)\n", name, (int)s, (int)want, kvs_last_error(),
                msg);
        fail();
    }
    assert_null(m);
}

static void test_gemma3_pattern_and_nesting(void **state) {
    kvs_test_tmp *c = *state;
    char cfg[4096], dir[512];
    /* without layer_types: every sliding_window_pattern-th layer (3rd) is full: windows 6,6,0,6 */
    gemma_config(cfg, sizeof cfg, "", 1);
    make_variant(c, "gemma3_tiny", "pattern", cfg, dir, sizeof dir);
    kvs_model *m = NULL;
    assert_int_equal(kvs_model_load(dir, &m), KVS_OK);
    static const int32_t want[4] = {6, 6, 0, 6};
    for (int l = 0; l < 4; l++) assert_int_equal(kvs_model_config_window(&kvs_model_info_get(m)->config, l), want[l]);
    kvs_model_free(m);
    /* the text model's config nested as text_config of a multimodal config: read from there */
    char inner[4096], outer[8192];
    gemma_config(inner, sizeof inner, "", 0);
    snprintf(outer, sizeof outer, "{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"model_type\":\"gemma3\","
                                  "\"text_config\":%s}", inner);
    make_variant(c, "gemma3_tiny", "nested", outer, dir, sizeof dir);
    assert_int_equal(kvs_model_load(dir, &m), KVS_OK);
    const kvs_model_info *info = kvs_model_info_get(m);
    assert_string_equal(info->architecture, "Gemma3ForConditionalGeneration");
    assert_int_equal(kvs_model_config_window(&info->config, 1), 0);
    assert_int_equal(kvs_model_config_window(&info->config, 3), 6);
    assert_true(info->final_softcap == 5.0f);
    kvs_model_free(m);
}

static kvs_status dummy_attn(void *user, int layer, int pos, const float *q, const float *kc, const float *vc,
                             size_t stride, float *o, float *lse) {
    (void)user, (void)layer, (void)pos, (void)q, (void)kc, (void)vc, (void)stride;
    memset(o, 0, 4 * 16 * sizeof *o);
    for (int h = 0; h < 4; h++) lse[h] = 0;
    return KVS_OK;
}

static void test_attention_hook_refused_past_the_window(void **state) {
    (void)state;
    char p[4096];
    snprintf(p, sizeof p, "%s/tests/fixtures/gemma3_tiny", kvs_test_root());
    kvs_model *m = NULL;
    assert_int_equal(kvs_model_load(p, &m), KVS_OK);
    kvs_model_state *st = NULL;
    assert_int_equal(kvs_model_state_create(m, 10, NULL, &st), KVS_OK);
    kvs_model_state_set_attn(st, dummy_attn, NULL);
    const float *logits;
    for (int pos = 0; pos < 6; pos++) assert_int_equal(kvs_model_forward(st, 5, pos, &logits), KVS_OK);
    assert_int_equal(kvs_model_forward(st, 5, 6, &logits), KVS_ERR_UNSUPPORTED);
    assert_non_null(strstr(kvs_last_error(), "6-position sliding window"));
    kvs_model_state_free(st);
    kvs_model_free(m);
}

static void test_refusals(void **state) {
    kvs_test_tmp *c = *state;
    char cfg[4096];
    gemma_config(cfg, sizeof cfg, "\"attn_logit_softcapping\":50.0,", 0);
    expect_refused(c, "gemma3_tiny", "softcap", cfg, KVS_ERR_UNSUPPORTED, "attn_logit_softcapping is not supported");
    gemma_config(cfg, sizeof cfg, "\"hidden_activation\":\"gelu\",", 0);
    expect_refused(c, "gemma3_tiny", "act", cfg, KVS_ERR_UNSUPPORTED, "hidden activation \"gelu\" is not supported");
    gemma_config(cfg, sizeof cfg, "\"layer_types\":[\"sliding_attention\",\"chunked_attention\",\"full_attention\","
                                  "\"full_attention\"],", 1);
    expect_refused(c, "gemma3_tiny", "types", cfg, KVS_ERR_UNSUPPORTED, "layer_types[1] is \"chunked_attention\"");
    gemma_config(cfg, sizeof cfg, "\"layer_types\":[\"full_attention\"],", 1);
    expect_refused(c, "gemma3_tiny", "types_len", cfg, KVS_ERR_FORMAT, "layer_types is not an array of");
    gemma_config_rope(cfg, sizeof cfg, "", 0, "{\"rope_type\":\"yarn\",\"factor\":4.0}");
    expect_refused(c, "gemma3_tiny", "yarn", cfg, KVS_ERR_UNSUPPORTED, "rope_scaling type \"yarn\" is not supported");
    expect_refused(c, "qwen3_tiny", "qwen3_sw",
                   "{\"architectures\":[\"Qwen3ForCausalLM\"],\"use_sliding_window\":true,\"hidden_size\":32,"
                   "\"intermediate_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                   "\"num_key_value_heads\":2,\"head_dim\":16,\"vocab_size\":64,\"max_position_embeddings\":128,"
                   "\"tie_word_embeddings\":true}",
                   KVS_ERR_UNSUPPORTED, "use_sliding_window true is not supported for Qwen3");
    /* a Qwen3 checkpoint without its q/k norms names the missing tensor */
    expect_refused(c, "qwen2_tiny", "qwen3_no_norms",
                   "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":32,\"intermediate_size\":64,"
                   "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":64,"
                   "\"max_position_embeddings\":64}",
                   KVS_ERR_FORMAT, "self_attn.q_norm.weight is missing");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gemma3_pattern_and_nesting, kvs_test_tmp_setup, kvs_test_tmp_teardown),
        cmocka_unit_test(test_attention_hook_refused_past_the_window),
        cmocka_unit_test_setup_teardown(test_refusals, kvs_test_tmp_setup, kvs_test_tmp_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
