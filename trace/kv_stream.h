/* kv_stream.h — one (layer, KV head) stream of a trace, position by position, with its K/V history and,
 * on request, exact causal full attention: the iterator the trace analyses share (analysis/: `kvsim attn`,
 * `drift`, `heads`, `keys`) instead of each re-assembling blocks into a history (../shared/DESIGN.md "Replay":
 * full attention O_t over 0..t from the trace's own Q/K/V; trace layout: trace/FORMAT.md). The replay engine
 * (sim/replay.c) reads its kvs_replay_source's blocks itself (a trace or arrays in memory), keeps one history per
 * task for all its configurations and computes its reference for blocks of positions at once; `kvsim verify`
 * (trace/verify.c) keeps a history of its own because it sits below sim/.
 *
 * A stream reads the trace block by block (kvs_trace_stream_open/next: one block in memory at a time) and
 * hands out one position per kvs_kv_stream_next(): its G = n_heads / n_kv_heads queries, the keys and
 * values of positions 0..pos (this one included) as contiguous [pos+1][head_dim] arrays, the stored o and
 * lse, its token, turn and role. With KVS_KV_STREAM_FULL_ATTN it also computes, for every query head of the
 * group, softmax(scale q K^T) over positions 0..pos and the output with kvs_attention() (common/kvs_math.h;
 * with KVS_KV_STREAM_SCORES its three steps, keeping the scores). A row's numbers equal kvs_attention()'s on the
 * same rows bit for bit whichever kernel computes them, and so does the replay engine's blocked reference
 * (kvs_attention_causal_block), so the numbers are the replay engine's bit for bit. On a lean trace
 * (--record qkv) with FULL_ATTN, the position's o and lse are this stream's own full attention (the reader does
 * not compute them a second time).
 *
 * On an fp16 or bf16 trace, FULL_ATTN without SCORES keeps the history in those 16 bits as well (head_dim up to
 * KVS_KV16_MAX_DIM, a little-endian machine) and computes the full attention of the group from them
 * (kvs_attention_group16: half the bytes read, the same numbers bit for bit, half again the history's memory);
 * KVS_KV16=0 in the environment turns that off (common/kvs_math_simd.h).
 *
 * Memory: the history buffers (n_positions x 2 x head_dim floats, on huge pages where the system has them:
 * kvs_alloc_rows; plus as many 16-bit values with the 16-bit history) and, with FULL_ATTN, G x n_positions
 * floats of probabilities (twice that with SCORES) are allocated at open for the whole trace so that the
 * history never moves; the OS commits their pages as positions arrive, so a stream that stops early costs
 * what it used. Everything else is one block and O(G x head_dim).
 *
 * Thread safety: a stream belongs to one thread; several streams may share one kvs_trace (see trace.h).
 */
#ifndef KVS_KV_STREAM_H
#define KVS_KV_STREAM_H

#include <stdint.h>

#include "../common/kvs.h"
#include "trace.h"

/* Flags of kvs_kv_stream_open (bitwise or). */
#define KVS_KV_STREAM_FULL_ATTN 1u /* compute probs / out / attn_lse of every position */
#define KVS_KV_STREAM_SCORES 2u    /* also keep the scaled scores before the softmax (implies FULL_ATTN) */

typedef struct kvs_kv_stream kvs_kv_stream;

/* One position of a stream. Every pointer is borrowed from the stream and valid until the next
 * kvs_kv_stream_next() or kvs_kv_stream_free() on it, except k and v: the history never moves, so k/v (and
 * rows read from them) stay valid until kvs_kv_stream_free(). Query head of index g: kv_head * group + g. */
typedef struct {
    int32_t layer, kv_head;
    int32_t group;          /* G: query heads sharing this KV head */
    int32_t head_dim;       /* d */
    float scale;            /* softmax scale (the trace's attn_scale) */
    int64_t pos;            /* position, 0 .. n_positions - 1 */
    int64_t n_ctx;          /* pos + 1: rows of k / v, columns of probs / scores */
    int32_t token;          /* token id at pos */
    int32_t turn;           /* turn index of pos (0-based; see kvs_turn) */
    int is_prompt;          /* 1: a prompt position (KVS_ROLE_PROMPT); 0: a generated one */
    const float *q;         /* [G][d]: the position's post-RoPE queries */
    const float *k, *v;     /* [n_ctx][d]: keys / values of positions 0..pos; row pos is this position's */
    const float *o;         /* [G][d]: stored full-attention output (as decoded from the trace's dtype); in a lean
                               trace (KVS_TRACE_FLAG_QKV) the reader's fp32 recomputation from q/k/v, or with
                               FULL_ATTN `out` itself (the same numbers, computed once) */
    const float *lse;       /* [G]: stored log-sum-exp (lean trace: recomputed likewise) */
    /* KVS_KV_STREAM_FULL_ATTN (or SCORES) only, NULL otherwise: the recomputation from q, k, v */
    const float *probs;     /* [G][n_ctx]: softmax over positions 0..pos; row g at probs + g * n_ctx. A sliding-window
                               layer (kvs_model_config.layer_window) attends to its window only: probs 0 (scores
                               -inf) before pos + 1 - window */
    const float *out;       /* [G][d]: sum_j probs[g][j] v[j] */
    const double *attn_lse; /* [G]: log-sum-exp of the scaled scores (kvs_attention's return value) */
    /* KVS_KV_STREAM_SCORES only, NULL otherwise */
    const float *scores;    /* [G][n_ctx]: scale * q_g . k_j before the softmax */
} kvs_kv_pos;

/*! kvs_kv_stream_open() : starts streaming (layer, kv_head) of `t` (borrowed: must outlive the stream) from
 *  position 0. `flags`: 0 or KVS_KV_STREAM_* ored. Errors: KVS_ERR_INVALID_ARG (NULL t or out, unknown
 *  flag bits), KVS_ERR_RANGE (layer or kv_head outside the trace, the detail names the valid range),
 *  KVS_ERR_NOMEM (the history). @return KVS_OK and *out (caller frees with kvs_kv_stream_free) */
kvs_status kvs_kv_stream_open(const kvs_trace *t, int layer, int kv_head, unsigned flags, kvs_kv_stream **out);

/*! kvs_kv_stream_next() : advances one position and fills *out (see kvs_kv_pos for lifetimes).
 *  @return KVS_OK; KVS_ERR_END after the last position (again on every later call); or the error of the
 *  trace reader (KVS_ERR_CHECKSUM, KVS_ERR_FORMAT, KVS_ERR_TRUNCATED, KVS_ERR_IO ...) for a corrupt or
 *  unreadable chunk, after which every call returns KVS_ERR_STATE. */
kvs_status kvs_kv_stream_next(kvs_kv_stream *s, kvs_kv_pos *out);

/*! kvs_kv_stream_free() : frees the stream and its history. Accepts NULL. */
void kvs_kv_stream_free(kvs_kv_stream *s);

#endif /* KVS_KV_STREAM_H */
