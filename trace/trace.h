/* trace.h — public API of the kvsim trace library: writing, reading, streaming and recovering the
 * chunked, zstd-compressed, checksummed trace files specified in trace/FORMAT.md.
 *
 * A trace records, for every position (prompt and generated), every layer and head, what attention
 * consumed and produced during real decoding: post-RoPE q of every query head, post-RoPE k and v of
 * every KV head, the full-attention output o and log-sum-exp of every query head, plus token ids,
 * prompt/turn boundaries, the model config and the capture settings. A lean trace (KVS_TRACE_FLAG_QKV) stores
 * q, k and v only; its readers recompute o and lse (FORMAT.md "Lean record").
 *
 * Data is grouped by (layer, KV head, block of `block_positions` positions): one chunk holds, for that
 * KV head and the G = n_heads / n_kv_heads query heads that share it (query head h uses KV head
 * h / G), the block's q, k, v, o and lse. Replay of one KV-head stream reads only its own chunks.
 *
 * Thread safety: a kvs_trace reader may be shared by threads as long as each thread uses its own
 * kvs_trace_stream / kvs_trace_block (reads use pread). A writer belongs to one thread.
 */
#ifndef KVS_TRACE_H
#define KVS_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/kvs.h"
#include "../common/threadpool.h"

#define KVS_TRACE_NAME_MAX 64        /* bytes, including the NUL */
#define KVS_TRACE_SETTINGS_MAX 4096  /* bytes, including the NUL */
#define KVS_TRACE_MAX_LAYERS 1024
#define KVS_TRACE_MAX_HEADS 1024
#define KVS_TRACE_MAX_HEAD_DIM 1024
#define KVS_TRACE_MAX_BLOCK 65536
#define KVS_TRACE_DEFAULT_BLOCK 64   /* positions per block */

typedef enum { KVS_ROPE_ADJACENT = 0, KVS_ROPE_HALVES = 1 } kvs_rope_layout; /* llama2.c vs HF rotate_half */

/* Model config recorded in the header. All counts are per layer. */
typedef struct {
    int32_t n_layers;
    int32_t n_heads;        /* query heads */
    int32_t n_kv_heads;     /* key/value heads; n_heads % n_kv_heads == 0 */
    int32_t head_dim;
    int32_t dim;            /* model (residual) width */
    int32_t hidden_dim;     /* FFN width */
    int32_t vocab_size;
    int32_t max_seq_len;    /* model context length */
    float rope_theta;
    float norm_eps;
    float attn_scale;       /* softmax scale; 1/sqrt(head_dim) for Llama-family models */
    int32_t rope_layout;    /* kvs_rope_layout */
    char model_name[KVS_TRACE_NAME_MAX]; /* e.g. "stories260K", NUL-terminated */
    /* Attention window of each layer in positions, the current one included (0 = full causal attention):
     * a sliding-window layer's full cache IS its window (Gemma-3's local layers). Stored in the header only
     * when some layer has one (KVS_TRACE_FLAG_WINDOWS, FORMAT.md); older traces read as all full. */
    int32_t layer_window[KVS_TRACE_MAX_LAYERS];
} kvs_model_config;

/* Capture settings recorded in the header. */
typedef struct {
    int32_t dtype;          /* kvs_dtype of q/k/v/o (lse is always fp32) */
    int32_t block_positions;/* positions per chunk block, 1..KVS_TRACE_MAX_BLOCK */
    int32_t max_new_tokens; /* decode steps requested (RocketKV's budget rule needs it); 0 if unknown */
    uint32_t flags;         /* KVS_TRACE_FLAG_* */
    char settings[KVS_TRACE_SETTINGS_MAX]; /* free text "key=value ..." (backend, sampling, seed, prompt source) */
} kvs_capture_config;

