/* model.c — checkpoint loading (llama2.c .bin, Hugging Face safetensors folders) and the CPU reference
 * forward pass of Llama-family models; see model.h. The forward pass follows llama2.c run.c `forward`
 * (RMSNorm, q/k/v projections, RoPE, causal attention over the KV cache, output projection, SwiGLU FFN,
 * final norm, classifier) generalised to q/k/v biases, either RoPE layout and Llama-3 RoPE scaling, with
 * the attention itself done by kvs_attention() (common/kvs_math.h) so the recorded LSE and output are
 * exactly what the rest of kvsim recomputes.
 */
#include "model.h"
#include "model_weights.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../common/json.h"
#include "../common/kvs_math.h"
#include "matmul.h"

/* ================================================================================================
 * Model structure
 * ============================================================================================== */

/* Matrices stay in their checkpoint dtype (kvs_wmat, read in place from the mapping); vectors are fp32. */
typedef struct {
    const float *rms_att, *rms_ffn; /* [dim] */
    kvs_wmat wq;                    /* [n_heads*head_dim][dim] */
    kvs_wmat wk, wv;                /* [n_kv_heads*head_dim][dim] */
    kvs_wmat wo;                    /* [dim][n_heads*head_dim] */
    const float *bq, *bk, *bv, *bo; /* biases or NULL */
    kvs_wmat w1;                    /* gate: [hidden][dim] */
    kvs_wmat w2;                    /* down: [dim][hidden] */
    kvs_wmat w3;                    /* up:   [hidden][dim] */
    const float *q_norm, *k_norm;   /* [head_dim] per-head q/k RMSNorm (Qwen3, Gemma-3) or NULL */
    const float *rms_post_att;      /* [dim] norm of the attention branch output (Gemma-3) or NULL */
    const float *rms_post_ffn;      /* [dim] norm of the FFN branch output (Gemma-3) or NULL */
} layer_weights;

typedef struct {
    void *addr;
    size_t len;
} mapping;

struct kvs_model {
    kvs_model_info info;
    kvs_wmat embed;         /* [vocab][dim] */
    const float *rms_final; /* [dim] */
    kvs_wmat cls;           /* [vocab][dim] */
    layer_weights *layers;  /* [n_layers] */
    float *inv_freq;        /* [head_dim/2] RoPE frequencies (after any scaling) */
    float *inv_freq_local;  /* [head_dim/2] of sliding-window layers when their base differs (Gemma-3), else NULL */
    mapping *maps;
    int n_maps, cap_maps;
    void **owned; /* heap fp32 copies of converted tensors (16-bit vectors, misaligned fp32 tensors), panels */
    int n_owned, cap_owned;
    /* 16-bit matrices are packed into panels (matmul.h) by the first kvs_model_state_create, not at load: a model
     * that only feeds the CUDA backend (kvs_model_weights_get, row-major) never pays for the copy */
    pthread_mutex_t pack_mu;
    int packed; /* under pack_mu: pack_matrices done */
};

static const char *base_name(const char *path, char *buf, size_t cap) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "dir/" -> "dir" */
    size_t b = n;
    while (b > 0 && path[b - 1] != '/') b--;
    size_t len = n - b;
    if (len >= cap) len = cap - 1;
    memcpy(buf, path + b, len);
    buf[len] = '\0';
    return buf;
}

/* Re-issues the calling thread's error detail with `prefix` in front (kvs_fail allows the alias). */
static kvs_status prefix_error(kvs_status s, const char *prefix) {
    return kvs_fail(s, "%s%s", prefix, kvs_last_error());
}

static kvs_status add_map(kvs_model *m, void *addr, size_t len) {
    if (m->n_maps == m->cap_maps) {
        int cap = m->cap_maps ? 2 * m->cap_maps : 4;
        mapping *n = realloc(m->maps, (size_t)cap * sizeof *n);
        if (!n) return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
        m->maps = n;
        m->cap_maps = cap;
    }
    m->maps[m->n_maps++] = (mapping){addr, len};
    return KVS_OK;
}

static kvs_status add_owned(kvs_model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        int cap = m->cap_owned ? 2 * m->cap_owned : 16;
        void **n = realloc(m->owned, (size_t)cap * sizeof *n);
        if (!n) {
            free(p);
            return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
        }
        m->owned = n;
        m->cap_owned = cap;
    }
    m->owned[m->n_owned++] = p;
    return KVS_OK;
}

/* Maps a whole file read-only. */
static kvs_status map_file(kvs_model *m, const char *path, const uint8_t **data, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvs_fail(KVS_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvs_fail(KVS_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: file is empty", path);
    }
    void *addr = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (addr == MAP_FAILED) return kvs_fail(KVS_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
    kvs_status s = add_map(m, addr, (size_t)st.st_size);
    if (s != KVS_OK) {
        munmap(addr, (size_t)st.st_size);
        return s;
    }
    *data = addr;
    *len = (size_t)st.st_size;
    return KVS_OK;
}

void kvs_model_free(kvs_model *m) {
    if (!m) return;
    for (int i = 0; i < m->n_maps; i++) munmap(m->maps[i].addr, m->maps[i].len);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->maps);
    free(m->owned);
    free(m->layers);
    free(m->inv_freq);
    free(m->inv_freq_local);
    pthread_mutex_destroy(&m->pack_mu);
    free(m);
}

const kvs_model_info *kvs_model_info_get(const kvs_model *m) { return &m->info; }

int kvs_model_is_eos(const kvs_model *m, int32_t token) {
    for (int i = 0; i < m->info.n_eos; i++)
        if (m->info.eos_ids[i] == token) return 1;
    return 0;
}

/* The RoPE table of Gemma-3's sliding-window layers: base rope_local_base_freq, never rope_scaling (HF builds
 * their rotary embedding from a copy of the config with the default rope type). */
static kvs_status local_rope_table(kvs_model *m) {
    const kvs_model_config *c = &m->info.config;
    if (!(m->info.rope_local_theta > 0)) return KVS_OK;
    int half = c->head_dim / 2;
    m->inv_freq_local = malloc((size_t)half * sizeof *m->inv_freq_local);
    if (!m->inv_freq_local) return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
    for (int i = 0; i < half; i++)
        m->inv_freq_local[i] = (float)pow((double)m->info.rope_local_theta, -2.0 * i / (double)c->head_dim);
    return KVS_OK;
}

/* Validates the dimensions common to both formats and derives the RoPE table and byte counts. */
static kvs_status finish_config(kvs_model *m, const char *src) {
    kvs_model_config *c = &m->info.config;
    if (c->head_dim % 2 != 0)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: head_dim (%d) must be even for RoPE", src, c->head_dim);
    if (c->head_dim > KVS_TRACE_MAX_HEAD_DIM || c->n_heads > KVS_TRACE_MAX_HEADS || c->n_layers > KVS_TRACE_MAX_LAYERS)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: n_layers %d / n_heads %d / head_dim %d exceed the trace limits (%d/%d/%d)",
                        src, c->n_layers, c->n_heads, c->head_dim, KVS_TRACE_MAX_LAYERS, KVS_TRACE_MAX_HEADS,
                        KVS_TRACE_MAX_HEAD_DIM);
    c->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
    if (m->info.query_pre_attn_scalar > 0) c->attn_scale = (float)(1.0 / sqrt((double)m->info.query_pre_attn_scalar));
    int half = c->head_dim / 2;
    m->inv_freq = malloc((size_t)half * sizeof *m->inv_freq);
    if (!m->inv_freq) return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
    for (int i = 0; i < half; i++) {
        double f = pow((double)c->rope_theta, -2.0 * i / (double)c->head_dim);
        if (m->info.rope_llama3) {
            /* Llama 3.1 frequency scaling (transformers _compute_llama3_parameters). */
            double old_ctx = m->info.rope_original_max_pos;
            double low_wavelen = old_ctx / m->info.rope_low_freq_factor;
            double high_wavelen = old_ctx / m->info.rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / m->info.rope_factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old_ctx / wavelen - m->info.rope_low_freq_factor) /
                                (m->info.rope_high_freq_factor - m->info.rope_low_freq_factor);
                f = (1.0 - smooth) * f / m->info.rope_factor + smooth * f;
            }
        }
        if (m->info.rope_linear_factor > 1) f /= m->info.rope_linear_factor;
        m->inv_freq[i] = (float)f;
    }
    kvs_status ls = local_rope_table(m);
    if (ls != KVS_OK) return ls;
    uint64_t d = (uint64_t)c->dim, hd = (uint64_t)c->head_dim, L = (uint64_t)c->n_layers;
    uint64_t qd = (uint64_t)c->n_heads * hd, kvd = (uint64_t)c->n_kv_heads * hd, hid = (uint64_t)c->hidden_dim;
    uint64_t per_layer = 2 * d + qd * d + 2 * kvd * d + d * qd + 3 * hid * d;
    if (m->info.qkv_bias) per_layer += qd + 2 * kvd;
    if (m->info.o_bias) per_layer += d;
    if (m->info.qk_norm) per_layer += 2 * hd;
    if (m->info.sandwich_norm) per_layer += 2 * d;
    uint64_t vocab_d = (uint64_t)c->vocab_size * d;
    int shared = m->cls.data == m->embed.data;
    m->info.tied_embeddings = shared;
    m->info.n_params = L * per_layer + d + vocab_d * (shared ? 1 : 2);
    /* per token the embedding row is read, not the table; the classifier is read whole; matrices in their
     * storage dtype (fp32 when they mix), vectors in fp32 */
    uint64_t vec_per_layer = 2 * d + (m->info.qkv_bias ? qd + 2 * kvd : 0) + (m->info.o_bias ? d : 0);
    uint64_t wsz = kvs_dtype_size(m->info.weight_dtype);
    m->info.weight_bytes = wsz * (L * (per_layer - vec_per_layer) + vocab_d + d) + 4 * (L * vec_per_layer + d);
    return KVS_OK;
}

/* ================================================================================================
 * llama2.c checkpoints
 * ============================================================================================== */

