/* gen_trace.h — TEST HELPER: builds GENERATED (pseudo-random, seeded) trace data and writes it as a kvsim
 * trace. The q/k/v are Gaussian numbers from a seeded generator, NOT the activations of any model; o and
 * lse are the exact causal full attention of those q/k/v computed with kvs_attention() (common/kvs_math.h),
 * so a generated trace is self-consistent the way a real capture is. The model name written to the header
 * is "generated-gaussian" and the settings say "source=generated", so such a file can never be mistaken
 * for a real capture. Used by tests/ and bench/.
 */
#ifndef KVS_GEN_TRACE_H
#define KVS_GEN_TRACE_H

#include <stdint.h>

#include "../../common/kvs.h"
#include "../../trace/trace.h"

typedef struct {
    int32_t n_layers, n_heads, n_kv_heads, head_dim;
    int32_t n_positions, block_positions;
    int32_t vocab_size;
    kvs_dtype dtype;
    uint32_t flags;          /* KVS_TRACE_FLAG_* */
    uint64_t seed;
    int32_t n_turns;         /* >= 1: positions split evenly into turns, each half prompt, half generated */
    int32_t prompt_len;      /* single turn only: prompt positions (-1 = n_positions / 2) */
    float q_scale;           /* multiplies q (sharper attention for > 1) */
    int32_t corrupt_o_layer; /* -1: none; L >= 0: that layer's stored o is the o of another position
                              * (p - 1, and position 1's for p = 0), lse untouched; -2: every layer */
} kvs_gen_trace_opts;

/* Generated data, fp32. The o/lse arrays are the TRUE attention (never corrupted). */
typedef struct {
    kvs_gen_trace_opts opt;
    int32_t G;
    float *q, *o;       /* [L][N][H][d] */
    float *k, *v;       /* [L][N][Hkv][d] */
    float *lse;         /* [L][N][H] */
    int32_t *tokens, *turn; /* [N] */
    uint8_t *roles;     /* [N] */
} kvs_gen_trace;

/*! kvs_gen_trace_defaults() : 2 layers, 4 heads, 2 KV heads, d 16, 40 positions, block 16, vocab 1000,
 *  fp32, shuffle on, seed 1, one turn, prompt N/2, q_scale 1, no corruption. */
kvs_gen_trace_opts kvs_gen_trace_defaults(void);

/*! kvs_gen_trace_create() : generates the data; caller frees with kvs_gen_trace_free (accepts NULL). */
kvs_status kvs_gen_trace_create(const kvs_gen_trace_opts *opt, kvs_gen_trace **out);
void kvs_gen_trace_free(kvs_gen_trace *g);

/*! kvs_gen_trace_configs() : the model/capture configs a trace of `g` is written with. */
void kvs_gen_trace_configs(const kvs_gen_trace *g, kvs_model_config *m, kvs_capture_config *c);

/*! kvs_gen_trace_put() : records positions [from, to) of `g` into an open writer (applying the
 *  corruption option to the stored o). */
kvs_status kvs_gen_trace_put(const kvs_gen_trace *g, kvs_trace_writer *w, int64_t from, int64_t to);

/*! kvs_gen_trace_write() : writes the whole trace to `path` (create, put all, close, free). */
kvs_status kvs_gen_trace_write(const kvs_gen_trace *g, const char *path);

/* The naive reference of the analyses' tests: exact causal attention of query head `head` of `layer` at position t
 * over 0..t, in double, from the generator's own float q/k (not from a trace): p[t+1]. */
void kvs_gen_trace_naive_probs(const kvs_gen_trace *g, int layer, int head, int64_t t, double *p);

/*! kvs_gen_trace_stored_o() : pointer to the o row that is STORED for (layer, position, head) under the
 *  corruption option ([d] floats, borrowed). */
const float *kvs_gen_trace_stored_o(const kvs_gen_trace *g, int layer, int64_t pos, int head);

#endif /* KVS_GEN_TRACE_H */