#define KVS_TRACE_FLAG_SHUFFLE 1u   /* byte-shuffle arrays before zstd (default on; see FORMAT.md) */
#define KVS_TRACE_FLAG_QKV 2u       /* lean record (`kvsim capture --record qkv`): group chunks hold q, k, v only;
                                       readers recompute o and lse from them (FORMAT.md "Lean record") */
#define KVS_TRACE_FLAG_WINDOWS 4u   /* the header carries a per-layer attention window table (FORMAT.md "Layer
                                       windows"); set by the writer from kvs_model_config.layer_window, never by
                                       callers, and not reported in kvs_capture_config.flags by readers */

/*! kvs_model_config_window() : the attention window of `layer` in positions (0 = full); the number of
 *  cached positions that layer attends to at position p is min(p + 1, window) (all p + 1 when 0). */
static inline int32_t kvs_model_config_window(const kvs_model_config *m, int layer) {
    return layer >= 0 && layer < KVS_TRACE_MAX_LAYERS ? m->layer_window[layer] : 0;
}

/*! kvs_model_config_has_windows() : 1 when some layer of `m` has a sliding window. */
static inline int kvs_model_config_has_windows(const kvs_model_config *m) {
    for (int l = 0; l < m->n_layers && l < KVS_TRACE_MAX_LAYERS; l++)
        if (m->layer_window[l] > 0) return 1;
    return 0;
}

/* Role of a position in the sequence. */
typedef enum { KVS_ROLE_PROMPT = 0, KVS_ROLE_GENERATED = 1 } kvs_role;

/* One turn of a (possibly multi-turn) trace: positions [begin, prompt_end) are the user's prompt tokens,
 * [prompt_end, end) the model's generated tokens. A single-turn trace has one turn with begin 0. */
typedef struct {
    int64_t begin, prompt_end, end;
} kvs_turn;

/* Everything `kvsim info` prints; filled by kvs_trace_info_get. Borrowed from the reader. */
typedef struct {
    kvs_model_config model;
    kvs_capture_config capture;
    uint32_t version;
    int64_t n_positions;
    int64_t prompt_len;     /* positions before the first generated one (= n_positions if none) */
    int64_t n_turns;
    const kvs_turn *turns;  /* [n_turns] */
    int64_t n_blocks;       /* ceil(n_positions / block_positions) */
    int64_t n_chunks;
    uint64_t raw_bytes;     /* uncompressed payload bytes of all chunks */
    uint64_t compressed_bytes; /* compressed payload bytes of all chunks */
    uint64_t file_bytes;
} kvs_trace_info;

/* ------------------------------------------------------------------------------------------------
 * Writer
 * ---------------------------------------------------------------------------------------------- */

typedef struct kvs_trace_writer kvs_trace_writer;

/*! kvs_trace_writer_create() : starts a trace destined for `path`. Data goes to `path`.partial, which
 *  is renamed to `path` only by a successful kvs_trace_writer_close(); a killed writer leaves the
 *  .partial file, whose complete blocks `kvsim trace recover` restores. Validates the configs
 *  (KVS_ERR_INVALID_ARG naming the field). @return KVS_OK and *out (caller frees with
 *  kvs_trace_writer_free) */
kvs_status kvs_trace_writer_create(const char *path, const kvs_model_config *model, const kvs_capture_config *cap,
                                   kvs_trace_writer **out);

/*! kvs_trace_writer_set_threadpool() : compresses each finished block's chunks on the workers of `pool`
 *  (borrowed, not freed; NULL = on the calling thread alone). The file's bytes are the same whatever the
 *  pool: every chunk is an independent zstd frame with the same parameters, written in the same order.
 *  The pool is used only inside the writer's own calls (end_position, close), so it may be one the
 *  caller also uses between those calls. @return KVS_OK, or KVS_ERR_NOMEM for the per-worker state. */
kvs_status kvs_trace_writer_set_threadpool(kvs_trace_writer *w, kvs_threadpool *pool);

/*! kvs_trace_writer_begin_position() : starts the next position (0, 1, 2, ...) with its token id,
 *  role and turn index (turn indices start at 0 and never decrease). */
