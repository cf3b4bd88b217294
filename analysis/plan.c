/* plan.c — capacity planning (see plan.h): presets with their published shapes, config.json shapes, weight
 * counts, policy footprints, the auxiliary-state rule of every policy, the measured storage profile of a replay
 * run fitted on its steady state, and the capacity of a plan.
 * Follows ../shared/DESIGN.md "Analysis" and POLICY_SPEC §7 G3 (KV sizes), §5 M22, R2, D1, D10.
 */
#include "plan.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "../common/json.h"

/* ------------------------------------------------------------------------------------------------
 * Presets: the published shapes, each from the model's config.json on the Hugging Face hub (the repository
 * named in `source`). head_dim = hidden_size / num_attention_heads for all of them (128, except OPT-30B's
 * 7168 / 56 = 128 too).
 * ---------------------------------------------------------------------------------------------- */

static const kvs_plan_model presets[] = {
    /* meta-llama/Llama-3.1-8B: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab 128256,
     * max_position_embeddings 131072, tie_word_embeddings false */
    {"Llama-3.1-8B", "config.json of meta-llama/Llama-3.1-8B", KVS_PLAN_ARCH_GATED, 32, 32, 8, 128, 4096, 14336,
     128256, 131072, 0, 0, 0, 0, 0},
    /* meta-llama/Llama-3.1-70B: hidden 8192, intermediate 28672, 80 layers, 64 heads, 8 KV heads, vocab 128256 */
    {"Llama-3.1-70B", "config.json of meta-llama/Llama-3.1-70B", KVS_PLAN_ARCH_GATED, 80, 64, 8, 128, 8192, 28672,
     128256, 131072, 0, 0, 0, 0, 0},
    /* meta-llama/Llama-3.1-405B: hidden 16384, intermediate 53248, 126 layers, 128 heads, 8 KV heads */
    {"Llama-3.1-405B", "config.json of meta-llama/Llama-3.1-405B", KVS_PLAN_ARCH_GATED, 126, 128, 8, 128, 16384,
     53248, 128256, 131072, 0, 0, 0, 0, 0},
    /* meta-llama/Meta-Llama-3-8B (D2O's throughput model, §5.5): Llama-3.1-8B's shape with an 8192 context */
    {"Llama-3-8B", "config.json of meta-llama/Meta-Llama-3-8B", KVS_PLAN_ARCH_GATED, 32, 32, 8, 128, 4096, 14336,
     128256, 8192, 0, 0, 0, 0, 0},
    /* meta-llama/Llama-2-7b-hf: hidden 4096, intermediate 11008, 32 layers, 32 heads = 32 KV heads (MHA), vocab
     * 32000, max_position_embeddings 4096 */
    {"Llama-2-7B", "config.json of meta-llama/Llama-2-7b-hf", KVS_PLAN_ARCH_GATED, 32, 32, 32, 128, 4096, 11008,
     32000, 4096, 0, 0, 0, 0, 0},
    /* mistralai/Mistral-7B-Instruct-v0.2: hidden 4096, intermediate 14336, 32 layers, 32 heads, 8 KV heads, vocab
     * 32000, max_position_embeddings 32768 (v0.2 dropped the sliding window) */
    {"Mistral-7B-v0.2", "config.json of mistralai/Mistral-7B-Instruct-v0.2", KVS_PLAN_ARCH_GATED, 32, 32, 8, 128,
     4096, 14336, 32000, 32768, 0, 0, 0, 0, 0},
    /* Qwen/Qwen2.5-7B: hidden 3584, intermediate 18944, 28 layers, 28 heads, 4 KV heads, vocab 152064,
     * max_position_embeddings 131072, tie_word_embeddings false; q/k/v biases (Qwen2) */
    {"Qwen2.5-7B", "config.json of Qwen/Qwen2.5-7B", KVS_PLAN_ARCH_GATED, 28, 28, 4, 128, 3584, 18944, 152064,
     131072, 0, 1, 0, 0, 0},
    /* Qwen/Qwen2.5-14B: hidden 5120, intermediate 13824, 48 layers, 40 heads, 8 KV heads, vocab 152064 */
    {"Qwen2.5-14B", "config.json of Qwen/Qwen2.5-14B", KVS_PLAN_ARCH_GATED, 48, 40, 8, 128, 5120, 13824, 152064,
     131072, 0, 1, 0, 0, 0},
    /* microsoft/phi-4 (Phi3ForCausalLM: fused qkv and gate_up projections, no biases): hidden 5120, intermediate
     * 17920, 40 layers, 40 heads, 10 KV heads, vocab 100352, max_position_embeddings 16384 */
    {"Phi-4", "config.json of microsoft/phi-4", KVS_PLAN_ARCH_GATED, 40, 40, 10, 128, 5120, 17920, 100352, 16384, 0,
     0, 0, 0, 0},
    /* facebook/opt-30b: hidden_size 7168, ffn_dim 28672, 48 layers, 56 heads (MHA), vocab 50272,
     * max_position_embeddings 2048, lm_head tied to the token embedding */
    {"OPT-30B", "config.json of facebook/opt-30b", KVS_PLAN_ARCH_OPT, 48, 56, 56, 128, 7168, 28672, 50272, 2048, 1,
     0, 0, 0, 0},
};

int kvs_plan_preset_count(void) { return (int)(sizeof presets / sizeof presets[0]); }

const kvs_plan_model *kvs_plan_preset_at(int i) {
    return i >= 0 && i < kvs_plan_preset_count() ? &presets[i] : NULL;
}

kvs_status kvs_plan_preset_find(const char *name, const kvs_plan_model **out) {
    if (!name || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "plan: NULL preset name");
    for (int i = 0; i < kvs_plan_preset_count(); i++)
        if (!strcasecmp(presets[i].name, name)) {
            *out = &presets[i];
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "unknown preset '%s' (kvsim plan --list-presets lists them)", name);
}

/* ------------------------------------------------------------------------------------------------
 * config.json
 * ---------------------------------------------------------------------------------------------- */

/* An integer field in [lo, hi]; `dflt` when absent (or null) and dflt >= 0, else missing is an error. */
static kvs_status cfg_int(const kvs_json *cfg, const char *path, const char *key, long dflt, long lo, long hi,
                          int32_t *out) {
    const kvs_json *v = kvs_json_get(cfg, key);
    if (!v || kvs_json_type_of(v) == KVS_JSON_NULL) {
        if (dflt < 0) return kvs_fail(KVS_ERR_FORMAT, "%s: %s is missing", path, key);
        *out = (int32_t)dflt;
        return KVS_OK;
    }
    double d = kvs_json_number(v);
    if (kvs_json_type_of(v) != KVS_JSON_NUMBER || d != floor(d))
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s is not an integer", path, key);
    if (d < (double)lo || d > (double)hi)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s (%.0f) is out of range [%ld, %ld]", path, key, d, lo, hi);
    *out = (int32_t)d;
    return KVS_OK;
}