static kvs_status load_llama2c(kvs_model *m, const char *path) {
    const uint8_t *data;
    size_t size;
    kvs_status s = map_file(m, path, &data, &size);
    if (s != KVS_OK) return s;
    if (size < 28)
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: file is %zu bytes, shorter than the 28-byte llama2.c header", path, size);
    int32_t h[7];
    for (int i = 0; i < 7; i++) h[i] = (int32_t)kvs_get_u32(data + 4 * i);
    if (!memcmp(data, "ak42", 4))
        return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: llama2.c versioned export (magic \"ak42\") is not supported; "
                        "use the legacy (version 0) export", path);
    static const char *const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        if (i == 5 ? (h[i] == 0 || h[i] == INT32_MIN) : h[i] <= 0)
            return kvs_fail(KVS_ERR_FORMAT, "%s: llama2.c header field %s (%d) is invalid (not a llama2.c checkpoint?)",
                            path, names[i], h[i]);
    }
    if (h[2] > KVS_TRACE_MAX_LAYERS || h[3] > KVS_TRACE_MAX_HEADS || h[0] > (1 << 20) || h[1] > (1 << 22) ||
        h[6] > (1 << 24) || (h[5] > 0 ? h[5] : -h[5]) > (1 << 24))
        return kvs_fail(KVS_ERR_FORMAT, "%s: llama2.c header out of range (dim %d hidden_dim %d n_layers %d n_heads %d "
                        "vocab_size %d seq_len %d)", path, h[0], h[1], h[2], h[3], h[5], h[6]);
    if (h[4] > h[3] || h[3] % h[4] != 0)
        return kvs_fail(KVS_ERR_FORMAT, "%s: n_kv_heads (%d) does not divide n_heads (%d)", path, h[4], h[3]);
    if (h[0] % h[3] != 0)
        return kvs_fail(KVS_ERR_FORMAT, "%s: n_heads (%d) does not divide dim (%d)", path, h[3], h[0]);
    kvs_model_config *c = &m->info.config;
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    int shared = h[5] > 0;
    c->vocab_size = shared ? h[5] : -h[5];
    c->max_seq_len = h[6];
    c->head_dim = h[0] / h[3];
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    c->rope_layout = KVS_ROPE_ADJACENT;
    m->info.format = KVS_MODEL_LLAMA2C;
    snprintf(m->info.architecture, sizeof m->info.architecture, "llama2.c");
    m->info.weight_dtype = KVS_DTYPE_F32;
    m->info.bos_id = 1;
    /* llama2.c's TinyStories data separates stories with BOS and run.c stops when the model emits BOS (1);
     * the Llama vocabulary's EOS (2) ends generation too. */
    m->info.eos_ids[0] = 1;
    m->info.eos_ids[1] = 2;
    m->info.n_eos = 2;

    uint64_t d = (uint64_t)c->dim, L = (uint64_t)c->n_layers, hd = (uint64_t)c->head_dim;
    uint64_t kvd = (uint64_t)c->n_kv_heads * hd, hid = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    uint64_t counts[] = {V * d, L * d, L * d * d, L * kvd * d, L * kvd * d, L * d * d, L * d, L * hid * d,
                         L * d * hid, L * hid * d, d, (uint64_t)c->max_seq_len * hd / 2, (uint64_t)c->max_seq_len * hd / 2,
                         shared ? 0 : V * d};
    uint64_t total = 0;
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) total += counts[i];
    uint64_t expect = 28 + 4 * total;
    if (size < expect)
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: file is %zu bytes but the header (dim %d, hidden_dim %d, n_layers %d, "
                        "n_heads %d, n_kv_heads %d, vocab_size %d, seq_len %d) needs %llu", path, size, h[0], h[1],
                        h[2], h[3], h[4], h[5], h[6], (unsigned long long)expect);
    if (size > expect)
        return kvs_fail(KVS_ERR_FORMAT, "%s: %llu unexpected trailing bytes after the weights the header describes "
                        "(file %zu bytes, expected %llu)", path, (unsigned long long)(size - expect), size,
                        (unsigned long long)expect);
    const float *p = (const float *)(data + 28);
    const float *t[14];
    for (int i = 0; i < 14; i++) {
        t[i] = p;
        p += counts[i];
    }
    m->embed = (kvs_wmat){t[0], KVS_DTYPE_F32, NULL};
    m->rms_final = t[10];
    m->cls = (kvs_wmat){shared ? t[0] : t[13], KVS_DTYPE_F32, NULL};
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
    for (uint64_t l = 0; l < L; l++) {
        layer_weights *w = &m->layers[l];
        w->rms_att = t[1] + l * d;
        w->wq = (kvs_wmat){t[2] + l * d * d, KVS_DTYPE_F32, NULL};
        w->wk = (kvs_wmat){t[3] + l * kvd * d, KVS_DTYPE_F32, NULL};
        w->wv = (kvs_wmat){t[4] + l * kvd * d, KVS_DTYPE_F32, NULL};
        w->wo = (kvs_wmat){t[5] + l * d * d, KVS_DTYPE_F32, NULL};
        w->rms_ffn = t[6] + l * d;
        w->w1 = (kvs_wmat){t[7] + l * hid * d, KVS_DTYPE_F32, NULL};
        w->w2 = (kvs_wmat){t[8] + l * d * hid, KVS_DTYPE_F32, NULL};
        w->w3 = (kvs_wmat){t[9] + l * hid * d, KVS_DTYPE_F32, NULL};
    }
    return finish_config(m, path);
}

/* ================================================================================================
 * Hugging Face folders
 * ============================================================================================== */

typedef struct {
    char path[4096];
    const uint8_t *data; /* start of the tensor data section */
    uint64_t data_len;
    kvs_json *header;
} st_file;

typedef struct {
    const char *dir;
    st_file *files;
    int n_files;
    kvs_json *index; /* model.safetensors.index.json, NULL for a single file */
    int have_dtype;
} st_set;

static void st_set_free(st_set *s) {
    for (int i = 0; i < s->n_files; i++) kvs_json_free(s->files[i].header);
    free(s->files);
    kvs_json_free(s->index);
}

static kvs_status st_open(kvs_model *m, st_file *f) {
    const uint8_t *data;
    size_t size;
    kvs_status s = map_file(m, f->path, &data, &size);
    if (s != KVS_OK) return s;
    if (size < 8) return kvs_fail(KVS_ERR_TRUNCATED, "%s: %zu bytes, shorter than the 8-byte safetensors header length", f->path, size);
    uint64_t n = kvs_get_u64(data);
    if (n > size - 8)
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: safetensors header length %llu runs past the end of the file (%zu bytes)",
                        f->path, (unsigned long long)n, size);
    if (n < 2 || n > (100u << 20))
        return kvs_fail(KVS_ERR_FORMAT, "%s: implausible safetensors header length %llu", f->path, (unsigned long long)n);
    s = kvs_json_parse((const char *)data + 8, (size_t)n, &f->header);
    if (s != KVS_OK) {
        char pre[4200];
        snprintf(pre, sizeof pre, "%s: safetensors header: ", f->path);
        return prefix_error(s, pre);
    }
    if (kvs_json_type_of(f->header) != KVS_JSON_OBJECT)
        return kvs_fail(KVS_ERR_FORMAT, "%s: safetensors header is not a JSON object", f->path);
    f->data = data + 8 + n;
    f->data_len = size - 8 - n;
    return KVS_OK;
}

/* Finds tensor `name`: in the index's weight_map shard (or the single file), following a __metadata__
 * alias (tied weights saved once). *f = NULL when absent. */
static kvs_status st_find(st_set *set, const char *name, st_file **f, const kvs_json **entry) {
    *f = NULL;
    *entry = NULL;
    for (int hop = 0; hop < 2; hop++) {
        for (int i = 0; i < set->n_files; i++) {
            if (set->index) {
                const char *shard = kvs_json_string(kvs_json_get(kvs_json_get(set->index, "weight_map"), name));
                if (!shard) break;
                const char *slash = strrchr(set->files[i].path, '/');
                if (strcmp(slash ? slash + 1 : set->files[i].path, shard)) continue;
            }
            const kvs_json *e = kvs_json_get(set->files[i].header, name);
            if (e) {
                *f = &set->files[i];
                *entry = e;
                return KVS_OK;
            }
        }
        /* alias: __metadata__ {"model.embed_tokens.weight": "lm_head.weight"} in any file */
        const char *alias = NULL;
        for (int i = 0; i < set->n_files && !alias; i++)
            alias = kvs_json_string(kvs_json_get(kvs_json_get(set->files[i].header, "__metadata__"), name));
        if (!alias || !strcmp(alias, name)) return KVS_OK;
        name = alias;
    }
    return KVS_OK;
}

static kvs_status json_u64(const kvs_json *v, uint64_t *out) {
    if (kvs_json_type_of(v) != KVS_JSON_NUMBER) return KVS_ERR_FORMAT;
    double d = kvs_json_number(v);
    if (!(d >= 0 && d <= 9007199254740992.0) || d != floor(d)) return KVS_ERR_FORMAT;
    *out = (uint64_t)d;
    return KVS_OK;
}

static void fmt_shape(char *buf, size_t cap, const uint64_t *dims, int nd) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < nd && o < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? ", " : "", (unsigned long long)dims[i]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

/* Loads tensor `name` of shape dims[nd]: into *mat (when mat != NULL) as stored, in place — 16-bit matrices are
 * never widened to an fp32 copy (matmul.h reads them) — else into *out as fp32. Either is NULL / {NULL} when
 * absent and !required. */
