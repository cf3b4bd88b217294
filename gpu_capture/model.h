/* model.h — loading Llama-family checkpoints and the CPU reference forward pass
 * (../shared/DESIGN.md "Capture").
 *
 * Checkpoints:
 *  - llama2.c `.bin` (llama2.c run.c `read_checkpoint`): 7 int32 header (dim, hidden_dim, n_layers,
 *    n_heads, n_kv_heads, vocab_size, seq_len), then fp32 tensors; classifier shared with the token
 *    embedding when vocab_size > 0, stored after the (unused) RoPE tables when negative. RoPE rotates
 *    adjacent pairs (i, i+1); theta 10000; RMSNorm eps 1e-5; BOS 1.
 *  - Hugging Face folders: config.json + model.safetensors, or model.safetensors.index.json with shards.
 *    Architectures LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias); GQA; head_dim;
 *    rope_theta; rms_norm_eps; tie_word_embeddings (also an embedding stored only as lm_head.weight with a
 *    __metadata__ alias, as tinystories-656K does); Llama-3 rope_scaling. RoPE in the rotate_half layout.
 *    Qwen3ForCausalLM (per-head q/k RMSNorm before RoPE) and Gemma3ForCausalLM (also a nested
 *    text_config): interleaved sliding-window and full layers with their own RoPE bases, q/k norms,
 *    (1 + w) RMSNorm, four norms per layer, scaled embedding, GeGLU, query_pre_attn_scalar,
 *    final_logit_softcapping. A sliding layer attends to the last `sliding_window` positions, the
 *    current one included (config.layer_window).
 *
 * Weights are memory-mapped. Matrices are used in place in their stored dtype (fp32, fp16, bf16: the matrix
 * products of matmul.h widen 16-bit weights in registers / L1 tiles and accumulate in fp32), so a 16-bit
 * checkpoint costs its file size, not twice it; misaligned fp32 matrices and the small vectors (norms, biases) of
 * a 16-bit checkpoint are converted once, at load, to fp32 heap copies.
 *
 * Every tensor's presence, dtype, shape and byte range is validated; errors name the file and the
 * config field or tensor (KVS_ERR_FORMAT malformed, KVS_ERR_TRUNCATED short file, KVS_ERR_UNSUPPORTED
 * well-formed but unsupported, KVS_ERR_IO cannot open).
 */
#ifndef KVS_MODEL_H
#define KVS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../trace/trace.h"
#include "../common/threadpool.h"

typedef enum { KVS_MODEL_LLAMA2C = 0, KVS_MODEL_HF = 1 } kvs_model_format;

#define KVS_MODEL_MAX_EOS 8

/* Everything known about a loaded model beyond its weights. Borrowed from the model. */
typedef struct {
    kvs_model_config config;   /* what the trace header records (model_name = file/folder base name) */
    kvs_model_format format;
    char architecture[64];     /* "llama2.c", "LlamaForCausalLM", ... */
    kvs_dtype weight_dtype;    /* storage dtype shared by the checkpoint's matrices; F32 when they mix */
    int qkv_bias;              /* q/k/v projections have biases (Qwen2, attention_bias) */
    int o_bias;                /* output projection has a bias (Llama attention_bias) */
    int tied_embeddings;       /* the classifier is the token embedding (one matrix, counted once) */
    int32_t bos_id;            /* -1 when none */
    int32_t eos_ids[KVS_MODEL_MAX_EOS]; /* ids that end generation */
    int n_eos;
    int rope_llama3;           /* Llama-3 rope_scaling in effect */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int32_t rope_original_max_pos;
    uint64_t n_params;         /* parameters, counting a tied classifier once */
    uint64_t weight_bytes;     /* bytes read per decoded token: matrices in weight_dtype (classifier once), vectors fp32 */
    /* Qwen3 / Gemma-3 steps (all off for the Llama family; see model.c "Qwen3 and Gemma-3") */
    int qk_norm;               /* per-head RMSNorm of q and k before RoPE (self_attn.q_norm / k_norm) */
    int norm_plus_one;         /* RMSNorm scales by (1 + w) (Gemma): the loaded norm vectors already hold 1 + w */
    int sandwich_norm;         /* post-attention and post-FFN norms on the branch outputs (Gemma-3) */
    int gelu_tanh;             /* FFN gate activation gelu_pytorch_tanh (GeGLU) instead of SiLU */
    float embed_scale;         /* token-embedding multiplier: 1, or Gemma's sqrt(hidden) rounded to the weight dtype */
    float final_softcap;       /* logits = cap * tanh(logits / cap) when > 0 (final_logit_softcapping) */
    float query_pre_attn_scalar; /* > 0: attention scale is its -1/2 power instead of head_dim's */
    float rope_linear_factor;  /* linear rope_scaling of full-attention layers (frequencies / factor); 1 = none */
    float rope_local_theta;    /* RoPE base of sliding-window layers (Gemma-3 rope_local_base_freq); 0 = rope_theta */
    int32_t sliding_window;    /* the window of the sliding layers (config.layer_window), 0 when none */
} kvs_model_info;

typedef struct kvs_model kvs_model;