/* The sliding-window layers a config.json announces: layer_types ("sliding_attention" / "full_attention") with
 * sliding_window; else Gemma-3 (model_type gemma3 / gemma3_text) every layer but each sliding_window_pattern-th
 * (default 6); else Mistral's sliding_window on every layer. */
static kvs_status config_windows(const kvs_json *cfg, const char *file, const char *mt, kvs_plan_model *m) {
    const kvs_json *sw = kvs_json_get(cfg, "sliding_window");
    if (!sw || kvs_json_type_of(sw) == KVS_JSON_NULL) return KVS_OK;
    int32_t w, pattern;
    kvs_status st = cfg_int(cfg, file, "sliding_window", -1, 0, INT32_MAX, &w);
    if (st != KVS_OK || w == 0) return st;
    const kvs_json *types = kvs_json_get(cfg, "layer_types");
    const int gemma = mt && (!strcmp(mt, "gemma3") || !strcmp(mt, "gemma3_text"));
    if (kvs_json_type_of(types) == KVS_JSON_ARRAY) {
        if (kvs_json_len(types) != (size_t)m->n_layers)
            return kvs_fail(KVS_ERR_FORMAT, "%s: layer_types has %zu entries for %d layers", file, kvs_json_len(types),
                            m->n_layers);
        for (size_t l = 0; l < kvs_json_len(types); l++) {
            const char *t = kvs_json_string(kvs_json_at(types, l));
            m->window_layers += t && !strcmp(t, "sliding_attention");
        }
    } else if (gemma) {
        if ((st = cfg_int(cfg, file, "sliding_window_pattern", 6, 1, KVS_TRACE_MAX_LAYERS, &pattern)) != KVS_OK)
            return st;
        m->window_layers = m->n_layers - m->n_layers / pattern;
    } else if (mt && !strcmp(mt, "mistral")) {
        m->window_layers = m->n_layers;
    }
    m->window = m->window_layers > 0 ? w : 0;
    return KVS_OK;
}

kvs_status kvs_plan_window_parse(const char *spec, kvs_plan_model *m) {
    char *end = NULL;
    errno = 0;
    long w = spec ? strtol(spec, &end, 10) : -1, k = 0;
    if (spec && end != spec && *end == '/') {
        const char *ks = end + 1;
        k = strtol(ks, &end, 10);
        if (end == ks) k = -1;
    }
    if (!spec || end == spec || *end || errno || w < 0 || w > INT32_MAX || k < 0 || k > KVS_TRACE_MAX_LAYERS ||
        (w > 0 && spec[strcspn(spec, "/")] == '/' && k < 1))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--window: '%s' is not W (every layer attends to the last W positions), "
                        "W/K (every K-th layer full, the others W; Gemma-3: 1024/6) or 0 (no window)",
                        spec ? spec : "");
    m->window = (int32_t)w;
    m->window_layers = w == 0 ? 0 : k > 0 ? m->n_layers - m->n_layers / (int32_t)k : m->n_layers;
    if (m->window_layers == 0) m->window = 0;
    return KVS_OK;
}

kvs_status kvs_plan_model_from_config(const char *path, kvs_plan_model *out) {
    if (!path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "plan: NULL config path");
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    char *text = NULL;
    size_t len = 0;
    kvs_status st = kvs_read_file(file, &text, &len);
    if (st != KVS_OK) return st;
    kvs_json *cfg = NULL;
    st = kvs_json_parse(text, len, &cfg);
    free(text);
    if (st != KVS_OK) return kvs_fail(st, "%s: %s", file, kvs_last_error());
    kvs_plan_model m = {0};
    if (kvs_json_type_of(cfg) != KVS_JSON_OBJECT) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: not a JSON object", file);
        goto cleanup;
    }
    const char *mt = kvs_json_string(kvs_json_get(cfg, "model_type"));
    int is_opt = mt && !strcmp(mt, "opt");
    m.arch = is_opt ? KVS_PLAN_ARCH_OPT : KVS_PLAN_ARCH_GATED;
    const long big = 1L << 24;
    KVS_TRY(st = cfg_int(cfg, file, "num_hidden_layers", -1, 1, KVS_TRACE_MAX_LAYERS, &m.n_layers));
    KVS_TRY(st = cfg_int(cfg, file, "num_attention_heads", -1, 1, KVS_TRACE_MAX_HEADS, &m.n_heads));
    KVS_TRY(st = cfg_int(cfg, file, "num_key_value_heads", m.n_heads, 1, KVS_TRACE_MAX_HEADS, &m.n_kv_heads));
    KVS_TRY(st = cfg_int(cfg, file, "hidden_size", -1, 1, big, &m.hidden));
    KVS_TRY(st = cfg_int(cfg, file, is_opt ? "ffn_dim" : "intermediate_size", -1, 1, big, &m.intermediate));
    KVS_TRY(st = cfg_int(cfg, file, "vocab_size", -1, 1, big, &m.vocab));
    KVS_TRY(st = cfg_int(cfg, file, "max_position_embeddings", 0, 0, INT32_MAX, &m.max_positions));
    if (m.n_heads % m.n_kv_heads != 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: num_key_value_heads (%d) does not divide num_attention_heads (%d)", file,
                      m.n_kv_heads, m.n_heads);
        goto cleanup;
    }
    const kvs_json *hd = kvs_json_get(cfg, "head_dim");
    if (hd && kvs_json_type_of(hd) != KVS_JSON_NULL) {
        KVS_TRY(st = cfg_int(cfg, file, "head_dim", -1, 1, KVS_TRACE_MAX_HEAD_DIM, &m.head_dim));
    } else if (m.hidden % m.n_heads != 0) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: num_attention_heads (%d) does not divide hidden_size (%d) and head_dim is "
                                      "not given", file, m.n_heads, m.hidden);
        goto cleanup;
    } else if (m.hidden / m.n_heads > KVS_TRACE_MAX_HEAD_DIM) { /* the bound an explicit head_dim has */
        st = kvs_fail(KVS_ERR_FORMAT, "%s: head_dim = hidden_size / num_attention_heads = %d is out of range [1, %d]",
                      file, m.hidden / m.n_heads, KVS_TRACE_MAX_HEAD_DIM);
        goto cleanup;
    } else {
        m.head_dim = m.hidden / m.n_heads;
    }
    const kvs_json *tie = kvs_json_get(cfg, "tie_word_embeddings");
    m.tied_embeddings = kvs_json_type_of(tie) == KVS_JSON_BOOL ? kvs_json_bool(tie) : is_opt;
    /* the capture's loader (gpu_capture/model.c) counts the same: Qwen2's q/k/v biases, Llama's attention_bias on
     * q/k/v and o */
    const kvs_json *ab = kvs_json_get(cfg, "attention_bias");
    const int attn_bias = kvs_json_type_of(ab) == KVS_JSON_BOOL && kvs_json_bool(ab);
    const int is_qwen2 = mt && !strcmp(mt, "qwen2");
    m.qkv_bias = is_qwen2 || attn_bias;
    m.o_bias = !is_qwen2 && attn_bias;
    KVS_TRY(st = config_windows(cfg, file, mt, &m));
    const char *base = kvs_path_base(path);
    snprintf(m.name, sizeof m.name, "%.*s", (int)sizeof m.name - 1, base[0] ? base : path);
    snprintf(m.source, sizeof m.source, "%.*s", (int)sizeof m.source - 1, file);
    *out = m;