static kvs_status st_tensor_as(kvs_model *m, st_set *set, const char *name, int nd, const uint64_t *dims,
                               int required, const float **out, kvs_wmat *mat) {
    if (out) *out = NULL;
    if (mat) *mat = (kvs_wmat){NULL, KVS_DTYPE_F32, NULL};
    st_file *f;
    const kvs_json *e;
    st_find(set, name, &f, &e);
    if (!f) {
        if (!required) return KVS_OK;
        return kvs_fail(KVS_ERR_FORMAT, "%s: tensor %s is missing", set->index ? "model.safetensors.index.json / shards"
                        : set->files[0].path, name);
    }
    const char *dt = kvs_json_string(kvs_json_get(e, "dtype"));
    const kvs_json *shape = kvs_json_get(e, "shape"), *offs = kvs_json_get(e, "data_offsets");
    if (!dt || kvs_json_type_of(shape) != KVS_JSON_ARRAY || kvs_json_type_of(offs) != KVS_JSON_ARRAY ||
        kvs_json_len(offs) != 2)
        return kvs_fail(KVS_ERR_FORMAT, "%s: tensor %s: entry lacks dtype, shape or data_offsets [begin, end]", f->path, name);
    kvs_dtype dtype;
    if (!strcmp(dt, "F32")) dtype = KVS_DTYPE_F32;
    else if (!strcmp(dt, "F16")) dtype = KVS_DTYPE_F16;
    else if (!strcmp(dt, "BF16")) dtype = KVS_DTYPE_BF16;
    else return kvs_fail(KVS_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (supported: F32, F16, BF16)", f->path, name, dt);
    /* The device dtype is the matrices' common storage dtype, and fp32 when they mix (bf16 layers beside an
     * fp32 lm_head, say): every GEMM runs in one dtype, and fp32 holds each source exactly. Vectors (norms,
     * biases) are used in fp32 everywhere, so they do not count. */
    if (nd == 2) {
        if (!set->have_dtype) {
            m->info.weight_dtype = dtype;
            set->have_dtype = 1;
        } else if (dtype != m->info.weight_dtype) {
            m->info.weight_dtype = KVS_DTYPE_F32;
        }
    }
    uint64_t got[8];
    size_t gn = kvs_json_len(shape);
    int shape_ok = gn == (size_t)nd && gn <= 8;
    for (size_t i = 0; i < gn && i < 8; i++)
        if (json_u64(kvs_json_at(shape, i), &got[i]) != KVS_OK)
            return kvs_fail(KVS_ERR_FORMAT, "%s: tensor %s: shape[%zu] is not a non-negative integer", f->path, name, i);
    for (int i = 0; shape_ok && i < nd; i++)
        if (got[i] != dims[i]) shape_ok = 0;
    if (!shape_ok) {
        char a[128], b[128];
        fmt_shape(a, sizeof a, got, gn < 8 ? (int)gn : 8);
        fmt_shape(b, sizeof b, dims, nd);
        return kvs_fail(KVS_ERR_FORMAT, "%s: tensor %s has shape %s, expected %s", f->path, name, a, b);
    }
    uint64_t begin, end, numel = 1;
    for (int i = 0; i < nd; i++) numel *= dims[i];
    if (json_u64(kvs_json_at(offs, 0), &begin) != KVS_OK || json_u64(kvs_json_at(offs, 1), &end) != KVS_OK || end < begin)
        return kvs_fail(KVS_ERR_FORMAT, "%s: tensor %s: data_offsets are not integers with begin <= end", f->path, name);
    if (end - begin != numel * kvs_dtype_size(dtype))
        return kvs_fail(KVS_ERR_FORMAT, "%s: tensor %s: data_offsets span %llu bytes, shape and dtype need %llu", f->path,
                        name, (unsigned long long)(end - begin), (unsigned long long)(numel * kvs_dtype_size(dtype)));
    if (end > f->data_len)
        return kvs_fail(KVS_ERR_TRUNCATED, "%s: tensor %s: data_offsets end %llu lies past the end of the data (%llu bytes)",
                        f->path, name, (unsigned long long)end, (unsigned long long)f->data_len);
    const uint8_t *src = f->data + begin;
    if (mat && (dtype != KVS_DTYPE_F32 || ((uintptr_t)src % sizeof(float)) == 0)) {
        *mat = (kvs_wmat){src, dtype, NULL};
        return KVS_OK;
    }
    if (!mat && dtype == KVS_DTYPE_F32 && ((uintptr_t)src % sizeof(float)) == 0) {
        *out = (const float *)src;
        return KVS_OK;
    }
    float *dst = malloc((size_t)numel * sizeof *dst + 1);
    if (!dst) return kvs_fail(KVS_ERR_NOMEM, "%s: out of memory converting tensor %s", f->path, name);
    kvs_decode(dtype, src, (size_t)numel, dst);
    kvs_status s = add_owned(m, dst);
    if (s != KVS_OK) return s;
    if (mat) *mat = (kvs_wmat){dst, KVS_DTYPE_F32, NULL};
    else *out = dst;
    return KVS_OK;
}

/* Loads a vector (norm weights, biases) or other tensor as fp32. */
static kvs_status st_tensor(kvs_model *m, st_set *set, const char *name, int nd, const uint64_t *dims, int required,
                            const float **out) {
    return st_tensor_as(m, set, name, nd, dims, required, out, NULL);
}

/* ---- config.json ---- */

static kvs_status cfg_int(const kvs_json *cfg, const char *key, int required, long dflt, long lo, long hi, int32_t *out) {
    const kvs_json *v = kvs_json_get(cfg, key);
    if (!v || kvs_json_type_of(v) == KVS_JSON_NULL) {
        if (required) return kvs_fail(KVS_ERR_FORMAT, "config.json: %s is missing", key);
        *out = (int32_t)dflt;
        return KVS_OK;
    }
    double d = kvs_json_number(v);
    if (kvs_json_type_of(v) != KVS_JSON_NUMBER || d != floor(d))
        return kvs_fail(KVS_ERR_FORMAT, "config.json: %s is not an integer", key);
    if (d < (double)lo || d > (double)hi)
        return kvs_fail(KVS_ERR_FORMAT, "config.json: %s (%.0f) is out of range [%ld, %ld]", key, d, lo, hi);
    *out = (int32_t)d;
    return KVS_OK;
}

static kvs_status cfg_num(const kvs_json *cfg, const char *key, double dflt, double lo, double hi, double *out) {
    const kvs_json *v = kvs_json_get(cfg, key);
    if (!v || kvs_json_type_of(v) == KVS_JSON_NULL) {
        *out = dflt;
        return KVS_OK;
    }
    if (kvs_json_type_of(v) != KVS_JSON_NUMBER) return kvs_fail(KVS_ERR_FORMAT, "config.json: %s is not a number", key);
    double d = kvs_json_number(v);
    if (!(d >= lo && d <= hi)) return kvs_fail(KVS_ERR_FORMAT, "config.json: %s (%g) is out of range [%g, %g]", key, d, lo, hi);
    *out = d;
    return KVS_OK;
}

static int cfg_bool(const kvs_json *cfg, const char *key, int dflt) {
    const kvs_json *v = kvs_json_get(cfg, key);
    return kvs_json_type_of(v) == KVS_JSON_BOOL ? kvs_json_bool(v) : dflt;
}

/* The text model's config: Gemma-3's multimodal configs nest it as text_config. */
static const kvs_json *hf_text_config(const kvs_json *cfg) {
    const kvs_json *tc = kvs_json_get(cfg, "text_config");
    return kvs_json_type_of(tc) == KVS_JSON_OBJECT ? tc : cfg;
}

static int is_gemma3_arch(const char *arch) {
    return !strcmp(arch, "Gemma3ForCausalLM") || !strcmp(arch, "Gemma3ForConditionalGeneration");
}

/* ---- Qwen3 and Gemma-3 ----
 * Facts of the Hugging Face modeling code (transformers qwen3 / gemma3) this follows:
 *  - Qwen3: q_norm / k_norm are RMSNorms over head_dim applied to every head of q and k after the projection
 *    and before RoPE; no q/k/v bias unless attention_bias; otherwise Llama.
 *  - Gemma-3: every RMSNorm multiplies by (1 + w) (computed in fp32); a layer is input_layernorm -> attention ->
 *    post_attention_layernorm -> residual add, then pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm
 *    -> residual add; q_norm / k_norm as Qwen3's but (1 + w); the MLP is down(gelu_tanh(gate(x)) * up(x)); the
 *    embedding is multiplied by sqrt(hidden_size) cast to the weights' dtype first (bf16: sqrt(640) = 25.30
 *    becomes 25.25, a 0.2% scale every real bf16 checkpoint computes with, so it is reproduced here); the softmax
 *    scale is query_pre_attn_scalar^-1/2; sliding layers (config layer_types "sliding_attention", else every
 *    layer but each sliding_window_pattern-th) attend to keys j with p - sliding_window < j <= p (the window
 *    counts the current token) and use RoPE base rope_local_base_freq without rope_scaling, full layers use
 *    rope_theta and rope_scaling; logits are soft-capped when final_logit_softcapping is set.
 * What the CPU path does not reproduce: the bf16 rounding of every intermediate (all compute here is fp32, as
 * for every other architecture). attn_logit_softcapping (Gemma-2) is refused: the recorded LSE and every
 * replay recompute plain scaled dot products. */
static kvs_status parse_qwen3_gemma3(kvs_model *m, const kvs_json *cfg, int gemma) {
    kvs_status s;
    kvs_model_info *info = &m->info;
    kvs_model_config *c = &info->config;
    info->qk_norm = 1;
    if (!gemma) {
        if (cfg_bool(cfg, "use_sliding_window", 0))
            return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: use_sliding_window true is not supported for Qwen3");
        return KVS_OK;
    }
    info->norm_plus_one = 1;
    info->sandwich_norm = 1;
    info->gelu_tanh = 1;
    const kvs_json *alc = kvs_json_get(cfg, "attn_logit_softcapping");
    if (alc && kvs_json_type_of(alc) != KVS_JSON_NULL)
        return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: attn_logit_softcapping is not supported (attention "
                        "records and replay assume plain scaled dot products)");
    double cap, qpas, local;
    if ((s = cfg_num(cfg, "final_logit_softcapping", 0, 0, 1e6, &cap)) != KVS_OK) return s;
    if ((s = cfg_num(cfg, "query_pre_attn_scalar", 256, 1e-6, 1e9, &qpas)) != KVS_OK) return s;
    if ((s = cfg_num(cfg, "rope_local_base_freq", 10000.0, 1, 1e12, &local)) != KVS_OK) return s;
    info->final_softcap = (float)cap;
    info->query_pre_attn_scalar = (float)qpas;
    info->rope_local_theta = (float)local;
    int32_t win, pattern;
    if ((s = cfg_int(cfg, "sliding_window", 0, 4096, 0, INT32_MAX, &win)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "sliding_window_pattern", 0, 6, 1, KVS_TRACE_MAX_LAYERS, &pattern)) != KVS_OK) return s;
    const kvs_json *types = kvs_json_get(cfg, "layer_types");
    if (types && kvs_json_type_of(types) != KVS_JSON_NULL &&
        (kvs_json_type_of(types) != KVS_JSON_ARRAY || kvs_json_len(types) != (size_t)c->n_layers))
        return kvs_fail(KVS_ERR_FORMAT, "config.json: layer_types is not an array of num_hidden_layers (%d) strings",
                        c->n_layers);
    for (int l = 0; l < c->n_layers; l++) {
        int sliding;
        if (kvs_json_type_of(types) == KVS_JSON_ARRAY) {
            const char *t = kvs_json_string(kvs_json_at(types, (size_t)l));
            if (t && !strcmp(t, "sliding_attention")) sliding = 1;
            else if (t && !strcmp(t, "full_attention")) sliding = 0;
            else return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: layer_types[%d] is \"%s\" (supported: "
                                 "sliding_attention, full_attention)", l, t ? t : "(not a string)");
        } else {
            sliding = (l + 1) % pattern != 0;
        }
        c->layer_window[l] = sliding ? win : 0;
    }
    info->sliding_window = win;
    return KVS_OK;
}