/*! kvs_model_load() : loads `path`: a regular file is read as a llama2.c checkpoint, a directory as a
 *  Hugging Face folder. @return KVS_OK and *out (caller owns, free with kvs_model_free). */
kvs_status kvs_model_load(const char *path, kvs_model **out);

/*! kvs_model_free() : unmaps and frees. Accepts NULL. */
void kvs_model_free(kvs_model *m);

/*! kvs_model_info_get() : borrowed, valid until kvs_model_free. */
const kvs_model_info *kvs_model_info_get(const kvs_model *m);

/*! kvs_model_is_eos() : 1 when `token` ends generation for this model. */
int kvs_model_is_eos(const kvs_model *m, int32_t token);

/* ------------------------------------------------------------------------------------------------
 * Decoding state: KV cache, activations and the per-layer attention record of the last position.
 * ---------------------------------------------------------------------------------------------- */

typedef struct kvs_model_state kvs_model_state;

/*! kvs_model_state_create() : state for decoding up to `max_positions` positions (1..max_seq_len) of
 *  `m` (borrowed; must outlive the state), using `pool` (borrowed; NULL = single-threaded).
 *  Caller frees with kvs_model_state_free. */
kvs_status kvs_model_state_create(const kvs_model *m, int max_positions, kvs_threadpool *pool,
                                  kvs_model_state **out);
void kvs_model_state_free(kvs_model_state *s);

/* Attention override (closed-loop decoding, sim/closed_loop.h): called by kvs_model_forward for every layer of
 * the position being forwarded, after the layer's post-RoPE queries and this position's key/value were written
 * into the state's cache, in place of the full causal attention. `q` is [n_heads][head_dim]; `kcache`/`vcache`
 * hold the layer's rows of positions 0..pos (this one included), row j at kcache + j * kv_stride, KV head h's
 * vector at offset h * head_dim. The hook writes the attention output o [n_heads][head_dim] (before the output
 * projection) and lse [n_heads]. A non-OK return aborts the forward with that status (the state is then
 * unusable). Everything is borrowed for the duration of the call. */
typedef kvs_status (*kvs_model_attn_fn)(void *user, int layer, int pos, const float *q, const float *kcache,
                                        const float *vcache, size_t kv_stride, float *o, float *lse);

/*! kvs_model_state_set_attn() : installs `fn` (with `user`, borrowed) as the attention of every later
 *  kvs_model_forward on `s`; fn NULL restores full causal attention. */
void kvs_model_state_set_attn(kvs_model_state *s, kvs_model_attn_fn fn, void *user);

/*! kvs_model_forward() : runs one position: token `token` at position `pos` (positions must be fed
 *  0, 1, 2, ... in order; the KV cache holds positions < pos). *logits receives [vocab_size] floats
 *  borrowed from the state (valid until the next call). KVS_ERR_RANGE for a token outside the
 *  vocabulary or pos outside [0, max_positions). */
kvs_status kvs_model_forward(kvs_model_state *s, int32_t token, int pos, const float **logits);

/* What attention consumed and produced at one layer for the last forwarded position. All borrowed from
 * the state, valid until the next kvs_model_forward. */
typedef struct {
    const float *q;   /* [n_heads][head_dim] post-RoPE queries */
    const float *k;   /* [n_kv_heads][head_dim] post-RoPE key of this position */
    const float *v;   /* [n_kv_heads][head_dim] */
    const float *o;   /* [n_heads][head_dim] attention output (before the output projection) */
    const float *lse; /* [n_heads] natural-log log-sum-exp of the scaled scores */
} kvs_layer_record;

/*! kvs_model_state_layer() : the record of `layer` for the last forwarded position. */
kvs_status kvs_model_state_layer(const kvs_model_state *s, int layer, kvs_layer_record *rec);

/* Blocked prefill: positions per kvs_model_forward_block call (the block's activations and records are
 * KVS_MODEL_BLOCK x n_layers x q_dim floats twice; each weight is read once per block). */
#define KVS_MODEL_BLOCK 128

/*! kvs_model_forward_block() : runs tokens[0..n) at positions pos0..pos0+n-1 (1 <= n <= KVS_MODEL_BLOCK; pos0 at
 *  most the next position, as kvs_model_forward) through every layer at once: the projections as matrix products
 *  over the block, attention of each position over the cache rows 0..its position. Every position's numbers are
 *  the ones kvs_model_forward would give it, bit for bit on the same machine. *logits (may be NULL) receives the
 *  last position's [vocab_size] logits, borrowed as kvs_model_forward's. KVS_ERR_STATE under an attention override
 *  (kvs_model_state_set_attn: it is called position by position). */
kvs_status kvs_model_forward_block(kvs_model_state *s, const int32_t *tokens, int n, int pos0, const float **logits);

/*! kvs_model_state_layer_at() : the record of `layer` at position `pos` of the last block (any of its
 *  positions; after kvs_model_forward only its position). Valid until the next forward. */
kvs_status kvs_model_state_layer_at(const kvs_model_state *s, int layer, int pos, kvs_layer_record *rec);

#endif /* KVS_MODEL_H */