cleanup:
    kvs_json_free(cfg);
    return st;
}

/* The value of `key` in capture settings "key=value key=value ..." into buf; 0 when absent. */
static int setting(const char *settings, const char *key, char *buf, size_t cap) {
    const size_t klen = strlen(key);
    for (const char *p = settings; p && *p;) {
        p += strspn(p, " ");
        size_t len = strcspn(p, " ");
        if (len > klen && !strncmp(p, key, klen) && p[klen] == '=') {
            snprintf(buf, cap, "%.*s", (int)(len - klen - 1), p + klen + 1);
            return 1;
        }
        p += len;
    }
    return 0;
}

void kvs_plan_model_from_trace(const kvs_model_config *c, const char *settings, const char *source,
                               kvs_plan_model *out) {
    kvs_plan_model m = {0};
    snprintf(m.name, sizeof m.name, "%s", c->model_name[0] ? c->model_name : "trace model");
    snprintf(m.source, sizeof m.source, "trace header of %s", source ? source : "?");
    m.arch = KVS_PLAN_ARCH_GATED;
    m.n_layers = c->n_layers;
    m.n_heads = c->n_heads;
    m.n_kv_heads = c->n_kv_heads;
    m.head_dim = c->head_dim;
    m.hidden = c->dim;
    m.intermediate = c->hidden_dim;
    m.vocab = c->vocab_size;
    m.max_positions = c->max_seq_len;
    /* What the weights hold beyond the shape, where the capture recorded it; the tie is otherwise not known (the
     * header has no field for it) and the caller says so. */
    char v[64];
    m.tied_embeddings = setting(settings, "tie_word_embeddings", v, sizeof v) ? !strcmp(v, "1") : -1;
    m.qkv_bias = setting(settings, "architecture", v, sizeof v) && !strcmp(v, "Qwen2ForCausalLM");
    if (setting(settings, "qkv_bias", v, sizeof v)) m.qkv_bias = !strcmp(v, "1");
    if (setting(settings, "o_bias", v, sizeof v)) m.o_bias = !strcmp(v, "1");
    /* sliding-window layers: one window in every known model (Gemma-3); should they differ, the largest (an upper
     * bound on the cache) */
    for (int l = 0; l < c->n_layers && l < KVS_TRACE_MAX_LAYERS; l++)
        if (c->layer_window[l] > 0) {
            m.window_layers++;
            if (c->layer_window[l] > m.window) m.window = c->layer_window[l];
        }
    *out = m;
}

/* ------------------------------------------------------------------------------------------------
 * Sizes
 * ---------------------------------------------------------------------------------------------- */

double kvs_plan_params(const kvs_plan_model *m) {
    const double h = m->hidden, q = (double)m->n_heads * m->head_dim, kv = (double)m->n_kv_heads * m->head_dim;
    const double f = m->intermediate, v = m->vocab;
    if (m->arch == KVS_PLAN_ARCH_OPT) {
        /* q,k,v,o (h x q each, biased), fc1 h x f + f, fc2 f x h + h, two LayerNorms (weight + bias); the learned
         * positions have max_positions + 2 rows (OPT's offset of 2); the final LayerNorm. */
        double layer = 4 * (h * q + q) + (h * f + f) + (f * h + h) + 4 * h;
        return m->n_layers * layer + v * h * (m->tied_embeddings == 1 ? 1 : 2) + ((double)m->max_positions + 2) * h +
               2 * h;
    }
    /* q (h x q), k and v (h x kv), o (q x h), gate/up/down (3 h x f), two RMSNorm weights; q/k/v biases (Qwen2,
     * attention_bias), o's bias (attention_bias). An unknown tie (-1) counts the classifier apart. */
    double layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h + (m->qkv_bias ? q + 2 * kv : 0) + (m->o_bias ? h : 0);
    return m->n_layers * layer + v * h * (m->tied_embeddings == 1 ? 1 : 2) + h;
}

double kvs_plan_kv_bytes_per_token(const kvs_plan_model *m, double elem_bytes) {
    return 2.0 * m->n_layers * m->n_kv_heads * m->head_dim * elem_bytes;
}

kvs_status kvs_plan_dtype_bytes(const char *name, double *bytes) {
    static const struct {
        const char *name;
        double bytes;
    } types[] = {{"fp32", 4}, {"fp16", 2}, {"bf16", 2}, {"fp8", 1}, {"int4", 0.5}};
    for (size_t i = 0; name && i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(name, types[i].name)) {
            *bytes = types[i].bytes;
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "unknown dtype '%s' (fp32, fp16, bf16, fp8, int4)", name ? name : "");
}

kvs_status kvs_plan_kv_dtype_bytes(const char *name, double *bytes) {
    if (name && !strcmp(name, "int4"))
        return kvs_fail(KVS_ERR_INVALID_ARG, "--kv-dtype int4 is not a plain element size: a 4-bit KV cache holds "
                                             "fp16 scales and zero points beside its codes; say which with --codec "
                                             "int:bits=4 (or kivi:bits=4, hf:bits=4; kvsim plan --help)");
    kvs_status st = kvs_plan_dtype_bytes(name, bytes);
    if (st != KVS_OK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "unknown dtype '%s' (fp32, fp16, bf16, fp8; a quantized cache: --codec)",
                        name ? name : "");
    return KVS_OK;
}

/* ---- codecs --------------------------------------------------------------------------------------------------- */

/* What planning needs of a codec, read from its canonical spec (every key filled in, codec.h "Specs"). */
typedef struct {
    kvs_codec_kind kind;
    const kvs_codec *codec; /* think: its kept channels */
    int bits;
    int64_t group, residual;
    int token_axis[2]; /* K, V: token-axis groups */
    int head_scales;   /* fp8 scale=prompt per=head */
} codec_shape;

static int param_value(const char *params, const char *key, char *buf, size_t cap);

static int64_t spec_int(const char *params, const char *key) {
    char v[32];
    return param_value(params, key, v, sizeof v) ? strtoll(v, NULL, 10) : 0;
}