static kvs_status parse_hf_config(kvs_model *m, const kvs_json *cfg) {
    kvs_status s;
    kvs_model_info *info = &m->info;
    kvs_model_config *c = &info->config;
    if (kvs_json_type_of(cfg) != KVS_JSON_OBJECT) return kvs_fail(KVS_ERR_FORMAT, "config.json: not a JSON object");
    const char *arch = kvs_json_string(kvs_json_at(kvs_json_get(cfg, "architectures"), 0));
    if (!arch) {
        const char *mt = kvs_json_string(kvs_json_get(cfg, "model_type"));
        if (!mt) return kvs_fail(KVS_ERR_FORMAT, "config.json: neither architectures nor model_type is given");
        if (!strcmp(mt, "llama")) arch = "LlamaForCausalLM";
        else if (!strcmp(mt, "mistral")) arch = "MistralForCausalLM";
        else if (!strcmp(mt, "qwen2")) arch = "Qwen2ForCausalLM";
        else if (!strcmp(mt, "qwen3")) arch = "Qwen3ForCausalLM";
        else if (!strcmp(mt, "gemma3_text")) arch = "Gemma3ForCausalLM";
        else if (!strcmp(mt, "gemma3")) arch = "Gemma3ForConditionalGeneration";
        else return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: model_type \"%s\" is not supported (llama, mistral, "
                             "qwen2, qwen3, gemma3_text, gemma3)", mt);
    }
    int is_qwen2 = !strcmp(arch, "Qwen2ForCausalLM"), is_mistral = !strcmp(arch, "MistralForCausalLM");
    int is_qwen3 = !strcmp(arch, "Qwen3ForCausalLM"), is_gemma3 = is_gemma3_arch(arch);
    if (!is_qwen2 && !is_mistral && !is_qwen3 && !is_gemma3 && strcmp(arch, "LlamaForCausalLM"))
        return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: architectures[0] \"%s\" is not supported "
                        "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, "
                        "Gemma3ForConditionalGeneration)", arch);
    snprintf(info->architecture, sizeof info->architecture, "%s", arch);
    cfg = hf_text_config(cfg);
    const char *act = kvs_json_string(kvs_json_get(cfg, is_gemma3 ? "hidden_activation" : "hidden_act"));
    if (is_gemma3 && !act) act = kvs_json_string(kvs_json_get(cfg, "hidden_act"));
    const char *want_act = is_gemma3 ? "gelu_pytorch_tanh" : "silu";
    if (act && strcmp(act, want_act))
        return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: hidden activation \"%s\" is not supported for %s (%s)", act,
                        arch, want_act);
    if (cfg_bool(cfg, "mlp_bias", 0)) return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: mlp_bias true is not supported");
    if (is_qwen2 && cfg_bool(cfg, "use_sliding_window", 0))
        return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: use_sliding_window true is not supported");
    if ((s = cfg_int(cfg, "hidden_size", 1, 0, 1, 1 << 20, &c->dim)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "intermediate_size", 1, 0, 1, 1 << 22, &c->hidden_dim)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "num_hidden_layers", 1, 0, 1, KVS_TRACE_MAX_LAYERS, &c->n_layers)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "num_attention_heads", 1, 0, 1, KVS_TRACE_MAX_HEADS, &c->n_heads)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "num_key_value_heads", 0, c->n_heads, 1, KVS_TRACE_MAX_HEADS, &c->n_kv_heads)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "vocab_size", 1, 0, 1, 1 << 24, &c->vocab_size)) != KVS_OK) return s;
    if ((s = cfg_int(cfg, "max_position_embeddings", 1, 0, 1, 1 << 24, &c->max_seq_len)) != KVS_OK) return s;
    if (c->n_heads % c->n_kv_heads != 0)
        return kvs_fail(KVS_ERR_FORMAT, "config.json: num_key_value_heads (%d) does not divide num_attention_heads (%d)",
                        c->n_kv_heads, c->n_heads);
    const kvs_json *hdj = kvs_json_get(cfg, "head_dim");
    if (hdj && kvs_json_type_of(hdj) != KVS_JSON_NULL) {
        if ((s = cfg_int(cfg, "head_dim", 1, 0, 1, KVS_TRACE_MAX_HEAD_DIM, &c->head_dim)) != KVS_OK) return s;
    } else {
        if (c->dim % c->n_heads != 0)
            return kvs_fail(KVS_ERR_FORMAT, "config.json: num_attention_heads (%d) does not divide hidden_size (%d)",
                            c->n_heads, c->dim);
        c->head_dim = c->dim / c->n_heads;
    }
    double eps, theta;
    if ((s = cfg_num(cfg, "rms_norm_eps", 1e-6, 0, 1, &eps)) != KVS_OK) return s;
    if ((s = cfg_num(cfg, "rope_theta", is_gemma3 ? 1e6 : 10000.0, 1, 1e12, &theta)) != KVS_OK) return s;
    c->norm_eps = (float)eps;
    c->rope_theta = (float)theta;
    c->rope_layout = KVS_ROPE_HALVES;
    if (is_mistral) {
        /* Mistral's sliding window equals full attention as long as the sequence fits inside it, so the
         * capture is limited to the window instead of implementing the band mask. */
        int32_t win;
        if ((s = cfg_int(cfg, "sliding_window", 0, 0, 0, INT32_MAX, &win)) != KVS_OK) return s;
        if (win > 0 && win < c->max_seq_len) c->max_seq_len = win;
    }
    const kvs_json *rs = kvs_json_get(cfg, "rope_scaling");
    if (rs && kvs_json_type_of(rs) != KVS_JSON_NULL) {
        if (kvs_json_type_of(rs) != KVS_JSON_OBJECT) return kvs_fail(KVS_ERR_FORMAT, "config.json: rope_scaling is not an object");
        const char *rt = kvs_json_string(kvs_json_get(rs, "rope_type"));
        if (!rt) rt = kvs_json_string(kvs_json_get(rs, "type"));
        if (!rt) return kvs_fail(KVS_ERR_FORMAT, "config.json: rope_scaling has no rope_type");
        if (!strcmp(rt, "llama3")) {
            double f, lo, hi;
            int32_t orig;
            /* cfg_num/cfg_int messages name the key; the keys below only occur inside rope_scaling */
            if ((s = cfg_num(rs, "factor", NAN, 1, 1e6, &f)) != KVS_OK) return s;
            if (isnan(f)) return kvs_fail(KVS_ERR_FORMAT, "config.json: rope_scaling.factor is missing");
            if ((s = cfg_num(rs, "low_freq_factor", 1.0, 1e-6, 1e6, &lo)) != KVS_OK) return s;
            if ((s = cfg_num(rs, "high_freq_factor", 4.0, 1e-6, 1e6, &hi)) != KVS_OK) return s;
            if ((s = cfg_int(rs, "original_max_position_embeddings", 0, 8192, 1, 1 << 24, &orig)) != KVS_OK) return s;
            if (!(hi > lo))
                return kvs_fail(KVS_ERR_FORMAT, "config.json: rope_scaling.high_freq_factor (%g) must exceed low_freq_factor (%g)", hi, lo);
            info->rope_llama3 = 1;
            info->rope_factor = (float)f;
            info->rope_low_freq_factor = (float)lo;
            info->rope_high_freq_factor = (float)hi;
            info->rope_original_max_pos = orig;
        } else if (!strcmp(rt, "linear")) {
            /* positions divided by factor = every frequency divided by it (Gemma-3 4B+: full layers only) */
            double f;
            if ((s = cfg_num(rs, "factor", NAN, 1, 1e6, &f)) != KVS_OK) return s;
            if (isnan(f)) return kvs_fail(KVS_ERR_FORMAT, "config.json: rope_scaling.factor is missing");
            info->rope_linear_factor = (float)f;
        } else if (strcmp(rt, "default")) {
            return kvs_fail(KVS_ERR_UNSUPPORTED, "config.json: rope_scaling type \"%s\" is not supported (llama3, "
                            "linear, default)", rt);
        }
    }
    if ((is_qwen3 || is_gemma3) && (s = parse_qwen3_gemma3(m, cfg, is_gemma3)) != KVS_OK) return s;
    info->qkv_bias = is_qwen2 || cfg_bool(cfg, "attention_bias", 0);
    info->o_bias = !is_qwen2 && cfg_bool(cfg, "attention_bias", 0);
    int32_t bos;
    if ((s = cfg_int(cfg, "bos_token_id", 0, -1, -1, c->vocab_size - 1, &bos)) != KVS_OK) return s;
    info->bos_id = bos;
    const kvs_json *eos = kvs_json_get(cfg, "eos_token_id");
    if (kvs_json_type_of(eos) == KVS_JSON_ARRAY) {
        for (size_t i = 0; i < kvs_json_len(eos) && info->n_eos < KVS_MODEL_MAX_EOS; i++) {
            double d = kvs_json_number(kvs_json_at(eos, i));
            if (kvs_json_type_of(kvs_json_at(eos, i)) != KVS_JSON_NUMBER || d != floor(d) || d < 0 || d >= c->vocab_size)
                return kvs_fail(KVS_ERR_FORMAT, "config.json: eos_token_id[%zu] is not a token id", i);
            info->eos_ids[info->n_eos++] = (int32_t)d;
        }
    } else if (eos && kvs_json_type_of(eos) != KVS_JSON_NULL) {
        int32_t e;
        if ((s = cfg_int(cfg, "eos_token_id", 1, 0, 0, c->vocab_size - 1, &e)) != KVS_OK) return s;
        info->eos_ids[info->n_eos++] = e;
    }
    info->format = KVS_MODEL_HF;
    return KVS_OK;
}

/* Where the text model's tensors live: "model." (every *ForCausalLM); a multimodal Gemma-3 checkpoint nests them
 * under "language_model.model." (transformers < 4.52) or "model.language_model." (later). */
static const char *hf_weight_prefix(st_set *set, const char *arch) {
    if (strcmp(arch, "Gemma3ForConditionalGeneration")) return "model.";
    static const char *const cands[] = {"language_model.model.", "model.language_model.", "model."};
    for (size_t i = 0; i < sizeof cands / sizeof cands[0]; i++) {
        char name[96];
        st_file *f;
        const kvs_json *e;
        snprintf(name, sizeof name, "%sembed_tokens.weight", cands[i]);
        st_find(set, name, &f, &e);
        if (f) return cands[i];
    }
    return "model.";
}

/* A heap copy of norm vector *w (n floats) holding 1 + w: Gemma's RMSNorm scales by (1 + w) in fp32, so after
 * this every norm is the plain w * x / rms(x) of rmsnorm(). */
static kvs_status plus_one(kvs_model *m, const float **w, size_t n) {
    float *o = malloc(n * sizeof *o);
    if (!o) return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
    for (size_t i = 0; i < n; i++) o[i] = 1.0f + (*w)[i];
    kvs_status s = add_owned(m, o);
    if (s != KVS_OK) return s;
    *w = o;
    return KVS_OK;
}

/* The norms only Qwen3 (q/k) and Gemma-3 (q/k, pre/post FFN) have, then Gemma's (1 + w) on every norm. */
static kvs_status load_arch_layer_norms(kvs_model *m, st_set *set, const char *pfx, int l, layer_weights *w) {
    const kvs_model_config *c = &m->info.config;
    uint64_t vhd[1] = {(uint64_t)c->head_dim}, vd[1] = {(uint64_t)c->dim};
    char name[256];
    kvs_status s;
    if (m->info.qk_norm) {
        snprintf(name, sizeof name, "%slayers.%d.self_attn.q_norm.weight", pfx, l);
        if ((s = st_tensor(m, set, name, 1, vhd, 1, &w->q_norm)) != KVS_OK) return s;
        snprintf(name, sizeof name, "%slayers.%d.self_attn.k_norm.weight", pfx, l);
        if ((s = st_tensor(m, set, name, 1, vhd, 1, &w->k_norm)) != KVS_OK) return s;
    }
    if (!m->info.sandwich_norm) return KVS_OK;
    snprintf(name, sizeof name, "%slayers.%d.pre_feedforward_layernorm.weight", pfx, l);
    if ((s = st_tensor(m, set, name, 1, vd, 1, &w->rms_ffn)) != KVS_OK) return s;
    snprintf(name, sizeof name, "%slayers.%d.post_feedforward_layernorm.weight", pfx, l);
    if ((s = st_tensor(m, set, name, 1, vd, 1, &w->rms_post_ffn)) != KVS_OK) return s;
    if (!m->info.norm_plus_one) return KVS_OK;
    const float **dn[] = {&w->rms_att, &w->rms_post_att, &w->rms_ffn, &w->rms_post_ffn};
    for (size_t i = 0; i < sizeof dn / sizeof dn[0]; i++)
        if ((s = plus_one(m, dn[i], (size_t)c->dim)) != KVS_OK) return s;
    if ((s = plus_one(m, &w->q_norm, (size_t)c->head_dim)) != KVS_OK) return s;
    return plus_one(m, &w->k_norm, (size_t)c->head_dim);
}

/* Gemma's final norm (1 + w) and embedding scale: sqrt(hidden_size) cast to the embedding's dtype, as HF casts
 * embed_scale to the weight dtype before multiplying. */
static kvs_status gemma_finish(kvs_model *m) {
    m->info.embed_scale = 1.0f;
    if (!m->info.norm_plus_one) return KVS_OK;
    double sc = sqrt((double)m->info.config.dim);
    kvs_dtype dt = m->info.weight_dtype;
    if (dt == KVS_DTYPE_BF16 || dt == KVS_DTYPE_F16) {
        float f = (float)sc, back;
        uint8_t b[4];
        kvs_encode(dt, &f, 1, b);
        kvs_decode(dt, b, 1, &back);
        m->info.embed_scale = back;
    } else {
        m->info.embed_scale = (float)sc;
    }
    return plus_one(m, &m->rms_final, (size_t)m->info.config.dim);
}