kvs_status kvs_trace_writer_begin_position(kvs_trace_writer *w, int32_t token_id, kvs_role role, int32_t turn);

/*! kvs_trace_writer_put_layer() : records one layer of the current position. Borrowed fp32 inputs:
 *  q [n_heads][head_dim], k [n_kv_heads][head_dim], v [n_kv_heads][head_dim], o [n_heads][head_dim],
 *  lse [n_heads]. In a lean trace (KVS_TRACE_FLAG_QKV) o and lse are not stored and may be NULL. Each layer
 *  exactly once per position, any order. */
kvs_status kvs_trace_writer_put_layer(kvs_trace_writer *w, int layer, const float *q, const float *k,
                                      const float *v, const float *o, const float *lse);

/*! kvs_trace_writer_set_plane_blocks() : 1 (the default): with the byte shuffle on, every byte plane of
 *  every array is compressed as zstd blocks of its own, so each plane gets its own entropy tables
 *  (FORMAT.md "Byte planes as zstd blocks"); 0: the whole payload in one go, as writers before it did. The
 *  file format is the same either way (any reader decodes both); only the compressed size and speed differ.
 *  Call before the first position. */
kvs_status kvs_trace_writer_set_plane_blocks(kvs_trace_writer *w, int on);

/*! kvs_trace_writer_end_position() : finishes the position (KVS_ERR_STATE if a layer is missing); when
 *  the block is full its chunks are compressed and appended to the file. */
kvs_status kvs_trace_writer_end_position(kvs_trace_writer *w);

/*! kvs_trace_writer_close() : flushes the last (partial) block, writes the footer index, fsyncs and
 *  renames to the final path. A position begun but not ended is an error. The writer must still be
 *  freed. */
kvs_status kvs_trace_writer_close(kvs_trace_writer *w);

/*! kvs_trace_writer_free() : frees; if the writer was not closed successfully the .partial file is
 *  removed (an abandoned capture leaves nothing behind). Accepts NULL. */
void kvs_trace_writer_free(kvs_trace_writer *w);

/*! kvs_trace_writer_keep_partial() : for a capture stopped early on request: writes the positions recorded
 *  so far (an unfinished block as a shorter last block), fsyncs and closes `path`.partial WITHOUT a footer or
 *  the rename; kvs_trace_writer_free then leaves the file, which `kvsim trace recover` turns into a complete
 *  trace of every recorded position. The writer takes nothing more. KVS_ERR_STATE when no position was
 *  recorded or one is begun and not ended (free then removes the file as usual). */
kvs_status kvs_trace_writer_keep_partial(kvs_trace_writer *w);

/*! kvs_trace_writer_positions() : positions completed so far. */
int64_t kvs_trace_writer_positions(const kvs_trace_writer *w);
/*! kvs_trace_writer_bytes() : bytes written to the file so far; safe to call from another thread than the
 *  writer's (the only such call). */
uint64_t kvs_trace_writer_bytes(const kvs_trace_writer *w);

/* ------------------------------------------------------------------------------------------------
 * Reader
 * ---------------------------------------------------------------------------------------------- */

typedef struct kvs_trace kvs_trace;

/*! kvs_trace_open() : opens and validates a trace: header checksum and fields, trailer, footer checksum,
 *  every index entry's offset/size/count and the completeness of the (layer, kv head, block) grid. Chunk
 *  payloads are checked when read. @return KVS_OK and *out (free with kvs_trace_close). */
kvs_status kvs_trace_open(const char *path, kvs_trace **out);

/*! kvs_trace_close() : accepts NULL. */
void kvs_trace_close(kvs_trace *t);

/*! kvs_trace_info_get() : borrowed view, valid until kvs_trace_close. */
const kvs_trace_info *kvs_trace_info_get(const kvs_trace *t);