static codec_shape shape_of(const kvs_codec *c) {
    codec_shape sh = {.kind = kvs_codec_kind_of(c), .codec = c};
    const char *spec = kvs_codec_spec(c), *colon = strchr(spec, ':');
    const char *params = colon ? colon + 1 : "";
    char v[32];
    sh.bits = (int)spec_int(params, "bits");
    sh.group = spec_int(params, "group");
    sh.residual = spec_int(params, "residual");
    switch (sh.kind) {
    case KVS_CODEC_INT:
        sh.token_axis[0] = param_value(params, "k_axis", v, sizeof v) && !strcmp(v, "token");
        sh.token_axis[1] = param_value(params, "v_axis", v, sizeof v) && !strcmp(v, "token");
        break;
    case KVS_CODEC_KIVI: sh.token_axis[0] = 1; break; /* keys per channel over tokens, values per token */
    case KVS_CODEC_HF: break;                         /* quanto's axis 0: channel-axis groups for both */
    case KVS_CODEC_FP8:
        sh.head_scales = param_value(params, "per", v, sizeof v) && !strcmp(v, "head");
        break;
    case KVS_CODEC_THINK: sh.residual = spec_int(params, "recent"); break; /* K rows below P - recent pruned */
    }
    return sh;
}

static double codec_row_bytes(const codec_shape *sh, int t, int64_t d) {
    const double D = (double)d;
    if (sh->kind == KVS_CODEC_FP8) return D;
    if (sh->kind == KVS_CODEC_THINK) return t == 0 ? 2.0 * (double)kvs_codec_kept_channels(sh->codec, d) : 2.0 * D;
    const double codes = D * sh->bits / 8.0;
    if (sh->token_axis[t]) return codes + 4.0 * D / (double)sh->group;
    return codes + 4.0 * (double)((d + sh->group - 1) / sh->group);
}

static int64_t codec_held(const codec_shape *sh, int t, int64_t P, int64_t n) {
    const int64_t R = sh->residual;
    switch (sh->kind) {
    case KVS_CODEC_INT: return sh->token_axis[t] ? n % sh->group : 0;
    case KVS_CODEC_KIVI:
        if (t == 0) return n > P ? n - R * ((n - 1) / R) : P % R;
        return n > P ? (n < R + 1 ? n : R + 1) : (P < R ? P : R);
    case KVS_CODEC_HF: return n > P ? n - P - R * ((n - 1 - P) / R) : 0;
    case KVS_CODEC_FP8: return 0;
    case KVS_CODEC_THINK: /* K: the last `recent` prompt rows and every decode row stay whole; V is never pruned */
        if (t == 1) return 0;
        return n - (P > R ? P - R : 0);
    }
    return 0;
}

static double codec_bytes(const codec_shape *sh, int64_t d, int64_t P, int64_t n, double m) {
    double total = 0;
    for (int t = 0; t < 2; t++) {
        double h = (double)codec_held(sh, t, P, n);
        if (h > m) h = m;
        total += h * 2.0 * (double)d + (m - h) * codec_row_bytes(sh, t, d);
    }
    return total;
}

double kvs_plan_codec_row_bytes(const kvs_codec *c, kvs_codec_tensor t, int64_t d) {
    codec_shape sh = shape_of(c);
    return codec_row_bytes(&sh, t == KVS_CODEC_V, d);
}

int64_t kvs_plan_codec_held(const kvs_codec *c, kvs_codec_tensor t, int64_t prompt, int64_t n) {
    codec_shape sh = shape_of(c);
    return codec_held(&sh, t == KVS_CODEC_V, prompt, n);
}

double kvs_plan_codec_bytes(const kvs_codec *c, int64_t d, int64_t prompt, int64_t n, double resident) {
    codec_shape sh = shape_of(c);
    return codec_bytes(&sh, d, prompt, n, resident);
}

double kvs_plan_codec_head_bytes(const kvs_codec *c, int64_t d) {
    const codec_shape sh = shape_of(c);
    if (sh.kind == KVS_CODEC_THINK) return (double)d; /* the kept-channel mask, one byte per channel */
    return sh.head_scales ? 8.0 : 0.0;
}

double kvs_plan_codec_bytes_per_token(const kvs_plan_model *m, const kvs_codec *c) {
    return (double)m->n_layers * m->n_kv_heads * kvs_codec_position_bytes(c, m->head_dim);
}

/* The last length in [a, b] just before a codec's 16-bit rows are quantized at once (the top of the residual's or
 * an int token-axis group's saw-tooth; K and V share it, or only K saws: kivi), into out[0]; 1, or 0 when none. */
static int codec_tops(const kvs_codec *c, int64_t P, int64_t a, int64_t b, int64_t *out) {
    const codec_shape sh = shape_of(c);
    int k = 0;
    int64_t top = -1;
    if (sh.kind == KVS_CODEC_INT && (sh.token_axis[0] || sh.token_axis[1])) top = sh.group * ((b + 1) / sh.group) - 1;
    else if (sh.kind == KVS_CODEC_KIVI) top = sh.residual * (b / sh.residual);
    else if (sh.kind == KVS_CODEC_HF && b > P) top = P + sh.residual * ((b - P) / sh.residual);
    if (top >= a && top <= b) out[k++] = top;
    return k;
}