static kvs_status load_hf(kvs_model *m, const char *dir) {
    char path[4096];
    char *text = NULL;
    size_t len;
    kvs_json *cfg = NULL;
    st_set set = {.dir = dir};
    kvs_status s;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((s = kvs_read_file(path, &text, &len)) != KVS_OK) goto cleanup;
    char pre[4200];
    if ((s = kvs_json_parse(text, len, &cfg)) != KVS_OK) {
        snprintf(pre, sizeof pre, "%s: ", path);
        s = prefix_error(s, pre);
        goto cleanup;
    }
    if ((s = parse_hf_config(m, cfg)) != KVS_OK) {
        snprintf(pre, sizeof pre, "%s/", dir); /* the detail starts with "config.json: " */
        s = prefix_error(s, pre);
        goto cleanup;
    }
    /* weights: one file, or an index of shards */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct stat st;
    if (stat(path, &st) == 0) {
        set.files = calloc(1, sizeof *set.files);
        if (!set.files) { s = kvs_fail(KVS_ERR_NOMEM, "model: out of memory"); goto cleanup; }
        set.n_files = 1;
        snprintf(set.files[0].path, sizeof set.files[0].path, "%s", path);
        if ((s = st_open(m, &set.files[0])) != KVS_OK) goto cleanup;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        free(text);
        text = NULL;
        if (stat(path, &st) != 0) {
            s = kvs_fail(KVS_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json exists", dir);
            goto cleanup;
        }
        if ((s = kvs_read_file(path, &text, &len)) != KVS_OK) goto cleanup;
        if ((s = kvs_json_parse(text, len, &set.index)) != KVS_OK) {
            snprintf(pre, sizeof pre, "%s: ", path);
            s = prefix_error(s, pre);
            goto cleanup;
        }
        const kvs_json *wm = kvs_json_get(set.index, "weight_map");
        if (kvs_json_type_of(wm) != KVS_JSON_OBJECT || kvs_json_len(wm) == 0) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: weight_map is missing or empty", path);
            goto cleanup;
        }
        set.files = calloc(kvs_json_len(wm), sizeof *set.files);
        if (!set.files) { s = kvs_fail(KVS_ERR_NOMEM, "model: out of memory"); goto cleanup; }
        for (size_t i = 0; i < kvs_json_len(wm); i++) {
            const char *shard = kvs_json_string(kvs_json_at(wm, i));
            if (!shard || !shard[0] || strchr(shard, '/') || !strcmp(shard, "..")) {
                s = kvs_fail(KVS_ERR_FORMAT, "%s: weight_map[\"%s\"] is not a file name in the folder", path,
                             kvs_json_key_at(wm, i));
                goto cleanup;
            }
            int seen = 0;
            for (int j = 0; j < set.n_files && !seen; j++) seen = !strcmp(strrchr(set.files[j].path, '/') + 1, shard);
            if (seen) continue;
            st_file *f = &set.files[set.n_files++];
            snprintf(f->path, sizeof f->path, "%s/%s", dir, shard);
            if ((s = st_open(m, f)) != KVS_OK) goto cleanup;
        }
    }

    kvs_model_config *c = &m->info.config;
    uint64_t d = (uint64_t)c->dim, hd = (uint64_t)c->head_dim, qd = (uint64_t)c->n_heads * hd;
    uint64_t kvd = (uint64_t)c->n_kv_heads * hd, hid = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    int gemma = m->info.sandwich_norm;
    int tie = cfg_bool(hf_text_config(cfg), "tie_word_embeddings", cfg_bool(cfg, "tie_word_embeddings", gemma));
    uint64_t emb_shape[2] = {V, d};
    const char *pfx = hf_weight_prefix(&set, m->info.architecture); /* "model." but for multimodal Gemma-3 */
    char lm_head[96];
    snprintf(lm_head, sizeof lm_head, "%s", strcmp(pfx, "language_model.model.") ? "lm_head.weight"
                                                                                : "language_model.lm_head.weight");
    char tname[256];
    snprintf(tname, sizeof tname, "%sembed_tokens.weight", pfx);
    if ((s = st_tensor_as(m, &set, tname, 2, emb_shape, !tie, NULL, &m->embed)) != KVS_OK) goto cleanup;
    if (tie) {
        if (!m->embed.data &&
            (s = st_tensor_as(m, &set, lm_head, 2, emb_shape, 0, NULL, &m->embed)) != KVS_OK) goto cleanup;
        if (!m->embed.data) {
            s = kvs_fail(KVS_ERR_FORMAT, "%s: tensor model.embed_tokens.weight is missing (tie_word_embeddings: "
                         "lm_head.weight absent too)", dir);
            goto cleanup;
        }
        m->cls = m->embed;
    } else if ((s = st_tensor_as(m, &set, lm_head, 2, emb_shape, 1, NULL, &m->cls)) != KVS_OK) {
        goto cleanup;
    }
    uint64_t vec_d[1] = {d};
    snprintf(tname, sizeof tname, "%snorm.weight", pfx);
    if ((s = st_tensor(m, &set, tname, 1, vec_d, 1, &m->rms_final)) != KVS_OK) goto cleanup;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) { s = kvs_fail(KVS_ERR_NOMEM, "model: out of memory"); goto cleanup; }
    for (int l = 0; l < c->n_layers; l++) {
        layer_weights *w = &m->layers[l];
        char name[256];
        uint64_t sq[2] = {qd, d}, skv[2] = {kvd, d}, so[2] = {d, qd}, sup[2] = {hid, d}, sdown[2] = {d, hid};
        uint64_t bq[1] = {qd}, bkv[1] = {kvd};
        struct {
            const char *suffix;
            int nd;
            const uint64_t *dims;
            const float **dst;
            int required;
            kvs_wmat *mat; /* matrices: kept as stored (dst NULL) */
        } tensors[] = {
            {"input_layernorm.weight", 1, vec_d, &w->rms_att, 1, NULL},
            /* Gemma-3's post_attention_layernorm normalises the attention output; its FFN input norm is
             * pre_feedforward_layernorm (load_arch_layer_norms) */
            {"post_attention_layernorm.weight", 1, vec_d, gemma ? &w->rms_post_att : &w->rms_ffn, 1, NULL},
            {"self_attn.q_proj.weight", 2, sq, NULL, 1, &w->wq},
            {"self_attn.k_proj.weight", 2, skv, NULL, 1, &w->wk},
            {"self_attn.v_proj.weight", 2, skv, NULL, 1, &w->wv},
            {"self_attn.o_proj.weight", 2, so, NULL, 1, &w->wo},
            {"mlp.gate_proj.weight", 2, sup, NULL, 1, &w->w1},
            {"mlp.down_proj.weight", 2, sdown, NULL, 1, &w->w2},
            {"mlp.up_proj.weight", 2, sup, NULL, 1, &w->w3},
            {"self_attn.q_proj.bias", 1, bq, &w->bq, m->info.qkv_bias, NULL},
            {"self_attn.k_proj.bias", 1, bkv, &w->bk, m->info.qkv_bias, NULL},
            {"self_attn.v_proj.bias", 1, bkv, &w->bv, m->info.qkv_bias, NULL},
            {"self_attn.o_proj.bias", 1, vec_d, &w->bo, m->info.o_bias, NULL},
        };
        for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
            if (i >= 9 && !tensors[i].required) continue; /* biases the config does not announce are ignored */
            snprintf(name, sizeof name, "%slayers.%d.%s", pfx, l, tensors[i].suffix);
            if ((s = st_tensor_as(m, &set, name, tensors[i].nd, tensors[i].dims, tensors[i].required, tensors[i].dst,
                                  tensors[i].mat)) != KVS_OK)
                goto cleanup;
        }
        if ((s = load_arch_layer_norms(m, &set, pfx, l, w)) != KVS_OK) goto cleanup;
    }
    if ((s = gemma_finish(m)) != KVS_OK) goto cleanup;
    s = finish_config(m, dir);
cleanup:
    st_set_free(&set);
    kvs_json_free(cfg);
    free(text);
    return s;
}

/* Packs one 16-bit matrix into panels (matmul.h: the products read only those), then drops the mapped source pages
 * it spans: they were faulted in by the copy and would otherwise double the resident size. The mapping stays valid
 * (a later read of kvs_model_weights_get's row-major matrix, or an embedding row of a tied classifier, faults the
 * page back from the file). */
static kvs_status pack_matrix(kvs_model *m, kvs_wmat *w, int rows, int cols) {
    if (w->packed || (w->dtype != KVS_DTYPE_BF16 && w->dtype != KVS_DTYPE_F16)) return KVS_OK;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)w->data;
    uintptr_t lo = (a + page - 1) & ~(page - 1), hi = (a + (uintptr_t)rows * (uintptr_t)cols * 2u) & ~(page - 1);
#ifdef MADV_POPULATE_READ
    /* map the tensor's pages in one call rather than one fault per 64 KB (best effort: older kernels refuse) */
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_POPULATE_READ);
#endif
    kvs_status s = kvs_wmat_pack(w, rows, cols);
    if (s != KVS_OK) return s;
    if ((s = add_owned(m, (void *)(uintptr_t)w->packed)) != KVS_OK) {
        w->packed = NULL; /* add_owned freed it */
        return s;
    }
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED); /* only pages wholly inside this tensor */
    return KVS_OK;
}

/* Packs every 16-bit matrix of the forward pass (not the embedding: it is read a row per token). */
static kvs_status pack_matrices(kvs_model *m) {
    const kvs_model_config *c = &m->info.config;
    int d = c->dim, hid = c->hidden_dim, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    kvs_status s = pack_matrix(m, &m->cls, c->vocab_size, d);
    /* a tied embedding reads its rows from the classifier's panels (kvs_wmat_row_f32): the pages just dropped
     * would otherwise be faulted back, 64 KB of read-around a token, up to the whole table again */
    if (s == KVS_OK && m->embed.data == m->cls.data) m->embed.packed = m->cls.packed;
    for (int l = 0; s == KVS_OK && l < c->n_layers; l++) {
        layer_weights *w = &m->layers[l];
        if ((s = pack_matrix(m, &w->wq, qd, d)) != KVS_OK || (s = pack_matrix(m, &w->wk, kvd, d)) != KVS_OK ||
            (s = pack_matrix(m, &w->wv, kvd, d)) != KVS_OK || (s = pack_matrix(m, &w->wo, d, qd)) != KVS_OK ||
            (s = pack_matrix(m, &w->w1, hid, d)) != KVS_OK || (s = pack_matrix(m, &w->w2, d, hid)) != KVS_OK)
            break;
        s = pack_matrix(m, &w->w3, hid, d);
    }
    return s;
}