/*! kvs_trace_tokens() : borrowed [n_positions] token ids / roles (kvs_role) / turn indices. */
const int32_t *kvs_trace_tokens(const kvs_trace *t);
const uint8_t *kvs_trace_roles(const kvs_trace *t);
const int32_t *kvs_trace_turn_of(const kvs_trace *t);

/* One decoded block of one (layer, KV head) group, in fp32. G = n_heads / n_kv_heads. */
typedef struct {
    int32_t layer, kv_head;
    int64_t block;         /* block index */
    int64_t first_pos;     /* = block * block_positions */
    int32_t n_pos;         /* positions in this block (the last block may be partial) */
    int32_t group, head_dim;
    float *q;              /* [n_pos][G][head_dim]: query heads kv_head*G + g */
    float *k;              /* [n_pos][head_dim] */
    float *v;              /* [n_pos][head_dim] */
    float *o;              /* [n_pos][G][head_dim] */
    float *lse;            /* [n_pos][G] */
    /* o and lse are the stored values; in a lean trace (KVS_TRACE_FLAG_QKV) the reader recomputes them in fp32
     * from the stored q/k/v with kvs_attention (common/kvs_math.h), which needs the keys and values of every
     * earlier block: a block remembers the history of the (layer, KV head) it last read, so reading blocks in
     * order (a stream) decodes each chunk once, and a random access decodes the earlier blocks it lacks. */
    int recomputed;        /* 1: o and lse were recomputed (lean trace), 0: decoded from the trace, -1: not
                              available (a lean trace read with kvs_trace_block_qkv_only: o and lse are NaN) */
} kvs_trace_block;

/*! kvs_trace_block_create() : allocates buffers sized for one block of `t`. Free with
 *  kvs_trace_block_free (accepts NULL). */
kvs_status kvs_trace_block_create(const kvs_trace *t, kvs_trace_block **out);
void kvs_trace_block_free(kvs_trace_block *b);

/*! kvs_trace_block_qkv_only() : for a reader that needs only q, k and v (the replay engine computes its own
 *  full-attention reference): reads of a lean trace into `b` then skip the recomputation of o and lse (and
 *  the history it needs) and fill them with NaN (b->recomputed = -1). No effect on a full trace. */
void kvs_trace_block_qkv_only(kvs_trace_block *b);

/*! kvs_trace_read_block() : random access: reads, checksums, decompresses and decodes block `block` of
 *  (layer, kv_head) into `out`. KVS_ERR_RANGE for indices outside the trace. */
kvs_status kvs_trace_read_block(const kvs_trace *t, int layer, int kv_head, int64_t block, kvs_trace_block *out);

/* Streaming read of one (layer, KV head) group, block by block, holding one block in memory. */
typedef struct kvs_trace_stream kvs_trace_stream;

/*! kvs_trace_stream_open() : caller frees with kvs_trace_stream_free (accepts NULL). */
kvs_status kvs_trace_stream_open(const kvs_trace *t, int layer, int kv_head, kvs_trace_stream **out);
/*! kvs_trace_stream_next() : *blk points to the next block (borrowed until the next call or free);
 *  @return KVS_OK, KVS_ERR_END after the last block, or an error. */
kvs_status kvs_trace_stream_next(kvs_trace_stream *s, const kvs_trace_block **blk);
void kvs_trace_stream_free(kvs_trace_stream *s);
/*! kvs_trace_stream_qkv_only() : kvs_trace_block_qkv_only() on the stream's block. */
void kvs_trace_stream_qkv_only(kvs_trace_stream *s);

/*! kvs_trace_turns_from_roles() : the turn table of n >= 1 positions from their roles (kvs_role) and turn
 *  indices, as the format defines it (FORMAT.md "What a reader validates"): turn indices start at 0 and step
 *  by 0 or 1, and within a turn every prompt position precedes every generated one. *turns is malloc'd
 *  [*n_turns] (caller frees); *prompt_len (may be NULL) receives the first generated position, or n if none.
 *  KVS_ERR_FORMAT naming the position otherwise. The trace reader and in-memory replay sources share it. */