const char *kvs_plan_kind_name(kvs_plan_kind k) {
    static const char *const names[] = {"full", "constant", "prompt-only", "offload", "measured"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

/* ------------------------------------------------------------------------------------------------
 * Auxiliary state: what each policy's account() keeps (policies/<name>.c, POLICY_SPEC §3), by the rule of plan.h
 * ---------------------------------------------------------------------------------------------- */

/* The value of `key` in a canonical parameter string "k=v,k=v" into buf; 0 when absent. */
static int param_value(const char *params, const char *key, char *buf, size_t cap) {
    const size_t klen = strlen(key);
    for (const char *p = params; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len > klen && !strncmp(p, key, klen) && p[klen] == '=') {
            snprintf(buf, cap, "%.*s", (int)(len - klen - 1), p + klen + 1);
            return 1;
        }
        p += len + (p[len] == ',');
    }
    return 0;
}

kvs_status kvs_plan_aux_rule_of(const char *policy, const char *params, kvs_plan_aux_rule *out) {
    /* Every registered policy (tests/test_plan.c checks the registry against this table). */
    static const struct {
        const char *name;
        kvs_plan_aux_copies copies;
        int head_dim_offset, kv_elements;
        const char *what;
    } rules[] = {
        /* no auxiliary state (aux_bytes never set): the rule is moot, the copies follow the layout */
        {"full", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"window", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"streaming", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"tova", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"topk", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"snapkv", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"pyramidkv", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"adakv", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"keydiff", KVS_PLAN_AUX_PER_LIST, -1, 0, "none (scores are transient)"},
        {"knorm", KVS_PLAN_AUX_PER_LIST, -1, 0, "none (scores are transient)"},
        /* one scalar per held slot of every list (slots summed over the lists: G x for gqa=expand) */
        {"h2o", KVS_PLAN_AUX_PER_LIST, -1, 0, "a score per held slot, per list"},
        {"scissorhands", KVS_PLAN_AUX_PER_LIST, -1, 0, "a counter and history flags per held slot, per list"},
        {"keyformer", KVS_PLAN_AUX_PER_LIST, -1, 0, "a score per held slot, per list"},
        {"d2o", KVS_PLAN_AUX_PER_LIST, -1, 0, "a weight per held slot and a threshold, per list"},
        /* G·R rows of scalars (profile=rows) or G·R queries (+ Z) of head_dim (profile=qz), per query head */
        {"morphkv", KVS_PLAN_AUX_PER_QUERY_HEAD, -1, 0, "G x R profile rows over the held slots"},
        /* page or token summaries of the keys in the KV element type, shared by the group */
        {"rocketkv", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "key summaries of head_dim (KV dtype), per KV head"},
        {"rocketkv_mt", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "key summaries of head_dim (KV dtype), per KV head"},
        {"hsa", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "key summaries of head_dim (KV dtype), per KV head"},
        {"quest", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "page min/max keys of head_dim (KV dtype), per KV head"},
        {"sparq", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "a key copy of head_dim (KV dtype), per KV head"},
        /* int32 index lists of the resident positions, per KV head */
        {"synckv", KVS_PLAN_AUX_PER_KV_HEAD, -1, 0, "int32 index lists, per KV head"},
        /* a layer's scalar (CAKE's preference, SimLayerKV's lazy score) or the head map's bit, shared out per KV head */
        {"cake", KVS_PLAN_AUX_PER_KV_HEAD, -1, 0, "the layer's preference score, shared by its KV heads"},
        {"simlayerkv", KVS_PLAN_AUX_PER_KV_HEAD, -1, 0, "the layer's lazy score, shared by its KV heads"},
        {"duo", KVS_PLAN_AUX_PER_KV_HEAD, -1, 0, "the head map, one bit per KV head"},
        {"duo_heuristic", KVS_PLAN_AUX_PER_KV_HEAD, -1, 0, "the head map, one bit per KV head"},
        {"qfilters", KVS_PLAN_AUX_PER_KV_HEAD, -1, 0, "a cached score per held slot (and the filter), per KV head"},
        {"ea", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"ea_decode", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "the last qbuf queries of the group, head_dim (KV dtype), per KV head"},
        /* landmarks, the low-rank factors U_r / SV in the KV element type, and chunk indices, per KV head */
        {"shadowkv", KVS_PLAN_AUX_PER_KV_HEAD, 0, 1, "landmarks and low-rank key factors (KV dtype), per KV head"},
        {"chunkkv", KVS_PLAN_AUX_PER_LIST, -1, 0, "none (scores are transient)"},
        {"lagkv", KVS_PLAN_AUX_PER_LIST, -1, 0, "none"},
        {"cur", KVS_PLAN_AUX_PER_LIST, -1, 0, "none (scores are transient)"},
        /* the last alpha queries of every query head (rkv.c account()) */
        {"rkv", KVS_PLAN_AUX_PER_QUERY_HEAD, 0, 1, "alpha cached queries of head_dim (KV dtype), per query head"},
    };
    for (size_t i = 0; policy && i < sizeof rules / sizeof rules[0]; i++) {
        if (strcmp(policy, rules[i].name)) continue;
        kvs_plan_aux_rule r = {.copies = rules[i].copies, .head_dim_offset = rules[i].head_dim_offset,
                               .kv_elements = rules[i].kv_elements};
        snprintf(r.what, sizeof r.what, "%s", rules[i].what);
        char v[32];
        if (!strcmp(policy, "morphkv") && param_value(params, "profile", v, sizeof v) && !strcmp(v, "qz")) {
            /* the R window queries of head_dim, plus each row's log-sum-exp Z in paper mode (morphkv.c account()) */
            int paper = !(param_value(params, "fidelity", v, sizeof v) && !strcmp(v, "ref"));
            r.head_dim_offset = paper;
            snprintf(r.what, sizeof r.what, "G x R queries of head_dim%s", paper ? " + Z" : "");
        }
        *out = r;
        return KVS_OK;
    }
    return kvs_fail(KVS_ERR_INVALID_ARG, "no auxiliary scaling rule for policy '%s' (--aux-scale kv|none says one)",
                    policy ? policy : "");
}

/* ------------------------------------------------------------------------------------------------
 * Footprints
 * ---------------------------------------------------------------------------------------------- */

static double min_d(double a, double b) { return a < b ? a : b; }
static double line_at(kvs_plan_line l, double x) {
    double y = l.a + l.b * x;
    return y > 0 ? y : 0;
}

/* The rule in effect: the policy's, with an --aux-scale override's head_dim and element dependence. */
static kvs_plan_aux_rule rule_in_effect(const kvs_plan_profile *p) {
    kvs_plan_aux_rule r = p->aux_rule;
    if (p->aux_scale == KVS_PLAN_AUX_KV) r.head_dim_offset = 0, r.kv_elements = 1;
    else if (p->aux_scale == KVS_PLAN_AUX_NONE) r.head_dim_offset = -1, r.kv_elements = 0;
    return r;
}

void kvs_plan_aux_describe(const kvs_plan_profile *p, char *buf, size_t cap) {
    const kvs_plan_aux_rule r = rule_in_effect(p);
    static const char *const copies[] = {"per KV head", "per list", "per query head"};
    char d[48];
    if (r.head_dim_offset < 0) snprintf(d, sizeof d, "independent of head_dim");
    else if (r.head_dim_offset == 0) snprintf(d, sizeof d, "proportional to head_dim");
    else snprintf(d, sizeof d, "proportional to head_dim + %d", r.head_dim_offset);
    snprintf(buf, cap, "%s: %s, %s, %s (%s)",
             p->aux_scale == KVS_PLAN_AUX_KV ? "kv" : p->aux_scale == KVS_PLAN_AUX_NONE ? "none" : "auto",
             (unsigned)r.copies < 3 ? copies[r.copies] : "?", d,
             r.kv_elements ? "in KV elements" : "in auxiliary elements as measured", r.what);
}

/* The factor a measured run's auxiliary bytes are multiplied by on the planned model (the rule of plan.h). */
static double aux_factor(const kvs_plan_profile *p, const kvs_plan_setup *s, double copies) {
    const kvs_plan_aux_rule r = rule_in_effect(p);
    const double g_ratio = p->trace_group > 0 ? (double)(s->model.n_heads / s->model.n_kv_heads) / p->trace_group : 1;
    double f = r.copies == KVS_PLAN_AUX_PER_LIST ? copies : r.copies == KVS_PLAN_AUX_PER_QUERY_HEAD ? g_ratio : 1;
    if (r.head_dim_offset >= 0 && p->trace_head_dim > 0)
        f *= ((double)s->model.head_dim + r.head_dim_offset) / ((double)p->trace_head_dim + r.head_dim_offset);
    if (r.kv_elements && p->trace_elem_bytes > 0) f *= s->kv_elem_bytes / p->trace_elem_bytes;
    return f;
}

/* The copies of a per-query-head run's sets on the planned model, G_plan / G_trace (1 for other runs). */
static double run_copies(const kvs_plan_profile *p, const kvs_plan_setup *s) {
    const int32_t group = s->model.n_kv_heads > 0 ? s->model.n_heads / s->model.n_kv_heads : 1;
    return p->per_query_head && p->trace_group > 0 ? (double)group / p->trace_group : 1;
}

double kvs_plan_aux_factor(const kvs_plan_profile *p, const kvs_plan_setup *s) {
    return aux_factor(p, s, run_copies(p, s));
}

kvs_plan_footprint kvs_plan_footprint_at(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt,
                                         int64_t n) {
    kvs_plan_footprint f = {0, 0, 0};
    const double N = (double)n, P = (double)prompt, B = (double)pol->budget;
    /* host and PCIe tokens: the codec's nominal bytes (its 16-bit residual stays on the device) */
    const double tok = s->codec ? kvs_codec_position_bytes(s->codec, s->model.head_dim)
                                : 2.0 * s->model.head_dim * s->kv_elem_bytes;
    const int32_t group = s->model.n_kv_heads > 0 ? s->model.n_heads / s->model.n_kv_heads : 1;
    /* a nominal per-query-head policy keeps a set per query head: the G copies the replay's storage counts */
    const double sets = pol->per_query_head ? group : 1;
    codec_shape sh = {0};
    if (s->codec) sh = shape_of(s->codec);
/* device bytes of m resident positions per set at this length */
#define ROWS(m) (s->codec ? codec_bytes(&sh, s->model.head_dim, prompt, n, (m)) : (m) * tok)
    switch (pol->kind) {
    case KVS_PLAN_FULL: f.device = ROWS(N); break;
    case KVS_PLAN_CONSTANT: f.device = sets * ROWS(min_d(N, B)); break;
    case KVS_PLAN_PROMPT_ONLY: f.device = sets * ROWS(min_d(P, B) + (N - P)); break;
    case KVS_PLAN_OFFLOAD:
        f.device = sets * ROWS(min_d(N, B));
        f.host = N * tok;
        f.transfer = sets * (min_d(N, B) + 1) * tok;
        break;
    case KVS_PLAN_MEASURED: {
        const kvs_plan_profile *p = pol->profile;
        double x = p->x_is_generated ? N - P : N;
        /* a per-query-head set is stored once per query head of the group: the planned group holds its own count */
        const int per_q = p->per_query_head && p->trace_group > 0;
        const double copies = run_copies(p, s);
        /* below its steady state a policy holds at most what it has seen (lists_trace sets of n tokens): the
         * filling phase; its auxiliary state in proportion */
        double kv = line_at(p->kv, x), kv_seen = min_d(kv, (per_q ? p->trace_group : 1) * N);
        double fill = kv > 0 ? kv_seen / kv : 1;
        f.device = copies * ROWS(kv_seen) + fill * line_at(p->aux, x) * p->tok_bytes * aux_factor(p, s, copies);
        f.host = line_at(p->host, x) * tok;
        f.transfer = line_at(p->transfer, x) * tok;
        break;
    }
    }
#undef ROWS
    if (s->codec && sh.head_scales) f.device += 8.0; /* fp8 per-head K and V scales, once per (layer, KV head) */
    return f;
}

kvs_plan_reads kvs_plan_reads_at(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt, int64_t n) {
    kvs_plan_reads r = {0, 0, 0};
    const double N = (double)n, P = (double)prompt, B = (double)pol->budget;
    const kvs_plan_footprint f = kvs_plan_footprint_at(pol, s, prompt, n);
    switch (pol->kind) {
    /* a nominal policy reads every position it holds once a step; each query head attends its own set */
    case KVS_PLAN_FULL: r.attended = N; break;
    case KVS_PLAN_CONSTANT:
    case KVS_PLAN_OFFLOAD: r.attended = min_d(N, B); break;
    case KVS_PLAN_PROMPT_ONLY: r.attended = min_d(P, B) + (N - P); break;
    case KVS_PLAN_MEASURED: {
        const kvs_plan_profile *p = pol->profile;
        const double x = p->x_is_generated ? N - P : N;
        const int per_q = p->per_query_head && p->trace_group > 0;
        const double lists = per_q ? p->trace_group : 1, copies = run_copies(p, s);
        double kv = line_at(p->kv, x), kv_seen = min_d(kv, lists * N);
        r.attended = kv_seen / lists;
        if (!p->has_reads) break; /* reads = the device footprint, below */
        double rk = min_d(line_at(p->read_kv, x), lists * N);
        double fill = kv > 0 ? kv_seen / kv : 1;
        codec_shape sh = {0};
        if (s->codec) sh = shape_of(s->codec);
        r.kv = copies * (s->codec ? codec_bytes(&sh, s->model.head_dim, prompt, n, rk)
                                  : rk * 2.0 * s->model.head_dim * s->kv_elem_bytes);
        r.aux = fill * line_at(p->read_aux, x) * p->tok_bytes * aux_factor(p, s, copies);
        return r;
    }
    }
    r.kv = f.device;
    return r;
}

/* ------------------------------------------------------------------------------------------------
 * The measured profile
 * ---------------------------------------------------------------------------------------------- */

/* Least squares y = a + b x over the points; a constant x gives the mean (b = 0). *r2 (may be NULL): 1 - SSres /
 * SStot, 1 when y is constant. */
static kvs_plan_line fit_line(const double *x, const double *y, int64_t n, double *r2) {
    double mx = 0, my = 0;
    for (int64_t i = 0; i < n; i++) {
        mx += x[i] / (double)n;
        my += y[i] / (double)n;
    }
    double sxx = 0, sxy = 0, syy = 0;
    for (int64_t i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        sxy += (x[i] - mx) * (y[i] - my);
        syy += (y[i] - my) * (y[i] - my);
    }
    kvs_plan_line l = {my, 0};
    if (sxx > 0) {
        l.b = sxy / sxx;
        l.a = my - l.b * mx;
    }
    if (r2) {
        double res = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = y[i] - (l.a + l.b * x[i]);
            res += e * e;
        }
        /* a footprint constant up to rounding (the mean's own rounding makes syy a few ulps) has R² 1 */
        *r2 = syy > 1e-20 * (my * my + 1) * (double)n ? 1 - res / syy : 1;
    }
    return l;
}