kvs_status kvs_model_load(const char *path, kvs_model **out) {
    *out = NULL;
    struct stat st;
    if (!path || !path[0]) return kvs_fail(KVS_ERR_INVALID_ARG, "model: empty path");
    if (stat(path, &st) != 0) return kvs_fail(KVS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    kvs_model *m = calloc(1, sizeof *m);
    if (!m) return kvs_fail(KVS_ERR_NOMEM, "model: out of memory");
    pthread_mutex_init(&m->pack_mu, NULL);
    m->info.bos_id = -1;
    m->info.embed_scale = 1.0f;
    kvs_status s = S_ISDIR(st.st_mode) ? load_hf(m, path) : load_llama2c(m, path);
    if (s != KVS_OK) {
        kvs_model_free(m);
        return s;
    }
    char name[KVS_TRACE_NAME_MAX];
    base_name(path, name, sizeof name);
    if (S_ISREG(st.st_mode)) {
        char *dot = strrchr(name, '.');
        if (dot && dot != name && !strcmp(dot, ".bin")) *dot = '\0';
    }
    memcpy(m->info.config.model_name, name, sizeof name);
    *out = m;
    return KVS_OK;
}

/* ================================================================================================
 * Forward pass
 * ============================================================================================== */

struct kvs_model_state {
    const kvs_model *m;
    kvs_threadpool *pool;
    int max_pos;
    int last_pos;  /* last forwarded position, -1 before the first */
    float *x;      /* [dim] residual stream */
    float *xb;     /* [max(dim, q_dim)] normalised input / attention output staging */
    float *xb2;    /* [dim] */
    float *hb, *hb2; /* [hidden] */
    float *logits; /* [vocab] */
    float *q_rec;  /* [n_layers][n_heads*head_dim] post-RoPE q of the last position */
    float *o_rec;  /* [n_layers][n_heads*head_dim] attention outputs of the last position */
    float *lse_rec;/* [n_layers][n_heads] */
    float *kcache, *vcache; /* [n_layers][max_pos][n_kv_heads*head_dim] */
    float *att;    /* [n_heads][max_pos] attention probabilities scratch */
    kvs_model_attn_fn attn_fn; /* attention override (closed-loop decoding), NULL = full causal attention */
    void *attn_user;
    struct block_ws *blk; /* kvs_model_forward_block's workspace, allocated on its first call */
};

/* Workspace of a block of up to KVS_MODEL_BLOCK positions: row i is position pos0 + i. The rows a matrix product
 * reads (xb, hb, o_rec) are a cache line longer than their data: rows a multiple of 4 KB apart would all fall into
 * the same L1 sets (0.75x the product's speed at dim 2048). */
struct block_ws {
    int pos0, n;     /* the last block's positions (n = 0: the last forward was kvs_model_forward) */
    int n_workers;
    size_t ldd, ldh, ldrec; /* row strides of xb, hb/hb2, q_rec/o_rec */
    float *x;        /* [B][dim] residual streams */
    float *xb;       /* [B][ldd] normalised inputs */
    float *xb2;      /* [B][dim] projection outputs */
    float *hb, *hb2; /* [B][ldh] */
    float *q_rec;    /* [B][ldrec]: [n_layers][q_dim] post-RoPE queries a position */
    float *o_rec;    /* [B][ldrec]: [n_layers][q_dim] attention outputs a position */
    float *lse_rec;  /* [B][n_layers][n_heads] */
    /* attention scratch, per worker: a KV head's key and value rows made contiguous ([max_pos][head_dim] each),
     * the queries of an attention tile ([ATT_TILE][group][head_dim]), its probability rows
     * ([ATT_TILE * group][max_pos]), row pointers and LSEs */
    float *kh, *vh, *qt, *probs;
    float **prow, **orow;
    double *lse;
    int tile_rows;   /* ATT_TILE * group */
};

/* Positions per attention tile: (KV head, tile) pairs are the parallel tasks. */
#define ATT_TILE 32

static void block_ws_free(struct block_ws *b) {
    if (!b) return;
    free(b->x);
    free(b->xb);
    free(b->xb2);
    free(b->hb);
    free(b->hb2);
    free(b->q_rec);
    free(b->o_rec);
    free(b->lse_rec);
    free(b->kh);
    free(b->vh);
    free(b->qt);
    free(b->probs);
    free(b->prow);
    free(b->orow);
    free(b->lse);
    free(b);
}

void kvs_model_state_set_attn(kvs_model_state *s, kvs_model_attn_fn fn, void *user) {
    s->attn_fn = fn;
    s->attn_user = user;
}

void kvs_model_state_free(kvs_model_state *s) {
    if (!s) return;
    free(s->x);
    free(s->xb);
    free(s->xb2);
    free(s->hb);
    free(s->hb2);
    free(s->logits);
    free(s->q_rec);
    free(s->o_rec);
    free(s->lse_rec);
    free(s->kcache);
    free(s->vcache);
    free(s->att);
    block_ws_free(s->blk);
    free(s);
}

kvs_status kvs_model_state_create(const kvs_model *m, int max_positions, kvs_threadpool *pool, kvs_model_state **out) {
    *out = NULL;
    const kvs_model_config *c = &m->info.config;
    if (max_positions < 1 || max_positions > c->max_seq_len)
        return kvs_fail(KVS_ERR_INVALID_ARG, "max positions %d is outside [1, %d] (the model context)", max_positions,
                        c->max_seq_len);
    /* The panels: once per model (a state's forward pass reads only them). Changing the const model here is safe:
     * the packed copy holds the same values, and no forward pass can run before its state exists. */
    kvs_model *mm = (kvs_model *)(uintptr_t)m;
    pthread_mutex_lock(&mm->pack_mu);
    kvs_status ps = mm->packed ? KVS_OK : pack_matrices(mm);
    if (ps == KVS_OK) mm->packed = 1;
    pthread_mutex_unlock(&mm->pack_mu);
    if (ps != KVS_OK) return ps;
    kvs_model_state *s = calloc(1, sizeof *s);
    if (!s) return kvs_fail(KVS_ERR_NOMEM, "model state: out of memory");
    s->m = m;
    s->pool = pool;
    s->max_pos = max_positions;
    s->last_pos = -1;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t L = (size_t)c->n_layers, d = (size_t)c->dim;
    size_t cache = L * (size_t)max_positions * kvd;
    s->x = malloc(d * sizeof(float));
    s->xb = malloc((d > qd ? d : qd) * sizeof(float));
    s->xb2 = malloc(d * sizeof(float));
    s->hb = malloc((size_t)c->hidden_dim * sizeof(float));
    s->hb2 = malloc((size_t)c->hidden_dim * sizeof(float));
    s->logits = malloc((size_t)c->vocab_size * sizeof(float));
    s->q_rec = malloc(L * qd * sizeof(float));
    s->o_rec = malloc(L * qd * sizeof(float));
    s->lse_rec = malloc(L * (size_t)c->n_heads * sizeof(float));
    s->kcache = calloc(cache, sizeof(float));
    s->vcache = calloc(cache, sizeof(float));
    s->att = malloc((size_t)c->n_heads * (size_t)max_positions * sizeof(float));
    if (!s->x || !s->xb || !s->xb2 || !s->hb || !s->hb2 || !s->logits || !s->q_rec || !s->o_rec || !s->lse_rec ||
        !s->kcache || !s->vcache || !s->att) {
        kvs_model_state_free(s);
        return kvs_fail(KVS_ERR_NOMEM, "model state: out of memory for %d positions (KV cache %zu MB)", max_positions,
                        cache * 2 * sizeof(float) >> 20);
    }
    *out = s;
    return KVS_OK;
}

static void rmsnorm(float *o, const float *x, const float *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) o[i] = w[i] * (x[i] * inv);
}


/* RoPE on one head vector. Adjacent layout (llama2.c): pairs (2i, 2i+1); halves (HF rotate_half):
 * pairs (i, i + d/2); pair i turns by pos * inv_freq[i] in both. */
static void rope(float *v, int d, int layout, const float *cosv, const float *sinv) {
    int half = d / 2;
    for (int i = 0; i < half; i++) {
        int a = layout == KVS_ROPE_ADJACENT ? 2 * i : i, b = layout == KVS_ROPE_ADJACENT ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cosv[i] - x1 * sinv[i];
        v[b] = x0 * sinv[i] + x1 * cosv[i];
    }
}

typedef struct {
    kvs_model_state *s;
    int layer, pos;
} attn_job;

/* First position a layer attends to from position `pos`: pos + 1 - window for a sliding layer past its window
 * (HF: key j is visible iff pos - window < j <= pos), else 0. */
static int64_t window_first(const kvs_model_config *c, int layer, int pos) {
    int32_t w = kvs_model_config_window(c, layer);
    return w > 0 && pos + 1 > w ? (int64_t)pos + 1 - w : 0;
}

/* Per-head RMSNorm of n vectors of head_dim (Qwen3 / Gemma-3 q_norm, k_norm), in place. */
static void head_norms(float *v, int n, int hd, const float *w, float eps) {
    for (int h = 0; h < n; h++) rmsnorm(v + (size_t)h * hd, v + (size_t)h * hd, w, hd, eps);
}

/* The FFN gate activation times up: SiLU (Llama family) or gelu_pytorch_tanh (Gemma's GeGLU). */
static void gate_act(float *g, const float *up, int n, int gelu_tanh) {
    if (!gelu_tanh) {
        for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * up[i]; /* SiLU(gate) * up */
        return;
    }
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    for (int i = 0; i < n; i++) {
        double x = g[i];
        g[i] = (float)(0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)))) * up[i];
    }
}

/* gate_act over the rows of a block, split among the pool's workers (an element's value does not depend on the
 * split: the same bits as kvs_model_forward's call). Run serially it would cost a few % of the prefill's wall time
 * on 2 cores. */
typedef struct {
    float *g;
    const float *up;
    size_t ld;
    int n, hid, gelu_tanh;
} gate_job;

static void gate_worker(void *ctx, int worker, int n_workers) {
    const gate_job *j = ctx;
    for (int i = j->n * worker / n_workers; i < j->n * (worker + 1) / n_workers; i++)
        gate_act(j->g + (size_t)i * j->ld, j->up + (size_t)i * j->ld, j->hid, j->gelu_tanh);
}

/* Gemma-3's norm of a branch output before the residual add (post_attention / post_feedforward), in place. */
static void branch_norm(float *x, const float *w, int d, float eps) {
    if (w) rmsnorm(x, x, w, d, eps);
}

static void attn_worker(void *ctx, int worker, int n_workers) {
    const attn_job *job = ctx;
    kvs_model_state *s = job->s;
    const kvs_model_config *c = &s->m->info.config;
    int H = c->n_heads, hd = c->head_dim, G = c->n_heads / c->n_kv_heads, kvd = c->n_kv_heads * c->head_dim;
    size_t lq = (size_t)job->layer * (size_t)H * (size_t)hd;
    const float *kc = s->kcache + (size_t)job->layer * (size_t)s->max_pos * (size_t)kvd;
    const float *vc = s->vcache + (size_t)job->layer * (size_t)s->max_pos * (size_t)kvd;
    int64_t first = window_first(c, job->layer, job->pos);
    kc += (size_t)first * (size_t)kvd;
    vc += (size_t)first * (size_t)kvd;
    for (int h = H * worker / n_workers; h < H * (worker + 1) / n_workers; h++) {
        int kvh = h / G;
        double lse = kvs_attention(s->q_rec + lq + (size_t)h * hd, kc + (size_t)kvh * hd, vc + (size_t)kvh * hd,
                                   (size_t)kvd, NULL, (size_t)(job->pos + 1 - first), (size_t)hd, c->attn_scale,
                                   s->att + (size_t)h * (size_t)s->max_pos, s->o_rec + lq + (size_t)h * hd);
        s->lse_rec[(size_t)job->layer * H + h] = (float)lse;
    }
}