kvs_status kvs_trace_turns_from_roles(const uint8_t *roles, const int32_t *turn_of, int64_t n, kvs_turn **turns,
                                      int64_t *n_turns, int64_t *prompt_len);

/*! kvs_trace_content_sha256() : the SHA-256 of the whole trace file as 64 hex digits: the trace's identity in
 *  results (runs, merge, seeds of randomised policies), whatever path it was opened by. KVS_ERR_IO on a read error. */
kvs_status kvs_trace_content_sha256(const kvs_trace *t, char out[65]);

/*! kvs_trace_check_chunks() : reads and checksums every chunk (what `kvsim verify` does first).
 *  @return KVS_OK or the first failure, with its chunk named in the detail. */
kvs_status kvs_trace_check_chunks(const kvs_trace *t);

/* ------------------------------------------------------------------------------------------------
 * Recovery
 * ---------------------------------------------------------------------------------------------- */

/*! kvs_trace_recover() : scans a trace (complete, or the .partial left by a killed writer) from its
 *  header, keeps every chunk whose header and payload checksums are valid, and writes to `out_path`
 *  (atomically, via a temporary file beside it; kvs_trace_recover_with_report has the details) a complete
 *  trace of positions [0, n) where n is the largest position count for which every (layer, KV head) chunk
 *  and the token chunk of every block are present. *recovered_positions receives n (may be NULL).
 *  KVS_ERR_FORMAT if not even the header is valid; KVS_ERR_TRUNCATED if no complete block remains. */
kvs_status kvs_trace_recover(const char *in_path, const char *out_path, int64_t *recovered_positions);

/* What a recovery kept, what it left out and why (kvs_trace_recover_with_report). Positions count from 0;
 * block b holds positions [b·B, b·B + n_pos). */
typedef struct {
    int64_t positions;       /* recovered into OUT: positions [0, positions) */
    int64_t blocks;          /* recovered blocks */
    int64_t input_positions; /* positions IN holds data of: the larger of its footer's count (a complete
                                trace whose footer is intact) and the end of the last readable chunk
                                header anywhere in the file, also past a bad chunk (>= positions) */
    int64_t lost_positions;  /* input_positions - positions: positions IN holds that OUT lacks */
    int64_t lost_blocks;     /* blocks IN holds data of that OUT lacks */
    int partial;             /* 1: recovery is PARTIAL: a chunk failed its checks (a checksum, a header field)
                                or the blocks are out of order, so data IN holds past that point was
                                dropped. 0: clean: everything IN holds was recovered, except an unfinished
                                tail (the normal state of a killed writer: the chunks of a last block not
                                yet all written, a last chunk cut off by the end of the file) */
    int64_t bad_offset;      /* partial: byte offset of the first bad chunk (or of the break), else -1 */
    uint64_t dropped_bytes;  /* partial: bytes of IN from bad_offset to the end of its chunk data */
    char bad_chunk[96];      /* partial: that chunk ("chunk (layer 2, kv head 1, block 3)"), "" when its
                                header is unreadable */
    char bad_error[768];     /* partial: why (without the file and chunk names): the failed check's message,
                                "payload checksum mismatch", or what broke the block order */
    char tail[512];          /* clean: the unfinished tail that was left out ("" when none) */
} kvs_trace_recovery;

/*! kvs_trace_recover_with_report() : kvs_trace_recover() that also says what it left out and why (*rep,
 *  may be NULL). OUT is written through common/kvs_out.h: "-" is standard output, a symbolic link is
 *  written through to its target (atomically, via a temporary file beside the target, so OUT may even be
 *  IN's own name), a FIFO or device directly. Returns KVS_OK whenever OUT was written, a partial recovery
 *  included (rep->partial); the errors of kvs_trace_recover otherwise (nothing is written). */
kvs_status kvs_trace_recover_with_report(const char *in_path, const char *out_path, kvs_trace_recovery *rep);

#endif /* KVS_TRACE_H */