int64_t kvs_plan_profile_steady_from(const kvs_plan_profile *p) {
    const int64_t decode = p->prompt_len + 1; /* the first decode step's length */
    if (!strcmp(p->budget_scope, "every_step")) return p->budget_tokens + 1 > decode ? p->budget_tokens + 1 : decode;
    if (!strcmp(p->budget_scope, "prompt") && p->prompt_len < p->budget_tokens) return -1;
    return decode;
}

kvs_status kvs_plan_profile_fit(kvs_plan_profile *p, const int64_t *n, const double *kv, const double *aux,
                                const double *host, const double *transfer, int64_t count) {
    if (!p || !n || !kv || count < 1 || !(p->tok_bytes > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: a profile needs at least one measured point and a token size");
    p->x_is_generated = !strcmp(p->budget_scope, "prompt");
    p->n_min = INT64_MAX;
    p->n_max = 0;
    for (int64_t i = 0; i < count; i++) {
        if (n[i] < p->n_min) p->n_min = n[i];
        if (n[i] > p->n_max) p->n_max = n[i];
    }
    p->n_points = count;
    const int64_t from = kvs_plan_profile_steady_from(p);
    if (from < 0)
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "run %lld (%s, budget %lld) never compressed its prompt: the trace's prompt has %lld tokens, "
                        "fewer than the budget, so the run shows no steady state to plan with (replay a trace whose "
                        "prompt has at least the budget, or a budget of at most %lld)",
                        (long long)p->run_id, p->policy, (long long)p->budget_tokens, (long long)p->prompt_len,
                        (long long)p->prompt_len);
    if (p->n_max < from)
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "run %lld (%s, budget %lld) never reached its steady state: the longest sequence measured "
                        "holds %lld tokens and the cache is full only from %lld (replay a longer trace, or a budget "
                        "below %lld)",
                        (long long)p->run_id, p->policy, (long long)p->budget_tokens, (long long)p->n_max,
                        (long long)from, (long long)p->n_max);
    double *buf = malloc((size_t)count * 3 * sizeof *buf);
    if (!buf) return kvs_fail(KVS_ERR_NOMEM, "plan: out of memory");
    double *x = buf, *y = buf + count, *dev = buf + 2 * count;
    kvs_status st = KVS_OK;
    int64_t m = 0; /* the steady points, in order */
    p->fit_n_min = INT64_MAX;
    p->fit_n_max = 0;
    for (int64_t i = 0; i < count; i++) {
        if (n[i] < from) continue;
        if (!isfinite(kv[i])) {
            st = kvs_fail(KVS_ERR_FORMAT, "plan: the run has no device KV bytes recorded at length %lld",
                          (long long)n[i]);
            goto cleanup;
        }
        x[m++] = p->x_is_generated ? (double)(n[i] - p->prompt_len) : (double)n[i];
        if (n[i] < p->fit_n_min) p->fit_n_min = n[i];
        if (n[i] > p->fit_n_max) p->fit_n_max = n[i];
    }
    const double *series[4] = {kv, aux, host, transfer};
    kvs_plan_line *lines[4] = {&p->kv, &p->aux, &p->host, &p->transfer};
    for (int s = 0; s < 4; s++) {
        int64_t j = 0;
        for (int64_t i = 0; i < count; i++) {
            if (n[i] < from) continue;
            double v = series[s] && isfinite(series[s][i]) ? series[s][i] : 0;
            y[j] = v / p->tok_bytes;
            if (s == 0) dev[j] = y[j];
            else if (s == 1) dev[j] += y[j];
            j++;
        }
        *lines[s] = fit_line(x, y, m, NULL);
    }
    fit_line(x, dev, m, &p->kv_r2);
    p->fit_points = m;
cleanup:
    free(buf);
    return st;
}