kvs_status kvs_model_forward(kvs_model_state *s, int32_t token, int pos, const float **logits) {
    const kvs_model *m = s->m;
    const kvs_model_config *c = &m->info.config;
    if (token < 0 || token >= c->vocab_size)
        return kvs_fail(KVS_ERR_RANGE, "token id %d is outside the vocabulary [0, %d)", token, c->vocab_size);
    if (pos < 0 || pos >= s->max_pos)
        return kvs_fail(KVS_ERR_RANGE, "position %d is outside [0, %d)", pos, s->max_pos);
    if (pos > s->last_pos + 1)
        return kvs_fail(KVS_ERR_STATE, "position %d fed before position %d", pos, s->last_pos + 1);
    if (s->blk) s->blk->n = 0; /* the records are this position's again */
    int d = c->dim, hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads, hid = c->hidden_dim;
    int qd = H * hd, kvd = Hkv * hd;
    kvs_wmat_row_f32(m->embed, (size_t)d, (size_t)token, s->x);
    if (m->info.embed_scale != 1.0f)
        for (int i = 0; i < d; i++) s->x[i] *= m->info.embed_scale;

    /* [0] full-attention layers' table, [1] sliding layers' when they have their own base (Gemma-3) */
    float cosv[2][KVS_TRACE_MAX_HEAD_DIM / 2], sinv[2][KVS_TRACE_MAX_HEAD_DIM / 2];
    for (int t = 0; t < (m->inv_freq_local ? 2 : 1); t++) {
        const float *f = t ? m->inv_freq_local : m->inv_freq;
        for (int i = 0; i < hd / 2; i++) {
            double ang = (double)pos * (double)f[i];
            cosv[t][i] = (float)cos(ang);
            sinv[t][i] = (float)sin(ang);
        }
    }

    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights *w = &m->layers[l];
        float *q = s->q_rec + (size_t)l * (size_t)qd;
        float *k = s->kcache + ((size_t)l * (size_t)s->max_pos + (size_t)pos) * (size_t)kvd;
        float *v = s->vcache + ((size_t)l * (size_t)s->max_pos + (size_t)pos) * (size_t)kvd;

        rmsnorm(s->xb, s->x, w->rms_att, d, c->norm_eps);
        kvs_gemm_out qkv[3] = {{w->wq, w->bq, q, 0, qd}, {w->wk, w->bk, k, 0, kvd}, {w->wv, w->bv, v, 0, kvd}};
        kvs_gemm_multi(s->pool, s->xb, 0, 1, d, qkv, 3);
        if (w->q_norm) head_norms(q, H, hd, w->q_norm, c->norm_eps);
        if (w->k_norm) head_norms(k, Hkv, hd, w->k_norm, c->norm_eps);
        int t = m->inv_freq_local && kvs_model_config_window(c, l) > 0;
        for (int h = 0; h < H; h++) rope(q + (size_t)h * hd, hd, c->rope_layout, cosv[t], sinv[t]);
        for (int h = 0; h < Hkv; h++) rope(k + (size_t)h * hd, hd, c->rope_layout, cosv[t], sinv[t]);

        if (s->attn_fn && window_first(c, l, pos) > 0) {
            /* the hook's contract is causal attention over positions 0..pos: equal to the window's until the
             * sequence outgrows it */
            return kvs_fail(KVS_ERR_UNSUPPORTED, "layer %d has a %d-position sliding window: an attention override "
                            "(closed-loop decoding) supports full-attention layers only", l,
                            kvs_model_config_window(c, l));
        } else if (s->attn_fn) {
            size_t lc = (size_t)l * (size_t)s->max_pos * (size_t)kvd;
            kvs_status st = s->attn_fn(s->attn_user, l, pos, q, s->kcache + lc, s->vcache + lc, (size_t)kvd,
                                       s->o_rec + (size_t)l * (size_t)qd, s->lse_rec + (size_t)l * (size_t)H);
            if (st != KVS_OK) return st;
        } else {
            attn_job aj = {s, l, pos};
            if ((long)(pos + 1) * qd < 32768) attn_worker(&aj, 0, 1);
            else kvs_threadpool_run(s->pool, attn_worker, &aj);
        }

        kvs_gemm(s->pool, s->o_rec + (size_t)l * (size_t)qd, 0, 1, qd, w->wo, w->bo, d, s->xb2, 0);
        branch_norm(s->xb2, w->rms_post_att, d, c->norm_eps);
        for (int i = 0; i < d; i++) s->x[i] += s->xb2[i];

        rmsnorm(s->xb, s->x, w->rms_ffn, d, c->norm_eps);
        kvs_gemm_out ffn[2] = {{w->w1, NULL, s->hb, 0, hid}, {w->w3, NULL, s->hb2, 0, hid}};
        kvs_gemm_multi(s->pool, s->xb, 0, 1, d, ffn, 2);
        gate_act(s->hb, s->hb2, hid, m->info.gelu_tanh);
        kvs_gemm(s->pool, s->hb, 0, 1, hid, w->w2, NULL, d, s->xb2, 0);
        branch_norm(s->xb2, w->rms_post_ffn, d, c->norm_eps);
        for (int i = 0; i < d; i++) s->x[i] += s->xb2[i];
    }
    rmsnorm(s->x, s->x, m->rms_final, d, c->norm_eps);
    kvs_gemm(s->pool, s->x, 0, 1, d, m->cls, NULL, c->vocab_size, s->logits, 0);
    if (m->info.final_softcap > 0)
        for (int i = 0; i < c->vocab_size; i++)
            s->logits[i] = m->info.final_softcap * tanhf(s->logits[i] / m->info.final_softcap);
    s->last_pos = pos;
    *logits = s->logits;
    return KVS_OK;
}

kvs_status kvs_model_state_layer(const kvs_model_state *s, int layer, kvs_layer_record *rec) {
    const kvs_model_config *c = &s->m->info.config;
    if (layer < 0 || layer >= c->n_layers)
        return kvs_fail(KVS_ERR_RANGE, "layer %d is outside [0, %d)", layer, c->n_layers);
    if (s->last_pos < 0) return kvs_fail(KVS_ERR_STATE, "no position has been forwarded yet");
    if (s->blk && s->blk->n > 0) return kvs_model_state_layer_at(s, layer, s->last_pos, rec);
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t kv_off = ((size_t)layer * (size_t)s->max_pos + (size_t)s->last_pos) * kvd;
    rec->q = s->q_rec + (size_t)layer * qd;
    rec->k = s->kcache + kv_off;
    rec->v = s->vcache + kv_off;
    rec->o = s->o_rec + (size_t)layer * qd;
    rec->lse = s->lse_rec + (size_t)layer * (size_t)c->n_heads;
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Blocked forward (prefill): every layer runs on a block of positions at once, its projections as matrix products
 * (matmul.h) that read each weight once per block. Each position's numbers are the ones kvs_model_forward gives it:
 * the same rmsnorm, the same per-element GEMM arithmetic (matmul.h: independent of the block size), RoPE, and
 * kvs_attention() over the cache rows 0..pos of that position, so the trace of a prompt does not depend on how it
 * was fed (tests/test_prefill.c compares the two position by position).
 * ---------------------------------------------------------------------------------------------- */

static kvs_status block_ws_create(kvs_model_state *s) {
    const kvs_model_config *c = &s->m->info.config;
    size_t B = KVS_MODEL_BLOCK, d = (size_t)c->dim, hid = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim;
    struct block_ws *b = calloc(1, sizeof *b);
    if (!b) return kvs_fail(KVS_ERR_NOMEM, "model state: out of memory");
    b->n_workers = kvs_threadpool_size(s->pool);
    b->ldd = d + 16;
    b->ldh = hid + 16;
    b->ldrec = L * qd + 16;
    b->x = malloc(B * d * sizeof(float));
    b->xb = malloc(B * b->ldd * sizeof(float));
    b->xb2 = malloc(B * d * sizeof(float));
    b->hb = malloc(B * b->ldh * sizeof(float));
    b->hb2 = malloc(B * b->ldh * sizeof(float));
    b->q_rec = malloc(B * b->ldrec * sizeof(float));
    b->o_rec = malloc(B * b->ldrec * sizeof(float));
    b->lse_rec = malloc(B * L * (size_t)c->n_heads * sizeof(float));
    size_t W = (size_t)b->n_workers, P = (size_t)s->max_pos, hd = (size_t)c->head_dim;
    b->tile_rows = ATT_TILE * (c->n_heads / c->n_kv_heads);
    size_t R = (size_t)b->tile_rows;
    b->kh = malloc(W * P * hd * sizeof(float));
    b->vh = malloc(W * P * hd * sizeof(float));
    b->qt = malloc(W * R * hd * sizeof(float));
    b->probs = malloc(W * R * P * sizeof(float));
    b->prow = malloc(W * R * sizeof *b->prow);
    b->orow = malloc(W * R * sizeof *b->orow);
    b->lse = malloc(W * R * sizeof *b->lse);
    if (!b->x || !b->xb || !b->xb2 || !b->hb || !b->hb2 || !b->q_rec || !b->o_rec || !b->lse_rec || !b->kh || !b->vh ||
        !b->qt || !b->probs || !b->prow || !b->orow || !b->lse) {
        block_ws_free(b);
        return kvs_fail(KVS_ERR_NOMEM, "model state: out of memory for a %d-position block", KVS_MODEL_BLOCK);
    }
    s->blk = b;
    return KVS_OK;
}

typedef struct {
    kvs_model_state *s;
    int layer;
} block_attn_job;

/* Causal attention of the block's positions at one layer: tasks are (KV head, tile of ATT_TILE positions), dealt
 * round-robin (later tiles attend more rows). A task copies its KV head's cache rows into contiguous buffers
 * (incrementally while the head stays the same) and runs kvs_attention_causal_block: each key and value row read
 * once for the tile's G x ATT_TILE query rows, every row's numbers those of kvs_attention() over the rows 0..its
 * position, bit for bit (common/kvs_math.h), i.e. what kvs_model_forward computes for that position. */
static void block_attn_worker(void *ctx, int worker, int n_workers) {
    const block_attn_job *job = ctx;
    kvs_model_state *s = job->s;
    struct block_ws *b = s->blk;
    const kvs_model_config *c = &s->m->info.config;
    int H = c->n_heads, hd = c->head_dim, G = c->n_heads / c->n_kv_heads, kvd = c->n_kv_heads * c->head_dim;
    size_t L = (size_t)c->n_layers, qd = (size_t)H * (size_t)hd, P = (size_t)s->max_pos, R = (size_t)b->tile_rows;
    const float *kc = s->kcache + (size_t)job->layer * P * (size_t)kvd;
    const float *vc = s->vcache + (size_t)job->layer * P * (size_t)kvd;
    float *kh = b->kh + (size_t)worker * P * (size_t)hd, *vh = b->vh + (size_t)worker * P * (size_t)hd;
    float *qt = b->qt + (size_t)worker * R * (size_t)hd;
    float **prow = b->prow + (size_t)worker * R, **orow = b->orow + (size_t)worker * R;
    double *lse = b->lse + (size_t)worker * R;
    int n_tiles = (b->n + ATT_TILE - 1) / ATT_TILE, have_kvh = -1, have_rows = 0;
    for (long t = worker; t < (long)c->n_kv_heads * n_tiles; t += n_workers) {
        int kvh = (int)(t / n_tiles), i0 = (int)(t % n_tiles) * ATT_TILE;
        int nb = b->n - i0 < ATT_TILE ? b->n - i0 : ATT_TILE, p0 = b->pos0 + i0, rows = p0 + nb;
        if (kvh != have_kvh) have_rows = 0;
        for (int j = have_rows; j < rows; j++) {
            memcpy(kh + (size_t)j * hd, kc + (size_t)j * kvd + (size_t)kvh * hd, (size_t)hd * sizeof(float));
            memcpy(vh + (size_t)j * hd, vc + (size_t)j * kvd + (size_t)kvh * hd, (size_t)hd * sizeof(float));
        }
        if (rows > have_rows) have_rows = rows;
        have_kvh = kvh;
        for (int i = 0; i < nb; i++) {
            size_t off = (size_t)(i0 + i) * b->ldrec + (size_t)job->layer * qd + (size_t)kvh * G * hd;
            memcpy(qt + (size_t)i * G * hd, b->q_rec + off, (size_t)G * hd * sizeof(float));
            for (int g = 0; g < G; g++) {
                prow[i * G + g] = b->probs + ((size_t)worker * R + (size_t)(i * G + g)) * P;
                orow[i * G + g] = b->o_rec + off + (size_t)g * hd;
            }
        }
        kvs_attention_causal_block(qt, (size_t)nb, (size_t)G, kh, vh, (size_t)hd, (size_t)p0, c->attn_scale, prow, orow,
                                   lse, NULL);
        for (int i = 0; i < nb; i++)
            for (int g = 0; g < G; g++)
                b->lse_rec[((size_t)(i0 + i) * L + (size_t)job->layer) * (size_t)H + (size_t)(kvh * G + g)] =
                    (float)lse[i * G + g];
    }
}

/* A sliding layer whose window cuts into the block: tasks are (position, query head), each kvs_attention() over
 * that position's window rows exactly as attn_worker computes it for kvs_model_forward (same rows, same routine),
 * with this worker's slice of the probability scratch. */
static void block_attn_window_worker(void *ctx, int worker, int n_workers) {
    const block_attn_job *job = ctx;
    kvs_model_state *s = job->s;
    struct block_ws *b = s->blk;
    const kvs_model_config *c = &s->m->info.config;
    int H = c->n_heads, hd = c->head_dim, G = c->n_heads / c->n_kv_heads, kvd = c->n_kv_heads * c->head_dim;
    size_t L = (size_t)c->n_layers, qd = (size_t)H * (size_t)hd, P = (size_t)s->max_pos, R = (size_t)b->tile_rows;
    const float *kc = s->kcache + (size_t)job->layer * P * (size_t)kvd;
    const float *vc = s->vcache + (size_t)job->layer * P * (size_t)kvd;
    float *att = b->probs + (size_t)worker * R * P;
    for (long t = worker; t < (long)b->n * H; t += n_workers) {
        int i = (int)(t / H), h = (int)(t % H), kvh = h / G, pos = b->pos0 + i;
        int64_t first = window_first(c, job->layer, pos);
        size_t off = (size_t)i * b->ldrec + (size_t)job->layer * qd + (size_t)h * hd;
        double lse = kvs_attention(b->q_rec + off, kc + (size_t)first * kvd + (size_t)kvh * hd,
                                   vc + (size_t)first * kvd + (size_t)kvh * hd, (size_t)kvd, NULL,
                                   (size_t)(pos + 1 - first), (size_t)hd, c->attn_scale, att, b->o_rec + off);
        b->lse_rec[((size_t)i * L + (size_t)job->layer) * (size_t)H + (size_t)h] = (float)lse;
    }
}

kvs_status kvs_model_forward_block(kvs_model_state *s, const int32_t *tokens, int n, int pos0, const float **logits) {
    const kvs_model *m = s->m;
    const kvs_model_config *c = &m->info.config;
    if (n < 1 || n > KVS_MODEL_BLOCK)
        return kvs_fail(KVS_ERR_INVALID_ARG, "block of %d positions is outside [1, %d]", n, KVS_MODEL_BLOCK);
    if (pos0 < 0 || pos0 > s->max_pos - n)
        return kvs_fail(KVS_ERR_RANGE, "positions %d..%d are outside [0, %d)", pos0, pos0 + n - 1, s->max_pos);
    if (pos0 > s->last_pos + 1)
        return kvs_fail(KVS_ERR_STATE, "position %d fed before position %d", pos0, s->last_pos + 1);
    if (s->attn_fn)
        return kvs_fail(KVS_ERR_STATE, "a blocked forward cannot run under an attention override (use "
                        "kvs_model_forward position by position)");
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return kvs_fail(KVS_ERR_RANGE, "token id %d is outside the vocabulary [0, %d)", tokens[i], c->vocab_size);
    kvs_status st;
    if (!s->blk && (st = block_ws_create(s)) != KVS_OK) return st;
    struct block_ws *b = s->blk;
    b->pos0 = pos0;
    b->n = n;
    int d = c->dim, hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads, hid = c->hidden_dim;
    int qd = H * hd, kvd = Hkv * hd, L = c->n_layers;
    size_t ldrec = b->ldrec, ldd = b->ldd, ldh = b->ldh;
    for (int i = 0; i < n; i++) kvs_wmat_row_f32(m->embed, (size_t)d, (size_t)tokens[i], b->x + (size_t)i * d);
    if (m->info.embed_scale != 1.0f)
        for (size_t i = 0; i < (size_t)n * d; i++) b->x[i] *= m->info.embed_scale;

    for (int l = 0; l < L; l++) {
        const layer_weights *w = &m->layers[l];
        float *q = b->q_rec + (size_t)l * (size_t)qd; /* row i at q + i * ldrec */
        float *k = s->kcache + ((size_t)l * (size_t)s->max_pos + (size_t)pos0) * (size_t)kvd;
        float *v = s->vcache + ((size_t)l * (size_t)s->max_pos + (size_t)pos0) * (size_t)kvd;
        for (int i = 0; i < n; i++) rmsnorm(b->xb + (size_t)i * ldd, b->x + (size_t)i * d, w->rms_att, d, c->norm_eps);
        kvs_gemm_out qkv[3] = {{w->wq, w->bq, q, ldrec, qd}, {w->wk, w->bk, k, (size_t)kvd, kvd},
                               {w->wv, w->bv, v, (size_t)kvd, kvd}};
        kvs_gemm_multi(s->pool, b->xb, ldd, n, d, qkv, 3);
        /* the sliding layers' own RoPE base (Gemma-3), as kvs_model_forward */
        const float *freq = m->inv_freq_local && kvs_model_config_window(c, l) > 0 ? m->inv_freq_local : m->inv_freq;
        for (int i = 0; i < n; i++) {
            float cosv[KVS_TRACE_MAX_HEAD_DIM / 2], sinv[KVS_TRACE_MAX_HEAD_DIM / 2];
            for (int j = 0; j < hd / 2; j++) {
                double ang = (double)(pos0 + i) * (double)freq[j];
                cosv[j] = (float)cos(ang);
                sinv[j] = (float)sin(ang);
            }
            if (w->q_norm) head_norms(q + (size_t)i * ldrec, H, hd, w->q_norm, c->norm_eps);
            if (w->k_norm) head_norms(k + (size_t)i * kvd, Hkv, hd, w->k_norm, c->norm_eps);
            for (int h = 0; h < H; h++) rope(q + (size_t)i * ldrec + (size_t)h * hd, hd, c->rope_layout, cosv, sinv);
            for (int h = 0; h < Hkv; h++) rope(k + (size_t)i * kvd + (size_t)h * hd, hd, c->rope_layout, cosv, sinv);
        }
        block_attn_job aj = {s, l};
        /* a sliding layer whose window cuts into the block's keys: position by position over its window */
        kvs_threadpool_fn attn_fn = window_first(c, l, pos0 + n - 1) > 0 ? block_attn_window_worker : block_attn_worker;
        if ((long)(pos0 + n) * n * qd < 32768) attn_fn(&aj, 0, 1);
        else kvs_threadpool_run(s->pool, attn_fn, &aj);

        kvs_gemm(s->pool, b->o_rec + (size_t)l * (size_t)qd, ldrec, n, qd, w->wo, w->bo, d, b->xb2, (size_t)d);
        for (int i = 0; i < n; i++) branch_norm(b->xb2 + (size_t)i * d, w->rms_post_att, d, c->norm_eps);
        for (size_t i = 0; i < (size_t)n * d; i++) b->x[i] += b->xb2[i];

        for (int i = 0; i < n; i++) rmsnorm(b->xb + (size_t)i * ldd, b->x + (size_t)i * d, w->rms_ffn, d, c->norm_eps);
        kvs_gemm_out ffn[2] = {{w->w1, NULL, b->hb, ldh, hid}, {w->w3, NULL, b->hb2, ldh, hid}};
        kvs_gemm_multi(s->pool, b->xb, ldd, n, d, ffn, 2);
        gate_job gj = {b->hb, b->hb2, ldh, n, hid, m->info.gelu_tanh}; /* gate_act as kvs_model_forward */
        if ((long)n * hid < 65536) gate_worker(&gj, 0, 1);
        else kvs_threadpool_run(s->pool, gate_worker, &gj);
        kvs_gemm(s->pool, b->hb, ldh, n, hid, w->w2, NULL, d, b->xb2, (size_t)d);
        for (int i = 0; i < n; i++) branch_norm(b->xb2 + (size_t)i * d, w->rms_post_ffn, d, c->norm_eps);
        for (size_t i = 0; i < (size_t)n * d; i++) b->x[i] += b->xb2[i];
    }
    /* logits of the last position only: the next token is sampled from it */
    float *xl = b->x + (size_t)(n - 1) * d;
    rmsnorm(s->x, xl, m->rms_final, d, c->norm_eps);
    kvs_gemm(s->pool, s->x, 0, 1, d, m->cls, NULL, c->vocab_size, s->logits, 0);
    if (m->info.final_softcap > 0)
        for (int i = 0; i < c->vocab_size; i++)
            s->logits[i] = m->info.final_softcap * tanhf(s->logits[i] / m->info.final_softcap);
    s->last_pos = pos0 + n - 1;
    if (logits) *logits = s->logits;
    return KVS_OK;
}

kvs_status kvs_model_state_layer_at(const kvs_model_state *s, int layer, int pos, kvs_layer_record *rec) {
    const kvs_model_config *c = &s->m->info.config;
    if (layer < 0 || layer >= c->n_layers)
        return kvs_fail(KVS_ERR_RANGE, "layer %d is outside [0, %d)", layer, c->n_layers);
    const struct block_ws *b = s->blk;
    if (!b || b->n == 0) {
        if (pos == s->last_pos && s->last_pos >= 0) return kvs_model_state_layer(s, layer, rec);
        return kvs_fail(KVS_ERR_STATE, "position %d: only the last forwarded position (%d) has records", pos,
                        s->last_pos);
    }
    if (pos < b->pos0 || pos >= b->pos0 + b->n)
        return kvs_fail(KVS_ERR_RANGE, "position %d is outside the last block [%d, %d)", pos, b->pos0, b->pos0 + b->n);
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    size_t row = (size_t)(pos - b->pos0) * (size_t)c->n_layers + (size_t)layer;
    size_t off = (size_t)(pos - b->pos0) * b->ldrec + (size_t)layer * qd;
    size_t kv_off = ((size_t)layer * (size_t)s->max_pos + (size_t)pos) * kvd;
    rec->q = b->q_rec + off;
    rec->k = s->kcache + kv_off;
    rec->v = s->vcache + kv_off;
    rec->o = b->o_rec + off;
    rec->lse = b->lse_rec + row * (size_t)c->n_heads;
    return KVS_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Weight access for other backends (model_weights.h)
 * ---------------------------------------------------------------------------------------------- */

kvs_status kvs_model_weights_get(const kvs_model *m, kvs_model_weights *out) {
    *out = (kvs_model_weights){.embed = m->embed, .rms_final = m->rms_final, .cls = m->cls, .inv_freq = m->inv_freq};
    return KVS_OK;
}

kvs_status kvs_model_layer_weights_get(const kvs_model *m, int layer, kvs_model_layer_weights *out) {
    if (layer < 0 || layer >= m->info.config.n_layers)
        return kvs_fail(KVS_ERR_RANGE, "layer %d is outside [0, %d)", layer, m->info.config.n_layers);
    const layer_weights *w = &m->layers[layer];
    *out = (kvs_model_layer_weights){.rms_att = w->rms_att, .rms_ffn = w->rms_ffn, .wq = w->wq, .wk = w->wk,
                                     .wv = w->wv, .wo = w->wo, .bq = w->bq, .bk = w->bk, .bv = w->bv,
                                     .bo = w->bo, .w1 = w->w1, .w2 = w->w2, .w3 = w->w3};
    return KVS_OK;
}