kvs_status kvs_plan_profile_fit_reads(kvs_plan_profile *p, const int64_t *n, const double *rkv, const double *raux,
                                      int64_t count) {
    if (!p || !n || count < 1 || !(p->tok_bytes > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: reads need at least one measured point and a token size");
    const int64_t from = kvs_plan_profile_steady_from(p);
    double *buf = malloc((size_t)count * 2 * sizeof *buf);
    if (!buf) return kvs_fail(KVS_ERR_NOMEM, "plan: out of memory");
    double *x = buf, *y = buf + count;
    const double *series[2] = {rkv, raux};
    kvs_plan_line *lines[2] = {&p->read_kv, &p->read_aux};
    for (int s = 0; s < 2; s++) {
        int64_t m = 0;
        for (int64_t i = 0; i < count; i++) {
            if (from < 0 || n[i] < from) continue;
            x[m] = p->x_is_generated ? (double)(n[i] - p->prompt_len) : (double)n[i];
            y[m++] = (series[s] && isfinite(series[s][i]) ? series[s][i] : 0) / p->tok_bytes;
        }
        *lines[s] = m > 0 ? fit_line(x, y, m, NULL) : (kvs_plan_line){0, 0};
    }
    free(buf);
    p->has_reads = 1;
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Capacity
 * ---------------------------------------------------------------------------------------------- */

double kvs_plan_weight_bytes(const kvs_plan_setup *s) { return kvs_plan_params(&s->model) * s->weight_elem_bytes; }

kvs_status kvs_plan_kv_pool(const kvs_plan_setup *s, double *pool) {
    if (!(s->gpu_bytes > 0)) return kvs_fail(KVS_ERR_INVALID_ARG, "no GPU memory given (--gpu-mem)");
    double gpus = s->n_gpus > 0 ? s->n_gpus : 1;
    double avail = gpus * (s->gpu_bytes - s->reserve_bytes), w = kvs_plan_weight_bytes(s);
    if (!(avail - w > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG,
                        "impossible memory: %s needs %.4g GB (%.4g GiB) of weights but %g GPU(s) of %.4g GB%s leave "
                        "%.4g GB for weights and KV cache",
                        s->model.name, w / 1e9, w / 1073741824.0, gpus, s->gpu_bytes / 1e9,
                        s->reserve_bytes > 0 ? " less the reserve" : "", avail / 1e9);
    *pool = avail - w;
    return KVS_OK;
}

kvs_plan_footprint kvs_plan_footprint_windowed(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt,
                                               int64_t n) {
    kvs_plan_footprint f = kvs_plan_footprint_at(pol, s, prompt, n);
    const int64_t w = s->model.window;
    if (w <= 0 || n <= w) return f;
    const kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    double cap = kvs_plan_footprint_at(&full, s, prompt < w ? prompt : w, w).device;
    if (f.device > cap) f.device = cap;
    return f;
}

kvs_plan_reads kvs_plan_reads_windowed(const kvs_plan_policy *pol, const kvs_plan_setup *s, int64_t prompt, int64_t n) {
    kvs_plan_reads r = kvs_plan_reads_at(pol, s, prompt, n);
    const int64_t w = s->model.window;
    if (w <= 0 || n <= w) return r;
    const kvs_plan_policy full = {.kind = KVS_PLAN_FULL};
    const kvs_plan_reads cap = kvs_plan_reads_at(&full, s, prompt < w ? prompt : w, w);
    if (r.kv > cap.kv) r.kv = cap.kv;
    if (r.attended > (double)w) r.attended = (double)w;
    return r;
}

/* Device bytes per (layer, KV head), summed over the model's layers: full layers, then sliding-window ones. */
static double layers_device(const kvs_plan_setup *s, const kvs_plan_policy *pol, int64_t prompt, int64_t n) {
    const int32_t lw = s->model.window > 0 ? s->model.window_layers : 0;
    double full = lw < s->model.n_layers ? (s->model.n_layers - lw) * kvs_plan_footprint_at(pol, s, prompt, n).device : 0;
    return full + (lw > 0 ? lw * kvs_plan_footprint_windowed(pol, s, prompt, n).device : 0);
}

/* Device bytes of one sequence: the peak over its decode, n from context to context + response. Every kind's
 * footprint is monotone or linear in n, so the peak is at one end; a codec's 16-bit rows add a saw-tooth (they
 * grow by one a step, then are quantized at once) on a non-decreasing footprint, whose peak is at the end or at the
 * last top of the saw-tooth. The codec's per-layer scales are held once per layer. */
static double seq_device(const kvs_plan_setup *s, const kvs_plan_policy *pol, int64_t context, int64_t response) {
    const double kvh = (double)s->model.n_kv_heads;
    double a = layers_device(s, pol, context, context);
    double b = layers_device(s, pol, context, context + response);
    double peak = a > b ? a : b;
    if (s->codec) {
        int64_t top;
        if (codec_tops(s->codec, context, context, context + response, &top)) {
            double t = layers_device(s, pol, context, top);
            if (t > peak) peak = t;
        }
        return kvh * peak + s->model.n_layers * kvs_codec_layer_bytes(s->codec);
    }
    return kvh * peak;
}

kvs_status kvs_plan_eval(const kvs_plan_setup *s, const kvs_plan_policy *pol, int64_t context, int64_t response,
                         int64_t batch, kvs_plan_point *out) {
    if (!s || !pol || !out || context < 1 || response < 0 || batch < 1 || s->model.n_kv_heads < 1 ||
        (pol->kind == KVS_PLAN_MEASURED && !pol->profile))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: bad point (context >= 1, response >= 0, batch >= 1)");
    if (context > KVS_PLAN_MAX_CONTEXT || response > KVS_PLAN_MAX_CONTEXT)
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: context and response are limited to 2^40 tokens");
    const double heads = (double)s->model.n_layers * s->model.n_kv_heads;
    kvs_plan_point p = {.context = context, .response = response, .batch = batch, .max_batch = -1, .max_context = -1,
                        .max_context_memory = -1};
    p.seq_device_bytes = seq_device(s, pol, context, response);
    p.total_bytes = (double)batch * p.seq_device_bytes;
    kvs_plan_footprint end = kvs_plan_footprint_at(pol, s, context, context + response);
    p.host_bytes = (double)batch * heads * end.host;
    p.pcie_bytes_per_step = (double)batch * heads * end.transfer;
    if (s->gpu_bytes > 0) {
        double pool;
        kvs_status st = kvs_plan_kv_pool(s, &pool);
        if (st != KVS_OK) return st;
        double mb = p.seq_device_bytes > 0 ? floor(pool / p.seq_device_bytes) : (double)INT64_MAX;
        p.max_batch = mb >= 9.2e18 ? INT64_MAX : (int64_t)mb;
        /* The largest context that fits: the footprint grows (or stays) with the context, so bisect. */
        const double per_seq = pool / (double)batch;
        if (seq_device(s, pol, KVS_PLAN_MAX_CONTEXT, response) <= per_seq) {
            p.max_context = KVS_PLAN_UNBOUNDED;
        } else if (seq_device(s, pol, 1, response) > per_seq) {
            p.max_context = 0;
        } else {
            int64_t lo = 1, hi = KVS_PLAN_MAX_CONTEXT; /* fits at lo, not at hi */
            while (hi - lo > 1) {
                int64_t mid = lo + (hi - lo) / 2;
                if (seq_device(s, pol, mid, response) <= per_seq) lo = mid;
                else hi = mid;
            }
            p.max_context = lo;
        }
        p.max_context_memory = p.max_context;
        /* a prompt longer than the model's context less the response cannot be served, whatever memory allows */
        if (s->model.max_positions > 0) {
            int64_t room = (int64_t)s->model.max_positions - response;
            if (room < 0) room = 0;
            if (room < p.max_context) {
                p.max_context = room;
                p.context_clamped = 1;
            }
        }
    }
    *out = p;
    return KVS_OK;
}

/* ---- option lists --------------------------------------------------------------------------------------- */

/* A whole decimal number in [lo, hi] for option `opt` (the messages of the command line's number parser). */
static kvs_status parse_whole(const char *opt, const char *val, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (!val[0] || end == val || *end || (errno && errno != ERANGE))
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not an integer", opt, val);
    if (errno == ERANGE || v < lo || v > hi) /* the user's text, never strtoll's clamped value */
        return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is out of range [%lld, %lld]", opt, val, (long long)lo,
                        (long long)hi);
    *out = v;
    return KVS_OK;
}

kvs_status kvs_plan_parse_list(const char *opt, const char *v, int64_t lo, int64_t *out, int *n) {
    *n = 0;
    const char *p = v;
    while (*p) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || *n >= KVS_PLAN_MAX_LIST)
            return kvs_fail(KVS_ERR_INVALID_ARG, "%s: '%s' is not a list of at most %d numbers", opt, v,
                            KVS_PLAN_MAX_LIST);
        memcpy(item, p, len);
        item[len] = '\0';
        kvs_status st = parse_whole(opt, item, lo, INT64_C(1) << 40, &out[*n]);
        if (st != KVS_OK) return st;
        (*n)++;
        p += len + (p[len] == ',');
    }
    if (*n == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "%s: empty list", opt);
    return KVS_OK;
}

kvs_status kvs_plan_parse_settings(const char *v, int64_t *ctx, int64_t *resp, int *n) {
    *n = 0;
    const char *p = v;
    while (*p) {
        char item[64];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof item || *n >= KVS_PLAN_MAX_LIST)
            return kvs_fail(KVS_ERR_INVALID_ARG, "--settings: '%s' is not a list of CONTEXT+RESPONSE", v);
        memcpy(item, p, len);
        item[len] = '\0';
        char *plus = strchr(item, '+');
        if (!plus) return kvs_fail(KVS_ERR_INVALID_ARG, "--settings: '%s' is not CONTEXT+RESPONSE", item);
        *plus = '\0';
        kvs_status st = parse_whole("--settings context", item, 1, INT64_C(1) << 40, &ctx[*n]);
        if (st == KVS_OK) st = parse_whole("--settings response", plus + 1, 0, INT64_C(1) << 40, &resp[*n]);
        if (st != KVS_OK) return st;
        (*n)++;
        p += len + (p[len] == ',');
    }
    if (*n == 0) return kvs_fail(KVS_ERR_INVALID_ARG, "--settings: empty list");
    return KVS_OK;
}
